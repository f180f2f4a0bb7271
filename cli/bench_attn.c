/* bench_attn.c — `nib bench attn`: the attention kernel lab.
 *
 * Sections (each row: median µs per call of a CUDA-graph replay of many calls, KV bytes read,
 * GB/s and % of the device copy bandwidth measured in the same run, FLOPs and TFLOP/s, the
 * bandwidth floor, and the launch plan):
 *   prefix  Gemma prefix self-attention (8 x 1 heads, D 256) at S = 276, 532, 788, 968 and SigLIP (16 x 72,
 *           256 tokens) with 1..3 images. Compute-bound: TFLOP/s against the 790 TFLOP/s bf16
 *           peak. One QKV buffer (in the model it is hot in L2, just written by the QKV GEMM).
 *   cache   the Pi0.5 suffix: H = 10, 50 queries x 8 heads over P + H slots, P = 532, 768, 1024,
 *           BF16 / FP8 / NVFP4 cache. "cold": the call rotates over cache copies totalling more
 *           than 3x L2, so every call reads its KV from DRAM; "hot": one cache, L2-resident (as
 *           the Pi0.5 prefix KV of 18 layers, ~10 MB, is in practice).
 *   decode  1 query x 8 heads over T = 1024 .. 32768 slots, each dtype, cold (rotating caches);
 *           --decode-l2 cold,hot adds the same rows with one L2-resident cache.
 * --variants auto,dec,r4,r8,cl,rk,wg,wg1,wk2 repeats the cache and decode sections with the kernel
 * variant forced (NIB_ATTN_VARIANT; "auto" = the planner's choice), to measure the alternatives in one
 * run; t2 (two token groups per CTA, bf16) repeats the prefix section instead, t4 / t4h / r2t4 (four token
 * groups, head_dim 80) its SigLIP rows; r8 and wg / wg1 / wk2
 * (the wgmma kernel: bf16 caches, no decode rows) repeat the Gemma prefix rows too.
 * KV bytes = what one call must read: element planes + block scales + per-(token, head) scales
 * of the T visible slots. FLOPs = 4 x rows x T x D (Q.K and P.V).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "cli/cli.h"
#include "formats/formats.h"
#include "ops/attention.h"
#include "runtime/device.h"
#include "runtime/timing.h"

#define MAX_COPIES 1024
#define MAX_ROWS 256

typedef struct attn_row {
    char section[8], name[48], dtype[8], l2[8], variant[8];
    int s, p, h, t, images;
    double us, gbps, pct_bw, tflops, pct_peak, floor_us;
    uint64_t kv_bytes;
    double flops;
    char plan[96];
} attn_row;

typedef struct bench_state {
    double copy_gbps;
    double peak_tflops; /* cuBLASLt bf16, measured in the same run */
    int l2_bytes, reps;
    attn_row rows[MAX_ROWS];
    int nrows;
} bench_state;

/* ---- prefix ------------------------------------------------------------------------------ */
typedef struct prefix_ctx {
    nib_attn_prefix_args a;
    void *ws;
} prefix_ctx;
static nib_status prefix_call(void *c, int i, void *stream) {
    (void)i;
    prefix_ctx *x = (prefix_ctx *)c;
    return nib_cuda_attn_prefix(&x->a, x->ws, stream);
}

static void fill_random_bf16(nib_rng *r, uint16_t *h, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) h[i] = nib_f32_to_bf16((float)(scale * nib_rng_normal(r)));
}

static void print_row(const attn_row *r) {
    printf("%-7s %-34s %-5s %-4s %9.2f %10llu %8.0f %6.1f%% %8.2f %6.1f%% %8.2f  %s\n", r->section, r->name, r->dtype,
           r->l2, r->us, (unsigned long long)r->kv_bytes, r->gbps, r->pct_bw, r->tflops, r->pct_peak, r->floor_us,
           r->plan);
}

