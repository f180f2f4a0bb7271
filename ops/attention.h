/* attention.h — softmax attention for nib's models: bidirectional prefix self-attention (Gemma
 * prefix, SigLIP) and attention of a few query tokens over one layer's KV cache (the Pi0.5
 * suffix, decoding).
 *
 *   o[row] = sum_j softmax_j(q[row] . k[j]) v[j]       over the visible keys j
 *
 * Queries arrive PRE-SCALED (q already multiplied by head_dim^-0.5), or, for the prefix op,
 * unscaled with the scale in nib_attn_prefix_args.logit_scale, which then multiplies every
 * logit q . k (SigLIP: 1/sqrt(72), which folded into the weights would make the q bias inexact
 * in bf16). The cache op applies no scale.
 * Grouped heads: query head h reads KV head h / (n_heads / n_kv_heads) (MQA: n_kv_heads = 1,
 * MHA: n_kv_heads = n_heads). Every visible key is seen by every valid query (no causal mask).
 *
 * One args struct serves both backends; its void pointers mean:
 *                      reference (ops/ref/attention.c)        CUDA (ops/cuda/attention.cu)
 *   q, o               host float                            device bf16
 *   prefix k, v        host float                            device bf16
 *   cache (kv)         host planes in the stored format      device planes in the stored format
 *   valid-length ints  host int32                            device int32
 * Strides are in ELEMENTS (of float on the host, of bf16 on the device: the same numbers), so
 * q/k/v may point into a fused QKV buffer. Within a token, head h of q/o starts at h * head_dim
 * and KV head g of k/v at g * head_dim.
 *
 * Valid lengths are read through pointers at run time (on the device for CUDA), so one CUDA
 * graph captured at the maximum sizes serves every call. Query rows past the valid count (and
 * whole sequences past n_seq_valid) are NOT written: their outputs keep whatever was there.
 * Keys past the valid length are never read. With zero visible keys a valid row gets o = 0.
 * The reference rejects out-of-range host lengths (NIB_ERR_INVALID_ARG); the CUDA kernels, which
 * cannot report, clamp device lengths into [0, max].
 *
 * Numerics.
 *   Reference: the spec. K/V of a low-bit cache are dequantized exactly (every value is an fp64
 *   number), logits, softmax (online, over key blocks of 64) and P.V are computed in fp64, and
 *   o is stored as float (so it is the exact result to within 2^-24 relative).
 *   CUDA: bf16 tensor-core MMAs (mma.sync m16n8k16, or wgmma m64n64k16 / m64n256k16 for a bf16
 *   K/V at head_dim 256 with more than 64 (prefix) / 128 (cache) query rows per KV head) with fp32
 *   accumulation. Logits, running max,
 *   exp (exp2 of log2e-scaled logits) and sums are fp32. The probabilities are rounded to bf16
 *   for the P.V product (the row sum uses the unrounded fp32 values); o is rounded to bf16.
 *   Low-bit K/V are decoded in shared memory: K exactly to bf16 (FP8: the e4m3 value; NVFP4:
 *   e2m1 * e4m3 block scale * 2^-8) with the per-(token, head) fp32 scale applied to the logit
 *   in fp32, so logits are as exact as with a BF16 cache; V as bf16(decoded value * scale), one
 *   RNE rounding per element, i.e. exactly as if the cache held the dequantized V in bf16. The
 *   GPU is compared with the reference on the same stored bits; its error is that of a bf16
 *   attention over the dequantized cache (test threshold: one more 2^-8 term for V).
 *
 * Split-KV (CUDA). The visible keys are cut into n_splits chunks (n_splits chosen at plan time
 * from the MAXIMUM sizes and the SM count; the chunk length is recomputed on the device from the
 * valid length, see nib_attn_split_range). Each CTA runs an online softmax over its chunk for a
 * block of query rows and, when n_splits > 1, writes (max, sum, normalized partial o) to the
 * workspace; a merge kernel then combines the splits in a fixed order (deterministic):
 *   M = max_s m_s,  w_s = l_s 2^(m_s - M),  o = sum_s w_s o_s / sum_s w_s.
 * Opt-in (NIB_ATTN_VARIANT=cl or NIB_ATTN_CLUSTER=8|16; measured slower than the default on the
 * Pi0.5 suffix, see ops/cuda/attention.cu): cache path with <= 128 query rows per KV head, the
 * splits are the 16 (or 8) CTAs of one thread-block cluster, the tiles dealt out evenly, and the
 * same merge runs inside the cluster over distributed shared memory (each CTA combines every
 * n_splits-th row), so there is neither a workspace nor a merge kernel.
 * The workspace must be at least nib_cuda_attn_*_ws_bytes() bytes (0 means none is needed and
 * ws may be NULL), 256-byte aligned, and not used by anything else while the call runs on its
 * stream; it needs no initialization and holds nothing between calls. Calls allocate nothing.
 *
 * Tested by tests/test_attention_ref.c (CPU) and tests/test_attention_gpu.c (`nib_tests attn`),
 * timed by `nib bench attn`.
 */
