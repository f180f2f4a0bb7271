/* backend.c — the two backends of runtime/backend.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/formats.h"
#include "runtime/backend.h"

#ifdef NIB_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

const char *nib_be_name(const nib_be *be) { return be->kind == NIB_BE_REF ? "reference (fp32, CPU)" : "cuda"; }

/* ---- reference fp32 GEMM ---------------------------------------------------------------- */
typedef struct sgemm_job {
    const float *x, *w;
    float *y;
    int64_t m, ldx, n, k, ldy, n0, n1;
} sgemm_job;

/* 8 partial sums in a fixed order: vectorizable without reassociation, deterministic */
static float dot8(const float *a, const float *b, int64_t k) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= k; j += 8)
        for (int q = 0; q < 8; q++) s[q] += a[j + q] * b[j + q];
    for (; j < k; j++) s[j & 7] += a[j] * b[j];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static void *sgemm_worker(void *arg) {
    sgemm_job *j = (sgemm_job *)arg;
    /* blocks of 16 weight rows stay in cache while every x row passes by */
    for (int64_t nb = j->n0; nb < j->n1; nb += 16) {
        int64_t ne = nb + 16 < j->n1 ? nb + 16 : j->n1;
        for (int64_t i = 0; i < j->m; i++)
            for (int64_t r = nb; r < ne; r++) j->y[i * j->ldy + r] = dot8(j->x + i * j->ldx, j->w + r * j->k, j->k);
    }
    return NULL;
}

nib_status nib_ref_sgemm(const float *x, int64_t m, int64_t ldx, const float *w, int64_t n, int64_t k, float *y,
                         int64_t ldy, int threads) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if ((int64_t)threads > (n + 15) / 16) threads = (int)((n + 15) / 16);
    if (threads < 1) threads = 1;
    sgemm_job jobs[64];
    pthread_t tid[64];
    int64_t per = (n + threads - 1) / threads;
    per = (per + 15) / 16 * 16;
    int started = 0;
    for (int t = 0; t < threads; t++) {
        int64_t n0 = t * per, n1 = n0 + per < n ? n0 + per : n;
        if (n0 >= n) break;
        jobs[t] = (sgemm_job){x, w, y, m, ldx, n, k, ldy, n0, n1};
        if (t == 0) continue; /* run the first block on this thread */
        if (pthread_create(&tid[t], NULL, sgemm_worker, &jobs[t]) != 0) {
            sgemm_worker(&jobs[t]); /* no thread: do it here (same result, slower) */
            tid[t] = 0;
        }
        started = t + 1;
    }
    sgemm_worker(&jobs[0]);
    for (int t = 1; t < started; t++)
        if (tid[t]) pthread_join(tid[t], NULL);
    return NIB_OK;
}

/* ---- init / memory ------------------------------------------------------------------------ */
#ifdef NIB_HAVE_CUDA
static void scratch_free(nib_be_scratch *c) {
    nib_cuda_gemm_ws_free(&c->ws);
    nib_dev_free(c->gemm_tmp, c->gemm_tmp_bytes);
    nib_dev_free(c->xq8, c->xq8_bytes);
    nib_dev_free(c->xs8, 0);
    nib_dev_free(c->attn_ws, c->attn_ws_bytes);
    memset(c, 0, sizeof *c);
}

/* one stream's scratch for sz's maxima, zeroed (see nib_be_init) */
static nib_status scratch_init(nib_be_scratch *c, const nib_be_sizes *sz) {
    nib_status st = NIB_OK;
    memset(c, 0, sizeof *c);
    NIB_TRY(nib_cuda_gemm_ws_init(&c->ws, sz->max_m, (sz->max_n + 255) / 256 * 256));
    c->gemm_tmp_bytes = (size_t)sz->max_m * (size_t)sz->max_n * 2 + 256;
    NIB_TRY(nib_dev_malloc(&c->gemm_tmp, c->gemm_tmp_bytes, "GEMM epilogue scratch"));
    c->xq8_bytes = (size_t)sz->max_m * (size_t)sz->max_k + 256;
    NIB_TRY(nib_dev_malloc(&c->xq8, c->xq8_bytes, "FP8 activation codes"));
    NIB_TRY(nib_dev_malloc((void **)&c->xs8, (size_t)sz->max_m * 4 + 256, "FP8 activation scales"));
    c->attn_ws_bytes = sz->attn_ws_bytes;
    if (c->attn_ws_bytes) NIB_TRY(nib_dev_malloc(&c->attn_ws, c->attn_ws_bytes, "attention workspace"));
    NIB_TRY(nib_dev_memset(c->gemm_tmp, 0, c->gemm_tmp_bytes));
    if (c->attn_ws_bytes) NIB_TRY(nib_dev_memset(c->attn_ws, 0, c->attn_ws_bytes));
    return NIB_OK;
fail:
    scratch_free(c);
    return st;
}
#endif

nib_status nib_be_init(nib_be *be, nib_be_kind kind, const nib_be_sizes *sz) {
#ifdef NIB_HAVE_CUDA
    nib_status st = NIB_OK;
#endif
    memset(be, 0, sizeof *be);
    be->kind = kind;
    if (kind == NIB_BE_REF) {
        be->act_size = 4;
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        be->threads = nc > 0 ? (int)nc : 1;
        const char *env = getenv("NIB_REF_THREADS");
        if (env && atoi(env) > 0) be->threads = atoi(env);
        be->h_wcap = sz->weight_bytes;
        be->h_acap = sz->act_bytes;
        be->h_wslab = nib_calloc(be->h_wcap ? be->h_wcap : 1, 1);
        be->h_act = nib_calloc(be->h_acap ? be->h_acap : 1, 1);
        be->ref_tmp_elems = (size_t)(sz->max_m > 0 ? sz->max_m : 1) * (size_t)(sz->max_n > 0 ? sz->max_n : 1);
        be->ref_tmp = nib_calloc(be->ref_tmp_elems, sizeof(float));
        if (!be->h_wslab || !be->h_act || !be->ref_tmp) {
            nib_be_free(be);
            return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "reference backend: cannot allocate %llu + %llu bytes of host memory",
                           (unsigned long long)sz->weight_bytes, (unsigned long long)sz->act_bytes);
        }
        return NIB_OK;
    }
