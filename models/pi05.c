/* pi05.c — Pi0.5 load (name mapping, folding, per-component formats) and forward pass, written
 * once against runtime/backend.h. See models/pi05.h for the folding and the exact skips.
 *
 * Buffers (activation dtype unless noted; rows are maxima, valid counts per call):
 *   vision  patches [Vmax*T][Kp]  vx, vy [Vmax*T][Wv]  vqkv [..][3Wv]  vattn [..][Wv]  vmlp [..][Fv]
 *   prefix  px, py [Smax][W]  pqkv [Smax][(h+2)hd]  pattn [Smax][h*hd]  pmlp [Smax][F]
 *   expert  ex, ey [Hmax][We]  eqkv [Hmax][(he+2)hd]  eq, eattn [Hmax][he*hd]  emlp [Hmax][Fe]
 *           eout [Hmax][A]  xt fp32 [Hmax][A]  xt_act [Hmax][A]
 *   KV      one layer per prefix layer, t_max = Smax + Hmax slots: prefix tokens at 0..P-1, the
 *           expert's own H tokens at P..P+H-1 (rewritten by every step)
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "formats/formats.h"
#include "io/qcheckpoint.h"
#include "models/pi05.h"
#include "models/pi05_keys.h"

#define MAX_GRAPHS 8

typedef struct vis_layer {
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    nib_be_linear qkv, o, fc1, fc2;
} vis_layer;
typedef struct lm_layer {
    nib_be_linear qkv, o, gu, down;
    float *n1w, *n2w; /* prefix, pre-quantized: the RMSNorm weights (applied as 1 + w in the norm); NULL when folded */
} lm_layer;

typedef struct graph_entry {
    int used, V, L, H, u8;
    nib_be_graph *g;
    uint64_t last_use;
} graph_entry;

struct nib_pi05 {
    nib_pi05_config c;
    nib_pi05_precision prec;
    nib_be be;
    int kpatch; /* padded patch K (multiple of 16) */
    /* weights */
    nib_be_linear patch, proj, ain, aout;
    void *posemb; /* act [T][Wv] */
    void *embed;  /* act [vocab][W] */
    float *post_w, *post_b;
    vis_layer *vl;
    lm_layer *pl, *el;
    float *mods; /* [steps][2L+1][3][We] */
    float *inv_freq;
    nib_kv_layer *kv;
    /* buffers */
    void *patches, *vx, *vy, *vqkv, *vattn, *vmlp;
    void *px, *py, *pqkv, *pattn, *pmlp;
    void *ex, *ey, *eqkv, *eq, *eattn, *emlp, *eout, *xt_act;
    void *ain_t;   /* CUDA: action_in_proj's weight transposed, bf16 [A][We] (ops/edge.h's w_in_t) */
    int edge;      /* the step's edge in one op (edge_setup) */
    int edge_next; /* the last step's edge also ran the next step's input and its layer 0's first norm */
    void *rope_cs; /* [Hmax][hd/2] float2: the suffix positions' (cos, sin) for the q|k|v product's
                    * epilogue (nib_be_gemm_qkv), computed once per call (rope_table); NULL when the
                    * expert's q|k|v is not in the pair layout */
    float *xt;
    int32_t *ints; /* [0] S valid, [1] T valid (P + H), [2] P (slot base of the expert tokens) */
    int32_t *pos_prefix, *pos_suffix, *ids;
    void *img; /* fp32 NCHW or u8 NHWC of the valid cameras */
    /* ints, the positions, ids, x_t and img are one device block (inputs_layout, base = ints) mirrored
     * in page-locked host memory: upload_inputs fills the mirror, send_inputs copies its used part
     * with one async copy on the main stream; the actions come back through out_h */
    uint8_t *in_h;
    float *out_h;
    uint64_t in_bytes; /* the part the last upload_inputs filled */
    int in_busy;       /* a copy from in_h / into out_h may still be in flight (no sync since) */
    nib_be_event *ev_in[2]; /* around the input copy, when the call is timed (time_in) */
    int time_in;
    /* graphs and stage events */
    graph_entry graphs[MAX_GRAPHS];
    uint64_t clock;
    nib_be_event *ev[2 + 64 + 1];
    int n_ev;
    int32_t last_P;
    int preq; /* bit 0 vision, 1 prefix, 2 expert: imported pre-quantized */
    /* check-numerics: calls run eagerly and scan each stage's output (nib_pi05_set_check_numerics) */
    int check_numerics, checking;
    void *nws; /* device scratch of the scan's result (CUDA) */
    /* the persistent expert kernel (ops/expert.h): used for calls with H <= xrows */
    int fused;                /* prepared and enabled */
    int32_t xrows;            /* rows it was prepared for: min(max_horizon, NIB_EXPERT_MAX_ROWS) */
    nib_expert_layer *xl;     /* [e_layers] */
    void *xws;
    uint64_t xws_bytes;
    char xpath[384];          /* which expert path runs, and why (nib_pi05_expert_path) */
    int32_t xgrid;            /* CTAs of the kernel's launches (0: one per SM; NIB_EXPERT_CTAS, a lab knob) */
    int32_t xgrid_max;        /* the CTAs of a whole-GPU launch */
    /* the first flow step beside the prefix (overlap_setup): the persistent kernel on ogrid CTAs of a
     * second stream, each layer's attention waiting for the prefix's cache write of that layer
     * (kv_sig: one counter per layer, ops/expert.h) */
    int overlap;
    int32_t ogrid;            /* NIB_OVERLAP_CTAS (0: beside_grid's rule) */
    int32_t olayers;          /* NIB_OVERLAP_LAYERS (0: beside_layers' rule) */
    uint32_t *kv_sig;
    uint32_t *kvto_h, *kvto_d; /* host-mapped flag: a wait of the kernel beside the prefix timed out */
    int sig_dirty;            /* a failed call may have left counters set: zeroed before the next one */
    int drop_sig;             /* test hook NIB_OVERLAP_DROP_SIGNALS=1: the prefix never signals (the timeout path) */
    int warming;              /* get_graph's eager first call of a shape: never beside (see there) */
    /* the first step of the per-op path beside the prefix (overlap_ops_setup): its ops on the second
     * stream (with scratch of its own), each layer's after the fork that follows the prefix's cache
     * write of that layer (graph edges, no waiting kernel) */
    int oside;
    int ofirst_ops;           /* the per-op first step beside the prefix also where the persistent kernel runs
                               * the other steps (the default; NIB_OVERLAP_FIRST_OPS=0: the kernel's first
                               * layers beside the prefix instead, overlap_setup) */
    int fused_qkv;            /* the prefix's RoPE + cache write as one kernel (prefix_setup) */
    char ppath[128];          /* nib_pi05_prefix_path */
};

const nib_pi05_config *nib_pi05_cfg(const nib_pi05 *m) { return &m->c; }

/* ---- host-side tensor conversion --------------------------------------------------------- */
typedef struct conv_ctx {
    const nib_st_tensor *t;
    float *out;
    pthread_mutex_t mu;
    uint64_t first_bad; /* UINT64_MAX: none */
} conv_ctx;

static void conv_chunk(void *arg, int64_t b, int64_t e) {
    conv_ctx *x = (conv_ctx *)arg;
    const uint8_t *src = (const uint8_t *)x->t->data;
    float *out = x->out;
    switch (x->t->dtype) {
    case NIB_DTYPE_F32: memcpy(out + b, src + 4 * b, (size_t)(e - b) * 4); break;
    case NIB_DTYPE_BF16:
        for (int64_t i = b; i < e; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = nib_bf16_to_f32(h);
        }
        break;
    default: /* F16 */
        for (int64_t i = b; i < e; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = nib_f16_to_f32(h);
        }
        break;
    }
    for (int64_t i = b; i < e; i++)
        if (!isfinite(out[i])) {
            pthread_mutex_lock(&x->mu);
            if ((uint64_t)i < x->first_bad) x->first_bad = (uint64_t)i;
            pthread_mutex_unlock(&x->mu);
            break;
        }
}

/* float tensor -> fp32 (all cores for large tensors), rejecting NaN/Inf with the element named */
static nib_status to_f32(const nib_st_tensor *t, float *out) {
    if (t->dtype != NIB_DTYPE_F32 && t->dtype != NIB_DTYPE_BF16 && t->dtype != NIB_DTYPE_F16)
        return NIB_ERR(NIB_ERR_FORMAT, "tensor '%s': dtype %s is not a float type", t->name, nib_dtype_name(t->dtype));
    conv_ctx x = {t, out, PTHREAD_MUTEX_INITIALIZER, UINT64_MAX};
    nib_parallel_for((int64_t)t->numel, 0, 1 << 20, conv_chunk, &x);
    if (x.first_bad != UINT64_MAX)
        return NIB_ERR(NIB_ERR_NUMERICS, "tensor '%s': element %llu is %s", t->name, (unsigned long long)x.first_bad,
                       isnan(out[x.first_bad]) ? "NaN" : "Inf");
    return NIB_OK;
}

/* fetch a float tensor of the given shape into a new fp32 host buffer */
static nib_status fetch(const nib_st_file *f, const char *name, int ndim, const int64_t *shape, float **out) {
    const nib_st_tensor *t;
    *out = NULL;
    NIB_RETURN_IF_ERR(nib_pi05_need(f, name, ndim, shape, &t));
    float *buf = nib_malloc((size_t)t->numel * 4 + 4);
    if (!buf) return NIB_ERR_OUT_OF_MEMORY;
    nib_status st = to_f32(t, buf);
    if (st) {
        nib_free(buf);
        return st;
    }
    *out = buf;
    return NIB_OK;
}

static nib_status fetchf(const nib_st_file *f, int ndim, const int64_t *shape, float **out, const char *fmt, ...)
    NIB_PRINTF(5, 6);
static nib_status fetchf(const nib_st_file *f, int ndim, const int64_t *shape, float **out, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return fetch(f, name, ndim, shape, out);
}

/* ---- quantize a folded fp32 weight to the component's format and load it ------------------ */
typedef struct qjob {
    nib_wfmt f;
    const float *w;
    int64_t r0, r1, k;
    void *data, *scales;
    float global;
    nib_status st;
} qjob;

static void *qworker(void *arg) {
    qjob *j = (qjob *)arg;
    int64_t rows = j->r1 - j->r0;
    const float *w = j->w + j->r0 * j->k;
    switch (j->f) {
    case NIB_WFMT_BF16:
        for (int64_t i = 0; i < rows * j->k; i++) ((uint16_t *)j->data)[j->r0 * j->k + i] = nib_f32_to_bf16(w[i]);
        break;
    case NIB_WFMT_FP8:
        j->st = nib_fp8_quantize(w, rows, j->k, 1, (uint8_t *)j->data + j->r0 * j->k, (float *)j->scales + j->r0);
        break;
    case NIB_WFMT_NVFP4:
        j->st = nib_nvfp4_quantize_global(w, rows, j->k, (uint8_t *)j->data + j->r0 * j->k / 2,
                                          (uint8_t *)j->scales + j->r0 * j->k / 16, j->global);
        break;
    case NIB_WFMT_MXFP4:
        j->st = nib_mxfp4_quantize(w, rows, j->k, NIB_MXFP4_SCALE_DEFAULT, (uint8_t *)j->data + j->r0 * j->k / 2,
                                   (uint8_t *)j->scales + j->r0 * j->k / 32);
        break;
    default: j->st = NIB_ERR(NIB_ERR_INTERNAL, "qworker: format %d", (int)j->f);
    }
    return NULL;
}

/* w: [n][k] fp32 (folded). Quantizes on all cores (rows are independent once the NVFP4 global
 * is fixed from the whole tensor), then loads into the backend. */
static nib_status load_linear(nib_pi05 *m, const char *name, nib_wfmt fmt, const float *w, int64_t n, int64_t k,
                              const float *bias, int geglu, int32_t rope_half, int w8a8, nib_be_linear *out) {
    nib_status st = NIB_OK;
    nib_wsrc src;
    memset(&src, 0, sizeof src);
    src.n = n, src.k = k, src.bias = bias, src.group = 128, src.rope_half = rope_half;
    void *data = NULL, *scales = NULL;
    nib_int4_weight i4;
    memset(&i4, 0, sizeof i4);
    if (m->prec.backend == NIB_BE_REF && fmt == NIB_WFMT_BF16) {
        /* the reference keeps the (folded) checkpoint values in fp32; with a low-bit format it
         * takes the quantized weight below and dequantizes it exactly */
        memset(out, 0, sizeof *out);
        out->n = n, out->k = k, out->n_out = geglu ? n / 2 : n, out->geglu = geglu, out->fmt = NIB_WFMT_BF16;
        NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)n * k * 4, (void **)&out->w32, name));
        memcpy(out->w32, w, (size_t)n * k * 4);
        if (bias) {
            NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)n * 4, (void **)&out->bias, name));
            memcpy(out->bias, bias, (size_t)n * 4);
        }
        return NIB_OK;
    }
    src.fmt = fmt;
    if (fmt == NIB_WFMT_INT4) {
        NIB_TRY(nib_int4_quantize(w, n, k, 128, 0, NULL, &i4));
        src.data = i4.packed, src.scales = i4.scales, src.zeros = i4.zeros, src.perm = i4.perm;
    } else {
        uint64_t nk = (uint64_t)n * k;
        uint64_t db = fmt == NIB_WFMT_BF16 ? nk * 2 : fmt == NIB_WFMT_FP8 ? nk : nk / 2;
        uint64_t sb = fmt == NIB_WFMT_FP8 ? (uint64_t)n * 4 : fmt == NIB_WFMT_NVFP4 ? nk / 16 : fmt == NIB_WFMT_MXFP4 ? nk / 32 : 0;
        if ((fmt == NIB_WFMT_NVFP4 && k % 16) || (fmt == NIB_WFMT_MXFP4 && k % 32) || (fmt == NIB_WFMT_FP8 && k % 16)) {
            st = NIB_ERR(NIB_ERR_SHAPE, "%s: K = %lld does not fit the %s block", name, (long long)k, nib_wfmt_name(fmt));
            goto fail;
        }
        data = nib_malloc(db + 16);
        scales = nib_malloc(sb + 16);
        if (!data || !scales) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        float global = 1.f;
        if (fmt == NIB_WFMT_NVFP4) {
            float amax = 0.f;
            for (uint64_t i = 0; i < nk; i++) amax = fmaxf(amax, fabsf(w[i]));
            global = nib_nvfp4_global_for_amax(amax);
        }
        int threads = m->be.threads > 0 ? m->be.threads : 8;
        if (threads > 32) threads = 32;
        qjob jobs[32];
        pthread_t tid[32];
        int64_t per = (n + threads - 1) / threads;
        int nt = 0;
        for (int t = 0; t < threads && t * per < n; t++) {
            jobs[t] = (qjob){fmt, w, t * per, (t + 1) * per < n ? (t + 1) * per : n, k, data, scales, global, NIB_OK};
            if (pthread_create(&tid[t], NULL, qworker, &jobs[t]) != 0) {
                qworker(&jobs[t]);
                tid[t] = 0;
            }
            nt = t + 1;
        }
        for (int t = 0; t < nt; t++) {
            if (tid[t]) pthread_join(tid[t], NULL);
            if (jobs[t].st && !st) st = nib_error_context(jobs[t].st, "quantizing %s", name);
        }
        if (st) goto fail;
        src.data = data, src.scales = scales, src.global_scale = global, src.fp8_per_channel = 1;
    }
    st = nib_be_linear_load(&m->be, &src, geglu, w8a8, name, out);
fail:
    nib_free(data);
    nib_free(scales);
    nib_int4_free(&i4);
    return st;
}

/* ---- linears from float tensors (folded here) or pre-quantized sets (imported as stored) ---- */
typedef struct fold_ctx {
    float *w;
    int64_t k;
    const float *g;
} fold_ctx;
static void fold_chunk(void *arg, int64_t b, int64_t e) {
    fold_ctx *x = (fold_ctx *)arg;
    for (int64_t r = b; r < e; r++)
        for (int64_t j = 0; j < x->k; j++) x->w[r * x->k + j] *= 1.0f + x->g[j];
}
static void fold_cols(float *w, int64_t n, int64_t k, const float *g /* (1 + g) */) {
    fold_ctx x = {w, k, g};
    nib_parallel_for(n, 0, (1 << 20) / (k > 0 ? k : 1) + 1, fold_chunk, &x);
}

enum { COMP_VISION = 0, COMP_PREFIX = 1, COMP_EXPERT = 2 };
static const char *const k_comp_name[3] = {"vision", "prefix", "expert"};

typedef struct fused_spec {
    const char *name;      /* nib's name in messages, e.g. "prefix.layers.3.qkv" */
    int comp;              /* COMP_* */
    int nparts;            /* row blocks stacked in this order */
    char bases[3][256];    /* checkpoint base names (no ".weight") */
    int64_t rows[3];
    int64_t k;
    float qscale;          /* rows of part 0 (and its bias) times this; 1 = none */
    const float *fold;     /* float path: columns times (1 + fold[j]); NULL = none. A
                              pre-quantized set is not folded: the caller applies the norm weight */
    int bias, geglu, w8a8;
    int32_t rope_half;     /* nib_wsrc.rope_half: the expert's q|k|v for nib_be_gemm_qkv (0 = none) */
} fused_spec;

