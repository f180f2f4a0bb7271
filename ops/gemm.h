/* gemm.h — the weight GEMM  Y[M, N_out] = epilogue( X[M, K] · W[N, K]ᵀ ).
 *
 * X and Y are bf16 (row-major, leading dimensions in elements), accumulation is fp32, W is in
 * one of nib's weight formats. Two backends implement it:
 *   ops/ref/gemm_ref.c   — the spec: dequantize W with formats/ (exact), accumulate in fp64.
 *   ops/cuda/gemm_lowbit.cu — W repacked on the GPU into a kernel layout; mma.sync kernels.
 *
 * Epilogue, in this order, per output element (m, n):
 *   v = acc(m, n) [+ bias(n)]                          fused GeGLU:  v = gelu_tanh(v_gate) * v_up
 *   v = gate ? gate(n) * v : v                           (per-column gate, fp32)
 *   v = residual ? residual(m, n) + v : v                (bf16; may alias Y for in-place adds)
 *   Y(m, n) = bf16(v)  (round to nearest even)
 * With GeGLU the weight is the fused [gate; up] matrix of 2H rows (gate rows 0..H-1, up rows
 * H..2H-1, as in a Gemma MLP) and N_out = H.
 */
#ifndef NIB_OPS_GEMM_H
#define NIB_OPS_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nib_wfmt {
    NIB_WFMT_BF16 = 0, /* bf16 [n][k]; served by cuBLAS on the GPU */
    NIB_WFMT_FP8,      /* e4m3 [n][k] + fp32 scale per tensor or per output channel */
    NIB_WFMT_NVFP4,    /* e2m1 [n][k/2] + e4m3 scale per 16 along K + fp32 global */
    NIB_WFMT_MXFP4,    /* e2m1 [n][k/2] + e8m0 scale per 32 along K */
    NIB_WFMT_INT4,     /* u4 [n][k/2] + fp16 scale (+ u8 zero) per group along K */
    NIB_WFMT_COUNT
} nib_wfmt;

const char *nib_wfmt_name(nib_wfmt f);
/* Parse "bf16" | "fp8" | "nvfp4" | "mxfp4" | "int4"; NIB_WFMT_COUNT when unknown. */
nib_wfmt nib_wfmt_from_name(const char *s);

/* A linear layer's weight in nib's canonical host layout (planar; what formats/ quantizers
 * produce and what checkpoint importers convert to). Pointers are borrowed. */
typedef struct nib_wsrc {
    nib_wfmt fmt;
    int64_t n, k;           /* logical shape [n][k], k contiguous */
    const void *data;       /* BF16: u16 [n][k]; FP8: u8 [n][k]; 4-bit: u8 [n][k/2], even k low */
    const void *scales;     /* FP8: f32 [n] or [1]; NVFP4: e4m3 [n][k/16]; MXFP4: e8m0 [n][k/32];
                               INT4: fp16 bits [n][k/group] */
    const uint8_t *zeros;   /* INT4 asymmetric: [n][k/group] (0..15); NULL = symmetric (zero 8) */
    const int32_t *perm;    /* INT4 act-order: stored column j is input channel perm[j]; NULL = id */
    float global_scale;     /* NVFP4 per-tensor scale (multiply) */
    int group;              /* INT4 group size (128) */
    int fp8_per_channel;    /* FP8: scales has n entries (else 1) */
    const float *bias;      /* [n] fp32 or NULL */
    int32_t rope_half;      /* low-bit CUDA kernel layout only (the reference ignores it): > 0 stores row r
                             * beside row r + rope_half inside every block of 2 rope_half rows (a fused
                             * q|k|v weight, rope_half = head_dim / 2: RoPE's rotate-half partners), so the
                             * product's columns come out in ops/qkv.h's pair layout and the epilogue of
                             * nib_cuda_gemm_qkv holds both partners of a rotation. n a multiple of
                             * 2 rope_half, rope_half a multiple of 8; not with GeGLU. 0 = none */
} nib_wsrc;

typedef struct nib_gemm_epi {
    int geglu;              /* fused gate|up → N_out = n/2 */
    const float *gate;      /* [N_out] fp32 or NULL */
    const void *residual;   /* bf16 [M][ldr] or NULL */
    int64_t ldr;
} nib_gemm_epi;

/* Checks a weight description: shapes against the format's block size, pointers present.
 * NIB_ERR_SHAPE / NIB_ERR_INVALID_ARG / NIB_ERR_UNSUPPORTED naming `name`. */
nib_status nib_wsrc_validate(const nib_wsrc *w, const char *name);
/* One row of the weight dequantized exactly into fp64, original column order (internal). */
void nib_wsrc_dequant_row64(const nib_wsrc *w, int64_t row, double *out);
/* Bytes of the canonical representation (elements + scales (+ zeros)): what a checkpoint holds
 * and what "effective GB/s" counts. */
uint64_t nib_wsrc_bytes(const nib_wsrc *w);
/* Dequantize to fp32 [n][k] in original column order (exact: every format's dequantized value
 * is representable in fp32). */
