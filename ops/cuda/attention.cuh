/* attention.cuh — device side of ops/cuda/attention.cu: the parameter blocks, the PTX helpers
 * the attention kernels add to gemm_lowbit.cuh's, the attention kernel template and the split
 * merge kernel. See attention.cu for the design; ops/attention.h for the contract. */
#ifndef NIB_ATTENTION_CUH
#define NIB_ATTENTION_CUH

#include <cuda.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "ops/attention.h"
#include "ops/cuda/gemm_lowbit.cuh"
#include "runtime/ktrace.cuh" /* NIB_KT: the stamps of a lab build (attention.cu owns the ring) */
#include "runtime/launch.cuh"

namespace nib {

enum { F_BF16 = NIB_KV_BF16, F_FP8 = NIB_KV_FP8, F_NVFP4 = NIB_KV_NVFP4 };

#define LOG2E_F 1.4426950408889634f
#define MAX_SPLITS 512

struct AttnParams {
    /* the wgmma kernel's TMA forms (attn_wg.cuh, TMA = 1): Q as [seq][token][head][d] (4-D: d, head,
     * token, seq), K and V as [seq][token][kv head][d] (4-D: d, kv head, token, seq), 128-byte swizzle */
    CUtensorMap tmq, tmk, tmv;
    const __nv_bfloat16 *q;
    __nv_bfloat16 *o;
    long long q_tok, o_tok, q_seq, o_seq;     /* elements */
    const uint8_t *k, *v;                     /* element planes */
    long long k_tok, v_tok, k_seq, v_seq;     /* bytes between tokens / sequences */
    long long kv_head;                        /* bytes between KV heads within a token */
    const uint8_t *kb, *vb;                   /* NVFP4 block scales [t][n_kv][D/16] */
    const float *ks, *vs;                     /* FP8 scales / NVFP4 globals [t][n_kv] */
    const int *t_valid, *nq_valid, *nseq_valid; /* device ints or NULL (= max) */
    int t_max, nq_max, n_seq, n_kv, group, d, rows_max, n_splits;
    float lscale;                             /* log2(e) x the logit scale (exp2 argument per logit) */
    float *ws_o, *ws_m, *ws_l;                /* [z][split][row][d], [z][split][row] x 2 */
    int pf_kv;                                /* attn_prefetch_kv before the PDL wait (cache path) */
    int lens_early;                           /* k_attn_dec: the lengths read before the PDL wait (rule 1b) */
};

/* Compile-time shape of one variant and its shared-memory map (bytes). */
template <int FMT, int DP, int WR, int WT, int KW, int ST, int CL = 0> struct Cfg {
    static constexpr int NW = WR * WT, NT = NW * 32;
    static constexpr int TK = WT * KW * 16;   /* keys per tile */
    static constexpr int ROWS = 16 * WR;      /* query rows per CTA */
    static constexpr int LDS = DP + 8;        /* bf16 elements per smem row (conflict-free ldmatrix) */
    static constexpr int KROW = FMT == F_BF16 ? DP * 2 : FMT == F_FP8 ? DP : DP / 2; /* raw bytes/key */
    static constexpr int BROW = FMT == F_NVFP4 ? DP / 16 : 0;                      /* block-scale bytes/key */
    static constexpr int Q_BYTES = ROWS * LDS * 2;
    static constexpr int TILE_BYTES = 2 * TK * LDS * 2;                 /* bf16 K and V tiles */
    static constexpr int SCALE_BYTES = FMT == F_BF16 ? 0 : TK * 4;      /* decoded per-key K scales */
    static constexpr int RAW_STAGE = FMT == F_BF16 ? 0 : TK * (2 * KROW + 2 * BROW + 8);
    static constexpr int MAIN_BYTES = FMT == F_BF16 ? Q_BYTES + ST * TILE_BYTES
                                                    : Q_BYTES + TILE_BYTES + SCALE_BYTES + ST * RAW_STAGE;
    static constexpr int RED_LD = DP + 8;                               /* fp32 row of the WT merge */
    static constexpr int EPI_BYTES = WT > 1 ? WT * ROWS * (RED_LD + 2) * 4 + ROWS * 3 * 4 + 8 + ROWS * 8 : 0;
    static constexpr int CL_LD = DP + 4;                                /* fp32 row of a cluster partial */
    /* partial o, m, l of every row; then the local combine table (w_s, inv, output offset) */
    static constexpr int CL_BYTES = CL ? ROWS * (CL_LD + 2) * 4 + ROWS * (16 + 1) * 4 + 8 + ROWS * 8 : 0;
    static constexpr int SMEM0 = MAIN_BYTES > EPI_BYTES ? MAIN_BYTES : EPI_BYTES;
    static constexpr int SMEM = SMEM0 > CL_BYTES ? SMEM0 : CL_BYTES;
    static constexpr int MINB = DP <= 80 ? (NW >= 16 ? 1 : NW == 8 ? 2 : 3) : NW == 2 ? 2 : 1;
    static_assert(DP % 16 == 0 && KW >= 1 && ST >= 1, "shape");
    static_assert(FMT == F_BF16 || DP == 256, "low-bit caches need head_dim 256");
    static_assert(Q_BYTES % 16 == 0 && TILE_BYTES % 16 == 0 && RAW_STAGE % 16 == 0, "16-byte regions");
    static_assert(!CL || WT == 1, "cluster merge: one token group");
};

/* ---- PTX wrappers (beyond gemm_lowbit.cuh's) ---- */
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}
/* cluster barrier with release/acquire ordering of shared (and distributed shared) memory */
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* the address of `p` (this CTA's shared memory) in the shared memory of cluster CTA `rank` */
template <typename T> __device__ __forceinline__ const T *dsmem_ptr(const T *p, int rank) {
    return (const T *)__cluster_map_shared_rank((void *)p, (unsigned)rank);
}
#define CL_MAX 16 /* largest cluster (splits) of the cluster variant */
/* ---- end of PTX wrappers ---- */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi); /* .x (low half) = lo */
    return *reinterpret_cast<uint32_t *>(&h);
}
__device__ __forceinline__ int read_len(const int *p, int max) {
    int v = p ? *p : max;
    return v < 0 ? 0 : v > max ? max : v;
}
/* the same from L2 (ld.global.cg): for a read before the PDL wait (runtime/launch.cuh, rule 1b), which must not
 * find an SM's L1 copy from an earlier call */
