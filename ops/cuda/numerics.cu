/* numerics.cu — CUDA twin of ops/numerics.h: count the NaN / Inf elements of a [rows][cols]
 * bf16 or fp32 matrix (row stride ld) and find the first in row-major order. One grid-stride
 * pass, a warp reduction, then one atomicAdd (count) and one atomicMin (first index) per warp
 * that saw any: both are exact on integers, so the result does not depend on the schedule.
 * The result is read back and the stream synchronized: check-numerics mode only, never inside
 * a captured graph. Plain launch (no PDL attribute): it starts after the previous kernel ends.
 * Tested by tests/test_numerics.c (numerics_gpu_check_finite_matches_reference):
 *   make && ./build/nib_tests numerics_ */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "ops/numerics.h"
#include "runtime/cuda_check.h"

__global__ void k_check_finite(const void *x, long long rows, long long cols, long long ld, int f32,
                               unsigned long long *res) {
    const unsigned long long n = (unsigned long long)rows * (unsigned long long)cols;
    unsigned long long count = 0, first = ~0ull;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const long long r = (long long)(i / (unsigned long long)cols), c = (long long)i - r * cols;
        bool bad;
        if (f32) bad = (((const uint32_t *)x)[r * ld + c] & 0x7F800000u) == 0x7F800000u;
        else bad = (((const uint16_t *)x)[r * ld + c] & 0x7F80u) == 0x7F80u;
        if (bad) {
            count++;
            if (i < first) first = i;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        count += __shfl_xor_sync(0xffffffffu, count, off);
        unsigned long long o = __shfl_xor_sync(0xffffffffu, first, off);
        first = o < first ? o : first;
    }
    if ((threadIdx.x & 31) == 0 && count) {
        atomicAdd(&res[0], count);
        atomicMin(&res[1], first);
    }
}

nib_status nib_cuda_check_finite(const nib_check_finite_args *a, void *ws, nib_finite_result *out, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    memset(out, 0, sizeof *out);
    out->first = UINT64_MAX;
    if (!a || !ws || a->rows < 0 || a->cols < 0 || a->ld < a->cols || (!a->x && a->rows && a->cols))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "check_finite: bad arguments (rows %lld, cols %lld, ld %lld, ws %p)",
                       a ? (long long)a->rows : 0, a ? (long long)a->cols : 0, a ? (long long)a->ld : 0, ws);
    const long long n = (long long)a->rows * a->cols;
    if (n == 0) return NIB_OK;
    unsigned long long *res = (unsigned long long *)ws, host[2] = {0, 0};
    NIB_CUDA_CHECK(cudaMemsetAsync(res, 0, 8, s));
    NIB_CUDA_CHECK(cudaMemsetAsync(res + 1, 0xFF, 8, s));
    long long blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    k_check_finite<<<(unsigned)blocks, 256, 0, s>>>(a->x, a->rows, a->cols, a->ld, a->f32, res);
    NIB_LAUNCH_CHECK("k_check_finite");
    NIB_CUDA_CHECK(cudaMemcpyAsync(host, res, sizeof host, cudaMemcpyDeviceToHost, s));
    NIB_CUDA_CHECK(cudaStreamSynchronize(s));
    out->count = host[0];
    if (!out->count) return NIB_OK;
    out->first = host[1];
    /* the first bad element's value (NaN or which infinity) for the message */
    const long long r = (long long)(host[1] / (unsigned long long)a->cols), c = (long long)host[1] - r * a->cols;
    if (a->f32) {
        NIB_CUDA_CHECK(cudaMemcpyAsync(&out->value, (const float *)a->x + r * a->ld + c, 4, cudaMemcpyDeviceToHost, s));
        NIB_CUDA_CHECK(cudaStreamSynchronize(s));
    } else {
        uint16_t h = 0;
        NIB_CUDA_CHECK(cudaMemcpyAsync(&h, (const uint16_t *)a->x + r * a->ld + c, 2, cudaMemcpyDeviceToHost, s));
        NIB_CUDA_CHECK(cudaStreamSynchronize(s));
        uint32_t b = (uint32_t)h << 16;
        memcpy(&out->value, &b, 4);
    }
    return NIB_OK;
}
