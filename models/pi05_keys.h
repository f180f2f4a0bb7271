/* pi05_keys.h — openpi-converted checkpoint key names (pi05.md §6.1) and lookup helpers. */
#ifndef NIB_MODELS_PI05_KEYS_H
#define NIB_MODELS_PI05_KEYS_H

#include "io/safetensors.h"

#define PI05_VP "paligemma_with_expert.paligemma.model.vision_tower.vision_model"
#define PI05_LP "paligemma_with_expert.paligemma.model.language_model"
#define PI05_EP "paligemma_with_expert.gemma_expert.model"
#define PI05_PROJ "paligemma_with_expert.paligemma.model.multi_modal_projector.linear"
#define PI05_EMBED "paligemma_with_expert.paligemma.lm_head.weight"

/* Find `name`, or "model." + name. */
const nib_st_tensor *nib_pi05_find(const nib_st_file *f, const char *name);
/* Find a float tensor (BF16/F16/F32) with the given shape (-1 = any); errors name the tensor. */
nib_status nib_pi05_need(const nib_st_file *f, const char *name, int ndim, const int64_t *shape,
                         const nib_st_tensor **out);

#endif
