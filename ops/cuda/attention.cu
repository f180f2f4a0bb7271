/* attention.cu — softmax attention on tensor cores (see ops/attention.h for the contract):
 *   prefix self-attention (Gemma prefix: MQA 8 x 1 heads, D 256; SigLIP: MHA 16 heads, D 72,
 *   batched over images) and attention over one layer's KV cache (Pi0.5 suffix, decoding) with
 *   the cache in BF16, FP8 (e4m3 + per-(token, head) scale) or NVFP4 (e2m1 + e4m3 block scale
 *   per 16 + per-(token, head) fp32 global).
 *
 * One kernel template does all of it (flash-attention 2 style, mma.sync m16n8k16 bf16 -> fp32):
 *   - A CTA owns a block of query ROWS of one (sequence, KV head): row r is (token r / group,
 *     query head kvh * group + r % group), so with MQA the 8 heads of a token are 8 rows that
 *     share every K/V tile: each K/V byte is brought into shared memory once per row block
 *     (one row block covers all rows of the suffix at H <= 8; H = 10 -> 80 rows -> 1 block).
 *   - ... and one SPLIT of the key axis (flash-decoding): split s covers the keys
 *     nib_attn_split_range(T, n_splits, TK, s) with T read on the device, so a graph captured
 *     at the maximum sizes spreads any valid length over all splits.
 *   - Warps = WR row groups (16 rows each) x WT token groups; a K/V tile holds TK = WT*KW*16
 *     keys; warp (wr, wt) runs an online softmax for its 16 rows over its KW*16 keys of every
 *     tile. WT > 1 (decoding: one row group) merges the token groups through shared memory.
 *   - Pipeline: ST stages of cp.async (16-byte, zero-fill past the split end), one
 *     __syncthreads per tile (two for low-bit). BF16 tiles land in the padded layout the MMAs
 *     read (ldmatrix for K, ldmatrix.trans for V). FP8/NVFP4 tiles land raw and are decoded into
 *     a bf16 tile before the MMAs: K exactly (e4m3, or e2m1 * e4m3 * 2^-8) with its per-key
 *     scale kept in fp32 for the logits; V as bf16(decoded value * per-key scale), one rounding
 *     per element (like a bf16 cache of the dequantized V; folding the V scale into P instead
 *     would share one rounding across a whole output row when one key dominates).
 *   - Per tile and warp: S = Q K^T (fp32), x = S [* k_scale] * log2(e), masked keys -> -inf,
 *     m' = max(m, rowmax x), p = 2^(x - m'), l = l 2^(m - m') + sum p (fp32, lane-partial),
 *     O = O 2^(m - m') + bf16(p) V.
 *   - n_splits = 1: o = O / l written as bf16. n_splits > 1: (m, l, O / l) fp32 to the
 *     workspace, then k_attn_merge combines the splits in split order (deterministic).
 * Head dims: 72 (and any multiple of 8 up to 80) run padded to 80, others up to 256 padded to
 * 256; the cache path needs D = 256. Variants (FMT x config), picked by rows per KV group:
 *   cl   WR8 x WT1, TK 32, 256 threads, cache path, opt-in (see plan_cluster): one cluster of
 *        16 (or 8) splits merged in distributed shared memory (rows <= 128)
 *   dec  WR1 x WT2, TK 32, 64 threads, 2-3 CTAs/SM (rows <= 16: decode, small suffix)
 *   r4   WR4 x WT1, TK 64, 128 threads              (rows <= 64)
 *   r8   WR8 x WT1, TK 64, 256 threads, 1 CTA/SM    (prefix, suffix with H >= 9)
 *   d80t2 WR4 x WT2, TK 64, 256 threads, head_dim <= 80, bf16 (SigLIP where d80t4's CTAs need more
 *        than one wave: 3 images on H100)
 *   d80t4 WR4 x WT4, TK 256 (one stage), 512 threads, head_dim <= 80, bf16: each token group takes 64
 *        keys of the one tile, the four merged in shared memory (SigLIP where one wave fits: 1-2 images);
 *        d80t4h (TK 128, two stages) and d80r2t4 (WR2: 32 rows, 256 threads) are lab variants
 *        (NIB_ATTN_VARIANT=t4h / r2t4; NIB_ATTN_D80 picks any head_dim-80 variant alone)
 *   d80  WR4 x WT1, TK 64, head_dim <= 80, bf16     (NIB_ATTN_VARIANT=r4)
 *   d80wg, d80wg1, d80wg2, d80wg4: wgmma, head_dim <= 80, bf16, every key of a split (<= 256) in one tile,
 *        one / one (one CTA per SM) / two / four warpgroups (attn_wgs.cuh): lab variants, slower than d80t4
 *        in the model (NIB_ATTN_D80=wgs / wgs1 / wgs2 / wgs4)
 *   r4t2 WR4 x WT2, TK 64, 256 threads, head_dim 256, bf16 (lab: NIB_ATTN_VARIANT=t2; measured
 *        level with r8 on the Gemma prefix: 30.5 vs 30.0 us at S = 532)
 *   wg1  wgmma (attn_wg.cuh), 64 rows, TK 64, 128 threads, head_dim <= 256, bf16: the default
 *        where r8 was for a bf16 K/V (the Gemma prefix, the suffix past 128 rows), and where dec
 *        was for a bf16 cache read by 17..128 rows (the suffix at H = 3..16, per-op path)
 *   wg   the same with two warpgroups (128 rows, 256 threads): lab (NIB_ATTN_VARIANT=wg)
 *   wk2  wgmma, 64 rows, TK 32, 256 threads: two warpgroups split each CTA's keys in halves (own
 *        K/V rings) and merge in shared memory; the default for a bf16 K/V without a cache (the
 *        Gemma prefix; NIB_ATTN_WK2=0 keeps wg1 there)
 *   wg1, wg and wk2 copy by TMA where the layout allows (wg1t, wgt, wk2t); wg1t and wk2t run their
 *        "-lz" forms by default: the lazy O rescale, and for wk2t the merge split over both halves
 *        (lz_variant; NIB_ATTN_WG_LZ=0 keeps the plain ones)
 * Tested by tests/test_attention_gpu.c (`build/nib_tests attn_gpu`), timed by `nib bench attn`.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/cuda/attention.cuh"
#include "ops/cuda/attn_dec.cuh"
#include "ops/cuda/attn_wg.cuh"
#include "ops/cuda/attn_wgs.cuh"
#include "ops/cuda/tmap.h"
#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/launch.cuh"

using namespace nib;

/* ======================================================================================
 * Host side: variant table, planner, launchers.
 * ====================================================================================== */
typedef void (*attn_kernel_t)(AttnParams);

struct KInfo {
    attn_kernel_t kern;
    int fmt, dp, wr, wt, tk, threads, smem;
    const char *name;
    int rows;       /* query rows per CTA */
    int cl;         /* cluster-merge variant */
    int ready, occ; /* attributes set, CTAs per SM */
    int cl_max;     /* cluster variant: largest cluster that fits (16, 8, or 0: none) */
};

#define KI(F, DP, WR, WT, KW, ST, NAME)                                                        \
    {k_attn<F, DP, WR, WT, KW, ST>, F, DP, WR, WT, Cfg<F, DP, WR, WT, KW, ST>::TK,            \
     Cfg<F, DP, WR, WT, KW, ST>::NT, Cfg<F, DP, WR, WT, KW, ST>::SMEM, NAME, 16 * WR, 0, 0, 0, 0}
#define KIC(F)                                                                                 \
    {k_attn<F, 256, 8, 1, 2, 3, 1>, F, 256, 8, 1, Cfg<F, 256, 8, 1, 2, 3, 1>::TK,              \
     Cfg<F, 256, 8, 1, 2, 3, 1>::NT, Cfg<F, 256, 8, 1, 2, 3, 1>::SMEM, "cl", 128, 1, 0, 0, 0}
