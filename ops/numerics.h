/* numerics.h — the non-finite scan behind Pi0.5's check-numerics mode (models/pi05.c,
 * `nib run pi05 --check-numerics`), with its reference twin:
 *
 *   check_finite  count the NaN / Inf elements of a [rows][cols] matrix with row stride ld and
 *                 find the first one in row-major order (index r * cols + c); the padding
 *                 columns [cols, ld) are not read
 *
 * Elements are the activation dtype (float on the reference backend, bf16 on the CUDA backend)
 * or fp32 on both (`f32`). The test is on the bits (exponent all ones), so it does not depend on
 * fast-math settings. The CUDA entry is NOT graph-capturable: it reads the result back and
 * synchronizes the stream. It is for the eager check mode, never for the captured call.
 */
#ifndef NIB_OPS_NUMERICS_H
#define NIB_OPS_NUMERICS_H

#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nib_check_finite_args {
    const void *x;        /* [rows][ld] act dtype, or fp32 when f32 (host for ref, device for CUDA) */
    int64_t rows, cols, ld;
    int f32;              /* 1: fp32 elements on both backends; 0: the activation dtype */
} nib_check_finite_args;

typedef struct nib_finite_result {
    uint64_t count;       /* non-finite elements in the [rows][cols] region */
    uint64_t first;       /* r * cols + c of the first one in row-major order; UINT64_MAX: none */
    float value;          /* its value (NaN, +Inf or -Inf); 0 when count == 0 */
} nib_finite_result;

/* Device scratch of nib_cuda_check_finite: the count and the first index (2 x u64). */
#define NIB_CHECK_FINITE_WS_BYTES 16

nib_status nib_ref_check_finite(const nib_check_finite_args *a, nib_finite_result *out);
/* ws: device memory of NIB_CHECK_FINITE_WS_BYTES. Enqueued on `stream`, then synchronizes it. */
nib_status nib_cuda_check_finite(const nib_check_finite_args *a, void *ws, nib_finite_result *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
