/* formats.h — nib's low-bit number formats: exact scalar conversions and the C reference
 * quantizers / dequantizers. This code is the spec: GPU kernels and `nib quantize` are checked
 * against it bit for bit. docs/formats.md describes every format and layout in prose.
 *
 * Conventions shared by every weight format:
 *   - A weight is row-major W[n][k] fp32 on the host: n = output channels (rows), k = input
 *     channels, contiguous. Blocks and groups run along k.
 *   - Storage is PLANAR: an element plane (packed codes) and a scale plane (one scale per block),
 *     each row-major over [n][...], exactly what checkpoints hold and kernels repack from.
 *   - 4-bit codes are packed two per byte along k: element 2i in the LOW nibble of byte i,
 *     element 2i+1 in the high nibble (ModelOpt, compressed-tensors, gpt-oss agree).
 *   - All arithmetic is IEEE fp32 with round-to-nearest-even, in the order written here; every
 *     rounding to a small format is round-to-nearest, ties-to-even (RNE).
 *   - Quantizers reject NaN/Inf inputs (NIB_ERR_NUMERICS naming row and column) before anything
 *     else, so the NaN rules of the scalar encoders below never matter for weights.
 *   - All-zero blocks/groups/rows/tensors have defined scales (documented per format) and
 *     dequantize to exact zeros; no division by zero can happen.
 */
#ifndef NIB_FORMATS_H
#define NIB_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- scalar conversions ------------------------------------------------------------------
 * Encoders take fp32 and round to nearest, ties to even. Decoders are exact (every value of
 * these formats is an fp32 value). */

/* bf16: overflow rounds to Inf (IEEE), Inf stays Inf, NaN stays NaN with its sign and top
 * payload bits and the quiet bit forced (a signalling NaN never truncates to Inf). */
uint16_t nib_f32_to_bf16(float x);
float nib_bf16_to_f32(uint16_t h);

/* IEEE binary16: values >= 65520 (max 65504 + half an ulp) round to Inf, subnormals (down to
 * 2^-24) are rounded correctly, NaN stays NaN (sign, top payload bits, quiet bit forced). */
uint16_t nib_f32_to_f16(float x);
float nib_f16_to_f32(uint16_t h);

/* FP8 E4M3 ("e4m3fn": bias 7, no Inf, NaN = S.1111.111, max 448 = 0x7E, min subnormal 2^-9).
 * SATURATING like CUDA's __NV_SATFINITE: finite |x| > 448 AND ±Inf become ±448 (0x7E/0xFE).
 * NaN becomes 0x7F, or 0xFF for a NaN with the sign bit set (the sign is kept). */
#define NIB_E4M3_MAX 448.0f
uint8_t nib_f32_to_e4m3(float x);
float nib_e4m3_to_f32(uint8_t c); /* 0x7F / 0xFF -> NaN */

/* FP8 E5M2 (bias 15, IEEE-like: Inf = S.11111.00, NaN = S.11111.{01,10,11}, max 57344).
 * Finite |x| > 57344 saturates to ±57344 (0x7B/0xFB) — no finite value becomes Inf —
 * while ±Inf stays ±Inf (0x7C/0xFC). NaN becomes 0x7E with its sign kept (0xFE). */
#define NIB_E5M2_MAX 57344.0f
uint8_t nib_f32_to_e5m2(float x);
float nib_e5m2_to_f32(uint8_t c);

/* E8M0 (exponent only, bias 127): value 2^(c-127) for c = 0..254 (2^-127 .. 2^127); 0xFF NaN. */
float nib_e8m0_to_f32(uint8_t c);

/* E2M1 (FP4) 4-bit code: bit 3 = sign, bits 0..2 index the grid {0, .5, 1, 1.5, 2, 3, 4, 6}.
 * RNE on that grid (ties go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2,
 * 3.5->4, 5->4), saturating: |x| > 5 (incl. Inf) -> ±6. The sign bit is the IEEE sign, so
 * -0.0 and small negatives encode as 0x8 (-0). NaN -> 0x7 (+6): E2M1 has no NaN; nib picks
 * the loud value (quantizers reject NaN before they get here). */
#define NIB_E2M1_MAX 6.0f
uint8_t nib_f32_to_e2m1(float x);
float nib_e2m1_to_f32(uint8_t code); /* uses the low 4 bits of code */

/* ---- 4-bit packing helpers (element 2i low nibble) -------------------------------------- */
static inline uint8_t nib_u4_get(const uint8_t *packed, int64_t i) {
    return (uint8_t)((packed[i >> 1] >> ((i & 1) * 4)) & 0xF);
}
static inline void nib_u4_set(uint8_t *packed, int64_t i, uint8_t v) {
    uint8_t sh = (uint8_t)((i & 1) * 4);
    packed[i >> 1] = (uint8_t)((packed[i >> 1] & ~(0xF << sh)) | ((v & 0xF) << sh));
}

