/* test_numerics.c — check-numerics mode (docs/reliability.md, "NaN / Inf in activations"):
 *
 *   the scan op (ops/numerics.h): the reference against planted NaN/+Inf/-Inf at known
 *   positions (padding columns hold NaN that must not be counted); the CUDA twin against the
 *   reference at awkward shapes, bf16 and fp32, with guard NaNs in the padding.
 *
 *   Pi0.5 (tiny config, unit-gain weights): one weight row of a linear set to 2.98e38, a finite
 *   bf16 value the load-time NaN/Inf checks accept, so every product with an activation above
 *   1.13 in magnitude overflows fp32 (and sums of hundreds of them overflow regardless): the
 *   stage that reads that linear's output turns Inf in exactly that column. A normal call returns
 *   NIB_OK with non-finite actions (the fault is silent); a call in check mode fails with
 *   NIB_ERR_NUMERICS naming the stage ("prefix layer 0 output"), the tensor and the column of
 *   the faulty row. Three faults, one per part: vision layer 0 fc2, prefix layer 0 down_proj,
 *   expert layer 1 down_proj (caught at step 0). Without a fault the check-mode call passes and
 *   gives bitwise the actions of a normal call (on the GPU: eager vs the captured graph).
 *   Reference backend here (CPU, CI); the GPU twin runs the bf16 preset.
 *   The CLI: `nib run pi05 --check-numerics` exits 1 on the faulty model (0 and the same output
 *   file bytes on the clean one), and `nib run --help` documents the flag.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "formats/formats.h"
#include "harness.h"
#include "io/safetensors.h"
#include "models/pi05.h"
#include "models/pi05_keys.h"
#include "ops/numerics.h"
#include "runtime/device.h"

#define FAULT_BF16 0x7F60u /* 1.75 * 2^127 = 2.98e38: finite, passes the load-time checks */
#define FAULT_ROW 5

/* ---- the scan op ---------------------------------------------------------------------------- */

static float bits_f(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* [rows][ld] random floats, NaN in the padding columns [cols, ld) */
static float *rand_matrix(nib_rng *r, int64_t rows, int64_t cols, int64_t ld) {
    float *x = malloc((size_t)(rows * ld + 1) * 4);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < ld; j++) x[i * ld + j] = j < cols ? (float)nib_rng_normal(r) : NAN;
    return x;
}

NIB_TEST(numerics_ref_check_finite) {
    nib_rng r;
    nib_test_rng(t, &r);
    const int64_t rows = 17, cols = 127, ld = 130;
    float *x = rand_matrix(&r, rows, cols, ld);
    nib_check_finite_args a = {x, rows, cols, ld, 0};
    nib_finite_result res;
    CHECK_OK(nib_ref_check_finite(&a, &res));
    CHECK_MSG(res.count == 0 && res.first == UINT64_MAX, "clean matrix: count %llu (the padding NaNs were read?)",
              (unsigned long long)res.count);
    /* planted, in row-major order: -Inf at (3, 126), NaN at (9, 0), +Inf at (16, 64) */
    x[3 * ld + 126] = -INFINITY, x[9 * ld + 0] = NAN, x[16 * ld + 64] = INFINITY;
    CHECK_OK(nib_ref_check_finite(&a, &res));
    CHECK(res.count == 3);
    CHECK_MSG(res.first == 3 * 127 + 126, "first %llu, want %d", (unsigned long long)res.first, 3 * 127 + 126);
    CHECK(isinf(res.value) && res.value < 0);
    x[3 * ld + 126] = 1.0f;
    CHECK_OK(nib_ref_check_finite(&a, &res));
    CHECK(res.count == 2 && res.first == 9 * 127 && isnan(res.value));
    /* the largest finite float is finite; an empty region has nothing */
    x[9 * ld] = bits_f(0x7F7FFFFFu), x[16 * ld + 64] = -bits_f(0x7F7FFFFFu);
    CHECK_OK(nib_ref_check_finite(&a, &res));
    CHECK(res.count == 0);
    a.rows = 0;
    CHECK_OK(nib_ref_check_finite(&a, &res));
    CHECK(res.count == 0);
    a.rows = rows, a.ld = cols - 1;
    CHECK_ST(nib_ref_check_finite(&a, &res), NIB_ERR_INVALID_ARG);
    free(x);
}

