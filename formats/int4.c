/* int4.c — INT4 weight-only groups (symmetric / asymmetric, fp16 scales, optional act-order
 * permutation): quantizer, dequantizer, GPTQ v1 and AWQ (GEMM) importers, GPTQ exporter.
 * Canonical layout in formats.h. */
#include <math.h>
#include <string.h>

#include "formats/formats.h"

/* Symmetric scale = amax / NIB_INT4_SYM_DIV (see docs/formats.md for the measurement that
 * picked it): the negative end -8 * scale reaches -amax exactly, the positive end 7 * scale
 * saturates the few elements above 7/8 amax. */
#define NIB_INT4_SYM_DIV 8.0f
#define FP16_ONE 0x3C00u

static int int4_group_ok(int g) { return g == 32 || g == 64 || g == 128; }

/* Round to nearest, ties to even, for finite or infinite v; results are clamped to [-64, 64]
 * (far outside every code range; callers clamp again to theirs). */
static int rne_int(float v) {
    if (v >= 64.0f) return 64;
    if (v <= -64.0f) return -64;
    float f = floorf(v);
    float d = v - f; /* exact for |v| < 2^23 */
    int i = (int)f;
    if (d > 0.5f || (d == 0.5f && (i & 1))) i++;
    return i;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

static int f16_is_finite(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }

void nib_int4_free(nib_int4_weight *w) {
    if (!w) return;
    nib_free(w->packed);
    nib_free(w->scales);
    nib_free(w->zeros);
    nib_free(w->perm);
    memset(w, 0, sizeof *w);
}

static nib_status int4_check_shape(int64_t n, int64_t k, int group, const char *what) {
    if (!int4_group_ok(group))
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: group size %d is not one of 32, 64, 128", what,
                       group);
    return nib_fmt_check_dims(n, k, group, what);
}

nib_status nib_int4_alloc(nib_int4_weight *w, int64_t n, int64_t k, int group, int asym,
                          int with_perm) {
    nib_status st = NIB_OK;
    if (!w) return NIB_ERR(NIB_ERR_INVALID_ARG, "int4 alloc: NULL weight");
    memset(w, 0, sizeof *w);
    NIB_TRY(int4_check_shape(n, k, group, "int4 alloc"));
    const size_t nk = (size_t)n * (size_t)k, ng = (size_t)n * (size_t)(k / group);
    w->n = n;
    w->k = k;
    w->group = group;
    w->asym = asym ? 1 : 0;
    st = NIB_ERR_OUT_OF_MEMORY;
    if (!(w->packed = nib_calloc(nk / 2, 1))) goto fail;
    if (!(w->scales = nib_calloc(ng, sizeof *w->scales))) goto fail;
    if (asym && !(w->zeros = nib_calloc(ng, 1))) goto fail;
    if (with_perm) {
        if (!(w->perm = nib_calloc((size_t)k, sizeof *w->perm))) goto fail;
        for (int64_t j = 0; j < k; j++) w->perm[j] = (int32_t)j;
    }
    return NIB_OK;
fail:
    nib_int4_free(w);
    return st;
}

/* perm[k] must be a permutation of 0..k-1. */
static nib_status check_perm(const int32_t *perm, int64_t k, const char *what) {
    nib_status st = NIB_OK;
    uint8_t *seen = nib_calloc((size_t)k, 1);
    if (!seen) return NIB_ERR_OUT_OF_MEMORY;
    for (int64_t j = 0; j < k; j++) {
        if (perm[j] < 0 || perm[j] >= k) {
            st = NIB_ERR(NIB_ERR_INVALID_ARG, "%s: perm[%lld] = %d is outside [0, %lld)", what,
                         (long long)j, (int)perm[j], (long long)k);
            goto fail;
        }
        if (seen[perm[j]]++) {
            st = NIB_ERR(NIB_ERR_INVALID_ARG, "%s: perm[%lld] = %d repeats an earlier entry",
                         what, (long long)j, (int)perm[j]);
            goto fail;
        }
    }
fail:
    nib_free(seen);
    return st;
}

/* Turns an fp32 scale into the stored fp16 bits: 0 -> 1.0, overflow -> error. */
static nib_status int4_scale_bits(float t, int64_t row, int64_t grp, uint16_t *out) {
    uint16_t h = nib_f32_to_f16(t);
    if (!f16_is_finite(h))
        return NIB_ERR(NIB_ERR_NUMERICS,
                       "int4 quantize: group scale %g overflows fp16 (row %lld, group %lld)", t,
                       (long long)row, (long long)grp);
    if ((h & 0x7FFFu) == 0) h = FP16_ONE; /* all-zero group (or below fp16's range) */
    *out = h;
    return NIB_OK;
}

