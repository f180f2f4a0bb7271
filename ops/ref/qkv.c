/* qkv.c — reference fused QKV epilogue, plain KV-cache write and cache read-back (host float
 * activations, host cache planes): the spec of ops/qkv.h, composed of nib_ref_rope and the
 * formats/ quantizers (nib_fp8_quantize / nib_nvfp4_quantize on each 1 x head_dim vector), so
 * the cache holds exactly the bits formats/ defines. Also the shared argument checks and the
 * CUDA stubs of CPU-only builds. */
#include <math.h>
#include <string.h>

#include "formats/formats.h"
#include "ops/qkv.h"
#include "ops/rope.h"

static int is_pow2_in(int32_t v, int32_t lo, int32_t hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

static nib_status check_cache(const nib_kv_layer *c, int32_t nkv, int32_t hd, const char *who) {
    if ((unsigned)c->dtype >= NIB_KV_COUNT)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: cache dtype %d is not a nib_kv_dtype", who, (int)c->dtype);
    if (c->n_kv_heads != nkv || c->head_dim != hd)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: cache holds %d kv heads of dim %d, the op has %d of dim %d", who,
                       c->n_kv_heads, c->head_dim, nkv, hd);
    if (c->t_max < 0) return NIB_ERR(NIB_ERR_SHAPE, "%s: cache t_max %d", who, c->t_max);
    int ok = c->k && c->v;
    if (c->dtype == NIB_KV_FP8) ok = ok && c->ks && c->vs;
    if (c->dtype == NIB_KV_NVFP4) ok = ok && c->ks && c->vs && c->kb && c->vb;
    if (!ok)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: %s cache view has NULL planes (map it with nib_kv_layer_map)", who,
                       nib_kv_dtype_name(c->dtype));
    return NIB_OK;
}

/* static slot range: with no device/host base, slots [slot_offset, slot_offset + tokens) */
static nib_status check_slots(const nib_kv_layer *c, int64_t tokens, int32_t slot_offset, const int32_t *slot_base,
                              const char *who) {
    if (slot_base) return NIB_OK; /* checked when the base is known (reference) or skipped (GPU) */
    if (slot_offset < 0 || (int64_t)slot_offset + tokens > c->t_max)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: slots [%d, %lld) of %lld tokens outside the cache's [0, %d)", who,
                       slot_offset, (long long)slot_offset + tokens, (long long)tokens, c->t_max);
    return NIB_OK;
}

nib_status nib_qkv_validate(const nib_qkv_args *a, const char *who) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL args", who);
    if (a->tokens < 0 || a->tokens > INT32_MAX)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: tokens %lld outside [0, 2^31)", who, (long long)a->tokens);
    if (a->n_heads < 0 || a->n_kv_heads < 1 || a->n_heads > 4096 || a->n_kv_heads > 4096)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: %d query heads, %d kv heads (need >= 0 and >= 1)", who, a->n_heads,
                       a->n_kv_heads);
    if (!is_pow2_in(a->head_dim, 32, 512))
        return NIB_ERR(NIB_ERR_SHAPE, "%s: head_dim %d must be a power of two in [32, 512]", who, a->head_dim);
    const int64_t heads = (int64_t)a->n_heads + 2 * (int64_t)a->n_kv_heads;
    if (heads * (a->head_dim / 16) > 1024)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: (%d + 2 * %d) heads x %d dims need %lld threads per token (max 1024)", who,
                       a->n_heads, a->n_kv_heads, a->head_dim, (long long)(heads * (a->head_dim / 16)));
    if (!a->qkv) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: qkv is NULL", who);
    if (a->ld_qkv < heads * a->head_dim)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: ld_qkv %lld < (%d + 2 * %d) * %d", who, (long long)a->ld_qkv, a->n_heads,
                       a->n_kv_heads, a->head_dim);
    if (!a->q && !a->cache) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: no output (q and cache are both NULL)", who);
    if (a->q && a->n_heads < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: q given but n_heads is 0", who);
    if (a->q && a->ld_q < (int64_t)a->n_heads * a->head_dim)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: ld_q %lld < %d * %d", who, (long long)a->ld_q, a->n_heads, a->head_dim);
    if (!a->positions || !a->inv_freq)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: positions and inv_freq [head_dim/2] are required", who);
    if (!isfinite(a->q_scale))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: q_scale %g is not finite", who, (double)a->q_scale);
    if (a->pairs != 0 && a->pairs != 1)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: pairs %d (0: plain head order, 1: the pair layout)", who, a->pairs);
    if (a->done && a->tokens < 1) /* no CTA would add to it: whoever waits for it would wait forever */
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: a done counter needs at least one token (tokens %lld)", who,
                       (long long)a->tokens);
    if (a->cache) {
        NIB_RETURN_IF_ERR(check_cache(a->cache, a->n_kv_heads, a->head_dim, who));
        NIB_RETURN_IF_ERR(check_slots(a->cache, a->tokens, a->slot_offset, a->slot_base, who));
    }
    return NIB_OK;
}

