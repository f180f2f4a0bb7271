/* act.cu — GeGLU-tanh / SwiGLU / GELU-tanh (ops/act.h) on bf16 rows, fp32 math in exactly the
 * order of the reference (ops/ref/act.c; explicit __f*_rn intrinsics, never contracted to
 * FMAs); tanhf / expf are CUDA's (within 2 ulp), the only difference from the reference.
 *
 * Layout: gated input [rows][ldx] = gate columns [0, H) | up columns [H, 2H); output
 * [rows][ldy] columns [0, H). Each thread produces one 16-byte chunk of 8 outputs from one
 * 16-byte gate chunk and one 16-byte up chunk; CTAs of 128 threads tile a row (grid = rows x
 * ceil(H / 8 / 128), flattened into x). In place (y == x) is safe: a thread reads its gate and
 * up chunks before writing the output chunk that overlaps only its own gate chunk.
 * FP8 output only (y_q, no y): GELU / GeGLU with the hardware tanh (gelu.cuh gelu_tanh_approx; ops/act.h;
 * NIB_FAST_TANH=0: tanhf). FP8 output (y_q): a row per CTA of up to 512 threads (per cluster of 2..8 such CTAs beyond
 * H = 16384; see k_act_q), each thread keeps its (up to 4) chunks in registers, so the row max
 * and the codes come from one read of the input (fp8_rows.cuh).
 * Tested by tests/test_ops_gpu.c (`nib_tests ops_gpu_act`), timed by `nib bench ops`.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/act.h"
#include "ops/cuda/bf16x8.cuh"
#include "ops/cuda/cluster.cuh"
#include "ops/cuda/fp8_rows.cuh"
#include "ops/cuda/gelu.cuh"
#include "runtime/cuda_check.h"
#include "runtime/launch.cuh"

#define ACT_THREADS 128

struct ActParams {
    int kind, nch, cblocks; /* nch = H / 8 chunks per row; cblocks = CTAs per row */
    int cl_shift;           /* FP8 output: log2 of the CTAs (cluster) per row */
    int fast;               /* FP8 output only (no y): gelu_tanh_approx (gelu.cuh; NIB_FAST_TANH) */
    long long h;
    const int32_t *n_valid;
    const uint16_t *x;
    long long ldx;
    uint16_t *y;
    long long ldy;
    uint8_t *yq;
    long long ldq;
    float *ys;
};


/* g / (1 + exp(-g)) */
static __device__ __forceinline__ float silu_f(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

/* the 8 outputs of one chunk from its gate (or x) and up words (fp32, the reference's arithmetic) */
static __device__ __forceinline__ void act_vals(int kind, uint4 gw, uint4 uw, float (&o)[8], bool fast = false) {
    float g[8];
    unpack8(gw, g);
    if (kind == NIB_ACT_GELU_TANH) {
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = fast ? gelu_tanh_approx(g[k]) : gelu_tanh_f(g[k]);
    } else {
        float u[8];
        unpack8(uw, u);
        if (kind == NIB_ACT_GEGLU_TANH) {
#pragma unroll
            for (int k = 0; k < 8; k++) o[k] = __fmul_rn(fast ? gelu_tanh_approx(g[k]) : gelu_tanh_f(g[k]), u[k]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) o[k] = __fmul_rn(silu_f(g[k]), u[k]);
        }
    }
}

__global__ void __launch_bounds__(ACT_THREADS) k_act(const ActParams p) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    const long long row = blockIdx.x / p.cblocks;
    if (p.n_valid && row >= *p.n_valid) return;
    const int c = (int)(blockIdx.x - row * p.cblocks) * ACT_THREADS + threadIdx.x;
    if (c >= p.nch) return;
    const uint16_t *xr = p.x + row * p.ldx;
    float o[8];
    act_vals(p.kind, *(const uint4 *)(xr + 8 * c),
             p.kind == NIB_ACT_GELU_TANH ? make_uint4(0u, 0u, 0u, 0u) : *(const uint4 *)(xr + p.h + 8 * c), o);
    *(uint4 *)(p.y + row * p.ldy + 8 * c) = pack8(o);
}

