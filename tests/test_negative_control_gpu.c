/* test_negative_control_gpu.c — runs the deliberately out-of-bounds kernel of
 * tests/negative_control_gpu.cu. Built with `make NIB_NEGATIVE_CONTROL=1` it issues the stray
 * write and passes (nothing faults without a sanitizer); scripts/sanitize.sh runs it under
 * compute-sanitizer memcheck and requires memcheck to report it. Otherwise it skips. */
#include "harness.h"
#include "runtime/device.h"

#ifdef NIB_HAVE_CUDA
int nib_test_negctl_built(void);
nib_status nib_test_negctl_run(int *oob);
#endif

NIB_TEST(negative_control_gpu_oob_write) {
#ifndef NIB_HAVE_CUDA
    SKIP("CPU-only build: the negative control is a CUDA kernel");
#else
    NIB_REQUIRE_GPU();
    if (!nib_test_negctl_built())
        SKIP("built without NIB_NEGATIVE_CONTROL=1 (scripts/sanitize.sh --negative-control "
             "builds it)");
    int oob = 0;
    CHECK_OK(nib_test_negctl_run(&oob));
    CHECK(oob == 1);
    printf("  note: one out-of-bounds device write was issued on purpose: compute-sanitizer "
           "memcheck must report it\n");
#endif
}
