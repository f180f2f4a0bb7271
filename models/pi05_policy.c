/* pi05_policy.c — the public Pi0.5 policy API of include/nib.h (nib_pi05_policy_*) over the
 * engine's internal one (models/pi05.h): a checkpoint opened and loaded once, then called per
 * control tick. Also nib_pi05_open_file, the open-and-load that the CLI shares. */
#include <string.h>

#include "models/pi05.h"

nib_status nib_pi05_open_file(const char *ckpt, const char *preset, const char *overrides, int32_t steps,
                              int32_t max_horizon, nib_st_file **f, nib_pi05 **m) {
    if (!f || !m) return NIB_ERR(NIB_ERR_INVALID_ARG, "pi05 open: NULL output");
    *f = NULL, *m = NULL;
    if (!ckpt || !preset) return NIB_ERR(NIB_ERR_INVALID_ARG, "pi05 open: NULL checkpoint path or preset");
    if (steps < 0 || max_horizon < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "pi05 open: steps %d and max_horizon %d must be >= 0 (0: the checkpoint's)",
                       (int)steps, (int)max_horizon);
    nib_pi05_precision p;
    NIB_RETURN_IF_ERR(nib_pi05_preset(preset, &p));
    if (overrides) NIB_RETURN_IF_ERR(nib_pi05_precision_override(&p, overrides));
    NIB_RETURN_IF_ERR(nib_st_open(ckpt, f));
    nib_pi05_config c;
    nib_status st = nib_pi05_config_from_file(*f, &c);
    if (!st && steps > 0) c.steps = steps;
    if (!st && max_horizon > c.max_horizon) c.max_horizon = max_horizon;
    if (!st) st = nib_pi05_load(*f, &c, &p, m);
    if (st) {
        nib_st_close(*f);
        *f = NULL;
    }
    return st;
}

struct nib_pi05_policy {
    nib_st_file *f; /* mapped while the model lives */
    nib_pi05 *m;
};

nib_status nib_pi05_policy_open(const char *checkpoint, const char *preset, const char *overrides, int32_t max_horizon,
                                nib_pi05_policy **out) {
    if (!out) return NIB_ERR(NIB_ERR_INVALID_ARG, "nib_pi05_policy_open: NULL output");
    *out = NULL;
    nib_pi05_policy *p = nib_calloc(1, sizeof *p);
    if (!p) return NIB_ERR_OUT_OF_MEMORY;
    nib_status st = nib_pi05_open_file(checkpoint, preset, overrides, 0, max_horizon, &p->f, &p->m);
    if (st) {
        nib_free(p);
        return st;
    }
    *out = p;
    return NIB_OK;
}

void nib_pi05_policy_close(nib_pi05_policy *p) {
    if (!p) return;
    nib_pi05_free(p->m);
    nib_st_close(p->f);
    nib_free(p);
}

int64_t nib_pi05_policy_size(const nib_pi05_policy *p, nib_pi05_size what) {
    if (!p) return -1;
    const nib_pi05_config *c = nib_pi05_cfg(p->m);
    switch (what) {
    case NIB_PI05_MAX_CAMERAS: return c->max_cameras;
    case NIB_PI05_IMAGE_SIZE: return c->v_image;
    case NIB_PI05_MAX_TEXT: return c->max_text;
    case NIB_PI05_MAX_HORIZON: return c->max_horizon;
    case NIB_PI05_ACTION_DIM: return c->action_dim;
    case NIB_PI05_VOCAB: return c->vocab;
    case NIB_PI05_STEPS: return c->steps;
    }
    return -1;
}

nib_status nib_pi05_policy_run(nib_pi05_policy *p, int32_t n_cameras, const float *images_f32, const uint8_t *images_u8,
                               const uint8_t *image_mask, const int32_t *text_ids, int32_t n_text, int32_t horizon,
                               const float *noise, uint64_t seed, float *actions) {
    if (!p || !actions) return NIB_ERR(NIB_ERR_INVALID_ARG, "nib_pi05_policy_run: NULL policy or actions");
    if (n_cameras > 0 && (images_f32 != NULL) == (images_u8 != NULL))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "nib_pi05_policy_run: %s images (give F32 or U8, exactly one)",
                       images_f32 ? "both F32 and U8" : "no");
    if (n_text > 0 && !text_ids)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "nib_pi05_policy_run: %d text tokens but text_ids is NULL", (int)n_text);
    const nib_pi05_inputs in = {n_cameras, images_f32, images_u8, image_mask, text_ids, n_text, horizon, noise, seed};
    return nib_pi05_run(p->m, &in, actions, NULL);
}
