/* cmd_pi05.c — `nib demo`, `nib accuracy pi05` and `nib bench pi05`.
 *
 * demo      the README's main job: a full-size synthetic Pi0.5 (seeded random weights of realistic
 *           scale) through the bf16 and fast presets on the GPU: per-stage breakdown, Hz, and the
 *           accuracy of fast against bf16. Without a GPU: the fp32 reference on the tiny config.
 * accuracy  the same inputs through the fp32 reference (CPU) and GPU presets: cosine and relative
 *           L2 of the prefix K/V of every layer and of the actions.
 * bench     graph-replay latency for {1,2,3} cameras x H in {10,50} x {bf16, fast}, 20 text tokens,
 *           with the per-stage breakdown and each stage's floor (bytes / copy bandwidth, FLOPs /
 *           peak, from the ceilings measured in the same run).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/rng.h"
#include "cli/cli.h"
#include "cli/pi05_cli.h"
#include "models/pi05.h"
#include "runtime/device.h"
#include "runtime/timing.h"

typedef struct demo_in {
    float *img, *noise;
    uint8_t *img8; /* the same images as U8 [cams][224][224][3] (to_u8), or NULL */
    int32_t ids[512];
    nib_pi05_inputs in;
} demo_in;

static nib_status make_inputs(const nib_pi05_config *c, int cams, int ntext, int H, uint64_t seed, demo_in *d) {
    memset(d, 0, sizeof *d);
    if (ntext > 512) ntext = 512;
    nib_rng r;
    nib_rng_seed(&r, seed);
    size_t ie = (size_t)c->v_channels * c->v_image * c->v_image;
    d->img = nib_malloc((size_t)cams * ie * 4 + 4);
    d->noise = nib_malloc((size_t)H * c->action_dim * 4);
    if (!d->img || !d->noise) return NIB_ERR_OUT_OF_MEMORY;
    /* smooth random images in [-1, 1] (not white noise: closer to camera frames) */
    for (int i = 0; i < cams; i++) {
        double fx = 1 + 4 * nib_rng_uniform(&r), fy = 1 + 4 * nib_rng_uniform(&r), ph = 6.28 * nib_rng_uniform(&r);
        for (size_t j = 0; j < ie; j++) {
            size_t ch = j / ((size_t)c->v_image * c->v_image), yx = j % ((size_t)c->v_image * c->v_image);
            double y = (double)(yx / c->v_image) / c->v_image, x = (double)(yx % c->v_image) / c->v_image;
            double v = 0.7 * sin(6.28 * (fx * x + fy * y) + ph + ch) + 0.3 * (2 * nib_rng_uniform(&r) - 1);
            d->img[i * ie + j] = (float)(v > 1 ? 1 : v < -1 ? -1 : v);
        }
    }
    for (int i = 0; i < ntext; i++) d->ids[i] = (int32_t)nib_rng_below(&r, (uint64_t)c->vocab);
    for (int i = 0; i < H * c->action_dim; i++) d->noise[i] = (float)nib_rng_normal(&r);
    d->in = (nib_pi05_inputs){cams, d->img, NULL, NULL, d->ids, ntext, H, d->noise, seed};
    return NIB_OK;
}
/* the images as a camera sends them: U8, channels last, (v + 1) * 127.5 rounded; the call then
 * reads images_u8 (what the model makes of U8 is its own: models/pi05.c) */
static nib_status to_u8(const nib_pi05_config *c, demo_in *d) {
    const size_t hw = (size_t)c->v_image * c->v_image, ie = (size_t)c->v_channels * hw;
    d->img8 = nib_malloc((size_t)d->in.n_cameras * ie + 1);
    if (!d->img8) return NIB_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < d->in.n_cameras; i++)
        for (size_t ch = 0; ch < (size_t)c->v_channels; ch++)
            for (size_t j = 0; j < hw; j++)
                d->img8[i * ie + j * c->v_channels + ch] = (uint8_t)lrint((d->img[i * ie + ch * hw + j] + 1.0) * 127.5);
    d->in.images_f32 = NULL, d->in.images_u8 = d->img8;
    return NIB_OK;
}
static void free_inputs(demo_in *d) {
    nib_free(d->img8);
    nib_free(d->img);
    nib_free(d->noise);
}

typedef struct cmp {
    double cos, rel;
} cmp;
static cmp compare(const float *a, const float *b, size_t n) {
    double d = 0, na = 0, nb = 0, dot = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        na += (double)a[i] * a[i], nb += (double)b[i] * b[i], dot += (double)a[i] * b[i];
    }
    cmp r = {na > 0 && nb > 0 ? dot / sqrt(na * nb) : (na == nb ? 1 : 0), nb > 0 ? sqrt(d / nb) : sqrt(d)};
    return r;
}
/* compare the model's update (actions - noise): the noise dominates the actions' magnitude */
static cmp compare_update(const float *a, const float *b, const float *noise, size_t n) {
    float *x = nib_malloc(n * 4), *y = nib_malloc(n * 4);
    cmp r = {0, 0};
    if (x && y) {
        for (size_t i = 0; i < n; i++) x[i] = a[i] - noise[i], y[i] = b[i] - noise[i];
        r = compare(x, y, n);
    }
    nib_free(x);
    nib_free(y);
    return r;
}

