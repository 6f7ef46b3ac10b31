-- Reductions (core/ops/reduce.c, lua/penumbra/ops/reduce.lua): sum, mean, max, min,
-- logsumexp, prod over any set of dims with keepdim, argmax/argmin, p-norms; their
-- gradients and errors. References are plain Lua loops over values read back with
-- totable(), never the op under test.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local check = require 'spec.helpers.check'
local flatten, vals, assert_close, assert_error_matching = check.flatten, check.vals, check.assert_close, check.assert_error_matching
local distinct, nest = check.distinct, check.nest

local inf = math.huge

-- ---- helpers --------------------------------------------------------------------------------



-- Naive reduction of flat row-major values of `shape` over the 1-based dims in `dims`
-- (nil = all). Collects each output's values in order, then applies f(list).
-- Returns the flat output values and the output shape.
local function naive_reduce(flat, shape, dims, keepdim, f)
  local nd = #shape
  local red = {}
  if dims == nil then for d = 1, nd do red[d] = true end
  else
    if type(dims) == 'number' then dims = { dims } end
    for _, d in ipairs(dims) do red[d < 0 and d + nd + 1 or d] = true end
  end
  local oshape, kshape = {}, {}
  for d = 1, nd do
    kshape[d] = red[d] and 1 or shape[d]
    if not red[d] or keepdim then oshape[#oshape + 1] = kshape[d] end
  end
  local nout = 1
  for d = 1, nd do nout = nout * kshape[d] end
  local groups = {}
  for o = 1, nout do groups[o] = {} end
  local n = #flat
  for lin = 0, n - 1 do
    -- multi-index of lin, then the keepdim output index
    local rem, idx = lin, {}
    for d = nd, 1, -1 do idx[d] = rem % shape[d]; rem = math.floor(rem / shape[d]) end
    local o = 0
    for d = 1, nd do o = o * kshape[d] + (red[d] and 0 or idx[d]) end
    local g = groups[o + 1]
    g[#g + 1] = flat[lin + 1]
  end
  local out = {}
  for o = 1, nout do out[o] = f(groups[o]) end
  return out, oshape
end

local REF = {
  sum = function(l) local s = 0; for _, v in ipairs(l) do s = s + v end; return s end,
  mean = function(l) local s = 0; for _, v in ipairs(l) do s = s + v end; return s / #l end,
  max = function(l) local m = -inf; for _, v in ipairs(l) do if v > m then m = v end end; return m end,
  min = function(l) local m = inf; for _, v in ipairs(l) do if v < m then m = v end end; return m end,
  prod = function(l) local p = 1; for _, v in ipairs(l) do p = p * v end; return p end,
  logsumexp = function(l)
    local s = 0
    for _, v in ipairs(l) do s = s + math.exp(v) end -- values are small: no overflow here
    return math.log(s)
  end,
}
local function ref_norm(p)
  return function(l)
    if p == inf then local m = 0; for _, v in ipairs(l) do m = math.max(m, math.abs(v)) end; return m end
    local s = 0
    for _, v in ipairs(l) do s = s + math.abs(v) ^ p end
    return s ^ (1 / p)
  end
end
local function ref_argext(is_max)
  return function(l)
    local b, bi = l[1], 1
    for i = 2, #l do
      if (is_max and l[i] > b) or (not is_max and l[i] < b) then b, bi = l[i], i end
    end
    return bi - 1 -- 0-based, like every index tensor
  end
end

-- 'all' stands for nil (every dim): a nil inside a list literal would stop ipairs
local DIMS = { 'all', 1, 2, 3, -1, { 1, 3 }, { 2, 3 }, { 1, 2 }, { 3, 1 }, { 1, 2, 3 } }
local function dims_arg(d) if d == 'all' then return nil end return d end
local function dims_label(d)
  if d == 'all' then return 'all' end
  if type(d) == 'number' then return tostring(d) end
  return '{' .. table.concat(d, ',') .. '}'
end

-- (2, 3, 4) contiguous and three non-contiguous inputs with the same shape
local function inputs(dt, lo, hi)
  local shape = { 2, 3, 4 }
  local flat = distinct(24, lo, hi, 3)
  local x = pn.tensor(nest(flat, shape), { dtype = dt })
  local big = pn.tensor(nest(distinct(4 * 3 * 2, lo, hi, 3), { 4, 3, 2 }), { dtype = dt })
  local wide = pn.tensor(nest(distinct(2 * 3 * 6, lo, hi, 5), { 2, 3, 6 }), { dtype = dt })
  return {
    contiguous = x,
    transposed = big:transpose(1, 3),          -- (2, 3, 4) with strides (1, 2, 6)
    permuted = pn.tensor(nest(distinct(24, lo, hi, 7), { 3, 4, 2 }), { dtype = dt }):permute(3, 1, 2),
    sliced = wide:narrow(3, 2, 4),             -- (2, 3, 4) with row stride 6
  }
end

-- ---- values -----------------------------------------------------------------------------------
describe('reductions', function()
  for _, name in ipairs({ 'sum', 'mean', 'max', 'min', 'logsumexp', 'prod' }) do
    it(name .. ' matches a naive reference over every dims/keepdim combination (f32, f64, non-contiguous)', function()
      for _, dt in ipairs({ 'f32', 'f64' }) do
        local rtol = dt == 'f32' and 2e-6 or 1e-13
        for kind, x in pairs(inputs(dt, 0.5, 1.5)) do
          local flat, shape = vals(x), x:shape()
          for _, d in ipairs(DIMS) do
            for _, keep in ipairs({ false, true }) do
              local y = x[name](x, dims_arg(d), keep)
              local ref, oshape = naive_reduce(flat, shape, dims_arg(d), keep, REF[name])
              local what = string.format('%s %s %s dims=%s keepdim=%s', name, dt, kind, dims_label(d), tostring(keep))
              assert.same(oshape, y:shape(), what .. ' shape')
              assert.equal(dt, y:dtype(), what .. ' dtype')
              assert_close(vals(y), ref, rtol, what)
            end
          end
        end
      end
    end)
  end

  it('no dims means every dim; module functions pn.sum(x) etc.', function()
    local x = pn.tensor({ { 1, 2 }, { 3, 4 } })
    assert.equal(10, pn.sum(x):item())
    assert.same({}, pn.sum(x):shape())
    assert.same({ 1, 1 }, x:sum(nil, true):shape())
    assert.equal(24, pn.prod(x):item())
    assert.equal(4, pn.max(x):item())
  end)

  it('integer tensors: sum/prod give i64 (exact), max/min keep the dtype', function()
    local x = pn.tensor({ { 1, -2, 3 }, { 4, 5, -6 } }, { dtype = 'i32' })
    local s = x:sum(2)
    assert.equal('i64', s:dtype())
    assert.same({ 2, 3 }, s:totable())
    assert.same({ -6, -120 }, x:prod(2):totable())
    assert.equal('i32', x:max(1):dtype())
    assert.same({ 4, 5, 3 }, x:max(1):totable())
    assert.same({ -2, -6 }, x:min(2):totable())
    local big = pn.tensor({ 2 ^ 53, 1, 1 }, { dtype = 'i64' })
    local bs = big:sum()
    assert.equal(2 ^ 53 + 2, tonumber(require('ffi').cast('int64_t *', bs:data_ptr())[0])) -- a double sum gives 2^53
    local u = pn.tensor({ 200, 100, 7 }, { dtype = 'u8' })
    assert.equal(307, u:sum():item())
    assert.equal(200, u:max():item())
  end)

  it('empty reductions: sum 0, prod 1, mean NaN, logsumexp -inf; kept dims survive', function()
    local e = pn.zeros({ 2, 0 }, { dtype = 'f64' })
    assert.same({ 0, 0 }, e:sum(2):totable())
    assert.same({ 1, 1 }, e:prod(2):totable())
    local m = e:mean(2):totable()
    assert.is_true(m[1] ~= m[1])
    assert.same({ -inf, -inf }, e:logsumexp(2):totable())
    assert.same({ 0 }, e:sum(1):shape())
    assert.same({ 0, 0 }, e:norm(2, 2):totable())
  end)

  it('0-dim tensors reduce to themselves (dim 1 / -1 accepted)', function()
    local s = pn.tensor(3.5, { dtype = 'f64' })
    assert.equal(3.5, s:sum():item())
    assert.equal(3.5, s:max(-1):item())
    assert.equal(3.5, s:mean(1):item())
    assert.same({}, s:sum(1):shape())
  end)

  it('max/min propagate NaN; logsumexp handles -inf and +inf', function()
    local x = pn.tensor({ 1, 0 / 0, 3 }, { dtype = 'f64' })
    assert.is_true(x:max():item() ~= x:max():item())
    assert.is_true(x:min():item() ~= x:min():item())
    assert.equal(-inf, pn.tensor({ -inf, -inf }, { dtype = 'f64' }):logsumexp():item())
    assert.equal(inf, pn.tensor({ 1, inf }, { dtype = 'f64' }):logsumexp():item())
    assert.near(math.log(2) + 1, pn.tensor({ 1, 1, -inf }, { dtype = 'f64' }):logsumexp():item(), 1e-15)
  end)

  it('logsumexp is stable for large inputs', function()
    local x = pn.tensor({ { 1000, 1000 }, { -1000, -1001 } }, { dtype = 'f32' })
    local y = vals(x:logsumexp(2))
    assert.near(1000 + math.log(2), y[1], 1e-3)
    assert.near(-1000 + math.log(1 + math.exp(-1)), y[2], 1e-3)
  end)

  it('large f32 sums (last dim, all dims, first dim) are accurate and identical across thread counts', function()
    pn.manual_seed(7)
    local x = pn.randn({ 3, 40000 })
    local flat = vals(x)
    local ref_all, ref_rows = 0, { 0, 0, 0 }
    for i, v in ipairs(flat) do
      ref_all = ref_all + v
      local r = math.floor((i - 1) / 40000) + 1
      ref_rows[r] = ref_rows[r] + v
    end
    local threads = pn.num_threads()
    local results = {}
    for _, nt in ipairs({ 1, 2 }) do
      pn.set_num_threads(nt)
      results[nt] = { all = x:sum():item(), rows = vals(x:sum(2)), cols = vals(x:sum(1)), mean = x:mean():item() }
    end
    pn.set_num_threads(threads)
    assert.near(ref_all, results[1].all, 1e-3)
    assert.near(ref_all / 120000, results[1].mean, 1e-7)
    assert_close(results[1].rows, ref_rows, 1e-6, 'row sums')
    assert.equal(results[1].all, results[2].all)
    assert.same(results[1].rows, results[2].rows)
    assert.same(results[1].cols, results[2].cols)
    local c = vals(x:sum(1))
    assert.near(flat[1] + flat[40001] + flat[80001], c[1], 1e-5)
  end)
end)

describe('argmax / argmin', function()
  it('return 0-based i64 indices matching a naive reference (every dim, keepdim, non-contiguous)', function()
    for _, dt in ipairs({ 'f32', 'f64', 'i64' }) do
      for kind, x in pairs(inputs(dt == 'i64' and 'f64' or dt, -50, 50)) do
        if dt == 'i64' then x = (x:contiguous()):to('i64') end
        local flat, shape = vals(x), x:shape()
        for _, d in ipairs({ 1, 2, 3, -1 }) do
          for _, keep in ipairs({ false, true }) do
            for fname, is_max in pairs({ argmax = true, argmin = false }) do
              local y = x[fname](x, d, keep)
              local ref, oshape = naive_reduce(flat, shape, d, keep, ref_argext(is_max))
              local what = string.format('%s %s %s dim=%d keepdim=%s', fname, dt, kind, d, tostring(keep))
              assert.equal('i64', y:dtype(), what)
              assert.same(oshape, y:shape(), what)
              assert.same(ref, vals(y), what)
            end
          end
        end
      end
    end
  end)

  it('ties give the first index; no dim gives the flat position; NaN wins', function()
    local x = pn.tensor({ { 1, 5, 5 }, { 2, 2, 0 } })
    assert.same({ 1, 0 }, x:argmax(2):totable())
    assert.same({ 0, 2 }, x:argmin(2):totable())
    assert.equal(1, x:argmax():item())
    assert.equal(5, x:argmin():item())
    assert.equal(2, x:t():argmax():item()) -- x:t() is {{1,2},{5,2},{5,0}}: flat row-major position 2
    assert.equal(1, pn.argmax(pn.tensor({ 1, 0 / 0, 3 })):item())
  end)

  it('give index tensors that gather, index_select and cross_entropy take as they are', function()
    local x = pn.tensor({ { 0.1, 3, -1 }, { 7, 2, 2 }, { -4, -5, -3 } }, { dtype = 'f64' })
    local am = x:argmax(2, true)
    assert.same({ { 3 }, { 7 }, { -3 } }, x:gather(2, am):totable())
    local sel = x:index_select(2, x:argmax(2)):totable() -- column argmax(row i) of every row
    for i, m in ipairs({ 3, 7, -3 }) do assert.equal(m, sel[i][i]) end
    local loss = pn.cross_entropy(x * 100, x:argmax(2))
    assert.is_true(loss:item() < 1e-6)
  end)
end)

-- ---- norms ------------------------------------------------------------------------------------
describe('norm', function()
  it('p = 1, 2, 3, 0.5, inf match a naive reference over dims/keepdim (f32, f64, non-contiguous)', function()
    for _, dt in ipairs({ 'f32', 'f64' }) do
      local rtol = dt == 'f32' and 3e-6 or 1e-13
      for kind, x in pairs(inputs(dt, -2, 2)) do
        local flat, shape = vals(x), x:shape()
        for _, p in ipairs({ 1, 2, 3, 0.5, inf }) do
          for _, d in ipairs({ 'all', 2, -1, { 1, 3 } }) do
            for _, keep in ipairs({ false, true }) do
              local y = x:norm(p, dims_arg(d), keep)
              local ref, oshape = naive_reduce(flat, shape, dims_arg(d), keep, ref_norm(p))
              local what = string.format('norm p=%g %s %s dims=%s keep=%s', p, dt, kind, dims_label(d), tostring(keep))
              assert.same(oshape, y:shape(), what)
              assert_close(vals(y), ref, rtol, what)
            end
          end
        end
      end
    end
  end)

  it('defaults to p = 2 over every dim; accepts \'inf\'', function()
    local x = pn.tensor({ { 3, -4 }, { 0, 0 } })
    assert.near(5, x:norm():item(), 1e-6)
    assert.near(4, x:norm('inf'):item(), 1e-6)
    assert.near(5, pn.norm(x, 2, 2):totable()[1], 1e-6)
  end)
end)

-- ---- gradients --------------------------------------------------------------------------------
describe('reduction gradients', function()
  local function leaf(lo, hi, seed, shape)
    shape = shape or { 2, 3, 4 }
    local n = 1
    for _, s in ipairs(shape) do n = n * s end
    return pn.tensor(nest(distinct(n, lo, hi, seed), shape), { dtype = 'f64', requires_grad = true })
  end

  for _, name in ipairs({ 'sum', 'mean', 'max', 'min', 'logsumexp', 'prod' }) do
    it(name .. ' passes f64 gradchecks over several dims/keepdim (and through a transposed view)', function()
      for _, d in ipairs({ 'all', 1, -1, { 1, 3 }, { 2 } }) do
        for _, keep in ipairs({ false, true }) do
          local x = leaf(0.5, 1.5, 11)
          local dd = d ~= 'all' and d or nil
          gradcheck(function(t) return t[name](t, dd, keep) end, { x })
          gradcheck(function(t) return t:transpose(1, 3)[name](t:transpose(1, 3), dd, keep) end, { x })
        end
      end
    end)
  end

  it('norm passes f64 gradchecks for p = 1, 2, 3, 1.5, inf', function()
    for _, p in ipairs({ 1, 2, 3, 1.5, inf }) do
      for _, d in ipairs({ 'all', 2, { 1, 3 } }) do
        local x = leaf(-2, 2, 13)
        local dd = d ~= 'all' and d or nil
        gradcheck(function(t) return t:norm(p, dd, true) end, { x })
        gradcheck(function(t) return t:norm(p, dd) end, { x })
      end
    end
  end)

  it('prod gradient is exact with one zero and with two zeros in a group', function()
    local x = pn.tensor({ { 2, 0, 3 }, { 0, 4, 0 }, { 1, 2, 3 } }, { dtype = 'f64', requires_grad = true })
    x:prod(2):sum():backward()
    assert.same({ { 0, 6, 0 }, { 0, 0, 0 }, { 6, 3, 2 } }, x.grad:totable())
    gradcheck(function(t) return t:prod(2) end, { x })
  end)

  it('max/min split the gradient evenly between tied extremes (documented choice)', function()
    local x = pn.tensor({ { 1, 3, 3 }, { 2, 0, 0 } }, { dtype = 'f64', requires_grad = true })
    x:max(2):sum():backward()
    assert.same({ { 0, 0.5, 0.5 }, { 1, 0, 0 } }, x.grad:totable())
    x:zero_grad()
    x:min():backward()
    assert.same({ { 0, 0, 0 }, { 0, 0.5, 0.5 } }, x.grad:totable())
  end)

  it('norm gradient at 0 is 0, not NaN (p = 1, 2, 3, inf)', function()
    for _, p in ipairs({ 1, 2, 3, inf, 0.5 }) do
      local x = pn.zeros({ 2, 3 }, { dtype = 'f64', requires_grad = true })
      x:norm(p):backward()
      assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, x.grad:totable(), 'p=' .. p)
      local y = pn.tensor({ { 0, 3 }, { 0, -4 } }, { dtype = 'f64', requires_grad = true })
      y:norm(p, 2):sum():backward()
      for _, v in ipairs(vals(y.grad)) do assert.is_true(v == v, 'p=' .. p .. ': NaN in gradient') end
    end
  end)

  it('f32 gradients of sum/mean over the last dim broadcast g back', function()
    local x = pn.ones({ 2, 3 }, { requires_grad = true })
    x:mean(2):sum():backward()
    assert_close(vals(x.grad), { 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3 }, 1e-6, 'mean grad')
  end)
end)

-- ---- errors -----------------------------------------------------------------------------------
describe('reduction errors', function()
  local x = pn.ones({ 2, 3 })
  it('dim out of range names the op', function()
    assert_error_matching(function() return x:sum(3) end, 'sum', 'out of range')
    assert_error_matching(function() return x:max({ 1, -3 }) end, 'max', 'out of range')
    assert_error_matching(function() return x:argmax(4) end, 'argmax', 'out of range')
    assert_error_matching(function() return x:norm(2, 5) end, 'norm', 'out of range')
  end)
  it('a repeated dim names the op', function()
    assert_error_matching(function() return x:mean({ 1, -2 }) end, 'mean', 'repeated')
  end)
  it('bad p names norm and the value', function()
    assert_error_matching(function() return x:norm(0) end, 'norm', 'p must be positive')
    assert_error_matching(function() return x:norm(-1) end, 'norm', '-1')
    assert_error_matching(function() return x:norm(0 / 0) end, 'norm')
  end)
  it('float-only reductions on integer tensors name the op and the dtype', function()
    local i = pn.tensor({ 1, 2 }, { dtype = 'i64' })
    assert_error_matching(function() return i:mean() end, 'mean', 'i64')
    assert_error_matching(function() return i:logsumexp() end, 'logsumexp', 'i64')
    assert_error_matching(function() return i:norm() end, 'norm', 'i64')
  end)
  it('max/min/argmax of an empty dim name the op and the shape', function()
    local e = pn.zeros({ 2, 0 })
    assert_error_matching(function() return e:max(2) end, 'max', '[2,0]')
    assert_error_matching(function() return e:argmin(2) end, 'argmin', '[2,0]')
  end)
  it('a non-tensor argument names the op', function()
    assert_error_matching(function() return pn.sum(3) end, 'sum')
  end)
end)

describe('reduction ownership', function()
  it('frees every tensor, byte and node (forward, backward, error paths)', function()
    for _ = 1, 3 do collectgarbage('collect') end
    local t0, b0, n0 = pn.live_tensors(), pn.live_bytes(), pn.live_nodes()
    for i = 1, 20 do
      local x = pn.randn({ 3, 4, 5 }, { dtype = 'f64', requires_grad = (i % 2 == 0) })
      local outs = {
        x:sum({ 1, 3 }), x:mean(2, true), x:max(-1), x:min(), x:logsumexp(2), x:prod(1),
        x:norm(), x:norm(1, 2), x:norm(math.huge, { 1, 2 }, true), x:norm(3),
        x:transpose(1, 3):sum(2), x:permute(3, 1, 2):max({ 1, 3 }),
        x:argmax(2), x:argmin(), x:transpose(1, 2):argmax(),
      }
      if x.requires_grad then
        for k = 1, 10 do outs[k]:sum():backward() end
        outs[11]:sum():backward()
        outs[12]:sum():backward()
      end
      pcall(function() return x:sum(9) end)
      pcall(function() return x:norm(-1) end)
      pcall(function() return pn.zeros({ 2, 0 }):max(2) end)
    end
    for _ = 1, 3 do collectgarbage('collect') end
    assert.is_true(pn.live_tensors() <= t0, "live counter grew: " .. pn.live_tensors() .. " > " .. t0) -- <=: tensors left by earlier spec files may be freed meanwhile
    assert.is_true(pn.live_bytes() <= b0, "live counter grew: " .. pn.live_bytes() .. " > " .. b0) -- <=: tensors left by earlier spec files may be freed meanwhile
    assert.is_true(pn.live_nodes() <= n0, "live counter grew: " .. pn.live_nodes() .. " > " .. n0) -- <=: tensors left by earlier spec files may be freed meanwhile
  end)
end)
