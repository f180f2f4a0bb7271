/* cmd_bench.c — `nib bench gemm`: the GEMM kernel lab.
 *
 * For each shape (K -> N) and M, in one process: cuBLAS bf16 (the baseline), cuBLASLt fp8
 * (GEMM only, pre-quantized X), nib's FP8 W8A8 (per-token quantize + cuBLASLt), and nib's
 * weight-only kernels (NVFP4, MXFP4, INT4-g128, FP8). Each number is the median over
 * repetitions of one CUDA-graph replay of many calls divided by the calls; the weights rotate
 * over copies totalling more than 3x L2, so every call streams its weights from DRAM.
 * Reported per row: µs, effective GB/s (canonical weight + scale bytes / time), TFLOP/s,
 * speedup over cuBLAS bf16, and % of the measured device copy bandwidth.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "cli/cli.h"
#include "formats/formats.h"
#include "ops/gemm.h"
#include "runtime/device.h"
#include "runtime/timing.h"

#define MAX_SHAPES 32
#define MAX_MS 16
#define MAX_COPIES 64

typedef enum { V_BF16, V_FP8LT, V_W8A8, V_FP8NIB, V_FP8GEGLU, V_NVFP4, V_MXFP4, V_INT4, V_FP8, V_COUNT } variant;
static const char *const k_vname[V_COUNT] = {"cublas-bf16", "cublaslt-fp8", "fp8-w8a8",  "fp8-nib", "fp8-nib-geglu",
                                              "nvfp4",       "mxfp4",        "int4-g128", "fp8-wo"};
/* nib's FP8 product, plain or with the GeGLU epilogue (N = 2H weight rows, Y is M x H) */
static int is_fp8_nib(int v) { return v == V_FP8NIB || v == V_FP8GEGLU; }

typedef struct bench_cfg {
    int nshapes;
    int64_t k[MAX_SHAPES], n[MAX_SHAPES];
    int nm;
    int64_t m[MAX_MS];
    int enabled[V_COUNT];
    int reps;
    int sweep; /* --sweep: also time every launch plan of the low-bit kernels */
    int algos; /* --algos N: also time cuBLASLt's first N heuristic candidates (cuBLAS variants) */
    int lt_configs; /* --lt-configs N: also time up to N configurations cuBLASLt accepts (cuBLAS variants) */
    int lt_search;  /* --lt-search: a coordinate search over cuBLASLt's configurations (cuBLAS variants) */
    int bf16_listed; /* cublas-bf16 was named in --variants (not only run as the baseline) */
    int hot;   /* --hot: one weight copy (L2-resident after the first call) instead of > 3x L2 */
    int inplace; /* --inplace: Y += X W^T in place (cublas-bf16: C = Y; nib's weight-only kernels: the residual) */
    int sms;   /* the device's SM count */
    const char *json_path;
} bench_cfg;

typedef struct bench_row {
    int64_t k, n, m;
    variant v;
    double us, gbps, tflops, speedup, pct_bw;
    uint64_t bytes;
    char plan[64];
    int sweep; /* 1: a plan-sweep row (not the planner's choice); 2: the planner's choice in a sweep */
} bench_row;

typedef struct gemm_ctx {
    variant v;
    int ncopies;
    nib_qweight w[MAX_COPIES];
    void *bw[MAX_COPIES]; /* bf16 or e4m3 weight copies for the cuBLAS variants */
    float *sw;            /* fp8 per-channel weight scales */
    void *x, *xq, *y;
    float *sx;
    int64_t m, n, k;
    nib_blas *blas;
    nib_gemm_ws *ws;
    const nib_gemm_plan *plan; /* NULL: the planner's choice */
    const nib_fp8_tile *tile;  /* fp8-nib: NULL for the planner's tile */
    int inplace;               /* Y += X W^T (cublas-bf16: C = Y, beta 1; nib's: the epilogue's residual) */
} gemm_ctx;

static nib_status gemm_call(void *c, int i, void *stream) {
    gemm_ctx *g = (gemm_ctx *)c;
    int j = i % g->ncopies;
    switch (g->v) {
    case V_BF16:
        if (g->inplace) { /* the model's residual products: C = Y, accumulated in place */
            nib_blas_gemm_args a = {0, g->x, NULL, 0, g->bw[j], NULL, 0, g->m, g->n, g->k, NULL, g->y, g->n, g->y, g->n};
            return nib_blas_gemm_fused(g->blas, &a, stream);
        }
        return nib_blas_gemm_bf16(g->blas, g->x, g->bw[j], g->y, g->m, g->n, g->k, stream);
    case V_FP8LT: /* cuBLASLt's FP8 product, whatever the engine rule says */
        nib_blas_set_fp8_engine(g->blas, NIB_FP8_ENGINE_CUBLASLT);
        return nib_blas_gemm_fp8(g->blas, g->xq, g->sx, 1, g->bw[j], g->sw, 1, g->y, g->m, g->n, g->k, stream);
    case V_W8A8: /* as the model runs it: the quantizer, then the engine the rule picks */
        nib_blas_set_fp8_engine(g->blas, NIB_FP8_ENGINE_AUTO);
        NIB_RETURN_IF_ERR(nib_cuda_quantize_fp8_rows(g->x, g->m, g->k, 1, g->xq, g->sx, stream));
        return nib_blas_gemm_fp8(g->blas, g->xq, g->sx, 1, g->bw[j], g->sw, 1, g->y, g->m, g->n, g->k, stream);
    case V_FP8NIB: {
        nib_blas_gemm_args a = {1, g->xq, g->sx, 1, g->bw[j], g->sw, 1, g->m, g->n, g->k, NULL, NULL, 0, g->y, g->n};
        return nib_cuda_gemm_fp8(&a, g->tile, stream);
    }
    case V_FP8GEGLU: { /* the prefix's gate|up as the model runs it where nib's kernel takes it */
        nib_blas_gemm_args a = {1, g->xq, g->sx, 1, g->bw[j], g->sw, 1, g->m, g->n, g->k, NULL, NULL, 0, g->y, g->n / 2};
        return nib_cuda_gemm_fp8_geglu(&a, g->tile, stream);
    }
    default: {
        /* --inplace: Y += X W^T through the epilogue's residual (y as its own residual), as a decoder's o and down
         * products run */
        const nib_gemm_epi res = {0, NULL, g->y, g->n};
        return nib_cuda_gemm_planned(&g->w[j], g->x, g->m, g->k, g->y, g->n, g->inplace ? &res : NULL, g->ws, g->plan,
                                     stream);
    }
    }
}

