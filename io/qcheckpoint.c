/* qcheckpoint.c — quantized linear layers in safetensors files: config, detection, import into
 * nib_wsrc (zero copy where the layouts agree), element scans, and the writer side of
 * `nib quantize`. The layouts are listed in io/qcheckpoint.h and docs/quantization.md.
 *
 * Tensor data in a mapping is only 1-byte aligned in general, so multi-byte values are read with
 * memcpy, and arrays handed on as typed pointers are copied when they are misaligned. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "io/json.h"
#include "io/qcheckpoint.h"

_Static_assert(sizeof(float) == 4 && sizeof(int32_t) == 4, "32-bit float and int32");

#define QERR(st, ...) NIB_ERR((st), __VA_ARGS__)

static const char *const k_layout_names[NIB_QCKPT_LAYOUT_COUNT] = {
    "none", "float", "modelopt-nvfp4", "nib-mxfp4", "fp8", "gptq", "awq", "ct-pack-quantized"};

const char *nib_qckpt_layout_name(nib_qckpt_layout l) {
    return (unsigned)l < NIB_QCKPT_LAYOUT_COUNT ? k_layout_names[l] : "none";
}

/* ---- small helpers ------------------------------------------------------------------------- */

/* "[2048, 1024]" of a tensor's shape ("[]" for a scalar). */
static const char *dims(const nib_st_tensor *t, char *buf, size_t cap) {
    size_t w = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < t->ndim && w < cap; i++)
        w += (size_t)snprintf(buf + w, cap - w, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (w < cap) snprintf(buf + w, cap - w, "]");
    return buf;
}

/* Row-major index -> "[r, c]" (or "[i]") in t's shape, for messages. */
static const char *index_str(const nib_st_tensor *t, uint64_t i, char *buf, size_t cap) {
    if (t->ndim == 2 && t->shape[1] > 0)
        snprintf(buf, cap, "[%llu, %llu]", (unsigned long long)(i / (uint64_t)t->shape[1]),
                 (unsigned long long)(i % (uint64_t)t->shape[1]));
    else
        snprintf(buf, cap, "[%llu]", (unsigned long long)i);
    return buf;
}

static int is_float_dtype(nib_dtype d) {
    return d == NIB_DTYPE_BF16 || d == NIB_DTYPE_F16 || d == NIB_DTYPE_F32;
}

/* A one-element tensor of shape [] or [1]. */
static int is_scalar(const nib_st_tensor *t) {
    return t->numel == 1 && (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1));
}

static int shape2_is(const nib_st_tensor *t, int64_t a, int64_t b) {
    return t->ndim == 2 && t->shape[0] == a && t->shape[1] == b;
}

/* Element i of a float tensor (BF16/F16/F32) as fp32; unaligned-safe. */
static float load_float(const nib_st_tensor *t, uint64_t i) {
    const uint8_t *p = (const uint8_t *)t->data;
    switch (t->dtype) {
    case NIB_DTYPE_F32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case NIB_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return nib_bf16_to_f32(h);
    }
    case NIB_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return nib_f16_to_f32(h);
    }
    default: return NAN;
    }
}

static int64_t load_int(const nib_st_tensor *t, uint64_t i) {
    const uint8_t *p = (const uint8_t *)t->data;
    if (t->dtype == NIB_DTYPE_I64) {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

/* t->data when it is `align`-byte aligned, else a copy in *own (which the caller frees). */
static const void *aligned_view(const nib_st_tensor *t, size_t align, void **own) {
    *own = NULL;
    if ((uintptr_t)t->data % align == 0) return t->data;
    *own = nib_malloc((size_t)t->nbytes);
    if (*own) memcpy(*own, t->data, (size_t)t->nbytes);
    return *own;
}

/* "<base>.<suffix>" (nib_malloc'ed) */
static char *join(const char *base, const char *suffix) {
    size_t a = strlen(base), b = strlen(suffix), n;
    if (nib_add_overflow_size(a, b, &n) || nib_add_overflow_size(n, 2, &n)) return NULL;
    char *s = nib_malloc(n);
    if (!s) return NULL;
    memcpy(s, base, a);
    s[a] = '.';
    memcpy(s + a + 1, suffix, b + 1);
    return s;
}

static const nib_st_tensor *find_part(const nib_st_file *f, const char *base, const char *suffix,
                                      nib_status *st) {
    char *name = join(base, suffix);
    if (!name) {
        *st = NIB_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    const nib_st_tensor *t = nib_st_find(f, name);
    nib_free(name);
    return t;
}

static int ieq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char x = *a, y = *b;
        if (x >= 'A' && x <= 'Z') x = (char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z') y = (char)(y - 'A' + 'a');
        if (x != y) return 0;
    }
    return *a == *b;
}

/* case-insensitive substring */
static int icontains(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i]) {
            char x = hay[i], y = needle[i];
            if (x >= 'A' && x <= 'Z') x = (char)(x - 'A' + 'a');
            if (y >= 'A' && y <= 'Z') y = (char)(y - 'A' + 'a');
            if (x != y) break;
            i++;
        }
        if (i == n) return 1;
    }
    return 0;
}

/* ---- config -------------------------------------------------------------------------------- */

static nib_status cfg_str(const nib_json_value *obj, const char *key, char *dst, size_t cap) {
    const nib_json_value *v = nib_json_get(obj, key);
    if (!v || nib_json_type_of(v) == NIB_JSON_NULL) return NIB_OK;
    size_t n;
    const char *s = nib_json_string(v, &n);
    if (!s)
        return QERR(NIB_ERR_FORMAT, "quantization config: \"%s\" is %s, want a string", key,
                    nib_json_type_name(nib_json_type_of(v)));
    snprintf(dst, cap, "%s", s);
    return NIB_OK;
}

static nib_status cfg_int(const nib_json_value *obj, const char *key, int64_t *dst) {
    const nib_json_value *v = nib_json_get(obj, key);
    if (!v || nib_json_type_of(v) == NIB_JSON_NULL) return NIB_OK;
    if (nib_json_int64(v, dst) != NIB_OK)
        return nib_error_context(NIB_ERR_FORMAT, "quantization config: \"%s\"", key);
    return NIB_OK;
}

nib_status nib_qckpt_config_parse(const char *json, size_t len, nib_qckpt_config *cfg) {
    nib_status st = NIB_OK;
    nib_json_doc *doc = NULL;
    if (!cfg || (!json && len)) return QERR(NIB_ERR_INVALID_ARG, "quantization config: NULL argument");
    memset(cfg, 0, sizeof *cfg);
    NIB_TRY(nib_json_parse(json, len, 0, &doc));
    const nib_json_value *root = nib_json_root(doc);
    if (nib_json_type_of(root) != NIB_JSON_OBJECT) {
        st = QERR(NIB_ERR_FORMAT, "quantization config: not a JSON object");
        goto fail;
    }
    const nib_json_value *q = nib_json_get(root, "quantization"); /* hf_quant_config.json */
    if (nib_json_type_of(q) == NIB_JSON_OBJECT) {
        snprintf(cfg->quant_method, sizeof cfg->quant_method, "modelopt");
        NIB_TRY(cfg_str(q, "quant_algo", cfg->quant_algo, sizeof cfg->quant_algo));
        NIB_TRY(cfg_int(q, "group_size", &cfg->group_size));
    }
    NIB_TRY(cfg_str(root, "quant_method", cfg->quant_method, sizeof cfg->quant_method));
    NIB_TRY(cfg_str(root, "quant_algo", cfg->quant_algo, sizeof cfg->quant_algo));
    NIB_TRY(cfg_str(root, "checkpoint_format", cfg->checkpoint_format, sizeof cfg->checkpoint_format));
    NIB_TRY(cfg_str(root, "version", cfg->version, sizeof cfg->version));
    NIB_TRY(cfg_str(root, "format", cfg->format, sizeof cfg->format));
    NIB_TRY(cfg_int(root, "group_size", &cfg->group_size));
    NIB_TRY(cfg_int(root, "bits", &cfg->bits));
    /* compressed-tensors: the first config group's weight args */
    const nib_json_value *groups = nib_json_get(root, "config_groups");
    if (nib_json_count(groups) > 0 && nib_json_type_of(groups) == NIB_JSON_OBJECT) {
        const nib_json_value *wargs = nib_json_get(nib_json_member_at(groups, 0)->value, "weights");
        if (nib_json_type_of(wargs) == NIB_JSON_OBJECT) {
            NIB_TRY(cfg_int(wargs, "num_bits", &cfg->bits));
            NIB_TRY(cfg_int(wargs, "group_size", &cfg->group_size));
        }
    }
    cfg->present = 1;
fail:
    nib_json_free(doc);
    if (st != NIB_OK) {
        memset(cfg, 0, sizeof *cfg);
    }
    return st;
}

nib_status nib_qckpt_config_from_file(const nib_st_file *f, nib_qckpt_config *cfg) {
    if (!f || !cfg) return QERR(NIB_ERR_INVALID_ARG, "quantization config: NULL argument");
    memset(cfg, 0, sizeof *cfg);
    const nib_st_kv *kv = nib_st_metadata_find(f, "quantization_config");
    if (!kv) return NIB_OK;
    nib_status st = nib_qckpt_config_parse(kv->value, kv->value_len, cfg);
    if (st != NIB_OK) return nib_error_context(st, "__metadata__.quantization_config");
    return NIB_OK;
}

/* ---- detection ------------------------------------------------------------------------------ */

typedef struct qparts {
    const nib_st_tensor *w;        /* weight | qweight | weight_packed */
    const nib_st_tensor *scale;    /* weight_scale | scales */
    const nib_st_tensor *scale2;   /* weight_scale_2 */
    const nib_st_tensor *zeros;    /* qzeros | weight_zero_point */
    const nib_st_tensor *gidx;     /* g_idx | weight_g_idx */
    const nib_st_tensor *wshape;   /* weight_shape */
    const nib_st_tensor *in_scale; /* input_scale */
    const nib_st_tensor *bias;
    const nib_st_tensor *k_scale, *v_scale;
} qparts;

/* Detection result with the parts by role (get_linear needs them). */
typedef struct qdet {
    nib_qckpt_info info;
    qparts p;
    int gptq_v2;
} qdet;

