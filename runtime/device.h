/* device.h — the CUDA runtime layer: device selection, capability gate, one checked-call
 * macro, device memory (one weight slab + an activation arena), streams/events.
 *
 * Everything here also links in a CPU-only build (NO_CUDA=1 or no nvcc): the functions then
 * return NIB_ERR_NO_DEVICE with a message saying the build has no CUDA backend.
 *
 * Knobs (environment):
 *   NIB_DEVICE=N             use device ordinal N (default 0; read once)
 *   NIB_FAKE_CC=MAJOR.MINOR  pretend the device has this compute capability (tests the gate; read
 *                            on every query)
 *   NIB_DEVICE_MEM_LIMIT=B   refuse device allocations past B bytes in total (tests OOM paths;
 *                            read on every nib_dev_malloc)
 */
#ifndef NIB_RUNTIME_DEVICE_H
#define NIB_RUNTIME_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Minimum compute capability of nib's CUDA kernels (sm_90a: wgmma, cp.async.bulk). */
#define NIB_MIN_CC_MAJOR 9
#define NIB_MIN_CC_MINOR 0

typedef struct nib_device_info {
    int ordinal;
    char name[256];
    int cc_major, cc_minor;        /* after NIB_FAKE_CC, if set */
    int real_cc_major, real_cc_minor;
    int sm_count;
    int l2_bytes;
    int smem_per_block_optin;      /* bytes a block may use after cudaFuncSetAttribute */
    int smem_per_sm;
    uint64_t total_mem, free_mem;
    int driver_version;            /* e.g. 13000 */
    int runtime_version;
    int mem_clock_khz, mem_bus_width; /* 0 where the runtime no longer reports them */
    int cc_overridden;             /* 1 when NIB_FAKE_CC changed cc_major/minor */
} nib_device_info;

/* 1 if this build has CUDA and a device with compute capability >= NIB_MIN_CC is present. */
int nib_device_available(void);
/* 1 if this build includes the CUDA backend. */
int nib_device_built_with_cuda(void);
/* Select the device (NIB_DEVICE or 0) and fill info. Errors: NIB_ERR_NO_DEVICE (no CUDA build,
 * no driver, no device), NIB_ERR_CUDA. Does not apply the capability gate. */
nib_status nib_device_query(nib_device_info *info);
/* Query + gate: NIB_ERR_UNSUPPORTED_DEVICE (with the capability found and needed) when the
 * device is older than sm_90. Every CUDA entry point calls this once before launching. */
nib_status nib_device_require(nib_device_info *info);

/* Convert the last CUDA error of `what` (a call's text) to a status with a message; sticky
 * errors become NIB_ERR_DEVICE_LOST, allocation failures NIB_ERR_DEVICE_OOM. `err` is the
 * cudaError_t value as int so this header stays C without CUDA headers. */
nib_status nib_cuda_status(int err, const char *what, const char *file, int line);

/* ---- device memory ---------------------------------------------------------------------- */
/* Checked cudaMalloc honoring NIB_DEVICE_MEM_LIMIT. On failure NIB_ERR_DEVICE_OOM whose message
 * has `what`, the bytes asked and the bytes free. */
nib_status nib_dev_malloc(void **p, size_t bytes, const char *what);
/* Free a nib_dev_malloc allocation of `bytes` bytes (for the accounting). NULL is a no-op. */
void nib_dev_free(void *p, size_t bytes);
/* Pinned host memory the device can write (cudaHostAllocMapped), zeroed: *host for the host,
 * *dev for kernels. For flags a kernel raises and the host reads after synchronizing, without a
 * copy (and without a device fault: the context stays usable). */
nib_status nib_host_mapped_alloc(void **host, void **dev, size_t bytes, const char *what);
void nib_host_mapped_free(void *host); /* NULL is a no-op */
/* Bytes currently allocated through nib_dev_malloc. */
uint64_t nib_dev_allocated(void);

/* A bump arena over one device allocation: weights (the slab) or activations. Suballocations
 * are 256-byte aligned; nothing is freed individually; reset() rewinds. */
typedef struct nib_dev_arena {
    uint8_t *base;
    size_t cap, used, high_water;
    char what[64];
} nib_dev_arena;
nib_status nib_dev_arena_init(nib_dev_arena *a, size_t cap, const char *what);
nib_status nib_dev_arena_alloc(nib_dev_arena *a, size_t bytes, void **out, const char *what);
void nib_dev_arena_reset(nib_dev_arena *a);
void nib_dev_arena_free(nib_dev_arena *a);

/* Host<->device copies and fills, checked and complete on return (so ordered before anything
 * queued afterwards on any stream; download: the caller first waits for the writers of src). */
nib_status nib_dev_upload(void *dst, const void *src, size_t bytes);
nib_status nib_dev_download(void *dst, const void *src, size_t bytes);
nib_status nib_dev_memset(void *dst, int value, size_t bytes);
nib_status nib_dev_copy(void *dst, const void *src, size_t bytes); /* device to device */
nib_status nib_dev_sync(void);

/* Kernels launched from this thread while suspended go without programmatic dependent launch
 * (runtime/launch.cuh; Pi0.5 suspends it while it enqueues the per-op first step on the side
 * stream). Launching without PDL is always correct (the kernels' waits become no-ops); it only
 * orders a kernel after its predecessor's completion instead of letting it sit resident beside it. */
void nib_pdl_suspend(int on);
int nib_pdl_suspended(void);
/* a lab build's in-graph kernel stamps (runtime/ktrace.cuh: NIB_LAB_NVCCFLAGS=-DNIB_KTRACE=1) written to path as text;
 * NIB_ERR_UNSUPPORTED in any other build */
nib_status nib_cuda_ktrace_dump(const char *path);

#ifdef __cplusplus
}
#endif
#endif
