-- Losses (core/ops/loss.c, lua/penumbra/ops/loss.lua): cross_entropy (label smoothing,
-- ignore_index, reductions), nll_loss, binary_cross_entropy_with_logits, mse_loss. Values
-- against plain-Lua references, f64 gradchecks, f32 gradients against f64, and errors.
-- Targets are 0-based class ids as stored in the tensor.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local check = require 'spec.helpers.check'
local flatten, vals, assert_close, assert_error_matching = check.flatten, check.vals, check.assert_close, check.assert_error_matching
local distinct = check.distinct

local inf = math.huge

-- ---- helpers --------------------------------------------------------------------------------

local function rows(flat, n, c) return check.nest(flat, { n, c }) end

-- plain-Lua references ------------------------------------------------------------------------
local function log_softmax_row(row)
  local m = -inf
  for _, v in ipairs(row) do m = math.max(m, v) end
  local s = 0
  for _, v in ipairs(row) do s = s + math.exp(v - m) end
  local r = {}
  for j, v in ipairs(row) do r[j] = v - m - math.log(s) end
  return r
end

local function reduce_ref(losses, kept, reduction)
  if reduction == 'none' then return losses end
  local s = 0
  for _, v in ipairs(losses) do s = s + v end
  if reduction == 'sum' then return { s } end
  return { s / kept }
end

-- x: nested (N, C) Lua table; target: 0-based ids
local function ref_cross_entropy(x, target, eps, ignore, reduction)
  local losses, kept = {}, 0
  for i, row in ipairs(x) do
    local t = target[i]
    if t == ignore then
      losses[i] = 0
    else
      kept = kept + 1
      local lp = log_softmax_row(row)
      local smooth = 0
      for _, v in ipairs(lp) do smooth = smooth - v end
      losses[i] = (1 - eps) * -lp[t + 1] + eps * smooth / #row
    end
  end
  return reduce_ref(losses, kept, reduction)
end

local function ref_nll(x, target, ignore, reduction)
  local losses, kept = {}, 0
  for i, row in ipairs(x) do
    if target[i] == ignore then losses[i] = 0
    else kept = kept + 1; losses[i] = -row[target[i] + 1] end
  end
  return reduce_ref(losses, kept, reduction)
end

