/* backend.h — what a model is written against. One interface, two backends:
 *
 *   NIB_BE_REF   host memory, float activations, ops/ref (the spec; multithreaded fp32 GEMM)
 *   NIB_BE_CUDA  device memory, bf16 activations, ops/cuda and cuBLASLt, one stream; every
 *                call is enqueued (nothing synchronizes, nothing allocates) so a whole model
 *                call can be captured into one CUDA graph
 *
 * Memory: a weight slab and an activation arena per backend, sized by the model at plan time
 * (bump allocation; nothing is freed individually). Pointers handed to ops are backend memory.
 * The op wrappers take the ops' own args structs (ops/<op>.h) and dispatch to the backend's twin.
 */
#ifndef NIB_RUNTIME_BACKEND_H
#define NIB_RUNTIME_BACKEND_H

#include <stdint.h>

#include "base/base.h"
#include "ops/act.h"
#include "ops/attention.h"
#include "ops/edge.h"
#include "ops/expert.h"
#include "ops/gemm.h"
#include "ops/kvcache.h"
#include "ops/misc.h"
#include "ops/norm.h"
#include "ops/numerics.h"
#include "ops/qkv.h"
#include "ops/rope.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nib_be_kind { NIB_BE_REF = 0, NIB_BE_CUDA = 1 } nib_be_kind;

/* A linear layer Y = X·Wᵀ (+ bias, fused epilogues) prepared for one backend. */
typedef struct nib_be_linear {
    int64_t n, k, n_out;
    int geglu;
    nib_wfmt fmt;      /* storage format (CUDA); the reference always holds fp32 */
    int w8a8;          /* CUDA FP8: per-token activation quantization + cuBLASLt */
    float *w32;        /* REF: [n][k] fp32 (the exactly dequantized weight) */
    float *bias;       /* [n] fp32 or NULL (host for REF, device for CUDA) */
    void *bias16;      /* CUDA: bf16 copy of bias when every value is exact in bf16 (the cuBLASLt
                        * BIAS epilogue takes bf16), else NULL */
    nib_qweight q;     /* CUDA low-bit (repacked) or BF16 (q.bf16_w) */
    void *wq8;         /* CUDA W8A8: e4m3 [n][k] */
    float *sw8;        /* CUDA W8A8: per-channel scales [n] */
} nib_be_linear;

/* Scratch of one stream (CUDA): what the ops of one stream reuse from call to call. */
typedef struct nib_be_scratch {
    nib_gemm_ws ws;           /* the low-bit GEMM's split-K partials and tile counters */
    void *gemm_tmp;           /* raw GEMM output for cuBLAS paths + epilogue */
    size_t gemm_tmp_bytes;
    void *xq8;                /* W8A8 activation codes */
    float *xs8;               /* W8A8 per-token scales */
    size_t xq8_bytes;
    void *attn_ws;            /* attention split partials */
    uint64_t attn_ws_bytes;
} nib_be_scratch;

typedef struct nib_be {
    nib_be_kind kind;
    size_t act_size;          /* bytes per activation element: 4 (REF) or 2 (CUDA) */
    void *stream;             /* CUDA stream (cudaStream_t) the ops are enqueued on: the main one, or
                               * the side one between nib_be_fork and nib_be_fork_end */
    void *main_stream, *side_stream; /* CUDA: the two streams (main: the highest priority, side: the lowest) */
    void *ev_fork, *ev_join;  /* CUDA: ordering events of a fork (no timing) */
    int threads;              /* REF: worker threads for GEMMs */
    /* memory */
    nib_dev_arena wslab, act; /* CUDA: device arenas */
    uint8_t *h_wslab, *h_act; /* REF: host arenas */
    size_t h_wcap, h_wused, h_acap, h_aused;
    /* scratch (CUDA) */
    nib_blas *blas;           /* cuBLASLt handle, plans and workspace (a second workspace with side_sc) */
    nib_be_scratch sc;        /* the scratch of the stream ops are enqueued on now */
    nib_be_scratch alt_sc;    /* with has_side_sc: the other stream's (swapped by nib_be_fork / _fork_end) */
    int has_side_sc;          /* nib_be_side_scratch ran: the side stream has scratch of its own */
    float *ref_tmp;           /* REF: raw GEMM output */
    size_t ref_tmp_elems;
} nib_be;

typedef struct nib_be_sizes {
    uint64_t weight_bytes;    /* the weight slab */
    uint64_t act_bytes;       /* activations, KV cache, model buffers */
    int64_t max_m, max_n, max_k; /* GEMM scratch sizing (max rows, max output width, max K) */
    uint64_t attn_ws_bytes;   /* from nib_cuda_attn_*_ws_bytes at the maximum sizes */
} nib_be_sizes;

nib_status nib_be_init(nib_be *be, nib_be_kind kind, const nib_be_sizes *sz);
void nib_be_free(nib_be *be);
const char *nib_be_name(const nib_be *be);

