/* cmd_run.c — `nib run pi05 --checkpoint M --inputs IN --out OUT [--preset fast] [--steps N]`.
 *
 * Inputs (safetensors): images F32 [V,3,S,S] in [-1,1] (openpi PyTorch layout) or U8 [V,S,S,3];
 * optional image_mask [V] (U8/BOOL/I32/I64: nonzero = valid); text_ids I64/I32 [L]; optional
 * noise F32 [1,H,A] or [H,A] (else seeded N(0,1), --seed). Output: actions F32 [1,H,A]. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/pi05_cli.h"
#include "formats/formats.h"
#include "io/safetensors.h"
#include "models/pi05.h"

nib_status nib_cli_pi05_inputs_from_file(const nib_st_file *f, const nib_pi05_config *c, int32_t horizon,
                                         nib_cli_inputs *out) {
    memset(out, 0, sizeof *out);
    const nib_st_tensor *img = nib_st_find(f, "images"), *mask = nib_st_find(f, "image_mask");
    const nib_st_tensor *ids = nib_st_find(f, "text_ids"), *noise = nib_st_find(f, "noise");
    nib_pi05_inputs *in = &out->in;
    if (!ids) return NIB_ERR(NIB_ERR_NOT_FOUND, "inputs: tensor 'text_ids' (I64 or I32 [L]) is missing");
    if (ids->ndim != 1 || (ids->dtype != NIB_DTYPE_I64 && ids->dtype != NIB_DTYPE_I32))
        return NIB_ERR(NIB_ERR_SHAPE, "inputs: 'text_ids' must be I64 or I32 [L], got %s with %d dims", nib_dtype_name(ids->dtype),
                       ids->ndim);
    out->ids = nib_malloc((size_t)ids->numel * 4 + 4);
    if (!out->ids) return NIB_ERR_OUT_OF_MEMORY;
    for (uint64_t i = 0; i < ids->numel; i++) {
        int64_t v;
        if (ids->dtype == NIB_DTYPE_I64) memcpy(&v, (const uint8_t *)ids->data + 8 * i, 8);
        else {
            int32_t w;
            memcpy(&w, (const uint8_t *)ids->data + 4 * i, 4);
            v = w;
        }
        if (v < 0 || v >= c->vocab)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "inputs: text_ids[%llu] = %lld outside the vocabulary of %lld",
                           (unsigned long long)i, (long long)v, (long long)c->vocab);
        out->ids[i] = (int32_t)v;
    }
    in->text_ids = out->ids;
    in->n_text = (int32_t)ids->numel;
    if (img) {
        const int S = c->v_image;
        if (img->dtype == NIB_DTYPE_F32 && img->ndim == 4 && img->shape[1] == c->v_channels && img->shape[2] == S &&
            img->shape[3] == S) {
            out->imgf = nib_malloc((size_t)img->nbytes);
            if (!out->imgf) return NIB_ERR_OUT_OF_MEMORY;
            memcpy(out->imgf, img->data, img->nbytes); /* aligned copy of the mapping */
            in->images_f32 = out->imgf;
        } else if (img->dtype == NIB_DTYPE_U8 && img->ndim == 4 && img->shape[1] == S && img->shape[2] == S &&
                   img->shape[3] == c->v_channels) {
            in->images_u8 = img->data;
        } else {
            return NIB_ERR(NIB_ERR_SHAPE, "inputs: 'images' must be F32 [V,%d,%d,%d] or U8 [V,%d,%d,%d]", c->v_channels, S, S,
                           S, S, c->v_channels);
        }
        in->n_cameras = (int32_t)img->shape[0];
    }
    if (mask) {
        if (mask->ndim != 1 || (int64_t)mask->numel != in->n_cameras)
            return NIB_ERR(NIB_ERR_SHAPE, "inputs: 'image_mask' must be [%d] (one flag per camera)", in->n_cameras);
        out->mask = nib_malloc((size_t)in->n_cameras + 1);
        if (!out->mask) return NIB_ERR_OUT_OF_MEMORY;
        size_t es = nib_dtype_size(mask->dtype);
        if (mask->dtype != NIB_DTYPE_U8 && mask->dtype != NIB_DTYPE_BOOL && mask->dtype != NIB_DTYPE_I32 &&
            mask->dtype != NIB_DTYPE_I64)
            return NIB_ERR(NIB_ERR_SHAPE, "inputs: 'image_mask' dtype %s (U8, BOOL, I32 or I64)", nib_dtype_name(mask->dtype));
        for (int i = 0; i < in->n_cameras; i++) {
            const uint8_t *p = (const uint8_t *)mask->data + es * i;
            int nz = 0;
            for (size_t b = 0; b < es; b++) nz |= p[b] != 0;
            out->mask[i] = (uint8_t)nz;
        }
        in->image_mask = out->mask;
    }
    in->horizon = horizon;
    if (noise) {
        int ok = noise->dtype == NIB_DTYPE_F32 && (noise->ndim == 2 || (noise->ndim == 3 && noise->shape[0] == 1)) &&
                 noise->shape[noise->ndim - 1] == c->action_dim && noise->numel % (uint64_t)c->action_dim == 0;
        if (!ok) return NIB_ERR(NIB_ERR_SHAPE, "inputs: 'noise' must be F32 [1,H,%d] or [H,%d]", c->action_dim, c->action_dim);
        in->horizon = (int32_t)(noise->numel / (uint64_t)c->action_dim);
        if (horizon > 0 && horizon != in->horizon)
            return NIB_ERR(NIB_ERR_SHAPE, "inputs: noise has horizon %d but --horizon %d was given", in->horizon, horizon);
        out->noise = nib_malloc((size_t)noise->nbytes);
        if (!out->noise) return NIB_ERR_OUT_OF_MEMORY;
        memcpy(out->noise, noise->data, noise->nbytes);
        in->noise = out->noise;
    }
    if (in->horizon <= 0) in->horizon = 10;
    return NIB_OK;
}