/* Multiply the scales of rows [0, rows0) of an imported weight by s without requantizing:
 * FP8 (fp32 scales; per tensor is made per channel), and for a power-of-two s: NVFP4 (E4M3
 * block scales), MXFP4 (E8M0 exponents), INT4 (fp16 group scales) when every new scale is
 * exact, else NIB_ERR_UNSUPPORTED naming the weight. *owned receives the new scale plane. */
static nib_status scale_rows(nib_wsrc *w, int64_t rows0, float s, const char *name, void **owned) {
    int e2 = 0;
    const int pow2 = frexpf(s, &e2) == 0.5f;
    *owned = NULL;
    if (w->fmt == NIB_WFMT_FP8) {
        float *sc = nib_malloc((size_t)w->n * 4);
        if (!sc) return NIB_ERR_OUT_OF_MEMORY;
        for (int64_t r = 0; r < w->n; r++) {
            float v = ((const float *)w->scales)[w->fp8_per_channel ? r : 0];
            sc[r] = r < rows0 ? v * s : v;
        }
        w->scales = sc, w->fp8_per_channel = 1, *owned = sc;
        return NIB_OK;
    }
    if (!pow2)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: the query scale %g cannot be folded into pre-quantized %s scales without "
                       "requantizing (only FP8 takes any scale); quantize this component to fp8 or load it from float weights",
                       name, (double)s, nib_wfmt_name(w->fmt));
    const int64_t per = w->fmt == NIB_WFMT_NVFP4 ? w->k / 16 : w->fmt == NIB_WFMT_MXFP4 ? w->k / 32
                      : w->fmt == NIB_WFMT_INT4 && w->group > 0 ? w->k / w->group : -1;
    if (per < 0) return NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: cannot scale a pre-quantized %s weight", name, nib_wfmt_name(w->fmt));
    const size_t esz = w->fmt == NIB_WFMT_INT4 ? 2 : 1, total = (size_t)(w->n * per);
    uint8_t *sc = nib_malloc(total * esz + 16);
    if (!sc) return NIB_ERR_OUT_OF_MEMORY;
    memcpy(sc, w->scales, total * esz);
    for (size_t i = 0; i < (size_t)(rows0 * per); i++) {
        int bad = 0;
        float before = 0, after = 0;
        if (w->fmt == NIB_WFMT_NVFP4) {
            before = nib_e4m3_to_f32(sc[i]), after = before * s;
            uint8_t c = nib_f32_to_e4m3(after);
            bad = nib_e4m3_to_f32(c) != after;
            sc[i] = c;
        } else if (w->fmt == NIB_WFMT_MXFP4) {
            int ne = (int)sc[i] + (e2 - 1);
            before = nib_e8m0_to_f32(sc[i]), after = before * s;
            bad = ne < 0 || ne > 254;
            sc[i] = (uint8_t)(bad ? 0 : ne);
        } else {
            uint16_t h;
            memcpy(&h, sc + 2 * i, 2);
            before = nib_f16_to_f32(h), after = before * s;
            uint16_t h2 = nib_f32_to_f16(after);
            bad = nib_f16_to_f32(h2) != after || (h2 & 0x7C00) == 0; /* fp16 subnormals lose bits */
            memcpy(sc + 2 * i, &h2, 2);
        }
        if (bad) {
            nib_free(sc);
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: pre-quantized %s scale %zu (row %lld) is %g; times the query scale %g it "
                           "is not exact in the scale format, so folding would requantize; quantize this component to "
                           "fp8 or load it from float weights", name, nib_wfmt_name(w->fmt), i, (long long)(i / (size_t)per),
                           (double)before, (double)s);
        }
    }
    w->scales = sc, *owned = sc;
    return NIB_OK;
}

static nib_status load_fused(nib_pi05 *m, const nib_st_file *f, const fused_spec *sp, nib_be_linear *out) {
    nib_status st = NIB_OK;
    const nib_wfmt fmt = sp->comp == COMP_VISION ? m->prec.vision : sp->comp == COMP_PREFIX ? m->prec.prefix : m->prec.expert;
    const int preq = (m->preq >> sp->comp) & 1;
    int64_t n = 0;
    float *cat = NULL, *a = NULL, *bias = NULL;
    void *owned = NULL;
    nib_qlinear parts[3], fused;
    memset(parts, 0, sizeof parts);
    memset(&fused, 0, sizeof fused);
    for (int i = 0; i < sp->nparts; i++) n += sp->rows[i];
    for (int i = 0; i < sp->nparts; i++) {
        nib_pi05_lin li;
        NIB_TRY(nib_pi05_linear(f, sp->bases[i], &li));
        if (li.n != sp->rows[i] || li.k != sp->k) {
            st = NIB_ERR(NIB_ERR_SHAPE, "checkpoint: linear '%s' is [%lld, %lld], expected [%lld, %lld]", sp->bases[i],
                         (long long)li.n, (long long)li.k, (long long)sp->rows[i], (long long)sp->k);
            goto fail;
        }
        if (li.prequant != preq || (preq && li.fmt != fmt)) {
            st = NIB_ERR(NIB_ERR_FORMAT, "checkpoint: linear '%s' is %s %s, but the %s component's first linear is %s %s: "
                         "a component must be all float or all pre-quantized in one format", sp->bases[i],
                         li.prequant ? "pre-quantized" : "float", li.prequant ? nib_wfmt_name(li.fmt) : "",
                         k_comp_name[sp->comp], preq ? "pre-quantized" : "float", preq ? nib_wfmt_name(fmt) : "");
            goto fail;
        }
    }
    if (sp->bias) {
        bias = nib_malloc((size_t)n * 4 + 4);
        if (!bias) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        int64_t off = 0;
        for (int i = 0; i < sp->nparts; i++) {
            int64_t bs[1] = {sp->rows[i]};
            NIB_TRY(fetchf(f, 1, bs, &a, "%s.bias", sp->bases[i]));
            const float sc = i == 0 ? sp->qscale : 1.0f;
            for (int64_t j = 0; j < sp->rows[i]; j++) bias[off + j] = a[j] * sc;
            off += sp->rows[i];
            nib_free(a);
            a = NULL;
        }
    }
    if (!preq) {
        cat = nib_malloc((size_t)(n * sp->k) * 4 + 4);
        if (!cat) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        int64_t off = 0;
        for (int i = 0; i < sp->nparts; i++) {
            int64_t ws[2] = {sp->rows[i], sp->k};
            NIB_TRY(fetchf(f, 2, ws, &a, "%s.weight", sp->bases[i]));
            const float sc = i == 0 ? sp->qscale : 1.0f;
            if (sc != 1.0f)
                for (int64_t j = 0; j < sp->rows[i] * sp->k; j++) a[j] *= sc;
            memcpy(cat + off * sp->k, a, (size_t)(sp->rows[i] * sp->k) * 4);
            off += sp->rows[i];
            nib_free(a);
            a = NULL;
        }
        if (sp->fold) fold_cols(cat, n, sp->k, sp->fold);
        NIB_TRY(load_linear(m, sp->name, fmt, cat, n, sp->k, bias, sp->geglu, sp->rope_half, sp->w8a8, out));
    } else {
        for (int i = 0; i < sp->nparts; i++) {
            nib_pi05_lin li;
            NIB_TRY(nib_pi05_linear(f, sp->bases[i], &li));
            NIB_TRY(nib_qckpt_get_linear(f, li.base, &parts[i]));
        }
        const nib_qlinear *q = &parts[0];
        if (sp->nparts > 1) {
            NIB_TRY(nib_qlinear_concat_rows(parts, (size_t)sp->nparts, sp->name, &fused));
            q = &fused;
        }
        nib_wsrc src = q->w;
        src.bias = bias;
        src.rope_half = sp->rope_half;
        if (sp->qscale != 1.0f) NIB_TRY(scale_rows(&src, sp->rows[0], sp->qscale, sp->name, &owned));
        NIB_TRY(nib_be_linear_load(&m->be, &src, sp->geglu, sp->w8a8, sp->name, out));
    }
fail:
    for (int i = 0; i < 3; i++) nib_qlinear_free(&parts[i]);
    nib_qlinear_free(&fused);
    nib_free(owned), nib_free(cat), nib_free(a), nib_free(bias);
    return st;
}

/* Which components the checkpoint holds pre-quantized (decided by layer 0's q_proj; every
 * other linear is checked against it as it loads). A pre-quantized component runs in its
 * stored format whatever the preset says. */
static nib_status resolve_formats(nib_pi05 *m, const nib_st_file *f) {
    const char *probe[3] = {PI05_VP ".encoder.layers.0.self_attn.q_proj", PI05_LP ".layers.0.self_attn.q_proj",
                            PI05_EP ".layers.0.self_attn.q_proj"};
    nib_wfmt *slot[3] = {&m->prec.vision, &m->prec.prefix, &m->prec.expert};
    m->preq = 0;
    for (int c = 0; c < 3; c++) {
        nib_pi05_lin li;
        NIB_RETURN_IF_ERR(nib_pi05_linear(f, probe[c], &li));
        if (!li.prequant) continue;
        if (*slot[c] != li.fmt && m->prec.backend == NIB_BE_CUDA)
            nib_log(NIB_LOG_INFO, "pi05: %s is pre-quantized as %s in the checkpoint; running it as stored (the preset "
                    "asked for %s)", k_comp_name[c], nib_wfmt_name(li.fmt), nib_wfmt_name(*slot[c]));
        *slot[c] = li.fmt;
        m->preq |= 1 << c;
    }
    return NIB_OK;
}

const nib_pi05_precision *nib_pi05_prec(const nib_pi05 *m) { return &m->prec; }
int nib_pi05_prequantized(const nib_pi05 *m) { return m->preq; }

/* ---- sizes ---------------------------------------------------------------------------------- */
static uint64_t al256(uint64_t x) { return (x + 255) / 256 * 256; }

/* The call's inputs, one device block (and its host mirror): valid lengths, prefix and suffix
 * positions, text ids, x_t (the noise in, the actions out), then the images (last, so a call copies
 * only its valid cameras' bytes). */
typedef struct in_layout {
    uint64_t ints, pos_prefix, pos_suffix, ids, xt, img, total;
} in_layout;
static in_layout inputs_layout(const nib_pi05_config *c) {
    const uint64_t S = (uint64_t)c->max_cameras * c->v_tokens + (uint64_t)c->max_text, H = (uint64_t)c->max_horizon;
    in_layout o;
    o.ints = 0;
    o.pos_prefix = o.ints + al256(16 * 4);
    o.pos_suffix = o.pos_prefix + al256(S * 4);
    o.ids = o.pos_suffix + al256(H * 4);
    o.xt = o.ids + al256((uint64_t)c->max_text * 4);
    o.img = o.xt + al256(H * (uint64_t)c->action_dim * 4);
    o.total = o.img + al256((uint64_t)c->max_cameras * c->v_channels * c->v_image * c->v_image * 4);
    return o;
}

static uint64_t lin_bytes(const nib_pi05 *m, nib_wfmt f, int64_t n, int64_t k, int geglu, int w8a8) {
    (void)geglu, (void)w8a8;
    if (m->prec.backend == NIB_BE_REF) return al256((uint64_t)n * k * 4) + al256((uint64_t)n * 4);
    if (f == NIB_WFMT_BF16) return al256((uint64_t)n * k * 2 + 256) + al256((uint64_t)n * 4);
    if (f == NIB_WFMT_FP8 && w8a8) return al256((uint64_t)n * k) + 2 * al256((uint64_t)n * 4);
    nib_wsrc s;
    memset(&s, 0, sizeof s);
    s.fmt = f, s.n = n, s.k = k, s.group = 128;
    uint64_t b = 0;
    nib_cuda_weight_bytes(&s, geglu, &b);
    return b + 4096;
}

/* ---- load --------------------------------------------------------------------------------- */

static nib_status load_vision(nib_pi05 *m, const nib_st_file *f) {
    nib_status st = NIB_OK;
    const nib_pi05_config *c = &m->c;
    const int64_t W = c->v_width, F = c->v_mlp, kp = (int64_t)c->v_channels * c->v_patch * c->v_patch;
    float *a = NULL, *b = NULL, *tmp = NULL;
    const int w8a8 = m->prec.vision == NIB_WFMT_FP8;
    /* patch embedding: Conv2d [W][C][p][p] -> [W][Kp] padded with zero columns */
    int64_t s4[4] = {W, c->v_channels, c->v_patch, c->v_patch}, s1[1] = {W}, s2[2];
    NIB_TRY(fetch(f, PI05_VP ".embeddings.patch_embedding.weight", 4, s4, &a));
    NIB_TRY(fetch(f, PI05_VP ".embeddings.patch_embedding.bias", 1, s1, &b));
    tmp = nib_calloc((size_t)(W * m->kpatch), 4);
    if (!tmp) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (int64_t r = 0; r < W; r++) memcpy(tmp + r * m->kpatch, a + r * kp, (size_t)kp * 4);
    NIB_TRY(load_linear(m, "vision.patch_embedding", NIB_WFMT_BF16, tmp, W, m->kpatch, b, 0, 0, 0, &m->patch));
    nib_free(a), nib_free(b), nib_free(tmp);
    a = b = tmp = NULL;
    s2[0] = c->v_tokens, s2[1] = W;
    NIB_TRY(fetch(f, PI05_VP ".embeddings.position_embedding.weight", 2, s2, &a));
    NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)c->v_tokens * W * m->be.act_size, &m->posemb, "position embedding"));
    NIB_TRY(nib_be_upload_act(&m->be, m->posemb, a, (uint64_t)c->v_tokens * W));
    nib_free(a);
    a = NULL;
    for (int l = 0; l < c->v_layers; l++) {
        vis_layer *L = &m->vl[l];
        char nm[256];
        float **norms[4] = {&L->ln1_w, &L->ln1_b, &L->ln2_w, &L->ln2_b};
        const char *nn[4] = {"layer_norm1.weight", "layer_norm1.bias", "layer_norm2.weight", "layer_norm2.bias"};
        for (int i = 0; i < 4; i++) {
            NIB_TRY(fetchf(f, 1, s1, &a, PI05_VP ".encoder.layers.%d.%s", l, nn[i]));
            NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)W * 4, (void **)norms[i], "layernorm"));
            NIB_TRY(nib_be_upload(&m->be, *norms[i], a, (uint64_t)W * 4));
            nib_free(a);
            a = NULL;
        }
        /* fused QKV [3W][W] + bias, unscaled: the attention applies 1/sqrt(head_dim) to the
         * logits (folded into the q rows, the q bias would no longer be exact in bf16, and the
         * product would need nib's epilogue kernel instead of cuBLASLt's bias epilogue) */
        fused_spec sp;
        memset(&sp, 0, sizeof sp);
        snprintf(nm, sizeof nm, "vision.layers.%d.qkv", l);
        sp.name = nm, sp.comp = COMP_VISION, sp.nparts = 3, sp.k = W, sp.qscale = 1, sp.bias = 1, sp.w8a8 = w8a8;
        const char *pr[3] = {"q_proj", "k_proj", "v_proj"};
        for (int i = 0; i < 3; i++) {
            snprintf(sp.bases[i], sizeof sp.bases[i], PI05_VP ".encoder.layers.%d.self_attn.%s", l, pr[i]);
            sp.rows[i] = W;
        }
        NIB_TRY(load_fused(m, f, &sp, &L->qkv));
        struct {
            const char *key, *nm;
            int64_t n, k;
            nib_be_linear *out;
        } lin[3] = {{"self_attn.out_proj", "o", W, W, &L->o}, {"mlp.fc1", "fc1", F, W, &L->fc1}, {"mlp.fc2", "fc2", W, F, &L->fc2}};
        for (int i = 0; i < 3; i++) {
            memset(&sp, 0, sizeof sp);
            snprintf(nm, sizeof nm, "vision.layers.%d.%s", l, lin[i].nm);
            sp.name = nm, sp.comp = COMP_VISION, sp.nparts = 1, sp.k = lin[i].k, sp.qscale = 1, sp.bias = 1, sp.w8a8 = w8a8;
            snprintf(sp.bases[0], sizeof sp.bases[0], PI05_VP ".encoder.layers.%d.%s", l, lin[i].key);
            sp.rows[0] = lin[i].n;
            NIB_TRY(load_fused(m, f, &sp, lin[i].out));
        }
    }
    NIB_TRY(fetch(f, PI05_VP ".post_layernorm.weight", 1, s1, &a));
    NIB_TRY(fetch(f, PI05_VP ".post_layernorm.bias", 1, s1, &b));
    NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)W * 4, (void **)&m->post_w, "post layernorm"));
    NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)W * 4, (void **)&m->post_b, "post layernorm"));
    NIB_TRY(nib_be_upload(&m->be, m->post_w, a, (uint64_t)W * 4));
    NIB_TRY(nib_be_upload(&m->be, m->post_b, b, (uint64_t)W * 4));
    nib_free(a), nib_free(b);
    a = b = NULL;
    int64_t ps[2] = {c->width, W}, pb[1] = {c->width};
    NIB_TRY(fetch(f, PI05_PROJ ".weight", 2, ps, &a));
    NIB_TRY(fetch(f, PI05_PROJ ".bias", 1, pb, &b));
    NIB_TRY(load_linear(m, "multi_modal_projector", NIB_WFMT_BF16, a, c->width, W, b, 0, 0, 0, &m->proj));