/* Allocation from the slab / arena (256-byte aligned, zero-initialized on REF). */
nib_status nib_be_alloc_weight(nib_be *be, uint64_t bytes, void **p, const char *what);
nib_status nib_be_alloc_act(nib_be *be, uint64_t bytes, void **p, const char *what);
/* host -> backend memory and back (synchronous) */
nib_status nib_be_upload(nib_be *be, void *dst, const void *src, uint64_t bytes);
nib_status nib_be_download(nib_be *be, void *dst, const void *src, uint64_t bytes);
/* Upload host fp32 values as activations (float on REF, bf16 on CUDA) / read them back. */
nib_status nib_be_upload_act(nib_be *be, void *dst, const float *src, uint64_t n);
nib_status nib_be_download_act(nib_be *be, float *dst, const void *src, uint64_t n);
nib_status nib_be_memset(nib_be *be, void *dst, int v, uint64_t bytes); /* enqueued on CUDA */
/* Page-locked host memory for the async copies below (REF: plain host memory), zeroed; free it with
 * nib_be_host_free before nib_be_free. */
nib_status nib_be_host_alloc(nib_be *be, uint64_t bytes, void **p, const char *what);
void nib_be_host_free(nib_be *be, void *p); /* NULL is a no-op */
/* Copies enqueued on the current stream (REF: done on return). The host side must stay untouched until
 * the stream has passed the copy (a sync); from page-locked memory (nib_be_host_alloc) they do not
 * block the host. */
nib_status nib_be_upload_async(nib_be *be, void *dst, const void *src, uint64_t bytes);
nib_status nib_be_download_async(nib_be *be, void *dst, const void *src, uint64_t bytes);
nib_status nib_be_sync(nib_be *be);

/* Prepare a linear layer from its canonical weight (ops/gemm.h). REF dequantizes exactly to
 * fp32. CUDA: low-bit formats are repacked; BF16 goes to cuBLAS; FP8 with w8a8 = 1 goes to
 * cuBLASLt FP8 (per-channel weight scales; per-token activation quantization at run time). */
nib_status nib_be_linear_load(nib_be *be, const nib_wsrc *src, int geglu, int w8a8, const char *name,
                              nib_be_linear *out);
/* y = epilogue(x · Wᵀ) (ops/gemm.h semantics; residual may alias y). */
nib_status nib_be_gemm(nib_be *be, const nib_be_linear *L, const void *x, int64_t m, int64_t ldx, void *y,
                         int64_t ldy, const nib_gemm_epi *epi);

/* Whether nib_be_gemm applies a gated residual inside the product's own kernel (the reference;
 * the CUDA low-bit GEMM). Otherwise (cuBLAS: bf16, W8A8) it costs a separate epilogue kernel,
 * and a caller may instead write the bare product and defer the gated residual into the next
 * norm (nib_norm_args.res_gate), which computes the same values. */
int nib_be_gemm_fuses_gate(const nib_be *be, const nib_be_linear *L);

/* The q|k|v product into a->qkv (ld a->ld_qkv), then ops/qkv.h's epilogue a (RoPE, q scaling, the
 * cache write). A CUDA low-bit weight loaded with rope_half = head_dim / 2 goes through
 * nib_cuda_gemm_qkv (its output in the pair layout, the epilogue in the product's kernel where it
 * can: a->qkv is then not written); anything else is nib_be_gemm, then nib_be_qkv. */
nib_status nib_be_gemm_qkv(nib_be *be, const nib_be_linear *L, const void *x, int64_t m, int64_t ldx,
                           const nib_qkv_args *a);

/* norm then y = epilogue(norm(x) · Wᵀ). For a CUDA W8A8 layer the norm emits the FP8 codes and
 * per-row scales directly (n->y is then not written); otherwise n->y holds the normed rows. */
nib_status nib_be_norm_gemm(nib_be *be, const nib_norm_args *n, const nib_be_linear *L, void *y, int64_t ldy,
                            const nib_gemm_epi *epi);

/* The MLP block: y = down_epi(down(act(up(norm(x))))). act is the GeGLU of a gate|up weight
 * (up->geglu) or, with gelu = 1, GELU-tanh of up's output (bias included); hidden [rows][ldh]
 * (act dtype) holds the activation on the generic path. CUDA with W8A8 up and down: the
 * activation reaches down as FP8 codes straight from the act kernel (norm -> FP8 codes, up
 * product (+ bias in cuBLASLt) -> scratch, act -> FP8 codes + row scales, down); hidden is not
 * written. NIB_FUSED_MLP=0 runs the generic path (the A/B switch of the benches). */
nib_status nib_be_mlp(nib_be *be, const nib_norm_args *n, const nib_be_linear *up, int gelu, const nib_be_linear *down,
                      void *hidden, int64_t ldh, void *y, int64_t ldy, const nib_gemm_epi *down_epi);
