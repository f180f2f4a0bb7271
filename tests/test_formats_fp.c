/* test_formats_fp.c — the scalar conversions of formats/ (bf16, fp16, E4M3, E5M2, E8M0, E2M1).
 *
 * Two independent checks per format:
 *   1. every code point decodes and re-encodes to itself (NaNs stay NaN with their sign);
 *   2. the encoder agrees with an ORACLE that knows nothing about bit layouts: it decodes every
 *      non-negative finite code into a table sorted by value and picks the nearest table value
 *      by distance, breaking exact ties towards the even code (mantissa LSB 0). The oracle is
 *      fed every midpoint between adjacent values (the ties) and the floats just beside them,
 *      random floats over the whole fp32 range and over the format's own range, and the edges
 *      (±0, smallest subnormal and half of it, ±max, ±(max + ε), the overflow threshold,
 *      ±Inf, NaN).
 * Overflow policy per format (formats.h): bf16/fp16 round to Inf like IEEE (the oracle treats
 * Inf as the grid point one ulp past max); E4M3 and E2M1 saturate, Inf included; E5M2
 * saturates finite values but keeps Inf.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "harness.h"

/* ---- format descriptors for the generic checks ----------------------------------------- */

static uint32_t enc_bf16(float x) { return nib_f32_to_bf16(x); }
static float dec_bf16(uint32_t c) { return nib_bf16_to_f32((uint16_t)c); }
static uint32_t enc_f16(float x) { return nib_f32_to_f16(x); }
static float dec_f16(uint32_t c) { return nib_f16_to_f32((uint16_t)c); }
static uint32_t enc_e4m3(float x) { return nib_f32_to_e4m3(x); }
static float dec_e4m3(uint32_t c) { return nib_e4m3_to_f32((uint8_t)c); }
static uint32_t enc_e5m2(float x) { return nib_f32_to_e5m2(x); }
static float dec_e5m2(uint32_t c) { return nib_e5m2_to_f32((uint8_t)c); }
static uint32_t enc_e2m1(float x) { return nib_f32_to_e2m1(x); }
static float dec_e2m1(uint32_t c) { return nib_e2m1_to_f32((uint8_t)c); }

typedef struct fmt_desc {
    const char *name;
    uint32_t ncodes;          /* 2^bits */
    uint32_t sign_bit;
    uint32_t (*enc)(float);
    float (*dec)(uint32_t);
    int overflow_to_inf;      /* finite overflow rounds to Inf (IEEE) instead of saturating */
    int inf_to_inf;           /* ±Inf input gives the Inf code (else the max code) */
    uint32_t inf_code;        /* positive Inf code where the format has one */
    int has_nan;              /* NaN input must decode back to NaN */
} fmt_desc;

static const fmt_desc k_bf16 = {"bf16", 65536, 0x8000, enc_bf16, dec_bf16, 1, 1, 0x7F80, 1};
static const fmt_desc k_f16 = {"fp16", 65536, 0x8000, enc_f16, dec_f16, 1, 1, 0x7C00, 1};
static const fmt_desc k_e4m3 = {"e4m3", 256, 0x80, enc_e4m3, dec_e4m3, 0, 0, 0, 1};
static const fmt_desc k_e5m2 = {"e5m2", 256, 0x80, enc_e5m2, dec_e5m2, 0, 1, 0x7C, 1};
static const fmt_desc k_e2m1 = {"e2m1", 16, 0x8, enc_e2m1, dec_e2m1, 0, 0, 0, 0};

/* Non-negative finite values of a format, sorted by value, with their codes. */
typedef struct code_table {
    int n;
    double *val;
    uint32_t *code;
} code_table;

typedef struct vc {
    double v;
    uint32_t c;
} vc;

static int cmp_vc(const void *a, const void *b) {
    const vc *x = a, *y = b;
    return x->v < y->v ? -1 : (x->v > y->v ? 1 : 0);
}

