/* test_ops_ref.c — the reference ops (ops/ref/norm.c, rope.c, act.c, qkv.c) against independent
 * straightforward fp64 computations on random inputs, plus hand-checked cases (RMSNorm of a
 * constant vector, RoPE at position 0, rotate-half pairing, inverse(forward(x)), FP8/NVFP4
 * cache bits equal to the formats/ quantizers) and the argument checks.
 *
 * Thresholds are derived next to each test from the fp32 operations the spec performs: u =
 * 2^-24 is the fp32 unit roundoff (RNE), every listed operation adds at most u relative.
 */
#include <math.h>
#include <string.h>

#include "formats/formats.h"
#include "harness.h"
#include "ops/act.h"
#include "ops/edge.h"
#include "ops/kvcache.h"
#include "ops/norm.h"
#include "ops/qkv.h"
#include "ops/rope.h"

#define POISON_F32 0x7FC0DEADu /* a NaN payload no op produces: untouched outputs keep it */

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
static void fill_normal(nib_rng *r, float *x, int64_t n, double std) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(std * nib_rng_normal(r));
}
static void fill_poison(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = u2f(POISON_F32);
}
static int64_t count_not_poison(const float *x, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += f2u(x[i]) != POISON_F32;
    return c;
}

/* ======================================================================================
 * norms
 * ====================================================================================== */

/* fp64 norm of one row h64[dim] (h already formed in fp64). Returns y64 and, for the bound,
 * the magnitude of the pre-shift term (adaRMS) and of the centred input (LN). */
static void norm_row64(nib_norm_kind kind, const double *h, int64_t dim, double eps, const float *w, const float *b,
                       const float *sc, const float *sh, double *y, double *mag) {
    double s = 0, s2 = 0, mean = 0;
    if (kind == NIB_NORM_LAYER) {
        for (int64_t d = 0; d < dim; d++) s += h[d];
        mean = s / dim;
        double avg = 0;
        for (int64_t d = 0; d < dim; d++) {
            s2 += (h[d] - mean) * (h[d] - mean);
            avg += fabs(h[d]);
        }
        avg /= dim;
        double rstd = 1.0 / sqrt(s2 / dim + eps);
        for (int64_t d = 0; d < dim; d++) {
            double t = (h[d] - mean) * rstd * (w ? w[d] : 1.0);
            y[d] = t + (b ? b[d] : 0.0);
            mag[d] = (fabs(h[d]) + fabs(h[d] - mean) + fabs(mean) + avg) * rstd * (w ? fabs(w[d]) : 1.0) +
                     (b ? fabs(b[d]) : 0.0);
        }
        return;
    }
    for (int64_t d = 0; d < dim; d++) s += h[d] * h[d];
    double inv = 1.0 / sqrt(s / dim + eps);
    for (int64_t d = 0; d < dim; d++) {
        double t = h[d] * inv;
        if (kind == NIB_NORM_ADARMS) {
            t *= 1.0 + sc[d];
            mag[d] = fabs(t) + fabs(sh[d]);
            y[d] = t + sh[d];
        } else {
            if (w) t *= 1.0 + w[d];
            mag[d] = fabs(t);
            y[d] = t;
        }
    }
}

typedef struct norm_case {
    nib_norm_kind kind;
    int use_w, use_b, residual; /* residual: 0 none, 1 in place into residual, 2 into h_out */
} norm_case;

/* Runs the reference on random rows and checks y against fp64 and the stored h bit for bit.
 * Bound (per element), from the spec's operations with u = 2^-24:
 *   h = fp32(x + r): u relative per element, 2u on each h^2 in the statistic;
 *   ms: fp64 sum then one rounding (u); ms + eps (u); sqrt halves the relative error of its
 *   input and adds u; 1/. adds u  =>  inv within 0.5 (2u + u + u) + 2u = 4u;
 *   h * inv (u, plus h's own u), (1 + w) (u relative to |1 + w|), product (u)  =>  |y| 8u = 2^-21.
 *   adaRMS adds the shift with one rounding: 2^-21 |pre-shift term| + u |y|.
 *   LN: mu = fp32(mean) is off by u |mean|, so (h - mu) is within u (|h - mean| + |mean|), the
 *   rest as above (var like ms); with a residual the stored h_d is off by u |h_d| and the mean
 *   by u mean|h|, so mag = (|h| + |h - mean| + |mean| + mean|h|) rstd |w| + |b|.
 * Threshold: 2^-20 * mag (twice the derived 2^-21, for the second-order terms) + 2^-140. */
static double check_norm_case(nib_test_ctx *t, nib_rng *rng, const norm_case *nc, int64_t dim, int64_t rows) {
    const int64_t ld = dim + 8;
    float *x = nib_malloc((size_t)(rows * ld) * 4), *res = nib_malloc((size_t)(rows * ld) * 4);
    float *res0 = nib_malloc((size_t)(rows * ld) * 4), *hout = nib_malloc((size_t)(rows * ld) * 4);
    float *y = nib_malloc((size_t)(rows * ld) * 4), *w = nib_malloc((size_t)dim * 4), *b = nib_malloc((size_t)dim * 4);
    double *h64 = nib_malloc((size_t)dim * 8), *y64 = nib_malloc((size_t)dim * 8), *mag = nib_malloc((size_t)dim * 8);
    double worst = 0;
    if (!(x && res && res0 && hout && y && w && b && h64 && y64 && mag)) {
        nib_test_fail(t, __FILE__, __LINE__, "allocation");
        goto done;
    }
    /* rows at different scales: the norm must be scale-free */
    for (int64_t r = 0; r < rows; r++) {
        double sc = ldexp(1.0, (int)nib_rng_below(rng, 24) - 12);
        fill_normal(rng, x + r * ld, ld, sc);
        fill_normal(rng, res + r * ld, ld, sc);
    }
    fill_normal(rng, w, dim, 0.5);
    fill_normal(rng, b, dim, 0.5);
    memcpy(res0, res, (size_t)(rows * ld) * 4);
    fill_poison(hout, rows * ld);
    fill_poison(y, rows * ld);
    nib_norm_args a;
    memset(&a, 0, sizeof a);
    a.kind = nc->kind;
    a.rows = rows;
    a.dim = dim;
    a.eps = NIB_NORM_EPS;
    a.x = x;
    a.ldx = ld;
    if (nc->residual) {
        a.residual = res;
        a.ldr = ld;
        if (nc->residual == 2) {
            a.h_out = hout;
            a.ldh = ld;
        }
    }
    if (nc->kind == NIB_NORM_ADARMS) {
        a.scale = w;
        a.shift = b;
    } else {
        a.w = nc->use_w ? w : NULL;
        a.b = nc->use_b ? b : NULL;
    }
    a.y = y;
    a.ldy = ld;
    CHECK_OK(nib_ref_norm(&a));
    int bad = 0, badh = 0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t d = 0; d < dim; d++) {
            h64[d] = (double)x[r * ld + d] + (nc->residual ? (double)res0[r * ld + d] : 0.0);
            if (nc->residual) {
                float hw = nc->residual == 2 ? hout[r * ld + d] : res[r * ld + d];
                float want = x[r * ld + d] + res0[r * ld + d];
                badh += f2u(hw) != f2u(want);
            }
        }
        norm_row64(nc->kind, h64, dim, (double)NIB_NORM_EPS, a.w, a.b, a.scale, a.shift, y64, mag);
        for (int64_t d = 0; d < dim; d++) {
            double err = fabs((double)y[r * ld + d] - y64[d]), bound = 0x1p-20 * (mag[d] + fabs(y64[d])) + 0x1p-140;
            if (err / bound > worst) worst = err / bound;
            if (!(err <= bound) && bad++ < 5)
                nib_test_fail(t, __FILE__, __LINE__, "norm kind %d dim %lld row %lld col %lld: y %.9g fp64 %.9g err %.3g bound %.3g",
                              (int)nc->kind, (long long)dim, (long long)r, (long long)d, y[r * ld + d], y64[d], err, bound);
        }
        /* stride padding untouched */
        CHECK(count_not_poison(y + r * ld + dim, 8) == 0);
    }
    CHECK_MSG(badh == 0, "%d stored h values differ from fp32(x + r)", badh);
    if (nc->residual == 2) CHECK_MSG(!memcmp(res, res0, (size_t)(rows * ld) * 4), "residual changed although h_out was given");
done:
    nib_free(x);
    nib_free(res);
    nib_free(res0);
    nib_free(hout);
    nib_free(y);
    nib_free(w);
    nib_free(b);
    nib_free(h64);
    nib_free(y64);
    nib_free(mag);
    return worst;
}

