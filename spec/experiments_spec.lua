-- Every experiment script runs: one epoch each (two steps for the step-based ones), quietly, into a temporary runs directory (a
-- script whose model cannot be built for its score, say, fails here and not in a user's hands).
local pn = require 'penumbra'

local home = os.getenv('PENUMBRA_HOME') or '.'
local runs = os.tmpname()
os.remove(runs)
local ffi = require 'ffi'
pcall(ffi.cdef, 'int setenv(const char *, const char *, int);')

describe('experiment scripts', function()
  local p = io.popen("ls '" .. home .. "'/experiments/*.lua")
  local scripts = {}
  for l in p:lines() do scripts[#scripts + 1] = l end
  p:close()
  it('there are some', function() assert.is_true(#scripts >= 12) end)
  for _, script in ipairs(scripts) do
    -- the ablation drivers are sweeps of many runs (spec/nmt_ablation_spec.lua runs one at a tiny size)
    if script:find('/nmt_ablation_[^/]*$') then goto continue end
    it(script:match('[^/]+$') .. ' runs an epoch', function()
      ffi.C.setenv('PENUMBRA_RUNS', runs, 1)
      local saved = rawget(_G, 'args')
      -- one epoch; a step-based experiment (online data) runs two steps on small graphs instead;
      -- PPI one epoch on a small synthetic set with a narrow model
      _G.args = { epochs = '1', _quiet = true }
      if script:find('/ppi_[^/]*$') then
        _G.args = { epochs = '1', dataset = 'synthetic', synthetic_graphs = '3', synthetic_nodes = '40', hidden = '8',
                    _quiet = true }
      end
      -- NMT: the small preset on the first 64 training and 8 evaluation pairs
      if script:find('/nmt_[^/]*$') then
        _G.args = { epochs = '1', preset = 'small', train_limit = '64', eval_limit = '8', threads = '1', _quiet = true }
      end
      local ok, r = pcall(dofile, script)
      if not ok and tostring(r):find("unknown config key 'epochs'", 1, true) then
        _G.args = { steps = '2', eval_size = '4', n = '60', _quiet = true }
        ok, r = pcall(dofile, script)
      end
      _G.args = saved
      assert.is_true(ok, tostring(r))
      assert.equal('finished', r.status)
      if r.test_bleu then
        assert.truthy(r.test_bleu >= 0 and r.test_bleu <= 100)
      else
        local metric = r.test_acc or r.test_f1
        assert.truthy(metric >= 0 and metric <= 1)
      end
    end)
    ::continue::
  end
end)
