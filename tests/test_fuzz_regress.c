/* test_fuzz_regress.c — inputs found while fuzzing (fuzz/, docs/fuzzing.md), each kept as the
 * exact bytes of the file, with the clean error it must get. Each input is opened in a forked
 * child, so a crash (SIGFPE, SIGSEGV, a sanitizer abort under `make san-test`) is a FAIL of that
 * test and not the end of the test run.
 *
 * A case whose bug is still open is marked KNOWN_BUG: it is skipped, with its reason, unless
 * NIB_REGRESS_KNOWN=1 is set (then it runs, and fails until the bug is fixed). When a fix lands,
 * delete the KNOWN_BUG line of its case: from then on it guards against the bug coming back.
 * All findings below are fixed (F1-F3 in models/pi05_config.c, R1 in io/qcheckpoint.c).
 *
 * Findings (docs/fuzzing.md has the root causes):
 *   F1  models/pi05_config.c: "kv_heads": 0 in the "nib.pi05.config" metadata -> heads % 0
 *       (SIGFPE: the process dies loading a checkpoint)
 *   F2  models/pi05_config.c: v_head_dim * v_heads in int (each up to 1e6 from the metadata):
 *       signed overflow (UB)
 *   F3  models/pi05_config.c: an empty position embedding of 2147483647 rows -> grid * grid in
 *       int overflows (UB) while checking for a square grid
 * The control case (the F1/F2 file with a sane metadata config) must load.
 * From review while writing the harnesses (beyond what a 16 KiB fuzz input can reach):
 *   R1  io/qcheckpoint.c nib_qckpt_index_build deduplicates candidate layers with a linear scan
 *       per candidate: O(n^2) in the tensor count, so a header of many small "*.qweight"
 *       entries stalls `nib inspect --check` (20,000 take seconds; a 100 MB header, hours). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "io/qcheckpoint.h"
#include "io/safetensors.h"
#include "models/pi05.h"

/* What to do with one input in the child. Exit status: 0 the expected clean outcome, 2 the input
 * did not open, 3 a wrong outcome; a sanitizer report exits 1 (ASan/UBSan's default). */
typedef int (*regress_fn)(const unsigned char *p, size_t n);

/* Run fn in a child; FAIL on a crash or a wrong outcome. */
static void run_isolated(nib_test_ctx *t, const char *id, regress_fn fn, const unsigned char *p,
                         size_t n) {
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(fn(p, n));
    int ws = 0;
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    if (WIFSIGNALED(ws))
        nib_test_fail(t, __FILE__, __LINE__, "%s: crashed with signal %d (%s)", id, WTERMSIG(ws),
                      strsignal(WTERMSIG(ws)));
    else
        CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "%s: %s (child exit %d)", id,
                  !WIFEXITED(ws)              ? "did not exit"
                  : WEXITSTATUS(ws) == 1      ? "sanitizer report (above)"
                  : WEXITSTATUS(ws) == 2      ? "the input did not open"
                                              : "wrong outcome (the child's line above)",
                  WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
}

#define KNOWN_BUG(...)                                                                        \
    do {                                                                                      \
        const char *run_ = getenv("NIB_REGRESS_KNOWN");                                       \
        if (!run_ || strcmp(run_, "1") != 0) SKIP("KNOWN BUG, open: " __VA_ARGS__);          \
    } while (0)

/* ---- the model-config reader ---------------------------------------------------------------- */

/* nib_pi05_config_from_file must give a clean content error (not OK, not INTERNAL, a message). */
static int config_rejected(const unsigned char *p, size_t n) {
    nib_st_file *f = NULL;
    nib_pi05_config c;
    if (nib_st_open_memory(p, n, &f) != NIB_OK) return 2; /* the file itself is valid */
    nib_status st = nib_pi05_config_from_file(f, &c);
    nib_st_close(f);
    printf("  (child: %s: %s)\n", nib_status_name(st), nib_last_error());
    return st != NIB_OK && st != NIB_ERR_INTERNAL && nib_last_error()[0] ? 0 : 3;
}

static int config_loads(const unsigned char *p, size_t n) {
    nib_st_file *f = NULL;
    nib_pi05_config c;
    if (nib_st_open_memory(p, n, &f) != NIB_OK) return 2;
    nib_status st = nib_pi05_config_from_file(f, &c);
    nib_st_close(f);
    return st == NIB_OK && c.v_heads == 4 && c.v_head_dim == 8 && c.layers == 2 && c.heads == 2 ? 0 : 3;
}

/* Control: every tensor the config reader looks at (empty where it can be), v_heads = 4. */
static const unsigned char k_config_ok[] =
    "\x97\x07\x00\x00\x00\x00\x00\x00"
    "{\"__metadata__\":{\"nib.pi05.config\":\"{\\\"v_heads\\\":4}\"},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight\":{\"dtype\":\"BF16\",\"shape\":[32,3,14,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.position_embedding.weight\":{\"dtype\":\"BF16\",\"shape\":[16,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.layer_norm1.weight\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.1.layer_norm1.weight\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight\":{\"dtype\":\"BF16\",\"shape\":[64,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[100,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.1.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.k_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[4,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.0.mlp.gate_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[16,0],\"data_offsets\":[0,0]},"
    "\"action_in_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[32,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.gemma_expert.model.layers.1.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.gemma_expert.model.layers.0.mlp.gate_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[16,0],\"data_offsets\":[0,0]}}";

