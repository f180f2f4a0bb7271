/* test_base.c — status/error model, checked arithmetic at the edges, tensor descriptors, RNG. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/device.h"

NIB_TEST(base_status_names_distinct) {
    /* every status in the enum has its own name, and unknown values map to a fallback */
    for (int a = NIB_OK; a <= NIB_ERR_INTERNAL; a++) {
        CHECK(strncmp(nib_status_name((nib_status)a), "NIB_", 4) == 0);
        CHECK(strcmp(nib_status_name((nib_status)a), "NIB_ERR_UNKNOWN") != 0);
        for (int b = a + 1; b <= NIB_ERR_INTERNAL; b++)
            CHECK(strcmp(nib_status_name((nib_status)a), nib_status_name((nib_status)b)) != 0);
    }
    CHECK(strcmp(nib_status_name((nib_status)999), "NIB_ERR_UNKNOWN") == 0);
}

NIB_TEST(base_error_message_names_file_line) {
    nib_status st = NIB_ERR(NIB_ERR_FORMAT, "tensor '%s' bad at byte %d", "w", 42);
    CHECK(st == NIB_ERR_FORMAT);
    const char *m = nib_last_error();
    CHECK(strstr(m, "tensor 'w' bad at byte 42") != NULL);
    CHECK(strstr(m, "test_base.c:") != NULL);
    nib_error_context(st, "loading '%s'", "model.safetensors");
    CHECK(strncmp(nib_last_error(), "loading 'model.safetensors': tensor 'w'", 38) == 0);
    nib_clear_error();
    CHECK(nib_last_error()[0] == '\0');
}

NIB_TEST(base_checked_arithmetic_edges) {
    uint64_t r;
    CHECK(!nib_add_overflow_u64(UINT64_MAX - 1, 1, &r) && r == UINT64_MAX);
    CHECK(nib_add_overflow_u64(UINT64_MAX, 1, &r));
    CHECK(!nib_mul_overflow_u64(UINT64_C(1) << 32, (UINT64_C(1) << 32) - 1, &r));
    CHECK(nib_mul_overflow_u64(UINT64_C(1) << 32, UINT64_C(1) << 32, &r));
    CHECK(!nib_pad_overflow_u64(13, 8, &r) && r == 16);
    CHECK(!nib_pad_overflow_u64(16, 8, &r) && r == 16);
    CHECK(nib_pad_overflow_u64(UINT64_MAX - 2, 8, &r)); /* the GGML_PAD wrap */
    CHECK(nib_pad_overflow_u64(5, 0, &r));
    size_t s;
    CHECK(nib_mul_overflow_size(SIZE_MAX / 2 + 1, 2, &s));
    int64_t shp[3] = {INT64_MAX, 2, 1};
    CHECK(!nib_shape_numel_overflow(shp, 3, &r) && r == (uint64_t)INT64_MAX * 2); /* fits in u64 */
    int64_t shp2[3] = {INT64_MAX, 4, 1};
    CHECK(nib_shape_numel_overflow(shp2, 3, &r));
    int64_t neg[2] = {3, -1};
    CHECK(nib_shape_numel_overflow(neg, 2, &r));
}

