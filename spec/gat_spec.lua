-- GAT end to end on a tiny synthetic graph: two chains of 12 nodes, labels by chain, node
-- features carrying only a weak noisy hint of the label, so the model must use the graph.
-- Every score must fit the training nodes perfectly; gradients of a tiny GATConv are
-- checked against finite differences.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local check = require 'spec.helpers.check'

local function synthetic(n_per)
  pn.manual_seed(11)
  local n = 2 * n_per
  local edges, labels = {}, {}
  for c = 0, 1 do
    for i = 0, n_per - 1 do
      local u = c * n_per + i
      labels[u + 1] = c
      if i + 1 < n_per then
        edges[#edges + 1] = { u, u + 1 }
        edges[#edges + 1] = { u + 1, u }
      end
    end
  end
  local x = pn.randn({ n, 6 }) * 0.5
  local hint = {}
  for u = 1, n do hint[u] = { labels[u] == 0 and 0.3 or -0.3 } end
  x = pn.cat({ x, pn.tensor(hint) }, 2)
  return x, pn.tensor(labels, { dtype = 'i64' }), pn.graph(edges, n, { self_loops = true }), n
end

describe('GAT on a synthetic graph', function()
  for _, score in ipairs({ 'gat', 'dot', 'umbral', 'penumbral', 'laplacian', 'hyperbolic' }) do
    it(score .. ' attention reaches 100% train accuracy', function()
      local x, y, g, n = synthetic(12)
      pn.manual_seed(5)
      local model = pn.nn.GAT(x:shape()[2], 2, { score = score, hidden = 4, heads = 2, dropout = 0,
                                                 attn_dropout = 0, r = score == 'umbral' and 0.1 or nil })
      local opt = pn.optim.Adam(model, { lr = 0.02 })
      local acc = 0
      for _ = 1, 300 do
        opt:zero_grad()
        local logits = model(x, g)
        local loss = pn.cross_entropy(logits, y)
        loss:backward()
        opt:step()
        acc = pn.no_grad(function() return ((model(x, g):argmax(-1) - 1):eq(y)):to('f64'):mean():item() end)
        if acc == 1 then break end
      end
      assert.equal(1, acc)
    end)
  end

  it('GATConv parameter gradients match finite differences (f64)', function()
    local x, _, g = synthetic(3)
    x = x:to('f64')
    for _, c in ipairs({ { 'gat' }, { 'umbral' }, { 'umbral', true }, { 'penumbral', true } }) do
      local score = c[1]
      pn.manual_seed(6)
      local conv = pn.nn.GATConv(x:shape()[2], 3, { heads = 2, score = score, dropout = 0, attn_dropout = 0,
                                                    r = score == 'umbral' and 0.1 or nil, shared_qk = c[2] })
      for _, np in ipairs(conv:named_parameters()) do
        local owner, key = conv, np[1]
        if key:find('%.') then owner, key = conv[key:match('^([^%.]+)')], key:match('([^%.]+)$') end
        owner:param(key, np[2]:to('f64'))
      end
      gradcheck(function() return conv(x, g) end, conv:parameters(), { atol = 1e-5, rtol = 1e-4 })
    end
  end)

  it('shared_qk scores the mapped value projection itself (one projection of H·out)', function()
    local x, _, g = synthetic(3)
    pn.manual_seed(7)
    local conv = pn.nn.GATConv(x:shape()[2], 4, { heads = 2, score = 'umbral', shared_qk = true, dropout = 0,
                                                  attn_dropout = 0, r = 0.1 })
    assert.same({ 2 * 4, x:shape()[2] }, conv.proj.weight:shape())
    conv:eval()
    conv(x, g)
    local wh = conv.proj(x):view(x:shape()[1], 2, 4)
    local want = check.vals(pn.maps.psi(wh))
    check.assert_close(check.vals(conv.last_q), want, 0, 'q')
    check.assert_close(check.vals(conv.last_k), want, 0, 'k')
  end)

  it('proj_dropout drops values only: train outputs average to the eval output', function()
    -- attention is linear in v and the scores do not see the dropout, so the expectation of a
    -- training forward is the eval forward exactly; 2000 draws put the mean within a few 1e-2
    local x, _, g = synthetic(3)
    x = x:to('f64')
    pn.manual_seed(8)
    local conv = pn.nn.GATConv(x:shape()[2], 3, { heads = 2, score = 'dot', dropout = 0, attn_dropout = 0,
                                                  proj_dropout = 0.5 })
    for _, np in ipairs(conv:named_parameters()) do
      local owner, key = conv, np[1]
      if key:find('%.') then owner, key = conv[key:match('^([^%.]+)')], key:match('([^%.]+)$') end
      owner:param(key, np[2]:to('f64'))
    end
    conv:eval()
    local want = pn.no_grad(conv, x, g)
    conv:train()
    local sum = pn.zeros(want:shape(), { dtype = 'f64' })
    local differs = false
    pn.no_grad(function()
      for _ = 1, 2000 do
        local out = conv(x, g)
        if (out - want):abs():max():item() > 1e-9 then differs = true end
        sum = sum + out
      end
    end)
    assert.is_true(differs)
    local err = (sum / 2000 - want):abs():max():item()
    local scale = want:abs():max():item()
    assert.is_true(err < 0.05 * scale, string.format('mean of dropped outputs off by %.3g (scale %.3g)', err, scale))
  end)
end)
