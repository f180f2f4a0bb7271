#!/usr/bin/env python3
# sass_blocks.py — used by scripts/sass.sh: instruction count of one kernel in an nvdisasm listing
# and the opcode mix of its blocks with the most HMMA instructions (the main loops), with each
# block's instructions per issue pipe. The pipes follow Nsight Compute's names for sm_80/sm_90:
# alu (integer and logic: LOP3, SHF, LEA, PRMT, ISETP, ...; 16 lanes per scheduler, so one warp
# instruction per two cycles), fma (FFMA / FMUL / FADD and every IMAD form, ptxas's shifts and
# moves on the FMA pipe included), f16x2 (HMUL2 / HFMA2 / HADD2: whose pipe on Hopper is not
# established here), tensor, mem (shared / global / async copies), uniform (U*, R2UR, S2UR) and
# ctl (branches, barriers, the rest). (A loop whose alu count is more than half its instructions
# would be bound by the ALU pipe before issue; the fifty-second session found that reading did not
# predict the M = 1 GEMM's timings: docs/design.md.) The first line also counts R2UR and waterfall
# loops (BRA.U.ANY: operands moved to uniform registers one distinct value at a time, e.g. for a
# bulk copy or TMA whose addresses the compiler cannot prove warp-uniform).
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
allins = [i for b in blocks for i in b[1]]
nr2ur = sum(1 for i in allins if 'R2UR' in i.split()[0] or (i.startswith('@') and 'R2UR' in i.split()[1]))
nwf = sum(1 for i in allins if 'BRA.U.ANY' in i)
print(fn, 'instructions', tot, 'blocks', len(blocks), 'R2UR', nr2ur, 'waterfall_loops', nwf)
def op(s):
    t = s.split()
    if t[0].startswith('@'): t = t[1:]
    return t[0].split('.')[0]
best = sorted(blocks, key=lambda b: -sum(1 for s in b[1] if 'HMMA' in s))[:int(sys.argv[3]) if len(sys.argv)>3 else 2]
ALU = {'LOP3', 'LOP', 'SHF', 'SHL', 'SHR', 'LEA', 'PRMT', 'ISETP', 'FSETP', 'HSETP2', 'SEL', 'FSEL', 'IADD3',
       'VIMNMX', 'IMNMX', 'FMNMX', 'PLOP3', 'P2R', 'R2P', 'FLO', 'POPC', 'BREV', 'BMSK', 'MOV', 'I2IP', 'F2FP',
       'IABS', 'CS2R'}
FMA = {'FFMA', 'FMUL', 'FADD', 'IMAD', 'IDP', 'VIADD', 'FCHK'}
F16 = {'HMUL2', 'HFMA2', 'HADD2'}
TENSOR = {'HMMA', 'IMMA', 'HGMMA', 'IGMMA', 'QGMMA', 'WARPGROUP'}
MEM = {'LDS', 'LDSM', 'STS', 'LDG', 'STG', 'LD', 'ST', 'LDGSTS', 'LDGDEPBAR', 'ATOMS', 'ATOM', 'ATOMG', 'RED',
       'UBLKCP', 'UTMALDG', 'UTMASTG', 'CCTL', 'LDC', 'SHFL', 'STSM'}
def pipe(o):
    if o in ALU: return 'alu'
    if o in FMA: return 'fma'
    if o in F16: return 'f16x2'
    if o in TENSOR: return 'tensor'
    if o in MEM: return 'mem'
    if o.startswith('U') or o in ('R2UR', 'S2UR'): return 'uniform'
    return 'ctl'
for name, ins in best:
    c = Counter(op(s) for s in ins)
    print(' block', name, len(ins), 'instr:', ', '.join(f'{k} {v}' for k, v in c.most_common(14)))
    pc = Counter(pipe(op(s)) for s in ins)
    print('   pipes:', ', '.join(f'{k} {pc[k]}' for k in ('alu', 'fma', 'f16x2', 'tensor', 'mem', 'uniform', 'ctl') if pc[k]))
