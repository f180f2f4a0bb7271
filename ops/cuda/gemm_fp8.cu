/* gemm_fp8.cu — nib's FP8 W8A8 GEMM on Hopper's warpgroup MMA (wgmma, sm_90a):
 *   Y[m, n] = bf16( (Σ_k Xq[m, k] · Wq[n, k]) · sx[m] · sw[n] + bias[n] + C[m, n] )
 * with e4m3 codes, fp32 scales (per token / per channel, or one), an optional bf16 bias and an
 * optional bf16 C (the residual; it may be Y itself), one rounding to bf16.
 *
 * Why it exists: with per-token and per-channel scales cuBLASLt 13 offers one FP8 algorithm on
 * H100 (128 x 128 tiles), which fills 36-108 of the 132 SMs at the SigLIP shapes (M = 512) and
 * the small Gemma prefix products; this kernel picks its tile per shape (ops/gemm_plan.c,
 * nib_fp8_plan_for) so one wave covers the GPU. It is nib's first wgmma + TMA kernel.
 * Status: the model's engine for the W8A8 products where it measured faster than cuBLASLt
 * (ops/gemm_plan.c, nib_fp8_use_nib: most SigLIP and Gemma-2B products; not K = 16384 nor the
 * gate|up at row counts that fill cuBLASLt's 256-row tiles). What made it so (ninth session,
 * docs/design.md): M tiles fastest in the grid (W streamed from DRAM once per wave instead of once
 * per M tile), the epilogue through shared memory (its scale loads and 4-byte stores took a third
 * to a half of the consumers' time), 3-warpgroup tiles of 192 rows; 2048 -> 32768 at M = 532
 * went from 126 us (best tile) to 69 us (cuBLASLt 79). `nib bench gemm --variants fp8-nib [--sweep]` times it.
 *
 * W multicast (cm > 1, lab tiles): a cluster of cm CTAs along M (one n0) each load 1 / cm of the
 * W tile and multicast it to all; a stage is refilled once one thread per consumer warpgroup of
 * every CTA has arrived on the loader's empty barrier (remote arrive, default CTA-scope release:
 * the first version used .release.cluster arrivals and .acquire.cluster polls and ran 2x slower).
 * K split (ks > 1, lab tiles): ks CTAs of one cluster take consecutive ranges of the K blocks;
 * after both cluster barriers ranks 1.. have stored their sums into rank 0's (idle) stage buffers
 * through distributed shared memory and rank 0 adds them in rank order: deterministic.
 * CTA: WG (1-3) consumer warpgroups (BM = 64 WG token rows) x BN output channels, plus one
 * producer warp. Per 128-byte K block a stage holds the X tile (BM x 128) and the W tile (BN x 128) in
 * the 128-byte swizzled K-major layout of wgmma.cuh, written by TMA (2-D tensor maps encoded
 * per call on the host; rows past M / N and bytes past K arrive as zeros). Ring of ST stages
 * with two mbarriers each: "full" (the producer's expect-tx, completed by the TMA bytes) and
 * "empty" (one arrival per consumer warp once its wgmma group reading the stage has retired;
 * each warpgroup keeps one group in flight, so block kb - 1's stage is released after block kb's
 * products are issued).
 * Accumulation is the tensor cores' (no promotion: cuBLASLt's FAST_ACCUM semantics).
 * PDL: the weight part of the first blocks is requested before griddepcontrol.wait (weights are
 * never written by a kernel of the call), the activations after it.
 * Tested by tests/test_gemm_gpu.c (gemm_fp8_gpu_*), timed by `nib bench gemm --variants fp8-nib`.
 */
#include <cuda.h> /* CUtensorMap (the encoder is reached through the runtime: no -lcuda) */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/gelu.cuh"
#include "ops/cuda/gemm_lowbit.cuh" /* smem_u32 */
#include "ops/cuda/tmap.h"
#include "ops/cuda/wgmma.cuh"
#include "ops/gemm.h"
#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/ktrace.cuh"
#include "runtime/launch.cuh"

using namespace nib;

