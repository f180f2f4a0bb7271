#!/usr/bin/env python3
"""ab_json.py - turn the log of scripts/ab.sh (env, run or flags mode) into a bench/results JSON record,
and print each version's numbers side by side.

usage: scripts/ab_json.py LOG --bench TEXT --command TEXT [--reading TEXT] [--commit REV]
                          [--device TEXT] [--date YYYY-MM-DD] [-o FILE]

LOG is what `scripts/ab.sh ... > LOG` wrote on the GPU machine: blocks labelled "== env '<VARS>' (run i)",
"== base (run i)" / "== new (run i)" or "== flags '<FLAGS>' (run i)", each holding one `nib bench` run.
Rows understood:
  nib bench pi05   preset cams H total vision prefix step wall ...  -> graph_ms, vision_ms, prefix_ms,
                   step_ms, wall_ms (the JSON keys of the earlier A/B records)
  nib bench gemm   K N M variant us GB/s TFLOP/s ratio pct% [plan]  -> us, gbps, tflops, vs_cublas_bf16, plan
Every row gets the block's label ("env" / "version" / "flags") and run number. Lines of any other kind
are left out; a block with no row understood is an error (a failed run must not pass as missing data).
The table printed (stdout, or stderr with -o -) lists, per row key (preset/cams/H, or K:N:M variant
plan), each label's values in run order, which is how the A/B is read.
"""
import argparse
import datetime
import json
import re
import sys

LABEL = re.compile(r"^== (?:(env|flags) '(.*)'|(base|new)) \(run (\d+)\)\s*$")
NUM = re.compile(r"^-?[0-9]+(?:\.[0-9]+)?$")


def ms(s):
    if not s.endswith("ms") or not NUM.match(s[:-2]):
        raise ValueError(s)
    return float(s[:-2])


def pi05_row(f):
    if len(f) < 8 or f[0].rstrip("+") not in ("fast", "bf16") or not f[1].isdigit() or not f[2].isdigit():
        return None
    try:
        vals = [ms(x) for x in f[3:8]]
    except ValueError:
        return None
    return {"preset": f[0], "cams": int(f[1]), "horizon": int(f[2]), "graph_ms": vals[0], "vision_ms": vals[1],
            "prefix_ms": vals[2], "step_ms": vals[3], "wall_ms": vals[4]}


def gemm_row(f):
    if (len(f) < 9 or not all(x.isdigit() for x in f[:3]) or not all(NUM.match(x) for x in f[4:7])
            or not f[7].endswith("x") or not NUM.match(f[7][:-1]) or not f[8].endswith("%")):
        return None
    return {"k": int(f[0]), "n": int(f[1]), "m": int(f[2]), "variant": f[3], "us": float(f[4]), "gbps": float(f[5]),
            "tflops": float(f[6]), "vs_cublas_bf16": float(f[7][:-1]), "plan": " ".join(f[9:])}


def parse(lines):
    """(rows, blocks): rows as dicts; blocks as (label kind, label, run, number of rows)"""
    rows, blocks, cur = [], [], None
    for line in lines:
        m = LABEL.match(line)
        if m:
            kind = m.group(1) or "version"
            label = m.group(2) if m.group(1) else m.group(3)
            cur = [kind, label, int(m.group(4)), 0]
            blocks.append(cur)
            continue
        if cur is None:
            continue
        f = line.split()
        r = pi05_row(f) or gemm_row(f)
        if r:
            rows.append(dict({cur[0]: cur[1], "run": cur[2]}, **r))
            cur[3] += 1
    return rows, blocks


def key_of(r):
    if "graph_ms" in r:
        return "%s %d cams H %d" % (r["preset"], r["cams"], r["horizon"]), "graph_ms"
    return "%d:%d M %d %s %s" % (r["k"], r["n"], r["m"], r["variant"], r["plan"]), "us"


def table(rows, out):
    keys, labels, vals = [], [], {}
    for r in rows:
        k, metric = key_of(r)
        lab = r.get("env", r.get("version", r.get("flags")))
        if k not in keys:
            keys.append(k)
        if lab not in labels:
            labels.append(lab)
        vals.setdefault((k, lab), []).append("%.3f" % r[metric])
    for k in keys:
        out.write(k + "\n")
        for lab in labels:
            if (k, lab) in vals:
                out.write("  %-48s %s\n" % ("'%s'" % lab, " / ".join(vals[(k, lab)])))


def main(argv):
    ap = argparse.ArgumentParser(description="scripts/ab.sh's log -> a bench/results JSON record")
    ap.add_argument("log")
    ap.add_argument("--bench", required=True, help="what was compared, one sentence")
    ap.add_argument("--command", required=True, help="the ab.sh command line that wrote LOG")
    ap.add_argument("--reading", default="", help="what the numbers say")
    ap.add_argument("--commit", default="", help="the commit measured")
    ap.add_argument("--device", default="NVIDIA H200 (device tool, kind nvidia-h200)")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("-o", "--out", default="-", help="the JSON file (default: stdout)")
    a = ap.parse_args(argv)
    try:
        with open(a.log) as fh:
            rows, blocks = parse(fh)
    except OSError as e:
        sys.stderr.write("ab_json: cannot read %s: %s\n" % (a.log, e.strerror))
        return 2
    if not blocks:
        sys.stderr.write("ab_json: %s has no '== env|base|new|flags ... (run i)' block: not an ab.sh log\n" % a.log)
        return 1
    empty = ["%s '%s' (run %d)" % (b[0], b[1], b[2]) for b in blocks if b[3] == 0]
    if empty:
        sys.stderr.write("ab_json: %s: no bench row in %s (did that run fail?)\n" % (a.log, ", ".join(empty)))
        return 1
    rec = {"bench": a.bench, "date": a.date, "device": a.device, "git_commit": a.commit, "command": a.command,
           "reading": a.reading, "rows": rows}
    text = json.dumps(rec, indent=1) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
        table(rows, sys.stderr)
    else:
        with open(a.out, "w") as fh:
            fh.write(text)
        table(rows, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
