/* rope.c — reference rotary embedding (host float, in place): the spec of ops/rope.h. Also the
 * frequency table, the argument checks both backends share, and the CUDA stub of CPU-only
 * builds. Each fp32 operation is its own statement so no compiler contracts it into an FMA. */
#include <math.h>
#include <string.h>

#include "ops/rope.h"

nib_status nib_rope_inv_freq(float theta, int32_t rot_dim, float *inv_freq) {
    if (!inv_freq) return NIB_ERR(NIB_ERR_INVALID_ARG, "rope inv_freq: NULL output");
    if (!(theta > 0.0f) || !isfinite(theta))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "rope inv_freq: theta %g must be finite and > 0", (double)theta);
    if (rot_dim < 2 || rot_dim % 2 || rot_dim > NIB_ROPE_MAX_ROT)
        return NIB_ERR(NIB_ERR_SHAPE, "rope inv_freq: rot_dim %d must be even in [2, %d]", rot_dim, NIB_ROPE_MAX_ROT);
    for (int32_t i = 0; i < rot_dim / 2; i++)
        inv_freq[i] = (float)pow((double)theta, -(double)(2 * i) / (double)rot_dim);
    return NIB_OK;
}

nib_status nib_rope_validate(const nib_rope_args *a, const char *who) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL args", who);
    if ((unsigned)a->style >= NIB_ROPE_STYLE_COUNT)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: style %d is not a nib_rope_style", who, (int)a->style);
    if (a->tokens < 0 || a->tokens > INT32_MAX)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: tokens %lld outside [0, 2^31)", who, (long long)a->tokens);
    if (a->n_heads < 1 || a->head_dim < 2)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: %d heads of dim %d (need >= 1 head of dim >= 2)", who, a->n_heads,
                       a->head_dim);
    if (a->rot_dim < 2 || a->rot_dim % 2 || a->rot_dim > a->head_dim || a->rot_dim > NIB_ROPE_MAX_ROT)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: rot_dim %d must be even in [2, min(head_dim %d, %d)]", who, a->rot_dim,
                       a->head_dim, NIB_ROPE_MAX_ROT);
    if ((int64_t)a->n_heads * a->head_dim > a->ld)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: ld %lld < n_heads %d * head_dim %d", who, (long long)a->ld, a->n_heads,
                       a->head_dim);
    if (!a->x || !a->positions || !a->inv_freq)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: x, positions and inv_freq are required (x %p, positions %p, inv_freq %p)",
                       who, a->x, (const void *)a->positions, (const void *)a->inv_freq);
    return NIB_OK;
}

nib_status nib_ref_rope(const nib_rope_args *a) {
    NIB_RETURN_IF_ERR(nib_rope_validate(a, "rope (ref)"));
    int64_t tokens = a->tokens;
    if (a->n_valid) tokens = *a->n_valid < 0 ? 0 : (*a->n_valid < tokens ? *a->n_valid : tokens);
    const int32_t half = a->rot_dim / 2;
    float *cs = nib_malloc((size_t)a->rot_dim * sizeof(float)); /* cos[i], sin[i] interleaved */
    if (!cs) return NIB_ERR_OUT_OF_MEMORY;
    for (int64_t t = 0; t < tokens; t++) {
        const float posf = (float)a->positions[t];
        for (int32_t i = 0; i < half; i++) {
            const float ang = posf * a->inv_freq[i];
            const float c = (float)cos((double)ang), s = (float)sin((double)ang);
            cs[2 * i] = c;
            cs[2 * i + 1] = a->inverse ? -s : s;
        }
        float *row = (float *)a->x + t * a->ld;
        for (int32_t h = 0; h < a->n_heads; h++) {
            float *x = row + (int64_t)h * a->head_dim;
            for (int32_t i = 0; i < half; i++) {
                const int32_t ia = a->style == NIB_ROPE_HALF ? i : 2 * i;
                const int32_t ib = a->style == NIB_ROPE_HALF ? i + half : 2 * i + 1;
                const float c = cs[2 * i], s = cs[2 * i + 1];
                const float xa = x[ia], xb = x[ib];
                const float ac = xa * c, bs = xb * s, bc = xb * c, as = xa * s;
                x[ia] = ac - bs;
                x[ib] = bc + as;
            }
        }
    }
    nib_free(cs);
    return NIB_OK;
}

#ifndef NIB_HAVE_CUDA
nib_status nib_cuda_rope(const nib_rope_args *a, void *stream) {
    (void)a;
    (void)stream;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "rope: this nib build has no CUDA backend (NO_CUDA=1 or no nvcc)");
}
#endif