/* FP8 output: the row's amax sets its scale, so every value of a row must be known before its
 * first code. A row goes to one CTA of up to 512 threads, each thread keeping V <= 4 chunks in
 * registers (<= 64 registers: 2 CTAs per SM); rows of more than 2048 chunks (16384 < H <= 32768)
 * to a cluster of 2 such CTAs (up to 8 through the lab knob) whose maxima meet through
 * distributed shared memory (max is exact and order-free: every CTA gets the same scale). The block is the fewest warps that
 * cover the row with the fewest chunks per thread (SigLIP's 538 chunks: 288 threads x 2).
 * Measured (`nib bench ops --ops geglu+fp8,gelu+fp8`, H100): the previous kernel (512 threads,
 * up to 8 chunks, no register bound) 25.3 us for 532 x 16384 and 6.5 us for 512 x 4304; four
 * CTAs of 128 threads per row (clusters) 23.5 / 7.6; this layout 22.9 / 6.0.
 * NIB_ACTQ=shift:V:T (lab): force log2 CL, V and T (validated). */
#define ACTQ_VMAX 4
#define ACTQ_TMAX 512
#define ACTQ_CLMAX 8
#define ACTQ_HMAX 32768 /* ops/act.h's bound with y_q (the kernel could take 131072) */

static __device__ __forceinline__ uint32_t actq_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
template <int V>
__global__ void __launch_bounds__(ACTQ_TMAX, 2) k_act_q(const ActParams p) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    __shared__ float s_max[ACTQ_TMAX / 32];
    __shared__ float s_part;
    const int rank = (int)(blockIdx.x & ((1u << p.cl_shift) - 1u));
    const long long row = blockIdx.x >> p.cl_shift;
    /* uniform per cluster (its CTAs share the row): before any barrier */
    if (p.n_valid && row >= *p.n_valid) return;
    const uint16_t *xr = p.x + row * p.ldx;
    const int T = (int)blockDim.x, c0 = rank * (V * T) + (int)threadIdx.x;
    const bool gated = p.kind != NIB_ACT_GELU_TANH;
    uint4 gw[V], uw[V]; /* every load issued before the first use */
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int c = c0 + i * T;
        gw[i] = uw[i] = make_uint4(0u, 0u, 0u, 0u);
        if (c < p.nch) {
            gw[i] = *(const uint4 *)(xr + 8 * c);
            if (gated) uw[i] = *(const uint4 *)(xr + p.h + 8 * c);
        }
    }
    float o[V][8];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int c = c0 + i * T;
        if (c >= p.nch) continue;
        act_vals(p.kind, gw[i], uw[i], o[i], p.fast != 0);
#pragma unroll
        for (int k = 0; k < 8; k++) amax = fmaxf(amax, fabsf(o[i][k]));
        if (p.y) *(uint4 *)(p.y + row * p.ldy + 8 * c) = pack8(o[i]);
    }
    amax = nib::cta_max(amax, s_max, T / 32);
    if (p.cl_shift) { /* the cluster's CTA maxima: exchange, then the row max in every CTA */
        if (threadIdx.x == 0) s_part = amax;
        nib::cluster_sync();
        const uint32_t a = actq_smem_u32(&s_part);
        for (int r = 0; r < (1 << p.cl_shift); r++) amax = fmaxf(amax, nib::ld_cluster_f32(nib::cluster_map(a, (uint32_t)r)));
        nib::cluster_arrive_relaxed(); /* done reading the peers */
    }
    const float sc = nib::fp8_row_scale_of(amax), rc = nib::fp8_quot_rcp(sc);
    if (rank == 0 && threadIdx.x == 0) p.ys[row] = sc;
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int c = c0 + i * T;
        if (c < p.nch) *(uint2 *)(p.yq + row * p.ldq + 8 * c) = nib::fp8_codes8(o[i], sc, rc);
    }
    /* no CTA leaves while a peer may still read its s_part */
    if (p.cl_shift) nib::cluster_wait();
}

