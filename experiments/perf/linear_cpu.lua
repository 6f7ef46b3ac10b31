-- experiments/perf/linear_cpu.lua — linear attention on the CPU (DESIGN §3.2, issue 6).
--
--   ./bench experiments/perf/linear_cpu.lua [quick=1] [reps=N (default 7)] [torch=0]
--
-- (1) causal cosine attention (Cottention) forward + backward, f32, D = 64, H = 8, B = 1, at
--     N = 1k … 16k: median time, the ratio to the previous N (linear in N: target ≤ 2.2),
--     twice (the default allocator; then mmap off, so that page faults on fresh ≥ 32 MiB
--     tensors do not hide the kernels' scaling), and the peak extra memory of the call from
--     the process's resident-set high-water mark (/proc/self/status VmHWM, reset through
--     /proc/self/clear_refs before the call, after malloc_trim) minus the tensors the call
--     returns (by pn.live_bytes) — flat in N
--     when the kernels keep O(c·D + D²) scratch only.
-- (2) the crossover length from which causal cosine beats causal softmax dot attention
--     (pn.attention(q, k, v, {score='dot', causal=true}), the fused flash-style kernel),
--     forward + backward, same shapes.
-- (3) our causal cosine vs a chunked PyTorch implementation (experiments/perf/linear_torch.py,
--     the peer Python, the same thread count, and both at 1 thread) at N = 2048: target ratio
--     ours/torch ≤ 1.0.
-- (4) power attention p = 2 (gated): our chunked form vs our quadratic form vs PyTorch
--     chunked, D = 32, H = 8, N = 2048 (and 4096 without quick=1).
-- (5) recurrent state sizes: pn.power_state(…):bytes() for p = 2, 4 (and the cosine state).
-- Every time: warm-up, then the median of ≥ 5 calls; ours and the peer alternate in rounds.
local pn = require 'penumbra'
local B = require 'penumbra_ffi'
local ffi = require 'ffi'

args = args or {}
local quick = args.quick == '1'
local reps = math.max(5, tonumber(args.reps) or 7)
local use_torch = args.torch ~= '0'

ffi.cdef [[
  int malloc_trim(size_t pad);
  int mallopt(int param, int value);
]]
local bk = require 'penumbra.benchkit'
local now, median, time_calls = bk.now, bk.median, bk.time_calls

-- ---- memory: the resident-set high-water mark ----------------------------------------------------
local function status_kb(key)
  local f = io.open('/proc/self/status')
  if not f then return nil end
  local s = f:read('*a')
  f:close()
  return tonumber(s:match(key .. ':%s*(%d+) kB'))
end
local function reset_hwm()
  local f = io.open('/proc/self/clear_refs', 'w')
  if not f then return false end
  local ok = f:write('5')
  f:close()
  return ok ~= nil
end
local hwm_ok = status_kb('VmHWM') ~= nil and reset_hwm()

-- bytes above the resident set at the start that fn(keep) had at its peak, and the bytes of
-- the tensors fn returns (kept alive until the peak is read)
local function peak_extra(fn)
  collectgarbage('collect'); collectgarbage('collect')
  ffi.C.malloc_trim(0)
  local live0, rss0 = pn.live_bytes(), status_kb('VmRSS')
  reset_hwm()
  local keep = fn()
  local hwm = status_kb('VmHWM')
  local results = pn.live_bytes() - live0
  keep = nil
  return (hwm - rss0) * 1024, results
end

local MiB = 1024 * 1024

-- ---- header ------------------------------------------------------------------------------------------
local threads = pn.num_threads()
bk.header('penumbra linear attention benchmark (CPU)', {
  string.format('timing: wall clock, warm-up then the median of %d calls (rounds alternate ours and the peer)', reps) })

local H, D = 8, 64
local function inputs(N, d, dtype)
  pn.manual_seed(N)
  local o = { dtype = dtype or 'f32' }
  local q = pn.randn({ 1, H, N, d }, o):requires_grad_()
  local k = pn.randn({ 1, H, N, d }, o):requires_grad_()
  local v = pn.randn({ 1, H, N, d }, o):requires_grad_()
  local g = pn.randn({ 1, H, N, d }, o)
  return q, k, v, g
end
local function clear(list) for _, t in ipairs(list) do t:zero_grad() end end

