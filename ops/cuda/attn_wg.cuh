/* attn_wg.cuh — the warpgroup-MMA attention kernel ("wg", "wg1", "wk2"): bf16 Q/K/V, head_dim <= 256
 * (padded to 256), 128 (wg) or 64 query rows per CTA, 64-key tiles (wk2: 32). Included by
 * ops/cuda/attention.cu (which plans and launches it like the other variants: same parameters,
 * same split workspace, same merge).
 *
 * Why: the mma.sync kernels (r8 / r4) read the whole K and V tile from shared memory once per
 * 16-row warp (8 x 64 KB per 64-key tile at head_dim 256), so a tile costs what those reads cost
 * (~4 us per tile on H100: docs/design.md "The Gemma prefix attention is bound by shared-memory
 * reads"). wgmma reads its shared-memory B operand once per 64-row warpgroup.
 *
 * CTA (wg): two warpgroups (256 threads), warpgroup w owns query rows 64 w .. 64 w + 63 (wg1: one);
 * all threads copy (cp.async, 16-byte chunks) Q once and the K / V tiles into a 2-stage ring, in the
 * 128-byte-swizzled layout wgmma reads: an operand of R rows x 256 bf16 is four 64-column atoms of
 * R x 128 bytes, row r's chunk c at chunk c ^ (r & 7) (ops/cuda/wgmma.cuh). Per tile and
 * warpgroup:
 *   S = Q K^T     16 x wgmma m64n64k16 (Q and K K-major in shared memory), fp32, 32 registers;
 *   softmax       as the mma.sync kernels: x = S * lscale (log2 units), keys past the split end
 *                 -> -inf, running max / sum in fp32, P = 2^(x - m) rounded to bf16;
 *   O += P V      4 x wgmma m64n256k16, P from registers (the m16n8k16 A fragment, which is the
 *                 layout S's accumulator already has), V MN-major in shared memory (keys x dims
 *                 as stored: imm-trans-b), fp32, 128 registers.
 * The epilogue writes o = O / l (bf16) or, split, (m, l, O / l) to the workspace exactly as k_attn.
 * Measured and removed: warpgroup 1 running half a tile behind warpgroup 0 (its P V of tile it - 1
 * issued with S of tile it, a third V stage), so one warpgroup's softmax would overlap the other's
 * products: 24.0 against 23.3 us (Gemma prefix S = 532), 41.7 against 39.3 (S = 968).
 * Where a tile's ~3 us go (against ~1.1 us of tensor work per CTA): issuing instructions. One warp per
 * scheduler issues at ~3.8 cycles per instruction, ~1660 per warp per 64-key tile (copy address math ~370,
 * S with its descriptors ~460, softmax / rescale / P V ~830) and ~1280 in the prologue (Nsight Compute on
 * the H = 50 suffix, docs/design.md "Twenty-seventh session"): fewer instructions (TMA copies, descriptors
 * once per tile) is the lever, not the tensor work.
 * The same template, KSPLIT = 2 ("wk2", the Gemma prefix's default since the twentieth session):
 * 64 query rows per CTA as wg1, but two
 * warpgroups (256 threads) that split the CTA's key range in halves of 32-key tiles (the first half
 * takes the odd tile), each with its own 2-stage K / V ring and its own named barrier (ids 1, 2), so
 * a scheduler holds two warps. S = Q K^T is 16 x m64n32k16 (16 registers), O += P V 2 x m64n256k16.
 * At the end the second half puts (m, l, unnormalized O) in shared memory (O in its own ring) and
 * the first combines them (M = max, a = 2^(m - M), L = sum l a, O = sum O a) and writes as above.
 * Measured (H100, `nib bench attn --variants wg1,wk2`): Gemma prefix S = 532 / 788 / 968 20.7 / 28.0 /
 * 32.9 us against wg1's 21.4-22.0 / 29.2 / 34.2 (4-6 %; two warps per scheduler did not halve the
 * tile time); on the suffix cache path slower (P = 532 H = 50 12.3 against 11.1 us), so wg1 stays
 * there. 255 registers, no spills (the merge's 32 shared loads of the second half's O are issued
 * together): a change here must be checked for spills.
 * TMA forms (TMA = 1: "wgt", "wg1t", "wk2t", the default where 64 % group == 0; NIB_ATTN_TMA=0 keeps
 * cp.async): one thread per ring issues Q (4 boxes of 64 dims per 64-row operand, from a 4-D map
 * d x head x token x seq) and each K / V tile (4 + 4 boxes from d x kv head x token x seq maps) on
 * mbarriers, in the same 128-byte-swizzled layout, so the consumer warps issue no copy address math
 * (~1280 + ~370 per tile of their ~3600 instructions per warp in the cp.async form, all issued at
 * ~3.8 cycles each: docs/design.md "Twenty-seventh session"). Rows past the valid ones are read as
 * they are (keys are masked in S; Q rows past the valid ones are never stored); V's rows past the
 * split's end are zeroed in shared memory before P V (0 x NaN is not 0). Measured against the cp.async
 * forms (bench/results/attn-tma-ab-h100.json): every suffix row of the lab 1.0-1.4 us faster (P = 532
 * H = 50 10.26 -> 9.04 us), the long Gemma prefixes unchanged (S = 968 32.5 -> 32.8), fast 3 cameras
 * H = 50 14.46 -> 14.21 ms. Then (bench/results/attn-wg-cuts-ab-h100.json): the wgmma descriptors built
 * once per operand and offset per k-step (wgmma_desc_at), the O rescale skipped where it is the
 * identity (the first tile; no new row maximum in the warp), and tiles 0 and 1 issued together: 14 %
 * fewer instructions (ncu, wg1t), the Gemma prefix S = 968 32.6 -> 31.1 us, S = 788 27.8 -> 26.5; the
 * suffix unchanged (~9 us at H = 50, of which the merge kernel is ~3: the splits' partials combined
 * in a cluster through distributed shared memory instead measured ~3 us slower, not kept).
 * LZ forms (wg1t-lz, wk2t-lz, the default since the forty-sixth session; NIB_ATTN_WG_LZ=0 keeps the
 * plain ones): Nsight Compute on wk2t inside the model had FMUL at 29 % of the executed instructions,
 * most of it O's rescale on every tile where a row's maximum grew; the lazy form rescales only where
 * one grew by more than 2^8, and wk2t's two halves each combine and store half the dims instead of
 * the second half idling while the first does all of it. Gemma prefix S = 532 / 788 / 968 ~19.4 / 26.8
 * / 31.6 -> ~18.6 / 25.1 / 29.7 us; fast 2 cameras 9.61 -> 9.56 ms (bench/results/attn-wg-lazy-ab-h100.json).
 */
