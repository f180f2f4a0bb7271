/* pi05.h — the Pi0.5 policy: SigLIP vision -> Gemma-2B prefix (fills a KV cache) -> Gemma-300M
 * action expert run for N flow-matching Euler steps. The exact model is
 * ../shared/reference/pi05.md; this file is the engine's internal API (cli/ and tests use it).
 *
 * Written once against runtime/backend.h: the same code runs on the reference backend (fp32, CPU)
 * and on the CUDA backend (bf16 activations, low-bit weights, one CUDA graph per call shape).
 *
 * Load-time folding (exact rewrites of the model, done in fp32 before any quantization):
 *   - Gemma RMSNorm (1 + w) folded into the columns of the following QKV and gate|up weights;
 *   - the Gemma prefix's attention q scale 1/16 (exact) folded into the q rows; SigLIP's
 *     1/sqrt(72) is applied to the logits by the attention instead (logit_scale), which keeps
 *     the q bias exact in bf16 (cuBLASLt's bias epilogue) and 4-bit vision loadable;
 *   - fused QKV and gate|up weights;
 *   - the time MLP and all adaRMS modulations (scale, shift, gate) precomputed for the N steps;
 *   - dt = -1/N folded into action_out_proj, so each step is x += out.
 * Exact skips: masked cameras are not run; only the valid text tokens enter the prefix (the
 * positions of valid tokens are unchanged, pi05.md §1.5); the last prefix layer computes K/V only.
 */
#ifndef NIB_MODELS_PI05_H
#define NIB_MODELS_PI05_H

#include <stdint.h>

#include "base/base.h"
#include "io/safetensors.h"
#include "ops/gemm.h"
#include "ops/kvcache.h"
#include "runtime/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nib_pi05_config {
    /* SigLIP */
    int32_t v_width, v_layers, v_heads, v_head_dim, v_mlp, v_patch, v_image, v_channels, v_tokens;
    /* Gemma-2B prefix ("expert 0") */
    int32_t width, layers, heads, kv_heads, head_dim, mlp;
    int64_t vocab;
    /* Gemma-300M action expert ("expert 1") */
    int32_t e_width, e_layers, e_heads, e_mlp;
    int32_t action_dim;
    /* run-time maxima (plan sizes) */
    int32_t max_cameras, max_text, max_horizon, steps;
} nib_pi05_config;

/* Per-component weight format and KV-cache dtype. */
typedef struct nib_pi05_precision {
    nib_be_kind backend;   /* REF: fp32 reference; the formats below are then ignored */
    nib_wfmt vision, prefix, expert;
    nib_kv_dtype kv;
} nib_pi05_precision;

/* "bf16": everything bf16, BF16 KV. "fast": FP8 (W8A8) vision and prefix, NVFP4 expert, BF16 KV.
 * "ref": the fp32 reference backend. */
nib_status nib_pi05_preset(const char *name, nib_pi05_precision *out);
/* "vision=fp8,prefix=bf16,expert=int4,kv=fp8" overrides on top of a preset; "backend=ref" runs
 * the fp32 reference with the preset's quantized weights (exactly dequantized) and KV dtype: the
 * precision-matched reference of a GPU preset. */
nib_status nib_pi05_precision_override(nib_pi05_precision *p, const char *spec);
const char *nib_pi05_precision_str(const nib_pi05_precision *p, char *buf, size_t n);

/* Dimensions from a checkpoint (shapes, plus the "nib.pi05.config" JSON metadata entry when
 * present). Accepts openpi-converted key names with or without a "model." prefix. */
nib_status nib_pi05_config_from_file(const nib_st_file *f, nib_pi05_config *cfg);
/* Parse a JSON config object (the metadata entry) into cfg fields present in it. */
nib_status nib_pi05_config_parse_json(const char *json, size_t len, nib_pi05_config *cfg);

typedef struct nib_pi05 nib_pi05;

/* Load and fold a checkpoint for `prec`; sizes every buffer for the config's maxima. */
nib_status nib_pi05_load(const nib_st_file *f, const nib_pi05_config *cfg, const nib_pi05_precision *prec,
                         nib_pi05 **out);
void nib_pi05_free(nib_pi05 *m);
/* Open a checkpoint and load it for a preset (+ overrides, as nib_pi05_precision_override); steps and
 * max_horizon > 0 replace / raise the checkpoint's. *f stays open (mapped) while *m lives: free *m,
 * then nib_st_close(*f). On failure nothing is left open. (models/pi05_policy.c; the CLI and the
 * public nib_pi05_policy_open use it.) */
nib_status nib_pi05_open_file(const char *ckpt, const char *preset, const char *overrides, int32_t steps,
                              int32_t max_horizon, nib_st_file **f, nib_pi05 **m);
const nib_pi05_config *nib_pi05_cfg(const nib_pi05 *m);
/* The precision the model runs at: the preset, except that a component the checkpoint holds
 * pre-quantized (nib quantize, ModelOpt, GPTQ/AWQ) runs in its stored format. */
const nib_pi05_precision *nib_pi05_prec(const nib_pi05 *m);
/* Bit 0 vision, bit 1 prefix, bit 2 expert: imported pre-quantized (no quantization at load). */
int nib_pi05_prequantized(const nib_pi05 *m);

typedef struct nib_pi05_inputs {
    int32_t n_cameras;          /* cameras given (<= max_cameras) */
    const float *images_f32;    /* [n][3][224][224] in [-1, 1], or NULL */
    const uint8_t *images_u8;   /* [n][224][224][3], or NULL */
    const uint8_t *image_mask;  /* [n] 0/1 or NULL (all valid); masked cameras are skipped */
    const int32_t *text_ids;    /* [n_text] */
    int32_t n_text;
    int32_t horizon;            /* H (<= max_horizon) */
    const float *noise;         /* [H][action_dim] or NULL: seeded N(0, 1) from `seed` */
    uint64_t seed;
} nib_pi05_inputs;

