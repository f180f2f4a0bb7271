/* blas.cu — cuBLASLt baselines (bf16 GEMM) and the FP8 W8A8 GEMM used for the compute-bound
 * prefix / vision shapes, plus the bf16 -> e4m3 per-token activation quantizer it needs.
 *
 * Row-major Y[M,N] = X[M,K] · W[N,K]ᵀ is column-major Yᵀ[N,M] = op(W)·X with op = transpose:
 * A = W (K-major, "T"), B = X (K-major, "N"), D = Y with leading dimension N. FP8 requires
 * exactly this TN form. Per-channel weight / per-token activation scales use cuBLASLt's
 * OUTER_VEC_32F scale mode (scale_A[n] * scale_B[m] multiplies D[n, m]).
 * Tested by tests/test_gemm_gpu.c (blas_*), timed by `nib bench gemm`.
 */
#include <cfloat>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <string.h>

#include "base/base.h"
#include "ops/cuda/fp8_rows.cuh"
#include "ops/gemm.h"
#include "runtime/cuda_check.h"
#include "runtime/ktrace.cuh"
#include "runtime/launch.cuh"
#include "runtime/device.h"

#define NIB_BLAS_WS_BYTES (32u << 20)
#define NIB_BLAS_CACHE 64

static int env_fast_accum(void);
static nib_status blas_status(cublasStatus_t s, const char *what, const char *file, int line) {
    return nib_set_error(s == CUBLAS_STATUS_ALLOC_FAILED ? NIB_ERR_DEVICE_OOM : NIB_ERR_CUDA, file, line,
                         "%s failed with cuBLAS status %d (%s)", what, (int)s, cublasLtGetStatusString(s));
}
#define NIB_BLAS_CHECK(call)                                                                  \
    do {                                                                                      \
        cublasStatus_t nib_bs_ = (call);                                                      \
        if (nib_bs_ != CUBLAS_STATUS_SUCCESS) return blas_status(nib_bs_, #call, __FILE__, __LINE__); \
    } while (0)

typedef struct blas_plan {
    int used;
    int kind; /* 0 bf16, 1 fp8 */
    int64_t m, n, k;
    int sx_vec, sw_vec;
    int fast;          /* fp8: CUBLASLT_MATMUL_DESC_FAST_ACCUM */
    int bias;          /* CUBLASLT_EPILOGUE_BIAS with a bf16 bias vector */
    int64_t ldc, ldd;  /* ldc 0: no C (beta = 0); -1: C is D (in place, one descriptor) */
    int unsupported;   /* cuBLASLt has no algorithm for this combination (remembered) */
    int algo_index;    /* which heuristic candidate (0: cuBLASLt's first choice; the lab's --algos) */
    int cfg_on;        /* the algorithm is cfg (the lab's --lt-configs), not a heuristic candidate */
    nib_blas_algo_desc cfg;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasLtMatmulAlgo_t algo;
} blas_plan;

struct nib_blas {
    cublasLtHandle_t lt;
    void *ws;       /* the workspace of the products enqueued now */
    void *ws_alt;   /* nib_blas_add_workspace: the other stream's (nib_blas_swap_workspace) */
    blas_plan cache[NIB_BLAS_CACHE];
    int next;
    int fast_accum; /* FP8 products without periodic promotion (see "FP8 accumulation") */
    int algo_index; /* heuristic candidate for plans made from now on (nib_blas_set_algo_index) */
    int fp8_engine; /* nib_blas_set_fp8_engine */
    int tune;       /* nib_blas_tune_on() at creation: the measured reconfigurations (nib_blas_tune_for) */
    int sms;        /* the device's SM count */
    int tuned_plans; /* plans that run a reconfiguration of nib_blas_tune_for (nib_blas_tuned_plans) */
    int cfg_on;     /* nib_blas_set_algo_config: plans made from now on use cfg */
    nib_blas_algo_desc cfg;
};

#define NIB_BLAS_MAX_ALGOS 32

nib_status nib_blas_create(nib_blas **out) {
    *out = NULL;
    nib_device_info di;
    NIB_RETURN_IF_ERR(nib_device_require(&di));
    nib_blas *b = (nib_blas *)calloc(1, sizeof *b);
    if (!b) return NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "nib_blas_create: host allocation");
    cublasStatus_t s = cublasLtCreate(&b->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(b);
        return blas_status(s, "cublasLtCreate", __FILE__, __LINE__);
    }
    b->fast_accum = env_fast_accum();
    b->tune = nib_blas_tune_on();
    b->sms = di.sm_count;
    nib_status st = nib_dev_malloc(&b->ws, NIB_BLAS_WS_BYTES, "cuBLASLt workspace");
    if (st) {
        cublasLtDestroy(b->lt); /* unchecked: cleanup after a failed allocation, whose error is returned */
        free(b);
        return st;
    }
    *out = b;
    return NIB_OK;
}

nib_status nib_blas_add_workspace(nib_blas *b) {
    if (b->ws_alt) return NIB_ERR(NIB_ERR_INVALID_ARG, "nib_blas_add_workspace: the handle has two already");
    return nib_dev_malloc(&b->ws_alt, NIB_BLAS_WS_BYTES, "cuBLASLt workspace (second stream)");
}

void nib_blas_swap_workspace(nib_blas *b) {
    if (!b->ws_alt) return;
    void *t = b->ws;
    b->ws = b->ws_alt, b->ws_alt = t;
}

static void plan_release(blas_plan *p) {
    if (!p->used) return;
    /* a plan whose creation failed part-way has only some of its descriptors */
    if (p->op) cublasLtMatmulDescDestroy(p->op);  /* unchecked: releasing a plan; nothing to do on failure */
    if (p->a) cublasLtMatrixLayoutDestroy(p->a); /* unchecked: releasing a plan */
    if (p->b) cublasLtMatrixLayoutDestroy(p->b); /* unchecked: releasing a plan */
    if (p->d) cublasLtMatrixLayoutDestroy(p->d); /* unchecked: releasing a plan */
    if (p->c) cublasLtMatrixLayoutDestroy(p->c); /* unchecked: releasing a plan */
    memset(p, 0, sizeof *p);
}

