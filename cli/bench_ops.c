/* bench_ops.c — `nib bench ops`: the lab for the non-attention transformer ops (ops/norm.h,
 * ops/rope.h, ops/act.h, ops/qkv.h) at the Pi0.5 shapes.
 *
 * Each row: median µs per call of one CUDA-graph replay of many calls (nib_lab_time_graph), the
 * bytes the call must move (inputs read once + outputs written once), GB/s, and % of the device
 * copy bandwidth measured in the same run, plus the floor bytes / copy bandwidth. Two modes:
 *   hot   one buffer set reused by every call: the data stays in the 50 MB L2, as in the real
 *         model where these ops read what the previous GEMM just wrote (the relevant number);
 *   cold  buffer sets rotated so that their total exceeds 3x L2 when 64 copies allow it (the
 *         row says whether it did): DRAM-streamed, comparable with the copy bandwidth.
 * Small calls (10 rows) are bound by launch latency and the dependent chain load -> reduce ->
 * store (a few µs), not by bandwidth: their GB/s is not expected to approach the copy rate.
 * Shapes: norms at rows x dims (default rows 10,50,532,1024; dims 1024,1152,2048); RoPE over
 * the 8 q + 1 k heads of 256 inside the 2560-wide fused QKV row; GeGLU/SwiGLU at H = 4096
 * (Gemma-300M), 4304 (SigLIP fc1) and 16384 (Gemma-2B); the fused QKV epilogue for Gemma (8 + 1 + 1 heads of 256)
 * at T = 10 and 532 for each cache dtype.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "cli/cli.h"
#include "formats/formats.h"
#include "ops/act.h"
#include "ops/kvcache.h"
#include "ops/norm.h"
#include "ops/qkv.h"
#include "ops/rope.h"
#include "runtime/device.h"
#include "runtime/timing.h"

#define MAX_LIST 16
#define MAX_COPIES 64
#define QKV_W 2560 /* Gemma fused QKV row: (8 + 1 + 1) x 256 */
#define HD 256

typedef enum { F_NORM, F_ROPE, F_ACT, F_QKV } family;

typedef struct op_desc {
    const char *name;
    family fam;
    nib_norm_kind nk;
    int residual, bf16_out, fp8_out, weight; /* norms: residual in place; outputs; w (and LN b) */
    nib_act_kind ak;
    nib_kv_dtype kv;
} op_desc;

static const op_desc k_ops[] = {
    {"rmsnorm", F_NORM, NIB_NORM_RMS, 0, 1, 0, 0, 0, 0},
    {"rmsnorm+fp8", F_NORM, NIB_NORM_RMS, 0, 0, 1, 0, 0, 0},
    {"rmsnorm+res+fp8", F_NORM, NIB_NORM_RMS, 1, 0, 1, 0, 0, 0},
    {"layernorm+fp8", F_NORM, NIB_NORM_LAYER, 0, 0, 1, 1, 0, 0},
    {"adarms", F_NORM, NIB_NORM_ADARMS, 0, 1, 0, 0, 0, 0},
    {"adarms+res", F_NORM, NIB_NORM_ADARMS, 1, 1, 0, 0, 0, 0},
    {"rope", F_ROPE, NIB_NORM_RMS, 0, 0, 0, 0, 0, 0},
    {"geglu", F_ACT, NIB_NORM_RMS, 0, 0, 0, 0, NIB_ACT_GEGLU_TANH, 0},
    {"swiglu", F_ACT, NIB_NORM_RMS, 0, 0, 0, 0, NIB_ACT_SWIGLU, 0},
    {"geglu+fp8", F_ACT, NIB_NORM_RMS, 0, 0, 1, 0, NIB_ACT_GEGLU_TANH, 0}, /* the W8A8 MLP hand-off */
    {"gelu+fp8", F_ACT, NIB_NORM_RMS, 0, 0, 1, 0, NIB_ACT_GELU_TANH, 0},   /* SigLIP's (ungated) */
    {"qkv-bf16", F_QKV, NIB_NORM_RMS, 0, 0, 0, 0, 0, NIB_KV_BF16},
    {"qkv-fp8", F_QKV, NIB_NORM_RMS, 0, 0, 0, 0, 0, NIB_KV_FP8},
    {"qkv-nvfp4", F_QKV, NIB_NORM_RMS, 0, 0, 0, 0, 0, NIB_KV_NVFP4},
};
#define N_OPS ((int)NIB_ARRAY_LEN(k_ops))

