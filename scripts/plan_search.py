#!/usr/bin/env python3
"""plan_search.py - a coordinate search over the launch plans of Pi0.5's action-expert products, timed
inside the model (on the GPU machine).

The low-bit GEMM's planner and the model's plan rules (ops/gemm.h, NIB_GEMM_RULE_*) were fitted to the
kernel lab, which replays one kernel back to back. Inside the model each product follows other kernels
under programmatic dependent launch, and the products' plans interact: in the fifty-fifth session q|k|v
on 2 warps along K took 0.23 ms off a call with gate|up on 2 warps and nothing with gate|up on one
(docs/design.md, "Fifty-fifth session"). So this script searches the products one at a time, in rounds,
until a round changes nothing:

  for each product: time the call once with each candidate plan forced (NIB_GEMM_FORCE, the other
  products at the current assignment), and the current assignment before and after; the fastest
  candidate, if it beats the faster of those two by more than --min-gain, is confirmed by --confirm
  alternations (current, candidate, current, candidate, ...) and taken only if every candidate run
  is faster than every current run and the mean of those runs is faster by at least --min-gain too.
  (The script does not know which plan the model picks by itself, so the model's own plan is one of
  the candidates; forced, it ties with the current assignment within the noise, and at H = 16 in the
  fifty-seventh session such a tie (2 x 0.002-0.004 ms) passed the every-run test alone.)

Candidates: the mma.sync kernel's plans, for each MT of --mt, W warps along K (1, 2, 4, 8) and S K splits
(1, 2, 4, 8, 16) where every warp gets a pipeline step (S <= K / 128 / (2 W) at MT <= 2, K / 128 / W
above, ops/gemm_plan.c); and, with --wg-tiles, the wgmma kernel's plans (NIB_GEMM_FORCE's entries
K:N:M:wg<tokens>:ks:cm): each tile of --wg-tiles, each K split of --wg-ks (at most 8 and K / 128) and
each cluster size of --wg-cm (2 only for tiles of 64+ tokens). At H = 50 the model runs every product on
the wgmma kernel's 64-token tile by default, and the q|k|v epilogue (RoPE + cache write) fuses only into
an mma.sync plan. A candidate the planner rejects ("does not fit": shared memory, X budget, the split-K
workspace, a tile the kernel lacks) is recorded as infeasible and skipped; any other failure of `nib
bench` stops the search with its message. The result is NIB_GEMM_FORCE's value for the best assignment;
making it the model's default is a change to models/pi05.c's plan rules (and their tests).

usage: scripts/plan_search.py [--nib PATH] [--checkpoint Q] [--cams 2] [--horizon 10]
                              [--reps 100] [--mt 2] [--products qkv,o,gu,down] [--wk 1,2,4,8]
                              [--ks 1,2,4,8,16] [--wg-tiles T,..] [--wg-ks 1,2,4,8] [--wg-cm 1]
                              [--rounds 3] [--confirm 2] [--min-gain 0.01]
                              [--time-budget S] [--start FORCE] [--json FILE]
  --nib        the nib binary (default ./build/nib); a command line is split on spaces
  --checkpoint a pre-quantized checkpoint (`nib quantize --pi05 fast`); without it the script makes one
               in $TMPDIR from `nib demo`'s synthetic checkpoint (as scripts/ab.sh -q does)
  --time-budget  stop before a run that would end past S seconds from the start (default 540: one
               device-tool call); the JSON then says so and holds everything measured. A run is one
               `nib bench pi05` process, a few seconds on an H200 (loading ~2 s, the capture, the reps); a round
               over the four products with every candidate is ~60 runs, so narrow --products / --wk /
               --ks, or spread the search over calls with --start
  --horizon    H, the expert's M (any horizon `nib bench pi05 --horizon` takes; the plan rules cover
               8 < M <= 16, so 10 and 16 are the ones they decide, and gate|up's at 32 < M <= 64; elsewhere
               the planner and the wgmma tile rule decide)
  --mt         the mma.sync MTs to try (comma-separated; 8-token tiles per M chunk, 1, 2 or 4); the first
               is the one a plan is described without ("wk4:ks1"; others "mt4:wk4:ks1")
  --wg-tiles   the wgmma kernel's token tiles to try (16, 32, 64, 128, 192, 256; default none), described
               as "wg64:ks2:cm1"
  --start      the assignment to start from, as NIB_GEMM_FORCE's value (a previous run's result); by
               default the model's own plans
  --json       where to write the record (default plan-search.json, or $OUT/plan-search.json)
Environment: NIB_GIT_COMMIT (recorded in the JSON).
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

# the expert's products: K -> N (Gemma-300M: width 1024, 8 query heads + 1 KV head of 256, MLP 4096)
PRODUCTS = {"qkv": (1024, 2560), "o": (2048, 1024), "gu": (1024, 8192), "down": (4096, 1024)}
ROW = re.compile(r"^(fast|bf16)\s+(\d)\s+(\d+)\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms")
NOFIT = re.compile(r"NIB_GEMM_FORCE: .*does not fit")


class SearchError(Exception):
    pass


# A plan: ("m", mt, wk, ks) for the mma.sync kernel, ("w", tokens, ks, cm) for the wgmma kernel.


def candidates(k, mts=(2,), wks=(1, 2, 4, 8), kss=(1, 2, 4, 8, 16), wg_tiles=(), wg_kss=(1, 2, 4, 8), wg_cms=(1,)):
    """mma.sync plans in which every warp gets a pipeline step (2 chunks of 128 per step at MT <= 2), then
    wgmma plans with at most 8 and K / 128 K splits, clusters of 2 only for tiles of 64+ tokens."""
    out = []
    for mt in mts:
        cps = 2 if mt <= 2 else 1
        for wk in wks:
            maxks = max(1, (k // 128) // (wk * cps))
            for ks in kss:
                if ks <= maxks:
                    out.append(("m", mt, wk, ks))
    for bt in wg_tiles:
        for ks in wg_kss:
            for cm in wg_cms:
                if ks <= min(8, k // 128) and (cm == 1 or bt >= 64):
                    out.append(("w", bt, ks, cm))
    return out


def label(plan, mt0):
    if plan[0] == "w":
        return "wg%d:ks%d:cm%d" % plan[1:]
    return ("wk%d:ks%d" % plan[2:]) if plan[1] == mt0 else ("mt%d:wk%d:ks%d" % plan[1:])


def entry(p, plan, horizon):
    k, n = PRODUCTS[p]
    if plan[0] == "w":
        return "%d:%d:%d:wg%d:%d:%d" % ((k, n, horizon) + plan[1:])
    return "%d:%d:%d:%d:%d:%d" % ((k, n, horizon) + plan[1:])


def force_string(assign, horizon):
    return ",".join(entry(p, plan, horizon) for p, plan in sorted(assign.items()))


def parse_force(v, horizon):
    """NIB_GEMM_FORCE's value -> {product: plan}; ValueError naming the entry that is not one of ours."""
    names = {shape: p for p, shape in PRODUCTS.items()}
    out = {}
    for e in filter(None, v.split(",")):
        f = e.split(":")
        wg = len(f) == 6 and f[3].startswith("wg")
        if wg:
            f[3] = f[3][2:]
        if len(f) != 6 or not all(x.isdigit() for x in f):
            raise ValueError("%s: not K:N:M:mt:wk:ks or K:N:M:wg<tokens>:ks:cm" % e)
        k, n, m, a, b, c = map(int, f)
        if (k, n) not in names or m != horizon:
            raise ValueError("%s: not an expert product at M = %d" % (e, horizon))
        out[names[(k, n)]] = ("w", a, b, c) if wg else ("m", a, b, c)
    return out


def describe(assign, mt0):
    return " ".join("%s=%s" % (p, label(plan, mt0)) for p, plan in sorted(assign.items())) or "(the model's plans)"


class Runner:
    def __init__(self, a):
        self.a = a
        self.nib = shlex.split(a.nib)
        self.t0 = time.monotonic()
        self.evals = []
        self.run_s = None  # the longest run so far, for the time budget
        self.device = None

    def left(self):
        return self.a.time_budget - (time.monotonic() - self.t0)

    def measure(self, assign, what):
        """One `nib bench pi05` under assign: its row as a dict, or None if the plan does not fit."""
        if self.run_s is not None and self.left() < self.run_s * 1.2:
            raise TimeoutError
        env = dict(os.environ)
        env.pop("NIB_GEMM_FORCE", None)
        if assign:
            env["NIB_GEMM_FORCE"] = force_string(assign, self.a.horizon)
        cmd = self.nib + ["bench", "pi05", "--checkpoint", self.a.checkpoint, "--preset", self.a.preset, "--cams",
                          str(self.a.cams), "--horizon", str(self.a.horizon), "--reps", str(self.a.reps)]
        t = time.monotonic()
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        dt = time.monotonic() - t
        self.run_s = dt if self.run_s is None else max(self.run_s, dt)
        ev = {"what": what, "force": env.get("NIB_GEMM_FORCE", ""), "assign": describe(assign, self.a.mt[0])}
        if r.returncode != 0:
            if NOFIT.search(r.stdout):
                ev["infeasible"] = NOFIT.search(r.stdout).group(0)
                self.evals.append(ev)
                print("plan_search: %-34s does not fit" % ev["assign"], flush=True)
                return None
            raise SearchError("`%s` (NIB_GEMM_FORCE=%s) exited %d:\n%s" %
                              (" ".join(cmd), ev["force"], r.returncode, r.stdout[-2000:]))
        for line in r.stdout.splitlines():
            if self.device is None and " copy " in line and "TFLOP/s" in line:
                self.device = line.strip()
            m = ROW.match(line)
            if m and int(m.group(2)) == self.a.cams and int(m.group(3)) == self.a.horizon:
                ev.update(total_ms=float(m.group(4)), vision_ms=float(m.group(5)), prefix_ms=float(m.group(6)),
                          step_ms=float(m.group(7)), wall_ms=float(m.group(8)))
                self.evals.append(ev)
                return ev
        raise SearchError("`%s` printed no row for %d cameras, H = %d:\n%s" %
                          (" ".join(cmd), self.a.cams, self.a.horizon, r.stdout[-2000:]))


def search(a, run, st):
    """Updates st["assign"] (the current assignment) and st["log"] (one entry per product and round) as it
    goes, so that a stop by the time budget or an error keeps what was decided; returns why it ended."""
    cur = st["assign"]
    log = st["log"]
    first = run.measure(cur, "start")
    if first is None:
        raise SearchError("--start %s does not fit" % force_string(cur, a.horizon))
    mt0 = a.mt[0]
    print("plan_search: start %s: %.3f ms" % (describe(cur, mt0), first["total_ms"]), flush=True)
    for rnd in range(1, a.rounds + 1):
        changed = False
        for p in a.products:
            k = PRODUCTS[p][0]
            refs = [run.measure(cur, "round %d %s: current (before)" % (rnd, p))["total_ms"]]
            screen = []
            for c in candidates(k, a.mt, a.wk, a.ks, a.wg_tiles, a.wg_ks, a.wg_cm):
                if cur.get(p) == c:
                    continue
                trial = dict(cur)
                trial[p] = c
                ev = run.measure(trial, "round %d %s: screen" % (rnd, p))
                if ev:
                    screen.append((ev["total_ms"], c))
                    print("plan_search: round %d %-5s %-16s %.3f ms" % (rnd, p, label(c, mt0), ev["total_ms"]),
                          flush=True)
            refs.append(run.measure(cur, "round %d %s: current (after)" % (rnd, p))["total_ms"])
            if not screen:
                continue
            best_t, best = min(screen)
            if best_t >= min(refs) - a.min_gain:
                log.append({"round": rnd, "product": p, "kept": describe(cur, mt0), "best_screened": label(best, mt0),
                            "screen_ms": best_t, "current_ms": refs})
                continue
            trial = dict(cur)
            trial[p] = best
            cs, ts = [], []
            for i in range(a.confirm):
                cs.append(run.measure(cur, "round %d %s: confirm current" % (rnd, p))["total_ms"])
                ts.append(run.measure(trial, "round %d %s: confirm %s" % (rnd, p, label(best, mt0)))["total_ms"])
            gain = sum(cs) / len(cs) - sum(ts) / len(ts)
            took = max(ts) < min(cs) and gain >= a.min_gain
            log.append({"round": rnd, "product": p, "candidate": label(best, mt0), "current_ms": cs,
                        "candidate_ms": ts, "mean_gain_ms": round(gain, 4), "taken": took})
            print("plan_search: round %d %-5s %s: %s against %s: %s" %
                  (rnd, p, label(best, mt0), ts, cs, "taken" if took else "not taken"), flush=True)
            if took:
                cur = trial
                st["assign"] = cur
                changed = True
        if not changed:
            return "a round without a change (%d round%s)" % (rnd, "s" if rnd > 1 else "")
    return "--rounds (%d; the last round still changed the plans)" % a.rounds


def ensure_checkpoint(a):
    if a.checkpoint:
        if not os.path.isfile(a.checkpoint):
            raise SearchError("--checkpoint %s: no such file" % a.checkpoint)
        return
    tmp = os.environ.get("TMPDIR", "/tmp")
    src, q = os.path.join(tmp, "nib-demo-pi05.safetensors"), os.path.join(tmp, "nib-plan-search-%s.safetensors" % a.preset)
    nib = shlex.split(a.nib)
    if not os.path.isfile(src):
        print("plan_search: nib demo (synthesizes %s)" % src, flush=True)
        subprocess.run(nib + ["demo"], stdout=subprocess.DEVNULL, check=True)
    print("plan_search: nib quantize %s -> %s" % (src, q), flush=True)
    subprocess.run(nib + ["quantize", src, q, "--pi05", a.preset, "--force", "-q"], check=True)
    a.checkpoint = q


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=None)
    ap.add_argument("--nib", default="./build/nib")
    ap.add_argument("--checkpoint")
    ap.add_argument("--preset", default="fast", choices=["fast"],
                    help="the low-bit expert's preset (the bf16 expert runs on cuBLAS: nothing to force)")
    ap.add_argument("--cams", type=int, default=2, choices=[1, 2, 3])
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--mt", default="2", help="the mma.sync MTs to try (1, 2, 4)")
    ap.add_argument("--products", default="qkv,o,gu,down")
    ap.add_argument("--wk", default="1,2,4,8", help="warps along K to try")
    ap.add_argument("--ks", default="1,2,4,8,16", help="K splits to try")
    ap.add_argument("--wg-tiles", default="", help="the wgmma kernel's token tiles to try (default none)")
    ap.add_argument("--wg-ks", default="1,2,4,8", help="the wgmma kernel's K splits to try")
    ap.add_argument("--wg-cm", default="1", help="the wgmma kernel's cluster sizes to try (1, 2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--confirm", type=int, default=2)
    ap.add_argument("--min-gain", type=float, default=0.01,
                    help="ms: what the screen's best must gain, and the confirmation's mean gain")
    ap.add_argument("--time-budget", type=float, default=540.0, help="seconds")
    ap.add_argument("--start", default="")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    a.products = [p for p in a.products.split(",") if p]
    bad = [p for p in a.products if p not in PRODUCTS]
    if bad or not a.products:
        ap.error("--products: %s not among %s" % (",".join(bad) or "(none)", ",".join(PRODUCTS)))
    try:
        a.mt = [int(x) for x in a.mt.split(",") if x]
        a.wk = [int(x) for x in a.wk.split(",") if x]
        a.ks = [int(x) for x in a.ks.split(",") if x]
        a.wg_tiles = [int(x) for x in a.wg_tiles.split(",") if x]
        a.wg_ks = [int(x) for x in a.wg_ks.split(",") if x]
        a.wg_cm = [int(x) for x in a.wg_cm.split(",") if x]
    except ValueError:
        ap.error("--mt / --wk / --ks / --wg-tiles / --wg-ks / --wg-cm: comma-separated integers")
    if not a.mt or any(t not in (1, 2, 4) for t in a.mt):
        ap.error("--mt from 1, 2, 4")
    if not a.wk or not a.ks or any(w not in (1, 2, 4, 8) for w in a.wk) or any(k < 1 for k in a.ks):
        ap.error("--wk from 1, 2, 4, 8; --ks positive")
    if (any(t not in (16, 32, 64, 128, 192, 256) for t in a.wg_tiles) or not a.wg_ks or not a.wg_cm or
            any(k < 1 or k > 8 for k in a.wg_ks) or any(c not in (1, 2) for c in a.wg_cm)):
        ap.error("--wg-tiles from 16, 32, 64, 128, 192, 256; --wg-ks from 1..8; --wg-cm from 1, 2")
    if a.rounds < 1 or a.confirm < 1 or a.reps < 5:
        ap.error("--rounds and --confirm at least 1, --reps at least 5")
    if not a.json:
        a.json = os.path.join(os.environ["OUT"], "plan-search.json") if os.environ.get("OUT") else "plan-search.json"
    try:
        start = parse_force(a.start, a.horizon)
    except ValueError as e:
        ap.error("--start %s" % e)
    try:
        ensure_checkpoint(a)
    except (SearchError, subprocess.CalledProcessError, OSError) as e:
        print("plan_search: %s" % e, file=sys.stderr)
        return 1
    run = Runner(a)
    rec = {"bench": "coordinate search over the Pi0.5 action expert's product plans inside the model "
                    "(scripts/plan_search.py; NIB_GEMM_FORCE=K:N:M:mt:wk:ks or K:N:M:wg<tokens>:ks:cm)",
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "git_commit": os.environ.get("NIB_GIT_COMMIT", ""),
           "command": "scripts/plan_search.py " + " ".join(shlex.quote(x) for x in argv),
           "preset": a.preset, "cams": a.cams, "horizon": a.horizon, "reps": a.reps, "mt": a.mt,
           "wg_tiles": a.wg_tiles,
           "products": {p: "%d:%d" % PRODUCTS[p] for p in a.products}}
    rc = 0
    st = {"assign": start, "log": []}
    try:
        rec["stopped_by"] = search(a, run, st)
    except TimeoutError:
        rec["stopped_by"] = "--time-budget (%.0f s)" % a.time_budget
        print("plan_search: stopped: the next run would pass --time-budget", flush=True)
    except (SearchError, OSError) as e:
        rec["stopped_by"] = "error: %s" % str(e).splitlines()[0]
        print("plan_search: %s" % e, file=sys.stderr)
        rc = 1
    rec["device"] = run.device
    rec["evaluations"] = run.evals
    cur = st["assign"]
    rec["decisions"] = st["log"]
    rec["result"] = {"assign": describe(cur, a.mt[0]), "NIB_GEMM_FORCE": force_string(cur, a.horizon)}
    rec["seconds"] = round(time.monotonic() - run.t0, 1)
    with open(a.json, "w") as f:
        json.dump(rec, f, indent=1)
    print("plan_search: %s; best: %s (NIB_GEMM_FORCE=%s); %d runs in %.0f s; %s" %
          (rec["stopped_by"], rec["result"]["assign"], rec["result"]["NIB_GEMM_FORCE"], len(run.evals), rec["seconds"],
           a.json), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
