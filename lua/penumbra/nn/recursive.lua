-- penumbra.nn.recursive — the Recursive Transformer of Hyperbolic Attention Networks (§5.1,
-- App. A.5): an encoder of the node inputs, ONE self-attention block applied `depth` times
-- with tied weights, and a readout for a queried pair of nodes.
--
-- RecursiveTransformer{in_dim=, out_dim=, d_model=16, heads=4, head_dim=4, ff=64, depth=3,
--   score='dot', map=nil (the score's registry map: hyperbolic → pseudopolar, umbral → psi,
--   penumbral → xi with h = r, dot/laplacian → none), normalize='softmax', aggregate=nil |
--   'einstein', dense=false, <param>=, learn_<param>=false}
-- forward(x (N, in_dim), g (a pn.graph CSR), pairs (P, 2) i64 0-based) → logits (P, out_dim)
--   dense = false: attention over each node's graph neighbourhood (pn.graph_attention on g);
--   dense = true: over all nodes of each graph (pn.attention; g.sizes = {n_1, …} says where
--   the graphs of a batch start — nodes of different graphs never attend to each other).
-- The block: q, k, v = W_q h, W_k h, W_v h (heads × head_dim each), q and k mapped onto the
-- score's manifold, attention, W_o back to d_model, residual + LayerNorm, then the
-- feed-forward part (d_model → ff → d_model, ReLU) with residual + LayerNorm. With
-- aggregate = 'einstein' the values are points of the hyperboloid (pseudopolar map) taken to
-- the Klein model, averaged by the Einstein midpoint (Gulcehre Eq. 3) and taken back to the
-- hyperboloid, so W_o sees head_dim numbers per head as for every other score: the parameter
-- count depends on the widths only, never on the score (`model:num_parameters()`).
-- The readout: [h_a, h_b, h_a ⊙ h_b, |h_a − h_b|] → d_model → ReLU → out_dim.
-- model.last_k: the mapped keys of the last recursion (N, heads, head_dim), for radii plots.
return function(nn, pn)
  local options = require 'penumbra.options'
  local raise = require('penumbra_ffi').raise
  local score_params = require 'penumbra.nn.score_params'
  local count = { 'integer', min = 1 }
  local RT_OPTS = { in_dim = count, out_dim = count, d_model = count, heads = count, head_dim = count, ff = count,
                    depth = count, score = 'string', map = 'string', normalize = 'string', dense = 'boolean',
                    aggregate = { 'string', one_of = { 'sum', 'einstein' } } }

  local RT = nn.class('RecursiveTransformer')
  nn.RecursiveTransformer = RT

  function RT:init(o)
    local score, desc = score_params.score('RecursiveTransformer', o, 'dot', 3, pn)
    o = options.check('RecursiveTransformer', o, options.score_params(options.with(RT_OPTS), desc), 3)
    if not o.in_dim or not o.out_dim then error('RecursiveTransformer: in_dim and out_dim are required', 3) end
    if desc.graph_only and o.dense then
      error("RecursiveTransformer: score '" .. score .. "' works on graphs only; leave dense out", 3)
    end
    self.o, self.score, self.desc = o, score, desc
    self.d = o.d_model or 16
    self.heads, self.dh = o.heads or 4, o.head_dim or 4
    self.depth = o.depth or 3
    self.map = o.map or desc.map
    self.einstein = o.aggregate == 'einstein'
    if self.einstein and self.dh < 2 then error('RecursiveTransformer: einstein needs head_dim >= 2', 3) end
    local hd = self.heads * self.dh
    self:add('encoder', nn.Linear(o.in_dim, self.d))
    self:add('q_proj', nn.Linear(self.d, hd))
    self:add('k_proj', nn.Linear(self.d, hd))
    self:add('v_proj', nn.Linear(self.d, hd))
    self:add('out_proj', nn.Linear(hd, self.d))
    self:add('norm1', nn.LayerNorm(self.d))
    self:add('ff1', nn.Linear(self.d, o.ff or 64))
    self:add('ff2', nn.Linear(o.ff or 64, self.d))
    self:add('norm2', nn.LayerNorm(self.d))
    self:add('read1', nn.Linear(4 * self.d, self.d))
    self:add('read2', nn.Linear(self.d, o.out_dim))
    if score == 'gat' then
      self:param('a_l', nn.init.xavier_uniform_(pn.empty({ self.heads, self.dh })))
      self:param('a_r', nn.init.xavier_uniform_(pn.empty({ self.heads, self.dh })))
    end
    self.learned = score_params.learnable(self, 'RecursiveTransformer', desc, o, self.heads, self.dh, pn)
  end

  function RT:map_qk(t)
    if self.map == 'psi' then return pn.maps.psi(t)
    elseif self.map == 'xi' then return pn.maps.xi(t, { h = self.o.r or 1 })
    elseif self.map == 'pseudopolar' then return pn.maps.pseudopolar(t)
    elseif self.map == 'exp0' then return pn.maps.exp0(t, {})
    end
    return t
  end

  -- values for the aggregation: Klein points for einstein
  function RT:values(v)
    if not self.einstein then return v end
    return pn.hyper.to_klein(pn.maps.pseudopolar(v), { from = 'hyperboloid' })
  end
  function RT:unvalues(o)
    if not self.einstein then return o end
    return pn.hyper.from_klein(o, { to = 'hyperboloid' })
  end

  function RT:attend(q, k, v, g)
    local o = self.o
    local opts = { score = self.score, normalize = o.normalize, model = o.model, squared = o.squared,
                   aggregate = self.einstein and 'einstein' or nil }
    score_params.fill(opts, self.desc, o, self, self.learned)
    if self.score == 'gat' then opts.a_l, opts.a_r = self.a_l, self.a_r end
    if not o.dense then return pn.graph_attention(q, k, v, g, opts) end -- (N, H, dv)
    -- dense: each graph of the batch on its own (node-major (n, H, d) → (1, H, n, d))
    local outs, at = {}, 1
    local sizes = g.sizes or { q:shape()[1] }
    for i, n in ipairs(sizes) do
      local function hm(t) return t:narrow(1, at, n):transpose(1, 2):unsqueeze(1) end
      outs[i] = pn.attention(hm(q), hm(k), hm(v), opts):squeeze(1):transpose(1, 2)
      at = at + n
    end
    return #outs == 1 and outs[1] or pn.cat(outs, 1)
  end

  function RT:block(h, g)
    local N, H, dh = h:shape()[1], self.heads, self.dh
    local q = self:map_qk(self.q_proj(h):view(N, H, dh))
    local k = self:map_qk(self.k_proj(h):view(N, H, dh))
    local v = self:values(self.v_proj(h):view(N, H, dh))
    self.last_k = k
    local a = self:unvalues(self:attend(q, k, v, g)):reshape(N, H * dh)
    h = self.norm1(h + self.out_proj(a))
    return self.norm2(h + self.ff2(self.ff1(h):relu()))
  end

  local function shape_str(t) return '[' .. table.concat(t:shape(), ',') .. ']' end

  -- the inputs, named as forward's documentation names them (the layers inside would name
  -- their own arguments, index_select its idx)
  local function check_inputs(self, x, g, pairs)
    local who = 'RecursiveTransformer'
    if not pn.is_tensor(x) or x:dim() ~= 2 or x:size(2) ~= self.o.in_dim then
      raise(string.format('%s: x must be (N, in_dim = %d), got %s', who, self.o.in_dim,
        pn.is_tensor(x) and shape_str(x) or type(x)))
    end
    local N = x:size(1)
    if type(g) ~= 'table' then raise(who .. ': g must be a graph of the N nodes (pn.graph), got ' .. type(g)) end
    if not self.o.dense and g.num_nodes and g.num_nodes ~= N then
      raise(string.format('%s: g has %s nodes, x has %d rows', who, tostring(g.num_nodes), N))
    end
    if self.o.dense and g.sizes then
      local sum = 0
      for i, n in ipairs(g.sizes) do
        if type(n) ~= 'number' or n < 1 or n % 1 ~= 0 then
          raise(string.format('%s: g.sizes[%d] must be a whole number >= 1, got %s', who, i, tostring(n)))
        end
        sum = sum + n
      end
      if sum ~= N then raise(string.format('%s: g.sizes add up to %d nodes, x has %d rows', who, sum, N)) end
    end
    if not pn.is_tensor(pairs) or pairs:dim() ~= 2 or pairs:size(2) ~= 2
        or (pairs:dtype() ~= 'i64' and pairs:dtype() ~= 'i32') then
      raise(string.format('%s: pairs must be a (P, 2) i64 tensor of 0-based node ids, got %s', who,
        pn.is_tensor(pairs) and (pairs:dtype() .. ' ' .. shape_str(pairs)) or type(pairs)))
    end
    if pairs:numel() > 0 then
      local lo, hi = pairs:min():item(), pairs:max():item()
      if lo < 0 or hi >= N then
        raise(string.format('%s: pairs holds node id %d, outside 0..%d (x has %d rows)', who, lo < 0 and lo or hi,
          N - 1, N))
      end
    end
  end

  function RT:forward(x, g, pairs)
    check_inputs(self, x, g, pairs)
    local h = self.encoder(x):relu()
    for _ = 1, self.depth do h = self:block(h, g) end -- the same weights every time
    local ha = h:index_select(1, pairs:select(2, 1):contiguous())
    local hb = h:index_select(1, pairs:select(2, 2):contiguous())
    local z = pn.cat({ ha, hb, ha * hb, (ha - hb):abs() }, 2)
    return self.read2(self.read1(z):relu())
  end

  -- per-node radius of the last recursion's keys, per head (N·H): the hyperbolic radius
  -- acosh(time coordinate) for the pseudopolar map, the height for the cone maps, the norm
  -- without a map; and what it is
  function RT:radii()
    local k = self.last_k:detach()
    if self.map == 'pseudopolar' then return k:select(-1, -1):clamp(1, math.huge):acosh():reshape(-1), 'radius' end
    if self.map ~= 'none' and self.map then return k:select(-1, -1):reshape(-1):contiguous(), 'height' end
    return k:norm(2, -1):reshape(-1), 'key norm'
  end

  function RT:extra_repr()
    return string.format('d_model=%d, heads=%d×%d, depth=%d (tied), score=%s, map=%s%s%s', self.d, self.heads, self.dh,
      self.depth, self.score, self.map or 'none', self.einstein and ', einstein' or '', self.o.dense and ', dense' or '')
  end
end