void nib_blas_free(nib_blas *b) {
    if (!b) return;
    for (int i = 0; i < NIB_BLAS_CACHE; i++) plan_release(&b->cache[i]);
    nib_dev_free(b->ws, NIB_BLAS_WS_BYTES);
    nib_dev_free(b->ws_alt, NIB_BLAS_WS_BYTES);
    cublasLtDestroy(b->lt); /* unchecked: teardown; a free function has no status to return */
    free(b);
}

/* FP8 accumulation. By default cuBLASLt's FP8 kernels periodically move the tensor cores'
 * partial sums into fp32 registers ("promotion"): Hopper's FP8 MMA accumulates with fewer bits
 * than fp32. nib turns that off (CUBLASLT_MATMUL_DESC_FAST_ACCUM), as inference stacks commonly
 * do for forward passes: at the Pi0.5 prefix shapes it measured 1.2-1.4x faster (`nib bench
 * gemm`, M = 532: 2048 -> 32768 93.3 -> 76.7 us, 16384 -> 2048 58.2 -> 41.5 us) and the fast
 * preset's actions stay within the accuracy targets (`nib accuracy pi05`, docs/design.md).
 * NIB_BLAS_FAST_ACCUM=0 (read when a handle is created) or nib_blas_set_fp8_fast_accum restores the
 * promoting kernels. */
static int env_fast_accum(void) {
    const char *e = getenv("NIB_BLAS_FAST_ACCUM");
    return e && *e ? atoi(e) != 0 : 1;
}

void nib_blas_set_fp8_engine(nib_blas *b, int engine) {
    if (b) b->fp8_engine = engine;
}

void nib_blas_set_fp8_fast_accum(nib_blas *b, int on) {
    if (b) b->fast_accum = on != 0;
}
int nib_blas_fp8_fast_accum(const nib_blas *b) { return b ? b->fast_accum : 0; }

/* sx/sw: the scale pointers of the first call. They are set before the heuristic runs: an
 * FP8 algorithm chosen without scale pointers is not valid once they are set (cuBLASLt then
 * answers NOT_SUPPORTED), and OUTER_VEC mode without pointers is rejected outright. */
/* The matmul descriptor and the four layouts of one product, into p (p->used is set on every
 * path, so plan_release frees what was created). */
static nib_status plan_descs(blas_plan *p, int kind, int64_t m, int64_t n, int64_t k, int sx_vec, int sw_vec,
                             const float *sx, const float *sw, const void *bias, int64_t ldc, int64_t ldd,
                             int fast) {
    p->used = 1;
    cudaDataType_t ab = kind ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    NIB_BLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (kind) {
        /* scalar scales: leave the mode attributes at their default (setting SCALAR_32F
         * explicitly made cuBLASLt 13 answer NOT_SUPPORTED at matmul time on H100) */
        int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if (sw_vec)
            NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec));
        if (sx_vec)
            NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec));
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx));
        const int8_t fa = (int8_t)fast;
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
    }
    if (bias) {
        /* bias type left at its default, bf16 (the D type; an fp32 bias is refused on H100 with
         * cuBLASLt 13: INVALID_VALUE for bf16, NOT_SUPPORTED for fp8 inputs) */
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, (uint64_t)k, (uint64_t)n, k));
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, (uint64_t)k, (uint64_t)m, k));
    NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_16BF, (uint64_t)n, (uint64_t)m, ldd));
    if (ldc > 0) NIB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, (uint64_t)n, (uint64_t)m, ldc));
    return NIB_OK;
}

/* cuBLASLt's heuristic candidates for the product in p (at most max, max <= NIB_BLAS_MAX_ALGOS),
 * limited to nib's workspace. *st is the heuristic's status (the caller decides what a failure
 * means); a failure to set the preference is returned as an error. */
static nib_status plan_heuristic(nib_blas *b, const blas_plan *p, int64_t ldc, int max,
                                 cublasLtMatmulHeuristicResult_t *res, int *found, cublasStatus_t *st) {
    cublasLtMatmulPreference_t pref;
    NIB_BLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = NIB_BLAS_WS_BYTES;
    /* checked: without the workspace limit the heuristic may pick an algorithm needing more
     * workspace than nib passes, and the matmul would then fail */
    cublasStatus_t ps = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                             sizeof wsb);
    if (ps != CUBLAS_STATUS_SUCCESS) {
        cublasLtMatmulPreferenceDestroy(pref); /* unchecked: cleanup; the first error is returned */
        return blas_status(ps, "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", __FILE__, __LINE__);
    }
    *found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(b->lt, p->op, p->a, p->b, ldc > 0 ? p->c : p->d, p->d, pref, max, res, found); /* unchecked: returned in *st, tested by the callers */
    *st = hs;
    cublasLtMatmulPreferenceDestroy(pref); /* unchecked: only the heuristic used it */
    return NIB_OK;
}

static uint32_t algo_attr(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0; /* every attribute read here is 16 or 32 bits wide: a zeroed 32-bit buffer holds either */
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(a, attr, &v, sizeof v, &written) != CUBLAS_STATUS_SUCCESS) return 0;
    return written == 2 ? (v & 0xFFFFu) : v;
}

