/* edge.cu — the flow step's edge (ops/edge.h) in one kernel: the final adaRMS, the action-out product,
 * x_t's update, the action-in product and the next step's first adaRMS of one row per CTA.
 *
 * Layout: dim / 8 chunks of 8 columns, one per thread, rounded up to whole warps (at most 256 threads);
 * thread c owns columns 8c .. 8c + 7 of every row it touches, as k_norm's threads do at V = 1 (threads
 * past the last chunk hold zeros), so both norms are k_norm's arithmetic on values already in registers
 * (norm_row.cuh). The weights w_out and w_in_t ([adim][dim] bf16 each) are
 * staged into shared memory by cp.async before the PDL wait; each thread copies exactly the 16-byte
 * chunks it reads back later (column chunk c of every row), so no CTA barrier orders them.
 *   OUT: y (bf16-rounded, as the product would read it) . w_out[j] for j < adim: eight products per
 *        thread and j, then a reduce-scatter across the warp (lane j ends with output j's warp sum),
 *        the warps' sums in warp order, + b_out, rounded to bf16 (the product's output dtype), added
 *        to x_t in fp32.
 *   IN:  a = bf16(x_t[k]) in shared memory; thread c sums a_k * w_in_t[k][8c + i] over k in order,
 *        + b_in, rounds to bf16 (h, stored), then normalizes h.
 * Why one kernel: between two flow steps the per-op path ran six kernels for this (two of them
 * cuBLAS products that do not take part in PDL); each is a few microseconds of latency at batch 1
 * (docs/design.md, "Forty-fifth session").
 * Tested by tests/test_ops_gpu.c (`nib_tests ops_gpu_edge`) against ops/ref/edge.c.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "ops/cuda/bf16x8.cuh"
#include "ops/cuda/norm_row.cuh"
#include "ops/edge.h"
#include "runtime/cuda_check.h"
#include "runtime/ktrace.cuh"
#include "runtime/launch.cuh"

struct EdgeParams {
    int dim, nch, adim;
    float eps;
    double inv_dim; /* 1 / dim when dim is a power of two, else 0 (norm_row.cuh) */
    const uint16_t *x;
    long long ldx;
    const uint16_t *res;
    long long ldr;
    const float *rg, *fs, *fb;
    const uint16_t *wo;
    const float *bo;
    float *xt;
    long long ldxt;
    const uint16_t *wi;
    const float *bi;
    uint16_t *h;
    long long ldh;
    const float *ns, *nb;
    uint16_t *y;
    long long ldy;
};

static __device__ __forceinline__ void edge_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
static __device__ __forceinline__ float bf16_round(float f) { return __uint_as_float(bf16_bits(f) << 16); }

/* lane l returns the warp's sum of v[l] (v[i] = 0 for unused i); the tree's order is fixed */
static __device__ __forceinline__ float warp_reduce_scatter32(float (&v)[32]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int st = 0; st < 5; st++) { /* halves of 16, 8, 4, 2, 1 (constant indices: v stays in registers) */
        const int o = 16 >> st;
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < 16; i++)
            if (i < o) {
                const float send = up ? v[i] : v[i + o], keep = up ? v[i + o] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
    }
    return v[0];
}