/* The CUDA scan against the reference: bf16 and fp32, shapes M = 1, 3, 17, 64, 127 with odd
 * column counts, 0 / 1 / many planted values at random positions, guard NaNs in the padding. */
NIB_TEST(numerics_gpu_check_finite_matches_reference) {
    NIB_REQUIRE_GPU();
    nib_rng r;
    nib_test_rng(t, &r);
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 17, 24}, {17, 127, 130}, {64, 1000, 1003}, {127, 4099, 4099}};
    void *ws = NULL;
    REQUIRE(nib_dev_malloc(&ws, NIB_CHECK_FINITE_WS_BYTES, "scan result") == NIB_OK);
    for (size_t si = 0; si < NIB_ARRAY_LEN(shapes); si++)
        for (int f32 = 0; f32 < 2; f32++)
            for (int planted = 0; planted < 3; planted++) {
                const int64_t rows = shapes[si][0], cols = shapes[si][1], ld = shapes[si][2];
                float *x = rand_matrix(&r, rows, cols, ld);
                int n_bad = planted == 0 ? 0 : planted == 1 ? 1 : 1 + (int)nib_rng_below(&r, 40);
                for (int i = 0; i < n_bad; i++) {
                    int64_t e = (int64_t)nib_rng_below(&r, (uint64_t)(rows * cols));
                    const float v[3] = {NAN, INFINITY, -INFINITY};
                    x[(e / cols) * ld + e % cols] = v[nib_rng_below(&r, 3)];
                }
                /* device copy: fp32 as is, or rounded to bf16 (non-finite stays non-finite) */
                const size_t esz = f32 ? 4 : 2, bytes = (size_t)(rows * ld) * esz;
                void *host = malloc(bytes), *dev = NULL;
                for (int64_t i = 0; i < rows * ld; i++) {
                    if (f32) ((float *)host)[i] = x[i];
                    else ((uint16_t *)host)[i] = nib_f32_to_bf16(x[i]);
                }
                nib_check_finite_args ra = {x, rows, cols, ld, 1}, ga = {NULL, rows, cols, ld, f32};
                nib_finite_result want, got;
                CHECK_OK(nib_ref_check_finite(&ra, &want));
                if (nib_dev_malloc(&dev, bytes, "scan input") == NIB_OK && nib_dev_upload(dev, host, bytes) == NIB_OK) {
                    ga.x = dev;
                    CHECK_OK(nib_cuda_check_finite(&ga, ws, &got, NULL));
                    int same = got.count == want.count && got.first == want.first &&
                               (want.count == 0 || (isnan(got.value) == isnan(want.value) &&
                                                    (isnan(want.value) || got.value == want.value)));
                    CHECK_MSG(same, "%lldx%lld ld %lld %s: GPU count %llu first %llu (%g), reference %llu first %llu (%g)",
                              (long long)rows, (long long)cols, (long long)ld, f32 ? "f32" : "bf16",
                              (unsigned long long)got.count, (unsigned long long)got.first, (double)got.value,
                              (unsigned long long)want.count, (unsigned long long)want.first, (double)want.value);
                } else {
                    CHECK_MSG(0, "device buffer: %s", nib_last_error());
                }
                nib_dev_free(dev, bytes);
                free(host), free(x);
            }
    nib_dev_free(ws, NIB_CHECK_FINITE_WS_BYTES);
}

/* ---- Pi0.5 ------------------------------------------------------------------------------------ */

static const char *clean_ckpt(void) {
    static char path[512];
    if (!path[0]) {
        snprintf(path, sizeof path, "%s/pi05_numerics.safetensors", nib_test_tmpdir());
        nib_pi05_config c;
        nib_pi05_config_tiny(&c);
        if (nib_pi05_synth_checkpoint_ex(path, &c, 4321, 1)) path[0] = '\0';
    }
    return path[0] ? path : NULL;
}

