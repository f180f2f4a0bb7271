/* fp8_rows.cuh — the per-row FP8 output shared by the kernels that hand a W8A8 GEMM its
 * activations (norm.cu, act.cu, blas.cu's per-token quantizer): formats' nib_fp8_quantize per
 * row, i.e.
 *   s = amax / 448 (IEEE division) raised to at least FLT_MIN, 1 for an all-zero row;
 *   code = e4m3 satfinite RNE of (v / s), the correctly rounded quotient (fp8_quot). */
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

/* The quotient v / sc of the codes, correctly rounded, without a division per value: with
 * r = RN(1 / sc) (__frcp_rn), q = RN(v r), the remainder v - q sc is exact in one FMA and
 * RN(q + (v - q sc) r) is RN(v / sc) (Markstein's theorem: r within half an ulp of 1 / sc, q
 * within one ulp of v / sc, no overflow and no underflow in the remainder). Here |v| <= amax =
 * 448 sc, so q <= 448 (1 + 2^-22); the remainder is exact where |v| >= 2^-100, and below that
 * the quotient is under 2^-40 for sc >= 2^-60, so its code is a signed zero either way. The
 * remainder is formed as -(q sc - v), so v = -0 gives -0 (v - q sc would give +0). Rows whose
 * scale is outside [2^-60, 2^100] (tiny rows, an Inf in the row) take the IEEE division:
 * fp8_quot_rcp returns 0 for them. An IEEE division per value compiles to MUFU.RCP + FCHK + five
 * FFMA and a slow-path branch (about 12 instructions); this is FMUL + 2 FFMA (the negations are
 * operand modifiers). Checked bit for bit against __fdiv_rn by tests/test_ops_gpu.c
 * (ops_gpu_fp8_quotient, through tests/fp8_quot_check.cu) on fp32 and bf16 rows whose scales
 * span both sides of the fast path, a quarter of the values next to e4m3 rounding midpoints. */
__device__ __forceinline__ float fp8_quot_rcp(float sc) {
    return sc >= 0x1p-60f && sc <= 0x1p100f ? __frcp_rn(sc) : 0.f;
}
__device__ __forceinline__ float fp8_quot(float v, float sc, float r) {
    const float q = __fmul_rn(v, r);
    /* -(q sc - v) is the remainder v - q sc, with the sign of zero that keeps v = -0 at -0 */
    return __fmaf_rn(-__fmaf_rn(q, sc, -v), r, q);
}

/* 8 values -> 8 e4m3 codes (byte k = value k); r = fp8_quot_rcp(sc), computed once per row */
__device__ __forceinline__ uint2 fp8_codes8(const float (&v)[8], float sc, float r) {
    uint32_t w[2];
    if (r != 0.f) { /* uniform per row */
#pragma unroll
        for (int k = 0; k < 2; k++)
            w[k] = (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(fp8_quot(v[4 * k], sc, r), fp8_quot(v[4 * k + 1], sc, r)),
                                                      __NV_SATFINITE, __NV_E4M3) |
                   (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(fp8_quot(v[4 * k + 2], sc, r), fp8_quot(v[4 * k + 3], sc, r)),
                                                      __NV_SATFINITE, __NV_E4M3)
                       << 16;
    } else {
        w[0] = w[1] = 0u;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint32_t q = __nv_cvt_float_to_fp8(__fdiv_rn(v[k], sc), __NV_SATFINITE, __NV_E4M3);
            w[k >> 2] |= q << (8 * (k & 3));
        }
    }
    return make_uint2(w[0], w[1]);
}

} // namespace nib

#endif
