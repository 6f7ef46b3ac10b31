-- Graph attention (core/attention/graph.c): the same score epilogues over CSR neighbourhoods.
-- Dense attention equals graph attention on the complete graph (and masks equal missing
-- edges) for every registered dense score; gat against a naive reference in plain Lua;
-- f64 gradchecks; dropout statistics; errors. CSRs are built by hand here (csr_of) so the
-- spec does not depend on pn.graph, which gets one check of its own.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local check = require 'spec.helpers.check'
local flatten, vals = check.flatten, check.vals

local inf = math.huge


local assert_close, assert_error, rng = check.assert_close, check.assert_error_matching, check.rng

-- CSR by destination from allowed(i, j) (node i attends to node j), nodes 1-based here,
-- stored 0-based: returns {offsets=, src=, num_nodes=}
local function csr_of(N, allowed)
  local off, src = { 0 }, {}
  for i = 1, N do
    for j = 1, N do if allowed(i, j) then src[#src + 1] = j - 1 end end
    off[#off + 1] = #src
  end
  return { offsets = pn.tensor(off, { dtype = 'i64' }),
           src = #src > 0 and pn.tensor(src, { dtype = 'i64' }) or pn.zeros({ 0 }, { dtype = 'i64' }), num_nodes = N }
end

-- node-major points (N, H, D) on a score's manifold
local function gen_point(kind, r, D)
  local x = {}
  if kind == 'height' then
    for c = 1, D - 1 do x[c] = r:n() * 0.6 end
    x[D] = 0.15 + 1.4 * r:u()
  elseif kind == 'hyperboloid' then
    local n2 = 0
    for c = 1, D - 1 do x[c] = r:n() * 0.6; n2 = n2 + x[c] ^ 2 end
    x[D] = math.sqrt(1 + n2)
  elseif kind == 'ball' then
    local n2 = 0
    for c = 1, D do x[c] = r:n(); n2 = n2 + x[c] ^ 2 end
    local s = 0.8 * r:u() / math.sqrt(n2 + 1e-12)
    for c = 1, D do x[c] = x[c] * s end
  elseif kind == 'safe' then
    for c = 1, D do x[c] = 0.05 + 0.4 * r:u() / math.sqrt(D / 4) end
  else
    for c = 1, D do x[c] = r:n() * 0.7 end
  end
  return x
end
local function nodes(N, H, D, kind, seed, dtype)
  local r = rng(seed)
  local t = {}
  for i = 1, N do
    t[i] = {}
    for h = 1, H do t[i][h] = gen_point(kind, r, D) end
  end
  return pn.tensor(t, { dtype = dtype or 'f64' })
end
local function values(N, H, Dv, seed, dtype)
  local r = rng(seed)
  local t = {}
  for i = 1, N do
    t[i] = {}
    for h = 1, H do
      t[i][h] = {}
      for c = 1, Dv do t[i][h][c] = (r:u() - 0.5) * 0.7 end
    end
  end
  return pn.tensor(t, { dtype = dtype or 'f64' })
end

local CASES = {
  dot = { { 'free', { scale = 0.8 } } },
  laplacian = { { 'free', { gamma = 0.9 } } },
  umbral = { { 'height', { r = 0.3, gamma = 1.2 } } },
  penumbral = { { 'height', { r = 1 } }, { 'height', { r = 1.1, squared = true } } },
  hyperbolic = { { 'hyperboloid', { model = 'hyperboloid', beta = 1.1 } }, { 'height', { model = 'halfspace', c = 0.3 } },
                 { 'ball', { model = 'poincare', curvature = 0.9 } } },
}
-- every score, the spec-only ones included, with its description (params, defaults) from the registry
local VARIANTS = pn.attention_variants({ all = true })
-- a score without an entry runs on safe inputs with each parameter 1.1× its default
local function cases_of(name)
  if CASES[name] then return CASES[name] end
  local opts = {}
  for _, pd in ipairs(VARIANTS[name].params) do if pd.default then opts[pd.name] = pd.default * 1.1 end end
  return { { 'safe', opts } }
end

local function merge(a, b)
  local r = {}
  for k, v in pairs(a) do r[k] = v end
  for k, v in pairs(b or {}) do r[k] = v end
  return r
end

local DENSE = {}
for _, name in ipairs(VARIANTS) do
  if not VARIANTS[name].graph_only then DENSE[#DENSE + 1] = name end
end
local NORMS = { 'softmax', 'sigmoid', 'sigmoid_normalized' }

-- the score's numeric parameters in opts become learnable (one value per head, H = 2), appended
-- to inputs for the gradcheck; returns inputs
local function learnable(name, opts, inputs)
  for _, pd in ipairs(VARIANTS[name].params) do
    local p = pd.name
    if type(opts[p]) == 'number' then
      opts[p] = pn.tensor({ opts[p], opts[p] * 1.1 }, { dtype = 'f64' }):requires_grad_()
      inputs[#inputs + 1] = opts[p]
    end
  end
  return inputs
end

-- dense attention on node-major tensors: (N, H, D) → (1, H, N, D) and back
local function dense_nm(q, k, v, opts)
  local function hm(x) return x:transpose(1, 2):unsqueeze(1) end
  return pn.attention(hm(q), hm(k), hm(v), opts):squeeze(1):transpose(1, 2)
end

describe('graph attention equals dense attention', function()
  for _, name in ipairs(DENSE) do
    for ci, case in ipairs(cases_of(name)) do
      it(name .. ' ' .. ci .. ': complete graph, random mask and causal as missing edges, every normalize and aggregate', function()
        local N, H, D, Dv = 6, 2, 3, 2
        local q, k, v = nodes(N, H, D, case[1], 1, 'f64'), nodes(N, H, D, case[1], 2, 'f64'), values(N, H, Dv, 3, 'f64')
        local r = rng(ci + 7)
        local m = {}
        for i = 1, N do
          m[i] = {}
          for j = 1, N do m[i][j] = (j == i or r:u() > 0.4) and 1 or 0 end
        end
        local structures = {
          { 'complete', function() return true end, {} },
          { 'mask', function(i, j) return m[i][j] == 1 end, { mask = pn.tensor(m, { dtype = 'u8' }) } },
          { 'causal', function(i, j) return j <= i end, { causal = true } },
        }
        for _, sdef in ipairs(structures) do
          local g = csr_of(N, sdef[2])
          for _, norm in ipairs(NORMS) do
            for _, agg in ipairs({ 'sum', 'einstein' }) do
              for _, dtype in ipairs({ 'f64', 'f32' }) do
                local qq, kk, vv = q:to(dtype), k:to(dtype), v:to(dtype)
                local opts = merge(case[2], { score = name, normalize = norm, aggregate = agg })
                local got = vals(pn.graph_attention(qq, kk, vv, g, opts))
                local ref = vals(dense_nm(qq, kk, vv, merge(opts, sdef[3])))
                assert_close(got, ref, dtype == 'f64' and 1e-12 or 2e-6,
                  string.format('%s %s %s %s %s', name, sdef[1], norm, agg, dtype))
              end
            end
          end
        end
      end)
    end
  end

  it('(N, D) inputs and gradients match the dense (N, D) form', function()
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      local q3, k3, v3 = nodes(5, 1, 3, case[1], 4), nodes(5, 1, 3, case[1], 5), values(5, 1, 2, 6)
      local g = csr_of(5, function(i, j) return (i + j) % 3 ~= 0 end)
      local m = {}
      for i = 1, 5 do m[i] = {} for j = 1, 5 do m[i][j] = (i + j) % 3 ~= 0 and 1 or 0 end end
      local res = {}
      for w = 1, 2 do
        local q, k, v = q3:squeeze(2):clone():requires_grad_(), k3:squeeze(2):clone():requires_grad_(),
          v3:squeeze(2):clone():requires_grad_()
        local opts = merge(case[2], { score = name })
        local out = w == 1 and pn.graph_attention(q, k, v, g, opts)
          or pn.attention(q, k, v, merge(opts, { mask = pn.tensor(m, { dtype = 'u8' }) }))
        out:sum():backward()
        res[w] = { vals(out), vals(q.grad), vals(k.grad), vals(v.grad) }
      end
      for j = 1, 4 do assert_close(res[1][j], res[2][j], 1e-12, name .. ' (N, D) part ' .. j) end
    end
  end)

  it('pn.graph builds a CSR the driver accepts (self loops added)', function()
    local q, k, v = nodes(4, 2, 3, 'free', 8), nodes(4, 2, 3, 'free', 9), values(4, 2, 2, 10)
    local g = pn.graph({ { 0, 1 }, { 2, 1 }, { 3, 0 } }, 4)
    local allowed = { [1] = { [1] = true, [4] = true }, [2] = { [1] = true, [2] = true, [3] = true }, [3] = { [3] = true },
                      [4] = { [4] = true } }
    local ref = pn.graph_attention(q, k, v, csr_of(4, function(i, j) return allowed[i][j] == true end), {})
    assert_close(vals(pn.graph_attention(q, k, v, g, {})), vals(ref), 1e-14, 'pn.graph')
  end)
end)

describe('graph attention gat', function()
  local function naive_gat(q, k, v, al, ar, allowed, slope, norm)
    local Q, K, V, AL, AR = q:totable(), k:totable(), v:totable(), al:totable(), ar:totable()
    local N, H, Dv = #Q, #Q[1], #V[1][1]
    local out = {}
    for i = 1, N do
      for h = 1, H do
        local s, js = {}, {}
        for j = 1, N do
          if allowed(i, j) then
            local e = 0
            for c = 1, #Q[i][h] do e = e + AL[h][c] * Q[i][h][c] + AR[h][c] * K[j][h][c] end
            s[#s + 1] = e > 0 and e or slope * e
            js[#js + 1] = j
          end
        end
        local w, z = {}, 0
        local m = -inf
        for _, x in ipairs(s) do if x > m then m = x end end
        for e, x in ipairs(s) do
          w[e] = norm == 'softmax' and math.exp(x - m) or 1 / (1 + math.exp(-x))
          z = z + w[e]
        end
        if norm ~= 'sigmoid' then for e = 1, #w do w[e] = w[e] / z end end
        for c = 1, Dv do
          local acc = 0
          for e, j in ipairs(js) do acc = acc + w[e] * V[j][h][c] end
          out[#out + 1] = acc
        end
      end
    end
    return out
  end

  it('matches the naive GAT (LeakyReLU(a_l·q_i + a_r·k_j), segment softmax / sigmoid)', function()
    local N, H, D = 7, 3, 4
    local allowed = function(i, j) return i == j or (i * 3 + j) % 4 == 1 end
    local g = csr_of(N, allowed)
    for _, dtype in ipairs({ 'f64', 'f32' }) do
      local q, k, v = nodes(N, H, D, 'free', 11, dtype), nodes(N, H, D, 'free', 12, dtype), values(N, H, 2, 13, dtype)
      local al, ar = nodes(H, 1, D, 'free', 14, dtype):squeeze(2), nodes(H, 1, D, 'free', 15, dtype):squeeze(2)
      for _, norm in ipairs(NORMS) do
        for _, slope in ipairs({ 0.2, 0.05 }) do
          local opts = { score = 'gat', a_l = al, a_r = ar, normalize = norm }
          if slope ~= 0.2 then opts.slope = slope end
          assert_close(vals(pn.graph_attention(q, k, v, g, opts)), naive_gat(q, k, v, al, ar, allowed, slope, norm),
            dtype == 'f64' and 1e-12 or 1e-5, 'gat ' .. norm .. ' ' .. dtype)
        end
      end
    end
  end)

  it('gradchecks q, k, v, a_l, a_r and a learnable per-head slope', function()
    local N, H, D = 5, 2, 3
    local g = csr_of(N, function(i, j) return i == j or (i + 2 * j) % 3 == 0 end)
    local q, k, v = nodes(N, H, D, 'free', 21), nodes(N, H, D, 'free', 22), values(N, H, 2, 23)
    local al, ar = nodes(H, 1, D, 'free', 24):squeeze(2):clone(), nodes(H, 1, D, 'free', 25):squeeze(2):clone()
    local slope = pn.tensor({ 0.2, 0.35 }, { dtype = 'f64' })
    for _, x in ipairs({ q, k, v, al, ar, slope }) do x:requires_grad_() end
    for _, norm in ipairs(NORMS) do
      gradcheck(function() return pn.graph_attention(q, k, v, g, { score = 'gat', a_l = al, a_r = ar, normalize = norm }) end,
        { q, k, v, al, ar })
      gradcheck(function()
        return pn.graph_attention(q, k, v, g, { score = 'gat', a_l = al, a_r = ar, normalize = norm, slope = slope })
      end, { q, k, v, al, ar, slope })
    end
  end)
end)

describe('graph attention gradients', function()
  for _, name in ipairs(DENSE) do
    for ci, case in ipairs(cases_of(name)) do
      it(name .. ' ' .. ci .. ': q, k, v and learnable scalars, every normalize (one node without neighbours)', function()
        local N, H, D = 5, 2, 3
        -- node 3 has no incoming edge; node 1 has duplicates
        local g = { offsets = pn.tensor({ 0, 3, 5, 5, 7, 9 }, { dtype = 'i64' }),
                    src = pn.tensor({ 0, 1, 1, 2, 4, 0, 3, 4, 2 }, { dtype = 'i64' }) }
        for ni, norm in ipairs(NORMS) do
          local q, k, v = nodes(N, H, D, case[1], 40 + ni), nodes(N, H, D, case[1], 32), values(N, H, 2, 33)
          q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
          local opts = merge(case[2], { score = name, normalize = norm, aggregate = ni == 2 and 'einstein' or nil })
          local inputs = learnable(name, opts, { q, k, v })
          gradcheck(function() return pn.graph_attention(q, k, v, g, opts) end, inputs)
          local out = pn.graph_attention(q, k, v, g, opts)
          assert.same({ 0, 0 }, out:totable()[3][1])
        end
      end)
    end
  end
end)

describe('graph attention dropout', function()
  it('drops a fraction p of the weights, scales the rest by 1/(1−p), and is off when not training', function()
    local N, H, p = 150, 2, 0.3
    local g = csr_of(N, function(i, j) return (i * 7 + j * 3) % 5 < 2 end) -- ~40% of all pairs
    local E = g.src:numel()
    local q = pn.zeros({ N, H, 2 }, { dtype = 'f64' }) -- equal scores: weight 1/deg on every edge
    local k = nodes(N, H, 2, 'free', 41)
    local v = pn.ones({ N, H, 1 }, { dtype = 'f64' })
    pn.manual_seed(7)
    local out = vals(pn.graph_attention(q, k, v, g, { dropout = p, train = true }))
    -- out_i = (kept edges of i / deg_i) / (1 − p): recover the kept count exactly
    local off = vals(g.offsets)
    local kept, total = 0, 0
    for i = 1, N do
      local deg = off[i + 1] - off[i]
      for h = 1, H do
        local ki = out[(i - 1) * H + h] * (1 - p) * deg
        assert.is_true(math.abs(ki - math.floor(ki + 0.5)) < 1e-9, 'kept count is an integer')
        kept, total = kept + math.floor(ki + 0.5), total + deg
      end
    end
    local frac = 1 - kept / total
    local sd = math.sqrt(p * (1 - p) / total)
    assert.is_true(math.abs(frac - p) < 4 * sd, string.format('dropped %.4f of %d weights, expected %.2f', frac, total, p))
    assert.equal(E * H, total)
    -- not training: no dropout; same seed: same mask
    assert_close(vals(pn.graph_attention(q, k, v, g, { dropout = p, train = false })), (function()
      local r = {} for i = 1, N * H do r[i] = 1 end return r end)(), 1e-12, 'eval')
    pn.manual_seed(7)
    assert_close(vals(pn.graph_attention(q, k, v, g, { dropout = p, train = true })), out, 0, 'same seed')
  end)

  it('gradients flow through the kept weights (gradcheck with a fixed mask)', function()
    local N, H, D = 5, 2, 3
    local g = csr_of(N, function(i, j) return i == j or (i + j) % 2 == 0 end)
    local q, k, v = nodes(N, H, D, 'height', 51), nodes(N, H, D, 'height', 52), values(N, H, 2, 53)
    q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
    for _, norm in ipairs(NORMS) do
      gradcheck(function()
        pn.manual_seed(3)
        return pn.graph_attention(q, k, v, g, { score = 'penumbral', normalize = norm, dropout = 0.4, train = true })
      end, { q, k, v })
    end
  end)
end)

describe('graph attention errors', function()
  local q, k, v = nodes(4, 2, 3, 'free', 61), nodes(4, 2, 3, 'free', 62), values(4, 2, 2, 63)
  local g = csr_of(4, function() return true end)

  it('mismatched graph sizes name the op and the shapes', function()
    local g5 = csr_of(5, function() return true end)
    assert_error(function() pn.graph_attention(q, k, v, g5, {}) end, 'graph_attention', 'offsets', '[6]', '[4,2,3]')
    assert_error(function() pn.graph_attention(q, k, v, { offsets = g.offsets, src = pn.tensor({ 0, 1, 2 }, { dtype = 'i64' }) }, {}) end,
      'graph_attention', 'offsets', 'edges')
    assert_error(function()
      pn.graph_attention(q, k, v, { offsets = pn.tensor({ 0, 1, 2, 3, 4 }, { dtype = 'i64' }), src = pn.tensor({ 0, 1, 9, 2 }, { dtype = 'i64' }) }, {})
    end, 'graph_attention', 'src', '9')
    assert_error(function() pn.graph_attention(q, nodes(5, 2, 3, 'free', 1), v, g, {}) end, 'graph_attention', 'nodes')
    assert_error(function() pn.graph_attention(q, k, values(4, 3, 2, 1), g, {}) end, 'graph_attention', 'heads')
    assert_error(function() pn.graph_attention(q, k, v, { offsets = g.offsets:to('f32'), src = g.src }, {}) end, 'graph_attention', 'i32/i64')
    assert_error(function() pn.graph_attention(q, k, v, {}, {}) end, 'graph_attention', 'graph')
  end)

  it('options that belong to dense attention, gat without projections, bad dropout', function()
    assert_error(function() pn.graph_attention(q, k, v, g, { causal = true }) end, 'graph_attention', 'causal', 'edges')
    assert_error(function() pn.graph_attention(q, k, v, g, { score = 'gat' }) end, 'graph_attention', 'a_l')
    assert_error(function() pn.graph_attention(q, k, v, g, { score = 'gat', a_l = pn.ones({ 2, 4 }, { dtype = 'f64' }), a_r = pn.ones({ 2, 3 }, { dtype = 'f64' }) }) end,
      'graph_attention', 'a_l', '[2,4]')
    assert_error(function() pn.graph_attention(q, k, v, g, { dropout = 1.5, train = true }) end, 'graph_attention', 'dropout')
    assert_error(function() pn.graph_attention(q, k, v, g, { score = 'umbral' }) end, 'graph_attention', 'last coordinate')
    assert_error(function() pn.graph_attention(q, k, v, g, { score = 'nope' }) end, 'graph_attention', 'nope', 'gat')
  end)
end)

describe('graph attention weights per edge', function()
  -- two independent routes to the same weights: dense attention_weights under the graph as a
  -- mask (softmax / sigmoid scores without einstein), and graph_attention with one-hot values
  -- (out[i, h, j] is the weight i gives j: edges are unique in csr_of)
  local N, H, D = 6, 2, 3
  local function allowed(i, j) return i == j or (2 * i + j) % 3 ~= 0 end
  local g = csr_of(N, allowed)
  local eye = {}
  for i = 1, N do eye[i] = {} for h = 1, H do eye[i][h] = {} for j = 1, N do eye[i][h][j] = i == j and 1 or 0 end end end
  local function per_edge(dense_at) -- dense_at(h, i, j) → the E×H list in CSR order
    local out = {}
    for i = 1, N do for j = 1, N do if allowed(i, j) then for h = 1, H do out[#out + 1] = dense_at(h, i, j) end end end end
    return out
  end
  local m = {}
  for i = 1, N do m[i] = {} for j = 1, N do m[i][j] = allowed(i, j) and 1 or 0 end end
  local mask = pn.tensor(m, { dtype = 'u8' })

  for _, name in ipairs(VARIANTS) do
    it(name .. ': every normalize and aggregate, f64 and f32, (E, H) and (E)', function()
      local case = cases_of(name)[1]
      for _, dtype in ipairs({ 'f64', 'f32' }) do
        local q, k = nodes(N, H, D, case[1], 31, dtype), nodes(N, H, D, case[1], 32, dtype)
        local opts0 = merge(case[2], { score = name })
        if name == 'gat' then
          opts0.a_l = nodes(H, 1, D, 'free', 33, dtype):squeeze(2)
          opts0.a_r = nodes(H, 1, D, 'free', 34, dtype):squeeze(2)
        end
        for _, norm in ipairs(NORMS) do
          for _, agg in ipairs(name == 'gat' and { 'sum' } or { 'sum', 'einstein' }) do
            local opts = merge(opts0, { normalize = norm, aggregate = agg })
            local what = string.format('%s %s %s %s', name, norm, agg, dtype)
            local w = pn.graph_attention_weights(q, k, g, opts)
            assert.same({ g.src:shape()[1], H }, w:shape())
            assert.equal(dtype, w:dtype())
            local tol = dtype == 'f64' and 1e-12 or 2e-6
            -- einstein's Lorentz factors belong to the values: the weights are the α of sum
            local oh = pn.graph_attention(q, k, pn.tensor(eye, { dtype = dtype }), g, merge(opts, { aggregate = 'sum' })):totable()
            assert_close(vals(w), per_edge(function(h, i, j) return oh[i][h][j] end), tol, what .. ' vs one-hot values')
            if name ~= 'gat' then
              local hm = function(x) return x:transpose(1, 2):unsqueeze(1) end
              local dw = pn.attention_weights(hm(q), hm(k), merge(opts, { mask = mask, aggregate = 'sum' })):totable()[1]
              assert_close(vals(w), per_edge(function(h, i, j) return dw[h][i][j] end), tol, what .. ' vs dense weights')
            end
          end
        end
        if name ~= 'gat' then -- (N, D) inputs give (E)
          local w1 = pn.graph_attention_weights(q:select(2, 1):contiguous(), k:select(2, 1):contiguous(), g, opts0)
          assert.same({ g.src:shape()[1] }, w1:shape())
          assert_close(vals(w1), vals(pn.graph_attention_weights(q, k, g, opts0):select(2, 1)), 0, name .. ' (N, D)')
        end
      end
    end)
  end

  it('ignores dropout and names itself in errors', function()
    local q = nodes(N, H, D, 'free', 35)
    local k = nodes(N, H, D, 'free', 36)
    local w = pn.graph_attention_weights(q, k, g, { dropout = 0.5, train = true })
    assert_close(vals(w), vals(pn.graph_attention_weights(q, k, g, {})), 0, 'dropout ignored')
    assert_error(function() pn.graph_attention_weights(q, nodes(5, H, D, 'free', 1), g, {}) end, 'graph_attention_weights', 'nodes')
    assert_error(function() pn.graph_attention_weights(q, k, csr_of(5, allowed), {}) end, 'graph_attention_weights', 'offsets', '[6]', '[6,2,3]')
    assert_error(function() pn.graph_attention_weights(q, k, {}, {}) end, 'graph_attention_weights', 'graph')
  end)

  -- the weights are differentiable (entropy regularisers, analyses): gradchecks, and the same
  -- gradients as graph_attention with one-hot values (the weights in another form)
  for _, name in ipairs(VARIANTS) do
    it(name .. ': gradients of the weights (q, k, learnable scalars, a_l, a_r), every normalize', function()
      local case = cases_of(name)[1]
      -- node 3 has no incoming edge
      local g2 = { offsets = pn.tensor({ 0, 3, 5, 5, 7, 9 }, { dtype = 'i64' }),
                   src = pn.tensor({ 0, 1, 3, 2, 4, 0, 3, 4, 2 }, { dtype = 'i64' }) }
      for ni, norm in ipairs(NORMS) do
        local q, k = nodes(5, H, D, case[1], 50 + ni), nodes(5, H, D, case[1], 57)
        q:requires_grad_(); k:requires_grad_()
        local opts = merge(case[2], { score = name, normalize = norm })
        local inputs = { q, k }
        if name == 'gat' then
          opts.a_l = nodes(H, 1, D, 'free', 33):squeeze(2):clone():requires_grad_()
          opts.a_r = nodes(H, 1, D, 'free', 34):squeeze(2):clone():requires_grad_()
          inputs[3], inputs[4] = opts.a_l, opts.a_r
        end
        learnable(name, opts, inputs)
        gradcheck(function() return pn.graph_attention_weights(q, k, g2, opts) end, inputs)
      end
    end)
  end

  it('weight gradients equal those through graph_attention with one-hot values', function()
    local eye5 = {}
    for i = 1, N do eye5[i] = {} for h = 1, H do eye5[i][h] = {} for j = 1, N do eye5[i][h][j] = i == j and 1 or 0 end end end
    for _, name in ipairs(VARIANTS) do
      local case = cases_of(name)[1]
      local q0, k0 = nodes(N, H, D, case[1], 61), nodes(N, H, D, case[1], 62)
      local c = pn.randn({ g.src:shape()[1], H }, { dtype = 'f64' })
      -- the same cotangent on the (N, H, N) one-hot output: c at [i, h, src], 0 elsewhere
      local cd = {}
      for i = 1, N do cd[i] = {} for h = 1, H do cd[i][h] = {} for j = 1, N do cd[i][h][j] = 0 end end end
      local ct, e = c:totable(), 0
      for i = 1, N do for j = 1, N do if allowed(i, j) then
        e = e + 1
        for h = 1, H do cd[i][h][j] = ct[e][h] end
      end end end
      local grads = {}
      for form = 1, 2 do
        local q, k = q0:clone():requires_grad_(), k0:clone():requires_grad_()
        local opts = merge(case[2], { score = name })
        if name == 'gat' then
          opts.a_l = nodes(H, 1, D, 'free', 33):squeeze(2):clone():requires_grad_()
          opts.a_r = nodes(H, 1, D, 'free', 34):squeeze(2):clone():requires_grad_()
        end
        local L
        if form == 1 then L = (pn.graph_attention_weights(q, k, g, opts) * c):sum()
        else L = (pn.graph_attention(q, k, pn.tensor(eye5, { dtype = 'f64' }), g, opts) * pn.tensor(cd, { dtype = 'f64' })):sum() end
        L:backward()
        grads[form] = { vals(q.grad), vals(k.grad), opts.a_l and vals(opts.a_l.grad) or {} }
      end
      for j = 1, 3 do assert_close(grads[1][j], grads[2][j], 1e-12, name .. ' gradient ' .. j) end
    end
  end)
end)