/* Copy src to dst with row FAULT_ROW of the bf16 [n][k] tensor `name` set to FAULT_BF16. */
static int write_fault(const char *src, const char *dst, const char *name) {
    nib_st_file *f = NULL;
    nib_st_writer *w = NULL;
    int ok = 0, found = 0;
    if (nib_st_open(src, &f) || nib_st_writer_create(dst, &w)) goto out;
    const nib_st_kv *meta = nib_st_metadata_find(f, "nib.pi05.config");
    if (meta && nib_st_writer_set_metadata(w, "nib.pi05.config", meta->value)) goto out;
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *x = nib_st_tensor_at(f, i);
        if (nib_st_writer_declare(w, x->name, x->dtype, x->ndim, x->shape)) goto out;
    }
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *x = nib_st_tensor_at(f, i);
        if (strcmp(x->name, name)) {
            if (nib_st_writer_write(w, x->data, x->nbytes)) goto out;
            continue;
        }
        if (x->dtype != NIB_DTYPE_BF16 || x->ndim != 2 || x->shape[0] <= FAULT_ROW) goto out;
        uint16_t *buf = malloc(x->nbytes);
        if (!buf) goto out;
        memcpy(buf, x->data, x->nbytes);
        for (int64_t j = 0; j < x->shape[1]; j++) buf[FAULT_ROW * x->shape[1] + j] = FAULT_BF16;
        nib_status st = nib_st_writer_write(w, buf, x->nbytes);
        free(buf);
        if (st) goto out;
        found = 1;
    }
    ok = found && nib_st_writer_finish(w) == NIB_OK;
    w = NULL;
out:
    if (w) nib_st_writer_abort(w);
    nib_st_close(f);
    return ok;
}

typedef struct fault_case {
    const char *tensor, *stage;
} fault_case;

static const fault_case k_faults[3] = {
    {PI05_VP ".encoder.layers.0.mlp.fc2.weight", "vision layer 0 output"},
    {PI05_LP ".layers.0.mlp.down_proj.weight", "prefix layer 0 output"},
    {PI05_EP ".layers.1.mlp.down_proj.weight", "step 0 expert layer 1 output"},
};

typedef struct call_in {
    float img[2 * 3 * 56 * 56], noise[10 * 32];
    int32_t ids[9];
    nib_pi05_inputs in;
} call_in;

static void make_call(nib_test_ctx *t, call_in *x) {
    nib_rng r;
    nib_test_rng(t, &r);
    for (size_t i = 0; i < NIB_ARRAY_LEN(x->img); i++) x->img[i] = (float)(2 * nib_rng_uniform(&r) - 1);
    for (int i = 0; i < 9; i++) x->ids[i] = (int32_t)nib_rng_below(&r, 1000);
    for (int i = 0; i < 10 * 32; i++) x->noise[i] = (float)nib_rng_normal(&r);
    x->in = (nib_pi05_inputs){2, x->img, NULL, NULL, x->ids, 9, 10, x->noise, 0};
}

static nib_status load_model(const char *path, const char *preset, nib_st_file **f, nib_pi05 **m) {
    nib_pi05_precision p;
    nib_pi05_config c;
    *f = NULL, *m = NULL;
    NIB_RETURN_IF_ERR(nib_pi05_preset(preset, &p));
    NIB_RETURN_IF_ERR(nib_st_open(path, f));
    NIB_RETURN_IF_ERR(nib_pi05_config_from_file(*f, &c));
    return nib_pi05_load(*f, &c, &p, m);
}

static int n_nonfinite(const float *a, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) bad += !isfinite(a[i]);
    return bad;
}

/* The whole check on one backend: clean model (check mode == normal call, bitwise), then each
 * fault (normal call silently non-finite, check mode names the stage, tensor column). */
