-- softmax / log_softmax (core/ops/softmax.c), layer_norm (core/ops/norm.c) and dropout
-- (core/ops/dropout.c) through lua/penumbra/ops/nn.lua: values against plain-Lua references
-- (contiguous and non-contiguous inputs, every dim), f64 gradchecks, f32 gradients against
-- f64 ones, dropout statistics and determinism, and errors.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local check = require 'spec.helpers.check'
local flatten, vals, assert_close, assert_error_matching = check.flatten, check.vals, check.assert_close, check.assert_error_matching
local distinct, nest = check.distinct, check.nest

local inf = math.huge

-- ---- helpers --------------------------------------------------------------------------------



local function numel(shape) local n = 1; for _, s in ipairs(shape) do n = n * s end; return n end

-- Apply f to every line along 1-based dim d of flat row-major values of shape; f(list) -> list.
local function along(flat, shape, d, f)
  local nd = #shape
  if d < 0 then d = d + nd + 1 end
  local inner = 1
  for k = d + 1, nd do inner = inner * shape[k] end
  local len, outer = shape[d], numel(shape) / (inner * shape[d])
  local out = {}
  for o = 0, outer - 1 do
    for i = 0, inner - 1 do
      local line = {}
      for r = 0, len - 1 do line[r + 1] = flat[o * len * inner + r * inner + i + 1] end
      local res = f(line)
      for r = 0, len - 1 do out[o * len * inner + r * inner + i + 1] = res[r + 1] end
    end
  end
  return out
end

local function ref_softmax(line)
  local m = -inf
  for _, v in ipairs(line) do m = math.max(m, v) end
  local s = 0
  for _, v in ipairs(line) do s = s + math.exp(v - m) end
  local r = {}
  for i, v in ipairs(line) do r[i] = math.exp(v - m) / s end
  return r
end
local function ref_log_softmax(line)
  local m = -inf
  for _, v in ipairs(line) do m = math.max(m, v) end
  local s = 0
  for _, v in ipairs(line) do s = s + math.exp(v - m) end
  local r = {}
  for i, v in ipairs(line) do r[i] = v - m - math.log(s) end
  return r
end

-- (2, 3, 4)-shaped inputs: contiguous, transposed, permuted, sliced
local function inputs(dt, lo, hi)
  return {
    contiguous = pn.tensor(nest(distinct(24, lo, hi, 1), { 2, 3, 4 }), { dtype = dt }),
    transposed = pn.tensor(nest(distinct(24, lo, hi, 2), { 4, 3, 2 }), { dtype = dt }):transpose(1, 3),
    permuted = pn.tensor(nest(distinct(24, lo, hi, 3), { 3, 4, 2 }), { dtype = dt }):permute(3, 1, 2),
    sliced = pn.tensor(nest(distinct(36, lo, hi, 4), { 2, 3, 6 }), { dtype = dt }):narrow(3, 2, 4),
  }
end

local function leaf(shape, lo, hi, seed)
  return pn.tensor(nest(distinct(numel(shape), lo, hi, seed), shape), { dtype = 'f64', requires_grad = true })
end

