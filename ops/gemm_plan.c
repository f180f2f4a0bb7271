/* gemm_plan.c — launch plans of the low-bit weight GEMM (ops/cuda/gemm_lowbit.cu).
 *
 * A plan is (MT = 8-token tiles per M chunk, wk = warps along K of the CTA's 8, ks = CTAs along
 * K, occ = resident CTAs per SM the kernel's registers are budgeted for), plus the X window and
 * shared-memory layout that follow from it. The planner enumerates every plan that fits and
 * keeps the cheapest by a cost model fitted to `nib bench gemm --sweep` on the H100. This file
 * is host code with no CUDA dependency, so the model is checked in every build against the
 * recorded sweep (tests/test_gemm_plan.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gemm.h"

/* X windows for `steps` pipeline steps: the largest window (in steps, at most wmax) whose buffers fit. */
static int plan_x(int xrows_alloc, int wk, int cps, int steps, int wmax, int stages, int budget, int *xw, int *nxb,
                  int *lds) {
    for (int w = steps < wmax ? steps : wmax; w >= 1; w--) {
        int nb = w >= steps ? 1 : 1 + (stages - 1 + w - 1) / w;
        int l = w * wk * cps * NIB_GEMM_KCH + 8; /* +8 elements: conflict-free ldmatrix rows */
        if ((long)nb * xrows_alloc * l * 2 <= budget) {
            *xw = w;
            *nxb = nb;
            *lds = l;
            return 1;
        }
    }
    return 0;
}

/* One launch plan: wk warps along K, occ_regs resident CTAs per SM the registers are budgeted
 * for (2, or 1 for MT = 8), ks CTAs along K. Returns 0 when it does not fit or is not distinct;
 * *cost_out is the planner's estimate in pipeline-step units. */
static int plan_eval_x(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, int mt, int wk, int occ_regs,
                       int ks, int reg, int wmax, nib_gemm_plan *pl, double *cost_out) {
    memset(pl, 0, sizeof *pl);
    pl->mt = mt;
    if (occ_regs != 2 && !(occ_regs == 1 && pl->mt == 8)) return 0; /* instantiated: OCC 2, MT 8 also OCC 1 */
    if (reg && pl->mt == 8) return 0;                                  /* register weights: MT <= 4 */
    if (reg == 2 && pl->mt != 1) return 0; /* bulk rings: MT = 1 only (MT = 2 / 4 lost in the v6 sweep) */
    pl->r = 1;
    pl->occ = occ_regs;
    pl->reg = reg;
    const int mc = 8 * pl->mt; /* tokens per M chunk */
    pl->m_chunks = (int)((m + mc - 1) / mc);
    const int ng = (int)(w->np / 16), nchunks = (int)(w->kp / NIB_GEMM_KCH);
    const int stages = NIB_GEMM_STAGES(pl->mt), cps = NIB_GEMM_CPS(pl->mt);
    /* M chunks of 64 tokens at one CTA per SM may use more shared memory for X */
    const int xbudget = occ_regs == 1 ? 2 * NIB_GEMM_X_BUDGET : NIB_GEMM_X_BUDGET;
    /* X rows in shared memory: the real tokens of the largest M chunk + one zero row */
    const int xrows_alloc = (int)(m < pl->mt * 8 ? m : pl->mt * 8) + 1;
    const uint64_t slot = (uint64_t)pl->m_chunks * (uint64_t)w->np * mc; /* floats per split */
    int max_ks_ws = slot ? (int)(ws_elems / slot) : 0;
    if (max_ks_ws < 1) max_ks_ws = 1; /* ksplit 1 needs no workspace */
    const int wn = NIB_GEMM_WARPS / wk;
    const int rb = (ng + wn - 1) / wn;
    const int base = rb * pl->m_chunks;
    const int maxks = nchunks / (wk * cps) > 0 ? nchunks / (wk * cps) : 1; /* every warp gets a step */
    if (ks < 1 || ks > maxks || ks > max_ks_ws) return 0;
    const int cpc = (nchunks + ks - 1) / ks;
    if ((nchunks + cpc - 1) / cpc != ks) return 0; /* the same split as a smaller ks */
    const int steps = (cpc + wk * cps - 1) / (wk * cps);
    int xw, nxb, lds;
    if (!plan_x(xrows_alloc, wk, cps, steps, wmax, stages, xbudget, &xw, &nxb, &lds)) return 0;
    /* ring bytes: a CTA with fewer steps than stages only ever touches stages 0 .. steps-1
     * (stage j holds step j), so it needs only those (at M = 10 and K = 1024 one step per warp:
     * 24 KB instead of 96 KB, two CTAs per SM instead of one) */
    const int used = steps < stages ? steps : stages;
    const int ring = reg == 1 ? 0 /* register weights need no ring */
                     : reg == 2 ? NIB_GEMM_WARPS * used * cps * NIB_GEMM_BULK_CHUNK(w->fmt) /* per-warp bulk rings */
                                : NIB_GEMM_WARPS * 32 * used * NIB_GEMM_PIECES(w->fmt) * cps * 16;
    const size_t xs = (size_t)nxb * xrows_alloc * lds * 2;
    const size_t red = (size_t)(wk - 1) * wn * pl->mt * 4 * 32 * 4;
    const size_t smem = ring + xs > red ? ring + xs : red;
    if (smem > NIB_GEMM_MAX_SMEM) return 0;
    const int ctas = base * ks;
    /* Cost model, in pipeline-step units, fitted to `nib bench gemm --sweep` on the H100: every
     * enumerated plan (register-loaded weights and M splits included) of the nine lab shapes at
     * M = 1, 10, 16, 50, 128, 532, bench/results/gemm-sweep-h100-v4-msplit.json. A CTA costs a
     * fixed ~4 steps (prologue, X staging, pipeline fill, epilogue) plus its chunk steps, each a
     * little dearer with more 8-token tiles; weights loaded straight into registers halve the
     * step (no shared-memory ring to fill and drain); the CTAs that share an SM take turns; a K
     * split adds the slot round trip, more with more tokens. Against the best measured plan of
     * each case the picks are 1.017x (geometric mean), at most 1.150x (16384->2048 at M = 50);
     * the previous model, which only knew MT = NIB_GEMM_MT(m) and shared-memory weights, was
     * 1.268x, at most 2.50x, on the same sweep. tests/test_gemm_plan.c keeps it there. */
    const int per_sm = (ctas + sms - 1) / sms;
    const double step = (1.0 + 0.015 * pl->mt) * (reg ? 0.5 : 1.0);
    double cost = per_sm * (4.0 + steps * cps * step) + (ks > 1 ? 2.7 * (1.0 + pl->mt) : 0.0);
    if (pl->mt == 8 && occ_regs == 2) cost *= 0.9;
    pl->wk = wk;
    pl->ksplit = ks;
    pl->row_blocks = rb;
    pl->xw = xw;
    pl->nxb = nxb;
    pl->lds = lds;
    pl->ring_bytes = ring;
    pl->smem = smem;
    pl->ctas = ctas;
    *cost_out = cost;
    return 1;
}

/* A plan with the largest X window that fits (the planner's plans and NIB_GEMM_FORCE's) */
static int plan_eval(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, int mt, int wk, int occ_regs,
                     int ks, int reg, nib_gemm_plan *pl, double *cost_out) {
    return plan_eval_x(w, m, ws_elems, sms, mt, wk, occ_regs, ks, reg, 1 << 30, pl, cost_out);
}

/* An mma.sync plan re-planned with the largest X window of at most wmax pipeline steps that fits (X buffers, row
 * stride and shared memory follow); 0 where none fits (the plan unchanged). */
static int plan_set_xw(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, int wmax, nib_gemm_plan *pl) {
    nib_gemm_plan r;
    double cost;
    if (!plan_eval_x(w, m, ws_elems, sms, pl->mt, pl->wk, pl->occ, pl->ksplit, pl->reg, wmax, &r, &cost)) return 0;
    *pl = r;
    return 1;
}