__device__ __forceinline__ int read_len_l2(const int *p, int max) {
    int v = p ? __ldcg(p) : max;
    return v < 0 ? 0 : v > max ? max : v;
}
/* An idle split's workspace rows [row0, row0 + rows) as (m, l, o) = (-inf, 0, 0) (with splits only), by nt threads:
 * the merge with ALL (k_attn_merge<.., true>) then loads every split's entries before it reads a length */
__device__ __noinline__ void attn_ws_idle(const AttnParams &p, int z, int split, int row0, int rows, int nt) {
    if (p.n_splits <= 1) return;
    const size_t part0 = ((size_t)z * p.n_splits + split) * p.rows_max + row0;
    const int d4 = p.d >> 2; /* <= 64 float4 a row (head_dim <= 256, a multiple of 8) */
    for (int i = threadIdx.x; i < rows * 64; i += nt) {
        const int r = i >> 6, c = i & 63;
        if (c < d4) *(float4 *)(p.ws_o + (part0 + r) * p.d + 4 * c) = make_float4(0.f, 0.f, 0.f, 0.f);
        if (c == 0) {
            p.ws_m[part0 + r] = -INFINITY;
            p.ws_l[part0 + r] = 0.f;
        }
    }
}

/* L2 prefetch of [a, a + bytes) (cp.async.bulk.prefetch: a hint, nothing lands in the CTA), widened to
 * 16-byte bounds, in 16 KB pieces dealt over the 32 lanes of the calling warp */
__device__ __forceinline__ void attn_prefetch_range(const void *a, long long bytes, int lane) {
    if (!a || bytes <= 0) return;
    const uintptr_t b = (uintptr_t)a & ~(uintptr_t)15, e = ((uintptr_t)a + (uintptr_t)bytes + 15) & ~(uintptr_t)15;
    for (uintptr_t c = b + (uintptr_t)lane * 16384u; c < e; c += 32u * 16384u) {
        const unsigned n = (unsigned)(e - c < 16384u ? e - c : 16384u);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(c), "r"(n) : "memory");
    }
}
/* The cache path's split prologue, BEFORE the PDL wait (runtime/launch.cuh): warp 0 of the first row
 * block asks L2 for this split's K and V rows. The rows of a cache were written by earlier calls, not
 * by the kernel this one may overlap (except the newest ones, which it may fetch early: a prefetch
 * moves nothing into the CTA, so a row still being written, or a length read before the wait that is
 * one call stale, costs bandwidth, never a wrong value). Set for bf16 caches with one KV head per
 * token (a split's rows are then one contiguous range): see nib_cuda_attn_cache for what it measured. */
__device__ __forceinline__ void attn_prefetch_kv(const AttnParams &p, int tk) {
    if (!p.pf_kv || blockIdx.x != 0 || threadIdx.x >= 32 || p.n_kv != 1) return;
    if (p.k_seq == 0 && p.n_seq > 1 && blockIdx.z != 0) return; /* sequences sharing one cache: once */
    const int seq = blockIdx.z, split = blockIdx.y, lane = threadIdx.x;
    const int T = read_len(p.t_valid, p.t_max);
    int t0, t1;
    if (split >= nib_attn_split_range(T, p.n_splits, tk, split, &t0, &t1) || t1 <= t0) return;
    attn_prefetch_range(p.k + seq * p.k_seq + t0 * p.k_tok, (long long)(t1 - t0) * p.k_tok, lane);
    attn_prefetch_range(p.v + seq * p.v_seq + t0 * p.v_tok, (long long)(t1 - t0) * p.v_tok, lane);
}

/* Two e4m3 bytes of w (selected into the high byte of each 16-bit half by prmt `sel`) ->
 * bf16x2 of their exact values: dec_e4m3_hi gives value * 2^-120 (a bf16 subnormal for
 * e4m3 subnormals), the bf16 multiply by 2^120 (0x7B80) is exact. */
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t w, uint32_t sel) {
    return bf2_mul(dec_e4m3_hi(prmt(w, 0, sel)), 0x7B807B80u);
}
/* Two e2m1 codes -> the bf16x2 bits of value * 2^-126 (exact; e2m1 subnormals become bf16
 * subnormals), from ev = w & 0x0F0F0F0F and od = (w >> 4) & 0x0F0F0F0F of a 32-bit word w of 8
 * codes: half 0 the code of ev's byte jj (dim 2jj), half 1 that of od's byte jj (dim 2jj + 1).
 * The prmt puts the two codes at bits 0..3 and 16..19 and zeros bytes 1 and 3 (selector 8 | x
 * replicates the sign bit of a byte < 0x10), so ONE multiply by 2^6 + 2^12 makes, per code, a copy
 * at 6..9 and one at 12..15 (22..25 and 28..31) without overlap or carry; the mask keeps
 * magnitude bits 0..2 at 6..8 and the sign bit 3 at 15. Was two shifts, two masks and an or. */