static void add_part(nib_qckpt_info *in, const nib_st_tensor *t, int defines_weight) {
    if (!t || in->n_parts >= NIB_QCKPT_MAX_PARTS) return;
    in->parts[in->n_parts++] = t;
    in->bytes += t->nbytes;
    if (defines_weight) in->weight_bytes += t->nbytes;
}

static nib_status need(const nib_st_tensor *t, const char *base, const char *suffix,
                       const char *why) {
    if (t) return NIB_OK;
    return QERR(NIB_ERR_FORMAT, "'%s.%s' is missing (%s)", base, suffix, why);
}

static nib_status need_dtype(const nib_st_tensor *t, nib_dtype want, const char *why) {
    if (t->dtype == want) return NIB_OK;
    return QERR(NIB_ERR_FORMAT, "'%s' has dtype %s, want %s (%s)", t->name,
                nib_dtype_name(t->dtype), nib_dtype_name(want), why);
}

static nib_status need_2d(const nib_st_tensor *t) {
    char b[128];
    if (t->ndim != 2)
        return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want 2 dimensions", t->name,
                    dims(t, b, sizeof b));
    if (t->shape[0] < 1 || t->shape[1] < 1)
        return QERR(NIB_ERR_SHAPE, "'%s' is empty (shape %s)", t->name, dims(t, b, sizeof b));
    return NIB_OK;
}

static nib_status need_scalar_f32(const nib_st_tensor *t, const char *what) {
    char b[128];
    if (t->dtype != NIB_DTYPE_F32)
        return QERR(NIB_ERR_FORMAT, "'%s' (%s) has dtype %s, want F32", t->name, what,
                    nib_dtype_name(t->dtype));
    if (!is_scalar(t))
        return QERR(NIB_ERR_SHAPE, "'%s' (%s) has shape %s, want a scalar ([] or [1])", t->name,
                    what, dims(t, b, sizeof b));
    return NIB_OK;
}

static nib_status check_bias(const nib_st_tensor *b, int64_t n) {
    char s[128];
    if (!b) return NIB_OK;
    if (!is_float_dtype(b->dtype))
        return QERR(NIB_ERR_FORMAT, "'%s' has dtype %s, want BF16, F16 or F32", b->name,
                    nib_dtype_name(b->dtype));
    if (b->ndim != 1 || b->shape[0] != n)
        return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want [%lld] (N)", b->name,
                    dims(b, s, sizeof s), (long long)n);
    return NIB_OK;
}

static int int4_group_ok(int64_t g) { return g == 32 || g == 64 || g == 128; }

/* INT4 group from K and the number of groups in the scale plane. */
static nib_status int4_group(const nib_st_tensor *scale, int64_t k, int64_t ng,
                             const nib_qckpt_config *cfg, int *group) {
    if (ng < 1 || k % ng != 0)
        return QERR(NIB_ERR_SHAPE, "'%s': K = %lld is not a multiple of its %lld groups", scale->name,
                    (long long)k, (long long)ng);
    int64_t g = k / ng;
    if (!int4_group_ok(g))
        return QERR(NIB_ERR_UNSUPPORTED,
                    "'%s': group size %lld (K = %lld in %lld groups) is not supported (32, 64, 128)",
                    scale->name, (long long)g, (long long)k, (long long)ng);
    if (cfg && cfg->group_size > 0 && cfg->group_size != g)
        return QERR(NIB_ERR_FORMAT, "'%s' implies group size %lld, but the quantization config says %lld",
                    scale->name, (long long)g, (long long)cfg->group_size);
    *group = (int)g;
    return NIB_OK;
}

static nib_status check_gidx(const nib_st_tensor *g, int64_t k) {
    char s[128];
    if (!g) return NIB_OK;
    NIB_RETURN_IF_ERR(need_dtype(g, NIB_DTYPE_I32, "group index of each input channel"));
    if (g->ndim != 1 || g->shape[0] != k)
        return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want [%lld] (K)", g->name, dims(g, s, sizeof s),
                    (long long)k);
    return NIB_OK;
}

static nib_status detect_4bit_float(const nib_st_file *f, const char *base, const nib_qckpt_config *cfg,
                                    qdet *d) {
    nib_status st = NIB_OK;
    qparts *p = &d->p;
    nib_qckpt_info *in = &d->info;
    char b1[128], b2[128];
    NIB_RETURN_IF_ERR(need_2d(p->w));
    const int64_t n = p->w->shape[0], k = 2 * p->w->shape[1];
    p->scale = find_part(f, base, "weight_scale", &st);
    p->scale2 = find_part(f, base, "weight_scale_2", &st);
    p->in_scale = find_part(f, base, "input_scale", &st);
    if (st) return st;
    NIB_RETURN_IF_ERR(need(p->scale, base, "weight_scale",
                           "a U8 weight [N, K/2] of 4-bit codes needs its block scales: F8_E4M3 "
                           "[N, K/16] (NVFP4) or F8_E8M0 [N, K/32] (MXFP4)"));
    int nv;
    if (p->scale->dtype == NIB_DTYPE_F8_E4M3) nv = 1;
    else if (p->scale->dtype == NIB_DTYPE_F8_E8M0) nv = 0;
    else if (p->scale->dtype == NIB_DTYPE_U8) {
        if (cfg && icontains(cfg->quant_algo, "nvfp4")) nv = 1;
        else if (cfg && icontains(cfg->quant_algo, "mxfp4")) nv = 0;
        else if (p->scale2) nv = 1;
        else if (p->scale->ndim == 2 && p->scale->shape[1] * 16 == k) nv = 1;
        else if (p->scale->ndim == 2 && p->scale->shape[1] * 32 == k) nv = 0;
        else
            return QERR(NIB_ERR_SHAPE,
                        "'%s' (U8) has shape %s: neither NVFP4 [%lld, %lld] nor MXFP4 [%lld, %lld] "
                        "for weight '%s' %s",
                        p->scale->name, dims(p->scale, b1, sizeof b1), (long long)n, (long long)(k / 16),
                        (long long)n, (long long)(k / 32), p->w->name, dims(p->w, b2, sizeof b2));
    } else {
        return QERR(NIB_ERR_FORMAT, "'%s' has dtype %s, want F8_E4M3 (NVFP4) or F8_E8M0 (MXFP4)",
                    p->scale->name, nib_dtype_name(p->scale->dtype));
    }
    const int blk = nv ? 16 : 32;
    if (k % blk)
        return QERR(NIB_ERR_SHAPE,
                    "'%s': K = %lld (2 x %lld columns) is not a multiple of the %s block of %d",
                    p->w->name, (long long)k, (long long)p->w->shape[1], nv ? "NVFP4" : "MXFP4", blk);
    if (!shape2_is(p->scale, n, k / blk))
        return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want [%lld, %lld] (one scale per %d of K = %lld)",
                    p->scale->name, dims(p->scale, b1, sizeof b1), (long long)n, (long long)(k / blk),
                    blk, (long long)k);
    if (nv) {
        NIB_RETURN_IF_ERR(need(p->scale2, base, "weight_scale_2", "the NVFP4 global scale, F32 scalar"));
        NIB_RETURN_IF_ERR(need_scalar_f32(p->scale2, "NVFP4 global scale"));
    } else if (p->scale2) {
        return QERR(NIB_ERR_FORMAT, "'%s' is unexpected: an MXFP4 weight (E8M0 scales) has no global scale",
                    p->scale2->name);
    }
    if (p->in_scale) NIB_RETURN_IF_ERR(need_scalar_f32(p->in_scale, "activation scale"));
    in->layout = nv ? NIB_QCKPT_NVFP4_MODELOPT : NIB_QCKPT_MXFP4_NIB;
    in->fmt = nv ? NIB_WFMT_NVFP4 : NIB_WFMT_MXFP4;
    in->n = n;
    in->k = k;
    in->block = blk;
    add_part(in, p->w, 1);
    add_part(in, p->scale, 1);
    add_part(in, p->scale2, 1);
    add_part(in, p->in_scale, 0);
    return NIB_OK;
}

static nib_status detect_fp8(const nib_st_file *f, const char *base, qdet *d) {
    nib_status st = NIB_OK;
    qparts *p = &d->p;
    nib_qckpt_info *in = &d->info;
    char b1[128];
    NIB_RETURN_IF_ERR(need_2d(p->w));
    const int64_t n = p->w->shape[0], k = p->w->shape[1];
    const nib_st_tensor *inv = find_part(f, base, "weight_scale_inv", &st);
    p->scale = find_part(f, base, "weight_scale", &st);
    p->in_scale = find_part(f, base, "input_scale", &st);
    if (st) return st;
    if (inv && !p->scale)
        return QERR(NIB_ERR_UNSUPPORTED, "'%s': block-scaled FP8 (DeepSeek-style weight_scale_inv) is "
                    "not supported", inv->name);
    NIB_RETURN_IF_ERR(need(p->scale, base, "weight_scale",
                           "an F8_E4M3 weight needs its scale: F32 [] / [1] per tensor or [N] / [N, 1] "
                           "per channel"));
    if (!is_float_dtype(p->scale->dtype))
        return QERR(NIB_ERR_FORMAT, "'%s' has dtype %s, want F32 (or BF16/F16)", p->scale->name,
                    nib_dtype_name(p->scale->dtype));
    if (is_scalar(p->scale)) in->fp8_per_channel = 0;
    else if ((p->scale->ndim == 1 && p->scale->shape[0] == n) || shape2_is(p->scale, n, 1))
        in->fp8_per_channel = 1;
    else
        return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want [] or [1] (per tensor) or [%lld] or [%lld, 1] "
                    "(per output channel)", p->scale->name, dims(p->scale, b1, sizeof b1),
                    (long long)n, (long long)n);
    if (k % 16)
        return QERR(NIB_ERR_SHAPE, "'%s': K = %lld is not a multiple of 16 (nib's FP8 GEMM block)",
                    p->w->name, (long long)k);
    if (p->in_scale) NIB_RETURN_IF_ERR(need_scalar_f32(p->in_scale, "activation scale"));
    in->layout = NIB_QCKPT_FP8;
    in->fmt = NIB_WFMT_FP8;
    in->n = n;
    in->k = k;
    in->block = in->fp8_per_channel ? (int)(k > INT32_MAX ? 0 : k) : 0;
    add_part(in, p->w, 1);
    add_part(in, p->scale, 1);
    add_part(in, p->in_scale, 0);
    return NIB_OK;
}

