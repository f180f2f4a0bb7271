/* gemm_lowbit_wg.cuh — the low-bit weight GEMM for large M on Hopper's warpgroup MMA (sm_90a).
 * Included by gemm_lowbit.cu (it shares GemmParams, the epilogue and the weight decoder there).
 *
 * Why: the mma.sync kernel above is built for the memory-bound regime (M <= 64 tokens per
 * chunk, each chunk re-reading the weights); at M = 532 / 1024 it ran 3-6x behind cuBLAS bf16
 * (bench/results/gemm-h100-v6-8ac6194.json: NVFP4 2048 -> 32768 at M = 532, 318 us against
 * 101). Here the tokens are the wide side of one wgmma m64nBTk16 per k16 step:
 *   A (64 weight rows x 16 K, bf16, registers) — each warp decodes its own 16-row group from
 *     the repacked layout with the same decoder as the mma.sync kernel (chunk_a: the per-warp A
 *     fragment of m16n8k16 is the per-warp slice of wgmma's register A operand), so the decoded
 *     values are exact as there;
 *   B (BT tokens x 16 K, bf16, shared memory) — X tiles written by TMA (128-byte swizzle, zeros
 *     past M and K) into a ring of ST stages (full / empty mbarriers), issued by a producer warp
 *     (or thread 0: WgPW).
 * CTA: 2 consumer warpgroups (8 row groups: 128 weight rows) x BT tokens (+ the producer warp).
 * The weights are never staged: each lane loads its 16-byte pieces of the next chunk into
 * registers (evict-first streaming loads) one chunk ahead, and asks L2 for the chunk
 * WG_PF chunks ahead. Per 128-K chunk a warpgroup issues four groups of 2 wgmmas, each from its
 * own 8 A registers (two sets in turn); after each commit it waits for the group before the
 * last, so the registers it decodes into next are free and one group stays in flight (groups of
 * 4 steps: 5 % slower at M = 532 / 1024, and BT = 192 spilled). The loop's indices and the
 * descriptors (one base plus constants) are kept incrementally.
 * Grid: M tiles fastest (the CTAs resident at once share their weight rows: W streams from DRAM
 * about once), then 128-row tiles (CM = 2: in clusters of two sharing X by multicast, a lab
 * variant: slower), then K splits: where every cluster of the launch is resident at once, the
 * splits of a tile form one cluster along z and add their sums through distributed shared memory
 * (wg_kcl_epilogue, plan wkcl); else the partial sums go through the split-K workspace and the
 * last CTA of the tile adds them. Either way in split order: deterministic, and the same bits.
 * Formats: NVFP4, MXFP4, FP8 (every scale of theirs is applied in the decoder or the epilogue);
 * INT4-g128 with 64- to 192-token tiles: its group of 128 K is one chunk, multiplied into a
 * second accumulator set (the chunk's first wgmma with scale-d = 0), which after the chunk's last
 * group (a full wait) is added to the sums times the rows' fp16 group scales in fp32, exactly the
 * mma.sync kernel's arithmetic. Act-order permutations keep the mma.sync kernel.
 * Epilogue: colscale and bias (and GeGLU: each thread holds rows g and g + 8 of its warp's row
 * group for the same tokens, as the mma.sync kernel's fragments do) into an fp32 tile in the
 * idle ring, then gate, residual, one rounding and 16-byte stores per 8 columns of a token.
 * Small M (fiftieth session): 16- and 32-token tiles (m64n16k16 / m64n32k16, 80-88 registers, two CTAs per
 * SM) for NVFP4 and INT4 at 9..32 tokens on wide weights. There the mma.sync kernel multiplies every decoded
 * A fragment by MT = 2 or 4 token tiles, one HMMA each; here one asynchronous wgmma per k16 step serves the
 * warpgroup's 64 rows and all tokens, and the decode of the next group overlaps it (2048 -> 32768 NVFP4, lean:
 * M = 16 15.6 us against the mma.sync kernel's 18.7; M = 1 14.1).
 * Measured (docs/design.md, "The low-bit GEMM at large M"): one CTA per SM (9 warps and 168
 * registers per thread, or 8 and 255 for the 256-token tile), ~60 % of the SM's tensor throughput
 * in the K loop; prologue and epilogue, which no other CTA overlaps, are a quarter of the time at
 * K = 2048.
 */
