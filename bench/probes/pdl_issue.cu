/* pdl_issue.cu — how long does a thread take to ISSUE a few cp.async right after griddepcontrol.wait
 * returns, and to see them land?
 *
 * The question behind it: in the Pi0.5 expert every low-bit GEMM's thread 0 needs 0.42-0.54 us from
 * its wait's return to having issued its first X window (5 cp.async and their address arithmetic;
 * ktrace MARK7 at aaece13), and running that code once before the wait (NIB_GEMM_LAB_WARM) did not
 * shorten it: cold instruction fetch is not the reason (docs/design.md, "Sixty-ninth session").
 *
 * A pair of kernels in one stream: the producer (G CTAs x 256 threads) triggers its dependents
 * first, spins ~SPIN_NS, writes X (20 KB, the expert's 10 tokens x 1024) and exits; the consumer
 * (G CTAs x 256 threads, launched with the PDL attribute in the pdl modes) times, per CTA (thread 0,
 * clock64): wait -> 5 cp.async of X issued -> committed group landed.
 * Modes: plain (no attribute, no wait: the consumer starts after the producer), pdl (attribute,
 * wait), pdl+ldg (as pdl, and every thread first issues 4 16-byte loads of a 1 GB buffer before the
 * wait, as REG = 1's first weights are), pdl+late (the loads after the wait, before the X copies).
 * Prints one JSON object per mode: cycles, medians over CTAs and 21 repetitions. Arguments: SPIN_NS
 * (default 20000; the consumer's CTAs must arrive before the producer ends for the wait to wait), CTAS
 * (default 80; above the SM count some SMs hold two consumer CTAs, as a product's CTAs may share an SM
 * in the model), STORE_BYTES (16, the default: the producer writes X in contiguous 16-byte stores; 4:
 * in 4-byte stores in an MMA fragment's order, as the model's epilogues write).
 *
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/pdl_issue bench/probes/pdl_issue.cu && /tmp/pdl_issue
 */
#include <cstdint>

#include "probe.cuh"

enum { PLAIN = 0, PDL = 1, PDL_LDG = 2, PDL_LATE = 3, PDL_BULK = 4, PDL_LATE_BULK = 5, PDL_W_CP = 6, PDL_W_BULKW = 7 };
constexpr int XB = 10 * 1024 * 2; /* X bytes */
constexpr int NT = 256;

static __device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ unsigned long long g_start; /* the producer's start (CTA 0) */
/* store_bytes 16: X in 16-byte stores, contiguous; 4: in 4-byte stores in an MMA fragment's order (a warp's
 * store covers 16 bytes of each of 8 token rows, as an epilogue writing from accumulator fragments does) */
__global__ void k_producer(uint4 *x, int spin_ns, int store_bytes) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const unsigned long long t0 = gtimer();
    if (blockIdx.x == 0 && threadIdx.x == 0) *(volatile unsigned long long *)&g_start = t0;
    while (gtimer() - t0 < (unsigned long long)spin_ns) {
    }
    if (store_bytes == 4) {
        uint32_t *xw = (uint32_t *)x;
        constexpr int ROWS = 10, WPR = XB / 4 / ROWS; /* words per token row */
        for (int i = blockIdx.x * NT + threadIdx.x; i < XB / 4; i += gridDim.x * NT)
            xw[((i >> 2) % ROWS) * WPR + (i & 3) + 4 * (i / (4 * ROWS))] = (uint32_t)i;
        return;
    }
    for (int i = blockIdx.x * NT + threadIdx.x; i < XB / 16; i += gridDim.x * NT)
        x[i] = make_uint4(i, i + 1, i + 2, i + 3);
}

static __device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity) {
    uint32_t ok;
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return ok != 0;
}