static void desc_of(const cublasLtMatmulHeuristicResult_t *r, nib_blas_algo_desc *d) {
    memset(d, 0, sizeof *d);
    d->id = (int)algo_attr(&r->algo, CUBLASLT_ALGO_CONFIG_ID);
    d->tile = (int)algo_attr(&r->algo, CUBLASLT_ALGO_CONFIG_TILE_ID);
    d->stages = (int)algo_attr(&r->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID);
    d->splitk = (int)algo_attr(&r->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    d->reduction = (int)algo_attr(&r->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    d->swizzle = (int)algo_attr(&r->algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING);
    d->custom = (int)algo_attr(&r->algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
    d->cluster = (int)algo_attr(&r->algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
    d->inner = (int)algo_attr(&r->algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID);
    d->waves = r->wavesCount;
    d->workspace = (uint64_t)r->workspaceSize;
}

static int same_config(const nib_blas_algo_desc *x, const nib_blas_algo_desc *y) {
    return x->id == y->id && x->tile == y->tile && x->stages == y->stages && x->splitk == y->splitk &&
           x->reduction == y->reduction && x->swizzle == y->swizzle && x->custom == y->custom &&
           x->cluster == y->cluster && x->inner == y->inner && x->base == y->base;
}

static void algo_types(int kind, cudaDataType_t *ab) { *ab = kind ? CUDA_R_8F_E4M3 : CUDA_R_16BF; }

/* cuBLASLt algorithm `d`: a copy of `base` (a heuristic candidate: cublasLtMatmulAlgoInit leaves
 * fields the Hopper kernels need unset, and cuBLASLt refuses what it builds) with d's tile, stages,
 * split-K, swizzle, custom option and cluster shape, checked against the plan's descriptors;
 * NIB_ERR_UNSUPPORTED when cuBLASLt refuses it or it needs more workspace than nib's */
static nib_status config_algo(nib_blas *b, const blas_plan *p, int64_t ldc, const nib_blas_algo_desc *d,
                              const cublasLtMatmulAlgo_t *base, cublasLtMatmulAlgo_t *algo, uint64_t *ws,
                              float *waves) {
    *algo = *base;
    const uint32_t tile = (uint32_t)d->tile, stages = (uint32_t)d->stages, red = (uint32_t)d->reduction,
                   sw = (uint32_t)d->swizzle, custom = (uint32_t)d->custom;
    const int32_t sk = d->splitk;
    const uint16_t cl = (uint16_t)d->cluster;
    cublasStatus_t s = cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sw, sizeof sw);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl);
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoCheck(b->lt, p->op, p->a, p->b, ldc > 0 ? p->c : p->d, p->d, algo, &r);
    if (s != CUBLAS_STATUS_SUCCESS || r.workspaceSize > NIB_BLAS_WS_BYTES)
        return NIB_ERR(NIB_ERR_UNSUPPORTED,
                       "cuBLASLt refuses candidate %d reconfigured (algorithm %d, tile %d, stages %d, split-K %d, "
                       "custom %d, cluster %d) for M=%lld N=%lld K=%lld (status %d, workspace %llu)",
                       d->base, d->id, d->tile, d->stages, d->splitk, d->custom, d->cluster, (long long)p->m,
                       (long long)p->n, (long long)p->k, (int)s, (unsigned long long)r.workspaceSize);
    if (ws) *ws = r.workspaceSize;
    if (waves) *waves = r.wavesCount;
    return NIB_OK;
}

/* the cache key of plan p */
static void plan_key(blas_plan *p, int kind, int64_t m, int64_t n, int64_t k, int sx_vec, int sw_vec, int fast,
                     int has_bias, int64_t ldc, int64_t ldd, int ai) {
    p->kind = kind;
    p->m = m;
    p->n = n;
    p->k = k;
    p->sx_vec = sx_vec;
    p->sw_vec = sw_vec;
    p->fast = fast;
    p->bias = has_bias;
    p->ldc = ldc;
    p->ldd = ldd;
    p->algo_index = ai;
}

static nib_status plan_get(nib_blas *b, int kind, int64_t m, int64_t n, int64_t k, int sx_vec,
                           int sw_vec, const float *sx, const float *sw, const void *bias, int64_t ldc,
                           int64_t ldd, blas_plan **out) {
    const int has_bias = bias != NULL, fast = kind ? b->fast_accum : 0;
    const int ai = b->algo_index > 0 ? b->algo_index : 0;
    for (int i = 0; i < NIB_BLAS_CACHE; i++) {
        blas_plan *p = &b->cache[i];
        if (p->used && p->kind == kind && p->m == m && p->n == n && p->k == k && p->sx_vec == sx_vec &&
            p->sw_vec == sw_vec && p->fast == fast && p->bias == has_bias && p->ldc == ldc && p->ldd == ldd &&
            p->algo_index == ai && p->cfg_on == b->cfg_on && (!b->cfg_on || same_config(&p->cfg, &b->cfg))) {
            if (p->unsupported)
                return NIB_ERR(NIB_ERR_UNSUPPORTED, "cuBLASLt has no %s algorithm for M=%lld N=%lld K=%lld%s%s",
                               kind ? "fp8" : "bf16", (long long)m, (long long)n, (long long)k,
                               has_bias ? " with a bias epilogue" : "", ldc ? " with C" : "");
            *out = p;
            return NIB_OK;
        }
    }
    blas_plan *p = &b->cache[b->next];
    b->next = (b->next + 1) % NIB_BLAS_CACHE;
    plan_release(p);
    nib_status ds = plan_descs(p, kind, m, n, k, sx_vec, sw_vec, sx, sw, bias, ldc, ldd, fast);
    if (ds) {
        plan_release(p);
        return ds;
    }
    if (b->cfg_on) { /* the lab's configuration: checked, never replaced by another */
        plan_key(p, kind, m, n, k, sx_vec, sw_vec, fast, has_bias, ldc, ldd, ai);
        cublasLtMatmulHeuristicResult_t hr[NIB_BLAS_MAX_ALGOS];
        int hn = 0;
        cublasStatus_t hs = CUBLAS_STATUS_SUCCESS;
        const int base = b->cfg.base > 0 && b->cfg.base < NIB_BLAS_MAX_ALGOS ? b->cfg.base : 0;
        ds = plan_heuristic(b, p, ldc, base + 1, hr, &hn, &hs);
        if (!ds && (hs != CUBLAS_STATUS_SUCCESS || hn <= base))
            ds = NIB_ERR(NIB_ERR_UNSUPPORTED, "cuBLASLt offers no candidate %d for M=%lld N=%lld K=%lld (status %d)",
                         base, (long long)m, (long long)n, (long long)k, (int)hs);
        if (!ds) ds = config_algo(b, p, ldc, &b->cfg, &hr[base].algo, &p->algo, NULL, NULL);
        if (ds) {
            plan_release(p);
            return ds;
        }
        p->cfg_on = 1;
        p->cfg = b->cfg;
        *out = p;
        return NIB_OK;
    }
    cublasLtMatmulHeuristicResult_t res[NIB_BLAS_MAX_ALGOS];
    int found = 0;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    ds = plan_heuristic(b, p, ldc, ai + 1, res, &found, &s);
    if (ds) {
        plan_release(p);
        return ds;
    }
    /* an epilogue cuBLASLt does not offer for this type combination is remembered as such (the
     * caller then runs the plain product and nib's epilogue kernel); other failures are errors */
    const int unsup = (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE ||
                       (s == CUBLAS_STATUS_SUCCESS && !found)) && (has_bias || ldc);
    plan_key(p, kind, m, n, k, sx_vec, sw_vec, fast, has_bias, ldc, ldd, ai);
    if (unsup) {
        p->unsupported = 1;
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "cuBLASLt has no %s algorithm for M=%lld N=%lld K=%lld%s%s (status %d)",
                       kind ? "fp8" : "bf16", (long long)m, (long long)n, (long long)k,
                       has_bias ? " with a bias epilogue" : "", ldc ? " with C" : "", (int)s);
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        plan_release(p);
        return blas_status(s, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    }
    if (!found) {
        plan_release(p);
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "cuBLASLt has no %s algorithm for M=%lld N=%lld K=%lld",
                       kind ? "fp8" : "bf16", (long long)m, (long long)n, (long long)k);
    }
    if (found <= ai) {
        plan_release(p);
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "cuBLASLt offers %d %s algorithm(s) for M=%lld N=%lld K=%lld, not candidate %d",
                       found, kind ? "fp8" : "bf16", (long long)m, (long long)n, (long long)k, ai);
    }
    p->algo = res[ai].algo;
    nib_blas_tune t;
    if (ai == 0 && b->tune && nib_blas_tune_for(kind, m, n, k, b->sms, &t)) {
        /* the rule's candidate (a later one than the first: asked for now) */
        int tb = t.base;
        cublasLtMatmulHeuristicResult_t tres[NIB_BLAS_MAX_ALGOS];
        const cublasLtMatmulHeuristicResult_t *tr = &res[0];
        if (tb > 0) {
            int tf = 0;
            cublasStatus_t ts = CUBLAS_STATUS_SUCCESS;
            if (tb >= NIB_BLAS_MAX_ALGOS || plan_heuristic(b, p, ldc, tb + 1, tres, &tf, &ts) ||
                ts != CUBLAS_STATUS_SUCCESS || tf <= tb) {
                nib_clear_error();
                tb = -1; /* not offered: the warning below, the first candidate runs */
            } else
                tr = &tres[tb];
        }
        nib_blas_algo_desc d;
        desc_of(tr, &d);
        d.base = tb;
        if (t.tile) d.tile = t.tile;
        if (t.custom >= 0) d.custom = t.custom;
        d.cluster = t.cluster;
        if (t.swizzle) d.swizzle = t.swizzle;
        if (t.splitk) {
            d.splitk = t.splitk;
            d.reduction = t.reduction;
        }
        cublasLtMatmulAlgo_t tuned;
        if (tb < 0) {
            NIB_LOGW("cuBLASLt offers no heuristic candidate %d for the %s product M=%lld N=%lld K=%lld, which nib's "
                     "measured configuration starts from; running its first choice", t.base, kind ? "fp8" : "bf16",
                     (long long)m, (long long)n, (long long)k);
            p->algo = res[0].algo;
        } else if (!config_algo(b, p, ldc, &d, &tr->algo, &tuned, NULL, NULL)) {
            p->algo = tuned;
            b->tuned_plans++;
        } else { /* another cuBLASLt than the one measured: its own pick, said once per plan */
            NIB_LOGW("cuBLASLt refused nib's measured configuration for the %s product M=%lld N=%lld K=%lld "
                     "(%s); running its heuristic's choice", kind ? "fp8" : "bf16", (long long)m, (long long)n,
                     (long long)k, nib_last_error());
            nib_clear_error();
        }
    }
    *out = p;
    return NIB_OK;
}

