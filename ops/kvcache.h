/* kvcache.h — the KV-cache layout every writer (QKV epilogue) and reader (attention) agrees on.
 *
 * One layer's cache holds t_max token slots of n_kv_heads heads of head_dim (Gemma: 1 x 256).
 * Token-major, so a token's K (or V) for all heads is contiguous and appending is one write:
 *
 *   BF16   k, v   : bf16 [t_max][n_kv_heads][head_dim]
 *   FP8    k, v   : e4m3 [t_max][n_kv_heads][head_dim]        (u8)
 *          ks, vs : fp32 [t_max][n_kv_heads]   per (token, head) scale = amax / 448
 *                   (1 for an all-zero vector); value = e4m3 * scale
 *   NVFP4  k, v   : e2m1 [t_max][n_kv_heads][head_dim / 2]    (u8, element 2i in the low nibble)
 *          kb, vb : e4m3 [t_max][n_kv_heads][head_dim / 16]   block scales (16 along head_dim)
 *          ks, vs : fp32 [t_max][n_kv_heads]   per (token, head) global = amax / (6 * 448)
 *                   (ModelOpt NVFP4 semantics per vector: formats/ nvfp4 on a 1 x head_dim row)
 *
 * Scales are dynamic (computed when the vector is written), so no calibration is needed and
 * the write is one pass. The reference backend stores the same bits (it quantizes with
 * formats/), so GPU and reference caches can be compared byte for byte.
 */
#ifndef NIB_OPS_KVCACHE_H
#define NIB_OPS_KVCACHE_H

#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nib_kv_dtype { NIB_KV_BF16 = 0, NIB_KV_FP8 = 1, NIB_KV_NVFP4 = 2, NIB_KV_COUNT } nib_kv_dtype;

typedef struct nib_kv_layer {
    nib_kv_dtype dtype;
    int32_t t_max, n_kv_heads, head_dim;
    void *k, *v;           /* element planes (see above) */
    uint8_t *kb, *vb;      /* NVFP4 block scales, else NULL */
    float *ks, *vs;        /* FP8 scales / NVFP4 globals, else NULL */
} nib_kv_layer;

/* Bytes one layer needs for t_max tokens (all planes, each 256-byte aligned). */
uint64_t nib_kv_layer_bytes(nib_kv_dtype dt, int32_t t_max, int32_t n_kv_heads, int32_t head_dim);
/* Point a layer view into one buffer of nib_kv_layer_bytes() bytes (host or device memory). */
nib_status nib_kv_layer_map(nib_kv_layer *l, nib_kv_dtype dt, int32_t t_max, int32_t n_kv_heads,
                            int32_t head_dim, void *base);
const char *nib_kv_dtype_name(nib_kv_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
