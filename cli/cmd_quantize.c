/* cmd_quantize.c — `nib quantize IN OUT --format F | --pi05 fast`: quantize the linear weights of a
 * safetensors checkpoint into the layouts of io/qcheckpoint.h (ModelOpt NVFP4 / FP8, GPTQ INT4,
 * nib MXFP4; or, with --pi05 fast, FP8 per channel for SigLIP and the Gemma-2B prefix and NVFP4
 * for the action expert), copy every other tensor unchanged, and report the error of each
 * quantized tensor.
 *
 * Threads: every quantized tensor is cut into chunks of whole rows (about CHUNK_ELEMS weights;
 * the cut depends only on the shape, never on the thread count). Rows are independent once the
 * scale that spans them is fixed: the NVFP4 global of the tensor or fused group, and the FP8
 * per-tensor scale, come from an amax pass over the selected tensors that runs first (in
 * parallel). A pool of --threads workers takes the next chunk in file order: convert to fp32,
 * check for NaN/Inf, quantize into the tensor's output planes, dequantize, and sum the error
 * terms in fp64. The calling thread is the writer: it waits for the tensors in file order,
 * combines their chunk sums in chunk order, writes them, frees them, and copies kept tensors.
 * So the file and the report do not depend on the thread count (only the times do).
 *
 * Memory: the planes of at most WINDOW_BYTES of quantized-but-unwritten output (or of one
 * tensor, if larger) are held at once; workers wait for the writer beyond that. Each worker
 * has a scratch of about 9 bytes x CHUNK_ELEMS. The input is mapped; the pages of a chunk are
 * dropped from the mapping once it is converted (and those of a kept tensor once copied). The
 * output goes to OUT.tmp and is renamed onto OUT only when complete. */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "formats/formats.h"
#include "io/json.h"
#include "io/qcheckpoint.h"
#include "io/safetensors.h"

#define NAME_COL_MAX 60
#define COPY_CHUNK ((size_t)64 << 20)   /* bytes copied (and released from the mapping) per step */
#define CHUNK_ELEMS ((int64_t)1 << 20)  /* weights per work chunk (whole rows, a multiple of 8) */
#define WINDOW_BYTES ((uint64_t)256 << 20) /* output planes allocated but not yet written */
#define MAX_THREADS 64

/* --pi05 fast components */
enum { PI05_VISION = 0, PI05_PREFIX = 1, PI05_EXPERT = 2, PI05_NCOMP = 3 };
static const char *const k_pi05_comp[PI05_NCOMP] = {"vision", "prefix", "expert"};

typedef struct qopts {
    const char *in, *out, *report;
    nib_wfmt fmt;        /* --format; with --pi05 fast each tensor has its own (tplan.fmt) */
    int pi05_fast;       /* --pi05 fast */
    int group, asym, fp8_per_channel, force, quiet, threads;
    int nvfp4_shared;    /* one NVFP4 global per fused group (q|k|v, gate|up) */
    nib_mxfp4_rule rule;
    const char **inc, **exc;
    size_t n_inc, n_exc;
} qopts;

/* One chunk's result: fp64 error sums over its weights (the terms of nib_quant_error). */
typedef struct cpart {
    nib_quant_err_terms t; /* formats/ nib_quant_error's sums over this chunk */
    float fp8_scale;     /* FP8 per tensor: the scale this chunk used (all must agree) */
    double secs;
    int done;            /* under the run's mutex */
    nib_status st;       /* failure of this chunk, with its message */
    char *msg;
} cpart;

/* One input tensor's plan and result. */
typedef struct tplan {
    const nib_st_tensor *t;
    int quant;           /* 1: quantized */
    const char *reason;  /* kept: why (static text) */
    char *base;          /* quantized: name without ".weight" */
    char *fgroup;        /* fused group key ("<dir>.qkv", "<dir>.gate_up") or NULL */
    nib_wfmt fmt;        /* quantized: its format */
    int fp8_pc;          /* FP8: per-channel scales */
    int comp;            /* --pi05 fast: PI05_* of a quantized tensor, else -1 */
    int need_amax;       /* NVFP4, FP8 per tensor: amax pass before quantizing */
    float amax;          /* max |w| of the tensor, then (NVFP4 shared) of its fused group */
    float global;        /* NVFP4 global used */
    int64_t rows;        /* rows per chunk */
    size_t chunk0, n_chunks;
    size_t cursor;       /* writer: chunks [chunk0, cursor) seen done */
    uint64_t plane_bytes;
    uint8_t *data, *scales, *zeros; /* output planes (canonical layout), while in flight */
    nib_quant_err err;
    double ref_energy;   /* sum ref^2, for the energy-weighted total NMSE */
    uint64_t bytes_out;
    double secs;         /* worker seconds (summed over its chunks) + writing */
} tplan;

static void print_help(void) {
    printf(
        "usage: nib quantize IN.safetensors OUT.safetensors --format nvfp4|mxfp4|int4|fp8 [options]\n"
        "       nib quantize IN.safetensors OUT.safetensors --pi05 fast [options]\n"
        "Quantizes the linear weights of a checkpoint, copies every other tensor unchanged, and\n"
        "prints the error of each quantized tensor. Layouts (docs/quantization.md):\n"
        "  nvfp4  ModelOpt: <b>.weight U8 [N,K/2], <b>.weight_scale F8_E4M3 [N,K/16],\n"
        "         <b>.weight_scale_2 F32 []\n"
        "  fp8    ModelOpt: <b>.weight F8_E4M3 [N,K], <b>.weight_scale F32 [] (or [N])\n"
        "  int4   GPTQ v1: <b>.qweight I32 [K/8,N], <b>.qzeros I32 [K/G,N/8], <b>.scales F16\n"
        "         [K/G,N], <b>.g_idx I32 [K]\n"
        "  mxfp4  nib: <b>.weight U8 [N,K/2], <b>.weight_scale F8_E8M0 [N,K/32]\n"
        "and __metadata__ \"quantization_config\" (JSON) saying which.\n"
        "\n"
        "options:\n"
        "  --format F          nvfp4 | mxfp4 | int4 | fp8 (this or --pi05 is required)\n"
        "  --pi05 fast         one pass for a Pi0.5 checkpoint (openpi key names, optional \"model.\"\n"
        "                      prefix), the way nib's `fast` preset runs it: every linear of the\n"
        "                      SigLIP encoder layers (self_attn.{q,k,v,out}_proj, mlp.fc1/fc2) and\n"
        "                      of the Gemma-2B layers (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj)\n"
        "                      to fp8 with per-channel scales, every linear of the action expert's\n"
        "                      layers to nvfp4 with one global per fused group (q|k|v, gate|up);\n"
        "                      everything else kept. quantization_config is ModelOpt's\n"
        "                      MIXED_PRECISION with each layer's algorithm. Replaces --format;\n"
        "                      --include and the format options do not apply (--exclude does). A\n"
        "                      Pi0.5 linear that cannot be quantized, or a file with none, is an error\n"
        "  --threads N         worker threads, 1..64 (default: the online CPUs, at most 64); the\n"
        "                      output and the report do not depend on it (except the times)\n"
        "  --include GLOB      quantize the tensors whose name matches GLOB (fnmatch, repeatable);\n"
        "                      replaces the default rule\n"
        "  --exclude GLOB      never quantize tensors matching GLOB (repeatable; beats --include)\n"
        "  --group G           int4 group size: 32 | 64 | 128 (default 128)\n"
        "  --asym              int4 with zero points (default symmetric)\n"
        "  --mxfp4-rule R      mxfp4 scale rule: floor | ceil | round (default round)\n"
        "  --fp8-per-channel   fp8 scale per output channel (default one per tensor)\n"
        "  --nvfp4-global G    shared (default): q/k/v of one attention block, and gate/up of one\n"
        "                      MLP, get one weight_scale_2 (the group's amax / 2688), as ModelOpt\n"
        "                      exports fused layers, so a loader can stack them exactly;\n"
        "                      per-tensor: each weight its own\n"
        "  --report FILE.json  also write the per-tensor report as JSON\n"
        "  --force             replace OUT if it exists\n"
        "  -q, --quiet         print only the summary line, not the table\n"
        "\n"
        "Default rule: a tensor is quantized when it is a 2-D BF16/F16/F32 tensor whose name ends\n"
        "in \".<P>.weight\", P one of q_proj k_proj v_proj o_proj out_proj gate_proj up_proj\n"
        "down_proj fc1 fc2, with an earlier name component \"layers\" followed by a component of\n"
        "digits (e.g. \"...language_model.layers.3.self_attn.q_proj.weight\", SigLIP's\n"
        "\"...encoder.layers.3.mlp.fc1.weight\"). Embeddings, lm_head, norms, biases, the projector\n"
        "and small heads stay in their dtype. A selected tensor whose shape the format cannot hold\n"
        "(K not a multiple of the block, N %% 8 for int4) is kept and listed with the reason.\n"
        "A progress bar goes to stderr when stderr is a terminal.\n"
        "Exit status: 0 written, 1 failure (nothing is left at OUT, unless only the --report\n"
        "file failed: the message says so), 2 usage error.\n");
}