/* One group of g values x (in stored order) -> codes, scale bits, zero point. */
static nib_status int4_quantize_group(const float *x, int g, int asym, int64_t row, int64_t grp,
                                      uint8_t *codes, uint16_t *scale, uint8_t *zero) {
    if (!asym) {
        float amax = 0.0f;
        for (int i = 0; i < g; i++) amax = fmaxf(amax, fabsf(x[i]));
        NIB_RETURN_IF_ERR(int4_scale_bits(amax / NIB_INT4_SYM_DIV, row, grp, scale));
        float s = nib_f16_to_f32(*scale);
        for (int i = 0; i < g; i++) codes[i] = (uint8_t)(clampi(rne_int(x[i] / s), -8, 7) + 8);
        *zero = 8;
        return NIB_OK;
    }
    float lo = 0.0f, hi = 0.0f; /* the range always contains 0, so the zero point is a code */
    for (int i = 0; i < g; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    NIB_RETURN_IF_ERR(int4_scale_bits((hi - lo) / 15.0f, row, grp, scale));
    float s = nib_f16_to_f32(*scale);
    int z = clampi(rne_int(-lo / s), 0, 15);
    for (int i = 0; i < g; i++) codes[i] = (uint8_t)clampi(rne_int(x[i] / s) + z, 0, 15);
    *zero = (uint8_t)z;
    return NIB_OK;
}

nib_status nib_int4_quantize(const float *w, int64_t n, int64_t k, int group, int asym,
                             const int32_t *perm, nib_int4_weight *out) {
    nib_status st = NIB_OK;
    float x[128];
    uint8_t codes[128];
    if (!out) return NIB_ERR(NIB_ERR_INVALID_ARG, "int4 quantize: NULL output");
    memset(out, 0, sizeof *out);
    if (!w) return NIB_ERR(NIB_ERR_INVALID_ARG, "int4 quantize: NULL weight");
    NIB_RETURN_IF_ERR(int4_check_shape(n, k, group, "int4 quantize"));
    NIB_RETURN_IF_ERR(nib_fmt_check_finite(w, n, k, "int4 quantize"));
    if (perm) NIB_RETURN_IF_ERR(check_perm(perm, k, "int4 quantize"));
    NIB_TRY(nib_int4_alloc(out, n, k, group, asym, perm != NULL));
    if (perm) memcpy(out->perm, perm, (size_t)k * sizeof *perm);
    const int64_t ng = k / group;
    for (int64_t r = 0; r < n; r++) {
        const float *row = w + r * k;
        uint8_t *prow = out->packed + r * (k / 2);
        for (int64_t gi = 0; gi < ng; gi++) {
            for (int i = 0; i < group; i++) {
                int64_t j = gi * group + i;
                x[i] = row[perm ? perm[j] : j];
            }
            uint8_t z;
            NIB_TRY(int4_quantize_group(x, group, asym, r, gi, codes, &out->scales[r * ng + gi],
                                        &z));
            if (asym) out->zeros[r * ng + gi] = z;
            for (int i = 0; i < group; i++) nib_u4_set(prow, gi * group + i, codes[i]);
        }
    }
    return NIB_OK;
fail:
    nib_int4_free(out);
    return st;
}

static nib_status int4_check_weight(const nib_int4_weight *w, const char *what) {
    if (!w || !w->packed || !w->scales || (w->asym && !w->zeros))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: incomplete INT4 weight", what);
    NIB_RETURN_IF_ERR(int4_check_shape(w->n, w->k, w->group, what));
    if (w->perm) NIB_RETURN_IF_ERR(check_perm(w->perm, w->k, what));
    return NIB_OK;
}

nib_status nib_int4_dequantize(const nib_int4_weight *w, float *out) {
    if (!out) return NIB_ERR(NIB_ERR_INVALID_ARG, "int4 dequantize: NULL output");
    NIB_RETURN_IF_ERR(int4_check_weight(w, "int4 dequantize"));
    const int64_t k = w->k, ng = k / w->group;
    for (int64_t r = 0; r < w->n; r++) {
        const uint8_t *prow = w->packed + r * (k / 2);
        for (int64_t j = 0; j < k; j++) {
            int64_t gi = j / w->group;
            int z = w->asym ? w->zeros[r * ng + gi] : 8;
            float s = nib_f16_to_f32(w->scales[r * ng + gi]);
            /* (q - z) has <= 5 significant bits, s 11: the product is exact */
            out[r * k + (w->perm ? w->perm[j] : j)] = (float)((int)nib_u4_get(prow, j) - z) * s;
        }
    }
    return NIB_OK;
}

/* ---- checkpoint importers / exporter ------------------------------------------------------- */

static inline unsigned nibble32(int32_t word, int i) {
    return ((uint32_t)word >> (4 * i)) & 0xFu;
}

/* Shared shape checks of the GPTQ/AWQ layouts. */
static nib_status ckpt_check(const char *what, int64_t n, int64_t k, int group) {
    if (n < 0 || k < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: negative shape [%lld, %lld]", what,
                       (long long)n, (long long)k);
    if (!int4_group_ok(group))
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: group size %d is not one of 32, 64, 128", what,
                       group);
    if (k % group != 0)
        return NIB_ERR(NIB_ERR_UNSUPPORTED,
                       "%s: k = %lld is not a multiple of the group size %d (a short last group "
                       "is not supported)", what, (long long)k, group);
    if (n % 8 != 0)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: n = %lld is not a multiple of 8 (zeros pack 8 per "
                       "int32)", what, (long long)n);
    return nib_fmt_check_dims(n, k, 8, what);
}

