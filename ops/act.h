/* act.h — the MLP activations: gated GeGLU-tanh (Gemma / Pi0.5), SwiGLU, and plain GELU-tanh
 * (SigLIP fc1, when its GEMM does not fuse it).
 *
 * Backends: nib_ref_act (ops/ref/act.c, host float: the spec) and nib_cuda_act
 * (ops/cuda/act.cu, device bf16, fp32 math).
 *
 * Gated kinds read the fused gate|up GEMM output [rows][2H]: gate = columns [0, H), up =
 * columns [H, 2H) (Gemma's gating_einsum / gate_proj|up_proj layout); output [rows][H].
 *   GEGLU_TANH  y = gelu_tanh(g) * u
 *   SWIGLU      y = silu(g) * u
 *   GELU_TANH   y = gelu_tanh(x)            (ungated: input [rows][H])
 * Arithmetic (identical in both backends; each fp32 operation rounded separately, no FMA):
 *   gelu_tanh(g) = (0.5f * g) * (1 + tanhf(k0 * (g + ((k1 * g) * g) * g)))
 *                  k0 = 0.7978845608028654f (sqrt(2/pi)), k1 = 0.044715f
 *   silu(g)      = g / (1 + expf(-g))
 * tanhf/expf are the platform's fp32 functions (CUDA: within 2 ulp; glibc: within 1 ulp), the
 * only difference between the backends.
 *
 * Outputs (at least one): y in the activation dtype (bf16 on the GPU: RNE of the fp32 value), and
 * FP8 for a following W8A8 GEMM: per row s = amax_j |v_j| / 448 raised to at least FLT_MIN (1 for
 * an all-zero row), code_j = e4m3(v_j / s) (IEEE division, RNE, saturating): formats'
 * nib_fp8_quantize(v_row, 1, H, per_channel = 1, ...) of the fp32 values v (not of the bf16 y),
 * the same rule as the norms' FP8 output (ops/norm.h). The reference reports NIB_ERR_NUMERICS
 * for a row with NaN/Inf when y_q is asked for.
 *
 * CUDA, FP8 output only (y_q without y) for GEGLU_TANH / GELU_TANH: tanhf is replaced by the hardware
 * approximation tanh.approx.f32 (ops/cuda/gelu.cuh), whose relative error is at most
 * NIB_ACT_TANH_APPROX_ERR (2^-15; the GPU test ops_gpu_tanh_approx_bound sweeps every float and requires
 * half of it): gelu moves by at most NIB_ACT_TANH_APPROX_ERR |g| / 2 before the last roundings, far below
 * the following E4M3 quantization (the same holds for the W8A8 gate|up product's GeGLU, ops/gemm.h).
 * NIB_FAST_TANH=0 keeps tanhf there; other values than 0 / 1 are errors.
 *
 * Strides in elements. H is a multiple of 8. Gated: ldx >= 2H; GELU: ldx >= H; ldy >= H; ldq >= H.
 * On the GPU ldx and ldy are multiples of 8 and x, y 16-byte aligned; ldq a multiple of 8 and
 * y_q 8-byte aligned; with y_q, H <= 32768. y may be x (in place, ldy == ldx); otherwise they
 * must not overlap. y_q and y_scale overlap nothing.
 */
#ifndef NIB_OPS_ACT_H
#define NIB_OPS_ACT_H

#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nib_act_kind {
    NIB_ACT_GEGLU_TANH = 0, /* Gemma MLP */
    NIB_ACT_SWIGLU = 1,     /* Llama-style MLP */
    NIB_ACT_GELU_TANH = 2,  /* ungated (SigLIP) */
    NIB_ACT_KIND_COUNT
} nib_act_kind;

/* bound on |tanh.approx.f32(z) - tanh(z)| / |tanh(z)| over the normal floats, carried by the tests: 2^-15,
 * 2.7x the worst the sweep measured on the H100 (1.113e-5 = 2^-16.46, both signs; subnormal inputs exact) */
#define NIB_ACT_TANH_APPROX_ERR 0x1p-15

typedef struct nib_act_args {
    nib_act_kind kind;
    int64_t rows;           /* rows the buffers hold: the kernel covers this many */
    const int32_t *n_valid; /* optional int32 (device for CUDA, host for ref): rows >= *n_valid
                               are untouched (clamped to [0, rows]); NULL = all */
    int64_t h;              /* output columns H: a multiple of 8 */
    const void *x;          /* [rows][ldx] (ref: float, CUDA: bf16): gate | up, or x for GELU */
    int64_t ldx;
    void *y;                /* [rows][ldy] (ref: float, CUDA: bf16), or NULL with y_q */
    int64_t ldy;
    uint8_t *y_q;           /* optional [rows][ldq] e4m3 codes of the output */
    int64_t ldq;
    float *y_scale;         /* [rows] fp32 per-row scale of y_q (required with y_q) */
} nib_act_args;

/* Shared argument checks: NIB_ERR_SHAPE / NIB_ERR_INVALID_ARG naming `who` and the numbers. */
nib_status nib_act_validate(const nib_act_args *a, const char *who);

nib_status nib_ref_act(const nib_act_args *a);
nib_status nib_cuda_act(const nib_act_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
