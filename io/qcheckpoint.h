/* qcheckpoint.h — quantized linear layers in safetensors checkpoints: detection, import into
 * nib's canonical weight description (nib_wsrc, ops/gemm.h) without requantizing, validation,
 * and the layouts `nib quantize` writes. docs/quantization.md has every layout in tables.
 *
 * A linear layer is named by its BASE, the module path without the parameter suffix:
 *   "paligemma_with_expert.paligemma.model.language_model.layers.3.mlp.down_proj".
 * Its tensors are "<base>.<part>". The layouts recognised (N = output channels = rows of the
 * torch weight, K = input channels; shapes as stored):
 *
 *   FLOAT           weight BF16|F16|F32 [N,K]
 *   NVFP4_MODELOPT  weight U8 [N,K/2] (2 x E2M1, element 2i in the low nibble)
 *                   weight_scale F8_E4M3 [N,K/16] (row-major, not swizzled)
 *                   weight_scale_2 F32 [] or [1] (global, multiplied in), input_scale F32 []|[1]
 *   MXFP4_NIB       weight U8 [N,K/2], weight_scale F8_E8M0 [N,K/32] (nib's own; see docs)
 *   FP8             weight F8_E4M3 [N,K], weight_scale F32|BF16|F16 [] | [1] (per tensor) or
 *                   [N] | [N,1] (per output channel), input_scale optional (ModelOpt and
 *                   compressed-tensors "float-quantized" both fit)
 *   GPTQ            qweight I32 [K/8,N], qzeros I32 [K/G,N/8] (stored zero-1), scales F16 [K/G,N],
 *                   g_idx I32 [K] optional (AutoGPTQ v1; "gptq_v2" via the config)
 *   AWQ             qweight I32 [K,N/8], qzeros I32 [K/G,N/8], scales F16 [K/G,N] (AutoAWQ GEMM)
 *   CT_PACKED       weight_packed I32 [N,K/8], weight_scale F16|BF16|F32 [N,K/G],
 *                   weight_zero_point I32 [N/8,K/G] optional (asymmetric), weight_g_idx I32 [K]
 *                   optional, weight_shape I64|I32 [2] = {N, K} (compressed-tensors
 *                   pack-quantized, 4-bit)
 * Every layout may also carry "<base>.bias" [N] (BF16/F16/F32), and ModelOpt's
 * "<base>.k_scale" / "<base>.v_scale"; they are grouped with the layer (bias is imported).
 *
 * Ambiguities are settled by the tensors' dtypes and shapes first, then by a quantization config
 * (nib_qckpt_config): the JSON string under "quantization_config" in the file's __metadata__
 * (what `nib quantize` writes), or one the caller passes (e.g. from config.json). It decides
 * GPTQ vs AWQ when a file says so, NVFP4 vs MXFP4 when the scale plane is plain U8, "gptq_v2"
 * zero points, and is cross-checked against the group size the shapes imply.
 *
 * Not accepted (NIB_ERR_UNSUPPORTED, naming the tensor): compressed-tensors NVFP4
 * (weight_packed U8 + weight_global_scale, a reciprocal global), block-scaled FP8
 * (weight_scale_inv), 8-bit pack-quantized, AWQ GEMV, INT4 group sizes other than 32/64/128.
 *
 * Host byte order is little-endian (as in safetensors); nib does not build elsewhere.
 */
#ifndef NIB_IO_QCHECKPOINT_H
#define NIB_IO_QCHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "formats/formats.h"
#include "io/safetensors.h"
#include "ops/gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nib_qckpt_layout {
    NIB_QCKPT_NONE = 0,
    NIB_QCKPT_FLOAT,
    NIB_QCKPT_NVFP4_MODELOPT,
    NIB_QCKPT_MXFP4_NIB,
    NIB_QCKPT_FP8,
    NIB_QCKPT_GPTQ,
    NIB_QCKPT_AWQ,
    NIB_QCKPT_CT_PACKED,
    NIB_QCKPT_LAYOUT_COUNT
} nib_qckpt_layout;

