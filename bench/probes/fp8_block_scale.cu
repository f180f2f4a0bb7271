/* fp8_block_scale.cu — is cuBLASLt's block-scaled FP8 product (one fp32 scale per 128 values along K:
 * CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, or one per 128 x 128 block of W: BLK128x128_32F) as fast on
 * H100 as the per-token / per-channel product nib runs now (OUTER_VEC_32F with FAST_ACCUM) at the
 * Pi0.5 prefix and SigLIP shapes?
 *
 * The question behind it: the fast preset quantizes each activation that feeds an FP8 product in a
 * kernel of its own (Gemma's h 10.9 us and o 3.8 us a layer, SigLIP's GELU + FP8 7.7 us and o 3.5 us:
 * bench/results/pi05-kernels-h100-ef5f1e7.json), because a per-token scale needs the amax of a whole
 * row, which the producing kernel's CTAs each see a part of. With one scale per 128 values of a row,
 * the producer (a GEMM epilogue whose tile spans 128 output columns, or the attention's 128-dim half
 * of a 256-dim head) could write the FP8 codes and scales itself, and the kernel would go. That only
 * pays if the consumer's product with block scales costs about what the per-token product costs.
 *
 * For each shape (M, K -> N): X[M,K] and W[N,K] random E4M3 codes, random positive scales; D = X W^T
 * in bf16 with a residual C (beta = 1), as the model's o / down / fc2 products are. Modes:
 *   outer      W per channel, X per token (OUTER_VEC), fast accumulation: what nib runs now
 *   outer-acc  the same with promotion (FAST_ACCUM off)
 *   vec        W and X VEC128
 *   blk        W BLK128x128, X VEC128
 * First, on one shape whose K / 128 is odd, the scale layouts are found by comparing against a naive fp32
 * product under each candidate layout (X's scales [K/128][ld] with the rows fastest, ld = M or M rounded up
 * to 4, or [M][K/128]; W's [K/128][N], [N][K/128], or either with the inner count rounded up to 4; blocks the
 * same with N / 128 rows): the probe prints each candidate's worst error relative to the sum of |terms|.
 * (The first run, bench/results/fp8-block-scale-h100.json, searched on M = 530, which cuBLASLt refuses for
 * the block modes, so its vec layout was never found; its timings stand.) Then every heuristic candidate (up to 8)
 * of every mode is timed: median of 31 runs of 20 back-to-back products, W rotated over copies that
 * overflow the 50 MB L2. One JSON object per (shape, mode) with the first candidate's and the best
 * candidate's us and TFLOP/s.
 *
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/fp8_block_scale \
 *        bench/probes/fp8_block_scale.cu -lcublasLt && /tmp/fp8_block_scale
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "probe.cuh"

#define NIB_BLAS_CHECK(x)                                                                                         \
    do {                                                                                              \
        cublasStatus_t s_ = (x);                                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasLtGetStatusString(s_)); \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

enum { OUTER = 0, OUTER_ACC = 1, VEC = 2, BLK = 3, NMODES = 4 };
static const char *mode_name[NMODES] = {"outer", "outer-acc", "vec", "blk"};

static __device__ uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}
/* E4M3 codes of values in [-2, 2] */
__global__ void k_fill_codes(__nv_fp8_e4m3 *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __nv_fp8_e4m3((float)(hash32((uint32_t)i * 2654435761u ^ seed) & 0xFFFF) / 16384.0f - 2.0f);
}
/* positive scales in [0.25, 2) */
__global__ void k_fill_scales(float *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = 0.25f + (float)(hash32((uint32_t)i ^ seed) & 0xFFFF) / 37449.0f;
}
__global__ void k_fill_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16((float)(hash32((uint32_t)i ^ seed) & 0xFFFF) / 32768.0f - 1.0f);
}