#ifndef NIB_GEMM_LOWBIT_WG_CUH
#define NIB_GEMM_LOWBIT_WG_CUH

#include "ops/cuda/wgmma.cuh"

namespace {

/* Who loads X: a producer warp (9 warps per CTA: ptxas gives each thread 168 registers), or, for the
 * 256-token tile (and INT4's 128- and 192-token ones), thread 0 between its own groups (8 warps:
 * 255 registers; with the producer warp those tiles spilled). Measured (nib bench gemm,
 * docs/design.md): the producer warp is 5-25 % faster at the same tile; the 256-token tile with
 * thread 0 loading is the fastest at M = 1024 on the large shapes (2048 -> 32768: 224 against
 * 284 us). */
template <int FMT, int BT> struct WgPW {
    /* INT4's 128- and 192-token tiles hold a second accumulator set (the chunk's product before
     * its group scale): with the producer warp's 168 registers they would spill */
    enum { PW = BT < 256 && !(FMT == NIB_WFMT_INT4 && BT > 64), THREADS = 256 + (PW ? 32 : 0) };
    /* CTAs per SM the registers are budgeted for: the 16- and 32-token tiles (small M: few accumulators)
     * run two per SM, so one CTA's prologue and epilogue overlap the other's K loop */
    enum { OCC = BT <= 32 ? 2 : 1 };
    /* UW: the consumers' warp index as nib::warp_id() (warp-uniform to the compiler, so a warp's row
     * group, weight pointers and X copies live in uniform registers), or as threadIdx.x >> 5 (the
     * producer test is uniform either way). Measured per tile on one H200 (docs/design.md
     * "Fifty-fourth session"): uniform is faster on every INT4 tile (2-13 %), on NVFP4's 64-token
     * (17-96 %) and 256-token (6 %) ones, the same on its 32-token one; NVFP4's 16-token tile ran its K
     * loop 34 % slower with it (2048 -> 32768, M = 16: 13.9 against 18.6 us), its 128- and 192-token
     * tiles 0-7 % slower. */
    enum { UW = !(FMT == NIB_WFMT_NVFP4 && (BT == 16 || BT == 128 || BT == 192)) };
};
constexpr int WG_PF = 4;                 /* chunks ahead of use whose weights are asked of L2 */
constexpr int WG_SMEM_BUDGET = 192 * 1024;

/* X stage: BT token rows x 128 K as two 128-byte swizzled boxes (K 0-63, 64-127) */
template <int BT> struct WgTile {
    enum { STAGE = BT * 256, ST = WG_SMEM_BUDGET / STAGE > 6 ? 6 : WG_SMEM_BUDGET / STAGE };
    static constexpr size_t smem() { return (size_t)ST * STAGE + 1024; /* + the 1024-byte alignment */ }
};

/* ask L2 for chunk `tile` (row group x chunk) of the weights: one 128-byte line per lane */
template <int FMT> __device__ __forceinline__ void wg_prefetch_chunk(const GemmParams &p, size_t tile, int lane) {
    constexpr int PB = FmtT<FMT>::PARTS * 512, SB = FmtT<FMT>::SB;
    if (lane < PB / 128) prefetch_l2(p.w + tile * PB + lane * 128);
    else if (SB && lane == PB / 128) prefetch_l2(p.s + tile * SB);
}

/* fp32 pitch of the epilogue tile [BT tokens][128 weight rows]: 132 = 4 (mod 32), so the
 * accumulator writes (lanes: rows g, tokens 2 t) hit 32 distinct banks */
constexpr int WG_TP = NIB_GEMM_WG_ROWS + 4;

/* the epilogue's last part for 8 columns n .. n + 7 of token row mm (v: after colscale, bias and
 * GeGLU): gate, residual (16-byte loads where aligned), one rounding, a 16-byte store (or per
 * element at the right edge / unaligned) */
__device__ __forceinline__ void wg_store8(const GemmParams &p, float (&v)[8], int mm, int n) {
    const bool full = n + 8 <= p.n_out;
    if (p.gate)
#pragma unroll
        for (int q = 0; q < 8; q++)
            if (full || n + q < p.n_out) v[q] *= p.gate[n + q];
    if (p.res) {
        const bool rv = (uintptr_t)p.res % 16 == 0 && p.ldr % 8 == 0;
        const __nv_bfloat16 *r = p.res + (long long)mm * p.ldr + n;
        if (full && rv) {
            const uint4 u = *(const uint4 *)r;
            const uint32_t w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const __nv_bfloat162 r2 = *(const __nv_bfloat162 *)&w4[q];
                v[2 * q] += __low2float(r2), v[2 * q + 1] += __high2float(r2);
            }
        } else {
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (n + q < p.n_out) v[q] += __bfloat162float(r[q]);
        }
    }
    __nv_bfloat16 *y = p.y + (long long)mm * p.ldy + n;
    if (full && (uintptr_t)p.y % 16 == 0 && p.ldy % 8 == 0) {
        uint32_t o[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const __nv_bfloat162 y2 = __floats2bfloat162_rn(v[2 * q], v[2 * q + 1]);
            o[q] = *(const uint32_t *)&y2;
        }
        *(uint4 *)y = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
#pragma unroll
        for (int q = 0; q < 8; q++)
            if (n + q < p.n_out) y[q] = __float2bfloat16(v[q]);
    }
}

