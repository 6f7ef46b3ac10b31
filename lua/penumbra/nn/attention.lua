-- penumbra.nn.attention — MultiheadAttention over any registry score (DESIGN §3.1).
--
-- MultiheadAttention(d_model, heads, {score='dot', map=nil|'psi'|'xi'|'pseudopolar'|'exp0',
--   normalize='softmax', causal=false, dropout=0, bias=true, learn_gamma=false,
--   learn_r=false, gamma=, r=, beta=, c=, model=, curvature=, qk_dim=d_model/heads})
-- forward(x_q, x_kv [, {mask=, bias=}]) with x (B, N, d_model) → (B, Nq, d_model).
-- Learnable γ / r are per-head parameters (H) handed to the fused kernel as tensors.
return function(nn, pn)
  local MHA = nn.class('MultiheadAttention')
  nn.MultiheadAttention = MHA

  local DEFAULT_MAP = { umbral = 'psi', penumbral = 'xi', hyperbolic = 'pseudopolar' }

  function MHA:init(d, heads, o)
    o = o or {}
    if d % heads ~= 0 then error('MultiheadAttention: d_model ' .. d .. ' is not divisible by heads ' .. heads, 2) end
    self.d, self.heads = d, heads
    self.dv = math.floor(d / heads)
    self.dk = o.qk_dim or self.dv
    self.o = o
    self.score = o.score or 'dot'
    self.map = o.map or DEFAULT_MAP[self.score] or 'none'
    local bias = o.bias ~= false
    self:add('q_proj', nn.Linear(d, heads * self.dk, { bias = bias }))
    self:add('k_proj', nn.Linear(d, heads * self.dk, { bias = bias }))
    self:add('v_proj', nn.Linear(d, d, { bias = bias }))
    self:add('out_proj', nn.Linear(d, d, { bias = bias }))
    if o.learn_gamma then self:param('gamma', pn.full({ heads }, o.gamma or 1)) end
    if o.learn_r then self:param('r', pn.full({ heads }, o.r or (self.score == 'umbral' and 0.1 or 1))) end
  end

  function MHA:heads_of(t, width)
    local s = t:shape()
    return t:view(s[1], s[2], self.heads, width):transpose(2, 3) -- (B, H, N, width)
  end

  function MHA:map_qk(t)
    if self.map == 'psi' then return pn.maps.psi(t)
    elseif self.map == 'xi' then return pn.maps.xi(t, { h = self.o.r or 1 })
    elseif self.map == 'pseudopolar' then return pn.maps.pseudopolar(t)
    elseif self.map == 'exp0' then return pn.maps.exp0(t, {})
    end
    return t
  end

  function MHA:forward(xq, xkv, extra)
    xkv = xkv or xq
    extra = extra or {}
    local q = self:map_qk(self:heads_of(self.q_proj(xq), self.dk))
    local k = self:map_qk(self:heads_of(self.k_proj(xkv), self.dk))
    local v = self:heads_of(self.v_proj(xkv), self.dv)
    local o = self.o
    local opts = { score = self.score, normalize = o.normalize, causal = o.causal, mask = extra.mask,
                   bias = extra.bias, beta = o.beta, c = o.c, model = o.model, curvature = o.curvature,
                   scale = o.scale, squared = o.squared, alibi = o.alibi,
                   gamma = self.gamma or o.gamma, r = self.r or o.r }
    local out = pn.attention(q, k, v, opts)            -- (B, H, Nq, dv)
    local s = out:shape()
    out = out:transpose(2, 3):reshape(s[1], s[3], self.d)
    return self.out_proj(out)
  end

  function MHA:extra_repr()
    return string.format('d=%d, heads=%d, score=%s, map=%s', self.d, self.heads, self.score, self.map)
  end
end
