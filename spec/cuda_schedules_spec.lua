-- cuda_schedules_spec.lua — every op case (spec/helpers/op_cases.lua) on cuda under the kernel
-- interpreter's other thread orders: backend_ops_spec runs them in the default order (fwd);
-- here the threads of each block run in reverse and in a seeded random order between barriers,
-- so a kernel missing a __syncthreads (or relying on warp-synchronous order) gives a different,
-- wrong, answer. The f32 path against the CPU f64 reference, values and gradients.
local pn = require 'penumbra'
local H = require 'spec.helpers.op_harness'
local backends = require 'spec.helpers.backends'
local CASES = require 'spec.helpers.op_cases'

local it_emu = (pn.cuda.available() and pn.cuda.interpreted()) and it or pending

describe('cuda op cases under other thread orders', function()
  for _, sched in ipairs({ 'rev', 'rand:7' }) do
    it_emu(string.format('%d cases on cuda f32, schedule %s', #CASES, sched), function()
      local failures, ran = {}, 0
      pn.cuda.with_schedule(sched, function()
        for _, c in ipairs(CASES) do
          local ok, res = pcall(H.check, c, { device = 'cuda', dtype = 'f32' })
          if ok then ran = ran + 1
          elseif not backends.pending('cuda', res) then failures[#failures + 1] = tostring(res) end
        end
      end)
      assert.equal(0, #failures, table.concat(failures, '\n'))
      assert.is_true(ran > #CASES / 2, 'only ' .. ran .. ' cases ran')
    end)
  end
end)
