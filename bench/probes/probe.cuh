/* probe.cuh — what the standalone probes in bench/probes/ share: a checked CUDA call that exits
 * with the failing call's text, a launch configuration with a 1-D cluster, and a median timer
 * over CUDA events (the first run is a warm-up and is dropped). */
#ifndef NIB_PROBE_CUH
#define NIB_PROBE_CUH

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (x);                                                                         \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

/* grid x block CTAs with `smem` dynamic bytes, in clusters of `cl` along x (1: none); `at` must
 * outlive the launch */
static inline cudaLaunchConfig_t probe_cfg(int grid, int block, int smem, int cl, cudaLaunchAttribute *at) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = cl;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}

/* median ms of runs - 1 timed calls of launch(r) (r = 0 .. runs - 1; run 0 is a warm-up) */
template <class F> static double probe_median_ms(int runs, F launch) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < runs; r++) {
        CHECK(cudaEventRecord(e0));
        launch(r);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r) t.push_back(ms);
    }
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

#endif
