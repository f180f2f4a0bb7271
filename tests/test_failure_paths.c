/* test_failure_paths.c — the failure paths of issue 7, each a status + message (docs/reliability.md
 * has the table of paths and where each is tested):
 *   no GPU / CPU-only build          -> NIB_ERR_NO_DEVICE          (skips when a GPU is present)
 *   compute capability too old       -> NIB_ERR_UNSUPPORTED_DEVICE (NIB_FAKE_CC; GPU only)
 *   out of device memory             -> NIB_ERR_DEVICE_OOM with bytes asked and free (GPU only;
 *                                       the arena part runs everywhere)
 *   sticky CUDA error                -> NIB_ERR_DEVICE_LOST naming the op and file:line (the
 *                                       mapping everywhere; a real illegal-address fault in a
 *                                       child process on the GPU)
 *   truncated / malformed checkpoint -> NIB_ERR_FORMAT / NIB_ERR_IO naming the path (what
 *                                       tests/test_safetensors.c does not already cover)
 *   missing / mis-shaped tensor      -> NIB_ERR_NOT_FOUND / NIB_ERR_SHAPE naming the tensor
 *   NaN / Inf in weights             -> NIB_ERR_NUMERICS naming the tensor and element
 * Every check also asserts that nothing was handed out on failure. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "io/qcheckpoint.h"
#include "io/safetensors.h"
#include "models/pi05_keys.h"
#include "runtime/backend.h"
#include "runtime/device.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static int has(const char *msg, const char *part) { return strstr(msg, part) != NULL; }

#define CHECK_HAS(part)                                                                       \
    CHECK_MSG(has(nib_last_error(), (part)), "message '%s' lacks '%s'", nib_last_error(), (part))

static int write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n;
}

/* A valid safetensors file in memory: [N][header][data]; returns its length (0 on error). */
static size_t st_bytes(unsigned char *buf, size_t cap, const char *header, const void *data,
                       size_t data_len) {
    size_t hl = strlen(header), len = 8 + hl + data_len;
    if (len > cap) return 0;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (data_len) memcpy(buf + 8 + hl, data, data_len);
    return len;
}

/* Set an environment variable for one call, restoring what was there before. */
typedef struct env_save {
    char name[64];
    char *old;
} env_save;

static void env_set(env_save *s, const char *name, const char *value) {
    const char *o = getenv(name);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->old = o ? strdup(o) : NULL;
    setenv(name, value, 1);
}

static void env_restore(env_save *s) {
    if (s->old) setenv(s->name, s->old, 1);
    else unsetenv(s->name);
    free(s->old);
    s->old = NULL;
}

/* ---- no GPU ----------------------------------------------------------------------------- */

NIB_TEST(fail_no_gpu_is_no_device) {
    nib_device_info info;
    if (nib_test_have_gpu())
        SKIP("a usable CUDA device is present, so the no-GPU path cannot be reached here "
             "(it runs on every CPU-only machine, CI included)");
    nib_status q = nib_device_query(&info);
    if (q == NIB_OK)
        SKIP("a CUDA device is present (compute capability %d.%d) but unusable by nib: "
             "fail_fake_cc_* covers that path",
             info.cc_major, info.cc_minor);
    CHECK_MSG(q == NIB_ERR_NO_DEVICE, "nib_device_query -> %s (%s)", nib_status_name(q),
              nib_last_error());
    CHECK(nib_last_error()[0] != '\0');
    CHECK(has(nib_last_error(), "CUDA"));
    CHECK_ST(nib_device_require(&info), NIB_ERR_NO_DEVICE);
    CHECK(nib_last_error()[0] != '\0');
    CHECK(nib_device_available() == 0);
    /* device memory: the request is refused, named, and nothing is handed out */
    void *p = (void *)&info;
    CHECK_ST(nib_dev_malloc(&p, 1024, "test buffer"), NIB_ERR_NO_DEVICE);
    CHECK(p == NULL);
    CHECK_HAS("test buffer");
    nib_dev_free(NULL, 0); /* a no-op, also without a device */
    CHECK(nib_dev_allocated() == 0);
    /* the CUDA backend's entry point */
    nib_be be;
    nib_be_sizes sz = {1 << 20, 1 << 20, 16, 256, 256, 0};
    CHECK_ST(nib_be_init(&be, NIB_BE_CUDA, &sz), NIB_ERR_NO_DEVICE);
    CHECK(nib_last_error()[0] != '\0');
    nib_be_free(&be); /* safe after a failed init */
    /* the reference backend still works without a device */
    CHECK_OK(nib_be_init(&be, NIB_BE_REF, &sz));
    nib_be_free(&be);
}

