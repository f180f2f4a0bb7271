/* expert.cu — the persistent action-expert kernel (ops/expert.h): one launch runs every layer of
 * one flow-matching step.
 *
 * Layout: one CTA of 8 warps per SM, in pairs (thread-block clusters of 2; cooperative launch:
 * all CTAs resident). Per layer, six phases; grid barriers after all but attention:
 *   1 QKV    each pair's CTAs copy their half of the K columns of x into shared memory while
 *            they sum the row statistics of the adaRMS (from the per-16-column sums of squares the
 *            previous down epilogue wrote; layer 0: from x itself), and normalize; then their warps
 *            run NVFP4 tiles over that half (16 weight rows
 *            x 128 K, the repacked layout of gemm_lowbit.cuh, decoded in registers into bf16
 *            mma.sync A fragments; the H <= 16 token rows are the B operand via ldmatrix);
 *            every warp's partial sums of the even tokens go to rank 0, of the odd ones to rank 1
 *            (the other rank's through distributed shared memory); each rank's warps add theirs
 *            and write raw bf16 qkv
 *   2 attn   task (16-row block of the H x n_heads query rows, 32-key split): RoPE + q_scale
 *            applied to q on load, keys [0, P) from the cache, keys P.. from raw qkv (RoPE on
 *            load); S = q kᵀ and O = P v on tensor cores; unnormalized O, row max and sum out
 *            each task signals its row block's counter when its partials are out
 *   3 merge  no grid barrier before it: the CTAs of a row block's splits wait for that row
 *            block's counter, then each combines its share of the block (max, exp2 weights) -> o bf16
 *   4 O      the pair's halves of o staged (one cp.async.bulk per row, stage_bulk); tiles; each rank
 *            for its tokens: x = bf16(gate * acc + x) in place
 *            (each element has one writer and no other reader in this phase), and per row group
 *            the rows' sums of squares of the 16 new values (the next adaRMS's statistics)
 *   5 gate|up  adaRMS of x as in QKV; tiles; GeGLU of the interleaved gate/up rows -> h bf16
 *   6 down   the halves of h staged (as o); tiles; gated residual into x
 * Why pairs: at H = 10 every CTA that multiplies needs the whole activation row block, and
 * staging it was the largest share of a GEMM phase (80 KB of h per CTA for down); split over K,
 * each CTA stages half, and O / down (64 row groups) run on 128 CTAs instead of 64.
 * A row group's K chunks are split over the pair's warps (wk warps per row group in each CTA);
 * the 2 wk partial sums of a token meet in the shared memory of the rank that runs its epilogue
 * (rank 0 the even tokens, rank 1 the odd ones; one cluster barrier) and are added in a fixed
 * order by the warp that runs that part of the epilogue: deterministic.
 * Data written inside the kernel is read with L1-bypassing loads (ld.cg / cp.async.cg): L1 is
 * not coherent across SMs. Weights: the CTAs without O tiles issue bulk L2 prefetches of the
 * next layer's planes (and its prefix K/V) during the O phase (if every CTA has O tiles, all
 * of them do, in the barrier after QKV).
 * Grid barrier: one release-add per CTA on a count, relaxed polling until it reaches the
 * barrier's multiple of the grid, one fence; the last CTA to leave the kernel resets the count.
 * NIB_EXPERT_TRACE=1: globaltimer stamps at every barrier and per-CTA clock64 segments of each
 * phase, printed at model free (nib_cuda_expert_trace_report).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/gemm_lowbit.cuh"
#include "ops/cuda/wgmma.cuh" /* mbarriers */
#include "ops/cuda/bf16x8.cuh"
#include "ops/cuda/cluster.cuh"
#include "ops/expert.h"
#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/launch.cuh"

using namespace nib;