static int usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "nib quantize: %s%s%s%s\n", msg, arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
    fprintf(stderr, "usage: nib quantize IN OUT --format nvfp4|mxfp4|int4|fp8 | --pi05 fast [options]   "
                    "(nib quantize --help)\n");
    return 2;
}

static int push(const char ***arr, size_t *n, const char *v) {
    const char **p = realloc(*arr, (*n + 1) * sizeof *p);
    if (!p) return 0;
    p[(*n)++] = v;
    *arr = p;
    return 1;
}

/* Value of an option given as "--opt V" or "--opt=V"; NULL when it is not this option. */
static const char *opt_value(int argc, char **argv, int *i, const char *opt, int *missing) {
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n)) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

/* 0 ok, else the exit status of a usage error */
static int parse_args(int argc, char **argv, qopts *o, int *help) {
    const char *fmt = NULL, *rule = NULL, *group = NULL, *nvg = NULL, *pi05 = NULL, *threads = NULL;
    memset(o, 0, sizeof *o);
    o->nvfp4_shared = 1;
    o->group = NIB_INT4_GROUP_DEFAULT;
    o->rule = NIB_MXFP4_SCALE_DEFAULT;
    o->threads = nib_cpu_count();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if (nib_cli_is_help(a)) {
            *help = 1;
            return 0;
        } else if ((v = opt_value(argc, argv, &i, "--format", &missing))) {
            fmt = v;
        } else if ((v = opt_value(argc, argv, &i, "--pi05", &missing))) {
            pi05 = v;
        } else if ((v = opt_value(argc, argv, &i, "--threads", &missing))) {
            threads = v;
        } else if ((v = opt_value(argc, argv, &i, "--include", &missing))) {
            if (!push(&o->inc, &o->n_inc, v)) return usage_error("out of memory", NULL);
        } else if ((v = opt_value(argc, argv, &i, "--exclude", &missing))) {
            if (!push(&o->exc, &o->n_exc, v)) return usage_error("out of memory", NULL);
        } else if ((v = opt_value(argc, argv, &i, "--group", &missing))) {
            group = v;
        } else if ((v = opt_value(argc, argv, &i, "--mxfp4-rule", &missing))) {
            rule = v;
        } else if ((v = opt_value(argc, argv, &i, "--nvfp4-global", &missing))) {
            nvg = v;
        } else if ((v = opt_value(argc, argv, &i, "--report", &missing))) {
            o->report = v;
        } else if (missing) {
            return usage_error("missing value for", a);
        } else if (!strcmp(a, "--asym")) {
            o->asym = 1;
        } else if (!strcmp(a, "--fp8-per-channel")) {
            o->fp8_per_channel = 1;
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (a[0] == '-' && a[1] != '\0') {
            return usage_error("unknown option", a);
        } else if (!o->in) {
            o->in = a;
        } else if (!o->out) {
            o->out = a;
        } else {
            return usage_error("unexpected argument", a);
        }
    }
    if (!o->in || !o->out) return usage_error("expected IN and OUT files", NULL);
    if (threads) {
        char *end;
        errno = 0;
        long t = strtol(threads, &end, 10);
        if (*end || end == threads || errno || t < 1 || t > MAX_THREADS)
            return usage_error("--threads must be an integer from 1 to 64, not", threads);
        o->threads = (int)t;
    }
    if (pi05) {
        if (strcmp(pi05, "fast")) return usage_error("--pi05 takes 'fast' (the only preset it writes), not", pi05);
        if (fmt) return usage_error("--pi05 fast and --format exclude each other (--pi05 fast sets the format of "
                                    "each layer)", NULL);
        if (o->n_inc) return usage_error("--include does not apply to --pi05 fast (it selects the Pi0.5 linears)", NULL);
        if (group || o->asym || rule || o->fp8_per_channel || nvg)
            return usage_error("--group, --asym, --mxfp4-rule, --fp8-per-channel and --nvfp4-global do not apply to "
                               "--pi05 fast (fp8 per channel + nvfp4 with shared globals)", NULL);
        o->pi05_fast = 1;
        o->fmt = NIB_WFMT_COUNT;
        o->fp8_per_channel = 1;
        return 0;
    }
    if (!fmt) return usage_error("--format is required (nvfp4, mxfp4, int4 or fp8), or --pi05 fast", NULL);
    o->fmt = nib_wfmt_from_name(fmt);
    if (o->fmt == NIB_WFMT_COUNT || o->fmt == NIB_WFMT_BF16)
        return usage_error("unknown format (want nvfp4, mxfp4, int4 or fp8):", fmt);
    if (group) {
        char *end;
        long g = strtol(group, &end, 10);
        if (*end || (g != 32 && g != 64 && g != 128))
            return usage_error("--group must be 32, 64 or 128, not", group);
        o->group = (int)g;
    }
    if (rule) {
        int r = -1;
        for (int j = 0; j < NIB_MXFP4_RULE_COUNT; j++)
            if (!strcmp(rule, nib_mxfp4_rule_name((nib_mxfp4_rule)j))) r = j;
        if (r < 0) return usage_error("--mxfp4-rule must be floor, ceil or round, not", rule);
        o->rule = (nib_mxfp4_rule)r;
    }
    if (nvg) {
        if (strcmp(nvg, "shared") && strcmp(nvg, "per-tensor"))
            return usage_error("--nvfp4-global must be shared or per-tensor, not", nvg);
        if (o->fmt != NIB_WFMT_NVFP4) return usage_error("--nvfp4-global applies to --format nvfp4 only", NULL);
        o->nvfp4_shared = !strcmp(nvg, "shared");
    }
    if (group && o->fmt != NIB_WFMT_INT4) return usage_error("--group applies to --format int4 only", NULL);
    if (o->asym && o->fmt != NIB_WFMT_INT4) return usage_error("--asym applies to --format int4 only", NULL);
    if (rule && o->fmt != NIB_WFMT_MXFP4)
        return usage_error("--mxfp4-rule applies to --format mxfp4 only", NULL);
    if (o->fp8_per_channel && o->fmt != NIB_WFMT_FP8)
        return usage_error("--fp8-per-channel applies to --format fp8 only", NULL);
    return 0;
}

/* ---- output helpers ----------------------------------------------------------------------- */

/* s with JSON escaping (no control character reaches the terminal); returns the columns. */
static size_t put_escaped(FILE *out, const char *s) {
    size_t n = strlen(s), need = nib_json_escape(NULL, 0, s, n), cols = 0;
    char *e = malloc(need + 1);
    if (!e) return 0;
    nib_json_escape(e, need + 1, s, n);
    for (const char *c = e; *c; c++) cols += ((unsigned char)*c & 0xC0) != 0x80;
    if (out) fputs(e, out);
    free(e);
    return cols;
}

static void put_json_str(FILE *out, const char *s) {
    fputc('"', out);
    put_escaped(out, s);
    fputc('"', out);
}

static void put_json_num(FILE *out, double v) {
    if (isfinite(v)) fprintf(out, "%.9g", v);
    else fputs("null", out);
}

static const char *shape_str(const nib_st_tensor *t, char *buf, size_t cap) {
    size_t w = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < t->ndim && w < cap; i++)
        w += (size_t)snprintf(buf + w, cap - w, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (w < cap) snprintf(buf + w, cap - w, "]");
    return buf;
}

static const char *human(uint64_t x, char buf[32]) {
    static const char *const pre[] = {"", "k", "M", "G", "T"};
    double v = (double)x;
    size_t p = 0;
    while (v >= 1000.0 && p + 1 < NIB_ARRAY_LEN(pre)) {
        v /= 1000.0;
        p++;
    }
    if (!p) snprintf(buf, 32, "%llu B", (unsigned long long)x);
    else snprintf(buf, 32, "%.*f %sB", v < 10 ? 2 : v < 100 ? 1 : 0, v, pre[p]);
    return buf;
}