/* ---- unsupported compute capability (NIB_FAKE_CC is read on every query) ------------------ */

NIB_TEST(fail_fake_cc_unsupported_device) {
    nib_device_info info;
    env_save e;
    NIB_REQUIRE_GPU();
    env_set(&e, "NIB_FAKE_CC", "8.0");
    nib_status st = nib_device_require(&info);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", nib_last_error());
    nib_be be;
    nib_be_sizes sz = {1 << 20, 1 << 20, 16, 256, 256, 0};
    nib_status be_st = nib_be_init(&be, NIB_BE_CUDA, &sz); /* an entry point applies the gate */
    nib_be_free(&be);
    env_restore(&e);
    CHECK_MSG(st == NIB_ERR_UNSUPPORTED_DEVICE, "NIB_FAKE_CC=8.0: %s (%s)", nib_status_name(st), msg);
    CHECK_MSG(has(msg, "8.0") && has(msg, "9.0"), "message '%s' must name 8.0 and 9.0", msg);
    CHECK_MSG(has(msg, "NIB_FAKE_CC"), "message '%s' must say the capability was faked", msg);
    CHECK(info.cc_overridden == 1 && info.cc_major == 8 && info.cc_minor == 0);
    CHECK(info.real_cc_major >= 9);
    CHECK_MSG(be_st == NIB_ERR_UNSUPPORTED_DEVICE, "nib_be_init under NIB_FAKE_CC=8.0: %s",
              nib_status_name(be_st));
    /* newer than this build's sm_90a kernels */
    env_set(&e, "NIB_FAKE_CC", "10.0");
    st = nib_device_require(NULL);
    snprintf(msg, sizeof msg, "%s", nib_last_error());
    env_restore(&e);
    CHECK_MSG(st == NIB_ERR_UNSUPPORTED_DEVICE && has(msg, "10.0"), "NIB_FAKE_CC=10.0: %s (%s)",
              nib_status_name(st), msg);
    /* a malformed override is an argument error, not a silent pass */
    env_set(&e, "NIB_FAKE_CC", "hopper");
    st = nib_device_require(NULL);
    env_restore(&e);
    CHECK_MSG(st == NIB_ERR_INVALID_ARG, "NIB_FAKE_CC=hopper: %s", nib_status_name(st));
    /* and without the override the real device passes again */
    CHECK_OK(nib_device_require(&info));
    CHECK(info.cc_overridden == 0);
}

/* ---- out of device memory --------------------------------------------------------------- */

/* Out of device memory, first through the NIB_DEVICE_MEM_LIMIT knob, then for real (more than
 * the device has, no knob involved) through nib_dev_malloc and the CUDA backend's entry point.
 * device.c reads the knob at every allocation, so both parts run in a full test run too (after
 * earlier tests allocated), and unsetting the knob lifts the limit at once. */
