/* attn_wgs.cuh — the warpgroup-MMA attention for head_dim <= 80 ("d80wg": SigLIP's 16 heads x 72), LAB VARIANTS
 * (NIB_ATTN_D80=wgs / wgs1 / wgs2 / wgs4): correct, and slower inside Pi0.5 than the mma.sync kernel d80t4 they
 * were written to replace (H100, fast, 2 cameras: vision 1.653 / 1.593 / 1.579 / 1.614 against 1.544 ms;
 * docs/design.md, "Forty-seventh session"). bf16 Q/K/V,
 * 64 query rows per CTA of one warpgroup (128 threads), every key of the CTA's split (at most 256) in one
 * tile, so the softmax is taken once over whole rows (no running maximum, no O rescale). Included by
 * ops/cuda/attention.cu, which plans and launches it like the other variants (same parameters, split
 * workspace and merge; the planner's splits are 256-key tiles, so SigLIP's 256-token images never split).
 *
 * Why: the mma.sync kernel it replaces (d80t4: 16 warps, four token groups of 64 keys merged in shared
 * memory) spends its ~9 us issuing instructions: Nsight Compute inside the model (scripts/attn-model-prof.sh,
 * forty-seventh session) had HMMA at 5.5 % of 2.99 M warp instructions, integer address and loop work
 * (IMAD / ISETP / IADD3 / VIADD) at 31 %, and a sixth of the stall samples on the one cp.async wait. wgmma
 * takes S = Q K^T for 64 rows x 256 keys in 5 instructions and O = P V in 16, from shared memory read once
 * per warpgroup.
 *
 * Shared memory, no swizzle ("interleaved" core matrices of 8 rows x 16 bytes, 128 contiguous bytes): an
 * operand of R rows x 80 dims is 10 chunk columns of R x 16 bytes, row r's chunk c (dims 8c .. 8c + 7) at
 * byte c * R * 16 + r * 16. Q (64 rows) and K (256 keys) are K-major operands of S: a k-step of 16 dims is
 * chunk columns 2s and 2s + 1 (leading byte offset R * 16, the next column along K; stride byte offset
 * 128, the next 8 rows). V (256 keys x 80 dims) is the MN-major B operand of P V (imm-trans-b): a core
 * matrix is 8 keys x 8 dims, the next 8 dims a column (R * 16 bytes) away, the next 8 keys 128 bytes away.
 * All three are copied with 16-byte cp.async, one row per thread and chunk (a warp writes 512 contiguous
 * bytes); chunks past head_dim and keys past the split's end are zero-filled (0 x a NaN in P V is not 0).
 *   S = Q K^T     5 x wgmma m64n256k16 (fp32, 128 registers; the accumulator layout of wgmma.cuh)
 *   softmax       x = S * lscale (log2 units), keys past the end -> -inf, m = row max, P = 2^(x - m),
 *                 l = sum P (fp32; P rounded to bf16 for the product, as the other kernels)
 *   O = P V       16 x wgmma m64n80k16, P from registers (the m16n8k16 A fragment S's layout gives)
 * The epilogue writes o = O / l (bf16) or, split, (m, l, O / l) to the workspace exactly as k_attn.
 */
#ifndef NIB_ATTN_WGS_CUH
#define NIB_ATTN_WGS_CUH

#include "ops/cuda/attention.cuh"
#include "ops/cuda/wgmma.cuh"

