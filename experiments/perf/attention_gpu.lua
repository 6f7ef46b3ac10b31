-- experiments/perf/attention_gpu.lua — penumbra's attention on the GPU against PyTorch on the
-- same GPU in the same run (issue 17): SDPA restricted to its FlashAttention backend, and the
-- authors' straightforward PyTorch cone attention under torch.compile
-- (experiments/perf/attention_gpu_torch.py, one process kept for the whole run).
--
--   ./bench experiments/perf/attention_gpu.lua [n=1024,2048,4096,8192,16384] [d=64,128]
--       [scores=dot,laplacian,umbral,penumbral,hyperbolic,cosine] [causal=0,1] [passes=fwd,fwd+bwd]
--       [tokens=16384] [hd=2048] [precision=bf16|f16|f32] [rounds=3] [reps=5] [warmup=3] [torch=1]
--       [compiled=umbral,penumbral] [compile=dynamic|static] [peak_tflops=…] [dry=1]
--       (a score named <score>_wmma, e.g. dot_wmma: that score with the wmma forward instead of
--       the mma.sync one, PENUMBRA_CUDA_MMA=0 — to time one against the other)
--       [power=1] [power_n=65536] [power_h=8] [power_d=64] [power_chunk=128] [power_reps=3]
--
-- Shapes as the issue fixes them: B·N = tokens (16k) and H·D = hd (2048), so B = tokens/N and
-- H = hd/D: every N moves the same number of tokens. Inputs as attention_cpu.lua makes them
-- (q, k = randn·0.3, v = randn; the cones and hyperbolic through their score's default map:
-- umbral ψ, penumbral ξ with h = r, hyperbolic the pseudo-polar map), computed once per (N, D).
-- Passes: fwd (no grad) and fwd+bwd (out:backward(ones): the gradients of q, k, v).
-- Ours: f32 tensors with precision = 'bf16' (penumbra has no bf16 dtype yet, so inputs, outputs
-- and gradients move twice the peer's bytes): the dense kernels' products on tensor cores with
-- inputs rounded to bf16, f32 accumulation — which passes do so, the header says from a probe
-- (precision_probe below). cosine (pn.cosine_attention, m = 0.5 per head) and power have no
-- precision option: f32. The peer: bf16 tensors (flash takes 16-bit inputs only).
-- Timing: penumbra exposes no CUDA events, so each call is wall-clock timed between two
-- pn.cuda.synchronize() (the peer: torch.cuda.synchronize()), a full Lua GC after each call
-- outside the timing. `warmup` untimed calls of every case, one more that reads the peak memory,
-- then `rounds` rounds: in each, per (D, N), `reps` calls of every (score, causal, pass) of
-- ours, then `reps` calls of every case of the peer. Figures: median and min over all timed calls.
-- TFLOP/s by DESIGN §7 (the FlashAttention convention, the same count for every score): forward
-- 4·B·N²·H·D, halved when causal; forward+backward 3.5× that; the fraction of the GPU's dense
-- bf16 tensor-core peak (a table by device name; peak_tflops= overrides). cosine's rows have
-- none: its work is O(N·D²), not this count.
-- Memory: pn.cuda.memory_stats().peak − allocated, read around one call after reset_peak (the
-- call's output, gradients and scratch); the peer's torch.cuda.max_memory_allocated() likewise.
-- B·N is constant across N, so without an N² term the peak stays flat: the "× prev N" column is
-- the peak's ratio to the previous N's over the ratio of their token counts (flagged above 1.3).
-- Targets (issue 17), printed per row: our dot ≥ 0.85× SDPA-flash's throughput at N = 4096;
-- laplacian ≤ 1.10×, umbral and penumbral ≤ 1.15×, hyperbolic ≤ 1.35× our dot's time (same N, D,
-- causal, pass); every score with a compiled peer (compiled=) ≤ 0.25× its time; causal cosine
-- fwd+bwd faster than our causal dot from some N ≤ 4096 and ≥ 4× faster at N = 16384; power p = 2
-- chunked with gating at B = 1, N = 65536, H = 8, D = 64 fwd+bwd ≤ 0.33× SDPA-flash causal at the
-- same shape; peak memory with no N² term.
-- compile=dynamic (default) compiles the cones once for every N (torch.compile(dynamic=True));
-- compile=static recompiles per (N, D) for static-shape kernels (a compile per shape).
-- Under the kernel interpreter (pn.cuda.interpreted()), or with dry=1 on a GPU, the script is a
-- dry run at tiny sizes (N = 16, 40; tokens 80; hd 32; D = 16; power N = 48) that runs every
-- code path, the peer included (on the CPU without CUDA: flash's CPU kernel or the math backend,
-- torch.compile with aot_eager); its times mean nothing and the verdicts are shown in brackets.
local pn = require 'penumbra'
local bk = require 'penumbra.benchkit'
local options = require 'penumbra.options'

args = args or {}
local KEYS = {}
for _, k in ipairs({ 'n', 'd', 'scores', 'causal', 'passes', 'tokens', 'hd', 'precision', 'rounds', 'reps', 'warmup',
                     'torch', 'compiled', 'compile', 'peak_tflops', 'dry', 'power', 'power_n', 'power_h', 'power_d',
                     'power_chunk', 'power_reps' }) do KEYS[k] = 'any' end
options.check('attention_gpu.lua', args, KEYS)

if not pn.cuda.available() then
  error('attention_gpu.lua: no CUDA device (pn.cuda.available() is false); on a machine without a GPU run the dry '
        .. 'run in the kernel interpreter: PENUMBRA_BUILD=build-emu PENUMBRA_CMAKE_ARGS=-DPN_CUDA_EMU=ON ./bench '
        .. 'experiments/perf/attention_gpu.lua', 0)
end
local interp = pn.cuda.interpreted()
local dry = interp or tostring(args.dry) == '1'
local now, median, list = bk.now, bk.median, bk.list
local here = (arg and arg[0] or 'experiments/perf/attention_gpu.lua'):match('^(.*)/[^/]*$') or '.'

-- ---- settings --------------------------------------------------------------------------------------
local function num(key, full, tiny, lo)
  local v = args[key] ~= nil and tonumber(args[key]) or (args[key] == nil and (dry and tiny or full)) or nil
  lo = lo or 1
  if type(v) ~= 'number' or v < lo or v % 1 ~= 0 then
    error(string.format("attention_gpu.lua: %s must be a whole number ≥ %d, got '%s'", key, lo, tostring(args[key])), 0)
  end
  return v
end
local function off(key) return tostring(args[key]) == '0' end
local Ns = list(args.n, dry and '16,40' or '1024,2048,4096,8192,16384')
local Ds = list(args.d, dry and '16' or '64,128')
local SCORES = list(args.scores, 'dot,laplacian,umbral,penumbral,hyperbolic,cosine')
local PASSES = list(args.passes, 'fwd,fwd+bwd')
local CAUSALS = {}
for _, c in ipairs(list(args.causal, '0,1')) do CAUSALS[#CAUSALS + 1] = (c == 1) end
local tokens, hd = num('tokens', 16384, 80), num('hd', 2048, 32)
local rounds, reps, warmup = num('rounds', 3, 2), num('reps', 5, 1), num('warmup', 3, 1, 0)
local precision = args.precision or 'bf16'
local COMPILED = list(args.compiled, 'umbral,penumbral')
if args.compiled == '' or off('compiled') then COMPILED = {} end
local compile_mode = args.compile or 'dynamic'
local power = not off('power')
local P = { N = num('power_n', 65536, 48), H = num('power_h', 8, 2), D = num('power_d', 64, 16),
            chunk = num('power_chunk', 128, 16), reps = num('power_reps', 3, 1) }

local function bad(msg) error('attention_gpu.lua: ' .. msg, 0) end
-- an error's message without the Lua position a wrapper may have added, one line
local function first_line(err) return (tostring(err):gsub('\n.*', ''):gsub('^[^:%s]+%.lua:%d+: ', '')) end
local LINEAR = { cosine = true } -- scores outside the dense registry, each with its own call
-- '<score>_wmma': that score with the tensor-core forward on wmma (PENUMBRA_CUDA_MMA=0 around its
-- calls) instead of mma.sync — the "/ our dot" column of dot_wmma is then wmma's time over mma's
local function base_score(s) return (tostring(s):gsub('_wmma$', '')) end
local ffi = require 'ffi'
pcall(ffi.cdef, 'int setenv(const char *, const char *, int); int unsetenv(const char *);')
for _, s in ipairs(SCORES) do
  s = base_score(s)
  if s == 'power' then bad("scores: power has its own section (power=1, power_n=, power_h=, power_d=, power_chunk=)") end
  if not LINEAR[s] then -- an unknown score fails here, before any timing
    local ok, desc = pcall(pn.attention_variant, s)
    if not ok or desc.graph_only then
      bad(string.format("scores: '%s' is not a dense score (dense: %s; linear: cosine; power: its own section)",
        tostring(s), table.concat(pn.attention_variants(), ', '):gsub(', gat', '')))
    end
  end
end
for _, p in ipairs(PASSES) do
  if p ~= 'fwd' and p ~= 'fwd+bwd' then bad("passes: '" .. tostring(p) .. "' is not fwd or fwd+bwd") end
end
if precision ~= 'bf16' and precision ~= 'f16' and precision ~= 'f32' then
  bad("precision: '" .. precision .. "' is not bf16, f16 or f32")
end
if compile_mode ~= 'dynamic' and compile_mode ~= 'static' then bad("compile: '" .. compile_mode .. "' is not dynamic or static") end
for _, N in ipairs(Ns) do
  if type(N) ~= 'number' or N < 1 or N % 1 ~= 0 then bad("n: '" .. tostring(N) .. "' is not a positive whole number") end
end
for _, D in ipairs(Ds) do
  if type(D) ~= 'number' or D < 1 or hd % D ~= 0 then bad(string.format("d: %s does not divide hd = %d", tostring(D), hd)) end
end
local dense_opts = precision ~= 'f32' and { precision = precision } or {}
do -- the compiled peer times only distance scores this run shows
  local shown, keep = {}, {}
  for _, sc in ipairs(SCORES) do shown[sc] = not LINEAR[sc] end
  for _, sc in ipairs(COMPILED) do if shown[sc] then keep[#keep + 1] = sc end end
  COMPILED = keep
end

-- the GPU's dense bf16 tensor-core peak (NVIDIA's datasheets; without sparsity)
local PEAKS = { { 'H100 PCIe', 756 }, { 'H100 NVL', 835 }, { 'H100', 989 }, { 'H200', 989 }, { 'A100', 312 } }
local device = pn.cuda.device_name()
local peak_tflops, peak_src = tonumber(args.peak_tflops), 'peak_tflops='
if not peak_tflops then
  for _, e in ipairs(PEAKS) do
    if device:find(e[1], 1, true) then peak_tflops, peak_src = e[2], e[1] .. ' datasheet'; break end
  end
end
if not peak_tflops and dry then peak_tflops, peak_src = 989, 'H100 SXM figure assumed for the dry run' end

-- ---- the peer ----------------------------------------------------------------------------------------
local peer, peer_lines, notes = nil, {}, {}
if off('torch') then
  peer_lines[1] = 'peer: off (torch=0): no SDPA or compiled columns; the targets against them are not checked'
else
  local py, pyinfo = bk.python('torch')
  if not py then
    peer_lines[1] = 'peer: PyTorch not found, so no SDPA or compiled columns — ' .. pyinfo
  else
    local cmd = string.format('%s %s/attention_gpu_torch.py --reply %%s --device %s --dtype %s --compile-backend %s '
      .. '--compile %s --threads %d', py, here, interp and 'cpu' or 'cuda', precision == 'f32' and 'f32' or 'bf16',
      interp and 'aot_eager' or 'inductor', compile_mode, pn.num_threads())
    local ok, p = pcall(bk.peer, cmd, 'the PyTorch peer (attention_gpu_torch.py)')
    if ok and not p.hello:match('^error') then
      peer = p
      peer_lines[1] = string.format('peer: %s (%s): %s', py, pyinfo, p.hello)
      peer_lines[2] = 'peer: SDPA with sdpa_kernel(FLASH_ATTENTION), bf16; ' .. (#COMPILED == 0 and
        'no compiled cones (compiled=0)' or string.format('%s written with pairwise tensors under torch.compile ' ..
        '(%s, %s shapes), %s', table.concat(COMPILED, ', '), interp and 'backend aot_eager' or 'inductor', compile_mode,
        precision == 'f32' and 'f32' or 'bf16'))
    else
      peer_lines[1] = 'peer: failed to start, going on without it: ' .. tostring(ok and p.hello or p)
      if ok then p:close() end
    end
  end
end
local function ask(line)
  if not peer then return nil end
  local ok, r = pcall(peer.ask, peer, line)
  if ok then return r end
  notes[#notes + 1] = 'peer: ' .. tostring(r):gsub('\n', ' ') .. ' — the rest of the run goes on without it'
  peer = nil
end
-- one "time" reply → { ms = {…}, peak =, backend =, dtype =, note = } or { skip = why }
local function peer_time(impl, score, c, pas, w, n, want_peak)
  local r = ask(string.format('time %s %s %d %s %d %d %d', impl, score, c and 1 or 0, pas, w, n, want_peak and 1 or 0))
  if not r then return nil end
  local backend, dtype, pk, ms, note = r:match('^time backend=(%S+) dtype=(%S+) peak=(%-?%d+) ms=(%S*) note=(.*)$')
  if not backend then return { skip = r:gsub('^skip ', '') } end
  local t = {}
  for x in ms:gmatch('[^,]+') do t[#t + 1] = tonumber(x) / 1e3 end
  pk = tonumber(pk)
  return { ms = t, peak = pk >= 0 and pk or nil, backend = backend, dtype = dtype, note = note }
end

-- ---- what precision= does here -----------------------------------------------------------------------------
-- Which passes round their inputs is the kernels' business and changes as they grow (README
-- "CUDA"), so the script asks the library instead of saying it: one small dot call (B = H = 1,
-- N = 64, D = 64) with precision=<p> against the same call in f32, as max|Δ| / max|f32 value|.
-- q, k, v and the output's gradient are multiples of 1/8 below 4 in magnitude, exact in bf16 and
-- f16, so only what a pass rounds itself shows: the forward's P before P·V (in the output), the
-- backward's P before Pᵀ·dO (in dv: the row statistics it uses come from the exact scores; dq
-- and dk also see the forward's output through rowsum(dO∘O), so they would move either way).
-- A pass in f32 agrees with f32 to ~1e-7 (summation order), a rounding one moves 1e-4 (f16) to
-- 1e-3 (bf16); the line is drawn at 1e-5.
local function precision_probe()
  math.randomseed(3)
  local function dyadic()
    local rows = {}
    for i = 1, 64 do
      local r = {}
      for j = 1, 64 do r[j] = math.random(-24, 24) / 8 end
      rows[i] = r
    end
    return pn.tensor({ { rows } }, { device = 'cuda' })
  end
  local q, k, v, g = dyadic(), dyadic(), dyadic(), dyadic()
  local function run(o)
    local x = { q:detach():requires_grad_(), k:detach():requires_grad_(), v:detach():requires_grad_() }
    local out = pn.attention(x[1], x[2], x[3], o)
    out:backward(g)
    return { out:detach(), x[3].grad }
  end
  local ok, res = pcall(function()
    local a, b = run({}), run(dense_opts)
    local function say(i)
      local x = (a[i] - b[i]):abs():max():item() / a[i]:abs():max():item()
      return string.format('%.1e → %s', x, x > 1e-5 and 'rounds its inputs (tensor cores)' or 'f32 (CUDA cores)')
    end
    return string.format('forward %s; backward (dv) %s', say(1), say(2))
  end)
  return ok and res or ('failed: ' .. first_line(res))
end

-- ---- header ------------------------------------------------------------------------------------------
local header = {
  'device: ' .. device .. (interp and '   (the kernel interpreter: a dry run at tiny sizes that proves the script runs, NOT timings)'
    or dry and '   (dry=1: tiny sizes, a smoke test, NOT the benchmark)' or ''),
  string.format('shapes: B·N = %d tokens, H·D = %d (B = tokens/N, H = hd/D); D = %s; N = %s', tokens, hd,
    table.concat(Ds, ','), table.concat(Ns, ',')),
  precision == 'f32' and 'ours: f32 tensors, f32 arithmetic on CUDA cores (precision=f32)' or
    string.format('ours: f32 TENSORS (penumbra has no bf16 dtype yet: inputs, outputs and gradients are stored in f32, ' ..
      'twice the bytes of the peer\'s bf16) with precision=\'%s\': the dense kernels\' products on tensor cores with ' ..
      'inputs rounded to %s, f32 accumulation, where a pass has that form', precision, precision),
  'ours: cosine (m = 0.5 per head) and power: f32 tensors, no precision option',
  string.format('timing: no CUDA events exposed, so wall clock between two synchronize() calls (both sides); %d warm-up ' ..
    'call(s) and 1 for the peak memory per case, then %d round(s) × %d call(s), ours and the peer taking turns per (D, N); ' ..
    'median and min of all timed calls', warmup, rounds, reps),
  string.format('TFLOP/s: DESIGN §7 (fwd 4·B·N²·H·D, halved when causal; fwd+bwd 3.5×) for every softmax score; ' ..
    '%% peak of %s TFLOP/s dense bf16 (%s); cosine: no TFLOP/s (O(N·D²) work)',
    peak_tflops and string.format('%g', peak_tflops) or '?', peak_tflops and peak_src or 'unknown device: pass peak_tflops='),
  'memory: the peak allocation over a call (output, gradients, scratch) from pn.cuda.memory_stats() / ' ..
    'torch.cuda.max_memory_allocated(); "× prev N" = its growth over the growth of B·N (1 without an N² term)',
}
if precision ~= 'f32' then
  table.insert(header, 4, 'ours: precision=\'' .. precision .. '\' probed against f32 (one small dot call on inputs exact ' ..
    'in ' .. precision .. ', max|Δ| / max|f32|): ' .. precision_probe())
end
for _, l in ipairs(peer_lines) do header[#header + 1] = l end
bk.header('penumbra attention on the GPU vs PyTorch SDPA-flash and compiled cones (issue 17)', header)

-- ---- our calls -----------------------------------------------------------------------------------------
-- q, k = randn·0.3 through the score's default map (attention_cpu.lua's recipe), v = randn, on
-- the device; leaves requiring grad (the fwd pass runs under no_grad); g: the backward's seed
local function inputs(score, B, H, N, D)
  pn.manual_seed(1)
  local dev = { device = 'cuda' }
  local q = pn.randn({ B, H, N, D }, dev) * 0.3
  local k = pn.randn({ B, H, N, D }, dev) * 0.3
  local v = pn.randn({ B, H, N, D }, dev)
  local map = LINEAR[score] and 'none' or pn.attention_variant(score).map
  if map == 'psi' then q, k = pn.maps.psi(q), pn.maps.psi(k)
  elseif map == 'xi' then
    local h = pn.attention_variant(score).params.r.default
    q, k = pn.maps.xi(q, { h = h }), pn.maps.xi(k, { h = h })
  elseif map == 'pseudopolar' then q, k = pn.maps.pseudopolar(q), pn.maps.pseudopolar(k)
  elseif map ~= 'none' then bad("score '" .. score .. "' has map '" .. tostring(map) .. "', which this benchmark does not apply yet") end
  local d = { q = q:contiguous():detach():requires_grad_(), k = k:contiguous():detach():requires_grad_(),
              v = v:detach():requires_grad_(), g = pn.ones({ B, H, N, D }, dev) }
  if score == 'cosine' then d.m = pn.full({ H }, 0.5, dev):requires_grad_() end
  return d
end

-- one untimed call of (score, causal, pass) on d
local function call(score, c, pas, d)
  if score:match('_wmma$') then
    ffi.C.setenv('PENUMBRA_CUDA_MMA', '0', 1)
    local ok, e = pcall(call, base_score(score), c, pas, d)
    ffi.C.unsetenv('PENUMBRA_CUDA_MMA')
    if not ok then error(e, 0) end
    return
  end
  local function fwd()
    if score == 'cosine' then return pn.cosine_attention(d.q, d.k, d.v, d.m, { causal = c }) end
    local o = { score = score, causal = c }
    for key, val in pairs(dense_opts) do o[key] = val end
    return pn.attention(d.q, d.k, d.v, o)
  end
  if pas == 'fwd' then
    pn.no_grad(fwd)
  else
    fwd():backward(d.g)
    d.q:zero_grad(); d.k:zero_grad(); d.v:zero_grad()
    if d.m then d.m:zero_grad() end
  end
end

local function timed(fn)
  pn.cuda.synchronize()
  local t0 = now()
  fn()
  pn.cuda.synchronize()
  local dt = now() - t0
  collectgarbage('collect') -- the call's tensors go back to the caching allocator now, not mid-timing
  return dt
end

-- the peak allocation over one call, above what was allocated before it
local function peak_of(fn)
  collectgarbage('collect')
  pn.cuda.synchronize()
  local base = pn.cuda.memory_stats().allocated
  pn.cuda.reset_peak()
  fn()
  pn.cuda.synchronize()
  local pk = pn.cuda.memory_stats().peak - base
  collectgarbage('collect')
  return pk
end

-- ---- the rounds ------------------------------------------------------------------------------------------
local function key(...) return table.concat({ ... }, ' ') end
local function ck(c) return c and 1 or 0 end
local ours, ours_peak, theirs, failed, shape = {}, {}, {}, {}, {}
local function push(t, k, xs) t[k] = t[k] or {}; for _, x in ipairs(xs) do table.insert(t[k], x) end end
local peer_cases = {} -- { impl, score } the peer times
if peer then
  peer_cases[1] = { 'sdpa', 'dot' }
  for _, s in ipairs(COMPILED) do peer_cases[#peer_cases + 1] = { 'compiled', s } end
end

for _, D in ipairs(Ds) do
  for _, N in ipairs(Ns) do
    local B, H = math.max(1, math.floor(tokens / N)), hd / D
    shape[key(N, D)] = { B = B, H = H }
    io.stdout:flush()
    io.stderr:write(string.format('attention_gpu.lua: D=%d N=%d (B=%d, H=%d) …\n', D, N, B, H))
    local data = {}
    for _, score in ipairs(SCORES) do data[score] = inputs(base_score(score), B, H, N, D) end
    local function each(fn)
      for _, score in ipairs(SCORES) do
        for _, c in ipairs(CAUSALS) do
          for _, pas in ipairs(PASSES) do
            local k = key(score, N, D, ck(c), pas)
            if not failed[k] then fn(score, c, pas, k) end
          end
        end
      end
    end
    -- warm-up and peak memory; a case CUDA cannot run yet is reported per row, not fatal
    each(function(score, c, pas, k)
      local ok, err = pcall(function()
        for _ = 1, warmup do call(score, c, pas, data[score]) end
        ours_peak[k] = peak_of(function() call(score, c, pas, data[score]) end)
      end)
      if not ok then failed[k] = first_line(err) end
      collectgarbage('collect')
    end)
    local peer_ready = ask(string.format('case %d %d %d %d', B, H, N, D)) == 'ok'
    for round = 1, rounds do
      each(function(score, c, pas, k)
        local ts = {}
        for _ = 1, reps do ts[#ts + 1] = timed(function() call(score, c, pas, data[score]) end) end
        push(ours, k, ts)
      end)
      if peer_ready then
        for _, pc in ipairs(peer_cases) do
          for _, c in ipairs(CAUSALS) do
            for _, pas in ipairs(PASSES) do
              local k = key(pc[1], pc[2], N, D, ck(c), pas)
              if not (theirs[k] and theirs[k].skip) then
                local r = peer_time(pc[1], pc[2], c, pas, round == 1 and math.max(1, warmup) or 0, reps, round == 1)
                if r and r.skip then theirs[k] = r
                elseif r then
                  theirs[k] = theirs[k] or { ms = {}, peak = r.peak, backend = r.backend, dtype = r.dtype, note = r.note }
                  push(theirs[k], 'ms', r.ms)
                end
              end
            end
          end
        end
      end
    end
    data = nil -- luacheck: ignore
    collectgarbage('collect')
  end
end

-- ---- tables --------------------------------------------------------------------------------------------
local TARGET_VS_DOT = { laplacian = 1.10, umbral = 1.15, penumbral = 1.15, hyperbolic = 1.35 }
local met, missed = 0, 0
local function mark(ok)
  if ok then met = met + 1 else missed = missed + 1 end
  if dry then return ok and '(ok)' or '(missed)' end
  return ok and 'ok' or 'MISSED'
end
local function f(x, fmt) return x and string.format(fmt, x) or '–' end
local function flops(B, H, N, D, c, pas) return 4 * B * N * N * H * D * (c and 0.5 or 1) * (pas == 'fwd' and 1 or 3.5) end
local function med(t) return t and #t > 0 and median(t) or nil end
local function min(t)
  if not t or #t == 0 then return nil end
  local m = t[1]
  for _, x in ipairs(t) do if x < m then m = x end end
  return m
end
local MiB = 2 ^ 20
local peer_notes, peer_used = {}, {} -- what the peer said; the backends and dtypes it ran
local cosine_rows = {}

for _, D in ipairs(Ds) do
  for _, pas in ipairs(PASSES) do
    print(string.format('### D = %d, %s (H = %d; ms: median / min; ratios are time ratios, < 1 is faster; every score ' ..
      'against SDPA\'s dot)', D, pas, hd / D))
    print()
    print('| N | B | causal | score | ours ms | TFLOP/s | % peak | / our dot | SDPA ms | / SDPA | compiled ms | / compiled ' ..
      '| MiB ours / peer | × prev N | targets |')
    print('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|')
    local prev = {}
    for _, N in ipairs(Ns) do
      local sh = shape[key(N, D)]
      for _, c in ipairs(CAUSALS) do
        local dot = med(ours[key('dot', N, D, ck(c), pas)])
        local sd = theirs[key('sdpa', 'dot', N, D, ck(c), pas)]
        for _, score in ipairs(SCORES) do
          local k = key(score, N, D, ck(c), pas)
          local row = { tostring(N), tostring(sh.B), c and 'yes' or 'no', score }
          if failed[k] then
            row[#row + 1] = 'not run on CUDA: ' .. failed[k]:gsub('|', '/')
            for _ = 1, 10 do row[#row + 1] = '' end
          else
            local t, tmin = med(ours[k]), min(ours[k])
            local fl = not LINEAR[score] and flops(sh.B, sh.H, N, D, c, pas) or nil
            local tf = fl and fl / t / 1e12
            local vs_dot = dot and score ~= 'dot' and t / dot or nil
            local sdt = sd and not sd.skip and med(sd.ms) or nil
            local cp = theirs[key('compiled', score, N, D, ck(c), pas)]
            local cpt = cp and not cp.skip and med(cp.ms) or nil
            local pk = ours_peak[k]
            local ppk = score == 'dot' and sd and sd.peak or cp and cp.peak
            -- the peak's growth over the growth of B·N since the previous N (same score, causal)
            local grow
            local pv = prev[key(score, ck(c))]
            if pv and pk and pv.peak > 0 then grow = (pk / pv.peak) / ((sh.B * N) / (pv.B * pv.N)) end
            prev[key(score, ck(c))] = { peak = pk, B = sh.B, N = N }
            local targets = {}
            if score == 'dot' and N == 4096 and sdt then
              targets[#targets + 1] = '≥0.85× SDPA thr. ' .. mark(sdt / t >= 0.85)
            end
            if TARGET_VS_DOT[score] and vs_dot then
              targets[#targets + 1] = string.format('≤%.2f× dot %s', TARGET_VS_DOT[score], mark(vs_dot <= TARGET_VS_DOT[score]))
            end
            if cpt then targets[#targets + 1] = '≤0.25× compiled ' .. mark(t / cpt <= 0.25) end
            if grow then targets[#targets + 1] = 'no N² memory ' .. mark(grow <= 1.3) end
            if score == 'cosine' and c and pas == 'fwd+bwd' and dot then
              cosine_rows[#cosine_rows + 1] = { D = D, N = N, cos = t, dot = dot }
            end
            for _, x in ipairs({ sd, cp }) do
              if x and x.backend then peer_used[key(x == sd and 'sdpa' or 'compiled', x.backend, x.dtype)] = true end
              if x and x.skip then peer_notes[x.skip] = true end
              if x and x.note and x.note ~= '' then peer_notes[x.backend .. ' ' .. x.dtype .. ': ' .. x.note] = true end
            end
            row[#row + 1] = string.format('%.3f / %.3f', t * 1e3, tmin * 1e3)
            row[#row + 1] = f(tf, '%.3g')
            row[#row + 1] = f(tf and peak_tflops and 100 * tf / peak_tflops, '%.3g %%')
            row[#row + 1] = f(vs_dot, '%.3f')
            row[#row + 1] = f(sdt and sdt * 1e3, '%.3f') .. (sd and sd.skip and ' (skipped)' or '')
            row[#row + 1] = f(sdt and t / sdt, '%.3f')
            row[#row + 1] = f(cpt and cpt * 1e3, '%.3f') .. (cp and cp.skip and ' (skipped)' or '')
            row[#row + 1] = f(cpt and t / cpt, '%.3f')
            row[#row + 1] = f(pk and pk / MiB, '%.4g') .. ' / ' .. f(ppk and ppk / MiB, '%.4g')
            row[#row + 1] = f(grow, '%.2f')
            row[#row + 1] = table.concat(targets, '; ')
          end
          print('| ' .. table.concat(row, ' | ') .. ' |')
        end
      end
    end
    print()
  end
end

-- causal cosine vs causal dot, forward+backward: the crossover and the margin at N = 16384
local by_d = {}
for _, r in ipairs(cosine_rows) do by_d[r.D] = by_d[r.D] or {}; table.insert(by_d[r.D], r) end
for _, D in ipairs(Ds) do
  local rs = by_d[D]
  if rs then
    local cross, at16
    for _, r in ipairs(rs) do
      if not cross and r.cos < r.dot then cross = r.N end
      if r.N == 16384 then at16 = r.dot / r.cos end
    end
    local line = string.format('causal cosine vs our causal dot, fwd+bwd, D = %d: faster from N = %s', D,
      cross and tostring(cross) or 'none in this run')
    if cross or Ns[#Ns] >= 4096 then line = line .. ' (≤ 4096: ' .. mark(cross ~= nil and cross <= 4096) .. ')' end
    print(line .. (at16 and string.format('; at N = 16384 %.2f× faster (≥ 4×: %s)', at16, mark(at16 >= 4)) or
      '; no N = 16384 in this run'))
  end
end

-- ---- power attention: p = 2, chunked, gated, causal, against SDPA-flash causal at the same shape ----------
if power then
  print()
  print(string.format('### power attention p = 2, chunk = %d, gated (log gates in (−0.1, 0]), causal, B = 1, N = %d, H = %d, D = %d',
    P.chunk, P.N, P.H, P.D))
  print('(f32 tensors; TFLOP/s by the causal §7 count, for comparison with SDPA\'s)')
  print()
  io.stdout:flush()
  io.stderr:write(string.format('attention_gpu.lua: power N=%d H=%d D=%d …\n', P.N, P.H, P.D))
  local dev = { device = 'cuda' }
  pn.manual_seed(7)
  local q = pn.randn({ 1, P.H, P.N, P.D }, dev):requires_grad_()
  local k = pn.randn({ 1, P.H, P.N, P.D }, dev):requires_grad_()
  local v = pn.randn({ 1, P.H, P.N, P.D }, dev):requires_grad_()
  local lg = (pn.rand({ 1, P.H, P.N }, dev) * -0.1):detach():requires_grad_()
  local g = pn.ones({ 1, P.H, P.N, P.D }, dev)
  local function pcall_(pas)
    local function fwd() return pn.power_attention(q, k, v, { p = 2, causal = true, log_gate = lg, chunk = P.chunk }) end
    if pas == 'fwd' then pn.no_grad(fwd) else
      fwd():backward(g)
      q:zero_grad(); k:zero_grad(); v:zero_grad(); lg:zero_grad()
    end
  end
  local pw, pfail, ppeak, psd = {}, {}, {}, {}
  for _, pas in ipairs(PASSES) do
    local ok, err = pcall(function()
      for _ = 1, warmup do pcall_(pas) end
      ppeak[pas] = peak_of(function() pcall_(pas) end)
    end)
    if not ok then pfail[pas] = first_line(err) end
  end
  local ready = ask(string.format('case 1 %d %d %d', P.H, P.N, P.D)) == 'ok'
  for round = 1, rounds do
    for _, pas in ipairs(PASSES) do
      if not pfail[pas] then
        local ts = {}
        for _ = 1, P.reps do ts[#ts + 1] = timed(function() pcall_(pas) end) end
        push(pw, pas, ts)
      end
    end
    if ready then
      for _, pas in ipairs(PASSES) do
        if not (psd[pas] and psd[pas].skip) then
          local r = peer_time('sdpa', 'dot', true, pas, round == 1 and math.max(1, warmup) or 0, P.reps, round == 1)
          if r and r.skip then psd[pas] = r
          elseif r then
            psd[pas] = psd[pas] or { ms = {}, peak = r.peak, backend = r.backend, dtype = r.dtype }
            push(psd[pas], 'ms', r.ms)
          end
        end
      end
    end
  end
  print('| pass | ours ms | TFLOP/s | SDPA-flash causal ms | SDPA TFLOP/s | / SDPA | MiB ours / SDPA | target |')
  print('|---|---|---|---|---|---|---|---|')
  for _, pas in ipairs(PASSES) do
    if pfail[pas] then
      print(string.format('| %s | not run on CUDA: %s | | | | | | |', pas, pfail[pas]:gsub('|', '/')))
    else
      local t, tmin = med(pw[pas]), min(pw[pas])
      local s = psd[pas]
      local st = s and not s.skip and med(s.ms) or nil
      if s and s.skip then peer_notes[s.skip] = true end
      local fl = flops(1, P.H, P.N, P.D, true, pas)
      if s and s.backend then peer_used[key('sdpa', s.backend, s.dtype)] = true end
      print(string.format('| %s | %.3f / %.3f | %.3g | %s | %s | %s | %s / %s | %s |', pas, t * 1e3, tmin * 1e3, fl / t / 1e12,
        f(st and st * 1e3, '%.3f'), f(st and fl / st / 1e12, '%.3g'), f(st and t / st, '%.3f'),
        f(ppeak[pas] and ppeak[pas] / MiB, '%.4g'), f(s and s.peak and s.peak / MiB, '%.4g'),
        (pas == 'fwd+bwd' and st) and ('≤0.33× SDPA ' .. mark(t / st <= 0.33)) or ''))
    end
  end
end

print()
for _, n in ipairs(notes) do print(n) end
local pn_list = {}
for n in pairs(peer_notes) do pn_list[#pn_list + 1] = n end
table.sort(pn_list)
for _, n in ipairs(pn_list) do print('peer note: ' .. n) end
local used = {}
for u in pairs(peer_used) do used[#used + 1] = u end
table.sort(used)
if #used > 0 then print('peer ran: ' .. table.concat(used, '; ')) end
print(string.format('targets: %d met, %d missed%s%s', met, missed, peer and '' or ' (no peer: its targets were not checked)',
  dry and ' — a DRY RUN: these are not measurements and not verdicts; no GPU timing exists from it' or ''))
if peer then peer:close() end
