/* misc.cu — CUDA twins of ops/misc.h: im2patch, embedding gather, fp32<->bf16 state glue and
 * the GEMM epilogue for the cuBLAS paths. Memory-bound elementwise kernels, one thread per
 * element (these touch activations only: kilobytes to a few megabytes per call).
 * Tested by tests/test_misc_gpu.c against ops/ref/misc.c. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "ops/misc.h"
#include "runtime/cuda_check.h"
#include "runtime/launch.cuh"

static unsigned blocks_for(int64_t n, int t) {
    int64_t b = (n + t - 1) / t;
    return (unsigned)(b < 1 ? 1 : (b > 65535 * 32 ? 65535 * 32 : b));
}

__global__ void k_im2patch(nib_im2patch_args a, int g, int kk, int64_t total) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = idx / a.ld, col = idx - row * a.ld;
        __nv_bfloat16 *dst = (__nv_bfloat16 *)a.out + idx;
        if (col >= kk) {
            *dst = __float2bfloat16(0.f);
            continue;
        }
        int i = (int)(row / (g * g)), pp = (int)(row % (g * g)), py = pp / g, px = pp % g;
        int c = (int)(col / (a.patch * a.patch)), r2 = (int)(col % (a.patch * a.patch));
        int y = py * a.patch + r2 / a.patch, x = px * a.patch + r2 % a.patch;
        float v;
        if (a.u8_nhwc)
            v = (float)((const uint8_t *)a.images)[(((int64_t)i * a.size + y) * a.size + x) * a.channels + c] / 255.0f *
                    2.0f - 1.0f;
        else
            v = ((const float *)a.images)[(((int64_t)i * a.channels + c) * a.size + y) * a.size + x];
        *dst = __float2bfloat16(v);
    }
}

nib_status nib_cuda_im2patch(const nib_im2patch_args *a, void *stream) {
    if (!a || !a->images || !a->out || a->patch < 1 || a->size % a->patch || a->ld < a->channels * a->patch * a->patch)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "im2patch: bad arguments");
    int g = a->size / a->patch;
    int64_t total = (int64_t)a->n_img * g * g * a->ld;
    if (total == 0) return NIB_OK;
    NIB_CUDA_CHECK(nib::launch(k_im2patch, dim3(blocks_for(total, 256)), dim3(256), 0, (cudaStream_t)stream, *a, g, a->channels * a->patch * a->patch,
                                                                        total));
    NIB_LAUNCH_CHECK("k_im2patch");
    return NIB_OK;
}

__global__ void k_embed(nib_embed_args a) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    int t = blockIdx.x;
    int32_t id = a.ids[t];
    const __nv_bfloat16 *src = (const __nv_bfloat16 *)a.table + (int64_t)id * a.dim;
    __nv_bfloat16 *dst = (__nv_bfloat16 *)a.out + (int64_t)t * a.ld;
    bool ok = id >= 0 && id < a.vocab;
    for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x)
        dst[j] = __float2bfloat16(ok ? __bfloat162float(src[j]) * a.scale : 0.f);
}

nib_status nib_cuda_embed(const nib_embed_args *a, void *stream) {
    if (a->n <= 0) return NIB_OK;
    NIB_CUDA_CHECK(nib::launch(k_embed, dim3(a->n), dim3(256), 0, (cudaStream_t)stream, *a));
    NIB_LAUNCH_CHECK("k_embed");
    return NIB_OK;
}

__global__ void k_f32_to_act(const float *x, int64_t rows, int64_t cols, int64_t ldx, __nv_bfloat16 *y, int64_t ldy) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        y[r * ldy + c] = __float2bfloat16(x[r * ldx + c]);
    }
}
nib_status nib_cuda_f32_to_act(const float *x, int64_t rows, int64_t cols, int64_t ldx, void *y, int64_t ldy,
                               void *stream) {
    if (rows * cols == 0) return NIB_OK;
    NIB_CUDA_CHECK(nib::launch(k_f32_to_act, dim3(blocks_for(rows * cols, 256)), dim3(256), 0, (cudaStream_t)stream, x, rows, cols, ldx,
                                                                                  (__nv_bfloat16 *)y, ldy));
    NIB_LAUNCH_CHECK("k_f32_to_act");
    return NIB_OK;
}

__global__ void k_axpy_f32(float *x, int64_t rows, int64_t cols, int64_t ldx, const __nv_bfloat16 *v, int64_t ldv) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        x[r * ldx + c] += __bfloat162float(v[r * ldv + c]);
    }
}
nib_status nib_cuda_axpy_f32(float *x, int64_t rows, int64_t cols, int64_t ldx, const void *v, int64_t ldv,
                             void *stream) {
    if (rows * cols == 0) return NIB_OK;
    NIB_CUDA_CHECK(nib::launch(k_axpy_f32, dim3(blocks_for(rows * cols, 256)), dim3(256), 0, (cudaStream_t)stream, x, rows, cols, ldx,
                                                                                (const __nv_bfloat16 *)v, ldv));
    NIB_LAUNCH_CHECK("k_axpy_f32");
    return NIB_OK;
}

__device__ __forceinline__ float gelu_tanh_dev(float g) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    return (0.5f * g) * (1.0f + tanhf(k0 * (g + ((k1 * g) * g) * g)));
}

__global__ void k_epilogue(nib_epilogue_args a, int64_t n_out) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    int64_t n = a.rows * n_out;
    const __nv_bfloat16 *acc = (const __nv_bfloat16 *)a.acc, *res = (const __nv_bfloat16 *)a.residual;
    __nv_bfloat16 *y = (__nv_bfloat16 *)a.y;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / n_out, j = i - r * n_out;
        float v = __bfloat162float(acc[r * a.ld_acc + j]) + (a.bias ? a.bias[j] : 0.f);
        if (a.geglu) {
            float u = __bfloat162float(acc[r * a.ld_acc + n_out + j]) + (a.bias ? a.bias[n_out + j] : 0.f);
            v = gelu_tanh_dev(v) * u;
        }
        if (a.gate) v *= a.gate[j];
        if (res) v += __bfloat162float(res[r * a.ldr + j]);
        y[r * a.ldy + j] = __float2bfloat16(v);
    }
}

nib_status nib_cuda_epilogue(const nib_epilogue_args *a, void *stream) {
    int64_t n_out = a->geglu ? a->n_in / 2 : a->n_in;
    if (a->rows * n_out == 0) return NIB_OK;
    NIB_CUDA_CHECK(nib::launch(k_epilogue, dim3(blocks_for(a->rows * n_out, 256)), dim3(256), 0, (cudaStream_t)stream, *a, n_out));
    NIB_LAUNCH_CHECK("k_epilogue");
    return NIB_OK;
}