static const char *tmp_ckpt_path(const char *name) {
    static char p[512];
    const char *t = getenv("TMPDIR");
    snprintf(p, sizeof p, "%s/%s", t && *t ? t : "/tmp", name);
    return p;
}

static int cmp_timing_total(const void *a, const void *b) {
    const double x = ((const nib_pi05_timing *)a)->total_ms, y = ((const nib_pi05_timing *)b)->total_ms;
    return x < y ? -1 : x > y;
}

/* ---- the demo's synthetic full-size checkpoint -------------------------------------------- */
/* The synthetic weights always come from this seed: the file is written once and shared by demo,
 * accuracy and bench, so --seed (the inputs' seed) must not depend on which command wrote it. */
#define DEMO_WEIGHT_SEED 1

typedef struct synth_bar {
    double last;
} synth_bar;
/* "writing 2.10 / 6.70 GB (31 %)" on stderr (a terminal), at most every 0.2 s and at the end */
static void synth_bar_draw(void *ctx, uint64_t done, uint64_t total) {
    synth_bar *b = (synth_bar *)ctx;
    const double now = nib_now_s();
    if (done < total && now - b->last < 0.2) return;
    b->last = now;
    fprintf(stderr, "\r  writing %.2f / %.2f GB (%d %%)\033[K", done / 1e9, total / 1e9,
            total ? (int)(100.0 * (double)done / (double)total) : 100);
    fflush(stderr);
}

/* The full-size synthetic checkpoint at $TMPDIR/nib-demo-pi05.safetensors, written if missing
 * (the writer goes through "<path>.tmp" and renames at the end: an interrupted run leaves no
 * truncated file behind), with a progress line on a terminal. */
static nib_status demo_checkpoint(const char **out) {
    const char *p = tmp_ckpt_path("nib-demo-pi05.safetensors");
    struct stat sb;
    if (stat(p, &sb) != 0) {
        nib_pi05_config c;
        nib_pi05_config_full(&c);
        printf("synthesizing a full-size Pi0.5 checkpoint (3.35 B parameters, bf16, 6.7 GB) at %s ...\n", p);
        fflush(stdout);
        const double t0 = nib_now_s();
        synth_bar bar = {0.0};
        const int tty = isatty(STDERR_FILENO);
        nib_status st = nib_pi05_synth_checkpoint_progress(p, &c, DEMO_WEIGHT_SEED, 0, tty ? synth_bar_draw : NULL, &bar);
        if (tty) fprintf(stderr, "\r\033[K");
        if (st) return st;
        printf("  done in %.1f s\n", nib_now_s() - t0);
        fflush(stdout); /* before the loaders' lines on stderr */
    }
    *out = p;
    return NIB_OK;
}

/* ---- demo ---------------------------------------------------------------------------------- */
/* --cameras / --text / --horizon / --seed of demo and accuracy: 1 consumed (with its value), 0 not one of
 * them, -1 a bad value (already reported) */
static int shape_option(const char *cmd, const char *a, const char *v, int *cams, int *ntext, int *H, uint64_t *seed) {
    if (!v) return 0;
    if (!strcmp(a, "--cameras")) return nib_cli_int_arg(cmd, a, v, 0, 8, cams) ? 1 : -1;
    if (!strcmp(a, "--text")) return nib_cli_int_arg(cmd, a, v, 0, 512, ntext) ? 1 : -1;
    if (!strcmp(a, "--horizon")) return nib_cli_int_arg(cmd, a, v, 1, 1024, H) ? 1 : -1;
    if (!strcmp(a, "--seed")) return nib_cli_u64_arg(cmd, a, v, seed) ? 1 : -1;
    return 0;
}

static void print_timing(const char *label, const nib_pi05_timing *t) {
    double steps = 0;
    for (int s = 0; s < t->steps; s++) steps += t->step_ms[s];
    printf("  %-6s vision %7.3f ms | prefix %7.3f ms | %d steps %7.3f ms (%.3f each", label, t->vision_ms, t->prefix_ms,
           t->steps, steps, nib_pi05_step_mean_ms(t));
    if (t->first_step_beside)
        printf("; the first step's first %d layers beside the prefix, %.3f ms after it", t->first_step_layers_beside,
               t->step_ms[0]);
    printf(") | total %7.3f ms = %6.1f Hz\n", t->total_ms, t->total_ms > 0 ? 1000.0 / t->total_ms : 0);
}