/* ---- progress bar (stderr, only on a terminal) --------------------------------------------- */

typedef struct progress {
    int on;
    uint64_t total, done; /* bytes of the input written (quantized or copied) */
    uint64_t extra;       /* bytes of the tensor being waited for whose chunks are done */
    double last;
} progress;

static void progress_draw(progress *p, size_t i, size_t n, const char *name, int force) {
    if (!p->on) return;
    double now = nib_now_s();
    if (!force && now - p->last < 0.1) return;
    p->last = now;
    enum { W = 30 };
    uint64_t done = p->done + p->extra;
    double frac = p->total ? (double)(done < p->total ? done : p->total) / (double)p->total : 1.0;
    int fill = (int)(frac * W);
    char bar[W + 1];
    for (int j = 0; j < W; j++) bar[j] = j < fill ? '#' : '.';
    bar[W] = '\0';
    fprintf(stderr, "\r[%s] %3d%%  %zu/%zu  ", bar, (int)(frac * 100.0), i, n);
    /* the name's last 40 bytes, control characters shown as '?' */
    size_t len = strlen(name);
    const char *tail = len > 40 ? name + len - 40 : name;
    if (len > 40) fputs("...", stderr);
    for (const char *c = tail; *c; c++)
        fputc((unsigned char)*c < 0x20 || *c == 0x7F ? '?' : *c, stderr);
    fputs("\033[K", stderr);
    fflush(stderr);
}

static void progress_end(progress *p) {
    if (!p->on) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
}

/* Drop the mapping's pages of [p, p + n) that are wholly inside it: they were read once and
 * are not needed again (file order), so a multi-GB input does not stay resident. */
static void drop_pages(const void *p, size_t n) {
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0 || n == 0) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)ps - 1);
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

/* ---- plan ------------------------------------------------------------------------------------- */