#define KID(F) {k_attn_dec<F>, F, 256, 0, DEC_NW, DEC_TK, DEC_NT, 0, "rk", 8, 0, 0, 0, 0}

enum { V_DEC = 0, V_R4 = 1, V_R8 = 2, V_PER_FMT = 3 };
static KInfo g_kinfo[] = {
    KI(F_BF16, 256, 1, 2, 1, 3, "dec"),  KI(F_BF16, 256, 4, 1, 4, 2, "r4"),  KI(F_BF16, 256, 8, 1, 4, 2, "r8"),
    KI(F_FP8, 256, 1, 2, 1, 4, "dec"),   KI(F_FP8, 256, 4, 1, 4, 2, "r4"),   KI(F_FP8, 256, 8, 1, 4, 2, "r8"),
    KI(F_NVFP4, 256, 1, 2, 1, 3, "dec"), KI(F_NVFP4, 256, 4, 1, 4, 2, "r4"), KI(F_NVFP4, 256, 8, 1, 4, 2, "r8"),
    KI(F_BF16, 80, 4, 1, 4, 2, "r4"),
    KIC(F_BF16), KIC(F_FP8), KIC(F_NVFP4),
    KID(F_BF16), KID(F_FP8), KID(F_NVFP4),
    /* two token groups per row group (8 warps, the groups merged in shared memory): SigLIP's
     * default (d80t2); at head_dim 256 a lab variant (NIB_ATTN_VARIANT=t2) */
    KI(F_BF16, 256, 4, 2, 2, 2, "r4t2"), KI(F_BF16, 80, 4, 2, 2, 2, "d80t2"),
    /* the wgmma kernel (attn_wg.cuh): bf16, head_dim <= 256: wg (128 rows), wg1 (64 rows; the default
     * where r8 was on a cache), wk2 (64 rows, the keys split between two warpgroups; the prefix's default) */
    {k_attn_wg<2, 1>, F_BF16, 256, 8, 1, WgCfg<2>::TK, WgCfg<2>::NT, WgCfg<2>::SMEM, "wg", WgCfg<2>::ROWS, 0, 0, 0, 0},
    {k_attn_wg<1, 1>, F_BF16, 256, 4, 1, WgCfg<1>::TK, WgCfg<1>::NT, WgCfg<1>::SMEM, "wg1", WgCfg<1>::ROWS, 0, 0, 0, 0},
    {k_attn_wg<1, 2>, F_BF16, 256, 4, 2, WgCfg<1, 2>::TK, WgCfg<1, 2>::NT, WgCfg<1, 2>::SMEM, "wk2", WgCfg<1, 2>::ROWS,
     0, 0, 0, 0},
    /* the same three with TMA copies (one thread per ring issues Q and the K / V tiles): the default
     * where the layout allows (tma_variant); NIB_ATTN_TMA=0 keeps the cp.async forms above */
    {k_attn_wg<2, 1, 1>, F_BF16, 256, 8, 1, WgCfg<2, 1, 1>::TK, WgCfg<2, 1, 1>::NT, WgCfg<2, 1, 1>::SMEM, "wgt",
     WgCfg<2, 1, 1>::ROWS, 0, 0, 0, 0},
    {k_attn_wg<1, 1, 1>, F_BF16, 256, 4, 1, WgCfg<1, 1, 1>::TK, WgCfg<1, 1, 1>::NT, WgCfg<1, 1, 1>::SMEM, "wg1t",
     WgCfg<1, 1, 1>::ROWS, 0, 0, 0, 0},
    {k_attn_wg<1, 2, 1>, F_BF16, 256, 4, 2, WgCfg<1, 2, 1>::TK, WgCfg<1, 2, 1>::NT, WgCfg<1, 2, 1>::SMEM, "wk2t",
     WgCfg<1, 2, 1>::ROWS, 0, 0, 0, 0},
    /* head_dim 80 with four token groups (16 or 8 warps): t4 (64 rows, one 256-key tile), t4h (64 rows,
     * 128-key tiles), r2t4 (32 rows, one 256-key tile) */
    KI(F_BF16, 80, 4, 4, 4, 1, "d80t4"), KI(F_BF16, 80, 4, 4, 2, 2, "d80t4h"), KI(F_BF16, 80, 2, 4, 4, 1, "d80r2t4"),
    /* the TMA forms wg1t and wk2t with the lazy rescale (LZ bit 1) and, wk2t, the split merge (bit 2)
     * (attn_wg.cuh; the default since the forty-sixth session, lz_variant picks them) */
    {k_attn_wg<1, 1, 1, 1>, F_BF16, 256, 4, 1, WgCfg<1, 1, 1>::TK, WgCfg<1, 1, 1>::NT, WgCfg<1, 1, 1>::SMEM, "wg1t-lz",
     WgCfg<1, 1, 1>::ROWS, 0, 0, 0, 0},
    {k_attn_wg<1, 2, 1, 3>, F_BF16, 256, 4, 2, WgCfg<1, 2, 1>::TK, WgCfg<1, 2, 1>::NT, WgCfg<1, 2, 1>::SMEM, "wk2t-lz",
     WgCfg<1, 2, 1>::ROWS, 0, 0, 0, 0},
    /* head_dim <= 80 on wgmma, every key of a split (<= 256) in one tile (attn_wgs.cuh): lab variants (slower
     * than d80t4 in the model, forty-seventh session) */
    {k_attn_wgs<1>, F_BF16, 80, 4, 1, WgsCfg<1>::TK, WgsCfg<1>::NT, WgsCfg<1>::SMEM, "d80wg", 64, 0, 0, 0, 0},
    /* the same kernel with its shared memory padded to 120 KB, so one CTA per SM (lab: NIB_ATTN_D80=wgs1) */
    {k_attn_wgs<1>, F_BF16, 80, 4, 1, WgsCfg<1>::TK, WgsCfg<1>::NT, 120 * 1024, "d80wg1", 64, 0, 0, 0, 0},
    /* the keys of a split in 2 or 4 parts, one warpgroup each, combined in shared memory (NIB_ATTN_D80=wgs2, wgs4) */
    {k_attn_wgs<2>, F_BF16, 80, 4, 2, WgsCfg<2>::TK, WgsCfg<2>::NT, WgsCfg<2>::SMEM, "d80wg2", 64, 0, 0, 0, 0},
    {k_attn_wgs<4>, F_BF16, 80, 4, 4, WgsCfg<4>::TK, WgsCfg<4>::NT, WgsCfg<4>::SMEM, "d80wg4", 64, 0, 0, 0, 0},
};
#define K_D80 (3 * V_PER_FMT)
#define K_CL (K_D80 + 1)     /* + fmt */
#define K_RK (K_CL + 3)      /* + fmt: the decode kernel (attn_dec.cuh) */
#define K_T2 (K_RK + 3)      /* r4t2 (head_dim 256), then d80t2: bf16 only */
#define K_WG (K_T2 + 2)      /* the wgmma kernel: wg, wg1, wk2; bf16, head_dim 256 */
#define K_WGT (K_WG + 3)     /* the same with TMA copies */
#define K_D80X (K_WGT + 3)   /* head_dim 80, four token groups: t4, t4h, r2t4 */
#define K_LZ (K_D80X + 3)     /* wg1t-lz, wk2t-lz */
#define K_WGS (K_LZ + 2)     /* d80wg, d80wg1, d80wg2, d80wg4 */
static int is_rk(int ki) { return ki >= K_RK && ki < K_RK + 3; }
/* the wgmma kernel (attn_wg.cuh: wg, wg1, wk2, their TMA and lazy forms): its idle splits write their valid rows */
static int is_wg(int ki) { return (ki >= K_WG && ki < K_WGT + 3) || ki == K_LZ || ki == K_LZ + 1; }