__host__ __device__ constexpr uint32_t e2m1x2_sel(int jj) {
    return (uint32_t)(jj | ((8 + jj) << 4) | ((4 + jj) << 8) | ((12 + jj) << 12));
}
__device__ __forceinline__ uint32_t e2m1x2_raw(uint32_t ev, uint32_t od, int jj) {
    return (prmt(ev, od, e2m1x2_sel(jj)) * 0x1040u) & 0x81C081C0u;
}
/* compile-time proof of e2m1x2_raw against the shift-and-mask form, for every pair of codes in
 * every byte position (prmt emulated per the PTX ISA: selector bit 3 = replicate the byte's sign) */
constexpr uint32_t prmt_host(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        const uint32_t n = (sel >> (4 * i)) & 15u, x = n & 7u;
        const uint32_t byte = ((x < 4 ? a >> (8 * x) : b >> (8 * (x - 4))) & 0xFFu);
        r |= (n & 8u ? (byte & 0x80u ? 0xFFu : 0u) : byte) << (8 * i);
    }
    return r;
}
constexpr bool e2m1x2_raw_ok() {
    for (int jj = 0; jj < 4; jj++)
        for (uint32_t c0 = 0; c0 < 16; c0++)
            for (uint32_t c1 = 0; c1 < 16; c1++) {
                const uint32_t ev = 0x0B050E03u ^ (0x0F0F0F0Fu & (0x01010101u * (c0 ^ 7u))), od = 0x040D0609u;
                const uint32_t e2 = (ev & ~(0xFFu << (8 * jj))) | (c0 << (8 * jj));
                const uint32_t o2 = (od & ~(0xFFu << (8 * jj))) | (c1 << (8 * jj));
                const uint32_t vv = prmt_host(e2, o2, (uint32_t)(jj | (jj << 4) | ((4 + jj) << 8) | ((4 + jj) << 12)));
                const uint32_t want = ((vv << 6) & 0x01C001C0u) | ((vv << 12) & 0x80008000u);
                if (((prmt_host(e2, o2, e2m1x2_sel(jj)) * 0x1040u) & 0x81C081C0u) != want) return false;
                if (want != (((c0 & 7u) << 6) | ((c0 & 8u) << 12) | ((c1 & 7u) << 22) | ((c1 & 8u) << 28))) return false;
            }
    return true;
}
static_assert(e2m1x2_raw_ok(), "e2m1x2_raw");
/* bf16x2 times an fp32 scale, each product rounded to bf16 (RNE) on its own */
__device__ __forceinline__ uint32_t bf16x2_scale(uint32_t w, float s) {
    return pack_bf16(__uint_as_float(w << 16) * s, __uint_as_float(w & 0xFFFF0000u) * s);
}
/* e4m3 byte (sign ignored: scales are positive) -> fp32: the 7 magnitude bits placed at
 * fp32 bits 20..26 are value * 2^-120 (denormal for e4m3 subnormals; no FTZ in this build). */
__device__ __forceinline__ float e4m3_to_f32(uint32_t c) {
    return __uint_as_float((c & 0x7Fu) << 20) * 0x1p120f;
}

/* One K/V tile's element rows: 2 x TK rows (K then V) of CHN 16-byte chunks, key j from
 * base + (tt0 + j) * stride (bytes) to dst + j * dst_ld (shared, bytes); keys >= t1 and chunks
 * >= cmax are zero-filled. When NT is a multiple of CHN every thread keeps one chunk column and
 * walks its rows with pointer increments (no per-copy index arithmetic). */
template <int NT, int TK, int CHN>
__device__ __forceinline__ void copy_kv_rows(const uint8_t *kbase, const uint8_t *vbase, long long k_tok,
                                             long long v_tok, int tt0, int t1, uint32_t dst_k, uint32_t dst_v,
                                             int dst_ld, int cmax, int tid) {
    if constexpr (NT % CHN == 0) {
        constexpr int RPI = NT / CHN;
        const int c = tid % CHN, j0 = tid / CHN;
        const bool cok = c < cmax;
#pragma unroll
        for (int isv = 0; isv < 2; isv++) {
            const long long stride = isv ? v_tok : k_tok;
            const uint8_t *src = (isv ? vbase : kbase) + (long long)(tt0 + j0) * stride + c * 16;
            uint32_t dst = (isv ? dst_v : dst_k) + j0 * dst_ld + c * 16;
            int tok = tt0 + j0;
#pragma unroll 2
            for (int j = j0; j < TK; j += RPI) {
                const bool ok = cok && tok < t1;
                cp_async16(dst, ok ? (const void *)src : (const void *)kbase, ok ? 16 : 0);
                tok += RPI;
                src += RPI * stride;
                dst += RPI * dst_ld;
            }
        }
    } else { /* (row, chunk) of idx = tid + i * NT advanced by (NT / CHN, NT % CHN) with one carry */
        constexpr int DJ = NT / CHN, DC = NT % CHN;
#pragma unroll
        for (int isv = 0; isv < 2; isv++) {
            const long long stride = isv ? v_tok : k_tok;
            const uint8_t *base = isv ? vbase : kbase;
            const uint32_t dst = isv ? dst_v : dst_k;
            int j = tid / CHN, c = tid - (tid / CHN) * CHN;
            for (; j < TK;) {
                const int tok = tt0 + j;
                const bool ok = tok < t1 && c < cmax;
                cp_async16(dst + j * dst_ld + c * 16, ok ? (const void *)(base + (long long)tok * stride + c * 16) : base,
                           ok ? 16 : 0);
                j += DJ;
                c += DC;
                if (c >= CHN) {
                    c -= CHN;
                    j++;
                }
            }
        }
    }
}

/* Online softmax, one tile: fold the tile's lane-partial row maxima mx (log2 units; rows g and
 * g + 8 of a 16-row MMA fragment, the 4 lanes of a quad hold different keys) into the running max
 * mrow and sum lrow; alpha rescales the old O and l, mu is the exp2 offset of the tile's p. */
