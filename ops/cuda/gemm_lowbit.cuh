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

namespace nib {

/* ---- bit layout of one FP4 word (8 E2M1 codes, code = s e1 e0 m) ----------------------
 * Decoded bf16 "raw" = (sign << 15) | (e1 e0 m << 6): exponent field e1e0, mantissa m<<6,
 * i.e. exactly value * 2^-126 for normal and subnormal codes alike. Stored bit positions
 * (mag = 3 bits e1e0m in that order from high to low, listed low→high; s = sign):
 *   a0: mag 6,7,8   s 15 | a1: mag 22,23,24 s 31      out0 = q & P
 *   a2: mag 3,4,5   s 12 | a3: mag 19,20,21 s 28      out1 = (q << 3) & P
 *   a4: mag 0,1,2   s 9  | a5: mag 16,17,18 s 25      out2 = (q << 6) & P
 *   a6: mag 10,11,13 s 14| a7: mag 26,27,29 s 30      out3 = composite (3 shifts)
 * with P = 0x81C081C0 (bits 6,7,8,15 | 22,23,24,31). */
struct Fp4Pos {
    int mag[3]; /* positions of m, e0, e1 (low to high) */
    int sign;
};
__host__ __device__ inline Fp4Pos fp4_pos(int e /* 0..7 */) {
    const Fp4Pos t[8] = {{{6, 7, 8}, 15},    {{22, 23, 24}, 31}, {{3, 4, 5}, 12},
                         {{19, 20, 21}, 28}, {{0, 1, 2}, 9},     {{16, 17, 18}, 25},
                         {{10, 11, 13}, 14}, {{26, 27, 29}, 30}};
    return t[e];
}

__device__ __forceinline__ void dec_e2m1(uint32_t q, uint32_t (&a)[4]) {
    const uint32_t P = 0x81C081C0u;
    a[0] = q & P;
    a[1] = (q << 3) & P;
    a[2] = (q << 6) & P;
    a[3] = ((q >> 4) & 0x00C000C0u) | ((q >> 5) & 0x01000100u) | ((q << 1) & 0x80008000u);
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

} // namespace nib

#endif
