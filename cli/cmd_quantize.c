/* cmd_quantize.c — `nib quantize IN OUT --format F`: quantize the linear weights of a safetensors
 * checkpoint into the layouts of io/qcheckpoint.h (ModelOpt NVFP4 / FP8, GPTQ INT4, nib MXFP4),
 * copy every other tensor unchanged, and report the error of each quantized tensor.
 *
 * Streaming: the input is mapped; tensors are processed one at a time in file order (convert to
 * fp32, quantize, measure, write, free), and the input pages of a finished tensor are dropped
 * from the mapping, so memory stays at about 3 x 4 bytes x the largest quantized tensor. The
 * output goes to OUT.tmp and is renamed onto OUT only when complete. */
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "formats/formats.h"
#include "io/json.h"
#include "io/qcheckpoint.h"
#include "io/safetensors.h"

#define NAME_COL_MAX 60
#define COPY_CHUNK ((size_t)64 << 20) /* bytes copied (and released from the mapping) per step */

typedef struct qopts {
    const char *in, *out, *report;
    nib_wfmt fmt;
    int group, asym, fp8_per_channel, force, quiet;
    int nvfp4_shared; /* one NVFP4 global per fused group (q|k|v, gate|up) */
    nib_mxfp4_rule rule;
    const char **inc, **exc;
    size_t n_inc, n_exc;
} qopts;

/* One input tensor's plan and result. */
typedef struct tplan {
    const nib_st_tensor *t;
    int quant;          /* 1: quantized */
    const char *reason; /* kept: why (static text) */
    char *base;         /* quantized: name without ".weight" */
    char *fgroup;       /* fused group key ("<dir>.qkv", "<dir>.gate_up") or NULL */
    float amax;         /* NVFP4: max |w| of the tensor, then of its fused group */
    float global;       /* NVFP4 global used */
    nib_quant_err err;
    double ref_energy;  /* sum ref^2, for the energy-weighted total NMSE */
    uint64_t bytes_out;
    double secs;
} tplan;

