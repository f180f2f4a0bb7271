/* ktrace.cu — nib_cuda_ktrace_dump: every stamped unit's ring into one file (runtime/ktrace.cuh) */
#include <stdio.h>

#include <cuda_runtime.h>

#include "base/base.h"
#include "runtime/device.h"
#include "runtime/ktrace.cuh"

extern "C" nib_status nib_cuda_ktrace_dump(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return NIB_ERR(NIB_ERR_IO, "ktrace: cannot write %s", path);
    int (*const units[])(FILE *) = {nib_ktrace_dump_gemm_fp8, nib_ktrace_dump_norm,         nib_ktrace_dump_blas,
                                          nib_ktrace_dump_gemm_lowbit, nib_ktrace_dump_attention, nib_ktrace_dump_edge};
    int built = 0, failed = 0;
    for (auto u : units) {
        const int r = u(f);
        built += r != 1, failed += r < 0;
    }
    const int cerr = fclose(f);
    if (!built)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "ktrace: this build has no kernel stamps (build with "
                       "NIB_LAB_NVCCFLAGS=-DNIB_KTRACE=1)");
    if (failed) return NIB_ERR(NIB_ERR_CUDA, "ktrace: copying a stamp ring from the device failed");
    if (cerr) return NIB_ERR(NIB_ERR_IO, "ktrace: writing %s failed", path);
    return NIB_OK;
}
