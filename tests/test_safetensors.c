/* test_safetensors.c — the safetensors reader against a malformed corpus generated here from
 * one valid base file (no checked-in binaries), truncation and random-mutation sweeps, writer
 * round trips, writer misuse, and the `nib inspect` command's exit codes.
 *
 * Every buffer handed to nib_st_open_memory is its own heap block of exactly the file's size,
 * so under `make san-test` (ASan + UBSan) a read past the end of a file is a test failure. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "harness.h"
#include "io/json.h"
#include "io/safetensors.h"

typedef struct bytes {
    unsigned char *p;
    size_t len;
} bytes;

/* [n_field as u64 LE][header: hlen bytes][data_len bytes of a fixed pattern]. */
static bytes st_build(uint64_t n_field, const char *header, size_t hlen, size_t data_len) {
    bytes b = {NULL, 8 + hlen + data_len};
    b.p = malloc(b.len ? b.len : 1);
    if (!b.p) return b;
    for (int i = 0; i < 8; i++) b.p[i] = (unsigned char)(n_field >> (8 * i));
    memcpy(b.p + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++) b.p[8 + hlen + i] = (unsigned char)(i * 7 + 3);
    return b;
}

static bytes st_file(const char *header, size_t data_len) {
    return st_build(strlen(header), header, strlen(header), data_len);
}

static bytes copy_prefix(const bytes *b, size_t len) {
    bytes c = {malloc(len ? len : 1), len};
    if (c.p && len) memcpy(c.p, b->p, len);
    return c;
}

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n;
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A rejection must say where: every message ends "(byte N)" or, from JSON, "at byte N". */
static int has_offset(const char *msg) {
    return strstr(msg, "(byte ") != NULL || strstr(msg, " at byte ") != NULL;
}

/* Base file of the corpus: metadata and two tensors tiling 32 data bytes. */
#define META "\"__metadata__\":{\"format\":\"pt\"}"
#define ENTRY(name, dt, shape, offs)                                                          \
    "\"" name "\":{\"dtype\":" dt ",\"shape\":" shape ",\"data_offsets\":" offs "}"
#define TA ENTRY("w.a", "\"F32\"", "[2,3]", "[0,24]")
#define TB ENTRY("w.b", "\"BF16\"", "[4]", "[24,32]")
#define BASE "{" META "," TA "," TB "}"
#define BASE_DATA 32

/* Check one malformed file: from memory and from disk, same status, message with the byte
 * offset, the rule (why) and the tensor involved. */
static void expect_rejected(nib_test_ctx *t, const char *id, const bytes *b, nib_status want,
                            const char *why, const char *tensor) {
    nib_st_file *f = (nib_st_file *)1;
    nib_status st = nib_st_open_memory(b->p, b->len, &f);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", nib_last_error());
    CHECK_MSG(st == want, "%s: got %s, want %s: %s", id, nib_status_name(st),
              nib_status_name(want), msg);
    CHECK_MSG(f == NULL, "%s: no file handle on failure", id);
    CHECK_MSG(has_offset(msg), "%s: no byte offset in '%s'", id, msg);
    CHECK_MSG(strncmp(msg, "safetensors: ", 13) == 0, "%s: '%s'", id, msg);
    if (why) CHECK_MSG(strstr(msg, why), "%s: '%s' lacks '%s'", id, msg, why);
    if (tensor) CHECK_MSG(strstr(msg, tensor), "%s: '%s' does not name '%s'", id, msg, tensor);
    char path[512];
    snprintf(path, sizeof path, "%s/bad_%s.safetensors", nib_test_tmpdir(), id);
    REQUIRE(write_file(path, b->p, b->len));
    nib_status fst = nib_st_open(path, &f);
    CHECK_MSG(fst == st, "%s: file gives %s, memory %s", id, nib_status_name(fst),
              nib_status_name(st));
    CHECK_MSG(strstr(nib_last_error(), msg) && strstr(nib_last_error(), path),
              "%s: file message '%s' vs memory message '%s'", id, nib_last_error(), msg);
    CHECK(f == NULL);
    unlink(path);
}

typedef struct header_case {
    const char *id;
    const char *header;
    size_t hlen;     /* 0: strlen(header) */
    size_t data_len;
    nib_status want;
    const char *why;
    const char *tensor;
} header_case;