/* the candidate layouts: X (a = activation) and W scale index functions */
struct Lay {
    /* xl: 0 [kb][M], 1 [kb][round4(M)], 2 [m][KB]; wl (vec): 0 [kb][N], 1 [n][KB], 2 [kb][round4(N)], 3 [n][round4(KB)];
     * (blk): the same with NB = N / 128 blocks for N */
    int xl, wl;
};
__device__ __forceinline__ float xscale(const float *s, int xl, int m, int kb, int M, int KB) {
    const int ld4 = (M + 3) / 4 * 4;
    return xl == 0 ? s[(size_t)kb * M + m] : xl == 1 ? s[(size_t)kb * ld4 + m] : s[(size_t)m * KB + kb];
}
/* naive reference: one thread per output; err = |gpu - ref| / (sum |terms| + |c|) */
__global__ void k_ref(const __nv_fp8_e4m3 *x, const __nv_fp8_e4m3 *w, const float *sx, const float *sw,
                      const __nv_bfloat16 *c, const __nv_bfloat16 *d, int M, int N, int K, int mode, Lay lay,
                      float *err) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N) return;
    const int KB = (K + 127) / 128, NB = (N + 127) / 128;
    double acc = 0, mag = 0;
    for (int kb = 0; kb < KB; kb++) {
        double part = 0, pmag = 0;
        for (int k = kb * 128; k < K && k < kb * 128 + 128; k++) {
            const double p = (double)(float)x[(size_t)m * K + k] * (double)(float)w[(size_t)n * K + k];
            part += p;
            pmag += fabs(p);
        }
        double s;
        if (mode == VEC || mode == BLK) {
            const float a = xscale(sx, lay.xl, m, kb, M, KB);
            const int r = mode == VEC ? n : n / 128, R = mode == VEC ? N : NB; /* the scale's row and row count */
            const int R4 = (R + 3) / 4 * 4, KB4 = (KB + 3) / 4 * 4;
            const float b = lay.wl == 0   ? sw[(size_t)kb * R + r]
                            : lay.wl == 1 ? sw[(size_t)r * KB + kb]
                            : lay.wl == 2 ? sw[(size_t)kb * R4 + r]
                                          : sw[(size_t)r * KB4 + kb];
            s = (double)a * b;
        } else {
            s = (double)sx[m] * sw[n];
        }
        acc += part * s;
        mag += pmag * s;
    }
    const double cv = __bfloat162float(c[(size_t)m * N + n]);
    const double e = fabs((double)__bfloat162float(d[(size_t)m * N + n]) - (acc + cv)) / (mag + fabs(cv) + 1e-30);
    atomicMax((int *)err, __float_as_int((float)e)); /* e >= 0: int order is float order */
}

struct Prod {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasLtMatmulHeuristicResult_t res[8];
    int found;
};

static void prod_make(cublasLtHandle_t lt, Prod *p, int mode, int M, int N, int K, const float *sx, const float *sw,
                      size_t ws_bytes) {
    NIB_BLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    int32_t am, bm;
    if (mode == OUTER || mode == OUTER_ACC) am = bm = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    else if (mode == VEC) am = bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    else am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx));
    if (mode == OUTER) {
        const int8_t fa = 1;
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
    }
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, K, N, K));
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, K, M, K));
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, N, M, N));
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    NIB_BLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = ws_bytes;
    NIB_BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    p->found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->a, p->b, p->c, p->d, pref, 8, p->res, &p->found);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "heuristic mode %s M %d K %d N %d: %s\n", mode_name[mode], M, K, N, cublasLtGetStatusString(s));
        p->found = 0;
    }
    cublasLtMatmulPreferenceDestroy(pref); /* unchecked: cleanup */
}
static void prod_free(Prod *p) {
    cublasLtMatmulDescDestroy(p->op); /* unchecked: cleanup */
    cublasLtMatrixLayoutDestroy(p->a); /* unchecked: cleanup */
    cublasLtMatrixLayoutDestroy(p->b); /* unchecked: cleanup */
    cublasLtMatrixLayoutDestroy(p->c); /* unchecked: cleanup */
    cublasLtMatrixLayoutDestroy(p->d); /* unchecked: cleanup */
}
static cublasStatus_t prod_run(cublasLtHandle_t lt, Prod *p, int cand, const void *w, const void *x, const void *c,
                               void *d, void *ws, size_t wsb, cudaStream_t s) {
    const float alpha = 1.0f, beta = 1.0f;
    return cublasLtMatmul(lt, p->op, &alpha, w, p->a, x, p->b, &beta, c, p->c, d, p->d, &p->res[cand].algo, ws, /* unchecked: returned */
                          p->res[cand].workspaceSize, s);
}

