-- cuda_index_spec.lua — the CUDA twins of ops/{norm,dropout,index,loss,optim}.c against the CPU
-- kernels: awkward sizes (1, primes, more than one block of rows / elements, more columns than a
-- block has threads), non-contiguous inputs, empty segments, NaN, every dtype a kernel takes,
-- values and gradients. f32 within 1e-5 relative, f64 within 1e-12 (dropout and the integer ops:
-- exactly). In the interpreter build each case runs under three thread orders (fwd, rev,
-- rand:3); on a GPU once; pending in a build without CUDA.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local B = require 'penumbra_ffi'
local C = B.C
local cu = require 'spec.helpers.cuda'

local cuda = pn.cuda.available()
local it_cuda = cuda and it or pending
local TOL = cu.TOL
local each, numel, rnd, close = cu.each, cu.numel, cu.rnd, cu.close

local function ints(vals, dtype, shape)
  local t = pn.tensor(vals, { dtype = dtype or 'i64' })
  return shape and t:reshape(shape) or t
end

-- deterministic ints in [0, hi) (a flat list)
local function draws(n, hi, seed)
  local r, v = check.rng(seed), {}
  for i = 1, n do v[i] = math.floor(r:u() * hi) end
  return v
end

-- inputs: a list of {t = CPU tensor, view = fn(t) or nil, grad = true/false} or plain values (numbers,
-- tables, tensors passed as they are, moved to the device when they are tensors). The op runs on the
-- CPU and on cuda from the same values; the outputs and the gradients of the grad inputs (under one
-- cotangent) must agree within tol.
local function agree(what, tol, inputs, op)
  local function run(dev)
    local args, leaves = {}, {}
    for i, s in ipairs(inputs) do
      if type(s) == 'table' and s.t ~= nil then
        local t = dev == 'cuda' and s.t:to('cuda') or s.t:detach()
        if s.grad then
          t = t:detach():requires_grad_()
          leaves[i] = t
        end
        args[i] = s.view and s.view(t) or t
      elseif pn.is_tensor(s) then
        args[i] = dev == 'cuda' and s:to('cuda') or s
      else
        args[i] = s
      end
    end
    local out = op(unpack(args, 1, #inputs))
    if out.requires_grad then
      if #out:shape() == 0 then
        out:backward()
      else
        out:backward(rnd(out:shape(), out:dtype(), 97):to(dev))
      end
    end
    return out, leaves
  end
  local ref, rl = run('cpu')
  local got, gl = run('cuda')
  close(got, ref, tol, what .. ' output')
  for i, leaf in pairs(rl) do
    assert.is_not_nil(leaf.grad, what .. ': CPU gradient of input ' .. i)
    assert.is_not_nil(gl[i].grad, what .. ': cuda gradient of input ' .. i)
    close(gl[i].grad, leaf.grad, tol, what .. ' gradient of input ' .. i)
  end
end

local function errmsg(fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, 'expected an error')
  return tostring(e)
end

-- the same error text on both devices
local function same_error(what, fn, inputs, ...)
  local cpu_args, cu_args = {}, {}
  for i, a in ipairs(inputs) do
    cpu_args[i] = a
    cu_args[i] = pn.is_tensor(a) and a:to('cuda') or a
  end
  local e1 = errmsg(function() return fn(unpack(cpu_args, 1, #inputs)) end)
  local e2 = errmsg(function() return fn(unpack(cu_args, 1, #inputs)) end)
  assert.equal(e1, e2, what)
  for _, pat in ipairs({ ... }) do
    assert.truthy(e2:find(pat, 1, true), what .. ': "' .. e2 .. '" does not name "' .. pat .. '"')
  end
end

-- mean / sum reductions need cuda's reduce kernel (ops/reduce.c's twin, another area)
local has_reduce = cuda and pcall(function() return pn.ones({ 2 }, { device = 'cuda' }):sum():item() end)
local it_reduce = has_reduce and it or pending

local NAN = 0 / 0

describe('cuda layer_norm', function()
  it_cuda('matches the CPU: 1 column, primes, > 256 rows, > 128 columns, views, NaN rows, weight/bias or not', function()
    each(function(dt, s)
      local tol = TOL[dt]
      local cases = {
        { 'x (1,1)', { 1, 1 }, true, true },
        { 'x (3,5)', { 3, 5 }, true, true },
        { 'x (301,5)', { 301, 5 }, true, true },
        { 'x (3,300) weight only', { 3, 300 }, true, false },
        { 'x (2,3,7) bias only', { 2, 3, 7 }, false, true },
        { 'x (4,1) no params', { 4, 1 }, false, false },
      }
      for k, c in ipairs(cases) do
        local name, shape, w, b = c[1], c[2], c[3], c[4]
        local D = shape[#shape]
        local ins = { { t = rnd(shape, dt, k, -2, 3), grad = true },
          w and { t = rnd({ D }, dt, 10 + k, 0.5, 1.5), grad = true } or nil,
          b and { t = rnd({ D }, dt, 20 + k), grad = true } or nil }
        agree(string.format('layer_norm %s %s %s', name, dt, s), tol, { ins[1], ins[2] or false, ins[3] or false },
          function(x, wt, bt) return pn.layer_norm(x, wt or nil, bt or nil) end)
      end
      -- transposed x (130, 7) from a (7, 130) base; a NaN poisons its row only
      agree('layer_norm transposed ' .. dt .. ' ' .. s, tol,
        { { t = rnd({ 7, 130 }, dt, 31), view = function(t) return t:t() end, grad = true },
          { t = rnd({ 7 }, dt, 32), grad = true }, { t = rnd({ 7 }, dt, 33), grad = true } },
        function(x, w, b) return pn.layer_norm(x, w, b, 1e-3) end)
      agree('layer_norm NaN ' .. dt .. ' ' .. s, tol,
        { { t = rnd({ 5, 9 }, dt, 34, -1, 1, function(v) v[12] = NAN end), grad = true },
          { t = rnd({ 9 }, dt, 35), grad = true }, { t = rnd({ 9 }, dt, 36), grad = true } },
        function(x, w, b) return pn.layer_norm(x, w, b) end)
    end)
  end)
end)

describe('cuda dropout', function()
  it_cuda('draws the CPU mask for a seed, bit for bit (sizes not a multiple of 8, with and without a kept mask)', function()
    each(function(dt, s)
      for _, n in ipairs({ 1, 13, 1001 }) do
        for _, p in ipairs({ 0.3, 0.9 }) do
          local x = rnd({ n }, dt, n, -1, 1, function(v)
            for i = 1, #v do if i % 16 < 8 then v[i] = 0 end end -- whole zero blocks (the no-mask shortcut)
            if #v > 20 then v[20] = NAN end
          end)
          local what = string.format('dropout n=%d p=%g %s %s', n, p, dt, s)
          -- no gradient: no mask kept
          pn.manual_seed(7)
          local yc = pn.dropout(x, p)
          pn.manual_seed(7)
          local yg = pn.dropout(x:to('cuda'), p)
          assert.equal('cuda', yg:device())
          check.assert_close(check.vals(yg:to('cpu')), check.vals(yc), 0, what) -- exact; NaN meets NaN
          -- with a gradient: the mask is kept; y and g·mask/(1−p) identical on both devices
          local lc, lg = x:detach():requires_grad_(), x:to('cuda'):requires_grad_()
          pn.manual_seed(9)
          local y1 = pn.dropout(lc, p)
          pn.manual_seed(9)
          local y2 = pn.dropout(lg, p)
          check.assert_close(check.vals(y2:to('cpu')), check.vals(y1), 0, what .. ' (mask kept)')
          local g = rnd({ n }, dt, 5)
          y1:backward(g)
          y2:backward(g:to('cuda'))
          check.assert_close(check.vals(lg.grad:to('cpu')), check.vals(lc.grad), 0, what .. ' gradient')
        end
      end
      -- the mask itself (the gradient of ones is keep/(1−p)): the same, and about 1−p kept
      local ones = pn.ones({ 4099 }, { dtype = dt })
      local a, b = ones:detach():requires_grad_(), ones:to('cuda'):requires_grad_()
      pn.manual_seed(123)
      pn.dropout(a, 0.25):backward(ones)
      pn.manual_seed(123)
      pn.dropout(b, 0.25):backward(ones:to('cuda'))
      local ma, mb, kept = check.vals(a.grad), check.vals(b.grad:to('cpu')), 0
      assert.same(ma, mb, 'dropout mask ' .. dt)
      for i = 1, #ma do if ma[i] ~= 0 then kept = kept + 1 end end
      assert.is_true(math.abs(kept / #ma - 0.75) < 0.03, 'kept fraction ' .. kept / #ma)
    end)
  end)
end)

describe('cuda losses', function()
  it_cuda('cross_entropy per row: > 1 block of rows, > 128 classes, smoothing, ignore_index, i32 strided target, NaN', function()
    each(function(dt, s)
      local tol = TOL[dt]
      for k, c in ipairs({ { 300, 7, 0 }, { 300, 7, 0.1 }, { 5, 200, 0.2 }, { 1, 1, 0 } }) do
        local N, Cn, eps = c[1], c[2], c[3]
        local t = draws(N, Cn, 40 + k)
        local tg = ints(t, 'i64')
        agree(string.format('cross_entropy N=%d C=%d eps=%g %s %s', N, Cn, eps, dt, s), tol,
          { { t = rnd({ N, Cn }, dt, k, -3, 3), grad = true }, tg },
          function(x, y) return pn.cross_entropy(x, y, { label_smoothing = eps, reduction = 'none' }) end)
      end
      -- ignore_index rows (class 2 ignored), an i32 target read with stride 2, a NaN logit, a transposed x
      local N, Cn = 263, 5
      local tv = draws(2 * N, Cn, 50)
      local tg = ints(tv, 'i32', { N, 2 }):select(2, 1) -- stride 2
      agree('cross_entropy ignore_index/strided/NaN ' .. dt .. ' ' .. s, tol,
        { { t = rnd({ Cn, N }, dt, 51, -2, 2, function(v) v[40] = NAN end), view = function(x) return x:t() end,
            grad = true }, tg },
        function(x, y) return pn.cross_entropy(x, y, { ignore_index = 2, reduction = 'none', label_smoothing = 0.05 }) end)
    end)
  end)

  it_cuda('nll_loss per row: strided logp, ignore_index, i32 target', function()
    each(function(dt, s)
      local N, Cn = 301, 6
      agree('nll_loss ' .. dt .. ' ' .. s, TOL[dt],
        { { t = rnd({ Cn, N }, dt, 61), view = function(x) return x:t() end, grad = true },
          ints(draws(N, Cn, 62), 'i32') },
        function(x, y) return pn.nll_loss(x, y, { ignore_index = 3, reduction = 'none' }) end)
    end)
  end)

  it_cuda('bce_with_logits and mse per element: views, large |x|, NaN, gradients wrt both', function()
    each(function(dt, s)
      for _, f in ipairs({ 'binary_cross_entropy_with_logits', 'mse_loss' }) do
        agree(f .. ' ' .. dt .. ' ' .. s, TOL[dt],
          { { t = rnd({ 19, 17 }, dt, 71, -40, 40, function(v) v[5] = NAN end), view = function(x) return x:t() end,
              grad = true },
            { t = rnd({ 19, 19 }, dt, 72, 0, 1), view = function(y) return y:narrow(1, 2, 17) end, grad = true } },
          function(x, y) return pn[f](x, y, { reduction = 'none' }) end)
      end
    end)
  end)

  it_reduce('mean and sum reductions (the kept-row count from the device scan)', function()
    each(function(dt, s)
      local tol = TOL[dt]
      local N, Cn = 97, 5
      local tg = ints(draws(N, Cn, 81), 'i64')
      for _, red in ipairs({ 'mean', 'sum' }) do
        local w = string.format('%s %s %s', red, dt, s)
        agree('cross_entropy ' .. w, tol, { { t = rnd({ N, Cn }, dt, 82), grad = true }, tg },
          function(x, y) return pn.cross_entropy(x, y, { ignore_index = 1, reduction = red, label_smoothing = 0.1 }) end)
        agree('nll_loss ' .. w, tol, { { t = rnd({ N, Cn }, dt, 83), grad = true }, tg },
          function(x, y) return pn.nll_loss(x, y, { ignore_index = 0, reduction = red }) end)
        agree('bce ' .. w, tol, { { t = rnd({ 9, 11 }, dt, 84, -3, 3), grad = true }, { t = rnd({ 9, 11 }, dt, 85, 0, 1) } },
          function(x, y) return pn.binary_cross_entropy_with_logits(x, y, { reduction = red }) end)
        agree('mse ' .. w, tol, { { t = rnd({ 9, 11 }, dt, 86), grad = true }, { t = rnd({ 9, 11 }, dt, 87), grad = true } },
          function(x, y) return pn.mse_loss(x, y, { reduction = red }) end)
      end
    end)
  end)

  it_cuda('a target out of range: the same error, found on the device (first bad row, ignore_index skipped)', function()
    local t = {}
    for i = 1, 600 do t[i] = (i - 1) % 4 end
    t[300], t[450], t[500] = -100, 9, -1 -- -100 is ignore_index: not an error
    local x = rnd({ 600, 4 }, 'f32', 1)
    same_error('cross_entropy target', function(a, b) return pn.cross_entropy(a, b, { reduction = 'none' }) end,
      { x, ints(t, 'i64') }, 'target[450] = 9', '4 classes')
    same_error('nll_loss target i32', function(a, b) return pn.nll_loss(a, b, { reduction = 'none' }) end,
      { x, ints(t, 'i32') }, 'target[450] = 9')
  end)
end)

describe('cuda optimiser steps', function()
  -- p, g, state on a device; n steps of step(p, g, state…) with fresh gradients each step
  local function run(dev, dt, n, step, nstate)
    local p = rnd({ n }, dt, 1):to(dev)
    local st = {}
    for i = 1, nstate do st[i] = pn.zeros({ n }, { dtype = dt, device = dev }) end
    for k = 1, 3 do step(p, rnd({ n }, dt, 10 + k, -2, 2, function(v) v[1] = 0 end):to(dev), st, k) end
    return p, st
  end
  local function compare(what, dt, n, step, nstate)
    local pc, sc = run('cpu', dt, n, step, nstate)
    local pg, sg = run('cuda', dt, n, step, nstate)
    close(pg, pc, TOL[dt], what .. ' param')
    for i = 1, nstate do close(sg[i], sc[i], TOL[dt], what .. ' state ' .. i) end
  end

  it_cuda('adam_step and sgd_step match the CPU (Adam, AdamW, momentum, dampening, nesterov)', function()
    each(function(dt, s)
      for _, n in ipairs({ 1, 1003 }) do
        for _, dec in ipairs({ 0, 1 }) do
          compare(string.format('adam n=%d decoupled=%d %s %s', n, dec, dt, s), dt, n, function(p, g, st, k)
            B.check(C.pn_adam_step_(p, g, st[1], st[2], 0.01, 0.9, 0.99, 1e-8, 0.05, dec, k))
          end, 2)
        end
        compare(string.format('sgd plain n=%d %s %s', n, dt, s), dt, n, function(p, g)
          B.check(C.pn_sgd_step_(p, g, nil, 0.1, 0, 0, 0.01, 0, 0))
        end, 0)
        compare(string.format('sgd momentum n=%d %s %s', n, dt, s), dt, n, function(p, g, st, k)
          B.check(C.pn_sgd_step_(p, g, st[1], 0.1, 0.9, 0.1, 0.01, 0, k == 1 and 1 or 0))
        end, 1)
        compare(string.format('sgd nesterov n=%d %s %s', n, dt, s), dt, n, function(p, g, st, k)
          B.check(C.pn_sgd_step_(p, g, st[1], 0.1, 0.9, 0, 0, 1, k == 1 and 1 or 0))
        end, 1)
      end
    end)
  end)
end)

describe('cuda indexing', function()
  it_cuda('index_select / index_add / embedding: > 1 idx chunk, repeats, i32 and i64 idx, gradients', function()
    each(function(dt, s)
      local tol = TOL[dt]
      local w = dt .. ' ' .. s
      agree('index_select dim 2 ' .. w, tol,
        { { t = rnd({ 4, 9, 3 }, dt, 1), grad = true }, ints(draws(300, 9, 2), 'i32') },
        function(x, i) return x:index_select(2, i) end)
      agree('index_select dim 1 of a view ' .. w, tol,
        { { t = rnd({ 5, 11 }, dt, 3), view = function(x) return x:t() end, grad = true }, ints({ 10, 0, 10, 3 }) },
        function(x, i) return x:index_select(1, i) end)
      agree('index_add ' .. w, tol,
        { { t = rnd({ 263, 2 }, dt, 4), grad = true }, ints(draws(500, 263, 5)),
          { t = rnd({ 500, 2 }, dt, 6), grad = true } },
        function(x, i, src) return x:index_add(1, i, src) end)
      agree('index_add dim 2, 1 column ' .. w, tol,
        { { t = rnd({ 3, 5, 1 }, dt, 7), grad = true }, ints({ 4, 4, 0, 4 }, 'i32'),
          { t = rnd({ 3, 4, 1 }, dt, 8), grad = true } },
        function(x, i, src) return x:index_add(2, i, src) end)
      agree('embedding ' .. w, tol,
        { { t = rnd({ 50, 3 }, dt, 9), grad = true }, ints(draws(280, 50, 10), 'i64', { 7, 40 }) },
        function(wt, i) return pn.embedding(wt, i) end)
    end)
  end)

  it_cuda('index_select, gather, scatter_add, index_add and segment_sum on integer dtypes (exactly)', function()
    for _, dt in ipairs({ 'i32', 'i64', 'u8' }) do
      local x = ints(draws(60, 100, 1), dt, { 5, 12 })
      agree('index_select ' .. dt, 0, { x, ints({ 4, 0, 4, 2 }) }, function(a, i) return a:index_select(1, i) end)
      agree('gather ' .. dt, 0, { x, ints(draws(15, 12, 2), 'i64', { 5, 3 }) }, function(a, i) return a:gather(2, i) end)
      agree('embedding ' .. dt, 0, { x, ints({ 1, 1, 3 }) }, function(a, i) return pn.embedding(a, i) end)
    end
    for _, dt in ipairs({ 'i32', 'i64' }) do
      local x = ints(draws(60, 100, 3), dt, { 6, 10 })
      agree('scatter_add ' .. dt, 0, { x, ints(draws(40, 6, 4), 'i64', { 4, 10 }), ints(draws(40, 9, 5), dt, { 4, 10 }) },
        function(a, i, src) return a:scatter_add(1, i, src) end)
      agree('index_add ' .. dt, 0, { x, ints({ 5, 0, 5 }), ints(draws(30, 9, 6), dt, { 3, 10 }) },
        function(a, i, src) return a:index_add(1, i, src) end)
      agree('segment_sum ' .. dt, 0, { x, ints({ 0, 2, 2, 6 }) }, function(a, o) return pn.segment_sum(a, o) end)
    end
  end)

  it_cuda('gather and scatter_add: strided x, idx and src, src larger than idx, every dim', function()
    each(function(dt, s)
      local tol = TOL[dt]
      local w = dt .. ' ' .. s
      -- x (5, 6) as a transposed (6, 5) base; idx (4, 3) as a transposed (3, 4) base
      agree('gather dim 2 strided ' .. w, tol,
        { { t = rnd({ 6, 5 }, dt, 1), view = function(x) return x:t() end, grad = true },
          ints(draws(12, 6, 2), 'i64', { 3, 4 }):t() },
        function(x, i) return x:gather(2, i) end)
      agree('gather dim 1 (3-D, i32) ' .. w, tol,
        { { t = rnd({ 4, 3, 5 }, dt, 3), grad = true }, ints(draws(60, 4, 4), 'i32', { 6, 2, 5 }) },
        function(x, i) return x:gather(1, i) end)
      for d = 1, 3 do
        local xs, is = { 6, 4, 3 }, { 5, 4, 2 }
        is[d] = 7 -- repeats along dim d (values in [0, xs[d]))
        agree(string.format('scatter_add dim %d %s', d, w), tol,
          { { t = rnd(xs, dt, 10 + d), grad = true }, ints(draws(numel(is), xs[d], 20 + d), 'i64', is),
            { t = rnd({ 9, 8, 8 }, dt, 30 + d), view = function(t) return t:narrow(1, 2, 8) end, grad = true } },
          function(x, i, src) return x:scatter_add(d, i, src) end)
      end
    end)
  end)

  it_cuda('segment_sum and segment_softmax: empty segments (first, last), > 256 rows, -inf segments, NaN, i32 offsets', function()
    each(function(dt, s)
      local tol = TOL[dt]
      local w = dt .. ' ' .. s
      local counts = { 0, 5, 0, 100, 1, 195, 0 }
      local off = { 0 }
      for i, c in ipairs(counts) do off[i + 1] = off[i] + c end
      agree('segment_sum ' .. w, tol, { { t = rnd({ 301, 3 }, dt, 1), grad = true }, ints(off, 'i32') },
        function(x, o) return pn.segment_sum(x, o) end)
      agree('segment_sum 3-D strided ' .. w, tol,
        { { t = rnd({ 2, 2, 20 }, dt, 2), view = function(x) return x:permute(3, 1, 2) end, grad = true },
          ints({ 0, 7, 7, 20 }) },
        function(x, o) return pn.segment_sum(x, o) end)
      agree('segment_softmax ' .. w, tol, { { t = rnd({ 301, 2 }, dt, 3, -5, 5), grad = true }, ints(off) },
        function(x, o) return pn.segment_softmax(x, o) end)
      -- segment 2 (rows 5..9... here rows 1..5) column 1 all -inf → zeros; a NaN in segment 4, column 2
      local inf = math.huge
      agree('segment_softmax -inf and NaN ' .. w, tol,
        { { t = rnd({ 301, 2 }, dt, 4, -5, 5, function(v)
            for r = 0, 4 do v[2 * r + 1] = -inf end
            v[2 * 50 + 2] = NAN
            v[2 * 60 + 1] = -inf
          end), grad = true }, ints(off, 'i32') },
        function(x, o) return pn.segment_softmax(x, o) end)
    end)
  end)

  it_cuda('index and offset validation on the device: the same errors (first bad position in a strided idx)', function()
    -- gather scans idx as it is (transposed): positions are counted row-major over its shape
    local base = {}
    for i = 1, 30 * 20 do base[i] = (i * 7) % 20 end
    base[25 * 20 + 4] = 99
    base[3 * 20 + 17] = -5
    base[29 * 20 + 1] = 20
    local idx = ints(base, 'i64', { 30, 20 }):t()
    same_error('gather idx', function(x, i) return x:gather(1, i) end, { rnd({ 20, 30 }, 'f32', 1), idx },
      'value 20', 'position [1,30]')
    same_error('gather idx i32', function(x, i) return x:gather(1, i) end,
      { rnd({ 20, 30 }, 'f32', 1), ints(base, 'i32', { 30, 20 }):t() }, 'value 20', 'position [1,30]')
    local long = {}
    for i = 1, 700 do long[i] = i % 9 end
    long[650], long[690] = 9, 12
    same_error('embedding idx', function(w, i) return pn.embedding(w, i) end, { rnd({ 9, 2 }, 'f32', 2), ints(long) },
      'value 9', 'position [650]')
    same_error('index_select idx', function(x, i) return x:index_select(2, i) end,
      { rnd({ 2, 9 }, 'f32', 3), ints(long, 'i32') }, 'value 9')
    -- offsets: not starting at 0, decreasing (the first drop), not ending at the rows
    local x = rnd({ 10, 2 }, 'f32', 4)
    same_error('offsets start', pn.segment_sum, { x, ints({ 1, 4, 10 }) }, 'must start at 0')
    local dec = { 0 }
    for i = 2, 400 do dec[i] = math.min(i, 10) end
    dec[300], dec[350] = 3, 1
    same_error('offsets drop', pn.segment_sum, { x, ints(dec) }, 'offsets[300] = 3 after offsets[299] = 10')
    same_error('offsets end', pn.segment_softmax, { x, ints({ 0, 4, 9 }, 'i32') }, 'must end at the 10 rows')
    -- a lone entry: S = 0 segments of a 0-row x are fine on both
    local e = pn.segment_sum(pn.zeros({ 0, 3 }, { device = 'cuda' }), ints({ 0 }):to('cuda'))
    assert.same({ 0, 3 }, e:shape())
  end)
end)