static nib_status ckpt_check_scales(const char *what, const uint16_t *scales, int64_t ng,
                                    int64_t n) {
    for (int64_t gi = 0; gi < ng; gi++)
        for (int64_t c = 0; c < n; c++)
            if (!f16_is_finite(scales[gi * n + c]))
                return NIB_ERR(NIB_ERR_NUMERICS, "%s: scale of group %lld, column %lld is %s",
                               what, (long long)gi, (long long)c,
                               (scales[gi * n + c] & 0x3FFu) ? "NaN" : "Inf");
    return NIB_OK;
}

nib_status nib_int4_from_gptq(const int32_t *qweight, const int32_t *qzeros,
                              const uint16_t *scales, const int32_t *g_idx, int64_t n, int64_t k,
                              int group, nib_int4_weight *out) {
    static const char *what = "gptq import";
    nib_status st = NIB_OK;
    int64_t *next = NULL; /* act-order: next stored column of each group */
    if (!out) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL output", what);
    memset(out, 0, sizeof *out);
    if (!qweight || !qzeros || !scales)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL tensor", what);
    NIB_RETURN_IF_ERR(ckpt_check(what, n, k, group));
    const int64_t ng = k / group, n8 = n / 8;
    NIB_RETURN_IF_ERR(ckpt_check_scales(what, scales, ng, n));
    int act = 0;
    if (g_idx) {
        for (int64_t i = 0; i < k; i++) {
            if (g_idx[i] < 0 || g_idx[i] >= ng)
                return NIB_ERR(NIB_ERR_FORMAT, "%s: g_idx[%lld] = %d is outside [0, %lld)", what,
                               (long long)i, (int)g_idx[i], (long long)ng);
            if (g_idx[i] != i / group) act = 1;
        }
    }
    int sym = 1; /* v1 stores zero - 1; (stored + 1) mod 16 is the zero point */
    for (int64_t gi = 0; gi < ng && sym; gi++)
        for (int64_t c = 0; c < n; c++)
            if (((nibble32(qzeros[gi * n8 + c / 8], (int)(c % 8)) + 1u) & 0xFu) != 8u) {
                sym = 0;
                break;
            }
    NIB_TRY(nib_int4_alloc(out, n, k, group, !sym, act));
    if (act) {
        /* stable counting sort of input channels by g_idx; each group must get `group` */
        next = nib_calloc((size_t)ng, sizeof *next);
        if (!next) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        for (int64_t i = 0; i < k; i++) next[g_idx[i]]++;
        for (int64_t gi = 0; gi < ng; gi++)
            if (next[gi] != group) {
                st = NIB_ERR(NIB_ERR_FORMAT,
                             "%s: act-order group %lld has %lld input channels in g_idx, want %d",
                             what, (long long)gi, (long long)next[gi], group);
                goto fail;
            }
        for (int64_t gi = 0; gi < ng; gi++) next[gi] = gi * group;
        for (int64_t i = 0; i < k; i++) out->perm[next[g_idx[i]]++] = (int32_t)i;
    }
    for (int64_t r = 0; r < n; r++) {
        uint8_t *prow = out->packed + r * (k / 2);
        for (int64_t j = 0; j < k; j++) {
            int64_t ch = act ? out->perm[j] : j;
            nib_u4_set(prow, j, (uint8_t)nibble32(qweight[(ch / 8) * n + r], (int)(ch % 8)));
        }
        for (int64_t gi = 0; gi < ng; gi++) {
            out->scales[r * ng + gi] = scales[gi * n + r];
            if (!sym)
                out->zeros[r * ng + gi] =
                    (uint8_t)((nibble32(qzeros[gi * n8 + r / 8], (int)(r % 8)) + 1u) & 0xFu);
        }
    }
    nib_free(next);
    return NIB_OK;
fail:
    nib_free(next);
    nib_int4_free(out);
    return st;
}