-- ---- softmax --------------------------------------------------------------------------------------
describe('softmax / log_softmax', function()
  for name, ref in pairs({ softmax = ref_softmax, log_softmax = ref_log_softmax }) do
    it(name .. ' matches a plain-Lua reference along every dim (f32, f64, non-contiguous)', function()
      for _, dt in ipairs({ 'f32', 'f64' }) do
        local rtol = dt == 'f32' and 2e-6 or 1e-13
        for kind, x in pairs(inputs(dt, -3, 3)) do
          for _, d in ipairs({ 1, 2, 3, -1, -2 }) do
            local y = x[name](x, d)
            local what = string.format('%s %s %s dim=%d', name, dt, kind, d)
            assert.same(x:shape(), y:shape(), what)
            assert.equal(dt, y:dtype(), what)
            assert_close(vals(y), along(vals(x), x:shape(), d, ref), rtol, what)
          end
        end
      end
    end)

    it(name .. ' defaults to the last dim; pn.' .. name .. ' is the same function', function()
      local x = pn.tensor(nest(distinct(12, -2, 2, 5), { 3, 4 }), { dtype = 'f64' })
      assert.same(vals(x[name](x, -1)), vals(x[name](x)))
      assert.same(vals(x[name](x, 1)), vals(pn[name](x, 1)))
    end)

    it(name .. ' on long rows and long columns (f32 fast paths) matches the f64 result', function()
      pn.manual_seed(3)
      local x64 = pn.randn({ 7, 300 }, { dtype = 'f64' })
      local x32 = x64:to('f32')
      for _, d in ipairs({ 1, 2 }) do
        local tol = name == 'softmax' and 1e-6 or 2e-6
        assert_close(vals(x32[name](x32, d)), vals(x64[name](x64, d)), tol, name .. ' f32 vs f64 dim ' .. d)
      end
    end)
  end

  it('is stable for large logits and gives 0 probability to -inf', function()
    local x = pn.tensor({ { 1000, 1001, -inf }, { -1000, -1000, -1000 } })
    local y = vals(x:softmax())
    local e = math.exp(-1)
    assert_close(y, { e / (1 + e), 1 / (1 + e), 0, 1 / 3, 1 / 3, 1 / 3 }, 1e-6, 'softmax')
    local l = vals(x:log_softmax())
    assert.near(-math.log(1 + e), l[2], 1e-4)
    assert.equal(-inf, l[3])
  end)

  -- f32: e^(x − max) below e^-80 is +0 (pn_fast_expf_nonpos, as the attention softmax), never a
  -- subnormal (each costs a microcode assist on x86); above it the f64 values to 1e-6
  it('f32 weights below e^-80 of the row maximum are +0, never subnormal (softmax, log_softmax, cross entropy)', function()
    local row = {}
    for j = 1, 64 do row[j] = -2 * (j - 1) end -- 0 … −126: e^-82 … e^-126 would be tiny but nonzero
    local FLT_MIN = 1.1754943508222875e-38
    local function check_row(got, want, what, tol)
      for j = 1, #want do
        local g, w = got[j], want[j]
        assert(g == 0 or math.abs(g) >= FLT_MIN, what .. ': element ' .. j .. ' is subnormal: ' .. g)
        if row[j] < -80 then
          assert(g == 0, what .. ': element ' .. j .. ' (x − max = ' .. row[j] .. ') should be 0, got ' .. g)
        else
          assert(math.abs(g - w) <= (tol or 1e-6) * math.abs(w) + 1e-30, what .. ': element ' .. j .. ' got ' .. g .. ', want ' .. w)
        end
      end
    end
    local x64 = pn.tensor({ row }, { dtype = 'f64' })
    local want = vals(x64:softmax(2))
    check_row(vals(pn.tensor({ row }, { dtype = 'f32' }):softmax(2)), want, 'softmax, last dim')
    check_row(vals(pn.tensor({ row }, { dtype = 'f32' }):t():contiguous():softmax(1)), want, 'softmax, dim 1')
    -- log_softmax's backward: gx = g − e^y·Σg, with g one-hot on the first column: −e^y elsewhere
    local x = pn.tensor({ row }, { dtype = 'f32' }):requires_grad_(true)
    local onehot = {}
    for j = 1, 64 do onehot[j] = j == 1 and 1 or 0 end
    x:log_softmax(2):backward(pn.tensor({ onehot }, { dtype = 'f32' }))
    local gx = vals(x.grad)
    gx[1] = 1 - gx[1] -- = e^y₁
    for j = 2, 64 do gx[j] = -gx[j] end
    check_row(gx, want, 'log_softmax backward', 1e-5) -- e^y of the rounded y: |y|·6e-8 relative
    -- cross entropy's gradient is softmax − one-hot (no smoothing): the same weights
    local xc = pn.tensor({ row }, { dtype = 'f32' }):requires_grad_(true)
    pn.cross_entropy(xc, pn.tensor({ 63 }, { dtype = 'i64' }), { reduction = 'sum' }):backward() -- class 63: the last
    local gc = vals(xc.grad)
    gc[64] = gc[64] + 1
    check_row(gc, want, 'cross_entropy gradient', 1e-5) -- e^(x − lse) of the rounded difference
  end)

  it('rows sum to 1 for every dim', function()
    local x = pn.randn({ 3, 5, 7 })
    for d = 1, 3 do
      local s = vals(x:softmax(d):sum(d))
      for _, v in ipairs(s) do assert.near(1, v, 1e-6) end
    end
  end)

  it('handles 0-dim and empty tensors', function()
    assert.equal(1, pn.tensor(2.5):softmax():item())
    assert.equal(0, pn.tensor(2.5):log_softmax(1):item())
    assert.same({ 0, 3 }, pn.zeros({ 0, 3 }):softmax():shape())
  end)

  for _, name in ipairs({ 'softmax', 'log_softmax' }) do
    it(name .. ' passes f64 gradchecks along every dim (and through a transposed view)', function()
      for _, d in ipairs({ 1, 2, 3, -1 }) do
        local x = leaf({ 2, 3, 4 }, -2, 2, 9)
        gradcheck(function(t) return t[name](t, d) end, { x })
        gradcheck(function(t) return t:transpose(1, 3)[name](t:transpose(1, 3), d) end, { x })
      end
    end)

    it(name .. ' f32 gradients (rows and columns) agree with f64', function()
      pn.manual_seed(11)
      local x64 = pn.randn({ 5, 70 }, { dtype = 'f64' })
      local w64 = pn.randn({ 5, 70 }, { dtype = 'f64' })
      for _, d in ipairs({ 1, 2 }) do
        local grads = {}
        for _, dt in ipairs({ 'f32', 'f64' }) do
          local x = x64:to(dt):detach():requires_grad_()
          x[name](x, d):backward(w64:to(dt))
          grads[dt] = vals(x.grad)
        end
        assert_close(grads.f32, grads.f64, 2e-5, name .. ' grad dim ' .. d)
      end
    end)
  end

  it('errors name the op: bad dim, integer dtype', function()
    local x = pn.ones({ 2, 3 })
    assert_error_matching(function() return x:softmax(3) end, 'softmax', 'out of range')
    assert_error_matching(function() return x:log_softmax(-3) end, 'log_softmax', 'out of range')
    assert_error_matching(function() return pn.tensor({ 1, 2 }, { dtype = 'i64' }):softmax() end, 'softmax', 'i64')
    assert_error_matching(function() return pn.softmax(3) end, 'softmax')
  end)
end)

