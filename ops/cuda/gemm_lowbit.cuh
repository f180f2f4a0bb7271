/* gemm_lowbit.cuh — device helpers shared by nib's low-bit weight GEMM kernels:
 * PTX wrappers (mma.sync, ldmatrix, cp.async, streaming loads) and the in-register decoders
 * that turn the repacked weight words into bf16 mma A fragments.
 *
 * Kernel layout (written by the repack kernels in gemm_lowbit.cu, read here):
 *   rows are grouped by 16 (one mma A tile), K by chunks of 128 (8 k16 steps);
 *   element plane: [row_group][chunk][part][lane 0..31][16 bytes]; a part is one 16-byte load
 *   per lane = a coalesced 512-byte warp load. FP4/INT4: 2 parts, word j of part p holds the
 *   lane's 8 A-fragment elements of k16 step 4p+j. FP8: 4 parts, 2 words per k16 step.
 *   A fragment of mma.m16n8k16 (lane = 4*g + t): a0,a1 = row g, k 2t,2t+1; a2,a3 = row g+8;
 *   a4,a5 = row g, k 2t+8,2t+9; a6,a7 = row g+8, k 2t+8,2t+9. Register r holds (a2r, a2r+1).
 */
#ifndef NIB_GEMM_LOWBIT_CUH
#define NIB_GEMM_LOWBIT_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "ops/gemm.h" /* nib_wfmt */

namespace nib {

/* ---- bit layout of one FP4 word (8 E2M1 codes, code = s e1 e0 m) ----------------------
 * Decoded bf16 "raw" = (sign << 15) | (e1 e0 m << 6): exponent field e1e0, mantissa m<<6,
 * i.e. exactly value * 2^-126 for normal and subnormal codes alike. With P = 0x81C081C0 (bits
 * 6,7,8,15 | 22,23,24,31) and rotl = rotate left (one SHF.L.W):
 *   out0 = q & P                 a0: mag 6,7,8    s 15 | a1: mag 22,23,24 s 31
 *   out1 = rotl(q, 4) & P        a2: mag 2,3,4    s 11 | a3: mag 18,19,20 s 27
 *   out2 = rotl(q, 10) & P       a4: mag 28,29,30 s 5  | a5: mag 12,13,14 s 21
 *   out3 = (rotl(q, 6) & 0x80C080C0) | (rotl(q, 14) & 0x01000100)
 *                                a6: mag 0,1,26   s 9  | a7: mag 16,17,10 s 25
 * (mag = the bits of m, e0, e1 in that order). 9 instructions per word; the shift-based layout
 * before it took 11 (its fourth register needed three shifts). No layout decodes all four
 * registers with one rotate and mask each: an exhaustive search over the rotations finds none.
 * Pipes: the masks of out1 and of out3's first half have no bit below their rotation, so those two
 * rotations are plain left shifts, which ptxas issues as IMAD.SHL on the FMA pipe; only the
 * rotations by 10 and 14 (SHF.L.W) and the five masks stay on the ALU pipe, which the decode keeps
 * busy (16 lanes per scheduler: one warp instruction per two cycles; IMAD also runs at 16 lanes, but on
 * the FMA pipe beside it, so the two overlap). Moving more of it there did not pay (fifty-second session,
 * docs/design.md): the rotations by 10 and 14 as 64-bit multiplies (IMAD.WIDE) made the M = 1 kernel 2-9 %
 * slower, and the scales' LEA as IMAD changed it by -3..+1 %. */
struct Fp4Pos {
    int mag[3]; /* positions of m, e0, e1 (low to high) */
    int sign;
};
__host__ __device__ inline Fp4Pos fp4_pos(int e /* 0..7 */) {
    const Fp4Pos t[8] = {{{6, 7, 8}, 15},   {{22, 23, 24}, 31}, {{2, 3, 4}, 11},   {{18, 19, 20}, 27},
                         {{28, 29, 30}, 5}, {{12, 13, 14}, 21}, {{0, 1, 26}, 9},   {{16, 17, 10}, 25}};
    return t[e];
}

__host__ __device__ __forceinline__ uint32_t rotl32(uint32_t q, int n) {
#ifdef __CUDA_ARCH__
    return __funnelshift_l(q, q, n);
#else
    return (q << n) | (q >> (32 - n));
#endif
}

__host__ __device__ __forceinline__ void dec_e2m1(uint32_t q, uint32_t (&a)[4]) {
    const uint32_t P = 0x81C081C0u;
    a[0] = q & P;
    a[1] = (q << 4) & P; /* = rotl32(q, 4) & P: P has no bit below 4 */
    a[2] = rotl32(q, 10) & P;
    a[3] = ((q << 6) & 0x80C080C0u) | (rotl32(q, 14) & 0x01000100u); /* no mask bit below 6 */
}

/* INT4 word: element a(2j) at bits 4j..4j+3, a(2j+1) at 16+4j..; decodes to bf16(128 + code). */
__device__ __forceinline__ void dec_u4(uint32_t q, uint32_t (&a)[4]) {
    const uint32_t M = 0x000F000Fu, B = 0x43004300u;
    a[0] = (q & M) | B;
    a[1] = ((q >> 4) & M) | B;
    a[2] = ((q >> 8) & M) | B;
    a[3] = ((q >> 12) & M) | B;
}

/* FP8 e4m3: u0 bytes [a2, a0, a3, a1], u1 bytes [a6, a4, a7, a5]. A byte in the high byte of a
 * 16-bit half decodes as sign -> bit 15, exponent+mantissa (7 bits) -> bits 4..10: bf16 value =
 * e4m3 value * 2^-120 (normals and subnormals alike). */
__device__ __forceinline__ uint32_t dec_e4m3_hi(uint32_t u) {
    return (u & 0x80008000u) | ((u >> 4) & 0x07F007F0u);
}
__device__ __forceinline__ void dec_e4m3(uint32_t u0, uint32_t u1, uint32_t (&a)[4]) {
    a[0] = dec_e4m3_hi(u0);
    a[1] = dec_e4m3_hi(u0 << 8);
    a[2] = dec_e4m3_hi(u1);
    a[3] = dec_e4m3_hi(u1 << 8);
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

/* (h, h) from one half of f: ptxas folds these into the operand's .H0_H0 / .H1_H1 selector of the
 * HMUL2 that consumes them (checked with nvdisasm), so they cost no instruction. */
__device__ __forceinline__ uint32_t bf2_bcast_lo(uint32_t f) {
    uint32_t r;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {l, l}; }" : "=r"(r) : "r"(f));
    return r;
}
__device__ __forceinline__ uint32_t bf2_bcast_hi(uint32_t f) {
    uint32_t r;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {h, h}; }" : "=r"(r) : "r"(f));
    return r;
}