/* "float", "modelopt-nvfp4", "nib-mxfp4", "fp8", "gptq", "awq", "ct-pack-quantized"; "none". */
const char *nib_qckpt_layout_name(nib_qckpt_layout l);

/* ---- quantization config ------------------------------------------------------------------ */
/* The fields of a quantization config that matter here. Strings are as written (truncated to
 * the buffer); absent fields are "" / 0. Accepted shapes of the JSON:
 *   flat (HF config.json "quantization_config", and what nib writes):
 *     {"quant_method": "modelopt"|"gptq"|"awq"|"compressed-tensors"|"nib", "quant_algo": ...,
 *      "group_size": G, "bits": 4, "checkpoint_format": "gptq"|"gptq_v2", "version": "gemm",
 *      "format": "pack-quantized", "config_groups": {"<any>": {"weights": {"num_bits": 4,
 *      "group_size": G}}}}
 *   ModelOpt hf_quant_config.json: {"quantization": {"quant_algo": ..., "group_size": ...}}
 *     (quant_method is then "modelopt"). */
typedef struct nib_qckpt_config {
    int present;                 /* 1 when a config was found and parsed */
    char quant_method[32];
    char quant_algo[32];         /* "NVFP4", "W4A16_NVFP4", "FP8", "MXFP4", ... */
    char checkpoint_format[16];  /* GPTQ: "gptq" (v1, zeros stored -1) | "gptq_v2" */
    char version[16];            /* AWQ: "gemm" | "gemv" */
    char format[32];             /* compressed-tensors: "pack-quantized", ... */
    int64_t group_size;          /* 0 absent; -1 per channel */
    int64_t bits;                /* 0 absent */
} nib_qckpt_config;

/* Parse json[0 .. len). Errors: NIB_ERR_FORMAT (not JSON, not an object, a field of the wrong
 * type: the message names the field), NIB_ERR_INVALID_ARG. */
nib_status nib_qckpt_config_parse(const char *json, size_t len, nib_qckpt_config *cfg);
/* The config of f's "quantization_config" metadata entry; cfg->present = 0 when there is none.
 * Errors: as nib_qckpt_config_parse, prefixed with "__metadata__.quantization_config". */
nib_status nib_qckpt_config_from_file(const nib_st_file *f, nib_qckpt_config *cfg);

/* ---- detection -------------------------------------------------------------------------- */
#define NIB_QCKPT_MAX_PARTS 10

/* What a linear layer in a file is, from names, dtypes and shapes only (no data is read). */
typedef struct nib_qckpt_info {
    nib_qckpt_layout layout;
    nib_wfmt fmt;           /* the canonical format it imports to */
    int64_t n, k;           /* logical shape [N, K] */
    int block;              /* elements along K per scale: 16 NVFP4, 32 MXFP4, G for INT4;
                               FP8: 0 per tensor, K per channel; FLOAT: 0 */
    int fp8_per_channel;
    int int4_asym;          /* INT4 with zero points (GPTQ/AWQ: decided at import; CT: zp) */
    int int4_act_order;     /* g_idx present (act order is decided at import) */
    uint64_t weight_bytes;  /* bytes of the tensors that define the weight (elements, scales,
                               global, zeros, g_idx, weight_shape) */
    uint64_t bytes;         /* bytes of all parts (with bias, input/k/v scales) */
    double bits_per_weight; /* 8 * weight_bytes / (N * K) */
    size_t n_parts;         /* parts[0] is the element tensor; then file order of roles */
    const nib_st_tensor *parts[NIB_QCKPT_MAX_PARTS];
} nib_qckpt_info;

/* Classify "<base>.*" in f. cfg NULL = read f's metadata config. Errors: NIB_ERR_NOT_FOUND
 * when none of <base>.weight, .qweight, .weight_packed exists; NIB_ERR_SHAPE / NIB_ERR_FORMAT /
 * NIB_ERR_UNSUPPORTED for a tensor set that is malformed (missing scale, wrong dtype or shape,
 * K not a multiple of the block, ...), the message naming the tensor and what is wrong. */