fail:
    nib_free(a), nib_free(b), nib_free(tmp);
    return st;
}

/* Gemma-style layer weights of the prefix (expert == 0) or the action expert (expert == 1). */
/* Whether the expert's q|k|v loads in the RoPE pair layout (ops/gemm.h rope_half) for
 * nib_be_gemm_qkv: its epilogue then runs in the product's kernel (one kernel fewer per layer).
 * Not for the persistent kernel (NIB_FUSED_STEP=1 reads the plain order) nor with NIB_GEMM_QKV=0
 * (A/B: the product, then the qkv kernel, as before); nib_be_linear_load ignores it where the
 * weight runs on cuBLAS. */
static int expert_pairs_wanted(const nib_pi05 *m) {
    const char *f = getenv("NIB_FUSED_STEP"), *q = getenv("NIB_GEMM_QKV");
    return m->prec.backend == NIB_BE_CUDA && !(f && !strcmp(f, "1")) && !(q && !strcmp(q, "0"));
}

static nib_status load_lm(nib_pi05 *m, const nib_st_file *f, int expert) {
    nib_status st = NIB_OK;
    const nib_pi05_config *c = &m->c;
    const char *P = expert ? PI05_EP : PI05_LP;
    const int64_t W = expert ? c->e_width : c->width, F = expert ? c->e_mlp : c->mlp;
    const int64_t hd = c->head_dim, nh = expert ? c->e_heads : c->heads, nkv = c->kv_heads;
    const nib_wfmt fmt = expert ? m->prec.expert : m->prec.prefix;
    const int w8a8 = !expert && fmt == NIB_WFMT_FP8; /* the prefix is compute-bound: W8A8 */
    lm_layer *layers = expert ? m->el : m->pl;
    const int preq = (m->preq >> (expert ? COMP_EXPERT : COMP_PREFIX)) & 1;
    const char *tag = expert ? "expert" : "prefix";
    float *g = NULL, *g2 = NULL;
    for (int l = 0; l < c->layers; l++) {
        lm_layer *L = &layers[l];
        const int last_prefix = !expert && l == c->layers - 1; /* K/V only */
        char nm[256];
        int64_t s1[1] = {W};
        /* RMSNorm (1 + w) of the prefix: folded into QKV and gate|up from float weights; applied
         * by the norm for a pre-quantized prefix. adaRMS has no weight. */
        if (!expert) {
            NIB_TRY(fetchf(f, 1, s1, &g, "%s.layers.%d.input_layernorm.weight", P, l));
            NIB_TRY(fetchf(f, 1, s1, &g2, "%s.layers.%d.post_attention_layernorm.weight", P, l));
            if (preq) {
                NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)W * 4, (void **)&L->n1w, "rmsnorm weight"));
                NIB_TRY(nib_be_upload(&m->be, L->n1w, g, (uint64_t)W * 4));
                NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)W * 4, (void **)&L->n2w, "rmsnorm weight"));
                NIB_TRY(nib_be_upload(&m->be, L->n2w, g2, (uint64_t)W * 4));
            }
        }
        fused_spec sp;
        memset(&sp, 0, sizeof sp);
        snprintf(nm, sizeof nm, "%s.layers.%d.qkv", tag, l);
        /* the prefix folds the query scale 1/sqrt(head_dim) (exact for 256: 1/16) into Wq; the
         * expert applies it in the fused QKV epilogue */
        sp.name = nm, sp.comp = expert ? COMP_EXPERT : COMP_PREFIX, sp.k = W, sp.w8a8 = w8a8;
        sp.qscale = expert || last_prefix ? 1.0f : 1.0f / sqrtf((float)hd);
        sp.fold = preq ? NULL : g;
        sp.rope_half = expert && expert_pairs_wanted(m) ? (int32_t)(hd / 2) : 0;
        const char *pr[3] = {"q_proj", "k_proj", "v_proj"};
        for (int i = last_prefix ? 1 : 0; i < 3; i++) {
            snprintf(sp.bases[sp.nparts], sizeof sp.bases[0], "%s.layers.%d.self_attn.%s", P, l, pr[i]);
            sp.rows[sp.nparts++] = i == 0 ? nh * hd : nkv * hd;
        }
        NIB_TRY(load_fused(m, f, &sp, &L->qkv));
        if (last_prefix) {
            nib_free(g), nib_free(g2);
            g = g2 = NULL;
            continue;
        }
        memset(&sp, 0, sizeof sp);
        snprintf(nm, sizeof nm, "%s.layers.%d.o_proj", tag, l);
        sp.name = nm, sp.comp = expert ? COMP_EXPERT : COMP_PREFIX, sp.k = nh * hd, sp.w8a8 = w8a8, sp.qscale = 1;
        snprintf(sp.bases[0], sizeof sp.bases[0], "%s.layers.%d.self_attn.o_proj", P, l);
        sp.rows[0] = W, sp.nparts = 1;
        NIB_TRY(load_fused(m, f, &sp, &L->o));
        memset(&sp, 0, sizeof sp);
        snprintf(nm, sizeof nm, "%s.layers.%d.gate_up", tag, l);
        sp.name = nm, sp.comp = expert ? COMP_EXPERT : COMP_PREFIX, sp.k = W, sp.w8a8 = w8a8, sp.qscale = 1;
        sp.geglu = 1, sp.fold = preq ? NULL : g2, sp.nparts = 2;
        snprintf(sp.bases[0], sizeof sp.bases[0], "%s.layers.%d.mlp.gate_proj", P, l);
        snprintf(sp.bases[1], sizeof sp.bases[1], "%s.layers.%d.mlp.up_proj", P, l);
        sp.rows[0] = sp.rows[1] = F;
        NIB_TRY(load_fused(m, f, &sp, &L->gu));
        memset(&sp, 0, sizeof sp);
        snprintf(nm, sizeof nm, "%s.layers.%d.down_proj", tag, l);
        sp.name = nm, sp.comp = expert ? COMP_EXPERT : COMP_PREFIX, sp.k = F, sp.w8a8 = w8a8, sp.qscale = 1;
        snprintf(sp.bases[0], sizeof sp.bases[0], "%s.layers.%d.mlp.down_proj", P, l);
        sp.rows[0] = W, sp.nparts = 1;
        NIB_TRY(load_fused(m, f, &sp, &L->down));
        if (expert && fmt == NIB_WFMT_NVFP4) { /* the plans measured in this model at H = 10, gate|up's at H = 50 too
                                                 * (ops/gemm.h) */
            L->qkv.q.plan_rule = L->o.q.plan_rule = L->down.q.plan_rule = NIB_GEMM_RULE_K1024;
            L->gu.q.plan_rule = NIB_GEMM_RULE_K1024_WK1;
        }
        nib_free(g), nib_free(g2);
        g = g2 = NULL;
    }
fail:
    nib_free(g), nib_free(g2);
    return st;
}

static float swishf(float x) { return x / (1.0f + expf(-x)); }

/* mods[s][n][r] = b[r] + W[r] . cond_s (fp64 sums), rows [b, e) for every step */
typedef struct mod_ctx {
    const float *mw, *mb, *conds;
    float *mods;
    int64_t We, n, nmod;
    int steps;
} mod_ctx;
static void mod_chunk(void *arg, int64_t b, int64_t e) {
    const mod_ctx *x = (const mod_ctx *)arg;
    for (int s = 0; s < x->steps; s++) {
        const float *cond = x->conds + (int64_t)s * x->We;
        float *dst = x->mods + ((int64_t)s * x->nmod + x->n) * 3 * x->We;
        for (int64_t r = b; r < e; r++) {
            double acc = x->mb[r];
            for (int64_t j = 0; j < x->We; j++) acc += (double)x->mw[r * x->We + j] * cond[j];
            dst[r] = (float)acc;
        }
    }
}

/* time MLP and the 2L+1 adaRMS modulations for every step (host fp64 sums), and the folded
 * action heads */
static nib_status load_expert_heads(nib_pi05 *m, const nib_st_file *f) {
    nib_status st = NIB_OK;
    const nib_pi05_config *c = &m->c;
    const int64_t We = c->e_width, A = c->action_dim, nmod = 2 * (int64_t)c->e_layers + 1;
    float *ti_w = NULL, *ti_b = NULL, *to_w = NULL, *to_b = NULL, *mw = NULL, *mb = NULL, *mods = NULL, *a = NULL, *b = NULL;
    float *conds = NULL, *emb = NULL, *h = NULL;
    int64_t s2[2] = {We, We}, s1[1] = {We}, m2[2] = {3 * We, We}, m1[1] = {3 * We};
    NIB_TRY(fetch(f, "time_mlp_in.weight", 2, s2, &ti_w));
    NIB_TRY(fetch(f, "time_mlp_in.bias", 1, s1, &ti_b));
    NIB_TRY(fetch(f, "time_mlp_out.weight", 2, s2, &to_w));
    NIB_TRY(fetch(f, "time_mlp_out.bias", 1, s1, &to_b));
    mods = nib_calloc((size_t)(c->steps * nmod * 3 * We), 4);
    conds = nib_malloc((size_t)(c->steps * We) * 4);
    emb = nib_malloc((size_t)We * 4);
    h = nib_malloc((size_t)We * 4);
    if (!mods || !conds || !emb || !h) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    {
        /* t = 1, 1 + dt, ... accumulated in fp32 as openpi does (pi05.md §2.6) */
        float t = 1.0f;
        const float dt = -1.0f / (float)c->steps;
        const int64_t half = We / 2;
        for (int s = 0; s < c->steps; s++) {
            /* sinusoidal embedding (pi05.md §2.2), computed in fp64, stored fp32 */
            for (int64_t i = 0; i < half; i++) {
                double frac = half > 1 ? (double)i / (double)(half - 1) : 0.0;
                double period = 4e-3 * pow(4.0 / 4e-3, frac);
                double phi = (double)t * 2.0 * M_PI / period;
                emb[i] = (float)sin(phi);
                emb[half + i] = (float)cos(phi);
            }
            /* cond = swish(time_mlp_out(swish(time_mlp_in(emb)))) with fp64 sums */
            for (int64_t r = 0; r < We; r++) {
                double acc = ti_b[r];
                for (int64_t j = 0; j < We; j++) acc += (double)ti_w[r * We + j] * emb[j];
                h[r] = swishf((float)acc);
            }
            for (int64_t r = 0; r < We; r++) {
                double acc = to_b[r];
                for (int64_t j = 0; j < We; j++) acc += (double)to_w[r * We + j] * h[j];
                conds[(int64_t)s * We + r] = swishf((float)acc);
            }
            t = t + dt;
        }
    }
    /* every adaRMS norm n (2l: layer l pre-attention, 2l+1: pre-FFW, 2L: final):
     * mods[s][n] = [scale | shift | gate] = W_n cond_s + b_n */
    for (int64_t n = 0; n < nmod; n++) {
        char name[256];
        if (n == nmod - 1) snprintf(name, sizeof name, PI05_EP ".norm.dense");
        else snprintf(name, sizeof name, PI05_EP ".layers.%d.%s.dense", (int)(n / 2),
                      n % 2 ? "post_attention_layernorm" : "input_layernorm");
        NIB_TRY(fetchf(f, 2, m2, &mw, "%s.weight", name));
        NIB_TRY(fetchf(f, 1, m1, &mb, "%s.bias", name));
        mod_ctx x = {mw, mb, conds, mods, We, n, nmod, c->steps};
        nib_parallel_for(3 * We, 0, 64, mod_chunk, &x);
        nib_free(mw), nib_free(mb);
        mw = mb = NULL;
    }
    NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)c->steps * nmod * 3 * We * 4, (void **)&m->mods, "adaRMS modulations"));
    NIB_TRY(nib_be_upload(&m->be, m->mods, mods, (uint64_t)c->steps * nmod * 3 * We * 4));
    /* action heads: in 32 -> We; out We -> 32 with dt folded */
    {
        int64_t is[2] = {We, A}, ib[1] = {We}, os[2] = {A, We}, ob[1] = {A};
        NIB_TRY(fetch(f, "action_in_proj.weight", 2, is, &a));
        NIB_TRY(fetch(f, "action_in_proj.bias", 1, ib, &b));
        NIB_TRY(load_linear(m, "action_in_proj", NIB_WFMT_BF16, a, We, A, b, 0, 0, 0, &m->ain));
        if (m->be.kind == NIB_BE_CUDA) { /* the edge kernel reads it along We (ops/edge.h) */
            uint16_t *t = nib_malloc((size_t)(A * We) * 2);
            if (!t) {
                st = NIB_ERR_OUT_OF_MEMORY;
                goto fail;
            }
            for (int64_t n = 0; n < We; n++)
                for (int64_t k = 0; k < A; k++) t[k * We + n] = nib_f32_to_bf16(a[n * A + k]);
            st = nib_be_alloc_weight(&m->be, (uint64_t)(A * We) * 2, &m->ain_t, "action_in_proj (transposed)");
            if (!st) st = nib_be_upload(&m->be, m->ain_t, t, (uint64_t)(A * We) * 2);
            nib_free(t);
            if (st) goto fail;
        }
        nib_free(a), nib_free(b);
        a = b = NULL;
        NIB_TRY(fetch(f, "action_out_proj.weight", 2, os, &a));
        NIB_TRY(fetch(f, "action_out_proj.bias", 1, ob, &b));
        const float dt = -1.0f / (float)c->steps;
        for (int64_t i = 0; i < A * We; i++) a[i] *= dt;
        for (int64_t i = 0; i < A; i++) b[i] *= dt;
        NIB_TRY(load_linear(m, "action_out_proj", NIB_WFMT_BF16, a, A, We, b, 0, 0, 0, &m->aout));
    }
fail:
    nib_free(ti_w), nib_free(ti_b), nib_free(to_w), nib_free(to_b), nib_free(mw), nib_free(mb), nib_free(mods);
    nib_free(a), nib_free(b), nib_free(conds), nib_free(emb), nib_free(h);
    return st;
}

/* ---- plan: sizes of the weight slab and the activation arena ------------------------------ */
static void plan_sizes(const nib_pi05 *m, nib_be_sizes *sz) {
    const nib_pi05_config *c = &m->c;
    const int64_t W = c->width, We = c->e_width, Wv = c->v_width, hd = c->head_dim, nkv = c->kv_heads;
    const int64_t Vt = (int64_t)c->max_cameras * c->v_tokens, S = Vt + c->max_text, H = c->max_horizon;
    const int64_t nmod = 2 * (int64_t)c->e_layers + 1;
    const nib_wfmt vf = m->prec.vision, pf = m->prec.prefix, ef = m->prec.expert;
    uint64_t wb = 0;
    wb += lin_bytes(m, NIB_WFMT_BF16, Wv, m->kpatch, 0, 0) + lin_bytes(m, NIB_WFMT_BF16, W, Wv, 0, 0);
    wb += al256((uint64_t)c->v_tokens * Wv * m->be.act_size) + 2 * al256((uint64_t)Wv * 4);
    for (int l = 0; l < c->v_layers; l++)
        wb += 4 * al256((uint64_t)Wv * 4) + lin_bytes(m, vf, 3 * Wv, Wv, 0, vf == NIB_WFMT_FP8) +
              lin_bytes(m, vf, Wv, Wv, 0, vf == NIB_WFMT_FP8) + lin_bytes(m, vf, c->v_mlp, Wv, 0, vf == NIB_WFMT_FP8) +
              lin_bytes(m, vf, Wv, c->v_mlp, 0, vf == NIB_WFMT_FP8);
    wb += al256((uint64_t)c->vocab * W * m->be.act_size);
    for (int l = 0; l < c->layers; l++) {
        int last = l == c->layers - 1;
        int pw = pf == NIB_WFMT_FP8;
        wb += lin_bytes(m, pf, (last ? 0 : c->heads * hd) + 2 * nkv * hd, W, 0, pw);
        wb += 2 * al256((uint64_t)W * 4); /* RMSNorm weights of a pre-quantized prefix */
        if (!last)
            wb += lin_bytes(m, pf, W, c->heads * hd, 0, pw) + lin_bytes(m, pf, 2 * (int64_t)c->mlp, W, 1, pw) +
                  lin_bytes(m, pf, W, c->mlp, 0, pw);
        wb += lin_bytes(m, ef, (c->e_heads + 2 * nkv) * hd, We, 0, 0) + lin_bytes(m, ef, We, c->e_heads * hd, 0, 0) +
              lin_bytes(m, ef, 2 * (int64_t)c->e_mlp, We, 1, 0) + lin_bytes(m, ef, We, c->e_mlp, 0, 0);
    }
    wb += lin_bytes(m, NIB_WFMT_BF16, We, c->action_dim, 0, 0) + lin_bytes(m, NIB_WFMT_BF16, c->action_dim, We, 0, 0);
    wb += al256((uint64_t)We * c->action_dim * 2); /* ain_t */
    wb += al256((uint64_t)c->steps * nmod * 3 * We * 4) + al256((uint64_t)hd * 4);
    sz->weight_bytes = wb + (1 << 20);

    const uint64_t a = m->be.act_size;
    const int64_t Fv = c->v_mlp, F = c->mlp, Fe = c->e_mlp;
    uint64_t ab = 0;
    ab += al256(Vt * m->kpatch * a) + 2 * al256(Vt * Wv * a) + al256(Vt * 3 * Wv * a) + al256(Vt * Wv * a) + al256(Vt * Fv * a);
    ab += 2 * al256(S * W * a) + al256(S * (c->heads + 2 * nkv) * hd * a) + al256(S * c->heads * hd * a) + al256(S * F * a);
    ab += 2 * al256(H * We * a) + al256(H * (c->e_heads + 2 * nkv) * hd * a) + 2 * al256(H * c->e_heads * hd * a) +
          al256(H * Fe * a) + 2 * al256(H * c->action_dim * a);
    for (int l = 0; l < c->layers; l++) ab += nib_kv_layer_bytes(m->prec.kv, (int32_t)(S + H), (int32_t)nkv, (int32_t)hd) + 256;
    ab += inputs_layout(c).total;
    ab += al256((uint64_t)H * (uint64_t)(hd / 2) * 8); /* rope_cs, when the expert's q|k|v is in the pair layout */
    ab += al256(NIB_CHECK_FINITE_WS_BYTES);
    sz->act_bytes = ab + (1 << 20);

    /* GEMM scratch: the widest output x the most rows (the cuBLAS epilogue path) */
    int64_t max_n = 3 * Wv;
    if (Fv > max_n) max_n = Fv;
    if (2 * F > max_n) max_n = 2 * F;
    if ((c->heads + 2 * nkv) * hd > max_n) max_n = (c->heads + 2 * nkv) * hd;
    if (2 * Fe > max_n) max_n = 2 * Fe;
    sz->max_n = max_n;
    sz->max_m = S > Vt ? S : Vt;
    int64_t max_k = Wv > W ? Wv : W;
    if (Fv > max_k) max_k = Fv;
    if (F > max_k) max_k = F;
    if (c->heads * hd > max_k) max_k = c->heads * hd;
    sz->max_k = max_k;
    sz->attn_ws_bytes = 0;
}