namespace nib {

/* KS warpgroups per CTA (1, 2 or 4): all share the CTA's 64 query rows; warpgroup w takes keys w * TKW ..
 * (w + 1) * TKW - 1 of the split (TKW = 256 / KS), and the KS partial (m, l, O) are combined through shared
 * memory at the end (each warpgroup combines and stores the dims of the n8 blocks j with j % KS == w) */
template <int KS = 1> struct WgsCfg {
    static_assert(KS == 1 || KS == 2 || KS == 4, "d80wg: 1, 2 or 4 key parts");
    static constexpr int NT = 128 * KS, ROWS = 64, TK = 256, TKW = TK / KS, DP = 80, NC = DP / 8; /* NC chunk columns */
    static constexpr int Q_BYTES = ROWS * DP * 2, KV_BYTES = TK * DP * 2;
    static constexpr int PO_BYTES = KS > 1 ? KS * NC * 128 * 16 : 0;  /* the partial O, float4 [w][j][thread] */
    static constexpr int ML_OFF = Q_BYTES + 2 * KV_BYTES > PO_BYTES ? Q_BYTES + 2 * KV_BYTES : PO_BYTES;
    static constexpr int ML_BYTES = KS > 1 ? 2 * KS * ROWS * 4 : 0; /* m [w][row], then l [w][row] */
    static constexpr int SMEM = 128 /* alignment slack */ + ML_OFF + ML_BYTES;
};

/* descriptor of a no-swizzle ("interleaved") operand at saddr: lbo / sbo in bytes (see the kernel) */
__device__ __forceinline__ uint64_t wgmma_desc_nosw(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32); /* layout type 0: no swizzle */
}