int nib_cmd_demo(int argc, char **argv) {
    const char *ckpt = NULL;
    int cams = 2, ntext = 20, H = 10;
    enum { reps = 20 }; /* <= 64 (the arrays below) */
    uint64_t seed = 1;
    int opt;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (nib_cli_is_help(a)) {
            printf("usage: nib demo [--checkpoint MODEL.safetensors] [--cameras N] [--text L] [--horizon H] [--seed S]\n"
                   "Runs Pi0.5 end to end. Without --checkpoint it synthesizes a full-size Pi0.5 with seeded\n"
                   "random weights of realistic scale (written once to $TMPDIR/nib-demo-pi05.safetensors,\n"
                   "6.7 GB, reused by later runs). On a GPU it loads the bf16 and fast presets, runs the same\n"
                   "inputs (N cameras, L random text tokens, horizon H) and prints the per-stage breakdown\n"
                   "(median of 20 graph replays), the rate in Hz, the whole call host to host (inputs copied in,\n"
                   "actions copied out; for fast also with the images as U8 camera frames), and how close fast\n"
                   "is to bf16. Without a GPU it runs the fp32 CPU reference on a tiny config and says so.\n"
                   "--seed S (1) seeds the inputs (images, text ids, noise); the synthetic weights always come\n"
                   "from seed 1, so the cached file serves every seed (and nib accuracy pi05, nib bench pi05).\n");
            return 0;
        } else if (!strcmp(a, "--checkpoint") && v) ckpt = v, i++;
        else if ((opt = shape_option("demo", a, v, &cams, &ntext, &H, &seed)) != 0) {
            if (opt < 0) return 2;
            i++;
        } else {
            fprintf(stderr, "nib demo: unknown or incomplete option '%s' (see nib demo --help)\n", a);
            return 2;
        }
    }
    nib_status st;
    int gpu = nib_device_available();
    if (!gpu) {
        nib_clear_error();
        printf("nib demo: no usable CUDA device, so this runs the fp32 CPU reference backend on a TINY Pi0.5\n"
               "config (SigLIP 96 wide x 2 layers, Gemma 256 wide x 2 layers; the real model needs a GPU).\n");
        nib_pi05_config c;
        nib_pi05_config_tiny(&c);
        const char *path = tmp_ckpt_path("nib-demo-pi05-tiny.safetensors");
        if ((st = nib_pi05_synth_checkpoint(path, &c, DEMO_WEIGHT_SEED))) return nib_cli_fail("demo", st);
        nib_st_file *f;
        nib_pi05 *m;
        /* the tiny config's limits: said, not silent */
        if (H > c.max_horizon || ntext > c.max_text || cams > c.max_cameras) {
            printf("  (the tiny config takes at most %d cameras, %d text tokens and horizon %d: asked %d / %d / %d, running "
                   "%d / %d / %d)\n",
                   c.max_cameras, c.max_text, c.max_horizon, cams, ntext, H, cams < c.max_cameras ? cams : c.max_cameras,
                   ntext < c.max_text ? ntext : c.max_text, H < c.max_horizon ? H : c.max_horizon);
            if (H > c.max_horizon) H = c.max_horizon;
            if (ntext > c.max_text) ntext = c.max_text;
            if (cams > c.max_cameras) cams = c.max_cameras;
        }
        if ((st = nib_cli_pi05_open(path, "ref", NULL, 0, H, &f, &m, 1))) return nib_cli_fail("demo", st);
        demo_in d;
        float *act = nib_malloc((size_t)H * c.action_dim * 4);
        nib_pi05_timing tm;
        st = make_inputs(&c, cams, ntext, H, seed, &d);
        if (!st && !act) st = NIB_ERR_OUT_OF_MEMORY;
        if (!st) st = nib_pi05_run(m, &d.in, act, &tm);
        if (!st) {
            printf("  %d cameras, %d text tokens, horizon %d, %d steps: %.1f ms on the CPU reference\n", cams, ntext, H,
                   tm.steps, tm.total_ms);
            printf("  actions[0][0..5] = %.4f %.4f %.4f %.4f %.4f %.4f\n", act[0], act[1], act[2], act[3], act[4], act[5]);
        }
        free_inputs(&d);
        nib_free(act);
        nib_pi05_free(m);
        nib_st_close(f);
        unlink(path);
        return st ? nib_cli_fail("demo", st) : 0;
    }
    if (!ckpt) {
        if ((st = demo_checkpoint(&ckpt))) return nib_cli_fail("demo", st);
    }
    const char *presets[2] = {"bf16", "fast"};
    float *acts[2] = {NULL, NULL};
    demo_in d;
    memset(&d, 0, sizeof d);
    st = NIB_OK;
    for (int p = 0; p < 2 && !st; p++) {
        nib_st_file *f = NULL;
        nib_pi05 *m = NULL;
        st = nib_cli_pi05_open(ckpt, presets[p], NULL, 0, H, &f, &m, 1);
        if (st) break;
        const nib_pi05_config *c = nib_pi05_cfg(m);
        if (!d.img) st = make_inputs(c, cams, ntext, H, seed, &d);
        acts[p] = nib_malloc((size_t)H * c->action_dim * 4);
        if (!st && !acts[p]) st = NIB_ERR_OUT_OF_MEMORY;
        nib_pi05_timing tm, all[64];
        double wall[64];
        for (int r = 0; r < reps && !st; r++) {
            const double t0 = nib_now_s();
            st = nib_pi05_run(m, &d.in, acts[p], &all[r % 64]);
            wall[r % 64] = 1e3 * (nib_now_s() - t0);
        }
        if (!st) {
            /* median by total */
            for (int i = 0; i < reps; i++)
                for (int j = i + 1; j < reps; j++)
                    if (all[j].total_ms < all[i].total_ms) {
                        nib_pi05_timing x = all[i];
                        all[i] = all[j], all[j] = x;
                    }
            tm = all[reps / 2];
            if (p == 0) printf("Pi0.5, %d cameras, %d text tokens, horizon %d, %d steps (median of %d CUDA-graph replays):\n",
                               cams, ntext, H, tm.steps, reps);
            print_timing(presets[p], &tm);
            nib_sort_doubles(wall + 1, (size_t)reps - 1); /* the first call captures the graph */
            printf("         the whole call, host to host (inputs in, actions out): %.3f ms\n", wall[reps / 2]);
        }
        if (!st && p == 1) { /* the same images as a camera sends them (U8, channels last): less to check and copy */
            demo_in d8 = d;
            d8.img8 = NULL;
            st = to_u8(c, &d8);
            float *a8 = st ? NULL : nib_malloc((size_t)H * c->action_dim * 4);
            if (!st && !a8) st = NIB_ERR_OUT_OF_MEMORY;
            for (int r = 0; r < reps && !st; r++) {
                const double t0 = nib_now_s();
                st = nib_pi05_run(m, &d8.in, a8, NULL);
                wall[r % 64] = 1e3 * (nib_now_s() - t0);
            }
            if (!st) {
                nib_sort_doubles(wall + 1, (size_t)reps - 1); /* the first call may capture */
                printf("         the same with U8 camera frames [V,224,224,3] (a quarter of the bytes): %.3f ms\n",
                       wall[reps / 2]);
            }
            nib_free(a8);
            nib_free(d8.img8);
        }
        nib_pi05_free(m);
        nib_st_close(f);
    }
    if (!st) {
        size_t n = (size_t)H * 32;
        cmp a = compare(acts[1], acts[0], n), u = compare_update(acts[1], acts[0], d.noise, n);
        printf("  fast vs bf16: actions cosine %.6f (rel L2 %.2e); update (actions - noise) cosine %.6f (rel L2 %.2e)\n",
               a.cos, a.rel, u.cos, u.rel);
        printf("  (nib accuracy pi05 compares both with the fp32 reference; nib bench pi05 times every shape)\n");
    }
    nib_free(acts[0]);
    nib_free(acts[1]);
    free_inputs(&d);
    return st ? nib_cli_fail("demo", st) : 0;
}

