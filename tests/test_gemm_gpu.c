/* test_gemm_gpu.c — the CUDA weight GEMM (ops/cuda/gemm_lowbit.cu) and the cuBLASLt paths
 * (ops/cuda/blas.cu) against the reference GEMM (ops/ref/gemm_ref.c: exact dequantization,
 * fp64 accumulation).
 *
 * Inputs are fresh random canonical weight planes that cover the edges of each format (every
 * E2M1 code, zero / subnormal / max E4M3 block scales, a wide E8M0 range, random INT4 zero
 * points and act-order permutations, every non-NaN E4M3 code) and random bf16 activations.
 * Outputs are poisoned (bf16 NaN) and surrounded by guard values before each call.
 *
 * Threshold (per element), derived from what the kernel does: A fragments are exact (see the
 * kernel header) and bf16 x bf16 products are exact in fp32, so the error is fp32 accumulation
 * plus the final bf16 rounding:
 *     |y - ref| <= 2^-8 |ref|  +  (K + 64) * 2^-22 * sum_k |w_k x_k|  (+ epilogue terms)
 * 2^-8 is the bf16 unit roundoff (8-bit significand, RNE: half an ulp <= 2^-8 |v|). The accumulation term allows one 2^-22 relative error per
 * addition (2x the fp32 unit roundoff, because tensor-core accumulation is not IEEE
 * round-to-nearest), with 64 extra additions for the split-K and group-scale partial sums.
 * GeGLU propagates the gate and up errors through |gelu'| <= 1.13.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "ops/act.h"
#include "harness.h"
#include "ops/gemm.h"
#include "ops/kvcache.h"
#include "ops/qkv.h"
#include "ops/rope.h"
#include "runtime/device.h"

#define POISON 0x7FC1u /* bf16 NaN with a payload: unwritten outputs and guards */

typedef struct rand_w {
    nib_wsrc w;
    uint8_t *data, *scales, *zeros;
    int32_t *perm;
    float *fscales, *bias;
} rand_w;

static void rand_w_free(rand_w *r) {
    nib_free(r->data);
    nib_free(r->scales);
    nib_free(r->zeros);
    nib_free(r->perm);
    nib_free(r->fscales);
    nib_free(r->bias);
    memset(r, 0, sizeof *r);
}

/* opts: asym (INT4 zeros), act_order (INT4 perm), per_channel (FP8), with_bias */
static int make_rand_w(nib_rng *rng, nib_wfmt f, int64_t n, int64_t k, int asym, int act_order, int per_channel,
                       int with_bias, rand_w *o) {
    memset(o, 0, sizeof *o);
    nib_wsrc *w = &o->w;
    w->fmt = f;
    w->n = n;
    w->k = k;
    w->group = 128;
    uint64_t nk = (uint64_t)n * k;
    uint64_t eb = f == NIB_WFMT_FP8 ? nk : nk / 2;
    o->data = nib_malloc(eb);
    if (!o->data) return 0;
    for (uint64_t i = 0; i < eb; i++) {
        uint8_t b = (uint8_t)nib_rng_u64(rng);
        if (f == NIB_WFMT_FP8 && (b & 0x7F) == 0x7F) b = (uint8_t)(b & 0xF0); /* no NaN */
        o->data[i] = b;
    }
    w->data = o->data;
    switch (f) {
    case NIB_WFMT_NVFP4: {
        uint64_t sb = nk / 16;
        o->scales = nib_malloc(sb);
        if (!o->scales) return 0;
        for (uint64_t i = 0; i < sb; i++) {
            uint64_t u = nib_rng_below(rng, 16);
            /* mostly normal scales around 1, plus zero, subnormal and max edge cases */
            o->scales[i] = u == 0 ? 0x00 : u == 1 ? (uint8_t)(1 + nib_rng_below(rng, 7))
                           : u == 2 ? 0x7E : (uint8_t)(0x20 + nib_rng_below(rng, 0x30));
        }
        w->scales = o->scales;
        w->global_scale = (float)(0.5 + nib_rng_uniform(rng)) / 448.0f;
        break;
    }
    case NIB_WFMT_MXFP4: {
        uint64_t sb = nk / 32;
        o->scales = nib_malloc(sb);
        if (!o->scales) return 0;
        for (uint64_t i = 0; i < sb; i++) o->scales[i] = (uint8_t)(100 + nib_rng_below(rng, 30));
        w->scales = o->scales;
        break;
    }
    case NIB_WFMT_INT4: {
        uint64_t ng = nk / 128;
        o->scales = nib_malloc(ng * 2);
        if (!o->scales) return 0;
        for (uint64_t i = 0; i < ng; i++) {
            uint16_t h = nib_f32_to_f16((float)(0.002 + 0.02 * nib_rng_uniform(rng)));
            memcpy(o->scales + 2 * i, &h, 2);
        }
        w->scales = o->scales;
        if (asym) {
            o->zeros = nib_malloc(ng);
            if (!o->zeros) return 0;
            for (uint64_t i = 0; i < ng; i++) o->zeros[i] = (uint8_t)nib_rng_below(rng, 16);
            w->zeros = o->zeros;
        }
        if (act_order) {
            o->perm = nib_malloc((size_t)k * 4);
            if (!o->perm) return 0;
            for (int64_t j = 0; j < k; j++) o->perm[j] = (int32_t)j;
            for (int64_t j = k - 1; j > 0; j--) { /* Fisher-Yates */
                int64_t q = (int64_t)nib_rng_below(rng, (uint64_t)j + 1);
                int32_t tmp = o->perm[j];
                o->perm[j] = o->perm[q];
                o->perm[q] = tmp;
            }
            w->perm = o->perm;
        }
        break;
    }
    case NIB_WFMT_FP8: {
        int64_t ns = per_channel ? n : 1;
        o->fscales = nib_malloc((size_t)ns * 4);
        if (!o->fscales) return 0;
        for (int64_t i = 0; i < ns; i++) o->fscales[i] = (float)(0.5 + nib_rng_uniform(rng)) / 448.0f;
        w->scales = o->fscales;
        w->fp8_per_channel = per_channel;
        break;
    }
    default: return 0;
    }
    if (with_bias) {
        o->bias = nib_malloc((size_t)n * 4);
        if (!o->bias) return 0;
        for (int64_t i = 0; i < n; i++) o->bias[i] = (float)(0.1 * nib_rng_normal(rng));
        w->bias = o->bias;
    }
    return 1;
}

typedef struct case_opts {
    int geglu, use_gate, use_residual, inplace;
    const nib_gemm_plan *plan; /* NULL: the planner's choice */
    const nib_gemm_plan *plan2; /* non-NULL (and not in place): run again with this plan, which must give the
                                 * same bits */
} case_opts;

/* Where non-NULL, run_case copies its whole output buffer (guard rows and columns included, (m + 2) x
 * (n_out + 8) values) here: for tests that compare two kernels bitwise. */
static uint16_t *g_capture;

/* Runs one GEMM on the GPU and checks it. Returns the worst error/bound ratio (<= 1 passes). */
static double run_case(nib_test_ctx *t, nib_rng *rng, const nib_wsrc *w, int64_t m, const case_opts *o,
                       nib_gemm_ws *ws, int check_determinism) {
    const int64_t n_out = o->geglu ? w->n / 2 : w->n, k = w->k;
    const int64_t ldy = n_out + 8, rows = m + 2;
    double worst = 0.0;
    nib_dev_arena arena;
    memset(&arena, 0, sizeof arena);
    uint16_t *hx = nib_malloc((size_t)m * k * 2), *hy = nib_malloc((size_t)rows * ldy * 2);
    uint16_t *hy2 = nib_malloc((size_t)rows * ldy * 2), *hr = nib_malloc((size_t)m * n_out * 2);
    float *hg = nib_malloc((size_t)n_out * 4);
    double *ref = nib_malloc((size_t)m * w->n * 8), *absr = nib_malloc((size_t)m * w->n * 8);
    double *yref = nib_malloc((size_t)m * n_out * 8);
    void *dx = NULL, *dy = NULL, *dr = NULL;
    float *dg = NULL;
    nib_qweight qw;
    nib_status st;
    if (!(hx && hy && hy2 && hr && hg && ref && absr && yref)) {
        nib_test_fail(t, __FILE__, __LINE__, "host allocation failed");
        goto done;
    }
    for (int64_t i = 0; i < m * k; i++) hx[i] = nib_f32_to_bf16((float)nib_rng_normal(rng));
    for (int64_t i = 0; i < m * n_out; i++) hr[i] = nib_f32_to_bf16((float)nib_rng_normal(rng));
    for (int64_t i = 0; i < n_out; i++) hg[i] = (float)(4.0 * nib_rng_uniform(rng) - 2.0);
    uint64_t wbytes = 0;
    CHECK_OK(nib_cuda_weight_bytes(w, o->geglu, &wbytes));
    CHECK_OK(nib_dev_arena_init(&arena, wbytes + (1 << 16), "test weight"));
    st = nib_cuda_weight_load(w, o->geglu, "test.weight", &arena, &qw);
    CHECK_OK(st);
    if (st) goto done;
    CHECK_OK(nib_dev_malloc(&dx, (size_t)m * k * 2, "x"));
    CHECK_OK(nib_dev_malloc(&dy, (size_t)rows * ldy * 2, "y"));
    CHECK_OK(nib_dev_malloc(&dr, (size_t)m * n_out * 2, "residual"));
    CHECK_OK(nib_dev_malloc((void **)&dg, (size_t)n_out * 4, "gate"));
    CHECK_OK(nib_dev_upload(dx, hx, (size_t)m * k * 2));
    CHECK_OK(nib_dev_upload(dr, hr, (size_t)m * n_out * 2));
    CHECK_OK(nib_dev_upload(dg, hg, (size_t)n_out * 4));
    for (int64_t i = 0; i < rows * ldy; i++) hy[i] = POISON;
    if (o->inplace) /* y starts as the residual */
        for (int64_t i = 0; i < m; i++) memcpy(hy + (i + 1) * ldy, hr + i * n_out, (size_t)n_out * 2);
    CHECK_OK(nib_dev_upload(dy, hy, (size_t)rows * ldy * 2));
    void *y0 = (uint16_t *)dy + ldy; /* row 0 and row m+1 are guards */
    nib_gemm_epi epi = {o->geglu, o->use_gate ? dg : NULL,
                        o->use_residual ? (o->inplace ? y0 : dr) : NULL, o->inplace ? ldy : n_out};
    CHECK_OK(nib_cuda_gemm_planned(&qw, dx, m, k, y0, ldy, &epi, ws, o->plan, NULL));
    CHECK_OK(nib_dev_sync());
    CHECK_OK(nib_dev_download(hy, dy, (size_t)rows * ldy * 2));
    if (check_determinism && !o->inplace) {
        CHECK_OK(nib_cuda_gemm_planned(&qw, dx, m, k, y0, ldy, &epi, ws, o->plan, NULL));
        CHECK_OK(nib_dev_download(hy2, dy, (size_t)rows * ldy * 2));
        CHECK_MSG(!memcmp(hy, hy2, (size_t)rows * ldy * 2), "second call differs bitwise");
    }
    if (o->plan2 && !o->inplace) {
        for (int64_t i = 0; i < rows * ldy; i++) hy2[i] = POISON;
        CHECK_OK(nib_dev_upload(dy, hy2, (size_t)rows * ldy * 2));
        CHECK_OK(nib_cuda_gemm_planned(&qw, dx, m, k, y0, ldy, &epi, ws, o->plan2, NULL));
        CHECK_OK(nib_dev_download(hy2, dy, (size_t)rows * ldy * 2));
        int64_t diff = 0;
        for (int64_t i = 0; i < rows * ldy; i++) diff += hy[i] != hy2[i];
        CHECK_MSG(diff == 0, "the second plan's output differs bitwise in %lld of %lld values (guards included)",
                  (long long)diff, (long long)(rows * ldy));
    }
    if (g_capture) memcpy(g_capture, hy, (size_t)rows * ldy * 2);
    /* reference: pre-epilogue sums of every row (so GeGLU bounds can use gate and up) */
    CHECK_OK(nib_ref_gemm(w, hx, m, k, NULL, ref, absr));
    {
        nib_gemm_epi repi = {o->geglu, o->use_gate ? hg : NULL, o->use_residual ? hr : NULL, n_out};
        CHECK_OK(nib_ref_gemm(w, hx, m, k, &repi, yref, NULL));
    }
    int bad_guard = 0, nonfinite = 0, over = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < ldy; j++) {
            uint16_t v = hy[i * ldy + j];
            int inside = i >= 1 && i <= m && j < n_out;
            if (!inside) {
                if (v != POISON) bad_guard++;
                continue;
            }
            float yv = nib_bf16_to_f32(v);
            if (!isfinite(yv)) {
                nonfinite++;
                continue;
            }
            int64_t mi = i - 1;
            double yr = yref[mi * n_out + j];
            double gam = (double)(k + 64) * 0x1p-22;
            double ev; /* error budget of the pre-residual value */
            if (o->geglu) {
                double g = ref[mi * w->n + j], u = ref[mi * w->n + n_out + j];
                double dg_ = gam * absr[mi * w->n + j] + 0x1p-23 * fabs(g);
                double du = gam * absr[mi * w->n + n_out + j] + 0x1p-23 * fabs(u);
                double gel = 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
                ev = 1.13 * dg_ * (fabs(u) + du) + fabs(gel) * du + 1e-5 * fabs(gel * u);
            } else {
                ev = gam * absr[mi * w->n + j] + 0x1p-23 * fabs(ref[mi * w->n + j]);
            }
            if (o->use_gate) ev *= fabs(hg[j]);
            double bound = 0x1p-8 * fabs(yr) * 1.01 + ev * 1.01 + 1e-30;
            if (o->use_residual) bound += 0x1p-23 * (fabs(yr) + fabs(nib_bf16_to_f32(hr[mi * n_out + j])));
            double err = fabs((double)yv - yr), ratio = err / bound;
            if (ratio > worst) worst = ratio;
            if (err > bound && over++ < 5)
                nib_test_fail(t, __FILE__, __LINE__, "%s m=%lld n=%lld: y=%.6g ref=%.6g err=%.3g bound=%.3g",
                              nib_wfmt_name(w->fmt), (long long)mi, (long long)j, yv, yr, err, bound);
        }
    CHECK_MSG(bad_guard == 0, "%d guard values overwritten (out-of-bounds writes)", bad_guard);
    CHECK_MSG(nonfinite == 0, "%d outputs NaN/Inf (unwritten or overflow)", nonfinite);
done:
    nib_dev_free(dx, (size_t)m * k * 2);
    nib_dev_free(dy, (size_t)rows * ldy * 2);
    nib_dev_free(dr, (size_t)m * n_out * 2);
    nib_dev_free(dg, (size_t)n_out * 4);
    nib_dev_arena_free(&arena);
    nib_free(hx);
    nib_free(hy);
    nib_free(hy2);
    nib_free(hr);
    nib_free(hg);
    nib_free(ref);
    nib_free(absr);
    nib_free(yref);
    return worst;
}

typedef struct fmt_case {
    const char *name;
    nib_wfmt f;
    int asym, act_order, per_channel;
} fmt_case;

static const fmt_case k_fmts[] = {
    {"nvfp4", NIB_WFMT_NVFP4, 0, 0, 0},     {"mxfp4", NIB_WFMT_MXFP4, 0, 0, 0},
    {"int4-sym", NIB_WFMT_INT4, 0, 0, 0},   {"int4-asym", NIB_WFMT_INT4, 1, 0, 0},
    {"fp8-channel", NIB_WFMT_FP8, 0, 0, 1}, {"fp8-tensor", NIB_WFMT_FP8, 0, 0, 0},
};

/* The test's random stream and a split-K workspace for up to max_m tokens of max_np padded rows. */
static void gemm_test_begin(nib_test_ctx *t, nib_rng *rng, nib_gemm_ws *ws, int64_t max_m, int64_t max_np) {
    nib_test_rng(t, rng);
    CHECK_OK(nib_cuda_gemm_ws_init(ws, max_m, max_np));
}

static void sweep(nib_test_ctx *t, int64_t n, int64_t k, const int64_t *ms, int nm, int with_bias) {
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 1024, 4096);
    for (size_t fi = 0; fi < NIB_ARRAY_LEN(k_fmts); fi++) {
        const fmt_case *fc = &k_fmts[fi];
        /* each format at the nearest K its block allows (INT4 groups of 128, MXFP4 blocks of 32) */
        int64_t blk = fc->f == NIB_WFMT_INT4 ? 128 : fc->f == NIB_WFMT_MXFP4 ? 32 : 16;
        int64_t kk = (k + blk - 1) / blk * blk;
        rand_w rw;
        REQUIRE(make_rand_w(&rng, fc->f, n, kk, fc->asym, fc->act_order, fc->per_channel, with_bias, &rw));
        for (int mi = 0; mi < nm; mi++) {
            case_opts o = {0, 0, 0, 0, NULL, NULL};
            double worst = run_case(t, &rng, &rw.w, ms[mi], &o, &ws, mi == 0);
            printf("  %-12s N=%-5lld K=%-5lld M=%-4lld worst err/bound %.3f\n", fc->name, (long long)n,
                   (long long)kk, (long long)ms[mi], worst);
        }
        rand_w_free(&rw);
    }
    nib_cuda_gemm_ws_free(&ws);
}

NIB_TEST(gemm_gpu_formats_small_awkward) {
    NIB_REQUIRE_GPU();
    const int64_t ms[] = {1, 3, 17, 63, 127, 532};
    sweep(t, 40, 256, ms, 6, 0);
}

NIB_TEST(gemm_gpu_formats_medium) {
    NIB_REQUIRE_GPU();
    const int64_t ms[] = {1, 17, 63};
    sweep(t, 200, 1152, ms, 3, 1);
}

NIB_TEST(gemm_gpu_formats_siglip_k4304) {
    NIB_REQUIRE_GPU();
    const int64_t ms[] = {1, 10};
    sweep(t, 1040, 4304, ms, 2, 0); /* INT4 runs at K = 4352, MXFP4 at 4320 */
}

/* w loaded into its own arena a (freed by the caller), for plan queries. */
static void load_probe(nib_test_ctx *t, const nib_wsrc *w, int geglu, nib_dev_arena *a, nib_qweight *q) {
    uint64_t b = 0;
    memset(a, 0, sizeof *a);
    memset(q, 0, sizeof *q);
    CHECK_OK(nib_cuda_weight_bytes(w, geglu, &b));
    CHECK_OK(nib_dev_arena_init(a, b + 65536, "plan probe"));
    CHECK_OK(nib_cuda_weight_load(w, geglu, "probe", a, q));
}

#ifdef NIB_HAVE_CUDA
int nib_test_fp4_layout(char *msg, size_t cap); /* tests/fp4_layout_check.cu */
#endif

/* The FP4 word layout: repack bit positions and the kernel's decoder agree (host code; no GPU). */
NIB_TEST(gemm_fp4_layout_decodes_every_code) {
#ifndef NIB_HAVE_CUDA
    SKIP("CPU-only build: the layout lives in the CUDA kernel's header");
#else
    char msg[256] = "";
    CHECK_MSG(nib_test_fp4_layout(msg, sizeof msg), "%s", msg);
#endif
}

NIB_TEST(gemm_gpu_split_k_deterministic) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 1024, 4096);
    const nib_wfmt fs[] = {NIB_WFMT_NVFP4, NIB_WFMT_INT4, NIB_WFMT_FP8};
    for (size_t i = 0; i < NIB_ARRAY_LEN(fs); i++) {
        rand_w rw;
        REQUIRE(make_rand_w(&rng, fs[i], 64, 16384, 1, 0, 1, 1, &rw));
        nib_dev_arena a;
        nib_qweight q;
        load_probe(t, &rw.w, 0, &a, &q);
        nib_gemm_plan pl;
        CHECK_OK(nib_cuda_gemm_plan(&q, 3, ws.acc_elems, &pl));
        CHECK_MSG(pl.ksplit > 1, "expected this shape to split K, plan has ksplit %d", pl.ksplit);
        nib_dev_arena_free(&a);
        const int64_t ms[] = {3, 64, 200};
        for (int mi = 0; mi < 3; mi++) {
            case_opts o = {0, 0, 0, 0, NULL, NULL};
            double worst = run_case(t, &rng, &rw.w, ms[mi], &o, &ws, 1);
            printf("  %-6s N=64 K=16384 M=%-4lld worst err/bound %.3f\n", nib_wfmt_name(fs[i]), (long long)ms[mi], worst);
        }
        rand_w_free(&rw);
    }
    nib_cuda_gemm_ws_free(&ws);
}

/* Every launch plan the planner could pick (warps along K, K splits, both register budgets of
 * MT = 8, register-loaded and bulk-copied weights, M split into chunks of 8 MT tokens) gives a correct,
 * deterministic result: the planner's cost model may choose any of them. */
