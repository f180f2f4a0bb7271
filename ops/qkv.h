/* qkv.h — the fused QKV epilogue (RoPE + q scaling + KV-cache write in one pass over the fused
 * QKV GEMM output), the plain KV-cache write, and a KV-cache read-back helper for tests.
 *
 * Backends: nib_ref_* (ops/ref/qkv.c, host float activations: the spec, composed of
 * nib_ref_rope and formats/' quantizers) and nib_cuda_* (ops/cuda/qkv.cu, device bf16, fp32
 * math). The cache layout and its FP8/NVFP4 scale semantics are those of ops/kvcache.h.
 *
 * Fused epilogue, per token t < n_valid (Gemma: 8 q heads, 1 kv head, head_dim 256):
 *   row    = qkv[t]: q heads [0, nh*hd), k heads [nh*hd, (nh+nkv)*hd), v heads after them
 *   q_h    = RoPE(q_h) * q_scale     rotate-half over the full head_dim, positions[t], the
 *                                    arithmetic of ops/rope.h; then one fp32 multiply
 *   k_h    = RoPE(k_h)               same rotation, no scale
 *   q[t]   <- q_h (activation dtype: RNE bf16 on the GPU)       (skipped when q is NULL)
 *   cache slot s = slot_offset + (slot_base ? *slot_base : 0) + t, head h:
 *          K <- k_h, V <- v_h converted from fp32 in the same pass:
 *          BF16  RNE bf16
 *          FP8   formats' nib_fp8_quantize(vec, 1, head_dim, per_channel = 1): scale = amax/448
 *                (>= FLT_MIN; 1 for an all-zero vector), code = e4m3(x / scale)
 *          NVFP4 formats' nib_nvfp4_quantize(vec, 1, head_dim): global = amax/2688 (>= 2^-117;
 *                1 for all-zero) into ks/vs, E4M3 block scales per 16, E2M1 codes
 *          The K vector quantized is the fp32 RoPE output (not its bf16 rounding); V is the
 *          bf16 input. The GPU writes the same bits as the reference (the same fp32 operations;
 *          the amax is order-independent), up to the ~1-in-10^8 sin/cos rounding case of
 *          ops/rope.h.
 * Slots outside [0, t_max): the reference fails with NIB_ERR_SHAPE before writing anything;
 * the GPU checks slot_offset + tokens <= t_max on the host when slot_base is NULL and otherwise
 * skips out-of-range slots on the device (it cannot report them).
 *
 * Pi0.5: prefix layer l: tokens = P_max, n_valid = device valid prefix length, slot_offset 0.
 * Prefix layer 18 needs K/V only: q = NULL. Action expert: tokens = H (10) with positions
 * P_valid + [0, H), written after the prefix either at fixed slots (slot_offset = P_max) or
 * right after the valid prefix (slot_offset = 0, slot_base = device P_valid) — whichever the
 * attention kernel reads; every Euler step rewrites the same slots.
 *
 * GPU requirements: head_dim a power of two in [32, 512] (Gemma 256), (n_heads + 2 n_kv_heads)
 * * head_dim / 16 <= 1024 (one CTA per token, one thread per 8 rotation pairs), row strides
 * multiples of 8 and bf16 pointers 16-byte aligned. The reference accepts exactly the same
 * arguments (shared validation). q must not overlap qkv or the cache.
 */
#ifndef NIB_OPS_QKV_H
#define NIB_OPS_QKV_H

#include <stdint.h>