nib_status nib_int4_to_gptq(const nib_int4_weight *w, int32_t *qweight, int32_t *qzeros,
                            uint16_t *scales, int32_t *g_idx) {
    static const char *what = "gptq export";
    if (!qweight || !qzeros || !scales || !g_idx)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL output tensor", what);
    NIB_RETURN_IF_ERR(int4_check_weight(w, what));
    NIB_RETURN_IF_ERR(ckpt_check(what, w->n, w->k, w->group));
    const int64_t n = w->n, k = w->k, ng = k / w->group, n8 = n / 8;
    /* int32 and uint32 may alias: build the words unsigned */
    uint32_t *qw = (uint32_t *)qweight, *qz = (uint32_t *)qzeros;
    memset(qw, 0, (size_t)(k / 8) * (size_t)n * sizeof *qw);
    memset(qz, 0, (size_t)ng * (size_t)n8 * sizeof *qz);
    for (int64_t j = 0; j < k; j++) g_idx[w->perm ? w->perm[j] : j] = (int32_t)(j / w->group);
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *prow = w->packed + r * (k / 2);
        for (int64_t j = 0; j < k; j++) {
            int64_t ch = w->perm ? w->perm[j] : j;
            qw[(ch / 8) * n + r] |= (uint32_t)nib_u4_get(prow, j) << (4 * (ch % 8));
        }
        for (int64_t gi = 0; gi < ng; gi++) {
            scales[gi * n + r] = w->scales[r * ng + gi];
            unsigned z = w->asym ? w->zeros[r * ng + gi] : 8u;
            qz[gi * n8 + r / 8] |= (uint32_t)((z - 1u) & 0xFu) << (4 * (r % 8));
        }
    }
    return NIB_OK;
}

/* AWQ packs 8 columns per int32 as nibble i = column order[i], order = {0,2,4,6,1,3,5,7};
 * column p of a word therefore sits in nibble k_awq_nibble[p]. */
static const int k_awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

nib_status nib_int4_from_awq(const int32_t *qweight, const int32_t *qzeros,
                             const uint16_t *scales, int64_t n, int64_t k, int group,
                             nib_int4_weight *out) {
    static const char *what = "awq import";
    nib_status st = NIB_OK;
    if (!out) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL output", what);
    memset(out, 0, sizeof *out);
    if (!qweight || !qzeros || !scales)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL tensor", what);
    NIB_RETURN_IF_ERR(ckpt_check(what, n, k, group));
    const int64_t ng = k / group, n8 = n / 8;
    NIB_RETURN_IF_ERR(ckpt_check_scales(what, scales, ng, n));
    int sym = 1;
    for (int64_t gi = 0; gi < ng && sym; gi++)
        for (int64_t c = 0; c < n; c++)
            if (nibble32(qzeros[gi * n8 + c / 8], k_awq_nibble[c % 8]) != 8u) {
                sym = 0;
                break;
            }
    NIB_TRY(nib_int4_alloc(out, n, k, group, !sym, 0));
    for (int64_t r = 0; r < n; r++) {
        uint8_t *prow = out->packed + r * (k / 2);
        const int nib = k_awq_nibble[r % 8];
        for (int64_t j = 0; j < k; j++)
            nib_u4_set(prow, j, (uint8_t)nibble32(qweight[j * n8 + r / 8], nib));
        for (int64_t gi = 0; gi < ng; gi++) {
            out->scales[r * ng + gi] = scales[gi * n + r];
            if (!sym) out->zeros[r * ng + gi] = (uint8_t)nibble32(qzeros[gi * n8 + r / 8], nib);
        }
    }
    return NIB_OK;
fail:
    nib_int4_free(out);
    return st;
}