#ifndef NIB_ATTN_WG_CUH
#define NIB_ATTN_WG_CUH

#include "ops/cuda/attention.cuh"
#include "ops/cuda/wgmma.cuh"

namespace nib {

/* WGS warpgroups of 64 query rows per CTA (wg, wg1); KSPLIT = 2 (wk2, with WGS = 1): two warpgroups
 * share the CTA's 64 rows and split its key range, each with its own ring, merged at the end */
template <int WGS, int KSPLIT = 1, int TMA = 0> struct WgCfg {
    static_assert(KSPLIT == 1 || (KSPLIT == 2 && WGS == 1), "wk2: one row group, two key halves");
    static constexpr int NT = 128 * WGS * KSPLIT, ROWS = 64 * WGS, TK = 64 / KSPLIT, DP = 256;
    static constexpr int QSTEP = NT / 32;                  /* Q rows per copy round (all threads) */
    static constexpr int RSTEP = NT / KSPLIT / 32;         /* tile rows per copy round (a ring's threads) */
    static constexpr int KST = 2, VST = 2;                 /* K and V ring stages */
    static constexpr int ATOM = 128;                       /* bytes per row of one 64-column atom */
    static constexpr int Q_WG_BYTES = 64 * DP * 2;         /* one warpgroup's 64 rows: 32 KB */
    static constexpr int KV_BYTES = TK * DP * 2;           /* one K (or V) tile: 32 KB (wk2: 16 KB) */
    static constexpr int RING_BYTES = (KST + VST) * KV_BYTES; /* one key half's K / V ring */
    static constexpr int ML_BYTES = KSPLIT > 1 ? 2 * 64 * 4 : 0; /* wk2 merge: m, l of the second half */
    /* TMA: mbarriers, Q's and each ring's K / V stages' (8 bytes each) */
    static constexpr int BAR_OFF = WGS * Q_WG_BYTES + KSPLIT * RING_BYTES + ML_BYTES;
    static constexpr int BAR_BYTES = TMA ? 8 * (1 + KSPLIT * KST) : 0;
    static constexpr int SMEM = 1024 /* alignment slack */ + BAR_OFF + BAR_BYTES;
    static_assert(KSPLIT == 1 || RING_BYTES == 64 * DP * 4, "wk2 merge: a ring holds 64 rows x 256 fp32");
};

/* byte offset of 16-byte chunk c (0..31: 8 dims each) of row r in an operand of `rows` rows */
__device__ __forceinline__ uint32_t wg_chunk_off(int r, int c, int rows) {
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + ((((c & 7) ^ (r & 7))) << 4));
}

