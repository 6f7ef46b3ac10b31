-- cuda_elementwise_spec.lua — the CUDA kernels of the elementwise ops, the reductions and
-- softmax (core/cuda/ops/elementwise.cu, reduce.cu, softmax.cu) against the CPU kernels, in the
-- same dtype: op(x:to('cuda')):to('cpu') against op(x), and the gradients of the inputs under one
-- random cotangent. f32 within 1e-5 relative, f64 within 1e-12; integer and u8 results exact.
-- Awkward sizes (1, primes, more than one block of 256), non-contiguous inputs (transposed,
-- sliced, expanded), broadcasting, NaN and ±inf, every dtype each kernel takes; both layouts of
-- the reductions and softmax (a block per line, a thread per line). In the kernel interpreter
-- every case runs under three thread orders (fwd, rev, rand:3), so a missing barrier shows.
-- Pending where the build has no CUDA device.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local cu = require 'spec.helpers.cuda'

local cuda = pn.cuda.available()
local it_cuda = cuda and it or pending
local TOL, FLOATS = cu.TOL, cu.DTYPES
local INTS = { 'i32', 'i64', 'u8' }
local nan, inf = 0 / 0, math.huge
local schedules, numel = cu.schedules, cu.numel -- schedules(fn): fn(s) under every thread order

