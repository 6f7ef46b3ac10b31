-- spec/helpers/op_harness.lua — the backend-parametrised op harness (after ggml's
-- test-backend-ops): a case is an op and the inputs it takes; H.check runs it on a backend
-- (device + dtype) and on the reference (CPU f64) from the same numbers, and compares the
-- outputs and the gradients of every differentiable input under one random cotangent.
--
--   local H = require 'spec.helpers.op_harness'
--   H.check({ name = 'add broadcast', op = function(a, b) return a + b end,
--             inputs = { H.x({ 2, 3 }), H.x({ 3 }) } }, { device = 'cpu', dtype = 'f32' })
--
-- Input specs (each made afresh per run, the same values for every dtype and device):
--   H.x(shape, {lo=, hi=, view=, grad=})  floats uniform in [lo, hi) (default [-1, 1));
--       view = 't' (built transposed, so the op sees strides (1, n)), 'slice' (rows 2.. of a
--       taller tensor: an offset and a larger stride), 'expand' (shape[1] built as 1 and
--       expanded: stride 0); grad = false keeps it a constant (default: a gradient is checked)
--   H.index(shape, hi)                    i64 indices in [0, hi), 0-based as every index tensor
--   H.offsets(counts)                     i64 CSR offsets of the given segment lengths
--   H.mask(shape, p)                      u8, each entry 1 with probability p (default 0.7)
--   H.graph(n, edges)                     pn.graph(edges, n) (self loops added)
--   H.const(v)                            v itself (a number, a string, a table)
-- A case: name, op(inputs…) -> tensor, inputs, and optionally tol (rtol for f32: |got − ref|
-- ≤ tol·(1 + |ref|), default 2e-4), grad = false (values only), seed.
-- H.check raises an error naming the case, the backend, the output or input and the element.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'

local H = {}

function H.x(shape, o)
  o = o or {}
  return { kind = 'float', shape = shape, lo = o.lo or -1, hi = o.hi or 1, view = o.view, grad = o.grad ~= false }
end
function H.index(shape, hi) return { kind = 'index', shape = shape, hi = hi } end
function H.offsets(counts) return { kind = 'offsets', counts = counts } end
function H.mask(shape, p) return { kind = 'mask', shape = shape, p = p or 0.7 } end
function H.graph(n, edges) return { kind = 'graph', n = n, edges = edges } end
function H.const(v) return { kind = 'const', v = v } end

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

local function copy(t)
  local r = {}
  for i, v in ipairs(t) do r[i] = v end
  return r
end

-- a flat list of n numbers from the case's generator
local function draw(r, n, f)
  local out = {}
  for i = 1, n do out[i] = f(r) end
  return out
end

local function on(t, device)
  if device ~= 'cpu' then return t:to(device) end
  return t
end

-- builds one input for (dtype, device); returns the value handed to the op and, for a
-- differentiable float input, the leaf whose .grad is compared
local function make(spec, seed, dtype, device, want_grad)
  local r = check.rng(seed)
  if spec.kind == 'const' then return spec.v end
  if spec.kind == 'index' then
    local vals = draw(r, numel(spec.shape), function(rr) return math.floor(rr:u() * spec.hi) end)
    return on(pn.tensor(vals, { dtype = 'i64' }):reshape(spec.shape), device)
  end
  if spec.kind == 'offsets' then
    local off = { 0 }
    for i, c in ipairs(spec.counts) do off[i + 1] = off[i] + c end
    return on(pn.tensor(off, { dtype = 'i64' }), device)
  end
  if spec.kind == 'mask' then
    local vals = draw(r, numel(spec.shape), function(rr) return rr:u() < spec.p and 1 or 0 end)
    return on(pn.tensor(vals, { dtype = 'u8' }):reshape(spec.shape), device)
  end
  if spec.kind == 'graph' then
    local g = pn.graph(pn.tensor(spec.edges, { dtype = 'i64' }), spec.n)
    if device ~= 'cpu' then g.offsets, g.src = g.offsets:to(device), g.src:to(device) end
    return g
  end
  -- floats: the stored shape depends on the view; the logical values are the same for every
  -- dtype and device because they come from the same stream in the same order
  local shape, view = spec.shape, spec.view
  local stored = copy(shape)
  local nd = #shape
  if view == 't' then
    assert(nd >= 2, 'view t needs 2 dims')
    stored[nd - 1], stored[nd] = shape[nd], shape[nd - 1]
  elseif view == 'slice' then
    stored[1] = shape[1] + 2
  elseif view == 'expand' then
    stored[1] = 1
  elseif view ~= nil then
    error('op_harness: unknown view ' .. tostring(view))
  end
  local vals = draw(r, numel(stored), function(rr) return spec.lo + (spec.hi - spec.lo) * rr:u() end)
  local leaf = on(pn.tensor(vals, { dtype = dtype }):reshape(stored), device)
  if want_grad and spec.grad then leaf:requires_grad_() else leaf = leaf:detach() end
  local x = leaf
  if view == 't' then x = leaf:transpose(-1, -2)
  elseif view == 'slice' then x = leaf:narrow(1, 3, shape[1])
  elseif view == 'expand' then x = leaf:expand(unpack(shape)) end
  return x, (want_grad and spec.grad) and leaf or nil
end

local function flat64(t) return check.vals(t:to('cpu'):to('f64')) end

local function compare(got, ref, tol, what)
  if #got ~= #ref then
    error(string.format('%s: %d elements, the reference has %d', what, #got, #ref), 0)
  end
  for i = 1, #ref do
    local g, rv = got[i], ref[i]
    local ok
    if rv ~= rv then ok = g ~= g
    elseif rv == math.huge or rv == -math.huge then ok = g == rv
    else ok = math.abs(g - rv) <= tol * (1 + math.abs(rv)) end
    if not ok then
      error(string.format('%s: element %d is %.9g, the reference %.9g (tolerance %g·(1+|ref|))', what, i, g, rv, tol), 0)
    end
  end
end

-- one run of the case: its output and the gradients of its leaves under cotangent w
local function run(case, dtype, device, grads)
  local seed = case.seed or 1
  local args, leaves = {}, {}
  for i, spec in ipairs(case.inputs) do
    local x, leaf = make(spec, seed * 1000 + i, dtype, device, grads)
    args[i], leaves[i] = x, leaf
  end
  local n = #case.inputs
  local out = case.op(unpack(args, 1, n))
  if not pn.is_tensor(out) then error(case.name .. ': the op returned ' .. type(out) .. ', not a tensor', 0) end
  local g = {}
  if grads and out.requires_grad then
    local shape = out:shape()
    local w = draw(check.rng(seed + 77), math.max(1, out:numel()), function(rr) return 2 * rr:u() - 1 end)
    local cot = on(pn.tensor(w, { dtype = out:dtype() }):narrow(1, 1, out:numel()):reshape(shape), device)
    out:backward(cot)
    for i = 1, n do
      if leaves[i] then g[i] = leaves[i].grad end
    end
  end
  return out, g
end

function H.check(case, backend)
  local tol = case.tol or (backend.dtype == 'f64' and 1e-10 or 2e-4)
  local label = string.format('%s [%s %s]', case.name, backend.device, backend.dtype)
  local grads = case.grad ~= false
  local ref, rg = run(case, 'f64', 'cpu', grads)
  local got, gg = run(case, backend.dtype, backend.device, grads)
  if got:dtype() ~= ref:dtype() and ref:dtype() == 'f64' and got:dtype() ~= backend.dtype then
    error(label .. ': output dtype ' .. got:dtype() .. ', expected ' .. backend.dtype, 0)
  end
  if got:device() ~= backend.device then
    error(label .. ': output on ' .. got:device() .. ', expected ' .. backend.device, 0)
  end
  check.assert_close(got:shape(), ref:shape(), 0, label .. ': output shape')
  compare(flat64(got), flat64(ref), tol, label .. ' output')
  local compared = 0
  for i in pairs(case.inputs) do
    if rg[i] ~= nil or gg[i] ~= nil then
      if rg[i] == nil or gg[i] == nil then
        error(string.format('%s: input %d has a gradient on one side only (reference %s, backend %s)', label, i,
          tostring(rg[i] ~= nil), tostring(gg[i] ~= nil)), 0)
      end
      compare(flat64(gg[i]), flat64(rg[i]), tol, label .. ' gradient of input ' .. i)
      compared = compared + 1
    end
  end
  return compared
end

return H