static int table_build(const fmt_desc *f, code_table *tab) {
    vc *tmp = malloc(sizeof(vc) * f->sign_bit);
    tab->val = malloc(sizeof(double) * f->sign_bit);
    tab->code = malloc(sizeof(uint32_t) * f->sign_bit);
    if (!tmp || !tab->val || !tab->code) {
        free(tmp);
        return 0;
    }
    int n = 0;
    for (uint32_t c = 0; c < f->sign_bit; c++) { /* sign bit clear: +0 .. +max (+Inf, NaN) */
        float v = f->dec(c);
        if (!isfinite(v)) continue;
        tmp[n].v = v;
        tmp[n].c = c;
        n++;
    }
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_vc);
    for (int i = 0; i < n; i++) {
        tab->val[i] = tmp[i].v;
        tab->code[i] = tmp[i].c;
    }
    tab->n = n;
    free(tmp);
    return 1;
}

static void table_free(code_table *tab) {
    free(tab->val);
    free(tab->code);
}

/* Nearest table value to |x| (ties to the even code), with the format's overflow policy. */
static uint32_t oracle(const fmt_desc *f, const code_table *tab, float x) {
    uint32_t sign = signbit(x) ? f->sign_bit : 0;
    const int n = tab->n;
    const double mx = tab->val[n - 1];
    if (isinf(x)) return sign | (f->inf_to_inf ? f->inf_code : tab->code[n - 1]);
    double a = fabs((double)x);
    if (a >= mx) {
        if (!f->overflow_to_inf || a == mx) return sign | tab->code[n - 1];
        /* IEEE: round as if the exponent range were unbounded; the next grid point,
         * max + ulp(max), is Inf */
        double next = mx + (mx - tab->val[n - 2]);
        double dlo = a - mx, dhi = next - a;
        if (dlo < dhi || (dlo == dhi && !(tab->code[n - 1] & 1u))) return sign | tab->code[n - 1];
        return sign | f->inf_code;
    }
    int lo = 0, hi = n - 1; /* val[lo] <= a < val[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (tab->val[mid] <= a) lo = mid;
        else hi = mid;
    }
    /* both differences are exact in fp64 (Sterbenz: a lies within a factor 2 of its
     * neighbours wherever the two distances can be close) */
    double dlo = a - tab->val[lo], dhi = tab->val[hi] - a;
    if (dlo < dhi) return sign | tab->code[lo];
    if (dhi < dlo) return sign | tab->code[hi];
    return sign | ((tab->code[lo] & 1u) ? tab->code[hi] : tab->code[lo]);
}

/* Compare encoder and oracle on x and -x; returns the number of mismatches. */
static int check_pair(nib_test_ctx *t, const fmt_desc *f, const code_table *tab, float x) {
    int bad = 0;
    for (int s = 0; s < 2; s++) {
        float y = s ? -x : x;
        uint32_t got = f->enc(y), want = oracle(f, tab, y);
        if (got != want) {
            bad++;
            CHECK_MSG(got == want, "%s: encode(%a = %.9g) = 0x%x, oracle says 0x%x", f->name, y,
                      y, got, want);
        }
    }
    return bad;
}

