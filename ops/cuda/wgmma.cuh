/* wgmma.cuh — Hopper warpgroup MMA (wgmma.mma_async, sm_90a) helpers: shared-memory matrix
 * descriptors for the 128-byte swizzled K-major layout, the fence / commit / wait protocol,
 * mbarriers and 2-D TMA loads, the e4m3 x e4m3 -> f32 instructions (wgmma_e4m3.inc) and the bf16
 * ones of the attention (wgmma_bf16.inc), both written by scripts/gen_wgmma.py.
 *
 * The shared-memory layout these descriptors describe ("128B swizzle", K-major): a tile of R rows
 * x 128 bytes of K, row r at byte r * 128, its 16-byte chunk c stored at chunk c ^ (r & 7). The
 * tile starts on a 1024-byte boundary (the swizzle is applied to absolute address bits), 8-row
 * groups are 1024 bytes apart (the stride byte offset); one k32 step of e4m3 is 32 bytes of the
 * row, so step s's descriptor starts 32 * s bytes into the tile.
 * Accumulator fragment of m64nN (f32, N / 2 registers per thread): warp w of the warpgroup holds
 * rows 16 w + lane / 4 (registers 4 j, 4 j + 1: columns 8 j + 2 (lane % 4) + {0, 1}) and the row
 * 8 below it (registers 4 j + 2, 4 j + 3).
 */
#ifndef NIB_WGMMA_CUH
#define NIB_WGMMA_CUH

#include <stdint.h>

#include "ops/cuda/cluster.cuh"

namespace nib {

/* descriptor of a K-major, 128-byte swizzled operand tile at shared address saddr */
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) /* start address, 16-byte units */
           | ((uint64_t)1 << 16)               /* leading byte offset: unused for swizzled K-major */
           | ((uint64_t)(1024 >> 4) << 32)     /* stride byte offset: 8 rows x 128 bytes */
           | ((uint64_t)1 << 62);              /* layout: 128-byte swizzle */
}

/* descriptor of a 128-byte swizzled operand at saddr with explicit leading / stride byte offsets:
 * for an MN-major operand (imm-trans = 1) the leading offset is the distance between 64-element
 * (128-byte) atoms along M / N and the stride offset the distance between 8-row groups along K */
__device__ __forceinline__ uint64_t wgmma_desc_sw128_mn(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32) | ((uint64_t)1 << 62);
}
/* the descriptor of the operand byte_off bytes (a multiple of 16) past desc's start: the start
 * address is bits 0..13 in 16-byte units and shared addresses stay below 256 KB, so the sum never
 * carries out of the field; one 32-bit add instead of a descriptor built from scratch */
__device__ __forceinline__ uint64_t wgmma_desc_at(uint64_t desc, uint32_t byte_off) {
    return (desc & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)desc + (byte_off >> 4));
}

/* make the generic-proxy writes of this thread to shared memory (st.shared, cp.async) visible to
 * the async proxy that wgmma reads its shared-memory operands through */
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* the accumulator registers are about to be used by wgmma (after other instructions wrote them) */
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
/* wait until at most N committed wgmma groups of this warpgroup are pending */
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* pin registers in place: the compiler may not move their reads or writes across this point. After
 * a wgmma_wait, before the accumulators of the groups it completed are read: the wgmma asm declares
 * them written at its issue, so without this a read could be scheduled above the wait (as
 * CUTLASS's warpgroup_fence_operand). It did not stop ptxas's C7514 serialization where a set
 * written before a loop's back edge is read after it (docs/design.md, INT4 on the wgmma kernel). */
template <int N> __device__ __forceinline__ void wgmma_fence_operand(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
/* ---- mbarriers and TMA (cp.async.bulk.tensor) ---- */
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* the barrier inits are visible to the async proxy (TMA's complete_tx) and the other threads */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* wait until the phase of the given parity has completed (a fresh barrier: parity 1 passes) */
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity) {
    asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* has the phase of the given parity completed? (one test, no waiting) */
__device__ __forceinline__ bool mbar_test(uint32_t bar, unsigned parity) {
    uint32_t ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return ok != 0;
}
/* 2-D TMA load of one box (c0: innermost coordinate) into shared memory, completing on bar */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *tmap, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                 "l"(tmap), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* 4-D TMA load of one box (c0 innermost) into shared memory, completing on bar */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *tmap, int c0, int c1, int c2, int c3, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
                 "[%6];" ::"r"(dst),
                 "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}

/* the same, multicast: the box lands at the same shared offset in every CTA of the cluster in
 * cta_mask, completing on the barrier at bar's offset in each of them */
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const void *tmap, int c0, int c1, uint32_t bar,
                                               uint16_t cta_mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                 "[%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
                 "l"(tmap), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
                 : "memory");
}
/* arrive on the barrier at the same offset in CTA `rank` of the cluster (default semantics:
 * release at CTA scope, as CUTLASS's cluster pipelines do) */
__device__ __forceinline__ void mbar_arrive_remote(uint32_t bar, uint32_t rank) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_map(bar, rank)) : "memory");
}

template <int N> struct WgmmaE4M3; /* the supported N: wgmma_e4m3.inc */
#include "ops/cuda/wgmma_e4m3.inc"
template <int N> struct WgmmaBf16SS; /* the supported N: wgmma_bf16.inc */
template <int N> struct WgmmaBf16RS;
template <int N> struct WgmmaBf16RSK;
#include "ops/cuda/wgmma_bf16.inc"

} /* namespace nib */

#endif