static void check_numerics_on(nib_test_ctx *t, const char *preset) {
    const char *clean = clean_ckpt();
    REQUIRE(clean);
    static call_in x;
    make_call(t, &x);
    float a_norm[320], a_chk[320], a_again[320];
    nib_st_file *f = NULL;
    nib_pi05 *m = NULL;
    CHECK_OK(load_model(clean, preset, &f, &m));
    if (m) {
        CHECK_OK(nib_pi05_run(m, &x.in, a_norm, NULL));
        nib_pi05_set_check_numerics(m, 1);
        nib_pi05_timing tm;
        CHECK_OK(nib_pi05_run(m, &x.in, a_chk, &tm));
        CHECK(tm.total_ms > 0);
        nib_pi05_set_check_numerics(m, 0);
        CHECK_OK(nib_pi05_run(m, &x.in, a_again, NULL));
        CHECK_MSG(!n_nonfinite(a_norm, 320), "clean model: %d non-finite actions", n_nonfinite(a_norm, 320));
        CHECK_MSG(!memcmp(a_norm, a_chk, sizeof a_norm), "check mode changed the actions of a clean model");
        CHECK_MSG(!memcmp(a_norm, a_again, sizeof a_norm), "a normal call after check mode differs");
    }
    nib_pi05_free(m), nib_st_close(f);
    for (int i = 0; i < 3; i++) {
        char path[600], col[32];
        snprintf(path, sizeof path, "%s/pi05_numerics_fault%d.safetensors", nib_test_tmpdir(), i);
        REQUIRE(write_fault(clean, path, k_faults[i].tensor));
        CHECK_OK(load_model(path, preset, &f, &m)); /* 2.98e38 is finite: the load accepts it */
        if (m) {
            float a[320];
            CHECK_OK(nib_pi05_run(m, &x.in, a, NULL));
            int bad = n_nonfinite(a, 320);
            printf("  %-42s normal call: %3d of 320 actions non-finite (silent)\n", k_faults[i].tensor, bad);
            CHECK_MSG(bad > 0, "%s: the fault did not reach the actions", k_faults[i].tensor);
            nib_pi05_set_check_numerics(m, 1);
            nib_status st = nib_pi05_run(m, &x.in, a, NULL);
            const char *msg = nib_last_error();
            printf("  check mode: %s: %s\n", nib_status_name(st), msg);
            CHECK_MSG(st == NIB_ERR_NUMERICS, "%s: check mode returned %s", k_faults[i].tensor, nib_status_name(st));
            CHECK_MSG(strstr(msg, k_faults[i].stage) != NULL, "message lacks the stage '%s': %s", k_faults[i].stage, msg);
            snprintf(col, sizeof col, "col %d)", FAULT_ROW); /* the faulty weight row = the output column */
            CHECK_MSG(strstr(msg, col) != NULL && strstr(msg, "element ") != NULL,
                      "message lacks the first bad element in column %d: %s", FAULT_ROW, msg);
        }
        nib_pi05_free(m), nib_st_close(f);
        m = NULL, f = NULL;
    }
}

NIB_TEST(pi05_ref_check_numerics_names_the_stage) { check_numerics_on(t, "ref"); }

NIB_TEST(pi05_gpu_check_numerics_names_the_stage) {
    NIB_REQUIRE_GPU();
    check_numerics_on(t, "bf16");
}

/* Run a CLI command with its stdout and stderr captured into out. */
static int capture_stdout(int (*fn)(int, char **), int argc, char **argv, char *out, size_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/stdout.txt", nib_test_tmpdir());
    fflush(stdout);
    fflush(stderr);
    int saved = dup(1), saved2 = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (saved < 0 || saved2 < 0 || fd < 0) return -1;
    dup2(fd, 1);
    dup2(fd, 2); /* the CLI's messages go to the file too */
    close(fd);
    int rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved, 1);
    dup2(saved2, 2);
    close(saved);
    close(saved2);
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = '\0';
    if (f) fclose(f);
    return rc;
}

static int read_file(const char *path, char *buf, size_t cap, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    *n = fread(buf, 1, cap, f);
    fclose(f);
    return 1;
}

