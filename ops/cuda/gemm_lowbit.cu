/* gemm_lowbit.cu — weight-only low-bit GEMM for small M (the memory-bound regime):
 *   Y[M, N_out] = epilogue(X[M, K] · W[N, K]ᵀ), X/Y bf16, W in NVFP4 | MXFP4 | INT4-g128 | FP8.
 *
 * How: the weight is the mma.sync A operand ("swap AB": its rows fill the 16-row side of
 * m16n8k16, tokens the 8-wide side), decoded in registers from a pre-shuffled layout (see
 * gemm_lowbit.cuh) and fed to bf16 tensor-core MMAs with fp32 accumulation. Each weight byte is
 * loaded once with 16-byte streaming loads (evict-first) two windows ahead; X tiles go through
 * shared memory (cp.async, double-buffered) and ldmatrix. Split-K across CTAs accumulates
 * into a self-cleaning fp32 workspace; the last CTA of a tile applies the epilogue.
 * Exactness: NVFP4 A = e2m1 * e4m3 (<= 5 significant bits) and MXFP4 A = e2m1 * 2^e are exact
 * in bf16; INT4 A = code - zero is exact, its fp16 group scale is applied in fp32; FP8 A is the
 * exact e4m3 value. Only the fp32 accumulation and the final bf16 rounding add error.
 *
 * Variants: format x MT (8-token tiles per M chunk: 1,2,4,8) x R (16-row groups per warp: 1,2).
 * Supported: any N; K % 16 (NVFP4), % 32 (MXFP4), % 128 (INT4), % 16 (FP8); K padded to 128.
 * Tested by tests/test_gemm_gpu.c (`build/nib_tests gemm_gpu`), timed by `nib bench gemm`.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/gemm_lowbit.cuh"
#include "ops/cuda/tmap.h"
#include "ops/cuda/wgmma.cuh" /* mbarriers (the bulk ring) */
#include "ops/gemm.h"
#include "ops/qkv.h"
#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/ktrace.cuh"
#include "runtime/launch.cuh"

using namespace nib;

#define KCH NIB_GEMM_KCH       /* K elements per chunk */
#define WARPS NIB_GEMM_WARPS   /* warps per CTA */
#define MCHUNK NIB_GEMM_MCHUNK /* tokens per M chunk (MT = 8) */

static int fmt_parts(nib_wfmt f) { return f == NIB_WFMT_FP8 ? 4 : 2; }
static int fmt_sb(nib_wfmt f) {
    return f == NIB_WFMT_NVFP4 ? 128 : (f == NIB_WFMT_FP8 ? 0 : 64);
}

struct GemmParams {
    const uint8_t *w, *s;
    const float *colscale, *bias;
    const int32_t *perm;
    const __nv_bfloat16 *x;
    __nv_bfloat16 *y;
    const __nv_bfloat16 *res;
    const float *gate;
    float *ws;
    int *counters;
    long long ldx, ldy, ldr;
    int m, k, np, ng, nchunks, n_out, geglu;
    int wk, chunks_per_cta, ksplit, row_blocks;
    int xw, nxb, lds, ring_bytes; /* X window steps, X buffers, X row stride (elements), ring size */
    int cps;                      /* chunks per pipeline step (= Cps<MT>) */
    int kcl;                      /* wgmma kernel: the K splits reduce in their cluster (plan wkcl) */
    uint32_t scale_add;
    /* launch constants the host computes once, so the kernel's prologue divides nothing */
    int wn_shift;                 /* log2(warps along N) = log2(WARPS / wk) */
    int nsteps_full, nsteps_last; /* pipeline steps of a CTA with chunks_per_cta chunks / the last K split */
    int x_drow, x_dpc;            /* X walk: (row, piece) advance per copy (256 / ppr, 256 % ppr) */
    uint32_t x_magic;             /* ceil(2^32 / ppr): threadIdx.x / ppr as one multiply-high */
    /* nib_cuda_gemm_qkv's epilogue (qkv = 1; the weight in the pair layout, rope_half = half):
     * RoPE, q scaling and the bf16 cache write of ops/qkv.h, no y written */
    int qkv, q_heads, kv_heads, half, half_shift, hd;
    float q_scale;
    const float2 *rope_cs;        /* [token][half] (cos, sin) */
    __nv_bfloat16 *q, *kc, *vc;   /* q [M][ldq] (NULL: none), cache planes [slot][kv_heads][hd] (NULL: none) */
    long long ldq;
    int t_max, slot_off;
    const int32_t *slot_base;
};

/* ---- the per-thread cp.async ring -------------------------------------------------------
 * Every lane streams its own 16-byte pieces of the weight chunks into a private slot of shared
 * memory and reads back only what it copied, so the weight pipeline needs no barrier: a
 * per-thread cp.async.wait_group is enough. S stages = S-1 chunks in flight per warp. X
 * windows ride in the same cp.async groups (one group per pipeline position), so the wait
 * that makes a weight chunk visible also covers the X window its step needs (then one
 * __syncthreads at each window start makes the other threads' X pieces visible). */
template <int FMT> struct Pieces { enum { N = FmtT<FMT>::PARTS + (FMT == NIB_WFMT_FP8 ? 0 : 1) }; };
/* pipeline stages, chunks per step (amortizes the per-step work at small M) */
template <int MT> struct Stages { enum { S = NIB_GEMM_STAGES(MT) }; };
template <int MT> struct Cps { enum { N = NIB_GEMM_CPS(MT) }; };
/* the planner (ops/gemm_plan.c) sizes the ring with NIB_GEMM_PIECES */
static_assert(Pieces<NIB_WFMT_NVFP4>::N == NIB_GEMM_PIECES(NIB_WFMT_NVFP4) &&
                  Pieces<NIB_WFMT_MXFP4>::N == NIB_GEMM_PIECES(NIB_WFMT_MXFP4) &&
                  Pieces<NIB_WFMT_INT4>::N == NIB_GEMM_PIECES(NIB_WFMT_INT4) &&
                  Pieces<NIB_WFMT_FP8>::N == NIB_GEMM_PIECES(NIB_WFMT_FP8),
              "ring pieces per chunk differ between the kernel and its planner");

/* 16-byte async copy, or a zero fill when !ok. (No L2 cache-hint and no 8-byte copies here:
 * on sm_90 those variants raised illegal-instruction faults in this pipeline.) */
__device__ __forceinline__ void cp_async16_ok(uint32_t dst, const void *src, bool ok) {
    cp_async16(dst, src, ok ? 16 : 0);
}
/* NIB_GEMM_LAB_PINGPONG (a lab build's compile flag, never set by the Makefile: `make BUILD=DIR
 * NIB_LAB_NVCCFLAGS=-DNIB_GEMM_LAB_PINGPONG=1`): with REG = 1 the K loop runs two steps an iteration, the
 * weights alternating between two register arrays, so no step copies them. Lean q|k|v form (nvdisasm,
 * sixty-ninth session): ~15 register moves a step instead of ~48, the kernel 2096 instructions instead of
 * 1464 (two bodies; NIB_GEMM_LAB_UNROLL2 below, the compiler's unroll, has three). Not yet measured on a
 * GPU; same results. */
#ifndef NIB_GEMM_LAB_PINGPONG
#define NIB_GEMM_LAB_PINGPONG 0
#endif
/* NIB_GEMM_LAB_UNROLL2 (a lab build's compile flag, never set by the Makefile: `make BUILD=DIR
 * NIB_LAB_NVCCFLAGS=-DNIB_GEMM_LAB_UNROLL2=1`): the mma.sync kernel's K loop unrolled by 2. With REG = 1
 * the rolled loop copies the next step's weight registers into the current step's (nxt -> ch) and back:
 * 48 register moves a step in the lean q|k|v form, beside 12 CS2R zeroing the predicated loads' targets,
 * of ~480 instructions a step (nvdisasm, sixty-ninth session). Unrolled, ~30 moves remain per pair of steps
 * (none in the remainder copy, which a 1-step product runs), but the kernel's code grows from 1464 to 2552
 * instructions. Not yet measured on a GPU; same results. */
#ifndef NIB_GEMM_LAB_UNROLL2
#define NIB_GEMM_LAB_UNROLL2 0
#endif
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

__device__ __forceinline__ uint32_t ring_addr(uint32_t ring, int np, int stage, int piece) {
    return ring + ((stage * np + piece) * (WARPS * 32) + threadIdx.x) * 16;
}

/* One weight chunk (this lane's pieces) into ring stage `stage`. wp / sp: this lane's element
 * and scale pointers for the chunk. Scales of MXFP4/INT4 are 8 bytes per lane group: copy the
 * aligned 16-byte pair that holds them (same sectors), read at (g & 1) * 8. */
template <int FMT, int CPS>
__device__ __forceinline__ void issue_chunks(uint32_t ring, int stage, const uint8_t *wp, const uint8_t *sp, bool rg_ok,
                                             int c, int c_end) {
    constexpr int NP = Pieces<FMT>::N, PARTS = FmtT<FMT>::PARTS;
    constexpr int SB = FMT == NIB_WFMT_NVFP4 ? 128 : 64;
#pragma unroll
    for (int cc = 0; cc < CPS; cc++) {
        const bool ok = rg_ok && c + cc < c_end;
#pragma unroll
        for (int q = 0; q < PARTS; q++)
            cp_async16_ok(ring_addr(ring, NP * CPS, stage, cc * NP + q), wp + (cc * PARTS + q) * 512, ok);
        if (FMT != NIB_WFMT_FP8) cp_async16_ok(ring_addr(ring, NP * CPS, stage, cc * NP + PARTS), sp + cc * SB, ok);
    }
}

template <int FMT, int CPS>
__device__ __forceinline__ void read_chunk(Chunk<FMT> &ch, const unsigned char *ring_ptr, int stage, int cc, int g) {
    constexpr int NP = Pieces<FMT>::N, PARTS = FmtT<FMT>::PARTS;
#pragma unroll
    for (int q = 0; q < PARTS; q++)
        ch.e[q] = *(const uint4 *)(ring_ptr + ((stage * NP * CPS + cc * NP + q) * (WARPS * 32) + threadIdx.x) * 16);
    if (FMT != NIB_WFMT_FP8) {
        const unsigned char *sp =
            ring_ptr + ((stage * NP * CPS + cc * NP + PARTS) * (WARPS * 32) + threadIdx.x) * 16;
        if (FMT == NIB_WFMT_NVFP4) {
            ch.s = *(const uint4 *)sp;
        } else {
            uint2 v = *(const uint2 *)(sp + (g & 1) * 8);
            ch.s.x = v.x;
            ch.s.y = v.y;
        }
    }
}

/* This thread's walk over the 16-byte pieces of an X window (xrows rows x ppr pieces per row,
 * piece index threadIdx.x + i * 256): its first (row, piece) and the (row, piece) advance per
 * copy, found with one division per launch. Each copy then costs a compare and a few adds (the
 * earlier per-copy carry loop ran ppr / 256 times per copy: at M = 50 the X copies were half of
 * the kernel's instructions, nib bench gemm under Nsight Compute). */
struct XWalk {
    int row0, pc0, drow, dpc, ppr;
    __device__ __forceinline__ void init(int pieces_per_row) { /* two divisions: for per-CTA use */
        ppr = pieces_per_row;
        row0 = (int)threadIdx.x / ppr;
        pc0 = (int)threadIdx.x - row0 * ppr;
        drow = (WARPS * 32) / ppr;
        dpc = WARPS * 32 - drow * ppr;
    }
    /* the X window walk from the host's constants (exact: threadIdx.x < 2^8, ppr < 2^24) */
    __device__ __forceinline__ void init_x(const GemmParams &p, int pieces_per_row) {
        ppr = pieces_per_row;
        row0 = (int)__umulhi(threadIdx.x, p.x_magic);
        pc0 = (int)threadIdx.x - row0 * ppr;
        drow = p.x_drow;
        dpc = p.x_dpc;
    }
};

/* X window -> shared buffer: xrows real token rows x (xw*wk*cps*128) columns from column kbase. */
__device__ __forceinline__ void issue_x_window(const GemmParams &p, const XWalk &xw, __nv_bfloat16 *xs, int xrows,
                                               int m0, int kbase) {
    int row = xw.row0, pc = xw.pc0;
    if (!p.perm) {
        const __nv_bfloat16 *src = p.x + (long long)(m0 + row) * p.ldx + kbase + pc * 8;
        uint32_t dst = smem_u32(xs + row * p.lds + pc * 8);
        const long long src_step = (long long)xw.drow * p.ldx + xw.dpc * 8, src_wrap = p.ldx - (long long)xw.ppr * 8;
        const uint32_t dst_step = (uint32_t)(xw.drow * p.lds + xw.dpc * 8) * 2u,
                       dst_wrap = (uint32_t)(p.lds - xw.ppr * 8) * 2u;
        while (row < xrows) {
            const bool ok = kbase + pc * 8 < p.k;
            cp_async16(dst, ok ? (const void *)src : (const void *)p.x, ok ? 16 : 0);
            row += xw.drow;
            pc += xw.dpc;
            src += src_step;
            dst += dst_step;
            if (pc >= xw.ppr) {
                pc -= xw.ppr;
                row++;
                src += src_wrap;
                dst += dst_wrap;
            }
        }
        return;
    }
    /* act-order INT4: gather input channels (the stored column order) */
    while (row < xrows) {
        const int col = kbase + pc * 8;
        __nv_bfloat16 *dst = xs + row * p.lds + pc * 8;
        const bool ok = col < p.k;
#pragma unroll
        for (int i = 0; i < 8; i++)
            dst[i] = ok ? p.x[(long long)(m0 + row) * p.ldx + p.perm[col + i]] : __float2bfloat16(0.f);
        row += xw.drow;
        pc += xw.dpc;
        if (pc >= xw.ppr) {
            pc -= xw.ppr;
            row++;
        }
    }
}

/* The epilogue's arithmetic on values loaded by the caller (cs = colscale[row]; gt = gate[n] and rs =
 * the residual at (mm, n) where p.gate / p.res are set), so a caller can load them early; epi_val and
 * epi_store load them at the point of use. */
__device__ __forceinline__ float epi_val_v(const GemmParams &p, int row, float acc, float cs) {
    float v = acc * cs;
    if (p.bias) v += p.bias[row];
    return v;
}
__device__ __forceinline__ void epi_store_v(const GemmParams &p, int n, int mm, float v, float gt, float rs) {
    if (p.gate) v *= gt;
    if (p.res) v += rs;
    p.y[(long long)mm * p.ldy + n] = __float2bfloat16(v);
}
__device__ __forceinline__ float epi_res(const GemmParams &p, int n, int mm) {
    return p.res ? __bfloat162float(p.res[(long long)mm * p.ldr + n]) : 0.f;
}
__device__ __forceinline__ float epi_val(const GemmParams &p, int row, float acc) {
    return epi_val_v(p, row, acc, p.colscale[row]);
}
__device__ __forceinline__ void epi_store(const GemmParams &p, int n, int mm, float v) {
    epi_store_v(p, n, mm, v, p.gate ? p.gate[n] : 0.f, epi_res(p, n, mm));
}

