-- gat_cuda_spec.lua — `./bench experiments/cora_umbral.lua device=cuda`: the GAT recipe trains on
-- the CUDA device (the kernel interpreter here, a GPU where there is one) and computes what the
-- CPU computes — the same dropout masks (one Philox stream), so the same training losses.
local pn = require 'penumbra'
local cu = require 'spec.helpers.cuda'

local it_cuda = pn.cuda.available() and it or pending
local home = os.getenv('PENUMBRA_HOME') or '.'

local function run(device)
  local r = cu.run_experiment('experiments/cora_umbral.lua', { epochs = '2', device = device })
  local f = pn.io.open(r.path, 'r')
  local loss = f:read('metrics/loss'):totable()
  local dev = f:attr('/', 'device')
  f:close()
  return loss, dev, r
end

describe('GAT recipe on cuda', function()
  it_cuda('cora_umbral device=cuda: two epochs, the CPU run\'s losses, the device in the run file', function()
    local lc = run('cpu')
    local lg, dev, r = run('cuda')
    assert.equal('cuda', dev)
    assert.equal(#lc, #lg)
    for i = 1, #lc do
      assert.is_true(math.abs(lc[i] - lg[i]) <= 1e-4 * (1 + math.abs(lc[i])),
        string.format('epoch %d: cpu loss %.7f, cuda loss %.7f', i, lc[i], lg[i]))
    end
    assert.truthy(r.test_acc >= 0 and r.test_acc <= 1)
  end)

  it('device=cuda where there is no device is an error that says how to get one', function()
    if pn.cuda.available() then return end
    local saved = rawget(_G, 'args')
    _G.args = { epochs = '1', device = 'cuda', _quiet = true }
    local ok, e = pcall(dofile, home .. '/experiments/cora_umbral.lua')
    _G.args = saved
    assert.is_false(ok)
    assert.truthy(tostring(e):find('no CUDA device', 1, true), tostring(e))
  end)
end)
