-- experiments/perf/attention_gpu.lua — penumbra's dense attention on the GPU against PyTorch on
-- the same GPU (issue 17's benchmark): SDPA with the FlashAttention backend, and the authors'
-- straightforward PyTorch cone attention under torch.compile (attention_gpu_torch.py).
--
--   ./bench experiments/perf/attention_gpu.lua [n=1024,2048,4096,8192,16384] [d=64,128]
--       [scores=dot,laplacian,umbral,penumbral,hyperbolic] [causal=0,1] [tokens=16384] [hd=2048]
--       [reps=10] [warmup=3] [torch=1]
--
-- Shapes as the issue fixes them: B·N = tokens (16k), H·D = hd (2048), so B = tokens/N and
-- H = hd/D. Cones and hyperbolic get mapped inputs (ψ for umbral, ξ for penumbral, the
-- pseudo-polar map for hyperbolic) as a model would feed them. Passes: fwd (no grad) and
-- fwd+bwd (backward of sum(out)); each timed call ends with pn.cuda.synchronize(). TFLOP/s by
-- the FlashAttention convention (DESIGN §7): forward 4·B·N²·H·D (halved when causal), backward
-- 2.5× that. Peak device memory of one fwd+bwd call beside the inputs (no N² term expected).
-- Ours runs in f32: penumbra has no bf16 dtype yet, while SDPA's flash backend needs bf16, so
-- the ratio against SDPA is ours-f32 over its bf16 (a lower bound for ours), said in the header.
-- Under the kernel interpreter the script is a dry run at tiny sizes (n=8,13, d=16, 2 heads):
-- it proves the script and the kernels run; its times mean nothing.
local pn = require 'penumbra'

args = args or {}
local bk = require 'penumbra.benchkit'
local now, median, list = bk.now, bk.median, bk.list

if not pn.cuda.available() then
  error('attention_gpu: no CUDA device; the dry run needs the interpreter build: PENUMBRA_BUILD=build-emu '
        .. 'PENUMBRA_CMAKE_ARGS=-DPN_CUDA_EMU=ON ./bench experiments/perf/attention_gpu.lua', 0)
end
local dry = pn.cuda.interpreted()
local here = (arg and arg[0] or 'experiments/perf/attention_gpu.lua'):match('^(.*)/[^/]*$') or '.'
local Ns = list(args.n, dry and '8,13' or '1024,2048,4096,8192,16384')
local Ds = list(args.d, dry and '16' or '64,128')
local scores = list(args.scores, 'dot,laplacian,umbral,penumbral,hyperbolic')
local causals = list(args.causal, '0,1')
local tokens = tonumber(args.tokens) or (dry and 26 or 16384)
local hd = tonumber(args.hd) or (dry and 32 or 2048)
local reps, warmup = tonumber(args.reps) or (dry and 1 or 10), tonumber(args.warmup) or (dry and 1 or 3)
local py, pyinfo
if not dry and args.torch ~= '0' then py, pyinfo = bk.python('torch') end
if not dry and args.torch ~= '0' and not py then print('peer: ' .. pyinfo) end

bk.header('dense attention on the GPU: penumbra (CUDA, f32) vs PyTorch SDPA-flash (bf16) and compiled cones', {
  'device: ' .. pn.cuda.device_name() .. (dry and '   (the kernel interpreter: a dry run, NOT timings)' or ''),
  string.format('B·N = %d tokens, H·D = %d; median of %d calls after %d warm-up', tokens, hd, reps, warmup) })

local MAP = { umbral = 'psi', penumbral = 'xi', hyperbolic = 'pseudopolar' }
local function inputs(score, B, H, N, D)
  pn.manual_seed(1)
  local q = pn.randn({ B, H, N, D }, { device = 'cuda' }) * 0.3
  local k = pn.randn({ B, H, N, D }, { device = 'cuda' }) * 0.3
  local v = pn.randn({ B, H, N, D }, { device = 'cuda' })
  if MAP[score] then q, k = pn.maps[MAP[score]](q), pn.maps[MAP[score]](k) end
  return q:detach():contiguous(), k:detach():contiguous(), v:detach()
end

local function time_call(fn)
  local ts = {}
  for i = 1, warmup + reps do
    pn.cuda.synchronize()
    local t0 = now()
    fn()
    pn.cuda.synchronize()
    if i > warmup then ts[#ts + 1] = now() - t0 end
    collectgarbage('collect')
  end
  return median(ts)
end

local function peer(N, B, H, D, causal)
  if not py then return {} end
  local p = io.popen(string.format('%s %s/attention_gpu_torch.py --n %d --b %d --h %d --d %d --causal %d --reps %d '
    .. '--warmup %d --cones %s 2>&1', py, here, N, B, H, D, causal, reps, warmup,
    causal == 0 and 'umbral,penumbral' or ''))
  local r = {}
  for line in p:lines() do
    local who, sc, pas, ms = line:match('^time (%S+) (%S+) %d+ (%S+) ([%d%.]+)')
    if who then r[who .. ' ' .. sc .. ' ' .. pas] = tonumber(ms) / 1e3
    elseif line:match('^torch ') then print(line)
    elseif not line:match('^%s*$') then io.stderr:write('torch: ' .. line .. '\n') end
  end
  p:close()
  return r
end

print(string.format('%-6s %4s %-3s %-11s %-7s %10s %9s %10s %10s %10s %12s', 'N', 'D', 'c', 'score', 'pass', 'ms',
  'TFLOP/s', '/our dot', '/sdpa', '/compiled', 'peak MiB'))
for _, D in ipairs(Ds) do
  for _, N in ipairs(Ns) do
    local B, H = math.max(1, math.floor(tokens / N)), math.max(1, math.floor(hd / D))
    for _, causal in ipairs(causals) do
      local theirs = peer(N, B, H, D, causal)
      local dot = {}
      for _, score in ipairs(scores) do
        local q, k, v = inputs(score, B, H, N, D)
        local o = { score = score, causal = causal == 1 }
        for _, pas in ipairs({ 'fwd', 'fwd+bwd' }) do
          local t, peak
          if pas == 'fwd' then
            t = time_call(function() pn.no_grad(function() return pn.attention(q, k, v, o) end) end)
          else
            q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
            pn.cuda.reset_peak()
            local base = pn.cuda.memory_stats().allocated
            t = time_call(function()
              pn.attention(q, k, v, o):sum():backward()
              q:zero_grad(); k:zero_grad(); v:zero_grad()
            end)
            peak = (pn.cuda.memory_stats().peak - base) / 2 ^ 20
            q:requires_grad_(false); k:requires_grad_(false); v:requires_grad_(false)
          end
          if score == 'dot' then dot[pas] = t end
          local flop = 4 * B * N * N * H * D * (causal == 1 and 0.5 or 1) * (pas == 'fwd' and 1 or 3.5)
          local sd, cp = theirs['sdpa dot ' .. pas], theirs['compiled ' .. score .. ' ' .. pas]
          print(string.format('%-6d %4d %-3d %-11s %-7s %10.3f %9.2f %10s %10s %10s %12s', N, D, causal, score, pas,
            t * 1e3, flop / t / 1e12, dot[pas] and string.format('%.3f', t / dot[pas]) or '-',
            sd and string.format('%.3f', t / sd) or '-', cp and string.format('%.3f', t / cp) or '-',
            peak and string.format('%.1f', peak) or '-'))
        end
      end
    end
  end
end
print('(ratios are time ratios: < 1 is faster than the peer; targets in issue 17: dot ≥ 0.85× SDPA-flash '
  .. 'throughput at N = 4096, cones ≤ 1.15×, laplacian ≤ 1.10×, hyperbolic ≤ 1.35× our dot)')
