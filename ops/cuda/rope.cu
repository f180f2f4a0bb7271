/* rope.cu — rotary position embedding (ops/rope.h), in place on bf16 [tokens][ld] rows whose
 * heads start at h * head_dim; rotate-half or interleaved pairs over the first rot_dim dims of
 * each head, forward or inverse, fp32 math in exactly the order of the reference
 * (ops/ref/rope.c): angle = fp32(pos * inv_freq[i]), cos/sin evaluated in fp64 and rounded
 * once, a*c - b*s and b*c + a*s with explicit __f*_rn intrinsics (never contracted to FMAs).
 *
 * Layout: one CTA per token. The token's rot_dim/2 (cos, sin) pairs are computed once into
 * shared memory (one fp64 sincos per frequency, shared by every head), then each thread
 * rotates one unit: a 16-byte chunk of 8 first-half dims and the matching chunk of 8
 * second-half dims (rotate-half: 8 pairs), or one 16-byte chunk of 4 adjacent pairs
 * (interleaved). The table is stored so that the units of one head read consecutive float2
 * entries (entry k * nch + j holds frequency j * F + k for unit j, element k): no bank
 * conflicts; units of other heads read the same entries (broadcast). The first unit's loads
 * are issued before the table is computed, so their latency hides behind the sincos.
 * Variants: vector path (rot_dim % 16 == 0 rotate-half, % 8 == 0 interleaved; head_dim and ld
 * multiples of 8; x 16-byte aligned) and a scalar path (one thread per pair) for anything else.
 * Tested by tests/test_ops_gpu.c (`nib_tests ops_gpu_rope`), timed by `nib bench ops`.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/rope.h"
#include "runtime/cuda_check.h"
#include "runtime/launch.cuh"

struct RopeParams {
    int style, inverse, n_heads, head_dim, half;
    int vec;   /* 1: 16-byte path */
    int F;     /* pairs (frequencies) per unit: 8 rotate-half, 4 interleaved */
    int nch;   /* units per head: half / F (vector path) */
    int units; /* per token: n_heads * nch (vector) or n_heads * half (scalar) */
    const int32_t *n_valid, *pos;
    const float *inv_freq;
    uint16_t *x;
    long long ld;
};

