-- spec/helpers/cuda.lua — what the CUDA kernel specs (cuda_*_spec.lua) share: the thread orders
-- of the kernel interpreter a case runs under, and seeded CPU inputs to compare the devices from.
--   cu.ORDERS                  { 'fwd', 'rev', 'rand:3' }: the interpreter's thread orders
--   cu.SCHEDULES               cu.ORDERS in the interpreter build; { false } (once, as it is) on
--                              a GPU or without cuda
--   cu.DTYPES                  { 'f32', 'f64' }, the float dtypes the kernels are checked in
--   cu.TOL                     { f32 = 1e-5, f64 = 1e-12, bf16 = 2e-2 }: relative tolerance against the CPU
--   cu.schedules(fn[, list])   fn(s) under pn.cuda.with_schedule(s) for each s of list (default
--                              cu.SCHEDULES); fn('gpu') for a false entry
--   cu.each(fn[, list])        fn(dtype, s) under every schedule of list, for every cu.DTYPES
--   cu.each_form(forms, norms, fn[, list])   fn(dtype, s, form, norm) for every form of forms
--                              (cu.forms) and normalize of norms, under cu.each
--   cu.numel(shape)            the product of a shape (a Lua list)
--   cu.rnd(shape, dtype, seed[, lo, hi, edit])   a CPU tensor of uniform values in [lo, hi)
--                              (default [-1, 1)) from check.rng(seed), any shape (empty ones
--                              too); edit(vals) may change the flat list first
--   cu.close(got, ref, tol, what)   got on cuda has ref's shape and dtype and its values within
--                              tol (check.assert_close)
--   cu.compare(what, tol, op, inputs[, grads])   op(dev, inputs…) on the CPU and on cuda from the
--                              same values (tensors copied, others as they are): the output and
--                              the gradient of every input in grads (indices) under one random
--                              cotangent, within tol
--   cu.msg(e)                  an error message without the Lua position that pcall adds
--   cu.run_experiment(script, args)   an experiment script run with the overrides args, its run
--                              files in a fresh temporary folder; the finished run's result
--   cu.forms(variants[, keep]) { name } per registry score of variants (pn.attention_variants)
--                              that keep(name) accepts (default all), { 'hyperbolic', model } for
--                              each of hyperbolic's three models
--   cu.params_of(variants, name, model, D, try[, aggregate])   the parameters a form reads, as
--                              op_cases.lua finds them: each registry parameter p for which
--                              try(o) (a pcall of the op with o = { score, model, [p.name] = its
--                              default }) succeeds or fails for another reason than "has no
--                              parameter", as { name, lo, hi } drawn near its default; with
--                              aggregate 'einstein', curvature too
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local assert = require 'luassert' -- busted's assert lives in each spec file's environment

local M = {}
local ffi = require 'ffi'
pcall(ffi.cdef, 'int setenv(const char *, const char *, int);')

M.ORDERS = { 'fwd', 'rev', 'rand:3' }
M.SCHEDULES = (pn.cuda.available() and pn.cuda.interpreted()) and M.ORDERS or { false }
M.DTYPES = { 'f32', 'f64' }
M.TOL = { f32 = 1e-5, f64 = 1e-12, bf16 = 2e-2 } -- bf16: tensor-core inputs (precision = 'bf16' / 'f16') against f64

function M.schedules(fn, list)
  for _, s in ipairs(list or M.SCHEDULES) do
    if s then pn.cuda.with_schedule(s, function() fn(s) end) else fn('gpu') end
  end
end

function M.each(fn, list)
  M.schedules(function(s)
    for _, dt in ipairs(M.DTYPES) do fn(dt, s) end
  end, list)
end

function M.each_form(forms, norms, fn, list)
  M.each(function(dt, s)
    for _, form in ipairs(forms) do
      for _, norm in ipairs(norms) do fn(dt, s, form, norm) end
    end
  end, list)
end

function M.numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