#define FMT NIB_ERR_FORMAT
static const header_case k_header_cases[] = {
    /* the header as a whole */
    {"json_unterminated", "{" META "," TA "," TB, 0, BASE_DATA, FMT, "found end of input", NULL},
    {"json_garbage", "{garbage}", 0, 0, FMT, "expected a string key", NULL},
    {"json_trailing_comma", "{" META "," TA "," TB ",}", 0, BASE_DATA, FMT, "trailing comma", NULL},
    {"json_depth_bomb",
     "{\"__metadata__\":{\"x\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
     "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}",
     0, 0, FMT, "nesting deeper than 64", NULL},
    {"header_is_array", "[" TA "]", 0, 24, FMT, "must begin with '{'", NULL},
    {"header_leading_space", " " BASE, 0, BASE_DATA, FMT, "must begin with '{'", NULL},
    {"padding_newline", BASE "\n", 0, BASE_DATA, FMT, "padding byte 0x0A", NULL},
    {"padding_tab", BASE "\t   ", 0, BASE_DATA, FMT, "padding byte 0x09", NULL},
    {"padding_nul", BASE "\0\0", sizeof BASE + 1, BASE_DATA, FMT,
     "byte 0x00 after the top-level", NULL},
    {"padding_garbage", BASE "  x  ", 0, BASE_DATA, FMT, "'x' after the top-level value", NULL},
    {"duplicate_tensor", "{" META "," TA "," TA "," TB "}", 0, BASE_DATA, FMT, "duplicate key",
     "\"w.a\""},
    {"duplicate_field", "{\"w.a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2,3],"
     "\"data_offsets\":[0,24]}," TB "}", 0, BASE_DATA, FMT, "duplicate key \"dtype\"", NULL},
    /* tensor names */
    {"name_empty", "{" ENTRY("", "\"F32\"", "[2,3]", "[0,24]") "," TB "}", 0, BASE_DATA, FMT,
     "empty tensor name", NULL},
    {"name_nul", "{" ENTRY("w\\u0000a", "\"F32\"", "[2,3]", "[0,24]") "," TB "}", 0, BASE_DATA,
     FMT, "NUL byte", "w\\u0000a"},
    {"name_overlong_utf8", "{" ENTRY("w\xc0\xaf", "\"F32\"", "[2,3]", "[0,24]") "," TB "}", 0,
     BASE_DATA, FMT, "overlong", NULL},
    {"name_lone_surrogate", "{" ENTRY("w\\ud800", "\"F32\"", "[2,3]", "[0,24]") "," TB "}", 0,
     BASE_DATA, FMT, "lone high surrogate", NULL},
    {"name_raw_control", "{" ENTRY("w\x1b[2J", "\"F32\"", "[2,3]", "[0,24]") "," TB "}", 0,
     BASE_DATA, FMT, "raw control character 0x1B", NULL},
    /* entry shape */
    {"entry_array", "{\"w.a\":[0,24]," TB "}", 0, BASE_DATA, FMT, "entry is an array", "w.a"},
    {"entry_string", "{\"w.a\":\"F32\"," TB "}", 0, BASE_DATA, FMT, "entry is a string", "w.a"},
    {"missing_dtype", "{\"w.a\":{\"shape\":[2,3],\"data_offsets\":[0,24]}," TB "}", 0, BASE_DATA,
     FMT, "no \"dtype\"", "w.a"},
    {"missing_shape", "{\"w.a\":{\"dtype\":\"F32\",\"data_offsets\":[0,24]}," TB "}", 0,
     BASE_DATA, FMT, "no \"shape\"", "w.a"},
    {"missing_offsets", "{\"w.a\":{\"dtype\":\"F32\",\"shape\":[2,3]}," TB "}", 0, BASE_DATA, FMT,
     "no \"data_offsets\"", "w.a"},
    {"extra_key", "{\"w.a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],"
     "\"align\":8}," TB "}", 0, BASE_DATA, FMT, "unknown key \"align\"", "w.a"},
    /* dtype */
    {"dtype_unknown", "{" ENTRY("w.a", "\"F128\"", "[2,3]", "[0,24]") "," TB "}", 0, BASE_DATA,
     FMT, "unknown dtype \"F128\"", "w.a"},
    {"dtype_lowercase", "{" ENTRY("w.a", "\"f32\"", "[2,3]", "[0,24]") "," TB "}", 0, BASE_DATA,
     FMT, "unknown dtype \"f32\"", "w.a"},
    {"dtype_with_nul", "{" ENTRY("w.a", "\"F32\\u0000\"", "[2,3]", "[0,24]") "," TB "}", 0,
     BASE_DATA, FMT, "unknown dtype \"F32\\u0000\"", "w.a"},
    {"dtype_number", "{" ENTRY("w.a", "4", "[2,3]", "[0,24]") "," TB "}", 0, BASE_DATA, FMT,
     "dtype must be a string, found number", "w.a"},
    /* shape */
    {"shape_negative", "{" ENTRY("w.a", "\"F32\"", "[2,-3]", "[0,24]") "," TB "}", 0, BASE_DATA,
     FMT, "shape[1] is negative", "w.a"},
    {"shape_float", "{" ENTRY("w.a", "\"F32\"", "[2.0,3]", "[0,24]") "," TB "}", 0, BASE_DATA,
     FMT, "number 2.0 at byte", "w.a"},
    {"shape_exponent", "{" ENTRY("w.a", "\"F32\"", "[2,3e0]", "[0,24]") "," TB "}", 0,
     BASE_DATA, FMT, "3e0", "w.a"},
    {"shape_minus_zero", "{" ENTRY("w.a", "\"F32\"", "[-0,3]", "[0,0]") "," TB "}", 0,
     BASE_DATA, FMT, "-0 at byte", "w.a"},
    {"shape_string", "{" ENTRY("w.a", "\"F32\"", "[\"2\",3]", "[0,24]") "," TB "}", 0,
     BASE_DATA, FMT, "expected an integer, found string", "w.a"},
    {"shape_too_many_dims", "{" ENTRY("w.a", "\"F32\"", "[1,1,1,1,1,1,2,3,1]", "[0,24]") "," TB
     "}", 0, BASE_DATA, FMT, "9 dimensions, more than 8", "w.a"},
    {"shape_not_array", "{" ENTRY("w.a", "\"F32\"", "6", "[0,24]") "," TB "}", 0, BASE_DATA,
     FMT, "shape must be an array", "w.a"},
    {"shape_beyond_int64", "{" ENTRY("w.a", "\"F32\"", "[18446744073709551616,1]", "[0,24]") ","
     TB "}", 0, BASE_DATA, FMT, "does not fit in int64", "w.a"},
    /* 2^62 * 8 elements overflow 64 bits; the byte count would be 2^68 */
    {"shape_product_overflow", "{" ENTRY("w.a", "\"F64\"", "[4611686018427387904,8]", "[0,24]")
     "," TB "}", 0, BASE_DATA, NIB_ERR_OVERFLOW, "overflows", "w.a"},
    /* 2^61 elements fit, but 2^61 * 8 bytes do not fit in int64 */
    {"shape_bytes_overflow", "{" ENTRY("w.a", "\"F64\"", "[2305843009213693952]", "[0,24]") ","
     TB "}", 0, BASE_DATA, NIB_ERR_OVERFLOW, "overflows", "w.a"},
    {"size_mismatch", "{" ENTRY("w.a", "\"F32\"", "[2,2]", "[0,24]") "," TB "}", 0, BASE_DATA,
     FMT, "is 16 bytes but data_offsets [0, 24] span 24", "w.a"},
    /* data_offsets */
    {"offsets_one", "{" ENTRY("w.a", "\"F32\"", "[2,3]", "[24]") "," TB "}", 0, BASE_DATA, FMT,
     "array of 2 integers, found array of 1", "w.a"},
    {"offsets_three", "{" ENTRY("w.a", "\"F32\"", "[2,3]", "[0,24,32]") "," TB "}", 0,
     BASE_DATA, FMT, "array of 2 integers, found array of 3", "w.a"},
    {"offsets_object", "{" ENTRY("w.a", "\"F32\"", "[2,3]", "{\"b\":0,\"e\":24}") "," TB "}", 0,
     BASE_DATA, FMT, "found object", "w.a"},
    {"offsets_negative", "{" ENTRY("w.a", "\"F32\"", "[2,3]", "[-8,16]") "," TB "}", 0,
     BASE_DATA, FMT, "data_offsets[0] is negative", "w.a"},
    {"offsets_float", "{" ENTRY("w.a", "\"F32\"", "[2,3]", "[0,24.0]") "," TB "}", 0, BASE_DATA,
     FMT, "data_offsets[1]", "w.a"},
    {"offsets_reversed", "{" ENTRY("w.a", "\"F32\"", "[2,3]", "[24,0]") "," TB "}", 0, BASE_DATA,
     FMT, "begin after end", "w.a"},
    {"offsets_past_data", "{" TA "," ENTRY("w.b", "\"BF16\"", "[8]", "[24,40]") "}", 0,
     BASE_DATA, FMT, "end exceeds the data section of 32 bytes", "w.b"},
    {"offsets_huge", "{" TA "," ENTRY("w.b", "\"U8\"", "[1]", "[9223372036854775806,"
     "9223372036854775807]") "}", 0, BASE_DATA, FMT, "end exceeds the data section", "w.b"},
    /* tiling of the data section */
    {"overlap", "{" TA "," ENTRY("w.b", "\"BF16\"", "[4]", "[16,24]") "}", 0, BASE_DATA, FMT,
     "overlap tensor 'w.a'", "w.b"},
    {"overlap_same_range", "{" TA "," ENTRY("w.b", "\"BF16\"", "[12]", "[0,24]") "," 
     ENTRY("w.c", "\"BF16\"", "[4]", "[24,32]") "}", 0, BASE_DATA, FMT, "overlap tensor", "w."},
    {"overlap_zero_size_inside", "{" META "," TA "," TB "," ENTRY("w.z", "\"U8\"", "[0]", "[4,4]")
     "}", 0, BASE_DATA, FMT, "overlap tensor 'w.a'", "w.z"},
    {"hole", "{" TA "," ENTRY("w.b", "\"BF16\"", "[4]", "[28,36]") "}", 0, 36, FMT,
     "hole of 4 bytes after tensor 'w.a'", "w.b"},
    {"first_not_at_zero", "{" ENTRY("w.a", "\"F32\"", "[2,3]", "[8,32]") ","
     ENTRY("w.b", "\"BF16\"", "[4]", "[32,40]") "}", 0, 40, FMT, "no tensor starts at offset 0",
     "w.a"},
    {"trailing_bytes", BASE, 0, BASE_DATA + 8, FMT, "trailing bytes [32, 40)", NULL},
    {"data_short", BASE, 0, BASE_DATA - 2, FMT, "end exceeds the data section of 30 bytes", "w.b"},
    {"metadata_only_with_data", "{" META "}", 0, 8, FMT, "trailing bytes [0, 8)", NULL},
    {"empty_with_data", "{}", 0, 1, FMT, "trailing bytes [0, 1)", NULL},
    /* __metadata__ */
    {"metadata_string", "{\"__metadata__\":\"pt\"," TA "," TB "}", 0, BASE_DATA, FMT,
     "__metadata__ must be an object of strings, found string", NULL},
    {"metadata_array", "{\"__metadata__\":[\"pt\"]," TA "," TB "}", 0, BASE_DATA, FMT,
     "found array", NULL},
    {"metadata_value_number", "{\"__metadata__\":{\"format\":1}," TA "," TB "}", 0, BASE_DATA,
     FMT, "value of key \"format\" is number, not a string", NULL},
    {"metadata_value_null", "{\"__metadata__\":{\"a\":\"b\",\"c\":null}," TA "," TB "}", 0,
     BASE_DATA, FMT, "value of key \"c\" is null", NULL},
    {"metadata_value_object", "{\"__metadata__\":{\"o\":{\"x\":\"y\"}}," TA "," TB "}", 0,
     BASE_DATA, FMT, "is object, not a string", NULL},
    {"metadata_key_nul", "{\"__metadata__\":{\"a\\u0000b\":\"v\"}," TA "," TB "}", 0, BASE_DATA,
     FMT, "contains a NUL byte", NULL},
    {"metadata_twice", "{" META "," META "," TA "," TB "}", 0, BASE_DATA, FMT,
     "duplicate key \"__metadata__\"", NULL},
};