int nib_blas_tuned_plans(const nib_blas *b) { return b ? b->tuned_plans : 0; }

void nib_blas_set_algo_config(nib_blas *b, const nib_blas_algo_desc *d) {
    if (!b) return;
    b->cfg_on = d != NULL;
    if (d) b->cfg = *d;
}

void nib_blas_set_algo_index(nib_blas *b, int i) {
    if (b) b->algo_index = i > 0 ? (i < NIB_BLAS_MAX_ALGOS ? i : NIB_BLAS_MAX_ALGOS - 1) : 0;
}



nib_status nib_blas_algos(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx, const float *sw,
                          nib_blas_algo_desc *out, int max, int *count) {
    *count = 0;
    if (!b || !out || max < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "blas algos: NULL handle/output or max < 1");
    if (m < 1 || n < 1 || k < 1) return NIB_ERR(NIB_ERR_SHAPE, "blas algos: M=%lld N=%lld K=%lld", (long long)m,
                                              (long long)n, (long long)k);
    if (fp8 && (!sx || !sw)) return NIB_ERR(NIB_ERR_INVALID_ARG, "blas algos: fp8 needs its scale pointers");
    if (max > NIB_BLAS_MAX_ALGOS) max = NIB_BLAS_MAX_ALGOS;
    blas_plan p;
    memset(&p, 0, sizeof p);
    nib_status st = plan_descs(&p, fp8, m, n, k, fp8, fp8, sx, sw, NULL, 0, n, fp8 ? b->fast_accum : 0);
    cublasLtMatmulHeuristicResult_t res[NIB_BLAS_MAX_ALGOS];
    int found = 0;
    cublasStatus_t hs = CUBLAS_STATUS_SUCCESS;
    if (!st) st = plan_heuristic(b, &p, 0, max, res, &found, &hs);
    if (!st && hs != CUBLAS_STATUS_SUCCESS) st = blas_status(hs, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    for (int i = 0; !st && i < found; i++) desc_of(&res[i], &out[i]);
    if (!st) *count = found;
    plan_release(&p);
    return st;
}

/* an algorithm capability that is an array of uint32 (tile or stage ids): at most max into out */
static int cap_ids(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoCapAttributes_t attr, uint32_t *out, int max) {
    size_t bytes = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(a, attr, NULL, 0, &bytes) != CUBLAS_STATUS_SUCCESS) return 0;
    int n = (int)(bytes / sizeof(uint32_t));
    if (n > max) n = max;
    if (n < 1) return 0;
    size_t w = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(a, attr, out, (size_t)n * sizeof(uint32_t), &w) != CUBLAS_STATUS_SUCCESS) return 0;
    return (int)(w / sizeof(uint32_t));
}