static int matches(const char *const *pats, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (fnmatch(pats[i], name, 0) == 0) return 1;
    return 0;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* --pi05 fast: the component (PI05_*) of a Pi0.5 linear weight, or -1. Names are exactly
 *   [model.]<VP>.encoder.layers.<N>.{self_attn.{q,k,v,out}_proj | mlp.fc1 | mlp.fc2}.weight
 *   [model.]<LP>.layers.<N>.{self_attn.{q,k,v,o}_proj | mlp.{gate,up,down}_proj}.weight
 *   [model.]<EP>.layers.<N>.(the same Gemma projections).weight
 * with VP/LP/EP the openpi-converted paths of SigLIP, the Gemma-2B language model and the
 * action expert (models/pi05_keys.h). */
static int pi05_fast_component(const char *name) {
    static const char *const k_prefix[PI05_NCOMP] = {
        "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.",
        "paligemma_with_expert.paligemma.model.language_model.layers.",
        "paligemma_with_expert.gemma_expert.model.layers."};
    static const char *const k_siglip[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.out_proj", "mlp.fc1", "mlp.fc2", NULL};
    static const char *const k_gemma[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", NULL};
    if (!strncmp(name, "model.", 6)) name += 6;
    for (int c = 0; c < PI05_NCOMP; c++) {
        size_t pl = strlen(k_prefix[c]);
        if (strncmp(name, k_prefix[c], pl)) continue;
        const char *s = name + pl, *d = s;
        while (*d >= '0' && *d <= '9') d++;
        if (d == s || *d != '.') return -1;
        d++;
        for (const char *const *lin = c == PI05_VISION ? k_siglip : k_gemma; *lin; lin++) {
            size_t ll = strlen(*lin);
            if (!strncmp(d, *lin, ll) && !strcmp(d + ll, ".weight")) return c;
        }
        return -1;
    }
    return -1;
}

/* The fused group of a linear: "<dir>.qkv" for <dir>.{q,k,v}_proj, "<dir>.gate_up" for
 * <dir>.{gate,up}_proj (base = name without ".weight"); *out = NULL for any other. */
static nib_status fused_group(const char *base, char **out) {
    static const struct {
        const char *proj, *group;
    } k_g[] = {{"q_proj", "qkv"}, {"k_proj", "qkv"}, {"v_proj", "qkv"}, {"gate_proj", "gate_up"}, {"up_proj", "gate_up"}};
    const char *dot = strrchr(base, '.');
    const char *last = dot ? dot + 1 : base;
    size_t dl = dot ? (size_t)(dot - base) : 0;
    *out = NULL;
    for (size_t i = 0; i < NIB_ARRAY_LEN(k_g); i++) {
        if (strcmp(last, k_g[i].proj)) continue;
        char *g = nib_malloc(dl + strlen(k_g[i].group) + 2);
        if (!g) return NIB_ERR_OUT_OF_MEMORY;
        memcpy(g, base, dl);
        g[dl] = '.';
        strcpy(g + dl + 1, k_g[i].group);
        *out = g;
        break;
    }
    return NIB_OK;
}

/* Decide each tensor: quantized or kept (with the reason), its format, its chunks. */
static nib_status plan_tensors(const qopts *o, const nib_st_file *f, tplan *pl, size_t *n_quant,
                               size_t *n_chunks) {
    size_t n_comp[PI05_NCOMP] = {0}, n_match = 0;
    *n_quant = 0;
    *n_chunks = 0;
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        tplan *p = &pl[i];
        p->t = t;
        p->comp = -1;
        int sel, comp = -1;
        if (o->pi05_fast) n_match += sel = (comp = pi05_fast_component(t->name)) >= 0;
        else sel = o->n_inc ? matches(o->inc, o->n_inc, t->name) : nib_qckpt_default_rule(t->name);
        if (sel && matches(o->exc, o->n_exc, t->name)) sel = 0;
        if (!sel) {
            p->reason = "not selected";
            continue;
        }
        const nib_wfmt fmt = comp < 0 ? o->fmt : comp == PI05_EXPERT ? NIB_WFMT_NVFP4 : NIB_WFMT_FP8;
        const char *why = NULL;
        if (t->dtype != NIB_DTYPE_BF16 && t->dtype != NIB_DTYPE_F16 && t->dtype != NIB_DTYPE_F32)
            why = "not a BF16/F16/F32 tensor";
        else if (t->ndim != 2)
            why = "not a 2-D weight";
        else if (!ends_with(t->name, ".weight"))
            why = "name does not end in \".weight\"";
        else
            why = nib_qckpt_linear_unwritable(fmt, t->shape[0], t->shape[1], o->group);
        if (why && comp >= 0) {
            /* the fast preset's loader takes a component all float or all pre-quantized */
            char sh[96];
            return NIB_ERR(NIB_ERR_SHAPE, "--pi05 fast: '%s' (%s %s, Pi0.5 %s linear) cannot be quantized to %s: %s",
                           t->name, nib_dtype_name(t->dtype), shape_str(t, sh, sizeof sh), k_pi05_comp[comp],
                           nib_wfmt_name(fmt), why);
        }
        if (why) {
            p->reason = why;
            continue;
        }
        size_t bl = t->name_len - strlen(".weight");
        p->base = nib_malloc(bl + 1);
        if (!p->base) return NIB_ERR_OUT_OF_MEMORY;
        memcpy(p->base, t->name, bl);
        p->base[bl] = '\0';
        p->quant = 1;
        p->comp = comp;
        p->fmt = fmt;
        p->fp8_pc = fmt == NIB_WFMT_FP8 && (comp >= 0 || o->fp8_per_channel);
        p->need_amax = fmt == NIB_WFMT_NVFP4 || (fmt == NIB_WFMT_FP8 && !p->fp8_pc);
        if (fmt == NIB_WFMT_NVFP4 && (comp >= 0 || o->nvfp4_shared)) NIB_RETURN_IF_ERR(fused_group(p->base, &p->fgroup));
        /* chunks of whole rows: a multiple of 8 (INT4 packs zero points by 8 rows), at least 8 */
        const int64_t n = t->shape[0], k = t->shape[1];
        int64_t rows = CHUNK_ELEMS / k / 8 * 8;
        if (rows < 8) rows = 8;
        if (rows > n) rows = n;
        p->rows = rows;
        p->chunk0 = *n_chunks;
        p->n_chunks = (size_t)((n + rows - 1) / rows);
        *n_chunks += p->n_chunks;
        /* the planes held in memory until written (canonical layouts) */
        const uint64_t nk = t->numel;
        switch (fmt) {
        case NIB_WFMT_NVFP4: p->plane_bytes = nk / 2 + nk / 16; break;
        case NIB_WFMT_MXFP4: p->plane_bytes = nk / 2 + nk / 32; break;
        case NIB_WFMT_FP8: p->plane_bytes = nk + 4 * (p->fp8_pc ? (uint64_t)n : 1); break;
        case NIB_WFMT_INT4: p->plane_bytes = nk / 2 + (nk / (uint64_t)o->group) * (o->asym ? 3 : 2); break;
        default: return NIB_ERR(NIB_ERR_INTERNAL, "quantize: format %d", (int)fmt);
        }
        if (comp >= 0) n_comp[comp]++;
        (*n_quant)++;
    }
    if (o->pi05_fast && n_match == 0)
        return NIB_ERR(NIB_ERR_NOT_FOUND, "--pi05 fast: no Pi0.5 linear in the file (want openpi-converted names such as "
                       "'paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight', "
                       "optionally with a 'model.' prefix)");
    if (o->pi05_fast && *n_quant)
        for (int c = 0; c < PI05_NCOMP; c++)
            if (!n_comp[c])
                fprintf(stderr, "nib quantize: warning: --pi05 fast: no %s linear is quantized (the file has none, or "
                                "--exclude took them all)\n", k_pi05_comp[c]);
    return NIB_OK;
}

/* ---- input conversion ------------------------------------------------------------------------ */

static inline float load_elem(const uint8_t *p, nib_dtype dt, uint64_t i) {
    if (dt == NIB_DTYPE_F32) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    if (dt == NIB_DTYPE_F16) return nib_f16_to_f32(h);
    uint32_t b = (uint32_t)h << 16; /* bf16 is the top half of an fp32 */
    float v;
    memcpy(&v, &b, 4);
    return v;
}

/* A NaN/Inf at element `at` of t (row-major): the error, naming the tensor, row and column as
 * the quantizers of formats/ word it. */
static nib_status nonfinite_error(const nib_st_tensor *t, nib_wfmt fmt, uint64_t at, float v) {
    const uint64_t k = (uint64_t)t->shape[1];
    return NIB_ERR(NIB_ERR_NUMERICS, "'%s': %s quantize: %s at row %llu, col %llu", t->name, nib_wfmt_name(fmt),
                   isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf"), (unsigned long long)(at / k),
                   (unsigned long long)(at % k));
}

/* ---- amax pass (NVFP4 globals, FP8 per-tensor scales) -------------------------------------- */

typedef struct amax_job {
    const tplan *pl;
    const uint32_t *chunk_tensor; /* [n_chunks] tensor of each chunk */
    const size_t *list;           /* the chunks of the tensors that need an amax */
    float *amax;                  /* [n_chunks] */
    uint64_t *bad;                /* [n_chunks] element index of the first NaN/Inf, UINT64_MAX if none */
} amax_job;

static void amax_range(void *ctx, int64_t b, int64_t e) {
    amax_job *j = (amax_job *)ctx;
    for (int64_t li = b; li < e; li++) {
        const size_t c = j->list[li];
        const tplan *p = &j->pl[j->chunk_tensor[c]];
        const nib_st_tensor *t = p->t;
        const uint64_t k = (uint64_t)t->shape[1], r0 = (uint64_t)(c - p->chunk0) * (uint64_t)p->rows;
        uint64_t r1 = r0 + (uint64_t)p->rows;
        if (r1 > (uint64_t)t->shape[0]) r1 = (uint64_t)t->shape[0];
        const uint8_t *d = (const uint8_t *)t->data;
        float m = 0.0f;
        uint64_t bad = UINT64_MAX;
        for (uint64_t i = r0 * k; i < r1 * k; i++) {
            float v = load_elem(d, t->dtype, i);
            if (!isfinite(v)) {
                bad = i;
                break;
            }
            m = fmaxf(m, fabsf(v)); /* as formats/ takes the amax */
        }
        j->amax[c] = m;
        j->bad[c] = bad;
        const size_t esz = nib_dtype_size(t->dtype);
        drop_pages(d + r0 * k * esz, (size_t)((r1 - r0) * k * esz));
    }
}

/* amax of every tensor that needs one, in parallel; then the NVFP4 globals (the amax of the
 * fused group with shared globals). A NaN/Inf found here is an error naming the tensor, row and
 * column (the first tensor in file order that has one). */
static nib_status plan_amax(const qopts *o, tplan *pl, size_t n, const uint32_t *chunk_tensor, size_t n_chunks) {
    nib_status st = NIB_OK;
    size_t *list = nib_malloc((n_chunks ? n_chunks : 1) * sizeof *list);
    float *amax = nib_malloc((n_chunks ? n_chunks : 1) * sizeof *amax);
    uint64_t *bad = nib_malloc((n_chunks ? n_chunks : 1) * sizeof *bad);
    size_t nl = 0;
    if (!list || !amax || !bad) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (size_t i = 0; i < n; i++)
        if (pl[i].quant && pl[i].need_amax)
            for (size_t c = 0; c < pl[i].n_chunks; c++) list[nl++] = pl[i].chunk0 + c;
    amax_job j = {pl, chunk_tensor, list, amax, bad};
    if (nl) nib_parallel_for((int64_t)nl, o->threads, 1, amax_range, &j);
    for (size_t i = 0; i < n; i++) {
        tplan *p = &pl[i];
        if (!p->quant || !p->need_amax) continue;
        p->amax = 0.0f;
        for (size_t c = p->chunk0; c < p->chunk0 + p->n_chunks; c++) {
            if (bad[c] != UINT64_MAX) {
                st = nonfinite_error(p->t, p->fmt, bad[c], load_elem((const uint8_t *)p->t->data, p->t->dtype, bad[c]));
                goto fail;
            }
            p->amax = fmaxf(p->amax, amax[c]);
        }
    }
    for (size_t i = 0; i < n; i++) {
        tplan *p = &pl[i];
        if (!p->quant || p->fmt != NIB_WFMT_NVFP4) continue;
        float m = p->amax;
        if (p->fgroup)
            for (size_t j2 = 0; j2 < n; j2++)
                if (pl[j2].quant && pl[j2].fgroup && !strcmp(pl[j2].fgroup, p->fgroup)) m = fmaxf(m, pl[j2].amax);
        p->global = nib_nvfp4_global_for_amax(m);
    }
fail:
    nib_free(list);
    nib_free(amax);
    nib_free(bad);
    return st;
}

/* ---- one chunk ------------------------------------------------------------------------------- */

/* Decoded E4M3 / E2M1 codes: the values nib_e4m3_to_f32 / nib_e2m1_to_f32 return, so the FP8 and
 * NVFP4 dequantization below computes exactly the products of nib_fp8_dequantize and
 * nib_nvfp4_dequantize, without a function call per weight. Filled before any worker starts. */
static float g_e4m3[256], g_e2m1[16];

static void init_tables(void) {
    for (int c = 0; c < 256; c++) g_e4m3[c] = nib_e4m3_to_f32((uint8_t)c);
    for (int c = 0; c < 16; c++) g_e2m1[c] = nib_e2m1_to_f32((uint8_t)c);
}

typedef struct scratch {
    float *x, *deq;  /* [rows (+1)][k] fp32 input, dequantized */
    uint8_t *q;      /* FP8 per tensor: [rows + 1][k] codes */
    size_t cap_x, cap_deq, cap_q;
} scratch;

static nib_status grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return NIB_OK;
    nib_free(*p);
    *p = nib_malloc(need);
    *cap = *p ? need : 0;
    return *p ? NIB_OK : NIB_ERR_OUT_OF_MEMORY;
}

static void scratch_free(scratch *s) {
    nib_free(s->x);
    nib_free(s->deq);
    nib_free(s->q);
    memset(s, 0, sizeof *s);
}

/* The terms of nib_quant_error over n values, in the same order and fp64. */
static void chunk_metrics(const float *ref, const float *got, size_t n, cpart *o) {
    memset(&o->t, 0, sizeof o->t);
    nib_quant_err_accumulate(ref, got, n, &o->t);
}

/* Quantize rows [r0, r0 + m) of p's tensor (chunk ci) into p's planes, and measure them. */
static nib_status run_chunk(const qopts *o, const tplan *p, size_t ci, scratch *s, cpart *out) {
    nib_status st = NIB_OK;
    const nib_st_tensor *t = p->t;
    const int64_t n = t->shape[0], k = t->shape[1], r0 = (int64_t)ci * p->rows;
    const int64_t m = r0 + p->rows <= n ? p->rows : n - r0;
    const size_t mk = (size_t)(m * k), base = (size_t)(r0 * k);
    const int sentinel = p->fmt == NIB_WFMT_FP8 && !p->fp8_pc;
    NIB_RETURN_IF_ERR(grow((void **)&s->x, &s->cap_x, (mk + (sentinel ? (size_t)k : 0)) * sizeof(float)));
    NIB_RETURN_IF_ERR(grow((void **)&s->deq, &s->cap_deq, mk * sizeof(float)));
    const uint8_t *d = (const uint8_t *)t->data;
    for (size_t i = 0; i < mk; i++) {
        float v = load_elem(d, t->dtype, base + i);
        if (!isfinite(v)) return nonfinite_error(t, p->fmt, base + i, v);
        s->x[i] = v;
    }
    drop_pages(d + base * nib_dtype_size(t->dtype), mk * nib_dtype_size(t->dtype)); /* read once */
    float *x = s->x, *g = s->deq;
    switch (p->fmt) {
    case NIB_WFMT_NVFP4: {
        uint8_t *qd = p->data + base / 2, *qs = p->scales + base / 16;
        NIB_TRY(nib_nvfp4_quantize_global(x, m, k, qd, qs, p->global));
        for (size_t i = 0; i < mk; i++) /* (e2m1 * e4m3) * global, as nib_nvfp4_dequantize */
            g[i] = (g_e2m1[(qd[i >> 1] >> ((i & 1) * 4)) & 0xF] * g_e4m3[qs[i / 16]]) * p->global;
        break;
    }
    case NIB_WFMT_FP8: {
        uint8_t *qd = p->data + base;
        if (p->fp8_pc) {
            float *sc = (float *)(void *)p->scales + r0;
            NIB_TRY(nib_fp8_quantize(x, m, k, 1, qd, sc));
            for (int64_t r = 0; r < m; r++)
                for (int64_t c = 0; c < k; c++) g[r * k + c] = g_e4m3[qd[r * k + c]] * sc[r];
        } else {
            /* One scale for the whole tensor, from its amax. A row [amax, 0, ..., 0] below the
             * chunk makes nib_fp8_quantize derive exactly that scale (every |w| of the chunk is
             * <= amax) and leaves the chunk's codes as they are: the reference's bytes. */
            NIB_RETURN_IF_ERR(grow((void **)&s->q, &s->cap_q, mk + (size_t)k));
            x[mk] = p->amax;
            for (int64_t c = 1; c < k; c++) x[mk + (size_t)c] = 0.0f;
            float sc;
            NIB_TRY(nib_fp8_quantize(x, m + 1, k, 0, s->q, &sc));
            memcpy(qd, s->q, mk);
            out->fp8_scale = sc;
            for (size_t i = 0; i < mk; i++) g[i] = g_e4m3[qd[i]] * sc;
        }
        break;
    }
    case NIB_WFMT_MXFP4: {
        uint8_t *qd = p->data + base / 2, *qs = p->scales + base / 32;
        NIB_TRY(nib_mxfp4_quantize(x, m, k, o->rule, qd, qs));
        NIB_TRY(nib_mxfp4_dequantize(qd, qs, m, k, g));
        break;
    }
    case NIB_WFMT_INT4: {
        nib_int4_weight iw;
        const size_t ng = mk / (size_t)o->group;
        NIB_TRY(nib_int4_quantize(x, m, k, o->group, o->asym, NULL, &iw));
        memcpy(p->data + base / 2, iw.packed, mk / 2);
        memcpy(p->scales + 2 * (base / (size_t)o->group), iw.scales, 2 * ng);
        if (o->asym) memcpy(p->zeros + base / (size_t)o->group, iw.zeros, ng);
        st = nib_int4_dequantize(&iw, g);
        nib_int4_free(&iw);
        if (st) goto fail;
        break;
    }
    default: return NIB_ERR(NIB_ERR_INTERNAL, "quantize: format %d", (int)p->fmt);
    }
    chunk_metrics(x, g, mk, out);
    return NIB_OK;
fail:
    return nib_error_context(st, "'%s' rows %lld..%lld (row numbers below count from row %lld)", t->name,
                             (long long)r0, (long long)(r0 + m - 1), (long long)r0);
}

/* ---- the worker pool ------------------------------------------------------------------------- */

typedef struct qrun {
    const qopts *o;
    tplan *pl;
    const uint32_t *chunk_tensor; /* [n_chunks] */
    cpart *parts;                 /* [n_chunks] */
    size_t n_chunks;
    pthread_mutex_t mu;
    pthread_cond_t room;          /* workers: window room, or stop */
    pthread_cond_t ready;         /* writer: a chunk finished */
    size_t next;                  /* next chunk to take (file order) */
    size_t stop_at;               /* first failed chunk (SIZE_MAX: none; 0: the writer stopped) */
    uint64_t inflight, budget;    /* plane bytes allocated and not yet written; the window */
} qrun;

static nib_status alloc_planes(const qopts *o, tplan *p) {
    const size_t nk = (size_t)p->t->numel, n = (size_t)p->t->shape[0];
    size_t db = 0, sb = 0, zb = 0;
    switch (p->fmt) {
    case NIB_WFMT_NVFP4: db = nk / 2, sb = nk / 16; break;
    case NIB_WFMT_MXFP4: db = nk / 2, sb = nk / 32; break;
    case NIB_WFMT_FP8: db = nk, sb = 4 * (p->fp8_pc ? n : 1); break;
    case NIB_WFMT_INT4: db = nk / 2, sb = 2 * (nk / (size_t)o->group), zb = o->asym ? nk / (size_t)o->group : 0; break;
    default: return NIB_ERR(NIB_ERR_INTERNAL, "quantize: format %d", (int)p->fmt);
    }
    p->data = nib_malloc(db);
    p->scales = nib_malloc(sb);
    if (zb) p->zeros = nib_malloc(zb);
    if (!p->data || !p->scales || (zb && !p->zeros))
        return nib_error_context(NIB_ERR_OUT_OF_MEMORY, "'%s': output planes", p->t->name);
    return NIB_OK;
}

static void free_planes(tplan *p) {
    nib_free(p->data);
    nib_free(p->scales);
    nib_free(p->zeros);
    p->data = p->scales = p->zeros = NULL;
}

static void *worker_main(void *arg) {
    qrun *r = (qrun *)arg;
    scratch s;
    memset(&s, 0, sizeof s);
    pthread_mutex_lock(&r->mu);
    while (r->next < r->n_chunks && r->next < r->stop_at) {
        const size_t c = r->next;
        tplan *p = &r->pl[r->chunk_tensor[c]];
        if (c == p->chunk0) { /* a new tensor: its planes, within the window */
            if (r->inflight > 0 && r->inflight + p->plane_bytes > r->budget) {
                pthread_cond_wait(&r->room, &r->mu);
                continue;
            }
            r->inflight += p->plane_bytes;
            nib_status ast = alloc_planes(r->o, p);
            if (ast) { /* fail the tensor here, before another worker takes one of its chunks */
                cpart *f = &r->parts[c];
                f->st = ast;
                f->msg = strdup(nib_last_error());
                f->done = 1;
                r->next++;
                if (c < r->stop_at) r->stop_at = c;
                pthread_cond_broadcast(&r->room);
                pthread_cond_broadcast(&r->ready);
                continue;
            }
        }
        r->next++;
        pthread_mutex_unlock(&r->mu);
        cpart res;
        memset(&res, 0, sizeof res);
        double t0 = nib_now_s();
        nib_status st = run_chunk(r->o, p, c - p->chunk0, &s, &res);
        res.secs = nib_now_s() - t0;
        if (st) {
            res.st = st;
            res.msg = strdup(nib_last_error()); /* errors are per thread: carry it to the writer */
        }
        pthread_mutex_lock(&r->mu);
        res.done = 1;
        r->parts[c] = res;
        if (st && c < r->stop_at) {
            r->stop_at = c;
            pthread_cond_broadcast(&r->room);
        }
        pthread_cond_broadcast(&r->ready);
    }
    pthread_mutex_unlock(&r->mu);
    scratch_free(&s);
    return NULL;
}

/* Stop handing out chunks (workers finish the one they hold). */
static void run_stop(qrun *r) {
    pthread_mutex_lock(&r->mu);
    r->stop_at = 0;
    pthread_cond_broadcast(&r->room);
    pthread_mutex_unlock(&r->mu);
}

/* Writer: wait until every chunk of p up to the first failure is done; the failure (the first in
 * file order, whatever the thread count) is returned with its message. */
static nib_status wait_tensor(qrun *r, tplan *p, progress *pg, size_t i, size_t n) {
    nib_status st = NIB_OK;
    const size_t end = p->chunk0 + p->n_chunks;
    const uint64_t chunk_bytes = (uint64_t)p->rows * (uint64_t)p->t->shape[1] * nib_dtype_size(p->t->dtype);
    pthread_mutex_lock(&r->mu);
    for (;;) {
        const size_t lim = r->stop_at < end ? r->stop_at + 1 : end;
        while (p->cursor < lim && r->parts[p->cursor].done) p->cursor++;
        if (p->cursor >= lim) break;
        if (pg->on) { /* redraw with the chunks done so far */
            uint64_t part = (uint64_t)(p->cursor - p->chunk0) * chunk_bytes;
            pg->extra = part < p->t->nbytes ? part : p->t->nbytes;
            progress_draw(pg, i, n, p->t->name, 0);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&r->ready, &r->mu, &ts);
        } else {
            pthread_cond_wait(&r->ready, &r->mu);
        }
    }
    pg->extra = 0;
    if (r->stop_at < end) {
        const cpart *c = &r->parts[r->stop_at];
        st = nib_set_error(c->st, NULL, 0, "%s", c->msg ? c->msg : "(the message was lost: out of memory)");
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

/* Writer: combine p's chunk sums in chunk order (as nib_quant_error finishes them), write its
 * planes, and give them back to the window. */
static nib_status write_tensor(qrun *r, nib_st_writer *w, tplan *p) {
    nib_status st = NIB_OK;
    double secs = 0;
    nib_quant_err_terms tt;
    memset(&tt, 0, sizeof tt);
    for (size_t c = p->chunk0; c < p->chunk0 + p->n_chunks; c++) {
        const cpart *q = &r->parts[c];
        nib_quant_err_merge(&tt, &q->t);
        secs += q->secs;
        if (p->fmt == NIB_WFMT_FP8 && !p->fp8_pc && memcmp(&q->fp8_scale, &r->parts[p->chunk0].fp8_scale, 4)) {
            st = NIB_ERR(NIB_ERR_INTERNAL, "'%s': chunk %zu got FP8 scale %.9g, chunk 0 %.9g", p->t->name,
                         c - p->chunk0, (double)q->fp8_scale, (double)r->parts[p->chunk0].fp8_scale);
            goto fail;
        }
    }
    nib_quant_err_finish(&tt, &p->err);
    p->ref_energy = tt.rr;
    nib_wsrc ws;
    memset(&ws, 0, sizeof ws);
    ws.fmt = p->fmt;
    ws.n = p->t->shape[0];
    ws.k = p->t->shape[1];
    ws.group = r->o->group;
    ws.fp8_per_channel = p->fp8_pc;
    ws.data = p->data;
    ws.scales = p->scales;
    ws.zeros = p->zeros;
    ws.global_scale = p->fmt == NIB_WFMT_NVFP4 ? p->global : 0.0f;
    if (p->fmt == NIB_WFMT_FP8 && !p->fp8_pc) memcpy(p->scales, &r->parts[p->chunk0].fp8_scale, 4);
    double t0 = nib_now_s();
    st = nib_qckpt_write_linear(w, p->base, &ws);
    if (st) goto fail;
    p->bytes_out = nib_qckpt_linear_file_bytes(&ws);
    p->secs = secs + (nib_now_s() - t0);
fail:
    pthread_mutex_lock(&r->mu);
    free_planes(p);
    r->inflight -= p->plane_bytes;
    pthread_cond_broadcast(&r->room);
    pthread_mutex_unlock(&r->mu);
    return st;
}

static nib_status copy_one(nib_st_writer *w, const nib_st_tensor *t, progress *pg, size_t i,
                           size_t n) {
    const uint8_t *p = (const uint8_t *)t->data;
    uint64_t left = t->nbytes;
    while (left) {
        size_t c = left > COPY_CHUNK ? COPY_CHUNK : (size_t)left;
        NIB_RETURN_IF_ERR(nib_st_writer_write(w, p, c));
        drop_pages(p, c);
        p += c;
        left -= c;
        pg->done += c;
        progress_draw(pg, i, n, t->name, 0);
    }
    return NIB_OK;
}

/* ---- report --------------------------------------------------------------------------------- */

typedef struct totals {
    size_t n_quant, n_kept;
    uint64_t q_in, q_out, kept_bytes, file_in, file_out, params;
    double err_energy, ref_energy, secs;
} totals;

/* Length of the longest prefix ending in '.' shared by every quantized tensor's name, short of
 * a "layers.N." part. */
static size_t common_prefix(const tplan *pl, size_t n) {
    const char *first = NULL;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (!pl[i].quant) continue;
        const char *nm = pl[i].t->name;
        if (!first) {
            first = nm;
            len = strlen(nm);
            continue;
        }
        size_t j = 0;
        while (j < len && nm[j] == first[j]) j++;
        len = j;
    }
    while (len > 0 && first[len - 1] != '.') len--;
    /* keep "layers.N." in the shown names: back up over trailing "layers" / digit components */
    while (len > 0) {
        size_t start = len - 1;
        while (start > 0 && first[start - 1] != '.') start--;
        int digits = start < len - 1;
        for (size_t j = start; j < len - 1; j++) digits &= first[j] >= '0' && first[j] <= '9';
        if (!digits && !(len - 1 - start == 6 && !memcmp(first + start, "layers", 6))) break;
        len = start;
    }
    return len;
}

/* The name as shown in the table: without the common prefix, and cut to NAME_COL_MAX columns
 * from the left ("...") so the layer and projection stay visible. */
static size_t put_name(FILE *out, const char *name, size_t skip) {
    const char *s = name + skip;
    size_t cols = put_escaped(NULL, s);
    if (cols <= NAME_COL_MAX) return put_escaped(out, s);
    size_t n = strlen(s), cut = n;
    while (cut > 0 && put_escaped(NULL, s + cut - 1) <= NAME_COL_MAX - 3) cut--;
    while (cut < n && ((unsigned char)s[cut] & 0xC0) == 0x80) cut++; /* whole UTF-8 sequences */
    if (out) fputs("...", out);
    return 3 + put_escaped(out, s + cut);
}

/* What OUT holds, for messages: "nvfp4", or "pi05 fast: fp8 per channel + nvfp4". */
static const char *what_str(const qopts *o) {
    return o->pi05_fast ? "pi05 fast: fp8 per channel + nvfp4" : nib_wfmt_name(o->fmt);
}

static void print_table(const qopts *o, const tplan *pl, size_t n, const totals *tt) {
    char sh[96], h1[32], h2[32];
    size_t name_w = 4, shape_w = 5, skip = common_prefix(pl, n);
    for (size_t i = 0; i < n; i++) {
        if (!pl[i].quant) continue;
        size_t w = put_name(NULL, pl[i].t->name, skip);
        if (w > name_w) name_w = w;
        size_t s = strlen(shape_str(pl[i].t, sh, sizeof sh));
        if (s > shape_w) shape_w = s;
    }
    printf("%s -> %s (%s)\n\n", o->in, o->out, what_str(o));
    if (tt->n_quant) {
        if (skip) {
            printf("  names below follow \"");
            char *pre = malloc(skip + 1);
            if (pre) {
                for (size_t i = 0; i < n; i++)
                    if (pl[i].quant) {
                        memcpy(pre, pl[i].t->name, skip);
                        break;
                    }
                pre[skip] = '\0';
                put_escaped(stdout, pre);
                free(pre);
            }
            printf("\"\n");
        }
        printf("  %-*s  %-*s  %-6s  %-10s  %-9s  %-10s  %12s  %12s\n", (int)name_w, "NAME", (int)shape_w,
               "SHAPE", "FORMAT", "NMSE", "COSINE", "MAX_ABS", "BYTES_IN", "BYTES_OUT");
        for (size_t i = 0; i < n; i++) {
            const tplan *p = &pl[i];
            if (!p->quant) continue;
            printf("  ");
            size_t w = put_name(stdout, p->t->name, skip);
            printf("%*s  %-*s  %-6s  %-10.3e  %-9.6f  %-10.3e  %12llu  %12llu\n",
                   (int)(w < name_w ? name_w - w : 0), "", (int)shape_w, shape_str(p->t, sh, sizeof sh),
                   nib_wfmt_name(p->fmt), p->err.nmse, p->err.cosine, p->err.max_abs,
                   (unsigned long long)p->t->nbytes, (unsigned long long)p->bytes_out);
        }
        printf("\n");
    }
    for (size_t i = 0; i < n; i++) {
        if (pl[i].quant || !strcmp(pl[i].reason, "not selected")) continue;
        printf("  kept ");
        put_escaped(stdout, pl[i].t->name);
        printf(" %s: %s\n", shape_str(pl[i].t, sh, sizeof sh), pl[i].reason);
    }
    printf("  quantized  %zu tensors, %llu parameters: %s -> %s", tt->n_quant,
           (unsigned long long)tt->params, human(tt->q_in, h1), human(tt->q_out, h2));
    if (tt->q_out) printf(" (%.2fx smaller)", (double)tt->q_in / (double)tt->q_out);
    if (o->pi05_fast) {
        size_t nf[2] = {0, 0};
        for (size_t i = 0; i < n; i++)
            if (pl[i].quant) nf[pl[i].fmt == NIB_WFMT_NVFP4]++;
        printf("\n             %zu fp8 per channel (vision, prefix), %zu nvfp4 (expert)", nf[0], nf[1]);
    }
    printf("\n  kept       %zu tensors, %s (copied unchanged)\n", tt->n_kept, human(tt->kept_bytes, h1));
    printf("  file       %s -> %s\n", human(tt->file_in, h1), human(tt->file_out, h2));
    if (tt->n_quant)
        printf("  NMSE       %.3e over all quantized weights (sum of squared errors / sum of squares)\n",
               tt->ref_energy > 0 ? tt->err_energy / tt->ref_energy : 0.0);
    printf("  time       %.2f s on %d thread%s\n", tt->secs, o->threads, o->threads == 1 ? "" : "s");
}

static nib_status write_report(const qopts *o, const tplan *pl, size_t n, const totals *tt) {
    nib_status st = NIB_OK;
    size_t plen = strlen(o->report);
    char *tmp = malloc(plen + 5);
    if (!tmp) return NIB_ERR_OUT_OF_MEMORY;
    memcpy(tmp, o->report, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        st = NIB_ERR(NIB_ERR_IO, "report: cannot create '%s'", tmp);
        free(tmp);
        return st;
    }
    fprintf(f, "{\"input\": ");
    put_json_str(f, o->in);
    fprintf(f, ", \"output\": ");
    put_json_str(f, o->out);
    fprintf(f, ", \"format\": \"%s\", \"options\": {\"group\": %d, \"asym\": %s, \"mxfp4_rule\": \"%s\", "
               "\"fp8_per_channel\": %s, \"nvfp4_global\": \"%s\", \"pi05\": %s},\n \"tensors\": [",
            o->pi05_fast ? "mixed" : nib_wfmt_name(o->fmt), o->group, o->asym ? "true" : "false",
            nib_mxfp4_rule_name(o->rule), o->fp8_per_channel ? "true" : "false",
            o->nvfp4_shared ? "shared" : "per-tensor", o->pi05_fast ? "\"fast\"" : "null");
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        const tplan *p = &pl[i];
        if (!p->quant) continue;
        fprintf(f, "%s\n  {\"name\": ", first ? "" : ",");
        first = 0;
        put_json_str(f, p->t->name);
        fprintf(f, ", \"dtype\": \"%s\", \"shape\": [%lld, %lld], \"format\": \"%s\", \"nmse\": ",
                nib_dtype_name(p->t->dtype), (long long)p->t->shape[0], (long long)p->t->shape[1],
                nib_wfmt_name(p->fmt));
        put_json_num(f, p->err.nmse);
        fprintf(f, ", \"cosine\": ");
        put_json_num(f, p->err.cosine);
        fprintf(f, ", \"max_abs_err\": ");
        put_json_num(f, p->err.max_abs);
        fprintf(f, ", \"bytes_before\": %llu, \"bytes_after\": %llu, \"seconds\": %.3f",
                (unsigned long long)p->t->nbytes, (unsigned long long)p->bytes_out, p->secs);
        if (p->comp >= 0) fprintf(f, ", \"component\": \"%s\"", k_pi05_comp[p->comp]);
        if (p->fmt == NIB_WFMT_FP8) fprintf(f, ", \"fp8_per_channel\": %s", p->fp8_pc ? "true" : "false");
        if (p->fmt == NIB_WFMT_NVFP4) {
            fprintf(f, ", \"nvfp4_global\": %.9g, \"fused_group\": ", (double)p->global);
            if (p->fgroup) put_json_str(f, p->fgroup);
            else fputs("null", f);
        }
        fputc('}', f);
    }
    fprintf(f, "],\n \"kept\": [");
    first = 1;
    for (size_t i = 0; i < n; i++) {
        const tplan *p = &pl[i];
        if (p->quant) continue;
        fprintf(f, "%s\n  {\"name\": ", first ? "" : ",");
        first = 0;
        put_json_str(f, p->t->name);
        fprintf(f, ", \"dtype\": \"%s\", \"shape\": [", nib_dtype_name(p->t->dtype));
        for (int32_t d = 0; d < p->t->ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)p->t->shape[d]);
        fprintf(f, "], \"bytes\": %llu, \"reason\": ", (unsigned long long)p->t->nbytes);
        put_json_str(f, p->reason);
        fprintf(f, "}");
    }
    fprintf(f, "],\n \"totals\": {\"quantized\": %zu, \"kept\": %zu, \"parameters_quantized\": %llu, "
               "\"quantized_bytes_before\": %llu, \"quantized_bytes_after\": %llu, \"kept_bytes\": %llu, "
               "\"file_bytes_before\": %llu, \"file_bytes_after\": %llu, \"nmse\": ",
            tt->n_quant, tt->n_kept, (unsigned long long)tt->params, (unsigned long long)tt->q_in,
            (unsigned long long)tt->q_out, (unsigned long long)tt->kept_bytes,
            (unsigned long long)tt->file_in, (unsigned long long)tt->file_out);
    put_json_num(f, tt->ref_energy > 0 ? tt->err_energy / tt->ref_energy : 0.0);
    fprintf(f, ", \"seconds\": %.3f}}\n", tt->secs);
    if (fflush(f) != 0 || ferror(f)) st = NIB_ERR(NIB_ERR_IO, "report: writing '%s' failed", tmp);
    if (fclose(f) != 0 && !st) st = NIB_ERR(NIB_ERR_IO, "report: closing '%s' failed", tmp);
    if (!st && rename(tmp, o->report) != 0)
        st = NIB_ERR(NIB_ERR_IO, "report: cannot rename '%s' onto '%s'", tmp, o->report);
    if (st) remove(tmp);
    free(tmp);
    return st;
}