namespace {

struct Fp8Args {
    const uint8_t *x, *w;
    const float *sx, *sw;
    const __nv_bfloat16 *bias, *c;
    __nv_bfloat16 *y;
    int m, n, k, ldc, ldy;
    int sx_vec, sw_vec;
    int gh; /* GeGLU: the output width H (W rows: gate [0, H), up [H, 2H)); 0: a plain product */
    int ft; /* GeGLU with gelu_tanh_approx (gelu.cuh: h goes to FP8 next; NIB_FAST_TANH) */
    int cpre; /* NIB_FP8_EPI_CPRE=1: every C chunk of a thread loaded before its first store (epilogue) */
};

/* the tile's column scales and bias (0 past N) into shared memory, by the consumer threads, then
 * a barrier among them (named barrier 1; the producer warp is not part of it). The epilogue reads
 * them from there: loaded from global memory inside its loop, every load waited behind the
 * previous column's stores (they may alias), and the epilogue took half of the consumers' time at
 * 2048 -> 32768 (Nsight Compute source samples). */
template <int WG, int BN>
__device__ __forceinline__ void load_columns(const Fp8Args &p, int n0, float *s_sw, float *s_b) {
    for (int i = threadIdx.x; i < BN; i += 128 * WG) {
        /* GeGLU: the tile's first BN / 2 columns are gate channels n0.., the rest up channels
         * H + n0.. */
        const int col = !p.gh ? n0 + i : i < BN / 2 ? n0 + i : p.gh + n0 + i - BN / 2;
        const bool in = !p.gh ? col < p.n : n0 + (i < BN / 2 ? i : i - BN / 2) < p.gh;
        float w = 0.f, b = 0.f;
        if (in) {
            w = p.sw[p.sw_vec ? col : 0];
            if (p.bias) b = __bfloat162float(p.bias[col]);
        }
        s_sw[i] = w, s_b[i] = b;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(128 * WG) : "memory");
}

/* fp32 row pitch of the staged output tile: BN + pad, = 8 (mod 32) words, so the float2 writes of
 * the accumulator fragment (a half-warp: 4 rows x 4 column pairs) hit 32 distinct banks */
template <int BN> struct StagePitch {
    static constexpr int value = BN + ((8 - BN % 32) + 32) % 32;
};

/* one 8-column chunk of the epilogue's second pass: the staged fp32 values (src), + C (cc, the chunk's 8 bf16
 * values, where hc), one rounding, a 16-byte store to y */
__device__ __forceinline__ void finish_chunk8(const float *src, bool hc, uint4 cc, __nv_bfloat16 *y) {
    const float4 v0 = *(const float4 *)src, v1 = *(const float4 *)(src + 4);
    float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    if (hc) {
        const uint32_t cw[4] = {cc.x, cc.y, cc.z, cc.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const __nv_bfloat162 c2 = *(const __nv_bfloat162 *)&cw[q];
            v[2 * q] += __low2float(c2), v[2 * q + 1] += __high2float(c2);
        }
    }
    uint32_t o[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const __nv_bfloat162 y2 = __floats2bfloat162_rn(v[2 * q], v[2 * q + 1]);
        o[q] = *(const uint32_t *)&y2;
    }
    *(uint4 *)y = make_uint4(o[0], o[1], o[2], o[3]);
}

/* epilogue, in two passes through shared memory (the stage ring, idle once every consumer is past
 * its K loop): (1) each thread writes acc * sx[row] * sw[col] + bias[col] (fp32) of its fragment
 * into the warpgroup's 64 x BN tile; (2) after a warpgroup barrier the warpgroup walks its tile in
 * row-major 8-column chunks: C (16 bytes, coalesced) added, one rounding, 16-byte stores. Stored
 * straight from the fragment (4-byte stores of half sectors, 8 rows per instruction, and the scale
 * loads queued behind them) the epilogue took a third to a half of the consumers' time at
 * 2048 -> 32768 (Nsight Compute source samples). C may be Y: each chunk is read before it is
 * written, by the same thread. */
template <int WG, int BN>
__device__ __forceinline__ void epilogue(const Fp8Args &p, const float (&acc)[BN / 2], int m0, int n0, int wg, int warp,
                                         int lane, const float *s_sw, const float *s_b, float *stage) {
    constexpr int P = StagePitch<BN>::value, CH = BN / 8;
    float *t = stage + wg * 64 * P; /* this warpgroup's rows */
    const int rl = (warp & 3) * 16 + (lane >> 2), c0 = 2 * (lane & 3);
    float sxr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = m0 + wg * 64 + rl + 8 * h;
        sxr[h] = r < p.m ? p.sx[p.sx_vec ? r : 0] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < CH; j++) {
        const float2 w = *(const float2 *)(s_sw + 8 * j + c0), b = *(const float2 *)(s_b + 8 * j + c0);
#pragma unroll
        for (int h = 0; h < 2; h++)
            *(float2 *)(t + (rl + 8 * h) * P + 8 * j + c0) =
                make_float2(acc[4 * j + 2 * h] * (sxr[h] * w.x) + b.x, acc[4 * j + 2 * h + 1] * (sxr[h] * w.y) + b.y);
    }
    asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory");
    const int tw = threadIdx.x & 127;
    if (p.gh) { /* GeGLU: output chunk ch from gate columns 8 ch.. and up columns BN / 2 + 8 ch.. */
        constexpr int CH2 = BN / 16;
#pragma unroll
        for (int i = 0; i < (64 * CH2 + 127) / 128; i++) {
            const int c = tw + 128 * i;
            if (c >= 64 * CH2) break;
            const int row = c / CH2, ch = c - row * CH2;
            const int gr = m0 + wg * 64 + row, col = n0 + 8 * ch;
            if (gr >= p.m || col >= p.gh) continue; /* H is a multiple of 8 */
            const float *g = t + row * P + 8 * ch, *u = g + BN / 2;
            float o[8];
#pragma unroll
            for (int q = 0; q < 8; q++) o[q] = __fmul_rn(p.ft ? gelu_tanh_approx(g[q]) : gelu_tanh_f(g[q]), u[q]);
            uint32_t w[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const __nv_bfloat162 y2 = __floats2bfloat162_rn(o[2 * q], o[2 * q + 1]);
                w[q] = *(const uint32_t *)&y2;
            }
            *(uint4 *)(p.y + (size_t)gr * p.ldy + col) = make_uint4(w[0], w[1], w[2], w[3]);
        }
        return;
    }
    constexpr int IT = (64 * CH + 127) / 128; /* chunks per thread */
    if (p.c && p.cpre) {
        /* NIB_FP8_EPI_CPRE=1 (the default since the sixtieth session: SigLIP -0.02 ms a call at 2-3 cameras): C may be
         * Y, so the compiler keeps each chunk's C load behind the previous chunk's store, and the in-order warp cannot
         * issue that store before its own C load returns: IT chained L2 round trips per thread (6 for SigLIP's o at 512
         * rows: 96-column tiles). Here the thread's C chunks are loaded in batches of up to CB (CB 16-byte registers;
         * the accumulators are dead), then finished and stored: the same additions and rounding, ceil(IT / CB) round
         * trips. CB = 8 keeps the three-warpgroup tiles (152 registers a thread) free of spills. Each chunk is still
         * read before it is written, by the same thread. */
        constexpr int CB = 8;
#pragma unroll
        for (int i0 = 0; i0 < IT; i0 += CB) {
            uint4 cc[CB];
#pragma unroll
            for (int j = 0; j < CB; j++) {
                const int c = tw + 128 * (i0 + j), row = c / CH, ch = c - row * CH;
                const int gr = m0 + wg * 64 + row, col = n0 + 8 * ch;
                cc[j] = make_uint4(0u, 0u, 0u, 0u);
                if (i0 + j < IT && c < 64 * CH && gr < p.m && col < p.n)
                    cc[j] = *(const uint4 *)(p.c + (size_t)gr * p.ldc + col);
            }
#pragma unroll
            for (int j = 0; j < CB; j++) {
                const int c = tw + 128 * (i0 + j);
                if (i0 + j >= IT || c >= 64 * CH) break;
                const int row = c / CH, ch = c - row * CH;
                const int gr = m0 + wg * 64 + row, col = n0 + 8 * ch;
                if (gr >= p.m || col >= p.n) continue;
                finish_chunk8(t + row * P + 8 * ch, true, cc[j], p.y + (size_t)gr * p.ldy + col);
            }
        }
        return;
    }
    /* fully unrolled (the accumulators are dead by now): the shared-memory loads of every chunk
     * can issue ahead of the stores */
#pragma unroll
    for (int i = 0; i < IT; i++) {
        const int c = tw + 128 * i;
        if (c >= 64 * CH) break;
        const int row = c / CH, ch = c - row * CH;
        const int gr = m0 + wg * 64 + row, col = n0 + 8 * ch;
        if (gr >= p.m || col >= p.n) continue; /* N is a multiple of 8: the whole chunk is in or out */
        const uint4 cc = p.c ? *(const uint4 *)(p.c + (size_t)gr * p.ldc + col) : make_uint4(0u, 0u, 0u, 0u);
        finish_chunk8(t + row * P + 8 * ch, p.c != nullptr, cc, p.y + (size_t)gr * p.ldy + col);
    }
}

/* the producer warp: the whole warp walks the K blocks and waits, lane 0 issues the TMA loads;
 * the weights of the first stages before the grid dependency, X after it */
/* the W part of one stage: the W tile, a multicast slice of it, or (GeGLU, gh > 0) its gate half
 * (rows n0..) and up half (rows gh + n0..) as two boxes of BN / 2 rows */
template <int WG, int BN, int CM>
__device__ __forceinline__ void load_w(const CUtensorMap &tmw, uint32_t stage, int kc, int n0, int gh, uint32_t mrank,
                                       uint32_t bar) {
    constexpr int WS = CM > 1 ? ((BN + CM - 1) / CM + 7) / 8 * 8 : BN;
    constexpr int A_BYTES = 64 * WG * 128;
    if (CM > 1) tma_load_2d_mc(stage + A_BYTES + mrank * WS * 128, &tmw, kc, n0 + (int)mrank * WS, bar, (1u << CM) - 1);
    else if (gh) {
        tma_load_2d(stage + A_BYTES, &tmw, kc, n0, bar);
        tma_load_2d(stage + A_BYTES + (BN / 2) * 128, &tmw, kc, gh + n0, bar);
    } else tma_load_2d(stage + A_BYTES, &tmw, kc, n0, bar);
}

template <int WG, int BN, int ST, int KS, int CM>
__device__ __forceinline__ void producer(const CUtensorMap &tmx, const CUtensorMap &tmw, uint32_t sbase,
                                         uint32_t full0, uint32_t empty0, int lane, int n0, int m0, int kb0, int nk,
                                         uint32_t mrank, int gh) {
    constexpr int WS = CM > 1 ? ((BN + CM - 1) / CM + 7) / 8 * 8 : BN;
    constexpr int A_BYTES = 64 * WG * 128, STAGE = A_BYTES + WS * CM * 128;
    const bool issue = lane == 0;
    const int pre = nk < ST ? nk : ST;
    if (issue)
        for (int kb = 0; kb < pre; kb++) {
            mbar_arrive_expect_tx(full0 + 8 * kb, STAGE);
            load_w<WG, BN, CM>(tmw, sbase + kb * STAGE, (kb0 + kb) * 128, n0, gh, mrank, full0 + 8 * kb);
        }
    pdl_wait();
    pdl_trigger();
    if (issue)
        for (int kb = 0; kb < pre; kb++) tma_load_2d(sbase + kb * STAGE, &tmx, (kb0 + kb) * 128, m0, full0 + 8 * kb);
    __syncwarp();
    for (int kb = ST; kb < nk; kb++) {
        const int s = kb % ST;
        mbar_wait(empty0 + 8 * s, ((kb / ST) & 1) ^ 1);
        if (issue) {
            mbar_arrive_expect_tx(full0 + 8 * s, STAGE);
            load_w<WG, BN, CM>(tmw, sbase + s * STAGE, (kb0 + kb) * 128, n0, gh, mrank, full0 + 8 * s);
            tma_load_2d(sbase + s * STAGE, &tmx, (kb0 + kb) * 128, m0, full0 + 8 * s);
        }
        __syncwarp();
    }
}

