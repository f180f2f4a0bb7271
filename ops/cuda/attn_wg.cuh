/* attn_wg.cuh — the warpgroup-MMA attention kernel ("wg"): bf16 Q/K/V, head_dim <= 256 (padded to
 * 256), 128 query rows per CTA, 64-key tiles. Included by ops/cuda/attention.cu (which plans and
 * launches it like the other variants: same parameters, same split workspace, same merge).
 *
 * Why: the mma.sync kernels (r8 / r4) read the whole K and V tile from shared memory once per
 * 16-row warp (8 x 64 KB per 64-key tile at head_dim 256), so a tile costs what those reads cost
 * (~4 us per tile on H100: docs/design.md "The Gemma prefix attention is bound by shared-memory
 * reads"). wgmma reads its shared-memory B operand once per 64-row warpgroup.
 *
 * CTA: two warpgroups (256 threads), warpgroup w owns query rows 64 w .. 64 w + 63; all 256
 * threads copy (cp.async, 16-byte chunks) Q once and the K / V tiles into a 2-stage ring, in the
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
 * Where a tile's ~3 us go (against ~1.1 us of tensor work per CTA) is not yet profiled.
 */
#ifndef NIB_ATTN_WG_CUH
#define NIB_ATTN_WG_CUH

#include "ops/cuda/attention.cuh"
#include "ops/cuda/wgmma.cuh"

namespace nib {

template <int WGS> struct WgCfg { /* WGS warpgroups of 64 query rows per CTA */
    static constexpr int NT = 128 * WGS, ROWS = 64 * WGS, TK = 64, DP = 256, RSTEP = NT / 32;
    static constexpr int KST = 2, VST = 2;                 /* K and V ring stages */
    static constexpr int ATOM = 128;                       /* bytes per row of one 64-column atom */
    static constexpr int Q_WG_BYTES = 64 * DP * 2;         /* one warpgroup's 64 rows: 32 KB */
    static constexpr int KV_BYTES = TK * DP * 2;           /* one K (or V) tile: 32 KB */
    static constexpr int SMEM = 1024 /* alignment slack */ + WGS * Q_WG_BYTES + (KST + VST) * KV_BYTES;
};

/* byte offset of 16-byte chunk c (0..31: 8 dims each) of row r in an operand of `rows` rows */
__device__ __forceinline__ uint32_t wg_chunk_off(int r, int c, int rows) {
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + ((((c & 7) ^ (r & 7))) << 4));
}

template <int WGS>
__global__ void __launch_bounds__(WgCfg<WGS>::NT, 1) k_attn_wg(AttnParams p) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    using C = WgCfg<WGS>;
    constexpr int TK = C::TK;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* the swizzle is applied to address bits 4..9: operands start on 1024-byte boundaries */
    unsigned char *const smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t sq = smem_u32(smem), sk = sq + WGS * C::Q_WG_BYTES, sv = sk + C::KST * C::KV_BYTES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int z = blockIdx.z, seq = z / p.n_kv, hkv = z % p.n_kv;
    const int split = blockIdx.y, row0 = blockIdx.x * C::ROWS;

    /* CTA-uniform early exits, before any async copy (as k_attn) */
    if (seq >= read_len(p.nseq_valid, p.n_seq)) return;
    const int T = read_len(p.t_valid, p.t_max);
    const int rows_valid = read_len(p.nq_valid, p.nq_max) * p.group;
    if (row0 >= rows_valid) return;
    int t0, t1;
    if (split >= nib_attn_split_range(T, p.n_splits, TK, split, &t0, &t1)) return;
    const int n_tiles = (t1 - t0 + TK - 1) / TK;

    const int c = tid & 31, r8 = tid >> 5; /* this thread's chunk column; its first row (< RSTEP) */
    const int cmax = (p.d + 7) / 8;        /* chunks past head_dim are zero-filled */
    const bool cok = c < cmax;

    /* Q rows -> smem (zero rows past the valid rows): warpgroup w's rows in its own operand */
    {
        const __nv_bfloat16 *qb = p.q + seq * p.q_seq + (long long)hkv * p.group * p.d + c * 8;
        for (int r = r8; r < C::ROWS; r += C::RSTEP) {
            const int row = row0 + r;
            const bool ok = cok && row < rows_valid;
            const int tq = row / p.group, hq = row - tq * p.group;
            const __nv_bfloat16 *src = ok ? qb + (long long)tq * p.q_tok + (long long)hq * p.d : p.q;
            cp_async16(sq + (r >> 6) * C::Q_WG_BYTES + wg_chunk_off(r & 63, c, 64), src, ok ? 16 : 0);
        }
    }
    const uint8_t *const kbase = p.k + seq * p.k_seq + hkv * p.kv_head + c * 16;
    const uint8_t *const vbase = p.v + seq * p.v_seq + hkv * p.kv_head + c * 16;
    /* one K/V tile (keys t0 + it * TK ...) -> stage; keys >= t1 are zero-filled */
    auto load_tile = [&](int it) {
        const int tt0 = t0 + it * TK;
        const uint32_t dk = sk + (it % C::KST) * C::KV_BYTES, dv = sv + (it % C::VST) * C::KV_BYTES;
        const uint8_t *ks = kbase + (long long)(tt0 + r8) * p.k_tok;
        const uint8_t *vs = vbase + (long long)(tt0 + r8) * p.v_tok;
#pragma unroll 4
        for (int j = r8; j < TK; j += C::RSTEP) {
            const bool ok = cok && tt0 + j < t1;
            const uint32_t off = wg_chunk_off(j, c, TK);
            cp_async16(dk + off, ok ? (const void *)ks : (const void *)p.k, ok ? 16 : 0);
            cp_async16(dv + off, ok ? (const void *)vs : (const void *)p.v, ok ? 16 : 0);
            ks += C::RSTEP * p.k_tok;
            vs += C::RSTEP * p.v_tok;
        }
    };
    if (n_tiles > 0) load_tile(0);
    cp_async_commit(); /* group 0: Q and tile 0 */

    /* per-thread state: rows g (i = 0) and g + 8 (i = 1) of the warp's 16 */
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const bool wg_active = row0 + wg * 64 < rows_valid; /* uniform per warpgroup */
    const int t2 = 2 * (lane & 3), g = lane >> 2;
    const uint32_t q_wg = sq + wg * C::Q_WG_BYTES;
    uint32_t a[4][4]; /* bf16 P of the last tile: the A fragments of O += P V */
    auto pv = [&](int it) {
        const uint32_t vt = sv + (it % C::VST) * C::KV_BYTES;
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            WgmmaBf16RS<256>::mma(o, a[kk], wgmma_desc_sw128_mn(vt + kk * 16 * C::ATOM, TK * C::ATOM, 8 * C::ATOM));
    };

