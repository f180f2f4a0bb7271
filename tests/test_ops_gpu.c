/* test_ops_gpu.c — the CUDA ops (ops/cuda/norm.cu, rope.cu, act.cu, qkv.cu, edge.cu) against the
 * reference (ops/ref/) on fresh random inputs at awkward row counts (1, 3, 17, 127, 532) and
 * every Pi0.5 dim, with outputs poisoned (bf16 NaN 0x7FC1, e4m3 NaN 0x7F, fp32 NaN, cache bytes
 * 0xA5) and surrounded by guard rows and columns, NaN/Inf checks first, then the error metric.
 *
 * The reference gets the SAME bf16-rounded inputs (as floats); the GPU stores h = x + residual
 * in bf16 and normalizes the stored value, so the reference is run on that bf16 h. The kernels
 * perform the reference's fp32 operations one for one (explicit __f*_rn, fp64 statistics and
 * fp64 sin/cos rounded once: see ops/norm.h, ops/rope.h), so outputs are expected to match bit
 * for bit; the only legitimate differences are (a) an fp32 statistic (norms) or an fp32 sin/cos
 * (RoPE) whose fp64 value lies within ~2^-40 of an fp32 rounding midpoint and so rounds the other
 * way on one backend (probability ~1e-6 per row / ~1e-8 per value), and (b) for activations,
 * CUDA's tanhf/expf (within 2 ulp) vs the host's. Thresholds below are derived from those
 * differences plus the final bf16 rounding (RNE, 8 significant bits: |err| <= 2^-8 |v|, plus
 * 2^-134 absolute in bf16's subnormal range — the unit roundoff of bf16 is 2^-8, not 2^-9).
 *
 * Codes (FP8 y, FP8/NVFP4 cache, bf16 cache) are compared bit for bit. A differing code is
 * allowed, and counted, only when (a) above can explain it: the code is adjacent to the
 * reference's and the reference's fp32 pre-rounding value q lies within a window `win` of the
 * midpoint between the two, win = how far (a) can move q: twice the derived perturbation, in
 * absolute terms of the magnitudes that produced q (for a norm 2^-20 M / scale with M the
 * y-threshold magnitude below; for RoPE'd K 2^-21 (|a| + |b|) / scale, (a, b) the rotated pair,
 * plus 2^-20 |q| for a scale/global one ulp apart) — relative to |q| alone would be wrong where q
 * comes from a cancellation (a shift, a bias, a c - b s). V vectors and the plain K/V write
 * involve no statistic or transcendental: they must match exactly.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "harness.h"
#include "ops/act.h"
#include "ops/edge.h"
#include "ops/kvcache.h"
#include "ops/norm.h"
#include "ops/qkv.h"
#include "ops/rope.h"
#include "runtime/device.h"

#define PBF16 0x7FC1u         /* bf16 NaN with a payload: unwritten bf16 outputs and guards */
#define PE4M3 0x7Fu           /* e4m3 NaN: no finite value quantizes to it */
#define PF32 0x7FC0DEADu      /* fp32 NaN with a payload */
#define PCACHE 0xA5           /* KV-cache poison byte */

static const int64_t k_rows[] = {1, 3, 17, 127, 532};

/* ---- small helpers ------------------------------------------------------------------------ */

static float bfv(uint16_t h) { return nib_bf16_to_f32(h); }
static uint16_t bfr(float f) { return nib_f32_to_bf16(f); }
static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct dbuf {
    void *p;
    size_t n;
} dbuf;

static int dput(nib_test_ctx *t, dbuf *b, const void *host, size_t n) {
    b->n = n;
    b->p = NULL;
    nib_status st = nib_dev_malloc(&b->p, n, "test buffer");
    if (!st && host) st = nib_dev_upload(b->p, host, n);
    if (st) {
        nib_test_fail(t, __FILE__, __LINE__, "device buffer of %zu bytes: %s", n, nib_last_error());
        return 0;
    }
    return 1;
}
static void dfree(dbuf *b) {
    nib_dev_free(b->p, b->n);
    b->p = NULL;
    b->n = 0;
}
static int dget(nib_test_ctx *t, void *host, const dbuf *b) {
    nib_status st = nib_dev_sync();
    if (!st) st = nib_dev_download(host, b->p, b->n);
    if (st) nib_test_fail(t, __FILE__, __LINE__, "download: %s", nib_last_error());
    return st == NIB_OK;
}

/* random bf16 N(0, scale^2), returned as bits */
static void fill_bf16(nib_rng *r, uint16_t *h, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) h[i] = bfr((float)(scale * nib_rng_normal(r)));
}
static void to_float(const uint16_t *h, float *f, int64_t n) {
    for (int64_t i = 0; i < n; i++) f[i] = bfv(h[i]);
}

/* Value check of one bf16 output against the fp32 reference: NaN/Inf first, then |err| <= bound. */
typedef struct vstat {
    int64_t n, exact, bad, nonfinite;
    double worst;
} vstat;
static void vcheck(nib_test_ctx *t, vstat *s, uint16_t got, float ref, double bound, const char *what, int64_t r,
                   int64_t c) {
    const float g = bfv(got);
    s->n++;
    if (!isfinite(g)) {
        if (s->nonfinite++ < 3)
            nib_test_fail(t, __FILE__, __LINE__, "%s row %lld col %lld: output %s (bits 0x%04x; ref %.6g)", what,
                          (long long)r, (long long)c, isnan(g) ? "NaN (unwritten?)" : "Inf", got, ref);
        return;
    }
    const double err = fabs((double)g - (double)ref);
    if (err / bound > s->worst) s->worst = err / bound;
    s->exact += got == bfr(ref);
    if (!(err <= bound) && s->bad++ < 5)
        nib_test_fail(t, __FILE__, __LINE__, "%s row %lld col %lld: got %.8g ref %.8g err %.3g bound %.3g", what,
                      (long long)r, (long long)c, g, ref, err, bound);
}

/* Adjacent-code flips. Returns 0 when the codes are equal (or both zero), 1 for a flip explained
 * by the reference value q (the fp32 value the reference rounded) lying within `win` (absolute)
 * of the midpoint between the two codes' values, 2 otherwise. Magnitude codes of e4m3, e2m1 and
 * bf16 are ordered, so "adjacent" is a magnitude difference of 1 with the same sign bit (a zero
 * of either sign is adjacent to the smallest magnitude of both signs). */
static int flip_kind(double vg, double vr, uint32_t mg, uint32_t mr, int sg, int sr, double q, double win) {
    if (vg == vr) return 0;
    if (sg != sr && mg != 0 && mr != 0) return 2;
    if (mg != mr + 1 && mr != mg + 1) return 2;
    const double mid = 0.5 * (fabs(vg) + fabs(vr));
    return fabs(fabs(q) - mid) <= win ? 1 : 2;
}
static int cmp_e4m3(uint8_t g, uint8_t r, double q, double win) {
    if (g == r) return 0;
    return flip_kind(nib_e4m3_to_f32(g), nib_e4m3_to_f32(r), g & 0x7Fu, r & 0x7Fu, g >> 7, r >> 7, q, win);
}
static int cmp_e2m1(uint8_t g, uint8_t r, double q, double win) {
    if (g == r) return 0;
    return flip_kind(nib_e2m1_to_f32(g), nib_e2m1_to_f32(r), g & 7u, r & 7u, (g >> 3) & 1, (r >> 3) & 1, q, win);
}
static int cmp_bf16(uint16_t g, uint16_t r, double q, double win) {
    if (g == r) return 0;
    return flip_kind(bfv(g), bfv(r), g & 0x7FFFu, r & 0x7FFFu, g >> 15, r >> 15, q, win);
}

/* ======================================================================================
 * norms
 * ====================================================================================== */

typedef struct norm_variant {
    nib_norm_kind kind;
    int use_w;    /* RMS: w given; LAYER: w and b given */
    int residual; /* 0 none, 1 in place into residual, 2 into h_out */
    int outs;     /* 1 y, 2 y_q, 3 both */
    int partial;  /* n_valid = rows - rows / 3 (device int) */
    int gate;     /* with a residual: h = (x * g) + residual (res_gate, the deferred gated residual) */
} norm_variant;

/* One GPU norm call vs the reference; returns 0 if the case could not run.
 * Threshold for y (bf16) per element: 2^-8 |ref| + 2^-20 M + 2^-133 with M = |ref| (RMS),
 * |ref| + |shift| (adaRMS), |ref| + |b| + |mean| rstd |w| (LN). Derivation: identical fp32
 * operations except, rarely, the fp32 statistic one ulp apart; that moves inv/rstd by 2^-23
 * relative and mu by 2^-23 |mu|, the pre-shift product (with its own roundings straddling) by
 * <= 2^-21 of its magnitude (<= M); the GPU's final bf16 rounding adds <= 2^-8 of its fp32 value.
 * FP8 scale: equal, or within 2^-20 relative (the same cause). FP8 code window: 2^-20 M / scale
 * (y moves <= 2^-21 M, the scale <= 2^-21 relative, i.e. q by <= 2^-21 |q| <= 2^-21 M / scale). */