template <int WG, int BN, int ST, int KS, int CM>
__global__ void __launch_bounds__(WG * 128 + 32, 1)
    k_gemm_fp8(const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw, const Fp8Args p) {
    /* CM > 1: each CTA loads WS rows of the W tile (whole 8-row swizzle atoms) and multicasts
     * them; the last slice may run past BN into rows the stage has room for and nothing reads */
    constexpr int WS = CM > 1 ? ((BN + CM - 1) / CM + 7) / 8 * 8 : BN;
    constexpr int BM = 64 * WG, A_BYTES = BM * 128, STAGE = A_BYTES + WS * CM * 128, NC = 128 * WG;
    static_assert(WG >= 1 && WG <= 3 && BN % 8 == 0 && BN <= 256 && ST >= 2, "tile");
    static_assert(KS >= 1 && KS <= 4 && (size_t)(KS - 1) * NC * (BN / 2) * 4 <= (size_t)ST * STAGE,
                  "the K split's partial sums fit in rank 0's stage buffers");
    static_assert(CM == 1 || KS == 1, "W multicast and a K split are not combined");
    static_assert((size_t)BM * StagePitch<BN>::value * 4 <= (size_t)ST * STAGE, "the staged output fits in the ring");
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t bars[2 * ST]; /* full[ST] (TMA landed), empty[ST] (consumers done) */
    const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u; /* swizzle atoms: 1024-aligned */
    const uint32_t full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[ST]);
    const int tid = threadIdx.x, warp = nib::warp_id(), wg = warp >> 2, lane = tid & 31;
    /* M tiles are the fastest grid dimension: the CTAs resident at once share few W tiles, so W
     * streams from DRAM about once (N fastest streamed all of W once per M tile) */
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * (p.gh ? BN / 2 : BN); /* GeGLU: output channels */
    /* KS > 1: the cluster's KS CTAs (blockIdx.z = rank) take consecutive ranges of the K blocks;
     * ranks 1.. add their sums into rank 0's shared memory, which adds them in rank order */
    const int nkt = (p.k + 127) >> 7, kz = KS > 1 ? (int)blockIdx.z : 0;
    const int kb0 = nkt * kz / KS, nk = nkt * (kz + 1) / KS - kb0;
    /* CM > 1: the cluster's CM CTAs (consecutive along M, same n0) each load BN / CM rows of the
     * W tile and multicast them to all; a stage is free once every CTA's consumers are done */
    const uint32_t mrank = CM > 1 ? cluster_ctarank() : 0;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full0 + 8 * s, 1);
            /* lane 0 of each consumer warp; with CM > 1 one thread per consumer warpgroup of each
             * CTA of the cluster */
            mbar_init(empty0 + 8 * s, CM > 1 ? WG * CM : 4 * WG);
        }
        mbar_init_fence();
    }
    if (CM > 1) cluster_sync(); /* every CTA's barriers exist before anyone multicasts into it */
    else __syncthreads();

    if (warp == 4 * WG) {
        producer<WG, BN, ST, KS, CM>(tmx, tmw, sbase, full0, empty0, lane, n0, m0, kb0, nk, mrank, p.gh);
        if (KS > 1) { /* the producer warp takes part in the cluster's two barriers */
            cluster_sync();
            cluster_sync();
        }
        if (CM > 1) cluster_sync(); /* and in the final one */
        return;
    }
    pdl_wait(); /* the epilogue reads C, which the previous kernel may have written */
    __shared__ __align__(16) float s_sw[BN], s_b[BN];
    load_columns<WG, BN>(p, n0, s_sw, s_b);
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
    for (int kb = 0; kb < nk; kb++) {
        const int s = kb % ST;
        mbar_wait(full0 + 8 * s, (kb / ST) & 1);
        const uint32_t sa = sbase + s * STAGE + wg * 64 * 128, sb = sbase + s * STAGE + A_BYTES;
        wgmma_fence();
#pragma unroll
        for (int q = 0; q < 4; q++) WgmmaE4M3<BN>::mma(acc, wgmma_desc_sw128(sa + q * 32), wgmma_desc_sw128(sb + q * 32));
        wgmma_commit();
        wgmma_wait<1>(); /* block kb - 1's products are done: its stage may be refilled */
        if (kb > 0) {
            const uint32_t e = empty0 + 8 * ((kb - 1) % ST);
            if (CM == 1) {
                if (lane == 0) mbar_arrive(e);
            } else if ((tid & 127) < CM) {
                mbar_arrive_remote(e, (uint32_t)(tid & 127)); /* thread j of a warpgroup: CTA j */
            }
        }
    }
    wgmma_wait<0>();
    wgmma_fence_operand(acc); /* the accumulators are read below: not before the wait */
    if (KS > 1) {
        /* every CTA of the cluster is past its K loop (rank 0's stages are free and its TMA
         * writes landed); ranks 1.. store their sums into rank 0's stage buffers, element i of
         * consumer thread t at [rank - 1][i][t]; then rank 0 adds them in rank order */
        cluster_sync();
        if (kz > 0) {
            const uint32_t dst = cluster_map(sbase, 0) + (uint32_t)(((kz - 1) * (BN / 2)) * NC + tid) * 4u;
#pragma unroll
            for (int i = 0; i < BN / 2; i++) st_cluster_f32(dst + (uint32_t)(i * NC) * 4u, acc[i]);
        }
        cluster_sync();
        if (kz > 0) return;
        const float *part = (const float *)(smem_raw + (sbase - smem_u32(smem_raw)));
#pragma unroll 1
        for (int r = 1; r < KS; r++)
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[i] += part[((r - 1) * (BN / 2) + i) * NC + tid];
    }
    /* every consumer is past the K loop (and, with a K split, has read its partial sums) before
     * the ring is overwritten by the staged output */
    asm volatile("bar.sync 1, %0;" ::"n"(NC) : "memory");
    epilogue<WG, BN>(p, acc, m0, n0, wg, warp, lane, s_sw, s_b, (float *)(smem_raw + (sbase - smem_u32(smem_raw))));
    if (CM > 1) cluster_sync(); /* no CTA leaves while a peer may still arrive on its barriers */
}

/* NIB_FP8_PERSIST=1 (the default; GeGLU products on a tile without a K split or multicast): k_gemm_fp8_pt, one CTA per
 * resident slot walking the tiles in k_gemm_fp8's grid order (M tiles fastest; tile t of blockIdx.x, + gridDim.x,
 * ...). Its producer warp runs on into the next tile's K blocks while the consumers finish a tile, so the ring is
 * refilled under the epilogue instead of after the CTA's exit and the next CTA's start (the prefix's gate|up at 2
 * cameras: 3 x 171 tiles of 192 x 192 on 132 SMs, one CTA an SM: four waves, each with its ring fill and epilogue
 * exposed). The ring is the producer's throughout, so the epilogue is GeGLU from the accumulator registers (gate
 * column c and up column BN / 2 + c of the tile are held by the same thread of the fragment) with 4-byte stores of
 * bf16 pairs: the same fp32 operations, one rounding, so the same bits as k_gemm_fp8's staged GeGLU epilogue. The
 * ring's stage and phase continue across tiles (one block counter g). */
template <int WG, int BN, int ST>
__device__ __forceinline__ void producer_pt(const CUtensorMap &tmx, const CUtensorMap &tmw, uint32_t sbase,
                                            uint32_t full0, uint32_t empty0, int lane, int nk, int mtiles, int tiles,
                                            int gh) {
    constexpr int A_BYTES = 64 * WG * 128, STAGE = A_BYTES + BN * 128, BM = 64 * WG;
    const bool issue = lane == 0;
    int g = 0; /* K blocks issued so far, over every tile of this CTA */
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int m0 = (t % mtiles) * BM, n0 = (t / mtiles) * (BN / 2);
        int kb = 0;
        if (g == 0) { /* the first tile: the weights of the first stages before the grid dependency, X after it */
            const int pre = nk < ST ? nk : ST;
            if (issue)
                for (int b = 0; b < pre; b++) {
                    mbar_arrive_expect_tx(full0 + 8 * b, STAGE);
                    load_w<WG, BN, 1>(tmw, sbase + b * STAGE, b * 128, n0, gh, 0, full0 + 8 * b);
                }
            pdl_wait();
            pdl_trigger();
            if (issue)
                for (int b = 0; b < pre; b++) tma_load_2d(sbase + b * STAGE, &tmx, b * 128, m0, full0 + 8 * b);
            __syncwarp();
            kb = pre, g = pre;
        }
        for (; kb < nk; kb++, g++) {
            const int s = g % ST;
            if (g >= ST) mbar_wait(empty0 + 8 * s, ((g / ST) & 1) ^ 1);
            if (issue) {
                mbar_arrive_expect_tx(full0 + 8 * s, STAGE);
                load_w<WG, BN, 1>(tmw, sbase + s * STAGE, kb * 128, n0, gh, 0, full0 + 8 * s);
                tma_load_2d(sbase + s * STAGE, &tmx, kb * 128, m0, full0 + 8 * s);
            }
            __syncwarp();
        }
    }
}

