-- nn.CosineAttention and nn.PowerAttention (lua/penumbra/nn/linear_attention.lua): the
-- whole layer against a naive plain-Lua reference (projections, heads, RoPE with a fixed or
-- learned rate, gates, scores, out projection), step-by-step generation against the
-- parallel forward, f64 gradchecks of every parameter, named errors.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local nn = pn.nn

local flat = gradcheck.flat

local check = require 'spec.helpers.check'
local assert_close, assert_error_matching = check.assert_close, check.assert_error_matching

-- ---- naive reference -------------------------------------------------------------------------
local function dot(a, b)
  local s = 0
  for i = 1, #a do s = s + a[i] * b[i] end
  return s
end
local function sigmoid(x) return 1 / (1 + math.exp(-x)) end

-- y = W x + b for one row; W {out}{in}
local function lin(W, b, x)
  local y = {}
  for o = 1, #W do y[o] = dot(W[o], x) + (b and b[o] or 0) end
  return y
end

local function tab(t) return t and t:totable() or nil end

-- the head slice h (1-based) of a d-row
local function head(row, h, dh)
  local r = {}
  for i = 1, dh do r[i] = row[(h - 1) * dh + i] end
  return r
end

-- rotate pairs (x_2i, x_2i+1) by mu·θ_i, θ_i = base^(−2i/D), i 0-based
local function rotate(x, mu, base)
  local D, r = #x, {}
  for i = 0, D / 2 - 1 do
    local a = mu * base ^ (-2 * i / D)
    local c, s = math.cos(a), math.sin(a)
    r[2 * i + 1] = x[2 * i + 1] * c - x[2 * i + 2] * s
    r[2 * i + 2] = x[2 * i + 1] * s + x[2 * i + 2] * c
  end
  return r
end

local function unit(x)
  local n = math.sqrt(dot(x, x))
  local r = {}
  for i = 1, #x do r[i] = x[i] / n end
  return r
end

-- the layer L on X {b}{t}{d} (queries) and XKV (keys, values, gates, rates; X when nil):
-- kind 'cosine' or 'power'; mask {b}{t} of 0/1 (cosine) or nil
local function ref_layer(L, kind, X, mask, XKV)
  XKV = XKV or X
  local H, dh, d = L.heads, L.dh, L.d
  local Wq, bq = tab(L.q_proj.weight), tab(L.q_proj.bias)
  local Wk, bk = tab(L.k_proj.weight), tab(L.k_proj.bias)
  local Wv, bv = tab(L.v_proj.weight), tab(L.v_proj.bias)
  local Wo, bo = tab(L.out_proj.weight), tab(L.out_proj.bias)
  local Wg, bg = L.gate_proj and tab(L.gate_proj.weight), L.gate_proj and tab(L.gate_proj.bias)
  local Wr, br = L.rate_proj and tab(L.rate_proj.weight), L.rate_proj and tab(L.rate_proj.bias)
  local m = L.m and tab(L.m)
  local Y = {}
  for b = 1, #X do
    local N = #X[b]
    local Q, K, V, G, R = {}, {}, {}, {}, {}
    for t = 1, N do
      local xkv = XKV[b][t]
      Q[t], K[t], V[t] = lin(Wq, bq, X[b][t]), lin(Wk, bk, xkv), lin(Wv, bv, xkv)
      if Wg then G[t] = lin(Wg, bg, xkv) end
      if Wr then R[t] = lin(Wr, br, xkv) end
    end
    local O = {}
    for t = 1, N do O[t] = {} end
    for h = 1, H do
      local q, k, v, L_, mu = {}, {}, {}, {}, {}
      local accL, accmu = 0, 0
      for t = 1, N do
        q[t], k[t], v[t] = head(Q[t], h, dh), head(K[t], h, dh), head(V[t], h, dh)
        if Wg then accL = accL + math.log(sigmoid(G[t][h])) end
        L_[t] = accL
        if Wr then accmu = accmu + 1 + math.tanh(R[t][h]) else accmu = t - 1 end
        mu[t] = accmu
        if kind == 'power' and L.rotary then
          q[t], k[t] = rotate(q[t], mu[t], L.rope_base), rotate(k[t], mu[t], L.rope_base)
        end
      end
      for t = 1, N do
        local o, Z, n = {}, 0, 0
        for e = 1, dh do o[e] = 0 end
        for j = 1, (L.causal and t or N) do
          local w
          if kind == 'cosine' then
            if not mask or mask[b][j] ~= 0 then
              w = dot(unit(q[t]), unit(k[j]))
              n = n + 1
            end
          else
            local lg = t >= j and L_[t] - L_[j] or L_[j] - L_[t]
            w = math.exp(lg) * dot(q[t], k[j]) ^ L.p
            Z = Z + w
          end
          if w then for e = 1, dh do o[e] = o[e] + w * v[j][e] end end
        end
        local c = kind == 'cosine' and (n > 0 and n ^ sigmoid(m[h]) or 1) or Z
        for e = 1, dh do O[t][(h - 1) * dh + e] = o[e] / c end
      end
    end
    Y[b] = {}
    for t = 1, N do Y[b][t] = lin(Wo, bo, O[t]) end
  end
  return Y
