/* attn_dec.cuh — the decode attention kernel (ops/cuda/attention.cu picks it for up to 8 query
 * rows per KV head: one decoded token x 8 MQA heads), for every cache dtype, head_dim 256.
 *
 * Why a second kernel: decoding is a pure stream over the cache (each K/V byte is used by the 8
 * rows once), and the tile kernel (k_attn "dec": 2 warps, cp.async tiles through shared memory,
 * low-bit tiles decoded into a bf16 tile first, 2-3 CTAs per SM) reached 45 / 22 / 11 % of the
 * copy bandwidth at T = 32768 for bf16 / fp8 / nvfp4 — the same ~21 us for all three dtypes:
 * latency- and issue-bound, not bandwidth-bound.
 *
 * Here K and V go from global memory straight into mma.sync fragments in registers (no shared
 * memory tiles, no block barriers in the loop), and the MMAs are transposed so that the 8 rows
 * are the N = 8 side of m16n8k16 (no padding rows):
 *   S^T (16 keys x 8 rows) = K (16 keys x 256) . Q^T      A = K rows, B = Q (from shared memory)
 *   O^T (256 dims x 8 rows) += V^T (dims x 16 keys) . P^T  A = V^T, B = P^T (movmatrix.trans of
 *                                                        the S^T accumulators, as bf16)
 * A dot product does not care in which order its terms come, so each lane's K loads (16-byte
 * chunks, 4 lanes of a key reading 64 contiguous bytes) are used as A fragments as they are;
 * Q is staged in shared memory in the same permuted dim order. For V^T the 16 m rows of an m
 * tile are a permutation of the head dims chosen so that a lane's V chunk (its 8 / 16 / 32
 * dims of one key) holds all its rows; two keys' words are paired into a fragment register by
 * one prmt. Low-bit caches are decoded in registers: K and V words exactly into bf16 (e4m3, or
 * e2m1 x its e4m3 block scale, as in k_attn), except an FP8 cache's K, which one cvt per pair
 * turns into f16 exactly, multiplied by Q staged in f16 (each row scaled by a power of two into
 * f16's range, the logits scaled back); the per-key K scale multiplies the logits, the
 * per-key V scale is folded into P: p * v_scale as a bf16 pair hi + lo and a second MMA for lo
 * (with P alone in bf16, a single visible key measured 2x the rms error of the naive reference:
 * the scale's own bf16 rounding; k_attn rounds bf16(v * v_scale) per element instead).
 *
 * CTA = 4 warps; a split's keys [t0, t1) go in 16-key steps, warp w taking steps w, w + 4, ...
 * (the 4 warps read 64 consecutive keys at a time). Each warp runs its own online softmax (per
 * lane: rows 2t and 2t + 1, t = lane % 4); the next step's K is loaded while this step's P.V
 * runs, its V while the next S = Q.K runs; the first step's K and V are issued before Q is
 * staged. At the end the 4 warps merge through shared memory in
 * warp order (deterministic) and the CTA writes the split's (m, l, o / l) to the workspace, or
 * o / l as bf16 when there is one split; k_attn_merge combines the splits as for k_attn.
 */
#ifndef NIB_ATTN_DEC_CUH
#define NIB_ATTN_DEC_CUH

#include "ops/cuda/attention.cuh"