/* The forty-sixth session's forms of wg1t and wk2t (attn_wg.cuh, LZ): the lazy rescale (O rescaled only
 * where a row's maximum grew by more than 2^8) and, wk2t, the split merge (both key halves combine and
 * store half the dims). H100, `scripts/ab.sh env -n 2 -e '' -e NIB_ATTN_WG_LZ=0 -- attn --sections
 * prefix`, us, new against old: Gemma prefix S = 532 18.3 / 18.9 against 19.2 / 19.5, S = 788 24.7 / 25.5
 * against 26.8 / 26.9, S = 968 29.6 / 29.8 against 31.5 / 31.7 (each change alone gave about half);
 * fast 2 cameras H = 10 9.568 / 9.556 against 9.608 / 9.611 ms (bench/results/attn-wg-lazy-ab-h100.json).
 * NIB_ATTN_WG_LZ=0 keeps the old forms (the A/B switch); a value other than 0 / 1 is an error (-1). */
static int lz_variant(int ki) {
    const char *e = getenv("NIB_ATTN_WG_LZ");
    if (e && *e && strcmp(e, "0") && strcmp(e, "1")) return -1;
    if (e && !strcmp(e, "0")) return ki;
    return ki == K_WGT + 1 ? K_LZ : ki == K_WGT + 2 ? K_LZ + 1 : ki;
}

/* The TMA form of a wgmma plan where the layout allows it: a 64-row operand must be whole tokens of
 * one KV group (64 % group == 0), the key range non-empty (a map has no empty dimension) and each
 * tensor's strides non-decreasing (tma_ok, from the caller; head_dim is a multiple of 8 on both paths,
 * so the strides are multiples of 16 bytes); NIB_ATTN_TMA=0 keeps the cp.async forms (the A/B switch). */
static int tma_variant(int ki, int group, int64_t t_max, int tma_ok) {
    const char *e = getenv("NIB_ATTN_TMA");
    if (ki < K_WG || ki >= K_WGT || !tma_ok || t_max < 1 || group < 1 || group > 64 || 64 % group ||
        (e && !strcmp(e, "0")))
        return ki;
    return ki + 3;
}

static int g_sms;

/* the d80wg lab variant a knob names (wgs, wgs1, wgs2, wgs4: K_WGS + 0 .. 3), or -1 */
static int wgs_index(const char *v) {
    return !v ? -1 : !strcmp(v, "wgs") ? 0 : !strcmp(v, "wgs1") ? 1 : !strcmp(v, "wgs2") ? 2 : !strcmp(v, "wgs4") ? 3 : -1;
}

static int getenv_set(const char *name) {
    const char *e = getenv(name);
    return e && *e;
}

/* Cache path with <= 8 query rows per KV head (decoding one token): the register-fragment
 * decode kernel k_attn_dec ("rk", attn_dec.cuh).
 * NIB_ATTN_VARIANT=dec|r4|r8|rk forces the head_dim-256 variant (rk: <= 8 rows, cache path; r4 also
 * forces d80 at head_dim 80); t2 forces r4t2 / d80t2 (bf16 only) (a lab knob for measuring the
 * alternatives; every variant is correct for every shape). Read at every plan (host side only;
 * a captured graph keeps the plan it was captured with). */
/* Cache path (Pi0.5 suffix) with up to 128 rows (H <= 16 tokens x 8 heads): the 16-row dec
 * variant. Measured on H100 with the Pi0.5 expert step (H = 10, ~540 keys, 18 layers):
 * 1.25 ms per step with r8 (one 80-row block, few CTAs) vs 1.10 ms with dec (more CTAs; the
 * small KV stays in L2, so re-reading it per row block is cheap). */
/* More rows than r4 takes (the prefix, the suffix past H = 16) with a bf16 K/V at head_dim 256: the
 * wgmma kernel (attn_wg.cuh) with one warpgroup of 64 rows per CTA, wg1. H100, `nib bench attn`
 * (the % of peak converted to us): Gemma prefix S = 532 ~21 us unsplit against r8's 27.5 (3 splits)
 * and wg's (two warpgroups, 128 rows) 23.0 (3 splits; 30 unsplit); S = 968 ~33 unsplit against
 * 50.3 and 38.6; the suffix P = 532 H = 50 ~10 us (10 splits) against 15.8 and 13.4.
 * NIB_ATTN_VARIANT=wg1 / wg / wk2 force them on any bf16 head_dim-256 shape, =r8 forces the mma.sync
 * kernel, NIB_ATTN_WG=0 keeps r8 as the default (the A/B switch). */
static int pick_variant(int fmt, int dp, int64_t rows, int cache) {
    const char *e = getenv("NIB_ATTN_VARIANT");
    int forced = !e || !*e ? -1 : !strcmp(e, "dec") ? V_DEC : !strcmp(e, "r4") ? V_R4 : !strcmp(e, "r8") ? V_R8 : -1;
    if (e && !strcmp(e, "t2")) return fmt == F_BF16 ? (dp == 80 ? K_T2 + 1 : K_T2) : -2;
    const int x80 = !e ? -1 : !strcmp(e, "t4") ? 0 : !strcmp(e, "t4h") ? 1 : !strcmp(e, "r2t4") ? 2 : -1;
    if (x80 >= 0) return fmt == F_BF16 && dp == 80 ? K_D80X + x80 : -4;
    const int xwg = wgs_index(e);
    if (xwg >= 0) return fmt == F_BF16 && dp == 80 ? K_WGS + xwg : -4;
    const int wgv = !e ? -1 : !strcmp(e, "wg") ? 0 : !strcmp(e, "wg1") ? 1 : !strcmp(e, "wk2") ? 2 : -1;
    if (wgv >= 0) return fmt == F_BF16 && dp == 256 ? K_WG + wgv : -3;
    /* head_dim 80 (SigLIP): d80t2 (make_plan then takes d80t4 where its CTAs fit one wave); H100, 256 tokens x
     * 16 heads, bf16: 8.90 us for 2 images against 10.36 with d80 (r4), 12.28 against 12.93 for 3 (`nib bench attn
     * --variants t2`) */
    if (dp == 80) {
        /* NIB_ATTN_D80=r4|t2|t4|t4h|r2t4: the head_dim-80 kernel alone (an A/B switch for the model, where
         * NIB_ATTN_VARIANT would force the head_dim-256 calls too) */
        const char *d8 = getenv("NIB_ATTN_D80");
        if (d8 && *d8 && forced < 0) {
            if (!strcmp(d8, "r4")) return K_D80;
            if (!strcmp(d8, "t2")) return K_T2 + 1;
            if (wgs_index(d8) >= 0) return fmt == F_BF16 ? K_WGS + wgs_index(d8) : -4;
            const int x = !strcmp(d8, "t4") ? 0 : !strcmp(d8, "t4h") ? 1 : !strcmp(d8, "r2t4") ? 2 : -1;
            if (x < 0) return -5;
            return K_D80X + x;
        }
        /* the wgmma kernels d80wg / d80wg1 / d80wg2 / d80wg4 (attn_wgs.cuh, NIB_ATTN_D80=wgs / wgs1 / wgs2 / wgs4)
         * are lab variants: correct, and slower in the model than d80t4 (H100, fast, 2 cameras, vision 1.579-1.653
         * against 1.544 ms; forty-seventh session, docs/design.md) */
        return forced == V_R4 ? K_D80 : K_T2 + 1;
    }
    if ((e && !strcmp(e, "rk")) || (forced < 0 && cache && rows <= 8)) return rows <= 8 ? K_RK + fmt : -1;
    int v = forced >= 0 ? forced : rows <= 16 || (cache && rows <= 128) ? V_DEC : rows <= 64 ? V_R4 : V_R8;
    const char *wge = getenv("NIB_ATTN_WG"); /* NIB_ATTN_WG=0: the default keeps r8 / dec (A/B switch) */
    const int wg_ok = forced < 0 && fmt == F_BF16 && dp == 256 && !(wge && !strcmp(wge, "0"));
    /* the Gemma prefix (no cache): wk2, the keys of each 64-row block split between two warpgroups.
     * H100, `nib bench attn --sections prefix,cache --kv bf16 --variants wg1,wk2` (twentieth session):
     * S = 532 / 788 / 968 20.7 / 28.0 / 32.9 us against wg1's 21.4-22.0 / 29.2-29.3 / 34.2; on a cache
     * (the suffix) wk2 was slower (P = 532 H = 50 12.3 against 11.1 us), so wg1 stays there.
     * NIB_ATTN_WK2=0 keeps wg1 for the prefix too (the A/B switch). */
    const char *wk2e = getenv("NIB_ATTN_WK2");
    if (wg_ok && v == V_R8 && !cache && !(wk2e && !strcmp(wk2e, "0"))) return K_WG + 2;
    if (wg_ok && v == V_R8) return K_WG + 1;
    /* a bf16 cache read by 17..128 query rows (the Pi0.5 suffix at H = 3..16 on the per-op path):
     * wg1 too. H100, `nib bench attn --sections cache --kv bf16 --variants auto,wg1`, cold L2,
     * H = 10 (80 rows): P = 532 / 768 / 1024 9.39 / 9.54 / 10.32 us (wg1, 2 row blocks x 9-17
     * splits) against 11.41 / 10.31 / 12.07 us (dec, 5 x 17-33) */
    if (wg_ok && v == V_DEC && cache && rows > 16) return K_WG + 1;
    return fmt * V_PER_FMT + v;
}

