-- The device seam (core/backend.h, core/kernels.def): every op's kernels are in one list, the
-- CPU backend has all of them, and a device that is not built is a clear error. (A CUDA build
-- adds its table; pn.kernels('cuda') then lists what that table still lacks.)
local pn = require 'penumbra'
local B = require 'penumbra_ffi'
local check = require 'spec.helpers.check'

-- kernels.def read as text: the independent list the library's must match
local function def_kernels()
  local f = assert(io.open(B.root .. '/core/kernels.def'))
  local src = f:read('*a')
  f:close()
  src = src:gsub('/%*.-%*/', '') -- comments mention PN_KERNEL too
  local names = {}
  for name in src:gmatch('PN_KERNEL%(%s*([%w_]+)%s*,') do
    if name ~= 'name' then names[#names + 1] = name end
  end
  return names
end

describe('device seam', function()
  it('lists every kernel of kernels.def, in order, and the cpu has each one', function()
    local want = def_kernels()
    assert.is_true(#want >= 40, 'only ' .. #want .. ' kernels parsed from kernels.def')
    local got = pn.kernels('cpu')
    assert.same(want, { unpack(got) })
    for _, name in ipairs(got) do assert.is_true(got[name], 'cpu lacks ' .. name) end
  end)

  it('covers the op families: creation, elementwise, reductions, indexing, losses, attention', function()
    local got = pn.kernels('cpu')
    for _, name in ipairs({ 'mem_alloc', 'copy', 'fill', 'fill_random', 'binary', 'unary', 'reduce', 'softmax_lines',
                            'layer_norm_fwd', 'matmul', 'select_rows', 'gather', 'segment_softmax', 'cross_entropy_fwd',
                            'dropout_fwd', 'cosine_fwd', 'power_fwd', 'rope_fwd', 'rowmap_fwd', 'graph_csr',
                            'attention_dense_fwd', 'attention_graph_bwd', 'accumulate', 'sum_to' }) do
      assert.is_true(got[name], name)
    end
  end)

  it('a device this build lacks is an error, not a silent cpu run', function()
    if pn.cuda_available() then return end -- a CUDA build: covered by the backend op harness
    check.assert_error_matching(function() pn.kernels('cuda') end, 'kernels', 'cuda', 'not available')
    -- a CUDA build on a machine without a GPU says why the device is not available; a build
    -- without CUDA says so
    local ok, err = pcall(pn.zeros, { 2 }, { device = 'cuda' })
    assert.is_false(ok, 'expected an error')
    err = tostring(err)
    assert.truthy(err:find('zeros: device cuda is not available: ', 1, true)
      or err:find('zeros: this build of penumbra has no cuda backend (built without CUDA)', 1, true), err)
    check.assert_error_matching(function() pn.kernels('tpu') end, 'kernels', 'tpu', 'cpu, cuda')
  end)
end)