typedef struct bench_cfg {
    int nrows, ndims, nh, nt;
    int64_t rows[MAX_LIST], dims[MAX_LIST], hs[MAX_LIST], tokens[MAX_LIST];
    int enabled[N_OPS];
    int reps;
    const char *json_path;
} bench_cfg;

typedef struct bench_row {
    int op;
    int64_t rows, dim;
    int hot, copies;
    uint64_t bytes, working_set;
    double us, gbps, pct_bw, floor_us;
} bench_row;

/* one copy of a call's buffers */
typedef struct bset {
    void *x, *r, *y, *q, *cache;
    uint8_t *yq;
    float *ys;
    nib_kv_layer kv;
} bset;

typedef struct bctx {
    const op_desc *op;
    int64_t rows, dim; /* dim: norm dim, act H; rope/qkv fixed */
    int ncopies;
    bset s[MAX_COPIES];
    size_t bx, br, by, bq, byq, bys, bcache; /* bytes of each buffer of a set */
    float *w, *b;                            /* [dim] fp32 parameters (shared) */
    int32_t *nvalid, *pos;
    float *invf;
} bctx;

static nib_status bench_call(void *c, int i, void *stream) {
    bctx *b = (bctx *)c;
    bset *s = &b->s[i % b->ncopies];
    const op_desc *o = b->op;
    switch (o->fam) {
    case F_NORM: {
        nib_norm_args a;
        memset(&a, 0, sizeof a);
        a.kind = o->nk;
        a.rows = b->rows;
        a.dim = b->dim;
        a.n_valid = b->nvalid;
        a.eps = NIB_NORM_EPS;
        a.x = s->x;
        a.ldx = b->dim;
        if (o->residual) {
            a.residual = s->r;
            a.ldr = b->dim;
        }
        if (o->nk == NIB_NORM_ADARMS) {
            a.scale = b->w;
            a.shift = b->b;
        } else if (o->weight) {
            a.w = b->w;
            a.b = o->nk == NIB_NORM_LAYER ? b->b : NULL;
        }
        if (o->bf16_out) {
            a.y = s->y;
            a.ldy = b->dim;
        }
        if (o->fp8_out) {
            a.y_q = s->yq;
            a.ldq = b->dim;
            a.y_scale = s->ys;
        }
        return nib_cuda_norm(&a, stream);
    }
    case F_ROPE: {
        nib_rope_args a;
        memset(&a, 0, sizeof a);
        a.style = NIB_ROPE_HALF;
        a.tokens = b->rows;
        a.n_valid = b->nvalid;
        a.n_heads = 9; /* q and k of the fused row */
        a.head_dim = HD;
        a.rot_dim = HD;
        a.positions = b->pos;
        a.inv_freq = b->invf;
        a.x = s->x;
        a.ld = QKV_W;
        return nib_cuda_rope(&a, stream);
    }
    case F_ACT: {
        const int64_t ldx = o->ak == NIB_ACT_GELU_TANH ? b->dim : 2 * b->dim;
        nib_act_args a = {o->ak, b->rows, b->nvalid, b->dim, s->x, ldx, NULL, 0, NULL, 0, NULL};
        if (o->fp8_out) a.y_q = s->yq, a.ldq = b->dim, a.y_scale = s->ys; /* codes only, as the MLP */
        else a.y = s->y, a.ldy = b->dim;
        return nib_cuda_act(&a, stream);
    }
    default: {
        nib_qkv_args a;
        memset(&a, 0, sizeof a);
        a.tokens = b->rows;
        a.n_valid = b->nvalid;
        a.n_heads = 8;
        a.n_kv_heads = 1;
        a.head_dim = HD;
        a.qkv = s->x;
        a.ld_qkv = QKV_W;
        a.positions = b->pos;
        a.inv_freq = b->invf;
        a.q_scale = 0.0625f;
        a.q = s->q;
        a.ld_q = 8 * HD;
        a.cache = &s->kv;
        return nib_cuda_qkv(&a, stream);
    }
    }
}