namespace {

constexpr int NT = 256, NW = 8;     /* threads, warps per CTA */
constexpr int HD = NIB_EXPERT_HEAD_DIM, HALF = HD / 2;
constexpr int KC = 32;              /* keys per attention task */
constexpr int QLD = HD + 8;         /* shared row stride (elements) of q / k / v tiles */
constexpr int PLD = KC + 8;         /* shared row stride of P */
constexpr float LOG2E = 1.4426950408889634f;
/* trace segments of a phase (thread 0's clock64, summed over layers): staging of the GEMM rows,
 * warp 0's tiles (attention / merge: the whole phase), reduction + epilogue (+ later rounds),
 * the next phase's preloads (to the CTA's last warp), the grid barrier, the GEMM setup, and for the
 * adaRMS phases: copy issued + statistics summed (nstat), the copy waited for (nwait). SEGW: 6 phases x NSEG,
 * then clock64 / globaltimer at start and end (clock calibration). */
constexpr int NSEG = 8, SEGW = 6 * NSEG + 4;
constexpr int NBAR = 5; /* grid barriers per layer: after qkv, merge, O, gate|up, down */
/* thread 0 (segp != NULL): add the cycles since tlast to segment s */
__device__ __forceinline__ void seg_add(unsigned long long *segp, int s, long long &tlast) {
    if (segp) {
        const long long now = clock64();
        segp[s] += (unsigned long long)(now - tlast);
        tlast = now;
    }
}

struct LinDev {
    const uint8_t *w, *s;
    const float *colscale, *bias;
    int ng, nchunks, n_out, kp;
    int gc, ngq, ngr, pad_; /* the launch's CTA pairs and ng = ngq * gc + ngr (Map without divisions) */
    unsigned long long w_bytes, s_bytes;
};
struct LayerDev {
    LinDev l[4]; /* qkv, o, gu, down */
    const __nv_bfloat16 *kc, *vc;
};
static_assert(sizeof(LayerDev) % 16 == 0, "the layer table is copied in 16-byte words");
enum { L_QKV = 0, L_O = 1, L_GU = 2, L_DOWN = 3 };

struct Params {
    const LayerDev *layers;
    int n_layers, H, We, F, nh, ldqkv, lds, max_tasks;
    int l0, l1; /* this launch's layers [l0, l1) of the table */
    const float *mods;
    const int32_t *t_valid, *slot_base, *pos;
    const float *inv_freq;
    float q_scale, eps;
    double inv_we; /* 1 / We when We is a power of two (then a * inv_we == a / We exactly), else 0 */
    uint32_t scale_add;
    __nv_bfloat16 *x, *qkv, *o, *h;
    float2 *rope;   /* [H][HALF] (cos, sin) */
    float *part;    /* [max_tasks][16][HD] */
    float2 *ml;     /* [max_tasks][16] (max (log2 units), sum) */
    float *nst;     /* [2][MAX_ROWS][nstld]: per-16-column sums of squares of x written by the O (0) and down (1)
                     * epilogues, for the adaRMS of gate|up and of the next layer's QKV */
    int ngx, nstld; /* ceil(We / 16) slots per row, row stride (even) */
    unsigned *bar;  /* [0] barrier arrivals, [32] kernel exits (separate 128-byte lines) */
    unsigned *rbc;  /* [rb * 32]: finished attention tasks of row block rb, NS per layer (own 128-byte lines) */
    unsigned long long *trace; /* NULL, or [barriers][G][2] globaltimer stamps (NIB_EXPERT_TRACE) */
    unsigned long long *seg;   /* NULL, or [G][SEGW]: per-CTA cycles per phase segment (NIB_EXPERT_TRACE) */
    int attn_off, tab_off, mods_off, seg_off, rinv_off; /* shared-memory offsets: attention tiles,
                                               * layer table, adaRMS mods, segment counters, the adaRMS
                                               * row factors */
    int pf_first; /* CTAs >= pf_first have no O-phase tiles: they prefetch the next layer then (else
                   * every CTA does, in the barrier after QKV: pf_first == gridDim.x) */
    int mbar_off; /* shared-memory offset of the staging mbarrier (o / h rows by cp.async.bulk) */
    int bulk;     /* 1: o and h staged by cp.async.bulk (one copy per row); 0: 16-byte cp.async */
    int rpf;      /* 1: grids with several rounds prefetch the next round's weights and cache rows into L2 */
    unsigned *kv_sig;   /* NULL, or [n_layers * 32]: layer l's prefix cache rows are written once
                         * kv_sig[32 l] reaches kv_target (nib_expert_args) */
    unsigned kv_target;
    volatile unsigned *kv_timeout; /* host-mapped: layer + 1 of the first wait that timed out */
};

/* ---- small helpers ---------------------------------------------------------------------- */
__device__ __forceinline__ uint4 ldcg16(const void *p) { return __ldcg((const uint4 *)p); }
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void prefetch_bulk_l2(const void *p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}
/* share `idx` of n of [p, p + bytes) into L2 (shares: 16-byte multiples; 32-bit arithmetic: a
 * 64-bit division is a long software routine) */
__device__ __forceinline__ void prefetch_share(const void *p, unsigned long long bytes, unsigned idx, unsigned n) {
    if (!p || bytes < 16 || bytes >= (1ull << 32)) return; /* a plane past 4 GB is not prefetched */
    const unsigned b = (unsigned)bytes, per = ((b / 16u + n - 1u) / n) * 16u, b0 = per * idx;
    if (b0 >= b) return;
    const unsigned m = min(per, (b - b0) & ~15u);
    if (m) prefetch_bulk_l2((const uint8_t *)p + b0, m);
}
/* every plane of a layer and the first kv_bytes of its prefix K / V (one thread per CTA) */
__device__ __noinline__ void prefetch_layer(const LayerDev &L, unsigned long long kv_bytes, unsigned idx, unsigned n) {
#pragma unroll 1
    for (int q = 0; q < 4; q++) {
        prefetch_share(L.l[q].w, L.l[q].w_bytes, idx, n);
        prefetch_share(L.l[q].s, L.l[q].s_bytes, idx, n);
    }
    prefetch_share(L.kc, kv_bytes, idx, n);
    prefetch_share(L.vc, kv_bytes, idx, n);
}

/* ---- the CTA pair (thread-block cluster of 2): each GEMM's K chunks are split between them ---- */
constexpr int CL = 2;
__device__ __forceinline__ unsigned cl_rank() { return cluster_ctarank(); }
/* cluster_sync (ops/cuda/cluster.cuh), all threads of both CTAs, orders shared-memory writes
 * (local and remote) before the reads after it. The start of the launch: the partner CTA's shared
 * memory may be written only once the partner is known to be running (CUDA's rule for
 * distributed shared memory; racecheck reports the first st_peer otherwise). Every thread
 * arrives at entry (cluster_arrive_relaxed) and waits (cluster_wait) before the first remote
 * store, so the prologue's loads overlap the handshake. */
/* the address of a shared variable in CTA `rank` of the cluster */
__device__ __forceinline__ uint32_t peer_addr(const void *p, unsigned rank) { return cluster_map(smem_u32(p), rank); }
__device__ __forceinline__ void st_peer(uint32_t a, float v) { st_cluster_f32(a, v); }
/* the K columns [k0, k1) of a linear this CTA of the pair stages and multiplies: chunks
 * [0, h) on rank 0 and [h, nchunks) on rank 1, h = ceil(nchunks / 2) */
struct KHalf {
    int c0, c1;
    __device__ __forceinline__ KHalf(const LinDev &L) {
        const int h = (L.nchunks + 1) >> 1;
        c0 = cl_rank() ? h : 0;
        c1 = cl_rank() ? L.nchunks : h;
    }
};

__device__ __forceinline__ unsigned ld_relaxed(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_add(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
/* Grid-wide barrier number `k` (1-based) of this launch: one release-add per CTA, then poll
 * until all G x k arrivals are in. The count starts at 0 in every launch: the last CTA to
 * leave the kernel resets it (kernel_exit). trace: optional (work done, released) stamps. */
__device__ __forceinline__ void grid_barrier(const Params &p, unsigned &k, const LayerDev *pf,
                                             unsigned long long kv_bytes) {
    __syncthreads();
    k++;
    if (threadIdx.x == 0) {
        if (p.trace) p.trace[((size_t)(k - 1) * gridDim.x + blockIdx.x) * 2] = gtimer();
        red_release_add(p.bar, 1u); /* release (cumulative: the CTA's writes, ordered by the __syncthreads) */
        if (pf) prefetch_layer(*pf, kv_bytes, blockIdx.x, gridDim.x); /* issued while the other CTAs arrive */
        const unsigned target = k * gridDim.x;
        while (ld_relaxed(p.bar) < target) { /* relaxed polls (an acquire load invalidates L1 every time) */
        }
        fence_acq_rel(); /* then one fence: with the relaxed load that saw the count, an acquire */
        if (p.trace) p.trace[((size_t)(k - 1) * gridDim.x + blockIdx.x) * 2 + 1] = gtimer();
    }
    __syncthreads();
}
__device__ __forceinline__ void kernel_exit(const Params &p) {
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(p.bar + 32, 1u) == gridDim.x - 1) { /* everyone passed every barrier */
        atomicExch(p.bar, 0u);
        for (int rb = 0; rb < (p.H * p.nh + 15) / 16; rb++) atomicExch(p.rbc + 32 * rb, 0u);
        /* every CTA waited for every layer's counter, so every signalling launch has added to it (after a
         * timeout one may add later: the host then zeroes the counters before the next call) */
        if (p.kv_sig)
            for (int l = p.l0; l < p.l1; l++) atomicExch(p.kv_sig + 32 * l, 0u);
        atomicExch(p.bar + 32, 0u);
    }
}
/* Beside the prefix (p.kv_sig): wait until layer `layer`'s prefix cache rows are written (relaxed
 * polls by thread 0, then one fence, as grid_barrier). A counter that has not arrived after
 * NIB_EXPERT_KV_TIMEOUT_NS is not waited for any longer, and this CTA waits for no later layer
 * (every CTA gives up after one timeout, all at about the same time): the layer + 1 goes to the
 * host-mapped flag, the kernel finishes, the host fails the call (nib_expert_args.kv_timeout). No
 * trap: the context stays usable. */
__device__ __forceinline__ void wait_kv(const Params &p, int layer, bool &gave_up) {
    if (threadIdx.x == 0) {
        const unsigned *c = p.kv_sig + 32 * layer;
        if (!gave_up && ld_relaxed(c) < p.kv_target) {
            const unsigned long long t0 = gtimer();
            while (ld_relaxed(c) < p.kv_target)
                if (gtimer() - t0 > NIB_EXPERT_KV_TIMEOUT_NS) {
                    *p.kv_timeout = (unsigned)layer + 1u; /* any CTA's layer: the host only needs one */
                    gave_up = true;
                    break;
                }
        }
        fence_acq_rel();
    }
    __syncthreads();
}

/* ---- staging of the GEMM input rows (bf16, rows 0..H-1, zero row H, zero columns K..kp) ---- */
/* (scale, shift) of an adaRMS (2 x width contiguous floats of mods) -> shared, one cp.async group.
 * The previous mods copy into the same buffer is waited for first: a CTA without tiles in the
 * phase that waits (stage_copy) would otherwise have two copies to the same bytes in flight, and
 * cp.async gives no order between them (racecheck: "invalid memcpy_async synchronization"). By
 * now that copy finished long ago (a grid barrier lies between), so the wait costs nothing. */
__device__ __forceinline__ void stage_mods(const Params &p, const float *ss, float *dst) {
    cp_async_wait_all();
    for (int i = threadIdx.x; i < p.We / 2; i += NT) cp_async16(smem_u32(dst + 4 * i), ss + 4 * i, 16);
    cp_async_commit();
}
/* rows of src [H][ld] (K columns, written earlier in this kernel), columns [k0, k1) -> xs (zero
 * from K on), zero row H over the same columns */
__device__ void stage_issue(const Params &p, const __nv_bfloat16 *src, int ld, int K, int k0, int k1, __nv_bfloat16 *xs) {
    const int w8 = (k1 - k0) / 8, p0 = k0 / 8;
    if (w8 > 0) {
        /* (row, piece), advanced by (NT / w8, NT % w8) with one carry per copy */
        int r = threadIdx.x / w8, c = threadIdx.x - r * w8;
        const int dr = NT / w8, dc = NT - dr * w8;
        for (; r <= p.H;) {
            const int col = 8 * (p0 + c);
            const bool ok = r < p.H && col < K;
            cp_async16(smem_u32(xs + (size_t)r * p.lds + col), ok ? (const void *)(src + (size_t)r * ld + col) : src,
                       ok ? 16 : 0);
            r += dr;
            c += dc;
            if (c >= w8) {
                c -= w8;
                r++;
            }
        }
    }
    cp_async_commit();
}
__device__ void stage_copy(const Params &p, const __nv_bfloat16 *src, int ld, int K, int k0, int k1, __nv_bfloat16 *xs) {
    stage_issue(p, src, ld, K, k0, k1, xs);
    cp_async_wait_all();
    __syncthreads();
}
/* The same rows (K columns exactly: [k0, k1) within K) by cp.async.bulk: row r by lane r of warp 0
 * (one copy each, so the copies issue in parallel), completing on the CTA's staging mbarrier, whose
 * phase `ph` this call waits for (then flips); the zero row H by the other threads meanwhile. The
 * rows were written in this kernel by other CTAs (generic stores, acquired at the grid barrier) and
 * the destination last by this CTA's generic stores: the issuing lanes' proxy fence orders both
 * before the async-proxy copy. */
__device__ __forceinline__ void bulk_row_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ void stage_bulk(const Params &p, const __nv_bfloat16 *src, int ld, int k0, int k1, __nv_bfloat16 *xs,
                           uint32_t bar, unsigned &ph) {
    const uint32_t bytes = (uint32_t)(k1 - k0) * 2u;
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) mbar_arrive_expect_tx(bar, bytes * (uint32_t)p.H);
        __syncwarp();
        if ((int)threadIdx.x < p.H && bytes) { /* (a pair's second half is empty when a linear has one chunk) */
            asm volatile("fence.proxy.async;" ::: "memory");
            bulk_row_g2s(smem_u32(xs + (size_t)threadIdx.x * p.lds + k0), src + (size_t)threadIdx.x * ld + k0, bytes, bar);
        }
    }
    for (int i = (int)threadIdx.x; i < (k1 - k0) / 8; i += NT)
        *(uint4 *)(xs + (size_t)p.H * p.lds + k0 + 8 * i) = make_uint4(0u, 0u, 0u, 0u);
    mbar_wait(bar, ph);
    ph ^= 1u;
    __syncthreads();
}

/* slots sl, sl + 1 (sl even) of a statistics row, zero from n on (those were never written) */
__device__ __forceinline__ float2 ld_slots(const float *row, int sl, int n) {
    if (sl + 1 < n) return __ldcg((const float2 *)(row + sl));
    return make_float2(sl < n ? __ldcg(row + sl) : 0.f, 0.f);
}
/* adaRMS of x rows 0..H-1, columns [k0, k1) of this CTA's half (zero from We on) -> xs, zero row H
 * over the same columns. The raw rows are loaded into registers while the row statistics are
 * summed: from the per-16-column partial sums of squares the producing epilogue wrote (nst:
 * [MAX_ROWS][nstld], slots 0..ngx-1 of a row; gemm_phase with a statistics buffer), or, where x came from outside the kernel
 * (layer 0's QKV: nst == NULL), from the full rows of x in global memory. Both in a fixed order
 * (lane-strided double sums, then an xor butterfly, which leaves every lane the same value), so
 * every CTA, both of a pair included, gets bit-identical factors without exchanging anything.
 * Then each thread normalizes its pieces and stores them to shared memory. */
/* one staged piece: row r < H with data (col < We) adaRMS-normalized, else stored as given (zero);
 * rows past H are not staged */