namespace nib {

template <int FMT> struct DecFmt {
    static constexpr int CH = FMT == F_BF16 ? 8 : FMT == F_FP8 ? 16 : 32; /* dims per 16-byte chunk */
    static constexpr int WPC = CH / 2;                                    /* bf16x2 words per chunk */
    static constexpr int NKC = 256 / CH / 4;                              /* K chunks per lane per key */
    static constexpr int NVC = 256 / CH / 8;                              /* V chunks per lane per key */
};
constexpr int DEC_NW = 4, DEC_NT = DEC_NW * 32, DEC_TK = DEC_NW * 16; /* keys per CTA round */

__device__ __forceinline__ uint4 ldg_nc16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
    return r;
}
/* bf16x2 factor for an NVFP4 block: bf16(e4m3 scale * 2^118) in both halves (see k_attn) */
__device__ __forceinline__ uint32_t fp4_block_factor(uint32_t e4m3) {
    uint32_t fb = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(e4m3_to_f32(e4m3) * 0x1p118f));
    return fb | (fb << 16);
}
/* FP8 K: the e4m3 pair of half h of w (low byte -> low half) as f16x2, exactly (cvt, one instruction);
 * the S = K Q^T products of an FP8 cache run in f16 (see the Q staging in k_attn_dec) */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w, int h) {
    uint32_t r;
    if (h == 0)
        asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(w));
    else
        asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(r) : "r"(w));
    return r;
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* word u (dims 2u, 2u + 1 of the chunk) of a 16-byte chunk as bf16x2; fb: NVFP4 block factors
 * (block 0 for words 0..7, block 1 for 8..15) */
template <int FMT>
__device__ __forceinline__ uint32_t dec_word(const uint4 &c, int u, uint32_t fb0, uint32_t fb1) {
    if constexpr (FMT == F_BF16) {
        return u4get(c, u);
    } else if constexpr (FMT == F_FP8) {
        return e4m3x2_to_bf16x2(u4get(c, u >> 1), (u & 1) ? 0x3424u : 0x1404u);
    } else {
        const uint32_t w = u4get(c, u >> 2), jj = (uint32_t)(u & 3);
        const uint32_t ev = w & 0x0F0F0F0Fu, od = (w >> 4) & 0x0F0F0F0Fu;
        return bf2_mul(e2m1x2_raw(ev, od, (int)jj), u < 8 ? fb0 : fb1);
    }
}
/* the head dim of K-step ks, lane t, half b (b = 0: k = 2t, 2t+1; b = 1: k = 2t+8, 2t+9) —
 * the first of two consecutive dims. Lane t's K chunk j is chunk 4j + t of the key; a chunk
 * serves WPC / 2 k-steps, words 2h + b. */
template <int FMT> __host__ __device__ __forceinline__ int dec_kdim(int ks, int t, int b) {
    using F = DecFmt<FMT>;
    const int j = ks / (F::WPC / 2), h = ks % (F::WPC / 2);
    return F::CH * (4 * j + t) + 4 * h + 2 * b;
}
/* the head dim of O^T row (m tile mt, row r = g + 8v): lane g's V chunk i is chunk g + 8i; its
 * word u is m tile WPC * i + u, the low half row g, the high half row g + 8 */
template <int FMT> __host__ __device__ constexpr int dec_odim(int mt, int r) {
    using F = DecFmt<FMT>;
    const int i = mt / F::WPC, u = mt % F::WPC, g = r & 7, v = r >> 3;
    return F::CH * (g + 8 * i) + 2 * u + v;
}

/* The warps' O rows meet in shared memory (red_o) as float4 chunks of 4 dims: chunk c of a row
 * at chunk dec_red_chunk(c), rows DEC_RED_LD floats apart. A lane's 16-byte store holds dims d ..
 * d + 3 of one row (m tiles 2k, 2k + 1, both halves); the 8 lanes of a store phase differ in t (the row)
 * and in g, whose dims lie CH apart, so without the swizzle 2-4 of them hit one bank group, and the
 * merge's float4 reads (16 dims apart per thread) 4. The XOR of the chunk's higher bits into its
 * low three, per cache dtype, makes both conflict-free (checked by enumeration over every phase;
 * the 64 scalar stores per lane before it were 8-way conflicts, ~2000 shared-memory wavefronts per
 * CTA). A bijection within each aligned group of 8 chunks. */