template <int MODE>
__global__ void __launch_bounds__(NT) k_consumer(const uint4 *x, const uint4 *big, size_t big_n, long long *t, uint4 *sink,
                                                 int spin_ns, int lead_ns, int rep) {
    __shared__ __align__(16) uint4 xs[XB / 16];
    __shared__ __align__(8) uint64_t bar;
    constexpr bool BULK = MODE == PDL_BULK || MODE == PDL_LATE_BULK || MODE == PDL_W_BULKW;
    const uint32_t bar_a = (uint32_t)__cvta_generic_to_shared(&bar);
    if (BULK) {
        if (threadIdx.x == 0) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_a) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
    }
    uint4 w[5];
    const size_t base = ((size_t)blockIdx.x * NT + threadIdx.x) * 4 * 997 % (big_n - 8);
    if (MODE == PDL_LDG) {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = __ldcs(big + base + i);
    }
    if (MODE >= PDL_W_CP) {
        /* until LEAD_NS before the producer's end, then the first weight step (contiguous per CTA) */
        unsigned long long st = 0;
        while ((st = *(volatile unsigned long long *)&g_start) == 0) {
        }
        while (gtimer() < st + (unsigned long long)(spin_ns - lead_ns)) {
        }
        /* a fresh 20 MB region each repetition (not in L2) */
        const uint4 *wb = big + ((size_t)(rep * gridDim.x + blockIdx.x) * 16384) % (big_n - 16384);
#pragma unroll
        for (int i = 0; i < 5; i++) w[i] = __ldcs(wb + i * NT + threadIdx.x);
        if (MODE == PDL_W_BULKW && threadIdx.x == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_a), "r"(XB) : "memory");
    }
    long long c0 = clock64();
    if (MODE != PLAIN) asm volatile("griddepcontrol.wait;" ::: "memory");
    const long long c1 = clock64();
    if (MODE == PDL_LATE || MODE == PDL_LATE_BULK) {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = __ldcs(big + base + i);
    }
    long long c2, c3;
    if (MODE == PDL_W_BULKW) {
        constexpr int ROWS = 10, RB = XB / ROWS;
        const int warp = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0)
            for (int r = warp; r < ROWS; r += NT / 32)
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                                 (uint32_t)__cvta_generic_to_shared(xs) + r * RB),
                             "l"((const char *)x + r * RB), "r"(RB), "r"(bar_a)
                             : "memory");
        c2 = clock64();
        while (!mbar_try(bar_a, 0)) {
        }
        c3 = clock64();
    } else if (BULK) {
        constexpr int ROWS = 10, RB = XB / ROWS;
        if (threadIdx.x < 32) {
            if (threadIdx.x == 0)
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_a), "r"(XB) : "memory");
            __syncwarp();
            if (threadIdx.x < ROWS)
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                                 (uint32_t)__cvta_generic_to_shared(xs) + threadIdx.x * RB),
                             "l"((const char *)x + threadIdx.x * RB), "r"(RB), "r"(bar_a)
                             : "memory");
        }
        c2 = clock64();
        while (!mbar_try(bar_a, 0)) {
        }
        c3 = clock64();
    } else {
#pragma unroll
        for (int i = 0; i < XB / 16 / NT; i++) {
            const int e = threadIdx.x + i * NT;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(xs + e)),
                         "l"(x + e));
        }
        asm volatile("cp.async.commit_group;");
        c2 = clock64();
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        c3 = clock64();
    }
    __syncthreads();
    const long long c4 = clock64();
    uint4 v = xs[(threadIdx.x * 7) % (XB / 16)];
    if (MODE >= PDL_LDG) v.x += w[0].x + w[1].y + w[2].z + w[3].w;
    if (MODE >= PDL_W_CP) v.y += w[4].x;
    sink[blockIdx.x * NT + threadIdx.x] = v;
    if (threadIdx.x == 0) {
        long long *r = t + blockIdx.x * 4;
        r[0] = c1 - c0; /* the wait */
        r[1] = c2 - c1; /* the X copies issued */
        r[2] = c3 - c2; /* thread 0's copies landed (bulk: all of X) */
        r[3] = c4 - c3; /* every thread's (the CTA barrier) */
    }
}

