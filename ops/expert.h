/* expert.h — the persistent action-expert kernel: all layers of one flow-matching step of the
 * Gemma-style action expert (adaRMS, fused QKV + RoPE, attention over the prefix K/V cache plus
 * the step's own tokens, gated residuals, GeGLU MLP) in ONE kernel launch.
 *
 * Why: at batch 1 the per-op path runs ~9 kernels per layer (norm, QKV GEMM, RoPE/cache write,
 * attention, split merge, O GEMM, norm, gate|up GEMM, down GEMM), each a few µs of fixed latency
 * for ~0.5 MB of NVFP4 weights; the step is launch- and latency-bound (docs/design.md). Here one
 * CTA per SM (in pairs that split each GEMM's K) runs the layers as phases separated by
 * grid-wide barriers, and the next layer's weights are prefetched into L2 while the current
 * layer runs. models/pi05.c uses it with NIB_FUSED_STEP=1 at load, where it applies; the per-op path
 * is the default since the fortieth session, faster by then (0.683 against 0.742 ms per step at
 * fast H = 10 on an H100, bench/results/pi05-expert-path-h100.json).
 *
 * Semantics: exactly the per-op sequence of models/pi05.c (fwd_step, one layer):
 *   y = adaRMS(x; scale_a, shift_a)                         (fp64 sum of squares, as ops/norm.h)
 *   qkv = y · Wqkvᵀ  (bf16)         q = RoPE(q) * q_scale, k = RoPE(k)   (as ops/qkv.h, bf16)
 *   o = softmax(q kᵀ) v over keys [0, P) of the cache and the step's own H keys (slots P..P+H-1)
 *   x = bf16(gate_a * (o · Woᵀ) + x)
 *   y = adaRMS(x; scale_m, shift_m)     h = GeGLU(y · Wguᵀ)     x = bf16(gate_m * (h · Wdᵀ) + x)
 * with the same bf16 rounding points as the per-op CUDA path; the fp32 accumulation order, the
 * softmax's split points and exp2f differ (tests/test_pi05_gpu.c compares both paths and the
 * fp32 reference). The step's own K/V are not written to the cache (nothing reads them there).
 *
 * Supported (nib_cuda_expert_supported says which condition fails): NVFP4 weights (QKV, O,
 * gate|up with geglu, down); BF16 KV cache with one KV head; head_dim 256; rows (H) 1..16;
 * the CTAs (one per SM, pairs as thread-block clusters) must all be resident (cooperative launch;
 * fewer pairs are launched if fewer fit).
 * Tested by tests/test_pi05_gpu.c (`nib_tests pi05_gpu`), timed by `nib bench pi05`.
 */
#ifndef NIB_OPS_EXPERT_H
#define NIB_OPS_EXPERT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"
#include "ops/gemm.h"
#include "ops/kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NIB_EXPERT_MAX_ROWS 16
#define NIB_EXPERT_HEAD_DIM 256

typedef struct nib_expert_layer {
    const nib_qweight *qkv, *o, *gu, *down; /* repacked device weights (host structs) */
    nib_kv_layer kv;                        /* the prefix layer's cache this expert layer reads */
} nib_expert_layer;

