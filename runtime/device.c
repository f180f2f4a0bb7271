/* device.c — device query, capability gate, CUDA error mapping, device memory and arenas.
 * Built in every configuration; the CUDA parts only with NIB_HAVE_CUDA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/device.h"

#ifdef NIB_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

static _Thread_local int pdl_suspended;
void nib_pdl_suspend(int on) { pdl_suspended = on != 0; }
int nib_pdl_suspended(void) { return pdl_suspended; }

int nib_device_built_with_cuda(void) {
#ifdef NIB_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

static uint64_t g_allocated;

uint64_t nib_dev_allocated(void) { return g_allocated; }

#ifndef NIB_HAVE_CUDA

#define NO_CUDA_MSG "this nib build has no CUDA backend (built with NO_CUDA=1 or without nvcc)"
int nib_device_available(void) { return 0; }
nib_status nib_device_query(nib_device_info *info) {
    if (info) memset(info, 0, sizeof *info);
    return NIB_ERR(NIB_ERR_NO_DEVICE, NO_CUDA_MSG);
}
nib_status nib_device_require(nib_device_info *info) { return nib_device_query(info); }
nib_status nib_cuda_status(int err, const char *what, const char *file, int line) {
    return nib_set_error(NIB_ERR_CUDA, file, line, "%s failed with CUDA error %d", what, err);
}
nib_status nib_dev_malloc(void **p, size_t bytes, const char *what) {
    (void)bytes;
    *p = NULL;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "%s: " NO_CUDA_MSG, what);
}
void nib_dev_free(void *p, size_t bytes) { (void)p, (void)bytes; }
nib_status nib_host_mapped_alloc(void **host, void **dev, size_t bytes, const char *what) {
    (void)bytes;
    *host = *dev = NULL;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "%s: " NO_CUDA_MSG, what);
}
void nib_host_mapped_free(void *host) { (void)host; }
nib_status nib_dev_upload(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return NIB_ERR(NIB_ERR_NO_DEVICE, NO_CUDA_MSG);
}
nib_status nib_dev_download(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return NIB_ERR(NIB_ERR_NO_DEVICE, NO_CUDA_MSG);
}
nib_status nib_dev_memset(void *dst, int value, size_t bytes) {
    (void)dst, (void)value, (void)bytes;
    return NIB_ERR(NIB_ERR_NO_DEVICE, NO_CUDA_MSG);
}
nib_status nib_dev_copy(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return NIB_ERR(NIB_ERR_NO_DEVICE, NO_CUDA_MSG);
}
nib_status nib_dev_sync(void) { return NIB_ERR(NIB_ERR_NO_DEVICE, NO_CUDA_MSG); }

#else /* NIB_HAVE_CUDA */

/* NIB_DEVICE_MEM_LIMIT, read at every nib_dev_malloc (one getenv; allocations happen at load
 * and plan time, never in a call's hot path), so a test can set and unset it at any point of a
 * process. 0 or unset: no limit. */
static uint64_t mem_limit(void) {
    const char *s = getenv("NIB_DEVICE_MEM_LIMIT");
    return (s && *s) ? strtoull(s, NULL, 0) : 0;
}

static int is_sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorUnknown:
        return 1;
    default:
        return 0;
    }
}

nib_status nib_cuda_status(int err, const char *what, const char *file, int line) {
    cudaError_t e = (cudaError_t)err;
    const char *name = cudaGetErrorName(e), *desc = cudaGetErrorString(e);
    nib_status st;
    if (is_sticky(e)) {
        st = NIB_ERR_DEVICE_LOST;
        return nib_set_error(st, file, line,
                             "device lost: %s failed with %s (%s); the CUDA context is unusable, "
                             "restart the process",
                             what, name, desc);
    }
    switch (e) {
    case cudaErrorMemoryAllocation: st = NIB_ERR_DEVICE_OOM; break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable: st = NIB_ERR_NO_DEVICE; break;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion: st = NIB_ERR_UNSUPPORTED_DEVICE; break;
    default: st = NIB_ERR_CUDA; break;
    }
    return nib_set_error(st, file, line, "%s failed with %s (%s)", what, name, desc);
}

static int g_ordinal = -1;

static int pick_ordinal(void) {
    if (g_ordinal < 0) {
        const char *s = getenv("NIB_DEVICE");
        g_ordinal = (s && *s) ? atoi(s) : 0;
    }
    return g_ordinal;
}

