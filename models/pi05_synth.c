/* pi05_synth.c — a synthetic Pi0.5 checkpoint with seeded random weights of realistic scale, in
 * the openpi-converted layout (bf16 tensors, pi05.md §6.1 key names). Linears N(0, 0.02), biases
 * N(0, 0.02), norm weights N(0, 0.05) (Gemma stores w of (1 + w): near 0), LayerNorm gamma
 * 1 + N(0, 0.05), adaRMS dense layers small (N(0, 0.002)) so the modulations stay near 0 as
 * trained models' do, position embedding N(0, 0.02), token embedding N(0, 0.02).
 * The config is recorded in the metadata ("nib.pi05.config"). Streams tensor by tensor. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/rng.h"
#include "formats/formats.h"
#include "models/pi05.h"
#include "models/pi05_keys.h"

typedef struct synth {
    nib_st_writer *w;
    uint64_t seed, tensor;
    int unit_gain; /* tests: every linear N(0, 1/fan_in), adaRMS gates near 1 */
    int declare;   /* pass 1: declare; pass 2: write */
    uint16_t *buf;
    size_t cap;
    uint64_t total, done; /* bytes of tensor data: all (declared), written so far */
    nib_progress_fn progress;
    void *progress_ctx;
} synth;

typedef enum { D_NORMAL, D_ONE_PLUS, D_ADA_BIAS } dist;

#define SYNTH_CHUNK (1u << 20)
#define SYNTH_THREADS 16

typedef struct synth_job {
    uint16_t *out;
    uint64_t first, count, n;
    dist d;
    double std;
    uint64_t seed;
} synth_job;

static void *synth_worker(void *arg) {
    synth_job *j = (synth_job *)arg;
    nib_rng r;
    nib_rng_seed(&r, j->seed);
    for (uint64_t i = 0; i < j->count; i++) {
        double v = j->std * nib_rng_normal(&r);
        if (j->d == D_ONE_PLUS) v += 1.0;
        if (j->d == D_ADA_BIAS && j->first + i >= 2 * j->n / 3) v += 1.0; /* the gate third */
        j->out[i] = nib_f32_to_bf16((float)v);
    }
    return NULL;
}

static nib_status emit(synth *s, const char *name, int ndim, const int64_t *shape, dist d, double std) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (uint64_t)shape[i];
    if (s->declare) {
        s->total += n * 2;
        return nib_st_writer_declare(s->w, name, NIB_DTYPE_BF16, ndim, shape);
    }
    if (s->unit_gain) { /* unit-gain init: a layer's output has the scale of its input */
        if (ndim >= 2 && d == D_NORMAL) std = (strstr(name, ".dense.") ? 0.3 : 1.0) / sqrt((double)(n / (uint64_t)shape[0]));
        else if (d != D_ONE_PLUS) std = 0.1;
        else std = 0.1;
        if (ndim == 1 && strstr(name, ".dense.bias")) d = D_ADA_BIAS; /* [scale | shift | gate ~ 1] */
    }
    /* chunks of 1M values, each from its own stream seeded by (seed, tensor, chunk): the file is
     * the same for any thread count; batches of chunks are generated in parallel, written in order */
    s->tensor++;
    const uint64_t nchunks = (n + SYNTH_CHUNK - 1) / SYNTH_CHUNK;
    for (uint64_t c0 = 0; c0 < nchunks; c0 += SYNTH_THREADS) {
        synth_job jobs[SYNTH_THREADS];
        pthread_t tid[SYNTH_THREADS];
        int nj = 0;
        for (uint64_t c = c0; c < nchunks && nj < SYNTH_THREADS; c++, nj++) {
            jobs[nj] = (synth_job){s->buf + (size_t)nj * SYNTH_CHUNK, c * SYNTH_CHUNK,
                                   n - c * SYNTH_CHUNK < SYNTH_CHUNK ? n - c * SYNTH_CHUNK : SYNTH_CHUNK, n, d, std,
                                   s->seed ^ (s->tensor * 0x9E3779B97F4A7C15ull) ^ (c * 0xC2B2AE3D27D4EB4Full)};
            if (pthread_create(&tid[nj], NULL, synth_worker, &jobs[nj]) != 0) {
                synth_worker(&jobs[nj]);
                tid[nj] = 0;
            }
        }
        for (int j = 0; j < nj; j++)
            if (tid[j]) pthread_join(tid[j], NULL);
        for (int j = 0; j < nj; j++) {
            NIB_RETURN_IF_ERR(nib_st_writer_write(s->w, jobs[j].out, (size_t)jobs[j].count * 2));
            s->done += jobs[j].count * 2;
        }
        if (s->progress) s->progress(s->progress_ctx, s->done, s->total);
    }
    return NIB_OK;
}

static nib_status emitf(synth *s, int ndim, const int64_t *shape, dist d, double std, const char *fmt, ...)
    NIB_PRINTF(6, 7);