static int norm_case(nib_test_ctx *t, nib_rng *rng, const norm_variant *v, int64_t dim, int64_t rows, int64_t *flips,
                     double *worst) {
    const int64_t ld = dim + 8, ldq = dim + 16, R = rows + 2; /* rows 0 and rows + 1 are guards */
    const int64_t nv = v->partial ? rows - rows / 3 : rows;
    const size_t nb = (size_t)(R * ld);
    uint16_t *hx = nib_malloc(nb * 2), *hr = nib_malloc(nb * 2), *hh = nib_malloc(nb * 2), *hy = nib_malloc(nb * 2);
    uint16_t *gr = nib_malloc(nb * 2), *gh = nib_malloc(nb * 2), *gy = nib_malloc(nb * 2);
    uint8_t *gq = nib_malloc((size_t)(R * ldq)), *rq = nib_malloc((size_t)(rows * dim) + 1);
    float *pw = nib_malloc((size_t)dim * 4), *pb = nib_malloc((size_t)dim * 4), *fh = nib_malloc((size_t)(rows * dim) * 4 + 4);
    float *ry = nib_malloc((size_t)(rows * dim) * 4 + 4), *rs = nib_malloc((size_t)rows * 4 + 4);
    float *gs = nib_malloc((size_t)R * 4), *pg = nib_malloc((size_t)dim * 4);
    dbuf dx = {0}, dr = {0}, dh = {0}, dy = {0}, dq = {0}, ds = {0}, dw = {0}, db = {0}, dn = {0}, dg = {0};
    int ok = 0;
    if (!(hx && hr && hh && hy && gr && gh && gy && gq && rq && pw && pb && fh && ry && rs && gs && pg)) {
        nib_test_fail(t, __FILE__, __LINE__, "host allocation");
        goto done;
    }
    /* inputs: each row at its own scale (2^-6 .. 2^6); guards random too */
    for (int64_t r = 0; r < R; r++) {
        double sc = ldexp(1.0, (int)nib_rng_below(rng, 13) - 6);
        fill_bf16(rng, hx + r * ld, ld, sc);
        fill_bf16(rng, hr + r * ld, ld, sc);
    }
    for (int64_t d = 0; d < dim; d++) {
        pw[d] = (float)(0.5 * nib_rng_normal(rng));
        pb[d] = (float)(0.5 * nib_rng_normal(rng));
        pg[d] = (float)(0.5 * nib_rng_normal(rng)); /* gates of both signs */
    }
    for (size_t i = 0; i < nb; i++) hh[i] = hy[i] = PBF16;
    memset(gq, PE4M3, (size_t)(R * ldq));
    for (int64_t i = 0; i < R; i++) gs[i] = u2f(PF32);
    {
        int32_t nvi = (int32_t)nv;
        if (!(dput(t, &dx, hx, nb * 2) && dput(t, &dr, hr, nb * 2) && dput(t, &dh, hh, nb * 2) &&
              dput(t, &dy, hy, nb * 2) && dput(t, &dq, gq, (size_t)(R * ldq)) && dput(t, &ds, gs, (size_t)R * 4) &&
              dput(t, &dw, pw, (size_t)dim * 4) && dput(t, &db, pb, (size_t)dim * 4) && dput(t, &dn, &nvi, 4) &&
              dput(t, &dg, pg, (size_t)dim * 4)))
            goto done;
    }
    nib_norm_args a;
    memset(&a, 0, sizeof a);
    a.kind = v->kind;
    a.rows = rows;
    a.dim = dim;
    a.n_valid = v->partial ? (const int32_t *)dn.p : NULL;
    a.eps = NIB_NORM_EPS;
    a.x = (uint16_t *)dx.p + ld;
    a.ldx = ld;
    if (v->residual) {
        a.residual = (uint16_t *)dr.p + ld;
        a.ldr = ld;
        if (v->residual == 2) {
            a.h_out = (uint16_t *)dh.p + ld;
            a.ldh = ld;
        }
        if (v->gate) a.res_gate = dg.p;
    }
    if (v->kind == NIB_NORM_ADARMS) {
        a.scale = dw.p;
        a.shift = db.p;
    } else if (v->use_w) {
        a.w = dw.p;
        a.b = v->kind == NIB_NORM_LAYER ? db.p : NULL;
    }
    if (v->outs & 1) {
        a.y = (uint16_t *)dy.p + ld;
        a.ldy = ld;
    }
    if (v->outs & 2) {
        a.y_q = (uint8_t *)dq.p + ldq;
        a.ldq = ldq;
        a.y_scale = (float *)ds.p + 1;
    }
    CHECK_OK(nib_cuda_norm(&a, NULL));
    if (!(dget(t, gr, &dr) && dget(t, gh, &dh) && dget(t, gy, &dy) && dget(t, gq, &dq) && dget(t, gs, &ds))) goto done;

    /* reference on the stored bf16 h of the valid rows */
    for (int64_t r = 0; r < nv; r++)
        for (int64_t d = 0; d < dim; d++) {
            float x = bfv(hx[(r + 1) * ld + d]);
            if (v->residual && v->gate) {
                const float xg = x * pg[d]; /* rounded, then added: the epilogue's order */
                fh[r * dim + d] = bfv(bfr(xg + bfv(hr[(r + 1) * ld + d])));
            } else {
                fh[r * dim + d] = v->residual ? bfv(bfr(x + bfv(hr[(r + 1) * ld + d]))) : x;
            }
        }
    nib_norm_args ra;
    memset(&ra, 0, sizeof ra);
    ra.kind = v->kind;
    ra.rows = nv;
    ra.dim = dim;
    ra.eps = NIB_NORM_EPS;
    ra.x = fh;
    ra.ldx = dim;
    if (v->kind == NIB_NORM_ADARMS) {
        ra.scale = pw;
        ra.shift = pb;
    } else if (v->use_w) {
        ra.w = pw;
        ra.b = v->kind == NIB_NORM_LAYER ? pb : NULL;
    }
    ra.y = ry;
    ra.ldy = dim;
    ra.y_q = rq;
    ra.ldq = dim;
    ra.y_scale = rs;
    CHECK_OK(nib_ref_norm(&ra));

    vstat vs;
    memset(&vs, 0, sizeof vs);
    int64_t bad_h = 0, bad_guard = 0, bad_code = 0, bad_scale = 0;
    for (int64_t r = 0; r < nv; r++) {
        double mean = 0, var = 0;
        if (v->kind == NIB_NORM_LAYER) {
            for (int64_t d = 0; d < dim; d++) mean += fh[r * dim + d];
            mean /= dim;
            for (int64_t d = 0; d < dim; d++) var += (fh[r * dim + d] - mean) * (fh[r * dim + d] - mean);
            var /= dim;
        }
        const double rstd = 1.0 / sqrt(var + 1e-6);
        for (int64_t d = 0; d < dim; d++) {
            const int64_t gi = (r + 1) * ld + d;
            if (v->residual) { /* stored h == bf16(x + r) exactly */
                uint16_t got = v->residual == 2 ? gh[gi] : gr[gi];
                bad_h += got != bfr(fh[r * dim + d]) || bfv(got) != fh[r * dim + d];
            }
            const double yr = ry[r * dim + d];
            double m = fabs(yr);
            if (v->kind == NIB_NORM_ADARMS) m += fabs(pb[d]);
            if (v->kind == NIB_NORM_LAYER) m += (v->use_w ? fabs(pb[d]) + fabs(mean) * rstd * fabs(pw[d]) : fabs(mean) * rstd);
            if (v->outs & 1) vcheck(t, &vs, gy[gi], (float)yr, 0x1p-8 * fabs(yr) + 0x1p-20 * m + 0x1p-133, "norm y", r, d);
            if (v->outs & 2) {
                const float q = ry[r * dim + d] / rs[r];
                int k = cmp_e4m3(gq[(r + 1) * ldq + d], rq[r * dim + d], q, 0x1p-20 * m / rs[r]);
                if (k == 1) (*flips)++;
                if (k == 2 && bad_code++ < 5)
                    nib_test_fail(t, __FILE__, __LINE__, "norm fp8 row %lld col %lld: code 0x%02x ref 0x%02x (y/s = %.9g)",
                                  (long long)r, (long long)d, gq[(r + 1) * ldq + d], rq[r * dim + d], q);
            }
        }
        if (v->outs & 2) {
            const float g = gs[r + 1];
            if (!(fabs((double)g - rs[r]) <= 0x1p-20 * rs[r]) && bad_scale++ < 3)
                nib_test_fail(t, __FILE__, __LINE__, "norm fp8 scale row %lld: %.9g ref %.9g", (long long)r, g, rs[r]);
        }
    }
    /* guards: every bf16 output element outside [valid rows] x [dim] keeps its poison, the
     * residual outside them keeps its input, the FP8 planes keep 0x7F / NaN */
    for (int64_t r = 0; r < R; r++)
        for (int64_t d = 0; d < ld; d++) {
            const int64_t gi = r * ld + d;
            const int inside = r >= 1 && r <= nv && d < dim;
            if (!inside || !(v->outs & 1)) bad_guard += gy[gi] != PBF16;
            if (!inside || v->residual != 2) bad_guard += gh[gi] != PBF16;
            if (!inside || v->residual != 1) bad_guard += gr[gi] != hr[gi];
        }
    for (int64_t r = 0; r < R; r++) {
        for (int64_t d = 0; d < ldq; d++) {
            const int inside = r >= 1 && r <= nv && d < dim && (v->outs & 2);
            if (!inside) bad_guard += gq[r * ldq + d] != PE4M3;
        }
        const int inside = r >= 1 && r <= nv && (v->outs & 2);
        if (!inside) bad_guard += f2u(gs[r]) != PF32;
    }
    CHECK_MSG(vs.nonfinite == 0, "%lld NaN/Inf outputs", (long long)vs.nonfinite);
    CHECK_MSG(bad_h == 0, "%lld stored h values differ from bf16(x%s + residual)", (long long)bad_h,
              v->gate && v->residual ? " * gate" : "");
    CHECK_MSG(bad_guard == 0, "%lld guard / out-of-range values were written", (long long)bad_guard);
    CHECK_MSG(bad_code == 0, "%lld FP8 codes differ beyond boundary flips", (long long)bad_code);
    if (vs.worst > *worst) *worst = vs.worst;
    ok = 1;
done:
    dfree(&dx);
    dfree(&dr);
    dfree(&dh);
    dfree(&dy);
    dfree(&dq);
    dfree(&ds);
    dfree(&dw);
    dfree(&db);
    dfree(&dn);
    dfree(&dg);
    nib_free(pg);
    nib_free(hx);
    nib_free(hr);
    nib_free(hh);
    nib_free(hy);
    nib_free(gr);
    nib_free(gh);
    nib_free(gy);
    nib_free(gq);
    nib_free(rq);
    nib_free(pw);
    nib_free(pb);
    nib_free(fh);
    nib_free(ry);
    nib_free(rs);
    nib_free(gs);
    return ok;
}

static void norm_sweep(nib_test_ctx *t, nib_norm_kind kind, int use_w) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t dims[] = {1024, 1152, 2048};
    int64_t flips = 0;
    int idx = 0;
    for (size_t di = 0; di < NIB_ARRAY_LEN(dims); di++) {
        double worst = 0;
        for (size_t ri = 0; ri < NIB_ARRAY_LEN(k_rows); ri++, idx++) {
            /* two variants per shape, rotating through residual modes, outputs and valid rows */
            norm_variant a = {kind, use_w, idx % 3, 3, 0, idx % 2};
            norm_variant b = {kind, use_w, (idx + 1) % 3, 1 + idx % 2, k_rows[ri] >= 3, (idx + 1) % 2};
            if (!norm_case(t, &rng, &a, dims[di], k_rows[ri], &flips, &worst)) return;
            if (!norm_case(t, &rng, &b, dims[di], k_rows[ri], &flips, &worst)) return;
        }
        printf("  dim %-5lld rows 1..532: worst y err/bound %.3f\n", (long long)dims[di], worst);
    }
    /* the other chunk counts per thread (V = 1 at dim 8, 2 at 4096, 3 at 6144, 4 at 8192) */
    const int64_t xdims[] = {8, 4096, 6144, 8192};
    for (size_t di = 0; di < NIB_ARRAY_LEN(xdims); di++) {
        double worst = 0;
        norm_variant a = {kind, use_w, 1, 3, 0, 0}, b = {kind, use_w, 2, 3, 1, 1};
        if (!norm_case(t, &rng, &a, xdims[di], 3, &flips, &worst)) return;
        if (!norm_case(t, &rng, &b, xdims[di], 17, &flips, &worst)) return;
    }
    printf("  FP8 codes flipped at rounding boundaries: %lld\n", (long long)flips);
}

NIB_TEST(ops_gpu_norm_rms) {
    NIB_REQUIRE_GPU();
    norm_sweep(t, NIB_NORM_RMS, 1);
}
NIB_TEST(ops_gpu_norm_rms_noweight) {
    NIB_REQUIRE_GPU();
    norm_sweep(t, NIB_NORM_RMS, 0);
}
NIB_TEST(ops_gpu_norm_layer) {
    NIB_REQUIRE_GPU();
    norm_sweep(t, NIB_NORM_LAYER, 1);
}
NIB_TEST(ops_gpu_norm_layer_noaffine) {
    NIB_REQUIRE_GPU();
    norm_sweep(t, NIB_NORM_LAYER, 0);
}
NIB_TEST(ops_gpu_norm_adarms) {
    NIB_REQUIRE_GPU();
    norm_sweep(t, NIB_NORM_ADARMS, 0);
}

/* The tests above run the lean instantiations wherever dim <= 2048 (NIB_NORM_LEAN, the default); the general
 * kernel (NIB_NORM_LEAN=0) must pass the same sweeps. A bad NIB_NORM_LEAN is an error naming it. */
NIB_TEST(ops_gpu_norm_general_kernel) {
    NIB_REQUIRE_GPU();
    setenv("NIB_NORM_LEAN", "0", 1);
    norm_sweep(t, NIB_NORM_RMS, 1);
    norm_sweep(t, NIB_NORM_LAYER, 1);
    norm_sweep(t, NIB_NORM_ADARMS, 0);
    setenv("NIB_NORM_LEAN", "yes", 1);
    nib_norm_args a;
    memset(&a, 0, sizeof a);
    dbuf dx = {0};
    if (dput(t, &dx, NULL, 2 * 1024 * 2)) {
        a.kind = NIB_NORM_RMS;
        a.rows = 2;
        a.dim = 1024;
        a.eps = NIB_NORM_EPS;
        a.x = dx.p;
        a.ldx = 1024;
        a.y = dx.p;
        a.ldy = 1024;
        const nib_status st = nib_cuda_norm(&a, NULL);
        CHECK_MSG(st != NIB_OK && strstr(nib_last_error(), "NIB_NORM_LEAN=yes"), "NIB_NORM_LEAN=yes: status %d, %s",
                  (int)st, nib_last_error());
        nib_clear_error();
    }
    unsetenv("NIB_NORM_LEAN");
    dfree(&dx);
}