NIB_TEST(base_tensor_desc) {
    nib_tensor_desc d;
    int64_t shape[3] = {2, 3, 5};
    CHECK_OK(nib_tensor_desc_init(&d, NIB_DTYPE_BF16, 3, shape));
    CHECK(d.numel == 30 && d.nbytes == 60);
    CHECK(d.strides[0] == 15 && d.strides[1] == 5 && d.strides[2] == 1);
    CHECK(nib_tensor_desc_is_contiguous(&d));
    /* scalar */
    CHECK_OK(nib_tensor_desc_init(&d, NIB_DTYPE_F32, 0, NULL));
    CHECK(d.numel == 1 && d.nbytes == 4);
    /* byte count overflow: numel fits in u64 but * 8 bytes does not fit in int64 */
    int64_t big[2] = {INT64_C(1) << 31, INT64_C(1) << 30};
    CHECK_ST(nib_tensor_desc_init(&d, NIB_DTYPE_F64, 2, big), NIB_ERR_OVERFLOW);
    int64_t huge[4] = {INT64_C(1) << 40, INT64_C(1) << 40, INT64_C(1) << 40, 0};
    CHECK_ST(nib_tensor_desc_init(&d, NIB_DTYPE_U8, 4, huge), NIB_ERR_OVERFLOW);
    int64_t bad[2] = {3, -2};
    CHECK_ST(nib_tensor_desc_init(&d, NIB_DTYPE_U8, 2, bad), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_tensor_desc_init(&d, NIB_DTYPE_U8, 9, shape), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_tensor_desc_init(&d, NIB_DTYPE_INVALID, 1, shape), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_tensor_desc_init(&d, (nib_dtype)77, 1, shape), NIB_ERR_INVALID_ARG);
    /* strided: a transposed [3,2] view of a [2,3] buffer spans 6 elements */
    int64_t ts[2] = {3, 2}, st[2] = {1, 3};
    CHECK_OK(nib_tensor_desc_init_strided(&d, NIB_DTYPE_F32, 2, ts, st));
    CHECK(d.nbytes == 24 && !nib_tensor_desc_is_contiguous(&d));
    int64_t sts[2] = {INT64_MAX, INT64_MAX};
    CHECK_ST(nib_tensor_desc_init_strided(&d, NIB_DTYPE_F32, 2, ts, sts), NIB_ERR_OVERFLOW);
}

NIB_TEST(base_dtype_names_roundtrip) {
    for (int i = 1; i < NIB_DTYPE_COUNT; i++) {
        const char *n = nib_dtype_name((nib_dtype)i);
        CHECK(nib_dtype_from_name(n, strlen(n)) == (nib_dtype)i);
        CHECK(nib_dtype_size((nib_dtype)i) > 0);
    }
    CHECK(nib_dtype_from_name("BF1", 3) == NIB_DTYPE_INVALID);
    CHECK(nib_dtype_from_name("BF16x", 5) == NIB_DTYPE_INVALID);
    CHECK(nib_dtype_size(NIB_DTYPE_INVALID) == 0);
}

NIB_TEST(base_rng_determinism_and_moments) {
    nib_rng a, b;
    nib_rng_seed(&a, 123);
    nib_rng_seed(&b, 123);
    for (int i = 0; i < 100; i++) CHECK(nib_rng_u64(&a) == nib_rng_u64(&b));
    /* N(0,1) sample moments over n draws: |mean| < 5/sqrt(n), |var-1| < 5*sqrt(2/n) */
    int n = 200000;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        double x = nib_rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    CHECK_MSG(fabs(mean) < 5.0 / sqrt(n), "mean %g", mean);
    CHECK_MSG(fabs(var - 1.0) < 5.0 * sqrt(2.0 / n), "var %g", var);
    /* Student-t nu=5 has variance nu/(nu-2) = 5/3; its 4th moment is finite so the check is fair */
    s = s2 = 0;
    for (int i = 0; i < n; i++) {
        double x = nib_rng_student_t(&a, 5.0);
        s += x;
        s2 += x * x;
    }
    var = s2 / n - (s / n) * (s / n);
    CHECK_MSG(fabs(var - 5.0 / 3.0) < 0.05, "t5 var %g", var);
}

/* nib_copy_finite_f32 on both of its paths (AVX2 + streaming stores where the CPU has it, and the
 * portable loop): every length class (head to alignment, 32-value body, tail), every destination
 * alignment, the bits copied exactly (NaN payloads, -0, subnormals, FLT_MAX), nothing written
 * outside [dst, dst + n), and one Inf or NaN anywhere (head, each lane of a body block, tail) found. */