constexpr int DEC_RED_LD = 256 + 4; /* floats per red_o row */
template <int FMT> __host__ __device__ constexpr int dec_red_chunk(int c) {
    if constexpr (FMT == F_BF16) return c ^ (((c >> 1) ^ (c >> 2)) & 7);
    else if constexpr (FMT == F_FP8) return c ^ ((c >> 2) & 7);
    else return c ^ ((c >> 3) & 7);
}
/* compile-time proof of the above: the four values of a store are dims d .. d + 3 (d a multiple of
 * 4), the swizzle is a bijection on a row's 64 chunks, and no two lanes of an 8-lane phase of a
 * 16-byte store (or of the merge's reads) hit one bank group (8 per 128 bytes) at different
 * addresses */
template <int FMT> constexpr bool dec_red_layout_ok() {
    bool seen[64] = {};
    for (int c = 0; c < 64; c++) {
        const int q = dec_red_chunk<FMT>(c);
        if (q < 0 || q >= 64 || seen[q]) return false;
        seen[q] = true;
    }
    for (int mt = 0; mt < 16; mt += 2)
        for (int g = 0; g < 8; g++) {
            const int d = dec_odim<FMT>(mt, g);
            if (d % 4 || dec_odim<FMT>(mt, g + 8) != d + 1 || dec_odim<FMT>(mt + 1, g) != d + 2 ||
                dec_odim<FMT>(mt + 1, g + 8) != d + 3)
                return false;
        }
    for (int mt = 0; mt < 16; mt += 2)
        for (int c0 = 0; c0 < 2; c0++)
            for (int ph = 0; ph < 4; ph++)
                for (int l1 = 8 * ph; l1 < 8 * ph + 8; l1++)
                    for (int l2 = l1 + 1; l2 < 8 * ph + 8; l2++) {
                        const int a1 = (2 * (l1 & 3) + c0) * (DEC_RED_LD / 4) + dec_red_chunk<FMT>(dec_odim<FMT>(mt, l1 >> 2) >> 2);
                        const int a2 = (2 * (l2 & 3) + c0) * (DEC_RED_LD / 4) + dec_red_chunk<FMT>(dec_odim<FMT>(mt, l2 >> 2) >> 2);
                        if (a1 != a2 && a1 % 8 == a2 % 8) return false;
                    }
    for (int k = 0; k < 16; k += 4)
        for (int t1 = 0; t1 < 128; t1++)
            for (int t2 = t1 + 1; t2 < (t1 | 7) + 1; t2++) {
                const int a1 = (t1 >> 4) * (DEC_RED_LD / 4) + dec_red_chunk<FMT>(((t1 & 15) * 16 + k) >> 2);
                const int a2 = (t2 >> 4) * (DEC_RED_LD / 4) + dec_red_chunk<FMT>(((t2 & 15) * 16 + k) >> 2);
                if (a1 != a2 && a1 % 8 == a2 % 8) return false;
            }
    return true;
}
static_assert(dec_red_layout_ok<F_BF16>() && dec_red_layout_ok<F_FP8>() && dec_red_layout_ok<F_NVFP4>(),
              "the decode kernel's O exchange layout");

