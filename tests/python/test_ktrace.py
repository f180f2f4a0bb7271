#!/usr/bin/env python3
"""scripts/ktrace.py (the in-graph kernel stamps of a -DNIB_KTRACE=1 build, runtime/ktrace.cuh) on made-up stamp files
(no GPU): three layers of norm -> GeGLU kernel -> row quantization with known times, the stamps shuffled; the medians
it prints, its launch grouping (two launches of one kernel back to back in a layer), its block placement count for an
in-order and a scattered placement, and its refusals (an empty file, no GeGLU kernel). Run by nib_tests
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
