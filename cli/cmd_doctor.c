/* cmd_doctor.c — `nib doctor [--json] [--quick]`: the "phase 0" check. What GPU is here, the
 * driver/runtime, SMs, L2, the two measured ceilings every nib benchmark is judged against
 * (device copy bandwidth, cuBLASLt bf16 and fp8 dense GEMM peaks), and which nib kernel
 * families can run on this device. */
#include <string.h>

#include "cli/cli.h"
#include "runtime/device.h"
#include "runtime/timing.h"

typedef struct doctor_result {
    nib_status query, gate;
    char query_err[512], gate_err[512];
    nib_device_info d;
    int measured;
    double copy_gbps, bf16_tflops, fp8_tflops;
    char measure_err[512];
} doctor_result;

/* kernel families and the minimum compute capability each needs in this build */
static const struct {
    const char *name;
    int cc;
} k_families[] = {
    {"gemm_nvfp4", 90}, {"gemm_mxfp4", 90}, {"gemm_int4", 90}, {"gemm_fp8_weight_only", 90},
    {"gemm_fp8_w8a8 (cuBLASLt)", 89},
};

static void run_doctor(doctor_result *r, int quick) {
    memset(r, 0, sizeof *r);
    r->query = nib_device_query(&r->d);
    if (r->query) {
        snprintf(r->query_err, sizeof r->query_err, "%s", nib_last_error());
        return;
    }
    r->gate = nib_device_require(&r->d);
    if (r->gate) {
        snprintf(r->gate_err, sizeof r->gate_err, "%s", nib_last_error());
        return;
    }
    if (quick) return;
    nib_status st = nib_lab_copy_bandwidth((uint64_t)4 * (r->d.l2_bytes > 0 ? r->d.l2_bytes : (64 << 20)) * 4,
                                           &r->copy_gbps);
    if (!st) st = nib_lab_peak_tflops(0, 8192, &r->bf16_tflops);
    if (!st) st = nib_lab_peak_tflops(1, 8192, &r->fp8_tflops);
    if (st) snprintf(r->measure_err, sizeof r->measure_err, "%s: %s", nib_status_name(st), nib_last_error());
    else r->measured = 1;
}

static int family_ok(const doctor_result *r, int i) {
    if (r->query || r->gate) return 0;
    return r->d.cc_major * 10 + r->d.cc_minor >= k_families[i].cc;
}

int nib_cmd_doctor(int argc, char **argv) {
    int json = 0, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (nib_cli_is_help(argv[i])) {
            printf("usage: nib doctor [--json] [--quick]\n"
                   "Shows the CUDA device nib would use (NIB_DEVICE), its compute capability, SM count,\n"
                   "L2, memory, driver and runtime versions; measures the device copy bandwidth (GB/s,\n"
                   "bytes read + written) and the cuBLASLt bf16 and fp8 dense GEMM peaks (TFLOP/s at\n"
                   "8192^3) unless --quick; and lists which nib kernel families run on this device.\n"
                   "Without a GPU it says so and exits 0. --json prints one JSON object.\n");
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else {
            fprintf(stderr, "nib doctor: unknown option '%s' (see nib doctor --help)\n", argv[i]);
            return 2;
        }
    }
    doctor_result r;
    run_doctor(&r, quick);
    const int nf = (int)NIB_ARRAY_LEN(k_families);
    if (json) {
        printf("{\"nib_version\": \"%s\", \"cuda_build\": %s", nib_version(),
               nib_device_built_with_cuda() ? "true" : "false");
        if (r.query) {
            printf(", \"device\": null, \"error\": \"%s\"}\n", nib_status_name(r.query));
            return 0;
        }
        printf(", \"device\": {\"ordinal\": %d, \"name\": \"%s\", \"cc\": \"%d.%d\", \"sm_count\": %d, "
               "\"l2_bytes\": %d, \"total_mem\": %llu, \"free_mem\": %llu, \"driver_version\": %d, "
               "\"runtime_version\": %d}",
               r.d.ordinal, r.d.name, r.d.cc_major, r.d.cc_minor, r.d.sm_count, r.d.l2_bytes,
               (unsigned long long)r.d.total_mem, (unsigned long long)r.d.free_mem, r.d.driver_version,
               r.d.runtime_version);
        if (r.measured)
            printf(", \"copy_gbps\": %.1f, \"cublaslt_bf16_tflops\": %.1f, \"cublaslt_fp8_tflops\": %.1f",
                   r.copy_gbps, r.bf16_tflops, r.fp8_tflops);
        printf(", \"kernels\": {");
        for (int i = 0; i < nf; i++)
            printf("%s\"%s\": %s", i ? ", " : "", k_families[i].name, family_ok(&r, i) ? "true" : "false");
        printf("}}\n");
        return 0;
    }
    printf("nib %s, CUDA backend %s\n", nib_version(),
           nib_device_built_with_cuda() ? "built (sm_90a)" : "not built (CPU reference only)");
    if (r.query) {
        printf("no CUDA device: %s\n", r.query_err);
        printf("the CPU reference backend works; GPU kernels, benchmarks and GPU tests need an "
               "sm_90 (Hopper) GPU\n");
        return 0;
    }
    nib_device_info *d = &r.d;
    printf("device %d: %s, compute capability %d.%d%s\n", d->ordinal, d->name, d->cc_major, d->cc_minor,
           d->cc_overridden ? " (NIB_FAKE_CC)" : "");
    printf("  SMs %d, L2 %.1f MB, memory %.1f GB (%.1f GB free), smem/block %d KB\n", d->sm_count,
           d->l2_bytes / 1e6, d->total_mem / 1e9, d->free_mem / 1e9, d->smem_per_block_optin / 1024);
    printf("  driver %d.%d, runtime %d.%d\n", d->driver_version / 1000, (d->driver_version % 1000) / 10,
           d->runtime_version / 1000, (d->runtime_version % 1000) / 10);
    if (r.gate) {
        printf("  nib kernels: not supported: %s\n", r.gate_err);
        return 0;
    }
    if (r.measured)
        printf("  measured: copy %.0f GB/s (read+write), cuBLASLt bf16 %.0f TFLOP/s, fp8 %.0f TFLOP/s\n",
               r.copy_gbps, r.bf16_tflops, r.fp8_tflops);
    else if (!quick)
        printf("  measurement failed: %s\n", r.measure_err);
    printf("  kernel families:\n");
    for (int i = 0; i < nf; i++)
        printf("    %-28s %s\n", k_families[i].name, family_ok(&r, i) ? "supported" : "not supported");
    return 0;
}