template <int FMT>
__global__ void __launch_bounds__(DEC_NT, 2) k_attn_dec(AttnParams p) {
    NIB_KT(NIB_KT_ATTN_DEC, NIB_KT_ENTRY);
    attn_prefetch_kv(p, DEC_TK); /* a hint before the wait: see there */
    /* p.lens_early: the caller settled the lengths (nib_attn_cache_args.lens_settled): read them before the wait,
     * so that Q's and the first K / V's loads after it need no round trip for them first (the sixty-seventh
     * session's stamps: Q staged 2.3 us after the wait, two dependent round trips) */
    int T = 0, nq_v = 0, nseq_v = 0;
    if (p.lens_early) {
        T = read_len_l2(p.t_valid, p.t_max);
        nq_v = read_len_l2(p.nq_valid, p.nq_max);
        nseq_v = read_len_l2(p.nseq_valid, p.n_seq);
    }
    nib::pdl_enter(); /* runtime/launch.cuh: before any other access (rule 1b above) or return */
    NIB_KT(NIB_KT_ATTN_DEC, NIB_KT_WAITED);
    if (!p.lens_early) {
        T = read_len(p.t_valid, p.t_max);
        nq_v = read_len(p.nq_valid, p.nq_max);
        nseq_v = read_len(p.nseq_valid, p.n_seq);
    }
    NIB_KT_EXIT_GUARD(NIB_KT_ATTN_DEC);
    using F = DecFmt<FMT>;
    constexpr int WPC = F::WPC, NKC = F::NKC, NVC = F::NVC;
    __shared__ __align__(16) uint32_t qf[16][4][8][2];      /* [k-step][t][row g][b] bf16x2 */
    __shared__ __align__(16) float red_o[DEC_NW][8][DEC_RED_LD];
    __shared__ float red_m[DEC_NW][8], red_l[DEC_NW][8];
    __shared__ float qinv_s[8]; /* FP8: 2^-k of each Q row (the f16 staging's scale) */

    const int tid = threadIdx.x, lane = tid & 31, warp = nib::warp_id(), g = lane >> 2, t = lane & 3;
    const int z = blockIdx.z, seq = z / p.n_kv, hkv = z % p.n_kv, split = blockIdx.y;
    const int rows_valid = nq_v * p.group;
    int t0, t1;
    const int n_active = nib_attn_split_range(T, p.n_splits, DEC_TK, split, &t0, &t1);
    if (seq >= nseq_v || split >= n_active) {
        /* With splits, EVERY workspace entry of the grid is written, an idle split's as (m, l, o) =
         * (-inf, 0, 0), so that k_attn_merge<.., true> can load them all before it reads a length
         * (one L2 round trip instead of two; the workspace still needs no initialization) */
        if (p.n_splits > 1) {
            const int r = tid >> 4, d0 = (tid & 15) * 16;
            if (r < p.rows_max) {
                const size_t row = ((size_t)z * p.n_splits + split) * p.rows_max + r;
                float *dst = p.ws_o + row * p.d + d0;
#pragma unroll
                for (int k = 0; k < 16; k += 4) *(float4 *)(dst + k) = make_float4(0.f, 0.f, 0.f, 0.f);
                if (d0 == 0) {
                    p.ws_m[row] = -INFINITY;
                    p.ws_l[row] = 0.f;
                }
            }
        }
        return;
    }

    const uint8_t *const kbase = p.k + seq * p.k_seq + hkv * p.kv_head;
    const uint8_t *const vbase = p.v + seq * p.v_seq + hkv * p.kv_head;
    const int n_steps = (t1 - t0 + 15) / 16;

    /* per lane: K of keys g, g + 8 (NKC chunks each) and their scales; V of keys 2t, 2t+1,
     * 2t+8, 2t+9 (NVC chunks each) and the V scales of keys g, g + 8 (folded into P) */
    uint4 kr[2][NKC], vr[4][NVC];
    /* the scales as loaded (NVFP4: a chunk's two E4M3 block-scale bytes; the per-key scales before
     * the x 256): converted where they are used, a step after their loads were issued. Converted in
     * load_k / load_v, the conversion was the loads' first consumer, so every step stalled twice
     * for a memory round trip (after issuing the next K, and after the next V) */
    uint32_t kbs[2][NKC] = {}, vbs[4] = {};
    float ksc[2] = {1.f, 1.f}, vsc[2] = {1.f, 1.f};
    constexpr float SC = FMT == F_NVFP4 ? 256.0f : 1.0f;
    auto load_k = [&](int step) {
        const int key0 = t0 + 16 * step;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int tok = key0 + g + 8 * e;
            const bool ok = tok < t1;
            const uint8_t *row = kbase + (long long)tok * p.k_tok;
#pragma unroll
            for (int j = 0; j < NKC; j++) kr[e][j] = ok ? ldg_nc16(row + (4 * j + t) * 16) : make_uint4(0, 0, 0, 0);
            if constexpr (FMT != F_BF16) {
                const long long sidx = (long long)tok * p.n_kv + hkv;
                ksc[e] = ok ? __ldg(p.ks + sidx) : 0.f;
                vsc[e] = ok ? __ldg(p.vs + sidx) : 0.f;
                if constexpr (FMT == F_NVFP4) {
                    const uint8_t *bs = p.kb + sidx * 16;
#pragma unroll
                    for (int j = 0; j < NKC; j++) { /* chunk 4j + t: block-scale bytes 2(4j+t), +1 */
                        kbs[e][j] = ok ? (uint32_t)__ldg((const unsigned short *)(bs + 2 * (4 * j + t))) : 0u;
                    }
                }
            }
        }
    };
    auto load_v = [&](int step) {
        const int key0 = t0 + 16 * step;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int tok = key0 + 2 * t + (e & 1) + 8 * (e >> 1);
            const bool ok = tok < t1;
            const uint8_t *row = vbase + (long long)tok * p.v_tok;
#pragma unroll
            for (int i = 0; i < NVC; i++) vr[e][i] = ok ? ldg_nc16(row + (g + 8 * i) * 16) : make_uint4(0, 0, 0, 0);
            if constexpr (FMT == F_NVFP4) { /* NVC = 1: chunk g, block-scale bytes 2g, 2g + 1 */
                const uint8_t *bs = p.vb + ((long long)tok * p.n_kv + hkv) * 16;
                vbs[e] = ok ? (uint32_t)__ldg((const unsigned short *)(bs + 2 * g)) : 0u;
            }
        }
    };

    float oacc[16][4];
