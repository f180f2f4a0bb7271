/* test_attention_ref.c — the reference attention (ops/ref/attention.c) against a naive fp64
 * softmax(Q K^T) V, plus hand cases and the split-KV range rule shared with the CUDA kernels.
 *
 * The naive attention here is deliberately different code: contiguous fp64 copies of q, k, v
 * gathered with the layout formulas written out in this file, a full logits row per query, a
 * two-pass softmax; low-bit caches are dequantized with formats/' own dequantizers.
 *
 * Threshold (per element), derived: the reference computes in fp64 and stores float, so
 *     |o_ref - o_naive| <= 2^-24 |o_naive| (final rounding to float)
 *                        + e_in * (2 * maxqk + 1) * A   (naive inputs rounded to float, below)
 *                        + (2 * D * maxqk + 4 * T + 16) * 2^-53 * A   (fp64 arithmetic)
 * where A = sum_j p_j |v_jd| (the size of the terms of o), maxqk = max_j sum_d |q_d k_jd|
 * (a logit error e changes p_j by a factor e^(+-e), i.e. o by <= 2e A), and e_in = 2^-24 when
 * the naive path dequantizes through formats/ into float (FP8: e4m3 * scale rounded to float;
 * NVFP4: (e2m1 * e4m3) * global rounded to float), 0 when its inputs are the exact values.
 */
#include <math.h>
#include <string.h>

#include "formats/formats.h"
#include "harness.h"
#include "ops/attention.h"

#define SENTINEL 0x7FC0DEADu /* float NaN with a payload: outputs that must stay untouched */

static float sentinel(void) {
    float f;
    uint32_t u = SENTINEL;
    memcpy(&f, &u, 4);
    return f;
}
static int is_sentinel(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u == SENTINEL;
}

/* Naive fp64 attention of R rows over T keys (contiguous [R][D], [T][D]). o[R][D]; A[R][D] =
 * sum_j p_j |v_jd|; maxqk[R] = max_j sum_d |q_d k_jd|. T = 0 gives o = 0. */
static void naive_attn(const double *q, int64_t R, const double *k, const double *v, int64_t T, int D, double *o,
                       double *A, double *maxqk) {
    double *s = nib_malloc((size_t)(T ? T : 1) * sizeof(double));
    if (!s) return;
    for (int64_t r = 0; r < R; r++) {
        const double *qr = q + r * D;
        double mx = -INFINITY, mq = 0;
        for (int64_t j = 0; j < T; j++) {
            double d = 0, a = 0;
            for (int c = 0; c < D; c++) {
                d += qr[c] * k[j * D + c];
                a += fabs(qr[c] * k[j * D + c]);
            }
            s[j] = d;
            mx = d > mx ? d : mx;
            mq = a > mq ? a : mq;
        }
        double l = 0;
        for (int64_t j = 0; j < T; j++) {
            s[j] = exp(s[j] - mx);
            l += s[j];
        }
        for (int c = 0; c < D; c++) {
            double acc = 0, aa = 0;
            for (int64_t j = 0; j < T; j++) {
                acc += s[j] * v[j * D + c];
                aa += s[j] * fabs(v[j * D + c]);
            }
            o[r * D + c] = T ? acc / l : 0.0;
            A[r * D + c] = T ? aa / l : 0.0;
        }
        maxqk[r] = mq;
    }
    nib_free(s);
}

/* Compares one output row (float, strided in memory) with the naive row; returns violations. */
static int check_row(nib_test_ctx *t, const char *what, const float *got, const double *o, const double *A,
                     double maxqk, int D, int64_t T, double e_in, int64_t row) {
    int bad = 0;
    for (int c = 0; c < D; c++) {
        double tol = 0x1p-24 * fabs(o[c]) * 1.0001 + e_in * (2 * maxqk + 1) * A[c] +
                     (2.0 * D * maxqk + 4.0 * (double)T + 16) * 0x1p-53 * A[c] + 1e-300;
        double err = fabs((double)got[c] - o[c]);
        if (!(err <= tol)) {
            if (bad < 3)
                nib_test_fail(t, __FILE__, __LINE__, "%s row %lld dim %d: ref %.9g naive %.9g err %.3g tol %.3g", what,
                              (long long)row, c, got[c], o[c], err, tol);
            bad++;
        }
    }
    return bad;
}

/* ---- split ranges ------------------------------------------------------------------------ */