function M.rnd(shape, dtype, seed, lo, hi, edit)
  lo, hi = lo or -1, hi or 1
  local n = M.numel(shape)
  local r, v = check.rng(seed), {}
  for i = 1, math.max(1, n) do v[i] = lo + (hi - lo) * r:u() end
  if edit then edit(v) end
  local t = pn.tensor(v, { dtype = dtype })
  if n == 0 then return t:narrow(1, 1, 0):reshape(shape) end
  return t:reshape(shape)
end

function M.close(got, ref, tol, what)
  assert.equal(table.concat(ref:shape(), ','), table.concat(got:shape(), ','), what .. ': shape')
  assert.equal(ref:dtype(), got:dtype(), what .. ': dtype')
  assert.equal('cuda', got:device(), what .. ': device')
  if ref:numel() > 0 then check.assert_close(check.vals(got:to('cpu')), check.vals(ref), tol, what) end
end

function M.compare(what, tol, op, inputs, grads)
  local function run(dev)
    local args, leaves = {}, {}
    for i, x in ipairs(inputs) do
      local t = x
      if pn.is_tensor(x) then
        t = dev == 'cuda' and x:to('cuda') or x:clone()
        if grads and grads[i] then t:requires_grad_() end
      end
      args[i], leaves[i] = t, t
    end
    local out = op(dev, unpack(args, 1, #inputs))
    local g = {}
    if grads and out.requires_grad then
      local w = M.rnd(out:shape(), out:dtype(), 77)
      out:backward(dev == 'cuda' and w:to('cuda') or w)
      for i in pairs(grads) do g[i] = leaves[i].grad end
    end
    return out, g
  end
  local ref, rg = run('cpu')
  local got, gg = run('cuda')
  M.close(got, ref, tol, what .. ' output')
  for i in pairs(grads or {}) do
    assert.is_true(rg[i] ~= nil and gg[i] ~= nil, what .. ': gradient of input ' .. i .. ' missing')
    M.close(gg[i], rg[i], tol, what .. ' gradient of input ' .. i)
  end
end

function M.msg(e) return (tostring(e):gsub('^[^:]*:%d+: ', '')) end

function M.forms(variants, keep)
  local forms = {}
  for _, name in ipairs(variants) do
    if not keep or keep(name) then
      if name == 'hyperbolic' then
        for _, m in ipairs({ 'hyperboloid', 'halfspace', 'poincare' }) do forms[#forms + 1] = { name, m } end
      else
        forms[#forms + 1] = { name }
      end
    end
  end
  return forms
end

function M.params_of(variants, name, model, D, try, aggregate)
  local out = {}
  for _, p in ipairs(variants[name].params) do
    local v = p.default or 1 / math.sqrt(D)
    local ok, e = try({ score = name, model = model, [p.name] = pn.tensor({ v }, { dtype = 'f64' }) })
    if ok or not tostring(e):find('has no parameter ' .. p.name, 1, true) then
      out[#out + 1] = { name = p.name, lo = v * 1.05 + 0.02, hi = v * 1.2 + 0.05 }
    end
  end
  if aggregate == 'einstein' then
    local has = false
    for _, p in ipairs(out) do has = has or p.name == 'curvature' end
    if not has then out[#out + 1] = { name = 'curvature', lo = 0.8, hi = 1.2 } end
  end
  return out
end

-- The experiment script (a path under the repository) run in this process with the overrides
-- args (strings, as on the command line; quiet), its run files in a fresh temporary folder:
-- the runner's result, which must have finished.
function M.run_experiment(script, args)
  local runs = os.tmpname()
  os.remove(runs)
  ffi.C.setenv('PENUMBRA_RUNS', runs, 1)
  local saved = rawget(_G, 'args')
  _G.args = { _quiet = true }
  for k, v in pairs(args) do _G.args[k] = v end
  local ok, r = pcall(dofile, (os.getenv('PENUMBRA_HOME') or '.') .. '/' .. script)
  _G.args = saved
  assert.is_true(ok, tostring(r))
  assert.equal('finished', r.status)
  return r
end

return M