static nib_status kinfo_ready(KInfo *k) {
    if (k->ready) return NIB_OK;
    if (!g_sms) {
        nib_device_info d;
        NIB_RETURN_IF_ERR(nib_device_require(&d));
        g_sms = d.sm_count;
    }
    NIB_CUDA_CHECK(cudaFuncSetAttribute(k->kern, cudaFuncAttributeMaxDynamicSharedMemorySize, k->smem));
    int occ = 0;
    NIB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k->kern, k->threads, (size_t)k->smem));
    if (occ < 1)
        return NIB_ERR(NIB_ERR_UNSUPPORTED_DEVICE, "attention kernel %s: does not fit on an SM (%d bytes of shared memory)",
                       k->name, k->smem);
    k->occ = occ;
    if (k->cl) { /* the largest cluster (16 needs the non-portable opt-in, then 8) of which one fits */
        NIB_CUDA_CHECK(cudaFuncSetAttribute(k->kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        for (int c = CL_MAX; c >= 8 && !k->cl_max; c /= 2) {
            cudaLaunchAttribute at;
            at.id = cudaLaunchAttributeClusterDimension;
            at.val.clusterDim.x = 1, at.val.clusterDim.y = (unsigned)c, at.val.clusterDim.z = 1;
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(1, (unsigned)c, 1);
            cfg.blockDim = dim3((unsigned)k->threads);
            cfg.dynamicSmemBytes = (size_t)k->smem;
            cfg.attrs = &at;
            cfg.numAttrs = 1;
            int n = 0;
            cudaError_t e = cudaOccupancyMaxActiveClusters(&n, k->kern, &cfg);
            if (e != cudaSuccess) {
                cudaGetLastError(); /* unchecked: clearing the probe's error; this size is then not used */
                continue;
            }
            if (n >= 1) k->cl_max = c;
        }
    }
    k->ready = 1;
    return NIB_OK;
}

struct Plan {
    int ki;
    int row_blocks, n_splits, z, sl_log2, merge_per;
    uint64_t ws_bytes, ws_o_elems, ws_ml_elems;
};

/* Splits so that the busiest SM streams the fewest tiles: cost(s) = waves(s) * ceil(tiles / s)
 * + (s > 1: the partial write + merge, in tiles: merge_tiles); ties keep fewer splits.
 * merge_tiles is 1, except for the wgmma kernels (4, plus one tile per CTA and wave for the
 * prologue and epilogue: see pick_variant's measurements) and the head_dim-80 prefix (SigLIP), whose tiles are so cheap that
 * the merge pass (fp32 partials out and back, one more kernel) costs several of them: measured
 * on H100 (`nib bench attn --sections prefix`, NIB_ATTN_SPLITS=1 vs the old 1-tile model):
 * 256 tokens x 1 / 2 / 3 images 10 / 10 / 13 us unsplit vs 13 / 15 / 17 us with 4 / 2 / 2
 * splits. 8 tiles = 512 keys: SigLIP's 256-token images never split. */
/* Cache path with at most 128 rows (one row block: the suffix of H <= 16 tokens, decoding):
 * the cluster variant, where the CTAs of one cluster split the keys and merge through
 * distributed shared memory (no workspace round trip, no merge kernel). OPT-IN, because it
 * measured slower where it matters (H100, commit after 0648237): `nib bench attn` P=532 H=10
 * bf16 16.6 us vs 12.4 us for dec + merge; the Pi0.5 expert step 0.966 vs 0.902 ms. ncu: a
 * third of its samples wait at the two cluster barriers (the slowest split, then the slowest
 * merge), and 16 CTAs cannot pull the cache as fast as dec's 85. It wins only on short decodes
 * (T = 1024: 10.1 vs 11.6 us). Knobs (host side, read at every plan): NIB_ATTN_VARIANT=cl or
 * NIB_ATTN_CLUSTER=8|16 turn it on (the latter picks the size), NIB_ATTN_CLUSTER=0 keeps it off.
 * Sets *used when the plan uses it. */
static nib_status plan_cluster(int fmt, int64_t rows_max, int64_t z, Plan *pl, int *used) {
    *used = 0;
    const char *e = getenv("NIB_ATTN_VARIANT"), *ce = getenv("NIB_ATTN_CLUSTER");
    const int forced = e && !strcmp(e, "cl"), other = e && *e && !forced;
    const int want = ce && *ce ? atoi(ce) : -1;
    if (!forced && want < 0) return NIB_OK; /* opt-in */
    if (rows_max > 128 || other || want == 0) {
        if (forced) return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention: NIB_ATTN_VARIANT=cl needs <= 128 query rows per KV "
                                   "head (got %lld) and NIB_ATTN_CLUSTER != 0", (long long)rows_max);
        return NIB_OK;
    }
    KInfo *k = &g_kinfo[K_CL + fmt];
    NIB_RETURN_IF_ERR(kinfo_ready(k));
    if (want > 0 && want != 8 && want != 16)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention: NIB_ATTN_CLUSTER=%s (0, 8 or 16)", ce);
    const int c = want > 0 ? want : k->cl_max;
    if (c == 0 || c > k->cl_max) {
        if (forced || want > 0)
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention: a cluster of %d CTAs with %d bytes of shared memory each "
                           "does not fit on this device (largest: %d)", c ? c : 8, k->smem, k->cl_max);
        return NIB_OK;
    }
    if (z > 65535) return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention: %lld KV heads exceed the grid", (long long)z);
    pl->ki = K_CL + fmt;
    pl->row_blocks = 1;
    pl->n_splits = c;
    pl->z = (int)z;
    *used = 1;
    return NIB_OK;
}