#ifndef NIB_HAVE_CUDA
    return NIB_ERR(NIB_ERR_NO_DEVICE, "CUDA backend: this nib build has no CUDA backend (NO_CUDA=1 or no nvcc)");
#else
    be->act_size = 2;
    NIB_TRY(nib_device_require(NULL));
    {
        cudaStream_t s, side;
        cudaEvent_t ef, ej;
        int least = 0, greatest = 0;
        /* The main stream's work (Pi0.5: the prefix) before the side stream's (the first flow step
         * beside it): where both have CTAs waiting for an SM, the main stream's go first. Graphs
         * keep it (the kernel nodes carry their stream's priority; capture_end instantiates with
         * node priorities). Measured against the reverse order (side first) and no priorities, fast
         * 3 cameras H = 50: 13.84 -> 13.74 ms; docs/design.md, "Thirty-third session". */
        NIB_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        NIB_CUDA_TRY(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
        be->stream = be->main_stream = s;
        NIB_CUDA_TRY(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, least));
        be->side_stream = side;
        NIB_CUDA_TRY(cudaEventCreateWithFlags(&ef, cudaEventDisableTiming));
        be->ev_fork = ef;
        NIB_CUDA_TRY(cudaEventCreateWithFlags(&ej, cudaEventDisableTiming));
        be->ev_join = ej;
    }
    NIB_TRY(nib_dev_arena_init(&be->wslab, sz->weight_bytes + 4096, "weight slab"));
    NIB_TRY(nib_dev_arena_init(&be->act, sz->act_bytes + 4096, "activation arena"));
    NIB_TRY(nib_blas_create(&be->blas));
    NIB_TRY(scratch_init(&be->sc, sz));
    /* Activations and scratch start as zeros, once, at creation (one memset each, at load time):
     * bytes no op writes (row padding, rows past a call's valid length) then read as 0 in every
     * process, never as stale data. It is also what makes initcheck usable: it does not see the
     * stores of cuBLASLt's Hopper kernels (docs/reliability.md, "initcheck"), so without it every
     * read of a cuBLASLt output is reported as uninitialized. */
    NIB_TRY(nib_dev_memset(be->act.base, 0, be->act.cap));
    return NIB_OK;
fail:
    nib_be_free(be);
    return st;
#endif
}

nib_status nib_be_side_scratch(nib_be *be, const nib_be_sizes *sz) {
    if (be->kind != NIB_BE_CUDA) return NIB_OK;
#ifndef NIB_HAVE_CUDA
    (void)sz;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "CUDA backend: this nib build has no CUDA backend");
#else
    if (be->has_side_sc) return NIB_ERR(NIB_ERR_INVALID_ARG, "backend: the side stream has its scratch already");
    if (be->stream != be->main_stream) return NIB_ERR(NIB_ERR_INVALID_ARG, "backend side scratch: inside a fork");
    nib_status st = scratch_init(&be->alt_sc, sz);
    if (!st) st = nib_blas_add_workspace(be->blas);
    if (st) {
        scratch_free(&be->alt_sc);
        return st;
    }
    be->has_side_sc = 1;
    return NIB_OK;
#endif
}

void nib_be_free(nib_be *be) {
    if (!be) return;
    if (be->kind == NIB_BE_REF) {
        nib_free(be->h_wslab);
        nib_free(be->h_act);
        nib_free(be->ref_tmp);
    } else {
#ifdef NIB_HAVE_CUDA
        nib_dev_arena_free(&be->wslab);
        nib_dev_arena_free(&be->act);
        nib_blas_free(be->blas);
        scratch_free(&be->sc);
        scratch_free(&be->alt_sc);
        if (be->ev_fork) cudaEventDestroy((cudaEvent_t)be->ev_fork);             /* unchecked: teardown, no status */
        if (be->ev_join) cudaEventDestroy((cudaEvent_t)be->ev_join);             /* unchecked: teardown, no status */
        if (be->side_stream) cudaStreamDestroy((cudaStream_t)be->side_stream);   /* unchecked: teardown, no status */
        if (be->main_stream) cudaStreamDestroy((cudaStream_t)be->main_stream);   /* unchecked: teardown, no status */
#endif
    }
    memset(be, 0, sizeof *be);
}

static nib_status host_bump(uint8_t *base, size_t cap, size_t *used, uint64_t bytes, void **p, const char *what,
                            const char *pool) {
    uint64_t off = 0, end = 0;
    if (nib_pad_overflow_u64(*used, 256, &off) || nib_add_overflow_u64(off, bytes, &end) || end > cap)
        return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "reference backend: %s needs %llu bytes but the %s has %zu of %zu left",
                       what, (unsigned long long)bytes, pool, cap - (size_t)(off < cap ? off : cap), cap);
    *p = base + off;
    *used = (size_t)end;
    return NIB_OK;
}