/* F1: the same file with "kv_heads": 0 in its metadata config. */
static const unsigned char k_config_kv_heads_zero[] =
    "\x98\x07\x00\x00\x00\x00\x00\x00"
    "{\"__metadata__\":{\"nib.pi05.config\":\"{\\\"kv_heads\\\":0}\"},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight\":{\"dtype\":\"BF16\",\"shape\":[32,3,14,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.position_embedding.weight\":{\"dtype\":\"BF16\",\"shape\":[16,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.layer_norm1.weight\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.1.layer_norm1.weight\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight\":{\"dtype\":\"BF16\",\"shape\":[64,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[100,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.1.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.k_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[4,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.0.mlp.gate_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[16,0],\"data_offsets\":[0,0]},"
    "\"action_in_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[32,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.gemma_expert.model.layers.1.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.gemma_expert.model.layers.0.mlp.gate_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[16,0],\"data_offsets\":[0,0]}}";

/* F2: v_head_dim = v_heads = 1000000 (each within the reader's 0..1e6 range). */
static const unsigned char k_config_head_dim_overflow[] =
    "\xb4\x07\x00\x00\x00\x00\x00\x00"
    "{\"__metadata__\":{\"nib.pi05.config\":\"{\\\"v_head_dim\\\":1000000,\\\"v_heads\\\":1000000}\"},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight\":{\"dtype\":\"BF16\",\"shape\":[32,3,14,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.position_embedding.weight\":{\"dtype\":\"BF16\",\"shape\":[16,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.layer_norm1.weight\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.1.layer_norm1.weight\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight\":{\"dtype\":\"BF16\",\"shape\":[64,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[100,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.1.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.k_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[4,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.language_model.layers.0.mlp.gate_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[16,0],\"data_offsets\":[0,0]},"
    "\"action_in_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[32,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.gemma_expert.model.layers.1.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.gemma_expert.model.layers.0.mlp.gate_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[16,0],\"data_offsets\":[0,0]}}";

/* F3: a position embedding of shape [2147483647, 0] (empty, so the file is valid). */
static const unsigned char k_config_grid_overflow[] =
    "\x43\x01\x00\x00\x00\x00\x00\x00"
    "{\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight\":{\"dtype\":\"BF16\",\"shape\":[32,3,14,0],\"data_offsets\":[0,0]},"
    "\"paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.position_embedding.weight\":{\"dtype\":\"BF16\",\"shape\":[2147483647,0],\"data_offsets\":[0,0]}}";

NIB_TEST(fuzz_regress_config_control_loads) {
    run_isolated(t, "control", config_loads, k_config_ok, sizeof k_config_ok - 1);
}

NIB_TEST(fuzz_regress_config_kv_heads_zero) {
    run_isolated(t, "F1", config_rejected, k_config_kv_heads_zero,
                 sizeof k_config_kv_heads_zero - 1);
}

NIB_TEST(fuzz_regress_config_head_dim_overflow) {
    run_isolated(t, "F2", config_rejected, k_config_head_dim_overflow,
                 sizeof k_config_head_dim_overflow - 1);
}

NIB_TEST(fuzz_regress_config_grid_overflow) {
    run_isolated(t, "F3", config_rejected, k_config_grid_overflow,
                 sizeof k_config_grid_overflow - 1);
}

/* ---- the quantized-checkpoint index --------------------------------------------------------- */

/* R1: n empty "l<i>.qweight" tensors (each a candidate layer, each failing detection quickly).
 * An O(n log n) index takes milliseconds for n = 20000; the 2 s bound leaves a wide margin for a
 * slow or busy machine while catching the quadratic scan (seconds at this n, growing as n^2). */
NIB_TEST(fuzz_regress_qckpt_index_not_quadratic) {
    enum { N = 20000 };
    size_t cap = (size_t)N * 80 + 16, w = 8;
    unsigned char *b = malloc(cap);
    REQUIRE(b != NULL);
    w += (size_t)snprintf((char *)b + w, cap - w, "{");
    for (int i = 0; i < N; i++)
        w += (size_t)snprintf((char *)b + w, cap - w,
                              "%s\"l%d.qweight\":{\"dtype\":\"I32\",\"shape\":[0],"
                              "\"data_offsets\":[0,0]}",
                              i ? "," : "", i);
    w += (size_t)snprintf((char *)b + w, cap - w, "}");
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)(w - 8) >> (8 * i));
    nib_st_file *f = NULL;
    nib_qckpt_index *ix = NULL;
    REQUIRE(nib_st_open_memory(b, w, &f) == NIB_OK);
    double t0 = nib_now_s();
    CHECK_OK(nib_qckpt_index_build(f, NULL, &ix));
    double dt = nib_now_s() - t0;
    CHECK(nib_qckpt_index_count(ix) == N);
    CHECK_MSG(dt < 2.0, "index of %d candidate layers took %.2f s", N, dt);
    nib_qckpt_index_free(ix);
    nib_st_close(f);
    free(b);
}