/* ops/qkv.h's epilogue for rotation pair n (rows (n / 8) * 16 + n % 8 and 8 rows later: dims d and
 * half + d of head n / half) of token mm, from the two epilogue values: each rounded to bf16 as the
 * product's output is, then k_qkv's fp32 operations (rotation, q scale) and bf16 stores. */
__device__ __forceinline__ float2 qkv_cs(const GemmParams &p, int n, int mm) {
    return p.rope_cs[(long long)mm * p.half + (n & (p.half - 1))];
}
__device__ __forceinline__ int qkv_slot_base(const GemmParams &p) { return p.slot_base ? *p.slot_base : 0; }
/* e = qkv_cs(p, n, mm), sbase = qkv_slot_base(p): loaded early where the caller can */
__device__ __forceinline__ void qkv_pair(const GemmParams &p, int n, int mm, float va, float vb, float2 e, int sbase) {
    const int blk = n >> p.half_shift, d = n & (p.half - 1); /* half = 2^half_shift */
    if (blk >= p.q_heads + 2 * p.kv_heads) return;
    float a = __bfloat162float(__float2bfloat16(va)), b = __bfloat162float(__float2bfloat16(vb));
    if (blk < p.q_heads + p.kv_heads) {
        const float ac = __fmul_rn(a, e.x), bs = __fmul_rn(b, e.y);
        const float bc = __fmul_rn(b, e.x), as = __fmul_rn(a, e.y);
        a = __fsub_rn(ac, bs);
        b = __fadd_rn(bc, as);
    }
    __nv_bfloat16 *dst;
    if (blk < p.q_heads) {
        if (!p.q) return;
        a = __fmul_rn(a, p.q_scale);
        b = __fmul_rn(b, p.q_scale);
        dst = p.q + (long long)mm * p.ldq + (long long)blk * p.hd + d;
    } else {
        if (!p.kc) return;
        const int slot = p.slot_off + sbase + mm;
        if (slot < 0 || slot >= p.t_max) return;
        const int kv = blk - p.q_heads, isv = kv >= p.kv_heads, hh = isv ? kv - p.kv_heads : kv;
        dst = (isv ? p.vc : p.kc) + ((long long)slot * p.kv_heads + hh) * p.hd + d;
    }
    dst[0] = __float2bfloat16_rn(a);
    dst[p.half] = __float2bfloat16_rn(b);
}

/* qkv_pair for the 8 pairs n .. n + 7 (n % 8 == 0) of token mm, for the wgmma kernel's tile-walking epilogues:
 * the 8 (cos, sin) loaded before any store (one after another, each pair's loads queue behind the stores before
 * them: a chain of 8 L2 round trips, which made the fused epilogue slower than a kernel of its own) and, where
 * aligned, each half written with one 16-byte store. The same fp32 operations and roundings as qkv_pair. */
__device__ __forceinline__ void qkv_pair8(const GemmParams &p, int n, int mm, const float (&va)[8], const float (&vb)[8],
                                          int sbase) {
    if (p.half < 8) { /* the 8 pairs span heads (tiny test models): pair by pair */
#pragma unroll
        for (int q = 0; q < 8; q++) qkv_pair(p, n + q, mm, va[q], vb[q], qkv_cs(p, n + q, mm), sbase);
        return;
    }
    const int blk = n >> p.half_shift, d = n & (p.half - 1);
    if (blk >= p.q_heads + 2 * p.kv_heads) return;
    const bool rot = blk < p.q_heads + p.kv_heads;
    float2 e[8];
    if (rot) {
        const float2 *cs = p.rope_cs + (long long)mm * p.half + d;
        if ((uintptr_t)cs % 16 == 0) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float4 c4 = *(const float4 *)(cs + 2 * q);
                e[2 * q] = make_float2(c4.x, c4.y), e[2 * q + 1] = make_float2(c4.z, c4.w);
            }
        } else {
#pragma unroll
            for (int q = 0; q < 8; q++) e[q] = cs[q];
        }
    }
    __nv_bfloat16 *dst;
    float sc = 1.f;
    if (blk < p.q_heads) {
        if (!p.q) return;
        sc = p.q_scale;
        dst = p.q + (long long)mm * p.ldq + (long long)blk * p.hd + d;
    } else {
        if (!p.kc) return;
        const int slot = p.slot_off + sbase + mm;
        if (slot < 0 || slot >= p.t_max) return;
        const int kv = blk - p.q_heads, isv = kv >= p.kv_heads, hh = isv ? kv - p.kv_heads : kv;
        dst = (isv ? p.vc : p.kc) + ((long long)slot * p.kv_heads + hh) * p.hd + d;
    }
    float a[8], b[8];
#pragma unroll
    for (int q = 0; q < 8; q++) {
        a[q] = __bfloat162float(__float2bfloat16(va[q])), b[q] = __bfloat162float(__float2bfloat16(vb[q]));
        if (rot) {
            const float ac = __fmul_rn(a[q], e[q].x), bs = __fmul_rn(b[q], e[q].y);
            const float bc = __fmul_rn(b[q], e[q].x), as = __fmul_rn(a[q], e[q].y);
            a[q] = __fsub_rn(ac, bs);
            b[q] = __fadd_rn(bc, as);
        }
        if (blk < p.q_heads) a[q] = __fmul_rn(a[q], sc), b[q] = __fmul_rn(b[q], sc);
    }
    if ((uintptr_t)dst % 16 == 0 && p.half % 8 == 0) {
        uint32_t oa[4], ob[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const __nv_bfloat162 a2 = __floats2bfloat162_rn(a[2 * q], a[2 * q + 1]);
            const __nv_bfloat162 b2 = __floats2bfloat162_rn(b[2 * q], b[2 * q + 1]);
            oa[q] = *(const uint32_t *)&a2, ob[q] = *(const uint32_t *)&b2;
        }
        *(uint4 *)dst = make_uint4(oa[0], oa[1], oa[2], oa[3]);
        *(uint4 *)(dst + p.half) = make_uint4(ob[0], ob[1], ob[2], ob[3]);
    } else {
#pragma unroll
        for (int q = 0; q < 8; q++) dst[q] = __float2bfloat16_rn(a[q]), dst[q + p.half] = __float2bfloat16_rn(b[q]);
    }
}

/* What the epilogue of one (row pair g, g + 8; token mm) reads besides the sums: the rows' column
 * scales and gates (c: colscale[pr], colscale[pr + 8], gate of output pr or n, gate of pr + 8), the
 * residuals of its outputs or, with p.qkv, the (cos, sin) (x), and the slot base. */
struct EpiIn {
    float c[4];
    float x[2];
    int sbase;
};
/* rows / per-row vectors (token-independent) */
__device__ __forceinline__ void epi_in_rows(const GemmParams &p, int rg, int g, EpiIn &e) {
    const int pr = rg * 16 + g;
    e.c[0] = p.colscale[pr];
    e.c[1] = p.colscale[pr + 8];
    e.c[2] = e.c[3] = 0.f;
    if (p.gate) {
        const int n0 = p.geglu ? rg * 8 + g : pr;
        e.c[2] = n0 < p.n_out ? p.gate[n0] : 0.f;
        if (!p.geglu) e.c[3] = pr + 8 < p.n_out ? p.gate[pr + 8] : 0.f;
    }
}
/* token mm's residuals or (cos, sin) */
__device__ __forceinline__ void epi_in_token(const GemmParams &p, int rg, int g, int mm, EpiIn &e) {
    const int pr = rg * 16 + g;
    e.x[0] = e.x[1] = 0.f;
    if (p.qkv) {
        const float2 cs = p.rope_cs[(long long)mm * p.half + ((rg * 8 + g) & (p.half - 1))];
        e.x[0] = cs.x;
        e.x[1] = cs.y;
    } else if (p.res) {
        const int n0 = p.geglu ? rg * 8 + g : pr;
        if (n0 < p.n_out) e.x[0] = epi_res(p, n0, mm);
        if (!p.geglu && pr + 8 < p.n_out) e.x[1] = epi_res(p, pr + 8, mm);
    }
}

/* The same, each input loaded at its point of use (the kernels without the early loads: MT >= 4) */
__device__ __forceinline__ void epi_pair_lazy(const GemmParams &p, int rg, int g, int mm, float a_g, float a_g8) {
    int pr = rg * 16 + g;
    float vg = epi_val(p, pr, a_g), vg8 = epi_val(p, pr + 8, a_g8);
    if (p.qkv) {
        qkv_pair(p, rg * 8 + g, mm, vg, vg8, qkv_cs(p, rg * 8 + g, mm), qkv_slot_base(p));
    } else if (p.geglu) {
        int n = rg * 8 + g;
        if (n < p.n_out) epi_store(p, n, mm, gelu_tanh(vg) * vg8);
    } else {
        if (pr < p.n_out) epi_store(p, pr, mm, vg);
        if (pr + 8 < p.n_out) epi_store(p, pr + 8, mm, vg8);
    }
}

/* Epilogue of one (row pair g, g+8; token mm) from final sums and its inputs e. */
__device__ __forceinline__ void epi_pair(const GemmParams &p, int rg, int g, int mm, float a_g, float a_g8,
                                         const EpiIn &e) {
    int pr = rg * 16 + g;
    float vg = epi_val_v(p, pr, a_g, e.c[0]), vg8 = epi_val_v(p, pr + 8, a_g8, e.c[1]);
    if (p.qkv) {
        qkv_pair(p, rg * 8 + g, mm, vg, vg8, make_float2(e.x[0], e.x[1]), e.sbase);
    } else if (p.geglu) {
        int n = rg * 8 + g;
        if (n < p.n_out) epi_store_v(p, n, mm, gelu_tanh(vg) * vg8, e.c[2], e.x[0]);
    } else {
        if (pr < p.n_out) epi_store_v(p, pr, mm, vg, e.c[2], e.x[0]);
        if (pr + 8 < p.n_out) epi_store_v(p, pr + 8, mm, vg8, e.c[3], e.x[1]);
    }
}

/* ---- the per-warp bulk ring (REG = 2) ---------------------------------------------------
 * A warp's CPS chunks of one pipeline step are contiguous in both planes (CPS x PARTS x 512
 * element bytes, CPS x SB scale bytes), so lane 0 moves a whole step with two cp.async.bulk
 * copies (the TMA engine; no per-lane copy instructions) into the warp's stage, completing on
 * the stage's mbarrier. The stages hold S - 1 steps in flight per warp without registers, where
 * REG = 1 holds one step in registers. Stage layout: the CPS chunks' element parts as in global
 * memory, then their scales (16 bytes per lane group g for NVFP4, 8 for MXFP4 / INT4). */
template <int FMT> struct BulkChunk { enum { E = FmtT<FMT>::PARTS * 512, B = E + FmtT<FMT>::SB }; };
static_assert(BulkChunk<NIB_WFMT_NVFP4>::B == NIB_GEMM_BULK_CHUNK(NIB_WFMT_NVFP4) &&
                  BulkChunk<NIB_WFMT_MXFP4>::B == NIB_GEMM_BULK_CHUNK(NIB_WFMT_MXFP4) &&
                  BulkChunk<NIB_WFMT_INT4>::B == NIB_GEMM_BULK_CHUNK(NIB_WFMT_INT4) &&
                  BulkChunk<NIB_WFMT_FP8>::B == NIB_GEMM_BULK_CHUNK(NIB_WFMT_FP8),
              "bulk ring chunk bytes differ between the kernel and its planner");

__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar, uint64_t pol) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol)
                 : "memory");
}

template <int FMT, int CPS>
__device__ __forceinline__ void read_chunk_bulk(Chunk<FMT> &ch, const unsigned char *stage_ptr, int cc, int lane, int g) {
    constexpr int PARTS = FmtT<FMT>::PARTS, E = BulkChunk<FMT>::E, SB = FmtT<FMT>::SB;
#pragma unroll
    for (int q = 0; q < PARTS; q++) ch.e[q] = *(const uint4 *)(stage_ptr + cc * E + q * 512 + lane * 16);
    const unsigned char *sp = stage_ptr + CPS * E + cc * SB;
    if (FMT == NIB_WFMT_NVFP4) {
        ch.s = *(const uint4 *)(sp + g * 16);
    } else if (FMT != NIB_WFMT_FP8) {
        const uint2 v = *(const uint2 *)(sp + g * 8);
        ch.s.x = v.x;
        ch.s.y = v.y;
    }
}

/* The issue side of the weight/X pipeline of one thread (see the kernel). REG = 1: the weights
 * go straight to registers (the kernel loads them); REG = 2: lane 0 of each warp moves them into
 * the warp's bulk ring; either way only the X windows go through cp.async. */
