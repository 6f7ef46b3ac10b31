-- experiments/perf/attention_cpu.lua — fused distance-family attention on the CPU against
-- the straightforward PyTorch implementation (full score matrix, softmax, @ v) (DESIGN §7).
--
--   ./bench experiments/perf/attention_cpu.lua [n=1024,2048] [reps=5] [rounds=1] [threads=2]
--                                              [peak=16384] [torch=1] [torch_peak=2048,4096]
--
-- B = 1, H = 8, D = 64, f32; scores dot, laplacian, umbral, penumbral, hyperbolic (the
-- hyperboloid model); passes fwd and fwd+bwd (backward of sum(out·1)). Each figure: warm-up,
-- then the median over `rounds` rounds of `reps` timed calls (ours: every score and pass in
-- turn, call by call), ours and PyTorch taking turns round by round (PyTorch runs in the peer Python (bk.python), experiments/perf/attention_cpu_torch.py,
-- with the same thread count). GFLOP/s with the FlashAttention convention: forward
-- 4·B·N²·H·D, backward 2.5× that. Targets: dot ≤ 0.5× PyTorch, cones ≤ 1.3× our dot,
-- hyperbolic ≤ 1.5× our dot.
-- Peak memory: the growth of the process's resident high-water mark (/proc/self/status,
-- reset through /proc/self/clear_refs) over the inputs during one call, each measured in a
-- fresh child process. PyTorch's N² score matrices do not fit this machine at N = 16384
-- (8.6 GB each), so its peak is measured at the smaller torch_peak sizes and extrapolated ∝ N².
local pn = require 'penumbra'
local bk = require 'penumbra.benchkit'

args = args or {}
local list, now, median = bk.list, bk.now, bk.median

local B_, H, D = 1, 8, 64
local SCORES = { 'dot', 'laplacian', 'umbral', 'penumbral', 'hyperbolic' }
local PASSES = { 'fwd', 'fwd+bwd' }
local here = (arg and arg[0] or 'experiments/perf/attention_cpu.lua'):match('^(.*)/[^/]*$') or '.'

-- same recipes as attention_cpu_torch.py
local function inputs(score, N)
  pn.manual_seed(1)
  local q = pn.randn({ B_, H, N, D }) * 0.3
  local k = pn.randn({ B_, H, N, D }) * 0.3
  local v = pn.randn({ B_, H, N, D })
  if score == 'umbral' or score == 'penumbral' or score == 'hyperbolic' then
    q, k = q:abs() + 0.1, k:abs() + 0.1
  end
  if score == 'hyperbolic' then -- on the hyperboloid, time-like coordinate last
    local function lift(x)
      local head = x:narrow(-1, 1, D - 1)
      return pn.cat({ head, ((head * head):sum(-1, true) + 1):sqrt() }, -1):contiguous()
    end
    q, k = lift(q), lift(k)
  end
  return q:detach(), k:detach(), v:detach()
end

local function one(score, pas, q, k, v)
  local opts = { score = score }
  if pas == 'fwd' then
    pn.no_grad(function() return pn.attention(q, k, v, opts) end)
  else
    local o = pn.attention(q, k, v, opts)
    o:backward(pn.ones(o:shape()))
    q:zero_grad(); k:zero_grad(); v:zero_grad()
  end
end

local rss = bk.rss

-- ---- child mode: the peak memory of one call in a fresh process --------------------------------
if args.mode == 'peak' then
  local score, pas, N = args.score, args.pass, tonumber(args.n)
  local q, k, v = inputs(score, N)
  if pas == 'fwd+bwd' then q:requires_grad_(); k:requires_grad_(); v:requires_grad_() end
  local base = rss().VmRSS
  local f = io.open('/proc/self/clear_refs', 'w')
  f:write('5')
  f:close()
  local opts = { score = score }
  if pas == 'fwd' then
    pn.no_grad(function() return pn.attention(q, k, v, opts) end)
  else
    local o = pn.attention(q, k, v, opts)
    o:backward(pn.ones(o:shape()))
  end
  print(string.format('peak %d', rss().VmHWM - base))
  os.exit(0)
end

-- ---- header ----------------------------------------------------------------------------------------
local threads = tonumber(args.threads) or 2
pn.set_num_threads(threads)
local Ns = list(args.n, '1024,2048')
local reps, rounds = tonumber(args.reps) or 5, tonumber(args.rounds) or 1
local py, pyinfo = bk.python('torch')
local use_torch = args.torch ~= '0' and py ~= nil
if args.torch ~= '0' and not py then print('peer: ' .. pyinfo) end
bk.header('penumbra fused attention vs PyTorch naive (CPU)', {
  string.format('threads: %d for both (ours OpenMP, torch.set_num_threads)', threads),
  string.format('B=%d H=%d D=%d f32; median of %d rounds × %d calls after warm-up; GFLOP/s: fwd 4·B·N²·H·D, bwd 2.5×',
    B_, H, D, rounds, reps) })

-- ---- timings --------------------------------------------------------------------------------------
local function torch_round(N)
  local cmd = string.format('%s %s/attention_cpu_torch.py --threads %d --n %d --reps %d --warmup 1 2>&1',
    py, here, threads, N, reps)
  local p = io.popen(cmd)
  local res = {}
  for line in p:lines() do
    local sc, n, pas, med = line:match('^time (%S+) (%d+) (%S+) ([%d%.]+)')
    if sc then res[sc .. ' ' .. pas] = tonumber(med) / 1e3
    elseif not line:match('^%s*$') then io.stderr:write('torch: ' .. line .. '\n') end
  end
  p:close()
  return res
