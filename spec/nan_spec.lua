-- NaN in, NaN out: a non-finite q, k or v row never turns into a number inside attention.
-- Every registered score, dense and graph: a NaN (or ±inf) query row gives a NaN output row
-- and leaves the others alone; a non-finite key poisons every row that may see it (not the
-- rows it is masked from); scores that need points on a manifold refuse a non-finite
-- coordinate anywhere in the point with an error naming the row (counted from 1).
local pn = require 'penumbra'
local check = require 'spec.helpers.check'

local VARIANTS = pn.attention_variants({ all = true })
local NAN, INF = 0 / 0, math.huge

local function inputs(dt, N)
  local r = check.rng(3)
  local function pts(n, d) -- coordinates in (0.05, 0.45): valid for every score
    local t = {}
    for i = 1, n do
      t[i] = {}
      for c = 1, d do t[i][c] = 0.05 + 0.4 * r:u() end
    end
    return pn.tensor(t, { dtype = dt })
  end
  return pts(N, 3), pts(N, 3), pts(N, 2)
end

-- which rows of a (N, Dv) output contain a NaN, as a string of N letters ('N' or '.')
local function nan_rows(o)
  local out = {}
  for i, row in ipairs(o:to('f64'):totable()) do
    local any = false
    for _, x in ipairs(row) do any = any or x ~= x end
    out[i] = any and 'N' or '.'
  end
  return table.concat(out)
end

local function with_row(t, row, col, v)
  local c = t:clone()
  if col then c:narrow(1, row, 1):narrow(2, col, 1):fill_(v) else c:narrow(1, row, 1):fill_(v) end
  return c
end

local function manifold(name) return not VARIANTS[name].domain:find('^any') end

