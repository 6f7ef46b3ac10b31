-- experiments/perf/core.lua — core CPU performance against peers (DESIGN §7).
--
--   ./bench experiments/perf/core.lua [reps=N (MLP steps, default 31)] [quick=1 (no n=2048)]
--
-- (1) f32 GEMM: pn.matmul vs cblas_sgemm called directly (FFI) from the same libopenblas,
--     n = 256, 1024, 2048; GFLOP/s = 2n³/time; ratio ours/peer (target ≥ 0.95).
-- (2) per-call overhead of a 16-element add from Lua, median µs per call (target ≤ 2 µs).
-- (3) one MLP training step (batch 64, 784→512→512→10, relu, cross_entropy, forward +
--     backward, no update): ours vs PyTorch on the CPU with the same thread count
--     (experiments/perf/core_torch.py, run by the peer Python, bk.python).
-- Every figure: warm-up, then the median of ≥ 5 runs; ours and the peer interleaved.
local pn = require 'penumbra'
local B = require 'penumbra_ffi'
local ffi = require 'ffi'
local bk = require 'penumbra.benchkit'

args = args or {}
local quick = args.quick == '1'

ffi.cdef [[
  void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                   const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
  char *openblas_get_config(void);
]]
local CblasRowMajor, CblasNoTrans = 101, 111
local blas = ffi.load('openblas')   -- the library libpenumbra links (already in the process)

local now, median = bk.now, bk.median

-- ---- header -------------------------------------------------------------------------------
local threads = pn.num_threads()
bk.header('penumbra core benchmark', { 'OpenBLAS config: ' .. ffi.string(blas.openblas_get_config()) })

-- ---- (1) GEMM ---------------------------------------------------------------------------------
print('(1) f32 GEMM C = A·B, n×n, GFLOP/s (2n³ / median time)')
print('    pn.matmul: result released at once; GC\'d: result left to the Lua GC (fresh pages each call)')
print(string.format('    %-6s %12s %14s %8s   %-5s %10s %8s   %s', 'n', 'pn.matmul', 'cblas_sgemm', 'ratio', '≥0.95',
  'GC\'d', 'ratio', 'max|diff|'))
