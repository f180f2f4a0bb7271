/* act.cu — GeGLU-tanh / SwiGLU / GELU-tanh (ops/act.h) on bf16 rows, fp32 math in exactly the
 * order of the reference (ops/ref/act.c; explicit __f*_rn intrinsics, never contracted to
 * FMAs); tanhf / expf are CUDA's (within 2 ulp), the only difference from the reference.
 *
 * Layout: gated input [rows][ldx] = gate columns [0, H) | up columns [H, 2H); output
 * [rows][ldy] columns [0, H). Each thread produces one 16-byte chunk of 8 outputs from one
 * 16-byte gate chunk and one 16-byte up chunk; CTAs of 128 threads tile a row (grid = rows x
 * ceil(H / 8 / 128), flattened into x). In place (y == x) is safe: a thread reads its gate and
 * up chunks before writing the output chunk that overlaps only its own gate chunk.
 * FP8 output (y_q): one CTA of 512 threads per row, each thread keeps its (up to 8) chunks in
 * registers, so the row max and the codes come from one read of the input (fp8_rows.cuh).
 * Tested by tests/test_ops_gpu.c (`nib_tests ops_gpu_act`), timed by `nib bench ops`.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/act.h"
#include "ops/cuda/bf16x8.cuh"
#include "ops/cuda/fp8_rows.cuh"
#include "runtime/cuda_check.h"
#include "runtime/launch.cuh"

#define ACT_THREADS 128

struct ActParams {
    int kind, nch, cblocks; /* nch = H / 8 chunks per row; cblocks = CTAs per row */
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


/* (0.5 g) (1 + tanh(k0 (g + ((k1 g) g) g))) */
static __device__ __forceinline__ float gelu_tanh_f(float g) {
    const float g3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float z = __fmul_rn(0.7978845608028654f, __fadd_rn(g, g3));
    return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(z)));
}
/* g / (1 + exp(-g)) */
static __device__ __forceinline__ float silu_f(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

/* the 8 outputs of chunk c of a row (fp32, the reference's arithmetic) */
static __device__ __forceinline__ void act_chunk(const ActParams &p, const uint16_t *xr, int c, float (&o)[8]) {
    float g[8];
    unpack8(*(const uint4 *)(xr + 8 * c), g);
    if (p.kind == NIB_ACT_GELU_TANH) {
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = gelu_tanh_f(g[k]);
    } else {
        float u[8];
        unpack8(*(const uint4 *)(xr + p.h + 8 * c), u);
        if (p.kind == NIB_ACT_GEGLU_TANH) {
#pragma unroll
            for (int k = 0; k < 8; k++) o[k] = __fmul_rn(gelu_tanh_f(g[k]), u[k]);
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
    float o[8];
    act_chunk(p, p.x + row * p.ldx, c, o);
    *(uint4 *)(p.y + row * p.ldy + 8 * c) = pack8(o);
}

#define ACTQ_THREADS 512
template <int V>
__global__ void __launch_bounds__(ACTQ_THREADS) k_act_q(const ActParams p) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    __shared__ float s_max[ACTQ_THREADS / 32];
    const long long row = blockIdx.x;
    if (p.n_valid && row >= *p.n_valid) return; /* uniform per CTA: before the barrier */
    const uint16_t *xr = p.x + row * p.ldx;
    float o[V][8];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int c = threadIdx.x + i * ACTQ_THREADS;
        if (c >= p.nch) continue;
        act_chunk(p, xr, c, o[i]);
#pragma unroll
        for (int k = 0; k < 8; k++) amax = fmaxf(amax, fabsf(o[i][k]));
        if (p.y) *(uint4 *)(p.y + row * p.ldy + 8 * c) = pack8(o[i]);
    }
    const float sc = nib::fp8_row_scale_of(nib::cta_max(amax, s_max, ACTQ_THREADS / 32));
    if (threadIdx.x == 0) p.ys[row] = sc;
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int c = threadIdx.x + i * ACTQ_THREADS;
        if (c < p.nch) *(uint2 *)(p.yq + row * p.ldq + 8 * c) = nib::fp8_codes8(o[i], sc);
    }
}

nib_status nib_cuda_act(const nib_act_args *a, void *stream) {
    static const char *who = "act (cuda)";
    NIB_RETURN_IF_ERR(nib_act_validate(a, who));
    if (a->ldx % 8 || ((uintptr_t)a->x & 15u) || (a->y && (a->ldy % 8 || ((uintptr_t)a->y & 15u))))
        return NIB_ERR(NIB_ERR_SHAPE, "%s: ldx %lld and ldy %lld must be multiples of 8 and x, y 16-byte aligned", who,
                       (long long)a->ldx, (long long)a->ldy);
    if (a->y_q && (a->ldq % 8 || ((uintptr_t)a->y_q & 7u) || a->h > 8 * 8 * ACTQ_THREADS))
        return NIB_ERR(NIB_ERR_SHAPE, "%s: FP8 output needs ldq (%lld) a multiple of 8, y_q 8-byte aligned and H (%lld) "
                       "<= %d", who, (long long)a->ldq, (long long)a->h, 8 * 8 * ACTQ_THREADS);
    if (a->rows == 0) return NIB_OK;
    ActParams p;
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
    const long long per = (nch + ACTQ_THREADS - 1) / ACTQ_THREADS; /* chunks per thread, <= 8 (checked) */
    const dim3 grid((unsigned)a->rows), block(ACTQ_THREADS);
    if (per <= 1) NIB_CUDA_CHECK(nib::launch(k_act_q<1>, grid, block, 0, s, p));
    else if (per <= 2) NIB_CUDA_CHECK(nib::launch(k_act_q<2>, grid, block, 0, s, p));
    else if (per <= 4) NIB_CUDA_CHECK(nib::launch(k_act_q<4>, grid, block, 0, s, p));
    else NIB_CUDA_CHECK(nib::launch(k_act_q<8>, grid, block, 0, s, p));
    NIB_LAUNCH_CHECK("k_act_q");
    return NIB_OK;
}