/* Bytes one call must move: inputs read once + outputs written once. */
static uint64_t call_bytes(const bctx *b) {
    const op_desc *o = b->op;
    const uint64_t R = (uint64_t)b->rows, D = (uint64_t)b->dim;
    switch (o->fam) {
    case F_NORM: {
        uint64_t n = R * D * 2;                  /* x */
        if (o->residual) n += 2 * R * D * 2;     /* residual read, h written */
        if (o->bf16_out) n += R * D * 2;         /* y */
        if (o->fp8_out) n += R * D + R * 4;      /* codes + scales */
        if (o->nk == NIB_NORM_ADARMS) n += 2 * D * 4;
        else if (o->weight) n += (o->nk == NIB_NORM_LAYER ? 2 : 1) * D * 4;
        return n;
    }
    case F_ROPE: return 2 * R * 9 * HD * 2 + R * 4 + HD / 2 * 4;
    case F_ACT: return R * (o->ak == NIB_ACT_GELU_TANH ? 1 : 2) * D * 2 + (o->fp8_out ? R * D + R * 4 : R * D * 2);
    default: {
        uint64_t kv = o->kv == NIB_KV_BF16 ? HD * 2 : o->kv == NIB_KV_FP8 ? HD + 4 : HD / 2 + HD / 16 + 4;
        return R * QKV_W * 2 + R * 4 + HD / 2 * 4 + R * 8 * HD * 2 + 2 * R * kv;
    }
    }
}

static void ctx_free(bctx *b) {
    for (int c = 0; c < MAX_COPIES; c++) {
        bset *s = &b->s[c];
        nib_dev_free(s->x, b->bx);
        nib_dev_free(s->r, b->br);
        nib_dev_free(s->y, b->by);
        nib_dev_free(s->q, b->bq);
        nib_dev_free(s->yq, b->byq);
        nib_dev_free(s->ys, b->bys);
        nib_dev_free(s->cache, b->bcache);
        memset(s, 0, sizeof *s);
    }
    b->ncopies = 0;
}

static nib_status dev_take(void **p, size_t n, const void *init, const char *what) {
    *p = NULL;
    if (!n) return NIB_OK;
    NIB_RETURN_IF_ERR(nib_dev_malloc(p, n, what));
    return init ? nib_dev_upload(*p, init, n) : nib_dev_memset(*p, 0, n);
}

/* Allocates `copies` buffer sets for the op at (rows, dim); inputs from the random host pool. */
static nib_status ctx_setup(bctx *b, int copies, const uint16_t *pool) {
    const op_desc *o = b->op;
    const size_t R = (size_t)b->rows, D = (size_t)b->dim;
    b->bx = b->br = b->by = b->bq = b->byq = b->bys = b->bcache = 0;
    switch (o->fam) {
    case F_NORM:
        b->bx = R * D * 2;
        b->br = o->residual ? R * D * 2 : 0;
        b->by = o->bf16_out ? R * D * 2 : 0;
        b->byq = o->fp8_out ? R * D : 0;
        b->bys = o->fp8_out ? R * 4 : 0;
        break;
    case F_ROPE: b->bx = R * QKV_W * 2; break;
    case F_ACT:
        b->bx = R * (o->ak == NIB_ACT_GELU_TANH ? 1 : 2) * D * 2;
        b->by = o->fp8_out ? 0 : R * D * 2;
        b->byq = o->fp8_out ? R * D : 0;
        b->bys = o->fp8_out ? R * 4 : 0;
        break;
    default:
        b->bx = R * QKV_W * 2;
        b->bq = R * 8 * HD * 2;
        b->bcache = (size_t)nib_kv_layer_bytes(o->kv, (int32_t)R, 1, HD);
        break;
    }
    b->ncopies = copies;
    for (int c = 0; c < copies; c++) {
        bset *s = &b->s[c];
        NIB_RETURN_IF_ERR(dev_take(&s->x, b->bx, pool, "bench x"));
        NIB_RETURN_IF_ERR(dev_take(&s->r, b->br, pool, "bench residual"));
        NIB_RETURN_IF_ERR(dev_take(&s->y, b->by, NULL, "bench y"));
        NIB_RETURN_IF_ERR(dev_take(&s->q, b->bq, NULL, "bench q"));
        NIB_RETURN_IF_ERR(dev_take((void **)&s->yq, b->byq, NULL, "bench y_q"));
        NIB_RETURN_IF_ERR(dev_take((void **)&s->ys, b->bys, NULL, "bench y_scale"));
        NIB_RETURN_IF_ERR(dev_take(&s->cache, b->bcache, NULL, "bench kv cache"));
        if (o->fam == F_QKV) NIB_RETURN_IF_ERR(nib_kv_layer_map(&s->kv, o->kv, (int32_t)R, 1, HD, s->cache));
    }
    return NIB_OK;
}