nib_status nib_cuda_act(const nib_act_args *a, void *stream) {
    static const char *who = "act (cuda)";
    NIB_RETURN_IF_ERR(nib_act_validate(a, who));
    if (a->ldx % 8 || ((uintptr_t)a->x & 15u) || (a->y && (a->ldy % 8 || ((uintptr_t)a->y & 15u))))
        return NIB_ERR(NIB_ERR_SHAPE, "%s: ldx %lld and ldy %lld must be multiples of 8 and x, y 16-byte aligned", who,
                       (long long)a->ldx, (long long)a->ldy);
    if (a->y_q && (a->ldq % 8 || ((uintptr_t)a->y_q & 7u) || a->h > ACTQ_HMAX))
        return NIB_ERR(NIB_ERR_SHAPE, "%s: FP8 output needs ldq (%lld) a multiple of 8, y_q 8-byte aligned and H (%lld) "
                       "<= %d", who, (long long)a->ldq, (long long)a->h, ACTQ_HMAX);
    if (a->rows == 0) return NIB_OK;
    const int fast = nib_fast_tanh();
    if (fast < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FAST_TANH=%s: 1 (the hardware tanh where the activation goes to FP8 "
                       "only, the default) or 0 (tanhf everywhere)", getenv("NIB_FAST_TANH"));
    ActParams p;
    p.cl_shift = 0;
    p.fast = fast && a->y_q && !a->y;
    p.kind = (int)a->kind;
    p.h = a->h;
    const long long nch = a->h / 8;
    const long long cblocks = a->y_q ? 1 : (nch + ACT_THREADS - 1) / ACT_THREADS;
    if (nch > INT32_MAX || (long long)a->rows * cblocks > INT32_MAX)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: %lld rows x H %lld is too large for one launch", who, (long long)a->rows,
                       (long long)a->h);
    p.nch = (int)nch;
    p.cblocks = (int)cblocks;
    p.n_valid = a->n_valid;
    p.x = (const uint16_t *)a->x;
    p.ldx = a->ldx;
    p.y = (uint16_t *)a->y;
    p.ldy = a->ldy;
    p.yq = a->y_q;
    p.ldq = a->ldq;
    p.ys = a->y_scale;
    cudaStream_t s = (cudaStream_t)stream;
    if (!a->y_q) {
        NIB_CUDA_CHECK(nib::launch(k_act, dim3((unsigned)(a->rows * cblocks)), dim3(ACT_THREADS), 0, s, p));
        NIB_LAUNCH_CHECK("k_act");
        return NIB_OK;
    }
    /* the fewest CTAs per row (a power of 2), then the fewest chunks per thread, then the fewest warps */
    int shift = 0;
    while ((1 << shift) < ACTQ_CLMAX && nch > (long long)ACTQ_TMAX * ACTQ_VMAX << shift) shift++;
    const long long per_cta = (nch + (1 << shift) - 1) >> shift;
    long long per = (per_cta + ACTQ_TMAX - 1) / ACTQ_TMAX; /* 1..4 (H checked) */
    int T = (int)((per_cta + per - 1) / per + 31) / 32 * 32;
    const char *ke = getenv("NIB_ACTQ"); /* lab: shift:V:T */
    if (ke && *ke) {
        int ks, kv, kt;
        if (sscanf(ke, "%d:%d:%d", &ks, &kv, &kt) != 3 || ks < 0 || ks > 3 || kv < 1 || kv > ACTQ_VMAX || kt < 32 ||
            kt > ACTQ_TMAX || kt % 32 || ((long long)kt * kv << ks) < nch)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NIB_ACTQ '%s' (shift:V:T) does not cover %lld chunks per row", who,
                           ke, nch);
        shift = ks, per = kv, T = kt;
    }
    if ((long long)a->rows << shift > INT32_MAX)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: %lld rows x H %lld is too large for one launch", who, (long long)a->rows,
                       (long long)a->h);
    p.cl_shift = shift;
    const dim3 grid((unsigned)(a->rows << shift)), block((unsigned)T), cluster(1u << shift);
    void (*k)(const ActParams) = per <= 1 ? k_act_q<1> : per == 2 ? k_act_q<2> : per == 3 ? k_act_q<3> : k_act_q<4>;
    if (shift) NIB_CUDA_CHECK(nib::launch_cluster(k, grid, block, 0, s, cluster, p));
    else NIB_CUDA_CHECK(nib::launch(k, grid, block, 0, s, p));
    NIB_LAUNCH_CHECK("k_act_q");
    return NIB_OK;
}