typedef struct nib_expert_args {
    int32_t n_layers;
    const nib_expert_layer *layers; /* host array [n_layers] */
    int32_t rows;                   /* H: 1 .. NIB_EXPERT_MAX_ROWS */
    int32_t width, mlp, n_heads, head_dim;
    float eps, q_scale;
    const float *mods;       /* device [2 n_layers][3][width]: (scale, shift, gate) of attention, then MLP, per layer */
    const int32_t *t_valid;  /* device int: keys of the attention (P + H) */
    const int32_t *slot_base;/* device int: P, the slot of the step's first token */
    const int32_t *positions;/* device [rows] RoPE positions of the step's tokens */
    const float *inv_freq;   /* device [head_dim / 2] */
    void *x;                 /* device bf16 [rows][width], in and out */
    void *qkv, *o, *h;       /* device bf16 scratch: [rows][(n_heads + 2) head_dim], [rows][n_heads head_dim], [rows][mlp] */
    /* Running beside other work (optional; zero = the whole GPU, as before): */
    int32_t grid;            /* > 0: this many CTAs (even; at most one per SM), launched without the
                              * cooperative attribute and at the highest stream priority, so that
                              * the launch can share the GPU with kernels of another stream; the
                              * CTAs still meet at grid barriers, so every one must get an SM while
                              * the others wait: the work beside it must not wait for this kernel */
    uint32_t *kv_sig;        /* NULL, or device [n_layers * 32] counters (one 128-byte line per
                              * layer): layer l's attention starts only once kv_sig[32 l] reaches
                              * kv_target, i.e. once the kernel that writes that layer's prefix
                              * cache rows (nib_qkv_args.done) has finished them. The kernel resets
                              * every counter to 0 at its end. Pi0.5: the first flow step overlapped
                              * with the prefix. */
    int32_t kv_target;       /* >= 1 with kv_sig: the CTA count of each signalling launch */
    uint32_t *kv_timeout;    /* required with kv_sig: host-mapped (nib_host_mapped_alloc), 0 before the
                              * launch. A counter that has not arrived after NIB_EXPERT_KV_TIMEOUT_NS
                              * (the work that should signal it failed, or kernels are being run one
                              * at a time) is not waited for: the kernel writes layer + 1 here, stops
                              * waiting and finishes with a wrong result, which the caller must
                              * report as an error (never a hang, never a device fault). */
    /* Part of a step (optional; both 0 = every layer): this launch runs layers [layer_begin,
     * layer_end) of the table. A part from layer_begin > 0 continues the launch that ran the
     * layers before it (x holds their output, and the workspace the row statistics of x their last
     * layer wrote, which its first adaRMS reads): so a step in parts gives the bits of one launch
     * on the same CTAs. Pi0.5: the first flow step's first layers beside the prefix on a few CTAs,
     * the rest on the whole GPU after it. */
    int32_t layer_begin, layer_end;
} nib_expert_args;

#define NIB_EXPERT_KV_TIMEOUT_NS 2000000000ull /* 2 s: a whole Pi0.5 call takes ~12 ms */

/* NIB_OK when the persistent kernel can run `a` (with rows as the maximum); otherwise
 * NIB_ERR_UNSUPPORTED naming the condition that fails. Host-side only, no device work. */
nib_status nib_cuda_expert_supported(const nib_expert_args *a);
/* Device workspace for `a` at its maxima (rows, the caches' t_max). Reads only n_layers, rows,
 * n_heads, width and layers[].kv.t_max (the weights may not be loaded yet). */
nib_status nib_cuda_expert_ws_bytes(const nib_expert_args *a, uint64_t *bytes);
/* The CTAs of a whole-GPU launch (one per SM, in resident pairs): the most `grid` may ask for. */
nib_status nib_cuda_expert_grid(const nib_expert_args *a, int32_t *ctas);
/* Write the layer table and reset the grid barrier in `ws` (synchronous; once after loading). */
nib_status nib_cuda_expert_prepare(const nib_expert_args *a, void *ws, uint64_t ws_bytes);
/* Enqueue one step (all layers) on `stream` (capturable). rows may be below the prepared maximum.
 * grid / kv_sig / kv_target / kv_timeout as above (checked here: an odd or too large grid, or kv_sig
 * without a target or a timeout flag, is NIB_ERR_INVALID_ARG). */
nib_status nib_cuda_expert_run(const nib_expert_args *a, void *ws, uint64_t ws_bytes, void *stream);

/* Lab view (NIB_EXPERT_TRACE=1 at run time makes the kernel stamp every barrier): per phase, the
 * work's critical path and the barrier time of the last launch, to `out`. */
nib_status nib_cuda_expert_trace_report(const nib_expert_args *a, void *ws, uint64_t ws_bytes, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