nib_status nib_qckpt_detect(const nib_st_file *f, const char *base, const nib_qckpt_config *cfg,
                            nib_qckpt_info *out);

/* Every quantized linear of a file (FLOAT layers are not listed: a 2-D float ".weight" may as
 * well be an embedding). Candidates are tensors named "*.qweight", "*.weight_packed", or
 * "*.weight" of dtype U8 / F8_E4M3 / F8_E8M0; each is detected, and one that fails is kept
 * with its error message so that `nib inspect --check` can report it. */
typedef struct nib_qckpt_entry {
    const char *base;       /* owned by the index */
    nib_status status;      /* NIB_OK, or why detection failed */
    const char *problem;    /* the error message when status != NIB_OK, else "" */
    nib_qckpt_info info;    /* valid when status == NIB_OK */
} nib_qckpt_entry;

typedef struct nib_qckpt_index nib_qckpt_index;
/* Errors: NIB_ERR_OUT_OF_MEMORY, and a malformed metadata config (see config_from_file). */
nib_status nib_qckpt_index_build(const nib_st_file *f, const nib_qckpt_config *cfg,
                                 nib_qckpt_index **out);
void nib_qckpt_index_free(nib_qckpt_index *ix); /* NULL is a no-op */
size_t nib_qckpt_index_count(const nib_qckpt_index *ix);
const nib_qckpt_entry *nib_qckpt_index_at(const nib_qckpt_index *ix, size_t i);
/* The entry whose (successfully detected) parts include tensor i of the file (file order),
 * or NULL. */
const nib_qckpt_entry *nib_qckpt_index_owner(const nib_qckpt_index *ix, size_t tensor_i);

/* ---- import -------------------------------------------------------------------------------- */
enum {
    NIB_QCKPT_WANT_F32 = 1u << 0,      /* also fill out->f32 [N][K] (exact: float weights
                                          converted, quantized ones dequantized) */
    NIB_QCKPT_CHECK_ELEMENTS = 1u << 1, /* also scan the element plane: NaN/Inf in float
                                          weights, E4M3 NaN codes in FP8 weights */
    NIB_QCKPT_VALIDATE_ONLY = 1u << 2  /* run every check, build nothing (out is zeroed) */
};

typedef struct nib_qckpt_opts {
    unsigned flags;                   /* NIB_QCKPT_* */
    const nib_qckpt_config *config;   /* NULL: the file's metadata config */
} nib_qckpt_opts;

/* One imported linear layer. */
typedef struct nib_qlinear {
    nib_wsrc w;               /* canonical weight (+ w.bias when <base>.bias exists), valid
                                 until nib_qlinear_free and, when zero_copy, nib_st_close */
    nib_qckpt_info info;      /* the detection result */
    int zero_copy;            /* w.data points into the file's mapping (and w.scales, for
                                 NVFP4/MXFP4 always, for FP8 when they are aligned F32) */
    int bf16_rounded;         /* FLOAT F16/F32 weight: w holds its bf16 rounding and at least
                                 one value changed (use NIB_QCKPT_WANT_F32 for exact values) */
    int has_input_scale;      /* ModelOpt W4A4 / W8A8 static activation scale */
    float input_scale;        /* multiply-in activation global (amax / (6*448) or amax / 448) */
    float *f32;               /* [N][K] with NIB_QCKPT_WANT_F32, else NULL */
    /* internal: host buffers owned by this struct */
    void *own_data, *own_scales, *own_bias;
    nib_int4_weight int4;
} nib_qlinear;