/* the GeGLU epilogue from the fragment: rows rl and rl + 8 of the warpgroup's 64, columns 8 j + c0 (+1) */
template <int WG, int BN>
__device__ __forceinline__ void epilogue_geglu_regs(const Fp8Args &p, const float (&acc)[BN / 2], int m0, int n0,
                                                    int wg, int warp, int lane, const float *s_sw, const float *s_b) {
    constexpr int HJ = BN / 16; /* 8-column groups of gate (then of up) */
    const int rl = (warp & 3) * 16 + (lane >> 2), c0 = 2 * (lane & 3);
    float sxr[2];
    int gr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        gr[h] = m0 + wg * 64 + rl + 8 * h;
        sxr[h] = gr[h] < p.m ? p.sx[p.sx_vec ? gr[h] : 0] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < HJ; j++) {
        const int col = n0 + 8 * j + c0; /* H is a multiple of 8, col even: the pair is in or out */
        const float2 wg2 = *(const float2 *)(s_sw + 8 * j + c0), bg2 = *(const float2 *)(s_b + 8 * j + c0);
        const float2 wu2 = *(const float2 *)(s_sw + BN / 2 + 8 * j + c0),
                     bu2 = *(const float2 *)(s_b + BN / 2 + 8 * j + c0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float g0 = acc[4 * j + 2 * h] * (sxr[h] * wg2.x) + bg2.x,
                        g1 = acc[4 * j + 2 * h + 1] * (sxr[h] * wg2.y) + bg2.y;
            const float u0 = acc[4 * (j + HJ) + 2 * h] * (sxr[h] * wu2.x) + bu2.x,
                        u1 = acc[4 * (j + HJ) + 2 * h + 1] * (sxr[h] * wu2.y) + bu2.y;
            const float o0 = __fmul_rn(p.ft ? gelu_tanh_approx(g0) : gelu_tanh_f(g0), u0);
            const float o1 = __fmul_rn(p.ft ? gelu_tanh_approx(g1) : gelu_tanh_f(g1), u1);
            if (gr[h] < p.m && col < p.gh)
                *(__nv_bfloat162 *)(p.y + (size_t)gr[h] * p.ldy + col) = __floats2bfloat162_rn(o0, o1);
        }
    }
}

template <int WG, int BN, int ST>
__global__ void __launch_bounds__(WG * 128 + 32, 1)
    k_gemm_fp8_pt(const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw, const Fp8Args p) {
    constexpr int BM = 64 * WG, A_BYTES = BM * 128, STAGE = A_BYTES + BN * 128, NC = 128 * WG;
    constexpr int NCOL = (BN + NC - 1) / NC; /* tile columns per consumer thread (scales, bias) */
    static_assert(WG >= 1 && WG <= 3 && BN % 16 == 0 && BN <= 256 && ST >= 2, "tile");
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t bars[2 * ST];
    const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[ST]);
    const int tid = threadIdx.x, warp = nib::warp_id(), wg = warp >> 2, lane = tid & 31;
    const int nk = (p.k + 127) >> 7, mtiles = (p.m + BM - 1) / BM, tiles = mtiles * ((p.gh + BN / 2 - 1) / (BN / 2));
    NIB_KT(NIB_KT_PT, NIB_KT_ENTRY);
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 4 * WG); /* lane 0 of each consumer warp */
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (warp == 4 * WG) {
        producer_pt<WG, BN, ST>(tmx, tmw, sbase, full0, empty0, lane, nk, mtiles, tiles, p.gh);
        return;
    }
    pdl_wait(); /* Y may still be read by the previous kernel */
    NIB_KT(NIB_KT_PT, NIB_KT_WAITED);
    NIB_KT_EXIT_GUARD(NIB_KT_PT);
    /* the tile's column scales and bias, double-buffered by tile parity: buffer b is rewritten two tiles after it was
     * read, and every consumer passed the barrier between (after the tile in between's K loop) */
    __shared__ __align__(16) float s_sw[2][BN], s_b[2][BN];
    int g = 0, it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x, it++) {
        const int m0 = (t % mtiles) * BM, n0 = (t / mtiles) * (BN / 2);
        float cw[NCOL], cb[NCOL]; /* loaded before the K loop, stored to shared memory after it */
#pragma unroll
        for (int c = 0; c < NCOL; c++) {
            const int i = tid + c * NC;
            cw[c] = 0.f, cb[c] = 0.f;
            if (i < BN && n0 + (i < BN / 2 ? i : i - BN / 2) < p.gh) {
                const int col = i < BN / 2 ? n0 + i : p.gh + n0 + i - BN / 2;
                cw[c] = p.sw[p.sw_vec ? col : 0];
                if (p.bias) cb[c] = __bfloat162float(p.bias[col]);
            }
        }
        float acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
        for (int kb = 0; kb < nk; kb++) {
            const int gg = g + kb, s = gg % ST;
            mbar_wait(full0 + 8 * s, (gg / ST) & 1);
            const uint32_t sa = sbase + s * STAGE + wg * 64 * 128, sb = sbase + s * STAGE + A_BYTES;
            wgmma_fence();
#pragma unroll
            for (int q = 0; q < 4; q++)
                WgmmaE4M3<BN>::mma(acc, wgmma_desc_sw128(sa + q * 32), wgmma_desc_sw128(sb + q * 32));
            wgmma_commit();
            wgmma_wait<1>(); /* block gg - 1's products are done: its stage may be refilled */
            if (kb > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((gg - 1) % ST));
        }
        wgmma_wait<0>();
        wgmma_fence_operand(acc);
        if (lane == 0) mbar_arrive(empty0 + 8 * ((g + nk - 1) % ST)); /* the tile's last block */
        g += nk;
#pragma unroll
        for (int c = 0; c < NCOL; c++) {
            const int i = tid + c * NC;
            if (i < BN) s_sw[it & 1][i] = cw[c], s_b[it & 1][i] = cb[c];
        }
        asm volatile("bar.sync 1, %0;" ::"n"(NC) : "memory");
        epilogue_geglu_regs<WG, BN>(p, acc, m0, n0, wg, warp, lane, s_sw[it & 1], s_b[it & 1]);
    }
}

/* k_gemm_fp8_pp (by rule, nib_fp8_geglu_pp; NIB_FP8_PP=0 turns it off, NIB_FP8_PP=<rows>x<cols> forces a tile): the
 * GeGLU product on a persistent ping-pong kernel. Three warpgroups: the first is the producer (one warp issues the TMA
 * loads of producer_pt; the warpgroup gives its registers back with setmaxnreg), the other two are consumers that take the CTA's tiles alternately, each a whole
 * tile of 64 MW rows x BN weight rows (gate BN / 2 | up BN / 2) on its own (MW m64 accumulator sets of BN / 2 registers,
 * up to 232 registers a thread after setmaxnreg). Their K loops take turns (named barriers 2 and 3: a consumer starts
 * its tile's K loop once the other has issued every product of its own), so one warpgroup's GeGLU epilogue runs while
 * the other keeps the tensor cores busy; in k_gemm_fp8_pt every consumer waits in its epilogue together (the
 * sixty-third session's Nsight Compute samples of the prefix's gate|up at 532 rows: 24 % of the consumer warps' samples
 * after the K loop). The turns also keep each consumer's ring waits in order: a consumer that waited on a stage two
 * phases ahead of its barrier would pass at once. The ring, its stage and phase counter, and the tile order are
 * producer_pt's (tile t of the CTA's walk is consumer t % 2's); the epilogue is epilogue_geglu_regs per m64 set.
 * Measured on the H200 (sixty-third session; docs/design.md, bench/results/fp8-pingpong-*-h200.json): the lab's
 * 2048 -> 32768 (`NIB_FP8_PP=... nib bench gemm --variants fp8-nib-geglu --m 276,532,788`) 45.97 / 63.16 / 111.56 us on
 * k_gemm_fp8_pt's picks, 51.24 / 58.85 / 111.81 at 192x128, 45.06 / 67.10 / 98.48 at 128x192, 41.04 / 63.49 / 88.87
 * at 64x256 (cuBLASLt's product alone 36.25 / 58.11 / 79.43). In the model (fast, H = 10): 192x128 at 2 cameras
 * takes the prefix 2.589 / 2.594 -> 2.540 / 2.548 ms with the first flow step kept off the prefix's side
 * (NIB_OVERLAP=0), but 2.687 / 2.686 -> 2.698 / 2.696 with it beside (the default: the call 8.831 / 8.832 -> 8.841 /
 * 8.843); 64x256 fused at every row count is slower at 1-3 cameras (3 cameras 10.11 / 10.13 -> 10.64 / 10.65 ms). The
 * loss was its own early launch under PDL (sixty-fourth session; launch_geglu): launched without the PDL attribute it
 * is the default where nib_fp8_geglu_pp (ops/gemm_plan.c) picks it: 64x256 at one camera (276 rows), 192x128 at two
 * (532). Why the early launch costs (scripts/ktrace.py, 276 rows): the tiles run slower once the blocks are scattered
 * over the SMs (36.8-38.9 us without PDL, every block pair (2i, 2i + 1) on one SM pair; 47.0 with it), not later. A
 * cluster walk that kept each weight slice's M tiles inside one cluster of 2 CTAs was slower still (53.7 us without
 * PDL, 55.2 with it; sixty-sixth session, reverted), so the grid order stays. */
