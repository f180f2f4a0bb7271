/* test_determinism_gpu.c — bitwise determinism of the Pi0.5 call on the GPU (docs/reliability.md,
 * "Determinism"):
 *   (a) the same inputs give bitwise-identical actions over 100 replays of the captured graph;
 *   (b) across processes: this binary is run again twice (/proc/self/exe, the child test
 *       pi05_gpu_determinism_child, which skips unless NIB_TEST_DET_OUT is set); each child loads
 *       the same checkpoint, runs the same call and writes its actions to a file; the two files
 *       must be byte-identical and equal to this process's own actions.
 *
 * The model is "small but realistic": the real widths, heads, head_dims and patch grid of
 * Pi0.5 (SigLIP 1152/16x72, Gemma-2B 2048/8x256 MQA, expert 1024/8x256, 224-pixel images of
 * 256 tokens), with fewer layers (1 vision, 2 + 2), the prefix MLP cut to 4096 and a 1024-token
 * vocabulary, so the checkpoint (~140M parameters) is written and loaded in seconds. The call
 * (3 cameras, 20 text tokens, H = 10, 10 steps, preset "fast": FP8 W8A8 cuBLASLt vision and
 * prefix, NVFP4 expert through nib's split-K GEMM) has the real shapes, so the kernel plans
 * are those of the full model's layers: the expert GEMMs at 10 rows split K across CTAs, and
 * the attention over the 800-odd cached keys splits the key axis (checked below, else the test
 * would not exercise the split merges whose fixed order it relies on).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "models/pi05.h"
#include "ops/attention.h"

#define DET_H 10
#define DET_TEXT 20
#define DET_CAMS 3
#define DET_PRESET "fast"

static void det_config(nib_pi05_config *c) {
    nib_pi05_config_full(c);
    c->v_layers = 1;
    c->layers = c->e_layers = 2;
    c->mlp = 4096;
    c->vocab = 1024;
    c->max_cameras = DET_CAMS, c->max_text = 48, c->max_horizon = DET_H;
}

static const char *det_ckpt(void) {
    static char path[512];
    if (!path[0]) {
        snprintf(path, sizeof path, "%s/pi05_det.safetensors", nib_test_tmpdir());
        nib_pi05_config c;
        det_config(&c);
        if (nib_pi05_synth_checkpoint_ex(path, &c, 2024, 1)) path[0] = '\0';
    }
    return path[0] ? path : NULL;
}

typedef struct det_in {
    float *img, noise[DET_H * 32];
    int32_t ids[DET_TEXT];
    nib_pi05_inputs in;
} det_in;

/* Fixed inputs (not the per-test seed: parent and child tests must build the same call). */
static int det_inputs(const nib_pi05_config *c, det_in *x) {
    nib_rng r;
    nib_rng_seed(&r, 0x5eed);
    const size_t n = (size_t)DET_CAMS * c->v_channels * c->v_image * c->v_image;
    x->img = malloc(n * 4);
    if (!x->img) return 0;
    for (size_t i = 0; i < n; i++) x->img[i] = (float)(2 * nib_rng_uniform(&r) - 1);
    for (int i = 0; i < DET_TEXT; i++) x->ids[i] = (int32_t)nib_rng_below(&r, (uint64_t)c->vocab);
    for (int i = 0; i < DET_H * 32; i++) x->noise[i] = (float)nib_rng_normal(&r);
    x->in = (nib_pi05_inputs){DET_CAMS, x->img, NULL, NULL, x->ids, DET_TEXT, DET_H, x->noise, 0};
    return 1;
}

static nib_status det_load(const char *path, nib_st_file **f, nib_pi05 **m) {
    nib_pi05_precision p;
    nib_pi05_config c;
    *f = NULL, *m = NULL;
    NIB_RETURN_IF_ERR(nib_pi05_preset(DET_PRESET, &p));
    NIB_RETURN_IF_ERR(nib_st_open(path, f));
    NIB_RETURN_IF_ERR(nib_pi05_config_from_file(*f, &c));
    return nib_pi05_load(*f, &c, &p, m);
}

/* load, run once (first call: eager run, capture, replay), write the actions to acts */
static nib_status det_actions(const char *path, float *acts) {
    nib_st_file *f = NULL;
    nib_pi05 *m = NULL;
    det_in x;
    memset(&x, 0, sizeof x);
    nib_status st = det_load(path, &f, &m);
    if (!st && !det_inputs(nib_pi05_cfg(m), &x)) st = NIB_ERR_OUT_OF_MEMORY;
    if (!st) st = nib_pi05_run(m, &x.in, acts, NULL);
    free(x.img);
    nib_pi05_free(m);
    nib_st_close(f);
    return st;
}