static nib_status make_plan(int fmt, int dp, int64_t rows_max, int64_t t_max, int64_t z, int d, int cache, int group,
                            int tma_ok, Plan *pl) {
    memset(pl, 0, sizeof *pl);
    if (cache && dp == 256) {
        int used = 0;
        NIB_RETURN_IF_ERR(plan_cluster(fmt, rows_max, z, pl, &used));
        if (used) return NIB_OK;
    }
    pl->ki = pick_variant(fmt, dp, rows_max, cache);
    if (pl->ki == -2)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention: NIB_ATTN_VARIANT=t2 takes a bf16 KV only; got %s",
                       nib_kv_dtype_name((nib_kv_dtype)fmt));
    if (pl->ki == -3)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention: NIB_ATTN_VARIANT=%s (the wgmma kernel) takes a bf16 K/V with "
                       "head_dim 88..256 (padded to 256); got a %s K/V, head_dim padded to %d", getenv("NIB_ATTN_VARIANT"),
                       nib_kv_dtype_name((nib_kv_dtype)fmt), dp);
    if (pl->ki == -5)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention: NIB_ATTN_D80=%s (r4, t2, t4, t4h, r2t4, wgs, wgs1, wgs2 or wgs4)",
                       getenv("NIB_ATTN_D80"));
    if (pl->ki == -4)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention: NIB_ATTN_VARIANT=%s takes a bf16 K/V with head_dim <= 80; got a "
                       "%s K/V, head_dim padded to %d", getenv("NIB_ATTN_VARIANT"), nib_kv_dtype_name((nib_kv_dtype)fmt), dp);
    if (pl->ki < 0)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention: NIB_ATTN_VARIANT=rk (the decode kernel) takes <= 8 query rows per "
                       "KV head; got %lld", (long long)rows_max);
    pl->ki = tma_variant(pl->ki, group, t_max, tma_ok);
    pl->ki = lz_variant(pl->ki);
    if (pl->ki < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention: NIB_ATTN_WG_LZ=%s (0 or 1)", getenv("NIB_ATTN_WG_LZ"));
    /* d80wg holds one 256-key tile per split: a prefix of more tiles than splits can be takes d80t2 */
    if (pl->ki >= K_WGS && (t_max + WgsCfg<>::TK - 1) / WgsCfg<>::TK > MAX_SPLITS) pl->ki = K_T2 + 1;
    if (pl->ki == K_T2 + 1 && !getenv_set("NIB_ATTN_VARIANT") && !getenv_set("NIB_ATTN_D80")) {
        /* head_dim 80 (SigLIP), unforced: t4 (four token groups, one 256-key tile, 16 warps) where its CTAs
         * fit one wave, else d80t2 (two CTAs per SM). H100, fast, `NIB_ATTN_D80=t2|t4 nib bench pi05`, two
         * rounds: 2 cameras (128 CTAs) vision 1.657 / 1.665 -> 1.573 / 1.575 ms; 3 cameras (192 CTAs, two
         * waves of t4) 2.032 -> 2.138 ms, so t2 stays there */
        KInfo *k4 = &g_kinfo[K_D80X];
        NIB_RETURN_IF_ERR(kinfo_ready(k4));
        if ((rows_max + k4->rows - 1) / k4->rows * z <= (int64_t)g_sms * k4->occ) pl->ki = K_D80X;
    }
    KInfo *k = &g_kinfo[pl->ki];
    NIB_RETURN_IF_ERR(kinfo_ready(k));
    const int64_t rows_cta = k->rows;
    const int64_t rb = (rows_max + rows_cta - 1) / rows_cta;
    if (rb > 0x7FFFFFFF || z > 65535)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention: %lld row blocks x %lld (sequence, KV head) pairs exceed the grid",
                       (long long)rb, (long long)z);
    const int64_t tiles = t_max > 0 ? (t_max + k->tk - 1) / k->tk : 1;
    /* the decode kernel: one CTA per SM measured best (H100, T = 32768: 132 splits 21.7 / 17.5 /
     * 17.4 us for bf16 / fp8 / nvfp4 vs 24.8 / 18.7 / 17.5 us with 264 at 2 per SM) */
    const int64_t slots = (int64_t)g_sms * (pl->ki >= K_RK && pl->ki < K_T2 ? 1 : k->occ);
    const double merge_tiles = !cache && dp == 80 ? 8.0 : pl->ki >= K_WG ? 4.0 : 1.0;
    const double cta_fixed = pl->ki >= K_WG ? 1.0 : 0.0; /* wg: a CTA's prologue + epilogue ~ one tile */
    double best = 1e300;
    int bs = 1;
    for (int64_t s = 1; s <= tiles && s <= MAX_SPLITS; s++) {
        double waves = (double)((rb * z * s + slots - 1) / slots);
        /* the wgmma kernel on a cache: the merge grows with the partials, splits x row blocks
         * (fp32, 64 rows x 256 each), ~0.03 tile per block. H100, `NIB_ATTN_SPLITS` forced, P =
         * 532 / 768 / 1024 at H = 50 (7 row blocks): the best counts were 6-10 / 8 / 6 where the
         * plain model took every tile (10 / 13 / 17: up to 15 % slower); at H = 10 (2 row blocks)
         * every tile stays best (7 and 9 splits at P = 768 / 1024: 10.86 / 11.15 against 9.54 /
         * 10.40 us) */
        const double per_split = cache && pl->ki >= K_WG ? 0.22 / 7.0 * (double)s * (double)(rb * z) : 0.0;
        double cost = waves * ((double)((tiles + s - 1) / s) + cta_fixed) + (s > 1 ? merge_tiles + per_split : 0.0);
        if (cost < best - 1e-9) {
            best = cost;
            bs = (int)s;
        }
    }
    /* NIB_ATTN_SPLITS=N: a lab knob forcing the split count (clamped to [1, tiles]) */
    const char *fs = getenv("NIB_ATTN_SPLITS");
    if (fs && *fs) {
        long v = strtol(fs, NULL, 10);
        bs = (int)(v < 1 ? 1 : v > tiles ? tiles : v > MAX_SPLITS ? MAX_SPLITS : v);
    }
    if (pl->ki >= K_WGS) bs = (int)tiles; /* one tile per split: d80wg takes every key of a split at once */
    pl->row_blocks = (int)rb;
    pl->n_splits = bs;
    pl->z = (int)z;
    /* merge: each thread sums at most PER splits (4, 8 or 16), split lanes <= 32 */
    pl->merge_per = bs <= 4 ? 4 : bs <= 8 * 32 ? 8 : 16;
    int sl = 0;
    while ((1 << sl) < 32 && (1 << sl) * pl->merge_per < bs) sl++;
    pl->sl_log2 = sl;
    if (bs > 1) {
        pl->ws_o_elems = (uint64_t)z * bs * rows_max * d;
        pl->ws_ml_elems = (uint64_t)z * bs * rows_max;
        uint64_t o_bytes = (pl->ws_o_elems * 4 + 255) / 256 * 256, ml_bytes = (pl->ws_ml_elems * 4 + 255) / 256 * 256;
        pl->ws_bytes = o_bytes + 2 * ml_bytes;
    }
    return NIB_OK;
}

static void fill_plan_out(const Plan &pl, nib_attn_plan *o) {
    const KInfo &k = g_kinfo[pl.ki];
    memset(o, 0, sizeof *o);
    snprintf(o->kernel, sizeof o->kernel, "%s d%d %s tk%d", nib_kv_dtype_name((nib_kv_dtype)k.fmt), k.dp, k.name, k.tk);
    o->rows_per_cta = k.rows;
    o->warps = k.threads / 32;
    o->tile_tokens = k.tk;
    o->n_splits = pl.n_splits;
    o->row_blocks = pl.row_blocks;
    o->z = pl.z;
    o->ctas = pl.row_blocks * pl.n_splits * pl.z;
    o->ctas_per_sm = k.occ;
    o->smem_bytes = (uint64_t)k.smem;
    o->ws_bytes = pl.ws_bytes;
}

static long long g_lens_early_launches; /* k_attn_dec launches with the lengths read before the wait */
long long nib_cuda_attn_lens_early_launches(void) {
    return __atomic_load_n(&g_lens_early_launches, __ATOMIC_RELAXED);
}

