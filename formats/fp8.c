/* fp8.c — exact scalar conversions (bf16, fp16, E4M3, E5M2, E8M0, E2M1), FP8 E4M3 weight
 * quantization (per tensor / per output channel), the shared shape and NaN checks, and the
 * error metrics every quantizer test and `nib formats` report. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "formats/formats.h"

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- bf16 ---------------------------------------------------------------------------------- */

uint16_t nib_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    /* RNE on the low 16 bits: add 0x7FFF plus the LSB that survives; a carry walks into the
     * exponent, which is exactly how max-finite rounds to Inf. */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float nib_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* ---- fp16 ---------------------------------------------------------------------------------- */

uint16_t nib_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN: keep the top 10 payload bits, force the quiet bit */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 (and Inf) -> Inf */
    uint32_t e = a >> 23;
    if (e >= 113) { /* |x| >= 2^-14: normal half, rebias 127 -> 15 */
        uint32_t h = ((e - 112u) << 10) | ((a >> 13) & 0x3FFu);
        uint32_t rem = a & 0x1FFFu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry may reach the exponent */
        return (uint16_t)(sign | h);
    }
    if (e < 102) return sign; /* |x| < 2^-25 = half the smallest subnormal: rounds to 0 */
    /* subnormal half: |x| = m * 2^(e-150), in units of 2^-24 that is m >> (126 - e) */
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t s = 126u - e; /* 14 .. 24 */
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++; /* q = 0x400 is the smallest normal */
    return (uint16_t)(sign | q);
}

float nib_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) return bits_f32(sign | 0x7F800000u | (m << 13)); /* Inf, NaN with payload */
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- small floats ----------------------------------------------------------------------------
 * RNE of a finite a >= 0 that does not exceed the format's max to a minifloat with `mb`
 * mantissa bits and exponent bias `bias` (subnormals below 2^(1-bias)). Returns the magnitude
 * bits (exponent << mb | mantissa). */
static uint32_t minifloat_rne(float a, int mb, int bias) {
    if (a == 0.0f) return 0;
    int e;
    (void)frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1): floor(log2 a) = e - 1, exactly */
    e -= 1;
    const int emin = 1 - bias;
    if (e < emin) e = emin;
    float scaled = ldexpf(a, mb - e); /* exact power-of-two scaling, in [0, 2^(mb+1)) */
    uint32_t q = (uint32_t)scaled;
    float frac = scaled - (float)q; /* exact */
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) q++;
    if (q == (2u << mb)) { /* rounded up into the next binade */
        q >>= 1;
        e += 1;
    }
    if (q < (1u << mb)) return q; /* subnormal (only when e == emin): exponent field 0 */
    return ((uint32_t)(e + bias) << mb) | (q - (1u << mb));
}

uint8_t nib_f32_to_e4m3(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0x00;
    if (isnan(x)) return (uint8_t)(sign | 0x7F);
    float a = fabsf(x);
    if (a >= NIB_E4M3_MAX) return (uint8_t)(sign | 0x7E); /* saturate, Inf included */
    return (uint8_t)(sign | minifloat_rne(a, 3, 7));
}

float nib_e4m3_to_f32(uint8_t c) {
    uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
    if (e == 0xF && m == 7) return bits_f32(((uint32_t)(c & 0x80) << 24) | 0x7FC00000u);
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8u + m), (int)e - 10);
    return (c & 0x80) ? -v : v;
}

uint8_t nib_f32_to_e5m2(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0x00;
    if (isnan(x)) return (uint8_t)(sign | 0x7E);
    if (isinf(x)) return (uint8_t)(sign | 0x7C);
    float a = fabsf(x);
    if (a >= NIB_E5M2_MAX) return (uint8_t)(sign | 0x7B); /* finite overflow saturates */
    return (uint8_t)(sign | minifloat_rne(a, 2, 15));
}

float nib_e5m2_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80) << 24;
    uint32_t e = (c >> 2) & 0x1Fu, m = c & 3u;
    if (e == 0x1F) return bits_f32(sign | (m ? 0x7FC00000u : 0x7F800000u));
    float v = e == 0 ? ldexpf((float)m, -16) : ldexpf((float)(4u + m), (int)e - 17);
    return sign ? -v : v;
}

float nib_e8m0_to_f32(uint8_t c) {
    if (c == 0xFF) return bits_f32(0x7FC00000u);
    return ldexpf(1.0f, (int)c - 127); /* 2^-127 is an fp32 subnormal: still exact */
}

static const float k_e2m1_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint8_t nib_f32_to_e2m1(float x) {
    if (isnan(x)) return 0x7;
    uint8_t sign = signbit(x) ? 0x8 : 0x0;
    float a = fabsf(x);
    uint8_t c;
    /* midpoints 0.25 0.75 1.25 1.75 2.5 3.5 5: `<=` where the lower code is even, `<` where it
     * is odd, so every tie lands on the even code */
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return (uint8_t)(sign | c);
}

float nib_e2m1_to_f32(uint8_t code) {
    float v = k_e2m1_values[code & 7];
    return (code & 8) ? -v : v;
}

/* ---- shared checks ------------------------------------------------------------------------- */