NIB_TEST(ops_ref_norm_vs_fp64) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const norm_case cases[] = {
        {NIB_NORM_RMS, 1, 0, 0},   {NIB_NORM_RMS, 0, 0, 1},   {NIB_NORM_RMS, 1, 0, 2},
        {NIB_NORM_LAYER, 1, 1, 0}, {NIB_NORM_LAYER, 0, 0, 1}, {NIB_NORM_LAYER, 1, 1, 2},
        {NIB_NORM_ADARMS, 0, 0, 0}, {NIB_NORM_ADARMS, 0, 0, 1},
    };
    const int64_t dims[] = {8, 1024, 1152, 2048, 8192};
    for (size_t c = 0; c < NIB_ARRAY_LEN(cases); c++)
        for (size_t di = 0; di < NIB_ARRAY_LEN(dims); di++) {
            double worst = check_norm_case(t, &rng, &cases[c], dims[di], 3);
            if (dims[di] == 2048)
                printf("  kind %d w%d b%d residual %d dim %lld: worst err/bound %.3f\n", (int)cases[c].kind,
                       cases[c].use_w, cases[c].use_b, cases[c].residual, (long long)dims[di], worst);
        }
}

NIB_TEST(ops_ref_norm_hand_cases) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    enum { D = 1024 };
    static float x[D], y[D], y2[D], w0[D], zero[D];
    nib_norm_args a;
    /* RMSNorm of a constant vector c: sum = D c^2 exactly (c^2 is exact in fp64, D = 2^10), so
     * ms = fp32(c^2) and y = c * (1 / sqrtf(fp32(c^2) + eps)) bit for bit, and |y| ~ 1. */
    const float cs[] = {3.0f, -0.125f, 1e-3f, 7.5e4f};
    for (size_t i = 0; i < NIB_ARRAY_LEN(cs); i++) {
        const float c = cs[i];
        for (int d = 0; d < D; d++) x[d] = c;
        memset(&a, 0, sizeof a);
        a.kind = NIB_NORM_RMS;
        a.rows = 1;
        a.dim = D;
        a.eps = NIB_NORM_EPS;
        a.x = x;
        a.ldx = D;
        a.y = y;
        a.ldy = D;
        CHECK_OK(nib_ref_norm(&a));
        const float ms = (float)((double)c * (double)c), inv = 1.0f / sqrtf(ms + NIB_NORM_EPS), want = c * inv;
        int bad = 0;
        for (int d = 0; d < D; d++) bad += f2u(y[d]) != f2u(want);
        CHECK_MSG(bad == 0, "RMSNorm of constant %g: %d values differ from %.9g", (double)c, bad, (double)want);
        /* c^2 >> eps: |y| = 1 / sqrt(1 + eps/c^2) */
        double expect = 1.0 / sqrt(1.0 + 1e-6 / ((double)c * c));
        CHECK_MSG(fabs(fabs(y[0]) - expect) <= 4e-7, "constant %g: |y| = %.9g, want %.9g", (double)c, y[0], expect);
        /* LayerNorm of a constant vector: h - mu = 0 exactly, y = b */
        for (int d = 0; d < D; d++) w0[d] = (float)nib_rng_normal(&rng);
        a.kind = NIB_NORM_LAYER;
        a.w = w0;
        a.b = x; /* any vector: use x itself as b */
        CHECK_OK(nib_ref_norm(&a));
        bad = 0;
        for (int d = 0; d < D; d++) bad += f2u(y[d]) != f2u(x[d]);
        CHECK_MSG(bad == 0, "LayerNorm of a constant vector must return b (%d differ)", bad);
    }
    /* w = NULL equals w = 0 bit for bit, and adaRMS with scale = shift = 0 equals RMS without w */
    fill_normal(&rng, x, D, 2.0);
    memset(&a, 0, sizeof a);
    a.kind = NIB_NORM_RMS;
    a.rows = 1;
    a.dim = D;
    a.eps = NIB_NORM_EPS;
    a.x = x;
    a.ldx = D;
    a.y = y;
    a.ldy = D;
    CHECK_OK(nib_ref_norm(&a));
    a.w = zero;
    a.y = y2;
    CHECK_OK(nib_ref_norm(&a));
    CHECK_MSG(!memcmp(y, y2, sizeof y), "RMSNorm w = NULL differs from w = 0");
    a.kind = NIB_NORM_ADARMS;
    a.w = NULL;
    a.scale = zero;
    a.shift = zero;
    CHECK_OK(nib_ref_norm(&a));
    CHECK_MSG(!memcmp(y, y2, sizeof y), "adaRMS with scale = shift = 0 differs from RMSNorm without weight");
    /* an all-zero row: y = 0, FP8 scale 1, codes 0 */
    uint8_t q[D];
    float s = 0;
    memset(&a, 0, sizeof a);
    a.kind = NIB_NORM_RMS;
    a.rows = 1;
    a.dim = D;
    a.eps = NIB_NORM_EPS;
    a.x = zero;
    a.ldx = D;
    a.y_q = q;
    a.ldq = D;
    a.y_scale = &s;
    memset(q, 0x5A, sizeof q);
    CHECK_OK(nib_ref_norm(&a));
    CHECK(s == 1.0f);
    int nz = 0;
    for (int d = 0; d < D; d++) nz += q[d] != 0;
    CHECK_MSG(nz == 0, "all-zero row: %d nonzero codes", nz);
}

/* FP8 output: codes and scales equal formats' nib_fp8_quantize on the fp32 y of each row, with
 * or without the y output; dequantized codes are within the e4m3 rounding of y: RNE with 3
 * mantissa bits is within 2^-4 relative for normals, and within half the smallest subnormal step
 * (2^-10 * scale) below 2^-6 * scale. */
NIB_TEST(ops_ref_norm_fp8_out) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t rows = 5, dim = 1152, ld = 1160;
    float *x = nib_malloc(rows * ld * 4), *y = nib_malloc(rows * ld * 4), *w = nib_malloc(dim * 4), *b = nib_malloc(dim * 4);
    uint8_t *q = nib_malloc(rows * ld), *q2 = nib_malloc(rows * ld), *qq = nib_malloc(dim);
    float sc[5], sc2[5], s_ref;
    REQUIRE(x && y && w && b && q && q2 && qq);
    for (int64_t i = 0; i < rows * ld; i++) x[i] = (float)nib_rng_student_t(&rng, 3.0);
    fill_normal(&rng, w, dim, 0.3);
    fill_normal(&rng, b, dim, 0.3);
    for (int kind = 0; kind < NIB_NORM_KIND_COUNT; kind++) {
        nib_norm_args a;
        memset(&a, 0, sizeof a);
        a.kind = (nib_norm_kind)kind;
        a.rows = rows;
        a.dim = dim;
        a.eps = NIB_NORM_EPS;
        a.x = x;
        a.ldx = ld;
        if (kind == NIB_NORM_ADARMS) {
            a.scale = w;
            a.shift = b;
        } else {
            a.w = w;
            a.b = kind == NIB_NORM_LAYER ? b : NULL;
        }
        a.y = y;
        a.ldy = ld;
        a.y_q = q;
        a.ldq = ld;
        a.y_scale = sc;
        CHECK_OK(nib_ref_norm(&a));
        a.y = NULL;
        a.y_q = q2;
        a.y_scale = sc2;
        CHECK_OK(nib_ref_norm(&a));
        int bad = 0, far = 0;
        for (int64_t r = 0; r < rows; r++) {
            CHECK_OK(nib_fp8_quantize(y + r * ld, 1, dim, 1, qq, &s_ref));
            bad += memcmp(qq, q + r * ld, dim) != 0 || memcmp(qq, q2 + r * ld, dim) != 0;
            CHECK(f2u(s_ref) == f2u(sc[r]) && f2u(s_ref) == f2u(sc2[r]));
            for (int64_t d = 0; d < dim; d++) {
                double yv = y[r * ld + d], dq = (double)nib_e4m3_to_f32(q[r * ld + d]) * sc[r];
                far += fabs(dq - yv) > 0x1p-4 * fabs(yv) + 0x1p-10 * sc[r];
            }
        }
        CHECK_MSG(bad == 0, "kind %d: %d rows whose codes differ from nib_fp8_quantize(y)", kind, bad);
        CHECK_MSG(far == 0, "kind %d: %d dequantized codes beyond the e4m3 rounding bound", kind, far);
    }
    nib_free(x);
    nib_free(y);
    nib_free(w);
    nib_free(b);
    nib_free(q);
    nib_free(q2);
    nib_free(qq);
}

/* Aliasing and valid rows: y == x and h_out == x give the results of separate buffers; rows >=
 * n_valid keep their poison. */