nib_status nib_be_alloc_weight(nib_be *be, uint64_t bytes, void **p, const char *what) {
    if (be->kind == NIB_BE_REF) return host_bump(be->h_wslab, be->h_wcap, &be->h_wused, bytes, p, what, "weight slab");
    return nib_dev_arena_alloc(&be->wslab, (size_t)bytes, p, what);
}

nib_status nib_be_alloc_act(nib_be *be, uint64_t bytes, void **p, const char *what) {
    if (be->kind == NIB_BE_REF) return host_bump(be->h_act, be->h_acap, &be->h_aused, bytes, p, what, "activation arena");
    return nib_dev_arena_alloc(&be->act, (size_t)bytes, p, what);
}

nib_status nib_be_upload(nib_be *be, void *dst, const void *src, uint64_t bytes) {
    if (be->kind == NIB_BE_REF) {
        memcpy(dst, src, bytes);
        return NIB_OK;
    }
    return nib_dev_upload(dst, src, bytes);
}

nib_status nib_be_download(nib_be *be, void *dst, const void *src, uint64_t bytes) {
    if (be->kind == NIB_BE_REF) {
        memcpy(dst, src, bytes);
        return NIB_OK;
    }
#ifdef NIB_HAVE_CUDA
    NIB_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)be->stream));
#endif
    return nib_dev_download(dst, src, bytes);
}

nib_status nib_be_upload_act(nib_be *be, void *dst, const float *src, uint64_t n) {
    if (be->kind == NIB_BE_REF) {
        memcpy(dst, src, n * 4);
        return NIB_OK;
    }
    uint16_t *tmp = nib_malloc(n * 2 + 2);
    if (!tmp) return NIB_ERR_OUT_OF_MEMORY;
    for (uint64_t i = 0; i < n; i++) tmp[i] = nib_f32_to_bf16(src[i]);
    nib_status st = nib_dev_upload(dst, tmp, n * 2);
    nib_free(tmp);
    return st;
}

nib_status nib_be_download_act(nib_be *be, float *dst, const void *src, uint64_t n) {
    if (be->kind == NIB_BE_REF) {
        memcpy(dst, src, n * 4);
        return NIB_OK;
    }
    uint16_t *tmp = nib_malloc(n * 2 + 2);
    if (!tmp) return NIB_ERR_OUT_OF_MEMORY;
    nib_status st = nib_be_download(be, tmp, src, n * 2);
    if (!st)
        for (uint64_t i = 0; i < n; i++) dst[i] = nib_bf16_to_f32(tmp[i]);
    nib_free(tmp);
    return st;
}

nib_status nib_be_memset(nib_be *be, void *dst, int v, uint64_t bytes) {
    if (be->kind == NIB_BE_REF) {
        memset(dst, v, bytes);
        return NIB_OK;
    }
#ifdef NIB_HAVE_CUDA
    NIB_CUDA_CHECK(cudaMemsetAsync(dst, v, bytes, (cudaStream_t)be->stream));
    return NIB_OK;
#else
    return NIB_ERR(NIB_ERR_NO_DEVICE, "memset: no CUDA backend");
#endif
}

nib_status nib_be_host_alloc(nib_be *be, uint64_t bytes, void **p, const char *what) {
    *p = NULL;
    if (be->kind == NIB_BE_REF) {
        *p = nib_calloc(bytes ? (size_t)bytes : 1, 1);
        return *p ? NIB_OK
                  : NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "%s: %llu bytes of host memory", what, (unsigned long long)bytes);
    }
#ifdef NIB_HAVE_CUDA
    const cudaError_t e = cudaHostAlloc(p, bytes ? (size_t)bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *p = NULL;
        return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "%s: %llu bytes of page-locked host memory (cudaHostAlloc: %s)", what,
                       (unsigned long long)bytes, cudaGetErrorString(e));
    }
    memset(*p, 0, (size_t)bytes);
    return NIB_OK;
#else
    return NIB_ERR(NIB_ERR_NO_DEVICE, "%s: page-locked host memory needs the CUDA backend", what);
#endif
}

void nib_be_host_free(nib_be *be, void *p) {
    if (!p) return;
    if (be->kind == NIB_BE_REF) {
        nib_free(p);
        return;
    }
#ifdef NIB_HAVE_CUDA
    cudaFreeHost(p); /* unchecked: a free function has no status */
#endif
}

static nib_status copy_async(nib_be *be, void *dst, const void *src, uint64_t bytes, int to_device) {
    if (!bytes) return NIB_OK;
    if (be->kind == NIB_BE_REF) {
        memcpy(dst, src, (size_t)bytes);
        return NIB_OK;
    }
#ifdef NIB_HAVE_CUDA
    NIB_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                   (cudaStream_t)be->stream));
    return NIB_OK;
#else
    (void)to_device;
    return NIB_ERR(NIB_ERR_NO_DEVICE, "copy: no CUDA backend");
#endif
}
nib_status nib_be_upload_async(nib_be *be, void *dst, const void *src, uint64_t bytes) {
    return copy_async(be, dst, src, bytes, 1);
}
nib_status nib_be_download_async(nib_be *be, void *dst, const void *src, uint64_t bytes) {
    return copy_async(be, dst, src, bytes, 0);
}

nib_status nib_be_sync(nib_be *be) {
    if (be->kind == NIB_BE_REF) return NIB_OK;
#ifdef NIB_HAVE_CUDA
    NIB_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)be->stream));
    return NIB_OK;
#else
    return NIB_ERR(NIB_ERR_NO_DEVICE, "sync: no CUDA backend");
#endif
}

