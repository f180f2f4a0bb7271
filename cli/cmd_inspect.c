/* placeholder until io lands (owned by the io work) */
#include "cli/cli.h"
int nib_cmd_inspect(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "nib inspect: not built yet\n"); return 1; }