NIB_TEST(ops_ref_norm_alias_and_valid) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t rows = 7, dim = 1024;
    const size_t n = (size_t)(rows * dim);
    float *x = nib_malloc(n * 4), *r = nib_malloc(n * 4), *y = nib_malloc(n * 4), *h = nib_malloc(n * 4);
    float *x2 = nib_malloc(n * 4), *r2 = nib_malloc(n * 4);
    float sc[7];
    REQUIRE(x && r && y && h && x2 && r2);
    fill_normal(&rng, x, (int64_t)n, 1.0);
    fill_normal(&rng, r, (int64_t)n, 1.0);
    memcpy(x2, x, n * 4);
    memcpy(r2, r, n * 4);
    nib_norm_args a;
    memset(&a, 0, sizeof a);
    a.kind = NIB_NORM_RMS;
    a.rows = rows;
    a.dim = dim;
    a.eps = NIB_NORM_EPS;
    a.x = x;
    a.ldx = dim;
    a.residual = r;
    a.ldr = dim;
    a.h_out = h;
    a.ldh = dim;
    a.y = y;
    a.ldy = dim;
    CHECK_OK(nib_ref_norm(&a));
    /* h into x and y into x at once is not allowed (both outputs would overlap); do them apart */
    a.x = x2;
    a.residual = r2;
    a.h_out = x2;
    a.ldh = dim;
    float *y2 = nib_malloc(n * 4);
    REQUIRE(y2);
    a.y = y2;
    CHECK_OK(nib_ref_norm(&a));
    CHECK_MSG(!memcmp(x2, h, n * 4), "h_out == x: stored h differs");
    CHECK_MSG(!memcmp(y2, y, n * 4), "h_out == x: y differs");
    /* y == x, no residual: normalizing h in place */
    memcpy(x2, h, n * 4);
    a.x = x2;
    a.residual = NULL;
    a.h_out = NULL;
    a.y = x2;
    a.ldy = dim;
    CHECK_OK(nib_ref_norm(&a));
    CHECK_MSG(!memcmp(x2, y, n * 4), "y == x (in place) differs");
    /* valid rows: 3 of 7 */
    int32_t nv = 3;
    fill_poison(y2, (int64_t)n);
    memcpy(r2, r, n * 4);
    a.x = x;
    a.residual = r2;
    a.y = y2;
    a.y_q = NULL;
    a.n_valid = &nv;
    a.y_scale = sc;
    CHECK_OK(nib_ref_norm(&a));
    CHECK_MSG(!memcmp(y2, y, 3 * dim * 4), "valid rows differ");
    CHECK_MSG(count_not_poison(y2 + 3 * dim, 4 * dim) == 0, "rows >= n_valid were written");
    CHECK_MSG(!memcmp(r2 + 3 * dim, r + 3 * dim, 4 * dim * 4), "residual rows >= n_valid were written");
    nv = -5; /* clamps to 0: nothing written */
    fill_poison(y2, (int64_t)n);
    CHECK_OK(nib_ref_norm(&a));
    CHECK(count_not_poison(y2, (int64_t)n) == 0);
    nib_free(x);
    nib_free(r);
    nib_free(y);
    nib_free(h);
    nib_free(x2);
    nib_free(r2);
    nib_free(y2);
}

/* The gated residual (res_gate, the previous layer's deferred adaRMS gate): h = (x * g) + r with
 * two fp32 roundings, stored into the residual (or h_out), and the norm of the stored h equal to
 * the norm of a plain call on that h; against the same rows computed here in the same order. */
NIB_TEST(ops_ref_norm_gated_residual) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t rows = 5, dim = 1024;
    float *x = nib_malloc((size_t)(rows * dim) * 4), *r = nib_malloc((size_t)(rows * dim) * 4);
    float *r0 = nib_malloc((size_t)(rows * dim) * 4), *g = nib_malloc((size_t)dim * 4);
    float *sc = nib_malloc((size_t)dim * 4), *sh = nib_malloc((size_t)dim * 4);
    float *y1 = nib_malloc((size_t)(rows * dim) * 4), *y2 = nib_malloc((size_t)(rows * dim) * 4);
    float *h = nib_malloc((size_t)(rows * dim) * 4);
    REQUIRE(x && r && r0 && g && sc && sh && y1 && y2 && h);
    fill_normal(&rng, x, rows * dim, 1.0);
    fill_normal(&rng, r, rows * dim, 4.0);
    fill_normal(&rng, g, dim, 0.5);
    fill_normal(&rng, sc, dim, 0.1);
    fill_normal(&rng, sh, dim, 0.1);
    memcpy(r0, r, (size_t)(rows * dim) * 4);
    nib_norm_args a;
    memset(&a, 0, sizeof a);
    a.kind = NIB_NORM_ADARMS, a.rows = rows, a.dim = dim, a.eps = NIB_NORM_EPS;
    a.x = x, a.ldx = dim, a.residual = r, a.ldr = dim, a.res_gate = g;
    a.scale = sc, a.shift = sh, a.y = y1, a.ldy = dim;
    CHECK_OK(nib_ref_norm(&a));
    int badh = 0;
    for (int64_t i = 0; i < rows * dim; i++) {
        const float xg = x[i] * g[i % dim];
        h[i] = xg + r0[i];
        badh += f2u(r[i]) != f2u(h[i]);
    }
    CHECK_MSG(badh == 0, "%d stored h values differ from fp32(fp32(x * g) + r)", badh);
    nib_norm_args b = a; /* the plain norm of that h */
    b.x = h, b.residual = NULL, b.ldr = 0, b.res_gate = NULL, b.y = y2;
    CHECK_OK(nib_ref_norm(&b));
    CHECK_MSG(!memcmp(y1, y2, (size_t)(rows * dim) * 4), "gated add + norm differs from the norm of the stored h");
    nib_free(x), nib_free(r), nib_free(r0), nib_free(g), nib_free(sc), nib_free(sh);
    nib_free(y1), nib_free(y2), nib_free(h);
}

NIB_TEST(ops_ref_norm_rejects) {
    float x[16], y[16], w[16], s;
    uint8_t q[16];
    nib_norm_args a, g;
    memset(&g, 0, sizeof g);
    g.kind = NIB_NORM_RMS;
    g.rows = 1;
    g.dim = 16;
    g.eps = NIB_NORM_EPS;
    g.x = x;
    g.ldx = 16;
    g.y = y;
    g.ldy = 16;
    memset(x, 0, sizeof x);
    CHECK_OK(nib_ref_norm(&g));
    a = g;
    a.dim = 12;
    a.ldx = a.ldy = 12;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_SHAPE);
    CHECK(strstr(nib_last_error(), "norm (ref)") && strstr(nib_last_error(), "12"));
    a = g;
    a.dim = 8200;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_SHAPE);
    a = g;
    a.ldx = 8;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_SHAPE);
    a = g;
    a.eps = 0.0f;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_INVALID_ARG);
    a = g;
    a.y = NULL;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_INVALID_ARG);
    a = g;
    a.y_q = q;
    a.ldq = 16;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_INVALID_ARG); /* no y_scale */
    a.y_scale = &s;
    CHECK_OK(nib_ref_norm(&a));
    a = g;
    a.h_out = y;
    a.ldh = 16;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_INVALID_ARG); /* h_out without residual */
    a = g;
    a.res_gate = w;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_INVALID_ARG); /* res_gate without residual */
    CHECK(strstr(nib_last_error(), "res_gate") != NULL);
    a = g;
    a.b = w;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_INVALID_ARG); /* bias on RMSNorm */
    a = g;
    a.kind = NIB_NORM_ADARMS;
    a.scale = w;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_INVALID_ARG); /* no shift */
    CHECK(strstr(nib_last_error(), "adarms") != NULL);
    a = g;
    a.kind = (nib_norm_kind)7;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_INVALID_ARG);
    a = g;
    a.rows = -1;
    CHECK_ST(nib_ref_norm(&a), NIB_ERR_SHAPE);
}

/* ======================================================================================
 * RoPE
 * ====================================================================================== */

/* fp64 rotation of one token from scratch: frequencies theta^(-2i/rot) and angles in fp64.
 * Bound vs the fp32 spec, per output of pair (a, b) at angle ang, u = 2^-24:
 *   inv_freq rounded (u) and the fp32 angle product (u): |d ang| <= 2u |ang|;
 *   sin/cos rounded to fp32: <= u/2 absolute;  the error in ang moves cos/sin by <= |d ang|;
 *   a*c, b*s and their difference rounded: <= 2u (|a| + |b|).
 *   => |err| <= (|a| + |b|) (2u |ang| + 2.5u). Threshold: (|a| + |b|)(2^-22 |ang| + 2^-21) + 2^-140,
 * about twice the derived bound. */
static void rope_row64(const float *x, int32_t nh, int32_t hd, int32_t rot, nib_rope_style st, int inverse,
                       double theta, int32_t pos, double *y, double *bound) {
    const int32_t half = rot / 2;
    for (int32_t h = 0; h < nh; h++) {
        const float *xh = x + (int64_t)h * hd;
        double *yh = y + (int64_t)h * hd, *bh = bound + (int64_t)h * hd;
        for (int32_t d = 0; d < hd; d++) {
            yh[d] = xh[d];
            bh[d] = 0;
        }
        for (int32_t i = 0; i < half; i++) {
            int32_t ia = st == NIB_ROPE_HALF ? i : 2 * i, ib = st == NIB_ROPE_HALF ? i + half : 2 * i + 1;
            double ang = (double)pos * pow(theta, -2.0 * i / rot);
            double c = cos(ang), s = inverse ? -sin(ang) : sin(ang);
            double a = xh[ia], b = xh[ib];
            yh[ia] = a * c - b * s;
            yh[ib] = b * c + a * s;
            double bd = (fabs(a) + fabs(b)) * (0x1p-22 * fabs(ang) + 0x1p-21) + 0x1p-140;
            bh[ia] = bh[ib] = bd;
        }
    }
}

typedef struct rope_shape {
    int32_t nh, hd, rot;
} rope_shape;

