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
 * Strides in elements. H is a multiple of 8. Gated: ldx >= 2H; GELU: ldx >= H; ldy >= H. On the
 * GPU ldx and ldy are multiples of 8 and x, y 16-byte aligned. y may be x (in place, ldy ==
 * ldx); otherwise they must not overlap.
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

typedef struct nib_act_args {
    nib_act_kind kind;
    int64_t rows;           /* rows the buffers hold: the kernel covers this many */
    const int32_t *n_valid; /* optional int32 (device for CUDA, host for ref): rows >= *n_valid
                               are untouched (clamped to [0, rows]); NULL = all */
    int64_t h;              /* output columns H: a multiple of 8 */
    const void *x;          /* [rows][ldx] (ref: float, CUDA: bf16): gate | up, or x for GELU */
    int64_t ldx;
    void *y;                /* [rows][ldy] (ref: float, CUDA: bf16) */
    int64_t ldy;
} nib_act_args;

/* Shared argument checks: NIB_ERR_SHAPE / NIB_ERR_INVALID_ARG naming `who` and the numbers. */
nib_status nib_act_validate(const nib_act_args *a, const char *who);

nib_status nib_ref_act(const nib_act_args *a);
nib_status nib_cuda_act(const nib_act_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
