/* timing.cu — graph-replay timer and ceiling measurements for the lab and `nib doctor`. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gemm.h"
#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/timing.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

nib_status nib_lab_time_graph(nib_lab_fn fn, void *ctx, int calls, int reps, nib_lab_timing *out) {
    nib_status st = NIB_OK;
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double *t = NULL;
    memset(out, 0, sizeof *out);
    if (calls < 1 || reps < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "lab timer: calls %d reps %d", calls, reps);
    t = (double *)calloc((size_t)reps, sizeof *t);
    if (!t) return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "lab timer");
    NIB_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    NIB_CUDA_TRY(cudaEventCreate(&e0));
    NIB_CUDA_TRY(cudaEventCreate(&e1));
    /* one eager call first: first-launch costs (module load, attribute setting) stay out */
    NIB_TRY(fn(ctx, 0, s));
    NIB_CUDA_TRY(cudaStreamSynchronize(s));
    NIB_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++) {
        st = fn(ctx, i, s);
        if (st) {
            /* end the capture (the stream must leave capture mode) and report how that went: a
             * sticky error here means the device is lost, which outranks fn's error; any other
             * failure besides the expected "invalidated" is added to fn's message */
            cudaGraph_t dummy = NULL;
            cudaError_t ce = cudaStreamEndCapture(s, &dummy);
            if (dummy) cudaGraphDestroy(dummy); /* unchecked: discarding the aborted capture */
            if (ce != cudaSuccess && ce != cudaErrorStreamCaptureInvalidated) {
                char first[512];
                snprintf(first, sizeof first, "%s", nib_last_error());
                nib_status cst = nib_cuda_status((int)ce, "cudaStreamEndCapture (aborting the capture)", __FILE__,
                                                 __LINE__);
                if (cst == NIB_ERR_DEVICE_LOST) st = cst;
                else nib_set_error(st, __FILE__, __LINE__, "%s; then ending the capture failed with %s", first,
                                   cudaGetErrorName(ce));
            }
            goto fail;
        }
    }
    NIB_CUDA_TRY(cudaStreamEndCapture(s, &g));
    NIB_CUDA_TRY(cudaGraphInstantiate(&ge, g, 0));
    NIB_CUDA_TRY(cudaGraphLaunch(ge, s));
    NIB_CUDA_TRY(cudaStreamSynchronize(s));
    for (int r = 0; r < reps; r++) {
        NIB_CUDA_TRY(cudaEventRecord(e0, s));
        NIB_CUDA_TRY(cudaGraphLaunch(ge, s));
        NIB_CUDA_TRY(cudaEventRecord(e1, s));
        NIB_CUDA_TRY(cudaEventSynchronize(e1));
        float ms = 0.f;
        NIB_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
        t[r] = 1000.0 * ms / calls;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    out->median_us = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    out->min_us = t[0];
    out->max_us = t[reps - 1];
    out->calls = calls;
    out->reps = reps;
fail:
    if (ge) cudaGraphExecDestroy(ge); /* unchecked: cleanup */
    if (g) cudaGraphDestroy(g);       /* unchecked: cleanup */
    if (e0) cudaEventDestroy(e0);     /* unchecked: cleanup */
    if (e1) cudaEventDestroy(e1);     /* unchecked: cleanup */
    if (s) cudaStreamDestroy(s);      /* unchecked: cleanup */
    free(t);
    return st;
}

typedef struct copy_ctx {
    void *src, *dst;
    uint64_t bytes;
} copy_ctx;
static nib_status copy_fn(void *c, int i, void *stream) {
    copy_ctx *x = (copy_ctx *)c;
    (void)i;
    NIB_CUDA_CHECK(cudaMemcpyAsync(x->dst, x->src, x->bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
    return NIB_OK;
}

__global__ void k_fill_random_u32(uint32_t *p, uint64_t n, uint32_t seed, uint32_t mask, uint32_t or_bits) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 0x9E3779B9u ^ seed;
        x ^= x >> 16;
        x *= 0x7feb352du;
        x ^= x >> 15;
        x *= 0x846ca68bu;
        x ^= x >> 16;
        p[i] = (x & mask) | or_bits;
    }
}

