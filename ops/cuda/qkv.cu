/* qkv.cu — the fused QKV epilogue (ops/qkv.h): RoPE on q and k, q scaling, and the KV-cache
 * write converted to the cache dtype (bf16 / FP8 E4M3 + per-(token, head) scale / NVFP4 with
 * per-(token, head) global and 16-element E4M3 block scales) in one pass over the bf16 output
 * of the fused QKV GEMM; the plain K/V cache write (no RoPE); and the cache read-back for tests.
 *
 * Layout: one CTA per token, one thread per (head, j): the thread holds dims [8j, 8j + 8) of
 * the head's first half and [half + 8j, half + 8j + 8) of its second half (two 16-byte loads),
 * so each thread owns 8 complete rotate-half pairs and tph = head_dim / 16 consecutive lanes
 * cover one head (a power of two <= 32: a head never straddles a warp). Heads are ordered q,
 * k, v (Gemma: 8 + 1 + 1 heads x 16 threads = 160 threads per token). The token's head_dim/2
 * (cos, sin) pairs are computed once into shared memory (fp64 sincos of the fp32 angle, as
 * ops/rope.h specifies) while the q/k/v loads are in flight; entry k * tph + j holds frequency
 * 8j + k, so the 16 lanes of a head read consecutive float2 (no bank conflicts).
 * Quantization, exactly formats/' rules on the fp32 values (explicit __f*_rn, no FMA):
 *   FP8:   amax over the head (xor-shuffle within the tph lanes; max is order-independent),
 *          scale = amax / 448 (>= FLT_MIN, 1 if zero), code = cvt.rn.satfinite.e4m3(x / scale).
 *   NVFP4: global = amax / 2688 (>= 2^-117, 1 if zero); a 16-element block is chunk j of lanes
 *          j and j ^ 1 (one xor-shuffle), scale = e4m3(clamp(bamax / (6 global), 2^-9, 448))
 *          (1 for a zero block), code = e2m1(x / (e4m3_value(scale) * global)); 8 codes per
 *          chunk are one 32-bit store (element 2i in the low nibble).
 * Every lane executes every shuffle (inactive lanes hold zeros; all branches around them are
 * uniform kernel parameters), so the full-warp masks are valid.
 * Valid tokens come from a device int; slots outside [0, t_max) are skipped on the device.
 * Tested by tests/test_ops_gpu.c (`nib_tests ops_gpu_qkv`, `ops_gpu_kv`), timed by `nib bench ops`.
 */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/qkv.h"
#include "ops/cuda/bf16x8.cuh"
#include "runtime/cuda_check.h"
#include "runtime/launch.cuh"

#define NVFP4_GLOBAL_MIN 0x1p-117f /* formats.h NIB_NVFP4_GLOBAL_MIN */

struct QkvParams {
    int nq, nkv, hd, half, tph, units; /* tph = hd / 16 threads per head */
    int rope, kvdt;                    /* kvdt: nib_kv_dtype, or -1 for no cache write */
    const int32_t *n_valid, *pos;
    const float *inv_freq;
    float q_scale;
    const uint16_t *qsrc, *ksrc, *vsrc; /* head h of token t at src + t * ld + h * hd */
    long long ld_qs, ld_ks, ld_vs;
    uint16_t *q;
    long long ldq;
    uint8_t *kc, *vc; /* element planes */
    uint8_t *kb, *vb; /* NVFP4 block scales */
    float *ks, *vs;   /* FP8 scales / NVFP4 globals */
    int t_max, slot_offset;
    const int32_t *slot_base;
    unsigned *done; /* nib_qkv_args.done: +1 per CTA (release) after its writes */
    int pairs;      /* nib_qkv_args.pairs: a thread's 8 + 8 dims are 16 consecutive elements */
};

/* the (cos, sin) of frequency f at position pos: the fp32 angle, fp64 sincos, rounded to fp32 (ops/rope.h) */
static __device__ __forceinline__ float2 rope_cs(float posf, float inv_freq) {
    const float ang = __fmul_rn(posf, inv_freq);
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    return make_float2(__double2float_rn(cd), __double2float_rn(sd));
}