#pragma unroll
    for (int m = 0; m < 16; m++)
#pragma unroll
        for (int c = 0; c < 4; c++) oacc[m][c] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f}; /* rows 2t, 2t + 1 */

    /* the warp's first K and V in flight before Q is staged (Q does not gate the loads) */
    if (warp < n_steps) {
        load_k(warp);
        load_v(warp);
    }
    /* Q rows (row r = token r / group, head hkv * group + r % group) in the K-step order: the
     * thread's (b, row, t) are fixed by tid, its k-steps are tid / 64 + 2k */
    {
        static_assert(DEC_NT == 128, "the Q staging below assumes 128 threads");
        const int b = tid & 1, r = (tid >> 1) & 7, tq = (tid >> 4) & 3, ks0 = tid >> 6;
        const __nv_bfloat16 *q = r < rows_valid ? p.q + seq * p.q_seq + (long long)(r / p.group) * p.q_tok +
                                                      (long long)(hkv * p.group + r % p.group) * p.d
                                                : nullptr;
        if constexpr (FMT == F_FP8) {
            /* FP8 cache: Q in f16 for the f16 S products (K decodes to f16 in one instruction). Each row
             * is scaled by 2^k so that its largest |q| lies in [2^14, 2^15): a bf16 value converts
             * exactly unless it is below 2^-31 of that largest one (then within 2^-39 of it); the
             * logits are scaled back by 2^-k (exact). The row's 16 threads: lanes ^1, ^16, 4 warps. */
            uint32_t qw[8];
            float amax = 0.f;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                qw[k] = q ? *(const uint32_t *)(q + dec_kdim<FMT>(ks0 + 2 * k, tq, b)) : 0u;
                amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(qw[k] << 16)), fabsf(__uint_as_float(qw[k] & 0xFFFF0000u))));
            }
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 16));
            if ((lane & 17) == 0) red_m[warp][r] = amax;
            __syncthreads();
            amax = fmaxf(fmaxf(red_m[0][r], red_m[1][r]), fmaxf(red_m[2][r], red_m[3][r]));
            int e = 0;
            frexpf(amax, &e); /* amax < 2^e (e = 0 for 0; NaN / Inf: clamped below) */
            const int k2 = min(max(15 - e, -120), 120);
            const float sc = ldexpf(1.f, k2);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const __half2 h = __floats2half2_rn(__uint_as_float(qw[k] << 16) * sc, __uint_as_float(qw[k] & 0xFFFF0000u) * sc);
                qf[ks0 + 2 * k][tq][r][b] = *(const uint32_t *)&h;
            }
            if ((tid & 0x71) == 0) qinv_s[r] = ldexpf(1.f, -k2); /* one thread per row: tq = 0, b = 0, ks0 = 0 */
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int ks = ks0 + 2 * k;
                qf[ks][tq][r][b] = q ? *(const uint32_t *)(q + dec_kdim<FMT>(ks, tq, b)) : 0u;
            }
        }
    }
    __syncthreads();
    NIB_KT(NIB_KT_ATTN_DEC, NIB_KT_MARK1); /* Q staged (the first K / V in flight) */

    /* logits to log2 units (FP8: also undo the Q rows' 2^k) for rows 2t, 2t + 1 */
    float lsc[2] = {LOG2E_F, LOG2E_F};
    if constexpr (FMT == F_FP8) lsc[0] = qinv_s[2 * t] * LOG2E_F, lsc[1] = qinv_s[2 * t + 1] * LOG2E_F;
