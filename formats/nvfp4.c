/* nvfp4.c — NVFP4 reference quantizer/dequantizer (ModelOpt semantics).
 *   packed u8 [n][k/2]   E2M1 codes, element 2i in the low nibble
 *   scales u8 [n][k/16]  E4M3 block scales (linear row-major, not swizzled)
 *   global fp32          per-tensor scale, multiplied in (ModelOpt `weight_scale_2`)
 * value = e2m1 * e4m3 * global. See formats.h for the exact rules. */
#include <math.h>

#include "formats/formats.h"

float nib_nvfp4_global_for_amax(float amax) {
    if (!(amax > 0.0f)) return 1.0f; /* all-zero tensor: any positive global works; 1.0 */
    float g = amax / (6.0f * NIB_E4M3_MAX); /* 6 * 448 = 2688 exactly */
    return g < NIB_NVFP4_GLOBAL_MIN ? NIB_NVFP4_GLOBAL_MIN : g;
}

uint8_t nib_nvfp4_block_scale(float block_amax, float global) {
    float s = block_amax / (6.0f * global);
    if (s == 0.0f) s = 1.0f; /* all-zero block (ModelOpt: zeros replaced by 1.0 before clamp) */
    if (s < 0x1p-9f) s = 0x1p-9f; /* smallest E4M3 subnormal: tiny blocks never get scale 0 */
    if (s > NIB_E4M3_MAX) s = NIB_E4M3_MAX;
    return nib_f32_to_e4m3(s);
}

/* w, packed, scales checked; dims checked; global validated. */
static void nvfp4_quantize_rows(const float *w, int64_t n, int64_t k, uint8_t *packed,
                                uint8_t *scales, float global) {
    const int64_t nb = k / NIB_NVFP4_BLOCK;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *x = w + r * k + b * NIB_NVFP4_BLOCK;
            float amax = 0.0f;
            for (int i = 0; i < NIB_NVFP4_BLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
            uint8_t sc = nib_nvfp4_block_scale(amax, global);
            scales[r * nb + b] = sc;
            /* one fp32 product, then one fp32 quotient per element: x / (scale * global) */
            float denom = nib_e4m3_to_f32(sc) * global;
            uint8_t *qs = packed + r * (k / 2) + b * (int64_t)sizeof(nib_nvfp4_block16);
            for (int i = 0; i < NIB_NVFP4_BLOCK / 2; i++) {
                uint8_t lo = nib_f32_to_e2m1(x[2 * i] / denom);
                uint8_t hi = nib_f32_to_e2m1(x[2 * i + 1] / denom);
                qs[i] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
}

nib_status nib_nvfp4_quantize_global(const float *w, int64_t n, int64_t k, uint8_t *packed,
                                     uint8_t *scales, float global) {
    if (!w || !packed || !scales)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "nvfp4 quantize: NULL argument");
    if (!isfinite(global) || !(global >= NIB_NVFP4_GLOBAL_MIN))
        return NIB_ERR(NIB_ERR_INVALID_ARG,
                       "nvfp4 quantize: global scale %g must be finite and >= 2^-117", global);
    NIB_RETURN_IF_ERR(nib_fmt_check_dims(n, k, NIB_NVFP4_BLOCK, "nvfp4 quantize"));
    NIB_RETURN_IF_ERR(nib_fmt_check_finite(w, n, k, "nvfp4 quantize"));
    nvfp4_quantize_rows(w, n, k, packed, scales, global);
    return NIB_OK;
}

nib_status nib_nvfp4_quantize(const float *w, int64_t n, int64_t k, uint8_t *packed,
                              uint8_t *scales, float *global) {
    if (!w || !packed || !scales || !global)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "nvfp4 quantize: NULL argument");
    NIB_RETURN_IF_ERR(nib_fmt_check_dims(n, k, NIB_NVFP4_BLOCK, "nvfp4 quantize"));
    NIB_RETURN_IF_ERR(nib_fmt_check_finite(w, n, k, "nvfp4 quantize"));
    float amax = 0.0f;
    for (int64_t i = 0; i < n * k; i++) amax = fmaxf(amax, fabsf(w[i]));
    float g = nib_nvfp4_global_for_amax(amax);
    nvfp4_quantize_rows(w, n, k, packed, scales, g);
    *global = g;
    return NIB_OK;
}

nib_status nib_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, float global,
                                int64_t n, int64_t k, float *out) {
    if (!packed || !scales || !out)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "nvfp4 dequantize: NULL argument");
    NIB_RETURN_IF_ERR(nib_fmt_check_dims(n, k, NIB_NVFP4_BLOCK, "nvfp4 dequantize"));
    const int64_t nb = k / NIB_NVFP4_BLOCK;
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *row = packed + r * (k / 2);
        for (int64_t c = 0; c < k; c++) {
            float s = nib_e4m3_to_f32(scales[r * nb + c / NIB_NVFP4_BLOCK]);
            /* e2m1 * e4m3 is exact (<= 6 significant bits); one rounding when * global */
            out[r * k + c] = (nib_e2m1_to_f32(nib_u4_get(row, c)) * s) * global;
        }
    }
    return NIB_OK;
}