static int parse_list(const char *s, int64_t *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v <= 0 || v > (1 << 20)) return -1;
        out[n++] = v;
        if (*end && *end != ',') return -1;
        s = *end == ',' ? end + 1 : end;
    }
    return *s ? -1 : n;
}

static nib_status write_json(const char *path, const nib_device_info *d, double copy_gbps, const bench_row *rows,
                             int nrows, int argc, char **argv) {
    FILE *f = fopen(path, "w");
    if (!f) return NIB_ERR(NIB_ERR_IO, "cannot write '%s'", path);
    nib_cli_json_head(f, "ops", "nib bench", argc, argv, d);
    fprintf(f, "  \"copy_gbps\": %.1f,\n  \"timing\": \"median over reps of CUDA-graph replay time / calls; hot = one "
               "buffer set (L2-resident, as in the model), cold = buffer sets rotated over > 3x L2 when 64 copies "
               "allow (exceeds_l2 says); bytes = inputs read once + outputs written once; floor_us = bytes / "
               "copy_gbps\",\n  \"rows\": [\n",
            copy_gbps);
    for (int i = 0; i < nrows; i++) {
        const bench_row *r = &rows[i];
        fprintf(f,
                "    {\"op\": \"%s\", \"rows\": %lld, \"dim\": %lld, \"mode\": \"%s\", \"copies\": %d, "
                "\"working_set_bytes\": %llu, \"exceeds_l2\": %s, \"bytes\": %llu, \"us\": %.3f, \"gbps\": %.1f, "
                "\"pct_copy_bw\": %.1f, \"floor_us\": %.3f}%s\n",
                k_ops[r->op].name, (long long)r->rows, (long long)r->dim, r->hot ? "hot" : "cold", r->copies,
                (unsigned long long)r->working_set, r->working_set > (uint64_t)d->l2_bytes ? "true" : "false",
                (unsigned long long)r->bytes, r->us, r->gbps, r->pct_bw, r->floor_us, i + 1 < nrows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f)) return NIB_ERR(NIB_ERR_IO, "error writing '%s'", path);
    return NIB_OK;
}

