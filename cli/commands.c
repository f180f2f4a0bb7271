/* commands.c — the table of nib commands and shared CLI helpers. */
#include <string.h>

#include "cli/cli.h"

const nib_cli_command nib_cli_commands[] = {
    {"demo", "Pi0.5 end to end on a synthetic full-size model: timing and accuracy (CPU: tiny config)",
     nib_cmd_demo},
    {"run", "one Pi0.5 policy call: nib run pi05 --checkpoint M --inputs IN --out OUT", nib_cmd_run},
    {"accuracy", "Pi0.5 GPU presets against the fp32 reference: prefix K/V and actions", nib_cmd_accuracy},
    {"doctor", "show the GPU, driver/runtime versions and which nib kernels it supports",
     nib_cmd_doctor},
    {"formats", "quantize random matrices to every format and print the error table",
     nib_cmd_formats},
    {"inspect", "list the tensors of a safetensors file (validates it fully)", nib_cmd_inspect},
    {"quantize", "quantize a checkpoint's linear weights to nvfp4/mxfp4/int4/fp8", nib_cmd_quantize},
    {"bench", "labs: nib bench gemm | ops | attn | pi05 (need a GPU)", nib_cmd_bench},
    {NULL, NULL, NULL},
};

int nib_cli_fail(const char *cmd, nib_status st) {
    fprintf(stderr, "nib %s: %s: %s\n", cmd, nib_status_name(st), nib_last_error());
    return 1;
}

int nib_cli_is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }
