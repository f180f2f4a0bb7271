/* norm.c — reference RMSNorm / LayerNorm / adaRMSNorm with fused residual add and FP8 output
 * (host float activations): the spec of ops/norm.h, line by line. Also the argument checks
 * both backends share, and the CUDA entry point's stub for CPU-only builds. */
#include <math.h>
#include <string.h>

#include "formats/formats.h"
#include "ops/norm.h"

static const char *kind_name(nib_norm_kind k) {
    switch (k) {
    case NIB_NORM_RMS: return "rms";
    case NIB_NORM_LAYER: return "layer";
    case NIB_NORM_ADARMS: return "adarms";
    default: return "invalid";
    }
}

nib_status nib_norm_validate(const nib_norm_args *a, const char *who) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL args", who);
    if ((unsigned)a->kind >= NIB_NORM_KIND_COUNT)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: kind %d is not a nib_norm_kind", who, (int)a->kind);
    const char *k = kind_name(a->kind);
    if (a->rows < 0 || a->rows > INT32_MAX)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): rows %lld outside [0, 2^31)", who, k, (long long)a->rows);
    if (a->dim < 8 || a->dim > NIB_NORM_MAX_DIM || a->dim % 8)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): dim %lld must be a multiple of 8 in [8, %d]", who, k,
                       (long long)a->dim, NIB_NORM_MAX_DIM);
    if (!(a->eps > 0.0f) || !isfinite(a->eps))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (%s): eps %g must be finite and > 0 (Pi0.5: 1e-6)", who, k,
                       (double)a->eps);
    if (!a->x) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (%s): x is NULL", who, k);
    if (a->ldx < a->dim)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): ldx %lld < dim %lld", who, k, (long long)a->ldx, (long long)a->dim);
    if (a->residual && a->ldr < a->dim)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): ldr %lld < dim %lld", who, k, (long long)a->ldr, (long long)a->dim);
    if (a->h_out && !a->residual)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (%s): h_out given without a residual (h = x + residual)", who, k);
    if (a->res_gate && !a->residual)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (%s): res_gate given without a residual (h = x * g + residual)", who, k);
    if (a->h_out && a->ldh < a->dim)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): ldh %lld < dim %lld", who, k, (long long)a->ldh, (long long)a->dim);
    if (!a->y && !a->y_q)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (%s): no output (y and y_q are both NULL)", who, k);
    if (a->y && a->ldy < a->dim)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): ldy %lld < dim %lld", who, k, (long long)a->ldy, (long long)a->dim);
    if (a->y_q && !a->y_scale)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (%s): y_q given without y_scale", who, k);
    if (a->y_q && a->ldq < a->dim)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): ldq %lld < dim %lld", who, k, (long long)a->ldq, (long long)a->dim);
    switch (a->kind) {
    case NIB_NORM_RMS:
        if (a->b || a->scale || a->shift)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (rms): b/scale/shift given (only w is used by RMSNorm)", who);
        break;
    case NIB_NORM_LAYER:
        if (a->scale || a->shift)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (layer): scale/shift given (LayerNorm uses w and b)", who);
        break;
    default:
        if (!a->scale || !a->shift)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (adarms): scale and shift [dim] are required", who);
        if (a->w || a->b)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (adarms): w/b given (adaRMS has only scale and shift)", who);
        break;
    }
    return NIB_OK;
}

static int64_t clamp_valid(int64_t rows, const int32_t *n_valid) {
    if (!n_valid) return rows;
    int64_t v = *n_valid;
    return v < 0 ? 0 : (v > rows ? rows : v);
}

nib_status nib_ref_norm(const nib_norm_args *a) {
    nib_status st = NIB_OK;
    float *h = NULL, *y = NULL;
    NIB_RETURN_IF_ERR(nib_norm_validate(a, "norm (ref)"));
    const int64_t dim = a->dim, rows = clamp_valid(a->rows, a->n_valid);
    h = nib_malloc((size_t)dim * sizeof(float));
    y = nib_malloc((size_t)dim * sizeof(float));
    if (!h || !y) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *x = (const float *)a->x + r * a->ldx;
        /* h: computed into a row buffer first (the destination may alias x), stored, and the
         * norm reads the stored values (in the reference the stored dtype is float) */
        if (a->residual) {
            float *res = (float *)a->residual + r * a->ldr;
            float *dst = a->h_out ? (float *)a->h_out + r * a->ldh : res;
            if (a->res_gate)
                for (int64_t d = 0; d < dim; d++) {
                    const float t = x[d] * a->res_gate[d]; /* rounded, then added (ISO C: no contraction) */
                    h[d] = t + res[d];
                }
            else
                for (int64_t d = 0; d < dim; d++) h[d] = x[d] + res[d];
            memcpy(dst, h, (size_t)dim * sizeof(float));
        } else {
            memcpy(h, x, (size_t)dim * sizeof(float));
        }
        if (a->kind == NIB_NORM_LAYER) {
            double s = 0.0;
            for (int64_t d = 0; d < dim; d++) s += (double)h[d];
            const double mean = s / (double)dim;
            double s2 = 0.0;
            for (int64_t d = 0; d < dim; d++) {
                double c = (double)h[d] - mean;
                s2 += c * c;
            }
            const float mu = (float)mean, var = (float)(s2 / (double)dim);
            const float rstd = 1.0f / sqrtf(var + a->eps);
            for (int64_t d = 0; d < dim; d++) {
                float c = h[d] - mu;
                float t = c * rstd;
                if (a->w) t = t * a->w[d];
                if (a->b) t = t + a->b[d];
                y[d] = t;
            }
        } else {
            double s = 0.0;
            for (int64_t d = 0; d < dim; d++) s += (double)h[d] * (double)h[d];
            const float ms = (float)(s / (double)dim);
            const float inv = 1.0f / sqrtf(ms + a->eps);
            for (int64_t d = 0; d < dim; d++) {
                float t = h[d] * inv;
                if (a->kind == NIB_NORM_ADARMS) {
                    float f = 1.0f + a->scale[d];
                    t = t * f;
                    t = t + a->shift[d];
                } else if (a->w) {
                    float f = 1.0f + a->w[d];
                    t = t * f;
                }
                y[d] = t;
            }
        }
        if (a->y) memcpy((float *)a->y + r * a->ldy, y, (size_t)dim * sizeof(float));
        if (a->y_q) {
            st = nib_fp8_quantize(y, 1, dim, 1, a->y_q + r * a->ldq, &a->y_scale[r]);
            if (st) {
                nib_error_context(st, "norm (ref, %s) FP8 output of row %lld", kind_name(a->kind), (long long)r);
                goto fail;
            }
        }
    }
fail:
    nib_free(h);
    nib_free(y);
    return st;
}

#ifndef NIB_HAVE_CUDA
nib_status nib_cuda_norm(const nib_norm_args *a, void *stream) {
    (void)a;
    (void)stream;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "norm: this nib build has no CUDA backend (NO_CUDA=1 or no nvcc)");
}
#endif