/* LZ (bit mask, forty-sixth session): WG_LAZY rescales O only where a row's maximum grew by more than
 * WG_TAU (log2 units) over the one P was last taken against (softmax_fold_lazy); WG_SPLIT_MERGE (wk2)
 * has both key halves combine and store half of the dimensions each (the kernel's end). */
enum { WG_LAZY = 1, WG_SPLIT_MERGE = 2 };
#define WG_TAU 8.0f /* P = 2^(x - m) <= 2^8 between rescales: exact in fp32 sums, bf16 P keeps its relative error */

/* The lazy rescale (LZ & WG_LAZY). The online softmax keeps, per row, the maximum m its P and l are
 * taken against; the eager form moves m to every new maximum and multiplies O (128 fp32 per thread)
 * by alpha = 2^(m_old - m_new) whenever any row of the warp grew. Here m moves (and O is rescaled)
 * only when some row of the warp grew by more than WG_TAU; otherwise the tile's P is taken against
 * the old m, so P <= 2^WG_TAU. o = O / l is the same quantity either way (m cancels); what changes is
 * only where the roundings fall (P's bf16 rounding is relative, l and O are fp32 sums). m stays the
 * one P was taken against, so (m, l, O) stay consistent for the key-half combine and the split merge.
 * Rows whose keys so far are all masked (m = -inf) take the eager path (any finite x exceeds them). */
__device__ __forceinline__ void softmax_fold_lazy(float (&mx)[2], float (&mrow)[2], float (&lrow)[2],
                                                  float (&alpha)[2], float (&mu)[2], bool &rescale) {
    bool grow = false;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        grow |= mx[i] > mrow[i] + WG_TAU; /* -inf + tau = -inf: a first finite key grows */
    }
    rescale = __any_sync(0xffffffffu, grow);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (rescale) {
            const float mn = fmaxf(mrow[i], mx[i]);
            mu[i] = mn == -INFINITY ? 0.f : mn;
            alpha[i] = exp2f(mrow[i] - mu[i]);
            mrow[i] = mn;
            lrow[i] *= alpha[i];
        } else {
            mu[i] = mrow[i] == -INFINITY ? 0.f : mrow[i]; /* all masked so far: x = -inf, P = 0 */
            alpha[i] = 1.f;
        }
    }
}