NIB_TEST(gemm_gpu_every_plan) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 128, 1024);
    /* MXFP4 and FP8 (their own scale reads in the bulk ring): the bulk plans only */
    const nib_wfmt fs[] = {NIB_WFMT_NVFP4, NIB_WFMT_INT4, NIB_WFMT_MXFP4, NIB_WFMT_FP8};
    const int64_t ms[] = {1, 17, 50, 63, 100};
    int total = 0, occ1 = 0, occ2_mt8 = 0, regw = 0, bulkw = 0, msplit = 0;
    for (size_t i = 0; i < NIB_ARRAY_LEN(fs); i++) {
        rand_w rw;
        REQUIRE(make_rand_w(&rng, fs[i], 400, 1152, 1, 0, 1, 0, &rw));
        nib_dev_arena a;
        nib_qweight q;
        load_probe(t, &rw.w, 1, &a, &q); /* same padded shape with and without GeGLU */
        for (size_t mi = 0; mi < NIB_ARRAY_LEN(ms); mi++) {
            static nib_gemm_plan pls[1024];
            int np = nib_cuda_gemm_plans(&q, ms[mi], ws.acc_elems, pls, (int)NIB_ARRAY_LEN(pls));
            CHECK_MSG(np < (int)NIB_ARRAY_LEN(pls), "M=%lld: %d plans fill the array (some may be missing)",
                      (long long)ms[mi], np);
            CHECK_MSG(np >= 2, "M=%lld: only %d plans", (long long)ms[mi], np);
            for (int p = 0; p < np; p++) {
                if (i >= 2 && pls[p].reg != 2) continue;
                /* alternate the epilogues over the plans: GeGLU, and gate + residual (plain) */
                case_opts o = {p % 2 == 0, p % 2 == 1, p % 2 == 1, 0, &pls[p], NULL};
                double worst = run_case(t, &rng, &rw.w, ms[mi], &o, &ws, 1);
                CHECK_MSG(worst <= 1.0, "%s M=%lld plan mt%d (%d M chunks) wk%d ks%d occ%d reg%d: err/bound %.3f",
                          nib_wfmt_name(fs[i]), (long long)ms[mi], pls[p].mt, pls[p].m_chunks, pls[p].wk, pls[p].ksplit,
                          pls[p].occ, pls[p].reg, worst);
                total++;
                msplit += pls[p].mt < NIB_GEMM_MT(ms[mi]);
                occ1 += pls[p].occ == 1;
                occ2_mt8 += pls[p].occ == 2 && pls[p].mt == 8;
                regw += pls[p].reg == 1;
                bulkw += pls[p].reg == 2;
            }
        }
        nib_dev_arena_free(&a);
        rand_w_free(&rw);
    }
    printf("  %d plans checked (%d with one CTA per SM, %d MT=8 with two, %d with register-loaded weights, %d with "
           "bulk-copied weights, %d with M split into chunks of 8 MT tokens)\n", total, occ1, occ2_mt8, regw, bulkw, msplit);
    CHECK_MSG(msplit > 0, "the M-split plans must be exercised");
    CHECK_MSG(occ1 > 0 && occ2_mt8 > 0, "both register budgets of MT=8 must be exercised");
    CHECK_MSG(regw > 0, "the register-loaded weight variant must be exercised");
    CHECK_MSG(bulkw > 0, "the bulk-copied weight variant must be exercised");
    nib_cuda_gemm_ws_free(&ws);
}

/* The wgmma kernel's K split reduced inside its cluster (plan wkcl: 2..8 splits as one cluster along
 * z, partial sums added through distributed shared memory) against the split-K workspace path
 * (wkcl = 0): the same sums in the same order, so the outputs must match bitwise (guards included),
 * and both within the reference's bound. Every split count 2..8 (K = 1152: 9 chunks), the 16-, 32-, 64- and
 * 128-token tiles, M = 50 (the Pi0.5 expert at H = 50), one partial tile, several tiles with a
 * partial last one; N = 200 (a partial row tile) and GeGLU over 2 x 136 rows; the epilogues
 * rotate (bias, gate + residual). */
NIB_TEST(gemm_gpu_wgmma_ksplit_cluster) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 512, 4096);
    static const int bts[] = {64, 16, 128, 32};
    static const int64_t ms[] = {50, 17, 193};
    int runs = 0, kcl_runs = 0;
    double worst_all = 0.0;
    for (size_t fi = 0; fi < NIB_ARRAY_LEN(k_fmts); fi++) {
        const fmt_case *fc = &k_fmts[fi];
        for (int geglu = 0; geglu <= 1; geglu++) {
            rand_w rw;
            REQUIRE(make_rand_w(&rng, fc->f, geglu ? 2 * 136 : 200, 1152, fc->asym, 0, fc->per_channel, !geglu, &rw));
            nib_dev_arena a;
            nib_qweight q;
            load_probe(t, &rw.w, geglu, &a, &q);
            for (int ks = 2; ks <= 8; ks++) {
                const int bt = bts[(ks + geglu) % 4];
                const int64_t m = ms[(ks + fi) % 3];
                nib_gemm_plan pl, pw;
                CHECK_OK(nib_cuda_gemm_wg_plan(&q, m, bt, ks, 1, &pl));
                pw = pl;
                pw.wkcl = 0;
                pl.wkcl = 1; /* (NIB_GEMM_WG_KCL=0 in the environment would have cleared it) */
                const int rot = (ks + (int)fi) % 2; /* bias only, or gate + residual */
                case_opts o = {geglu, rot, rot, 0, &pl, &pw};
                const double worst = run_case(t, &rng, &rw.w, m, &o, &ws, 1);
                CHECK_MSG(worst <= 1.0, "%s geglu %d tile %d, %d K splits in a cluster, M=%lld: err/bound %.3f", fc->name,
                          geglu, bt, ks, (long long)m, worst);
                if (worst > worst_all) worst_all = worst;
                runs++;
                kcl_runs += pl.wkcl;
            }
            { /* a cluster reduction is refused with X multicast or more than 8 splits */
                nib_gemm_plan bad;
                CHECK_OK(nib_cuda_gemm_wg_plan(&q, 50, 64, 2, 2, &bad));
                CHECK_MSG(!bad.wkcl, "the planner paired X multicast with a cluster K split");
                CHECK_OK(nib_cuda_gemm_wg_plan(&q, 50, 64, 9, 1, &bad));
                CHECK_MSG(!bad.wkcl, "the planner made a cluster of 9 K splits");
                bad.wkcl = 1;
                void *fake = (void *)(uintptr_t)4096;
                CHECK_MSG(nib_cuda_gemm_planned(&q, fake, 50, 1152, fake, q.n_out, NULL, &ws, &bad, NULL) ==
                              NIB_ERR_INVALID_ARG,
                          "a cluster of 9 K splits accepted");
            }
            nib_dev_arena_free(&a);
            rand_w_free(&rw);
        }
    }
    printf("  %d cluster K-split cases against the workspace path, worst err/bound %.3f\n", runs, worst_all);
    CHECK_MSG(runs == 6 * 2 * 7 && kcl_runs == runs, "ran %d cases (%d with the cluster reduction)", runs, kcl_runs);
    nib_cuda_gemm_ws_free(&ws);
}

/* NIB_GEMM_FORCE's wgmma entries (K:N:M:wg<tokens>:ks:cm, the lab knob plan_search.py times inside the model):
 * nib_cuda_gemm_plan gives exactly nib_cuda_gemm_wg_plan's plan, the product run by that plan passes the
 * reference's bound, it wins over a model's plan rule (Pi0.5's expert products carry one), and an entry the
 * kernel refuses (INT4's 256-token tile) or whose K split does not fit the workspace is an error naming the
 * knob, never another plan. The same completion serves NIB_GEMM_RULE_K1024_WK1's wgmma plan above 32 tokens
 * (Pi0.5's gate|up at H = 50), which gives way to the planner for an act-order weight. */
NIB_TEST(gemm_gpu_force_wgmma_entry) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 64, 1024);
    rand_w rw;
    REQUIRE(make_rand_w(&rng, NIB_WFMT_NVFP4, 200, 1024, 0, 0, 0, 0, &rw));
    nib_dev_arena a;
    nib_qweight q;
    load_probe(t, &rw.w, 0, &a, &q);
    q.plan_rule = NIB_GEMM_RULE_K1024; /* at M = 10 the rule would pick an mma.sync plan */
    static const struct { int m, bt, ks, cm; } cs[] = {{50, 64, 2, 1}, {50, 32, 4, 1}, {50, 64, 1, 2}, {10, 16, 1, 1}};
    char v[96];
    for (size_t i = 0; i < NIB_ARRAY_LEN(cs); i++) {
        snprintf(v, sizeof v, "%lld:%lld:%d:wg%d:%d:%d", (long long)q.kp, (long long)q.np, cs[i].m, cs[i].bt, cs[i].ks,
                 cs[i].cm);
        setenv("NIB_GEMM_FORCE", v, 1);
        nib_gemm_plan got, want;
        CHECK_OK(nib_cuda_gemm_plan(&q, cs[i].m, ws.acc_elems, &got));
        CHECK_OK(nib_cuda_gemm_wg_plan(&q, cs[i].m, cs[i].bt, cs[i].ks, cs[i].cm, &want));
        CHECK_MSG(!memcmp(&got, &want, sizeof got), "%s: wgt %d ks%d cm%d ctas %d smem %zu, want wgt %d ks%d cm%d ctas %d "
                  "smem %zu", v, got.wgt, got.ksplit, got.wgc, got.ctas, got.smem, want.wgt, want.ksplit, want.wgc,
                  want.ctas, want.smem);
        case_opts o = {0, (int)i % 2, (int)i % 2, 0, NULL, NULL}; /* the planner's (forced) plan */
        const double worst = run_case(t, &rng, &rw.w, cs[i].m, &o, &ws, 1);
        CHECK_MSG(worst <= 1.0, "%s: err/bound %.3f", v, worst);
    }
    /* 8 K splits of 2 row tiles x 64 tokens through the workspace: 131072 floats, given 65536 */
    snprintf(v, sizeof v, "%lld:%lld:50:wg64:8:1", (long long)q.kp, (long long)q.np);
    setenv("NIB_GEMM_FORCE", v, 1);
    setenv("NIB_GEMM_WG_KCL", "0", 1);
    nib_gemm_plan p;
    CHECK_ST(nib_cuda_gemm_plan(&q, 50, 65536, &p), NIB_ERR_INVALID_ARG);
    CHECK_MSG(strstr(nib_last_error(), "NIB_GEMM_FORCE") && strstr(nib_last_error(), "does not fit"),
              "a K split past the workspace: %s", nib_last_error());
    unsetenv("NIB_GEMM_WG_KCL");
    nib_clear_error();
    unsetenv("NIB_GEMM_FORCE");
    { /* NIB_GEMM_RULE_K1024_WK1 above 32 tokens: the same completion of a rule's wgmma plan */
        nib_gemm_plan got;
        q.plan_rule = NIB_GEMM_RULE_K1024_WK1;
        CHECK_OK(nib_cuda_gemm_plan(&q, 50, ws.acc_elems, &got));
        CHECK_MSG(got.wgt == 64 && got.ksplit == 1 && got.wgc == 1 && got.smem > 0 && got.ctas == 2,
                  "the rule at M = 50: wgt %d ks%d cm%d smem %zu ctas %d", got.wgt, got.ksplit, got.wgc, got.smem, got.ctas);
        case_opts o = {0, 1, 1, 0, &got, NULL};
        const double worst = run_case(t, &rng, &rw.w, 50, &o, &ws, 1);
        CHECK_MSG(worst <= 1.0, "the rule's plan at M = 50: err/bound %.3f", worst);
    }
    nib_dev_arena_free(&a);
    rand_w_free(&rw);
    { /* act-order INT4 has no wgmma kernel: the rule's wgmma plan gives way to the planner's (no error) */
        rand_w ra;
        REQUIRE(make_rand_w(&rng, NIB_WFMT_INT4, 200, 1024, 0, 1, 0, 0, &ra));
        load_probe(t, &ra.w, 0, &a, &q);
        q.plan_rule = NIB_GEMM_RULE_K1024_WK1;
        nib_gemm_plan got;
        CHECK_OK(nib_cuda_gemm_plan(&q, 50, ws.acc_elems, &got));
        CHECK_MSG(!got.wgt && got.ctas > 0, "act-order INT4 under the rule: wgt %d ctas %d", got.wgt, got.ctas);
        nib_dev_arena_free(&a);
        rand_w_free(&ra);
    }
    {
        rand_w r4;
        REQUIRE(make_rand_w(&rng, NIB_WFMT_INT4, 200, 1024, 0, 0, 0, 0, &r4));
        load_probe(t, &r4.w, 0, &a, &q);
        snprintf(v, sizeof v, "%lld:%lld:50:wg256:1:1", (long long)q.kp, (long long)q.np);
        setenv("NIB_GEMM_FORCE", v, 1);
        CHECK_ST(nib_cuda_gemm_plan(&q, 50, ws.acc_elems, &p), NIB_ERR_INVALID_ARG);
        CHECK_MSG(strstr(nib_last_error(), "does not fit") != NULL, "INT4's 256-token tile: %s", nib_last_error());
        nib_clear_error();
        unsetenv("NIB_GEMM_FORCE");
        nib_dev_arena_free(&a);
        rand_w_free(&r4);
    }
    nib_cuda_gemm_ws_free(&ws);
}

/* The wgmma kernel (ops/cuda/gemm_lowbit_wg.cuh), forced at every token tile (16 .. 256), on
 * awkward shapes: N = 200 (a partial 128-row tile) and a GeGLU weight of 2 x 136 rows, K with a
 * partial last chunk (the X tiles past K arrive as zeros) and a full K = 1152, M below one tile,
 * one past it, and several tiles with a partial last one; 1, 2 and 3 K splits (partial sums
 * through the workspace, added in split order: the second call must match bitwise); X tiles
 * multicast over clusters of 2 CTAs (N = 200: two row tiles; 2 x 136: one, plus an idle CTA) or
 * not. The epilogues rotate over the cases: bias, GeGLU, gate + residual, in-place residual. INT4 (sym and
 * asym; K in whole groups of 128) runs the 64- to 192-token tiles, and is refused the 256-token one and with act-order. */
NIB_TEST(gemm_gpu_wgmma_tiles) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 512, 4096);
    static const int bts[] = {16, 32, 64, 128, 192, 256};
    static const int64_t ms[] = {1, 63, 193, 300};
    static const int64_t ks[] = {272, 1152};
    int runs = 0;
    double worst_all = 0.0;
    int i4_runs = 0;
    for (size_t fi = 0; fi < NIB_ARRAY_LEN(k_fmts); fi++) {
        const fmt_case *fc = &k_fmts[fi];
        const int i4 = fc->f == NIB_WFMT_INT4;
        for (size_t ki = 0; ki < NIB_ARRAY_LEN(ks); ki++) {
            const int64_t blk = i4 ? 128 : fc->f == NIB_WFMT_MXFP4 ? 32 : 16, kk = (ks[ki] + blk - 1) / blk * blk;
            for (int geglu = 0; geglu <= 1; geglu++) {
                rand_w rw;
                REQUIRE(make_rand_w(&rng, fc->f, geglu ? 2 * 136 : 200, kk, fc->asym, 0, fc->per_channel, !geglu, &rw));
                nib_dev_arena a;
                nib_qweight q;
                load_probe(t, &rw.w, geglu, &a, &q);
                nib_gemm_plan bad;
                CHECK_MSG(nib_cuda_gemm_wg_plan(&q, 300, 96, 1, 1, &bad) == NIB_ERR_INVALID_ARG, "a 96-token tile accepted");
                CHECK_MSG(nib_cuda_gemm_wg_plan(&q, 300, 64, (int)(q.kp / 128) + 1, 1, &bad) == NIB_ERR_INVALID_ARG,
                          "more K splits than chunks accepted");
                if (nib_cuda_gemm_wg_plan(&q, 300, 64, 1, 1, &bad) == NIB_OK) { /* a hand-edited plan is checked too */
                    bad.ksplit = (int)(q.kp / 128) + 1; /* (the pointers are not dereferenced before the check) */
                    void *fake = (void *)(uintptr_t)4096;
                    CHECK_MSG(nib_cuda_gemm_planned(&q, fake, 300, kk, fake, q.n_out, NULL, &ws, &bad, NULL) ==
                                  NIB_ERR_INVALID_ARG,
                              "a wgmma plan with more K splits than chunks accepted");
                }
                for (size_t bi = 0; bi < NIB_ARRAY_LEN(bts); bi++)
                    for (size_t mi = 0; mi < NIB_ARRAY_LEN(ms); mi++) {
                        nib_gemm_plan pl;
                        const int ksplit = 1 + (int)((mi + ki) % 3); /* 1, 2 or 3 K splits (K = 272: 3 chunks) */
                        /* X multicast over 2 CTAs, or none (the 16- and 32-token tiles: none, multicast refused) */
                        const int cm = bts[bi] < 64 ? 1 : 1 + (int)((mi + bi + geglu) % 2);
                        if (bts[bi] < 64 && mi == 0)
                            CHECK_MSG(nib_cuda_gemm_wg_plan(&q, ms[mi], bts[bi], ksplit, 2, &pl) == NIB_ERR_INVALID_ARG,
                                      "X multicast accepted with a %d-token tile", bts[bi]);
                        if (i4 && bts[bi] > 192) {
                            CHECK_MSG(nib_cuda_gemm_wg_plan(&q, ms[mi], bts[bi], ksplit, cm, &pl) == NIB_ERR_UNSUPPORTED,
                                      "INT4 accepted with a %d-token tile", bts[bi]);
                            continue;
                        }
                        CHECK_OK(nib_cuda_gemm_wg_plan(&q, ms[mi], bts[bi], ksplit, cm, &pl));
                        const int rot = (int)(mi + bi) % 3; /* plain (bias), gate + residual, in place */
                        case_opts o = {geglu, rot == 1, rot >= 1, rot == 2 && !geglu, &pl, NULL};
                        const double worst = run_case(t, &rng, &rw.w, ms[mi], &o, &ws, rot != 2);
                        CHECK_MSG(worst <= 1.0,
                                  "%s K=%lld geglu %d tile %d, %d K splits, cluster %d, M=%lld: err/bound %.3f", fc->name, (long long)kk, geglu, bts[bi], ksplit, cm, (long long)ms[mi], worst);
                        if (worst > worst_all) worst_all = worst;
                        runs++;
                        i4_runs += i4;
                    }
                nib_dev_arena_free(&a);
                rand_w_free(&rw);
            }
        }
    }
    printf("  %d wgmma cases (%d INT4), worst err/bound %.3f\n", runs, i4_runs, worst_all);
    CHECK_MSG(runs == 4 * 2 * 2 * 6 * 4 + 2 * 2 * 2 * 5 * 4 && i4_runs == 2 * 2 * 2 * 5 * 4, "ran %d cases (%d INT4)",
              runs, i4_runs);
    { /* INT4 with act-order (its input channels gathered) stays on the mma.sync kernel */
        rand_w rw;
        REQUIRE(make_rand_w(&rng, NIB_WFMT_INT4, 64, 256, 1, 1, 0, 0, &rw));
        nib_dev_arena a;
        nib_qweight q;
        load_probe(t, &rw.w, 0, &a, &q);
        nib_gemm_plan pl;
        CHECK_MSG(nib_cuda_gemm_wg_plan(&q, 300, 128, 1, 1, &pl) == NIB_ERR_UNSUPPORTED,
                  "act-order INT4 accepted by the wgmma kernel");
        CHECK_MSG(strstr(nib_last_error(), "with act-order") != NULL, "error names the act-order: %s", nib_last_error());
        nib_dev_arena_free(&a);
        rand_w_free(&rw);
    }
    nib_cuda_gemm_ws_free(&ws);
}

/* One case run twice on the same inputs, with NIB_GEMM_LEAN=0 (the general kernel) and =1: both within the
 * reference's bound, bitwise equal (guards included), and the second on a lean instantiation exactly when
 * want_lean. Returns the worst error/bound ratio. */
static double lean_pair(nib_test_ctx *t, nib_rng *rng, const nib_wsrc *w, int64_t m, const case_opts *o,
                        nib_gemm_ws *ws, int want_lean, const char *what) {
    const int64_t n_out = o->geglu ? w->n / 2 : w->n, vals = (m + 2) * (n_out + 8);
    uint16_t *y0 = nib_malloc((size_t)vals * 2), *y1 = nib_malloc((size_t)vals * 2);
    double worst = 0.0;
    if (!y0 || !y1) {
        nib_test_fail(t, __FILE__, __LINE__, "host allocation failed");
        goto out;
    }
    nib_rng r0 = *rng, r1 = *rng;
    setenv("NIB_GEMM_LEAN", "0", 1);
    long long before = nib_cuda_gemm_lean_launches();
    g_capture = y0;
    worst = run_case(t, &r0, w, m, o, ws, 0);
    CHECK_MSG(nib_cuda_gemm_lean_launches() == before, "%s M=%lld: a lean launch with NIB_GEMM_LEAN=0", what, (long long)m);
    setenv("NIB_GEMM_LEAN", "1", 1);
    before = nib_cuda_gemm_lean_launches();
    g_capture = y1;
    const double w1 = run_case(t, &r1, w, m, o, ws, 0);
    g_capture = NULL;
    unsetenv("NIB_GEMM_LEAN");
    *rng = r1;
    if (w1 > worst) worst = w1;
    const long long launched = nib_cuda_gemm_lean_launches() - before;
    CHECK_MSG(launched == (want_lean ? 1 : 0), "%s M=%lld: %lld lean launches, expected %d", what, (long long)m, launched,
              want_lean);
    int64_t diff = 0;
    for (int64_t i = 0; i < vals; i++) diff += y0[i] != y1[i];
    CHECK_MSG(diff == 0, "%s M=%lld: lean and general kernels differ in %lld of %lld values (guards included)", what,
              (long long)m, (long long)diff, (long long)vals);
out:
    nib_free(y0);
    nib_free(y1);
    return worst;
}

/* the first MT = 2 register-weight mma.sync plan at M = 10 for q (a failed check when there is none) */
static int mt2_reg_plan(nib_test_ctx *t, const nib_qweight *q, const nib_gemm_ws *ws, nib_gemm_plan *out) {
    static nib_gemm_plan pls[1024];
    const int np = nib_cuda_gemm_plans(q, 10, ws->acc_elems, pls, (int)NIB_ARRAY_LEN(pls));
    int p = 0;
    while (p < np && (pls[p].mt != 2 || pls[p].reg != 1 || pls[p].wgt)) p++;
    CHECK_MSG(p < np, "no MT = 2 register plan at M = 10");
    if (p < np) *out = pls[p];
    return p < np;
}

/* The two lab knobs below run one GeGLU product at M = 10 (N = 2 x 136, K = 1024, NVFP4) under several values of an
 * environment variable and require the same bits under each. */
typedef struct knob_probe {
    nib_rng rng;
    nib_gemm_ws ws;
    rand_w rw;
    nib_dev_arena a;
    nib_qweight q;
    int ok;
} knob_probe;

static void knob_probe_begin(nib_test_ctx *t, knob_probe *k) {
    memset(k, 0, sizeof *k);
    gemm_test_begin(t, &k->rng, &k->ws, 128, 2048);
    k->ok = make_rand_w(&k->rng, NIB_WFMT_NVFP4, 2 * 136, 1024, 0, 0, 0, 0, &k->rw);
    CHECK_MSG(k->ok, "random weight");
    if (k->ok) load_probe(t, &k->rw.w, 1, &k->a, &k->q);
}

static void knob_probe_end(knob_probe *k) {
    if (k->ok) {
        nib_dev_arena_free(&k->a);
        rand_w_free(&k->rw);
    }
    nib_cuda_gemm_ws_free(&k->ws);
}