nib_status nib_lab_copy_bandwidth(uint64_t bytes, double *gbps) {
    nib_status st = NIB_OK;
    copy_ctx c = {NULL, NULL, bytes};
    nib_lab_timing tm;
    NIB_TRY(nib_dev_malloc(&c.src, bytes, "copy bandwidth source"));
    NIB_TRY(nib_dev_malloc(&c.dst, bytes, "copy bandwidth destination"));
    k_fill_random_u32<<<1024, 256>>>((uint32_t *)c.src, bytes / 4, 1u, 0xFFFFFFFFu, 0);
    NIB_CUDA_TRY(cudaGetLastError());
    NIB_TRY(nib_lab_time_graph(copy_fn, &c, 4, 15, &tm));
    *gbps = 2.0 * (double)bytes / (tm.median_us * 1e3);
fail:
    nib_dev_free(c.src, bytes);
    nib_dev_free(c.dst, bytes);
    return st;
}

typedef struct peak_ctx {
    nib_blas *b;
    int fp8, n;
    void *a, *bb, *d;
    float *sa, *sb;
} peak_ctx;
static nib_status peak_fn(void *c, int i, void *stream) {
    peak_ctx *x = (peak_ctx *)c;
    (void)i;
    /* fp8 with per-token x per-channel scales: the W8A8 mode the engine runs */
    if (x->fp8) return nib_blas_gemm_fp8(x->b, x->bb, x->sb, 1, x->a, x->sa, 1, x->d, x->n, x->n, x->n, stream);
    return nib_blas_gemm_bf16(x->b, x->bb, x->a, x->d, x->n, x->n, x->n, stream);
}

__global__ void k_set_f32(float *p, int64_t n, float v) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) p[i] = v;
}

nib_status nib_lab_peak_tflops(int fp8, int size, double *tflops) {
    nib_status st = NIB_OK;
    peak_ctx c;
    memset(&c, 0, sizeof c);
    c.fp8 = fp8;
    c.n = size;
    uint64_t n2 = (uint64_t)size * size, eb = fp8 ? 1 : 2;
    nib_lab_timing tm;
    NIB_TRY(nib_blas_create(&c.b));
    NIB_TRY(nib_dev_malloc(&c.a, n2 * eb, "peak A"));
    NIB_TRY(nib_dev_malloc(&c.bb, n2 * eb, "peak B"));
    NIB_TRY(nib_dev_malloc(&c.d, n2 * 2, "peak D"));
    NIB_TRY(nib_dev_malloc((void **)&c.sa, (uint64_t)size * 8, "peak scales"));
    c.sb = c.sa + size;
    /* random data (never zeros): bf16 with exponent near 1.0 / e4m3 without NaN codes */
    if (fp8) {
        k_fill_random_u32<<<1024, 256>>>((uint32_t *)c.a, n2 / 4, 7u, 0xB7B7B7B7u, 0x00000000u);
        k_fill_random_u32<<<1024, 256>>>((uint32_t *)c.bb, n2 / 4, 9u, 0xB7B7B7B7u, 0x00000000u);
    } else {
        k_fill_random_u32<<<1024, 256>>>((uint32_t *)c.a, n2 / 2, 7u, 0x807F807Fu, 0x3F003F00u);
        k_fill_random_u32<<<1024, 256>>>((uint32_t *)c.bb, n2 / 2, 9u, 0x807F807Fu, 0x3F003F00u);
    }
    k_set_f32<<<64, 256>>>(c.sa, (int64_t)size * 2, 1.0f);
    NIB_CUDA_TRY(cudaGetLastError());
    NIB_TRY(nib_lab_time_graph(peak_fn, &c, 5, 7, &tm));
    *tflops = 2.0 * (double)size * size * size / (tm.median_us * 1e6);
fail:
    nib_dev_free(c.a, n2 * eb);
    nib_dev_free(c.bb, n2 * eb);
    nib_dev_free(c.d, n2 * 2);
    nib_dev_free(c.sa, (uint64_t)size * 8);
    nib_blas_free(c.b);
    return st;
}
