/* cmd_inspect.c — `nib inspect FILE [--json] [--check]`: validate a safetensors file completely
 * and list its tensors (file order), totals and metadata. The components of a quantized linear
 * layer (io/qcheckpoint.h: ModelOpt NVFP4/FP8, GPTQ, AWQ, compressed-tensors, nib MXFP4) are
 * shown as one entry: format, block, logical shape [N, K], bits per weight. Without --check only
 * the header is read (and the 2-element weight_shape tensors of compressed-tensors layers): the
 * file is mapped lazily and other data pages are never touched; --check reads every tensor and
 * reports invalid values. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "io/json.h"
#include "io/qcheckpoint.h"
#include "io/safetensors.h"

#define NAME_COL_MAX 60 /* a longer name overflows its column instead of widening the table */

static void usage_error(void) {
    fprintf(stderr, "usage: nib inspect FILE [--json] [--check]   (nib inspect --help for details)\n");
}

static void print_help(void) {
    printf("usage: nib inspect FILE [--json] [--check]\n"
           "Validates a .safetensors file completely (length prefix, strict JSON header,\n"
           "dtypes, shapes, sizes, and that the tensors tile the data section exactly) and\n"
           "lists each tensor's name, dtype, shape and bytes in file order, then the totals\n"
           "(tensors, parameters, data, header and file bytes) and the __metadata__ entries.\n"
           "The tensors of a quantized linear layer (ModelOpt NVFP4/FP8, GPTQ, AWQ,\n"
           "compressed-tensors pack-quantized, nib MXFP4) are listed as one entry named by the\n"
           "layer: format, layout, block size, logical shape [N, K], bits per weight and parts.\n"
           "Tensor data is not read unless --check is given (except compressed-tensors'\n"
           "2-element weight_shape). Control characters in names are printed escaped.\n"
           "  --json   print one JSON object instead of the table\n"
           "  --check  read every tensor: NaN/Inf in float tensors, NaN codes in F8_E4M3 tensors\n"
           "           (weights and scale planes), 0xFF in F8_E8M0 scales, and the structure and\n"
           "           scales of each quantized linear (missing or misshapen parts, negative or NaN\n"
           "           block scales, non-positive NVFP4 global scales, ...); lists each problem\n"
           "           with the tensor, the index of the first bad element and the count\n"
           "Exit status: 0 valid file (and, with --check, no problem), 1 invalid or unreadable\n"
           "file or problems found, 2 usage error.\n");
}

/* Write s[0 .. n) with JSON string escaping, so no control character reaches the terminal,
 * to out (or nowhere if out is NULL); returns the terminal columns it takes: the code points
 * of the escaped text (wide characters are not accounted for). Chunks are cut before a UTF-8
 * continuation byte so no sequence is split. */
static size_t put_escaped(FILE *out, const char *s, size_t n) {
    enum { CHUNK = 256 };
    char buf[6 * CHUNK + 1]; /* escaping grows text at most 6x */
    size_t i = 0, cols = 0;
    while (i < n) {
        size_t end = n - i > CHUNK ? i + CHUNK : n;
        while (end < n && end > i + 1 && ((unsigned char)s[end] & 0xC0) == 0x80) end--;
        nib_json_escape(buf, sizeof buf, s + i, end - i);
        for (const char *c = buf; *c; c++) cols += ((unsigned char)*c & 0xC0) != 0x80;
        if (out) fputs(buf, out);
        i = end;
    }
    return cols;
}

/* "[2048, 1024]"; "[]" for a scalar. */
static const char *shape_str(const nib_st_tensor *t, char *buf, size_t cap) {
    size_t w = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < t->ndim && w < cap; i++)
        w += (size_t)snprintf(buf + w, cap - w, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (w < cap) snprintf(buf + w, cap - w, "]");
    return buf;
}

/* "4.19 MB" style (three significant digits, decimal prefixes); plain "<x> <unit>" below
 * 1000. unit is "" for counts. */