NIB_TEST(safetensors_base_file_is_valid) {
    /* the corpus mutates this file: it must itself be accepted */
    bytes b = st_file(BASE, BASE_DATA);
    REQUIRE(b.p);
    nib_st_file *f = NULL;
    CHECK_OK(nib_st_open_memory(b.p, b.len, &f));
    REQUIRE(f);
    CHECK(nib_st_count(f) == 2 && nib_st_metadata_count(f) == 1);
    const nib_st_tensor *a = nib_st_find(f, "w.a"), *bt = nib_st_find(f, "w.b");
    REQUIRE(a && bt);
    CHECK(a->dtype == NIB_DTYPE_F32 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3);
    CHECK(a->numel == 6 && a->nbytes == 24 && a->begin == 0 && a->end == 24);
    CHECK(bt->dtype == NIB_DTYPE_BF16 && bt->begin == 24 && bt->end == 32);
    /* zero copy: views into the caller's buffer */
    size_t data_at = 8 + strlen(BASE);
    CHECK(nib_st_data(f) == b.p + data_at && nib_st_data_size(f) == BASE_DATA);
    CHECK(a->data == b.p + data_at && bt->data == b.p + data_at + 24);
    CHECK(bt->file_offset == data_at + 24);
    CHECK(a->entry_offset == 8 + strlen("{" META ","));
    CHECK(strcmp(nib_st_metadata_find(f, "format")->value, "pt") == 0);
    CHECK(nib_st_metadata_find(f, "other") == NULL && nib_st_find(f, "w") == NULL);
    CHECK(nib_st_header_size(f) == strlen(BASE) && nib_st_file_size(f) == b.len);
    nib_st_close(f);
    free(b.p);
}