NIB_TEST(ops_ref_rope_vs_fp64) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const rope_shape shapes[] = {{8, 256, 256}, {1, 256, 256}, {16, 72, 64}, {3, 24, 20}, {2, 8, 6}};
    const int64_t T = 9;
    for (size_t si = 0; si < NIB_ARRAY_LEN(shapes); si++)
        for (int style = 0; style < NIB_ROPE_STYLE_COUNT; style++)
            for (int inv = 0; inv < 2; inv++) {
                const rope_shape *s = &shapes[si];
                const int64_t ld = (int64_t)s->nh * s->hd + 8;
                float *x = nib_malloc(T * ld * 4), *x0 = nib_malloc(T * ld * 4), *fr = nib_malloc(s->rot / 2 * 4);
                double *y64 = nib_malloc(ld * 8), *bd = nib_malloc(ld * 8);
                int32_t pos[9];
                REQUIRE(x && x0 && fr && y64 && bd);
                fill_normal(&rng, x, T * ld, 1.0);
                memcpy(x0, x, T * ld * 4);
                for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)nib_rng_below(&rng, 2048);
                pos[0] = 0;
                pos[1] = 65535;
                CHECK_OK(nib_rope_inv_freq(NIB_ROPE_THETA, s->rot, fr));
                nib_rope_args a;
                memset(&a, 0, sizeof a);
                a.style = (nib_rope_style)style;
                a.inverse = inv;
                a.tokens = T;
                a.n_heads = s->nh;
                a.head_dim = s->hd;
                a.rot_dim = s->rot;
                a.positions = pos;
                a.inv_freq = fr;
                a.x = x;
                a.ld = ld;
                CHECK_OK(nib_ref_rope(&a));
                int bad = 0, moved = 0;
                double worst = 0;
                for (int64_t tk = 0; tk < T; tk++) {
                    rope_row64(x0 + tk * ld, s->nh, s->hd, s->rot, a.style, inv, NIB_ROPE_THETA, pos[tk], y64, bd);
                    for (int64_t d = 0; d < (int64_t)s->nh * s->hd; d++) {
                        double err = fabs((double)x[tk * ld + d] - y64[d]);
                        if (bd[d] == 0) { /* pass-through dims: untouched bit for bit */
                            moved += f2u(x[tk * ld + d]) != f2u(x0[tk * ld + d]);
                            continue;
                        }
                        if (err / bd[d] > worst) worst = err / bd[d];
                        if (!(err <= bd[d]) && bad++ < 3)
                            nib_test_fail(t, __FILE__, __LINE__, "rope %d/%d/%d style %d inv %d tok %lld d %lld: %.9g vs %.9g",
                                          s->nh, s->hd, s->rot, style, inv, (long long)tk, (long long)d, x[tk * ld + d],
                                          y64[d]);
                    }
                    /* columns past n_heads * head_dim */
                    moved += memcmp(x + tk * ld + s->nh * s->hd, x0 + tk * ld + s->nh * s->hd, 8 * 4) != 0;
                }
                CHECK_MSG(moved == 0, "%d pass-through / padding values changed", moved);
                if (si == 0 && !inv) printf("  style %d 8x256: worst err/bound %.3f\n", style, worst);
                nib_free(x);
                nib_free(x0);
                nib_free(fr);
                nib_free(y64);
                nib_free(bd);
            }
}

NIB_TEST(ops_ref_rope_hand_cases) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    enum { HD = 256, NH = 2 };
    static float x[NH * HD], x0[NH * HD], fr[HD / 2];
    CHECK_OK(nib_rope_inv_freq(NIB_ROPE_THETA, HD, fr));
    /* the table: inv[0] = 1, inv[64] = 10000^-0.5 = 0.01 (rounded once), every entry within
     * half an fp32 ulp of theta^(-2i/rot) computed in long double */
    CHECK(fr[0] == 1.0f);
    CHECK(fr[64] == 0.01f);
    int far = 0;
    for (int i = 0; i < HD / 2; i++) {
        long double e = powl(10000.0L, -(long double)(2 * i) / HD);
        far += fabsl((long double)fr[i] - e) > 0x1p-24L * e * (1 + 1e-9L);
    }
    CHECK_MSG(far == 0, "%d inv_freq entries not correctly rounded", far);
    nib_rope_args a;
    memset(&a, 0, sizeof a);
    a.style = NIB_ROPE_HALF;
    a.tokens = 1;
    a.n_heads = NH;
    a.head_dim = HD;
    a.rot_dim = HD;
    a.inv_freq = fr;
    a.x = x;
    a.ld = NH * HD;
    /* position 0 is the identity, bit for bit, in both styles and directions */
    int32_t pos = 0;
    a.positions = &pos;
    for (int style = 0; style < 2; style++)
        for (int inv = 0; inv < 2; inv++) {
            fill_normal(&rng, x, NH * HD, 1.0);
            memcpy(x0, x, sizeof x);
            a.style = (nib_rope_style)style;
            a.inverse = inv;
            CHECK_OK(nib_ref_rope(&a));
            CHECK_MSG(!memcmp(x, x0, sizeof x), "position 0 is not the identity (style %d inverse %d)", style, inv);
        }
    /* inverse(forward(x)) == x up to rounding: the forward output is within 2u (|a| + |b|) of the
     * exact rotation by the rounded (c, s), whose c^2 + s^2 = 1 within 2u; the inverse adds the
     * same again: |err| <= 6u (|a| + |b|) < 2^-21 (|a| + |b|); threshold 2^-20 (|a| + |b|). */
    for (int style = 0; style < 2; style++) {
        a.style = (nib_rope_style)style;
        fill_normal(&rng, x, NH * HD, 1.0);
        memcpy(x0, x, sizeof x);
        pos = 1234;
        a.inverse = 0;
        CHECK_OK(nib_ref_rope(&a));
        a.inverse = 1;
        CHECK_OK(nib_ref_rope(&a));
        int bad = 0;
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD / 2; i++) {
                int ia = style ? 2 * i : i, ib = style ? 2 * i + 1 : i + HD / 2;
                double m = fabs(x0[h * HD + ia]) + fabs(x0[h * HD + ib]);
                bad += fabs(x[h * HD + ia] - x0[h * HD + ia]) > 0x1p-20 * m;
                bad += fabs(x[h * HD + ib] - x0[h * HD + ib]) > 0x1p-20 * m;
            }
        CHECK_MSG(bad == 0, "inverse(forward(x)) != x for %d values (style %d)", bad, style);
    }
    /* pairing: a one-hot input e_d mixes only with its partner: rotate-half (d, d + 128),
     * interleaved (2i, 2i + 1); the values are exactly (cos, sin) of the fp32 angle */
    a.inverse = 0;
    pos = 77;
    const int ds[] = {0, 5, 127, 128, 200, 255};
    for (int style = 0; style < 2; style++)
        for (size_t k = 0; k < NIB_ARRAY_LEN(ds); k++) {
            const int d = ds[k];
            memset(x, 0, sizeof x);
            x[HD + d] = 1.0f; /* head 1 */
            a.style = (nib_rope_style)style;
            CHECK_OK(nib_ref_rope(&a));
            const int i = style ? d / 2 : d % (HD / 2);
            const int partner = style ? (d ^ 1) : (d < HD / 2 ? d + HD / 2 : d - HD / 2);
            const int first = style ? (d % 2 == 0) : (d < HD / 2);
            const float ang = (float)pos * fr[i];
            const float c = (float)cos((double)ang), s = (float)sin((double)ang);
            int other = 0;
            for (int j = 0; j < NH * HD; j++)
                if (j != HD + d && j != HD + partner) other += x[j] != 0.0f;
            CHECK_MSG(other == 0, "one-hot %d (style %d) leaked into %d other dims", d, style, other);
            /* e_first -> (c, s) at (first, partner); e_second -> (-s, c) at (partner, second) */
            if (first) CHECK_MSG(x[HD + d] == c && x[HD + partner] == s, "one-hot %d: (%g, %g) want (%g, %g)", d, x[HD + d],
                                 x[HD + partner], c, s);
            else CHECK_MSG(x[HD + d] == c && x[HD + partner] == -s, "one-hot %d: (%g, %g) want (%g, %g)", d, x[HD + d],
                           x[HD + partner], c, -s);
        }
    /* argument checks */
    nib_rope_args b = a;
    b.rot_dim = 7;
    CHECK_ST(nib_ref_rope(&b), NIB_ERR_SHAPE);
    CHECK(strstr(nib_last_error(), "rope (ref)") && strstr(nib_last_error(), "7"));
    b = a;
    b.rot_dim = HD + 2;
    CHECK_ST(nib_ref_rope(&b), NIB_ERR_SHAPE);
    b = a;
    b.ld = HD;
    CHECK_ST(nib_ref_rope(&b), NIB_ERR_SHAPE);
    b = a;
    b.positions = NULL;
    CHECK_ST(nib_ref_rope(&b), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_rope_inv_freq(-1.0f, 8, fr), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_rope_inv_freq(10000.0f, 9, fr), NIB_ERR_SHAPE);
    /* valid tokens */
    static float xx[3 * 16], x2[3 * 16];
    int32_t p3[3] = {5, 6, 7}, nv = 1;
    fill_normal(&rng, xx, 48, 1.0);
    memcpy(x2, xx, sizeof xx);
    float f8[4];
    CHECK_OK(nib_rope_inv_freq(NIB_ROPE_THETA, 8, f8));
    nib_rope_args c;
    memset(&c, 0, sizeof c);
    c.tokens = 3;
    c.n_valid = &nv;
    c.n_heads = 2;
    c.head_dim = 8;
    c.rot_dim = 8;
    c.positions = p3;
    c.inv_freq = f8;
    c.x = xx;
    c.ld = 16;
    CHECK_OK(nib_ref_rope(&c));
    CHECK(memcmp(xx, x2, 16 * 4) != 0);
    CHECK_MSG(!memcmp(xx + 16, x2 + 16, 32 * 4), "tokens >= n_valid changed");
}