describe('NaN in, NaN out', function()
  for _, name in ipairs(VARIANTS) do
    local d = VARIANTS[name]
    for _, dt in ipairs({ 'f32', 'f64' }) do
      it(name .. ' ' .. dt .. (d.graph_only and ' (graph)' or ' (dense and graph)'), function()
        local N = 5
        local q, k, v = inputs(dt, N)
        local extra = {}
        if d.domain:find('a_l, a_r', 1, true) then -- the additive score's vectors (H, D)
          extra.a_l = pn.full({ 1, 3 }, 0.3, { dtype = dt })
          extra.a_r = pn.full({ 1, 3 }, -0.2, { dtype = dt })
        end
        local function opts(o)
          o = o or {}
          o.score = name
          for kk, vv in pairs(extra) do o[kk] = vv end
          return o
        end
        local full = {}
        for i = 0, N - 1 do for j = 0, N - 1 do full[#full + 1] = { j, i } end end
        local g = pn.graph(full, N) -- every node sees every node
        local forms = {}
        if not d.graph_only then
          forms[#forms + 1] = { 'dense', function(qq, kk, vv, o) return pn.attention(qq, kk, vv, opts(o)) end }
        end
        forms[#forms + 1] = { 'graph', function(qq, kk, vv, o)
          local o2 = opts(o)
          o2.causal = nil
          return pn.graph_attention(qq:unsqueeze(2), kk:unsqueeze(2), vv:unsqueeze(2), g, o2):squeeze(2)
        end }
        for _, f in ipairs(forms) do
          local form, run = f[1], f[2]
          assert.equal('.....', nan_rows(run(q, k, v)), form .. ': finite inputs')
          if manifold(name) then
            -- a NaN in the first coordinate (not only the height) is refused by name
            local at = function(r) return form == 'graph' and ('at [' .. r .. ',1]') or ('at [' .. r .. ']') end
            check.assert_error_matching(function() run(with_row(q, 2, 1, NAN), k, v) end, 'q', 'NaN or infinite', at(2))
            check.assert_error_matching(function() run(q, with_row(k, 4, nil, INF), v) end, 'k', 'NaN or infinite', at(4))
          else
            assert.equal('.N...', nan_rows(run(with_row(q, 2, 1, NAN), k, v)), form .. ': NaN query row')
            assert.equal('NNNNN', nan_rows(run(q, with_row(k, 4, nil, NAN), v)), form .. ': NaN key row')
            assert.equal('NNNNN', nan_rows(run(q, with_row(k, 3, 2, INF), v)), form .. ': inf key coordinate')
            if form == 'dense' then -- causal: rows before the bad key do not see it
              assert.equal('...NN', nan_rows(run(q, with_row(k, 4, nil, NAN), v, { causal = true })), 'causal')
            end
          end
          -- a NaN value reaches every row that weighs it
          assert.equal('NNNNN', nan_rows(run(q, k, with_row(v, 1, 1, NAN))), form .. ': NaN value')
        end
      end)
    end
  end

  -- a dot product is −inf exactly where an infinite key coordinate meets a negative query one: it
  -- must not pass for a masked pair (row_mods / dense.cu's mods decide masking from the mask, the
  -- causal cut and a −inf bias)
  it('a −inf dot product from an infinite key coordinate is NaN, not masked; masked pairs stay masked', function()
    for _, dt in ipairs({ 'f32', 'f64' }) do
      local q = pn.tensor({ { 1, -1 }, { -1, 2 }, { 0.5, -0.5 } }, { dtype = dt })
      local k = pn.tensor({ { 1, 1 }, { 0.3, 0.2 }, { INF, 0.5 } }, { dtype = dt })
      local v = pn.tensor({ { 1 }, { 2 }, { 3 } }, { dtype = dt })
      assert.equal('NNN', nan_rows(pn.attention(q, k, v, { score = 'dot' })), dt .. ': row 2 reads q·k = −inf')
      -- the causal cut hides key 3 from rows 1 and 2
      assert.equal('..N', nan_rows(pn.attention(q, k, v, { score = 'dot', causal = true })), dt .. ': causal')
      -- the mask, or a −inf bias, hides it from row 2
      local m = pn.tensor({ { 1, 1, 1 }, { 1, 1, 0 }, { 1, 1, 1 } }, { dtype = 'u8' })
      assert.equal('N.N', nan_rows(pn.attention(q, k, v, { score = 'dot', mask = m })), dt .. ': mask')
      local bias = pn.tensor({ { 0, 0, 0 }, { 0, 0, -INF }, { 0, 0, 0 } }, { dtype = dt })
      assert.equal('N.N', nan_rows(pn.attention(q, k, v, { score = 'dot', bias = bias })), dt .. ': −inf bias')
    end
  end)

  it('gradients: a NaN query row gives NaN gradients, it does not vanish', function()
    local q, k, v = inputs('f64', 4)
    q = with_row(q, 2, 1, NAN):requires_grad_()
    k:requires_grad_()
    local o = pn.attention(q, k, v, { score = 'dot' })
    o:sum():backward()
    local gq = q.grad:totable()
    assert.is_true(gq[2][1] ~= gq[2][1])
    assert.is_true(gq[1][1] == gq[1][1]) -- other rows keep their gradient
  end)

  it('a fully masked row still gives zeros, not NaN', function()
    local q, k, v = inputs('f64', 3)
    local mask = pn.tensor({ { 0, 0, 0 }, { 1, 1, 1 }, { 1, 0, 1 } }, { dtype = 'u8' })
    local o = pn.attention(q, k, v, { score = 'dot', mask = mask })
    assert.same({ 0, 0 }, o:totable()[1])
    assert.equal('...', nan_rows(o))
  end)
end)

describe('NaN in error messages', function()
  -- 0/0 on x86 has its sign bit set, which glibc prints as "-nan": a reader takes that for a
  -- different value. Every C message says "nan"; "-nan" inside a word (a path) stays.
  it('says nan, never -nan', function()
    local x = pn.tensor({ 1, 2 })
    for name, f in pairs({
      dropout = function() pn.dropout(x, 0 / 0, true) end,
      norm = function() x:norm(0 / 0) end,
      arange = function() pn.arange(0, 0 / 0, 1) end,
      cast = function() pn.tensor({ 0 / 0 }):to('i64') end,
    }) do
      local ok, msg = pcall(f)
      assert.is_false(ok, name)
      msg = tostring(msg)
      assert.truthy(msg:find('nan', 1, true), name .. ': ' .. msg)
      assert.falsy(msg:find('-nan', 1, true), name .. ': ' .. msg)
    end
    local ok, msg = pcall(pn.io.load, '/nonexistent-dir/run-nan.h5', 'x')
    assert.is_false(ok)
    assert.truthy(tostring(msg):find('run-nan.h5', 1, true), msg)
  end)
end)
