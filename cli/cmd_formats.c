/* cmd_formats.c — `nib formats [--rows N] [--cols N] [--seed N]`: quantize a random N(0,1)
 * matrix and a Student-t (nu = 3) matrix to every weight format nib supports, dequantize with
 * the reference code in formats/, and print bits per weight and the error of each. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "cli/cli.h"
#include "formats/formats.h"

/* Scratch planes shared by every format (sized for the largest: fp8 / fp16 elements). */
typedef struct fmt_ws {
    uint8_t *b8;  /* [n][k] bytes */
    uint8_t *s8;  /* [n][k/16] scale bytes */
    float *sf;    /* [n] fp32 scales */
} fmt_ws;

/* Quantize w[n][k] and dequantize into out; *bytes = storage of the quantized form. */
typedef nib_status (*roundtrip_fn)(const float *w, int64_t n, int64_t k, int arg, fmt_ws *ws,
                                   float *out, uint64_t *bytes);

static nib_status rt_nvfp4(const float *w, int64_t n, int64_t k, int arg, fmt_ws *ws, float *out,
                           uint64_t *bytes) {
    (void)arg;
    float g;
    NIB_RETURN_IF_ERR(nib_nvfp4_quantize(w, n, k, ws->b8, ws->s8, &g));
    *bytes = (uint64_t)(n * k / 2 + n * (k / 16) + 4);
    return nib_nvfp4_dequantize(ws->b8, ws->s8, g, n, k, out);
}

static nib_status rt_mxfp4(const float *w, int64_t n, int64_t k, int arg, fmt_ws *ws, float *out,
                           uint64_t *bytes) {
    NIB_RETURN_IF_ERR(nib_mxfp4_quantize(w, n, k, (nib_mxfp4_rule)arg, ws->b8, ws->s8));
    *bytes = (uint64_t)(n * k / 2 + n * (k / 32));
    return nib_mxfp4_dequantize(ws->b8, ws->s8, n, k, out);
}

static nib_status rt_int4(const float *w, int64_t n, int64_t k, int asym, fmt_ws *ws, float *out,
                          uint64_t *bytes) {
    (void)ws;
    nib_status st = NIB_OK;
    nib_int4_weight q;
    NIB_TRY(nib_int4_quantize(w, n, k, NIB_INT4_GROUP_DEFAULT, asym, NULL, &q));
    int64_t ng = n * (k / NIB_INT4_GROUP_DEFAULT);
    *bytes = (uint64_t)(n * k / 2 + ng * 2 + (asym ? ng : 0));
    NIB_TRY(nib_int4_dequantize(&q, out));
fail:
    nib_int4_free(&q);
    return st;
}

static nib_status rt_fp8(const float *w, int64_t n, int64_t k, int per_channel, fmt_ws *ws,
                         float *out, uint64_t *bytes) {
    NIB_RETURN_IF_ERR(nib_fp8_quantize(w, n, k, per_channel, ws->b8, ws->sf));
    *bytes = (uint64_t)(n * k + 4 * (per_channel ? n : 1));
    return nib_fp8_dequantize(ws->b8, ws->sf, n, k, per_channel, out);
}

static nib_status rt_half(const float *w, int64_t n, int64_t k, int is_bf16, fmt_ws *ws,
                          float *out, uint64_t *bytes) {
    (void)ws;
    for (int64_t i = 0; i < n * k; i++)
        out[i] = is_bf16 ? nib_bf16_to_f32(nib_f32_to_bf16(w[i]))
                         : nib_f16_to_f32(nib_f32_to_f16(w[i]));
    *bytes = (uint64_t)(n * k * 2);
    return NIB_OK;
}

typedef struct fmt_row {
    const char *name;
    const char *layout;
    roundtrip_fn fn;
    int arg;
} fmt_row;

static const fmt_row k_rows[] = {
    {"nvfp4", "e2m1, e4m3 scale / 16, f32 global", rt_nvfp4, 0},
    {"mxfp4 floor", "e2m1, e8m0 scale / 32 (OCP ref.)", rt_mxfp4, NIB_MXFP4_SCALE_FLOOR},
    {"mxfp4 ceil", "e2m1, e8m0 scale / 32", rt_mxfp4, NIB_MXFP4_SCALE_CEIL},
    {"mxfp4 round", "e2m1, e8m0 scale / 32", rt_mxfp4, NIB_MXFP4_SCALE_ROUND},
    {"int4 sym", "u4, f16 scale / 128", rt_int4, 0},
    {"int4 asym", "u4, f16 scale + u8 zero / 128", rt_int4, 1},
    {"fp8 tensor", "e4m3, one f32 scale", rt_fp8, 0},
    {"fp8 channel", "e4m3, f32 scale per row", rt_fp8, 1},
    {"bf16", "bf16 (8-bit significand)", rt_half, 1},
    {"fp16", "IEEE binary16", rt_half, 0},
};

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: nib formats [--rows N] [--cols N] [--seed N]\n"
               "Quantizes a random N(0,1) matrix and a Student-t (nu = 3) matrix of rows x cols\n"
               "(default 256 x 2048; cols a multiple of 128) to every nib weight format with the\n"
               "reference quantizers, dequantizes, and prints bits per weight (elements + scales\n"
               "+ zeros) and the error: NMSE = sum (w - w')^2 / sum w^2, cosine, max |w - w'|.\n");
}