typedef struct nib_pi05_timing {
    double vision_ms, prefix_ms, step_ms[64], total_ms;
    int steps;
    int first_step_beside; /* the first step's layers ran beside the prefix (a second stream): prefix_ms
                            * includes the time they cost it, step_ms[0] is only what followed the
                            * prefix (the wait for the last of them, the layers run after the
                            * prefix on every SM, then the output projection) */
    int first_step_layers_beside; /* how many of its layers ran beside (from the first), 0 if none */
    /* before the graph, outside total_ms: the host's checks and packing of the inputs into page-locked
     * memory, and the device time of their one copy (events around it; CUDA graph path only) */
    double input_host_ms, input_copy_ms;
} nib_pi05_timing;

/* One policy call. actions: [H][action_dim] fp32. On CUDA the call is captured once per call
 * shape (cameras, text bucket, H) and replayed; timing (optional) is the per-stage breakdown
 * of this call measured with events inside the graph. The inputs are checked and copied into the
 * model's page-locked staging before anything runs, and the call returns when the actions are in
 * `actions`; the caller's buffers are not used after it returns. A model runs one call at a time:
 * its buffers, graphs and staging are its own, so calls on one model from several threads must be
 * serialized by the caller. */
nib_status nib_pi05_run(nib_pi05 *m, const nib_pi05_inputs *in, float *actions, nib_pi05_timing *timing);
/* The mean of the steps that ran on their own: all of them, or all but the first when it ran beside
 * the prefix (first_step_beside). 0 without steps. */
double nib_pi05_step_mean_ms(const nib_pi05_timing *t);

/* Check-numerics mode (off by default; `nib run pi05 --check-numerics`). When on, each call runs
 * the stages eagerly (on CUDA: not the captured graph, and several times slower) and after each
 * stage scans its output activations for NaN/Inf: every vision layer, the projected image
 * tokens, every prefix layer (the last one's K/V), and per flow step every expert layer, the
 * velocity and x_t. The first non-finite value fails the call with NIB_ERR_NUMERICS; the
 * message names the stage ("prefix layer 7 output", "step 3 velocity"), the tensor, the count
 * and the first bad element (flat index, row, column, NaN or which Inf). Without faults the
 * actions are bitwise those of a normal call. timing then has total_ms only (host time). */
void nib_pi05_set_check_numerics(nib_pi05 *m, int on);
/* Which action-expert path this model runs on its backend, and why: "per-op (<why>)" (the default),
 * or with NIB_FUSED_STEP=1 at load "persistent kernel for H <= 16, per-op above" (ops/expert.h)
 * where the kernel applies. Both may go on with how the first step runs ("; the first step ..."). Check-numerics
 * calls always run the per-op path (it scans every layer's output). */
const char *nib_pi05_expert_path(const nib_pi05 *m);
/* How the prefix applies RoPE and writes the KV cache, decided at load: "fused RoPE + cache write ..."
 * (GPU, bf16 cache; NIB_FUSED_QKV=0 at load turns it off) or "RoPE, then the cache write (<why>)". */
const char *nib_pi05_prefix_path(const nib_pi05 *m);

/* After a run: layer l's prefix K (which = 0) or V (1) for the valid prefix tokens, dequantized
 * to fp32 [P][head_dim] (the accuracy tool compares these across backends). P is returned. */
nib_status nib_pi05_prefix_kv(nib_pi05 *m, int layer, int which, float *out, int32_t max_tokens, int32_t *p);

/* Accounting for the bench: bytes of weights read per stage and FLOPs per stage for a call
 * shape. */
typedef struct nib_pi05_cost {
    double vision_bytes, prefix_bytes, step_bytes;
    double vision_flops, prefix_flops, step_flops;
    int32_t prefix_tokens;
} nib_pi05_cost;
void nib_pi05_cost_of(const nib_pi05 *m, int32_t cameras, int32_t n_text, int32_t horizon, nib_pi05_cost *c);

/* A synthetic checkpoint with seeded random weights of realistic scale (linears N(0, 0.02),
 * norm weights near 0, adaRMS small), written to `path` as openpi-converted key names (bf16).
 * cfg gives the dimensions (full size or reduced); its JSON goes into the metadata. */
nib_status nib_pi05_synth_checkpoint(const char *path, const nib_pi05_config *cfg, uint64_t seed);
/* unit_gain = 1: for tests, weights N(0, 1/fan_in) and adaRMS gates near 1, so every layer
 * contributes to the actions at order one (the realistic init leaves the layers' share tiny). */
nib_status nib_pi05_synth_checkpoint_ex(const char *path, const nib_pi05_config *cfg, uint64_t seed, int unit_gain);
/* progress(ctx, done, total): called from the writing thread after each batch of chunks (~16 MB)
 * with the tensor-data bytes written so far and in all; the last call has done == total. */
typedef void (*nib_progress_fn)(void *ctx, uint64_t done, uint64_t total);
nib_status nib_pi05_synth_checkpoint_progress(const char *path, const nib_pi05_config *cfg, uint64_t seed, int unit_gain,
                                              nib_progress_fn progress, void *ctx);
/* The full-size Pi0.5 config and a reduced one for CPU tests. */
void nib_pi05_config_full(nib_pi05_config *cfg);
void nib_pi05_config_tiny(nib_pi05_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