NIB_TEST(fail_device_oom_reports_bytes) {
    NIB_SKIP_UNDER_SANITIZER("it fails allocations on purpose");
    nib_device_info info;
    NIB_REQUIRE_GPU();
    REQUIRE(nib_device_query(&info) == NIB_OK);
    uint64_t before = nib_dev_allocated();
    void *p = (void *)&info;
    /* the knob: 1 MiB of headroom, ask 2 MiB */
    env_save e;
    char lim[32], msg[1024];
    snprintf(lim, sizeof lim, "%llu", (unsigned long long)(before + (1u << 20)));
    env_set(&e, "NIB_DEVICE_MEM_LIMIT", lim);
    nib_status st = nib_dev_malloc(&p, 2u << 20, "limited test buffer");
    snprintf(msg, sizeof msg, "%s", nib_last_error());
    void *q = (void *)&info; /* under the limit: 512 KiB of the 1 MiB headroom */
    nib_status st_small = nib_dev_malloc(&q, 512u << 10, "small limited buffer");
    env_restore(&e);
    CHECK_MSG(st == NIB_ERR_DEVICE_OOM, "limited: %s (%s)", nib_status_name(st), msg);
    CHECK_MSG(has(msg, "2097152") && has(msg, "free") && has(msg, "NIB_DEVICE_MEM_LIMIT") &&
                  has(msg, "limited test buffer"),
              "message '%s' must name the buffer, the bytes asked (2097152), free, the knob", msg);
    if (st == NIB_OK) nib_dev_free(p, 2u << 20);
    else CHECK(p == NULL);
    CHECK_OK(st_small);
    if (st_small == NIB_OK) nib_dev_free(q, 512u << 10);
    /* the knob is gone: the same 2 MiB request passes (read at every allocation) */
    p = NULL;
    CHECK_OK(nib_dev_malloc(&p, 2u << 20, "unlimited test buffer"));
    nib_dev_free(p, 2u << 20);
    /* real OOM: 1 TiB more than the device has */
    uint64_t huge = info.total_mem + (UINT64_C(1) << 40);
    char asked[32];
    snprintf(asked, sizeof asked, "%llu", (unsigned long long)huge);
    p = (void *)&info;
    CHECK_ST(nib_dev_malloc(&p, (size_t)huge, "huge test buffer"), NIB_ERR_DEVICE_OOM);
    CHECK(p == NULL);
    CHECK_HAS("huge test buffer");
    CHECK_HAS(asked);
    CHECK_HAS("free");
    CHECK(nib_dev_allocated() == before);
    /* OOM is not sticky: the device still works */
    CHECK_OK(nib_dev_malloc(&p, 4096, "small test buffer"));
    nib_dev_free(p, 4096);
    CHECK_OK(nib_dev_sync());
    nib_be be;
    nib_be_sizes sz = {huge, 1 << 20, 16, 256, 256, 0};
    CHECK_ST(nib_be_init(&be, NIB_BE_CUDA, &sz), NIB_ERR_DEVICE_OOM);
    CHECK_HAS("weight slab");
    nib_be_free(&be);
    CHECK(nib_dev_allocated() == before);
}

/* The arena's "plan too small" error is pure arithmetic: testable on any machine with a host
 * buffer standing in for the device allocation (never freed through nib_dev_arena_free). */
NIB_TEST(fail_arena_overflow_is_device_oom) {
    static unsigned char host[4096];
    nib_dev_arena a;
    memset(&a, 0, sizeof a);
    a.base = host;
    a.cap = sizeof host;
    snprintf(a.what, sizeof a.what, "test arena");
    void *p = NULL;
    CHECK_OK(nib_dev_arena_alloc(&a, 1000, &p, "first"));
    CHECK(p == host && a.used == 1000);
    CHECK_ST(nib_dev_arena_alloc(&a, 4000, &p, "second buffer"), NIB_ERR_DEVICE_OOM);
    CHECK_HAS("test arena");
    CHECK_HAS("second buffer");
    CHECK_HAS("4000");
    CHECK(a.used == 1000); /* a failed allocation takes nothing */
    CHECK_ST(nib_dev_arena_alloc(&a, SIZE_MAX - 8, &p, "absurd"), NIB_ERR_OVERFLOW);
    CHECK(a.used == 1000);
    CHECK_OK(nib_dev_arena_alloc(&a, 4096 - 1024, &p, "rest")); /* 1000 pads to 1024 */
    CHECK(p == host + 1024 && a.used == 4096 && a.high_water == 4096);
    nib_dev_arena_reset(&a);
    CHECK(a.used == 0 && a.high_water == 4096);
}