/* vals[0] NULL (the knob unset) and n - 1 values: each run's output (guards included) against the unset run's */
static void knob_same_bits(nib_test_ctx *t, knob_probe *k, const case_opts *o, const char *knob, const char *const *vals,
                           int n) {
    const int64_t n_vals = 12 * (136 + 8);
    uint16_t *y0 = nib_malloc((size_t)n_vals * 2), *y = nib_malloc((size_t)n_vals * 2);
    for (int i = 0; i < n && y0 && y; i++) {
        nib_rng r = k->rng;
        if (vals[i]) setenv(knob, vals[i], 1);
        g_capture = i ? y : y0;
        const double worst = run_case(t, &r, &k->rw.w, 10, o, &k->ws, 0);
        g_capture = NULL;
        unsetenv(knob);
        CHECK_MSG(worst <= 1.0, "%s=%s: err/bound %.3f", knob, vals[i] ? vals[i] : "(unset)", worst);
        if (i) {
            int64_t diff = 0;
            for (int64_t j = 0; j < n_vals; j++) diff += y[j] != y0[j];
            CHECK_MSG(diff == 0, "%s=%s: %lld of %lld values differ from the unset run", knob, vals[i], (long long)diff,
                      (long long)n_vals);
        }
    }
    CHECK_MSG(y0 && y, "host allocation failed");
    nib_free(y0);
    nib_free(y);
}

/* NIB_GEMM_SMEM_PAD=BYTES[:N] (a lab knob: more dynamic shared memory per CTA, so one CTA an SM) changes where CTAs
 * land, never the numbers: a GeGLU product at M = 10 on an MT = 2 register plan, bitwise equal with the knob unset,
 * set for every launch, set for this weight's rows only and for other rows; bad values are errors naming it. */
NIB_TEST(gemm_gpu_smem_pad) {
    NIB_REQUIRE_GPU();
    knob_probe k;
    knob_probe_begin(t, &k);
    nib_gemm_plan pl;
    if (k.ok && mt2_reg_plan(t, &k.q, &k.ws, &pl)) {
        char own[64];
        snprintf(own, sizeof own, "120000:%lld", (long long)k.q.np);
        const char *vals[] = {NULL, "120000", own, "120000:64"};
        const case_opts o = {1, 0, 0, 0, &pl, NULL};
        knob_same_bits(t, &k, &o, "NIB_GEMM_SMEM_PAD", vals, 4);
        const char *bad[] = {"x", "5:", "120000:0", "300000", "-1"};
        void *dx = NULL, *dy = NULL;
        CHECK_OK(nib_dev_malloc(&dx, 10 * 1024 * 2, "x"));
        CHECK_OK(nib_dev_malloc(&dy, 10 * 136 * 2, "y"));
        nib_gemm_epi e;
        memset(&e, 0, sizeof e);
        e.geglu = 1;
        for (size_t i = 0; i < NIB_ARRAY_LEN(bad); i++) {
            setenv("NIB_GEMM_SMEM_PAD", bad[i], 1);
            const nib_status st = nib_cuda_gemm_planned(&k.q, dx, 10, 1024, dy, 136, &e, &k.ws, &pl, NULL);
            unsetenv("NIB_GEMM_SMEM_PAD");
            CHECK_MSG(st == NIB_ERR_INVALID_ARG && strstr(nib_last_error(), "NIB_GEMM_SMEM_PAD=") != NULL,
                      "NIB_GEMM_SMEM_PAD=%s gave status %d, error: %s", bad[i], (int)st, nib_last_error());
            nib_clear_error();
        }
        nib_dev_free(dx, 10 * 1024 * 2);
        nib_dev_free(dy, 10 * 136 * 2);
    }
    knob_probe_end(&k);
}

/* NIB_GEMM_XW=N (a lab knob: an mma.sync plan's X window re-planned to at most N pipeline steps) changes when X
 * arrives, never the numbers: the expert's gate|up plan (MT = 2, one warp along K, 4 steps a warp, forced) at M = 10
 * as a GeGLU product, bitwise equal with the knob unset and at 1, 2 and 3 steps; the planned window is what the knob
 * says; bad values are errors naming it. */
NIB_TEST(gemm_gpu_xw_knob) {
    NIB_REQUIRE_GPU();
    knob_probe k;
    knob_probe_begin(t, &k);
    if (k.ok) {
        char force[64];
        snprintf(force, sizeof force, "1024:%lld:10:2:1:1", (long long)k.q.np);
        setenv("NIB_GEMM_FORCE", force, 1);
        const char *vals[] = {NULL, "1", "2", "3"};
        const int want_xw[] = {4, 1, 2, 3};
        for (int i = 0; i < 4; i++) {
            if (vals[i]) setenv("NIB_GEMM_XW", vals[i], 1);
            nib_gemm_plan pl;
            memset(&pl, 0, sizeof pl);
            CHECK_OK(nib_cuda_gemm_plan(&k.q, 10, k.ws.acc_elems, &pl));
            unsetenv("NIB_GEMM_XW");
            CHECK_MSG(pl.mt == 2 && pl.wk == 1 && pl.ksplit == 1 && pl.xw == want_xw[i],
                      "NIB_GEMM_XW=%s: plan mt %d wk %d ks %d xw %d, want mt 2 wk 1 ks 1 xw %d",
                      vals[i] ? vals[i] : "(unset)", pl.mt, pl.wk, pl.ksplit, pl.xw, want_xw[i]);
        }
        const case_opts o = {1, 0, 0, 0, NULL, NULL};
        knob_same_bits(t, &k, &o, "NIB_GEMM_XW", vals, 4);
        const char *bad[] = {"x", "0", "65", "2x", "-1"};
        for (size_t i = 0; i < NIB_ARRAY_LEN(bad); i++) {
            setenv("NIB_GEMM_XW", bad[i], 1);
            nib_gemm_plan pl;
            const nib_status st = nib_cuda_gemm_plan(&k.q, 10, k.ws.acc_elems, &pl);
            unsetenv("NIB_GEMM_XW");
            CHECK_MSG(st == NIB_ERR_INVALID_ARG && strstr(nib_last_error(), "NIB_GEMM_XW=") != NULL,
                      "NIB_GEMM_XW=%s gave status %d, error: %s", bad[i], (int)st, nib_last_error());
            nib_clear_error();
        }
        unsetenv("NIB_GEMM_FORCE");
    }
    knob_probe_end(&k);
}

/* The lean instantiations (NIB_GEMM_LEAN: NVFP4 compiled for one epilogue kind and one K-split mode: the
 * mma.sync kernel's MT = 1 and MT = 2 register plans, the latter the action expert's products at H <= 16, its
 * MT = 1 bulk-ring plans (lean without GeGLU since the forty-ninth session's lean rule), and
 * the wgmma kernel's 64-token tiles, H = 50, and its 16- and 32-token tiles with one K split) against the general kernel: every MT = 1 / 2 register plan at
 * M = 1, 10, 16, 17 (two M chunks), 50, one K split and several; epilogues none, gate + residual (Pi0.5's o and down), the same in
 * place, GeGLU (gate|up); the wgmma tiles at M = 50 / 100 with 1, 3 and 8 K splits, in a cluster and through
 * the workspace; and launches that must stay on the general kernel (a bias; GeGLU with a gate and residual;
 * X multicast; other formats but INT4's MT = 1 plans with a plain epilogue, gate and residual included, which are lean too). The q|k|v kind is
 * gemm_gpu_qkv_epilogue's (its fused cases at MT = 2 run
 * lean). A bad NIB_GEMM_LEAN is an error naming it. */
NIB_TEST(gemm_gpu_lean_variants) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 128, 2048);
    const int64_t ms[] = {1, 10, 16, 17, 50};
    int cases = 0, lean_ks1 = 0, lean_ks2 = 0, wg_cases = 0, wg_kcl = 0, bulk_cases = 0, wg_small = 0;
    double worst = 0.0;
    for (int geglu = 0; geglu < 2; geglu++) {
        rand_w rw;
        /* N = 200 (a partial row group), K = 2048 (16 chunks); GeGLU 2 x 136 rows over K = 1152 (9 chunks) */
        REQUIRE(make_rand_w(&rng, NIB_WFMT_NVFP4, geglu ? 2 * 136 : 200, geglu ? 1152 : 2048, 0, 0, 0, 0, &rw));
        nib_dev_arena a;
        nib_qweight q;
        load_probe(t, &rw.w, geglu, &a, &q);
        for (size_t mi = 0; mi < NIB_ARRAY_LEN(ms); mi++) {
            static nib_gemm_plan pls[1024];
            const int np = nib_cuda_gemm_plans(&q, ms[mi], ws.acc_elems, pls, (int)NIB_ARRAY_LEN(pls));
            CHECK_MSG(np > 0 && np < (int)NIB_ARRAY_LEN(pls), "M=%lld: %d plans", (long long)ms[mi], np);
            for (int p = 0; p < np; p++) {
                /* register plans at MT = 1 and 2; bulk-ring plans at MT = 1 (lean without GeGLU) */
                const int bulk = pls[p].reg == 2 && pls[p].mt == 1;
                if ((pls[p].mt != 1 && pls[p].mt != 2) || (pls[p].reg != 1 && !bulk) || pls[p].wgt) continue;
                char what[96];
                snprintf(what, sizeof what, "%s mt%d wk%d ks%d mchunks%d%s", geglu ? "geglu" : "plain", pls[p].mt, pls[p].wk,
                         pls[p].ksplit, pls[p].m_chunks, bulk ? " bulkw" : "");
                if (bulk && geglu) { /* NVFP4 GeGLU with bulk rings: the general kernel */
                    const case_opts og = {1, 0, 0, 0, &pls[p], NULL};
                    worst = fmax(worst, lean_pair(t, &rng, &rw.w, ms[mi], &og, &ws, 0, what));
                    bulk_cases++;
                    continue;
                }
                const case_opts variants[3] = {{geglu, 0, 0, 0, &pls[p], NULL},
                                               {0, 1, 1, 0, &pls[p], NULL},
                                               {0, 1, 1, 1, &pls[p], NULL}};
                for (int v = 0; v < (geglu ? 1 : 3); v++) {
                    const double r = lean_pair(t, &rng, &rw.w, ms[mi], &variants[v], &ws, 1, what);
                    CHECK_MSG(r <= 1.0, "%s M=%lld epilogue %d: err/bound %.3f", what, (long long)ms[mi], v, r);
                    if (r > worst) worst = r;
                    cases++;
                    lean_ks1 += pls[p].ksplit == 1;
                    lean_ks2 += pls[p].ksplit > 1;
                    bulk_cases += bulk;
                }
                if (geglu) { /* GeGLU with a gate and residual: the general kernel */
                    const case_opts og = {1, 1, 1, 0, &pls[p], NULL};
                    worst = fmax(worst, lean_pair(t, &rng, &rw.w, ms[mi], &og, &ws, 0, what));
                }
            }
        }
        /* the wgmma kernel's 64-token tiles: one K split, splits reduced in their cluster and through the
         * workspace (wkcl = 0); X multicast (2-CTA clusters) stays on the general kernel */
        const int64_t wms[] = {50, 100};
        const int wks[] = {1, 3, 8};
        for (size_t mi = 0; mi < NIB_ARRAY_LEN(wms); mi++)
            for (size_t ki = 0; ki < NIB_ARRAY_LEN(wks); ki++)
                for (int kcl = 1; kcl >= 0; kcl--) {
                    if (wks[ki] == 1 && !kcl) continue;
                    nib_gemm_plan pl;
                    CHECK_OK(nib_cuda_gemm_wg_plan(&q, wms[mi], 64, wks[ki], 1, &pl));
                    if (!kcl) pl.wkcl = 0;
                    wg_kcl += pl.wkcl;
                    char what[96];
                    snprintf(what, sizeof what, "%s wgmma 64, %d K splits, kcl %d", geglu ? "geglu" : "plain", wks[ki],
                             pl.wkcl);
                    const case_opts variants[3] = {{geglu, 0, 0, 0, &pl, NULL}, {0, 1, 1, 0, &pl, NULL}, {0, 1, 1, 1, &pl, NULL}};
                    for (int v = 0; v < (geglu ? 1 : 3); v++) {
                        const double r = lean_pair(t, &rng, &rw.w, wms[mi], &variants[v], &ws, 1, what);
                        CHECK_MSG(r <= 1.0, "%s M=%lld epilogue %d: err/bound %.3f", what, (long long)wms[mi], v, r);
                        if (r > worst) worst = r;
                        wg_cases++;
                    }
                }
        /* the 16- and 32-token tiles: lean with one K split, general with several */
        const int sbt[] = {16, 32};
        const int64_t sms_[] = {1, 10, 16, 17, 32};
        for (size_t bi = 0; bi < NIB_ARRAY_LEN(sbt); bi++)
            for (size_t mi = 0; mi < NIB_ARRAY_LEN(sms_); mi++)
                for (int ksp = 1; ksp <= 2; ksp++) {
                    if (sms_[mi] > sbt[bi] && ksp == 2) continue;
                    nib_gemm_plan pl;
                    CHECK_OK(nib_cuda_gemm_wg_plan(&q, sms_[mi], sbt[bi], ksp, 1, &pl));
                    char what[96];
                    snprintf(what, sizeof what, "%s wgmma %d, %d K splits", geglu ? "geglu" : "plain", sbt[bi], ksp);
                    const case_opts variants[3] = {{geglu, 0, 0, 0, &pl, NULL}, {0, 1, 1, 0, &pl, NULL}, {0, 1, 1, 1, &pl, NULL}};
                    for (int v = 0; v < (geglu ? 1 : 3); v++) {
                        const double r = lean_pair(t, &rng, &rw.w, sms_[mi], &variants[v], &ws, ksp == 1, what);
                        CHECK_MSG(r <= 1.0, "%s M=%lld epilogue %d: err/bound %.3f", what, (long long)sms_[mi], v, r);
                        if (r > worst) worst = r;
                        wg_cases++;
                        wg_small += ksp == 1;
                    }
                }
        {
            nib_gemm_plan pl;
            CHECK_OK(nib_cuda_gemm_wg_plan(&q, 100, 64, 1, 2, &pl));
            const case_opts o = {geglu, 0, 0, 0, &pl, NULL};
            worst = fmax(worst, lean_pair(t, &rng, &rw.w, 100, &o, &ws, 0, "wgmma 64, X multicast"));
        }
        nib_dev_arena_free(&a);
        rand_w_free(&rw);
    }
    { /* a bias, and INT4: the general kernel at the same plans */
        rand_w rb, ri;
        REQUIRE(make_rand_w(&rng, NIB_WFMT_NVFP4, 200, 2048, 0, 0, 0, 1, &rb));
        REQUIRE(make_rand_w(&rng, NIB_WFMT_INT4, 200, 2048, 0, 0, 0, 0, &ri));
        const nib_wsrc *ws2[2] = {&rb.w, &ri.w};
        for (int i = 0; i < 2; i++) {
            nib_dev_arena a;
            nib_qweight q;
            load_probe(t, ws2[i], 0, &a, &q);
            static nib_gemm_plan pls[1024];
            const int np = nib_cuda_gemm_plans(&q, 10, ws.acc_elems, pls, (int)NIB_ARRAY_LEN(pls));
            int ran = 0;
            for (int p = 0; p < np && ran < 2; p++) {
                if (pls[p].mt != 2 || pls[p].reg != 1 || pls[p].wgt) continue;
                const case_opts o = {0, 1, 1, 0, &pls[p], NULL};
                worst = fmax(worst, lean_pair(t, &rng, ws2[i], 10, &o, &ws, 0, i ? "int4" : "nvfp4 with a bias"));
                ran++;
            }
            CHECK_MSG(ran > 0, "no MT = 2 register plan for %s at M = 10", i ? "INT4" : "NVFP4");
            if (i) { /* INT4's MT = 1 plans are lean (registers or bulk copies), with a gate and residual too */
                int lean_int4 = 0;
                for (int64_t m = 1; m <= 5; m += 4) {
                    const int n1 = nib_cuda_gemm_plans(&q, m, ws.acc_elems, pls, (int)NIB_ARRAY_LEN(pls));
                    for (int p = 0; p < n1; p++) {
                        if (pls[p].mt != 1 || !pls[p].reg || pls[p].wgt) continue;
                        char what[96];
                        snprintf(what, sizeof what, "int4 mt1 %s wk%d ks%d", pls[p].reg == 2 ? "bulkw" : "regw",
                                 pls[p].wk, pls[p].ksplit);
                        const case_opts plain = {0, 0, 0, 0, &pls[p], NULL}, gr = {0, 1, 1, 0, &pls[p], NULL};
                        const double r = lean_pair(t, &rng, ws2[i], m, &plain, &ws, 1, what);
                        CHECK_MSG(r <= 1.0, "%s M=%lld: err/bound %.3f", what, (long long)m, r);
                        const double r2 = lean_pair(t, &rng, ws2[i], m, &gr, &ws, 1, what);
                        CHECK_MSG(r2 <= 1.0, "%s M=%lld gate + residual: err/bound %.3f", what, (long long)m, r2);
                        worst = fmax(worst, fmax(r, r2));
                        lean_int4++;
                    }
                }
                CHECK_MSG(lean_int4 > 0, "no INT4 MT = 1 register / bulk plan at M = 1, 5");
                printf("  %d INT4 MT = 1 plans lean\n", lean_int4);
            }
            nib_dev_arena_free(&a);
        }
        rand_w_free(&rb);
        rand_w_free(&ri);
    }
    { /* the planner's lean rule (ops/gemm_plan.c) through nib_cuda_gemm_plan: an INT4 weight with a long K at
       * M = 1 (16384 -> 2048's kind; here 8192 -> 2048) takes one K split, 8 warps along K and bulk rings where the lean kernel
       * runs, the long-K rule's K split with NIB_GEMM_LEAN=0 or act-order (no lean kernel); NVFP4 at M = 1
       * with one K split and 4+ steps per warp (2048 -> 16384: wk1, 8 steps) takes the bulk rings, with
       * NIB_GEMM_LEAN=0 register weights */
        rand_w r4, r4p, rn;
        REQUIRE(make_rand_w(&rng, NIB_WFMT_INT4, 2048, 8192, 0, 0, 0, 0, &r4));
        REQUIRE(make_rand_w(&rng, NIB_WFMT_INT4, 2048, 8192, 0, 1, 0, 0, &r4p));
        REQUIRE(make_rand_w(&rng, NIB_WFMT_NVFP4, 16384, 2048, 0, 0, 0, 0, &rn));
        nib_dev_arena a4, a4p, an;
        nib_qweight q4, q4p, qn;
        load_probe(t, &r4.w, 0, &a4, &q4);
        load_probe(t, &r4p.w, 0, &a4p, &q4p);
        load_probe(t, &rn.w, 0, &an, &qn);
        nib_gemm_plan pl, pl0, plp, pln, pln0;
        CHECK_OK(nib_cuda_gemm_plan(&q4, 1, ws.acc_elems, &pl));
        CHECK_OK(nib_cuda_gemm_plan(&q4p, 1, ws.acc_elems, &plp));
        CHECK_OK(nib_cuda_gemm_plan(&qn, 1, ws.acc_elems, &pln));
        setenv("NIB_GEMM_LEAN", "0", 1);
        CHECK_OK(nib_cuda_gemm_plan(&q4, 1, ws.acc_elems, &pl0));
        CHECK_OK(nib_cuda_gemm_plan(&qn, 1, ws.acc_elems, &pln0));
        unsetenv("NIB_GEMM_LEAN");
        CHECK_MSG(pl.ksplit == 1 && pl.wk == 8 && pl.reg == 2, "INT4 8192 -> 2048, M = 1, lean: wk%d ks%d reg%d", pl.wk,
                  pl.ksplit, pl.reg);
        CHECK_MSG(pl0.ksplit > 1 && plp.ksplit > 1, "INT4 8192 -> 2048, M = 1 without the lean kernel: ks%d / ks%d (act-order)",
                  pl0.ksplit, plp.ksplit);
        CHECK_MSG(pln.ksplit == 1 && pln.reg == 2 && pln0.ksplit == 1 && pln0.reg == 1,
                  "NVFP4 2048 -> 16384, M = 1: ks%d reg%d lean, ks%d reg%d not", pln.ksplit, pln.reg, pln0.ksplit, pln0.reg);
        /* the plain product on the lean rule's plans (one lean launch each), against the reference, twice bitwise */
        const case_opts plain = {0, 0, 0, 0, NULL, NULL};
        const rand_w *pw[2] = {&r4, &rn};
        for (int i = 0; i < 2; i++) {
            const long long before = nib_cuda_gemm_lean_launches();
            const double r = run_case(t, &rng, &pw[i]->w, 1, &plain, &ws, 1);
            CHECK_MSG(r <= 1.0, "%s by the planner: err/bound %.3f", i ? "nvfp4" : "int4", r);
            CHECK_MSG(nib_cuda_gemm_lean_launches() - before == 2, "%s by the planner: %lld lean launches, expected 2",
                      i ? "nvfp4" : "int4", nib_cuda_gemm_lean_launches() - before);
            worst = fmax(worst, r);
        }
        nib_dev_arena_free(&a4);
        nib_dev_arena_free(&a4p);
        nib_dev_arena_free(&an);
        rand_w_free(&r4);
        rand_w_free(&r4p);
        rand_w_free(&rn);
    }
    { /* a bad value of NIB_GEMM_LEAN is an error naming it, not a silent choice */
        rand_w rw;
        REQUIRE(make_rand_w(&rng, NIB_WFMT_NVFP4, 64, 1024, 0, 0, 0, 0, &rw));
        nib_dev_arena a;
        nib_qweight q;
        load_probe(t, &rw.w, 0, &a, &q);
        nib_gemm_plan pl;
        if (mt2_reg_plan(t, &q, &ws, &pl)) {
            void *dx = NULL, *dy = NULL;
            CHECK_OK(nib_dev_malloc(&dx, 10 * 1024 * 2, "x"));
            CHECK_OK(nib_dev_malloc(&dy, 10 * 64 * 2, "y"));
            setenv("NIB_GEMM_LEAN", "2", 1);
            const nib_status st = nib_cuda_gemm_planned(&q, dx, 10, 1024, dy, 64, NULL, &ws, &pl, NULL);
            unsetenv("NIB_GEMM_LEAN");
            CHECK_MSG(st != NIB_OK && strstr(nib_last_error(), "NIB_GEMM_LEAN=2") != NULL,
                      "NIB_GEMM_LEAN=2 gave status %d, error: %s", (int)st, nib_last_error());
            nib_clear_error();
            nib_dev_free(dx, 10 * 1024 * 2);
            nib_dev_free(dy, 10 * 64 * 2);
        }
        nib_dev_arena_free(&a);
        rand_w_free(&rw);
    }
    printf("  %d lean mma.sync cases (%d with one K split, %d with several), %d wgmma cases (%d plans with the splits "
           "in a cluster), worst err/bound %.3f\n", cases, lean_ks1, lean_ks2, wg_cases, wg_kcl, worst);
    CHECK_MSG(lean_ks1 > 0 && lean_ks2 > 0, "both K-split modes of the lean kernels must be exercised (%d / %d)",
              lean_ks1, lean_ks2);
    CHECK_MSG(wg_kcl > 0, "the wgmma kernel's cluster K split must be exercised");
    CHECK_MSG(wg_small == 2 * 5 * 3 + 2 * 5, "%d lean cases of the 16- and 32-token tiles", wg_small);
    CHECK_MSG(bulk_cases > 0, "NVFP4's MT = 1 bulk-ring plans must be exercised");
    printf("  %d NVFP4 MT = 1 bulk-ring cases\n", bulk_cases);
    nib_cuda_gemm_ws_free(&ws);
}

