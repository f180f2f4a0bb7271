/* placeholder: replaced by the ops lab */
#include "cli/cli.h"
int nib_bench_ops(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "nib bench ops: not built yet\n");
    return 1;
}