nib_status nib_wsrc_dequantize(const nib_wsrc *w, float *out);

/* ---- reference backend ---------------------------------------------------------------
 * y64[M][N_out] = epilogue(X · Wᵀ) in fp64 (no bf16 rounding of the result: tests derive
 * their thresholds from it). x is bf16 bits [m][ldx]. Also returns, when absmax_terms is not
 * NULL, sum_k |x_mk w_nk| per output (for accumulation-error bounds). */
nib_status nib_ref_gemm(const nib_wsrc *w, const uint16_t *x, int64_t m, int64_t ldx,
                        const nib_gemm_epi *epi, double *y64, double *abs_terms);

/* ---- CUDA backend ---------------------------------------------------------------------- */
/* A weight repacked on the device in the kernel layout. Opaque to callers except the sizes. */
typedef struct nib_qweight {
    nib_wfmt fmt;
    int64_t n, k;           /* logical */
    int64_t n_out;          /* n, or n/2 with geglu */
    int64_t np, kp;         /* padded to the kernel tiles */
    int geglu;
    int group;
    void *w;                /* kernel-layout element plane */
    void *s;                /* kernel-layout scale plane (NULL for FP8) */
    float *colscale;        /* [np] fp32, repacked row order */
    float *bias;            /* [np] fp32 or NULL */
    int32_t *perm;          /* [k] or NULL (INT4 act-order) */
    uint32_t scale_add;     /* per-format constant of the in-kernel scale conversion */
    uint64_t w_bytes, s_bytes;
    uint64_t src_bytes;     /* canonical bytes (what effective GB/s counts) */
    void *bf16_w;           /* NIB_WFMT_BF16: the bf16 matrix itself (cuBLAS) */
    int plan_rule;          /* NIB_GEMM_RULE_*: a fixed launch plan where the model that owns the weight
                             * measured one better than the planner's (0: the planner) */
    int rope_half;          /* nib_wsrc.rope_half: the output's columns are in ops/qkv.h's pair layout */
} nib_qweight;

/* Bytes the repacked weight needs on the device (so a loader can size one slab). */
nib_status nib_cuda_weight_bytes(const nib_wsrc *src, int geglu, uint64_t *bytes);
/* Upload + repack on the GPU into memory from `alloc` (a bump arena: the weight slab).
 * `name` names the tensor in errors. Synchronous. */
nib_status nib_cuda_weight_load(const nib_wsrc *src, int geglu, const char *name,
                                void *arena /* nib_dev_arena* */, nib_qweight *out);

/* Split-K workspace: one fp32 slot of partial sums per K split (summed in a fixed order, so
 * results are bitwise deterministic) and self-resetting tile counters; one workspace serves
 * every GEMM issued in order on one stream, CUDA-graph replays included. Without a workspace
 * (or with a small one) the planner splits K less. */
typedef struct nib_gemm_ws {
    float *acc;
    int *counters;
    uint64_t acc_elems, n_counters;
} nib_gemm_ws;
nib_status nib_cuda_gemm_ws_init(nib_gemm_ws *ws, int64_t max_m, int64_t max_np);
void nib_cuda_gemm_ws_free(nib_gemm_ws *ws);

/* Y = epilogue(X · Wᵀ) on `stream` (cudaStream_t or NULL). x, y, residual are device bf16. */
nib_status nib_cuda_gemm(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, void *y,
                         int64_t ldy, const nib_gemm_epi *epi, nib_gemm_ws *ws, void *stream);

/* The q|k|v product and ops/qkv.h's epilogue (RoPE, q scaling, the KV-cache write) for a weight
 * loaded with rope_half = qa->head_dim / 2: qkv = X · Wᵀ lands in qa->qkv (ld qa->ld_qkv, the pair
 * layout), then nib_cuda_qkv reads it with qa->pairs = 1. Where the epilogue allows it (a bf16
 * cache or none, no n_valid, no done counter, qa->rope_cs given), on the mma.sync kernel and the
 * wgmma kernel alike, the rotation, q and the cache writes happen in the product's own
 * epilogue instead (one kernel; qa->qkv is not written): bitwise the two-kernel result, since each
 * output is rounded to bf16 first, then rotated with k_qkv's fp32 operations and the same (cos, sin).
 * NIB_GEMM_QKV=0 keeps the two kernels (A/B). On the wgmma kernel (Pi0.5's q|k|v at H = 50) each 128-row tile
 * holds 64 whole rotation pairs, and the epilogue runs after its K split's reduction in either form;
 * NIB_GEMM_WG_QKV=0 leaves a wgmma product to two kernels (A/B; 1, the default, fuses). */
struct nib_qkv_args;
struct nib_gemm_plan;
/* plan: NULL = the planner's (or the weight's rule); else one of nib_cuda_gemm_plans' (tests, lab) */
nib_status nib_cuda_gemm_qkv(const nib_qweight *w, const void *x, int64_t m, int64_t ldx,
                             const struct nib_qkv_args *qa, nib_gemm_ws *ws, const struct nib_gemm_plan *plan,
                             void *stream);
