#!/usr/bin/env python3
# sass_blocks.py — used by scripts/sass.sh: instruction count of one kernel in an nvdisasm listing
# and the opcode mix of its blocks with the most HMMA instructions (the main loops).
#   sass_blocks.py LISTING KERNEL_NAME [BLOCKS]
import sys, re
from collections import Counter
path, fn = sys.argv[1], sys.argv[2]
lines = open(path).read().split('\n')
start = [i for i,l in enumerate(lines) if l.startswith('.text.'+fn+':')][0]
end = next((i for i in range(start+1, len(lines)) if lines[i].startswith('.text.')), len(lines))
blocks = []; cur = ['entry', []]
for l in lines[start:end]:
    m = re.match(r'^\s*(\.L_x_\d+):', l)
    if m:
        blocks.append(cur); cur = [m.group(1), []]; continue
    m = re.search(r'/\*[0-9a-f]{4,}\*/\s+(.*?);', l)
    if m: cur[1].append(m.group(1).strip())
blocks.append(cur)
tot = sum(len(b[1]) for b in blocks)
print(fn, 'instructions', tot, 'blocks', len(blocks))
def op(s):
    t = s.split()
    if t[0].startswith('@'): t = t[1:]
    return t[0].split('.')[0]
best = sorted(blocks, key=lambda b: -sum(1 for s in b[1] if 'HMMA' in s))[:int(sys.argv[3]) if len(sys.argv)>3 else 2]
for name, ins in best:
    c = Counter(op(s) for s in ins)
    print(' block', name, len(ins), 'instr:', ', '.join(f'{k} {v}' for k, v in c.most_common(14)))
