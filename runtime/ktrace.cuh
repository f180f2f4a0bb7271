/* ktrace.cuh — in-graph kernel timestamps, a lab build only (make NIB_LAB_NVCCFLAGS=-DNIB_KTRACE=1, or
 * scripts/ab.sh flags -f -DNIB_KTRACE=1). Nsight Compute serializes kernels and Nsight Systems does not run on the
 * device machines, so neither shows what programmatic dependent launch does inside a graph; these stamps do.
 *
 * A kernel calls NIB_KT(kid, ev) (thread 0 of each CTA) or nib_kt::stamp(kid, ev) (any one thread): one record of
 * %globaltimer (ns), the kernel id, the event, the SM, the CTA's linear index (x + X (y + Y z)) and the grid's CTA
 * count (X Y Z) into this translation unit's ring: 32 sub-rings of 2^16 records, by SM (smid & 31), so CTAs of
 * different SMs rarely meet on one counter; each sub-ring keeps its newest records. A CTA's ENTRY stamp (thread 0,
 * the first statement of every stamped kernel) reserves 16 slots with one global atomic; its later stamps (at most
 * 15; more are dropped) take the next slot from a shared-memory counter, so they cost no L2 round trip. Kernel ids: NIB_KT_PP
 * k_gemm_fp8_pp, NIB_KT_PT k_gemm_fp8_pt, NIB_KT_NORM k_norm, NIB_KT_QROWS k_quant_fp8_rows_vec, NIB_KT_LOWBIT
 * k_gemm_lowbit, NIB_KT_LOWBIT_WG k_gemm_lowbit_wg, NIB_KT_ATTN_DEC k_attn_dec, NIB_KT_ATTN k_attn, NIB_KT_MERGE
 * k_attn_merge, NIB_KT_EDGE k_edge, NIB_KT_ATTN_WG k_attn_wg. Events: NIB_KT_ENTRY (first statement), NIB_KT_WAITED (griddepcontrol.wait
 * returned), NIB_KT_EXIT (thread 0 done), NIB_KT_EXIT_C0 / _C1 (the ping-pong kernel's consumers done), NIB_KT_MARK1..7
 * (points inside a kernel; k_gemm_lowbit: its first X window in (every thread), every warp's K loop done, thread 0's outputs
 * or split-K partials stored, the K split's last CTA starting the sum, the first X windows and epilogue inputs issued,
 * thread 0's part of the first X window in, the first X windows issued (before the epilogue inputs); k_attn_dec: Q staged, warp 0's keys done, every warp's
 * partial O in shared memory).
 * nib_cuda_ktrace_dump (runtime/device.h) writes every unit's ring as text, one record a line: "t kid ev sm block
 * grid", only from the time every sub-ring still holds on (a wrapped sub-ring lost its older records);
 * scripts/ktrace.py summarizes it. `nib_pi05_free` calls it when NIB_KTRACE=<file> is set. Without the build flag
 * the macros are empty and the dump says the build has no stamps. */
#ifndef NIB_RUNTIME_KTRACE_CUH
#define NIB_RUNTIME_KTRACE_CUH

#include <stdio.h>

enum {
    NIB_KT_PP = 1,
    NIB_KT_PT = 2,
    NIB_KT_NORM = 3,
    NIB_KT_QROWS = 4,
    NIB_KT_LOWBIT = 5,
    NIB_KT_LOWBIT_WG = 6,
    NIB_KT_ATTN_DEC = 7,
    NIB_KT_ATTN = 8,
    NIB_KT_MERGE = 9,
    NIB_KT_EDGE = 10,
    NIB_KT_ATTN_WG = 11
};
enum {
    NIB_KT_ENTRY = 0,
    NIB_KT_WAITED = 1,
    NIB_KT_EXIT = 2,
    NIB_KT_EXIT_C0 = 3,
    NIB_KT_EXIT_C1 = 4,
    NIB_KT_MARK1 = 5,
    NIB_KT_MARK2 = 6,
    NIB_KT_MARK3 = 7,
    NIB_KT_MARK4 = 8,
    NIB_KT_MARK5 = 9,
    NIB_KT_MARK6 = 10,
    NIB_KT_MARK7 = 11
};

/* each stamped unit's dump of its ring (defined by NIB_KTRACE_UNIT in that unit; a no-op without the flag) */
extern "C" int nib_ktrace_dump_gemm_fp8(FILE *f);
extern "C" int nib_ktrace_dump_norm(FILE *f);
extern "C" int nib_ktrace_dump_blas(FILE *f);
extern "C" int nib_ktrace_dump_gemm_lowbit(FILE *f);
extern "C" int nib_ktrace_dump_attention(FILE *f);
extern "C" int nib_ktrace_dump_edge(FILE *f);

