/* fuzz_seeds.c — writes the seed corpora of the fuzz harnesses (no binaries checked in).
 *
 *   fuzz_seeds OUTDIR     writes OUTDIR/<harness>/NNN-* for harness = safetensors, json, qckpt, config
 *
 * safetensors seeds: valid files of several shapes and every dtype, written by nib's own writer
 * (nib_st_save) and by hand (unpadded headers, padded ones, header order != file order,
 * scalars, zero-size tensors at one offset, 8-dim shapes, escaped and non-ASCII names, metadata
 * with escapes and \u0000 in values), plus near-misses that exercise each rejection rule (hole,
 * overlap, trailing bytes, byte count mismatch, overflowing shape, bad padding, huge N).
 * qckpt seeds: one small layer of every layout in io/qcheckpoint.h (float, ModelOpt NVFP4,
 * nib MXFP4, FP8 per tensor / per channel, GPTQ with g_idx, AWQ, compressed-tensors
 * pack-quantized with zero points), one file mixing layouts, and their quantization configs.
 * config seeds: a file with every tensor the Pi0.5 config reader looks at (empty where it can),
 * with and without a "nib.pi05.config" metadata JSON; config JSONs; precision override specs.
 * json seeds: every safetensors header above, model-config-like documents, numbers at the int64
 * and double edges, every escape, surrogate pairs, deep nesting, and invalid near-misses.
 * Built and run by fuzz/fuzz.mk; deterministic output. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/safetensors.h"

static const char *g_out;
static int g_n;

static void die(const char *what) {
    fprintf(stderr, "fuzz_seeds: %s: %s\n", what, nib_last_error()[0] ? nib_last_error() : strerror(errno));
    exit(1);
}

static void put(const char *sub, const char *name, const void *p, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%03d-%s", g_out, sub, g_n++, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) die(path);
}

/* A safetensors file from a header text and data_len bytes of data; n_field = strlen(header)
 * unless given (-1). Also writes the header alone as a json seed. */
static void st_raw(const char *name, const char *header, long long n_field, size_t data_len) {
    size_t hl = strlen(header), len = 8 + hl + data_len;
    unsigned char *b = malloc(len);
    if (!b) die("malloc");
    unsigned long long nf = n_field < 0 ? hl : (unsigned long long)n_field;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(nf >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (unsigned char)(i * 37 + 11);
    put("safetensors", name, b, len);
    put("json", name, header, hl);
    free(b);
}

/* A file written by nib's writer, copied into the corpus. */
static void st_saved(const char *name, size_t n, const nib_st_save_tensor *ts, size_t n_meta,
                     const char *const *kv) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tmp.safetensors", g_out);
    if (nib_st_save(path, n, ts, n_meta, kv) != NIB_OK) die("nib_st_save");
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz);
    if (!b || fread(b, 1, (size_t)sz, f) != (size_t)sz) die("read back");
    fclose(f);
    remove(path);
    put("safetensors", name, b, (size_t)sz);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | b[i];
    put("json", name, b + 8, (size_t)hn);
    free(b);
}

/* A file for the quantized-checkpoint harness (and the safetensors one: a valid file). */
static void q_saved(const char *name, size_t n, const nib_st_save_tensor *ts, const char *qcfg) {
    const char *kv[2] = {"quantization_config", qcfg};
    char path[1024];
    snprintf(path, sizeof path, "%s/tmp.safetensors", g_out);
    if (nib_st_save(path, n, ts, qcfg ? 1 : 0, kv) != NIB_OK) die("nib_st_save");
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz);
    if (!b || fread(b, 1, (size_t)sz, f) != (size_t)sz) die("read back");
    fclose(f);
    remove(path);
    put("qckpt", name, b, (size_t)sz);
    free(b);
    if (qcfg) put("qckpt", "config", qcfg, strlen(qcfg));
}

static void json(const char *name, const char *text) { put("json", name, text, strlen(text)); }

