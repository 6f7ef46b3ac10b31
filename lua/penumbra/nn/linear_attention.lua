-- penumbra.nn.linear_attention — linear-attention layers (DESIGN §3.2), drop-in
-- replacements for MultiheadAttention: same constructor (d_model, heads, opts) and the same
-- forward(x_q, x_kv [, extra]) with x (B, N, d_model) → (B, N, d_model).
--
-- CosineAttention(d, heads, {causal=true, bias=true, m_init=0.5, dtype=})
--   Cottention: q/k/v/out projections and a learned stabiliser m per head (H), init 0.5;
--   out_t = n_t^(−σ(m_h)) Σ_j (q̂_t·k̂_j) v_j (pn.cosine_attention).
--   extra: {key_mask=} u8 (B, N), nonzero = a real key (padding masks).
-- PowerAttention(d, heads, {p=2, causal=true, gating=true, learned_rotary=false, rope=true,
--   rope_base=10000, chunk=nil, scale=nil, gate_bias=0, bias=true, dtype=})
--   symmetric power attention (pn.power_attention): B_ij = g_ij (q'_i·k'_j)^p, A = B/ΣB.
--   gating: log-gates logsigmoid(W_γ x_t) per head, W_γ = gate_proj (d → H, with bias,
--   bias initialised to gate_bias); rotary (pn.rope on q and k): the fixed RoPE angles
--   μ_t θ with μ_t = t when rope and not learned_rotary; with learned_rotary the rate
--   β_t = 1 + tanh(W_β x_t) per head, W_β = rate_proj (d → H), μ_t = Σ_{s≤t} β_s
--   (conformal-sympow). Gates and rates come from x_kv (the keys' inputs).
--   chunk = nil: the quadratic form; chunk = c (causal only, c divides N): the chunked one.
--
-- Both layers generate one position at a time with step(x_t): x_t (B, d) → (B, d), the
-- row t of forward on the sequence so far, from a recurrent state (pn.cosine_state /
-- pn.power_state) created at the first step and dropped by :reset_state() (call it between
-- sequences, and after parameter updates: the cosine state keeps σ(m) from its creation);
-- :reorder_state(idx) keeps rows idx (1-D i64, 0-based) of the batch (beam search).
-- step runs without autograd; it needs causal = true.
--
-- x_kv, when given, must have the length of x_q: the linear kernels pair row t of the
-- queries with the keys up to t (causal) or all keys of the same sequence.
return function(nn, pn)
  local options = require 'penumbra.options'
  local raise = require('penumbra_ffi').raise

  -- ---- shared helpers ---------------------------------------------------------------------
  local function shape_str(t) return '[' .. table.concat(t:shape(), ',') .. ']' end

  local function common_init(self, name, d, heads, o)
    nn.size_arg(name, 'd_model', d, 5)
    nn.size_arg(name, 'heads', heads, 5)
    if d % heads ~= 0 then error(name .. ': d_model ' .. d .. ' is not divisible by heads ' .. heads, 3) end
    self.d, self.heads, self.dh = d, heads, d / heads
    self.causal = o.causal ~= false
    self.dtype = o.dtype
    local lo = { bias = o.bias ~= false, dtype = o.dtype }
    self:add('q_proj', nn.Linear(d, d, lo))
    self:add('k_proj', nn.Linear(d, d, lo))
    self:add('v_proj', nn.Linear(d, d, lo))
    self:add('out_proj', nn.Linear(d, d, lo))
  end

  -- x_q, x_kv (B, N, d); the only extras a linear kernel can honour are named in `allowed`
  local function check_inputs(self, xq, xkv, extra, allowed)
    local name = self.__name
    if not pn.is_tensor(xq) then raise(name .. ': x_q must be a tensor, got ' .. type(xq)) end
    if not pn.is_tensor(xkv) then raise(name .. ': x_kv must be a tensor, got ' .. type(xkv)) end
    if xq:dim() ~= 3 or xq:size(3) ~= self.d then
      raise(string.format('%s: x_q %s must be (B, N, d_model = %d)', name, shape_str(xq), self.d))
    end
    if xkv:dim() ~= 3 or xkv:size(1) ~= xq:size(1) or xkv:size(2) ~= xq:size(2) or xkv:size(3) ~= self.d then
      raise(string.format('%s: x_kv %s must have the shape of x_q %s (linear attention pairs query and key rows)',
        name, shape_str(xkv), shape_str(xq)))
    end
    for key in pairs(extra) do
      if not allowed[key] then
        local ok = {}
        for a in pairs(allowed) do ok[#ok + 1] = a end
        raise(string.format('%s: extra.%s is not supported by linear attention (supported: %s)', name, tostring(key),
          #ok > 0 and table.concat(ok, ', ') or 'none; masking is causal only'))
      end
    end
  end

  -- (B, N, d) → (B, H, N, dh), a view
  local function heads_of(self, t)
    local s = t:shape()
    return t:view(s[1], s[2], self.heads, self.dh):transpose(2, 3)
  end

  -- (B, H, N, dh) → out_proj of (B, N, d)
  local function merge(self, out)
    local s = out:shape()
    return self.out_proj(out:transpose(2, 3):reshape(s[1], s[3], self.d))
  end

  -- x_t (B, d) checked; the per-head projections (B, H, dh)
  local function step_qkv(self, x)
    local name = self.__name .. '.step'
    if not self.causal then error(name .. ': generation needs causal = true', 3) end
    if not pn.is_tensor(x) then error(name .. ': x_t must be a tensor, got ' .. type(x), 3) end
    if x:dim() ~= 2 or x:size(2) ~= self.d then
      error(string.format('%s: x_t %s must be (B, d_model = %d)', name, shape_str(x), self.d), 3)
    end
    local b = x:size(1)
    if self._state and self._state_batch ~= b then
      error(string.format('%s: x_t %s has batch %d but the state was started with batch %d; call :reset_state()',
        name, shape_str(x), b, self._state_batch), 3)
    end
    local H, dh = self.heads, self.dh
    return self.q_proj(x):view(b, H, dh), self.k_proj(x):view(b, H, dh), self.v_proj(x):view(b, H, dh), b
  end

  local function step_out(self, o, b) return self.out_proj(o:reshape(b, self.d)) end

  -- keep rows idx (1-D i64, 0-based) of the recurrent state between steps (beam search)
  local function reorder_state(self, idx)
    if not self._state then return self end
    self._state:reorder(idx)
    self._state_batch = idx:numel()
    if self._mu then self._mu = self._mu:index_select(1, idx) end
    return self
  end

  local function reset_state(self)
    if self._state then self._state:free() end
    self._state, self._state_batch = nil, nil
    self._pos, self._mu = 0, nil
    return self
  end

  -- ---- CosineAttention ---------------------------------------------------------------------
  local CA = nn.class('CosineAttention')
  nn.CosineAttention = CA

  function CA:init(d, heads, o)
    o = options.check('CosineAttention', o, { causal = 'boolean', dtype = 'string', bias = 'boolean', m_init = 'number' }, 3)
    common_init(self, 'CosineAttention', d, heads, o)
    self:param('m', pn.full({ heads }, o.m_init or 0.5, { dtype = o.dtype }))
  end

  function CA:forward(xq, xkv, extra)
    xkv = xkv or xq
    extra = extra or {}
    check_inputs(self, xq, xkv, extra, { key_mask = true })
    local q, k, v = heads_of(self, self.q_proj(xq)), heads_of(self, self.k_proj(xkv)), heads_of(self, self.v_proj(xkv))
    return merge(self, pn.cosine_attention(q, k, v, self.m, { causal = self.causal, key_mask = extra.key_mask }))
  end

  -- x_t (B, d) → (B, d)
  function CA:step(x)
    return pn.no_grad(function()
      local q, k, v, b = step_qkv(self, x)
      if not self._state then
        self._state = pn.cosine_state { batch = b, heads = self.heads, dim = self.dh, m = self.m, dtype = x:dtype() }
        self._state_batch = b
      end
      return step_out(self, self._state:step(q, k, v), b)
    end)
  end

  CA.reset_state = reset_state
  CA.reorder_state = reorder_state

  function CA:extra_repr()
    return string.format('d=%d, heads=%d, causal=%s', self.d, self.heads, tostring(self.causal))
  end

  -- ---- PowerAttention ------------------------------------------------------------------------
  local PA = nn.class('PowerAttention')
  nn.PowerAttention = PA

  function PA:init(d, heads, o)
    o = options.check('PowerAttention', o, { causal = 'boolean', dtype = 'string', bias = 'boolean', p = 'integer',
      chunk = { 'integer', min = 0 }, scale = 'number', gating = 'boolean', learned_rotary = 'boolean',
      rope = 'boolean', rope_base = { 'number', above = 0 }, gate_bias = 'number' }, 3)
    local p = o.p or 2
    if type(p) ~= 'number' or p % 2 ~= 0 or p < 2 then
      error('PowerAttention: p must be an even integer >= 2, got ' .. tostring(p), 2)
    end
    common_init(self, 'PowerAttention', d, heads, o)
    if self.dh % 2 ~= 0 and (o.rope ~= false or o.learned_rotary) then
      error('PowerAttention: rotary embeddings need an even head dim, got d_model/heads = ' .. self.dh, 2)
    end
    self.p, self.chunk, self.scale = p, o.chunk, o.scale
    self.gating = o.gating ~= false
    self.learned_rotary = o.learned_rotary == true
    self.rotary = self.learned_rotary or o.rope ~= false
    self.rope_base = o.rope_base or 10000
    if self.gating then
      local g = self:add('gate_proj', nn.Linear(d, heads, { dtype = o.dtype }))
      if o.gate_bias then pn.no_grad(function() g.bias:fill_(o.gate_bias) end) end
    end
    if self.learned_rotary then self:add('rate_proj', nn.Linear(d, heads, { dtype = o.dtype })) end
  end

  -- (B, N, d) → per-head (B, H, N) from a d → H projection
  local function per_head(t) return t:transpose(2, 3) end

  function PA:forward(xq, xkv, extra)
    xkv = xkv or xq
    extra = extra or {}
    check_inputs(self, xq, xkv, extra, {})
    local q, k, v = heads_of(self, self.q_proj(xq)), heads_of(self, self.k_proj(xkv)), heads_of(self, self.v_proj(xkv))
    local lg
    if self.gating then lg = per_head(self.gate_proj(xkv):logsigmoid()) end
    if self.rotary then
      local ro = { base = self.rope_base }
      if self.learned_rotary then ro.rate = per_head(self.rate_proj(xkv):tanh() + 1) end
      q, k = pn.rope(q, ro), pn.rope(k, ro)
    end
    local out = pn.power_attention(q, k, v, { p = self.p, causal = self.causal, log_gate = lg, chunk = self.chunk,
                                              scale = self.scale })
    return merge(self, out)
  end

  -- x_t (B, d) → (B, d). The rotary position μ (B, H) runs on between steps: μ = t without a
  -- learned rate, μ ← μ + β_t with one; pn.rope on a single row with rate μ rotates by μθ.
  function PA:step(x)
    return pn.no_grad(function()
      local q, k, v, b = step_qkv(self, x)
      local H, dh = self.heads, self.dh
      if not self._state then
        self._state = pn.power_state { batch = b, heads = H, dim = dh, dim_v = dh, p = self.p, scale = self.scale,
                                       dtype = x:dtype() }
        self._state_batch, self._pos, self._mu = b, 0, nil
      end
      local lg
      if self.gating then lg = self.gate_proj(x):logsigmoid() end -- (B, H)
      if self.rotary then
        local mu
        if self.learned_rotary then
          local beta = self.rate_proj(x):tanh() + 1               -- (B, H)
          mu = self._mu and (self._mu + beta) or beta
          self._mu = mu
        else
          mu = pn.full_like(x, self._pos, { shape = { 1 } })
        end
        local ro = { base = self.rope_base, rate = mu:reshape(mu:numel() == 1 and { 1 } or { b, H, 1 }) }
        q = pn.rope(q:reshape(b, H, 1, dh), ro):view(b, H, dh)
        k = pn.rope(k:reshape(b, H, 1, dh), ro):view(b, H, dh)
      end
      self._pos = self._pos + 1
      return step_out(self, self._state:step(q, k, v, lg), b)
    end)
  end

  PA.reset_state = reset_state
  PA.reorder_state = reorder_state

  function PA:extra_repr()
    return string.format('d=%d, heads=%d, p=%d, causal=%s, gating=%s, rotary=%s%s', self.d, self.heads, self.p,
      tostring(self.causal), tostring(self.gating),
      self.learned_rotary and 'learned' or tostring(self.rotary), self.chunk and (', chunk=' .. self.chunk) or '')
  end
end