/* Import "<base>" of f into *out without requantizing:
 *   NVFP4 (ModelOpt), MXFP4 (nib): zero copy, w.data / w.scales point into the mapping;
 *   FP8: w.data into the mapping; w.scales too when they are 4-byte-aligned F32, otherwise
 *        converted (exactly) to fp32 host memory; [N,1] is per channel like [N];
 *   GPTQ / AWQ / CT: converted into host buffers by formats/ importers (INT4 canonical:
 *        packed [N][K/2], fp16 scales [N][K/G], zeros, act-order perm);
 *   FLOAT: BF16 zero copy (when 2-byte aligned), F16/F32 rounded to bf16 (bf16_rounded).
 * Checked, each an error naming the tensor and what is wrong (the base is in every message):
 * missing parts, dtypes, shapes against N/K and the block or group, K odd or not a multiple of
 * the block, empty tensors, NaN / negative E4M3 block scales, E8M0 0xFF, non-finite or
 * non-positive fp32/fp16 scales (FP8 scale, NVFP4 global, input_scale, INT4 group scales),
 * INT4 scales not exactly representable in fp16 (BF16/F32 scale planes), g_idx out of range
 * or not a valid act-order grouping, weight_shape disagreeing with weight_packed, a config that
 * contradicts the tensors; finally nib_wsrc_validate. On failure *out is zeroed (safe to free).
 * opts may be NULL (flags 0, metadata config). */
nib_status nib_qckpt_get_linear(const nib_st_file *f, const char *base_name, nib_qlinear *out);
nib_status nib_qckpt_get_linear_ex(const nib_st_file *f, const char *base_name,
                                   const nib_qckpt_opts *opts, nib_qlinear *out);
/* Frees what get_linear allocated and zeroes *q. NULL and a zeroed struct are no-ops. */
void nib_qlinear_free(nib_qlinear *q);

/* Stack the rows of parts[0 .. n_parts) (imported weights of one format and one K) into one
 * weight with N = sum of the parts' N, in host buffers owned by *out: the fused q|k|v or
 * gate|up matrix of a layer. Exact (no requantization):
 *   BF16, MXFP4: planes stacked;
 *   NVFP4: planes stacked; every part must have the same global (weight_scale_2) — what
 *          ModelOpt exports for fused layers and `nib quantize` writes by default — else
 *          NIB_ERR_UNSUPPORTED naming the part and both values;
 *   FP8: elements stacked; the result is always per channel (a per-tensor scale is repeated
 *        on each of its rows);
 *   INT4: same group size; zero points materialised (8) for symmetric parts when any part is
 *        asymmetric; act-order permutations must be identical (or all absent).
 * Biases are stacked; a part without one contributes zeros when another part has one.
 * input_scale: the maximum of the parts' (vLLM's rule), when any has one.
 * out->f32 is not filled; out->info is parts[0]'s with n updated and no parts listed.
 * `name` names the fused weight in messages. On failure *out is zeroed. */
nib_status nib_qlinear_concat_rows(const nib_qlinear *parts, size_t n_parts, const char *name,
                                   nib_qlinear *out);

/* ---- element scans (nib inspect --check, NIB_QCKPT_CHECK_ELEMENTS) -------------------------- */
typedef struct nib_qckpt_bad {
    uint64_t count;         /* bad elements */
    uint64_t first;         /* index (row-major) of the first one; valid when count > 0 */
    const char *what;       /* "NaN", "Inf", "E4M3 NaN code", "E8M0 0xFF", ... (first one) */
} nib_qckpt_bad;
/* Scan a tensor's data: NaN/Inf for F16/BF16/F32/F64/F8_E5M2, NaN codes (0x7F/0xFF) for
 * F8_E4M3, 0xFF for F8_E8M0; other dtypes have no invalid values (count 0). */
void nib_qckpt_scan_tensor(const nib_st_tensor *t, nib_qckpt_bad *out);

/* ---- writing (the layouts of `nib quantize`) ------------------------------------------------
 * For each linear, in the writer's declaration phase call nib_qckpt_declare_linear, then (after
 * every declaration and nib_qckpt_set_metadata) nib_qckpt_write_linear with the data, in the
 * same order as declared. Tensors written for base B (little-endian, row-major):
 *   BF16   B.weight BF16 [N,K]
 *   FP8    B.weight F8_E4M3 [N,K]; B.weight_scale F32 [] (per tensor) or [N] (per channel)
 *   NVFP4  B.weight U8 [N,K/2]; B.weight_scale F8_E4M3 [N,K/16]; B.weight_scale_2 F32 []
 *          (ModelOpt; no input_scale: weight-only, quant_algo "W4A16_NVFP4")
 *   MXFP4  B.weight U8 [N,K/2]; B.weight_scale F8_E8M0 [N,K/32]
 *   INT4   GPTQ v1 layout: B.qweight I32 [K/8,N]; B.qzeros I32 [K/G,N/8] (zero-1, symmetric:
 *          all 7); B.scales F16 [K/G,N]; B.g_idx I32 [K]  (needs N % 8 == 0)
 * nib_qckpt_declare_linear reads only fmt, n, k, group and fp8_per_channel of src (data may be
 * NULL); nib_qckpt_write_linear needs the full description (nib_wsrc_validate'd) and must get
 * the same shape. src->bias is not written (copy bias tensors as they are). */