/* y == x (in place) and h_out == x give the same bits as separate buffers. */
NIB_TEST(ops_gpu_norm_inplace) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t rows = 17, dim = 2048, n = rows * dim;
    uint16_t *hx = nib_malloc((size_t)n * 2), *hr = nib_malloc((size_t)n * 2), *y1 = nib_malloc((size_t)n * 2);
    uint16_t *h1 = nib_malloc((size_t)n * 2), *y2 = nib_malloc((size_t)n * 2), *h2 = nib_malloc((size_t)n * 2);
    dbuf dx = {0}, dr = {0}, dy = {0}, dh = {0};
    REQUIRE(hx && hr && y1 && h1 && y2 && h2);
    fill_bf16(&rng, hx, n, 1.0);
    fill_bf16(&rng, hr, n, 1.0);
    if (dput(t, &dx, hx, (size_t)n * 2) && dput(t, &dr, hr, (size_t)n * 2) && dput(t, &dy, NULL, (size_t)n * 2) &&
        dput(t, &dh, NULL, (size_t)n * 2)) {
        nib_norm_args a;
        memset(&a, 0, sizeof a);
        a.kind = NIB_NORM_RMS;
        a.rows = rows;
        a.dim = dim;
        a.eps = NIB_NORM_EPS;
        a.x = dx.p;
        a.ldx = dim;
        a.residual = dr.p;
        a.ldr = dim;
        a.h_out = dh.p;
        a.ldh = dim;
        a.y = dy.p;
        a.ldy = dim;
        CHECK_OK(nib_cuda_norm(&a, NULL));
        dget(t, y1, &dy);
        dget(t, h1, &dh);
        /* h into x itself */
        a.h_out = dx.p;
        a.ldh = dim;
        CHECK_OK(nib_cuda_norm(&a, NULL));
        dget(t, y2, &dy);
        dget(t, h2, &dx);
        CHECK_MSG(!memcmp(y1, y2, (size_t)n * 2) && !memcmp(h1, h2, (size_t)n * 2), "h_out == x differs");
        /* y into x (x now holds h): normalize in place without residual */
        a.residual = NULL;
        a.h_out = NULL;
        a.y = dx.p;
        CHECK_OK(nib_cuda_norm(&a, NULL));
        dget(t, y2, &dx);
        CHECK_MSG(!memcmp(y1, y2, (size_t)n * 2), "y == x (in place) differs");
    }
    dfree(&dx);
    dfree(&dr);
    dfree(&dy);
    dfree(&dh);
    nib_free(hx);
    nib_free(hr);
    nib_free(y1);
    nib_free(h1);
    nib_free(y2);
    nib_free(h2);
}

/* ======================================================================================
 * RoPE
 * ====================================================================================== */

typedef struct rope_cfg {
    int32_t nh, hd, rot;
    nib_rope_style style;
    int64_t ld; /* 0: nh * hd + 8 */
} rope_cfg;

/* Threshold per element of pair (a, b): 2^-8 |ref| + 2^-21 (|a| + |b|) + 2^-133. Derivation:
 * identical fp32 operations; in the rare midpoint case cos or sin differs by one fp32 ulp
 * (<= 2^-24 absolute, |c|, |s| <= 1), moving a c - b s by <= 2^-24 (|a| + |b|) and letting
 * each of its three roundings straddle (<= 3 * 2^-24 (|a| + |b|)): <= 2^-22 (|a| + |b|),
 * threshold twice that; then the bf16 rounding. */
static void rope_case(nib_test_ctx *t, nib_rng *rng, const rope_cfg *c, int inverse, int64_t T, int partial,
                      vstat *vs, int64_t *bad_guard) {
    const int64_t ld = c->ld ? c->ld : (int64_t)c->nh * c->hd + 8, R = T + 2;
    const int64_t nv = partial ? T - T / 3 : T;
    const size_t nb = (size_t)(R * ld);
    uint16_t *hx = nib_malloc(nb * 2), *gx = nib_malloc(nb * 2);
    float *fx = nib_malloc(nb * 4), *fr = nib_malloc((size_t)c->rot / 2 * 4);
    int32_t *pos = nib_malloc((size_t)T * 4);
    dbuf dx = {0}, dp = {0}, df = {0}, dn = {0};
    if (!(hx && gx && fx && fr && pos)) {
        nib_test_fail(t, __FILE__, __LINE__, "host allocation");
        goto done;
    }
    fill_bf16(rng, hx, (int64_t)nb, 2.0);
    to_float(hx, fx, (int64_t)nb);
    for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)nib_rng_below(rng, i % 7 == 6 ? 65536 : 1024);
    if (nib_rope_inv_freq(NIB_ROPE_THETA, c->rot, fr)) {
        nib_test_fail(t, __FILE__, __LINE__, "inv_freq: %s", nib_last_error());
        goto done;
    }
    {
        int32_t nvi = (int32_t)nv;
        if (!(dput(t, &dx, hx, nb * 2) && dput(t, &dp, pos, (size_t)T * 4) && dput(t, &df, fr, (size_t)c->rot / 2 * 4) &&
              dput(t, &dn, &nvi, 4)))
            goto done;
    }
    nib_rope_args a;
    memset(&a, 0, sizeof a);
    a.style = c->style;
    a.inverse = inverse;
    a.tokens = T;
    a.n_valid = partial ? (const int32_t *)dn.p : NULL;
    a.n_heads = c->nh;
    a.head_dim = c->hd;
    a.rot_dim = c->rot;
    a.positions = dp.p;
    a.inv_freq = df.p;
    a.x = (uint16_t *)dx.p + ld;
    a.ld = ld;
    CHECK_OK(nib_cuda_rope(&a, NULL));
    if (!dget(t, gx, &dx)) goto done;
    nib_rope_args r = a;
    r.n_valid = NULL;
    r.tokens = nv;
    r.positions = pos;
    r.inv_freq = fr;
    r.x = fx + ld;
    CHECK_OK(nib_ref_rope(&r));
    const int32_t half = c->rot / 2;
    for (int64_t row = 0; row < R; row++)
        for (int64_t d = 0; d < ld; d++) {
            const int64_t gi = row * ld + d;
            const int64_t h = d / c->hd, e = d % c->hd;
            if (row < 1 || row > nv || d >= (int64_t)c->nh * c->hd || e >= c->rot) { /* untouched */
                *bad_guard += gx[gi] != hx[gi];
                continue;
            }
            /* the pair partner of element e */
            int64_t p;
            if (c->style == NIB_ROPE_HALF) p = e < half ? e + half : e - half;
            else p = e ^ 1;
            const double ab = fabs(bfv(hx[row * ld + h * c->hd + e])) + fabs(bfv(hx[row * ld + h * c->hd + p]));
            const float ref = fx[gi];
            vcheck(t, vs, gx[gi], ref, 0x1p-8 * fabs(ref) + 0x1p-21 * ab + 0x1p-133, "rope", row - 1, d);
        }
done:
    dfree(&dx);
    dfree(&dp);
    dfree(&df);
    dfree(&dn);
    nib_free(hx);
    nib_free(gx);
    nib_free(fx);
    nib_free(fr);
    nib_free(pos);
}

NIB_TEST(ops_gpu_rope) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    const rope_cfg cfgs[] = {
        {8, 256, 256, NIB_ROPE_HALF, 2560},        /* Gemma q inside the fused QKV row */
        {9, 256, 256, NIB_ROPE_HALF, 2568},        /* q and k */
        {16, 72, 64, NIB_ROPE_HALF, 0},            /* partial rotary, vector path */
        {16, 72, 72, NIB_ROPE_INTERLEAVED, 0},     /* interleaved, vector path */
        {4, 24, 20, NIB_ROPE_HALF, 0},             /* scalar path (rot % 16 != 0) */
        {3, 10, 6, NIB_ROPE_INTERLEAVED, 0},       /* scalar path (head_dim % 8 != 0) */
        {40, 128, 128, NIB_ROPE_HALF, 0},          /* 320 units > 256 threads: the vector loop */
        {16, 40, 36, NIB_ROPE_HALF, 0},            /* 288 pairs > 256 threads: the scalar loop */
    };
    for (size_t ci = 0; ci < NIB_ARRAY_LEN(cfgs); ci++)
        for (int inv = 0; inv < 2; inv++) {
            vstat vs;
            memset(&vs, 0, sizeof vs);
            int64_t bad_guard = 0;
            for (size_t ri = 0; ri < NIB_ARRAY_LEN(k_rows); ri++)
                rope_case(t, &rng, &cfgs[ci], inv, k_rows[ri], (int)(ri % 2), &vs, &bad_guard);
            CHECK_MSG(vs.nonfinite == 0 && bad_guard == 0, "rope %d/%d/%d: %lld NaN/Inf, %lld untouched values changed",
                      cfgs[ci].nh, cfgs[ci].hd, cfgs[ci].rot, (long long)vs.nonfinite, (long long)bad_guard);
            printf("  %2d x %3d rot %3d style %d inverse %d: worst err/bound %.3f, %.5f%% bit-exact\n", cfgs[ci].nh,
                   cfgs[ci].hd, cfgs[ci].rot, (int)cfgs[ci].style, inv, vs.worst,
                   vs.n ? 100.0 * (double)vs.exact / (double)vs.n : 0.0);
        }
}

/* ======================================================================================
 * activations
 * ====================================================================================== */

/* Threshold: 2^-8 |ref| + 2^-19 (|g u| + |ref|) + 2^-133 (u = 1 for GELU). Derivation: the
 * operations are identical except tanhf/expf, CUDA and host within 2 ulp each (4 ulp apart):
 * tanh moves <= 2^-22 (|tanh| < 1), 1 + tanh <= 2^-22 + 2^-23, so gelu moves <= 2^-22 |g| +
 * 2^-21 |gelu| after the straddling roundings; silu: exp 2^-21 relative, 1 + e and the quotient
 * <= 2^-20 |silu|; times u. Threshold >= 2x each. */
/* E4M3 spacing at |q| (normals 2^(e - 3), subnormals 2^-9) */
static double e4m3_step(double q) {
    q = fabs(q);
    return q < 0x1p-6 ? 0x1p-9 : ldexp(1.0, (int)floor(log2(q)) - 3);
}

/* Whether the FP8-only output of kind uses the hardware tanh (ops/act.h: not with NIB_FAST_TANH=0) */
static int act_tanh_approx(nib_act_kind kind, int outs) {
    const char *e = getenv("NIB_FAST_TANH");
    return outs == 2 && kind != NIB_ACT_SWIGLU && !(e && !strcmp(e, "0"));
}

/* One GPU act call vs the reference. outs: 1 bf16 y, 2 FP8 y_q (+ scales), 3 both.
 * y bound per element: 2^-8 |ref| (bf16 rounding) + 2^-19 (|g u| + |ref|) (tanhf/expf within
 * 2 ulp on the GPU, 1 ulp on the host, carried through at most two more roundings).
 * FP8: the scales agree within 2^-18 relative (the amax element moves by the bound above
 * relative to itself, at most 2^-19 (|g u| / |v| + 1) with |g u| ~ |v| where v is the row max);
 * a code may differ from the reference's only as an adjacent-code flip at a rounding midpoint,
 * within the value bound / s plus |q| 2^-18 (the scale's share).
 * FP8 only with GELU / GeGLU (the hardware tanh, ops/act.h): v moves by at most A = E |g u| / 2 beyond
 * the bound above (E = NIB_ACT_TANH_APPROX_ERR), so the row scale by at most E max|g u| / (2 amax)
 * relative, and a code may land several codes from the reference's where 1 + tanh cancels: each
 * dequantized value is checked instead, within half the E4M3 step at q (with the scale's share), A,
 * and the bound above. */