static nib_status detect_gptq_awq(const nib_st_file *f, const char *base, const nib_qckpt_config *cfg,
                                  qdet *d) {
    nib_status st = NIB_OK;
    qparts *p = &d->p;
    nib_qckpt_info *in = &d->info;
    char b1[128], b2[128];
    NIB_RETURN_IF_ERR(need_dtype(p->w, NIB_DTYPE_I32, "8 packed 4-bit codes per int32"));
    NIB_RETURN_IF_ERR(need_2d(p->w));
    if (cfg && cfg->bits && cfg->bits != 4)
        return QERR(NIB_ERR_UNSUPPORTED, "'%s': the quantization config says %lld bits; only 4-bit GPTQ/AWQ "
                    "weights are supported", p->w->name, (long long)cfg->bits);
    p->scale = find_part(f, base, "scales", &st);
    p->zeros = find_part(f, base, "qzeros", &st);
    p->gidx = find_part(f, base, "g_idx", &st);
    if (st) return st;
    NIB_RETURN_IF_ERR(need(p->scale, base, "scales", "INT4 group scales, F16 [K/G, N]"));
    NIB_RETURN_IF_ERR(need_2d(p->scale));
    if (!is_float_dtype(p->scale->dtype))
        return QERR(NIB_ERR_FORMAT, "'%s' has dtype %s, want F16", p->scale->name,
                    nib_dtype_name(p->scale->dtype));
    NIB_RETURN_IF_ERR(need(p->zeros, base, "qzeros", "INT4 zero points, I32 [K/G, N/8]"));
    NIB_RETURN_IF_ERR(need_dtype(p->zeros, NIB_DTYPE_I32, "8 packed zero points per int32"));
    int awq;
    if (cfg && ieq(cfg->quant_method, "awq")) awq = 1;
    else if (cfg && ieq(cfg->quant_method, "gptq")) awq = 0;
    else if (p->scale->shape[1] == p->w->shape[1]) awq = 0;
    else if (p->w->shape[1] * 8 == p->scale->shape[1]) awq = 1;
    else if (p->gidx) awq = 0;
    else
        return QERR(NIB_ERR_SHAPE, "cannot match '%s' %s with '%s' %s: want GPTQ qweight [K/8, N] "
                    "with scales [K/G, N], or AWQ qweight [K, N/8] with scales [K/G, N]",
                    p->w->name, dims(p->w, b1, sizeof b1), p->scale->name, dims(p->scale, b2, sizeof b2));
    int64_t n, k;
    if (awq) {
        if (cfg && ieq(cfg->version, "gemv"))
            return QERR(NIB_ERR_UNSUPPORTED, "'%s': AWQ GEMV packing is not supported (GEMM only)", p->w->name);
        k = p->w->shape[0];
        n = 8 * p->w->shape[1];
        if (p->gidx)
            return QERR(NIB_ERR_FORMAT, "'%s' is unexpected: AWQ has no act-order g_idx", p->gidx->name);
    } else {
        k = 8 * p->w->shape[0];
        n = p->w->shape[1];
        d->gptq_v2 = cfg && ieq(cfg->checkpoint_format, "gptq_v2");
    }
    if (p->scale->shape[1] != n)
        return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want [K/G, %lld] (N of '%s' %s, %s layout)",
                    p->scale->name, dims(p->scale, b1, sizeof b1), (long long)n, p->w->name,
                    dims(p->w, b2, sizeof b2), awq ? "AWQ" : "GPTQ");
    const int64_t ng = p->scale->shape[0];
    int group = 0;
    NIB_RETURN_IF_ERR(int4_group(p->scale, k, ng, cfg, &group));
    if (n % 8)
        return QERR(NIB_ERR_SHAPE, "'%s': N = %lld is not a multiple of 8 (zero points pack 8 per int32)",
                    p->w->name, (long long)n);
    if (!shape2_is(p->zeros, ng, n / 8))
        return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want [%lld, %lld] (K/G, N/8)", p->zeros->name,
                    dims(p->zeros, b1, sizeof b1), (long long)ng, (long long)(n / 8));
    NIB_RETURN_IF_ERR(check_gidx(p->gidx, k));
    in->layout = awq ? NIB_QCKPT_AWQ : NIB_QCKPT_GPTQ;
    in->fmt = NIB_WFMT_INT4;
    in->n = n;
    in->k = k;
    in->block = group;
    in->int4_act_order = p->gidx != NULL;
    add_part(in, p->w, 1);
    add_part(in, p->zeros, 1);
    add_part(in, p->scale, 1);
    add_part(in, p->gidx, 1);
    return NIB_OK;
}

static nib_status detect_ct(const nib_st_file *f, const char *base, const nib_qckpt_config *cfg, qdet *d) {
    nib_status st = NIB_OK;
    qparts *p = &d->p;
    nib_qckpt_info *in = &d->info;
    char b1[128], b2[128];
    if (p->w->dtype == NIB_DTYPE_U8)
        return QERR(NIB_ERR_UNSUPPORTED, "'%s': compressed-tensors NVFP4 (U8 weight_packed with a "
                    "reciprocal weight_global_scale) is not supported; export ModelOpt NVFP4",
                    p->w->name);
    NIB_RETURN_IF_ERR(need_dtype(p->w, NIB_DTYPE_I32, "pack-quantized: 8 packed 4-bit codes per int32"));
    NIB_RETURN_IF_ERR(need_2d(p->w));
    p->wshape = find_part(f, base, "weight_shape", &st);
    p->scale = find_part(f, base, "weight_scale", &st);
    p->zeros = find_part(f, base, "weight_zero_point", &st);
    p->gidx = find_part(f, base, "weight_g_idx", &st);
    if (st) return st;
    NIB_RETURN_IF_ERR(need(p->wshape, base, "weight_shape", "the unpacked [N, K], I64 or I32 [2]"));
    if ((p->wshape->dtype != NIB_DTYPE_I64 && p->wshape->dtype != NIB_DTYPE_I32) || p->wshape->ndim != 1 ||
        p->wshape->shape[0] != 2)
        return QERR(NIB_ERR_FORMAT, "'%s' is %s %s, want I64 or I32 [2]", p->wshape->name,
                    nib_dtype_name(p->wshape->dtype), dims(p->wshape, b1, sizeof b1));
    const int64_t n = load_int(p->wshape, 0), k = load_int(p->wshape, 1);
    if (n < 1 || k < 1)
        return QERR(NIB_ERR_SHAPE, "'%s' = [%lld, %lld] is empty or negative", p->wshape->name,
                    (long long)n, (long long)k);
    if (n != p->w->shape[0])
        return QERR(NIB_ERR_SHAPE, "'%s' says N = %lld but '%s' has %lld rows", p->wshape->name,
                    (long long)n, p->w->name, (long long)p->w->shape[0]);
    if (k % 8)
        return QERR(NIB_ERR_SHAPE, "'%s': K = %lld (from '%s') is not a multiple of 8 (8 codes per int32)",
                    p->w->name, (long long)k, p->wshape->name);
    if (p->w->shape[1] * 4 == k || (cfg && cfg->bits && cfg->bits != 4))
        return QERR(NIB_ERR_UNSUPPORTED, "'%s': only 4-bit pack-quantized weights are supported", p->w->name);
    if (p->w->shape[1] * 8 != k)
        return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want [%lld, %lld] for K = %lld ('%s')", p->w->name,
                    dims(p->w, b1, sizeof b1), (long long)n, (long long)(k / 8), (long long)k,
                    p->wshape->name);
    NIB_RETURN_IF_ERR(need(p->scale, base, "weight_scale", "INT4 group scales [N, K/G]"));
    NIB_RETURN_IF_ERR(need_2d(p->scale));
    if (!is_float_dtype(p->scale->dtype))
        return QERR(NIB_ERR_FORMAT, "'%s' has dtype %s, want F16, BF16 or F32", p->scale->name,
                    nib_dtype_name(p->scale->dtype));
    if (p->scale->shape[0] != n)
        return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want [%lld, K/G]", p->scale->name,
                    dims(p->scale, b1, sizeof b1), (long long)n);
    const int64_t ng = p->scale->shape[1];
    int group = 0;
    NIB_RETURN_IF_ERR(int4_group(p->scale, k, ng, cfg, &group));
    if (n % 8)
        return QERR(NIB_ERR_SHAPE, "'%s': N = %lld is not a multiple of 8 (nib imports through the GPTQ "
                    "layout, which packs 8 zero points per int32)", p->w->name, (long long)n);
    if (p->zeros) {
        NIB_RETURN_IF_ERR(need_dtype(p->zeros, NIB_DTYPE_I32, "8 packed zero points per int32, along N"));
        if (!shape2_is(p->zeros, n / 8, ng))
            return QERR(NIB_ERR_SHAPE, "'%s' has shape %s, want [%lld, %lld] (N/8, K/G)", p->zeros->name,
                        dims(p->zeros, b1, sizeof b1), (long long)(n / 8), (long long)ng);
    }
    NIB_RETURN_IF_ERR(check_gidx(p->gidx, k));
    (void)b2;
    in->layout = NIB_QCKPT_CT_PACKED;
    in->fmt = NIB_WFMT_INT4;
    in->n = n;
    in->k = k;
    in->block = group;
    in->int4_asym = p->zeros != NULL;
    in->int4_act_order = p->gidx != NULL;
    add_part(in, p->w, 1);
    add_part(in, p->scale, 1);
    add_part(in, p->zeros, 1);
    add_part(in, p->gidx, 1);
    add_part(in, p->wshape, 1);
    return NIB_OK;
}