template <int FMT, int MT, int REG> struct IssueState {
    enum { S = Stages<MT>::S, PARTS = FmtT<FMT>::PARTS, CPS = Cps<MT>::N };
    const uint8_t *wp, *sp;
    const uint8_t *bwp, *bsp; /* REG = 2: the warp's element / scale pointers (no lane offset) */
    uint32_t bring, bbar;     /* REG = 2: the warp's ring and its stage-0 mbarrier (shared addresses) */
    uint64_t bpol;
    size_t wstep, sstep;
    int j, stage, in, xb, c, kcol, nsteps, c_end, xrows, m0, xs_stride;
    bool rg_ok;
    __nv_bfloat16 *xs0;
    XWalk xwalk;
    __device__ __forceinline__ void init(const GemmParams &p, int rg0, int c_begin, int wkk, int lane, int g,
                                         int nsteps_, int c_end_, bool rg_ok_, __nv_bfloat16 *xs0_, int xs_stride_,
                                         int xrows_, int m0_) {
        const int sb = FMT == NIB_WFMT_NVFP4 ? 128 : 64; /* scale bytes per (row group, chunk) */
        const size_t tile0 = (size_t)rg0 * p.nchunks + c_begin + wkk * CPS;
        wp = p.w + tile0 * (PARTS * 512) + lane * 16;
        sp = FMT == NIB_WFMT_FP8 ? p.w
             : FMT == NIB_WFMT_NVFP4 ? p.s + tile0 * 128 + g * 16 : p.s + tile0 * 64 + (g & ~1) * 8;
        bwp = p.w + tile0 * (PARTS * 512);
        bsp = FMT == NIB_WFMT_FP8 ? p.w : p.s + tile0 * sb;
        wstep = (size_t)p.wk * CPS * PARTS * 512;
        sstep = (size_t)p.wk * CPS * sb;
        j = stage = in = xb = 0;
        c = c_begin + wkk * CPS;
        kcol = c_begin * KCH;
        nsteps = nsteps_;
        c_end = c_end_;
        rg_ok = rg_ok_;
        xs0 = xs0_;
        xs_stride = xs_stride_;
        xrows = xrows_;
        m0 = m0_;
        xwalk.init_x(p, p.xw * p.wk * p.cps * (KCH / 8));
    }
    /* REG = 2: lane 0 moves the chunks of one position (stage st, first chunk cc) into the ring */
    __device__ __forceinline__ void bulk(int st, int cc, const uint8_t *w, const uint8_t *sc) const {
        const int nv = min((int)CPS, c_end - cc);
        if ((threadIdx.x & 31) == 0 && rg_ok && nv > 0) {
            constexpr int E = BulkChunk<FMT>::E, SB = FmtT<FMT>::SB;
            const uint32_t bar = bbar + st * 8, dst = bring + st * (CPS * BulkChunk<FMT>::B);
            mbar_arrive_expect_tx(bar, (uint32_t)(nv * (E + SB)));
            bulk_g2s(dst, w, (uint32_t)(nv * E), bar, bpol);
            if (SB) bulk_g2s(dst + CPS * E, sc, (uint32_t)(nv * SB), bar, bpol);
        }
    }
    /* issue pipeline position j (weights of step j; the X window starting at step j) */
    __device__ __forceinline__ void step(const GemmParams &p, uint32_t ring) {
        if (j < nsteps) {
            if (!REG) issue_chunks<FMT, CPS>(ring, stage, wp, sp, rg_ok, c, c_end);
            if (REG == 2) {
                /* stage `stage` was read in the previous iteration by every lane (its values fed
                 * that iteration's MMAs): after the warp meets here it may be overwritten */
                __syncwarp();
                if (j >= S - 1) bulk(stage, c, bwp, bsp); /* 0 .. S - 2: the kernel, before the PDL wait */
                bwp += wstep;
                bsp += sstep;
            }
            if (in == 0) {
                issue_x_window(p, xwalk, xs0 + xb * xs_stride, xrows, m0, kcol);
                xb = xb + 1 == p.nxb ? 0 : xb + 1;
            }
            in = in + 1 == p.xw ? 0 : in + 1;
            wp += wstep;
            sp += sstep;
            c += p.wk * CPS;
            kcol += p.wk * CPS * KCH;
        }
        cp_async_commit();
        j++;
        stage = stage + 1 == S ? 0 : stage + 1;
    }
};

using nib::prefetch_l2;

/* One step's weight chunks of this lane straight into registers (REG plans): the same bytes the
 * ring would hold, zeros where the chunk is past the CTA's range or the row group past N. */