/* ---- sticky CUDA error -> device lost ------------------------------------------------------ */

/* nib_cuda_status maps a CUDA error code; no device is needed (cudaGetErrorName works without
 * one). Codes from the CUDA runtime's cudaError enum. */
NIB_TEST(fail_sticky_cuda_error_is_device_lost) {
    const char *op = "cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost)";
    if (!nib_device_built_with_cuda()) {
        /* CPU-only build: the mapping still yields a message with op and file:line */
        CHECK_ST(nib_cuda_status(700, op, "ops/cuda/x.cu", 42), NIB_ERR_CUDA);
        CHECK_HAS(op);
        CHECK_HAS("x.cu:42");
        return;
    }
    static const struct {
        int code;
        nib_status want;
        const char *name;
    } k[] = {
        {700, NIB_ERR_DEVICE_LOST, "cudaErrorIllegalAddress"},
        {716, NIB_ERR_DEVICE_LOST, "cudaErrorMisalignedAddress"},
        {719, NIB_ERR_DEVICE_LOST, "cudaErrorLaunchFailure"},
        {710, NIB_ERR_DEVICE_LOST, "cudaErrorAssert"},
        {2, NIB_ERR_DEVICE_OOM, "cudaErrorMemoryAllocation"},
        {100, NIB_ERR_NO_DEVICE, "cudaErrorNoDevice"},
        {209, NIB_ERR_UNSUPPORTED_DEVICE, "cudaErrorNoKernelImageForDevice"},
        {1, NIB_ERR_CUDA, "cudaErrorInvalidValue"},
    };
    for (size_t i = 0; i < NIB_ARRAY_LEN(k); i++) {
        nib_status st = nib_cuda_status(k[i].code, op, "ops/cuda/x.cu", 42);
        CHECK_MSG(st == k[i].want, "code %d -> %s, want %s", k[i].code, nib_status_name(st),
                  nib_status_name(k[i].want));
        CHECK_HAS(op);
        CHECK_HAS("x.cu:42");
        CHECK_HAS(k[i].name);
        if (k[i].want == NIB_ERR_DEVICE_LOST) CHECK_HAS("device lost");
    }
}

/* A real sticky error. The child (fail_device_lost_real_fault_child, re-executed through
 * /proc/self/exe with NIB_TEST_DEVICE_LOST_CHILD=1; it skips without the variable) launches a
 * kernel that writes to address 0x10 (tests/negative_control_gpu.cu), then calls nib APIs that
 * synchronize: each must return NIB_ERR_DEVICE_LOST with "device lost", the failing call and its
 * [file:line], and a later allocation must fail the same way (the error is sticky: reported, not
 * retried). The context is ruined, hence a process of its own; the parent checks the child's
 * exit status and its PASS line, and that its own device still works. */
#ifdef NIB_HAVE_CUDA
nib_status nib_test_fault_kernel_launch(void);
#endif

NIB_TEST(fail_device_lost_real_fault_child) {
    if (!getenv("NIB_TEST_DEVICE_LOST_CHILD"))
        SKIP("runs only as the child process of fail_device_lost_real_fault (it ruins the CUDA context)");
#ifndef NIB_HAVE_CUDA
    SKIP("CPU-only build");
#else
    NIB_REQUIRE_GPU();
    nib_be be;
    nib_be_sizes sz = {1 << 20, 1 << 20, 16, 256, 256, 0};
    REQUIRE(nib_be_init(&be, NIB_BE_CUDA, &sz) == NIB_OK);
    CHECK_OK(nib_be_sync(&be)); /* healthy before the fault */
    nib_status st = nib_test_fault_kernel_launch();
    /* the launch itself is valid; the fault may already show at its launch check (a race) */
    CHECK_MSG(st == NIB_OK || st == NIB_ERR_DEVICE_LOST, "fault launch: %s (%s)", nib_status_name(st),
              nib_last_error());
    CHECK_ST(nib_be_sync(&be), NIB_ERR_DEVICE_LOST);
    printf("  nib_be_sync after the fault: %s\n", nib_last_error());
    CHECK_HAS("device lost");
    CHECK_HAS("cudaStreamSynchronize");
    CHECK_HAS("cudaErrorIllegalAddress");
    CHECK_HAS("[backend.c:");
    CHECK_ST(nib_dev_sync(), NIB_ERR_DEVICE_LOST);
    CHECK_HAS("device lost");
    CHECK_HAS("cudaDeviceSynchronize");
    CHECK_HAS("[device.c:");
    void *p = NULL;
    CHECK_ST(nib_dev_malloc(&p, 4096, "after the fault"), NIB_ERR_DEVICE_LOST);
    CHECK(p == NULL);
    CHECK_HAS("restart the process");
    nib_be_free(&be);
#endif
}