__device__ __forceinline__ void norm_store(const Params &p, __nv_bfloat16 *xs, const float *rinv, const float *scale,
                                           const float *shift, int r, int col, uint4 v) {
    if (r > p.H) return;
    if (r < p.H && col < p.We) {
        const float inv = rinv[r];
        float f[8];
        unpack8(v, f);
        const float4 s0 = *(const float4 *)(scale + col), s1 = *(const float4 *)(scale + col + 4);
        const float4 h0 = *(const float4 *)(shift + col), h1 = *(const float4 *)(shift + col + 4);
        const float sc[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
        const float sh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float t = __fmul_rn(f[k], inv);
            t = __fmul_rn(t, __fadd_rn(1.0f, sc[k]));
            f[k] = __fadd_rn(t, sh[k]);
        }
        v = pack8(f);
    }
    *(uint4 *)(xs + (size_t)r * p.lds + col) = v;
}
__device__ void stage_norm(const Params &p, const float *mods_s, __nv_bfloat16 *xs, float *rinv, const float *nst,
                           int k0, int k1, unsigned long long *segp, long long &tlast) {
    const float *scale = mods_s, *shift = mods_s + p.We;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* the rows' pieces (16 bytes) into registers: (row, piece) walks by (NT / w8, NT % w8) with one
     * carry; rows 0..H-1 with data, row H and columns from We on zero */
    const int w8 = (k1 - k0) / 8, p0 = k0 / 8;
    int r = 0, c = 0, dr = 0, dc = 0;
    if (w8 > 0) r = threadIdx.x / w8, c = threadIdx.x - r * w8, dr = NT / w8, dc = NT - dr * w8;
    else r = p.H + 1; /* nothing to stage */
    constexpr int NP = 4; /* pieces per thread in the first round (all of them at H = 10, We = 1024) */
    uint4 v[NP];
    int vr[NP], vc[NP];
#pragma unroll
    for (int u = 0; u < NP; u++) {
        const int col = 8 * (p0 + c);
        vr[u] = r, vc[u] = c;
        v[u] = r < p.H && col < p.We ? ldcg16(p.x + (size_t)r * p.We + col) : make_uint4(0, 0, 0, 0);
        r += dr, c += dc;
        if (c >= w8) c -= w8, r++;
    }
    static_assert(NIB_EXPERT_MAX_ROWS <= 2 * NW, "two rows per warp");
    {   /* rows warp and warp + NW together: every load of the warp in flight at once */
        const int r0 = warp, r1 = warp + NW;
        double a0 = 0.0, a1 = 0.0;
        if (nst) { /* a row's slots are contiguous: a warp reads 2 x 256 bytes per 64 slots */
#pragma unroll 1
            for (int s0 = 2 * lane; s0 < p.ngx; s0 += 2 * 2 * 32) {
                float2 v0[2], v1[2];
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int sl = s0 + 2 * 32 * u;
                    v0[u] = r0 < p.H ? ld_slots(nst + (size_t)r0 * p.nstld, sl, p.ngx) : make_float2(0.f, 0.f);
                    v1[u] = r1 < p.H ? ld_slots(nst + (size_t)r1 * p.nstld, sl, p.ngx) : make_float2(0.f, 0.f);
                }
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    a0 += (double)v0[u].x, a0 += (double)v0[u].y;
                    a1 += (double)v1[u].x, a1 += (double)v1[u].y;
                }
            }
        } else {
            const int pw = p.We / 8;
#pragma unroll 1
            for (int c0 = lane; c0 < pw; c0 += 2 * 32) {
                uint4 u0[2], u1[2];
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int c = c0 + 32 * u;
                    const uint4 z = make_uint4(0, 0, 0, 0);
                    u0[u] = r0 < p.H && c < pw ? ldcg16(p.x + (size_t)r0 * p.We + 8 * c) : z;
                    u1[u] = r1 < p.H && c < pw ? ldcg16(p.x + (size_t)r1 * p.We + 8 * c) : z;
                }
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    float f[8], h[8];
                    unpack8(u0[u], f);
                    unpack8(u1[u], h);
#pragma unroll
                    for (int k = 0; k < 8; k++) a0 += (double)f[k] * (double)f[k], a1 += (double)h[k] * (double)h[k];
                }
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            a0 += __shfl_xor_sync(0xffffffffu, a0, off);
            a1 += __shfl_xor_sync(0xffffffffu, a1, off);
        }
        if (lane == 0) {
            /* the mean: a product where it is exact (no fp64 division on this critical path); 1 / rms
             * as the correctly rounded reciprocal, the same value as 1.0f / s and cheaper */
            const double d0 = p.inv_we != 0.0 ? a0 * p.inv_we : a0 / (double)p.We;
            const double d1 = p.inv_we != 0.0 ? a1 * p.inv_we : a1 / (double)p.We;
            const float m0 = __double2float_rn(d0), m1 = __double2float_rn(d1);
            rinv[r0] = __frcp_rn(__fsqrt_rn(__fadd_rn(m0, p.eps)));
            if (r1 < NIB_EXPERT_MAX_ROWS) rinv[r1] = __frcp_rn(__fsqrt_rn(__fadd_rn(m1, p.eps)));
        }
    }
    seg_add(segp, 6, tlast);
    cp_async_wait_all(); /* the mods (and cache-row) copies */
    __syncthreads();
    seg_add(segp, 7, tlast);
    /* normalize and store: the first round from registers, the rest (wider rows) one piece at a time */
#pragma unroll
    for (int u = 0; u < NP; u++) norm_store(p, xs, rinv, scale, shift, vr[u], 8 * (p0 + vc[u]), v[u]);
#pragma unroll 1
    for (; r <= p.H;) {
        const int col = 8 * (p0 + c);
        norm_store(p, xs, rinv, scale, shift, r, col,
                   r < p.H && col < p.We ? ldcg16(p.x + (size_t)r * p.We + col) : make_uint4(0, 0, 0, 0));
        r += dr, c += dc;
        if (c >= w8) c -= w8, r++;
    }
    __syncthreads();
}
/* ---- NVFP4 tiles of one linear layer over the staged rows --------------------------------
 * CTA b owns row groups b, b + G, ...; Rp of them at a time, wk = 8 / Rp warps each splitting
 * the K chunks (chunks wkk, wkk + wk, ...), four tiles' loads in flight per warp. The 2 wk
 * partial sums of a row group (both CTAs of the pair) meet per token parity: pairs (nt, i) in
 * rank i's shared memory, whose wk warps of the slot share that half of the epilogue (warp wkk =
 * nt % wk). The first
 * four tiles of a warp, its rows' column scales and gates, and (residual layers) the x values
 * its epilogue adds are loaded by gemm_pre BEFORE the grid barrier that precedes the phase:
 * none of them depends on the phase before. */
struct Map {
    int U, Rp, wk, slot, wkk, GC, pair, c0, c1; /* pair: this CTA pair's index; [c0, c1): its K chunks */
    __device__ __forceinline__ Map(const LinDev &L) {
        static_assert(NW == 8, "Rp, wk and slot below are shifts for 8 warps");
        GC = gridDim.x / CL, pair = blockIdx.x / CL;
        /* rows groups pair, pair + GC, ... < ng: ngq + (pair < ngr) of them (host-side quotient;
         * the division only if the table was made for another grid) */
        U = L.gc == GC ? L.ngq + (pair < L.ngr ? 1 : 0) : pair < L.ng ? (L.ng - pair + GC - 1) / GC : 0;
        const int lg = U >= 5 ? 3 : U >= 3 ? 2 : U >= 2 ? 1 : 0; /* Rp = 1, 2, 4, 8 */
        Rp = 1 << lg;
        wk = NW >> lg;
        slot = (threadIdx.x >> 5) >> (3 - lg);
        wkk = (threadIdx.x >> 5) & (wk - 1);
        const KHalf kh(L);
        c0 = kh.c0, c1 = kh.c1;
    }
};
template <int MT> struct Pre {
    Chunk<NIB_WFMT_NVFP4> ch[4][1];
    float cs0, cs8, gt0, gt8; /* column scales and gates of rows pr, pr + 8 */
    __nv_bfloat16 res[MT][2][2]; /* [nt][i][row g / g + 8]: x values of the residual epilogue (converted
                                  * at use, so the loads stay in flight across the barrier) */
};
template <int MT>
__device__ __forceinline__ void gemm_pre(const Params &p, const LinDev &L, const float *gate, Pre<MT> &pr) {
    const Map mp(L);
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (mp.slot >= mp.U) return; /* also: no row group on this pair */
    const int rg = mp.pair + mp.slot * mp.GC, prow = rg * 16 + g;
    const uint64_t pol = evict_first_policy();
    const uint8_t *wb = L.w + (size_t)rg * L.nchunks * 1024 + lane * 16;
    const uint8_t *sb = L.s + (size_t)rg * L.nchunks * 128 + g * 16;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = mp.c0 + mp.wkk + i * mp.wk;
        if (c < mp.c1) {
            pr.ch[i][0].e[0] = ldg_stream(wb + (size_t)c * 1024, pol);
            pr.ch[i][0].e[1] = ldg_stream(wb + (size_t)c * 1024 + 512, pol);
            pr.ch[i][0].s = ldg_stream(sb + (size_t)c * 128, pol);
        }
    }
    /* the epilogue runs on both CTAs of the pair: rank r the pairs (nt, i = r), each warp of the slot
     * those with nt % wk == wkk */
    const int rank = (int)cl_rank();
    pr.cs0 = L.colscale[prow], pr.cs8 = L.colscale[prow + 8];
    if (gate) {
        pr.gt0 = prow < L.n_out ? gate[prow] : 0.f;
        pr.gt8 = prow + 8 < L.n_out ? gate[prow + 8] : 0.f;
#pragma unroll
        for (int nt = 0; nt < MT; nt++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                if (i != rank || (nt & (mp.wk - 1)) != mp.wkk) continue; /* gemm_phase: another warp's pair */
                const int mm = nt * 8 + 2 * t + i;
                const __nv_bfloat16 *xr = p.x + (size_t)mm * p.We;
                pr.res[nt][i][0] = mm < p.H && prow < L.n_out ? __ldcg(xr + prow) : __float2bfloat16(0.f);
                pr.res[nt][i][1] = mm < p.H && prow + 8 < L.n_out ? __ldcg(xr + prow + 8) : __float2bfloat16(0.f);
            }
    }
}

enum { EPI_QKV = 0, EPI_RESIDUAL = 1, EPI_GEGLU = 2 };
template <int MT>
__device__ __forceinline__ float residual_store(const Params &p, const LinDev &L, int pr, int mm, float v, float v8,
                                                bool first, const Pre<MT> &pre, int nt, int i, const float *gate);
/* epilogue kind: EPI_QKV (raw qkv), EPI_RESIDUAL (x = bf16(gate * v + x); with nst, the sums of
 * squares of each row group's 16 new x values per row go to nst[row][rg] for the next adaRMS,
 * stage_norm), EPI_GEGLU (h); one
 * instantiation and one call site, so the kernel's code stays small (instruction-cache misses
 * were a large share of the stalls when every phase had its own copy) */
