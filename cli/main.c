/* main.c — `nib <command> [args]`. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void usage(FILE *f) {
    fprintf(f, "nib %s — batch-1 transformer inference with 4- and 8-bit weights\n\n", nib_version());
    fprintf(f, "usage: nib <command> [options]   (nib <command> --help for its options)\n\n");
    fprintf(f, "commands:\n");
    for (const nib_cli_command *c = nib_cli_commands; c->name; c++)
        fprintf(f, "  %-10s %s\n", c->name, c->summary);
    fprintf(f, "\nenvironment: NIB_LOG=error|warn|info|debug|trace, NIB_DEVICE=N\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (nib_cli_is_help(argv[1]) || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("nib %s\n", nib_version());
        return 0;
    }
    for (const nib_cli_command *c = nib_cli_commands; c->name; c++)
        if (!strcmp(argv[1], c->name)) return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "nib: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