static int parse_list(const char *s, int64_t *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v <= 0) return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static int parse_shapes(const char *s, bench_cfg *c) {
    c->nshapes = 0;
    while (*s && c->nshapes < MAX_SHAPES) {
        char *end;
        long long k = strtoll(s, &end, 10);
        if (end == s || (*end != ':' && *end != 'x') || k <= 0) return -1;
        s = end + 1;
        long long n = strtoll(s, &end, 10);
        if (end == s || n <= 0) return -1;
        c->k[c->nshapes] = k;
        c->n[c->nshapes] = n;
        c->nshapes++;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return c->nshapes;
}

/* Random canonical planes for a format (valid scales, random elements: never zeros). */
static nib_status make_random_wsrc(nib_rng *r, nib_wfmt f, int64_t n, int64_t k, nib_wsrc *w, void **bufs) {
    memset(w, 0, sizeof *w);
    w->fmt = f;
    w->n = n;
    w->k = k;
    uint64_t nk = (uint64_t)n * k;
    uint64_t eb = f == NIB_WFMT_FP8 ? nk : nk / 2, sb = 0;
    switch (f) {
    case NIB_WFMT_NVFP4: sb = nk / 16; break;
    case NIB_WFMT_MXFP4: sb = nk / 32; break;
    case NIB_WFMT_INT4: sb = nk / 128 * 2; break;
    default: sb = (uint64_t)n * 4; break;
    }
    uint8_t *e = nib_malloc(eb), *s = nib_malloc(sb);
    bufs[0] = e;
    bufs[1] = s;
    if (!e || !s) return NIB_ERR_OUT_OF_MEMORY;
    for (uint64_t i = 0; i < eb; i += 8) {
        uint64_t v = nib_rng_u64(r);
        for (int b = 0; b < 8 && i + b < eb; b++) {
            uint8_t x = (uint8_t)(v >> (8 * b));
            if (f == NIB_WFMT_FP8 && (x & 0x7F) == 0x7F) x ^= 0x08; /* no NaN codes */
            e[i + b] = x;
        }
    }
    for (uint64_t i = 0; i < sb; i++) {
        switch (f) {
        case NIB_WFMT_NVFP4: s[i] = (uint8_t)(0x28 + nib_rng_below(r, 24)); break; /* e4m3 ~0.25..2 */
        case NIB_WFMT_MXFP4: s[i] = (uint8_t)(118 + nib_rng_below(r, 8)); break;
        case NIB_WFMT_INT4:
            if (i % 2 == 0) {
                uint16_t h = (uint16_t)(0x2000 + nib_rng_below(r, 0x400)); /* fp16 ~0.008 */
                memcpy(s + i, &h, 2);
            }
            break;
        default:
            if (i % 4 == 0) {
                float v = 0.001f * (1.0f + (float)nib_rng_uniform(r));
                memcpy(s + i, &v, 4);
            }
            break;
        }
    }
    w->data = e;
    w->scales = s;
    w->global_scale = 1.0f / 2688.0f;
    w->group = 128;
    w->fp8_per_channel = 1;
    return NIB_OK;
}

static double now_wall(void) { return nib_now_s(); }

static void print_row(const bench_row *r) {
    printf("%6lld %6lld %5lld  %-13s %9.2f %8.0f %8.1f %7.2fx %6.1f%%  %s%s\n", (long long)r->k,
           (long long)r->n, (long long)r->m, k_vname[r->v], r->us, r->gbps, r->tflops, r->speedup, r->pct_bw,
           r->sweep == 1 ? "  sweep " : "", r->plan);
}

static void plan_str(const nib_gemm_plan *pl, char *buf, size_t n) {
    if (pl->wgt) {
        snprintf(buf, n, "wgmma 128x%d ks%d cm%d ctas%d%s", pl->wgt, pl->ksplit, pl->wgc, pl->ctas, pl->wkcl ? " kcl" : "");
        return;
    }
    snprintf(buf, n, "mt%d r%d wk%d ks%d occ%d ctas%d%s", pl->mt, pl->r, pl->wk, pl->ksplit, pl->occ, pl->ctas,
             pl->reg == 2 ? " bulkw" : pl->reg ? " regw" : "");
}

/* One timed row of variant g->v at g->m (g->plan: the plan, or NULL for the planner's). */
static nib_status time_row(gemm_ctx *g, int reps, uint64_t canon_bytes, double copy_gbps, double bf16_us,
                           bench_row *row) {
    const int calls = g->ncopies * ((20 + g->ncopies - 1) / g->ncopies); /* >= 20 calls, whole rotations */
    nib_lab_timing tm;
    NIB_RETURN_IF_ERR(nib_lab_time_graph(gemm_call, g, calls, reps, &tm));
    memset(row, 0, sizeof *row);
    row->k = g->k;
    row->n = g->n;
    row->m = g->m;
    row->v = g->v;
    row->us = tm.median_us;
    row->bytes = canon_bytes;
    row->gbps = (double)canon_bytes / (tm.median_us * 1e3);
    row->tflops = 2.0 * (double)g->m * g->n * g->k / (tm.median_us * 1e6);
    row->pct_bw = 100.0 * row->gbps / copy_gbps;
    /* against cuBLAS bf16's default at this shape and M (the bf16 row itself: 1.0) */
    row->speedup = (isnan(bf16_us) ? tm.median_us : bf16_us) / tm.median_us;
    return NIB_OK;
}

static void algo_str(const nib_blas_algo_desc *d, int i, char *buf, size_t n) {
    snprintf(buf, n, "algo%d b%d id%d tile%d st%d sk%d red%d sw%d cu%d cl%d w%.2f", i, d->base, d->id, d->tile, d->stages,
             d->splitk, d->reduction, d->swizzle, d->custom, d->cluster, d->waves);
}

/* --algos: the default row (cuBLASLt's first candidate, already timed in *row) labelled with its
 * configuration, then each further candidate the heuristic offers, timed the same way. */
static nib_status bench_algos(const bench_cfg *cfg, gemm_ctx *g, uint64_t canon_bytes, double copy_gbps,
                              double bf16_us, bench_row *row, bench_row *rows, int *nrows, int max_rows) {
    nib_blas_algo_desc ds[32];
    int nd = 0;
    const int fp8 = g->v != V_BF16;
    NIB_RETURN_IF_ERR(nib_blas_algos(g->blas, fp8, g->m, g->n, g->k, g->sx, g->sw, ds, cfg->algos, &nd));
    if (nd > 0) algo_str(&ds[0], 0, row->plan, sizeof row->plan);
    row->sweep = 2;
    print_row(row);
    double best = row->us;
    int best_i = 0;
    nib_status st = NIB_OK;
    for (int i = 1; i < nd && *nrows < max_rows && !st; i++) {
        nib_blas_set_algo_index(g->blas, i);
        bench_row *ar = &rows[(*nrows)++];
        st = time_row(g, cfg->reps < 5 ? cfg->reps : 5, canon_bytes, copy_gbps, bf16_us, ar);
        if (st == NIB_ERR_UNSUPPORTED || st == NIB_ERR_CUDA) { /* a candidate that fails here is reported, not fatal */
            printf("%6lld %6lld %5lld  %-13s algo%d: %s\n", (long long)g->k, (long long)g->n, (long long)g->m,
                   k_vname[g->v], i, nib_last_error());
            nib_clear_error();
            (*nrows)--;
            st = NIB_OK;
            continue;
        }
        if (st) break;
        algo_str(&ds[i], i, ar->plan, sizeof ar->plan);
        ar->sweep = 1;
        print_row(ar);
        if (ar->us < best) {
            best = ar->us;
            best_i = i;
        }
    }
    nib_blas_set_algo_index(g->blas, 0);
    if (!st)
        printf("%6lld %6lld %5lld  %-13s best of %d candidates: algo%d %.2f us (cuBLASLt's first %.2f us, %.2fx)\n",
               (long long)g->k, (long long)g->n, (long long)g->m, k_vname[g->v], nd, best_i, best, row->us,
               row->us / best);
    return st;
}

/* --lt-configs / --lt-search: the default row (already timed) labelled with what it ran: nib's
 * reconfiguration where ops/gemm_plan.c has one, else cuBLASLt's heuristic */
static void lt_default_row(const bench_cfg *cfg, const gemm_ctx *g, bench_row *row) {
    row->sweep = 2;
    nib_blas_tune tn;
    if (nib_blas_tune_on() && nib_blas_tune_for(g->v != V_BF16, g->m, g->n, g->k, cfg->sms, &tn))
        snprintf(row->plan, sizeof row->plan, "nib's reconfiguration: b%d tile%d cu%d cl%d sw%d sk%d", tn.base, tn.tile,
                 tn.custom, tn.cluster, tn.swizzle, tn.splitk);
    else
        snprintf(row->plan, sizeof row->plan, "heuristic");
    print_row(row);
}

/* --lt-configs: every configuration cuBLASLt accepts for this product (up to cfg->lt_configs),
 * timed like the heuristic's candidates; the best ten are listed at the end */
static nib_status bench_lt_configs(const bench_cfg *cfg, gemm_ctx *g, uint64_t canon_bytes, double copy_gbps,
                                   double bf16_us, bench_row *row, bench_row *rows, int *nrows, int max_rows) {
    nib_blas_algo_desc *ds = nib_calloc((size_t)cfg->lt_configs, sizeof *ds);
    if (!ds) return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "bench: %d config slots", cfg->lt_configs);
    int nd = 0;
    const int fp8 = g->v != V_BF16;
    nib_status st = nib_blas_configs(g->blas, fp8, g->m, g->n, g->k, g->sx, g->sw, ds, cfg->lt_configs, &nd);
    lt_default_row(cfg, g, row);
    printf("%6lld %6lld %5lld  %-13s %d configurations accepted by cuBLASLt\n", (long long)g->k, (long long)g->n,
           (long long)g->m, k_vname[g->v], nd);
    const int first = *nrows;
    for (int i = 0; i < nd && *nrows < max_rows && !st; i++) {
        nib_blas_set_algo_config(g->blas, &ds[i]);
        bench_row *ar = &rows[(*nrows)++];
        st = time_row(g, 3, canon_bytes, copy_gbps, bf16_us, ar);
        if (st == NIB_ERR_UNSUPPORTED || st == NIB_ERR_CUDA) { /* refused at run time: skipped, not fatal */
            nib_clear_error();
            (*nrows)--;
            st = NIB_OK;
            continue;
        }
        if (st) break;
        algo_str(&ds[i], i, ar->plan, sizeof ar->plan);
        ar->sweep = 1;
    }
    nib_blas_set_algo_config(g->blas, NULL);
    nib_free(ds);
    if (st) return st;
    /* the ten fastest, printed (all rows go to the JSON) */
    for (int r = 0; r < 10; r++) {
        int best = -1;
        for (int i = first; i < *nrows; i++)
            if (rows[i].sweep == 1 && (best < 0 || rows[i].us < rows[best].us)) best = i;
        if (best < 0) break;
        rows[best].sweep = 3; /* printed (without the sweep mark); restored below */
        print_row(&rows[best]);
    }
    for (int i = first; i < *nrows; i++)
        if (rows[i].sweep == 3) rows[i].sweep = 1;
    return NIB_OK;
}