static int copy_case(nib_test_ctx *t, nib_rng *r, uint64_t n, int off, uint64_t bad_at, uint32_t bad_bits) {
    static uint32_t src[4200], dst[4200 + 16];
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu};
    for (uint64_t i = 0; i < n; i++)
        src[i] = i % 13 == 5 ? special[(i / 13) % 6] : (uint32_t)nib_rng_u64(r) & 0xBF7FFFFFu; /* finite: exponent < 255 */
    if (bad_at < n) src[bad_at] = bad_bits;
    for (size_t i = 0; i < NIB_ARRAY_LEN(dst); i++) dst[i] = 0xA5A5A5A5u;
    const bool ok = nib_copy_finite_f32((float *)(dst + off), (const float *)src, n);
    int fails = 0;
    if (ok != (bad_at >= n)) fails++;
    if (n && memcmp(dst + off, src, n * 4)) fails++;
    for (int i = 0; i < off; i++) fails += dst[i] != 0xA5A5A5A5u;
    for (size_t i = off + n; i < NIB_ARRAY_LEN(dst); i++) fails += dst[i] != 0xA5A5A5A5u;
    CHECK_MSG(!fails, "n %llu dst offset %d, non-finite %08x at %llu: returned %d (%d faults)", (unsigned long long)n, off,
              bad_bits, (unsigned long long)bad_at, (int)ok, fails);
    return !fails;
}
NIB_TEST(base_copy_finite_f32) {
    nib_rng r;
    nib_test_rng(t, &r);
    const uint64_t ns[] = {0, 1, 7, 8, 31, 32, 63, 64, 65, 95, 96, 97, 127, 128, 200, 1000, 4096 + 3};
    const uint32_t nonfinite[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu};
    for (int path = 0; path < 2; path++) {
        if (path) setenv("NIB_COPY_AVX2", "0", 1);
        int bad = 0;
        for (size_t a = 0; a < NIB_ARRAY_LEN(ns) && !bad; a++)
            for (int off = 0; off < 8 && !bad; off++) {
                const uint64_t n = ns[a];
                bad |= !copy_case(t, &r, n, off, UINT64_MAX, 0);
                /* one non-finite value at each position of the first 80, around the middle, and the last 40 */
                for (uint64_t at = 0; at < n && !bad; at++) {
                    if (at >= 80 && (at < n / 2 - 20 || at > n / 2 + 20) && at + 40 < n) continue;
                    bad |= !copy_case(t, &r, n, off, at, nonfinite[(at + (uint64_t)off) % 5]);
                }
            }
        unsetenv("NIB_COPY_AVX2");
    }
}

/* nearest-rank quantiles: checked against a count of the values at or below each answer */
NIB_TEST(base_sort_and_quantiles) {
    double v[] = {5, 1, 4, 1, 3, 9, 2, 6, 5, 3};
    nib_sort_doubles(v, 10);
    for (int i = 1; i < 10; i++) CHECK(v[i - 1] <= v[i]);
    CHECK(v[0] == 1 && v[9] == 9);
    CHECK(nib_quantile_sorted(v, 10, 0.0) == 1 && nib_quantile_sorted(v, 10, 1.0) == 9);
    CHECK(nib_quantile_sorted(v, 10, 0.5) == 3);  /* 5th of 10 */
    CHECK(nib_quantile_sorted(v, 10, 0.51) == 4); /* ceil(5.1) = 6th */
    CHECK(nib_quantile_sorted(v, 10, 0.9) == 6);  /* 9th */
    CHECK(nib_quantile_sorted(v, 10, 0.99) == 9); /* 10th */
    const double one = 7;
    CHECK(nib_quantile_sorted(&one, 1, 0.0) == 7 && nib_quantile_sorted(&one, 1, 0.99) == 7);
    /* 100 and 1000 distinct values: p99 is the 99th / 990th, p90 the 90th / 900th (no rounding past them) */
    static double w[1000];
    for (size_t n = 100; n <= 1000; n *= 10) {
        for (size_t i = 0; i < n; i++) w[i] = (double)(n - i); /* descending: the sort has work */
        nib_sort_doubles(w, n);
        const double qs[] = {0.5, 0.9, 0.99, 0.999};
        for (int k = 0; k < 4; k++) {
            const double a = nib_quantile_sorted(w, n, qs[k]);
            size_t at_or_below = 0;
            for (size_t i = 0; i < n; i++) at_or_below += w[i] <= a;
            /* the smallest value with at least q * n at or below it */
            CHECK_MSG((double)at_or_below >= qs[k] * (double)n - 1e-9 && (double)(at_or_below - 1) < qs[k] * (double)n - 1e-9,
                      "n %zu q %g: %g has %zu at or below", n, qs[k], a, at_or_below);
        }
    }
}