#ifndef NIB_OPS_ATTENTION_H
#define NIB_OPS_ATTENTION_H

#include <stdint.h>

#include "base/base.h"
#include "ops/kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- (a)/(b) prefix self-attention: Gemma prefix (MQA, D 256), SigLIP (MHA, D 72) --------
 * q, o : [n_seq][s_max][n_heads][head_dim]     strides q_seq/o_seq, q_tok/o_tok
 * k, v : [n_seq][s_max][n_kv_heads][head_dim]  strides k_seq/v_seq, k_tok/v_tok
 * Sequence n (an image for SigLIP) attends only within itself: its first s_valid tokens attend
 * to its first s_valid tokens, bidirectionally. Fused QKV [tok][(n_heads + 2 n_kv) * D]:
 * q = qkv, k = qkv + n_heads*D, v = qkv + (n_heads + n_kv)*D, q_tok = k_tok = v_tok = row length.
 * CUDA constraints: head_dim a multiple of 8 and <= 256 (tuned for 72 and 256); q, k, v, o
 * 16-byte aligned; every stride a multiple of 8 elements; o must not overlap q, k or v. */
typedef struct nib_attn_prefix_args {
    const void *q, *k, *v;
    void *o;
    int64_t q_tok, k_tok, v_tok, o_tok; /* elements between consecutive tokens */
    int64_t q_seq, k_seq, v_seq, o_seq; /* elements between consecutive sequences (n_seq > 1) */
    int32_t n_seq;                      /* sequences (images) per call, the launch size */
    int32_t s_max;                      /* tokens per sequence, the launch size */
    int32_t n_heads, n_kv_heads, head_dim;
    const int32_t *s_valid;             /* 1 int: valid tokens of every sequence; NULL = s_max */
    const int32_t *n_seq_valid;         /* 1 int: sequences to compute; NULL = n_seq */
    float logit_scale;                  /* multiplies every logit q . k; 0 (or 1) = none, i.e. q
                                           arrives pre-scaled. Finite and >= 0 (else
                                           NIB_ERR_INVALID_ARG). Reference: q times the scale in
                                           fp64; CUDA: the fp32 logit times fp32(scale * log2 e)
                                           in the exp2 argument (no extra rounding step). */
} nib_attn_prefix_args;

/* ---- (c)/(d) attention over one layer's KV cache: Pi0.5 suffix, decoding --------------------
 * q, o : [nq][n_heads][head_dim], strides q_tok/o_tok. kv: one layer (ops/kvcache.h), any
 * dtype; slots 0..t_valid-1 are visible to every query (for the Pi0.5 suffix that is
 * [prefix || the suffix's own K/V], written by the QKV epilogue before this call).
 * Decoding is this op with nq = 1 (the planner picks a 1-row-block, 2-warp-per-row kernel).
 * CUDA constraints: head_dim 256; q, o 16-byte aligned, q_tok and o_tok multiples of 8. */
typedef struct nib_attn_cache_args {
    const void *q;
    void *o;
    int64_t q_tok, o_tok;
    int32_t nq;                  /* query tokens, the launch size */
    int32_t n_heads;             /* kv.n_kv_heads must divide it; head_dim = kv.head_dim */
    nib_kv_layer kv;             /* the layer's planes (t_max = launch size of the key axis) */
    const int32_t *t_valid;      /* 1 int: visible slots (required) */
    const int32_t *nq_valid;     /* 1 int: valid query tokens; NULL = nq */
    int32_t lens_settled;        /* 1: *t_valid and *nq_valid were written by an upload, or by a kernel at least two
                                    launches before this call, and nothing writes them until it ends
                                    (runtime/launch.cuh, rule 1b): the decode kernel then reads them before its
                                    PDL wait (unless NIB_ATTN_LENS_EARLY=0). 0 (the default): after it */
} nib_attn_cache_args;

