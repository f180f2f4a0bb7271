/* launch.cuh — kernel launches with programmatic dependent launch (PDL, sm_90+).
 *
 * Why: at batch 1 most kernels run a few microseconds, and the gap between two dependent
 * kernels (the second one's launch and ramp-up after the first one drains) is a large part of
 * each. With PDL the next kernel of the stream (or of the captured graph) is launched while the
 * current one still runs; its CTAs become resident and wait in griddepcontrol.wait until the
 * current grid has completed and its memory is visible. Work that does not depend on the
 * previous kernel (the low-bit GEMM prefetches its weights into L2) runs before the wait.
 *
 * The protocol every nib kernel follows (launched through nib_launch):
 *   1. Before nib_pdl_wait(): no global memory writes at all, and reads only of data no
 *      kernel of the call writes (weights). No early return before it either: a grid whose
 *      CTAs all returned before waiting could complete before its predecessor, and the kernel
 *      after it would then overlap the predecessor. L2 prefetch hints (cp.async.bulk.prefetch) are
 *      the exception: they may target anything, at addresses computed from values a kernel of the
 *      call may still write (a stale length), since they move nothing into the kernel; the cache
 *      attention's attn_prefetch_kv (ops/cuda/attention.cuh) is one.
 *   1b. A kernel may also read, before the wait, data that an upload or a kernel at least two launches before it
 *      wrote, if nothing writes it until the kernel ends: rule 2 makes every kernel trigger only after its own
 *      wait, so when kernel N starts, kernel N - 1 has passed its wait and N - 2 has completed, its writes visible
 *      in L2 (cuBLAS kernels trigger at completion, later still). Such reads go to L2 (ld.global.cg: an SM's L1
 *      may hold a line from an earlier kernel). The caller states it (nib_attn_cache_args.lens_settled: Pi0.5's
 *      lengths, uploaded before the call); the decode attention then reads them early (NIB_ATTN_LENS_EARLY=0: not).
 *   2. nib_pdl_wait(), then nib_pdl_trigger(): the next kernel may launch now. Triggering
 *      after the wait keeps at most one grid waiting behind the running one.
 * cuBLAS kernels do not trigger: a nib kernel launched after one waits for its completion
 * (the implicit trigger), so mixing them is safe. Nor do they wait: cuBLASLt 13.1's kernels read
 * their inputs without griddepcontrol.wait (bench/probes/cublas_pdl.cu), so the edge into a cuBLAS
 * kernel must stay a full-completion edge (never made programmatic in a graph). Kernels launched
 * without the attribute (or with NIB_PDL=0, or on a device without PDL) execute both instructions
 * as no-ops.
 *
 * NIB_PDL=0 in the environment turns the attribute off (read at each launch, so a graph keeps
 * the setting it was captured with): the A/B switch of `nib bench pi05`. So does
 * nib_pdl_suspend (runtime/device.h) for the launches of its thread: Pi0.5's per-op first step
 * beside the prefix launches without PDL, so none of its kernels sits resident on SMs, waiting for
 * its predecessor, that the prefix's kernels could use (bf16 2 cameras H = 10 13.09 -> 12.97 ms;
 * docs/design.md, "Thirty-third session").
 */
#ifndef NIB_RUNTIME_LAUNCH_CUH
#define NIB_RUNTIME_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdlib.h>

#include <utility>

#include "runtime/device.h"

namespace nib {

/* Wait until the previous grid of the stream has completed and its writes are visible. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Allow the next grid of the stream to launch (its own pdl_wait still orders it after us). */
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* An L2 prefetch hint of the 128-byte line at a: allowed before pdl_wait (rule 1's exception). */
__device__ __forceinline__ void prefetch_l2(const void *a) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
#endif
}

/* Not about launches, but in the header every kernel includes: the warp's index in the block,
 * broadcast from lane 0. The compiler then knows it is the same across the warp and keeps what
 * derives from it (the addresses of copies one lane issues, loop bounds, barrier offsets) in
 * uniform registers. From threadIdx.x >> 5 it cannot prove that: each TMA or bulk copy issued
 * from such values sat in a loop moving its operands into uniform registers one value at a time
 * (the low-bit GEMM at M = 1 gained 4-8 %, the Gemma prefix attention 5-10 %; docs/design.md
 * "Fifty-second session", "Fifty-third session"). All 32 lanes of the warp must call it together.
 * Not used in the persistent expert kernel (ops/cuda/expert.cu), where it made the step 3 % slower,
 * nor by the consumer warps of the low-bit wgmma GEMM's NVFP4 16-, 128- and 192-token tiles (up to
 * 34 % slower there: WgPW::UW in ops/cuda/gemm_lowbit_wg.cuh, "Fifty-fourth session"). */
__device__ __forceinline__ int warp_id() { return __shfl_sync(0xffffffffu, (int)threadIdx.x >> 5, 0); }

/* Both, in protocol order: the first statement of every kernel without a pre-wait phase. */
__device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_trigger();
}

inline bool pdl_enabled() {
    if (nib_pdl_suspended()) return false;
    const char *e = getenv("NIB_PDL");
    return !(e && e[0] == '0' && e[1] == '\0');
}

/* cudaLaunchKernelEx with the given attributes plus the PDL one (when enabled); returns the
 * launch's cudaError_t. attr must have room for n + 1 entries. */
template <typename... KArgs, typename... Args>
inline cudaError_t launch_with(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               cudaLaunchAttribute *attr, unsigned n, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = n + (pdl_enabled() ? 1 : 0);
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...); /* unchecked: returned to the caller */
}

/* cudaLaunchKernelEx with the PDL attribute; returns the launch's cudaError_t (check it with
 * NIB_CUDA_CHECK). */
template <typename... KArgs, typename... Args>
inline cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          Args &&...args) {
    cudaLaunchAttribute attr[1];
    return launch_with(kernel, grid, block, smem, stream, attr, 0, std::forward<Args>(args)...);
}

/* The same with thread-block clusters of `cluster` CTAs (grid dims must be multiples of it). */
template <typename... KArgs, typename... Args>
inline cudaError_t launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                  dim3 cluster, Args &&...args) {
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster.x;
    attr[0].val.clusterDim.y = cluster.y;
    attr[0].val.clusterDim.z = cluster.z;
    return launch_with(kernel, grid, block, smem, stream, attr, 1, std::forward<Args>(args)...);
}

} /* namespace nib */

#endif
