#!/usr/bin/env python3
"""scripts/ab_json.py on made-up scripts/ab.sh logs in the exact formats of `nib bench pi05` and `nib bench
gemm` (no GPU): every row of every block is kept with its label and run, header / tail / plan-only lines are
left out, a block without a row (a failed run) and a log that is not an ab.sh log are errors, and the
side-by-side table lists each label's values in run order. Run by nib_tests (ab_json_script) from the
repository root."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

SCRIPT = [sys.executable, "scripts/ab_json.py"]


PI05_HEAD = ("NVIDIA H200: copy 4270 GB/s, cuBLASLt bf16 778 / fp8 1530 TFLOP/s; images F32 [V,3,224,224]\n"
             "preset cams   H     total    vision    prefix      step      wall in-host in-copy | floors:   vision"
             "   prefix     step     total\n"
             "  fast (vision=fp8 prefix=fp8 expert=nvfp4 kv=bf16): expert per-op (the default)\n")


def pi05_block(label, run, total, step, cams=2):
    return ("== env '%s' (run %d)\n" % (label, run) + PI05_HEAD +
            "fast     %d  10   %.3fms   1.448ms   2.716ms   %.3fms   9.043ms 0.087ms 0.031ms |  0.292ms  1.349ms"
            "  0.041ms   2.053ms\n" % (cams, total, step) +
            "               tail of 100 calls: graph p90 8.924 p99 8.935 max 8.942 ms; host to host p90 9.088\n")


GEMM = (" 16384   2048   532  cublaslt-fp8      33.14     1013   1077.3    1.63x   23.7%  \n"
        " 16384   2048   532  fp8-nib           53.35      629    669.2    1.01x   14.7%  tile 128x96 st4 ks1 cm1\n"
        " 16384   2048   532  fp8-nib       best tile tile 128x192 st4 ks2 cm1 (132 resident): 46.83 us (planner's)\n"
        " 16384   2048   532  cublaslt-fp8  64 configurations accepted by cuBLASLt\n")


def run(d, name, text, extra=None):
    log = os.path.join(d, name + ".log")
    with open(log, "w") as fh:
        fh.write(text)
    out = os.path.join(d, name + ".json")
    args = extra if extra is not None else ["--bench", "b", "--command", "c", "--commit", "abc1234", "-o", out]
    r = subprocess.run(SCRIPT + [log] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    rec = json.load(open(out)) if os.path.exists(out) else None
    return r, rec


with tempfile.TemporaryDirectory() as d:
    log = "ab.sh: building\n" + "".join(pi05_block(lab, i, t, s) for i in (1, 2)
                                         for lab, t, s in (("", 8.911 + i / 1000, 0.523), ("NIB_PDL=0", 10.47, 0.653)))
    r, rec = run(d, "env", log)
    check(r.returncode == 0, "env log: exit %d (%s)" % (r.returncode, r.stderr))
    rows = rec["rows"] if rec else []
    check(len(rows) == 4, "env log: 4 rows, got %d" % len(rows))
    check([(x["env"], x["run"]) for x in rows] == [("", 1), ("NIB_PDL=0", 1), ("", 2), ("NIB_PDL=0", 2)],
          "env log: labels and runs in order: %s" % [(x.get("env"), x.get("run")) for x in rows])
    check(rows and rows[0]["graph_ms"] == 8.912 and rows[0]["step_ms"] == 0.523 and rows[0]["wall_ms"] == 9.043
          and rows[0]["cams"] == 2 and rows[0]["horizon"] == 10, "env log: first row's values: %s" % rows[:1])
    check(rec and rec["git_commit"] == "abc1234" and rec["bench"] == "b" and rec["command"] == "c",
          "env log: the record's fields")
    check("'NIB_PDL=0'" in r.stdout and "10.470 / 10.470" in r.stdout and "8.912 / 8.913" in r.stdout,
          "env log: the side-by-side table:\n" + r.stdout)

    r, rec = run(d, "gemm", "== base (run 1)\n" + GEMM + "== new (run 1)\n" + GEMM.replace("53.35", "50.00"))
    check(r.returncode == 0, "gemm log: exit %d (%s)" % (r.returncode, r.stderr))
    rows = rec["rows"] if rec else []
    check(len(rows) == 4, "gemm log: 4 rows (the 'best tile' and 'configurations' lines left out), got %d" % len(rows))
    check([x.get("version") for x in rows] == ["base", "base", "new", "new"], "gemm log: versions")
    check(len(rows) == 4 and rows[1]["us"] == 53.35 and rows[3]["us"] == 50.0 and rows[1]["plan"] == "tile 128x96 st4 ks1 cm1"
          and rows[0]["vs_cublas_bf16"] == 1.63 and rows[0]["k"] == 16384 and rows[0]["m"] == 532,
          "gemm log: values and plans: %s" % rows)

    r, rec = run(d, "flags", "== flags '' (run 1)\n" + GEMM + "== flags '-DX=1' (run 1)\n" + GEMM)
    check(r.returncode == 0 and rec and [x.get("flags") for x in rec["rows"]] == ["", "", "-DX=1", "-DX=1"],
          "flags log: labels")

    r, rec = run(d, "failed", pi05_block("", 1, 8.9, 0.52) + "== env 'NIB_X=1' (run 1)\nnib bench pi05: error\n")
    check(r.returncode == 1 and rec is None and "env 'NIB_X=1' (run 1)" in r.stderr,
          "a block without a row is an error naming it: exit %d, %s" % (r.returncode, r.stderr))

    r, rec = run(d, "plain", GEMM)
    check(r.returncode == 1 and rec is None and "not an ab.sh log" in r.stderr, "a log without labels is refused")

    r = subprocess.run(SCRIPT + [os.path.join(d, "missing.log"), "--bench", "b", "--command", "c"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    check(r.returncode == 2 and "cannot read" in r.stderr, "a missing log: exit %d, %s" % (r.returncode, r.stderr))

    r, rec = run(d, "noargs", log, extra=[])
    check(r.returncode == 2 and "--bench" in r.stderr, "--bench and --command are required")

    r, rec = run(d, "stdout", log, extra=["--bench", "b", "--command", "c"])
    check(r.returncode == 0 and json.loads(r.stdout)["rows"][0]["graph_ms"] == 8.912 and "NIB_PDL=0" in r.stderr,
          "without -o: the JSON on stdout, the table on stderr")

finish("test_ab_json")