static nib_status detect(const nib_st_file *f, const char *base, const nib_qckpt_config *cfg, qdet *d) {
    nib_status st = NIB_OK;
    memset(d, 0, sizeof *d);
    qparts *p = &d->p;
    const nib_st_tensor *w = find_part(f, base, "weight", &st);
    const nib_st_tensor *qw = find_part(f, base, "qweight", &st);
    const nib_st_tensor *wp = find_part(f, base, "weight_packed", &st);
    p->bias = find_part(f, base, "bias", &st);
    p->k_scale = find_part(f, base, "k_scale", &st);
    p->v_scale = find_part(f, base, "v_scale", &st);
    if (st) return st;
    int count = !!w + !!qw + !!wp;
    if (count == 0)
        return QERR(NIB_ERR_NOT_FOUND, "'%s': no linear weight ('%s.weight', '.qweight' or "
                    "'.weight_packed')", base, base);
    if (count > 1)
        return QERR(NIB_ERR_FORMAT, "'%s': more than one of '.weight', '.qweight', '.weight_packed' "
                    "exists", base);
    if (wp) {
        p->w = wp;
        st = detect_ct(f, base, cfg, d);
    } else if (qw) {
        p->w = qw;
        st = detect_gptq_awq(f, base, cfg, d);
    } else {
        p->w = w;
        if (is_float_dtype(w->dtype)) {
            st = need_2d(w);
            if (st == NIB_OK) {
                d->info.layout = NIB_QCKPT_FLOAT;
                d->info.fmt = NIB_WFMT_BF16;
                d->info.n = w->shape[0];
                d->info.k = w->shape[1];
                add_part(&d->info, w, 1);
            }
        } else if (w->dtype == NIB_DTYPE_U8) {
            st = detect_4bit_float(f, base, cfg, d);
        } else if (w->dtype == NIB_DTYPE_F8_E4M3) {
            st = detect_fp8(f, base, d);
        } else {
            st = QERR(NIB_ERR_UNSUPPORTED, "'%s' has dtype %s: not a linear weight layout nib knows",
                      w->name, nib_dtype_name(w->dtype));
        }
    }
    if (st) return st;
    NIB_RETURN_IF_ERR(check_bias(p->bias, d->info.n));
    add_part(&d->info, p->bias, 0);
    add_part(&d->info, p->k_scale, 0);
    add_part(&d->info, p->v_scale, 0);
    double nk = (double)d->info.n * (double)d->info.k;
    d->info.bits_per_weight = nk > 0 ? 8.0 * (double)d->info.weight_bytes / nk : 0.0;
    return NIB_OK;
}

nib_status nib_qckpt_detect(const nib_st_file *f, const char *base, const nib_qckpt_config *cfg,
                            nib_qckpt_info *out) {
    nib_qckpt_config own;
    qdet d;
    if (!f || !base || !out) return QERR(NIB_ERR_INVALID_ARG, "qckpt detect: NULL argument");
    memset(out, 0, sizeof *out);
    if (!cfg) {
        NIB_RETURN_IF_ERR(nib_qckpt_config_from_file(f, &own));
        cfg = &own;
    }
    NIB_RETURN_IF_ERR(detect(f, base, cfg, &d));
    *out = d.info;
    return NIB_OK;
}

/* ---- index ----------------------------------------------------------------------------------- */

struct nib_qckpt_index {
    nib_qckpt_entry *e;
    size_t n, cap;
    uint32_t *owner; /* per tensor: entry index + 1, 0 = none */
    size_t n_tensors;
};

void nib_qckpt_index_free(nib_qckpt_index *ix) {
    if (!ix) return;
    for (size_t i = 0; i < ix->n; i++) {
        nib_free((char *)ix->e[i].base);
        nib_free((char *)ix->e[i].problem);
    }
    nib_free(ix->e);
    nib_free(ix->owner);
    nib_free(ix);
}

size_t nib_qckpt_index_count(const nib_qckpt_index *ix) { return ix ? ix->n : 0; }

const nib_qckpt_entry *nib_qckpt_index_at(const nib_qckpt_index *ix, size_t i) {
    return ix && i < ix->n ? &ix->e[i] : NULL;
}

const nib_qckpt_entry *nib_qckpt_index_owner(const nib_qckpt_index *ix, size_t tensor_i) {
    if (!ix || tensor_i >= ix->n_tensors || !ix->owner[tensor_i]) return NULL;
    return &ix->e[ix->owner[tensor_i] - 1];
}

/* Tensor index of t in f: the parts of a detected layer come from f's own table, one array, so
 * the index is a pointer difference (O(1); a search by offset is linear over the zero-size
 * tensors sharing one offset, quadratic in total on a hostile header). */
static size_t tensor_index(const nib_st_file *f, const nib_st_tensor *t) {
    size_t n = nib_st_count(f);
    if (!n || !t) return SIZE_MAX;
    const nib_st_tensor *t0 = nib_st_tensor_at(f, 0);
    uintptr_t a = (uintptr_t)t0, b = (uintptr_t)t;
    if (b < a || (b - a) % sizeof *t0) return SIZE_MAX;
    size_t i = (b - a) / sizeof *t0;
    return i < n && nib_st_tensor_at(f, i) == t ? i : SIZE_MAX;
}

/* Set of the bases seen so far: open addressing over entry indices + 1 (0 = empty slot),
 * FNV-1a of the base; the table is kept at most half full. */
typedef struct {
    uint32_t *slot;
    size_t cap; /* a power of two */
} base_set;

static uint64_t base_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The entry holding base, or NULL. */
static const nib_qckpt_entry *base_set_find(const base_set *bs, const nib_qckpt_entry *e,
                                            const char *base) {
    if (!bs->cap) return NULL;
    for (size_t i = (size_t)base_hash(base) & (bs->cap - 1);; i = (i + 1) & (bs->cap - 1)) {
        if (!bs->slot[i]) return NULL;
        if (!strcmp(e[bs->slot[i] - 1].base, base)) return &e[bs->slot[i] - 1];
    }
}

/* Adds entry k (its base is e[k].base); grows the table first when needed. */
static nib_status base_set_add(base_set *bs, const nib_qckpt_entry *e, size_t k) {
    if (2 * (k + 1) > bs->cap) {
        size_t ncap = bs->cap ? 2 * bs->cap : 64;
        uint32_t *ns = nib_calloc(ncap, sizeof *ns);
        if (!ns) return NIB_ERR_OUT_OF_MEMORY;
        for (size_t j = 0; j < k; j++) {
            size_t i = (size_t)base_hash(e[j].base) & (ncap - 1);
            while (ns[i]) i = (i + 1) & (ncap - 1);
            ns[i] = (uint32_t)(j + 1);
        }
        nib_free(bs->slot);
        bs->slot = ns;
        bs->cap = ncap;
    }
    size_t i = (size_t)base_hash(e[k].base) & (bs->cap - 1);
    while (bs->slot[i]) i = (i + 1) & (bs->cap - 1);
    bs->slot[i] = (uint32_t)(k + 1);
    return NIB_OK;
}

/* The base of a candidate tensor name, or 0 when it is not a candidate. */
static size_t candidate_base_len(const nib_st_tensor *t) {
    static const struct {
        const char *suffix;
        int any_dtype;
    } k_suffix[] = {{".qweight", 1}, {".weight_packed", 1}, {".weight", 0}};
    for (size_t s = 0; s < NIB_ARRAY_LEN(k_suffix); s++) {
        size_t sl = strlen(k_suffix[s].suffix);
        if (t->name_len > sl && !memcmp(t->name + t->name_len - sl, k_suffix[s].suffix, sl)) {
            if (!k_suffix[s].any_dtype && t->dtype != NIB_DTYPE_U8 && t->dtype != NIB_DTYPE_F8_E4M3 &&
                t->dtype != NIB_DTYPE_F8_E8M0)
                return 0;
            return t->name_len - sl;
        }
    }
    return 0;
}

nib_status nib_qckpt_index_build(const nib_st_file *f, const nib_qckpt_config *cfg,
                                 nib_qckpt_index **out) {
    nib_status st = NIB_OK;
    nib_qckpt_config own;
    nib_qckpt_index *ix = NULL;
    char *base = NULL;
    base_set seen = {NULL, 0};
    if (!f || !out) return QERR(NIB_ERR_INVALID_ARG, "qckpt index: NULL argument");
    *out = NULL;
    if (!cfg) {
        NIB_RETURN_IF_ERR(nib_qckpt_config_from_file(f, &own));
        cfg = &own;
    }
    ix = nib_calloc(1, sizeof *ix);
    if (!ix) return NIB_ERR_OUT_OF_MEMORY;
    ix->n_tensors = nib_st_count(f);
    ix->owner = nib_calloc(ix->n_tensors ? ix->n_tensors : 1, sizeof *ix->owner);
    if (!ix->owner) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (size_t i = 0; i < ix->n_tensors; i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        size_t bl = candidate_base_len(t);
        if (!bl || ix->owner[i]) continue;
        base = nib_malloc(bl + 1);
        if (!base) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        memcpy(base, t->name, bl);
        base[bl] = '\0';
        if (base_set_find(&seen, ix->e, base)) {
            nib_free(base);
            base = NULL;
            continue;
        }
        if (ix->n == ix->cap) {
            size_t ncap = ix->cap ? 2 * ix->cap : 16;
            void *np = nib_realloc(ix->e, ncap * sizeof *ix->e);
            if (!np) {
                st = NIB_ERR_OUT_OF_MEMORY;
                goto fail;
            }
            ix->e = np;
            ix->cap = ncap;
        }
        nib_qckpt_entry *e = &ix->e[ix->n];
        memset(e, 0, sizeof *e);
        qdet d;
        e->status = detect(f, base, cfg, &d);
        if (e->status == NIB_ERR_OUT_OF_MEMORY) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        e->problem = nib_strdup(e->status ? nib_last_error() : "");
        if (!e->problem) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        e->base = base;
        base = NULL;
        ix->n++;
        if (base_set_add(&seen, ix->e, ix->n - 1) != NIB_OK) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        if (e->status == NIB_OK) {
            e->info = d.info;
            for (size_t p = 0; p < d.info.n_parts; p++) {
                size_t ti = tensor_index(f, d.info.parts[p]);
                if (ti < ix->n_tensors && !ix->owner[ti]) ix->owner[ti] = (uint32_t)ix->n;
            }
        }
    }
    nib_free(seen.slot);
    nib_clear_error();
    *out = ix;
    return NIB_OK;
fail:
    nib_free(seen.slot);
    nib_free(base);
    nib_qckpt_index_free(ix);
    return st;
}