/* Whether nib_cuda_gemm_qkv would run in one kernel for these arguments (0 / 1; -1: an error, e.g.
 * a bad NIB_GEMM_QKV or no plan). */
int nib_cuda_gemm_qkv_fuses(const nib_qweight *w, int64_t m, const struct nib_qkv_args *qa, const nib_gemm_ws *ws,
                            const struct nib_gemm_plan *plan);

/* Launches of the low-bit GEMM's lean instantiations so far in this process. NIB_GEMM_LEAN=1 (the default)
 * runs a kernel compiled for one epilogue kind and K-split mode where one applies: NVFP4 without a bias on
 * the mma.sync kernel's MT = 2 plans with register-loaded weights (no gate or residual beside GeGLU or the
 * q|k|v epilogue) and on the wgmma kernel's 64-token tiles without X multicast (the action expert's
 * products at H <= 16 and H = 50); 0 never (A/B); other values are errors. For tests. */
long long nib_cuda_gemm_lean_launches(void);
/* How many wgmma launches ran the q|k|v epilogue (NIB_GEMM_WG_QKV) since the process started. For tests. */
long long nib_cuda_gemm_wg_qkv_launches(void);

/* Geometry of the low-bit GEMM kernel, shared by the kernel (ops/cuda/gemm_lowbit.cu) and its
 * launch planner (ops/gemm_plan.c, host code compiled in every build). */
#define NIB_GEMM_KCH 128                                          /* K elements per chunk */
#define NIB_GEMM_WARPS 8                                          /* warps per CTA */
#define NIB_GEMM_MCHUNK 64                                        /* tokens per M chunk at MT = 8 */
#define NIB_GEMM_MT(m) ((m) <= 8 ? 1 : (m) <= 16 ? 2 : (m) <= 32 ? 4 : 8) /* 8-token tiles per chunk */
/* An M chunk is 8 * MT tokens: NIB_GEMM_MT(m) makes one chunk up to M = 64. At 8 < M <=
 * NIB_GEMM_MSPLIT_MAX_M the planner also weighs smaller MT, the tokens split into several chunks
 * of 8 * MT (more CTAs, each chunk reading the weights again, mostly from L2). */
#define NIB_GEMM_MSPLIT_MAX_M 128
#define NIB_GEMM_MSPLIT_MAX_CHUNKS 16
#define NIB_GEMM_STAGES(mt) ((mt) >= 8 ? 3 : 4)                   /* weight pipeline stages */
#define NIB_GEMM_CPS(mt) ((mt) <= 2 ? 2 : 1)                      /* chunks per pipeline step */
#define NIB_GEMM_PIECES(fmt) ((fmt) == NIB_WFMT_FP8 ? 4 : 3)      /* 16-byte pieces per lane and chunk */
/* bytes of one chunk (16 rows x 128 K) in a warp's bulk ring: element parts + scales */
#define NIB_GEMM_BULK_CHUNK(fmt) \
    ((fmt) == NIB_WFMT_FP8 ? 2048 : (fmt) == NIB_WFMT_NVFP4 ? 1024 + 128 : 1024 + 64)
#define NIB_GEMM_X_BUDGET (48 * 1024) /* shared memory for X windows per CTA (x2 at one CTA per SM) */
#define NIB_GEMM_MAX_SMEM (200 * 1024) /* dynamic shared memory a plan may use */

/* The wgmma kernel for large M runs NVFP4, MXFP4, INT4 and FP8 weights without an act-order
 * permutation from NIB_GEMM_WG_MIN_M tokens up, and past NIB_GEMM_WG_MID_M tokens for weights of at
 * least NIB_GEMM_WG_MID_ELEMS (padded) elements, in token tiles of 64, 128, 192 or 256 (INT4: up to
 * 192). */
#define NIB_GEMM_WG_MIN_M 128
#define NIB_GEMM_WG_MID_M 32
#define NIB_GEMM_WG_MID_ELEMS ((int64_t)1 << 21) /* 2^22 until the K split reduced in its cluster (twenty-sixth
                                                   * session): then Pi0.5's o projection (2048 x 1024) at H = 50
                                                   * ran faster on it in the graph, 15.01 -> 14.56 ms per call */
#define NIB_GEMM_WG_ROWS 128 /* weight rows per CTA */
/* Its token tile for M tokens of a weight with np x kp padded rows x columns on `sms` SMs, or 0 where the
 * mma.sync kernel runs; *ks: the K split (CTAs along K, partial sums in a split-K workspace of ws_elems
 * floats); *cm: CTAs per cluster sharing X by multicast. Environment (lab / A-B): NIB_GEMM_WG=0 never,
 * NIB_GEMM_WG=1 at every M; NIB_GEMM_WG_BT=16|32|64|128|192|256 forces the tile (a tile the format lacks is
 * ignored), NIB_GEMM_WG_KS=1..8 the K split, NIB_GEMM_WG_CM=1|2 the cluster (tiles of 64+ tokens).
 * NVFP4 and INT4 at 9..32 tokens on weights of at least one 128-row tile per SM: the 16- / 32-token tile,
 * one K split (the mma.sync kernel multiplies each decoded fragment by 2 or 4 token tiles there); NVFP4 and
 * INT4 at 17..32 tokens with K >= 4096: the model's tile.
 * Host code (no CUDA needed). */