end

-- ref_layer flattened in (b, t, e) order, as a list to compare with a tensor
local function flat_ref(L, kind, X, mask, XKV)
  local r, f = ref_layer(L, kind, X:totable(), mask and mask:totable(), XKV and XKV:totable()), {}
  for b = 1, #r do for t = 1, #r[b] do for e = 1, #r[b][t] do f[#f + 1] = r[b][t][e] end end end
  return f
end

-- every parameter of L replaced by a fresh random one (biases, m and gates too)
local function randomise(L, scale)
  for _, np in ipairs(L:named_parameters()) do
    local t = np[2]
    pn.no_grad(function() t:copy_(pn.randn(t:shape(), { dtype = t:dtype() }) * (scale or 0.5)) end)
  end
  return L
end

-- step through X (B, N, d) and compare every row with Y (B, N, d)
local function assert_steps_match(L, X, Y, tol, what)
  L:reset_state()
  for t = 1, X:size(2) do
    local yt = L:step(X:select(2, t))
    assert.same({ X:size(1), L.d }, yt:shape())
    assert_close(yt, Y:select(2, t):contiguous(), tol, what .. ' row ' .. t)
  end
end

-- ---- CosineAttention ---------------------------------------------------------------------------
describe('nn.CosineAttention', function()
  it('has q/k/v/out projections and m (H) initialised to 0.5; forward matches the naive layer', function()
    pn.manual_seed(1)
    local L = nn.CosineAttention(8, 2, { dtype = 'f64' })
    local names = {}
    for i, np in ipairs(L:named_parameters()) do names[i] = np[1] end
    assert.same({ 'm', 'q_proj.weight', 'q_proj.bias', 'k_proj.weight', 'k_proj.bias', 'v_proj.weight', 'v_proj.bias',
                  'out_proj.weight', 'out_proj.bias' }, names)
    assert.same({ 0.5, 0.5 }, L.m:totable())
    randomise(L)
    for _, causal in ipairs({ true, false }) do
      L.causal = causal
      local X = pn.randn({ 2, 5, 8 }, { dtype = 'f64' })
      local Y = L(X)
      assert.same({ 2, 5, 8 }, Y:shape())
      assert_close(Y, flat_ref(L, 'cosine', X), 1e-10, 'causal ' .. tostring(causal))
    end
  end)

  it('honours key_mask (B, N) and a separate x_kv; m_init, bias = false', function()
    pn.manual_seed(2)
    local L = nn.CosineAttention(6, 3, { dtype = 'f64', causal = false, bias = false, m_init = -1 })
    assert.same({ -1, -1, -1 }, L.m:totable())
    assert.is_nil(L.q_proj.bias)
    randomise(L)
    local X, Xkv = pn.randn({ 2, 4, 6 }, { dtype = 'f64' }), pn.randn({ 2, 4, 6 }, { dtype = 'f64' })
    local mask = pn.tensor({ { 1, 1, 0, 1 }, { 1, 0, 0, 1 } }, { dtype = 'u8' })
    assert_close(L(X, X, { key_mask = mask }), flat_ref(L, 'cosine', X, mask), 1e-10, 'masked')
    assert_close(L(X, Xkv, { key_mask = mask }), flat_ref(L, 'cosine', X, mask, Xkv), 1e-10, 'x_kv, masked')
    L.causal = true
    assert_close(L(X, Xkv), flat_ref(L, 'cosine', X, nil, Xkv), 1e-10, 'x_kv, causal')
  end)

  it('step-by-step generation equals the parallel forward (f64 1e-8, f32 1e-4), twice after reset_state', function()
    pn.manual_seed(3)
    local L = randomise(nn.CosineAttention(8, 2, { dtype = 'f64' }))
    local X = pn.randn({ 3, 9, 8 }, { dtype = 'f64' })
    local Y = L(X)
    assert_steps_match(L, X, Y, 1e-8, 'f64')
    assert_steps_match(L, X, Y, 1e-8, 'f64 again') -- reset_state starts over
    local L32 = nn.CosineAttention(8, 4)
    local X32 = pn.randn({ 2, 6, 8 })
    assert_steps_match(L32, X32, L32(X32), 1e-4, 'f32')
    assert.equal('f32', L32:step(X32:select(2, 1)):dtype())
  end)

  it('passes f64 gradchecks for every parameter (m and the projections), causal and not', function()
    for _, causal in ipairs({ true, false }) do
      pn.manual_seed(4)
      local L = randomise(nn.CosineAttention(4, 2, { dtype = 'f64', causal = causal }))
      local X = pn.randn({ 2, 3, 4 }, { dtype = 'f64' })
      gradcheck(function() return L(X) end, L:parameters())
      L:zero_grad()
      L(X):sum():backward()
      assert.truthy(L.m.grad, 'm has a gradient')
      assert.is_true(math.abs(flat(L.m.grad)[1]) > 0)
    end
  end)

  it('raises named errors for bad shapes, unsupported extras and generation misuse', function()
    local L = nn.CosineAttention(8, 2, { dtype = 'f64' })
    local X = pn.randn({ 2, 5, 8 }, { dtype = 'f64' })
    assert_error_matching(function() nn.CosineAttention(8, 3) end, 'CosineAttention', 'not divisible')
    assert_error_matching(function() L(pn.randn({ 5, 8 }, { dtype = 'f64' })) end, 'CosineAttention', 'x_q [5,8]')
    assert_error_matching(function() L(pn.randn({ 2, 5, 6 }, { dtype = 'f64' })) end, 'CosineAttention', 'x_q [2,5,6]')
    assert_error_matching(function() L(X, pn.randn({ 2, 4, 8 }, { dtype = 'f64' })) end, 'CosineAttention',
      'x_kv [2,4,8]', 'x_q [2,5,8]')
    assert_error_matching(function() L(X, X, { mask = pn.ones({ 5, 5 }, { dtype = 'u8' }) }) end, 'CosineAttention',
      'extra.mask', 'key_mask')
    assert_error_matching(function() L(X, X, { key_mask = pn.ones({ 2, 4 }, { dtype = 'u8' }) }) end,
      'cosine_attention', 'key_mask [2,4]')
    assert_error_matching(function() L:step(pn.randn({ 2, 6 }, { dtype = 'f64' })) end, 'CosineAttention.step',
      'x_t [2,6]')
    L:step(X:select(2, 1))
    assert_error_matching(function() L:step(pn.randn({ 3, 8 }, { dtype = 'f64' })) end, 'CosineAttention.step',
      'batch', 'reset_state')
    L:reset_state()
    L:step(pn.randn({ 3, 8 }, { dtype = 'f64' })) -- a new batch size after reset_state
    local Lb = nn.CosineAttention(8, 2, { causal = false })
    assert_error_matching(function() Lb:step(pn.randn({ 1, 8 })) end, 'CosineAttention.step', 'causal')
  end)
end)