#pragma unroll 1
    for (int it = 0; it < n_tiles; it++) {
        cp_async_wait_all();      /* this thread's copies of tile it (and Q) landed */
        fence_proxy_async_smem(); /* ... and are visible to wgmma's async proxy */
        __syncthreads();          /* every thread's; and both warpgroups are done with tile it - 1 */
        if (it + 1 < n_tiles) load_tile(it + 1);
        cp_async_commit();
        if (!wg_active) continue;
        const uint32_t kt = sk + (it % C::KST) * C::KV_BYTES;

        /* S = Q K^T: 64 rows x 64 keys, 16 k-steps of 16 dims (4 per 128-byte atom) */
        float s[32];
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] = 0.f;
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 16; ks++) {
            const uint32_t at = (ks >> 2) * (64 * C::ATOM) + (ks & 3) * 32;
            const uint32_t bt = (ks >> 2) * (TK * C::ATOM) + (ks & 3) * 32;
            WgmmaBf16SS<64>::mma(s, wgmma_desc_sw128(q_wg + at), wgmma_desc_sw128(kt + bt));
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(s); /* S is read below: not before the wait */

        /* scale to log2 units, mask keys past the split end, online softmax (as k_attn) */
        const int key_t0 = t0 + it * TK;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int kl = j * 8 + t2 + (q & 1);
                const float x = key_t0 + kl < t1 ? s[4 * j + q] * p.lscale : -INFINITY;
                s[4 * j + q] = x;
                mx[q >> 1] = fmaxf(mx[q >> 1], x);
            }
        float alpha[2], mu[2];
        softmax_fold(mx, mrow, lrow, alpha, mu);
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const float pr = exp2f(s[i] - mu[(i >> 1) & 1]);
            lrow[(i >> 1) & 1] += pr;
            s[i] = pr;
        }
#pragma unroll
        for (int j = 0; j < 32; j++) {
            o[4 * j] *= alpha[0];
            o[4 * j + 1] *= alpha[0];
            o[4 * j + 2] *= alpha[1];
            o[4 * j + 3] *= alpha[1];
        }
        /* O += bf16(P) V: k-step kk = keys 16 kk .. 16 kk + 15 = S n-tiles 2 kk, 2 kk + 1 */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
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
    if (!wg_active) return;

    /* full row sums (the 4 lanes of a quad hold different keys) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 1);
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 2);
    }
    const size_t part0 = ((size_t)z * p.n_splits + split) * p.rows_max; /* workspace row 0 of this split */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = row0 + wg * 64 + (warp & 3) * 16 + g + 8 * i;
        if (row >= rows_valid) continue;
        const float inv = lrow[i] > 0.f ? 1.f / lrow[i] : 0.f;
        if (p.n_splits == 1) {
            __nv_bfloat16 *dst = p.o + seq * p.o_seq + (long long)(row / p.group) * p.o_tok +
                                 (long long)(hkv * p.group + row % p.group) * p.d;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const int dim = 8 * j + t2;
                if (dim < p.d) *(uint32_t *)(dst + dim) = pack_bf16(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
            }
        } else {
            float *dst = p.ws_o + (part0 + row) * p.d;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const int dim = 8 * j + t2;
                if (dim < p.d) *(float2 *)(dst + dim) = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
            }
            if (t2 == 0) {
                p.ws_m[part0 + row] = mrow[i];
                p.ws_l[part0 + row] = lrow[i];
            }
        }
    }
}

} // namespace nib

#endif