/* ---- linear ------------------------------------------------------------------------------ */
nib_status nib_be_linear_load(nib_be *be, const nib_wsrc *src, int geglu, int w8a8, const char *name,
                              nib_be_linear *out) {
    nib_status st = NIB_OK;
    memset(out, 0, sizeof *out);
    NIB_RETURN_IF_ERR(nib_wsrc_validate(src, name));
    if (geglu && src->n % 2) return NIB_ERR(NIB_ERR_SHAPE, "%s: GeGLU weight has an odd row count %lld", name, (long long)src->n);
    out->n = src->n;
    out->k = src->k;
    out->n_out = geglu ? src->n / 2 : src->n;
    out->geglu = geglu;
    out->fmt = src->fmt;
    if (be->kind == NIB_BE_REF) {
        uint64_t bytes = (uint64_t)src->n * src->k * 4;
        NIB_RETURN_IF_ERR(nib_be_alloc_weight(be, bytes, (void **)&out->w32, name));
        NIB_RETURN_IF_ERR(nib_wsrc_dequantize(src, out->w32));
        if (src->bias) {
            NIB_RETURN_IF_ERR(nib_be_alloc_weight(be, (uint64_t)src->n * 4, (void **)&out->bias, name));
            memcpy(out->bias, src->bias, (size_t)src->n * 4);
        }
        return NIB_OK;
    }
    if (src->fmt == NIB_WFMT_FP8 && w8a8) {
        out->w8a8 = 1;
        uint64_t nk = (uint64_t)src->n * src->k;
        NIB_RETURN_IF_ERR(nib_be_alloc_weight(be, nk, &out->wq8, name));
        NIB_RETURN_IF_ERR(nib_be_alloc_weight(be, (uint64_t)src->n * 4, (void **)&out->sw8, name));
        NIB_RETURN_IF_ERR(nib_dev_upload(out->wq8, src->data, nk));
        float *s = nib_malloc((size_t)src->n * 4);
        if (!s) return NIB_ERR_OUT_OF_MEMORY;
        for (int64_t i = 0; i < src->n; i++) s[i] = ((const float *)src->scales)[src->fp8_per_channel ? i : 0];
        st = nib_dev_upload(out->sw8, s, (size_t)src->n * 4);
        nib_free(s);
        if (st) return st;
    } else if (src->fmt == NIB_WFMT_BF16) {
        nib_wsrc nb = *src;
        nb.bias = NULL;      /* cuBLAS path: bias in the epilogue kernel */
        nb.rope_half = 0;    /* and no pair layout: nib_be_gemm_qkv runs nib_be_gemm + nib_be_qkv */
        NIB_RETURN_IF_ERR(nib_cuda_weight_load(&nb, 0, name, &be->wslab, &out->q));
    } else {
        return nib_cuda_weight_load(src, geglu, name, &be->wslab, &out->q);
    }
    if (src->bias) {
        NIB_RETURN_IF_ERR(nib_be_alloc_weight(be, (uint64_t)src->n * 4, (void **)&out->bias, name));
        NIB_RETURN_IF_ERR(nib_dev_upload(out->bias, src->bias, (size_t)src->n * 4));
        /* a bf16 copy for the cuBLASLt epilogue, only when it is exact (bf16 checkpoints) */
        uint16_t *b16 = nib_malloc((size_t)src->n * 2);
        if (!b16) return NIB_ERR_OUT_OF_MEMORY;
        int exact = 1;
        for (int64_t i = 0; i < src->n && exact; i++) {
            b16[i] = nib_f32_to_bf16(src->bias[i]);
            exact = nib_bf16_to_f32(b16[i]) == src->bias[i];
        }
        st = NIB_OK;
        if (exact && (st = nib_be_alloc_weight(be, (uint64_t)src->n * 2, &out->bias16, name)) == NIB_OK)
            st = nib_dev_upload(out->bias16, b16, (size_t)src->n * 2);
        nib_free(b16);
        if (st) return st;
    }
    return NIB_OK;
}