/* ---- block views of the element planes ---------------------------------------------------
 * A row of an element plane is an array of these (no padding); the scales live in their own
 * plane. qs[i] holds elements 2i (low nibble) and 2i+1 (high nibble) of the block. */
#define NIB_NVFP4_BLOCK 16
#define NIB_MXFP4_BLOCK 32
typedef struct nib_nvfp4_block16 { uint8_t qs[NIB_NVFP4_BLOCK / 2]; } nib_nvfp4_block16;
typedef struct nib_mxfp4_block32 { uint8_t qs[NIB_MXFP4_BLOCK / 2]; } nib_mxfp4_block32;
typedef struct nib_int4_group32 { uint8_t qs[16]; } nib_int4_group32;
typedef struct nib_int4_group64 { uint8_t qs[32]; } nib_int4_group64;
typedef struct nib_int4_group128 { uint8_t qs[64]; } nib_int4_group128;
_Static_assert(sizeof(nib_nvfp4_block16) == 8, "NVFP4 block: 16 codes in 8 bytes");
_Static_assert(sizeof(nib_mxfp4_block32) == 16, "MXFP4 block: 32 codes in 16 bytes");
_Static_assert(sizeof(nib_int4_group32) == 16, "INT4 g32: 32 codes in 16 bytes");
_Static_assert(sizeof(nib_int4_group64) == 32, "INT4 g64: 64 codes in 32 bytes");
_Static_assert(sizeof(nib_int4_group128) == 64, "INT4 g128: 128 codes in 64 bytes");

/* ---- shared checks -------------------------------------------------------------------------
 * n, k >= 0, k % block == 0 (block 1 = no constraint), n*k fits in size_t. Errors:
 * NIB_ERR_SHAPE ("<what>: k = 40 is not a multiple of 16"), NIB_ERR_OVERFLOW. */
nib_status nib_fmt_check_dims(int64_t n, int64_t k, int64_t block, const char *what);
/* First NaN/Inf of w[n][k] -> NIB_ERR_NUMERICS "<what>: NaN at row r, col c". */
nib_status nib_fmt_check_finite(const float *w, int64_t n, int64_t k, const char *what);

/* ---- NVFP4 (ModelOpt semantics) ----------------------------------------------------------
 * value = e2m1 * e4m3_block_scale * global, 16-element blocks along k.
 *   global      = amax(|W|) / 2688 (fp32 division; 2688 = 6 * 448), raised to at least
 *                 NIB_NVFP4_GLOBAL_MIN so every fp32 denominator below stays normal; an all-zero
 *                 tensor gets global = 1.0.
 *   block scale = e4m3( clamp(block_amax / (6 * global), 2^-9, 448) ), fp32 product and
 *                 quotient; an all-zero block gets 1.0 (0x38). Always positive.
 *   element     = e2m1( x / (e4m3_to_f32(scale) * global) ), fp32 product then quotient.
 * Dequantization: out = (e2m1 * e4m3) * global: the first product is exact, so out is the
 * correctly rounded fp32 of the exact value. */
#define NIB_NVFP4_GLOBAL_MIN 0x1p-117f
/* packed u8 [n][k/2], scales e4m3 [n][k/16], *global out. k % 16 != 0 -> NIB_ERR_SHAPE;
 * NaN/Inf -> NIB_ERR_NUMERICS naming row/col. */
nib_status nib_nvfp4_quantize(const float *w, int64_t n, int64_t k, uint8_t *packed,
                              uint8_t *scales, float *global);
/* Same with a given global (shards of a fused q|k|v or gate|up sharing one scale). global must
 * be finite and >= NIB_NVFP4_GLOBAL_MIN (NIB_ERR_INVALID_ARG otherwise); blocks whose scale
 * would pass 448 are clamped and their elements saturate at ±6. */
nib_status nib_nvfp4_quantize_global(const float *w, int64_t n, int64_t k, uint8_t *packed,
                                     uint8_t *scales, float global);
nib_status nib_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, float global,
                                int64_t n, int64_t k, float *out);
/* The global a tensor with this amax gets (the rule above). */
float nib_nvfp4_global_for_amax(float amax);
/* The block-scale rule for one block (e4m3 code). */
uint8_t nib_nvfp4_block_scale(float block_amax, float global);

