/* tanh_approx_check.cu — the GPU side of ops_gpu_tanh_approx_bound (tests/test_ops_gpu.c): every float z
 * of one sign through gelu.cuh's hardware tanh (tanh.approx.f32), against tanh in double. Worst relative
 * error over the normal inputs, worst absolute error over the subnormal ones, and the count of results
 * that are NaN / Inf or above 1 in magnitude. The bound the activation tests carry (ops/act.h
 * NIB_ACT_TANH_APPROX_ERR) must cover the first. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runtime/cuda_check.h"

struct TanhSweep {
    unsigned long long rel, sub; /* doubles >= 0 as their bit patterns: the integer order is the value order */
    unsigned long long bad;
};

__global__ void k_tanh_sweep(uint32_t sign, TanhSweep *out) {
    double rel = 0.0, sub = 0.0;
    unsigned long long bad = 0;
    const uint32_t stride = gridDim.x * blockDim.x;
    for (uint32_t b = blockIdx.x * blockDim.x + threadIdx.x; b < 0x7F800000u; b += stride) {
        const float z = __uint_as_float(b | sign);
        float t;
        asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(z));
        const double want = tanh((double)z), err = fabs((double)t - want);
        if (!(fabsf(t) <= 1.0f)) bad++;
        else if (b < 0x00800000u) sub = fmax(sub, err);
        else rel = fmax(rel, err / fabs(want));
    }
    atomicMax(&out->rel, (unsigned long long)__double_as_longlong(rel));
    atomicMax(&out->sub, (unsigned long long)__double_as_longlong(sub));
    if (bad) atomicAdd(&out->bad, bad);
}

extern "C" nib_status nib_test_tanh_sweep(int negative, double *rel, double *sub, unsigned long long *bad) {
    TanhSweep *d = NULL, h;
    NIB_CUDA_CHECK(cudaMalloc((void **)&d, sizeof h));
    NIB_CUDA_CHECK(cudaMemset(d, 0, sizeof h));
    k_tanh_sweep<<<132 * 8, 256>>>(negative ? 0x80000000u : 0u, d);
    NIB_LAUNCH_CHECK("k_tanh_sweep");
    NIB_CUDA_CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    NIB_CUDA_CHECK(cudaFree(d));
    memcpy(rel, &h.rel, sizeof *rel);
    memcpy(sub, &h.sub, sizeof *sub);
    *bad = h.bad;
    return NIB_OK;
}