/* --lt-search: from each of the heuristic's first 8 candidates, a coordinate search over the
 * configurations cuBLASLt accepts: one field at a time (tile, cluster shape, custom option, CTA
 * swizzle, split-K with its reduction), every value of that field with the others at the best so
 * far, timed (5 reps each), the fastest kept when it is at least 1 % faster; two passes over the
 * fields. Unlike --lt-configs, whose budget runs out inside the first tiles of a candidate with
 * many custom options, every field's whole range is tried. */
static nib_status lt_try(gemm_ctx *g, const nib_blas_algo_desc *d, uint64_t canon_bytes, double copy_gbps,
                         double bf16_us, bench_row *rows, int *nrows, int max_rows, double *us) {
    *us = INFINITY;
    if (*nrows >= max_rows) return NIB_OK;
    nib_blas_algo_desc c = *d;
    const int fp8 = g->v != V_BF16;
    nib_status st = nib_blas_config_check(g->blas, fp8, g->m, g->n, g->k, g->sx, g->sw, &c);
    if (st == NIB_ERR_UNSUPPORTED) { /* refused: not a configuration */
        nib_clear_error();
        return NIB_OK;
    }
    NIB_RETURN_IF_ERR(st);
    nib_blas_set_algo_config(g->blas, &c);
    bench_row *ar = &rows[(*nrows)++];
    st = time_row(g, 5, canon_bytes, copy_gbps, bf16_us, ar);
    nib_blas_set_algo_config(g->blas, NULL);
    if (st == NIB_ERR_UNSUPPORTED || st == NIB_ERR_CUDA) { /* refused at run time: skipped, not fatal */
        nib_clear_error();
        (*nrows)--;
        return NIB_OK;
    }
    NIB_RETURN_IF_ERR(st);
    algo_str(&c, c.base, ar->plan, sizeof ar->plan);
    ar->sweep = 1;
    *us = ar->us;
    return NIB_OK;
}