NIB_TEST(safetensors_malformed_header_corpus) {
    size_t n = NIB_ARRAY_LEN(k_header_cases);
    for (size_t i = 0; i < n; i++) {
        const header_case *c = &k_header_cases[i];
        size_t hlen = c->hlen ? c->hlen : strlen(c->header);
        bytes b = st_build(hlen, c->header, hlen, c->data_len);
        REQUIRE(b.p);
        expect_rejected(t, c->id, &b, c->want, c->why, c->tensor);
        free(b.p);
    }
    CHECK_MSG(n >= 60, "%zu header cases", n);
}

typedef enum raw_kind { RAW_TRUNCATE, RAW_SET_N, RAW_SET_BYTE } raw_kind;

typedef struct raw_case {
    const char *id;
    raw_kind kind;
    uint64_t arg;       /* new length, new header length N, or index of the byte to set */
    unsigned char byte; /* RAW_SET_BYTE */
    nib_status want;
    const char *why;
    const char *tensor;
} raw_case;

NIB_TEST(safetensors_malformed_byte_corpus) {
    const uint64_t h = strlen(BASE), len = 8 + h + BASE_DATA;
    const uint64_t fmt_at = 8 + (uint64_t)(strstr(BASE, "format") - BASE); /* inside a string */
    const raw_case cases[] = {
        {"truncate_0", RAW_TRUNCATE, 0, 0, FMT, "file of 0 bytes is shorter than", NULL},
        {"truncate_7", RAW_TRUNCATE, 7, 0, FMT, "file of 7 bytes", NULL},
        {"truncate_length_only", RAW_TRUNCATE, 8, 0, FMT, "runs past the end of the 8-byte file",
         NULL},
        {"truncate_in_header", RAW_TRUNCATE, 8 + h / 2, 0, FMT, "runs past the end", NULL},
        {"truncate_after_header", RAW_TRUNCATE, 8 + h, 0, FMT, "data section of 0 bytes", "w.a"},
        {"truncate_in_data", RAW_TRUNCATE, len - 1, 0, FMT, "data section of 31 bytes", "w.b"},
        {"n_zero", RAW_SET_N, 0, 0, FMT, "header is empty", NULL},
        {"n_short_by_one", RAW_SET_N, h - 1, 0, FMT, "expected ',' or '}', found end of input",
         NULL},
        {"n_into_data", RAW_SET_N, h + 4, 0, FMT, "after the top-level value", NULL},
        {"n_past_file", RAW_SET_N, h + BASE_DATA + 1, 0, FMT, "runs past the end", NULL},
        {"n_over_100mb", RAW_SET_N, NIB_ST_MAX_HEADER_BYTES + 1, 0, FMT,
         "exceeds the limit of 100000000", NULL},
        {"n_u64_max", RAW_SET_N, UINT64_MAX, 0, NIB_ERR_OVERFLOW, "overflows 8 + length", NULL},
        {"n_u64_max_minus_7", RAW_SET_N, UINT64_MAX - 7, 0, NIB_ERR_OVERFLOW, "overflows", NULL},
        {"n_u64_max_minus_8", RAW_SET_N, UINT64_MAX - 8, 0, FMT, "exceeds the limit", NULL},
        {"n_i64_min", RAW_SET_N, UINT64_C(1) << 63, 0, FMT, "exceeds the limit", NULL},
        {"first_byte_space", RAW_SET_BYTE, 8, ' ', FMT, "must begin with '{', found byte 0x20",
         NULL},
        {"first_byte_nul", RAW_SET_BYTE, 8, 0, FMT, "must begin with '{'", NULL},
        {"control_in_string", RAW_SET_BYTE, fmt_at, 0x01, FMT, "raw control character", NULL},
        {"invalid_utf8_in_string", RAW_SET_BYTE, fmt_at, 0xFF, FMT, "invalid UTF-8", NULL},
        {"last_brace_to_space", RAW_SET_BYTE, 8 + h - 1, ' ', FMT, "end of input", NULL},
    };
    for (size_t i = 0; i < NIB_ARRAY_LEN(cases); i++) {
        const raw_case *c = &cases[i];
        bytes base = st_file(BASE, BASE_DATA), b;
        REQUIRE(base.p && base.len == len);
        if (c->kind == RAW_TRUNCATE) {
            b = copy_prefix(&base, (size_t)c->arg);
        } else {
            b = copy_prefix(&base, base.len);
            if (c->kind == RAW_SET_N)
                for (int k = 0; k < 8; k++) b.p[k] = (unsigned char)(c->arg >> (8 * k));
            else b.p[c->arg] = c->byte;
        }
        REQUIRE(b.p);
        expect_rejected(t, c->id, &b, c->want, c->why, c->tensor);
        free(b.p);
        free(base.p);
    }
}

NIB_TEST(safetensors_every_truncation_rejected) {
    bytes base = st_file(BASE, BASE_DATA);
    REQUIRE(base.p);
    for (size_t n = 0; n < base.len; n++) {
        bytes b = copy_prefix(&base, n);
        REQUIRE(b.p);
        nib_st_file *f = NULL;
        nib_status st = nib_st_open_memory(b.p, b.len, &f);
        CHECK_MSG(st == NIB_ERR_FORMAT && has_offset(nib_last_error()), "prefix %zu: %s %s", n,
                  nib_status_name(st), nib_last_error());
        nib_st_close(f);
        free(b.p);
    }
    free(base.p);
}

