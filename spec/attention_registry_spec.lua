-- attention_registry_spec.lua — the score registry (core/attention/variants.def) as Lua sees it:
-- pn.attention_variants() / pn.attention_variant(name) describe every score from its row
-- (parameters with defaults and positivity, domain, default map, flags), test-only rows are
-- hidden unless asked for, and every described parameter is an option the ops accept. No
-- score names are written here: the checks hold for whatever rows variants.def has.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local assert_error = check.assert_error_matching

describe('attention registry', function()
  local all = pn.attention_variants({ all = true })
  local public = pn.attention_variants()

  it('lists the public scores in registry order, the test-only ones only with all=true', function()
    assert.is_true(#public > 0)
    local j, tests = 1, 0
    for _, name in ipairs(all) do
      local d = all[name]
      assert.equal(name, d.name)
      if d.test then
        tests = tests + 1
        assert.is_nil(public[name], name .. ' is test-only but listed')
      else
        assert.equal(name, public[j], 'public order at ' .. j)
        assert.same(d, public[name])
        j = j + 1
      end
    end
    assert.equal(#public + 1, j)
    assert.equal(#all, #public + tests)
    -- the spec-only score with a parameter of its own exists (the registry's proof of extension)
    assert.is_true(tests > 0, 'no test-only variant')
  end)

  it('describes each score: flags, map, domain, parameters with defaults and positivity', function()
    for _, name in ipairs(all) do
      local d = all[name]
      assert.is_boolean(d.graph_only)
      assert.is_boolean(d.test)
      assert.equal(d.graph_only, pn.attention_variant_graph_only(name))
      assert.is_string(d.map)
      assert.is_true(#d.domain > 0, name .. ' has no domain')
      assert.same(d, pn.attention_variant(name))
      assert.is_true(#d.params > 0, name .. ' has no parameter')
      for i, p in ipairs(d.params) do
        assert.equal(p, d.params[p.name], name .. ' param ' .. i)
        assert.is_boolean(p.positive)
        assert.is_true(#p.about > 0)
        assert.is_true(type(p.default) == 'number' or p.default_rule == '1/sqrt(D)', name .. '.' .. p.name)
        if p.positive and p.default then assert.is_true(p.default > 0, name .. '.' .. p.name .. ' default') end
      end
    end
  end)

  it('the test-only score has a parameter no public score has', function()
    local public_params = {}
    for _, name in ipairs(public) do
      for _, p in ipairs(public[name].params) do public_params[p.name] = true end
    end
    local own = false
    for _, name in ipairs(all) do
      if all[name].test then
        for _, p in ipairs(all[name].params) do own = own or not public_params[p.name] end
      end
    end
    assert.is_true(own)
  end)

  it('accepts every described parameter as an option, and rejects a positive one <= 0 naming it', function()
    local q = pn.randn({ 1, 1, 3, 4 }, { dtype = 'f64' }) * 0.1
    q = q + pn.tensor({ 0, 0, 0, 0.5 }, { dtype = 'f64' }) -- heights > 0, inside the unit ball
    local v = pn.randn({ 1, 1, 3, 2 }, { dtype = 'f64' })
    for _, name in ipairs(all) do
      local d = all[name]
      if not d.graph_only then
        for _, p in ipairs(d.params) do
          local val = (p.default or 0.5) * 1.25
          -- a parameter is read by the score's default form or by one of its other forms (the
          -- Poincaré model's curvature, say); given where nothing reads it, it is an error
          local form
          for _, f in ipairs({ {}, { model = 'poincare' }, { aggregate = 'einstein' } }) do
            local o = { score = name, [p.name] = val }
            for kk, vv in pairs(f) do o[kk] = vv end
            local ok, out = pcall(pn.attention, q, q, v, o)
            if ok then
              assert.same({ 1, 1, 3, 2 }, out:shape())
              form = o
              break
            end
            assert.truthy(tostring(out):find('has no parameter ' .. p.name, 1, true), tostring(out))
          end
          assert.truthy(form, name .. '.' .. p.name .. ' is read by no form')
          if p.positive then
            form[p.name] = 0
            assert_error(function() pn.attention(q, q, v, form) end, 'attention', p.name, '> 0')
          end
        end
      end
    end
  end)

  it('errors on an unknown name or option, listing the valid ones', function()
    assert_error(function() pn.attention_variant('no such score') end, 'attention_variant', 'no such score', public[1])
    assert_error(function() pn.attention_variants({ everything = true }) end, 'attention_variants', 'everything', 'all')
  end)
end)

describe('attention layers derive their parameters from the registry', function()
  local all = pn.attention_variants({ all = true })

  it('MultiheadAttention: learn_<param> is a per-head parameter that gets a gradient, for every score', function()
    pn.manual_seed(3)
    local x = pn.randn({ 2, 4, 8 }, { dtype = 'f32' }) * 0.3
    local checked = 0
    for _, name in ipairs(all) do
      local d = all[name]
      if not d.graph_only then
        for _, p in ipairs(d.params) do
          local m = pn.nn.MultiheadAttention(8, 2, { score = name, ['learn_' .. p.name] = true })
          assert.same({ 2 }, m[p.name]:shape(), name .. '.' .. p.name)
          local ok, err = pcall(function() m(x):sum():backward() end)
          if ok then
            assert.is_not_nil(m[p.name].grad, name .. '.' .. p.name .. ' got no gradient')
            checked = checked + 1
          else -- a parameter of another model of the score (curvature: poincare only)
            assert.is_truthy(tostring(err):find('has no parameter ' .. p.name, 1, true), tostring(err))
          end
        end
      end
    end
    assert.is_true(checked > 0)
  end)

  it('MultiheadAttention and GATConv reject learn_ for a parameter the score lacks, listing the valid ones', function()
    for _, name in ipairs(all) do
      local d = all[name]
      local valid = 'learn_' .. d.params[1].name
      if not d.graph_only then
        assert_error(function() pn.nn.MultiheadAttention(8, 2, { score = name, learn_nonesuch = true }) end,
          'MultiheadAttention', 'learn_nonesuch', name, valid)
      end
      assert_error(function() pn.nn.GATConv(5, 4, { score = name, learn_nonesuch = true }) end,
        'GATConv', 'learn_nonesuch', name, valid)
    end
  end)
end)