static nib_status bench_lt_search(const bench_cfg *cfg, gemm_ctx *g, uint64_t canon_bytes, double copy_gbps,
                                  double bf16_us, bench_row *row, bench_row *rows, int *nrows, int max_rows) {
    nib_blas_algo_desc hs[8];
    int nh = 0;
    const int fp8 = g->v != V_BF16;
    NIB_RETURN_IF_ERR(nib_blas_algos(g->blas, fp8, g->m, g->n, g->k, g->sx, g->sw, hs, 8, &nh));
    lt_default_row(cfg, g, row);
    /* cluster shapes: auto, 1x1, 2x1, 1x2, 2x2, 4x1, 1x4, 4x2, 2x4 (CUBLASLT_CLUSTER_SHAPE_* ids) */
    static const int clusters[] = {0, 2, 3, 5, 6, 4, 8, 7, 9};
    enum { F_TILE, F_CLUSTER, F_CUSTOM, F_SWIZZLE, F_SPLIT, F_COUNT };
    nib_blas_algo_desc best_all;
    double best_all_us = INFINITY;
    int timed = 0;
    for (int bi = 0; bi < nh; bi++) {
        nib_blas_algo_desc cur = hs[bi];
        cur.base = bi;
        double cur_us;
        const int n0 = *nrows;
        int tiles[1024], ntl = 0;
        NIB_RETURN_IF_ERR(nib_blas_config_tiles(g->blas, fp8, g->m, g->n, g->k, g->sx, g->sw, bi, tiles, 1024, &ntl));
        NIB_RETURN_IF_ERR(lt_try(g, &cur, canon_bytes, copy_gbps, bf16_us, rows, nrows, max_rows, &cur_us));
        const double start_us = cur_us;
        if (isinf(cur_us)) { /* refused as offered: say what was offered */
            char buf[96];
            algo_str(&cur, bi, buf, sizeof buf);
            printf("%6lld %6lld %5lld  %-13s candidate %d as offered (%s): %s\n", (long long)g->k, (long long)g->n,
                   (long long)g->m, k_vname[g->v], bi, buf, "refused by cublasLtMatmulAlgoCheck");
        }
        for (int pass = 0; pass < 2; pass++)
            for (int f = 0; f < F_COUNT; f++) {
                nib_blas_algo_desc best = cur;
                double best_us = cur_us;
                const int nv = f == F_TILE ? ntl : f == F_CLUSTER ? (int)(sizeof clusters / sizeof clusters[0])
                               : f == F_CUSTOM ? 16 : f == F_SWIZZLE ? 2 : 7;
                for (int vi = 0; vi < nv; vi++) {
                    nib_blas_algo_desc d = cur;
                    switch (f) {
                    case F_TILE: d.tile = tiles[vi]; break;
                    case F_CLUSTER: d.cluster = clusters[vi]; break;
                    case F_CUSTOM: d.custom = vi; break;
                    case F_SWIZZLE: d.swizzle = vi; break;
                    default: /* 1; 2, 3, 4 with the compute-type reduction; 2, 3, 4 in place */
                        d.splitk = vi == 0 ? 1 : 2 + (vi - 1) % 3;
                        d.reduction = vi == 0 ? 0 : vi <= 3 ? 2 /* COMPUTE_TYPE */ : 1 /* INPLACE */;
                        break;
                    }
                    if (d.tile == cur.tile && d.cluster == cur.cluster && d.custom == cur.custom &&
                        d.swizzle == cur.swizzle && d.splitk == cur.splitk && d.reduction == cur.reduction)
                        continue;
                    double us;
                    NIB_RETURN_IF_ERR(lt_try(g, &d, canon_bytes, copy_gbps, bf16_us, rows, nrows, max_rows, &us));
                    if (us < best_us * 0.99) {
                        best_us = us;
                        best = d;
                    }
                }
                cur = best;
                cur_us = best_us;
            }
        timed += *nrows - n0;
        char buf[96];
        algo_str(&cur, bi, buf, sizeof buf);
        printf("%6lld %6lld %5lld  %-13s candidate %d: %.2f us as offered, %.2f us as %s\n", (long long)g->k,
               (long long)g->n, (long long)g->m, k_vname[g->v], bi, start_us, cur_us, buf);
        if (cur_us < best_all_us) {
            best_all_us = cur_us;
            best_all = cur;
        }
    }
    if (best_all_us < INFINITY) {
        char buf[96];
        algo_str(&best_all, best_all.base, buf, sizeof buf);
        printf("%6lld %6lld %5lld  %-13s search: %d configurations timed; best %.2f us (%s) against the default row's "
               "%.2f us (%.2fx)\n",
               (long long)g->k, (long long)g->n, (long long)g->m, k_vname[g->v], timed, best_all_us, buf, row->us,
               row->us / best_all_us);
    }
    return NIB_OK;
}

/* --sweep for fp8-nib (fp8-nib-geglu: the tiles that can run GeGLU): every compiled tile, next to the planner's
 * (already timed in *row) */
static nib_status sweep_fp8_tiles(const bench_cfg *cfg, gemm_ctx *g, uint64_t canon_bytes, double copy_gbps,
                                  double bf16_us, const bench_row *row, bench_row *rows, int *nrows, int max_rows) {
    nib_fp8_tile tiles[64], pick;
    const int nt = nib_fp8_tiles(tiles, 64);
    const int geglu = g->v == V_FP8GEGLU;
    const char *pp = getenv("NIB_FP8_PP");
    if (geglu && pp && *pp && strcmp(pp, "0"))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "bench gemm --sweep: fp8-nib-geglu's tiles cannot be swept under NIB_FP8_PP=%s "
                       "(the ping-pong kernel has its own tile); unset it or set it to 0", pp);
    NIB_RETURN_IF_ERR(nib_cuda_fp8_plan(g->m, g->n, g->k, geglu, &pick));
    double best = row->us;
    char best_plan[64];
    snprintf(best_plan, sizeof best_plan, "%s", row->plan);
    for (int i = 0; i < nt && *nrows < max_rows; i++) {
        if (tiles[i].wg == pick.wg && tiles[i].bn == pick.bn && tiles[i].stages == pick.stages && tiles[i].ks == pick.ks &&
            tiles[i].cm == pick.cm)
            continue;
        if (geglu && !nib_fp8_tile_geglu(&tiles[i])) continue;
        g->tile = &tiles[i];
        bench_row *sr = &rows[(*nrows)++];
        nib_status st = time_row(g, cfg->reps < 5 ? cfg->reps : 5, canon_bytes, copy_gbps, bf16_us, sr);
        g->tile = NULL;
        NIB_RETURN_IF_ERR(st);
        int slots = 0;
        NIB_RETURN_IF_ERR(nib_cuda_fp8_tile_slots(&tiles[i], &slots));
        snprintf(sr->plan, sizeof sr->plan, "tile %dx%d st%d ks%d cm%d (%d resident)", 64 * tiles[i].wg, tiles[i].bn,
                 tiles[i].stages, tiles[i].ks, tiles[i].cm, slots);
        sr->sweep = 1;
        print_row(sr);
        if (sr->us < best) {
            best = sr->us;
            snprintf(best_plan, sizeof best_plan, "%s", sr->plan);
        }
    }
    printf("%6lld %6lld %5lld  %-13s best tile %s: %.2f us (planner's %.2f us, %.2fx)\n", (long long)g->k,
           (long long)g->n, (long long)g->m, k_vname[g->v], best_plan, best, row->us, row->us / best);
    return NIB_OK;
}