/* ---- element scans ----------------------------------------------------------------------------- */

static void bad_hit(nib_qckpt_bad *b, uint64_t i, const char *what) {
    if (b->count++ == 0) {
        b->first = i;
        b->what = what;
    }
}

void nib_qckpt_scan_tensor(const nib_st_tensor *t, nib_qckpt_bad *out) {
    memset(out, 0, sizeof *out);
    out->what = "";
    if (!t) return;
    const uint8_t *p = (const uint8_t *)t->data;
    const uint64_t n = t->numel;
    switch (t->dtype) {
    case NIB_DTYPE_F32:
        for (uint64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            if ((u & 0x7F800000u) == 0x7F800000u) bad_hit(out, i, (u & 0x7FFFFFu) ? "NaN" : "Inf");
        }
        break;
    case NIB_DTYPE_F64:
        for (uint64_t i = 0; i < n; i++) {
            uint64_t u;
            memcpy(&u, p + 8 * i, 8);
            if ((u & 0x7FF0000000000000ull) == 0x7FF0000000000000ull)
                bad_hit(out, i, (u & 0xFFFFFFFFFFFFFull) ? "NaN" : "Inf");
        }
        break;
    case NIB_DTYPE_F16:
    case NIB_DTYPE_BF16: {
        const uint16_t em = t->dtype == NIB_DTYPE_F16 ? 0x7C00u : 0x7F80u;
        for (uint64_t i = 0; i < n; i++) {
            uint16_t u;
            memcpy(&u, p + 2 * i, 2);
            if ((u & em) == em) bad_hit(out, i, (u & (uint16_t)(0x7FFFu & ~em)) ? "NaN" : "Inf");
        }
        break;
    }
    case NIB_DTYPE_F8_E4M3:
        for (uint64_t i = 0; i < n; i++)
            if ((p[i] & 0x7F) == 0x7F) bad_hit(out, i, "E4M3 NaN code");
        break;
    case NIB_DTYPE_F8_E5M2:
        for (uint64_t i = 0; i < n; i++)
            if ((p[i] & 0x7C) == 0x7C) bad_hit(out, i, (p[i] & 3) ? "E5M2 NaN" : "E5M2 Inf");
        break;
    case NIB_DTYPE_F8_E8M0:
        for (uint64_t i = 0; i < n; i++)
            if (p[i] == 0xFF) bad_hit(out, i, "E8M0 NaN code 0xFF");
        break;
    default: break;
    }
}

/* ---- import ---------------------------------------------------------------------------------- */

void nib_qlinear_free(nib_qlinear *q) {
    if (!q) return;
    nib_free(q->own_data);
    nib_free(q->own_scales);
    nib_free(q->own_bias);
    nib_free(q->f32);
    nib_int4_free(&q->int4);
    memset(q, 0, sizeof *q);
}

/* E4M3 block scales: no NaN code, no sign bit. */
static nib_status check_e4m3_scales(const nib_st_tensor *t) {
    const uint8_t *p = (const uint8_t *)t->data;
    uint64_t bad = 0, first = 0;
    for (uint64_t i = 0; i < t->numel; i++)
        if ((p[i] & 0x7F) == 0x7F || (p[i] & 0x80)) {
            if (!bad++) first = i;
        }
    if (!bad) return NIB_OK;
    char b[64];
    uint8_t c = p[first];
    if ((c & 0x7F) == 0x7F)
        return QERR(NIB_ERR_NUMERICS, "'%s'%s = 0x%02X is an E4M3 NaN code (%llu invalid block scales)",
                    t->name, index_str(t, first, b, sizeof b), c, (unsigned long long)bad);
    return QERR(NIB_ERR_NUMERICS, "'%s'%s = 0x%02X (%g) is a negative block scale (%llu invalid block scales)",
                t->name, index_str(t, first, b, sizeof b), c, (double)nib_e4m3_to_f32(c),
                (unsigned long long)bad);
}

static nib_status check_e8m0_scales(const nib_st_tensor *t) {
    nib_qckpt_bad bad;
    char b[64];
    nib_qckpt_scan_tensor(t, &bad);
    if (!bad.count) return NIB_OK;
    return QERR(NIB_ERR_NUMERICS, "'%s'%s = 0xFF is the E8M0 NaN code (%llu invalid block scales)", t->name,
                index_str(t, bad.first, b, sizeof b), (unsigned long long)bad.count);
}

static nib_status check_pos_scalar(const nib_st_tensor *t, float *out) {
    float v = load_float(t, 0);
    if (!(v > 0.0f) || !isfinite(v))
        return QERR(NIB_ERR_NUMERICS, "'%s' = %g is not a positive finite scale", t->name, (double)v);
    *out = v;
    return NIB_OK;
}

/* Float scale plane -> fp32 [numel], each positive and finite. dst may be NULL (check only). */
static nib_status scales_f32(const nib_st_tensor *t, float *dst) {
    for (uint64_t i = 0; i < t->numel; i++) {
        float v = load_float(t, i);
        if (!(v > 0.0f) || !isfinite(v)) {
            char b[64];
            return QERR(NIB_ERR_NUMERICS, "'%s'%s = %g is not a positive finite scale", t->name,
                        index_str(t, i, b, sizeof b), (double)v);
        }
        if (dst) dst[i] = v;
    }
    return NIB_OK;
}

/* Float scale plane -> exact fp16 bits; dst[(i % cols) * rows + i / cols] when transpose (a
 * [rows][cols] plane stored as [cols][rows]), else dst[i]. Scales must be >= 0 and finite (an
 * all-zero group may have a zero scale) and exactly representable in fp16. */
static nib_status scales_f16(const nib_st_tensor *t, uint16_t *dst, int transpose) {
    const uint64_t rows = (uint64_t)t->shape[0], cols = (uint64_t)t->shape[1];
    char b[64];
    for (uint64_t i = 0; i < t->numel; i++) {
        float v = load_float(t, i);
        if (!(v >= 0.0f) || !isfinite(v) || (v == 0.0f && signbit(v)))
            return QERR(NIB_ERR_NUMERICS, "'%s'%s = %g: INT4 scales must be finite and not negative",
                        t->name, index_str(t, i, b, sizeof b), (double)v);
        uint16_t h = nib_f32_to_f16(v);
        if (nib_f16_to_f32(h) != v)
            return QERR(NIB_ERR_UNSUPPORTED, "'%s'%s = %.9g is not exactly representable in fp16 "
                        "(nib's INT4 scales are fp16)", t->name, index_str(t, i, b, sizeof b), (double)v);
        if (transpose) dst[(i % cols) * rows + i / cols] = h;
        else dst[i] = h;
    }
    return NIB_OK;
}

static nib_status gidx_range(const nib_st_tensor *g, int64_t ng) {
    if (!g) return NIB_OK;
    for (uint64_t i = 0; i < g->numel; i++) {
        int64_t v = load_int(g, i);
        if (v < 0 || v >= ng)
            return QERR(NIB_ERR_FORMAT, "'%s'[%llu] = %lld is outside [0, %lld) (the groups of the scales)",
                        g->name, (unsigned long long)i, (long long)v, (long long)ng);
    }
    return NIB_OK;
}

static size_t nk_size(const nib_qckpt_info *in) { return (size_t)in->n * (size_t)in->k; }

static nib_status import_float(qdet *d, unsigned flags, nib_qlinear *q) {
    const nib_st_tensor *t = d->p.w;
    const size_t nk = nk_size(&d->info);
    if (flags & NIB_QCKPT_VALIDATE_ONLY) return NIB_OK;
    if (t->dtype == NIB_DTYPE_BF16 && (uintptr_t)t->data % 2 == 0) {
        q->w.data = t->data;
        q->zero_copy = 1;
    } else {
        uint16_t *h = nib_malloc(nk * 2);
        if (!h) return NIB_ERR_OUT_OF_MEMORY;
        for (size_t i = 0; i < nk; i++) {
            float v = load_float(t, i);
            h[i] = nib_f32_to_bf16(v);
            if (nib_bf16_to_f32(h[i]) != v && !isnan(v)) q->bf16_rounded = 1;
        }
        q->own_data = h;
        q->w.data = h;
    }
    if (flags & NIB_QCKPT_WANT_F32) {
        q->f32 = nib_malloc(nk * sizeof(float));
        if (!q->f32) return NIB_ERR_OUT_OF_MEMORY;
        for (size_t i = 0; i < nk; i++) q->f32[i] = load_float(t, i);
    }
    return NIB_OK;
}

static nib_status import_4bit_float(qdet *d, unsigned flags, nib_qlinear *q) {
    const qparts *p = &d->p;
    if (d->info.fmt == NIB_WFMT_NVFP4) {
        NIB_RETURN_IF_ERR(check_e4m3_scales(p->scale));
        NIB_RETURN_IF_ERR(check_pos_scalar(p->scale2, &q->w.global_scale));
    } else {
        NIB_RETURN_IF_ERR(check_e8m0_scales(p->scale));
    }
    if (flags & NIB_QCKPT_VALIDATE_ONLY) return NIB_OK;
    q->w.data = p->w->data;
    q->w.scales = p->scale->data;
    q->zero_copy = 1;
    return NIB_OK;
}

static nib_status import_fp8(qdet *d, unsigned flags, nib_qlinear *q) {
    const qparts *p = &d->p;
    NIB_RETURN_IF_ERR(scales_f32(p->scale, NULL));
    if (flags & NIB_QCKPT_VALIDATE_ONLY) return NIB_OK;
    q->w.data = p->w->data;
    q->w.fp8_per_channel = d->info.fp8_per_channel;
    q->zero_copy = 1;
    if (p->scale->dtype == NIB_DTYPE_F32 && (uintptr_t)p->scale->data % 4 == 0) {
        q->w.scales = p->scale->data;
    } else {
        float *s = nib_malloc((size_t)p->scale->numel * sizeof(float));
        if (!s) return NIB_ERR_OUT_OF_MEMORY;
        NIB_RETURN_IF_ERR(scales_f32(p->scale, s)); /* exact: BF16/F16 are fp32 values */
        q->own_scales = s;
        q->w.scales = s;
    }
    return NIB_OK;
}