static nib_status launch(AttnParams p, const Plan &pl, void *ws, cudaStream_t stream, int cache) {
    const KInfo &k = g_kinfo[pl.ki];
    const char *mae = getenv("NIB_ATTN_MERGE_ALL");
    if (mae && *mae && strcmp(mae, "0") && strcmp(mae, "1"))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_ATTN_MERGE_ALL=%s: 1 (the split merge loads every partial before a "
                       "length where the kernel writes them all, the default) or 0 (the lengths first)", mae);
    const char *lfe = getenv("NIB_ATTN_MERGE_LF");
    const int lf_mode = !lfe || !*lfe ? 1 : lfe[1] ? -1 : lfe[0] - '0';
    if (lf_mode < 0 || lf_mode > 3)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_ATTN_MERGE_LF=%s: where the split merge loads its lengths with its "
                       "partials: 0 nowhere, 1 after the wgmma kernel on a cache (the default), 2 on every cache, 3 "
                       "everywhere", lfe);
    if (pl.ws_bytes && !ws)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention: this shape splits the keys %d ways and needs a workspace of "
                       "%llu bytes (nib_cuda_attn_*_ws_bytes); ws is NULL",
                       pl.n_splits, (unsigned long long)pl.ws_bytes);
    if (ws && ((uintptr_t)ws % 256)) return NIB_ERR(NIB_ERR_SHAPE, "attention: workspace must be 256-byte aligned");
    p.n_splits = pl.n_splits;
    if (pl.n_splits > 1) {
        uint8_t *w = (uint8_t *)ws;
        uint64_t o_bytes = (pl.ws_o_elems * 4 + 255) / 256 * 256, ml_bytes = (pl.ws_ml_elems * 4 + 255) / 256 * 256;
        p.ws_o = (float *)w;
        p.ws_m = (float *)(w + o_bytes);
        p.ws_l = (float *)(w + o_bytes + ml_bytes);
    }
    if (pl.ki >= K_WGT) { /* the TMA forms: Q [seq][token][head][d], K / V [seq][token][kv head][d] */
        const int64_t d = p.d, nh = (int64_t)p.n_kv * p.group;
        const int64_t qs = p.n_seq > 1 ? p.q_seq * 2 : p.q_tok * 2 * p.nq_max;
        const int64_t qd[4] = {d, nh, p.nq_max, p.n_seq}, qst[3] = {d * 2, p.q_tok * 2, qs};
        const int qb[4] = {64, p.group, 64 / p.group, 1};
        NIB_RETURN_IF_ERR(nib_tmap_bf16_sw128(&p.tmq, p.q, 4, qd, qst, qb, "attention q"));
        const int64_t kvd[4] = {d, p.n_kv, p.t_max, p.n_seq};
        const int kvb[4] = {64, 1, k.tk, 1};
        const int64_t kst[3] = {p.kv_head, p.k_tok, p.n_seq > 1 ? p.k_seq : p.k_tok * p.t_max};
        const int64_t vst[3] = {p.kv_head, p.v_tok, p.n_seq > 1 ? p.v_seq : p.v_tok * p.t_max};
        NIB_RETURN_IF_ERR(nib_tmap_bf16_sw128(&p.tmk, p.k, 4, kvd, kst, kvb, "attention k"));
        NIB_RETURN_IF_ERR(nib_tmap_bf16_sw128(&p.tmv, p.v, 4, kvd, vst, kvb, "attention v"));
    }
    dim3 grid((unsigned)pl.row_blocks, (unsigned)pl.n_splits, (unsigned)pl.z);
    if (k.cl) { /* the splits of a row block form one cluster and merge in it: no merge kernel */
        NIB_CUDA_CHECK(nib::launch_cluster(k.kern, grid, dim3((unsigned)k.threads), (size_t)k.smem, stream,
                                           dim3(1, (unsigned)pl.n_splits, 1), p));
        NIB_LAUNCH_CHECK("k_attn (cluster)");
        return NIB_OK;
    }
    NIB_CUDA_CHECK(nib::launch(k.kern, grid, dim3((unsigned)k.threads), (size_t)k.smem, stream, p));
    NIB_LAUNCH_CHECK("k_attn");
    if (p.lens_early && !strcmp(k.name, "rk")) __atomic_fetch_add(&g_lens_early_launches, 1, __ATOMIC_RELAXED);
    if (pl.n_splits > 1) {
        MergeParams m;
        m.ws_o = p.ws_o;
        m.ws_m = p.ws_m;
        m.ws_l = p.ws_l;
        m.o = p.o;
        m.o_tok = p.o_tok;
        m.o_seq = p.o_seq;
        m.t_valid = p.t_valid;
        m.nq_valid = p.nq_valid;
        m.nseq_valid = p.nseq_valid;
        m.t_max = p.t_max;
        m.nq_max = p.nq_max;
        m.n_seq = p.n_seq;
        m.n_kv = p.n_kv;
        m.group = p.group;
        m.d = p.d;
        m.rows_max = p.rows_max;
        m.n_splits = pl.n_splits;
        m.tk = k.tk;
        m.sl_log2 = pl.sl_log2;
        long long threads = (long long)p.rows_max * (p.d / 4) << pl.sl_log2;
        long long blocks = (threads + 255) / 256;
        if (threads > 0x7FFFFFFFLL) /* the merge kernel indexes threads in 32 bits */
            return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention merge: %lld threads (rows x head_dim / 4 x split lanes)",
                           threads);
        /* rk writes every workspace entry (attn_dec.cuh), the wgmma kernel every entry of its valid rows, idle
         * splits included (attn_wg.cuh): their merge loads them before reading a length. NIB_ATTN_MERGE_ALL=0:
         * the merge that reads the lengths first (the A/B switch) */
        const bool all = (is_rk(pl.ki) || is_wg(pl.ki)) && !(mae && !strcmp(mae, "0"));
        /* NIB_ATTN_MERGE_LF: where the merge loads all partials first, its two lengths go with them (one L2 round
         * trip, not three). H200, sixty-first session: after the wgmma kernel on a cache (the H = 50 suffix, and 3
         * cameras at H = 10) 0.01-0.06 ms off a call; after rk as well (=2) 2 cameras at H = 10 lost 0.12 ms (the
         * first step runs beside the prefix there), and on the prefix too (=3) the same;
         * the wgmma kernel's merges on the prefix as well (=4, sixty-second session) measured 0-0.03 ms slower and
         * went */
        const bool lf = all && (lf_mode == 3 || (cache && (lf_mode == 2 || (lf_mode == 1 && is_wg(pl.ki)))));
        void (*mk)(MergeParams) =
            pl.merge_per == 16 ? (lf ? k_attn_merge<16, true, true> : all ? k_attn_merge<16, true> : k_attn_merge<16>)
            : pl.merge_per == 8 ? (lf ? k_attn_merge<8, true, true> : all ? k_attn_merge<8, true> : k_attn_merge<8>)
                                : (lf ? k_attn_merge<4, true, true> : all ? k_attn_merge<4, true> : k_attn_merge<4>);
        NIB_CUDA_CHECK(nib::launch(mk, dim3((unsigned)blocks, (unsigned)pl.z), dim3(256), 0, stream, m));
        NIB_LAUNCH_CHECK("k_attn_merge");
    }
    return NIB_OK;
}

/* ---- prefix ------------------------------------------------------------------------------ */

