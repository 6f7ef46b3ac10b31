-- experiments/perf/bleu_conformance.lua — our corpus BLEU and chrF (core/text/bleu.c,
-- penumbra.text.bleu, `./bench bleu`) against PyPI sacreBLEU on real corpora. Not run by CI.
--
--   ./bench experiments/perf/bleu_conformance.lua [cli=1] [keep=0] [runs=run1.h5,run2.h5]
--   runs=: NMT run files whose beam-5 test translations (/text/test_hyps) join the systems
--
-- References: multi30k_de_en/{valid,test}.en and iwslt14_de_en/{valid,test}.en (found on the
-- dataset search path). "Systems" are built from real text: the tokenised lowercased
-- multi30k_de_en/tok/*.en (against the raw references), the German side, the reference with
-- words dropped / neighbours swapped / cut to 60 % (deterministic LCG), the lines rotated by
-- one, the first letter upper-cased, the reference itself; plus one two-reference pair per
-- corpus and a synthetic file of 13a corner cases (entities, numbers, dashes, Unicode
-- whitespace, <skipped>). For every pair: both BLEU and chrF scores and their difference,
-- whether sacreBLEU's printed line is the same text, and whether the 13a tokenisation of every
-- line of every file equals sacreBLEU's Tokenizer13a. With cli=1 (default) `./bench bleu REF
-- HYP` is run for each single-reference pair and its line compared too. Fails (exit 1) when
-- any |ours − sacreBLEU| > 0.01, a line differs or a tokenisation differs.
--
-- The peer: experiments/perf/bleu_conformance_sacrebleu.py under a Python with sacrebleu,
-- found by penumbra.benchkit (PENUMBRA_PEER_PYTHON, build/venv-peers, /usr/bin/python3):
--   python3 -m venv build/venv-peers && build/venv-peers/bin/pip install sacrebleu
local bk = require 'penumbra.benchkit'
local data = require 'penumbra.data'
local B = require 'penumbra.text.bleu'

args = args or {}
local use_cli = (args.cli or '1') ~= '0'
local keep = (args.keep or '0') ~= '0'
local home = os.getenv('PENUMBRA_HOME') or '.'
local here = (arg and arg[0] or 'experiments/perf/bleu_conformance.lua'):match('^(.*)/[^/]*$') or '.'

local py, info = bk.python('sacrebleu')
if not py then
  io.stderr:write('bleu_conformance: ' .. info .. '\n')
  os.exit(1)
end

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local tmp = os.tmpname()
os.remove(tmp)
os.execute('mkdir -p ' .. sh_quote(tmp))

local function write_lines(path, lines)
  local f = assert(io.open(path, 'wb'))
  for _, l in ipairs(lines) do f:write(l, '\n') end
  f:close()
end

-- ---- deterministic system outputs --------------------------------------------------------------
local function lcg(seed)
  local s = seed
  return function(k)
    s = (s * 1103515245 + 12345) % 2147483648
    return math.floor(s / 65536) % k
  end
end
local function words(l)
  local w = {}
  for x in l:gmatch('%S+') do w[#w + 1] = x end
  return w
end
local function map_lines(lines, fn)
  local out = {}
  for i, l in ipairs(lines) do out[i] = fn(l, i) end
  return out
end
local function drop(lines, seed)
  local r = lcg(seed)
  return map_lines(lines, function(l)
    local keep_w = {}
    for _, w in ipairs(words(l)) do if r(5) ~= 0 then keep_w[#keep_w + 1] = w end end
    return table.concat(keep_w, ' ')
  end)
end
local function swap(lines, seed)
  local r = lcg(seed)
  return map_lines(lines, function(l)
    local w = words(l)
    local i = 1
    while i < #w do
      if r(3) == 0 then w[i], w[i + 1] = w[i + 1], w[i]; i = i + 2 else i = i + 1 end
    end
    return table.concat(w, ' ')
  end)
end
local function truncate(lines)
  return map_lines(lines, function(l)
    local w = words(l)
    return table.concat(w, ' ', 1, math.floor(#w * 0.6))
  end)
end
local function rotate(lines)
  return map_lines(lines, function(_, i) return lines[i % #lines + 1] end)
end
local function upper_first(lines)
  return map_lines(lines, function(l) return (l:gsub('^%l', string.upper)) end)
end

-- 13a corner cases: real-looking lines with the characters the rules treat specially
local function synthetic(n, seed)
  local r = lcg(seed)
  local atoms = { 'the', 'cat', 'U.S.', 'e.g.', '3.14', '1,000', '$5', '5-3', '1990-2000', 'well-known', '--',
                  "don't", '&quot;', '&amp;', '&lt;', '&gt;', '&amp;quot;', '&apos;', '<skipped>', '(a/b)', '[x]',
                  'x,y', '.5', '5.', 'end.', 'a,1', '...', '!?', '@home', '#tag', '~', '|', '\\', '^', '`', '{', '}',
                  'é', 'Ωmega', '中文', '\194\160', '\226\128\137', '\227\128\128', '\226\128\139', '\194\133', '\t',
                  '\28', '\r', 'naïve', 'x-\t', '😀.', '.😀', ',é', 'é,' }
  local out = {}
  for i = 1, n do
    local parts = {}
    for k = 1, 1 + r(18) do parts[k] = atoms[r(#atoms) + 1] end
    local sep = r(4) == 0 and '' or ' '
    out[i] = table.concat(parts, sep)
  end
  return out
end

-- ---- the pairs ------------------------------------------------------------------------------------
local pairs_list, files = {}, {}
local function file_of(name, lines)
  local path = tmp .. '/' .. name
  write_lines(path, lines)
  return path
end
local function add(name, hyp, refs) pairs_list[#pairs_list + 1] = { name = name, hyp = hyp, refs = refs } end

for _, split in ipairs({ 'valid', 'test' }) do
  local ref = data.find('multi30k_de_en/' .. split .. '.en')
  local R = B.read_lines(ref)
  local tag = 'm30k-' .. split
  add(tag .. ' tok-lc', data.find('multi30k_de_en/tok/' .. split .. '.en'), { ref })
  add(tag .. ' german', data.find('multi30k_de_en/' .. split .. '.de'), { ref })
  add(tag .. ' drop', file_of(tag .. '.drop', drop(R, 1)), { ref })
  add(tag .. ' swap', file_of(tag .. '.swap', swap(R, 2)), { ref })
  add(tag .. ' trunc', file_of(tag .. '.trunc', truncate(R)), { ref })
  add(tag .. ' rotate', file_of(tag .. '.rotate', rotate(R)), { ref })
  add(tag .. ' identity', ref, { ref })
  add(tag .. ' drop/2refs', tmp .. '/' .. tag .. '.drop', { ref, data.find('multi30k_de_en/tok/' .. split .. '.en') })
end
for _, split in ipairs({ 'valid', 'test' }) do
  local ref = data.find('iwslt14_de_en/' .. split .. '.en')
  local R = B.read_lines(ref)
  local tag = 'iwslt-' .. split
  add(tag .. ' german', data.find('iwslt14_de_en/' .. split .. '.de'), { ref })
  add(tag .. ' drop', file_of(tag .. '.drop', drop(R, 3)), { ref })
  add(tag .. ' swap', file_of(tag .. '.swap', swap(R, 4)), { ref })
  add(tag .. ' trunc', file_of(tag .. '.trunc', truncate(R)), { ref })
  add(tag .. ' rotate', file_of(tag .. '.rotate', rotate(R)), { ref })
  add(tag .. ' upper', file_of(tag .. '.upper', upper_first(R)), { ref })
  add(tag .. ' swap/2refs', tmp .. '/' .. tag .. '.swap', { ref, tmp .. '/' .. tag .. '.drop' })
end
do
  local S1, S2 = synthetic(3000, 11), synthetic(3000, 12)
  local h = map_lines(S1, function(l, i) return i % 3 == 0 and S2[i] or l end)
  add('synthetic-13a', file_of('syn.hyp', h), { file_of('syn.ref', S2) })
  add('synthetic-13a/2refs', tmp .. '/syn.hyp', { tmp .. '/syn.ref', file_of('syn.ref2', S1) })
  add('synthetic drop/2refs', file_of('syn.drop', drop(S1, 5)), { tmp .. '/syn.ref', tmp .. '/syn.ref2' })
end

-- real system outputs: the beam-5 test translations (/text/test_hyps) of NMT run files,
-- runs=a.h5,b.h5 (every line of Multi30k test2016 against its raw reference)
for path in (args.runs or ''):gmatch('[^,]+') do
  local ok, text = pcall(function()
    local r = require('penumbra.runs').open(path)
    local t = r:read_text('text/test_hyps')
    if r.close then r:close() end
    return t
  end)
  if not ok then error('bleu_conformance: ' .. path .. ' has no /text/test_hyps (an NMT run file?): ' .. tostring(text), 0) end
  local name = path:match('([^/]+)%.h5$') or path
  local hyp = tmp .. '/run-' .. name .. '.hyp'
  local fh = assert(io.open(hyp, 'wb'))
  fh:write(text)
  fh:close()
  add('m30k-test system ' .. (path:match('runs/([^/]+)/') or name), hyp, { data.find('multi30k_de_en/test.en') })
end

-- ---- sacreBLEU ------------------------------------------------------------------------------------
bk.header('BLEU / chrF conformance: penumbra vs sacreBLEU', { 'peer: ' .. py .. ' (' .. info .. ')' })
local manifest = tmp .. '/manifest.tsv'
do
  local f = assert(io.open(manifest, 'wb'))
  for _, p in ipairs(pairs_list) do f:write(p.name, '\t', p.hyp, '\t', table.concat(p.refs, '\t'), '\n') end
  f:close()
end
local t0 = bk.now()
local proc = io.popen(string.format('%s %s %s %s', sh_quote(py), sh_quote(here .. '/bleu_conformance_sacrebleu.py'),
  sh_quote(manifest), sh_quote(tmp .. '/tok')))
local peer, peer_head = {}, nil
for l in proc:lines() do
  if l:sub(1, 1) == '#' then peer_head = l
  else
    local f = {}
    for x in (l .. '\t'):gmatch('([^\t]*)\t') do f[#f + 1] = x end
    peer[f[1]] = { bleu = tonumber(f[2]), chrf = tonumber(f[3]), line = f[4], cline = f[5], counts = f[6], totals = f[7] }
  end
end
local ok_peer = proc:close()
local t_peer = bk.now() - t0
print((peer_head or '# (no version line)') .. string.format('   sacreBLEU took %.1f s', t_peer))

-- ---- ours, and the comparison ----------------------------------------------------------------------
local failures, max_b, max_c = {}, 0, 0
local t_ours = 0
print(string.format('%-22s %9s %9s %9s  %9s %9s %9s  %s', 'pair', 'BLEU', 'sacre', '|diff|', 'chrF', 'sacre', '|diff|',
  'line'))
local read_cache = {}
local function lines_of(path)
  if not read_cache[path] then read_cache[path] = B.read_lines(path) end
  return read_cache[path]
end
for _, p in ipairs(pairs_list) do
  local q = peer[p.name]
  if not q then
    failures[#failures + 1] = p.name .. ': sacreBLEU gave no result'
  else
    local h = lines_of(p.hyp)
    local refs = {}
    for i, r in ipairs(p.refs) do refs[i] = lines_of(r) end
    local t1 = bk.now()
    local b = B.bleu(h, refs)
    local c = B.chrf(h, refs)
    t_ours = t_ours + (bk.now() - t1)
    local db, dc = math.abs(b.score - q.bleu), math.abs(c.score - q.chrf)
    max_b, max_c = math.max(max_b, db), math.max(max_c, dc)
    local same = b.line == q.line and c.line == q.cline and table.concat(b.counts, ',') == q.counts and
                 table.concat(b.totals, ',') == q.totals
    print(string.format('%-22s %9.4f %9.4f %9.2e  %9.4f %9.4f %9.2e  %s', p.name, b.score, q.bleu, db, c.score, q.chrf, dc,
      same and 'same' or 'DIFFERS'))
    if not same then
      failures[#failures + 1] = string.format('%s:\n  ours  %s | %s | %s | %s\n  sacre %s | %s | %s | %s', p.name, b.line,
        c.line, table.concat(b.counts, ','), table.concat(b.totals, ','), q.line, q.cline, q.counts, q.totals)
    end
    if db > 0.01 or dc > 0.01 then
      failures[#failures + 1] = string.format('%s: |BLEU diff| %.3g, |chrF diff| %.3g > 0.01', p.name, db, dc)
    end
    if use_cli and #p.refs == 1 then
      local pr = io.popen(string.format('%s/bench bleu %s %s 2>/dev/null', sh_quote(home), sh_quote(p.refs[1]), sh_quote(p.hyp)))
      local out = pr:read('*a'):gsub('\n$', '')
      pr:close()
      if out ~= q.line then failures[#failures + 1] = string.format('%s: ./bench bleu printed %q, sacreBLEU %q', p.name, out, q.line) end
    end
  end
end

-- the 13a tokenisation of every line of every file, in the order the helper numbered them
local order, seen = {}, {}
local unpack = table.unpack or unpack
for _, p in ipairs(pairs_list) do
  for _, path in ipairs({ p.hyp, unpack(p.refs) }) do
    if not seen[path] then seen[path] = true; order[#order + 1] = path end
  end
end
local tok_lines, tok_bad = 0, 0
for k, path in ipairs(order) do
  local theirs = B.read_lines(string.format('%s/tok/tok%d.txt', tmp, k))
  local mine = lines_of(path)
  if #theirs ~= #mine then
    failures[#failures + 1] = string.format('%s: sacreBLEU tokenised %d lines, we read %d', path, #theirs, #mine)
  else
    for i, l in ipairs(mine) do
      tok_lines = tok_lines + 1
      local t = B.tokenize_13a(l)
      if t ~= theirs[i] then
        tok_bad = tok_bad + 1
        if tok_bad <= 5 then
          failures[#failures + 1] = string.format('%s line %d: 13a ours %q, sacreBLEU %q (line %q)', path, i, t, theirs[i], l)
        end
      end
    end
  end
end

print(string.format('\n%d pairs, %d files; max |ours - sacreBLEU|: BLEU %.3g, chrF %.3g; 13a tokenisation: %d of %d ' ..
  'lines differ', #pairs_list, #order, max_b, max_c, tok_bad, tok_lines))
print(string.format('time: ours %.2f s for all BLEU+chrF scores (in process); sacreBLEU %.1f s (a child process, ' ..
  'including its start and the tokenised dumps)', t_ours, t_peer))
if not keep then os.execute('rm -rf ' .. sh_quote(tmp)) else print('files kept in ' .. tmp) end
if not ok_peer and #failures == 0 then failures[1] = 'the sacreBLEU helper failed' end
if #failures > 0 then
  io.stderr:write('\nFAILED: ' .. #failures .. ' problem(s)\n' .. table.concat(failures, '\n') .. '\n')
  os.exit(1)
end
print('OK: every score within 0.01 of sacreBLEU (and every printed line identical)')