__device__ __forceinline__ void softmax_fold(float (&mx)[2], float (&mrow)[2], float (&lrow)[2], float (&alpha)[2],
                                             float (&mu)[2]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float mn = fmaxf(mrow[i], mx[i]);
        mu[i] = mn == -INFINITY ? 0.f : mn; /* all keys so far masked: keep exp2 finite */
        alpha[i] = exp2f(mrow[i] - mu[i]);
        mrow[i] = mn;
        lrow[i] *= alpha[i];
    }
}

/* ---- the attention kernel ------------------------------------------------------------- */
template <int FMT, int DP, int WR, int WT, int KW, int ST, int CL = 0>
__global__ void __launch_bounds__(Cfg<FMT, DP, WR, WT, KW, ST, CL>::NT, Cfg<FMT, DP, WR, WT, KW, ST, CL>::MINB)
    k_attn(AttnParams p) {
    NIB_KT(NIB_KT_ATTN, NIB_KT_ENTRY);
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    NIB_KT(NIB_KT_ATTN, NIB_KT_WAITED);
    NIB_KT_EXIT_GUARD(NIB_KT_ATTN);
    using C = Cfg<FMT, DP, WR, WT, KW, ST, CL>;
    constexpr int NT = C::NT, TK = C::TK, LDS = C::LDS, ROWS = C::ROWS, KROW = C::KROW, BROW = C::BROW;
    constexpr int NSJ = 2 * KW;  /* S n-tiles (8 keys) per warp and tile */
    constexpr int NOJ = DP / 8;  /* O n-tiles (8 dims) */
    extern __shared__ __align__(16) unsigned char smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = nib::warp_id();
    const int wr = warp / WT, wt = warp % WT;
    const int z = blockIdx.z, seq = z / p.n_kv, hkv = z % p.n_kv;
    const int split = blockIdx.y, row0 = blockIdx.x * ROWS;

    /* CTA-uniform early exits (before any async copy); the first two are uniform over a
     * cluster too (its CTAs share seq and the row block) */
    if (seq >= read_len(p.nseq_valid, p.n_seq)) return;
    const int T = read_len(p.t_valid, p.t_max);
    const int rows_valid = read_len(p.nq_valid, p.nq_max) * p.group;
    if (row0 >= rows_valid) return;
    int t0, t1;
    if constexpr (CL) { /* cluster: the tiles dealt out evenly, every CTA stays for the merge */
        const int tiles = (T + TK - 1) / TK;
        t0 = (int)((long long)split * tiles / p.n_splits) * TK;
        t1 = (int)((long long)(split + 1) * tiles / p.n_splits) * TK;
        t0 = t0 < T ? t0 : T;
        t1 = t1 < T ? t1 : T;
    } else {
        const int n_active = nib_attn_split_range(T, p.n_splits, TK, split, &t0, &t1);
        if (split >= n_active) return;
    }
    const int n_tiles = (t1 - t0 + TK - 1) / TK;

    __nv_bfloat16 *const Qs = (__nv_bfloat16 *)smem;
    unsigned char *const after_q = smem + C::Q_BYTES;

    /* Q rows -> smem (zero rows past the valid rows, zero columns past head_dim) */
    {
        constexpr int CH = DP / 8;
        if constexpr (NT % CH == 0) { /* fixed column per thread; (token, head) of its rows advanced incrementally */
            constexpr int RPI = NT / CH;
            const int c = tid % CH, r0 = tid / CH;
            const bool cok = c * 8 < p.d;
            int tq = (row0 + r0) / p.group, hq = (row0 + r0) - tq * p.group;
            const __nv_bfloat16 *qb = p.q + seq * p.q_seq + (long long)hkv * p.group * p.d + c * 8;
            for (int r = r0; r < ROWS; r += RPI) {
                const bool ok = cok && row0 + r < rows_valid;
                const __nv_bfloat16 *src = ok ? qb + (long long)tq * p.q_tok + (long long)hq * p.d : p.q;
                cp_async16(smem_u32(Qs + r * LDS + c * 8), src, ok ? 16 : 0);
                hq += RPI;
                while (hq >= p.group) {
                    hq -= p.group;
                    tq++;
                }
            }
        } else { /* (row, chunk) advanced by (NT / CH, NT % CH) with one carry */
            constexpr int DR = NT / CH, DC = NT % CH;
            int r = tid / CH, c = tid - (tid / CH) * CH;
            for (; r < ROWS;) {
                const int row = row0 + r;
                const bool ok = row < rows_valid && c * 8 < p.d;
                const __nv_bfloat16 *src = p.q;
                if (ok)
                    src = p.q + seq * p.q_seq + (long long)(row / p.group) * p.q_tok +
                          (long long)(hkv * p.group + row % p.group) * p.d + c * 8;
                cp_async16(smem_u32(Qs + r * LDS + c * 8), src, ok ? 16 : 0);
                r += DR;
                c += DC;
                if (c >= CH) {
                    c -= CH;
                    r++;
                }
            }
        }
    }
    const uint8_t *const kbase = p.k + seq * p.k_seq + hkv * p.kv_head;
    const uint8_t *const vbase = p.v + seq * p.v_seq + hkv * p.kv_head;

    /* one K/V tile (keys t0 + it*TK ...) -> stage; keys >= t1 are zero-filled */
    auto load_tile = [&](int it, int stage) {
        const int tt0 = t0 + it * TK;
        if constexpr (FMT == F_BF16) {
            __nv_bfloat16 *Ks = (__nv_bfloat16 *)(after_q + stage * C::TILE_BYTES);
            copy_kv_rows<NT, TK, DP / 8>(kbase, vbase, p.k_tok, p.v_tok, tt0, t1, smem_u32(Ks), smem_u32(Ks + TK * LDS),
                                         LDS * 2, (p.d + 7) / 8, tid);
        } else {
            unsigned char *raw = after_q + C::TILE_BYTES + C::SCALE_BYTES + stage * C::RAW_STAGE;
            copy_kv_rows<NT, TK, KROW / 16>(kbase, vbase, p.k_tok, p.v_tok, tt0, t1, smem_u32(raw),
                                            smem_u32(raw + TK * KROW), KROW, KROW / 16, tid);
            unsigned char *bs = raw + 2 * TK * KROW;
            if constexpr (FMT == F_NVFP4) { /* BROW = 16: one 16-byte copy per key */
                for (int i = tid; i < 2 * TK; i += NT) {
                    int isv = i >= TK, j = i - isv * TK, tok = tt0 + j;
                    bool ok = tok < t1;
                    const uint8_t *src = isv ? p.vb : p.kb;
                    if (ok) src += ((long long)tok * p.n_kv + hkv) * BROW;
                    cp_async16(smem_u32(bs + (isv * TK + j) * BROW), src, ok ? 16 : 0);
                }
            }
            float *sc = (float *)(bs + 2 * TK * BROW);
            for (int i = tid; i < 2 * TK; i += NT) {
                int isv = i >= TK, j = i - isv * TK, tok = tt0 + j;
                bool ok = tok < t1;
                const float *src = isv ? p.vs : p.ks;
                if (ok) src += (long long)tok * p.n_kv + hkv;
                cp_async4(smem_u32(sc + i), src, ok ? 4 : 0);
            }
        }
    };

    /* low-bit: raw stage -> bf16 K/V tile + fp32 per-key scales (exact decoding) */
    auto dequant = [&](int stage) {
        __nv_bfloat16 *Kt = (__nv_bfloat16 *)after_q;
        float *scale_t = (float *)(after_q + C::TILE_BYTES);
        const unsigned char *raw = after_q + C::TILE_BYTES + C::SCALE_BYTES + stage * C::RAW_STAGE;
        const unsigned char *bs = raw + 2 * TK * KROW;
        const float *sc = (const float *)(bs + 2 * TK * BROW);
        constexpr int G = DP / 16; /* 16-element groups per key */
        for (int i = tid; i < 2 * TK * G; i += NT) {
            int kj = i / G, g = i - kj * G; /* kj = isv * TK + key */
            uint32_t w[8];
            if constexpr (FMT == F_FP8) {
                uint4 r = *(const uint4 *)(raw + kj * KROW + g * 16);
                const uint32_t rw[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    w[2 * q] = e4m3x2_to_bf16x2(rw[q], 0x1404u);     /* bytes 0,1 */
                    w[2 * q + 1] = e4m3x2_to_bf16x2(rw[q], 0x3424u); /* bytes 2,3 */
                }
            } else {
                uint2 r = *(const uint2 *)(raw + kj * KROW + g * 8);
                /* factor = bf16(block scale * 2^118) in both halves; e2m1 raw below is
                 * value * 2^-126, so the product is value * scale * 2^-8 (exact; the 2^8 is
                 * folded into the per-key scale) */
                float f = e4m3_to_f32(bs[kj * BROW + g]) * 0x1p118f;
                uint32_t fb = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(f));
                fb |= fb << 16;
                const uint32_t rw[2] = {r.x, r.y};
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t ev = rw[h] & 0x0F0F0F0Fu, od = (rw[h] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        w[4 * h + jj] = bf2_mul(e2m1x2_raw(ev, od, jj), fb);
                    }
                }
            }
            if (kj >= TK) { /* V: apply the key's fp32 scale per element, round each to bf16 */
                const float vs = FMT == F_NVFP4 ? sc[kj] * 256.0f : sc[kj];
#pragma unroll
                for (int q = 0; q < 8; q++) w[q] = bf16x2_scale(w[q], vs);
            }
            uint4 *dst = (uint4 *)(Kt + kj * LDS + g * 16); /* V tile follows K: row TK + key */
            dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
            dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        }
        for (int i = tid; i < TK; i += NT) scale_t[i] = FMT == F_NVFP4 ? sc[i] * 256.0f : sc[i]; /* K */
    };

    /* per-warp state: rows g (i = 0) and g + 8 (i = 1) of the warp's 16 */
    float oacc[NOJ][4];
