/* cuda_check.h — the one checked-call macro family for CUDA runtime / cuBLAS calls.
 * Include only in files built with CUDA (NIB_HAVE_CUDA). Every CUDA call in nib goes through
 * NIB_CUDA_CHECK / NIB_CUDA_TRY, and every kernel launch is followed by NIB_LAUNCH_CHECK. */
#ifndef NIB_RUNTIME_CUDA_CHECK_H
#define NIB_RUNTIME_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "runtime/device.h"

/* Return a status from the enclosing function on failure. */
#define NIB_CUDA_CHECK(call)                                                                  \
    do {                                                                                      \
        cudaError_t nib_ce_ = (call);                                                         \
        if (nib_ce_ != cudaSuccess) return nib_cuda_status((int)nib_ce_, #call, __FILE__, __LINE__); \
    } while (0)
/* Set `st` and jump to `fail:` on failure. */
#define NIB_CUDA_TRY(call)                                                                    \
    do {                                                                                      \
        cudaError_t nib_ce_ = (call);                                                         \
        if (nib_ce_ != cudaSuccess) {                                                         \
            st = nib_cuda_status((int)nib_ce_, #call, __FILE__, __LINE__);                    \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)
/* After every <<<>>> launch: reports launch-configuration errors and sticky device errors. */
#define NIB_LAUNCH_CHECK(kernel_name)                                                         \
    do {                                                                                      \
        cudaError_t nib_ce_ = cudaGetLastError();                                             \
        if (nib_ce_ != cudaSuccess)                                                           \
            return nib_cuda_status((int)nib_ce_, "launch of " kernel_name, __FILE__, __LINE__); \
    } while (0)

#endif