static __device__ __forceinline__ uint4 ld16(const uint16_t *p) { return *(const uint4 *)p; }
static __device__ __forceinline__ void st16(void *p, uint4 v) { *(uint4 *)p = v; }

/* exact E4M3 value (NaN codes S.1111.111 -> NaN) */
static __device__ __forceinline__ float e4m3_val(uint32_t c) {
    const uint32_t e = (c >> 3) & 15u, m = c & 7u;
    float v;
    if (e == 15u && m == 7u) v = __uint_as_float(0x7FC00000u);
    else if (e == 0u) v = (float)m * 0x1p-9f;
    else v = __uint_as_float(((e + 120u) << 23) | (m << 20)); /* (1 + m/8) 2^(e-7) */
    return (c & 0x80u) ? -v : v;
}
static __device__ __forceinline__ uint32_t e4m3_code(float x) {
    return (uint32_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
/* formats/ nib_f32_to_e2m1: RNE on {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code,
 * saturating; the sign bit is the IEEE sign; NaN -> 0x7 */
static __device__ __forceinline__ uint32_t e2m1_code(float x) {
    if (isnan(x)) return 7u;
    const uint32_t sign = (__float_as_uint(x) >> 31) << 3;
    const float a = fabsf(x);
    uint32_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return sign | c;
}
static __device__ __forceinline__ float e2m1_val(uint32_t c) {
    const uint32_t m = c & 7u;
    const float v = m < 2u ? 0.5f * (float)m : (float)(2u + (m & 1u)) * __uint_as_float((125u + (m >> 1)) << 23);
    return (c & 8u) ? -v : v;
}
/* formats/ nib_nvfp4_global_for_amax and nib_nvfp4_block_scale */
static __device__ __forceinline__ float nvfp4_global(float amax) {
    if (!(amax > 0.0f)) return 1.0f;
    const float g = __fdiv_rn(amax, 2688.0f);
    return g < NVFP4_GLOBAL_MIN ? NVFP4_GLOBAL_MIN : g;
}
static __device__ __forceinline__ uint32_t nvfp4_block_scale(float bamax, float global) {
    float s = __fdiv_rn(bamax, __fmul_rn(6.0f, global));
    if (s == 0.0f) s = 1.0f;
    if (s < 0x1p-9f) s = 0x1p-9f;
    if (s > 448.0f) s = 448.0f;
    return e4m3_code(s);
}
/* 8 E2M1 codes of x / denom, element k in bits 4k..4k+3 */
static __device__ __forceinline__ uint32_t e2m1_word(const float (&x)[8], float denom) {
    uint32_t w = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) w |= e2m1_code(__fdiv_rn(x[k], denom)) << (4 * k);
    return w;
}
static __device__ __forceinline__ uint2 e4m3_word(const float (&x)[8], float scale) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int k = 0; k < 8; k++) w[k >> 2] |= e4m3_code(__fdiv_rn(x[k], scale)) << (8 * (k & 3));
    return make_uint2(w[0], w[1]);
}