void nib_cli_inputs_free(nib_cli_inputs *x) {
    nib_free(x->ids);
    nib_free(x->imgf);
    nib_free(x->mask);
    nib_free(x->noise);
    memset(x, 0, sizeof *x);
}

nib_status nib_cli_pi05_open(const char *ckpt, const char *preset, const char *overrides, int steps, int max_horizon,
                             nib_st_file **f, nib_pi05 **m, int verbose) {
    double t0 = nib_now_s();
    /* on a terminal, say what the next seconds go to (a bf16 checkpoint is quantized at load for
     * the low-bit presets: ~20 s at full size); the "loaded" line replaces it */
    const int tty = verbose && isatty(STDERR_FILENO);
    if (tty) {
        fprintf(stderr, "nib: loading %s (preset %s%s%s) ...", ckpt, preset, overrides ? ", " : "", overrides ? overrides : "");
        fflush(stderr);
    }
    nib_status st = nib_pi05_open_file(ckpt, preset, overrides, steps, max_horizon, f, m);
    if (tty) fprintf(stderr, "\r\033[K");
    if (!st && verbose) {
        char buf[128], pq[64] = "";
        const int q = nib_pi05_prequantized(*m);
        if (q)
            snprintf(pq, sizeof pq, "; pre-quantized in the file:%s%s%s", q & 1 ? " vision" : "", q & 2 ? " prefix" : "",
                     q & 4 ? " expert" : "");
        fprintf(stderr, "nib: loaded %s (%s%s) in %.2f s\n", ckpt, nib_pi05_precision_str(nib_pi05_prec(*m), buf, sizeof buf),
                pq, nib_now_s() - t0);
    }
    return st;
}