NIB_TEST(attn_ref_split_ranges) {
    const int32_t ts[] = {0, 1, 2, 15, 16, 17, 31, 32, 33, 100, 542, 1000, 4097, 32768};
    const int32_t ns[] = {1, 2, 3, 7, 64, 132, 256, 512};
    const int32_t tks[] = {16, 32, 64};
    int bad = 0;
    for (size_t a = 0; a < NIB_ARRAY_LEN(ts); a++)
        for (size_t b = 0; b < NIB_ARRAY_LEN(ns); b++)
            for (size_t c = 0; c < NIB_ARRAY_LEN(tks); c++) {
                int32_t T = ts[a], n = ns[b], tk = tks[c], t0, t1;
                int32_t na = nib_attn_split_range(T, n, tk, 0, &t0, &t1);
                if (na < 1 || na > n) bad++;
                int32_t next = 0;
                for (int32_t s = 0; s < n; s++) {
                    int32_t x = nib_attn_split_range(T, n, tk, s, &t0, &t1);
                    if (x != na) bad++;
                    if (s < na) { /* active: contiguous, non-empty (unless T = 0), tile-aligned start */
                        if (t0 != next || (T > 0 && t1 <= t0) || t0 % tk) bad++;
                        if (s + 1 < na && (t1 - t0) % tk) bad++; /* whole tiles except the last */
                        next = t1;
                    } else if (t0 != T || t1 != T) { /* inactive splits are empty */
                        bad++;
                    }
                }
                if (next != T) bad++; /* the active splits cover [0, T) exactly */
                /* balance: no split holds more than ceil(T / n) + tk - 1 keys */
                for (int32_t s = 0; s < na; s++) {
                    nib_attn_split_range(T, n, tk, s, &t0, &t1);
                    if (t1 - t0 > (T + n - 1) / n + tk - 1) bad++;
                }
            }
    CHECK_MSG(bad == 0, "%d split-range rule violations", bad);
}

/* ---- prefix --------------------------------------------------------------------------------- */

typedef struct prefix_case {
    int32_t n_seq, s_max, s_valid, nsv, n_heads, n_kv, d;
    int fused; /* q|k|v in one row per token (else separate buffers with padded strides) */
} prefix_case;

typedef struct prefix_buf {
    nib_attn_prefix_args a;
    float *qkv, *kb, *vb, *o;
    size_t qkv_n, k_n, v_n, o_n;
    int32_t sv, nsv;
} prefix_buf;

static void prefix_free(prefix_buf *b) {
    nib_free(b->qkv);
    nib_free(b->kb);
    nib_free(b->vb);
    nib_free(b->o);
    memset(b, 0, sizeof *b);
}

/* Random N(0,1) q (times D^-0.5), k, v in the case's layout; o filled with the sentinel. */
static int prefix_make(nib_rng *r, const prefix_case *c, prefix_buf *b) {
    memset(b, 0, sizeof *b);
    const int64_t D = c->d, hq = (int64_t)c->n_heads * D, hk = (int64_t)c->n_kv * D;
    nib_attn_prefix_args *a = &b->a;
    a->n_seq = c->n_seq;
    a->s_max = c->s_max;
    a->n_heads = c->n_heads;
    a->n_kv_heads = c->n_kv;
    a->head_dim = c->d;
    b->sv = c->s_valid;
    b->nsv = c->nsv;
    a->s_valid = &b->sv;
    a->n_seq_valid = &b->nsv;
    a->o_tok = hq + 3; /* padding between tokens must stay untouched */
    a->o_seq = a->o_tok * c->s_max + 5;
    b->o_n = (size_t)a->o_seq * c->n_seq;
    if (c->fused) {
        int64_t row = hq + 2 * hk;
        b->qkv_n = (size_t)row * c->s_max * c->n_seq;
        b->qkv = nib_malloc(b->qkv_n * 4);
        if (!b->qkv) return 0;
        a->q = b->qkv;
        a->k = b->qkv + hq;
        a->v = b->qkv + hq + hk;
        a->q_tok = a->k_tok = a->v_tok = row;
        a->q_seq = a->k_seq = a->v_seq = row * c->s_max;
        for (size_t i = 0; i < b->qkv_n; i++) {
            int64_t col = (int64_t)(i % (size_t)row);
            double x = nib_rng_normal(r);
            b->qkv[i] = (float)(col < hq ? x / sqrt((double)D) : x);
        }
    } else {
        a->q_tok = hq + 8;
        a->k_tok = hk + 16;
        a->v_tok = hk;
        a->q_seq = a->q_tok * c->s_max;
        a->k_seq = a->k_tok * c->s_max + 7;
        a->v_seq = a->v_tok * c->s_max;
        b->qkv_n = (size_t)a->q_seq * c->n_seq;
        b->k_n = (size_t)a->k_seq * c->n_seq;
        b->v_n = (size_t)a->v_seq * c->n_seq;
        b->qkv = nib_malloc(b->qkv_n * 4);
        b->kb = nib_malloc(b->k_n * 4);
        b->vb = nib_malloc(b->v_n * 4);
        if (!b->qkv || !b->kb || !b->vb) return 0;
        for (size_t i = 0; i < b->qkv_n; i++) b->qkv[i] = (float)(nib_rng_normal(r) / sqrt((double)D));
        for (size_t i = 0; i < b->k_n; i++) b->kb[i] = (float)nib_rng_normal(r);
        for (size_t i = 0; i < b->v_n; i++) b->vb[i] = (float)nib_rng_normal(r);
        a->q = b->qkv;
        a->k = b->kb;
        a->v = b->vb;
    }
    b->o = nib_malloc(b->o_n * 4);
    if (!b->o) return 0;
    for (size_t i = 0; i < b->o_n; i++) b->o[i] = sentinel();
    a->o = b->o;
    return 1;
}