static const char *human(uint64_t x, const char *unit, char buf[32]) {
    static const char *const prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
    double v = (double)x;
    size_t p = 0;
    while (v >= 1000.0 && p + 1 < NIB_ARRAY_LEN(prefixes)) {
        v /= 1000.0;
        p++;
    }
    if (p == 0) snprintf(buf, 32, "%llu%s%s", (unsigned long long)x, *unit ? " " : "", unit);
    else snprintf(buf, 32, "%.*f %s%s", v < 10 ? 2 : v < 100 ? 1 : 0, v, prefixes[p], unit);
    return buf;
}

/* Tensors tile the data section, and numel <= nbytes, so the sum cannot overflow. */
static uint64_t total_params(const nib_st_file *f) {
    uint64_t p = 0;
    for (size_t i = 0; i < nib_st_count(f); i++) p += nib_st_tensor_at(f, i)->numel;
    return p;
}

/* ---- quantized linears ------------------------------------------------------------------- */

typedef struct qview {
    nib_qckpt_index *ix;    /* NULL when the index could not be built */
    char *shown;            /* per index entry: 1 once its row was printed */
    size_t n_ok, n_bad;     /* detected / malformed quantized linears */
} qview;

static const nib_qckpt_entry *row_owner(const qview *q, size_t i) {
    return q->ix ? nib_qckpt_index_owner(q->ix, i) : NULL;
}

/* "block 16", "group 128, act-order", "per-tensor scale" ... */
static const char *block_str(const nib_qckpt_info *in, char *buf, size_t cap) {
    switch (in->fmt) {
    case NIB_WFMT_NVFP4: snprintf(buf, cap, "block 16 (E4M3 scale, F32 global)"); break;
    case NIB_WFMT_MXFP4: snprintf(buf, cap, "block 32 (E8M0 scale)"); break;
    case NIB_WFMT_FP8:
        snprintf(buf, cap, "%s scale", in->fp8_per_channel ? "per-channel" : "per-tensor");
        break;
    case NIB_WFMT_INT4:
        snprintf(buf, cap, "group %d%s%s", in->block, in->int4_asym ? ", zero points" : "",
                 in->int4_act_order ? ", g_idx" : "");
        break;
    default: snprintf(buf, cap, "-"); break;
    }
    return buf;
}

static const char *logical_shape(const nib_qckpt_info *in, char *buf, size_t cap) {
    snprintf(buf, cap, "[%lld, %lld]", (long long)in->n, (long long)in->k);
    return buf;
}

/* the part's name after "<base>." */
static const char *part_suffix(const nib_qckpt_entry *e, const nib_st_tensor *t) {
    size_t bl = strlen(e->base);
    return t->name_len > bl + 1 ? t->name + bl + 1 : t->name;
}

static void qview_build(qview *q, const nib_st_file *f) {
    memset(q, 0, sizeof *q);
    nib_qckpt_config cfg;
    if (nib_qckpt_config_from_file(f, &cfg) != NIB_OK) memset(&cfg, 0, sizeof cfg);
    if (nib_qckpt_index_build(f, &cfg, &q->ix) != NIB_OK) {
        q->ix = NULL;
        return;
    }
    size_t n = nib_qckpt_index_count(q->ix);
    q->shown = calloc(n ? n : 1, 1);
    if (!q->shown) { /* list plain tensors only */
        nib_qckpt_index_free(q->ix);
        q->ix = NULL;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (nib_qckpt_index_at(q->ix, i)->status == NIB_OK) q->n_ok++;
        else q->n_bad++;
    }
}

static void qview_free(qview *q) {
    nib_qckpt_index_free(q->ix);
    free(q->shown);
    memset(q, 0, sizeof *q);
}

/* ---- --check ------------------------------------------------------------------------------ */

typedef struct problem {
    const char *name;       /* tensor or layer */
    char *msg;
    uint64_t first, count;  /* element problems (count > 0) */
} problem;

typedef struct problems {
    problem *p;
    size_t n, cap;
    int oom;
} problems;

static void add_problem(problems *ps, const char *name, const char *msg, uint64_t first,
                        uint64_t count) {
    if (ps->oom) return;
    if (ps->n == ps->cap) {
        size_t ncap = ps->cap ? 2 * ps->cap : 16;
        problem *np = realloc(ps->p, ncap * sizeof *np);
        if (!np) {
            ps->oom = 1;
            return;
        }
        ps->p = np;
        ps->cap = ncap;
    }
    char *m = malloc(strlen(msg) + 1);
    if (!m) {
        ps->oom = 1;
        return;
    }
    strcpy(m, msg);
    ps->p[ps->n++] = (problem){name, m, first, count};
}