template <int MT>
__device__ void gemm_phase(const Params &p, const LinDev &L, const __nv_bfloat16 *xs, float *red, const Pre<MT> &pr,
                           int kind, const float *gate, float *nst, unsigned long long *segp, long long &tlast) {
    const Map mp(L);
    if (mp.U == 0) return; /* uniform per pair */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const unsigned rank = cl_rank();
    const uint64_t pol = evict_first_policy();
    uint32_t brow[MT];
#pragma unroll
    for (int nt = 0; nt < MT; nt++) {
        const int row = min(nt * 8 + (lane & 7), p.H);
        brow[nt] = smem_u32(xs) + (uint32_t)(row * p.lds + (lane >> 3) * 8) * 2u;
    }
    constexpr int FH = MT * 2; /* partial sums per lane and rank (each rank's half of the MT * 4 accumulators) */
    const int NQ = 2 * mp.wk; /* partial sums per row group: wk warps x 2 CTAs (<= 2 NW) */
    seg_add(segp, 5, tlast);
    for (int j0 = 0; j0 < mp.U; j0 += mp.Rp) {
        const int j = j0 + mp.slot;
        const bool ok = j < mp.U;
        const int rg = mp.pair + j * mp.GC, prow = rg * 16 + g;
        if (p.rpf && lane == 0 && mp.wkk == 0 && j + mp.Rp < mp.U) {
            /* grids with several rounds (few CTAs): the slot's next row group's K chunks into L2 now,
             * one bulk prefetch per plane (the layer's prefetch at its start is evicted by then where
             * the kernel runs beside the prefix, whose weights stream through L2) */
            const int rgn = rg + mp.Rp * mp.GC, nc = mp.c1 - mp.c0;
            prefetch_bulk_l2(L.w + ((size_t)rgn * L.nchunks + mp.c0) * 1024, (unsigned)nc * 1024u);
            prefetch_bulk_l2(L.s + ((size_t)rgn * L.nchunks + mp.c0) * 128, (unsigned)nc * 128u);
        }
        float acc[1][MT][4], acc2[1][MT][4];
#pragma unroll
        for (int nt = 0; nt < MT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[0][nt][i] = acc2[0][nt][i] = 0.f;
        if (ok) {
            const uint8_t *wb = L.w + (size_t)rg * L.nchunks * 1024 + lane * 16;
            const uint8_t *sb = L.s + (size_t)rg * L.nchunks * 128 + g * 16;
            for (int c0 = mp.c0 + mp.wkk; c0 < mp.c1; c0 += 4 * mp.wk) {
                Chunk<NIB_WFMT_NVFP4> ch[4][1];
                const bool first = j0 == 0 && c0 == mp.c0 + mp.wkk;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int c = c0 + i * mp.wk;
                    if (first) ch[i][0] = pr.ch[i][0];
                    else if (c < mp.c1) {
                        ch[i][0].e[0] = ldg_stream(wb + (size_t)c * 1024, pol);
                        ch[i][0].e[1] = ldg_stream(wb + (size_t)c * 1024 + 512, pol);
                        ch[i][0].s = ldg_stream(sb + (size_t)c * 128, pol);
                    }
                }
#pragma unroll 1
                for (int i = 0; i < 4; i++) { /* rolled: one copy of the chunk code; tiles shift down */
                    const int c = c0 + i * mp.wk;
                    if (c < mp.c1) {
                        uint32_t bw[MT];
#pragma unroll
                        for (int nt = 0; nt < MT; nt++) bw[nt] = brow[nt] + (uint32_t)c * 256u;
                        compute_chunk<NIB_WFMT_NVFP4, MT, 1>(acc, acc2, ch[0], p.scale_add, bw);
                    }
                    ch[0][0] = ch[1][0];
                    ch[1][0] = ch[2][0];
                    ch[2][0] = ch[3][0];
                }
            }
        }
        if (segp && j0 == 0) { /* thread 0 only: warp 0's tiles of the first round */
            const long long now = clock64();
            segp[1] += (unsigned long long)(now - tlast);
            tlast = now;
        }
        /* every warp's partial sums of the pairs (nt, i) into rank i's red[slot][q][FH][32], q = rank *
         * wk + wkk, index nt * 2 + (row g: 0, row g + 8: 1): its own rank's half by shared-memory stores,
         * the other half through distributed shared memory; one cluster barrier; then each rank's warps
         * of the slot add the NQ partials (q order: deterministic) of their pairs and run the epilogue of
         * those (rank r: the tokens nt * 8 + 2 t + r) */
        if (ok) {
            const size_t at = ((size_t)(mp.slot * NQ + (int)rank * mp.wk + mp.wkk) * FH) * 32 + lane;
            float *own = red + at;
            const uint32_t other = peer_addr(own, rank ^ 1u);
#pragma unroll
            for (int nt = 0; nt < MT; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++) { /* h: row g (acc index i), row g + 8 (2 + i) */
                    const float v0 = acc[0][nt][2 * h] + acc2[0][nt][2 * h];         /* token nt * 8 + 2 t */
                    const float v1 = acc[0][nt][2 * h + 1] + acc2[0][nt][2 * h + 1]; /* token nt * 8 + 2 t + 1 */
                    own[(nt * 2 + h) * 32] = rank ? v1 : v0;
                    st_peer(other + (uint32_t)((nt * 2 + h) * 32 * 4), rank ? v0 : v1);
                }
        }
        cluster_sync();
        if (ok) {
            const float *src = red + ((size_t)mp.slot * NQ * FH) * 32 + lane;
            /* the first round's scales come from gemm_pre; later rounds load their own */
            const float cs0 = j0 == 0 ? pr.cs0 : L.colscale[prow], cs8 = j0 == 0 ? pr.cs8 : L.colscale[prow + 8];
            const float b0 = L.bias ? L.bias[prow] : 0.f, b8 = L.bias ? L.bias[prow + 8] : 0.f;
#pragma unroll
            for (int nt = 0; nt < MT; nt++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    if (i != (int)rank || (nt & (mp.wk - 1)) != mp.wkk) continue; /* another rank's or warp's pair */
                    float a = 0.f, a8 = 0.f, xa[2 * NW], xb[2 * NW];
#pragma unroll
                    for (int q = 0; q < 2 * NW; q++) /* every load first, then the sums in q order */
                        if (q < NQ) {
                            xa[q] = src[(q * FH + nt * 2) * 32];
                            xb[q] = src[(q * FH + nt * 2 + 1) * 32];
                        }
#pragma unroll
                    for (int q = 0; q < 2 * NW; q++)
                        if (q < NQ) a += xa[q], a8 += xb[q];
                    const int mm = nt * 8 + 2 * t + i;
                    float ss = 0.f; /* sum of squares of the new x values (EPI_RESIDUAL) */
                    if (mm < p.H) {
                        const float v = a * cs0 + b0, v8 = a8 * cs8 + b8;
                        if (kind == EPI_QKV) {
                            if (prow < L.n_out) p.qkv[(size_t)mm * p.ldqkv + prow] = __float2bfloat16(v);
                            if (prow + 8 < L.n_out) p.qkv[(size_t)mm * p.ldqkv + prow + 8] = __float2bfloat16(v8);
                        } else if (kind == EPI_RESIDUAL) {
                            ss = residual_store(p, L, prow, mm, v, v8, j0 == 0, pr, nt, i, gate);
                        } else {
                            const int n = rg * 8 + g;
                            if (n < L.n_out) p.h[(size_t)mm * p.F + n] = __float2bfloat16(gelu_tanh(v) * v8);
                        }
                    }
                    if (nst && rg * 16 < L.n_out) { /* the row group's 16 columns: the 8 lanes of equal t */
                        ss += __shfl_xor_sync(0xffffffffu, ss, 4);
                        ss += __shfl_xor_sync(0xffffffffu, ss, 8);
                        ss += __shfl_xor_sync(0xffffffffu, ss, 16);
                        if (g == 0 && mm < p.H) __stcg(nst + (size_t)mm * p.nstld + rg, ss);
                    }
                }
        }
        if (j0 + mp.Rp < mp.U) cluster_sync(); /* red is reused by the next round */
    }
    if (segp) {
        const long long now = clock64();
        segp[2] += (unsigned long long)(now - tlast);
        tlast = now;
    }
}

/* ---- attention over the cache + the step's own keys ------------------------------------- */
/* 8 elements at dims [8j, 8j + 8) and [HALF + 8j, ...) of a q or k head at src, RoPE'd with
 * token `tok`'s table (and scaled), into dst (shared, bf16) */
__device__ __forceinline__ void rope_row(const Params &p, const __nv_bfloat16 *src, int tok, int j, float scale,
                                         bool do_scale, __nv_bfloat16 *dst) {
    float a[8], b[8];
    const uint4 ua = ldcg16(src + 8 * j), ub = ldcg16(src + HALF + 8 * j);
    float4 cs[4];
    const float4 *tb = (const float4 *)(p.rope + (size_t)tok * HALF + 8 * j);
#pragma unroll
    for (int k = 0; k < 4; k++) cs[k] = __ldcg(tb + k);
    unpack8(ua, a);
    unpack8(ub, b);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float ec = (k & 1) ? cs[k >> 1].z : cs[k >> 1].x, es = (k & 1) ? cs[k >> 1].w : cs[k >> 1].y;
        const float ac = __fmul_rn(a[k], ec), bs = __fmul_rn(b[k], es);
        const float bc = __fmul_rn(b[k], ec), as = __fmul_rn(a[k], es);
        a[k] = __fsub_rn(ac, bs);
        b[k] = __fadd_rn(bc, as);
        if (do_scale) {
            a[k] = __fmul_rn(a[k], scale);
            b[k] = __fmul_rn(b[k], scale);
        }
    }
    *(uint4 *)(dst + 8 * j) = pack8(a);
    *(uint4 *)(dst + HALF + 8 * j) = pack8(b);
}

struct AttnSmem {
    __nv_bfloat16 *qs, *ks, *vs, *ps;
    float *sred;
    __device__ __forceinline__ AttnSmem(unsigned char *base) {
        qs = (__nv_bfloat16 *)base;             /* [16][QLD] */
        ks = qs + 16 * QLD;                     /* [KC][QLD] */
        vs = ks + KC * QLD;                     /* [KC][QLD] */
        sred = (float *)(vs + KC * QLD);        /* [2][16][KC] */
        ps = (__nv_bfloat16 *)(sred + 2 * 16 * KC); /* [16][PLD] */
    }
};
constexpr size_t ATTN_SMEM = (size_t)(16 + 2 * KC) * QLD * 2 + 2 * 16 * KC * sizeof(float) + 16 * PLD * 2;

/* the cache rows (keys < P) of a task's key split, as cp.async copies (one commit group) */
__device__ __noinline__ void attn_issue_cache(const LayerDev &Ld, const AttnSmem &sm, int k0, int P) {
    const int j16 = threadIdx.x & 15, r16 = threadIdx.x >> 4;
    for (int kr = r16; kr < KC; kr += 16) {
        const int key = k0 + kr;
        if (key < P) {
            __nv_bfloat16 *kd = sm.ks + kr * QLD, *vd = sm.vs + kr * QLD;
            const __nv_bfloat16 *kg = Ld.kc + (size_t)key * HD, *vg = Ld.vc + (size_t)key * HD;
            cp_async16(smem_u32(kd + 8 * j16), kg + 8 * j16, 16);
            cp_async16(smem_u32(kd + HALF + 8 * j16), kg + HALF + 8 * j16, 16);
            cp_async16(smem_u32(vd + 8 * j16), vg + 8 * j16, 16);
            cp_async16(smem_u32(vd + HALF + 8 * j16), vg + HALF + 8 * j16, 16);
        }
    }
    cp_async_commit();
}