int main(int argc, char **argv) {
    const int SPIN = argc > 1 ? atoi(argv[1]) : 20000, G = argc > 2 ? atoi(argv[2]) : 80, SB = argc > 3 ? atoi(argv[3]) : 16,
              REPS = 21;
    if (SPIN < 0 || G < 1 || G > 1024 || (SB != 4 && SB != 16)) {
        fprintf(stderr, "usage: pdl_issue [SPIN_NS >= 0] [CTAS 1..1024] [STORE_BYTES 4 | 16]\n");
        return 2;
    }
    const size_t big_n = (1u << 30) / 16;
    uint4 *x, *big, *sink;
    long long *t;
    CHECK(cudaMalloc(&x, XB));
    CHECK(cudaMalloc(&big, big_n * 16));
    CHECK(cudaMemset(big, 1, big_n * 16));
    CHECK(cudaMalloc(&sink, (size_t)G * NT * 16));
    CHECK(cudaMalloc(&t, (size_t)G * 4 * sizeof(long long)));
    const char *names[] = {"plain", "pdl", "pdl+ldg", "pdl+late", "pdl+bulk", "pdl+late+bulk", "w+cp", "w+bulkw"};
    const int leads[] = {0, 300, 1000, 3000};
    for (int mode = 0; mode < 8; mode++)
        for (int li = mode >= PDL_W_CP ? 1 : 0; li < (mode >= PDL_W_CP ? 4 : 1); li++) {
            const int lead = leads[li];
            std::vector<long long> col[4];
            for (int r = 0; r < REPS; r++) {
                const unsigned long long zero = 0;
                CHECK(cudaMemcpyToSymbol(g_start, &zero, sizeof zero));
                k_producer<<<G, NT>>>(x, SPIN, SB);
                CHECK(cudaGetLastError());
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(G);
                cfg.blockDim = dim3(NT);
                cfg.attrs = at;
                cfg.numAttrs = mode == PLAIN ? 0 : 1;
                const uint4 *cx = x, *cb = big;
#define LAUNCH(M) CHECK(cudaLaunchKernelEx(&cfg, k_consumer<M>, cx, cb, big_n, t, sink, SPIN, lead, r))
                switch (mode) {
                case PLAIN: LAUNCH(PLAIN); break;
                case PDL: LAUNCH(PDL); break;
                case PDL_LDG: LAUNCH(PDL_LDG); break;
                case PDL_LATE: LAUNCH(PDL_LATE); break;
                case PDL_BULK: LAUNCH(PDL_BULK); break;
                case PDL_LATE_BULK: LAUNCH(PDL_LATE_BULK); break;
                case PDL_W_CP: LAUNCH(PDL_W_CP); break;
                default: LAUNCH(PDL_W_BULKW); break;
                }
#undef LAUNCH
                CHECK(cudaDeviceSynchronize());
                if (r == 0) continue; /* warm-up */
                std::vector<long long> h((size_t)G * 4);
                CHECK(cudaMemcpy(h.data(), t, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
                for (int b = 0; b < G; b++)
                    for (int k = 0; k < 4; k++) col[k].push_back(h[b * 4 + k]);
            }
            long long med[4];
            for (int k = 0; k < 4; k++) {
                std::sort(col[k].begin(), col[k].end());
                med[k] = col[k][col[k].size() / 2];
            }
            printf("{\"mode\": \"%s\", \"spin_ns\": %d, \"lead_ns\": %d, \"ctas\": %d, \"store_bytes\": %d, \"wait_cycles\": %lld, "
                   "\"issue_cycles\": %lld, \"landed_t0_cycles\": %lld, \"landed_all_cycles\": %lld}\n",
                   names[mode], SPIN, lead, G, SB, med[0], med[1], med[2], med[3]);
            fflush(stdout);
        }
    CHECK(cudaFree(x));
    CHECK(cudaFree(big));
    CHECK(cudaFree(sink));
    CHECK(cudaFree(t));
    return 0;
}