static uint32_t tile_of(const cublasLtMatmulAlgo_t *a) {
    uint32_t v = 0;
    size_t wr = 0;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &v, sizeof v, &wr); /* unchecked: 0 if absent */
    return v;
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    cublasLtHandle_t lt;
    NIB_BLAS_CHECK(cublasLtCreate(&lt));
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    const size_t wsb = 32u << 20;
    void *ws;
    CHECK(cudaMalloc(&ws, wsb));
    /* shapes: M, K, N, name */
    struct Shape {
        int m, k, n;
        const char *name;
    } shapes[] = {
        {532, 1152, 1152, "layout check (K / 128 = 9: padded layouts differ)"}, /* M = 530: vec / blk refused */
        {532, 16384, 2048, "gemma down, 2 cameras"},
        {276, 16384, 2048, "gemma down, 1 camera"},
        {788, 16384, 2048, "gemma down, 3 cameras"},
        {532, 2048, 2048, "gemma o"},
        {512, 4352, 1152, "siglip fc2 (K padded to 4352)"},
        {512, 1152, 1152, "siglip o"},
        {512, 1152, 4352, "siglip fc1 shape"},
    };
    const int nshapes = sizeof shapes / sizeof shapes[0];
    Lay best_vec = {1, 1}, best_blk = {1, 1};
    for (int si = 0; si < nshapes; si++) {
        const int M = shapes[si].m, K = shapes[si].k, N = shapes[si].n;
        const int KB = (K + 127) / 128, M4 = (M + 3) / 4 * 4;
        const size_t wbytes = (size_t)N * K;
        const int copies = (int)std::min<size_t>(8, std::max<size_t>(1, (120u << 20) / wbytes + 1));
        __nv_fp8_e4m3 *x, *w;
        float *sx, *sw, *err;
        __nv_bfloat16 *c, *d;
        CHECK(cudaMalloc(&x, (size_t)M * K));
        CHECK(cudaMalloc(&w, wbytes * copies));
        const size_t nsx = (size_t)std::max(M4, M) * KB + M4, nsw = (size_t)(N + 3) * (KB + 3) + 64;
        CHECK(cudaMalloc(&sx, nsx * sizeof(float)));
        CHECK(cudaMalloc(&sw, nsw * sizeof(float)));
        CHECK(cudaMalloc(&c, (size_t)M * N * 2));
        CHECK(cudaMalloc(&d, (size_t)M * N * 2));
        CHECK(cudaMalloc(&err, sizeof(float)));
        k_fill_codes<<<256, 256>>>(x, (size_t)M * K, 11u + si);
        k_fill_codes<<<1024, 256>>>(w, wbytes * copies, 12u + si);
        k_fill_scales<<<256, 256>>>(sx, nsx, 13u + si);
        k_fill_scales<<<256, 256>>>(sw, nsw, 14u + si);
        k_fill_bf16<<<256, 256>>>(c, (size_t)M * N, 15u + si);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        for (int mode = 0; mode < NMODES; mode++) {
            Prod p;
            prod_make(lt, &p, mode, M, N, K, sx, sw, wsb);
            if (!p.found) {
                printf("{\"shape\": \"%s\", \"m\": %d, \"k\": %d, \"n\": %d, \"mode\": \"%s\", \"supported\": false}\n",
                       shapes[si].name, M, K, N, mode_name[mode]);
                prod_free(&p);
                continue;
            }
            /* correctness of candidate 0 (first shape: every layout hypothesis; later: the one found) */
            cublasStatus_t rs = prod_run(lt, &p, 0, w, x, c, d, ws, wsb, st);
            CHECK(cudaStreamSynchronize(st));
            float worst = -1;
            char lay_txt[256] = "";
            if (rs != CUBLAS_STATUS_SUCCESS) {
                printf("{\"shape\": \"%s\", \"mode\": \"%s\", \"run\": \"%s\"}\n", shapes[si].name, mode_name[mode],
                       cublasLtGetStatusString(rs));
                prod_free(&p);
                continue;
            }
            const int nx = (mode == VEC || mode == BLK) ? 3 : 1, nw = (mode == VEC || mode == BLK) ? 4 : 1;
            float best_e = 1e30f;
            for (int xl = 0; xl < nx; xl++)
                for (int wl = 0; wl < nw; wl++) {
                    if (si > 0 && mode == VEC && (xl != best_vec.xl || wl != best_vec.wl)) continue;
                    if (si > 0 && mode == BLK && (xl != best_blk.xl || wl != best_blk.wl)) continue;
                    CHECK(cudaMemset(err, 0, sizeof(float)));
                    Lay lay = {xl, wl};
                    k_ref<<<dim3((N + 127) / 128, M), 128>>>(x, w, sx, sw, c, d, M, N, K, mode, lay, err);
                    CHECK(cudaGetLastError());
                    float e;
                    CHECK(cudaMemcpy(&e, err, sizeof e, cudaMemcpyDeviceToHost));
                    size_t l = strlen(lay_txt);
                    snprintf(lay_txt + l, sizeof lay_txt - l, "%s\"x%d w%d\": %.3g", l ? ", " : "", xl, wl, e);
                    if (e < best_e) {
                        best_e = e;
                        if (si == 0 && mode == VEC) best_vec = lay;
                        if (si == 0 && mode == BLK) best_blk = lay;
                    }
                }
            worst = best_e;
            /* timing of every candidate */
            double first_us = -1, best_us = 1e30;
            int best_c = -1;
            for (int cand = 0; cand < p.found; cand++) {
                if (prod_run(lt, &p, cand, w, x, c, d, ws, wsb, st) != CUBLAS_STATUS_SUCCESS) continue;
                CHECK(cudaStreamSynchronize(st));
                const int reps = 20;
                const double ms = probe_median_ms(32, [&](int r) {
                    for (int i = 0; i < reps; i++)
                        prod_run(lt, &p, cand, (const uint8_t *)w + wbytes * ((r * reps + i) % copies), x, c, d, ws,
                                 wsb, 0);
                });
                const double us = ms * 1000.0 / reps;
                if (cand == 0) first_us = us;
                if (us < best_us) best_us = us, best_c = cand;
            }
            const double fl = 2.0 * M * N * K;
            printf("{\"shape\": \"%s\", \"m\": %d, \"k\": %d, \"n\": %d, \"mode\": \"%s\", \"candidates\": %d, "
                   "\"first_us\": %.2f, \"first_tflops\": %.0f, \"best_us\": %.2f, \"best_tflops\": %.0f, "
                   "\"best_candidate\": %d, \"best_tile_id\": %u, \"max_rel_err\": %.3g, \"layouts\": {%s}}\n",
                   shapes[si].name, M, K, N, mode_name[mode], p.found, first_us, fl / first_us * 1e-6, best_us,
                   fl / best_us * 1e-6, best_c, tile_of(&p.res[best_c < 0 ? 0 : best_c].algo), worst, lay_txt);
            fflush(stdout);
            prod_free(&p);
        }
        CHECK(cudaFree(x));
        CHECK(cudaFree(w));
        CHECK(cudaFree(sx));
        CHECK(cudaFree(sw));
        CHECK(cudaFree(c));
        CHECK(cudaFree(d));
        CHECK(cudaFree(err));
    }
    printf("{\"layout_vec\": \"x%d w%d\", \"layout_blk\": \"x%d w%d\"}\n", best_vec.xl, best_vec.wl, best_blk.xl,
           best_blk.wl);
    return 0;
}
