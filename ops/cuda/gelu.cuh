/* gelu.cuh — GELU-tanh in the reference's arithmetic (ops/ref/act.c: explicit __f*_rn
 * intrinsics, never contracted to FMAs; tanhf within 2 ulp), shared by the activation kernels
 * (act.cu) and the FP8 GEMM's GeGLU epilogue (gemm_fp8.cu), so both compute the same values. */
#ifndef NIB_GELU_CUH
#define NIB_GELU_CUH

/* (0.5 g) (1 + tanh(k0 (g + ((k1 g) g) g))) */
static __device__ __forceinline__ float gelu_tanh_f(float g) {
    const float g3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float z = __fmul_rn(0.7978845608028654f, __fadd_rn(g, g3));
    return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(z)));
}

#endif
