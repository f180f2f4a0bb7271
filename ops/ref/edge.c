/* edge.c — the reference of ops/edge.h (host float activations: the spec), the argument checks both
 * backends share, the CUDA kernel's shape rule, and the CUDA entry point's stub for CPU-only builds. */
#include <stdlib.h>
#include <string.h>

#include "ops/edge.h"
#include "ops/norm.h"

nib_status nib_edge_validate(const nib_edge_args *a, const char *who) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL args", who);
    if (a->mode < 1 || a->mode > (NIB_EDGE_OUT | NIB_EDGE_IN))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: mode %d: NIB_EDGE_OUT (1), NIB_EDGE_IN (2) or both (3)", who, a->mode);
    if (a->rows < 0 || a->rows > INT32_MAX)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: rows %lld outside [0, 2^31)", who, (long long)a->rows);
    if (a->dim < 8 || a->dim > NIB_NORM_MAX_DIM || a->dim % 8)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: dim %lld must be a multiple of 8 in [8, %d]", who, (long long)a->dim,
                       NIB_NORM_MAX_DIM);
    if (a->adim < 1 || a->adim > NIB_EDGE_MAX_ADIM)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: adim %lld outside [1, %d]", who, (long long)a->adim, NIB_EDGE_MAX_ADIM);
    if (!(a->eps > 0.0f)) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: eps %g must be > 0", who, (double)a->eps);
    if (!a->xt) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: xt is NULL", who);
    if (a->ldxt < a->adim)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: ldxt %lld < adim %lld", who, (long long)a->ldxt, (long long)a->adim);
    if (a->mode & NIB_EDGE_OUT) {
        if (!a->x || !a->fscale || !a->fshift || !a->w_out)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (out): x, fscale, fshift and w_out are required", who);
        if (a->ldx < a->dim || (a->residual && a->ldr < a->dim))
            return NIB_ERR(NIB_ERR_SHAPE, "%s (out): ldx %lld / ldr %lld < dim %lld", who, (long long)a->ldx,
                           (long long)a->ldr, (long long)a->dim);
        if (a->res_gate && !a->residual)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (out): res_gate given without a residual", who);
    }
    if (a->mode & NIB_EDGE_IN) {
        if (!a->w_in_t || !a->h || !a->nscale || !a->nshift || !a->y)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (in): w_in_t, h, nscale, nshift and y are required", who);
        if (a->ldh < a->dim || a->ldy < a->dim)
            return NIB_ERR(NIB_ERR_SHAPE, "%s (in): ldh %lld / ldy %lld < dim %lld", who, (long long)a->ldh,
                           (long long)a->ldy, (long long)a->dim);
    }
    return NIB_OK;
}

nib_status nib_edge_supported(int mode, int64_t dim, int64_t adim) {
    if (dim % 8 || dim < 8 || dim > 2048)
        return NIB_ERR(NIB_ERR_SHAPE, "edge (cuda): dim %lld must be a multiple of 8 in [8, 2048] (one CTA of dim / 8 "
                                      "threads per row)", (long long)dim);
    if (adim < 1 || adim > NIB_EDGE_MAX_ADIM)
        return NIB_ERR(NIB_ERR_SHAPE, "edge (cuda): adim %lld outside [1, %d]", (long long)adim, NIB_EDGE_MAX_ADIM);
    const int64_t mats = ((mode & NIB_EDGE_OUT) != 0) + ((mode & NIB_EDGE_IN) != 0);
    if (mats * adim * dim * 2 > NIB_EDGE_MAX_SMEM)
        return NIB_ERR(NIB_ERR_SHAPE, "edge (cuda): %lld weight(s) of %lld x %lld bf16 exceed the kernel's %d bytes of "
                                      "shared memory", (long long)mats, (long long)adim, (long long)dim,
                       NIB_EDGE_MAX_SMEM);
    return NIB_OK;
}

/* v_j = fp32(sum_d y_d * w[j][d] in fp64) for j < n, w [n][k] */
static float dot_f64(const float *y, const float *w, int64_t k) {
    double s = 0.0;
    for (int64_t d = 0; d < k; d++) s += (double)y[d] * (double)w[d];
    return (float)s;
}

nib_status nib_ref_edge(const nib_edge_args *a) {
    NIB_RETURN_IF_ERR(nib_edge_validate(a, "edge (ref)"));
    const int64_t dim = a->dim, A = a->adim;
    float *y = nib_malloc((size_t)dim * 4), *hs = nib_malloc((size_t)dim * 4), *col = nib_malloc((size_t)dim * 4);
    nib_status st = NIB_OK;
    if (!y || !hs || !col) {
        st = NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "edge (ref): %lld floats of scratch", (long long)dim * 3);
        goto done;
    }
    for (int64_t r = 0; r < a->rows && !st; r++) {
        float *xt = a->xt + r * a->ldxt;
        if (a->mode & NIB_EDGE_OUT) {
            nib_norm_args n = {.kind = NIB_NORM_ADARMS, .rows = 1, .dim = dim, .eps = a->eps,
                               .x = (const float *)a->x + r * a->ldx, .ldx = dim, .scale = a->fscale,
                               .shift = a->fshift, .y = y, .ldy = dim};
            if (a->residual)
                n.residual = (void *)((const float *)a->residual + r * a->ldr), n.ldr = dim, n.h_out = hs, n.ldh = dim,
                n.res_gate = a->res_gate;
            if ((st = nib_ref_norm(&n))) break;
            for (int64_t j = 0; j < A; j++) {
                const float v = dot_f64(y, (const float *)a->w_out + j * dim, dim) + (a->b_out ? a->b_out[j] : 0.f);
                xt[j] = xt[j] + v;
            }
        }
        if (a->mode & NIB_EDGE_IN) {
            float *h = (float *)a->h + r * a->ldh;
            for (int64_t n = 0; n < dim; n++) {
                double s = 0.0;
                for (int64_t k = 0; k < A; k++) s += (double)xt[k] * (double)((const float *)a->w_in_t)[k * dim + n];
                col[n] = (float)s + (a->b_in ? a->b_in[n] : 0.f);
            }
            memcpy(h, col, (size_t)dim * 4);
            nib_norm_args n = {.kind = NIB_NORM_ADARMS, .rows = 1, .dim = dim, .eps = a->eps, .x = col, .ldx = dim,
                               .scale = a->nscale, .shift = a->nshift, .y = (float *)a->y + r * a->ldy, .ldy = dim};
            st = nib_ref_norm(&n);
        }
    }
done:
    nib_free(y), nib_free(hs), nib_free(col);
    return st;
}

#ifndef NIB_HAVE_CUDA
nib_status nib_cuda_edge(const nib_edge_args *a, void *stream) {
    (void)a, (void)stream;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "nib_cuda_edge: this nib build has no CUDA backend (NO_CUDA=1 or no nvcc)");
}
#endif
