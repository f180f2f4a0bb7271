/* gemm.c — backend-independent parts of the weight GEMM: format names, validation of a
 * weight description, canonical byte counts and exact dequantization (the spec both the
 * reference GEMM and the GPU tests use). */
#include <math.h>
#include <string.h>

#include "formats/formats.h"
#include "ops/gemm.h"

static const char *const k_wfmt_names[NIB_WFMT_COUNT] = {"bf16", "fp8", "nvfp4", "mxfp4", "int4"};

const char *nib_wfmt_name(nib_wfmt f) {
    return (unsigned)f < NIB_WFMT_COUNT ? k_wfmt_names[f] : "invalid";
}

nib_wfmt nib_wfmt_from_name(const char *s) {
    for (int i = 0; i < NIB_WFMT_COUNT; i++)
        if (s && !strcmp(s, k_wfmt_names[i])) return (nib_wfmt)i;
    return NIB_WFMT_COUNT;
}

nib_status nib_wsrc_validate(const nib_wsrc *w, const char *name) {
    if (!name) name = "weight";
    if (!w) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL weight", name);
    if ((unsigned)w->fmt >= NIB_WFMT_COUNT)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: unknown weight format %d", name, (int)w->fmt);
    if (w->n < 1 || w->k < 1 || w->n > INT32_MAX / 2 || w->k > INT32_MAX / 2)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: shape [%lld, %lld] out of range", name, (long long)w->n,
                       (long long)w->k);
    if (!w->data) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: no element data", name);
    if (w->fmt != NIB_WFMT_BF16 && !w->scales)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: %s weight without scales", name, nib_wfmt_name(w->fmt));
    int blk = 1;
    switch (w->fmt) {
    case NIB_WFMT_NVFP4: blk = 16; break;
    case NIB_WFMT_MXFP4: blk = 32; break;
    case NIB_WFMT_INT4:
        if (w->group != 32 && w->group != 64 && w->group != 128)
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: INT4 group size %d (supported: 32, 64, 128)", name, w->group);
        blk = w->group;
        break;
    case NIB_WFMT_FP8: blk = 16; break;
    default: blk = 8; break;
    }
    if (w->k % blk)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: K = %lld is not a multiple of the %s block of %d", name,
                       (long long)w->k, nib_wfmt_name(w->fmt), blk);
    if (w->fmt == NIB_WFMT_NVFP4 && !(w->global_scale > 0.f && isfinite(w->global_scale)))
        return NIB_ERR(NIB_ERR_NUMERICS, "%s: NVFP4 global scale %g is not a positive finite number", name,
                       (double)w->global_scale);
    if (w->perm) {
        if (w->fmt != NIB_WFMT_INT4)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: a column permutation is only defined for INT4", name);
        /* must be a permutation of 0..k-1 */
        uint8_t *seen = nib_calloc((size_t)w->k, 1);
        if (!seen) return NIB_ERR_OUT_OF_MEMORY;
        nib_status st = NIB_OK;
        for (int64_t j = 0; j < w->k; j++) {
            int32_t c = w->perm[j];
            if (c < 0 || c >= w->k || seen[c]) {
                st = NIB_ERR(NIB_ERR_FORMAT, "%s: act-order permutation entry %lld = %d is not a permutation of 0..%lld",
                             name, (long long)j, c, (long long)w->k - 1);
                break;
            }
            seen[c] = 1;
        }
        nib_free(seen);
        if (st) return st;
    }
    return NIB_OK;
}

uint64_t nib_wsrc_bytes(const nib_wsrc *w) {
    uint64_t nk = (uint64_t)w->n * (uint64_t)w->k;
    switch (w->fmt) {
    case NIB_WFMT_BF16: return nk * 2;
    case NIB_WFMT_FP8: return nk + 4ull * (w->fp8_per_channel ? (uint64_t)w->n : 1);
    case NIB_WFMT_NVFP4: return nk / 2 + nk / 16 + 4;
    case NIB_WFMT_MXFP4: return nk / 2 + nk / 32;
    case NIB_WFMT_INT4: return nk / 2 + nk / w->group * 2 + (w->zeros ? nk / w->group : 0);
    default: return 0;
    }
}

/* One dequantized row in fp64 (exact for every format), original column order. */
static void dequant_row(const nib_wsrc *w, int64_t row, double *out) {
    const int64_t k = w->k;
    const uint8_t *d8 = (const uint8_t *)w->data;
    switch (w->fmt) {
    case NIB_WFMT_BF16: {
        const uint16_t *d = (const uint16_t *)w->data + row * k;
        for (int64_t j = 0; j < k; j++) out[j] = nib_bf16_to_f32(d[j]);
        break;
    }
    case NIB_WFMT_FP8: {
        const float *s = (const float *)w->scales;
        double sc = s[w->fp8_per_channel ? row : 0];
        for (int64_t j = 0; j < k; j++) out[j] = (double)nib_e4m3_to_f32(d8[row * k + j]) * sc;
        break;
    }
    case NIB_WFMT_NVFP4:
    case NIB_WFMT_MXFP4: {
        const uint8_t *s = (const uint8_t *)w->scales;
        int blk = w->fmt == NIB_WFMT_NVFP4 ? 16 : 32;
        for (int64_t j = 0; j < k; j++) {
            uint8_t b = d8[row * (k / 2) + j / 2];
            uint8_t code = (j & 1) ? (b >> 4) : (b & 15);
            uint8_t sc = s[row * (k / blk) + j / blk];
            double scale = w->fmt == NIB_WFMT_NVFP4 ? (double)nib_e4m3_to_f32(sc) * (double)w->global_scale
                                                    : (double)nib_e8m0_to_f32(sc);
            out[j] = (double)nib_e2m1_to_f32(code) * scale;
        }
        break;
    }
    case NIB_WFMT_INT4: {
        const uint16_t *s = (const uint16_t *)w->scales;
        const int64_t gpr = k / w->group;
        for (int64_t j = 0; j < k; j++) {
            uint8_t b = d8[row * (k / 2) + j / 2];
            int code = (j & 1) ? (b >> 4) : (b & 15);
            int64_t gi = row * gpr + j / w->group;
            int z = w->zeros ? w->zeros[gi] : 8;
            int64_t col = w->perm ? w->perm[j] : j;
            out[col] = (double)(code - z) * (double)nib_f16_to_f32(s[gi]);
        }
        break;
    }
    default: break;
    }
}

nib_status nib_wsrc_dequantize(const nib_wsrc *w, float *out) {
    NIB_RETURN_IF_ERR(nib_wsrc_validate(w, "dequantize"));
    double *row = nib_malloc((size_t)w->k * sizeof(double));
    if (!row) return NIB_ERR_OUT_OF_MEMORY;
    for (int64_t r = 0; r < w->n; r++) {
        dequant_row(w, r, row);
        for (int64_t j = 0; j < w->k; j++) out[r * w->k + j] = (float)row[j];
    }
    nib_free(row);
    return NIB_OK;
}

void nib_wsrc_dequant_row64(const nib_wsrc *w, int64_t row, double *out) { dequant_row(w, row, out); }