nib_status nib_kv_write_validate(const nib_kv_write_args *a, const char *who) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL args", who);
    if (a->tokens < 0 || a->tokens > INT32_MAX)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: tokens %lld outside [0, 2^31)", who, (long long)a->tokens);
    if (!a->cache) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: cache is NULL", who);
    const int32_t nkv = a->cache->n_kv_heads, hd = a->cache->head_dim;
    if (!is_pow2_in(hd, 32, 512) || nkv < 1 || (int64_t)2 * nkv * (hd / 16) > 1024)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: cache of %d kv heads of dim %d (need dim a power of two in [32, 512] and "
                       "2 * heads * dim / 16 <= 1024)", who, nkv, hd);
    NIB_RETURN_IF_ERR(check_cache(a->cache, nkv, hd, who));
    if (!a->k || !a->v) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: k and v are required", who);
    if (a->ld_k < (int64_t)nkv * hd || a->ld_v < (int64_t)nkv * hd)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: ld_k %lld / ld_v %lld < %d * %d", who, (long long)a->ld_k,
                       (long long)a->ld_v, nkv, hd);
    return check_slots(a->cache, a->tokens, a->slot_offset, a->slot_base, who);
}

nib_status nib_kv_read_validate(const nib_kv_read_args *a, const char *who) {
    if (!a || !a->cache || !a->out) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL args, cache or out", who);
    const nib_kv_layer *c = a->cache;
    if (c->n_kv_heads < 1 || c->head_dim < 16 || c->head_dim % 16)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: cache of %d heads of dim %d", who, c->n_kv_heads, c->head_dim);
    NIB_RETURN_IF_ERR(check_cache(c, c->n_kv_heads, c->head_dim, who));
    if (a->which != 0 && a->which != 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: which %d (0 = K, 1 = V)", who, a->which);
    if (a->slot0 < 0 || a->n_slots < 0 || (int64_t)a->slot0 + a->n_slots > c->t_max)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: slots [%d, %lld) outside the cache's [0, %d)", who, a->slot0,
                       (long long)a->slot0 + a->n_slots, c->t_max);
    if (a->out_dtype != NIB_DTYPE_F32 && a->out_dtype != NIB_DTYPE_BF16)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: out_dtype %s (F32 or BF16)", who, nib_dtype_name(a->out_dtype));
    return NIB_OK;
}

/* ---- reference ---------------------------------------------------------------------------- */

static int64_t clamp_valid(int64_t n, const int32_t *n_valid) {
    if (!n_valid) return n;
    int64_t v = *n_valid;
    return v < 0 ? 0 : (v > n ? n : v);
}

/* One (slot, head) vector of K (which = 0) or V into the cache, in the cache's dtype. */
static nib_status store_vec(const nib_kv_layer *c, int which, int64_t slot, int32_t head, const float *x) {
    const int32_t hd = c->head_dim;
    const int64_t vec = slot * c->n_kv_heads + head;
    void *plane = which ? c->v : c->k;
    switch (c->dtype) {
    case NIB_KV_BF16: {
        uint16_t *p = (uint16_t *)plane + vec * hd;
        for (int32_t d = 0; d < hd; d++) p[d] = nib_f32_to_bf16(x[d]);
        return NIB_OK;
    }
    case NIB_KV_FP8:
        return nib_fp8_quantize(x, 1, hd, 1, (uint8_t *)plane + vec * hd, (which ? c->vs : c->ks) + vec);
    default:
        return nib_nvfp4_quantize(x, 1, hd, (uint8_t *)plane + vec * (hd / 2), (which ? c->vb : c->kb) + vec * (hd / 16),
                                  (which ? c->vs : c->ks) + vec);
    }
}

