/* pi05_cli.h — helpers shared by the Pi0.5 commands (run, demo, bench, accuracy). */
#ifndef NIB_CLI_PI05_H
#define NIB_CLI_PI05_H

#include "io/safetensors.h"
#include "models/pi05.h"

typedef struct nib_cli_inputs {
    nib_pi05_inputs in;
    int32_t *ids;
    float *imgf, *noise;
    uint8_t *mask;
} nib_cli_inputs;

/* Parse an inputs file (see cmd_run.c). horizon > 0 forces H (must match the noise if given). */
nib_status nib_cli_pi05_inputs_from_file(const nib_st_file *f, const nib_pi05_config *c, int32_t horizon,
                                         nib_cli_inputs *out);
void nib_cli_inputs_free(nib_cli_inputs *x);
/* Open a checkpoint and load it with a preset (+ overrides); steps > 0 overrides N; the plan
 * covers at least max_horizon. */
nib_status nib_cli_pi05_open(const char *ckpt, const char *preset, const char *overrides, int steps, int max_horizon,
                             nib_st_file **f, nib_pi05 **m, int verbose);

#endif