/* ---- reference backend (host) -------------------------------------------------------------
 * Errors: NIB_ERR_INVALID_ARG (NULL pointer, bad count or length, n_kv_heads not dividing
 * n_heads, strides smaller than a token's heads), NIB_ERR_SHAPE (cache head_dim not a multiple
 * of 16), NIB_ERR_OUT_OF_MEMORY. */
nib_status nib_ref_attn_prefix(const nib_attn_prefix_args *a);
nib_status nib_ref_attn_cache(const nib_attn_cache_args *a);

/* ---- CUDA backend ------------------------------------------------------------------------
 * Enqueue on `stream` (cudaStream_t or NULL); asynchronous; capturable into a CUDA graph. The
 * first plan of each kernel variant (any of the calls below) queries the device and sets the
 * kernel's shared-memory attribute: make one ws_bytes/plan query per shape before capturing.
 * Errors: NIB_ERR_INVALID_ARG, NIB_ERR_SHAPE (alignment / stride rules above),
 * NIB_ERR_UNSUPPORTED (head_dim), NIB_ERR_NO_DEVICE (CPU-only build), NIB_ERR_CUDA. */
nib_status nib_cuda_attn_prefix(const nib_attn_prefix_args *a, void *ws, void *stream);
nib_status nib_cuda_attn_cache(const nib_attn_cache_args *a, void *ws, void *stream);
/* decode-kernel launches that read their lengths before the PDL wait (lens_settled, unless NIB_ATTN_LENS_EARLY=0) */
long long nib_cuda_attn_lens_early_launches(void);
/* Workspace bytes a call with these (maximum) sizes needs; pointers are not read. */
nib_status nib_cuda_attn_prefix_ws_bytes(const nib_attn_prefix_args *a, uint64_t *bytes);
nib_status nib_cuda_attn_cache_ws_bytes(const nib_attn_cache_args *a, uint64_t *bytes);

/* The launch plan a call would use (for the lab and tests). */
typedef struct nib_attn_plan {
    char kernel[48];        /* "<kv dtype> d<padded head_dim> <variant dec|r4|r8|cl|rk|wg1|wg|...> tk<tile keys>" */
    int rows_per_cta;       /* query rows (token x head of one KV group) per CTA */
    int warps;              /* warps per CTA: row groups x token groups */
    int tile_tokens;        /* keys per pipeline tile */
    int n_splits;           /* CTAs along the key axis (1: no merge kernel; cl: one cluster, merged
                               in distributed shared memory, no merge kernel, no workspace) */
    int row_blocks;         /* CTAs along the query rows */
    int z;                  /* CTAs along (sequence, KV head) */
    int ctas;               /* row_blocks * n_splits * z */
    int ctas_per_sm;        /* occupancy of the attention kernel */
    uint64_t smem_bytes;    /* dynamic shared memory per CTA */
    uint64_t ws_bytes;
} nib_attn_plan;
nib_status nib_cuda_attn_prefix_plan(const nib_attn_prefix_args *a, nib_attn_plan *p);
nib_status nib_cuda_attn_cache_plan(const nib_attn_cache_args *a, nib_attn_plan *p);

/* ---- split-KV ranges (shared by the kernels, the merge and the tests) ---------------------
 * With t visible keys, n_splits splits and tiles of tk keys: chunk = tk * ceil(ceil(t /
 * n_splits) / tk) keys per split, split s covers [s * chunk, min((s + 1) * chunk, t)), and the
 * splits with s < n_active are the non-empty ones (n_active = ceil(t / chunk) <= n_splits).
 * t = 0 gives one active, empty split 0 (its rows produce o = 0). Returns n_active. */
#if defined(__CUDACC__)
#define NIB_ATTN_HD static __host__ __device__ __forceinline__
#else
#define NIB_ATTN_HD static inline
#endif
NIB_ATTN_HD int32_t nib_attn_split_range(int32_t t, int32_t n_splits, int32_t tk, int32_t s,
                                         int32_t *t0, int32_t *t1) {
    if (t <= 0) {
        *t0 = *t1 = 0;
        return 1;
    }
    int32_t per = (t + n_splits - 1) / n_splits;
    int32_t chunk = (per + tk - 1) / tk * tk;
    int32_t lo = s * chunk; /* s < n_splits and chunk <= t + tk - 1: no overflow below 2^30 */
    *t0 = lo < t ? lo : t;
    *t1 = lo + chunk < t ? lo + chunk : t;
    return (t + chunk - 1) / chunk;
}

#ifdef __cplusplus
}
#endif
#endif /* NIB_OPS_ATTENTION_H */