/* Times one op at one shape in both modes; appends rows. */
static nib_status bench_shape(const bench_cfg *cfg, int op, int64_t rows, int64_t dim, bctx *b, const uint16_t *pool,
                              double copy_gbps, int l2_bytes, bench_row *out, int *nout, int max_out) {
    nib_status st = NIB_OK;
    b->op = &k_ops[op];
    b->rows = rows;
    b->dim = dim;
    for (int hot = 1; hot >= 0 && !st; hot--) {
        if (*nout >= max_out) break;
        const uint64_t bytes = call_bytes(b);
        int copies = 1;
        if (!hot) {
            uint64_t c = (3ull * (uint64_t)l2_bytes + bytes - 1) / bytes;
            copies = c < 2 ? 2 : c > MAX_COPIES ? MAX_COPIES : (int)c;
        }
        st = ctx_setup(b, copies, pool);
        if (!st) {
            nib_lab_timing tm;
            const int calls = copies * ((32 + copies - 1) / copies); /* >= 32 calls, whole rotations */
            st = nib_lab_time_graph(bench_call, b, calls, cfg->reps, &tm);
            if (!st) {
                bench_row *r = &out[(*nout)++];
                memset(r, 0, sizeof *r);
                r->op = op;
                r->rows = rows;
                r->dim = dim;
                r->hot = hot;
                r->copies = copies;
                r->bytes = bytes;
                r->working_set = bytes * (uint64_t)copies;
                r->us = tm.median_us;
                r->gbps = (double)bytes / (tm.median_us * 1e3);
                r->pct_bw = 100.0 * r->gbps / copy_gbps;
                r->floor_us = (double)bytes / (copy_gbps * 1e3);
                printf("%-16s %5lld %6lld  %-4s %3d %8.2f %9.2f %8.2f %7.0f %6.1f%%\n", k_ops[op].name, (long long)rows,
                       (long long)dim, hot ? "hot" : "cold", copies, (double)bytes / 1e6, r->floor_us, r->us, r->gbps,
                       r->pct_bw);
            }
        }
        ctx_free(b);
    }
    if (st) nib_error_context(st, "bench ops: %s rows %lld dim %lld", k_ops[op].name, (long long)rows, (long long)dim);
    return st;
}