#pragma unroll 1
    for (int step = warp; step < n_steps; step += DEC_NW) {
        /* S^T = K Q^T: two accumulator chains (even / odd k-steps) */
        float s[4] = {0.f, 0.f, 0.f, 0.f}, s2[4] = {0.f, 0.f, 0.f, 0.f};
        uint32_t kfb[2][NKC][2] = {};
        if constexpr (FMT == F_NVFP4) {
#pragma unroll
            for (int e = 0; e < 2; e++)
#pragma unroll
                for (int j = 0; j < NKC; j++) {
                    kfb[e][j][0] = fp4_block_factor(kbs[e][j] & 0xFFu);
                    kfb[e][j][1] = fp4_block_factor(kbs[e][j] >> 8);
                }
        }
#pragma unroll
        for (int ks = 0; ks < 16; ks++) {
            const int j = ks / (WPC / 2), h = ks % (WPC / 2);
            uint32_t a[4];
            const uint2 qb = *(const uint2 *)&qf[ks][t][g][0];
            if constexpr (FMT == F_FP8) { /* words 2h, 2h + 1: halves 0 and 1 of 32-bit word h */
                a[0] = e4m3x2_to_f16x2(u4get(kr[0][j], h), 0);
                a[1] = e4m3x2_to_f16x2(u4get(kr[1][j], h), 0);
                a[2] = e4m3x2_to_f16x2(u4get(kr[0][j], h), 1);
                a[3] = e4m3x2_to_f16x2(u4get(kr[1][j], h), 1);
                mma_f16(ks & 1 ? s2 : s, a, qb.x, qb.y);
            } else {
                a[0] = dec_word<FMT>(kr[0][j], 2 * h, kfb[0][j][0], kfb[0][j][1]);
                a[1] = dec_word<FMT>(kr[1][j], 2 * h, kfb[1][j][0], kfb[1][j][1]);
                a[2] = dec_word<FMT>(kr[0][j], 2 * h + 1, kfb[0][j][0], kfb[0][j][1]);
                a[3] = dec_word<FMT>(kr[1][j], 2 * h + 1, kfb[1][j][0], kfb[1][j][1]);
                mma_bf16(ks & 1 ? s2 : s, a, qb.x, qb.y);
            }
        }
        float sk[2] = {ksc[0] * SC, ksc[1] * SC}, sv[2] = {vsc[0] * SC, vsc[1] * SC};
        if (step + DEC_NW < n_steps) load_k(step + DEC_NW); /* kr, ksc, vsc are free now */
        /* logits in log2 units; keys past t1 -> -inf */
        const int key0 = t0 + 16 * step;
        float x[4];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int e = c >> 1; /* key g + 8e */
            float v = s[c] + s2[c];
            if constexpr (FMT != F_BF16) v *= sk[e];
            x[c] = key0 + g + 8 * e < t1 ? v * lsc[c & 1] : -INFINITY;
        }
        float mx[2] = {fmaxf(x[0], x[2]), fmaxf(x[1], x[3])}, alpha[2], mu[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], off));
            const float mn = fmaxf(mrow[i], mx[i]);
            mu[i] = mn == -INFINITY ? 0.f : mn;
            alpha[i] = exp2f(mrow[i] - mu[i]);
            mrow[i] = mn;
            lrow[i] *= alpha[i];
        }
        float pr[4];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            pr[c] = exp2f(x[c] - mu[c & 1]);
            lrow[c & 1] += pr[c];
        }
        /* P^T fragments: keys 2t, 2t+1 (pb0) and 2t+8, 2t+9 (pb1) of row g. Low-bit: P times
         * the per-key V scale, as a bf16 pair hi + lo (hi = bf16(x), lo = bf16(x - hi): x to
         * ~2^-17), so the scale costs no precision: a second MMA per m tile for lo */
        uint32_t pb0, pb1, pl0 = 0, pl1 = 0;
        if constexpr (FMT == F_BF16) {
            pb0 = movmatrix_trans(pack_bf16(pr[0], pr[1]));
            pb1 = movmatrix_trans(pack_bf16(pr[2], pr[3]));
        } else {
            const float y0 = pr[0] * sv[0], y1 = pr[1] * sv[0], y2 = pr[2] * sv[1], y3 = pr[3] * sv[1];
            const uint32_t h01 = pack_bf16(y0, y1), h23 = pack_bf16(y2, y3);
            const uint32_t l01 = pack_bf16(y0 - __uint_as_float(h01 << 16), y1 - __uint_as_float(h01 & 0xFFFF0000u));
            const uint32_t l23 = pack_bf16(y2 - __uint_as_float(h23 << 16), y3 - __uint_as_float(h23 & 0xFFFF0000u));
            pb0 = movmatrix_trans(h01);
            pb1 = movmatrix_trans(h23);
            pl0 = movmatrix_trans(l01);
            pl1 = movmatrix_trans(l23);
        }
        /* O^T += V^T P^T */
        uint32_t vfb[4][2] = {};
        if constexpr (FMT == F_NVFP4) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                vfb[e][0] = fp4_block_factor(vbs[e] & 0xFFu);
                vfb[e][1] = fp4_block_factor(vbs[e] >> 8);
            }
        }