static nib_status emitf(synth *s, int ndim, const int64_t *shape, dist d, double std, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return emit(s, name, ndim, shape, d, std);
}

static nib_status all_tensors(synth *s, const nib_pi05_config *c) {
    const int64_t Wv = c->v_width, W = c->width, We = c->e_width, hd = c->head_dim;
#define S1(a) ((int64_t[]){a})
#define S2(a, b) ((int64_t[]){a, b})
    NIB_RETURN_IF_ERR(emit(s, PI05_VP ".embeddings.patch_embedding.weight", 4,
                           (int64_t[]){Wv, c->v_channels, c->v_patch, c->v_patch}, D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, PI05_VP ".embeddings.patch_embedding.bias", 1, S1(Wv), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, PI05_VP ".embeddings.position_embedding.weight", 2, S2(c->v_tokens, Wv), D_NORMAL, 0.02));
    for (int l = 0; l < c->v_layers; l++) {
        const char *P = PI05_VP ".encoder.layers";
        NIB_RETURN_IF_ERR(emitf(s, 1, S1(Wv), D_ONE_PLUS, 0.05, "%s.%d.layer_norm1.weight", P, l));
        NIB_RETURN_IF_ERR(emitf(s, 1, S1(Wv), D_NORMAL, 0.02, "%s.%d.layer_norm1.bias", P, l));
        NIB_RETURN_IF_ERR(emitf(s, 1, S1(Wv), D_ONE_PLUS, 0.05, "%s.%d.layer_norm2.weight", P, l));
        NIB_RETURN_IF_ERR(emitf(s, 1, S1(Wv), D_NORMAL, 0.02, "%s.%d.layer_norm2.bias", P, l));
        const char *pr[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
        for (int i = 0; i < 4; i++) {
            NIB_RETURN_IF_ERR(emitf(s, 2, S2(Wv, Wv), D_NORMAL, 0.02, "%s.%d.self_attn.%s.weight", P, l, pr[i]));
            NIB_RETURN_IF_ERR(emitf(s, 1, S1(Wv), D_NORMAL, 0.02, "%s.%d.self_attn.%s.bias", P, l, pr[i]));
        }
        NIB_RETURN_IF_ERR(emitf(s, 2, S2(c->v_mlp, Wv), D_NORMAL, 0.02, "%s.%d.mlp.fc1.weight", P, l));
        NIB_RETURN_IF_ERR(emitf(s, 1, S1(c->v_mlp), D_NORMAL, 0.02, "%s.%d.mlp.fc1.bias", P, l));
        NIB_RETURN_IF_ERR(emitf(s, 2, S2(Wv, c->v_mlp), D_NORMAL, 0.02, "%s.%d.mlp.fc2.weight", P, l));
        NIB_RETURN_IF_ERR(emitf(s, 1, S1(Wv), D_NORMAL, 0.02, "%s.%d.mlp.fc2.bias", P, l));
    }
    NIB_RETURN_IF_ERR(emit(s, PI05_VP ".post_layernorm.weight", 1, S1(Wv), D_ONE_PLUS, 0.05));
    NIB_RETURN_IF_ERR(emit(s, PI05_VP ".post_layernorm.bias", 1, S1(Wv), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, PI05_PROJ ".weight", 2, S2(W, Wv), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, PI05_PROJ ".bias", 1, S1(W), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, PI05_EMBED, 2, S2(c->vocab, W), D_NORMAL, 0.02));
    for (int e = 0; e < 2; e++) {
        const char *P = e ? PI05_EP : PI05_LP;
        const int64_t w = e ? We : W, f = e ? c->e_mlp : c->mlp, nh = e ? c->e_heads : c->heads;
        for (int l = 0; l < c->layers; l++) {
            if (e) {
                NIB_RETURN_IF_ERR(emitf(s, 2, S2(3 * We, We), D_NORMAL, 0.002, "%s.layers.%d.input_layernorm.dense.weight", P, l));
                NIB_RETURN_IF_ERR(emitf(s, 1, S1(3 * We), D_NORMAL, 0.002, "%s.layers.%d.input_layernorm.dense.bias", P, l));
                NIB_RETURN_IF_ERR(emitf(s, 2, S2(3 * We, We), D_NORMAL, 0.002, "%s.layers.%d.post_attention_layernorm.dense.weight", P, l));
                NIB_RETURN_IF_ERR(emitf(s, 1, S1(3 * We), D_NORMAL, 0.002, "%s.layers.%d.post_attention_layernorm.dense.bias", P, l));
            } else {
                NIB_RETURN_IF_ERR(emitf(s, 1, S1(W), D_NORMAL, 0.05, "%s.layers.%d.input_layernorm.weight", P, l));
                NIB_RETURN_IF_ERR(emitf(s, 1, S1(W), D_NORMAL, 0.05, "%s.layers.%d.post_attention_layernorm.weight", P, l));
            }
            NIB_RETURN_IF_ERR(emitf(s, 2, S2(nh * hd, w), D_NORMAL, 0.02, "%s.layers.%d.self_attn.q_proj.weight", P, l));
            NIB_RETURN_IF_ERR(emitf(s, 2, S2(c->kv_heads * hd, w), D_NORMAL, 0.02, "%s.layers.%d.self_attn.k_proj.weight", P, l));
            NIB_RETURN_IF_ERR(emitf(s, 2, S2(c->kv_heads * hd, w), D_NORMAL, 0.02, "%s.layers.%d.self_attn.v_proj.weight", P, l));
            NIB_RETURN_IF_ERR(emitf(s, 2, S2(w, nh * hd), D_NORMAL, 0.02, "%s.layers.%d.self_attn.o_proj.weight", P, l));
            NIB_RETURN_IF_ERR(emitf(s, 2, S2(f, w), D_NORMAL, 0.02, "%s.layers.%d.mlp.gate_proj.weight", P, l));
            NIB_RETURN_IF_ERR(emitf(s, 2, S2(f, w), D_NORMAL, 0.02, "%s.layers.%d.mlp.up_proj.weight", P, l));
            NIB_RETURN_IF_ERR(emitf(s, 2, S2(w, f), D_NORMAL, 0.02, "%s.layers.%d.mlp.down_proj.weight", P, l));
        }
        if (e) {
            NIB_RETURN_IF_ERR(emit(s, PI05_EP ".norm.dense.weight", 2, S2(3 * We, We), D_NORMAL, 0.002));
            NIB_RETURN_IF_ERR(emit(s, PI05_EP ".norm.dense.bias", 1, S1(3 * We), D_NORMAL, 0.002));
        } else {
            NIB_RETURN_IF_ERR(emit(s, PI05_LP ".norm.weight", 1, S1(W), D_NORMAL, 0.05));
        }
    }
    NIB_RETURN_IF_ERR(emit(s, "action_in_proj.weight", 2, S2(We, c->action_dim), D_NORMAL, 0.1));
    NIB_RETURN_IF_ERR(emit(s, "action_in_proj.bias", 1, S1(We), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, "action_out_proj.weight", 2, S2(c->action_dim, We), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, "action_out_proj.bias", 1, S1(c->action_dim), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, "time_mlp_in.weight", 2, S2(We, We), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, "time_mlp_in.bias", 1, S1(We), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, "time_mlp_out.weight", 2, S2(We, We), D_NORMAL, 0.02));
    NIB_RETURN_IF_ERR(emit(s, "time_mlp_out.bias", 1, S1(We), D_NORMAL, 0.02));
#undef S1
#undef S2
    return NIB_OK;
}

nib_status nib_pi05_synth_checkpoint(const char *path, const nib_pi05_config *c, uint64_t seed) {
    return nib_pi05_synth_checkpoint_ex(path, c, seed, 0);
}

nib_status nib_pi05_synth_checkpoint_ex(const char *path, const nib_pi05_config *c, uint64_t seed, int unit_gain) {
    return nib_pi05_synth_checkpoint_progress(path, c, seed, unit_gain, NULL, NULL);
}

nib_status nib_pi05_synth_checkpoint_progress(const char *path, const nib_pi05_config *c, uint64_t seed, int unit_gain,
                                              nib_progress_fn progress, void *ctx) {
    synth s;
    memset(&s, 0, sizeof s);
    s.unit_gain = unit_gain;
    s.progress = progress, s.progress_ctx = ctx;
    s.cap = (size_t)SYNTH_CHUNK * SYNTH_THREADS;
    s.buf = nib_malloc(s.cap * 2);
    s.seed = seed;
    if (!s.buf) return NIB_ERR_OUT_OF_MEMORY;
    nib_status st = nib_st_writer_create(path, &s.w);
    if (st) {
        nib_free(s.buf);
        return st;
    }
    char json[1024];
    snprintf(json, sizeof json,
             "{\"v_heads\": %d, \"v_head_dim\": %d, \"heads\": %d, \"kv_heads\": %d, \"e_heads\": %d, \"head_dim\": %d, "
             "\"max_cameras\": %d, \"max_text\": %d, \"max_horizon\": %d, \"steps\": %d, \"synthetic_seed\": %llu}",
             c->v_heads, c->v_head_dim, c->heads, c->kv_heads, c->e_heads, c->head_dim, c->max_cameras, c->max_text,
             c->max_horizon, c->steps, (unsigned long long)seed);
    st = nib_st_writer_set_metadata(s.w, "nib.pi05.config", json);
    if (!st) st = nib_st_writer_set_metadata(s.w, "format", "pt");
    s.declare = 1;
    if (!st) st = all_tensors(&s, c);
    s.declare = 0;
    s.tensor = 0;
    if (!st) st = all_tensors(&s, c);
    if (!st) st = nib_st_writer_finish(s.w);
    else nib_st_writer_abort(s.w);
    nib_free(s.buf);
    return st;
}