NIB_TEST(gemm_gpu_epilogues) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 1024, 4096);
    const nib_wfmt fs[] = {NIB_WFMT_NVFP4, NIB_WFMT_INT4};
    for (size_t i = 0; i < NIB_ARRAY_LEN(fs); i++) {
        rand_w rw;
        /* bias + residual (separate buffer), bias + gate + in-place residual */
        REQUIRE(make_rand_w(&rng, fs[i], 200, 1152, 0, 0, 0, 1, &rw));
        case_opts o1 = {0, 0, 1, 0, NULL, NULL}, o2 = {0, 1, 1, 1, NULL, NULL};
        run_case(t, &rng, &rw.w, 17, &o1, &ws, 1);
        run_case(t, &rng, &rw.w, 5, &o2, &ws, 0);
        rand_w_free(&rw);
        /* GeGLU over a fused gate|up weight: without and with split-K */
        REQUIRE(make_rand_w(&rng, fs[i], 2 * 136, 1152, 1, 0, 0, 1, &rw));
        case_opts og = {1, 0, 0, 0, NULL, NULL}, ogr = {1, 1, 1, 0, NULL, NULL};
        run_case(t, &rng, &rw.w, 1, &og, &ws, 1);
        run_case(t, &rng, &rw.w, 17, &ogr, &ws, 1);
        rand_w_free(&rw);
        REQUIRE(make_rand_w(&rng, fs[i], 2 * 64, 16384, 0, 0, 0, 0, &rw));
        run_case(t, &rng, &rw.w, 3, &og, &ws, 1);
        rand_w_free(&rw);
    }
    nib_cuda_gemm_ws_free(&ws);
}

NIB_TEST(gemm_gpu_int4_act_order) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 1024, 4096);
    rand_w rw;
    REQUIRE(make_rand_w(&rng, NIB_WFMT_INT4, 72, 512, 1, 1, 0, 0, &rw));
    case_opts o = {0, 0, 0, 0, NULL, NULL};
    run_case(t, &rng, &rw.w, 1, &o, &ws, 1);
    run_case(t, &rng, &rw.w, 17, &o, &ws, 0);
    rand_w_free(&rw);
    nib_cuda_gemm_ws_free(&ws);
}

NIB_TEST(gemm_gpu_rejects_bad_weights) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    rand_w rw;
    nib_dev_arena a;
    CHECK_OK(nib_dev_arena_init(&a, 1 << 20, "bad weights"));
    nib_qweight q;
    /* NaN E4M3 block scale */
    REQUIRE(make_rand_w(&rng, NIB_WFMT_NVFP4, 32, 256, 0, 0, 0, 0, &rw));
    rw.scales[37] = 0x7F;
    CHECK_ST(nib_cuda_weight_load(&rw.w, 0, "layers.3.mlp.down_proj", &a, &q), NIB_ERR_NUMERICS);
    CHECK(strstr(nib_last_error(), "layers.3.mlp.down_proj") != NULL);
    rand_w_free(&rw);
    nib_dev_arena_reset(&a);
    /* E8M0 NaN */
    REQUIRE(make_rand_w(&rng, NIB_WFMT_MXFP4, 32, 256, 0, 0, 0, 0, &rw));
    rw.scales[5] = 0xFF;
    CHECK_ST(nib_cuda_weight_load(&rw.w, 0, "mx.weight", &a, &q), NIB_ERR_NUMERICS);
    rand_w_free(&rw);
    nib_dev_arena_reset(&a);
    /* K not a multiple of the block */
    REQUIRE(make_rand_w(&rng, NIB_WFMT_NVFP4, 32, 256, 0, 0, 0, 0, &rw));
    rw.w.k = 248;
    CHECK_ST(nib_cuda_weight_load(&rw.w, 0, "odd.weight", &a, &q), NIB_ERR_SHAPE);
    CHECK(strstr(nib_last_error(), "odd.weight") != NULL);
    rand_w_free(&rw);
    nib_dev_arena_reset(&a);
    /* an arena too small is an out-of-memory error naming the tensor, not a crash */
    REQUIRE(make_rand_w(&rng, NIB_WFMT_INT4, 256, 1024, 0, 0, 0, 0, &rw));
    nib_dev_arena small;
    CHECK_OK(nib_dev_arena_init(&small, 4096, "tiny slab"));
    CHECK_ST(nib_cuda_weight_load(&rw.w, 0, "big.weight", &small, &q), NIB_ERR_DEVICE_OOM);
    nib_dev_arena_free(&small);
    rand_w_free(&rw);
    nib_dev_arena_free(&a);
}

/* cuBLASLt bf16 and FP8 W8A8 against the reference on the same inputs. The output is filled
 * with bf16 NaN (0xFFFF) before each product, so an element the product does not write fails
 * the comparison (and compute-sanitizer initcheck, which does not see cuBLASLt's stores, sees
 * the buffer as written). */
NIB_TEST(blas_gpu_bf16_and_fp8_w8a8) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t m = 37, n = 272, k = 1152;
    nib_blas *b = NULL;
    CHECK_OK(nib_blas_create(&b));
    REQUIRE(b);
    uint16_t *hx = nib_malloc((size_t)m * k * 2), *hw = nib_malloc((size_t)n * k * 2), *hy = nib_malloc((size_t)m * n * 2);
    uint8_t *hwq = nib_malloc((size_t)n * k), *hxq = nib_malloc((size_t)m * k);
    float *hsw = nib_malloc((size_t)n * 4), *hsx = nib_malloc((size_t)m * 4 + 8), *wf = nib_malloc((size_t)n * k * 4);
    double *ref = nib_malloc((size_t)m * n * 8), *absr = nib_malloc((size_t)m * n * 8);
    REQUIRE(hx && hw && hy && hwq && hxq && hsw && hsx && wf && ref && absr);
    for (int64_t i = 0; i < m * k; i++) hx[i] = nib_f32_to_bf16((float)nib_rng_normal(&rng));
    for (int64_t i = 0; i < n * k; i++) wf[i] = (float)(0.05 * nib_rng_normal(&rng));
    for (int64_t i = 0; i < n * k; i++) hw[i] = nib_f32_to_bf16(wf[i]);
    CHECK_OK(nib_fp8_quantize(wf, n, k, 1, hwq, hsw));
    void *dx, *dw, *dy, *dwq, *dxq;
    float *dsw, *dsx;
    CHECK_OK(nib_dev_malloc(&dx, (size_t)m * k * 2, "x"));
    CHECK_OK(nib_dev_malloc(&dw, (size_t)n * k * 2, "w"));
    CHECK_OK(nib_dev_malloc(&dy, (size_t)m * n * 2, "y"));
    CHECK_OK(nib_dev_malloc(&dwq, (size_t)n * k, "wq"));
    CHECK_OK(nib_dev_malloc(&dxq, (size_t)m * k, "xq"));
    CHECK_OK(nib_dev_malloc((void **)&dsw, (size_t)n * 4, "sw"));
    CHECK_OK(nib_dev_malloc((void **)&dsx, (size_t)m * 4 + 8, "sx"));
    CHECK_OK(nib_dev_upload(dx, hx, (size_t)m * k * 2));
    CHECK_OK(nib_dev_upload(dw, hw, (size_t)n * k * 2));
    CHECK_OK(nib_dev_upload(dwq, hwq, (size_t)n * k));
    CHECK_OK(nib_dev_upload(dsw, hsw, (size_t)n * 4));

    /* bf16: reference on the same bf16 weights */
    nib_wsrc wb = {.fmt = NIB_WFMT_BF16, .n = n, .k = k, .data = hw};
    CHECK_OK(nib_dev_memset(dy, 0xFF, (size_t)m * n * 2)); /* NaN: an unwritten output fails */
    CHECK_OK(nib_blas_gemm_bf16(b, dx, dw, dy, m, n, k, NULL));
    CHECK_OK(nib_dev_download(hy, dy, (size_t)m * n * 2));
    CHECK_OK(nib_ref_gemm(&wb, hx, m, k, NULL, ref, absr));
    int over = 0;
    for (int64_t i = 0; i < m * n; i++) {
        double y = nib_bf16_to_f32(hy[i]);
        double bound = 0x1p-8 * fabs(ref[i]) * 1.01 + (k + 64) * 0x1p-22 * absr[i];
        if (!(fabs(y - ref[i]) <= bound) && over++ < 5)
            nib_test_fail(t, __FILE__, __LINE__, "bf16 [%lld]: %g vs %g", (long long)i, y, ref[i]);
    }
    /* FP8 W8A8: X quantized per token on the GPU; the reference uses exactly those codes.
     * First with promotion to fp32 (the bound of an fp32 accumulation), then fast accumulation */
    CHECK(nib_blas_fp8_fast_accum(b) == 1 || getenv("NIB_BLAS_FAST_ACCUM")); /* the default */
    nib_blas_set_fp8_fast_accum(b, 0);
    CHECK_OK(nib_cuda_quantize_fp8_rows(dx, m, k, 1, dxq, dsx, NULL));
    CHECK_OK(nib_dev_memset(dy, 0xFF, (size_t)m * n * 2)); /* NaN: an unwritten output fails */
    CHECK_OK(nib_blas_gemm_fp8(b, dxq, dsx, 1, dwq, dsw, 1, dy, m, n, k, NULL));
    CHECK_OK(nib_dev_download(hy, dy, (size_t)m * n * 2));
    CHECK_OK(nib_dev_download(hxq, dxq, (size_t)m * k));
    CHECK_OK(nib_dev_download(hsx, dsx, (size_t)m * 4));
    /* the activation quantizer itself: scale = amax/448 and codes = RNE-satfinite(x/scale) */
    int qbad = 0;
    for (int64_t i = 0; i < m; i++) {
        float amax = 0;
        for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(nib_bf16_to_f32(hx[i * k + j])));
        if (fabsf(hsx[i] - amax / 448.0f) > 1e-6f * hsx[i]) qbad++;
        for (int64_t j = 0; j < k; j++) {
            uint8_t want = nib_f32_to_e4m3(nib_bf16_to_f32(hx[i * k + j]) / hsx[i]);
            if (want != hxq[i * k + j]) qbad++;
        }
    }
    CHECK_MSG(qbad == 0, "%d per-token fp8 quantizer mismatches vs formats/ (scale or code)", qbad);
    over = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, a = 0;
            for (int64_t q = 0; q < k; q++) {
                double tt = (double)nib_e4m3_to_f32(hxq[i * k + q]) * hsx[i] * (double)nib_e4m3_to_f32(hwq[j * k + q]) * hsw[j];
                s += tt;
                a += fabs(tt);
            }
            double y = nib_bf16_to_f32(hy[i * n + j]);
            double bound = 0x1p-8 * fabs(s) * 1.01 + (k + 64) * 0x1p-22 * a;
            if (!(fabs(y - s) <= bound) && over++ < 5)
                nib_test_fail(t, __FILE__, __LINE__, "fp8 [%lld,%lld]: %g vs %g (bound %g)", (long long)i, (long long)j, y, s, bound);
        }
    /* Fast accumulation: Hopper's FP8 tensor-core accumulator keeps 13 mantissa bits and
     * truncates (e8m13; the software emulations that match it bit for bit drop 10 of fp32's 23
     * bits). Bound: one truncation of the running sum (< 2^-13 of its magnitude) per 16 products,
     * doubled for the alignment of the products inside a group: 2^-12 (sum over groups of
     * |prefix sum| + sum |terms|), plus the bf16 output rounding. The prefix sums are taken in K
     * order (the order the K loop visits). */
    nib_blas_set_fp8_fast_accum(b, 1);
    CHECK(nib_blas_fp8_fast_accum(b) == 1);
    CHECK_OK(nib_dev_memset(dy, 0xFF, (size_t)m * n * 2)); /* NaN: an unwritten output fails */
    CHECK_OK(nib_blas_gemm_fp8(b, dxq, dsx, 1, dwq, dsw, 1, dy, m, n, k, NULL));
    CHECK_OK(nib_dev_download(hy, dy, (size_t)m * n * 2));
    over = 0;
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, a = 0, run = 0;
            for (int64_t q = 0; q < k; q++) {
                double tt = (double)nib_e4m3_to_f32(hxq[i * k + q]) * hsx[i] * (double)nib_e4m3_to_f32(hwq[j * k + q]) * hsw[j];
                s += tt;
                a += fabs(tt);
                if (q % 16 == 15 || q == k - 1) run += fabs(s);
            }
            double y = nib_bf16_to_f32(hy[i * n + j]);
            double bound = 0x1p-8 * fabs(s) * 1.01 + 0x1p-12 * (run + a);
            if (fabs(y - s) / bound > worst) worst = fabs(y - s) / bound;
            if (!(fabs(y - s) <= bound) && over++ < 5)
                nib_test_fail(t, __FILE__, __LINE__, "fp8 fast accumulation [%lld,%lld]: %g vs %g (bound %g)",
                              (long long)i, (long long)j, y, s, bound);
        }
    printf("  fp8 fast accumulation (K %lld): worst error / bound %.3f\n", (long long)k, worst);
    nib_blas_set_fp8_fast_accum(b, 0);
    /* FP8 with scalar (per-tensor) scales, as used by the peak-throughput lab: same codes,
     * the first row's and the first channel's scales for the whole tensor */
    CHECK_OK(nib_dev_memset(dy, 0xFF, (size_t)m * n * 2)); /* NaN: an unwritten output fails */
    CHECK_OK(nib_blas_gemm_fp8(b, dxq, dsx, 0, dwq, dsw, 0, dy, m, n, k, NULL));
    CHECK_OK(nib_dev_download(hy, dy, (size_t)m * n * 2));
    over = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, a = 0;
            for (int64_t q = 0; q < k; q++) {
                double tt = (double)nib_e4m3_to_f32(hxq[i * k + q]) * hsx[0] * (double)nib_e4m3_to_f32(hwq[j * k + q]) * hsw[0];
                s += tt;
                a += fabs(tt);
            }
            double y = nib_bf16_to_f32(hy[i * n + j]);
            double bound = 0x1p-8 * fabs(s) * 1.01 + (k + 64) * 0x1p-22 * a;
            if (!(fabs(y - s) <= bound) && over++ < 5)
                nib_test_fail(t, __FILE__, __LINE__, "fp8 scalar [%lld,%lld]: %g vs %g (bound %g)", (long long)i,
                              (long long)j, y, s, bound);
        }
    nib_dev_free(dx, (size_t)m * k * 2);
    nib_dev_free(dw, (size_t)n * k * 2);
    nib_dev_free(dy, (size_t)m * n * 2);
    nib_dev_free(dwq, (size_t)n * k);
    nib_dev_free(dxq, (size_t)m * k);
    nib_dev_free(dsw, (size_t)n * 4);
    nib_dev_free(dsx, (size_t)m * 4 + 8);
    nib_blas_free(b);
    nib_free(hx);
    nib_free(hw);
    nib_free(hy);
    nib_free(hwq);
    nib_free(hxq);
    nib_free(hsw);
    nib_free(hsx);
    nib_free(wf);
    nib_free(ref);
    nib_free(absr);
}

/* cuBLASLt's FP8 algorithm reconfigured by nib_blas_tune_for (other tiles, custom option and
 * cluster shape than its heuristic picks) at the Gemma down projection, gate|up, q|k|v and o and
 * SigLIP's q|k|v, fc1 and fc2, at the row counts of 1, 2 and 3 cameras: against fp64 sums of the
 * same codes on a sample of rows (all columns), with the fast-accumulation bound of
 * blas_gpu_bf16_and_fp8_w8a8; with the model's epilogues: SigLIP's bias, and the residual in place
 * (C = Y: the product is rounded to bf16, then C added and rounded again) for the down projection,
 * o and fc2. cuBLASLt checks a configuration against the epilogue, so each case also checks that
 * the reconfigured algorithm ran. Guard columns past N stay untouched. */
/* e4m3 codes of scale * N(0, 1), filled in parallel: chunk c (2^16 values) draws from its own
 * generator seeded from (seed, c), so the data depends on the seed only, not on the thread count */
typedef struct e4m3_fill {
    uint8_t *dst;
    int64_t n;
    double scale;
    uint64_t seed;
} e4m3_fill;
static void e4m3_fill_chunks(void *ctx, int64_t b, int64_t e) {
    const e4m3_fill *f = (const e4m3_fill *)ctx;
    for (int64_t c = b; c < e; c++) {
        nib_rng r;
        nib_rng_seed(&r, f->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(c + 1)));
        const int64_t i1 = (c + 1) << 16 < f->n ? (c + 1) << 16 : f->n;
        for (int64_t i = c << 16; i < i1; i++) f->dst[i] = nib_f32_to_e4m3((float)(f->scale * nib_rng_normal(&r)));
    }
}
static void fill_e4m3(nib_rng *rng, uint8_t *dst, int64_t n, double scale) {
    e4m3_fill f = {dst, n, scale, nib_rng_u64(rng)};
    nib_parallel_for((n + 0xFFFF) >> 16, 0, 1, e4m3_fill_chunks, &f);
}
/* fp64 sums of an FP8 product for the sampled rows (the same expression as one loop would use),
 * in parallel over (row, column): s = sum, ab = sum of |terms|, run = sum over 16-term steps of the
 * running |sum| (the fast-accumulation bound's term) */
typedef struct fp8_ref {
    const uint8_t *xq, *wq;
    const float *sx, *sw;
    const int64_t *rows;
    int64_t n, k;
    float lut[256];
    double *s, *ab, *run;
} fp8_ref;
static void fp8_ref_outputs(void *ctx, int64_t b, int64_t e) {
    fp8_ref *r = (fp8_ref *)ctx;
    for (int64_t o = b; o < e; o++) {
        const int64_t i = r->rows[o / r->n], j = o % r->n;
        double s = 0, ab = 0, run = 0;
        for (int64_t q = 0; q < r->k; q++) {
            double tt = (double)r->lut[r->xq[i * r->k + q]] * r->sx[i] * (double)r->lut[r->wq[j * r->k + q]] * r->sw[j];
            s += tt;
            ab += fabs(tt);
            if (q % 16 == 15 || q == r->k - 1) run += fabs(s);
        }
        r->s[o] = s, r->ab[o] = ab, r->run[o] = run;
    }
}