int nib_cmd_run(int argc, char **argv) {
    const char *model = NULL, *ckpt = NULL, *inputs = NULL, *outp = NULL, *preset = "fast", *over = NULL;
    int steps = 0, horizon = 0, timing = 0, check_numerics = 0;
    uint64_t seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (nib_cli_is_help(a)) {
            printf("usage: nib run pi05 --checkpoint MODEL.safetensors --inputs IN.safetensors --out OUT.safetensors\n"
                   "                   [--preset fast|bf16|ref] [--precision vision=F,prefix=F,expert=F,kv=D]\n"
                   "                   [--steps N] [--horizon H] [--seed S] [--timing] [--check-numerics]\n"
                   "Runs one Pi0.5 policy call. MODEL is an openpi-converted checkpoint (key names with or\n"
                   "without a 'model.' prefix, bf16/f16/f32). IN holds images F32 [V,3,224,224] in [-1,1] or\n"
                   "U8 [V,224,224,3], optional image_mask [V], text_ids I64/I32 [L] (already tokenized) and\n"
                   "optional noise F32 [1,H,32] (else N(0,1) from --seed). OUT gets actions F32 [1,H,32].\n"
                   "Presets: fast = FP8 vision and prefix, NVFP4 action expert, BF16 KV (GPU); bf16 (GPU);\n"
                   "ref = the fp32 CPU reference. F is one of bf16, fp8, nvfp4, mxfp4, int4; D is bf16, fp8,\n"
                   "nvfp4. --timing prints the per-stage breakdown of the call and the time from opening\n"
                   "the file to the first call done. A checkpoint written by nib quantize (or ModelOpt NVFP4 /\n"
                   "FP8, GPTQ / AWQ INT4) loads without requantizing: a pre-quantized component runs in\n"
                   "its stored format, whatever the preset says.\n"
                   "--check-numerics runs the call eagerly (no CUDA graph; slower) and scans every stage's\n"
                   "output for NaN/Inf: each vision layer, the image tokens, each prefix layer, and per flow\n"
                   "step each expert layer, the velocity and x_t. The first non-finite value fails the run\n"
                   "(exit 1, status NIB_ERR_NUMERICS) with the stage, the tensor and the element named;\n"
                   "without one the actions are bitwise those of a normal run.\n");
            return 0;
        } else if (!model && a[0] != '-') {
            model = a;
        } else if (!strcmp(a, "--checkpoint") && v) ckpt = v, i++;
        else if (!strcmp(a, "--inputs") && v) inputs = v, i++;
        else if (!strcmp(a, "--out") && v) outp = v, i++;
        else if (!strcmp(a, "--preset") && v) preset = v, i++;
        else if (!strcmp(a, "--precision") && v) over = v, i++;
        else if (!strcmp(a, "--steps") && v) {
            if (!nib_cli_int_arg("run", a, v, 1, 64, &steps)) return 2;
            i++;
        } else if (!strcmp(a, "--horizon") && v) {
            if (!nib_cli_int_arg("run", a, v, 1, 1024, &horizon)) return 2;
            i++;
        } else if (!strcmp(a, "--seed") && v) {
            if (!nib_cli_u64_arg("run", a, v, &seed)) return 2;
            i++;
        } else if (!strcmp(a, "--timing")) timing = 1;
        else if (!strcmp(a, "--check-numerics")) check_numerics = 1;
        else {
            fprintf(stderr, "nib run: unknown or incomplete option '%s' (see nib run --help)\n", a);
            return 2;
        }
    }
    if (!model || strcmp(model, "pi05") || !ckpt || !inputs || !outp) {
        fprintf(stderr, "nib run: usage: nib run pi05 --checkpoint M --inputs IN --out OUT (see --help)\n");
        return 2;
    }
    if (steps < 0 || steps > 64 || horizon < 0 || horizon > 1024) {
        fprintf(stderr, "nib run: --steps must be 1..64 and --horizon 1..1024\n");
        return 2;
    }
    nib_st_file *f = NULL, *fi = NULL;
    nib_pi05 *m = NULL;
    nib_cli_inputs ci;
    memset(&ci, 0, sizeof ci);
    float *act = NULL;
    nib_status st = nib_st_open(inputs, &fi);
    if (st) return nib_cli_fail("run", st);
    /* the model is planned for the call's horizon (noise may set it) */
    const nib_st_tensor *nz = nib_st_find(fi, "noise");
    int plan_h = horizon > 0 ? horizon : (nz && nz->ndim >= 2 ? (int)nz->shape[nz->ndim - 2] : 10);
    const double t_start = nib_now_s();
    st = nib_cli_pi05_open(ckpt, preset, over, steps, plan_h, &f, &m, 1);
    const double t_loaded = nib_now_s();
    double t_ready = t_loaded;
    if (!st) st = nib_cli_pi05_inputs_from_file(fi, nib_pi05_cfg(m), horizon, &ci);
    if (!st && check_numerics) nib_pi05_set_check_numerics(m, 1);
    if (!st) {
        ci.in.seed = seed;
        const nib_pi05_config *c = nib_pi05_cfg(m);
        act = nib_malloc((size_t)ci.in.horizon * c->action_dim * 4);
        if (!act) st = NIB_ERR_OUT_OF_MEMORY;
        nib_pi05_timing tm;
        if (!st) st = nib_pi05_run(m, &ci.in, act, &tm);
        t_ready = nib_now_s();
        if (!st) {
            nib_st_save_tensor t = {"actions", NIB_DTYPE_F32, 3, {1, ci.in.horizon, c->action_dim}, act};
            const char *meta[4] = {"producer", "nib run pi05", "preset", preset};
            st = nib_st_save(outp, 1, &t, 2, meta);
        }
        if (!st && timing) {
            if (tm.vision_ms == 0 && tm.prefix_ms == 0) {
                printf("total %.3f ms (host time; %s has no per-stage breakdown)\n", tm.total_ms,
                       check_numerics ? "an eager check-numerics call" : "the reference backend");
            } else {
                printf("vision %.3f ms, prefix %.3f ms, steps", tm.vision_ms, tm.prefix_ms);
                for (int s = 0; s < tm.steps; s++) printf(" %.3f", tm.step_ms[s]);
                if (tm.first_step_beside)
                    printf(" ms (the first step's first %d layers ran beside the prefix: its time is what followed the "
                           "prefix), total %.3f ms\n",
                           tm.first_step_layers_beside, tm.total_ms);
                else
                    printf(" ms, total %.3f ms\n", tm.total_ms);
            }
            printf("file to first call done: %.2f s (open + load %.2f s, first call incl. graph capture %.2f s)\n",
                   t_ready - t_start, t_loaded - t_start, t_ready - t_loaded);
        }
        if (!st) printf("wrote %s: actions [1, %d, %d]\n", outp, ci.in.horizon, c->action_dim);
    }
    nib_free(act);
    nib_cli_inputs_free(&ci);
    nib_pi05_free(m);
    nib_st_close(f);
    nib_st_close(fi);
    return st ? nib_cli_fail("run", st) : 0;
}