nib_status nib_be_gemm(nib_be *be, const nib_be_linear *L, const void *x, int64_t m, int64_t ldx, void *y,
                         int64_t ldy, const nib_gemm_epi *epi) {
    if (m <= 0) return NIB_OK;
    if (!x && !(be->kind == NIB_BE_CUDA && L->w8a8))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "linear: NULL activations (only a W8A8 layer after nib_be_norm_gemm)");
    nib_gemm_epi none = {L->geglu, NULL, NULL, 0};
    if (!epi) epi = &none;
    if (epi->geglu != L->geglu)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "linear: epilogue GeGLU %d but the weight was loaded with GeGLU %d",
                       epi->geglu, L->geglu);
    nib_epilogue_args e = {NULL, m, L->n, 0, L->bias, L->geglu, epi->gate, epi->residual, epi->ldr, y, ldy};
    if (be->kind == NIB_BE_REF) {
        if ((size_t)m * (size_t)L->n > be->ref_tmp_elems)
            return NIB_ERR(NIB_ERR_SHAPE, "linear: %lld x %lld output exceeds the reference scratch", (long long)m,
                           (long long)L->n);
        NIB_RETURN_IF_ERR(nib_ref_sgemm((const float *)x, m, ldx, L->w32, L->n, L->k, be->ref_tmp, L->n, be->threads));
        e.acc = be->ref_tmp;
        e.ld_acc = L->n;
        return nib_ref_epilogue(&e);
    }
    if (L->fmt != NIB_WFMT_BF16 && !L->w8a8)
        return nib_cuda_gemm(&L->q, x, m, ldx, y, ldy, epi, &be->sc.ws, be->stream);
    /* cuBLAS paths. Bias and residual (no gate, no GeGLU): one cuBLASLt call with its BIAS
     * epilogue and C = residual (beta = 1), straight into y. Otherwise, or where cuBLASLt has no
     * such algorithm: raw product into scratch, then the epilogue kernel. */
    if (ldx != L->k)
        return NIB_ERR(NIB_ERR_SHAPE, "linear: the cuBLAS path needs ldx == K (%lld != %lld)", (long long)ldx, (long long)L->k);
    if (L->w8a8 && x) {
        if ((size_t)m * (size_t)L->k > be->sc.xq8_bytes)
            return NIB_ERR(NIB_ERR_SHAPE, "linear: %lld x %lld activations exceed the FP8 scratch", (long long)m,
                           (long long)L->k);
        NIB_RETURN_IF_ERR(nib_cuda_quantize_fp8_rows(x, m, L->k, 1, be->sc.xq8, be->sc.xs8, be->stream));
        x = NULL; /* the codes and scales are in xq8/xs8 now */
    }
    const int aligned = ((uintptr_t)y | (uintptr_t)(epi->residual ? epi->residual : y)) % 16 == 0 && ldy % 8 == 0 &&
                        (!epi->residual || (epi->ldr % 8 == 0 && (epi->residual != y || epi->ldr == ldy)));
    /* NIB_FUSED_EPILOGUE=0: always the product + epilogue kernel (the A/B switch of the benches).
     * Gated residuals stay on the epilogue kernel: cuBLASLt 13 offers no bf16 algorithm with a
     * per-channel alpha (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST: NOT_SUPPORTED at
     * M = 1..50, K = 1024 / 4096 on H100, fifteenth session) */
    const char *fe = getenv("NIB_FUSED_EPILOGUE");
    if (!L->geglu && !epi->gate && aligned && (!L->bias || L->bias16) && !(fe && !strcmp(fe, "0"))) {
        nib_blas_gemm_args a = {L->w8a8, L->w8a8 ? be->sc.xq8 : x, be->sc.xs8, 1, L->w8a8 ? L->wq8 : L->q.bf16_w,
                                L->sw8, 1, m, L->n, L->k, L->bias16, epi->residual, epi->ldr, y, ldy};
        nib_status fs = nib_blas_gemm_fused(be->blas, &a, be->stream);
        if (fs != NIB_ERR_UNSUPPORTED) return fs;
        nib_clear_error();
    }
    if ((size_t)m * (size_t)L->n * 2 > be->sc.gemm_tmp_bytes)
        return NIB_ERR(NIB_ERR_SHAPE, "linear: %lld x %lld output exceeds the GEMM scratch", (long long)m, (long long)L->n);
    if (L->w8a8) {
        /* the codes and scales are in xq8/xs8 (quantized above, or by nib_be_norm_gemm) */
        NIB_RETURN_IF_ERR(nib_blas_gemm_fp8(be->blas, be->sc.xq8, be->sc.xs8, 1, L->wq8, L->sw8, 1, be->sc.gemm_tmp, m, L->n,
                                            L->k, be->stream));
    } else {
        NIB_RETURN_IF_ERR(nib_blas_gemm_bf16(be->blas, x, L->q.bf16_w, be->sc.gemm_tmp, m, L->n, L->k, be->stream));
    }
    e.acc = be->sc.gemm_tmp;
    e.ld_acc = L->n;
    return nib_cuda_epilogue(&e, be->stream);
}

int nib_be_gemm_fuses_gate(const nib_be *be, const nib_be_linear *L) {
    return be->kind == NIB_BE_REF || (L->fmt != NIB_WFMT_BF16 && !L->w8a8);
}

nib_status nib_be_gemm_qkv(nib_be *be, const nib_be_linear *L, const void *x, int64_t m, int64_t ldx,
                           const nib_qkv_args *a) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "q|k|v linear: NULL qkv args");
    if (be->kind == NIB_BE_CUDA && L->q.rope_half && L->fmt != NIB_WFMT_BF16 && !L->w8a8)
        return nib_cuda_gemm_qkv(&L->q, x, m, ldx, a, &be->sc.ws, NULL, be->stream);
    NIB_RETURN_IF_ERR(nib_be_gemm(be, L, x, m, ldx, (void *)a->qkv, a->ld_qkv, NULL));
    return nib_be_qkv(be, a);
}

nib_status nib_be_norm_gemm(nib_be *be, const nib_norm_args *n, const nib_be_linear *L, void *y, int64_t ldy,
                            const nib_gemm_epi *epi) {
    if (n->dim != L->k)
        return NIB_ERR(NIB_ERR_SHAPE, "norm+linear: norm width %lld != linear K %lld", (long long)n->dim, (long long)L->k);
    if (be->kind == NIB_BE_CUDA && L->w8a8 && !n->n_valid) {
        /* W8A8: the norm writes the FP8 codes and per-row scales the GEMM reads (one pass over
         * the activations instead of norm -> bf16 -> quantize) */
        if ((size_t)n->rows * (size_t)L->k > be->sc.xq8_bytes)
            return NIB_ERR(NIB_ERR_SHAPE, "norm+linear: %lld x %lld activations exceed the FP8 scratch",
                           (long long)n->rows, (long long)L->k);
        nib_norm_args q = *n;
        q.y = NULL, q.ldy = 0;
        q.y_q = (uint8_t *)be->sc.xq8, q.ldq = L->k, q.y_scale = be->sc.xs8;
        NIB_RETURN_IF_ERR(nib_cuda_norm(&q, be->stream));
        return nib_be_gemm(be, L, NULL, n->rows, L->k, y, ldy, epi);
    }
    if (!n->y) return NIB_ERR(NIB_ERR_INVALID_ARG, "norm+linear: the norm needs an output buffer y");
    NIB_RETURN_IF_ERR(nib_be_norm(be, n));
    return nib_be_gemm(be, L, n->y, n->rows, n->ldy, y, ldy, epi);
}