nib_status nib_device_query(nib_device_info *info) {
    nib_device_info d;
    memset(&d, 0, sizeof d);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError(); /* unchecked: clearing the error just reported below */
        if (info) *info = d;
        if (e == cudaSuccess || e == cudaErrorNoDevice)
            return NIB_ERR(NIB_ERR_NO_DEVICE, "no CUDA device found");
        return NIB_ERR(NIB_ERR_NO_DEVICE, "no CUDA device usable: %s (%s)", cudaGetErrorName(e),
                       cudaGetErrorString(e));
    }
    int ord = pick_ordinal();
    if (ord < 0 || ord >= count)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_DEVICE=%d but %d CUDA device(s) are present", ord,
                       count);
    NIB_CUDA_CHECK(cudaSetDevice(ord));
    struct cudaDeviceProp p;
    NIB_CUDA_CHECK(cudaGetDeviceProperties(&p, ord));
    d.ordinal = ord;
    snprintf(d.name, sizeof d.name, "%s", p.name);
    d.real_cc_major = d.cc_major = p.major;
    d.real_cc_minor = d.cc_minor = p.minor;
    d.sm_count = p.multiProcessorCount;
    d.l2_bytes = p.l2CacheSize;
    d.smem_per_block_optin = (int)p.sharedMemPerBlockOptin;
    d.smem_per_sm = (int)p.sharedMemPerMultiprocessor;
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, ord) == cudaSuccess)
        d.mem_clock_khz = v;
    else
        cudaGetLastError(); /* unchecked: clearing; the attribute is optional (0 = not reported) */
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, ord) == cudaSuccess)
        d.mem_bus_width = v;
    else
        cudaGetLastError(); /* unchecked: clearing; the attribute is optional (0 = not reported) */
    NIB_CUDA_CHECK(cudaDriverGetVersion(&d.driver_version));
    NIB_CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version));
    size_t fr = 0, tot = 0;
    NIB_CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    d.free_mem = fr;
    d.total_mem = tot;
    const char *fake = getenv("NIB_FAKE_CC");
    if (fake && *fake) {
        int ma = 0, mi = 0;
        if (sscanf(fake, "%d.%d", &ma, &mi) < 1)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_FAKE_CC='%s' is not MAJOR.MINOR", fake);
        d.cc_major = ma;
        d.cc_minor = mi;
        d.cc_overridden = 1;
    }
    if (info) *info = d;
    return NIB_OK;
}

nib_status nib_device_require(nib_device_info *info) {
    nib_device_info d;
    NIB_RETURN_IF_ERR(nib_device_query(&d));
    if (info) *info = d;
    if (d.cc_major * 10 + d.cc_minor < NIB_MIN_CC_MAJOR * 10 + NIB_MIN_CC_MINOR)
        return NIB_ERR(NIB_ERR_UNSUPPORTED_DEVICE,
                       "device %d '%s' has compute capability %d.%d%s; nib's CUDA kernels need "
                       "%d.%d or newer (Hopper sm_90a)",
                       d.ordinal, d.name, d.cc_major, d.cc_minor,
                       d.cc_overridden ? " (set by NIB_FAKE_CC)" : "", NIB_MIN_CC_MAJOR,
                       NIB_MIN_CC_MINOR);
    /* This build's kernels are compiled for sm_90a only: arch-specific code runs on 9.0 alone. */
    if (d.cc_major != 9)
        return NIB_ERR(NIB_ERR_UNSUPPORTED_DEVICE,
                       "device %d '%s' has compute capability %d.%d%s; this build's kernels are "
                       "compiled for sm_90a (Hopper) only",
                       d.ordinal, d.name, d.cc_major, d.cc_minor,
                       d.cc_overridden ? " (set by NIB_FAKE_CC)" : "");
    return NIB_OK;
}

int nib_device_available(void) {
    nib_device_info d;
    nib_status st = nib_device_require(&d);
    nib_clear_error();
    return st == NIB_OK;
}

nib_status nib_dev_malloc(void **p, size_t bytes, const char *what) {
    *p = NULL;
    uint64_t lim = mem_limit();
    size_t fr = 0, tot = 0;
    if (lim && g_allocated + bytes > lim) {
        return NIB_ERR(NIB_ERR_DEVICE_OOM,
                       "out of device memory allocating %s: asked %zu bytes, %llu free under "
                       "NIB_DEVICE_MEM_LIMIT=%llu (%llu already allocated by nib)",
                       what, bytes, (unsigned long long)(lim > g_allocated ? lim - g_allocated : 0),
                       (unsigned long long)lim, (unsigned long long)g_allocated);
    }
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError(); /* unchecked: clearing the (non-sticky) allocation error */
            cudaError_t ie = cudaMemGetInfo(&fr, &tot);
            if (ie != cudaSuccess) {
                /* the OOM is still the error; say the free figure is unknown rather than 0 */
                cudaGetLastError(); /* unchecked: clearing the query's error */
                return NIB_ERR(NIB_ERR_DEVICE_OOM,
                               "out of device memory allocating %s: asked %zu bytes, free unknown "
                               "(cudaMemGetInfo failed with %s) (%llu allocated by nib)",
                               what, bytes, cudaGetErrorName(ie), (unsigned long long)g_allocated);
            }
            return NIB_ERR(NIB_ERR_DEVICE_OOM,
                           "out of device memory allocating %s: asked %zu bytes, %zu free of %zu "
                           "(%llu allocated by nib)",
                           what, bytes, fr, tot, (unsigned long long)g_allocated);
        }
        return nib_cuda_status((int)e, what, __FILE__, __LINE__);
    }
    g_allocated += bytes;
    return NIB_OK;
}