/* ======================================================================================
 * activations
 * ====================================================================================== */

/* fp64 from scratch with the exact constants sqrt(2/pi) and 0.044715. Bound vs the fp32 spec
 * (u = 2^-24; tanhf/expf within 2 ulp):
 *   gelu: z = k0 (g + k1 g^3) carries <= 6u relative (5 roundings + constants); tanh' =
 *   sech^2 and |z| sech^2(z) <= 0.45, so tanh(z) moves <= 2.7u, tanhf adds <= 2u (|tanh| < 1,
 *   ulp <= 2^-24 = u... 2 ulp <= 2u), 1 + th rounds (<= 2u absolute on [0, 2)): (1 + th) within
 *   ~7u absolute; times 0.5 g (u) and u (|.|): |d gelu| <= 7u |g| / 2 + 2u |gelu|.
 *   gated: times up, one more rounding: <= 4u |g u| + 3u |y|.
 *   silu: expf (2u rel), 1 + e (u), quotient (u): <= 4u |silu|; gated <= 5u |y|.
 * Threshold: 2^-20 (|g * up| + |y|) + 2^-140 (>= 3x the derived bounds). */
static double gelu64(double g) { return 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))); }
static double silu64(double g) { return g / (1.0 + exp(-g)); }

NIB_TEST(ops_ref_act_vs_fp64) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int64_t hs[] = {8, 4096, 4304};
    const int64_t rows = 4;
    for (int kind = 0; kind < NIB_ACT_KIND_COUNT; kind++)
        for (size_t hi = 0; hi < NIB_ARRAY_LEN(hs); hi++) {
            const int64_t h = hs[hi], ldx = 2 * h + 8, ldy = h + 8;
            float *x = nib_malloc(rows * ldx * 4), *y = nib_malloc(rows * ldy * 4);
            REQUIRE(x && y);
            /* gates across the interesting range (tails, zero crossing), ups N(0, 1) */
            for (int64_t i = 0; i < rows * ldx; i++) x[i] = (float)(3.0 * nib_rng_student_t(&rng, 4.0));
            x[0] = 0.0f;
            x[1] = -30.0f;
            x[2] = 30.0f;
            x[3] = -100.0f;
            fill_poison(y, rows * ldy);
            nib_act_args a = {(nib_act_kind)kind, rows, NULL, h, x, ldx, y, ldy, NULL, 0, NULL};
            CHECK_OK(nib_ref_act(&a));
            int bad = 0, pad = 0;
            double worst = 0;
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t j = 0; j < h; j++) {
                    double g = x[r * ldx + j], u = kind == NIB_ACT_GELU_TANH ? 1.0 : x[r * ldx + h + j];
                    double y64 = (kind == NIB_ACT_SWIGLU ? silu64(g) : gelu64(g)) * u;
                    double err = fabs(y[r * ldy + j] - y64), bd = 0x1p-20 * (fabs(g * u) + fabs(y64)) + 0x1p-140;
                    if (err / bd > worst) worst = err / bd;
                    if (!(err <= bd) && bad++ < 3)
                        nib_test_fail(t, __FILE__, __LINE__, "act %d H %lld: g %.9g u %.9g y %.9g fp64 %.9g", kind,
                                      (long long)h, g, u, y[r * ldy + j], y64);
                }
                pad += (int)count_not_poison(y + r * ldy + h, 8);
            }
            CHECK_MSG(pad == 0, "%d padding values written", pad);
            if (h == 4096) printf("  act %d H %lld: worst err/bound %.3f\n", kind, (long long)h, worst);
            /* hand cases: gelu(0) = 0, gelu(-30) = -0 (tanh = -1), gelu(30) = 30, silu(-100) = -0 */
            if (kind == NIB_ACT_GELU_TANH) {
                CHECK(y[0] == 0.0f && y[1] == 0.0f && y[2] == 30.0f);
            }
            /* in place (y == x, same ld) gives the same values */
            float *x2 = nib_malloc(rows * ldx * 4);
            REQUIRE(x2);
            memcpy(x2, x, rows * ldx * 4);
            nib_act_args b = {(nib_act_kind)kind, rows, NULL, h, x2, ldx, x2, ldx, NULL, 0, NULL};
            CHECK_OK(nib_ref_act(&b));
            int diff = 0;
            for (int64_t r = 0; r < rows; r++) diff += memcmp(x2 + r * ldx, y + r * ldy, h * 4) != 0;
            CHECK_MSG(diff == 0, "in-place act differs in %d rows", diff);
            nib_free(x2);
            nib_free(x);
            nib_free(y);
        }
    /* GeGLU with up = 1 is GELU of the gate, bit for bit */
    float g2[32], yg[16], yl[16];
    fill_normal(&rng, g2, 16, 2.0);
    for (int i = 16; i < 32; i++) g2[i] = 1.0f;
    nib_act_args a1 = {NIB_ACT_GEGLU_TANH, 1, NULL, 16, g2, 32, yg, 16, NULL, 0, NULL};
    nib_act_args a2 = {NIB_ACT_GELU_TANH, 1, NULL, 16, g2, 32, yl, 16, NULL, 0, NULL};
    CHECK_OK(nib_ref_act(&a1));
    CHECK_OK(nib_ref_act(&a2));
    CHECK(!memcmp(yg, yl, sizeof yg));
    /* argument checks */
    nib_act_args e = a1;
    e.h = 12;
    CHECK_ST(nib_ref_act(&e), NIB_ERR_SHAPE);
    CHECK(strstr(nib_last_error(), "act (ref)") && strstr(nib_last_error(), "12"));
    e = a1;
    e.ldx = 16;
    CHECK_ST(nib_ref_act(&e), NIB_ERR_SHAPE);
    e = a1;
    e.kind = (nib_act_kind)9;
    CHECK_ST(nib_ref_act(&e), NIB_ERR_INVALID_ARG);
    /* FP8 output: the codes and scale of nib_fp8_quantize over the fp32 row, with or without y */
    {
        uint8_t q1[2 * 24], q2[2 * 24], qw[16];
        float s1[2], s2[2], sw, y2[2 * 16];
        float gx[2 * 32];
        fill_normal(&rng, gx, 64, 2.0);
        nib_act_args f = {NIB_ACT_GEGLU_TANH, 2, NULL, 16, gx, 32, NULL, 0, q1, 24, s1};
        CHECK_OK(nib_ref_act(&f));
        f.y = y2, f.ldy = 16, f.y_q = q2, f.y_scale = s2;
        CHECK_OK(nib_ref_act(&f));
        for (int r = 0; r < 2; r++) {
            CHECK_OK(nib_fp8_quantize(y2 + 16 * r, 1, 16, 1, qw, &sw));
            CHECK(!memcmp(qw, q1 + 24 * r, 16) && !memcmp(qw, q2 + 24 * r, 16) && sw == s1[r] && sw == s2[r]);
        }
        f.y_scale = NULL;
        CHECK_ST(nib_ref_act(&f), NIB_ERR_INVALID_ARG);
        f.y_scale = s1, f.ldq = 8;
        CHECK_ST(nib_ref_act(&f), NIB_ERR_SHAPE);
        f.ldq = 24, f.y = NULL, f.y_q = NULL;
        CHECK_ST(nib_ref_act(&f), NIB_ERR_INVALID_ARG);
        gx[35] = NAN; /* row 1, gate 3 */
        f.y_q = q1;
        CHECK_ST(nib_ref_act(&f), NIB_ERR_NUMERICS);
        CHECK(strstr(nib_last_error(), "row 1") != NULL);
    }
}

/* ======================================================================================
 * fused QKV epilogue, KV write and read
 * ====================================================================================== */

typedef struct host_cache {
    nib_kv_layer l;
    uint8_t *mem;
    uint64_t bytes;
} host_cache;

static int host_cache_init(host_cache *c, nib_kv_dtype dt, int32_t t_max, int32_t nkv, int32_t hd) {
    c->bytes = nib_kv_layer_bytes(dt, t_max, nkv, hd);
    c->mem = nib_malloc((size_t)c->bytes);
    if (!c->mem) return 0;
    memset(c->mem, 0xA5, (size_t)c->bytes); /* poison: untouched slots keep it */
    return nib_kv_layer_map(&c->l, dt, t_max, nkv, hd, c->mem) == NIB_OK;
}