static int32_t cap_i32(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoCapAttributes_t attr) {
    int32_t v = 0;
    size_t w = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(a, attr, &v, sizeof v, &w) != CUBLAS_STATUS_SUCCESS) return 0;
    return v;
}

nib_status nib_blas_configs(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx, const float *sw,
                            nib_blas_algo_desc *out, int max, int *count) {
    *count = 0;
    if (!b || !out || max < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "blas configs: NULL handle/output or max < 1");
    if (m < 1 || n < 1 || k < 1) return NIB_ERR(NIB_ERR_SHAPE, "blas configs: M=%lld N=%lld K=%lld", (long long)m,
                                              (long long)n, (long long)k);
    if (fp8 && (!sx || !sw)) return NIB_ERR(NIB_ERR_INVALID_ARG, "blas configs: fp8 needs its scale pointers");
    blas_plan p;
    memset(&p, 0, sizeof p);
    nib_status st = plan_descs(&p, fp8, m, n, k, fp8, fp8, sx, sw, NULL, 0, n, fp8 ? b->fast_accum : 0);
    p.kind = fp8;
    p.m = m;
    p.n = n;
    p.k = k;
    cudaDataType_t ab;
    algo_types(fp8, &ab);
    enum { BASES = 8 };
    cublasLtMatmulHeuristicResult_t res[BASES];
    int found = 0;
    cublasStatus_t hs = CUBLAS_STATUS_SUCCESS;
    if (!st) st = plan_heuristic(b, &p, 0, BASES, res, &found, &hs);
    if (!st && hs != CUBLAS_STATUS_SUCCESS) st = blas_status(hs, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    const char *dbg_env = getenv("NIB_LT_DEBUG");
    const int dbg = dbg_env && *dbg_env == '1';
    /* cluster shapes tried: auto, 1x1, 2x1, 1x2, 2x2, 4x1, 1x4 (cuBLASLt has no capability listing them) */
    static const int clusters[] = {0, 2, 3, 5, 6, 4, 8};
    static const int splits[] = {1, 2, 3, 4};
    static const uint32_t reds[] = {CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, CUBLASLT_REDUCTION_SCHEME_INPLACE};
    for (int bi = 0; bi < found && !st && *count < max; bi++) {
        nib_blas_algo_desc hd;
        desc_of(&res[bi], &hd);
        cublasLtMatmulAlgo_t a;
        if (cublasLtMatmulAlgoInit(b->lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab, ab, CUDA_R_16BF, CUDA_R_16BF, hd.id, &a) !=
            CUBLAS_STATUS_SUCCESS)
            continue;
        /* tiles: the algorithm's list and the candidate's own; stages: the candidate's */
        uint32_t tiles[129];
        int nt = cap_ids(&a, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, 128), have = 0;
        /* an algorithm that lists no tile (the Hopper FP8 kernels list only "undefined") may
         * still accept several: every tile id is tried, cublasLtMatmulAlgoCheck decides */
        if (nt <= 1 && (nt == 0 || tiles[0] == CUBLASLT_MATMUL_TILE_UNDEFINED))
            for (nt = 0; nt + 1 < CUBLASLT_MATMUL_TILE_8x256 + 1 && nt < 128; nt++) tiles[nt] = (uint32_t)(nt + 1);
        for (int i = 0; i < nt; i++) have |= tiles[i] == (uint32_t)hd.tile;
        if (!have) tiles[nt++] = (uint32_t)hd.tile;
        const int sk_ok = cap_i32(&a, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0;
        const uint32_t red_mask = (uint32_t)cap_i32(&a, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
        const int sw_ok = cap_i32(&a, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) != 0;
        int cmax = cap_i32(&a, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX);
        if (cmax < 0) cmax = 0;
        if (cmax > 15) cmax = 15;
        if (dbg) fprintf(stderr, "lt: candidate %d: algorithm %d tile %d stages %d custom %d cluster %d; %d tiles, split-K %d (0x%x), swizzle %d, custom max %d\n",
                         bi, hd.id, hd.tile, hd.stages, hd.custom, hd.cluster, nt, sk_ok, red_mask, sw_ok, cmax);
        int tried = 0, ok = 0;
        /* each candidate gets an equal share of max (what the earlier ones leave unused passes on) */
        const int lim = *count + (max - *count) / (found - bi);
        for (int ti = 0; ti < nt && *count < lim; ti++)
            for (int cu = 0; cu <= cmax && *count < lim; cu++)
                for (int ci = 0; ci < (int)(sizeof clusters / sizeof clusters[0]) && *count < lim; ci++)
                    for (int sz = 0; sz <= sw_ok && *count < lim; sz++)
                        for (int ki = 0; ki < (sk_ok ? (int)(sizeof splits / sizeof splits[0]) : 1) && *count < lim; ki++)
                            for (int ri = 0; ri < (splits[ki] > 1 ? 2 : 1) && *count < lim; ri++) {
                                if (splits[ki] > 1 && !(red_mask & reds[ri])) continue;
                                nib_blas_algo_desc d = hd;
                                d.base = bi;
                                d.tile = (int)tiles[ti];
                                d.custom = cu;
                                d.cluster = clusters[ci];
                                d.swizzle = sz;
                                d.splitk = splits[ki];
                                d.reduction = splits[ki] > 1 ? (int)reds[ri] : 0;
                                cublasLtMatmulAlgo_t algo;
                                tried++;
                                if (config_algo(b, &p, 0, &d, &res[bi].algo, &algo, &d.workspace, &d.waves)) {
                                    nib_clear_error();
                                    continue;
                                }
                                ok++;
                                out[(*count)++] = d;
                            }
        if (dbg) fprintf(stderr, "lt: candidate %d: %d of %d configurations accepted\n", bi, ok, tried);
    }
    plan_release(&p);
    return st;
}

/* Lab (--lt-search): the plain product's descriptors in *p and the heuristic's first base + 1
 * candidates in res (the caller releases p); `what` names the caller in the errors */
static nib_status lab_candidates(nib_blas *b, const char *what, int fp8, int64_t m, int64_t n, int64_t k, const float *sx,
                                 const float *sw, int base, blas_plan *p, cublasLtMatmulHeuristicResult_t *res) {
    memset(p, 0, sizeof *p);
    if (!b) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: NULL handle", what);
    if (m < 1 || n < 1 || k < 1)
        return NIB_ERR(NIB_ERR_SHAPE, "%s: M=%lld N=%lld K=%lld", what, (long long)m, (long long)n, (long long)k);
    if (fp8 && (!sx || !sw)) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: fp8 needs its scale pointers", what);
    if (base < 0 || base >= NIB_BLAS_MAX_ALGOS) return NIB_ERR(NIB_ERR_INVALID_ARG, "%s: base candidate %d", what, base);
    nib_status st = plan_descs(p, fp8, m, n, k, fp8, fp8, sx, sw, NULL, 0, n, fp8 ? b->fast_accum : 0);
    p->kind = fp8;
    p->m = m;
    p->n = n;
    p->k = k;
    int found = 0;
    cublasStatus_t hs = CUBLAS_STATUS_SUCCESS;
    if (!st) st = plan_heuristic(b, p, 0, base + 1, res, &found, &hs);
    if (!st && hs != CUBLAS_STATUS_SUCCESS) st = blas_status(hs, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    if (!st && found <= base)
        st = NIB_ERR(NIB_ERR_UNSUPPORTED, "%s: the heuristic offers %d candidates, not %d", what, found, base + 1);
    return st;
}

/* Lab (--lt-search): is configuration *d (derived from heuristic candidate d->base) accepted for
 * the plain product? Fills d's workspace and wave count when it is. */
nib_status nib_blas_config_check(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx,
                                 const float *sw, nib_blas_algo_desc *d) {
    if (!d) return NIB_ERR(NIB_ERR_INVALID_ARG, "blas config check: NULL config");
    blas_plan p;
    cublasLtMatmulHeuristicResult_t res[NIB_BLAS_MAX_ALGOS];
    nib_status st = lab_candidates(b, "blas config check", fp8, m, n, k, sx, sw, d->base, &p, res);
    cublasLtMatmulAlgo_t algo;
    if (!st) st = config_algo(b, &p, 0, d, &res[d->base].algo, &algo, &d->workspace, &d->waves);
    plan_release(&p);
    return st;
}

/* Lab (--lt-search): the tile ids heuristic candidate `base`'s algorithm lists for the plain
 * product (every id below CUBLASLT_MATMUL_TILE_END when it lists none or only "undefined", as the
 * Hopper FP8 algorithm does: cublasLtMatmulAlgoCheck then decides), at most max */
nib_status nib_blas_config_tiles(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx,
                                 const float *sw, int base, int *tiles, int max, int *count) {
    *count = 0;
    if (!tiles || max < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "blas config tiles: NULL output or max < 1");
    blas_plan p;
    cublasLtMatmulHeuristicResult_t res[NIB_BLAS_MAX_ALGOS];
    nib_status st = lab_candidates(b, "blas config tiles", fp8, m, n, k, sx, sw, base, &p, res);
    if (!st) {
        nib_blas_algo_desc hd;
        desc_of(&res[base], &hd);
        cudaDataType_t ab;
        algo_types(fp8, &ab);
        cublasLtMatmulAlgo_t a;
        if (cublasLtMatmulAlgoInit(b->lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab, ab, CUDA_R_16BF, CUDA_R_16BF, hd.id, &a) !=
            CUBLAS_STATUS_SUCCESS)
            st = NIB_ERR(NIB_ERR_UNSUPPORTED, "blas config tiles: cublasLtMatmulAlgoInit refuses algorithm %d", hd.id);
        else {
            uint32_t *ids = (uint32_t *)calloc(CUBLASLT_MATMUL_TILE_END, sizeof *ids);
            if (!ids) st = NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "blas config tiles: host allocation");
            else {
                int nt = cap_ids(&a, CUBLASLT_ALGO_CAP_TILE_IDS, ids, CUBLASLT_MATMUL_TILE_END);
                if (nt <= 1 && (nt == 0 || ids[0] == CUBLASLT_MATMUL_TILE_UNDEFINED))
                    for (nt = 0; nt + 1 < CUBLASLT_MATMUL_TILE_END; nt++) ids[nt] = (uint32_t)(nt + 1);
                for (int i = 0; i < nt && *count < max; i++) tiles[(*count)++] = (int)ids[i];
                free(ids);
            }
        }
    }
    plan_release(&p);
    return st;
}

nib_status nib_blas_gemm_fused(nib_blas *b, const nib_blas_gemm_args *a, void *stream) {
    if (!b || !a || !a->x || !a->w || !a->y) return NIB_ERR(NIB_ERR_INVALID_ARG, "blas gemm: NULL argument");
    if (a->m < 1 || a->n < 1 || a->k < 1 || a->ldy < a->n || (a->c && a->ldc < a->n))
        return NIB_ERR(NIB_ERR_SHAPE, "blas gemm: M=%lld N=%lld K=%lld ldy=%lld ldc=%lld", (long long)a->m,
                       (long long)a->n, (long long)a->k, (long long)a->ldy, (long long)a->ldc);
    if (a->fp8) {
        if (a->k % 16 || a->n % 16)
            return NIB_ERR(NIB_ERR_SHAPE, "fp8 gemm: cuBLASLt FP8 needs K and N multiples of 16 (K=%lld N=%lld)",
                           (long long)a->k, (long long)a->n);
        if (!a->sx || !a->sw) return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 gemm: NULL scale pointer");
    }
    /* FP8 with fast accumulation: nib's wgmma kernel where the rule of nib_fp8_use_nib says it
     * beats cuBLASLt's single FP8 algorithm (the handle's engine setting overrides the rule) */
    if (a->fp8 && b->fast_accum &&
        (b->fp8_engine == NIB_FP8_ENGINE_NIB ||
         (b->fp8_engine == NIB_FP8_ENGINE_AUTO && nib_fp8_use_nib(a->m, a->n, a->k) && nib_fp8_args_suit(a))))
        return nib_cuda_gemm_fp8(a, NULL, stream);
    /* in place (C is Y with the same stride): one descriptor for both, as cuBLASLt requires */
    const int64_t ldc = !a->c ? 0 : (a->c == a->y && a->ldc == a->ldy) ? -1 : a->ldc;
    if (a->c && ldc > 0 && (const char *)a->c < (const char *)a->y + (size_t)a->ldy * a->m * 2 &&
        (const char *)a->y < (const char *)a->c + (size_t)a->ldc * a->m * 2)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "blas gemm: C overlaps Y without being Y (same pointer and stride)");
    blas_plan *p = NULL;
    NIB_RETURN_IF_ERR(plan_get(b, a->fp8, a->m, a->n, a->k, a->fp8 && a->sx_per_token, a->fp8 && a->sw_per_channel,
                               a->sx, a->sw, a->bias, ldc, a->ldy, &p));
    if (a->fp8) {
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a->sw, sizeof a->sw));
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a->sx, sizeof a->sx));
    }
    if (a->bias)
        NIB_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &a->bias, sizeof a->bias));
    float alpha = 1.f, beta = a->c ? 1.f : 0.f;
    NIB_BLAS_CHECK(cublasLtMatmul(b->lt, p->op, &alpha, a->w, p->a, a->x, p->b, &beta, a->c ? a->c : a->y,
                                  ldc > 0 ? p->c : p->d, a->y, p->d, &p->algo, b->ws, NIB_BLAS_WS_BYTES,
                                  (cudaStream_t)stream));
    return NIB_OK;
}

