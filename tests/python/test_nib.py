#!/usr/bin/env python3
"""python/nib.py against the C API: run by the C test pi05_policy_python (tests/test_pi05_ref.c),
which writes the tiny checkpoint and, into DIR, one call's inputs and the actions the C API gave.

    test_nib.py LIBNIB.so CHECKPOINT DIR

Checks: the same actions bit for bit from U8 frames (bytes, bytearray) and from the same frames
in F32 (array.array), with and without NumPy; sizes; errors raised as NibError naming the cause;
python/example_pi05.py runs; python/pi05_io.py (openpi's state / prompt / action arithmetic).
Exit 0 and "python: N checks passed" on success, 1 and the first failures otherwise."""
import array
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
import nib  # noqa: E402

fails = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        fails.append(what)
        print("FAIL: " + what)


def flat(actions):
    if hasattr(actions, "tobytes"):
        return actions.astype("float32").tobytes()
    return array.array("f", [v for row in actions for v in row]).tobytes()


def raises(fn, status, needle, what):
    try:
        fn()
    except nib.NibError as e:
        check(e.status == status and needle in str(e), "%s: got %s, want %s naming %r" % (what, e, status, needle))
        return
    except (ValueError, TypeError) as e:
        check(status is None and needle in str(e), "%s: got %r, want %s naming %r" % (what, e, status, needle))
        return
    check(False, "%s: no error raised" % what)


def check_pi05_io():
    """python/pi05_io.py against what ../shared/reference/pi05.md says openpi computes (and, when
    NumPy is installed, against np.digitize itself on random values)."""
    import pi05_io as io
    # bins: the left edges are -1 + i / 128; a value on an edge belongs to the bin it opens
    edge_cases = [(-1.0, 0), (-1.0000001, -1), (-5.0, -1), (-1.0 + 1 / 128, 1), (-1.0 + 1 / 128 - 1e-12, 0), (0.0, 128),
                  (-1e-12, 127), (0.9921875, 255), (0.9921874, 254), (1.0, 255), (7.0, 255)]
    got = io.state_bins([v for v, _ in edge_cases])
    check(got == [b for _, b in edge_cases], "state_bins on the bin edges: %r" % got)
    try:
        import numpy as np
        rng = np.random.default_rng(5)
        s = np.concatenate([rng.uniform(-1.2, 1.2, 4000), np.linspace(-1, 1, 257)])
        want = (np.digitize(s, np.linspace(-1, 1, 257)[:-1]) - 1).tolist()
        check(io.state_bins(s) == want, "state_bins differs from np.digitize")
    except ImportError:
        pass
    # normalization: the formula, its inverse, and the state path end to end
    q01, q99 = [-2.0, 0.5, 10.0], [2.0, 1.5, 30.0]
    x = [0.0, 1.0, 25.0]
    n = io.normalize_quantile(x, q01, q99)
    check(all(abs(a - b) < 1e-15 for a, b in zip(n, [(v - lo) / (hi - lo + 1e-6) * 2 - 1 for v, lo, hi in zip(x, q01, q99)])),
          "normalize_quantile %r" % n)
    back = io.unnormalize_quantile(n, q01, q99)
    check(all(abs(a - b) < 1e-12 for a, b in zip(back, x)), "unnormalize_quantile(normalize_quantile(x)) = %r" % back)
    check(io.discretize_state(x, q01, q99) == io.state_bins(n), "discretize_state")
    check(io.discretize_state([0.0], [-2.0], [2.0]) == [127], "discretize_state([0] in [-2, 2]) = %r" %
          io.discretize_state([0.0], [-2.0], [2.0]))  # 0 normalizes to -2.5e-7: the bin left of 0
    # the prompt string, character for character
    check(io.pi05_prompt(" pick_up the\ncup ", [0, 255, -1]) == "Task: pick up the cup, State: 0 255 -1;\nAction: ",
          "pi05_prompt: %r" % io.pi05_prompt(" pick_up the\ncup ", [0, 255, -1]))
    # actions: the first len(q01) dims of each row, un-normalized
    acts = [[(i + j) / 40.0 - 0.5 for j in range(32)] for i in range(3)]
    u = io.unnormalize_actions(acts, q01, q99)
    check(len(u) == 3 and all(len(r) == 3 for r in u) and
          all(abs(u[i][j] - ((acts[i][j] + 1) / 2 * (q99[j] - q01[j] + 1e-6) + q01[j])) < 1e-12 for i in range(3) for j in range(3)),
          "unnormalize_actions %r" % u)
    for fn, what in [(lambda: io.normalize_quantile([1.0, 2.0], [0.0], [1.0]), "2 dims, 1 stat"),
                     (lambda: io.unnormalize_actions([[0.0]], [0.0, 0.0], [1.0, 1.0]), "a short actions row"),
                     (lambda: io.state_bins(3.0), "a number, not a sequence")]:
        try:
            fn()
            check(False, "pi05_io: %s raised nothing" % what)
        except (ValueError, TypeError) as e:
            check("pi05_io" in str(e), "pi05_io: %s raised %r" % (what, e))