static nib_status bench_prefix(bench_state *b, const char *name, int n_img, int S, int H, int KV, int D) {
    nib_status st = NIB_OK;
    prefix_ctx c;
    memset(&c, 0, sizeof c);
    const int64_t row = (int64_t)(H + 2 * KV) * D;
    const size_t qkv_n = (size_t)row * S * n_img, o_n = (size_t)H * D * S * n_img;
    uint16_t *h = nib_malloc(qkv_n * 2);
    void *dqkv = NULL, *dout = NULL, *ws = NULL;
    int32_t *dint = NULL;
    uint64_t ws_bytes = 0;
    nib_attn_plan pl;
    nib_lab_timing tm;
    nib_rng r;
    nib_rng_seed(&r, 0xA77E0000u + (uint64_t)S * 7 + (uint64_t)n_img);
    if (!h) return NIB_ERR_OUT_OF_MEMORY;
    fill_random_bf16(&r, h, qkv_n, 1.0 / sqrt((double)D));
    NIB_TRY(nib_dev_malloc(&dqkv, qkv_n * 2, "bench qkv"));
    NIB_TRY(nib_dev_malloc(&dout, o_n * 2, "bench o"));
    NIB_TRY(nib_dev_malloc((void **)&dint, 8, "bench lengths"));
    NIB_TRY(nib_dev_upload(dqkv, h, qkv_n * 2));
    {
        int32_t hv[2] = {S, n_img};
        NIB_TRY(nib_dev_upload(dint, hv, 8));
    }
    c.a.q = dqkv;
    c.a.k = (uint16_t *)dqkv + (int64_t)H * D;
    c.a.v = (uint16_t *)dqkv + (int64_t)(H + KV) * D;
    c.a.o = dout;
    c.a.q_tok = c.a.k_tok = c.a.v_tok = row;
    c.a.q_seq = c.a.k_seq = c.a.v_seq = row * S;
    c.a.o_tok = (int64_t)H * D;
    c.a.o_seq = (int64_t)H * D * S;
    c.a.n_seq = n_img;
    c.a.s_max = S;
    c.a.n_heads = H;
    c.a.n_kv_heads = KV;
    c.a.head_dim = D;
    c.a.s_valid = dint;
    c.a.n_seq_valid = dint + 1;
    NIB_TRY(nib_cuda_attn_prefix_plan(&c.a, &pl));
    ws_bytes = pl.ws_bytes;
    if (ws_bytes) NIB_TRY(nib_dev_malloc(&ws, (size_t)ws_bytes, "bench attention workspace"));
    c.ws = ws;
    NIB_TRY(nib_lab_time_graph(prefix_call, &c, 20, b->reps, &tm));
    if (b->nrows < MAX_ROWS) {
        attn_row *x = &b->rows[b->nrows++];
        memset(x, 0, sizeof *x);
        snprintf(x->section, sizeof x->section, "prefix");
        snprintf(x->name, sizeof x->name, "%s S=%d x%d H=%d KV=%d D=%d", name, S, n_img, H, KV, D);
        snprintf(x->dtype, sizeof x->dtype, "bf16");
        snprintf(x->l2, sizeof x->l2, "hot");
        /* NIB_ATTN_VARIANT forces the kernel, NIB_ATTN_SPLITS (a lab knob of the planner) the
         * split count: recorded as VARIANT or s=N or VARIANT/s=N */
        const char *fs = getenv("NIB_ATTN_SPLITS"), *fv = getenv("NIB_ATTN_VARIANT");
        if (fs && *fs && fv && *fv) snprintf(x->variant, sizeof x->variant, "%.2s/s=%.1s", fv, fs);
        else if (fs && *fs) snprintf(x->variant, sizeof x->variant, "s=%.4s", fs);
        else snprintf(x->variant, sizeof x->variant, "%.7s", fv && *fv ? fv : "auto");
        x->s = S;
        x->images = n_img;
        x->h = H;
        x->t = S;
        x->us = tm.median_us;
        x->kv_bytes = (uint64_t)n_img * S * KV * D * 2 * 2;
        x->gbps = (double)x->kv_bytes / (tm.median_us * 1e3);
        x->pct_bw = 100.0 * x->gbps / b->copy_gbps;
        x->flops = 4.0 * (double)S * S * D * H * n_img;
        x->tflops = x->flops / (tm.median_us * 1e6);
        x->pct_peak = 100.0 * x->tflops / b->peak_tflops;
        x->floor_us = x->flops / (b->peak_tflops * 1e6);
        snprintf(x->plan, sizeof x->plan, "%s, %d splits x %d x %d = %d CTAs", pl.kernel, pl.n_splits, pl.row_blocks,
                 pl.z, pl.ctas);
        print_row(x);
    }
fail:
    nib_free(h);
    nib_dev_free(dqkv, qkv_n * 2);
    nib_dev_free(dout, o_n * 2);
    nib_dev_free(dint, 8);
    nib_dev_free(ws, (size_t)ws_bytes);
    return st;
}