static float f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The whole oracle comparison for one format. */
static void oracle_suite(nib_test_ctx *t, const fmt_desc *f) {
    code_table tab;
    REQUIRE(table_build(f, &tab));
    nib_rng rng;
    nib_test_rng(t, &rng);
    /* every table value, every midpoint (tie) and the floats just beside it */
    for (int i = 0; i < tab.n; i++) {
        check_pair(t, f, &tab, (float)tab.val[i]);
        if (i + 1 == tab.n) break;
        double mid = 0.5 * (tab.val[i] + tab.val[i + 1]);
        float m = (float)mid;
        CHECK_MSG((double)m == mid, "%s: midpoint %a not representable in fp32", f->name, mid);
        check_pair(t, f, &tab, m);
        check_pair(t, f, &tab, nextafterf(m, 0.0f));
        check_pair(t, f, &tab, nextafterf(m, INFINITY));
    }
    /* edges */
    const double mx = tab.val[tab.n - 1], min_sub = tab.val[1];
    const double over = mx + 0.5 * (mx - tab.val[tab.n - 2]); /* max + half an ulp */
    float edges[] = {0.0f,
                     (float)min_sub,
                     (float)(min_sub / 2), /* tie between 0 and the smallest subnormal: 0 */
                     nextafterf((float)(min_sub / 2), INFINITY),
                     nextafterf((float)(min_sub / 2), 0.0f),
                     (float)mx,
                     nextafterf((float)mx, INFINITY),
                     nextafterf((float)mx, 0.0f),
                     (float)over,
                     nextafterf((float)over, 0.0f),
                     nextafterf((float)over, INFINITY),
                     (float)fmin(2 * mx, FLT_MAX),
                     FLT_MAX,
                     FLT_MIN,
                     FLT_TRUE_MIN,
                     INFINITY};
    for (size_t i = 0; i < NIB_ARRAY_LEN(edges); i++) check_pair(t, f, &tab, edges[i]);
    /* random fp32 bit patterns (all exponents) */
    for (int i = 0; i < 200000; i++) {
        float x = f32_from_bits((uint32_t)nib_rng_u64(&rng));
        if (!isnan(x)) check_pair(t, f, &tab, x);
    }
    /* random floats log-uniform over the format's range, a binade beyond each end */
    double lo2 = log2(min_sub) - 2, hi2 = log2(mx) + 1;
    for (int i = 0; i < 200000; i++) {
        double e = floor(lo2 + (hi2 - lo2) * nib_rng_uniform(&rng));
        double x = ldexp(1.0 + nib_rng_uniform(&rng), (int)e);
        if (x <= FLT_MAX) check_pair(t, f, &tab, (float)x);
    }
    /* NaN */
    if (f->has_nan) {
        CHECK_MSG(isnan(f->dec(f->enc(NAN))), "%s: NaN does not stay NaN", f->name);
        CHECK_MSG(isnan(f->dec(f->enc(-NAN))), "%s: -NaN does not stay NaN", f->name);
        CHECK(signbit(f->dec(f->enc(-NAN))) && !signbit(f->dec(f->enc(NAN))));
    }
    table_free(&tab);
}

/* Every code: decode -> encode gives the code back; NaN codes stay NaN with their sign. */
static void all_codes_suite(nib_test_ctx *t, const fmt_desc *f, uint32_t quiet_bit) {
    int nan_codes = 0;
    for (uint32_t c = 0; c < f->ncodes; c++) {
        float v = f->dec(c);
        uint32_t back = f->enc(v);
        if (isnan(v)) {
            nan_codes++;
            float v2 = f->dec(back);
            CHECK_MSG(isnan(v2), "%s: NaN code 0x%x re-encodes to non-NaN 0x%x", f->name, c, back);
            CHECK_MSG(!!signbit(v2) == !!(c & f->sign_bit), "%s: NaN 0x%x lost its sign", f->name,
                      c);
            if (quiet_bit && (c & quiet_bit))
                CHECK_MSG(back == c, "%s: quiet NaN 0x%x re-encodes to 0x%x", f->name, c, back);
        } else {
            CHECK_MSG(back == c, "%s: code 0x%x -> %a -> 0x%x", f->name, c, v, back);
        }
    }
    CHECK(f->has_nan ? nan_codes > 0 : nan_codes == 0);
}

/* ---- tests ---------------------------------------------------------------------------------- */

