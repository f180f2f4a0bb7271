"""ktrace.py — summarize a lab build's in-graph kernel stamps (runtime/ktrace.cuh; NIB_KTRACE=<file>).

    scripts/ktrace.py FILE [--layers N] [--detail] [--blocks]
    scripts/ktrace.py FILE --expert [--steps N] [--detail]

Groups the stamps into kernel launches (per kernel and grid size, a kernel's entries in time order, grid-many of them a
launch; launches of one kernel and grid size do not interleave).

The default summary takes the last N (default 17: one call's prefix at 1-3 cameras) launches of the GeGLU kernel
(k_gemm_fp8_pp, else k_gemm_fp8_pt), and prints, per layer and as medians, in us: the norm before it (its first entry to
its last exit), the GeGLU kernel's first / last entry and first / last return from griddepcontrol.wait relative to the
norm's last exit, its last exit relative to its first return, and the next row quantization's first entry / first
return / last exit relative to the GeGLU kernel's last exit. --detail prints every launch around the last layer's;
--blocks, for the last three GeGLU launches, each CTA's exit relative to the launch's first return from the wait
(quartiles, the six latest with their SMs) and how many CTA pairs (2i, 2i + 1) sit on one SM pair (2k, 2k + 1), i.e.
whether the launch placed its blocks in order (sixty-fifth session: without PDL it does, with PDL it does not).

--expert: the per-op flow steps (the expert's launches: the low-bit GEMMs, the attention kernels and the merge, the
step edge and the norms of fewer than 100 rows). The steps are the spans between two step-edge launches; the last N
(default 8) whole ones are taken. Each layer is cut at its attention launch; where the launches around it are the
per-op layer's (adaRMS or the step edge, q|k|v, attention, merge, o, adaRMS, gate|up, down, the next adaRMS or edge),
each position gets, as medians over the layers, in us: gap (its first return from the wait after the previous
launch's last exit: the boundary), run (its last exit after its first return), span (its last exit after the previous
launch's last exit: its share of the layer), early (its first return after its first entry: how long its first CTA sat
resident before the wait ended), waits (last minus first return from the wait), tail (last minus first exit) and its
CTAs; and the layer (its first adaRMS's last exit to the next layer's). Then, for each low-bit product and the decode
attention, their points (runtime/ktrace.cuh MARK1..7; k_gemm_lowbit: the first X windows issued, then the epilogue inputs too,
thread 0's part of the first X window in, all of it in, K loop done, outputs or split-K partials stored, the K split's
last CTA starting the sum; k_attn_dec: Q staged, warp 0's keys done, the partial O in
shared memory) and the exit, each CTA's against its own return from the wait: medians over the layers of the median CTA
and of the slowest; then, per low-bit product, how many of its CTAs share their SM with another CTA of the same
launch (from the SM of each CTA's entry stamp) and the first X window's arrival for the CTAs alone and those sharing.
Where no layer has that form, the last step's first launches are printed and the script fails. --detail prints the launches around the last step's middle layer."""
import argparse
import statistics
import sys

NAMES = {1: "k_gemm_fp8_pp", 2: "k_gemm_fp8_pt", 3: "k_norm", 4: "k_quant_fp8_rows", 5: "k_gemm_lowbit",
         6: "k_gemm_lowbit_wg", 7: "k_attn_dec", 8: "k_attn", 9: "k_attn_merge", 10: "k_edge", 11: "k_attn_wg"}
NORM, LOWBIT, LOWBIT_WG, ATTN_DEC, ATTN, MERGE, EDGE, ATTN_WG = 3, 5, 6, 7, 8, 9, 10, 11
ATTNS = (ATTN_DEC, ATTN, ATTN_WG)
ENTRY, WAITED, EXIT, EXIT_C0, EXIT_C1, MARK1, MARK2, MARK3, MARK4, MARK5, MARK6, MARK7 = range(12)
# the points between a kernel's wait and its exit (runtime/ktrace.cuh): k_gemm_lowbit's, k_attn_dec's
MARKS = {5: [(MARK7, "X issued"), (MARK5, "issued"), (MARK6, "X t0"), (MARK1, "X in"), (MARK2, "K loop"), (MARK3, "stored"), (MARK4, "sum"),
             (EXIT, "exit")],
         7: [(MARK1, "Q in"), (MARK2, "keys"), (MARK3, "O in smem"), (EXIT, "exit")]}