NIB_TEST(pi05_gpu_determinism_100_graph_replays) {
    NIB_REQUIRE_GPU();
    const char *path = det_ckpt();
    REQUIRE(path);
    nib_st_file *f = NULL;
    nib_pi05 *m = NULL;
    det_in x;
    memset(&x, 0, sizeof x);
    CHECK_OK(det_load(path, &f, &m));
    REQUIRE(m);
    const nib_pi05_config *c = nib_pi05_cfg(m);
    REQUIRE(det_inputs(c, &x));
    /* the attention plans of this call: the expert's cache attention must split the keys */
    nib_attn_cache_args ca;
    memset(&ca, 0, sizeof ca);
    ca.n_heads = c->e_heads, ca.q_tok = ca.o_tok = (int64_t)c->e_heads * c->head_dim, ca.nq = DET_H;
    ca.kv.dtype = nib_pi05_prec(m)->kv, ca.kv.n_kv_heads = c->kv_heads, ca.kv.head_dim = c->head_dim;
    ca.kv.t_max = c->max_cameras * c->v_tokens + c->max_text + c->max_horizon;
    nib_attn_plan pl;
    memset(&pl, 0, sizeof pl);
    CHECK_OK(nib_cuda_attn_cache_plan(&ca, &pl));
    printf("  expert attention over %d cached keys: %s, %d key splits\n", ca.kv.t_max, pl.kernel, pl.n_splits);
    CHECK_MSG(pl.n_splits > 1, "the cache attention does not split here: the test would not exercise the merge");
    static float first[DET_H * 32], a[DET_H * 32];
    CHECK_OK(nib_pi05_run(m, &x.in, first, NULL));
    int nonfin = 0, diff = 0, first_diff = -1;
    for (int i = 0; i < DET_H * 32; i++) nonfin += !isfinite(first[i]);
    CHECK_MSG(!nonfin, "%d non-finite actions", nonfin);
    double t0 = nib_now_s();
    const int reps = nib_under_sanitizer() ? 3 : 100; /* the sanitizers slow each replay ~100x */
    for (int r = 0; r < reps; r++) {
        CHECK_OK(nib_pi05_run(m, &x.in, a, NULL));
        if (memcmp(a, first, sizeof a)) {
            if (first_diff < 0) first_diff = r;
            diff++;
        }
    }
    printf("  %d graph replays in %.2f s: %d differ bitwise from the first call\n", reps, nib_now_s() - t0, diff);
    CHECK_MSG(!diff, "%d of %d graph replays differ bitwise from the first (first at replay %d)", diff, reps, first_diff);
    free(x.img);
    nib_pi05_free(m);
    nib_st_close(f);
}

/* The child half of (b): compute the actions and write them to $NIB_TEST_DET_OUT. */
NIB_TEST(pi05_gpu_determinism_child) {
    const char *out = getenv("NIB_TEST_DET_OUT"), *path = getenv("NIB_TEST_DET_CKPT");
    if (!out || !path) SKIP("runs only as a child process of pi05_gpu_determinism_across_processes");
    NIB_REQUIRE_GPU();
    static float acts[DET_H * 32];
    CHECK_OK(det_actions(path, acts));
    FILE *fo = fopen(out, "wb");
    REQUIRE(fo);
    CHECK(fwrite(acts, sizeof acts, 1, fo) == 1);
    CHECK(fclose(fo) == 0);
}

NIB_TEST(pi05_gpu_determinism_across_processes) {
    NIB_SKIP_UNDER_SANITIZER("two more processes loading the model; the replay test covers the kernels");
    NIB_REQUIRE_GPU();
    const char *path = det_ckpt();
    REQUIRE(path);
    static float mine[DET_H * 32], theirs[2][DET_H * 32];
    CHECK_OK(det_actions(path, mine));
    static char child_log[16384];
    for (int i = 0; i < 2; i++) {
        char outp[600], env_out[700], env_ck[700];
        snprintf(outp, sizeof outp, "%s/pi05_det_child%d.bin", nib_test_tmpdir(), i);
        snprintf(env_out, sizeof env_out, "NIB_TEST_DET_OUT=%s", outp);
        snprintf(env_ck, sizeof env_ck, "NIB_TEST_DET_CKPT=%s", path);
        const char *env[] = {env_out, env_ck, NULL};
        remove(outp);
        int rc = nib_test_run_self("pi05_gpu_determinism_child", env, child_log, sizeof child_log);
        CHECK_MSG(rc == 0 && strstr(child_log, "PASS pi05_gpu_determinism_child"), "child %d exited %d:\n%s", i, rc,
                  child_log);
        FILE *fi = fopen(outp, "rb");
        size_t n = fi ? fread(theirs[i], 1, sizeof theirs[i], fi) : 0;
        if (fi) fclose(fi);
        CHECK_MSG(n == sizeof theirs[i], "child %d wrote %zu of %zu bytes", i, n, sizeof theirs[i]);
    }
    int d01 = memcmp(theirs[0], theirs[1], sizeof mine) != 0, d0 = memcmp(theirs[0], mine, sizeof mine) != 0;
    printf("  two child processes: %s each other; %s this process's actions\n", d01 ? "DIFFER from" : "identical to",
           d0 ? "DIFFER from" : "identical to");
    CHECK_MSG(!d01, "the two child processes' actions differ bitwise");
    CHECK_MSG(!d0, "the child processes' actions differ bitwise from this process's");
}