template <int MW, int BN, int ST>
__global__ void __launch_bounds__(384, 1)
    k_gemm_fp8_pp(const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw, const Fp8Args p) {
    constexpr int BM = 64 * MW, A_BYTES = BM * 128, STAGE = A_BYTES + BN * 128;
    constexpr int NCOL = (BN + 127) / 128; /* tile columns per consumer thread (scales, bias) */
    static_assert(MW >= 1 && MW <= 4 && BN % 16 == 0 && BN <= 256 && MW * BN / 2 <= 192 && ST >= 2, "tile");
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t bars[2 * ST];
    const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[ST]);
    const int tid = threadIdx.x, warp = nib::warp_id(), wg = warp >> 2, lane = tid & 31;
    const int nk = (p.k + 127) >> 7, mtiles = (p.m + BM - 1) / BM, tiles = mtiles * ((p.gh + BN / 2 - 1) / (BN / 2));
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 4); /* lane 0 of each warp of the consumer that read the stage */
        }
        mbar_init_fence();
    }
    NIB_KT(NIB_KT_PP, NIB_KT_ENTRY);
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        if (warp == 0) producer_pt<MW, BN, ST>(tmx, tmw, sbase, full0, empty0, lane, nk, mtiles, tiles, p.gh);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    const int c = wg - 1, ct = tid - 128 - 128 * c; /* consumer c, its thread 0..127 */
    pdl_wait(); /* Y may still be read by the previous kernel */
    NIB_KT_ONE(ct == 0 && c == 0, NIB_KT_PP, NIB_KT_WAITED);
    /* the tile's column scales and bias, per consumer, double-buffered by the consumer's tile parity (buffer b is
     * rewritten two of its tiles later, after the consumer's barrier of the tile in between) */
    __shared__ __align__(16) float s_sw[2][2][BN], s_b[2][2][BN];
    const int ntl = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x; /* the CTA's tiles */
    for (int it = c, j = 0; it < ntl; it += 2, j++) {
        const int t = (int)blockIdx.x + it * (int)gridDim.x;
        const int m0 = (t % mtiles) * BM, n0 = (t / mtiles) * (BN / 2);
        const int g = it * nk; /* the ring's block count at this tile's first block */
        float cw[NCOL], cb[NCOL]; /* loaded before the K loop, stored to shared memory after it */
#pragma unroll
        for (int q = 0; q < NCOL; q++) {
            const int i = ct + q * 128;
            cw[q] = 0.f, cb[q] = 0.f;
            if (i < BN && n0 + (i < BN / 2 ? i : i - BN / 2) < p.gh) {
                const int col = i < BN / 2 ? n0 + i : p.gh + n0 + i - BN / 2;
                cw[q] = p.sw[p.sw_vec ? col : 0];
                if (p.bias) cb[q] = __bfloat162float(p.bias[col]);
            }
        }
        float acc[MW][BN / 2];
#pragma unroll
        for (int w = 0; w < MW; w++)
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[w][i] = 0.f;
        /* the other consumer has issued every product of the tile before this one */
        if (it > 0) asm volatile("bar.sync %0, 256;" ::"r"(2 + c) : "memory");
        for (int kb = 0; kb < nk; kb++) {
            const int gg = g + kb, s = gg % ST;
            mbar_wait(full0 + 8 * s, (gg / ST) & 1);
            const uint32_t sa = sbase + s * STAGE, sb = sbase + s * STAGE + A_BYTES;
            wgmma_fence();
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
                for (int w = 0; w < MW; w++)
                    WgmmaE4M3<BN>::mma(acc[w], wgmma_desc_sw128(sa + w * 64 * 128 + q * 32), wgmma_desc_sw128(sb + q * 32));
            wgmma_commit();
            wgmma_wait<1>(); /* block gg - 1's products are done: its stage may be refilled */
            if (kb > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((gg - 1) % ST));
        }
        /* the next tile's consumer may start its K loop */
        if (it + 1 < ntl) asm volatile("bar.arrive %0, 256;" ::"r"(2 + (c ^ 1)) : "memory");
        wgmma_wait<0>();
#pragma unroll
        for (int w = 0; w < MW; w++) wgmma_fence_operand(acc[w]);
        if (lane == 0) mbar_arrive(empty0 + 8 * ((g + nk - 1) % ST)); /* the tile's last block */
#pragma unroll
        for (int q = 0; q < NCOL; q++) {
            const int i = ct + q * 128;
            if (i < BN) s_sw[c][j & 1][i] = cw[q], s_b[c][j & 1][i] = cb[q];
        }
        asm volatile("bar.sync %0, 128;" ::"r"(4 + c) : "memory");
#pragma unroll
        for (int w = 0; w < MW; w++)
            epilogue_geglu_regs<1, BN>(p, acc[w], m0 + 64 * w, n0, 0, warp, lane, s_sw[c][j & 1], s_b[c][j & 1]);
    }
    NIB_KT_ONE(ct == 0, NIB_KT_PP, c ? NIB_KT_EXIT_C1 : NIB_KT_EXIT_C0);
}

typedef void (*KernFn)(const CUtensorMap, const CUtensorMap, const Fp8Args);
struct TileKern {
    nib_fp8_tile t;
    KernFn fn;
    int attr_set;
};
#define NIB_FP8_TILE(WG, BN, ST, KS, CM) {{WG, BN, ST, KS, CM}, k_gemm_fp8<WG, BN, ST, KS, CM>, 0}
/* the instantiated tiles (nib_fp8_tiles lists the same, host-side, for the planner) */
TileKern g_tiles[] = {
    NIB_FP8_TILE(1, 64, 6, 1, 1),  NIB_FP8_TILE(1, 72, 6, 1, 1),  NIB_FP8_TILE(1, 96, 5, 1, 1),
    NIB_FP8_TILE(1, 128, 4, 1, 1), NIB_FP8_TILE(2, 64, 4, 1, 1),  NIB_FP8_TILE(2, 96, 4, 1, 1),
    NIB_FP8_TILE(2, 112, 4, 1, 1), NIB_FP8_TILE(2, 128, 5, 1, 1), NIB_FP8_TILE(2, 144, 4, 1, 1),
    NIB_FP8_TILE(2, 192, 4, 1, 1), NIB_FP8_TILE(2, 256, 4, 1, 1), NIB_FP8_TILE(2, 128, 5, 2, 1),
    NIB_FP8_TILE(2, 128, 5, 3, 1), NIB_FP8_TILE(2, 144, 4, 2, 1), NIB_FP8_TILE(2, 192, 4, 2, 1),
    NIB_FP8_TILE(1, 64, 6, 1, 4),  NIB_FP8_TILE(1, 64, 6, 1, 8),  NIB_FP8_TILE(1, 128, 4, 1, 4),
    NIB_FP8_TILE(2, 64, 4, 1, 4),  NIB_FP8_TILE(2, 96, 4, 1, 4),  NIB_FP8_TILE(2, 128, 5, 1, 2),
    NIB_FP8_TILE(2, 128, 5, 1, 4), NIB_FP8_TILE(2, 256, 4, 1, 2), NIB_FP8_TILE(2, 240, 4, 1, 5),
    NIB_FP8_TILE(2, 256, 4, 1, 8), NIB_FP8_TILE(3, 192, 4, 1, 1), NIB_FP8_TILE(3, 192, 4, 1, 3),
    /* the K-heavy narrow products' tile (nib_fp8_plan_slots: by rule, not by the cost model) */
    NIB_FP8_TILE(1, 128, 8, 1, 4)};