-- ---- PowerAttention ---------------------------------------------------------------------------
local CONFIGS = {
  { name = 'gated, RoPE', o = {} },
  { name = 'gated, learned rotary', o = { learned_rotary = true } },
  { name = 'no gates, no rotary, p = 4', o = { gating = false, rope = false, p = 4 } },
  { name = 'gated, learned rotary, chunked', o = { learned_rotary = true, chunk = 3 } },
  { name = 'gates, RoPE, bidirectional', o = { causal = false } },
}

describe('nn.PowerAttention', function()
  it('registers gate_proj (W_gamma) and rate_proj (W_beta) as asked; forward matches the naive layer', function()
    local L0 = nn.PowerAttention(8, 2)
    assert.truthy(L0.gate_proj)
    assert.is_nil(L0.rate_proj)
    assert.same({ 2, 8 }, L0.gate_proj.weight:shape())
    local L1 = nn.PowerAttention(8, 2, { learned_rotary = true, gating = false, gate_bias = 3 })
    assert.is_nil(L1.gate_proj)
    assert.same({ 2, 8 }, L1.rate_proj.weight:shape())
    assert.same({ 4, 4 }, nn.PowerAttention(8, 2, { gate_bias = 4 }).gate_proj.bias:totable())
    for i, c in ipairs(CONFIGS) do
      pn.manual_seed(10 + i)
      local o = { dtype = 'f64' }
      for k, v in pairs(c.o) do o[k] = v end
      local L = randomise(nn.PowerAttention(8, 2, o))
      local X = pn.randn({ 2, 6, 8 }, { dtype = 'f64' })
      local Y = L(X)
      assert.same({ 2, 6, 8 }, Y:shape())
      assert_close(Y, flat_ref(L, 'power', X), 1e-9, c.name)
      local Xkv = pn.randn({ 2, 6, 8 }, { dtype = 'f64' })
      assert_close(L(X, Xkv), flat_ref(L, 'power', X, nil, Xkv), 1e-9, c.name .. ', x_kv')
    end
  end)

  it('step-by-step generation equals the parallel forward (f64 1e-8): gates, RoPE, learned rotary', function()
    for i, c in ipairs(CONFIGS) do
      if c.o.causal == nil then
        pn.manual_seed(20 + i)
        local o = { dtype = 'f64' }
        for k, v in pairs(c.o) do o[k] = v end
        local L = randomise(nn.PowerAttention(8, 2, o))
        local X = pn.randn({ 2, 9, 8 }, { dtype = 'f64' }) -- chunk 3 divides 9
        local Y = L(X)
        assert_steps_match(L, X, Y, 1e-8, c.name)
        assert_steps_match(L, X, Y, 1e-8, c.name .. ' after reset')
      end
    end
    local L32 = nn.PowerAttention(8, 2, { learned_rotary = true })
    local X32 = pn.randn({ 2, 7, 8 })
    assert_steps_match(L32, X32, L32(X32), 1e-4, 'f32')
  end)

  it('passes f64 gradchecks for every parameter, W_gamma and W_beta included', function()
    for i, c in ipairs(CONFIGS) do
      pn.manual_seed(30 + i)
      local o = { dtype = 'f64' }
      for k, v in pairs(c.o) do o[k] = v end
      if o.chunk then o.chunk = 2 end
      local L = randomise(nn.PowerAttention(4, 2, o))
      local X = pn.randn({ 1, 4, 4 }, { dtype = 'f64' })
      local ok, report = gradcheck.check(function() return L(X) end, L:parameters(), { atol = 1e-6, rtol = 1e-5 })
      assert.is_true(ok, c.name .. ':\n' .. report)
      L:zero_grad()
      L(X):sum():backward()
      for _, np in ipairs(L:named_parameters()) do assert.truthy(np[2].grad, c.name .. ': ' .. np[1] .. ' has a gradient') end
    end
  end)

  it('stands in for MultiheadAttention inside nn.Sequential', function()
    pn.manual_seed(5)
    local net = nn.Sequential(nn.PowerAttention(8, 2), nn.LayerNorm(8), nn.CosineAttention(8, 2))
    local X = pn.randn({ 2, 4, 8 })
    local Y = net(X)
    assert.same({ 2, 4, 8 }, Y:shape())
    Y:sum():backward()
    for _, np in ipairs(net:named_parameters()) do assert.truthy(np[2].grad, np[1] .. ' has a gradient') end
  end)

  it('raises named errors: p, head dim, shapes, chunk, extras, generation misuse', function()
    assert_error_matching(function() nn.PowerAttention(8, 2, { p = 3 }) end, 'PowerAttention', 'p must be')
    assert_error_matching(function() nn.PowerAttention(6, 2) end, 'PowerAttention', 'even head dim')
    assert_error_matching(function() nn.PowerAttention(7, 2) end, 'PowerAttention', 'not divisible')
    local L = nn.PowerAttention(8, 2, { dtype = 'f64', chunk = 4 })
    local X = pn.randn({ 1, 6, 8 }, { dtype = 'f64' })
    assert_error_matching(function() L(X) end, 'power_attention', 'chunk = 4', 'N = 6')
    assert_error_matching(function() L(pn.randn({ 1, 6, 4 }, { dtype = 'f64' })) end, 'PowerAttention', 'x_q [1,6,4]')
    assert_error_matching(function() L(X, X, { key_mask = pn.ones({ 1, 6 }, { dtype = 'u8' }) }) end, 'PowerAttention',
      'extra.key_mask')
    assert_error_matching(function() L:step(pn.randn({ 1, 8, 1 }, { dtype = 'f64' })) end, 'PowerAttention.step',
      'x_t [1,8,1]')
    local Lb = nn.PowerAttention(8, 2, { causal = false })
    assert_error_matching(function() Lb:step(pn.randn({ 1, 8 })) end, 'PowerAttention.step', 'causal')
    L:step(pn.randn({ 1, 8 }, { dtype = 'f64' }))
    assert_error_matching(function() L:step(pn.randn({ 2, 8 }, { dtype = 'f64' })) end, 'PowerAttention.step', 'batch')
  end)

  it('frees its recurrent state on reset_state (state bytes leave pn.live_bytes)', function()
    collectgarbage('collect')
    local L = nn.PowerAttention(8, 2, { dtype = 'f64' })
    local x = pn.randn({ 1, 8 }, { dtype = 'f64' })
    L:step(x)
    local bytes = L._state:bytes()
    assert.is_true(bytes > 2 * 10 * 4 * 8) -- S (B, H, C(4+1, 2) = 10, Dv = 4) in f64
    collectgarbage('collect')
    local before = pn.live_bytes()
    L:reset_state()
    collectgarbage('collect')
    assert.is_true(before - pn.live_bytes() >= 2 * 10 * 4 * 8)
  end)
end)

