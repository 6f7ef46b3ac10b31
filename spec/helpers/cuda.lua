-- spec/helpers/cuda.lua — what the CUDA kernel specs (cuda_*_spec.lua) share: the thread orders
-- of the kernel interpreter a case runs under, and seeded CPU inputs to compare the devices from.
--   cu.ORDERS                  { 'fwd', 'rev', 'rand:3' }: the interpreter's thread orders
--   cu.SCHEDULES               cu.ORDERS in the interpreter build; { false } (once, as it is) on
--                              a GPU or without cuda
--   cu.DTYPES                  { 'f32', 'f64' }, the float dtypes the kernels are checked in
--   cu.TOL                     { f32 = 1e-5, f64 = 1e-12 }: relative tolerance against the CPU
--   cu.schedules(fn[, list])   fn(s) under pn.cuda.with_schedule(s) for each s of list (default
--                              cu.SCHEDULES); fn('gpu') for a false entry
--   cu.each(fn[, list])        fn(dtype, s) under every schedule of list, for every cu.DTYPES
--   cu.numel(shape)            the product of a shape (a Lua list)
--   cu.rnd(shape, dtype, seed[, lo, hi, edit])   a CPU tensor of uniform values in [lo, hi)
--                              (default [-1, 1)) from check.rng(seed), any shape (empty ones
--                              too); edit(vals) may change the flat list first
--   cu.close(got, ref, tol, what)   got on cuda has ref's shape and dtype and its values within
--                              tol (check.assert_close)
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local assert = require 'luassert' -- busted's assert lives in each spec file's environment

local M = {}

M.ORDERS = { 'fwd', 'rev', 'rand:3' }
M.SCHEDULES = (pn.cuda.available() and pn.cuda.interpreted()) and M.ORDERS or { false }
M.DTYPES = { 'f32', 'f64' }
M.TOL = { f32 = 1e-5, f64 = 1e-12 }

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

return M
