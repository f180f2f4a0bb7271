#!/usr/bin/env python3
"""scripts/ktrace.py (the in-graph kernel stamps of a -DNIB_KTRACE=1 build, runtime/ktrace.cuh) on made-up stamp files
(no GPU): three layers of norm -> GeGLU kernel -> row quantization with known times, the stamps shuffled; the medians
it prints, its launch grouping (two launches of one kernel back to back in a layer), its block placement count for an
in-order and a scattered placement, and its refusals (an empty file, no GeGLU kernel); --expert on made-up flow
steps (every launch of a layer with a known boundary gap and run, the launches of one kernel with different grids
interleaved with a prefix norm's; the products' CTAs that share an SM) and its refusal of stamps without step edges. Run by nib_tests
(ktrace_script) from the repository root."""
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

NORM, PP, Q = 3, 1, 4
ENTRY, WAITED, EXIT, C0, C1 = 0, 1, 2, 3, 4


def layer(t, ctas, run_ns, scatter, extra_q=False):
    """one layer's stamps from t (ns): norm of 4 CTAs ends at t + 2000; the GeGLU kernel's CTAs enter at t + 1000 + b,
    return from the wait at t + 2500 + b, its consumers end at t + 2500 + run_ns (block 0 last); the quantization
    enters 1000 ns after that"""
    out = []
    for b in range(4):
        out += [(t + b, NORM, ENTRY, b, b, 4), (t + 500 + b, NORM, WAITED, b, b, 4), (t + 1997 + b, NORM, EXIT, b, b, 4)]
    for b in range(ctas):
        sm = (b * 37) % ctas if scatter else b
        out += [(t + 1000 + b, PP, ENTRY, sm, b, ctas)]
        if b == 0:
            out += [(t + 2500, PP, WAITED, sm, b, ctas)]
        end = t + 2500 + run_ns - (0 if b == 0 else 100 + b)
        out += [(end - 50, PP, C0, sm, b, ctas), (end, PP, C1, sm, b, ctas)]
    tq = t + 2500 + run_ns + 1000
    for k in range(2 if extra_q else 1):  # a second quantization launch right after the first
        for b in range(3):
            o = tq + 5000 * k
            out += [(o + b, Q, ENTRY, b, b, 3), (o + 300 + b, Q, WAITED, b, b, 3), (o + 2000 + b, Q, EXIT, b, b, 3)]
    return out


def write(d, name, recs):
    random.shuffle(recs)
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.writelines("%d %d %d %d %d %d\n" % r for r in recs)
    return path


