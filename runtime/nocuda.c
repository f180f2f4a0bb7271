/* nocuda.c — the CUDA-backed entry points in a CPU-only build (NO_CUDA=1 or no nvcc): each
 * returns NIB_ERR_NO_DEVICE with a message, so callers (CLI, tests) link and fail cleanly.
 * Every function here has its real definition in a .cu file. */
#ifndef NIB_HAVE_CUDA

#include <string.h>

#include "ops/expert.h"
#include "ops/gemm.h"
#include "runtime/device.h"
#include "runtime/timing.h"

#define NO_CUDA(what) NIB_ERR(NIB_ERR_NO_DEVICE, "%s: this nib build has no CUDA backend (NO_CUDA=1 or no nvcc)", what)

nib_status nib_cuda_weight_bytes(const nib_wsrc *src, int geglu, uint64_t *bytes) {
    (void)src, (void)geglu;
    *bytes = 0;
    return NO_CUDA("nib_cuda_weight_bytes");
}
nib_status nib_cuda_weight_load(const nib_wsrc *src, int geglu, const char *name, void *arena, nib_qweight *out) {
    (void)src, (void)geglu, (void)name, (void)arena;
    memset(out, 0, sizeof *out);
    return NO_CUDA("nib_cuda_weight_load");
}
nib_status nib_cuda_gemm_ws_init(nib_gemm_ws *ws, int64_t max_m, int64_t max_np) {
    (void)max_m, (void)max_np;
    memset(ws, 0, sizeof *ws);
    return NO_CUDA("nib_cuda_gemm_ws_init");
}
void nib_cuda_gemm_ws_free(nib_gemm_ws *ws) {
    if (ws) memset(ws, 0, sizeof *ws);
}
nib_status nib_cuda_gemm(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, void *y, int64_t ldy,
                         const nib_gemm_epi *epi, nib_gemm_ws *ws, void *stream) {
    (void)w, (void)x, (void)m, (void)ldx, (void)y, (void)ldy, (void)epi, (void)ws, (void)stream;
    return NO_CUDA("nib_cuda_gemm");
}
nib_status nib_cuda_gemm_qkv(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, const struct nib_qkv_args *qa,
                             nib_gemm_ws *ws, const struct nib_gemm_plan *plan, void *stream) {
    (void)w, (void)x, (void)m, (void)ldx, (void)qa, (void)ws, (void)plan, (void)stream;
    return NO_CUDA("nib_cuda_gemm_qkv");
}
int nib_cuda_gemm_qkv_fuses(const nib_qweight *w, int64_t m, const struct nib_qkv_args *qa, const nib_gemm_ws *ws,
                            const struct nib_gemm_plan *plan) {
    (void)w, (void)m, (void)qa, (void)ws, (void)plan;
    return -1;
}
long long nib_cuda_gemm_lean_launches(void) { return 0; }
long long nib_cuda_gemm_wg_qkv_launches(void) { return 0; }
nib_status nib_cuda_gemm_plan(const nib_qweight *w, int64_t m, uint64_t ws_elems, nib_gemm_plan *plan) {
    (void)w, (void)m, (void)ws_elems;
    memset(plan, 0, sizeof *plan);
    return NO_CUDA("nib_cuda_gemm_plan");
}
nib_status nib_cuda_gemm_wg_plan(const nib_qweight *w, int64_t m, int bt, int ks, int cm, nib_gemm_plan *plan) {
    (void)w, (void)m, (void)bt, (void)ks, (void)cm;
    memset(plan, 0, sizeof *plan);
    return NO_CUDA("nib_cuda_gemm_wg_plan");
}
int nib_cuda_gemm_plans(const nib_qweight *w, int64_t m, uint64_t ws_elems, nib_gemm_plan *out, int max) {
    (void)w, (void)m, (void)ws_elems, (void)out, (void)max;
    return -1;
}
nib_status nib_cuda_gemm_planned(const nib_qweight *w, const void *x, int64_t m, int64_t ldx, void *y,
                                 int64_t ldy, const nib_gemm_epi *epi, nib_gemm_ws *ws,
                                 const nib_gemm_plan *plan, void *stream) {
    (void)w, (void)x, (void)m, (void)ldx, (void)y, (void)ldy, (void)epi, (void)ws, (void)plan, (void)stream;
    return NO_CUDA("nib_cuda_gemm_planned");
}
nib_status nib_blas_create(nib_blas **out) {
    *out = NULL;
    return NO_CUDA("nib_blas_create");
}
void nib_blas_free(nib_blas *b) { (void)b; }
nib_status nib_blas_add_workspace(nib_blas *b) {
    (void)b;
    return NO_CUDA("nib_blas_add_workspace");
}
void nib_blas_swap_workspace(nib_blas *b) { (void)b; }
void nib_blas_set_fp8_fast_accum(nib_blas *b, int on) { (void)b, (void)on; }
void nib_blas_set_algo_index(nib_blas *b, int i) { (void)b, (void)i; }
void nib_blas_set_algo_config(nib_blas *b, const nib_blas_algo_desc *d) { (void)b, (void)d; }
int nib_blas_tuned_plans(const nib_blas *b) {
    (void)b;
    return 0;
}
nib_status nib_blas_configs(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx, const float *sw,
                            nib_blas_algo_desc *out, int max, int *count) {
    (void)b, (void)fp8, (void)m, (void)n, (void)k, (void)sx, (void)sw, (void)out, (void)max;
    *count = 0;
    return NO_CUDA("nib_blas_configs");
}
nib_status nib_blas_config_check(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx,
                                 const float *sw, nib_blas_algo_desc *d) {
    (void)b, (void)fp8, (void)m, (void)n, (void)k, (void)sx, (void)sw, (void)d;
    return NO_CUDA("nib_blas_config_check");
}
nib_status nib_blas_config_tiles(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx,
                                 const float *sw, int base, int *tiles, int max, int *count) {
    (void)b, (void)fp8, (void)m, (void)n, (void)k, (void)sx, (void)sw, (void)base, (void)tiles, (void)max;
    *count = 0;
    return NO_CUDA("nib_blas_config_tiles");
}
void nib_blas_set_fp8_engine(nib_blas *b, int engine) { (void)b, (void)engine; }
nib_status nib_cuda_fp8_plan(int64_t m, int64_t n, int64_t k, int geglu, nib_fp8_tile *out) {
    (void)m, (void)n, (void)k, (void)geglu, (void)out;
    return NO_CUDA("nib_cuda_fp8_plan");
}
nib_status nib_cuda_fp8_geglu_pp(int64_t m, int64_t n, int64_t k, int *rows, int *cols) {
    (void)m, (void)n, (void)k;
    *rows = 0, *cols = 0;
    return NO_CUDA("nib_cuda_fp8_geglu_pp");
}
nib_status nib_cuda_fp8_tile_slots(const nib_fp8_tile *tile, int *ctas) {
    (void)tile, (void)ctas;
    return NO_CUDA("nib_cuda_fp8_tile_slots");
}
nib_status nib_cuda_gemm_fp8_geglu(const nib_blas_gemm_args *a, const nib_fp8_tile *tile, void *stream) {
    (void)a, (void)tile, (void)stream;
    return NO_CUDA("nib_cuda_gemm_fp8_geglu");
}
nib_status nib_cuda_gemm_fp8(const nib_blas_gemm_args *a, const nib_fp8_tile *tile, void *stream) {
    (void)a, (void)tile, (void)stream;
    return NO_CUDA("nib_cuda_gemm_fp8");
}
nib_status nib_blas_algos(nib_blas *b, int fp8, int64_t m, int64_t n, int64_t k, const float *sx, const float *sw,
                          nib_blas_algo_desc *out, int max, int *count) {
    (void)b, (void)fp8, (void)m, (void)n, (void)k, (void)sx, (void)sw, (void)out, (void)max;
    *count = 0;
    return NO_CUDA("nib_blas_algos");
}
int nib_blas_fp8_fast_accum(const nib_blas *b) {
    (void)b;
    return 0;
}
nib_status nib_blas_gemm_bf16(nib_blas *b, const void *x, const void *w, void *y, int64_t m, int64_t n, int64_t k,
                              void *stream) {
    (void)b, (void)x, (void)w, (void)y, (void)m, (void)n, (void)k, (void)stream;
    return NO_CUDA("nib_blas_gemm_bf16");
}
nib_status nib_blas_gemm_fused(nib_blas *b, const nib_blas_gemm_args *a, void *stream) {
    (void)b, (void)a, (void)stream;
    return NO_CUDA("nib_blas_gemm_fused");
}
nib_status nib_blas_gemm_fp8(nib_blas *b, const void *xq, const float *sx, int sx_per_token, const void *wq,
                             const float *sw, int sw_per_channel, void *y, int64_t m, int64_t n, int64_t k,
                             void *stream) {
    (void)b, (void)xq, (void)sx, (void)sx_per_token, (void)wq, (void)sw, (void)sw_per_channel, (void)y;
    (void)m, (void)n, (void)k, (void)stream;
    return NO_CUDA("nib_blas_gemm_fp8");
}
nib_status nib_cuda_quantize_fp8_rows(const void *x, int64_t m, int64_t k, int per_token, void *xq, float *scales,
                                      void *stream) {
    (void)x, (void)m, (void)k, (void)per_token, (void)xq, (void)scales, (void)stream;
    return NO_CUDA("nib_cuda_quantize_fp8_rows");
}
nib_status nib_lab_time_graph(nib_lab_fn fn, void *ctx, int calls, int reps, nib_lab_timing *out) {
    (void)fn, (void)ctx, (void)calls, (void)reps;
    memset(out, 0, sizeof *out);
    return NO_CUDA("nib_lab_time_graph");
}
nib_status nib_lab_copy_bandwidth(uint64_t bytes, double *gbps) {
    (void)bytes;
    *gbps = 0;
    return NO_CUDA("nib_lab_copy_bandwidth");
}
nib_status nib_lab_peak_tflops(int fp8, int size, double *tflops) {
    (void)fp8, (void)size;
    *tflops = 0;
    return NO_CUDA("nib_lab_peak_tflops");
}