static __device__ __forceinline__ uint4 ld16(const uint16_t *p) { return *(const uint4 *)p; }
static __device__ __forceinline__ void st16(uint16_t *p, uint4 v) { *(uint4 *)p = v; }
static __device__ __forceinline__ void unpack8(uint4 u, float (&f)[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}
static __device__ __forceinline__ uint16_t bf16_of(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
static __device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
    uint4 u;
    u.x = (uint32_t)bf16_of(f[0]) | ((uint32_t)bf16_of(f[1]) << 16);
    u.y = (uint32_t)bf16_of(f[2]) | ((uint32_t)bf16_of(f[3]) << 16);
    u.z = (uint32_t)bf16_of(f[4]) | ((uint32_t)bf16_of(f[5]) << 16);
    u.w = (uint32_t)bf16_of(f[6]) | ((uint32_t)bf16_of(f[7]) << 16);
    return u;
}
static __device__ __forceinline__ float bf16_val(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* (a, b) <- (a c - b s, b c + a s), each operation rounded as in the reference */
static __device__ __forceinline__ void rotate(float &a, float &b, float2 cs) {
    const float ac = __fmul_rn(a, cs.x), bs = __fmul_rn(b, cs.y);
    const float bc = __fmul_rn(b, cs.x), as = __fmul_rn(a, cs.y);
    a = __fsub_rn(ac, bs);
    b = __fadd_rn(bc, as);
}

/* unit u of the token row: its head's base and the 1 or 2 chunks it rotates */
static __device__ __forceinline__ uint16_t *unit_base(const RopeParams &p, uint16_t *row, int u, int *j) {
    const int h = u / p.nch;
    *j = u - h * p.nch;
    return row + (long long)h * p.head_dim + 8 * *j;
}

__global__ void __launch_bounds__(256) k_rope(const RopeParams p) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    extern __shared__ float2 cs[]; /* [half] */
    const int t = blockIdx.x;
    if (p.n_valid && t >= *p.n_valid) return; /* uniform per CTA */
    uint16_t *row = p.x + (long long)t * p.ld;
    const int u0 = threadIdx.x;
    uint4 A = make_uint4(0, 0, 0, 0), B = A;
    int j0 = 0;
    if (p.vec && u0 < p.units) { /* first unit's loads in flight during the sincos */
        uint16_t *hp = unit_base(p, row, u0, &j0);
        A = ld16(hp);
        if (p.style == NIB_ROPE_HALF) B = ld16(hp + p.half);
    }
    const float posf = (float)p.pos[t];
    for (int i = threadIdx.x; i < p.half; i += blockDim.x) {
        const int f = p.vec ? (i % p.nch) * p.F + i / p.nch : i;
        const float ang = __fmul_rn(posf, p.inv_freq[f]);
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        const float s = __double2float_rn(sd);
        cs[i] = make_float2(__double2float_rn(cd), p.inverse ? -s : s);
    }
    __syncthreads();
    if (p.vec) {
        for (int u = u0; u < p.units; u += blockDim.x) {
            int j = j0;
            uint16_t *hp = unit_base(p, row, u, &j);
            if (u != u0) {
                A = ld16(hp);
                if (p.style == NIB_ROPE_HALF) B = ld16(hp + p.half);
            }
            float a[8];
            unpack8(A, a);
            if (p.style == NIB_ROPE_HALF) {
                float b[8];
                unpack8(B, b);
#pragma unroll
                for (int k = 0; k < 8; k++) rotate(a[k], b[k], cs[k * p.nch + j]);
                st16(hp, pack8(a));
                st16(hp + p.half, pack8(b));
            } else {
#pragma unroll
                for (int m = 0; m < 4; m++) rotate(a[2 * m], a[2 * m + 1], cs[m * p.nch + j]);
                st16(hp, pack8(a));
            }
        }
    } else {
        for (int u = threadIdx.x; u < p.units; u += blockDim.x) {
            const int h = u / p.half, i = u - h * p.half;
            uint16_t *hp = row + (long long)h * p.head_dim;
            const int ia = p.style == NIB_ROPE_HALF ? i : 2 * i, ib = p.style == NIB_ROPE_HALF ? i + p.half : 2 * i + 1;
            float a = bf16_val(hp[ia]), b = bf16_val(hp[ib]);
            rotate(a, b, cs[i]);
            hp[ia] = bf16_of(a);
            hp[ib] = bf16_of(b);
        }
    }
}

nib_status nib_cuda_rope(const nib_rope_args *a, void *stream) {
    static const char *who = "rope (cuda)";
    NIB_RETURN_IF_ERR(nib_rope_validate(a, who));
    if (a->tokens == 0) return NIB_OK;
    RopeParams p;
    p.style = (int)a->style;
    p.inverse = a->inverse ? 1 : 0;
    p.n_heads = a->n_heads;
    p.head_dim = a->head_dim;
    p.half = a->rot_dim / 2;
    p.F = a->style == NIB_ROPE_HALF ? 8 : 4;
    p.vec = p.half % p.F == 0 && a->head_dim % 8 == 0 && a->ld % 8 == 0 && ((uintptr_t)a->x & 15u) == 0;
    p.nch = p.vec ? p.half / p.F : 1;
    p.units = p.vec ? a->n_heads * p.nch : a->n_heads * p.half;
    p.n_valid = a->n_valid;
    p.pos = a->positions;
    p.inv_freq = a->inv_freq;
    p.x = (uint16_t *)a->x;
    p.ld = a->ld;
    /* enough threads for the units (one pass when possible) and for the table */
    int threads = p.units > p.half ? p.units : p.half;
    threads = (threads + 31) / 32 * 32;
    if (threads > 256) threads = 256;
    const size_t smem = (size_t)p.half * sizeof(float2); /* <= 16 KiB (rot_dim <= 4096) */
    NIB_CUDA_CHECK(nib::launch(k_rope, dim3((unsigned)a->tokens), dim3(threads), smem, (cudaStream_t)stream, p));
    NIB_LAUNCH_CHECK("k_rope");
    return NIB_OK;
}
