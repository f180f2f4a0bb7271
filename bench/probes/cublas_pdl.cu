/* cublas_pdl.cu — do cuBLASLt's bf16 kernels wait on the grid dependency (griddepcontrol.wait),
 * so that a CUDA graph may give the edge into them the programmatic type (the early launch nib's own
 * kernels get)?
 *
 * Why: nib launches its own kernels with programmatic dependent launch (runtime/launch.cuh), which is
 * worth ~1.5 ms per Pi0.5 call; cuBLAS is called without the attribute, so the edge into every
 * cuBLAS kernel of a captured graph is a full-completion edge. The bf16 preset's expert runs 5 of its
 * 11 kernels per layer in cuBLAS (4 products and a split-K reduction; docs/design.md). A programmatic
 * edge into a kernel that does not execute griddepcontrol.wait is a race, so the answer decides whether
 * such an edge may be built at all.
 *
 * Per shape (K:N at M rows, Y = X W^T, bf16, fp32 accumulation, cuBLASLt's first heuristic algorithm,
 * the TN layout nib uses):
 *   race   a graph memset(X = 0) -> k_produce (1 CTA: trigger at once, spin ~20 us, then X = 1) ->
 *          cuBLASLt, with the edge k_produce -> cuBLAS's first kernel made programmatic (cuBLAS's own edges stay;
 *          where its first node is not a kernel, nothing changes and race_edges_changed is 0). A consumer
 *          that waits reads X = 1 (Y = K everywhere); one that does not reads zeros. 5 replays, every
 *          output element compared with the same graph's default-edge result.
 *   chain  32 x [k_mid (PDL attribute: wait, trigger, X = Y / K) -> cuBLASLt] in one graph with the
 *          programmatic edges, its result compared with the default edges' (no timing: with a consumer
 *          that does not wait, a time would be of a wrong program).
 * Controls (once): the race graph with a consumer of our own that does not wait (must mismatch: the
 * harness can see a race) and one that waits (must match).
 *
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/cublas_pdl \
 *        -I bench/probes bench/probes/cublas_pdl.cu -lcublasLt -lcuda && /tmp/cublas_pdl
 * One JSON object per line.
 */
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "probe.cuh"

#define LT_CHECK(x)                                                                                         \
    do {                                                                                              \
        cublasStatus_t s_ = (x);                                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, (int)s_);        \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

__global__ void k_produce(__nv_bfloat16 *x, int n, long long spin) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = __float2bfloat16(1.f);
}
template <int WAIT> __global__ void k_copy(const __nv_bfloat16 *x, __nv_bfloat16 *y, int n) {
    if (WAIT) asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = x[i];
}
__global__ void k_mid(const __nv_bfloat16 *y, int ny, __nv_bfloat16 *x, int nx, float inv_k) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nx; i += gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(__bfloat162float(y[i % ny]) * inv_k);
}

static std::string node_name(cudaGraphNode_t n) {
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    if (cuGraphKernelNodeGetParams((CUgraphNode)n, &p) != CUDA_SUCCESS) return "?";
    const char *name = nullptr;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (p.func) r = cuFuncGetName(&name, p.func);
    else if (p.kern) r = cuKernelGetName(&name, p.kern);
    if (r != CUDA_SUCCESS || !name) return "?";
    return name;
}
static bool is_kernel(cudaGraphNode_t n) {
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(n, &t));
    return t == cudaGraphNodeTypeKernel;
}
static bool ours(const std::string &s) {
    return s.find("k_produce") != std::string::npos || s.find("k_mid") != std::string::npos ||
           s.find("k_copy") != std::string::npos;
}

/* every default-type edge from a kernel of ours into a cuBLAS kernel (with all: into any kernel)
 * becomes programmatic, as nib would do it (cuBLAS's own edges stay); returns how many; collects the
 * cuBLAS kernels' names into names */