/* first_issued: the cache rows of this CTA's first task were issued earlier (attn_issue_cache) */
__device__ void attn_phase(const Params &p, const LayerDev &Ld, unsigned char *abase, bool first_issued, int T, int P) {
    const AttnSmem sm(abase);
    const int R = p.H * p.nh;
    const int RB = (R + 15) / 16, NS = (T + KC - 1) / KC, tasks = RB * NS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int j16 = threadIdx.x & 15, r16 = threadIdx.x >> 4; /* 16 threads per row */
    for (int task = blockIdx.x; task < tasks; task += gridDim.x) {
        const int rb = task / NS, sp = task - rb * NS, k0 = sp * KC;
        if (!(first_issued && task == (int)blockIdx.x)) attn_issue_cache(Ld, sm, k0, P);
        if (p.rpf && threadIdx.x == 0 && task + (int)gridDim.x < tasks) { /* few CTAs: the next task's cache rows into L2 */
            const int nt = task + (int)gridDim.x, nk0 = (nt - (nt / NS) * NS) * KC, nk = min(KC, P - nk0);
            if (nk > 0) {
                prefetch_bulk_l2(Ld.kc + (size_t)nk0 * HD, (unsigned)nk * HD * 2u);
                prefetch_bulk_l2(Ld.vc + (size_t)nk0 * HD, (unsigned)nk * HD * 2u);
            }
        }
        { /* q rows (RoPE + scale on load) */
            const int r = rb * 16 + r16;
            __nv_bfloat16 *dst = sm.qs + r16 * QLD;
            if (r < R) {
                const int tok = r / p.nh, hh = r - tok * p.nh;
                rope_row(p, p.qkv + (size_t)tok * p.ldqkv + hh * HD, tok, j16, p.q_scale, true, dst);
            } else {
                *(uint4 *)(dst + 8 * j16) = make_uint4(0, 0, 0, 0);
                *(uint4 *)(dst + HALF + 8 * j16) = make_uint4(0, 0, 0, 0);
            }
        }
        for (int kr = r16; kr < KC; kr += 16) { /* the step's own keys (RoPE on load), or zero */
            const int key = k0 + kr;
            __nv_bfloat16 *kd = sm.ks + kr * QLD, *vd = sm.vs + kr * QLD;
            if (key < P) continue;
            if (key < T) {
                const int tok = key - P;
                const __nv_bfloat16 *src = p.qkv + (size_t)tok * p.ldqkv + p.nh * HD;
                rope_row(p, src, tok, j16, 1.0f, false, kd);
                *(uint4 *)(vd + 8 * j16) = ldcg16(src + HD + 8 * j16);
                *(uint4 *)(vd + HALF + 8 * j16) = ldcg16(src + HD + HALF + 8 * j16);
            } else {
                const uint4 z = make_uint4(0, 0, 0, 0);
                *(uint4 *)(kd + 8 * j16) = z;
                *(uint4 *)(kd + HALF + 8 * j16) = z;
                *(uint4 *)(vd + 8 * j16) = z;
                *(uint4 *)(vd + HALF + 8 * j16) = z;
            }
        }
        cp_async_wait_all();
        __syncthreads();
        { /* S = q kᵀ: warp = (key n-tile w & 3, dim half w >> 2) */
            const int nt = warp & 3, kh = warp >> 2;
            float c[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
            const uint32_t qa = smem_u32(sm.qs) + (uint32_t)((lane & 15) * QLD + (lane >> 4) * 8) * 2u;
            const uint32_t kb = smem_u32(sm.ks) + (uint32_t)((nt * 8 + (lane & 7)) * QLD + (lane >> 3) * 8) * 2u;
#pragma unroll
            for (int s = 0; s < HALF / 16; s += 2) {
                const int d0 = kh * HALF + s * 16;
                uint32_t a0[4], a1[4], bb[4];
                ldmatrix_x4(a0, qa + d0 * 2);
                ldmatrix_x4(a1, qa + (d0 + 16) * 2);
                ldmatrix_x4(bb, kb + d0 * 2);
                mma_bf16(c, a0, bb[0], bb[1]);
                mma_bf16(c2, a1, bb[2], bb[3]);
            }
            float *sr = sm.sred + kh * 16 * KC;
            *(float2 *)(sr + g * KC + nt * 8 + 2 * t) = make_float2(c[0] + c2[0], c[1] + c2[1]);
            *(float2 *)(sr + (g + 8) * KC + nt * 8 + 2 * t) = make_float2(c[2] + c2[2], c[3] + c2[3]);
        }
        __syncthreads();
        { /* softmax pieces: warp -> rows 2w, 2w + 1; lane -> key (KC == 32) */
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int row = 2 * warp + rr;
                const bool valid = k0 + lane < T;
                const float s = sm.sred[row * KC + lane] + sm.sred[16 * KC + row * KC + lane];
                const float x = valid ? s * LOG2E : -INFINITY;
                float m = x;
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
                const float pr = valid ? exp2f(x - m) : 0.f; /* key k0 < T always: m is finite */
                float l = pr;
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
                sm.ps[row * PLD + lane] = __float2bfloat16_rn(pr);
                if (lane == 0) p.ml[(size_t)task * 16 + row] = make_float2(m, l);
            }
        }
        __syncthreads();
        { /* O = P v: warp -> dims 32w .. 32w + 31 (4 n-tiles), 2 key steps */
            float c[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
            const uint32_t pa = smem_u32(sm.ps) + (uint32_t)((lane & 15) * PLD + (lane >> 4) * 8) * 2u;
#pragma unroll
            for (int ks2 = 0; ks2 < KC / 16; ks2++) {
                uint32_t a[4];
                ldmatrix_x4(a, pa + ks2 * 32);
#pragma unroll
                for (int np2 = 0; np2 < 2; np2++) {
                    const int n0 = warp * 32 + np2 * 16;
                    const int krow = ks2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                    uint32_t bb[4];
                    ldsm_x4_trans(bb, smem_u32(sm.vs) + (uint32_t)(krow * QLD + n0 + (lane >> 4) * 8) * 2u);
                    mma_bf16(c[2 * np2], a, bb[0], bb[1]);
                    mma_bf16(c[2 * np2 + 1], a, bb[2], bb[3]);
                }
            }
            float *dst = p.part + (size_t)task * 16 * HD;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int col = warp * 32 + i * 8 + 2 * t;
                __stcg((float2 *)(dst + g * HD + col), make_float2(c[i][0], c[i][1]));
                __stcg((float2 *)(dst + (g + 8) * HD + col), make_float2(c[i][2], c[i][3]));
            }
        }
        __syncthreads(); /* shared tiles are reused by the next task; the partials are all stored */
        if (threadIdx.x == 0) red_release_add(p.rbc + 32 * rb, 1u); /* this split of row block rb is out */
    }
}

/* Split merge, inside the attention phase (no grid barrier between): the CTA that ran split sp of
 * row block rb waits until all NS splits of rb are out (rbc[rb] reaches NS per layer so far: only
 * the row block's own CTAs are waited for, not the grid), then merges share sp of rb's
 * (row, 4 dims) items. An item's SL adjacent lanes take splits sl, sl + SL, ... (all loads of a
 * lane issued together), then shuffle-reduce: per item the same operations in the same order
 * whichever CTA runs it. Every CTA has stored and signalled all its tasks before it waits for
 * any (and all CTAs are resident), so the waits cannot deadlock. */
constexpr int SL = 4, MSL = 8; /* lanes per item, splits per lane per round */
__device__ __forceinline__ void merge_items(const Params &p, int NS, int rb, int i0, int i1) {
    const int R = p.H * p.nh, c4 = HD / 4;
    const size_t t0 = (size_t)rb * NS;
    for (int base = 0; base < (i1 - i0) * SL; base += NT) { /* uniform trip count per CTA */
        const int it = base + threadIdx.x, sl = it & (SL - 1), item = i0 + it / SL;
        const int rr = item / c4, c = item - rr * c4, r = rb * 16 + rr;
        const bool on = item < i1 && r < R;
        float M = -INFINITY, l = 0.f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s0 = sl; s0 < NS; s0 += SL * MSL) { /* rounds (one for NS <= 32) */
            float2 e[MSL];
            float4 v[MSL];
#pragma unroll
            for (int i = 0; i < MSL; i++) {
                const int s = s0 + i * SL;
                if (on && s < NS) {
                    e[i] = __ldcg(&p.ml[(t0 + s) * 16 + rr]);
                    v[i] = __ldcg((const float4 *)(p.part + ((t0 + s) * 16 + rr) * HD) + c);
                } else {
                    e[i] = make_float2(-INFINITY, 0.f);
                    v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
            }
            float Mn = M;
#pragma unroll
            for (int i = 0; i < MSL; i++) Mn = fmaxf(Mn, e[i].x);
            const float f = M == -INFINITY ? 0.f : exp2f(M - Mn);
            l *= f, acc.x *= f, acc.y *= f, acc.z *= f, acc.w *= f;
#pragma unroll
            for (int i = 0; i < MSL; i++) {
                const float w = e[i].x == -INFINITY ? 0.f : exp2f(e[i].x - Mn);
                l += w * e[i].y;
                acc.x += w * v[i].x, acc.y += w * v[i].y, acc.z += w * v[i].z, acc.w += w * v[i].w;
            }
            M = Mn;
        }
        /* combine the SL lanes (adjacent) */
#pragma unroll
        for (int off = 1; off < SL; off <<= 1) {
            const float Mo = __shfl_xor_sync(0xffffffffu, M, off);
            const float Mn = fmaxf(M, Mo);
            const float f = M == -INFINITY ? 0.f : exp2f(M - Mn);
            l *= f, acc.x *= f, acc.y *= f, acc.z *= f, acc.w *= f;
            const float lo = __shfl_xor_sync(0xffffffffu, l, off);
            const float ax = __shfl_xor_sync(0xffffffffu, acc.x, off), ay = __shfl_xor_sync(0xffffffffu, acc.y, off);
            const float az = __shfl_xor_sync(0xffffffffu, acc.z, off), aw = __shfl_xor_sync(0xffffffffu, acc.w, off);
            /* every lane rescaled its own values to Mn = max(M, Mo) before the exchange */
            l += lo, acc.x += ax, acc.y += ay, acc.z += az, acc.w += aw;
            M = Mn;
        }
        if (!on || sl) continue;
        const float inv = __frcp_rn(l); /* = 1.f / l */
        const int tok = r / p.nh, hh = r - tok * p.nh;
        __nv_bfloat162 lo2 = __floats2bfloat162_rn(acc.x * inv, acc.y * inv), hi2 = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
        uint2 u;
        u.x = *(uint32_t *)&lo2;
        u.y = *(uint32_t *)&hi2;
        *(uint2 *)(p.o + (size_t)tok * p.nh * HD + hh * HD + 4 * c) = u;
    }
}
/* the merges of this CTA's attention tasks (attn_phase's task loop), layer `layer` of the launch */
__device__ void merge_phase(const Params &p, int T, int layer) {
    const int NS = (T + KC - 1) / KC, tasks = ((p.H * p.nh + 15) / 16) * NS, n_items = 16 * (HD / 4);
    for (int task = blockIdx.x; task < tasks; task += gridDim.x) {
        const int rb = task / NS, sp = task - rb * NS;
        if (threadIdx.x == 0) {
            const unsigned target = (unsigned)(layer + 1) * (unsigned)NS;
            while (ld_relaxed(p.rbc + 32 * rb) < target) { /* relaxed polls, then one fence (grid_barrier) */
            }
            fence_acq_rel();
        }
        __syncthreads();
        merge_items(p, NS, rb, sp * n_items / NS, (sp + 1) * n_items / NS);
    }
}

