/* numerics.c — reference twin of ops/numerics.h (host float activations or fp32). */
#include <string.h>

#include "ops/numerics.h"

static int args_ok(const nib_check_finite_args *a) {
    return a && (a->x || a->rows == 0 || a->cols == 0) && a->rows >= 0 && a->cols >= 0 && a->ld >= a->cols;
}

nib_status nib_ref_check_finite(const nib_check_finite_args *a, nib_finite_result *out) {
    memset(out, 0, sizeof *out);
    out->first = UINT64_MAX;
    if (!args_ok(a))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "check_finite: bad arguments (rows %lld, cols %lld, ld %lld)",
                       a ? (long long)a->rows : 0, a ? (long long)a->cols : 0, a ? (long long)a->ld : 0);
    /* activations are float on the reference backend: both cases read 32-bit floats */
    const uint32_t *x = (const uint32_t *)a->x;
    for (int64_t r = 0; r < a->rows; r++)
        for (int64_t c = 0; c < a->cols; c++) {
            uint32_t b = x[r * a->ld + c];
            if ((b & 0x7F800000u) != 0x7F800000u) continue;
            if (!out->count) {
                out->first = (uint64_t)(r * a->cols + c);
                memcpy(&out->value, &b, 4);
            }
            out->count++;
        }
    return NIB_OK;
}

#ifndef NIB_HAVE_CUDA
/* CPU-only build: the CUDA twin reports that there is no CUDA backend */
nib_status nib_cuda_check_finite(const nib_check_finite_args *a, void *ws, nib_finite_result *out, void *stream) {
    (void)a, (void)ws, (void)stream;
    memset(out, 0, sizeof *out);
    out->first = UINT64_MAX;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "nib_cuda_check_finite: this nib build has no CUDA backend (NO_CUDA=1 or no nvcc)");
}
#endif