/* ---- MXFP4 (OCP Microscaling v1.0) -------------------------------------------------------
 * value = e2m1 * 2^(s - 127), 32-element blocks along k, one E8M0 scale byte s per block.
 * The element is e2m1(x / 2^e) (an exact power-of-two scaling, then RNE, saturating at ±6).
 * The shared exponent e (clamped to [-127, 127]; all-zero block -> e = -127, byte 0x00, the
 * same byte the OCP reference gives) is chosen by one of these rules: */
typedef enum nib_mxfp4_rule {
    /* OCP reference (microxcaling): e = floor(log2 amax) - 2. amax / 2^e lies in [4, 8), so
     * block elements in (6, 8)·2^e saturate to 6·2^e. */
    NIB_MXFP4_SCALE_FLOOR = 0,
    /* smallest e with amax / 2^e <= 6: nothing saturates, the step may double. */
    NIB_MXFP4_SCALE_CEIL = 1,
    /* round the block max first: FLOOR, plus one when amax / 2^e >= 7, i.e. when the block
     * max would round (RNE) to 8 on the E2M1 grid extended by one binade. */
    NIB_MXFP4_SCALE_ROUND = 2,
    NIB_MXFP4_RULE_COUNT = 3
} nib_mxfp4_rule;
/* Lowest NMSE of the three on N(0,1) and Student-t(3) data (`nib formats`, docs/formats.md). */
#define NIB_MXFP4_SCALE_DEFAULT NIB_MXFP4_SCALE_ROUND
const char *nib_mxfp4_rule_name(nib_mxfp4_rule r); /* "floor" | "ceil" | "round" */
/* packed u8 [n][k/2], scales e8m0 [n][k/32]. k % 32 != 0 -> NIB_ERR_SHAPE. */
nib_status nib_mxfp4_quantize(const float *w, int64_t n, int64_t k, nib_mxfp4_rule rule,
                              uint8_t *packed, uint8_t *scales);
/* A scale byte 0xFF (NaN) dequantizes its block to NaN. */
nib_status nib_mxfp4_dequantize(const uint8_t *packed, const uint8_t *scales, int64_t n,
                                int64_t k, float *out);
/* The exponent rule for one block (e8m0 byte). */
uint8_t nib_mxfp4_block_scale(float block_amax, nib_mxfp4_rule rule);

/* ---- INT4 weight-only (GPTQ / AWQ compatible) --------------------------------------------
 * Groups of `group` (32, 64, 128; default 128) stored columns along k share an fp16 scale.
 *   symmetric:  scale = fp16(amax / 8); q = clamp(rne(x / scale), -8, 7) + 8;
 *               value = (q - 8) * scale
 *   asymmetric: lo = min(min x, 0), hi = max(max x, 0); scale = fp16((hi - lo) / 15);
 *               zero = clamp(rne(-lo / scale), 0, 15); q = clamp(rne(x / scale) + zero, 0, 15);
 *               value = (q - zero) * scale
 * The scale is rounded to fp16 FIRST and the codes are computed with the rounded scale, so
 * dequantization (an exact fp32 product) reproduces what the quantizer aimed at. A scale that
 * rounds to 0 (all-zero group) becomes 1.0; one that overflows fp16 is NIB_ERR_NUMERICS.
 * Canonical layout (all row-major):
 *   packed  u8  [n][k/2]      unsigned codes 0..15, stored column 2i in the low nibble
 *   scales  u16 [n][k/group]  fp16 bits
 *   zeros   u8  [n][k/group]  0..15, asymmetric only (NULL: symmetric, zero point 8)
 *   perm    i32 [k]           act-order: stored column j holds input channel perm[j]
 *                             (NULL = identity); groups are runs of stored columns. */
#define NIB_INT4_GROUP_DEFAULT 128
typedef struct nib_int4_weight {
    int64_t n, k;
    int group;
    int asym;
    uint8_t *packed;  /* [n][k/2] */
    uint16_t *scales; /* [n][k/group] fp16 bits */
    uint8_t *zeros;   /* [n][k/group] or NULL */
    int32_t *perm;    /* [k] or NULL */
} nib_int4_weight;

/* Allocates the planes (zero-filled; perm only if with_perm, set to the identity). group must
 * be 32/64/128 (NIB_ERR_UNSUPPORTED) and divide k (NIB_ERR_SHAPE). On failure *w is zeroed. */
nib_status nib_int4_alloc(nib_int4_weight *w, int64_t n, int64_t k, int group, int asym,
                          int with_perm);
/* Frees the planes and zeroes *w. NULL and a zeroed struct are no-ops. */
void nib_int4_free(nib_int4_weight *w);
/* Quantizes w[n][k] into *out (allocated here; free with nib_int4_free). perm (optional, [k],
 * must be a permutation) stores input channel perm[j] at column j before grouping. */
nib_status nib_int4_quantize(const float *w, int64_t n, int64_t k, int group, int asym,
                             const int32_t *perm, nib_int4_weight *out);