/* ---- cache / decode ---------------------------------------------------------------------- */
typedef struct cache_ctx {
    nib_attn_cache_args a[MAX_COPIES];
    int copies;
    void *ws;
} cache_ctx;
static nib_status cache_call(void *c, int i, void *stream) {
    cache_ctx *x = (cache_ctx *)c;
    return nib_cuda_attn_cache(&x->a[i % x->copies], x->ws, stream);
}

/* One host cache of T slots (N(0,1) K and V quantized by formats/), 1 KV head of D. */
static nib_status host_cache(nib_kv_dtype dt, int T, int D, void **mem, uint64_t *bytes) {
    nib_status st = NIB_OK;
    nib_kv_layer L;
    nib_rng r;
    nib_rng_seed(&r, 0xCAC4E000u + (uint64_t)T);
    float *x = nib_malloc((size_t)D * 4);
    *bytes = nib_kv_layer_bytes(dt, T, 1, D);
    *mem = nib_malloc((size_t)*bytes);
    if (!x || !*mem) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    memset(*mem, 0, (size_t)*bytes);
    NIB_TRY(nib_kv_layer_map(&L, dt, T, 1, D, *mem));
    for (int64_t j = 0; j < T; j++)
        for (int isv = 0; isv < 2; isv++) {
            for (int i = 0; i < D; i++) x[i] = (float)nib_rng_normal(&r);
            void *plane = isv ? L.v : L.k;
            if (dt == NIB_KV_BF16) {
                for (int i = 0; i < D; i++) ((uint16_t *)plane)[j * D + i] = nib_f32_to_bf16(x[i]);
            } else if (dt == NIB_KV_FP8) {
                NIB_TRY(nib_fp8_quantize(x, 1, D, 1, (uint8_t *)plane + j * D, (isv ? L.vs : L.ks) + j));
            } else {
                NIB_TRY(nib_nvfp4_quantize(x, 1, D, (uint8_t *)plane + j * (D / 2), (isv ? L.vb : L.kb) + j * (D / 16),
                                           (isv ? L.vs : L.ks) + j));
            }
        }
fail:
    nib_free(x);
    return st;
}

static uint64_t kv_read_bytes(nib_kv_dtype dt, int T, int D) {
    uint64_t per = dt == NIB_KV_BF16 ? (uint64_t)D * 2 : dt == NIB_KV_FP8 ? (uint64_t)D + 4 : (uint64_t)D / 2 + D / 16 + 4;
    return 2 * per * (uint64_t)T;
}