int nib_gemm_wg_tile(nib_wfmt fmt, int has_perm, int64_t m, int64_t np, int64_t kp, uint64_t ws_elems, int sms,
                     int *ks, int *cm);

/* Launch plan the CUDA GEMM would use (for the lab and tests). */
typedef struct nib_gemm_plan {
    int mt;        /* n-tiles of 8 tokens per M chunk (1, 2, 4, 8); chunks of 8 * mt tokens */
    int r;         /* 16-row groups per warp (1) */
    int wk;        /* warps along K per CTA (8 warps) */
    int ksplit;    /* CTAs along K */
    int occ;       /* resident CTAs per SM the kernel's registers are budgeted for (1, 2) */
    int reg;       /* 1: weights loaded straight into registers (MT <= 4), no shared-memory ring;
                    * 2: weights moved by cp.async.bulk into per-warp rings (MT = 1);
                    * the planner picks it for INT4 and MXFP4 at M <= 8: ops/gemm_plan.c, bulk_ring) */
    int row_blocks, m_chunks, ctas;
    int xw, nxb, lds, ring_bytes; /* X window (pipeline steps), X buffers, X row stride, ring bytes */
    size_t smem;                  /* dynamic shared memory per CTA */
    int wgt; /* > 0: the wgmma kernel (ops/cuda/gemm_lowbit_wg.cuh) with tiles of 128 weight rows x wgt (16 .. 256)
              * tokens (of the fields above only ksplit, row_blocks, m_chunks, ctas and smem apply); 0: mma.sync */
    int wgc; /* the wgmma kernel: CTAs of adjacent row tiles per cluster sharing each X tile by multicast (1, 2) */
    int wkcl; /* the wgmma kernel with 2..8 K splits and wgc = 1: 1 = the splits of a tile are one cluster and add
               * their sums through distributed shared memory; 0 = through the split-K workspace (the last
               * CTA of the tile adds them). Same sums in the same order either way. The planner sets it
               * where every cluster of the launch is resident at once; NIB_GEMM_WG_KCL=0: never */
} nib_gemm_plan;
/* The planner itself, for a padded weight shape (np rows, multiple of 16; kp columns, multiple
 * of 128) on a device with `sms` SMs and a split-K workspace of ws_elems floats: host code,
 * available without CUDA (tests/test_gemm_plan.c checks it against the recorded plan sweep).
 * Plans are cached per thread. */
typedef struct nib_gemm_shape {
    nib_wfmt fmt;
    int64_t np, kp;
    int lean; /* 1: the product runs the lean MT = 1 instantiations (NVFP4 or INT4, no act-order, no bias, no
               * GeGLU or q|k|v epilogue, NIB_GEMM_LEAN not 0); the planner then weighs the plans those made faster
               * (ops/gemm_plan.c, "Lean rule"). 0: the general kernels' rules (the recorded sweeps v4 - v6) */
} nib_gemm_shape;
/* NIB_GEMM_FORCE=K:N:M:mt:wk:ks[,...] in the environment (a lab knob: other plans timed inside a
 * model) replaces the pick for a padded kp x np shape at M rows by the mma.sync plan with those
 * fields (register weights, occupancy 2); an entry K:N:M:wg<tokens>:ks:cm by the wgmma kernel's plan
 * with tiles of that many tokens, ks K splits and clusters of cm CTAs (host code sets its wgt, ksplit,
 * wgc, m_chunks, row_blocks and ctas; nib_cuda_gemm_plan completes it, and the kernel's own checks
 * apply). A malformed entry or one that does not fit is an error naming the knob. */
nib_status nib_gemm_plan_for(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *plan);
/* Only NIB_GEMM_FORCE's entry for this shape and M: *hit = 1 with its plan, 0 where none matches. */
nib_status nib_gemm_plan_forced(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *plan,
                                int *hit);
/* Fixed plan rules a model may set on a weight (nib_qweight.plan_rule), for shapes where the plan
 * timed inside that model beats the planner's pick (the planner is fitted to the lab, which replays
 * one kernel back to back; inside a model each product follows other kernels under PDL).
 * NIB_GEMM_RULE_K1024: at 8 < M <= 16 and K a multiple of 1024, one M chunk (MT 2), 4 warps along K
 * and K / 1024 CTAs along K: every warp one pipeline step. Pi0.5's action expert at H = 10 (H100,
 * bench/results/pi05-expert-gemm-plans-h100.json): o and down on this rule instead of two M chunks,
 * fast 10.565 -> 10.19 ms per call; as made (pi05-gemm-rule-ab-h100.json) 10.53 -> 10.20. Both rules' X windows are
 * one pipeline step (the planner's: all of K; gate|up 0.035-0.04 ms a call faster, gemm-xw-ab-h200.json). */