/* K split over a cluster of p.ksplit CTAs along z (p.kcl; CTA rank = split): each CTA writes its raw
 * sums, [token][weight row] as the plain epilogue's tile, into its idle ring; after a cluster
 * barrier the CTAs share the tile's (valid token, 8-column chunk) items round robin, each summing
 * the ksplit tiles in split order through distributed shared memory (the same fp32 additions in the
 * same order as the workspace path's last CTA: bitwise the same result), then colscale, bias,
 * GeGLU and wg_store8; a second cluster barrier keeps every tile alive until all are read. No
 * workspace round trip, no counter, and no one CTA reading every partial. */
template <int BT>
__device__ __forceinline__ void wg_kcl_epilogue(const GemmParams &p, const float (&acc)[BT / 2], int m0, int warp,
                                                int g, int t, int tid, float *tile) {
    asm volatile("bar.sync 1, 256;" ::: "memory"); /* every warpgroup's wgmma reads of the ring are done */
#pragma unroll
    for (int j = 0; j < BT / 8; j++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float *row = tile + (8 * j + 2 * t + i) * WG_TP;
            row[warp * 16 + g] = acc[4 * j + i];
            row[warp * 16 + g + 8] = acc[4 * j + 2 + i];
        }
    cluster_sync(); /* the tiles, local and remote, are complete (release / acquire) */
    /* GeGLU and the q|k|v epilogue take 16 weight rows per item: gate / up rows, or the rotation pairs' a / b rows */
    const int two = p.geglu || p.qkv;
    const int ks = p.ksplit, z = (int)blockIdx.z, lw = two ? 3 : 4;
    const int vt = p.m - m0 < BT ? p.m - m0 : BT; /* valid tokens of the tile */
    const int n0 = blockIdx.y * (NIB_GEMM_WG_ROWS >> (p.geglu ? 1 : 0)), r0 = blockIdx.y * NIB_GEMM_WG_ROWS;
    const uint32_t t0 = smem_u32(tile);
    const int sb = p.qkv ? qkv_slot_base(p) : 0;
    for (int c = z * 256 + tid; c < (vt << lw); c += ks * 256) {
        const int tok = c >> lw, ch = c & ((1 << lw) - 1), mm = m0 + tok, n = n0 + 8 * ch;
        if (p.qkv ? r0 + 16 * ch >= p.n_out : n >= p.n_out) continue; /* (q|k|v: a head's rows are whole 16-row groups) */
        /* plain: weight rows 8 ch .. 8 ch + 7 of the tile; GeGLU: gate rows 16 ch .. + 7, up rows + 8;
         * q|k|v: the pairs' a rows 16 ch .. + 7, b rows + 8 */
        const int col = two ? 16 * ch : 8 * ch;
        const uint32_t off = (uint32_t)(tok * WG_TP + col) * 4u;
        float4 a0 = ld_cluster_f32x4(cluster_map(t0 + off, 0)), a1 = ld_cluster_f32x4(cluster_map(t0 + off + 16, 0));
        for (int r = 1; r < ks; r++) {
            const float4 b0 = ld_cluster_f32x4(cluster_map(t0 + off, (uint32_t)r));
            const float4 b1 = ld_cluster_f32x4(cluster_map(t0 + off + 16, (uint32_t)r));
            a0.x += b0.x, a0.y += b0.y, a0.z += b0.z, a0.w += b0.w;
            a1.x += b1.x, a1.y += b1.y, a1.z += b1.z, a1.w += b1.w;
        }
        float v[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const int pr = r0 + col; /* the weight row of v[0] */
        if (two) {
            float4 u0 = ld_cluster_f32x4(cluster_map(t0 + off + 32, 0)), u1 = ld_cluster_f32x4(cluster_map(t0 + off + 48, 0));
            for (int r = 1; r < ks; r++) {
                const float4 b0 = ld_cluster_f32x4(cluster_map(t0 + off + 32, (uint32_t)r));
                const float4 b1 = ld_cluster_f32x4(cluster_map(t0 + off + 48, (uint32_t)r));
                u0.x += b0.x, u0.y += b0.y, u0.z += b0.z, u0.w += b0.w;
                u1.x += b1.x, u1.y += b1.y, u1.z += b1.z, u1.w += b1.w;
            }
            const float u[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
            if (p.qkv) {
                float va[8], vb[8];
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    va[q] = v[q] * p.colscale[pr + q], vb[q] = u[q] * p.colscale[pr + 8 + q];
                    if (p.bias) va[q] += p.bias[pr + q], vb[q] += p.bias[pr + 8 + q];
                }
                qkv_pair8(p, blockIdx.y * (NIB_GEMM_WG_ROWS / 2) + 8 * ch, mm, va, vb, sb);
                continue;
            }
#pragma unroll
            for (int q = 0; q < 8; q++) {
                float v0 = v[q] * p.colscale[pr + q], v8 = u[q] * p.colscale[pr + 8 + q];
                if (p.bias) v0 += p.bias[pr + q], v8 += p.bias[pr + 8 + q];
                v[q] = gelu_tanh(v0) * v8;
            }
        } else {
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (n + q < p.n_out) {
                    v[q] *= p.colscale[pr + q];
                    if (p.bias) v[q] += p.bias[pr + q];
                }
        }
        wg_store8(p, v, mm, n);
    }
    cluster_sync(); /* no CTA exits while another may still read its tile */
}

template <int FMT, int BT, int CM>
__device__ __forceinline__ void gemm_lowbit_wg_body(const CUtensorMap &tmx, const GemmParams &p) {
    constexpr int ST = WgTile<BT>::ST, STAGE = WgTile<BT>::STAGE, PARTS = FmtT<FMT>::PARTS, SB = FmtT<FMT>::SB;
    static_assert(ST >= 2 && (BT == 16 || BT == 32 || BT % 64 == 0) && BT <= 256 && (CM == 1 || CM == 2), "tile");
    static_assert(BT >= 64 || CM == 1, "the 16- and 32-token tiles run without X multicast");
    static_assert(FMT != NIB_WFMT_INT4 || BT <= 192, "INT4 runs 64- to 192-token tiles");
    constexpr bool I4 = FMT == NIB_WFMT_INT4;
    static_assert((size_t)BT * WG_TP * 4 <= (size_t)ST * STAGE, "the epilogue tile fits in the ring");
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t bars[2 * ST]; /* full[ST] (TMA landed), empty[ST] (consumers done) */
    __shared__ int s_last;
    const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[ST]);
    constexpr bool UW = WgPW<FMT, BT>::UW;
    const int tid = threadIdx.x, warp = UW ? nib::warp_id() : tid >> 5, lane = tid & 31;
    const int m0 = blockIdx.x * BT;
    /* K split (p.ksplit CTAs along z): this CTA's chunks [c0, c0 + nk) */
    const int c0 = (int)((long long)p.nchunks * blockIdx.z / p.ksplit);
    const int nk = (int)((long long)p.nchunks * (blockIdx.z + 1) / p.ksplit) - c0;
    /* CM = 2: the cluster's two CTAs (adjacent row tiles, same tokens) each load half of every X
     * stage (BT / 2 token rows) and multicast it to both: X crosses L2 -> SM once per 256 weight
     * rows instead of 128. A stage is refilled once both CTAs' consumer warpgroups released it. */
    const uint32_t crank = CM > 1 ? cluster_ctarank() : 0;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full0 + 8 * s, 1);
            /* lane 0 of each consumer warp; CM = 2: one thread per consumer warpgroup of each CTA */
            mbar_init(empty0 + 8 * s, CM > 1 ? 2 * CM : 8);
        }
        mbar_init_fence();
    }
    if (CM > 1) cluster_sync(); /* both CTAs' barriers exist before anyone multicasts or arrives */
    else __syncthreads();
    /* X (written by earlier kernels: after the grid dependency): the producer warp walks the
     * chunks, waiting for each stage's release; without it, thread 0 loads the first ST chunks
     * before the K loop and refills a stage once every warpgroup has released it (WgPW) */
    constexpr bool PW = WgPW<FMT, BT>::PW;
    constexpr int HB = BT / CM * 128; /* bytes of this CTA's share of one box */
    auto issue_x = [&](int kb) {
        const int s = kb % ST;
        const uint32_t dst = sbase + s * STAGE + crank * HB;
        const int k = (c0 + kb) * 128, r = m0 + (int)crank * (BT / CM);
        mbar_arrive_expect_tx(full0 + 8 * s, STAGE);
        if (CM > 1) {
            tma_load_2d_mc(dst, &tmx, k, r, full0 + 8 * s, 3);
            tma_load_2d_mc(dst + BT * 128, &tmx, k + 64, r, full0 + 8 * s, 3);
        } else {
            tma_load_2d(dst, &tmx, k, r, full0 + 8 * s);
            tma_load_2d(dst + BT * 128, &tmx, k + 64, r, full0 + 8 * s);
        }
    };
    if (PW && (UW ? warp : nib::warp_id()) == 8) {
        pdl_wait();
        pdl_trigger();
        for (int kb = 0; kb < nk; kb++) {
            if (kb >= ST) mbar_wait(empty0 + 8 * (kb % ST), ((kb / ST) & 1) ^ 1);
            if (lane == 0) issue_x(kb);
            __syncwarp();
        }
        if (CM > 1) cluster_sync(); /* the one after every CTA's K loop (consumers below) */
        else if (p.kcl) { /* the K split's two cluster barriers (consumers below) */
            cluster_sync();
            cluster_sync();
        }
        return;
    }
    /* consumers: warp w decodes row group rg = blockIdx.y * 8 + w (warpgroup w / 4, its rows
     * 16 (w % 4) .. of the warpgroup's 64) */
    const int rg = blockIdx.y * 8 + warp, g = lane >> 2, t = lane & 3;
    const bool rg_ok = rg < p.ng;
    const size_t tile0 = (size_t)(rg_ok ? rg : 0) * p.nchunks + c0;
    const uint8_t *wp = p.w + tile0 * (PARTS * 512) + lane * 16;
    const uint8_t *sp = FMT == NIB_WFMT_FP8 ? p.w : FMT == NIB_WFMT_NVFP4 ? p.s + tile0 * 128 + g * 16
                                                                          : p.s + tile0 * 64 + (g & ~1) * 8;
    const uint64_t pol = evict_first_policy();
    /* the weights do not depend on earlier kernels: the first chunks before the grid dependency */
    if (rg_ok)
        for (int c = 0; c < WG_PF && c < nk; c++) wg_prefetch_chunk<FMT>(p, tile0 + c, lane);
    Chunk<FMT> nxt[1];
    load_chunks_reg<FMT, 1>(nxt, wp, sp, rg_ok, 0, nk, g, pol);
    pdl_wait(); /* X, and the residual of the epilogue, may come from an earlier kernel */
    pdl_trigger();
    NIB_KT(NIB_KT_LOWBIT_WG, NIB_KT_WAITED);
    /* !PW, warp 0: the next chunk whose X is to be loaded. The whole warp keeps the counter and
     * lane 0 issues: kept by thread 0 alone it was not warp-uniform, and each copy sat in a loop
     * that moved its operands into uniform registers one value at a time */
    int kn = 0;
    if (!PW && warp == 0)
        for (; kn < ST && kn < nk; kn++)
            if (lane == 0) issue_x(kn);
    float acc[BT / 2];
    /* INT4: each chunk (= one group of 128 K) is multiplied into tmp first (its first wgmma
     * overwrites, scale-d = 0), then added to acc times the row's fp32 group scale, as the mma.sync
     * kernel does (compute_chunk) */
    float tmp[BT / 2]; /* (unused, and so not allocated, for the other formats) */
