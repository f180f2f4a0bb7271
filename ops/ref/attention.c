/* attention.c — reference attention (ops/attention.h): the spec the CUDA kernels are tested
 * against.
 *
 * For each (sequence, KV head) the query rows of that KV group (row r = token r / group, query
 * head kvh * group + r % group) are loaded into fp64 once; the keys are then visited in blocks
 * of REF_KB, dequantized exactly into fp64 (cache formats via formats/), and every row runs an
 * online softmax over the blocks:
 *     m' = max(m, max_j s_j),  l' = l e^(m - m') + sum_j e^(s_j - m'),
 *     acc' = acc e^(m - m') + sum_j e^(s_j - m') v_j,      o = acc / l   (o = 0 when l = 0)
 * with s_j = q . k_j in fp64. No S x S matrix exists; memory is O(rows x head_dim + REF_KB x
 * head_dim). o is stored as float. Slow and simple: it is the spec, not a fast path.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "formats/formats.h"
#include "ops/attention.h"

#define REF_KB 64 /* keys per online-softmax block */

typedef void (*ref_kv_fn)(const void *ctx, int64_t key, int d, double *k, double *v);

/* rows [r0, r1) of ref_attend: their own key / value blocks, so row chunks run on threads side by
 * side; each row's operations and their order do not depend on the chunking */
typedef struct ref_attend_job {
    int d;
    const double *q;
    int64_t n_keys;
    ref_kv_fn load;
    const void *ctx;
    double *out;
    int failed; /* host allocation failed in some chunk */
} ref_attend_job;
static void ref_attend_rows(void *jp, int64_t r0, int64_t r1) {
    ref_attend_job *j = (ref_attend_job *)jp;
    const int d = j->d;
    const int64_t rows = r1 - r0;
    double s[REF_KB];
    double *kb = nib_malloc((size_t)REF_KB * d * sizeof(double));
    double *vb = nib_malloc((size_t)REF_KB * d * sizeof(double));
    double *m = nib_malloc((size_t)(rows ? rows : 1) * sizeof(double));
    double *l = nib_malloc((size_t)(rows ? rows : 1) * sizeof(double));
    if (!kb || !vb || !m || !l) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        goto done;
    }
    for (int64_t r = 0; r < rows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0;
    }
    memset(j->out + (size_t)r0 * d, 0, (size_t)rows * d * sizeof(double));
    for (int64_t j0 = 0; j0 < j->n_keys; j0 += REF_KB) {
        int nb = (int)(j->n_keys - j0 < REF_KB ? j->n_keys - j0 : REF_KB);
        for (int jj = 0; jj < nb; jj++) j->load(j->ctx, j0 + jj, d, kb + (size_t)jj * d, vb + (size_t)jj * d);
        for (int64_t r = 0; r < rows; r++) {
            const double *qr = j->q + (size_t)(r0 + r) * d;
            double *acc = j->out + (size_t)(r0 + r) * d;
            double bm = -INFINITY;
            for (int jj = 0; jj < nb; jj++) {
                const double *kj = kb + (size_t)jj * d;
                double dot = 0.0;
                for (int c = 0; c < d; c++) dot += qr[c] * kj[c];
                s[jj] = dot;
                if (dot > bm) bm = dot;
            }
            double mn = m[r] > bm ? m[r] : bm;
            if (isnan(bm)) mn = bm; /* NaN input: let it show in the output */
            double alpha = m[r] == -INFINITY ? 0.0 : exp(m[r] - mn);
            l[r] *= alpha;
            for (int c = 0; c < d; c++) acc[c] *= alpha;
            for (int jj = 0; jj < nb; jj++) {
                double p = exp(s[jj] - mn);
                const double *vj = vb + (size_t)jj * d;
                l[r] += p;
                for (int c = 0; c < d; c++) acc[c] += p * vj[c];
            }
            m[r] = mn;
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        double *acc = j->out + (size_t)(r0 + r) * d;
        double inv = l[r] > 0.0 ? 1.0 / l[r] : 0.0;
        for (int c = 0; c < d; c++) acc[c] = l[r] > 0.0 ? acc[c] * inv : (isnan(l[r]) ? NAN : 0.0);
    }
done:
    nib_free(kb);
    nib_free(vb);
    nib_free(m);
    nib_free(l);
}

