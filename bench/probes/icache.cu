/* icache.cu — what does code the SM has not run yet cost? A kernel runs one block of straight-line
 * code (N independent FFMA instructions with immediates, 16 bytes of SASS each) twice at the same
 * addresses (a rolled loop of two passes) and times each pass per warp with clock64: pass 0 fetches
 * the code, pass 1 finds it in the SM's instruction caches, so pass 0 - pass 1 is the cost of cold
 * code of that size.
 *
 * The question behind it: every low-bit GEMM of the Pi0.5 expert spends 0.42-0.54 us after its PDL wait
 * only issuing its first X window (a handful of cp.async per thread; ktrace MARK7 at aaece13,
 * docs/design.md "Sixty-ninth session"), and the decode attention stages Q 2.3 us after its wait.
 * The code after the wait has not run on the SM since the previous kernel of another kind ran there.
 *
 * Rows (one JSON object each; cycles are medians over the CTAs' warp 0, ns from %globaltimer medians):
 *   cold N       first launch of the kernel with N instructions (its code may come from DRAM)
 *   again N      the same kernel launched right after itself (does the SM keep the code across launches?)
 *   after B N/M  the kernel after a kernel of M other instructions ran on every SM (capacity: when does
 *                the other kernel's code evict this one's?)
 * Grid: one CTA per SM, 256 threads (8 warps fetch the same code), as the expert's products run.
 *
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/icache bench/probes/icache.cu && /tmp/icache
 */
#include <cstdint>

#include "probe.cuh"

/* N FFMAs over 8 accumulators; the immediates differ per (ID, i), so no two kernels share code */
template <int ID, int N> __device__ __forceinline__ void code_block(float (&a)[8], float y) {
#pragma unroll
    for (int i = 0; i < N; i++) a[i & 7] = fmaf(a[i & 7], y, (float)(i * 131 + ID * 7919 + 1) * 1e-7f);
}

static __device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* t[cta * 4 + 0 .. 3]: pass 0 cycles, pass 1 cycles, pass 0 ns, pass 1 ns (warp 0, lane 0) */
template <int ID, int N> __global__ void __launch_bounds__(256) k_code(float y, float *out, long long *t) {
    float a[8];
#pragma unroll
    for (int i = 0; i < 8; i++) a[i] = (float)(threadIdx.x + i);
    long long cyc[2], ns[2];
#pragma unroll 1
    for (int pass = 0; pass < 2; pass++) {
        const unsigned long long g0 = gtimer();
        const long long c0 = clock64();
        code_block<ID, N>(a, y);
        const long long c1 = clock64();
        const unsigned long long g1 = gtimer();
        /* the pass's results feed the next clock read's successor (keeps ptxas from moving FFMAs past it) */
        y += (a[0] == 12345.f) ? 1.f : 0.f;
        cyc[pass & 1] = c1 - c0;
        ns[pass & 1] = (long long)(g1 - g0);
    }
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) s += a[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) {
        t[blockIdx.x * 4 + 0] = cyc[0];
        t[blockIdx.x * 4 + 1] = cyc[1];
        t[blockIdx.x * 4 + 2] = ns[0];
        t[blockIdx.x * 4 + 3] = ns[1];
    }
}

static int g_sms;
static float *g_out;
static long long *g_t;

static long long median_col(const std::vector<long long> &v, int col) {
    std::vector<long long> c;
    for (size_t i = col; i < v.size(); i += 4) c.push_back(v[i]);
    std::sort(c.begin(), c.end());
    return c[c.size() / 2];
}

template <int ID, int N> static void launch_only() {
    k_code<ID, N><<<g_sms, 256>>>(1.0001f, g_out, g_t);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
}

template <int ID, int N> static void launch_row(const char *row, int other) {
    launch_only<ID, N>();
    std::vector<long long> h((size_t)g_sms * 4);
    CHECK(cudaMemcpy(h.data(), g_t, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    const long long p0 = median_col(h, 0), p1 = median_col(h, 1), n0 = median_col(h, 2), n1 = median_col(h, 3);
    printf("{\"row\": \"%s\", \"instructions\": %d, \"code_kb\": %.1f, \"other_instructions\": %d, "
           "\"pass0_cycles\": %lld, \"pass1_cycles\": %lld, \"cold_cycles\": %lld, \"pass0_ns\": %lld, \"pass1_ns\": %lld, "
           "\"cold_ns\": %lld}\n",
           row, N, N * 16 / 1024.0, other, p0, p1, p0 - p1, n0, n1, n0 - n1);
    fflush(stdout);
}

/* the kernel with N instructions: first launch, again, then after other kernels of M instructions */
template <int ID, int N> static void series() {
    launch_row<ID, N>("cold", 0);
    launch_row<ID, N>("again", 0);
    launch_only<ID + 100, 1024>();
    launch_row<ID, N>("after", 1024);
    launch_only<ID + 200, 4096>();
    launch_row<ID, N>("after", 4096);
    launch_only<ID + 300, 8192>();
    launch_row<ID, N>("after", 8192);
    launch_only<ID + 400, 16384>();
    launch_row<ID, N>("after", 16384);
}

int main() {
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaMalloc(&g_out, (size_t)g_sms * 256 * sizeof(float)));
    CHECK(cudaMalloc(&g_t, (size_t)g_sms * 4 * sizeof(long long)));
    series<1, 64>();
    series<2, 256>();
    series<3, 1024>();
    series<4, 4096>();
    CHECK(cudaFree(g_out));
    CHECK(cudaFree(g_t));
    return 0;
}
