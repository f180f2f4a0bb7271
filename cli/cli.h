/* cli.h — the nib command-line tool's commands. Each command is `int nib_cmd_X(argc, argv)`
 * with argv[0] = "X"; it returns the process exit status (0 ok, 1 failure, 2 usage error).
 * Commands print; the library they call does not. */
#ifndef NIB_CLI_H
#define NIB_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

typedef struct nib_cli_command {
    const char *name;
    const char *summary;
    int (*fn)(int argc, char **argv);
} nib_cli_command;

/* The command table (cli/commands.c), terminated by a {NULL} entry. */
extern const nib_cli_command nib_cli_commands[];

int nib_cmd_doctor(int argc, char **argv);
int nib_cmd_formats(int argc, char **argv);
int nib_cmd_inspect(int argc, char **argv);
int nib_cmd_quantize(int argc, char **argv);
int nib_cmd_bench(int argc, char **argv);
int nib_cmd_run(int argc, char **argv);
int nib_cmd_demo(int argc, char **argv);
int nib_cmd_accuracy(int argc, char **argv);
/* labs wired into `nib bench <lab>` (each in its own cli/bench_<lab>.c) */
int nib_bench_ops(int argc, char **argv);  /* norms, rope, activations, qkv epilogue */
int nib_bench_attn(int argc, char **argv); /* attention kernels */
int nib_bench_pi05(int argc, char **argv); /* Pi0.5 end to end (cli/cmd_pi05.c) */

/* Print "nib <cmd>: <status name>: <last error>" to stderr and return 1. */
int nib_cli_fail(const char *cmd, nib_status st);
/* 1 if a is "-h" or "--help". */
int nib_cli_is_help(const char *a);
/* An option's number, strictly: all of s is a base-10 integer (u64: also 0x hex) within [lo, hi]. Else
 * prints "nib <cmd>: <opt> takes an integer from lo to hi, not '<s>'" to stderr and returns 0 (the
 * caller exits 2); 1 on success. */
int nib_cli_int_arg(const char *cmd, const char *opt, const char *s, long long lo, long long hi, int *out);
int nib_cli_u64_arg(const char *cmd, const char *opt, const char *s, uint64_t *out);

/* Benchmark JSON (bench/results/): a JSON string literal, and the common head of a lab's file:
 * '{' then bench, date (UTC), git_commit ($NIB_GIT_COMMIT or "unknown"), command (cmd_prefix
 * followed by argv, space-separated), device, cc, driver/runtime versions and L2 bytes, each
 * line ending with ",\n" so the caller continues with its own fields. */
struct nib_device_info;
void nib_cli_json_string(FILE *f, const char *s);
void nib_cli_json_head(FILE *f, const char *bench, const char *cmd_prefix, int argc, char **argv,
                       const struct nib_device_info *d);

#endif