/* x[mm][pr], x[mm][pr + 8] = bf16(gate * v + x): gate and x from gemm_pre in the first round */
template <int MT>
__device__ __forceinline__ float residual_store(const Params &p, const LinDev &L, int pr, int mm, float v, float v8,
                                                bool first, const Pre<MT> &pre, int nt, int i, const float *gate) {
    __nv_bfloat16 *xr = p.x + (size_t)mm * p.We;
    float ss = 0.f; /* squares of the stored (bf16) values */
    if (pr < L.n_out) {
        const float gt = first ? pre.gt0 : gate[pr], x0 = first ? __bfloat162float(pre.res[nt][i][0]) : __bfloat162float(__ldcg(xr + pr));
        const __nv_bfloat16 y = __float2bfloat16(v * gt + x0);
        xr[pr] = y;
        const float f = __bfloat162float(y);
        ss = f * f;
    }
    if (pr + 8 < L.n_out) {
        const float gt = first ? pre.gt8 : gate[pr + 8], x8 = first ? __bfloat162float(pre.res[nt][i][1]) : __bfloat162float(__ldcg(xr + pr + 8));
        const __nv_bfloat16 y = __float2bfloat16(v8 * gt + x8);
        xr[pr + 8] = y;
        const float f = __bfloat162float(y);
        ss = __fmaf_rn(f, f, ss);
    }
    return ss;
}

/* ---- the kernel ----------------------------------------------------------------------------- */
template <int MT>
__global__ void __launch_bounds__(NT, 1) k_expert(const Params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    cluster_arrive_relaxed(); /* waited for before the layer loop (the first st_peer) */
    nib::pdl_wait();          /* x, the cache and the positions come from earlier kernels */
    unsigned nbar = 0;
    __nv_bfloat16 *xs = (__nv_bfloat16 *)smem;
    float *red = (float *)(smem + (size_t)(NIB_EXPERT_MAX_ROWS + 1) * p.lds * 2);
    unsigned char *abase = smem + p.attn_off;
    LayerDev *tab = (LayerDev *)(smem + p.tab_off); /* the layer table, in shared memory (L1 gets invalidated) */
    float *mods_s = (float *)(smem + p.mods_off);   /* the next adaRMS's (scale, shift) */
    unsigned long long *segs = (unsigned long long *)(smem + p.seg_off);
    float *rinv = (float *)(smem + p.rinv_off); /* [row] 1 / rms of the adaRMS being staged */
    const uint32_t sbar = smem_u32(smem + p.mbar_off);
    unsigned sbar_ph = 0;
    if (threadIdx.x == 0) {
        mbar_init(sbar, 1);
        mbar_init_fence();
    }
    const bool tr0 = p.seg && threadIdx.x == 0;
    long long tlast = 0;
    unsigned long long gt_start = 0;
    if (tr0) {
        for (int i = 0; i < 6 * NSEG; i++) segs[i] = 0;
        gt_start = gtimer();
        tlast = clock64();
        p.seg[(size_t)blockIdx.x * SEGW + 6 * NSEG] = (unsigned long long)tlast;
    }
    for (int i = threadIdx.x; i < p.n_layers * (int)(sizeof(LayerDev) / 16); i += NT)
        ((uint4 *)tab)[i] = ((const uint4 *)p.layers)[i];
    stage_mods(p, p.mods + (size_t)(2 * p.l0) * 3 * p.We, mods_s); /* the first layer's attention (scale, shift) */
    __syncthreads();
    /* RoPE table of the step's tokens (fp64 sincos of the fp32 angle, as ops/qkv.h) */
    for (int i = blockIdx.x * NT + threadIdx.x; i < p.H * HALF; i += gridDim.x * NT) {
        const int tok = i / HALF, f = i - tok * HALF;
        const float ang = __fmul_rn((float)p.pos[tok], p.inv_freq[f]);
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        p.rope[i] = make_float2(__double2float_rn(cd), __double2float_rn(sd));
    }
    const int P0 = *p.slot_base, T0 = *p.t_valid; /* constant for the whole launch */
    const int NS0 = (T0 + KC - 1) / KC, tasks0 = ((p.H * p.nh + 15) / 16) * NS0;
    const bool have_task = (int)blockIdx.x < tasks0;
    const int my_k0 = have_task ? ((int)blockIdx.x % NS0) * KC : 0;
    const unsigned long long kv_bytes = (unsigned long long)P0 * HD * 2u; /* prefix K / V bytes per layer */
    if (threadIdx.x == 0) prefetch_layer(tab[p.l0], kv_bytes, blockIdx.x, gridDim.x);
    Pre<MT> pre;
    gemm_pre<MT>(p, tab[p.l0].l[L_QKV], nullptr, pre);
    /* the first layer's cache rows of this CTA's first attention task (later layers: issued before the
     * barrier that precedes the layer); in flight during phase 1 */
    const bool early_rows = have_task && !p.kv_sig; /* beside the prefix: the rows may not be written yet */
    bool kv_gave_up = false;                        /* thread 0: a wait_kv timed out */
    if (early_rows) attn_issue_cache(tab[p.l0], AttnSmem(abase), my_k0, P0);
    cluster_wait(); /* the partner has started: its shared memory may be written */
    if (tr0) tlast = clock64();
    for (int layer = p.l0; layer < p.l1; layer++) {
        const LayerDev &Ld = tab[layer];
        const float *ma = p.mods + (size_t)(2 * layer) * 3 * p.We, *mf = ma + 3 * p.We;
        /* phases 0 qkv, 1 attention, 2 merge, 3 O, 4 gate|up, 5 down; one call site per helper; no grid
         * barrier between attention and merge (merge_phase waits for its row block's splits only) */
        for (int ph = 0; ph < 6; ph++) {
            if (ph == 1) {
                if (p.kv_sig) wait_kv(p, layer, kv_gave_up);
                attn_phase(p, Ld, abase, early_rows, T0, P0);
                seg_add(tr0 ? segs + ph * NSEG : nullptr, 1, tlast);
            } else if (ph == 2) {
                merge_phase(p, T0, layer - p.l0);
                seg_add(tr0 ? segs + ph * NSEG : nullptr, 1, tlast);
            } else {
                const int li = ph == 0 ? L_QKV : ph == 3 ? L_O : ph == 4 ? L_GU : L_DOWN;
                const LinDev &L = Ld.l[li];
                if ((int)blockIdx.x / CL < L.ng) { /* uniform per pair */
                    const KHalf kh(L);
                    const int k0 = kh.c0 * 128, k1 = kh.c1 * 128;
                    const size_t nsl = (size_t)p.nstld * NIB_EXPERT_MAX_ROWS; /* one statistics buffer */
                    /* layer 0's x comes from outside: no statistics; a launch from layer l0 > 0 reads those the
                     * launch before it left (ops/expert.h layer_begin) */
                    if (li == L_QKV || li == L_GU)
                        stage_norm(p, mods_s, xs, rinv, li == L_GU ? p.nst : layer ? p.nst + nsl : nullptr, k0, k1,
                                   tr0 ? segs + ph * NSEG : nullptr, tlast);
                    else if (p.bulk) stage_bulk(p, li == L_O ? p.o : p.h, li == L_O ? p.nh * HD : p.F, k0, k1, xs, sbar, sbar_ph);
                    else if (li == L_O) stage_copy(p, p.o, p.nh * HD, p.nh * HD, k0, k1, xs);
                    else stage_copy(p, p.h, p.F, p.F, k0, k1, xs);
                    seg_add(tr0 ? segs + ph * NSEG : nullptr, 0, tlast);
                    const int kind = li == L_QKV ? EPI_QKV : li == L_GU ? EPI_GEGLU : EPI_RESIDUAL;
                    gemm_phase<MT>(p, L, xs, red, pre, kind, li == L_O ? ma + 2 * p.We : mf + 2 * p.We,
                                   li == L_O ? p.nst : li == L_DOWN ? p.nst + nsl : nullptr, tr0 ? segs + ph * NSEG : nullptr,
                                   tlast);
                } else if (li == L_O && threadIdx.x == 0 && (int)blockIdx.x >= p.pf_first && layer + 1 < p.l1) {
                    /* no O tiles here: the next layer's L2 prefetch */
                    prefetch_layer(tab[layer + 1], kv_bytes, blockIdx.x - p.pf_first, gridDim.x - p.pf_first);
                }
            }
            if (ph == 5 && layer + 1 == p.l1) break; /* the last phase of the launch */
            /* the next GEMM phase's tiles / scales / gates / residual x, and its adaRMS mods,
             * loaded before the barrier (after attention: O; after O: gate|up; ...) */
            if (ph == 1 || ph >= 3) {
                const LinDev &Ln = ph == 5 ? tab[layer + 1].l[L_QKV] : Ld.l[ph == 1 ? L_O : ph == 3 ? L_GU : L_DOWN];
                const float *gn = ph == 1 ? ma + 2 * p.We : ph == 4 ? mf + 2 * p.We : nullptr;
                gemm_pre<MT>(p, Ln, gn, pre);
                if (ph == 3) stage_mods(p, mf, mods_s);
                if (ph == 5) { /* the next layer's attention (scale, shift) and first cache rows */
                    stage_mods(p, ma + 6 * p.We, mods_s);
                    if (early_rows) attn_issue_cache(tab[layer + 1], AttnSmem(abase), my_k0, P0);
                }
            }
            if (p.seg) { /* uniform */
                __syncthreads();
                seg_add(tr0 ? segs + ph * NSEG : nullptr, 3, tlast);
            }
            if (ph == 1) continue;
            /* the barrier after QKV: thread 0 issues the next layer's L2 prefetch while it waits */
            grid_barrier(p, nbar, ph == 0 && layer + 1 < p.l1 && p.pf_first >= (int)gridDim.x ? &tab[layer + 1] : nullptr,
                         kv_bytes);
            seg_add(tr0 ? segs + ph * NSEG : nullptr, 4, tlast);
        }
    }
    if (tr0) {
        unsigned long long *o = p.seg + (size_t)blockIdx.x * SEGW;
        for (int i = 0; i < 6 * NSEG; i++) o[i] = segs[i];
        o[6 * NSEG + 1] = gt_start;
        o[6 * NSEG + 2] = (unsigned long long)clock64();
        o[6 * NSEG + 3] = gtimer();
    }
    kernel_exit(p);
}

/* ---- host side ------------------------------------------------------------------------------ */
constexpr int TRACE_MAX_CTAS = 256;
struct WsLayout {
    size_t bar, layers, rope, ml, part, nst, trace, seg, total;
    int max_tasks;
};

int max_t(const nib_expert_args *a) {
    int t = 0;
    for (int l = 0; l < a->n_layers; l++) t = a->layers[l].kv.t_max > t ? a->layers[l].kv.t_max : t;
    return t;
}