#pragma unroll
    for (int n = 0; n < NOJ; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) oacc[n][c] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const bool warp_active = row0 + wr * 16 < rows_valid;

    const uint32_t q_addr = smem_u32(Qs + (wr * 16 + (lane & 15)) * LDS + (lane >> 4) * 8);
    const int key_w0 = wt * KW * 16; /* this warp's first key within a tile */
    const int k_lrow = key_w0 + (lane & 7) + ((lane >> 4) << 3), k_lcol = ((lane >> 3) & 1) * 8;
    const int v_lrow = key_w0 + (lane & 7) + (((lane >> 3) & 1) << 3), v_lcol = (lane >> 4) * 8;

#pragma unroll 1
    for (int st = 0; st < ST - 1; st++) {
        if (st < n_tiles) load_tile(st, st);
        cp_async_commit(); /* group st (Q joins group 0) */
    }
#pragma unroll 1
    for (int it = 0; it < n_tiles; it++) {
        if constexpr (ST == 1) { /* one stage (one tile covers the keys): load, wait, use */
            if (it > 0) __syncthreads(); /* everyone finished tile it-1 */
            load_tile(it, 0);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
        } else {
            cp_async_wait<ST - 2>(); /* groups 0..it complete */
            __syncthreads();         /* ... for every thread; and everyone finished tile it-1 */
            if (it + ST - 1 < n_tiles) load_tile(it + ST - 1, (it + ST - 1) % ST);
            cp_async_commit();
        }
        const __nv_bfloat16 *Kt, *Vt;
        const float *ksc = nullptr;
        if constexpr (FMT == F_BF16) {
            Kt = (const __nv_bfloat16 *)(after_q + (it % ST) * C::TILE_BYTES);
        } else {
            dequant(it % ST);
            __syncthreads();
            Kt = (const __nv_bfloat16 *)after_q;
            ksc = (const float *)(after_q + C::TILE_BYTES);
        }
        Vt = Kt + TK * LDS;
        if (!warp_active) continue;

        /* S = Q K^T for this warp's 16 rows x KW*16 keys */
        float s[NSJ][4];
#pragma unroll
        for (int j = 0; j < NSJ; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[j][c] = 0.f;
        const uint32_t k_addr = smem_u32(Kt + k_lrow * LDS + k_lcol);
#pragma unroll
        for (int ks = 0; ks < DP / 16; ks++) {
            uint32_t a[4];
            ldmatrix_x4(a, q_addr + ks * 32);
#pragma unroll
            for (int jp = 0; jp < KW; jp++) {
                uint32_t b[4];
                ldmatrix_x4(b, k_addr + (jp * 16 * LDS + ks * 16) * 2);
                mma_bf16(s[2 * jp], a, b[0], b[1]);
                mma_bf16(s[2 * jp + 1], a, b[2], b[3]);
            }
        }
        /* scale to log2 units, mask keys past the split end, online softmax */
        const int key_t0 = t0 + it * TK;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NSJ; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int kl = key_w0 + j * 8 + 2 * (lane & 3) + (c & 1);
                float x = s[j][c];
                if (FMT != F_BF16) x *= ksc[kl];
                x = key_t0 + kl < t1 ? x * p.lscale : -INFINITY;
                s[j][c] = x;
                mx[c >> 1] = fmaxf(mx[c >> 1], x);
            }
        float alpha[2], mu[2];
        softmax_fold(mx, mrow, lrow, alpha, mu);
#pragma unroll
        for (int j = 0; j < NSJ; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float pr = exp2f(s[j][c] - mu[c >> 1]);
                lrow[c >> 1] += pr;
                s[j][c] = pr;
            }
#pragma unroll
        for (int n = 0; n < NOJ; n++) {
            oacc[n][0] *= alpha[0];
            oacc[n][1] *= alpha[0];
            oacc[n][2] *= alpha[1];
            oacc[n][3] *= alpha[1];
        }
        /* O += bf16(P) V */
        const uint32_t v_addr = smem_u32(Vt + v_lrow * LDS + v_lcol);
#pragma unroll
        for (int kk = 0; kk < KW; kk++) {
            const float(&p0)[4] = s[2 * kk], (&p1)[4] = s[2 * kk + 1];
            uint32_t a[4] = {pack_bf16(p0[0], p0[1]), pack_bf16(p0[2], p0[3]), pack_bf16(p1[0], p1[1]),
                             pack_bf16(p1[2], p1[3])};
#pragma unroll
            for (int np = 0; np < NOJ / 2; np++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, v_addr + (kk * 16 * LDS + np * 16) * 2);
                mma_bf16(oacc[2 * np], a, b[0], b[1]);
                mma_bf16(oacc[2 * np + 1], a, b[2], b[3]);
            }
        }
    }
    cp_async_wait<0>(); /* nothing may land in smem after this point */

    /* full row sums (the 4 lanes of a quad hold different keys) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 1);
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 2);
    }
    const int g = lane >> 2, t2 = 2 * (lane & 3);
    const size_t part0 = ((size_t)z * p.n_splits + split) * p.rows_max; /* workspace row 0 of this split */

    /* output offset (elements) of row `row` of this (sequence, KV head) */
    auto out_off = [&](int row) -> long long {
        return seq * p.o_seq + (long long)(row / p.group) * p.o_tok + (long long)(hkv * p.group + row % p.group) * p.d;
    };
    /* the result of one row: normalized o (times inv = 1 / l, computed once per row) to the
     * output (one split) or the workspace */
    auto emit_row_pair = [&](int row, long long off, int dim, float ox, float oy, float m, float l, float inv) {
        if (p.n_splits == 1) {
            *(uint32_t *)(p.o + off + dim) = pack_bf16(ox * inv, oy * inv);
        } else {
            *(float2 *)(p.ws_o + (part0 + row) * p.d + dim) = make_float2(ox * inv, oy * inv);
            if (dim == 0) {
                p.ws_m[part0 + row] = m;
                p.ws_l[part0 + row] = l;
            }
        }
    };

    if constexpr (CL) {
        /* Cluster merge (the CTAs of a cluster are the splits of one row block): each CTA puts
         * its normalized partial o, m and l of every row in its shared memory; after the cluster
         * barrier CTA `split` combines rows split, split + n_splits, ... reading all the CTAs'
         * partials through distributed shared memory, in split order (deterministic):
         *   M = max_s m_s, w_s = l_s 2^(m_s - M), o = (sum_s w_s o_s) * (1 / sum_s w_s).
         * The per-row factors are computed once per row into a local table first. */
        constexpr int LD = C::CL_LD;
        float *cl_o = (float *)smem, *cl_m = cl_o + ROWS * LD, *cl_l = cl_m + ROWS;
        float *tw = cl_l + ROWS;                 /* [ROWS / ... my rows][CL_MAX] w_s (local only) */
        float *tinv = tw + ROWS * CL_MAX;        /* [my rows] 1 / sum w_s */
        long long *toff = (long long *)(((uintptr_t)(tinv + ROWS) + 7) & ~(uintptr_t)7); /* [my rows] output offsets */
        __syncthreads(); /* every warp is done reading the tiles */
        if (warp_active) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int rl = wr * 16 + g + 8 * i;
                const float inv = lrow[i] > 0.f ? 1.f / lrow[i] : 0.f;
#pragma unroll
                for (int n = 0; n < NOJ; n++)
                    *(float2 *)(cl_o + rl * LD + n * 8 + t2) = make_float2(oacc[n][2 * i] * inv, oacc[n][2 * i + 1] * inv);
                if ((lane & 3) == 0) {
                    cl_m[rl] = mrow[i];
                    cl_l[rl] = lrow[i];
                }
            }
        }
        cluster_sync_all();
        const int ns = p.n_splits, c4n = DP / 4;
        const int my_rows = split < rows_valid - row0 ? (rows_valid - row0 - split + ns - 1) / ns : 0;
        if (tid < my_rows) { /* one thread per row of mine: the combine factors */
            const int rl = split + tid * ns;
            float ms[CL_MAX], M = -INFINITY;
#pragma unroll
            for (int s2 = 0; s2 < CL_MAX; s2++) {
                ms[s2] = s2 < ns ? *dsmem_ptr(cl_m + rl, s2) : -INFINITY;
                M = fmaxf(M, ms[s2]);
            }
            const float mu = M == -INFINITY ? 0.f : M;
            float l = 0.f;
#pragma unroll
            for (int s2 = 0; s2 < CL_MAX; s2++) {
                const float w = s2 < ns ? *dsmem_ptr(cl_l + rl, s2) * exp2f(ms[s2] - mu) : 0.f;
                tw[tid * CL_MAX + s2] = w;
                l += w;
            }
            tinv[tid] = l > 0.f ? 1.f / l : 0.f;
            toff[tid] = out_off(row0 + rl);
        }
        __syncthreads();
        for (int it = tid; it < my_rows * c4n; it += NT) {
            const int k = it / c4n, c4 = it - k * c4n, rl = split + k * ns;
            if (c4 * 4 >= p.d) continue;
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int s2 = 0; s2 < ns; s2++) {
                const float w = tw[k * CL_MAX + s2];
                const float4 v = *(const float4 *)dsmem_ptr(cl_o + rl * LD + c4 * 4, s2);
                acc.x += w * v.x;
                acc.y += w * v.y;
                acc.z += w * v.z;
                acc.w += w * v.w;
            }
            const float inv = tinv[k];
            *(uint2 *)(p.o + toff[k] + 4 * c4) =
                make_uint2(pack_bf16(acc.x * inv, acc.y * inv), pack_bf16(acc.z * inv, acc.w * inv));
        }
        cluster_sync_all(); /* no CTA leaves while another still reads its shared memory */
        return;
    }

    if constexpr (WT == 1) {
        if (!warp_active) return;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int row = row0 + wr * 16 + g + 8 * i;
            if (row >= rows_valid) continue;
            const float inv = lrow[i] > 0.f ? 1.f / lrow[i] : 0.f;
            const long long off = out_off(row);
#pragma unroll
            for (int n = 0; n < NOJ; n++)
                if (n * 8 < p.d)
                    emit_row_pair(row, off, n * 8 + t2, oacc[n][2 * i], oacc[n][2 * i + 1], mrow[i], lrow[i], inv);
        }
        return;
    }

    /* WT > 1: the token groups of each row group merge through shared memory. Per row (once):
     * M = max_w m_w, f_w = 2^(m_w - M), l = sum_w f_w l_w, inv = 1 / l; then per 4 dims:
     * o = (sum_w f_w o_w) * inv (o_w unnormalized), float4 shared-memory reads. */
    constexpr int RLD = C::RED_LD;
    float *red_o = (float *)smem;              /* [WT][ROWS][RLD] */
    float *red_m = red_o + WT * ROWS * RLD;    /* [WT][ROWS]: m_w, then f_w */
    float *red_l = red_m + WT * ROWS;          /* [WT][ROWS] */
    float *row_f = red_l + WT * ROWS;          /* [ROWS] x {M, l, inv} */
    long long *row_off = (long long *)(((uintptr_t)(row_f + 3 * ROWS) + 7) & ~(uintptr_t)7); /* [ROWS] offsets */
    __syncthreads(); /* every warp is done reading the tiles */
    if (warp_active) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int rl = wr * 16 + g + 8 * i;
            float *dst = red_o + (wt * ROWS + rl) * RLD + t2;