nib_status nib_gemm_plan_xw_env(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *pl) {
    const char *e = getenv("NIB_GEMM_XW");
    if (!e || !*e) return NIB_OK;
    char *end = NULL;
    const long n = strtol(e, &end, 10);
    if (end == e || *end || n < 1 || n > 64)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_XW=%s: the X window's pipeline steps at most, 1 .. 64", e);
    if (pl->wgt) return NIB_OK;
    if (!plan_set_xw(w, m, ws_elems, sms, (int)n, pl))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_XW=%s: no X window fits K=%lld M=%lld", e, (long long)w->kp,
                       (long long)m);
    return NIB_OK;
}

static nib_status shape_check(const nib_gemm_shape *w, int64_t m, int sms) {
    if (m < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: M = %lld", (long long)m);
    if (!w || w->np < 16 || w->np % 16 || w->kp < NIB_GEMM_KCH || w->kp % NIB_GEMM_KCH || w->np > INT32_MAX / 2 ||
        w->kp > INT32_MAX / 2)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: padded weight shape %lld x %lld is not a multiple of 16 x %d",
                       w ? (long long)w->np : 0LL, w ? (long long)w->kp : 0LL, NIB_GEMM_KCH);
    if (sms < 1) return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: SM count %d", sms);
    return NIB_OK;
}

/* May a plan with mt 8-token tiles per chunk run M tokens? The planner's MT, or (M split) a
 * smaller one at 8 < M <= NIB_GEMM_MSPLIT_MAX_M in at most NIB_GEMM_MSPLIT_MAX_CHUNKS chunks. */
static int mt_allowed(int64_t m, int mt) {
    return mt == NIB_GEMM_MT(m) ||
           (mt < NIB_GEMM_MT(m) && m <= NIB_GEMM_MSPLIT_MAX_M && (m + 8 * mt - 1) / (8 * mt) <= NIB_GEMM_MSPLIT_MAX_CHUNKS);
}

/* Long-K GEMV rule. At M <= 8 with K >= 8192 (the Gemma MLP's down projection, 16384 -> 2048, when
 * decoding) the measured best plans split K across CTAs so that every SM runs two of them, one
 * wave: 16 warps per SM with short chains instead of 8 with long ones (the model charges a
 * co-resident CTA as if it ran after the other, so it never picks them). H100, `nib bench gemm
 * --variants nvfp4 --sweep`, 16384 -> 2048 at M = 1 (bench/results/gemm-sweep-h100-v5-acqrel.json,
 * after the split-K arrival became one acq_rel add): the model's ks1 wk8 (128 CTAs) 11.77 us;
 * 256-CTA splits 9.67 (wk2 ks8), 9.88 (wk1 ks16), 10.12 (wk4 ks4), 11.12 us (wk8 ks2); the older
 * sweep (v4, before that change) had them at 10.54 / 10.48 / 10.76 / 11.69 against 11.65 us. So at
 * these shapes the search keeps only plans with a K split, at most 2 warps along K (the K split
 * goes across CTAs, not across the warps of one) and more than one CTA, at most two, per SM; the
 * cost model picks among them (its ties keep the fewer K splits: wk2 ks8 there). */
static int long_k_gemv(const nib_gemm_shape *w, int64_t m, int sms) {
    /* the lean rule's INT4 exception (below): where one CTA per row group (8 warps along K) makes one wave of
     * 3/4 of the SMs or more, as 16384 -> 2048's 128 do */
    const int64_t ng = w->np / 16;
    const int int4_lean = w->lean && w->fmt == NIB_WFMT_INT4 && m == 1 && ng * 4 >= 3 * (int64_t)sms && ng <= sms;
    return m <= 8 && w->kp / NIB_GEMM_KCH >= 64 && !int4_lean;
}

/* Bulk-ring rule. For INT4 and MXFP4 at M <= 8 (MT = 1) the weights move by cp.async.bulk into
 * per-warp shared-memory rings (reg = 2: S - 1 pipeline steps in flight per warp, no registers)
 * instead of straight into registers (reg = 1: one step). H100, `nib bench gemm --variants
 * int4-g128,mxfp4 --sweep` at M = 1 (bench/results/gemm-sweep-h100-v6-bulk.json), the same plan
 * both ways: 2048 -> 32768 INT4 16.90 against 18.25 us, MXFP4 16.75 against 17.37; 1024 -> 8192
 * 4.80 against 5.68 / 5.63; 4096 -> 1024 4.60 / 4.62 against 5.02 / 4.95; 16384 -> 2048 (K split 16,
 * one warp along K) 11.15 / 11.01 against the register plan's 11.84 / 11.32. Where a warp has
 * one step (1024 -> 2560: 3.40 against 3.34 us) there is nothing to pipeline, so the rule needs
 * two. NVFP4 and FP8 stay on register weights (NVFP4 with the lean kernels: the lean rule below):
 * their bulk plans were slower on every shape of that sweep (2048 -> 32768 NVFP4 17.92 against
 * 16.68 us); the bulk path moves ~2.1 TB/s whatever the format, where NVFP4's register path
 * reaches ~2.26. The model prices a bulk plan as the
 * register plan it replaces; among equal costs it keeps the fewer warps along K (one warp per
 * row group streams its own run of chunks: 16384 -> 2048 wk1 ks16 11.15 us, wk2 ks8 12.03). */
/* Lean rule (forty-ninth session). With the lean MT = 1 instantiations (nib_gemm_shape.lean) two picks
 * change, from `nib bench gemm --sweep` at M = 1 and 4 (bench/results/gemm-sweep-h100-v7-lean.json):
 * - INT4 at M = 1 on a long K with 3/4 to 1 times the SM count in row groups: one K split, 8 warps along
 *   K, bulk rings (16384 -> 2048: 9.51 us against the long-K rule's wk1 ks16 11.26; without the lean
 *   kernel the same plan took 13.14 in v6), which is the model's own pick once the long-K rule is lifted.
 *   Over more long-K shapes (bench/results/gemm-sweep-h100-v7d-longk.json) it is the fastest plan at
 *   8192 / 12288 -> 2048 too (5.24 / 7.47 us against 6.96 / 8.05 for the next); with more row groups than
 *   SMs the model's pick without the rule went wrong (24576 -> 3072: wk4 ks1 on 96 CTAs 23.57 us against
 *   the long-K rule's wk1 ks11 18.06); with fewer row groups than 3/4 of the SMs the sweep is mixed
 *   (8192 -> 1024: the one-split plan on 64 CTAs fastest, 4.82 against 5.30 us; 16384 -> 1024: not among the
 *   five fastest), so those keep the long-K rule;
 * - NVFP4 plans with one K split and at least 4 pipeline steps per warp at M <= 8 take the bulk rings, as
 *   INT4 / MXFP4 do (2048 -> 32768: 14.09 against 14.39 us at M = 1, 15.38 against 15.96 at M = 4). With
 *   2 or 3 steps per warp it was a draw over the lab's other shapes at M = 1, 4, 8
 *   (bench/results/gemm-sweep-h100-v7b-lean-shapes.json, bulk against the same plan with register
 *   weights: 1024 -> 8192 3.57 / 4.19 / 4.27 against 3.27 / 4.58 / 4.68 us, 2048 -> 2560 3.19 / 3.78 / 3.94
 *   against 3.09 / 3.65 / 3.92, 1152 -> 4304 3.46 / 3.94 / 4.05 against 3.67 / 3.86 / 3.99), so those keep
 *   register weights. NVFP4 plans with K splits keep register weights too (16384 -> 2048: wk2 ks8 regw
 *   9.24 us stays the fastest). */
static int bulk_ring(nib_wfmt fmt, int lean, int64_t m, int mt, int64_t nchunks, int wk, int ks) {
    const int nv = fmt == NIB_WFMT_NVFP4 && lean && ks == 1;
    if ((fmt != NIB_WFMT_INT4 && fmt != NIB_WFMT_MXFP4 && !nv) || m > 8 || mt != 1) return 0;
    const int64_t cpc = (nchunks + ks - 1) / ks, per_step = (int64_t)wk * NIB_GEMM_CPS(1);
    return (cpc + per_step - 1) / per_step >= (nv ? 4 : 2);
}