end

local rows = {}
for _, N in ipairs(Ns) do
  local ours, theirs = {}, {}
  local data = {}
  for _, score in ipairs(SCORES) do data[score] = { inputs(score, N) } end
  -- one call of every (score, pass) in turn, so a burst of load on the machine hits all of
  -- them alike (the ratios between our scores are what the targets are about)
  local function call(score, pas)
    local q, k, v = unpack(data[score])
    if pas == 'fwd+bwd' then q:requires_grad_(); k:requires_grad_(); v:requires_grad_() end
    local t0 = now()
    one(score, pas, q, k, v)
    local dt = now() - t0
    q:requires_grad_(false); k:requires_grad_(false); v:requires_grad_(false)
    return dt
  end
  for _, score in ipairs(SCORES) do for _, pas in ipairs(PASSES) do call(score, pas) end end -- warm-up
  for round = 1, rounds do
    for _ = 1, reps do
      for _, score in ipairs(SCORES) do
        for _, pas in ipairs(PASSES) do
          local key = score .. ' ' .. pas
          ours[key] = ours[key] or {}
          table.insert(ours[key], call(score, pas))
        end
      end
      collectgarbage('collect')
    end
    if use_torch then
      for key, t in pairs(torch_round(N)) do
        theirs[key] = theirs[key] or {}
        table.insert(theirs[key], t)
      end
    end
  end
  for _, score in ipairs(SCORES) do
    for _, pas in ipairs(PASSES) do
      local key = score .. ' ' .. pas
      rows[#rows + 1] = { score = score, N = N, pass = pas, ours = median(ours[key]),
                          torch = theirs[key] and median(theirs[key]) or nil }
    end
  end
end

local function flops(N, pas)
  local f = 4 * B_ * N * N * H * D
  return pas == 'fwd' and f or 3.5 * f
end
local dot_time = {}
for _, r in ipairs(rows) do if r.score == 'dot' then dot_time[r.N .. r.pass] = r.ours end end

print(string.format('%-11s %6s %-8s %10s %10s %8s %9s %9s %10s %s', 'score', 'N', 'pass', 'ours ms', 'torch ms',
  'ours/pt', 'GFLOP/s', 'pt GF/s', 'vs our dot', 'target'))
for _, r in ipairs(rows) do
  local vs = r.ours / dot_time[r.N .. r.pass]
  local target, ok = '', true
  if r.score == 'dot' and r.torch then target, ok = '≤ 0.5× torch', r.ours / r.torch <= 0.5
  elseif r.score == 'umbral' or r.score == 'penumbral' then target, ok = '≤ 1.3× dot', vs <= 1.3
  elseif r.score == 'hyperbolic' then target, ok = '≤ 1.5× dot', vs <= 1.5 end
  if target ~= '' then target = target .. (ok and '  ok' or '  MISSED') end
  print(string.format('%-11s %6d %-8s %10.2f %10s %8s %9.1f %9s %10.2f %s', r.score, r.N, r.pass, r.ours * 1e3,
    r.torch and string.format('%.2f', r.torch * 1e3) or '-', r.torch and string.format('%.3f', r.ours / r.torch) or '-',
    flops(r.N, r.pass) / r.ours / 1e9, r.torch and string.format('%.1f', flops(r.N, r.pass) / r.torch / 1e9) or '-',
    vs, target))
end
print()

-- ---- peak memory ------------------------------------------------------------------------------------
local peakN = tonumber(args.peak or 16384)
if peakN and peakN > 0 then
  local function child(cmd)
    local p = io.popen(cmd .. ' 2>&1')
    local out = p:read('*a')
    p:close()
    return tonumber(out:match('peak (%-?%d+)')), out
  end
  local bench = os.getenv('PENUMBRA_HOME') and (os.getenv('PENUMBRA_HOME') .. '/bench') or './bench'
  print(string.format('peak memory over the inputs during one call (q, k, v: %.1f MB each at N = %d)',
    B_ * H * peakN * D * 4 / 2 ^ 20, peakN))
  for _, pas in ipairs(PASSES) do
    for _, score in ipairs({ 'dot', 'penumbral' }) do
      local t0 = now()
      local bytes, out = child(string.format('%s %s/attention_cpu.lua mode=peak score=%s pass=%s n=%d threads=%d',
        bench, here, score, pas, peakN, threads))
      if bytes then
        print(string.format('  ours  %-10s %-8s N=%-6d %9.1f MB   (%.1f s)', score, pas, peakN, bytes / 2 ^ 20, now() - t0))
      else
        print('  ours ' .. score .. ' ' .. pas .. ': failed: ' .. out)
      end
    end
  end
  if use_torch then
    local tN = list(args.torch_peak, '2048,4096')
    local last
    for _, pas in ipairs(PASSES) do
      for _, N in ipairs(tN) do
        local bytes = child(string.format('%s %s/attention_cpu_torch.py --threads %d --n %d --peak dot:%s',
          py, here, threads, N, pas))
        if bytes then
          print(string.format('  torch %-10s %-8s N=%-6d %9.1f MB', 'dot', pas, N, bytes / 2 ^ 20))
          last = { N = N, bytes = bytes }
        end
      end
      if last then
        print(string.format('  torch %-10s %-8s N=%-6d %9.1f MB   (extrapolated ∝ N² from N=%d; one N² f32 matrix is %.1f MB)',
          'dot', pas, peakN, last.bytes * (peakN / last.N) ^ 2 / 2 ^ 20, last.N, B_ * H * peakN * peakN * 4 / 2 ^ 20))
      end
    end
  end
end