NIB_TEST(safetensors_random_mutations_never_crash) {
    /* flip 1-4 bytes (mostly in the header, where the parser is); under ASan/UBSan any
     * out-of-bounds access fails the run. Accepted mutants must still be self-consistent. */
    nib_rng r;
    nib_test_rng(t, &r);
    bytes base = st_file(BASE, BASE_DATA);
    REQUIRE(base.p);
    size_t hdr_end = 8 + strlen(BASE);
    int accepted = 0, rejected = 0;
    for (int it = 0; it < 4000; it++) {
        bytes b = copy_prefix(&base, base.len);
        REQUIRE(b.p);
        int flips = 1 + (int)nib_rng_below(&r, 4);
        for (int k = 0; k < flips; k++) {
            static const char syntax[] = "{}[]\",:0123456789-.e \\u";
            size_t at = nib_rng_below(&r, 10) ? nib_rng_below(&r, hdr_end)
                                              : nib_rng_below(&r, b.len);
            uint64_t pick = nib_rng_below(&r, sizeof syntax - 1);
            b.p[at] = nib_rng_below(&r, 2) ? (unsigned char)nib_rng_below(&r, 256)
                                           : (unsigned char)syntax[pick];
        }
        nib_st_file *f = NULL;
        nib_status st = nib_st_open_memory(b.p, b.len, &f);
        if (st == NIB_OK) {
            accepted++;
            uint64_t covered = 0;
            for (size_t i = 0; i < nib_st_count(f); i++) {
                const nib_st_tensor *x = nib_st_tensor_at(f, i);
                CHECK(x->begin == covered && x->end - x->begin == x->nbytes);
                CHECK((const unsigned char *)x->data + x->nbytes <= b.p + b.len);
                covered = x->end;
            }
            CHECK(covered == nib_st_data_size(f));
        } else {
            rejected++;
            CHECK_MSG((st == NIB_ERR_FORMAT || st == NIB_ERR_OVERFLOW) &&
                          has_offset(nib_last_error()),
                      "iteration %d: %s %s", it, nib_status_name(st), nib_last_error());
        }
        nib_st_close(f);
        free(b.p);
    }
    /* the mutations do reach the checks, and mutants that only touch data bytes pass */
    CHECK_MSG(rejected > 1000 && accepted > 0, "%d rejected, %d accepted", rejected, accepted);
    free(base.p);
}

NIB_TEST(safetensors_valid_edge_cases) {
    static const struct {
        const char *header;
        size_t data_len;
        size_t count;
    } ok[] = {
        {"{}", 0, 0},
        {"{}      ", 0, 0},                                        /* space padding */
        {"{ \"__metadata__\" : { } }", 0, 0},                        /* JSON whitespace inside */
        {"{" META "}", 0, 0},
        {"{" ENTRY("z", "\"U8\"", "[0]", "[0,0]") "}", 0, 1},     /* zero-size only */
        {"{" ENTRY("s", "\"F64\"", "[]", "[0,8]") "}", 8, 1},     /* scalar */
        {"{" TB "," TA "}", BASE_DATA, 2},                       /* header order != file order */
        {"{" TA "," ENTRY("z", "\"BF16\"", "[3,0,5]", "[24,24]") "," TB "}", BASE_DATA, 3},
        {"{" ENTRY("all8", "\"F32\"", "[1,1,1,1,1,1,2,3]", "[0,24]") "," TB "}", BASE_DATA, 2},
        {"{" ENTRY("w", "\"F8_E4M3\"", "[4]", "[0,4]") "," ENTRY("s", "\"F8_E8M0\"", "[1]", "[4,5]")
         "," ENTRY("b", "\"BOOL\"", "[3]", "[5,8]") "}", 8, 3},
    };
    for (size_t i = 0; i < NIB_ARRAY_LEN(ok); i++) {
        bytes b = st_file(ok[i].header, ok[i].data_len);
        REQUIRE(b.p);
        nib_st_file *f = NULL;
        nib_status st = nib_st_open_memory(b.p, b.len, &f);
        CHECK_MSG(st == NIB_OK, "case %zu: %s", i, nib_last_error());
        CHECK_MSG(nib_st_count(f) == ok[i].count, "case %zu: %zu tensors", i, nib_st_count(f));
        nib_st_close(f);
        free(b.p);
    }
    /* tensors come back in file order whatever the header order */
    bytes b = st_file("{" TB "," TA "}", BASE_DATA);
    nib_st_file *f = NULL;
    CHECK_OK(nib_st_open_memory(b.p, b.len, &f));
    REQUIRE(f);
    CHECK(strcmp(nib_st_tensor_at(f, 0)->name, "w.a") == 0);
    CHECK(strcmp(nib_st_tensor_at(f, 1)->name, "w.b") == 0);
    CHECK(nib_st_tensor_at(f, 2) == NULL);
    nib_st_close(f);
    free(b.p);
    nib_st_close(NULL);
}

NIB_TEST(safetensors_open_os_errors) {
    nib_st_file *f = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/does-not-exist.safetensors", nib_test_tmpdir());
    CHECK_ST(nib_st_open(path, &f), NIB_ERR_IO);
    CHECK(strstr(nib_last_error(), path) && strstr(nib_last_error(), "No such file"));
    CHECK_ST(nib_st_open(nib_test_tmpdir(), &f), NIB_ERR_IO);
    CHECK(strstr(nib_last_error(), "not a regular file"));
    /* a FIFO must not block the open (no writer will ever come) */
    snprintf(path, sizeof path, "%s/fifo.safetensors", nib_test_tmpdir());
    REQUIRE(mkfifo(path, 0600) == 0);
    CHECK_ST(nib_st_open(path, &f), NIB_ERR_IO);
    CHECK(strstr(nib_last_error(), "not a regular file"));
    unlink(path);
    snprintf(path, sizeof path, "%s/empty.safetensors", nib_test_tmpdir());
    REQUIRE(write_file(path, "", 0));
    CHECK_ST(nib_st_open(path, &f), NIB_ERR_FORMAT);
    unlink(path);
    CHECK_ST(nib_st_open(NULL, &f), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_open_memory(NULL, 8, &f), NIB_ERR_INVALID_ARG);
    CHECK(f == NULL);
}

/* ---- writer ---------------------------------------------------------------------------- */