#pragma unroll
            for (int n = 0; n < NOJ; n++) *(float2 *)(dst + n * 8) = make_float2(oacc[n][2 * i], oacc[n][2 * i + 1]);
            if ((lane & 3) == 0) {
                red_m[wt * ROWS + rl] = mrow[i];
                red_l[wt * ROWS + rl] = lrow[i];
            }
        }
    }
    __syncthreads();
    if (tid < ROWS && row0 + tid < rows_valid) {
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < WT; w++) m = fmaxf(m, red_m[w * ROWS + tid]);
        const float mu = m == -INFINITY ? 0.f : m;
        float l = 0.f;
#pragma unroll
        for (int w = 0; w < WT; w++) {
            const float f = exp2f(red_m[w * ROWS + tid] - mu);
            red_m[w * ROWS + tid] = f;
            l += f * red_l[w * ROWS + tid];
        }
        row_f[tid] = m;
        row_f[ROWS + tid] = l;
        row_f[2 * ROWS + tid] = l > 0.f ? 1.f / l : 0.f;
        row_off[tid] = out_off(row0 + tid);
    }
    __syncthreads();
    for (int idx = tid; idx < ROWS * (DP / 4); idx += NT) {
        const int rl = idx / (DP / 4), dim = (idx - rl * (DP / 4)) * 4, row = row0 + rl;
        if (row >= rows_valid || dim >= p.d) continue;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < WT; w++) {
            const float f = red_m[w * ROWS + rl];
            const float4 v = *(const float4 *)(red_o + (w * ROWS + rl) * RLD + dim);
            o.x += f * v.x;
            o.y += f * v.y;
            o.z += f * v.z;
            o.w += f * v.w;
        }
        const float m = row_f[rl], l = row_f[ROWS + rl], inv = row_f[2 * ROWS + rl];
        if (p.n_splits == 1) {
            *(uint2 *)(p.o + row_off[rl] + dim) = make_uint2(pack_bf16(o.x * inv, o.y * inv), pack_bf16(o.z * inv, o.w * inv));
        } else {
            *(float4 *)(p.ws_o + (part0 + row) * p.d + dim) = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
            if (dim == 0) {
                p.ws_m[part0 + row] = m;
                p.ws_l[part0 + row] = l;
            }
        }
    }
}