static void problems_free(problems *ps) {
    for (size_t i = 0; i < ps->n; i++) free(ps->p[i].msg);
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

static void run_check(const nib_st_file *f, const qview *q, problems *ps) {
    size_t nt = nib_st_count(f);
    char *flagged = calloc(nt ? nt : 1, 1);
    nib_qckpt_config cfg;
    if (nib_qckpt_config_from_file(f, &cfg) != NIB_OK) {
        add_problem(ps, "__metadata__.quantization_config", nib_last_error(), 0, 0);
        memset(&cfg, 0, sizeof cfg);
    }
    for (size_t i = 0; i < nt; i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        nib_qckpt_bad bad;
        nib_qckpt_scan_tensor(t, &bad);
        if (bad.count) {
            add_problem(ps, t->name, bad.what, bad.first, bad.count);
            if (flagged) flagged[i] = 1;
        }
    }
    for (size_t e = 0; q->ix && e < nib_qckpt_index_count(q->ix); e++) {
        const nib_qckpt_entry *en = nib_qckpt_index_at(q->ix, e);
        if (en->status != NIB_OK) {
            add_problem(ps, en->base, en->problem, 0, 0);
            continue;
        }
        int seen = 0; /* a part with element problems is reported once, above */
        for (size_t i = 0; i < nt && flagged; i++)
            if (flagged[i] && row_owner(q, i) == en) seen = 1;
        if (seen) continue;
        nib_qlinear ql;
        nib_qckpt_opts o = {.flags = NIB_QCKPT_VALIDATE_ONLY, .config = &cfg};
        if (nib_qckpt_get_linear_ex(f, en->base, &o, &ql) != NIB_OK)
            add_problem(ps, en->base, nib_last_error(), 0, 0);
        nib_qlinear_free(&ql);
    }
    free(flagged);
}

static void print_problems_text(const problems *ps, size_t n_tensors) {
    if (ps->n == 0) {
        printf("\ncheck: ok (%zu tensors scanned)\n", n_tensors);
        return;
    }
    printf("\ncheck: %zu problem%s\n", ps->n, ps->n == 1 ? "" : "s");
    for (size_t i = 0; i < ps->n; i++) {
        const problem *p = &ps->p[i];
        printf("  ");
        put_escaped(stdout, p->name, strlen(p->name));
        if (p->count)
            printf(": %s at index %llu (%llu bad element%s)\n", p->msg, (unsigned long long)p->first,
                   (unsigned long long)p->count, p->count == 1 ? "" : "s");
        else {
            printf(": ");
            put_escaped(stdout, p->msg, strlen(p->msg));
            printf("\n");
        }
    }
}

/* ---- listing -------------------------------------------------------------------------------- */

static void print_text(const char *path, const nib_st_file *f, qview *q) {
    char shape[256], h1[32], h2[32], blk[96];
    size_t name_w = 4, shape_w = 5;
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        const nib_qckpt_entry *e = row_owner(q, i);
        size_t w = e ? put_escaped(NULL, e->base, strlen(e->base))
                     : put_escaped(NULL, t->name, t->name_len);
        size_t s = strlen(e ? logical_shape(&e->info, shape, sizeof shape)
                            : shape_str(t, shape, sizeof shape));
        if (w > name_w) name_w = w > NAME_COL_MAX ? NAME_COL_MAX : w;
        if (s > shape_w) shape_w = s;
    }
    printf("%s\n\n", path);
    printf("  %-*s  %-8s  %-*s  %s\n", (int)name_w, "NAME", "DTYPE", (int)shape_w, "SHAPE",
           q->n_ok ? "BYTES        QUANTIZATION" : "BYTES");
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        const nib_qckpt_entry *e = row_owner(q, i);
        if (e) {
            size_t ei = (size_t)(e - nib_qckpt_index_at(q->ix, 0));
            if (q->shown[ei]) continue;
            q->shown[ei] = 1;
            printf("  ");
            size_t w = put_escaped(stdout, e->base, strlen(e->base));
            printf("%*s  %-8s  %-*s  %-11llu  %s, %s, %.3f bits/w:", (int)(w < name_w ? name_w - w : 0),
                   "", nib_wfmt_name(e->info.fmt), (int)shape_w,
                   logical_shape(&e->info, shape, sizeof shape), (unsigned long long)e->info.bytes,
                   nib_qckpt_layout_name(e->info.layout), block_str(&e->info, blk, sizeof blk),
                   e->info.bits_per_weight);
            for (size_t p = 0; p < e->info.n_parts; p++) {
                const char *suf = part_suffix(e, e->info.parts[p]);
                printf(" ");
                put_escaped(stdout, suf, strlen(suf));
            }
            printf("\n");
            continue;
        }
        printf("  ");
        size_t w = put_escaped(stdout, t->name, t->name_len);
        printf("%*s  %-8s  %-*s  %llu\n", (int)(w < name_w ? name_w - w : 0), "",
               nib_dtype_name(t->dtype), (int)shape_w, shape_str(t, shape, sizeof shape),
               (unsigned long long)t->nbytes);
    }
    uint64_t params = total_params(f), data = nib_st_data_size(f);
    printf("\n  tensors     %zu\n", nib_st_count(f));
    if (q->n_ok || q->n_bad) {
        uint64_t wts = 0, wb = 0;
        for (size_t e = 0; e < nib_qckpt_index_count(q->ix); e++) {
            const nib_qckpt_entry *en = nib_qckpt_index_at(q->ix, e);
            if (en->status != NIB_OK) continue;
            wts += (uint64_t)en->info.n * (uint64_t)en->info.k;
            wb += en->info.weight_bytes;
        }
        printf("  quantized   %zu linear layers", q->n_ok);
        if (wts) printf(": %llu weights in %s (%.3f bits/w)", (unsigned long long)wts, human(wb, "B", h1),
                        8.0 * (double)wb / (double)wts);
        if (q->n_bad)
            printf(", %zu malformed tensor set%s (listed as plain tensors; --check says why)", q->n_bad,
                   q->n_bad == 1 ? "" : "s");
        printf("\n");
    }
    printf("  parameters  %llu (%s)\n", (unsigned long long)params, human(params, "", h1));
    printf("  data        %llu bytes (%s)\n", (unsigned long long)data, human(data, "B", h2));
    printf("  header      %llu bytes\n", (unsigned long long)nib_st_header_size(f));
    printf("  file        %llu bytes\n", (unsigned long long)nib_st_file_size(f));
    if (nib_st_metadata_count(f) == 0) return;
    printf("\n  metadata (%zu)\n", nib_st_metadata_count(f));
    for (size_t i = 0; i < nib_st_metadata_count(f); i++) {
        const nib_st_kv *kv = nib_st_metadata_at(f, i);
        printf("    ");
        put_escaped(stdout, kv->key, kv->key_len);
        printf(": ");
        put_escaped(stdout, kv->value, kv->value_len);
        printf("\n");
    }
}