def main():
    check_pi05_io()
    lib_path, ckpt, d = sys.argv[1:4]
    nib.load_library(lib_path)
    rd = lambda n: open(os.path.join(d, n), "rb").read()
    u8, ids_b, noise_b, want = rd("images_u8"), rd("text_ids"), rd("noise"), rd("actions")
    ids = array.array("i")
    ids.frombytes(ids_b)
    noise = array.array("f")
    noise.frombytes(noise_b)
    with nib.Pi05Policy(ckpt, preset="ref") as p:
        S, A = p.image_size, p.action_dim
        H = len(noise) // A
        check(S > 0 and A > 0 and p.max_cameras >= 1 and p.vocab > 0 and p.steps > 0, "sizes %r" % vars(p))
        V = len(u8) // (3 * S * S)
        # U8 frames as bytes (read-only: copied) and bytearray (no copy)
        check(flat(p.run(u8, ids, noise=noise)) == want, "U8 frames (bytes): actions differ from the C API's")
        check(flat(p.run(bytearray(u8), list(ids), noise=noise)) == want, "U8 frames (bytearray): actions differ")
        # the same frames as F32 NCHW, u8 / 255 * 2 - 1 in fp32 (array.array rounds each to fp32)
        f = array.array("f", [0.0]) * (V * 3 * S * S)
        for v in range(V):
            for y in range(S):
                for x in range(S):
                    for c in range(3):
                        q = array.array("f", [u8[((v * S + y) * S + x) * 3 + c]])[0]
                        q = array.array("f", [q / 255.0])[0]
                        q = array.array("f", [q * 2.0])[0]
                        f[((v * 3 + c) * S + y) * S + x] = array.array("f", [q - 1.0])[0]
        check(flat(p.run(f, ids, noise=noise)) == want, "the same frames in F32: actions differ")
        try:
            import numpy as np
            img = np.frombuffer(u8, dtype=np.uint8).reshape(V, S, S, 3).copy()
            out = p.run(img, np.array(ids, dtype=np.int64), noise=np.frombuffer(noise_b, dtype=np.float32).reshape(H, A))
            check(out.shape == (H, A) and out.dtype == np.float32 and out.tobytes() == want, "NumPy in and out")
        except ImportError:
            pass
        # a masked camera is skipped: the same as leaving it out
        one = p.run(u8[: 3 * S * S], ids, noise=noise)
        masked = p.run(u8, ids, noise=noise, image_mask=[1] + [0] * (V - 1))
        check(flat(one) == flat(masked), "a masked camera changed the actions")
        # seeded noise is deterministic
        check(flat(p.run(u8, ids, horizon=H, seed=5)) == flat(p.run(u8, ids, horizon=H, seed=5)), "seeded calls differ")
        # errors
        raises(lambda: p.run(u8, [p.vocab], horizon=H), "NIB_ERR_INVALID_ARG", str(p.vocab), "an id outside the vocabulary")
        raises(lambda: p.run(u8[:-1], ids, horizon=H), None, "whole number", "a truncated image buffer")
        raises(lambda: p.run(array.array("d", [0.0] * 3), ids, horizon=H), None, "format 'd'", "float64 images")
        raises(lambda: p.run(u8, ids), None, "horizon=", "no horizon and no noise")
        raises(lambda: p.run(u8, ids, horizon=p.max_horizon + 1), "NIB_ERR_SHAPE", "", "a horizon above max_horizon")
        raises(lambda: p.run(u8, ids, noise=noise, horizon=H + 1), None, "horizon", "noise of another horizon")
    raises(lambda: p.run(u8, ids, horizon=H), None, "closed", "a closed policy")
    raises(lambda: nib.Pi05Policy(os.path.join(d, "missing.safetensors"), preset="ref"), "NIB_ERR_IO",
           "missing.safetensors", "a missing checkpoint")
    raises(lambda: nib.Pi05Policy(ckpt, preset="fastest"), "NIB_ERR_INVALID_ARG", "fastest", "an unknown preset")
    raises(lambda: nib.Pi05Policy(ckpt, preset="ref", precision="vision=fp5"), "NIB_ERR_INVALID_ARG", "fp5",
           "a bad precision override")
    # python/example_pi05.py (the README's control loop) runs and reports its latency; a bad option is named
    import subprocess
    ex = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python", "example_pi05.py")
    env = dict(os.environ, NIB_LIB=lib_path)
    r = subprocess.run([sys.executable, ex, ckpt, "--preset", "ref", "--cams", "1", "--text", "5", "--horizon", "4",
                        "--calls", "3"], env=env, capture_output=True, text=True, timeout=600)
    check(r.returncode == 0 and "3 calls, 1 cameras" in r.stdout and "Python to Python: median" in r.stdout,
          "example_pi05.py: rc %d, output %r %r" % (r.returncode, r.stdout[-300:], r.stderr[-300:]))
    r = subprocess.run([sys.executable, ex, ckpt, "--preset", "ref", "--cams", "99"], env=env, capture_output=True,
                       text=True, timeout=600)
    check(r.returncode != 0 and "--cams 99" in r.stderr, "example_pi05.py --cams 99: rc %d, %r" % (r.returncode, r.stderr[-300:]))
    if fails:
        print("python: %d of %d checks failed" % (len(fails), checks))
        return 1
    print("python: %d checks passed" % checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