static nib_status bench_cache(bench_state *b, const char *section, nib_kv_dtype dt, int T, int nq, int cold) {
    nib_status st = NIB_OK;
    const int D = 256, H = 8;
    cache_ctx *c = nib_calloc(1, sizeof *c);
    void *hmem = NULL, *slab = NULL, *dq = NULL, *dout = NULL, *ws = NULL;
    int32_t *dint = NULL;
    uint64_t one = 0, ws_bytes = 0, slab_bytes = 0;
    nib_attn_plan pl;
    nib_lab_timing tm;
    uint16_t *hq = nib_malloc((size_t)nq * H * D * 2);
    nib_rng r;
    nib_rng_seed(&r, 0x9E000000u + (uint64_t)nq);
    if (!c || !hq) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    fill_random_bf16(&r, hq, (size_t)nq * H * D, 1.0 / 16.0);
    NIB_TRY(host_cache(dt, T, D, &hmem, &one));
    one = (one + 255) / 256 * 256;
    c->copies = cold ? (int)((3ull * (uint64_t)b->l2_bytes + one - 1) / one) : 1;
    if (c->copies < 1) c->copies = 1;
    if (c->copies > MAX_COPIES) c->copies = MAX_COPIES;
    slab_bytes = one * (uint64_t)c->copies;
    NIB_TRY(nib_dev_malloc(&slab, (size_t)slab_bytes, "bench kv caches"));
    NIB_TRY(nib_dev_upload(slab, hmem, (size_t)nib_kv_layer_bytes(dt, T, 1, D)));
    for (int i = 1; i < c->copies; i++) NIB_TRY(nib_dev_copy((uint8_t *)slab + one * i, slab, (size_t)one));
    NIB_TRY(nib_dev_malloc(&dq, (size_t)nq * H * D * 2, "bench q"));
    NIB_TRY(nib_dev_malloc(&dout, (size_t)nq * H * D * 2, "bench o"));
    NIB_TRY(nib_dev_malloc((void **)&dint, 4, "bench t_valid"));
    NIB_TRY(nib_dev_upload(dq, hq, (size_t)nq * H * D * 2));
    NIB_TRY(nib_dev_upload(dint, &T, 4));
    for (int i = 0; i < c->copies; i++) {
        nib_attn_cache_args *a = &c->a[i];
        a->q = dq;
        a->o = dout;
        a->q_tok = a->o_tok = (int64_t)H * D;
        a->nq = nq;
        a->n_heads = H;
        NIB_TRY(nib_kv_layer_map(&a->kv, dt, T, 1, D, (uint8_t *)slab + one * i));
        a->t_valid = dint;
    }
    NIB_TRY(nib_cuda_attn_cache_plan(&c->a[0], &pl));
    ws_bytes = pl.ws_bytes;
    if (ws_bytes) NIB_TRY(nib_dev_malloc(&ws, (size_t)ws_bytes, "bench attention workspace"));
    c->ws = ws;
    {
        int calls = c->copies * ((40 + c->copies - 1) / c->copies); /* >= 40 calls, whole rotations */
        NIB_TRY(nib_lab_time_graph(cache_call, c, calls, b->reps, &tm));
    }
    if (b->nrows < MAX_ROWS) {
        attn_row *x = &b->rows[b->nrows++];
        memset(x, 0, sizeof *x);
        snprintf(x->section, sizeof x->section, "%s", section);
        if (nq > 1) snprintf(x->name, sizeof x->name, "P=%d H=%d (T=%d)", T - nq, nq, T);
        else snprintf(x->name, sizeof x->name, "T=%d", T);
        snprintf(x->dtype, sizeof x->dtype, "%s", nib_kv_dtype_name(dt));
        snprintf(x->l2, sizeof x->l2, "%s", cold ? "cold" : "hot");
        snprintf(x->variant, sizeof x->variant, "%s", getenv("NIB_ATTN_VARIANT") ? getenv("NIB_ATTN_VARIANT") : "auto");
        x->p = nq > 1 ? T - nq : 0;
        x->h = nq;
        x->t = T;
        x->us = tm.median_us;
        x->kv_bytes = kv_read_bytes(dt, T, D);
        x->gbps = (double)x->kv_bytes / (tm.median_us * 1e3);
        x->pct_bw = 100.0 * x->gbps / b->copy_gbps;
        x->flops = 4.0 * nq * H * (double)T * D;
        x->tflops = x->flops / (tm.median_us * 1e6);
        x->pct_peak = 100.0 * x->tflops / b->peak_tflops;
        x->floor_us = (double)x->kv_bytes / (b->copy_gbps * 1e3);
        snprintf(x->plan, sizeof x->plan, "%s, %d splits x %d = %d CTAs, %d caches", pl.kernel, pl.n_splits,
                 pl.row_blocks, pl.ctas, c->copies);
        print_row(x);
    }
fail:
    nib_free(hq);
    nib_free(hmem);
    nib_free(c);
    nib_dev_free(slab, (size_t)slab_bytes);
    nib_dev_free(dq, (size_t)nq * H * D * 2);
    nib_dev_free(dout, (size_t)nq * H * D * 2);
    nib_dev_free(dint, 4);
    nib_dev_free(ws, (size_t)ws_bytes);
    return st;
}

