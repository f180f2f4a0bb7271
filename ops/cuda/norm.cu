/* norm.cu — RMSNorm / LayerNorm / adaRMSNorm (ops/norm.h) on bf16 rows, with the optional
 * fused residual add (h = x + residual, stored bf16) and the optional FP8 output (e4m3 codes +
 * per-row fp32 scale), fp32 math in exactly the order of the reference (ops/ref/norm.c).
 *
 * Layout: one CTA per row; thread i owns the 16-byte chunks i, i + T, ... (8 bf16 columns
 * each, V <= 4 chunks per thread, T = min(256, dim/8 rounded up to 32) threads), loaded and
 * stored as 16-byte vectors and kept in registers between the passes. Statistics are fp64
 * (warp xor-shuffle tree, then a fixed-order sum of the per-warp partials, so results are
 * deterministic); the per-column parameters are fetched before the reduction so their latency
 * hides behind it. The amax for the FP8 scale is a float max (order-independent, exact).
 * Every fp32 operation is an explicit __f*_rn intrinsic: nvcc never contracts them into FMAs,
 * so the GPU performs the reference's operations one for one (see ops/norm.h on why the fp64
 * sums make the statistic agree too).
 * Variants: V = 1..4 chunks per thread (dim <= 2048: V = 1); at V = 1 a lean instantiation per kind,
 * residual and FP8 output (NIB_NORM_LEAN). Valid rows come from a device int (CTAs of rows >= *n_valid
 * exit at once).
 * Tested by tests/test_ops_gpu.c (`nib_tests ops_gpu_norm`), timed by `nib bench ops`.
 */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/fp8_rows.cuh"
#include "ops/cuda/bf16x8.cuh"
#include "ops/cuda/norm_row.cuh"
#include "ops/norm.h"
#include "runtime/cuda_check.h"
#include "runtime/ktrace.cuh"
#include "runtime/launch.cuh"

struct NormParams {
    int kind, dim, nch; /* nch = dim / 8 chunks */
    const int32_t *n_valid;
    float eps;
    double inv_dim; /* 1 / dim when dim is a power of two (then s * inv_dim == s / dim exactly), else 0 */
    const uint16_t *x;
    long long ldx;
    const uint16_t *res;
    long long ldr;
    uint16_t *h; /* h destination (h_out or residual); NULL without a residual */
    long long ldh;
    const float *rg; /* gated residual: h = x * rg + residual; NULL = x + residual */
    const float *pa, *pb; /* RMS: w, -; LAYER: w, b; ADARMS: scale, shift (NULL = absent) */
    uint16_t *y;
    long long ldy;
    uint8_t *yq;
    long long ldq;
    float *ys;
};

