/* rope.h — rotary position embedding, in place on [tokens][heads][head_dim] activations.
 *
 * Backends: nib_ref_rope (ops/ref/rope.c, host float: the spec) and nib_cuda_rope
 * (ops/cuda/rope.cu, device bf16, fp32 math). The fused QKV epilogue (ops/qkv.h) applies the
 * same rotation with the same arithmetic.
 *
 * Styles, over the first rot_dim dims of every head (dims >= rot_dim pass through untouched):
 *   NIB_ROPE_HALF        rotate-half (Gemma, GPT-NeoX): pair i is (i, i + rot_dim/2)
 *   NIB_ROPE_INTERLEAVED GPT-J: pair i is (2i, 2i + 1)
 * for i < rot_dim/2, with frequency inv_freq[i] for both styles.
 *
 * Arithmetic (identical in both backends; each fp32 operation rounded separately, no FMA):
 *   inv_freq[i] = fp32( theta^(-2i / rot_dim) )         table from nib_rope_inv_freq(), once
 *   ang         = fp32( (float)position * inv_freq[i] ) the fp32 angle of openpi / HF
 *   c, s        = fp32( cos(ang) ), fp32( sin(ang) )    evaluated in fp64, rounded once;
 *                                                        inverse: s = -s (rotate by -angle)
 *   out_a = a*c - b*s,  out_b = b*c + a*s                (a, b) = (x[pair.0], x[pair.1])
 *   stored as float (reference) or RNE bf16 (GPU).
 * Why fp64 sin/cos: CUDA's fp32 sinf/cosf are within 2 ulp and glibc's within 1, so fp32
 * evaluation would differ between backends by an ulp routinely; evaluated in fp64 (CUDA within
 * 2 fp64 ulp, glibc within 1) and rounded once, both give the correctly rounded fp32 sin/cos of
 * the same fp32 angle except when it lies within ~2^-51 of an fp32 rounding midpoint (~1 value
 * in 10^8). So the rotated values — and the FP8/NVFP4 K-cache codes made from them — match the
 * reference bit for bit in practice. The angle itself is fp32 as in openpi (JAX computes
 * positions / timescale in fp32, HF inv_freq * position in fp32); its rounding (~|ang| 2^-24)
 * is part of the spec, not an error between backends.
 * The frequency table is an argument (not recomputed per call) so that no pow() sits on the
 * kernel's critical path and both backends read the same fp32 frequencies.
 */
#ifndef NIB_OPS_ROPE_H
#define NIB_OPS_ROPE_H

#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nib_rope_style {
    NIB_ROPE_HALF = 0,        /* rotate-half: pairs (i, i + rot/2) — Gemma, Pi0.5 */
    NIB_ROPE_INTERLEAVED = 1, /* GPT-J: pairs (2i, 2i + 1) */
    NIB_ROPE_STYLE_COUNT
} nib_rope_style;

#define NIB_ROPE_THETA 10000.0f  /* Gemma / Pi0.5 */
#define NIB_ROPE_MAX_ROT 4096

/* inv_freq[i] = fp32(pow((double)theta, -(double)(2 i) / rot_dim)) for i < rot_dim / 2 (host
 * memory; upload it for the GPU). theta finite > 0, rot_dim even in [2, NIB_ROPE_MAX_ROT]. */
nib_status nib_rope_inv_freq(float theta, int32_t rot_dim, float *inv_freq);

typedef struct nib_rope_args {
    nib_rope_style style;
    int inverse;              /* 1: rotate by -angle (undoes a forward call up to rounding) */
    int64_t tokens;           /* rows the buffer holds: the kernel covers this many */
    const int32_t *n_valid;   /* optional int32 (device for CUDA, host for ref): tokens >=
                                 *n_valid are untouched (clamped to [0, tokens]); NULL = all */
    int32_t n_heads;          /* >= 1 */
    int32_t head_dim;         /* >= 2 */
    int32_t rot_dim;          /* even, 2 .. min(head_dim, NIB_ROPE_MAX_ROT) (Gemma: = head_dim) */
    const int32_t *positions; /* [tokens] int32 (device for CUDA) */
    const float *inv_freq;    /* [rot_dim / 2] fp32 (device for CUDA): nib_rope_inv_freq() */
    void *x;                  /* [tokens][ld] (ref: float, CUDA: bf16), in place: head h of
                                 token t starts at element t * ld + h * head_dim */
    int64_t ld;               /* >= n_heads * head_dim (e.g. the fused QKV row width) */
} nib_rope_args;

/* Shared argument checks: NIB_ERR_SHAPE / NIB_ERR_INVALID_ARG naming `who` and the numbers. */
nib_status nib_rope_validate(const nib_rope_args *a, const char *who);

nib_status nib_ref_rope(const nib_rope_args *a);
/* GPU paths: 16-byte vectors when rot_dim % 16 == 0 (HALF) or % 8 == 0 (INTERLEAVED), head_dim
 * and ld multiples of 8 and x 16-byte aligned; otherwise a scalar path (same arithmetic). */
nib_status nib_cuda_rope(const nib_rope_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
