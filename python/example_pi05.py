#!/usr/bin/env python3
"""example_pi05.py: Pi0.5 in a control loop from Python, with what each call costs.

Loads a checkpoint once, then calls the policy CALLS times with fresh U8 camera frames and text ids
(random here; a robot passes its own), as a control loop would, and prints the latency of a call
from Python to Python: median, 90th and 99th percentile (nearest rank) and maximum. The first call
of a shape captures its CUDA graph and is reported on its own.

    python3 python/example_pi05.py CHECKPOINT [--preset fast|bf16|ref] [--cams 2] [--text 20]
                                   [--horizon 10] [--calls 200]

CHECKPOINT: an openpi-converted model.safetensors, one written by `nib quantize --pi05`, or the
synthetic one `nib demo` leaves at $TMPDIR/nib-demo-pi05.safetensors. No dependencies besides nib.py
and build/libnib.so (`make -j`); NumPy is used when installed.
"""
import argparse
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nib  # noqa: E402


def quantile(sorted_values, q):
    """Nearest rank: the smallest value with at least q * n values at or below it."""
    n = len(sorted_values)
    return sorted_values[min(n - 1, max(0, math.ceil(q * n - 1e-9) - 1))]


def main():
    ap = argparse.ArgumentParser(description="Pi0.5 in a control loop from Python: latency per call")
    ap.add_argument("checkpoint")
    ap.add_argument("--preset", default="fast", help="fast, bf16 (GPU) or ref (fp32 CPU reference)")
    ap.add_argument("--cams", type=int, default=2, help="cameras per call (default 2)")
    ap.add_argument("--text", type=int, default=20, help="text tokens per call (default 20)")
    ap.add_argument("--horizon", type=int, default=10, help="action steps per call (default 10)")
    ap.add_argument("--calls", type=int, default=200, help="timed calls after the first (default 200)")
    a = ap.parse_args()
    if a.calls < 1:
        ap.error("--calls must be at least 1")

    t0 = time.perf_counter()
    try:
        policy = nib.Pi05Policy(a.checkpoint, preset=a.preset, max_horizon=a.horizon)
    except (nib.NibError, OSError) as e:
        sys.exit("example_pi05: %s" % e)
    print("loaded %s (preset %s) in %.2f s: up to %d cameras of %dx%d, %d text tokens, horizon %d, %d steps"
          % (a.checkpoint, a.preset, time.perf_counter() - t0, policy.max_cameras, policy.image_size,
             policy.image_size, policy.max_text, policy.max_horizon, policy.steps))
    if not 1 <= a.cams <= policy.max_cameras:
        sys.exit("example_pi05: --cams %d: this model takes 1..%d cameras" % (a.cams, policy.max_cameras))

    rng = random.Random(7)
    S = policy.image_size
    try:
        import numpy as np
        gen = np.random.default_rng(7)

        def frames():
            return gen.integers(0, 256, size=(a.cams, S, S, 3), dtype=np.uint8)
    except ImportError:
        def frames():
            return bytes(rng.getrandbits(8) for _ in range(a.cams * S * S * 3))

    def text():
        return [rng.randrange(policy.vocab) for _ in range(a.text)]

    inputs = [(frames(), text()) for _ in range(min(a.calls, 8))]  # prepared outside the timed loop
    with policy:
        t = time.perf_counter()
        actions = policy.run(inputs[0][0], inputs[0][1], horizon=a.horizon, seed=1)
        first = 1e3 * (time.perf_counter() - t)
        ms = []
        for i in range(a.calls):
            img, ids = inputs[i % len(inputs)]
            t = time.perf_counter()
            actions = policy.run(img, ids, horizon=a.horizon, seed=i)
            ms.append(1e3 * (time.perf_counter() - t))
    ms.sort()
    print("first call: %.3f ms (on a GPU preset it captures the call's CUDA graph)" % first)
    print("%d calls, %d cameras (U8 frames), %d text tokens, horizon %d, Python to Python: median %.3f, p90 %.3f, "
          "p99 %.3f, max %.3f ms (%.1f Hz at the median)"
          % (a.calls, a.cams, a.text, a.horizon, quantile(ms, 0.5), quantile(ms, 0.9), quantile(ms, 0.99), ms[-1],
             1e3 / quantile(ms, 0.5)))
    row = list(actions[0])
    print("last call's first action: [%s ...]" % ", ".join("%.4f" % v for v in row[:4]))


if __name__ == "__main__":
    main()