/* The cheapest plan by the model (lk: only the long-K GEMV rule's plans); pl->wk = 0 when none fits. */
static void plan_search_in(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, int lk, nib_gemm_plan *pl) {
    double best = 1e30;
    nib_gemm_plan cand;
    memset(pl, 0, sizeof *pl);
    const int nchunks = (int)(w->kp / NIB_GEMM_KCH);
    /* Lean INT4 at 2..8 tokens under the long-K rule: register weights, no bulk rings (fiftieth session,
     * bench/results/gemm-sweep-h100-v7c-lean-8k.json and v7: the rings' tie rule took one warp along K and
     * 16 splits, 7.93 / 8.58 / 10.17 us at M = 2 / 4 / 8 on 8192 -> 2048 and 11.35 / 12.25 / 14.14 on
     * 16384 -> 2048, where the register twin's tie rule takes 2 warps and 8 splits: 7.21 / 7.32 / 8.41 and
     * 10.63 / 11.20 / 12.70, the fastest timed on 16384 -> 2048. At M = 1 the long-K shapes were mixed.) */
    const int int4_lk = lk && w->lean && w->fmt == NIB_WFMT_INT4 && m >= 2;
    /* the enumeration's order (nib_gemm_plans_for): MT down from the planner's, shared-memory then
     * register weights, occupancy 2 then 1, warps along K up */
    for (int mt = NIB_GEMM_MT(m); mt >= 1 && mt_allowed(m, mt); mt /= 2)
        for (int reg = 0; reg <= 1; reg++)
            for (int occ = 2; occ >= 1; occ--)
                for (int wk = 1; wk <= NIB_GEMM_WARPS; wk *= 2)
                    for (int cpc = nchunks, prev = 0; cpc >= 1; cpc--) { /* each distinct K split once */
                        const int ks = (nchunks + cpc - 1) / cpc;
                        if (ks == prev) continue;
                        prev = ks;
                        double cost;
                        /* equal cost: the fewer K splits (fewer partial slots to write and add);
                         * bulk plans: the fewer warps along K */
                        int rk = reg && bulk_ring(w->fmt, w->lean, m, mt, nchunks, wk, ks) && !int4_lk ? 2 : reg;
                        if (rk == 2 && !plan_eval(w, m, ws_elems, sms, mt, wk, occ, ks, rk, &cand, &cost))
                            rk = 1; /* the rings do not fit: register weights */
                        if (!plan_eval(w, m, ws_elems, sms, mt, wk, occ, ks, rk, &cand, &cost)) continue;
                        /* K and M splits are there to fill the GPU: none past 4 waves of CTAs (the
                         * range the model was fitted on; the lab's sweep times no more) */
                        if ((ks > 1 || mt != NIB_GEMM_MT(m)) && cand.ctas > 4 * occ * sms) continue;
                        if (lk && (ks < 2 || wk > 2 || occ != 2 || cand.ctas <= sms || cand.ctas > 2 * sms)) continue;
                        const int tie = cost < best + 1e-9;
                        if (cost < best - 1e-9 ||
                            (tie && (rk == 2 && pl->reg == 2 ? wk < pl->wk || (wk == pl->wk && ks < pl->ksplit)
                                                             : ks < pl->ksplit))) {
                            best = cost;
                            *pl = cand;
                        }
                    }
}

static nib_status plan_search(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *pl) {
    const int lk = long_k_gemv(w, m, sms);
    plan_search_in(w, m, ws_elems, sms, lk, pl);
    if (!pl->wk && lk) plan_search_in(w, m, ws_elems, sms, 0, pl); /* no long-K plan fits (a small split-K
                                                                       * workspace): the model's pick */
    if (!pl->wk) return NIB_ERR(NIB_ERR_INTERNAL, "gemm: no launch plan fits shared memory (M=%lld)", (long long)m);
    return NIB_OK;
}

/* The search looks at up to ~2,000 candidates for K = 32768, too slow to redo on every eager
 * call: plans are cached per thread by what they depend on (direct-mapped; a collision only
 * costs a new search). */
typedef struct plan_key {
    int64_t np, kp, m;
    uint64_t ws_elems;
    int fmt, sms, lean;
} plan_key;
typedef struct plan_cache_entry {
    plan_key key;
    nib_gemm_plan plan;
    int valid;
} plan_cache_entry;
static _Thread_local plan_cache_entry t_plan_cache[64];

/* NIB_GEMM_FORCE=K:N:M:mt:wk:ks[,...] (a lab knob, for timing other plans inside a model): the
 * mma.sync plan with register weights, occupancy 2, mt / wk / ks for the padded shape kp x np at M
 * rows; an entry K:N:M:wg<bt>:ks:cm the wgmma kernel's plan with bt-token tiles, ks K splits and
 * clusters of cm CTAs (only wgt, ksplit, wgc, m_chunks, row_blocks and ctas set here: the CUDA side
 * completes it, nib_cuda_gemm_plan). NIB_OK with *hit = 1 when an entry matches (pl set), *hit = 0
 * when none does; an error when an entry is malformed or its plan does not fit. */
static nib_status forced_plan(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *pl,
                              int *hit) {
    *hit = 0;
    const char *e = getenv("NIB_GEMM_FORCE");
    if (!e || !*e) return NIB_OK;
    for (const char *s = e; *s;) {
        long long k, n, mm;
        int mt = 0, wk = 0, ks = 0, bt = 0, cm = 0, used = 0, used2 = 0;
        if (sscanf(s, "%lld:%lld:%lld:%n", &k, &n, &mm, &used) != 3 || !used ||
            (sscanf(s + used, "wg%d:%d:%d%n", &bt, &ks, &cm, &used2) != 3 &&
             (bt = 0, sscanf(s + used, "%d:%d:%d%n", &mt, &wk, &ks, &used2) != 3)) ||
            (s[used + used2] && s[used + used2] != ','))
            return NIB_ERR(NIB_ERR_INVALID_ARG,
                           "NIB_GEMM_FORCE=%s: entries K:N:M:mt:wk:ks or K:N:M:wg<tokens>:ks:cm, comma-separated", e);
        s += used + used2;
        if (*s == ',') s++;
        if (k != w->kp || n != w->np || mm != m) continue;
        if (bt) {
            const int64_t nchunks = w->kp / NIB_GEMM_KCH, rows = (w->np + NIB_GEMM_WG_ROWS - 1) / NIB_GEMM_WG_ROWS;
            const int i4 = w->fmt == NIB_WFMT_INT4;
            if ((bt != 16 && bt != 32 && bt != 64 && bt != 128 && bt != 192 && bt != 256) || (i4 && bt > 192) ||
                (w->fmt != NIB_WFMT_NVFP4 && w->fmt != NIB_WFMT_MXFP4 && w->fmt != NIB_WFMT_FP8 && !i4) ||
                (cm != 1 && cm != 2) || (bt < 64 && cm != 1) || ks < 1 || ks > 8 || ks > nchunks)
                return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_FORCE: wg%d ks%d cm%d does not fit K=%lld N=%lld M=%lld (%s)",
                               bt, ks, cm, k, n, mm, nib_wfmt_name(w->fmt));
            memset(pl, 0, sizeof *pl);
            pl->wgt = bt;
            pl->wgc = cm;
            pl->ksplit = ks;
            pl->m_chunks = (int)((m + bt - 1) / bt);
            pl->row_blocks = (int)((rows + cm - 1) / cm * cm);
            pl->ctas = pl->m_chunks * pl->row_blocks * ks;
            *hit = 1;
            return NIB_OK;
        }
        double cost;
        if ((mt != 1 && mt != 2 && mt != 4) || (wk != 1 && wk != 2 && wk != 4 && wk != 8) || !mt_allowed(m, mt) ||
            !plan_eval(w, m, ws_elems, sms, mt, wk, 2, ks, 1, pl, &cost))
            return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_FORCE: mt%d wk%d ks%d does not fit K=%lld N=%lld M=%lld", mt, wk,
                           ks, k, n, mm);
        *hit = 1;
        return NIB_OK;
    }
    return NIB_OK;
}

nib_status nib_gemm_plan_forced(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *pl,
                                int *hit) {
    *hit = 0;
    NIB_RETURN_IF_ERR(shape_check(w, m, sms));
    return forced_plan(w, m, ws_elems, sms, pl, hit);
}

