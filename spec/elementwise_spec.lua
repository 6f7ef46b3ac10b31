-- Elementwise ops (core/ops/elementwise.c, lua/penumbra/ops/elementwise.lua): unary maths,
-- binary arithmetic with broadcasting, operators with numbers on either side, comparisons,
-- where, their gradients and their errors. References are plain Lua loops over values read
-- back with totable(), never the op under test.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local check = require 'spec.helpers.check'
local flatten, vals, assert_close, assert_error_matching = check.flatten, check.vals, check.assert_close, check.assert_error_matching

local inf = math.huge

-- ---- helpers --------------------------------------------------------------------------------
local RTOL = { f32 = 1e-5, f64 = 1e-12 }

-- deterministic values in [lo, hi], as a nested (rows, cols) table
local function grid(rows, cols, lo, hi, seed)
  local t, k = {}, seed or 0
  for i = 1, rows do
    t[i] = {}
    for j = 1, cols do
      k = k + 1
      local u = ((k * 0.6180339887498949 + (seed or 0) * 0.31) % 1)
      t[i][j] = lo + (hi - lo) * u
    end
  end
  return t
end

-- erf by its everywhere-positive series (no cancellation):
-- erf(x) = 2/sqrt(pi) e^{-x^2} sum_n 2^n x^{2n+1} / (1*3*...*(2n+1))
local function erf(x)
  local term, sum, n = x, x, 0
  while math.abs(term) > 1e-17 * math.abs(sum) do
    n = n + 1
    term = term * 2 * x * x / (2 * n + 1)
    sum = sum + term
  end
  return 2 / math.sqrt(math.pi) * math.exp(-x * x) * sum
end

local function sigmoid(x)
  if x >= 0 then return 1 / (1 + math.exp(-x)) end
  local e = math.exp(x)
  return e / (1 + e)
end
local function softplus(x) return math.max(x, 0) + math.log(1 + math.exp(-math.abs(x))) end

-- ---- unary ------------------------------------------------------------------------------------
-- name, reference, domain [lo, hi], optional arguments, expected Lua call
local UNARY = {
  { 'neg', function(x) return -x end, -3, 3 },
  { 'abs', math.abs, -3, 3 },
  { 'exp', math.exp, -4, 4 },
  { 'log', math.log, 0.1, 5 },
  { 'log1p', function(x) return math.log(1 + x) end, -0.5, 3 },
  { 'sqrt', math.sqrt, 0.1, 5 },
  { 'rsqrt', function(x) return 1 / math.sqrt(x) end, 0.1, 5 },
  { 'sin', math.sin, -3, 3 },
  { 'cos', math.cos, -3, 3 },
  { 'tanh', math.tanh, -3, 3 },
  { 'sigmoid', sigmoid, -6, 6 },
  { 'logsigmoid', function(x) return -softplus(-x) end, -6, 6 },
  { 'relu', function(x) return math.max(x, 0) end, -3, 3 },
  { 'elu', function(x) return x > 0 and x or (math.exp(x) - 1) end, -3, 3 },
  { 'elu', function(x) return x > 0 and x or 0.5 * (math.exp(x) - 1) end, -3, 3, { 0.5 } },
  { 'leaky_relu', function(x) return x > 0 and x or 0.01 * x end, -3, 3 },
  { 'leaky_relu', function(x) return x > 0 and x or 0.2 * x end, -3, 3, { 0.2 } },
  { 'gelu', function(x) return 0.5 * x * (1 + erf(x / math.sqrt(2))) end, -3, 3 },
  { 'softplus', softplus, -6, 6 },
  { 'sinh', math.sinh, -3, 3 },
  { 'cosh', math.cosh, -3, 3 },
  { 'asinh', function(x)
      local s = x < 0 and -1 or 1
      return s * math.log(math.abs(x) + math.sqrt(x * x + 1))
    end, -3, 3 },
  { 'acosh', function(x) return math.log(x + math.sqrt(x * x - 1)) end, 1.1, 4 },
  { 'atanh', function(x) return 0.5 * math.log((1 + x) / (1 - x)) end, -0.9, 0.9 },
  { 'clamp', function(x) return math.min(math.max(x, -1), 0.5) end, -3, 3, { -1, 0.5 } },
  { 'clamp', function(x) return math.max(x, -1) end, -3, 3, { -1, nil } },
  { 'clamp', function(x) return math.min(x, 0.5) end, -3, 3, { nil, 0.5 } },
  { 'pow', function(x) return x ^ 3 end, -2, 2, { 3 } },
  { 'pow', function(x) return x * x end, -2, 2, { 2 } },
  { 'pow', function(x) return x ^ 0.5 end, 0.1, 3, { 0.5 } },
  { 'pow', function(x) return x ^ -1.5 end, 0.2, 3, { -1.5 } },
}

