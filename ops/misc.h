/* misc.h — the small glue ops of the Pi0.5 graph, each with a reference twin:
 *
 *   im2patch     images -> patch rows for the SigLIP patch-embedding GEMM
 *   embed        token ids -> rows of an embedding table times a scale
 *   f32_to_act   fp32 state (the flow-matching x_t) -> activation dtype
 *   axpy_f32     fp32 state += activation rows (the Euler update; dt is folded into the weight)
 *   epilogue     bias / GeGLU / per-column gate / residual applied to a raw GEMM output (for the
 *                cuBLAS bf16 and fp8 paths, whose GEMMs cannot fuse them)
 *
 * Activations are float on the reference backend (host) and bf16 on the CUDA backend (device);
 * "act" pointers below are void*. fp32 pointers are fp32 on both (device memory for CUDA).
 * Every CUDA entry is enqueued on `stream`, allocates nothing and is graph-capturable.
 */
#ifndef NIB_OPS_MISC_H
#define NIB_OPS_MISC_H

#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* images: n_img images of c x size x size. Layout NCHW fp32 in [-1, 1] (openpi PyTorch), or NHWC
 * u8 (converted as u8 / 255 * 2 - 1). Output row r = image i, patch (py, px) (row-major over the
 * grid), column = ch * patch^2 + ky * patch + kx (the order of a Conv2d weight [out][c][ky][kx]
 * flattened); columns [c*patch^2, ld) are zero (K padding for the GEMM). */
typedef struct nib_im2patch_args {
    const void *images;   /* fp32 (ref: host, CUDA: device) or u8 */
    int u8_nhwc;          /* 0: fp32 NCHW, 1: u8 NHWC */
    int32_t n_img, channels, size, patch;
    void *out;            /* [n_img * (size/patch)^2][ld] act */
    int64_t ld;           /* >= channels * patch^2 */
} nib_im2patch_args;
nib_status nib_ref_im2patch(const nib_im2patch_args *a);
nib_status nib_cuda_im2patch(const nib_im2patch_args *a, void *stream);

/* out[t][:] = table[ids[t]][:] * scale for t < n (ids host for ref, device for CUDA). The table is
 * act dtype [vocab][dim] (bf16 on the GPU, float on the host). Out-of-range ids are an error on
 * the reference and write zeros on the GPU (the loader checks ids on the host before upload). */
typedef struct nib_embed_args {
    const void *table;
    int64_t vocab, dim;
    const int32_t *ids;
    int32_t n;
    float scale;
    void *out;
    int64_t ld;
} nib_embed_args;
nib_status nib_ref_embed(const nib_embed_args *a);
nib_status nib_cuda_embed(const nib_embed_args *a, void *stream);

/* y[r][c] = act(x[r][c]) for r < rows, c < cols (fp32 -> act dtype, RNE) */
nib_status nib_ref_f32_to_act(const float *x, int64_t rows, int64_t cols, int64_t ldx, void *y, int64_t ldy);
nib_status nib_cuda_f32_to_act(const float *x, int64_t rows, int64_t cols, int64_t ldx, void *y, int64_t ldy,
                               void *stream);
/* x[r][c] += v[r][c] in fp32 (v in act dtype) */
nib_status nib_ref_axpy_f32(float *x, int64_t rows, int64_t cols, int64_t ldx, const void *v, int64_t ldv);
nib_status nib_cuda_axpy_f32(float *x, int64_t rows, int64_t cols, int64_t ldx, const void *v, int64_t ldv,
                             void *stream);

/* Epilogue on a raw GEMM output acc [rows][n_in] (act dtype), in the order of ops/gemm.h:
 *   v = acc + bias;  GeGLU: v = gelu_tanh(v[:, j]) * v[:, H + j] with H = n_in / 2;
 *   v = gate ? gate * v : v;  y = residual ? residual + v : v.
 * y [rows][ldy] act; residual may alias y (not acc). bias/gate fp32 or NULL. */
typedef struct nib_epilogue_args {
    const void *acc;
    int64_t rows, n_in, ld_acc;
    const float *bias;    /* [n_in] */
    int geglu;
    const float *gate;    /* [n_out] */
    const void *residual; /* [rows][ldr] act */
    int64_t ldr;
    void *y;
    int64_t ldy;
} nib_epilogue_args;
nib_status nib_ref_epilogue(const nib_epilogue_args *a);
nib_status nib_cuda_epilogue(const nib_epilogue_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