nib_status nib_blas_gemm_bf16(nib_blas *b, const void *x, const void *w, void *y, int64_t m, int64_t n,
                              int64_t k, void *stream) {
    nib_blas_gemm_args a = {0, x, NULL, 0, w, NULL, 0, m, n, k, NULL, NULL, 0, y, n};
    return nib_blas_gemm_fused(b, &a, stream);
}

nib_status nib_blas_gemm_fp8(nib_blas *b, const void *xq, const float *sx, int sx_per_token, const void *wq,
                             const float *sw, int sw_per_channel, void *y, int64_t m, int64_t n, int64_t k,
                             void *stream) {
    nib_blas_gemm_args a = {1, xq, sx, sx_per_token, wq, sw, sw_per_channel, m, n, k, NULL, NULL, 0, y, n};
    return nib_blas_gemm_fused(b, &a, stream);
}

/* Per-token FP8 activation quantization, exactly formats/ nib_fp8_quantize on each row:
 * scale = amax/448 (1 for an all-zero row, at least FLT_MIN), code = satfinite e4m3(x / scale).
 * One CTA per row. Vector path (K % 8 == 0, 16-byte aligned rows): each thread keeps up to VMAX
 * 16-byte chunks in registers, so the row is read once. The scale and the codes' quotients are
 * ops/cuda/fp8_rows.cuh's (one reciprocal per row, no division per code). */