#pragma unroll
    for (int i = 0; i < BT / 2; i++) acc[i] = 0.f, tmp[i] = 0.f;
    uint32_t a[2][2][4]; /* A registers of two groups of 2 k16 steps */
    /* the loop keeps its indices incrementally: the stage and its phase, this lane's pointers to
     * the next chunk, and the descriptors as one base (the X ring's start) plus constants */
    const uint64_t d0 = wgmma_desc_sw128(sbase);
    const uint8_t *wn = wp + PARTS * 512, *sn = sp + SB;
    int s = 0, ph = 0, sprev = ST - 1;
    for (int kb = 0; kb < nk; kb++) {
        const Chunk<FMT> cur = nxt[0];
        if (kb + 1 < nk) load_chunks_reg<FMT, 1>(nxt, wn, sn, rg_ok, kb + 1, nk, g, pol);
        wn += PARTS * 512, sn += SB;
        if (rg_ok && kb + WG_PF < nk) wg_prefetch_chunk<FMT>(p, tile0 + kb + WG_PF, lane);
        uint32_t zg = 0, zg8 = 0; /* INT4: the zero points of rows g and g + 8 (bf16 128 + zero, both halves) */
        if (I4) zg = prmt(cur.s.x, 0, 0x3232), zg8 = prmt(cur.s.y, 0, 0x3232);
        const uint64_t ds = d0 + (uint64_t)((s * STAGE) >> 4);
        if (!PW && warp == 0)
            for (; kn <= kb; kn++) { /* this chunk's stage was not free at the last look: wait for it */
                mbar_wait(empty0 + 8 * (kn % ST), ((kn / ST) & 1) ^ 1);
                if (lane == 0) issue_x(kn);
            }
#pragma unroll
        for (int gq = 0; gq < 4; gq++) { /* groups of 2 k16 steps: 2 gq, 2 gq + 1 */
            uint32_t (&ag)[2][4] = a[gq & 1];
#pragma unroll
            for (int q = 0; q < 2; q++) chunk_a<FMT>(cur, 2 * gq + q, p.scale_add, zg, zg8, ag[q]);
            if (gq == 0) mbar_wait(full0 + 8 * s, ph);
            wgmma_fence();
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int st = 2 * gq + q; /* k16 step: box st / 4, 32 bytes per step inside it */
                const uint64_t db = ds + (uint64_t)(((st >> 2) * BT * 128 + (st & 3) * 32) >> 4);
                if (I4) WgmmaBf16RSK<BT>::mma_sd(tmp, ag[q], db, st); /* step 0 overwrites */
                else WgmmaBf16RSK<BT>::mma(acc, ag[q], db);
            }
            wgmma_commit();
            /* the group before this one is done: its A registers (and at gq = 0 the previous
             * chunk's stage) are free. INT4: the chunk's last group waits for all */
            if (I4 && gq == 3) wgmma_wait<0>();
            else wgmma_wait<1>();
            if (gq == 0 && kb > 0) {
                const uint32_t e = empty0 + 8 * sprev;
                if (CM == 1) {
                    if (lane == 0) mbar_arrive(e);
                } else if ((tid & 127) < CM) { /* the warpgroup's group is complete for all its warps */
                    mbar_arrive_remote(e, (uint32_t)(tid & 127)); /* thread j of a warpgroup: CTA j */
                }
            }
            /* !PW: warp 0 refills each stage once every warpgroup has released it, looking after
             * each group without waiting (a wait here stalled its warpgroup: 15 % slower); the
             * test is voted so that the warp agrees (a lane that saw the stage busy defers it) */
            if (!PW && warp == 0)
                for (; kn < nk && kn < kb + ST && __all_sync(0xffffffffu, mbar_test(empty0 + 8 * (kn % ST), ((kn / ST) & 1) ^ 1));
                     kn++)
                    if (lane == 0) issue_x(kn);
        }
        if (I4) { /* acc += the rows' fp16 group scales (low halves) x the chunk's products */
            const float sg = __half2float(__ushort_as_half((unsigned short)(cur.s.x & 0xFFFFu)));
            const float sg8 = __half2float(__ushort_as_half((unsigned short)(cur.s.y & 0xFFFFu)));
            wgmma_fence_operand(tmp);
#pragma unroll
            for (int j = 0; j < BT / 8; j++) {
                acc[4 * j] += sg * tmp[4 * j], acc[4 * j + 1] += sg * tmp[4 * j + 1];
                acc[4 * j + 2] += sg8 * tmp[4 * j + 2], acc[4 * j + 3] += sg8 * tmp[4 * j + 3];
            }
        }
        sprev = s;
        if (++s == ST) s = 0, ph ^= 1;
    }
    wgmma_wait<0>();
    wgmma_fence_operand(acc); /* the accumulators are read below: not before the wait */
    /* CM = 2: no CTA goes on (or exits) while its partner may still arrive on its barriers or
     * multicast into its ring */
    if (CM > 1) cluster_sync();
    if (CM == 1 && p.kcl) { /* K split over the cluster: reduced through distributed shared memory */
        wg_kcl_epilogue<BT>(p, acc, m0, warp, g, t, tid, (float *)(smem_raw + (sbase - smem_u32(smem_raw))));
        return;
    }
    if (p.ksplit > 1) {
        /* K split: the partial sums go to this split's slot (element i of consumer thread tid at
         * [split][cta][i][tid]); the last CTA of the tile adds the slots in split order, its own
         * read back like the others (nothing held in registers across the barrier): deterministic */
        const int cta = blockIdx.y * gridDim.x + blockIdx.x, nctas = gridDim.x * gridDim.y;
        const size_t sstride = (size_t)nctas * (BT / 2) * 256;
        const float *slot0 = p.ws + (size_t)cta * (BT / 2) * 256 + tid;
        float *mine = p.ws + (size_t)blockIdx.z * sstride + (size_t)cta * (BT / 2) * 256 + tid;
#pragma unroll
        for (int i = 0; i < BT / 2; i++) __stcg(mine + i * 256, acc[i]);
        /* publish / acquire: one acq_rel add between two CTA barriers (atomic_add_acq_rel_gpu) */
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (tid == 0) s_last = atomic_add_acq_rel_gpu(p.counters + cta, 1) == p.ksplit - 1;
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (!s_last) return;
#pragma unroll
        for (int i = 0; i < BT / 2; i++) acc[i] = __ldcg(slot0 + i * 256);
        for (int z = 1; z < p.ksplit; z++)
#pragma unroll
            for (int i = 0; i < BT / 2; i++) acc[i] += __ldcg(slot0 + z * sstride + i * 256);
        if (tid == 0) p.counters[cta] = 0; /* for the next launch on this workspace */
    }
    /* epilogue: (1) colscale, bias (and GeGLU) from the accumulators into an fp32 tile
     * [token][column] in the idle ring; (2) the tile walked in 8-column chunks per token: gate,
     * residual (16-byte loads where aligned), one rounding, 16-byte stores. Straight from the
     * fragments the epilogue took a large share of the kernel (2-byte stores of 8 rows per
     * instruction, and every scale load queued behind the stores before it). */
    asm volatile("bar.sync 1, 256;" ::: "memory"); /* every warpgroup's wgmma reads of the ring are done */
    float *tile = (float *)(smem_raw + (sbase - smem_u32(smem_raw)));
    {
        const int pr = rg * 16 + g;
        float cs0 = 0.f, cs8 = 0.f, b0 = 0.f, b8 = 0.f;
        if (rg_ok) {
            cs0 = p.colscale[pr], cs8 = p.colscale[pr + 8];
            if (p.bias) b0 = p.bias[pr], b8 = p.bias[pr + 8];
        }
#pragma unroll
        for (int j = 0; j < BT / 8; j++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float *row = tile + (8 * j + 2 * t + i) * WG_TP;
                float v0 = acc[4 * j + i] * cs0, v8 = acc[4 * j + 2 + i] * cs8;
                if (p.bias) v0 += b0, v8 += b8;
                if (p.geglu) row[warp * 8 + g] = gelu_tanh(v0) * v8;
                else row[warp * 16 + g] = v0, row[warp * 16 + g + 8] = v8;
            }
    }
    asm volatile("bar.sync 1, 256;" ::: "memory");
    if (p.qkv) {
        /* the q|k|v epilogue (nib_cuda_gemm_qkv; NIB_GEMM_WG_QKV=0 turns it off): per token, 8 items of 16 weight rows, the a rows
         * of 8 rotation pairs and their b rows 8 later (the pair layout), as the mma.sync kernel's qkv_pair */
        const int sb = qkv_slot_base(p), pn0 = blockIdx.y * (NIB_GEMM_WG_ROWS / 2);
        for (int c = tid; c < (BT << 3); c += 256) {
            const int tok = c >> 3, ch = c & 7, mm = m0 + tok;
            if (mm >= p.m || 2 * pn0 + 16 * ch >= p.n_out) continue;
            const float *src = tile + tok * WG_TP + 16 * ch;
            const float4 a0 = *(const float4 *)src, a1 = *(const float4 *)(src + 4);
            const float4 b0 = *(const float4 *)(src + 8), b1 = *(const float4 *)(src + 12);
            const float va[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float vb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            qkv_pair8(p, pn0 + 8 * ch, mm, va, vb, sb);
        }
        return;
    }
    const int lw = p.geglu ? 3 : 4; /* log2 of the 8-column chunks per token */
    const int n0 = blockIdx.y * (NIB_GEMM_WG_ROWS >> (p.geglu ? 1 : 0));
    for (int c = tid; c < (BT << lw); c += 256) {
        const int tok = c >> lw, ch = c & ((1 << lw) - 1), mm = m0 + tok, n = n0 + 8 * ch;
        if (mm >= p.m || n >= p.n_out) continue;
        const float *src = tile + tok * WG_TP + 8 * ch;
        const float4 lo = *(const float4 *)src, hi = *(const float4 *)(src + 4);
        float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        wg_store8(p, v, mm, n);
    }
}