static nib_status mlp_generic(nib_be *be, const nib_norm_args *n, const nib_be_linear *up, int gelu,
                              const nib_be_linear *down, void *hidden, int64_t ldh, void *y, int64_t ldy,
                              const nib_gemm_epi *down_epi) {
    nib_gemm_epi ue = {up->geglu, NULL, NULL, 0};
    NIB_RETURN_IF_ERR(nib_be_norm_gemm(be, n, up, hidden, ldh, &ue));
    if (gelu) {
        nib_act_args g = {NIB_ACT_GELU_TANH, n->rows, n->n_valid, up->n_out, hidden, ldh, hidden, ldh, NULL, 0, NULL};
        NIB_RETURN_IF_ERR(nib_be_act(be, &g));
    }
    return nib_be_gemm(be, down, hidden, n->rows, ldh, y, ldy, down_epi);
}

nib_status nib_be_mlp(nib_be *be, const nib_norm_args *n, const nib_be_linear *up, int gelu, const nib_be_linear *down,
                      void *hidden, int64_t ldh, void *y, int64_t ldy, const nib_gemm_epi *down_epi) {
    if (gelu && up->geglu) return NIB_ERR(NIB_ERR_INVALID_ARG, "mlp: GELU asked for on a GeGLU (gate|up) weight");
    if (down->k != up->n_out)
        return NIB_ERR(NIB_ERR_SHAPE, "mlp: down projection K %lld != up projection output %lld", (long long)down->k,
                       (long long)up->n_out);
    const int64_t rows = n->rows, h = up->n_out;
    const char *fe = getenv("NIB_FUSED_MLP");
    const int fused = be->kind == NIB_BE_CUDA && up->w8a8 && down->w8a8 && !n->n_valid && !(fe && !strcmp(fe, "0")) &&
                      (!up->bias || up->bias16) && h % 8 == 0 && h <= 32768 && n->dim == up->k &&
                      (size_t)rows * (size_t)up->n * 2 <= be->sc.gemm_tmp_bytes &&
                      (size_t)rows * (size_t)(h > up->k ? h : up->k) <= be->sc.xq8_bytes;
    if (!fused) return mlp_generic(be, n, up, gelu, down, hidden, ldh, y, ldy, down_epi);
#ifdef NIB_HAVE_CUDA
    nib_norm_args q = *n;
    q.y = NULL, q.ldy = 0;
    q.y_q = (uint8_t *)be->sc.xq8, q.ldq = up->k, q.y_scale = be->sc.xs8;
    NIB_RETURN_IF_ERR(nib_cuda_norm(&q, be->stream));
    /* GeGLU fused into nib's FP8 GEMM where the engine rule picks nib's kernel for the gate|up
     * product: h (bf16, M x H) straight from the fp32 epilogue, then its FP8 codes for the down
     * projection (lab: NIB_FUSED_GEGLU=0: the product, then the GeGLU + FP8 kernel; =1: fused at
     * every row count) */
    const char *fg = getenv("NIB_FUSED_GEGLU");
    const int fg_off = fg && !strcmp(fg, "0"), fg_on = fg && !strcmp(fg, "1");
    if (!gelu && up->geglu && !up->bias && !fg_off && nib_blas_fp8_fast_accum(be->blas) &&
        (fg_on || nib_fp8_use_nib_geglu(rows, up->n, up->k))) {
        nib_blas_gemm_args a = {1, be->sc.xq8, be->sc.xs8, 1, up->wq8, up->sw8, 1, rows, up->n, up->k,
                                NULL, NULL, 0, be->sc.gemm_tmp, h};
        NIB_RETURN_IF_ERR(nib_cuda_gemm_fp8_geglu(&a, NULL, be->stream));
        NIB_RETURN_IF_ERR(nib_cuda_quantize_fp8_rows(be->sc.gemm_tmp, rows, h, 1, be->sc.xq8, be->sc.xs8, be->stream));
        return nib_be_gemm(be, down, NULL, rows, h, y, ldy, down_epi);
    }
    if (up->bias) { /* product + bias in one cuBLASLt call, or the generic path where it has none */
        nib_blas_gemm_args a = {1,       be->sc.xq8, be->sc.xs8,      1, up->wq8, up->sw8, 1, rows, up->n, up->k,
                                up->bias16, NULL, 0,            be->sc.gemm_tmp, up->n};
        nib_status st = nib_blas_gemm_fused(be->blas, &a, be->stream);
        if (st == NIB_ERR_UNSUPPORTED) {
            nib_clear_error();
            return mlp_generic(be, n, up, gelu, down, hidden, ldh, y, ldy, down_epi);
        }
        NIB_RETURN_IF_ERR(st);
    } else {
        NIB_RETURN_IF_ERR(nib_blas_gemm_fp8(be->blas, be->sc.xq8, be->sc.xs8, 1, up->wq8, up->sw8, 1, be->sc.gemm_tmp, rows, up->n,
                                            up->k, be->stream));
    }
    /* the product's codes (xq8) are dead once the GEMM ran: the act kernel reuses xq8/xs8 */
    nib_act_args g = {gelu ? NIB_ACT_GELU_TANH : NIB_ACT_GEGLU_TANH, rows, NULL, h, be->sc.gemm_tmp, up->n, NULL, 0,
                      (uint8_t *)be->sc.xq8, h, be->sc.xs8};
    NIB_RETURN_IF_ERR(nib_cuda_act(&g, be->stream));
    return nib_be_gemm(be, down, NULL, rows, h, y, ldy, down_epi);
#else
    return NIB_ERR(NIB_ERR_NO_DEVICE, "mlp: this nib build has no CUDA backend");
#endif
}

