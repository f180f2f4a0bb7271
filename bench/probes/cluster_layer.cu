/* cluster_layer.cu — how long do the four GEMMs of one Pi0.5 expert layer take (NVFP4 weights,
 * 16 activation rows) when only G SMs work on them, e.g. the 16 SMs of one thread-block cluster?
 *
 * The question (see sm_intake.cu): a persistent expert kernel on ONE cluster would trade the
 * whole GPU's bandwidth for hardware cluster barriers and distributed shared memory. One GPC pulls
 * ~0.97 TB/s; what is left to know is whether 16 SMs can decode and multiply an expert layer's
 * 17.3 M NVFP4 weights (q|k|v 1024x2560, o 2048x1024, gate|up 1024x8192, down 4096x1024) fast
 * enough, with the project's own decoder and mma.sync path (ops/cuda/gemm_lowbit.cuh's
 * compute_chunk, 2 n-tiles = 16 rows).
 *
 * Each CTA (one per SM) streams its share of 18 layers' weight chunks (16 rows x 128 K: 1024
 * element bytes + 128 scale bytes, as the GEMM's bulk ring holds them) through a shared-memory
 * ring: one producer lane issues cp.async.bulk copies of CPS chunks, NWC compute warps take the
 * chunks round robin, decode them and multiply them with a 16 x 2048 bf16 activation tile in
 * shared memory (k range = chunk index mod 16). Outputs are not reduced or written (a checksum
 * keeps the work alive): this is the floor of the GEMM part of a layer on G SMs, not a kernel.
 * COMPUTE = 0 only streams (the consumers wait and release): the bandwidth side alone.
 * Timed with CUDA events, median of 7 launches, weights rotated over 2 regions (cold L2).
 *
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I. -Iinclude \
 *        -o /tmp/cluster_layer bench/probes/cluster_layer.cu && /tmp/cluster_layer
 */
#include <cstdint>

#include "ops/cuda/gemm_lowbit.cuh"
#include "probe.cuh"

using namespace nib;

constexpr int KX = 2048, LDS = KX + 8, CHB = 1152, XBYTES = 16 * LDS * 2;
constexpr int LAYER_WEIGHTS = 1024 * 2560 + 2048 * 1024 + 1024 * 8192 + 4096 * 1024; /* 17.3 M */
constexpr int LAYER_CHUNKS = LAYER_WEIGHTS / 2048;                                     /* 8448 */

__device__ __forceinline__ void wait_parity(uint32_t bar, unsigned par) {
    asm volatile("{\n.reg .pred p;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W_%=;\n}\n" ::"r"(bar),
                 "r"(par)
                 : "memory");
}

template <int NWC, int CPS, int COMPUTE>
__global__ void __launch_bounds__((NWC + 1) * 32, 1) k_layer(const uint8_t *w, int copies, int stages, float *sink) {
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ __align__(8) uint64_t full[64], empty[64];
    __nv_bfloat16 *xs = (__nv_bfloat16 *)sm;
    uint8_t *ring = sm + XBYTES;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int i = tid; i < 16 * LDS; i += blockDim.x) xs[i] = __float2bfloat16(0.01f * (float)(i % 7));
    if (tid == 0) {
        for (int s = 0; s < stages; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[s])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&empty[s])), "r"(CPS));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const uint8_t *src = w + (size_t)blockIdx.x * copies * CPS * CHB;
    if (warp == NWC) { /* producer */
        if (lane == 0) {
            int s = 0;
            unsigned ph = 0;
            for (int i = 0; i < copies; i++) {
                if (i >= stages) wait_parity(smem_u32(&empty[s]), ph ^ 1u);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&full[s])), "r"(CPS * CHB)
                             : "memory");
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                                 smem_u32(ring + (size_t)s * CPS * CHB)),
                             "l"(src + (size_t)i * CPS * CHB), "r"(CPS * CHB), "r"(smem_u32(&full[s]))
                             : "memory");
                if (++s == stages) s = 0, ph ^= 1u;
            }
        }
        return;
    }
    float acc[1][2][4], acc2[1][2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[0][nt][i] = acc2[0][nt][i] = 0.f;
    uint32_t brow[2];
#pragma unroll
    for (int nt = 0; nt < 2; nt++) brow[nt] = smem_u32(xs) + ((nt * 8 + (lane & 7)) * LDS + (lane >> 3) * 8) * 2;
    const uint32_t scale_add = (235u << 7) * 0x00010001u;
    const int n = copies * CPS;
    /* chunk j: copy i = j / CPS, within it cc = j % CPS; incremental (NWC is a multiple of CPS or
     * CPS of NWC: both powers of two) */
    for (int j = warp; j < n; j += NWC) {
        const int i = j / CPS, cc = j % CPS, s = i % stages;
        const unsigned ph = (unsigned)((i / stages) & 1);
        wait_parity(smem_u32(&full[s]), ph);
        const uint8_t *c = ring + ((size_t)s * CPS + cc) * CHB;
        Chunk<NIB_WFMT_NVFP4> ch[1];
        ch[0].e[0] = *(const uint4 *)(c + lane * 16);
        ch[0].e[1] = *(const uint4 *)(c + 512 + lane * 16);
        ch[0].s = *(const uint4 *)(c + 1024 + (lane >> 2) * 16);
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&empty[s])) : "memory");
        if (COMPUTE) {
            const uint32_t off = (uint32_t)(j & 15) * 256;
            uint32_t bw[2] = {brow[0] + off, brow[1] + off};
            compute_chunk<NIB_WFMT_NVFP4, 2, 1>(acc, acc2, ch, scale_add, bw);
        } else {
            acc[0][0][0] += __uint_as_float(ch[0].e[0].x & 0x3F000000u);
        }
    }
    float t = 0.f;
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) t += acc[0][nt][i] + acc2[0][nt][i];
    if (t == 1234.5f) sink[blockIdx.x] = t;
}

