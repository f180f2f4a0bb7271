/* blas.cu — cuBLASLt baselines (bf16 GEMM) and the FP8 W8A8 GEMM used for the compute-bound
 * prefix / vision shapes, plus the bf16 -> e4m3 per-token activation quantizer it needs.
 *
 * Row-major Y[M,N] = X[M,K] · W[N,K]ᵀ is column-major Yᵀ[N,M] = op(W)·X with op = transpose:
 * A = W (K-major, "T"), B = X (K-major, "N"), D = Y with leading dimension N. FP8 requires
 * exactly this TN form. Per-channel weight / per-token activation scales use cuBLASLt's
 * OUTER_VEC_32F scale mode (scale_A[n] * scale_B[m] multiplies D[n, m]).
 * Tested by tests/test_gemm_gpu.c (blas_*), timed by `nib bench gemm`.
 */
#include <cfloat>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <string.h>

#include "ops/gemm.h"
#include "runtime/cuda_check.h"
#include "runtime/device.h"

#define NIB_BLAS_WS_BYTES (32u << 20)
#define NIB_BLAS_CACHE 64

static nib_status blas_status(cublasStatus_t s, const char *what, const char *file, int line) {
    return nib_set_error(s == CUBLAS_STATUS_ALLOC_FAILED ? NIB_ERR_DEVICE_OOM : NIB_ERR_CUDA, file, line,
                         "%s failed with cuBLAS status %d (%s)", what, (int)s, cublasLtGetStatusString(s));
}
#define NIB_BLAS_CHECK(call)                                                                  \
    do {                                                                                      \
        cublasStatus_t nib_bs_ = (call);                                                      \
        if (nib_bs_ != CUBLAS_STATUS_SUCCESS) return blas_status(nib_bs_, #call, __FILE__, __LINE__); \
    } while (0)

typedef struct blas_plan {
    int used;
    int kind; /* 0 bf16, 1 fp8 */
    int64_t m, n, k;
    int sx_vec, sw_vec;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} blas_plan;

struct nib_blas {
    cublasLtHandle_t lt;
    void *ws;
    blas_plan cache[NIB_BLAS_CACHE];
    int next;
};

nib_status nib_blas_create(nib_blas **out) {
    *out = NULL;
    NIB_RETURN_IF_ERR(nib_device_require(NULL));
    nib_blas *b = (nib_blas *)calloc(1, sizeof *b);
    if (!b) return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "nib_blas_create: host allocation");
    cublasStatus_t s = cublasLtCreate(&b->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(b);
        return blas_status(s, "cublasLtCreate", __FILE__, __LINE__);
    }
    nib_status st = nib_dev_malloc(&b->ws, NIB_BLAS_WS_BYTES, "cuBLASLt workspace");
    if (st) {
        cublasLtDestroy(b->lt);
        free(b);
        return st;
    }
    *out = b;
    return NIB_OK;
}

static void plan_release(blas_plan *p) {
    if (!p->used) return;
    cublasLtMatmulDescDestroy(p->op);
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof *p);
}

void nib_blas_free(nib_blas *b) {
    if (!b) return;
    for (int i = 0; i < NIB_BLAS_CACHE; i++) plan_release(&b->cache[i]);
    nib_dev_free(b->ws, NIB_BLAS_WS_BYTES);
    cublasLtDestroy(b->lt);
    free(b);
}

/* sx/sw: the scale pointers of the first call. They are set before the heuristic runs: an
 * FP8 algorithm chosen without scale pointers is not valid once they are set (cuBLASLt then
 * answers NOT_SUPPORTED), and OUTER_VEC mode without pointers is rejected outright. */