nib_status nib_fmt_check_dims(int64_t n, int64_t k, int64_t block, const char *what) {
    if (n < 0 || k < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: negative shape [%lld, %lld]", what,
                       (long long)n, (long long)k);
    if (block > 1 && k % block != 0)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: k = %lld is not a multiple of %lld (shape [%lld, %lld])",
                       what, (long long)k, (long long)block, (long long)n, (long long)k);
    uint64_t nk;
    if (nib_mul_overflow_u64((uint64_t)n, (uint64_t)k, &nk) || nk > (uint64_t)INT64_MAX / 4 ||
        nk > SIZE_MAX / 4)
        return NIB_ERR(NIB_ERR_OVERFLOW, "%s: shape [%lld, %lld] is too large", what,
                       (long long)n, (long long)k);
    return NIB_OK;
}

nib_status nib_fmt_check_finite(const float *w, int64_t n, int64_t k, const char *what) {
    for (int64_t r = 0; r < n; r++) {
        const float *row = w + r * k;
        for (int64_t c = 0; c < k; c++)
            if (!isfinite(row[c]))
                return NIB_ERR(NIB_ERR_NUMERICS, "%s: %s at row %lld, col %lld", what,
                               isnan(row[c]) ? "NaN" : (row[c] > 0 ? "+Inf" : "-Inf"),
                               (long long)r, (long long)c);
    }
    return NIB_OK;
}

/* ---- FP8 E4M3 weights ---------------------------------------------------------------------- */

static float fp8_scale_for_amax(float amax) {
    if (amax == 0.0f) return 1.0f;
    float s = amax / NIB_E4M3_MAX;
    return s < FLT_MIN ? FLT_MIN : s;
}

static float amax_of(const float *x, int64_t count) {
    float m = 0.0f;
    for (int64_t i = 0; i < count; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

nib_status nib_fp8_quantize(const float *w, int64_t n, int64_t k, int per_channel, uint8_t *q,
                            float *scales) {
    if (!w || !q || !scales) return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 quantize: NULL argument");
    NIB_RETURN_IF_ERR(nib_fmt_check_dims(n, k, 1, "fp8 quantize"));
    NIB_RETURN_IF_ERR(nib_fmt_check_finite(w, n, k, "fp8 quantize"));
    float tensor_scale = per_channel ? 0.0f : fp8_scale_for_amax(amax_of(w, n * k));
    if (!per_channel) scales[0] = tensor_scale;
    for (int64_t r = 0; r < n; r++) {
        const float *row = w + r * k;
        float s = tensor_scale;
        if (per_channel) scales[r] = s = fp8_scale_for_amax(amax_of(row, k));
        for (int64_t c = 0; c < k; c++) q[r * k + c] = nib_f32_to_e4m3(row[c] / s);
    }
    return NIB_OK;
}

nib_status nib_fp8_dequantize(const uint8_t *q, const float *scales, int64_t n, int64_t k,
                              int per_channel, float *out) {
    if (!q || !scales || !out)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 dequantize: NULL argument");
    NIB_RETURN_IF_ERR(nib_fmt_check_dims(n, k, 1, "fp8 dequantize"));
    for (int64_t r = 0; r < n; r++) {
        float s = scales[per_channel ? r : 0];
        for (int64_t c = 0; c < k; c++) out[r * k + c] = nib_e4m3_to_f32(q[r * k + c]) * s;
    }
    return NIB_OK;
}

/* ---- error metrics ------------------------------------------------------------------------- */

void nib_quant_err_accumulate(const float *ref, const float *got, size_t n, nib_quant_err_terms *t) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(ref[i]) || !isfinite(got[i])) {
            t->bad++;
            continue;
        }
        double a = ref[i], b = got[i], d = a - b;
        t->se += d * d;
        t->rr += a * a;
        t->gg += b * b;
        t->rg += a * b;
        if (fabs(d) > t->mx) t->mx = fabs(d);
    }
}

void nib_quant_err_merge(nib_quant_err_terms *t, const nib_quant_err_terms *add) {
    t->se += add->se, t->rr += add->rr, t->gg += add->gg, t->rg += add->rg, t->bad += add->bad;
    if (add->mx > t->mx) t->mx = add->mx;
}

void nib_quant_err_finish(const nib_quant_err_terms *t, nib_quant_err *out) {
    memset(out, 0, sizeof *out);
    out->n_nonfinite = t->bad;
    if (t->bad) {
        out->nmse = out->rel_l2 = out->cosine = out->max_abs = NAN;
        return;
    }
    out->nmse = t->rr > 0 ? t->se / t->rr : (t->se > 0 ? INFINITY : 0.0);
    out->rel_l2 = sqrt(out->nmse);
    out->cosine = (t->rr > 0 && t->gg > 0) ? t->rg / sqrt(t->rr * t->gg) : (t->rr == 0 && t->gg == 0 ? 1.0 : 0.0);
    out->max_abs = t->mx;
}

nib_status nib_quant_error(const float *ref, const float *got, size_t n, nib_quant_err *out) {
    if (!out || (n && (!ref || !got)))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "quant error: NULL argument");
    nib_quant_err_terms t;
    memset(&t, 0, sizeof t);
    nib_quant_err_accumulate(ref, got, n, &t);
    nib_quant_err_finish(&t, out);
    return NIB_OK;
}