static void act_case(nib_test_ctx *t, nib_rng *rng, nib_act_kind kind, int64_t h, int64_t rows, int partial, int inplace,
                     int outs, vstat *vs, int64_t *bad_guard, int64_t *flips) {
    const int64_t ldx = (kind == NIB_ACT_GELU_TANH ? h : 2 * h) + 8, ldy = inplace ? ldx : h + 8, R = rows + 2;
    const int64_t nv = partial ? rows - rows / 3 : rows, ldq = h + 16;
    uint16_t *hx = nib_malloc((size_t)(R * ldx) * 2), *hy = nib_malloc((size_t)(R * ldy) * 2);
    float *fx = nib_malloc((size_t)(R * ldx) * 4), *fy = nib_malloc((size_t)(R * ldy) * 4);
    uint8_t *gq = nib_malloc((size_t)(R * ldq)), *rq = nib_malloc((size_t)(R * ldq));
    float *gs = nib_malloc((size_t)R * 4), *rs = nib_malloc((size_t)R * 4);
    dbuf dx = {0}, dy = {0}, dn = {0}, dq = {0}, dsc = {0};
    if (!(hx && hy && fx && fy && gq && rq && gs && rs)) {
        nib_test_fail(t, __FILE__, __LINE__, "host allocation");
        goto done;
    }
    fill_bf16(rng, hx, R * ldx, 2.5); /* gates over the whole gelu/silu range */
    to_float(hx, fx, R * ldx);
    for (int64_t i = 0; i < R * ldy; i++) hy[i] = PBF16;
    memset(gq, PE4M3, (size_t)(R * ldq));
    for (int64_t i = 0; i < R; i++) memcpy(gs + i, &(uint32_t){PF32}, 4);
    {
        int32_t nvi = (int32_t)nv;
        if (!(dput(t, &dx, hx, (size_t)(R * ldx) * 2) && dput(t, &dy, hy, (size_t)(R * ldy) * 2) && dput(t, &dn, &nvi, 4) &&
              dput(t, &dq, gq, (size_t)(R * ldq)) && dput(t, &dsc, gs, (size_t)R * 4)))
            goto done;
    }
    nib_act_args a = {kind, rows, partial ? (const int32_t *)dn.p : NULL, h, (uint16_t *)dx.p + ldx, ldx,
                      !(outs & 1) ? NULL : inplace ? (uint16_t *)dx.p + ldx : (uint16_t *)dy.p + ldy, ldy,
                      (outs & 2) ? (uint8_t *)dq.p + ldq : NULL, ldq, (outs & 2) ? (float *)dsc.p + 1 : NULL};
    CHECK_OK(nib_cuda_act(&a, NULL));
    if (!dget(t, hy, inplace ? &dx : &dy) || !dget(t, gq, &dq) || !dget(t, gs, &dsc)) goto done;
    nib_act_args r = {kind, nv, NULL, h, fx + ldx, ldx, fy + ldy, ldy, rq, ldq, rs};
    CHECK_OK(nib_ref_act(&r));
    int64_t bad_code = 0, bad_scale = 0;
    const int approx = act_tanh_approx(kind, outs);
    for (int64_t row = 0; row < R; row++)
        for (int64_t j = 0; j < ldy; j++) {
            const int64_t gi = row * ldy + j;
            const int inside = row >= 1 && row <= nv && j < h;
            if (!inside || !(outs & 1)) {
                *bad_guard += hy[gi] != (inplace ? hx[gi] : PBF16);
                continue;
            }
            const double g = fx[row * ldx + j], u = kind == NIB_ACT_GELU_TANH ? 1.0 : fx[row * ldx + h + j];
            const float ref = fy[gi];
            vcheck(t, vs, hy[gi], ref, 0x1p-8 * fabs(ref) + 0x1p-19 * (fabs(g * u) + fabs(ref)) + 0x1p-133, "act",
                   row - 1, j);
        }
    for (int64_t row = 0; row < R; row++) {
        const int live = row >= 1 && row <= nv && (outs & 2);
        double srel = 0x1p-18; /* the scale's relative bound */
        if (live && approx) {
            double gu = 0.0, am = 0.0;
            for (int64_t j = 0; j < h; j++) {
                const double g = fx[row * ldx + j], u = kind == NIB_ACT_GELU_TANH ? 1.0 : fx[row * ldx + h + j];
                gu = fmax(gu, fabs(g * u));
                am = fmax(am, fabs((double)fy[row * ldy + j]));
            }
            if (am > 0.0) srel += 0.5 * NIB_ACT_TANH_APPROX_ERR * gu / am;
        }
        for (int64_t j = 0; j < ldq; j++) {
            const uint8_t got = gq[row * ldq + j];
            if (!live || j >= h) {
                *bad_guard += got != PE4M3;
                continue;
            }
            const double g = fx[row * ldx + j], u = kind == NIB_ACT_GELU_TANH ? 1.0 : fx[row * ldx + h + j];
            const double ref = fy[row * ldy + j], sr = rs[row - 1], q = ref / sr;
            if (approx) {
                const double gv = (double)nib_e4m3_to_f32(got) * gs[row];
                const double bound = 0.5 * e4m3_step(fabs(q) * (1.0 + srel)) * sr * (1.0 + srel) + fabs(ref) * srel +
                                     0.5 * NIB_ACT_TANH_APPROX_ERR * fabs(g * u) + 0x1p-19 * (fabs(g * u) + fabs(ref)) +
                                     0x1p-133;
                if (!(fabs(gv - ref) <= bound) && bad_code++ < 5)
                    nib_test_fail(t, __FILE__, __LINE__, "act %d fp8 (hardware tanh) row %lld col %lld: %.9g ref %.9g "
                                  "(bound %.3g)", (int)kind, (long long)row - 1, (long long)j, gv, ref, bound);
                continue;
            }
            const double win = (0x1p-19 * (fabs(g * u) + fabs(ref)) + 0x1p-133) / sr + fabs(q) * 0x1p-18;
            const int k = cmp_e4m3(got, rq[(row - 1) * ldq + j], q, win);
            if (k == 1) (*flips)++;
            if (k == 2 && bad_code++ < 5)
                nib_test_fail(t, __FILE__, __LINE__, "act %d fp8 row %lld col %lld: code 0x%02x ref 0x%02x (v/s = %.9g)",
                              (int)kind, (long long)row - 1, (long long)j, got, rq[(row - 1) * ldq + j], q);
        }
        if (!live) {
            *bad_guard += f2u(gs[row]) != PF32;
        } else if (!(fabs((double)gs[row] - rs[row - 1]) <= srel * rs[row - 1]) && bad_scale++ < 3) {
            nib_test_fail(t, __FILE__, __LINE__, "act %d fp8 scale row %lld: %.9g ref %.9g", (int)kind, (long long)row - 1,
                          gs[row], rs[row - 1]);
        }
    }
    CHECK_MSG(bad_code == 0, "act %d H %lld: %lld FP8 codes differ beyond boundary flips", (int)kind, (long long)h,
              (long long)bad_code);
done:
    dfree(&dx);
    dfree(&dy);
    dfree(&dn);
    dfree(&dq);
    dfree(&dsc);
    nib_free(hx);
    nib_free(hy);
    nib_free(fx);
    nib_free(fy);
    nib_free(gq);
    nib_free(rq);
    nib_free(gs);
    nib_free(rs);
}

NIB_TEST(ops_gpu_act) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    /* Gemma-300M, Gemma-2B MLP hidden; SigLIP fc1; tiny; the FP8 output's largest H (a row per
     * cluster of 8 CTAs) and an odd chunk count (129: one CTA, 2 chunks for one thread) */
    const int64_t hs[] = {4096, 16384, 4304, 24, 32768, 1032};
    for (int kind = 0; kind < NIB_ACT_KIND_COUNT; kind++)
        for (size_t hi = 0; hi < NIB_ARRAY_LEN(hs); hi++) {
            vstat vs;
            memset(&vs, 0, sizeof vs);
            int64_t bad_guard = 0, flips = 0;
            for (size_t ri = 0; ri < NIB_ARRAY_LEN(k_rows); ri++)
                act_case(t, &rng, (nib_act_kind)kind, hs[hi], k_rows[ri], (int)(ri % 2), ri == 2, 1 + (int)(ri % 3), &vs,
                         &bad_guard, &flips);
            CHECK_MSG(vs.nonfinite == 0 && bad_guard == 0, "act %d H %lld: %lld NaN/Inf, %lld guard values written", kind,
                      (long long)hs[hi], (long long)vs.nonfinite, (long long)bad_guard);
            printf("  act %d H %-5lld: worst err/bound %.3f, %.4f%% bit-exact, %lld FP8 boundary flips\n", kind,
                   (long long)hs[hi], vs.worst, vs.n ? 100.0 * (double)vs.exact / (double)vs.n : 0.0, (long long)flips);
        }
    /* FP8 output limits: H beyond what one CTA keeps in registers, odd ldq */
    nib_act_args e = {NIB_ACT_GELU_TANH, 1, NULL, 32776, (void *)16, 32776, NULL, 0, (uint8_t *)16, 32776, (float *)16};
    CHECK_ST(nib_cuda_act(&e, NULL), NIB_ERR_SHAPE);
    e.h = 64, e.ldx = 64, e.ldq = 68;
    CHECK_ST(nib_cuda_act(&e, NULL), NIB_ERR_SHAPE);
}

#ifdef NIB_HAVE_CUDA
nib_status nib_test_tanh_sweep(int negative, double *rel, double *sub, unsigned long long *bad); /* tests/tanh_approx_check.cu */
#endif

/* The hardware tanh of the FP8 activation paths (ops/cuda/gelu.cuh) over every float of both signs:
 * its worst relative error over the normal inputs is within NIB_ACT_TANH_APPROX_ERR, which the
 * activation and GeGLU tests carry (and half of it is the margin); subnormal inputs stay within 2^-126
 * absolute; no result is NaN, infinite or above 1 in magnitude. */
NIB_TEST(ops_gpu_tanh_approx_bound) {
#ifndef NIB_HAVE_CUDA
    SKIP("CPU-only build: the hardware tanh is the CUDA kernels'");
#else
    NIB_REQUIRE_GPU();
    for (int neg = 0; neg < 2; neg++) {
        double rel = -1, sub = -1;
        unsigned long long bad = 1;
        CHECK_OK(nib_test_tanh_sweep(neg, &rel, &sub, &bad));
        printf("  %s floats: worst relative error %.4g (2^%.3f), subnormal inputs %.3g absolute, %llu bad\n",
               neg ? "negative" : "positive", rel, log2(rel), sub, bad);
        CHECK_MSG(rel >= 0 && rel <= 0.5 * NIB_ACT_TANH_APPROX_ERR, "worst relative error %.4g over %g / 2", rel,
                  NIB_ACT_TANH_APPROX_ERR);
        CHECK_MSG(sub >= 0 && sub <= 0x1p-126, "subnormal inputs: %.3g", sub);
        CHECK_MSG(bad == 0, "%llu results NaN, infinite or above 1", bad);
    }
#endif
}

/* ======================================================================================
 * QKV epilogue, KV write, KV read
 * ====================================================================================== */

typedef struct cache_pair {
    nib_kv_layer dev, gpu_host, ref; /* device view, host copy of the device bytes, reference */
    void *dmem;
    uint8_t *hmem, *rmem;
    uint64_t bytes;
} cache_pair;

static int cache_pair_init(nib_test_ctx *t, cache_pair *c, nib_kv_dtype dt, int32_t t_max, int32_t nkv, int32_t hd) {
    memset(c, 0, sizeof *c);
    c->bytes = nib_kv_layer_bytes(dt, t_max, nkv, hd);
    c->hmem = nib_malloc((size_t)c->bytes);
    c->rmem = nib_malloc((size_t)c->bytes);
    if (!c->hmem || !c->rmem) return 0;
    memset(c->rmem, PCACHE, (size_t)c->bytes);
    memset(c->hmem, PCACHE, (size_t)c->bytes);
    dbuf b;
    if (!dput(t, &b, c->hmem, (size_t)c->bytes)) return 0;
    c->dmem = b.p;
    return nib_kv_layer_map(&c->dev, dt, t_max, nkv, hd, c->dmem) == NIB_OK &&
           nib_kv_layer_map(&c->gpu_host, dt, t_max, nkv, hd, c->hmem) == NIB_OK &&
           nib_kv_layer_map(&c->ref, dt, t_max, nkv, hd, c->rmem) == NIB_OK;
}
static void cache_pair_free(cache_pair *c) {
    nib_dev_free(c->dmem, (size_t)c->bytes);
    nib_free(c->hmem);
    nib_free(c->rmem);
    memset(c, 0, sizeof *c);
}
static int cache_pair_download(nib_test_ctx *t, cache_pair *c) {
    dbuf b = {c->dmem, (size_t)c->bytes};
    return dget(t, c->hmem, &b);
}

typedef struct cstat {
    int64_t vecs, exact_vecs, flips, rescaled_blocks, bad;
} cstat;

/* One (slot, head) vector of the GPU cache vs the reference cache; x = the reference's fp32
 * vector (the RoPE output for K, the input for V); ab[d] = |a| + |b| of the pair that produced
 * x[d] (K), or NULL: strict, no flips allowed (V, plain write). Windows (see the header): a
 * value moves by <= 2^-22 ab (sin/cos one ulp apart, roundings straddling), a scale or global by
 * <= 2^-21 relative; each window is twice that, in the units of the quotient compared. */