-- an input: values from a seeded stream in [lo, hi) (integers: floor of them), at shape, with
-- special values put at positions (1-based flat index → value); view(t) the view the op sees
-- (built on each device from the same base); grad: a float input whose gradient is compared
local function input(shape, o)
  o = o or {}
  local dt, lo, hi = o.dtype or 'f32', o.lo or -1, o.hi or 1
  local r = check.rng(o.seed or 1)
  local vals = {}
  for i = 1, numel(shape) do
    local v = lo + (hi - lo) * r:u()
    if dt == 'i32' or dt == 'i64' or dt == 'u8' then v = math.floor(v) end
    vals[i] = v
  end
  for i, v in pairs(o.special or {}) do vals[i] = v end
  local base = pn.tensor(#vals > 0 and vals or { 0 }, { dtype = dt }):narrow(1, 1, #vals):reshape(shape)
  return { base = base, view = o.view, grad = o.grad ~= false and (dt == 'f32' or dt == 'f64') }
end

local function run(fn, ins, dev, seed)
  local args, leaves = {}, {}
  for i, s in ipairs(ins) do
    local leaf = s.base:to(dev):detach()
    if s.grad then leaf:requires_grad_() end
    leaves[i] = leaf
    args[i] = s.view and s.view(leaf) or leaf
  end
  local out = fn(unpack(args, 1, #ins))
  local grads = {}
  if out.requires_grad and out:numel() > 0 then
    local shape, n = out:shape(), out:numel()
    local r, w = check.rng(seed or 5), {}
    for i = 1, n do w[i] = 2 * r:u() - 1 end
    out:backward(pn.tensor(w, { dtype = out:dtype() }):reshape(shape):to(dev))
    for i, s in ipairs(ins) do
      if s.grad then grads[i] = leaves[i].grad end
    end
  end
  return out, grads
end

local function same_values(got, ref, dt, what)
  assert.same(ref:shape(), got:shape(), what .. ': shape')
  assert.equal(ref:dtype(), got:dtype(), what .. ': dtype')
  if TOL[dt] then check.assert_close(check.vals(got), check.vals(ref), TOL[dt], what)
  else assert.same(check.vals(ref), check.vals(got), what) end
end

-- fn on the CPU and on cuda from the same inputs: outputs and gradients agree
local function agree(what, fn, ins)
  local ref, rg = run(fn, ins, 'cpu')
  schedules(function(s)
    local got, gg = run(fn, ins, 'cuda')
    assert.equal('cuda', got:device(), what)
    local label = what .. ' [' .. s .. ']'
    same_values(got:to('cpu'), ref, ref:dtype(), label)
    for i in ipairs(ins) do
      if rg[i] or gg[i] then
        assert.is_truthy(rg[i] and gg[i], label .. ': gradient of input ' .. i .. ' on one side only')
        same_values(gg[i]:to('cpu'), rg[i], rg[i]:dtype(), label .. ' gradient of input ' .. i)
      end
    end
  end)
end

local T = function(t) return t:transpose(1, 2) end          -- strides (1, n)
local SLICE = function(t) return t:narrow(1, 2, t:shape()[1] - 2) end -- an offset and a gap

describe('cuda elementwise kernels', function()
  it_cuda('binary ops agree with the CPU: broadcast, transposed, sliced, > 1 block, f32 and f64', function()
    for _, dt in ipairs(FLOATS) do
      for _, op in ipairs({ 'add', 'sub', 'mul', 'div', 'pow', 'maximum', 'minimum' }) do
        local lo = (op == 'pow' or op == 'div') and 0.5 or -1
        local f = function(a, b) return pn[op](a, b) end
        agree(op .. ' ' .. dt .. ' (1)', f, { input({ 1 }, { dtype = dt, lo = lo }), input({ 1 }, { dtype = dt, lo = lo, seed = 2 }) })
        agree(op .. ' ' .. dt .. ' (601) contiguous', f,
          { input({ 601 }, { dtype = dt, lo = lo }), input({ 601 }, { dtype = dt, lo = lo, seed = 2 }) })
        agree(op .. ' ' .. dt .. ' broadcast (7,1,5) (3,1)', f,
          { input({ 7, 1, 5 }, { dtype = dt, lo = lo }), input({ 3, 1 }, { dtype = dt, lo = lo, seed = 2 }) })
        agree(op .. ' ' .. dt .. ' transposed (29,13)ᵀ with sliced (15,29)', f,
          { input({ 29, 13 }, { dtype = dt, lo = lo, view = T }), input({ 15, 29 }, { dtype = dt, lo = lo, seed = 2, view = SLICE }) })
        agree(op .. ' ' .. dt .. ' scalar against (17,19)', f,
          { input({}, { dtype = dt, lo = lo }), input({ 17, 19 }, { dtype = dt, lo = lo, seed = 3 }) })
      end
    end
  end)

  it_cuda('binary ops on integer dtypes are exact (wrapping as the CPU does), broadcast too', function()
    for _, dt in ipairs(INTS) do
      for _, op in ipairs({ 'add', 'sub', 'mul', 'maximum', 'minimum' }) do
        local f = function(a, b) return pn[op](a, b) end
        agree(op .. ' ' .. dt, f, { input({ 5, 1, 53 }, { dtype = dt, lo = 0, hi = 200 }),
          input({ 3, 53 }, { dtype = dt, lo = 0, hi = 200, seed = 2 }) })
        agree(op .. ' ' .. dt .. ' transposed', f, { input({ 11, 23 }, { dtype = dt, lo = 0, hi = 120, view = T }),
          input({ 23, 11 }, { dtype = dt, lo = 0, hi = 120, seed = 2 }) })
      end
    end
  end)

  it_cuda('maximum/minimum and arithmetic propagate NaN; ±inf as the CPU', function()
    for _, dt in ipairs(FLOATS) do
      local sa = { [1] = nan, [4] = inf, [7] = -inf, [9] = nan }
      local sb = { [2] = nan, [4] = inf, [8] = -inf, [9] = 0 }
      for _, op in ipairs({ 'add', 'mul', 'div', 'maximum', 'minimum', 'pow' }) do
        agree(op .. ' ' .. dt .. ' specials', function(a, b) return pn[op](a, b) end,
          { input({ 3, 4 }, { dtype = dt, special = sa, grad = false }),
            input({ 3, 4 }, { dtype = dt, special = sb, seed = 2, grad = false }) })
      end
      -- ties split the gradient of maximum/minimum evenly; pow's special cases at 0
      local a = input({ 6 }, { dtype = dt, special = { [1] = 0.5, [2] = 0, [3] = 0, [4] = 2, [5] = -1, [6] = 0.25 } })
      local b = input({ 6 }, { dtype = dt, special = { [1] = 0.5, [2] = 0, [3] = 2, [4] = 0, [5] = 3, [6] = 0.75 } })
      for _, op in ipairs({ 'maximum', 'minimum', 'pow' }) do
        agree(op .. ' ' .. dt .. ' ties and zeros', function(x, y) return pn[op](x, y) end, { a, b })
      end
    end
  end)

  it_cuda('every unary op and its gradient agree with the CPU on a transposed (17,19), f32 and f64', function()
    local DOM = {
      neg = {}, abs = {}, exp = {}, log = { 0.2, 2 }, log1p = { -0.5, 2 }, sqrt = { 0.2, 2 }, rsqrt = { 0.2, 2 },
      sin = {}, cos = {}, tanh = {}, sigmoid = { -8, 8 }, logsigmoid = { -8, 8 }, relu = {}, elu = {},
      leaky_relu = {}, gelu = { -3, 3 }, softplus = { -8, 8 }, sinh = {}, cosh = {}, asinh = { -3, 3 },
      acosh = { 1.2, 3 }, atanh = { -0.8, 0.8 },
    }
    for _, dt in ipairs(FLOATS) do
      for name, d in pairs(DOM) do
        agree(name .. ' ' .. dt, function(x) return x[name](x) end,
          { input({ 19, 17 }, { dtype = dt, lo = d[1], hi = d[2], view = T }) })
      end
      local x = input({ 19, 17 }, { dtype = dt, lo = -2, hi = 2, view = T })
      agree('clamp ' .. dt, function(t) return t:clamp(-0.5, 0.7) end, { x })
      agree('clamp lower only ' .. dt, function(t) return t:clamp(-0.5) end, { x })
      agree('elu(0.3) ' .. dt, function(t) return t:elu(0.3) end, { x })
      agree('leaky_relu(0.2) ' .. dt, function(t) return t:leaky_relu(0.2) end, { x })
      agree('pow 3 ' .. dt, function(t) return t:pow(3) end, { x })
      agree('pow 2 (the square path) ' .. dt, function(t) return t:pow(2) end, { x })
      agree('pow 0 ' .. dt, function(t) return t:pow(0) end, { x })
      agree('pow 0.5 ' .. dt, function(t) return t:pow(0.5) end, { input({ 300 }, { dtype = dt, lo = 0.1, hi = 3 }) })
      agree('sigmoid sliced ' .. dt, function(t) return t:sigmoid() end, { input({ 9, 5 }, { dtype = dt, view = SLICE }) })
      agree('exp of an expanded view ' .. dt, function(t) return t:expand(4, 7):exp() end, { input({ 1, 7 }, { dtype = dt }) })
    end
  end)

  it_cuda('unary ops keep NaN and ±inf as the CPU does', function()
    local sp = { [1] = nan, [2] = inf, [3] = -inf, [4] = 0, [5] = -0.0 }
    for _, dt in ipairs(FLOATS) do
      for _, name in ipairs({ 'neg', 'abs', 'exp', 'log', 'sqrt', 'tanh', 'sigmoid', 'logsigmoid', 'relu', 'gelu',
        'softplus', 'elu', 'asinh' }) do
        agree(name .. ' specials ' .. dt, function(x) return x[name](x) end,
          { input({ 7 }, { dtype = dt, special = sp, grad = false }) })
      end
      agree('clamp NaN ' .. dt, function(x) return x:clamp(-1, 1) end, { input({ 7 }, { dtype = dt, special = sp, grad = false }) })
    end
  end)

  it_cuda('integer unary ops (neg, abs, relu, clamp) are exact', function()
    for _, dt in ipairs(INTS) do
      local x = input({ 13, 21 }, { dtype = dt, lo = dt == 'u8' and 0 or -50, hi = 50, view = T })
      for _, name in ipairs({ 'neg', 'abs', 'relu' }) do
        agree(name .. ' ' .. dt, function(t) return t[name](t) end, { x })
      end
      agree('clamp ' .. dt, function(t) return t:clamp(-7.5, 20.5) end, { x })
    end
  end)

  it_cuda('comparisons give the same u8 on every dtype, broadcast, NaN included', function()
    for _, dt in ipairs({ 'f32', 'f64', 'i32', 'i64', 'u8' }) do
      local float = dt == 'f32' or dt == 'f64'
      local sa = float and { [1] = nan, [3] = inf } or {}
      local a = input({ 5, 1, 31 }, { dtype = dt, lo = 0, hi = 4, special = sa, grad = false })
      local b = input({ 3, 31 }, { dtype = dt, lo = 0, hi = 4, seed = 2, grad = false, special = float and { [2] = nan } or {} })
      for _, op in ipairs({ 'eq', 'ne', 'lt', 'le', 'gt', 'ge' }) do
        agree(op .. ' ' .. dt, function(x, y) return pn[op](x, y) end, { a, b })
        agree(op .. ' ' .. dt .. ' transposed', function(x, y) return pn[op](x, y) end,
          { input({ 31, 3 }, { dtype = dt, lo = 0, hi = 4, view = T, grad = false }), b })
      end
    end
  end)

  it_cuda('where selects for every dtype, cond and both sides broadcast, with gradients', function()
    local cond = input({ 3, 1, 1 }, { dtype = 'u8', lo = 0, hi = 2 })
    local cond2 = input({ 11, 29 }, { dtype = 'u8', lo = 0, hi = 2, seed = 4 })
    for _, dt in ipairs({ 'f32', 'f64', 'i32', 'i64', 'u8' }) do
      local a = input({ 3, 4, 29 }, { dtype = dt, lo = 0, hi = 100 })
      local b = input({ 29 }, { dtype = dt, lo = 0, hi = 100, seed = 3 })
      agree('where ' .. dt, function(c, x, y) return pn.where(c, x, y) end, { cond, a, b })
      agree('where ' .. dt .. ' transposed', function(c, x, y) return pn.where(c, x, y) end,
        { cond2, input({ 29, 11 }, { dtype = dt, lo = 0, hi = 100, view = T }), b })
    end
  end)
end)

-- (O, R, I) layouts the front end hands the kernels: a contiguous line (I = 1), lines at a
-- stride with few outputs (a block per line), many strided lines (a thread per line), all dims,
-- a transposed input (read in memory order), two dims at once, a size-1 and a prime line
local LAYOUTS = {
  { 'last dim, 7 rows of 1000', { 7, 1000 }, -1 },
  { 'last dim, 300 rows of 13', { 300, 13 }, -1 },
  { 'size 1 line', { 5, 1 }, -1 },
  { 'middle dim (3,300,5)', { 3, 300, 5 }, 2 },
  { 'middle dim (40,50,30): many lines', { 40, 50, 30 }, 2 },
  { 'first dim (257,3)', { 257, 3 }, 1 },
  { 'transposed (31,17)ᵀ last dim', { 31, 17 }, -1, T },
  { 'all dims of (3,4,5)', { 3, 4, 5 }, nil },
  { 'dims {1,3} of (6,5,7)', { 6, 5, 7 }, { 1, 3 } },
}

describe('cuda reduction kernels', function()
  it_cuda('sum, mean, max, min, logsumexp, prod agree with the CPU in every layout, with gradients', function()
    for _, dt in ipairs(FLOATS) do
      for _, L in ipairs(LAYOUTS) do
        for _, op in ipairs({ 'sum', 'mean', 'max', 'min', 'logsumexp', 'prod' }) do
          -- prod over long lines: values near 1 keep it finite
          local lo, hi = -1, 1
          if op == 'prod' then lo, hi = 0.95, 1.05 end
          local x = input(L[2], { dtype = dt, lo = lo, hi = hi, view = L[4] })
          agree(op .. ' ' .. dt .. ' ' .. L[1], function(t) return t[op](t, L[3]) end, { x })
        end
        agree('sum keepdim ' .. dt .. ' ' .. L[1], function(t) return t:sum(L[3], true) end,
          { input(L[2], { dtype = dt, view = L[4] }) })
      end
    end
  end)

  it_cuda('max/min ties split the gradient; prod with zeros; the CPU values for NaN, ±inf and empty dims', function()
    for _, dt in ipairs(FLOATS) do
      local ties = input({ 3, 4 }, { dtype = dt, special = { [1] = 0.9, [2] = 0.9, [6] = -0.9, [8] = -0.9, [9] = 0.5, [10] = 0.5, [11] = 0.5, [12] = 0.5 } })
      for _, op in ipairs({ 'max', 'min' }) do
        agree(op .. ' ties ' .. dt, function(t) return t[op](t, -1) end, { ties })
      end
      agree('prod zeros ' .. dt, function(t) return t:prod(-1) end,
        { input({ 3, 4 }, { dtype = dt, special = { [2] = 0, [5] = 0, [7] = 0 } }) })
      -- a NaN in a line that also holds +inf; +inf alone; all -inf; NaN only; -inf mixed
      local sp = { [1] = nan, [2] = inf, [5] = inf, [9] = -inf, [10] = -inf, [11] = -inf, [12] = -inf,
        [14] = nan, [17] = -inf }
      for _, op in ipairs({ 'sum', 'mean', 'max', 'min', 'logsumexp', 'prod' }) do
        agree(op .. ' specials ' .. dt, function(t) return t[op](t, -1) end,
          { input({ 5, 4 }, { dtype = dt, special = sp, grad = false }) })
        -- the same over a long line (many threads per line)
        agree(op .. ' specials, long lines ' .. dt, function(t) return t[op](t, -1) end,
          { input({ 3, 700 }, { dtype = dt, special = { [600] = nan, [10] = inf, [1500] = inf, [1401] = -inf }, grad = false }) })
      end
      -- empty reduced dims: 0 (sum), NaN (mean), -inf (logsumexp), 1 (prod), 0 (norm)
      for _, op in ipairs({ 'sum', 'mean', 'logsumexp', 'prod' }) do
        agree(op .. ' over an empty dim ' .. dt, function(t) return t[op](t, 2) end, { input({ 3, 0 }, { dtype = dt }) })
      end
      agree('norm over an empty dim ' .. dt, function(t) return t:norm(2, 2) end, { input({ 3, 0 }, { dtype = dt }) })
    end
  end)

  it_cuda('integer sum/prod (→ i64, wrapping), max and min are exact', function()
    for _, dt in ipairs(INTS) do
      for _, L in ipairs(LAYOUTS) do
        for _, op in ipairs({ 'sum', 'prod', 'max', 'min' }) do
          local x = input(L[2], { dtype = dt, lo = dt == 'u8' and 0 or -100, hi = 100, view = L[4] })
          agree(op .. ' ' .. dt .. ' ' .. L[1], function(t) return t[op](t, L[3]) end, { x })
        end
      end
    end
  end)

  it_cuda('p-norms (1, 2, 3, 0.5, inf) agree with their gradients; zeros get a zero gradient', function()
    for _, dt in ipairs(FLOATS) do
      for _, p in ipairs({ 1, 2, 3, 0.5, inf }) do
        for _, L in ipairs(LAYOUTS) do
          agree('norm ' .. p .. ' ' .. dt .. ' ' .. L[1], function(t) return t:norm(p, L[3]) end,
            { input(L[2], { dtype = dt, view = L[4] }) })
        end
        agree('norm ' .. p .. ' zeros and ties ' .. dt, function(t) return t:norm(p, -1) end,
          { input({ 3, 4 }, { dtype = dt, special = { [1] = 0, [2] = 0, [3] = 0, [4] = 0, [5] = 0.5, [6] = -0.5, [7] = 0 } }) })
        agree('norm ' .. p .. ' NaN ' .. dt, function(t) return t:norm(p, -1) end,
          { input({ 3, 300 }, { dtype = dt, special = { [7] = nan, [400] = inf }, grad = false }) })
      end
    end
  end)

  it_cuda('argmax/argmin: first extreme, a NaN wins, in every layout and dtype', function()
    for _, dt in ipairs({ 'f32', 'f64', 'i32', 'i64', 'u8' }) do
      for _, L in ipairs(LAYOUTS) do
        if type(L[3]) ~= 'table' then
          -- few distinct values: ties everywhere
          local x = input(L[2], { dtype = dt, lo = 0, hi = 3, view = L[4], grad = false })
          for _, op in ipairs({ 'argmax', 'argmin' }) do
            agree(op .. ' ' .. dt .. ' ' .. L[1], function(t) return t[op](t, L[3]) end, { x })
          end
        end
      end
    end
    for _, dt in ipairs(FLOATS) do
      local x = input({ 4, 600 }, { dtype = dt, grad = false,
        special = { [5] = nan, [500] = nan, [700] = inf, [1300] = -inf, [1900] = nan, [2000] = inf } })
      for _, op in ipairs({ 'argmax', 'argmin' }) do
        agree(op .. ' NaN ' .. dt, function(t) return t[op](t, -1) end, { x })
        agree(op .. ' NaN over all ' .. dt, function(t) return t[op](t) end, { x })
      end
    end
  end)
end)

describe('cuda softmax kernels', function()
  local SHAPES = {
    { 'one element', { 1 }, -1 },
    { '7 rows of 1000 (a block per line)', { 7, 1000 }, -1 },
    { '300 rows of 13', { 300, 13 }, -1 },
    { 'dim 2 of (3,300,5) (strided lines, few)', { 3, 300, 5 }, 2 },
    { 'dim 2 of (40,50,30) (a thread per line)', { 40, 50, 30 }, 2 },
    { 'dim 1 of (257,3)', { 257, 3 }, 1 },
    { 'transposed (31,17)ᵀ', { 31, 17 }, -1, T },
  }
  it_cuda('softmax and log_softmax agree with the CPU, forward and backward', function()
    for _, dt in ipairs(FLOATS) do
      for _, S in ipairs(SHAPES) do
        for _, op in ipairs({ 'softmax', 'log_softmax' }) do
          agree(op .. ' ' .. dt .. ' ' .. S[1], function(t) return t[op](t, S[3]) end,
            { input(S[2], { dtype = dt, lo = -4, hi = 4, view = S[4] }) })
        end
      end
    end
  end)

  it_cuda('a line with NaN is NaN, all -inf is NaN, +inf as the CPU', function()
    for _, dt in ipairs(FLOATS) do
      for _, op in ipairs({ 'softmax', 'log_softmax' }) do
        local sp = { [2] = nan, [5] = -inf, [6] = -inf, [7] = -inf, [8] = -inf, [10] = -inf, [13] = inf }
        agree(op .. ' specials ' .. dt, function(t) return t[op](t, -1) end,
          { input({ 4, 4 }, { dtype = dt, special = sp, grad = false }) })
        agree(op .. ' specials dim 1 ' .. dt, function(t) return t[op](t, 1) end,
          { input({ 4, 4 }, { dtype = dt, special = sp, grad = false }) })
        agree(op .. ' specials long ' .. dt, function(t) return t[op](t, -1) end,
          { input({ 2, 500 }, { dtype = dt, special = { [300] = nan }, grad = false }) })
      end
    end
  end)
end)