/* one token's q / K / V (CTA-uniform returns only: k_qkv's signal follows) */
static __device__ __forceinline__ void qkv_token(const QkvParams &p) {
    extern __shared__ float2 cs[]; /* [half] (cos, sin) when p.rope */
    const int t = blockIdx.x;
    if (p.n_valid && t >= *p.n_valid) return; /* uniform per CTA: before any barrier/shuffle */
    const int u = threadIdx.x;
    const bool active = u < p.units;
    const int head = u / p.tph, j = u - head * p.tph;
    int role = 2, hh = head - p.nq - p.nkv; /* 0 q, 1 k, 2 v; hh = head index within its role */
    if (head < p.nq) {
        role = 0;
        hh = head;
    } else if (head < p.nq + p.nkv) {
        role = 1;
        hh = head - p.nq;
    }
    float a[8], b[8];
#pragma unroll
    for (int k = 0; k < 8; k++) a[k] = b[k] = 0.f;
    if (active) {
        const uint16_t *src = role == 0 ? p.qsrc + t * p.ld_qs : role == 1 ? p.ksrc + t * p.ld_ks : p.vsrc + t * p.ld_vs;
        if (p.pairs) { /* dims 8j.. and half + 8j.. side by side (ops/qkv.h pair layout) */
            src += (long long)hh * p.hd + 16 * j;
            unpack8(ld16(src), a);
            unpack8(ld16(src + 8), b);
        } else {
            src += (long long)hh * p.hd + 8 * j;
            unpack8(ld16(src), a);
            unpack8(ld16(src + p.half), b);
        }
    }
    if (p.rope) {
        const float posf = (float)p.pos[t];
        for (int i = threadIdx.x; i < p.half; i += blockDim.x) {
            const int f = (i % p.tph) * 8 + i / p.tph; /* stored at i = k * tph + j for f = 8j + k */
            cs[i] = rope_cs(posf, p.inv_freq[f]);
        }
        __syncthreads();
        if (active && role != 2) {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float2 e = cs[k * p.tph + j];
                const float ac = __fmul_rn(a[k], e.x), bs = __fmul_rn(b[k], e.y);
                const float bc = __fmul_rn(b[k], e.x), as = __fmul_rn(a[k], e.y);
                a[k] = __fsub_rn(ac, bs);
                b[k] = __fadd_rn(bc, as);
            }
        }
    }
    if (active && role == 0) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            a[k] = __fmul_rn(a[k], p.q_scale);
            b[k] = __fmul_rn(b[k], p.q_scale);
        }
        uint16_t *dst = p.q + t * p.ldq + (long long)hh * p.hd + 8 * j;
        st16(dst, pack8(a));
        st16(dst + p.half, pack8(b));
    }
    if (p.kvdt < 0) return; /* uniform */
    const int slot = p.slot_offset + (p.slot_base ? *p.slot_base : 0) + t;
    const bool wr = active && role != 0 && slot >= 0 && slot < p.t_max;
    const long long vec = (long long)slot * p.nkv + hh; /* (slot, head) vector index */
    uint8_t *plane = role == 1 ? p.kc : p.vc;
    if (p.kvdt == NIB_KV_BF16) {
        if (wr) {
            uint8_t *dst = plane + (vec * p.hd + 8 * j) * 2;
            st16(dst, pack8(a));
            st16(dst + p.half * 2, pack8(b));
        }
        return;
    }
    /* amax over the head's tph lanes: every lane of the warp takes part */
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++) m = fmaxf(m, fmaxf(fabsf(a[k]), fabsf(b[k])));
    for (int o = p.tph >> 1; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (p.kvdt == NIB_KV_FP8) {
        float sc = 1.0f;
        if (m != 0.0f) {
            sc = __fdiv_rn(m, 448.0f);
            sc = sc < FLT_MIN ? FLT_MIN : sc;
        }
        if (wr) {
            uint8_t *dst = plane + vec * p.hd + 8 * j;
            *(uint2 *)dst = e4m3_word(a, sc);
            *(uint2 *)(dst + p.half) = e4m3_word(b, sc);
            if (j == 0) (role == 1 ? p.ks : p.vs)[vec] = sc;
        }
        return;
    }
    /* NVFP4: block of 16 = chunk j of lanes j and j ^ 1 (first half), same for the second half */
    float ba = 0.f, bb = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        ba = fmaxf(ba, fabsf(a[k]));
        bb = fmaxf(bb, fabsf(b[k]));
    }
    ba = fmaxf(ba, __shfl_xor_sync(0xffffffffu, ba, 1));
    bb = fmaxf(bb, __shfl_xor_sync(0xffffffffu, bb, 1));
    const float g = nvfp4_global(m);
    const uint32_t sa = nvfp4_block_scale(ba, g), sb = nvfp4_block_scale(bb, g);
    if (wr) {
        uint8_t *dst = plane + vec * (p.hd / 2) + 4 * j;
        *(uint32_t *)dst = e2m1_word(a, __fmul_rn(e4m3_val(sa), g));
        *(uint32_t *)(dst + p.hd / 4) = e2m1_word(b, __fmul_rn(e4m3_val(sb), g));
        if ((j & 1) == 0) {
            uint8_t *blk = (role == 1 ? p.kb : p.vb) + vec * (p.hd / 16);
            blk[j / 2] = (uint8_t)sa;              /* block (8j) / 16 */
            blk[p.hd / 32 + j / 2] = (uint8_t)sb;  /* block (half + 8j) / 16 */
        }
        if (j == 0) (role == 1 ? p.ks : p.vs)[vec] = g;
    }
}
/* L: a lean instantiation (NIB_QKV_LEAN) with the cache dtype and the pair layout fixed at compile time, so
 * the kernel carries no other dtype's code (as the low-bit GEMM's: docs/design.md, "Forty-fourth session");
 * L = 1 + (kvdt + 1) + 4 * pairs, 0 decides both at run time. */