__device__ __forceinline__ float block_max_256(float v, float *red) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (threadIdx.x == 0) red[32] = v;
    }
    __syncthreads();
    return red[32];
}

template <int VMAX>
__global__ void __launch_bounds__(256) k_quant_fp8_rows_vec(const __nv_bfloat16 *x, int64_t k, uint8_t *xq,
                                                             float *scales) {
    NIB_KT(NIB_KT_QROWS, NIB_KT_ENTRY);
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    NIB_KT(NIB_KT_QROWS, NIB_KT_WAITED);
    NIB_KT_EXIT_GUARD(NIB_KT_QROWS);
    __shared__ float red[33];
    const uint4 *row = (const uint4 *)(x + blockIdx.x * k);
    uint2 *qrow = (uint2 *)(xq + blockIdx.x * k);
    const int nc = (int)(k / 8);
    uint4 v[VMAX];
    /* the max |x| on bf16 pairs (exact; a NaN loses to a number, as with fmaxf) */
    __nv_bfloat162 am2 = __floats2bfloat162_rn(0.f, 0.f);
#pragma unroll
    for (int j = 0; j < VMAX; j++) {
        int c = threadIdx.x + j * 256;
        if (c < nc) {
            v[j] = row[c];
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v[j];
#pragma unroll
            for (int e = 0; e < 4; e++) am2 = __hmax2(am2, __habs2(h[e]));
        }
    }
    const float amax = fmaxf(__low2float(am2), __high2float(am2));
    const float sc = nib::fp8_row_scale_of(block_max_256(amax, red)), rc = nib::fp8_quot_rcp(sc);
    if (threadIdx.x == 0) scales[blockIdx.x] = sc;
#pragma unroll
    for (int j = 0; j < VMAX; j++) {
        int c = threadIdx.x + j * 256;
        if (c < nc) {
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v[j];
            float f[8];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 t = __bfloat1622float2(h[e]);
                f[2 * e] = t.x, f[2 * e + 1] = t.y;
            }
            qrow[c] = nib::fp8_codes8(f, sc, rc); /* satfinite, RNE */
        }
    }
}