local gemm_rows = {}
for _, n in ipairs(quick and { 256, 1024 } or { 256, 1024, 2048 }) do
  pn.manual_seed(1)
  local a, b = pn.randn(n, n), pn.randn(n, n)
  local c = pn.empty(n, n)
  local pa = ffi.cast('const float *', a:data_ptr())
  local pb = ffi.cast('const float *', b:data_ptr())
  local pc = ffi.cast('float *', c:data_ptr())
  local reps = n <= 256 and 15 or (n <= 1024 and 5 or 3)   -- per block; 5 blocks each
  -- ours: the result is released at once (as refcounting would), so the allocator can
  -- reuse its pages; ours_gc leaves it to the Lua GC and pays for fresh pages each call.
  local variants = {
    ours = function() B.C.pn_release(ffi.gc(pn.matmul(a, b), nil)) end,
    peer = function()
      blas.cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, pa, n, pb, n, 0, pc, n)
    end,
    ours_gc = function() local r = pn.matmul(a, b) end,
  }
  -- rounds of short blocks, the variants taking turns, so a burst of load on the
  -- machine hits all of them alike; the median is over every timed call
  local times = { ours = {}, peer = {}, ours_gc = {} }
  for _, k in ipairs({ 'ours', 'peer', 'ours_gc' }) do for _ = 1, 2 do variants[k]() end end
  for _ = 1, 5 do
    for _, k in ipairs({ 'ours', 'peer', 'ours_gc' }) do
      local f, t = variants[k], times[k]
      for _ = 1, reps do
        local t0 = now()
        f()
        t[#t + 1] = now() - t0
      end
    end
  end
  collectgarbage('collect')
  local to, tp, tg = times.ours, times.peer, times.ours_gc
  -- same numbers? (ours vs the peer's C)
  local diff = pn.sub(pn.matmul(a, b), c):abs():max():item()
  local flop = 2 * n ^ 3
  local go, gp, gg = flop / median(to) / 1e9, flop / median(tp) / 1e9, flop / median(tg) / 1e9
  gemm_rows[#gemm_rows + 1] = { n = n, ours = go, peer = gp }
  print(string.format('    %-6d %12.1f %14.1f %8.3f   %-5s %10.1f %8.3f   %.2g', n, go, gp, go / gp,
    go / gp >= 0.95 and 'ok' or 'BELOW', gg, gg / gp, diff))
end
print()

-- ---- (2) per-call overhead ----------------------------------------------------------------------
print('(2) per-call overhead, 16-element f32 add from Lua (median over batches of 100 calls)')
do
  local x, y = pn.randn(16), pn.randn(16)
  local C = B.C
  local function batch_lua()
    local t0 = now()
    for _ = 1, 100 do local r = x:add(y) end
    return (now() - t0) / 100
  end
  local function batch_c()   -- the C call and release alone, no Lua wrapper / ffi.gc
    local t0 = now()
    for _ = 1, 100 do C.pn_release(C.pn_binary(C.PN_ADD, x, y)) end
    return (now() - t0) / 100
  end
  for _ = 1, 50 do batch_lua(); batch_c() end
  local tl, tc = {}, {}
  for i = 1, 400 do tl[i] = batch_lua(); tc[i] = batch_c() end
  local ml, mc = median(tl) * 1e6, median(tc) * 1e6
  print(string.format('    x:add(y) (Lua API):       %6.3f µs   target ≤ 2 µs: %s', ml, ml <= 2 and 'ok' or 'ABOVE'))
  print(string.format('    pn_binary + pn_release:   %6.3f µs   (C only, for reference)', mc))
end
print()

-- ---- (3) MLP training step ---------------------------------------------------------------------------
local batch, sizes = 64, { 784, 512, 512, 10 }
local warmup, reps = 5, tonumber(args.reps) or 31
print(string.format('(3) MLP training step (forward + backward, no update): batch %d, %s, relu, cross_entropy',
  batch, table.concat(sizes, '→')))
local ours_ms, ours_block
do
  pn.manual_seed(0)
  local params = {}
  for i = 1, #sizes - 1 do
    params[#params + 1] = pn.randn(sizes[i], sizes[i + 1]):mul(1 / math.sqrt(sizes[i])):requires_grad_()
    params[#params + 1] = pn.zeros(sizes[i + 1]):requires_grad_()
  end
  local x = pn.randn(batch, sizes[1])
  local y = pn.rand(batch):mul(sizes[#sizes]):to('i64')
  local function step()
    local h = x
    for i = 1, #params, 2 do
      h = h:matmul(params[i]):add(params[i + 1])
      if i + 2 <= #params then h = h:relu() end
    end
    local loss = pn.cross_entropy(h, y)
    loss:backward()
    for _, p in ipairs(params) do p.grad = nil end
    return loss
  end
  for _ = 1, warmup do step() end
  local t = {}
  -- ours runs once before and once after the PyTorch subprocess; the median covers both
  ours_block = function()
    for _ = 1, reps do
      local t0 = now()
      step()
      t[#t + 1] = (now() - t0) * 1e3
    end
    return median(t)
  end
  ours_block()
end

local torch_ms, torch_info
local root = B.root
local py, pyinfo = bk.python('torch')
if py then
  local cmd = string.format('%s %s/experiments/perf/core_torch.py --threads %d --batch %d --sizes %s --warmup %d --reps %d 2>&1',
    py, root, threads, batch, table.concat(sizes, ','), warmup, reps)
  local f = io.popen(cmd)
  local out = f:read('*a')
  f:close()
  torch_ms = tonumber(out:match('median_ms%s+([%d%.]+)'))
  torch_info = out:match('(torch [^\n]*)')
  if not torch_ms then print('    PyTorch run failed:\n' .. out) end
else
  print('    peer: ' .. pyinfo)
end
ours_ms = ours_block()
print(string.format('    %-28s %10s', '', 'median ms'))
print(string.format('    %-28s %10.3f', 'penumbra', ours_ms))
if torch_ms then
  print(string.format('    %-28s %10.3f', torch_info or 'torch', torch_ms))
  print(string.format('    speed ratio torch/ours: %.3f  (> 1: penumbra faster)', torch_ms / ours_ms))
end
print()

-- ---- summary ----------------------------------------------------------------------------------------------
print('summary')
for _, r in ipairs(gemm_rows) do
  print(string.format('    gemm n=%-5d ratio ours/cblas = %.3f', r.n, r.ours / r.peer))
end
if torch_ms then print(string.format('    mlp step     ratio torch/ours = %.3f', torch_ms / ours_ms)) end