template <int WGS, int KSPLIT, int TMA = 0, int LZ = 0>
__global__ void __launch_bounds__(WgCfg<WGS, KSPLIT, TMA>::NT, 1) k_attn_wg(const __grid_constant__ AttnParams p) {
    NIB_KT(NIB_KT_ATTN_WG, NIB_KT_ENTRY);
    attn_prefetch_kv(p, WgCfg<WGS, KSPLIT, TMA>::TK); /* a hint before the wait: see there */
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any other access or return */
    NIB_KT(NIB_KT_ATTN_WG, NIB_KT_WAITED);
    NIB_KT_EXIT_GUARD(NIB_KT_ATTN_WG);
    using C = WgCfg<WGS, KSPLIT, TMA>;
    constexpr int TK = C::TK, NSJ = TK / 8; /* keys per tile, S n-tiles (8 keys) per tile */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* the swizzle is applied to address bits 4..9: operands start on 1024-byte boundaries */
    unsigned char *const smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x, lane = tid & 31, warp = nib::warp_id(), wg = warp >> 2;
    /* wg, wg1: warpgroup wg owns rows 64 wg ..; wk2: both own the CTA's 64 rows, wg is the key half */
    const int rg = KSPLIT > 1 ? 0 : wg, kh = KSPLIT > 1 ? wg : 0;
    const uint32_t sq = smem_u32(smem), sk = sq + WGS * C::Q_WG_BYTES + kh * C::RING_BYTES;
    const uint32_t sv = sk + C::KST * C::KV_BYTES;

    const int z = blockIdx.z, seq = z / p.n_kv, hkv = z % p.n_kv;
    const int split = blockIdx.y, row0 = blockIdx.x * C::ROWS;

    /* CTA-uniform early exits, before any async copy and any barrier (as k_attn). A split past the
     * active ones writes its valid rows' workspace entries as (m, l, o) = (-inf, 0, 0), as rk does, so
     * that k_attn_merge<.., true> loads every split's entries before it reads a length (one L2 round
     * trip fewer); rows past the valid ones and sequences past nseq_valid stay unwritten (the merge
     * loads them and exits before it uses them). The three lengths are loaded together (one round trip, not two:
     * 0.01-0.03 ms per call at H = 50 and at 3 cameras, "Sixty-first session"). */
    const int seq_valid = read_len(p.nseq_valid, p.n_seq);
    const int T = read_len(p.t_valid, p.t_max);
    const int rows_valid = read_len(p.nq_valid, p.nq_max) * p.group;
    if (seq >= seq_valid) return;
    if (row0 >= rows_valid) return;
    int t0, t1;
    if (split >= nib_attn_split_range(T, p.n_splits, TK, split, &t0, &t1)) {
        attn_ws_idle(p, z, split, row0, min(C::ROWS, rows_valid - row0), C::NT);
        return;
    }
    const int n_tiles = (t1 - t0 + TK - 1) / TK;
    /* this warpgroup's tiles [tb, tb + nt) of the split and the end of its keys (wk2: the first half
     * takes the odd tile; a half may have none) */
    int tb = 0, nt = n_tiles, kend = t1;
    if constexpr (KSPLIT > 1) {
        const int nh = (n_tiles + 1) / 2;
        tb = kh ? nh : 0;
        nt = kh ? n_tiles - nh : nh;
        kend = kh ? t1 : min(t0 + nh * TK, t1);
    }
    const int kbeg = t0 + tb * TK;

    const int c = tid & 31;        /* this thread's chunk column */
    const int cmax = (p.d + 7) / 8; /* chunks past head_dim are zero-filled */
    const bool cok = c < cmax;

    /* Q rows -> smem (zero rows past the valid rows), all threads: warpgroup w's rows (wg) in its own
     * operand (TMA: one thread, below) */
    if constexpr (!TMA) {
        /* row = (token tq, head hq of the group): one division for the first row, then stepped. The
         * prologue was 36 % of the kernel's instructions (Nsight Compute, the suffix at H = 50), a
         * division and a 64-bit product per row among them; stepped, the suffix lab gained 0.6-1.0 us
         * (docs/design.md "Twenty-seventh session") */
        const __nv_bfloat16 *qb = p.q + seq * p.q_seq + (long long)hkv * p.group * p.d + c * 8;
        int row = row0 + warp;
        int hq = row % p.group;
        long long qo = (long long)(row / p.group) * p.q_tok + (long long)hq * p.d; /* elements from qb */
        const long long wrap = p.q_tok - (long long)p.group * p.d; /* head past the group -> next token */
        for (int r = warp; r < C::ROWS; r += C::QSTEP) {
            const bool ok = cok && row < rows_valid;
            cp_async16(sq + (r >> 6) * C::Q_WG_BYTES + wg_chunk_off(r & 63, c, 64), ok ? qb + qo : p.q, ok ? 16 : 0);
            row += C::QSTEP;
            hq += C::QSTEP;
            qo += (long long)C::QSTEP * p.d;
            while (hq >= p.group) {
                hq -= p.group;
                qo += wrap;
            }
        }
    }
    const int r8 = KSPLIT > 1 ? warp % C::RSTEP : warp; /* this thread's first tile row (< RSTEP) */
    const uint8_t *const kbase = p.k + seq * p.k_seq + hkv * p.kv_head + c * 16;
    const uint8_t *const vbase = p.v + seq * p.v_seq + hkv * p.kv_head + c * 16;
    /* one K/V tile (keys kbeg + it * TK ...) -> stage, by the threads of the ring; keys >= kend are
     * zero-filled */
    auto load_tile = [&](int it) {
        const int tt0 = kbeg + it * TK;
        const uint32_t dk = sk + (it % C::KST) * C::KV_BYTES, dv = sv + (it % C::VST) * C::KV_BYTES;
        const uint8_t *ks = kbase + (long long)(tt0 + r8) * p.k_tok;
        const uint8_t *vs = vbase + (long long)(tt0 + r8) * p.v_tok;
#pragma unroll 4
        for (int j = r8; j < TK; j += C::RSTEP) {
            const bool ok = cok && tt0 + j < kend;
            const uint32_t off = wg_chunk_off(j, c, TK);
            cp_async16(dk + off, ok ? (const void *)ks : (const void *)p.k, ok ? 16 : 0);
            cp_async16(dv + off, ok ? (const void *)vs : (const void *)p.v, ok ? 16 : 0);
            ks += C::RSTEP * p.k_tok;
            vs += C::RSTEP * p.v_tok;
        }
    };
    /* TMA: barriers (Q's, then ring h's stage s at 1 + h KST + s), filled by one thread per ring (ring
     * h's leader: thread 128 h); Q as 4 boxes of 64 dims per warpgroup operand, a tile as 4 + 4 boxes
     * of (64 dims x TK keys). Keys past a split's end are read (masked in S); V rows past kend are
     * zeroed in shared memory before P V, since 0 x (a NaN or Inf in those slots) would not be 0. */
    const uint32_t bars = sq + C::BAR_OFF;
    const bool leader = TMA && (tid & 127) == 0 && (KSPLIT > 1 || tid == 0);
    auto full_bar = [&](int it) { return bars + 8 * (1 + kh * C::KST + it % C::KST); };
    auto tma_tile = [&](int it) {
        const int tt0 = kbeg + it * TK;
        const uint32_t bar = full_bar(it);
        const uint32_t dk = sk + (it % C::KST) * C::KV_BYTES, dv = sv + (it % C::VST) * C::KV_BYTES;
        mbar_arrive_expect_tx(bar, 2 * C::KV_BYTES);
#pragma unroll
        for (int at = 0; at < 4; at++) {
            tma_load_4d(dk + at * TK * C::ATOM, &p.tmk, 64 * at, hkv, tt0, seq, bar);
            tma_load_4d(dv + at * TK * C::ATOM, &p.tmv, 64 * at, hkv, tt0, seq, bar);
        }
    };
    /* TMA: wait for tile it (and, first, Q), then zero V's rows past kend in a partial tile */
    auto tma_ready = [&](int it) {
        if (it == 0) mbar_wait(bars, 0);
        mbar_wait(full_bar(it), (unsigned)(it / C::KST) & 1u);
        const int tt0 = kbeg + it * TK, jz = max(kend - tt0, 0);
        if (jz < TK) {
            unsigned char *const vop = smem + (sv - sq) + (it % C::VST) * C::KV_BYTES;
            for (int u = (KSPLIT > 1 ? tid & 127 : tid) + jz * 32; u < TK * 32; u += C::NT / KSPLIT)
                *(uint4 *)(vop + wg_chunk_off(u >> 5, u & 31, TK)) = make_uint4(0u, 0u, 0u, 0u);
            fence_proxy_async_smem(); /* the zeros are visible to wgmma (after the ring's barrier) */
        }
    };
    if constexpr (TMA) {
        if (tid == 0) {
            mbar_init(bars, 1);
            for (int i = 1; i < 1 + KSPLIT * C::KST; i++) mbar_init(bars + 8 * i, 1);
            mbar_init_fence();
        }
        __syncthreads(); /* the barriers are initialized before anyone waits on or fills them */
        if (tid == 0) {
            const int tok0 = row0 / p.group, tpo = 64 / p.group; /* tokens per 64-row operand */
            mbar_arrive_expect_tx(bars, WGS * C::Q_WG_BYTES);
#pragma unroll
            for (int w = 0; w < WGS; w++)
#pragma unroll
                for (int at = 0; at < 4; at++)
                    tma_load_4d(sq + w * C::Q_WG_BYTES + at * 64 * C::ATOM, &p.tmq, 64 * at, hkv * p.group, tok0 + w * tpo,
                                seq, bars);
        }
        if (leader) { /* both stages are free: tiles 0 and 1 at once (a split of the suffix has ~2 tiles) */
            if (nt > 0) tma_tile(0);
            if (nt > 1) tma_tile(1);
        }
    } else {
        if (nt > 0) load_tile(0);
        cp_async_commit(); /* group 0: Q and tile 0 */
    }
    if constexpr (KSPLIT > 1) { /* both halves read all of Q: the CTA barrier; then one per half */
        if constexpr (TMA) {
            if (nt > 0) tma_ready(0);
            else mbar_wait(bars, 0);
        } else {
            cp_async_wait_all();
            fence_proxy_async_smem();
        }
        __syncthreads();
    }

    /* per-thread state: rows g (i = 0) and g + 8 (i = 1) of the warp's 16 */
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    /* uniform per warpgroup; wk2: every row block that gets here has valid rows in both halves */
    const bool wg_active = KSPLIT > 1 || row0 + wg * 64 < rows_valid;
    const int t2 = 2 * (lane & 3), g = lane >> 2;
    const uint64_t dq = wgmma_desc_sw128(sq + rg * C::Q_WG_BYTES); /* Q's operand, offset per k-step */
    uint32_t a[TK / 16][4]; /* bf16 P of the last tile: the A fragments of O += P V */
    auto pv = [&](int it) {
        /* V MN-major: 64-dim atoms TK * ATOM bytes apart (leading offset), 8-key groups 1 KB (stride);
         * one descriptor per tile, offset per k-step */
        const uint64_t dv = wgmma_desc_sw128_mn(sv + (it % C::VST) * C::KV_BYTES, TK * C::ATOM, 8 * C::ATOM);
#pragma unroll
        for (int kk = 0; kk < TK / 16; kk++) WgmmaBf16RS<256>::mma(o, a[kk], wgmma_desc_at(dv, kk * 16 * C::ATOM));
    };

#pragma unroll 1
    for (int it = 0; it < nt; it++) {
        if (KSPLIT == 1 || it > 0) { /* wk2: the prologue's barrier covers tile 0 */
            if constexpr (TMA) {
                tma_ready(it);
            } else {
                cp_async_wait_all();      /* this thread's copies of tile it (and Q) landed */
                fence_proxy_async_smem(); /* ... and are visible to wgmma's async proxy */
            }
            /* every thread's (of the ring); and its warpgroups are done with tile it - 1. wk2: the
             * halves run different tile counts, so each syncs its own 128 threads (ids 1, 2) */
            if (KSPLIT == 1) __syncthreads();
            else if (kh == 0) asm volatile("bar.sync 1, 128;" ::: "memory");
            else asm volatile("bar.sync 2, 128;" ::: "memory");
        }
        if constexpr (TMA) {
            /* tile it + 1 into the stage tile it - 1 left (the barrier above); 1 came with 0 */
            if (leader && it >= 1 && it + 1 < nt) tma_tile(it + 1);
        } else {
            if (it + 1 < nt) load_tile(it + 1);
            cp_async_commit();
        }
        if (!wg_active) continue;
        const uint64_t dk = wgmma_desc_sw128(sk + (it % C::KST) * C::KV_BYTES); /* this tile's K operand */

        /* S = Q K^T: 64 rows x TK keys, 16 k-steps of 16 dims (4 per 128-byte atom) */
        float s[TK / 2];
#pragma unroll
        for (int i = 0; i < TK / 2; i++) s[i] = 0.f;
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 16; ks++) {
            const uint32_t at = (ks >> 2) * (64 * C::ATOM) + (ks & 3) * 32;
            const uint32_t bt = (ks >> 2) * (TK * C::ATOM) + (ks & 3) * 32;
            WgmmaBf16SS<TK>::mma(s, wgmma_desc_at(dq, at), wgmma_desc_at(dk, bt));
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(s); /* S is read below: not before the wait */

        /* scale to log2 units, mask keys past this warpgroup's end, online softmax (as k_attn) */
        const int key_t0 = kbeg + it * TK;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NSJ; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int kl = j * 8 + t2 + (q & 1);
                const float x = key_t0 + kl < kend ? s[4 * j + q] * p.lscale : -INFINITY;
                s[4 * j + q] = x;
                mx[q >> 1] = fmaxf(mx[q >> 1], x);
            }
        float alpha[2], mu[2];
        bool rescale = true;
        if constexpr ((LZ & WG_LAZY) != 0) softmax_fold_lazy(mx, mrow, lrow, alpha, mu, rescale);
        else softmax_fold(mx, mrow, lrow, alpha, mu);
#pragma unroll
        for (int i = 0; i < TK / 2; i++) {
            const float pr = exp2f(s[i] - mu[(i >> 1) & 1]);
            lrow[(i >> 1) & 1] += pr;
            s[i] = pr;
        }
        /* O *= alpha (128 products), skipped where it is the identity: on the first tile (O is 0) and
         * where no row of the warp got a new maximum (alpha = 1); the same bits either way. Lazy: only
         * where the warp moved its maxima (rescale), and then also where alpha = 1 */
        if (it > 0 && ((LZ & WG_LAZY) != 0 ? rescale : __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))) {
#pragma unroll
            for (int j = 0; j < 32; j++) {
                o[4 * j] *= alpha[0];
                o[4 * j + 1] *= alpha[0];
                o[4 * j + 2] *= alpha[1];
                o[4 * j + 3] *= alpha[1];
            }
        }
        /* O += bf16(P) V: k-step kk = keys 16 kk .. 16 kk + 15 = S n-tiles 2 kk, 2 kk + 1 */