/* One variant of one shape: weights (rotated copies), then every M. */
static nib_status bench_variant(const bench_cfg *cfg, variant v, gemm_ctx *g, nib_rng *r, double copy_gbps,
                                int l2_bytes, double *bf16_us, bench_row *rows, int *nrows, int max_rows) {
    nib_status st = NIB_OK;
    const int64_t k = g->k, n = g->n;
    nib_dev_arena arena;
    memset(&arena, 0, sizeof arena);
    void *hbufs[2] = {NULL, NULL};
    g->v = v;
    /* weight copies: enough to exceed 3x L2 so no call finds its weights in cache */
    uint64_t one = 0;
    nib_wfmt f = v == V_NVFP4 ? NIB_WFMT_NVFP4 : v == V_MXFP4 ? NIB_WFMT_MXFP4 : v == V_INT4 ? NIB_WFMT_INT4
                                                                                          : NIB_WFMT_FP8;
    nib_wsrc src;
    if (v == V_BF16) one = (uint64_t)n * k * 2;
    else if (v == V_FP8LT || v == V_W8A8 || is_fp8_nib(v)) one = (uint64_t)n * k;
    else {
        NIB_TRY(make_random_wsrc(r, f, n, k, &src, hbufs));
        NIB_TRY(nib_cuda_weight_bytes(&src, 0, &one));
    }
    int copies = (int)((3ull * (uint64_t)l2_bytes + one - 1) / one);
    if (copies < 2) copies = 2;
    if (cfg->hot) copies = 1; /* --hot: one copy, left in L2 by the previous call */
    if (copies > MAX_COPIES) copies = MAX_COPIES;
    g->ncopies = copies;
    NIB_TRY(nib_dev_arena_init(&arena, (size_t)(one + 4096) * copies + (size_t)n * 4 + 4096, "bench weights"));
    uint64_t canon_bytes = 0;
    if (v == V_BF16 || v == V_FP8LT || v == V_W8A8 || is_fp8_nib(v)) {
        /* random bf16 / e4m3 matrices filled on the host once, copied on the device */
        size_t eb = v == V_BF16 ? 2 : 1;
        uint8_t *hw = nib_malloc((size_t)n * k * eb);
        if (!hw) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        for (int64_t i = 0; i < n * k; i++) {
            if (eb == 2) ((uint16_t *)hw)[i] = nib_f32_to_bf16((float)(0.02 * nib_rng_normal(r)));
            else hw[i] = nib_f32_to_e4m3((float)(16.0 * nib_rng_normal(r)));
        }
        for (int c = 0; c < copies && !st; c++) {
            st = nib_dev_arena_alloc(&arena, (size_t)n * k * eb, &g->bw[c], "bench weight");
            if (!st) st = nib_dev_upload(g->bw[c], hw, (size_t)n * k * eb);
        }
        nib_free(hw);
        if (st) goto fail;
        if (v != V_BF16) {
            float *hs = nib_malloc((size_t)n * 4);
            if (!hs) {
                st = NIB_ERR_OUT_OF_MEMORY;
                goto fail;
            }
            for (int64_t i = 0; i < n; i++) hs[i] = 0.02f / 16.0f;
            st = nib_dev_arena_alloc(&arena, (size_t)n * 4, (void **)&g->sw, "bench sw");
            if (!st) st = nib_dev_upload(g->sw, hs, (size_t)n * 4);
            nib_free(hs);
            if (st) goto fail;
        }
        canon_bytes = (uint64_t)n * k * eb + (v == V_BF16 ? 0 : (uint64_t)n * 4);
    } else {
        NIB_TRY(nib_cuda_weight_load(&src, 0, k_vname[v], &arena, &g->w[0]));
        for (int c = 1; c < copies; c++) {
            g->w[c] = g->w[0];
            NIB_TRY(nib_dev_arena_alloc(&arena, g->w[0].w_bytes, &g->w[c].w, "bench weight copy"));
            NIB_TRY(nib_dev_arena_alloc(&arena, g->w[0].s_bytes ? g->w[0].s_bytes : 1, &g->w[c].s, "bench scale copy"));
            if (!g->w[0].s_bytes) g->w[c].s = NULL;
            NIB_TRY(nib_dev_copy(g->w[c].w, g->w[0].w, g->w[0].w_bytes));
            if (g->w[0].s_bytes) NIB_TRY(nib_dev_copy(g->w[c].s, g->w[0].s, g->w[0].s_bytes));
        }
        canon_bytes = g->w[0].src_bytes;
        nib_free(hbufs[0]);
        nib_free(hbufs[1]);
        hbufs[0] = hbufs[1] = NULL;
    }
    for (int mi = 0; mi < cfg->nm; mi++) {
        if (*nrows >= max_rows) break;
        g->m = cfg->m[mi];
        g->plan = NULL;
        bench_row *row = &rows[(*nrows)++];
        NIB_TRY(time_row(g, cfg->reps, canon_bytes, copy_gbps, bf16_us[mi], row));
        if (v == V_BF16) bf16_us[mi] = row->us;
        nib_gemm_plan chosen;
        memset(&chosen, 0, sizeof chosen);
        if (v >= V_NVFP4 && !nib_cuda_gemm_plan(&g->w[0], g->m, g->ws->acc_elems, &chosen))
            plan_str(&chosen, row->plan, sizeof row->plan);
        row->sweep = cfg->sweep && v >= V_NVFP4 ? 2 : 0;
        if (cfg->lt_search && v < V_W8A8 && (v != V_BF16 || cfg->bf16_listed)) {
            NIB_TRY(bench_lt_search(cfg, g, canon_bytes, copy_gbps, bf16_us[mi], row, rows, nrows, max_rows));
            continue;
        }
        if (cfg->lt_configs > 0 && v < V_W8A8 && (v != V_BF16 || cfg->bf16_listed)) {
            NIB_TRY(bench_lt_configs(cfg, g, canon_bytes, copy_gbps, bf16_us[mi], row, rows, nrows, max_rows));
            continue;
        }
        if (cfg->algos > 0 && v < V_FP8NIB) {
            NIB_TRY(bench_algos(cfg, g, canon_bytes, copy_gbps, bf16_us[mi], row, rows, nrows, max_rows));
            continue;
        }
        if (is_fp8_nib(v)) {
            nib_fp8_tile pick;
            NIB_TRY(nib_cuda_fp8_plan(g->m, n, k, v == V_FP8GEGLU, &pick));
            snprintf(row->plan, sizeof row->plan, "tile %dx%d st%d ks%d cm%d", 64 * pick.wg, pick.bn, pick.stages, pick.ks,
                     pick.cm);
            int pr = 0, pc = 0; /* the GeGLU product on the ping-pong kernel instead (by rule or NIB_FP8_PP) */
            if (v == V_FP8GEGLU) NIB_TRY(nib_cuda_fp8_geglu_pp(g->m, n, k, &pr, &pc));
            if (pr) snprintf(row->plan, sizeof row->plan, "ping-pong %dx%d", pr, pc);
            row->sweep = cfg->sweep ? 2 : 0;
        }
        print_row(row);
        if (cfg->sweep && is_fp8_nib(v)) {
            NIB_TRY(sweep_fp8_tiles(cfg, g, canon_bytes, copy_gbps, bf16_us[mi], row, rows, nrows, max_rows));
            continue;
        }
        if (!cfg->sweep || v < V_NVFP4) continue;
        /* every other plan that fits, up to 4 waves of CTAs: where the planner's pick stands */
        static nib_gemm_plan pls[2048];
        int np = nib_cuda_gemm_plans(&g->w[0], g->m, g->ws->acc_elems, pls, (int)NIB_ARRAY_LEN(pls));
        double best = row->us;
        char best_plan[64];
        snprintf(best_plan, sizeof best_plan, "%s", row->plan);
        for (int i = 0; i < np && *nrows < max_rows; i++) {
            const nib_gemm_plan *pl = &pls[i];
            if (pl->mt == chosen.mt && pl->wk == chosen.wk && pl->ksplit == chosen.ksplit && pl->occ == chosen.occ &&
                pl->reg == chosen.reg)
                continue;
            if (pl->ctas > 4 * pl->occ * cfg->sms) continue;
            g->plan = pl;
            bench_row *sr = &rows[(*nrows)++];
            NIB_TRY(time_row(g, cfg->reps < 5 ? cfg->reps : 5, canon_bytes, copy_gbps, bf16_us[mi], sr));
            plan_str(pl, sr->plan, sizeof sr->plan);
            sr->sweep = 1;
            print_row(sr);
            if (sr->us < best) {
                best = sr->us;
                snprintf(best_plan, sizeof best_plan, "%s", sr->plan);
            }
        }
        g->plan = NULL;
        printf("%6lld %6lld %5lld  %-13s best plan %s: %.2f us (planner's %.2f us, %.2fx)\n", (long long)k,
               (long long)n, (long long)g->m, k_vname[v], best_plan, best, row->us, row->us / best);
    }
fail:
    nib_dev_arena_free(&arena);
    nib_free(hbufs[0]);
    nib_free(hbufs[1]);
    memset(g->w, 0, sizeof g->w);
    memset(g->bw, 0, sizeof g->bw);
    g->sw = NULL;
    return st;
}

