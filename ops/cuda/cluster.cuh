/* cluster.cuh — thread-block cluster primitives shared by nib's kernels (sm_90): the CTA's rank,
 * the cluster barrier (full, or split into arrive / wait), and distributed shared memory (the
 * address of a shared variable in another CTA of the cluster, remote loads and stores).
 * Used by act.cu (the 2-CTA GeGLU/GELU rows), expert.cu (the CTA pairs), gemm_fp8.cu (K split,
 * W multicast) and gemm_lowbit_wg.cuh (K split). */
#ifndef NIB_CLUSTER_CUH
#define NIB_CLUSTER_CUH

#include <stdint.h>

namespace nib {

__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); /* constant for the launch: not volatile, so it is computed once */
    return r;
}
/* every thread of every CTA of the cluster arrives (release) and waits (acquire): orders shared
 * memory writes, local and remote, before the reads after it */
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait;" ::: "memory"); }
/* the shared::cluster address of `saddr` (a shared::cta address) in CTA `rank` of the cluster */
__device__ __forceinline__ uint32_t cluster_map(uint32_t saddr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(saddr), "r"(rank));
    return r;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t caddr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(caddr) : "memory");
    return v;
}
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t caddr) { /* caddr 16-byte aligned */
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(caddr)
                 : "memory");
    return v;
}
__device__ __forceinline__ void st_cluster_f32(uint32_t caddr, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(caddr), "f"(v) : "memory");
}

} /* namespace nib */

#endif