#define NIB_GEMM_RULE_K1024 1
/* NIB_GEMM_RULE_K1024_WK1: the same with one warp along K (each warp all four pipeline steps of its
 * 1024-wide K split), a quarter of the CTAs. Pi0.5's gate|up product at H = 10 (1024 -> 8192, GeGLU:
 * 64 CTAs instead of 256). H200, one build, alternated twice (bench/results/pi05-expert-plans-2-h200.json),
 * fast at 1 / 2 / 3 cameras, ms per call: this rule 7.94 / 8.93 / 10.28 against 8.21 / 9.43 / 10.53 with
 * gate|up on NIB_GEMM_RULE_K1024 (the step at 2 cameras 0.576 -> 0.524) and 8.15 / 9.39 / 10.47 with it on 2
 * warps (the fifty-fourth session's rule). q|k|v on 2 warps had looked faster with gate|up on 2 warps
 * (9.36 -> 9.13 at 2 cameras) and is not with gate|up on one (8.93 -> 8.95); o and down lost with fewer
 * warps (16-32 CTAs against 64-128). */
#define NIB_GEMM_RULE_K1024_WK1 2
/* The same rule at NIB_GEMM_WG_MID_M < M <= NIB_GEMM_RULE_WG_MAX_M (Pi0.5 at H = 50): the wgmma kernel's 64-token
 * tile with one K split, again one CTA per 128-row tile (gate|up: 64 CTAs, where the wgmma tile rule's cost model
 * picks 2 splits, 128). H200, fast, 3 cameras, H = 50, the in-model plan search
 * (bench/results/pi05-plan-search-h50-h200.json): 12.27 -> 12.135 ms, confirmed twice; every other product kept its
 * plan, and every mma.sync plan lost there (q|k|v's, which would fuse RoPE, 12.83 ms at best). A weight with
 * act-order (no wgmma kernel) gets the planner's plan instead (nib_cuda_gemm_plan). */
#define NIB_GEMM_RULE_WG_MAX_M 64
/* The rule's plan into *pl with *hit = 1, or *hit = 0 where the rule does not apply (rule 0, M or K
 * outside it, a workspace too small for its K split, or NIB_GEMM_RULE=0 in the environment: the A/B
 * switch). A wgmma plan (wgt > 0: NIB_GEMM_RULE_K1024_WK1 above 32 tokens) has only wgt, wgc, ksplit,
 * m_chunks, row_blocks and ctas set; nib_cuda_gemm_plan completes it. NIB_GEMM_FORCE wins over a rule;
 * NIB_GEMM_RULE other than 0 or 1 is an error. */
nib_status nib_gemm_plan_rule(const nib_gemm_shape *w, int rule, int64_t m, uint64_t ws_elems, int sms,
                              nib_gemm_plan *pl, int *hit);
/* NIB_GEMM_XW=N (a lab knob, unset: nothing): an mma.sync plan's X window re-planned to the largest of at most N pipeline
 * steps that fits (X buffers, row stride and shared memory recomputed; the planner's own pick is the largest of all, the
 * K1024 rules' one step); a bad value, or one whose buffers do not fit, is an error naming it. */
nib_status nib_gemm_plan_xw_env(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *pl);
/* Every plan that fits, in a fixed order; returns how many were written to out (at most max),
 * or -1 (with the error set) for a bad shape. */
int nib_gemm_plans_for(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *out, int max);
/* The same for a loaded weight on the current device. */
nib_status nib_cuda_gemm_plan(const nib_qweight *w, int64_t m, uint64_t ws_elems, nib_gemm_plan *plan);
/* A plan for the wgmma kernel with bt-token tiles (64, 128, 192, 256), ks K splits and clusters of cm
 * (1, 2), for tests and the lab. */
nib_status nib_cuda_gemm_wg_plan(const nib_qweight *w, int64_t m, int bt, int ks, int cm, nib_gemm_plan *plan);
/* Every launch plan that fits (each K split count, warps along K, register budget), for the
 * lab's plan sweep; returns how many were written to out (at most max), or -1. */
int nib_cuda_gemm_plans(const nib_qweight *w, int64_t m, uint64_t ws_elems, nib_gemm_plan *out, int max);
/* nib_cuda_gemm with a plan from nib_cuda_gemm_plans (NULL: the planner's choice). */
nib_status nib_cuda_gemm_planned(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, void *y,
                                 int64_t ldy, const nib_gemm_epi *epi, nib_gemm_ws *ws,
                                 const nib_gemm_plan *plan, void *stream);

/* ---- cuBLAS / cuBLASLt baselines and the FP8 W8A8 path ------------------------------ */
typedef struct nib_blas nib_blas; /* opaque: cuBLASLt handle + workspace */
nib_status nib_blas_create(nib_blas **out);
void nib_blas_free(nib_blas *b);
/* A second cuBLASLt workspace, for products enqueued on a second stream while the first stream's
 * run (the plans are shared: host state only); nib_blas_swap_workspace exchanges the two (no-op
 * with one). */