/* Checks b->o against the naive attention; returns the number of bad values. */
static int prefix_check(nib_test_ctx *t, const prefix_buf *b, const char *what) {
    const nib_attn_prefix_args *a = &b->a;
    const int D = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int64_t S = b->sv;
    int bad = 0;
    double *q = nib_malloc((size_t)(S ? S : 1) * D * 8), *k = nib_malloc((size_t)(S ? S : 1) * D * 8);
    double *v = nib_malloc((size_t)(S ? S : 1) * D * 8), *o = nib_malloc((size_t)(S ? S : 1) * D * 8);
    double *A = nib_malloc((size_t)(S ? S : 1) * D * 8), *mq = nib_malloc((size_t)(S ? S : 1) * 8);
    if (!q || !k || !v || !o || !A || !mq) {
        bad = 1;
        goto done;
    }
    for (int32_t n = 0; n < a->n_seq; n++)
        for (int32_t h = 0; h < a->n_heads; h++) {
            const int32_t g = h / group;
            for (int64_t i = 0; i < S; i++)
                for (int c = 0; c < D; c++) {
                    q[i * D + c] = ((const float *)a->q)[n * a->q_seq + i * a->q_tok + (int64_t)h * D + c];
                    k[i * D + c] = ((const float *)a->k)[n * a->k_seq + i * a->k_tok + (int64_t)g * D + c];
                    v[i * D + c] = ((const float *)a->v)[n * a->v_seq + i * a->v_tok + (int64_t)g * D + c];
                }
            naive_attn(q, S, k, v, S, D, o, A, mq);
            for (int64_t i = 0; i < a->s_max; i++) {
                const float *got = b->o + n * a->o_seq + i * a->o_tok + (int64_t)h * D;
                if (n < b->nsv && i < S) {
                    bad += check_row(t, what, got, o + i * D, A + i * D, mq[i], D, S, 0.0, i);
                } else {
                    for (int c = 0; c < D; c++) bad += !is_sentinel(got[c]);
                }
            }
        }
    /* padding between tokens and sequences is never written */
    for (int32_t n = 0; n < a->n_seq; n++)
        for (int64_t i = 0; i < a->o_seq; i++) {
            int64_t tok = i / a->o_tok, col = i % a->o_tok;
            if (tok >= a->s_max || col >= (int64_t)a->n_heads * D) bad += !is_sentinel(b->o[n * a->o_seq + i]);
        }
done:
    nib_free(q);
    nib_free(k);
    nib_free(v);
    nib_free(o);
    nib_free(A);
    nib_free(mq);
    return bad;
}

NIB_TEST(attn_ref_prefix_vs_naive) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const prefix_case cases[] = {
        {1, 1, 1, 1, 8, 1, 256, 1},  /* one token attends to itself */
        {2, 17, 13, 2, 8, 1, 64, 1}, /* MQA, fused QKV, valid < max */
        {3, 40, 40, 2, 4, 4, 72, 0}, /* MHA, SigLIP head_dim, third sequence not computed */
        {1, 70, 65, 1, 8, 2, 32, 1}, /* GQA, more than one key block of 64 */
        {2, 130, 129, 2, 2, 1, 16, 0},
        {1, 5, 0, 1, 2, 1, 16, 1},   /* no valid tokens: nothing written */
    };
    for (size_t i = 0; i < NIB_ARRAY_LEN(cases); i++) {
        prefix_buf b;
        REQUIRE(prefix_make(&rng, &cases[i], &b));
        CHECK_OK(nib_ref_attn_prefix(&b.a));
        int bad = prefix_check(t, &b, "prefix");
        CHECK_MSG(bad == 0, "case %zu: %d bad outputs (wrong values or writes outside the valid rows)", i, bad);
        prefix_free(&b);
    }
}

/* logit_scale: unscaled q with the scale gives the attention of the pre-scaled q. With q x 4 and
 * scale 1/4 (both exact in binary) the reference must agree bit for bit; with SigLIP's
 * 1/sqrt(72) against q pre-scaled in fp32 (one rounding of each q element, 2^-24 relative) the
 * logits move by at most 2^-24 sum |q k| (q ~ 0.06, |k| ~ 0.8, 72 dims: ~3, so ~2e-7) and the
 * outputs by about that times max |v| (~4): ~1e-6, gated at 1e-5. (The scaled reference itself is
 * exact there: a float times a float is exact in fp64.) */