template <int NWC, int CPS, int COMPUTE>
static void run(uint8_t *buf, size_t region, int G, int cluster, int stages, int layers, float *sink, const char *dev) {
    auto kern = k_layer<NWC, CPS, COMPUTE>;
    const int smem = XBYTES + stages * CPS * CHB;
    CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    const long long chunks = (long long)LAYER_CHUNKS * layers;
    const int copies = (int)((chunks + (long long)G * CPS - 1) / ((long long)G * CPS));
    if ((size_t)copies * CPS * CHB * G > region) {
        fprintf(stderr, "region too small\n");
        exit(1);
    }
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = probe_cfg(G, (NWC + 1) * 32, smem, cluster, at);
    const double ms = probe_median_ms(8, [&](int r) {
        CHECK(cudaLaunchKernelEx(&cfg, kern, (const uint8_t *)(buf + region * (r & 1)), copies, stages, sink));
    });
    const double us = ms * 1e3;
    const double bytes = (double)copies * CPS * CHB * G;
    printf("{\"device\": \"%s\", \"compute\": %d, \"warps\": %d, \"cps\": %d, \"stages\": %d, \"ring_kb\": %d, \"ctas\": %d, "
           "\"cluster\": %d, \"layers\": %d, \"us\": %.1f, \"us_per_layer\": %.2f, \"gbps\": %.0f, "
           "\"gweights_per_s_per_sm\": %.1f}\n",
           dev, COMPUTE, NWC, CPS, stages, stages * CPS * CHB / 1024, G, cluster, layers, us, us / layers, bytes / (us * 1e3),
           (double)copies * CPS * 2048 / (us * 1e3));
    fflush(stdout);
}

int main() {
    CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int layers = 18;
    const size_t region = (size_t)LAYER_CHUNKS * layers * CHB + (size_t)132 * 16 * CHB * 8;
    uint8_t *buf;
    CHECK(cudaMalloc(&buf, region * 2));
    CHECK(cudaMemset(buf, 0x22, region * 2));
    float *sink;
    CHECK(cudaMalloc(&sink, 4096 * 4));
    const char *d = prop.name;
    /* ring: 16 stages x 8 chunks = 144 KB (+ 64 KB of activations) */
    for (int G : {16, 32, 66, 132}) {
        const int cl = G == 16 ? 16 : 1;
        run<8, 8, 0>(buf, region, G, cl, 16, layers, sink, d);
        run<8, 8, 1>(buf, region, G, cl, 16, layers, sink, d);
        run<16, 8, 1>(buf, region, G, cl, 16, layers, sink, d);
    }
    run<8, 8, 1>(buf, region, 16, 1, 16, layers, sink, d); /* 16 spread over GPCs */
    run<16, 8, 1>(buf, region, 16, 1, 16, layers, sink, d);
    run<16, 4, 1>(buf, region, 16, 16, 32, layers, sink, d);
    return 0;
}