NIB_TEST(fail_device_lost_real_fault) {
    NIB_SKIP_UNDER_SANITIZER("its child faults on purpose (memcheck reports the write; the negative control covers that)");
    NIB_REQUIRE_GPU();
    static char out[16384];
    const char *env[] = {"NIB_TEST_DEVICE_LOST_CHILD=1", NULL};
    int rc = nib_test_run_self("fail_device_lost_real_fault_child", env, out, sizeof out);
    CHECK_MSG(rc == 0 && has(out, "PASS fail_device_lost_real_fault_child") &&
                  has(out, "1 passed, 0 failed, 0 skipped"),
              "child exited %d with:\n%s", rc, out);
    CHECK_OK(nib_dev_sync()); /* this process's context is untouched */
}

/* ---- truncated / malformed checkpoints on disk (beyond tests/test_safetensors.c) ------------ */

#define ST_HDR "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"

/* Open must fail with want, leave f NULL, and name the path (and `part`, when given). */
static void expect_open_fails(nib_test_ctx *t, const char *path, nib_status want,
                              const char *part) {
    nib_st_file *f = (nib_st_file *)&f;
    nib_status st = nib_st_open(path, &f);
    CHECK_MSG(st == want, "%s: %s, want %s (%s)", path, nib_status_name(st),
              nib_status_name(want), nib_last_error());
    CHECK_MSG(f == NULL, "%s: a handle on failure", path);
    CHECK_MSG(has(nib_last_error(), path), "message '%s' lacks the path", nib_last_error());
    if (part) CHECK_HAS(part);
}