template <int KS>
__global__ void __launch_bounds__(WgsCfg<KS>::NT, 1) k_attn_wgs(const __grid_constant__ AttnParams p) {
    attn_prefetch_kv(p, WgsCfg<KS>::TK); /* a hint before the wait (cache path only; a no-op here) */
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any other access or return */
    using C = WgsCfg<KS>;
    constexpr int TKW = C::TKW, NJ = TKW / 8; /* keys and S n8-blocks per warpgroup */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *const smem = (unsigned char *)(((uintptr_t)smem_raw + 127) & ~(uintptr_t)127);
    const int tid = threadIdx.x, lane = tid & 31, warp = nib::warp_id(), kw = warp >> 2, wt = tid & 127;
    const uint32_t sq = smem_u32(smem), sk = sq + C::Q_BYTES, sv = sk + C::KV_BYTES;

    const int z = blockIdx.z, seq = z / p.n_kv, hkv = z % p.n_kv;
    const int split = blockIdx.y, row0 = blockIdx.x * C::ROWS;
    /* CTA-uniform early exits, before any async copy (as k_attn) */
    if (seq >= read_len(p.nseq_valid, p.n_seq)) return;
    const int T = read_len(p.t_valid, p.t_max);
    const int rows_valid = read_len(p.nq_valid, p.nq_max) * p.group;
    if (row0 >= rows_valid) return;
    int t0, t1;
    if (split >= nib_attn_split_range(T, p.n_splits, C::TK, split, &t0, &t1)) return;
    const int cmax = (p.d + 7) / 8; /* chunks past head_dim are zero-filled */

    /* Q: thread tid copies row tid & 63, chunk columns tid / 64, + NT / 64, .. (a warp: 32 rows of one column) */
    {
        const int r = tid & 63, row = row0 + r;
        const bool rok = row < rows_valid;
        const __nv_bfloat16 *src =
            p.q + seq * p.q_seq + (long long)(row / p.group) * p.q_tok + (long long)(hkv * p.group + row % p.group) * p.d;
#pragma unroll
        for (int c = tid >> 6; c < C::NC; c += C::NT / 64) {
            const bool ok = rok && c < cmax;
            cp_async16(sq + (uint32_t)(c * C::ROWS + r) * 16, ok ? (const void *)(src + c * 8) : (const void *)p.q, ok ? 16 : 0);
        }
    }
    /* K, V: thread tid copies key t0 + j0 (and, with 128 threads, t0 + j0 + 128), chunk columns c0, c0 + CS, ..
     * (512 threads: two threads per key) */
    {
        constexpr int JS = C::NT < C::TK ? C::TK / C::NT : 1, CS = C::NT > C::TK ? C::NT / C::TK : 1;
        const int j0 = C::NT > C::TK ? tid % C::TK : tid, c0 = C::NT > C::TK ? tid / C::TK : 0;
        const uint8_t *const kb = p.k + seq * p.k_seq + hkv * p.kv_head, *const vb = p.v + seq * p.v_seq + hkv * p.kv_head;
#pragma unroll
        for (int h = 0; h < JS; h++) {
            const int j = j0 + C::NT * h, t = t0 + j;
            const bool tok = t < t1;
            const uint8_t *ks = kb + (long long)t * p.k_tok, *vs = vb + (long long)t * p.v_tok;
#pragma unroll
            for (int c = c0; c < C::NC; c += CS) {
                const bool ok = tok && c < cmax;
                const uint32_t off = (uint32_t)(c * C::TK + j) * 16;
                cp_async16(sk + off, ok ? (const void *)(ks + c * 16) : (const void *)p.k, ok ? 16 : 0);
                cp_async16(sv + off, ok ? (const void *)(vs + c * 16) : (const void *)p.v, ok ? 16 : 0);
            }
        }
    }
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async_smem(); /* this thread's copies are visible to wgmma's async proxy */
    __syncthreads();          /* ... and every thread's */

    /* descriptors: K-major Q / K, leading offset = the next chunk column (along K), stride offset = the next
     * 8 rows; MN-major V, leading offset = the next 8 keys (along K), stride offset = the next chunk column
     * (along N). The other three assignments were checked wrong on H100 (the SigLIP tests fail). Warpgroup
     * kw's keys start kw * TKW rows into K and V. */
    const uint32_t q_lbo = C::ROWS * 16, k_lbo = C::TK * 16;
    const uint64_t dq = wgmma_desc_nosw(sq, q_lbo, 128), dk = wgmma_desc_nosw(sk + kw * TKW * 16, k_lbo, 128);
    const uint64_t dv = wgmma_desc_nosw(sv + kw * TKW * 16, 128, k_lbo);

    /* S = Q K^T over 80 dims: k-step s = chunk columns 2s, 2s + 1 */
    float s[TKW / 2];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < C::DP / 16; ks++)
        WgmmaBf16SS<TKW>::mma_sd(s, wgmma_desc_at(dq, 2 * ks * q_lbo), wgmma_desc_at(dk, 2 * ks * k_lbo), ks);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(s);

    /* rows g (i = 0) and g + 8 (i = 1) of the warp's 16; register 4 j + q holds key kw TKW + 8 j + t2 + (q & 1) */
    const int t2 = 2 * (lane & 3), g = lane >> 2, nk = t1 - t0 - kw * TKW;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float x = 8 * j + t2 + (q & 1) < nk ? s[4 * j + q] * p.lscale : -INFINITY;
            s[4 * j + q] = x;
            mx[q >> 1] = fmaxf(mx[q >> 1], x);
        }
    float lrow[2] = {0.f, 0.f}, mu[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        mu[i] = mx[i] == -INFINITY ? 0.f : mx[i]; /* no key: x = -inf, P = 0 */
    }
    uint32_t a[TKW / 16][4]; /* bf16 P: the A fragments of O = P V, k-step kk = keys 16 kk .. 16 kk + 15 */