static nib_status bench_shape(const bench_cfg *cfg, int si, nib_blas *blas, nib_gemm_ws *ws, double copy_gbps,
                              int l2_bytes, bench_row *rows, int *nrows, int max_rows) {
    nib_status st = NIB_OK;
    const int64_t k = cfg->k[si], n = cfg->n[si];
    int64_t max_m = 1;
    for (int i = 0; i < cfg->nm; i++)
        if (cfg->m[i] > max_m) max_m = cfg->m[i];
    nib_rng r;
    nib_rng_seed(&r, 0x5eed0000u + (uint64_t)si);
    gemm_ctx g;
    memset(&g, 0, sizeof g);
    g.blas = blas;
    g.inplace = cfg->inplace;
    g.ws = ws;
    g.n = n;
    g.k = k;
    uint16_t *hx = NULL;
    double bf16_us[MAX_MS];
    for (int i = 0; i < MAX_MS; i++) bf16_us[i] = NAN;

    /* activations: random bf16 N(0,1), shared by all variants */
    hx = nib_malloc((size_t)max_m * k * 2);
    if (!hx) return NIB_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < max_m * k; i++) hx[i] = nib_f32_to_bf16((float)nib_rng_normal(&r));
    NIB_TRY(nib_dev_malloc(&g.x, (size_t)max_m * k * 2, "bench x"));
    NIB_TRY(nib_dev_malloc(&g.xq, (size_t)max_m * k, "bench xq"));
    NIB_TRY(nib_dev_malloc((void **)&g.sx, (size_t)max_m * 4 + 8, "bench sx"));
    NIB_TRY(nib_dev_malloc(&g.y, (size_t)max_m * n * 2, "bench y"));
    NIB_TRY(nib_dev_upload(g.x, hx, (size_t)max_m * k * 2));
    NIB_TRY(nib_cuda_quantize_fp8_rows(g.x, max_m, k, 1, g.xq, g.sx, NULL));

    for (int v = 0; v < V_COUNT; v++) {
        if (!cfg->enabled[v]) continue;
        if (v == V_INT4 && k % 128) {
            printf("%6lld %6lld     -  %-13s n/a: K is not a multiple of the INT4 group (128)\n", (long long)k,
                   (long long)n, k_vname[v]);
            continue;
        }
        if (v == V_FP8GEGLU && n % 16) {
            printf("%6lld %6lld     -  %-13s n/a: GeGLU needs N = 2H with H a multiple of 8\n", (long long)k,
                   (long long)n, k_vname[v]);
            continue;
        }
        if (v == V_MXFP4 && k % 32) {
            printf("%6lld %6lld     -  %-13s n/a: K is not a multiple of the MXFP4 block (32)\n", (long long)k,
                   (long long)n, k_vname[v]);
            continue;
        }
        nib_status vs = bench_variant(cfg, (variant)v, &g, &r, copy_gbps, l2_bytes, bf16_us, rows, nrows, max_rows);
        if (vs) { /* report and go on with the other variants; the command still fails at the end */
            printf("%6lld %6lld     -  %-13s ERROR %s: %s\n", (long long)k, (long long)n, k_vname[v],
                   nib_status_name(vs), nib_last_error());
            st = vs;
        }
    }
fail:
    nib_free(hx);
    nib_dev_free(g.x, (size_t)max_m * k * 2);
    nib_dev_free(g.xq, (size_t)max_m * k);
    nib_dev_free(g.sx, (size_t)max_m * 4 + 8);
    nib_dev_free(g.y, (size_t)max_m * n * 2);
    return st;
}

