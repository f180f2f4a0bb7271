/* placeholder: replaced by the attn lab */
#include "cli/cli.h"
int nib_bench_attn(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "nib bench attn: not built yet\n");
    return 1;
}