static void put_json_string(const char *s, size_t n) {
    putchar('"');
    put_escaped(stdout, s, n);
    putchar('"');
}

static void print_json(const char *path, const nib_st_file *f, const qview *q,
                       const problems *ps) {
    char blk[96];
    printf("{\"file\": ");
    put_json_string(path, strlen(path));
    printf(", \"file_bytes\": %llu, \"header_bytes\": %llu, \"data_bytes\": %llu, "
           "\"tensor_count\": %zu, \"parameters\": %llu,\n \"tensors\": [",
           (unsigned long long)nib_st_file_size(f), (unsigned long long)nib_st_header_size(f),
           (unsigned long long)nib_st_data_size(f), nib_st_count(f),
           (unsigned long long)total_params(f));
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        printf("%s\n  {\"name\": ", i ? "," : "");
        put_json_string(t->name, t->name_len);
        printf(", \"dtype\": \"%s\", \"shape\": [", nib_dtype_name(t->dtype));
        for (int32_t d = 0; d < t->ndim; d++)
            printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
        printf("], \"data_offsets\": [%llu, %llu], \"bytes\": %llu}", (unsigned long long)t->begin,
               (unsigned long long)t->end, (unsigned long long)t->nbytes);
    }
    printf("],\n \"quantized\": [");
    size_t nq = 0;
    for (size_t e = 0; q->ix && e < nib_qckpt_index_count(q->ix); e++) {
        const nib_qckpt_entry *en = nib_qckpt_index_at(q->ix, e);
        if (en->status != NIB_OK) continue;
        const nib_qckpt_info *in = &en->info;
        printf("%s\n  {\"name\": ", nq++ ? "," : "");
        put_json_string(en->base, strlen(en->base));
        printf(", \"format\": \"%s\", \"layout\": \"%s\", \"block\": %d, \"block_desc\": ",
               nib_wfmt_name(in->fmt), nib_qckpt_layout_name(in->layout), in->block);
        block_str(in, blk, sizeof blk);
        put_json_string(blk, strlen(blk));
        printf(", \"shape\": [%lld, %lld], \"bits_per_weight\": %.6g, \"weight_bytes\": %llu, "
               "\"bytes\": %llu, \"parts\": [",
               (long long)in->n, (long long)in->k, in->bits_per_weight,
               (unsigned long long)in->weight_bytes, (unsigned long long)in->bytes);
        for (size_t p = 0; p < in->n_parts; p++) {
            printf("%s", p ? ", " : "");
            put_json_string(in->parts[p]->name, in->parts[p]->name_len);
        }
        printf("]}");
    }
    printf("],\n \"metadata\": {");
    for (size_t i = 0; i < nib_st_metadata_count(f); i++) {
        const nib_st_kv *kv = nib_st_metadata_at(f, i);
        printf("%s", i ? ", " : "");
        put_json_string(kv->key, kv->key_len);
        printf(": ");
        put_json_string(kv->value, kv->value_len);
    }
    printf("}");
    if (ps) {
        printf(",\n \"check\": {\"ok\": %s, \"problems\": [", ps->n ? "false" : "true");
        for (size_t i = 0; i < ps->n; i++) {
            printf("%s\n  {\"name\": ", i ? "," : "");
            put_json_string(ps->p[i].name, strlen(ps->p[i].name));
            printf(", \"problem\": ");
            put_json_string(ps->p[i].msg, strlen(ps->p[i].msg));
            if (ps->p[i].count)
                printf(", \"first_index\": %llu, \"count\": %llu", (unsigned long long)ps->p[i].first,
                       (unsigned long long)ps->p[i].count);
            printf("}");
        }
        printf("]}");
    }
    printf("}\n");
}