/* scalar fallback (any K, any alignment) and the per-tensor quantization pass */
__global__ void k_quant_fp8_rows(const __nv_bfloat16 *x, int64_t k, __nv_fp8_e4m3 *xq, float *scales,
                                 int per_token, float tensor_scale_inv) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    __shared__ float red[33];
    const __nv_bfloat16 *row = x + blockIdx.x * k;
    __nv_fp8_e4m3 *qrow = xq + blockIdx.x * k;
    if (per_token) {
        float amax = 0.f;
        for (int64_t i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(__bfloat162float(row[i])));
        const float sc = nib::fp8_row_scale_of(block_max_256(amax, red)), rc = nib::fp8_quot_rcp(sc);
        if (threadIdx.x == 0) scales[blockIdx.x] = sc;
        for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
            const float v = __bfloat162float(row[i]);
            qrow[i] = __nv_fp8_e4m3(rc != 0.f ? nib::fp8_quot(v, sc, rc) : __fdiv_rn(v, sc)); /* satfinite conversion */
        }
    } else {
        for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
            qrow[i] = __nv_fp8_e4m3(__bfloat162float(row[i]) * tensor_scale_inv);
    }
}

/* per-tensor: scale from the amax of the whole matrix (two passes) */
__global__ void k_amax(const __nv_bfloat16 *x, int64_t n, unsigned int *amax_bits) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    float a = 0.f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a = fmaxf(a, fabsf(__bfloat162float(x[i])));
    for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, __float_as_uint(a));
}
__global__ void k_tensor_scale(unsigned int *amax_bits, float *scale) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    float a = __uint_as_float(*amax_bits);
    *scale = a > 0.f ? a / 448.f : 1.f;
    *amax_bits = 0;
}
__global__ void k_quant_fp8_tensor(const __nv_bfloat16 *x, int64_t n, const float *scale, __nv_fp8_e4m3 *xq) {
    nib::pdl_enter(); /* runtime/launch.cuh: first, before any access or return */
    float inv = 1.f / *scale;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        xq[i] = __nv_fp8_e4m3(__bfloat162float(x[i]) * inv);
}

nib_status nib_cuda_quantize_fp8_rows(const void *x, int64_t m, int64_t k, int per_token, void *xq,
                                      float *scales, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (per_token) {
        const int64_t nc = k / 8, vm = (nc + 255) / 256;
        /* a two-pass kernel for long rows (the max, then the codes from a second read through
         * L1 / L2; 32 registers, every row resident at once) measured slower in the model than
         * VMAX = 8 in registers (1.34 waves at 532 rows): fast prefix 3.167 -> 3.244 ms at 2
         * cameras (fifteenth session, docs/design.md) */
        const int vec = k % 8 == 0 && ((uintptr_t)x | (uintptr_t)xq) % 16 == 0 && vm <= 8;
        const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
        if (vec && vm <= 1) NIB_CUDA_CHECK(nib::launch(k_quant_fp8_rows_vec<1>, dim3((unsigned)m), dim3(256), 0, s, xb, k, (uint8_t *)xq, scales));
        else if (vec && vm <= 2) NIB_CUDA_CHECK(nib::launch(k_quant_fp8_rows_vec<2>, dim3((unsigned)m), dim3(256), 0, s, xb, k, (uint8_t *)xq, scales));
        else if (vec && vm <= 4) NIB_CUDA_CHECK(nib::launch(k_quant_fp8_rows_vec<4>, dim3((unsigned)m), dim3(256), 0, s, xb, k, (uint8_t *)xq, scales));
        else if (vec) NIB_CUDA_CHECK(nib::launch(k_quant_fp8_rows_vec<8>, dim3((unsigned)m), dim3(256), 0, s, xb, k, (uint8_t *)xq, scales));
        else NIB_CUDA_CHECK(nib::launch(k_quant_fp8_rows, dim3((unsigned)m), dim3(256), 0, s, xb, k, (__nv_fp8_e4m3 *)xq, scales, 1, 1.f));
        NIB_LAUNCH_CHECK("k_quant_fp8_rows");
        return NIB_OK;
    }
    /* scales must have room for 2 floats: [0] the scale, [1] scratch for the amax reduction */
    unsigned int *amax = (unsigned int *)(scales + 1);
    int64_t n = m * k;
    NIB_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(unsigned int), s));
    NIB_CUDA_CHECK(nib::launch(k_amax, dim3(264), dim3(256), 0, s, (const __nv_bfloat16 *)x, n, amax));
    NIB_LAUNCH_CHECK("k_amax");
    NIB_CUDA_CHECK(nib::launch(k_tensor_scale, dim3(1), dim3(1), 0, s, amax, scales));
    NIB_LAUNCH_CHECK("k_tensor_scale");
    NIB_CUDA_CHECK(nib::launch(k_quant_fp8_tensor, dim3(264), dim3(256), 0, s, (const __nv_bfloat16 *)x, n, scales, (__nv_fp8_e4m3 *)xq));
    NIB_LAUNCH_CHECK("k_quant_fp8_tensor");
    return NIB_OK;
}

NIB_KTRACE_UNIT(blas)
