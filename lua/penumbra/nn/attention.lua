-- penumbra.nn.attention — MultiheadAttention over any registry score (DESIGN §3.1).
--
-- MultiheadAttention(d_model, heads, {score='dot', map=nil|'psi'|'xi'|'pseudopolar'|'exp0',
--   normalize='softmax', causal=false, dropout=0, bias=true, model=, squared=, alibi=,
--   precision='native'|'bf16'|'f16' (pn.attention's: tensor cores for f32 on CUDA),
--   qk_dim=d_model/heads, <param>=, learn_<param>=false})
-- forward(x_q, x_kv [, {mask=, bias=}]) with x (B, N, d_model) → (B, Nq, d_model).
-- The score's parameters and its default map come from its registry description
-- (pn.attention_variant(score)): <param> = a number for each of them (gamma, r, beta, …), and
-- learn_<param> = true makes it a per-head parameter (H), initialised to <param> or the
-- default, handed to the fused kernel as a tensor.
return function(nn, pn)
  local MHA = nn.class('MultiheadAttention')
  nn.MultiheadAttention = MHA
  local score_params = require 'penumbra.nn.score_params'

  local options = require 'penumbra.options'
  local raise = require('penumbra_ffi').raise
  local MHA_OPTS = { qk_dim = { 'integer', min = 1 }, score = 'string', map = 'string', bias = 'boolean',
                     normalize = 'string', causal = 'boolean', model = 'string', squared = 'boolean', alibi = 'boolean',
                     precision = { 'string', one_of = { 'native', 'bf16', 'f16' } } }

  function MHA:init(d, heads, o)
    nn.size_arg('MultiheadAttention', 'd_model', d)
    nn.size_arg('MultiheadAttention', 'heads', heads)
    local score, desc = score_params.score('MultiheadAttention', o, 'dot', 3, pn)
    o = options.check('MultiheadAttention', o, options.score_params(options.with(MHA_OPTS), desc), 3)
    if d % heads ~= 0 then error('MultiheadAttention: d_model ' .. d .. ' is not divisible by heads ' .. heads, 2) end
    self.d, self.heads = d, heads
    self.dv = math.floor(d / heads)
    self.dk = o.qk_dim or self.dv
    self.o = o
    self.score, self.desc = score, desc
    self.map = o.map or self.desc.map
    local bias = o.bias ~= false
    self:add('q_proj', nn.Linear(d, heads * self.dk, { bias = bias }))
    self:add('k_proj', nn.Linear(d, heads * self.dk, { bias = bias }))
    self:add('v_proj', nn.Linear(d, d, { bias = bias }))
    self:add('out_proj', nn.Linear(d, d, { bias = bias }))
    self.learned = score_params.learnable(self, 'MultiheadAttention', self.desc, o, heads, self.dk, pn)
  end

  function MHA:heads_of(t, width)
    local s = t:shape()
    return t:view(s[1], s[2], self.heads, width):transpose(2, 3) -- (B, H, N, width)
  end

  function MHA:map_qk(t)
    if self.map == 'psi' then return pn.maps.psi(t)
    elseif self.map == 'xi' then return pn.maps.xi(t, { h = self.o.r or 1 })
    elseif self.map == 'pseudopolar' then return pn.maps.pseudopolar(t)
    elseif self.map == 'exp0' then
      -- penumbral needs heights below r as ξ gives them (Coneheads §5.1: the exp-map point
      -- projected onto the horosphere's region): exp0 clamps the height at r there
      return pn.maps.exp0(t, { h = self.score == 'penumbral' and (self.o.r or self.desc.params.r.default) or nil })
    end
    return t
  end

  -- The mapped keys (B, H, Nk, qk_dim) and values (B, H, Nk, dv) of x_kv (B, Nk, d_model):
  -- what an incremental decoder caches (keys of earlier positions never change).
  -- x (B, N, d_model) or an error naming the layer, the argument and the shapes
  local function check_x(self, what, x, like)
    if not pn.is_tensor(x) then raise('MultiheadAttention: ' .. what .. ' must be a tensor, got ' .. type(x)) end
    local s = x:shape()
    if #s ~= 3 or s[3] ~= self.d or (like and s[1] ~= like:size(1)) then
      raise(string.format('MultiheadAttention: %s [%s] must be (B, N, d_model = %d)%s', what, table.concat(s, ','),
        self.d, like and (' with the batch of x_q [' .. table.concat(like:shape(), ',') .. ']') or ''))
    end
  end
  local EXTRA = { mask = 'tensor', bias = 'tensor' }

  function MHA:keys(xkv)
    check_x(self, 'x_kv', xkv)
    return self:map_qk(self:heads_of(self.k_proj(xkv), self.dk))
  end
  function MHA:keys_values(xkv) return self:keys(xkv), self:heads_of(self.v_proj(xkv), self.dv) end

  -- the mapped queries (B, H, Nq, qk_dim) of x_q and the options of pn.attention for them
  local function queries(self, xq, extra)
    check_x(self, 'x_q', xq)
    extra = options.check('MultiheadAttention', extra, EXTRA, 3) -- pn.attention's mask and bias
    local o = self.o
    local opts = { score = self.score, normalize = o.normalize, causal = o.causal, mask = extra.mask,
                   bias = extra.bias, model = o.model, squared = o.squared, alibi = o.alibi, precision = o.precision }
    score_params.fill(opts, self.desc, o, self, self.learned)
    return self:map_qk(self:heads_of(self.q_proj(xq), self.dk)), opts
  end

  -- x_q (B, Nq, d_model) against keys and values from keys_values → (B, Nq, d_model). With
  -- causal, query i sees keys j <= i + (Nk − Nq) (sequences aligned at their ends), so one
  -- new query against the cache of every earlier position is row Nk of the full forward.
  function MHA:attend(xq, k, v, extra)
    local q, opts = queries(self, xq, extra)
    local out = pn.attention(q, k, v, opts)            -- (B, H, Nq, dv)
    local s = out:shape()
    out = out:transpose(2, 3):reshape(s[1], s[3], self.d)
    return self.out_proj(out)
  end

  function MHA:forward(xq, xkv, extra)
    check_x(self, 'x_q', xq)
    if xkv then check_x(self, 'x_kv', xkv, xq) end
    local k, v = self:keys_values(xkv or xq)
    return self:attend(xq, k, v, extra)
  end

  -- The attention weights (B, H, Nq, Nk) the forward would use (heatmaps)
  function MHA:weights(xq, xkv, extra)
    local q, opts = queries(self, xq, extra)
    return pn.attention_weights(q, self:keys(xkv or xq), opts)
  end

  function MHA:extra_repr()
    return string.format('d=%d, heads=%d, score=%s, map=%s', self.d, self.heads, self.score, self.map)
  end
end