static nib_status plan_get(nib_blas *b, int kind, int64_t m, int64_t n, int64_t k, int sx_vec,
                           int sw_vec, const float *sx, const float *sw, blas_plan **out) {
    for (int i = 0; i < NIB_BLAS_CACHE; i++) {
        blas_plan *p = &b->cache[i];
        if (p->used && p->kind == kind && p->m == m && p->n == n && p->k == k && p->sx_vec == sx_vec &&
            p->sw_vec == sw_vec) {
            *out = p;
            return NIB_OK;
        }
    }
    blas_plan *p = &b->cache[b->next];
    b->next = (b->next + 1) % NIB_BLAS_CACHE;
    plan_release(p);
    cudaDataType_t ab = kind ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    NIB_BLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (kind) {
        /* scalar scales: leave the mode attributes at their default (setting SCALAR_32F
         * explicitly made cuBLASLt 13 answer NOT_SUPPORTED at matmul time on H100) */
        int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if (sw_vec)
            NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec));
        if (sx_vec)
            NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec));
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx));
    }
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, (uint64_t)k, (uint64_t)n, k));
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, (uint64_t)k, (uint64_t)m, k));
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_16BF, (uint64_t)n, (uint64_t)m, n));
    cublasLtMatmulPreference_t pref;
    NIB_BLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = NIB_BLAS_WS_BYTES;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(b->lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    p->used = 1; /* so plan_release frees the descriptors on the error paths too */
    if (s != CUBLAS_STATUS_SUCCESS) return blas_status(s, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    if (!found)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "cuBLASLt has no %s algorithm for M=%lld N=%lld K=%lld",
                       kind ? "fp8" : "bf16", (long long)m, (long long)n, (long long)k);
    p->algo = res.algo;
    p->kind = kind;
    p->m = m;
    p->n = n;
    p->k = k;
    p->sx_vec = sx_vec;
    p->sw_vec = sw_vec;
    *out = p;
    return NIB_OK;
}

nib_status nib_blas_gemm_bf16(nib_blas *b, const void *x, const void *w, void *y, int64_t m, int64_t n,
                              int64_t k, void *stream) {
    blas_plan *p;
    NIB_RETURN_IF_ERR(plan_get(b, 0, m, n, k, 0, 0, NULL, NULL, &p));
    float alpha = 1.f, beta = 0.f;
    NIB_BLAS_CHECK(cublasLtMatmul(b->lt, p->op, &alpha, w, p->a, x, p->b, &beta, y, p->d, y, p->d, &p->algo,
                                  b->ws, NIB_BLAS_WS_BYTES, (cudaStream_t)stream));
    return NIB_OK;
}

nib_status nib_blas_gemm_fp8(nib_blas *b, const void *xq, const float *sx, int sx_per_token, const void *wq,
                             const float *sw, int sw_per_channel, void *y, int64_t m, int64_t n, int64_t k,
                             void *stream) {
    if (k % 16 || n % 16)
        return NIB_ERR(NIB_ERR_SHAPE, "fp8 gemm: cuBLASLt FP8 needs K and N multiples of 16 (K=%lld N=%lld)",
                       (long long)k, (long long)n);
    blas_plan *p;
    if (!sx || !sw) return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 gemm: NULL scale pointer");
    NIB_RETURN_IF_ERR(plan_get(b, 1, m, n, k, sx_per_token, sw_per_channel, sx, sw, &p));
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx));
    float alpha = 1.f, beta = 0.f;
    NIB_BLAS_CHECK(cublasLtMatmul(b->lt, p->op, &alpha, wq, p->a, xq, p->b, &beta, y, p->d, y, p->d, &p->algo,
                                  b->ws, NIB_BLAS_WS_BYTES, (cudaStream_t)stream));
    return NIB_OK;
}

/* Per-token FP8 activation quantization, exactly formats/ nib_fp8_quantize on each row:
 * scale = amax/448 (1 for an all-zero row, at least FLT_MIN), code = satfinite e4m3(x / scale).
 * One CTA per row. Vector path (K % 8 == 0, 16-byte aligned rows): each thread keeps up to VMAX
 * 16-byte chunks in registers, so the row is read once. */
__device__ __forceinline__ float fp8_row_scale(float amax) {
    if (amax == 0.f) return 1.f;
    float s = amax / 448.f;
    return s < FLT_MIN ? FLT_MIN : s;
}

__device__ __forceinline__ float block_max_256(float v, float *red) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (threadIdx.x == 0) red[32] = v;
    }
    __syncthreads();
    return red[32];
}

template <int VMAX>
__global__ void __launch_bounds__(256) k_quant_fp8_rows_vec(const __nv_bfloat16 *x, int64_t k, uint8_t *xq,
                                                             float *scales) {
    __shared__ float red[33];
    const uint4 *row = (const uint4 *)(x + blockIdx.x * k);
    uint2 *qrow = (uint2 *)(xq + blockIdx.x * k);
    const int nc = (int)(k / 8);
    uint4 v[VMAX];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < VMAX; j++) {
        int c = threadIdx.x + j * 256;
        if (c < nc) {
            v[j] = row[c];
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v[j];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 f = __bfloat1622float2(h[e]);
                amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
            }
        }
    }
    const float sc = fp8_row_scale(block_max_256(amax, red));
    if (threadIdx.x == 0) scales[blockIdx.x] = sc;