/* ---- split merge --------------------------------------------------------------------------
 * Thread = (row r, 4 dims c, split lane sl of SL = 2^sl_log2): it sums splits sl, sl + SL, ...
 * (at most PER), then the SL lanes (adjacent, aligned) reduce by shuffles in a fixed order.
 * Every load of a thread (PER x (m, l, float4 o), predicated) is issued before any is used, so
 * the kernel is one L2 round trip deep (a loop over the splits with the loads inside it was
 * one round trip per split: ~10 us at any split count). Grid: x over rows * d/4 * SL, y = z. */
struct MergeParams {
    const float *ws_o, *ws_m, *ws_l;
    __nv_bfloat16 *o;
    long long o_tok, o_seq;
    const int *t_valid, *nq_valid, *nseq_valid;
    int t_max, nq_max, n_seq, n_kv, group, d, rows_max, n_splits, tk, sl_log2;
};

/* ALL: the producer wrote every entry of the grid (k_attn_dec: idle splits as (-inf, 0, 0), rows past
 * the valid ones too), so the partials are loaded before, not after, the lengths are read. LF (with ALL): the two
 * lengths are loaded together with the partials, one L2 round trip instead of three (after the wgmma kernel on a
 * cache; NIB_ATTN_MERGE_LF in attention.cu) */