static void cmp_vec(nib_test_ctx *t, cstat *s, const cache_pair *c, int which, int64_t slot, int32_t head,
                    const float *x, const float *ab) {
    const int strict = ab == NULL;
    const nib_kv_layer *g = &c->gpu_host, *r = &c->ref;
    const int32_t hd = r->head_dim;
    const int64_t vec = slot * r->n_kv_heads + head;
    const uint8_t *gp = (const uint8_t *)(which ? g->v : g->k), *rp = (const uint8_t *)(which ? r->v : r->k);
    int64_t bad = 0, flips = 0, resc = 0;
    int exact = 1;
    s->vecs++;
    if (r->dtype == NIB_KV_BF16) {
        for (int32_t d = 0; d < hd; d++) {
            uint16_t gv, rv;
            memcpy(&gv, gp + (vec * hd + d) * 2, 2);
            memcpy(&rv, rp + (vec * hd + d) * 2, 2);
            int k = strict ? (gv != rv) * 2 : cmp_bf16(gv, rv, x[d], 0x1p-21 * ab[d]);
            exact &= gv == rv;
            flips += k == 1;
            bad += k == 2;
        }
    } else if (r->dtype == NIB_KV_FP8) {
        const float gs = (which ? g->vs : g->ks)[vec], rs = (which ? r->vs : r->ks)[vec];
        exact &= f2u(gs) == f2u(rs);
        if (!(fabs((double)gs - rs) <= (strict ? 0.0 : 0x1p-20 * rs))) bad++;
        for (int32_t d = 0; d < hd; d++) {
            const uint8_t gc = gp[vec * hd + d], rc = rp[vec * hd + d];
            const double q = x[d] / rs;
            int k = strict ? (gc != rc) * 2 : cmp_e4m3(gc, rc, q, 0x1p-21 * ab[d] / rs + 0x1p-20 * fabs(q));
            exact &= gc == rc;
            flips += k == 1;
            bad += k == 2;
        }
    } else {
        const float gg = (which ? g->vs : g->ks)[vec], rg = (which ? r->vs : r->ks)[vec];
        const uint8_t *gb = (which ? g->vb : g->kb) + vec * (hd / 16), *rb = (which ? r->vb : r->kb) + vec * (hd / 16);
        const uint8_t *ge = gp + vec * (hd / 2), *re = rp + vec * (hd / 2);
        exact &= f2u(gg) == f2u(rg);
        if (!(fabs((double)gg - rg) <= (strict ? 0.0 : 0x1p-20 * rg))) bad++;
        for (int32_t b = 0; b < hd / 16; b++) {
            exact &= gb[b] == rb[b];
            int rescaled = f2u(gg) != f2u(rg);
            if (gb[b] != rb[b]) {
                float bamax = 0, abmax = 0;
                for (int i = 0; i < 16; i++) bamax = fmaxf(bamax, fabsf(x[b * 16 + i]));
                if (!strict)
                    for (int i = 0; i < 16; i++) abmax = fmaxf(abmax, ab[b * 16 + i]);
                const float sref = bamax / (6.0f * rg); /* the reference's pre-rounding block scale */
                int k = strict ? 2 : cmp_e4m3(gb[b], rb[b], sref, 0x1p-21 * abmax / (6.0 * rg) + 0x1p-20 * sref);
                if (k == 2) {
                    bad++;
                    continue;
                }
                rescaled = 1;
            }
            const float denom_g = nib_e4m3_to_f32(gb[b]) * gg, denom_r = nib_e4m3_to_f32(rb[b]) * rg;
            for (int i = 0; i < 16; i++) {
                const int d = b * 16 + i;
                const uint8_t gc = nib_u4_get(ge, d), rc = nib_u4_get(re, d);
                exact &= gc == rc;
                if (rescaled) { /* another scale: within the GPU block's own rounding (half-gap
                                   <= 1 step, saturation <= 0.4) of its value, 2^-21 ab from x */
                    if (strict || !(fabs((double)nib_e2m1_to_f32(gc) * denom_g - x[d]) <= denom_g + 0x1p-21 * ab[d])) bad++;
                    continue;
                }
                const double q = x[d] / denom_r;
                int k = strict ? (gc != rc) * 2 : cmp_e2m1(gc, rc, q, 0x1p-21 * ab[d] / denom_r + 0x1p-20 * fabs(q));
                flips += k == 1;
                bad += k == 2;
            }
            resc += rescaled;
        }
    }
    s->exact_vecs += exact;
    s->flips += flips;
    s->rescaled_blocks += resc;
    if (bad && s->bad++ < 5)
        nib_test_fail(t, __FILE__, __LINE__, "%s cache %c slot %lld head %d: %lld values/scales differ beyond boundary flips",
                      nib_kv_dtype_name(r->dtype), which ? 'V' : 'K', (long long)slot, head, (long long)bad);
}

/* Every byte of every plane outside the written (slot, head) vectors still holds the poison. */
static int64_t cache_untouched_bad(const nib_kv_layer *l, int64_t s0, int64_t s1) {
    int64_t bad = 0;
    const int32_t hd = l->head_dim, nkv = l->n_kv_heads;
    const int64_t eb = l->dtype == NIB_KV_BF16 ? 2 * hd : l->dtype == NIB_KV_FP8 ? hd : hd / 2;
    for (int w = 0; w < 2; w++) {
        const uint8_t *p = (const uint8_t *)(w ? l->v : l->k);
        const uint8_t *bl = w ? l->vb : l->kb;
        const float *sc = w ? l->vs : l->ks;
        for (int64_t sl = 0; sl < l->t_max; sl++) {
            if (sl >= s0 && sl < s1) continue;
            for (int64_t v = sl * nkv; v < (sl + 1) * nkv; v++) {
                for (int64_t i = 0; i < eb; i++) bad += p[v * eb + i] != PCACHE;
                if (bl)
                    for (int i = 0; i < hd / 16; i++) bad += bl[v * (hd / 16) + i] != PCACHE;
                if (sc) {
                    uint32_t u;
                    memcpy(&u, sc + v, 4);
                    bad += u != 0xA5A5A5A5u;
                }
            }
        }
    }
    return bad;
}

typedef struct qkv_cfg {
    int32_t nh, nkv, hd;
} qkv_cfg;

/* One fused-epilogue call. Variants: slot_base (device int), partial valid tokens, q NULL.
 * q threshold: the RoPE bound scaled by |q_scale|, 2^-8 |ref| + 2^-21 (|a| + |b|) |q_scale| +
 * 2^-133 (the extra q_scale rounding straddling is inside the 2x margin). */
static void qkv_case(nib_test_ctx *t, nib_rng *rng, const qkv_cfg *c, nib_kv_dtype dt, int64_t T, int variant,
                     vstat *vs, cstat *cs) {
    const int32_t nh = c->nh, nkv = c->nkv, hd = c->hd, half = hd / 2;
    const int64_t w = (int64_t)(nh + 2 * nkv) * hd, ld = w + 8, ldq = (int64_t)nh * hd + 8, R = T + 2;
    const int use_base = variant & 1, partial = (variant & 2) && T >= 3, no_q = variant == 3;
    const int64_t nv = partial ? T - T / 3 : T;
    const int32_t off = 2, base = use_base ? 3 : 0, s0 = off + base;
    const float qs = 1.0f / sqrtf((float)hd);
    uint16_t *hx = nib_malloc((size_t)(R * ld) * 2), *gq = nib_malloc((size_t)(R * ldq) * 2);
    float *fx = nib_malloc((size_t)(T * ld) * 4), *rq = nib_malloc((size_t)(T * ldq) * 4), *fr = nib_malloc((size_t)half * 4);
    float *kr = nib_malloc((size_t)nkv * hd * 4), *kab = nib_malloc((size_t)nkv * hd * 4), *rd = nib_malloc((size_t)(nv * nkv * hd) * 4 + 4);
    float *gd = nib_malloc((size_t)(nv * nkv * hd) * 4 + 4);
    uint16_t *gdb = nib_malloc((size_t)(nv * nkv * hd) * 2 + 2);
    int32_t *pos = nib_malloc((size_t)T * 4);
    dbuf dx = {0}, dq = {0}, dp = {0}, df = {0}, dn = {0}, dbs = {0}, drd = {0};
    cache_pair cp;
    memset(&cp, 0, sizeof cp);
    if (!(hx && gq && fx && rq && fr && kr && kab && rd && gd && gdb && pos)) {
        nib_test_fail(t, __FILE__, __LINE__, "host allocation");
        goto done;
    }
    if (!cache_pair_init(t, &cp, dt, (int32_t)(T + s0 + 3), nkv, hd)) {
        nib_test_fail(t, __FILE__, __LINE__, "cache setup");
        goto done;
    }
    fill_bf16(rng, hx, R * ld, 1.5);
    for (int64_t i = 0; i < T; i++) to_float(hx + (i + 1) * ld, fx + i * ld, ld);
    for (int64_t i = 0; i < R * ldq; i++) gq[i] = PBF16;
    for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)nib_rng_below(rng, 1100);
    CHECK_OK(nib_rope_inv_freq(NIB_ROPE_THETA, hd, fr));
    {
        int32_t nvi = (int32_t)nv, bsi = base;
        if (!(dput(t, &dx, hx, (size_t)(R * ld) * 2) && dput(t, &dq, gq, (size_t)(R * ldq) * 2) &&
              dput(t, &dp, pos, (size_t)T * 4) && dput(t, &df, fr, (size_t)half * 4) && dput(t, &dn, &nvi, 4) &&
              dput(t, &dbs, &bsi, 4) && dput(t, &drd, NULL, (size_t)(nv * nkv * hd) * 4 + 4)))
            goto done;
    }
    nib_qkv_args a;
    memset(&a, 0, sizeof a);
    a.tokens = T;
    a.n_valid = partial ? (const int32_t *)dn.p : NULL;
    a.n_heads = nh;
    a.n_kv_heads = nkv;
    a.head_dim = hd;
    a.qkv = (uint16_t *)dx.p + ld;
    a.ld_qkv = ld;
    a.positions = dp.p;
    a.inv_freq = df.p;
    a.q_scale = qs;
    a.q = no_q ? NULL : (uint16_t *)dq.p + ldq;
    a.ld_q = ldq;
    a.cache = &cp.dev;
    a.slot_offset = off;
    a.slot_base = use_base ? (const int32_t *)dbs.p : NULL;
    CHECK_OK(nib_cuda_qkv(&a, NULL));
    if (!dget(t, gq, &dq) || !cache_pair_download(t, &cp)) goto done;

    nib_qkv_args r = a;
    r.tokens = nv;
    r.n_valid = NULL;
    r.qkv = fx;
    r.positions = pos;
    r.inv_freq = fr;
    r.q = no_q ? NULL : rq;
    r.cache = &cp.ref;
    r.slot_offset = s0;
    r.slot_base = NULL;
    CHECK_OK(nib_ref_qkv(&r));

    int64_t bad_guard = 0;
    for (int64_t row = 0; row < R; row++)
        for (int64_t d = 0; d < ldq; d++) {
            const int64_t gi = row * ldq + d;
            if (no_q || row < 1 || row > nv || d >= (int64_t)nh * hd) {
                bad_guard += gq[gi] != PBF16;
                continue;
            }
            const int64_t e = d % hd, p = e < half ? d + half : d - half;
            const double ab = fabs(fx[(row - 1) * ld + d]) + fabs(fx[(row - 1) * ld + p]);
            const float ref = rq[(row - 1) * ldq + d];
            vcheck(t, vs, gq[gi], ref, 0x1p-8 * fabs(ref) + 0x1p-21 * ab * qs + 0x1p-133, "qkv q", row - 1, d);
        }
    for (int64_t tk = 0; tk < nv; tk++) {
        /* the reference's fp32 K after RoPE, V as input */
        memcpy(kr, fx + tk * ld + (int64_t)nh * hd, (size_t)nkv * hd * 4);
        nib_rope_args ro;
        memset(&ro, 0, sizeof ro);
        ro.style = NIB_ROPE_HALF;
        ro.tokens = 1;
        ro.n_heads = nkv;
        ro.head_dim = hd;
        ro.rot_dim = hd;
        ro.positions = pos + tk;
        ro.inv_freq = fr;
        ro.x = kr;
        ro.ld = (int64_t)nkv * hd;
        CHECK_OK(nib_ref_rope(&ro));
        for (int64_t i = 0; i < (int64_t)nkv * hd; i++) { /* |a| + |b| of the pair of K element i */
            const int64_t e = i % hd, p = e < half ? i + half : i - half;
            kab[i] = fabsf(fx[tk * ld + (int64_t)nh * hd + i]) + fabsf(fx[tk * ld + (int64_t)nh * hd + p]);
        }
        for (int32_t h = 0; h < nkv; h++) {
            cmp_vec(t, cs, &cp, 0, s0 + tk, h, kr + (int64_t)h * hd, kab + (int64_t)h * hd);
            cmp_vec(t, cs, &cp, 1, s0 + tk, h, fx + tk * ld + (int64_t)(nh + nkv + h) * hd, NULL);
        }
    }
    bad_guard += cache_untouched_bad(&cp.gpu_host, s0, s0 + nv);
    CHECK_MSG(bad_guard == 0, "%s T %lld variant %d: %lld guard / untouched values were written", nib_kv_dtype_name(dt),
              (long long)T, variant, (long long)bad_guard);

    /* read-back of the written V slots: GPU (fp32 and bf16) == reference read of the GPU bits */
    if (nv > 0) {
        nib_kv_read_args rr = {&cp.gpu_host, 1, s0, (int32_t)nv, rd, NIB_DTYPE_F32};
        CHECK_OK(nib_ref_kv_read(&rr));
        nib_kv_read_args gr = {&cp.dev, 1, s0, (int32_t)nv, drd.p, NIB_DTYPE_F32};
        CHECK_OK(nib_cuda_kv_read(&gr, NULL));
        dbuf tmp = {drd.p, (size_t)(nv * nkv * hd) * 4};
        dget(t, gd, &tmp);
        CHECK_MSG(!memcmp(gd, rd, (size_t)(nv * nkv * hd) * 4), "kv read (F32) differs from the reference read-back");
        gr.out_dtype = NIB_DTYPE_BF16;
        CHECK_OK(nib_cuda_kv_read(&gr, NULL));
        tmp.n = (size_t)(nv * nkv * hd) * 2;
        dget(t, gdb, &tmp);
        int64_t badb = 0;
        for (int64_t i = 0; i < nv * nkv * hd; i++) badb += gdb[i] != bfr(rd[i]);
        CHECK_MSG(badb == 0, "kv read (BF16): %lld values differ from bf16 of the F32 read-back", (long long)badb);
    }
