#!/usr/bin/env python3
# ncu_timeline.py — per-kernel durations of one Pi0.5 call, from Nsight Compute's raw CSV
# (`ncu --metrics gpu__time_duration.sum --csv --page raw ...`, scripts/gpu-check.sh pi05prof).
#
#   ncu_timeline.py CSV [--from REGEX] [--all] [--stages REGEX,REGEX,...] [--first N]
#
# --from: ignore the kernels before the first whose name matches (load-time repacking, etc.;
#         default k_im2patch, the first kernel of a call), and from its next match on (a later
#         call: `nib run` may run more than one) unless --all is given. --stages: names whose first
#         occurrence starts a new stage (default: k_embed, the text embedding after vision, and
#         the first k_gemm_lowbit or k_expert, the first expert step), so the totals are split
#         into vision / prefix / expert. --first: also list the first N kernels in order.
#         --list STAGE:N: also list the first N kernels of stage STAGE (vision, prefix, expert).
# ncu serializes kernels (no overlap, no programmatic dependent launch), so the sums are larger
# than the graph's stage times; the shares are what this is for.
import csv
import re
import sys
from collections import OrderedDict


def short(name):
    n = re.sub(r'^void ', '', name)
    n = n.split('(')[0]
    depth, out = 0, ''
    for ch in n:  # drop template arguments
        if ch == '<':
            depth += 1
        elif ch == '>':
            depth -= 1
        elif depth == 0:
            out += ch
    return out.split('::')[-1] or name[:60]


def main():
    args = sys.argv[1:]
    if not args or args[0] in ('-h', '--help'):
        for line in open(__file__).read().split('\n')[1:]:
            if not line.startswith('#'):
                break
            print(line[2:])
        sys.exit(0 if args else 2)
    path, start_re, stage_res, first, keep_all = args[0], 'k_im2patch', ['k_embed', 'k_gemm_lowbit|k_expert'], 0, False
    lists = []
    i = 1
    while i < len(args):
        if args[i] == '--all':
            keep_all = True; i += 1
        elif args[i] == '--from':
            start_re = args[i + 1]; i += 2
        elif args[i] == '--stages':
            stage_res = args[i + 1].split(','); i += 2
        elif args[i] == '--first':
            first = int(args[i + 1]); i += 2
        elif args[i] == '--list':
            st, n = args[i + 1].split(':'); lists.append((st, int(n))); i += 2
        else:
            sys.exit('ncu_timeline.py: unknown argument ' + args[i])
    rows = list(csv.reader(l for l in open(path, errors='replace') if not l.startswith('==')))
    hdr = next((r for r in rows if 'Kernel Name' in r and 'gpu__time_duration.sum' in r), None)
    if hdr is None:
        sys.exit('ncu_timeline.py: no "Kernel Name" / gpu__time_duration.sum columns in ' + path)
    at = rows.index(hdr)
    kn, tm = hdr.index('Kernel Name'), hdr.index('gpu__time_duration.sum')
    gs = hdr.index('Grid Size') if 'Grid Size' in hdr else None
    unit = rows[at + 1][tm] if at + 1 < len(rows) else ''
    scale = {'nsecond': 1e-3, 'usecond': 1.0, 'msecond': 1e3, 'second': 1e6}.get(unit)
    data = rows[at + 1:] if scale is None else rows[at + 2:]
    if scale is None:
        scale = 1e-3  # ncu's default unit for this metric
    ks = []
    for r in data:
        if len(r) <= max(kn, tm):
            continue
        try:
            us = float(r[tm].replace(',', '')) * scale
        except ValueError:
            continue
        ks.append((short(r[kn]), r[gs] if gs is not None else '', us))
    s0 = next((i for i, k in enumerate(ks) if re.search(start_re, k[0])), None)
    if s0 is None:
        sys.exit('ncu_timeline.py: no kernel matches --from %r (%d kernels)' % (start_re, len(ks)))
    s1 = None if keep_all else next((i for i in range(s0 + 1, len(ks)) if re.search(start_re, ks[i][0])), None)
    later = len(ks) - s1 if s1 is not None else 0
    ks = ks[s0:s1]
    stages, cur, names = [], OrderedDict(), ['vision', 'prefix', 'expert'] + ['stage%d' % i for i in range(3, 9)]
    si, seq = 0, [[]]
    for name, grid, us in ks:
        if si < len(stage_res) and re.search(stage_res[si], name):
            stages.append(cur); cur = OrderedDict(); si += 1; seq.append([])
        seq[-1].append((name, grid, us))
        c = cur.setdefault(name, [0, 0.0])
        c[0] += 1
        c[1] += us
    stages.append(cur)
    total = sum(k[2] for k in ks)
    print('%d kernels, %.1f us (serialized, from the first %s%s)' %
          (len(ks), total, start_re, '; %d kernels from its next match on not counted' % later if later else ''))
    for i, st in enumerate(stages):
        t = sum(v[1] for v in st.values())
        print('\n%-8s %6d kernels %10.1f us' % (names[i], sum(v[0] for v in st.values()), t))
        for name, (n, us) in sorted(st.items(), key=lambda kv: -kv[1][1]):
            print('  %-34s %6d x %8.2f us = %9.1f us  %5.1f %%' % (name[:34], n, us / n, us, 100 * us / t if t else 0))
    for st, n in lists:
        if st not in names or names.index(st) >= len(seq):
            sys.exit('ncu_timeline.py: --list: no stage %r' % st)
        print('\nfirst %d kernels of %s:' % (n, st))
        for name, grid, us in seq[names.index(st)][:n]:
            print('  %-34s %-16s %8.2f us' % (name[:34], grid, us))
    if first:
        print('\nfirst %d kernels:' % first)
        for name, grid, us in ks[:first]:
            print('  %-34s %-16s %8.2f us' % (name[:34], grid, us))


if __name__ == '__main__':
    main()