/* `nib run pi05 --check-numerics` through the CLI entry point (reference preset) */
NIB_TEST(pi05_ref_check_numerics_cli) {
    static char help[8192];
    char *hv[3] = {(char *)"run", (char *)"--help", NULL};
    CHECK(capture_stdout(nib_cmd_run, 2, hv, help, sizeof help) == 0);
    CHECK_MSG(strstr(help, "--check-numerics") != NULL, "nib run --help does not document --check-numerics");
    const char *clean = clean_ckpt();
    REQUIRE(clean);
    char bad[600], in[600], o1[600], o2[600];
    snprintf(bad, sizeof bad, "%s/pi05_numerics_cli_fault.safetensors", nib_test_tmpdir());
    snprintf(in, sizeof in, "%s/pi05_numerics_in.safetensors", nib_test_tmpdir());
    snprintf(o1, sizeof o1, "%s/pi05_numerics_out1.safetensors", nib_test_tmpdir());
    snprintf(o2, sizeof o2, "%s/pi05_numerics_out2.safetensors", nib_test_tmpdir());
    REQUIRE(write_fault(clean, bad, k_faults[1].tensor));
    static call_in x;
    make_call(t, &x);
    nib_st_save_tensor ts[3] = {{"images", NIB_DTYPE_F32, 4, {2, 3, 56, 56}, x.img},
                                {"text_ids", NIB_DTYPE_I32, 1, {9}, x.ids},
                                {"noise", NIB_DTYPE_F32, 3, {1, 10, 32}, x.noise}};
    REQUIRE(nib_st_save(in, 3, ts, 0, NULL) == NIB_OK);
    char *a1[] = {"run", "pi05", "--checkpoint", (char *)clean, "--inputs", in, "--out", o1, "--preset", "ref", NULL};
    char *a2[] = {"run", "pi05", "--checkpoint", (char *)clean, "--inputs", in, "--out", o2, "--preset", "ref",
                  "--check-numerics", NULL};
    char *a3[] = {"run", "pi05", "--checkpoint", bad, "--inputs", in, "--out", o2, "--preset", "ref", "--check-numerics", NULL};
    static char out[8192], b1[1 << 16], b2[1 << 16];
    CHECK(capture_stdout(nib_cmd_run, 10, a1, out, sizeof out) == 0);
    CHECK(capture_stdout(nib_cmd_run, 11, a2, out, sizeof out) == 0);
    size_t n1 = 0, n2 = 0;
    CHECK(read_file(o1, b1, sizeof b1, &n1) && read_file(o2, b2, sizeof b2, &n2));
    CHECK_MSG(n1 > 0 && n1 == n2 && !memcmp(b1, b2, n1), "--check-numerics changed the output file (%zu vs %zu bytes)",
              n1, n2);
    CHECK_MSG(capture_stdout(nib_cmd_run, 11, a3, out, sizeof out) == 1, "a faulty model must make nib run exit 1");
    CHECK_MSG(strstr(out, "NIB_ERR_NUMERICS") && strstr(out, "prefix layer 0 output"), "nib run printed: %s", out);
}

/* `nib bench pi05 --precision` (and --images): documented in --help; a bad spec or the reference backend is
 * refused before any device work or checkpoint synthesis (so this runs without a GPU too) */
NIB_TEST(cli_bench_pi05_precision_option) {
    static char out[8192];
    char *help[] = {"pi05", "--help", NULL};
    CHECK(capture_stdout(nib_bench_pi05, 2, help, out, sizeof out) == 0);
    CHECK_MSG(strstr(out, "--precision") != NULL, "nib bench pi05 --help does not document --precision");
    char *bad[] = {"pi05", "--preset", "fast", "--precision", "vision=fp5", NULL};
    CHECK(capture_stdout(nib_bench_pi05, 5, bad, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "vision=fp5") != NULL && strstr(out, "NIB_ERR_INVALID_ARG") != NULL,
              "a bad --precision spec is not named: %s", out);
    CHECK_MSG(strstr(out, "synthesizing") == NULL, "a bad --precision spec started work first: %s", out);
    char *ref[] = {"pi05", "--precision", "backend=ref", NULL};
    CHECK(capture_stdout(nib_bench_pi05, 3, ref, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "backend=ref is not timed") != NULL, "backend=ref was not refused: %s", out);
    char *unknown[] = {"pi05", "--precison", "vision=bf16", NULL};
    CHECK(capture_stdout(nib_bench_pi05, 3, unknown, out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "unknown or incomplete option '--precison'") != NULL, "a misspelt option is not named: %s", out);
    /* --images f32|u8: documented, and anything else refused before any work */
    CHECK(capture_stdout(nib_bench_pi05, 2, help, out, sizeof out) == 0);
    CHECK_MSG(strstr(out, "[--images f32|u8]") != NULL, "nib bench pi05 --help does not document --images");
    char *img[] = {"pi05", "--images", "rgb", NULL};
    CHECK(capture_stdout(nib_bench_pi05, 3, img, out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "--images is f32 or u8, not 'rgb'") != NULL && strstr(out, "synthesizing") == NULL,
              "a bad --images value is not named: %s", out);
}