NIB_TEST(safetensors_roundtrip_random) {
    enum { N = 16 };
    static const nib_dtype dts[] = {NIB_DTYPE_F32,     NIB_DTYPE_BF16,    NIB_DTYPE_F16,
                                    NIB_DTYPE_F64,     NIB_DTYPE_I64,     NIB_DTYPE_I32,
                                    NIB_DTYPE_U8,      NIB_DTYPE_I8,      NIB_DTYPE_BOOL,
                                    NIB_DTYPE_F8_E4M3, NIB_DTYPE_F8_E5M2, NIB_DTYPE_F8_E8M0,
                                    NIB_DTYPE_U16,     NIB_DTYPE_I16,     NIB_DTYPE_U32,
                                    NIB_DTYPE_U64};
    nib_rng r;
    nib_test_rng(t, &r);
    char names[N][48];
    nib_dtype dt[N];
    int32_t ndim[N];
    int64_t shape[N][NIB_MAX_DIMS];
    uint64_t nbytes[N], total = 0;
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.w%s", i, i == 5 ? "\"q\\k" : "");
        dt[i] = dts[i % NIB_ARRAY_LEN(dts)];
        ndim[i] = i == 0 ? 0 : 1 + (int32_t)nib_rng_below(&r, 4); /* tensor 0: a scalar */
        uint64_t numel = 1;
        for (int d = 0; d < ndim[i]; d++) {
            shape[i][d] = i == 1 && d == 0 ? 0 : 1 + (int64_t)nib_rng_below(&r, 9); /* 1: empty */
            numel *= (uint64_t)shape[i][d];
        }
        nbytes[i] = numel * nib_dtype_size(dt[i]);
        total += nbytes[i];
    }
    CHECK(nbytes[1] == 0 && nbytes[0] == nib_dtype_size(dt[0]));
    unsigned char *data = malloc(total + 1);
    REQUIRE(data);
    for (uint64_t i = 0; i < total; i++) data[i] = (unsigned char)nib_rng_u64(&r);

    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/roundtrip.safetensors", nib_test_tmpdir());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    nib_st_writer *w = NULL;
    CHECK_OK(nib_st_writer_create(path, &w));
    REQUIRE(w);
    CHECK(file_exists(tmp) && !file_exists(path));
    CHECK_OK(nib_st_writer_set_metadata(w, "format", "pt"));
    CHECK_OK(nib_st_writer_set_metadata(w, "seed", "draft"));
    CHECK_OK(nib_st_writer_set_metadata(w, "seed", "1")); /* replaces */
    for (int i = 0; i < N; i++)
        CHECK_OK(nib_st_writer_declare(w, names[i], dt[i], ndim[i], shape[i]));
    /* stream in random chunks that ignore tensor boundaries, zero-length writes included */
    for (uint64_t off = 0; off < total;) {
        size_t n = (size_t)nib_rng_below(&r, 64);
        if (n > total - off) n = (size_t)(total - off);
        CHECK_OK(nib_st_writer_write(w, data + off, n));
        off += n;
    }
    CHECK_OK(nib_st_writer_finish(w));
    CHECK(file_exists(path) && !file_exists(tmp));

    nib_st_file *f = NULL;
    CHECK_OK(nib_st_open(path, &f));
    REQUIRE(f);
    CHECK((8 + nib_st_header_size(f)) % 8 == 0); /* data section aligned to 8 */
    CHECK(nib_st_data_size(f) == total && nib_st_count(f) == N);
    uint64_t off = 0;
    for (int i = 0; i < N && i < (int)nib_st_count(f); i++) {
        const nib_st_tensor *x = nib_st_tensor_at(f, (size_t)i);
        CHECK_MSG(strcmp(x->name, names[i]) == 0, "tensor %d is '%s'", i, x->name);
        CHECK(x->name_len == strlen(names[i]) && nib_st_find(f, names[i]) == x);
        CHECK(x->dtype == dt[i] && x->ndim == ndim[i]);
        for (int d = 0; d < ndim[i]; d++) CHECK(x->shape[d] == shape[i][d]);
        CHECK(x->begin == off && x->nbytes == nbytes[i]);
        CHECK(x->nbytes == 0 || memcmp(x->data, data + off, x->nbytes) == 0);
        off += nbytes[i];
    }
    CHECK(nib_st_metadata_count(f) == 2);
    CHECK(strcmp(nib_st_metadata_find(f, "seed")->value, "1") == 0);
    nib_st_close(f);
    unlink(path);
    free(data);
}

NIB_TEST(safetensors_metadata_and_names_escaping) {
    static const char *const kv[] = {
        "quote\"key",  "back\\slash\\",
        "unicode",     "\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",
        "controls",    "line\nnext\ttab\x01\x1f\x7f end",
        "empty",       "",
        "",            "empty key",
        "slash/",      "</script>",
        "c1",          "\xc2\x85\xc2\x9f",
    };
    const size_t n_meta = NIB_ARRAY_LEN(kv) / 2;
    float v = 1.5f;
    uint16_t h[2] = {0x3c00, 0xc000};
    nib_st_save_tensor ts[] = {
        {"we\"ird\\name\n\x01", NIB_DTYPE_F32, 0, {0}, &v},
        {"\xe6\x97\xa5\xe6\x9c\xac.w", NIB_DTYPE_F16, 1, {2}, h},
    };
    char path[512];
    snprintf(path, sizeof path, "%s/escaping.safetensors", nib_test_tmpdir());
    CHECK_OK(nib_st_save(path, 2, ts, n_meta, kv));
    nib_st_file *f = NULL;
    CHECK_OK(nib_st_open(path, &f));
    REQUIRE(f);
    CHECK(nib_st_metadata_count(f) == n_meta);
    for (size_t i = 0; i < n_meta; i++) {
        const nib_st_kv *e = nib_st_metadata_find(f, kv[2 * i]);
        CHECK_MSG(e && strcmp(e->value, kv[2 * i + 1]) == 0 &&
                      e->value_len == strlen(kv[2 * i + 1]),
                  "metadata %zu", i);
        CHECK(nib_st_metadata_at(f, i) == e); /* header order = set order */
    }
    const nib_st_tensor *a = nib_st_find(f, ts[0].name), *b = nib_st_find(f, ts[1].name);
    REQUIRE(a && b);
    CHECK(a->ndim == 0 && a->nbytes == 4 && memcmp(a->data, &v, 4) == 0);
    CHECK(b->nbytes == 4 && memcmp(b->data, h, 4) == 0);
    nib_st_close(f);
    unlink(path);
}