nib_status nib_gemm_plan_for(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *pl) {
    NIB_RETURN_IF_ERR(shape_check(w, m, sms));
    int hit = 0;
    NIB_RETURN_IF_ERR(forced_plan(w, m, ws_elems, sms, pl, &hit));
    if (hit) return NIB_OK;
    plan_key key;
    memset(&key, 0, sizeof key); /* padding too: the key is compared with memcmp */
    key.np = w->np;
    key.kp = w->kp;
    key.m = m;
    key.ws_elems = ws_elems;
    key.fmt = (int)w->fmt;
    key.sms = sms;
    key.lean = w->lean;
    uint64_t h = (uint64_t)key.np * 0x9E3779B97F4A7C15ull ^ (uint64_t)key.kp * 0xC2B2AE3D27D4EB4Full ^
                 (uint64_t)m * 0x165667B19E3779F9ull ^ ws_elems ^ (uint64_t)key.fmt << 7 ^ (uint64_t)sms << 17 ^
                 (uint64_t)key.lean << 40;
    plan_cache_entry *e = &t_plan_cache[(h ^ (h >> 29)) & 63];
    if (e->valid && !memcmp(&e->key, &key, sizeof key)) {
        *pl = e->plan;
        return NIB_OK;
    }
    NIB_RETURN_IF_ERR(plan_search(w, m, ws_elems, sms, pl));
    e->key = key;
    e->plan = *pl;
    e->valid = 1;
    return NIB_OK;
}

nib_status nib_gemm_plan_rule(const nib_gemm_shape *w, int rule, int64_t m, uint64_t ws_elems, int sms,
                              nib_gemm_plan *pl, int *hit) {
    *hit = 0;
    if (!rule) return NIB_OK;
    const char *e = getenv("NIB_GEMM_RULE");
    if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "NIB_GEMM_RULE=%s: 0 (the planner only) or 1 (the default)", e);
    if (e && !strcmp(e, "0")) return NIB_OK;
    if (rule != NIB_GEMM_RULE_K1024 && rule != NIB_GEMM_RULE_K1024_WK1)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "gemm: unknown plan rule %d", rule);
    NIB_RETURN_IF_ERR(shape_check(w, m, sms));
    NIB_RETURN_IF_ERR(forced_plan(w, m, ws_elems, sms, pl, hit));
    if (*hit) return NIB_OK;
    const char *wg_env = getenv("NIB_GEMM_WG");
    const int wg_fmt =
        w->fmt == NIB_WFMT_NVFP4 || w->fmt == NIB_WFMT_MXFP4 || w->fmt == NIB_WFMT_INT4 || w->fmt == NIB_WFMT_FP8;
    if (rule == NIB_GEMM_RULE_K1024_WK1 && m > NIB_GEMM_WG_MID_M && m <= NIB_GEMM_RULE_WG_MAX_M && wg_fmt &&
        !(wg_env && !strcmp(wg_env, "0"))) {
        /* the wgmma kernel's 64-token tile without a K split: one CTA per 128-row tile */
        memset(pl, 0, sizeof *pl);
        pl->wgt = 64;
        pl->wgc = 1;
        pl->ksplit = 1;
        pl->m_chunks = 1;
        pl->row_blocks = (int)((w->np + NIB_GEMM_WG_ROWS - 1) / NIB_GEMM_WG_ROWS);
        pl->ctas = pl->row_blocks;
        *hit = 1;
        return NIB_OK;
    }
    if (m <= 8 || m > 16 || w->kp % 1024) return NIB_OK;
    double cost;
    const int wk = rule == NIB_GEMM_RULE_K1024_WK1 ? 1 : 4;
    /* X windows of one pipeline step, so that the first step waits for its own part of X only (the planner's
     * window is all of the CTA's K: gate|up's 4 steps; the wk = 4 plans have one step a warp anyway). H200, fast,
     * 2 cameras, H = 10 (bench/results/gemm-xw-ab-h200.json): 8.848 / 8.847 -> 8.813 / 8.807 ms (2 steps:
     * 8.835 / 8.835); NIB_GEMM_XW=64 gives back the whole window. */
    *hit = plan_eval_x(w, m, ws_elems, sms, NIB_GEMM_MT(m), wk, 2, (int)(w->kp / 1024), 1, 1, pl, &cost);
    return NIB_OK;
}

int nib_gemm_plans_for(const nib_gemm_shape *w, int64_t m, uint64_t ws_elems, int sms, nib_gemm_plan *out, int max) {
    if (shape_check(w, m, sms)) return -1;
    int n = 0;
    const int nchunks = (int)(w->kp / NIB_GEMM_KCH);
    /* the planner's MT first, then smaller MT splitting M into several chunks */
    for (int mt = NIB_GEMM_MT(m); mt >= 1 && mt_allowed(m, mt); mt /= 2) {
        for (int reg = 0; reg <= 2; reg++)
            for (int occ = 2; occ >= 1; occ--)
                for (int wk = 1; wk <= NIB_GEMM_WARPS; wk *= 2)
                    for (int ks = 1; ks <= nchunks && n < max; ks++) {
                        double cost;
                        if (plan_eval(w, m, ws_elems, sms, mt, wk, occ, ks, reg, &out[n], &cost)) n++;
                    }
    }
    return n;
}

/* ---- the wgmma kernel for large M (ops/cuda/gemm_lowbit_wg.cuh) ---------------------------- */

/* the lab's overrides of a wgmma pick bt (> 0): NIB_GEMM_WG_CM=2 (tiles of 64+ tokens), NIB_GEMM_WG_KS=1..8 (within
 * the chunks; other values are ignored) */
static int wg_tile_env(int bt, int64_t nchunks, int *ks, int *cm) {
    const char *c = getenv("NIB_GEMM_WG_CM"), *kf = getenv("NIB_GEMM_WG_KS");
    if (bt >= 64 && c && !strcmp(c, "2")) *cm = 2;
    if (bt && kf && atoi(kf) >= 1 && atoi(kf) <= 8 && atoi(kf) <= nchunks) *ks = atoi(kf);
    return bt;
}

int nib_gemm_wg_tile(nib_wfmt fmt, int has_perm, int64_t m, int64_t np, int64_t kp, uint64_t ws_elems, int sms,
                     int *ks, int *cm) {
    static const int tiles[] = {16, 32, 64, 128, 192, 256}; /* 16 / 32: only where forced (lab) so far */
    *ks = 1;
    *cm = 1;
    if (m < 1 || np < 1 || kp < NIB_GEMM_KCH || sms < 1 || has_perm ||
        (fmt != NIB_WFMT_NVFP4 && fmt != NIB_WFMT_MXFP4 && fmt != NIB_WFMT_FP8 && fmt != NIB_WFMT_INT4))
        return 0;
    const int i4 = fmt == NIB_WFMT_INT4; /* 64- to 192-token tiles, and a group-scale pass per chunk */
    const char *e = getenv("NIB_GEMM_WG");
    if (e && !strcmp(e, "0")) return 0;
    int forced = 0;
    const char *f = getenv("NIB_GEMM_WG_BT");
    if (f && *f)
        for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++)
            if (tiles[i] == atoi(f) && !(i4 && tiles[i] > 192)) forced = tiles[i];
    const int64_t rows = (np + NIB_GEMM_WG_ROWS - 1) / NIB_GEMM_WG_ROWS, nchunks = kp / NIB_GEMM_KCH;
    /* Small M on wide weights (NVFP4, INT4; 9..32 tokens; at least one row tile per SM): the 16- or 32-token
     * tile, one K split, two CTAs per SM, where the mma.sync kernel multiplies each decoded fragment by two or
     * four token tiles (docs/design.md, "Fiftieth session": 2048 -> 32768, 256 row tiles, M = 10 / 16 / 32
     * NVFP4 16.5 / 16.6 / 18.0 us against 18.6 / 18.7 / 24.5; 1024 -> 8192, 64 row tiles, lost at M = 10 / 16) */
    if (!forced && m > 8 && m <= NIB_GEMM_WG_MID_M && rows >= sms && (fmt == NIB_WFMT_NVFP4 || i4))
        return wg_tile_env(m <= 16 ? 16 : 32, nchunks, ks, cm);
    /* 17..32 tokens on long K (NVFP4, INT4; K >= 4096): the model's tile (64 tokens), where the mma.sync kernel's
     * MT = 4 ran 1.2-1.7x slower (fiftieth session: 16384 -> 2048 at M = 32 NVFP4 15.8 against 27.5 us, INT4
     * 20.8 against 32.4; 4096 -> 1024 7.6 / 8.7 against 8.9 / 12.8; at K = 1024 / 2048 it lost) */
    const int long_k_mid = m > 16 && m <= NIB_GEMM_WG_MID_M && kp >= 4096 && (fmt == NIB_WFMT_NVFP4 || i4);
    if (!(e && !strcmp(e, "1")) && !long_k_mid && m < NIB_GEMM_WG_MIN_M &&
        (m <= NIB_GEMM_WG_MID_M || np * kp < NIB_GEMM_WG_MID_ELEMS))
        return 0;
    /* one CTA per SM. Cost of a wave, fitted to `nib bench gemm` over the shapes at M = 16 ..
     * 1024 and every tile (H100, docs/design.md): per chunk of 128 K the tokens plus 80 (the
     * weights decoded), plus a fixed 650 + 8 per token (prologue, epilogue); a K split adds
     * 100 per split and 64 tokens (the partial sums' round trip) and is taken only to fill the
     * GPU (no more CTAs than SMs). INT4 (its group-scale pass and full wait per chunk make a chunk
     * ~1.3-1.4x NVFP4's at the same tile) picks its tile best on the same model: geometric mean
     * 1.006x the best measured tile, worst 1.08x, over 21 cases (tests/test_gemm_plan.c) */
    int best = 0;
    double best_cost = 1e300;
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) {
        const int bt = tiles[i];
        if ((forced && bt != forced) || (i4 && bt > 192) || (bt < 64 && !forced)) continue;
        const int64_t ctas = (m + bt - 1) / bt * rows;
        for (int k = 1; k <= 8; k++) {
            const int64_t cps = (nchunks + k - 1) / k;
            if (k > 1 && (ctas * k > sms || cps < 2 || (uint64_t)k * ctas * bt * NIB_GEMM_WG_ROWS > ws_elems)) break;
            const int64_t waves = (ctas * k + sms - 1) / sms;
            const double cost = (double)waves * ((double)cps * (bt + 80) + 650 + 8.0 * bt) + (k > 1 ? 100.0 * k * bt / 64 : 0);
            if (cost < best_cost - 1e-9) {
                best_cost = cost;
                best = bt;
                *ks = k;
            }
        }
    }
    return wg_tile_env(best, nchunks, ks, cm);
}