/* GPTQ, AWQ and compressed-tensors pack-quantized -> canonical INT4 (formats/ importers). */
static nib_status import_int4(const char *base, qdet *d, nib_qlinear *q) {
    nib_status st = NIB_OK;
    const qparts *p = &d->p;
    const nib_qckpt_info *in = &d->info;
    const int64_t n = in->n, k = in->k, ng = k / in->block, n8 = n / 8;
    void *own_w = NULL, *own_z = NULL, *own_g = NULL;
    uint16_t *s16 = NULL;
    int32_t *qw = NULL, *qz = NULL;
    const int32_t *qweight, *qzeros, *gidx = NULL;
    const char *what = nib_qckpt_layout_name(in->layout);

    s16 = nib_malloc((size_t)(ng * n) * sizeof *s16);
    if (!s16) return NIB_ERR_OUT_OF_MEMORY;
    /* GPTQ/AWQ scales are [K/G][N] already; CT's [N][K/G] are transposed into that order */
    NIB_TRY(scales_f16(p->scale, s16, in->layout == NIB_QCKPT_CT_PACKED));
    NIB_TRY(gidx_range(p->gidx, ng));
    /* with NIB_QCKPT_VALIDATE_ONLY the importer runs too: it checks the act-order grouping */
    if (p->gidx) {
        gidx = aligned_view(p->gidx, 4, &own_g);
        if (!gidx) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
    }
    if (in->layout == NIB_QCKPT_CT_PACKED) {
        /* weight_packed [N][K/8] is GPTQ's qweight [K/8][N] transposed (both pack 8 input
         * channels per word, channel 8r+j in nibble j). Zero points [N/8][K/G] (packed along N,
         * true zeros, i.e. signed zero + 8) become GPTQ's [K/G][N/8] stored as zero - 1. */
        const int64_t k8 = k / 8;
        qw = nib_malloc((size_t)(k8 * n) * sizeof *qw);
        qz = nib_malloc((size_t)(ng * n8) * sizeof *qz);
        if (!qw || !qz) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        const nib_st_tensor *tw = p->w;
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < k8; c++) qw[c * n + r] = (int32_t)load_int(tw, (uint64_t)(r * k8 + c));
        for (int64_t gi = 0; gi < ng; gi++)
            for (int64_t c8 = 0; c8 < n8; c8++) {
                uint32_t z = p->zeros ? (uint32_t)load_int(p->zeros, (uint64_t)(c8 * ng + gi)) : 0x88888888u;
                uint32_t o = 0;
                for (int j = 0; j < 8; j++) o |= ((((z >> (4 * j)) & 0xFu) - 1u) & 0xFu) << (4 * j);
                qz[gi * n8 + c8] = (int32_t)o;
            }
        qweight = qw;
        qzeros = qz;
    } else {
        qweight = aligned_view(p->w, 4, &own_w);
        if (!qweight) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        if (d->gptq_v2) { /* v2 stores true zeros; the importer wants v1's zero - 1 */
            qz = nib_malloc((size_t)(ng * n8) * sizeof *qz);
            if (!qz) {
                st = NIB_ERR_OUT_OF_MEMORY;
                goto fail;
            }
            for (int64_t i = 0; i < ng * n8; i++) {
                uint32_t z = (uint32_t)load_int(p->zeros, (uint64_t)i), o = 0;
                for (int j = 0; j < 8; j++) o |= ((((z >> (4 * j)) & 0xFu) - 1u) & 0xFu) << (4 * j);
                qz[i] = (int32_t)o;
            }
            qzeros = qz;
        } else {
            qzeros = aligned_view(p->zeros, 4, &own_z);
            if (!qzeros) {
                st = NIB_ERR_OUT_OF_MEMORY;
                goto fail;
            }
        }
    }
    if (in->layout == NIB_QCKPT_AWQ)
        st = nib_int4_from_awq(qweight, qzeros, s16, n, k, in->block, &q->int4);
    else
        st = nib_int4_from_gptq(qweight, qzeros, s16, gidx, n, k, in->block, &q->int4);
    if (st) {
        nib_error_context(st, "'%s' (%s)", base, what);
        goto fail;
    }
    q->w.data = q->int4.packed;
    q->w.scales = q->int4.scales;
    q->w.zeros = q->int4.zeros;
    q->w.perm = q->int4.perm;
    q->w.group = q->int4.group;
fail:
    nib_free(s16);
    nib_free(qw);
    nib_free(qz);
    nib_free(own_w);
    nib_free(own_z);
    nib_free(own_g);
    return st;
}

static nib_status import_bias(const qparts *p, nib_qlinear *q) {
    if (!p->bias) return NIB_OK;
    float *b = nib_malloc((size_t)p->bias->numel * sizeof(float));
    if (!b) return NIB_ERR_OUT_OF_MEMORY;
    for (uint64_t i = 0; i < p->bias->numel; i++) b[i] = load_float(p->bias, i);
    q->own_bias = b;
    q->w.bias = b;
    return NIB_OK;
}

nib_status nib_qckpt_get_linear_ex(const nib_st_file *f, const char *base,
                                   const nib_qckpt_opts *opts, nib_qlinear *out) {
    nib_status st = NIB_OK;
    nib_qckpt_config own;
    const nib_qckpt_config *cfg;
    unsigned flags = opts ? opts->flags : 0;
    qdet d;
    if (!out) return QERR(NIB_ERR_INVALID_ARG, "qckpt get_linear: NULL output");
    memset(out, 0, sizeof *out);
    if (!f || !base) return QERR(NIB_ERR_INVALID_ARG, "qckpt get_linear: NULL file or name");
    if (opts && opts->config) {
        cfg = opts->config;
    } else {
        NIB_RETURN_IF_ERR(nib_qckpt_config_from_file(f, &own));
        cfg = &own;
    }
    NIB_TRY(detect(f, base, cfg, &d));
    out->info = d.info;
    out->w.fmt = d.info.fmt;
    out->w.n = d.info.n;
    out->w.k = d.info.k;
    if ((flags & NIB_QCKPT_CHECK_ELEMENTS) && d.p.w) {
        nib_qckpt_bad bad;
        nib_qckpt_scan_tensor(d.p.w, &bad);
        if (bad.count) {
            char b[64];
            st = QERR(NIB_ERR_NUMERICS, "'%s'%s is %s (%llu invalid elements)", d.p.w->name,
                      index_str(d.p.w, bad.first, b, sizeof b), bad.what, (unsigned long long)bad.count);
            goto fail;
        }
    }
    switch (d.info.layout) {
    case NIB_QCKPT_FLOAT: NIB_TRY(import_float(&d, flags, out)); break;
    case NIB_QCKPT_NVFP4_MODELOPT:
    case NIB_QCKPT_MXFP4_NIB: NIB_TRY(import_4bit_float(&d, flags, out)); break;
    case NIB_QCKPT_FP8: NIB_TRY(import_fp8(&d, flags, out)); break;
    case NIB_QCKPT_GPTQ:
    case NIB_QCKPT_AWQ:
    case NIB_QCKPT_CT_PACKED: NIB_TRY(import_int4(base, &d, out)); break;
    default: st = QERR(NIB_ERR_INTERNAL, "'%s': unhandled layout %d", base, (int)d.info.layout); goto fail;
    }
    if (d.p.in_scale) {
        NIB_TRY(check_pos_scalar(d.p.in_scale, &out->input_scale));
        out->has_input_scale = 1;
    }
    if (d.p.bias && (flags & NIB_QCKPT_CHECK_ELEMENTS)) {
        nib_qckpt_bad bad;
        nib_qckpt_scan_tensor(d.p.bias, &bad);
        if (bad.count) {
            st = QERR(NIB_ERR_NUMERICS, "'%s'[%llu] is %s (%llu invalid elements)", d.p.bias->name,
                      (unsigned long long)bad.first, bad.what, (unsigned long long)bad.count);
            goto fail;
        }
    }
    if (flags & NIB_QCKPT_VALIDATE_ONLY) {
        nib_qlinear_free(out);
        return NIB_OK;
    }
    NIB_TRY(import_bias(&d.p, out));
    if (d.info.layout != NIB_QCKPT_FLOAT) {
        NIB_TRY(nib_wsrc_validate(&out->w, base));
        if (flags & NIB_QCKPT_WANT_F32) {
            out->f32 = nib_malloc(nk_size(&d.info) * sizeof(float));
            if (!out->f32) {
                st = NIB_ERR_OUT_OF_MEMORY;
                goto fail;
            }
            NIB_TRY(nib_wsrc_dequantize(&out->w, out->f32));
        }
    }
    return NIB_OK;
fail:
    nib_qlinear_free(out);
    return st;
}

nib_status nib_qckpt_get_linear(const nib_st_file *f, const char *base_name, nib_qlinear *out) {
    return nib_qckpt_get_linear_ex(f, base_name, NULL, out);
}

/* ---- fusion ------------------------------------------------------------------------------- */