/* ---- accuracy ------------------------------------------------------------------------------ */
int nib_cmd_accuracy(int argc, char **argv) {
    const char *ckpt = NULL, *presets = "bf16,fast", *json = NULL;
    int cams = 2, ntext = 20, H = 10;
    uint64_t seed = 1;
    int opt;
    if (argc >= 2 && !strcmp(argv[1], "pi05")) argc--, argv++;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (nib_cli_is_help(a)) {
            printf("usage: nib accuracy pi05 [--checkpoint M] [--presets bf16,fast] [--cameras N] [--text L]\n"
                   "                         [--horizon H] [--seed S] [--json FILE]\n"
                   "Runs the same inputs through the fp32 reference backend (CPU) and each GPU preset and\n"
                   "prints, per preset, the cosine and relative L2 against the reference of the prefix K and V\n"
                   "of every layer (valid tokens) and of the actions and the action update (actions - noise).\n"
                   "Without --checkpoint it uses the demo's synthetic full-size checkpoint. A preset may carry\n"
                   "overrides after a colon: fast:kv=fp8. --seed S (1) seeds the inputs (images, text ids, noise);\n"
                   "the synthetic checkpoint's weights always come from seed 1.\n");
            return 0;
        } else if (!strcmp(a, "--checkpoint") && v) ckpt = v, i++;
        else if (!strcmp(a, "--presets") && v) presets = v, i++;
        else if ((opt = shape_option("accuracy", a, v, &cams, &ntext, &H, &seed)) != 0) {
            if (opt < 0) return 2;
            i++;
        } else if (!strcmp(a, "--json") && v) json = v, i++;
        else {
            fprintf(stderr, "nib accuracy: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    nib_status st = NIB_OK;
    { /* every preset named (and its overrides) is valid, and a GPU is here if one needs it: checked before a
       * checkpoint is synthesized (6.7 GB) or the fp32 reference is loaded (tens of seconds) */
        char list[256];
        snprintf(list, sizeof list, "%s", presets);
        int gpu = 0;
        for (char *sv = NULL, *tok = strtok_r(list, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
            char *colon = strchr(tok, ':');
            if (colon) *colon = '\0';
            nib_pi05_precision pp;
            if ((st = nib_pi05_preset(tok, &pp)) || (colon && (st = nib_pi05_precision_override(&pp, colon + 1))))
                return nib_cli_fail("accuracy --presets", st);
            gpu |= pp.backend == NIB_BE_CUDA;
        }
        nib_device_info dev;
        if (gpu && (st = nib_device_require(&dev))) return nib_cli_fail("accuracy", st);
    }
    if (!ckpt) {
        if ((st = demo_checkpoint(&ckpt))) return nib_cli_fail("accuracy", st);
    }
    /* reference first: its actions and prefix K/V */
    nib_st_file *f = NULL;
    nib_pi05 *m = NULL;
    double t0 = nib_now_s();
    if ((st = nib_cli_pi05_open(ckpt, "ref", NULL, 0, H, &f, &m, 1))) return nib_cli_fail("accuracy", st);
    const nib_pi05_config c = *nib_pi05_cfg(m);
    demo_in d;
    st = make_inputs(&c, cams, ntext, H, seed, &d);
    const int S = cams * c.v_tokens + ntext, L = c.layers, hd = c.head_dim;
    size_t kvn = (size_t)S * hd, an = (size_t)H * c.action_dim;
    float *ref_act = nib_malloc(an * 4), *ref_kv = nib_malloc(2 * L * kvn * 4), *act = nib_malloc(an * 4), *kv = nib_malloc(kvn * 4);
    if (!st && (!ref_act || !ref_kv || !act || !kv)) st = NIB_ERR_OUT_OF_MEMORY;
    if (!st) st = nib_pi05_run(m, &d.in, ref_act, NULL);
    for (int l = 0; l < L && !st; l++)
        for (int w = 0; w < 2 && !st; w++) {
            int32_t P;
            st = nib_pi05_prefix_kv(m, l, w, ref_kv + (size_t)(2 * l + w) * kvn, S, &P);
        }
    nib_pi05_free(m);
    nib_st_close(f);
    m = NULL, f = NULL;
    if (!st) printf("reference (fp32, CPU): %.1f s\n", nib_now_s() - t0);
    FILE *jf = NULL;
    if (!st && json) {
        jf = fopen(json, "w");
        if (!jf) st = NIB_ERR(NIB_ERR_IO, "cannot write '%s'", json);
        else {
            char date[64];
            time_t now = time(NULL);
            strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
            const char *commit = getenv("NIB_GIT_COMMIT");
            fprintf(jf, "{\n  \"check\": \"pi05 accuracy vs the fp32 reference\", \"date\": \"%s\", \"git_commit\": \"%s\",\n"
                        "  \"checkpoint\": \"%s\", \"cameras\": %d, \"text\": %d, \"horizon\": %d, \"seed\": %llu,\n"
                        "  \"targets\": {\"bf16_actions_cosine\": 0.9999, \"fast_actions_cosine\": 0.999},\n  \"presets\": [",
                    date, commit && *commit ? commit : "unknown", ckpt, cams, ntext, H, (unsigned long long)seed);
        }
    }
    char list[256];
    snprintf(list, sizeof list, "%s", presets);
    int first = 1;
    for (char *tok = strtok(list, ","); tok && !st; tok = strtok(NULL, ",")) {
        char *colon = strchr(tok, ':');
        const char *over = NULL;
        if (colon) *colon = '\0', over = colon + 1;
        st = nib_cli_pi05_open(ckpt, tok, over, 0, H, &f, &m, 1);
        if (st) break;
        st = nib_pi05_run(m, &d.in, act, NULL);
        double kmin = 1, vmin = 1, kmax_rel = 0, vmax_rel = 0, lcos[2][64];
        for (int l = 0; l < L && !st; l++)
            for (int w = 0; w < 2 && !st; w++) {
                int32_t P;
                st = nib_pi05_prefix_kv(m, l, w, kv, S, &P);
                cmp r = compare(kv, ref_kv + (size_t)(2 * l + w) * kvn, kvn);
                if (l < 64) lcos[w][l] = r.cos;
                if (w == 0) kmin = fmin(kmin, r.cos), kmax_rel = fmax(kmax_rel, r.rel);
                else vmin = fmin(vmin, r.cos), vmax_rel = fmax(vmax_rel, r.rel);
                if (!st && (l == 0 || l == L - 1 || l == L / 2))
                    printf("  %-5s layer %2d %s: cosine %.6f rel L2 %.2e\n", tok, l, w ? "V" : "K", r.cos, r.rel);
            }
        if (!st) {
            cmp a = compare(act, ref_act, an), u = compare_update(act, ref_act, d.noise, an);
            printf("  %-5s (%s): prefix K min cosine %.6f (max rel %.2e), V min cosine %.6f (max rel %.2e)\n", tok,
                   over ? over : "preset", kmin, kmax_rel, vmin, vmax_rel);
            printf("  %-5s actions cosine %.7f rel L2 %.2e | update cosine %.6f rel L2 %.2e\n", tok, a.cos, a.rel, u.cos, u.rel);
            if (jf) {
                fprintf(jf, "%s\n    {\"preset\": \"%s\", \"overrides\": \"%s\", \"actions_cosine\": %.8f, \"actions_rel_l2\": %.3e, "
                            "\"update_cosine\": %.8f, \"update_rel_l2\": %.3e, \"prefix_k_min_cosine\": %.8f, \"prefix_v_min_cosine\": %.8f",
                        first ? "" : ",", tok, over ? over : "", a.cos, a.rel, u.cos, u.rel, kmin, vmin);
                for (int w = 0; w < 2; w++) {
                    fprintf(jf, ",\n     \"prefix_%s_cosine_per_layer\": [", w ? "v" : "k");
                    for (int l = 0; l < L && l < 64; l++) fprintf(jf, "%s%.6f", l ? ", " : "", lcos[w][l]);
                    fprintf(jf, "]");
                }
                fprintf(jf, "}");
            }
            first = 0;
        }
        nib_pi05_free(m);
        nib_st_close(f);
        m = NULL, f = NULL;
    }
    if (jf) {
        fprintf(jf, "\n  ]\n}\n");
        fclose(jf);
    }
    nib_free(ref_act), nib_free(ref_kv), nib_free(act), nib_free(kv);
    free_inputs(&d);
    return st ? nib_cli_fail("accuracy", st) : 0;
}

/* ---- bench --------------------------------------------------------------------------------- */
int nib_bench_pi05(int argc, char **argv) {
    const char *ckpt = NULL, *json = NULL, *only_preset = NULL, *over = NULL;
    int reps = 100, ntext = 20, only_cams = 0, only_h = 0, u8 = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (nib_cli_is_help(a)) {
            printf("usage: nib bench pi05 [--checkpoint M] [--reps N] [--text L] [--json FILE]\n"
                   "                      [--preset bf16|fast] [--precision SPEC] [--cams 1|2|3] [--horizon H]\n"
                   "                      [--images f32|u8]\n"
                   "Graph-replay latency of one Pi0.5 call for {1,2,3} cameras x H in {10,50} x {bf16, fast},\n"
                   "L text tokens (20): median of N (100, at least 5) calls after warm-up, timed with events inside the\n"
                   "graph, with the per-stage breakdown and each stage's floor (weight bytes / measured copy\n"
                   "bandwidth and FLOPs / measured cuBLASLt peak, whichever is larger). --preset and --cams keep\n"
                   "only the matching rows; --horizon H times that horizon alone (1..1024) instead of the\n"
                   "table's 10 and 50. --precision applies per-component overrides to\n"
                   "every preset timed, e.g. --preset fast --precision vision=bf16 (components vision, prefix,\n"
                   "expert: bf16|fp8|nvfp4|mxfp4|int4; kv: bf16|fp8|nvfp4); the floors follow the result.\n"
                   "The action expert runs op by op (NIB_FUSED_STEP=1 at load: the persistent expert kernel at\n"
                   "fast H <= 16). The first flow step runs beside the prefix, op by op on a second stream,\n"
                   "each layer after the prefix layer whose K/V it reads (every preset and H; NIB_OVERLAP=0\n"
                   "turns it off; with the persistent kernel NIB_OVERLAP_FIRST_OPS=0 puts the kernel's first\n"
                   "layers there instead): 'prefix' includes what that costs the prefix and 'step' is the mean\n"
                   "of the other steps; the JSON has first_step_ms, the part of the first step after the prefix.\n"
                   "--images: the calls' images as F32 [V,3,224,224] in [-1, 1] (the default) or as U8\n"
                   "[V,224,224,3], a quarter of the bytes to check, pack and copy ('wall', 'in-host', 'in-copy').\n"
                   "Each row is followed by its tail over the N calls: the 90th and 99th percentiles (nearest rank) and\n"
                   "the maximum of the graph time and of the host-to-host time (the JSON's *_p90_ms, *_p99_ms, *_max_ms).\n");
            return 0;
        } else if (!strcmp(a, "--checkpoint") && v) ckpt = v, i++;
        else if (!strcmp(a, "--reps") && v) {
            if (!nib_cli_int_arg("bench pi05", a, v, 5, 100000, &reps)) return 2;
            i++;
        } else if (!strcmp(a, "--text") && v) {
            if (!nib_cli_int_arg("bench pi05", a, v, 0, 512, &ntext)) return 2;
            i++;
        }
        else if (!strcmp(a, "--json") && v) json = v, i++;
        else if (!strcmp(a, "--images") && v) {
            if (strcmp(v, "f32") && strcmp(v, "u8")) {
                fprintf(stderr, "nib bench pi05: --images is f32 or u8, not '%s'\n", v);
                return 2;
            }
            u8 = !strcmp(v, "u8"), i++;
        } else if (!strcmp(a, "--preset") && v && (!strcmp(v, "bf16") || !strcmp(v, "fast"))) only_preset = v, i++;
        else if (!strcmp(a, "--precision") && v) over = v, i++;
        else if (!strcmp(a, "--cams") && v) {
            if (!nib_cli_int_arg("bench pi05", a, v, 1, 3, &only_cams)) return 2;
            i++;
        } else if (!strcmp(a, "--horizon") && v) {
            if (!nib_cli_int_arg("bench pi05", a, v, 1, 1024, &only_h)) return 2;
            i++;
        }
        else {
            fprintf(stderr, "nib bench pi05: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    nib_status st = NIB_OK;
    if (over) { /* a bad spec fails here, before any checkpoint is synthesized or loaded */
        nib_pi05_precision pp;
        if ((st = nib_pi05_preset("bf16", &pp)) || (st = nib_pi05_precision_override(&pp, over)))
            return nib_cli_fail("bench pi05 --precision", st);
        if (pp.backend == NIB_BE_REF)
            return nib_cli_fail("bench pi05 --precision",
                                NIB_ERR(NIB_ERR_INVALID_ARG, "backend=ref is not timed: the bench runs GPU presets"));
    }
    nib_device_info dev;
    st = nib_device_require(&dev);
    if (st) return nib_cli_fail("bench pi05", st);
    if (!ckpt) {
        if ((st = demo_checkpoint(&ckpt))) return nib_cli_fail("bench pi05", st);
    }
    double bw = 0, pk_bf16 = 0, pk_fp8 = 0;
    if (!st) st = nib_lab_copy_bandwidth((uint64_t)16 * dev.l2_bytes, &bw);
    if (!st) st = nib_lab_peak_tflops(0, 8192, &pk_bf16);
    if (!st) st = nib_lab_peak_tflops(1, 8192, &pk_fp8);
    if (st) return nib_cli_fail("bench pi05", st);
    printf("%s: copy %.0f GB/s, cuBLASLt bf16 %.0f / fp8 %.0f TFLOP/s; images %s\n", dev.name, bw, pk_bf16, pk_fp8,
           u8 ? "U8 [V,224,224,3]" : "F32 [V,3,224,224]");
    printf("%-5s %4s %3s %9s %9s %9s %9s %9s %7s %7s | floors: %8s %8s %8s %9s\n", "preset", "cams", "H", "total", "vision",
           "prefix", "step", "wall", "in-host", "in-copy", "vision", "prefix", "step", "total");
    FILE *jf = NULL;
    if (json) {
        jf = fopen(json, "w");
        if (!jf) return nib_cli_fail("bench pi05", NIB_ERR(NIB_ERR_IO, "cannot write '%s'", json));
        nib_cli_json_head(jf, "pi05", "nib bench", argc, argv, &dev);
        fprintf(jf, "  \"copy_gbps\": %.1f, \"bf16_tflops\": %.1f, \"fp8_tflops\": %.1f,\n"
                    "  \"timing\": \"median over reps of the in-graph event time of one call; wall = host time per call incl. upload/download; "
                    "input_host_ms = the host's input checks and packing, input_copy_ms = the device time of the input copy (both medians, before the graph); "
                    "*_p90_ms / *_p99_ms / *_max_ms: nearest-rank quantiles and the maximum over the reps of the graph time (total) and of wall\",\n  \"rows\": [",
                bw, pk_bf16, pk_fp8);
    }
    const char *presets[2] = {"bf16", "fast"};
    int first = 1;
    for (int p = 0; p < 2 && !st; p++) {
        if (only_preset && strcmp(only_preset, presets[p])) continue;
        nib_st_file *f = NULL;
        nib_pi05 *m = NULL;
        /* buffers for the largest horizon timed (the table's 50, or --horizon's H) */
        st = nib_cli_pi05_open(ckpt, presets[p], over, 0, only_h > 50 ? only_h : 50, &f, &m, 1);
        if (st) break;
        const nib_pi05_config *c = nib_pi05_cfg(m);
        const nib_pi05_precision *pr = nib_pi05_prec(m);
        char label[64], pstr[128];
        snprintf(label, sizeof label, "%s%s", presets[p], over ? "+" : "");
        nib_pi05_precision_str(pr, pstr, sizeof pstr);
        /* which paths run (decided at load): the persistent expert kernel or per-op, and why */
        printf("  %s (%s): expert %s; prefix %s\n", label, pstr, nib_pi05_expert_path(m), nib_pi05_prefix_path(m));
        for (int cams = 1; cams <= 3 && !st; cams++)
            for (int hi = 0; hi < (only_h ? 1 : 2) && !st; hi++) {
                const int H = only_h ? only_h : hi ? 50 : 10; /* the table's rows, or --horizon's H alone */
                if (only_cams && cams != only_cams) continue;
                demo_in d;
                st = make_inputs(c, cams, ntext, H, 7, &d);
                if (!st && u8) st = to_u8(c, &d);
                float *act = nib_malloc((size_t)H * c->action_dim * 4);
                nib_pi05_timing *tms = nib_calloc((size_t)reps, sizeof *tms);
                double *wall = nib_calloc((size_t)reps * 3, sizeof *wall), *in_host = wall + reps, *in_copy = wall + 2 * reps;
                if (!st && (!act || !tms || !wall)) st = NIB_ERR_OUT_OF_MEMORY;
                for (int w = 0; w < 3 && !st; w++) st = nib_pi05_run(m, &d.in, act, NULL); /* capture + warm-up */
                for (int r = 0; r < reps && !st; r++) {
                    double t0 = nib_now_s();
                    st = nib_pi05_run(m, &d.in, act, &tms[r]);
                    wall[r] = 1e3 * (nib_now_s() - t0);
                    in_host[r] = tms[r].input_host_ms, in_copy[r] = tms[r].input_copy_ms;
                }
                if (!st) {
                    nib_sort_doubles(wall, (size_t)reps);
                    nib_sort_doubles(in_host, (size_t)reps);
                    nib_sort_doubles(in_copy, (size_t)reps);
                    qsort(tms, (size_t)reps, sizeof *tms, cmp_timing_total);
                    nib_pi05_timing t = tms[reps / 2];
                    /* the tail: what a control loop sees in its worst ticks (nearest-rank quantiles) */
                    double *gt = in_copy; /* in_copy's median is taken: reuse its storage for the graph times */
                    const double in_copy_med = in_copy[reps / 2];
                    for (int r = 0; r < reps; r++) gt[r] = tms[r].total_ms;
                    const double g90 = nib_quantile_sorted(gt, (size_t)reps, 0.90), g99 = nib_quantile_sorted(gt, (size_t)reps, 0.99),
                                 gmax = gt[reps - 1], w90 = nib_quantile_sorted(wall, (size_t)reps, 0.90),
                                 w99 = nib_quantile_sorted(wall, (size_t)reps, 0.99), wmax = wall[reps - 1];
                    nib_pi05_cost k;
                    nib_pi05_cost_of(m, cams, ntext, H, &k);
                    /* FP8 components run W8A8 on the FP8 tensor cores; the others compute in bf16 */
                    int vf8 = pr->vision == NIB_WFMT_FP8, pf8 = pr->prefix == NIB_WFMT_FP8;
                    double fv = fmax(k.vision_bytes / (bw * 1e6), k.vision_flops / ((vf8 ? pk_fp8 : pk_bf16) * 1e9));
                    double fp = fmax(k.prefix_bytes / (bw * 1e6), k.prefix_flops / ((pf8 ? pk_fp8 : pk_bf16) * 1e9));
                    double fs = fmax(k.step_bytes / (bw * 1e6), k.step_flops / (pk_bf16 * 1e9));
                    double ft = fv + fp + c->steps * fs;
                    printf("%-5s %4d %3d %7.3fms %7.3fms %7.3fms %7.3fms %7.3fms %5.3fms %5.3fms | %6.3fms %6.3fms %6.3fms %7.3fms\n",
                           label, cams, H, t.total_ms, t.vision_ms, t.prefix_ms, nib_pi05_step_mean_ms(&t), wall[reps / 2],
                           in_host[reps / 2], in_copy_med, fv, fp, fs, ft);
                    printf("%-5s %8s tail of %d calls: graph p90 %.3f p99 %.3f max %.3f ms; host to host p90 %.3f p99 %.3f max %.3f ms\n",
                           "", "", reps, g90, g99, gmax, w90, w99, wmax);
                    if (jf)
                        fprintf(jf, "%s\n    {\"preset\": \"%s\", \"overrides\": \"%s\", \"precision\": \"%s\", \"cameras\": %d, \"horizon\": %d, \"text\": %d, \"images\": \"%s\", \"total_ms\": %.4f, "
                                    "\"vision_ms\": %.4f, \"prefix_ms\": %.4f, \"step_ms\": %.4f, \"wall_ms\": %.4f, \"input_host_ms\": %.4f, \"input_copy_ms\": %.4f, "
                                    "\"total_p90_ms\": %.4f, \"total_p99_ms\": %.4f, \"total_max_ms\": %.4f, \"wall_p90_ms\": %.4f, \"wall_p99_ms\": %.4f, \"wall_max_ms\": %.4f, "
                                    "\"floor_vision_ms\": %.4f, \"floor_prefix_ms\": %.4f, \"floor_step_ms\": %.4f, \"floor_total_ms\": %.4f, "
                                    "\"expert_path\": ",
                                first ? "" : ",", presets[p], over ? over : "", pstr, cams, H, ntext, u8 ? "u8" : "f32", t.total_ms, t.vision_ms, t.prefix_ms,
                                nib_pi05_step_mean_ms(&t), wall[reps / 2], in_host[reps / 2], in_copy_med, g90, g99, gmax, w90, w99, wmax, fv, fp, fs,
                                ft);
                    if (jf) {
                        nib_cli_json_string(jf, nib_pi05_expert_path(m));
                        fprintf(jf,
                                ", \"first_step_beside_prefix\": %s, \"first_step_layers_beside\": %d, \"first_step_ms\": "
                                "%.4f, \"prefix_path\": ",
                                t.first_step_beside ? "true" : "false", t.first_step_layers_beside,
                                t.steps ? t.step_ms[0] : 0.0);
                        nib_cli_json_string(jf, nib_pi05_prefix_path(m));
                        fprintf(jf, "}");
                    }
                    first = 0;
                }
                nib_free(act), nib_free(tms), nib_free(wall);
                free_inputs(&d);
            }
        nib_pi05_free(m);
        nib_st_close(f);
    }
    if (jf) {
        fprintf(jf, "\n  ]\n}\n");
        fclose(jf);
    }
    return st ? nib_cli_fail("bench pi05", st) : 0;
}