done:
    cache_pair_free(&cp);
    dfree(&dx);
    dfree(&dq);
    dfree(&dp);
    dfree(&df);
    dfree(&dn);
    dfree(&dbs);
    dfree(&drd);
    nib_free(hx);
    nib_free(gq);
    nib_free(fx);
    nib_free(rq);
    nib_free(fr);
    nib_free(kr);
    nib_free(kab);
    nib_free(rd);
    nib_free(gd);
    nib_free(gdb);
    nib_free(pos);
}

static void qkv_sweep(nib_test_ctx *t, nib_kv_dtype dt) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const qkv_cfg gemma = {8, 1, 256};
    const qkv_cfg other[] = {{4, 2, 128}, {2, 3, 64}, {1, 1, 32}, {3, 1, 512}};
    vstat vs;
    cstat cs;
    memset(&vs, 0, sizeof vs);
    memset(&cs, 0, sizeof cs);
    for (size_t ri = 0; ri < NIB_ARRAY_LEN(k_rows); ri++)
        for (int variant = 0; variant < 4; variant++) qkv_case(t, &rng, &gemma, dt, k_rows[ri], variant, &vs, &cs);
    for (size_t ci = 0; ci < NIB_ARRAY_LEN(other); ci++) {
        qkv_case(t, &rng, &other[ci], dt, 3, 0, &vs, &cs);
        qkv_case(t, &rng, &other[ci], dt, 17, 3, &vs, &cs);
    }
    CHECK_MSG(vs.nonfinite == 0, "%lld NaN/Inf q values", (long long)vs.nonfinite);
    printf("  %s: q worst err/bound %.3f (%.4f%% bit-exact); cache vectors %lld, bit-exact %lld, code flips at "
           "boundaries %lld, re-scaled NVFP4 blocks %lld\n",
           nib_kv_dtype_name(dt), vs.worst, vs.n ? 100.0 * (double)vs.exact / (double)vs.n : 0.0, (long long)cs.vecs,
           (long long)cs.exact_vecs, (long long)cs.flips, (long long)cs.rescaled_blocks);
}

NIB_TEST(ops_gpu_qkv_bf16) {
    NIB_REQUIRE_GPU();
    qkv_sweep(t, NIB_KV_BF16);
}
NIB_TEST(ops_gpu_qkv_fp8) {
    NIB_REQUIRE_GPU();
    qkv_sweep(t, NIB_KV_FP8);
}
NIB_TEST(ops_gpu_qkv_nvfp4) {
    NIB_REQUIRE_GPU();
    qkv_sweep(t, NIB_KV_NVFP4);
}

/* The sweeps above run the lean instantiations (NIB_QKV_LEAN, the default: the cache dtype and the pair
 * layout compiled in); the general kernel (NIB_QKV_LEAN=0) must pass them too, and a bad value is an error
 * naming it. */
NIB_TEST(ops_gpu_qkv_general_kernel) {
    NIB_REQUIRE_GPU();
    setenv("NIB_QKV_LEAN", "0", 1);
    for (int dt = 0; dt < NIB_KV_COUNT; dt++) qkv_sweep(t, (nib_kv_dtype)dt);
    setenv("NIB_QKV_LEAN", "2", 1);
    dbuf dx = {0};
    if (dput(t, &dx, NULL, 2 * 3 * 64 * 2)) {
        nib_qkv_args a;
        memset(&a, 0, sizeof a);
        a.tokens = 2;
        a.n_heads = 1;
        a.n_kv_heads = 1;
        a.head_dim = 64;
        a.qkv = dx.p;
        a.ld_qkv = 3 * 64;
        a.q = dx.p;
        a.ld_q = 3 * 64;
        a.q_scale = 1.0f;
        a.positions = (const int32_t *)dx.p; /* (never read: the error comes first) */
        a.inv_freq = (const float *)dx.p;
        const nib_status st = nib_cuda_qkv(&a, NULL);
        CHECK_MSG(st != NIB_OK && strstr(nib_last_error(), "NIB_QKV_LEAN=2"), "NIB_QKV_LEAN=2: status %d, %s", (int)st,
                  nib_last_error());
        nib_clear_error();
    }
    unsetenv("NIB_QKV_LEAN");
    dfree(&dx);
}

/* Plain K/V write: no statistic, no transcendental: the cache must equal the reference's byte
 * for byte, poison included. Inputs span 2^-20 .. 2^20 and include an all-zero vector. */
NIB_TEST(ops_gpu_kv_write) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int32_t nkv = 2, hd = 256;
    const int64_t ldk = nkv * hd + 8;
    for (int dt = 0; dt < NIB_KV_COUNT; dt++)
        for (size_t ri = 0; ri < NIB_ARRAY_LEN(k_rows); ri++) {
            const int64_t T = k_rows[ri], nv = ri % 2 ? T - T / 3 : T;
            uint16_t *hk = nib_malloc((size_t)(T * ldk) * 2), *hv = nib_malloc((size_t)(T * ldk) * 2);
            float *fk = nib_malloc((size_t)(T * ldk) * 4), *fv = nib_malloc((size_t)(T * ldk) * 4);
            dbuf dk = {0}, dv = {0}, dn = {0};
            cache_pair cp;
            memset(&cp, 0, sizeof cp);
            REQUIRE(hk && hv && fk && fv);
            REQUIRE(cache_pair_init(t, &cp, (nib_kv_dtype)dt, (int32_t)T + 5, nkv, hd));
            for (int64_t i = 0; i < T; i++) {
                fill_bf16(&rng, hk + i * ldk, ldk, ldexp(1.0, (int)nib_rng_below(&rng, 41) - 20));
                fill_bf16(&rng, hv + i * ldk, ldk, ldexp(1.0, (int)nib_rng_below(&rng, 41) - 20));
            }
            for (int32_t d = 0; d < hd; d++) hv[d] = 0; /* token 0, head 0 of V: all zero */
            to_float(hk, fk, T * ldk);
            to_float(hv, fv, T * ldk);
            int32_t nvi = (int32_t)nv;
            if (dput(t, &dk, hk, (size_t)(T * ldk) * 2) && dput(t, &dv, hv, (size_t)(T * ldk) * 2) && dput(t, &dn, &nvi, 4)) {
                nib_kv_write_args a = {T, ri % 2 ? (const int32_t *)dn.p : NULL, dk.p, ldk, dv.p, ldk, &cp.dev, 4, NULL};
                CHECK_OK(nib_cuda_kv_write(&a, NULL));
                nib_kv_write_args r = {nv, NULL, fk, ldk, fv, ldk, &cp.ref, 4, NULL};
                CHECK_OK(nib_ref_kv_write(&r));
                if (cache_pair_download(t, &cp))
                    CHECK_MSG(!memcmp(cp.hmem, cp.rmem, (size_t)cp.bytes), "%s T %lld: GPU cache bytes differ from the reference",
                              nib_kv_dtype_name((nib_kv_dtype)dt), (long long)T);
            }
            dfree(&dk);
            dfree(&dv);
            dfree(&dn);
            cache_pair_free(&cp);
            nib_free(hk);
            nib_free(hv);
            nib_free(fk);
            nib_free(fv);
        }
}

/* Argument errors are reported before any launch, naming the op and the numbers. */
NIB_TEST(ops_gpu_rejects) {
    NIB_REQUIRE_GPU();
    dbuf d = {0};
    REQUIRE(dput(t, &d, NULL, 1 << 20));
    uint16_t *p = (uint16_t *)d.p;
    nib_norm_args n;
    memset(&n, 0, sizeof n);
    n.kind = NIB_NORM_RMS;
    n.rows = 2;
    n.dim = 1024;
    n.eps = NIB_NORM_EPS;
    n.x = p;
    n.ldx = 1028; /* not a multiple of 8 */
    n.y = p + 8192;
    n.ldy = 1024;
    CHECK_ST(nib_cuda_norm(&n, NULL), NIB_ERR_SHAPE);
    CHECK(strstr(nib_last_error(), "norm (cuda)") && strstr(nib_last_error(), "1028"));
    n.ldx = 1024;
    n.x = p + 1; /* misaligned */
    CHECK_ST(nib_cuda_norm(&n, NULL), NIB_ERR_SHAPE);
    n.x = p;
    n.dim = 1004; /* not a multiple of 8 */
    CHECK_ST(nib_cuda_norm(&n, NULL), NIB_ERR_SHAPE);
    nib_act_args a = {NIB_ACT_GEGLU_TANH, 2, NULL, 1024, p, 2052, p + 8192, 1024, NULL, 0, NULL};
    CHECK_ST(nib_cuda_act(&a, NULL), NIB_ERR_SHAPE);
    CHECK(strstr(nib_last_error(), "act (cuda)") != NULL);
    nib_qkv_args q;
    memset(&q, 0, sizeof q);
    q.tokens = 1;
    q.n_heads = 8;
    q.n_kv_heads = 1;
    q.head_dim = 256;
    q.qkv = p;
    q.ld_qkv = 2564;
    q.positions = (const int32_t *)p;
    q.inv_freq = (const float *)p;
    q.q = p + 8192;
    q.ld_q = 2048;
    CHECK_ST(nib_cuda_qkv(&q, NULL), NIB_ERR_SHAPE);
    CHECK(strstr(nib_last_error(), "qkv epilogue (cuda)") != NULL);
    q.ld_qkv = 2560;
    q.head_dim = 72;
    CHECK_ST(nib_cuda_qkv(&q, NULL), NIB_ERR_SHAPE);
    CHECK_OK(nib_dev_sync());
    dfree(&d);
}

/* ---- the FP8 hand-off's quotient (ops/cuda/fp8_rows.cuh) ------------------------------------ */

#ifdef NIB_HAVE_CUDA
nib_status nib_test_fp8_quot_probe(const float *x, int rows, int k, int mode, uint8_t *codes, float *scales,
                                   uint8_t *fast); /* tests/fp8_quot_check.cu */
#endif

/* Every W8A8 activation kernel (norm, act, the per-token quantizer) computes its codes'
 * quotients v / s with one reciprocal per row and Markstein's correction instead of an IEEE
 * division per value; the claim is that the codes are bit for bit those of the division (the
 * definition, formats/ nib_fp8_quantize). Rows of 4096 fp32 values with amax from 2^-149 to
 * FLT_MAX (so the scale spans the fast path's [2^-60, 2^100] and both sides of it), values
 * spread over 40 binades below amax (bf16-rounded in half the rows), a quarter of each row within an
 * ulp of a midpoint between two e4m3 values (where the quotient's last bit decides the code), signed
 * zeros, subnormals, an all-zero row, a row with +Inf and one with NaN. Checked: fast path == division (codes and
 * scales), division == the host's x / s encoded by formats/ (finite rows), the fast path taken
 * exactly where the scale is in range, and the uncorrected quotient (mode 2) caught. */
