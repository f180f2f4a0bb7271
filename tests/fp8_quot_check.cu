/* fp8_quot_check.cu — the GPU side of ops_gpu_fp8_quotient (tests/test_ops_gpu.c): runs
 * ops/cuda/fp8_rows.cuh, the per-row FP8 hand-off every W8A8 activation kernel shares, on an
 * fp32 matrix, once by its fast path (one reciprocal per row, Markstein's correction per value)
 * and once by IEEE division per value (the definition), so the test can compare them bit for bit.
 * One CTA of 256 threads per row; k a multiple of 8. */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "ops/cuda/fp8_rows.cuh"
#include "runtime/cuda_check.h"

/* mode 0: the kernels' path (fp8_codes8 with fp8_quot_rcp); 1: __fdiv_rn per value; 2: the fast
 * path without its correction step (q = RN(v r): wrong in the last bit of some quotients; the test
 * requires it to be caught). fast[row] = 1 when fp8_quot_rcp took the fast path for the row. */
__global__ void k_fp8_quot_probe(const float *x, int k, int mode, uint8_t *codes, float *scales, uint8_t *fast) {
    __shared__ float sh[8];
    const float *row = x + (size_t)blockIdx.x * k;
    float amax = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(row[i]));
    amax = nib::cta_max(amax, sh, blockDim.x / 32);
    const float sc = nib::fp8_row_scale_of(amax), rc = nib::fp8_quot_rcp(sc);
    if (threadIdx.x == 0) scales[blockIdx.x] = sc, fast[blockIdx.x] = rc != 0.f;
    for (int c = threadIdx.x; c < k / 8; c += blockDim.x) {
        float v[8];
        for (int e = 0; e < 8; e++) v[e] = row[8 * c + e];
        uint2 w;
        if (mode == 0) {
            w = nib::fp8_codes8(v, sc, rc);
        } else {
            uint32_t b[2] = {0u, 0u};
            for (int e = 0; e < 8; e++) {
                const float q = mode == 1 || rc == 0.f ? __fdiv_rn(v[e], sc) : __fmul_rn(v[e], rc);
                b[e >> 2] |= (uint32_t)__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3) << (8 * (e & 3));
            }
            w = make_uint2(b[0], b[1]);
        }
        *(uint2 *)(codes + (size_t)blockIdx.x * k + 8 * c) = w;
    }
}

/* x: device [rows][k] fp32; codes [rows][k], scales [rows], fast [rows]: device */
extern "C" nib_status nib_test_fp8_quot_probe(const float *x, int rows, int k, int mode, uint8_t *codes, float *scales,
                                              uint8_t *fast) {
    if (rows <= 0 || k <= 0 || k % 8) return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 quotient probe: rows %d, k %d", rows, k);
    k_fp8_quot_probe<<<rows, 256>>>(x, k, mode, codes, scales, fast);
    NIB_LAUNCH_CHECK("k_fp8_quot_probe");
    NIB_CUDA_CHECK(cudaDeviceSynchronize());
    return NIB_OK;
}