/* ---- op dispatch ------------------------------------------------------------------------- */
#define DISPATCH(ref_call, cuda_call) return be->kind == NIB_BE_REF ? (ref_call) : (cuda_call)

nib_status nib_be_norm(nib_be *be, const nib_norm_args *a) { DISPATCH(nib_ref_norm(a), nib_cuda_norm(a, be->stream)); }
nib_status nib_be_rope(nib_be *be, const nib_rope_args *a) { DISPATCH(nib_ref_rope(a), nib_cuda_rope(a, be->stream)); }
nib_status nib_be_act(nib_be *be, const nib_act_args *a) { DISPATCH(nib_ref_act(a), nib_cuda_act(a, be->stream)); }
nib_status nib_be_qkv(nib_be *be, const nib_qkv_args *a) { DISPATCH(nib_ref_qkv(a), nib_cuda_qkv(a, be->stream)); }
nib_status nib_be_kv_write(nib_be *be, const nib_kv_write_args *a) {
    DISPATCH(nib_ref_kv_write(a), nib_cuda_kv_write(a, be->stream));
}
nib_status nib_be_attn_prefix(nib_be *be, const nib_attn_prefix_args *a) {
    DISPATCH(nib_ref_attn_prefix(a), nib_cuda_attn_prefix(a, be->sc.attn_ws, be->stream));
}
nib_status nib_be_attn_cache(nib_be *be, const nib_attn_cache_args *a) {
    DISPATCH(nib_ref_attn_cache(a), nib_cuda_attn_cache(a, be->sc.attn_ws, be->stream));
}
nib_status nib_be_im2patch(nib_be *be, const nib_im2patch_args *a) {
    DISPATCH(nib_ref_im2patch(a), nib_cuda_im2patch(a, be->stream));
}
nib_status nib_be_embed(nib_be *be, const nib_embed_args *a) { DISPATCH(nib_ref_embed(a), nib_cuda_embed(a, be->stream)); }
nib_status nib_be_f32_to_act(nib_be *be, const float *x, int64_t rows, int64_t cols, int64_t ldx, void *y,
                             int64_t ldy) {
    DISPATCH(nib_ref_f32_to_act(x, rows, cols, ldx, y, ldy), nib_cuda_f32_to_act(x, rows, cols, ldx, y, ldy, be->stream));
}
nib_status nib_be_axpy_f32(nib_be *be, float *x, int64_t rows, int64_t cols, int64_t ldx, const void *v,
                           int64_t ldv) {
    DISPATCH(nib_ref_axpy_f32(x, rows, cols, ldx, v, ldv), nib_cuda_axpy_f32(x, rows, cols, ldx, v, ldv, be->stream));
}
nib_status nib_be_edge(nib_be *be, const nib_edge_args *a) { DISPATCH(nib_ref_edge(a), nib_cuda_edge(a, be->stream)); }
nib_status nib_be_expert(nib_be *be, const nib_expert_args *a, void *ws, uint64_t ws_bytes) {
    if (be->kind == NIB_BE_REF)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "expert kernel: CUDA only (the reference runs the per-op sequence)");
    return nib_cuda_expert_run(a, ws, ws_bytes, be->stream);
}
nib_status nib_be_check_finite(nib_be *be, const nib_check_finite_args *a, void *ws, nib_finite_result *out) {
    DISPATCH(nib_ref_check_finite(a, out), nib_cuda_check_finite(a, ws, out, be->stream));
}

/* ---- graphs and events ------------------------------------------------------------------- */
#ifdef NIB_HAVE_CUDA
struct nib_be_graph {
    cudaGraph_t g;
    cudaGraphExec_t ge;
};
struct nib_be_event {
    cudaEvent_t e;
};

nib_status nib_be_capture_begin(nib_be *be) {
    if (be->kind != NIB_BE_CUDA) return NIB_ERR(NIB_ERR_UNSUPPORTED, "graph capture needs the CUDA backend");
    NIB_CUDA_CHECK(cudaStreamBeginCapture((cudaStream_t)be->stream, cudaStreamCaptureModeThreadLocal));
    return NIB_OK;
}

void nib_be_capture_abort(nib_be *be) {
    cudaGraph_t g = NULL;
    if (cudaStreamEndCapture((cudaStream_t)be->stream, &g) == cudaSuccess && g)
        cudaGraphDestroy(g); /* unchecked: discarding an aborted capture */
    cudaGetLastError(); /* unchecked: clearing the capture error on an abort path */
}

nib_status nib_be_capture_end(nib_be *be, nib_be_graph **out) {
    nib_status st = NIB_OK;
    *out = NULL;
    nib_be_graph *gr = calloc(1, sizeof *gr);
    if (!gr) {
        nib_be_capture_abort(be);
        return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "graph: host allocation");
    }
    NIB_CUDA_TRY(cudaStreamEndCapture((cudaStream_t)be->stream, &gr->g));
    /* node priorities: the streams' (nib_be_init), not the launching stream's for every node */
    NIB_CUDA_TRY(cudaGraphInstantiate(&gr->ge, gr->g, cudaGraphInstantiateFlagUseNodePriority));
    *out = gr;
    return NIB_OK;
fail:
    nib_be_graph_free(gr);
    return st;
}