def launches(recs):
    """recs: (t, kid, ev, sm, block, grid) -> per kid a list of launches {entry: {block: t}, ev: {ev: [t]}, t0, grid,
    kid} in order of first entry (launches of one kid with different grid sizes may interleave)"""
    groups = {}
    for r in recs:
        groups.setdefault((r[1], r[5]), []).append(r)
    out = {}
    for (kid, grid), rs in sorted(groups.items()):
        ent = sorted((r for r in rs if r[2] == ENTRY), key=lambda r: r[0])
        ls, cur = [], None
        for r in ent:
            if cur is None or len(cur["entry"]) >= cur["grid"] or r[4] in cur["entry"]:
                cur = {"entry": {}, "ev": {}, "bev": {}, "grid": r[5], "sms": set(), "bsm": {}, "kid": kid}
                ls.append(cur)
            cur["entry"][r[4]] = r[0]
            cur["sms"].add(r[3])
            cur["bsm"][r[4]] = r[3]
        for l in ls:
            l["t0"] = min(l["entry"].values())
        # each other stamp of a block, in time order per event, to the block's launches in order: the earliest one
        # entered by then that has no such stamp of the block yet (under PDL the next launch of a kernel and grid
        # size can enter a block before the previous one's block exits; a stamp older than every such entry, whose
        # launch's entry the ring lost, is dropped)
        byblock = {}
        for i, l in enumerate(ls):
            for b, t in l["entry"].items():
                byblock.setdefault(b, []).append((t, i))
        for b in byblock:
            byblock[b].sort()
        nxt = {}
        for r in sorted((r for r in rs if r[2] != ENTRY and r[4] in byblock), key=lambda r: r[0]):
            lst, k = byblock[r[4]], nxt.get((r[4], r[2]), 0)
            if k < len(lst) and lst[k][0] <= r[0]:
                ls[lst[k][1]]["ev"].setdefault(r[2], []).append(r[0])
                ls[lst[k][1]]["bev"].setdefault(r[2], {})[r[4]] = r[0]
                nxt[(r[4], r[2])] = k + 1
        out.setdefault(kid, []).extend(ls)
    for kid in out:
        out[kid].sort(key=lambda l: l["t0"])
    return out


def exits(l):
    return l["ev"].get(EXIT, []) + l["ev"].get(EXIT_C0, []) + l["ev"].get(EXIT_C1, [])


# the per-op expert layer around its attention launch (offset from the attention: kernel ids)
LAYER = [(-2, (NORM, EDGE)), (-1, (LOWBIT, LOWBIT_WG)), (0, ATTNS), (1, (MERGE,)), (2, (LOWBIT, LOWBIT_WG)),
         (3, (NORM,)), (4, (LOWBIT, LOWBIT_WG)), (5, (LOWBIT, LOWBIT_WG)), (6, (NORM, EDGE))]
LABELS = {-2: "adaRMS 1", -1: "q|k|v", 0: "attention", 1: "merge", 2: "o", 3: "adaRMS 2", 4: "gate|up", 5: "down",
          6: "next adaRMS 1"}


