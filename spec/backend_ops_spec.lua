-- backend_ops_spec.lua — every op on every available backend against the CPU f64 reference,
-- values and gradients (spec/helpers/op_harness.lua; ggml's test-backend-ops is the model).
-- The cases: spec/helpers/op_cases.lua. Backends: spec/helpers/backends.lua (the CPU's f32 path today;
-- a CUDA build adds 'cuda' in f32 and f64 without touching this file).
local pn = require 'penumbra'
local H = require 'spec.helpers.op_harness'
local backends = require 'spec.helpers.backends'
local x = H.x
local CASES = require 'spec.helpers.op_cases'

-- ---- the runs -------------------------------------------------------------------------------------------
describe('backend ops', function()
  for _, be in ipairs(backends.list()) do
    for _, dtype in ipairs(be.dtypes) do
      it(string.format('%d cases on %s %s against CPU f64, values and gradients', #CASES, be.device, dtype), function()
        local failures, grads, pending = {}, 0, 0
        for _, c in ipairs(CASES) do
          local ok, res = pcall(H.check, c, { device = be.device, dtype = dtype })
          if ok then grads = grads + res
          elseif backends.pending(be.device, res) then pending = pending + 1
          else failures[#failures + 1] = tostring(res) end
        end
        assert.equal(0, #failures, table.concat(failures, '\n'))
        assert.is_true(grads > (#CASES - pending) / 2, 'only ' .. grads .. ' gradients compared')
      end)
    end
  end
end)

-- the harness can fail: an op that differs between dtypes in its value, or only in its gradient
describe('op harness', function()
  local cpu = { device = 'cpu', dtype = 'f32' }
  it('catches a wrong value', function()
    local ok, e = pcall(H.check, { name = 'off by 0.1%', inputs = { x({ 3 }) },
      op = function(a) return a:dtype() == 'f32' and a * 1.001 + 0.01 or a * 1 end }, cpu)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('off by 0.1% [cpu f32] output: element 1', 1, true), tostring(e))
  end)
  it('catches a wrong gradient with right values', function()
    local ok, e = pcall(H.check, { name = 'detached', inputs = { x({ 4 }) },
      op = function(a) return a:dtype() == 'f32' and a * a:detach() or a * a end }, cpu)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('detached [cpu f32] gradient of input 1', 1, true), tostring(e))
  end)
  it('catches a wrong shape and NaN where the reference has a number', function()
    local ok, e = pcall(H.check, { name = 'shape', inputs = { x({ 2, 3 }) },
      op = function(a) return a:dtype() == 'f32' and a:reshape(3, 2) or a * 1 end }, cpu)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('output shape', 1, true), tostring(e))
    ok, e = pcall(H.check, { name = 'nan', inputs = { x({ 3 }) }, grad = false,
      op = function(a) return a:dtype() == 'f32' and a * (0 / 0) or a * 1 end }, cpu)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('is nan', 1, true), tostring(e))
  end)
  it('gives every dtype the same input values (inputs differ only by rounding)', function()
    local seen = {}
    H.check({ name = 'capture', inputs = { x({ 6 }, { view = nil }) }, grad = false,
      op = function(a) seen[a:dtype()] = a:to('f64'):totable(); return a * 1 end }, cpu)
    for i = 1, 6 do assert.is_true(math.abs(seen.f32[i] - seen.f64[i]) < 1e-7) end
  end)
end)