#pragma unroll
        for (int mt = 0; mt < 16; mt++) {
            const int i = mt / WPC, u = mt % WPC;
            oacc[mt][0] *= alpha[0];
            oacc[mt][1] *= alpha[1];
            oacc[mt][2] *= alpha[0];
            oacc[mt][3] *= alpha[1];
            const uint32_t wa = dec_word<FMT>(vr[0][i], u, vfb[0][0], vfb[0][1]);
            const uint32_t wb = dec_word<FMT>(vr[1][i], u, vfb[1][0], vfb[1][1]);
            const uint32_t wc = dec_word<FMT>(vr[2][i], u, vfb[2][0], vfb[2][1]);
            const uint32_t wd = dec_word<FMT>(vr[3][i], u, vfb[3][0], vfb[3][1]);
            uint32_t a[4];
            a[0] = prmt(wa, wb, 0x5410u); /* row g (low halves), keys 2t, 2t+1 */
            a[1] = prmt(wa, wb, 0x7632u); /* row g + 8 (high halves) */
            a[2] = prmt(wc, wd, 0x5410u); /* keys 2t+8, 2t+9 */
            a[3] = prmt(wc, wd, 0x7632u);
            mma_bf16(oacc[mt], a, pb0, pb1);
            if constexpr (FMT != F_BF16) mma_bf16(oacc[mt], a, pl0, pl1);
        }
        if (step + DEC_NW < n_steps) load_v(step + DEC_NW); /* vr is free now */
    }

    NIB_KT(NIB_KT_ATTN_DEC, NIB_KT_MARK2); /* warp 0's keys done */
    /* row sums over the 8 key lanes g */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], off);
    /* warps -> shared memory: O^T accumulator (mt, row g + 8v, cols 2t + c) = o[row 2t + c][dim]; m tiles
     * 2k and 2k + 1, halves v = 0, 1 are dims d .. d + 3 of row 2t + c0 (d = dec_odim(2k, g)) */