/* ---- JSON ------------------------------------------------------------------------------- */
static nib_status write_json(const char *path, const nib_device_info *d, const bench_state *b, int argc, char **argv) {
    FILE *f = fopen(path, "w");
    if (!f) return NIB_ERR(NIB_ERR_IO, "cannot write '%s'", path);
    nib_cli_json_head(f, "attn", "nib bench", argc, argv, d);
    fprintf(f,
            "  \"copy_gbps\": %.1f,\n  \"peak_bf16_tflops\": %.0f,\n  \"timing\": \"median over reps of CUDA-graph "
            "replay time / calls; cold = caches rotated over copies > 3x L2, hot = one cache\",\n  \"rows\": [\n",
            b->copy_gbps, b->peak_tflops);
    for (int i = 0; i < b->nrows; i++) {
        const attn_row *r = &b->rows[i];
        fprintf(f,
                "    {\"section\": \"%s\", \"variant\": \"%s\", \"name\": \"%s\", \"dtype\": \"%s\", \"l2\": \"%s\", \"s\": %d, \"images\": "
                "%d, \"p\": %d, \"h\": %d, \"t\": %d, \"us\": %.3f, \"kv_bytes\": %llu, \"gbps\": %.1f, "
                "\"pct_copy_bw\": %.1f, \"flops\": %.0f, \"tflops\": %.2f, \"pct_peak_bf16\": %.1f, \"floor_us\": "
                "%.3f, \"plan\": ",
                r->section, r->variant, r->name, r->dtype, r->l2, r->s, r->images, r->p, r->h, r->t, r->us,
                (unsigned long long)r->kv_bytes, r->gbps, r->pct_bw, r->flops, r->tflops, r->pct_peak, r->floor_us);
        nib_cli_json_string(f, r->plan);
        fprintf(f, "}%s\n", i + 1 < b->nrows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f)) return NIB_ERR(NIB_ERR_IO, "error writing '%s'", path);
    return NIB_OK;
}