def run(path, *args):
    p = subprocess.run([sys.executable, "scripts/ktrace.py", path] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def value(out, key):
    m = re.search(re.escape(key) + r"\s+([-\d.]+)", out)
    return float(m.group(1)) if m else None


# the expert's layer: (kernel id, grid, gap, run) in us; gap = its first return from the wait after the previous
# launch's last exit, run = its last exit after that return. gate|up and down: one kernel and grid size, the second
# launch's CTAs entering before the first's exit (as under PDL)
LOWBIT, ATTN_DEC, MERGE, EDGE = 5, 7, 9, 10
EXPERT_LAYER = [(LOWBIT, 4, 1.0, 3.0), (ATTN_DEC, 3, 1.1, 5.0), (MERGE, 2, 1.2, 2.0), (LOWBIT, 3, 1.3, 3.5),
                (NORM, 2, 0.9, 1.5), (LOWBIT, 3, 1.4, 4.0), (LOWBIT, 3, 1.5, 4.5)]


def launch(kid, grid, p_exit, gap, run):
    """one launch after the previous one's last exit p_exit (ns): entries 2 us before it, the first wait returned gap
    after it, the last 0.1 us later; exits from run - 0.3 us to run after the first return; returns its last exit.
    A low-bit product's or the attention's CTA b also stamps its points (ktrace.cuh MARK1..3) 0.5 / 1.0 / 1.2 us + 0.1 b after its own
    wait, and on a 4-CTA grid (a K split) its last CTA the sum (MARK4) 1.5 us after. CTA b runs on SM b, except in a
    3-CTA low-bit product, whose blocks 0 and 1 share SM 0 (block 2: SM 1)"""
    out, w0 = [], p_exit + int(gap * 1000)
    for b in range(grid):
        wb = w0 + (100 if b == grid - 1 else 0)
        sm = max(0, b - 1) if kid == LOWBIT and grid == 3 else b  # 3-CTA products: blocks 0 and 1 share SM 0
        out += [(p_exit - 2000 + b, kid, ENTRY, sm, b, grid), (wb, kid, WAITED, sm, b, grid),
                (w0 + int(run * 1000) - (300 if b == 0 else 0), kid, EXIT, sm, b, grid)]
        if kid in (LOWBIT, ATTN_DEC):
            out += [(wb + 500 + 100 * b, kid, 5, sm, b, grid), (wb + 1000 + 100 * b, kid, 6, sm, b, grid),
                    (wb + 1200 + 100 * b, kid, 7, sm, b, grid)]
            if grid == 4 and b == grid - 1:
                out += [(wb + 1500, kid, 8, sm, b, grid)]
    return out, w0 + int(run * 1000)


def expert_steps(steps, layers):
    """steps x (the step edge, then layers x (q|k|v .. down, adaRMS)), the last adaRMS of a step replaced by the next
    step's edge; a prefix norm of 532 rows beside the first step"""
    out, t = [], 10_000_000
    recs, t = launch(EDGE, 2, t, 1.0, 2.0)
    out += recs
    out += launch(NORM, 532, t - 500, 0.2, 3.0)[0]  # the prefix's norm, interleaved in time with the expert's
    for s in range(steps):
        for li in range(layers):
            for kid, grid, gap, run in EXPERT_LAYER:
                recs, t = launch(kid, grid, t, gap, run)
                out += recs
            recs, t = launch(EDGE if li == layers - 1 else NORM, 2, t, 0.8, 1.5)
            out += recs
    return out


with tempfile.TemporaryDirectory() as d:
    recs = expert_steps(3, 4)
    rc, out = run(write(d, "expert.txt", recs), "--expert", "--steps", "2", "--detail")
    check(rc == 0, "ktrace.py --expert failed on a well-formed file: " + out)
    check(out.startswith("expert: 2 steps") and "8 layers" in out, "2 steps of 4 layers: " + out[:120])
    m = re.search(r"median ([\d.]+) us from one step edge", out)
    check(m is not None and abs(float(m.group(1)) - 4 * 34.2) < 0.01, "a step is 4 layers of 34.2 us: " + out)
    for label, gap, run_us, grid in [("q|k|v", 0.8, 3.0, 4), ("attention", 1.1, 5.0, 3), ("merge", 1.2, 2.0, 2),
                                     ("o", 1.3, 3.5, 3), ("adaRMS 2", 0.9, 1.5, 2), ("gate|up", 1.4, 4.0, 3),
                                     ("down", 1.5, 4.5, 3)]:
        m = re.search(r"\n  " + re.escape(label) + r"\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)"
                      r"\s+([-\d.]+)\s+([-\d.]+)", out)
        check(m is not None, "a row for " + label + ": " + out)
        if m:
            v = [float(x) for x in m.groups()]
            want = [gap if label != "q|k|v" else 1.0, run_us, (gap if label != "q|k|v" else 1.0) + run_us,
                    2.0 + (gap if label != "q|k|v" else 1.0), 0.1, 0.3, grid]
            check(all(abs(a - b) < 0.006 for a, b in zip(v, want)), f"{label}: {v} should be {want}: " + out)
    check("the layer: 34.20" in out, "the layer is 34.2 us (every gap and run): " + out)
    check(re.search(r"sum of spans\s+31.90", out) is not None, "q|k|v .. down span 31.9 us: " + out)
    check(re.search(r"sum of gaps\s+8.40\s+sum of runs 23.50", out) is not None, "gaps 8.4, runs 23.5 us: " + out)
    check("k_attn_dec" in out and "k_attn_merge" in out, "--detail lists the middle layer's launches: " + out)
    # q|k|v, 4 CTAs (a K split): X in at 0.5 + 0.1 b us after each CTA's wait (median of 0.5, 0.6, 0.7, 0.8 = 0.65,
    # slowest 0.8); the sum on its last CTA alone at 1.5; its exits after each CTA's own wait: 2.7 (block 0, 0.3 early),
    # 3.0, 3.0, 2.9 (block 3 waited 0.1 later): median 2.95
    check("q|k|v         X in 0.65 / 0.80 (4); K loop 1.15 / 1.30 (4); stored 1.35 / 1.50 (4); sum 1.50 / 1.50 (1); "
          "exit 2.95 / 3.00 (4)" in out, "q|k|v's points inside the product: " + out)
    check(re.search(r"\n  o\s+X in 0.60 / 0.70 \(3\); K loop 1.10 / 1.20 \(3\); stored 1.30 / 1.40 \(3\); exit", out)
          is not None, "o (3 CTAs, no sum): " + out)
    check(re.search(r"\n  attention\s+Q in 0.60 / 0.70 \(3\); keys 1.10 / 1.20 \(3\); O in smem 1.30 / 1.40 \(3\); "
                    r"exit", out) is not None, "the attention's own points: " + out)
    check(re.search(r"\n  (merge|adaRMS 2) +[A-Z]", out) is None, "no points for kernels without them: " + out)
    # SM sharing: q|k|v's 4 CTAs each alone (X in 0.65, none sharing); the 3-CTA products' blocks 0 and 1 share an SM
    # (X in 0.5 and 0.6: median 0.55), block 2 alone (waited 0.1 later, X in 0.7 after its own wait)
    check(re.search(r"\n  q\|k\|v\s+0 of 4; X in 0.65 / -", out) is not None, "q|k|v: no CTA shares an SM: " + out)
    for label in ("o", "gate|up", "down"):
        check(re.search(r"\n  " + re.escape(label) + r"\s+2 of 3; X in 0.70 / 0.55", out) is not None,
              label + ": 2 of 3 CTAs share an SM: " + out)
    rc, out = run(write(d, "noedge.txt", [r for r in recs if r[1] != EDGE]), "--expert")
    check(rc != 0 and "step-edge" in out, "stamps without step edges are refused: " + out)

with tempfile.TemporaryDirectory() as d:
    random.seed(7)
    recs = []
    for i, run_ns in enumerate([36000, 40000, 44000]):
        recs += layer(1_000_000 + 200_000 * i, 8, run_ns, scatter=False, extra_q=(i == 1))
    rc, out = run(write(d, "inorder.txt", recs), "--layers", "3", "--blocks")
    check(rc == 0, "ktrace.py failed on a well-formed file: " + out)
    check(out.startswith("k_gemm_fp8_pp: 3 layers"), "the header names the GeGLU kernel and 3 layers: " + out[:80])
    check(value(out, "gg run (last exit - first waited)") == 40.0, "the run's median is 40.0 us: " + out)
    check(value(out, "norm us") == 2.0, "the norm's median is 2.0 us (first entry to last exit): " + out)
    check(value(out, "gg waited first") == 0.5, "the first wait returns 0.5 us after the norm's last exit: " + out)
    check(value(out, "gg entry first") == -1.0, "the first entry is 1.0 us before the norm's end: " + out)
    check(value(out, "q entry first") == 1.0, "the quantization enters 1.0 us after the GeGLU kernel's end: " + out)
    check(value(out, "q last exit") == 3.0, "the first quantization launch after it, not the second: " + out)
    check(out.count("block pairs on one SM pair 4 / 4") == 3, "in-order placement: 4 of 4 pairs, 3 launches: " + out)
    check("latest (block, SM, us): (0, 0, 44.0)" in out, "the last launch's latest block is block 0 at 44.0 us: " + out)
    rc, out = run(write(d, "scattered.txt", layer(1_000_000, 8, 36000, scatter=True)), "--layers", "1", "--blocks")
    check(rc == 0 and "block pairs on one SM pair 0 / 4" in out, "scattered placement: 0 of 4 pairs: " + out)
    rc, out = run(write(d, "empty.txt", []))
    check(rc != 0 and "no stamps" in out, "an empty file is refused: " + out)
    rc, out = run(write(d, "nogeglu.txt", [r for r in recs if r[1] != PP]))
    check(rc != 0 and "no GeGLU kernel" in out, "a file without the GeGLU kernel is refused: " + out)
finish("test_ktrace")