#define QKV_LEAN(kvdt, pairs) (1 + ((kvdt) + 1) + 4 * (pairs))
template <int L = 0>
__global__ void __launch_bounds__(1024) k_qkv(const QkvParams pa) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    QkvParams p = pa;
    if constexpr (L != 0) {
        p.kvdt = (L - 1) % 4 - 1;
        p.pairs = (L - 1) / 4;
    }
    qkv_token(p);
    if (p.done) { /* the CTA's writes, ordered by the barrier, released with one add (as a grid barrier) */
        __syncthreads();
        if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.done) : "memory");
    }
}

/* ---- the per-call (cos, sin) table of the fused GEMM epilogue: one thread per (token, f) ---- */
__global__ void k_rope_table(const int32_t *pos, const float *inv_freq, int tokens, int half, float2 *out) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tokens * half) return;
    const int t = i / half, f = i - t * half;
    out[i] = rope_cs((float)pos[t], inv_freq[f]);
}

/* ---- read-back: one thread per element (a test helper) ----------------------------------- */
struct KvReadParams {
    int dt, hd, nkv, f32;
    long long v0, n; /* first vector index, element count */
    const uint8_t *plane, *blk;
    const float *sc;
    void *out;
};

__global__ void k_kv_read(const KvReadParams p) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < p.n; i += (long long)gridDim.x * blockDim.x) {
        const long long vl = i / p.hd;
        const int d = (int)(i - vl * p.hd);
        const long long vec = p.v0 + vl;
        float val;
        if (p.dt == NIB_KV_BF16) {
            val = __uint_as_float((uint32_t)((const uint16_t *)p.plane)[vec * p.hd + d] << 16);
        } else if (p.dt == NIB_KV_FP8) {
            val = __fmul_rn(e4m3_val(p.plane[vec * p.hd + d]), p.sc[vec]);
        } else {
            const uint32_t byte = p.plane[vec * (p.hd / 2) + d / 2];
            const uint32_t code = (d & 1) ? byte >> 4 : byte & 15u;
            val = __fmul_rn(__fmul_rn(e2m1_val(code), e4m3_val(p.blk[vec * (p.hd / 16) + d / 16])), p.sc[vec]);
        }
        if (p.f32) ((float *)p.out)[i] = val;
        else ((uint16_t *)p.out)[i] = (uint16_t)bf16_bits(val);
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

static bool al(const void *p, unsigned n) { return ((uintptr_t)p & (n - 1u)) == 0; }

static nib_status set_cache(QkvParams *p, const nib_kv_layer *c, const char *who) {
    const unsigned ea = c->dtype == NIB_KV_BF16 ? 16u : c->dtype == NIB_KV_FP8 ? 8u : 4u;
    if (!al(c->k, ea) || !al(c->v, ea) || (c->ks && !al(c->ks, 4)) || (c->vs && !al(c->vs, 4)))
        return NIB_ERR(NIB_ERR_SHAPE, "%s: %s cache planes must be %u-byte aligned (map with nib_kv_layer_map)", who,
                       nib_kv_dtype_name(c->dtype), ea);
    p->kvdt = (int)c->dtype;
    p->t_max = c->t_max;
    p->kc = (uint8_t *)c->k;
    p->vc = (uint8_t *)c->v;
    p->kb = c->kb;
    p->vb = c->vb;
    p->ks = c->ks;
    p->vs = c->vs;
    return NIB_OK;
}

/* NIB_QKV_LEAN: 1 (default) the lean instantiations, 0 never (A/B); -1: another value */
static int qkv_lean_env(void) {
    const char *e = getenv("NIB_QKV_LEAN");
    if (!e || !*e || !strcmp(e, "1")) return 1;
    return strcmp(e, "0") ? -1 : 0;
}

static nib_status launch_qkv(const QkvParams &p, long long tokens, void *stream) {
    const int threads = (p.units + 31) / 32 * 32; /* <= 1024 (validated) */
    const size_t smem = p.rope ? (size_t)p.half * sizeof(float2) : 0;
    const int lean = qkv_lean_env();
    if (lean < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_QKV_LEAN=%s: 1 (the lean q|k|v kernels, the default) or 0 (never)",
                       getenv("NIB_QKV_LEAN"));
    void (*k)(const QkvParams) = k_qkv<0>;
    if (lean) {
        switch (QKV_LEAN(p.kvdt, p.pairs ? 1 : 0)) {
        case QKV_LEAN(-1, 0): k = k_qkv<QKV_LEAN(-1, 0)>; break;
        case QKV_LEAN(0, 0): k = k_qkv<QKV_LEAN(0, 0)>; break;
        case QKV_LEAN(1, 0): k = k_qkv<QKV_LEAN(1, 0)>; break;
        case QKV_LEAN(2, 0): k = k_qkv<QKV_LEAN(2, 0)>; break;
        case QKV_LEAN(-1, 1): k = k_qkv<QKV_LEAN(-1, 1)>; break;
        case QKV_LEAN(0, 1): k = k_qkv<QKV_LEAN(0, 1)>; break;
        case QKV_LEAN(1, 1): k = k_qkv<QKV_LEAN(1, 1)>; break;
        case QKV_LEAN(2, 1): k = k_qkv<QKV_LEAN(2, 1)>; break;
        default: break;
        }
    }
    NIB_CUDA_CHECK(nib::launch(k, dim3((unsigned)tokens), dim3(threads), smem, (cudaStream_t)stream, p));
    NIB_LAUNCH_CHECK("k_qkv");
    return NIB_OK;
}

nib_status nib_cuda_qkv(const nib_qkv_args *a, void *stream) {
    static const char *who = "qkv epilogue (cuda)";
    NIB_RETURN_IF_ERR(nib_qkv_validate(a, who));
    if (a->ld_qkv % 8 || !al(a->qkv, 16) || (a->q && (a->ld_q % 8 || !al(a->q, 16))))
        return NIB_ERR(NIB_ERR_SHAPE, "%s: ld_qkv %lld and ld_q %lld must be multiples of 8 and qkv, q 16-byte aligned",
                       who, (long long)a->ld_qkv, (long long)a->ld_q);
    QkvParams p = {};
    p.kvdt = -1;
    if (a->cache) NIB_RETURN_IF_ERR(set_cache(&p, a->cache, who));
    if (a->tokens == 0) return NIB_OK;
    const int hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv_heads;
    const uint16_t *base = (const uint16_t *)a->qkv;
    p.nq = a->q ? nh : 0; /* no q output: no q threads */
    p.nkv = nkv;
    p.hd = hd;
    p.half = hd / 2;
    p.tph = hd / 16;
    p.units = (p.nq + (a->cache ? 2 * nkv : 0)) * p.tph;
    p.rope = 1;
    p.n_valid = a->n_valid;
    p.pos = a->positions;
    p.inv_freq = a->inv_freq;
    p.q_scale = a->q_scale;
    p.qsrc = base;
    p.ksrc = base + (long long)nh * hd;
    p.vsrc = base + (long long)(nh + nkv) * hd;
    p.ld_qs = p.ld_ks = p.ld_vs = a->ld_qkv;
    p.q = (uint16_t *)a->q;
    p.ldq = a->ld_q;
    p.slot_offset = a->slot_offset;
    p.slot_base = a->slot_base;
    p.done = a->done;
    p.pairs = a->pairs;
    return launch_qkv(p, a->tokens, stream);
}

nib_status nib_cuda_rope_table(const int32_t *positions, const float *inv_freq, int64_t tokens, int32_t head_dim,
                               void *out, void *stream) {
    if (!positions || !inv_freq || !out || tokens < 0 || head_dim < 2 || head_dim % 2 ||
        tokens * (int64_t)(head_dim / 2) > INT32_MAX || !al(out, 8))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "rope table (cuda): positions, inv_freq and an 8-byte aligned out are "
                       "required (tokens %lld, head_dim %d)", (long long)tokens, head_dim);
    const int n = (int)tokens * (head_dim / 2);
    if (n == 0) return NIB_OK;
    NIB_CUDA_CHECK(nib::launch(k_rope_table, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, (cudaStream_t)stream,
                               positions, inv_freq, (int)tokens, head_dim / 2, (float2 *)out));
    NIB_LAUNCH_CHECK("k_rope_table");
    return NIB_OK;
}