/* rows x d queries q (fp64) attend to n_keys keys from load() (which must be safe to call from
 * several threads: it only reads); out[rows][d] (fp64). Large calls run row chunks on threads. */
static nib_status ref_attend(int64_t rows, int d, const double *q, int64_t n_keys, ref_kv_fn load,
                             const void *ctx, double *out) {
    ref_attend_job j = {d, q, n_keys, load, ctx, out, 0};
    /* at least ~4 M multiply-adds per chunk, so a thread's start-up is a small part of it */
    const int64_t per_row = (n_keys > 0 ? n_keys : 1) * (int64_t)d * 2;
    int64_t min_rows = ((int64_t)1 << 22) / per_row;
    if (min_rows < 8) min_rows = 8;
    if (rows <= min_rows) ref_attend_rows(&j, 0, rows);
    else nib_parallel_for(rows, 0, min_rows, ref_attend_rows, &j);
    return j.failed ? NIB_ERR_OUT_OF_MEMORY : NIB_OK;
}

/* Reads a valid-length int: NULL -> dflt; must lie in [0, max]. */
static nib_status read_len(const int32_t *p, int32_t dflt, int32_t max, const char *what, int32_t *out) {
    int32_t v = p ? *p : dflt;
    if (v < 0 || v > max) return NIB_ERR(NIB_ERR_INVALID_ARG, "ref attention: %s = %d outside [0, %d]", what, v, max);
    *out = v;
    return NIB_OK;
}

/* ---- prefix ---------------------------------------------------------------------------- */

typedef struct prefix_kv_ctx {
    const float *k, *v; /* already offset to (sequence, KV head) */
    int64_t k_tok, v_tok;
} prefix_kv_ctx;

static void prefix_load(const void *c, int64_t key, int d, double *k, double *v) {
    const prefix_kv_ctx *x = (const prefix_kv_ctx *)c;
    const float *kr = x->k + key * x->k_tok, *vr = x->v + key * x->v_tok;
    for (int i = 0; i < d; i++) {
        k[i] = kr[i];
        v[i] = vr[i];
    }
}

static nib_status check_heads(int32_t n_heads, int32_t n_kv, int32_t d) {
    if (n_heads < 1 || n_kv < 1 || d < 1 || n_heads % n_kv)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention: %d heads, %d KV heads (must divide), head_dim %d",
                       n_heads, n_kv, d);
    return NIB_OK;
}

nib_status nib_ref_attn_prefix(const nib_attn_prefix_args *a) {
    if (!a || !a->q || !a->k || !a->v || !a->o) return NIB_ERR(NIB_ERR_INVALID_ARG, "ref attention prefix: NULL argument");
    NIB_RETURN_IF_ERR(check_heads(a->n_heads, a->n_kv_heads, a->head_dim));
    if (a->n_seq < 1 || a->s_max < 1)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "ref attention prefix: n_seq %d, s_max %d", a->n_seq, a->s_max);
    const int64_t d = a->head_dim, hq = (int64_t)a->n_heads * d, hkv = (int64_t)a->n_kv_heads * d;
    if (a->q_tok < hq || a->o_tok < hq || a->k_tok < hkv || a->v_tok < hkv || a->q_seq < 0 || a->k_seq < 0 ||
        a->v_seq < 0 || a->o_seq < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG,
                       "ref attention prefix: token strides q %lld k %lld v %lld o %lld must cover the heads "
                       "(%lld / %lld), sequence strides >= 0",
                       (long long)a->q_tok, (long long)a->k_tok, (long long)a->v_tok, (long long)a->o_tok,
                       (long long)hq, (long long)hkv);
    if (!(a->logit_scale >= 0.0f && a->logit_scale <= FLT_MAX))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "ref attention prefix: logit_scale %g (finite, >= 0; 0 = none)",
                       (double)a->logit_scale);
    const double lsc = a->logit_scale > 0.0f ? (double)a->logit_scale : 1.0;
    int32_t sv = 0, nsv = 0;
    NIB_RETURN_IF_ERR(read_len(a->s_valid, a->s_max, a->s_max, "s_valid", &sv));
    NIB_RETURN_IF_ERR(read_len(a->n_seq_valid, a->n_seq, a->n_seq, "n_seq_valid", &nsv));
    const int group = a->n_heads / a->n_kv_heads;
    const int64_t rows = (int64_t)sv * group;
    nib_status st = NIB_OK;
    double *q = nib_malloc((size_t)(rows ? rows : 1) * d * sizeof(double));
    double *out = nib_malloc((size_t)(rows ? rows : 1) * d * sizeof(double));
    if (!q || !out) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (int32_t n = 0; n < nsv; n++) {
        const float *qs = (const float *)a->q + n * a->q_seq;
        float *os = (float *)a->o + n * a->o_seq;
        for (int32_t g = 0; g < a->n_kv_heads; g++) {
            for (int64_t r = 0; r < rows; r++) {
                const float *qr = qs + (r / group) * a->q_tok + ((int64_t)g * group + r % group) * d;
                for (int64_t c = 0; c < d; c++) q[r * d + c] = qr[c] * lsc;
            }
            prefix_kv_ctx ctx = {(const float *)a->k + n * a->k_seq + g * d, (const float *)a->v + n * a->v_seq + g * d,
                                 a->k_tok, a->v_tok};
            NIB_TRY(ref_attend(rows, (int)d, q, sv, prefix_load, &ctx, out));
            for (int64_t r = 0; r < rows; r++) {
                float *orow = os + (r / group) * a->o_tok + ((int64_t)g * group + r % group) * d;
                for (int64_t c = 0; c < d; c++) orow[c] = (float)out[r * d + c];
            }
        }
    }