-- ---- the chunked cosine kernels (core/attention/cosine_impl.h, chunks of 64 rows) -----------
-- Sequences longer than one chunk, with a ragged last chunk and padding keys on both sides
-- of chunk boundaries, against the plain-Lua definition and the recurrent state.
describe('cosine_attention across chunk boundaries', function()
  -- out[b][h][t] by the definition, nested tables
  local function ref_cosine(Q, K, V, m, causal, mask)
    local out = {}
    for b = 1, #Q do
      for h = 1, #Q[b] do
        local N, Dv = #Q[b][h], #V[b][h][1]
        for t = 1, N do
          local o, n = {}, 0
          for e = 1, Dv do o[e] = 0 end
          for j = 1, (causal and t or N) do
            if not mask or mask[b][j] ~= 0 then
              n = n + 1
              local w = dot(unit(Q[b][h][t]), unit(K[b][h][j]))
              for e = 1, Dv do o[e] = o[e] + w * V[b][h][j][e] end
            end
          end
          local c = n > 0 and n ^ sigmoid(m[h]) or 1
          for e = 1, Dv do out[#out + 1] = o[e] / c end
        end
      end
    end
    return out
  end

  local function mask_for(Bn, N)
    local mv = {}
    for b = 1, Bn do
      mv[b] = {}
      for j = 1, N do mv[b][j] = ((j * 7 + b) % 5 == 0 or (j >= 60 and j <= 70 and b == 1)) and 0 or 1 end
    end
    return mv
  end

  it('matches the definition for N = 150 (f64 1e-10, f32 1e-5), causal or not, masked or not', function()
    pn.manual_seed(40)
    local Bn, H, N, D, Dv = 2, 2, 150, 5, 3
    local mv = mask_for(Bn, N)
    local mask = pn.tensor(mv, { dtype = 'u8' })
    local mvals = { 0.5, -0.7 }
    for _, dt in ipairs({ 'f64', 'f32' }) do
      local q, k, v = pn.randn({ Bn, H, N, D }, { dtype = dt }), pn.randn({ Bn, H, N, D }, { dtype = dt }),
        pn.randn({ Bn, H, N, Dv }, { dtype = dt })
      local m = pn.tensor(mvals, { dtype = dt })
      local Q, K, V = q:totable(), k:totable(), v:totable()
      for _, causal in ipairs({ true, false }) do
        for _, masked in ipairs({ false, true }) do
          local out = pn.cosine_attention(q, k, v, m, { causal = causal, key_mask = masked and mask or nil })
          assert_close(out, ref_cosine(Q, K, V, mvals, causal, masked and mv or nil), dt == 'f64' and 1e-10 or 1e-5,
            string.format('%s causal=%s masked=%s', dt, tostring(causal), tostring(masked)))
        end
      end
    end
  end)

  it('agrees with the recurrent state over 200 steps (f64 1e-10)', function()
    pn.manual_seed(41)
    local Bn, H, N, D, Dv = 1, 2, 200, 4, 4
    local q, k, v = pn.randn({ Bn, H, N, D }, { dtype = 'f64' }), pn.randn({ Bn, H, N, D }, { dtype = 'f64' }),
      pn.randn({ Bn, H, N, Dv }, { dtype = 'f64' })
    local m = pn.tensor({ 0.5, 2 }, { dtype = 'f64' })
    local par = pn.cosine_attention(q, k, v, m)
    local st = pn.cosine_state { batch = Bn, heads = H, dim = D, dim_v = Dv, m = m, dtype = 'f64' }
    for t = 1, N do
      assert_close(st:step(q:select(3, t), k:select(3, t), v:select(3, t)), par:select(3, t):contiguous(), 1e-10,
        'step ' .. t)
    end
  end)

  it('passes f64 gradchecks for q, k, v and m over three chunks (causal, bidirectional, masked)', function()
    pn.manual_seed(42)
    local N = 140
    local mask = pn.tensor(mask_for(1, N), { dtype = 'u8' })
    for _, case in ipairs({ { causal = true }, { causal = false }, { causal = true, key_mask = mask },
                            { causal = false, key_mask = mask } }) do
      local q = pn.randn({ 1, 1, N, 2 }, { dtype = 'f64' }):requires_grad_()
      local k = pn.randn({ 1, 1, N, 2 }, { dtype = 'f64' }):requires_grad_()
      local v = pn.randn({ 1, 1, N, 2 }, { dtype = 'f64' }):requires_grad_()
      local m = pn.tensor({ 0.3 }, { dtype = 'f64', requires_grad = true })
      local ok, report = gradcheck.check(function(a, b, c, d) return pn.cosine_attention(a, b, c, d, case) end,
        { q, k, v, m })
      assert.is_true(ok, report)
    end
  end)

  it('gives the same f32 gradients as the f64 kernel (relative 1e-4), causal or not, masked', function()
    pn.manual_seed(43)
    local N = 130
    local x = {}
    for i, shape in ipairs({ { 1, 2, N, 6 }, { 1, 2, N, 6 }, { 1, 2, N, 5 } }) do x[i] = pn.randn(shape, { dtype = 'f64' }) end
    local g = pn.randn({ 1, 2, N, 5 }, { dtype = 'f64' })
    local mask = pn.tensor(mask_for(1, N), { dtype = 'u8' })
    for _, case in ipairs({ { causal = true }, { causal = false, key_mask = mask }, { causal = true, key_mask = mask } }) do
      local grads = {}
      for _, dt in ipairs({ 'f64', 'f32' }) do
        local ins = {}
        for i = 1, 3 do ins[i] = x[i]:to(dt):detach():requires_grad_() end
        ins[4] = pn.tensor({ 0.5, -0.5 }, { dtype = dt, requires_grad = true })
        pn.cosine_attention(ins[1], ins[2], ins[3], ins[4], case):backward(g:to(dt))
        grads[dt] = ins
      end
      for i = 1, 4 do
        assert_close(grads.f32[i].grad, grads.f64[i].grad, 1e-4,
          string.format('causal=%s masked=%s input %d', tostring(case.causal), tostring(case.key_mask ~= nil), i))
      end
    end
  end)
end)

-- ---- φ² without the index table (power.c's p = 2 fast path) ----------------------------------
describe('sympow_embed p = 2 (fast path)', function()
  it('lists the monomials in lexicographic order with sqrt(2) off the diagonal, and its gradient is exact', function()
    pn.manual_seed(44)
    local x = pn.randn({ 4, 5 }, { dtype = 'f64' })
    local X, P = x:totable(), pn.sympow_embed(x, 2):totable()
    for r = 1, 4 do
      local want = {}
      for a = 1, 5 do
        for b = a, 5 do want[#want + 1] = (a == b and 1 or math.sqrt(2)) * X[r][a] * X[r][b] end
      end
      assert_close(P[r], want, 1e-14, 'row ' .. r)
    end
    local ok, report = gradcheck.check(function(a) return pn.sympow_embed(a, 2) end,
      { pn.randn({ 3, 6 }, { dtype = 'f64' }):requires_grad_() })
    assert.is_true(ok, report)
  end)
end)