NIB_TEST(blas_gpu_fp8_tuned_configs) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    if (!nib_blas_tune_on()) {
        printf("  NIB_BLAS_TUNE=0: the reconfigurations are off, nothing to test here\n");
        return;
    }
    /* the model's epilogues: SigLIP's products carry a bias (fc2 also the residual, in place) */
    struct {
        int64_t m, n, k;
        int inplace, bias;
    } cs[] = {{276, 2048, 16384, 0, 0}, {532, 2048, 16384, 1, 0}, {788, 2048, 16384, 1, 0}, {300, 32768, 2048, 0, 0},
              {532, 32768, 2048, 0, 0}, {788, 32768, 2048, 0, 0}, {512, 1152, 4304, 1, 1},  {532, 2560, 2048, 0, 0},
              {540, 2048, 2048, 1, 0},  {256, 1152, 4304, 1, 1},  {768, 1152, 4304, 1, 1},  {768, 3456, 1152, 0, 1},
              {256, 4304, 1152, 0, 1},  {768, 4304, 1152, 0, 1},  {276, 2560, 2048, 0, 0}, {788, 2560, 2048, 0, 0}};
    const int ncs = (int)(sizeof cs / sizeof cs[0]);
    nib_blas *b = NULL;
    CHECK_OK(nib_blas_create(&b));
    REQUIRE(b);
    CHECK(nib_blas_fp8_fast_accum(b) == 1 || getenv("NIB_BLAS_FAST_ACCUM"));
    for (int ci = 0; ci < ncs; ci++) {
        const int64_t m = cs[ci].m, n = cs[ci].n, k = cs[ci].k, ldy = n + 8;
        nib_blas_tune tune;
        CHECK(nib_blas_tune_for(1, m, n, k, 132, &tune) == 1); /* the shapes the rule covers */
        uint8_t *hxq = nib_malloc((size_t)m * k), *hwq = nib_malloc((size_t)n * k);
        float *hsx = nib_malloc((size_t)m * 4), *hsw = nib_malloc((size_t)n * 4);
        uint16_t *hy = nib_malloc((size_t)m * ldy * 2), *hc = nib_malloc((size_t)m * ldy * 2);
        uint16_t *hb = nib_malloc((size_t)n * 2);
        REQUIRE(hxq && hwq && hsx && hsw && hy && hc && hb);
        for (int64_t j = 0; j < n; j++) hb[j] = nib_f32_to_bf16((float)(0.5 * nib_rng_normal(&rng)));
        fill_e4m3(&rng, hxq, m * k, 64.0);
        fill_e4m3(&rng, hwq, n * k, 64.0);
        for (int64_t i = 0; i < m; i++) hsx[i] = (float)(0.01 * (1.0 + nib_rng_uniform(&rng)));
        for (int64_t i = 0; i < n; i++) hsw[i] = (float)(0.0005 * (1.0 + nib_rng_uniform(&rng)));
        for (int64_t i = 0; i < m * ldy; i++)
            hc[i] = (i % ldy) < n && cs[ci].inplace ? nib_f32_to_bf16((float)nib_rng_normal(&rng)) : (uint16_t)POISON;
        void *dxq, *dwq, *dy, *db;
        float *dsx, *dsw;
        CHECK_OK(nib_dev_malloc(&db, (size_t)n * 2, "bias"));
        CHECK_OK(nib_dev_upload(db, hb, (size_t)n * 2));
        CHECK_OK(nib_dev_malloc(&dxq, (size_t)m * k, "xq"));
        CHECK_OK(nib_dev_malloc(&dwq, (size_t)n * k, "wq"));
        CHECK_OK(nib_dev_malloc(&dy, (size_t)m * ldy * 2, "y"));
        CHECK_OK(nib_dev_malloc((void **)&dsx, (size_t)m * 4, "sx"));
        CHECK_OK(nib_dev_malloc((void **)&dsw, (size_t)n * 4, "sw"));
        CHECK_OK(nib_dev_upload(dxq, hxq, (size_t)m * k));
        CHECK_OK(nib_dev_upload(dwq, hwq, (size_t)n * k));
        CHECK_OK(nib_dev_upload(dsx, hsx, (size_t)m * 4));
        CHECK_OK(nib_dev_upload(dsw, hsw, (size_t)n * 4));
        CHECK_OK(nib_dev_upload(dy, hc, (size_t)m * ldy * 2)); /* the residual (in place) or the guard */
        const int before = nib_blas_tuned_plans(b);
        nib_blas_set_fp8_engine(b, NIB_FP8_ENGINE_CUBLASLT);
        nib_blas_gemm_args a = {1, dxq, dsx, 1, dwq, dsw, 1, m, n, k, cs[ci].bias ? db : NULL,
                                cs[ci].inplace ? dy : NULL, ldy, dy, ldy};
        CHECK_OK(nib_blas_gemm_fused(b, &a, NULL));
        nib_blas_set_fp8_engine(b, NIB_FP8_ENGINE_AUTO);
        CHECK_MSG(nib_blas_tuned_plans(b) == before + 1, "M=%lld N=%lld K=%lld did not run the reconfigured algorithm",
                  (long long)m, (long long)n, (long long)k);
        CHECK_OK(nib_dev_download(hy, dy, (size_t)m * ldy * 2));
        const int64_t rows[] = {0, m / 2, m - 2, m - 1};
        int over = 0, guard = 0;
        double worst = 0;
        static fp8_ref ref;
        ref.xq = hxq, ref.wq = hwq, ref.sx = hsx, ref.sw = hsw, ref.rows = rows, ref.n = n, ref.k = k;
        for (int c = 0; c < 256; c++) ref.lut[c] = nib_e4m3_to_f32((uint8_t)c);
        ref.s = nib_malloc((size_t)(4 * n) * 8), ref.ab = nib_malloc((size_t)(4 * n) * 8), ref.run = nib_malloc((size_t)(4 * n) * 8);
        REQUIRE(ref.s && ref.ab && ref.run);
        nib_parallel_for(4 * n, 0, 64, fp8_ref_outputs, &ref);
        for (int ri = 0; ri < 4; ri++) {
            const int64_t i = rows[ri];
            for (int64_t j = 0; j < ldy; j++) {
                const uint16_t got = hy[i * ldy + j];
                if (j >= n) {
                    guard += got != (uint16_t)POISON;
                    continue;
                }
                const double s = ref.s[ri * n + j], ab = ref.ab[ri * n + j], run = ref.run[ri * n + j];
                const double c = cs[ci].inplace ? nib_bf16_to_f32(hc[i * ldy + j]) : 0.0;
                const double bb = cs[ci].bias ? nib_bf16_to_f32(hb[j]) : 0.0;
                const double y = nib_bf16_to_f32(got), want = s + bb + c;
                const double bound = 0x1p-8 * (fabs(s) + fabs(bb) + fabs(want)) * 1.01 + 0x1p-12 * (run + ab);
                if (fabs(y - want) / bound > worst) worst = fabs(y - want) / bound;
                if (!(fabs(y - want) <= bound) && over++ < 5)
                    nib_test_fail(t, __FILE__, __LINE__, "M=%lld N=%lld K=%lld [%lld,%lld]: %g vs %g (bound %g)",
                                  (long long)m, (long long)n, (long long)k, (long long)i, (long long)j, y, want, bound);
            }
        }
        nib_free(ref.s), nib_free(ref.ab), nib_free(ref.run);
        CHECK_MSG(guard == 0, "%d guard values past N overwritten", guard);
        printf("  M=%lld N=%lld K=%lld tile %d custom %d cluster %d%s%s: worst error / bound %.3f\n", (long long)m,
               (long long)n, (long long)k, tune.tile, tune.custom, tune.cluster, cs[ci].bias ? " (bias)" : "",
               cs[ci].inplace ? " (in place)" : "", worst);
        nib_dev_free(db, (size_t)n * 2);
        nib_dev_free(dxq, (size_t)m * k);
        nib_dev_free(dwq, (size_t)n * k);
        nib_dev_free(dy, (size_t)m * ldy * 2);
        nib_dev_free(dsx, (size_t)m * 4);
        nib_dev_free(dsw, (size_t)n * 4);
        nib_free(hxq);
        nib_free(hwq);
        nib_free(hsx);
        nib_free(hsw);
        nib_free(hy);
        nib_free(hc);
        nib_free(hb);
    }
    nib_blas_free(b);
}

/* The bf16 reconfigurations of nib_blas_tune_for: the action expert's products at 1-16 rows (one
 * with a K split reduced in an fp32 workspace), the Gemma prefix's q|k|v, o and down (in place
 * over a residual, as the model runs them) and SigLIP's o (bias and residual), q|k|v and fc1
 * (bias) at the row counts of 1-3 cameras; against fp64 sums of the same bf16 values with the
 * bound of blas_gpu_bf16_and_fp8_w8a8 (plus the residual's and the bias's bf16 rounding), all
 * rows up to 16, else a sample of rows (all columns); guard columns past N untouched; and the
 * reconfigured algorithm must have run (cuBLASLt accepted it with the epilogue). */
NIB_TEST(blas_gpu_bf16_tuned_configs) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    if (!nib_blas_tune_on()) {
        printf("  NIB_BLAS_TUNE=0: the reconfigurations are off, nothing to test here\n");
        return;
    }
    struct {
        int64_t m, n, k;
        int inplace, bias;
    } cs[] = {{10, 1024, 4096, 0, 0},    {1, 1024, 4096, 0, 0},    {16, 1024, 2048, 0, 0},   {7, 1024, 2048, 0, 0},
              {10, 2560, 1024, 0, 0},    {532, 2048, 2048, 1, 0},  {276, 2048, 2048, 1, 0},  {532, 2048, 16384, 1, 0},
              {788, 2048, 16384, 1, 0},  {300, 2048, 16384, 1, 0}, {532, 2560, 2048, 0, 0},  {256, 1152, 1152, 1, 1},
              {512, 1152, 1152, 1, 1},   {768, 1152, 1152, 1, 1},  {512, 3456, 1152, 0, 1},  {256, 4304, 1152, 0, 1},
              {512, 4304, 1152, 0, 1}};
    const int ncs = (int)(sizeof cs / sizeof cs[0]);
    /* the prefix's down rules are off by default (measured slower in the model); their
     * configurations are checked here all the same (NIB_BLAS_TUNE_PREFIX=1 for the A/B runs) */
    setenv("NIB_BLAS_TUNE_PREFIX", "1", 1);
    nib_blas *b = NULL;
    CHECK_OK(nib_blas_create(&b));
    REQUIRE(b);
    for (int ci = 0; ci < ncs; ci++) {
        const int64_t m = cs[ci].m, n = cs[ci].n, k = cs[ci].k, ldy = n + 8;
        nib_blas_tune tune;
        CHECK(nib_blas_tune_for(0, m, n, k, 132, &tune) == 1);
        uint16_t *hx = nib_malloc((size_t)m * k * 2), *hw = nib_malloc((size_t)n * k * 2), *hy = nib_malloc((size_t)m * ldy * 2),
                 *hc = nib_malloc((size_t)m * ldy * 2), *hb = nib_malloc((size_t)n * 2);
        REQUIRE(hx && hw && hy && hc && hb);
        for (int64_t i = 0; i < m * k; i++) hx[i] = nib_f32_to_bf16((float)nib_rng_normal(&rng));
        for (int64_t i = 0; i < n * k; i++) hw[i] = nib_f32_to_bf16((float)(0.02 * nib_rng_normal(&rng)));
        for (int64_t i = 0; i < n; i++) hb[i] = nib_f32_to_bf16((float)(0.5 * nib_rng_normal(&rng)));
        for (int64_t i = 0; i < m * ldy; i++)
            hc[i] = (i % ldy) < n && cs[ci].inplace ? nib_f32_to_bf16((float)nib_rng_normal(&rng)) : (uint16_t)POISON;
        void *dx, *dw, *dy, *db;
        CHECK_OK(nib_dev_malloc(&dx, (size_t)m * k * 2, "x"));
        CHECK_OK(nib_dev_malloc(&dw, (size_t)n * k * 2, "w"));
        CHECK_OK(nib_dev_malloc(&dy, (size_t)m * ldy * 2, "y"));
        CHECK_OK(nib_dev_malloc(&db, (size_t)n * 2, "bias"));
        CHECK_OK(nib_dev_upload(dx, hx, (size_t)m * k * 2));
        CHECK_OK(nib_dev_upload(dw, hw, (size_t)n * k * 2));
        CHECK_OK(nib_dev_upload(dy, hc, (size_t)m * ldy * 2)); /* the residual (in place) or the guard */
        CHECK_OK(nib_dev_upload(db, hb, (size_t)n * 2));
        const int before = nib_blas_tuned_plans(b);
        nib_blas_gemm_args a = {0, dx, NULL, 0, dw, NULL, 0, m, n, k, cs[ci].bias ? db : NULL, cs[ci].inplace ? dy : NULL,
                                ldy, dy, ldy};
        CHECK_OK(nib_blas_gemm_fused(b, &a, NULL));
        CHECK_MSG(nib_blas_tuned_plans(b) == before + 1, "bf16 M=%lld N=%lld K=%lld did not run the reconfigured algorithm",
                  (long long)m, (long long)n, (long long)k);
        CHECK_OK(nib_dev_download(hy, dy, (size_t)m * ldy * 2));
        int64_t rows[16];
        int nr = 0;
        if (m <= 16)
            for (int64_t i = 0; i < m; i++) rows[nr++] = i;
        else {
            const int64_t sample[] = {0, 1, m / 3, m / 2, m - 2, m - 1};
            for (int i = 0; i < 6; i++) rows[nr++] = sample[i];
        }
        int over = 0, guard = 0;
        double worst = 0;
        for (int ri = 0; ri < nr; ri++) {
            const int64_t i = rows[ri];
            for (int64_t j = 0; j < ldy; j++) {
                if (j >= n) {
                    guard += hy[i * ldy + j] != (uint16_t)POISON;
                    continue;
                }
                double s = 0, ab = 0;
                for (int64_t q = 0; q < k; q++) {
                    double tt = (double)nib_bf16_to_f32(hx[i * k + q]) * nib_bf16_to_f32(hw[j * k + q]);
                    s += tt;
                    ab += fabs(tt);
                }
                const double bias = cs[ci].bias ? nib_bf16_to_f32(hb[j]) : 0.0;
                const double c = cs[ci].inplace ? nib_bf16_to_f32(hc[i * ldy + j]) : 0.0;
                const double want = s + bias + c, y = nib_bf16_to_f32(hy[i * ldy + j]);
                /* the product (and bias) rounded to bf16 once, the in-place residual added and
                 * rounded again (docs/design.md: the double rounding of cuBLASLt in place) */
                const double bound = 0x1p-8 * (fabs(s + bias) + fabs(want)) * 1.01 + (k + 64) * 0x1p-22 * ab;
                if (fabs(y - want) / bound > worst) worst = fabs(y - want) / bound;
                if (!(fabs(y - want) <= bound) && over++ < 5)
                    nib_test_fail(t, __FILE__, __LINE__, "bf16 M=%lld N=%lld K=%lld [%lld,%lld]: %g vs %g (bound %g)",
                                  (long long)m, (long long)n, (long long)k, (long long)i, (long long)j, y, want, bound);
            }
        }
        CHECK_MSG(guard == 0, "%d guard values past N overwritten", guard);
        printf("  bf16 M=%lld N=%lld K=%lld base %d tile %d custom %d cluster %d swizzle %d split-K %d%s%s: worst error / "
               "bound %.3f\n",
               (long long)m, (long long)n, (long long)k, tune.base, tune.tile, tune.custom, tune.cluster, tune.swizzle,
               tune.splitk, cs[ci].bias ? " +bias" : "", cs[ci].inplace ? " (in place)" : "", worst);
        nib_dev_free(dx, (size_t)m * k * 2);
        nib_dev_free(dw, (size_t)n * k * 2);
        nib_dev_free(dy, (size_t)m * ldy * 2);
        nib_dev_free(db, (size_t)n * 2);
        nib_free(hx);
        nib_free(hw);
        nib_free(hy);
        nib_free(hc);
        nib_free(hb);
    }
    nib_blas_free(b);
    unsetenv("NIB_BLAS_TUNE_PREFIX");
}

NIB_TEST(gemm_gpu_argument_errors) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    rand_w rw;
    REQUIRE(make_rand_w(&rng, NIB_WFMT_NVFP4, 32, 256, 0, 0, 0, 0, &rw));
    nib_dev_arena a;
    CHECK_OK(nib_dev_arena_init(&a, 1 << 20, "args"));
    nib_qweight q;
    CHECK_OK(nib_cuda_weight_load(&rw.w, 0, "w", &a, &q));
    void *dx = NULL;
    CHECK_OK(nib_dev_malloc(&dx, 4096 * 2, "x"));
    CHECK_ST(nib_cuda_gemm(&q, dx, 1, 100, dx, 32, NULL, NULL, NULL), NIB_ERR_SHAPE);   /* ldx < K */
    CHECK_ST(nib_cuda_gemm(&q, dx, 1, 256, dx, 16, NULL, NULL, NULL), NIB_ERR_SHAPE);   /* ldy < N */
    CHECK_ST(nib_cuda_gemm(&q, dx, 0, 256, dx, 32, NULL, NULL, NULL), NIB_ERR_INVALID_ARG);
    nib_gemm_epi bad = {1, NULL, NULL, 0};
    CHECK_ST(nib_cuda_gemm(&q, dx, 1, 256, dx, 32, &bad, NULL, NULL), NIB_ERR_INVALID_ARG);
    nib_dev_free(dx, 4096 * 2);
    nib_dev_arena_free(&a);
    rand_w_free(&rw);
}

/* The per-token FP8 activation quantizer (W8A8) against formats/ nib_fp8_quantize on the same
 * bf16 rows, bit for bit (codes and scales), across every kernel path: register-resident vector
 * widths 1/2/4/8 chunks per thread, the scalar fallback (K % 8 != 0, misaligned rows), an
 * all-zero row, a row whose scale hits the FLT_MIN floor, and a row with one huge outlier. */
/* cuBLASLt into output buffers nib never wrote before (no guard fill, no upload): the plain
 * product, and the residual form with C in its own buffer (the SigLIP patch embedding's call).
 * Normally a plain correctness check at a tiny-config shape. It is also the probe of
 * docs/reliability.md ("initcheck"): with NIB_SANITIZER_PROBE=1 under initcheck the download reads
 * every output byte, and compute-sanitizer 2025.3.1 reports all of them (it does not see the
 * stores of cuBLASLt's Hopper kernels). Without the probe variable, under scripts/sanitize.sh the
 * outputs are filled with bf16 NaN first (a store the tool sees), so the suite stays a clean run
 * of the tools and the product is still checked (an unwritten NaN fails it). */
NIB_TEST(blas_gpu_fresh_output_buffers) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t m = 16, n = 96, k = 592;
    nib_blas *b = NULL;
    CHECK_OK(nib_blas_create(&b));
    REQUIRE(b);
    uint16_t *hx = nib_malloc((size_t)m * k * 2), *hw = nib_malloc((size_t)n * k * 2);
    uint16_t *hc = nib_malloc((size_t)m * n * 2), *hy = nib_malloc((size_t)m * n * 2);
    REQUIRE(hx && hw && hc && hy);
    for (int64_t i = 0; i < m * k; i++) hx[i] = nib_f32_to_bf16((float)nib_rng_normal(&rng));
    for (int64_t i = 0; i < n * k; i++) hw[i] = nib_f32_to_bf16((float)(0.05 * nib_rng_normal(&rng)));
    for (int64_t i = 0; i < m * n; i++) hc[i] = nib_f32_to_bf16((float)nib_rng_normal(&rng));
    void *dx = NULL, *dw = NULL, *dc = NULL, *dy[2] = {NULL, NULL};
    CHECK_OK(nib_dev_malloc(&dx, (size_t)m * k * 2, "x"));
    CHECK_OK(nib_dev_malloc(&dw, (size_t)n * k * 2, "w"));
    CHECK_OK(nib_dev_malloc(&dc, (size_t)m * n * 2, "c"));
    CHECK_OK(nib_dev_malloc(&dy[0], (size_t)m * n * 2, "y (plain)"));
    CHECK_OK(nib_dev_malloc(&dy[1], (size_t)m * n * 2, "y (residual)"));
    REQUIRE(dx && dw && dc && dy[0] && dy[1]);
    CHECK_OK(nib_dev_upload(dx, hx, (size_t)m * k * 2));
    CHECK_OK(nib_dev_upload(dw, hw, (size_t)n * k * 2));
    CHECK_OK(nib_dev_upload(dc, hc, (size_t)m * n * 2));
    const char *probe = getenv("NIB_SANITIZER_PROBE");
    if (nib_under_sanitizer() && !(probe && probe[0] == '1')) {
        printf("  outputs filled with NaN first (under compute-sanitizer; NIB_SANITIZER_PROBE=1 leaves them fresh)\n");
        for (int res = 0; res <= 1; res++) CHECK_OK(nib_dev_memset(dy[res], 0xFF, (size_t)m * n * 2));
    }
    for (int res = 0; res <= 1; res++) {
        nib_blas_gemm_args a = {0, dx, NULL, 0, dw, NULL, 0, m, n, k, NULL, res ? dc : NULL, n, dy[res], n};
        nib_status st = nib_blas_gemm_fused(b, &a, NULL);
        if (st == NIB_ERR_UNSUPPORTED && res) {
            printf("  note: cuBLASLt offers no residual algorithm here: %s\n", nib_last_error());
            continue;
        }
        CHECK_OK(st);
        if (st) continue;
        CHECK_OK(nib_dev_download(hy, dy[res], (size_t)m * n * 2));
        int over = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0, ab = 0;
                for (int64_t q = 0; q < k; q++) {
                    const double tt = (double)nib_bf16_to_f32(hx[i * k + q]) * nib_bf16_to_f32(hw[j * k + q]);
                    s += tt, ab += fabs(tt);
                }
                const double extra = res ? nib_bf16_to_f32(hc[i * n + j]) : 0.0, want = s + extra;
                /* one bf16 rounding of the fp32 result, fp32 accumulation over K, C added in fp32 */
                const double bound = 0x1p-8 * 1.01 * fabs(want) + (k + 64) * 0x1p-22 * ab + 0x1p-22 * fabs(extra);
                const double y = nib_bf16_to_f32(hy[i * n + j]);
                if (!(fabs(y - want) <= bound) && over++ < 5)
                    nib_test_fail(t, __FILE__, __LINE__, "%s [%lld,%lld]: %g vs %g (bound %g)",
                                  res ? "residual" : "plain", (long long)i, (long long)j, y, want, bound);
            }
    }
    nib_dev_free(dx, (size_t)m * k * 2);
    nib_dev_free(dw, (size_t)n * k * 2);
    nib_dev_free(dc, (size_t)m * n * 2);
    nib_dev_free(dy[0], (size_t)m * n * 2);
    nib_dev_free(dy[1], (size_t)m * n * 2);
    nib_blas_free(b);
    nib_free(hx), nib_free(hw), nib_free(hc), nib_free(hy);
}

NIB_TEST(blas_gpu_fp8_row_quantizer_paths) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    /* the vector kernels with 1, 2, 4 and 8 chunks per thread, partly filled (4104, 8200, 12296),
     * and past 2048 chunks (20480) the scalar kernel */
    const int64_t ks[] = {8, 1000, 1152, 2056, 4104, 8192, 8200, 12296, 16384, 20480, 1001};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
        for (int mis = 0; mis < 2; mis++) {
            const int64_t k = ks[ki], m = 5, off = mis; /* off: 1 element = 2 bytes: misaligned rows */
            uint16_t *hx = nib_malloc((size_t)(m * k + 1) * 2);
            float *rowf = nib_malloc((size_t)k * 4), *hs = nib_malloc((size_t)m * 4);
            uint8_t *hq = nib_malloc((size_t)m * k), *want = nib_malloc((size_t)k);
            REQUIRE(hx && rowf && hs && hq && want);
            for (int64_t i = 0; i < m * k + 1; i++) hx[i] = nib_f32_to_bf16((float)nib_rng_normal(&rng));
            uint16_t *x = hx + off;
            for (int64_t j = 0; j < k; j++) {
                x[1 * k + j] = 0;                                              /* all zero */
                x[2 * k + j] = nib_f32_to_bf16((float)(1e-37 * nib_rng_normal(&rng))); /* FLT_MIN floor */
            }
            x[3 * k + k / 2] = nib_f32_to_bf16(3e4f); /* outlier: every other code tiny */
            void *dx, *dq;
            float *ds;
            CHECK_OK(nib_dev_malloc(&dx, (size_t)(m * k + 1) * 2, "x"));
            CHECK_OK(nib_dev_malloc(&dq, (size_t)m * k + 16, "q"));
            CHECK_OK(nib_dev_malloc((void **)&ds, (size_t)m * 4, "s"));
            CHECK_OK(nib_dev_upload(dx, hx, (size_t)(m * k + 1) * 2));
            CHECK_OK(nib_cuda_quantize_fp8_rows((uint16_t *)dx + off, m, k, 1, dq, ds, NULL));
            CHECK_OK(nib_dev_download(hq, dq, (size_t)m * k));
            CHECK_OK(nib_dev_download(hs, ds, (size_t)m * 4));
            int bad = 0;
            for (int64_t i = 0; i < m; i++) {
                float s;
                for (int64_t j = 0; j < k; j++) rowf[j] = nib_bf16_to_f32(x[i * k + j]);
                CHECK_OK(nib_fp8_quantize(rowf, 1, k, 1, want, &s));
                if (memcmp(&s, &hs[i], 4)) {
                    if (bad++ < 3)
                        nib_test_fail(t, __FILE__, __LINE__, "K %lld%s row %lld: scale %a, formats/ %a", (long long)k,
                                      mis ? " (misaligned)" : "", (long long)i, hs[i], s);
                }
                for (int64_t j = 0; j < k; j++)
                    if (want[j] != hq[i * k + j] && bad++ < 3)
                        nib_test_fail(t, __FILE__, __LINE__, "K %lld%s row %lld col %lld: code 0x%02x, formats/ 0x%02x",
                                      (long long)k, mis ? " (misaligned)" : "", (long long)i, (long long)j,
                                      hq[i * k + j], want[j]);
            }
            nib_dev_free(dx, (size_t)(m * k + 1) * 2);
            nib_dev_free(dq, (size_t)m * k + 16);
            nib_dev_free(ds, (size_t)m * 4);
            nib_free(hx), nib_free(rowf), nib_free(hs), nib_free(hq), nib_free(want);
        }
}