#undef NIB_FP8_TILE
constexpr int N_TILES = (int)(sizeof g_tiles / sizeof g_tiles[0]);

/* k_gemm_fp8_pt's instantiations: every GeGLU tile without a K split or multicast (nib_fp8_tile_geglu, ks = cm = 1) */
struct PtKern {
    int wg, bn, stages;
    KernFn fn;
    int attr_set, per_sm;
};
#define NIB_FP8_PT(WG, BN, ST) {WG, BN, ST, k_gemm_fp8_pt<WG, BN, ST>, 0, 0}
PtKern g_pt[] = {NIB_FP8_PT(1, 64, 6),  NIB_FP8_PT(1, 96, 5),  NIB_FP8_PT(1, 128, 4), NIB_FP8_PT(2, 64, 4),
                 NIB_FP8_PT(2, 96, 4),  NIB_FP8_PT(2, 112, 4), NIB_FP8_PT(2, 128, 5), NIB_FP8_PT(2, 144, 4),
                 NIB_FP8_PT(2, 192, 4), NIB_FP8_PT(2, 256, 4), NIB_FP8_PT(3, 192, 4)};
#undef NIB_FP8_PT
constexpr int N_PT = (int)(sizeof g_pt / sizeof g_pt[0]);

/* k_gemm_fp8_pp's instantiations (NIB_FP8_PP=<rows>x<cols>: a consumer's tile, 64 MW rows x BN weight rows) */
struct PpKern {
    int mw, bn, stages;
    KernFn fn;
    int attr_set;
};
#define NIB_FP8_PP(MW, BN, ST) {MW, BN, ST, k_gemm_fp8_pp<MW, BN, ST>, 0}
PpKern g_pp[] = {NIB_FP8_PP(3, 128, 5), NIB_FP8_PP(2, 192, 5), NIB_FP8_PP(1, 256, 5)};
#undef NIB_FP8_PP
constexpr int N_PP = (int)(sizeof g_pp / sizeof g_pp[0]);
size_t pp_smem(const PpKern *k) { return (size_t)k->stages * (64 * k->mw + k->bn) * 128 + 1024; }

int g_sms;

/* rows x k e4m3 codes, row-major: boxes of box_rows x 128 bytes, 128-byte swizzle, zeros outside */
nib_status encode_rows(CUtensorMap *m, const void *base, int64_t rows, int64_t k, int box_rows, const char *what) {
    return nib_tmap_rows_sw128(m, base, 1, rows, k, k, box_rows, what);
}

} /* namespace */

NIB_KTRACE_UNIT(gemm_fp8)

/* the kernel of a compiled tile, with its shared-memory attribute set */
static nib_status tile_kernel(const nib_fp8_tile *tile, TileKern **out) {
    TileKern *tk = NULL;
    for (int i = 0; i < N_TILES && !tk; i++)
        if (g_tiles[i].t.wg == tile->wg && g_tiles[i].t.bn == tile->bn && g_tiles[i].t.stages == tile->stages &&
            g_tiles[i].t.ks == tile->ks && g_tiles[i].t.cm == tile->cm)
            tk = &g_tiles[i];
    if (!tk)
        return NIB_ERR(NIB_ERR_INVALID_ARG,
                       "fp8 gemm (nib): no kernel for tile %d x %d with %d stages, K split %d, cluster along M %d",
                       64 * tile->wg, tile->bn, tile->stages, tile->ks, tile->cm);
    if (!tk->attr_set) {
        NIB_CUDA_CHECK(cudaFuncSetAttribute(tk->fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)nib_fp8_tile_smem(&tk->t)));
        tk->attr_set = 1;
    }
    *out = tk;
    return NIB_OK;
}

extern "C" nib_status nib_cuda_fp8_tile_slots(const nib_fp8_tile *tile, int *ctas) {
    TileKern *tk;
    NIB_RETURN_IF_ERR(tile_kernel(tile, &tk));
    const int cl = tile->ks * tile->cm;
    if (cl == 1) {
        int per_sm = 0;
        NIB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tk->fn, 128 * tile->wg + 32,
                                                                     nib_fp8_tile_smem(&tk->t)));
        if (!g_sms) {
            nib_device_info d;
            NIB_RETURN_IF_ERR(nib_device_require(&d));
            g_sms = d.sm_count;
        }
        *ctas = per_sm * g_sms;
        return NIB_OK;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = (unsigned)tile->cm;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = (unsigned)tile->ks;
    cfg.gridDim = dim3((unsigned)tile->cm, 1, (unsigned)tile->ks);
    cfg.blockDim = dim3(128 * tile->wg + 32);
    cfg.dynamicSmemBytes = nib_fp8_tile_smem(&tk->t);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    NIB_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, tk->fn, &cfg));
    *ctas = clusters * cl;
    return NIB_OK;
}

static int g_slots[N_TILES]; /* resident CTAs of each tile on this device, for the planner */
static bool g_slots_ready;

extern "C" nib_status nib_cuda_fp8_plan(int64_t m, int64_t n, int64_t k, int geglu, nib_fp8_tile *out) {
    if (!g_sms) {
        nib_device_info d;
        NIB_RETURN_IF_ERR(nib_device_require(&d));
        g_sms = d.sm_count;
    }
    if (!g_slots_ready) {
        nib_fp8_tile order[N_TILES];
        if (nib_fp8_tiles(order, N_TILES) != N_TILES)
            return NIB_ERR(NIB_ERR_INTERNAL, "fp8 gemm (nib): the host tile list and the compiled kernels differ");
        for (int i = 0; i < N_TILES; i++) NIB_RETURN_IF_ERR(nib_cuda_fp8_tile_slots(&order[i], &g_slots[i]));
        g_slots_ready = true;
    }
    nib_fp8_plan_slots(m, n, k, g_sms, g_slots, geglu, out);
    return NIB_OK;
}

/* an on-by-default switch: unset, empty or "1" 1, "0" 0, another value -1 */
static int fp8_switch_env(const char *name) {
    const char *e = getenv(name);
    if (!e || !*e || !strcmp(e, "1")) return 1;
    return strcmp(e, "0") ? -1 : 0;
}

/* NIB_FP8_EPI_CPRE: 1 (the default) loads every C chunk of an epilogue thread before its first store, 0 (the A/B
 * switch) chunk by chunk; -1: another value */
static int fp8_cpre_env(void) { return fp8_switch_env("NIB_FP8_EPI_CPRE"); }

/* NIB_FP8_PERSIST: 1 (the default since the sixty-second session: GeGLU products on k_gemm_fp8_pt where the tile has no
 * K split or multicast; a tile with either runs k_gemm_fp8) or 0 (the A/B switch: k_gemm_fp8 always); -1: another
 * value. H200, `scripts/ab.sh env -n 2 -q -e '' -e NIB_FP8_PERSIST=1 -- pi05 --preset fast --reps 100` (before the
 * default changed): 2 cameras, the prefix's gate|up at 532 rows, 3 x 171 tiles of 192 x 192: H = 10 8.887 / 8.889 ->
 * 8.857 / 8.863 ms, H = 50 10.743 / 10.754 -> 10.713 / 10.725 (prefix column 2.70 -> 2.67); 1 and 3 cameras run
 * cuBLASLt's product there (fused at 276 / 788 rows as well: 0.015 / 0.37 ms slower). NIB_FP8_PERSIST_CTAS=N
 * (tests): at most N CTAs in its grid (so that a CTA walks many tiles at small shapes); 0: unset; -1: not a positive
 * integer */
static int fp8_persist_env(void) { return fp8_switch_env("NIB_FP8_PERSIST"); }

static int fp8_persist_ctas_env(void) {
    const char *e = getenv("NIB_FP8_PERSIST_CTAS");
    if (!e || !*e) return 0;
    char *end;
    const long v = strtol(e, &end, 10);
    return *end || v < 1 || v > 1 << 20 ? -1 : (int)v;
}

/* NIB_FP8_GEGLU_PDL: unset or empty: each persistent GeGLU kernel's default (k_gemm_fp8_pt launched with the PDL
 * attribute, k_gemm_fp8_pp without it); 1 / 0: every one with / without it (the A/B switch); -1: another value.
 * Why the ping-pong kernel goes without (sixty-fourth session, H200, fast, H = 10, `scripts/ab.sh env -n 2 -q`, ms of the
 * prefix column, bench/results/fp8-geglu-pdl-ab-h200.json): at 3 cameras with NIB_OVERLAP=0 NIB_FUSED_GEGLU=1 the
 * 64x256 ping-pong kernel took the prefix 3.643 / 3.652 (persistent kernel) -> 3.827 / 3.835 with the attribute and
 * 3.371 / 3.382 without it; the persistent kernel without it 3.609 / 3.601; its next kernel launched only at its exit
 * (no early trigger) 3.675 / 3.667, no better. So what costs the ping-pong kernel in the graph is its own early launch
 * behind the norm, not the next kernel's (NIB_FP8_GEGLU_TRIGGER=exit was that run's lab switch, not kept). With NIB_PDL=0
 * everywhere: 3.454 / 3.462 against 3.712 / 3.715 (bench/results/fp8-pp-pdl-ab-h200.json). */
static nib_status launch_geglu(KernFn fn, unsigned ctas, unsigned threads, size_t smem, cudaStream_t stream,
                               const CUtensorMap &tmx, const CUtensorMap &tmw, const Fp8Args &p, int pdl_default,
                               const char *name) {
    const char *e = getenv("NIB_FP8_GEGLU_PDL");
    const int pdl = !e || !*e ? pdl_default : fp8_switch_env("NIB_FP8_GEGLU_PDL");
    if (pdl < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FP8_GEGLU_PDL=%s: 1 (the GeGLU kernels launched with PDL) or 0 "
                       "(without); unset: the persistent kernel with, the ping-pong kernel without", e);
    const int was = nib_pdl_suspended();
    if (!pdl) nib_pdl_suspend(1);
    const cudaError_t ce = nib::launch(fn, dim3(ctas), dim3(threads), smem, stream, tmx, tmw, p);
    nib_pdl_suspend(was);
    NIB_CUDA_CHECK(ce);
    const cudaError_t le = cudaGetLastError(); /* NIB_LAUNCH_CHECK with the caller's name */
    if (le != cudaSuccess) return nib_cuda_status((int)le, name, __FILE__, __LINE__);
    return NIB_OK;
}

/* NIB_FP8_PP: unset or empty: the rule (nib_fp8_geglu_pp, ops/gemm_plan.c; *out is NULL, returns 2); "0": off, every GeGLU
 * product on the planner's persistent tile (the A/B switch; returns 0); "<rows>x<cols>": every GeGLU product on
 * k_gemm_fp8_pp with that consumer tile (*out; the tile argument and the planner's pick are ignored; returns 1); -1:
 * another value */
static int fp8_pp_env(PpKern **out) {
    *out = NULL;
    const char *e = getenv("NIB_FP8_PP");
    if (!e || !*e) return 2;
    if (!strcmp(e, "0")) return 0;
    for (int i = 0; i < N_PP; i++) {
        char name[24];
        snprintf(name, sizeof name, "%dx%d", 64 * g_pp[i].mw, g_pp[i].bn);
        if (!strcmp(e, name)) {
            *out = &g_pp[i];
            return 1;
        }
    }
    return -1;
}

/* the ping-pong kernel nib_fp8_geglu_pp's rule picks for an M x n x K GeGLU product (*out NULL: none) */
static nib_status pp_by_rule(int64_t m, int64_t n, int64_t k, PpKern **out) {
    *out = NULL;
    const int rows = nib_fp8_geglu_pp(m, n, k);
    for (int i = 0; i < N_PP && rows; i++)
        if (64 * g_pp[i].mw == rows) *out = &g_pp[i];
    if (rows && !*out)
        return NIB_ERR(NIB_ERR_INTERNAL, "fp8 gemm (nib): the ping-pong rule's %d-row tile is not compiled", rows);
    return NIB_OK;
}

extern "C" nib_status nib_cuda_fp8_geglu_pp(int64_t m, int64_t n, int64_t k, int *rows, int *cols) {
    *rows = 0, *cols = 0;
    PpKern *pk;
    const int pp = fp8_pp_env(&pk);
    if (pp < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FP8_PP=%s: unset (the rule), 0 (off) or a ping-pong consumer tile: "
                       "192x128, 128x192 or 64x256", getenv("NIB_FP8_PP"));
    const int persist = fp8_persist_env();
    if (persist < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FP8_PERSIST=%s: 1 (GeGLU products on the persistent kernel, the default) "
                       "or 0 (one tile a CTA)", getenv("NIB_FP8_PERSIST"));
    if (pp == 2 && persist == 1) NIB_RETURN_IF_ERR(pp_by_rule(m, n, k, &pk));
    if (pk) *rows = 64 * pk->mw, *cols = pk->bn;
    return NIB_OK;
}

/* the GeGLU product on the ping-pong kernel pk: one CTA per SM (at most one per tile, at most NIB_FP8_PERSIST_CTAS) */
static nib_status launch_pp(PpKern *pk, const nib_blas_gemm_args *a, const Fp8Args &p, void *stream) {
    const size_t smem = pp_smem(pk);
    if (!pk->attr_set) {
        NIB_CUDA_CHECK(cudaFuncSetAttribute(pk->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int per_sm = 0;
        NIB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pk->fn, 384, smem));
        if (per_sm != 1)
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "fp8 gemm (nib): the ping-pong tile %dx%d gives %d CTAs an SM (needs 1)",
                           64 * pk->mw, pk->bn, per_sm);
        pk->attr_set = 1;
    }
    CUtensorMap tmx, tmw;
    NIB_RETURN_IF_ERR(encode_rows(&tmx, a->x, a->m, a->k, 64 * pk->mw, "fp8 gemm (nib) X"));
    NIB_RETURN_IF_ERR(encode_rows(&tmw, a->w, a->n, a->k, pk->bn / 2, "fp8 gemm (nib) W"));
    const int64_t mtiles = (a->m + 64 * pk->mw - 1) / (64 * pk->mw), ntiles = (p.gh + pk->bn / 2 - 1) / (pk->bn / 2);
    if (mtiles * ntiles > INT32_MAX / 2)
        return NIB_ERR(NIB_ERR_SHAPE, "fp8 gemm (nib): %lld x %lld tiles exceed the ping-pong kernel's count",
                       (long long)mtiles, (long long)ntiles);
    const int cap = fp8_persist_ctas_env();
    if (cap < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FP8_PERSIST_CTAS=%s: a positive number of CTAs",
                       getenv("NIB_FP8_PERSIST_CTAS"));
    int64_t ctas = g_sms;
    if (ctas > mtiles * ntiles) ctas = mtiles * ntiles;
    if (cap && ctas > cap) ctas = cap;
    return launch_geglu(pk->fn, (unsigned)ctas, 384, smem, (cudaStream_t)stream, tmx, tmw, p, 0, "launch of k_gemm_fp8_pp");
}

/* the persistent GeGLU kernel of a tile (NULL: none compiled), its shared-memory attribute set and its resident CTAs
 * per SM measured */
static nib_status pt_kernel(const nib_fp8_tile *tile, PtKern **out) {
    *out = NULL;
    if (tile->ks != 1 || tile->cm != 1) return NIB_OK;
    PtKern *pk = NULL;
    for (int i = 0; i < N_PT && !pk; i++)
        if (g_pt[i].wg == tile->wg && g_pt[i].bn == tile->bn && g_pt[i].stages == tile->stages) pk = &g_pt[i];
    if (!pk)
        return NIB_ERR(NIB_ERR_INTERNAL, "fp8 gemm (nib): NIB_FP8_PERSIST=1 has no kernel for GeGLU tile %d x %d, %d stages",
                       64 * tile->wg, tile->bn, tile->stages);
    if (!pk->attr_set) {
        const size_t smem = nib_fp8_tile_smem(tile);
        NIB_CUDA_CHECK(cudaFuncSetAttribute(pk->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        NIB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&pk->per_sm, pk->fn, 128 * tile->wg + 32, smem));
        if (pk->per_sm < 1)
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "fp8 gemm (nib): the persistent GeGLU tile %d x %d does not fit an SM",
                           64 * tile->wg, tile->bn);
        pk->attr_set = 1;
    }
    *out = pk;
    return NIB_OK;
}