#include "base/base.h"
#include "nib.h"
#include "ops/kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nib_qkv_args {
    int64_t tokens;           /* T: rows of qkv (and q) the kernel covers */
    const int32_t *n_valid;   /* optional int32 (device for CUDA, host for ref): tokens >=
                                 *n_valid write nothing (clamped to [0, T]); NULL = all */
    int32_t n_heads;          /* query heads (>= 0; 0 = K/V only) */
    int32_t n_kv_heads;       /* >= 1; must equal cache->n_kv_heads when a cache is given */
    int32_t head_dim;         /* power of two, 32 .. 512; must equal cache->head_dim */
    const void *qkv;          /* [T][ld_qkv] (ref: float, CUDA: bf16), heads as above */
    int64_t ld_qkv;           /* >= (n_heads + 2 n_kv_heads) * head_dim */
    const int32_t *positions; /* [T] int32 RoPE positions (device for CUDA) */
    const float *inv_freq;    /* [head_dim / 2] fp32 (device for CUDA):
                                 nib_rope_inv_freq(NIB_ROPE_THETA, head_dim, ...) */
    float q_scale;            /* multiplies q after RoPE: head_dim^-0.5 (Gemma: 0.0625) */
    void *q;                  /* optional [T][ld_q] (ref: float, CUDA: bf16); head h at h * hd */
    int64_t ld_q;             /* >= n_heads * head_dim */
    const nib_kv_layer *cache; /* optional (host struct; planes in device memory for CUDA) */
    int32_t slot_offset;      /* token t goes to slot slot_offset + (*slot_base) + t */
    const int32_t *slot_base; /* optional int32 (device for CUDA, host for ref); NULL = 0 */
    uint32_t *done;           /* optional, CUDA only (the reference ignores it): a device counter to
                                 which every CTA of the launch (one per token of `tokens`, so
                                 `tokens` in all, >= 1) adds 1 with release semantics after its
                                 q / K / V writes. A kernel running BESIDE this one (another
                                 stream) that sees `tokens` there (and then fences) reads the
                                 cache rows. Pi0.5: the persistent expert's first step, overlapped
                                 with the prefix (ops/expert.h kv_sig). Whoever waits resets it. */
    int32_t pairs;            /* 0: each head's dims in order. 1: the pair layout of a GEMM whose weight
                                 rows were loaded with nib_wsrc.rope_half = head_dim / 2 (ops/gemm.h):
                                 in every head, element 16j + i (i < 8) is dim 8j + i and element
                                 16j + 8 + i is dim head_dim / 2 + 8j + i (rotate-half partners side by
                                 side). Both backends read qkv in that order; q and the cache are
                                 written in the plain order either way. */
    const void *rope_cs;      /* optional, CUDA only: the (cos, sin) of every token's positions,
                                 [tokens][head_dim / 2] float2 from nib_cuda_rope_table on the same
                                 positions and inv_freq. The fused GEMM epilogue (nib_cuda_gemm_qkv)
                                 needs it; nib_cuda_qkv computes its own. */
} nib_qkv_args;

/* Plain K/V write (no RoPE): k and v rows of n_kv_heads * head_dim values (the cache's shape). */
typedef struct nib_kv_write_args {
    int64_t tokens;           /* T */
    const int32_t *n_valid;   /* optional, as above */
    const void *k;            /* [T][ld_k] (ref: float, CUDA: bf16) */
    int64_t ld_k;             /* >= n_kv_heads * head_dim */
    const void *v;            /* [T][ld_v] */
    int64_t ld_v;
    const nib_kv_layer *cache; /* required */
    int32_t slot_offset;
    const int32_t *slot_base; /* optional, as above */
} nib_kv_write_args;

/* Read slots back, dequantized: out[n_slots][n_kv_heads][head_dim] = value of slot slot0 + i.
 * BF16: the value; FP8: e4m3 * scale; NVFP4: (e2m1 * e4m3) * global (formats' dequantizers:
 * one fp32 rounding, identical in both backends). */
typedef struct nib_kv_read_args {
    const nib_kv_layer *cache;
    int which;                /* 0 = K, 1 = V */
    int32_t slot0, n_slots;   /* [slot0, slot0 + n_slots) within [0, t_max) */
    void *out;                /* ref: host float; CUDA: device, out_dtype */
    nib_dtype out_dtype;      /* CUDA: NIB_DTYPE_F32 or NIB_DTYPE_BF16; ref: NIB_DTYPE_F32 */
} nib_kv_read_args;

/* Shared argument checks: NIB_ERR_SHAPE / NIB_ERR_INVALID_ARG naming `who` and the numbers. */
nib_status nib_qkv_validate(const nib_qkv_args *a, const char *who);
nib_status nib_kv_write_validate(const nib_kv_write_args *a, const char *who);
nib_status nib_kv_read_validate(const nib_kv_read_args *a, const char *who);

nib_status nib_ref_qkv(const nib_qkv_args *a);
nib_status nib_ref_kv_write(const nib_kv_write_args *a);
nib_status nib_ref_kv_read(const nib_kv_read_args *a);

/* Enqueued on `stream`; no allocation or synchronization (graph-capturable). */
nib_status nib_cuda_qkv(const nib_qkv_args *a, void *stream);
nib_status nib_cuda_kv_write(const nib_kv_write_args *a, void *stream);
nib_status nib_cuda_kv_read(const nib_kv_read_args *a, void *stream);
/* out[t][f] = (cos, sin) of the fp32 angle positions[t] * inv_freq[f], f < head_dim / 2, computed
 * exactly as nib_cuda_qkv computes them (fp64 sincos rounded to fp32), so a GEMM epilogue that
 * rotates with the table writes k_qkv's bits. out: device float2 [tokens][head_dim / 2]. */
nib_status nib_cuda_rope_table(const int32_t *positions, const float *inv_freq, int64_t tokens, int32_t head_dim,
                               void *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