nib_status nib_cuda_expert_supported(const nib_expert_args *a) {
    (void)a;
    return NO_CUDA("nib_cuda_expert_supported");
}
nib_status nib_cuda_expert_ws_bytes(const nib_expert_args *a, uint64_t *bytes) {
    (void)a;
    *bytes = 0;
    return NO_CUDA("nib_cuda_expert_ws_bytes");
}
nib_status nib_cuda_expert_grid(const nib_expert_args *a, int32_t *ctas) {
    (void)a;
    *ctas = 0;
    return NO_CUDA("nib_cuda_expert_grid");
}
nib_status nib_cuda_expert_prepare(const nib_expert_args *a, void *ws, uint64_t ws_bytes) {
    (void)a, (void)ws, (void)ws_bytes;
    return NO_CUDA("nib_cuda_expert_prepare");
}
nib_status nib_cuda_ktrace_dump(const char *path) {
    (void)path;
    return NO_CUDA("nib_cuda_ktrace_dump");
}
nib_status nib_cuda_expert_trace_report(const nib_expert_args *a, void *ws, uint64_t ws_bytes, FILE *out) {
    (void)a, (void)ws, (void)ws_bytes, (void)out;
    return NO_CUDA("nib_cuda_expert_trace_report");
}
nib_status nib_cuda_expert_run(const nib_expert_args *a, void *ws, uint64_t ws_bytes, void *stream) {
    (void)a, (void)ws, (void)ws_bytes, (void)stream;
    return NO_CUDA("nib_cuda_expert_run");
}

#else
typedef int nib_nocuda_unused; /* keep the translation unit non-empty in CUDA builds */
#endif
