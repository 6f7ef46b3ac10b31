-- Linear attention (core/attention/cosine.c, power.c, rope.c, lin_state.c;
-- lua/penumbra/ops/linear.lua): Cottention, symmetric power attention (quadratic and
-- chunked forms), the φᵖ embedding, RoPE with a learned rate, and the recurrent states.
-- Values against naive plain-Lua loops over nested tables, parallel vs chunked vs
-- recurrent agreement, f64 gradchecks for every input, errors.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'

local flat = gradcheck.flat

local check = require 'spec.helpers.check'
local assert_close, assert_error_matching = check.assert_close, check.assert_error_matching

local function randn(shape, dtype, grad)
  local t = pn.randn(shape, { dtype = dtype or 'f64' })
  if grad then t:requires_grad_() end
  return t
end

-- log gates in (−0.7, 0], as log σ(·) of a layer would give
local function log_gates(shape, dtype, grad)
  local t = (pn.rand(shape, { dtype = dtype or 'f64' }) * -0.7):detach()
  if grad then t:requires_grad_() end
  return t
end

local function dot(a, b)
  local s = 0
  for i = 1, #a do s = s + a[i] * b[i] end
  return s
end

local function sigmoid(x) return 1 / (1 + math.exp(-x)) end

-- ---- naive references (nested tables [b][h][t][d]) ----------------------------------------
local function unit(x)
  local n = math.sqrt(dot(x, x))
  local r = {}
  for i = 1, #x do r[i] = n > 0 and x[i] / n or 0 end
  return r
end

-- mask: nil or [b][j] of 0/1; normalise = false: the plain unnormalised sum
local function ref_cosine(Q, K, V, m, causal, mask, normalise)
  local out = {}
  for b = 1, #Q do
    out[b] = {}
    for h = 1, #Q[b] do
      out[b][h] = {}
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
        local c = (normalise == false or n == 0) and 1 or n ^ sigmoid(m[h])
        for e = 1, Dv do o[e] = o[e] / c end
        out[b][h][t] = o
      end
    end
  end
  return out
end

-- B_ij = g_ij (scale q·k)^p; LG: nil or [b][h][t] log gates
local function ref_power(Q, K, V, p, causal, LG, scale)
  scale = scale or 1
  local out = {}
  for b = 1, #Q do
    out[b] = {}
    for h = 1, #Q[b] do
      out[b][h] = {}
      local N, Dv = #Q[b][h], #V[b][h][1]
      for i = 1, N do
        local o, z = {}, 0
        for e = 1, Dv do o[e] = 0 end
        for j = 1, (causal and i or N) do
          local lg = 0
          if LG then
            local lo, hi = math.min(i, j), math.max(i, j)
            for kk = lo + 1, hi do lg = lg + LG[b][h][kk] end
          end
          local w = math.exp(lg) * (scale * dot(Q[b][h][i], K[b][h][j])) ^ p
          z = z + w
          for e = 1, Dv do o[e] = o[e] + w * V[b][h][j][e] end
        end
        for e = 1, Dv do o[e] = z > 0 and o[e] / z or 0 end
        out[b][h][i] = o
      end
    end
  end
  return out
end