NIB_TEST(attn_ref_prefix_logit_scale) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    const prefix_case c = {2, 40, 37, 2, 4, 4, 72, 1};
    prefix_buf b, u;
    REQUIRE(prefix_make(&rng, &c, &b));
    CHECK_OK(nib_ref_attn_prefix(&b.a));
    REQUIRE(prefix_make(&rng, &c, &u)); /* same layout; its values are replaced below */
    const int64_t row = (int64_t)(c.n_heads + 2 * c.n_kv) * c.d, hq = (int64_t)c.n_heads * c.d;
    for (size_t i = 0; i < b.qkv_n; i++) u.qkv[i] = (int64_t)(i % (size_t)row) < hq ? b.qkv[i] * 4.0f : b.qkv[i];
    u.a.logit_scale = 0.25f;
    CHECK_OK(nib_ref_attn_prefix(&u.a));
    CHECK_MSG(!memcmp(u.o, b.o, b.o_n * 4), "q x 4 with logit_scale 1/4 differs from q");
    /* SigLIP: unscaled q (the q above times sqrt(72) is just other random data) */
    const float s = 1.0f / sqrtf(72.0f);
    for (size_t i = 0; i < b.qkv_n; i++)
        if ((int64_t)(i % (size_t)row) < hq) b.qkv[i] = u.qkv[i] * s; /* pre-scaled in fp32 */
    u.a.logit_scale = s;
    CHECK_OK(nib_ref_attn_prefix(&b.a));
    CHECK_OK(nib_ref_attn_prefix(&u.a));
    double worst = 0;
    for (size_t i = 0; i < b.o_n; i++)
        if (!is_sentinel(b.o[i])) worst = fmax(worst, fabs((double)u.o[i] - b.o[i]));
    printf("  logit_scale 1/sqrt(72) vs q pre-scaled in fp32: max |diff| %.3g\n", worst);
    CHECK_MSG(worst <= 1e-5, "max |diff| %.3g > 1e-5 (sum |q k| ~ 3, max |v| ~ 4: expected ~1e-6)", worst);
    prefix_free(&b);
    prefix_free(&u);
}

/* Identical key rows give equal logits: o = mean of the valid v rows (the max subtraction must
 * not matter). Bound: fp64 sum of S terms then the float rounding. */
NIB_TEST(attn_ref_uniform_logits) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    prefix_case c = {1, 33, 30, 1, 4, 1, 48, 1};
    prefix_buf b;
    REQUIRE(prefix_make(&rng, &c, &b));
    const nib_attn_prefix_args *a = &b.a;
    for (int64_t i = 1; i < c.s_max; i++) /* every key row = key row 0 */
        memcpy((float *)a->k + i * a->k_tok, a->k, (size_t)c.d * 4);
    for (int64_t i = 0; i < c.s_max; i++) /* and large logits: exp would overflow without max */
        for (int x = 0; x < c.n_heads * c.d; x++) ((float *)a->q)[i * a->q_tok + x] *= 400.0f;
    CHECK_OK(nib_ref_attn_prefix(&b.a));
    int bad = 0;
    for (int c2 = 0; c2 < c.d; c2++) {
        double mean = 0, amax = 0;
        for (int64_t j = 0; j < c.s_valid; j++) {
            double x = ((const float *)a->v)[j * a->v_tok + c2];
            mean += x;
            amax = fmax(amax, fabs(x));
        }
        mean /= c.s_valid;
        for (int64_t i = 0; i < c.s_valid; i++)
            for (int h = 0; h < c.n_heads; h++) {
                double got = b.o[i * a->o_tok + h * c.d + c2];
                if (!(fabs(got - mean) <= 0x1p-24 * fabs(mean) + 64 * 0x1p-53 * amax * c.s_valid)) bad++;
            }
    }
    CHECK_MSG(bad == 0, "%d outputs differ from the mean of v", bad);
    prefix_free(&b);
}

/* One valid token: p = 1 exactly, so o = v exactly (v is a float). */
NIB_TEST(attn_ref_self_attend) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    prefix_case c = {2, 9, 1, 2, 8, 1, 256, 1};
    prefix_buf b;
    REQUIRE(prefix_make(&rng, &c, &b));
    CHECK_OK(nib_ref_attn_prefix(&b.a));
    int bad = 0;
    for (int n = 0; n < 2; n++)
        for (int h = 0; h < 8; h++)
            for (int x = 0; x < 256; x++)
                bad += b.o[n * b.a.o_seq + h * 256 + x] != ((const float *)b.a.v)[n * b.a.v_seq + x];
    CHECK_MSG(bad == 0, "%d outputs differ from v", bad);
    prefix_free(&b);
}

/* Tokens past s_valid (their q, k and v) and sequences past n_seq_valid have no effect: set
 * them to garbage (huge values, NaN) and the output must be bitwise the same. */
