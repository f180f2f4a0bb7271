/* kvcache.c — sizes and views of the KV-cache layout in ops/kvcache.h. */
#include "ops/kvcache.h"

static uint64_t al(uint64_t x) { return (x + 255) / 256 * 256; }

const char *nib_kv_dtype_name(nib_kv_dtype dt) {
    switch (dt) {
    case NIB_KV_BF16: return "bf16";
    case NIB_KV_FP8: return "fp8";
    case NIB_KV_NVFP4: return "nvfp4";
    default: return "invalid";
    }
}

/* element-plane, block-scale and scale bytes of one of K or V */
static void plane_bytes(nib_kv_dtype dt, uint64_t vecs, uint64_t d, uint64_t *e, uint64_t *b, uint64_t *s) {
    *e = dt == NIB_KV_BF16 ? vecs * d * 2 : dt == NIB_KV_FP8 ? vecs * d : vecs * d / 2;
    *b = dt == NIB_KV_NVFP4 ? vecs * (d / 16) : 0;
    *s = dt == NIB_KV_BF16 ? 0 : vecs * 4;
}

uint64_t nib_kv_layer_bytes(nib_kv_dtype dt, int32_t t_max, int32_t n_kv_heads, int32_t head_dim) {
    if (t_max < 0 || n_kv_heads < 1 || head_dim < 1) return 0;
    uint64_t e, b, s;
    plane_bytes(dt, (uint64_t)t_max * n_kv_heads, (uint64_t)head_dim, &e, &b, &s);
    return 2 * (al(e) + al(b) + al(s));
}

nib_status nib_kv_layer_map(nib_kv_layer *l, nib_kv_dtype dt, int32_t t_max, int32_t n_kv_heads,
                            int32_t head_dim, void *base) {
    if ((unsigned)dt >= NIB_KV_COUNT) return NIB_ERR(NIB_ERR_INVALID_ARG, "kv cache: dtype %d", (int)dt);
    if (t_max < 0 || n_kv_heads < 1 || head_dim < 16 || head_dim % 16)
        return NIB_ERR(NIB_ERR_SHAPE, "kv cache: t_max %d, %d heads of dim %d (dim must be a multiple of 16)",
                       t_max, n_kv_heads, head_dim);
    uint64_t e, b, s;
    plane_bytes(dt, (uint64_t)t_max * n_kv_heads, (uint64_t)head_dim, &e, &b, &s);
    uint8_t *p = (uint8_t *)base;
    l->dtype = dt;
    l->t_max = t_max;
    l->n_kv_heads = n_kv_heads;
    l->head_dim = head_dim;
    l->k = p;
    p += al(e);
    l->v = p;
    p += al(e);
    l->kb = b ? p : NULL;
    p += al(b);
    l->vb = b ? p : NULL;
    p += al(b);
    l->ks = s ? (float *)p : NULL;
    p += al(s);
    l->vs = s ? (float *)p : NULL;
    return NIB_OK;
}