local function label(u)
  local args = u[5] and ('(' .. tostring(u[5][1]) .. ', ' .. tostring(u[5][2]) .. ')') or '()'
  return u[1] .. args
end

local function apply(u, x)
  local a = u[5] or {}
  return x[u[1]](x, a[1], a[2])
end

describe('unary ops', function()
  for _, u in ipairs(UNARY) do
    local name, ref, lo, hi = u[1], u[2], u[3], u[4]
    it(label(u) .. ' matches a plain-Lua reference (contiguous, transposed, broadcast; f32 and f64)', function()
      for _, dt in ipairs({ 'f32', 'f64' }) do
        local rtol = RTOL[dt]
        local x = pn.tensor(grid(4, 5, lo, hi, 1), { dtype = dt })
        local inputs = {
          contiguous = x,
          transposed = x:t(),                                               -- (5, 4), strides (1, 5)
          broadcast = pn.tensor(grid(1, 5, lo, hi, 2), { dtype = dt }):expand(3, 5), -- stride 0 rows
        }
        for kind, inp in pairs(inputs) do
          local y = apply(u, inp)
          assert.same(inp:shape(), y:shape())
          assert.equal(dt, y:dtype())
          local xs, ref_vals = vals(inp), {}
          for i, v in ipairs(xs) do ref_vals[i] = ref(v) end
          assert_close(vals(y), ref_vals, rtol, label(u) .. ' ' .. dt .. ' ' .. kind)
        end
      end
    end)
  end

  it('are module functions too: pn.exp(x), pn.elu(x, a), pn.clamp(x, lo, hi)', function()
    local x = pn.tensor({ -1, 0.5, 2 }, { dtype = 'f64' })
    assert_close(vals(pn.exp(x)), { math.exp(-1), math.exp(0.5), math.exp(2) }, 1e-12, 'pn.exp')
    assert_close(vals(pn.elu(x, 2)), { 2 * (math.exp(-1) - 1), 0.5, 2 }, 1e-12, 'pn.elu')
    assert_close(vals(pn.clamp(x, 0, 1)), { 0, 0.5, 1 }, 0, 'pn.clamp')
    assert_close(vals(pn.pow(x, 2)), { 1, 0.25, 4 }, 1e-12, 'pn.pow')
    assert_close(vals(pn.relu(x)), { 0, 0.5, 2 }, 0, 'pn.relu')
  end)

  it('keep large inputs finite where the maths is (sigmoid, softplus, logsigmoid)', function()
    local x = pn.tensor({ -200, -50, 50, 200 }, { dtype = 'f32' })
    assert_close(vals(x:sigmoid()), { 0, sigmoid(-50), 1, 1 }, 1e-6, 'sigmoid')
    assert_close(vals(x:softplus()), { 0, softplus(-50), 50, 200 }, 1e-6, 'softplus')
    assert_close(vals(x:logsigmoid()), { -200, -50, -softplus(-50), 0 }, 1e-6, 'logsigmoid')
  end)

  it('work on integer tensors for neg, abs, relu, clamp', function()
    local x = pn.tensor({ -3, -1, 0, 2, 5 }, { dtype = 'i64' })
    assert.same({ 3, 1, 0, -2, -5 }, (-x):totable())
    assert.same({ 3, 1, 0, 2, 5 }, x:abs():totable())
    assert.same({ 0, 0, 0, 2, 5 }, x:relu():totable())
    assert.same({ -1, -1, 0, 2, 3 }, x:clamp(-1, 3):totable())
    assert.equal('i64', x:abs():dtype())
  end)

  it('handle empty and 0-dim tensors', function()
    local e = pn.zeros({ 0, 3 }, { dtype = 'f64' })
    assert.same({ 0, 3 }, e:exp():shape())
    local s = pn.tensor(2, { dtype = 'f64' })
    assert.same({}, s:sqrt():shape())
    assert_close({ s:sqrt():item() }, { math.sqrt(2) }, 1e-15, 'sqrt scalar')
  end)
end)

-- ---- binary ------------------------------------------------------------------------------------
-- row-major flat values of a nested table with the given shape, read at a broadcast index
local function numel(shape) local n = 1; for _, s in ipairs(shape) do n = n * s end; return n end

