/* sm_intake.cu — how fast can G SMs pull cold bytes from DRAM, as a function of G, of the
 * bytes in flight per SM, of the copy mechanism, and of whether the CTAs form one cluster?
 *
 * The question behind it: the persistent expert kernel (ops/cuda/expert.cu) runs one CTA per SM
 * on all 132 SMs so that the weights stream at the full copy bandwidth, and pays ~1.1 us per
 * grid barrier, 6 per layer. A kernel on ONE thread-block cluster (<= 16 CTAs, one GPC) would
 * synchronize through cluster barriers and distributed shared memory instead; it is only worth
 * building if 8-16 SMs can still pull the expert's ~9.4 MB per layer fast enough.
 *
 * Each CTA (one per SM: the dynamic shared memory forces it) streams its own contiguous slice of a
 * buffer far larger than L2, either
 *   bulk: thread 0 issues cp.async.bulk copies of `chunk` bytes into a ring of `stages` slots
 *         (mbarrier per slot; a slot is reused when its copy has landed), or
 *   ld:   every thread keeps `unroll` 16-byte ld.global.nc loads in flight (256 threads).
 * Timed with CUDA events, median of 9 launches, each on a different region (cold L2).
 * Build and run (on the GPU machine):
 *   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/sm_intake bench/probes/sm_intake.cu
 *   /tmp/sm_intake [BYTES_PER_CTA]          G = 1 .. 132, bulk ring depths and copy sizes, ld, one
 *                                           cluster of G <= 16; then the cluster barrier's cost
 *   /tmp/sm_intake BYTES_PER_CTA copies     the rate of small copies: 1 or 8 issuing warps per CTA
 * Prints one JSON object per configuration. Results: bench/results/sm-intake-h100.json.
 */
#include <cstdint>

#include "probe.cuh"

static __device__ __forceinline__ uint32_t sptr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__global__ void k_bulk(const uint8_t *src, size_t per_cta, int chunk, int stages, unsigned *sink) {
    extern __shared__ __align__(128) uint8_t ring_all[];
    __shared__ __align__(8) uint64_t bar_all[8][64];
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint8_t *ring = ring_all + (size_t)warp * stages * chunk;
    uint64_t *bar = bar_all[warp];
    const size_t per_warp = per_cta / nw;
    const uint8_t *base = src + (size_t)blockIdx.x * per_cta + (size_t)warp * per_warp;
    const int n = (int)(per_warp / (size_t)chunk);
    if ((threadIdx.x & 31) == 0) {
        for (int s = 0; s < stages; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sptr(&bar[s])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int i = 0; i < n; i++) {
            const int s = i % stages;
            if (i >= stages) {
                const unsigned par = (unsigned)((i / stages - 1) & 1);
                asm volatile("{\n.reg .pred p;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W_%=;\n}\n" ::"r"(
                                 sptr(&bar[s])),
                             "r"(par)
                             : "memory");
            }
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sptr(&bar[s])), "r"(chunk) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             sptr(ring + (size_t)s * chunk)),
                         "l"(base + (size_t)i * chunk), "r"(chunk), "r"(sptr(&bar[s]))
                         : "memory");
        }
        for (int i = n > stages ? n - stages : 0; i < n; i++) { /* drain */
            const int s = i % stages;
            const unsigned par = (unsigned)((i / stages) & 1);
            asm volatile("{\n.reg .pred p;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W_%=;\n}\n" ::"r"(
                             sptr(&bar[s])),
                         "r"(par)
                         : "memory");
        }
        if (ring[(threadIdx.x * 4099) % (stages * chunk)] == 0x77) sink[blockIdx.x] = 1;
    }
}

/* `iters` cluster barriers in a row (arrive.release + wait.acquire), each after a store to the
 * next CTA's shared memory and a read of our own (a DSMEM hand-off per barrier) */
__global__ void k_cbar(int iters, unsigned *sink) {
    __shared__ unsigned box[32];
    unsigned v = threadIdx.x, rank, n;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    const uint32_t mine = sptr(&box[threadIdx.x & 31]);
    uint32_t peer;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(mine), "r"((rank + 1) % n));
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    for (int i = 0; i < iters; i++) {
        asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(peer), "r"(v + i) : "memory");
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
        v += box[threadIdx.x & 31];
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    }
    if (v == 0x12345678u) sink[blockIdx.x] = v;
}