-- ---- (1) cosine scaling ----------------------------------------------------------------------------
-- Tensors of 32 MiB and more (q at N = 16k) are above glibc's largest mmap threshold: each
-- is mmapped, and its pages are faulted in afresh on every call (core/alloc.c keeps smaller
-- ones in the heap). Pass 2 turns mmap off (mallopt M_MMAP_MAX = 0) so that the times show
-- the kernels' own scaling; pass 1 is the default allocator, as a user sees it.
local M_MMAP_MAX = -4
print(string.format('(1) causal cosine attention, forward + backward, f32, B = 1, H = %d, D = Dv = %d', H, D))
print('    memory (pass 1): peak extra = VmHWM − VmRSS before the call − the tensors the call returns;')
print('      fwd: forward alone (returns out); fwd+bwd: forward and backward (returns out and 4 gradients);')
print('      leaf copies: 0 — autograd hands a gradient nobody else holds to the leaf as .grad')
print('      (core/autograd.c accumulate_leaf), so fwd+bwd is the kernels\' own scratch;')
print('      kernel = fwd+bwd − leaf copies.')
print('    the naive cumsum form would hold N·D·Dv·H floats = ' ..
  string.format('%.0f MiB at N = 16k', 16384 * D * D * H * 4 / MiB))
if not hwm_ok then print('    (no /proc/self/clear_refs here: memory columns not available)') end
-- One case per N; the sizes take turns call by call (round-robin), so that a burst of other
-- work on the machine lands on every size alike rather than on one of them.
local sizes = quick and { 1024, 2048, 4096 } or { 1024, 2048, 4096, 8192, 16384 }
local cases = {}
for i, N in ipairs(sizes) do
  local q, k, v, g = inputs(N, D)
  local c = { N = N, q = q, k = k, v = v, g = g, m = pn.full({ H }, 0.5):requires_grad_() }
  function c.once()
    clear({ c.q, c.k, c.v, c.m })
    collectgarbage('collect')
    local t0 = now()
    local out = pn.cosine_attention(c.q, c.k, c.v, c.m, { causal = true })
    local t1 = now()
    out:backward(c.g)
    local t2 = now()
    c.tf[#c.tf + 1], c.tb[#c.tb + 1], c.tt[#c.tt + 1] = (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t2 - t0) * 1e3
  end
  cases[i] = c
end
local function timed_rounds()
  for _, c in ipairs(cases) do
    c.tf, c.tb, c.tt = {}, {}, {}
    c.once(); c.once()
    c.tf, c.tb, c.tt = {}, {}, {}
  end
  for _ = 1, reps do for _, c in ipairs(cases) do c.once() end end
end

local scaling = {}
for pass = 1, 2 do
  if pass == 2 then
    ffi.C.mallopt(M_MMAP_MAX, 0)
    print('    pass 2: mallopt(M_MMAP_MAX, 0): every tensor from the heap, reused between calls')
    print(string.format('    %-7s %9s %9s %11s %7s %6s', 'N', 'fwd ms', 'bwd ms', 'fwd+bwd ms', 'ratio', '≤2.2'))
  else
    print('    pass 1: default allocator')
    print(string.format('    %-7s %9s %9s %11s %7s %6s %10s %11s %11s %10s', 'N', 'fwd ms', 'bwd ms', 'fwd+bwd ms', 'ratio',
      '≤2.2', 'fwd extra', 'fwd+bwd', 'leaf copies', 'kernel'))
  end
  timed_rounds()
  local prev
  for i, c in ipairs(cases) do
    local N, q, k, v, m, g = c.N, c.q, c.k, c.v, c.m, c.g
    local t = median(c.tt)
    local ratio = prev and t / prev or nil
    local rs = ratio and string.format('%.2f', ratio) or '-'
    local ok = ratio and (ratio <= 2.2 and 'ok' or 'ABOVE') or ''
    if pass == 1 then
      local fx, bx, copies = 0, 0, 0
      if hwm_ok then
        clear({ q, k, v, m }) -- earlier gradients go before the baseline is read
        local hw, ret = peak_extra(function()
          return pn.no_grad(function() return pn.cosine_attention(q, k, v, m, { causal = true }) end)
        end)
        fx = hw - ret
        hw, ret = peak_extra(function()
          local out = pn.cosine_attention(q, k, v, m, { causal = true })
          out:backward(g)
          return out
        end)
        bx = hw - ret
      end
      scaling[i] = { N = N, ms = t, ratio = ratio, fwd_extra = fx, extra = bx, kernel = bx - copies }
      print(string.format('    %-7d %9.2f %9.2f %11.2f %7s %6s %6.2f MiB %7.2f MiB %7.2f MiB %6.2f MiB', N, median(c.tf),
        median(c.tb), t, rs, ok, fx / MiB, bx / MiB, copies / MiB, (bx - copies) / MiB))
    else
      scaling[i].ms2, scaling[i].ratio2 = t, ratio
      print(string.format('    %-7d %9.2f %9.2f %11.2f %7s %6s', N, median(c.tf), median(c.tb), t, rs, ok))
    end
    prev = t
  end
  if pass == 2 then ffi.C.mallopt(M_MMAP_MAX, 65536) end -- glibc's default again
end
for _, c in ipairs(cases) do clear({ c.q, c.k, c.v, c.m }) end
cases = nil
collectgarbage('collect')
print()

-- ---- (2) crossover with softmax dot attention -----------------------------------------------------------
local dot_ok = pcall(function()
  local q, k, v = inputs(8, D)
  local o = pn.attention(q, k, v, { score = 'dot', causal = true })
  o:sum():backward()
end)
local dot_label = dot_ok and "pn.attention(q, k, v, {score='dot', causal=true}) (fused)" or
  'naive causal dot: softmax(q kᵀ/√D + causal mask) v by matmul (pn.attention unavailable)'
local function softmax_dot(q, k, v)
  if dot_ok then return pn.attention(q, k, v, { score = 'dot', causal = true }) end
  local N = q:size(3)
  local i = pn.arange(0, N):view(N, 1)
  local j = pn.arange(0, N):view(1, N)
  local bias = pn.where(j:gt(i), -math.huge, 0):to(q:dtype())
  local s = q:matmul(k:transpose(3, 4)) * (1 / math.sqrt(q:size(4))) + bias
  return s:softmax(-1):matmul(v)
end
print('(2) crossover: causal cosine vs causal softmax dot attention, forward + backward, f32, H = 8, D = 64')
print('    softmax dot = ' .. dot_label)
print(string.format('    %-7s %12s %12s %14s', 'N', 'cosine ms', 'dot ms', 'dot / cosine'))
local crossover
local cross_rows = {}
for _, N in ipairs(quick and { 64, 128, 256, 512, 1024 } or { 64, 128, 256, 512, 1024, 2048, 4096 }) do
  local q, k, v, g = inputs(N, D)
  local m = pn.full({ H }, 0.5):requires_grad_()
  local tc, td = {}, {}
  local function cos_call() clear({ q, k, v, m }); pn.cosine_attention(q, k, v, m, { causal = true }):backward(g) end
  local function dot_call() clear({ q, k, v }); softmax_dot(q, k, v):backward(g) end
  cos_call(); dot_call()
  local n = N <= 512 and 3 * reps or reps
  for _ = 1, 3 do time_calls(cos_call, math.ceil(n / 3), tc); time_calls(dot_call, math.ceil(n / 3), td) end
  local c, d = median(tc), median(td)
  cross_rows[#cross_rows + 1] = { N = N, faster = d > 1.1 * c } -- within 10 %: a tie, not a win
  print(string.format('    %-7d %12.3f %12.3f %14.2f', N, c, d, d / c))
end
for i = #cross_rows, 1, -1 do
  if not cross_rows[i].faster then break end
  crossover = cross_rows[i].N
end
print('    crossover: cosine is faster (by more than 10 %) from N = ' .. (crossover and tostring(crossover) or
  '(not within the sizes tried)') .. ' on, at every size from there up in this table')
print()

-- ---- PyTorch subprocess ---------------------------------------------------------------------------------
local py, pyinfo = bk.python('torch')
local have_torch = use_torch and py ~= nil
if use_torch and not have_torch then print('peer: ' .. pyinfo .. ' — peer columns skipped\n') end
local function torch_run(kind, N, d, chunk, data, n, nthreads)
  local cmd = string.format('%s %s/experiments/perf/linear_torch.py --kind %s --threads %d --heads %d --n %d --dim %d ' ..
    '--chunk %d --warmup 1 --reps %d %s 2>&1', py, B.root, kind, nthreads or threads, H, N, d, chunk, n or reps,
    data and ('--data ' .. data) or '')
  local f = io.popen(cmd)
  local out = f:read('*a')
  f:close()
  local ms = tonumber(out:match('median_ms%s+([%d%.]+)'))
  if not ms then print('    PyTorch run failed:\n' .. out) end
  return ms, out:match('(torch [^\n]*)'), tonumber(out:match('max_abs_diff%s+(%S+)'))
end

-- raw f32 dump of tensors (the peer reads them back to check it computes the same thing)
local function dump(path, list)
  local f = assert(io.open(path, 'wb'))
  for _, t in ipairs(list) do
    local c = t:detach():contiguous()
    f:write(ffi.string(c:data_ptr(), c:numel() * 4))
  end
  f:close()
end
local tmpdir = os.getenv('TMPDIR') or '/tmp'
local dumpfile = string.format('%s/pn_linear_cpu_%d.bin', tmpdir, math.random(1e9))

-- ---- (3) cosine vs PyTorch ---------------------------------------------------------------------------------
local N3 = 2048
local cos_vs_torch
print(string.format('(3) causal cosine vs chunked PyTorch (linear_torch.py), forward + backward, f32, N = %d, H = %d, D = %d',
  N3, H, D))
print('    at the session\'s thread count and at 1 thread (two thread pools on a busy 2-core machine hurt PyTorch most)')
local cos_vs_torch_1
do
  local q, k, v, g = inputs(N3, D)
  local m = pn.full({ H }, 0.5):requires_grad_()
  local function call() clear({ q, k, v, m }); pn.cosine_attention(q, k, v, m, { causal = true }):backward(g) end
  print(string.format('    %-7s %-44s %10s %14s', 'threads', '', 'median ms', 'ours / peer'))
  for ti, tc in ipairs(threads > 1 and { threads, 1 } or { 1 }) do
    pn.set_num_threads(tc)
    local ours, peer = {}, { [64] = {}, [256] = {} }
    local info, diff
    if have_torch and ti == 1 then dump(dumpfile, { q, k, v, pn.cosine_attention(q, k, v, m, { causal = true }) }) end
    call()
    for round = 1, 3 do
      time_calls(call, reps, ours)
      if have_torch then
        for _, c in ipairs({ 64, 256 }) do
          local ms, inf, df = torch_run('cosine', N3, D, c, (round == 1 and ti == 1) and dumpfile or nil, nil, tc)
          if ms then peer[c][#peer[c] + 1] = ms end
          info = info or inf
          if df then diff = math.max(diff or 0, df) end
        end
      end
    end
    os.remove(dumpfile)
    local o = median(ours)
    print(string.format('    %-7d %-44s %10.2f', tc, 'penumbra pn.cosine_attention (GEMM chunks of 64)', o))
    if have_torch and #peer[64] > 0 then
      local best = math.huge
      for _, c in ipairs({ 64, 256 }) do
        local p = median(peer[c])
        best = math.min(best, p)
        print(string.format('    %-7d %-44s %10.2f %14.3f', tc, string.format('%s, chunk %d', ((info or 'torch'):gsub(' threads %d+', '')), c),
          p, o / p))
      end
      if ti == 1 then cos_vs_torch = o / best else cos_vs_torch_1 = o / best end
      print(string.format('    %-7d ours / best peer = %.3f   target ≤ 1.0: %s%s', tc, o / best, o / best <= 1.0 and 'ok' or 'ABOVE',
        diff and string.format('   (same inputs: max |out diff| = %.2g)', diff) or ''))
    end
  end
  pn.set_num_threads(threads)
end
print()

-- ---- (4) power attention ------------------------------------------------------------------------------------
local DP = 32
print(string.format('(4) power attention p = 2, gated (log gates in (−0.1, 0]), forward + backward, f32, H = %d, D = %d (D\' = %d)',
  H, DP, DP * (DP + 1) / 2))
print(string.format('    %-6s %-34s %10s %14s %12s', 'N', 'form', 'median ms', 'vs quadratic', 'ours / peer'))
local power_rows = {}
for _, N in ipairs(quick and { 2048 } or { 2048, 4096 }) do
  local q, k, v, g = inputs(N, DP)
  pn.manual_seed(7)
  local lg = (pn.rand({ 1, H, N }) * -0.1):detach():requires_grad_()
  local forms = { { 'quadratic (chunk = 0)', 0 }, { 'chunked, chunk = 64', 64 }, { 'chunked, chunk = 128', 128 } }
  local times, peer = {}, {}
  local calls = {}
  for i, f in ipairs(forms) do
    times[i] = {}
    calls[i] = function()
      clear({ q, k, v, lg })
      pn.power_attention(q, k, v, { p = 2, log_gate = lg, chunk = f[2] }):backward(g)
    end
    calls[i]()
  end
  local n = math.max(5, math.floor(reps / 2) + 1)
  local info, diff
  if have_torch then
    dump(dumpfile, { q, k, v, lg, pn.power_attention(q, k, v, { p = 2, log_gate = lg, chunk = 64 }) })
  end
  -- the two forms on f64 copies (in f32 both round the same f64 sums to the same floats)
  local q64, k64, v64, lg64 = q:detach():to('f64'), k:detach():to('f64'), v:detach():to('f64'), lg:detach():to('f64')
  local agree = (pn.power_attention(q64, k64, v64, { p = 2, log_gate = lg64, chunk = 64 }) -
    pn.power_attention(q64, k64, v64, { p = 2, log_gate = lg64 })):abs():max():item()
  for round = 1, 2 do
    for i = 1, #forms do time_calls(calls[i], math.ceil(n / 2), times[i]) end
    if have_torch then
      local ms, inf, df = torch_run('power', N, DP, 128, round == 1 and dumpfile or nil, 3)
      if ms then peer[#peer + 1] = ms end
      info = info or inf
      if df then diff = df end
    end
  end
  os.remove(dumpfile)
  local quad = median(times[1])
  local p = #peer > 0 and median(peer) or nil
  for i, f in ipairs(forms) do
    local t = median(times[i])
    print(string.format('    %-6d %-34s %10.1f %14.2f %12s', N, f[1], t, quad / t, p and string.format('%.3f', t / p) or '-'))
    power_rows[#power_rows + 1] = { N = N, form = f[1], ms = t, vs_quad = quad / t, vs_peer = p and t / p }
  end
  if p then
    print(string.format('    %-6d %-34s %10.1f', N, (info or 'torch') .. ', chunk 128', p))
  end
  print(string.format('           chunked vs quadratic (f64 inputs): max |out diff| = %.2g; vs the peer (f32) on the same inputs: %s',
    agree, diff and string.format('%.2g', diff) or '?'))
end
print('    (vs quadratic > 1: faster than our quadratic form; ours / peer < 1: faster than PyTorch)')
print()

-- ---- (5) state sizes --------------------------------------------------------------------------------------------
print('(5) recurrent state per (batch, head), f32 inputs (the state itself is f64): state:bytes()')
print('    break-even N: the length at which a softmax KV cache (2·N·D f32) reaches the same size')
print(string.format('    %-16s %6s %10s %16s %14s', 'state', 'D', 'D\'', 'bytes', 'break-even N'))
for _, d in ipairs({ 16, 32, 64 }) do
  local st = pn.cosine_state { batch = 1, heads = 1, dim = d, m = 0.5 }
  local b = st:bytes()
  st:free()
  print(string.format('    %-16s %6d %10d %16d %14d', 'cosine', d, d, b, math.ceil(b / (2 * d * 4))))
end
for _, p in ipairs({ 2, 4 }) do
  for _, d in ipairs({ 16, 32, 64 }) do
    local st = pn.power_state { batch = 1, heads = 1, dim = d, dim_v = d, p = p }
    local b = st:bytes()
    st:free()
    local dp = 1
    for i = 1, p do dp = dp * (d - 1 + i) / i end
    print(string.format('    %-16s %6d %10d %16d %14d', 'power p = ' .. p, d, dp, b, math.ceil(b / (2 * d * 4))))
  end
end
print()

-- ---- summary ----------------------------------------------------------------------------------------------------
print('summary')
for _, r in ipairs(scaling) do
  if r.ratio then
    print(string.format('    cosine N=%-6d time ratio to N/2 = %.2f (≤ 2.2: %s; heap-only allocator: %s), kernel extra memory %.2f MiB',
      r.N, r.ratio, r.ratio <= 2.2 and 'ok' or 'ABOVE', r.ratio2 and string.format('%.2f', r.ratio2) or '-', r.kernel / MiB))
  end
end
print('    crossover cosine < softmax dot from N = ' .. tostring(crossover or 'none in range'))
if cos_vs_torch then print(string.format('    cosine ours / PyTorch chunked at N = %d, %d threads: %.3f (≤ 1.0: %s)%s', N3,
  threads, cos_vs_torch, cos_vs_torch <= 1.0 and 'ok' or 'ABOVE',
  cos_vs_torch_1 and string.format('; 1 thread: %.3f', cos_vs_torch_1) or '')) end
for _, r in ipairs(power_rows) do
  print(string.format('    power N=%-5d %-22s vs quadratic %.2f×%s', r.N, r.form, r.vs_quad,
    r.vs_peer and string.format(', ours / peer %.3f', r.vs_peer) or ''))
end