void nib_dev_free(void *p, size_t bytes) {
    if (!p) return;
    cudaFree(p); /* unchecked: a free function has no status; a sticky error shows at the next call */
    g_allocated = g_allocated >= bytes ? g_allocated - bytes : 0;
}

nib_status nib_host_mapped_alloc(void **host, void **dev, size_t bytes, const char *what) {
    *host = *dev = NULL;
    cudaError_t e = cudaHostAlloc(host, bytes ? bytes : 1, cudaHostAllocMapped);
    if (e != cudaSuccess) {
        *host = NULL;
        return nib_cuda_status((int)e, what, __FILE__, __LINE__);
    }
    memset(*host, 0, bytes);
    e = cudaHostGetDevicePointer(dev, *host, 0);
    if (e != cudaSuccess) {
        cudaFreeHost(*host); /* unchecked: already failing with the mapping's error */
        *host = *dev = NULL;
        return nib_cuda_status((int)e, what, __FILE__, __LINE__);
    }
    return NIB_OK;
}

void nib_host_mapped_free(void *host) {
    if (host) cudaFreeHost(host); /* unchecked: a free function has no status */
}

/* cudaMemcpy from pageable memory may return before the DMA has landed, and cudaMemset /
 * device-to-device cudaMemcpy return before they run: each is then only ordered on the legacy
 * default stream, not against work the caller queues next on a non-blocking stream (found when
 * a test's poison fill, queued before a graph launch on its own stream, landed on top of the
 * kernel's output under compute-sanitizer initcheck). Waiting on the legacy stream makes these
 * helpers complete on return, as device.h says. */
nib_status nib_dev_upload(void *dst, const void *src, size_t bytes) {
    NIB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    NIB_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)0));
    return NIB_OK;
}
nib_status nib_dev_download(void *dst, const void *src, size_t bytes) {
    NIB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return NIB_OK;
}
nib_status nib_dev_memset(void *dst, int value, size_t bytes) {
    NIB_CUDA_CHECK(cudaMemset(dst, value, bytes));
    NIB_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)0));
    return NIB_OK;
}
nib_status nib_dev_copy(void *dst, const void *src, size_t bytes) {
    NIB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    NIB_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)0));
    return NIB_OK;
}
nib_status nib_dev_sync(void) {
    NIB_CUDA_CHECK(cudaDeviceSynchronize());
    return NIB_OK;
}

#endif /* NIB_HAVE_CUDA */

nib_status nib_dev_arena_init(nib_dev_arena *a, size_t cap, const char *what) {
    memset(a, 0, sizeof *a);
    snprintf(a->what, sizeof a->what, "%s", what ? what : "arena");
    void *p = NULL;
    NIB_RETURN_IF_ERR(nib_dev_malloc(&p, cap, a->what));
    a->base = p;
    a->cap = cap;
    return NIB_OK;
}

nib_status nib_dev_arena_alloc(nib_dev_arena *a, size_t bytes, void **out, const char *what) {
    uint64_t off, end;
    if (nib_pad_overflow_u64(a->used, 256, &off) || nib_add_overflow_u64(off, bytes, &end))
        return NIB_ERR(NIB_ERR_OVERFLOW, "%s: allocation of %zu bytes overflows", a->what, bytes);
    if (end > a->cap)
        return NIB_ERR(NIB_ERR_DEVICE_OOM,
                       "%s: %s needs %zu bytes but only %zu of %zu remain (plan too small)",
                       a->what, what ? what : "buffer", bytes, a->cap - (size_t)off, a->cap);
    *out = a->base + off;
    a->used = (size_t)end;
    if (a->used > a->high_water) a->high_water = a->used;
    return NIB_OK;
}

void nib_dev_arena_reset(nib_dev_arena *a) { a->used = 0; }

void nib_dev_arena_free(nib_dev_arena *a) {
    if (!a) return;
    if (a->base) nib_dev_free(a->base, a->cap);
    memset(a, 0, sizeof *a);
}