/* the barrier words (256 bytes) and one 128-byte line per row block of NIB_EXPERT_MAX_ROWS rows */
size_t bar_bytes(const nib_expert_args *a) {
    return 256 + 128 * (size_t)((NIB_EXPERT_MAX_ROWS * a->n_heads + 15) / 16);
}
int nst_ld(int width) { return ((width + 15) / 16 + 1) & ~1; } /* statistics row stride: even (float2 loads) */
WsLayout ws_layout(const nib_expert_args *a) {
    WsLayout w;
    const int rb = (a->rows * a->n_heads + 15) / 16, ns = (max_t(a) + KC - 1) / KC;
    w.max_tasks = rb * ns;
    size_t o = 0;
    auto take = [&](size_t bytes) {
        size_t at = o;
        o += (bytes + 255) / 256 * 256;
        return at;
    };
    w.bar = take(bar_bytes(a)); /* rows-independent (prepare zeroes it) */
    w.layers = take(sizeof(LayerDev) * (size_t)a->n_layers);
    w.trace = take(sizeof(unsigned long long) * 2 * TRACE_MAX_CTAS * NBAR * (size_t)a->n_layers); /* rows-independent offset */
    w.seg = take(sizeof(unsigned long long) * SEGW * TRACE_MAX_CTAS);
    w.rope = take(sizeof(float2) * (size_t)a->rows * HALF);
    w.ml = take(sizeof(float2) * (size_t)w.max_tasks * 16);
    w.part = take(sizeof(float) * (size_t)w.max_tasks * 16 * HD);
    w.nst = take(sizeof(float) * 2 * (size_t)nst_ld(a->width) * NIB_EXPERT_MAX_ROWS);
    w.total = o;
    return w;
}

int kp_max(const nib_expert_args *a) {
    int k = 0;
    for (int l = 0; l < a->n_layers; l++) {
        const nib_qweight *q[4] = {a->layers[l].qkv, a->layers[l].o, a->layers[l].gu, a->layers[l].down};
        for (int i = 0; i < 4; i++) k = (int)q[i]->kp > k ? (int)q[i]->kp : k;
    }
    return k;
}

/* shared memory: GEMM rows + reduction slots, then (from attn_off) the attention tiles */
size_t attn_off(const nib_expert_args *a) {
    const size_t lds = (size_t)kp_max(a) + 8;
    /* rows, then red: [Rp][2 wk][FH <= 4][32] floats, Rp * wk = NW (both CTAs' partials of this rank's
     * half of the outputs; sized for 8) */
    const size_t gemm = (size_t)(NIB_EXPERT_MAX_ROWS + 1) * lds * 2 + (size_t)2 * NW * 8 * 32 * sizeof(float);
    return (gemm + 127) / 128 * 128;
}
size_t tab_off(const nib_expert_args *a) { return attn_off(a) + (ATTN_SMEM + 127) / 128 * 128; }
size_t mods_off(const nib_expert_args *a) { return tab_off(a) + (sizeof(LayerDev) * (size_t)a->n_layers + 127) / 128 * 128; }
size_t seg_off(const nib_expert_args *a) { return (mods_off(a) + (size_t)a->width * 2 * sizeof(float) + 15) / 16 * 16; }
size_t rinv_off(const nib_expert_args *a) { return (seg_off(a) + sizeof(unsigned long long) * 6 * NSEG + 15) / 16 * 16; }
size_t mbar_off(const nib_expert_args *a) { return (rinv_off(a) + NIB_EXPERT_MAX_ROWS * sizeof(float) + 7) / 8 * 8; }
size_t smem_bytes(const nib_expert_args *a) { return mbar_off(a) + 8; }

int g_sms = 0, g_smem_max = 0;
int g_grid = 0;            /* CTAs of the launch (pairs that can be co-resident x 2), for g_grid_smem */
size_t g_grid_smem = 0;
int g_trace_grid = 0;      /* CTAs of the last traced launch (the trace report's grid) */
int g_trace_layers = 1;    /* and its layers (layer_begin .. layer_end) */

nib_status device_ready() {
    if (g_sms) return NIB_OK;
    nib_device_info d;
    NIB_RETURN_IF_ERR(nib_device_require(&d));
    int dev = 0, v = 0;
    NIB_CUDA_CHECK(cudaGetDevice(&dev));
    NIB_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    g_smem_max = v;
    g_sms = d.sm_count;
    return NIB_OK;
}

/* The launch grid for this shared-memory size: one CTA per SM, in pairs (clusters of CL = 2)
 * that must all be co-resident (cooperative launch). */
nib_status ensure_grid(const nib_expert_args *a) {
    const size_t sm = smem_bytes(a);
    if (g_grid && g_grid_smem == sm) return NIB_OK;
    int best = g_sms / CL;
    void (*const kerns[2])(const Params) = {k_expert<1>, k_expert<2>};
    for (int i = 0; i < 2; i++) {
        NIB_CUDA_CHECK(cudaFuncSetAttribute(kerns[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = CL, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)(g_sms / CL * CL));
        cfg.blockDim = dim3(NT);
        cfg.dynamicSmemBytes = sm;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int n = 0;
        NIB_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kerns[i], &cfg));
        best = n < best ? n : best;
    }
    if (best < 1)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: no pair of CTAs with %zu bytes of shared memory each can be "
                       "resident", sm);
    g_grid = best * CL;
    g_grid_smem = sm;
    return NIB_OK;
}

} // namespace

extern "C" nib_status nib_cuda_expert_supported(const nib_expert_args *a) {
    if (!a || !a->layers || a->n_layers < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "expert kernel: no layers");
    if (a->rows < 1 || a->rows > NIB_EXPERT_MAX_ROWS)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: %d rows (the persistent kernel takes 1..%d)", (int)a->rows,
                       NIB_EXPERT_MAX_ROWS);
    if (a->head_dim != HD)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: head_dim %d (the persistent kernel takes %d)", (int)a->head_dim, HD);
    if (a->width < 8 || a->width % 8 || a->mlp < 8 || a->mlp % 8 || a->n_heads < 1)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: width %d / mlp %d must be multiples of 8, heads %d >= 1",
                       (int)a->width, (int)a->mlp, (int)a->n_heads);
    const int64_t want_n[4] = {(int64_t)(a->n_heads + 2) * HD, a->width, 2 * (int64_t)a->mlp, a->width};
    const int64_t want_k[4] = {a->width, (int64_t)a->n_heads * HD, a->width, a->mlp};
    static const char *const nm[4] = {"qkv", "o", "gate|up", "down"};
    for (int l = 0; l < a->n_layers; l++) {
        const nib_expert_layer *L = &a->layers[l];
        const nib_qweight *q[4] = {L->qkv, L->o, L->gu, L->down};
        for (int i = 0; i < 4; i++) {
            if (!q[i] || q[i]->fmt != NIB_WFMT_NVFP4)
                return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: layer %d %s weight is not NVFP4 (the persistent kernel "
                               "reads NVFP4 only)", l, nm[i]);
            if (q[i]->rope_half)
                return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: layer %d %s weight is in the RoPE pair layout (loaded "
                               "for nib_cuda_gemm_qkv; the persistent kernel reads the plain row order)", l, nm[i]);
            if (q[i]->n != want_n[i] || q[i]->k != want_k[i] || (i == 2) != (q[i]->geglu != 0))
                return NIB_ERR(NIB_ERR_SHAPE, "expert kernel: layer %d %s weight is %lldx%lld%s, expected %lldx%lld%s", l, nm[i],
                               (long long)q[i]->n, (long long)q[i]->k, q[i]->geglu ? " (geglu)" : "", (long long)want_n[i],
                               (long long)want_k[i], i == 2 ? " (geglu)" : "");
        }
        if (L->kv.dtype != NIB_KV_BF16 || L->kv.n_kv_heads != 1 || L->kv.head_dim != HD)
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: layer %d cache is %s with %d KV heads of %d (the persistent "
                           "kernel reads a bf16 cache with one KV head of %d)", l, nib_kv_dtype_name(L->kv.dtype),
                           (int)L->kv.n_kv_heads, (int)L->kv.head_dim, HD);
    }
    NIB_RETURN_IF_ERR(device_ready());
    const size_t sm = smem_bytes(a);
    if (sm > (size_t)g_smem_max)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: needs %zu bytes of shared memory per CTA, the device allows %d",
                       sm, g_smem_max);
    return NIB_OK;
}

extern "C" nib_status nib_cuda_expert_grid(const nib_expert_args *a, int32_t *ctas) {
    NIB_RETURN_IF_ERR(nib_cuda_expert_supported(a));
    NIB_RETURN_IF_ERR(ensure_grid(a));
    *ctas = (int32_t)g_grid;
    return NIB_OK;
}

extern "C" nib_status nib_cuda_expert_ws_bytes(const nib_expert_args *a, uint64_t *bytes) {
    if (!a || !a->layers || a->n_layers < 1 || a->rows < 1 || a->rows > NIB_EXPERT_MAX_ROWS || a->n_heads < 1 ||
        a->width < 1)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "expert kernel workspace: needs layers, rows 1..%d, heads >= 1 and width >= 1",
                       NIB_EXPERT_MAX_ROWS);
    *bytes = ws_layout(a).total;
    return NIB_OK;
}

extern "C" nib_status nib_cuda_expert_prepare(const nib_expert_args *a, void *ws, uint64_t ws_bytes) {
    NIB_RETURN_IF_ERR(nib_cuda_expert_supported(a));
    const WsLayout w = ws_layout(a);
    if (!ws || ws_bytes < w.total)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "expert kernel: workspace of %llu bytes, %zu needed",
                       (unsigned long long)ws_bytes, w.total);
    NIB_RETURN_IF_ERR(ensure_grid(a)); /* the grid the table's quotients are for */
    LayerDev *h = (LayerDev *)calloc((size_t)a->n_layers, sizeof(LayerDev));
    if (!h) return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "expert kernel: layer table of %d layers", (int)a->n_layers);
    for (int l = 0; l < a->n_layers; l++) {
        const nib_expert_layer *L = &a->layers[l];
        const nib_qweight *q[4] = {L->qkv, L->o, L->gu, L->down};
        for (int i = 0; i < 4; i++) {
            LinDev &d = h[l].l[i];
            d.w = (const uint8_t *)q[i]->w;
            d.s = (const uint8_t *)q[i]->s;
            d.colscale = q[i]->colscale;
            d.bias = q[i]->bias;
            d.ng = (int)(q[i]->np / 16);
            d.nchunks = (int)(q[i]->kp / 128);
            d.n_out = (int)q[i]->n_out;
            d.kp = (int)q[i]->kp;
            d.gc = g_grid / CL; /* ensure_grid ran above */
            d.ngq = d.gc > 0 ? d.ng / d.gc : 0;
            d.ngr = d.gc > 0 ? d.ng % d.gc : 0;
            d.w_bytes = q[i]->w_bytes;
            d.s_bytes = q[i]->s_bytes;
        }
        h[l].kc = (const __nv_bfloat16 *)L->kv.k;
        h[l].vc = (const __nv_bfloat16 *)L->kv.v;
    }
    nib_status st = NIB_OK;
    NIB_CUDA_TRY(cudaMemset((uint8_t *)ws + w.bar, 0, bar_bytes(a)));
    NIB_CUDA_TRY(cudaMemcpy((uint8_t *)ws + w.layers, h, sizeof(LayerDev) * (size_t)a->n_layers, cudaMemcpyHostToDevice));
fail:
    free(h);
    return st;
}