nib_status nib_qlinear_concat_rows(const nib_qlinear *parts, size_t n_parts, const char *name,
                                   nib_qlinear *out) {
    nib_status st = NIB_OK;
    if (!out) return QERR(NIB_ERR_INVALID_ARG, "concat: NULL output");
    memset(out, 0, sizeof *out);
    if (!name) name = "fused weight";
    if (!parts || n_parts == 0) return QERR(NIB_ERR_INVALID_ARG, "%s: no parts to stack", name);
    const nib_wsrc *w0 = &parts[0].w;
    uint64_t nsum = 0;
    int any_bias = 0, any_zeros = 0;
    for (size_t i = 0; i < n_parts; i++) {
        const nib_wsrc *w = &parts[i].w;
        NIB_RETURN_IF_ERR(nib_wsrc_validate(w, name));
        if (w->fmt != w0->fmt)
            return QERR(NIB_ERR_UNSUPPORTED, "%s: part %zu is %s, part 0 is %s", name, i, nib_wfmt_name(w->fmt),
                        nib_wfmt_name(w0->fmt));
        if (w->k != w0->k)
            return QERR(NIB_ERR_SHAPE, "%s: part %zu has K = %lld, part 0 has K = %lld", name, i, (long long)w->k,
                        (long long)w0->k);
        if (w->fmt == NIB_WFMT_NVFP4 && w->global_scale != w0->global_scale)
            return QERR(NIB_ERR_UNSUPPORTED, "%s: part %zu has NVFP4 global scale %.9g, part 0 has %.9g: stacking "
                        "them needs one global (quantize fused layers with a shared weight_scale_2)",
                        name, i, (double)w->global_scale, (double)w0->global_scale);
        if (w->fmt == NIB_WFMT_INT4) {
            if (w->group != w0->group)
                return QERR(NIB_ERR_UNSUPPORTED, "%s: part %zu has INT4 group %d, part 0 has %d", name, i, w->group,
                            w0->group);
            if (!w->perm != !w0->perm ||
                (w->perm && memcmp(w->perm, w0->perm, (size_t)w->k * sizeof *w->perm)))
                return QERR(NIB_ERR_UNSUPPORTED, "%s: part %zu has a different act-order permutation than part 0",
                            name, i);
            any_zeros |= w->zeros != NULL;
        }
        any_bias |= w->bias != NULL;
        nsum += (uint64_t)w->n; /* each <= INT32_MAX / 2 (validated): no overflow */
        if (nsum > INT32_MAX / 2) return QERR(NIB_ERR_SHAPE, "%s: stacked N is too large", name);
    }
    const int64_t n = (int64_t)nsum, k = w0->k;
    out->info = parts[0].info;
    out->info.n = n;
    out->info.n_parts = 0;
    out->info.bytes = out->info.weight_bytes = 0;
    out->w = *w0;
    out->w.n = n;
    out->w.bias = NULL;
    if (w0->fmt == NIB_WFMT_INT4) {
        NIB_TRY(nib_int4_alloc(&out->int4, n, k, w0->group, any_zeros, w0->perm != NULL));
        if (w0->perm) memcpy(out->int4.perm, w0->perm, (size_t)k * sizeof *w0->perm);
        const size_t ng = (size_t)(k / w0->group);
        size_t r0 = 0;
        for (size_t i = 0; i < n_parts; i++) {
            const nib_wsrc *w = &parts[i].w;
            const size_t rows = (size_t)w->n;
            memcpy(out->int4.packed + r0 * (size_t)k / 2, w->data, rows * (size_t)k / 2);
            memcpy(out->int4.scales + r0 * ng, w->scales, rows * ng * 2);
            if (any_zeros) {
                if (w->zeros) memcpy(out->int4.zeros + r0 * ng, w->zeros, rows * ng);
                else memset(out->int4.zeros + r0 * ng, 8, rows * ng);
            }
            r0 += rows;
        }
        out->w.data = out->int4.packed;
        out->w.scales = out->int4.scales;
        out->w.zeros = out->int4.zeros;
        out->w.perm = out->int4.perm;
    } else {
        size_t drow = w0->fmt == NIB_WFMT_BF16 ? 2 * (size_t)k : w0->fmt == NIB_WFMT_FP8 ? (size_t)k : (size_t)k / 2;
        size_t srow = w0->fmt == NIB_WFMT_NVFP4 ? (size_t)k / 16 : w0->fmt == NIB_WFMT_MXFP4 ? (size_t)k / 32
                    : w0->fmt == NIB_WFMT_FP8 ? sizeof(float) : 0;
        uint8_t *d = nib_malloc(drow * (size_t)n), *sc = srow ? nib_malloc(srow * (size_t)n) : NULL;
        out->own_data = d;
        out->own_scales = sc;
        if (!d || (srow && !sc)) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        size_t r0 = 0;
        for (size_t i = 0; i < n_parts; i++) {
            const nib_wsrc *w = &parts[i].w;
            const size_t rows = (size_t)w->n;
            memcpy(d + r0 * drow, w->data, rows * drow);
            if (w0->fmt == NIB_WFMT_FP8) {
                const float *s = (const float *)w->scales;
                for (size_t r = 0; r < rows; r++)
                    memcpy(sc + (r0 + r) * 4, &s[w->fp8_per_channel ? r : 0], 4);
            } else if (srow) {
                memcpy(sc + r0 * srow, w->scales, rows * srow);
            }
            r0 += rows;
        }
        out->w.data = d;
        out->w.scales = sc;
        if (w0->fmt == NIB_WFMT_FP8) out->w.fp8_per_channel = out->info.fp8_per_channel = 1;
    }
    if (any_bias) {
        float *b = nib_calloc((size_t)n, sizeof *b);
        if (!b) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        size_t r0 = 0;
        for (size_t i = 0; i < n_parts; i++) {
            if (parts[i].w.bias) memcpy(b + r0, parts[i].w.bias, (size_t)parts[i].w.n * sizeof *b);
            r0 += (size_t)parts[i].w.n;
        }
        out->own_bias = b;
        out->w.bias = b;
    }
    for (size_t i = 0; i < n_parts; i++)
        if (parts[i].has_input_scale && (!out->has_input_scale || parts[i].input_scale > out->input_scale)) {
            out->has_input_scale = 1;
            out->input_scale = parts[i].input_scale;
        }
    out->info.weight_bytes = nib_wsrc_bytes(&out->w);
    out->info.bytes = out->info.weight_bytes;
    out->info.bits_per_weight = 8.0 * (double)out->info.weight_bytes / ((double)n * (double)k);
    NIB_TRY(nib_wsrc_validate(&out->w, name));
    return NIB_OK;
fail:
    nib_qlinear_free(out);
    return st;
}

/* ---- writing ------------------------------------------------------------------------------- */

const char *nib_qckpt_linear_unwritable(nib_wfmt fmt, int64_t n, int64_t k, int group) {
    if (n < 1 || k < 1) return "the weight is empty";
    if (n > INT32_MAX / 2 || k > INT32_MAX / 2) return "a dimension is larger than nib's GEMM supports";
    switch (fmt) {
    case NIB_WFMT_BF16: return NULL;
    case NIB_WFMT_FP8: return k % 16 ? "K is not a multiple of 16 (nib's FP8 GEMM)" : NULL;
    case NIB_WFMT_NVFP4: return k % 16 ? "K is not a multiple of the NVFP4 block of 16" : NULL;
    case NIB_WFMT_MXFP4: return k % 32 ? "K is not a multiple of the MXFP4 block of 32" : NULL;
    case NIB_WFMT_INT4:
        if (!int4_group_ok(group)) return "the INT4 group size is not 32, 64 or 128";
        if (k % group) return "K is not a multiple of the INT4 group size";
        if (n % 8) return "N is not a multiple of 8 (GPTQ packs 8 zero points per int32)";
        return NULL;
    default: return "unknown weight format";
    }
}

uint64_t nib_qckpt_linear_file_bytes(const nib_wsrc *s) {
    if (!s || nib_qckpt_linear_unwritable(s->fmt, s->n, s->k, s->group)) return 0;
    const uint64_t n = (uint64_t)s->n, k = (uint64_t)s->k, nk = n * k;
    switch (s->fmt) {
    case NIB_WFMT_BF16: return 2 * nk;
    case NIB_WFMT_FP8: return nk + 4 * (s->fp8_per_channel ? n : 1);
    case NIB_WFMT_NVFP4: return nk / 2 + nk / 16 + 4;
    case NIB_WFMT_MXFP4: return nk / 2 + nk / 32;
    case NIB_WFMT_INT4: {
        uint64_t ng = k / (uint64_t)s->group;
        return 4 * (k / 8) * n + 4 * ng * (n / 8) + 2 * ng * n + 4 * k;
    }
    default: return 0;
    }
}

typedef struct wpart {
    const char *suffix;
    nib_dtype dt;
    int32_t ndim;
    int64_t shape[2];
} wpart;

/* The tensors of the written layout, in file order. Returns the count (<= 4). */
static int written_parts(const nib_wsrc *s, wpart out[4]) {
    const int64_t n = s->n, k = s->k;
    switch (s->fmt) {
    case NIB_WFMT_BF16:
        out[0] = (wpart){"weight", NIB_DTYPE_BF16, 2, {n, k}};
        return 1;
    case NIB_WFMT_FP8:
        out[0] = (wpart){"weight", NIB_DTYPE_F8_E4M3, 2, {n, k}};
        out[1] = s->fp8_per_channel ? (wpart){"weight_scale", NIB_DTYPE_F32, 1, {n, 0}}
                                    : (wpart){"weight_scale", NIB_DTYPE_F32, 0, {0, 0}};
        return 2;
    case NIB_WFMT_NVFP4:
        out[0] = (wpart){"weight", NIB_DTYPE_U8, 2, {n, k / 2}};
        out[1] = (wpart){"weight_scale", NIB_DTYPE_F8_E4M3, 2, {n, k / 16}};
        out[2] = (wpart){"weight_scale_2", NIB_DTYPE_F32, 0, {0, 0}};
        return 3;
    case NIB_WFMT_MXFP4:
        out[0] = (wpart){"weight", NIB_DTYPE_U8, 2, {n, k / 2}};
        out[1] = (wpart){"weight_scale", NIB_DTYPE_F8_E8M0, 2, {n, k / 32}};
        return 2;
    case NIB_WFMT_INT4:
        out[0] = (wpart){"qweight", NIB_DTYPE_I32, 2, {k / 8, n}};
        out[1] = (wpart){"qzeros", NIB_DTYPE_I32, 2, {k / s->group, n / 8}};
        out[2] = (wpart){"scales", NIB_DTYPE_F16, 2, {k / s->group, n}};
        out[3] = (wpart){"g_idx", NIB_DTYPE_I32, 1, {k, 0}};
        return 4;
    default: return 0;
    }
}

nib_status nib_qckpt_declare_linear(nib_st_writer *w, const char *base, const nib_wsrc *src) {
    if (!w || !base || !src) return QERR(NIB_ERR_INVALID_ARG, "qckpt declare: NULL argument");
    const char *why = nib_qckpt_linear_unwritable(src->fmt, src->n, src->k, src->group);
    if (why)
        return QERR(NIB_ERR_SHAPE, "'%s' [%lld, %lld] cannot be written as %s: %s", base,
                    (long long)src->n, (long long)src->k, nib_wfmt_name(src->fmt), why);
    wpart parts[4];
    int np = written_parts(src, parts);
    for (int i = 0; i < np; i++) {
        char *name = join(base, parts[i].suffix);
        if (!name) return NIB_ERR_OUT_OF_MEMORY;
        nib_status st = nib_st_writer_declare(w, name, parts[i].dt, parts[i].ndim, parts[i].shape);
        nib_free(name);
        if (st) return st;
    }
    return NIB_OK;
}