/* L: a lean instantiation (NIB_GEMM_LEAN, as the mma.sync kernel's) with its K-split mode, GeGLU and the q|k|v
 * epilogue fixed at compile time and no bias: split (L & 3) 1 one K split, 2 the splits reduced in their cluster
 * (kcl), 3 through the workspace; GeGLU ((L >> 2) & 1); q|k|v (L >> 3, NIB_GEMM_WG_QKV). L = 0 decides
 * everything at run time. */
#define WG_LEAN(split, geglu) ((split) | ((geglu) << 2))
#define WG_LEAN_QKV(split) ((split) | 8)
template <int FMT, int BT, int CM, int L = 0>
__global__ void __launch_bounds__(WgPW<FMT, BT>::THREADS, WgPW<FMT, BT>::OCC) k_gemm_lowbit_wg(const __grid_constant__ CUtensorMap tmx, const GemmParams pa) {
    NIB_KT(NIB_KT_LOWBIT_WG, NIB_KT_ENTRY);
    NIB_KT_EXIT_GUARD(NIB_KT_LOWBIT_WG);
    if constexpr (L == 0) {
        gemm_lowbit_wg_body<FMT, BT, CM>(tmx, pa);
    } else { /* the fixed fields as constants the compiler propagates */
        GemmParams p = pa;
        p.bias = nullptr;
        p.qkv = L >> 3;
        p.geglu = (L >> 2) & 1;
        p.kcl = (L & 3) == 2;
        if constexpr ((L & 3) == 1) p.ksplit = 1;
        gemm_lowbit_wg_body<FMT, BT, CM>(tmx, p);
    }
}

} /* namespace */

#endif
