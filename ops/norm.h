/* norm.h — the normalizations of Pi0.5: Gemma RMSNorm, SigLIP LayerNorm and Pi0.5 adaRMSNorm,
 * each with an optional fused residual add before the norm and an optional FP8 output (e4m3
 * codes + one fp32 scale per row) for the FP8 GEMM that follows.
 *
 * Backends: nib_ref_norm (ops/ref/norm.c, host float activations: the spec) and nib_cuda_norm
 * (ops/cuda/norm.cu, device bf16 activations, fp32 math). Both take the same args struct.
 *
 * Per row r (a token) and column d < dim, with every fp32 operation rounded separately (no
 * FMA contraction) in the order written:
 *   h_d  = x_d + residual_d     (residual given; else h = x; with res_gate, h_d = (x_d * g_d) +
 *                               residual_d: the gated residual of the layer before, deferred
 *                               into this norm). h is STORED in the activation
 *                               dtype (float in the reference, bf16 on the GPU) into h_out, or
 *                               back into residual when h_out is NULL, and the norm reads the
 *                               stored h: fused add+norm == add, then norm of what was stored.
 *   RMS:    ms   = fp32( sum_d h_d^2 / dim )           sum and quotient in fp64, rounded once
 *           inv  = 1 / sqrt(ms + eps)                   fp32, IEEE sqrt and division
 *           y_d  = (h_d * inv) * (1 + w_d)              w NULL: y_d = h_d * inv
 *   LAYER:  mean = sum_d h_d / dim                      fp64
 *           var  = sum_d (h_d - mean)^2 / dim           fp64, two passes
 *           mu   = fp32(mean);  rstd = 1 / sqrt(fp32(var) + eps)
 *           y_d  = ((h_d - mu) * rstd) * w_d + b_d      w NULL: no multiply; b NULL: no add
 *   ADARMS: ms, inv as RMS;  y_d = (h_d * inv) * (1 + scale_d) + shift_d
 * Outputs (at least one): y in the activation dtype (bf16 on the GPU: RNE of the fp32 y), and
 * FP8: s = amax_d |y_d| / 448 raised to at least FLT_MIN (1 for an all-zero row), code_d =
 * e4m3(y_d / s) (IEEE division, RNE, saturating) — exactly formats' nib_fp8_quantize(y_row, 1,
 * dim, per_channel = 1, ...) applied to the fp32 y (not to the bf16 y).
 *
 * Why fp64 sums: h^2 of a float is exact in fp64 and an fp64 sum of <= 8192 such terms is
 * within ~2^-40 (relative) of the exact sum whatever the order, so the reference's sequential
 * sum and the GPU's tree sum round to the same fp32 statistic except when it lies within ~2^-40
 * of an fp32 rounding midpoint (< 1 row in 10^4 at worst, ~1 in 10^6 typically). From there
 * every operation is identical, so GPU and reference y (and FP8 codes) agree bit for bit in
 * practice, and the tests can tell a real bug from reduction-order noise. The statistic is
 * still the fp32 one of openpi (fp32 `mean(x^2)` in JAX), only more accurately summed.
 *
 * Shapes and strides (elements): dim is a multiple of 8 in [8, 8192] (1024: Gemma-300M,
 * 1152: SigLIP, 2048: Gemma-2B). Row strides ld* >= dim. On the GPU the bf16 row strides must
 * be multiples of 8 and the bf16 pointers 16-byte aligned (16-byte vector loads); ldq a
 * multiple of 8 and y_q 8-byte aligned; the fp32 vectors w, b, scale, shift 16-byte aligned.
 * Aliasing: y may be x (in place, ldy == ldx); h_out may be x (ldh == ldx). y must not overlap
 * the h destination; nothing else may overlap.
 * Rows: the call covers `rows` rows (the buffers' capacity); with n_valid, rows >= *n_valid are
 * neither read nor written (one CUDA graph serves every valid count).
 */
#ifndef NIB_OPS_NORM_H
#define NIB_OPS_NORM_H

#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nib_norm_kind {
    NIB_NORM_RMS = 0,    /* Gemma RMSNorm; w may be NULL (its (1+w) folded into the next weight) */
    NIB_NORM_LAYER = 1,  /* LayerNorm (SigLIP): weight and bias */
    NIB_NORM_ADARMS = 2, /* Pi0.5 adaRMSNorm with precomputed per-column scale and shift */
    NIB_NORM_KIND_COUNT
} nib_norm_kind;

#define NIB_NORM_EPS 1e-6f     /* every Pi0.5 norm (Gemma RMSNorm, adaRMS, SigLIP LayerNorm) */
#define NIB_NORM_MAX_DIM 8192

typedef struct nib_norm_args {
    nib_norm_kind kind;
    int64_t rows;            /* rows (tokens) the buffers hold: the kernel covers this many */
    int64_t dim;             /* columns: multiple of 8, 8 .. NIB_NORM_MAX_DIM */
    const int32_t *n_valid;  /* optional int32 (device memory for CUDA, host for ref): rows >=
                                *n_valid are untouched (clamped to [0, rows]); NULL = all */
    float eps;               /* > 0: NIB_NORM_EPS for every Pi0.5 norm */

    const void *x;           /* [rows][ldx] activations (ref: float, CUDA: bf16) */
    int64_t ldx;
    void *residual;          /* optional [rows][ldr] activations: h = x + residual */
    int64_t ldr;
    void *h_out;             /* optional [rows][ldh]: where h is stored; NULL = into residual */
    int64_t ldh;
    const float *res_gate;   /* optional [dim] fp32 (device memory for CUDA, 16-byte aligned),
                                with a residual only: h = (x * res_gate) + residual */

    const float *w;          /* [dim] fp32 on both backends (device memory for CUDA). RMS: the
                                Gemma w of (1 + w), may be NULL; LAYER: gamma, NULL = 1;
                                ADARMS: must be NULL */
    const float *b;          /* [dim] fp32, LAYER only: beta, NULL = 0 */
    const float *scale;      /* [dim] fp32, ADARMS only (required): y *= 1 + scale */
    const float *shift;      /* [dim] fp32, ADARMS only (required): y += shift */

    void *y;                 /* optional [rows][ldy] activations: the normalized output */
    int64_t ldy;
    uint8_t *y_q;            /* optional [rows][ldq] e4m3 codes of y */
    int64_t ldq;
    float *y_scale;          /* [rows] fp32 per-row scale of y_q (required with y_q) */
} nib_norm_args;

/* Argument checks shared by both backends (shapes, required pointers, kind-specific fields).
 * NIB_ERR_SHAPE / NIB_ERR_INVALID_ARG with a message naming `who` and the numbers. */
nib_status nib_norm_validate(const nib_norm_args *a, const char *who);

/* Reference: host float activations. NIB_ERR_NUMERICS if y_q is asked for and y has NaN/Inf. */
nib_status nib_ref_norm(const nib_norm_args *a);
/* CUDA: device bf16 activations, enqueued on `stream` (cudaStream_t or NULL); no allocation, no
 * synchronization, graph-capturable. A CPU-only build returns NIB_ERR_NO_DEVICE. */
nib_status nib_cuda_norm(const nib_norm_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