NIB_TEST(fmt_e2m1_all_codes) {
    all_codes_suite(t, &k_e2m1, 0);
    /* the grid itself, from the spec table */
    static const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) {
        float v = nib_e2m1_to_f32((uint8_t)c);
        CHECK(fabsf(v) == grid[c & 7]);
        CHECK(!!signbit(v) == !!(c & 8));
    }
}

NIB_TEST(fmt_e2m1_oracle) {
    oracle_suite(t, &k_e2m1);
    /* the documented tie table (ModelOpt's bounds): 0.25->0 0.75->1 1.25->1 1.75->2 2.5->2
     * 3.5->4 5->4, and saturation */
    static const float x[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 5.0001f, 7.0f, 1e30f};
    static const float want[] = {0, 1, 1, 2, 2, 4, 4, 6, 6, 6};
    for (size_t i = 0; i < NIB_ARRAY_LEN(x); i++) {
        CHECK_MSG(nib_e2m1_to_f32(nib_f32_to_e2m1(x[i])) == want[i], "e2m1(%g)", x[i]);
        CHECK_MSG(nib_e2m1_to_f32(nib_f32_to_e2m1(-x[i])) == -want[i], "e2m1(-%g)", x[i]);
    }
    /* documented special choices */
    CHECK(nib_f32_to_e2m1(INFINITY) == 0x7 && nib_f32_to_e2m1(-INFINITY) == 0xF);
    CHECK(nib_f32_to_e2m1(NAN) == 0x7);
    CHECK(nib_f32_to_e2m1(-0.0f) == 0x8 && nib_f32_to_e2m1(-0.1f) == 0x8);
    CHECK(nib_f32_to_e2m1(0.0f) == 0x0);
}

NIB_TEST(fmt_e4m3_all_codes) {
    all_codes_suite(t, &k_e4m3, 0);
    int nans = 0;
    for (int c = 0; c < 256; c++) nans += isnan(nib_e4m3_to_f32((uint8_t)c));
    CHECK(nans == 2); /* only S.1111.111 */
    CHECK(isnan(nib_e4m3_to_f32(0x7F)) && isnan(nib_e4m3_to_f32(0xFF)));
    CHECK(nib_e4m3_to_f32(0x7E) == 448.0f && nib_e4m3_to_f32(0x01) == 0x1p-9f);
    CHECK(nib_e4m3_to_f32(0x38) == 1.0f && nib_e4m3_to_f32(0x08) == 0x1p-6f);
}

NIB_TEST(fmt_e4m3_oracle) {
    oracle_suite(t, &k_e4m3);
    /* documented behaviour: SATFINITE, NaN keeps its sign */
    CHECK(nib_f32_to_e4m3(448.0f) == 0x7E);
    CHECK(nib_f32_to_e4m3(464.0f) == 0x7E); /* the tie 448|480 (480 would be the NaN code) */
    CHECK(nib_f32_to_e4m3(1e9f) == 0x7E && nib_f32_to_e4m3(-1e9f) == 0xFE);
    CHECK(nib_f32_to_e4m3(INFINITY) == 0x7E && nib_f32_to_e4m3(-INFINITY) == 0xFE);
    CHECK(nib_f32_to_e4m3(NAN) == 0x7F && nib_f32_to_e4m3(-NAN) == 0xFF);
    CHECK(nib_f32_to_e4m3(0x1p-10f) == 0x00);             /* half the smallest subnormal: tie -> 0 */
    CHECK(nib_f32_to_e4m3(nextafterf(0x1p-10f, 1)) == 0x01);
    CHECK(nib_f32_to_e4m3(3 * 0x1p-10f) == 0x02);         /* tie 1|2 subnormal units -> 2 (even) */
    CHECK(nib_f32_to_e4m3(-0.0f) == 0x80);
}

NIB_TEST(fmt_e5m2_all_codes) {
    all_codes_suite(t, &k_e5m2, 0);
    CHECK(isinf(nib_e5m2_to_f32(0x7C)) && isinf(nib_e5m2_to_f32(0xFC)));
    CHECK(nib_e5m2_to_f32(0x7B) == 57344.0f && nib_e5m2_to_f32(0x01) == 0x1p-16f);
}