/* The bits one (slot, head) vector must hold: formats/ applied to the fp32 vector. */
static int vec_bits_equal(const nib_kv_layer *l, int which, int64_t slot, int32_t head, const float *v) {
    const int32_t hd = l->head_dim;
    const int64_t vec = slot * l->n_kv_heads + head;
    const uint8_t *plane = (const uint8_t *)(which ? l->v : l->k);
    uint8_t e[1024], bs[64];
    float s;
    switch (l->dtype) {
    case NIB_KV_BF16:
        for (int32_t d = 0; d < hd; d++) {
            uint16_t want = nib_f32_to_bf16(v[d]), got;
            memcpy(&got, plane + (vec * hd + d) * 2, 2);
            if (want != got) return 0;
        }
        return 1;
    case NIB_KV_FP8:
        if (nib_fp8_quantize(v, 1, hd, 1, e, &s)) return 0;
        return !memcmp(e, plane + vec * hd, (size_t)hd) && f2u(s) == f2u((which ? l->vs : l->ks)[vec]);
    default:
        if (nib_nvfp4_quantize(v, 1, hd, e, bs, &s)) return 0;
        return !memcmp(e, plane + vec * hd / 2, (size_t)hd / 2) &&
               !memcmp(bs, (which ? l->vb : l->kb) + vec * (hd / 16), (size_t)hd / 16) &&
               f2u(s) == f2u((which ? l->vs : l->ks)[vec]);
    }
}

/* Bytes of one (slot, head) vector still holding the 0xA5 poison in every plane. */
static int vec_untouched(const nib_kv_layer *l, int which, int64_t slot, int32_t head) {
    const int32_t hd = l->head_dim;
    const int64_t vec = slot * l->n_kv_heads + head;
    const uint8_t *plane = (const uint8_t *)(which ? l->v : l->k);
    int64_t eb = l->dtype == NIB_KV_BF16 ? 2 * hd : l->dtype == NIB_KV_FP8 ? hd : hd / 2;
    for (int64_t i = 0; i < eb; i++)
        if (plane[vec * eb + i] != 0xA5) return 0;
    if (l->dtype != NIB_KV_BF16) {
        uint32_t s;
        memcpy(&s, (which ? l->vs : l->ks) + vec, 4);
        if (s != 0xA5A5A5A5u) return 0;
    }
    if (l->dtype == NIB_KV_NVFP4)
        for (int i = 0; i < hd / 16; i++)
            if ((which ? l->vb : l->kb)[vec * (hd / 16) + i] != 0xA5) return 0;
    return 1;
}

typedef struct qkv_shape {
    int32_t nh, nkv, hd;
} qkv_shape;

/* Dequantized cache vs the fp64 rotation: the format's rounding plus the RoPE bound above.
 * bf16: 2^-8 |x| (RNE, 8 significant bits); FP8: 2^-4 |x| + 2^-10 scale (e4m3 normals /
 * subnormals); NVFP4: the largest half-gap of the E2M1 grid is 1 (between 4 and 6) and values up
 * to 6.4 (block-scale rounding) saturate to 6, so |err| <= 1 * e4m3(block scale) * global. */
static int cache_close_to_fp64(const nib_kv_layer *l, int which, int64_t slot, int32_t head, const float *deq,
                               const double *x64, const double *bd) {
    const int32_t hd = l->head_dim;
    const int64_t vec = slot * l->n_kv_heads + head;
    for (int32_t d = 0; d < hd; d++) {
        double tol = bd[d] * 2 + 0x1p-140;
        switch (l->dtype) {
        case NIB_KV_BF16: tol += 0x1p-8 * fabs(x64[d]); break;
        case NIB_KV_FP8: tol += 0x1p-4 * fabs(x64[d]) + 0x1p-10 * (which ? l->vs : l->ks)[vec]; break;
        default:
            tol += (double)nib_e4m3_to_f32((which ? l->vb : l->kb)[vec * (hd / 16) + d / 16]) * (which ? l->vs : l->ks)[vec];
            break;
        }
        if (!(fabs(deq[d] - x64[d]) <= tol)) return 0;
    }
    return 1;
}

NIB_TEST(ops_ref_qkv_cache_bits) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const qkv_shape shapes[] = {{8, 1, 256}, {4, 2, 128}, {0, 1, 32}};
    const int64_t T = 5;
    const int32_t off = 3;
    for (size_t si = 0; si < NIB_ARRAY_LEN(shapes); si++)
        for (int dt = 0; dt < NIB_KV_COUNT; dt++) {
            const qkv_shape *s = &shapes[si];
            const int32_t nh = s->nh, nkv = s->nkv, hd = s->hd;
            const int64_t w = (int64_t)(nh + 2 * nkv) * hd, ld = w + 16, ldq = (int64_t)nh * hd + 8;
            float *qkv = nib_malloc(T * ld * 4), *q = nib_malloc(T * (ldq + 1) * 4), *tmp = nib_malloc(w * 4);
            float *fr = nib_malloc(hd / 2 * 4), *deq = nib_malloc((size_t)nkv * hd * 4);
            double *k64 = nib_malloc(w * 8), *bd = nib_malloc(w * 8), *zero = nib_calloc((size_t)w, 8);
            int32_t pos[5];
            host_cache c;
            REQUIRE(qkv && q && tmp && fr && deq && k64 && bd && zero);
            REQUIRE(host_cache_init(&c, (nib_kv_dtype)dt, (int32_t)T + off + 4, nkv, hd));
            fill_normal(&rng, qkv, T * ld, 1.5);
            fill_poison(q, T * (ldq + 1));
            for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)nib_rng_below(&rng, 1000);
            CHECK_OK(nib_rope_inv_freq(NIB_ROPE_THETA, hd, fr));
            const float qs = 1.0f / sqrtf((float)hd) * 1.1f; /* not a power of two: a real rounding */
            nib_qkv_args a;
            memset(&a, 0, sizeof a);
            a.tokens = T;
            a.n_heads = nh;
            a.n_kv_heads = nkv;
            a.head_dim = hd;
            a.qkv = qkv;
            a.ld_qkv = ld;
            a.positions = pos;
            a.inv_freq = fr;
            a.q_scale = qs;
            a.q = nh ? q : NULL;
            a.ld_q = ldq;
            a.cache = &c.l;
            a.slot_offset = off;
            CHECK_OK(nib_ref_qkv(&a));
            int bad_q = 0, bad_k = 0, bad_v = 0, far = 0;
            for (int64_t tk = 0; tk < T; tk++) {
                /* q and k: nib_ref_rope on a copy (the composition), then the scale */
                memcpy(tmp, qkv + tk * ld, w * 4);
                nib_rope_args r;
                memset(&r, 0, sizeof r);
                r.style = NIB_ROPE_HALF;
                r.tokens = 1;
                r.n_heads = nh + nkv;
                r.head_dim = hd;
                r.rot_dim = hd;
                r.positions = pos + tk;
                r.inv_freq = fr;
                r.x = tmp;
                r.ld = w;
                CHECK_OK(nib_ref_rope(&r));
                for (int64_t i = 0; i < (int64_t)nh * hd; i++) {
                    float want = tmp[i] * qs;
                    bad_q += f2u(q[tk * ldq + i]) != f2u(want);
                }
                for (int32_t h = 0; h < nkv; h++) {
                    bad_k += !vec_bits_equal(&c.l, 0, off + tk, h, tmp + (int64_t)(nh + h) * hd);
                    bad_v += !vec_bits_equal(&c.l, 1, off + tk, h, qkv + tk * ld + (int64_t)(nh + nkv + h) * hd);
                }
                /* dequantized K vs the fp64 rotation from scratch, V vs its input */
                rope_row64(qkv + tk * ld, nh + nkv, hd, hd, NIB_ROPE_HALF, 0, NIB_ROPE_THETA, pos[tk], k64, bd);
                nib_kv_read_args rd = {&c.l, 0, off + (int32_t)tk, 1, deq, NIB_DTYPE_F32};
                CHECK_OK(nib_ref_kv_read(&rd));
                for (int32_t h = 0; h < nkv; h++)
                    far += !cache_close_to_fp64(&c.l, 0, off + tk, h, deq + (int64_t)h * hd,
                                                k64 + (int64_t)(nh + h) * hd, bd + (int64_t)(nh + h) * hd);
                rd.which = 1;
                CHECK_OK(nib_ref_kv_read(&rd));
                for (int32_t h = 0; h < nkv; h++) {
                    double v64[512];
                    for (int32_t d = 0; d < hd; d++) v64[d] = qkv[tk * ld + (int64_t)(nh + nkv + h) * hd + d];
                    far += !cache_close_to_fp64(&c.l, 1, off + tk, h, deq + (int64_t)h * hd, v64, zero);
                }
                if (nh) CHECK(count_not_poison(q + tk * ldq + (int64_t)nh * hd, 8) == 0);
            }
            CHECK_MSG(bad_q == 0, "%d q values differ from rope(q) * scale", bad_q);
            CHECK_MSG(bad_k == 0 && bad_v == 0, "%s cache: %d K and %d V vectors differ from formats/ quantizers of the vectors",
                      nib_kv_dtype_name((nib_kv_dtype)dt), bad_k, bad_v);
            CHECK_MSG(far == 0, "%s: %d cache vectors beyond the format's rounding of the fp64 values",
                      nib_kv_dtype_name((nib_kv_dtype)dt), far);
            /* slots outside [off, off + T) untouched */
            int touched = 0;
            for (int32_t sl = 0; sl < c.l.t_max; sl++)
                if (sl < off || sl >= off + T)
                    for (int32_t h = 0; h < nkv; h++) touched += !vec_untouched(&c.l, 0, sl, h) + !vec_untouched(&c.l, 1, sl, h);
            CHECK_MSG(touched == 0, "%d vectors outside the written slots changed", touched);

            /* n_valid = 2 and slot_base: tokens 0, 1 go to slots base + off2 + {0, 1}; K/V only */
            host_cache c2;
            REQUIRE(host_cache_init(&c2, (nib_kv_dtype)dt, (int32_t)T + off + 4, nkv, hd));
            int32_t nv = 2, base = 4;
            nib_qkv_args b = a;
            b.q = NULL;
            b.n_valid = &nv;
            b.cache = &c2.l;
            b.slot_offset = -1;
            b.slot_base = &base;
            CHECK_OK(nib_ref_qkv(&b));
            for (int32_t sl = 0; sl < c2.l.t_max; sl++) {
                int written = sl == 3 || sl == 4;
                for (int32_t h = 0; h < nkv; h++)
                    CHECK_MSG(vec_untouched(&c2.l, 0, sl, h) == !written && vec_untouched(&c2.l, 1, sl, h) == !written,
                              "n_valid/slot_base: slot %d head %d", sl, h);
            }
            /* slots running past t_max are refused before anything is written */
            base = c2.l.t_max;
            CHECK_ST(nib_ref_qkv(&b), NIB_ERR_SHAPE);
            nib_free(c2.mem);
            nib_free(c.mem);
            nib_free(qkv);
            nib_free(q);
            nib_free(tmp);
            nib_free(fr);
            nib_free(deq);
            nib_free(k64);
            nib_free(bd);
            nib_free(zero);
        }
}