-- X: [..][t][d] nested to any depth above the (N, D) matrix; rate: function(path, t) or nil
local function ref_rope(X, base, theta, rate)
  local function rot(M, path)
    local N, D = #M, #M[1]
    local th = {}
    for i = 0, D / 2 - 1 do th[i] = theta and theta[i + 1] or base ^ (-2 * i / D) end
    local out, mu = {}, 0
    for t = 1, N do
      mu = rate and mu + rate(path, t) or (t - 1)
      local r = {}
      for i = 0, D / 2 - 1 do
        local a = mu * th[i]
        local x0, x1 = M[t][2 * i + 1], M[t][2 * i + 2]
        r[2 * i + 1] = x0 * math.cos(a) - x1 * math.sin(a)
        r[2 * i + 2] = x0 * math.sin(a) + x1 * math.cos(a)
      end
      out[t] = r
    end
    return out
  end
  local function walk(T, path)
    if type(T[1][1]) == 'number' then return rot(T, path) end
    local r = {}
    for i = 1, #T do
      local p = { unpack(path) }
      p[#p + 1] = i
      r[i] = walk(T[i], p)
    end
    return r
  end
  return walk(X, {})
end

local function flatten(T, acc)
  acc = acc or {}
  if type(T) == 'number' then acc[#acc + 1] = T; return acc end
  for i = 1, #T do flatten(T[i], acc) end
  return acc
end

local function binom(n, k)
  local r = 1
  for i = 1, k do r = r * (n - k + i) / i end
  return math.floor(r + 0.5)
end

-- ---- cosine attention ----------------------------------------------------------------------
describe('cosine_attention', function()
  it('matches the naive reference: causal, bidirectional, with key_mask (f64 and f32)', function()
    pn.manual_seed(1)
    for _, dt in ipairs({ 'f64', 'f32' }) do
      local tol = dt == 'f64' and 1e-10 or 2e-5
      local q, k, v = randn({ 2, 3, 6, 4 }, dt), randn({ 2, 3, 6, 4 }, dt), randn({ 2, 3, 6, 3 }, dt)
      local mvals = { 0.5, -1.0, 2.0 }
      local m = pn.tensor(mvals, { dtype = dt })
      local Q, K, V = q:totable(), k:totable(), v:totable()
      local maskvals = { { 1, 0, 1, 1, 0, 1 }, { 0, 1, 1, 1, 1, 0 } }
      local mask = pn.tensor(maskvals, { dtype = 'u8' })
      for _, causal in ipairs({ true, false }) do
        assert_close(pn.cosine_attention(q, k, v, m, { causal = causal }), flatten(ref_cosine(Q, K, V, mvals, causal)), tol,
          dt .. ' causal=' .. tostring(causal))
        assert_close(pn.cosine_attention(q, k, v, m, { causal = causal, key_mask = mask }),
          flatten(ref_cosine(Q, K, V, mvals, causal, maskvals)), tol, dt .. ' masked causal=' .. tostring(causal))
      end
    end
  end)

  it('reads non-contiguous inputs and accepts (B, N, D), (N, D) and a number for m', function()
    pn.manual_seed(2)
    local qt, kt, vt = randn({ 2, 5, 3, 4 }), randn({ 2, 5, 3, 4 }), randn({ 2, 5, 3, 2 })  -- (B, N, H, D)
    local q, k, v = qt:transpose(2, 3), kt:transpose(2, 3), vt:transpose(2, 3)
    assert.is_false(q:is_contiguous())
    local mvals = { 0.3, 0.3, 0.3 }
    local ref = flatten(ref_cosine(q:totable(), k:totable(), v:totable(), mvals, true))
    assert_close(pn.cosine_attention(q, k, v, 0.3), ref, 1e-10, 'transposed')
    assert_close(pn.cosine_attention(q:contiguous(), k:contiguous(), v:contiguous(), pn.tensor(mvals, { dtype = 'f64' })),
      ref, 1e-10, 'contiguous')
    local q3, k3, v3 = q:select(2, 1), k:select(2, 1), v:select(2, 1)   -- (B, N, D)
    local o3 = pn.cosine_attention(q3, k3, v3, 0.3, { causal = false })
    assert.same({ 2, 5, 2 }, o3:shape())
    local r = ref_cosine(q:totable(), k:totable(), v:totable(), mvals, false)
    assert_close(o3, flatten({ r[1][1], r[2][1] }), 1e-10, '3-D')
    local o2 = pn.cosine_attention(q3:select(1, 2), k3:select(1, 2), v3:select(1, 2), 0.3)
    assert.same({ 5, 2 }, o2:shape())
    assert_close(o2, pn.cosine_attention(q, k, v, 0.3):select(1, 2):select(1, 1), 1e-12, '2-D')
  end)

  it('with m -> -inf equals the plain unnormalised sum', function()
    pn.manual_seed(3)
    local q, k, v = randn({ 1, 2, 7, 3 }), randn({ 1, 2, 7, 3 }), randn({ 1, 2, 7, 2 })
    for _, causal in ipairs({ true, false }) do
      local out = pn.cosine_attention(q, k, v, -50, { causal = causal })
      assert_close(out, flatten(ref_cosine(q:totable(), k:totable(), v:totable(), { 0, 0 }, causal, nil, false)), 1e-10,
        'causal=' .. tostring(causal))
    end
  end)

  it('gives finite values and gradients for zero vectors (eps in the normalisation)', function()
    local q = pn.zeros({ 1, 1, 3, 2 }, { dtype = 'f64' }):requires_grad_()
    local k = pn.zeros({ 1, 1, 3, 2 }, { dtype = 'f64' }):requires_grad_()
    local v = pn.ones({ 1, 1, 3, 2 }, { dtype = 'f64' }):requires_grad_()
    local m = pn.tensor({ 0.5 }, { dtype = 'f64', requires_grad = true })
    local out = pn.cosine_attention(q, k, v, m)
    for _, x in ipairs(flat(out)) do assert.are.equal(0, x) end
    out:sum():backward()
    for _, t in ipairs({ q, k, v, m }) do
      for _, g in ipairs(flat(t.grad)) do assert.is_true(g == g and math.abs(g) < math.huge) end
    end
  end)

  it('passes f64 gradchecks for q, k, v and m (causal, bidirectional, masked)', function()
    pn.manual_seed(4)
    local mask = pn.tensor({ { 1, 1, 0, 1, 1 }, { 0, 1, 1, 1, 0 } }, { dtype = 'u8' })
    for _, case in ipairs({ { causal = true }, { causal = false }, { causal = false, key_mask = mask },
                            { causal = true, key_mask = mask } }) do
      local q, k, v = randn({ 2, 2, 5, 3 }, 'f64', true), randn({ 2, 2, 5, 3 }, 'f64', true), randn({ 2, 2, 5, 2 }, 'f64', true)
      local m = pn.tensor({ 0.5, -0.3 }, { dtype = 'f64', requires_grad = true })
      local ok, report = gradcheck.check(function(a, b, c, d) return pn.cosine_attention(a, b, c, d, case) end, { q, k, v, m })
      assert.is_true(ok, report)
    end
  end)

  it('agrees step by step with the recurrent state (f64 and f32)', function()
    pn.manual_seed(5)
    for _, dt in ipairs({ 'f64', 'f32' }) do
      local tol = dt == 'f64' and 1e-10 or 1e-5
      local Bn, H, N, D, Dv = 2, 3, 9, 4, 3
      local q, k, v = randn({ Bn, H, N, D }, dt), randn({ Bn, H, N, D }, dt), randn({ Bn, H, N, Dv }, dt)
      local m = pn.tensor({ 0.5, 1.5, -2 }, { dtype = dt })
      local par = pn.cosine_attention(q, k, v, m, { causal = true })
      local st = pn.cosine_state { batch = Bn, heads = H, dim = D, dim_v = Dv, m = m, dtype = dt }
      local bytes = st:bytes()
      assert.is_true(bytes >= 8 * Bn * H * D * Dv)
      for t = 1, N do
        local y = st:step(q:select(3, t), k:select(3, t), v:select(3, t))
        assert.same({ Bn, H, Dv }, y:shape())
        assert.are.equal(dt, y:dtype())
        assert_close(y, par:select(3, t), tol, dt .. ' step ' .. t)
        assert.are.equal(bytes, st:bytes())   -- constant in sequence length
      end
      st:reset()
      assert_close(st:step(q:select(3, 1), k:select(3, 1), v:select(3, 1)), par:select(3, 1), tol, 'after reset')
      st:free()
      assert_error_matching(function() st:step(q:select(3, 1), k:select(3, 1), v:select(3, 1)) end, 'state')
    end
  end)

  -- NaN in, NaN out exactly where the maths puts it. One NaN planted in head 1 of q, k, v or the
  -- cotangent g at row j (1-based), column c; cause[x](t, e) says whether element (t, e) of head 1
  -- of x (out and the gradients of q, k, v) depends on it — rows of head 2 never do. Every other
  -- element must be finite and equal the run with the NaN replaced by 0.5. N = 70 spans two chunks
  -- of 64: j = 30 has rows on both sides in its chunk, j = 66 sits in the second.
  it('spreads a NaN only where the maths does (causal chunks, masked keys, bidirectional; values and gradients)', function()
    local B, H, N, D, Dv = 1, 2, 70, 3, 2
    local function with(t, i, x)
      local vals = flat(t)
      vals[i] = x
      return pn.tensor(vals, { dtype = t:dtype() }):reshape(t:shape())
    end
    -- run: out and the gradients (flat), for inputs ins = { q, k, v, g } and options o
    local function run(ins, o, dt)
      local q, k, v = ins.q:clone():requires_grad_(), ins.k:clone():requires_grad_(), ins.v:clone():requires_grad_()
      local m = pn.tensor({ 0.4, -0.2 }, { dtype = dt, requires_grad = true })
      local out = pn.cosine_attention(q, k, v, m, o)
      out:backward(ins.g)
      return { out = flat(out), q = flat(q.grad), k = flat(k.grad), v = flat(v.grad), m = flat(m.grad) }
    end
    local W = { out = Dv, q = D, k = D, v = Dv }
    local ALL = function() return true end
    local NONE = function() return false end
    -- { input, j, c, causal, key masked at j, cause }
    local function cases(j, c)
      local ge, le, eq = function(t) return t >= j end, function(t) return t <= j end, function(t) return t == j end
      local col = function(rows) return function(t, e) return rows(t) and e == c end end
      return {
        { 'v', j, c, true, false, { out = col(ge), q = ge, k = eq, v = NONE } },
        { 'k', j, c, true, false, { out = ge, q = ge, k = eq, v = eq } },
        { 'q', j, c, true, false, { out = eq, q = eq, k = le, v = le } },
        { 'g', j, c, true, false, { out = NONE, q = eq, k = le, v = col(le) } },
        { 'v', j, c, false, false, { out = col(ALL), q = ALL, k = eq, v = NONE } },
        { 'v', j, c, true, true, { out = NONE, q = NONE, k = NONE, v = NONE } },
        { 'k', j, c, true, true, { out = NONE, q = NONE, k = NONE, v = NONE } },
        { 'v', j, c, false, true, { out = NONE, q = NONE, k = NONE, v = NONE } },
      }
    end
    for _, dt in ipairs({ 'f64', 'f32' }) do
      local tol = dt == 'f64' and 1e-10 or 2e-5
      pn.manual_seed(6)
      local base = { q = randn({ B, H, N, D }, dt), k = randn({ B, H, N, D }, dt), v = randn({ B, H, N, Dv }, dt),
                     g = randn({ B, H, N, Dv }, dt) }
      for _, jc in ipairs({ { 30, 2 }, { 66, 1 } }) do
        for _, cs in ipairs(cases(jc[1], jc[2])) do
          local which, j, c, causal, masked, cause = unpack(cs)
          local what = string.format('%s NaN in %s at row %d (causal=%s, masked=%s)', dt, which, j, tostring(causal),
            tostring(masked))
          local o = { causal = causal }
          if masked then
            local mv = {}
            for t = 1, N do mv[t] = t == j and 0 or 1 end
            o.key_mask = pn.tensor({ mv }, { dtype = 'u8' })
          end
          local i = (j - 1) * ((which == 'q' or which == 'k') and D or Dv) + c -- head 1, B = 1
          local bad, ref = {}, {}
          for name, t in pairs(base) do bad[name], ref[name] = t, t end
          bad[which], ref[which] = with(base[which], i, 0 / 0), with(base[which], i, 0.5)
          local got, want = run(bad, o, dt), run(ref, o, dt)
          for x, w in pairs(W) do
            for h = 1, H do
              for t = 1, N do
                for e = 1, w do
                  local idx = ((h - 1) * N + t - 1) * w + e
                  local g, r = got[x][idx], want[x][idx]
                  if h == 1 and cause[x](t, e) then
                    assert.is_true(g ~= g, string.format('%s: %s[%d, %d, %d] = %s, expected NaN', what, x, h, t, e, g))
                  else
                    assert.is_true(g == g and math.abs(g - r) <= tol * (1 + math.abs(r)),
                      string.format('%s: %s[%d, %d, %d] = %s, expected %s', what, x, h, t, e, g, r))
                  end
                end
              end
            end
          end
          local spread = masked == false
          assert.is_true((got.m[1] ~= got.m[1]) == spread, what .. ': g m of head 1')
          assert.is_true(math.abs(got.m[2] - want.m[2]) <= tol * (1 + math.abs(want.m[2])), what .. ': g m of head 2')
          if masked then -- the masked key's gradients are 0
            for e = 1, D do assert.are.equal(0, got.k[(j - 1) * D + e]) end
            for e = 1, Dv do assert.are.equal(0, got.v[(j - 1) * Dv + e]) end
          end
        end
      end
    end
  end)

  it('raises named errors for bad shapes and dtypes', function()
    local q, k, v = randn({ 1, 2, 4, 3 }), randn({ 1, 2, 4, 3 }), randn({ 1, 2, 4, 2 })
    assert_error_matching(function() pn.cosine_attention(q, k, v, pn.zeros({ 3 }, { dtype = 'f64' })) end,
      'cosine_attention', 'm [3]', '[2]')
    assert_error_matching(function() pn.cosine_attention(q, randn({ 1, 2, 4, 5 }), v, 0.5) end,
      'cosine_attention', 'last dim')
    assert_error_matching(function() pn.cosine_attention(q, k, randn({ 1, 2, 5, 2 }), 0.5) end,
      'cosine_attention', '[1,2,5,2]')
    assert_error_matching(function() pn.cosine_attention(q, k:float(), v, 0.5) end, 'cosine_attention', 'dtype')
    assert_error_matching(function() pn.cosine_attention(q, k, v, 0.5, { key_mask = pn.ones({ 1, 4 }) }) end,
      'cosine_attention', 'key_mask', 'u8')
    assert_error_matching(function() pn.cosine_attention(q, k, v, 0.5, { key_mask = pn.ones({ 2, 4 }, { dtype = 'u8' }) }) end,
      'cosine_attention', 'key_mask [2,4]')
    assert_error_matching(function() pn.cosine_attention(q, k, v) end, 'cosine_attention', 'm')
    local st = pn.cosine_state { batch = 1, heads = 2, dim = 3, m = 0.5, dtype = 'f64' }
    assert_error_matching(function() st:step(randn({ 1, 2, 4 }), randn({ 1, 2, 3 }), randn({ 1, 2, 3 })) end,
      'cosine_state.step', 'q [1,2,4]')
    assert_error_matching(function() st:step(randn({ 1, 2, 3 }), randn({ 1, 2, 3 }), randn({ 1, 2, 3 }), randn({ 1, 2 })) end,
      'cosine_state.step', 'log_gate')
    assert_error_matching(function() pn.cosine_state { batch = 1, heads = 2, dim = 3, m = pn.zeros({ 3 }) } end,
      'cosine_state', 'm [3]')
  end)
end)

-- ---- symmetric power embedding -------------------------------------------------------------
describe('sympow_embed', function()
  it('has D\' = C(D+p-1, p) and phi(q).phi(k) = (q.k)^p for p = 2, 4, 6', function()
    pn.manual_seed(6)
    for _, D in ipairs({ 1, 3, 4 }) do
      for _, p in ipairs({ 2, 4, 6 }) do
        local q, k = randn({ 5, D }), randn({ 5, D })
        local pq, pk = pn.sympow_embed(q, p), k:sympow_embed(p)
        assert.same({ 5, binom(D + p - 1, p) }, pq:shape())
        local Q, K, PQ, PK = q:totable(), k:totable(), pq:totable(), pk:totable()
        for i = 1, 5 do
          local want = dot(Q[i], K[i]) ^ p
          assert.is_true(math.abs(dot(PQ[i], PK[i]) - want) <= 1e-10 * (1 + math.abs(want)),
            string.format('D=%d p=%d row %d: %.15g vs %.15g', D, p, i, dot(PQ[i], PK[i]), want))
        end
      end
    end
    -- odd powers embed too (power attention needs even p, the embedding does not)
    local x = randn({ 2, 3 })
    local X = x:totable()
    local px = pn.sympow_embed(x, 3):totable()
    assert.is_true(math.abs(dot(px[1], px[2]) - dot(X[1], X[2]) ^ 3) < 1e-10)
  end)

  it('works in f32 and on non-contiguous inputs, and passes an f64 gradcheck', function()
    pn.manual_seed(7)
    local x = randn({ 3, 2, 4 })
    local xt = x:transpose(1, 2)
    assert_close(pn.sympow_embed(xt, 2), pn.sympow_embed(xt:contiguous(), 2), 1e-14, 'transposed')
    assert_close(pn.sympow_embed(x:float(), 4), pn.sympow_embed(x, 4), 1e-5, 'f32')
    for _, p in ipairs({ 2, 3, 4 }) do
      local ok, report = gradcheck.check(function(a) return pn.sympow_embed(a, p) end, { randn({ 2, 3 }, 'f64', true) })
      assert.is_true(ok, report)
    end
  end)

  it('raises named errors', function()
    assert_error_matching(function() pn.sympow_embed(randn({ 2, 3 }), 0) end, 'sympow_embed', 'p = 0')
    assert_error_matching(function() pn.sympow_embed(pn.ones({ 2, 3 }, { dtype = 'i32' }), 2) end, 'sympow_embed', 'i32')
    assert_error_matching(function() pn.sympow_embed(randn({ 2, 512 }), 32) end, 'sympow_embed', 'exceeds')
  end)
end)

-- ---- power attention ----------------------------------------------------------------------
describe('power_attention', function()
  it('quadratic form matches the naive reference (p = 2, 4; gates; causal or not; scale)', function()
    pn.manual_seed(8)
    local q, k, v = randn({ 2, 2, 6, 3 }), randn({ 2, 2, 6, 3 }), randn({ 2, 2, 6, 2 })
    local lg = log_gates({ 2, 2, 6 })
    local Q, K, V, LG = q:totable(), k:totable(), v:totable(), lg:totable()
    for _, p in ipairs({ 2, 4 }) do
      for _, causal in ipairs({ true, false }) do
        for _, gated in ipairs({ false, true }) do
          local what = string.format('p=%d causal=%s gated=%s', p, tostring(causal), tostring(gated))
          local out = pn.power_attention(q, k, v, { p = p, causal = causal, log_gate = gated and lg or nil, scale = 0.7 })
          assert_close(out, flatten(ref_power(Q, K, V, p, causal, gated and LG or nil, 0.7)), 1e-10, what)
        end
      end
    end
    -- f32 and non-contiguous inputs
    local qt = q:transpose(3, 4):contiguous():transpose(3, 4)
    assert.is_false(qt:is_contiguous())
    assert_close(pn.power_attention(qt:float(), k:float(), v:float(), { log_gate = lg:float() }),
      flatten(ref_power(Q, K, V, 2, true, LG)), 2e-5, 'f32')
    assert_close(pn.power_attention(qt, k, v, { log_gate = lg }), flatten(ref_power(Q, K, V, 2, true, LG)), 1e-10,
      'transposed')
  end)

  it('quadratic form stays finite for huge scores (log space)', function()
    pn.manual_seed(9)
    local q, k, v = randn({ 1, 1, 8, 4 }), randn({ 1, 1, 8, 4 }), randn({ 1, 1, 8, 2 })
    local out = pn.power_attention(q, k, v, { p = 8, scale = 1e40 })   -- scores ~ 1e320: beyond f64
    local vmin, vmax = math.huge, -math.huge
    for _, x in ipairs(flat(v)) do vmin, vmax = math.min(vmin, x), math.max(vmax, x) end
    for _, x in ipairs(flat(out)) do
      assert.is_true(x == x and x >= vmin - 1e-12 and x <= vmax + 1e-12, 'output ' .. x .. ' not a convex combination')
    end
    -- same as scale = 1: the normalisation cancels the scale
    assert_close(out, pn.power_attention(q, k, v, { p = 8 }), 1e-9, 'scale-invariant')
  end)

  it('chunked form agrees with the quadratic one for every chunk size (f32 1e-4, f64 1e-10)', function()
    pn.manual_seed(10)
    local N = 16
    for _, dt in ipairs({ 'f64', 'f32' }) do
      local tol = dt == 'f64' and 1e-10 or 1e-4
      local q, k, v = randn({ 1, 2, N, 3 }, dt), randn({ 1, 2, N, 3 }, dt), randn({ 1, 2, N, 2 }, dt)
      local lg = log_gates({ 1, 2, N }, dt)
      for _, p in ipairs({ 2, 4 }) do
        for _, gate in ipairs({ false, true }) do
          local o = { p = p, log_gate = gate and lg or nil, scale = 0.8 }
          local quad = pn.power_attention(q, k, v, o)
          for _, c in ipairs({ 1, 2, 4, 8, 16 }) do
            o.chunk = c
            assert_close(pn.power_attention(q, k, v, o), quad, tol,
              string.format('%s p=%d gate=%s chunk=%d', dt, p, tostring(gate), c))
          end
          o.chunk = nil
        end
      end
    end
  end)

  it('agrees step by step with the recurrent state, with and without gates', function()
    pn.manual_seed(11)
    for _, dt in ipairs({ 'f64', 'f32' }) do
      local tol = dt == 'f64' and 1e-10 or 2e-5
      local Bn, H, N, D, Dv = 2, 2, 8, 3, 2
      local q, k, v = randn({ Bn, H, N, D }, dt), randn({ Bn, H, N, D }, dt), randn({ Bn, H, N, Dv }, dt)
      local lg = log_gates({ Bn, H, N }, dt)
      for _, p in ipairs({ 2, 4 }) do
        for _, gate in ipairs({ false, true }) do
          local par = pn.power_attention(q, k, v, { p = p, log_gate = gate and lg or nil, scale = 0.9 })
          local st = pn.power_state { batch = Bn, heads = H, dim = D, dim_v = Dv, p = p, scale = 0.9, dtype = dt }
          local bytes = st:bytes()
          assert.is_true(bytes >= 8 * Bn * H * binom(D + p - 1, p) * (Dv + 1))
          for t = 1, N do
            local y = st:step(q:select(3, t), k:select(3, t), v:select(3, t), gate and lg:select(3, t) or nil)
            assert_close(y, par:select(3, t), tol, string.format('%s p=%d gate=%s step %d', dt, p, tostring(gate), t))
            assert.are.equal(bytes, st:bytes())
          end
        end
      end
    end
  end)

  it('passes f64 gradchecks for q, k, v and log_gate (quadratic, causal or not; chunked)', function()
    pn.manual_seed(12)
    local cases = {
      { p = 2, causal = true }, { p = 4, causal = true }, { p = 2, causal = false }, { p = 4, causal = false },
      { p = 2, chunk = 2 }, { p = 4, chunk = 3 }, { p = 2, chunk = 1 }, { p = 2, chunk = 6 },
    }
    for _, case in ipairs(cases) do
      local q, k, v = randn({ 1, 2, 6, 3 }, 'f64', true), randn({ 1, 2, 6, 3 }, 'f64', true), randn({ 1, 2, 6, 2 }, 'f64', true)
      local lg = log_gates({ 1, 2, 6 }, 'f64', true)
      local ok, report = gradcheck.check(function(a, b, c, g)
        return pn.power_attention(a, b, c, { p = case.p, causal = case.causal, chunk = case.chunk, log_gate = g, scale = 0.6 })
      end, { q, k, v, lg })
      assert.is_true(ok, string.format('p=%d causal=%s chunk=%s\n%s', case.p, tostring(case.causal), tostring(case.chunk), report))
    end
  end)

  it('returns 0 for a row without weight (q = 0) in every form', function()
    local q = pn.zeros({ 1, 1, 4, 2 }, { dtype = 'f64' })
    local k, v = randn({ 1, 1, 4, 2 }), randn({ 1, 1, 4, 2 })
    for _, c in ipairs({ 0, 2 }) do
      for _, x in ipairs(flat(pn.power_attention(q, k, v, { chunk = c }))) do assert.are.equal(0, x) end
    end
  end)

  it('raises named errors: odd p, chunk not dividing N, gate shapes, dtypes', function()
    local q, k, v = randn({ 1, 2, 6, 3 }), randn({ 1, 2, 6, 3 }), randn({ 1, 2, 6, 2 })
    assert_error_matching(function() pn.power_attention(q, k, v, { p = 3 }) end, 'power_attention', 'p = 3', 'even')
    assert_error_matching(function() pn.power_attention(q, k, v, { p = 0 }) end, 'power_attention', 'p = 0')
    assert_error_matching(function() pn.power_attention(q, k, v, { chunk = 4 }) end,
      'power_attention', 'chunk = 4', 'N = 6')
    assert_error_matching(function() pn.power_attention(q, k, v, { chunk = 2, causal = false }) end,
      'power_attention', 'causal')
    assert_error_matching(function() pn.power_attention(q, k, v, { log_gate = randn({ 1, 2, 5 }) }) end,
      'power_attention', 'log_gate [1,2,5]', '[1,2,6]')
    assert_error_matching(function() pn.power_attention(q, k, v, { log_gate = randn({ 1, 2, 6 }, 'f32') }) end,
      'power_attention', 'log_gate', 'dtype')
    assert_error_matching(function() pn.power_attention(q, k, v:float()) end, 'power_attention', 'dtype')
    assert_error_matching(function() pn.power_attention(q, k, randn({ 1, 2, 6 })) end, 'power_attention')
    assert_error_matching(function() pn.power_state { batch = 1, heads = 1, dim = 2, p = 5 } end, 'power_state', 'p = 5')
    local st = pn.power_state { batch = 1, heads = 2, dim = 3, dim_v = 2, dtype = 'f64' }
    assert_error_matching(function() st:step(randn({ 1, 2, 3 }), randn({ 1, 2, 3 }), randn({ 1, 2, 2 }), randn({ 2, 1 })) end,
      'power_state.step', 'log_gate [2,1]', '[1,2]')
    assert_error_matching(function() st:step(randn({ 1, 2, 3 }, 'f32'), randn({ 1, 2, 3 }), randn({ 1, 2, 2 })) end,
      'power_state.step', 'dtype')
  end)
end)

-- ---- rope ----------------------------------------------------------------------------------
describe('rope', function()
  it('matches the naive reference: default theta, given theta, a rate, a broadcast rate', function()
    pn.manual_seed(13)
    for _, dt in ipairs({ 'f64', 'f32' }) do
      local tol = dt == 'f64' and 1e-12 or 1e-5
      local x = randn({ 2, 2, 5, 4 }, dt)
      local X = x:totable()
      assert_close(pn.rope(x), flatten(ref_rope(X, 10000)), tol, dt .. ' default')
      assert_close(pn.rope(x, { base = 100 }), flatten(ref_rope(X, 100)), tol, dt .. ' base')
      local theta = pn.tensor({ 0.3, -1.1 }, { dtype = dt })
      assert_close(pn.rope(x, { theta = theta }), flatten(ref_rope(X, nil, { 0.3, -1.1 })), tol, dt .. ' theta')
      local rate = (pn.rand({ 2, 2, 5 }, { dtype = dt }) * 2):detach()
      local R = rate:totable()
      assert_close(pn.rope(x, { rate = rate }),
        flatten(ref_rope(X, 10000, nil, function(path, t) return R[path[1]][path[2]][t] end)), tol, dt .. ' rate')
      local r1 = pn.tensor({ 0.5, 1.5, 1, 0.2, 2 }, { dtype = dt })   -- (N): the same for every (b, h)
      local R1 = r1:totable()
      assert_close(pn.rope(x, { rate = r1, theta = theta }),
        flatten(ref_rope(X, nil, { 0.3, -1.1 }, function(_, t) return R1[t] end)), tol, dt .. ' broadcast rate')
      -- without a rate μ_t = t (0-based); a rate of ones gives the running sum μ_t = t + 1
      assert_close(pn.rope(x, { rate = pn.ones({ 5 }, { dtype = dt }) }),
        flatten(ref_rope(X, 10000, nil, function() return 1 end)), tol, dt .. ' ones')
      assert.is_true(math.abs(flat(pn.rope(x, { rate = pn.ones({ 5 }, { dtype = dt }) }))[1] - flat(x)[1]) > 1e-3)
    end
    -- (N, D) and non-contiguous
    local x2 = randn({ 4, 6 }):transpose(1, 2):contiguous():transpose(1, 2)
    assert.is_false(x2:is_contiguous())
    assert_close(pn.rope(x2), flatten(ref_rope(x2:totable(), 10000)), 1e-12, '2-D transposed')
  end)

  it('makes q.k depend on the position difference only', function()
    pn.manual_seed(14)
    local q1, k1 = randn({ 1, 4 }), randn({ 1, 4 })
    local q = q1:expand(6, 4):contiguous()
    local k = k1:expand(6, 4):contiguous()
    local rq, rk = pn.rope(q, { base = 10 }):totable(), pn.rope(k, { base = 10 }):totable()
    assert.is_true(math.abs(dot(rq[3], rk[1]) - dot(rq[6], rk[4])) < 1e-12)
    assert.is_true(math.abs(dot(rq[5], rk[5]) - dot(q1:totable()[1], k1:totable()[1])) < 1e-12)
  end)

  it('passes f64 gradchecks for x, theta and the rate (full and broadcast)', function()
    pn.manual_seed(15)
    local x = randn({ 2, 2, 4, 4 }, 'f64', true)
    local theta = pn.tensor({ 0.7, 0.2 }, { dtype = 'f64', requires_grad = true })
    local rate = (pn.rand({ 2, 2, 4 }, { dtype = 'f64' }) + 0.5):detach():requires_grad_()
    local ok, report = gradcheck.check(function(a, t, r) return pn.rope(a, { theta = t, rate = r }) end, { x, theta, rate })
    assert.is_true(ok, report)
    local r2 = (pn.rand({ 2, 1, 4 }, { dtype = 'f64' }) + 0.5):detach():requires_grad_()
    ok, report = gradcheck.check(function(a, r) return pn.rope(a, { rate = r, base = 3 }) end, { x, r2 })
    assert.is_true(ok, report)
    ok, report = gradcheck.check(function(a) return pn.rope(a) end, { x })
    assert.is_true(ok, report)
  end)

  it('raises named errors: odd D, theta and rate shapes, dtypes', function()
    assert_error_matching(function() pn.rope(randn({ 1, 1, 4, 3 })) end, 'rope', 'D = 3', 'even')
    assert_error_matching(function() pn.rope(randn({ 1, 1, 4, 4 }), { theta = randn({ 3 }) }) end, 'rope', 'theta [3]', '[2]')
    assert_error_matching(function() pn.rope(randn({ 1, 2, 4, 4 }), { rate = randn({ 3, 4 }) }) end,
      'rope', 'rate [3,4]', '[1,2,4]')
    assert_error_matching(function() pn.rope(randn({ 1, 1, 4, 4 }), { rate = randn({ 4 }, 'f32') }) end, 'rope', 'dtype')
    assert_error_matching(function() pn.rope(randn({ 4 })) end, 'rope', 'at least 2 dims')
  end)
end)

-- ---- threads ------------------------------------------------------------------------------
describe('linear attention threads', function()
  it('gives bitwise-identical values and gradients on 1 and 2 threads (sizes above the parallel cutoff)', function()
    local function run()
      pn.manual_seed(17)
      local q, k, v = randn({ 2, 4, 256, 8 }, 'f32', true), randn({ 2, 4, 256, 8 }, 'f32', true), randn({ 2, 4, 256, 8 }, 'f32', true)
      local m = pn.tensor({ 0.1, 0.2, 0.3, 0.4 }, { requires_grad = true })
      local qs, ks, vs = randn({ 2, 4, 64, 4 }, 'f32', true), randn({ 2, 4, 64, 4 }, 'f32', true), randn({ 2, 4, 64, 4 }, 'f32', true)
      local lg = log_gates({ 2, 4, 64 }, 'f32', true)
      local xr, rate = randn({ 4, 4, 256, 16 }, 'f32', true), pn.rand({ 4, 4, 256 }):detach():requires_grad_()
      local outs = {
        pn.cosine_attention(q, k, v, m), pn.cosine_attention(q, k, v, m, { causal = false }),
        pn.power_attention(qs, ks, vs, { log_gate = lg }), pn.power_attention(qs, ks, vs, { log_gate = lg, chunk = 8 }),
        pn.rope(xr, { rate = rate }),
      }
      local loss = outs[1]:sum()
      for i = 2, #outs do loss = loss + outs[i]:sum() end
      loss:backward()
      local r = {}
      for _, t in ipairs(outs) do r[#r + 1] = flat(t) end
      for _, t in ipairs({ q, k, v, m, qs, ks, vs, lg, xr, rate }) do r[#r + 1] = flat(t.grad) end
      return r
    end
    local prev = pn.num_threads()
    pn.set_num_threads(1)
    local a = run()
    pn.set_num_threads(2)
    local b = run()
    pn.set_num_threads(prev)
    for i = 1, #a do assert.are.same(a[i], b[i]) end
  end)
end)

-- ---- ownership --------------------------------------------------------------------------------
describe('linear attention ownership', function()
  it('releases every tensor, autograd node and state byte once Lua drops them', function()
    local function settle() collectgarbage('collect'); collectgarbage('collect') end
    settle()
    local t0, n0, b0 = pn.live_tensors(), pn.live_nodes(), pn.live_bytes()
    do
      pn.manual_seed(16)
      local q, k, v = randn({ 1, 2, 4, 2 }, 'f64', true), randn({ 1, 2, 4, 2 }, 'f64', true), randn({ 1, 2, 4, 2 }, 'f64', true)
      local m = pn.tensor({ 0.5, 0.5 }, { dtype = 'f64', requires_grad = true })
      local lg = log_gates({ 1, 2, 4 }, 'f64', true)
      local rate = pn.ones({ 4 }, { dtype = 'f64' }):requires_grad_()
      local qr = pn.rope(q, { rate = rate })
      local loss = pn.cosine_attention(qr, k, v, m):sum() + pn.power_attention(qr, k, v, { log_gate = lg }):sum()
        + pn.power_attention(q, k, v, { chunk = 2, log_gate = lg }):sum() + pn.sympow_embed(k, 2):sum()
      loss:backward()
      assert.is_not_nil(rate.grad)
      local st = pn.power_state { batch = 1, heads = 2, dim = 2, dtype = 'f64' }
      st:step(q:select(3, 1):detach(), k:select(3, 1):detach(), v:select(3, 1):detach())
      assert.is_true(pn.live_bytes() > b0)
      local cs = pn.cosine_state { batch = 1, heads = 2, dim = 2, m = 0.5, dtype = 'f64' }
      cs:free()
      cs:free()   -- idempotent
    end
    settle()
    assert.is_true(pn.live_tensors() <= t0, "live counter grew: " .. pn.live_tensors() .. " > " .. t0) -- <=: tensors left by earlier spec files may be freed meanwhile
    assert.is_true(pn.live_nodes() <= n0, "live counter grew: " .. pn.live_nodes() .. " > " .. n0) -- <=: tensors left by earlier spec files may be freed meanwhile
    assert.is_true(pn.live_bytes() <= b0, "live counter grew: " .. pn.live_bytes() .. " > " .. b0) -- <=: tensors left by earlier spec files may be freed meanwhile
  end)
end)