fail:
    nib_free(q);
    nib_free(out);
    return st;
}

/* ---- cache ------------------------------------------------------------------------------ */

typedef struct cache_kv_ctx {
    const nib_kv_layer *kv;
    int32_t g; /* KV head */
} cache_kv_ctx;

/* Exact dequantization of one stored vector (token key, KV head g) of a K or V plane. */
static void cache_vec(const nib_kv_layer *kv, const void *plane, const uint8_t *bs, const float *sc, int64_t key,
                      int32_t g, int d, double *out) {
    const int64_t vec = key * kv->n_kv_heads + g;
    switch (kv->dtype) {
    case NIB_KV_BF16: {
        const uint16_t *e = (const uint16_t *)plane + vec * d;
        for (int i = 0; i < d; i++) out[i] = nib_bf16_to_f32(e[i]);
        break;
    }
    case NIB_KV_FP8: {
        const uint8_t *e = (const uint8_t *)plane + vec * d;
        double s = sc[vec];
        for (int i = 0; i < d; i++) out[i] = (double)nib_e4m3_to_f32(e[i]) * s;
        break;
    }
    default: { /* NVFP4 */
        const uint8_t *e = (const uint8_t *)plane + vec * (d / 2);
        const uint8_t *b = bs + vec * (d / 16);
        double s = sc[vec];
        for (int i = 0; i < d; i++)
            out[i] = (double)nib_e2m1_to_f32(nib_u4_get(e, i)) * (double)nib_e4m3_to_f32(b[i / 16]) * s;
        break;
    }
    }
}

static void cache_load(const void *c, int64_t key, int d, double *k, double *v) {
    const cache_kv_ctx *x = (const cache_kv_ctx *)c;
    cache_vec(x->kv, x->kv->k, x->kv->kb, x->kv->ks, key, x->g, d, k);
    cache_vec(x->kv, x->kv->v, x->kv->vb, x->kv->vs, key, x->g, d, v);
}

