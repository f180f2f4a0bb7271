/* harness.h — nib's one test harness.
 *
 * A test is a function registered at load time:
 *
 *   NIB_TEST(fp8_roundtrip) {
 *       CHECK(x == y);                       // records a failure, continues
 *       CHECK_MSG(err < tol, "err %g", err); // with a message
 *       CHECK_OK(nib_something(...));        // status must be NIB_OK (prints nib_last_error)
 *       if (!have_gpu) SKIP("no CUDA device"); // marks skipped and returns
 *   }
 *
 * The runner (tests/harness.c) runs every test whose name contains argv[1] (all if absent),
 * prints one line per test and ends with "N passed, N failed, N skipped". Exit status is 1 if
 * any test failed. Tests that need a GPU call NIB_REQUIRE_GPU() first and skip cleanly without one.
 */
#ifndef NIB_TEST_HARNESS_H
#define NIB_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "base/rng.h"

typedef struct nib_test_ctx {
    const char *name;
    int failures;   /* CHECK failures in this test */
    int skipped;    /* 1 once SKIP ran */
    char skip_reason[256];
    uint64_t seed;  /* per-test seed: NIB_TEST_SEED env or a fixed default, mixed with the name */
} nib_test_ctx;

typedef void (*nib_test_fn)(nib_test_ctx *t);
void nib_test_register(const char *name, const char *file, nib_test_fn fn);
void nib_test_fail(nib_test_ctx *t, const char *file, int line, const char *fmt, ...)
    NIB_PRINTF(4, 5);
void nib_test_skip(nib_test_ctx *t, const char *fmt, ...) NIB_PRINTF(2, 3);
/* 1 if a CUDA device usable by nib is present (and this is a CUDA build). */
int nib_test_have_gpu(void);
/* Seed an RNG for this test: distinct per test, reproducible, overridable with NIB_TEST_SEED. */
void nib_test_rng(nib_test_ctx *t, nib_rng *r);
/* A per-run scratch directory for files tests write (created on first use). */
const char *nib_test_tmpdir(void);
/* Run this test binary again as a child process, `nib_tests FILTER` (through /proc/self/exe),
 * with `env` ("NAME=value" strings, NULL-terminated; may be NULL) added to the environment. Its
 * stdout and stderr go to out (at most cap - 1 bytes, NUL-terminated; out may be NULL). Returns
 * the exit status, 128 + N for a child killed by signal N, or -1 if it could not be started.
 * For tests that need a process of their own (a sticky device error, a second process). */
int nib_test_run_self(const char *filter, const char *const *env, char *out, size_t cap);
/* 1 if the test NAME is selected by FILTER, a comma-separated list of substrings (any one
 * matches; empty items match nothing; a NULL or empty filter selects every test) */
int nib_test_name_matches(const char *name, const char *filter);

#define NIB_TEST(fn)                                                                          \
    static void fn(nib_test_ctx *t);                                                          \
    __attribute__((constructor)) static void nib_test_reg_##fn(void) {                        \
        nib_test_register(#fn, __FILE__, fn);                                                 \
    }                                                                                         \
    static void fn(nib_test_ctx *t NIB_UNUSED)

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond)) nib_test_fail(t, __FILE__, __LINE__, "CHECK(%s)", #cond);                \
    } while (0)
#define CHECK_MSG(cond, ...)                                                                  \
    do {                                                                                      \
        if (!(cond)) nib_test_fail(t, __FILE__, __LINE__, __VA_ARGS__);                       \
    } while (0)
#define CHECK_OK(expr)                                                                        \
    do {                                                                                      \
        nib_status chk_st_ = (expr);                                                          \
        if (chk_st_ != NIB_OK)                                                                \
            nib_test_fail(t, __FILE__, __LINE__, "%s -> %s: %s", #expr,                       \
                          nib_status_name(chk_st_), nib_last_error());                        \
    } while (0)
/* Expect a specific failure status. */
#define CHECK_ST(expr, want)                                                                  \
    do {                                                                                      \
        nib_status chk_st_ = (expr);                                                          \
        if (chk_st_ != (want))                                                                \
            nib_test_fail(t, __FILE__, __LINE__, "%s -> %s, want %s (%s)", #expr,             \
                          nib_status_name(chk_st_), nib_status_name(want), nib_last_error());  \
    } while (0)
/* Stop the test when earlier checks failed (e.g. before using a result that must exist). */
#define REQUIRE(cond)                                                                         \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            nib_test_fail(t, __FILE__, __LINE__, "REQUIRE(%s)", #cond);                       \
            return;                                                                           \
        }                                                                                     \
    } while (0)
#define SKIP(...)                                                                             \
    do {                                                                                      \
        nib_test_skip(t, __VA_ARGS__);                                                        \
        return;                                                                               \
    } while (0)
/* Tests that provoke a device error on purpose (a real fault, a failed allocation) skip under
 * scripts/sanitize.sh, which sets NIB_UNDER_SANITIZER=1: the tool would report the deliberate
 * error as a finding. Heavy repetition is scaled down there too (nib_under_sanitizer()). */
#define NIB_SKIP_UNDER_SANITIZER(why)                                                         \
    do {                                                                                      \
        if (nib_under_sanitizer()) SKIP("under compute-sanitizer: " why);                     \
    } while (0)
static inline int nib_under_sanitizer(void) {
    const char *e = getenv("NIB_UNDER_SANITIZER");
    return e && e[0] == '1';
}
#define NIB_REQUIRE_GPU()                                                                     \
    do {                                                                                      \
        if (!nib_test_have_gpu()) SKIP("no usable CUDA device");                              \
    } while (0)

#endif