template <int MODE>
__global__ void __launch_bounds__(256) k_edge(const EdgeParams p) {
    constexpr bool OUT = (MODE & NIB_EDGE_OUT) != 0, IN = (MODE & NIB_EDGE_IN) != 0;
    extern __shared__ __align__(16) uint4 s_w[]; /* [adim][nch] w_out (OUT), then [adim][nch] w_in_t (IN) */
    __shared__ double s_sum[2][8];
    __shared__ float s_part[8][32];
    __shared__ float s_a[NIB_EDGE_MAX_ADIM];
    const int c = threadIdx.x, nw = blockDim.x >> 5;
    const bool live = c < p.nch; /* (the last warp's threads past dim / 8 hold zeros) */
    uint4 *so = s_w, *si = s_w + (OUT ? p.adim * p.nch : 0);
    NIB_KT(NIB_KT_EDGE, NIB_KT_ENTRY);
    /* load-time constants: allowed before the wait (runtime/launch.cuh, rule 1) */
    if (OUT && live)
        for (int j = 0; j < p.adim; j++) edge_cp16(so + j * p.nch + c, p.wo + (size_t)j * p.dim + 8 * c);
    if (IN && live)
        for (int k = 0; k < p.adim; k++) edge_cp16(si + k * p.nch + c, p.wi + (size_t)k * p.dim + 8 * c);
    asm volatile("cp.async.commit_group;");
    if (blockIdx.x == 0 && (c & 3) == 0 && live) { /* the per-call modulations into L2: hints only */
        if (OUT) nib::prefetch_l2(p.fs + 8 * c), nib::prefetch_l2(p.fb + 8 * c);
        if (OUT && p.rg) nib::prefetch_l2(p.rg + 8 * c);
        if (IN) nib::prefetch_l2(p.ns + 8 * c), nib::prefetch_l2(p.nb + 8 * c);
    }
    nib::pdl_enter();
    NIB_KT(NIB_KT_EDGE, NIB_KT_WAITED);
    NIB_KT_EXIT_GUARD(NIB_KT_EDGE);
    const long long row = blockIdx.x;
    if (OUT) {
        float v[8], sc[8], sh[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = sc[k] = sh[k] = 0.f;
        if (live) {
            load8f(p.fs + 8 * c, sc);
            load8f(p.fb + 8 * c, sh);
            unpack8(ld16(p.x + row * p.ldx + 8 * c), v);
        }
        if (p.res && live) { /* h = x (* gate) + residual, rounded as k_norm stores it */
            float r[8];
            unpack8(ld16(p.res + row * p.ldr + 8 * c), r);
            if (p.rg) {
                float g[8];
                load8f(p.rg + 8 * c, g);
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = __fmul_rn(v[k], g[k]);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = __fadd_rn(v[k], r[k]);
            unpack8(pack8(v), v);
        }
        double acc = 0.0;
#pragma unroll
        for (int k = 0; k < 8; k++) acc += (double)v[k] * (double)v[k];
        const float inv = nib::rms_inv(nib::block_sum_f64(acc, s_sum[0], nw), p.inv_dim, p.dim, p.eps);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = nib::adarms_of(v[k], inv, sc[k], sh[k]);
        unpack8(pack8(v), v); /* y in bf16, as the action-out product reads it */
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        float part[32];
#pragma unroll
        for (int j = 0; j < 32; j++) {
            part[j] = 0.f;
            if (j < p.adim && live) {
                float w[8];
                unpack8(so[j * p.nch + c], w);
                float s = 0.f;
#pragma unroll
                for (int k = 0; k < 8; k++) s = fmaf(v[k], w[k], s);
                part[j] = s;
            }
        }
        s_part[c >> 5][c & 31] = warp_reduce_scatter32(part);
        __syncthreads();
        if (c < p.adim) {
            float s = 0.f;
            for (int w = 0; w < nw; w++) s += s_part[w][c];
            if (p.bo) s = __fadd_rn(s, p.bo[c]);
            float *xt = p.xt + row * p.ldxt + c;
            const float xn = __fadd_rn(*xt, bf16_round(s)); /* v in bf16: the product's output */
            *xt = xn;
            if (IN) s_a[c] = bf16_round(xn);
        }
    } else if (c < p.adim) {
        s_a[c] = bf16_round(p.xt[row * p.ldxt + c]);
    }
    if (IN) {
        float sc[8], sh[8], acc[8];
#pragma unroll
        for (int k = 0; k < 8; k++) sc[k] = sh[k] = acc[k] = 0.f;
        if (live) {
            load8f(p.ns + 8 * c, sc);
            load8f(p.nb + 8 * c, sh);
            if (p.bi) load8f(p.bi + 8 * c, acc);
        }
        if (!OUT) asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads(); /* s_a */
        float d[8];
#pragma unroll
        for (int i = 0; i < 8; i++) d[i] = 0.f;
        for (int k = 0; k < p.adim && live; k++) {
            float w[8];
            unpack8(si[k * p.nch + c], w);
            const float a = s_a[k];
#pragma unroll
            for (int i = 0; i < 8; i++) d[i] = fmaf(a, w[i], d[i]);
        }
        if (p.bi) {
#pragma unroll
            for (int i = 0; i < 8; i++) d[i] = __fadd_rn(d[i], acc[i]);
        }
        const uint4 hu = pack8(d);
        if (live) st16(p.h + row * p.ldh + 8 * c, hu);
        unpack8(hu, d); /* normalize the stored h, as k_norm reads it */
        double sq = 0.0;
#pragma unroll
        for (int k = 0; k < 8; k++) sq += (double)d[k] * (double)d[k];
        const float inv = nib::rms_inv(nib::block_sum_f64(sq, s_sum[1], nw), p.inv_dim, p.dim, p.eps);
#pragma unroll
        for (int k = 0; k < 8; k++) d[k] = nib::adarms_of(d[k], inv, sc[k], sh[k]);
        if (live) st16(p.y + row * p.ldy + 8 * c, pack8(d));
    }
}

static bool al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <int MODE> static cudaError_t launch_edge(int rows, int threads, size_t smem, cudaStream_t s, const EdgeParams &p) {
    static int attr_set; /* the opt-in above 48 KB of dynamic shared memory, once per instantiation */
    if (!attr_set) {
        const cudaError_t e = cudaFuncSetAttribute(k_edge<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   NIB_EDGE_MAX_SMEM);
        if (e != cudaSuccess) return e;
        attr_set = 1;
    }
    return nib::launch(k_edge<MODE>, dim3((unsigned)rows), dim3((unsigned)threads), smem, s, p);
}

nib_status nib_cuda_edge(const nib_edge_args *a, void *stream) {
    static const char *who = "edge (cuda)";
    NIB_RETURN_IF_ERR(nib_edge_validate(a, who));
    NIB_RETURN_IF_ERR(nib_edge_supported(a->mode, a->dim, a->adim));
    const int out = (a->mode & NIB_EDGE_OUT) != 0, in = (a->mode & NIB_EDGE_IN) != 0;
    const bool rows_ok = (!out || (a->ldx % 8 == 0 && al16(a->x) && (!a->residual || (a->ldr % 8 == 0 && al16(a->residual))))) &&
                         (!in || (a->ldh % 8 == 0 && al16(a->h) && a->ldy % 8 == 0 && al16(a->y)));
    if (!rows_ok)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: bf16 row strides must be multiples of 8 and pointers 16-byte aligned (ldx %lld, "
                                      "ldr %lld, ldh %lld, ldy %lld)",
                       who, (long long)a->ldx, (long long)a->ldr, (long long)a->ldh, (long long)a->ldy);
    const bool vec_ok = (!out || (al16(a->w_out) && al16(a->fscale) && al16(a->fshift) && (!a->res_gate || al16(a->res_gate)))) &&
                        (!in || (al16(a->w_in_t) && al16(a->nscale) && al16(a->nshift) && (!a->b_in || al16(a->b_in))));
    if (!vec_ok) return NIB_ERR(NIB_ERR_SHAPE, "%s: the weights and fp32 vectors must be 16-byte aligned", who);
    if (a->rows == 0) return NIB_OK;

    EdgeParams p;
    memset(&p, 0, sizeof p);
    p.dim = (int)a->dim, p.nch = (int)(a->dim / 8), p.adim = (int)a->adim, p.eps = a->eps;
    p.inv_dim = (a->dim & (a->dim - 1)) == 0 ? 1.0 / (double)a->dim : 0.0;
    if (out) {
        p.x = (const uint16_t *)a->x, p.ldx = a->ldx, p.res = (const uint16_t *)a->residual, p.ldr = a->ldr;
        p.rg = a->residual ? a->res_gate : NULL, p.fs = a->fscale, p.fb = a->fshift;
        p.wo = (const uint16_t *)a->w_out, p.bo = a->b_out;
    }
    p.xt = a->xt, p.ldxt = a->ldxt;
    if (in) {
        p.wi = (const uint16_t *)a->w_in_t, p.bi = a->b_in, p.h = (uint16_t *)a->h, p.ldh = a->ldh;
        p.ns = a->nscale, p.nb = a->nshift, p.y = (uint16_t *)a->y, p.ldy = a->ldy;
    }
    const size_t smem = (size_t)(out + in) * (size_t)a->adim * (size_t)a->dim * 2;
    cudaStream_t s = (cudaStream_t)stream;
    const int rows = (int)a->rows, threads = (p.nch + 31) / 32 * 32;
    switch (a->mode) {
    case NIB_EDGE_OUT: NIB_CUDA_CHECK(launch_edge<NIB_EDGE_OUT>(rows, threads, smem, s, p)); break;
    case NIB_EDGE_IN: NIB_CUDA_CHECK(launch_edge<NIB_EDGE_IN>(rows, threads, smem, s, p)); break;
    default: NIB_CUDA_CHECK(launch_edge<NIB_EDGE_OUT | NIB_EDGE_IN>(rows, threads, smem, s, p)); break;
    }
    NIB_LAUNCH_CHECK("k_edge");
    return NIB_OK;
}

NIB_KTRACE_UNIT(edge)