template <int U> __global__ void k_ld(const uint8_t *src, size_t per_cta, unsigned *sink) {
    const uint4 *p = (const uint4 *)(src + (size_t)blockIdx.x * per_cta);
    const size_t n = per_cta / 16;
    uint32_t acc = 0;
    for (size_t i = threadIdx.x; i < n; i += (size_t)blockDim.x * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const size_t j = i + (size_t)u * blockDim.x;
            if (j < n)
                asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                             : "l"(p + j));
            else
                v[u] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

int main(int argc, char **argv) {
    int dev = 0;
    CHECK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev));
    const int sms = prop.multiProcessorCount;
    const size_t per_cta = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)4 << 20;
    const int regions = 9;
    const size_t region = per_cta * (size_t)sms;
    uint8_t *buf;
    CHECK(cudaMalloc(&buf, region * regions));
    CHECK(cudaMemset(buf, 1, region * regions));
    unsigned *sink;
    CHECK(cudaMalloc(&sink, 4096 * 4));
    const int smem_max = 200 * 1024;
    CHECK(cudaFuncSetAttribute(k_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));
    CHECK(cudaFuncSetAttribute(k_bulk, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CHECK(cudaFuncSetAttribute(k_ld<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));
    CHECK(cudaFuncSetAttribute(k_ld<8>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CHECK(cudaFuncSetAttribute(k_ld<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));
    CHECK(cudaFuncSetAttribute(k_ld<16>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    printf("{\"device\": \"%s\", \"sms\": %d, \"per_cta_bytes\": %zu}\n", prop.name, sms, per_cta);

    struct Cfg {
        const char *mech;
        int chunk, stages, cluster, warps;
    };
    std::vector<Cfg> cfgs;
    const bool copies = argc > 2 && argv[2][0] == 'c';
    if (copies) { /* the per-copy rate: small copies, 1 or 8 issuing warps, ~96-128 KB in flight per SM */
        for (int w : {1, 8})
            for (int ch : {512, 1024, 2048, 4096, 8192, 16384}) {
                int st = 128 * 1024 / w / ch;
                if (st > 64) st = 64;
                if (st < 2) continue;
                cfgs.push_back({"bulk", ch, st, 0, w});
            }
    } else {
        cfgs = {
            {"bulk", 16384, 4, 0, 1},  {"bulk", 16384, 8, 0, 1}, {"bulk", 16384, 12, 0, 1}, {"bulk", 8192, 24, 0, 1},
            {"bulk", 32768, 6, 0, 1},  {"bulk", 4096, 48, 0, 1}, {"ld8", 0, 0, 0, 8},        {"ld16", 0, 0, 0, 8},
            {"bulk", 16384, 12, 1, 1}, {"bulk", 32768, 6, 1, 1}, {"ld16", 0, 0, 1, 8},
        };
    }
    const int gs[] = {1, 2, 4, 8, 16, 32, 66, 132};
    for (const Cfg &c : cfgs) {
        for (int G : gs) {
            if (copies && G != 1 && G != 16 && G != 132) continue;
            if (G > sms) continue;
            int cl = c.cluster ? std::min(G, 16) : 1;
            if (c.cluster && G > 16) continue;
            cudaLaunchAttribute at[1];
            /* one CTA per SM: the dynamic shared memory forces it */
            const cudaLaunchConfig_t cfg = probe_cfg(G, 32 * c.warps, smem_max, cl, at);
            const double ms = probe_median_ms(regions + 1, [&](int r) {
                const uint8_t *src = buf + region * (size_t)(r % regions);
                if (c.mech[0] == 'b')
                    CHECK(cudaLaunchKernelEx(&cfg, k_bulk, src, per_cta, c.chunk, c.stages, sink));
                else if (c.mech[2] == '8')
                    CHECK(cudaLaunchKernelEx(&cfg, k_ld<8>, src, per_cta, sink));
                else
                    CHECK(cudaLaunchKernelEx(&cfg, k_ld<16>, src, per_cta, sink));
            });
            const double us = ms * 1e3;
            const double gbs = (double)per_cta * G / (us * 1e3);
            printf("{\"mech\": \"%s\", \"warps\": %d, \"chunk\": %d, \"stages\": %d, \"in_flight_kb\": %d, \"cluster\": %d, \"ctas\": %d, "
                   "\"us\": %.2f, \"gbps\": %.1f, \"gbps_per_sm\": %.1f}\n",
                   c.mech, c.warps, c.chunk, c.stages, c.mech[0] == 'b' ? c.warps * c.chunk * c.stages / 1024 : (c.mech[2] == '8' ? 32 : 64), cl,
                   G, us, gbs, gbs / G);
        }
    }
    if (copies) return 0;
    /* cluster barriers: 2 per iteration */
    CHECK(cudaFuncSetAttribute(k_cbar, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    for (int cl : {2, 4, 8, 16}) {
        for (int threads : {128, 256}) {
            const int iters = 2000;
            cudaLaunchAttribute at[1];
            const cudaLaunchConfig_t cfg = probe_cfg(cl, threads, 0, cl, at);
            const double ms = probe_median_ms(6, [&](int) { CHECK(cudaLaunchKernelEx(&cfg, k_cbar, iters, sink)); });
            printf("{\"mech\": \"cluster_barrier\", \"cluster\": %d, \"threads\": %d, \"ns_per_barrier\": %.1f}\n", cl,
                   threads, ms * 1e6 / (2.0 * iters));
        }
    }
    return 0;
}
