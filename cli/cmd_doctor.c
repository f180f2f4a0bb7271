/* cmd_doctor.c — `nib doctor [--json]`: what GPU is here and what nib can run on it. */
#include <string.h>

#include "cli/cli.h"
#include "runtime/device.h"

int nib_cmd_doctor(int argc, char **argv) {
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (nib_cli_is_help(argv[i])) {
            printf("usage: nib doctor [--json]\n"
                   "Shows the CUDA device nib would use (NIB_DEVICE), its compute capability,\n"
                   "SM count, L2, memory, driver and runtime versions, and whether nib's CUDA\n"
                   "kernels (sm_90a) can run on it. Exit status 0 even without a GPU.\n");
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else {
            fprintf(stderr, "nib doctor: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    nib_device_info d;
    nib_status st = nib_device_query(&d);
    const char *err = st == NIB_OK ? "" : nib_last_error();
    char errbuf[1024];
    snprintf(errbuf, sizeof errbuf, "%s", err);
    nib_status gate = NIB_OK;
    char gatebuf[1024] = "";
    if (st == NIB_OK) {
        gate = nib_device_require(&d);
        if (gate != NIB_OK) snprintf(gatebuf, sizeof gatebuf, "%s", nib_last_error());
    }
    if (json) {
        printf("{\"nib_version\": \"%s\", \"cuda_build\": %s", nib_version(),
               nib_device_built_with_cuda() ? "true" : "false");
        if (st != NIB_OK) {
            printf(", \"device\": null, \"error\": \"%s\"}\n", nib_status_name(st));
            return 0;
        }
        printf(", \"device\": {\"ordinal\": %d, \"name\": \"%s\", \"cc\": \"%d.%d\", \"sm_count\": %d,"
               " \"l2_bytes\": %d, \"total_mem\": %llu, \"free_mem\": %llu, \"driver_version\": %d,"
               " \"runtime_version\": %d}, \"kernels_supported\": %s}\n",
               d.ordinal, d.name, d.cc_major, d.cc_minor, d.sm_count, d.l2_bytes,
               (unsigned long long)d.total_mem, (unsigned long long)d.free_mem, d.driver_version,
               d.runtime_version, gate == NIB_OK ? "true" : "false");
        return 0;
    }
    printf("nib %s, CUDA backend %s\n", nib_version(),
           nib_device_built_with_cuda() ? "built (sm_90a)" : "not built (CPU reference only)");
    if (st != NIB_OK) {
        printf("no CUDA device: %s\n", errbuf);
        printf("the CPU reference backend works; GPU kernels, benchmarks and GPU tests need an "
               "sm_90 (Hopper) GPU\n");
        return 0;
    }
    printf("device %d: %s, compute capability %d.%d%s\n", d.ordinal, d.name, d.cc_major,
           d.cc_minor, d.cc_overridden ? " (NIB_FAKE_CC)" : "");
    printf("  SMs %d, L2 %.1f MB, memory %.1f GB (%.1f GB free), smem/block %d KB\n", d.sm_count,
           d.l2_bytes / 1e6, d.total_mem / 1e9, d.free_mem / 1e9, d.smem_per_block_optin / 1024);
    printf("  driver %d.%d, runtime %d.%d\n", d.driver_version / 1000,
           (d.driver_version % 1000) / 10, d.runtime_version / 1000,
           (d.runtime_version % 1000) / 10);
    printf("  nib kernels: %s\n", gate == NIB_OK ? "supported" : gatebuf);
    return 0;
}
