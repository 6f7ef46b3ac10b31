-- core/dist/reducer.c, the gradients' buckets of data parallelism (penumbra.h): in one process
-- (the sums are this rank's w · gradients: what arm/finish, sync and the autograd watcher do,
-- checked against the gradients of a plain backward) and on 2 ranks (the sums against each
-- rank's gradients added by hand, a parameter with a gradient on one rank only, the layout
-- check). penumbra/ddp.lua drives it in the runner (spec/ddp_spec.lua).
local pn = require 'penumbra'
local B = require 'penumbra_ffi'
local ffi = require 'ffi'
local check = require 'spec.helpers.check'
local mpi = require 'spec.helpers.mpi'
local C = B.C

local function reducer(params, first, cap)
  local arr = ffi.new('pn_tensor *[?]', #params)
  for i, p in ipairs(params) do arr[i - 1] = p end
  local r = C.pn_reducer_new(arr, #params, first or 2 ^ 20, cap or 25 * 2 ^ 20)
  if r == nil then error(ffi.string(C.pn_last_error()), 0) end
  return ffi.gc(r, C.pn_reducer_free)
end

local function stats(r)
  local s = ffi.new('double[4]')
  C.pn_reducer_stats(r, s)
  return { sent = s[0], early = s[1], wait = s[2], bytes = s[3] }
end

-- a small two-layer model in f64 and a loss on x: the parameters and the loss
local function model(seed)
  pn.manual_seed(seed)
  local w1 = pn.randn({ 5, 4 }, { dtype = 'f64' }):requires_grad_()
  local b1 = pn.randn({ 4 }, { dtype = 'f64' }):requires_grad_()
  local w2 = pn.randn({ 4, 3 }, { dtype = 'f64' }):requires_grad_()
  local unused = pn.randn({ 2 }, { dtype = 'f64' }):requires_grad_()
  local x = pn.randn({ 6, 5 }, { dtype = 'f64' })
  local function loss() return ((x:matmul(w1) + b1):tanh():matmul(w2) ^ 2):sum() end
  return { w1, b1, w2, unused }, loss
end

local function grads(params)
  local g = {}
  for i, p in ipairs(params) do g[i] = p.grad and p.grad:clone() or false end
  return g
end

describe('gradient buckets (core/dist/reducer.c) in one process', function()
  it('arm, backward, finish: w · the plain gradients, every bucket started inside the backward', function()
    local params, loss = model(1)
    loss():backward()
    local want = grads(params)
    for _, p in ipairs(params) do p:zero_grad() end
    -- buckets of at most 40 bytes: w2 (96 bytes) alone, b1 (32) alone, w1 alone, unused alone
    local r = reducer(params, 40, 40)
    assert.equal(4, C.pn_reducer_buckets(r))
    B.check(C.pn_reducer_arm(r, 0.25))
    loss():backward()
    B.check(C.pn_reducer_finish(r))
    for i = 1, 3 do check.assert_close(params[i].grad, want[i] * 0.25, 1e-15, 'parameter ' .. i) end
    assert.is_nil(params[4].grad, 'a parameter the backward never reached stays without a gradient')
    local s = stats(r)
    assert.equal(4, s.sent)
    assert.equal(4, s.early, 'every bucket starts while the backward runs (the unused one at once)')
    assert.equal((20 + 4 + 12 + 2 + 4) * 8, s.bytes, 'the last bucket carries one presence slot per parameter')
  end)

  it('sync (after the backward) gives the same sums, none of them early; a gradient already there is replaced', function()
    local params, loss = model(2)
    loss():backward()
    local want = grads(params)
    local r = reducer(params, 40, 40)
    B.check(C.pn_reducer_sync(r, 2))
    for i = 1, 3 do check.assert_close(params[i].grad, want[i] * 2, 1e-15, 'parameter ' .. i) end
    assert.equal(0, stats(r).early)
  end)

  it('a parameter used twice (its gradient from two edges) is sent once both have arrived', function()
    local w = pn.randn({ 3, 3 }, { dtype = 'f64' }):requires_grad_()
    local v = pn.randn({ 3 }, { dtype = 'f64' }):requires_grad_()
    local x = pn.randn({ 2, 3 }, { dtype = 'f64' })
    local function loss() return (x:matmul(w):tanh():matmul(w) + v):sum() end
    loss():backward()
    local gw = w.grad:clone()
    w:zero_grad(); v:zero_grad()
    local r = reducer({ w, v }, 8, 8)
    B.check(C.pn_reducer_arm(r, 1))
    loss():backward()
    B.check(C.pn_reducer_finish(r))
    check.assert_close(w.grad, gw, 1e-15, 'w')
  end)

  it('refuses bad use by name', function()
    local params = model(3)
    local r = reducer(params)
    assert.has_error(function() B.check(C.pn_reducer_finish(r)) end, 'ddp.finish: the reducer is not armed')
    B.check(C.pn_reducer_arm(r, 1))
    assert.has_error(function() B.check(C.pn_reducer_arm(r, 1)) end,
      'ddp.arm: the reducer is armed already (a backward ran without finish)')
    B.check(C.pn_reducer_finish(r))
    assert.has_error(function() B.check(C.pn_reducer_arm(r, math.huge)) end, 'ddp.arm: weight must be finite, got inf')
    assert.has_error(function() reducer({ params[1], params[2], params[1] }) end,
      'ddp.reducer: parameter 1 is given twice')
    assert.has_error(function() reducer({ params[1], params[1] * 2 }) end,
      'ddp.reducer: parameter 2 [5,4] is not a leaf (it came out of an op)')
    assert.has_error(function() reducer({ pn.tensor({ 1, 2 }, { dtype = 'i32' }) }) end,
      'ddp.reducer: parameter 1 is i32; gradients need f32 or f64')
    assert.has_error(function() reducer({}) end, 'ddp.reducer: needs at least one parameter, got 0')
    assert.has_error(function() reducer(params, 0, 10) end,
      'ddp.reducer: the bucket caps must be >= 1 byte, got 0 (first) and 10')
  end)
end)

describe('gradient buckets on 2 ranks', function()
  -- each rank: its own gradients (seeded by rank), the sums through the reducer with weight
  -- 1 / (rank + 1), a parameter with a gradient on rank 1 only, and both modes; rank 0 checks
  local SCRIPT = [[
local pn = require 'penumbra'
local B = require 'penumbra_ffi'
local ffi = require 'ffi'
local C = B.C
local rank = pn.dist.rank()
local function reducer(params, first, cap)
  local arr = ffi.new('pn_tensor *[?]', #params)
  for i, p in ipairs(params) do arr[i - 1] = p end
  local r = C.pn_reducer_new(arr, #params, first, cap)
  if r == nil then error(ffi.string(C.pn_last_error()), 0) end
  return ffi.gc(r, C.pn_reducer_free)
end
if (args or {}).mismatch then
  local p = pn.zeros({ rank + 2 }, { dtype = 'f64' }):requires_grad_()
  local ok, e = pcall(reducer, { p }, 64, 64)
  print('mismatch ' .. rank .. ': ' .. tostring(ok) .. ' ' .. tostring(e))
  return
end
pn.manual_seed(0)
local w = pn.randn({ 7, 5 }, { dtype = 'f64' }):requires_grad_()
local only1 = pn.randn({ 3 }, { dtype = 'f64' }):requires_grad_()
local nobody = pn.randn({ 2 }, { dtype = 'f64' }):requires_grad_()
pn.manual_seed(100 + rank)
local x = pn.randn({ 4, 7 }, { dtype = 'f64' })
local function loss()
  local l = x:matmul(w):sin():sum()
  if rank == 1 then l = l + (only1 * only1):sum() end
  return l
end
local r = reducer({ w, only1, nobody }, 64, 64)
local wt = 1 / (rank + 1)
-- by hand: each rank's w · gradients, gathered
loss():backward()
local gw, go = w.grad:clone() * wt, (only1.grad and only1.grad:clone() or pn.zeros({ 3 }, { dtype = 'f64' })) * wt
w:zero_grad(); only1:zero_grad()
local all_w = pn.dist.all_gather(gw)
local all_o = pn.dist.all_gather(go)
local want_w, want_o = all_w:select(1, 1) + all_w:select(1, 2), all_o:select(1, 1) + all_o:select(1, 2)
local function err(a, b) return ((a - b):abs():max()):item() end
for _, mode in ipairs({ 'overlap', 'after' }) do
  if mode == 'overlap' then
    B.check(C.pn_reducer_arm(r, wt)); loss():backward(); B.check(C.pn_reducer_finish(r))
  else
    loss():backward(); B.check(C.pn_reducer_sync(r, wt))
  end
  print(string.format('%s %d: w %.3g only1 %s %.3g nobody %s', mode, rank, err(w.grad, want_w),
    tostring(only1.grad ~= nil), only1.grad and err(only1.grad, want_o) or -1, tostring(nobody.grad ~= nil)))
  w:zero_grad(); only1:zero_grad()
end
local s = ffi.new('double[4]')
C.pn_reducer_stats(r, s)
print(string.format('stats %d: %d sent, %d early', rank, s[0], s[1]))
]]

  mpi.it_mpi('the sums of w · gradients over the ranks, in both modes; a gradient on one rank only; the layout agreed', function()
    local path = mpi.write_script(SCRIPT)
    local out, code = check.sh(string.format("cd '%s' && timeout 120 ./bench -n 2 --oversubscribe '%s' 2>&1", mpi.ROOT,
      path))
    assert.equal(0, code, out)
    for _, mode in ipairs({ 'overlap', 'after' }) do
      for rank = 0, 1 do
        local e, o, eo, nb = out:match(mode .. ' ' .. rank .. ': w (%S+) only1 (%a+) (%S+) nobody (%a+)')
        assert.truthy(e, out)
        assert.is_true(tonumber(e) <= 1e-14, mode .. ' rank ' .. rank .. ': w ' .. e)
        assert.equal('true', o, 'a gradient on rank 1 only reaches rank 0 too (zeros from rank 0)')
        assert.is_true(tonumber(eo) <= 1e-14, mode .. ' rank ' .. rank .. ': only1 ' .. eo)
        assert.equal('false', nb, 'no rank has a gradient: it stays without')
      end
    end
    -- w (280 bytes) alone, only1 + nobody (40 bytes + 3 presence slots) — 2 buckets a mode
    assert.matches('stats 0: 4 sent, 2 early', out, 1, true)
    assert.matches('stats 1: 4 sent, 2 early', out, 1, true)
    out, code = check.sh(string.format("cd '%s' && timeout 120 ./bench -n 2 --oversubscribe '%s' mismatch=1 2>&1",
      mpi.ROOT, path))
    assert.equal(0, code, out)
    assert.matches("mismatch 0: false ddp.reducer: rank 1's parameters differ from rank 0's", out, 1, true)
    assert.matches("mismatch 1: false ddp.reducer: rank 1's parameters differ from rank 0's", out, 1, true)
  end)
end)
