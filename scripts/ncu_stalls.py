#!/usr/bin/env python3
# ncu_stalls.py — where a kernel's warps wait, from Nsight Compute's raw CSV (`ncu --section
# WarpStateStats [--section InstructionStats] --page raw --csv ...`; scripts/gpu-check.sh attnprof).
#
#   ncu_stalls.py CSV [CSV ...] [--kernel REGEX] [--top N]
#
# One block per profiled launch (the kernels whose names match --kernel, default all): duration
# when collected, issued instructions per cycle per scheduler when collected, and the stall reasons
# as cycles per issued instruction (smsp__average_warps_issue_stalled_<reason>_per_issue_active),
# largest first, with their share of the sum. The sum is the average number of cycles between two
# instructions of a warp (about Nsight Compute's "Warp Cycles Per Issued Instruction"). Reading it:
# long_scoreboard = waiting for global / local memory; wait = fixed-latency dependencies; barrier =
# __syncthreads / named barriers; short_scoreboard = shared memory, MUFU; math_pipe_throttle / mio_throttle
# = a pipe or the memory-instruction queue is full; selected = the cycle the instruction issued.
import csv
import re
import sys

STALL = re.compile(r'^smsp__average_warps_issue_stalled_(.+)_per_issue_active\.ratio$')


def read_rows(path):
    with open(path, newline='') as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f'ncu_stalls.py: {path}: no Nsight Compute CSV header ("ID", ...) found')
    rows = list(csv.reader(lines[start:]))
    hdr = rows[0]
    data = rows[1:]
    if data and data[0] and data[0][0] == '':  # the units row of --page raw
        data = data[1:]
    return hdr, data


def num(s):
    try:
        return float(s.replace(',', ''))
    except (ValueError, AttributeError):
        return None


def main(argv):
    paths, kern, top = [], None, 12
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == '--kernel' and i + 1 < len(argv):
            kern = re.compile(argv[i + 1])
            i += 2
            continue
        if a == '--top' and i + 1 < len(argv):
            top = int(argv[i + 1])
            i += 2
            continue
        if a.startswith('-'):
            raise SystemExit(f'ncu_stalls.py: unknown option {a} (usage: CSV [CSV ...] [--kernel REGEX] [--top N])')
        paths.append(a)
        i += 1
    if not paths:
        raise SystemExit('usage: ncu_stalls.py CSV [CSV ...] [--kernel REGEX] [--top N]')
    shown = 0
    for path in paths:
        hdr, data = read_rows(path)
        col = {h: j for j, h in enumerate(hdr)}
        stalls = [(m.group(1), j) for h, j in col.items() for m in [STALL.match(h)] if m]
        if not stalls:
            raise SystemExit(f'ncu_stalls.py: {path}: no stall-reason columns (collect --section WarpStateStats --page raw)')
        for r in data:
            name = r[col['Kernel Name']] if 'Kernel Name' in col else '?'
            if kern and not kern.search(name):
                continue
            vals = sorted(((n, num(r[j]) or 0.0) for n, j in stalls), key=lambda x: -x[1])
            total = sum(v for _, v in vals)
            dur = num(r[col['gpu__time_duration.sum']]) if 'gpu__time_duration.sum' in col else None
            ipc = num(r[col['smsp__issue_active.avg.per_cycle_active']]) if 'smsp__issue_active.avg.per_cycle_active' in col else None
            head = f'{path}: {name[:90]}'
            if dur is not None:
                head += f'  {dur / 1e3:.2f} us'
            if ipc is not None:
                head += f'  {ipc:.2f} issued / cycle / scheduler'
            print(head)
            print(f'  {total:.2f} cycles between a warp\'s instructions:')
            for n, v in vals[:top]:
                if v <= 0:
                    break
                print(f'    {n:22s} {v:6.2f}  {100 * v / total if total else 0:5.1f} %')
            shown += 1
    if not shown:
        raise SystemExit('ncu_stalls.py: no kernel matched')


if __name__ == '__main__':
    main(sys.argv[1:])