__device__ __forceinline__ uint32_t bf2_mul(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ uint32_t bf2_sub(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

/* D += A(16x16 bf16, row) * B(16x8 bf16, col), fp32 accumulators. */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy global -> shared; src_bytes = 0 zero-fills. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
/* Split-K arrival on a tile's counter: atomicAdd with acquire-release semantics at GPU scope.
 * The K-split kernels publish their partial sums with it the way CUTLASS's semaphore does: every
 * thread stores its partials, a CTA barrier, then ONE thread's release-add (it orders the CTA's
 * stores before it: the barrier puts them before that thread's release); the CTA that sees the
 * last count acquires with the same instruction, and a CTA barrier puts its threads' reads of
 * the partials after the acquire. No per-thread __threadfence (a fence.sc.gpu: each thread waits
 * for its own stores to be visible GPU-wide; Nsight Compute put ~15 % of the wgmma kernel's
 * stall samples at M = 50 on it). */
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int *p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;"); }

/* Weights are read exactly once per call: stream them past L1 with an L2 evict-first hint so
 * they do not push activations and the KV cache out of L2. */
__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ uint4 ldg_stream(const void *p, uint64_t pol) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(pol));
    return r;
}
__device__ __forceinline__ uint2 ldg_stream2(const void *p, uint64_t pol) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0,%1}, [%2], %3;"
                 : "=r"(r.x), "=r"(r.y)
                 : "l"(p), "l"(pol));
    return r;
}

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x)));
}