static nib_status write_json(const char *path, const nib_device_info *d, double copy_gbps, const bench_row *rows,
                             int nrows, int hot, int argc, char **argv) {
    FILE *f = fopen(path, "w");
    if (!f) return NIB_ERR(NIB_ERR_IO, "cannot write '%s'", path);
    nib_cli_json_head(f, "gemm", "nib bench", argc, argv, d);
    fprintf(f, "  \"copy_gbps\": %.1f,\n  \"timing\": \"median over reps of CUDA-graph replay time / calls; %s\",\n"
               "  \"rows\": [\n",
            copy_gbps, hot ? "one weight copy, L2-resident (--hot)" : "weights rotated over copies > 3x L2");
    for (int i = 0; i < nrows; i++) {
        const bench_row *r = &rows[i];
        fprintf(f,
                "    {\"k\": %lld, \"n\": %lld, \"m\": %lld, \"variant\": \"%s\", \"us\": %.3f, \"weight_bytes\": "
                "%llu, \"gbps\": %.1f, \"tflops\": %.2f, \"speedup_vs_cublas_bf16\": %.3f, \"pct_copy_bw\": "
                "%.1f, \"plan\": \"%s\"%s}%s\n",
                (long long)r->k, (long long)r->n, (long long)r->m, k_vname[r->v], r->us,
                (unsigned long long)r->bytes, r->gbps, r->tflops, r->speedup, r->pct_bw, r->plan,
                r->sweep == 1 ? ", \"sweep\": true" : r->sweep == 2 ? ", \"planner\": true" : "",
                i + 1 < nrows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f)) return NIB_ERR(NIB_ERR_IO, "error writing '%s'", path);
    return NIB_OK;
}