#pragma unroll
        for (int kk = 0; kk < TK / 16; kk++) {
            a[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
            a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
            a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
            a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
        }
        wgmma_fence();
        pv(it);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(o); /* O is rescaled (next tile) or stored: not before the wait */
    }
    cp_async_wait_all(); /* nothing may land in smem after this point */
    if constexpr (TMA && KSPLIT == 1)
        if (nt == 0) mbar_wait(bars, 0); /* no tile (nothing visible): Q's copy must land before the CTA ends */
    if (!wg_active) return;

    /* full row sums (the 4 lanes of a quad hold different keys) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 1);
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 2);
    }
    /* the dims this thread combines and stores: all (j = 0 .. 31), or with the split merge its key half's
     * half of them (half 0: j < 16, dims 0 .. 127; half 1: j >= 16) */
    constexpr bool SM = KSPLIT > 1 && (LZ & WG_SPLIT_MERGE) != 0;
    if constexpr (KSPLIT > 1 && !SM) {
        /* wk2: the second half's (m, l, unnormalized O) -> smem, the first half combines them with its
         * own: M = max(m0, m1), a_h = 2^(m_h - M) (0 where M = -inf), L = l0 a0 + l1 a1,
         * O = O0 a0 + O1 a1. O1 in the second half's ring (64 KB), thread-major: float4 j of thread
         * (warp in the warpgroup, lane) at [j][thread], read back by the first half's thread of the
         * same position, which owns the same rows and dims (conflict-free, 512 bytes per warp). */
        float *const o1 = (float *)(smem + WGS * C::Q_WG_BYTES + C::RING_BYTES);
        float *const ml1 = (float *)(smem + WGS * C::Q_WG_BYTES + KSPLIT * C::RING_BYTES); /* [64] m, [64] l */
        const int wt = tid & 127; /* thread within the warpgroup */
        if (kh == 1) {
            asm volatile("bar.sync 2, 128;" ::: "memory"); /* (its loop's id) its wgmma reads of its ring are done */
#pragma unroll
            for (int j = 0; j < 32; j++)
                *(float4 *)(o1 + (j * 128 + wt) * 4) = make_float4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
            if (t2 == 0)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int rl = (warp & 3) * 16 + g + 8 * i;
                    ml1[rl] = mrow[i];
                    ml1[64 + rl] = lrow[i];
                }
        } else {
            /* Redundant for the hardware (the __syncthreads below orders the hand-off), but kept for
             * compute-sanitizer: its racecheck (2025.3.1) counts barriers of every id per thread and
             * reports this hand-off as a race when the reader has passed fewer barriers than the
             * writer had (a minimal kernel: named barriers per half, then __syncthreads; see
             * docs/reliability.md). Without it the second half passes one more named barrier than
             * the first when the tile count is even. */
            asm volatile("bar.sync 1, 128;" ::: "memory");
        }
        __syncthreads();
        if (kh == 1) return; /* the first half writes the result */
        float a0[2], a1[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int rl = (warp & 3) * 16 + g + 8 * i;
            const float m1 = ml1[rl], l1 = ml1[64 + rl], mm = fmaxf(mrow[i], m1);
            a0[i] = mm == -INFINITY ? 0.f : exp2f(mrow[i] - mm);
            a1[i] = mm == -INFINITY ? 0.f : exp2f(m1 - mm);
            lrow[i] = lrow[i] * a0[i] + l1 * a1[i];
            mrow[i] = mm;
        }
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const float4 v = *(const float4 *)(o1 + (j * 128 + wt) * 4);
            o[4 * j] = o[4 * j] * a0[0] + v.x * a1[0];
            o[4 * j + 1] = o[4 * j + 1] * a0[0] + v.y * a1[0];
            o[4 * j + 2] = o[4 * j + 2] * a0[1] + v.z * a1[1];
            o[4 * j + 3] = o[4 * j + 3] * a0[1] + v.w * a1[1];
        }
    }
    if constexpr (SM) {
        /* The split merge: each half puts (m, l) and the half of its unnormalized O that the OTHER half
         * stores into its own ring (idle after its loop: 16 float4 per thread, [j][thread] as above, then
         * m [64] and l [64] at 32 KB), one CTA barrier, then each half combines its 128 dims (the same M,
         * a_h, L and O = O0 a0 + O1 a1 as above, in both halves) and stores them: the combine's shared-
         * memory reads and the stores are halved on the critical path, and neither half waits idle while
         * the other writes the result. j loops run over all 32 with a per-half predicate, so every index
         * into o[] stays a compile-time constant (registers, no local memory). */
        const int wt = tid & 127;
        float *const xo = (float *)(smem + WGS * C::Q_WG_BYTES); /* ring h at xo + h * RING_BYTES / 4 */
        float *const mine = xo + kh * (C::RING_BYTES / 4), *const other = xo + (1 - kh) * (C::RING_BYTES / 4);
        constexpr int MLO = 16 * 128 * 4; /* floats: (m, l) after the 16 float4 per thread */
        static_assert(MLO * 4 + 128 * 4 <= C::RING_BYTES, "split merge: a ring holds 32 KB of O and (m, l)");
        if (kh == 0) asm volatile("bar.sync 1, 128;" ::: "memory"); /* this half's wgmma reads of its ring are done */
        else asm volatile("bar.sync 2, 128;" ::: "memory");
#pragma unroll
        for (int j = 0; j < 32; j++)
            if ((j >> 4) != kh) /* the other half's dims */
                *(float4 *)(mine + ((j & 15) * 128 + wt) * 4) = make_float4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
        if (t2 == 0)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int rl = (warp & 3) * 16 + g + 8 * i;
                mine[MLO + rl] = mrow[i];
                mine[MLO + 64 + rl] = lrow[i];
            }
        __syncthreads();
        const float *const h0 = kh ? other : mine, *const h1 = kh ? mine : other;
        float a0[2], a1[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int rl = (warp & 3) * 16 + g + 8 * i;
            const float m0 = h0[MLO + rl], l0 = h0[MLO + 64 + rl], m1 = h1[MLO + rl], l1 = h1[MLO + 64 + rl];
            const float mm = fmaxf(m0, m1);
            a0[i] = mm == -INFINITY ? 0.f : exp2f(m0 - mm);
            a1[i] = mm == -INFINITY ? 0.f : exp2f(m1 - mm);
            lrow[i] = l0 * a0[i] + l1 * a1[i];
            mrow[i] = mm;
        }
        /* this half's weights and the other's */
        const float aw0 = kh ? a1[0] : a0[0], aw1 = kh ? a1[1] : a0[1], ao0 = kh ? a0[0] : a1[0], ao1 = kh ? a0[1] : a1[1];
