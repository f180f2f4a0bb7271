/* misc.cu — CUDA twins of ops/misc.h: im2patch, embedding gather, fp32<->bf16 state glue and
 * the GEMM epilogue for the cuBLAS paths. Memory-bound elementwise kernels, one thread per
 * element (these touch activations only: kilobytes to a few megabytes per call).
 * Tested by tests/test_misc_gpu.c against ops/ref/misc.c (`nib_tests misc_gpu`). */
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
    /* the reference's checks and statuses (ops/ref/misc.c) */
    if (!a || !a->images || !a->out || a->n_img < 0 || a->channels < 1 || a->patch < 1 || a->size % a->patch)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "im2patch: bad arguments (size %d, patch %d)", a ? a->size : 0,
                       a ? a->patch : 0);
    if (a->ld < a->channels * a->patch * a->patch)
        return NIB_ERR(NIB_ERR_SHAPE, "im2patch: ld %lld < %d", (long long)a->ld, a->channels * a->patch * a->patch);
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

/* (0.5 g) (1 + tanh(k0 (g + ((k1 g) g) g))), each fp32 operation rounded on its own (the
 * reference's order, ops/ref/misc.c) */
__device__ __forceinline__ float gelu_tanh_dev(float g) {
    const float g3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float z = __fmul_rn(0.7978845608028654f, __fadd_rn(g, g3));
    return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(z)));
}

__device__ __forceinline__ float epi_one(const nib_epilogue_args &a, float acc, float up, int64_t j, int64_t n_out,
                                         float res) {
    float v = a.bias ? __fadd_rn(acc, a.bias[j]) : acc;
    if (a.geglu) v = __fmul_rn(gelu_tanh_dev(v), a.bias ? __fadd_rn(up, a.bias[n_out + j]) : up);
    if (a.gate) v = __fmul_rn(v, a.gate[j]);
    return a.residual ? __fadd_rn(v, res) : v;
}

/* Vector path: thread = 8 outputs (16-byte loads and stores); grid x = column blocks, y = rows.
 * Needs n_out % 8 == 0, every ld % 8 == 0 and 16-byte aligned bf16 rows. In place (residual == y)
 * is safe: each thread reads its residual chunk before writing the same chunk. */
__global__ void __launch_bounds__(128) k_epilogue_v8(nib_epilogue_args a, int64_t n_out) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    const int64_t r = blockIdx.y, c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (8 * c >= n_out) return;
    const uint4 av = *(const uint4 *)((const __nv_bfloat16 *)a.acc + r * a.ld_acc + 8 * c);
    uint4 uv = make_uint4(0, 0, 0, 0), rv = make_uint4(0, 0, 0, 0);
    if (a.geglu) uv = *(const uint4 *)((const __nv_bfloat16 *)a.acc + r * a.ld_acc + n_out + 8 * c);
    if (a.residual) rv = *(const uint4 *)((const __nv_bfloat16 *)a.residual + r * a.ldr + 8 * c);
    const uint32_t aw[4] = {av.x, av.y, av.z, av.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w}, rw[4] = {rv.x, rv.y, rv.z, rv.w};
    uint32_t ow[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t j = 8 * c + 2 * i;
        const float lo = epi_one(a, __uint_as_float(aw[i] << 16), __uint_as_float(uw[i] << 16), j, n_out,
                                 __uint_as_float(rw[i] << 16));
        const float hi = epi_one(a, __uint_as_float(aw[i] & 0xFFFF0000u), __uint_as_float(uw[i] & 0xFFFF0000u), j + 1,
                                 n_out, __uint_as_float(rw[i] & 0xFFFF0000u));
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        ow[i] = *(const uint32_t *)&h;
    }
    *(uint4 *)((__nv_bfloat16 *)a.y + r * a.ldy + 8 * c) = make_uint4(ow[0], ow[1], ow[2], ow[3]);
}

/* Scalar path (any shape): grid x = column blocks, y = rows (no 64-bit division per element). */
__global__ void k_epilogue(nib_epilogue_args a, int64_t n_out) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    const int64_t r = blockIdx.y, j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_out) return;
    const __nv_bfloat16 *acc = (const __nv_bfloat16 *)a.acc + r * a.ld_acc;
    const float up = a.geglu ? __bfloat162float(acc[n_out + j]) : 0.f;
    const float res = a.residual ? __bfloat162float(((const __nv_bfloat16 *)a.residual)[r * a.ldr + j]) : 0.f;
    ((__nv_bfloat16 *)a.y)[r * a.ldy + j] = __float2bfloat16(epi_one(a, __bfloat162float(acc[j]), up, j, n_out, res));
}

nib_status nib_cuda_epilogue(const nib_epilogue_args *a, void *stream) {
    int64_t n_out = a->geglu ? a->n_in / 2 : a->n_in;
    if (a->rows * n_out == 0) return NIB_OK;
    const uintptr_t al = (uintptr_t)a->acc | (uintptr_t)a->y | (uintptr_t)a->residual | (uintptr_t)a->bias |
                         (uintptr_t)a->gate;
    const int vec = n_out % 8 == 0 && a->ld_acc % 8 == 0 && a->ldy % 8 == 0 && (!a->residual || a->ldr % 8 == 0) &&
                    al % 16 == 0;
    const int64_t per = vec ? 8 * 128 : 256, bx = (n_out + per - 1) / per;
    if (bx > 0x7FFFFFFF) return NIB_ERR(NIB_ERR_SHAPE, "epilogue (cuda): %lld columns", (long long)n_out);
    for (int64_t r0 = 0; r0 < a->rows; r0 += 65535) { /* grid y: at most 65535 rows per launch */
        nib_epilogue_args c = *a;
        c.rows = a->rows - r0 < 65535 ? a->rows - r0 : 65535;
        c.acc = (const __nv_bfloat16 *)a->acc + r0 * a->ld_acc;
        c.y = (__nv_bfloat16 *)a->y + r0 * a->ldy;
        if (a->residual) c.residual = (const __nv_bfloat16 *)a->residual + r0 * a->ldr;
        const dim3 grid((unsigned)bx, (unsigned)c.rows);
        if (vec)
            NIB_CUDA_CHECK(nib::launch(k_epilogue_v8, grid, dim3(128), 0, (cudaStream_t)stream, c, n_out));
        else
            NIB_CUDA_CHECK(nib::launch(k_epilogue, grid, dim3(256), 0, (cudaStream_t)stream, c, n_out));
        NIB_LAUNCH_CHECK("k_epilogue");
    }
    return NIB_OK;
}
