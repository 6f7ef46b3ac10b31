"""sass_mix.py PTXAS_LOG SASS KERNEL [SCORE] — what tools/gpu/sass.sh prints (see there)."""
import collections
import re
import sys

log, sass, want = sys.argv[1], sys.argv[2], sys.argv[3]
score = sys.argv[4] if len(sys.argv) > 4 else 'dot'

# registers and spills per bf16 mma kernel, from ptxas's --resource-usage lines
print(f'bf16 mma.sync kernels (score {score}): registers, spill stores / loads in bytes')
name = spill = None
for line in open(log):
    m = re.search(r"Compiling entry function '(\S+)'", line)
    if m:
        name = m.group(1)
        continue
    m = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', line)
    if m and name:
        spill = m.group(1) + ' / ' + m.group(2)
    m = re.search(r'Used (\d+) registers', line)
    if m and name:
        k = re.search(r'(m(?:fwd|bwq|bwk)_kernel)I13__nv_bfloat16NS_\d+S_' + score + r'E(?:Li(\d+)E)?', name)
        if k:
            print(f'  {k.group(1):12s} width {k.group(2) or "64":4s} {m.group(1):>4s} registers, spills {spill}')
        name = None

# the kernel's function in the SASS listing: the first whose name matches (bf16, width 64 first)
funcs, cur = {}, None
for line in open(sass):
    m = re.search(r'Function : (\S+)', line)
    if m:
        cur = m.group(1)
        funcs[cur] = []
        continue
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', line)
    if m and cur:
        funcs[cur].append((int(m.group(1), 16), m.group(2)))
names = [n for n in funcs if re.search(want, n) and '13__nv_bfloat16' in n]
names.sort(key=lambda n: ('Li64E' not in n, n))
if not names:
    sys.exit(f'sass_mix.py: no bf16 function matches {want!r}')
fn = names[0]
ins = funcs[fn]


def op(text):
    t = text.split()
    return (t[1] if t[0].startswith('@') else t[0]).split('.')[0]


hmma = [a for a, t in ins if op(t) == 'HMMA']
if not hmma:
    sys.exit(f'sass_mix.py: {fn} has no HMMA')
# the main loop: from the latest target of a backward branch that jumps from past the last HMMA to
# before the first, to the last such branch (the HMMAs alone when there is none)
back = []
for a, t in ins:
    m = re.search(r'BRA.*0x([0-9a-f]+)', t)
    if op(t) == 'BRA' and m and a > max(hmma) and int(m.group(1), 16) <= min(hmma):
        back.append((int(m.group(1), 16), a))
lo = max(to for to, _ in back) if back else min(hmma)
hi = max(a for _, a in back) if back else max(hmma)
body = [(a, t) for a, t in ins if lo <= a <= hi]
mix = collections.Counter(op(t) for a, t in body)
print(f'\n{fn}\n  {len(ins)} instructions; main loop {lo:#x}..{hi:#x}: {len(body)} (static, every path)')
print('  ' + ', '.join(f'{k} {v}' for k, v in mix.most_common(24)))
print('  HMMA in order (destination, A, B, C):')
for a, t in body:
    if op(t) == 'HMMA':
        print(f'    {a:#07x} {t}')