static nib_status slot_start(const nib_kv_layer *c, int64_t tokens, int32_t slot_offset, const int32_t *slot_base,
                             const char *who, int64_t *s0) {
    *s0 = (int64_t)slot_offset + (slot_base ? *slot_base : 0);
    if (tokens > 0 && (*s0 < 0 || *s0 + tokens > c->t_max))
        return NIB_ERR(NIB_ERR_SHAPE, "%s: slots [%lld, %lld) outside the cache's [0, %d)", who, (long long)*s0,
                       (long long)(*s0 + tokens), c->t_max);
    return NIB_OK;
}

nib_status nib_ref_qkv(const nib_qkv_args *a) {
    static const char *who = "qkv epilogue (ref)";
    nib_status st = NIB_OK;
    NIB_RETURN_IF_ERR(nib_qkv_validate(a, who));
    const int64_t tokens = clamp_valid(a->tokens, a->n_valid);
    const int32_t nh = a->n_heads, nkv = a->n_kv_heads, hd = a->head_dim;
    int64_t s0 = 0;
    if (a->cache) NIB_RETURN_IF_ERR(slot_start(a->cache, tokens, a->slot_offset, a->slot_base, who, &s0));
    const int32_t most = nh > nkv ? nh : nkv;
    const int64_t width = ((int64_t)nh + 2 * nkv) * hd;
    float *tmp = nib_malloc((size_t)most * hd * sizeof(float));
    float *plain = a->pairs ? nib_malloc((size_t)width * sizeof(float)) : NULL;
    if (!tmp || (a->pairs && !plain)) {
        nib_free(tmp);
        return NIB_ERR_OUT_OF_MEMORY;
    }
    for (int64_t t = 0; t < tokens && !st; t++) {
        const float *row = (const float *)a->qkv + t * a->ld_qkv;
        if (a->pairs) { /* the pair layout (ops/qkv.h) back to each head's plain dim order */
            const int32_t half = hd / 2;
            for (int64_t h = 0; h < width / hd; h++)
                for (int32_t e = 0; e < hd; e++) {
                    const int32_t j = e / 16, i = e % 16;
                    plain[h * hd + (i < 8 ? 8 * j + i : half + 8 * j + i - 8)] = row[h * hd + e];
                }
            row = plain;
        }
        nib_rope_args r;
        memset(&r, 0, sizeof r);
        r.style = NIB_ROPE_HALF;
        r.tokens = 1;
        r.head_dim = hd;
        r.rot_dim = hd;
        r.positions = a->positions + t;
        r.inv_freq = a->inv_freq;
        r.x = tmp;
        if (a->q) {
            memcpy(tmp, row, (size_t)nh * hd * sizeof(float));
            r.n_heads = nh;
            r.ld = (int64_t)nh * hd;
            st = nib_ref_rope(&r);
            if (st) break;
            float *q = (float *)a->q + t * a->ld_q;
            for (int64_t i = 0; i < (int64_t)nh * hd; i++) q[i] = tmp[i] * a->q_scale;
        }
        if (a->cache) {
            memcpy(tmp, row + (int64_t)nh * hd, (size_t)nkv * hd * sizeof(float));
            r.n_heads = nkv;
            r.ld = (int64_t)nkv * hd;
            st = nib_ref_rope(&r);
            const float *v = row + (int64_t)(nh + nkv) * hd;
            for (int32_t h = 0; h < nkv && !st; h++) st = store_vec(a->cache, 0, s0 + t, h, tmp + (int64_t)h * hd);
            for (int32_t h = 0; h < nkv && !st; h++) st = store_vec(a->cache, 1, s0 + t, h, v + (int64_t)h * hd);
        }
        if (st) nib_error_context(st, "%s, token %lld", who, (long long)t);
    }
    nib_free(tmp);
    nib_free(plain);
    return st;
}