nib_status nib_ref_attn_cache(const nib_attn_cache_args *a) {
    if (!a || !a->q || !a->o || !a->t_valid) return NIB_ERR(NIB_ERR_INVALID_ARG, "ref attention cache: NULL argument");
    const nib_kv_layer *kv = &a->kv;
    if ((unsigned)kv->dtype >= NIB_KV_COUNT || !kv->k || !kv->v ||
        (kv->dtype != NIB_KV_BF16 && (!kv->ks || !kv->vs)) || (kv->dtype == NIB_KV_NVFP4 && (!kv->kb || !kv->vb)))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "ref attention cache: %s cache with missing planes",
                       nib_kv_dtype_name(kv->dtype));
    NIB_RETURN_IF_ERR(check_heads(a->n_heads, kv->n_kv_heads, kv->head_dim));
    if (kv->head_dim % 16)
        return NIB_ERR(NIB_ERR_SHAPE, "ref attention cache: head_dim %d is not a multiple of 16", kv->head_dim);
    if (a->nq < 1 || kv->t_max < 0) return NIB_ERR(NIB_ERR_INVALID_ARG, "ref attention cache: nq %d, t_max %d", a->nq, kv->t_max);
    const int64_t d = kv->head_dim, hq = (int64_t)a->n_heads * d;
    if (a->q_tok < hq || a->o_tok < hq)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "ref attention cache: q_tok %lld / o_tok %lld < %lld", (long long)a->q_tok,
                       (long long)a->o_tok, (long long)hq);
    int32_t tv = 0, nqv = 0;
    NIB_RETURN_IF_ERR(read_len(a->t_valid, kv->t_max, kv->t_max, "t_valid", &tv));
    NIB_RETURN_IF_ERR(read_len(a->nq_valid, a->nq, a->nq, "nq_valid", &nqv));
    const int group = a->n_heads / kv->n_kv_heads;
    const int64_t rows = (int64_t)nqv * group;
    nib_status st = NIB_OK;
    double *q = nib_malloc((size_t)(rows ? rows : 1) * d * sizeof(double));
    double *out = nib_malloc((size_t)(rows ? rows : 1) * d * sizeof(double));
    if (!q || !out) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (int32_t g = 0; g < kv->n_kv_heads; g++) {
        for (int64_t r = 0; r < rows; r++) {
            const float *qr = (const float *)a->q + (r / group) * a->q_tok + ((int64_t)g * group + r % group) * d;
            for (int64_t c = 0; c < d; c++) q[r * d + c] = qr[c];
        }
        cache_kv_ctx ctx = {kv, g};
        NIB_TRY(ref_attend(rows, (int)d, q, tv, cache_load, &ctx, out));
        for (int64_t r = 0; r < rows; r++) {
            float *orow = (float *)a->o + (r / group) * a->o_tok + ((int64_t)g * group + r % group) * d;
            for (int64_t c = 0; c < d; c++) orow[c] = (float)out[r * d + c];
        }
    }
fail:
    nib_free(q);
    nib_free(out);
    return st;
}

/* ---- CPU-only builds: the CUDA entry points exist and say there is no device --------------
 * (ops/cuda/attention.cu defines them when the build has CUDA.) */
#ifndef NIB_HAVE_CUDA
#define NO_CUDA_ATTN NIB_ERR(NIB_ERR_NO_DEVICE, "attention: this nib build has no CUDA backend")
nib_status nib_cuda_attn_prefix(const nib_attn_prefix_args *a, void *ws, void *stream) {
    (void)a, (void)ws, (void)stream;
    return NO_CUDA_ATTN;
}
nib_status nib_cuda_attn_cache(const nib_attn_cache_args *a, void *ws, void *stream) {
    (void)a, (void)ws, (void)stream;
    return NO_CUDA_ATTN;
}
long long nib_cuda_attn_lens_early_launches(void) { return 0; }
nib_status nib_cuda_attn_prefix_ws_bytes(const nib_attn_prefix_args *a, uint64_t *bytes) {
    (void)a;
    if (bytes) *bytes = 0;
    return NO_CUDA_ATTN;
}
nib_status nib_cuda_attn_cache_ws_bytes(const nib_attn_cache_args *a, uint64_t *bytes) {
    (void)a;
    if (bytes) *bytes = 0;
    return NO_CUDA_ATTN;
}
nib_status nib_cuda_attn_prefix_plan(const nib_attn_prefix_args *a, nib_attn_plan *p) {
    (void)a;
    if (p) memset(p, 0, sizeof *p);
    return NO_CUDA_ATTN;
}
nib_status nib_cuda_attn_cache_plan(const nib_attn_cache_args *a, nib_attn_plan *p) {
    (void)a;
    if (p) memset(p, 0, sizeof *p);
    return NO_CUDA_ATTN;
}
#endif
