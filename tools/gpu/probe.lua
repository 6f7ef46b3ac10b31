-- One dense attention call on the GPU, timed, and checked: bf16 against f32, one head of each
-- against the CPU in f64. `mode=info` prints what pn.cuda sees and stops. Sizes: B=, H=, N=, D=
-- (default 4, 32, 4096, 64 — the benchmark's N = 4096 shape). Wall clock between synchronisations,
-- with the process's CPU time beside it. Under ncu (tools/gpu/run.sh ncu) the first call of each
-- kernel is the one profiled. `mode=power`: instead, the benchmark's power attention call (p = 2,
-- chunked, gated, causal; H=, N=, D=, chunk= default 8, 65536, 64, 128), forward and
-- forward+backward, timed (tools/gpu/run.sh power: each of its kernels' time under ncu).
local pn = pn or require('penumbra')
local a = args or {}
io.stdout:setvbuf('line')
print('cuda', pn.cuda.available(), pn.cuda.available() and pn.cuda.device_name() or '')
if a.mode == 'info' or not pn.cuda.available() then return end
local now = require('penumbra.benchkit').now
local function wall(fn, n)
  fn(); pn.cuda.synchronize(); collectgarbage('collect')
  local best, cpu = math.huge, 0
  for _ = 1, n do
    pn.cuda.synchronize()
    local c0, t0 = os.clock(), now()
    fn(); pn.cuda.synchronize()
    local dt, dc = now() - t0, os.clock() - c0
    if dt < best then best, cpu = dt, dc end
    collectgarbage('collect')
  end
  return string.format('%.3f ms wall (cpu %.3f ms)', best * 1e3, cpu * 1e3)
end
if a.mode == 'power' then
  local H, N, D, C = tonumber(a.H or 8), tonumber(a.N or 65536), tonumber(a.D or 64), tonumber(a.chunk or 128)
  local dev = { device = 'cuda' }
  pn.manual_seed(7)
  local q, k, v = pn.randn({ 1, H, N, D }, dev), pn.randn({ 1, H, N, D }, dev), pn.randn({ 1, H, N, D }, dev)
  local lg = pn.rand({ 1, H, N }, dev) * -0.1
  print(string.format('power attention p = 2, chunk %d, gated, causal: B=1 H=%d N=%d D=%d', C, H, N, D))
  local function call(qq, kk, vv, gg)
    return pn.power_attention(qq, kk, vv, { p = 2, causal = true, log_gate = gg, chunk = C })
  end
  print('forward', wall(function() pn.no_grad(function() call(q, k, v, lg) end) end, tonumber(a.reps or 2)))
  print('forward+backward', wall(function()
    local qq, kk, vv, gg = q:detach():requires_grad_(), k:detach():requires_grad_(), v:detach():requires_grad_(),
      lg:detach():requires_grad_()
    call(qq, kk, vv, gg):sum():backward()
  end, tonumber(a.reps or 2)))
  return
end
local function maxdiff(x, y) return (x:to('cpu') - y:to('cpu')):abs():max():item() end
local B, H, N, D = tonumber(a.B or 4), tonumber(a.H or 32), tonumber(a.N or 4096), tonumber(a.D or 64)
local dev = { device = 'cuda' }
pn.manual_seed(1)
local q, k, v = pn.randn({ B, H, N, D }, dev) * 0.3, pn.randn({ B, H, N, D }, dev) * 0.3, pn.randn({ B, H, N, D }, dev)
print(string.format('B=%d H=%d N=%d D=%d, dot', B, H, N, D))
for _, prec in ipairs({ 'bf16', 'f32' }) do
  local o = { score = 'dot', precision = prec ~= 'f32' and prec or nil }
  print('forward ' .. prec, wall(function() pn.no_grad(function() pn.attention(q, k, v, o) end) end, 3))
  print('forward+backward ' .. prec, wall(function()
    local qq, kk, vv = q:detach():requires_grad_(), k:detach():requires_grad_(), v:detach():requires_grad_()
    pn.attention(qq, kk, vv, o):sum():backward()
  end, 2))
end
local ob = pn.no_grad(function() return pn.attention(q, k, v, { score = 'dot', precision = 'bf16' }) end)
local of = pn.no_grad(function() return pn.attention(q, k, v, { score = 'dot' }) end)
print('max|bf16 − f32|', maxdiff(ob, of), 'max|f32|', of:abs():max():item())
local function head(t) return t:narrow(1, 1, 1):narrow(2, 1, 1):contiguous() end
local q1, k1, v1 = head(q), head(k), head(v)
local ref = pn.attention(q1:to('cpu'):to('f64'), k1:to('cpu'):to('f64'), v1:to('cpu'):to('f64'), { score = 'dot' })
print('head 1 against the f64 CPU: f32', maxdiff(pn.attention(q1, k1, v1, { score = 'dot' }):to('f64'), ref),
  'bf16', maxdiff(pn.attention(q1, k1, v1, { score = 'dot', precision = 'bf16' }):to('f64'), ref),
  'bf16 (the full call)', maxdiff(head(ob):to('f64'), ref))
