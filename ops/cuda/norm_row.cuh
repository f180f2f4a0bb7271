/* norm_row.cuh — the row statistics of ops/norm.h's RMS / adaRMS in the order k_norm computes them,
 * shared by k_norm (norm.cu) and the kernels that normalize a row they produced themselves (edge.cu),
 * so that both give bitwise the same y for the same h. */
#ifndef NIB_NORM_ROW_CUH
#define NIB_NORM_ROW_CUH

#include <cuda_runtime.h>
#include <stdint.h>

static __device__ __forceinline__ uint4 ld16(const uint16_t *p) { return *(const uint4 *)p; }
static __device__ __forceinline__ void st16(uint16_t *p, uint4 v) { *(uint4 *)p = v; }

static __device__ __forceinline__ void load8f(const float *p, float (&f)[8]) {
    const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

namespace nib {

/* Block-wide sum: warp xor tree, one slot per warp, then every thread adds the nw partials in the
 * same order (deterministic, identical in all threads). blockDim.x is a multiple of 32 and every
 * thread calls it (one __syncthreads: no early exits after the row check). */
__device__ __forceinline__ double block_sum_f64(double v, double *sh, int nw) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < nw; i++) s += sh[i];
    return s;
}

/* 1 / sqrt(fp32(s / dim) + eps) from the fp64 sum of squares s: the quotient in fp64 (s * inv_dim when
 * dim is a power of two, inv_dim = 1 / dim; else 0 and a division), rounded once; the correctly
 * rounded reciprocal (the value of 1.0f / x without the division's slow path) */
__device__ __forceinline__ float rms_inv(double s, double inv_dim, int dim, float eps) {
    const float ms = __double2float_rn(inv_dim != 0.0 ? s * inv_dim : s / (double)dim);
    return __frcp_rn(__fsqrt_rn(__fadd_rn(ms, eps)));
}

/* adaRMS of one value: (h * inv) * (1 + scale) + shift, each operation rounded */
__device__ __forceinline__ float adarms_of(float h, float inv, float scale, float shift) {
    float t = __fmul_rn(h, inv);
    t = __fmul_rn(t, __fadd_rn(1.0f, scale));
    return __fadd_rn(t, shift);
}

} // namespace nib

#endif