template <int FMT, int CPS>
__device__ __forceinline__ void load_chunks_reg(Chunk<FMT> (&dst)[CPS], const uint8_t *wp, const uint8_t *sp, bool rg_ok,
                                                int c, int c_end, int g, uint64_t pol) {
    constexpr int PARTS = FmtT<FMT>::PARTS, SB = FMT == NIB_WFMT_NVFP4 ? 128 : 64;
#pragma unroll
    for (int cc = 0; cc < CPS; cc++) {
        if (rg_ok && c + cc < c_end) {
#pragma unroll
            for (int q = 0; q < PARTS; q++) dst[cc].e[q] = ldg_stream(wp + (cc * PARTS + q) * 512, pol);
            if (FMT == NIB_WFMT_NVFP4) {
                dst[cc].s = ldg_stream(sp + cc * SB, pol);
            } else if (FMT != NIB_WFMT_FP8) { /* the aligned 16-byte pair that holds this lane group's 8 bytes */
                const uint4 v = ldg_stream(sp + cc * SB, pol);
                dst[cc].s = (g & 1) ? make_uint4(v.z, v.w, 0u, 0u) : make_uint4(v.x, v.y, 0u, 0u);
            }
        } else {
#pragma unroll
            for (int q = 0; q < PARTS; q++) dst[cc].e[q] = make_uint4(0u, 0u, 0u, 0u);
            dst[cc].s = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

#include "ops/cuda/gemm_lowbit_wg.cuh" /* the wgmma kernel for large M */

/* OCC: resident CTAs per SM the registers are budgeted for (MT = 8 exists with 1 and 2: 1 has
 * no spills, 2 spills a few prologue values but doubles the resident CTAs; the planner picks).
 * REG (MT <= 4): weights loaded straight into registers one pipeline step ahead instead of
 * through the per-thread cp.async ring (no shared-memory round trip for them). */
/* L: a lean instantiation (NIB_GEMM_LEAN) for one epilogue kind and one K-split mode, fixed at compile
 * time, so the code of the others is not in the kernel (the low-bit kernel at batch 1 is sensitive to code
 * it does not execute: docs/design.md, "Forty-third session"). L = 0 decides everything at run time.
 * kind (L & 3): LEAN_PLAIN (bias / gate / residual at run time), LEAN_GEGLU, LEAN_QKV; split (L >> 2):
 * 1 one K split, 2 several. Every lean kind has no act-order and no bias; GeGLU and q|k|v no gate or
 * residual (lean_kind() on the host checks all of it). */
enum { LEAN_PLAIN = 1, LEAN_GEGLU = 2, LEAN_QKV = 3 };
#define LEAN(kind, split) ((kind) | ((split) << 2))

template <int FMT, int MT, int R, int REG, int L>
__device__ __forceinline__ void gemm_lowbit_body(const GemmParams &p) {
    constexpr int S = Stages<MT>::S;
    extern __shared__ __align__(16) unsigned char smem[];
    /* warp: nib::warp_id() (runtime/launch.cuh), warp-uniform for the compiler. With threadIdx.x >> 5 each
     * cp.async.bulk issued by lane 0 sat in a loop that moved its operands to uniform registers one distinct
     * value at a time (ELECT, five R2UR, the copy, a branch): ~60 instructions a pipeline step at batch 1.
     * 44 R2UR -> 2 in the lean M = 1 kernel (docs/design.md, "Fifty-second session"). */
    NIB_KT(NIB_KT_LOWBIT, NIB_KT_ENTRY);
    NIB_KT_EXIT_GUARD(NIB_KT_LOWBIT);
    const int lane = threadIdx.x & 31, warp = nib::warp_id();
    const int wn_count = 1 << p.wn_shift; /* warps along N (WARPS / wk, a power of two) */
    const int wn = warp & (wn_count - 1), wkk = warp >> p.wn_shift;
    const int rg0 = (blockIdx.x * wn_count + wn) * R;
    constexpr int MC = MT * 8; /* tokens per M chunk (the plan's chunks; one chunk below M = 64 unless
                                * the lab splits M) */
    const int m0 = blockIdx.z * MC;
    const int c_begin = blockIdx.y * p.chunks_per_cta;
    const int c_end = min(c_begin + p.chunks_per_cta, p.nchunks);
    constexpr int CPS = Cps<MT>::N;
    const int nsteps = (int)blockIdx.y == p.ksplit - 1 ? p.nsteps_last : p.nsteps_full; /* uniform across the CTA */
    /* Before the PDL wait (runtime/launch.cuh): the weights do not depend on the previous
     * kernel, so pull the start of this CTA's weight (and scale) slice into L2 while that kernel
     * finishes; the pipeline below then finds it there. Each row group's first lines, at most
     * PF_LINES per CTA, by the wk warps that stream that row group (no divisions). */
    {
        constexpr int PB = FmtT<FMT>::PARTS * 512, SBB = FmtT<FMT>::SB, PF_LINES = 256;
        const int cap = PF_LINES >> p.wn_shift; /* lines per row group */
        const int lpr = min((c_end - c_begin) * (PB / 128), cap);
        const int spr = SBB ? min((c_end - c_begin) * SBB / 128, cap / 4) : 0;
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (rg0 + r >= p.ng) continue;
            const uint8_t *wb = p.w + ((size_t)(rg0 + r) * p.nchunks + c_begin) * PB;
            for (int l = wkk * 32 + lane; l < lpr; l += p.wk * 32) prefetch_l2(wb + (size_t)l * 128);
            if (SBB) {
                const uint8_t *sb = p.s + ((size_t)(rg0 + r) * p.nchunks + c_begin) * SBB;
                for (int l = wkk * 32 + lane; l < spr; l += p.wk * 32) prefetch_l2(sb + (size_t)l * 128);
            }
            /* the epilogue's per-row vectors (column scales, bias, Pi0.5's per-step gates: often out
             * of L2 by the time the epilogue reads them) */
            if (wkk == 0 && lane == 0) {
                prefetch_l2(p.colscale + (rg0 + r) * 16);
                if (p.bias) prefetch_l2(p.bias + (rg0 + r) * 16);
                if (p.gate) prefetch_l2(p.gate + (rg0 + r) * (p.geglu ? 8 : 16));
            }
            /* the fused q|k|v epilogue's (cos, sin) of this row group's 8 pairs, one line per token */
            if (p.qkv && wkk == 0 && lane < MC && m0 + lane < p.m)
                prefetch_l2(p.rope_cs + (long long)(m0 + lane) * p.half + (((rg0 + r) * 8) & (p.half - 1)));
        }
    }
    /* (the PDL wait comes after the setup below, which reads nothing the previous kernel writes:
     * the bulk rings' first steps and REG = 1's first weights overlap that kernel's tail) */
    const uint32_t ring = smem_u32(smem);
    __nv_bfloat16 *const xs0 = (__nv_bfloat16 *)(smem + p.ring_bytes);
    const int xs_stride = (min(MT * 8, p.m) + 1) * p.lds; /* real rows + the zero row */

    bool rg_ok[R];
#pragma unroll
    for (int r = 0; r < R; r++) rg_ok[r] = rg0 + r < p.ng;
    const int g = lane >> 2;

    float acc[R][MT][4], acc2[R][MT][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int nt = 0; nt < MT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[r][nt][i] = acc2[r][nt][i] = 0.f;

    /* X: the real token rows of this M chunk, plus one zero row at index xrows that every
     * token past M reads (zeroed once here; window loads never touch it) */
    const int xrows = min(MT * 8, p.m - m0);
    for (int b = 0; b < p.nxb; b++) /* 16-byte stores: lds and xs_stride are multiples of 8 */
        for (int c = threadIdx.x; c < p.lds / 8; c += blockDim.x)
            *(uint4 *)(xs0 + b * xs_stride + xrows * p.lds + c * 8) = make_uint4(0u, 0u, 0u, 0u);
    uint32_t brow[MT]; /* ldmatrix row address of this lane per n-tile, window buffer 0, column 0 */
#pragma unroll
    for (int nt = 0; nt < MT; nt++) {
        int row = min(nt * 8 + (lane & 7), xrows);
        brow[nt] = smem_u32(xs0) + (row * p.lds + (lane >> 3) * 8) * 2;
    }

    /* issue side of the pipeline (position j = weight chunk of step j, plus the X window that
     * starts at step j); all counters incremental: no divisions in the loop */
    IssueState<FMT, MT, REG> is;
    is.init(p, rg0, c_begin, wkk, lane, g, nsteps, c_end, rg_ok[0], xs0, xs_stride, xrows, m0);
    /* REG = 2: this warp's ring (p.ring_bytes / WARPS bytes) and its S mbarriers, one per stage */
    __shared__ __align__(8) uint64_t s_bar[REG == 2 ? WARPS * S : 1];
    const unsigned char *bring_ptr = smem + (size_t)warp * (p.ring_bytes / WARPS);
    if (REG == 2) {
        is.bring = ring + (uint32_t)warp * (uint32_t)(p.ring_bytes / WARPS);
        is.bbar = smem_u32(&s_bar[warp * S]);
        is.bpol = evict_first_policy();
        if (lane == 0) {
#pragma unroll
            for (int st = 0; st < S; st++) mbar_init(is.bbar + st * 8, 1);
            mbar_init_fence();
        }
        __syncwarp();
        /* the first S - 1 positions' weights (IssueState::step issues the rest) */
#pragma unroll
        for (int jj = 0; jj < S - 1; jj++)
            if (jj < nsteps) is.bulk(jj, is.c + jj * p.wk * is.CPS, is.bwp + jj * is.wstep, is.bsp + jj * is.sstep);
    }
    /* REG: this lane's weight stream (the pointers IssueState starts from), step 0 in flight
     * before the X prologue */
    const uint8_t *rwp = is.wp, *rsp = is.sp;
    int rc = is.c;
    Chunk<FMT> nxt[CPS];
    uint64_t pol = 0;
    if (REG == 1) {
        pol = evict_first_policy();
        if (nsteps > 0) load_chunks_reg<FMT, CPS>(nxt, rwp, rsp, rg_ok[0], rc, c_end, g, pol);
    }
    nib::pdl_enter(); /* X comes from the previous kernel */
    NIB_KT(NIB_KT_LOWBIT, NIB_KT_WAITED);
#pragma unroll
    for (int j = 0; j < S - 1; j++) is.step(p, ring);
    NIB_KT(NIB_KT_LOWBIT, NIB_KT_MARK7); /* the first X windows issued (the epilogue's inputs not yet) */
    /* Everything the epilogue reads besides the sums (column scales, gates, residuals or the q|k|v
     * epilogue's (cos, sin), the slot base), loaded here, in flight during the main loop, by the threads
     * that finish a single K split (MT <= 2: the expert's few tokens; a dozen registers, which FP8 with
     * register-loaded weights would spill). Loaded at the epilogue instead, each token's loads would wait
     * for the stores before them (y may alias the residual): a chain of L2 round trips. */
    constexpr bool EPRE = MT <= 2 && !(FMT == NIB_WFMT_FP8 && REG == 1);
    EpiIn epre[EPRE ? R : 1][EPRE ? MT : 1][2];
    if constexpr (EPRE) {
        if ((L >> 2) != 2 && p.ksplit == 1 && wkk == 0) {
            const int sb = p.qkv ? qkv_slot_base(p) : 0;
#pragma unroll
            for (int r = 0; r < R; r++) {
                EpiIn rows;
                if (rg_ok[r]) epi_in_rows(p, rg0 + r, g, rows);
#pragma unroll
                for (int nt = 0; nt < MT; nt++)
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        EpiIn &e = epre[r][nt][i];
                        const int mm = m0 + nt * 8 + 2 * (lane & 3) + i;
                        if (!rg_ok[r] || mm >= p.m) continue;
                        e = rows;
                        e.sbase = sb;
                        epi_in_token(p, rg0 + r, g, mm, e);
                    }
            }
        }
    }

    NIB_KT(NIB_KT_LOWBIT, NIB_KT_MARK5); /* the first X windows and the epilogue's inputs issued */
    int use_stage = 0, use_in = 0, use_xb = 0, use_c = c_begin + wkk * CPS;
    uint32_t use_phase = 0; /* REG = 2: parity of the stage's current phase */
    /* one K-loop step: REG = 1 consumes the weights in cur and loads the next step's into nx (the same array
     * in the rolled loop, so cur is copied first; two arrays in turn under NIB_GEMM_LAB_PINGPONG) */
    auto kstep = [&](int i, Chunk<FMT>(&cur)[CPS], Chunk<FMT>(&nx)[CPS]) {
        cp_async_wait<S - 2>();
        if (i == 0) NIB_KT(NIB_KT_LOWBIT, NIB_KT_MARK6); /* thread 0's part of the first X window is in */
        if (use_in == 0) __syncthreads(); /* X window complete in every thread */
        if (i == 0) NIB_KT(NIB_KT_LOWBIT, NIB_KT_MARK1); /* the first X window is in */
        Chunk<FMT> ch[CPS][R];
        if (REG == 2) {
            /* the positions that copied something (IssueState::step: rg_ok and a chunk left) */
            if (rg_ok[0] && use_c < c_end) mbar_wait(is.bbar + use_stage * 8, use_phase);
            const unsigned char *stp = bring_ptr + use_stage * (CPS * BulkChunk<FMT>::B);
#pragma unroll
            for (int cc = 0; cc < CPS; cc++) read_chunk_bulk<FMT, CPS>(ch[cc][0], stp, cc, lane, g);
        } else if (REG == 1) {
#pragma unroll
            for (int cc = 0; cc < CPS; cc++) ch[cc][0] = cur[cc];
            rwp += is.wstep;
            rsp += is.sstep;
            rc += p.wk * CPS;
            if (i + 1 < nsteps) load_chunks_reg<FMT, CPS>(nx, rwp, rsp, rg_ok[0], rc, c_end, g, pol);
        } else {
#pragma unroll
            for (int cc = 0; cc < CPS; cc++) read_chunk<FMT, CPS>(ch[cc][0], smem, use_stage, cc, g);
        }
        is.step(p, ring);
#pragma unroll
        for (int cc = 0; cc < CPS; cc++) {
            if (use_c + cc < c_end && (REG != 2 || rg_ok[0])) { /* (REG = 2: no copy, no data) */
                const uint32_t off =
                    (uint32_t)(use_xb * xs_stride + ((use_in * p.wk + wkk) * CPS + cc) * KCH) * 2;
                uint32_t bw[MT];
#pragma unroll
                for (int nt = 0; nt < MT; nt++) bw[nt] = brow[nt] + off;
                compute_chunk<FMT, MT, R>(acc, acc2, ch[cc], p.scale_add, bw);
            }
        }
        if (++use_stage == S) {
            use_stage = 0;
            use_phase ^= 1u;
        }
        use_c += p.wk * CPS;
        if (++use_in == p.xw) {
            use_in = 0;
            use_xb = use_xb + 1 == p.nxb ? 0 : use_xb + 1;
        }
    };
#if NIB_GEMM_LAB_PINGPONG
    if constexpr (REG == 1) {
        Chunk<FMT> nxt2[CPS];
        for (int i = 0; i < nsteps; i += 2) {
            kstep(i, nxt, nxt2);
            if (i + 1 < nsteps) kstep(i + 1, nxt2, nxt);
        }
    } else
#endif
    {
#if NIB_GEMM_LAB_UNROLL2
#pragma unroll 2
#endif
        for (int i = 0; i < nsteps; i++) kstep(i, nxt, nxt);
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int nt = 0; nt < MT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[r][nt][i] += acc2[r][nt][i];
    __syncthreads(); /* all warps are done with ring and X buffers: reuse them for the reduction */
    NIB_KT(NIB_KT_LOWBIT, NIB_KT_MARK2); /* every warp's K loop done */

    float *red = (float *)smem;
    const int frag = R * MT * 4;
    if (wkk > 0) {
        float *dst = red + ((wkk - 1) * wn_count + wn) * frag * 32;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int nt = 0; nt < MT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) dst[((r * MT + nt) * 4 + i) * 32 + lane] = acc[r][nt][i];
    }
    __syncthreads();
    const int t = lane & 3;
    if (wkk == 0) {
        for (int q = 1; q < p.wk; q++) {
            const float *src = red + ((q - 1) * wn_count + wn) * frag * 32;
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int nt = 0; nt < MT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[r][nt][i] += src[((r * MT + nt) * 4 + i) * 32 + lane];
        }
        if ((L >> 2) != 2 && p.ksplit == 1) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (!rg_ok[r]) continue;
#pragma unroll
                for (int nt = 0; nt < MT; nt++)
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        int mm = m0 + nt * 8 + 2 * t + i;
                        if (mm >= p.m) continue;
                        if constexpr (EPRE) {
                            epi_pair(p, rg0 + r, g, mm, acc[r][nt][i], acc[r][nt][2 + i], epre[r][nt][i]);
                        } else {
                            epi_pair_lazy(p, rg0 + r, g, mm, acc[r][nt][i], acc[r][nt][2 + i]);
                        }
                    }
            }
        } else {
            /* split-K: this CTA's partial sums go to its own slot (deterministic: the last CTA
             * adds the slots in a fixed order, no atomics on values) */
            float *slot = p.ws + ((size_t)blockIdx.y * gridDim.z + blockIdx.z) * p.np * MC;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (!rg_ok[r]) continue;
                int pr = (rg0 + r) * 16 + g;
#pragma unroll
                for (int nt = 0; nt < MT; nt++) {
                    float *d0 = slot + (size_t)pr * MC + nt * 8 + 2 * t;
                    __stcg((float2 *)d0, make_float2(acc[r][nt][0], acc[r][nt][1]));
                    __stcg((float2 *)(d0 + 8 * MC), make_float2(acc[r][nt][2], acc[r][nt][3]));
                }
            }
        }
    }
    NIB_KT(NIB_KT_LOWBIT, NIB_KT_MARK3); /* thread 0's outputs (or split-K partials) stored */
    if (p.ksplit == 1 || (L >> 2) == 1) return;

    /* split-K: the last CTA of this (row block, M chunk) finishes the tile */
    __shared__ int s_last;
    __syncthreads(); /* publish / acquire: one acq_rel add between two CTA barriers (atomic_add_acq_rel_gpu) */
    int *ctr = p.counters + blockIdx.z * p.row_blocks + blockIdx.x;
    if (threadIdx.x == 0) s_last = (atomic_add_acq_rel_gpu(ctr, 1) == p.ksplit - 1);
    __syncthreads();
    if (!s_last) return;
    NIB_KT(NIB_KT_LOWBIT, NIB_KT_MARK4); /* the last CTA of the K split starts the sum */
    const int rows_cta = 16 * R * wn_count;
    const int pb = blockIdx.x * rows_cta;
    const int rows = min(rows_cta, p.np - pb);
    const int toks = min(MT * 8, p.m - m0);
    /* sum of the ksplit slots for (row pr, token j), in slot order; up to 8 slots' loads are issued
     * before their additions (one add at a time after each load made the last CTA wait ksplit
     * dependent L2 round trips) */
    const size_t slot_stride = (size_t)gridDim.z * p.np * MC;
    const float *wsb = p.ws + (size_t)blockIdx.z * p.np * MC;
    auto partial = [&](int pr, int j) {
        const float *src = wsb + (size_t)pr * MC + j;
        float v = 0.f;
        for (int q = 0; q < p.ksplit; q += 8) {
            float s8[8];
#pragma unroll
            for (int u = 0; u < 8; u++) s8[u] = q + u < p.ksplit ? __ldcg(src + (size_t)(q + u) * slot_stride) : 0.f;
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (q + u < p.ksplit) v += s8[u];
        }
        return v;
    };
    /* (output q, token j) of idx = threadIdx.x + i * 256, advanced with one carry (two divisions
     * per CTA, not one per output) */
    XWalk ow;
    ow.init(toks);
    if (p.qkv) {
        for (int q = ow.row0, j = ow.pc0; q < rows / 2;) {
            const int n = pb / 2 + q, pg = (n >> 3) * 16 + (n & 7);
            if (2 * n < p.n_out)
                qkv_pair(p, n, m0 + j, epi_val(p, pg, partial(pg, j)), epi_val(p, pg + 8, partial(pg + 8, j)),
                         qkv_cs(p, n, m0 + j), qkv_slot_base(p));
            q += ow.drow;
            j += ow.dpc;
            if (j >= toks) {
                j -= toks;
                q++;
            }
        }
    } else if (p.geglu) {
        const int outs = rows / 2;
        for (int q = ow.row0, j = ow.pc0; q < outs;) {
            const int n = pb / 2 + q;
            if (n < p.n_out) {
                const int pg = (n >> 3) * 16 + (n & 7);
                const float vg = epi_val(p, pg, partial(pg, j)), vu = epi_val(p, pg + 8, partial(pg + 8, j));
                epi_store(p, n, m0 + j, gelu_tanh(vg) * vu);
            }
            q += ow.drow;
            j += ow.dpc;
            if (j >= toks) {
                j -= toks;
                q++;
            }
        }
    } else {
        for (int q = ow.row0, j = ow.pc0; q < rows;) {
            const int pr = pb + q;
            if (pr < p.n_out) epi_store(p, pr, m0 + j, epi_val(p, pr, partial(pr, j)));
            q += ow.drow;
            j += ow.dpc;
            if (j >= toks) {
                j -= toks;
                q++;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) *ctr = 0;
}

template <int FMT, int MT, int R, int OCC, int REG, int L = 0>
__global__ void __launch_bounds__(WARPS * 32, OCC) k_gemm_lowbit(GemmParams pa) {
    if constexpr (L == 0) {
        gemm_lowbit_body<FMT, MT, R, REG, 0>(pa);
    } else { /* the lean variants' fixed fields as constants the compiler propagates */
        GemmParams p = pa;
        p.perm = nullptr;
        p.bias = nullptr;
        p.qkv = (L & 3) == LEAN_QKV;
        p.geglu = (L & 3) == LEAN_GEGLU;
        if constexpr ((L & 3) != LEAN_PLAIN) {
            p.gate = nullptr;
            p.res = nullptr;
        }
        if constexpr ((L >> 2) == 1) p.ksplit = 1;
        gemm_lowbit_body<FMT, MT, R, REG, L>(p);
    }
}

/* ======================================================================================
 * Repack: canonical planar layout (device staging copy) -> kernel layout.
 * One thread per (row group, chunk, lane). Rows/columns past the logical shape are zero.
 * Invalid scales (NaN, negative) set *bad (the host turns it into an error naming the tensor).
 * ====================================================================================== */
struct RepackParams {
    nib_wfmt fmt;
    const uint8_t *data, *scales, *zeros;
    const float *fscales; /* FP8 scales */
    const float *bias;
    uint8_t *w, *s;
    float *colscale, *bias_out;
    int n, k, np, ng, nchunks, group, pair_half, fp8_per_channel, mx_j;
    float global;
    int *bad;
};

/* logical row of repacked row pr. With pairs (pair_half P > 0), a 16-row group holds 8 pairs
 * n = rg * 8 + i, i < 8: row i is row d and row i + 8 row P + d of block n / P (d = n % P).
 * GeGLU is one block, P = n / 2 (8 gate rows and their 8 up rows); a q|k|v weight loaded with
 * rope_half has a block per head, P = head_dim / 2 (RoPE's rotate-half partners). */
__device__ __forceinline__ int logical_row(const RepackParams &q, int pr) {
    if (!q.pair_half) return pr;
    const int n = (pr >> 4) * 8 + (pr & 7), blk = n / q.pair_half, d = n - blk * q.pair_half;
    return blk * 2 * q.pair_half + ((pr & 15) < 8 ? d : q.pair_half + d);
}
__device__ __forceinline__ bool row_valid(const RepackParams &q, int pr) {
    if (!q.pair_half) return pr < q.n;
    return (pr >> 4) * 8 + (pr & 7) < q.n / 2;
}

__device__ __forceinline__ uint32_t nib_at(const RepackParams &q, int pr, int kk) {
    if (!row_valid(q, pr) || kk >= q.k) return 0;
    uint8_t b = q.data[(size_t)logical_row(q, pr) * (q.k / 2) + kk / 2];
    return (kk & 1) ? (b >> 4) : (b & 15);
}

/* E4M3 (non-negative) -> unsigned E5M3 code: 2^(E-10) * (1 + M/8), code 0 = zero. */
__device__ __forceinline__ uint32_t e4m3_to_e5m3(uint8_t b, int *bad) {
    if (b == 0x80) return 0; /* -0: a zero scale */
    if ((b & 0x7F) == 0x7F || (b & 0x80)) { /* NaN or negative: not a valid block scale */
        atomicExch(bad, 1);
        return 0;
    }
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 0) {
        if (m == 0) return 0;
        int ex = -6; /* value = m/8 * 2^-6: normalize */
        while (!(m & 8)) {
            m <<= 1;
            ex--;
        }
        m &= 7;
        return (uint32_t)(((ex + 10) << 3) | m);
    }
    return (uint32_t)(((e - 7 + 10) << 3) | m);
}

