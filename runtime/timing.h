/* timing.h — the kernel lab's clock: CUDA-graph replay timing with events, and the two
 * ceilings every benchmark is compared against (device copy bandwidth, cuBLASLt peak). */
#ifndef NIB_RUNTIME_TIMING_H
#define NIB_RUNTIME_TIMING_H

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fn(ctx, i, stream) enqueues call number i on stream. */
typedef nib_status (*nib_lab_fn)(void *ctx, int i, void *stream);

typedef struct nib_lab_timing {
    double median_us;  /* per call: median over reps of (graph replay time / calls) */
    double min_us, max_us;
    int calls, reps;
} nib_lab_timing;

/* Captures `calls` consecutive calls into one CUDA graph, replays it once to warm up, then
 * `reps` times, each timed with CUDA events. */
nib_status nib_lab_time_graph(nib_lab_fn fn, void *ctx, int calls, int reps, nib_lab_timing *out);

/* Device-to-device copy of `bytes` (>= 4x L2), GB/s counting bytes read + written. */
nib_status nib_lab_copy_bandwidth(uint64_t bytes, double *gbps);
/* cuBLASLt dense GEMM TFLOP/s at m=n=k=`size` on random data: bf16 (fp8 = 0) or e4m3 (fp8 = 1). */
nib_status nib_lab_peak_tflops(int fp8, int size, double *tflops);

#ifdef __cplusplus
}
#endif
#endif