static nib_status prefix_check(const nib_attn_prefix_args *a, int *dp) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "attention prefix: NULL args");
    if (a->n_heads < 1 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads || a->n_seq < 1 || a->s_max < 1)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention prefix: %d heads / %d KV heads (must divide), n_seq %d, s_max %d",
                       a->n_heads, a->n_kv_heads, a->n_seq, a->s_max);
    if (a->head_dim < 8 || a->head_dim > 256 || a->head_dim % 8)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention prefix: head_dim %d (CUDA: a multiple of 8, at most 256)",
                       a->head_dim);
    const int64_t d = a->head_dim;
    if (a->q_tok < a->n_heads * d || a->o_tok < a->n_heads * d || a->k_tok < a->n_kv_heads * d ||
        a->v_tok < a->n_kv_heads * d || a->q_seq < 0 || a->k_seq < 0 || a->v_seq < 0 || a->o_seq < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention prefix: token strides must cover the heads, sequence strides >= 0");
    if ((a->q_tok | a->k_tok | a->v_tok | a->o_tok | a->q_seq | a->k_seq | a->v_seq | a->o_seq) % 8)
        return NIB_ERR(NIB_ERR_SHAPE, "attention prefix: strides must be multiples of 8 elements (16-byte rows)");
    if (!(a->logit_scale >= 0.0f && a->logit_scale <= FLT_MAX))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention prefix: logit_scale %g (finite, >= 0; 0 = none)",
                       (double)a->logit_scale);
    *dp = a->head_dim <= 80 ? 80 : 256;
    return NIB_OK;
}

/* the prefix's tensors as TMA sees them: [seq][token][head][d], strides non-decreasing */
static int prefix_tma_ok(const nib_attn_prefix_args *a) {
    if (a->n_seq == 1) return 1;
    return a->q_seq >= a->q_tok * a->s_max && a->k_seq >= a->k_tok * a->s_max && a->v_seq >= a->v_tok * a->s_max;
}

nib_status nib_cuda_attn_prefix_plan(const nib_attn_prefix_args *a, nib_attn_plan *out) {
    int dp = 0;
    NIB_RETURN_IF_ERR(prefix_check(a, &dp));
    Plan pl;
    NIB_RETURN_IF_ERR(make_plan(F_BF16, dp, (int64_t)a->s_max * (a->n_heads / a->n_kv_heads), a->s_max,
                                (int64_t)a->n_seq * a->n_kv_heads, a->head_dim, 0, a->n_heads / a->n_kv_heads,
                                prefix_tma_ok(a), &pl));
    if (out) fill_plan_out(pl, out);
    return NIB_OK;
}

nib_status nib_cuda_attn_prefix_ws_bytes(const nib_attn_prefix_args *a, uint64_t *bytes) {
    nib_attn_plan p;
    NIB_RETURN_IF_ERR(nib_cuda_attn_prefix_plan(a, &p));
    *bytes = p.ws_bytes;
    return NIB_OK;
}