/* out[n][k] fp32 in ORIGINAL input-channel order (perm applied). */
nib_status nib_int4_dequantize(const nib_int4_weight *w, float *out);

/* GPTQ v1 checkpoint (AutoGPTQ "gptq" format) -> canonical INT4.
 *   qweight i32 [k/8][n]      packed along k: row r, bits 4j..4j+3 = input channel 8r+j
 *   qzeros  i32 [k/g][n/8]    packed along n (sequential nibbles), stored as zero-1 (mod 16)
 *   scales  u16 [k/g][n]      fp16 bits
 *   g_idx   i32 [k] or NULL   group of each input channel (NULL or i/g: no act-order)
 * Act-order: channels are stable-sorted by g_idx into perm; every group must then hold exactly
 * `group` channels (NIB_ERR_FORMAT naming the group). k % group != 0 -> NIB_ERR_UNSUPPORTED;
 * n % 8 or k % 8 -> NIB_ERR_SHAPE. If every zero is 8 the result is symmetric (zeros NULL). */
nib_status nib_int4_from_gptq(const int32_t *qweight, const int32_t *qzeros,
                              const uint16_t *scales, const int32_t *g_idx, int64_t n, int64_t k,
                              int group, nib_int4_weight *out);
/* Canonical INT4 -> GPTQ v1 tensors (shapes as above; g_idx always written). n % 8 == 0. */
nib_status nib_int4_to_gptq(const nib_int4_weight *w, int32_t *qweight, int32_t *qzeros,
                            uint16_t *scales, int32_t *g_idx);
/* AWQ GEMM checkpoint (AutoAWQ) -> canonical INT4.
 *   qweight i32 [k][n/8]      packed along n, nibble i holds column 8c + {0,2,4,6,1,3,5,7}[i]
 *   qzeros  i32 [k/g][n/8]    same interleave, true zero points
 *   scales  u16 [k/g][n]      fp16 bits;  value = (q - z) * s
 * All zeros 8 -> symmetric form, otherwise asymmetric. */
nib_status nib_int4_from_awq(const int32_t *qweight, const int32_t *qzeros,
                             const uint16_t *scales, int64_t n, int64_t k, int group,
                             nib_int4_weight *out);

/* ---- FP8 E4M3 weights ---------------------------------------------------------------------
 * Per tensor (scales[1]) or per output channel (scales[n]): scale = amax / 448 (fp32), raised
 * to at least 2^-126 (FLT_MIN) so it stays normal; an all-zero tensor/row gets 1.0.
 * q = e4m3(w / scale) (saturating); value = e4m3_to_f32(q) * scale. */
nib_status nib_fp8_quantize(const float *w, int64_t n, int64_t k, int per_channel, uint8_t *q,
                            float *scales);
nib_status nib_fp8_dequantize(const uint8_t *q, const float *scales, int64_t n, int64_t k,
                              int per_channel, float *out);

/* ---- error metrics --------------------------------------------------------------------------
 * Accumulated in fp64 over n values. nmse = sum (ref-got)^2 / sum ref^2 (0 when both are all
 * zero, +Inf when only ref is); rel_l2 = sqrt(nmse); cosine = <ref,got> / (|ref| |got|) (1 when
 * both are zero, 0 when one is); max_abs = max |ref-got|. n_nonfinite counts positions where ref
 * or got is NaN/Inf (then nmse, rel_l2, cosine and max_abs are NaN). */
typedef struct nib_quant_err {
    double nmse;
    double rel_l2;
    double cosine;
    double max_abs;
    size_t n_nonfinite;
} nib_quant_err;
nib_status nib_quant_error(const float *ref, const float *got, size_t n, nib_quant_err *out);
/* The same in two halves, for sums taken over chunks (nib quantize): add n values' fp64 terms to
 * t (start from a zeroed struct; merge chunks with nib_quant_err_merge in a fixed order), then
 * turn the terms into the metrics. nib_quant_error is accumulate + finish over one chunk. */
typedef struct nib_quant_err_terms {
    double se, rr, gg, rg, mx; /* sum (ref-got)^2, sum ref^2, sum got^2, sum ref*got, max |ref-got| */
    size_t bad;                /* positions with a NaN/Inf */
} nib_quant_err_terms;
void nib_quant_err_accumulate(const float *ref, const float *got, size_t n, nib_quant_err_terms *t);
void nib_quant_err_merge(nib_quant_err_terms *t, const nib_quant_err_terms *add);
void nib_quant_err_finish(const nib_quant_err_terms *t, nib_quant_err *out);

#ifdef __cplusplus
}
#endif
#endif /* NIB_FORMATS_H */
