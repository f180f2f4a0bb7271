/* tile_walk.h — which output tiles a CTA of a persistent GeGLU FP8 kernel takes, in order (ops/cuda/gemm_fp8.cu's
 * k_gemm_fp8_pt and k_gemm_fp8_pp; C and CUDA, so the host tests check the map: tests/test_gemm_plan.c).
 *
 * The tiles are mtiles x ntiles (M tiles of rows, N tiles of channels); grid CTAs, CTA b.
 * cl = 0: the grid order. Tile b + it x grid of the M-fastest numbering (tile t = (t % mtiles, t / mtiles)), so
 *   consecutive blocks share a weight slice; which SMs share it is where the launch put those blocks.
 * cl >= 2: the kernel is launched as clusters of cl CTAs (grid a multiple of cl), and cluster k of K = grid / cl owns
 *   the weight slices k, k + K, k + 2K, ..., each with all its M tiles (M fastest: item i is M tile i % mtiles of the
 *   cluster's slice number i / mtiles); its CTA r takes the items r, r + cl, r + 2cl, ... The CTAs that share a slice
 *   are one cluster's (one GPC), wherever the launch puts the cluster.
 * Either way every tile goes to exactly one CTA. */
#ifndef NIB_OPS_TILE_WALK_H
#define NIB_OPS_TILE_WALK_H

#ifdef __CUDACC__
#define NIB_TW_FN __host__ __device__ __forceinline__
#else
#define NIB_TW_FN static inline
#endif

/* how many tiles CTA b of grid takes */
NIB_TW_FN int nib_tile_walk_count(int b, int grid, int cl, int mtiles, int ntiles) {
    if (cl < 2) {
        const int tiles = mtiles * ntiles;
        return b < tiles ? (tiles - b + grid - 1) / grid : 0;
    }
    const int kn = grid / cl, k = b / cl, r = b % cl;
    const int slices = k < ntiles ? (ntiles - k + kn - 1) / kn : 0, items = slices * mtiles;
    return r < items ? (items - r + cl - 1) / cl : 0;
}

/* CTA b's tile number it (0 <= it < nib_tile_walk_count): its M tile *mi and N tile *ni */
NIB_TW_FN void nib_tile_walk_tile(int b, int grid, int cl, int mtiles, int it, int *mi, int *ni) {
    if (cl < 2) {
        const int t = b + it * grid;
        *mi = t % mtiles, *ni = t / mtiles;
        return;
    }
    const int kn = grid / cl, i = b % cl + it * cl;
    *mi = i % mtiles, *ni = b / cl + (i / mtiles) * kn;
}

#undef NIB_TW_FN
#endif