local function bshape(sa, sb)
  local nd = math.max(#sa, #sb)
  local out = {}
  for i = 1, nd do
    local da = sa[#sa - nd + i] or 1
    local db = sb[#sb - nd + i] or 1
    assert(da == db or da == 1 or db == 1)
    out[i] = da == 1 and db or da
  end
  return out
end

-- flat index into a tensor of shape s for the multi-index idx of the (larger) shape out
local function bindex(s, out, idx)
  local k, mul = 0, 1
  for d = #s, 1, -1 do
    local i = idx[#out - #s + d]
    if s[d] == 1 then i = 1 end
    k = k + (i - 1) * mul
    mul = mul * s[d]
  end
  return k + 1
end

-- reference of f over broadcast inputs (flat values + shapes) → flat output values, shape
local function bref(f, fa, sa, fb, sb)
  local out = bshape(sa, sb)
  local res, idx = {}, {}
  for d = 1, #out do idx[d] = 1 end
  for n = 1, numel(out) do
    res[n] = f(fa[bindex(sa, out, idx)], fb[bindex(sb, out, idx)])
    for d = #out, 1, -1 do
      idx[d] = idx[d] + 1
      if idx[d] <= out[d] then break end
      idx[d] = 1
    end
  end
  return res, out
end

local function rand_tensor(shape, dt, lo, hi, seed)
  local n = numel(shape)
  local flat = grid(1, n, lo, hi, seed)[1]
  return pn.tensor(flat, { dtype = dt }):reshape(shape)
end

local BINARY = {
  { 'add', function(a, b) return a + b end },
  { 'sub', function(a, b) return a - b end },
  { 'mul', function(a, b) return a * b end },
  { 'div', function(a, b) return a / b end },
  { 'pow', function(a, b) return a ^ b end, 0.2, 3 },  -- positive bases
  { 'maximum', math.max },
  { 'minimum', math.min },
}

local SHAPE_PAIRS = {
  { { 2, 3 }, { 2, 3 } },
  { { 2, 1, 3 }, { 4, 1 } },
  { { 3, 1 }, { 1, 4 } },
  { {}, { 3 } },
  { { 2, 3 }, {} },
  { { 4 }, { 2, 3, 4 } },
}

describe('binary ops', function()
  for _, bo in ipairs(BINARY) do
    local name, ref, lo, hi = bo[1], bo[2], bo[3] or -2, bo[4] or 2
    it(name .. ' broadcasts like NumPy and matches a plain-Lua reference (f32, f64)', function()
      for _, dt in ipairs({ 'f32', 'f64' }) do
        for k, sp in ipairs(SHAPE_PAIRS) do
          local a = rand_tensor(sp[1], dt, lo, hi, k)
          local b = rand_tensor(sp[2], dt, 0.5, 2.5, k + 10)  -- b away from 0 for div
          local want, shape = bref(ref, vals(a), sp[1], vals(b), sp[2])
          local got = a[name](a, b)
          assert.same(shape, got:shape())
          assert.equal(dt, got:dtype())
          local what = string.format('%s %s [%s] [%s]', name, dt, table.concat(sp[1], ','), table.concat(sp[2], ','))
          assert_close(vals(got), want, RTOL[dt], what)
          assert_close(vals(pn[name](a, b)), want, RTOL[dt], 'pn.' .. what)
        end
      end
    end)

    it(name .. ' reads non-contiguous (transposed, expanded) operands', function()
      local a = rand_tensor({ 4, 3 }, 'f64', lo, hi, 3):t()        -- (3, 4) strided
      local b = rand_tensor({ 4 }, 'f64', 0.5, 2.5, 4):expand(3, 4) -- (3, 4) stride 0
      local want = bref(ref, vals(a), { 3, 4 }, vals(b), { 3, 4 })
      assert_close(vals(a[name](a, b)), want, 1e-12, name .. ' strided')
      local want2 = bref(ref, vals(b), { 3, 4 }, vals(a), { 3, 4 })
      assert_close(vals(b[name](b, a)), want2, 1e-12, name .. ' strided swapped')
    end)
  end

  it('agree with the reference above the parallel threshold (chunked rows, broadcast, strided)', function()
    -- 70000 elements: past PN_PAR_MIN, so the OpenMP path with row chunks runs
    local a = rand_tensor({ 70000 }, 'f64', -2, 2, 1)
    local s = pn.tensor(0.75, { dtype = 'f64' })
    local av = vals(a)
    local want = {}
    for i, v in ipairs(av) do want[i] = v * 0.75 end
    assert_close(vals(a * s), want, 1e-15, 'long row * scalar')
    local col = rand_tensor({ 250, 1 }, 'f64', -2, 2, 2)
    local row = rand_tensor({ 1, 300 }, 'f64', -2, 2, 3)
    local want2 = bref(function(p, q) return p - q end, vals(col), { 250, 1 }, vals(row), { 1, 300 })
    assert_close(vals(col - row), want2, 1e-15, 'outer difference')
    local m = rand_tensor({ 300, 250 }, 'f32', -2, 2, 4):t()   -- (250, 300) strided
    local want3 = {}
    for i, v in ipairs(vals(m)) do want3[i] = math.exp(v) end
    assert_close(vals(m:exp()), want3, 1e-5, 'exp transposed f32')
    local gv = vals(pn.where(m:gt(0), m, -m))
    for i, v in ipairs(vals(m)) do assert.equal(math.abs(v), gv[i]) end
  end)

  it('walk rows of three and more dims above the parallel threshold (odometer steps, every thread)', function()
    -- rows of 7 elements over (A, C, B): each thread seeks its first row, then steps; the
    -- steps wrap the inner dims many times, and both thread counts split the rows elsewhere
    local A, B, C, D = 5, 41, 37, 7
    local x = rand_tensor({ A, B, C, D }, 'f64', -2, 2, 5)
    local xv = vals(x)
    local function xi(a, b, c, d) return ((a * B + b) * C + c) * D + d + 1 end
    local y = rand_tensor({ A, 1, B, D }, 'f64', -2, 2, 6) -- broadcast along C
    local yv = vals(y)
    local prev = pn.num_threads()
    for _, th in ipairs({ 1, 2, 3 }) do
      pn.set_num_threads(th)
      local p = x:permute(1, 3, 2, 4) -- (A, C, B, D), strided
      local cv, sv = vals(p:contiguous()), vals(p + y)
      local n = 0
      for a = 0, A - 1 do
        for c = 0, C - 1 do
          for b = 0, B - 1 do
            for d = 0, D - 1 do
              n = n + 1
              local v = xv[xi(a, b, c, d)]
              if cv[n] ~= v then error(string.format('copy, %d threads: element %d is %g, want %g', th, n, cv[n], v)) end
              local w = v + yv[(a * B + b) * D + d + 1]
              if sv[n] ~= w then error(string.format('add, %d threads: element %d is %g, want %g', th, n, sv[n], w)) end
            end
          end
        end
      end
      assert.equal(A * B * C * D, n)
    end
    -- long rows (chunks of one row share its offsets) over two outer dims
    local z = rand_tensor({ 3, 2, 20000 }, 'f32', -2, 2, 7)
    local zt = z:transpose(1, 2) -- (2, 3, 20000), rows strided
    local zv, want = vals(z), {}
    for i = 0, 1 do
      for j = 0, 2 do
        for k = 1, 20000 do want[#want + 1] = 2 * zv[(j * 2 + i) * 20000 + k] end
      end
    end
    pn.set_num_threads(2)
    assert.same(want, vals(zt * 2))
    pn.set_num_threads(prev)
  end)

  it('maximum and minimum propagate NaN from either side', function()
    local a = pn.tensor({ 0 / 0, 1, 2 }, { dtype = 'f64' })
    local b = pn.tensor({ 1, 0 / 0, 3 }, { dtype = 'f64' })
    for _, r in ipairs({ vals(a:maximum(b)), vals(a:minimum(b)) }) do
      assert.is_true(r[1] ~= r[1])
      assert.is_true(r[2] ~= r[2])
    end
    assert.equal(3, vals(a:maximum(b))[3])
    assert.equal(2, vals(a:minimum(b))[3])
  end)

  it('work on integer dtypes for add, sub, mul, maximum, minimum (exact)', function()
    for _, dt in ipairs({ 'i32', 'i64' }) do
      local a = pn.tensor({ { 1, -2, 3 }, { 40000, 5, -6 } }, { dtype = dt })
      local b = pn.tensor({ 7, 3, -6 }, { dtype = dt })
      assert.same({ { 8, 1, -3 }, { 40007, 8, -12 } }, (a + b):totable())
      assert.same({ { -6, -5, 9 }, { 39993, 2, 0 } }, (a - b):totable())
      assert.same({ { 7, -6, -18 }, { 280000, 15, 36 } }, (a * b):totable())
      assert.same({ { 7, 3, 3 }, { 40000, 5, -6 } }, a:maximum(b):totable())
      assert.same({ { 1, -2, -6 }, { 7, 3, -6 } }, a:minimum(b):totable())
      assert.equal(dt, (a + b):dtype())
    end
    local big = pn.full({ 2 }, 2 ^ 40, { dtype = 'i64' })
    assert.same({ 2 ^ 41, 2 ^ 41 }, (big + big):totable())
  end)
end)

describe('operators', function()
  local x = pn.tensor({ { 1, 2, 4 }, { -1, 0.5, 3 } }, { dtype = 'f64' })
  local xs = vals(x)
  local function ref_map(f) local r = {}; for i, v in ipairs(xs) do r[i] = f(v) end; return r end

  it('+ - * / with tensors on both sides and with broadcasting', function()
    local y = pn.tensor({ 2, 4, 8 }, { dtype = 'f64' })
    local ys = vals(y)
    local function ref2(f) return (bref(f, xs, { 2, 3 }, ys, { 3 })) end
    assert_close(vals(x + y), ref2(function(a, b) return a + b end), 0, '+')
    assert_close(vals(x - y), ref2(function(a, b) return a - b end), 0, '-')
    assert_close(vals(x * y), ref2(function(a, b) return a * b end), 0, '*')
    assert_close(vals(x / y), ref2(function(a, b) return a / b end), 0, '/')
  end)

  it('accept a number on the right', function()
    assert_close(vals(x + 2), ref_map(function(v) return v + 2 end), 0, 'x + 2')
    assert_close(vals(x - 2), ref_map(function(v) return v - 2 end), 0, 'x - 2')
    assert_close(vals(x * 3), ref_map(function(v) return v * 3 end), 0, 'x * 3')
    assert_close(vals(x / 3), ref_map(function(v) return v / 3 end), 1e-15, 'x / 3')
    assert_close(vals(x ^ 2), ref_map(function(v) return v * v end), 0, 'x ^ 2')
    assert.equal('f64', (x + 2):dtype())
  end)

  it('accept a number on the left (2 - t, 2 / t, 2 ^ t)', function()
    assert_close(vals(2 + x), ref_map(function(v) return 2 + v end), 0, '2 + x')
    assert_close(vals(2 - x), ref_map(function(v) return 2 - v end), 0, '2 - x')
    assert_close(vals(3 * x), ref_map(function(v) return 3 * v end), 0, '3 * x')
    assert_close(vals(2 / x), ref_map(function(v) return 2 / v end), 1e-15, '2 / x')
    assert_close(vals(2 ^ x), ref_map(function(v) return 2 ^ v end), 1e-14, '2 ^ x')
    assert_close(vals(pn.sub(1, x)), ref_map(function(v) return 1 - v end), 0, 'pn.sub(1, x)')
    assert.equal('f64', (2 - x):dtype())
    local f = pn.tensor({ 1, 2 })
    assert.equal('f32', (1 - f):dtype())
  end)

  it('promote an integer tensor meeting a fractional number instead of truncating it', function()
    local i = pn.tensor({ 0, 1, 3 }, { dtype = 'i64' })
    local h = i * 0.5
    assert.equal('f32', h:dtype())
    assert.same({ 0, 0.5, 1.5 }, h:totable())
    assert.same({ 0.5, -0.5, -2.5 }, (0.5 - i):totable())
    assert.same({ 0, 1, 1 }, i:gt(0.5):totable())
    assert.same({ 1, 0, 0 }, pn.gt(0.5, i):totable())
    assert.same({ 2, 3, 5 }, (i + 2):totable())     -- integral numbers keep the dtype
    assert.equal('i64', (i + 2):dtype())
  end)

  it('unary minus and pow with a tensor exponent', function()
    assert_close(vals(-x), ref_map(function(v) return -v end), 0, '-x')
    local p = pn.tensor({ 1, 2, 0.5 }, { dtype = 'f64' })
    local base = pn.tensor({ { 2, 3, 4 }, { 5, 6, 9 } }, { dtype = 'f64' })
    assert_close(vals(base ^ p), { 2, 9, 2, 5, 36, 3 }, 1e-14, 'base ^ p')
    assert_close(vals(base:pow(p)), { 2, 9, 2, 5, 36, 3 }, 1e-14, 'base:pow(p)')
  end)
end)

-- ---- comparisons and where --------------------------------------------------------------------------
describe('comparisons', function()
  local CMP = {
    eq = function(a, b) return a == b end, ne = function(a, b) return a ~= b end,
    lt = function(a, b) return a < b end, le = function(a, b) return a <= b end,
    gt = function(a, b) return a > b end, ge = function(a, b) return a >= b end,
  }
  for name, f in pairs(CMP) do
    it(name .. ' returns u8 with broadcasting (f32, f64, i64) and numbers on either side', function()
      for _, dt in ipairs({ 'f32', 'f64', 'i64' }) do
        local a = pn.tensor({ { 1, 2, 3 }, { 3, 2, 1 } }, { dtype = dt })
        local b = pn.tensor({ { 2 }, { 2 } }, { dtype = dt })
        local want = bref(function(p, q) return f(p, q) and 1 or 0 end, vals(a), { 2, 3 }, vals(b), { 2, 1 })
        local got = a[name](a, b)
        assert.equal('u8', got:dtype())
        assert.same({ 2, 3 }, got:shape())
        assert.same(want, vals(got))
        assert.same(want, vals(pn[name](a, b)))
        assert.same(want, vals(a[name](a, 2)))
        local want_left = bref(function(p, q) return f(p, q) and 1 or 0 end, { 2 }, {}, vals(a), { 2, 3 })
        assert.same(want_left, vals(pn[name](2, a)))
      end
    end)
  end

  it('reads transposed operands', function()
    local a = pn.tensor({ { 1, 5 }, { 4, 2 } }, { dtype = 'f64' }):t() -- {{1,4},{5,2}}
    local b = pn.tensor({ { 1, 4 }, { 0, 3 } }, { dtype = 'f64' })
    assert.same({ { 1, 1 }, { 0, 0 } }, a:eq(b):totable())
    assert.same({ { 0, 0 }, { 1, 0 } }, a:gt(b):totable())
  end)
end)

describe('where', function()
  it('selects from a and b, broadcasting all three', function()
    local cond = pn.tensor({ { 1 }, { 0 } }, { dtype = 'u8' })        -- (2, 1)
    local a = pn.tensor({ 1, 2, 3 }, { dtype = 'f64' })                  -- (3)
    local b = pn.tensor(-1, { dtype = 'f64' })                           -- ()
    local r = pn.where(cond, a, b)
    assert.same({ 2, 3 }, r:shape())
    assert.same({ { 1, 2, 3 }, { -1, -1, -1 } }, r:totable())
    assert.same(r:totable(), cond:where(a, b):totable())
  end)

  it('works with a comparison as cond, numbers, transposed inputs and every dtype', function()
    local x = pn.tensor({ { -1, 2 }, { 3, -4 } })
    assert.same({ { 0, 2 }, { 3, 0 } }, pn.where(x:gt(0), x, 0):totable())
    assert.same({ { 9, 2 }, { 3, 9 } }, x:gt(0):where(x, 9):totable())
    local xt = x:t()                                                   -- {{-1,3},{2,-4}}
    assert.same({ { 0, 3 }, { 2, 0 } }, pn.where(xt:gt(0), xt, 0):totable())
    for _, dt in ipairs({ 'f64', 'i32', 'i64', 'u8' }) do
      local p = pn.tensor({ 1, 2, 3 }, { dtype = dt })
      local q = pn.tensor({ 7, 8, 9 }, { dtype = dt })
      local c = pn.tensor({ 0, 1, 0 }, { dtype = 'u8' })
      local r = pn.where(c, p, q)
      assert.equal(dt, r:dtype())
      assert.same({ 7, 2, 9 }, r:totable())
    end
  end)
end)

-- ---- gradients ------------------------------------------------------------------------------------
local function leaf(t) return pn.tensor(t, { dtype = 'f64', requires_grad = true }) end

describe('gradients', function()
  for _, u in ipairs(UNARY) do
    local name, lo, hi = u[1], u[3], u[4]
    -- kinks: keep relu-like inputs away from 0 and clamp inputs away from its bounds
    local vals_in = grid(3, 4, lo, hi, 5)
    if name == 'abs' or name == 'relu' or name == 'leaky_relu' or name == 'elu' or name == 'clamp' then
      vals_in = { { -2.5, -1.3, -0.7, -0.2 }, { 0.15, 0.35, 0.8, 1.7 }, { -2.1, 2.2, -0.45, 0.3 } }
    end
    it(label(u) .. ' passes an f64 gradcheck (also through a transposed view)', function()
      local x = leaf(vals_in)
      gradcheck(function(t) return apply(u, t) end, { x })
      gradcheck(function(t) return apply(u, t:t()) end, { x })
      assert.equal(name, apply(u, x):grad_fn())
    end)
  end

  it('abs and relu have gradient 0 at 0; clamp passes gradient where min <= x <= max', function()
    local x = leaf({ -1, 0, 1 })
    x:abs():backward(pn.ones({ 3 }, { dtype = 'f64' }))
    assert.same({ -1, 0, 1 }, x.grad:totable())
    x:zero_grad()
    x:relu():backward(pn.ones({ 3 }, { dtype = 'f64' }))
    assert.same({ 0, 0, 1 }, x.grad:totable())
    local y = leaf({ -2, -1, 0, 0.5, 1, 2 })
    y:clamp(-1, 1):backward(pn.ones({ 6 }, { dtype = 'f64' }))
    assert.same({ 0, 1, 1, 1, 1, 0 }, y.grad:totable())
  end)

  for _, bo in ipairs(BINARY) do
    local name = bo[1]
    it(name .. ' passes an f64 gradcheck on both sides with broadcasting', function()
      local lo = bo[3] or -2
      local hi = bo[4] or 2
      for _, sp in ipairs({ { { 2, 1, 3 }, { 4, 1 } }, { { 2, 3 }, { 2, 3 } }, { {}, { 3 } } }) do
        local a = rand_tensor(sp[1], 'f64', lo, hi, 7):requires_grad_()
        local b = rand_tensor(sp[2], 'f64', 0.5, 2.5, 8):requires_grad_()
        gradcheck(function(p, q) return p[name](p, q) end, { a, b })
      end
      -- one side only requiring grad, and a transposed operand
      local a = rand_tensor({ 3, 2 }, 'f64', lo, hi, 9):requires_grad_()
      local c = rand_tensor({ 2, 3 }, 'f64', 0.5, 2.5, 10)
      gradcheck(function(p) return p:t()[name](p:t(), c) end, { a })
      gradcheck(function(p) return c[name](c, p:t()) end, { a })
    end)
  end

  it('pow: gradient to the exponent is 0 where the base is 0 (torch convention)', function()
    local base = leaf({ 0, 2 })
    local e = leaf({ 2, 3 })
    base:pow(e):backward(pn.ones({ 2 }, { dtype = 'f64' }))
    assert_close(vals(e.grad), { 0, 8 * math.log(2) }, 1e-12, 'd/de')
    assert_close(vals(base.grad), { 0, 12 }, 1e-12, 'd/dbase')
  end)

  it('maximum/minimum send the gradient to the larger/smaller side and split ties', function()
    local a = leaf({ 1, 5, 3 })
    local b = leaf({ 2, 4, 3 })
    a:maximum(b):backward(pn.ones({ 3 }, { dtype = 'f64' }))
    assert.same({ 0, 1, 0.5 }, a.grad:totable())
    assert.same({ 1, 0, 0.5 }, b.grad:totable())
    a:zero_grad(); b:zero_grad()
    a:minimum(b):backward(pn.ones({ 3 }, { dtype = 'f64' }))
    assert.same({ 1, 0, 0.5 }, a.grad:totable())
    assert.same({ 0, 1, 0.5 }, b.grad:totable())
  end)

  it('operators with numbers on either side are differentiable', function()
    local x = leaf({ { 0.5, 1.5 }, { 2, 3 } })
    gradcheck(function(t) return (2 - t) * (t / 3) + 1 / t - t ^ 2 + 2 ^ t + (-t) end, { x })
  end)

  it('where sends the gradient to a and b under the mask, reduced over broadcast dims', function()
    local cond = pn.tensor({ { 1, 0, 1 }, { 0, 0, 1 } }, { dtype = 'u8' })
    local a = leaf({ 1, 2, 3 })         -- (3) broadcast over rows
    local b = leaf({ { 4 }, { 5 } })    -- (2, 1) broadcast over columns
    gradcheck(function(p, q) return pn.where(cond, p, q) end, { a, b })
    a:zero_grad(); b:zero_grad()
    pn.where(cond, a, b):backward(pn.ones({ 2, 3 }, { dtype = 'f64' }))
    assert.same({ 1, 0, 2 }, a.grad:totable())
    assert.same({ { 1 }, { 2 } }, b.grad:totable())
  end)

  it('reduce broadcast gradients correctly above the parallel threshold', function()
    local col = rand_tensor({ 250, 1 }, 'f64', -2, 2, 5):requires_grad_()
    local row = rand_tensor({ 1, 300 }, 'f64', -2, 2, 6):requires_grad_()
    ;(col * row):sigmoid():backward(pn.ones({ 250, 300 }, { dtype = 'f64' }))
    local cv, rv = vals(col), vals(row)
    local gc, gr = {}, {}
    for j = 1, 300 do gr[j] = 0 end
    for i = 1, 250 do
      gc[i] = 0
      for j = 1, 300 do
        local s = sigmoid(cv[i] * rv[j])
        local d = s * (1 - s)
        gc[i] = gc[i] + d * rv[j]
        gr[j] = gr[j] + d * cv[i]
      end
    end
    assert_close(vals(col.grad), gc, 1e-10, 'd col')
    assert_close(vals(row.grad), gr, 1e-10, 'd row')
  end)

  it('a tensor used twice accumulates (the engine sums with add)', function()
    local x = leaf({ 1, 2, 3 })
    gradcheck(function(t) return t * t + t:exp() * t end, { x })
  end)

  it('leave no autograd nodes alive once results are dropped without backward', function()
    collectgarbage(); collectgarbage()
    local nodes, tensors = pn.live_nodes(), pn.live_tensors()
    do
      local x = leaf({ 1, 2, 3 })
      local y = x:exp():sigmoid() * x + x:maximum(x:sin())
      y = nil
      x = nil
    end
    collectgarbage(); collectgarbage()
    assert.is_true(pn.live_nodes() <= nodes, "live counter grew: " .. pn.live_nodes() .. " > " .. nodes) -- <=: tensors left by earlier spec files may be freed meanwhile
    assert.is_true(pn.live_tensors() <= tensors, "live counter grew: " .. pn.live_tensors() .. " > " .. tensors) -- <=: tensors left by earlier spec files may be freed meanwhile
  end)
end)

-- ---- errors ------------------------------------------------------------------------------------------
describe('errors', function()
  it('non-broadcastable shapes: the message names the op and both shapes', function()
    local a, b = pn.zeros(2, 3), pn.zeros(4)
    for _, name in ipairs({ 'add', 'sub', 'mul', 'div', 'pow', 'maximum', 'minimum' }) do
      assert_error_matching(function() return a[name](a, b) end, name, '[2,3]', '[4]')
    end
    assert_error_matching(function() return a + b end, 'add', '[2,3]', '[4]')
    assert_error_matching(function() return a:lt(b) end, 'lt', '[2,3]', '[4]')
    assert_error_matching(function() return pn.where(pn.zeros({ 5 }, { dtype = 'u8' }), a, a) end,
      'where', '[5]', '[2,3]')
  end)

  it('dtype mismatch: the message names the op and both dtypes', function()
    local a, b = pn.zeros(3), pn.zeros(3, { dtype = 'f64' })
    assert_error_matching(function() return a + b end, 'add', 'f32', 'f64')
    assert_error_matching(function() return a:maximum(b) end, 'maximum', 'f32', 'f64')
    assert_error_matching(function() return a:eq(b) end, 'eq', 'f32', 'f64')
    assert_error_matching(function() return pn.where(a:gt(0), a, b) end, 'where', 'f32', 'f64')
  end)

  it('where with a non-u8 cond', function()
    local a = pn.zeros(3)
    assert_error_matching(function() return pn.where(a, a, a) end, 'where', 'cond', 'f32')
    assert_error_matching(function() return pn.where(1, a, a) end, 'where', 'cond')
  end)

  it('float-only ops on integer tensors name the op and the dtype', function()
    local i = pn.tensor({ 1, 2 }, { dtype = 'i64' })
    assert_error_matching(function() return i:exp() end, 'exp', 'i64')
    assert_error_matching(function() return i:sigmoid() end, 'sigmoid', 'i64')
    assert_error_matching(function() return i / i end, 'div', 'i64')
    assert_error_matching(function() return i:pow(i) end, 'pow', 'i64')
  end)

  it('clamp with min > max and non-tensor arguments', function()
    assert_error_matching(function() return pn.zeros(2):clamp(1, 0) end, 'clamp', 'min')
    assert_error_matching(function() return pn.add('a', {}) end, 'add')
    assert_error_matching(function() return pn.exp(3) end, 'exp')
  end)
end)