#pragma unroll
    for (int kk = 0; kk < TKW / 16; kk++) {
        float pr[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            pr[e] = exp2f(s[8 * kk + e] - mu[(e >> 1) & 1]);
            lrow[(e >> 1) & 1] += pr[e];
        }
        a[kk][0] = pack_bf16(pr[0], pr[1]);
        a[kk][1] = pack_bf16(pr[2], pr[3]);
        a[kk][2] = pack_bf16(pr[4], pr[5]);
        a[kk][3] = pack_bf16(pr[6], pr[7]);
    }
    float o[C::DP / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < TKW / 16; kk++) WgmmaBf16RS<C::DP>::mma_sd(o, a[kk], wgmma_desc_at(dv, kk * 16 * 16), kk);
    wgmma_commit();
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 1);
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 2);
    }
    wgmma_wait<0>();
    wgmma_fence_operand(o);

    if constexpr (KS > 1) {
        /* combine the KS parts: M = max m_w, a_w = 2^(m_w - M) (0 for a part without keys), L = sum l_w a_w,
         * O = sum O_w a_w. Every part's O goes to shared memory (float4 j of thread wt at [w][j][wt], over Q / K
         * / V, whose wgmma reads are done once every warpgroup passes the barrier), (m, l) after it; then
         * warpgroup kw combines and stores the n8 blocks j with j % KS == kw, reading the float4 of the same
         * thread position in each part (the same rows and dims: conflict-free). j runs over all blocks with a
         * predicate, so o[] stays in registers. */
        float *const po = (float *)smem, *const pm = (float *)(smem + C::ML_OFF), *const pl = pm + KS * C::ROWS;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < C::NC; j++)
            if (j % KS != kw)
                *(float4 *)(po + ((kw * C::NC + j) * 128 + wt) * 4) = make_float4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
        if (t2 == 0)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int rl = (warp & 3) * 16 + g + 8 * i;
                pm[kw * C::ROWS + rl] = mx[i];
                pl[kw * C::ROWS + rl] = lrow[i];
            }
        __syncthreads();
        float aw[KS][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int rl = (warp & 3) * 16 + g + 8 * i;
            float mm = -INFINITY;
#pragma unroll
            for (int w = 0; w < KS; w++) mm = fmaxf(mm, pm[w * C::ROWS + rl]);
            float L = 0.f;
#pragma unroll
            for (int w = 0; w < KS; w++) {
                const float mw = pm[w * C::ROWS + rl];
                aw[w][i] = mw == -INFINITY ? 0.f : exp2f(mw - mm);
                L += pl[w * C::ROWS + rl] * aw[w][i];
            }
            lrow[i] = L;
            mx[i] = mm;
        }
#pragma unroll
        for (int j = 0; j < C::NC; j++)
            if (j % KS == kw) {
                float own0 = 0.f, own1 = 0.f;
#pragma unroll
                for (int w = 0; w < KS; w++)
                    if (w == kw) own0 = aw[w][0], own1 = aw[w][1];
                o[4 * j] *= own0;
                o[4 * j + 1] *= own0;
                o[4 * j + 2] *= own1;
                o[4 * j + 3] *= own1;
#pragma unroll
                for (int w = 0; w < KS; w++)
                    if (w != kw) {
                        const float4 v = *(const float4 *)(po + ((w * C::NC + j) * 128 + wt) * 4);
                        o[4 * j] += v.x * aw[w][0];
                        o[4 * j + 1] += v.y * aw[w][0];
                        o[4 * j + 2] += v.z * aw[w][1];
                        o[4 * j + 3] += v.w * aw[w][1];
                    }
            }
    }

    const size_t part0 = ((size_t)z * p.n_splits + split) * p.rows_max; /* workspace row 0 of this split */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = row0 + (warp & 3) * 16 + g + 8 * i;
        if (row >= rows_valid) continue;
        const float inv = lrow[i] > 0.f ? 1.f / lrow[i] : 0.f;
        if (p.n_splits == 1) {
            __nv_bfloat16 *dst = p.o + seq * p.o_seq + (long long)(row / p.group) * p.o_tok +
                                 (long long)(hkv * p.group + row % p.group) * p.d;
#pragma unroll
            for (int j = 0; j < C::NC; j++) {
                const int dim = 8 * j + t2;
                if (j % KS == kw && dim < p.d)
                    *(uint32_t *)(dst + dim) = pack_bf16(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
            }
        } else {
            float *dst = p.ws_o + (part0 + row) * p.d;
#pragma unroll
            for (int j = 0; j < C::NC; j++) {
                const int dim = 8 * j + t2;
                if (j % KS == kw && dim < p.d)
                    *(float2 *)(dst + dim) = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
            }
            if (t2 == 0 && kw == 0) {
                p.ws_m[part0 + row] = mx[i];
                p.ws_l[part0 + row] = lrow[i];
            }
        }
    }
}

} // namespace nib

#endif