int nib_cmd_formats(int argc, char **argv) {
    int64_t rows = 256, cols = 2048, seed = 1;
    for (int i = 1; i < argc; i++) {
        int64_t *dst = NULL, lo = 1, hi = INT64_C(1) << 20;
        if (nib_cli_is_help(argv[i])) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--rows")) {
            dst = &rows;
        } else if (!strcmp(argv[i], "--cols")) {
            dst = &cols;
        } else if (!strcmp(argv[i], "--seed")) {
            dst = &seed;
            lo = 0;
            hi = INT64_MAX;
        } else {
            fprintf(stderr, "nib formats: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc || !parse_i64(argv[i + 1], lo, hi, dst)) {
            fprintf(stderr, "nib formats: %s needs an integer in [%lld, %lld]\n", argv[i],
                    (long long)lo, (long long)hi);
            return 2;
        }
        i++;
    }
    if (cols % NIB_INT4_GROUP_DEFAULT != 0) {
        fprintf(stderr, "nib formats: --cols %lld is not a multiple of 128 (the INT4 group)\n",
                (long long)cols);
        return 2;
    }
    if (rows * cols > (INT64_C(1) << 26)) {
        fprintf(stderr, "nib formats: %lld x %lld is more than 2^26 values\n", (long long)rows,
                (long long)cols);
        return 2;
    }

    int rc = 1;
    nib_status st = NIB_OK;
    const int64_t nk = rows * cols;
    float *data[2] = {NULL, NULL}, *out = NULL;
    fmt_ws ws = {NULL, NULL, NULL};
    nib_rng rng;
    double t0 = nib_now_s();
    data[0] = nib_malloc((size_t)nk * sizeof(float));
    data[1] = nib_malloc((size_t)nk * sizeof(float));
    out = nib_malloc((size_t)nk * sizeof(float));
    ws.b8 = nib_malloc((size_t)nk);
    ws.s8 = nib_malloc((size_t)(nk / 16));
    ws.sf = nib_malloc((size_t)rows * sizeof(float));
    if (!data[0] || !data[1] || !out || !ws.b8 || !ws.s8 || !ws.sf) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    nib_rng_seed(&rng, (uint64_t)seed);
    nib_rng_fill_normal(&rng, data[0], (uint64_t)nk, 0.0f, 1.0f);
    for (int64_t i = 0; i < nk; i++) data[1][i] = (float)nib_rng_student_t(&rng, 3.0);

    printf("nib formats: %lld x %lld weights (blocks along the %lld contiguous columns), seed "
           "%lld\n", (long long)rows, (long long)cols, (long long)cols, (long long)seed);
    printf("  gauss = N(0,1), t3 = Student-t with nu = 3 (heavy tails); reference quantizers, "
           "round to nearest even\n\n");
    printf("%-12s %-34s %7s  %-11s %-11s %-9s %-9s  %-9s %s\n", "format", "layout", "bits/w",
           "NMSE gauss", "NMSE t3", "cos gauss", "cos t3", "maxerr g", "maxerr t3");
    printf("%-12s %-34s %7s  %-11s %-11s %-9s %-9s  %-9s %s\n", "------", "------", "------",
           "----------", "-------", "---------", "------", "--------", "---------");
    for (size_t f = 0; f < NIB_ARRAY_LEN(k_rows); f++) {
        nib_quant_err e[2];
        uint64_t bytes = 0;
        for (int d = 0; d < 2; d++) {
            st = k_rows[f].fn(data[d], rows, cols, k_rows[f].arg, &ws, out, &bytes);
            if (st != NIB_OK) goto fail;
            NIB_TRY(nib_quant_error(data[d], out, (size_t)nk, &e[d]));
        }
        int is_default = k_rows[f].fn == rt_mxfp4 && k_rows[f].arg == NIB_MXFP4_SCALE_DEFAULT;
        char layout[64];
        snprintf(layout, sizeof layout, "%s%s", k_rows[f].layout, is_default ? " [default]" : "");
        printf("%-12s %-34s %7.3f  %-11.3e %-11.3e %-9.6f %-9.6f  %-9.3g %.3g\n",
               k_rows[f].name, layout, 8.0 * (double)bytes / (double)nk, e[0].nmse, e[1].nmse,
               e[0].cosine, e[1].cosine, e[0].max_abs, e[1].max_abs);
    }
    printf("\n%zu formats x 2 matrices in %.2f s\n", NIB_ARRAY_LEN(k_rows), nib_now_s() - t0);
    rc = 0;
fail:
    if (st != NIB_OK) rc = nib_cli_fail("formats", st);
    nib_free(data[0]);
    nib_free(data[1]);
    nib_free(out);
    nib_free(ws.b8);
    nib_free(ws.s8);
    nib_free(ws.sf);
    return rc;
}
