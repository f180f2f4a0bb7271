/* edge.h — the flow step's edge in one op: the action expert's output of step s and the input of
 * step s + 1, which the per-op Pi0.5 step otherwise runs as six kernels (the final adaRMS, the
 * action-out product, its x_t update, x_t to the activation dtype, the action-in product, and the
 * first layer's input adaRMS). Per row r (a token), in this order:
 *
 *   OUT (mode bit 1):
 *     y   = adaRMS(x [, residual, res_gate]; fscale, fshift)   exactly ops/norm.h's ADARMS, h not
 *                                                              stored; y in the activation dtype
 *     v_j = act( sum_d y_d * w_out[j][d] + b_out[j] )          j < adim (dt is folded into w_out,
 *                                                              b_out by the caller)
 *     xt[r][j] = xt[r][j] + v_j                                fp32
 *   IN (mode bit 2), after OUT when both are set:
 *     a_k = act( xt[r][k] )                                    k < adim
 *     h_n = act( sum_k a_k * w_in_t[k][n] + b_in[n] )          n < dim: stored into h
 *     y2  = adaRMS(h; nscale, nshift)                          ops/norm.h's ADARMS: stored into y
 *
 * "act" is the activation dtype: float on the reference (no rounding), bf16 on the GPU (RNE). The
 * reference (ops/ref/edge.c) accumulates the products in fp64 and rounds once to fp32; the GPU
 * accumulates in fp32 (each row's sums in a fixed order: deterministic). The norms are ops/norm.h's
 * arithmetic on both backends (the GPU's bitwise k_norm's, given the same h).
 *
 * Weights: w_out [adim][dim] and w_in_t [adim][dim] (action_in_proj's [dim][adim] weight transposed,
 * so that both are read along dim), in the activation dtype; b_out [adim], b_in [dim] fp32 (or NULL:
 * zero). All pointers are device memory on CUDA (host on the reference).
 * Shapes: 1 <= adim <= NIB_EDGE_MAX_ADIM; dim a multiple of 8 (CUDA: at most 2048, and the weights of
 * the mode within NIB_EDGE_MAX_SMEM bytes of shared memory: nib_edge_supported says). The row strides are >= dim (ldxt >= adim); on the GPU the bf16 rows start
 * on 16-byte boundaries (strides multiples of 8) and the fp32 vectors are 16-byte aligned.
 * Aliasing: h may be the residual or x (each row is read before it is written), y may be x or the
 * residual; h and y must not overlap; xt overlaps nothing.
 * CUDA: one CTA per row, enqueued on `stream`; the weights are staged into shared memory before the
 * PDL wait (runtime/launch.cuh rule 1: they are load-time constants); graph-capturable.
 */
#ifndef NIB_OPS_EDGE_H
#define NIB_OPS_EDGE_H

#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NIB_EDGE_OUT 1
#define NIB_EDGE_IN 2
#define NIB_EDGE_MAX_ADIM 32
#define NIB_EDGE_MAX_SMEM (160 * 1024)

typedef struct nib_edge_args {
    int mode;              /* NIB_EDGE_OUT, NIB_EDGE_IN or both */
    int64_t rows, dim, adim;
    float eps;             /* both norms' (Pi0.5: NIB_NORM_EPS) */
    /* OUT */
    const void *x;         /* [rows][ldx] act: the final norm's input */
    int64_t ldx;
    const void *residual;  /* optional [rows][ldr] act: h = x (* res_gate) + residual, not stored */
    int64_t ldr;
    const float *res_gate; /* optional [dim], with a residual only */
    const float *fscale, *fshift; /* [dim] */
    const void *w_out;     /* [adim][dim] act */
    const float *b_out;    /* [adim] or NULL */
    float *xt;             /* [rows][ldxt] fp32: updated by OUT, read by IN */
    int64_t ldxt;
    /* IN */
    const void *w_in_t;    /* [adim][dim] act */
    const float *b_in;     /* [dim] or NULL */
    void *h;               /* [rows][ldh] act */
    int64_t ldh;
    const float *nscale, *nshift; /* [dim] */
    void *y;               /* [rows][ldy] act */
    int64_t ldy;
} nib_edge_args;

/* The checks both backends share: NIB_ERR_INVALID_ARG / NIB_ERR_SHAPE naming the field. */
nib_status nib_edge_validate(const nib_edge_args *a, const char *who);
/* Reference: host float activations. */
nib_status nib_ref_edge(const nib_edge_args *a);
/* Whether the CUDA kernel takes this mode, dim and adim (NIB_OK, or NIB_ERR_SHAPE saying why). */
nib_status nib_edge_supported(int mode, int64_t dim, int64_t adim);
/* CUDA: device bf16 activations, enqueued on `stream`; a CPU-only build returns NIB_ERR_NO_DEVICE. */
nib_status nib_cuda_edge(const nib_edge_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