/* workspace for the expert's cache attention (per-op path) at every horizon and every view length
 * op_layer may pass (S + H, up to the cache's slots). The plan depends on the length only through
 * its count of key tiles (16, 32, 64 or 128 keys) and the per-token rule's 64-key tiles, so the
 * multiples of 16 and the full length cover every plan a call can make (CUDA). */
static nib_status cache_ws_bytes(const nib_pi05 *m, uint64_t *out) {
    const nib_pi05_config *c = &m->c;
    uint64_t best = 0, b = 0;
    nib_attn_cache_args ca;
    memset(&ca, 0, sizeof ca);
    ca.n_heads = c->e_heads, ca.q_tok = ca.o_tok = (int64_t)c->e_heads * c->head_dim;
    const int32_t tmax = (int32_t)c->max_cameras * c->v_tokens + c->max_text + c->max_horizon;
    ca.kv.dtype = m->prec.kv;
    ca.kv.n_kv_heads = c->kv_heads, ca.kv.head_dim = c->head_dim;
    for (int32_t t = 16;; t += 16) {
        ca.kv.t_max = t < tmax ? t : tmax;
        for (int h = 1; h <= c->max_horizon; h++) {
            ca.nq = h;
            NIB_RETURN_IF_ERR(nib_cuda_attn_cache_ws_bytes(&ca, &b));
            if (b > best) best = b;
        }
        if (t >= tmax) break;
    }
    *out = best;
    return NIB_OK;
}

/* workspace for the attention calls (CUDA). The split count is planned from each call's own
 * sizes, so the workspace need is not monotone in them: take the maximum over every shape a
 * forward can issue (camera count, prefix length, horizon). Plans are host arithmetic only;
 * strides are those of forward()'s buffers. */
static nib_status attn_ws_bytes(const nib_pi05 *m, uint64_t *out) {
    const nib_pi05_config *c = &m->c;
    uint64_t best = 0, b = 0;
    nib_attn_prefix_args pa;
    memset(&pa, 0, sizeof pa);
    pa.n_heads = pa.n_kv_heads = c->v_heads, pa.head_dim = c->v_head_dim;
    pa.q_tok = pa.k_tok = pa.v_tok = pa.o_tok = (int64_t)c->v_heads * c->v_head_dim;
    for (int v = 1; v <= c->max_cameras; v++) {
        pa.n_seq = v, pa.s_max = c->v_tokens;
        NIB_RETURN_IF_ERR(nib_cuda_attn_prefix_ws_bytes(&pa, &b));
        if (b > best) best = b;
    }
    memset(&pa, 0, sizeof pa);
    pa.n_seq = 1, pa.n_heads = c->heads, pa.n_kv_heads = c->kv_heads, pa.head_dim = c->head_dim;
    pa.q_tok = pa.o_tok = (int64_t)c->heads * c->head_dim, pa.k_tok = pa.v_tok = (int64_t)c->kv_heads * c->head_dim;
    for (int64_t s = 1; s <= (int64_t)c->max_cameras * c->v_tokens + c->max_text; s++) {
        pa.s_max = (int32_t)s;
        NIB_RETURN_IF_ERR(nib_cuda_attn_prefix_ws_bytes(&pa, &b));
        if (b > best) best = b;
    }
    NIB_RETURN_IF_ERR(cache_ws_bytes(m, &b));
    *out = best > b ? best : b;
    return NIB_OK;
}

/* ---- the persistent expert kernel ------------------------------------------------------ */
static int32_t expert_rows(const nib_pi05 *m) {
    return m->c.max_horizon < NIB_EXPERT_MAX_ROWS ? m->c.max_horizon : NIB_EXPERT_MAX_ROWS;
}
static int32_t kv_slots(const nib_pi05 *m) {
    const nib_pi05_config *c = &m->c;
    return (int32_t)c->max_cameras * c->v_tokens + c->max_text + c->max_horizon;
}

/* the kernel's arguments for a call with H rows at step s (layers: m->xl) */
static void expert_args(const nib_pi05 *m, int32_t H, int s, nib_expert_args *a) {
    const nib_pi05_config *c = &m->c;
    memset(a, 0, sizeof *a);
    a->n_layers = c->e_layers, a->layers = m->xl, a->rows = H;
    a->width = c->e_width, a->mlp = c->e_mlp, a->n_heads = c->e_heads, a->head_dim = c->head_dim;
    a->eps = NIB_NORM_EPS, a->q_scale = 1.0f / sqrtf((float)c->head_dim);
    a->mods = m->mods + (int64_t)s * (2 * (int64_t)c->e_layers + 1) * 3 * c->e_width;
    a->t_valid = m->ints + 1, a->slot_base = m->ints + 2, a->positions = m->pos_suffix, a->inv_freq = m->inv_freq;
    a->x = m->ex, a->qkv = m->eqkv, a->o = m->eattn, a->h = m->emlp;
}

/* workspace bytes at the maxima (before the weights exist: only shapes are read) */
static nib_status expert_ws_bytes(const nib_pi05 *m, uint64_t *out) {
    const nib_pi05_config *c = &m->c;
    *out = 0;
    nib_expert_layer *tmp = nib_calloc((size_t)c->e_layers, sizeof *tmp);
    if (!tmp) return NIB_ERR_OUT_OF_MEMORY;
    for (int l = 0; l < c->e_layers; l++) tmp[l].kv.t_max = kv_slots(m);
    nib_expert_args a;
    memset(&a, 0, sizeof a);
    a.n_layers = c->e_layers, a.layers = tmp, a.rows = expert_rows(m), a.n_heads = c->e_heads, a.width = c->e_width;
    nib_status st = nib_cuda_expert_ws_bytes(&a, out);
    nib_free(tmp);
    return st;
}

/* Decide once at load whether the per-op step's edge runs as one op (ops/edge.h): the final adaRMS,
 * the action-out product, x_t's update and, between two steps, the next step's x_t conversion,
 * action-in product and layer 0's first adaRMS; otherwise six ops (NIB_STEP_EDGE=0, the A/B switch,
 * or shapes the kernel does not take). CUDA only: the reference runs the ops one by one. */
static nib_status edge_setup(nib_pi05 *m) {
    m->edge = 0;
    const char *e = getenv("NIB_STEP_EDGE");
    if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_STEP_EDGE=%s: 1 (the flow step's edge in one kernel, the default) or 0 "
                                            "(its six ops)", e);
    if (m->be.kind != NIB_BE_CUDA || !m->ain_t || (e && !strcmp(e, "0"))) return NIB_OK;
    if (nib_edge_supported(NIB_EDGE_OUT | NIB_EDGE_IN, m->c.e_width, m->c.action_dim)) {
        nib_clear_error(); /* another width or action dim: the six ops */
        return NIB_OK;
    }
    m->edge = 1;
    snprintf(m->xpath + strlen(m->xpath), sizeof m->xpath - strlen(m->xpath), "; the step edges in one kernel");
    return NIB_OK;
}

/* Decide the expert path once at load: the per-op path (the default), or with NIB_FUSED_STEP=1 the
 * persistent kernel where it supports this model (else the per-op path, the reason in m->xpath).
 * The per-op path is the default since the fortieth session: with the GEMM and attention work of the
 * sessions before it, fast at H = 10 takes 0.683 ms per step against the kernel's 0.742 (H100, one
 * build, runs alternated: 2 cameras 11.37 -> 10.78 ms, 1 camera 10.61 -> 9.87, 3 cameras
 * 12.88 -> 12.14; bench/results/pi05-expert-path-h100.json). */
static nib_status expert_setup(nib_pi05 *m) {
    const nib_pi05_config *c = &m->c;
    m->fused = 0;
    if (m->be.kind != NIB_BE_CUDA) {
        snprintf(m->xpath, sizeof m->xpath, "per-op (reference backend)");
        return NIB_OK;
    }
    const char *e = getenv("NIB_FUSED_STEP");
    if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FUSED_STEP=%s: 0 (the per-op expert, the default) or 1 (the "
                                            "persistent kernel where it applies)", e);
    if (!e || strcmp(e, "1")) {
        snprintf(m->xpath, sizeof m->xpath, "per-op (the default; NIB_FUSED_STEP=1: the persistent kernel)");
        return NIB_OK;
    }
    m->xl = nib_calloc((size_t)c->e_layers, sizeof *m->xl);
    if (!m->xl) return NIB_ERR_OUT_OF_MEMORY;
    for (int l = 0; l < c->e_layers; l++) {
        m->xl[l].qkv = &m->el[l].qkv.q, m->xl[l].o = &m->el[l].o.q;
        m->xl[l].gu = &m->el[l].gu.q, m->xl[l].down = &m->el[l].down.q;
        m->xl[l].kv = m->kv[l];
    }
    nib_expert_args a;
    expert_args(m, expert_rows(m), 0, &a);
    nib_status st = nib_cuda_expert_supported(&a);
    if (st == NIB_ERR_UNSUPPORTED || st == NIB_ERR_SHAPE) {
        snprintf(m->xpath, sizeof m->xpath, "per-op (%s)", nib_last_error());
        nib_clear_error();
        return NIB_OK;
    }
    NIB_RETURN_IF_ERR(st);
    NIB_RETURN_IF_ERR(nib_be_alloc_act(&m->be, m->xws_bytes, &m->xws, "expert kernel workspace"));
    NIB_RETURN_IF_ERR(nib_cuda_expert_prepare(&a, m->xws, m->xws_bytes));
    m->fused = 1;
    m->xrows = expert_rows(m);
    m->xgrid = 0;
    NIB_RETURN_IF_ERR(nib_cuda_expert_grid(&a, &m->xgrid_max));
    const char *g = getenv("NIB_EXPERT_CTAS"); /* lab: the kernel on fewer CTAs (even, <= one per SM) */
    if (g && *g) {
        char *end;
        long v = strtol(g, &end, 10);
        if (*end || v < 2 || v % 2 || v > m->xgrid_max)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_EXPERT_CTAS=%s: an even number of CTAs in 2..%d", g,
                           (int)m->xgrid_max);
        m->xgrid = (int32_t)v;
    }
    snprintf(m->xpath, sizeof m->xpath, "persistent kernel for H <= %d, per-op above", (int)m->xrows);
    return NIB_OK;
}

const char *nib_pi05_expert_path(const nib_pi05 *m) { return m ? m->xpath : ""; }

/* Decide once at load how the prefix applies RoPE and fills the cache: on the GPU with a bf16
 * cache, one kernel (ops/qkv.h: q into its own buffer, the MLP's [Smax][F], free until the MLP;
 * K/V into the cache, from which the attention then reads them); otherwise (or NIB_FUSED_QKV=0, for
 * A/B) RoPE in place in the QKV output, then the plain cache write (the attention reads the exact
 * bf16 k / v from the QKV output: a low-bit cache holds only their quantized values). */
static void prefix_setup(nib_pi05 *m) {
    const nib_pi05_config *c = &m->c;
    const char *e = getenv("NIB_FUSED_QKV");
    const char *why = m->be.kind != NIB_BE_CUDA ? "reference backend"
                      : m->prec.kv != NIB_KV_BF16 ? "the KV cache is not bf16"
                      : c->mlp < (int64_t)c->heads * c->head_dim ? "the MLP buffer cannot hold q"
                      : e && !strcmp(e, "0") ? "NIB_FUSED_QKV=0" : NULL;
    m->fused_qkv = why == NULL;
    if (why) snprintf(m->ppath, sizeof m->ppath, "RoPE, then the cache write (%s)", why);
    else snprintf(m->ppath, sizeof m->ppath, "fused RoPE + cache write (attention reads the bf16 cache)");
}

const char *nib_pi05_prefix_path(const nib_pi05 *m) { return m ? m->ppath : ""; }

/* Whether the first step runs op by op beside the prefix (overlap_ops_setup) also at the H where the
 * persistent kernel runs the other steps. Measured on an H100 (fast, H = 10; docs/design.md,
 * "Thirty-fourth session"): 1 camera 10.81 -> 10.65 ms, 2 cameras 11.71 -> 11.40, 3 cameras 13.06 ->
 * 12.91 against the kernel's first layers beside the prefix, which hold their SMs for the whole prefix
 * (graph edges instead: each layer's kernels start when its cache write is done, and take SMs only
 * while they run). NIB_OVERLAP_FIRST_OPS=0 gives the kernel's overlap back (overlap_setup). */
static int first_ops_wanted(const nib_pi05 *m) {
    const char *e = getenv("NIB_OVERLAP"), *eo = getenv("NIB_OVERLAP_OPS"), *fo = getenv("NIB_OVERLAP_FIRST_OPS");
    if (!m->fused || m->be.kind != NIB_BE_CUDA || m->c.e_layers > m->c.layers || (e && !strcmp(e, "0")) ||
        (eo && !strcmp(eo, "0")))
        return 0;
    return !(fo && !strcmp(fo, "0"));
}

/* The first flow step needs, at expert layer l, only prefix layer l's K/V (and x_t, not the prefix's
 * output): so it can run while the prefix computes the later layers. Where the persistent kernel
 * runs the steps and the prefix writes its cache with the fused RoPE + cache kernel (whose CTAs
 * signal, ops/qkv.h done), the first step runs on a second stream on a few CTAs (they hold their
 * SMs for the whole prefix: the prefix runs on the others), every layer's attention waiting for its
 * layer's counter. NIB_OVERLAP=0 turns it off (A/B), NIB_OVERLAP_CTAS=N forces N CTAs at every
 * prefix length (lab); otherwise beside_grid's measured rule decides per prefix length. Since the
 * thirty-fourth session only with NIB_OVERLAP_FIRST_OPS=0 (first_ops_wanted). */
