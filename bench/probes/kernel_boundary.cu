/* kernel_boundary.cu — what does one dependent kernel boundary cost inside a CUDA graph, with
 * programmatic dependent launch (griddepcontrol.wait: the previous grid completed and flushed) and
 * with a software flag instead (the previous grid's CTAs each add 1 to a counter with a release
 * after their stores; the next grid, launched early by the same PDL attribute, polls the counter
 * with an acquire and never executes griddepcontrol.wait)?
 *
 * The question behind it: the Pi0.5 expert step is ~126 dependent kernels of 2-8 us (docs/design.md,
 * "Where the time goes"), the weights are ~10 % of its time, and a norm kernel that does almost
 * nothing costs ~2 us in the graph. If the release/acquire hand-off is cheaper than the grid-completion
 * hand-off, every boundary of the step could be one.
 *
 * A chain of N kernels of G CTAs x T threads; kernel k reads one 16-byte value per thread written
 * by kernel k - 1 (from another CTA's part: an all-to-all dependency as a GEMM's X is), adds 1 and
 * writes its own part. Modes: plain (no PDL attribute), pdl (attribute; wait then trigger first
 * thing), flag (attribute; thread 0 polls counter[k - 1] until it reaches G, CTA barrier, trigger,
 * work, CTA barrier, thread 0 red.release.gpu.add counter[k]; the counters are zeroed by a memset
 * node at the graph's start). The result is checked (every value = N after the chain, from 0).
 * Prints one JSON object per (mode, G, T): us per kernel = graph replay time / N, median of 21.
 *
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/kernel_boundary \
 *        bench/probes/kernel_boundary.cu && /tmp/kernel_boundary
 */
#include <cstdint>

#include "probe.cuh"

enum { PLAIN = 0, PDL = 1, FLAG = 2 };

static __device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void red_release(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <int MODE>
__global__ void k_link(const float4 *in, float4 *out, const unsigned *cnt_prev, unsigned *cnt_this, unsigned need) {
    if (MODE == PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (MODE == FLAG) {
        if (threadIdx.x == 0 && cnt_prev)
            while (ld_acquire(cnt_prev) < need) {
            }
        __syncthreads();
    }
    if (MODE != PLAIN) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const unsigned n = gridDim.x * blockDim.x, i = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned src = (i + (gridDim.x / 2 + 1) * blockDim.x) % n; /* another CTA's value */
    float4 v = __ldcg(in + src);
    v.x += 1.f;
    v.y += 1.f;
    v.z += 1.f;
    v.w += 1.f;
    out[i] = v;
    if (MODE == FLAG) {
        __syncthreads();
        if (threadIdx.x == 0) red_release(cnt_this, 1);
    }
}

template <int MODE> static void launch(int g, int t, const float4 *in, float4 *out, const unsigned *cp, unsigned *ct,
                                       cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(g);
    cfg.blockDim = dim3(t);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = MODE == PLAIN ? 0 : 1;
    CHECK(cudaLaunchKernelEx(&cfg, k_link<MODE>, in, out, cp, ct, (unsigned)g));
}

static void run(int mode, int g, int t, int nk) {
    const size_t n = (size_t)g * t;
    float4 *buf[2];
    unsigned *cnt;
    CHECK(cudaMalloc(&buf[0], n * sizeof(float4)));
    CHECK(cudaMalloc(&buf[1], n * sizeof(float4)));
    CHECK(cudaMalloc(&cnt, nk * sizeof(unsigned)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaMemsetAsync(buf[0], 0, n * sizeof(float4), s));
    CHECK(cudaMemsetAsync(cnt, 0, nk * sizeof(unsigned), s));
    for (int k = 0; k < nk; k++) {
        const float4 *in = buf[k & 1];
        float4 *out = buf[(k + 1) & 1];
        const unsigned *cp = k ? cnt + k - 1 : nullptr;
        if (mode == PLAIN) launch<PLAIN>(g, t, in, out, cp, cnt + k, s);
        if (mode == PDL) launch<PDL>(g, t, in, out, cp, cnt + k, s);
        if (mode == FLAG) launch<FLAG>(g, t, in, out, cp, cnt + k, s);
    }
    CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t ge;
    CHECK(cudaGraphInstantiate(&ge, graph, 0));
    const double ms = probe_median_ms(22, [&](int) { CHECK(cudaGraphLaunch(ge, s)); CHECK(cudaStreamSynchronize(s)); });
    /* the check: after nk links every component is nk */
    std::vector<float4> h(n);
    CHECK(cudaMemcpy(h.data(), buf[nk & 1], n * sizeof(float4), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i].x != (float)nk || h[i].w != (float)nk;
    static const char *names[] = {"plain", "pdl", "flag"};
    printf("{\"mode\": \"%s\", \"ctas\": %d, \"threads\": %d, \"kernels\": %d, \"us_per_kernel\": %.3f, \"wrong\": %zu}\n",
           names[mode], g, t, nk, ms * 1000.0 / nk, bad);
    fflush(stdout);
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(buf[0]));
    CHECK(cudaFree(buf[1]));
    CHECK(cudaFree(cnt));
}

int main(int argc, char **argv) {
    const int nk = argc > 1 ? atoi(argv[1]) : 256;
    const int shapes[][2] = {{10, 128}, {40, 256}, {80, 256}, {128, 256}, {256, 256}};
    for (auto &sh : shapes)
        for (int mode = 0; mode < 3; mode++) run(mode, sh[0], sh[1], nk);
    return 0;
}
