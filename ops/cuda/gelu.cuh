/* gelu.cuh — GELU-tanh in the reference's arithmetic (ops/ref/act.c: explicit __f*_rn
 * intrinsics, never contracted to FMAs; tanhf within 2 ulp), shared by the activation kernels
 * (act.cu) and the FP8 GEMM's GeGLU epilogue (gemm_fp8.cu), so both compute the same values; and
 * its form with the hardware tanh approximation for outputs that go to FP8 next.
 * nib_fast_tanh(): NIB_FAST_TANH in the environment, 1 (the default: the approximation on those
 * FP8 paths) or 0 (tanhf everywhere); -1 for another value (the callers' error names it). */
#ifndef NIB_GELU_CUH
#define NIB_GELU_CUH

#include <stdlib.h>
#include <string.h>

static inline int nib_fast_tanh(void) {
    const char *e = getenv("NIB_FAST_TANH");
    if (!e || !*e || !strcmp(e, "1")) return 1;
    return strcmp(e, "0") ? -1 : 0;
}

/* (0.5 g) (1 + tanh(k0 (g + ((k1 g) g) g))) */
static __device__ __forceinline__ float gelu_tanh_f(float g) {
    const float g3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float z = __fmul_rn(0.7978845608028654f, __fadd_rn(g, g3));
    return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(z)));
}

/* The same with tanh.approx.f32 (one MUFU.TANH instead of tanhf's sequence) for activations that are
 * quantized to FP8 next: the GELU / GeGLU with only an FP8 output (act.cu k_act_q) and the W8A8 gate|up
 * product's GeGLU (gemm_fp8.cu), whose bf16 h is quantized for the down product. Its error on the H100,
 * |tanh.approx(z) - tanh(z)| <= 1.113e-5 |tanh(z)| (2^-16.46, the worst over every float: GPU test
 * ops_gpu_tanh_approx_bound; the tests carry ops/act.h's NIB_ACT_TANH_APPROX_ERR = 2^-15), moves gelu by
 * at most 2^-17.4 |g| before the last roundings: far under E4M3's half step 2^-4 of the value, and where
 * 1 + tanh(z) cancels (g < 0, |gelu(g)| <= 0.17) at most 2^-17.4 |g| absolute. NIB_FAST_TANH=0 keeps
 * gelu_tanh_f (A/B). */
static __device__ __forceinline__ float gelu_tanh_approx(float g) {
    const float g3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float z = __fmul_rn(0.7978845608028654f, __fadd_rn(g, g3));
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(z));
    return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, t));
}

#endif