static void safetensors_seeds(void) {
    static unsigned char data[4096];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 13 + 5);
    /* one tensor of every dtype, two shapes */
    for (int dt = 1; dt < NIB_DTYPE_COUNT; dt++) {
        nib_st_save_tensor t[2] = {
            {"model.layers.0.w", (nib_dtype)dt, 2, {3, 5}, data},
            {"model.layers.0.b", (nib_dtype)dt, 1, {4}, data},
        };
        char name[64];
        snprintf(name, sizeof name, "dtype-%s", nib_dtype_name((nib_dtype)dt));
        st_saved(name, 2, t, 0, NULL);
    }
    /* metadata, scalars, empty and 8-dim tensors, escaped names */
    {
        static const char *const kv[] = {"format", "pt", "quantization_config",
                                         "{\"quant_method\":\"nib\",\"group_size\":32}",
                                         "note", "tab\there \"quoted\" \xc3\xa9\xe2\x82\xac"};
        nib_st_save_tensor t[] = {
            {"scalar", NIB_DTYPE_F32, 0, {0}, data},
            {"empty", NIB_DTYPE_BF16, 2, {0, 7}, data},
            {"eight", NIB_DTYPE_U8, 8, {1, 2, 1, 2, 1, 2, 1, 2}, data},
            {"name with \"quotes\" \\ and \xc3\xa9", NIB_DTYPE_F16, 1, {3}, data},
            {"ctl\x01\x1f\x7f", NIB_DTYPE_I8, 1, {1}, data},
        };
        st_saved("meta-edge", NIB_ARRAY_LEN(t), t, 3, kv);
    }
    {
        nib_st_save_tensor t[40];
        char names[40][32];
        for (int i = 0; i < 40; i++) {
            snprintf(names[i], sizeof names[i], "layers.%d.p%d.%s", i / 4, i % 4, i % 2 ? "bias" : "weight");
            t[i] = (nib_st_save_tensor){names[i], (nib_dtype)(1 + i % (NIB_DTYPE_COUNT - 1)), 2,
                                        {i % 3, 1 + i % 5}, data};
        }
        st_saved("many-tensors", 40, t, 0, NULL);
    }
    st_saved("no-tensors", 0, NULL, 0, NULL);
    /* by hand: valid */
    st_raw("empty-unpadded", "{}", -1, 0);
    st_raw("empty-padded", "{}      ", -1, 0);
    st_raw("scalar-unpadded", "{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}", -1, 8);
    st_raw("header-order-reversed",
           "{\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[4,12]},"
           "\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,2],\"data_offsets\":[0,4]},"
           "\"z0\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[12,12]},"
           "\"z1\":{\"data_offsets\":[12,12],\"shape\":[5,0,3],\"dtype\":\"U64\"}}",
           -1, 12);
    st_raw("whitespace-json",
           "{ \"__metadata__\" : { \"k\" : \"v\\u0000w\" , \"\\ud83d\\ude00\" : \"\" } ,\n"
           "\t\"x\\n\\u00e9\" : { \"dtype\" : \"BF16\" , \"shape\" : [ 1 , 2 ] , "
           "\"data_offsets\" : [ 0 , 4 ] } }  ",
           -1, 4);
    st_raw("big-but-valid-dims", "{\"x\":{\"dtype\":\"BOOL\",\"shape\":[1,1,1,1,1,1,1,3],\"data_offsets\":[0,3]}}", -1, 3);
    /* by hand: each rejection rule */
    st_raw("bad-hole", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}", -1, 5);
    st_raw("bad-overlap", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", -1, 3);
    st_raw("bad-trailing", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", -1, 9);
    st_raw("bad-count", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,6]}}", -1, 6);
    st_raw("bad-overflow", "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", -1, 0);
    st_raw("bad-int64max", "{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807],\"data_offsets\":[0,9223372036854775807]}}", -1, 0);
    st_raw("bad-negative", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", -1, 1);
    st_raw("bad-float-dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1e0]}}", -1, 1);
    st_raw("bad-9-dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", -1, 1);
    st_raw("bad-dtype", "{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", -1, 1);
    st_raw("bad-extra-key", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":0}}", -1, 1);
    st_raw("bad-dup-key", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1);
    st_raw("bad-meta-type", "{\"__metadata__\":{\"k\":1}}", -1, 0);
    st_raw("bad-nul-name", "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1);
    st_raw("bad-padding-tab", "{}\t", -1, 0);
    st_raw("bad-leading-space", " {}", -1, 0);
    st_raw("bad-n-past-end", "{}", 100, 0);
    st_raw("bad-n-huge", "{}", 0x7fffffffffffffffLL, 0);
    st_raw("bad-n-zero", "", 0, 0);
    put("safetensors", "bad-short", "\x02\0\0\0\0\0\0", 7);
}

/* Layers of every layout in io/qcheckpoint.h, N = 16 output channels, K = 64 inputs, group 32,
 * with benign data: E2M1 bytes (no invalid codes), E4M3 bytes & 0x77 (never the NaN code 0x7F),
 * scales 1.0 (E4M3 0x38, E8M0 127, F16 0x3C00, F32 1.0f), GPTQ v1 zeros 7 (stored 0x77777777). */
static void qckpt_seeds(void) {
    enum { N = 16, K = 64, G = 32 };
    static unsigned char e2m1[N * K / 2], e4m3[N * K], bf16[N * K * 2];
    static unsigned char sc_e4m3[N * K / 16], sc_e8m0[N * K / 32];
    static uint16_t sc_f16[N * K / G], bias16[N];
    static float one[N], half[1] = {0.5f};
    static int32_t qw[N * K / 8], qz[(K / G) * (N / 8)], gidx[K];
    static int64_t wshape[2] = {N, K};
    for (size_t i = 0; i < sizeof e2m1; i++) e2m1[i] = (unsigned char)(i * 37 + 11);
    for (size_t i = 0; i < sizeof e4m3; i++) e4m3[i] = (unsigned char)((i * 29 + 3) & 0x77);
    for (size_t i = 0; i < sizeof bf16; i += 2) {
        bf16[i] = (unsigned char)(i * 7);
        bf16[i + 1] = (unsigned char)(0x3C + (i / 2) % 3); /* 1.x .. 4.x, finite */
    }
    memset(sc_e4m3, 0x38, sizeof sc_e4m3);
    memset(sc_e8m0, 127, sizeof sc_e8m0);
    for (size_t i = 0; i < NIB_ARRAY_LEN(sc_f16); i++) sc_f16[i] = 0x3C00;
    for (size_t i = 0; i < NIB_ARRAY_LEN(bias16); i++) bias16[i] = 0x3F80; /* bf16 1.0 */
    for (size_t i = 0; i < N; i++) one[i] = 1.0f;
    for (size_t i = 0; i < NIB_ARRAY_LEN(qw); i++) qw[i] = (int32_t)(0x12345678u * (uint32_t)(i + 1));
    for (size_t i = 0; i < NIB_ARRAY_LEN(qz); i++) qz[i] = 0x77777777;
    for (int i = 0; i < K; i++) gidx[i] = i / G;
    {
        nib_st_save_tensor t[] = {
            {"l.float.weight", NIB_DTYPE_BF16, 2, {N, K}, bf16},
            {"l.float.bias", NIB_DTYPE_BF16, 1, {N}, bias16},
        };
        q_saved("float", NIB_ARRAY_LEN(t), t, NULL);
    }
    {
        nib_st_save_tensor t[] = {
            {"l.nv.weight", NIB_DTYPE_U8, 2, {N, K / 2}, e2m1},
            {"l.nv.weight_scale", NIB_DTYPE_F8_E4M3, 2, {N, K / 16}, sc_e4m3},
            {"l.nv.weight_scale_2", NIB_DTYPE_F32, 0, {0}, half},
            {"l.nv.input_scale", NIB_DTYPE_F32, 1, {1}, half},
        };
        q_saved("nvfp4-modelopt", NIB_ARRAY_LEN(t), t,
                "{\"quantization\":{\"quant_algo\":\"NVFP4\",\"group_size\":16}}");
    }
    {
        nib_st_save_tensor t[] = {
            {"l.mx.weight", NIB_DTYPE_U8, 2, {N, K / 2}, e2m1},
            {"l.mx.weight_scale", NIB_DTYPE_F8_E8M0, 2, {N, K / 32}, sc_e8m0},
            {"l.mx.bias", NIB_DTYPE_BF16, 1, {N}, bias16},
        };
        q_saved("mxfp4-nib", NIB_ARRAY_LEN(t), t,
                "{\"quant_method\":\"nib\",\"quant_algo\":\"MXFP4\",\"group_size\":32}");
    }
    {
        nib_st_save_tensor t[] = {
            {"l.f8t.weight", NIB_DTYPE_F8_E4M3, 2, {N, K}, e4m3},
            {"l.f8t.weight_scale", NIB_DTYPE_F32, 0, {0}, half},
            {"l.f8c.weight", NIB_DTYPE_F8_E4M3, 2, {N, K}, e4m3},
            {"l.f8c.weight_scale", NIB_DTYPE_F32, 2, {N, 1}, one},
            {"l.f8c.input_scale", NIB_DTYPE_F32, 0, {0}, half},
        };
        q_saved("fp8", NIB_ARRAY_LEN(t), t, NULL);
    }
    {
        nib_st_save_tensor t[] = {
            {"l.gptq.qweight", NIB_DTYPE_I32, 2, {K / 8, N}, qw},
            {"l.gptq.qzeros", NIB_DTYPE_I32, 2, {K / G, N / 8}, qz},
            {"l.gptq.scales", NIB_DTYPE_F16, 2, {K / G, N}, sc_f16},
            {"l.gptq.g_idx", NIB_DTYPE_I32, 1, {K}, gidx},
            {"l.gptq.bias", NIB_DTYPE_BF16, 1, {N}, bias16},
        };
        q_saved("gptq", NIB_ARRAY_LEN(t), t,
                "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":32,"
                "\"checkpoint_format\":\"gptq\"}");
    }
    {
        nib_st_save_tensor t[] = {
            {"l.awq.qweight", NIB_DTYPE_I32, 2, {K, N / 8}, qw},
            {"l.awq.qzeros", NIB_DTYPE_I32, 2, {K / G, N / 8}, qz},
            {"l.awq.scales", NIB_DTYPE_F16, 2, {K / G, N}, sc_f16},
        };
        q_saved("awq", NIB_ARRAY_LEN(t), t,
                "{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":32,\"version\":\"gemm\"}");
    }
    {
        nib_st_save_tensor t[] = {
            {"l.ct.weight_packed", NIB_DTYPE_I32, 2, {N, K / 8}, qw},
            {"l.ct.weight_scale", NIB_DTYPE_F16, 2, {N, K / G}, sc_f16},
            {"l.ct.weight_zero_point", NIB_DTYPE_I32, 2, {N / 8, K / G}, qz},
            {"l.ct.weight_g_idx", NIB_DTYPE_I32, 1, {K}, gidx},
            {"l.ct.weight_shape", NIB_DTYPE_I64, 1, {2}, wshape},
        };
        q_saved("ct-pack-quantized", NIB_ARRAY_LEN(t), t,
                "{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\","
                "\"config_groups\":{\"group_0\":{\"weights\":{\"num_bits\":4,\"group_size\":32}}}}");
    }
    {   /* several layouts in one file */
        nib_st_save_tensor t[] = {
            {"m.a.weight", NIB_DTYPE_U8, 2, {N, K / 2}, e2m1},
            {"m.a.weight_scale", NIB_DTYPE_F8_E8M0, 2, {N, K / 32}, sc_e8m0},
            {"m.b.weight", NIB_DTYPE_F8_E4M3, 2, {N, K}, e4m3},
            {"m.b.weight_scale", NIB_DTYPE_BF16, 1, {N}, bias16},
            {"m.c.qweight", NIB_DTYPE_I32, 2, {K / 8, N}, qw},
            {"m.c.qzeros", NIB_DTYPE_I32, 2, {K / G, N / 8}, qz},
            {"m.c.scales", NIB_DTYPE_F16, 2, {K / G, N}, sc_f16},
            {"m.norm.weight", NIB_DTYPE_BF16, 1, {N}, bias16},
        };
        q_saved("mixed", NIB_ARRAY_LEN(t), t, NULL);
    }
}

/* A file with every tensor nib_pi05_config_from_file reads, as small as the shapes allow (a
 * trailing 0 dimension where the reader looks only at the others), plus the metadata config;
 * then config JSONs and precision override specs. */
static void put_file(const char *sub, const char *name, size_t n, const nib_st_save_tensor *ts,
                     const char *meta_key, const char *meta_val) {
    const char *kv[2] = {meta_key, meta_val};
    char path[1024];
    snprintf(path, sizeof path, "%s/tmp.safetensors", g_out);
    if (nib_st_save(path, n, ts, meta_key ? 1 : 0, kv) != NIB_OK) die("nib_st_save");
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz);
    if (!b || fread(b, 1, (size_t)sz, f) != (size_t)sz) die("read back");
    fclose(f);
    remove(path);
    put(sub, name, b, (size_t)sz);
    free(b);
}