def expert(L, steps, detail):
    us = lambda x: x / 1000.0
    ex = [l for kid, ls in L.items() for l in ls
          if kid in (LOWBIT, LOWBIT_WG, MERGE, EDGE) + ATTNS or (kid == NORM and l["grid"] < 100)]
    ex = [l for l in ex if l["ev"].get(WAITED) and exits(l)]
    ex.sort(key=lambda l: l["t0"])
    edges = [i for i, l in enumerate(ex) if l["kid"] == EDGE]
    if len(edges) < 2:
        sys.exit("ktrace: fewer than two step-edge launches in the stamps (no per-op flow steps)")
    spans = list(zip(edges[:-1], edges[1:]))[-steps:]
    rows, layer_us, step_us = [], [], []
    for s0, s1 in spans:
        step_us.append(us(max(exits(ex[s1])) - max(exits(ex[s0]))))
        seq = ex[s0:s1 + 1]
        for k, l in enumerate(seq):
            if l["kid"] not in ATTNS or k - 2 < 0 or k + 6 >= len(seq):
                continue
            if not all(seq[k + o]["kid"] in kinds for o, kinds in LAYER):
                continue
            row = {}
            for o, _ in LAYER[1:]:
                cur, prev = seq[k + o], seq[k + o - 1]
                w, e, pe = cur["ev"][WAITED], exits(cur), max(exits(prev))
                row[o] = {"gap": us(min(w) - pe), "run": us(max(e) - min(w)), "span": us(max(e) - pe),
                          "early": us(min(w) - cur["t0"]), "waits": us(max(w) - min(w)), "tail": us(max(e) - min(e)),
                          "CTAs": cur["grid"], "kid": cur["kid"]}
            for o, _ in LAYER[1:]:  # the points inside a kernel, after each CTA's own return from the wait
                bev = seq[k + o]["bev"]
                w = bev.get(WAITED, {})
                for ev, name in MARKS.get(seq[k + o]["kid"], []):
                    d = sorted(us(t - w[b]) for b, t in bev.get(ev, {}).items() if b in w)
                    if d:
                        row[o]["m " + name] = (statistics.median(d), d[-1], len(d))
                # CTAs that share their SM with another CTA of the same launch, and the first X window's arrival
                # (k_gemm_lowbit's MARK1) of the CTAs alone on their SM and of those sharing one
                if seq[k + o]["kid"] == LOWBIT and bev.get(MARK1):
                    bsm = seq[k + o]["bsm"]
                    per_sm = {}
                    for b, sm in bsm.items():
                        per_sm[sm] = per_sm.get(sm, 0) + 1
                    shared = {b for b, sm in bsm.items() if per_sm[sm] > 1}
                    xin = {b: us(t - w[b]) for b, t in bev[MARK1].items() if b in w}
                    alone = sorted(v for b, v in xin.items() if b not in shared)
                    both = sorted(v for b, v in xin.items() if b in shared)
                    row[o]["share"] = (len(shared), statistics.median(alone) if alone else None,
                                       statistics.median(both) if both else None)
            rows.append(row)
            layer_us.append(us(max(exits(seq[k + 6])) - max(exits(seq[k - 2]))))
    if not rows:
        seq = ex[spans[-1][0]:spans[-1][1] + 1]
        print("the last step's first 24 launches (name, grid):", ", ".join(
            f"{NAMES.get(l['kid'], l['kid'])} {l['grid']}" for l in seq[:24]))
        sys.exit("ktrace: no per-op expert layer (adaRMS, q|k|v, attention, merge, o, adaRMS, gate|up, down) in the "
                 "last steps")
    med = statistics.median
    print(f"expert: {len(spans)} steps (median {med(step_us):.2f} us from one step edge's last exit to the next's), "
          f"{len(rows)} layers; medians, us")
    cols = ["gap", "run", "span", "early", "waits", "tail", "CTAs"]
    print(f"  {'launch':14s}" + "".join(f"{c:>9s}" for c in cols))
    for o, _ in LAYER[1:]:
        print(f"  {LABELS[o]:14s}" + "".join(f"{med([r[o][c] for r in rows]):9.2f}" for c in cols))
    print(f"  {'sum of spans':14s}{'':18s}{med([sum(r[o]['span'] for o, _ in LAYER[1:-1]) for r in rows]):9.2f}"
          f"   (q|k|v .. down; the layer: {med(layer_us):.2f}, {min(layer_us):.2f} .. {max(layer_us):.2f})")
    print(f"  {'sum of gaps':14s}{med([sum(r[o]['gap'] for o, _ in LAYER[1:-1]) for r in rows]):9.2f}"
          f"   {'sum of runs':s} {med([sum(r[o]['run'] for o, _ in LAYER[1:-1]) for r in rows]):.2f}")
    # positions of one kernel in every layer, each with some point stamped
    marked = [o for o, _ in LAYER[1:] if len({r[o]["kid"] for r in rows}) == 1
              and all(any(key.startswith("m ") for key in r[o]) for r in rows)]
    if marked:
        print("inside the kernels, us after each CTA's own return from the wait (medians over the layers of the median "
              "CTA / the slowest CTA; CTAs with the point):")
        for o in marked:
            cells = []
            for _, name in MARKS[rows[0][o]["kid"]]:
                v = [r[o]["m " + name] for r in rows if "m " + name in r[o]]
                if len(v) == len(rows):
                    cells.append(f"{name} {med([x[0] for x in v]):.2f} / {med([x[1] for x in v]):.2f} "
                                 f"({med([x[2] for x in v]):.0f})")
            print(f"  {LABELS[o]:14s}" + "; ".join(cells))
        shares = [o for o in marked if all("share" in r[o] for r in rows)]
        if shares:
            print("CTAs sharing their SM with another CTA of the same launch (median over the layers), and the first X "
                  "window in (us after the wait; medians over the layers of the median CTA alone / sharing; '-': none):")
            for o in shares:
                n = med([r[o]["share"][0] for r in rows])
                cell = []
                for i in (1, 2):
                    v = [r[o]["share"][i] for r in rows if r[o]["share"][i] is not None]
                    cell.append(f"{med(v):.2f}" if v else "-")
                print(f"  {LABELS[o]:14s}{n:.0f} of {rows[0][o]['CTAs']:.0f}; X in {cell[0]} / {cell[1]}")
    if detail:
        s0, s1 = spans[-1]
        seq = ex[s0:s1 + 1]
        att = [k for k, l in enumerate(seq) if l["kid"] in ATTNS]
        k = att[len(att) // 2] if att else len(seq) // 2
        t0 = seq[k]["t0"]
        print("the last step's middle layer (us from its attention's first entry):")
        for l in seq[max(0, k - 3):k + 8]:
            w, e = l["ev"][WAITED], exits(l)
            print(f"  {NAMES.get(l['kid'], l['kid']):18s} grid {l['grid']:5d}  entry {us(l['t0'] - t0):9.2f} .. "
                  f"{us(max(l['entry'].values()) - t0):9.2f}  waited {us(min(w) - t0):9.2f} .. {us(max(w) - t0):9.2f}"
                  f"  exit {us(min(e) - t0):9.2f} .. {us(max(e) - t0):9.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--layers", type=int, default=17)
    ap.add_argument("--detail", action="store_true")
    ap.add_argument("--blocks", action="store_true")
    ap.add_argument("--expert", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    recs = []
    with open(a.file) as f:
        for line in f:
            p = line.split()
            if len(p) == 6:
                recs.append(tuple(int(x) for x in p))
    if not recs:
        sys.exit(f"ktrace: no stamps in {a.file}")
    L = launches(recs)
    if a.expert:
        expert(L, a.steps, a.detail)
        return
    gk = 1 if L.get(1) else 2 if L.get(2) else None
    if gk is None:
        sys.exit("ktrace: no GeGLU kernel launches in the stamps")
    us = lambda x: x / 1000.0
    rows = []
    for g in L[gk][-a.layers:]:
        g_first_entry, g_last_entry = g["t0"], max(g["entry"].values())
        w = g["ev"].get(WAITED, [])
        ex = g["ev"].get(EXIT_C0, []) + g["ev"].get(EXIT_C1, []) + g["ev"].get(EXIT, [])
        if not w or not ex:
            continue
        norm = [n for n in L.get(3, []) if n["t0"] < g_first_entry and n["ev"].get(EXIT)]
        q = [n for n in L.get(4, []) if n["t0"] > g_first_entry and n["ev"].get(EXIT) and n["ev"].get(WAITED)]
        if not norm or not q:
            continue
        n, qq = norm[-1], q[0]
        n_end = max(n["ev"][EXIT])
        g_end = max(ex)
        rows.append({
            "norm us": us(n_end - n["t0"]),
            "norm CTAs": n["grid"],
            "gg entry first": us(g_first_entry - n_end),
            "gg entry last": us(g_last_entry - n_end),
            "gg waited first": us(min(w) - n_end),
            "gg waited last": us(max(w) - n_end),
            "gg run (last exit - first waited)": us(g_end - min(w)),
            "gg CTAs": g["grid"],
            "q entry first": us(qq["t0"] - g_end),
            "q waited first": us(min(qq["ev"][WAITED]) - g_end),
            "q last exit": us(max(qq["ev"][EXIT]) - g_end),
        })
    if not rows:
        sys.exit("ktrace: no layer with a norm before and a row quantization after the GeGLU kernel")
    print(f"{NAMES[gk]}: {len(rows)} layers; us, medians (min .. max)")
    for k in rows[0]:
        v = [r[k] for r in rows]
        print(f"  {k:36s} {statistics.median(v):9.2f}   ({min(v):.2f} .. {max(v):.2f})")
    if a.blocks:
        for g in L[gk][-3:]:
            w = g["ev"].get(WAITED, [])
            exs = g["ev"].get(EXIT, []) + g["ev"].get(EXIT_C0, []) + g["ev"].get(EXIT_C1, [])
            if not w or not exs:
                continue
            tw, t_end = min(w), max(exs)
            ex, sm = {}, {}
            for r in recs:  # this launch's stamps: its blocks' entries, and exits up to its last
                if r[1] != gk or r[4] not in g["entry"]:
                    continue
                if r[2] == ENTRY and g["entry"][r[4]] == r[0]:
                    sm[r[4]] = r[3]
                elif r[2] in (EXIT, EXIT_C0, EXIT_C1) and g["entry"][r[4]] <= r[0] <= t_end:
                    ex[r[4]] = max(ex.get(r[4], 0), r[0])
            v = sorted(us(t - tw) for t in ex.values())
            q = lambda f: v[min(len(v) - 1, int(f * (len(v) - 1) + 0.5))]
            pairs = [b for b in sm if b % 2 == 0 and b + 1 in sm]
            inorder = sum(1 for b in pairs if sm[b] % 2 == 0 and sm[b + 1] == sm[b] + 1)
            late = sorted(ex, key=lambda b: -ex[b])[:6]
            print(f"launch at {us(g['t0'] - L[gk][-1]['t0']):9.2f} us: {len(v)} CTAs, exit after the first wait (us) "
                  f"min {v[0]:.1f} q1 {q(0.25):.1f} median {q(0.5):.1f} q3 {q(0.75):.1f} max {v[-1]:.1f}; "
                  f"block pairs on one SM pair {inorder} / {len(pairs)}; latest (block, SM, us): "
                  + ", ".join(f"({b}, {sm.get(b, '?')}, {us(ex[b] - tw):.1f})" for b in late))
    if a.detail:
        g = L[gk][-1]
        t0 = g["t0"]
        print("launches from 200 us before to 300 us after the last GeGLU launch's first entry (us from that entry):")
        allk = [(l["t0"], kid, l) for kid, ls in L.items() for l in ls if t0 - 200000 <= l["t0"] <= t0 + 300000]
        for t, kid, l in sorted(allk, key=lambda x: x[0]):
            w = l["ev"].get(WAITED, [])
            ex = l["ev"].get(EXIT, []) + l["ev"].get(EXIT_C0, []) + l["ev"].get(EXIT_C1, [])
            f = lambda x: f"{us(x - t0):9.2f}" if x is not None else "        -"
            print(f"  {NAMES.get(kid, kid):18s} grid {l['grid']:5d}  entry {f(l['t0'])} .. {f(max(l['entry'].values()))}"
                  f"  waited {f(min(w) if w else None)} .. {f(max(w) if w else None)}  exit .. {f(max(ex) if ex else None)}")


if __name__ == "__main__":
    main()