NIB_TEST(fail_checkpoint_truncated_or_malformed_files) {
    char path[512], dir[512], link[600];
    unsigned char buf[512];
    static const float data[4] = {1, 2, 3, 4};
    size_t len = st_bytes(buf, sizeof buf, ST_HDR, data, sizeof data);
    REQUIRE(len > 0);
    const char *tmp = nib_test_tmpdir();

    /* the intact file opens (the cases below differ from it in one way each) */
    snprintf(path, sizeof path, "%s/fp_ok.safetensors", tmp);
    REQUIRE(write_bytes(path, buf, len));
    nib_st_file *f = NULL;
    CHECK_OK(nib_st_open(path, &f));
    nib_st_close(f);

    /* 7 bytes: shorter than the length prefix */
    snprintf(path, sizeof path, "%s/fp_7bytes.safetensors", tmp);
    REQUIRE(write_bytes(path, buf, 7));
    expect_open_fails(t, path, NIB_ERR_FORMAT, "shorter than the 8-byte header length");
    /* cut inside the header */
    snprintf(path, sizeof path, "%s/fp_cut_header.safetensors", tmp);
    REQUIRE(write_bytes(path, buf, 20));
    expect_open_fails(t, path, NIB_ERR_FORMAT, "runs past the end");
    /* cut inside the data: the tensor now ends past the data section, and it is named */
    snprintf(path, sizeof path, "%s/fp_cut_data.safetensors", tmp);
    REQUIRE(write_bytes(path, buf, len - 5));
    expect_open_fails(t, path, NIB_ERR_FORMAT, "'w'");
    CHECK_HAS("exceeds the data section");
    /* bytes appended after the last tensor (a polyglot payload) */
    unsigned char more[600];
    memcpy(more, buf, len);
    memcpy(more + len, "#!/bin/sh\n", 10);
    snprintf(path, sizeof path, "%s/fp_appended.safetensors", tmp);
    REQUIRE(write_bytes(path, more, len + 10));
    expect_open_fails(t, path, NIB_ERR_FORMAT, "trailing bytes");
    /* a header length of 2^64 - 1 */
    memset(more, 0xFF, 8);
    memcpy(more + 8, buf + 8, len - 8);
    snprintf(path, sizeof path, "%s/fp_huge_n.safetensors", tmp);
    REQUIRE(write_bytes(path, more, len));
    expect_open_fails(t, path, NIB_ERR_OVERFLOW, NULL);

    /* OS-level: a regular file used as a directory, a dangling link, a link to a directory,
     * a name too long for the file system */
    snprintf(path, sizeof path, "%s/fp_ok.safetensors/inner.safetensors", tmp);
    expect_open_fails(t, path, NIB_ERR_IO, strerror(ENOTDIR));
    snprintf(link, sizeof link, "%s/fp_dangling.safetensors", tmp);
    snprintf(path, sizeof path, "%s/fp_nowhere", tmp);
    unlink(link);
    REQUIRE(symlink(path, link) == 0);
    expect_open_fails(t, link, NIB_ERR_IO, strerror(ENOENT));
    snprintf(dir, sizeof dir, "%s/fp_dir", tmp);
    mkdir(dir, 0700);
    snprintf(link, sizeof link, "%s/fp_dirlink.safetensors", tmp);
    unlink(link);
    REQUIRE(symlink(dir, link) == 0);
    expect_open_fails(t, link, NIB_ERR_IO, "not a regular file");
    /* one component longer than NAME_MAX (a whole path past PATH_MAX would not fit in the
     * 1 KiB message, and the reason comes after the path) */
    char longp[600];
    int n = snprintf(longp, sizeof longp, "%s/", tmp), end = n + NAME_MAX + 8;
    for (; n < end; n++) longp[n] = 'x';
    longp[n] = '\0';
    expect_open_fails(t, longp, NIB_ERR_IO, strerror(ENAMETOOLONG));
    /* an unreadable file (root reads everything: then this part cannot be exercised) */
    snprintf(path, sizeof path, "%s/fp_unreadable.safetensors", tmp);
    REQUIRE(write_bytes(path, buf, len));
    REQUIRE(chmod(path, 0) == 0);
    if (geteuid() != 0) expect_open_fails(t, path, NIB_ERR_IO, strerror(EACCES));
    chmod(path, 0600);
}

/* ---- a missing or mis-shaped tensor ------------------------------------------------------ */