nib_status nib_ref_kv_write(const nib_kv_write_args *a) {
    static const char *who = "kv write (ref)";
    nib_status st = NIB_OK;
    NIB_RETURN_IF_ERR(nib_kv_write_validate(a, who));
    const int64_t tokens = clamp_valid(a->tokens, a->n_valid);
    const int32_t nkv = a->cache->n_kv_heads, hd = a->cache->head_dim;
    int64_t s0 = 0;
    NIB_RETURN_IF_ERR(slot_start(a->cache, tokens, a->slot_offset, a->slot_base, who, &s0));
    for (int64_t t = 0; t < tokens && !st; t++) {
        const float *k = (const float *)a->k + t * a->ld_k, *v = (const float *)a->v + t * a->ld_v;
        for (int32_t h = 0; h < nkv && !st; h++) st = store_vec(a->cache, 0, s0 + t, h, k + (int64_t)h * hd);
        for (int32_t h = 0; h < nkv && !st; h++) st = store_vec(a->cache, 1, s0 + t, h, v + (int64_t)h * hd);
        if (st) nib_error_context(st, "%s, token %lld", who, (long long)t);
    }
    return st;
}

nib_status nib_ref_kv_read(const nib_kv_read_args *a) {
    static const char *who = "kv read (ref)";
    NIB_RETURN_IF_ERR(nib_kv_read_validate(a, who));
    if (a->out_dtype != NIB_DTYPE_F32)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: the reference reads back as F32 only", who);
    const nib_kv_layer *c = a->cache;
    const int32_t hd = c->head_dim;
    const int64_t nvec = (int64_t)a->n_slots * c->n_kv_heads, v0 = (int64_t)a->slot0 * c->n_kv_heads;
    const void *plane = a->which ? c->v : c->k;
    float *out = (float *)a->out;
    for (int64_t i = 0; i < nvec; i++) {
        const int64_t vec = v0 + i;
        float *o = out + i * hd;
        switch (c->dtype) {
        case NIB_KV_BF16:
            for (int32_t d = 0; d < hd; d++) o[d] = nib_bf16_to_f32(((const uint16_t *)plane)[vec * hd + d]);
            break;
        case NIB_KV_FP8:
            NIB_RETURN_IF_ERR(nib_fp8_dequantize((const uint8_t *)plane + vec * hd, (a->which ? c->vs : c->ks) + vec, 1,
                                                 hd, 1, o));
            break;
        default:
            NIB_RETURN_IF_ERR(nib_nvfp4_dequantize((const uint8_t *)plane + vec * (hd / 2),
                                                   (a->which ? c->vb : c->kb) + vec * (hd / 16),
                                                   (a->which ? c->vs : c->ks)[vec], 1, hd, o));
            break;
        }
    }
    return NIB_OK;
}

#ifndef NIB_HAVE_CUDA
#define NO_CUDA_MSG "this nib build has no CUDA backend (NO_CUDA=1 or no nvcc)"
nib_status nib_cuda_qkv(const nib_qkv_args *a, void *stream) {
    (void)a;
    (void)stream;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "qkv epilogue: " NO_CUDA_MSG);
}
nib_status nib_cuda_kv_write(const nib_kv_write_args *a, void *stream) {
    (void)a;
    (void)stream;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "kv write: " NO_CUDA_MSG);
}
nib_status nib_cuda_kv_read(const nib_kv_read_args *a, void *stream) {
    (void)a;
    (void)stream;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "kv read: " NO_CUDA_MSG);
}
nib_status nib_cuda_rope_table(const int32_t *positions, const float *inv_freq, int64_t tokens, int32_t head_dim,
                               void *out, void *stream) {
    (void)positions, (void)inv_freq, (void)tokens, (void)head_dim, (void)out, (void)stream;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "rope table: " NO_CUDA_MSG);
}
#endif