NIB_TEST(safetensors_writer_header_alignment) {
    /* names of every length 1..17 shift the header length through all residues mod 8 */
    for (int len = 1; len <= 17; len++) {
        char name[32], path[512];
        memset(name, 'n', (size_t)len);
        name[len] = '\0';
        uint8_t x[3] = {1, 2, 3};
        nib_st_save_tensor ts = {name, NIB_DTYPE_U8, 1, {3}, x};
        snprintf(path, sizeof path, "%s/align.safetensors", nib_test_tmpdir());
        CHECK_OK(nib_st_save(path, 1, &ts, 0, NULL));
        char *raw = NULL;
        size_t n = 0;
        CHECK_OK(nib_read_file(path, 1 << 20, &raw, &n));
        REQUIRE(raw && n >= 8);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | (unsigned char)raw[i];
        CHECK_MSG((8 + hl) % 8 == 0 && 8 + hl + 3 == n, "name length %d: N = %llu", len,
                  (unsigned long long)hl);
        CHECK(raw[8] == '{' && hl >= 1 && hl < n);
        /* the padding is spaces after the closing brace, fewer than 8 of them */
        uint64_t close = hl;
        while (close > 0 && raw[8 + close - 1] == ' ') close--;
        CHECK(raw[8 + close - 1] == '}' && hl - close < 8);
        nib_free(raw);
        unlink(path);
    }
    /* no tensors, no metadata: "{}" plus 6 spaces, 16 bytes in all */
    char path[512];
    snprintf(path, sizeof path, "%s/empty_out.safetensors", nib_test_tmpdir());
    CHECK_OK(nib_st_save(path, 0, NULL, 0, NULL));
    char *raw = NULL;
    size_t n = 0;
    CHECK_OK(nib_read_file(path, 1 << 20, &raw, &n));
    CHECK(n == 16 && raw && memcmp(raw + 8, "{}      ", 8) == 0 && raw[0] == 8);
    nib_free(raw);
    nib_st_file *f = NULL;
    CHECK_OK(nib_st_open(path, &f));
    CHECK(nib_st_count(f) == 0 && nib_st_data_size(f) == 0);
    nib_st_close(f);
    unlink(path);
}

NIB_TEST(safetensors_writer_rejects_wrong_byte_counts) {
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/wrong_count.safetensors", nib_test_tmpdir());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int64_t shape[1] = {4};
    unsigned char buf[32] = {0};
    nib_st_writer *w = NULL;

    /* too few: 8 of 16 bytes */
    CHECK_OK(nib_st_writer_create(path, &w));
    CHECK_OK(nib_st_writer_declare(w, "w", NIB_DTYPE_F32, 1, shape));
    CHECK_OK(nib_st_writer_write(w, buf, 8));
    CHECK_ST(nib_st_writer_finish(w), NIB_ERR_INVALID_ARG);
    CHECK(strstr(nib_last_error(), "only 8 of 16") && strstr(nib_last_error(), "tensor 'w'"));
    CHECK(!file_exists(path) && !file_exists(tmp));

    /* too many: the failing write is sticky and finish leaves nothing behind */
    CHECK_OK(nib_st_writer_create(path, &w));
    CHECK_OK(nib_st_writer_declare(w, "w", NIB_DTYPE_F32, 1, shape));
    CHECK_OK(nib_st_writer_write(w, buf, 10));
    CHECK_ST(nib_st_writer_write(w, buf, 7), NIB_ERR_INVALID_ARG);
    CHECK(strstr(nib_last_error(), "16 declared"));
    CHECK_ST(nib_st_writer_write(w, buf, 6), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_finish(w), NIB_ERR_INVALID_ARG);
    CHECK(!file_exists(path) && !file_exists(tmp));

    /* nothing written at all */
    CHECK_OK(nib_st_writer_create(path, &w));
    CHECK_OK(nib_st_writer_declare(w, "w", NIB_DTYPE_F32, 1, shape));
    CHECK_ST(nib_st_writer_finish(w), NIB_ERR_INVALID_ARG);
    CHECK(!file_exists(path) && !file_exists(tmp));

    /* nib_st_save with a NULL data pointer for a non-empty tensor */
    nib_st_save_tensor ts = {"w", NIB_DTYPE_F32, 1, {4}, NULL};
    CHECK_ST(nib_st_save(path, 1, &ts, 0, NULL), NIB_ERR_INVALID_ARG);
    CHECK(!file_exists(path) && !file_exists(tmp));
}

NIB_TEST(safetensors_writer_misuse) {
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/misuse.safetensors", nib_test_tmpdir());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int64_t shape[2] = {2, 2}, neg[1] = {-1};
    int64_t big[2] = {INT64_C(1) << 62, 8};
    unsigned char buf[16] = {0};
    nib_st_writer *w = NULL;
    CHECK_OK(nib_st_writer_create(path, &w));
    CHECK_ST(nib_st_writer_declare(w, "", NIB_DTYPE_U8, 2, shape), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_declare(w, "__metadata__", NIB_DTYPE_U8, 2, shape), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_declare(w, "bad\xc0\xaf", NIB_DTYPE_U8, 2, shape), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_declare(w, NULL, NIB_DTYPE_U8, 2, shape), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_declare(w, "x", NIB_DTYPE_INVALID, 2, shape), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_declare(w, "x", NIB_DTYPE_U8, 9, shape), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_declare(w, "x", NIB_DTYPE_U8, 1, neg), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_declare(w, "x", NIB_DTYPE_F64, 2, big), NIB_ERR_OVERFLOW);
    CHECK_ST(nib_st_writer_set_metadata(w, "k", "bad\xed\xa0\x80"), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_set_metadata(w, NULL, "v"), NIB_ERR_INVALID_ARG);
    /* the failures above changed nothing: the writer is still usable */
    CHECK_OK(nib_st_writer_declare(w, "a", NIB_DTYPE_U8, 2, shape));
    CHECK_ST(nib_st_writer_declare(w, "a", NIB_DTYPE_U8, 2, shape), NIB_ERR_INVALID_ARG);
    CHECK(strstr(nib_last_error(), "declared twice"));
    CHECK_ST(nib_st_writer_write(w, NULL, 4), NIB_ERR_INVALID_ARG);
    CHECK_OK(nib_st_writer_write(w, buf, 4));
    CHECK_ST(nib_st_writer_declare(w, "b", NIB_DTYPE_U8, 2, shape), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_set_metadata(w, "k", "v"), NIB_ERR_INVALID_ARG);
    CHECK_OK(nib_st_writer_finish(w));
    nib_st_file *f = NULL;
    CHECK_OK(nib_st_open(path, &f));
    CHECK(nib_st_count(f) == 1 && nib_st_metadata_count(f) == 0);
    nib_st_close(f);

    /* abort keeps an existing file at the final path untouched and removes the temporary */
    char *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    CHECK_OK(nib_read_file(path, 1 << 20, &before, &nb));
    CHECK_OK(nib_st_writer_create(path, &w));
    CHECK_OK(nib_st_writer_declare(w, "other", NIB_DTYPE_U8, 1, (int64_t[]){16}));
    CHECK_OK(nib_st_writer_write(w, buf, 16));
    nib_st_writer_abort(w);
    CHECK(!file_exists(tmp));
    CHECK_OK(nib_read_file(path, 1 << 20, &after, &na));
    CHECK(before && after && nb == na && memcmp(before, after, nb) == 0);
    nib_free(before);
    nib_free(after);
    unlink(path);

    /* a symlink planted at path.tmp is not followed: its target stays untouched */
    char target[520];
    snprintf(target, sizeof target, "%s/symlink_target", nib_test_tmpdir());
    REQUIRE(write_file(target, "keep", 4));
    REQUIRE(symlink(target, tmp) == 0);
    CHECK_ST(nib_st_writer_create(path, &w), NIB_ERR_IO);
    CHECK_OK(nib_read_file(target, 64, &after, &na));
    CHECK(after && na == 4 && memcmp(after, "keep", 4) == 0);
    nib_free(after);
    unlink(tmp);
    unlink(target);

    /* OS errors name the path; NULLs are refused or ignored */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no-such-dir/x.safetensors", nib_test_tmpdir());
    CHECK_ST(nib_st_writer_create(bad, &w), NIB_ERR_IO);
    CHECK(strstr(nib_last_error(), "no-such-dir") && strstr(nib_last_error(), "No such file"));
    CHECK_ST(nib_st_writer_create(NULL, &w), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_write(NULL, buf, 1), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_st_writer_finish(NULL), NIB_ERR_INVALID_ARG);
    nib_st_writer_abort(NULL);
}