nib_status nib_blas_add_workspace(nib_blas *b);
void nib_blas_swap_workspace(nib_blas *b);
/* FP8 accumulation mode of this handle's later FP8 products: 1 (the default, or
 * NIB_BLAS_FAST_ACCUM at creation) lets the tensor cores accumulate without cuBLASLt's periodic
 * promotion to fp32 (faster; Hopper's FP8 accumulator keeps fewer mantissa bits than fp32);
 * 0 promotes (error bounded as for fp32 accumulation). */
void nib_blas_set_fp8_fast_accum(nib_blas *b, int on);
/* Which kernel runs this handle's FP8 products with fast accumulation: AUTO (the default; the
 * rule of nib_fp8_use_nib, NIB_FP8_GEMM honoured), or always cuBLASLt / always nib's wgmma
 * kernel (the lab and the tests). Promoting products always run on cuBLASLt. */
enum { NIB_FP8_ENGINE_AUTO = 0, NIB_FP8_ENGINE_CUBLASLT = 1, NIB_FP8_ENGINE_NIB = 2 };
void nib_blas_set_fp8_engine(nib_blas *b, int engine);
int nib_blas_fp8_fast_accum(const nib_blas *b);
/* Lab (nib bench gemm --algos): products planned from now on use cuBLASLt's i-th heuristic
 * candidate instead of its first (i <= 0: the first, as always outside the lab). Plans are
 * cached per shape and candidate; a candidate cuBLASLt does not offer is NIB_ERR_UNSUPPORTED. */
void nib_blas_set_algo_index(nib_blas *b, int i);
typedef struct nib_blas_algo_desc {
    int id, tile, stages, splitk, reduction, swizzle, custom, cluster, inner; /* cublasLtMatmulAlgoConfig */
    int base; /* nib_blas_configs: the heuristic candidate it was derived from */
    float waves;        /* the heuristic's wavesCount (1.0: one full wave of CTAs) */
    uint64_t workspace; /* bytes */
} nib_blas_algo_desc;
/* cuBLASLt's heuristic candidates, best first, for the plain product Y = X Wᵀ (no bias, no C;
 * fp8: per-token sx and per-channel sw device scales, the handle's accumulation mode); at most
 * max (<= 32) into out, their number in *count. */
nib_status nib_blas_algos(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx, const float *sw,
                          nib_blas_algo_desc *out, int max, int *count);
/* Lab (nib bench gemm --lt-configs): every configuration cuBLASLt accepts (cublasLtMatmulAlgoCheck,
 * within nib's workspace) for the plain product of nib_blas_algos, enumerated over its algorithm
 * heuristic's first 8 candidates reconfigured: each candidate's algorithm's tiles, custom options,
 * cluster shapes {auto, 1x1, 2x1, 1x2, 2x2, 4x1, 1x4}, CTA swizzle and, where it has split-K,
 * {1, 2, 3, 4} with the compute-type and in-place reductions where offered; at most max. */
nib_status nib_blas_configs(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx, const float *sw,
                            nib_blas_algo_desc *out, int max, int *count);
/* Lab (nib bench gemm --lt-search): NIB_OK when cuBLASLt accepts configuration *d (a
 * reconfiguration of heuristic candidate d->base, as nib_blas_configs makes them) for the plain
 * product (filling its workspace and waves), NIB_ERR_UNSUPPORTED when it refuses it. */
nib_status nib_blas_config_check(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx,
                                 const float *sw, nib_blas_algo_desc *d);
/* Lab (--lt-search): the tile ids heuristic candidate `base`'s algorithm lists (every id when it
 * lists none, as the Hopper FP8 algorithm), at most max into tiles, their number in *count. */
nib_status nib_blas_config_tiles(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx,
                                 const float *sw, int base, int *tiles, int max, int *count);
/* Lab: products planned from now on run configuration d (NULL: cuBLASLt's heuristic again); a
 * configuration cuBLASLt refuses for a product (or whose base candidate it does not offer) is
 * NIB_ERR_UNSUPPORTED at that product. */
void nib_blas_set_algo_config(nib_blas *b, const nib_blas_algo_desc *d);
/* bf16: Y[M,N] = X[M,K] · W[N,K]ᵀ (+ optional bias fp32 [N] through the cuBLASLt epilogue). */
nib_status nib_blas_gemm_bf16(nib_blas *b, const void *x, const void *w, void *y, int64_t m,
                              int64_t n, int64_t k, void *stream);
/* FP8 W8A8: Xq e4m3 [M,K] with per-token scales sx[M] (or one when sx_per_token = 0),
 * Wq e4m3 [N,K] with per-channel scales sw[N] (or one), Y bf16 [M,N]. Scales multiply. */
nib_status nib_blas_gemm_fp8(nib_blas *b, const void *xq, const float *sx, int sx_per_token,
                             const void *wq, const float *sw, int sw_per_channel, void *y,
                             int64_t m, int64_t n, int64_t k, void *stream);