NIB_TEST(attn_ref_prefix_masked_invariance) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    prefix_case c = {3, 50, 37, 2, 8, 1, 64, 1};
    prefix_buf b;
    REQUIRE(prefix_make(&rng, &c, &b));
    CHECK_OK(nib_ref_attn_prefix(&b.a));
    float *o1 = nib_malloc(b.o_n * 4);
    REQUIRE(o1);
    memcpy(o1, b.o, b.o_n * 4);
    const int64_t row = b.a.q_tok;
    for (int n = 0; n < 3; n++)
        for (int64_t i = 0; i < c.s_max; i++)
            for (int64_t x = 0; x < row; x++)
                if (n >= c.nsv || i >= c.s_valid)
                    b.qkv[n * b.a.q_seq + i * row + x] = (x % 3) ? NAN : (float)(1e30 * nib_rng_normal(&rng));
    for (size_t i = 0; i < b.o_n; i++) b.o[i] = sentinel();
    CHECK_OK(nib_ref_attn_prefix(&b.a));
    CHECK_MSG(!memcmp(o1, b.o, b.o_n * 4), "output changed when invalid tokens / sequences changed");
    nib_free(o1);
    prefix_free(&b);
}

/* MQA (1 KV head) equals MHA with the KV head repeated for every query head, bitwise. */
NIB_TEST(attn_ref_mqa_equals_mha) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    prefix_case c = {1, 21, 21, 1, 8, 1, 32, 1};
    prefix_buf b;
    REQUIRE(prefix_make(&rng, &c, &b));
    CHECK_OK(nib_ref_attn_prefix(&b.a));
    const int D = 32, H = 8;
    float *k = nib_malloc((size_t)21 * H * D * 4), *v = nib_malloc((size_t)21 * H * D * 4);
    float *o = nib_malloc((size_t)21 * H * D * 4);
    REQUIRE(k && v && o);
    for (int i = 0; i < 21; i++)
        for (int h = 0; h < H; h++) {
            memcpy(k + (i * H + h) * D, (const float *)b.a.k + i * b.a.k_tok, D * 4);
            memcpy(v + (i * H + h) * D, (const float *)b.a.v + i * b.a.v_tok, D * 4);
        }
    nib_attn_prefix_args m = b.a;
    m.n_kv_heads = H;
    m.k = k;
    m.v = v;
    m.k_tok = m.v_tok = H * D;
    m.k_seq = m.v_seq = 0;
    m.o = o;
    m.o_tok = H * D;
    CHECK_OK(nib_ref_attn_prefix(&m));
    int bad = 0;
    for (int i = 0; i < 21; i++) bad += memcmp(o + i * H * D, b.o + i * b.a.o_tok, (size_t)H * D * 4) != 0;
    CHECK_MSG(bad == 0, "%d tokens differ between MQA and MHA with repeated KV", bad);
    nib_free(k);
    nib_free(v);
    nib_free(o);
    prefix_free(&b);
}

/* ---- cache --------------------------------------------------------------------------------- */

typedef struct cache_buf {
    nib_attn_cache_args a;
    void *mem;                 /* nib_kv_layer_bytes */
    float *q, *o, *kf, *vf;    /* kf, vf: [t_max][n_kv][D] the values the naive path uses */
    int32_t tv, nqv;
    size_t o_n;
} cache_buf;

static void cache_free(cache_buf *b) {
    nib_free(b->mem);
    nib_free(b->q);
    nib_free(b->o);
    nib_free(b->kf);
    nib_free(b->vf);
    memset(b, 0, sizeof *b);
}

/* Writes one vector x[D] into slot (tok, head) of a K or V plane and stores in `deq` the values
 * formats/ dequantizes it to (float). */
static nib_status put_vec(nib_kv_layer *L, int isv, int64_t tok, int32_t h, const float *x, float *deq) {
    const int D = L->head_dim;
    const int64_t vec = tok * L->n_kv_heads + h;
    void *plane = isv ? L->v : L->k;
    switch (L->dtype) {
    case NIB_KV_BF16:
        for (int i = 0; i < D; i++) {
            uint16_t u = nib_f32_to_bf16(x[i]);
            ((uint16_t *)plane)[vec * D + i] = u;
            deq[i] = nib_bf16_to_f32(u);
        }
        return NIB_OK;
    case NIB_KV_FP8: {
        float *sc = isv ? L->vs : L->ks;
        uint8_t *e = (uint8_t *)plane + vec * D;
        NIB_RETURN_IF_ERR(nib_fp8_quantize(x, 1, D, 1, e, sc + vec));
        return nib_fp8_dequantize(e, sc + vec, 1, D, 1, deq);
    }
    default: {
        float *sc = isv ? L->vs : L->ks;
        uint8_t *bs = (isv ? L->vb : L->kb) + vec * (D / 16);
        uint8_t *e = (uint8_t *)plane + vec * (D / 2);
        NIB_RETURN_IF_ERR(nib_nvfp4_quantize(x, 1, D, e, bs, sc + vec));
        return nib_nvfp4_dequantize(e, bs, sc[vec], 1, D, deq);
    }
    }
}

/* Random cache: slots < tv hold quantized N(0,1) vectors, slots >= tv random bytes (NaN codes
 * and NaN scales included: they must never be read). q = N(0,1) / sqrt(D). */