/* ---- the command -------------------------------------------------------------------------- */

/* __metadata__: the input's entries (but its quantization_config), then nib's config when
 * anything is quantized (exclude_modules: the 2-D float ".weight" tensors left as they are). */
static nib_status set_metadata(const qopts *o, const nib_st_file *f, const tplan *pl, size_t n, size_t n_quant,
                               nib_st_writer *w) {
    nib_status st = NIB_OK;
    const char **excl = NULL;
    nib_qckpt_wlayer *layers = NULL;
    size_t n_excl = 0, n_layers = 0;
    for (size_t i = 0; i < nib_st_metadata_count(f); i++) {
        const nib_st_kv *kv = nib_st_metadata_at(f, i);
        if (!strcmp(kv->key, "quantization_config")) continue;
        if (memchr(kv->value, '\0', kv->value_len))
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "metadata value of '%s' contains a NUL byte", kv->key);
        NIB_RETURN_IF_ERR(nib_st_writer_set_metadata(w, kv->key, kv->value));
    }
    if (!n_quant) return NIB_OK;
    excl = nib_calloc(n ? n : 1, sizeof *excl);
    layers = nib_calloc(n ? n : 1, sizeof *layers);
    if (!excl || !layers) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        const nib_st_tensor *t = pl[i].t;
        if (pl[i].quant) {
            layers[n_layers++] = (nib_qckpt_wlayer){pl[i].base, pl[i].fmt, pl[i].fp8_pc};
        } else if (t->ndim == 2 && ends_with(t->name, ".weight") &&
                   (t->dtype == NIB_DTYPE_BF16 || t->dtype == NIB_DTYPE_F16 || t->dtype == NIB_DTYPE_F32)) {
            char *b = nib_strdup(t->name);
            if (!b) {
                st = NIB_ERR_OUT_OF_MEMORY;
                goto fail;
            }
            b[t->name_len - strlen(".weight")] = '\0';
            excl[n_excl++] = b;
        }
    }
    nib_qckpt_wconfig wc = {.fmt = o->fmt,
                            .group = o->group,
                            .asym = o->asym,
                            .fp8_per_channel = o->fp8_per_channel,
                            .mxfp4_rule = o->rule,
                            .exclude = excl,
                            .n_exclude = n_excl,
                            .mixed = o->pi05_fast,
                            .layers = layers,
                            .n_layers = n_layers};
    st = nib_qckpt_set_metadata(w, &wc);
