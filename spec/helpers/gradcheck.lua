-- spec/helpers/gradcheck.lua — finite-difference gradient checks in f64.
--
--   local gradcheck = require 'spec.helpers.gradcheck'
--   gradcheck(function(x, w) return x:matmul(w) end, { x, w })      -- raises on mismatch
--   local ok, report = gradcheck.check(fn, inputs, { eps = 1e-6, atol = 1e-5, rtol = 1e-4 })
--
-- inputs: f64 CPU tensors; the ones with requires_grad are checked (others are constants).
-- The output may have any shape: the check contracts it with a fixed random cotangent w,
-- so it compares <w, J·e_i> by central differences against the analytic vector-Jacobian
-- product from backward(w). It touches only raw memory and pn_backward, not the ops
-- under test, so a broken op cannot hide its own error.
local pn = require 'penumbra'
local ffi = require 'ffi'

local M = {}

local function flat(t)
  local c = t:contiguous():to('f64')
  local n = c:numel()
  local p = ffi.cast('double *', c:data_ptr())
  local r = {}
  for i = 0, n - 1 do r[i + 1] = p[i] end
  return r
end
M.flat = flat

local function dot(a, b)
  local s = 0
  for i = 1, #a do s = s + a[i] * b[i] end
  return s
end

function M.check(fn, inputs, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-6, opts.rtol or 1e-5
  for i, x in ipairs(inputs) do
    if pn.is_tensor(x) and x.requires_grad and x:dtype() ~= 'f64' then
      error('gradcheck: input ' .. i .. ' must be f64, got ' .. x:dtype(), 2)
    end
  end
  -- analytic
  for _, x in ipairs(inputs) do if pn.is_tensor(x) and x.requires_grad then x:zero_grad() end end
  local out = fn(unpack(inputs))
  pn.manual_seed(opts.seed or 1234)
  local w = pn.randn(out:shape(), { dtype = 'f64' })
  local wf = flat(w)
  out:backward(w)
  local report = {}
  local ok = true
  for k, x in ipairs(inputs) do
    if pn.is_tensor(x) and x.requires_grad then
      local g = x.grad
      local gf = g and flat(g) or nil
      if not x:is_contiguous() then error('gradcheck: input ' .. k .. ' must be contiguous', 2) end
      local p = ffi.cast('double *', x:data_ptr())
      for i = 0, x:numel() - 1 do
        local orig = p[i]
        p[i] = orig + eps
        local fp = dot(flat(pn.no_grad(fn, unpack(inputs))), wf)
        p[i] = orig - eps
        local fm = dot(flat(pn.no_grad(fn, unpack(inputs))), wf)
        p[i] = orig
        local num = (fp - fm) / (2 * eps)
        local ana = gf and gf[i + 1] or 0
        if math.abs(num - ana) > atol + rtol * math.abs(num) or ana ~= ana then
          ok = false
          report[#report + 1] = string.format('input %d element %d: analytic %.10g, numeric %.10g', k, i + 1, ana, num)
          if #report > 10 then break end
        end
      end
    end
  end
  return ok, table.concat(report, '\n')
end

setmetatable(M, {
  __call = function(_, fn, inputs, opts)
    local ok, report = M.check(fn, inputs, opts)
    if not ok then error('gradcheck failed:\n' .. report, 2) end
    return true
  end,
})

return M