/* One cuBLASLt call: Y[M, ldy] = X·Wᵀ (+ bias[N] bf16 through the BIAS epilogue) (+ C[M, ldc]
 * bf16, beta = 1; C may be Y itself with ldc = ldy, but may not overlap it otherwise),
 * accumulated in fp32 and rounded to bf16 once.
 * fp8 = 1: X/W are e4m3 with the scales of nib_blas_gemm_fp8. NIB_ERR_UNSUPPORTED when cuBLASLt
 * has no algorithm for this epilogue (remembered per shape; the caller then runs the plain product
 * and nib_cuda_epilogue). */
typedef struct nib_blas_gemm_args {
    int fp8;
    const void *x;
    const float *sx;
    int sx_per_token;
    const void *w;
    const float *sw;
    int sw_per_channel;
    int64_t m, n, k;
    const void *bias; /* bf16 [N] */
    const void *c;
    int64_t ldc;
    void *y;
    int64_t ldy;
} nib_blas_gemm_args;
nib_status nib_blas_gemm_fused(nib_blas *b, const nib_blas_gemm_args *a, void *stream);
/* ---- nib's own FP8 W8A8 GEMM (wgmma, ops/cuda/gemm_fp8.cu) ---------------------------------
 * The same product and result as nib_blas_gemm_fused with fp8 = 1 and fast accumulation (the
 * tensor cores' accumulator, no promotion), for the M ~ 512 shapes where cuBLASLt's single FP8
 * algorithm fills few SMs. A tile is WG (1-3) warpgroups (64 WG token rows) x BN output channels with
 * `stages` 128-byte K blocks in flight (TMA loads, one producer warp). Needs K % 16 == 0, N % 8 == 0, X / W 16-byte aligned,
 * Y / C 16-byte aligned with ldy / ldc multiples of 8, bias 2-byte, M, N, K < 2^31. */
typedef struct nib_fp8_tile {
    int wg, bn, stages;
    int ks; /* CTAs splitting K (one cluster; their sums meet in rank 0's shared memory, added in
             * rank order: deterministic) */
    int cm; /* CTAs of one cluster along M: each loads 1 / cm of the W tile and multicasts it */
} nib_fp8_tile;
/* the compiled tiles, in a fixed order (host code, no CUDA): how many were written (<= max) */
int nib_fp8_tiles(nib_fp8_tile *out, int max);
/* W rows one CTA loads per stage: bn, or with cm > 1 its multicast slice, bn / cm rounded up to
 * whole 8-row swizzle atoms (the last slice may run past bn) */
int nib_fp8_tile_wslice(const nib_fp8_tile *t);
/* dynamic shared memory of a tile's kernel (stages x (64 wg + cm x wslice) x 128 bytes + 1024 for
 * alignment) */
size_t nib_fp8_tile_smem(const nib_fp8_tile *t);
/* the planner: the tile with the lowest modeled time on `sms` SMs, given how many CTAs of each
 * compiled tile (nib_fp8_tiles order) the device holds at once (`slots`; NULL: estimated from the
 * H100) (host code, tested in CI); nib_fp8_plan_for = nib_fp8_plan_slots(.., NULL, ..) */
void nib_fp8_plan_slots(int64_t m, int64_t n, int64_t k, int sms, const int *slots, int geglu, nib_fp8_tile *out);
void nib_fp8_plan_for(int64_t m, int64_t n, int64_t k, int sms, nib_fp8_tile *out);
/* whether a tile can run the GeGLU epilogue (bn a multiple of 16: two halves of whole swizzle
 * atoms; no multicast) */
int nib_fp8_tile_geglu(const nib_fp8_tile *t);
/* the tile nib_cuda_gemm_fp8 (geglu: nib_cuda_gemm_fp8_geglu) runs for this shape when given none
 * (the device's resident counts) */
nib_status nib_cuda_fp8_plan(int64_t m, int64_t n, int64_t k, int geglu, nib_fp8_tile *out);
/* the ping-pong kernel's consumer tile (*rows x *cols) that nib_cuda_gemm_fp8_geglu runs for an M x n x K GeGLU product
 * given no tile (nib_fp8_geglu_pp under NIB_FP8_PP and NIB_FP8_PERSIST); 0 x 0: the planner's tile, on k_gemm_fp8_pt */
nib_status nib_cuda_fp8_geglu_pp(int64_t m, int64_t n, int64_t k, int *rows, int *cols);
/* A reconfiguration of cuBLASLt's first heuristic candidate measured faster for this product
 * (ops/gemm_plan.c: the Gemma down projection and gate|up at the model's row counts): 1 and its
 * tile / custom option / cluster shape ids (cuBLASLt's enums) in *out, else 0. sms: the device's
 * SM count (the tile choice fills the GPU). nib_blas_tune_on: 0 when NIB_BLAS_TUNE=0 (then
 * cuBLASLt's heuristic runs as it picks, and the engine rule as before the tuning). */