__global__ void k_repack(RepackParams q) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)q.ng * q.nchunks * 32;
    if (tid >= total) return;
    const int lane = (int)(tid & 31);
    const long long tile = tid >> 5;
    const int c = (int)(tile % q.nchunks), rg = (int)(tile / q.nchunks);
    const int g = lane >> 2, t = lane & 3;
    const int rowg = rg * 16 + g, rowg8 = rowg + 8;
    const int parts = q.fmt == NIB_WFMT_FP8 ? 4 : 2;
    uint8_t *wdst = q.w + (size_t)tile * parts * 512 + lane * 16;

    if (q.fmt == NIB_WFMT_FP8) {
        for (int s = 0; s < 8; s++) {
            int kk = c * KCH + s * 16 + 2 * t;
            auto byte_at = [&](int pr, int k2) -> uint32_t {
                if (!row_valid(q, pr) || k2 >= q.k) return 0;
                return q.data[(size_t)logical_row(q, pr) * q.k + k2];
            };
            uint32_t a0 = byte_at(rowg, kk), a1 = byte_at(rowg, kk + 1);
            uint32_t a2 = byte_at(rowg8, kk), a3 = byte_at(rowg8, kk + 1);
            uint32_t a4 = byte_at(rowg, kk + 8), a5 = byte_at(rowg, kk + 9);
            uint32_t a6 = byte_at(rowg8, kk + 8), a7 = byte_at(rowg8, kk + 9);
            uint32_t u0 = a2 | (a0 << 8) | (a3 << 16) | (a1 << 24);
            uint32_t u1 = a6 | (a4 << 8) | (a7 << 16) | (a5 << 24);
            uint32_t *d = (uint32_t *)(wdst + (s >> 1) * 512) + (s & 1) * 2;
            d[0] = u0;
            d[1] = u1;
        }
    } else {
        for (int s = 0; s < 8; s++) {
            int kk = c * KCH + s * 16 + 2 * t;
            uint32_t e[8] = {nib_at(q, rowg, kk),      nib_at(q, rowg, kk + 1),
                             nib_at(q, rowg8, kk),     nib_at(q, rowg8, kk + 1),
                             nib_at(q, rowg, kk + 8),  nib_at(q, rowg, kk + 9),
                             nib_at(q, rowg8, kk + 8), nib_at(q, rowg8, kk + 9)};
            uint32_t word = 0;
            if (q.fmt == NIB_WFMT_INT4) {
                /* a(2j) at bits 4j, a(2j+1) at 16+4j: the register pairs of dec_u4 */
                for (int j = 0; j < 4; j++) word |= (e[2 * j] << (4 * j)) | (e[2 * j + 1] << (16 + 4 * j));
            } else {
                if (q.fmt == NIB_WFMT_NVFP4) {
                    /* a zero block scale: every element of that block dequantizes to 0 */
                    int blk_g = kk / 16, blk_g8 = blk_g;
                    uint8_t sg = row_valid(q, rowg) && kk < q.k
                                     ? q.scales[(size_t)logical_row(q, rowg) * (q.k / 16) + blk_g] : 1;
                    uint8_t sg8 = row_valid(q, rowg8) && kk < q.k
                                      ? q.scales[(size_t)logical_row(q, rowg8) * (q.k / 16) + blk_g8] : 1;
                    if ((sg & 0x7F) == 0) e[0] = e[1] = e[4] = e[5] = 0;
                    if ((sg8 & 0x7F) == 0) e[2] = e[3] = e[6] = e[7] = 0;
                }
                for (int i = 0; i < 8; i++) {
                    Fp4Pos ps = fp4_pos(i);
                    uint32_t code = e[i];
                    for (int b = 0; b < 3; b++) word |= ((code >> b) & 1u) << ps.mag[b];
                    word |= ((code >> 3) & 1u) << ps.sign;
                }
            }
            ((uint32_t *)(wdst + (s >> 2) * 512))[s & 3] = word;
        }
    }

    /* scales: written by the t == 0 lane of each g */
    if (t != 0) return;
    if (q.fmt == NIB_WFMT_NVFP4) {
        uint8_t *sd = q.s + (size_t)tile * 128 + g * 16;
        for (int s = 0; s < 8; s++) {
            int blk = c * 8 + s; /* 16-element block index */
            for (int h = 0; h < 2; h++) {
                int pr = h ? rowg8 : rowg;
                uint32_t code = 0;
                if (row_valid(q, pr) && blk * 16 < q.k)
                    code = e4m3_to_e5m3(q.scales[(size_t)logical_row(q, pr) * (q.k / 16) + blk], q.bad);
                sd[s * 2 + h] = (uint8_t)code;
            }
        }
    } else if (q.fmt == NIB_WFMT_MXFP4) {
        uint8_t *sd = q.s + (size_t)tile * 64 + g * 8;
        for (int b = 0; b < 4; b++) {
            int blk = c * 4 + b;
            for (int h = 0; h < 2; h++) {
                int pr = h ? rowg8 : rowg;
                uint32_t f = 127; /* padded: any normal exponent (elements are zero) */
                if (row_valid(q, pr) && blk * 32 < q.k) {
                    uint8_t ev = q.scales[(size_t)logical_row(q, pr) * (q.k / 32) + blk];
                    int fe = (int)ev + 126 - q.mx_j;
                    if (ev == 0xFF || fe < 1 || fe > 254) atomicExch(q.bad, 1);
                    f = (uint32_t)max(1, min(254, fe));
                }
                sd[b * 2 + h] = (uint8_t)f;
            }
        }
    } else if (q.fmt == NIB_WFMT_INT4) {
        uint32_t *sd = (uint32_t *)(q.s + (size_t)tile * 64 + g * 8);
        const int gpr = q.k / q.group;
        for (int h = 0; h < 2; h++) {
            int pr = h ? rowg8 : rowg;
            uint32_t meta = 0x43080000u; /* scale 0, zero 8 */
            if (row_valid(q, pr)) {
                int lr = logical_row(q, pr), grp = (c * KCH) / q.group;
                uint16_t sc = ((const uint16_t *)q.scales)[(size_t)lr * gpr + grp];
                uint32_t z = q.zeros ? q.zeros[(size_t)lr * gpr + grp] : 8u;
                if ((sc & 0x7C00) == 0x7C00 || z > 15) atomicExch(q.bad, 1);
                meta = (uint32_t)sc | ((0x4300u | z) << 16);
            }
            sd[h] = meta;
        }
    }
    /* per-row fp32 epilogue vectors: lane (g, t=0) of chunk 0 writes rows g and g+8 */
    if (c != 0) return;
    for (int h = 0; h < 2; h++) {
        int pr = h ? rowg8 : rowg;
        float cs = 0.f, bs = 0.f;
        if (row_valid(q, pr)) {
            int lr = logical_row(q, pr);
            switch (q.fmt) {
            case NIB_WFMT_NVFP4: cs = q.global * 256.0f; break;
            case NIB_WFMT_MXFP4: cs = ldexpf(1.0f, q.mx_j); break;
            case NIB_WFMT_INT4: cs = 1.0f; break;
            default: {
                float v = q.fscales[q.fp8_per_channel ? lr : 0];
                if (!(v >= 0.f) || isinf(v)) atomicExch(q.bad, 1);
                cs = v;
            }
            }
            if (q.bias) bs = q.bias[lr];
        }
        q.colscale[pr] = cs;
        if (q.bias_out) q.bias_out[pr] = bs;
    }
}

/* ======================================================================================
 * host side
 * ====================================================================================== */
static nib_status padded_dims(const nib_wsrc *src, int geglu, int64_t *np, int64_t *kp) {
    int64_t rows = src->n;
    if (geglu && src->rope_half)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "a GeGLU weight cannot also have the RoPE pair layout (rope_half %d)",
                       src->rope_half);
    if (src->rope_half && (src->rope_half < 0 || src->rope_half % 8 || src->n % (2 * (int64_t)src->rope_half) ||
                           (src->rope_half & (src->rope_half - 1))))
        return NIB_ERR(NIB_ERR_SHAPE, "RoPE pair layout: rope_half %d must be a power of two >= 8 and divide the %lld "
                       "rows in blocks of 2 rope_half", src->rope_half, (long long)src->n);
    if (geglu) {
        if (src->n % 2) return NIB_ERR(NIB_ERR_SHAPE, "GeGLU weight needs an even row count, got %lld", (long long)src->n);
        int64_t h = src->n / 2; /* interleaved: 16-row groups of 8 gate + 8 up */
        rows = (h + 7) / 8 * 16;
    }
    *np = (rows + 15) / 16 * 16;
    *kp = (src->k + KCH - 1) / KCH * KCH;
    return NIB_OK;
}

nib_status nib_cuda_weight_bytes(const nib_wsrc *src, int geglu, uint64_t *bytes) {
    int64_t np = 0, kp = 0;
    NIB_RETURN_IF_ERR(padded_dims(src, geglu, &np, &kp));
    uint64_t tiles = (uint64_t)(np / 16) * (uint64_t)(kp / KCH);
    uint64_t b = 0;
    if (src->fmt == NIB_WFMT_BF16) {
        b = (uint64_t)src->n * src->k * 2 + 256;
    } else {
        b += tiles * fmt_parts(src->fmt) * 512 + 256;
        b += tiles * fmt_sb(src->fmt) + 256;
    }
    b += 2 * ((uint64_t)np * 4 + 256) + (uint64_t)src->k * 4 + 256;
    *bytes = b;
    return NIB_OK;
}

static nib_status arena_take(nib_dev_arena *a, uint64_t bytes, void **out, const char *what) {
    return nib_dev_arena_alloc(a, (size_t)bytes, out, what);
}

/* MXFP4: choose the per-tensor exponent offset j so every block factor 2^(e-1-j) is a normal
 * bf16 and every decoded A value stays normal: j = e_max - 128, needs e_max - e_min <= 126. */
static nib_status mx_offset(const nib_wsrc *src, const char *name, int *j) {
    const uint8_t *s = (const uint8_t *)src->scales;
    uint64_t cnt = (uint64_t)src->n * (src->k / 32);
    int emax = 0, emin = 255;
    for (uint64_t i = 0; i < cnt; i++) {
        if (s[i] == 0xFF)
            return NIB_ERR(NIB_ERR_NUMERICS, "%s: MXFP4 scale %llu is E8M0 NaN (0xFF)", name, (unsigned long long)i);
        if (s[i] > emax) emax = s[i];
        if (s[i] < emin) emin = s[i];
    }
    if (cnt && emax - emin > 126)
        return NIB_ERR(NIB_ERR_UNSUPPORTED,
                       "%s: MXFP4 block exponents span 2^%d..2^%d (more than 2^126): the kernel "
                       "cannot represent both ends exactly in bf16",
                       name, emin - 127, emax - 127);
    *j = cnt ? emax - 128 : 0;
    return NIB_OK;
}

nib_status nib_cuda_weight_load(const nib_wsrc *src, int geglu, const char *name, void *arena_v,
                                nib_qweight *out) {
    nib_status st = NIB_OK;
    nib_dev_arena *arena = (nib_dev_arena *)arena_v;
    void *stage = NULL;
    uint64_t stage_bytes = 0;
    int *dbad = NULL;
    memset(out, 0, sizeof *out);
    NIB_RETURN_IF_ERR(nib_device_require(NULL));
    NIB_RETURN_IF_ERR(nib_wsrc_validate(src, name));
    int64_t np = 0, kp = 0;
    NIB_RETURN_IF_ERR(padded_dims(src, geglu, &np, &kp));
    out->fmt = src->fmt;
    out->n = src->n;
    out->k = src->k;
    out->n_out = geglu ? src->n / 2 : src->n;
    out->np = np;
    out->kp = kp;
    out->geglu = geglu;
    out->rope_half = src->rope_half;
    out->group = src->group;
    out->src_bytes = nib_wsrc_bytes(src);

    if (src->fmt == NIB_WFMT_BF16) {
        if (src->rope_half)
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: bf16 weights run on cuBLAS, without the RoPE pair layout", name);
        if (geglu || src->bias)
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: bf16 weights run on cuBLAS without fused GeGLU/bias", name);
        uint64_t bytes = (uint64_t)src->n * src->k * 2;
        NIB_RETURN_IF_ERR(arena_take(arena, bytes, &out->bf16_w, name));
        return nib_dev_upload(out->bf16_w, src->data, bytes);
    }
    if (src->fmt == NIB_WFMT_INT4 && src->group != KCH)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: the INT4 kernel supports group size 128, got %d", name, src->group);

    int mx_j = 0;
    if (src->fmt == NIB_WFMT_MXFP4) NIB_RETURN_IF_ERR(mx_offset(src, name, &mx_j));

    /* device staging copy of the canonical planes */
    uint64_t data_b = src->fmt == NIB_WFMT_FP8 ? (uint64_t)src->n * src->k : (uint64_t)src->n * src->k / 2;
    uint64_t scale_b = 0, zero_b = 0;
    switch (src->fmt) {
    case NIB_WFMT_NVFP4: scale_b = (uint64_t)src->n * (src->k / 16); break;
    case NIB_WFMT_MXFP4: scale_b = (uint64_t)src->n * (src->k / 32); break;
    case NIB_WFMT_INT4:
        scale_b = (uint64_t)src->n * (src->k / src->group) * 2;
        zero_b = src->zeros ? (uint64_t)src->n * (src->k / src->group) : 0;
        break;
    default: scale_b = (uint64_t)(src->fp8_per_channel ? src->n : 1) * 4; break;
    }
    uint64_t bias_b = src->bias ? (uint64_t)src->n * 4 : 0;
    uint64_t off_scale = (data_b + 255) / 256 * 256, off_zero = off_scale + (scale_b + 255) / 256 * 256;
    uint64_t off_bias = off_zero + (zero_b + 255) / 256 * 256;
    stage_bytes = off_bias + bias_b + 256;
    NIB_TRY(nib_dev_malloc(&stage, stage_bytes, "weight staging"));
    NIB_TRY(nib_dev_malloc((void **)&dbad, sizeof(int), "repack flag"));
    NIB_CUDA_TRY(cudaMemset(dbad, 0, sizeof(int)));
    NIB_TRY(nib_dev_upload(stage, src->data, data_b));
    NIB_TRY(nib_dev_upload((uint8_t *)stage + off_scale, src->scales, scale_b));
    if (zero_b) NIB_TRY(nib_dev_upload((uint8_t *)stage + off_zero, src->zeros, zero_b));
    if (bias_b) NIB_TRY(nib_dev_upload((uint8_t *)stage + off_bias, src->bias, bias_b));

    {
        uint64_t tiles = (uint64_t)(np / 16) * (kp / KCH);
        out->w_bytes = tiles * fmt_parts(src->fmt) * 512;
        out->s_bytes = tiles * fmt_sb(src->fmt);
        NIB_TRY(arena_take(arena, out->w_bytes, &out->w, name));
        if (out->s_bytes) NIB_TRY(arena_take(arena, out->s_bytes, &out->s, name));
        NIB_TRY(arena_take(arena, (uint64_t)np * 4, (void **)&out->colscale, name));
        if (src->bias) NIB_TRY(arena_take(arena, (uint64_t)np * 4, (void **)&out->bias, name));
        if (src->perm) {
            NIB_TRY(arena_take(arena, (uint64_t)src->k * 4, (void **)&out->perm, name));
            NIB_TRY(nib_dev_upload(out->perm, src->perm, (size_t)src->k * 4));
        }
        RepackParams q;
        memset(&q, 0, sizeof q);
        q.fmt = src->fmt;
        q.data = (const uint8_t *)stage;
        q.scales = (const uint8_t *)stage + off_scale;
        q.fscales = (const float *)((const uint8_t *)stage + off_scale);
        q.zeros = zero_b ? (const uint8_t *)stage + off_zero : NULL;
        q.bias = bias_b ? (const float *)((const uint8_t *)stage + off_bias) : NULL;
        q.w = (uint8_t *)out->w;
        q.s = (uint8_t *)out->s;
        q.colscale = out->colscale;
        q.bias_out = out->bias;
        q.n = (int)src->n;
        q.k = (int)src->k;
        q.np = (int)np;
        q.ng = (int)(np / 16);
        q.nchunks = (int)(kp / KCH);
        q.group = src->group;
        q.pair_half = geglu ? (int)(src->n / 2) : src->rope_half;
        q.fp8_per_channel = src->fp8_per_channel;
        q.mx_j = mx_j;
        q.global = src->global_scale;
        q.bad = dbad;
        long long threads = (long long)tiles * 32;
        k_repack<<<(unsigned)((threads + 255) / 256), 256>>>(q);
        NIB_CUDA_TRY(cudaGetLastError());
        NIB_CUDA_TRY(cudaDeviceSynchronize());
        int bad = 0;
        NIB_TRY(nib_dev_download(&bad, dbad, sizeof bad));
        if (bad) {
            st = NIB_ERR(NIB_ERR_NUMERICS, "%s: invalid scale found while repacking %s weight "
                         "(NaN, negative or out of range)", name, nib_wfmt_name(src->fmt));
            goto fail;
        }
        if (src->fmt == NIB_WFMT_NVFP4) out->scale_add = (235u << 7) * 0x00010001u;
    }
fail:
    nib_dev_free(stage, stage_bytes);
    nib_dev_free(dbad, sizeof(int));
    return st;
}