static nib_status overlap_setup(nib_pi05 *m) {
    const nib_pi05_config *c = &m->c;
    m->overlap = 0;
    if (first_ops_wanted(m)) return NIB_OK; /* overlap_ops_setup runs the first step beside the prefix */
    const char *e = getenv("NIB_OVERLAP"), *lb = getenv("CUDA_LAUNCH_BLOCKING");
    if (!m->fused || !m->fused_qkv || c->e_layers > c->layers || (e && !strcmp(e, "0"))) return NIB_OK;
    /* The kernel waits for work of another stream: where kernels may run one at a time (launches made
     * blocking; the tools that replay or instrument kernels, recognized by the variables they set in
     * their target's environment) it would wait for a prefix that cannot start, until its timeout
     * (a failed call). NIB_OVERLAP=1 insists anyway. */
    const int insist = e && !strcmp(e, "1");
    const char *off = lb && !strcmp(lb, "1") ? "CUDA_LAUNCH_BLOCKING=1"
                      : insist               ? NULL
                      : getenv("NV_SANITIZER_INJECTION_PORT_BASE") ? "under compute-sanitizer"
                      : getenv("NV_COMPUTE_PROFILER_PERFWORKS_DIR") || getenv("NV_NSIGHT_INJECTION_PORT_BASE")
                          ? "under an Nsight profiler"
                      : getenv("CUDA_INJECTION64_PATH") ? "a CUDA tool is injected (CUDA_INJECTION64_PATH)"
                                                        : NULL;
    m->ogrid = 0;
    const char *g = getenv("NIB_OVERLAP_CTAS");
    if (g && *g) {
        char *end;
        long v = strtol(g, &end, 10);
        if (*end || v < 2 || v % 2 || v > m->xgrid_max / 2)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_OVERLAP_CTAS=%s: an even number of CTAs in 2..%d (half the GPU)", g,
                           (int)(m->xgrid_max / 2));
        m->ogrid = (int32_t)v;
    }
    m->olayers = 0;
    const char *ol = getenv("NIB_OVERLAP_LAYERS");
    if (ol && *ol) {
        char *end;
        long v = strtol(ol, &end, 10);
        if (*end || v < 1 || v > c->e_layers)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_OVERLAP_LAYERS=%s: the first step's layers beside the prefix, 1..%d",
                           ol, (int)c->e_layers);
        m->olayers = (int32_t)v;
    }
    if (off) {
        snprintf(m->xpath + strlen(m->xpath), sizeof m->xpath - strlen(m->xpath), "; the first step after the prefix (%s)",
                 off);
        return NIB_OK;
    }
    NIB_RETURN_IF_ERR(nib_be_alloc_act(&m->be, (uint64_t)c->e_layers * 128, (void **)&m->kv_sig, "overlap counters"));
    NIB_RETURN_IF_ERR(nib_host_mapped_alloc((void **)&m->kvto_h, (void **)&m->kvto_d, 4, "overlap timeout flag"));
    const char *drop = getenv("NIB_OVERLAP_DROP_SIGNALS");
    m->drop_sig = drop && !strcmp(drop, "1");
    m->overlap = 1;
    if (m->ogrid)
        snprintf(m->xpath + strlen(m->xpath), sizeof m->xpath - strlen(m->xpath),
                 "; the first step beside the prefix on %d CTAs (NIB_OVERLAP_CTAS)", (int)m->ogrid);
    else
        snprintf(m->xpath + strlen(m->xpath), sizeof m->xpath - strlen(m->xpath),
                 "; the first step beside the prefix at 256-1024 prefix tokens (24 / 16 / 8 CTAs; from 400 tokens "
                 "its last layers after it)");
    return NIB_OK;
}

/* CTAs of the first step beside a prefix of S tokens, 0 for none: NIB_OVERLAP_CTAS, else the rule
 * measured on an H100 (fast, H = 10; docs/design.md, "Thirtieth session" and "Thirty-first
 * session"): the CTAs hold their SMs for the whole prefix, which costs it ~0.3-0.5 ms from about 10
 * CTAs on (its kernels are sized for every SM; 0.07 ms on 8 at 3 cameras), and beside the prefix a
 * layer on few CTAs takes ~1.5x its time alone (the prefix's weights stream through L2). 1 camera
 * (276 tokens): 24 CTAs, every layer (11.08 -> 10.84 ms); 2 cameras (532): 16 CTAs, 16 of 18
 * layers (11.91 -> 11.69 ms); 3 cameras (788): 8 CTAs, 10 of 18 layers (13.41 -> 13.07 ms). */
static int32_t beside_grid(const nib_pi05 *m, int32_t S) {
    if (!m->overlap) return 0;
    if (m->ogrid) return m->ogrid;
    const int32_t g = S >= 256 && S < 400 ? 24 : S >= 400 && S <= 640 ? 16 : S > 640 && S <= 1024 ? 8 : 0;
    return 2 * g <= m->xgrid_max ? g : 0;
}

/* How many of the first step's layers run beside the prefix (on beside_grid's CTAs); the rest run on
 * the whole GPU after it (a second launch of the kernel). NIB_OVERLAP_LAYERS, else the rule above
 * (as a share of the expert's layers): the fewer the CTAs, the further a layer beside the prefix
 * falls behind a prefix layer, and past a point the step's last layers cost less on every SM after
 * the prefix (~41 us each) than what they would trail it by. */
static int32_t beside_layers(const nib_pi05 *m, int32_t S) {
    const int32_t n = m->c.e_layers;
    if (m->olayers) return m->olayers < n ? m->olayers : n;
    const int32_t share18 = S >= 400 && S <= 640 ? 16 : S > 640 ? 10 : 18; /* of 18 layers */
    const int32_t r = (n * share18 + 17) / 18;
    return r < 1 ? 1 : r < n ? r : n;
}

/* The per-op path's first step beside the prefix. The first step's expert layer l needs only prefix
 * layer l's K/V (overlap_setup), so where the per-op path runs the steps (the bf16 preset, any H above
 * the persistent kernel's rows), and by default also where the kernel runs the other steps
 * (first_ops_wanted), the first step's ops go to the second stream: step_in and layer 0 after
 * the prefix's layer-0 cache write, layer l after layer l's, the output after the last; the steps
 * after it wait for it (a join). These are graph edges, not a kernel waiting for counters, so nothing
 * can wait for work that never comes, and tools that run kernels one at a time just serialize them.
 * The side stream gets scratch of its own (GEMM split-K, cuBLASLt workspace, FP8 codes, attention
 * partials), sized for the expert. Same kernels, same grids, same inputs: bitwise the step after the
 * prefix. NIB_OVERLAP=0 (everything after the prefix) or NIB_OVERLAP_OPS=0 (this one) turn it off. */
static nib_status overlap_ops_setup(nib_pi05 *m) {
    const nib_pi05_config *c = &m->c;
    m->oside = 0;
    const char *e = getenv("NIB_OVERLAP"), *eo = getenv("NIB_OVERLAP_OPS");
    if (m->be.kind != NIB_BE_CUDA || c->e_layers > c->layers || (e && !strcmp(e, "0")) || (eo && !strcmp(eo, "0")))
        return NIB_OK;
    m->ofirst_ops = first_ops_wanted(m);
    /* the per-op path never runs the steps (and NIB_OVERLAP_FIRST_OPS=0 keeps the first off it) */
    if (m->fused && c->max_horizon <= m->xrows && !m->ofirst_ops) return NIB_OK;
    const int64_t We = c->e_width, hd = c->head_dim, nkv = c->kv_heads, A = c->action_dim;
    nib_be_sizes sz;
    memset(&sz, 0, sizeof sz);
    sz.max_m = c->max_horizon;
    const int64_t ns[4] = {(c->e_heads + 2 * nkv) * hd, 2 * (int64_t)c->e_mlp, We, A};
    const int64_t ks[4] = {We, c->e_mlp, c->e_heads * hd, A};
    for (int i = 0; i < 4; i++) {
        if (ns[i] > sz.max_n) sz.max_n = ns[i];
        if (ks[i] > sz.max_k) sz.max_k = ks[i];
    }
    NIB_RETURN_IF_ERR(cache_ws_bytes(m, &sz.attn_ws_bytes));
    NIB_RETURN_IF_ERR(nib_be_side_scratch(&m->be, &sz));
    m->oside = 1;
    snprintf(m->xpath + strlen(m->xpath), sizeof m->xpath - strlen(m->xpath), "; %sthe first step beside the prefix",
             m->ofirst_ops ? "at every H, op by op: " : m->fused ? "above the kernel's rows, op by op: " : "");
    return NIB_OK;
}

static nib_status alloc_act(nib_pi05 *m, void **p, int64_t elems, const char *what) {
    return nib_be_alloc_act(&m->be, (uint64_t)elems * m->be.act_size, p, what);
}

static nib_status alloc_buffers(nib_pi05 *m) {
    const nib_pi05_config *c = &m->c;
    const int64_t W = c->width, We = c->e_width, Wv = c->v_width, hd = c->head_dim, nkv = c->kv_heads;
    const int64_t Vt = (int64_t)c->max_cameras * c->v_tokens, S = Vt + c->max_text, H = c->max_horizon, A = c->action_dim;
    NIB_RETURN_IF_ERR(alloc_act(m, &m->patches, Vt * m->kpatch, "patches"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->vx, Vt * Wv, "vision x"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->vy, Vt * Wv, "vision y"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->vqkv, Vt * 3 * Wv, "vision qkv"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->vattn, Vt * Wv, "vision attention"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->vmlp, Vt * c->v_mlp, "vision mlp"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->px, S * W, "prefix x"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->py, S * W, "prefix y"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->pqkv, S * (c->heads + 2 * nkv) * hd, "prefix qkv"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->pattn, S * c->heads * hd, "prefix attention"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->pmlp, S * c->mlp, "prefix mlp"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->ex, H * We, "expert x"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->ey, H * We, "expert y"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->eqkv, H * (c->e_heads + 2 * nkv) * hd, "expert qkv"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->eq, H * c->e_heads * hd, "expert q"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->eattn, H * c->e_heads * hd, "expert attention"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->emlp, H * c->e_mlp, "expert mlp"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->eout, H * A, "expert out"));
    NIB_RETURN_IF_ERR(alloc_act(m, &m->xt_act, H * A, "x_t act"));
    if (m->el && m->el[0].qkv.q.rope_half)
        NIB_RETURN_IF_ERR(nib_be_alloc_act(&m->be, (uint64_t)H * (uint64_t)(hd / 2) * 8, &m->rope_cs,
                                           "expert RoPE table"));
    m->kv = nib_calloc((size_t)c->layers, sizeof *m->kv);
    if (!m->kv) return NIB_ERR_OUT_OF_MEMORY;
    for (int l = 0; l < c->layers; l++) {
        void *p;
        uint64_t b = nib_kv_layer_bytes(m->prec.kv, (int32_t)(S + H), (int32_t)nkv, (int32_t)hd);
        NIB_RETURN_IF_ERR(nib_be_alloc_act(&m->be, b, &p, "KV cache"));
        NIB_RETURN_IF_ERR(nib_kv_layer_map(&m->kv[l], m->prec.kv, (int32_t)(S + H), (int32_t)nkv, (int32_t)hd, p));
    }
    const in_layout il = inputs_layout(c);
    uint8_t *ib;
    NIB_RETURN_IF_ERR(nib_be_alloc_act(&m->be, il.total, (void **)&ib, "inputs (lengths, positions, ids, x_t, images)"));
    m->ints = (int32_t *)(ib + il.ints);
    m->pos_prefix = (int32_t *)(ib + il.pos_prefix);
    m->pos_suffix = (int32_t *)(ib + il.pos_suffix);
    m->ids = (int32_t *)(ib + il.ids);
    m->xt = (float *)(ib + il.xt);
    m->img = ib + il.img;
    NIB_RETURN_IF_ERR(nib_be_host_alloc(&m->be, il.total, (void **)&m->in_h, "the inputs' host staging"));
    NIB_RETURN_IF_ERR(nib_be_host_alloc(&m->be, (uint64_t)H * A * 4, (void **)&m->out_h, "the actions' host staging"));
    NIB_RETURN_IF_ERR(nib_be_alloc_act(&m->be, NIB_CHECK_FINITE_WS_BYTES, &m->nws, "check-numerics result"));
    return NIB_OK;
}

static nib_status needf(const nib_st_file *f, int nd, const int64_t *shape, const char *fmt, ...) NIB_PRINTF(4, 5);
static nib_status needf(const nib_st_file *f, int nd, const int64_t *shape, const char *fmt, ...) {
    char n[512];
    const nib_st_tensor *t;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n, sizeof n, fmt, ap);
    va_end(ap);
    return nib_pi05_need(f, n, nd, shape, &t);
}

/* a linear "<base>", float or pre-quantized, of logical shape [n][k] */
static nib_status needlin(const nib_st_file *f, int64_t n, int64_t k, const char *fmt, ...) NIB_PRINTF(4, 5);
static nib_status needlin(const nib_st_file *f, int64_t n, int64_t k, const char *fmt, ...) {
    char b[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    nib_pi05_lin li;
    NIB_RETURN_IF_ERR(nib_pi05_linear(f, b, &li));
    if (li.n != n || li.k != k)
        return NIB_ERR(NIB_ERR_SHAPE, "checkpoint: tensor '%s.weight' has shape [%lld, %lld]%s, expected [%lld, %lld]", b,
                       (long long)li.n, (long long)li.k, li.prequant ? " (logical, of its quantized tensors)" : "",
                       (long long)n, (long long)k);
    return NIB_OK;
}

/* Every tensor the architecture defines must be present with its shape, also those inference
 * never reads (the last prefix layer's attention output and MLP, the final norms): a checkpoint
 * missing them is truncated or mislabeled, and that is reported before anything is loaded. */
static nib_status check_all_tensors(const nib_st_file *f, const nib_pi05_config *c) {
    const int64_t Wv = c->v_width, W = c->width, We = c->e_width, hd = c->head_dim, nkv = c->kv_heads;
    for (int l = 0; l < c->v_layers; l++) {
        const char *V = PI05_VP ".encoder.layers";
        const char *ln[4] = {"layer_norm1.weight", "layer_norm1.bias", "layer_norm2.weight", "layer_norm2.bias"};
        for (int i = 0; i < 4; i++) NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){Wv}, "%s.%d.%s", V, l, ln[i]));
        const char *pr[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
        for (int i = 0; i < 4; i++) {
            NIB_RETURN_IF_ERR(needlin(f, Wv, Wv, "%s.%d.self_attn.%s", V, l, pr[i]));
            NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){Wv}, "%s.%d.self_attn.%s.bias", V, l, pr[i]));
        }
        NIB_RETURN_IF_ERR(needlin(f, c->v_mlp, Wv, "%s.%d.mlp.fc1", V, l));
        NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){c->v_mlp}, "%s.%d.mlp.fc1.bias", V, l));
        NIB_RETURN_IF_ERR(needlin(f, Wv, c->v_mlp, "%s.%d.mlp.fc2", V, l));
        NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){Wv}, "%s.%d.mlp.fc2.bias", V, l));
    }
    for (int e = 0; e < 2; e++) {
        const char *P = e ? PI05_EP : PI05_LP;
        const int64_t w = e ? We : W, fm = e ? c->e_mlp : c->mlp, nh = e ? c->e_heads : c->heads;
        for (int l = 0; l < c->layers; l++) {
            if (e) {
                NIB_RETURN_IF_ERR(needf(f, 2, (int64_t[]){3 * We, We}, "%s.layers.%d.input_layernorm.dense.weight", P, l));
                NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){3 * We}, "%s.layers.%d.input_layernorm.dense.bias", P, l));
                NIB_RETURN_IF_ERR(needf(f, 2, (int64_t[]){3 * We, We}, "%s.layers.%d.post_attention_layernorm.dense.weight", P, l));
                NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){3 * We}, "%s.layers.%d.post_attention_layernorm.dense.bias", P, l));
            } else {
                NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){W}, "%s.layers.%d.input_layernorm.weight", P, l));
                NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){W}, "%s.layers.%d.post_attention_layernorm.weight", P, l));
            }
            NIB_RETURN_IF_ERR(needlin(f, nh * hd, w, "%s.layers.%d.self_attn.q_proj", P, l));
            NIB_RETURN_IF_ERR(needlin(f, nkv * hd, w, "%s.layers.%d.self_attn.k_proj", P, l));
            NIB_RETURN_IF_ERR(needlin(f, nkv * hd, w, "%s.layers.%d.self_attn.v_proj", P, l));
            NIB_RETURN_IF_ERR(needlin(f, w, nh * hd, "%s.layers.%d.self_attn.o_proj", P, l));
            NIB_RETURN_IF_ERR(needlin(f, fm, w, "%s.layers.%d.mlp.gate_proj", P, l));
            NIB_RETURN_IF_ERR(needlin(f, fm, w, "%s.layers.%d.mlp.up_proj", P, l));
            NIB_RETURN_IF_ERR(needlin(f, w, fm, "%s.layers.%d.mlp.down_proj", P, l));
        }
    }
    NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){W}, PI05_LP ".norm.weight"));
    NIB_RETURN_IF_ERR(needf(f, 2, (int64_t[]){3 * We, We}, PI05_EP ".norm.dense.weight"));
    NIB_RETURN_IF_ERR(needf(f, 1, (int64_t[]){3 * We}, PI05_EP ".norm.dense.bias"));
    return NIB_OK;
}