typedef struct nib_blas_tune {
    int tile, custom, cluster; /* tile 0 / custom -1: the candidate's own */
    int splitk, reduction;     /* 0: the candidate's own */
    int swizzle;               /* 0: the candidate's own, 1: CTA swizzling on */
    int base;                  /* which heuristic candidate is reconfigured (0: the first) */
} nib_blas_tune;
int nib_blas_tune_for(int fp8, int64_t m, int64_t n, int64_t k, int sms, nib_blas_tune *out);
int nib_blas_tune_on(void);
/* how many of this handle's cuBLASLt plans run such a reconfiguration (tests, lab) */
int nib_blas_tuned_plans(const nib_blas *b);
/* whether nib_blas_gemm_fused sends this FP8 product (fast accumulation) to nib's kernel instead
 * of cuBLASLt: NIB_FP8_GEMM=nib / cublaslt forces it, else the measured rule in gemm_plan.c */
int nib_fp8_use_nib(int64_t m, int64_t n, int64_t k);
/* the same for a gate|up product with the GeGLU fused into nib's epilogue (then h quantized per
 * row), against cuBLASLt's product followed by the GeGLU + FP8 kernel */
int nib_fp8_use_nib_geglu(int64_t m, int64_t n, int64_t k);
/* The fused GeGLU product's ping-pong kernel (k_gemm_fp8_pp) by rule: its consumer tile's rows (64: 64x256, 192:
 * 192x128), or 0 for the planner's persistent tile (k_gemm_fp8_pt). M x n (gate|up, 2H) x K with K <= 2048 and
 * n >= 16384: 64x256 at 257-320 rows, 192x128 at 513-640 rows that overrun a 256-row multiple by at most 64; the
 * ping-pong kernel launches without PDL (NIB_FP8_GEGLU_PDL). Measured in the model only on Gemma's gate|up
 * (2048 -> 32768) at 276 and 532 rows (sixty-fourth session, H200, fast, `scripts/ab.sh env -n 2 -q -e '' -e
 * NIB_FP8_PP=0`, ms, bench/results/fp8-geglu-pp-rule-ab-h200.json): 1 camera H = 10 7.908 / 7.907 -> 7.805 / 7.804, but
 * H = 50 9.536 / 9.537 -> 9.586 / 9.582 (the rule cannot see H: at H = 50 the first flow step beside the prefix is
 * larger); 2 cameras H = 10 8.862 / 8.863 -> 8.821 / 8.815, H = 50 10.714 / 10.727 -> 10.697 / 10.698. At 788 rows (3
 * cameras) 64x256 fused took 10.139 / 10.134 -> 10.273 / 10.277 at H = 10 (fp8-pp-nopdl-default-ab-h200.json), so
 * cuBLASLt's product stays there. NIB_FP8_PP: "0" turns the rule off, "<rows>x<cols>" forces that tile (192x128,
 * 128x192, 64x256; returned here as its rows; another value returns 0 and the launch refuses it). */
int nib_fp8_geglu_pp(int64_t m, int64_t n, int64_t k);
/* whether the shapes, strides and alignment suit nib's kernel (no error set: the engine rule's
 * test; cuBLASLt takes the product otherwise) */
int nib_fp8_args_suit(const nib_blas_gemm_args *a);
/* argument checks of nib_cuda_gemm_fp8 (shapes, alignment, C overlapping Y), host code */
nib_status nib_fp8_check_args(const nib_blas_gemm_args *a);
/* how many CTAs of `tile` the device holds at once (occupancy; for cluster tiles whole clusters,
 * as the GPCs pack them) */
nib_status nib_cuda_fp8_tile_slots(const nib_fp8_tile *tile, int *ctas);
/* the product on nib's kernel with `tile` (NULL: the planner's). NIB_FP8_EPI_CPRE=1 (the default) loads each
 * epilogue thread's C chunks before its first store (one L2 round trip instead of one per chunk; the same bits),
 * 0 chunk by chunk (the A/B switch); another value is an error. */
nib_status nib_cuda_gemm_fp8(const nib_blas_gemm_args *a, const nib_fp8_tile *tile, void *stream);
/* GeGLU-tanh fused into the epilogue: W is gate | up (a->n = 2H rows), Y[m, j] = bf16(gelu_tanh(g)
 * u) with g, u the fp32 epilogue values (scales, bias) of columns j and H + j, before any rounding
 * (the unfused path rounds g and u to bf16 first); Y is M x H (ldy >= H), no C. H % 8 == 0.
 * gelu_tanh takes the hardware tanh (ops/act.h NIB_ACT_TANH_APPROX_ERR; Y feeds the W8A8 down product's
 * FP8 quantization); NIB_FAST_TANH=0: tanhf. A tile without a K split or multicast runs persistent (one CTA per
 * resident slot walking the tiles, the ring refilled under the epilogue; the same bits); NIB_FP8_PERSIST=0 (the A/B
 * switch) runs one tile a CTA, NIB_FP8_PERSIST_CTAS=N caps the persistent grid (tests); another value is an error. */
nib_status nib_cuda_gemm_fp8_geglu(const nib_blas_gemm_args *a, const nib_fp8_tile *tile, void *stream);

/* Quantize bf16 X [M,K] to e4m3 with per-token (or per-tensor) scale = amax/448 (device). */
nib_status nib_cuda_quantize_fp8_rows(const void *x, int64_t m, int64_t k, int per_token,
                                      void *xq, float *scales, void *stream);

#ifdef __cplusplus
}
#endif
#endif