/* nib_blas_gemm_fused: the cuBLASLt BIAS epilogue (fp32 bias) and C = residual (beta = 1), in
 * place (C == Y) and out of place, with a row stride ldy > N whose gap columns hold guard values,
 * for bf16 and FP8 W8A8, at M = 1, 37 and 532 (bias in bf16, what the epilogue takes; the backend
 * uses it only for biases exact in bf16). Reference: fp64 sum of the exact products + bias
 * + bf16 residual; bound = the GEMM bound above plus one fp32 rounding of the two added terms
 * (2^-22 (|bias| + |c|)), plus, in place, a bf16 rounding of the product (cuBLASLt adds C to the
 * rounded product there). A combination cuBLASLt does not offer must answer NIB_ERR_UNSUPPORTED
 * (the backend then uses its epilogue kernel) and is reported; any other outcome fails. */
NIB_TEST(blas_gpu_fused_bias_residual) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t n = 272, k = 1152, ldy = n + 24, mmax = 532;
    nib_blas *b = NULL;
    CHECK_OK(nib_blas_create(&b));
    REQUIRE(b);
    uint16_t *hx = nib_malloc((size_t)mmax * k * 2), *hw = nib_malloc((size_t)n * k * 2);
    uint16_t *hc = nib_malloc((size_t)mmax * ldy * 2), *hy = nib_malloc((size_t)mmax * ldy * 2);
    uint8_t *hwq = nib_malloc((size_t)n * k), *hxq = nib_malloc((size_t)mmax * k);
    float *hsw = nib_malloc((size_t)n * 4), *hsx = nib_malloc((size_t)mmax * 4 + 8), *wf = nib_malloc((size_t)n * k * 4);
    float *hb = nib_malloc((size_t)n * 4);
    REQUIRE(hx && hw && hc && hy && hwq && hxq && hsw && hsx && wf && hb);
    for (int64_t i = 0; i < mmax * k; i++) hx[i] = nib_f32_to_bf16((float)nib_rng_normal(&rng));
    for (int64_t i = 0; i < n * k; i++) wf[i] = (float)(0.05 * nib_rng_normal(&rng));
    for (int64_t i = 0; i < n * k; i++) hw[i] = nib_f32_to_bf16(wf[i]);
    uint16_t *hb16 = nib_malloc((size_t)n * 2);
    REQUIRE(hb16);
    for (int64_t i = 0; i < n; i++) hb16[i] = nib_f32_to_bf16((float)(0.7 * nib_rng_normal(&rng)));
    for (int64_t i = 0; i < n; i++) hb[i] = nib_bf16_to_f32(hb16[i]); /* the epilogue takes bf16 */
    for (int64_t i = 0; i < mmax * ldy; i++) hc[i] = nib_f32_to_bf16((float)(2.0 * nib_rng_normal(&rng)));
    CHECK_OK(nib_fp8_quantize(wf, n, k, 1, hwq, hsw));
    void *dx, *dw, *dy, *dc, *dwq, *dxq;
    float *dsw, *dsx, *db;
    CHECK_OK(nib_dev_malloc(&dx, (size_t)mmax * k * 2, "x"));
    CHECK_OK(nib_dev_malloc(&dw, (size_t)n * k * 2, "w"));
    CHECK_OK(nib_dev_malloc(&dy, (size_t)mmax * ldy * 2, "y"));
    CHECK_OK(nib_dev_malloc(&dc, (size_t)mmax * ldy * 2, "c"));
    CHECK_OK(nib_dev_malloc(&dwq, (size_t)n * k, "wq"));
    CHECK_OK(nib_dev_malloc(&dxq, (size_t)mmax * k, "xq"));
    CHECK_OK(nib_dev_malloc((void **)&dsw, (size_t)n * 4, "sw"));
    CHECK_OK(nib_dev_malloc((void **)&dsx, (size_t)mmax * 4 + 8, "sx"));
    CHECK_OK(nib_dev_malloc((void **)&db, (size_t)n * 2, "bias"));
    CHECK_OK(nib_dev_upload(dx, hx, (size_t)mmax * k * 2));
    CHECK_OK(nib_dev_upload(dw, hw, (size_t)n * k * 2));
    CHECK_OK(nib_dev_upload(dwq, hwq, (size_t)n * k));
    CHECK_OK(nib_dev_upload(dsw, hsw, (size_t)n * 4));
    CHECK_OK(nib_dev_upload(db, hb16, (size_t)n * 2));
    CHECK_OK(nib_cuda_quantize_fp8_rows(dx, mmax, k, 1, dxq, dsx, NULL));
    CHECK_OK(nib_dev_download(hxq, dxq, (size_t)mmax * k));
    CHECK_OK(nib_dev_download(hsx, dsx, (size_t)mmax * 4));
    const int64_t ms[] = {1, 37, 532};
    int unsupported = 0, ran = 0;
    double *S = nib_malloc((size_t)mmax * n * 8), *AB = nib_malloc((size_t)mmax * n * 8);
    REQUIRE(S && AB);
    for (int fp8 = 0; fp8 <= 1; fp8++) {
        for (int64_t i = 0; i < mmax; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0, ab = 0;
                for (int64_t q = 0; q < k; q++) {
                    double tt = fp8 ? (double)nib_e4m3_to_f32(hxq[i * k + q]) * hsx[i] *
                                          (double)nib_e4m3_to_f32(hwq[j * k + q]) * hsw[j]
                                    : (double)nib_bf16_to_f32(hx[i * k + q]) * nib_bf16_to_f32(hw[j * k + q]);
                    s += tt;
                    ab += fabs(tt);
                }
                S[i * n + j] = s;
                AB[i * n + j] = ab;
            }
        for (int mi = 0; mi < 3; mi++)
            for (int mode = 0; mode < 4; mode++) { /* 0 bias; 1 C out of place; 2 bias + C in place; 3 C in place */
                const int64_t m = ms[mi];
                const int use_bias = mode == 0 || mode == 2, use_c = mode != 0, inplace = mode >= 2;
                /* y starts as the guard pattern (out of place) or as the residual (in place) */
                for (int64_t i = 0; i < m * ldy; i++) hy[i] = inplace ? hc[i] : (uint16_t)POISON;
                if (inplace)
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = n; j < ldy; j++) hy[i * ldy + j] = POISON;
                CHECK_OK(nib_dev_upload(dy, hy, (size_t)m * ldy * 2));
                CHECK_OK(nib_dev_upload(dc, hc, (size_t)m * ldy * 2));
                nib_blas_gemm_args a = {fp8, fp8 ? dxq : dx, dsx, 1, fp8 ? dwq : dw, dsw, 1, m, n, k,
                                        use_bias ? db : NULL, use_c ? (inplace ? dy : dc) : NULL, ldy, dy, ldy};
                nib_status st = nib_blas_gemm_fused(b, &a, NULL);
                if (st == NIB_ERR_UNSUPPORTED) {
                    printf("  note: cuBLASLt offers no %s algorithm for M=%lld mode %d: %s\n", fp8 ? "fp8" : "bf16",
                           (long long)m, mode, nib_last_error());
                    unsupported++;
                    continue;
                }
                CHECK_OK(st);
                if (st) continue;
                ran++;
                CHECK_OK(nib_dev_download(hy, dy, (size_t)m * ldy * 2));
                int over = 0;
                for (int64_t i = 0; i < m; i++) {
                    for (int64_t j = 0; j < n; j++) {
                        const double s = S[i * n + j], ab = AB[i * n + j];
                        double extra = (use_bias ? hb[j] : 0.0) + (use_c ? nib_bf16_to_f32(hc[i * ldy + j]) : 0.0);
                        double want = s + extra;
                        /* in place, cuBLASLt rounds the product to bf16 before adding C (measured:
                         * 1-2 ulps past the single-rounding bound, with or without split-K) --
                         * the same double rounding as the product + epilogue-kernel path */
                        double bound = 0x1p-8 * fabs(want) * 1.01 + (k + 64) * 0x1p-22 * ab +
                                       0x1p-22 * (fabs(use_bias ? hb[j] : 0.0) + fabs(extra)) +
                                       (inplace ? 0x1p-8 * 1.01 * fabs(s + (use_bias ? hb[j] : 0.0)) : 0.0);
                        double y = nib_bf16_to_f32(hy[i * ldy + j]);
                        if (!(fabs(y - want) <= bound) && over++ < 5)
                            nib_test_fail(t, __FILE__, __LINE__, "%s M=%lld mode %d [%lld,%lld]: %g vs %g (bound %g)",
                                          fp8 ? "fp8" : "bf16", (long long)m, mode, (long long)i, (long long)j, y,
                                          want, bound);
                    }
                    for (int64_t j = n; j < ldy; j++)
                        if (hy[i * ldy + j] != POISON && over++ < 5)
                            nib_test_fail(t, __FILE__, __LINE__, "%s M=%lld mode %d: gap column %lld of row %lld written",
                                          fp8 ? "fp8" : "bf16", (long long)m, mode, (long long)j, (long long)i);
                }
            }
    }
    nib_free(S);
    nib_free(AB);
    printf("  %d fused combinations checked, %d not offered by cuBLASLt\n", ran, unsupported);
    CHECK_MSG(ran > 0, "no fused combination ran");
    nib_dev_free(dx, (size_t)mmax * k * 2);
    nib_dev_free(dw, (size_t)n * k * 2);
    nib_dev_free(dy, (size_t)mmax * ldy * 2);
    nib_dev_free(dc, (size_t)mmax * ldy * 2);
    nib_dev_free(dwq, (size_t)n * k);
    nib_dev_free(dxq, (size_t)mmax * k);
    nib_dev_free(dsw, (size_t)n * 4);
    nib_dev_free(dsx, (size_t)mmax * 4 + 8);
    nib_dev_free(db, (size_t)n * 2);
    nib_blas_free(b);
    nib_free(hx);
    nib_free(hw);
    nib_free(hc);
    nib_free(hy);
    nib_free(hwq);
    nib_free(hxq);
    nib_free(hsw);
    nib_free(hsx);
    nib_free(wf);
    nib_free(hb);
    nib_free(hb16);
}

/* nib's FP8 wgmma GEMM (ops/cuda/gemm_fp8.cu): every compiled tile and the planner's pick,
 * against the fp64 sum of the same e4m3 codes times their scales, at awkward shapes (M not a
 * multiple of 64, N not a multiple of any tile, K not a multiple of the 128-byte K block),
 * with per-token / per-channel or scalar scales, bias, C out of place and in place. Every
 * non-NaN e4m3 code occurs. Y has guard columns (ldy > N) and a guard row below M, poisoned
 * before each call: an element written out of bounds or not written fails.
 * Bound, from what the tensor cores do in fast accumulation: the products of a group are
 * aligned to the group's largest and truncated to 13 mantissa bits, and the running sum is
 * truncated to 13 bits after each group. Per group g of 16 consecutive K (a k32 instruction is
 * two of them, which the doubling covers): 2^-12 (16 max_g |t| + |prefix sum after g|). With
 * uniformly random codes the products span ~30 binades, so the alignment term (16 x the group's
 * largest product, not the sum of |t|) is the one that matters: the Σ|t| form of
 * blas_gpu_bf16_and_fp8_w8a8 (normal data) measured 0.96 of its bound here. Plus the bf16
 * rounding of the result and 2^-22 of the bias / C terms. */
typedef struct fp8_case {
    int64_t m, n, k;
    int vec, bias, cmode; /* vec: per-token / per-channel scales; cmode 0 none, 1 separate C, 2 C is Y */
} fp8_case;

static uint8_t rand_e4m3(nib_rng *r) {
    uint8_t b = (uint8_t)nib_rng_u64(r);
    return (b & 0x7F) == 0x7F ? (uint8_t)(b ^ 0x08) : b; /* no NaN codes */
}

/* random e4m3 X [m][k] and W [n][k] (no NaN codes), scales in [0.5, 1.5) 1e-3, bf16 bias N(0, 0.25) */
static void fp8_rand_inputs(nib_rng *r, int64_t m, int64_t n, int64_t k, uint8_t *hx, uint8_t *hw, float *hsx,
                            float *hsw, uint16_t *hb) {
    for (int64_t i = 0; i < m * k; i++) hx[i] = rand_e4m3(r);
    for (int64_t i = 0; i < n * k; i++) hw[i] = rand_e4m3(r);
    for (int64_t i = 0; i < m; i++) hsx[i] = (float)(1e-3 * (0.5 + nib_rng_uniform(r)));
    for (int64_t i = 0; i < n; i++) hsw[i] = (float)(1e-3 * (0.5 + nib_rng_uniform(r)));
    for (int64_t i = 0; i < n; i++) hb[i] = nib_f32_to_bf16((float)(0.5 * nib_rng_normal(r)));
}

/* S[i][j]: the fp64 sum of the scaled products; B[i][j]: its fast-accumulation bound (above) */
static void fp8_ref_sum1(const uint8_t *hx, const uint8_t *hw, const float *hsx, const float *hsw, int vec, int64_t i,
                         int64_t j, int64_t k, double *S, double *B) {
    const double sc = (double)hsx[vec ? i : 0] * (double)hsw[vec ? j : 0];
    double sum = 0, gmax = 0, align = 0, run = 0;
    for (int64_t q = 0; q < k; q++) {
        const double tt = (double)nib_e4m3_to_f32(hx[i * k + q]) * (double)nib_e4m3_to_f32(hw[j * k + q]) * sc;
        sum += tt;
        if (fabs(tt) > gmax) gmax = fabs(tt);
        if (q % 16 == 15 || q == k - 1) {
            run += fabs(sum);
            align += 16 * gmax;
            gmax = 0;
        }
    }
    *S = sum;
    *B = 0x1p-12 * (run + align);
}

static void fp8_ref_sums(const uint8_t *hx, const uint8_t *hw, const float *hsx, const float *hsw, int vec, int64_t m,
                         int64_t n, int64_t k, double *S, double *B) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) fp8_ref_sum1(hx, hw, hsx, hsw, vec, i, j, k, &S[i * n + j], &B[i * n + j]);
}

static void fp8_case_run(nib_test_ctx *t, nib_rng *rng, const fp8_case *c, double *worst_out, int *cpre_runs) {
    const int64_t m = c->m, n = c->n, k = c->k, ldy = n + 8, ldc = n + 8, rows = m + 1;
    uint8_t *hx = nib_malloc((size_t)m * k), *hw = nib_malloc((size_t)n * k);
    float *hsx = nib_malloc((size_t)m * 4), *hsw = nib_malloc((size_t)n * 4);
    uint16_t *hb = nib_malloc((size_t)n * 2), *hc = nib_malloc((size_t)rows * ldc * 2), *hy = nib_malloc((size_t)rows * ldy * 2);
    double *S = nib_malloc((size_t)m * n * 8), *B = nib_malloc((size_t)m * n * 8);
    REQUIRE(hx && hw && hsx && hsw && hb && hc && hy && S && B);
    fp8_rand_inputs(rng, m, n, k, hx, hw, hsx, hsw, hb);
    for (int i = 0; i < 254 && i < n * k; i++) hw[i] = (uint8_t)(i < 127 ? i : i + 1); /* every non-NaN code */
    for (int64_t i = 0; i < rows * ldc; i++) hc[i] = nib_f32_to_bf16((float)nib_rng_normal(rng));
    fp8_ref_sums(hx, hw, hsx, hsw, c->vec, m, n, k, S, B); /* the fp64 reference and its bound */
    void *dx, *dw, *dy, *dc, *db;
    float *dsx, *dsw;
    CHECK_OK(nib_dev_malloc(&dx, (size_t)m * k, "x"));
    CHECK_OK(nib_dev_malloc(&dw, (size_t)n * k, "w"));
    CHECK_OK(nib_dev_malloc(&dy, (size_t)rows * ldy * 2, "y"));
    CHECK_OK(nib_dev_malloc(&dc, (size_t)rows * ldc * 2, "c"));
    CHECK_OK(nib_dev_malloc(&db, (size_t)n * 2, "bias"));
    CHECK_OK(nib_dev_malloc((void **)&dsx, (size_t)m * 4, "sx"));
    CHECK_OK(nib_dev_malloc((void **)&dsw, (size_t)n * 4, "sw"));
    CHECK_OK(nib_dev_upload(dx, hx, (size_t)m * k));
    CHECK_OK(nib_dev_upload(dw, hw, (size_t)n * k));
    CHECK_OK(nib_dev_upload(dc, hc, (size_t)rows * ldc * 2));
    CHECK_OK(nib_dev_upload(db, hb, (size_t)n * 2));
    CHECK_OK(nib_dev_upload(dsx, hsx, (size_t)m * 4));
    CHECK_OK(nib_dev_upload(dsw, hsw, (size_t)n * 4));
    nib_fp8_tile tiles[65];
    int nt = nib_fp8_tiles(tiles, 64);
    tiles[nt].wg = 0; /* last: the planner's pick (NULL tile) */
    uint16_t *hy0 = nib_malloc((size_t)rows * ldy * 2);
    REQUIRE(hy0);
    /* with C, each tile twice: the default (NIB_FP8_EPI_CPRE=1: every C chunk of a thread loaded first), then
     * NIB_FP8_EPI_CPRE=0 (chunk by chunk), which must give the same bits, guards included */
    for (int tp = 0; tp <= 2 * nt + 1; tp++) {
        const int ti = tp / 2, pre = tp % 2;
        if (pre && !c->cmode) continue;
        const int inplace = c->cmode == 2;
        for (int64_t i = 0; i < rows * ldy; i++) hy[i] = inplace && i < m * ldy && i % ldy < n ? hc[i] : (uint16_t)POISON;
        CHECK_OK(nib_dev_upload(dy, hy, (size_t)rows * ldy * 2));
        nib_blas_gemm_args a = {1, dx, dsx, c->vec, dw, dsw, c->vec, m, n, k, c->bias ? db : NULL,
                                c->cmode == 1 ? dc : c->cmode == 2 ? dy : NULL, c->cmode == 2 ? ldy : ldc, dy, ldy};
        if (pre) setenv("NIB_FP8_EPI_CPRE", "0", 1);
        nib_status st = nib_cuda_gemm_fp8(&a, ti < nt ? &tiles[ti] : NULL, NULL);
        unsetenv("NIB_FP8_EPI_CPRE");
        CHECK_OK(st);
        if (st) continue;
        CHECK_OK(nib_dev_download(hy, dy, (size_t)rows * ldy * 2));
        if (pre) {
            CHECK_MSG(!memcmp(hy, hy0, (size_t)rows * ldy * 2),
                      "fp8 nib M=%lld N=%lld K=%lld tile %d: NIB_FP8_EPI_CPRE=0 changes the output (C mode %d)",
                      (long long)m, (long long)n, (long long)k, ti, c->cmode);
            (*cpre_runs)++;
            continue;
        }
        memcpy(hy0, hy, (size_t)rows * ldy * 2);
        int over = 0, guard = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < ldy; j++) {
                const uint16_t y16 = hy[i * ldy + j];
                if (i >= m || j >= n) {
                    guard += y16 != POISON;
                    continue;
                }
                const double bias = c->bias ? nib_bf16_to_f32(hb[j]) : 0.0;
                const double cv = c->cmode ? nib_bf16_to_f32(hc[i * ldc + j]) : 0.0;
                const double want = S[i * n + j] + bias + cv, y = nib_bf16_to_f32(y16);
                const double bound = 0x1p-8 * 1.01 * fabs(want) + B[i * n + j] + 0x1p-22 * (fabs(bias) + fabs(cv));
                const double r = fabs(y - want) / bound;
                if (r > *worst_out) *worst_out = r;
                if (!(fabs(y - want) <= bound) && over++ < 3)
                    nib_test_fail(t, __FILE__, __LINE__, "fp8 nib M=%lld N=%lld K=%lld tile %s%dx%d st%d ks%d cm%d [%lld,%lld]: %g vs %g (bound %g)",
                                  (long long)m, (long long)n, (long long)k, ti < nt ? "" : "planner ",
                                  ti < nt ? 64 * tiles[ti].wg : 0, ti < nt ? tiles[ti].bn : 0,
                                  ti < nt ? tiles[ti].stages : 0, ti < nt ? tiles[ti].ks : 0, ti < nt ? tiles[ti].cm : 0, (long long)i, (long long)j, y, want, bound);
            }
        CHECK_MSG(guard == 0, "fp8 nib M=%lld N=%lld K=%lld tile %d: %d guard values overwritten", (long long)m,
                  (long long)n, (long long)k, ti, guard);
    }
    nib_dev_free(dx, (size_t)m * k);
    nib_dev_free(dw, (size_t)n * k);
    nib_dev_free(dy, (size_t)rows * ldy * 2);
    nib_dev_free(dc, (size_t)rows * ldc * 2);
    nib_dev_free(db, (size_t)n * 2);
    nib_dev_free(dsx, (size_t)m * 4);
    nib_dev_free(dsw, (size_t)n * 4);
    nib_free(hx), nib_free(hw), nib_free(hsx), nib_free(hsw), nib_free(hb), nib_free(hc), nib_free(hy), nib_free(hy0);
    nib_free(S), nib_free(B);
}

