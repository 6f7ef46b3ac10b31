-- experiments/perf/attention_cpu.lua — fused distance-family attention on the CPU against
-- PyTorch 2's fused scaled_dot_product_attention (SDPA, its flash-attention CPU kernel) and
-- against OpenBLAS sgemm's GFLOP/s on the same machine in the same run (DESIGN §7, issue 16).
--
--   ./bench experiments/perf/attention_cpu.lua [n=1024,2048] [d=64] [causal=0,1]
--       [scores=dot,laplacian,umbral,penumbral,hyperbolic] [passes=fwd,fwd+bwd] [reps=3] [rounds=3]
--       [threads=2] [torch=1] [naive=0] [sgemm=2048] [kernels=…] [peak=0] [torch_peak=2048,4096]
--   the issue's grid: n=1024,2048,4096,8192 d=64,128
--
-- B = 1, H = 8, f32; passes fwd and fwd+bwd (backward of sum(out·1), gradients of q, k, v).
-- Inputs as a researcher feeds them: q, k = randn·0.3, v = randn; the cones and hyperbolic get
-- q and k through their score's default map (pn.attention_variant(score).map, as the nn layers
-- apply it: umbral ψ, penumbral ξ with h = r, hyperbolic the pseudo-polar map onto the
-- hyperboloid), computed once, outside the timed calls. The peer
-- (experiments/perf/attention_cpu_torch.py, run by bk.python's interpreter with the same thread
-- count) uses the same recipes.
-- Timing: a warm-up call of everything, then `rounds` rounds; in each, per (N, D): `reps` times
-- one call of every (causal, pass) of ours, all scores of it one after another (dot first), so a
-- score's call and the dot's it is compared with are neighbours in time; then `reps` sgemm
-- calls, then one peer process timing `reps` calls of SDPA's dot (and of the naive scores with
-- naive=1). Figures: the median over every timed call of all rounds; "vs dot" is the median of
-- the ratios of neighbouring calls (a score's over the dot's just before it), which a VM whose
-- speed drifts from minute to minute moves far less than a ratio of two medians does.
-- GFLOP/s, FlashAttention's convention for every score: forward 4·B·N²·H·D, halved when causal;
-- forward+backward 3.5× the forward. sgemm: pn.matmul (OpenBLAS sgemm, split over our OpenMP
-- threads; experiments/perf/core.lua holds it against cblas_sgemm called directly) on square
-- f32 matrices of side `sgemm` (2n³ flops; a large square product is sgemm at its best).
-- Targets (issue 16): our dot ≤ 0.9× SDPA; laplacian and umbral ≤ 1.15×, penumbral ≤ 1.25×,
-- hyperbolic ≤ 1.3× our dot (same D, N, causal, pass); our dot forward ≥ 60 % of sgemm's
-- GFLOP/s at N ≥ 2048. For the cones the SDPA columns hold SDPA's dot.
-- naive=1 adds the attention the papers' reference code writes (full score matrix, softmax,
-- @ v) for each score as a second peer (the earlier comparison), with its ms and ours/naive.
-- kernels=a,b: the CPU attention microkernel (PENUMBRA_CPU_KERNEL=auto|avx512|avx2|portable
-- at start-up): with pn.set_cpu_kernel our side runs once per kernel in every round, rows
-- labelled by kernel; without it the key is ignored (said so).
-- peak=N (off by default: each call at N = 16384 takes seconds): the growth of the process's
-- resident high-water mark (/proc/self/status, reset through /proc/self/clear_refs) over the
-- inputs during one call, each in a fresh child process: ours dot and penumbral, SDPA's dot at
-- the same N; with naive=1 the naive dot at the torch_peak sizes, extrapolated ∝ N² (its N²
-- score matrices do not fit this machine at N = 16384).
local pn = require 'penumbra'
local B = require 'penumbra_ffi'
local ffi = require 'ffi'
local bk = require 'penumbra.benchkit'
local options = require 'penumbra.options'