nib_status nib_pi05_load(const nib_st_file *f, const nib_pi05_config *cfg, const nib_pi05_precision *prec,
                         nib_pi05 **out) {
    nib_status st = NIB_OK;
    *out = NULL;
    nib_pi05 *m = nib_calloc(1, sizeof *m);
    if (!m) return NIB_ERR_OUT_OF_MEMORY;
    m->c = *cfg;
    m->prec = *prec;
    const nib_pi05_config *c = &m->c;
    if (c->max_cameras < 1 || c->max_cameras > 8 || c->max_text < 0 || c->max_horizon < 1 || c->steps < 1 || c->steps > 64) {
        st = NIB_ERR(NIB_ERR_INVALID_ARG, "pi05: maxima cameras %d, text %d, horizon %d, steps %d out of range",
                     c->max_cameras, c->max_text, c->max_horizon, c->steps);
        goto fail;
    }
    NIB_TRY(check_all_tensors(f, c));
    NIB_TRY(resolve_formats(m, f));
    m->kpatch = (c->v_channels * c->v_patch * c->v_patch + 15) / 16 * 16;
    m->be.act_size = prec->backend == NIB_BE_REF ? 4 : 2; /* for plan_sizes before init */
    m->be.kind = prec->backend;
    {
        nib_be_sizes sz;
        memset(&sz, 0, sizeof sz);
        plan_sizes(m, &sz);
        if (prec->backend == NIB_BE_CUDA) {
            NIB_TRY(attn_ws_bytes(m, &sz.attn_ws_bytes));
            NIB_TRY(expert_ws_bytes(m, &m->xws_bytes));
            sz.act_bytes += m->xws_bytes + 256 + (uint64_t)c->e_layers * 128 + 256; /* + the counters of overlap_setup */
        }
        NIB_TRY(nib_be_init(&m->be, prec->backend, &sz));
    }
    m->vl = nib_calloc((size_t)c->v_layers, sizeof *m->vl);
    m->pl = nib_calloc((size_t)c->layers, sizeof *m->pl);
    m->el = nib_calloc((size_t)c->e_layers, sizeof *m->el);
    if (!m->vl || !m->pl || !m->el) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    NIB_TRY(load_vision(m, f));
    {
        /* token embedding (tied lm_head), in the activation dtype */
        const nib_st_tensor *t;
        int64_t es[2] = {c->vocab, c->width};
        NIB_TRY(nib_pi05_need(f, PI05_EMBED, 2, es, &t));
        NIB_TRY(nib_be_alloc_weight(&m->be, (uint64_t)c->vocab * c->width * m->be.act_size, &m->embed, "token embedding"));
        if (m->be.kind == NIB_BE_CUDA && t->dtype == NIB_DTYPE_BF16) {
            NIB_TRY(nib_be_upload(&m->be, m->embed, t->data, t->nbytes));
        } else {
            /* row blocks through an fp32 buffer (the table can be GBs) */
            const int64_t rows = 4096;
            float *buf = nib_malloc((size_t)(rows * c->width) * 4);
            if (!buf) {
                st = NIB_ERR_OUT_OF_MEMORY;
                goto fail;
            }
            for (int64_t r0 = 0; r0 < c->vocab && !st; r0 += rows) {
                int64_t nr = r0 + rows < c->vocab ? rows : c->vocab - r0;
                nib_st_tensor part = *t;
                part.numel = (uint64_t)(nr * c->width);
                part.data = (const uint8_t *)t->data + (uint64_t)r0 * c->width * nib_dtype_size(t->dtype);
                st = to_f32(&part, buf);
                if (!st) st = nib_be_upload_act(&m->be, (uint8_t *)m->embed + (uint64_t)r0 * c->width * m->be.act_size,
                                                buf, (uint64_t)(nr * c->width));
            }
            nib_free(buf);
            if (st) goto fail;
        }
    }
    NIB_TRY(load_lm(m, f, 0));
    NIB_TRY(load_lm(m, f, 1));
    NIB_TRY(load_expert_heads(m, f));
    {
        float *inv = nib_malloc((size_t)c->head_dim / 2 * 4 + 4);
        if (!inv) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        st = nib_rope_inv_freq(NIB_ROPE_THETA, c->head_dim, inv);
        if (!st) st = nib_be_alloc_weight(&m->be, (uint64_t)c->head_dim / 2 * 4, (void **)&m->inv_freq, "rope inv_freq");
        if (!st) st = nib_be_upload(&m->be, m->inv_freq, inv, (uint64_t)c->head_dim / 2 * 4);
        nib_free(inv);
        if (st) goto fail;
    }
    NIB_TRY(alloc_buffers(m));
    NIB_TRY(expert_setup(m));
    NIB_TRY(edge_setup(m));
    prefix_setup(m);
    NIB_TRY(overlap_setup(m));
    NIB_TRY(overlap_ops_setup(m));
    NIB_TRY(nib_be_sync(&m->be));
    *out = m;
    return NIB_OK;
fail:
    nib_pi05_free(m);
    return st;
}

void nib_pi05_free(nib_pi05 *m) {
    if (!m) return;
    const char *tr = getenv("NIB_EXPERT_TRACE");
    if (m->fused && tr && *tr && strcmp(tr, "0")) { /* lab view of the last step's kernel */
        nib_expert_args a;
        expert_args(m, m->xrows, 0, &a);
        if (nib_cuda_expert_trace_report(&a, m->xws, m->xws_bytes, stderr)) nib_clear_error();
    }
    const char *kt = getenv("NIB_KTRACE"); /* a lab build's kernel stamps (runtime/ktrace.cuh) */
    if (kt && *kt && m->be.kind == NIB_BE_CUDA && nib_cuda_ktrace_dump(kt)) {
        fprintf(stderr, "NIB_KTRACE=%s: %s\n", kt, nib_last_error());
        nib_clear_error();
    }
    for (int i = 0; i < MAX_GRAPHS; i++) nib_be_graph_free(m->graphs[i].g);
    for (int i = 0; i < m->n_ev; i++) nib_be_event_free(m->ev[i]);
    for (int i = 0; i < 2; i++) nib_be_event_free(m->ev_in[i]);
    if (m->in_busy) nib_be_sync(&m->be); /* unchecked: a free function has no status */
    nib_be_host_free(&m->be, m->in_h);
    nib_be_host_free(&m->be, m->out_h);
    nib_be_free(&m->be);
    nib_free(m->vl);
    nib_free(m->pl);
    nib_free(m->el);
    nib_free(m->kv);
    nib_free(m->xl);
    nib_host_mapped_free(m->kvto_h);
    nib_free(m);
}

/* ---- forward ------------------------------------------------------------------------------ */
typedef struct call_shape {
    int32_t V, L, S, H, u8;
} call_shape;

#define ACT(p, off) ((void *)((uint8_t *)(p) + (uint64_t)(off) * m->be.act_size))

static nib_status rec_event(nib_pi05 *m, int i) {
    if (m->be.kind != NIB_BE_CUDA || i >= m->n_ev) return NIB_OK;
    return nib_be_event_record(&m->be, m->ev[i]);
}

/* check-numerics: scan a stage's output x [rows][cols] (stride ld; act dtype, or fp32 when f32)
 * and fail at the first non-finite value, naming the stage, the tensor and the element. A no-op
 * unless the call runs in check mode (never while a graph is being captured: the scan syncs). */
static nib_status check_stage(nib_pi05 *m, const void *x, int64_t rows, int64_t cols, int64_t ld, int f32,
                              const char *tensor, const char *fmt, ...) NIB_PRINTF(8, 9);
