-- penumbra.ops.linear — the linear attention family (DESIGN §3.2, core/attention/cosine.c,
-- power.c, rope.c, lin_state.c).
--   pn.cosine_attention(q, k, v, m, {causal=true, key_mask=nil})
--   pn.power_attention(q, k, v, {p=2, causal=true, log_gate=nil, chunk=nil, scale=nil})
--   pn.sympow_embed(x, p)                 x:sympow_embed(p)
--   pn.rope(x, {base=10000, theta=nil, rate=nil})   x:rope(opts)
--   pn.cosine_state{batch=, heads=, dim=, dim_v=, m=, dtype=}
--   pn.power_state{batch=, heads=, dim=, dim_v=, p=2, scale=, dtype=}
--     state:step(q, k, v [, log_gate]) -> (B, H, Dv)   state:reset()   state:reorder(idx)   state:bytes()   state:free()
-- q, k (B, H, N, D) and v (B, H, N, Dv); (B, N, D) and (N, D) are accepted too (one head,
-- one batch) and the output drops the same dims. m: (H) tensor or a number (every head).
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap, check, ffi = B.C, B.wrap, B.check, B.ffi
  local is_tensor = pn.is_tensor
  local options = require 'penumbra.options'
  local NAN = 0 / 0
  -- Option keys are checked (a typo such as {casual=false} would otherwise leave the default,
  -- causal, in place without a word); values the C side checks with the shapes are left to it.
  local COSINE = { causal = 'boolean', key_mask = 'any' }
  local POWER = { p = 'any', causal = 'boolean', log_gate = 'any', chunk = 'any', scale = 'number' }
  local ROPE = { base = 'number', theta = 'any', rate = 'any' }
  local STATE = { batch = 'any', heads = 'any', dim = 'any', dim_v = 'any', dtype = 'any' }
  local COSINE_STATE = options.with(STATE, { m = 'any' })
  local POWER_STATE = options.with(STATE, { p = 'any', scale = 'number' })

  local function need_tensor(op, name, x)
    if not is_tensor(x) then raise(op .. ': ' .. name .. ' must be a tensor, got ' .. type(x), 3) end
  end

  -- q, k, v of 2, 3 or 4 dims -> 4-D views, the number of leading dims added, and a
  -- function lifting (B, N)-shaped extras (log_gate, key_mask) the same way
  local function to4(op, q, k, v)
    need_tensor(op, 'q', q); need_tensor(op, 'k', k); need_tensor(op, 'v', v)
    local nd = q:dim()
    if k:dim() ~= nd or v:dim() ~= nd or nd < 2 or nd > 4 then
      raise(string.format('%s: q [%s], k [%s] and v [%s] must all be (B, H, N, D), (B, N, D) or (N, D)', op,
        table.concat(q:shape(), ','), table.concat(k:shape(), ','), table.concat(v:shape(), ',')), 3)
    end
    if nd == 4 then return q, k, v, 0 end
    if nd == 3 then return q:unsqueeze(2), k:unsqueeze(2), v:unsqueeze(2), 1 end
    return q:unsqueeze(1):unsqueeze(1), k:unsqueeze(1):unsqueeze(1), v:unsqueeze(1):unsqueeze(1), 2
  end
  local function from4(out, added)
    if added == 1 then return out:squeeze(2) end
    if added == 2 then return out:squeeze(1):squeeze(1) end
    return out
  end

  -- m: a tensor (H) or a number for every head, in q's dtype and on q's device
  local function heads_param(m, H, like)
    if type(m) == 'number' then return pn.full_like(like, m, { shape = { H } }) end
    return m
  end

  function pn.cosine_attention(q, k, v, m, opts)
    opts = options.check('cosine_attention', opts, COSINE, 2)
    local q4, k4, v4, added = to4('cosine_attention', q, k, v)
    if m == nil then raise('cosine_attention: m (one stabiliser per head, or a number) is required', 2) end
    m = heads_param(m, q4:size(2), q4)
    need_tensor('cosine_attention', 'm', m)
    local mask = opts.key_mask
    if mask ~= nil then
      need_tensor('cosine_attention', 'key_mask', mask)
      if added == 2 then mask = mask:unsqueeze(1) end
    end
    local causal = opts.causal
    if causal == nil then causal = true end
    return from4(wrap(C.pn_cosine_attention(q4, k4, v4, m, causal and 1 or 0, mask)), added)
  end

  function pn.power_attention(q, k, v, opts)
    opts = options.check('power_attention', opts, POWER, 2)
    local q4, k4, v4, added = to4('power_attention', q, k, v)
    local lg = opts.log_gate
    if lg ~= nil then
      need_tensor('power_attention', 'log_gate', lg)
      if added == 1 then lg = lg:unsqueeze(2) elseif added == 2 then lg = lg:unsqueeze(1):unsqueeze(1) end
    end
    local causal = opts.causal
    if causal == nil then causal = true end
    local p, chunk, scale = opts.p or 2, opts.chunk or 0, opts.scale or NAN
    if type(p) ~= 'number' or p % 1 ~= 0 then raise('power_attention: p must be an integer, got ' .. tostring(p), 2) end
    if type(chunk) ~= 'number' or chunk % 1 ~= 0 then raise('power_attention: chunk must be an integer, got ' .. tostring(chunk), 2) end
    return from4(wrap(C.pn_power_attention(q4, k4, v4, p, causal and 1 or 0, lg, chunk, scale)), added)
  end

  function pn.sympow_embed(x, p)
    need_tensor('sympow_embed', 'x', x)
    p = p or 2
    if type(p) ~= 'number' or p % 1 ~= 0 then raise('sympow_embed: p must be an integer, got ' .. tostring(p), 2) end
    return wrap(C.pn_sympow_embed(x, p))
  end
  M.sympow_embed = pn.sympow_embed

  function pn.rope(x, opts)
    need_tensor('rope', 'x', x)
    opts = options.check('rope', opts, ROPE, 2)
    if opts.theta ~= nil then need_tensor('rope', 'theta', opts.theta) end
    if opts.rate ~= nil then need_tensor('rope', 'rate', opts.rate) end
    return wrap(C.pn_rope(x, opts.base or 10000, opts.theta, opts.rate))
  end
  M.rope = pn.rope

  -- ---- recurrent states ------------------------------------------------------------------
  -- A Lua object owning one pn_lin_state* (freed by the GC, or at once by :free()).
  local State = {}
  State.__index = State

  local function new_state(kind, p)
    if p == nil then B.raise(B.last_error()) end
    return setmetatable({ kind = kind, _p = ffi.gc(p, C.pn_lin_state_free) }, State)
  end

  -- q, k (B, H, D), v (B, H, Dv), log_gate (B, H) (power only) -> output (B, H, Dv) of this position
  function State:step(q, k, v, log_gate)
    local op = self.kind .. '.step'
    need_tensor(op, 'q', q); need_tensor(op, 'k', k); need_tensor(op, 'v', v)
    if log_gate ~= nil then need_tensor(op, 'log_gate', log_gate) end
    return wrap(C.pn_lin_state_step(self._p, q, k, v, log_gate))
  end
  function State:reset() C.pn_lin_state_reset(self._p) end
  -- keep rows idx (1-D i64, 0-based; repeats allowed) of the batch: beam search between steps
  function State:reorder(idx)
    need_tensor(self.kind .. '.reorder', 'idx', idx)
    check(C.pn_lin_state_reorder(self._p, idx))
  end
  function State:bytes() return tonumber(C.pn_lin_state_bytes(self._p)) end
  function State:free()
    if self._p ~= nil then
      C.pn_lin_state_free(ffi.gc(self._p, nil))
      self._p = nil
    end
  end
  State.__tostring = function(s) return s.kind .. '(' .. (s._p ~= nil and s:bytes() .. ' bytes' or 'freed') .. ')' end

  local function dims(op, o, spec)
    if type(o) ~= 'table' then raise(op .. ': expected an options table {batch=, heads=, dim=, …}', 3) end
    options.check(op, o, spec, 3)
    for _, key in ipairs({ 'batch', 'heads', 'dim' }) do
      if type(o[key]) ~= 'number' then raise(op .. ': ' .. key .. ' (a number) is required', 3) end
    end
    return o.batch, o.heads, o.dim, o.dim_v or o.dim, B.dtype(o.dtype)
  end

  function pn.cosine_state(o)
    local b, h, d, dv, dt = dims('cosine_state', o, COSINE_STATE)
    local m = o.m
    if m == nil then raise('cosine_state: m (one stabiliser per head, or a number) is required', 2) end
    if type(m) == 'number' then m = pn.full({ h }, m, { dtype = 'f64' }) end
    need_tensor('cosine_state', 'm', m)
    return new_state('cosine_state', C.pn_cosine_state_new(b, h, d, dv, m, dt))
  end

  function pn.power_state(o)
    local b, h, d, dv, dt = dims('power_state', o, POWER_STATE)
    return new_state('power_state', C.pn_power_state_new(b, h, d, dv, o.p or 2, o.scale or NAN, dt))
  end
end