#pragma unroll
    for (int mt = 0; mt < 16; mt += 2)
#pragma unroll
        for (int c0 = 0; c0 < 2; c0++) {
            const int d = dec_odim<FMT>(mt, g);
            *(float4 *)&red_o[warp][2 * t + c0][4 * dec_red_chunk<FMT>(d >> 2)] =
                make_float4(oacc[mt][c0], oacc[mt][c0 + 2], oacc[mt + 1][c0], oacc[mt + 1][c0 + 2]);
        }
    if (g == 0) {
        red_m[warp][2 * t] = mrow[0], red_m[warp][2 * t + 1] = mrow[1];
        red_l[warp][2 * t] = lrow[0], red_l[warp][2 * t + 1] = lrow[1];
    }
    __syncthreads();
    NIB_KT(NIB_KT_ATTN_DEC, NIB_KT_MARK3); /* every warp's partial O in shared memory */
    /* thread -> row r = tid / 16, dims 16 (tid % 16) .. + 15 */
    const int r = tid >> 4, d0 = (tid & 15) * 16;
    if (r >= (p.n_splits > 1 ? p.rows_max : rows_valid)) return; /* with splits every row: see the top */
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < DEC_NW; w++) M = fmaxf(M, red_m[w][r]);
    const float mu = M == -INFINITY ? 0.f : M;
    float f[DEC_NW], L = 0.f;
#pragma unroll
    for (int w = 0; w < DEC_NW; w++) {
        f[w] = exp2f(red_m[w][r] - mu);
        L += f[w] * red_l[w][r];
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    float o[16];
#pragma unroll
    for (int k = 0; k < 16; k += 4) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < DEC_NW; w++) {
            const float4 v = *(const float4 *)&red_o[w][r][4 * dec_red_chunk<FMT>((d0 + k) >> 2)];
            acc.x += f[w] * v.x, acc.y += f[w] * v.y, acc.z += f[w] * v.z, acc.w += f[w] * v.w;
        }
        o[k] = acc.x * inv, o[k + 1] = acc.y * inv, o[k + 2] = acc.z * inv, o[k + 3] = acc.w * inv;
    }
    if (p.n_splits == 1) {
        __nv_bfloat16 *dst = p.o + seq * p.o_seq + (long long)(r / p.group) * p.o_tok +
                             (long long)(hkv * p.group + r % p.group) * p.d + d0;
#pragma unroll
        for (int k = 0; k < 16; k += 8)
            *(uint4 *)(dst + k) = make_uint4(pack_bf16(o[k], o[k + 1]), pack_bf16(o[k + 2], o[k + 3]),
                                             pack_bf16(o[k + 4], o[k + 5]), pack_bf16(o[k + 6], o[k + 7]));
    } else {
        const size_t row = ((size_t)z * p.n_splits + split) * p.rows_max + r;
        float *dst = p.ws_o + row * p.d + d0;
#pragma unroll
        for (int k = 0; k < 16; k += 4) *(float4 *)(dst + k) = make_float4(o[k], o[k + 1], o[k + 2], o[k + 3]);
        if (d0 == 0) {
            p.ws_m[row] = M;
            p.ws_l[row] = L;
        }
    }
}

} // namespace nib

#endif