static nib_status check_stage(nib_pi05 *m, const void *x, int64_t rows, int64_t cols, int64_t ld, int f32,
                              const char *tensor, const char *fmt, ...) {
    if (!m->checking) return NIB_OK;
    nib_check_finite_args a = {x, rows, cols, ld, f32};
    nib_finite_result r;
    NIB_RETURN_IF_ERR(nib_be_check_finite(&m->be, &a, m->nws, &r));
    if (!r.count) return NIB_OK;
    char stage[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(stage, sizeof stage, fmt, ap);
    va_end(ap);
    return NIB_ERR(NIB_ERR_NUMERICS, "check-numerics: %s: %s [%lld x %lld] has %llu non-finite value(s); the first "
                   "is element %llu (row %lld, col %lld) = %s", stage, tensor, (long long)rows, (long long)cols,
                   (unsigned long long)r.count, (unsigned long long)r.first, (long long)(r.first / (uint64_t)cols),
                   (long long)(r.first % (uint64_t)cols), isnan(r.value) ? "NaN" : r.value > 0 ? "+Inf" : "-Inf");
}

static nib_status fwd_vision(nib_pi05 *m, const call_shape *cs) {
    const nib_pi05_config *c = &m->c;
    const int64_t T = c->v_tokens, Wv = c->v_width, Vt = (int64_t)cs->V * T;
    nib_be *be = &m->be;
    nib_im2patch_args ip = {m->img, cs->u8, cs->V, c->v_channels, c->v_image, c->v_patch, m->patches, m->kpatch};
    NIB_RETURN_IF_ERR(nib_be_im2patch(be, &ip));
    for (int i = 0; i < cs->V; i++) { /* + position embedding as the residual of each image */
        nib_gemm_epi e = {0, NULL, m->posemb, Wv};
        NIB_RETURN_IF_ERR(nib_be_gemm(be, &m->patch, ACT(m->patches, i * T * m->kpatch), T, m->kpatch,
                                        ACT(m->vx, i * T * Wv), Wv, &e));
    }
    for (int l = 0; l < c->v_layers; l++) {
        const vis_layer *L = &m->vl[l];
        nib_norm_args n1 = {.kind = NIB_NORM_LAYER, .rows = Vt, .dim = Wv, .eps = NIB_NORM_EPS, .x = m->vx, .ldx = Wv,
                            .w = L->ln1_w, .b = L->ln1_b, .y = m->vy, .ldy = Wv};
        NIB_RETURN_IF_ERR(nib_be_norm_gemm(be, &n1, &L->qkv, m->vqkv, 3 * Wv, NULL));
        nib_attn_prefix_args at;
        memset(&at, 0, sizeof at);
        at.q = m->vqkv, at.k = ACT(m->vqkv, Wv), at.v = ACT(m->vqkv, 2 * Wv), at.o = m->vattn;
        at.q_tok = at.k_tok = at.v_tok = 3 * Wv, at.o_tok = Wv;
        at.q_seq = at.k_seq = at.v_seq = T * 3 * Wv, at.o_seq = T * Wv;
        at.n_seq = cs->V, at.s_max = (int32_t)T, at.n_heads = c->v_heads, at.n_kv_heads = c->v_heads;
        at.head_dim = c->v_head_dim;
        at.logit_scale = 1.0f / sqrtf((float)c->v_head_dim); /* q is not pre-scaled (load_vision) */
        NIB_RETURN_IF_ERR(nib_be_attn_prefix(be, &at));
        nib_gemm_epi res = {0, NULL, m->vx, Wv};
        NIB_RETURN_IF_ERR(nib_be_gemm(be, &L->o, m->vattn, Vt, Wv, m->vx, Wv, &res));
        nib_norm_args n2 = n1;
        n2.w = L->ln2_w, n2.b = L->ln2_b;
        NIB_RETURN_IF_ERR(nib_be_mlp(be, &n2, &L->fc1, 1, &L->fc2, m->vmlp, c->v_mlp, m->vx, Wv, &res));
        NIB_RETURN_IF_ERR(check_stage(m, m->vx, Vt, Wv, Wv, 0, "vision x", "vision layer %d output", l));
    }
    nib_norm_args pn = {.kind = NIB_NORM_LAYER, .rows = Vt, .dim = Wv, .eps = NIB_NORM_EPS, .x = m->vx, .ldx = Wv,
                        .w = m->post_w, .b = m->post_b, .y = m->vy, .ldy = Wv};
    /* image tokens: rows [0, V*T) of the prefix */
    NIB_RETURN_IF_ERR(nib_be_norm_gemm(be, &pn, &m->proj, m->px, c->width, NULL));
    return check_stage(m, m->px, Vt, c->width, c->width, 0, "image tokens (prefix x rows 0..V*T-1)",
                       "vision output (projected)");
}

/* The per-op step's state between its layers: gated residuals whose product runs on cuBLAS (bf16,
 * W8A8: a separate epilogue kernel) are deferred: the product goes to ey, and the next adaRMS norm
 * adds (ey * gate) + ex into ex before normalizing (nib_norm_args.res_gate): the same operations in
 * the same order as the epilogue kernel, one kernel fewer per gated product. Not while checking
 * stages (ex must be current after every layer); NIB_DEFER_GATE=0 keeps the epilogue kernel (A/B). */
typedef struct op_step {
    int s, defer;
    const float *mods; /* this step's adaRMS (scale, shift, gate) rows */
    const float *pend; /* the gate of a product in ey not yet added to ex */
    int n1_done;       /* layer 0's first adaRMS ran in the last step's edge (ey holds it) */
} op_step;

static nib_status side_ops(nib_pi05 *m, const call_shape *cs, op_step *o, int l);

/* the cache writes of layers l < nsig signal m->kv_sig (the first step runs beside: overlap_setup);
 * side: the per-op first step's state, whose layer l is enqueued on the second stream after prefix
 * layer l's cache write (overlap_ops_setup), or NULL */
static nib_status fwd_prefix(nib_pi05 *m, const call_shape *cs, int nsig, op_step *side) {
    const nib_pi05_config *c = &m->c;
    nib_be *be = &m->be;
    const int64_t W = c->width, hd = c->head_dim, nh = c->heads, nkv = c->kv_heads, S = cs->S;
    const int64_t Vt = (int64_t)cs->V * c->v_tokens;
    /* text tokens after the image tokens: embedding * sqrt(width) (openpi PyTorch: fp32 sqrt) */
    nib_embed_args ea = {m->embed, c->vocab, W, m->ids, cs->L, sqrtf((float)W), ACT(m->px, Vt * W), W};
    NIB_RETURN_IF_ERR(nib_be_embed(be, &ea));
    const int fused_qkv = m->fused_qkv; /* prefix_setup */
    void *const pq = m->pmlp;
    for (int l = 0; l < c->layers; l++) {
        const lm_layer *L = &m->pl[l];
        const int last = l == c->layers - 1;
        const int64_t qh = last ? 0 : nh, ld = (qh + 2 * nkv) * hd;
        nib_norm_args n1 = {.kind = NIB_NORM_RMS, .rows = S, .dim = W, .eps = NIB_NORM_EPS, .x = m->px, .ldx = W,
                            .w = L->n1w, .y = m->py, .ldy = W};
        NIB_RETURN_IF_ERR(nib_be_norm_gemm(be, &n1, &L->qkv, m->pqkv, ld, NULL));
        nib_attn_prefix_args at;
        memset(&at, 0, sizeof at);
        if (fused_qkv) {
            /* one pass: RoPE on q (pre-scaled through the weights: q_scale 1) into pq, RoPE on k
             * and k, v into the bf16 cache, from which the attention reads them (the same bf16
             * values the unfused path leaves in pqkv) */
            nib_qkv_args qa = {S, NULL, (int32_t)qh, (int32_t)nkv, (int32_t)hd, m->pqkv, ld, m->pos_prefix, m->inv_freq,
                               1.0f, last ? NULL : pq, nh * hd, &m->kv[l], 0, NULL,
                               l < nsig ? m->kv_sig + 32 * l : NULL, 0, NULL};
            NIB_RETURN_IF_ERR(nib_be_qkv(be, &qa));
            at.q = pq, at.k = m->kv[l].k, at.v = m->kv[l].v;
            at.q_tok = nh * hd, at.k_tok = at.v_tok = nkv * hd;
        } else {
            /* RoPE on q and k heads in place (q is pre-scaled through the weights), then K/V to
             * the cache; the prefix attention reads the exact bf16 k/v from pqkv */
            nib_rope_args ro = {NIB_ROPE_HALF, 0, S, NULL, (int32_t)(qh + nkv), (int32_t)hd, (int32_t)hd, m->pos_prefix,
                                m->inv_freq, m->pqkv, ld};
            NIB_RETURN_IF_ERR(nib_be_rope(be, &ro));
            nib_kv_write_args kw = {S, NULL, ACT(m->pqkv, qh * hd), ld, ACT(m->pqkv, (qh + nkv) * hd), ld, &m->kv[l], 0, NULL};
            NIB_RETURN_IF_ERR(nib_be_kv_write(be, &kw));
            at.q = m->pqkv, at.k = ACT(m->pqkv, nh * hd), at.v = ACT(m->pqkv, (nh + nkv) * hd);
            at.q_tok = at.k_tok = at.v_tok = ld;
        }
        if (side && l < c->e_layers) NIB_RETURN_IF_ERR(side_ops(m, cs, side, l));
        if (last) { /* the last layer's output is never used: K/V only */
            if (fused_qkv) {
                NIB_RETURN_IF_ERR(check_stage(m, m->kv[l].k, S, nkv * hd, nkv * hd, 0, "prefix k (post-RoPE, cache)",
                                              "prefix layer %d K", l));
                NIB_RETURN_IF_ERR(check_stage(m, m->kv[l].v, S, nkv * hd, nkv * hd, 0, "prefix v (cache)",
                                              "prefix layer %d V", l));
            } else {
                NIB_RETURN_IF_ERR(check_stage(m, m->pqkv, S, ld, ld, 0, "prefix k|v (post-RoPE)", "prefix layer %d K/V", l));
            }
            break;
        }
        at.o = m->pattn, at.o_tok = nh * hd;
        at.n_seq = 1, at.s_max = (int32_t)S, at.n_heads = (int32_t)nh, at.n_kv_heads = (int32_t)nkv, at.head_dim = (int32_t)hd;
        NIB_RETURN_IF_ERR(nib_be_attn_prefix(be, &at));
        nib_gemm_epi res = {0, NULL, m->px, W};
        NIB_RETURN_IF_ERR(nib_be_gemm(be, &L->o, m->pattn, S, nh * hd, m->px, W, &res));
        nib_norm_args n2 = n1;
        n2.w = L->n2w;
        NIB_RETURN_IF_ERR(nib_be_mlp(be, &n2, &L->gu, 0, &L->down, m->pmlp, c->mlp, m->px, W, &res));
        NIB_RETURN_IF_ERR(check_stage(m, m->px, S, W, W, 0, "prefix x", "prefix layer %d output", l));
    }
    return NIB_OK;
}

/* The suffix positions' (cos, sin) for the fused q|k|v epilogue (m->rope_cs), once per call before
 * the first op-by-op step, where layer 0's product fuses it at this H (the same positions for every
 * step and layer). */
static nib_status rope_table(nib_pi05 *m, const call_shape *cs) {
    if (!m->rope_cs) return NIB_OK;
    const nib_pi05_config *c = &m->c;
    nib_qkv_args qa = {cs->H, NULL, (int32_t)c->e_heads, (int32_t)c->kv_heads, (int32_t)c->head_dim, m->eqkv,
                       ((int64_t)c->e_heads + 2 * c->kv_heads) * c->head_dim, m->pos_suffix, m->inv_freq,
                       1.0f, m->eq, (int64_t)c->e_heads * c->head_dim, &m->kv[0], 0, m->ints + 2, NULL, 1, m->rope_cs};
    /* (f < 0: a bad NIB_GEMM_QKV or no plan; the table is computed and nib_be_gemm_qkv names the error) */
    const int f = nib_cuda_gemm_qkv_fuses(&m->el[0].qkv.q, cs->H, &qa, &m->be.sc.ws, NULL);
    return f ? nib_cuda_rope_table(m->pos_suffix, m->inv_freq, cs->H, (int32_t)c->head_dim, m->rope_cs, m->be.stream)
             : NIB_OK;
}

/* x_t -> the expert's input rows (ex) */
static nib_status step_in(nib_pi05 *m, const call_shape *cs) {
    const int64_t A = m->c.action_dim;
    NIB_RETURN_IF_ERR(nib_be_f32_to_act(&m->be, m->xt, cs->H, A, A, m->xt_act, A));
    return nib_be_gemm(&m->be, &m->ain, m->xt_act, cs->H, A, m->ex, m->c.e_width, NULL);
}

/* the same, and layer 0's first adaRMS of step s, as one op (ops/edge.h): for a per-op step where the
 * edge is on (the caller then skips that norm: op_step.n1_done) */
static nib_status step_in_edge(nib_pi05 *m, const call_shape *cs, int s) {
    const int64_t We = m->c.e_width, nmod = 2 * (int64_t)m->c.e_layers + 1;
    const float *mn = m->mods + (int64_t)s * nmod * 3 * We;
    nib_edge_args ea = {.mode = NIB_EDGE_IN, .rows = cs->H, .dim = We, .adim = m->c.action_dim, .eps = NIB_NORM_EPS,
                        .xt = m->xt, .ldxt = m->c.action_dim, .w_in_t = m->ain_t, .b_in = m->ain.bias, .h = m->ex,
                        .ldh = We, .nscale = mn, .nshift = mn + We, .y = m->ey, .ldy = We};
    NIB_RETURN_IF_ERR(nib_be_edge(&m->be, &ea));
    return check_stage(m, m->ex, cs->H, We, We, 0, "expert x", "step %d expert input", s);
}

static void op_step_begin(const nib_pi05 *m, int s, op_step *o) {
    const char *dg = getenv("NIB_DEFER_GATE");
    o->s = s, o->defer = !m->checking && !(dg && !strcmp(dg, "0")), o->pend = NULL, o->n1_done = 0;
    o->mods = m->mods + (int64_t)s * (2 * (int64_t)m->c.e_layers + 1) * 3 * m->c.e_width;
}

/* expert layer l of the per-op step */
static nib_status op_layer(nib_pi05 *m, const call_shape *cs, op_step *o, int l) {
    const nib_pi05_config *c = &m->c;
    nib_be *be = &m->be;
    const int64_t We = c->e_width, hd = c->head_dim, nh = c->e_heads, nkv = c->kv_heads, H = cs->H;
    const int64_t ld = (nh + 2 * nkv) * hd;
    const lm_layer *L = &m->el[l];
    const float *ma = o->mods + (int64_t)(2 * l) * 3 * We, *mf = o->mods + (int64_t)(2 * l + 1) * 3 * We;
    nib_norm_args n1 = {.kind = NIB_NORM_ADARMS, .rows = H, .dim = We, .eps = NIB_NORM_EPS, .x = m->ex, .ldx = We,
                        .scale = ma, .shift = ma + We, .y = m->ey, .ldy = We};
    if (o->pend) n1.x = m->ey, n1.residual = m->ex, n1.ldr = We, n1.res_gate = o->pend, o->pend = NULL;
    if (o->n1_done) o->n1_done = 0; /* (layer 0 after an edge: nothing pending there) */
    else NIB_RETURN_IF_ERR(nib_be_norm(be, &n1));
    /* the product, RoPE at positions P + j, q out, K/V into cache slots P .. P + H - 1: one kernel where
     * nib_be_gemm_qkv fuses the epilogue (the pair layout, rope_cs from rope_table) */
    nib_qkv_args qa = {H, NULL, (int32_t)nh, (int32_t)nkv, (int32_t)hd, m->eqkv, ld, m->pos_suffix, m->inv_freq,
                       1.0f / sqrtf((float)hd), m->eq, nh * hd, &m->kv[l], 0, m->ints + 2, NULL, 0, m->rope_cs};
    NIB_RETURN_IF_ERR(nib_be_gemm_qkv(be, &L->qkv, m->ey, H, We, &qa));
    nib_attn_cache_args ca;
    memset(&ca, 0, sizeof ca);
    ca.q = m->eq, ca.o = m->eattn, ca.q_tok = ca.o_tok = nh * hd, ca.nq = (int32_t)H, ca.n_heads = (int32_t)nh;
    ca.kv = m->kv[l], ca.t_valid = m->ints + 1;
    ca.lens_settled = 1; /* m->ints: uploaded before the call's first kernel (send_inputs), written by no kernel */
    /* The cache holds max_cameras x 256 + max_text + max_horizon slots, but this call's keys are its
     * S + H (a graph is captured per V, L, H): a view of that length (token-major planes: the same
     * pointers) plans the splits over the keys there are. 2 cameras, H = 10: 9 tiles of 64 instead of
     * 16, which also brings the suffix under the per-token rule (docs/design.md, "Fortieth session").
     * cache_ws_bytes sizes the workspace for every view. */
    if (cs->H <= 16 && cs->S + cs->H < ca.kv.t_max) ca.kv.t_max = cs->S + cs->H;
    NIB_RETURN_IF_ERR(nib_be_attn_cache(be, &ca));
    nib_norm_args n2 = {.kind = NIB_NORM_ADARMS, .rows = H, .dim = We, .eps = NIB_NORM_EPS, .x = m->ex, .ldx = We,
                        .scale = mf, .shift = mf + We, .y = m->ey, .ldy = We};
    if (o->defer && !nib_be_gemm_fuses_gate(be, &L->o)) {
        NIB_RETURN_IF_ERR(nib_be_gemm(be, &L->o, m->eattn, H, nh * hd, m->ey, We, NULL));
        n2.x = m->ey, n2.residual = m->ex, n2.ldr = We, n2.res_gate = ma + 2 * We;
    } else {
        nib_gemm_epi ga = {0, ma + 2 * We, m->ex, We}; /* gated residual */
        NIB_RETURN_IF_ERR(nib_be_gemm(be, &L->o, m->eattn, H, nh * hd, m->ex, We, &ga));
    }
    NIB_RETURN_IF_ERR(nib_be_norm(be, &n2));
    nib_gemm_epi gg = {1, NULL, NULL, 0};
    NIB_RETURN_IF_ERR(nib_be_gemm(be, &L->gu, m->ey, H, We, m->emlp, c->e_mlp, &gg));
    if (o->defer && !nib_be_gemm_fuses_gate(be, &L->down)) {
        NIB_RETURN_IF_ERR(nib_be_gemm(be, &L->down, m->emlp, H, c->e_mlp, m->ey, We, NULL));
        o->pend = mf + 2 * We;
        return NIB_OK;
    }
    nib_gemm_epi gf = {0, mf + 2 * We, m->ex, We};
    NIB_RETURN_IF_ERR(nib_be_gemm(be, &L->down, m->emlp, H, c->e_mlp, m->ex, We, &gf));
    return check_stage(m, m->ex, H, We, We, 0, "expert x", "step %d expert layer %d output", o->s, l);
}

/* the step's output: final adaRMS, velocity x dt, x_t += it. o: the per-op step's state (its pending
 * gate), or NULL after the persistent kernel (nothing pending) */
static nib_status step_out(nib_pi05 *m, const call_shape *cs, int s, const op_step *o) {
    const nib_pi05_config *c = &m->c;
    nib_be *be = &m->be;
    const int64_t We = c->e_width, H = cs->H, A = c->action_dim, nmod = 2 * (int64_t)c->e_layers + 1;
    const float *mfin = m->mods + ((int64_t)s * nmod + nmod - 1) * 3 * We;
    nib_norm_args nf = {.kind = NIB_NORM_ADARMS, .rows = H, .dim = We, .eps = NIB_NORM_EPS, .x = m->ex, .ldx = We,
                        .scale = mfin, .shift = mfin + We, .y = m->ey, .ldy = We};
    if (o && o->pend) nf.x = m->ey, nf.residual = m->ex, nf.ldr = We, nf.res_gate = o->pend;
    if (o && m->edge) {
        /* one op (ops/edge.h); between two per-op steps it also runs the next step's input and its
         * layer 0's first adaRMS (fwd_step and op_layer then skip them). Also in check mode, which
         * must give the normal call's actions bitwise: x_t and the next input are checked after it */
        const int next = s + 1 < c->steps && !(m->fused && H <= m->xrows);
        nib_edge_args ea = {.mode = NIB_EDGE_OUT | (next ? NIB_EDGE_IN : 0), .rows = H, .dim = We, .adim = A,
                            .eps = NIB_NORM_EPS, .x = nf.x, .ldx = We, .residual = nf.residual, .ldr = We,
                            .res_gate = nf.res_gate, .fscale = nf.scale, .fshift = nf.shift,
                            .w_out = m->aout.q.bf16_w, .b_out = m->aout.bias, .xt = m->xt, .ldxt = A};
        if (next) {
            const float *mn = m->mods + (int64_t)(s + 1) * nmod * 3 * We; /* step s + 1, layer 0, input norm */
            ea.w_in_t = m->ain_t, ea.b_in = m->ain.bias, ea.h = m->ex, ea.ldh = We, ea.nscale = mn, ea.nshift = mn + We;
            ea.y = m->ey, ea.ldy = We;
        }
        NIB_RETURN_IF_ERR(nib_be_edge(be, &ea));
        m->edge_next = next;
        NIB_RETURN_IF_ERR(check_stage(m, m->xt, H, A, A, 1, "x_t (fp32)", "step %d x_t", s));
        return next ? check_stage(m, m->ex, H, We, We, 0, "expert x", "step %d expert input", s + 1) : NIB_OK;
    }
    NIB_RETURN_IF_ERR(nib_be_norm(be, &nf));
    NIB_RETURN_IF_ERR(nib_be_gemm(be, &m->aout, m->ey, H, We, m->eout, A, NULL)); /* dt folded */
    NIB_RETURN_IF_ERR(check_stage(m, m->eout, H, A, A, 0, "expert out (velocity x dt)", "step %d velocity", s));
    NIB_RETURN_IF_ERR(nib_be_axpy_f32(be, m->xt, H, A, A, m->eout, A));
    return check_stage(m, m->xt, H, A, A, 1, "x_t (fp32)", "step %d x_t", s);
}

/* body_done: 0 nothing of step s ran yet; 1 step_in and the first beside_layers layers ran beside the
 * prefix (the persistent kernel); 2 the whole step ran beside the prefix (the per-op path) */
static nib_status fwd_step(nib_pi05 *m, const call_shape *cs, int s, int body_done) {
    if (body_done == 2) return NIB_OK;
    const nib_pi05_config *c = &m->c;
    nib_be *be = &m->be;
    int edge_in = m->edge_next; /* the last step's edge ran this one's input (step_out) */
    m->edge_next = 0;
    /* the first step op by op where it runs so beside the prefix: also in the eager first call of a
     * shape (get_graph), so every kernel the graph holds has run once before the capture */
    const int first_ops = s == 0 && m->oside && m->ofirst_ops;
    const int fused = body_done || (m->fused && cs->H <= m->xrows && !m->checking && !first_ops);
    if (!body_done && !edge_in) {
        if (!fused && m->edge) NIB_RETURN_IF_ERR(step_in_edge(m, cs, s));
        else NIB_RETURN_IF_ERR(step_in(m, cs));
        edge_in = !fused && m->edge;
    }
    if (fused) {
        nib_expert_args xa;
        expert_args(m, (int32_t)cs->H, s, &xa);
        /* the first step in the parts it has beside the prefix even when not beside (check-numerics
         * mode, a shape's eager first call): its first layers on the beside grid, the rest on the
         * launch grid. The same CTAs and the same split give the same sums, so the actions stay
         * bitwise those of a graph call. */
        const int32_t bg = s == 0 ? beside_grid(m, cs->S) : 0, nb = bg ? beside_layers(m, cs->S) : 0;
        if (bg && !body_done) {
            xa.grid = bg, xa.layer_begin = 0, xa.layer_end = nb;
            NIB_RETURN_IF_ERR(nib_be_expert(be, &xa, m->xws, m->xws_bytes));
        }
        if (!bg || nb < c->e_layers) {
            xa.grid = m->xgrid, xa.layer_begin = nb, xa.layer_end = bg ? c->e_layers : 0;
            NIB_RETURN_IF_ERR(nib_be_expert(be, &xa, m->xws, m->xws_bytes));
        }
        return step_out(m, cs, s, NULL);
    }
    op_step o;
    op_step_begin(m, s, &o);
    o.n1_done = edge_in;
    if (s == 0) NIB_RETURN_IF_ERR(rope_table(m, cs)); /* (beside the prefix: side_ops) */
    for (int l = 0; l < c->e_layers; l++) NIB_RETURN_IF_ERR(op_layer(m, cs, &o, l));
    return step_out(m, cs, s, &o);
}

/* Whether a call of this shape runs its first step beside the prefix: 0 no, 1 the persistent kernel's
 * first layers (overlap_setup), 2 the whole per-op step (overlap_ops_setup). */
static int first_step_beside(const nib_pi05 *m, const call_shape *cs) {
    if (m->checking || m->warming || m->c.steps < 1) return 0;
    if (m->fused && cs->H <= m->xrows && !(m->oside && m->ofirst_ops)) return beside_grid(m, cs->S) > 0 ? 1 : 0;
    return m->oside ? 2 : 0;
}

/* the per-op first step's part after prefix layer l's cache write, on the second stream: step_in
 * before layer 0, the output after the last layer. Its kernels launch without PDL: with it each
 * would sit resident on SMs, waiting for its predecessor, that the prefix's kernels could use
 * (measured: bf16 2 cameras H = 10 13.09 -> 12.97 ms, fast 2 cameras H = 50 12.49 -> 12.36;
 * docs/design.md, "Thirty-third session"). */
static nib_status side_ops(nib_pi05 *m, const call_shape *cs, op_step *o, int l) {
    nib_be *be = &m->be;
    NIB_RETURN_IF_ERR(nib_be_fork(be));
    nib_pdl_suspend(1);
    nib_status st = l == 0 ? rope_table(m, cs) : NIB_OK;
    if (!st && l == 0) {
        st = m->edge ? step_in_edge(m, cs, 0) : step_in(m, cs);
        o->n1_done = m->edge;
    }
    if (!st) st = op_layer(m, cs, o, l);
    if (!st && l == m->c.e_layers - 1) st = step_out(m, cs, 0, o);
    nib_pdl_suspend(0);
    nib_be_fork_end(be);
    return st;
}

/* The prefix, with the first step's layers beside it where overlap_setup enabled that (and the
 * step runs on the persistent kernel at this H, and no stage checks are on). Returns whether the
 * first step's layers ran (*beside). */
static nib_status prefix_and_first_step(nib_pi05 *m, const call_shape *cs, int *beside) {
    nib_be *be = &m->be;
    *beside = first_step_beside(m, cs);
    if (!*beside) {
        NIB_RETURN_IF_ERR(fwd_prefix(m, cs, 0, NULL));
        return rec_event(m, 2);
    }
    if (*beside == 2) { /* the per-op step on the second stream, layer by layer (fwd_prefix) */
        op_step o;
        op_step_begin(m, 0, &o);
        nib_status st = fwd_prefix(m, cs, 0, &o);
        if (!st) st = rec_event(m, 2); /* the prefix's end on the main stream: before the join */
        const nib_status js = nib_be_join(be); /* on errors too: a capture ends with every fork joined */
        return st ? st : js;
    }
    NIB_RETURN_IF_ERR(step_in(m, cs)); /* on the main stream: it uses the shared GEMM scratch */
    nib_expert_args xa;
    expert_args(m, cs->H, 0, &xa);
    const int32_t nb = beside_layers(m, cs->S);
    xa.grid = beside_grid(m, cs->S), xa.kv_sig = m->kv_sig, xa.kv_target = cs->S, xa.kv_timeout = m->kvto_d;
    xa.layer_begin = 0, xa.layer_end = nb; /* the rest after the prefix (fwd_step) */
    NIB_RETURN_IF_ERR(nib_be_fork(be));
    nib_status st = nib_be_expert(be, &xa, m->xws, m->xws_bytes);
    nib_be_fork_end(be);
    if (st) {
        (void)nib_be_join(be); /* nothing waits on the side stream: it holds only the failed launch */
        return st;
    }
    st = fwd_prefix(m, cs, m->drop_sig ? 0 : nb, NULL);
    if (!st) st = rec_event(m, 2);
    if (st) {
        /* the kernel may be waiting for layers whose cache write was never enqueued: release it (its
         * output is not used: the call fails), join, and zero the counters before the next call */
        m->sig_dirty = 1;
        (void)nib_be_memset(be, m->kv_sig, 0xFF, (uint64_t)m->c.e_layers * 128);
        (void)nib_be_join(be);
        return st;
    }
    return nib_be_join(be);
}

static nib_status forward(nib_pi05 *m, const call_shape *cs) {
    m->edge_next = 0;
    NIB_RETURN_IF_ERR(rec_event(m, 0));
    if (cs->V > 0) NIB_RETURN_IF_ERR(fwd_vision(m, cs));
    NIB_RETURN_IF_ERR(rec_event(m, 1));
    int beside = 0;
    NIB_RETURN_IF_ERR(prefix_and_first_step(m, cs, &beside));
    for (int s = 0; s < m->c.steps; s++) {
        NIB_RETURN_IF_ERR(fwd_step(m, cs, s, s == 0 ? beside : 0));
        NIB_RETURN_IF_ERR(rec_event(m, 3 + s));
    }
    return NIB_OK;
}

/* ---- run ------------------------------------------------------------------------------------ */
/* the inputs' bytes the last upload_inputs filled, host mirror -> device block, on the main stream */
static nib_status send_inputs(nib_pi05 *m) {
    if (m->time_in) NIB_RETURN_IF_ERR(nib_be_event_record(&m->be, m->ev_in[0]));
    NIB_RETURN_IF_ERR(nib_be_upload_async(&m->be, m->ints, m->in_h, m->in_bytes));
    if (m->time_in) NIB_RETURN_IF_ERR(nib_be_event_record(&m->be, m->ev_in[1]));
    m->in_busy = m->be.kind == NIB_BE_CUDA;
    return NIB_OK;
}

/* Validates the inputs, fills the host mirror of the input block (inputs_layout) and sends it. */
static nib_status upload_inputs(nib_pi05 *m, const nib_pi05_inputs *in, call_shape *cs) {
    const nib_pi05_config *c = &m->c;
    if (!in || (in->n_cameras > 0 && !in->images_f32 && !in->images_u8))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "pi05 inputs: %d cameras but no images", in ? in->n_cameras : 0);
    if (in->n_cameras < 0 || in->n_cameras > c->max_cameras)
        return NIB_ERR(NIB_ERR_SHAPE, "pi05 inputs: %d cameras (this model was planned for at most %d)", in->n_cameras,
                       c->max_cameras);
    if (in->n_text < 0 || in->n_text > c->max_text)
        return NIB_ERR(NIB_ERR_SHAPE, "pi05 inputs: %d text tokens (planned maximum %d)", in->n_text, c->max_text);
    if (in->horizon < 1 || in->horizon > c->max_horizon)
        return NIB_ERR(NIB_ERR_SHAPE, "pi05 inputs: horizon %d outside 1..%d", in->horizon, c->max_horizon);
    for (int32_t i = 0; i < in->n_text; i++)
        if (in->text_ids[i] < 0 || in->text_ids[i] >= c->vocab)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "pi05 inputs: text id %d at position %d outside the vocabulary of %lld",
                           in->text_ids[i], i, (long long)c->vocab);
    if (m->in_busy) { /* the mirror may still be read by the last call's copy (a call that failed midway) */
        NIB_RETURN_IF_ERR(nib_be_sync(&m->be));
        m->in_busy = 0;
    }
    const in_layout il = inputs_layout(c);
    uint8_t *const h = m->in_h;
    const int u8 = in->images_u8 != NULL;
    const uint64_t img_elems = (uint64_t)c->v_channels * c->v_image * c->v_image, esz = u8 ? 1 : 4;
    int32_t V = 0;
    for (int32_t i = 0; i < in->n_cameras; i++) {
        if (in->image_mask && !in->image_mask[i]) continue; /* masked cameras are skipped (exact) */
        uint8_t *dst = h + il.img + (uint64_t)V * img_elems * esz;
        if (u8) {
            memcpy(dst, in->images_u8 + i * img_elems, (size_t)img_elems);
        } else if (!nib_copy_finite_f32((float *)dst, in->images_f32 + i * img_elems, img_elems)) {
            /* one pass, with streaming stores on AVX2 CPUs (into the page-locked mirror: no read for
             * ownership, and no dirty lines for the input copy to snoop). H100 host, 2 cameras: checks +
             * packing 0.22-0.35 -> 0.11-0.17 ms, the copy 0.06-0.07 -> 0.03-0.04 ms
             * (bench/results/pi05-input-copy-ab-h100.json) */
            for (uint64_t j = 0; j < img_elems; j++)
                if (!isfinite(in->images_f32[i * img_elems + j]))
                    return NIB_ERR(NIB_ERR_NUMERICS, "pi05 inputs: image %d has a non-finite value at element %llu", i,
                                   (unsigned long long)j);
        }
        V++;
    }
    cs->V = V, cs->L = in->n_text, cs->H = in->horizon, cs->u8 = u8;
    cs->S = V * c->v_tokens + in->n_text;
    if (cs->S < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "pi05 inputs: no valid camera and no text: the prefix is empty");
    int32_t *pp = (int32_t *)(h + il.pos_prefix), *ps = (int32_t *)(h + il.pos_suffix);
    for (int32_t i = 0; i < cs->S; i++) pp[i] = i; /* valid tokens keep their positions */
    for (int32_t i = 0; i < cs->H; i++) ps[i] = cs->S + i;
    if (cs->L) memcpy(h + il.ids, in->text_ids, (size_t)cs->L * 4);
    float *noise = (float *)(h + il.xt);
    const int64_t nn = (int64_t)cs->H * c->action_dim;
    if (in->noise) {
        if (!nib_copy_finite_f32(noise, in->noise, (uint64_t)nn))
            for (int64_t i = 0; i < nn; i++)
                if (!isfinite(in->noise[i]))
                    return NIB_ERR(NIB_ERR_NUMERICS, "pi05 inputs: noise element %lld is not finite", (long long)i);
    } else {
        nib_rng r;
        nib_rng_seed(&r, in->seed);
        for (int64_t i = 0; i < nn; i++) noise[i] = (float)nib_rng_normal(&r);
    }
    int32_t *ints = (int32_t *)(h + il.ints);
    memset(ints, 0, 16 * 4);
    ints[0] = cs->S, ints[1] = cs->S + cs->H, ints[2] = cs->S;
    m->in_bytes = il.img + (uint64_t)V * img_elems * esz;
    m->last_P = cs->S;
    return send_inputs(m);
}