args = args or {}
local KEYS = {}
for _, k in ipairs({ 'n', 'd', 'causal', 'scores', 'passes', 'reps', 'rounds', 'threads', 'torch', 'naive', 'sgemm',
                     'kernels', 'peak', 'torch_peak', 'mode', 'score', 'pass' }) do KEYS[k] = 'any' end
options.check('attention_cpu.lua', args, KEYS)

local list, now, median = bk.list, bk.now, bk.median
local B_, H = 1, 8
local here = (arg and arg[0] or 'experiments/perf/attention_cpu.lua'):match('^(.*)/[^/]*$') or '.'

-- q, k = randn·0.3 through the score's default map (the nn layers' map_qk), v = randn
local function inputs(score, N, D)
  pn.manual_seed(1)
  local q = pn.randn({ B_, H, N, D }) * 0.3
  local k = pn.randn({ B_, H, N, D }) * 0.3
  local v = pn.randn({ B_, H, N, D })
  local desc = pn.attention_variant(score)
  local map = desc.map
  if map == 'psi' then q, k = pn.maps.psi(q), pn.maps.psi(k)
  elseif map == 'xi' then
    local h = desc.params.r.default
    q, k = pn.maps.xi(q, { h = h }), pn.maps.xi(k, { h = h })
  elseif map == 'pseudopolar' then q, k = pn.maps.pseudopolar(q), pn.maps.pseudopolar(k)
  elseif map ~= 'none' then error("attention_cpu.lua: score '" .. score .. "' has map '" .. tostring(map) ..
    "', which this benchmark does not apply yet") end
  return q:contiguous():detach(), k:contiguous():detach(), v:detach()
end

local function one(score, pas, causal, q, k, v)
  local opts = { score = score, causal = causal }
  if pas == 'fwd' then
    pn.no_grad(function() return pn.attention(q, k, v, opts) end)
  else
    local o = pn.attention(q, k, v, opts)
    o:backward(pn.ones(o:shape()))
  end
end

local function flops(N, D, causal, pas)
  local f = 4 * B_ * N * N * H * D * (causal and 0.5 or 1)
  return pas == 'fwd' and f or 3.5 * f
end

-- ---- child mode: the peak memory of one call in a fresh process --------------------------------
if args.mode == 'peak' then
  local score, pas, N, D = args.score, args.pass, tonumber(args.n), tonumber(args.d)
  local q, k, v = inputs(score, N, D)
  if pas == 'fwd+bwd' then q:requires_grad_(); k:requires_grad_(); v:requires_grad_() end
  local base = bk.rss().VmRSS
  bk.reset_peak()
  one(score, pas, false, q, k, v)
  print(string.format('peak %d', bk.rss().VmHWM - base))
  os.exit(0)
end

-- ---- settings --------------------------------------------------------------------------------------
local threads = tonumber(args.threads) or 2
pn.set_num_threads(threads)
local Ns, Ds = list(args.n, '1024,2048'), list(args.d, '64')
local SCORES = list(args.scores, 'dot,laplacian,umbral,penumbral,hyperbolic')
for i, s in ipairs(SCORES) do -- the dot first: each score's call follows the dot's it is compared with
  if s == 'dot' and i > 1 then table.remove(SCORES, i); table.insert(SCORES, 1, 'dot'); break end