static int cache_make(nib_rng *r, nib_kv_dtype dt, int32_t t_max, int32_t tv, int32_t nq, int32_t nqv, int32_t n_heads,
                      int32_t n_kv, int32_t D, cache_buf *b) {
    memset(b, 0, sizeof *b);
    nib_attn_cache_args *a = &b->a;
    uint64_t bytes = nib_kv_layer_bytes(dt, t_max, n_kv, D);
    b->mem = nib_malloc((size_t)bytes);
    b->kf = nib_malloc((size_t)t_max * n_kv * D * 4 + 4);
    b->vf = nib_malloc((size_t)t_max * n_kv * D * 4 + 4);
    float *x = nib_malloc((size_t)D * 4);
    if (!b->mem || !b->kf || !b->vf || !x) {
        nib_free(x);
        return 0;
    }
    nib_rng junk; /* its own stream, so the values below do not depend on the dtype's size */
    nib_rng_seed(&junk, nib_rng_u64(r));
    for (uint64_t i = 0; i < bytes; i++) ((uint8_t *)b->mem)[i] = (uint8_t)nib_rng_u64(&junk);
    if (nib_kv_layer_map(&a->kv, dt, t_max, n_kv, D, b->mem)) {
        nib_free(x);
        return 0;
    }
    for (int64_t tok = 0; tok < tv; tok++)
        for (int32_t h = 0; h < n_kv; h++)
            for (int isv = 0; isv < 2; isv++) {
                for (int i = 0; i < D; i++) x[i] = (float)nib_rng_normal(r);
                float *deq = (isv ? b->vf : b->kf) + (tok * n_kv + h) * D;
                if (put_vec(&a->kv, isv, tok, h, x, deq)) {
                    nib_free(x);
                    return 0;
                }
            }
    nib_free(x);
    const int64_t hq = (int64_t)n_heads * D;
    a->q_tok = hq + 8;
    a->o_tok = hq + 4;
    a->nq = nq;
    a->n_heads = n_heads;
    b->tv = tv;
    b->nqv = nqv;
    a->t_valid = &b->tv;
    a->nq_valid = &b->nqv;
    b->q = nib_malloc((size_t)nq * a->q_tok * 4);
    b->o_n = (size_t)nq * a->o_tok;
    b->o = nib_malloc(b->o_n * 4);
    if (!b->q || !b->o) return 0;
    for (int64_t i = 0; i < nq * a->q_tok; i++) b->q[i] = (float)(nib_rng_normal(r) / sqrt((double)D));
    for (size_t i = 0; i < b->o_n; i++) b->o[i] = sentinel();
    a->q = b->q;
    a->o = b->o;
    return 1;
}

static int cache_check(nib_test_ctx *t, const cache_buf *b, const char *what) {
    const nib_attn_cache_args *a = &b->a;
    const int D = a->kv.head_dim, n_kv = a->kv.n_kv_heads, group = a->n_heads / n_kv;
    const int64_t T = b->tv;
    const double e_in = a->kv.dtype == NIB_KV_BF16 ? 0.0 : 0x1p-24;
    int bad = 0;
    double *q = nib_malloc((size_t)D * 8), *k = nib_malloc((size_t)(T ? T : 1) * D * 8);
    double *v = nib_malloc((size_t)(T ? T : 1) * D * 8), *o = nib_malloc((size_t)D * 8);
    double *A = nib_malloc((size_t)D * 8), mq = 0;
    if (!q || !k || !v || !o || !A) {
        bad = 1;
        goto done;
    }
    for (int32_t h = 0; h < a->n_heads; h++) {
        const int32_t g = h / group;
        for (int64_t j = 0; j < T; j++)
            for (int c = 0; c < D; c++) {
                k[j * D + c] = b->kf[(j * n_kv + g) * D + c];
                v[j * D + c] = b->vf[(j * n_kv + g) * D + c];
            }
        for (int64_t i = 0; i < a->nq; i++) {
            const float *got = b->o + i * a->o_tok + (int64_t)h * D;
            if (i >= b->nqv) {
                for (int c = 0; c < D; c++) bad += !is_sentinel(got[c]);
                continue;
            }
            for (int c = 0; c < D; c++) q[c] = b->q[i * a->q_tok + (int64_t)h * D + c];
            naive_attn(q, 1, k, v, T, D, o, A, &mq);
            bad += check_row(t, what, got, o, A, mq, D, T, e_in, i);
        }
    }
    for (int64_t i = 0; i < a->nq; i++)
        for (int64_t c = (int64_t)a->n_heads * D; c < a->o_tok; c++) bad += !is_sentinel(b->o[i * a->o_tok + c]);
done:
    nib_free(q);
    nib_free(k);
    nib_free(v);
    nib_free(o);
    nib_free(A);
    return bad;
}