NIB_TEST(fmt_e5m2_oracle) {
    oracle_suite(t, &k_e5m2);
    CHECK(nib_f32_to_e5m2(1e9f) == 0x7B && nib_f32_to_e5m2(-1e9f) == 0xFB); /* finite: saturate */
    CHECK(nib_f32_to_e5m2(INFINITY) == 0x7C && nib_f32_to_e5m2(-INFINITY) == 0xFC);
    CHECK(nib_f32_to_e5m2(NAN) == 0x7E && nib_f32_to_e5m2(-NAN) == 0xFE);
}

NIB_TEST(fmt_e8m0_all_codes) {
    for (int c = 0; c < 255; c++) {
        float v = nib_e8m0_to_f32((uint8_t)c);
        /* 2^(c-127), computed independently in fp64 (exact) */
        CHECK_MSG((double)v == pow(2.0, c - 127), "e8m0 0x%02x -> %a", c, v);
        /* encode direction: the MXFP4 floor rule maps a block amax of 4 * 2^(c-127) to exactly
         * code c (floor(log2) - 2); amax overflows fp32 past c = 125 */
        if (c <= 125)
            CHECK_MSG(nib_mxfp4_block_scale(4.0f * v, NIB_MXFP4_SCALE_FLOOR) == c,
                      "e8m0 code %d does not round-trip", c);
    }
    CHECK(isnan(nib_e8m0_to_f32(0xFF)));
}

NIB_TEST(fmt_f16_all_patterns) {
    all_codes_suite(t, &k_f16, 0x0200);
    CHECK(nib_f16_to_f32(0x7BFF) == 65504.0f && nib_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(nib_f16_to_f32(0x3C00) == 1.0f && isinf(nib_f16_to_f32(0xFC00)));
}

NIB_TEST(fmt_f16_oracle) {
    oracle_suite(t, &k_f16);
    CHECK(nib_f32_to_f16(65519.996f) == 0x7BFF);  /* below max + half ulp (65520) */
    CHECK(nib_f32_to_f16(65520.0f) == 0x7C00);    /* the tie rounds to Inf (even) */
    CHECK(nib_f32_to_f16(0x1p-25f) == 0x0000);    /* tie 0 | 2^-24 */
    CHECK(nib_f32_to_f16(0x1.8p-24f) == 0x0002);  /* tie 1 | 2 units -> 2 */
    CHECK(nib_f32_to_f16(-INFINITY) == 0xFC00);
    /* a signalling NaN whose payload sits in bits fp16 drops still comes out NaN */
    CHECK(isnan(nib_f16_to_f32(nib_f32_to_f16(f32_from_bits(0x7F800001u)))));
}

NIB_TEST(fmt_bf16_all_patterns) {
    all_codes_suite(t, &k_bf16, 0x0040);
    CHECK(nib_bf16_to_f32(0x3F80) == 1.0f && nib_bf16_to_f32(0x0001) == 0x1p-133f);
}

NIB_TEST(fmt_bf16_oracle) {
    oracle_suite(t, &k_bf16);
    CHECK(nib_f32_to_bf16(FLT_MAX) == 0x7F80); /* above bf16 max + half ulp: Inf */
    CHECK(nib_f32_to_bf16(f32_from_bits(0x3F808000u)) == 0x3F80); /* tie -> even */
    CHECK(nib_f32_to_bf16(f32_from_bits(0x3F818000u)) == 0x3F82);
    /* NaN whose payload is only in the low 16 bits must not become Inf */
    CHECK(nib_f32_to_bf16(f32_from_bits(0x7F800001u)) == 0x7FC0);
    CHECK(nib_f32_to_bf16(f32_from_bits(0xFF800001u)) == 0xFFC0);
}