static int make_programmatic(cudaGraph_t g, bool all, std::string *names) {
    size_t ne = 0;
    CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne));
    std::vector<cudaGraphNode_t> from(ne), to(ne);
    std::vector<cudaGraphEdgeData> ed(ne);
    CHECK(cudaGraphGetEdges(g, from.data(), to.data(), ed.data(), &ne));
    int changed = 0;
    for (size_t i = 0; i < ne; i++) {
        if (!is_kernel(from[i]) || !is_kernel(to[i])) continue;
        std::string nm = node_name(to[i]);
        if (names && !ours(nm) && names->find(nm) == std::string::npos) *names += (names->empty() ? "" : ",") + nm;
        if (ed[i].type != cudaGraphDependencyTypeDefault || !ours(node_name(from[i])) || (!all && ours(nm))) continue;
        CHECK(cudaGraphRemoveDependencies(g, &from[i], &to[i], &ed[i], 1));
        cudaGraphEdgeData pe = {};
        pe.from_port = cudaGraphKernelNodePortProgrammatic;
        pe.type = cudaGraphDependencyTypeProgrammatic;
        CHECK(cudaGraphAddDependencies(g, &from[i], &to[i], &pe, 1));
        changed++;
    }
    return changed;
}
/* the captured edges' types into kernels of ours launched with the attribute (to mirror them) */
static void print_captured_edge_kinds(cudaGraph_t g) {
    size_t ne = 0;
    CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne));
    std::vector<cudaGraphNode_t> from(ne), to(ne);
    std::vector<cudaGraphEdgeData> ed(ne);
    CHECK(cudaGraphGetEdges(g, from.data(), to.data(), ed.data(), &ne));
    for (size_t i = 0; i < ne; i++)
        if (is_kernel(to[i]) && node_name(to[i]).find("k_mid") != std::string::npos && ed[i].type) {
            printf("{\"captured_pdl_edge\": {\"from_port\": %d, \"to_port\": %d, \"type\": %d}}\n", ed[i].from_port,
                   ed[i].to_port, ed[i].type);
            return;
        }
}

struct Gemm {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    void *ws;
    size_t ws_bytes;
    int m, n, k;
    const __nv_bfloat16 *w;
    void run(const __nv_bfloat16 *x, __nv_bfloat16 *y, cudaStream_t s) {
        float alpha = 1.f, beta = 0.f;
        LT_CHECK(cublasLtMatmul(lt, op, &alpha, w, a, x, b, &beta, y, d, y, d, &algo, ws, ws_bytes, s));
    }
};
static Gemm make_gemm(cublasLtHandle_t lt, void *ws, size_t wsb, int m, int n, int k, const __nv_bfloat16 *w) {
    Gemm g = {};
    g.lt = lt, g.ws = ws, g.ws_bytes = wsb, g.m = m, g.n = n, g.k = k, g.w = w;
    LT_CHECK(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, k, n, k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, k, m, k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&g.d, CUDA_R_16BF, n, m, n));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t r[1];
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, g.op, g.a, g.b, g.d, g.d, pref, 1, r, &found));
    if (!found) {
        fprintf(stderr, "no cuBLASLt algorithm for %d:%d at M = %d\n", k, n, m);
        exit(1);
    }
    g.algo = r[0].algo;
    LT_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    return g;
}

static size_t mismatches(const std::vector<__nv_bfloat16> &a, const std::vector<__nv_bfloat16> &b) {
    size_t c = 0;
    for (size_t i = 0; i < a.size(); i++) c += memcmp(&a[i], &b[i], sizeof a[i]) != 0;
    return c;
}
static std::vector<__nv_bfloat16> fetch(const __nv_bfloat16 *d, size_t n) {
    std::vector<__nv_bfloat16> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof *d, cudaMemcpyDeviceToHost));
    return h;
}
static cudaGraphExec_t inst(cudaGraph_t g) {
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    return e;
}

/* consumer: 0 cuBLAS, 1 own kernel without wait, 2 own kernel with wait. Returns the race graph's
 * mismatches over 5 replays (programmatic edges) against its default-edge result. */
static size_t race(Gemm &gm, int consumer, __nv_bfloat16 *x, __nv_bfloat16 *y, cudaStream_t s, long long spin,
                   std::string *names, int *changed) {
    const int nx = gm.m * gm.k, ny = gm.m * gm.n;
    cudaGraph_t g[2];
    for (int v = 0; v < 2; v++) {
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        CHECK(cudaMemsetAsync(x, 0, nx * sizeof *x, s));
        CHECK(cudaMemsetAsync(y, 0xff, ny * sizeof *y, s));
        k_produce<<<1, 256, 0, s>>>(x, nx, spin);
        CHECK(cudaGetLastError());
        if (consumer == 0) gm.run(x, y, s);
        else if (consumer == 1) k_copy<0><<<132, 256, 0, s>>>(x, y, nx < ny ? nx : ny);
        else k_copy<1><<<132, 256, 0, s>>>(x, y, nx < ny ? nx : ny);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamEndCapture(s, &g[v]));
    }
    *changed = make_programmatic(g[1], consumer != 0, names);
    cudaGraphExec_t e0 = inst(g[0]), e1 = inst(g[1]);
    CHECK(cudaGraphLaunch(e0, s));
    CHECK(cudaStreamSynchronize(s));
    std::vector<__nv_bfloat16> ref = fetch(y, ny);
    size_t bad = 0;
    for (int r = 0; r < 5; r++) {
        CHECK(cudaGraphLaunch(e1, s));
        CHECK(cudaStreamSynchronize(s));
        bad += mismatches(ref, fetch(y, ny));
    }
    CHECK(cudaGraphExecDestroy(e0));
    CHECK(cudaGraphExecDestroy(e1));
    CHECK(cudaGraphDestroy(g[0]));
    CHECK(cudaGraphDestroy(g[1]));
    return bad;
}

