-- penumbra.nn.gat — GATConv and the two-layer GAT of Veličković et al. with any attention
-- score from the registry (DESIGN §3.1) or the original additive `gat` score.
--
-- GATConv(in, out, {heads=8, concat=true, score='gat', map=nil, qk_dim=out, shared_qk=false,
--                   dropout=0.6, attn_dropout=0.6, proj_dropout=0, residual=false, bias=true,
--                   gamma=1, r=nil, slope=0.2})
--   x (N, in), g = pn.graph(...) → (N, heads·out) when concat, else (N, out) (mean of heads).
-- For `gat` the score is LeakyReLU(a_l·Wh_i + a_r·Wh_j) on the value projection Wh, as in
-- the paper. For distance scores, q and k are separate projections of width qk_dim per head
-- (or, with shared_qk, both the value projection Wh itself, as GAT scores Wh), mapped onto the
-- manifold the score lives on (`map`, default by score: umbral → psi, penumbral → xi with
-- h = r, hyperbolic → pseudopolar, others none). dropout acts on the layer's input,
-- attn_dropout on the attention weights, proj_dropout on the projected values Wh after the
-- scores are taken (the GAT authors' code drops all three).
return function(nn, pn)
  local class = nn.class

  local DEFAULT_MAP = { umbral = 'psi', penumbral = 'xi', hyperbolic = 'pseudopolar' }

  local GATConv = class('GATConv')
  nn.GATConv = GATConv

  function GATConv:init(fin, fout, o)
    o = o or {}
    self.fin, self.fout = fin, fout
    self.heads = o.heads or 8
    self.concat = o.concat ~= false
    self.score = o.score or 'gat'
    self.dropout = o.dropout or 0.6
    self.attn_dropout = o.attn_dropout or o.dropout or 0.6
    self.proj_dropout = o.proj_dropout or 0
    self.shared_qk = o.shared_qk and self.score ~= 'gat' or false
    self.slope = o.slope or 0.2
    self.gamma, self.r = o.gamma, o.r
    self.map = o.map
    if self.map == nil then self.map = DEFAULT_MAP[self.score] or 'none' end
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
    elseif self.map == 'xi' then return pn.maps.xi(t, { h = self.r or 1 })
    elseif self.map == 'pseudopolar' then return pn.maps.pseudopolar(t)
    elseif self.map == 'none' then return t end
    error("GATConv: unknown map '" .. tostring(self.map) .. "' (psi, xi, pseudopolar, none)", 2)
  end

  -- attention weights are kept for inspection (heatmaps) when keep_attention is set
  function GATConv:forward(x, g)
    local N, H = x:shape()[1], self.heads
    local h = pn.dropout(x, self.dropout, self.training)
    local opts = { score = self.score, dropout = self.attn_dropout, train = self.training }
    local q, k, v
    if self.score == 'gat' then
      v = self.proj(h):view(N, H, self.fout)
      q, k = v, v
      opts.a_l, opts.a_r, opts.slope = self.a_l, self.a_r, self.slope
    elseif self.shared_qk then
      local wh = self.proj(h)
      v = wh:view(N, H, self.fout)
      q = self:mapped(wh)
      k = q
      if self.gamma then opts.gamma = self.gamma end
      if self.r then opts.r = self.r end
    else
      local all = self.proj(h)
      local wv, wq = H * self.fout, H * self.qk_dim
      v = all:narrow(2, 1, wv):reshape(N, H, self.fout)
      q = self:mapped(all:narrow(2, wv + 1, wq):contiguous())
      k = self:mapped(all:narrow(2, wv + wq + 1, wq):contiguous())
      if self.gamma then opts.gamma = self.gamma end
      if self.r then opts.r = self.r end
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
    o = o or {}
    local hidden, heads = o.hidden or 8, o.heads or 8
    local common = { score = o.score, map = o.map, dropout = o.dropout or 0.6, attn_dropout = o.attn_dropout,
                     gamma = o.gamma, r = o.r, qk_dim = o.qk_dim, residual = o.residual,
                     proj_dropout = o.proj_dropout, shared_qk = o.shared_qk }
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

  -- Attention of a node's neighbourhood in layer `layer` (eval mode, no grad): the node and
  -- up to max−1 of its in-neighbours (CSR by destination), weights (H, n, n) where row i is
  -- how node ids[i] attends to the others (0 where it has no edge), and the 0-based ids.
  function GAT:neighbourhood_attention(x, g, node, o)
    o = o or {}
    local layer = self['layer' .. (o.layer or 1)]
    if not layer then error('neighbourhood_attention: the model has no layer ' .. tostring(o.layer), 2) end
    local N = g.num_nodes
    if type(node) ~= 'number' or node % 1 ~= 0 or node < 0 or node >= N then
      error(string.format('neighbourhood_attention: node %s out of range 0..%d (0-based ids)', tostring(node), N - 1), 2)
    end
    local maxn = o.max or 16
    return pn.no_grad(function()
      local was = self.training
      self:eval()
      self(x, g) -- fills layer.last_q / last_k
      local off = g.offsets:narrow(1, node + 1, 2):totable()
      local ids, seen = { node }, { [node] = true }
      if off[2] > off[1] then
        for _, s in ipairs(g.src:narrow(1, off[1] + 1, off[2] - off[1]):totable()) do
          if not seen[s] and #ids < maxn then ids[#ids + 1] = s; seen[s] = true end
        end
      end
      local n = #ids
      -- one-hot values over the chosen nodes: node i's output is its weights on them
      local eye = {}
      for i = 1, n do eye[i] = {}; for j = 1, n do eye[i][j] = (i == j) and 1 or 0 end end
      local idx = pn.tensor(ids, { dtype = 'i64' })
      local H = layer.heads
      local v = pn.zeros({ N, n }):index_add(1, idx, pn.tensor(eye))
      v = v:unsqueeze(2):expand(N, H, n):contiguous():to(layer.last_q:dtype())
      local opts = { score = layer.score, train = false, dropout = 0 }
      if layer.score == 'gat' then opts.a_l, opts.a_r, opts.slope = layer.a_l, layer.a_r, layer.slope
      else
        if layer.gamma then opts.gamma = layer.gamma end
        if layer.r then opts.r = layer.r end
      end
      local w = pn.graph_attention(layer.last_q, layer.last_k, v, g, opts) -- (N, H, n)
      w = w:index_select(1, idx):permute(2, 1, 3):contiguous()           -- (H, n, n)
      self:train(was)
      return w, ids
    end)
  end
end