-- ---- layer_norm ---------------------------------------------------------------------------------
local function ref_layer_norm(flat, shape, w, b, eps)
  return along(flat, shape, -1, function(line)
    local n, mean, var = #line, 0, 0
    for _, v in ipairs(line) do mean = mean + v end
    mean = mean / n
    for _, v in ipairs(line) do var = var + (v - mean) ^ 2 end
    var = var / n
    local r = {}
    for i, v in ipairs(line) do
      r[i] = (v - mean) / math.sqrt(var + eps) * (w and w[i] or 1) + (b and b[i] or 0)
    end
    return r
  end)
end

describe('layer_norm', function()
  it('matches a plain-Lua reference with and without weight/bias (f32, f64, non-contiguous)', function()
    for _, dt in ipairs({ 'f32', 'f64' }) do
      local rtol = dt == 'f32' and 2e-5 or 1e-12
      local wl, bl = distinct(4, 0.5, 1.5, 8), distinct(4, -1, 1, 9)
      local w, b = pn.tensor(wl, { dtype = dt }), pn.tensor(bl, { dtype = dt })
      for kind, x in pairs(inputs(dt, -3, 3)) do
        for _, cfg in ipairs({ { nil, nil }, { w, nil }, { nil, b }, { w, b } }) do
          for _, eps in ipairs({ 1e-5, 0.1 }) do
            local y = pn.layer_norm(x, cfg[1], cfg[2], eps)
            local ref = ref_layer_norm(vals(x), x:shape(), cfg[1] and wl, cfg[2] and bl, eps)
            local what = string.format('layer_norm %s %s w=%s b=%s eps=%g', dt, kind, tostring(cfg[1] ~= nil),
              tostring(cfg[2] ~= nil), eps)
            assert.same(x:shape(), y:shape(), what)
            assert_close(vals(y), ref, rtol, what)
          end
        end
      end
    end
  end)

  it('defaults eps to 1e-5; t:layer_norm is the same function; works on 1-D input', function()
    local x = pn.tensor({ 1, 2, 3, 4 }, { dtype = 'f64' })
    assert_close(vals(x:layer_norm()), ref_layer_norm({ 1, 2, 3, 4 }, { 4 }, nil, nil, 1e-5), 1e-12, '1-D')
    assert.same(vals(pn.layer_norm(x, nil, nil, 1e-5)), vals(x:layer_norm(nil, nil)))
  end)

  it('passes f64 gradchecks for x, weight and bias (each combination, transposed x)', function()
    local x = leaf({ 3, 5 }, -2, 2, 21)
    local w = leaf({ 5 }, 0.5, 1.5, 22)
    local b = leaf({ 5 }, -1, 1, 23)
    gradcheck(function(t, ww, bb) return pn.layer_norm(t, ww, bb) end, { x, w, b })
    gradcheck(function(t) return pn.layer_norm(t) end, { x })
    gradcheck(function(t, ww) return pn.layer_norm(t, ww, nil, 0.1) end, { x, w })
    gradcheck(function(t, bb) return pn.layer_norm(t, nil, bb) end, { x, b })
    local xt = leaf({ 5, 2, 3 }, -2, 2, 24) -- transposed to (3, 2, 5)
    gradcheck(function(t, ww) return t:transpose(1, 3):layer_norm(ww, nil) end, { xt, w })
  end)

  it('a constant weight gets gradient only through the others (x constant, weight/bias learn)', function()
    local x = pn.tensor(nest(distinct(15, -2, 2, 31), { 3, 5 }), { dtype = 'f64' })
    local w = leaf({ 5 }, 0.5, 1.5, 32)
    local b = leaf({ 5 }, -1, 1, 33)
    gradcheck(function(ww, bb) return pn.layer_norm(x, ww, bb) end, { w, b })
  end)

  it('f32 values and gradients agree with f64 (many rows: blocked weight/bias sums; rows of eight-lane blocks and a tail)', function()
    pn.manual_seed(5)
    -- D = 6: the f32 rows' tail loop alone; 21: two blocks of eight lanes and a tail; 256: the NMT model's
    for _, D in ipairs({ 6, 21, 256 }) do
      local x64, g64 = pn.randn({ 300, D }, { dtype = 'f64' }) * 3 + 1, pn.randn({ 300, D }, { dtype = 'f64' })
      local w64, b64 = pn.randn({ D }, { dtype = 'f64' }), pn.randn({ D }, { dtype = 'f64' })
      for _, with_w in ipairs({ true, false }) do
        local res = {}
        for _, dt in ipairs({ 'f32', 'f64' }) do
          local x = x64:to(dt):detach():requires_grad_()
          local w = with_w and w64:to(dt):detach():requires_grad_() or nil
          local b = b64:to(dt):detach():requires_grad_()
          local y = pn.layer_norm(x, w, b)
          y:backward(g64:to(dt))
          res[dt] = { vals(x.grad), with_w and vals(w.grad) or {}, vals(b.grad), vals(y) }
        end
        local what = string.format(' (D = %d, weight %s)', D, tostring(with_w))
        assert_close(res.f32[1], res.f64[1], 2e-5, 'x grad' .. what)
        assert_close(res.f32[2], res.f64[2], 2e-5, 'weight grad' .. what)
        assert_close(res.f32[3], res.f64[3], 2e-5, 'bias grad' .. what)
        assert_close(res.f32[4], res.f64[4], 2e-5, 'values' .. what)
      end
    end
  end)

  -- norm.c's backward makes one pass: each block of rows gets its x gradient and its share of the
  -- weight and bias sums together, whether x's gradient is wanted or not
  it('weight and bias gradients: the same bits with or without x\'s gradient, on 1 or 2 threads', function()
    pn.manual_seed(6)
    local threads = pn.num_threads()
    for _, dt in ipairs({ 'f32', 'f64' }) do
      -- 2000 × 21: past PN_PAR_MIN (32768 elements), so two threads really split the blocks
      local x0, g = pn.randn({ 2000, 21 }, { dtype = dt }) * 3 + 1, pn.randn({ 2000, 21 }, { dtype = dt })
      local w0, b0 = pn.randn({ 21 }, { dtype = dt }), pn.randn({ 21 }, { dtype = dt })
      local seen
      for _, nt in ipairs({ 1, 2 }) do
        for _, want_x in ipairs({ true, false }) do
          pn.set_num_threads(nt)
          local x = want_x and x0:detach():requires_grad_() or x0
          local w, b = w0:detach():requires_grad_(), b0:detach():requires_grad_()
          pn.layer_norm(x, w, b):backward(g)
          local got = { vals(w.grad), vals(b.grad) }
          local what = string.format('%s, %d thread(s), x grad %s', dt, nt, tostring(want_x))
          if seen then
            assert.same(seen[1], got[1], 'weight grad ' .. what)
            assert.same(seen[2], got[2], 'bias grad ' .. what)
          end
          seen = seen or got
          assert.is_true(math.abs(got[2][1]) > 0, 'bias grad ' .. what .. ' is not zero')
        end
      end
    end
    pn.set_num_threads(threads)
  end)

  it('errors name layer_norm and the shapes/dtypes', function()
    local x = pn.ones({ 2, 3 })
    assert_error_matching(function() return pn.layer_norm(x, pn.ones({ 4 })) end, 'layer_norm', 'weight', '[4]', '[2,3]')
    assert_error_matching(function() return pn.layer_norm(x, nil, pn.ones({ 3, 1 })) end, 'layer_norm', 'bias', '[3,1]')
    assert_error_matching(function() return pn.layer_norm(x, pn.ones({ 3 }, { dtype = 'f64' })) end, 'layer_norm',
      'f64', 'f32')
    assert_error_matching(function() return pn.layer_norm(x, nil, nil, -1) end, 'layer_norm', 'eps')
    assert_error_matching(function() return pn.layer_norm(pn.tensor(1)) end, 'layer_norm', '0-dim')
    assert_error_matching(function() return pn.layer_norm(pn.ones({ 2 }, { dtype = 'i32' })) end, 'layer_norm', 'i32')
  end)
end)