NIB_TEST(attn_ref_cache_vs_naive) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    typedef struct { int32_t t_max, tv, nq, nqv, n_heads, n_kv, d; } cc;
    const cc cases[] = {
        {1, 1, 1, 1, 8, 1, 256},      /* decode over one slot */
        {150, 137, 10, 10, 8, 1, 256}, /* suffix-like: H = 10, slots past t_valid are garbage */
        {80, 70, 5, 3, 4, 2, 32},      /* GQA, nq_valid < nq */
        {40, 0, 2, 2, 2, 1, 16},       /* no visible slot: o = 0 */
    };
    for (int dt = 0; dt < NIB_KV_COUNT; dt++)
        for (size_t i = 0; i < NIB_ARRAY_LEN(cases); i++) {
            const cc *c = &cases[i];
            cache_buf b;
            REQUIRE(cache_make(&rng, (nib_kv_dtype)dt, c->t_max, c->tv, c->nq, c->nqv, c->n_heads, c->n_kv, c->d, &b));
            CHECK_OK(nib_ref_attn_cache(&b.a));
            int bad = cache_check(t, &b, nib_kv_dtype_name((nib_kv_dtype)dt));
            CHECK_MSG(bad == 0, "%s case %zu: %d bad outputs", nib_kv_dtype_name((nib_kv_dtype)dt), i, bad);
            if (c->tv == 0) { /* o = 0 exactly */
                int nz = 0;
                for (int64_t r = 0; r < c->nqv; r++)
                    for (int x = 0; x < c->n_heads * c->d; x++) nz += b.o[r * b.a.o_tok + x] != 0.0f;
                CHECK_MSG(nz == 0, "%d nonzero outputs with no visible slot", nz);
            }
            cache_free(&b);
        }
}

/* Slots past t_valid (any bytes) and query tokens past nq_valid have no effect, bitwise. */
NIB_TEST(attn_ref_cache_masked_invariance) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    for (int dt = 0; dt < NIB_KV_COUNT; dt++) {
        cache_buf b;
        REQUIRE(cache_make(&rng, (nib_kv_dtype)dt, 100, 61, 4, 3, 8, 1, 256, &b));
        CHECK_OK(nib_ref_attn_cache(&b.a));
        float *o1 = nib_malloc(b.o_n * 4);
        REQUIRE(o1);
        memcpy(o1, b.o, b.o_n * 4);
        /* new garbage in every plane past slot 61, and in the invalid query token */
        nib_kv_layer *L = &b.a.kv;
        const int64_t esz = dt == NIB_KV_BF16 ? 512 : dt == NIB_KV_FP8 ? 256 : 128;
        memset((uint8_t *)L->k + 61 * esz, 0xFF, (size_t)(100 - 61) * esz);
        memset((uint8_t *)L->v + 61 * esz, 0x7F, (size_t)(100 - 61) * esz);
        if (L->ks) {
            for (int i = 61; i < 100; i++) L->ks[i] = L->vs[i] = NAN;
        }
        if (L->kb) memset(L->kb + 61 * 16, 0x7F, (size_t)(100 - 61) * 16);
        for (int64_t x = 0; x < b.a.q_tok; x++) b.q[3 * b.a.q_tok + x] = 1e30f;
        for (size_t i = 0; i < b.o_n; i++) b.o[i] = sentinel();
        CHECK_OK(nib_ref_attn_cache(&b.a));
        CHECK_MSG(!memcmp(o1, b.o, b.o_n * 4), "%s: output changed with invalid slots / queries",
                  nib_kv_dtype_name((nib_kv_dtype)dt));
        nib_free(o1);
        cache_free(&b);
    }
}

/* A BF16 cache of one slot: o = that slot's v exactly, for every head. */
NIB_TEST(attn_ref_cache_single_slot) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    cache_buf b;
    REQUIRE(cache_make(&rng, NIB_KV_BF16, 64, 1, 3, 3, 8, 1, 256, &b));
    CHECK_OK(nib_ref_attn_cache(&b.a));
    int bad = 0;
    for (int i = 0; i < 3; i++)
        for (int h = 0; h < 8; h++)
            for (int x = 0; x < 256; x++) bad += b.o[i * b.a.o_tok + h * 256 + x] != b.vf[x];
    CHECK_MSG(bad == 0, "%d outputs differ from the slot's v", bad);
    cache_free(&b);
}