NIB_TEST(ops_gpu_fp8_quotient) {
#ifndef NIB_HAVE_CUDA
    SKIP("CPU-only build: the quotient is the CUDA kernels'");
#else
    NIB_REQUIRE_GPU();
    nib_rng r;
    nib_test_rng(t, &r);
    enum { K = 4096, R = 340 };
    float *x = malloc(sizeof(float) * R * K), *sc[3];
    uint8_t *codes[3], *fast[3];
    for (int m = 0; m < 3; m++) {
        sc[m] = malloc(sizeof(float) * R);
        codes[m] = malloc((size_t)R * K);
        fast[m] = malloc(R);
    }
    REQUIRE(x && sc[2] && codes[2] && fast[2]);
    for (int i = 0; i < R; i++) {
        float *row = x + (size_t)i * K;
        /* amax exponent: rows 0..299 sweep -149 .. 127, then the edges of the fast path */
        const int e = i < 300 ? -149 + (i * 276) / 299 : i < 320 ? -62 + (i - 300) % 5 : 98 + (i - 320) % 14;
        const float amax = ldexpf(1.0f + (float)nib_rng_below(&r, 1u << 23) * 0x1p-23f, e);
        for (int j = 0; j < K; j++) {
            const int drop = j < 64 ? 100 + (int)nib_rng_below(&r, 200) : (int)nib_rng_below(&r, 41);
            float v = ldexpf(1.0f + (float)nib_rng_below(&r, 1u << 23) * 0x1p-23f, e - drop);
            if (i & 1) v = nib_bf16_to_f32(nib_f32_to_bf16(v)); /* bf16 inputs (the quantizer's) */
            if (!(fabsf(v) <= amax)) v = amax;
            if (nib_rng_below(&r, 2)) v = -v;
            row[j] = v;
        }
        row[7] = 0.0f, row[8] = -0.0f, row[9] = amax, row[10] = -amax;
        /* a quarter of the row: v / s within an ulp of a midpoint between two e4m3 codes, where the
         * last bit of the fp32 quotient decides the code (random values almost never are) */
        const float s = amax / 448.0f;
        for (int j = K - K / 4; j < K; j++) {
            const uint8_t c = (uint8_t)nib_rng_below(&r, 126);
            const float mid = 0.5f * (nib_e4m3_to_f32(c) + nib_e4m3_to_f32((uint8_t)(c + 1)));
            float v = mid * s;
            v = nextafterf(v, (float)nib_rng_below(&r, 3) - 1.0f) ; /* one ulp down, up or none (toward -1 / 0 / 1) */
            if (!(fabsf(v) <= amax)) v = amax;
            row[j] = nib_rng_below(&r, 2) ? -v : v;
        }
    }
    memset(x, 0, sizeof(float) * K); /* row 0: all zero (scale 1) */
    x[(size_t)1 * K + 5] = INFINITY;  /* row 1: an Inf (scale Inf: the division path) */
    x[(size_t)2 * K + 5] = NAN;       /* row 2: a NaN (amax ignores it) */
    x[(size_t)3 * K + 6] = FLT_MAX;   /* row 3: the largest finite amax */
    float *dx = NULL;
    uint8_t *dq = NULL, *df = NULL;
    float *ds = NULL;
    REQUIRE(nib_dev_malloc((void **)&dx, sizeof(float) * R * K, "probe x") == NIB_OK);
    REQUIRE(nib_dev_malloc((void **)&dq, (size_t)R * K, "probe codes") == NIB_OK);
    REQUIRE(nib_dev_malloc((void **)&ds, sizeof(float) * R, "probe scales") == NIB_OK);
    REQUIRE(nib_dev_malloc((void **)&df, R, "probe flags") == NIB_OK);
    CHECK_OK(nib_dev_upload(dx, x, sizeof(float) * R * K));
    for (int m = 0; m < 3; m++) {
        CHECK_OK(nib_dev_memset(dq, 0xA5, (size_t)R * K));
        CHECK_OK(nib_test_fp8_quot_probe(dx, R, K, m, dq, ds, df));
        CHECK_OK(nib_dev_download(codes[m], dq, (size_t)R * K));
        CHECK_OK(nib_dev_download(sc[m], ds, sizeof(float) * R));
        CHECK_OK(nib_dev_download(fast[m], df, R));
    }
    long bad = 0, bad_host = 0, caught = 0, n_fast = 0, bad_flag = 0;
    for (int i = 0; i < R; i++) {
        const float s = sc[0][i];
        const int want_fast = s >= 0x1p-60f && s <= 0x1p100f;
        n_fast += fast[0][i];
        if (fast[0][i] != want_fast && bad_flag++ < 3)
            nib_test_fail(t, __FILE__, __LINE__, "row %d scale %a: fast path %d", i, s, fast[0][i]);
        if (f2u(sc[0][i]) != f2u(sc[1][i]) && bad++ < 5)
            nib_test_fail(t, __FILE__, __LINE__, "row %d: scale %a vs %a", i, sc[0][i], sc[1][i]);
        for (int j = 0; j < K; j++) {
            const size_t o = (size_t)i * K + j;
            if (codes[0][o] != codes[1][o] && bad++ < 5)
                nib_test_fail(t, __FILE__, __LINE__, "row %d col %d: x %a / s %a: code 0x%02x, division 0x%02x", i, j,
                              x[o], s, codes[0][o], codes[1][o]);
            caught += codes[2][o] != codes[1][o];
            if (i >= 3 && codes[1][o] != nib_f32_to_e4m3(x[o] / s) && bad_host++ < 5)
                nib_test_fail(t, __FILE__, __LINE__, "row %d col %d: division code 0x%02x, host 0x%02x", i, j,
                              codes[1][o], nib_f32_to_e4m3(x[o] / s));
        }
    }
    CHECK_MSG(bad == 0, "%ld codes / scales of the fast path differ from the division's", bad);
    CHECK_MSG(bad_host == 0, "%ld division codes differ from the host's", bad_host);
    CHECK_MSG(bad_flag == 0, "%ld rows took the wrong path", bad_flag);
    CHECK_MSG(n_fast > R / 3, "only %ld of %d rows took the fast path", n_fast, R);
    CHECK_MSG(caught > 0, "the uncorrected quotient was not caught: the comparison cannot fail");
    printf("  note: %ld of %d rows on the fast path; the uncorrected quotient differs in %ld codes\n", n_fast, R,
           caught);
    nib_dev_free(dx, sizeof(float) * R * K);
    nib_dev_free(dq, (size_t)R * K);
    nib_dev_free(ds, sizeof(float) * R);
    nib_dev_free(df, R);
    free(x);
    for (int m = 0; m < 3; m++) free(sc[m]), free(codes[m]), free(fast[m]);
#endif
}

/* ======================================================================================
 * The flow step's edge (ops/edge.h): ops/cuda/edge.cu against ops/ref/edge.c
 *
 * The reference computes in float activations with fp64 products; the GPU rounds y, v, a = bf16(x_t)
 * and h to bf16 and sums the products in fp32. The bounds follow each rounding through (u = 2^-8, the
 * bf16 unit roundoff; fp32 sums of n terms within n 2^-24 of the sum of magnitudes):
 *   final y:  h (bf16-rounded on the GPU when there is a residual) moves the statistic by at most u
 *             relative, so y_g - y_r <= P (2u + u^2 + 2^-20) + 2^-22 |t| before y's rounding, P = |h inv (1 + s)|;
 *   v:        sum_i e_y,i |w_ji| + dim 2^-24 sum_i (|y_i| + e_y,i) |w_ji|, then + b, then v's rounding;
 *   x_t:      that plus the fp32 add's rounding;
 *   h:        sum_k e_a,k |w_kn| + (adim + 1) 2^-24 sum_k (|a_k| + e_a,k) |w_kn| + 2^-23 (|h| + |b|), then h's rounding;
 *   y2:       h's error through the norm: the statistic moves by rho = rms(e_h) / rms(h) (relative) at most,
 *             so e_y2 = (e_h inv |1 + s|) (1 + rho') + |h inv (1 + s)| rho' + 2^-22 |t2|, rho' = rho / (1 - rho) + 2^-21,
 *             then y2's rounding.
 * And bitwise: the GPU's y2 is k_norm's adaRMS of the GPU's own h (one shared arithmetic, norm_row.cuh).
 * Outputs are poisoned and framed by guard rows and padded columns that must come back untouched.
 * ====================================================================================== */

typedef struct edge_cfg {
    int mode, res; /* res: 0 none, 1 residual, 2 gated residual */
    int alias;     /* h into the residual's buffer and y into x's (Pi0.5's buffers), else their own */
    int64_t rows, dim, adim;
} edge_cfg;

typedef struct edge_stat {
    vstat xt, h, y;
    int64_t bad_guard, bad_bits;
} edge_stat;

/* one fp32 output against the reference's: |err| <= bound */
static void fcheck(nib_test_ctx *t, vstat *s, float got, float ref, double bound, const char *what, int64_t r, int64_t c) {
    s->n++;
    if (!isfinite(got)) {
        if (s->nonfinite++ < 3)
            nib_test_fail(t, __FILE__, __LINE__, "%s row %lld col %lld: %g", what, (long long)r, (long long)c, got);
        return;
    }
    const double err = fabs((double)got - (double)ref);
    if (err / bound > s->worst) s->worst = err / bound;
    s->exact += got == ref;
    if (!(err <= bound) && s->bad++ < 5)
        nib_test_fail(t, __FILE__, __LINE__, "%s row %lld col %lld: got %.9g ref %.9g err %.3g bound %.3g", what,
                      (long long)r, (long long)c, got, ref, err, bound);
}

/* the same args over the GPU's buffers (g) or the reference's */
typedef struct edge_bufs {
    void *x, *r, *h, *y, *wo, *wi;
    float *vec, *xt;
    size_t es; /* bytes per activation */
} edge_bufs;
static nib_edge_args edge_make(const edge_cfg *c, const edge_bufs *b, int64_t ld, int64_t ldt) {
    const int64_t D = c->dim;
    char *x1 = (char *)b->x + (size_t)ld * b->es, *r1 = (char *)b->r + (size_t)ld * b->es;
    char *h1 = (char *)b->h + (size_t)ld * b->es, *y1 = (char *)b->y + (size_t)ld * b->es;
    nib_edge_args a = {.mode = c->mode, .rows = c->rows, .dim = D, .adim = c->adim, .eps = NIB_NORM_EPS,
                       .xt = b->xt + ldt, .ldxt = ldt};
    if (c->mode & NIB_EDGE_OUT) {
        a.x = x1, a.ldx = ld, a.residual = c->res ? r1 : NULL, a.ldr = ld, a.res_gate = c->res == 2 ? b->vec : NULL;
        a.fscale = b->vec + D, a.fshift = b->vec + 2 * D, a.w_out = b->wo, a.b_out = b->vec + 6 * D;
    }
    if (c->mode & NIB_EDGE_IN) {
        a.w_in_t = b->wi, a.b_in = b->vec + 5 * D, a.nscale = b->vec + 3 * D, a.nshift = b->vec + 4 * D;
        a.h = c->alias ? r1 : h1, a.ldh = ld, a.y = c->alias ? x1 : y1, a.ldy = ld;
    }
    return a;
}