end
local PASSES = list(args.passes, 'fwd,fwd+bwd')
local CAUSALS = {}
for _, c in ipairs(list(args.causal, '0,1')) do CAUSALS[#CAUSALS + 1] = (c == 1) end
local reps, rounds = tonumber(args.reps) or 3, tonumber(args.rounds) or 3
local sgemm_n = tonumber(args.sgemm) or 2048
local naive = args.naive == '1'
for _, s in ipairs(SCORES) do pn.attention_variant(s) end -- an unknown score fails here, before any timing
for _, p in ipairs(PASSES) do
  if p ~= 'fwd' and p ~= 'fwd+bwd' then error("attention_cpu.lua: passes: '" .. p .. "' is not fwd or fwd+bwd", 0) end
end

-- the CPU attention microkernel: what PENUMBRA_CPU_KERNEL asked for, what pn.cpu_kernel says ran
local cpu_kernel, set_cpu_kernel = rawget(pn, 'cpu_kernel'), rawget(pn, 'set_cpu_kernel')
local function kernel_now()
  if type(cpu_kernel) ~= 'function' then return nil end
  local ok, r = pcall(cpu_kernel)
  return ok and tostring(r) or ('(pn.cpu_kernel failed: ' .. tostring(r) .. ')')
end
local env_kernel = os.getenv('PENUMBRA_CPU_KERNEL') or 'auto'
local kernel_lines = { string.format('CPU attention kernel: PENUMBRA_CPU_KERNEL=%s%s', env_kernel,
  os.getenv('PENUMBRA_CPU_KERNEL') and '' or ' (unset)') ..
  (cpu_kernel and ('   pn.cpu_kernel() = ' .. kernel_now()) or '   (no pn.cpu_kernel in this build)') }
local KERNELS = { kernel_now() or env_kernel }   -- one pass of ours, labelled with what runs
local switch = false                              -- set the kernel before each pass of ours
if args.kernels then
  if type(set_cpu_kernel) == 'function' then
    -- try each once: a kernel this CPU or build lacks is dropped here, not in the rounds
    local ok_list, resolved = {}, {}
    for _, name in ipairs(list(args.kernels)) do
      local ok, err = pcall(set_cpu_kernel, name)
      if ok then
        ok_list[#ok_list + 1] = name
        resolved[#resolved + 1] = name .. ' → ' .. (kernel_now() or '?')
      else
        kernel_lines[#kernel_lines + 1] = 'kernels: ' .. name .. ' dropped: ' .. tostring(err)
      end
    end
    if #ok_list == 0 then error('attention_cpu.lua: kernels=' .. args.kernels .. ': pn.set_cpu_kernel took none of them', 0) end
    KERNELS, switch = ok_list, true
    kernel_lines[#kernel_lines + 1] = 'kernels (pn.set_cpu_kernel before each of our passes; rows labelled by the name asked): ' ..
      table.concat(resolved, ', ')
  else
    kernel_lines[#kernel_lines + 1] = 'kernels=' .. tostring(args.kernels) ..
      ' ignored: this build has no pn.set_cpu_kernel (the kernel is chosen at start-up by PENUMBRA_CPU_KERNEL)'
  end
end
local function use_kernel(name) if switch then set_cpu_kernel(name) end end

-- the peer: its interpreter, torch's version, CPU capability and the SDPA backend it picks
local py, pyinfo
if args.torch ~= '0' then py, pyinfo = bk.python('torch') end
local use_torch = args.torch ~= '0' and py ~= nil
local peer_lines = {}
if args.torch == '0' then
  peer_lines[1] = 'peer: off (torch=0): no SDPA or naive columns; the dot target against SDPA is not checked'
elseif not py then
  peer_lines[1] = 'peer: PyTorch not found, so no SDPA or naive columns — ' .. pyinfo
else
  peer_lines[1] = string.format('peer: %s (%s)', py, pyinfo)
  local p = io.popen(string.format('%s %s/attention_cpu_torch.py --info --threads %d --n %d --d %s --causal %s 2>&1',
    py, here, threads, Ns[1], table.concat(Ds, ','), args.causal or '0,1'))
  local info = {}
  for line in p:lines() do
    local key, val = line:match('^info (%S+) (.*)$')
    if key == 'sdpa_backend' then
      info.backends = (info.backends and info.backends .. '; ' or '') .. val
      for b in val:gmatch('=(%u[%u_]+)') do -- one backend everywhere: say it once
        info.one = (info.one == nil or info.one == b) and b or false
      end
    elseif key then info[key] = val
    elseif not line:match('^%s*$') then io.stderr:write('torch: ' .. line .. '\n') end
  end
  p:close()
  peer_lines[2] = string.format('torch %s, CPU capability %s, %s threads; SDPA backend at N=%d: %s',
    info.torch or '?', info.cpu_capability or '?', info.threads or '?', Ns[1],
    info.one and (info.one .. ' for every D, causal and pass') or info.backends or '?')
end

-- sgemm: pn.matmul on sgemm_n² f32 matrices, the result released at once (experiments/perf/core.lua)
local ga, gb
local sgemm_times = {}
local function sgemm_call()
  local t0 = now()
  B.C.pn_release(ffi.gc(pn.matmul(ga, gb), nil))
  return now() - t0
end
if sgemm_n > 0 then
  pn.manual_seed(2)
  ga, gb = pn.randn({ sgemm_n, sgemm_n }), pn.randn({ sgemm_n, sgemm_n })
  sgemm_call()
end
local function sgemm_gflops(t) return 2 * sgemm_n ^ 3 / t / 1e9 end

local header = {
  string.format('threads: %d for both (ours OpenMP + OpenBLAS, torch.set_num_threads)', threads),
  string.format('B=%d H=%d f32; D=%s N=%s; median over %d rounds × %d calls after a warm-up, ours and the peer taking turns',
    B_, H, table.concat(Ds, ','), table.concat(Ns, ','), rounds, reps),
  'inputs: q, k = randn·0.3 (umbral ψ, penumbral ξ, hyperbolic pseudo-polar: mapped), v = randn',
  'GFLOP/s: fwd 4·B·N²·H·D (halved when causal), fwd+bwd 3.5× fwd; for the cones the SDPA columns are SDPA\'s dot',
  'vs dot: the median of the ratios of neighbouring calls (each score right after the dot, same causal and pass)',
}
for _, l in ipairs(kernel_lines) do header[#header + 1] = l end
for _, l in ipairs(peer_lines) do header[#header + 1] = l end
if sgemm_n > 0 then
  local t = {}
  for _ = 1, 3 do t[#t + 1] = sgemm_call() end
  header[#header + 1] = string.format('sgemm: pn.matmul (OpenBLAS sgemm) %d×%d · %d×%d f32 before the rounds: ' ..
    '%.1f GFLOP/s (median of 3); timed again in every round, the %% sgemm column uses that median',
    sgemm_n, sgemm_n, sgemm_n, sgemm_n, sgemm_gflops(median(t)))
else
  header[#header + 1] = 'sgemm: off (sgemm=0)'
end
bk.header('penumbra fused attention vs PyTorch SDPA (CPU)', header)

-- ---- timings --------------------------------------------------------------------------------------
local function peer_round(N, D)
  local naive_scores = naive and table.concat(SCORES, ',') or ''
  local cs = {}
  for _, c in ipairs(CAUSALS) do cs[#cs + 1] = c and '1' or '0' end
  local cmd = string.format('%s %s/attention_cpu_torch.py --threads %d --n %d --d %d --reps %d --warmup 1 ' ..
    '--causal %s --passes %s --sdpa %d --naive "%s" 2>&1', py, here, threads, N, D, reps, table.concat(cs, ','),
    table.concat(PASSES, ','), 1, naive_scores)
  local p = io.popen(cmd)
  local res = {}
  for line in p:lines() do
    local impl, sc, n, d, c, pas, all = line:match('^time (%S+) (%S+) (%d+) (%d+) (%d) (%S+) %S+ %S+ (%S+)')
    if impl then
      local key = table.concat({ impl, sc, n, d, c, pas }, ' ')
      res[key] = {}
      for ms in all:gmatch('[^,]+') do table.insert(res[key], tonumber(ms) / 1e3) end
    elseif not line:match('^%s*$') then io.stderr:write('torch: ' .. line .. '\n') end
  end
  p:close()
  return res
end
local function ckey(c) return c and '1' or '0' end
local function okey(kernel, score, N, D, c, pas) return table.concat({ kernel, score, N, D, ckey(c), pas }, ' ') end
local function pkey(impl, score, N, D, c, pas) return table.concat({ impl, score, N, D, ckey(c), pas }, ' ') end

local ours, theirs = {}, {}
local function push(t, key, x) t[key] = t[key] or {}; table.insert(t[key], x) end
for _, N in ipairs(Ns) do
  for _, D in ipairs(Ds) do
    io.stdout:flush() -- progress on stderr, after what stdout already holds
    io.stderr:write(string.format('attention_cpu.lua: N=%d D=%d …\n', N, D))
    local data = {}
    for _, score in ipairs(SCORES) do data[score] = { inputs(score, N, D) } end
    local function call(score, c, pas)
      local q, k, v = unpack(data[score])
      if pas == 'fwd+bwd' then q:requires_grad_(); k:requires_grad_(); v:requires_grad_() end
      local t0 = now()
      one(score, pas, c, q, k, v)
      local dt = now() - t0
      if pas == 'fwd+bwd' then
        q:zero_grad(); k:zero_grad(); v:zero_grad()
        q:requires_grad_(false); k:requires_grad_(false); v:requires_grad_(false)
      end
      return dt
    end
    local function each(fn) -- a (causal, pass)'s scores back to back: see "vs dot" above
      for _, c in ipairs(CAUSALS) do
        for _, pas in ipairs(PASSES) do for _, score in ipairs(SCORES) do fn(score, c, pas) end end
      end
    end
    for _, kern in ipairs(KERNELS) do use_kernel(kern); each(call) end -- warm-up
    for _ = 1, rounds do
      for _, kern in ipairs(KERNELS) do
        use_kernel(kern)
        for _ = 1, reps do
          each(function(score, c, pas) push(ours, okey(kern, score, N, D, c, pas), call(score, c, pas)) end)
          collectgarbage('collect')
        end
      end
      if sgemm_n > 0 then for _ = 1, reps do table.insert(sgemm_times, sgemm_call()) end end
      if use_torch then
        for key, ts in pairs(peer_round(N, D)) do for _, t in ipairs(ts) do push(theirs, key, t) end end
      end
    end
    data = nil
    collectgarbage('collect')
  end
end

-- ---- the table --------------------------------------------------------------------------------------
local sgemm_gf = #sgemm_times > 0 and sgemm_gflops(median(sgemm_times)) or nil
if sgemm_gf then
  print(string.format('sgemm %d³ f32 in the rounds: %.1f GFLOP/s (median of %d calls)', sgemm_n, sgemm_gf, #sgemm_times))
end
local TARGET_VS_DOT = { laplacian = 1.15, umbral = 1.15, penumbral = 1.25, hyperbolic = 1.3 }
local met, missed = 0, 0
local function mark(ok) if ok then met = met + 1 else missed = missed + 1 end return ok and 'ok' or 'MISSED' end
local function f(x, fmt) return x and string.format(fmt, x) or '-' end

local head = string.format('%-8s %-10s %4s %5s %3s %-7s %9s %9s %7s %7s %7s %6s %6s', 'kernel', 'score', 'D', 'N',
  'cau', 'pass', 'ours ms', 'SDPA ms', 'o/SDPA', 'GF/s', 'SDPA GF', '%sgemm', 'vs dot')
if naive then head = head .. string.format(' %9s %7s', 'naive ms', 'o/naive') end
print(head .. '  target')
for _, kern in ipairs(KERNELS) do
  for _, N in ipairs(Ns) do
    for _, D in ipairs(Ds) do
      for _, c in ipairs(CAUSALS) do
        for _, pas in ipairs(PASSES) do
          local dots = ours[okey(kern, 'dot', N, D, c, pas)]
          local dot = dots and median(dots)
          local sd = theirs[pkey('sdpa', 'dot', N, D, c, pas)]
          sd = sd and median(sd)
          for _, score in ipairs(SCORES) do
            local os_ = ours[okey(kern, score, N, D, c, pas)]
            if os_ then
              local o = median(os_)
              local fl = flops(N, D, c, pas)
              local gf = fl / o / 1e9
              local vs -- the median of neighbouring calls' ratios (the i-th call of each: the same turn)
              if dots and #dots == #os_ then
                local r = {}
                for i = 1, #os_ do r[i] = os_[i] / dots[i] end
                vs = median(r)
              end
              local targets = {}
              if score == 'dot' then
                if sd then targets[#targets + 1] = '≤0.9×SDPA ' .. mark(o / sd <= 0.9) end
                if pas == 'fwd' and N >= 2048 and sgemm_gf then
                  targets[#targets + 1] = '≥60%sgemm ' .. mark(gf / sgemm_gf >= 0.6)
                end
              elseif TARGET_VS_DOT[score] and vs then
                targets[#targets + 1] = string.format('≤%.2f×dot %s', TARGET_VS_DOT[score], mark(vs <= TARGET_VS_DOT[score]))
              end
              local line = string.format('%-8s %-10s %4d %5d %3s %-7s %9.2f %9s %7s %7.1f %7s %6s %6s', kern, score, D, N,
                c and 'yes' or 'no', pas, o * 1e3, f(sd and sd * 1e3, '%.2f'), f(sd and o / sd, '%.3f'), gf,
                f(sd and fl / sd / 1e9, '%.1f'), f(sgemm_gf and 100 * gf / sgemm_gf, '%.0f%%'), f(vs, '%.2f'))
              if naive then
                local nv = theirs[pkey('naive', score, N, D, c, pas)]
                nv = nv and median(nv)
                line = line .. string.format(' %9s %7s', f(nv and nv * 1e3, '%.2f'), f(nv and o / nv, '%.3f'))
              end
              print(line .. '  ' .. table.concat(targets, '; '))
            end
          end
        end
      end
    end
  end
end
print(string.format('targets: %d met, %d missed%s', met, missed,
  use_torch and '' or ' (no peer: the SDPA targets were not checked)'))
print()

-- ---- peak memory ------------------------------------------------------------------------------------
local peakN = tonumber(args.peak) or 0
if peakN > 0 then
  local D = Ds[1]
  local function child(cmd)
    local p = io.popen(cmd .. ' 2>&1')
    local out = p:read('*a')
    p:close()
    return tonumber(out:match('peak (%-?%d+)')), out
  end
  local bench = os.getenv('PENUMBRA_HOME') and (os.getenv('PENUMBRA_HOME') .. '/bench') or './bench'
  print(string.format('peak memory over the inputs during one call, not causal (q, k, v: %.1f MB each at N = %d, D = %d)',
    B_ * H * peakN * D * 4 / 2 ^ 20, peakN, D))
  for _, pas in ipairs(PASSES) do
    for _, score in ipairs({ 'dot', 'penumbral' }) do
      local t0 = now()
      local bytes, out = child(string.format('%s %s/attention_cpu.lua mode=peak score=%s pass=%s n=%d d=%d threads=%d',
        bench, here, score, pas, peakN, D, threads))
      if bytes then
        print(string.format('  ours  %-10s %-8s N=%-6d %9.1f MB   (%.1f s)', score, pas, peakN, bytes / 2 ^ 20, now() - t0))
      else
        print('  ours ' .. score .. ' ' .. pas .. ': failed: ' .. out)
      end
    end
    if use_torch then
      local bytes, out = child(string.format('%s %s/attention_cpu_torch.py --threads %d --n %d --d %d --peak sdpa:dot:%s:0',
        py, here, threads, peakN, D, pas))
      print(bytes and string.format('  SDPA  %-10s %-8s N=%-6d %9.1f MB', 'dot', pas, peakN, bytes / 2 ^ 20)
        or ('  SDPA dot ' .. pas .. ': failed: ' .. out))
    end
  end
  if use_torch and naive then
    for _, pas in ipairs(PASSES) do
      local last
      for _, N in ipairs(list(args.torch_peak, '2048,4096')) do
        local bytes = child(string.format('%s %s/attention_cpu_torch.py --threads %d --n %d --d %d --peak naive:dot:%s:0',
          py, here, threads, N, D, pas))
        if bytes then
          print(string.format('  naive %-10s %-8s N=%-6d %9.1f MB', 'dot', pas, N, bytes / 2 ^ 20))
          last = { N = N, bytes = bytes }
        end
      end
      if last then
        print(string.format('  naive %-10s %-8s N=%-6d %9.1f MB   (extrapolated ∝ N² from N=%d; one N² f32 matrix is %.1f MB)',
          'dot', pas, peakN, last.bytes * (peakN / last.N) ^ 2 / 2 ^ 20, last.N, B_ * H * peakN * peakN * 4 / 2 ^ 20))
      end
    end
  end
end