nib_status nib_be_norm(nib_be *be, const nib_norm_args *a);
nib_status nib_be_rope(nib_be *be, const nib_rope_args *a);
nib_status nib_be_act(nib_be *be, const nib_act_args *a);
nib_status nib_be_qkv(nib_be *be, const nib_qkv_args *a);
nib_status nib_be_kv_write(nib_be *be, const nib_kv_write_args *a);
nib_status nib_be_attn_prefix(nib_be *be, const nib_attn_prefix_args *a);
nib_status nib_be_attn_cache(nib_be *be, const nib_attn_cache_args *a);
nib_status nib_be_im2patch(nib_be *be, const nib_im2patch_args *a);
nib_status nib_be_embed(nib_be *be, const nib_embed_args *a);
nib_status nib_be_f32_to_act(nib_be *be, const float *x, int64_t rows, int64_t cols, int64_t ldx, void *y,
                             int64_t ldy);
nib_status nib_be_axpy_f32(nib_be *be, float *x, int64_t rows, int64_t cols, int64_t ldx, const void *v,
                           int64_t ldv);
/* the flow step's edge (ops/edge.h): the expert's output of one step and the next step's input */
nib_status nib_be_edge(nib_be *be, const nib_edge_args *a);
/* All layers of one action-expert step in one persistent kernel (ops/expert.h). CUDA only: the
 * reference backend runs the per-op sequence it specifies, so this returns NIB_ERR_UNSUPPORTED
 * there. ws: nib_cuda_expert_ws_bytes of device memory, prepared once (nib_cuda_expert_prepare). */
nib_status nib_be_expert(nib_be *be, const nib_expert_args *a, void *ws, uint64_t ws_bytes);
/* NaN/Inf scan (ops/numerics.h) for check-numerics mode. CUDA: ws is NIB_CHECK_FINITE_WS_BYTES of
 * device memory; the call synchronizes the stream (not capturable). REF: ws is unused. */
nib_status nib_be_check_finite(nib_be *be, const nib_check_finite_args *a, void *ws, nib_finite_result *out);

/* ---- CUDA graphs and events (CUDA backend only; REF returns NIB_ERR_UNSUPPORTED) ---------- */
typedef struct nib_be_graph nib_be_graph; /* an instantiated graph */
nib_status nib_be_capture_begin(nib_be *be);
nib_status nib_be_capture_end(nib_be *be, nib_be_graph **out); /* also on the error path */
void nib_be_capture_abort(nib_be *be);
nib_status nib_be_graph_launch(nib_be *be, nib_be_graph *g);
void nib_be_graph_free(nib_be_graph *g);
typedef struct nib_be_event nib_be_event;
nib_status nib_be_event_create(nib_be_event **e);
void nib_be_event_free(nib_be_event *e);
nib_status nib_be_event_record(nib_be *be, nib_be_event *e); /* capturable */
nib_status nib_be_event_ms(nib_be_event *a, nib_be_event *b, float *ms);

/* ---- a second stream (CUDA; REF: no-ops, everything runs in order) ------------------------
 * nib_be_fork: what is enqueued from now on goes to the side stream, after everything enqueued on
 * the main stream so far; nib_be_fork_end: back to the main stream (call it on error paths too), whose
 * later work runs BESIDE the side stream's; nib_be_join: the main stream's later work waits for
 * the side stream's. Capturable (the fork / join become graph edges). Forks do not nest, but a
 * fork may follow a fork_end before the join: each adds an edge (the side stream's later work also
 * waits for what the main stream had enqueued by then). Every fork must be joined before a capture
 * ends or the backend is synchronized. Without nib_be_side_scratch the two streams share the
 * backend's scratch (GEMM workspace, cuBLASLt workspace, FP8 codes, attention workspace): only work
 * that uses none of it may run on the side stream (Pi0.5: the persistent expert kernel). */
nib_status nib_be_fork(nib_be *be);
void nib_be_fork_end(nib_be *be);
nib_status nib_be_join(nib_be *be);
/* Scratch of its own for the side stream, sized for GEMMs of up to max_m x max_n (K up to max_k)
 * and attention calls needing up to attn_ws_bytes (the other fields of sz are ignored): from now
 * on any op may run between nib_be_fork and nib_be_fork_end. Once per backend; REF: a no-op. */
nib_status nib_be_side_scratch(nib_be *be, const nib_be_sizes *sz);

/* Reference fp32 GEMM (multithreaded): y[m][n] = sum_k x[m][k] w[n][k], fp32 accumulation in a
 * fixed order (deterministic). */
nib_status nib_ref_sgemm(const float *x, int64_t m, int64_t ldx, const float *w, int64_t n, int64_t k, float *y,
                         int64_t ldy, int threads);

#ifdef __cplusplus
}
#endif
#endif