nib_status nib_qckpt_declare_linear(nib_st_writer *w, const char *base, const nib_wsrc *src);
nib_status nib_qckpt_write_linear(nib_st_writer *w, const char *base, const nib_wsrc *src);
/* File bytes nib_qckpt_write_linear writes for this description (0 if it cannot be written). */
uint64_t nib_qckpt_linear_file_bytes(const nib_wsrc *src);
/* Why src cannot be written in its format (K or N not a multiple of what the layout needs),
 * or NULL when it can. The text is static. */
const char *nib_qckpt_linear_unwritable(nib_wfmt fmt, int64_t n, int64_t k, int group);

/* One quantized linear of a mixed-format file (nib_qckpt_wconfig.layers). */
typedef struct nib_qckpt_wlayer {
    const char *base;             /* "<base>" as written */
    nib_wfmt fmt;                 /* NIB_WFMT_FP8 or NIB_WFMT_NVFP4 */
    int fp8_per_channel;
} nib_qckpt_wlayer;

/* What the file-level "quantization_config" says (docs/quantization.md has the exact JSON).
 * One format for every quantized linear (mixed = 0: fmt and its options), or, with mixed = 1,
 * ModelOpt's mixed-precision form: quant_algo "MIXED_PRECISION" and a "quantized_layers" object
 * giving each layer's algorithm (FP8 per tensor "FP8", per channel "FP8_PER_CHANNEL_PER_TOKEN",
 * NVFP4 "W4A16_NVFP4" with group_size 16); fmt and the format options are then ignored, and
 * any other layer format is NIB_ERR_INVALID_ARG. nib's importer does not need the per-layer
 * entries (it detects each layer from its tensors); they are there for other tools. */
typedef struct nib_qckpt_wconfig {
    nib_wfmt fmt;                 /* the format of the quantized linears */
    int group;                    /* INT4 group size */
    int asym;                     /* INT4 with zero points */
    int fp8_per_channel;
    nib_mxfp4_rule mxfp4_rule;
    const char *const *exclude;   /* linear bases (or tensor names) left unquantized */
    size_t n_exclude;
    int mixed;                    /* 1: per-layer formats in layers[] */
    const nib_qckpt_wlayer *layers;
    size_t n_layers;
} nib_qckpt_wconfig;
/* The JSON text (nib_malloc'ed, NUL-terminated) into *out. */
nib_status nib_qckpt_config_json(const nib_qckpt_wconfig *c, char **out);
/* nib_qckpt_config_json + nib_st_writer_set_metadata(w, "quantization_config", json). */
nib_status nib_qckpt_set_metadata(nib_st_writer *w, const nib_qckpt_wconfig *c);

/* ---- the default quantization rule of `nib quantize` ----------------------------------------
 * 1 when `name` is a linear weight of a transformer layer: it ends in ".<P>.weight" with P one
 * of q_proj k_proj v_proj o_proj out_proj gate_proj up_proj down_proj fc1 fc2, and an earlier
 * dot-separated component is "layers" followed by a component made only of digits. That takes
 * the Gemma (language model, action expert) attention/MLP projections and SigLIP's
 * encoder.layers.N.self_attn.{q,k,v,out}_proj / mlp.fc1 / mlp.fc2, and leaves embeddings,
 * lm_head, norms (incl. adaRMS "dense"), biases, the projector and the action/time heads. */
int nib_qckpt_default_rule(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* NIB_IO_QCHECKPOINT_H */
