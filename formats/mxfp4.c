/* mxfp4.c — MXFP4 (OCP Microscaling v1.0) reference quantizer/dequantizer.
 *   packed u8 [n][k/2]   E2M1 codes, element 2i in the low nibble (gpt-oss `*.blocks`)
 *   scales u8 [n][k/32]  E8M0 shared exponents, value 2^(s-127) (gpt-oss `*.scales`)
 * value = e2m1 * 2^(s - 127). The exponent rule is selectable (formats.h). */
#include <math.h>

#include "formats/formats.h"

const char *nib_mxfp4_rule_name(nib_mxfp4_rule r) {
    switch (r) {
    case NIB_MXFP4_SCALE_FLOOR: return "floor";
    case NIB_MXFP4_SCALE_CEIL: return "ceil";
    case NIB_MXFP4_SCALE_ROUND: return "round";
    default: return "invalid";
    }
}

uint8_t nib_mxfp4_block_scale(float block_amax, nib_mxfp4_rule rule) {
    if (!(block_amax > 0.0f)) return 0; /* all-zero block: e = -127 */
    int e;
    (void)frexpf(block_amax, &e); /* floor(log2 amax) = e - 1, exact (no log2f rounding) */
    e = e - 1 - 2;                  /* - emax of E2M1 (6 = 1.5 * 2^2) */
    float r = ldexpf(block_amax, -e); /* amax / 2^e in [4, 8), exact */
    if (rule == NIB_MXFP4_SCALE_CEIL && r > NIB_E2M1_MAX) e += 1;
    else if (rule == NIB_MXFP4_SCALE_ROUND && r >= 7.0f) e += 1;
    if (e < -127) e = -127;
    if (e > 127) e = 127; /* unreachable for finite fp32 input (amax < 2^128) */
    return (uint8_t)(e + 127);
}

nib_status nib_mxfp4_quantize(const float *w, int64_t n, int64_t k, nib_mxfp4_rule rule,
                              uint8_t *packed, uint8_t *scales) {
    if (!w || !packed || !scales)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "mxfp4 quantize: NULL argument");
    if ((unsigned)rule >= NIB_MXFP4_RULE_COUNT)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "mxfp4 quantize: unknown scale rule %d", (int)rule);
    NIB_RETURN_IF_ERR(nib_fmt_check_dims(n, k, NIB_MXFP4_BLOCK, "mxfp4 quantize"));
    NIB_RETURN_IF_ERR(nib_fmt_check_finite(w, n, k, "mxfp4 quantize"));
    const int64_t nb = k / NIB_MXFP4_BLOCK;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *x = w + r * k + b * NIB_MXFP4_BLOCK;
            float amax = 0.0f;
            for (int i = 0; i < NIB_MXFP4_BLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
            uint8_t sc = nib_mxfp4_block_scale(amax, rule);
            scales[r * nb + b] = sc;
            int e = (int)sc - 127;
            uint8_t *qs = packed + r * (k / 2) + b * (int64_t)sizeof(nib_mxfp4_block32);
            for (int i = 0; i < NIB_MXFP4_BLOCK / 2; i++) {
                /* x * 2^-e is exact whenever the result can round to a non-zero code */
                uint8_t lo = nib_f32_to_e2m1(ldexpf(x[2 * i], -e));
                uint8_t hi = nib_f32_to_e2m1(ldexpf(x[2 * i + 1], -e));
                qs[i] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
    return NIB_OK;
}

nib_status nib_mxfp4_dequantize(const uint8_t *packed, const uint8_t *scales, int64_t n,
                                int64_t k, float *out) {
    if (!packed || !scales || !out)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "mxfp4 dequantize: NULL argument");
    NIB_RETURN_IF_ERR(nib_fmt_check_dims(n, k, NIB_MXFP4_BLOCK, "mxfp4 dequantize"));
    const int64_t nb = k / NIB_MXFP4_BLOCK;
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *row = packed + r * (k / 2);
        for (int64_t c = 0; c < k; c++) {
            uint8_t sc = scales[r * nb + c / NIB_MXFP4_BLOCK];
            float v = nib_e2m1_to_f32(nib_u4_get(row, c));
            /* exact: a power-of-two scaling of a 2-significant-bit value (subnormals included) */
            out[r * k + c] = sc == 0xFF ? nib_e8m0_to_f32(sc) : ldexpf(v, (int)sc - 127);
        }
    }
    return NIB_OK;
}