-- ---- dropout ------------------------------------------------------------------------------------
describe('dropout', function()
  it('p = 0 or train = false returns x itself', function()
    local x = pn.randn({ 3, 4 })
    assert.is_true(x:dropout(0):data_ptr() == x:data_ptr())
    assert.is_true(pn.dropout(x, 0.5, false):data_ptr() == x:data_ptr())
    assert.same(vals(x), vals(x:dropout(0.7, false)))
  end)

  it('zeroes a fraction p of 1e5 elements, scales the rest by 1/(1-p), preserves the mean', function()
    local n = 100000
    local x = pn.ones({ n }, { dtype = 'f64' })
    for _, p in ipairs({ 0.1, 0.5, 0.8 }) do
      pn.manual_seed(42)
      local y = vals(x:dropout(p))
      local zeros, sum = 0, 0
      for _, v in ipairs(y) do
        if v == 0 then zeros = zeros + 1
        else assert.near(1 / (1 - p), v, 1e-12) end
        sum = sum + v
      end
      local sd = math.sqrt(p * (1 - p) / n) -- of the zero fraction
      assert.is_true(math.abs(zeros / n - p) < 5 * sd, string.format('p=%g: zero fraction %g', p, zeros / n))
      -- the mean is 1 ± (1/(1-p))·sd
      assert.is_true(math.abs(sum / n - 1) < 5 * sd / (1 - p), string.format('p=%g: mean %g', p, sum / n))
    end
  end)

  it('f32 gives the same mask as f64 for the same seed; same seed → same mask, new draws differ', function()
    local x = pn.randn({ 50, 40 })
    pn.manual_seed(9)
    local a = vals(x:dropout(0.3))
    pn.manual_seed(9)
    local b = vals(x:dropout(0.3))
    local c = vals(x:dropout(0.3)) -- the stream moved on
    pn.manual_seed(9)
    local d = vals(x:to('f64'):dropout(0.3))
    assert.same(a, b)
    local differ, same_zeros = 0, true
    for i = 1, #a do
      if (a[i] == 0) ~= (c[i] == 0) then differ = differ + 1 end
      if (a[i] == 0) ~= (d[i] == 0) then same_zeros = false end
    end
    assert.is_true(differ > 100)
    assert.is_true(same_zeros)
  end)

  -- training f32 (a mask kept) draws sixteen blocks side by side (dropout.c); f64 one at a time
  it('f32 with a kept mask gives the mask of f64 one block at a time (groups, tails, threads)', function()
    local prev = pn.num_threads()
    for _, shape in ipairs({ { 50, 40 }, { 300, 41 }, { 3, 5 } }) do
      for _, th in ipairs({ 1, 2 }) do
        pn.set_num_threads(th)
        local x = pn.randn(shape):abs() + 0.5 -- no zeros: a kept element is nonzero
        local x32 = x:detach():requires_grad_()
        local x64 = x:to('f64'):detach():requires_grad_()
        pn.manual_seed(11)
        local a = vals(x32:dropout(0.25))
        pn.manual_seed(11)
        local b = vals(x64:dropout(0.25))
        local kept = 0
        for i = 1, #a do
          if (a[i] == 0) ~= (b[i] == 0) then
            error(string.format('shape %dx%d, %d threads: element %d kept in one and not the other', shape[1], shape[2],
              th, i))
          end
          if a[i] ~= 0 then kept = kept + 1 end
        end
        assert.is_true(kept > 0.6 * #a and kept < 0.9 * #a)
      end
    end
    pn.set_num_threads(prev)
  end)

  it('reads non-contiguous input; backward multiplies by the saved mask', function()
    local base = pn.tensor(nest(distinct(24, 0.5, 2, 3), { 4, 6 }), { dtype = 'f64', requires_grad = true })
    pn.manual_seed(4)
    local y = base:t():dropout(0.5)
    local yv, xv = vals(y), vals(base:t())
    for i = 1, #yv do assert.is_true(yv[i] == 0 or math.abs(yv[i] - 2 * xv[i]) < 1e-12) end
    y:sum():backward()
    local gv = vals(base.grad:t())
    for i = 1, #yv do assert.equal(yv[i] == 0 and 0 or 2, gv[i]) end
  end)

  -- without a gradient no mask is kept, and blocks of 8 zeros (±0) skip their draw: the same
  -- output as with the mask kept, bit for bit, around zero blocks, lone nonzeros, −0 and NaN
  it('gives the same output with and without a kept mask on mostly-zero input (the zero-block shortcut)', function()
    for _, dt in ipairs({ 'f32', 'f64' }) do
      local v = {}
      for i = 1, 203 do v[i] = 0 end
      v[3], v[17], v[40], v[41], v[96], v[201], v[203] = 1.5, -2, 3, 4, -0.0, 0 / 0, 7
      local x = pn.tensor(v, { dtype = dt })
      pn.manual_seed(5)
      local plain = vals(x:dropout(0.5))
      pn.manual_seed(5)
      local kept = vals(x:detach():requires_grad_():dropout(0.5))
      for i = 1, #v do
        if kept[i] ~= kept[i] then
          assert.is_true(plain[i] ~= plain[i], dt .. ' element ' .. i)
        else
          assert.equal(kept[i], plain[i], dt .. ' element ' .. i)
        end
      end
      local nz = 0
      for _, i in ipairs({ 3, 17, 40, 41, 203 }) do if plain[i] ~= 0 then nz = nz + 1 end end
      assert.is_true(nz >= 1, dt .. ': some nonzeros kept')
    end
  end)

  it('passes an f64 gradcheck with a fixed mask', function()
    local x = leaf({ 4, 5 }, -1, 1, 41)
    gradcheck(function(t) pn.manual_seed(77); return t:dropout(0.4) end, { x })
  end)

  it('errors name dropout and the bad p or dtype', function()
    local x = pn.ones({ 3 })
    assert_error_matching(function() return x:dropout(1) end, 'dropout', 'p must be in [0, 1)')
    assert_error_matching(function() return x:dropout(-0.1) end, 'dropout', '-0.1')
    assert_error_matching(function() return x:dropout(0 / 0) end, 'dropout')
    assert_error_matching(function() return pn.ones({ 3 }, { dtype = 'i64' }):dropout(0.5) end, 'dropout', 'i64')
  end)
end)

describe('softmax/layer_norm/dropout ownership', function()
  it('frees every tensor, byte and node (forward, backward, error paths)', function()
    for _ = 1, 3 do collectgarbage('collect') end
    local t0, b0, n0 = pn.live_tensors(), pn.live_bytes(), pn.live_nodes()
    for i = 1, 20 do
      local dt = i % 3 == 0 and 'f64' or 'f32'
      local x = pn.randn({ 4, 70 }, { dtype = dt, requires_grad = (i % 2 == 0) })
      local w = pn.randn({ 70 }, { dtype = dt, requires_grad = true })
      local b = pn.randn({ 70 }, { dtype = dt, requires_grad = (i % 4 == 0) })
      local outs = { x:softmax(), x:log_softmax(1), x:t():softmax(2), pn.layer_norm(x, w, b), pn.layer_norm(x),
        x:dropout(0.3), x:dropout(0.3, false) }
      outs[4]:sum():backward() -- w always requires grad
      if x.requires_grad then
        for _, k in ipairs({ 1, 2, 3, 5, 6, 7 }) do outs[k]:sum():backward() end
      end
      pcall(function() return x:softmax(5) end)
      pcall(function() return pn.layer_norm(x, pn.ones({ 3 })) end)
      pcall(function() return x:dropout(2) end)
    end
    for _ = 1, 3 do collectgarbage('collect') end
    assert.is_true(pn.live_tensors() <= t0, "live counter grew: " .. pn.live_tensors() .. " > " .. t0) -- <=: tensors left by earlier spec files may be freed meanwhile
    assert.is_true(pn.live_bytes() <= b0, "live counter grew: " .. pn.live_bytes() .. " > " .. b0) -- <=: tensors left by earlier spec files may be freed meanwhile
    assert.is_true(pn.live_nodes() <= n0, "live counter grew: " .. pn.live_nodes() .. " > " .. n0) -- <=: tensors left by earlier spec files may be freed meanwhile
  end)
end)