template <int V>
__device__ __forceinline__ void norm_body(const NormParams &p) {
    /* The per-column vectors (weights, or Pi0.5's per-step modulations: megabytes in all, so often
     * out of L2 when the call reaches them) into L2 while the previous kernel finishes: hints only,
     * allowed before the wait (runtime/launch.cuh); the first CTA's hints serve every row */
    if (blockIdx.x == 0) {
        const int c = threadIdx.x * 4; /* one 128-byte line = 4 chunks of 8 columns */
        for (int cc = c; cc < p.nch; cc += blockDim.x * 4) {
            if (p.pa) nib::prefetch_l2(p.pa + 8 * cc);
            if (p.pb) nib::prefetch_l2(p.pb + 8 * cc);
            if (p.rg) nib::prefetch_l2(p.rg + 8 * cc);
        }
    }
    NIB_KT(NIB_KT_NORM, NIB_KT_ENTRY);
    nib::pdl_enter(); /* runtime/launch.cuh: before any access or return */
    NIB_KT(NIB_KT_NORM, NIB_KT_WAITED);
    NIB_KT_EXIT_GUARD(NIB_KT_NORM);
    const long long row = blockIdx.x;
    if (p.n_valid && row >= *p.n_valid) return; /* uniform per CTA: before any barrier */
    __shared__ double s_sum[8], s_sq[8];
    __shared__ float s_max[8];
    const int nw = blockDim.x >> 5;
    float v[V][8], pa[V][8], pb[V][8];
    double acc = 0.0;
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int c = threadIdx.x + i * blockDim.x;
#pragma unroll
        for (int k = 0; k < 8; k++) v[i][k] = pa[i][k] = pb[i][k] = 0.f;
        if (c < p.nch) {
            if (p.pa) load8f(p.pa + 8 * c, pa[i]);
            if (p.pb) load8f(p.pb + 8 * c, pb[i]);
            unpack8(ld16(p.x + row * p.ldx + 8 * c), v[i]);
            if (p.res) {
                float r[8];
                unpack8(ld16(p.res + row * p.ldr + 8 * c), r);
                if (p.rg) { /* the previous layer's gated residual, as its GEMM epilogue computes it */
                    float g[8];
                    load8f(p.rg + 8 * c, g);
#pragma unroll
                    for (int k = 0; k < 8; k++) v[i][k] = __fmul_rn(v[i][k], g[k]);
                }
#pragma unroll
                for (int k = 0; k < 8; k++) v[i][k] = __fadd_rn(v[i][k], r[k]);
                const uint4 hu = pack8(v[i]);
                st16(p.h + row * p.ldh + 8 * c, hu);
                unpack8(hu, v[i]); /* normalize the stored (bf16) h */
            }
        }
#pragma unroll
        for (int k = 0; k < 8; k++) /* inactive chunks hold zeros: they add nothing */
            acc += p.kind == NIB_NORM_LAYER ? (double)v[i][k] : (double)v[i][k] * (double)v[i][k];
    }
    const double s = nib::block_sum_f64(acc, s_sum, nw);
    float inv, mu = 0.f;
    if (p.kind == NIB_NORM_LAYER) {
        const double mean = p.inv_dim != 0.0 ? s * p.inv_dim : s / (double)p.dim;
        double acc2 = 0.0;
#pragma unroll
        for (int i = 0; i < V; i++)
            if ((int)(threadIdx.x + i * blockDim.x) < p.nch) {
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const double d = (double)v[i][k] - mean;
                    acc2 += d * d;
                }
            }
        const double s2 = nib::block_sum_f64(acc2, s_sq, nw);
        const double var = p.inv_dim != 0.0 ? s2 * p.inv_dim : s2 / (double)p.dim;
        mu = __double2float_rn(mean);
        inv = __frcp_rn(__fsqrt_rn(__fadd_rn(__double2float_rn(var), p.eps)));
    } else {
        inv = nib::rms_inv(s, p.inv_dim, p.dim, p.eps); /* norm_row.cuh */
    }
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c >= p.nch) continue;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float t;
            if (p.kind == NIB_NORM_LAYER) {
                t = __fmul_rn(__fsub_rn(v[i][k], mu), inv);
                if (p.pa) t = __fmul_rn(t, pa[i][k]);
                if (p.pb) t = __fadd_rn(t, pb[i][k]);
            } else if (p.kind == NIB_NORM_ADARMS) {
                t = nib::adarms_of(v[i][k], inv, pa[i][k], pb[i][k]);
            } else {
                t = __fmul_rn(v[i][k], inv);
                if (p.pa) t = __fmul_rn(t, __fadd_rn(1.0f, pa[i][k]));
            }
            v[i][k] = t;
            amax = fmaxf(amax, fabsf(t));
        }
        if (p.y) st16(p.y + row * p.ldy + 8 * c, pack8(v[i]));
    }
    if (!p.yq) return;
    amax = nib::cta_max(amax, s_max, nw);
    const float sc = nib::fp8_row_scale_of(amax); /* fp8_rows.cuh: formats/ nib_fp8_quantize per row */
    const float rc = nib::fp8_quot_rcp(sc);
    if (threadIdx.x == 0) p.ys[row] = sc;
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c >= p.nch) continue;
        *(uint2 *)(p.yq + row * p.ldq + 8 * c) = nib::fp8_codes8(v[i], sc, rc);
    }
}

/* L: a lean instantiation (NIB_NORM_LEAN) with the kind fixed and the residual / FP8 output paths compiled in
 * only where the launch has them, so the kernel carries no code it does not run (as the low-bit GEMM's lean
 * variants: docs/design.md, "Forty-fourth session"). L = 1 + kind + 3 * residual + 6 * fp8; 0 decides
 * everything at run time. */
#define NORM_LEAN(kind, res, fp8) (1 + (kind) + 3 * (res) + 6 * (fp8))
template <int V, int L = 0>
__global__ void __launch_bounds__(256) k_norm(const NormParams pa) {
    if constexpr (L == 0) {
        norm_body<V>(pa);
    } else { /* the fixed fields as constants the compiler propagates */
        NormParams p = pa;
        p.kind = (L - 1) % 3;
        if constexpr ((L - 1) / 3 % 2 == 0) {
            p.res = nullptr;
            p.rg = nullptr;
            p.h = nullptr;
        }
        if constexpr ((L - 1) / 6 == 0) p.yq = nullptr;
        norm_body<V>(p);
    }
}

/* NIB_NORM_LEAN: 1 (default) the lean instantiations at V = 1 (dim <= 2048: every norm of Pi0.5), 0 never
 * (A/B); -1: another value */
static int norm_lean_env(void) {
    const char *e = getenv("NIB_NORM_LEAN");
    if (!e || !*e || !strcmp(e, "1")) return 1;
    return strcmp(e, "0") ? -1 : 0;
}

template <int L> static cudaError_t launch_norm_lean(dim3 grid, int threads, cudaStream_t s, const NormParams &p) {
    return nib::launch(k_norm<1, L>, grid, dim3(threads), 0, s, p);
}

