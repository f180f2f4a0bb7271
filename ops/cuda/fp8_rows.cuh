/* fp8_rows.cuh — the per-row FP8 output shared by the kernels that hand a W8A8 GEMM its
 * activations (norm.cu, act.cu): formats' nib_fp8_quantize per row, i.e.
 *   s = amax / 448 (IEEE division) raised to at least FLT_MIN, 1 for an all-zero row;
 *   code = e4m3 satfinite RNE of (v / s) (IEEE division). */
#ifndef NIB_FP8_ROWS_CUH
#define NIB_FP8_ROWS_CUH

#include <cuda_fp8.h>
#include <float.h>
#include <stdint.h>

namespace nib {

/* max over the CTA (nw warps); sh holds >= nw floats; ends with every thread holding the max.
 * Contains one __syncthreads: call it uniformly. */
__device__ __forceinline__ float cta_max(float v, float *sh, int nw) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = 0.f;
    for (int i = 0; i < nw; i++) m = fmaxf(m, sh[i]);
    return m;
}

__device__ __forceinline__ float fp8_row_scale_of(float amax) {
    if (amax == 0.0f) return 1.0f;
    const float s = __fdiv_rn(amax, 448.0f);
    return s < FLT_MIN ? FLT_MIN : s;
}

/* 8 values -> 8 e4m3 codes (byte k = value k) */
__device__ __forceinline__ uint2 fp8_codes8(const float (&v)[8], float sc) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t q = __nv_cvt_float_to_fp8(__fdiv_rn(v[k], sc), __NV_SATFINITE, __NV_E4M3);
        w[k >> 2] |= q << (8 * (k & 3));
    }
    return make_uint2(w[0], w[1]);
}

} // namespace nib

#endif
