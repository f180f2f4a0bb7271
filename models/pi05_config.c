/* pi05_config.c — Pi0.5 dimensions from a checkpoint, precision presets, named configs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "io/json.h"
#include "io/qcheckpoint.h"
#include "models/pi05.h"
#include "models/pi05_keys.h"

void nib_pi05_config_full(nib_pi05_config *c) {
    memset(c, 0, sizeof *c);
    c->v_width = 1152, c->v_layers = 27, c->v_heads = 16, c->v_head_dim = 72, c->v_mlp = 4304;
    c->v_patch = 14, c->v_image = 224, c->v_channels = 3, c->v_tokens = 256;
    c->width = 2048, c->layers = 18, c->heads = 8, c->kv_heads = 1, c->head_dim = 256, c->mlp = 16384;
    c->vocab = 257152;
    c->e_width = 1024, c->e_layers = 18, c->e_heads = 8, c->e_mlp = 4096;
    c->action_dim = 32;
    c->max_cameras = 3, c->max_text = 200, c->max_horizon = 50, c->steps = 10;
}

/* Small enough for the CPU reference in CI, shaped so every GPU kernel constraint still holds
 * (head_dim 256 for Gemma attention, multiples of 16 along K, SigLIP head_dim a multiple of 8). */
void nib_pi05_config_tiny(nib_pi05_config *c) {
    memset(c, 0, sizeof *c);
    c->v_width = 96, c->v_layers = 2, c->v_heads = 4, c->v_head_dim = 24, c->v_mlp = 208;
    c->v_patch = 14, c->v_image = 56, c->v_channels = 3, c->v_tokens = 16;
    c->width = 256, c->layers = 2, c->heads = 2, c->kv_heads = 1, c->head_dim = 256, c->mlp = 512;
    c->vocab = 1000;
    c->e_width = 128, c->e_layers = 2, c->e_heads = 2, c->e_mlp = 256;
    c->action_dim = 32;
    c->max_cameras = 3, c->max_text = 24, c->max_horizon = 16, c->steps = 10;
}

nib_status nib_pi05_preset(const char *name, nib_pi05_precision *p) {
    memset(p, 0, sizeof *p);
    p->kv = NIB_KV_BF16;
    if (!strcmp(name, "bf16")) {
        p->backend = NIB_BE_CUDA;
        p->vision = p->prefix = p->expert = NIB_WFMT_BF16;
    } else if (!strcmp(name, "fast")) {
        p->backend = NIB_BE_CUDA;
        p->vision = p->prefix = NIB_WFMT_FP8;
        p->expert = NIB_WFMT_NVFP4;
    } else if (!strcmp(name, "ref") || !strcmp(name, "fp32")) {
        p->backend = NIB_BE_REF;
        p->vision = p->prefix = p->expert = NIB_WFMT_BF16;
    } else {
        return NIB_ERR(NIB_ERR_INVALID_ARG, "unknown preset '%s' (bf16, fast, ref)", name);
    }
    return NIB_OK;
}

nib_status nib_pi05_precision_override(nib_pi05_precision *p, const char *spec) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec ? spec : "");
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (!eq) return NIB_ERR(NIB_ERR_INVALID_ARG, "precision override '%s' is not component=format", tok);
        *eq = '\0';
        const char *comp = tok, *val = eq + 1;
        if (!strcmp(comp, "backend")) { /* ref: the fp32 reference with these weight formats */
            if (!strcmp(val, "ref")) p->backend = NIB_BE_REF;
            else if (!strcmp(val, "cuda")) p->backend = NIB_BE_CUDA;
            else return NIB_ERR(NIB_ERR_INVALID_ARG, "backend=%s: ref or cuda", val);
            continue;
        }
        if (!strcmp(comp, "kv")) {
            if (!strcmp(val, "bf16")) p->kv = NIB_KV_BF16;
            else if (!strcmp(val, "fp8")) p->kv = NIB_KV_FP8;
            else if (!strcmp(val, "nvfp4")) p->kv = NIB_KV_NVFP4;
            else return NIB_ERR(NIB_ERR_INVALID_ARG, "kv=%s: the KV cache is bf16, fp8 or nvfp4", val);
            continue;
        }
        nib_wfmt f = nib_wfmt_from_name(val);
        if (f == NIB_WFMT_COUNT)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "%s=%s: formats are bf16, fp8, nvfp4, mxfp4, int4", comp, val);
        if (!strcmp(comp, "vision")) p->vision = f;
        else if (!strcmp(comp, "prefix")) p->prefix = f;
        else if (!strcmp(comp, "expert")) p->expert = f;
        else return NIB_ERR(NIB_ERR_INVALID_ARG, "unknown component '%s' (vision, prefix, expert, kv)", comp);
    }
    return NIB_OK;
}