static void config_seeds(void) {
#define VP "paligemma_with_expert.paligemma.model.vision_tower.vision_model"
#define LP "paligemma_with_expert.paligemma.model.language_model"
#define EP "paligemma_with_expert.gemma_expert.model"
    static unsigned char z[64 * 8];
    nib_st_save_tensor t[] = {
        {VP ".embeddings.patch_embedding.weight", NIB_DTYPE_BF16, 4, {32, 3, 14, 0}, z},
        {VP ".embeddings.position_embedding.weight", NIB_DTYPE_BF16, 2, {16, 0}, z},
        {VP ".encoder.layers.0.layer_norm1.weight", NIB_DTYPE_BF16, 1, {0}, z},
        {VP ".encoder.layers.1.layer_norm1.weight", NIB_DTYPE_BF16, 1, {0}, z},
        {VP ".encoder.layers.0.mlp.fc1.weight", NIB_DTYPE_BF16, 2, {64, 0}, z},
        {"paligemma_with_expert.paligemma.lm_head.weight", NIB_DTYPE_U8, 2, {100, 4}, z},
        {LP ".layers.0.self_attn.q_proj.weight", NIB_DTYPE_BF16, 2, {8, 0}, z},
        {LP ".layers.1.self_attn.q_proj.weight", NIB_DTYPE_BF16, 2, {8, 0}, z},
        {LP ".layers.0.self_attn.k_proj.weight", NIB_DTYPE_BF16, 2, {4, 0}, z},
        {LP ".layers.0.mlp.gate_proj.weight", NIB_DTYPE_BF16, 2, {16, 0}, z},
        {"model.action_in_proj.weight", NIB_DTYPE_U8, 2, {32, 8}, z},
        {EP ".layers.0.self_attn.q_proj.weight", NIB_DTYPE_BF16, 2, {8, 0}, z},
        {EP ".layers.1.self_attn.q_proj.weight", NIB_DTYPE_BF16, 2, {8, 0}, z},
        {EP ".layers.0.mlp.gate_proj.weight", NIB_DTYPE_BF16, 2, {16, 0}, z},
    };
    put_file("config", "pi05-shapes", NIB_ARRAY_LEN(t), t, NULL, NULL);
    put_file("config", "pi05-shapes-meta", NIB_ARRAY_LEN(t), t, "nib.pi05.config",
             "{\"v_heads\":4,\"kv_heads\":1,\"steps\":10,\"max_text\":24,\"max_horizon\":16,"
             "\"vocab\":100}");
    put_file("config", "pi05-shapes-bad-meta", NIB_ARRAY_LEN(t), t, "nib.pi05.config",
             "{\"v_heads\":3,\"steps\":0}");
    static const char *const js[] = {
        "{\"v_width\":1152,\"v_layers\":27,\"v_heads\":16,\"v_head_dim\":72,\"v_mlp\":4304,"
        "\"v_patch\":14,\"v_image\":224,\"v_channels\":3,\"v_tokens\":256,\"width\":2048,"
        "\"layers\":18,\"heads\":8,\"kv_heads\":1,\"head_dim\":256,\"mlp\":16384,"
        "\"vocab\":257152,\"e_width\":1024,\"e_layers\":18,\"e_heads\":8,\"e_mlp\":4096,"
        "\"action_dim\":32,\"max_cameras\":3,\"max_text\":200,\"max_horizon\":50,\"steps\":10}",
        "{\"steps\":1000000,\"vocab\":16777216,\"unknown\":[1,{\"x\":null}]}",
        "{\"heads\":-1}",
        "{\"vocab\":1.5}",
        "[]",
        "vision=fp8,prefix=bf16,expert=nvfp4,kv=fp8",
        "backend=ref,expert=int4,kv=nvfp4",
        "vision=mxfp4,backend=cuda,kv=bf16,prefix=fp8",
        "expert",
        "=,,=bf16",
    };
    for (size_t i = 0; i < NIB_ARRAY_LEN(js); i++) {
        char name[32];
        snprintf(name, sizeof name, "text-%zu", i);
        put("config", name, js[i], strlen(js[i]));
    }
#undef VP
#undef LP
#undef EP
}