NIB_TEST(attn_ref_argument_errors) {
    nib_rng rng;
    nib_test_rng(t, &rng);
    prefix_case c = {1, 4, 4, 1, 8, 1, 16, 1};
    prefix_buf b;
    REQUIRE(prefix_make(&rng, &c, &b));
    nib_attn_prefix_args a = b.a;
    CHECK_ST(nib_ref_attn_prefix(NULL), NIB_ERR_INVALID_ARG);
    a.n_kv_heads = 3; /* does not divide 8 */
    CHECK_ST(nib_ref_attn_prefix(&a), NIB_ERR_INVALID_ARG);
    a = b.a;
    int32_t big = 5;
    a.s_valid = &big; /* > s_max */
    CHECK_ST(nib_ref_attn_prefix(&a), NIB_ERR_INVALID_ARG);
    a = b.a;
    a.q_tok = 8 * 16 - 1; /* rows would overlap */
    CHECK_ST(nib_ref_attn_prefix(&a), NIB_ERR_INVALID_ARG);
    a = b.a;
    a.v = NULL;
    CHECK_ST(nib_ref_attn_prefix(&a), NIB_ERR_INVALID_ARG);
    a = b.a;
    a.logit_scale = -0.5f;
    CHECK_ST(nib_ref_attn_prefix(&a), NIB_ERR_INVALID_ARG);
    a.logit_scale = NAN;
    CHECK_ST(nib_ref_attn_prefix(&a), NIB_ERR_INVALID_ARG);
    prefix_free(&b);

    cache_buf cb;
    REQUIRE(cache_make(&rng, NIB_KV_FP8, 8, 8, 1, 1, 8, 1, 256, &cb));
    nib_attn_cache_args ca = cb.a;
    ca.t_valid = NULL;
    CHECK_ST(nib_ref_attn_cache(&ca), NIB_ERR_INVALID_ARG);
    ca = cb.a;
    int32_t nine = 9; /* > t_max */
    ca.t_valid = &nine;
    CHECK_ST(nib_ref_attn_cache(&ca), NIB_ERR_INVALID_ARG);
    ca = cb.a;
    ca.kv.ks = NULL; /* FP8 without its scale plane */
    CHECK_ST(nib_ref_attn_cache(&ca), NIB_ERR_INVALID_ARG);
    ca = cb.a;
    ca.kv.head_dim = 40;
    CHECK_ST(nib_ref_attn_cache(&ca), NIB_ERR_SHAPE);
    cache_free(&cb);
}

/* What a low-bit KV cache costs in accuracy, measured with the reference on the data the GPU
 * gates use (q, k, v ~ N(0,1), q scaled by D^-0.5, MQA 8 heads, D 256): the cosine of the
 * attention output with an FP8 / NVFP4 cache against the same attention with a BF16 cache.
 * Derivation of the expected value: a K error dk changes a logit by q . dk (RMS = |q| rms(dk) =
 * sqrt(nmse_k) for |q| = 1 and unit-variance k) and moves o by about that fraction of its size;
 * a V error moves o by sqrt(nmse_v) of its size; so 1 - cos ~= (nmse_k + nmse_v) / 2 with the
 * element NMSEs of the formats. Checked within a factor 2 each way; the cosines are printed. */
NIB_TEST(attn_ref_lowbit_cosine) {
    nib_rng rng;
    const int32_t T = 542, nq = 10, H = 8, D = 256;
    double cosv[NIB_KV_COUNT] = {1, 1, 1}, pred[NIB_KV_COUNT] = {0, 0, 0};
    float *ob = NULL;
    for (int dt = 0; dt < NIB_KV_COUNT; dt++) {
        nib_test_rng(t, &rng); /* same data for every dtype */
        cache_buf b;
        REQUIRE(cache_make(&rng, (nib_kv_dtype)dt, T, T, nq, nq, H, 1, D, &b));
        CHECK_OK(nib_ref_attn_cache(&b.a));
        if (dt == NIB_KV_BF16) {
            ob = nib_malloc(b.o_n * 4);
            REQUIRE(ob);
            memcpy(ob, b.o, b.o_n * 4);
        } else {
            /* element NMSE of the format on this data (vs the same data in bf16) */
            nib_rng r2;
            nib_test_rng(t, &r2);
            cache_buf ref16;
            REQUIRE(cache_make(&r2, NIB_KV_BF16, T, T, nq, nq, H, 1, D, &ref16));
            nib_quant_err ek, ev;
            CHECK_OK(nib_quant_error(ref16.kf, b.kf, (size_t)T * D, &ek));
            CHECK_OK(nib_quant_error(ref16.vf, b.vf, (size_t)T * D, &ev));
            pred[dt] = 0.5 * (ek.nmse + ev.nmse);
            cache_free(&ref16);
            double dot = 0, n1 = 0, n2 = 0;
            for (int64_t i = 0; i < nq; i++)
                for (int x = 0; x < H * D; x++) {
                    double u = ob[i * b.a.o_tok + x], w = b.o[i * b.a.o_tok + x];
                    dot += u * w;
                    n1 += u * u;
                    n2 += w * w;
                }
            cosv[dt] = dot / sqrt(n1 * n2);
            printf("  %-5s KV: output cosine vs bf16 KV %.6f (1-cos %.2e; predicted (nmse_k+nmse_v)/2 = %.2e)\n",
                   nib_kv_dtype_name((nib_kv_dtype)dt), cosv[dt], 1 - cosv[dt], pred[dt]);
            CHECK_MSG(1 - cosv[dt] <= 2 * pred[dt] && 1 - cosv[dt] >= 0.5 * pred[dt],
                      "%s: 1-cos %.3g outside [0.5, 2] x the predicted %.3g", nib_kv_dtype_name((nib_kv_dtype)dt),
                      1 - cosv[dt], pred[dt]);
        }
        cache_free(&b);
    }
    nib_free(ob);
}
