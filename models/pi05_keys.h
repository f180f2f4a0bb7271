/* pi05_keys.h — openpi-converted checkpoint key names (pi05.md §6.1) and lookup helpers. */
#ifndef NIB_MODELS_PI05_KEYS_H
#define NIB_MODELS_PI05_KEYS_H

#include "io/safetensors.h"
#include "ops/gemm.h"

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

/* A linear layer "<base>" (".weight" float, or a pre-quantized set: ModelOpt NVFP4, FP8, GPTQ/AWQ
 * INT4, nib MXFP4; see io/qcheckpoint.h), with or without the "model." prefix. Fills its logical
 * [n][k], whether it is pre-quantized and in which format (NIB_WFMT_BF16 for float), and the
 * base name as present in the file (resolved, >= 256 bytes). Errors: NIB_ERR_NOT_FOUND naming
 * base; a malformed quantized set: the importer's error naming the tensor. */
typedef struct nib_pi05_lin {
    int64_t n, k;
    int prequant;
    nib_wfmt fmt;
    char base[256];
} nib_pi05_lin;
nib_status nib_pi05_linear(const nib_st_file *f, const char *base, nib_pi05_lin *out);

#endif
