/* commands.c — the table of nib commands and shared CLI helpers. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "runtime/device.h"

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

int nib_cli_int_arg(const char *cmd, const char *opt, const char *s, long long lo, long long hi, int *out) {
    char *end = NULL;
    errno = 0;
    const long long v = s && *s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || errno || *end || v < lo || v > hi) {
        fprintf(stderr, "nib %s: %s takes an integer from %lld to %lld, not '%s'\n", cmd, opt, lo, hi, s ? s : "");
        return 0;
    }
    *out = (int)v;
    return 1;
}

int nib_cli_u64_arg(const char *cmd, const char *opt, const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    const int hex = s && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'); /* no octal: "010" is ten */
    const unsigned long long v = s && *s && *s != '-' ? strtoull(s, &end, hex ? 16 : 10) : 0;
    if (!s || !*s || *s == '-' || errno || *end) {
        fprintf(stderr, "nib %s: %s takes an unsigned integer (decimal or 0x hex), not '%s'\n", cmd, opt, s ? s : "");
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

void nib_cli_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

void nib_cli_json_head(FILE *f, const char *bench, const char *cmd_prefix, int argc, char **argv,
                       const struct nib_device_info *d) {
    char date[64], cmd[2048];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    const char *commit = getenv("NIB_GIT_COMMIT");
    size_t o = (size_t)snprintf(cmd, sizeof cmd, "%s", cmd_prefix);
    for (int i = 0; i < argc && o < sizeof cmd; i++)
        o += (size_t)snprintf(cmd + o, sizeof cmd - o, "%s%s", o ? " " : "", argv[i]);
    fprintf(f, "{\n  \"bench\": ");
    nib_cli_json_string(f, bench);
    fprintf(f, ",\n  \"date\": \"%s\",\n  \"git_commit\": ", date);
    nib_cli_json_string(f, commit && *commit ? commit : "unknown");
    fprintf(f, ",\n  \"command\": ");
    nib_cli_json_string(f, cmd);
    fprintf(f, ",\n  \"device\": ");
    nib_cli_json_string(f, d->name);
    fprintf(f, ",\n  \"cc\": \"%d.%d\",\n  \"driver_version\": %d,\n  \"runtime_version\": %d,\n  \"l2_bytes\": %d,\n",
            d->cc_major, d->cc_minor, d->driver_version, d->runtime_version, (int)d->l2_bytes);
}