nib_status nib_cuda_gemm_ws_init(nib_gemm_ws *ws, int64_t max_m, int64_t max_np) {
#if NIB_GEMM_LAB_DECODE
    /* a lab build (gemm_lowbit.cuh): say so wherever the low-bit GEMM is set up */
    fprintf(stderr, "nib: LAB BUILD, NIB_GEMM_LAB_DECODE=%d: NVFP4 / MXFP4 products are wrong (timing only)\n",
            NIB_GEMM_LAB_DECODE);
#endif
    memset(ws, 0, sizeof *ws);
    int64_t mchunks = (max_m + MCHUNK - 1) / MCHUNK;
    /* split-K slots: room for 2 splits of the largest weight, and at least 16 MiB so that small
     * weights can split many ways; the planner only picks splits that fit */
    uint64_t elems = (uint64_t)mchunks * max_np * MCHUNK * 2;
    if (elems < (4u << 20)) elems = 4u << 20;
    ws->acc_elems = elems;
    /* tile counters for chunks as small as 8 tokens (the lab's M-split plans; 4 bytes each) */
    ws->n_counters = (uint64_t)((max_m + 7) / 8) * (max_np / 16 + 1);
    nib_status st = nib_dev_malloc((void **)&ws->acc, ws->acc_elems * 4, "gemm split-K workspace");
    if (st) return st;
    st = nib_dev_malloc((void **)&ws->counters, ws->n_counters * 4, "gemm split-K counters");
    if (st) {
        nib_dev_free(ws->acc, ws->acc_elems * 4);
        ws->acc = NULL;
        return st;
    }
    NIB_CUDA_CHECK(cudaMemset(ws->counters, 0, ws->n_counters * 4));
    return NIB_OK;
}

void nib_cuda_gemm_ws_free(nib_gemm_ws *ws) {
    if (!ws) return;
    nib_dev_free(ws->acc, ws->acc_elems * 4);
    nib_dev_free(ws->counters, ws->n_counters * 4);
    memset(ws, 0, sizeof *ws);
}

static int g_num_sms;

/* The planner (ops/gemm_plan.c) for a loaded weight on this device. */
static nib_status weight_shape(const nib_qweight *w, int64_t m, nib_gemm_shape *sh) {
    if (m < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: M = %lld", (long long)m);
    if (!g_num_sms) {
        nib_device_info d;
        NIB_RETURN_IF_ERR(nib_device_require(&d));
        g_num_sms = d.sm_count;
    }
    if (!w || w->np < 16 || w->kp < KCH || !w->w)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: weight is not loaded (padded shape %lld x %lld)",
                       w ? (long long)w->np : 0LL, w ? (long long)w->kp : 0LL);
    sh->fmt = w->fmt;
    sh->np = w->np;
    sh->kp = w->kp;
    sh->lean = 0;
    return NIB_OK;
}

/* the weights the wgmma kernel decodes, and the tiles it has for them */
static nib_status wg_weight_check(const nib_qweight *w, int bt) {
    if ((w->fmt != NIB_WFMT_NVFP4 && w->fmt != NIB_WFMT_MXFP4 && w->fmt != NIB_WFMT_FP8 && w->fmt != NIB_WFMT_INT4) ||
        w->perm)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "gemm: the wgmma kernel runs NVFP4, MXFP4, INT4 and FP8 weights without "
                       "act-order (got %s%s)", nib_wfmt_name(w->fmt), w->perm ? " with act-order" : "");
    if (w->fmt == NIB_WFMT_INT4 && bt > 192)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "gemm: the wgmma kernel runs INT4 with 64- to 192-token tiles, not %d", bt);
    return NIB_OK;
}

static size_t wg_smem(int bt) {
    switch (bt) {
    case 16: return WgTile<16>::smem();
    case 32: return WgTile<32>::smem();
    case 64: return WgTile<64>::smem();
    case 128: return WgTile<128>::smem();
    case 192: return WgTile<192>::smem();
    default: return WgTile<256>::smem();
    }
}

/* How many clusters of ks CTAs along z of the wgmma kernel (cm = 1) can be resident at once on this
 * device (cached per format, tile and ks). A K split reduced in its cluster pays only when every
 * cluster of the launch is resident in one wave: measured (bench/results/gemm-wg-kcl-h100.json),
 * 16 clusters of 8 on 128 CTAs ran ~1.8x slower than the workspace path. */
template <int FMT, int BT> static nib_status wg_cluster_capacity_t(int ks, int *n) {
    static int attr_set;
    if (!attr_set) {
        NIB_CUDA_CHECK(cudaFuncSetAttribute(k_gemm_lowbit_wg<FMT, BT, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)WgTile<BT>::smem()));
        attr_set = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = (unsigned)ks;
    cfg.gridDim = dim3(1, 1, (unsigned)ks);
    cfg.blockDim = dim3(WgPW<FMT, BT>::THREADS);
    cfg.dynamicSmemBytes = WgTile<BT>::smem();
    cfg.attrs = at;
    cfg.numAttrs = 1;
    NIB_CUDA_CHECK(cudaOccupancyMaxActiveClusters(n, k_gemm_lowbit_wg<FMT, BT, 1>, &cfg));
    return NIB_OK;
}
template <int FMT> static nib_status wg_cluster_capacity_f(int bt, int ks, int *n) {
    switch (bt) {
    case 16: return wg_cluster_capacity_t<FMT, 16>(ks, n);
    case 32: return wg_cluster_capacity_t<FMT, 32>(ks, n);
    case 64: return wg_cluster_capacity_t<FMT, 64>(ks, n);
    case 128: return wg_cluster_capacity_t<FMT, 128>(ks, n);
    case 192: return wg_cluster_capacity_t<FMT, 192>(ks, n);
    default:
        if constexpr (FMT != NIB_WFMT_INT4) return wg_cluster_capacity_t<FMT, 256>(ks, n);
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: no INT4 wgmma kernel with %d-token tiles", bt);
    }
}
static nib_status wg_cluster_capacity(nib_wfmt fmt, int bt, int ks, int *n) {
    static int cache[4][6][9]; /* format, tile (16, 32, 64, 128, 192, 256), ks: capacity + 1 (0: not asked yet) */
    const int fi = fmt == NIB_WFMT_NVFP4 ? 0 : fmt == NIB_WFMT_MXFP4 ? 1 : fmt == NIB_WFMT_INT4 ? 2 : 3;
    const int bi = bt == 16 ? 0 : bt == 32 ? 1 : bt % 64 ? -1 : bt / 64 + 1;
    if (bi < 0 || bi > 5 || ks < 2 || ks > 8)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: no wgmma cluster of %d K splits with %d-token tiles", ks, bt);
    int *c = &cache[fi][bi][ks];
    if (!*c) {
        int v = 0;
        switch (fmt) {
        case NIB_WFMT_NVFP4: NIB_RETURN_IF_ERR(wg_cluster_capacity_f<NIB_WFMT_NVFP4>(bt, ks, &v)); break;
        case NIB_WFMT_MXFP4: NIB_RETURN_IF_ERR(wg_cluster_capacity_f<NIB_WFMT_MXFP4>(bt, ks, &v)); break;
        case NIB_WFMT_INT4: NIB_RETURN_IF_ERR(wg_cluster_capacity_f<NIB_WFMT_INT4>(bt, ks, &v)); break;
        default: NIB_RETURN_IF_ERR(wg_cluster_capacity_f<NIB_WFMT_FP8>(bt, ks, &v)); break;
        }
        *c = v + 1;
    }
    *n = *c - 1;
    return NIB_OK;
}

nib_status nib_cuda_gemm_wg_plan(const nib_qweight *w, int64_t m, int bt, int ks, int cm, nib_gemm_plan *pl) {
    nib_gemm_shape sh;
    NIB_RETURN_IF_ERR(weight_shape(w, m, &sh));
    if (bt != 16 && bt != 32 && bt != 64 && bt != 128 && bt != 192 && bt != 256)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: no wgmma kernel with %d-token tiles (16, 32, 64, 128, 192, 256)", bt);
    if (bt < 64 && cm != 1)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: the wgmma kernel's %d-token tiles run without X multicast (clusters "
                       "of 1, not %d)", bt, cm);
    if (ks < 1 || ks > w->kp / KCH)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: %d K splits of %lld chunks", ks, (long long)(w->kp / KCH));
    if (cm != 1 && cm != 2) return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: wgmma clusters of %d CTAs (1 or 2)", cm);
    NIB_RETURN_IF_ERR(wg_weight_check(w, bt));
    memset(pl, 0, sizeof *pl);
    pl->wgt = bt;
    pl->m_chunks = (int)((m + bt - 1) / bt);
    pl->row_blocks = (int)((w->np + NIB_GEMM_WG_ROWS - 1) / NIB_GEMM_WG_ROWS + cm - 1) / cm * cm;
    pl->wgc = cm;
    {
        /* the K splits reduced in their cluster where every cluster is resident at once (see
         * wg_cluster_capacity); NIB_GEMM_WG_KCL=0 keeps the workspace path everywhere */
        const char *e = getenv("NIB_GEMM_WG_KCL");
        if (ks > 1 && ks <= 8 && cm == 1 && !(e && !strcmp(e, "0"))) {
            int cap = 0;
            NIB_RETURN_IF_ERR(wg_cluster_capacity(w->fmt, bt, ks, &cap));
            pl->wkcl = (int64_t)pl->m_chunks * pl->row_blocks <= cap;
        }
    }
    pl->ctas = pl->m_chunks * pl->row_blocks * ks;
    pl->ksplit = ks;
    pl->smem = wg_smem(bt);
    return NIB_OK;
}

static int lean_env(void);
/* Whether the lean MT = 1 instantiations would run this product (launch_mt: NVFP4 and INT4, no act-order, no
 * bias, no GeGLU or q|k|v epilogue), for the planner's lean rule */
static int plan_lean(const nib_qweight *w, int qkv) { /* (gate and residual run on the lean kernels too) */
    if (lean_env() != 1 || w->perm || w->bias || w->geglu || qkv) return 0;
    return w->fmt == NIB_WFMT_INT4 || w->fmt == NIB_WFMT_NVFP4;
}

static nib_status cuda_plan(const nib_qweight *w, int64_t m, uint64_t ws_elems, int lean, nib_gemm_plan *pl) {
    nib_gemm_shape sh;
    NIB_RETURN_IF_ERR(weight_shape(w, m, &sh));
    sh.lean = lean;
    int hit = 0;
    NIB_RETURN_IF_ERR(nib_gemm_plan_forced(&sh, m, ws_elems, g_num_sms, pl, &hit));
    const int forced = hit;
    if (!hit) NIB_RETURN_IF_ERR(nib_gemm_plan_rule(&sh, w->plan_rule, m, ws_elems, g_num_sms, pl, &hit));
    if (hit && pl->wgt && !forced && w->perm) hit = 0; /* a rule's wgmma plan: no act-order there, the planner decides */
    if (hit && pl->wgt) {
        /* a wgmma plan from NIB_GEMM_FORCE (lab knob) or a rule: the kernel's checks, and a K split through the
         * workspace only where it fits (for the knob an error naming it, as for its mma.sync entries) */
        const int bt = pl->wgt, ks = pl->ksplit, cm = pl->wgc;
        nib_status st = nib_cuda_gemm_wg_plan(w, m, bt, ks, cm, pl);
        if (!st && ks > 1 && !pl->wkcl &&
            (uint64_t)ks * pl->m_chunks * pl->row_blocks * bt * NIB_GEMM_WG_ROWS > ws_elems)
            st = NIB_ERR(NIB_ERR_INVALID_ARG, "the split-K workspace (%llu floats) is too small",
                         (unsigned long long)ws_elems);
        if (st && forced) {
            char why[256]; /* the message is rewritten below: copy it out first */
            snprintf(why, sizeof why, "%s", nib_last_error());
            return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_FORCE: wg%d ks%d cm%d does not fit K=%lld N=%lld M=%lld: %s", bt,
                           ks, cm, (long long)w->kp, (long long)w->np, (long long)m, why);
        }
        return st;
    }
    if (hit) return nib_gemm_plan_xw_env(&sh, m, ws_elems, g_num_sms, pl);
    int ks = 1, cm = 1;
    const int bt = nib_gemm_wg_tile(w->fmt, w->perm != NULL, m, w->np, w->kp, ws_elems, g_num_sms, &ks, &cm);
    if (bt) return nib_cuda_gemm_wg_plan(w, m, bt, ks, cm, pl);
    NIB_RETURN_IF_ERR(nib_gemm_plan_for(&sh, m, ws_elems, g_num_sms, pl));
    return nib_gemm_plan_xw_env(&sh, m, ws_elems, g_num_sms, pl);
}

nib_status nib_cuda_gemm_plan(const nib_qweight *w, int64_t m, uint64_t ws_elems, nib_gemm_plan *pl) {
    if (!w) return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: NULL weight");
    return cuda_plan(w, m, ws_elems, plan_lean(w, 0), pl);
}

int nib_cuda_gemm_plans(const nib_qweight *w, int64_t m, uint64_t ws_elems, nib_gemm_plan *out, int max) {
    nib_gemm_shape sh;
    if (weight_shape(w, m, &sh)) return -1;
    return nib_gemm_plans_for(&sh, m, ws_elems, g_num_sms, out, max);
}

static long long g_lean_launches, g_wg_qkv_launches;
long long nib_cuda_gemm_lean_launches(void) { return __atomic_load_n(&g_lean_launches, __ATOMIC_RELAXED); }
long long nib_cuda_gemm_wg_qkv_launches(void) { return __atomic_load_n(&g_wg_qkv_launches, __ATOMIC_RELAXED); }

/* NIB_GEMM_LEAN: 1 (default) runs the lean instantiations where one applies, 0 never (A/B); -1: another value */
static int lean_env(void) {
    const char *e = getenv("NIB_GEMM_LEAN");
    if (!e || !*e || !strcmp(e, "1")) return 1;
    return strcmp(e, "0") ? -1 : 0;
}

static nib_status lean_env_error(void) {
    return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_LEAN=%s: 1 (the lean kernel instantiations where one applies, the "
                   "default) or 0 (never)", getenv("NIB_GEMM_LEAN"));
}

/* NIB_GEMM_SMEM_PAD=BYTES[:N] (a lab knob): every mma.sync low-bit launch (with :N, those of weights with N padded rows)
 * asks for at least BYTES of dynamic shared memory (at most NIB_GEMM_MAX_SMEM), so that, above half an SM's, a CTA has
 * its SM to itself: where a grid's CTAs land (docs/design.md, "Sixty-seventh session"). Unset or 0: none (the default).
 * Returns the bytes for a launch of np rows, or -1 for a bad value. */
static long smem_pad_env(int np) {
    const char *e = getenv("NIB_GEMM_SMEM_PAD");
    if (!e || !*e) return 0;
    char *end = NULL;
    const long v = strtol(e, &end, 10);
    long n = -1;
    if (*end == ':') {
        const char *ns = end + 1;
        n = strtol(ns, &end, 10);
        if (end == ns || n < 1) return -1;
    }
    if (*end || end == e || v < 0 || v > NIB_GEMM_MAX_SMEM) return -1;
    return n < 0 || n == np ? v : 0;
}

template <int FMT, int MT, int R, int OCC, int REG, int L = 0>
static nib_status launch_t(const GemmParams &p, dim3 grid, size_t smem, cudaStream_t stream) {
    const long pad = smem_pad_env(p.np);
    if (pad < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_SMEM_PAD=%s: BYTES[:N], bytes of dynamic shared memory 0 .. %d, "
                       "optionally only for weights of N rows", getenv("NIB_GEMM_SMEM_PAD"), NIB_GEMM_MAX_SMEM);
    if ((size_t)pad > smem) smem = (size_t)pad;
    static int attr_set;
    if (!attr_set) {
        NIB_CUDA_CHECK(cudaFuncSetAttribute(k_gemm_lowbit<FMT, MT, R, OCC, REG, L>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, NIB_GEMM_MAX_SMEM));
        attr_set = 1;
    }
    NIB_CUDA_CHECK(nib::launch(k_gemm_lowbit<FMT, MT, R, OCC, REG, L>, grid, dim3(WARPS * 32), smem, stream, p));
    NIB_LAUNCH_CHECK("k_gemm_lowbit");
    return NIB_OK;
}

template <int FMT, int BT, int CM, int L = 0>
static nib_status launch_wg_t(const GemmParams &p, const CUtensorMap &tmx, dim3 grid, cudaStream_t stream) {
    static int attr_set;
    if (!attr_set) {
        NIB_CUDA_CHECK(cudaFuncSetAttribute(k_gemm_lowbit_wg<FMT, BT, CM, L>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)WgTile<BT>::smem()));
        attr_set = 1;
    }
    if (CM > 1 || p.kcl) /* X multicast along the row tiles, or a K split in one cluster along z */
        NIB_CUDA_CHECK(nib::launch_cluster(k_gemm_lowbit_wg<FMT, BT, CM, L>, grid, dim3(WgPW<FMT, BT>::THREADS), WgTile<BT>::smem(),
                                           stream, CM > 1 ? dim3(1, CM, 1) : dim3(1, 1, (unsigned)p.ksplit), tmx, p));
    else
        NIB_CUDA_CHECK(nib::launch(k_gemm_lowbit_wg<FMT, BT, CM, L>, grid, dim3(WgPW<FMT, BT>::THREADS), WgTile<BT>::smem(), stream, tmx, p));
    NIB_LAUNCH_CHECK("k_gemm_lowbit_wg");
    return NIB_OK;
}

template <int FMT, int CM>
static nib_status launch_wg_bt(int bt, const GemmParams &p, const CUtensorMap &tmx, dim3 g, cudaStream_t s) {
    if constexpr (CM == 1) { /* (nib_cuda_gemm_wg_plan and launch_wg refuse multicast below 64 tokens) */
        if (bt == 16) return launch_wg_t<FMT, 16, 1>(p, tmx, g, s);
        if (bt == 32) return launch_wg_t<FMT, 32, 1>(p, tmx, g, s);
    }
    switch (bt) {
    case 64: return launch_wg_t<FMT, 64, CM>(p, tmx, g, s);
    case 128: return launch_wg_t<FMT, 128, CM>(p, tmx, g, s);
    default:
        if (bt == 192) return launch_wg_t<FMT, 192, CM>(p, tmx, g, s);
        if constexpr (FMT != NIB_WFMT_INT4) { /* (wg_weight_check refuses INT4 here) */
            if (bt == 256) return launch_wg_t<FMT, 256, CM>(p, tmx, g, s);
        }
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: no wgmma kernel with %d-token tiles for %s", bt, nib_wfmt_name((nib_wfmt)FMT));
    }
}

template <int FMT>
static nib_status launch_wg_cm(int bt, int cm, const GemmParams &p, const CUtensorMap &tmx, dim3 g, cudaStream_t s) {
    return cm == 2 ? launch_wg_bt<FMT, 2>(bt, p, tmx, g, s) : launch_wg_bt<FMT, 1>(bt, p, tmx, g, s);
}

/* the wgmma kernel (plan wgt > 0): NVFP4, MXFP4, INT4, FP8 without act-order */
static nib_status launch_wg(const nib_qweight *w, const GemmParams &p, const void *x, int64_t ldx, int bt, int cm,
                            const nib_gemm_ws *ws, cudaStream_t s) {
    NIB_RETURN_IF_ERR(wg_weight_check(w, bt));
    CUtensorMap tmx;
    if (cm != 1 && cm != 2) return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: wgmma clusters of %d CTAs (1 or 2)", cm);
    if (bt < 64 && cm != 1)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: the wgmma kernel's %d-token tiles run without X multicast", bt);
    if (p.kcl && (cm != 1 || p.ksplit < 2 || p.ksplit > 8))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: a K split reduced in its cluster needs 2..8 splits without X multicast "
                       "(got %d splits, clusters of %d)", p.ksplit, cm);
    NIB_RETURN_IF_ERR(nib_tmap_rows_sw128(&tmx, x, 2, p.m, w->k, ldx, bt / cm, "low-bit gemm X"));
    /* cm = 2: the row tiles rounded up to whole clusters (a CTA past N loads and multicasts its
     * share of X, and stores nothing) */
    const int64_t rtiles = (w->np + NIB_GEMM_WG_ROWS - 1) / NIB_GEMM_WG_ROWS;
    const dim3 grid((unsigned)((p.m + bt - 1) / bt), (unsigned)((rtiles + cm - 1) / cm * cm), (unsigned)p.ksplit);
    if (p.qkv) __atomic_fetch_add(&g_wg_qkv_launches, 1, __ATOMIC_RELAXED);
    if (p.ksplit > 1 && !p.kcl) {
        const uint64_t ctas = (uint64_t)grid.x * grid.y;
        if (!ws || (uint64_t)p.ksplit * ctas * bt * NIB_GEMM_WG_ROWS > ws->acc_elems || ctas > ws->n_counters)
            return NIB_ERR(NIB_ERR_SHAPE, "gemm: %d K splits of %llu wgmma tiles (%d tokens) do not fit the workspace",
                           p.ksplit, (unsigned long long)ctas, bt);
    }
    if (w->fmt == NIB_WFMT_NVFP4 && bt < 64 && p.ksplit == 1 && !p.bias && !p.qkv) {
        /* the lean 16- and 32-token tiles (NIB_GEMM_LEAN), one K split: small M on wide weights */
        const int env = lean_env();
        if (env < 0) return lean_env_error();
        if (env) {
            __atomic_fetch_add(&g_lean_launches, 1, __ATOMIC_RELAXED);
            if (bt == 16)
                return p.geglu ? launch_wg_t<NIB_WFMT_NVFP4, 16, 1, WG_LEAN(1, 1)>(p, tmx, grid, s)
                               : launch_wg_t<NIB_WFMT_NVFP4, 16, 1, WG_LEAN(1, 0)>(p, tmx, grid, s);
            return p.geglu ? launch_wg_t<NIB_WFMT_NVFP4, 32, 1, WG_LEAN(1, 1)>(p, tmx, grid, s)
                           : launch_wg_t<NIB_WFMT_NVFP4, 32, 1, WG_LEAN(1, 0)>(p, tmx, grid, s);
        }
    }
    if (w->fmt == NIB_WFMT_NVFP4 && bt == 64 && cm == 1 && !p.bias && !(p.qkv && p.geglu)) {
        /* the lean instantiations (NIB_GEMM_LEAN): the action expert's products at H = 50 */
        const int env = lean_env();
        if (env < 0) return lean_env_error();
        if (env) {
            __atomic_fetch_add(&g_lean_launches, 1, __ATOMIC_RELAXED);
            const int split = p.ksplit == 1 ? 1 : p.kcl ? 2 : 3;
            if (p.qkv)
                return split == 1   ? launch_wg_t<NIB_WFMT_NVFP4, 64, 1, WG_LEAN_QKV(1)>(p, tmx, grid, s)
                       : split == 2 ? launch_wg_t<NIB_WFMT_NVFP4, 64, 1, WG_LEAN_QKV(2)>(p, tmx, grid, s)
                                    : launch_wg_t<NIB_WFMT_NVFP4, 64, 1, WG_LEAN_QKV(3)>(p, tmx, grid, s);
            switch (WG_LEAN(split, p.geglu ? 1 : 0)) {
            case WG_LEAN(1, 0): return launch_wg_t<NIB_WFMT_NVFP4, 64, 1, WG_LEAN(1, 0)>(p, tmx, grid, s);
            case WG_LEAN(2, 0): return launch_wg_t<NIB_WFMT_NVFP4, 64, 1, WG_LEAN(2, 0)>(p, tmx, grid, s);
            case WG_LEAN(3, 0): return launch_wg_t<NIB_WFMT_NVFP4, 64, 1, WG_LEAN(3, 0)>(p, tmx, grid, s);
            case WG_LEAN(1, 1): return launch_wg_t<NIB_WFMT_NVFP4, 64, 1, WG_LEAN(1, 1)>(p, tmx, grid, s);
            case WG_LEAN(2, 1): return launch_wg_t<NIB_WFMT_NVFP4, 64, 1, WG_LEAN(2, 1)>(p, tmx, grid, s);
            default: return launch_wg_t<NIB_WFMT_NVFP4, 64, 1, WG_LEAN(3, 1)>(p, tmx, grid, s);
            }
        }
    }
    switch (w->fmt) {
    case NIB_WFMT_NVFP4: return launch_wg_cm<NIB_WFMT_NVFP4>(bt, cm, p, tmx, grid, s);
    case NIB_WFMT_MXFP4: return launch_wg_cm<NIB_WFMT_MXFP4>(bt, cm, p, tmx, grid, s);
    case NIB_WFMT_INT4: return launch_wg_cm<NIB_WFMT_INT4>(bt, cm, p, tmx, grid, s);
    default: return launch_wg_cm<NIB_WFMT_FP8>(bt, cm, p, tmx, grid, s);
    }
}

/* the lean kind (L of k_gemm_lowbit) of a launch, 0 where none applies */
static int lean_kind(const GemmParams &p) {
    if (p.perm || p.bias) return 0;
    const int split = p.ksplit == 1 ? 1 : 2;
    if (p.qkv) return p.geglu || p.gate || p.res ? 0 : LEAN(LEAN_QKV, split);
    if (p.geglu) return p.gate || p.res ? 0 : LEAN(LEAN_GEGLU, split);
    return LEAN(LEAN_PLAIN, split);
}

/* the lean instantiations: NVFP4's MT = 2 plans with register-loaded weights (the action expert's at H <= 16)
 * and MT = 1 ones (M <= 8: decoding, the issue-3 lab's M = 1 rows) */
template <int FMT, int MT, int REG = 1>
static nib_status launch_lean(int lk, const GemmParams &p, dim3 g, size_t smem, cudaStream_t s) {
    __atomic_fetch_add(&g_lean_launches, 1, __ATOMIC_RELAXED);
    switch (lk) {
    case LEAN(LEAN_PLAIN, 1): return launch_t<FMT, MT, 1, 2, REG, LEAN(LEAN_PLAIN, 1)>(p, g, smem, s);
    case LEAN(LEAN_PLAIN, 2): return launch_t<FMT, MT, 1, 2, REG, LEAN(LEAN_PLAIN, 2)>(p, g, smem, s);
    case LEAN(LEAN_GEGLU, 1): return launch_t<FMT, MT, 1, 2, REG, LEAN(LEAN_GEGLU, 1)>(p, g, smem, s);
    case LEAN(LEAN_GEGLU, 2): return launch_t<FMT, MT, 1, 2, REG, LEAN(LEAN_GEGLU, 2)>(p, g, smem, s);
    case LEAN(LEAN_QKV, 1): return launch_t<FMT, MT, 1, 2, REG, LEAN(LEAN_QKV, 1)>(p, g, smem, s);
    case LEAN(LEAN_QKV, 2): return launch_t<FMT, MT, 1, 2, REG, LEAN(LEAN_QKV, 2)>(p, g, smem, s);
    default: return NIB_ERR(NIB_ERR_INTERNAL, "gemm: lean kind %d", lk);
    }
}

/* INT4's: its MT = 1 plans with a plain epilogue (the issue-3 lab's M = 1 rows; gate and residual at run time since
 * the forty-ninth session: a decoder's down projection), weights in registers (REG 1) or by bulk copies (REG 2) */
template <int REG>
static nib_status launch_lean_int4(int lk, const GemmParams &p, dim3 g, size_t smem, cudaStream_t s) {
    __atomic_fetch_add(&g_lean_launches, 1, __ATOMIC_RELAXED);
    return lk == LEAN(LEAN_PLAIN, 1) ? launch_t<NIB_WFMT_INT4, 1, 1, 2, REG, LEAN(LEAN_PLAIN, 1)>(p, g, smem, s)
                                     : launch_t<NIB_WFMT_INT4, 1, 1, 2, REG, LEAN(LEAN_PLAIN, 2)>(p, g, smem, s);
}

/* NVFP4's MT = 1 plans with bulk-copied weights (REG 2) and a plain epilogue */
template <int FMT>
static nib_status launch_lean_bulk(int lk, const GemmParams &p, dim3 g, size_t smem, cudaStream_t s) {
    __atomic_fetch_add(&g_lean_launches, 1, __ATOMIC_RELAXED);
    return lk == LEAN(LEAN_PLAIN, 1) ? launch_t<FMT, 1, 1, 2, 2, LEAN(LEAN_PLAIN, 1)>(p, g, smem, s)
                                     : launch_t<FMT, 1, 1, 2, 2, LEAN(LEAN_PLAIN, 2)>(p, g, smem, s);
}