/* GeGLU fused into nib's FP8 GEMM (nib_cuda_gemm_fp8_geglu): W = gate rows [0, H) | up rows
 * [H, 2H); Y[i, j] = bf16(gelu_tanh(g) u) with g, u the fp32 epilogue values (scales, bias) of
 * columns j and H + j. Every tile that can run it, and the planner's pick, against fp64 on the
 * same codes. Bound: the fast-accumulation bound of fp8_case_run for g (eg) and u (eu) carried
 * through the product with |gelu'| <= 1.13, 2^-20 (|g| + 1) |u| for the fp32 epilogue and tanhf
 * (2 ulp), the hardware tanh's NIB_ACT_TANH_APPROX_ERR |g| (|u| + eu) / 2 (ops/act.h: h goes to FP8 next),
 * and the bf16 rounding of the result. Guard columns and row as above. The persistent kernel is checked bit for bit
 * against the one-tile kernel, the ping-pong kernel (NIB_FP8_PP) against fp64. */
static double gelu_tanh_ref(double g) { return 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))); }

/* the bound on bf16(gelu_tanh(g) u) for fp64 sums g, u with bounds eg, eu (above) */
static double geglu_bound(double g, double u, double eg, double eu, int approx) {
    const double want = gelu_tanh_ref(g) * u;
    return 1.13 * eg * (fabs(u) + eu) + fabs(gelu_tanh_ref(g)) * eu + 0x1p-20 * (fabs(g) + 1.0) * fabs(u) +
           0x1p-8 * 1.01 * fabs(want) + 1e-30 + (approx ? 0.5 * NIB_ACT_TANH_APPROX_ERR * fabs(g) * (fabs(u) + eu) : 0.0);
}

/* Y (rows M + 1 of ldy, poisoned before the product) against the fp64 GeGLU of the sums S (M x 2H) with their
 * bounds B: every value within its bound, every guard value untouched; *worst: the largest error / bound */
static void geglu_check(nib_test_ctx *t, const uint16_t *hy, const double *S, const double *B, int64_t m, int64_t h,
                        int64_t k, int64_t ldy, int approx, const char *what, double *worst) {
    const int64_t n = 2 * h, rows = m + 1;
    int over = 0, guard = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < ldy; j++) {
            const uint16_t y16 = hy[i * ldy + j];
            if (i >= m || j >= h) {
                guard += y16 != POISON;
                continue;
            }
            const double g = S[i * n + j], u = S[i * n + h + j], eg = B[i * n + j], eu = B[i * n + h + j];
            const double want = gelu_tanh_ref(g) * u, y = nib_bf16_to_f32(y16);
            const double bound = geglu_bound(g, u, eg, eu, approx);
            const double r = fabs(y - want) / bound;
            if (r > *worst) *worst = r;
            if (!(fabs(y - want) <= bound) && over++ < 3)
                nib_test_fail(t, __FILE__, __LINE__, "fp8 nib GeGLU M=%lld H=%lld K=%lld %s [%lld,%lld]: %g vs %g (bound %g)",
                              (long long)m, (long long)h, (long long)k, what, (long long)i, (long long)j, y, want, bound);
        }
    CHECK_MSG(guard == 0, "fp8 nib GeGLU M=%lld H=%lld K=%lld %s: %d guard values overwritten", (long long)m,
              (long long)h, (long long)k, what, guard);
}

NIB_TEST(gemm_fp8_gpu_geglu) {
    NIB_REQUIRE_GPU();
    /* the hardware tanh (ops/act.h), unless NIB_FAST_TANH=0: 0.5 E |g| (|u| + eu) more */
    const char *fte = getenv("NIB_FAST_TANH");
    const int approx = !(fte && !strcmp(fte, "0"));
    nib_rng rng;
    nib_test_rng(t, &rng);
    const struct {
        int64_t m, h, k;
        int vec, bias;
    } cases[] = {{1, 8, 16, 1, 0}, {63, 136, 144, 0, 1}, {130, 72, 4304, 1, 0}, {532, 200, 2064, 1, 1}};
    double worst = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t m = cases[ci].m, h = cases[ci].h, n = 2 * h, k = cases[ci].k, ldy = h + 8, rows = m + 1;
        const int vec = cases[ci].vec;
        uint8_t *hx = nib_malloc((size_t)m * k), *hw = nib_malloc((size_t)n * k);
        float *hsx = nib_malloc((size_t)m * 4), *hsw = nib_malloc((size_t)n * 4);
        uint16_t *hb = nib_malloc((size_t)n * 2), *hy = nib_malloc((size_t)rows * ldy * 2),
                 *hy0 = nib_malloc((size_t)rows * ldy * 2);
        double *S = nib_malloc((size_t)m * n * 8), *B = nib_malloc((size_t)m * n * 8);
        REQUIRE(hx && hw && hsx && hsw && hb && hy && hy0 && S && B);
        fp8_rand_inputs(&rng, m, n, k, hx, hw, hsx, hsw, hb);
        fp8_ref_sums(hx, hw, hsx, hsw, vec, m, n, k, S, B);
        for (int64_t i = 0; i < m * n; i++) { /* + bias, and the fp32 epilogue's rounding */
            B[i] += 0x1p-20 * (fabs(S[i]) + 1.0);
            S[i] += cases[ci].bias ? nib_bf16_to_f32(hb[i % n]) : 0.0;
        }
        void *dx, *dw, *dy, *db;
        float *dsx, *dsw;
        CHECK_OK(nib_dev_malloc(&dx, (size_t)m * k, "x"));
        CHECK_OK(nib_dev_malloc(&dw, (size_t)n * k, "w"));
        CHECK_OK(nib_dev_malloc(&dy, (size_t)rows * ldy * 2, "y"));
        CHECK_OK(nib_dev_malloc(&db, (size_t)n * 2, "bias"));
        CHECK_OK(nib_dev_malloc((void **)&dsx, (size_t)m * 4, "sx"));
        CHECK_OK(nib_dev_malloc((void **)&dsw, (size_t)n * 4, "sw"));
        CHECK_OK(nib_dev_upload(dx, hx, (size_t)m * k));
        CHECK_OK(nib_dev_upload(dw, hw, (size_t)n * k));
        CHECK_OK(nib_dev_upload(db, hb, (size_t)n * 2));
        CHECK_OK(nib_dev_upload(dsx, hsx, (size_t)m * 4));
        CHECK_OK(nib_dev_upload(dsw, hsw, (size_t)n * 4));
        nib_fp8_tile all[64], tiles[65];
        const int na = nib_fp8_tiles(all, 64);
        int nt = 0;
        for (int i = 0; i < na; i++)
            if (nib_fp8_tile_geglu(&all[i])) tiles[nt++] = all[i];
        CHECK(nt >= 4);
        for (int ti = 0; ti <= nt; ti++) { /* last: the planner's pick */
            for (int64_t i = 0; i < rows * ldy; i++) hy[i] = (uint16_t)POISON;
            CHECK_OK(nib_dev_upload(dy, hy, (size_t)rows * ldy * 2));
            nib_blas_gemm_args a = {1, dx, dsx, vec, dw, dsw, vec, m, n, k, cases[ci].bias ? db : NULL, NULL, 0, dy, ldy};
            setenv("NIB_FP8_PERSIST", "0", 1); /* one tile a CTA, against fp64; the persistent kernel below */
            nib_status st = nib_cuda_gemm_fp8_geglu(&a, ti < nt ? &tiles[ti] : NULL, NULL);
            unsetenv("NIB_FP8_PERSIST");
            CHECK_OK(st);
            if (st) continue;
            CHECK_OK(nib_dev_download(hy, dy, (size_t)rows * ldy * 2));
            char what[64];
            snprintf(what, sizeof what, "tile %s%dx%d", ti < nt ? "" : "planner ", ti < nt ? 64 * tiles[ti].wg : 0,
                     ti < nt ? tiles[ti].bn : 0);
            geglu_check(t, hy, S, B, m, h, k, ldy, approx, what, &worst);
            /* the persistent kernel (NIB_FP8_PERSIST=1, the default: every CTA resident, then 3 CTAs walking every
             * tile, the ring's phases wrapping across tiles at K = 2064 / 4304) gives the same bits, guards included;
             * so does it launched without the PDL attribute (NIB_FP8_GEGLU_PDL=0) */
            for (int pv = 0; pv < 3; pv++) {
                if (pv == 1) setenv("NIB_FP8_PERSIST_CTAS", "3", 1);
                if (pv == 2) setenv("NIB_FP8_GEGLU_PDL", "0", 1);
                for (int64_t i = 0; i < rows * ldy; i++) hy0[i] = (uint16_t)POISON;
                CHECK_OK(nib_dev_upload(dy, hy0, (size_t)rows * ldy * 2));
                CHECK_OK(nib_cuda_gemm_fp8_geglu(&a, ti < nt ? &tiles[ti] : NULL, NULL));
                CHECK_OK(nib_dev_download(hy0, dy, (size_t)rows * ldy * 2));
                unsetenv("NIB_FP8_PERSIST"), unsetenv("NIB_FP8_PERSIST_CTAS");
                unsetenv("NIB_FP8_GEGLU_PDL");
                int64_t diff = 0;
                for (int64_t i = 0; i < rows * ldy; i++) diff += hy0[i] != hy[i];
                CHECK_MSG(diff == 0, "fp8 nib GeGLU M=%lld H=%lld K=%lld tile %d, persistent%s: %lld values differ "
                          "from the one-tile-per-CTA kernel", (long long)m, (long long)h, (long long)k, ti,
                          pv == 1 ? " on 3 CTAs" : pv == 2 ? ", without PDL" : "",
                          (long long)diff);
            }
            /* the ping-pong kernel (NIB_FP8_PP forces a tile; it ignores the tile argument): each consumer tile on
             * every CTA it fills and on 3 CTAs (each consumer walking several tiles, the ring's phases wrapping and
             * the consumers' turns passing at every tile), against fp64 */
            if (ti == nt) {
                static const char *pps[] = {"192x128", "128x192", "64x256", "64x256"};
                for (int pi = 0; pi < 7; pi++) { /* the last: launched with the PDL attribute (NIB_FP8_GEGLU_PDL=1) */
                    setenv("NIB_FP8_PP", pps[pi / 2], 1);
                    if (pi & 1) setenv("NIB_FP8_PERSIST_CTAS", "3", 1);
                    if (pi == 6) setenv("NIB_FP8_GEGLU_PDL", "1", 1);
                    for (int64_t i = 0; i < rows * ldy; i++) hy0[i] = (uint16_t)POISON;
                    CHECK_OK(nib_dev_upload(dy, hy0, (size_t)rows * ldy * 2));
                    CHECK_OK(nib_cuda_gemm_fp8_geglu(&a, NULL, NULL));
                    CHECK_OK(nib_dev_download(hy0, dy, (size_t)rows * ldy * 2));
                    unsetenv("NIB_FP8_PP"), unsetenv("NIB_FP8_PERSIST_CTAS"), unsetenv("NIB_FP8_GEGLU_PDL");
                    snprintf(what, sizeof what, "ping-pong %s%s", pps[pi / 2],
                             pi == 6 ? " with PDL" : pi & 1 ? " on 3 CTAs" : "");
                    geglu_check(t, hy0, S, B, m, h, k, ldy, approx, what, &worst);
                }
            }
        }
        if (ci == 0) { /* the switches' bad values are refused by name */
            nib_blas_gemm_args a = {1, dx, dsx, vec, dw, dsw, vec, m, n, k, NULL, NULL, 0, dy, ldy};
            setenv("NIB_FP8_PERSIST", "2", 1);
            CHECK_ST(nib_cuda_gemm_fp8_geglu(&a, NULL, NULL), NIB_ERR_INVALID_ARG);
            CHECK(strstr(nib_last_error(), "NIB_FP8_PERSIST") != NULL);
            unsetenv("NIB_FP8_PERSIST");
            setenv("NIB_FP8_PP", "192x192", 1);
            CHECK_ST(nib_cuda_gemm_fp8_geglu(&a, NULL, NULL), NIB_ERR_INVALID_ARG);
            CHECK(strstr(nib_last_error(), "NIB_FP8_PP") != NULL);
            unsetenv("NIB_FP8_PP");
            setenv("NIB_FP8_PERSIST_CTAS", "0", 1);
            CHECK_ST(nib_cuda_gemm_fp8_geglu(&a, NULL, NULL), NIB_ERR_INVALID_ARG);
            CHECK(strstr(nib_last_error(), "NIB_FP8_PERSIST_CTAS") != NULL);
            unsetenv("NIB_FP8_PERSIST"), unsetenv("NIB_FP8_PERSIST_CTAS");
            setenv("NIB_FP8_GEGLU_PDL", "2", 1);
            CHECK_ST(nib_cuda_gemm_fp8_geglu(&a, NULL, NULL), NIB_ERR_INVALID_ARG);
            CHECK(strstr(nib_last_error(), "NIB_FP8_GEGLU_PDL") != NULL);
            unsetenv("NIB_FP8_GEGLU_PDL");
            nib_clear_error();
        }
        /* a tile that cannot run GeGLU is refused, and an odd weight row count */
        nib_fp8_tile bad = {1, 72, 6, 1, 1};
        nib_blas_gemm_args a = {1, dx, dsx, vec, dw, dsw, vec, m, n, k, NULL, NULL, 0, dy, ldy};
        CHECK_ST(nib_cuda_gemm_fp8_geglu(&a, &bad, NULL), NIB_ERR_INVALID_ARG);
        a.n = n - 1;
        CHECK_ST(nib_cuda_gemm_fp8_geglu(&a, NULL, NULL), NIB_ERR_SHAPE);
        nib_clear_error();
        nib_dev_free(dx, (size_t)m * k);
        nib_dev_free(dw, (size_t)n * k);
        nib_dev_free(dy, (size_t)rows * ldy * 2);
        nib_dev_free(db, (size_t)n * 2);
        nib_dev_free(dsx, (size_t)m * 4);
        nib_dev_free(dsw, (size_t)n * 4);
        nib_free(hx), nib_free(hw), nib_free(hsx), nib_free(hsw), nib_free(hb), nib_free(hy), nib_free(hy0);
        nib_free(S), nib_free(B);
    }
    printf("  fp8 nib GeGLU: worst error / bound %.3f over every tile and case\n", worst);
}

/* The ping-pong rule (nib_fp8_geglu_pp) at the shapes it was measured on: Gemma's gate|up, 2048 -> 2 x 16384, at 276
 * and 532 rows (one and two cameras). The planner's product (no tile given) gives the bits of the forced tile
 * (NIB_FP8_PP=64x256 / 192x128: the dispatch reaches that kernel), every guard value untouched, and sampled rows (the
 * first, one inside, the last: a partial tile) against fp64 within geglu_check's bound on every 8th output column. */
NIB_TEST(gemm_fp8_gpu_geglu_pp_rule) {
    NIB_REQUIRE_GPU();
    const char *fte = getenv("NIB_FAST_TANH");
    const int approx = !(fte && !strcmp(fte, "0"));
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t h = 16384, n = 2 * h, k = 2048, ldy = h + 8;
    const struct {
        int64_t m;
        const char *tile;
    } cases[] = {{276, "64x256"}, {532, "192x128"}};
    uint8_t *hw = nib_malloc((size_t)n * k);
    float *hsw = nib_malloc((size_t)n * 4);
    REQUIRE(hw && hsw);
    void *dw;
    float *dsw;
    CHECK_OK(nib_dev_malloc(&dw, (size_t)n * k, "w"));
    CHECK_OK(nib_dev_malloc((void **)&dsw, (size_t)n * 4, "sw"));
    double worst = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t m = cases[ci].m, rows = m + 1;
        int pr = 0, pc = 0; /* the launch's own answer: the ping-pong tile of the case, and none when turned off */
        CHECK_OK(nib_cuda_fp8_geglu_pp(m, n, k, &pr, &pc));
        char got[32];
        snprintf(got, sizeof got, "%dx%d", pr, pc);
        CHECK_MSG(!strcmp(got, cases[ci].tile), "fp8 GeGLU M=%lld: the rule runs %s, expected %s", (long long)m, got,
                  cases[ci].tile);
        setenv("NIB_FP8_PP", "0", 1);
        CHECK_OK(nib_cuda_fp8_geglu_pp(m, n, k, &pr, &pc));
        CHECK(pr == 0 && pc == 0);
        setenv("NIB_FP8_PP", "64x64", 1);
        CHECK_ST(nib_cuda_fp8_geglu_pp(m, n, k, &pr, &pc), NIB_ERR_INVALID_ARG);
        unsetenv("NIB_FP8_PP");
        nib_clear_error();
        uint8_t *hx = nib_malloc((size_t)m * k);
        float *hsx = nib_malloc((size_t)m * 4);
        uint16_t *hb = nib_malloc((size_t)n * 2), *hy = nib_malloc((size_t)rows * ldy * 2),
                 *hy0 = nib_malloc((size_t)rows * ldy * 2);
        REQUIRE(hx && hsx && hb && hy && hy0);
        fp8_rand_inputs(&rng, m, ci == 0 ? n : 0, k, hx, hw, hsx, hsw, hb); /* W once, X per case */
        void *dx, *dy;
        float *dsx;
        CHECK_OK(nib_dev_malloc(&dx, (size_t)m * k, "x"));
        CHECK_OK(nib_dev_malloc(&dy, (size_t)rows * ldy * 2, "y"));
        CHECK_OK(nib_dev_malloc((void **)&dsx, (size_t)m * 4, "sx"));
        CHECK_OK(nib_dev_upload(dx, hx, (size_t)m * k));
        CHECK_OK(nib_dev_upload(dsx, hsx, (size_t)m * 4));
        if (ci == 0) {
            CHECK_OK(nib_dev_upload(dw, hw, (size_t)n * k));
            CHECK_OK(nib_dev_upload(dsw, hsw, (size_t)n * 4));
        }
        nib_blas_gemm_args a = {1, dx, dsx, 1, dw, dsw, 1, m, n, k, NULL, NULL, 0, dy, ldy};
        for (int v = 0; v < 2; v++) { /* the rule, then the forced tile */
            uint16_t *out = v ? hy0 : hy;
            for (int64_t i = 0; i < rows * ldy; i++) out[i] = (uint16_t)POISON;
            CHECK_OK(nib_dev_upload(dy, out, (size_t)rows * ldy * 2));
            if (v) setenv("NIB_FP8_PP", cases[ci].tile, 1);
            CHECK_OK(nib_cuda_gemm_fp8_geglu(&a, NULL, NULL));
            unsetenv("NIB_FP8_PP");
            CHECK_OK(nib_dev_download(out, dy, (size_t)rows * ldy * 2));
        }
        int64_t diff = 0, guard = 0;
        for (int64_t i = 0; i < rows * ldy; i++) {
            diff += hy[i] != hy0[i];
            if (i / ldy >= m || i % ldy >= h) guard += hy[i] != POISON;
        }
        CHECK_MSG(diff == 0, "fp8 GeGLU M=%lld: the rule's product differs from NIB_FP8_PP=%s in %lld values",
                  (long long)m, cases[ci].tile, (long long)diff);
        CHECK_MSG(guard == 0, "fp8 GeGLU M=%lld (rule): %lld guard values overwritten", (long long)m, (long long)guard);
        const int64_t sample[] = {0, m / 2 + 1, m - 1};
        int over = 0;
        for (int si = 0; si < 3; si++)
            for (int64_t j = si; j < h; j += 8) {
                const int64_t i = sample[si];
                double g, u, eg, eu;
                fp8_ref_sum1(hx, hw, hsx, hsw, 1, i, j, k, &g, &eg);
                fp8_ref_sum1(hx, hw, hsx, hsw, 1, i, h + j, k, &u, &eu);
                eg += 0x1p-20 * (fabs(g) + 1.0), eu += 0x1p-20 * (fabs(u) + 1.0);
                const double want = gelu_tanh_ref(g) * u, y = nib_bf16_to_f32(hy[i * ldy + j]);
                const double bound = geglu_bound(g, u, eg, eu, approx);
                if (fabs(y - want) / bound > worst) worst = fabs(y - want) / bound;
                if (!(fabs(y - want) <= bound) && over++ < 3)
                    nib_test_fail(t, __FILE__, __LINE__, "fp8 GeGLU M=%lld (rule) [%lld,%lld]: %g vs %g (bound %g)",
                                  (long long)m, (long long)i, (long long)j, y, want, bound);
            }
        nib_dev_free(dx, (size_t)m * k);
        nib_dev_free(dy, (size_t)rows * ldy * 2);
        nib_dev_free(dsx, (size_t)m * 4);
        nib_free(hx), nib_free(hsx), nib_free(hb), nib_free(hy), nib_free(hy0);
    }
    nib_dev_free(dw, (size_t)n * k);
    nib_dev_free(dsw, (size_t)n * 4);
    nib_free(hw), nib_free(hsw);
    printf("  fp8 GeGLU ping-pong rule: worst error / bound %.3f on the sampled rows\n", worst);
}

NIB_TEST(gemm_fp8_gpu_every_tile) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    const fp8_case cases[] = {
        {1, 8, 16, 1, 0, 0},     {37, 72, 1168, 1, 1, 1}, {63, 264, 144, 0, 1, 2},
        {130, 136, 4304, 1, 0, 2}, {532, 200, 2064, 1, 1, 0},
    };
    double worst = 0;
    int cpre_runs = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double w = 0;
        fp8_case_run(t, &rng, &cases[i], &w, &cpre_runs);
        printf("  fp8 nib M=%lld N=%lld K=%lld: worst error / bound %.3f over every tile\n", (long long)cases[i].m,
               (long long)cases[i].n, (long long)cases[i].k, w);
        if (w > worst) worst = w;
    }
    printf("  fp8 nib: worst error / bound %.3f over every tile and case; %d runs with C bitwise the same under "
           "NIB_FP8_EPI_CPRE=0 (the A/B switch)\n", worst, cpre_runs);
    CHECK_MSG(cpre_runs > 0, "NIB_FP8_EPI_CPRE=0 must be exercised");
}