#if defined(NIB_KTRACE) && NIB_KTRACE
#include <stdlib.h>
namespace nib_kt {
constexpr unsigned SUBS = 32, RING = 1u << 16;
static __device__ unsigned long long g_ring[SUBS][2 * RING];
static __device__ unsigned g_n[SUBS];
constexpr unsigned SLOTS = 16; /* records a CTA reserves at its ENTRY stamp */
/* this CTA's reserved slots: the sub-ring, the first slot, the next free one (static shared memory of each stamped
 * kernel; set by thread 0's ENTRY stamp, which comes first in every stamped kernel) */
struct Cta {
    unsigned sub, base, n;
};
__device__ __forceinline__ Cta &cta() {
    __shared__ Cta c;
    return c;
}
__device__ __forceinline__ void put(unsigned sub, unsigned i, unsigned long long t, unsigned long long m) {
    i &= RING - 1;
    g_ring[sub][2 * i] = t;
    g_ring[sub][2 * i + 1] = m;
}
__device__ __forceinline__ void stamp(unsigned kid, unsigned ev) {
    unsigned long long t;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned grid = gridDim.x * gridDim.y * gridDim.z;
    const unsigned long long m = (unsigned long long)(kid & 255u) | (unsigned long long)(ev & 255u) << 8 |
                                 (unsigned long long)(sm & 255u) << 16 | (unsigned long long)(blk & 0xfffffu) << 24 |
                                 (unsigned long long)(grid & 0xfffffu) << 44;
    Cta &c = cta();
    if (ev == NIB_KT_ENTRY) {
        /* the only global atomic of a CTA, before its PDL wait: every later stamp is a shared-memory atomic and two
         * stores, so no stamp holds its thread for an L2 round trip (one per stamp made the points inside a kernel
         * ~0.5 us late each). Slots left unused keep t = 0, which the dump skips. */
        const unsigned sub = sm & (SUBS - 1), base = atomicAdd(&g_n[sub], SLOTS);
        put(sub, base, t, m);
        for (unsigned k = 1; k < SLOTS; k++) put(sub, base + k, 0ull, 0ull);
        c.sub = sub;
        c.base = base;
        c.n = 1;
        return;
    }
    const unsigned k = atomicAdd_block(&c.n, 1u);
    if (k < SLOTS) put(c.sub, c.base + k, t, m);
}
/* the rings from the time every sub-ring still covers, oldest record first per sub-ring; 0, or -1 when the copy
 * failed */
static inline int dump(FILE *f) {
    unsigned n[SUBS];
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(n, g_n, sizeof n) != cudaSuccess) return -1;
    unsigned long long *r = (unsigned long long *)malloc(sizeof(unsigned long long) * 2 * RING * SUBS);
    if (!r) return -1;
    if (cudaMemcpyFromSymbol(r, g_ring, sizeof(unsigned long long) * 2 * RING * SUBS) != cudaSuccess) {
        free(r);
        return -1;
    }
    unsigned long long t_from = 0; /* the newest "oldest kept record" of the wrapped sub-rings */
    for (unsigned s = 0; s < SUBS; s++)
        if (n[s] > RING) { /* its oldest kept record: the first one with a time (unused reserved slots have none) */
            unsigned long long t = 0;
            for (unsigned j = n[s] - RING; j < n[s] && !t; j++) t = r[(size_t)s * 2 * RING + 2 * (j & (RING - 1))];
            if (t > t_from) t_from = t;
        }
    for (unsigned s = 0; s < SUBS; s++)
        for (unsigned j = n[s] > RING ? n[s] - RING : 0; j < n[s]; j++) {
            const unsigned long long *e = r + (size_t)s * 2 * RING + 2 * (j & (RING - 1));
            const unsigned long long m = e[1];
            if (e[0] < t_from || e[0] == 0) continue; /* older than the common window, or a reserved slot left unused */
            fprintf(f, "%llu %u %u %u %u %u\n", e[0], (unsigned)(m & 255u), (unsigned)(m >> 8 & 255u),
                    (unsigned)(m >> 16 & 255u), (unsigned)(m >> 24 & 0xfffffu), (unsigned)(m >> 44 & 0xfffffu));
        }
    free(r);
    return 0;
}
} /* namespace nib_kt */
#define NIB_KT(kid, ev)                                   \
    do {                                                  \
        if (threadIdx.x == 0) nib_kt::stamp((kid), (ev)); \
    } while (0)
#define NIB_KT_ONE(cond, kid, ev)                    \
    do {                                             \
        if (cond) nib_kt::stamp((kid), (ev));        \
    } while (0)
#define NIB_KTRACE_UNIT(name) \
    extern "C" int nib_ktrace_dump_##name(FILE *f) { return nib_kt::dump(f); }
/* thread 0's exit, on every return path of the scope it is declared in */
struct NibKtExit {
    unsigned kid;
    __device__ ~NibKtExit() {
        if (threadIdx.x == 0) nib_kt::stamp(kid, NIB_KT_EXIT);
    }
};
#define NIB_KT_EXIT_GUARD(kid) NibKtExit nib_kt_exit_guard_{(kid)}
#else
#define NIB_KT(kid, ev) \
    do {                \
    } while (0)
#define NIB_KT_ONE(cond, kid, ev) \
    do {                          \
    } while (0)
#define NIB_KTRACE_UNIT(name) \
    extern "C" int nib_ktrace_dump_##name(FILE *f) { return (void)f, 1; }
#define NIB_KT_EXIT_GUARD(kid) (void)0
#endif

#endif