int nib_bench_ops(int argc, char **argv) {
    bench_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.nrows = parse_list("10,50,532,1024", cfg.rows, MAX_LIST);
    cfg.ndims = parse_list("1024,1152,2048", cfg.dims, MAX_LIST);
    cfg.nh = parse_list("4096,4304,16384", cfg.hs, MAX_LIST);
    cfg.nt = parse_list("10,532", cfg.tokens, MAX_LIST);
    for (int i = 0; i < N_OPS; i++) cfg.enabled[i] = 1;
    cfg.reps = 15;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (nib_cli_is_help(a)) {
            printf("usage: nib bench ops [--rows LIST] [--dims LIST] [--hidden LIST] [--tokens LIST] [--ops LIST]\n"
                   "                     [--reps N] [--json FILE]\n"
                   "The lab for norms (rmsnorm, rmsnorm+fp8, rmsnorm+res+fp8, layernorm+fp8, adarms, adarms+res),\n"
                   "rope (8 q + 1 k heads of 256 in the fused QKV row), geglu / swiglu (H = --hidden), geglu+fp8 /\n"
                   "gelu+fp8 (FP8 codes + row scales only, the W8A8 MLP's hand-off; gelu+fp8 is SigLIP's), and the\n"
                   "fused QKV epilogue (qkv-bf16, qkv-fp8, qkv-nvfp4: Gemma 8 + 1 + 1 heads of 256, T = --tokens).\n"
                   "Defaults: rows 10,50,532,1024; dims 1024,1152,2048; hidden 4096,4304,16384; tokens 10,532.\n"
                   "Each row: bytes moved (inputs once + outputs once), the floor bytes / copy bandwidth, the median\n"
                   "µs per call (CUDA-graph replay), GB/s and %% of the copy bandwidth; 'hot' reuses one buffer set\n"
                   "(L2-resident, as in the model), 'cold' rotates sets over > 3x L2 (DRAM).\n");
            return 0;
        } else if ((!strcmp(a, "--rows") || !strcmp(a, "--dims") || !strcmp(a, "--hidden") || !strcmp(a, "--tokens")) &&
                   val) {
            int64_t *dst = !strcmp(a, "--rows") ? cfg.rows : !strcmp(a, "--dims") ? cfg.dims
                                                          : !strcmp(a, "--hidden") ? cfg.hs : cfg.tokens;
            int n = parse_list(val, dst, MAX_LIST);
            if (n <= 0) {
                fprintf(stderr, "nib bench ops: %s wants N[,N...] (positive), got '%s'\n", a, val);
                return 2;
            }
            if (!strcmp(a, "--rows")) cfg.nrows = n;
            else if (!strcmp(a, "--dims")) cfg.ndims = n;
            else if (!strcmp(a, "--hidden")) cfg.nh = n;
            else cfg.nt = n;
            i++;
        } else if (!strcmp(a, "--ops") && val) {
            memset(cfg.enabled, 0, sizeof cfg.enabled);
            char buf[512];
            snprintf(buf, sizeof buf, "%s", val);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                int found = 0;
                for (int o = 0; o < N_OPS; o++)
                    if (!strcmp(tok, k_ops[o].name)) cfg.enabled[o] = found = 1;
                if (!found) {
                    fprintf(stderr, "nib bench ops: unknown op '%s' (see --help)\n", tok);
                    return 2;
                }
            }
            i++;
        } else if (!strcmp(a, "--reps") && val) {
            if (!nib_cli_int_arg("bench ops", a, val, 3, 100000, &cfg.reps)) return 2;
            i++;
        } else if (!strcmp(a, "--json") && val) {
            cfg.json_path = val;
            i++;
        } else {
            fprintf(stderr, "nib bench ops: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    for (int i = 0; i < cfg.nrows; i++)
        if (cfg.rows[i] > 65536) {
            fprintf(stderr, "nib bench ops: rows %lld > 65536\n", (long long)cfg.rows[i]);
            return 2;
        }
    for (int i = 0; i < cfg.ndims; i++)
        if (cfg.dims[i] % 8 || cfg.dims[i] > NIB_NORM_MAX_DIM) {
            fprintf(stderr, "nib bench ops: dim %lld must be a multiple of 8 up to %d\n", (long long)cfg.dims[i],
                    NIB_NORM_MAX_DIM);
            return 2;
        }
    for (int i = 0; i < cfg.nh; i++)
        if (cfg.hs[i] % 8) {
            fprintf(stderr, "nib bench ops: hidden %lld must be a multiple of 8\n", (long long)cfg.hs[i]);
            return 2;
        }

    nib_device_info d;
    nib_status st = nib_device_require(&d);
    if (st) return nib_cli_fail("bench ops", st);
    double copy_gbps = 0;
    st = nib_lab_copy_bandwidth((uint64_t)16 * (uint64_t)d.l2_bytes, &copy_gbps);
    if (st) return nib_cli_fail("bench ops", st);
    printf("device %s (cc %d.%d, %d SMs, L2 %.0f MB); measured copy bandwidth %.0f GB/s (read+write)\n", d.name,
           d.cc_major, d.cc_minor, d.sm_count, d.l2_bytes / 1e6, copy_gbps);
    printf("hot: one buffer set (L2-resident, as in the model); cold: sets rotated over > 3x L2 when 64 copies allow\n");
    printf("%-16s %5s %6s  %-4s %3s %8s %9s %8s %7s %7s\n", "op", "rows", "dim", "mode", "cp", "MB", "floor_us", "us",
           "GB/s", "%copy");

    /* shared inputs: random bf16 pool (largest buffer), parameters, positions, frequencies */
    int64_t max_rows = 1, max_dim = 1, max_h = 1;
    for (int i = 0; i < cfg.nrows; i++) max_rows = cfg.rows[i] > max_rows ? cfg.rows[i] : max_rows;
    for (int i = 0; i < cfg.nt; i++) max_rows = cfg.tokens[i] > max_rows ? cfg.tokens[i] : max_rows;
    for (int i = 0; i < cfg.ndims; i++) max_dim = cfg.dims[i] > max_dim ? cfg.dims[i] : max_dim;
    for (int i = 0; i < cfg.nh; i++) max_h = cfg.hs[i] > max_h ? cfg.hs[i] : max_h;
    int64_t pool_n = max_rows * (2 * max_h > QKV_W ? 2 * max_h : QKV_W);
    if (max_rows * max_dim > pool_n) pool_n = max_rows * max_dim;
    const int max_out = 2 * N_OPS * MAX_LIST * MAX_LIST;
    uint16_t *pool = nib_malloc((size_t)pool_n * 2);
    float *hp = nib_malloc((size_t)(max_dim > HD ? max_dim : HD) * 4);
    int32_t *hpos = nib_malloc((size_t)max_rows * 4);
    bench_row *rows = nib_calloc((size_t)max_out, sizeof *rows);
    bctx *b = nib_calloc(1, sizeof *b);
    int nrows_out = 0;
    const double t0 = nib_now_s();
    if (!pool || !hp || !hpos || !rows || !b) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    {
        nib_rng rng;
        nib_rng_seed(&rng, 0x0b5e55ull);
        for (int64_t i = 0; i < pool_n; i++) pool[i] = nib_f32_to_bf16((float)nib_rng_normal(&rng));
        for (int64_t i = 0; i < max_dim; i++) hp[i] = (float)(0.1 * nib_rng_normal(&rng));
        for (int64_t i = 0; i < max_rows; i++) hpos[i] = (int32_t)i;
        int32_t nv = (int32_t)max_rows;
        NIB_TRY(dev_take((void **)&b->w, (size_t)max_dim * 4, hp, "bench w"));
        NIB_TRY(dev_take((void **)&b->b, (size_t)max_dim * 4, hp, "bench b"));
        NIB_TRY(dev_take((void **)&b->pos, (size_t)max_rows * 4, hpos, "bench positions"));
        NIB_TRY(nib_rope_inv_freq(NIB_ROPE_THETA, HD, hp));
        NIB_TRY(dev_take((void **)&b->invf, HD / 2 * 4, hp, "bench inv_freq"));
        /* n_valid = the largest row count: every call covers all its rows (as the model's
         * calls do), through the device-pointer path the model uses */
        NIB_TRY(dev_take((void **)&b->nvalid, 4, &nv, "bench n_valid"));
    }
    for (int o = 0; o < N_OPS && !st; o++) {
        if (!cfg.enabled[o]) continue;
        switch (k_ops[o].fam) {
        case F_NORM:
            for (int di = 0; di < cfg.ndims && !st; di++)
                for (int ri = 0; ri < cfg.nrows && !st; ri++)
                    st = bench_shape(&cfg, o, cfg.rows[ri], cfg.dims[di], b, pool, copy_gbps, d.l2_bytes, rows,
                                     &nrows_out, max_out);
            break;
        case F_ROPE:
            for (int ri = 0; ri < cfg.nrows && !st; ri++)
                st = bench_shape(&cfg, o, cfg.rows[ri], 9 * HD, b, pool, copy_gbps, d.l2_bytes, rows, &nrows_out,
                                 max_out);
            break;
        case F_ACT:
            for (int hi = 0; hi < cfg.nh && !st; hi++)
                for (int ri = 0; ri < cfg.nrows && !st; ri++)
                    st = bench_shape(&cfg, o, cfg.rows[ri], cfg.hs[hi], b, pool, copy_gbps, d.l2_bytes, rows,
                                     &nrows_out, max_out);
            break;
        default:
            for (int ti = 0; ti < cfg.nt && !st; ti++)
                st = bench_shape(&cfg, o, cfg.tokens[ti], QKV_W, b, pool, copy_gbps, d.l2_bytes, rows, &nrows_out,
                                 max_out);
            break;
        }
    }
    if (!st && cfg.json_path) st = write_json(cfg.json_path, &d, copy_gbps, rows, nrows_out, argc, argv);
    if (!st)
        printf("%d rows in %.1f s%s%s\n", nrows_out, nib_now_s() - t0, cfg.json_path ? ", written to " : "",
               cfg.json_path ? cfg.json_path : "");
fail:
done:
    if (b) {
        ctx_free(b);
        nib_dev_free(b->w, (size_t)max_dim * 4);
        nib_dev_free(b->b, (size_t)max_dim * 4);
        nib_dev_free(b->pos, (size_t)max_rows * 4);
        nib_dev_free(b->invf, HD / 2 * 4);
        nib_dev_free(b->nvalid, 4);
    }
    nib_free(b);
    nib_free(pool);
    nib_free(hp);
    nib_free(hpos);
    nib_free(rows);
    if (st) return nib_cli_fail("bench ops", st);
    return 0;
}
