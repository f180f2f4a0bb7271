/* misc.c — reference twins of ops/misc.h (host float activations). */
#include <math.h>
#include <string.h>

#include "ops/misc.h"

nib_status nib_ref_im2patch(const nib_im2patch_args *a) {
    if (!a || !a->images || !a->out || a->n_img < 0 || a->channels < 1 || a->patch < 1 || a->size % a->patch)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "im2patch: bad arguments (size %d, patch %d)", a ? a->size : 0,
                       a ? a->patch : 0);
    const int g = a->size / a->patch, kk = a->channels * a->patch * a->patch;
    if (a->ld < kk) return NIB_ERR(NIB_ERR_SHAPE, "im2patch: ld %lld < %d", (long long)a->ld, kk);
    float *out = (float *)a->out;
    for (int i = 0; i < a->n_img; i++)
        for (int py = 0; py < g; py++)
            for (int px = 0; px < g; px++) {
                float *row = out + ((int64_t)i * g * g + py * g + px) * a->ld;
                for (int c = 0; c < a->channels; c++)
                    for (int ky = 0; ky < a->patch; ky++)
                        for (int kx = 0; kx < a->patch; kx++) {
                            int y = py * a->patch + ky, x = px * a->patch + kx;
                            float v;
                            if (a->u8_nhwc) {
                                uint8_t u = ((const uint8_t *)a->images)[(((int64_t)i * a->size + y) * a->size + x) * a->channels + c];
                                v = (float)u / 255.0f * 2.0f - 1.0f;
                            } else {
                                v = ((const float *)a->images)[(((int64_t)i * a->channels + c) * a->size + y) * a->size + x];
                            }
                            row[(c * a->patch + ky) * a->patch + kx] = v;
                        }
                for (int64_t j = kk; j < a->ld; j++) row[j] = 0.f;
            }
    return NIB_OK;
}

nib_status nib_ref_embed(const nib_embed_args *a) {
    const float *t = (const float *)a->table;
    float *o = (float *)a->out;
    for (int32_t i = 0; i < a->n; i++) {
        int32_t id = a->ids[i];
        if (id < 0 || id >= a->vocab)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "embed: token id %d at position %d outside the vocabulary of %lld", id, i,
                           (long long)a->vocab);
        for (int64_t j = 0; j < a->dim; j++) o[i * a->ld + j] = t[(int64_t)id * a->dim + j] * a->scale;
    }
    return NIB_OK;
}

nib_status nib_ref_f32_to_act(const float *x, int64_t rows, int64_t cols, int64_t ldx, void *y, int64_t ldy) {
    float *o = (float *)y;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) o[r * ldy + c] = x[r * ldx + c];
    return NIB_OK;
}

nib_status nib_ref_axpy_f32(float *x, int64_t rows, int64_t cols, int64_t ldx, const void *v, int64_t ldv) {
    const float *vv = (const float *)v;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) x[r * ldx + c] += vv[r * ldv + c];
    return NIB_OK;
}

static float gelu_tanh_f(float g) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    return (0.5f * g) * (1.0f + tanhf(k0 * (g + ((k1 * g) * g) * g)));
}

nib_status nib_ref_epilogue(const nib_epilogue_args *a) {
    const float *acc = (const float *)a->acc, *res = (const float *)a->residual;
    float *y = (float *)a->y;
    const int64_t n_out = a->geglu ? a->n_in / 2 : a->n_in;
    for (int64_t r = 0; r < a->rows; r++)
        for (int64_t j = 0; j < n_out; j++) {
            float v = acc[r * a->ld_acc + j] + (a->bias ? a->bias[j] : 0.f);
            if (a->geglu) {
                float u = acc[r * a->ld_acc + n_out + j] + (a->bias ? a->bias[n_out + j] : 0.f);
                v = gelu_tanh_f(v) * u;
            }
            if (a->gate) v *= a->gate[j];
            if (res) v += res[r * a->ldr + j];
            y[r * a->ldy + j] = v;
        }
    return NIB_OK;
}

#ifndef NIB_HAVE_CUDA
/* CPU-only build: the CUDA twins report that there is no CUDA backend */
#define NO_CUDA(what) NIB_ERR(NIB_ERR_NO_DEVICE, "%s: this nib build has no CUDA backend (NO_CUDA=1 or no nvcc)", what)
nib_status nib_cuda_im2patch(const nib_im2patch_args *a, void *stream) {
    (void)a, (void)stream;
    return NO_CUDA("nib_cuda_im2patch");
}
nib_status nib_cuda_embed(const nib_embed_args *a, void *stream) {
    (void)a, (void)stream;
    return NO_CUDA("nib_cuda_embed");
}
nib_status nib_cuda_f32_to_act(const float *x, int64_t rows, int64_t cols, int64_t ldx, void *y, int64_t ldy,
                               void *stream) {
    (void)x, (void)rows, (void)cols, (void)ldx, (void)y, (void)ldy, (void)stream;
    return NO_CUDA("nib_cuda_f32_to_act");
}
nib_status nib_cuda_axpy_f32(float *x, int64_t rows, int64_t cols, int64_t ldx, const void *v, int64_t ldv,
                             void *stream) {
    (void)x, (void)rows, (void)cols, (void)ldx, (void)v, (void)ldv, (void)stream;
    return NO_CUDA("nib_cuda_axpy_f32");
}
nib_status nib_cuda_epilogue(const nib_epilogue_args *a, void *stream) {
    (void)a, (void)stream;
    return NO_CUDA("nib_cuda_epilogue");
}
#endif