/* ---- nib inspect ----------------------------------------------------------------------- */

static int run_inspect(int argc, const char *a1, const char *a2) {
    char *argv[3] = {(char *)"inspect", (char *)a1, (char *)a2};
    fflush(stdout);
    int rc = nib_cmd_inspect(argc, argv);
    fflush(stdout);
    return rc;
}

/* Run `nib inspect path [opt]` with stdout captured into out (NUL-terminated). */
static int run_inspect_captured(const char *path, const char *opt, char *out, size_t cap) {
    char cap_path[512];
    snprintf(cap_path, sizeof cap_path, "%s/inspect_stdout.txt", nib_test_tmpdir());
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    FILE *f = fopen(cap_path, "w+");
    if (saved < 0 || !f) return -1;
    dup2(fileno(f), STDOUT_FILENO);
    int rc = run_inspect(opt ? 3 : 2, path, opt);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    rewind(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
    unlink(cap_path);
    return rc;
}

NIB_TEST(inspect_exit_codes) {
    char good[512], bad[512], missing[512];
    snprintf(good, sizeof good, "%s/inspect_good.safetensors", nib_test_tmpdir());
    snprintf(bad, sizeof bad, "%s/inspect_bad.safetensors", nib_test_tmpdir());
    snprintf(missing, sizeof missing, "%s/inspect_missing.safetensors", nib_test_tmpdir());
    uint16_t wq[6] = {1, 2, 3, 4, 5, 6};
    float s = 2.0f;
    nib_st_save_tensor ts[] = {
        {"model.layers.0.q_proj.weight", NIB_DTYPE_BF16, 2, {2, 3}, wq},
        {"scale\x1b[31m", NIB_DTYPE_F32, 0, {0}, &s}, /* printed escaped, not as a color code */
        {"empty", NIB_DTYPE_U8, 2, {0, 7}, NULL},
    };
    const char *meta[] = {"format", "pt"};
    REQUIRE(nib_st_save(good, 3, ts, 1, meta) == NIB_OK);
    bytes b = st_file("{" ENTRY("w.a", "\"F32\"", "[2,3]", "[0,24]") "," TB "}", BASE_DATA + 1);
    REQUIRE(b.p && write_file(bad, b.p, b.len));
    free(b.p);

    /* the table: every tensor, totals, metadata; the escape sequence in a name is escaped */
    static char out[8192];
    CHECK(run_inspect_captured(good, NULL, out, sizeof out) == 0);
    CHECK(strstr(out, "model.layers.0.q_proj.weight") && strstr(out, "BF16") &&
          strstr(out, "[2, 3]") && strstr(out, "[0, 7]"));
    CHECK(strstr(out, "scale\\u001b[31m") && !strchr(out, 0x1b));
    CHECK(strstr(out, "tensors     3") && strstr(out, "parameters  7 ") &&
          strstr(out, "data        16 bytes"));
    CHECK(strstr(out, "format: pt"));
    /* --json is strict JSON with the same content */
    CHECK(run_inspect_captured(good, "--json", out, sizeof out) == 0);
    nib_json_doc *doc = NULL;
    CHECK_OK(nib_json_parse(out, strlen(out), 0, &doc));
    const nib_json_value *r = nib_json_root(doc);
    int64_t count = 0;
    CHECK_OK(nib_json_int64(nib_json_get(r, "tensor_count"), &count));
    CHECK(count == 3);
    const nib_json_value *tl = nib_json_get(r, "tensors");
    CHECK(strcmp(nib_json_string(nib_json_get(nib_json_elem(tl, 1), "name"), NULL),
                 ts[1].name) == 0);
    CHECK(strcmp(nib_json_string(nib_json_get(nib_json_get(r, "metadata"), "format"), NULL),
                 "pt") == 0);
    nib_json_free(doc);
    CHECK(run_inspect(3, "--json", good) == 0);
    CHECK(run_inspect(2, bad, NULL) == 1);
    CHECK(strstr(nib_last_error(), "trailing bytes"));
    CHECK(run_inspect(2, missing, NULL) == 1);
    CHECK(run_inspect(1, NULL, NULL) == 2);
    CHECK(run_inspect(2, "--help", NULL) == 0);
    CHECK(run_inspect(2, "--bogus", NULL) == 2);
    CHECK(run_inspect(3, good, good) == 2);
    unlink(good);
    unlink(bad);
}