static nib_status get_graph(nib_pi05 *m, const call_shape *cs, nib_be_graph **out, int *captured) {
    graph_entry *lru = &m->graphs[0];
    *captured = 0;
    m->clock++;
    for (int i = 0; i < MAX_GRAPHS; i++) {
        graph_entry *g = &m->graphs[i];
        if (g->used && g->V == cs->V && g->L == cs->L && g->H == cs->H && g->u8 == cs->u8) {
            g->last_use = m->clock;
            *out = g->g;
            return NIB_OK;
        }
        if (!g->used || g->last_use < lru->last_use) lru = g;
    }
    nib_be_graph_free(lru->g);
    memset(lru, 0, sizeof *lru);
    /* first run of this shape eagerly (per-kernel first-launch costs stay out of the graph), and
     * never with the first step beside the prefix: a kernel's first launch may load its module
     * lazily, which waits for the device to be idle, i.e. for the expert kernel, which would be
     * waiting for the prefix kernel being loaded (CUDA's lazy loading). By the capture every kernel of
     * the call has run once. The step runs on the same CTAs either way (fwd_step): same actions. */
    m->warming = 1;
    nib_status wst = forward(m, cs);
    m->warming = 0;
    NIB_RETURN_IF_ERR(wst);
    NIB_RETURN_IF_ERR(nib_be_sync(&m->be));
    NIB_RETURN_IF_ERR(nib_be_capture_begin(&m->be));
    nib_status st = forward(m, cs);
    if (st) {
        nib_be_capture_abort(&m->be);
        return st;
    }
    NIB_RETURN_IF_ERR(nib_be_capture_end(&m->be, &lru->g));
    *captured = 1;
    lru->used = 1, lru->V = cs->V, lru->L = cs->L, lru->H = cs->H, lru->u8 = cs->u8, lru->last_use = m->clock;
    *out = lru->g;
    return NIB_OK;
}

void nib_pi05_set_check_numerics(nib_pi05 *m, int on) {
    if (m) m->check_numerics = on != 0;
}

nib_status nib_pi05_run(nib_pi05 *m, const nib_pi05_inputs *in, float *actions, nib_pi05_timing *timing) {
    call_shape cs;
    memset(&cs, 0, sizeof cs);
    const int graphed = m->be.kind == NIB_BE_CUDA && !m->check_numerics;
    if (timing && graphed && !m->ev_in[0])
        for (int i = 0; i < 2; i++) NIB_RETURN_IF_ERR(nib_be_event_create(&m->ev_in[i]));
    m->time_in = timing && graphed;
    const double th = nib_now_s();
    NIB_RETURN_IF_ERR(upload_inputs(m, in, &cs));
    if (timing) {
        memset(timing, 0, sizeof *timing);
        timing->input_host_ms = 1e3 * (nib_now_s() - th);
    }
    if (m->sig_dirty) { /* a failed call may have left overlap counters behind: zero them before this one */
        NIB_RETURN_IF_ERR(nib_be_memset(&m->be, m->kv_sig, 0, (uint64_t)m->c.e_layers * 128));
        m->sig_dirty = 0;
    }
    if (m->be.kind == NIB_BE_REF || m->check_numerics) {
        /* the reference backend, and check-numerics mode on either backend: eager, stage by stage
         * (check mode scans each stage's output; the CUDA scan synchronizes, so no graph) */
        double t0 = nib_now_s();
        m->checking = m->check_numerics;
        nib_status st = forward(m, &cs);
        m->checking = 0;
        NIB_RETURN_IF_ERR(st);
        NIB_RETURN_IF_ERR(nib_be_sync(&m->be));
        m->in_busy = 0;
        if (timing) timing->total_ms = 1e3 * (nib_now_s() - t0), timing->steps = m->c.steps;
    } else {
        if (!m->n_ev) {
            for (int i = 0; i < 3 + m->c.steps; i++) NIB_RETURN_IF_ERR(nib_be_event_create(&m->ev[m->n_ev++]));
        }
        nib_be_graph *g;
        int captured;
        NIB_RETURN_IF_ERR(get_graph(m, &cs, &g, &captured));
        /* a new shape ran eagerly first (get_graph): x_t = noise again */
        if (captured) NIB_RETURN_IF_ERR(send_inputs(m));
        NIB_RETURN_IF_ERR(nib_be_graph_launch(&m->be, g));
        NIB_RETURN_IF_ERR(nib_be_download_async(&m->be, m->out_h, m->xt, (uint64_t)cs.H * m->c.action_dim * 4));
        NIB_RETURN_IF_ERR(nib_be_sync(&m->be));
        m->in_busy = 0;
        if (m->kvto_h && *(volatile uint32_t *)m->kvto_h) { /* ops/expert.h kv_timeout */
            const unsigned layer = *(volatile uint32_t *)m->kvto_h - 1u;
            *(volatile uint32_t *)m->kvto_h = 0u;
            m->sig_dirty = 1; /* counters may arrive after the kernel reset them */
            return NIB_ERR(NIB_ERR_CUDA,
                           "pi05: the first flow step, beside the prefix, waited more than %.0f s for prefix layer %u's "
                           "K/V and gave up (are kernels being run one at a time, e.g. by a debugger or profiler? "
                           "NIB_OVERLAP=0 runs the step after the prefix); the actions of this call are not valid",
                           (double)NIB_EXPERT_KV_TIMEOUT_NS * 1e-9, layer);
        }
        if (timing) {
            float ms;
            NIB_RETURN_IF_ERR(nib_be_event_ms(m->ev[0], m->ev[1], &ms));
            timing->vision_ms = ms;
            NIB_RETURN_IF_ERR(nib_be_event_ms(m->ev[1], m->ev[2], &ms));
            timing->prefix_ms = ms;
            for (int s = 0; s < m->c.steps; s++) {
                NIB_RETURN_IF_ERR(nib_be_event_ms(m->ev[2 + s], m->ev[3 + s], &ms));
                timing->step_ms[s] = ms;
            }
            NIB_RETURN_IF_ERR(nib_be_event_ms(m->ev[0], m->ev[2 + m->c.steps], &ms));
            timing->total_ms = ms;
            NIB_RETURN_IF_ERR(nib_be_event_ms(m->ev_in[0], m->ev_in[1], &ms));
            timing->input_copy_ms = ms;
            timing->steps = m->c.steps;
            const int bs = first_step_beside(m, &cs);
            timing->first_step_beside = bs != 0;
            timing->first_step_layers_beside = bs == 1 ? beside_layers(m, cs.S) : bs == 2 ? m->c.e_layers : 0;
        }
    }
    if (graphed) { /* the graph path copied them into out_h */
        memcpy(actions, m->out_h, (size_t)cs.H * m->c.action_dim * 4);
        return NIB_OK;
    }
    return nib_be_download(&m->be, actions, m->xt, (uint64_t)cs.H * m->c.action_dim * 4);
}

double nib_pi05_step_mean_ms(const nib_pi05_timing *t) {
    const int s0 = t->first_step_beside ? 1 : 0;
    if (t->steps <= s0) return 0.0;
    double sum = 0;
    for (int s = s0; s < t->steps; s++) sum += t->step_ms[s];
    return sum / (t->steps - s0);
}

nib_status nib_pi05_prefix_kv(nib_pi05 *m, int layer, int which, float *out, int32_t max_tokens, int32_t *p) {
    if (layer < 0 || layer >= m->c.layers || (which != 0 && which != 1))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "prefix_kv: layer %d / which %d", layer, which);
    int32_t P = m->last_P < max_tokens ? m->last_P : max_tokens;
    *p = P;
    if (P <= 0) return NIB_OK;
    const uint64_t n = (uint64_t)P * m->c.kv_heads * m->c.head_dim;
    nib_kv_read_args r = {&m->kv[layer], which, 0, P, NULL, NIB_DTYPE_F32};
    if (m->be.kind == NIB_BE_REF) {
        r.out = out;
        return nib_ref_kv_read(&r);
    }
    if (n * 4 > m->be.sc.gemm_tmp_bytes) return NIB_ERR(NIB_ERR_SHAPE, "prefix_kv: %u tokens exceed the scratch", (unsigned)P);
    r.out = m->be.sc.gemm_tmp;
    NIB_RETURN_IF_ERR(nib_cuda_kv_read(&r, m->be.stream));
    return nib_be_download(&m->be, out, m->be.sc.gemm_tmp, n * 4);
}

void nib_pi05_cost_of(const nib_pi05 *m, int32_t cameras, int32_t n_text, int32_t horizon, nib_pi05_cost *k) {
    const nib_pi05_config *c = &m->c;
    memset(k, 0, sizeof *k);
    const double Wv = c->v_width, Fv = c->v_mlp, W = c->width, F = c->mlp, We = c->e_width, Fe = c->e_mlp;
    const double hd = c->head_dim, nh = c->heads, eh = c->e_heads, nkv = c->kv_heads;
    const double T = c->v_tokens, S = cameras * T + n_text, H = horizon;
    /* parameters of each stage's linears (weights read once per call / per step) */
    double vp = c->v_layers * (4 * Wv * Wv + 2 * Wv * Fv) + W * Wv + Wv * m->kpatch;
    double pp = (c->layers - 1) * ((nh + 2 * nkv) * hd * W + W * nh * hd + 3 * W * F) + 2 * nkv * hd * W;
    double ep = c->e_layers * ((eh + 2 * nkv) * hd * We + We * eh * hd + 3 * We * Fe) + 2 * We * c->action_dim;
    double bpp[NIB_WFMT_COUNT] = {2, 1, 0.5625, 0.53125, 0.53125};
    k->vision_bytes = vp * bpp[m->prec.vision];
    k->prefix_bytes = pp * bpp[m->prec.prefix];
    k->step_bytes = ep * bpp[m->prec.expert];
    /* FLOPs: 2 per weight per token, plus attention */
    k->vision_flops = 2 * vp * cameras * T + c->v_layers * cameras * 4.0 * T * T * Wv;
    k->prefix_flops = 2 * pp * S + (c->layers - 1) * 4.0 * S * S * nh * hd;
    k->step_flops = 2 * ep * H + c->e_layers * 4.0 * H * (S + H) * eh * hd;
    k->prefix_tokens = (int32_t)S;
}