local function ref_elementwise(xs, ys, f, reduction)
  local losses = {}
  for i = 1, #xs do losses[i] = f(xs[i], ys[i]) end
  return reduce_ref(losses, #xs, reduction)
end
local function bce(x, y) -- log(1 + e^x) - x·y, written as x·(1-y) + log(1 + e^-x) for x > 0
  if x > 0 then return x * (1 - y) + math.log(1 + math.exp(-x)) end
  return -x * y + math.log(1 + math.exp(x))
end
local function mse(x, y) return (x - y) ^ 2 end

local REDUCTIONS = { 'none', 'mean', 'sum' }
local N, C = 6, 5
local X = distinct(N * C, -3, 3, 1)
local TARGET = { 0, 4, 2, 1, 3, 2 }

-- ---- cross entropy --------------------------------------------------------------------------------
describe('cross_entropy', function()
  it('matches a plain-Lua reference for every reduction, label smoothing and ignore_index (f32, f64)', function()
    for _, dt in ipairs({ 'f32', 'f64' }) do
      local rtol = dt == 'f32' and 2e-6 or 1e-13
      local logits = pn.tensor(rows(X, N, C), { dtype = dt })
      for _, tdt in ipairs({ 'i32', 'i64' }) do
        for _, eps in ipairs({ 0, 0.1, 0.5 }) do
          for _, ign in ipairs({ -100, 2 }) do -- with 2, rows 3 and 6 are ignored
            for _, red in ipairs(REDUCTIONS) do
              local target = pn.tensor(TARGET, { dtype = tdt })
              local y = pn.cross_entropy(logits, target, { label_smoothing = eps, ignore_index = ign, reduction = red })
              local ref = ref_cross_entropy(rows(X, N, C), TARGET, eps, ign, red)
              local what = string.format('ce %s %s eps=%g ignore=%d %s', dt, tdt, eps, ign, red)
              assert.same(red == 'none' and { N } or {}, y:shape(), what)
              assert_close(vals(y), ref, rtol, what)
            end
          end
        end
      end
    end
  end)

  it('defaults: mean, no smoothing, ignore_index -100; accepts a Lua list of targets', function()
    local logits = pn.tensor(rows(X, N, C), { dtype = 'f64' })
    local ref = ref_cross_entropy(rows(X, N, C), TARGET, 0, -100, 'mean')
    assert.near(ref[1], pn.cross_entropy(logits, pn.tensor(TARGET, { dtype = 'i64' })):item(), 1e-13)
    assert.near(ref[1], pn.cross_entropy(logits, TARGET):item(), 1e-13)
    local t2 = { 0, -100, 2, 1, -100, 2 }
    local r2 = ref_cross_entropy(rows(X, N, C), t2, 0, -100, 'mean')
    assert.near(r2[1], pn.cross_entropy(logits, t2):item(), 1e-13)
  end)

  it('reads non-contiguous logits (a transposed view)', function()
    local base = pn.tensor(rows(X, C, N), { dtype = 'f64' }) -- (C, N)
    local logits = base:t()                                 -- (N, C), strides (1, N)
    local ref = ref_cross_entropy(logits:totable(), TARGET, 0.2, -100, 'none')
    assert_close(vals(pn.cross_entropy(logits, TARGET, { label_smoothing = 0.2, reduction = 'none' })), ref, 1e-13,
      'transposed')
  end)

  it('is stable for large logits', function()
    local logits = pn.tensor({ { 1000, 0, -1000 }, { -500, -500, -500 } })
    local y = vals(pn.cross_entropy(logits, { 1, 2 }, { reduction = 'none' }))
    assert.near(1000, y[1], 1e-3)
    assert.near(math.log(3), y[2], 1e-5)
  end)

  it('every row ignored: mean is NaN (0/0, like torch), sum is 0', function()
    local logits = pn.tensor(rows(X, N, C))
    local all = { -100, -100, -100, -100, -100, -100 }
    local m = pn.cross_entropy(logits, all):item()
    assert.is_true(m ~= m)
    assert.equal(0, pn.cross_entropy(logits, all, { reduction = 'sum' }):item())
  end)

  it('passes f64 gradchecks (every reduction, smoothing, ignored rows, transposed logits)', function()
    for _, red in ipairs(REDUCTIONS) do
      for _, eps in ipairs({ 0, 0.3 }) do
        local x = pn.tensor(rows(X, N, C), { dtype = 'f64', requires_grad = true })
        local target = pn.tensor({ 0, 4, 2, 1, 3, 2 }, { dtype = 'i64' })
        local o = { label_smoothing = eps, ignore_index = 2, reduction = red }
        gradcheck(function(t) return pn.cross_entropy(t, target, o) end, { x })
        local xt = pn.tensor(rows(X, C, N), { dtype = 'f64', requires_grad = true })
        gradcheck(function(t) return pn.cross_entropy(t:t(), target, o) end, { xt })
      end
    end
  end)

  it('f32 gradient agrees with f64 (softmax - onehot, 1000 classes)', function()
    pn.manual_seed(2)
    local x64 = pn.randn({ 4, 1000 }, { dtype = 'f64' })
    local target = { 3, 999, 0, 500 }
    local g = {}
    for _, dt in ipairs({ 'f32', 'f64' }) do
      local x = x64:to(dt):detach():requires_grad_()
      pn.cross_entropy(x, target, { label_smoothing = 0.1 }):backward()
      g[dt] = vals(x.grad)
    end
    assert_close(g.f32, g.f64, 1e-6, 'ce grad')
  end)

  it('errors name cross_entropy and the row, value, shapes or dtype', function()
    local logits = pn.tensor(rows(X, N, C))
    assert_error_matching(function() return pn.cross_entropy(logits, { 0, 1, 5, 0, 0, 0 }) end,
      'cross_entropy', 'target[3] = 5', '5 classes')
    assert_error_matching(function() return pn.cross_entropy(logits, { 0, 1, 2, -1, 0, 0 }) end,
      'cross_entropy', 'target[4] = -1')
    assert_error_matching(function() return pn.cross_entropy(logits, { 0, 1 }) end, 'cross_entropy', '[2]', '[6,5]')
    assert_error_matching(function() return pn.cross_entropy(logits, pn.tensor({ 0, 1, 2, 0, 0, 0 })) end,
      'cross_entropy', 'f32', 'i32 or i64')
    assert_error_matching(function() return pn.cross_entropy(pn.ones({ 2, 3, 4 }), { 0, 1 }) end, 'cross_entropy',
      '2-D', '[2,3,4]')
    assert_error_matching(function() return pn.cross_entropy(logits, TARGET, { label_smoothing = 1 }) end,
      'cross_entropy', 'label_smoothing')
    assert_error_matching(function() return pn.cross_entropy(logits, TARGET, { reduction = 'avg' }) end,
      'cross_entropy', 'reduction')
    assert_error_matching(function()
      return pn.cross_entropy(pn.ones({ 6, 5 }, { dtype = 'i64' }), TARGET)
    end, 'cross_entropy', 'i64')
  end)
end)

-- ---- nll ------------------------------------------------------------------------------------------
describe('nll_loss', function()
  it('matches a plain-Lua reference and equals cross_entropy after log_softmax', function()
    for _, dt in ipairs({ 'f32', 'f64' }) do
      local rtol = dt == 'f32' and 2e-6 or 1e-13
      local logp = pn.tensor(rows(X, N, C), { dtype = dt })
      for _, ign in ipairs({ -100, 2 }) do
        for _, red in ipairs(REDUCTIONS) do
          local y = pn.nll_loss(logp, TARGET, { ignore_index = ign, reduction = red })
          assert_close(vals(y), ref_nll(rows(X, N, C), TARGET, ign, red), rtol, 'nll ' .. dt .. ' ' .. red)
        end
      end
      local x = pn.tensor(rows(X, N, C), { dtype = dt })
      assert.near(pn.cross_entropy(x, TARGET):item(), pn.nll_loss(x:log_softmax(), TARGET):item(), 1e-5)
    end
    local lt = pn.tensor(rows(X, C, N), { dtype = 'f64' }):t()
    assert_close(vals(pn.nll_loss(lt, TARGET, { reduction = 'none' })), ref_nll(lt:totable(), TARGET, -100, 'none'),
      1e-13, 'nll transposed')
  end)

  it('passes f64 gradchecks (every reduction, ignored rows)', function()
    for _, red in ipairs(REDUCTIONS) do
      local x = pn.tensor(rows(X, N, C), { dtype = 'f64', requires_grad = true })
      gradcheck(function(t) return pn.nll_loss(t, TARGET, { ignore_index = 2, reduction = red }) end, { x })
      gradcheck(function(t) return pn.nll_loss(t:log_softmax(), TARGET, { reduction = red }) end, { x })
    end
  end)

  it('errors name nll_loss', function()
    local logp = pn.tensor(rows(X, N, C))
    assert_error_matching(function() return pn.nll_loss(logp, { 0, 0, 0, 0, 0, 7 }) end, 'nll_loss', 'target[6] = 7')
    assert_error_matching(function() return pn.nll_loss(logp, { 0, 0 }) end, 'nll_loss', '[6,5]')
    assert_error_matching(function() return pn.nll_loss(logp, pn.tensor(TARGET, { dtype = 'f64' })) end,
      'nll_loss', 'f64')
  end)
end)

-- ---- elementwise losses -------------------------------------------------------------------------------
local ELEM = {
  { name = 'binary_cross_entropy_with_logits', cname = 'bce_with_logits', f = bce, xlo = -6, xhi = 6, ylo = 0, yhi = 1 },
  { name = 'mse_loss', cname = 'mse_loss', f = mse, xlo = -2, xhi = 2, ylo = -2, yhi = 2 },
}

for _, L in ipairs(ELEM) do
  describe(L.name, function()
    local xs, ys = distinct(12, L.xlo, L.xhi, 3), distinct(12, L.ylo, L.yhi, 4)
    it('matches a plain-Lua reference for every reduction (f32, f64, transposed inputs)', function()
      for _, dt in ipairs({ 'f32', 'f64' }) do
        local rtol = dt == 'f32' and 2e-6 or 1e-13
        local x, y = pn.tensor(rows(xs, 3, 4), { dtype = dt }), pn.tensor(rows(ys, 3, 4), { dtype = dt })
        for _, red in ipairs(REDUCTIONS) do
          local out = pn[L.name](x, y, { reduction = red })
          assert.same(red == 'none' and { 3, 4 } or {}, out:shape())
          assert_close(vals(out), ref_elementwise(xs, ys, L.f, red), rtol, L.name .. ' ' .. dt .. ' ' .. red)
        end
        assert_close(vals(pn[L.name](x, y)), ref_elementwise(xs, ys, L.f, 'mean'), rtol, 'default mean')
        local xt, yt = x:t(), y:t()
        assert_close(vals(pn[L.name](xt, yt, { reduction = 'none' })),
          ref_elementwise(vals(xt), vals(yt), L.f, 'none'), rtol, L.name .. ' transposed')
      end
    end)

    it('passes f64 gradchecks for both inputs (every reduction)', function()
      for _, red in ipairs(REDUCTIONS) do
        local x = pn.tensor(rows(xs, 3, 4), { dtype = 'f64', requires_grad = true })
        local y = pn.tensor(rows(ys, 3, 4), { dtype = 'f64', requires_grad = true })
        gradcheck(function(a, b) return pn[L.name](a, b, { reduction = red }) end, { x, y })
        gradcheck(function(a, b) return pn[L.name](a:t(), b:t(), { reduction = red }) end, { x, y })
      end
    end)

    it('errors name the op: shape mismatch, dtype mismatch, integer inputs, bad reduction', function()
      local x = pn.ones({ 3, 4 })
      assert_error_matching(function() return pn[L.name](x, pn.ones({ 4, 3 })) end, L.cname, '[3,4]', '[4,3]')
      assert_error_matching(function() return pn[L.name](x, pn.ones({ 3, 4 }, { dtype = 'f64' })) end, L.cname, 'f64')
      assert_error_matching(function() return pn[L.name](pn.ones({ 2 }, { dtype = 'i32' }), pn.ones({ 2 })) end,
        L.cname, 'i32')
      assert_error_matching(function() return pn[L.name](x, x, { reduction = 'max' }) end, L.cname, 'reduction')
      assert_error_matching(function() return pn[L.name](x, x, { reduce = 'sum' }) end, L.cname,
        "unknown option 'reduce' (valid: reduction)")
    end)
  end)
end

describe('binary_cross_entropy_with_logits stability', function()
  it('is finite and exact for large |x|', function()
    local x = pn.tensor({ 100, -100, 30, -30 }, { dtype = 'f64' })
    local y = pn.tensor({ 0, 1, 1, 0 }, { dtype = 'f64' })
    local l = vals(pn.binary_cross_entropy_with_logits(x, y, { reduction = 'none' }))
    assert_close(l, { 100, 100, math.log(1 + math.exp(-30)), math.log(1 + math.exp(-30)) }, 1e-12, 'bce large')
  end)
end)

describe('loss ownership', function()
  it('frees every tensor, byte and node (forward, backward, error paths)', function()
    for _ = 1, 3 do collectgarbage('collect') end
    local t0, b0, n0 = pn.live_tensors(), pn.live_bytes(), pn.live_nodes()
    for i = 1, 20 do
      local dt = i % 2 == 0 and 'f64' or 'f32'
      local red = REDUCTIONS[i % 3 + 1]
      local x = pn.randn({ 6, 5 }, { dtype = dt, requires_grad = true })
      local y = pn.rand({ 6, 5 }, { dtype = dt, requires_grad = (i % 4 == 0) })
      local losses = {
        pn.cross_entropy(x, TARGET, { label_smoothing = 0.1, ignore_index = 2, reduction = red }),
        pn.nll_loss(x:log_softmax(), TARGET, { reduction = red }),
        pn.binary_cross_entropy_with_logits(x, y, { reduction = red }),
        pn.mse_loss(x:t(), y:t(), { reduction = red }),
      }
      for _, l in ipairs(losses) do l:sum():backward() end
      pcall(function() return pn.cross_entropy(x, { 0, 0, 0, 0, 0, 9 }) end)
      pcall(function() return pn.mse_loss(x, pn.ones({ 2 }, { dtype = dt })) end)
    end
    for _ = 1, 3 do collectgarbage('collect') end
    assert.is_true(pn.live_tensors() <= t0, "live counter grew: " .. pn.live_tensors() .. " > " .. t0) -- <=: tensors left by earlier spec files may be freed meanwhile
    assert.is_true(pn.live_bytes() <= b0, "live counter grew: " .. pn.live_bytes() .. " > " .. b0) -- <=: tensors left by earlier spec files may be freed meanwhile
    assert.is_true(pn.live_nodes() <= n0, "live counter grew: " .. pn.live_nodes() .. " > " .. n0) -- <=: tensors left by earlier spec files may be freed meanwhile
  end)
end)