NIB_TEST(ops_ref_kv_write_read) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int32_t nkv = 2, hd = 64, T = 6;
    for (int dt = 0; dt < NIB_KV_COUNT; dt++) {
        host_cache c;
        REQUIRE(host_cache_init(&c, (nib_kv_dtype)dt, 16, nkv, hd));
        float k[6 * 136], v[6 * 128], out[6 * 128], want[128];
        fill_normal(&rng, k, 6 * 136, 0.7);
        fill_normal(&rng, v, 6 * 128, 3.0);
        for (int d = 0; d < hd; d++) v[d] = 0.0f; /* an all-zero vector: scale/global 1 */
        nib_kv_write_args a = {T, NULL, k, 136, v, 128, &c.l, 2, NULL};
        CHECK_OK(nib_ref_kv_write(&a));
        int bad = 0;
        for (int tk = 0; tk < T; tk++)
            for (int h = 0; h < nkv; h++) {
                bad += !vec_bits_equal(&c.l, 0, 2 + tk, h, k + tk * 136 + h * hd);
                bad += !vec_bits_equal(&c.l, 1, 2 + tk, h, v + tk * 128 + h * hd);
            }
        CHECK_MSG(bad == 0, "%s: %d vectors differ from the formats/ quantizers", nib_kv_dtype_name((nib_kv_dtype)dt), bad);
        if (dt != NIB_KV_BF16) CHECK(c.l.vs[2 * nkv] == 1.0f);
        /* read back == formats/ dequantizers of the stored planes */
        nib_kv_read_args r = {&c.l, 1, 2, T, out, NIB_DTYPE_F32};
        CHECK_OK(nib_ref_kv_read(&r));
        int bad_r = 0;
        for (int tk = 0; tk < T; tk++)
            for (int h = 0; h < nkv; h++) {
                const int64_t vec = (int64_t)(2 + tk) * nkv + h;
                if (dt == NIB_KV_BF16)
                    for (int d = 0; d < hd; d++) want[d] = nib_bf16_to_f32(((uint16_t *)c.l.v)[vec * hd + d]);
                else if (dt == NIB_KV_FP8)
                    CHECK_OK(nib_fp8_dequantize((uint8_t *)c.l.v + vec * hd, c.l.vs + vec, 1, hd, 1, want));
                else
                    CHECK_OK(nib_nvfp4_dequantize((uint8_t *)c.l.v + vec * hd / 2, c.l.vb + vec * hd / 16, c.l.vs[vec], 1,
                                                  hd, want));
                bad_r += memcmp(want, out + (tk * nkv + h) * hd, hd * 4) != 0;
            }
        CHECK_MSG(bad_r == 0, "read-back differs in %d vectors", bad_r);
        r.out_dtype = NIB_DTYPE_BF16;
        CHECK_ST(nib_ref_kv_read(&r), NIB_ERR_INVALID_ARG);
        r.out_dtype = NIB_DTYPE_F32;
        r.n_slots = 15;
        CHECK_ST(nib_ref_kv_read(&r), NIB_ERR_SHAPE);
        a.slot_offset = 11;
        CHECK_ST(nib_ref_kv_write(&a), NIB_ERR_SHAPE);
        CHECK(strstr(nib_last_error(), "kv write (ref)") != NULL);
        nib_free(c.mem);
    }
}

NIB_TEST(ops_ref_qkv_rejects) {
    float x[4096], fr[128];
    int32_t pos[2] = {0, 1};
    host_cache c;
    REQUIRE(host_cache_init(&c, NIB_KV_FP8, 8, 1, 256));
    nib_qkv_args g;
    memset(&g, 0, sizeof g);
    g.tokens = 1;
    g.n_heads = 2;
    g.n_kv_heads = 1;
    g.head_dim = 256;
    g.qkv = x;
    g.ld_qkv = 1024;
    g.positions = pos;
    g.inv_freq = fr;
    g.q_scale = 0.0625f;
    g.cache = &c.l;
    memset(x, 0, sizeof x);
    CHECK_OK(nib_rope_inv_freq(NIB_ROPE_THETA, 256, fr));
    CHECK_OK(nib_ref_qkv(&g));
    nib_qkv_args a = g;
    a.head_dim = 72;
    CHECK_ST(nib_ref_qkv(&a), NIB_ERR_SHAPE);
    CHECK(strstr(nib_last_error(), "qkv epilogue (ref)") && strstr(nib_last_error(), "72"));
    a = g;
    a.n_kv_heads = 2; /* the cache has 1 */
    a.ld_qkv = 2048;
    CHECK_ST(nib_ref_qkv(&a), NIB_ERR_SHAPE);
    a = g;
    a.ld_qkv = 1000;
    CHECK_ST(nib_ref_qkv(&a), NIB_ERR_SHAPE);
    a = g;
    a.slot_offset = 8;
    CHECK_ST(nib_ref_qkv(&a), NIB_ERR_SHAPE);
    a = g;
    a.cache = NULL;
    CHECK_ST(nib_ref_qkv(&a), NIB_ERR_INVALID_ARG); /* no output at all */
    a = g;
    a.inv_freq = NULL;
    CHECK_ST(nib_ref_qkv(&a), NIB_ERR_INVALID_ARG);
    a = g;
    a.n_heads = 100;
    a.ld_qkv = 102 * 256;
    CHECK_ST(nib_ref_qkv(&a), NIB_ERR_SHAPE); /* > 1024 threads per token */
    nib_free(c.mem);
}

/* ops/qkv.h's pair layout (pairs = 1, what a q|k|v weight loaded with rope_half produces): the same q
 * and cache bytes as the plain order it permutes, for 2 + 1 + 1 heads of 64 and of 32, every cache
 * dtype; and any other pairs value is refused. */
NIB_TEST(ops_ref_qkv_pair_layout) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const int32_t hds[] = {64, 32};
    for (size_t hi = 0; hi < NIB_ARRAY_LEN(hds); hi++)
        for (int dt = 0; dt < NIB_KV_COUNT; dt++) {
            const int32_t nh = 2, nkv = 1, hd = hds[hi], T = 3;
            const int64_t width = (int64_t)(nh + 2 * nkv) * hd, ld = width + 4;
            float plain[3 * 260], paired[3 * 260], q0[3 * 128], q1[3 * 128], fr[32];
            int32_t pos[3] = {0, 7, 1234};
            for (int64_t i = 0; i < T * ld; i++) plain[i] = (float)nib_rng_normal(&rng);
            for (int64_t tk = 0; tk < T; tk++)
                for (int64_t h = 0; h < width / hd; h++)
                    for (int32_t e = 0; e < hd; e++) { /* element 16j + i <- dim 8j + i, 16j + 8 + i <- half + 8j + i */
                        const int32_t j = e / 16, i = e % 16, dim = i < 8 ? 8 * j + i : hd / 2 + 8 * j + i - 8;
                        paired[tk * ld + h * hd + e] = plain[tk * ld + h * hd + dim];
                    }
            host_cache c0, c1;
            REQUIRE(host_cache_init(&c0, (nib_kv_dtype)dt, 5, nkv, hd) && host_cache_init(&c1, (nib_kv_dtype)dt, 5, nkv, hd));
            CHECK_OK(nib_rope_inv_freq(NIB_ROPE_THETA, hd, fr));
            nib_qkv_args a;
            memset(&a, 0, sizeof a);
            a.tokens = T, a.n_heads = nh, a.n_kv_heads = nkv, a.head_dim = hd, a.qkv = plain, a.ld_qkv = ld;
            a.positions = pos, a.inv_freq = fr, a.q_scale = 0.125f, a.q = q0, a.ld_q = nh * hd, a.cache = &c0.l;
            a.slot_offset = 1;
            CHECK_OK(nib_ref_qkv(&a));
            a.qkv = paired, a.q = q1, a.cache = &c1.l, a.pairs = 1;
            CHECK_OK(nib_ref_qkv(&a));
            CHECK_MSG(!memcmp(q0, q1, (size_t)(T * nh * hd) * 4), "hd %d %s: q differs", hd, nib_kv_dtype_name((nib_kv_dtype)dt));
            CHECK_MSG(!memcmp(c0.mem, c1.mem, (size_t)c0.bytes), "hd %d %s: cache differs", hd,
                      nib_kv_dtype_name((nib_kv_dtype)dt));
            a.pairs = 2;
            CHECK_ST(nib_ref_qkv(&a), NIB_ERR_INVALID_ARG);
            CHECK(strstr(nib_last_error(), "pairs 2") != NULL);
            nib_free(c0.mem);
            nib_free(c1.mem);
        }
}