int nib_bench_attn(int argc, char **argv) {
    const char *json = NULL;
    int reps = 15, do_prefix = 1, do_cache = 1, do_decode = 1, dec_cold = 1, dec_hot = 0;
    const char *variants = "auto";
    int Ts[16] = {1024, 4096, 16384, 32768}, nT = 4;
    int kv_on[NIB_KV_COUNT];
    for (int k = 0; k < NIB_KV_COUNT; k++) kv_on[k] = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (nib_cli_is_help(a)) {
            printf("usage: nib bench attn [--sections prefix,cache,decode]\n"
                   "                      [--variants auto,dec,r4,r8,cl,rk,t2,t4,t4h,r2t4,wgs,wgs1,wgs2,wgs4,wg,wg1,wk2]\n"
                   "                      [--reps N] [--t T1,T2,..] [--kv bf16,fp8,nvfp4] [--decode-l2 cold,hot]\n"
                   "                      [--json FILE]\n"
                   "The attention kernel lab: prefix self-attention (Gemma S = 276, 532, 788, 968; SigLIP 1..3 images),\n"
                   "the Pi0.5 suffix over the KV cache (P = 532, 768, 1024 x H = 10, 50 x bf16/fp8/nvfp4, cold\n"
                   "and hot L2) and decoding (T = 1024 .. 32768 x each dtype, cold). Each row: median us per\n"
                   "call (CUDA-graph replay), KV bytes read, GB/s, %% of the copy bandwidth measured in this\n"
                   "run, FLOPs, TFLOP/s (%% of the cuBLASLt bf16 peak measured in this run), the floor (bytes /\n"
                   "copy bw or FLOPs / peak), the plan.\n"
                   "--t sets the decode lengths (default 1024,4096,16384,32768; 1..1048576 each, at most 16);\n"
                   "--kv limits the cache and decode sections to the named cache dtypes.\n"
                   "--decode-l2 cold,hot adds decode rows with one L2-resident cache (default cold only: the\n"
                   "cache rotated over copies > 3x L2, so every call reads it from DRAM).\n"
                   "--variants repeats the cache and decode sections with the kernel variant forced (auto: the\n"
                   "planner's); t2 (two token groups per CTA, bf16 only) repeats the prefix section instead; t4, t4h\n"
                   "and r2t4 (four token groups, head_dim 80, bf16) and wgs, wgs1, wgs2, wgs4 (head_dim 80 on wgmma)\n"
                   "repeat its SigLIP rows;\n"
                   "r8 and wg / wg1 / wk2 (the wgmma kernel: bf16 caches only, no decode rows; wk2 splits each\n"
                   "CTA's keys between two warpgroups) also repeat the Gemma prefix (S = 276, 532, 788, 968).\n");
            return 0;
        } else if (!strcmp(a, "--json") && val) {
            json = val;
            i++;
        } else if (!strcmp(a, "--reps") && val) {
            if (!nib_cli_int_arg("bench attn", a, val, 3, 100000, &reps)) return 2;
            i++;
        } else if (!strcmp(a, "--variants") && val) {
            variants = val;
            i++;
        } else if (!strcmp(a, "--t") && val) {
            nT = 0;
            char tb[256];
            snprintf(tb, sizeof tb, "%s", val);
            for (char *sv = NULL, *t = strtok_r(tb, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
                char *end = NULL;
                long v = strtol(t, &end, 10);
                if (!end || *end || v < 1 || v > (1 << 20) || nT >= 16) {
                    fprintf(stderr, "nib bench attn: --t wants up to 16 lengths in 1..1048576; got '%s'\n", val);
                    return 2;
                }
                Ts[nT++] = (int)v;
            }
            if (!nT) {
                fprintf(stderr, "nib bench attn: --t wants a list of lengths; got '%s'\n", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--kv") && val) {
            int any = 0;
            for (int k = 0; k < NIB_KV_COUNT; k++) {
                kv_on[k] = 0;
                const char *nm = nib_kv_dtype_name((nib_kv_dtype)k);
                for (const char *q = strstr(val, nm); q; q = strstr(q + 1, nm)) {
                    size_t n = strlen(nm);
                    if ((q == val || q[-1] == ',') && (q[n] == 0 || q[n] == ',')) kv_on[k] = 1;
                }
                any |= kv_on[k];
            }
            if (!any) {
                fprintf(stderr, "nib bench attn: --kv wants bf16, fp8 and/or nvfp4; got '%s'\n", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--decode-l2") && val) {
            dec_cold = dec_hot = 0;
            char lb[64];
            snprintf(lb, sizeof lb, "%s", val);
            int bad = 0;
            for (char *sv = NULL, *t = strtok_r(lb, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
                if (!strcmp(t, "cold")) dec_cold = 1;
                else if (!strcmp(t, "hot")) dec_hot = 1;
                else bad = 1;
            }
            if (bad || (!dec_cold && !dec_hot)) {
                fprintf(stderr, "nib bench attn: --decode-l2 wants cold and/or hot; got '%s'\n", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--sections") && val) {
            do_prefix = strstr(val, "prefix") != NULL;
            do_cache = strstr(val, "cache") != NULL;
            do_decode = strstr(val, "decode") != NULL;
            if (!do_prefix && !do_cache && !do_decode) {
                fprintf(stderr, "nib bench attn: --sections wants prefix,cache,decode; got '%s'\n", val);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "nib bench attn: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    nib_device_info d;
    nib_status st = nib_device_require(&d);
    if (st) return nib_cli_fail("bench attn", st);
    bench_state *b = nib_calloc(1, sizeof *b);
    if (!b) return nib_cli_fail("bench attn", NIB_ERR_OUT_OF_MEMORY);
    b->reps = reps;
    b->l2_bytes = d.l2_bytes;
    st = nib_lab_copy_bandwidth((uint64_t)16 * (uint64_t)d.l2_bytes, &b->copy_gbps);
    if (!st) st = nib_lab_peak_tflops(0, 8192, &b->peak_tflops);
    if (st) {
        nib_free(b);
        return nib_cli_fail("bench attn", st);
    }
    printf("device %s (cc %d.%d, %d SMs, L2 %.0f MB); copy bandwidth %.0f GB/s (read+write); cuBLASLt bf16 %.0f TFLOP/s (measured)\n",
           d.name, d.cc_major, d.cc_minor, d.sm_count, d.l2_bytes / 1e6, b->copy_gbps, b->peak_tflops);
    printf("%-7s %-34s %-5s %-4s %9s %10s %8s %7s %8s %7s %8s  %s\n", "section", "shape", "kv", "L2", "us", "KV bytes",
           "GB/s", "%copy", "TFLOP/s", "%peak", "floor us", "plan");
    double t0 = nib_now_s();
    nib_status first = NIB_OK;
#define RUN(expr)                                                                                  \
    do {                                                                                           \
        nib_status s_ = (expr);                                                                    \
        if (s_) {                                                                                  \
            printf("  ERROR %s: %s\n", nib_status_name(s_), nib_last_error());                     \
            if (!first) first = s_;                                                                \
        }                                                                                          \
    } while (0)
    /* the prefix section runs once with the planner's choice, then again for t2 (bf16 only); the
     * Gemma prefix at Pi0.5's 1 / 2 / 3 cameras + 20 text tokens, and openpi's padded 968 */
    static const int gemma_s[4] = {276, 532, 788, 968};
    char vbuf[96];
    snprintf(vbuf, sizeof vbuf, "auto-prefix,%s", variants);
    for (char *save = NULL, *v = strtok_r(vbuf, ",", &save); v; v = strtok_r(NULL, ",", &save)) {
        const int prefix_run = !strcmp(v, "auto-prefix") || !strcmp(v, "t2");
        if (prefix_run) {
            if (!strcmp(v, "t2")) setenv("NIB_ATTN_VARIANT", v, 1);
            if (do_prefix) {
                for (int i = 0; i < 4; i++) RUN(bench_prefix(b, "gemma", 1, gemma_s[i], 8, 1, 256));
                for (int n = 1; n <= 3; n++) RUN(bench_prefix(b, "siglip", n, 256, 16, 16, 72));
            }
            continue;
        }
        if (!strcmp(v, "t4") || !strcmp(v, "t4h") || !strcmp(v, "r2t4") || !strncmp(v, "wgs", 3)) { /* head_dim 80: SigLIP */
            setenv("NIB_ATTN_VARIANT", v, 1);
            if (do_prefix)
                for (int n = 1; n <= 3; n++) RUN(bench_prefix(b, "siglip", n, 256, 16, 16, 72));
            continue;
        }
        if (!strcmp(v, "auto")) unsetenv("NIB_ATTN_VARIANT");
        else if (!strcmp(v, "dec") || !strcmp(v, "r4") || !strcmp(v, "r8") || !strcmp(v, "cl") || !strcmp(v, "rk") ||
                 !strcmp(v, "wg") || !strcmp(v, "wg1") || !strcmp(v, "wk2"))
            setenv("NIB_ATTN_VARIANT", v, 1);
        else {
            printf("  unknown variant '%s' skipped (auto, dec, r4, r8, cl, rk, t2, t4, t4h, r2t4, wgs, wg, wg1, wk2)\n", v);
            continue;
        }
        /* r8 and wg (the mma.sync and the wgmma kernel for many rows) also repeat the Gemma prefix */
        const int wg = !strncmp(v, "wg", 2) || !strcmp(v, "wk2"); /* wg, wg1, wk2: bf16 caches only */
        if (do_prefix && (!strcmp(v, "r8") || wg)) {
            for (int i = 0; i < 4; i++) RUN(bench_prefix(b, "gemma", 1, gemma_s[i], 8, 1, 256));
        }
        if (wg && !kv_on[NIB_KV_BF16]) continue; /* wg reads a bf16 cache only */
        const int cl = !strcmp(v, "cl"); /* the cluster variant takes <= 128 rows: H = 10 only */
        if (do_cache && strcmp(v, "rk")) { /* rk (the decode kernel) takes <= 8 rows: decode only */
            const int Ps[] = {532, 768, 1024}, Hs[] = {10, 50};
            for (int cold = 1; cold >= 0; cold--)
                for (int pi = 0; pi < 3; pi++)
                    for (int hi = 0; hi < 2 - cl; hi++)
                        for (int dt = 0; dt < (wg ? 1 : NIB_KV_COUNT); dt++)
                            if (kv_on[dt]) RUN(bench_cache(b, "cache", (nib_kv_dtype)dt, Ps[pi] + Hs[hi], Hs[hi], cold));
        }
        if (do_decode && !wg) {
            for (int cold = 1; cold >= 0; cold--) {
                if (!(cold ? dec_cold : dec_hot)) continue;
                for (int ti = 0; ti < nT; ti++)
                    for (int dt = 0; dt < NIB_KV_COUNT; dt++)
                        if (kv_on[dt]) RUN(bench_cache(b, "decode", (nib_kv_dtype)dt, Ts[ti], 1, cold));
            }
        }
    }
    unsetenv("NIB_ATTN_VARIANT");
#undef RUN
    st = first;
    if (json) {
        nib_status js = write_json(json, &d, b, argc, argv);
        if (js && !st) st = js;
    }
    printf("%d rows in %.1f s%s%s\n", b->nrows, nib_now_s() - t0, json ? ", written to " : "", json ? json : "");
    nib_free(b);
    if (st) return nib_cli_fail("bench attn", st);
    return 0;
}