/* ---- nib's FP8 W8A8 GEMM (ops/cuda/gemm_fp8.cu): tiles and the planner -------------------- */

/* the order and set of ops/cuda/gemm_fp8.cu's g_tiles */
static const nib_fp8_tile k_fp8_tiles[] = {
    {1, 64, 6, 1, 1},  {1, 72, 6, 1, 1},  {1, 96, 5, 1, 1},  {1, 128, 4, 1, 1}, {2, 64, 4, 1, 1},  {2, 96, 4, 1, 1},
    {2, 112, 4, 1, 1}, {2, 128, 5, 1, 1}, {2, 144, 4, 1, 1}, {2, 192, 4, 1, 1}, {2, 256, 4, 1, 1}, {2, 128, 5, 2, 1},
    {2, 128, 5, 3, 1}, {2, 144, 4, 2, 1}, {2, 192, 4, 2, 1}, {1, 64, 6, 1, 4},  {1, 64, 6, 1, 8},  {1, 128, 4, 1, 4},
    {2, 64, 4, 1, 4},  {2, 96, 4, 1, 4},  {2, 128, 5, 1, 2}, {2, 128, 5, 1, 4}, {2, 256, 4, 1, 2}, {2, 240, 4, 1, 5},
    {2, 256, 4, 1, 8}, {3, 192, 4, 1, 1}, {3, 192, 4, 1, 3},
    /* by rule only (fp8_k_heavy_narrow), never by the cost model */
    {1, 128, 8, 1, 4}};
#define N_FP8_TILES ((int)(sizeof k_fp8_tiles / sizeof k_fp8_tiles[0]))
#define N_FP8_PLANNED 27 /* the cost model's tiles: the first N_FP8_PLANNED */
static const nib_fp8_tile k_fp8_narrow = {1, 128, 8, 1, 4};

/* SigLIP's fc2 (4304 -> 1152) at 2-3 cameras: K in (2048, 4608], N <= 1152, 321..768 rows. The
 * sweep (`nib bench gemm --variants cublaslt-fp8,fp8-nib --shapes 4304:1152 --m 512,532,768
 * --sweep`, fourteenth session, docs/design.md) timed 64 x 128 tiles with W multicast over 4 M
 * tiles and an 8-deep ring at 11.7 / 12.6 / 12.7 us against cuBLASLt's 14.5 / 14.2 / 14.2 us and
 * the cost model's pick's 16.1 / 16.6 / 20.0 us (the model does not credit ring depth). Up to
 * 768 rows the grid (M tiles rounded to the cluster of 4, x 9 N tiles) is one wave of the 120
 * resident CTAs; at 788 rows it is 144 CTAs and took 22.4 us against cuBLASLt's 14.2. */
static int fp8_k_heavy_narrow(int64_t m, int64_t n, int64_t k) {
    return k > 2048 && k <= 4608 && n <= 1152 && m > 320 && m <= 768;
}

int nib_fp8_tiles(nib_fp8_tile *out, int max) {
    int n = 0;
    for (int i = 0; i < N_FP8_TILES && n < max; i++) out[n++] = k_fp8_tiles[i];
    return n;
}

int nib_fp8_tile_wslice(const nib_fp8_tile *t) {
    return t->cm > 1 ? ((t->bn + t->cm - 1) / t->cm + 7) / 8 * 8 : t->bn;
}

size_t nib_fp8_tile_smem(const nib_fp8_tile *t) {
    return (size_t)t->stages * (size_t)(64 * t->wg + nib_fp8_tile_wslice(t) * t->cm) * 128 + 1024;
}

/* Resident CTAs of a tile when the device cannot be asked (host-only builds, tests): SMs x CTAs
 * per SM by shared memory (at most 2), times the share of SMs that whole clusters of cm x ks CTAs
 * occupied on the H100 (cudaOccupancyMaxActiveClusters: 3 -> 117 of 132, 4 -> 120, 5 -> 110,
 * 8 -> 120). */
static int fp8_slots_estimate(const nib_fp8_tile *t, int sms) {
    int occ = (int)(233472 / (nib_fp8_tile_smem(t) + 1024));
    if (occ > 2) occ = 2;
    const int c = t->cm * t->ks;
    const double share = c <= 2 ? 1.0 : c == 3 ? 0.886 : c == 5 ? 0.833 : 0.909;
    return (int)(sms * occ * share) / c * c;
}

/* Modeled time (us) of one tile on an H100, fitted to `nib bench gemm --variants fp8-nib --sweep`
 * at 3b544a6 (bench/results/gemm-fp8-nib-h100-v4.json: 7 shapes x M = 512 / 532 / 1024, every
 * tile; the pick is on average 1.06x the best tile's time, the previous model's 1.2-1.4x). Waves
 * of resident CTAs; per CTA a fixed 3 us (launch, ring fill), per 128-byte K block the larger of
 * the tensor time (12 TFLOP/s per SM, shared by the CTAs of an SM) and the load time (13 TB/s
 * shared by the resident CTAs; multicast is not credited: measured, it did not pay), and an
 * epilogue proportional to the tile; a K split adds its reduction. */
static double fp8_cost(const nib_fp8_tile *t, int64_t m, int64_t n, int64_t k, int sms, int slots) {
    const int64_t bm = 64 * t->wg, mt = ((m + bm - 1) / bm + t->cm - 1) / t->cm * t->cm;
    const int64_t ctas = mt * ((n + t->bn - 1) / t->bn) * t->ks;
    if (slots < 1) return 1e30;
    const int64_t waves = (ctas + slots - 1) / slots, conc = ctas < slots ? ctas : slots;
    int64_t per_sm = slots / sms, fill = (ctas + sms - 1) / sms; /* CTAs an SM runs at once */
    if (per_sm < 1) per_sm = 1;
    if (per_sm > fill) per_sm = fill;
    const double nk = (double)((k + 127) / 128) / t->ks;
    const double t_tensor = 2.0 * bm * t->bn * 128 / 1.2e7 * (double)per_sm;
    const double t_load = (double)(bm + t->bn) * 128 * (double)conc / 1.3e7;
    return (double)waves * (3.0 + nk * (t_tensor > t_load ? t_tensor : t_load) + 0.5e-4 * bm * t->bn * (double)per_sm) +
           (t->ks > 1 ? (double)t->ks : 0.0);
}