static void print_help(void) {
    printf(
        "usage: nib quantize IN.safetensors OUT.safetensors --format nvfp4|mxfp4|int4|fp8 [options]\n"
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
        "  --format F          nvfp4 | mxfp4 | int4 | fp8 (required)\n"
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
    fprintf(stderr, "usage: nib quantize IN OUT --format nvfp4|mxfp4|int4|fp8 [options]   "
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
    const char *fmt = NULL, *rule = NULL, *group = NULL, *nvg = NULL;
    memset(o, 0, sizeof *o);
    o->nvfp4_shared = 1;
    o->group = NIB_INT4_GROUP_DEFAULT;
    o->rule = NIB_MXFP4_SCALE_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if (nib_cli_is_help(a)) {
            *help = 1;
            return 0;
        } else if ((v = opt_value(argc, argv, &i, "--format", &missing))) {
            fmt = v;
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
    if (!fmt) return usage_error("--format is required (nvfp4, mxfp4, int4 or fp8)", NULL);
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
    uint64_t total, done;
    double last;
} progress;

static void progress_draw(progress *p, size_t i, size_t n, const char *name, int force) {
    if (!p->on) return;
    double now = nib_now_s();
    if (!force && now - p->last < 0.1) return;
    p->last = now;
    enum { W = 30 };
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
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

/* Decide each tensor. Returns the number selected for quantization. */
static nib_status plan_tensors(const qopts *o, const nib_st_file *f, tplan *pl, size_t *n_quant) {
    *n_quant = 0;
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        tplan *p = &pl[i];
        p->t = t;
        int sel = o->n_inc ? matches(o->inc, o->n_inc, t->name) : nib_qckpt_default_rule(t->name);
        if (sel && matches(o->exc, o->n_exc, t->name)) sel = 0;
        if (!sel) {
            p->reason = "not selected";
            continue;
        }
        if (t->dtype != NIB_DTYPE_BF16 && t->dtype != NIB_DTYPE_F16 && t->dtype != NIB_DTYPE_F32) {
            p->reason = "not a BF16/F16/F32 tensor";
            continue;
        }
        if (t->ndim != 2) {
            p->reason = "not a 2-D weight";
            continue;
        }
        if (!ends_with(t->name, ".weight")) {
            p->reason = "name does not end in \".weight\"";
            continue;
        }
        const char *why = nib_qckpt_linear_unwritable(o->fmt, t->shape[0], t->shape[1], o->group);
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
        (*n_quant)++;
    }
    return NIB_OK;
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

static float tensor_amax(const nib_st_tensor *t) {
    const uint8_t *p = (const uint8_t *)t->data;
    float m = 0.0f;
    for (uint64_t i = 0; i < t->numel; i++) {
        float v;
        uint16_t h;
        if (t->dtype == NIB_DTYPE_F32) memcpy(&v, p + 4 * i, 4);
        else {
            memcpy(&h, p + 2 * i, 2);
            v = t->dtype == NIB_DTYPE_BF16 ? nib_bf16_to_f32(h) : nib_f16_to_f32(h);
        }
        v = fabsf(v);
        if (v > m || v != v) m = v; /* NaN propagates: the quantizer rejects it, naming the element */
    }
    return m;
}

/* NVFP4 with shared globals: every quantized tensor's global from the amax of its fused group
 * (one extra read of the selected tensors). */
static nib_status plan_globals(const qopts *o, tplan *pl, size_t n) {
    for (size_t i = 0; i < n; i++) {
        tplan *p = &pl[i];
        if (!p->quant) continue;
        p->amax = tensor_amax(p->t);
        drop_pages(p->t->data, (size_t)p->t->nbytes);
        if (o->nvfp4_shared) NIB_RETURN_IF_ERR(fused_group(p->base, &p->fgroup));
    }
    for (size_t i = 0; i < n; i++) {
        tplan *p = &pl[i];
        if (!p->quant) continue;
        float m = p->amax;
        if (p->fgroup)
            for (size_t j = 0; j < n; j++)
                if (pl[j].quant && pl[j].fgroup && !strcmp(pl[j].fgroup, p->fgroup) && !(pl[j].amax <= m))
                    m = pl[j].amax;
        p->global = m == m ? nib_nvfp4_global_for_amax(m) : 1.0f;
    }
    return NIB_OK;
}

static nib_wsrc desc_of(const qopts *o, const nib_st_tensor *t) {
    nib_wsrc d;
    memset(&d, 0, sizeof d);
    d.fmt = o->fmt;
    d.n = t->shape[0];
    d.k = t->shape[1];
    d.group = o->group;
    d.fp8_per_channel = o->fp8_per_channel;
    return d;
}

/* ---- one tensor ---------------------------------------------------------------------------- */

static void to_f32(const nib_st_tensor *t, float *dst) {
    const uint8_t *p = (const uint8_t *)t->data;
    const uint64_t n = t->numel;
    if (t->dtype == NIB_DTYPE_F32) {
        memcpy(dst, p, (size_t)n * 4);
    } else {
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = t->dtype == NIB_DTYPE_BF16 ? nib_bf16_to_f32(h) : nib_f16_to_f32(h);
        }
    }
}

static nib_status quantize_one(const qopts *o, nib_st_writer *w, tplan *p) {
    nib_status st = NIB_OK;
    const nib_st_tensor *t = p->t;
    const int64_t n = t->shape[0], k = t->shape[1];
    const size_t nk = (size_t)t->numel;
    float *x = NULL, *deq = NULL;
    uint8_t *data = NULL, *scales = NULL;
    nib_int4_weight iw;
    memset(&iw, 0, sizeof iw);
    nib_wsrc ws = desc_of(o, t);
    double t0 = nib_now_s();

    x = nib_malloc(nk * sizeof *x);
    deq = nib_malloc(nk * sizeof *deq);
    if (!x || !deq) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    to_f32(t, x);
    switch (o->fmt) {
    case NIB_WFMT_NVFP4:
        data = nib_malloc(nk / 2);
        scales = nib_malloc(nk / 16);
        if (!data || !scales) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        /* the global of the fused group (= this tensor's own rule when it is alone) */
        ws.global_scale = p->global;
        NIB_TRY(nib_nvfp4_quantize_global(x, n, k, data, scales, ws.global_scale));
        break;
    case NIB_WFMT_MXFP4:
        data = nib_malloc(nk / 2);
        scales = nib_malloc(nk / 32);
        if (!data || !scales) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        NIB_TRY(nib_mxfp4_quantize(x, n, k, o->rule, data, scales));
        break;
    case NIB_WFMT_FP8:
        data = nib_malloc(nk);
        scales = nib_malloc((o->fp8_per_channel ? (size_t)n : 1) * sizeof(float));
        if (!data || !scales) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        NIB_TRY(nib_fp8_quantize(x, n, k, o->fp8_per_channel, data, (float *)(void *)scales));
        break;
    case NIB_WFMT_INT4:
        NIB_TRY(nib_int4_quantize(x, n, k, o->group, o->asym, NULL, &iw));
        break;
    default: st = NIB_ERR(NIB_ERR_INTERNAL, "quantize: format %d", (int)o->fmt); goto fail;
    }
    if (o->fmt == NIB_WFMT_INT4) {
        ws.data = iw.packed;
        ws.scales = iw.scales;
        ws.zeros = iw.zeros;
    } else {
        ws.data = data;
        ws.scales = scales;
    }
    NIB_TRY(nib_wsrc_dequantize(&ws, deq));
    NIB_TRY(nib_quant_error(x, deq, nk, &p->err));
    double e = 0.0;
    for (size_t i = 0; i < nk; i++) e += (double)x[i] * (double)x[i];
    p->ref_energy = e;
    nib_free(deq); /* release before writing */
    deq = NULL;
    nib_free(x);
    x = NULL;
    NIB_TRY(nib_qckpt_write_linear(w, p->base, &ws));
    p->bytes_out = nib_qckpt_linear_file_bytes(&ws);
    p->secs = nib_now_s() - t0;
fail:
    if (st) nib_error_context(st, "'%s'", t->name);
    nib_free(x);
    nib_free(deq);
    nib_free(data);
    nib_free(scales);
    nib_int4_free(&iw);
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
    printf("%s -> %s (%s)\n\n", o->in, o->out, nib_wfmt_name(o->fmt));
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
                   nib_wfmt_name(o->fmt), p->err.nmse, p->err.cosine, p->err.max_abs,
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
    printf("\n  kept       %zu tensors, %s (copied unchanged)\n", tt->n_kept, human(tt->kept_bytes, h1));
    printf("  file       %s -> %s\n", human(tt->file_in, h1), human(tt->file_out, h2));
    if (tt->n_quant)
        printf("  NMSE       %.3e over all quantized weights (sum of squared errors / sum of squares)\n",
               tt->ref_energy > 0 ? tt->err_energy / tt->ref_energy : 0.0);
    printf("  time       %.2f s\n", tt->secs);
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
               "\"fp8_per_channel\": %s, \"nvfp4_global\": \"%s\"},\n \"tensors\": [",
            nib_wfmt_name(o->fmt), o->group, o->asym ? "true" : "false", nib_mxfp4_rule_name(o->rule),
            o->fp8_per_channel ? "true" : "false", o->nvfp4_shared ? "shared" : "per-tensor");
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        const tplan *p = &pl[i];
        if (!p->quant) continue;
        fprintf(f, "%s\n  {\"name\": ", first ? "" : ",");
        first = 0;
        put_json_str(f, p->t->name);
        fprintf(f, ", \"dtype\": \"%s\", \"shape\": [%lld, %lld], \"format\": \"%s\", \"nmse\": ",
                nib_dtype_name(p->t->dtype), (long long)p->t->shape[0], (long long)p->t->shape[1],
                nib_wfmt_name(o->fmt));
        put_json_num(f, p->err.nmse);
        fprintf(f, ", \"cosine\": ");
        put_json_num(f, p->err.cosine);
        fprintf(f, ", \"max_abs_err\": ");
        put_json_num(f, p->err.max_abs);
        fprintf(f, ", \"bytes_before\": %llu, \"bytes_after\": %llu, \"seconds\": %.3f",
                (unsigned long long)p->t->nbytes, (unsigned long long)p->bytes_out, p->secs);
        if (o->fmt == NIB_WFMT_NVFP4) {
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
    const char **excl = NULL;
    size_t n = 0, n_quant = 0, n_excl = 0;
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
    NIB_TRY(plan_tensors(&o, f, pl, &n_quant));
    if (o.fmt == NIB_WFMT_NVFP4) NIB_TRY(plan_globals(&o, pl, n));
    if (n_quant == 0)
        fprintf(stderr, "nib quantize: warning: no tensor is selected for quantization; OUT will be a copy\n");

    /* declare every tensor in input order, then the metadata */
    NIB_TRY(nib_st_writer_create(o.out, &w));
    for (size_t i = 0; i < n; i++) {
        const nib_st_tensor *t = pl[i].t;
        if (pl[i].quant) {
            nib_wsrc d = desc_of(&o, t);
            NIB_TRY(nib_qckpt_declare_linear(w, pl[i].base, &d));
        } else {
            NIB_TRY(nib_st_writer_declare(w, t->name, t->dtype, t->ndim, t->shape));
        }
    }
    for (size_t i = 0; i < nib_st_metadata_count(f); i++) {
        const nib_st_kv *kv = nib_st_metadata_at(f, i);
        if (!strcmp(kv->key, "quantization_config")) continue;
        if (memchr(kv->value, '\0', kv->value_len)) {
            st = NIB_ERR(NIB_ERR_UNSUPPORTED, "metadata value of '%s' contains a NUL byte", kv->key);
            goto fail;
        }
        NIB_TRY(nib_st_writer_set_metadata(w, kv->key, kv->value));
    }
    if (n_quant) {
        /* exclude_modules: the 2-D float ".weight" tensors left in their dtype */
        excl = nib_calloc(n ? n : 1, sizeof *excl);
        if (!excl) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        for (size_t i = 0; i < n; i++) {
            const nib_st_tensor *t = pl[i].t;
            if (!pl[i].quant && t->ndim == 2 && ends_with(t->name, ".weight") &&
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
        nib_qckpt_wconfig wc = {.fmt = o.fmt,
                                .group = o.group,
                                .asym = o.asym,
                                .fp8_per_channel = o.fp8_per_channel,
                                .mxfp4_rule = o.rule,
                                .exclude = excl,
                                .n_exclude = n_excl};
        NIB_TRY(nib_qckpt_set_metadata(w, &wc));
    }

    /* stream: one tensor at a time, file order */
    pg.on = isatty(STDERR_FILENO);
    pg.total = nib_st_data_size(f);
    for (size_t i = 0; i < n; i++) {
        tplan *p = &pl[i];
        tt.file_in += p->t->nbytes;
        progress_draw(&pg, i + 1, n, p->t->name, 1);
        if (p->quant) {
            NIB_TRY(quantize_one(&o, w, p));
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
               tt.n_quant, nib_wfmt_name(o.fmt), tt.n_kept, human(tt.file_in, h1), human(tt.file_out, h2));
    }
    rc = 0;
    goto done;
fail:
    progress_end(&pg);
    nib_st_writer_abort(w);
    w = NULL;
    rc = nib_cli_fail("quantize", st);
done:
    fflush(stdout);
    if (pl)
        for (size_t i = 0; i < n; i++) {
            nib_free(pl[i].base);
            nib_free(pl[i].fgroup);
        }
    for (size_t i = 0; i < n_excl; i++) nib_free((void *)excl[i]);
    nib_free(excl);
    nib_free(pl);
    nib_st_close(f);
    free(o.inc);
    free(o.exc);
    return rc;
}
