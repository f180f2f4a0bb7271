/* negative_control_gpu.cu — the negative control of scripts/sanitize.sh: a kernel that writes one
 * element past the end of its buffer, so that compute-sanitizer memcheck has something it must
 * report (a sanitizer job that reports nothing may be blind: not installed, wrong tool, caching
 * allocator hiding the buffer). The buffer has its own cudaMalloc (not an arena suballocation),
 * and the stray write lands in the allocation's padding: without the sanitizer nothing faults.
 *
 * Only `make NIB_NEGATIVE_CONTROL=1` compiles the out-of-bounds index; otherwise the kernel
 * writes in bounds and tests/test_negative_control_gpu.c skips. Run it with
 *   scripts/sanitize.sh --negative-control
 * The file also holds nib_test_fault_kernel_launch (always compiled): a real illegal-address
 * fault for the device-lost test (fail_device_lost_real_fault). */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "runtime/cuda_check.h"

#ifdef NIB_NEGATIVE_CONTROL
#define NEGCTL_OOB 1 /* write out[n]: one past the end */
#else
#define NEGCTL_OOB 0
#endif

__global__ void k_negctl_write(float *out, int n) {
    if (threadIdx.x == 0 && blockIdx.x == 0) out[n - 1 + NEGCTL_OOB] = 1.0f;
}

extern "C" int nib_test_negctl_built(void) { return NEGCTL_OOB; }

static nib_status negctl_launch(float *buf, int n) {
    k_negctl_write<<<1, 32>>>(buf, n);
    NIB_LAUNCH_CHECK("k_negctl_write");
    return NIB_OK;
}

/* Launch the kernel on a fresh 256-float buffer and synchronize; *oob = 1 when the write was
 * out of bounds. Returns the status of the launch and the synchronization (under memcheck the
 * launch is reported and may fail: the test's outcome then does not matter, the report does). */
extern "C" nib_status nib_test_negctl_run(int *oob) {
    nib_status st = NIB_OK;
    const int n = 256;
    float *buf = NULL;
    *oob = NEGCTL_OOB;
    NIB_CUDA_TRY(cudaMalloc((void **)&buf, n * sizeof(float)));
    NIB_CUDA_TRY(cudaMemset(buf, 0, n * sizeof(float)));
    st = negctl_launch(buf, n);
    if (st != NIB_OK) goto fail;
    NIB_CUDA_TRY(cudaDeviceSynchronize());
fail:
    if (buf) cudaFree(buf); /* unchecked: cleanup; the first error is the one returned */
    return st;
}

/* ---- a real sticky error (always compiled) ------------------------------------------------
 * A kernel that writes through an address no allocation covers: the launch itself succeeds and
 * the fault is raised while it runs, leaving the context with cudaErrorIllegalAddress, a
 * sticky error (every later CUDA call of the process fails). Used by the device-lost test of
 * tests/test_failure_paths.c, which runs it in a child process of its own. */
__global__ void k_fault_write(float *p) { *(volatile float *)p = 1.0f; }

extern "C" nib_status nib_test_fault_kernel_launch(void) {
    float *bad = (float *)(uintptr_t)0x10; /* the first page is never mapped */
    k_fault_write<<<1, 1>>>(bad);
    NIB_LAUNCH_CHECK("k_fault_write");
    /* wait for the fault here: nib's own streams do not synchronize with the legacy stream, so
     * without this a nib sync could return before the kernel ran */
    (void)cudaStreamSynchronize(0); /* unchecked: the test checks the sticky error through nib's APIs */
    return NIB_OK;
}