int nib_fp8_tile_geglu(const nib_fp8_tile *t) { return t->bn % 16 == 0 && t->cm == 1; }

void nib_fp8_plan_slots(int64_t m, int64_t n, int64_t k, int sms, const int *slots, int geglu, nib_fp8_tile *out) {
    /* lab knob NIB_FP8_TILE=wg:bn:stages:ks:cm (a compiled tile) replaces the model's pick */
    const char *e = getenv("NIB_FP8_TILE");
    nib_fp8_tile f;
    if (e && sscanf(e, "%d:%d:%d:%d:%d", &f.wg, &f.bn, &f.stages, &f.ks, &f.cm) == 5)
        for (int i = 0; i < N_FP8_TILES; i++)
            if (!memcmp(&k_fp8_tiles[i], &f, sizeof f) && (!geglu || nib_fp8_tile_geglu(&f))) {
                *out = f;
                return;
            }
    if (!geglu && fp8_k_heavy_narrow(m, n, k)) {
        *out = k_fp8_narrow;
        return;
    }
    if (sms < 1) sms = 132;
    double best = 0;
    int bi = -1;
    for (int i = 0; i < N_FP8_PLANNED; i++) {
        if (geglu && !nib_fp8_tile_geglu(&k_fp8_tiles[i])) continue;
        const int sl = slots ? slots[i] : fp8_slots_estimate(&k_fp8_tiles[i], sms);
        const double c = fp8_cost(&k_fp8_tiles[i], m, n, k, sms, sl);
        if (bi < 0 || c < best) best = c, bi = i;
    }
    *out = k_fp8_tiles[bi]; /* every list has GeGLU tiles (the CI test checks) */
}

void nib_fp8_plan_for(int64_t m, int64_t n, int64_t k, int sms, nib_fp8_tile *out) {
    nib_fp8_plan_slots(m, n, k, sms, NULL, 0, out);
}

int nib_blas_tune_on(void) {
    const char *e = getenv("NIB_BLAS_TUNE");
    return !(e && !strcmp(e, "0"));
}

/* one rule: the fields of nib_blas_tune (tile 0 / custom -1: the candidate's own) */
static int tune_set(nib_blas_tune *o, int base, int tile, int custom, int cluster, int swizzle, int splitk, int red) {
    o->base = base;
    o->tile = tile;
    o->custom = custom;
    o->cluster = cluster;
    o->swizzle = swizzle;
    o->splitk = splitk;
    o->reduction = red;
    return 1;
}

/* NIB_BLAS_TUNE_PREFIX=1: the bf16 Gemma-prefix reconfigurations that were measured and not kept
 * (tune_bf16), for A/B runs */
static int nib_blas_tune_lab_prefix(void) {
    const char *e = getenv("NIB_BLAS_TUNE_PREFIX");
    return e && !strcmp(e, "1");
}

/* cluster shape ids (cublasLtClusterShape_t) and the compute-type reduction */
enum { CL_1x1 = 2, CL_2x1 = 3, CL_4x1 = 4, CL_1x2 = 5, CL_4x2 = 7, CL_1x4 = 8, RED_CT = 2 };

/* bf16: cuBLASLt's Hopper bf16 algorithm reconfigured where `nib bench gemm --variants cublas-bf16
 * --lt-search` (a coordinate search from each of the heuristic's first 8 candidates, twentieth
 * session; bench/results/gemm-bf16-ltsearch-h100.json) timed a configuration well ahead of the
 * heuristic. Most of it is the cluster shape: the heuristic asks for "auto", and 1 x 1 clusters
 * on the same tile are faster. us, heuristic -> this configuration:
 * - the Gemma prefix o (2048 -> 2048) at 257-1024 rows, and (not kept, see below) its down projection (16384 -> 2048) at
 *   513-1024, the heuristic's tile and option with 1 x 1 clusters: o 7.55 -> 6.78 (276 rows),
 *   10.37 -> 8.60 (532), 13.69 -> 10.99 (788); down 69.1 -> 54.5 (532), 90.4 -> 72.1 (788);
 * - (not kept) the down at 257-320 rows (the heuristic splits K in two on 256 x 144 tiles): 64 x 144, option
 *   7, 1 x 2 clusters, K split 2: 42.5 -> 38.9;
 * - the Gemma q|k|v (2048 -> 2560) at 513-576 rows: candidate 1 on 64 x 184 tiles, option 9,
 *   4 x 1 clusters: 10.85 -> 10.21;
 * - SigLIP (256 rows per image): o (1152 -> 1152) 4.88 -> 4.37 (256 rows: 64 x 64, option 2, 1 x 1),
 *   5.55 -> 5.11 (512: candidate 5, 80 x 64, option 2, 1 x 4), 7.14 -> 5.83 (768: candidate 7,
 *   128 x 64, option 0, swizzled, 1 x 1); q|k|v (1152 -> 3456) at 512 rows 8.56 -> 8.31 (112 x 128,
 *   option 4, 1 x 1); fc1 (1152 -> 4304) 7.59 -> 7.08 (256 rows: candidate 3, 80 x 128, option 4,
 *   1 x 1), 10.28 -> 9.74 (512: 144 x 128, option 4, 1 x 1; the search's 9.71 on candidate 7, which
 *   cuBLASLt does not offer with the bias epilogue);
 * - at the action expert's row counts (the bf16 preset's per-op step; nineteenth session,
 *   `--lt-configs 800 --m 10`, bench/results/gemm-bf16-ltconfigs-h100-6d7b837.json): down
 *   4096 -> 1024 8.55 -> 7.69 us with a K split of 4 (fp32 workspace reduction), o 2048 -> 1024
 *   5.79 -> 5.54 us with 1 x 2 clusters, 64 x 8 tiles; and (this session) q|k|v 1024 -> 2560
 *   4.92 -> 4.75 us, 64 x 8, option 9, 1 x 1.
 * The vision rules sit on the row counts of 1-3 cameras, the prefix ones on ranges whose tile
 * count matches the measured rows. */
static int tune_bf16(int64_t m, int64_t n, int64_t k, nib_blas_tune *out) {
    if (m <= 16) {
        if (k == 4096 && n == 1024) return tune_set(out, 0, 10, 1, CL_1x1, 0, 4, RED_CT);
        if (k == 2048 && n == 1024) return tune_set(out, 0, 10, 1, CL_1x2, 0, 0, 0);
        if (k == 1024 && n == 2560) return tune_set(out, 0, 10, 9, CL_1x1, 0, 0, 0);
        return 0;
    }
    /* The Gemma prefix's down projection (16384 -> 2048, in place over the residual) is NOT
     * reconfigured: in the lab 1 x 1 clusters were faster (`--inplace`, 532 rows: 66.3 -> 52.4 us),
     * in the model slower. Nsight Compute on one bf16 call (2 cameras, kernels serialized, caches
     * not flushed, twenty-first session) timed the 17 down projections at 64.4-72.9 us with the
     * heuristic's 2 x 1 clusters and 81.8-93.3 us with 1 x 1, while o (10.1-10.7 against 12.1-12.3)
     * and q|k|v (12.1-12.7 against 12.5-13.2) were faster as in the lab. Why the lab and the model
     * differ on the down projection is not known (the lab rotates the weights over buffers larger
     * than L2, as the model streams them; its X is random, the model's h the GeGLU's output).
     * NIB_BLAS_TUNE_PREFIX=1 turns the down rules back on (lab knob). */
    if (nib_blas_tune_lab_prefix()) {
        if (n == 2048 && k == 16384 && m >= 513 && m <= 1024) return tune_set(out, 0, 0, -1, CL_1x1, 0, 0, 0);
        if (n == 2048 && k == 16384 && m >= 257 && m <= 320) return tune_set(out, 0, 324, 7, CL_1x2, 0, 2, RED_CT);
    }
    /* the prefix's o (in place) at 257-1024 rows on the heuristic's tile with 1 x 1 clusters, and its
     * q|k|v at 513-576 rows on candidate 1 (the lab's numbers above) */
    if (n == 2048 && k == 2048 && m >= 257 && m <= 1024) return tune_set(out, 0, 0, -1, CL_1x1, 0, 0, 0);
    if (n == 2560 && k == 2048 && m >= 513 && m <= 576) return tune_set(out, 1, 329, 9, CL_4x1, 0, 0, 0);
    if (k == 1152 && n == 1152) {
        if (m == 256) return tune_set(out, 0, 15, 2, CL_1x1, 0, 0, 0);
        if (m == 512) return tune_set(out, 5, 134, 2, CL_1x4, 0, 0, 0);
        if (m == 768) return tune_set(out, 7, 18, 0, CL_1x1, 1, 0, 0);
    }
    if (k == 1152 && n == 3456 && m == 512) return tune_set(out, 0, 165, 4, CL_1x1, 0, 0, 0);
    if (k == 1152 && n == 4304) {
        if (m == 256) return tune_set(out, 3, 135, 4, CL_1x1, 0, 0, 0);
        if (m == 512) return tune_set(out, 0, 184, 4, CL_1x1, 0, 0, 0);
    }
    return 0;
}