nib_status nib_qckpt_write_linear(nib_st_writer *w, const char *base, const nib_wsrc *s) {
    nib_status st = NIB_OK;
    int32_t *qw = NULL, *qz = NULL, *gi = NULL;
    uint16_t *sc = NULL;
    if (!w || !base || !s) return QERR(NIB_ERR_INVALID_ARG, "qckpt write: NULL argument");
    const char *why = nib_qckpt_linear_unwritable(s->fmt, s->n, s->k, s->group);
    if (why)
        return QERR(NIB_ERR_SHAPE, "'%s' [%lld, %lld] cannot be written as %s: %s", base,
                    (long long)s->n, (long long)s->k, nib_wfmt_name(s->fmt), why);
    NIB_RETURN_IF_ERR(nib_wsrc_validate(s, base));
    const size_t n = (size_t)s->n, k = (size_t)s->k, nk = n * k;
    switch (s->fmt) {
    case NIB_WFMT_BF16: NIB_TRY(nib_st_writer_write(w, s->data, 2 * nk)); break;
    case NIB_WFMT_FP8:
        NIB_TRY(nib_st_writer_write(w, s->data, nk));
        NIB_TRY(nib_st_writer_write(w, s->scales, 4 * (s->fp8_per_channel ? n : 1)));
        break;
    case NIB_WFMT_NVFP4:
        NIB_TRY(nib_st_writer_write(w, s->data, nk / 2));
        NIB_TRY(nib_st_writer_write(w, s->scales, nk / 16));
        NIB_TRY(nib_st_writer_write(w, &s->global_scale, 4));
        break;
    case NIB_WFMT_MXFP4:
        NIB_TRY(nib_st_writer_write(w, s->data, nk / 2));
        NIB_TRY(nib_st_writer_write(w, s->scales, nk / 32));
        break;
    case NIB_WFMT_INT4: {
        const size_t ng = k / (size_t)s->group;
        nib_int4_weight iw = {.n = s->n,
                              .k = s->k,
                              .group = s->group,
                              .asym = s->zeros != NULL,
                              .packed = (uint8_t *)s->data,
                              .scales = (uint16_t *)s->scales,
                              .zeros = (uint8_t *)s->zeros,
                              .perm = (int32_t *)s->perm};
        qw = nib_malloc(k / 8 * n * 4);
        qz = nib_malloc(ng * (n / 8) * 4);
        sc = nib_malloc(ng * n * 2);
        gi = nib_malloc(k * 4);
        if (!qw || !qz || !sc || !gi) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        st = nib_int4_to_gptq(&iw, qw, qz, sc, gi);
        if (st) {
            nib_error_context(st, "'%s'", base);
            goto fail;
        }
        NIB_TRY(nib_st_writer_write(w, qw, k / 8 * n * 4));
        NIB_TRY(nib_st_writer_write(w, qz, ng * (n / 8) * 4));
        NIB_TRY(nib_st_writer_write(w, sc, ng * n * 2));
        NIB_TRY(nib_st_writer_write(w, gi, k * 4));
        break;
    }
    default: st = QERR(NIB_ERR_INVALID_ARG, "'%s': unknown weight format", base); break;
    }
fail:
    nib_free(qw);
    nib_free(qz);
    nib_free(sc);
    nib_free(gi);
    return st;
}

/* ---- config JSON ------------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    nib_status st;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->st) return;
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + n + 1) ncap *= 2;
        char *np = nib_realloc(b->p, ncap);
        if (!np) {
            b->st = NIB_ERR_OUT_OF_MEMORY;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_printf(sbuf *b, const char *fmt, ...) NIB_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        b->st = b->st ? b->st : QERR(NIB_ERR_INTERNAL, "config json: field too long");
        return;
    }
    sb_put(b, tmp, (size_t)n);
}

static void sb_jstr(sbuf *b, const char *s) {
    size_t n = strlen(s), need = nib_json_escape(NULL, 0, s, n);
    char *e = nib_malloc(need + 1);
    if (!e) {
        b->st = NIB_ERR_OUT_OF_MEMORY;
        return;
    }
    nib_json_escape(e, need + 1, s, n);
    sb_put(b, "\"", 1);
    sb_put(b, e, need);
    sb_put(b, "\"", 1);
    nib_free(e);
}

nib_status nib_qckpt_config_json(const nib_qckpt_wconfig *c, char **out) {
    sbuf b = {0};
    if (!c || !out) return QERR(NIB_ERR_INVALID_ARG, "config json: NULL argument");
    *out = NULL;
    if (c->mixed) {
        if (c->n_layers && !c->layers) return QERR(NIB_ERR_INVALID_ARG, "config json: NULL layer list");
        sb_printf(&b, "{\"quant_method\": \"modelopt\", \"quant_algo\": \"MIXED_PRECISION\", "
                      "\"kv_cache_quant_algo\": null, \"quantized_layers\": {");
        for (size_t i = 0; i < c->n_layers; i++) {
            const nib_qckpt_wlayer *l = &c->layers[i];
            if (!l->base || (l->fmt != NIB_WFMT_FP8 && l->fmt != NIB_WFMT_NVFP4)) {
                nib_free(b.p);
                return QERR(NIB_ERR_INVALID_ARG, "config json: mixed-precision layer %zu ('%s') is %s; only fp8 "
                            "and nvfp4 layers have a ModelOpt mixed-precision name", i, l->base ? l->base : "(null)",
                            nib_wfmt_name(l->fmt));
            }
            if (i) sb_put(&b, ", ", 2);
            sb_jstr(&b, l->base);
            if (l->fmt == NIB_WFMT_NVFP4)
                sb_printf(&b, ": {\"quant_algo\": \"W4A16_NVFP4\", \"group_size\": 16}");
            else
                sb_printf(&b, ": {\"quant_algo\": \"%s\"}", l->fp8_per_channel ? "FP8_PER_CHANNEL_PER_TOKEN" : "FP8");
        }
        sb_put(&b, "}", 1);
    } else {
        switch (c->fmt) {
        case NIB_WFMT_NVFP4:
            sb_printf(&b, "{\"quant_method\": \"modelopt\", \"quant_algo\": \"W4A16_NVFP4\", "
                          "\"group_size\": 16, \"kv_cache_quant_algo\": null");
            break;
        case NIB_WFMT_FP8:
            sb_printf(&b, "{\"quant_method\": \"modelopt\", \"quant_algo\": \"%s\", \"kv_cache_quant_algo\": null",
                      c->fp8_per_channel ? "FP8_PER_CHANNEL_PER_TOKEN" : "FP8");
            break;
        case NIB_WFMT_MXFP4:
            if ((unsigned)c->mxfp4_rule >= NIB_MXFP4_RULE_COUNT)
                return QERR(NIB_ERR_INVALID_ARG, "config json: bad MXFP4 rule %d", (int)c->mxfp4_rule);
            sb_printf(&b, "{\"quant_method\": \"nib\", \"quant_algo\": \"MXFP4\", \"group_size\": 32, "
                          "\"scale_rule\": \"%s\"", nib_mxfp4_rule_name(c->mxfp4_rule));
            break;
        case NIB_WFMT_INT4:
            if (!int4_group_ok(c->group))
                return QERR(NIB_ERR_INVALID_ARG, "config json: INT4 group size %d", c->group);
            sb_printf(&b, "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": %d, \"desc_act\": false, "
                          "\"sym\": %s, \"checkpoint_format\": \"gptq\"", c->group, c->asym ? "false" : "true");
            break;
        default: return QERR(NIB_ERR_INVALID_ARG, "config json: format %s is not a quantized format",
                             nib_wfmt_name(c->fmt));
        }
    }
    sb_printf(&b, ", \"exclude_modules\": [");
    for (size_t i = 0; i < c->n_exclude; i++) {
        if (i) sb_put(&b, ", ", 2);
        sb_jstr(&b, c->exclude[i]);
    }
    sb_printf(&b, "], \"producer\": {\"name\": \"nib\", \"version\": \"%s\"}}", nib_version());
    if (b.st) {
        nib_free(b.p);
        return b.st;
    }
    *out = b.p;
    return NIB_OK;
}

nib_status nib_qckpt_set_metadata(nib_st_writer *w, const nib_qckpt_wconfig *c) {
    char *json = NULL;
    NIB_RETURN_IF_ERR(nib_qckpt_config_json(c, &json));
    nib_status st = nib_st_writer_set_metadata(w, "quantization_config", json);
    nib_free(json);
    return st;
}

/* ---- default rule ------------------------------------------------------------------------------ */

int nib_qckpt_default_rule(const char *name) {
    static const char *const k_proj[] = {"q_proj",   "k_proj",  "v_proj",    "o_proj", "out_proj",
                                         "gate_proj", "up_proj", "down_proj", "fc1",    "fc2"};
    if (!name) return 0;
    size_t len = strlen(name);
    static const char suffix[] = ".weight";
    const size_t sl = sizeof suffix - 1;
    if (len <= sl || memcmp(name + len - sl, suffix, sl)) return 0;
    /* the component before ".weight" */
    size_t end = len - sl, start = end;
    while (start > 0 && name[start - 1] != '.') start--;
    int proj = 0;
    for (size_t i = 0; i < NIB_ARRAY_LEN(k_proj) && !proj; i++)
        proj = strlen(k_proj[i]) == end - start && !memcmp(name + start, k_proj[i], end - start);
    if (!proj) return 0;
    /* an earlier "layers" component followed by an all-digit component */
    size_t i = 0;
    while (i < start) {
        size_t j = i;
        while (j < start && name[j] != '.') j++;
        if (j - i == 6 && !memcmp(name + i, "layers", 6) && j < start) {
            size_t a = j + 1, e = a;
            while (e < start && name[e] != '.') e++;
            int digits = e > a;
            for (size_t x = a; x < e; x++) digits &= name[x] >= '0' && name[x] <= '9';
            if (digits && e < start) return 1;
        }
        i = j + 1;
    }
    return 0;
}