template <int FMT>
static nib_status launch_mt(int mt, int occ, int reg, const GemmParams &p, dim3 g, size_t smem, cudaStream_t s) {
    if constexpr (FMT == NIB_WFMT_INT4) {
        if (mt == 1 && reg && !p.qkv && !p.geglu) {
            const int env = lean_env();
            if (env < 0) return lean_env_error();
            const int lk = env ? lean_kind(p) : 0;
            if (lk) return reg == 2 ? launch_lean_int4<2>(lk, p, g, smem, s) : launch_lean_int4<1>(lk, p, g, smem, s);
        }
    }
    if constexpr (FMT == NIB_WFMT_NVFP4) {
        if (((mt == 1 || mt == 2) && reg == 1) || (mt == 1 && reg == 2 && !p.qkv && !p.geglu)) {
            const int env = lean_env();
            if (env < 0) return lean_env_error();
            const int lk = env ? lean_kind(p) : 0;
            if (lk && reg == 2) return launch_lean_bulk<FMT>(lk, p, g, smem, s);
            if (lk) return mt == 1 ? launch_lean<FMT, 1>(lk, p, g, smem, s) : launch_lean<FMT, 2>(lk, p, g, smem, s);
        }
    }
    switch (mt) {
    case 1:
        return reg == 2 ? launch_t<FMT, 1, 1, 2, 2>(p, g, smem, s)
               : reg    ? launch_t<FMT, 1, 1, 2, 1>(p, g, smem, s)
                        : launch_t<FMT, 1, 1, 2, 0>(p, g, smem, s);
    case 2: return reg ? launch_t<FMT, 2, 1, 2, 1>(p, g, smem, s) : launch_t<FMT, 2, 1, 2, 0>(p, g, smem, s);
    case 4: return reg ? launch_t<FMT, 4, 1, 2, 1>(p, g, smem, s) : launch_t<FMT, 4, 1, 2, 0>(p, g, smem, s);
    default:
        return occ == 1 ? launch_t<FMT, 8, 1, 1, 0>(p, g, smem, s) : launch_t<FMT, 8, 1, 2, 0>(p, g, smem, s);
    }
}

nib_status nib_cuda_gemm(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, void *y,
                         int64_t ldy, const nib_gemm_epi *epi, nib_gemm_ws *ws, void *stream) {
    return nib_cuda_gemm_planned(w, x, m, ldx, y, ldy, epi, ws, NULL, stream);
}

static nib_status gemm_run(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, void *y, int64_t ldy,
                           const nib_gemm_epi *epi, nib_gemm_ws *ws, const nib_gemm_plan *plan, const nib_qkv_args *qa,
                           void *stream);

nib_status nib_cuda_gemm_planned(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, void *y,
                                 int64_t ldy, const nib_gemm_epi *epi, nib_gemm_ws *ws,
                                 const nib_gemm_plan *plan, void *stream) {
    return gemm_run(w, x, m, ldx, y, ldy, epi, ws, plan, NULL, stream);
}

/* NIB_GEMM_WG_QKV: 1 (the default) runs ops/qkv.h's epilogue in the wgmma kernel too (Pi0.5's q|k|v at H = 50),
 * 0 leaves it to nib_cuda_qkv after a wgmma product (A/B); -1: another value */
static int wg_qkv_env(void) {
    const char *e = getenv("NIB_GEMM_WG_QKV");
    if (!e || !*e || !strcmp(e, "1")) return 1;
    return strcmp(e, "0") ? -1 : 0;
}

/* NIB_GEMM_QKV: 1 (default) fuses ops/qkv.h's epilogue where it can, 0 never (A/B); -1: another value */
static int qkv_fuse_env(void) {
    const char *e = getenv("NIB_GEMM_QKV");
    if (!e || !*e || !strcmp(e, "1")) return 1;
    return strcmp(e, "0") ? -1 : 0;
}

int nib_cuda_gemm_qkv_fuses(const nib_qweight *w, int64_t m, const nib_qkv_args *qa, const nib_gemm_ws *ws,
                            const nib_gemm_plan *plan) {
    const int env = qkv_fuse_env(), wg = wg_qkv_env();
    if (env < 0 || wg < 0 || !w || !qa) return -1;
    if (!env || !qa->rope_cs || qa->n_valid || qa->done || qa->tokens != m || w->rope_half != qa->head_dim / 2 ||
        (qa->cache && qa->cache->dtype != NIB_KV_BF16))
        return 0;
    if (plan) return plan->wgt ? wg : 1;
    nib_gemm_plan pl;
    if (nib_cuda_gemm_plan(w, m, ws ? ws->acc_elems : 0, &pl)) {
        nib_clear_error();
        return -1;
    }
    return pl.wgt ? wg : 1;
}

nib_status nib_cuda_gemm_qkv(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, const nib_qkv_args *qa,
                             nib_gemm_ws *ws, const nib_gemm_plan *plan, void *stream) {
    static const char *who = "gemm + qkv epilogue (cuda)";
    if (!w || !qa) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL weight or qkv args", who);
    if (qkv_fuse_env() < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_QKV=%s: 1 (the q|k|v epilogue in the product's kernel where it "
                       "can, the default) or 0 (two kernels)", getenv("NIB_GEMM_QKV"));
    if (wg_qkv_env() < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_WG_QKV=%s: 1 (the q|k|v epilogue in the wgmma kernel too, the "
                       "default) or 0 (after a wgmma product, a kernel of its own)", getenv("NIB_GEMM_WG_QKV"));
    if (w->rope_half <= 0 || w->rope_half != qa->head_dim / 2)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: the weight was loaded with rope_half %d, the heads have %d dims "
                       "(needs rope_half = head_dim / 2)", who, w->rope_half, qa->head_dim);
    if (w->geglu || w->fmt == NIB_WFMT_BF16)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: a GeGLU or bf16 weight", who);
    nib_qkv_args a = *qa;
    a.pairs = 1;
    NIB_RETURN_IF_ERR(nib_qkv_validate(&a, who));
    const int64_t width = ((int64_t)a.n_heads + 2 * a.n_kv_heads) * a.head_dim;
    if (a.tokens != m || w->n_out != width)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: %lld tokens for a product of M = %lld; the weight has %lld rows for (%d + 2 * "
                       "%d) heads of %d", who, (long long)a.tokens, (long long)m, (long long)w->n_out, a.n_heads,
                       a.n_kv_heads, a.head_dim);
    const int fuse = nib_cuda_gemm_qkv_fuses(w, m, &a, ws, plan);
    if (fuse < 0) {
        nib_gemm_plan pl; /* the planner's error, named */
        NIB_RETURN_IF_ERR(nib_cuda_gemm_plan(w, m, ws ? ws->acc_elems : 0, &pl));
        return NIB_ERR(NIB_ERR_INTERNAL, "%s: no plan", who);
    }
    if (!fuse) {
        NIB_RETURN_IF_ERR(gemm_run(w, x, m, ldx, (void *)a.qkv, a.ld_qkv, NULL, ws, plan, NULL, stream));
        return nib_cuda_qkv(&a, stream);
    }
    return gemm_run(w, x, m, ldx, (void *)a.qkv, a.ld_qkv, NULL, ws, plan, &a, stream);
}

static nib_status gemm_run(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, void *y, int64_t ldy,
                           const nib_gemm_epi *epi, nib_gemm_ws *ws, const nib_gemm_plan *plan, const nib_qkv_args *qa,
                           void *stream) {
    if (!w || !x || !y) return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: NULL weight, x or y");
    if (w->fmt == NIB_WFMT_BF16)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "gemm: bf16 weights go through nib_blas_gemm_bf16");
    if (ldx < w->k || ldy < w->n_out || (ldx % 8) || ((uintptr_t)x % 16))
        return NIB_ERR(NIB_ERR_SHAPE,
                       "gemm: ldx %lld (needs >= K=%lld, multiple of 8, x 16-byte aligned), ldy %lld "
                       "(needs >= %lld)",
                       (long long)ldx, (long long)w->k, (long long)ldy, (long long)w->n_out);
    if (epi && epi->geglu != w->geglu)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: epilogue GeGLU=%d but the weight was repacked with GeGLU=%d",
                       epi->geglu, w->geglu);
    nib_gemm_plan pl;
    if (plan && plan->wgt) {
        if (plan->ksplit < 1 || plan->ksplit > w->kp / KCH)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: the given wgmma plan has %d K splits of %lld chunks", plan->ksplit,
                           (long long)(w->kp / KCH));
        pl = *plan;
    } else if (plan) {
        const int mt = plan->mt;
        if ((mt != 1 && mt != 2 && mt != 4 && mt != 8) || mt > NIB_GEMM_MT(m) ||
            plan->m_chunks != (int)((m + 8 * mt - 1) / (8 * mt)))
            return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: the given plan was made for another M (mt %d, %d M chunks, M = %lld)",
                           plan->mt, plan->m_chunks, (long long)m);
        if (plan->reg < 0 || plan->reg > 2 || (plan->reg == 2 && mt != 1) || (plan->reg == 1 && mt == 8))
            return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: the given plan's weight path %d has no kernel at mt %d", plan->reg, mt);
        if (plan->ksplit > 1 && (!ws || (uint64_t)plan->ksplit * plan->m_chunks * w->np * (8 * mt) > ws->acc_elems))
            return NIB_ERR(NIB_ERR_SHAPE, "gemm: the given plan's %d K splits do not fit the workspace", plan->ksplit);
        pl = *plan;
    } else {
        NIB_RETURN_IF_ERR(cuda_plan(w, m, ws ? ws->acc_elems : 0, plan_lean(w, qa != NULL), &pl));
    }
    if (!pl.wgt && pl.ksplit > 1 && (uint64_t)pl.m_chunks * pl.row_blocks > ws->n_counters)
        return NIB_ERR(NIB_ERR_SHAPE, "gemm: workspace has %llu tile counters, M=%lld with padded N=%lld needs %llu",
                       (unsigned long long)ws->n_counters, (long long)m, (long long)w->np,
                       (unsigned long long)pl.m_chunks * pl.row_blocks);
    GemmParams p;
    memset(&p, 0, sizeof p);
    p.w = (const uint8_t *)w->w;
    p.s = (const uint8_t *)w->s;
    p.colscale = w->colscale;
    p.bias = w->bias;
    p.perm = w->perm;
    p.x = (const __nv_bfloat16 *)x;
    p.y = (__nv_bfloat16 *)y;
    p.res = epi ? (const __nv_bfloat16 *)epi->residual : NULL;
    p.gate = epi ? epi->gate : NULL;
    p.ldr = epi ? epi->ldr : 0;
    p.ws = ws ? ws->acc : NULL;
    p.counters = ws ? ws->counters : NULL;
    p.ldx = ldx;
    p.ldy = ldy;
    p.m = (int)m;
    p.k = (int)w->k;
    p.np = (int)w->np;
    p.ng = (int)(w->np / 16);
    p.nchunks = (int)(w->kp / KCH);
    p.n_out = (int)w->n_out;
    p.geglu = w->geglu;
    p.wk = pl.wk;
    p.ksplit = pl.ksplit;
    p.chunks_per_cta = (p.nchunks + pl.ksplit - 1) / pl.ksplit;
    p.row_blocks = pl.row_blocks;
    p.xw = pl.xw;
    p.nxb = pl.nxb;
    p.lds = pl.lds;
    p.ring_bytes = pl.ring_bytes;
    p.cps = NIB_GEMM_CPS(pl.mt);
    p.scale_add = w->scale_add;
    p.kcl = pl.wgt ? pl.wkcl : 0;
    if (p.res && p.ldr < p.n_out) return NIB_ERR(NIB_ERR_SHAPE, "gemm: residual ldr %lld < N_out %d", (long long)p.ldr, p.n_out);
    if (qa) { /* nib_cuda_gemm_qkv checked the arguments, and that the plan is the mma.sync kernel's or NIB_GEMM_WG_QKV=1 */
        if ((pl.wgt && wg_qkv_env() != 1) || epi)
            return NIB_ERR(NIB_ERR_INTERNAL, "gemm: the q|k|v epilogue on the wgmma kernel (NIB_GEMM_WG_QKV=0) or with another");
        p.qkv = 1;
        p.q_heads = qa->n_heads;
        p.kv_heads = qa->n_kv_heads;
        p.hd = qa->head_dim;
        p.half = qa->head_dim / 2;
        while ((1 << p.half_shift) < p.half) p.half_shift++;
        p.q_scale = qa->q_scale;
        p.rope_cs = (const float2 *)qa->rope_cs;
        p.q = (__nv_bfloat16 *)qa->q;
        p.ldq = qa->ld_q;
        if (qa->cache) {
            p.kc = (__nv_bfloat16 *)qa->cache->k;
            p.vc = (__nv_bfloat16 *)qa->cache->v;
            p.t_max = qa->cache->t_max;
        }
        p.slot_off = qa->slot_offset;
        p.slot_base = qa->slot_base;
    }
    if (pl.wgt) return launch_wg(w, p, x, ldx, pl.wgt, pl.wgc ? pl.wgc : 1, ws, (cudaStream_t)stream);
    {
        const int wn = WARPS / pl.wk; /* warps along N: a power of two (wk is 1, 2, 4 or 8) */
        p.wn_shift = 0;
        while ((1 << p.wn_shift) < wn) p.wn_shift++;
        if ((1 << p.wn_shift) != wn || wn * pl.wk != WARPS)
            return NIB_ERR(NIB_ERR_INTERNAL, "gemm: plan with %d warps along K of %d", pl.wk, WARPS);
        const int per_step = pl.wk * p.cps;
        const int last = p.nchunks - (pl.ksplit - 1) * p.chunks_per_cta;
        p.nsteps_full = (p.chunks_per_cta + per_step - 1) / per_step;
        p.nsteps_last = (last + per_step - 1) / per_step;
        const int ppr = pl.xw * pl.wk * p.cps * (KCH / 8);
        p.x_drow = (WARPS * 32) / ppr;
        p.x_dpc = WARPS * 32 - p.x_drow * ppr;
        p.x_magic = (uint32_t)(((1ull << 32) + (uint64_t)ppr - 1) / (uint64_t)ppr);
    }
    dim3 grid(pl.row_blocks, pl.ksplit, pl.m_chunks);
    size_t smem = pl.smem;
    cudaStream_t s = (cudaStream_t)stream;
    switch (w->fmt) {
    case NIB_WFMT_NVFP4: return launch_mt<NIB_WFMT_NVFP4>(pl.mt, pl.occ, pl.reg, p, grid, smem, s);
    case NIB_WFMT_MXFP4: return launch_mt<NIB_WFMT_MXFP4>(pl.mt, pl.occ, pl.reg, p, grid, smem, s);
    case NIB_WFMT_INT4: return launch_mt<NIB_WFMT_INT4>(pl.mt, pl.occ, pl.reg, p, grid, smem, s);
    case NIB_WFMT_FP8: return launch_mt<NIB_WFMT_FP8>(pl.mt, pl.occ, pl.reg, p, grid, smem, s);
    default: return NIB_ERR(NIB_ERR_UNSUPPORTED, "gemm: format %d", (int)w->fmt);
    }
}

NIB_KTRACE_UNIT(gemm_lowbit)
