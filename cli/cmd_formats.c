/* placeholder until formats land (owned by the formats work) */
#include "cli/cli.h"
int nib_cmd_formats(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "nib formats: not built yet\n"); return 1; }