const char *nib_pi05_precision_str(const nib_pi05_precision *p, char *buf, size_t n) {
    const int plain = p->vision == NIB_WFMT_BF16 && p->prefix == NIB_WFMT_BF16 && p->expert == NIB_WFMT_BF16 &&
                      p->kv == NIB_KV_BF16;
    if (p->backend == NIB_BE_REF && plain) snprintf(buf, n, "reference fp32");
    else snprintf(buf, n, "%svision=%s prefix=%s expert=%s kv=%s", p->backend == NIB_BE_REF ? "reference fp32 with " : "",
                  nib_wfmt_name(p->vision), nib_wfmt_name(p->prefix), nib_wfmt_name(p->expert), nib_kv_dtype_name(p->kv));
    return buf;
}

/* ---- key names ----------------------------------------------------------------------------- */
const nib_st_tensor *nib_pi05_find(const nib_st_file *f, const char *name) {
    const nib_st_tensor *t = nib_st_find(f, name);
    if (t) return t;
    char buf[512];
    snprintf(buf, sizeof buf, "model.%s", name);
    return nib_st_find(f, buf);
}

nib_status nib_pi05_need(const nib_st_file *f, const char *name, int ndim, const int64_t *shape,
                         const nib_st_tensor **out) {
    const nib_st_tensor *t = nib_pi05_find(f, name);
    if (!t) return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: tensor '%s' is missing", name);
    if (ndim >= 0) {
        int ok = t->ndim == ndim;
        for (int i = 0; ok && i < ndim; i++) ok = shape[i] < 0 || t->shape[i] == shape[i];
        if (!ok) {
            char want[128] = "", got[128] = "";
            size_t o = 0;
            for (int i = 0; i < ndim; i++) o += (size_t)snprintf(want + o, sizeof want - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
            o = 0;
            for (int i = 0; i < t->ndim; i++) o += (size_t)snprintf(got + o, sizeof got - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
            return NIB_ERR(NIB_ERR_SHAPE, "checkpoint: tensor '%s' has shape [%s], expected [%s]", name, got, want);
        }
    }
    if (t->dtype != NIB_DTYPE_BF16 && t->dtype != NIB_DTYPE_F32 && t->dtype != NIB_DTYPE_F16)
        return NIB_ERR(NIB_ERR_FORMAT, "checkpoint: tensor '%s' has dtype %s (expected BF16, F16 or F32)", name,
                       nib_dtype_name(t->dtype));
    *out = t;
    return NIB_OK;
}

nib_status nib_pi05_linear(const nib_st_file *f, const char *base, nib_pi05_lin *out) {
    memset(out, 0, sizeof *out);
    for (int pass = 0; pass < 2; pass++) {
        char full[256];
        int len = snprintf(full, sizeof full, "%s%s", pass ? "model." : "", base);
        if (len < 0 || (size_t)len >= sizeof full) return NIB_ERR(NIB_ERR_INVALID_ARG, "checkpoint: name '%s' too long", base);
        nib_qckpt_info info;
        nib_status st = nib_qckpt_detect(f, full, NULL, &info);
        if (st == NIB_ERR_NOT_FOUND) {
            nib_clear_error();
            continue;
        }
        if (st) return nib_error_context(st, "checkpoint: linear '%s'", base);
        out->n = info.n, out->k = info.k;
        out->prequant = info.layout != NIB_QCKPT_FLOAT;
        out->fmt = out->prequant ? info.fmt : NIB_WFMT_BF16;
        memcpy(out->base, full, (size_t)len + 1);
        return NIB_OK;
    }
    return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: tensor '%s.weight' is missing (nor a pre-quantized '%s.qweight' or "
                   "'.weight_packed')", base, base);
}

/* the first dimension (N) of a linear, float or pre-quantized; -1 when absent. A set the
 * importer rejects falls back to the 2-D ".weight" shape: the load reports the problem. */
static int64_t lin_n(const nib_st_file *f, const char *base) {
    nib_pi05_lin l;
    if (!nib_pi05_linear(f, base, &l)) return l.n;
    nib_clear_error();
    char name[300];
    snprintf(name, sizeof name, "%s.weight", base);
    const nib_st_tensor *t = nib_pi05_find(f, name);
    return t && t->ndim == 2 ? t->shape[0] : -1;
}

/* a model dimension from a header or the metadata: 0 .. 2^24 */
static nib_status dim_ok(int64_t v, const char *what) {
    if (v < 0 || v > (1 << 24)) return NIB_ERR(NIB_ERR_SHAPE, "checkpoint: %s = %lld is out of range (0 .. 2^24)", what, (long long)v);
    return NIB_OK;
}

static int count_linears(const nib_st_file *f, const char *fmt) {
    char name[512];
    int n = 0;
    for (;;) {
        snprintf(name, sizeof name, fmt, n);
        if (lin_n(f, name) < 0) return n;
        n++;
    }
}

static int count_layers(const nib_st_file *f, const char *fmt) {
    char name[512];
    int n = 0;
    for (;;) {
        snprintf(name, sizeof name, fmt, n);
        if (!nib_pi05_find(f, name)) return n;
        n++;
    }
}

nib_status nib_pi05_config_parse_json(const char *json, size_t len, nib_pi05_config *c) {
    nib_json_doc *doc = NULL;
    NIB_RETURN_IF_ERR(nib_json_parse(json, len, 0, &doc));
    nib_status st = NIB_OK;
    const nib_json_value *root = nib_json_root(doc);
    if (nib_json_type_of(root) != NIB_JSON_OBJECT) {
        st = NIB_ERR(NIB_ERR_FORMAT, "pi05 config: not a JSON object");
        goto done;
    }
    static const struct {
        const char *key;
        size_t off;
    } fields[] = {
#define F(x) {#x, offsetof(nib_pi05_config, x)}
        F(v_width), F(v_layers), F(v_heads), F(v_head_dim), F(v_mlp), F(v_patch), F(v_image), F(v_channels),
        F(v_tokens), F(width), F(layers), F(heads), F(kv_heads), F(head_dim), F(mlp), F(e_width), F(e_layers),
        F(e_heads), F(e_mlp), F(action_dim), F(max_cameras), F(max_text), F(max_horizon), F(steps),
#undef F
    };
    for (size_t i = 0; i < nib_json_count(root); i++) {
        const nib_json_member *mb = nib_json_member_at(root, i);
        int64_t v;
        if (mb->key_len == 5 && !memcmp(mb->key, "vocab", 5)) {
            if ((st = nib_json_int64(mb->value, &v)) != NIB_OK) goto done;
            if (v < 1 || v > (1 << 24)) {
                st = NIB_ERR(NIB_ERR_FORMAT, "pi05 config: vocab %lld out of range", (long long)v);
                goto done;
            }
            c->vocab = v;
            continue;
        }
        size_t f;
        for (f = 0; f < NIB_ARRAY_LEN(fields); f++)
            if (strlen(fields[f].key) == mb->key_len && !memcmp(fields[f].key, mb->key, mb->key_len)) break;
        if (f == NIB_ARRAY_LEN(fields)) continue; /* unknown keys are ignored (forward compatible) */
        if ((st = nib_json_int64(mb->value, &v)) != NIB_OK) {
            nib_error_context(st, "pi05 config key '%s'", fields[f].key);
            goto done;
        }
        if (v < 0 || v > 1000000) {
            st = NIB_ERR(NIB_ERR_FORMAT, "pi05 config: %s = %lld out of range", fields[f].key, (long long)v);
            goto done;
        }
        *(int32_t *)((char *)c + fields[f].off) = (int32_t)v;
    }
done:
    nib_json_free(doc);
    return st;
}

nib_status nib_pi05_config_from_file(const nib_st_file *f, nib_pi05_config *c) {
    const nib_st_tensor *t;
    nib_pi05_config full;
    nib_pi05_config_full(&full);
    memset(c, 0, sizeof *c);
    /* the defaults that shapes cannot tell (head counts): Pi0.5's */
    c->v_heads = full.v_heads, c->kv_heads = 1, c->max_cameras = 3, c->max_text = 200, c->max_horizon = 50;
    c->steps = 10;
    t = nib_pi05_find(f, PI05_VP ".embeddings.patch_embedding.weight");
    if (!t || t->ndim != 4)
        return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: '%s' missing or not 4-D: is this an openpi Pi0.5 checkpoint?",
                       PI05_VP ".embeddings.patch_embedding.weight");
    /* every dimension is range-checked before it is narrowed to int32 (a header may hold any
     * int64 shape, and products below must not overflow) */
    int64_t v[3] = {t->shape[0], t->shape[1], t->shape[2]};
    NIB_RETURN_IF_ERR(dim_ok(v[0], "SigLIP width (patch_embedding dim 0)"));
    NIB_RETURN_IF_ERR(dim_ok(v[1], "image channels (patch_embedding dim 1)"));
    NIB_RETURN_IF_ERR(dim_ok(v[2], "patch size (patch_embedding dim 2)"));
    c->v_width = (int32_t)v[0], c->v_channels = (int32_t)v[1], c->v_patch = (int32_t)v[2];
    t = nib_pi05_find(f, PI05_VP ".embeddings.position_embedding.weight");
    if (!t || t->ndim != 2) return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: position embedding missing or not 2-D");
    NIB_RETURN_IF_ERR(dim_ok(t->shape[0], "vision tokens (position_embedding dim 0)"));
    c->v_tokens = (int32_t)t->shape[0];
    const int64_t grid = llround(sqrt((double)c->v_tokens));
    if (grid * grid != c->v_tokens)
        return NIB_ERR(NIB_ERR_SHAPE, "checkpoint: %d vision tokens is not a square grid", c->v_tokens);
    NIB_RETURN_IF_ERR(dim_ok(grid * c->v_patch, "image size (grid x patch)"));
    c->v_image = (int32_t)(grid * c->v_patch);
    c->v_layers = count_layers(f, PI05_VP ".encoder.layers.%d.layer_norm1.weight");
    int64_t n = lin_n(f, PI05_VP ".encoder.layers.0.mlp.fc1");
    if (n < 0) return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: SigLIP fc1 missing");
    NIB_RETURN_IF_ERR(dim_ok(n, "SigLIP MLP width"));
    c->v_mlp = (int32_t)n;
    t = nib_pi05_find(f, PI05_EMBED);
    if (!t || t->ndim != 2) return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: '%s' (the token embedding) missing", PI05_EMBED);
    if (t->shape[0] < 1 || t->shape[0] > INT32_MAX)
        return NIB_ERR(NIB_ERR_SHAPE, "checkpoint: vocabulary of %lld tokens (1 .. 2^31-1)", (long long)t->shape[0]);
    NIB_RETURN_IF_ERR(dim_ok(t->shape[1], "language model width (embedding dim 1)"));
    c->vocab = t->shape[0], c->width = (int32_t)t->shape[1];
    c->layers = count_linears(f, PI05_LP ".layers.%d.self_attn.q_proj");
    if ((n = lin_n(f, PI05_LP ".layers.0.self_attn.k_proj")) < 0)
        return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: language model k_proj missing");
    NIB_RETURN_IF_ERR(dim_ok(n, "head dim (k_proj rows)"));
    c->head_dim = (int32_t)n; /* MQA: one KV head */
    n = lin_n(f, PI05_LP ".layers.0.self_attn.q_proj");
    NIB_RETURN_IF_ERR(dim_ok(n, "language model q_proj rows"));
    c->heads = (int32_t)(n / (c->head_dim ? c->head_dim : 1));
    if ((n = lin_n(f, PI05_LP ".layers.0.mlp.gate_proj")) < 0)
        return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: language model gate_proj missing");
    NIB_RETURN_IF_ERR(dim_ok(n, "language model MLP width"));
    c->mlp = (int32_t)n;
    t = nib_pi05_find(f, "action_in_proj.weight");
    if (!t || t->ndim != 2) return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: action_in_proj.weight missing");
    NIB_RETURN_IF_ERR(dim_ok(t->shape[0], "expert width (action_in_proj dim 0)"));
    NIB_RETURN_IF_ERR(dim_ok(t->shape[1], "action dim (action_in_proj dim 1)"));
    c->e_width = (int32_t)t->shape[0], c->action_dim = (int32_t)t->shape[1];
    c->e_layers = count_linears(f, PI05_EP ".layers.%d.self_attn.q_proj");
    if ((n = lin_n(f, PI05_EP ".layers.0.self_attn.q_proj")) < 0)
        return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: action expert q_proj missing");
    NIB_RETURN_IF_ERR(dim_ok(n, "expert q_proj rows"));
    c->e_heads = (int32_t)(n / (c->head_dim ? c->head_dim : 1));
    if ((n = lin_n(f, PI05_EP ".layers.0.mlp.gate_proj")) < 0)
        return NIB_ERR(NIB_ERR_NOT_FOUND, "checkpoint: action expert gate_proj missing");
    NIB_RETURN_IF_ERR(dim_ok(n, "expert MLP width"));
    c->e_mlp = (int32_t)n;
    c->v_head_dim = c->v_heads ? c->v_width / c->v_heads : 0;
    const nib_st_kv *meta = nib_st_metadata_find(f, "nib.pi05.config");
    if (meta) {
        nib_status st = nib_pi05_config_parse_json(meta->value, meta->value_len, c);
        if (st) return nib_error_context(st, "checkpoint metadata 'nib.pi05.config'");
        if (!c->v_head_dim || (int64_t)c->v_head_dim * c->v_heads != c->v_width)
            c->v_head_dim = c->v_width / (c->v_heads > 0 ? c->v_heads : 1);
    }
    /* consistency: what the model code relies on (products in int64, divisors checked first) */
    if (c->v_layers < 1 || c->layers < 2 || c->e_layers != c->layers)
        return NIB_ERR(NIB_ERR_SHAPE, "checkpoint: %d vision, %d language and %d expert layers (the expert must have as "
                       "many layers as the language model, at least 2)", c->v_layers, c->layers, c->e_layers);
    if (c->v_heads < 1 || (int64_t)c->v_head_dim * c->v_heads != c->v_width)
        return NIB_ERR(NIB_ERR_SHAPE, "checkpoint: SigLIP width %d is not %d heads x %d", c->v_width, c->v_heads, c->v_head_dim);
    if (c->kv_heads < 1 || c->heads < 1 || c->e_heads < 1 || c->heads % c->kv_heads || c->e_heads % c->kv_heads)
        return NIB_ERR(NIB_ERR_SHAPE, "checkpoint: %d / %d query heads do not group over %d KV heads", c->heads, c->e_heads,
                       c->kv_heads);
    if (c->steps < 1 || c->steps > 64) return NIB_ERR(NIB_ERR_SHAPE, "config: %d flow-matching steps (1..64)", c->steps);
    return NIB_OK;
}