static int bench_gemm(int argc, char **argv) {
    bench_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    parse_shapes("2048:2560,2048:32768,16384:2048,1024:2560,2048:1024,1024:8192,4096:1024,1152:4304,4304:1152",
                 &cfg);
    cfg.nm = parse_list("1,4,10,16,50,128,532,1024", cfg.m, MAX_MS);
    for (int v = 0; v < V_COUNT; v++) cfg.enabled[v] = v != V_FP8GEGLU; /* that one when named */
    cfg.reps = 15;
    cfg.bf16_listed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (nib_cli_is_help(a)) {
            printf("usage: nib bench gemm [--shapes K:N,...] [--m M,...] [--variants LIST] [--reps N] [--sweep]\n"
                   "                      [--hot] [--algos N] [--lt-configs N] [--lt-search] [--inplace]\n"
                   "                      [--json FILE]\n"
                   "The GEMM kernel lab. Variants: cublas-bf16 (baseline), cublaslt-fp8 (GEMM only),\n"
                   "fp8-w8a8 (per-token quantize + the FP8 product the engine rule picks: cuBLASLt or nib's),\n"
                   "fp8-nib (nib's wgmma FP8 product, GEMM only), fp8-nib-geglu (the same with the GeGLU epilogue:\n"
                   "N = 2H weight rows, gate | up, Y is M x H; only when named), nvfp4, mxfp4, int4-g128, fp8-wo (nib's\n"
                   "weight-only kernels: mma.sync at small M; wgmma for NVFP4, MXFP4, INT4 and FP8 from M = 128,\n"
                   "past M = 32 on weights of 2M+ elements, and for NVFP4 and INT4 at M = 9..32 on weights of\n"
                   "one 128-row tile per SM or more (16- and 32-token tiles) and at M = 17..32 with K >= 4096;\n"
                   "act-order INT4 excepted; the plan column names it; NIB_GEMM_WG=0|1 turns it off / on at\n"
                   "every M, NIB_GEMM_WG_BT=16|32|64|128|192|256 (INT4: up to 192), NIB_GEMM_WG_KS=1..8 and\n"
                   "NIB_GEMM_WG_CM=2 (tiles of 64+) force its tile, K split and X multicast (other values are\n"
                   "ignored); its K splits add their sums inside one cluster where every cluster fits at\n"
                   "once (plan suffix kcl), else through a workspace, which NIB_GEMM_WG_KCL=0 keeps\n"
                   "everywhere). Default shapes are the Pi0.5 /\n"
                   "Gemma shapes of issue 3 and M = 1,4,10,16,50,128,532,1024. Each row: median µs per call\n"
                   "(CUDA-graph replay, weights rotated over > 3x L2), effective GB/s of the canonical weight\n"
                   "bytes, TFLOP/s, speedup over cuBLAS bf16 at the same shape and M, and %% of the copy\n"
                   "bandwidth.\n"
                   "--sweep: for nib's low-bit variants, also time every mma.sync launch plan that fits (warps\n"
                   "along K, K splits, register budget; up to 4 waves of CTAs; 5 reps each) and print\n"
                   "the best against the planner's choice (rows marked sweep; JSON: \"sweep\": true);\n"
                   "for fp8-nib, every compiled tile (token rows x channels, stages, K split, cluster); for\n"
                   "fp8-nib-geglu every tile that can run GeGLU. fp8-nib-geglu (and the model's fused GeGLU\n"
                   "products) run on the ping-pong kernel where its rule picks it (K <= 2048, 2H >= 16384:\n"
                   "257-320 rows on 64x256, 513-640 rows on 192x128; the plan column says so);\n"
                   "NIB_FP8_PP=0 turns that off, NIB_FP8_PP=192x128|128x192|64x256 forces that tile per\n"
                   "consumer warpgroup.\n"
                   "--hot: time with one weight copy, which stays in L2 between calls (the default\n"
                   "rotates copies over > 3x L2, so weights come from DRAM as in the model).\n"
                   "--algos N: for the cuBLAS variants, also time cuBLASLt's first N heuristic candidates\n"
                   "(1..32; tile, stages, split-K, swizzle, cluster ids and the heuristic's wave count in\n"
                   "the plan column; 5 reps each) and print the best against cuBLASLt's first choice.\n"
                   "--lt-configs N: for cublaslt-fp8 (and cublas-bf16 when named in --variants), also time up\n"
                   "to N configurations cuBLASLt accepts for the product: its heuristic's first 8 candidates\n"
                   "with other tiles, custom options, cluster shapes, CTA swizzle and split-K 1-4 (3 reps\n"
                   "each; NIB_LT_DEBUG=1 prints what each candidate offers); the ten fastest are printed, all\n"
                   "go to the JSON. The default row runs cuBLASLt's heuristic, or nib's measured\n"
                   "reconfiguration where ops/gemm_plan.c has one (NIB_BLAS_TUNE=0: the heuristic always).\n"
                   "--lt-search: for the same variants, a coordinate search from each of the heuristic's first\n"
                   "8 candidates: one field at a time (tile, cluster shape, custom option, swizzle, split-K),\n"
                   "every value cuBLASLt accepts timed with the other fields at the best so far (5 reps), the\n"
                   "fastest kept if >= 1 %% faster; two passes. Prints each candidate's result and the best.\n"
                   "--inplace: cublas-bf16 adds its product to Y in place (C = Y, as the model's residual\n"
                   "products run; cuBLASLt plans those separately), and nib's weight-only variants do the\n"
                   "same through their epilogue's residual (Y as its own residual, a decoder's o and down).\n");
            return 0;
        } else if (!strcmp(a, "--shapes") && val) {
            if (parse_shapes(val, &cfg) <= 0) {
                fprintf(stderr, "nib bench gemm: --shapes wants K:N[,K:N...], got '%s'\n", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--m") && val) {
            cfg.nm = parse_list(val, cfg.m, MAX_MS);
            if (cfg.nm <= 0) {
                fprintf(stderr, "nib bench gemm: --m wants M[,M...], got '%s'\n", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--variants") && val) {
            memset(cfg.enabled, 0, sizeof cfg.enabled);
            char buf[256];
            snprintf(buf, sizeof buf, "%s", val);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                int found = 0;
                for (int v = 0; v < V_COUNT; v++)
                    if (!strcmp(tok, k_vname[v])) cfg.enabled[v] = found = 1;
                if (!found) {
                    fprintf(stderr, "nib bench gemm: unknown variant '%s'\n", tok);
                    return 2;
                }
            }
            cfg.bf16_listed = cfg.enabled[V_BF16];
            cfg.enabled[V_BF16] = 1; /* the baseline is always measured */
            i++;
        } else if (!strcmp(a, "--reps") && val) {
            if (!nib_cli_int_arg("bench gemm", a, val, 3, 100000, &cfg.reps)) return 2;
            i++;
        } else if (!strcmp(a, "--json") && val) {
            cfg.json_path = val;
            i++;
        } else if (!strcmp(a, "--hot")) {
            cfg.hot = 1;
        } else if (!strcmp(a, "--sweep")) {
            cfg.sweep = 1;
        } else if (!strcmp(a, "--lt-configs") && val) {
            if (!nib_cli_int_arg("bench gemm", a, val, 1, 100000, &cfg.lt_configs)) return 2;
            i++;
        } else if (!strcmp(a, "--inplace")) {
            cfg.inplace = 1;
        } else if (!strcmp(a, "--lt-search")) {
            cfg.lt_search = 1;
        } else if (!strcmp(a, "--algos") && val) {
            if (!nib_cli_int_arg("bench gemm", a, val, 1, 32, &cfg.algos)) return 2;
            i++;
        } else {
            fprintf(stderr, "nib bench gemm: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    nib_device_info d;
    nib_status st = nib_device_require(&d);
    if (st) return nib_cli_fail("bench gemm", st);
    cfg.sms = d.sm_count;
    double copy_gbps = 0;
    st = nib_lab_copy_bandwidth((uint64_t)16 * (uint64_t)d.l2_bytes, &copy_gbps);
    if (st) return nib_cli_fail("bench gemm", st);
    printf("device %s (cc %d.%d, %d SMs, L2 %.0f MB); measured copy bandwidth %.0f GB/s (read+write)\n", d.name,
           d.cc_major, d.cc_minor, d.sm_count, d.l2_bytes / 1e6, copy_gbps);
    printf("%6s %6s %5s  %-13s %9s %8s %8s %8s %7s  %s\n", "K", "N", "M", "variant", "us", "GB/s", "TFLOP/s",
           "vs bf16", "%copy", "plan");
    nib_blas *blas = NULL;
    nib_gemm_ws ws;
    memset(&ws, 0, sizeof ws);
    int max_rows = cfg.nshapes * cfg.nm * V_COUNT * (cfg.sweep ? 256 : 1) * (cfg.algos > 0 ? cfg.algos : 1) +
                   cfg.nshapes * cfg.nm * 2 * cfg.lt_configs + cfg.nshapes * cfg.nm * (cfg.lt_search ? 2400 : 0),
        nrows = 0;
    bench_row *rows = nib_calloc((size_t)max_rows, sizeof *rows);
    int64_t max_m = 1, max_n = 1;
    for (int i = 0; i < cfg.nm; i++) max_m = cfg.m[i] > max_m ? cfg.m[i] : max_m;
    for (int i = 0; i < cfg.nshapes; i++) max_n = cfg.n[i] > max_n ? cfg.n[i] : max_n;
    double t0 = now_wall();
    if (!rows) st = NIB_ERR_OUT_OF_MEMORY;
    if (!st) st = nib_blas_create(&blas);
    if (!st) st = nib_cuda_gemm_ws_init(&ws, max_m, (max_n + 255) / 256 * 256);
    for (int s = 0; s < cfg.nshapes && !st; s++)
        st = bench_shape(&cfg, s, blas, &ws, copy_gbps, d.l2_bytes, rows, &nrows, max_rows);
    if (!st && cfg.json_path) st = write_json(cfg.json_path, &d, copy_gbps, rows, nrows, cfg.hot, argc, argv);
    if (!st) printf("%d rows in %.1f s%s%s\n", nrows, now_wall() - t0, cfg.json_path ? ", written to " : "",
                    cfg.json_path ? cfg.json_path : "");
    nib_cuda_gemm_ws_free(&ws);
    nib_blas_free(blas);
    nib_free(rows);
    if (st) return nib_cli_fail("bench gemm", st);
    return 0;
}

int nib_cmd_bench(int argc, char **argv) {
    if (argc < 2 || nib_cli_is_help(argv[1])) {
        printf("usage: nib bench <lab> [options]   (all labs need a GPU)\n"
               "  gemm   weight-GEMM kernel lab (nib bench gemm --help)\n"
               "  ops    norms, RoPE, activations, fused QKV epilogue (nib bench ops --help)\n"
               "  attn   attention kernels (nib bench attn --help)\n"
               "  pi05   Pi0.5 end-to-end latency (nib bench pi05 --help)\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "gemm")) return bench_gemm(argc - 1, argv + 1);
    if (!strcmp(argv[1], "ops")) return nib_bench_ops(argc - 1, argv + 1);
    if (!strcmp(argv[1], "attn")) return nib_bench_attn(argc - 1, argv + 1);
    if (!strcmp(argv[1], "pi05")) return nib_bench_pi05(argc - 1, argv + 1);
    fprintf(stderr, "nib bench: unknown lab '%s' (available: gemm, ops, attn, pi05)\n", argv[1]);
    return 2;
}