nib_status nib_cuda_kv_write(const nib_kv_write_args *a, void *stream) {
    static const char *who = "kv write (cuda)";
    NIB_RETURN_IF_ERR(nib_kv_write_validate(a, who));
    if (a->ld_k % 8 || a->ld_v % 8 || !al(a->k, 16) || !al(a->v, 16))
        return NIB_ERR(NIB_ERR_SHAPE, "%s: ld_k %lld and ld_v %lld must be multiples of 8 and k, v 16-byte aligned", who,
                       (long long)a->ld_k, (long long)a->ld_v);
    QkvParams p = {};
    NIB_RETURN_IF_ERR(set_cache(&p, a->cache, who));
    if (a->tokens == 0) return NIB_OK;
    const int hd = a->cache->head_dim;
    p.nq = 0;
    p.nkv = a->cache->n_kv_heads;
    p.hd = hd;
    p.half = hd / 2;
    p.tph = hd / 16;
    p.units = 2 * p.nkv * p.tph;
    p.rope = 0;
    p.n_valid = a->n_valid;
    p.ksrc = (const uint16_t *)a->k;
    p.vsrc = (const uint16_t *)a->v;
    p.ld_ks = a->ld_k;
    p.ld_vs = a->ld_v;
    p.slot_offset = a->slot_offset;
    p.slot_base = a->slot_base;
    return launch_qkv(p, a->tokens, stream);
}

nib_status nib_cuda_kv_read(const nib_kv_read_args *a, void *stream) {
    static const char *who = "kv read (cuda)";
    NIB_RETURN_IF_ERR(nib_kv_read_validate(a, who));
    const nib_kv_layer *c = a->cache;
    KvReadParams p;
    p.dt = (int)c->dtype;
    p.hd = c->head_dim;
    p.nkv = c->n_kv_heads;
    p.f32 = a->out_dtype == NIB_DTYPE_F32;
    p.v0 = (long long)a->slot0 * c->n_kv_heads;
    p.n = (long long)a->n_slots * c->n_kv_heads * c->head_dim;
    p.plane = (const uint8_t *)(a->which ? c->v : c->k);
    p.blk = a->which ? c->vb : c->kb;
    p.sc = a->which ? c->vs : c->ks;
    p.out = a->out;
    if (p.n == 0) return NIB_OK;
    long long blocks = (p.n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    NIB_CUDA_CHECK(nib::launch(k_kv_read, dim3((unsigned)blocks), dim3(256), 0, (cudaStream_t)stream, p));
    NIB_LAUNCH_CHECK("k_kv_read");
    return NIB_OK;
}
