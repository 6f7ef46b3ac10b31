-- penumbra.nn.gat — GATConv and the two-layer GAT of Veličković et al. with any attention
-- score from the registry (DESIGN §3.1) or the original additive `gat` score.
--
-- GATConv(in, out, {heads=8, concat=true, score='gat', map=nil, qk_dim=out, shared_qk=false,
--                   dropout=0.6, attn_dropout=0.6, proj_dropout=0, residual=false, bias=true,
--                   <param>=, learn_<param>=false})
--   x (N, in), g = pn.graph(...) → (N, heads·out) when concat, else (N, out) (mean of heads).
-- For `gat` the score is LeakyReLU(a_l·Wh_i + a_r·Wh_j) on the value projection Wh, as in
-- the paper. For distance scores, q and k are separate projections of width qk_dim per head
-- (or, with shared_qk, both the value projection Wh itself, as GAT scores Wh), mapped onto the
-- manifold the score lives on (`map`, default by score: umbral → psi, penumbral → xi with
-- h = r, hyperbolic → pseudopolar, others none: the description's map). The score's parameters
-- come from its registry description (pn.attention_variant(score).params): <param> = a number
-- (gamma, r, slope, …; nil: the default), learn_<param> = true a per-head parameter of the
-- layer (nn/score_params.lua). dropout acts on the layer's input,
-- attn_dropout on the attention weights, proj_dropout on the projected values Wh after the
-- scores are taken (the GAT authors' code drops all three).
return function(nn, pn)
  local class = nn.class

  local score_params = require 'penumbra.nn.score_params'
  local raise = require('penumbra_ffi').raise
  local options = require 'penumbra.options'
  local unit = { 'number', min = 0, below = 1 }
  local count = { 'integer', min = 1 }
  local CONV_OPTS = { heads = count, concat = 'boolean', score = 'string', dropout = unit, attn_dropout = unit,
                      proj_dropout = unit, shared_qk = 'boolean', map = 'string', sparse_input = 'boolean',
                      qk_dim = count, residual = 'boolean', bias = 'boolean' }
  local GAT_OPTS = { hidden = count, heads = count, out_heads = count, score = 'string', map = 'string', dropout = unit,
                     attn_dropout = unit, proj_dropout = unit, qk_dim = count, residual = 'boolean',
                     shared_qk = 'boolean', sparse_input = 'boolean' }
  -- the layer's options plus the chosen score's parameters (and learn_ flags), checked once
  local function layer_opts(who, o, spec)
    local _, desc = score_params.score(who, o, 'gat', 4, pn)
    local r = options.check(who, o, options.score_params(options.with(spec), desc), 4) -- not a tail call: 4 counts this frame
    return r
  end

  local GATConv = class('GATConv')
  nn.GATConv = GATConv

  function GATConv:init(fin, fout, o)
    nn.size_arg('GATConv', 'in_features', fin)
    nn.size_arg('GATConv', 'out_features', fout)
    o = layer_opts('GATConv', o, CONV_OPTS)
    self.fin, self.fout = fin, fout
    self.heads = o.heads or 8
    self.concat = o.concat ~= false
    self.score = o.score or 'gat'
    self.dropout = o.dropout or 0.6
    self.attn_dropout = o.attn_dropout or o.dropout or 0.6
    self.proj_dropout = o.proj_dropout or 0
    self.shared_qk = o.shared_qk and self.score ~= 'gat' or false
    self.o = o
    self.desc = pn.attention_variant(self.score)
    self.map = o.map
    if self.map == nil then self.map = self.desc.map end
    local H = self.heads
    if self.score == 'gat' then
      self:add('proj', nn.Linear(fin, H * fout, { bias = false, sparse_input = o.sparse_input }))
      self:param('a_l', nn.init.xavier_uniform_(pn.empty({ H, fout })))
      self:param('a_r', nn.init.xavier_uniform_(pn.empty({ H, fout })))
    else
      -- values, queries and keys from one GEMM (the input is read once: Cora's is 15 MB)
      self.qk_dim = self.shared_qk and fout or (o.qk_dim or fout)
      local width = self.shared_qk and H * fout or H * (fout + 2 * self.qk_dim)
      self:add('proj', nn.Linear(fin, width, { bias = false, sparse_input = o.sparse_input }))
    end
    self.learned = score_params.learnable(self, 'GATConv', self.desc, o, H, self.qk_dim or fout, pn)
    if o.residual then
      self:add('res', (fin == (self.concat and H * fout or fout)) and nn.Identity()
        or nn.Linear(fin, self.concat and H * fout or fout, { bias = false }))
    end
    if o.bias ~= false then self:param('bias', pn.zeros({ self.concat and H * fout or fout })) end
  end

  -- q or k (N, H·d) → (N, H, d) on the score's manifold
  function GATConv:mapped(t)
    local N = t:shape()[1]
    t = t:view(N, self.heads, -1)
    if self.map == 'psi' then return pn.maps.psi(t)
    elseif self.map == 'xi' then return pn.maps.xi(t, { h = self.o.r or 1 })
    elseif self.map == 'pseudopolar' then return pn.maps.pseudopolar(t)
    elseif self.map == 'none' then return t end
    error("GATConv: unknown map '" .. tostring(self.map) .. "' (psi, xi, pseudopolar, none)", 2)
  end

  -- the score and its parameters, as pn.graph_attention takes them
  function GATConv:score_options()
    local opts = score_params.fill({ score = self.score }, self.desc, self.o, self, self.learned)
    if self.score == 'gat' then opts.a_l, opts.a_r = self.a_l, self.a_r end
    return opts
  end

  -- the last forward's mapped q and k are kept (last_q, last_k) for inspection
  function GATConv:forward(x, g)
    -- x and g by their own names (the projection inside would name itself, the attention its q)
    if not pn.is_tensor(x) or x:dim() ~= 2 or x:size(2) ~= self.fin then
      raise(string.format('GATConv(%d → %d×%d): x must be (N, %d), got %s', self.fin, self.heads, self.fout, self.fin,
        pn.is_tensor(x) and ('[' .. table.concat(x:shape(), ',') .. ']') or type(x)))
    end
    if type(g) ~= 'table' or (g.num_nodes and g.num_nodes ~= x:size(1)) then
      raise(string.format('GATConv: g must be a graph of the %d nodes of x (pn.graph), got %s', x:size(1),
        type(g) == 'table' and (tostring(g.num_nodes) .. ' nodes') or type(g)))
    end
    local N, H = x:shape()[1], self.heads
    local h = pn.dropout(x, self.dropout, self.training)
    local opts = self:score_options()
    opts.dropout, opts.train = self.attn_dropout, self.training
    local q, k, v
    if self.score == 'gat' then
      v = self.proj(h):view(N, H, self.fout)
      q, k = v, v
    elseif self.shared_qk then
      local wh = self.proj(h)
      v = wh:view(N, H, self.fout)
      q = self:mapped(wh)
      k = q
    else
      local all = self.proj(h)
      local wv, wq = H * self.fout, H * self.qk_dim
      v = all:narrow(2, 1, wv):reshape(N, H, self.fout)
      q = self:mapped(all:narrow(2, wv + 1, wq):contiguous())
      k = self:mapped(all:narrow(2, wv + wq + 1, wq):contiguous())
    end
    self.last_q, self.last_k = q, k
    if self.proj_dropout > 0 then v = pn.dropout(v, self.proj_dropout, self.training) end
    local out = pn.graph_attention(q, k, v, g, opts) -- (N, H, fout)
    if self.concat then out = out:reshape(N, H * self.fout) else out = out:mean(2) end
    if self.res then out = out + self.res(h) end
    if self.bias then out = out + self.bias end
    return out
  end

  function GATConv:extra_repr()
    return string.format('%d → %d×%d, score=%s, map=%s', self.fin, self.heads, self.fout, self.score, self.map)
  end

  -- The transductive GAT: GATConv(F, hidden, heads) → ELU → GATConv(heads·hidden, C, out_heads, mean)
  local GAT = class('GAT')
  nn.GAT = GAT
  function GAT:init(fin, classes, o)
    nn.size_arg('GAT', 'in_features', fin)
    nn.size_arg('GAT', 'classes', classes)
    o = layer_opts('GAT', o, GAT_OPTS)
    local hidden, heads = o.hidden or 8, o.heads or 8
    local common = { score = o.score, map = o.map, dropout = o.dropout or 0.6, attn_dropout = o.attn_dropout,
                     qk_dim = o.qk_dim, residual = o.residual, proj_dropout = o.proj_dropout,
                     shared_qk = o.shared_qk }
    -- the score's parameters and learn_ flags (its registry description), for both layers
    for _, p in ipairs(pn.attention_variant(o.score or 'gat').params) do
      common[p.name], common['learn_' .. p.name] = o[p.name], o['learn_' .. p.name]
    end
    local l1, l2 = {}, {}
    for k, v in pairs(common) do l1[k], l2[k] = v, v end
    l1.heads, l1.concat = heads, true
    l1.sparse_input = o.sparse_input -- bag-of-words inputs: the first projection multiplies nonzeros only
    l2.heads, l2.concat = o.out_heads or 1, false
    self:add('layer1', GATConv(fin, hidden, l1))
    self:add('layer2', GATConv(heads * hidden, classes, l2))
  end
  function GAT:forward(x, g)
    return self.layer2(self.layer1(x, g):elu(1), g)
  end

  -- The inductive GAT of Veličković et al. §3.3 (PPI): `layers` GATConv layers, the hidden ones
  -- concatenating heads[i] heads of `hidden` units with ELU, skip connections across the
  -- intermediate layers (each hidden layer after the first adds its input: widths match), the
  -- output layer averaging heads[L] heads of `classes` logits; no dropout by default.
  --   InductiveGAT(fin, classes, {hidden=256, heads={4, 4, 6}, score='gat', map=, qk_dim=,
  --                dropout=0, attn_dropout=0, residual=true, <param>=, learn_<param>=})
  local IGAT_OPTS = { hidden = count, heads = 'table', score = 'string', map = 'string', dropout = unit,
                      attn_dropout = unit, qk_dim = count, residual = 'boolean', shared_qk = 'boolean' }
  local IGAT = class('InductiveGAT')
  nn.InductiveGAT = IGAT
  function IGAT:init(fin, classes, o)
    nn.size_arg('InductiveGAT', 'in_features', fin)
    nn.size_arg('InductiveGAT', 'classes', classes)
    o = layer_opts('InductiveGAT', o, IGAT_OPTS)
    local hidden, heads = o.hidden or 256, o.heads or { 4, 4, 6 }
    if #heads < 2 then error('InductiveGAT: heads must list at least 2 layers (hidden…, output), got ' .. #heads, 3) end
    for i, h in ipairs(heads) do
      if type(h) ~= 'number' or h < 1 or h % 1 ~= 0 then
        error('InductiveGAT: heads[' .. i .. '] = ' .. tostring(h) .. ' must be a positive integer', 3)
      end
    end
    self.num_layers = #heads
    local width = fin
    for i, h in ipairs(heads) do
      local last = i == #heads
      local lo = { score = o.score, map = o.map, qk_dim = o.qk_dim, shared_qk = o.shared_qk, heads = h,
                   concat = not last, dropout = o.dropout or 0, attn_dropout = o.attn_dropout or 0,
                   residual = (o.residual ~= false) and i > 1 and not last and width == h * hidden }
      for _, p in ipairs(pn.attention_variant(o.score or 'gat').params) do
        lo[p.name], lo['learn_' .. p.name] = o[p.name], o['learn_' .. p.name]
      end
      self:add('layer' .. i, GATConv(width, last and classes or hidden, lo))
      width = h * hidden
    end
  end
  function IGAT:forward(x, g)
    local h = x
    for i = 1, self.num_layers - 1 do h = self['layer' .. i](h, g):elu(1) end
    return self['layer' .. self.num_layers](h, g)
  end

  -- the layer's per-edge attention weights (E, H) for the whole graph, eval mode, no grad
  -- (also fills layer.last_q / last_k)
  local function edge_weights(self, x, g, o, op)
    local layer = self['layer' .. (o.layer or 1)]
    if not layer then error(op .. ': the model has no layer ' .. tostring(o.layer), 3) end
    return pn.no_grad(function()
      local was = self.training
      self:eval()
      self(x, g)
      local w = pn.graph_attention_weights(layer.last_q, layer.last_k, g, layer:score_options())
      self:train(was)
      return w
    end)
  end

  -- Attention of a node's neighbourhood in layer `layer` (eval mode, no grad): the node and
  -- up to max−1 of its in-neighbours (CSR by destination), weights (H, n, n) where row i is
  -- how node ids[i] attends to the others (0 where it has no edge), and the 0-based ids.
  function GAT:neighbourhood_attention(x, g, node, o)
    o = o or {}
    local N = g.num_nodes
    if type(node) ~= 'number' or node % 1 ~= 0 or node < 0 or node >= N then
      error(string.format('neighbourhood_attention: node %s out of range 0..%d (0-based ids)', tostring(node), N - 1), 2)
    end
    local maxn = o.max or 16
    local w = edge_weights(self, x, g, o, 'neighbourhood_attention')
    local H = w:shape()[2]
    local off, src = g.offsets:totable(), g.src:totable()
    local ids, pos = { node }, { [node] = 1 }
    for e = off[node + 1] + 1, off[node + 2] do
      local s = src[e]
      if not pos[s] and #ids < maxn then ids[#ids + 1] = s; pos[s] = #ids end
    end
    local n = #ids
    local W = {}
    for h = 1, H do
      W[h] = {}
      for a = 1, n do W[h][a] = {} for b = 1, n do W[h][a][b] = 0 end end
    end
    local wt = w:totable()
    for a, id in ipairs(ids) do
      for e = off[id + 1] + 1, off[id + 2] do
        local b = pos[src[e]]
        if b then for h = 1, H do W[h][a][b] = W[h][a][b] + wt[e][h] end end -- duplicate edges add up
      end
    end
    return pn.tensor(W, { dtype = w:dtype() }), ids
  end

  -- How far a layer's attention is from uniform: the entropy of each node's weights over its
  -- in-edges divided by log(in-degree), averaged over heads and the nodes with ≥ 2 in-edges.
  -- 1 = uniform (the layer averages its neighbours like a GCN would); 0 = one neighbour takes
  -- all the weight. Eval mode, no grad. Returns the mean and the per-head means (a Lua list).
  function GAT:attention_entropy(x, g, o)
    o = o or {}
    local wt = edge_weights(self, x, g, o, 'attention_entropy'):totable()
    local off = g.offsets:totable()
    local H = #(wt[1] or {})
    local per, count = {}, 0
    for h = 1, H do per[h] = 0 end
    for i = 1, g.num_nodes do
      local e0, e1 = off[i] + 1, off[i + 1]
      local deg = e1 - e0 + 1
      if deg >= 2 then
        count = count + 1
        for h = 1, H do
          local ent = 0
          for e = e0, e1 do
            local p = wt[e][h]
            if p > 0 then ent = ent - p * math.log(p) end
          end
          per[h] = per[h] + ent / math.log(deg)
        end
      end
    end
    local mean = 0
    for h = 1, H do per[h] = count > 0 and per[h] / count or 0 / 0; mean = mean + per[h] / H end
    return mean, per
  end

  -- the same inspection for the inductive model (any layer)
  IGAT.neighbourhood_attention = GAT.neighbourhood_attention
  IGAT.attention_entropy = GAT.attention_entropy
end