/* ---- the flow step's edge (ops/edge.h) -------------------------------------------------------
 * The reference edge is the composition it documents: adaRMS (nib_ref_norm) -> the action-out linear
 * (fp64 sums rounded once, + bias) -> x_t += v -> the action-in linear over action_in_proj's own
 * [dim][adim] layout (the test transposes it for w_in_t) -> adaRMS. Each step here is computed
 * independently of ops/ref/edge.c with the same roundings, so the results must agree bit for bit;
 * outputs are poisoned first and the rows past `rows` and the padding must stay poisoned / unchanged. */
NIB_TEST(ops_ref_edge_composition) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    enum { D = 48, A = 5, ROWS = 3, LD = D + 4, LDT = A + 2 };
    float x[ROWS + 1][LD], r[ROWS + 1][LD], h[ROWS + 1][LD], y[ROWS + 1][LD], xt[ROWS + 1][LDT], xt0[ROWS + 1][LDT];
    float win[D][A], wint[A][D], wout[A][D], v6[6][D], bo[A];
    fill_normal(&rng, &x[0][0], (ROWS + 1) * LD, 1.0);
    fill_normal(&rng, &r[0][0], (ROWS + 1) * LD, 1.0);
    fill_normal(&rng, &xt0[0][0], (ROWS + 1) * LDT, 1.0);
    fill_normal(&rng, &win[0][0], D * A, 0.4);
    fill_normal(&rng, &wout[0][0], A * D, 0.15);
    fill_normal(&rng, &v6[0][0], 6 * D, 0.5);
    fill_normal(&rng, bo, A, 0.1);
    for (int n = 0; n < D; n++)
        for (int k = 0; k < A; k++) wint[k][n] = win[n][k];
    for (int mode = 1; mode <= 3; mode++) {
        memcpy(xt, xt0, sizeof xt);
        fill_poison(&h[0][0], (ROWS + 1) * LD);
        fill_poison(&y[0][0], (ROWS + 1) * LD);
        nib_edge_args a = {.mode = mode, .rows = ROWS, .dim = D, .adim = A, .eps = NIB_NORM_EPS, .x = x, .ldx = LD,
                           .residual = r, .ldr = LD, .res_gate = v6[0], .fscale = v6[1], .fshift = v6[2],
                           .w_out = wout, .b_out = bo, .xt = &xt[0][0], .ldxt = LDT, .w_in_t = wint, .b_in = v6[5],
                           .h = h, .ldh = LD, .nscale = v6[3], .nshift = v6[4], .y = y, .ldy = LD};
        CHECK_OK(nib_ref_edge(&a));
        int64_t bad = 0;
        for (int row = 0; row < ROWS; row++) {
            float want_xt[A], hw[D], yw[D], hs[D];
            memcpy(want_xt, xt0[row], sizeof want_xt);
            if (mode & NIB_EDGE_OUT) {
                float yf[D];
                nib_norm_args n = {.kind = NIB_NORM_ADARMS, .rows = 1, .dim = D, .eps = NIB_NORM_EPS, .x = x[row],
                                   .ldx = D, .residual = r[row], .ldr = D, .h_out = hs, .ldh = D, .res_gate = v6[0],
                                   .scale = v6[1], .shift = v6[2], .y = yf, .ldy = D};
                CHECK_OK(nib_ref_norm(&n));
                for (int j = 0; j < A; j++) {
                    double s = 0.0;
                    for (int i = 0; i < D; i++) s += (double)yf[i] * wout[j][i];
                    want_xt[j] = want_xt[j] + ((float)s + bo[j]);
                }
            }
            for (int j = 0; j < LDT; j++)
                bad += f2u(xt[row][j]) != f2u(j < A ? want_xt[j] : xt0[row][j]);
            if (mode & NIB_EDGE_IN) {
                for (int n = 0; n < D; n++) {
                    double s = 0.0;
                    for (int k = 0; k < A; k++) s += (double)want_xt[k] * win[n][k];
                    hw[n] = (float)s + v6[5][n];
                }
                nib_norm_args n = {.kind = NIB_NORM_ADARMS, .rows = 1, .dim = D, .eps = NIB_NORM_EPS, .x = hw,
                                   .ldx = D, .scale = v6[3], .shift = v6[4], .y = yw, .ldy = D};
                CHECK_OK(nib_ref_norm(&n));
                for (int n2 = 0; n2 < D; n2++) bad += (f2u(h[row][n2]) != f2u(hw[n2])) + (f2u(y[row][n2]) != f2u(yw[n2]));
                bad += count_not_poison(h[row] + D, LD - D) + count_not_poison(y[row] + D, LD - D);
            } else {
                bad += count_not_poison(h[row], LD) + count_not_poison(y[row], LD);
            }
        }
        bad += count_not_poison(h[ROWS], LD) + count_not_poison(y[ROWS], LD);
        for (int j = 0; j < LDT; j++) bad += f2u(xt[ROWS][j]) != f2u(xt0[ROWS][j]);
        CHECK_MSG(bad == 0, "edge mode %d: %lld values differ from the composition or were written outside it", mode,
                  (long long)bad);
    }
}

NIB_TEST(ops_ref_edge_rejects) {
    float f[64];
    memset(f, 0, sizeof f);
    const nib_edge_args a = {.mode = 3, .rows = 1, .dim = 8, .adim = 2, .eps = NIB_NORM_EPS, .x = f, .ldx = 8,
                             .fscale = f, .fshift = f, .w_out = f, .xt = f, .ldxt = 2, .w_in_t = f, .h = f + 16,
                             .ldh = 8, .nscale = f, .nshift = f, .y = f + 32, .ldy = 8};
    nib_edge_args b = a;
    CHECK_OK(nib_ref_edge(&b));
    b.mode = 4;
    CHECK_ST(nib_ref_edge(&b), NIB_ERR_INVALID_ARG);
    b = a, b.dim = 12, b.ldx = b.ldh = b.ldy = 12;
    CHECK_ST(nib_ref_edge(&b), NIB_ERR_SHAPE); /* not a multiple of 8 */
    b = a, b.adim = 0;
    CHECK_ST(nib_ref_edge(&b), NIB_ERR_SHAPE);
    b = a, b.adim = NIB_EDGE_MAX_ADIM + 1;
    CHECK_ST(nib_ref_edge(&b), NIB_ERR_SHAPE);
    b = a, b.ldxt = 1;
    CHECK_ST(nib_ref_edge(&b), NIB_ERR_SHAPE);
    b = a, b.fshift = NULL;
    CHECK_ST(nib_ref_edge(&b), NIB_ERR_INVALID_ARG);
    b = a, b.y = NULL;
    CHECK_ST(nib_ref_edge(&b), NIB_ERR_INVALID_ARG);
    b = a, b.mode = NIB_EDGE_OUT, b.y = NULL, b.h = NULL; /* IN's outputs are not needed by OUT */
    CHECK_OK(nib_ref_edge(&b));
    b = a, b.ldy = 4;
    CHECK_ST(nib_ref_edge(&b), NIB_ERR_SHAPE);
    /* the kernel's shape rule: widths of whole 8-column chunks up to 2048, the weights within the shared-memory budget */
    CHECK_OK(nib_edge_supported(3, 1024, 32));
    CHECK_OK(nib_edge_supported(3, 1000, 32));
    CHECK_OK(nib_edge_supported(3, 80, 1));
    CHECK_ST(nib_edge_supported(3, 1020, 32), NIB_ERR_SHAPE);
    CHECK_ST(nib_edge_supported(3, 4096, 8), NIB_ERR_SHAPE);
    CHECK_ST(nib_edge_supported(3, 2048, 32), NIB_ERR_SHAPE);
    CHECK_OK(nib_edge_supported(NIB_EDGE_OUT, 2048, 32));
    CHECK_ST(nib_edge_supported(1, 1024, 33), NIB_ERR_SHAPE);
}