/* 32 x [k_mid (PDL attribute: wait, trigger, X = Y / K) -> cuBLASLt] with programmatic edges into
 * cuBLAS, its result against the default edges' (k_mid is short, so a consumer that does not wait
 * may still read X late enough: a model-level comparison is not a detector for this race) */
static size_t chain(Gemm &gm, __nv_bfloat16 *x, __nv_bfloat16 *y, cudaStream_t s) {
    const int nx = gm.m * gm.k, ny = gm.m * gm.n, links = 32;
    int ctas = (nx + 2047) / 2048;
    std::vector<__nv_bfloat16> res[2];
    for (int v = 0; v < 2; v++) {
        cudaGraph_t g;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < links; l++) {
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(ctas);
            cfg.blockDim = dim3(256);
            cfg.stream = s;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            CHECK(cudaLaunchKernelEx(&cfg, k_mid, (const __nv_bfloat16 *)y, ny, x, nx, 1.f / (float)gm.k));
            gm.run(x, y, s);
        }
        CHECK(cudaStreamEndCapture(s, &g));
        if (v == 0) print_captured_edge_kinds(g);
        else make_programmatic(g, false, nullptr);
        cudaGraphExec_t e = inst(g);
        std::vector<__nv_bfloat16> init(ny, __float2bfloat16((float)gm.k));
        CHECK(cudaMemcpy(y, init.data(), ny * sizeof *y, cudaMemcpyHostToDevice));
        CHECK(cudaGraphLaunch(e, s));
        CHECK(cudaStreamSynchronize(s));
        res[v] = fetch(y, ny);
        CHECK(cudaGraphExecDestroy(e));
        CHECK(cudaGraphDestroy(g));
    }
    return mismatches(res[0], res[1]);
}

int main() {
    CHECK(cudaFree(0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasLtHandle_t lt;
    LT_CHECK(cublasLtCreate(&lt));
    const size_t wsb = 32u << 20;
    void *ws;
    CHECK(cudaMalloc(&ws, wsb));
    const long long spin = 40000; /* ~20 us at ~2 GHz */
    struct Shape {
        int k, n, m;
    } shapes[] = {{1024, 2560, 10}, {2048, 1024, 10}, {1024, 8192, 10}, {4096, 1024, 10},  {2048, 2560, 532},
                  {2048, 2048, 532}, {2048, 32768, 532}, {16384, 2048, 532}, {1152, 3456, 512}, {1152, 1152, 512},
                  {1152, 4304, 512}, {4304, 1152, 512}};
    size_t maxw = 0, maxx = 0, maxy = 0;
    for (auto &sh : shapes) {
        maxw = std::max(maxw, (size_t)sh.k * sh.n);
        maxx = std::max(maxx, (size_t)sh.k * sh.m);
        maxy = std::max(maxy, (size_t)sh.n * sh.m);
    }
    __nv_bfloat16 *w, *x, *y;
    CHECK(cudaMalloc(&w, maxw * 2));
    CHECK(cudaMalloc(&x, maxx * 2));
    CHECK(cudaMalloc(&y, maxy * 2));
    {
        std::vector<__nv_bfloat16> ones(maxw, __float2bfloat16(1.f));
        CHECK(cudaMemcpy(w, ones.data(), maxw * 2, cudaMemcpyHostToDevice));
    }
    /* controls: the harness must see a consumer that does not wait */
    {
        Gemm gm = make_gemm(lt, ws, wsb, 10, 1024, 1024, w);
        int ch = 0;
        size_t bad_nowait = race(gm, 1, x, y, s, spin, nullptr, &ch);
        int ch2 = 0;
        size_t bad_wait = race(gm, 2, x, y, s, spin, nullptr, &ch2);
        printf("{\"control\": {\"own_kernel_without_wait_mismatches\": %zu, \"edges_changed\": %d, "
               "\"own_kernel_with_wait_mismatches\": %zu, \"edges_changed_2\": %d}}\n",
               bad_nowait, ch, bad_wait, ch2);
    }
    for (auto &sh : shapes) {
        Gemm gm = make_gemm(lt, ws, wsb, sh.m, sh.n, sh.k, w);
        std::string names;
        int ch = 0;
        size_t bad = race(gm, 0, x, y, s, spin, &names, &ch);
        size_t cbad = chain(gm, x, y, s);
        printf("{\"k\": %d, \"n\": %d, \"m\": %d, \"cublas_kernels\": \"%s\", \"race_edges_changed\": %d, "
               "\"race_mismatches\": %zu, \"race_elements\": %d, \"chain_mismatches\": %zu}\n",
               sh.k, sh.n, sh.m, names.c_str(), ch, bad, 5 * sh.m * sh.n, cbad);
        fflush(stdout);
    }
    return 0;
}