nib_status nib_be_graph_launch(nib_be *be, nib_be_graph *g) {
    NIB_CUDA_CHECK(cudaGraphLaunch(g->ge, (cudaStream_t)be->stream));
    return NIB_OK;
}

void nib_be_graph_free(nib_be_graph *g) {
    if (!g) return;
    if (g->ge) cudaGraphExecDestroy(g->ge); /* unchecked: teardown, no status */
    if (g->g) cudaGraphDestroy(g->g);       /* unchecked: teardown, no status */
    free(g);
}

nib_status nib_be_event_create(nib_be_event **e) {
    *e = calloc(1, sizeof **e);
    if (!*e) return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "event: host allocation");
    cudaError_t ce = cudaEventCreate(&(*e)->e);
    if (ce != cudaSuccess) {
        free(*e);
        *e = NULL;
        return nib_cuda_status((int)ce, "cudaEventCreate", __FILE__, __LINE__);
    }
    return NIB_OK;
}
void nib_be_event_free(nib_be_event *e) {
    if (!e) return;
    cudaEventDestroy(e->e); /* unchecked: teardown, no status */
    free(e);
}
nib_status nib_be_event_record(nib_be *be, nib_be_event *e) {
    /* inside a stream capture a plain record only orders work; the External flag makes it a
     * real event-record node, so the replayed graph stamps the event (stage timing) */
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    NIB_CUDA_CHECK(cudaStreamIsCapturing((cudaStream_t)be->stream, &cap));
    if (cap == cudaStreamCaptureStatusActive)
        NIB_CUDA_CHECK(cudaEventRecordWithFlags(e->e, (cudaStream_t)be->stream, cudaEventRecordExternal));
    else
        NIB_CUDA_CHECK(cudaEventRecord(e->e, (cudaStream_t)be->stream));
    return NIB_OK;
}
nib_status nib_be_event_ms(nib_be_event *a, nib_be_event *b, float *ms) {
    NIB_CUDA_CHECK(cudaEventElapsedTime(ms, a->e, b->e));
    return NIB_OK;
}

/* the side stream's scratch in, or back out (nib_be_side_scratch gave it one) */
static void swap_scratch(nib_be *be) {
    if (!be->has_side_sc) return;
    const nib_be_scratch t = be->sc;
    be->sc = be->alt_sc, be->alt_sc = t;
    nib_blas_swap_workspace(be->blas);
}

nib_status nib_be_fork(nib_be *be) {
    if (be->kind != NIB_BE_CUDA) return NIB_OK;
    if (be->stream != be->main_stream) return NIB_ERR(NIB_ERR_INVALID_ARG, "backend fork: already forked");
    NIB_CUDA_CHECK(cudaEventRecord((cudaEvent_t)be->ev_fork, (cudaStream_t)be->main_stream));
    NIB_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)be->side_stream, (cudaEvent_t)be->ev_fork, 0));
    be->stream = be->side_stream;
    swap_scratch(be);
    return NIB_OK;
}
void nib_be_fork_end(nib_be *be) {
    if (be->kind != NIB_BE_CUDA || be->stream == be->main_stream) return;
    be->stream = be->main_stream;
    swap_scratch(be);
}
nib_status nib_be_join(nib_be *be) {
    if (be->kind != NIB_BE_CUDA) return NIB_OK;
    if (be->stream != be->main_stream) return NIB_ERR(NIB_ERR_INVALID_ARG, "backend join: still on the side stream");
    NIB_CUDA_CHECK(cudaEventRecord((cudaEvent_t)be->ev_join, (cudaStream_t)be->side_stream));
    NIB_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)be->main_stream, (cudaEvent_t)be->ev_join, 0));
    return NIB_OK;
}
#else
struct nib_be_graph {
    int unused;
};
struct nib_be_event {
    int unused;
};
nib_status nib_be_capture_begin(nib_be *be) {
    (void)be;
    return NIB_ERR(NIB_ERR_UNSUPPORTED, "graph capture needs the CUDA backend");
}
void nib_be_capture_abort(nib_be *be) { (void)be; }
nib_status nib_be_capture_end(nib_be *be, nib_be_graph **out) {
    (void)be;
    *out = NULL;
    return NIB_ERR(NIB_ERR_UNSUPPORTED, "graph capture needs the CUDA backend");
}
nib_status nib_be_graph_launch(nib_be *be, nib_be_graph *g) {
    (void)be, (void)g;
    return NIB_ERR(NIB_ERR_UNSUPPORTED, "graphs need the CUDA backend");
}
void nib_be_graph_free(nib_be_graph *g) { (void)g; }
nib_status nib_be_event_create(nib_be_event **e) {
    *e = NULL;
    return NIB_ERR(NIB_ERR_UNSUPPORTED, "events need the CUDA backend");
}
void nib_be_event_free(nib_be_event *e) { (void)e; }
nib_status nib_be_event_record(nib_be *be, nib_be_event *e) {
    (void)be, (void)e;
    return NIB_ERR(NIB_ERR_UNSUPPORTED, "events need the CUDA backend");
}
nib_status nib_be_event_ms(nib_be_event *a, nib_be_event *b, float *ms) {
    (void)a, (void)b;
    *ms = 0;
    return NIB_ERR(NIB_ERR_UNSUPPORTED, "events need the CUDA backend");
}
nib_status nib_be_fork(nib_be *be) {
    (void)be;
    return NIB_OK;
}
void nib_be_fork_end(nib_be *be) { (void)be; }
nib_status nib_be_join(nib_be *be) {
    (void)be;
    return NIB_OK;
}
#endif