/* ---- one weight tile (16 rows x 128 K) of the repacked layout, decoded into mma A fragments ----
 * Shared by the low-bit GEMM (gemm_lowbit.cu) and the persistent expert kernel (expert.cu). */
template <int FMT> struct FmtT;
template <> struct FmtT<NIB_WFMT_NVFP4> { enum { PARTS = 2, SB = 128, LSB = 16 }; };
template <> struct FmtT<NIB_WFMT_MXFP4> { enum { PARTS = 2, SB = 64, LSB = 8 }; };
template <> struct FmtT<NIB_WFMT_INT4> { enum { PARTS = 2, SB = 64, LSB = 8 }; };
template <> struct FmtT<NIB_WFMT_FP8> { enum { PARTS = 4, SB = 0, LSB = 0 }; };

template <int FMT> struct Chunk {
    uint4 e[FmtT<FMT>::PARTS];
    uint4 s;
};

__device__ __forceinline__ uint32_t u4get(const uint4 &v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* NIB_GEMM_LAB_DECODE (a lab build's compile flag, never set by the Makefile: `make BUILD=DIR
 * NIB_LAB_NVCCFLAGS=-DNIB_GEMM_LAB_DECODE=N`): what the NVFP4 / MXFP4 decode costs the kernels that use
 * chunk_a. 1 leaves out the block-scale multiply, 2 the whole decode (the loaded words go to the MMA
 * as they are). Both give WRONG products: for timing the data path only. 0 (the default) is the
 * real kernel. */
#ifndef NIB_GEMM_LAB_DECODE
#define NIB_GEMM_LAB_DECODE 0
#endif
/* The A fragment of k16 step s (0..7) of a chunk, scaled (except INT4: scale later in fp32). */
template <int FMT>
__device__ __forceinline__ void chunk_a(const Chunk<FMT> &ch, int s, uint32_t add,
                                        uint32_t zg, uint32_t zg8, uint32_t (&a)[4]) {
    if (FMT == NIB_WFMT_NVFP4 || FMT == NIB_WFMT_MXFP4) {
        if constexpr (NIB_GEMM_LAB_DECODE == 2) { /* lab only: the loaded words as A, no decode, no scale */
            const uint4 &e = ch.e[s >> 2];
            a[0] = u4get(e, s & 3);
            a[1] = u4get(e, (s + 1) & 3);
            a[2] = u4get(e, (s + 2) & 3);
            a[3] = u4get(e, (s + 3) & 3);
            return;
        }
        dec_e2m1(u4get(ch.e[s >> 2], s & 3), a);
        if constexpr (NIB_GEMM_LAB_DECODE == 1) return; /* lab only: decoded, the block scale not applied */
        uint32_t flo, fhi;
        if (FMT == NIB_WFMT_NVFP4) {
            /* scale word s/2 holds bytes [row g step 2j, row g+8 step 2j, g 2j+1, g+8 2j+1].
             * Both steps of the word at once (the unrolled caller computes them once per word):
             * g = (code(g, 2j), code(g, 2j+1)) and g8 likewise as two 16-bit halves, each
             * E5M3 code -> bf16(scale * 2^118) by code * 16 + add (no carry between halves:
             * 255 * 16 + (235 << 7) < 2^16); step s takes its half broadcast, which the HMUL2
             * below reads through its operand selector. */
            const uint32_t sw = u4get(ch.s, s >> 1);
            const uint32_t g2 = prmt(sw, 0, 0x6240) * 16u + add; /* PRMT + LEA (a C mask became 3 ops) */
            const uint32_t g82 = prmt(sw, 0, 0x7351) * 16u + add;
            flo = (s & 1) ? bf2_bcast_hi(g2) : bf2_bcast_lo(g2);
            fhi = (s & 1) ? bf2_bcast_hi(g82) : bf2_bcast_lo(g82);
        } else {
            int b = s >> 1; /* 32-element block */
            uint32_t sw = (b < 2) ? ch.s.x : ch.s.y;
            uint32_t tlo = prmt(sw, 0, (b & 1) ? 0x4242 : 0x4040);
            uint32_t thi = prmt(sw, 0, (b & 1) ? 0x4343 : 0x4141);
            flo = tlo << 7; /* stored exponent field -> bf16 2^(e-1-j) */
            fhi = thi << 7;
        }
        a[0] = bf2_mul(a[0], flo);
        a[1] = bf2_mul(a[1], fhi);
        a[2] = bf2_mul(a[2], flo);
        a[3] = bf2_mul(a[3], fhi);
    } else if (FMT == NIB_WFMT_INT4) {
        dec_u4(u4get(ch.e[s >> 2], s & 3), a);
        a[0] = bf2_sub(a[0], zg);
        a[1] = bf2_sub(a[1], zg8);
        a[2] = bf2_sub(a[2], zg);
        a[3] = bf2_sub(a[3], zg8);
    } else { /* FP8 */
        const uint4 &e = ch.e[s >> 1];
        int j = (s & 1) * 2;
        dec_e4m3(u4get(e, j), u4get(e, j + 1), a);
        const uint32_t two120 = 0x7B807B80u; /* bf16 2^120 in both halves */
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = bf2_mul(a[i], two120);
    }
}

/* brow[nt]: this lane's ldmatrix row address for n-tile nt at the chunk's first column (rows
 * of tokens past M all point at one shared zero row). */
template <int FMT, int MT, int R>
__device__ __forceinline__ void compute_chunk(float (&acc)[R][MT][4], float (&acc2)[R][MT][4],
                                              const Chunk<FMT> (&ch)[R], uint32_t scale_add,
                                              const uint32_t (&brow)[MT]) {
    uint32_t zg[R], zg8[R];
    float tmp[R][MT][4], tmp2[R][MT][4];
#pragma unroll
    for (int r = 0; r < R; r++) {
        zg[r] = zg8[r] = 0;
        if (FMT == NIB_WFMT_INT4) {
            zg[r] = prmt(ch[r].s.x, 0, 0x3232);
            zg8[r] = prmt(ch[r].s.y, 0, 0x3232);
#pragma unroll
            for (int nt = 0; nt < MT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) tmp[r][nt][i] = tmp2[r][nt][i] = 0.f;
        }
    }
#pragma unroll
    for (int s2 = 0; s2 < 4; s2++) {
        uint32_t b[MT][4];
#pragma unroll
        for (int nt = 0; nt < MT; nt++) ldmatrix_x4(b[nt], brow[nt] + s2 * 64);
#pragma unroll
        for (int ss = 0; ss < 2; ss++) {
            const int s = s2 * 2 + ss;
#pragma unroll
            for (int r = 0; r < R; r++) { /* no branch: invalid row groups hold zeros */
                uint32_t a[4];
                chunk_a<FMT>(ch[r], s, scale_add, zg[r], zg8[r], a);
#pragma unroll
                for (int nt = 0; nt < MT; nt++) { /* even / odd steps into separate accumulators */
                    /* (MT = 8 has 8 independent products per step already: one set of
                     * accumulators, 32 registers fewer) */
                    const bool second = ss && MT < 8;
                    if (FMT == NIB_WFMT_INT4)
                        mma_bf16(second ? tmp2[r][nt] : tmp[r][nt], a, b[nt][2 * ss], b[nt][2 * ss + 1]);
                    else
                        mma_bf16(second ? acc2[r][nt] : acc[r][nt], a, b[nt][2 * ss], b[nt][2 * ss + 1]);
                }
            }
        }
    }
    if (FMT == NIB_WFMT_INT4) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            float sg = __half2float(__ushort_as_half((unsigned short)(ch[r].s.x & 0xFFFF)));
            float sg8 = __half2float(__ushort_as_half((unsigned short)(ch[r].s.y & 0xFFFF)));
#pragma unroll
            for (int nt = 0; nt < MT; nt++) {
                acc[r][nt][0] += sg * (tmp[r][nt][0] + tmp2[r][nt][0]);
                acc[r][nt][1] += sg * (tmp[r][nt][1] + tmp2[r][nt][1]);
                acc[r][nt][2] += sg8 * (tmp[r][nt][2] + tmp2[r][nt][2]);
                acc[r][nt][3] += sg8 * (tmp[r][nt][3] + tmp2[r][nt][3]);
            }
        }
    }
}

} // namespace nib

#endif