template <int PER, bool ALL = false, bool LF = false> __global__ void __launch_bounds__(256) k_attn_merge(MergeParams p) {
    static_assert(ALL || !LF, "k_attn_merge: LF (lengths with the partials) needs ALL");
    NIB_KT(NIB_KT_MERGE, NIB_KT_ENTRY);
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    NIB_KT(NIB_KT_MERGE, NIB_KT_WAITED);
    NIB_KT_EXIT_GUARD(NIB_KT_MERGE);
    const int SL = 1 << p.sl_log2, c4 = p.d / 4;
    /* 32-bit index math: the host caps blocks x 256 below 2^31 (unsigned division, no 64-bit) */
    const unsigned gid = blockIdx.x * blockDim.x + threadIdx.x;
    const int sl = (int)(gid & (unsigned)(SL - 1));
    const unsigned rc = gid >> p.sl_log2;
    const int r = (int)(rc / (unsigned)c4), c = (int)(rc - (unsigned)r * (unsigned)c4);
    const int z = blockIdx.y, seq = z / p.n_kv, hkv = z % p.n_kv;
    const size_t zb = (size_t)z * p.n_splits;
    float mv[PER], lv[PER];
    float4 ov[PER];
    auto load = [&](int na) {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int s = sl + i * SL;
            const size_t e = (zb + s) * p.rows_max + r;
            const bool ok = s < na && r < p.rows_max;
            mv[i] = ok ? __ldcg(p.ws_m + e) : -INFINITY;
            lv[i] = ok ? __ldcg(p.ws_l + e) : 0.f;
            ov[i] = ok ? __ldcg((const float4 *)p.ws_o + e * c4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    int t0, t1, na;
    if constexpr (LF) { /* the lengths loaded together with every partial: one L2 round trip */
        const int seq_valid = read_len(p.nseq_valid, p.n_seq), rows_valid = read_len(p.nq_valid, p.nq_max) * p.group;
        load(p.n_splits);
        if (seq >= seq_valid || r >= rows_valid) return;
        na = p.n_splits;
    } else {
        if constexpr (ALL) load(p.n_splits);
        /* exits are uniform over the SL lanes of a group (they share r and z) */
        if (seq >= read_len(p.nseq_valid, p.n_seq)) return;
        if (r >= read_len(p.nq_valid, p.nq_max) * p.group) return;
        na = ALL ? p.n_splits : nib_attn_split_range(read_len(p.t_valid, p.t_max), p.n_splits, p.tk, 0, &t0, &t1);
    }
    const unsigned lane = threadIdx.x & 31;
    const unsigned gmask = SL == 32 ? 0xffffffffu : ((1u << SL) - 1u) << (lane & ~(unsigned)(SL - 1));
    if constexpr (!ALL) load(na);
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; i++) m = fmaxf(m, mv[i]);
    for (int off = SL >> 1; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(gmask, m, off));
    const float mu = m == -INFINITY ? 0.f : m;
    float l = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const float w = sl + i * SL < na ? lv[i] * exp2f(mv[i] - mu) : 0.f;
        l += w;
        acc.x += w * ov[i].x;
        acc.y += w * ov[i].y;
        acc.z += w * ov[i].z;
        acc.w += w * ov[i].w;
    }
    for (int off = SL >> 1; off > 0; off >>= 1) {
        l += __shfl_xor_sync(gmask, l, off);
        acc.x += __shfl_xor_sync(gmask, acc.x, off);
        acc.y += __shfl_xor_sync(gmask, acc.y, off);
        acc.z += __shfl_xor_sync(gmask, acc.z, off);
        acc.w += __shfl_xor_sync(gmask, acc.w, off);
    }
    if (sl) return;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    __nv_bfloat16 *dst = p.o + seq * p.o_seq + (long long)(r / p.group) * p.o_tok +
                         (long long)(hkv * p.group + r % p.group) * p.d + 4 * c;
    *(uint2 *)dst = make_uint2(pack_bf16(acc.x * inv, acc.y * inv), pack_bf16(acc.z * inv, acc.w * inv));
}

} // namespace nib

#endif