#pragma unroll
        for (int j = 0; j < 32; j++)
            if ((j >> 4) == kh) {
                const float4 v = *(const float4 *)(other + ((j & 15) * 128 + wt) * 4);
                o[4 * j] = o[4 * j] * aw0 + v.x * ao0;
                o[4 * j + 1] = o[4 * j + 1] * aw0 + v.y * ao0;
                o[4 * j + 2] = o[4 * j + 2] * aw1 + v.z * ao1;
                o[4 * j + 3] = o[4 * j + 3] * aw1 + v.w * ao1;
            }
    }
    const size_t part0 = ((size_t)z * p.n_splits + split) * p.rows_max; /* workspace row 0 of this split */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = row0 + rg * 64 + (warp & 3) * 16 + g + 8 * i;
        if (row >= rows_valid) continue;
        const float inv = lrow[i] > 0.f ? 1.f / lrow[i] : 0.f;
        if (p.n_splits == 1) {
            __nv_bfloat16 *dst = p.o + seq * p.o_seq + (long long)(row / p.group) * p.o_tok +
                                 (long long)(hkv * p.group + row % p.group) * p.d;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const int dim = 8 * j + t2;
                if (SM && (j >> 4) != kh) continue; /* the split merge: the other half stores these */
                if (dim < p.d) *(uint32_t *)(dst + dim) = pack_bf16(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
            }
        } else {
            float *dst = p.ws_o + (part0 + row) * p.d;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const int dim = 8 * j + t2;
                if (SM && (j >> 4) != kh) continue;
                if (dim < p.d) *(float2 *)(dst + dim) = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
            }
            if (t2 == 0 && (!SM || kh == 0)) {
                p.ws_m[part0 + row] = mrow[i];
                p.ws_l[part0 + row] = lrow[i];
            }
        }
    }
}

} // namespace nib

#endif