/* the product (gh = 0) or the GeGLU product (gh = H: W has 2H rows, Y is M x H) */
static nib_status gemm_fp8(const nib_blas_gemm_args *a, const nib_fp8_tile *tile, int64_t gh, void *stream) {
    if (!a || !a->x || !a->w || !a->y || !a->sx || !a->sw)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 gemm (nib): NULL argument");
    if (!a->fp8) return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 gemm (nib): the arguments are not an FP8 product");
    if (gh) {
        if (a->n != 2 * gh || a->c)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 gemm (nib): GeGLU needs 2H = %lld weight rows (got %lld) and no C",
                           (long long)(2 * gh), (long long)a->n);
        nib_blas_gemm_args out = *a; /* Y is M x H: the checks of a product with N = H */
        out.n = gh;
        NIB_RETURN_IF_ERR(nib_fp8_check_args(&out));
    } else {
        NIB_RETURN_IF_ERR(nib_fp8_check_args(a));
    }
    if (!g_sms) {
        nib_device_info d;
        NIB_RETURN_IF_ERR(nib_device_require(&d));
        g_sms = d.sm_count;
    }
    nib_fp8_tile pick;
    const bool planned = !tile; /* the planner's product (the ping-pong rule may take a GeGLU one) */
    if (!tile) {
        NIB_RETURN_IF_ERR(nib_cuda_fp8_plan(a->m, a->n, a->k, gh != 0, &pick));
        tile = &pick;
    }
    if (gh && !nib_fp8_tile_geglu(tile))
        return NIB_ERR(NIB_ERR_INVALID_ARG,
                       "fp8 gemm (nib): tile %d x %d (cluster %d) cannot run GeGLU (channels a multiple of 16, no "
                       "multicast)",
                       64 * tile->wg, tile->bn, tile->cm);
    TileKern *tk;
    NIB_RETURN_IF_ERR(tile_kernel(tile, &tk));
    const size_t smem = nib_fp8_tile_smem(&tk->t);
    Fp8Args p;
    p.x = (const uint8_t *)a->x, p.w = (const uint8_t *)a->w;
    p.sx = a->sx, p.sw = a->sw;
    p.bias = (const __nv_bfloat16 *)a->bias, p.c = (const __nv_bfloat16 *)a->c;
    p.y = (__nv_bfloat16 *)a->y;
    p.m = (int)a->m, p.n = (int)a->n, p.k = (int)a->k, p.ldc = (int)a->ldc, p.ldy = (int)a->ldy;
    p.sx_vec = a->sx_per_token != 0, p.sw_vec = a->sw_per_channel != 0;
    p.gh = (int)gh;
    p.ft = 0;
    const int cpre = fp8_cpre_env();
    if (cpre < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FP8_EPI_CPRE=%s: 1 (nib's FP8 GEMM loads each thread's C chunks "
                       "before its stores, the default) or 0 (chunk by chunk)", getenv("NIB_FP8_EPI_CPRE"));
    p.cpre = cpre;
    if (gh) {
        const int ft = nib_fast_tanh();
        if (ft < 0)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FAST_TANH=%s: 1 (the hardware tanh in the GeGLU of a W8A8 "
                           "product, the default) or 0 (tanhf)", getenv("NIB_FAST_TANH"));
        p.ft = ft;
    }
    if (gh) {
        PpKern *pk;
        const int pp = fp8_pp_env(&pk);
        if (pp < 0)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FP8_PP=%s: unset (the rule), 0 (off) or a ping-pong consumer tile: "
                           "192x128, 128x192 or 64x256", getenv("NIB_FP8_PP"));
        if (pp == 2 && planned && fp8_persist_env() == 1) NIB_RETURN_IF_ERR(pp_by_rule(a->m, a->n, a->k, &pk));
        if (pk) return launch_pp(pk, a, p, stream);
    }
    CUtensorMap tmx, tmw;
    NIB_RETURN_IF_ERR(encode_rows(&tmx, a->x, a->m, a->k, 64 * tk->t.wg, "fp8 gemm (nib) X"));
    NIB_RETURN_IF_ERR(
        encode_rows(&tmw, a->w, a->n, a->k, gh ? tk->t.bn / 2 : nib_fp8_tile_wslice(&tk->t), "fp8 gemm (nib) W"));
    /* grid: M tiles (fastest), N tiles (GeGLU: of BN / 2 output channels), K splits. cm > 1:
     * clusters of cm CTAs along M; the M tiles rounded up to whole clusters (a CTA past M stores
     * nothing but still loads and multicasts its W slice) */
    const int64_t mtiles = (a->m + 64 * tk->t.wg - 1) / (64 * tk->t.wg), cm = tk->t.cm;
    const int64_t nout = gh ? gh : a->n, bnout = gh ? tk->t.bn / 2 : tk->t.bn;
    const int64_t ntiles = (nout + bnout - 1) / bnout;
    if (ntiles > 65535)
        return NIB_ERR(NIB_ERR_SHAPE, "fp8 gemm (nib): N = %lld needs %lld tiles of %lld channels (at most 65535)",
                       (long long)nout, (long long)ntiles, (long long)bnout);
    const int persist = gh ? fp8_persist_env() : 0;
    if (persist < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FP8_PERSIST=%s: 1 (GeGLU products on the persistent kernel, the default) "
                       "or 0 (one tile a CTA)", getenv("NIB_FP8_PERSIST"));
    if (persist) {
        PtKern *pk;
        NIB_RETURN_IF_ERR(pt_kernel(&tk->t, &pk));
        if (pk) {
            const int cap = fp8_persist_ctas_env();
            if (cap < 0)
                return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FP8_PERSIST_CTAS=%s: a positive number of CTAs",
                               getenv("NIB_FP8_PERSIST_CTAS"));
            if (mtiles * ntiles > INT32_MAX)
                return NIB_ERR(NIB_ERR_SHAPE, "fp8 gemm (nib): %lld x %lld tiles exceed the persistent kernel's count",
                               (long long)mtiles, (long long)ntiles);
            int64_t ctas = (int64_t)pk->per_sm * g_sms;
            if (ctas > mtiles * ntiles) ctas = mtiles * ntiles;
            if (cap && ctas > cap) ctas = cap;
            return launch_geglu(pk->fn, (unsigned)ctas, 128 * tk->t.wg + 32, smem, (cudaStream_t)stream, tmx, tmw,
                                p, 1, "launch of k_gemm_fp8_pt");
        }
    }
    const dim3 grid((unsigned)((mtiles + cm - 1) / cm * cm), (unsigned)ntiles, (unsigned)tk->t.ks);
    if (cm > 1)
        NIB_CUDA_CHECK(nib::launch_cluster(tk->fn, grid, dim3(128 * tk->t.wg + 32), smem, (cudaStream_t)stream,
                                           dim3((unsigned)cm, 1, 1), tmx, tmw, p));
    else if (tk->t.ks > 1) /* a K split is one cluster along z */
        NIB_CUDA_CHECK(nib::launch_cluster(tk->fn, grid, dim3(128 * tk->t.wg + 32), smem, (cudaStream_t)stream,
                                           dim3(1, 1, (unsigned)tk->t.ks), tmx, tmw, p));
    else
        NIB_CUDA_CHECK(nib::launch(tk->fn, grid, dim3(128 * tk->t.wg + 32), smem, (cudaStream_t)stream, tmx, tmw, p));
    NIB_LAUNCH_CHECK("k_gemm_fp8");
    return NIB_OK;
}

extern "C" nib_status nib_cuda_gemm_fp8(const nib_blas_gemm_args *a, const nib_fp8_tile *tile, void *stream) {
    return gemm_fp8(a, tile, 0, stream);
}

extern "C" nib_status nib_cuda_gemm_fp8_geglu(const nib_blas_gemm_args *a, const nib_fp8_tile *tile, void *stream) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 gemm (nib): NULL argument");
    if (a->n < 2 || a->n % 2)
        return NIB_ERR(NIB_ERR_SHAPE, "fp8 gemm (nib): GeGLU needs an even number of weight rows (gate | up), got %lld",
                       (long long)a->n);
    return gemm_fp8(a, tile, a->n / 2, stream);
}
