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
        acc = pn.no_grad(function() return (model(x, g):argmax(-1):eq(y)):to('f64'):mean():item() end)
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

describe('GAT attention entropy', function()
  it('is 1 for uniform attention and matches a naive entropy of the dense masked weights otherwise', function()
    local x, _, g, n = synthetic(5)
    x = x:to('f64')
    pn.manual_seed(9)
    local model = pn.nn.GAT(x:shape()[2], 2, { score = 'dot', hidden = 3, heads = 2, dropout = 0, attn_dropout = 0 })
    for _, np in ipairs(model:named_parameters()) do
      local path = {}
      for part in np[1]:gmatch('[^%.]+') do path[#path + 1] = part end
      local owner = model
      for i = 1, #path - 1 do owner = owner[path[i]] end
      owner:param(path[#path], (np[2] * 3):to('f64')) -- larger weights: clearly non-uniform attention
    end
    local ent, per = model:attention_entropy(x, g, { layer = 1 })
    -- naive: dense softmax weights of layer 1's q, k under the graph as a mask
    local l1 = model.layer1
    local off, src = g.offsets:totable(), g.src:totable()
    local m = {}
    for i = 1, n do m[i] = {} for j = 1, n do m[i][j] = 0 end end
    for i = 1, n do for e = off[i] + 1, off[i + 1] do m[i][src[e] + 1] = 1 end end
    local hm = function(t) return t:transpose(1, 2):unsqueeze(1) end
    local w = pn.attention_weights(hm(l1.last_q), hm(l1.last_k), { score = 'dot', mask = pn.tensor(m, { dtype = 'u8' }) })
    w = w:totable()[1]
    local want, count = {}, 0
    for h = 1, 2 do want[h] = 0 end
    for i = 1, n do
      local deg = off[i + 1] - off[i]
      if deg >= 2 then
        count = count + 1
        for h = 1, 2 do
          local e = 0
          for j = 1, n do local p = w[h][i][j]; if p > 0 then e = e - p * math.log(p) end end
          want[h] = want[h] + e / math.log(deg)
        end
      end
    end
    for h = 1, 2 do
      want[h] = want[h] / count
      assert.is_true(math.abs(per[h] - want[h]) < 1e-12, string.format('head %d: %.15g vs %.15g', h, per[h], want[h]))
    end
    assert.is_true(math.abs(ent - (want[1] + want[2]) / 2) < 1e-12)
    assert.is_true(ent < 0.99, 'attention should be far from uniform here, entropy ' .. ent)
    -- zero queries: every score is 0, the attention is the neighbourhood mean
    local Wt = l1.proj.weight:clone()
    local F = x:shape()[2]
    l1.proj:param('weight', pn.cat({ Wt:narrow(1, 1, 6), pn.zeros({ 12, F }, { dtype = 'f64' }) }, 1))
    local flat = model:attention_entropy(x, g, { layer = 1 })
    assert.is_true(math.abs(flat - 1) < 1e-12, 'uniform attention gives entropy 1, got ' .. flat)
  end)
end)