extern "C" nib_status nib_cuda_expert_run(const nib_expert_args *a, void *ws, uint64_t ws_bytes, void *stream) {
    if (!a || !ws) return NIB_ERR(NIB_ERR_INVALID_ARG, "expert kernel: NULL args or workspace");
    if (a->grid < 0 || a->grid % CL)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "expert kernel: grid of %d CTAs (0, or a positive multiple of %d)", (int)a->grid,
                       CL);
    if (a->kv_sig && (a->kv_target < 1 || !a->kv_timeout))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "expert kernel: kv_sig needs a target of >= 1 signals (got %d) and a "
                       "kv_timeout flag", (int)a->kv_target);
    if (a->rows < 1 || a->rows > NIB_EXPERT_MAX_ROWS)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: %d rows (1..%d)", (int)a->rows, NIB_EXPERT_MAX_ROWS);
    const int l0 = a->layer_begin, l1 = a->layer_begin || a->layer_end ? a->layer_end : a->n_layers;
    if (l0 < 0 || l1 <= l0 || l1 > a->n_layers)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "expert kernel: layers [%d, %d) of a %d-layer table", (int)a->layer_begin,
                       (int)a->layer_end, (int)a->n_layers);
    NIB_RETURN_IF_ERR(device_ready());
    const WsLayout w = ws_layout(a);
    if (ws_bytes < w.total)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "expert kernel: workspace of %llu bytes, %zu needed for %d rows",
                       (unsigned long long)ws_bytes, w.total, (int)a->rows);
    Params p;
    memset(&p, 0, sizeof p);
    uint8_t *base = (uint8_t *)ws;
    p.layers = (const LayerDev *)(base + w.layers);
    p.n_layers = a->n_layers;
    p.l0 = l0, p.l1 = l1;
    p.H = a->rows, p.We = a->width, p.F = a->mlp, p.nh = a->n_heads;
    p.ldqkv = (a->n_heads + 2) * HD;
    p.lds = kp_max(a) + 8;
    p.max_tasks = w.max_tasks;
    p.mods = a->mods;
    p.t_valid = a->t_valid, p.slot_base = a->slot_base, p.pos = a->positions, p.inv_freq = a->inv_freq;
    p.q_scale = a->q_scale, p.eps = a->eps;
    p.inv_we = (a->width & (a->width - 1)) == 0 ? 1.0 / (double)a->width : 0.0;
    p.scale_add = a->layers[0].qkv->scale_add;
    p.x = (__nv_bfloat16 *)a->x, p.qkv = (__nv_bfloat16 *)a->qkv, p.o = (__nv_bfloat16 *)a->o, p.h = (__nv_bfloat16 *)a->h;
    p.rope = (float2 *)(base + w.rope);
    p.ml = (float2 *)(base + w.ml);
    p.part = (float *)(base + w.part);
    p.nst = (float *)(base + w.nst);
    p.ngx = (a->width + 15) / 16, p.nstld = nst_ld(a->width);
    p.bar = (unsigned *)(base + w.bar);
    p.rbc = p.bar + 64;
    p.attn_off = (int)attn_off(a), p.tab_off = (int)tab_off(a), p.mods_off = (int)mods_off(a), p.seg_off = (int)seg_off(a);
    const char *tr = getenv("NIB_EXPERT_TRACE");
    NIB_RETURN_IF_ERR(ensure_grid(a));
    if (a->grid > g_grid)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "expert kernel: grid of %d CTAs, but only %d can be resident", (int)a->grid,
                       g_grid);
    const int G = a->grid ? (int)a->grid : g_grid;
    p.kv_sig = a->kv_sig;
    p.kv_target = (unsigned)a->kv_target;
    p.kv_timeout = a->kv_timeout;
    {
        const long long o_groups = (long long)(a->layers[0].o->np / 16), pairs = G / CL;
        const int o_ctas = CL * (int)(o_groups < pairs ? o_groups : pairs);
        p.pf_first = o_ctas < G ? o_ctas : G;
    }
    p.rinv_off = (int)rinv_off(a);
    p.mbar_off = (int)mbar_off(a);
    {
        /* o and h staged by cp.async.bulk: a copy moves a CTA's whole 128-column chunks of a row, so
         * the row width must be a multiple of 128 (heads x 256 always is; an mlp that is not would
         * put chunk columns past the row, which stage_copy zero-fills instead) and the rows 16-byte
         * aligned. NIB_EXPERT_BULK=0 keeps the 16-byte cp.async copies (the A/B switch). */
        const char *be = getenv("NIB_EXPERT_BULK");
        p.bulk = !(be && !strcmp(be, "0")) && ((uintptr_t)a->o | (uintptr_t)a->h) % 16 == 0 && a->mlp % 128 == 0;
    }
    {
        const char *rp = getenv("NIB_EXPERT_ROUND_PREFETCH"); /* 0: off (the A/B switch) */
        p.rpf = !(rp && !strcmp(rp, "0"));
    }
    p.trace = tr && *tr && strcmp(tr, "0") && G <= TRACE_MAX_CTAS ? (unsigned long long *)(base + w.trace) : nullptr;
    if (p.trace) g_trace_grid = G, g_trace_layers = l1 - l0;
    p.seg = p.trace ? (unsigned long long *)(base + w.seg) : nullptr;
    const size_t sm = smem_bytes(a);
    cudaLaunchAttribute attr[3];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = CL, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    if (a->grid) { /* beside other work: no co-residency check at launch, first pick of free SMs */
        int least = 0, greatest = 0;
        NIB_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        attr[1].id = cudaLaunchAttributePriority;
        attr[1].val.priority = greatest;
    } else {
        attr[1].id = cudaLaunchAttributeCooperative;
        attr[1].val.cooperative = 1;
    }
    auto kern = a->rows <= 8 ? k_expert<1> : k_expert<2>;
    NIB_CUDA_CHECK(nib::launch_with(kern, dim3((unsigned)G), dim3(NT), sm, (cudaStream_t)stream, attr, 2, p));
    return NIB_OK;
}

/* NIB_EXPERT_TRACE lab view of the last launch: per phase kind, averaged over layers, the
 * critical path of the work (latest CTA done minus earliest CTA released by the previous
 * barrier) and the barrier (latest release minus latest arrival). */
extern "C" nib_status nib_cuda_expert_trace_report(const nib_expert_args *a, void *ws, uint64_t ws_bytes, FILE *out) {
    NIB_RETURN_IF_ERR(device_ready());
    const WsLayout w = ws_layout(a);
    if (ws_bytes < w.total || !g_trace_grid)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "expert trace: no traced launch");
    const int nb = NBAR * g_trace_layers - 1, G = g_trace_grid;
    unsigned long long *t = (unsigned long long *)malloc(sizeof(unsigned long long) * 2 * (size_t)G * nb);
    if (!t) return NIB_ERR_OUT_OF_MEMORY;
    nib_status st = NIB_OK;
    NIB_CUDA_TRY(cudaDeviceSynchronize());
    NIB_CUDA_TRY(cudaMemcpy(t, (uint8_t *)ws + w.trace, sizeof(unsigned long long) * 2 * (size_t)G * nb, cudaMemcpyDeviceToHost));
    {
        static const char *const nm[NBAR] = {"qkv", "attn+merge", "o-proj", "gate|up", "down"};
        double work[NBAR] = {0}, bar[NBAR] = {0};
        int cnt[NBAR] = {0};
        for (int k = 1; k < nb; k++) { /* barrier k closes phase k (phase 0 has no release before it) */
            unsigned long long rel_min = ~0ull, done_max = 0, rel_max = 0;
            for (int b = 0; b < G; b++) {
                rel_min = t[((size_t)(k - 1) * G + b) * 2 + 1] < rel_min ? t[((size_t)(k - 1) * G + b) * 2 + 1] : rel_min;
                done_max = t[((size_t)k * G + b) * 2] > done_max ? t[((size_t)k * G + b) * 2] : done_max;
                rel_max = t[((size_t)k * G + b) * 2 + 1] > rel_max ? t[((size_t)k * G + b) * 2 + 1] : rel_max;
            }
            work[k % NBAR] += (double)(done_max - rel_min) * 1e-3;
            bar[k % NBAR] += (double)(rel_max - done_max) * 1e-3;
            cnt[k % NBAR]++;
        }
        fprintf(out, "expert kernel trace (last launch, %d CTAs, us per layer):\n", G);
        double tw = 0, tb = 0;
        for (int i = 0; i < NBAR; i++) {
            if (!cnt[i]) continue;
            fprintf(out, "  %-10s work %6.2f  barrier %5.2f\n", nm[i], work[i] / cnt[i], bar[i] / cnt[i]);
            tw += work[i] / cnt[i], tb += bar[i] / cnt[i];
        }
        fprintf(out, "  total      work %6.2f  barrier %5.2f  (x %d layers)\n", tw, tb, g_trace_layers);
    }
    { /* per-CTA segments (thread 0's clock64), calibrated against globaltimer on CTA 0 */
        unsigned long long *sg = (unsigned long long *)malloc(sizeof(unsigned long long) * SEGW * (size_t)G);
        if (!sg) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        if (cudaMemcpy(sg, (uint8_t *)ws + w.seg, sizeof(unsigned long long) * SEGW * (size_t)G, cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
            free(sg);
            st = NIB_ERR(NIB_ERR_CUDA, "expert trace: copying the segment counters");
            goto fail;
        }
        const double cyc = (double)(sg[6 * NSEG + 2] - sg[6 * NSEG]), ns = (double)(sg[6 * NSEG + 3] - sg[6 * NSEG + 1]);
        const double ghz = ns > 0 ? cyc / ns : 1.0, per = 1e-3 / ghz / (double)g_trace_layers;
        static const char *const nm[6] = {"qkv", "attention", "merge", "o-proj", "gate|up", "down"};
        static const char *const sn[NSEG] = {"stage", "tiles", "epi", "pre", "barrier", "setup", "nstat", "nwait"};
        fprintf(out, "expert kernel segments (thread 0 of each CTA, us per layer at %.3f GHz; mean / max over CTAs with "
                     "work in the phase, barrier over all):\n", ghz);
        for (int ph = 0; ph < 6; ph++) {
            fprintf(out, "  %-10s", nm[ph]);
            int nwork = 0;
            for (int b = 0; b < G; b++) nwork += (sg[(size_t)b * SEGW + ph * NSEG + 1] > 0);
            for (int s = 0; s < NSEG; s++) {
                double sum = 0, mx = 0;
                int n = 0;
                for (int b = 0; b < G; b++) {
                    const unsigned long long *c = sg + (size_t)b * SEGW + ph * NSEG;
                    if ((s < 3 || s > 4) && !c[1]) continue;
                    const double v = (double)c[s] * per;
                    sum += v, n++, mx = v > mx ? v : mx;
                }
                fprintf(out, "  %s %5.2f/%5.2f", sn[s], n ? sum / n : 0.0, mx);
            }
            fprintf(out, "  (%d CTAs with work)\n", nwork);
        }
        free(sg);
    }
fail:
    free(t);
    return st;
}