static void json_seeds(void) {
    json("config-gemma",
         "{\"architectures\":[\"PaliGemmaForConditionalGeneration\"],\"model_type\":\"paligemma\","
         "\"text_config\":{\"hidden_size\":2048,\"intermediate_size\":16384,\"num_attention_heads\":8,"
         "\"num_key_value_heads\":1,\"head_dim\":256,\"rms_norm_eps\":1e-06,\"rope_theta\":10000.0,"
         "\"vocab_size\":257152,\"hidden_activation\":\"gelu_pytorch_tanh\",\"tie_word_embeddings\":true},"
         "\"vision_config\":{\"hidden_size\":1152,\"image_size\":224,\"patch_size\":14,\"num_hidden_layers\":27,"
         "\"layer_norm_eps\":1e-6},\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,"
         "\"group_size\":128,\"desc_act\":false,\"checkpoint_format\":\"gptq\"},\"torch_dtype\":\"bfloat16\","
         "\"bos_token_id\":2,\"eos_token_id\":[1,107],\"pad_token_id\":null}");
    json("numbers",
         "[0,-0,1,-1,9223372036854775807,-9223372036854775808,9223372036854775808,"
         "-9223372036854775809,1.5,-2.25e-3,1E+2,1e308,1.7976931348623157e308,4.9e-324,1e-400,"
         "123456789012345678901234567890,0.000000000000000000001]");
    json("strings",
         "[\"\",\"plain\",\"\\\"\\\\\\/\\b\\f\\n\\r\\t\",\"\\u0000\\u001f\\u007f\\u0080\\u009f\",\"\\uD83D\\uDE00\","
         "\"\\udbff\\udfff\",\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\xef\xbf\xbf\","
         "\"\\u00e9\\u20AC\"]");
    json("literals", "[true,false,null,[],{},[[]],{\"a\":{}}]");
    json("keys", "{\"a\":1,\"A\":2,\"a \":3,\"\":4,\"\\u0000\":5,\"\\u0000a\":6,\"b\":[{\"a\":1,\"b\":2}]}");
    {
        char deep[300];
        int n = 0;
        for (int i = 0; i < 64; i++) deep[n++] = '[';
        for (int i = 0; i < 64; i++) deep[n++] = ']';
        deep[n] = 0;
        json("depth-64", deep);
        deep[n++] = ']';
        memmove(deep + 1, deep, (size_t)n);
        deep[0] = '[';
        deep[n + 1] = 0;
        json("bad-depth-65", deep);
    }
    json("bad-trailing-comma", "{\"a\":[1,2,],}");
    json("bad-leading-zero", "[01]");
    json("bad-nan", "[NaN,Infinity]");
    json("bad-overflow-double", "[1e400]");
    json("bad-lone-surrogate", "[\"\\ud800\",\"\\udc00x\"]");
    json("bad-utf8", "[\"\xc0\xaf\",\"\xed\xa0\x80\",\"\xf4\x90\x80\x80\",\"\xe2\x82\"]");
    json("bad-control", "[\"a\tb\"]");
    json("bad-dup", "{\"k\":1,\"j\":2,\"k\":3}");
    json("bad-after", "{} {}");
    json("bad-comment", "{/*c*/}");
}

int main(int argc, char **argv) {
    char path[1024];
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds OUTDIR\n");
        return 2;
    }
    g_out = argv[1];
    mkdir(g_out, 0755);
    snprintf(path, sizeof path, "%s/safetensors", g_out);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/json", g_out);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/qckpt", g_out);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/config", g_out);
    mkdir(path, 0755);
    safetensors_seeds();
    qckpt_seeds();
    config_seeds();
    json_seeds();
    printf("fuzz_seeds: wrote %d seed files under %s\n", g_n, g_out);
    return 0;
}