nib_status nib_cuda_attn_prefix(const nib_attn_prefix_args *a, void *ws, void *stream) {
    int dp = 0;
    NIB_RETURN_IF_ERR(prefix_check(a, &dp));
    if (!a->q || !a->k || !a->v || !a->o) return NIB_ERR(NIB_ERR_INVALID_ARG, "attention prefix: NULL q, k, v or o");
    if (((uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->v | (uintptr_t)a->o) % 16)
        return NIB_ERR(NIB_ERR_SHAPE, "attention prefix: q, k, v and o must be 16-byte aligned");
    const int group = a->n_heads / a->n_kv_heads;
    Plan pl;
    NIB_RETURN_IF_ERR(make_plan(F_BF16, dp, (int64_t)a->s_max * group, a->s_max, (int64_t)a->n_seq * a->n_kv_heads,
                                a->head_dim, 0, group, prefix_tma_ok(a), &pl));
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.q = (const __nv_bfloat16 *)a->q;
    p.o = (__nv_bfloat16 *)a->o;
    p.q_tok = a->q_tok;
    p.o_tok = a->o_tok;
    p.q_seq = a->q_seq;
    p.o_seq = a->o_seq;
    p.k = (const uint8_t *)a->k;
    p.v = (const uint8_t *)a->v;
    p.k_tok = a->k_tok * 2;
    p.v_tok = a->v_tok * 2;
    p.k_seq = a->k_seq * 2;
    p.v_seq = a->v_seq * 2;
    p.kv_head = (long long)a->head_dim * 2;
    p.t_valid = a->s_valid; /* the prefix's keys and queries are the same tokens */
    p.nq_valid = a->s_valid;
    p.nseq_valid = a->n_seq_valid;
    p.t_max = a->s_max;
    p.nq_max = a->s_max;
    p.n_seq = a->n_seq;
    p.n_kv = a->n_kv_heads;
    p.group = group;
    p.d = a->head_dim;
    p.rows_max = a->s_max * group;
    /* the logit scale and log2(e) as one fp32 factor (exactly LOG2E_F without a scale) */
    p.lscale = a->logit_scale > 0.0f && a->logit_scale != 1.0f ? (float)((double)a->logit_scale * 1.4426950408889634)
                                                              : LOG2E_F;
    return launch(p, pl, ws, (cudaStream_t)stream, 0);
}

/* ---- cache ------------------------------------------------------------------------------- */

static nib_status cache_check(const nib_attn_cache_args *a) {
    if (!a) return NIB_ERR(NIB_ERR_INVALID_ARG, "attention cache: NULL args");
    const nib_kv_layer *kv = &a->kv;
    if ((unsigned)kv->dtype >= NIB_KV_COUNT)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention cache: KV dtype %d", (int)kv->dtype);
    if (a->n_heads < 1 || kv->n_kv_heads < 1 || a->n_heads % kv->n_kv_heads || a->nq < 1 || kv->t_max < 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention cache: %d heads / %d KV heads (must divide), nq %d, t_max %d",
                       a->n_heads, kv->n_kv_heads, a->nq, kv->t_max);
    if (kv->head_dim != 256)
        return NIB_ERR(NIB_ERR_UNSUPPORTED, "attention cache: head_dim %d (the CUDA kernels support 256)", kv->head_dim);
    if (a->q_tok < (int64_t)a->n_heads * 256 || a->o_tok < (int64_t)a->n_heads * 256 || (a->q_tok | a->o_tok) % 8)
        return NIB_ERR(NIB_ERR_SHAPE, "attention cache: q_tok %lld / o_tok %lld must cover %d heads of 256 and be "
                       "multiples of 8", (long long)a->q_tok, (long long)a->o_tok, a->n_heads);
    return NIB_OK;
}

/* Several query tokens that all see the same keys (the Pi0.5 suffix: H tokens over P + H slots) as
 * that many independent decodes: the decode kernel rk with one token per "sequence" (the tokens'
 * rows as sequences of one token, the cache shared: k_seq = v_seq = 0, nseq_valid = nq_valid). Each
 * token reads the whole cache, from L2 after the first, so it pays while its CTAs are few: where
 * work = tokens x KV heads x 64-key tiles of t_max is at most 4 waves of SMs for an FP8 / NVFP4 cache
 * (against the tile kernel dec) and 3/4 of a wave for bf16 (against the wgmma kernel wg1). H100, `nib
 * bench attn --sections cache`, cold (bench/results/attn-cache-per-token-h100.json), us, default -> per token:
 *   H = 10: P = 532 (work 90) bf16 7.77 -> 7.05, fp8 11.57 -> 7.25, nvfp4 11.45 -> 6.99; P = 768 (130)
 *           bf16 7.57 -> 7.33, fp8 11.51 -> 7.54; P = 1024 (170) bf16 8.17 -> 8.38, fp8 13.25 -> 8.46;
 *   H = 50: P = 532 (500) bf16 8.97 -> 11.19, fp8 16.46 -> 11.00; P = 768 (650) fp8 17.18 -> 18.53.
 * The bf16 bound was one wave until Pi0.5's calls (fast, H = 10, the cache viewed at S + H keys;
 * bench/results/pi05-cache-view-h100.json) put it lower: work 50 / 90 / 130 at 1 / 2 / 3 cameras,
 * per token 9.55 / 10.59 / 12.21 against wg1's 10.37 / 10.71 / 12.05 ms per call.
 * NIB_ATTN_PER_TOKEN=0 / 1 forces it off / on (where rk can take one token: group <= 8); a forced
 * NIB_ATTN_VARIANT turns it off. */
static int cache_per_token(const nib_attn_cache_args *a) {
    const char *e = getenv("NIB_ATTN_PER_TOKEN");
    const int group = a->n_heads / a->kv.n_kv_heads;
    if (a->nq < 2 || group > 8 || getenv_set("NIB_ATTN_VARIANT") || (e && !strcmp(e, "0"))) return 0;
    if (e && !strcmp(e, "1")) return 1;
    if (!g_sms) {
        nib_device_info d;
        if (nib_device_require(&d) != NIB_OK) {
            nib_clear_error();
            return 0;
        }
        g_sms = d.sm_count;
    }
    const int64_t work = (int64_t)a->nq * a->kv.n_kv_heads * (((int64_t)a->kv.t_max + 63) / 64);
    return a->kv.dtype == NIB_KV_BF16 ? 4 * work <= 3 * (int64_t)g_sms : work <= 4 * (int64_t)g_sms;
}

static nib_status cache_plan(const nib_attn_cache_args *a, Plan *pl, int *per_token) {
    const int group = a->n_heads / a->kv.n_kv_heads;
    *per_token = cache_per_token(a);
    if (*per_token)
        return make_plan((int)a->kv.dtype, 256, group, a->kv.t_max, (int64_t)a->nq * a->kv.n_kv_heads, 256, 1, group, 1,
                         pl);
    return make_plan((int)a->kv.dtype, 256, (int64_t)a->nq * group, a->kv.t_max, a->kv.n_kv_heads, 256, 1, group, 1, pl);
}

nib_status nib_cuda_attn_cache_plan(const nib_attn_cache_args *a, nib_attn_plan *out) {
    NIB_RETURN_IF_ERR(cache_check(a));
    Plan pl;
    int per_token = 0;
    NIB_RETURN_IF_ERR(cache_plan(a, &pl, &per_token));
    if (out) {
        fill_plan_out(pl, out);
        if (per_token) {
            const size_t n = strlen(out->kernel);
            snprintf(out->kernel + n, sizeof out->kernel - n, " per token");
        }
    }
    return NIB_OK;
}

nib_status nib_cuda_attn_cache_ws_bytes(const nib_attn_cache_args *a, uint64_t *bytes) {
    nib_attn_plan p;
    NIB_RETURN_IF_ERR(nib_cuda_attn_cache_plan(a, &p));
    *bytes = p.ws_bytes;
    return NIB_OK;
}

nib_status nib_cuda_attn_cache(const nib_attn_cache_args *a, void *ws, void *stream) {
    NIB_RETURN_IF_ERR(cache_check(a));
    const nib_kv_layer *kv = &a->kv;
    if (!a->q || !a->o || !a->t_valid || !kv->k || !kv->v || (kv->dtype != NIB_KV_BF16 && (!kv->ks || !kv->vs)) ||
        (kv->dtype == NIB_KV_NVFP4 && (!kv->kb || !kv->vb)))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "attention cache: NULL q, o, t_valid or %s cache plane",
                       nib_kv_dtype_name(kv->dtype));
    if (((uintptr_t)a->q | (uintptr_t)a->o | (uintptr_t)kv->k | (uintptr_t)kv->v | (uintptr_t)kv->kb |
         (uintptr_t)kv->vb) % 16 ||
        ((uintptr_t)kv->ks | (uintptr_t)kv->vs) % 4)
        return NIB_ERR(NIB_ERR_SHAPE, "attention cache: q, o and the cache planes must be 16-byte aligned "
                       "(nib_kv_layer_map aligns planes to 256)");
    const int group = a->n_heads / kv->n_kv_heads;
    Plan pl;
    int per_token = 0;
    NIB_RETURN_IF_ERR(cache_plan(a, &pl, &per_token));
    const long long rowb = kv->dtype == NIB_KV_BF16 ? 512 : kv->dtype == NIB_KV_FP8 ? 256 : 128;
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.lscale = LOG2E_F; /* the cache op applies no logit scale */
    p.q = (const __nv_bfloat16 *)a->q;
    p.o = (__nv_bfloat16 *)a->o;
    p.q_tok = a->q_tok;
    p.o_tok = a->o_tok;
    p.k = (const uint8_t *)kv->k;
    p.v = (const uint8_t *)kv->v;
    p.k_tok = p.v_tok = rowb * kv->n_kv_heads;
    p.kv_head = rowb;
    p.kb = kv->kb;
    p.vb = kv->vb;
    p.ks = kv->ks;
    p.vs = kv->vs;
    p.t_valid = a->t_valid;
    p.nq_valid = a->nq_valid;
    p.t_max = kv->t_max;
    p.nq_max = a->nq;
    p.n_seq = 1;
    p.n_kv = kv->n_kv_heads;
    p.group = group;
    p.d = 256;
    p.rows_max = a->nq * group;
    if (per_token) { /* each token a sequence of one, the cache shared (k_seq = v_seq = 0) */
        p.nseq_valid = a->nq_valid;
        p.nq_valid = NULL;
        p.n_seq = a->nq;
        p.nq_max = 1;
        p.q_seq = a->q_tok;
        p.o_seq = a->o_tok;
        p.rows_max = group;
    }
    /* bf16 caches: the split's K / V rows prefetched into L2 before the PDL wait (attn_prefetch_kv; in the
     * wgmma kernels and rk). H100, NIB_ATTN_PREFETCH=0 against on (bench/results/attn-prefetch-ab-h100.json):
     * `nib bench pi05 --preset bf16` (2 cameras, H = 10, per-op expert: 180 cache attentions a call), four
     * pairs over two runs, 13.557 / 13.558 / 13.570 / 13.574 -> 13.520 / 13.522 / 13.531 / 13.530 ms;
     * `nib bench attn` decode bf16 T = 1024 7.82 -> 7.56 us, T = 4096 9.38 -> 8.82, longer T and the
     * cache rows within the lab's run-to-run spread (+-0.15 us). For FP8 / NVFP4 caches (with their scale
     * rows, in the first version) it was mixed: rk fp8 T = 1024 and 32768 0.2 us slower, r8 at H = 50
     * 0.3-1.0 us slower even with the cache in L2, so it is off there. NIB_ATTN_PREFETCH=0: off. */
    const char *pe = getenv("NIB_ATTN_PREFETCH");
    p.pf_kv = kv->dtype == NIB_KV_BF16 && !(pe && pe[0] == '0' && !pe[1]);
    /* Where the caller settled the lengths (a->lens_settled), the decode kernel reads them before its PDL wait
     * (runtime/launch.cuh, rule 1b), so Q, K and V are one L2 round trip sooner after it. Sixty-eighth session,
     * `scripts/ab.sh env -n 2 -q -e '' -e NIB_ATTN_LENS_EARLY=1 -- pi05 --preset fast --cams 2 --reps 100` on one
     * H200: 8.896 / 8.897 -> 8.867 / 8.864 ms (step 0.530 -> 0.526-0.527), H = 50 unchanged (10.718-10.723)
     * (bench/results/attn-lens-early-ab-h200.json). NIB_ATTN_LENS_EARLY=0: after the wait, as before. */
    const char *le = getenv("NIB_ATTN_LENS_EARLY");
    if (le && *le && strcmp(le, "0") && strcmp(le, "1"))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_ATTN_LENS_EARLY=%s: 1 (the decode kernel reads lengths the caller "
                       "settled before its PDL wait, the default) or 0 (after it)", le);
    p.lens_early = a->lens_settled && !(le && !strcmp(le, "0"));
    return launch(p, pl, ws, (cudaStream_t)stream, 1);
}

NIB_KTRACE_UNIT(attention)