/* bad arguments: named errors, nothing launched */
NIB_TEST(gemm_fp8_gpu_argument_errors) {
    NIB_REQUIRE_GPU();
    void *d = NULL;
    CHECK_OK(nib_dev_malloc(&d, 1 << 16, "buf"));
    REQUIRE(d);
    float *s = (float *)((char *)d + 32768);
    uint8_t *x = d;
    nib_blas_gemm_args a = {1, x, s, 1, x + 4096, s, 1, 16, 64, 64, NULL, NULL, 0, x + 16384, 64};
    a.k = 40;
    CHECK_ST(nib_cuda_gemm_fp8(&a, NULL, NULL), NIB_ERR_SHAPE); /* K not a multiple of 16 */
    a.k = 64, a.n = 60;
    CHECK_ST(nib_cuda_gemm_fp8(&a, NULL, NULL), NIB_ERR_SHAPE); /* N not a multiple of 8 */
    a.n = 64, a.x = x + 8;
    CHECK_ST(nib_cuda_gemm_fp8(&a, NULL, NULL), NIB_ERR_INVALID_ARG); /* X not 16-byte aligned */
    a.x = x, a.c = x + 16384 + 64, a.ldc = 64;
    CHECK_ST(nib_cuda_gemm_fp8(&a, NULL, NULL), NIB_ERR_INVALID_ARG); /* C overlaps Y */
    a.c = a.y, a.ldc = 72, a.ldy = 64;
    CHECK_ST(nib_cuda_gemm_fp8(&a, NULL, NULL), NIB_ERR_INVALID_ARG); /* C is Y with another stride */
    a.c = NULL;
    nib_fp8_tile bad = {3, 64, 4, 1, 1};
    CHECK_ST(nib_cuda_gemm_fp8(&a, &bad, NULL), NIB_ERR_INVALID_ARG); /* no such tile */
    a.fp8 = 0;
    CHECK_ST(nib_cuda_gemm_fp8(&a, NULL, NULL), NIB_ERR_INVALID_ARG);
    a.fp8 = 1;
    setenv("NIB_FP8_EPI_CPRE", "yes", 1); /* a bad switch value is named, not read as on or off */
    CHECK_ST(nib_cuda_gemm_fp8(&a, NULL, NULL), NIB_ERR_INVALID_ARG);
    CHECK_MSG(strstr(nib_last_error(), "NIB_FP8_EPI_CPRE") != NULL, "a bad NIB_FP8_EPI_CPRE: %s", nib_last_error());
    unsetenv("NIB_FP8_EPI_CPRE");
    nib_clear_error();
    nib_dev_free(d, 1 << 16);
}

/* ---- the q|k|v product with ops/qkv.h's epilogue (nib_cuda_gemm_qkv) ------------------------------
 * A weight loaded with rope_half = head_dim / 2 (the RoPE pair layout) through nib_cuda_gemm_qkv,
 * against the two kernels it replaces: the same weight loaded plainly, its product (the same plan),
 * then nib_cuda_qkv. The fused epilogue rounds each product to bf16 first and rotates with k_qkv's
 * fp32 operations and the same (cos, sin) (nib_cuda_rope_table), so q, the cache and every guard
 * around them must be bitwise equal; so must the pair layout's two-kernel form (NIB_GEMM_QKV=0: the
 * pair-layout product, then nib_cuda_qkv with pairs = 1). Cases: every low-bit format, the Pi0.5
 * expert's heads (8 + 1 + 1 of 256, K = 1024) and awkward ones (3 + 2 + 2 of 64 with a bias, 1 + 1 + 1
 * of 32), M from 1 to 100 (where the planner takes the wgmma kernel: two kernels), every mma.sync
 * plan of the expert's shape at M = 10, 16 and 50 (K splits: the fused split-K finish), q only, the
 * cache only, and slots past the cache's end (skipped). */
typedef struct qkv_dev {
    void *x, *q0, *q1, *c0, *c1, *y, *pos, *inv, *cs, *base;
    size_t xb, qb, cb, yb;
} qkv_dev;

static void qkv_dev_free(qkv_dev *d) {
    nib_dev_free(d->x, d->xb);
    nib_dev_free(d->q0, d->qb);
    nib_dev_free(d->q1, d->qb);
    nib_dev_free(d->c0, d->cb);
    nib_dev_free(d->c1, d->cb);
    nib_dev_free(d->y, d->yb);
    nib_dev_free(d->pos, 4096);
    nib_dev_free(d->inv, 4096);
    nib_dev_free(d->cs, 1 << 20);
    nib_dev_free(d->base, 256);
    memset(d, 0, sizeof *d);
}

typedef struct qkv_case {
    int32_t nh, nkv, hd;
    int64_t k;
    int bias;
} qkv_case;

/* one M through both paths (plan: NULL or one of nib_cuda_gemm_plans'); outputs: q only (1), cache
 * only (2), both (3); returns 1 where the product fused its epilogue */
static int qkv_run(nib_test_ctx *t, nib_rng *rng, const qkv_case *c, const nib_qweight *w0, const nib_qweight *w1,
                   int64_t m, const nib_gemm_plan *plan, int outs, int slot_base, nib_gemm_ws *ws, const char *fmt) {
    const int64_t width = ((int64_t)c->nh + 2 * c->nkv) * c->hd, ldq = (int64_t)c->nh * c->hd + 8, ldy = width + 16;
    const int32_t t_max = (int32_t)m + 7, slot_off = 3;
    qkv_dev d;
    memset(&d, 0, sizeof d);
    d.xb = (size_t)(m * c->k) * 2, d.qb = (size_t)(m * ldq) * 2, d.yb = (size_t)(m * ldy) * 2;
    d.cb = (size_t)nib_kv_layer_bytes(NIB_KV_BF16, t_max, c->nkv, c->hd);
    int fused = -1;
    uint16_t *hx = nib_malloc(d.xb), *hq0 = nib_malloc(d.qb), *hq1 = nib_malloc(d.qb);
    uint8_t *hc0 = nib_malloc(d.cb), *hc1 = nib_malloc(d.cb);
    int32_t pos[128], basev = slot_base;
    float inv[256];
    if (!hx || !hq0 || !hq1 || !hc0 || !hc1 || m > 128) {
        CHECK_MSG(0, "host buffers");
        goto done;
    }
    for (int64_t i = 0; i < m * c->k; i++) hx[i] = nib_f32_to_bf16((float)nib_rng_normal(rng));
    for (int64_t i = 0; i < m; i++) pos[i] = (int32_t)nib_rng_below(rng, 5000);
    CHECK_OK(nib_rope_inv_freq(NIB_ROPE_THETA, c->hd, inv));
    CHECK_OK(nib_dev_malloc(&d.x, d.xb, "x"));
    CHECK_OK(nib_dev_malloc(&d.q0, d.qb, "q0"));
    CHECK_OK(nib_dev_malloc(&d.q1, d.qb, "q1"));
    CHECK_OK(nib_dev_malloc(&d.c0, d.cb, "cache0"));
    CHECK_OK(nib_dev_malloc(&d.c1, d.cb, "cache1"));
    CHECK_OK(nib_dev_malloc(&d.y, d.yb, "qkv"));
    CHECK_OK(nib_dev_malloc(&d.pos, 4096, "pos"));
    CHECK_OK(nib_dev_malloc(&d.inv, 4096, "inv_freq"));
    CHECK_OK(nib_dev_malloc(&d.cs, 1 << 20, "rope table"));
    CHECK_OK(nib_dev_malloc(&d.base, 256, "slot base"));
    CHECK_OK(nib_dev_upload(d.x, hx, d.xb));
    CHECK_OK(nib_dev_upload(d.pos, pos, (size_t)m * 4));
    CHECK_OK(nib_dev_upload(d.inv, inv, (size_t)c->hd / 2 * 4));
    CHECK_OK(nib_dev_upload(d.base, &basev, 4));
    CHECK_OK(nib_cuda_rope_table((const int32_t *)d.pos, (const float *)d.inv, m, c->hd, d.cs, NULL));
    for (int path = 0; path < 3; path++) { /* 0 the plain two kernels, 1 nib_cuda_gemm_qkv, 2 the same, NIB_GEMM_QKV=0 */
        void *q = path ? d.q1 : d.q0, *cm = path ? d.c1 : d.c0;
        uint16_t *hq = path ? hq1 : hq0;
        uint8_t *hc = path ? hc1 : hc0;
        for (size_t i = 0; i < d.qb / 2; i++) hq[i] = POISON;
        for (size_t i = 0; i < d.cb / 2; i++) ((uint16_t *)hc)[i] = POISON;
        CHECK_OK(nib_dev_upload(q, hq, d.qb));
        CHECK_OK(nib_dev_upload(cm, hc, d.cb));
        nib_kv_layer kv;
        CHECK_OK(nib_kv_layer_map(&kv, NIB_KV_BF16, t_max, c->nkv, c->hd, cm));
        nib_qkv_args a;
        memset(&a, 0, sizeof a);
        a.tokens = m, a.n_heads = c->nh, a.n_kv_heads = c->nkv, a.head_dim = c->hd, a.qkv = d.y, a.ld_qkv = ldy;
        a.positions = (const int32_t *)d.pos, a.inv_freq = (const float *)d.inv, a.q_scale = 0.0625f;
        a.q = (outs & 1) ? q : NULL, a.ld_q = ldq, a.cache = (outs & 2) ? &kv : NULL;
        a.slot_offset = slot_off, a.slot_base = (const int32_t *)d.base;
        if (path == 0) {
            CHECK_OK(nib_cuda_gemm_planned(w0, d.x, m, c->k, d.y, ldy, NULL, ws, plan, NULL));
            CHECK_OK(nib_cuda_qkv(&a, NULL));
        } else {
            a.rope_cs = d.cs;
            if (path == 2) setenv("NIB_GEMM_QKV", "0", 1);
            const int f = nib_cuda_gemm_qkv_fuses(w1, m, &a, ws, plan);
            CHECK_OK(nib_cuda_gemm_qkv(w1, d.x, m, c->k, &a, ws, plan, NULL));
            if (path == 2) {
                unsetenv("NIB_GEMM_QKV");
                CHECK_MSG(f == 0, "NIB_GEMM_QKV=0 still fuses");
            } else {
                fused = f;
            }
        }
        CHECK_OK(nib_dev_sync());
        CHECK_OK(nib_dev_download(hq, q, d.qb));
        CHECK_OK(nib_dev_download(hc, cm, d.cb));
        if (path) {
            size_t bad_q = 0, bad_c = 0, first_q = 0;
            for (size_t i = 0; i < d.qb / 2; i++)
                if (hq1[i] != hq0[i] && !bad_q++) first_q = i;
            for (size_t i = 0; i < d.cb; i++) bad_c += hc1[i] != hc0[i];
            CHECK_MSG(!bad_q && !bad_c,
                      "%s %d+%d+%d heads of %d, K=%lld, M=%lld%s%s%s outs %d, base %d, path %d (fused %d): %zu q values "
                      "differ (first at %zu: %04x vs %04x), %zu cache bytes", fmt, c->nh, c->nkv, c->nkv, c->hd,
                      (long long)c->k, (long long)m, plan ? " plan" : "", plan && plan->ksplit > 1 ? " split-K" : "",
                      plan && plan->m_chunks > 1 ? " M-split" : "", outs, slot_base, path, fused, bad_q, first_q,
                      hq1[first_q], hq0[first_q], bad_c);
        }
    }
    /* the composition wrote something (a poisoned output left poisoned would pass the comparison) */
    if (outs & 1) CHECK_MSG(hq0[0] != POISON && hq0[(m - 1) * ldq + c->nh * c->hd - 1] != POISON, "q not written");
    if (outs & 2) {
        const int64_t s = slot_off + slot_base; /* token 0's slot: in range in every case here */
        CHECK_MSG(((uint16_t *)hc0)[s * c->nkv * c->hd] != POISON, "cache not written");
    }
done:
    qkv_dev_free(&d);
    nib_free(hx), nib_free(hq0), nib_free(hq1), nib_free(hc0), nib_free(hc1);
    return fused;
}

NIB_TEST(gemm_gpu_qkv_epilogue) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_gemm_ws ws;
    gemm_test_begin(t, &rng, &ws, 128, 4096);
    const qkv_case cases[] = {{8, 1, 256, 1024, 0}, {3, 2, 64, 336, 1}, {1, 1, 32, 160, 0}};
    const nib_wfmt fs[] = {NIB_WFMT_NVFP4, NIB_WFMT_MXFP4, NIB_WFMT_INT4, NIB_WFMT_FP8};
    const int64_t ms[] = {1, 7, 10, 16, 33, 64, 100};
    int runs = 0, fused = 0, fused_split = 0, unfused = 0, wg_fused = 0, wg_kcl = 0, wg_ws = 0;
    for (size_t ci = 0; ci < NIB_ARRAY_LEN(cases); ci++)
        for (size_t fi = 0; fi < NIB_ARRAY_LEN(fs); fi++) {
            const qkv_case *c = &cases[ci];
            const int64_t blk = fs[fi] == NIB_WFMT_INT4 ? 128 : fs[fi] == NIB_WFMT_MXFP4 ? 32 : 16;
            qkv_case cc = *c;
            cc.k = (c->k + blk - 1) / blk * blk;
            rand_w rw;
            REQUIRE(make_rand_w(&rng, fs[fi], ((int64_t)c->nh + 2 * c->nkv) * c->hd, cc.k, 1, 0, 1, c->bias, &rw));
            nib_dev_arena a0, a1;
            nib_qweight w0, w1;
            load_probe(t, &rw.w, 0, &a0, &w0);
            rw.w.rope_half = c->hd / 2;
            load_probe(t, &rw.w, 0, &a1, &w1);
            CHECK(w1.rope_half == c->hd / 2 && w1.np == w0.np);
            for (size_t mi = 0; mi < NIB_ARRAY_LEN(ms); mi++) {
                const int outs = mi % 3 == 1 ? 1 : mi % 3 == 2 ? 2 : 3; /* q only, cache only, both */
                const int base = ms[mi] == 16 ? 8 : 2; /* 16 tokens from slot 11 of 23: the last 4 skipped */
                /* the planner's kernel, both fusing by default; with NIB_GEMM_WG_QKV=0 (every other case) a wgmma
                 * plan runs two kernels */
                nib_gemm_plan pl;
                CHECK_OK(nib_cuda_gemm_plan(&w1, ms[mi], ws.acc_elems, &pl));
                const int wg_off = (int)(mi % 2);
                if (wg_off) setenv("NIB_GEMM_WG_QKV", "0", 1);
                const int f = qkv_run(t, &rng, &cc, &w0, &w1, ms[mi], NULL, outs, base, &ws, nib_wfmt_name(fs[fi]));
                unsetenv("NIB_GEMM_WG_QKV");
                CHECK_MSG(f == !(pl.wgt && wg_off), "%s M=%lld: fused %d with a %s plan (NIB_GEMM_WG_QKV=%d)",
                          nib_wfmt_name(fs[fi]), (long long)ms[mi], f, pl.wgt ? "wgmma" : "mma.sync", !wg_off);
                runs++;
                fused += f == 1;
                unfused += f == 0;
            }
            /* the expert's shape: every mma.sync plan at 10, 16, 50 tokens, with the lean instantiations (the
             * MT = 2 register plans: NIB_GEMM_LEAN) and again with the general kernel only */
            for (int lean = 1; ci == 0 && fi == 0 && lean >= 0; lean--) {
                const int64_t pm[] = {10, 16, 50};
                setenv("NIB_GEMM_LEAN", lean ? "1" : "0", 1);
                const long long lean0 = nib_cuda_gemm_lean_launches();
                for (size_t mi = 0; mi < NIB_ARRAY_LEN(pm); mi++) {
                    static nib_gemm_plan pls[1024];
                    const int np = nib_cuda_gemm_plans(&w1, pm[mi], ws.acc_elems, pls, (int)NIB_ARRAY_LEN(pls));
                    CHECK_MSG(np >= 2 && np < (int)NIB_ARRAY_LEN(pls), "M=%lld: %d plans", (long long)pm[mi], np);
                    for (int p = 0; p < np; p++) {
                        const int f = qkv_run(t, &rng, &cc, &w0, &w1, pm[mi], &pls[p], 3, 2, &ws, "nvfp4");
                        CHECK_MSG(f == 1, "M=%lld plan %d did not fuse", (long long)pm[mi], p);
                        runs++;
                        fused += f == 1;
                        fused_split += f == 1 && pls[p].ksplit > 1;
                    }
                }
                unsetenv("NIB_GEMM_LEAN");
                const long long nl = nib_cuda_gemm_lean_launches() - lean0;
                CHECK_MSG(lean ? nl > 0 : nl == 0, "NIB_GEMM_LEAN=%d: %lld lean launches", lean, nl);
            }
            /* NIB_GEMM_WG_QKV=1: the epilogue in the wgmma kernel, every token tile at 10 / 50 / 100 tokens, one K
             * split, 2 or 3 reduced in their cluster or through the workspace, X multicast over 2 CTAs; the first two
             * cases (the expert's shape; 2 KV heads of 64 with a bias), every format */
            for (int wi = 0; ci < 2 && wi < 4 * 5 * 3; wi++) {
                static const int bts[] = {16, 32, 64, 128};
                const int bt = bts[wi % 4], var = (wi / 4) % 5; /* ks 1, 2 / 3 in a cluster, 2 / 3 via the workspace */
                const int64_t m = (int64_t[]){10, 50, 100}[wi / 20];
                const int ks = var == 0 ? 1 : var % 2 ? 2 : 3, cm = var == 0 && bt >= 64 && (wi / 20) % 2 ? 2 : 1;
                if (ks > w1.kp / 128) continue;
                nib_gemm_plan pl;
                CHECK_OK(nib_cuda_gemm_wg_plan(&w1, m, bt, ks, cm, &pl));
                if (var >= 3) pl.wkcl = 0;
                if (wi % 2) setenv("NIB_GEMM_WG_QKV", "1", 1); /* the default, unset or said */
                const int f = qkv_run(t, &rng, &cc, &w0, &w1, m, &pl, 1 + wi % 3, 2, &ws, nib_wfmt_name(fs[fi]));
                unsetenv("NIB_GEMM_WG_QKV");
                CHECK_MSG(f == 1, "%s M=%lld wgmma tile %d ks%d kcl%d cm%d: NIB_GEMM_WG_QKV=1 did not fuse (%d)",
                          nib_wfmt_name(fs[fi]), (long long)m, bt, ks, pl.wkcl, cm, f);
                runs++;
                fused += f == 1;
                wg_fused += f == 1;
                wg_kcl += f == 1 && pl.wkcl;
                wg_ws += f == 1 && ks > 1 && !pl.wkcl;
            }
            nib_dev_arena_free(&a0);
            nib_dev_arena_free(&a1);
            rand_w_free(&rw);
        }
    printf("  %d cases bitwise equal to the product + nib_cuda_qkv (%d fused in the product's epilogue, %d of them "
           "with a K split; %d on the wgmma kernel with NIB_GEMM_WG_QKV=0, two kernels; %d fused on the wgmma kernel, %d "
           "with the K split in a cluster, %d through the workspace)\n", runs, fused, fused_split, unfused, wg_fused, wg_kcl,
           wg_ws);
    CHECK_MSG(wg_kcl > 0 && wg_ws > 0, "the wgmma kernel's q|k|v epilogue after both K-split reductions must be exercised");
    CHECK_MSG(unfused > 0, "NIB_GEMM_WG_QKV=0's two kernels after a wgmma product must be exercised");
    CHECK_MSG(fused_split > 0, "the split-K finish's q|k|v epilogue must be exercised");
    CHECK_MSG(unfused > 0, "the pair layout's two-kernel path (wgmma product) must be exercised");
    nib_cuda_gemm_ws_free(&ws);
}

/* The pair layout is refused where it cannot apply, naming what. */
NIB_TEST(gemm_gpu_qkv_rejects) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    rand_w rw;
    REQUIRE(make_rand_w(&rng, NIB_WFMT_NVFP4, 96, 256, 0, 0, 0, 0, &rw));
    nib_dev_arena a;
    CHECK_OK(nib_dev_arena_init(&a, 1 << 20, "args"));
    nib_qweight q;
    rw.w.rope_half = 12; /* not a power of two */
    CHECK_ST(nib_cuda_weight_load(&rw.w, 0, "w", &a, &q), NIB_ERR_SHAPE);
    rw.w.rope_half = 64; /* 96 rows are not blocks of 128 */
    CHECK_ST(nib_cuda_weight_load(&rw.w, 0, "w", &a, &q), NIB_ERR_SHAPE);
    rw.w.rope_half = 16;
    CHECK_ST(nib_cuda_weight_load(&rw.w, 1, "w", &a, &q), NIB_ERR_INVALID_ARG); /* with GeGLU */
    CHECK_OK(nib_cuda_weight_load(&rw.w, 0, "w", &a, &q));
    nib_qkv_args qa;
    memset(&qa, 0, sizeof qa);
    void *d = NULL;
    CHECK_OK(nib_dev_malloc(&d, 1 << 16, "buf"));
    qa.tokens = 1, qa.n_heads = 1, qa.n_kv_heads = 1, qa.head_dim = 32, qa.qkv = d, qa.ld_qkv = 96;
    qa.positions = (const int32_t *)d, qa.inv_freq = (const float *)d, qa.q = d, qa.ld_q = 32, qa.q_scale = 1.0f;
    CHECK_OK(nib_cuda_gemm_qkv(&q, d, 1, 256, &qa, NULL, NULL, NULL)); /* (no rope_cs: two kernels) */
    qa.head_dim = 64; /* the weight's pairs are 16 apart */
    CHECK_ST(nib_cuda_gemm_qkv(&q, d, 1, 256, &qa, NULL, NULL, NULL), NIB_ERR_INVALID_ARG);
    qa.head_dim = 32, qa.n_heads = 2; /* 4 heads of 32 != 96 rows */
    qa.ld_qkv = 128, qa.ld_q = 64;
    CHECK_ST(nib_cuda_gemm_qkv(&q, d, 1, 256, &qa, NULL, NULL, NULL), NIB_ERR_SHAPE);
    qa.n_heads = 1, qa.ld_qkv = 96, qa.ld_q = 32;
    setenv("NIB_GEMM_QKV", "2", 1);
    CHECK_ST(nib_cuda_gemm_qkv(&q, d, 1, 256, &qa, NULL, NULL, NULL), NIB_ERR_INVALID_ARG);
    unsetenv("NIB_GEMM_QKV");
    setenv("NIB_GEMM_WG_QKV", "yes", 1);
    CHECK_ST(nib_cuda_gemm_qkv(&q, d, 1, 256, &qa, NULL, NULL, NULL), NIB_ERR_INVALID_ARG);
    CHECK_MSG(strstr(nib_last_error(), "NIB_GEMM_WG_QKV") != NULL, "a bad NIB_GEMM_WG_QKV: %s", nib_last_error());
    unsetenv("NIB_GEMM_WG_QKV");
    CHECK_OK(nib_dev_sync());
    nib_dev_free(d, 1 << 16);
    nib_dev_arena_free(&a);
    rand_w_free(&rw);
}