#pragma unroll
    for (int j = 0; j < VMAX; j++) {
        int c = threadIdx.x + j * 256;
        if (c < nc) {
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v[j];
            uint32_t w[2] = {0, 0};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 f = __bfloat1622float2(h[e]);
                __nv_fp8x2_e4m3 q(make_float2(__fdiv_rn(f.x, sc), __fdiv_rn(f.y, sc))); /* satfinite, RNE */
                w[e >> 1] |= (uint32_t)(*(const uint16_t *)&q) << (16 * (e & 1));
            }
            qrow[c] = make_uint2(w[0], w[1]);
        }
    }
}

/* scalar fallback (any K, any alignment) and the per-tensor quantization pass */
__global__ void k_quant_fp8_rows(const __nv_bfloat16 *x, int64_t k, __nv_fp8_e4m3 *xq, float *scales,
                                 int per_token, float tensor_scale_inv) {
    __shared__ float red[33];
    const __nv_bfloat16 *row = x + blockIdx.x * k;
    __nv_fp8_e4m3 *qrow = xq + blockIdx.x * k;
    if (per_token) {
        float amax = 0.f;
        for (int64_t i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(__bfloat162float(row[i])));
        const float sc = fp8_row_scale(block_max_256(amax, red));
        if (threadIdx.x == 0) scales[blockIdx.x] = sc;
        for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
            qrow[i] = __nv_fp8_e4m3(__fdiv_rn(__bfloat162float(row[i]), sc)); /* satfinite conversion */
    } else {
        for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
            qrow[i] = __nv_fp8_e4m3(__bfloat162float(row[i]) * tensor_scale_inv);
    }
}

/* per-tensor: scale from the amax of the whole matrix (two passes) */
__global__ void k_amax(const __nv_bfloat16 *x, int64_t n, unsigned int *amax_bits) {
    float a = 0.f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a = fmaxf(a, fabsf(__bfloat162float(x[i])));
    for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, __float_as_uint(a));
}
__global__ void k_tensor_scale(unsigned int *amax_bits, float *scale) {
    float a = __uint_as_float(*amax_bits);
    *scale = a > 0.f ? a / 448.f : 1.f;
    *amax_bits = 0;
}
__global__ void k_quant_fp8_tensor(const __nv_bfloat16 *x, int64_t n, const float *scale, __nv_fp8_e4m3 *xq) {
    float inv = 1.f / *scale;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        xq[i] = __nv_fp8_e4m3(__bfloat162float(x[i]) * inv);
}

nib_status nib_cuda_quantize_fp8_rows(const void *x, int64_t m, int64_t k, int per_token, void *xq,
                                      float *scales, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (per_token) {
        const int64_t nc = k / 8, vm = (nc + 255) / 256;
        const int vec = k % 8 == 0 && ((uintptr_t)x | (uintptr_t)xq) % 16 == 0 && vm <= 8;
        const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
        if (vec && vm <= 1) k_quant_fp8_rows_vec<1><<<(unsigned)m, 256, 0, s>>>(xb, k, (uint8_t *)xq, scales);
        else if (vec && vm <= 2) k_quant_fp8_rows_vec<2><<<(unsigned)m, 256, 0, s>>>(xb, k, (uint8_t *)xq, scales);
        else if (vec && vm <= 4) k_quant_fp8_rows_vec<4><<<(unsigned)m, 256, 0, s>>>(xb, k, (uint8_t *)xq, scales);
        else if (vec) k_quant_fp8_rows_vec<8><<<(unsigned)m, 256, 0, s>>>(xb, k, (uint8_t *)xq, scales);
        else k_quant_fp8_rows<<<(unsigned)m, 256, 0, s>>>(xb, k, (__nv_fp8_e4m3 *)xq, scales, 1, 1.f);
        NIB_LAUNCH_CHECK("k_quant_fp8_rows");
        return NIB_OK;
    }
    /* scales must have room for 2 floats: [0] the scale, [1] scratch for the amax reduction */
    unsigned int *amax = (unsigned int *)(scales + 1);
    int64_t n = m * k;
    NIB_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(unsigned int), s));
    k_amax<<<264, 256, 0, s>>>((const __nv_bfloat16 *)x, n, amax);
    NIB_LAUNCH_CHECK("k_amax");
    k_tensor_scale<<<1, 1, 0, s>>>(amax, scales);
    NIB_LAUNCH_CHECK("k_tensor_scale");
    k_quant_fp8_tensor<<<264, 256, 0, s>>>((const __nv_bfloat16 *)x, n, scales, (__nv_fp8_e4m3 *)xq);
    NIB_LAUNCH_CHECK("k_quant_fp8_tensor");
    return NIB_OK;
}