/* cuBLASLt's FP8 algorithm (tile ids of cublasLtMatmulTile_t, in cuBLASLt's terms: output
 * channels x tokens) reconfigured where `nib bench gemm --variants cublaslt-fp8 --lt-configs 4000
 * --shapes 2048:32768,16384:2048 --m 276,532,788` (bench/results/gemm-fp8-ltconfigs-h100-7026e7e.json,
 * nineteenth session) and `--lt-search` (twentieth session, bench/results/gemm-fp8-ltsearch-h100.json)
 * timed a configuration well ahead of the heuristic's (which takes 128 x 128 tiles, cluster shape
 * auto):
 * - the Gemma down projection, 16384 -> 2048: the tile that fills the GPU in the fewest waves of
 *   the least work (ceil(CTAs / SMs) x tile area, the larger tile on a tie) among 64 x 96,
 *   128 x 96 and 128 x 128, custom option 1, 1 x 1 clusters (2 x 1 for 128 x 128): 276 rows
 *   40.6 -> 21.6 us (64 x 96), 532 rows 40.4 -> 33.8 us (128 x 96); at 769-832 rows (three
 *   cameras) 128 x 120 tiles, option 1, 4 x 1 clusters: 52.9 us (the rule above, 128 x 128) -> 42.0;
 * - the Gemma gate|up, 2048 -> 32768: 257-320 rows on 128 x 160 tiles, custom option 7, 1 x 2
 *   clusters (276 rows: 49.0 -> 40.2 us); 513-640 rows on 128 x 112 tiles, option 9, 4 x 1
 *   clusters (532 rows: 80.4 (heuristic) -> 64.2 (128 x 128, option 1, the nineteenth session's) ->
 *   60.3 us) for the plain product only: with the GeGLU, nib's kernel fuses it and the model's
 *   prefix measured faster that way (nib_fp8_use_nib_geglu); 769-816 rows (three cameras, the same
 *   6 token tiles as 788) on 128 x 136 tiles, option 1, swizzled, 4 x 1 clusters: 90.7 -> 79.4 us. */
int nib_blas_tune_for(int fp8, int64_t m, int64_t n, int64_t k, int sms, nib_blas_tune *out) {
    memset(out, 0, sizeof *out);
    if (sms < 1) return 0;
    if (!fp8) return tune_bf16(m, n, k, out);
    /* ahead of nib's own FP8 kernel (which the rule picks otherwise) in the same lab run, `nib bench
     * gemm --variants cublaslt-fp8,fp8-nib --lt-search` (twentieth session): SigLIP's fc2 (4304 ->
     * 1152) at 512 rows on 112 x 64 tiles, option 0, 1 x 4 clusters, 9.60 us against nib's 11.85;
     * the Gemma q|k|v (2048 -> 2560) at 513-576 rows on 64 x 96, option 1, 4 x 1, 7.44 against 9.35;
     * the Gemma o (2048 -> 2048) there on 88 x 128, option 4, 4 x 1, 7.21 against 8.56.
     * At one and three cameras (twenty-first session, the same command at --m 256,768 for SigLIP and
     * 276,788 for the Gemma products; us, nib's kernel (or cuBLASLt's heuristic) -> this):
     * - SigLIP fc2 (4304 -> 1152): 256 rows 64 x 88, option 1, 4 x 1: 10.88 -> 8.47; 768 rows 96 x 128,
     *   option 4, 4 x 1: 12.92 -> 11.42;
     * - SigLIP q|k|v (1152 -> 3456) at 768 rows: 96 x 128, option 2, 1 x 2: 9.05 -> 7.91 (at 256
     *   rows nib's 5.15 against 5.16: stays);
     * - SigLIP fc1 (1152 -> 4304): 256 rows 80 x 128, option 4, 1 x 1: 7.13 -> 5.70; 768 rows (on
     *   cuBLASLt already) 112 x 128, option 2, 1 x 2: 9.70 -> 8.76;
     * - the Gemma q|k|v at 257-320 rows: the 513-576 configuration, 6.82 -> 5.75; at 769-832 rows
     *   64 x 136, option 3, 4 x 2: 10.23 -> 8.93;
     * - not the Gemma o (276 rows: nib's 5.95 against 6.21; 788: 8.87 against 8.55) nor SigLIP's o
     *   (nib's kernel 3.24 / 4.65 against 4.24 / 4.81). */
    if (k == 4304 && n == 1152) {
        if (m == 256) return tune_set(out, 0, 319, 1, CL_4x1, 0, 0, 0);
        if (m == 512) return tune_set(out, 0, 164, 0, CL_1x4, 0, 0, 0);
        if (m == 768) return tune_set(out, 0, 28, 4, CL_4x1, 0, 0, 0);
    }
    if (k == 1152 && n == 3456 && m == 768) return tune_set(out, 0, 28, 2, CL_1x2, 0, 0, 0);
    if (k == 1152 && n == 4304) {
        if (m == 256) return tune_set(out, 0, 135, 4, CL_1x1, 0, 0, 0);
        if (m == 768) return tune_set(out, 0, 165, 2, CL_1x2, 0, 0, 0);
    }
    if (k == 2048 && n == 2560 && ((m >= 257 && m <= 320) || (m >= 513 && m <= 576)))
        return tune_set(out, 0, 26, 1, CL_4x1, 0, 0, 0);
    if (k == 2048 && n == 2560 && m >= 769 && m <= 832) return tune_set(out, 0, 323, 3, CL_4x2, 0, 0, 0);
    if (k == 2048 && n == 2048 && m >= 513 && m <= 576) return tune_set(out, 0, 144, 4, CL_4x1, 0, 0, 0);
    if (k == 16384 && n == 2048 && m >= 769 && m <= 832) return tune_set(out, 0, 404, 1, CL_4x1, 0, 0, 0);
    if (k == 16384 && n == 2048 && m >= 129 && m <= 1024) {
        static const int tiles[3][3] = {{64, 96, 26}, {128, 96, 33}, {128, 128, 20}}; /* channels, tokens, id */
        int64_t best_cost = 0;
        for (int i = 0; i < 3; i++) {
            const int64_t ctas = ((n + tiles[i][0] - 1) / tiles[i][0]) * ((m + tiles[i][1] - 1) / tiles[i][1]);
            const int64_t cost = (ctas + sms - 1) / sms * tiles[i][0] * tiles[i][1];
            if (!out->tile || cost <= best_cost) { /* ascending area: a tie goes to the larger tile */
                best_cost = cost;
                out->tile = tiles[i][2];
            }
        }
        out->custom = 1;
        out->cluster = out->tile == 20 ? CL_2x1 : CL_1x1;
        return 1;
    }
    if (k == 2048 && n == 32768 && m >= 513 && m <= 640) /* the plain product (not the model's: see geglu) */
        return tune_set(out, 0, 403, 9, CL_4x1, 0, 0, 0);
    if (k == 2048 && n == 32768 && m >= 257 && m <= 320) return tune_set(out, 0, 29, 7, CL_1x2, 0, 0, 0);
    if (k == 2048 && n == 32768 && m >= 769 && m <= 816) return tune_set(out, 0, 405, 1, CL_4x1, 1, 0, 0);
    return 0;
}