NIB_TEST(base_device_layer_without_gpu) {
    if (nib_test_have_gpu()) SKIP("a GPU is present: the no-device path is covered elsewhere");
    nib_device_info d;
    nib_status st = nib_device_query(&d);
    CHECK(st == NIB_ERR_NO_DEVICE);
    CHECK(strlen(nib_last_error()) > 0);
    void *p = (void *)1;
    CHECK(nib_dev_malloc(&p, 64, "probe") == NIB_ERR_NO_DEVICE);
    CHECK(p == NULL);
}

/* nib_test_run_self (harness.c), used by the tests that need a process of their own (a sticky
 * device error, determinism across processes): the child sees the added environment, its output
 * comes back, and its exit status is the harness's (0 passed, 1 a check failed). */
NIB_TEST(harness_run_self_child) {
    const char *v = getenv("NIB_TEST_SELF_CHILD");
    if (!v) SKIP("runs only as the child process of harness_run_self_spawns_this_binary");
    printf("  child sees NIB_TEST_SELF_CHILD=%s\n", v);
    CHECK(strcmp(v, "fail") != 0);
}

NIB_TEST(harness_filter_lists_and_substrings) {
    CHECK(nib_test_name_matches("pi05_gpu_bf16_vs_reference", NULL));
    CHECK(nib_test_name_matches("pi05_gpu_bf16_vs_reference", "bf16"));
    CHECK(nib_test_name_matches("pi05_gpu_bf16_vs_reference", "reference"));   /* at the end */
    CHECK(nib_test_name_matches("pi05_gpu_bf16_vs_reference", "pi05_gpu_bf16_vs_reference"));
    CHECK(!nib_test_name_matches("pi05_gpu_bf16_vs_reference", "pi05_gpu_bf16_vs_reference_"));
    CHECK(!nib_test_name_matches("blas_gpu", "ops"));
    CHECK(nib_test_name_matches("blas_gpu", "ops,blas"));  /* the second item */
    CHECK(nib_test_name_matches("ops_gpu_rope", "ops,blas")); /* the first item */
    CHECK(!nib_test_name_matches("attn_gpu_decode", "ops,blas"));
    CHECK(!nib_test_name_matches("attn_gpu_decode", ","));   /* empty items match nothing */
    CHECK(nib_test_name_matches("attn_gpu_decode", ""));     /* as no filter */
    CHECK(nib_test_name_matches("attn_gpu_decode", ",decode,"));
}

NIB_TEST(harness_run_self_spawns_this_binary) {
    static char out[8192];
    const char *ok[] = {"NIB_TEST_SELF_CHILD=7", NULL}, *bad[] = {"NIB_TEST_SELF_CHILD=fail", NULL};
    int rc = nib_test_run_self("harness_run_self_child", ok, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "child sees NIB_TEST_SELF_CHILD=7") && strstr(out, "PASS harness_run_self_child") &&
                  strstr(out, "1 passed, 0 failed, 0 skipped"),
              "child exited %d:\n%s", rc, out);
    rc = nib_test_run_self("harness_run_self_child", bad, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "FAIL harness_run_self_child"), "failing child exited %d:\n%s", rc, out);
    /* without the variable the child skips: the parent must look for PASS, not just exit 0 */
    rc = nib_test_run_self("harness_run_self_child", NULL, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "SKIP harness_run_self_child"), "child without the variable exited %d:\n%s", rc,
              out);
}
