/* act.c — reference GeGLU-tanh / SwiGLU / GELU-tanh (host float): the spec of ops/act.h. Each
 * fp32 operation is its own statement so no compiler contracts it into an FMA. */
#include <math.h>
#include <string.h>

#include "formats/formats.h"
#include "ops/act.h"


static const char *act_name(nib_act_kind k) {
    switch (k) {
    case NIB_ACT_GEGLU_TANH: return "geglu";
    case NIB_ACT_SWIGLU: return "swiglu";
    case NIB_ACT_GELU_TANH: return "gelu";
    default: return "invalid";
    }
}

nib_status nib_act_validate(const nib_act_args *a, const char *who) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL args", who);
    if ((unsigned)a->kind >= NIB_ACT_KIND_COUNT)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: kind %d is not a nib_act_kind", who, (int)a->kind);
    const char *k = act_name(a->kind);
    if (a->rows < 0 || a->rows > INT32_MAX)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): rows %lld outside [0, 2^31)", who, k, (long long)a->rows);
    if (a->h < 8 || a->h % 8 || a->h > ((int64_t)1 << 40))
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): H %lld must be a positive multiple of 8", who, k, (long long)a->h);
    const int64_t in_cols = a->kind == NIB_ACT_GELU_TANH ? a->h : 2 * a->h;
    if (a->ldx < in_cols)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): ldx %lld < %lld input columns (H = %lld)", who, k, (long long)a->ldx,
                       (long long)in_cols, (long long)a->h);
    if (a->y && a->ldy < a->h)
        return NIB_ERR(NIB_ERR_SHAPE, "%s (%s): ldy %lld < H %lld", who, k, (long long)a->ldy, (long long)a->h);
    if (!a->x || (!a->y && !a->y_q))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "%s (%s): x and an output (y or y_q) are required", who, k);
    if (a->y_q && (!a->y_scale || a->ldq < a->h))
        return NIB_ERR(a->y_scale ? NIB_ERR_SHAPE : NIB_ERR_INVALID_ARG,
                       "%s (%s): FP8 output needs y_scale and ldq >= H (ldq %lld, H %lld)", who, k, (long long)a->ldq,
                       (long long)a->h);
    return NIB_OK;
}

static float gelu_tanh_ref(float g) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    const float t1 = k1 * g;
    const float t2 = t1 * g;
    const float g3 = t2 * g;
    const float u = g + g3;
    const float z = k0 * u;
    const float th = tanhf(z);
    const float one = 1.0f + th;
    const float hg = 0.5f * g;
    return hg * one;
}

static float silu_ref(float g) {
    const float e = expf(-g);
    const float d = 1.0f + e;
    return g / d;
}

nib_status nib_ref_act(const nib_act_args *a) {
    NIB_RETURN_IF_ERR(nib_act_validate(a, "act (ref)"));
    int64_t rows = a->rows;
    if (a->n_valid) rows = *a->n_valid < 0 ? 0 : (*a->n_valid < rows ? *a->n_valid : rows);
    float *tmp = NULL;
    if (rows > 0 && (a->y_q || !a->y)) {
        tmp = nib_malloc((size_t)a->h * sizeof(float));
        if (!tmp) return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "act (ref): %lld floats of row scratch", (long long)a->h);
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *x = (const float *)a->x + r * a->ldx;
        float *y = tmp ? tmp : (float *)a->y + r * a->ldy;
        /* column j of y depends only on columns j (and H + j) of x, read before y[j] is written:
         * in place (y == x) is safe */
        for (int64_t j = 0; j < a->h; j++) {
            const float g = x[j];
            float v;
            switch (a->kind) {
            case NIB_ACT_GEGLU_TANH: v = gelu_tanh_ref(g) * x[a->h + j]; break;
            case NIB_ACT_SWIGLU: v = silu_ref(g) * x[a->h + j]; break;
            default: v = gelu_tanh_ref(g); break;
            }
            y[j] = v;
        }
        if (tmp && a->y) memcpy((float *)a->y + r * a->ldy, tmp, (size_t)a->h * sizeof(float));
        if (a->y_q) {
            nib_status st = nib_fp8_quantize(tmp, 1, a->h, 1, a->y_q + r * a->ldq, &a->y_scale[r]);
            if (st) {
                nib_free(tmp);
                return nib_error_context(st, "act (ref) FP8 output of row %lld", (long long)r);
            }
        }
    }
    nib_free(tmp);
    return NIB_OK;
}

#ifndef NIB_HAVE_CUDA
nib_status nib_cuda_act(const nib_act_args *a, void *stream) {
    (void)a;
    (void)stream;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "act: this nib build has no CUDA backend (NO_CUDA=1 or no nvcc)");
}
#endif