static int fp8_rule(int64_t m, int64_t n, int64_t k);

int nib_fp8_use_nib(int64_t m, int64_t n, int64_t k) {
    const char *e = getenv("NIB_FP8_GEMM");
    if (e && !strcmp(e, "nib")) return 1;
    if (e && !strcmp(e, "cublaslt")) return 0;
    /* Where nib's kernel (the planner's tile) beat cuBLASLt's in the lab at the model's row counts
     * (`nib bench gemm --variants cublaslt-fp8,fp8-nib --shapes <SigLIP and Gemma-2B products>
     * --m 256,276,512,532,768,788`, bench/results/gemm-fp8-nib-h100-v5.json, and M = 1024 in v4):
     * - K <= 2048 with fewer than 2^23 outputs (SigLIP 1152 -> 1152 / 3456 / 4304, Gemma q|k|v and
     *   o): 3.3-4.9 against 6.8 us at 1152 -> 1152; not N > 4096 past 640 rows (1152 -> 4304 at
     *   M = 768: 11.7 against 10.0 us);
     * - K up to 4608 at M <= 320, the same outputs (4304 -> 1152 at M = 256: 10.4 against 14.3 us),
     *   and past 320 rows with N <= 1152 on the tile of fp8_k_heavy_narrow (SigLIP's fc2);
     * - the Gemma gate|up (2048 -> 32768) only at 512-640 rows that overrun a 256-row multiple by
     *   at most 64 (M = 532: 70-76 against 79-81 us), where cuBLASLt's 256-row tiles waste most;
     *   at M = 256 / 512 / 768 / 788 cuBLASLt is faster (35 / 55 / 77 / 103 against 39 / 65 /
     *   107 / 123 us);
     * - not K = 16384 (M = 532: 41 against 47-55 us). At 256-448 rows the lab times nib's tile
     *   faster (32.5-37.0 against 40.6 us, bench/results/gemm-fp8-k16k-h100-ca4f42f.json), but
     *   in the model at one camera (276 rows) it made the prefix slower, 2.665 / 2.670 -> 2.709 ms
     *   (`scripts/ab.sh`, fifteenth session). Not explained; one candidate: in the lab's
     *   back-to-back launches a call's weight prefetch (before griddepcontrol.wait) overlaps the
     *   previous call, which the model's down projection, behind a row quantization, does not get. */
    if (m > 1024) return 0;
    nib_blas_tune t;
    if (nib_blas_tune_on() && nib_blas_tune_for(1, m, n, k, 132, &t)) return 0; /* cuBLASLt, reconfigured */
    return fp8_rule(m, n, k);
}

/* the measured rule of nib_fp8_use_nib, before the cuBLASLt reconfigurations */
static int fp8_rule(int64_t m, int64_t n, int64_t k) {
    if (m > 1024) return 0;
    if (fp8_k_heavy_narrow(m, n, k)) return 1; /* with its own tile (nib_fp8_plan_slots) */
    if (k <= 2048 && m * n < ((int64_t)1 << 23)) return !(n > 4096 && m > 640);
    if (k <= 4608 && m <= 320 && m * n < ((int64_t)1 << 23)) return 1;
    if (k <= 2048 && m >= 512 && m <= 640 && m % 256 >= 1 && m % 256 <= 64) return 1;
    return 0;
}

int nib_fp8_use_nib_geglu(int64_t m, int64_t n, int64_t k) {
    const char *e = getenv("NIB_FP8_GEMM");
    if (e && (!strcmp(e, "nib") || !strcmp(e, "cublaslt"))) return nib_fp8_use_nib(m, n, k);
    /* the GeGLU in nib's epilogue and a row quantization of h, against cuBLASLt's product and the
     * GeGLU + FP8 kernel: besides the product rule, 257-320 rows (one camera) with K <= 2048,
     * where cuBLASLt's 256-row tiles waste most; `nib bench pi05 --preset fast --horizon 10`,
     * alternated twice with NIB_FUSED_GEGLU=1 (fused at every row count) on one H100 (fifteenth
     * session): prefix 2.659 / 2.662 -> 2.612 / 2.609 ms at 1 camera (276 rows), 4.147 / 4.146 ->
     * 4.229 / 4.224 ms at 3 (788 rows, where the rule keeps cuBLASLt) */
    /* 257-320 rows: cuBLASLt's reconfigured product and the GeGLU + FP8 kernel measured faster
     * than the fused kernel (prefix at 1 camera 2.286 -> 2.171 ms, nineteenth session); at 513-640
     * rows the fused kernel stays (2 cameras: prefix 3.017 with it against 3.126-3.132 ms) */
    /* 257-320 rows where the ping-pong kernel takes them (sixty-fourth session): fused again */
    if (m >= 257 && m <= 320 && nib_fp8_geglu_pp(m, n, k)) return 1;
    nib_blas_tune t;
    if (nib_blas_tune_on() && nib_blas_tune_for(1, m, n, k, 132, &t) && !(m >= 513 && m <= 640)) return 0;
    if (m >= 513 && m <= 640) return fp8_rule(m, n, k);
    return nib_fp8_use_nib(m, n, k) || (k <= 2048 && m > 256 && m <= 320);
}

int nib_fp8_geglu_pp(int64_t m, int64_t n, int64_t k) {
    const char *e = getenv("NIB_FP8_PP");
    if (e && *e) { /* forced ("<rows>x<cols>": the tile's rows) or off; a bad value is refused at the launch */
        static const struct {
            const char *name;
            int rows;
        } tiles[] = {{"192x128", 192}, {"128x192", 128}, {"64x256", 64}};
        for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++)
            if (!strcmp(e, tiles[i].name)) return tiles[i].rows;
        return 0;
    }
    if (k > 2048 || n < 16384 || n % 2) return 0;
    if (m >= 257 && m <= 320) return 64;
    if (m >= 513 && m <= 640 && m % 256 >= 1 && m % 256 <= 64) return 192;
    return 0;
}

static int fp8_shape_fits(const nib_blas_gemm_args *a) {
    return !(a->m < 1 || a->n < 1 || a->k < 1 || a->m > INT32_MAX || a->n > INT32_MAX || a->k > INT32_MAX ||
             a->k % 16 || a->n % 8 || a->ldy < a->n || (a->c && a->ldc < a->n) || a->ldy % 8 ||
             (a->c && a->ldc % 8) ||
             (uint64_t)a->m * (uint64_t)(a->ldy > a->ldc ? a->ldy : a->ldc) > (uint64_t)INT64_MAX / 2);
}

static int fp8_alignment_fits(const nib_blas_gemm_args *a) {
    return !(((uintptr_t)a->x | (uintptr_t)a->w | (uintptr_t)a->y | (uintptr_t)a->c) % 16 || (uintptr_t)a->bias % 2);
}

int nib_fp8_args_suit(const nib_blas_gemm_args *a) { return fp8_shape_fits(a) && fp8_alignment_fits(a); }

nib_status nib_fp8_check_args(const nib_blas_gemm_args *a) {
    if (!fp8_shape_fits(a))
        return NIB_ERR(NIB_ERR_SHAPE,
                       "fp8 gemm (nib): M=%lld N=%lld K=%lld ldy=%lld ldc=%lld (K a multiple of 16; N, ldy "
                       "and ldc of 8)",
                       (long long)a->m, (long long)a->n, (long long)a->k, (long long)a->ldy, (long long)a->ldc);
    if (!fp8_alignment_fits(a))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 gemm (nib): X, W, Y and C must be 16-byte aligned, bias 2-byte");
    if (a->c && a->c != a->y) {
        const char *c0 = (const char *)a->c, *c1 = c0 + (size_t)a->ldc * (size_t)a->m * 2;
        const char *y0 = (const char *)a->y, *y1 = y0 + (size_t)a->ldy * (size_t)a->m * 2;
        if (c0 < y1 && y0 < c1)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 gemm (nib): C overlaps Y without being Y");
    }
    if (a->c == a->y && a->c && a->ldc != a->ldy)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "fp8 gemm (nib): C is Y with a different stride (%lld != %lld)",
                       (long long)a->ldc, (long long)a->ldy);
    return NIB_OK;
}