/* The Pi0.5 commands' and the labs' numeric options are parsed strictly: a value that is not an integer, or out of
 * range, exits 2 naming the option, the range and the value, before any work (no checkpoint synthesis,
 * no device), so this runs without a GPU */
NIB_TEST(cli_number_options) {
    static char out[8192];
    struct {
        int (*fn)(int, char **);
        const char *argv[5];
        const char *must;
    } cases[] = {
        {nib_cmd_demo, {"demo", "--cameras", "abc"}, "--cameras takes an integer from 0 to 8, not 'abc'"},
        {nib_cmd_demo, {"demo", "--horizon", "0"}, "--horizon takes an integer from 1 to 1024, not '0'"},
        {nib_cmd_demo, {"demo", "--text", "-1"}, "--text takes an integer from 0 to 512, not '-1'"},
        {nib_cmd_demo, {"demo", "--text", "12x"}, "not '12x'"},
        {nib_cmd_demo, {"demo", "--seed", "-3"}, "--seed takes an unsigned integer"},
        {nib_cmd_accuracy, {"accuracy", "pi05", "--horizon", "1e3"}, "--horizon takes an integer from 1 to 1024, not '1e3'"},
        {nib_bench_pi05, {"pi05", "--cams", "4"}, "--cams takes an integer from 1 to 3, not '4'"},
        {nib_bench_pi05, {"pi05", "--horizon", "1025"}, "--horizon takes an integer from 1 to 1024, not '1025'"},
        {nib_bench_pi05, {"pi05", "--reps", "3"}, "--reps takes an integer from 5 to 100000, not '3'"},
        {nib_cmd_run, {"run", "pi05", "--steps", "0"}, "--steps takes an integer from 1 to 64, not '0'"},
        {nib_cmd_run, {"run", "pi05", "--seed", "99999999999999999999999"}, "--seed takes an unsigned integer"},
        {nib_cmd_bench, {"bench", "gemm", "--reps", "2"}, "--reps takes an integer from 3 to 100000, not '2'"},
        {nib_bench_ops, {"ops", "--reps", "x"}, "--reps takes an integer from 3 to 100000, not 'x'"},
        {nib_bench_attn, {"attn", "--reps", "1.5"}, "not '1.5'"},
        {nib_cmd_bench, {"bench", "gemm", "--algos", "40"}, "--algos takes an integer from 1 to 32, not '40'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int argc = 0;
        while (argc < 5 && cases[i].argv[argc]) argc++;
        const int rc = capture_stdout(cases[i].fn, argc, (char **)cases[i].argv, out, sizeof out);
        CHECK_MSG(rc == 2, "%s %s %s: exit %d, want 2 (%s)", cases[i].argv[0], cases[i].argv[1], cases[i].argv[2], rc, out);
        CHECK_MSG(strstr(out, cases[i].must) != NULL, "%s %s: printed '%s', want '%s'", cases[i].argv[0], cases[i].argv[1],
                  out, cases[i].must);
        CHECK_MSG(strstr(out, "synthesizing") == NULL, "%s: work started before the options were checked", cases[i].argv[0]);
    }
}

/* `nib accuracy`: a bad preset, and (without a GPU) the missing device, are reported before the
 * full-size checkpoint is synthesized or the fp32 reference loaded */
NIB_TEST(cli_accuracy_checks_before_work) {
    static char out[8192];
    char *bad[] = {"accuracy", "pi05", "--presets", "bf16,fastx", NULL};
    CHECK(capture_stdout(nib_cmd_accuracy, 4, bad, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "unknown preset 'fastx'") != NULL && strstr(out, "synthesizing") == NULL, "printed: %s", out);
    char *over[] = {"accuracy", "pi05", "--presets", "fast:kv=fp9", NULL};
    CHECK(capture_stdout(nib_cmd_accuracy, 4, over, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "kv=fp9") != NULL && strstr(out, "synthesizing") == NULL, "printed: %s", out);
    if (nib_device_available()) return; /* with a GPU the default run is real work: not run here */
    nib_clear_error();
    char *def[] = {"accuracy", "pi05", NULL};
    CHECK(capture_stdout(nib_cmd_accuracy, 2, def, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "NIB_ERR_NO_DEVICE") != NULL && strstr(out, "synthesizing") == NULL && strstr(out, "loaded") == NULL,
              "without a GPU nib accuracy must stop before any work: %s", out);
}