NIB_TEST(fail_missing_or_misshaped_tensor_is_named) {
    unsigned char buf[512];
    static const float data[6] = {1, 2, 3, 4, 5, 6};
    size_t len = st_bytes(buf, sizeof buf,
                          "{\"model.a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                          "\"data_offsets\":[0,24]}}",
                          data, sizeof data);
    nib_st_file *f = NULL;
    REQUIRE(len > 0 && nib_st_open_memory(buf, len, &f) == NIB_OK);
    const nib_st_tensor *tt = NULL;
    /* the loader's lookup: "model." prefix tolerated, shapes and dtypes checked, names given */
    CHECK_OK(nib_pi05_need(f, "a.weight", 2, (const int64_t[]){2, 3}, &tt));
    CHECK(tt && tt->numel == 6);
    tt = NULL;
    CHECK_ST(nib_pi05_need(f, "b.weight", 2, (const int64_t[]){2, 3}, &tt), NIB_ERR_NOT_FOUND);
    CHECK_HAS("'b.weight'");
    CHECK(tt == NULL);
    CHECK_ST(nib_pi05_need(f, "a.weight", 2, (const int64_t[]){3, 2}, &tt), NIB_ERR_SHAPE);
    CHECK_HAS("'a.weight'");
    CHECK_HAS("[2, 3]");
    CHECK_HAS("[3, 2]");
    CHECK_ST(nib_pi05_need(f, "a.weight", 1, (const int64_t[]){6}, &tt), NIB_ERR_SHAPE);
    /* the quantized-layer importer: a layer that is not there, and one whose scale is mis-shaped */
    nib_qlinear q;
    CHECK_ST(nib_qckpt_get_linear(f, "nope", &q), NIB_ERR_NOT_FOUND);
    CHECK_HAS("nope");
    nib_st_close(f);
    /* FP8 weight [4,16] with a per-channel scale of 3 entries (N is 4) */
    unsigned char d2[64 + 12];
    memset(d2, 0x38, 64); /* E4M3 1.0 */
    float sc[3] = {1, 1, 1};
    memcpy(d2 + 64, sc, sizeof sc);
    len = st_bytes(buf, sizeof buf,
                   "{\"L.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,16],\"data_offsets\":[0,64]},"
                   "\"L.weight_scale\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[64,76]}}",
                   d2, sizeof d2);
    REQUIRE(len > 0 && nib_st_open_memory(buf, len, &f) == NIB_OK);
    nib_status st = nib_qckpt_get_linear(f, "L", &q);
    CHECK_MSG(st == NIB_ERR_SHAPE || st == NIB_ERR_FORMAT, "mis-shaped scale: %s (%s)",
              nib_status_name(st), nib_last_error());
    CHECK_HAS("L.weight_scale");
    CHECK(q.w.data == NULL && q.f32 == NULL);
    nib_st_close(f);
}

/* ---- NaN / Inf in weights ------------------------------------------------------------------ */

NIB_TEST(fail_nan_inf_weights_are_numerics_errors) {
    unsigned char buf[512];
    uint16_t w[2 * 16];
    for (int i = 0; i < 32; i++) w[i] = 0x3F80; /* bf16 1.0 */
    w[21] = 0x7FC0;                             /* NaN at row 1, col 5 */
    w[30] = 0x7F80;                             /* +Inf */
    size_t len = st_bytes(buf, sizeof buf,
                          "{\"L.weight\":{\"dtype\":\"BF16\",\"shape\":[2,16],"
                          "\"data_offsets\":[0,64]}}",
                          w, sizeof w);
    nib_st_file *f = NULL;
    REQUIRE(len > 0 && nib_st_open_memory(buf, len, &f) == NIB_OK);
    nib_qckpt_bad bad;
    nib_qckpt_scan_tensor(nib_st_find(f, "L.weight"), &bad);
    CHECK(bad.count == 2 && bad.first == 21);
    nib_qlinear q;
    nib_qckpt_opts o = {NIB_QCKPT_CHECK_ELEMENTS, NULL};
    CHECK_ST(nib_qckpt_get_linear_ex(f, "L", &o, &q), NIB_ERR_NUMERICS);
    CHECK_HAS("L.weight");
    CHECK_HAS("NaN");
    CHECK(q.w.data == NULL);
    /* the element scan is opt-in: without it the layer imports (loading stays O(header)) */
    CHECK_OK(nib_qckpt_get_linear(f, "L", &q));
    nib_qlinear_free(&q);
    nib_st_close(f);
    /* FP8 E4M3 weights: 0x7F is NaN (e4m3fn has no Inf) */
    unsigned char d[64 + 4];
    memset(d, 0x38, 64);
    d[17] = 0x7F;
    float one = 1.0f;
    memcpy(d + 64, &one, 4);
    len = st_bytes(buf, sizeof buf,
                   "{\"L.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,16],\"data_offsets\":[0,64]},"
                   "\"L.weight_scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[64,68]}}",
                   d, sizeof d);
    REQUIRE(len > 0 && nib_st_open_memory(buf, len, &f) == NIB_OK);
    CHECK_ST(nib_qckpt_get_linear_ex(f, "L", &o, &q), NIB_ERR_NUMERICS);
    CHECK_HAS("L.weight");
    nib_st_close(f);
}