int nib_cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int json = 0, check = 0, rc = 0;
    for (int i = 1; i < argc; i++) {
        if (nib_cli_is_help(argv[i])) {
            print_help();
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--check")) {
            check = 1;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "nib inspect: unknown option '%s'\n", argv[i]);
            usage_error();
            return 2;
        } else if (path) {
            fprintf(stderr, "nib inspect: expected one FILE, got '%s' and '%s'\n", path, argv[i]);
            usage_error();
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage_error();
        return 2;
    }
    nib_st_file *f = NULL;
    nib_status st = nib_st_open(path, &f);
    if (st != NIB_OK) return nib_cli_fail("inspect", st);
    qview q;
    problems ps = {0};
    qview_build(&q, f);
    if (check) run_check(f, &q, &ps);
    if (json) print_json(path, f, &q, check ? &ps : NULL);
    else {
        print_text(path, f, &q);
        if (check) print_problems_text(&ps, nib_st_count(f));
    }
    if (check && (ps.n || ps.oom)) {
        rc = 1;
        if (ps.oom) fprintf(stderr, "nib inspect: out of memory while checking\n");
        else fprintf(stderr, "nib inspect: %zu problem%s found in '%s'\n", ps.n, ps.n == 1 ? "" : "s",
                     path);
    }
    problems_free(&ps);
    qview_free(&q);
    nib_st_close(f);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "nib inspect: writing the listing failed\n");
        return 1;
    }
    return rc;
}