static cudaError_t launch_norm_v1(dim3 grid, int threads, cudaStream_t s, const NormParams &p) {
    const int res = p.res != nullptr, q = p.yq != nullptr;
#define NORM_CASE(k, r, f) \
    case NORM_LEAN(k, r, f): return launch_norm_lean<NORM_LEAN(k, r, f)>(grid, threads, s, p)
    switch (NORM_LEAN(p.kind, res, q)) {
        NORM_CASE(0, 0, 0); NORM_CASE(1, 0, 0); NORM_CASE(2, 0, 0);
        NORM_CASE(0, 1, 0); NORM_CASE(1, 1, 0); NORM_CASE(2, 1, 0);
        NORM_CASE(0, 0, 1); NORM_CASE(1, 0, 1); NORM_CASE(2, 0, 1);
        NORM_CASE(0, 1, 1); NORM_CASE(1, 1, 1); NORM_CASE(2, 1, 1);
    default: return nib::launch(k_norm<1>, grid, dim3(threads), 0, s, p);
    }
#undef NORM_CASE
}

static bool al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

nib_status nib_cuda_norm(const nib_norm_args *a, void *stream) {
    static const char *who = "norm (cuda)";
    NIB_RETURN_IF_ERR(nib_norm_validate(a, who));
    const char *kn = a->kind == NIB_NORM_RMS ? "rms" : a->kind == NIB_NORM_LAYER ? "layer" : "adarms";
    /* 16-byte vectors: bf16 rows start on 16-byte boundaries, fp32 vectors are 16-byte aligned */
    if (a->ldx % 8 || !al16(a->x) || (a->residual && (a->ldr % 8 || !al16(a->residual))) ||
        (a->h_out && (a->ldh % 8 || !al16(a->h_out))) || (a->y && (a->ldy % 8 || !al16(a->y))))
        return NIB_ERR(NIB_ERR_SHAPE,
                       "%s (%s): bf16 row strides must be multiples of 8 and pointers 16-byte aligned (ldx %lld, "
                       "ldr %lld, ldh %lld, ldy %lld)",
                       who, kn, (long long)a->ldx, (long long)a->ldr, (long long)a->ldh, (long long)a->ldy);
    if (a->y_q && (a->ldq % 8 || ((uintptr_t)a->y_q & 7u)))
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): ldq %lld must be a multiple of 8 and y_q 8-byte aligned", who, kn,
                       (long long)a->ldq);
    const float *pa = a->kind == NIB_NORM_ADARMS ? a->scale : a->w;
    const float *pb = a->kind == NIB_NORM_ADARMS ? a->shift : a->b;
    if ((pa && !al16(pa)) || (pb && !al16(pb)) || (a->res_gate && !al16(a->res_gate)))
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): fp32 parameter vectors must be 16-byte aligned", who, kn);
    if (a->rows == 0) return NIB_OK;

    NormParams p;
    p.kind = (int)a->kind;
    p.dim = (int)a->dim;
    p.nch = (int)(a->dim / 8);
    p.inv_dim = (a->dim & (a->dim - 1)) == 0 ? 1.0 / (double)a->dim : 0.0;
    p.n_valid = a->n_valid;
    p.eps = a->eps;
    p.x = (const uint16_t *)a->x;
    p.ldx = a->ldx;
    p.res = (const uint16_t *)a->residual;
    p.ldr = a->ldr;
    p.h = a->residual ? (uint16_t *)(a->h_out ? a->h_out : a->residual) : NULL;
    p.ldh = a->h_out ? a->ldh : a->ldr;
    p.rg = a->residual ? a->res_gate : NULL;
    p.pa = pa;
    p.pb = pb;
    p.y = (uint16_t *)a->y;
    p.ldy = a->ldy;
    p.yq = a->y_q;
    p.ldq = a->ldq;
    p.ys = a->y_scale;

    int threads = (p.nch + 31) / 32 * 32;
    if (threads > 256) threads = 256;
    const int v = (p.nch + threads - 1) / threads; /* 1..4 for dim <= 8192 */
    const dim3 grid((unsigned)a->rows);
    cudaStream_t s = (cudaStream_t)stream;
    const int lean = norm_lean_env();
    if (lean < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_NORM_LEAN=%s: 1 (the lean norm kernels, the default) or 0 (never)",
                       getenv("NIB_NORM_LEAN"));
    switch (v) {
    case 1:
        if (lean) NIB_CUDA_CHECK(launch_norm_v1(grid, threads, s, p));
        else NIB_CUDA_CHECK(nib::launch(k_norm<1>, dim3(grid), dim3(threads), 0, s, p));
        break;
    case 2: NIB_CUDA_CHECK(nib::launch(k_norm<2>, dim3(grid), dim3(threads), 0, s, p)); break;
    case 3: NIB_CUDA_CHECK(nib::launch(k_norm<3>, dim3(grid), dim3(threads), 0, s, p)); break;
    default: NIB_CUDA_CHECK(nib::launch(k_norm<4>, dim3(grid), dim3(threads), 0, s, p)); break;
    }
    NIB_LAUNCH_CHECK("k_norm");
    return NIB_OK;
}

NIB_KTRACE_UNIT(norm)