static void edge_case(nib_test_ctx *t, nib_rng *rng, const edge_cfg *c, edge_stat *st) {
    const int64_t D = c->dim, A = c->adim, R = c->rows + 2, ld = D + 8, ldt = A + 3, nv = 6 * D + 2 * A;
    const int out = (c->mode & NIB_EDGE_OUT) != 0, in = (c->mode & NIB_EDGE_IN) != 0;
    const size_t nb = (size_t)(R * ld), nw = (size_t)(A * D), nt = (size_t)(R * ldt);
    const double u = 0x1p-8, e32 = 0x1p-24;
    uint16_t *bx = nib_malloc(nb * 2), *br = nib_malloc(nb * 2), *bwo = nib_malloc(nw * 2), *bwi = nib_malloc(nw * 2);
    uint16_t *gx = nib_malloc(nb * 2), *gr = nib_malloc(nb * 2), *gh = nib_malloc(nb * 2), *gy = nib_malloc(nb * 2);
    uint16_t *gk = nib_malloc(nb * 2), *poison = nib_malloc(nb * 2);
    float *fx = nib_malloc(nb * 4), *fr = nib_malloc(nb * 4), *fh = nib_malloc(nb * 4), *fy = nib_malloc(nb * 4);
    float *fwo = nib_malloc(nw * 4), *fwi = nib_malloc(nw * 4), *vec = nib_malloc((size_t)nv * 4);
    float *xt0 = nib_malloc(nt * 4), *xtg = nib_malloc(nt * 4), *xtr = nib_malloc(nt * 4);
    double *ey = nib_malloc((size_t)D * 8), *tv = nib_malloc((size_t)D * 8), *ea = nib_malloc((size_t)A * 8);
    double *eh = nib_malloc((size_t)D * 8);
    dbuf dx = {0}, dr = {0}, dh = {0}, dy = {0}, dwo = {0}, dwi = {0}, dv = {0}, dxt = {0}, dk = {0};
    if (!(bx && br && bwo && bwi && gx && gr && gh && gy && gk && poison && fx && fr && fh && fy && fwo && fwi && vec &&
          xt0 && xtg && xtr && ey && tv && ea && eh)) {
        nib_test_fail(t, __FILE__, __LINE__, "host allocation");
        goto done;
    }
    const float *gate = vec, *fs = vec + D, *fb = vec + 2 * D, *ns = vec + 3 * D, *nsh = vec + 4 * D, *bi = vec + 5 * D,
                *bo = vec + 6 * D;
    fill_bf16(rng, bx, (int64_t)nb, 1.0);
    fill_bf16(rng, br, (int64_t)nb, 1.5);
    fill_bf16(rng, bwo, (int64_t)nw, 1.0 / sqrt((double)D));
    fill_bf16(rng, bwi, (int64_t)nw, 1.0 / sqrt((double)A));
    for (int64_t i = 0; i < D; i++) {
        vec[i] = (float)(0.5 + nib_rng_uniform(rng)), vec[D + i] = (float)(0.5 * nib_rng_normal(rng));
        vec[2 * D + i] = (float)(0.5 * nib_rng_normal(rng)), vec[3 * D + i] = (float)(0.5 * nib_rng_normal(rng));
        vec[4 * D + i] = (float)(0.5 * nib_rng_normal(rng)), vec[5 * D + i] = (float)(0.1 * nib_rng_normal(rng));
    }
    for (int64_t j = 0; j < 2 * A; j++) vec[6 * D + j] = (float)(0.1 * nib_rng_normal(rng));
    for (size_t i = 0; i < nt; i++) xt0[i] = (float)nib_rng_normal(rng);
    for (size_t i = 0; i < nb; i++) poison[i] = PBF16, fh[i] = fy[i] = u2f(PF32);
    to_float(bx, fx, (int64_t)nb);
    to_float(br, fr, (int64_t)nb);
    to_float(bwo, fwo, (int64_t)nw);
    to_float(bwi, fwi, (int64_t)nw);
    memcpy(xtr, xt0, nt * 4);
    if (!(dput(t, &dx, bx, nb * 2) && dput(t, &dr, br, nb * 2) && dput(t, &dh, poison, nb * 2) &&
          dput(t, &dy, poison, nb * 2) && dput(t, &dwo, bwo, nw * 2) && dput(t, &dwi, bwi, nw * 2) &&
          dput(t, &dv, vec, (size_t)nv * 4) && dput(t, &dxt, xt0, nt * 4) && dput(t, &dk, poison, nb * 2)))
        goto done;
    {
        const edge_bufs gb = {dx.p, dr.p, dh.p, dy.p, dwo.p, dwi.p, (float *)dv.p, (float *)dxt.p, 2};
        const edge_bufs rb = {fx, fr, fh, fy, fwo, fwi, vec, xtr, 4};
        const nib_edge_args ga = edge_make(c, &gb, ld, ldt), ra = edge_make(c, &rb, ld, ldt);
        CHECK_OK(nib_cuda_edge(&ga, NULL));
        CHECK_OK(nib_ref_edge(&ra));
        if (in) { /* k_norm on the GPU's own h: bitwise the edge's y */
            nib_norm_args n = {.kind = NIB_NORM_ADARMS, .rows = c->rows, .dim = D, .eps = NIB_NORM_EPS, .x = ga.h,
                               .ldx = ld, .scale = ga.nscale, .shift = ga.nshift, .y = (uint16_t *)dk.p + ld, .ldy = ld};
            CHECK_OK(nib_cuda_norm(&n, NULL));
        }
    }
    if (!(dget(t, xtg, &dxt) && dget(t, gx, &dx) && dget(t, gr, &dr) && dget(t, gh, &dh) && dget(t, gy, &dy) &&
          dget(t, gk, &dk)))
        goto done;
    /* guards: what no output may touch keeps its bits */
    for (int64_t row = 0; row < R; row++) {
        for (int64_t j = 0; j < ld; j++) {
            const size_t i = (size_t)(row * ld + j);
            const int live = in && row >= 1 && row <= c->rows && j < D;
            if (!(live && c->alias)) st->bad_guard += (gx[i] != bx[i]) + (gr[i] != br[i]);
            if (!(live && !c->alias)) st->bad_guard += (gh[i] != PBF16) + (gy[i] != PBF16);
        }
        for (int64_t j = 0; j < ldt; j++)
            if (row < 1 || row > c->rows || j >= A || !out) st->bad_guard += f2u(xtg[row * ldt + j]) != f2u(xt0[row * ldt + j]);
    }
    const uint16_t *Hg = c->alias ? gr : gh, *Yg = c->alias ? gx : gy;
    const float *Hr = c->alias ? fr : fh, *Yr = c->alias ? fx : fy;
    for (int64_t r = 1; r <= c->rows; r++) {
        if (out) {
            /* the final norm from the inputs (bf16 values), in double */
            double ss = 0.0;
            for (int64_t i = 0; i < D; i++) {
                const float xv = bfv(bx[r * ld + i]), rv = bfv(br[r * ld + i]);
                const float h = c->res == 2 ? (xv * gate[i]) + rv : c->res == 1 ? xv + rv : xv;
                tv[i] = h;
                ss += (double)h * h;
            }
            const double inv = 1.0 / sqrt(ss / (double)D + (double)NIB_NORM_EPS), hu = c->res ? u : 0.0;
            const double rho1 = 1.01 * hu + 0x1p-21;
            for (int64_t i = 0; i < D; i++) {
                const double P = fabs(tv[i] * inv * (1.0 + fs[i])), tt = fabs(tv[i] * inv * (1.0 + fs[i]) + fb[i]);
                const double d = P * (hu + rho1 + hu * rho1 + 0x1p-20) + 0x1p-22 * tt;
                ey[i] = d + u * (tt + d);
                tv[i] = tt; /* |t_i| from here on */
            }
            for (int64_t j = 0; j < A; j++) {
                double S = 0.0, de = 0.0;
                for (int64_t i = 0; i < D; i++) {
                    const double w = fabs(fwo[j * D + i]);
                    S += (tv[i] + ey[i]) * w, de += ey[i] * w;
                }
                const double mv = S + fabs(bo[j]), dacc = de + (double)(D + 1) * e32 * mv;
                const double dvb = dacc + u * (mv + dacc);
                const double mx = fabs(xt0[r * ldt + j]) + mv, ex = dvb + e32 * (mx + dvb) + 0x1p-23 * mx;
                fcheck(t, &st->xt, xtg[r * ldt + j], xtr[r * ldt + j], ex, "edge x_t", r - 1, j);
                ea[j] = ex + u * (fabs(xtr[r * ldt + j]) + ex);
            }
        } else {
            for (int64_t j = 0; j < A; j++) ea[j] = u * fabs(xt0[r * ldt + j]);
        }
        if (!in) continue;
        double hh = 0.0, ee = 0.0;
        for (int64_t n = 0; n < D; n++) {
            double S = 0.0, de = 0.0;
            for (int64_t k = 0; k < A; k++) {
                const double w = fabs(fwi[k * D + n]);
                S += (fabs(xtr[r * ldt + k]) + ea[k]) * w, de += ea[k] * w;
            }
            const double mh = S + fabs(bi[n]), e = de + (double)(A + 1) * e32 * S + 0x1p-23 * mh;
            eh[n] = e + u * (mh + e);
            const float ref = Hr[r * ld + n];
            vcheck(t, &st->h, Hg[r * ld + n], ref, eh[n], "edge h", r - 1, n);
            hh += (double)ref * ref, ee += eh[n] * eh[n];
        }
        const double inv2 = 1.0 / sqrt(hh / (double)D + (double)NIB_NORM_EPS), rho = sqrt(ee / (hh > 0 ? hh : 1e-300));
        const double rp = (rho < 0.5 ? rho / (1.0 - rho) : 1.0) + 0x1p-21;
        for (int64_t n = 0; n < D; n++) {
            const double h = Hr[r * ld + n], g1 = fabs(1.0 + ns[n]), q = eh[n] * inv2 * g1;
            const double t2 = fabs(h * inv2 * (1.0 + ns[n]) + nsh[n]);
            const double e = q * (1.0 + rp) + fabs(h) * inv2 * g1 * rp + 0x1p-22 * t2;
            vcheck(t, &st->y, Yg[r * ld + n], Yr[r * ld + n], e + u * (t2 + e) + 0x1p-133, "edge y", r - 1, n);
            st->bad_bits += gk[r * ld + n] != Yg[r * ld + n];
        }
    }
done:
    dfree(&dx), dfree(&dr), dfree(&dh), dfree(&dy), dfree(&dwo), dfree(&dwi), dfree(&dv), dfree(&dxt), dfree(&dk);
    nib_free(bx), nib_free(br), nib_free(bwo), nib_free(bwi), nib_free(gx), nib_free(gr), nib_free(gh), nib_free(gy);
    nib_free(gk), nib_free(poison), nib_free(fx), nib_free(fr), nib_free(fh), nib_free(fy), nib_free(fwo), nib_free(fwi);
    nib_free(vec), nib_free(xt0), nib_free(xtg), nib_free(xtr), nib_free(ey), nib_free(tv), nib_free(ea), nib_free(eh);
}

NIB_TEST(ops_gpu_edge) {
    NIB_REQUIRE_GPU();
    nib_rng rng;
    nib_test_rng(t, &rng);
    /* Pi0.5's expert width and action dim first; then widths of part of a warp (80, 136: the tiny test
     * models' experts), 125 chunks, 256 chunks (eight whole warps); odd action dims */
    const int64_t dims[] = {1024, 80, 136, 1000, 2048}, adims[] = {32, 7, 1}, rows[] = {10, 1, 3, 17, 50};
    int n = 0;
    for (size_t di = 0; di < NIB_ARRAY_LEN(dims); di++)
        for (size_t ai = 0; ai < NIB_ARRAY_LEN(adims); ai++)
            for (int mode = 1; mode <= 3; mode++) {
                if (nib_edge_supported(mode, dims[di], adims[ai])) { /* 2048 x 32, both weights: 256 KB */
                    nib_clear_error();
                    CHECK_MSG(dims[di] == 2048 && adims[ai] == 32 && mode == 3, "edge: dim %lld adim %lld mode %d refused",
                              (long long)dims[di], (long long)adims[ai], mode);
                    continue;
                }
                edge_stat es;
                memset(&es, 0, sizeof es);
                for (int res = 0; res < 3; res++) {
                    const edge_cfg c = {mode, res, (n + res) % 2, rows[(size_t)(n + res) % NIB_ARRAY_LEN(rows)], dims[di],
                                        adims[ai]};
                    edge_case(t, &rng, &c, &es);
                }
                n++;
                CHECK_MSG(es.bad_guard == 0 && es.bad_bits == 0 && es.xt.nonfinite + es.h.nonfinite + es.y.nonfinite == 0,
                          "edge dim %lld adim %lld mode %d: %lld guard values written, %lld y differ from k_norm's, "
                          "%lld NaN/Inf", (long long)dims[di], (long long)adims[ai], mode, (long long)es.bad_guard,
                          (long long)es.bad_bits, (long long)(es.xt.nonfinite + es.h.nonfinite + es.y.nonfinite));
                printf("  edge dim %-4lld adim %-2lld mode %d: worst err/bound x_t %.3f h %.3f y %.3f\n",
                       (long long)dims[di], (long long)adims[ai], mode, es.xt.worst, es.h.worst, es.y.worst);
            }
    /* refusals, each naming the field */
    float f[64] __attribute__((aligned(16)));
    memset(f, 0, sizeof f);
    nib_edge_args a = {.mode = 3, .rows = 1, .dim = 1024, .adim = 32, .eps = NIB_NORM_EPS, .x = f, .ldx = 1024,
                       .fscale = f, .fshift = f, .w_out = f, .xt = f, .ldxt = 32, .w_in_t = f, .h = f, .ldh = 1024,
                       .nscale = f, .nshift = f, .y = f, .ldy = 1024};
    nib_edge_args b = a;
    b.dim = 4096, b.ldx = b.ldh = b.ldy = 4096;
    CHECK_ST(nib_cuda_edge(&b, NULL), NIB_ERR_SHAPE); /* wider than one CTA's 256 threads */
    b = a, b.adim = 33, b.ldxt = 33;
    CHECK_ST(nib_cuda_edge(&b, NULL), NIB_ERR_SHAPE);
    b = a, b.ldx = 1028;
    CHECK_ST(nib_cuda_edge(&b, NULL), NIB_ERR_SHAPE); /* a bf16 stride not a multiple of 8 */
    b = a, b.w_out = NULL;
    CHECK_ST(nib_cuda_edge(&b, NULL), NIB_ERR_INVALID_ARG);
    b = a, b.mode = 0;
    CHECK_ST(nib_cuda_edge(&b, NULL), NIB_ERR_INVALID_ARG);
    b = a, b.res_gate = f;
    CHECK_ST(nib_cuda_edge(&b, NULL), NIB_ERR_INVALID_ARG); /* a gate without a residual */
}