fail:
    for (size_t i = 0; i < n_excl; i++) nib_free((void *)excl[i]);
    nib_free(excl);
    nib_free(layers);
    return st;
}

int nib_cmd_quantize(int argc, char **argv) {
    qopts o;
    int help = 0, rc = 1;
    int u = parse_args(argc, argv, &o, &help);
    if (u || help) {
        if (help) print_help();
        free(o.inc);
        free(o.exc);
        return help ? 0 : u;
    }
    nib_status st = NIB_OK;
    nib_st_file *f = NULL;
    nib_st_writer *w = NULL;
    tplan *pl = NULL;
    uint32_t *chunk_tensor = NULL;
    pthread_t tid[MAX_THREADS];
    int n_threads = 0, sync_ok = 0;
    size_t n = 0, n_quant = 0, n_chunks = 0;
    qrun run;
    memset(&run, 0, sizeof run);
    totals tt;
    memset(&tt, 0, sizeof tt);
    progress pg = {0};
    double t0 = nib_now_s();

    struct stat si, so;
    if (stat(o.out, &so) == 0) {
        if (stat(o.in, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
            fprintf(stderr, "nib quantize: OUT '%s' is the input file\n", o.out);
            goto done;
        }
        if (!o.force) {
            fprintf(stderr, "nib quantize: '%s' exists (use --force to replace it)\n", o.out);
            goto done;
        }
    }
    st = nib_st_open(o.in, &f);
    if (st) {
        rc = nib_cli_fail("quantize", st);
        goto done;
    }
    n = nib_st_count(f);
    pl = nib_calloc(n ? n : 1, sizeof *pl);
    if (!pl) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    NIB_TRY(plan_tensors(&o, f, pl, &n_quant, &n_chunks));
    if (n_chunks > UINT32_MAX) {
        st = NIB_ERR(NIB_ERR_OVERFLOW, "quantize: %zu work chunks", n_chunks);
        goto fail;
    }
    chunk_tensor = nib_malloc((n_chunks ? n_chunks : 1) * sizeof *chunk_tensor);
    run.parts = nib_calloc(n_chunks ? n_chunks : 1, sizeof *run.parts);
    if (!chunk_tensor || !run.parts) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        pl[i].cursor = pl[i].chunk0;
        for (size_t c = 0; pl[i].quant && c < pl[i].n_chunks; c++) chunk_tensor[pl[i].chunk0 + c] = (uint32_t)i;
        if (pl[i].quant && pl[i].plane_bytes > run.budget) run.budget = pl[i].plane_bytes;
    }
    if (run.budget < WINDOW_BYTES) run.budget = WINDOW_BYTES;
    NIB_TRY(plan_amax(&o, pl, n, chunk_tensor, n_chunks));
    if (n_quant == 0)
        fprintf(stderr, "nib quantize: warning: no tensor is selected for quantization; OUT will be a copy\n");

    /* declare every tensor in input order, then the metadata */
    NIB_TRY(nib_st_writer_create(o.out, &w));
    for (size_t i = 0; i < n; i++) {
        const nib_st_tensor *t = pl[i].t;
        if (pl[i].quant) {
            nib_wsrc d;
            memset(&d, 0, sizeof d);
            d.fmt = pl[i].fmt;
            d.n = t->shape[0];
            d.k = t->shape[1];
            d.group = o.group;
            d.fp8_per_channel = pl[i].fp8_pc;
            NIB_TRY(nib_qckpt_declare_linear(w, pl[i].base, &d));
        } else {
            NIB_TRY(nib_st_writer_declare(w, t->name, t->dtype, t->ndim, t->shape));
        }
    }
    NIB_TRY(set_metadata(&o, f, pl, n, n_quant, w));

    /* workers quantize chunks ahead, in file order; this thread writes tensors in file order */
    init_tables();
    run.o = &o;
    run.pl = pl;
    run.chunk_tensor = chunk_tensor;
    run.n_chunks = n_chunks;
    run.stop_at = SIZE_MAX;
    if (pthread_mutex_init(&run.mu, NULL)) {
        st = NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "quantize: cannot create a mutex");
        goto fail;
    }
    sync_ok = 1;
    if (pthread_cond_init(&run.room, NULL)) {
        st = NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "quantize: cannot create a condition variable");
        goto fail;
    }
    sync_ok = 2;
    if (pthread_cond_init(&run.ready, NULL)) {
        st = NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "quantize: cannot create a condition variable");
        goto fail;
    }
    sync_ok = 3;
    for (int i = 0; n_chunks && i < o.threads; i++) {
        int e = pthread_create(&tid[i], NULL, worker_main, &run);
        if (e) {
            st = NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "quantize: cannot start worker thread %d of %d: %s", i + 1, o.threads,
                         strerror(e));
            goto fail;
        }
        n_threads++;
    }
    pg.on = isatty(STDERR_FILENO);
    pg.total = nib_st_data_size(f);
    for (size_t i = 0; i < n; i++) {
        tplan *p = &pl[i];
        progress_draw(&pg, i + 1, n, p->t->name, 1);
        if (p->quant) {
            NIB_TRY(wait_tensor(&run, p, &pg, i + 1, n));
            NIB_TRY(write_tensor(&run, w, p));
            drop_pages(p->t->data, (size_t)p->t->nbytes);
            pg.done += p->t->nbytes;
            tt.n_quant++;
            tt.q_in += p->t->nbytes;
            tt.q_out += p->bytes_out;
            tt.params += p->t->numel;
            tt.ref_energy += p->ref_energy;
            tt.err_energy += isfinite(p->err.nmse) ? p->err.nmse * p->ref_energy : 0.0;
        } else {
            NIB_TRY(copy_one(w, p->t, &pg, i + 1, n));
            tt.n_kept++;
            tt.kept_bytes += p->t->nbytes;
        }
    }
    for (int i = 0; i < n_threads; i++) pthread_join(tid[i], NULL);
    n_threads = 0;
    pg.done = pg.total;
    progress_draw(&pg, n, n, "done", 1);
    progress_end(&pg);
    st = nib_st_writer_finish(w);
    w = NULL;
    if (st) goto fail;
    tt.file_in = nib_st_file_size(f);
    if (stat(o.out, &so) == 0) tt.file_out = (uint64_t)so.st_size;
    tt.secs = nib_now_s() - t0;
    if (!o.quiet) print_table(&o, pl, n, &tt);
    if (o.report && (st = write_report(&o, pl, n, &tt)) != NIB_OK) {
        nib_error_context(st, "%s was written, but its report was not", o.out);
        rc = nib_cli_fail("quantize", st);
        goto done;
    }
    {
        char h1[32], h2[32];
        printf("nib quantize: wrote %s: %zu tensors quantized to %s, %zu kept, %s -> %s\n", o.out,
               tt.n_quant, what_str(&o), tt.n_kept, human(tt.file_in, h1), human(tt.file_out, h2));
    }
    rc = 0;
    goto done;
fail:
    if (n_threads) {
        run_stop(&run);
        for (int i = 0; i < n_threads; i++) pthread_join(tid[i], NULL);
        n_threads = 0;
    }
    progress_end(&pg);
    nib_st_writer_abort(w);
    w = NULL;
    rc = nib_cli_fail("quantize", st);
done:
    fflush(stdout);
    if (sync_ok >= 3) pthread_cond_destroy(&run.ready);
    if (sync_ok >= 2) pthread_cond_destroy(&run.room);
    if (sync_ok >= 1) pthread_mutex_destroy(&run.mu);
    if (pl)
        for (size_t i = 0; i < n; i++) {
            nib_free(pl[i].base);
            nib_free(pl[i].fgroup);
            free_planes(&pl[i]);
        }
    if (run.parts)
        for (size_t c = 0; c < n_chunks; c++) free(run.parts[c].msg);
    nib_free(run.parts);
    nib_free(chunk_tensor);
    nib_free(pl);
    nib_st_close(f);
    free(o.inc);
    free(o.exc);
    return rc;
}
