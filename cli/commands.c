/* commands.c — the table of nib commands and shared CLI helpers. */
#include <string.h>

#include "cli/cli.h"

const nib_cli_command nib_cli_commands[] = {
    {"doctor", "show the GPU, driver/runtime versions and which nib kernels it supports",
     nib_cmd_doctor},
    {"formats", "quantize random matrices to every format and print the error table",
     nib_cmd_formats},
    {"inspect", "list the tensors of a safetensors file (validates it fully)", nib_cmd_inspect},
    {"bench", "kernel labs: nib bench gemm (needs a GPU)", nib_cmd_bench},
    {NULL, NULL, NULL},
};

int nib_cli_fail(const char *cmd, nib_status st) {
    fprintf(stderr, "nib %s: %s: %s\n", cmd, nib_status_name(st), nib_last_error());
    return 1;
}

int nib_cli_is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }
