#!/usr/bin/env python3
"""scripts/plan_search.py against tests/python/fake_nib_bench.py (no GPU): the search finds the made-up
cost's optimum, which needs a second round because two products interact (as q|k|v and gate|up did in
the model); --start begins from a given assignment; a candidate whose one screen run was fast is refused
by the confirmation, and so is a tie (the model's own plan forced) that beats every current run by less
than --min-gain; the wgmma kernel's entries and a second MT are searched and described, and --start takes
a wgmma entry; a plan that does not fit is recorded and skipped; the time budget stops it with the
record written; a failing bench stops it with the failure's message and a non-zero exit; bad arguments are
refused. Run by nib_tests (pi05_plan_search_script) from the repository root."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

FAKE = [sys.executable, "tests/python/fake_nib_bench.py"]
SCRIPT = [sys.executable, "scripts/plan_search.py"]


def run(d, name, extra, env=None):
    out = os.path.join(d, name + ".json")
    e = dict(os.environ)
    e.pop("OUT", None)
    e.update(env or {})
    e["FAKE_NIB_LOG"] = os.path.join(d, name + ".log")
    r = subprocess.run(SCRIPT + ["--nib", " ".join(FAKE), "--checkpoint", os.path.join(d, "q.safetensors"), "--json", out]
                       + extra, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    rec = json.load(open(out)) if os.path.exists(out) else None
    return r, rec


with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, "q.safetensors"), "w").close()

    r, rec = run(d, "full", ["--rounds", "4"])
    check(r.returncode == 0, "full search exit %d: %s" % (r.returncode, r.stderr))
    check(rec is not None, "full search wrote no JSON")
    if rec:
        check(rec["result"]["assign"] == "gu=wk1:ks1 o=wk2:ks4 qkv=wk4:ks1", "result %s" % rec["result"]["assign"])
        check(rec["result"]["NIB_GEMM_FORCE"] == "1024:8192:10:2:1:1,2048:1024:10:2:2:4,1024:2560:10:2:4:1",
              "force string %s" % rec["result"]["NIB_GEMM_FORCE"])
        check(rec["stopped_by"] == "a round without a change (3 rounds)", "stopped_by %s" % rec["stopped_by"])
        check(any("infeasible" in e for e in rec["evaluations"]), "the plan that does not fit was not recorded")
        taken = [(x["round"], x["product"]) for x in rec["decisions"] if x.get("taken")]
        check(taken == [(1, "qkv"), (1, "gu"), (2, "qkv"), (2, "o")], "decisions taken %s" % taken)
        refused = [(x["round"], x["product"], x["candidate"]) for x in rec["decisions"] if x.get("taken") is False]
        check(refused == [(1, "down", "wk2:ks8")], "a one-off fast screen run was not refused: %s" % refused)
        check(rec["device"].startswith("NVIDIA FAKE"), "device %s" % rec["device"])
        # the fake logs the calls that printed a row; the infeasible ones exit before
        nrows = sum(1 for _ in open(os.path.join(d, "full.log")))
        check(sum(1 for e in rec["evaluations"] if "total_ms" in e) == nrows, "evaluations with a row against bench calls")

    # a tie (the model's own plan forced) that the every-run test alone would take
    r, rec = run(d, "tie", ["--products", "gu"], {"FAKE_NIB_TIE": "1"})
    check(r.returncode == 0, "tie exit %d: %s" % (r.returncode, r.stderr))
    if rec:
        check(rec["result"]["assign"] == "(the model's plans)", "a tie was taken: %s" % rec["result"]["assign"])
        conf = [x for x in rec["decisions"] if "taken" in x]
        check(len(conf) == 1 and conf[0]["candidate"] == "wk1:ks1" and max(conf[0]["candidate_ms"]) <
              min(conf[0]["current_ms"]) and abs(conf[0]["mean_gain_ms"] - 0.003) < 1e-6,
              "the tie did not reach the confirmation as one that beats every current run: %s" % conf)
    else:
        check(False, "tie search wrote no JSON")

    r, rec = run(d, "start", ["--start", "1024:8192:10:2:1:1,1024:2560:10:2:4:1"])
    check(r.returncode == 0, "--start exit %d: %s" % (r.returncode, r.stderr))
    check(rec is not None and rec["result"]["assign"] == "gu=wk1:ks1 o=wk2:ks4 qkv=wk4:ks1" and
          rec["stopped_by"] == "a round without a change (2 rounds)" and rec["evaluations"][0]["assign"] ==
          "gu=wk1:ks1 qkv=wk4:ks1", "--start record %s" % ((rec["result"], rec["stopped_by"]) if rec else None,))
    r, rec = run(d, "badstart", ["--start", "1024:8192:50:2:1:1"])
    check(r.returncode == 2 and "not an expert product at M = 10" in r.stderr, "a bad --start: exit %d, %s" %
          (r.returncode, r.stderr))

    # the wgmma kernel's plans and a second MT among the candidates
    r, rec = run(d, "wg", ["--products", "qkv", "--mt", "2,4", "--wk", "2,4", "--ks", "1", "--wg-tiles", "16,64",
                           "--wg-ks", "1,2", "--wg-cm", "1,2"])
    check(r.returncode == 0, "wg search exit %d: %s" % (r.returncode, r.stderr))
    if rec:
        check(rec["result"]["assign"] == "qkv=wg64:ks2:cm1" and rec["result"]["NIB_GEMM_FORCE"] == "1024:2560:10:wg64:2:1",
              "wg result %s" % rec["result"])
        seen = set(e["assign"] for e in rec["evaluations"])
        want = {"qkv=wk2:ks1", "qkv=mt4:wk2:ks1", "qkv=mt4:wk4:ks1", "qkv=wg64:ks1:cm1", "qkv=wg64:ks1:cm2",
                "qkv=wg64:ks2:cm1", "qkv=wg64:ks2:cm2", "qkv=wg16:ks1:cm1", "qkv=wg16:ks2:cm1"}
        check(want <= seen and not any("wg16" in x and "cm2" in x for x in seen),
              "wg candidates: missing %s; seen %s" % (sorted(want - seen), sorted(seen)))
        wg16 = [e for e in rec["evaluations"] if "wg16" in e["assign"]]
        check(wg16 and all("infeasible" in e for e in wg16), "the 16-token tiles were not infeasible: %s" % wg16)
    else:
        check(False, "wg search wrote no JSON")
    r, rec = run(d, "wgstart", ["--products", "qkv", "--wk", "4", "--ks", "1", "--start", "1024:2560:10:wg64:2:1"])
    check(r.returncode == 0 and rec is not None and rec["evaluations"][0]["assign"] == "qkv=wg64:ks2:cm1" and
          rec["result"]["assign"] == "qkv=wg64:ks2:cm1", "--start with a wgmma entry: exit %d, %s" %
          (r.returncode, rec["result"] if rec else r.stderr))
    r, rec = run(d, "badwg", ["--wg-tiles", "48"])
    check(r.returncode == 2 and "--wg-tiles" in r.stderr, "a bad --wg-tiles: exit %d, %s" % (r.returncode, r.stderr))

    r, rec = run(d, "budget", ["--time-budget", "0"])
    check(r.returncode == 0, "time budget exit %d: %s" % (r.returncode, r.stderr))
    check(rec is not None and rec["stopped_by"].startswith("--time-budget") and len(rec["evaluations"]) == 1,
          "time budget record %s" % ((rec["stopped_by"], len(rec["evaluations"])) if rec else None,))

    r, rec = run(d, "fail", [], {"FAKE_NIB_FAIL": "1"})
    check(r.returncode == 1 and "out of memory" in r.stderr, "a failing bench: exit %d, %s" % (r.returncode, r.stderr))
    check(rec is not None and rec["stopped_by"].startswith("error:"), "a failing bench's record %s" % (rec["stopped_by"] if rec else None,))

    r, rec = run(d, "products", ["--products", "qkv,nope"])
    check(r.returncode == 2 and "nope" in r.stderr, "an unknown product: exit %d, %s" % (r.returncode, r.stderr))

    r = subprocess.run(SCRIPT + ["--nib", " ".join(FAKE), "--checkpoint", os.path.join(d, "missing.safetensors"),
                                 "--json", os.path.join(d, "m.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    check(r.returncode == 1 and "missing.safetensors" in r.stderr, "a missing checkpoint: exit %d, %s" % (r.returncode, r.stderr))

finish("test_plan_search")
