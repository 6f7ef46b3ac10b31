-- One options checker for the whole Lua API (lua/penumbra/options.lua): unknown keys are
-- errors listing the valid ones; values are type- and range-checked; booleans are booleans;
-- an option that does not apply to the chosen score is an error, never silently ignored.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local assert_error = check.assert_error_matching

describe('options', function()
  it('misspelled keys are errors listing the valid ones, everywhere', function()
    assert_error(function() pn.zeros({ 2 }, { dtyp = 'f64' }) end, 'zeros', "unknown option 'dtyp'", 'dtype')
    assert_error(function() pn.nn.Linear(3, 4, { bais = false }) end, 'Linear', "'bais'", 'bias')
    local m = pn.nn.Linear(3, 4)
    assert_error(function() pn.optim.Adam(m, { weight_decya = 1 }) end, 'Adam', "'weight_decya'", 'weight_decay')
    assert_error(function() pn.optim.SGD(m, { lr = 0.1, momentun = 0.9 }) end, 'SGD', 'momentum')
    assert_error(function() pn.data.planetoid('cora', { normalise_features = false }) end, 'normalize_features')
    assert_error(function() pn.cross_entropy(pn.zeros({ 2, 3 }), { 0, 1 }, { reduce = 'sum' }) end, 'reduction')
    assert_error(function() pn.nn.GAT(3, 4, { headz = 2 }) end, 'GAT', "'headz'", 'heads')
    assert_error(function() pn.nn.MultiheadAttention(8, 2, { learn_r = true }) end, "score 'dot'", 'scale')
  end)

  it('the maps, the Klein conversions, the linear family and the graph builder check their keys', function()
    -- each typo would otherwise leave the default in place: {casual=false} stays causal
    local x = pn.rand({ 1, 2, 4, 4 }) * 0.1
    assert_error(function() pn.maps.xi(x, { hh = 2 }) end, 'maps.xi', "unknown option 'hh'", 'valid: h')
    assert_error(function() pn.maps.exp0(x, { scalelast = true }) end, 'maps.exp0', "'scalelast'", 'scale_last')
    assert_error(function() pn.maps.psi(x, { h = 2 }) end, 'maps.psi', 'takes no options')
    assert_error(function() pn.maps.pseudopolar(x, { h = 2 }) end, 'maps.pseudopolar', 'takes no options')
    assert_error(function() pn.hyper.to_klein(x, { cc = 1 }) end, 'hyper.to_klein', "'cc'", 'c, from')
    assert_error(function() pn.hyper.from_klein(x, { from = 'poincare' }) end, 'hyper.from_klein', "'from'", 'c, to')
    assert_error(function() pn.cosine_attention(x, x, x, 0.5, { casual = false }) end, 'cosine_attention', "'casual'", 'causal')
    assert_error(function() pn.power_attention(x, x, x, { casual = false }) end, 'power_attention', "'casual'", 'causal')
    assert_error(function() pn.power_attention(x, x, x, { causal = 'false' }) end, 'power_attention', 'causal', 'boolean')
    assert_error(function() pn.rope(x, { bsae = 100 }) end, 'rope', "'bsae'", 'base')
    assert_error(function() pn.cosine_state { batch = 1, heads = 2, dim = 4, m = 0.5, dimv = 4 } end, 'cosine_state', "'dimv'", 'dim_v')
    assert_error(function() pn.power_state { batch = 1, heads = 2, dim = 4, pp = 2 } end, 'power_state', "'pp'")
    local e = pn.tensor({ { 0, 1 } }, { dtype = 'i64' })
    assert_error(function() pn.graph(e, 2, { self_loop = false }) end, 'graph', "'self_loop'", 'self_loops')
    -- the right keys still work and still mean what they say
    assert.are.equal(1, pn.graph(e, 2, { self_loops = false }).num_edges)
    assert.are.equal(3, pn.graph(e, 2, { self_loops = true }).num_edges)
    assert.are.same({ 1, 2, 4, 4 }, pn.maps.exp0(x, { h = 1, scale_last = true }):shape())
    assert.are.same({ 1, 2, 4, 4 }, pn.power_attention(x, x, x, { causal = false, chunk = 0 }):shape())
  end)

  it('size arguments of layers are positive whole numbers, named', function()
    -- a table where d_model belongs (an options-style call) used to die in arithmetic on a table
    assert_error(function() pn.nn.MultiheadAttention { d_model = 8, heads = 2 } end,
      'MultiheadAttention', 'd_model', 'positive whole number', 'got a table')
    assert_error(function() pn.nn.MultiheadAttention(8, 0) end, 'MultiheadAttention', 'heads')
    assert_error(function() pn.nn.GATConv { fin = 8 } end, 'GATConv', 'in_features', 'got a table')
    assert_error(function() pn.nn.GATConv(8) end, 'GATConv', 'out_features', 'got a nil')
    assert_error(function() pn.nn.GAT(8, 2.5) end, 'GAT', 'classes', '2.5')
    assert_error(function() pn.nn.InductiveGAT('8', 2) end, 'InductiveGAT', 'in_features', 'a string')
    assert_error(function() pn.nn.CosineAttention(8, -2) end, 'CosineAttention', 'heads', '-2')
  end)

  it('optimiser helpers: clipping bounds, schedule options, a missing parameter list', function()
    local p = pn.tensor({ 3, 4 }, { requires_grad = true })
    ;(p * p):sum():backward() -- grad (6, 8), norm 10
    for _, bad in ipairs({ -1, 0, 0 / 0, 'a' }) do
      assert_error(function() pn.optim.clip_grad_norm({ p }, bad) end, 'clip_grad_norm', 'max_norm')
    end
    assert.are.same({ 6, 8 }, p.grad:totable()) -- untouched by the refused calls (-1 used to flip them)
    local ok, msg = pcall(function() pn.optim.clip_grad_norm({ p }, -1) end)
    assert.is_false(ok)
    assert.truthy(tostring(msg):find('options_spec.lua:', 1, true), msg) -- blames this line
    assert.are.equal(10, pn.optim.clip_grad_norm({ p }, 5))
    assert.is_true(math.abs(p.grad:norm():item() - 5) < 1e-3)
    local opt = pn.optim.SGD({ p }, { lr = 1 })
    assert_error(function() pn.optim.Scheduler(opt, 'inverse_sqrt', { warmup = 0 }) end, 'inverse_sqrt', 'warmup', '>= 1')
    assert_error(function() pn.optim.Scheduler(opt, 'cosine', { totl = 5 }) end, 'cosine', "'totl'", 'total')
    assert_error(function() pn.optim.SGD(nil, { lr = 1 }) end, 'optimiser', 'module or a list of tensors', 'nil')
  end)

  it('layers name a wrong input width, and attention a wrong extra', function()
    assert_error(function() pn.nn.Linear(4, 2)(pn.zeros({ 2, 3 })) end, 'Linear(4 → 2): x [2,3]', '4 features')
    local m = pn.nn.MultiheadAttention(8, 2)
    assert_error(function() m(pn.zeros({ 1, 3, 7 })) end, 'MultiheadAttention: x_q [1,3,7]', 'd_model = 8')
    assert_error(function() m(pn.zeros({ 3, 8 })) end, 'MultiheadAttention: x_q [3,8]')
    assert_error(function() m(pn.zeros({ 1, 3, 8 }), pn.zeros({ 2, 3, 8 })) end, 'x_kv [2,3,8]', 'batch of x_q [1,3,8]')
    assert_error(function() m(pn.zeros({ 1, 3, 8 }), nil, { key_mask = pn.ones({ 1, 3 }) }) end, "'key_mask'", 'bias, mask')
    assert.are.same({ 2, 3, 8 }, m(pn.randn({ 2, 3, 8 }), pn.randn({ 2, 5, 8 })):shape())
  end)

  it('a dim of 0 is an error naming the op', function()
    local x = pn.zeros({ 2, 3 })
    assert_error(function() x:softmax(0) end, 'softmax: dim 0 is invalid', 'numbered from 1')
    assert_error(function() x:sum(0) end, 'sum: dim 0')
    assert_error(function() x:sum({ 1, 0 }) end, 'sum: dim 0')
    assert_error(function() x:transpose(0, 1) end, 'transpose: dim 0')
    assert_error(function() pn.cat({ x, x }, 0) end, 'cat: dim 0')
    assert_error(function() x:argmax(0) end, 'argmax: dim 0')
    assert_error(function() x:unsqueeze(0) end, 'unsqueeze: dim 0')
  end)

  it('values are type- and range-checked', function()
    local m = pn.nn.Linear(3, 4)
    assert_error(function() pn.optim.SGD(m, { lr = 0 / 0 }) end, 'SGD', 'lr', 'finite')
    assert_error(function() pn.optim.Adam(m, { lr = -1 }) end, 'Adam', 'lr', '>= 0')
    assert_error(function() pn.optim.Adam(m, { betas = { 0.9, 1.5 } }) end, 'Adam', 'betas')
    assert_error(function() pn.nn.Dropout(1.5) end, 'Dropout', '[0, 1)')
    assert_error(function() pn.nn.LayerNorm(4, { eps = -1 }) end, 'LayerNorm', 'eps')
    assert_error(function() pn.nn.Linear(3, 4, { bias = 'no' }) end, 'Linear', 'bias', 'boolean')
    assert_error(function() pn.nn.Linear(3.5, 4) end, 'Linear', 'in_features')
    assert_error(function() pn.nn.GAT(3, 4, { heads = 0 }) end, 'GAT', 'heads', '>= 1')
    assert_error(function() pn.nn.GAT(3, 4, { dropout = 1 }) end, 'GAT', 'dropout', '< 1')
    assert_error(function() pn.nn.GAT(3, 4, { score = 'umbral', r = -1 }) end, 'GAT', 'r', '> 0')
    assert_error(function() pn.zeros({ 2 }, { requires_grad = 1 }) end, 'zeros', 'requires_grad', 'boolean')
    assert_error(function() pn.cross_entropy(pn.zeros({ 2, 3 }), { 0, 1 }, { label_smoothing = 1 }) end, 'label_smoothing')
  end)

  describe('attention options', function()
    local q = pn.rand({ 1, 2, 4, 3 }) * 0.4 + 0.05
    local v = pn.rand({ 1, 2, 4, 2 })
    it('a NaN or infinite parameter is an error, not the default', function()
      for _, bad in ipairs({ 0 / 0, math.huge }) do
        assert_error(function() pn.attention(q, q, v, { score = 'laplacian', gamma = bad }) end, 'gamma', 'finite')
        assert_error(function() pn.attention(q, q, v, { score = 'dot', scale = bad }) end, 'scale', 'finite')
      end
    end)
    it('flags are booleans', function()
      assert_error(function() pn.attention(q, q, v, { causal = 'false' }) end, 'causal', 'true or false')
      assert_error(function() pn.attention(q, q, v, { causal = 0 }) end, 'causal', 'true or false')
      assert_error(function() pn.attention(q, q, v, { score = 'penumbral', squared = 1 }) end, 'squared')
    end)
    it('a parameter the score (or its model) does not read is an error', function()
      assert_error(function() pn.attention(q, q, v, { score = 'dot', r = 0.5 }) end, "score 'dot'", 'no parameter r')
      assert_error(function() pn.attention(q, q, v, { score = 'hyperbolic', curvature = 2 }) end,
        'curvature', 'no parameter curvature')
      assert_error(function() pn.attention(q, q, v, { score = 'hyperbolic', model = 'halfspace', curvature = 2 }) end,
        'no parameter curvature')
      -- where it is read, it works
      local ok = pcall(pn.attention, q * 0.5, q * 0.5, v, { score = 'hyperbolic', model = 'poincare', curvature = 2 })
      assert.is_true(ok)
    end)
    it('dropout and train belong to graph attention', function()
      assert_error(function() pn.attention(q, q, v, { dropout = 0.5, train = true }) end, 'graph attention only')
      assert_error(function() pn.attention(q, q, v, { train = true }) end, 'graph attention only')
    end)
  end)
end)
