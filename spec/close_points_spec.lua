-- Distance scores at close points (attention.h, plan.diff): the squared distance of points
-- 1e-2 … 1e-5 apart is computed from their difference, not from ‖q‖² + ‖k‖² − 2q·k, so in f32
-- the scores and their gradients keep their precision there (the expansion kept one or two
-- digits, and 1/Δ in the gradient multiplied the error: a 3.5 % gradient error, or a zeroed
-- gradient below its floor). Reference: the same computation in f64 on the very same
-- (f32-rounded) numbers, dense and graph, through the weights (attention_weights is
-- differentiable) and through attention itself; plus the distances against plain Lua.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local vals, rng = check.vals, check.rng

local D = 4

local function norm(x) local s = 0 for c = 1, #x do s = s + x[c] ^ 2 end return math.sqrt(s) end

-- score cases: options, a point generator and a perturbation that stays on the manifold
local function horizontal(x, d, u) -- cone scores: same height, so Δ decides (the z branch)
  local y = {}
  for c = 1, D - 1 do y[c] = x[c] + d * u[c] end
  y[D] = x[D]
  return y
end
local function all_coords(x, d, u)
  local y = {}
  for c = 1, D do y[c] = x[c] + d * u[c] end
  return y
end
local function height_gen(lo, hi)
  return function(r)
    local x = {}
    for c = 1, D - 1 do x[c] = r:n() * 0.6 end
    x[D] = lo + (hi - lo) * r:u()
    return x
  end
end
local CASES = {
  { 'laplacian', { score = 'laplacian', gamma = 1.3 },
    function(r) local x = {} for c = 1, D do x[c] = r:n() * 0.7 end return x end, all_coords },
  { 'umbral', { score = 'umbral', gamma = 1.0, r = 0.1 }, height_gen(0.3, 1.2), horizontal },
  { 'penumbral', { score = 'penumbral', gamma = 1.0, r = 1.5 }, height_gen(0.2, 1.0), horizontal },
  { 'hyperbolic hyperboloid', { score = 'hyperbolic', model = 'hyperboloid', beta = 1.1 },
    function(r)
      local x, n2 = {}, 0
      for c = 1, D - 1 do x[c] = r:n() * 0.6; n2 = n2 + x[c] ^ 2 end
      x[D] = math.sqrt(1 + n2)
      return x
    end,
    function(x, d, u) -- move along the sheet: perturb the head, recompute the time coordinate
      local y, n2 = {}, 0
      for c = 1, D - 1 do y[c] = x[c] + d * u[c]; n2 = n2 + y[c] ^ 2 end
      y[D] = math.sqrt(1 + n2)
      return y
    end },
  { 'hyperbolic halfspace', { score = 'hyperbolic', model = 'halfspace', beta = 0.9 }, height_gen(0.3, 1.2), all_coords },
  { 'hyperbolic poincare', { score = 'hyperbolic', model = 'poincare', curvature = 1.0 },
    function(r)
      local x = {}
      for c = 1, D do x[c] = r:n() end
      local s = 0.75 * r:u() / norm(x)
      for c = 1, D do x[c] = x[c] * s end
      return x
    end, all_coords },
}

-- queries 1..3 each have a key at relative distance 1e-2, 1e-3, 1e-4 (key 4 at 1e-5 from query
-- 1); the other keys are random. Returns q (Nq, D), k (Nk, D) as f32 tensors.
local DELTAS = { 1e-2, 1e-3, 1e-4 }
local function close_pairs(case, seed)
  local r = rng(seed)
  local q, k = {}, {}
  for i = 1, 3 do q[i] = case[3](r) end
  for i = 1, 3 do
    local u = {}
    for c = 1, D do u[c] = r:n() end
    local s = norm(u)
    for c = 1, D do u[c] = u[c] / s end
    k[i] = case[4](q[i], DELTAS[i] * norm(q[i]), u)
  end
  k[4] = case[4](q[1], 1e-5 * norm(q[1]), { 0.5, -0.5, 0.5, 0.5 })
  for j = 5, 7 do k[j] = case[3](r) end
  return pn.tensor(q, { dtype = 'f32' }), pn.tensor(k, { dtype = 'f32' })
end

local function max_abs(t)
  local m = 0
  for _, x in ipairs(vals(t)) do m = math.max(m, math.abs(x)) end
  return m
end

-- ‖a − b‖∞ / ‖b‖∞ with b the f64 reference
local function rel_err(a, b)
  local av, bv = vals(a), vals(b)
  local e = 0
  for i = 1, #av do e = math.max(e, math.abs(av[i] - bv[i])) end
  return e / math.max(max_abs(b), 1e-300)
end

-- gradients of <fn(q, k), C> in dtype dt from the f32 numbers q32, k32
local function grads(fn, q32, k32, C, dt)
  local q, k = q32:to(dt):detach():requires_grad_(), k32:to(dt):detach():requires_grad_()
  local out = fn(q, k)
  ;(out * C:to(dt)):sum():backward()
  return out, q.grad, k.grad
end

describe('distance scores at close points keep f32 precision', function()
  for ci, case in ipairs(CASES) do
    it(case[1] .. ': weights and their gradients (dense)', function()
      local q, k = close_pairs(case, 100 + ci)
      local C = pn.randn({ 3, 7 }, { dtype = 'f64' })
      local fn = function(a, b) return pn.attention_weights(a, b, case[2]) end
      local w32, dq32, dk32 = grads(fn, q, k, C, 'f32')
      local w64, dq64, dk64 = grads(fn, q, k, C, 'f64')
      assert.truthy(rel_err(w32, w64) < 1e-5, case[1] .. ' weights ' .. rel_err(w32, w64))
      assert.truthy(rel_err(dq32, dq64) < 2e-3, case[1] .. ' dq ' .. rel_err(dq32, dq64))
      assert.truthy(rel_err(dk32, dk64) < 2e-3, case[1] .. ' dk ' .. rel_err(dk32, dk64))
      -- the close keys' own gradient rows are not zero (no floor swallows them)
      local dkt = dk32:totable()
      for j = 1, 4 do assert.truthy(math.abs(dkt[j][1]) + math.abs(dkt[j][2]) > 0, case[1] .. ' key ' .. j) end
    end)

    it(case[1] .. ': attention output gradients, a multi-tile causal run', function()
      -- 70 queries against 140 keys, every query with a key 1e-4 apart: many tiles, near and far
      -- pairs mixed in one tile, split heads in the backward
      local r = rng(200 + ci)
      local qt, kt = {}, {}
      for i = 1, 70 do qt[i] = case[3](r) end
      for j = 1, 140 do
        if j <= 70 then
          local u = {}
          for c = 1, D do u[c] = r:n() end
          local s = norm(u)
          for c = 1, D do u[c] = u[c] / s end
          kt[j] = case[4](qt[j], 1e-4 * norm(qt[j]), u)
        else
          kt[j] = case[3](r)
        end
      end
      local q, k = pn.tensor({ { qt } }, { dtype = 'f32' }), pn.tensor({ { kt } }, { dtype = 'f32' })
      local v = pn.randn({ 1, 1, 140, 3 }, { dtype = 'f64' })
      local C = pn.randn({ 1, 1, 70, 3 }, { dtype = 'f64' })
      local opts = {}
      for kk, vv in pairs(case[2]) do opts[kk] = vv end
      opts.causal = true
      local g = {}
      for _, dt in ipairs({ 'f32', 'f64' }) do
        local _, dq, dk = grads(function(a, b) return pn.attention(a, b, v:to(dt), opts) end, q, k, C, dt)
        g[dt] = { dq, dk }
      end
      assert.truthy(rel_err(g.f32[1], g.f64[1]) < 2e-3, case[1] .. ' dq ' .. rel_err(g.f32[1], g.f64[1]))
      assert.truthy(rel_err(g.f32[2], g.f64[2]) < 2e-3, case[1] .. ' dk ' .. rel_err(g.f32[2], g.f64[2]))
    end)

    it(case[1] .. ': graph weights and their gradients', function()
      -- nodes 1..3 are the queries, 4..10 the keys; every query node attends to every key node
      local q, k = close_pairs(case, 300 + ci)
      local qt, kt = q:totable(), k:totable()
      local nodes_q, nodes_k = {}, {}
      for i = 1, 10 do
        nodes_q[i] = qt[i] or kt[i - 3]
        nodes_k[i] = i <= 3 and qt[i] or kt[i - 3]
      end
      local off, src = { 0 }, {}
      for i = 1, 10 do
        if i <= 3 then for j = 4, 10 do src[#src + 1] = j - 1 end end
        off[#off + 1] = #src
      end
      local g = { offsets = pn.tensor(off, { dtype = 'i64' }), src = pn.tensor(src, { dtype = 'i64' }) }
      local Q, K = pn.tensor(nodes_q, { dtype = 'f32' }), pn.tensor(nodes_k, { dtype = 'f32' })
      local C = pn.randn({ #src }, { dtype = 'f64' })
      local fn = function(a, b) return pn.graph_attention_weights(a, b, g, case[2]) end
      local w32, dq32, dk32 = grads(fn, Q, K, C, 'f32')
      local w64, dq64, dk64 = grads(fn, Q, K, C, 'f64')
      assert.truthy(rel_err(w32, w64) < 1e-5, case[1] .. ' weights ' .. rel_err(w32, w64))
      assert.truthy(rel_err(dq32, dq64) < 2e-3, case[1] .. ' dq ' .. rel_err(dq32, dq64))
      assert.truthy(rel_err(dk32, dk64) < 2e-3, case[1] .. ' dk ' .. rel_err(dk32, dk64))
    end)
  end

  it('laplacian scores of close points equal −γ‖q − k‖ from the coordinates (plain Lua)', function()
    local q, k = close_pairs(CASES[1], 401)
    local s = pn.attention_weights(q, k, { score = 'laplacian', gamma = 1.0, normalize = 'sigmoid' })
    local qt, kt, st = q:totable(), k:totable(), s:totable()
    for i = 1, 3 do
      local e = 0
      for c = 1, D do e = e + (qt[i][c] - kt[i][c]) ^ 2 end -- the f32 numbers, in double
      local want = -math.sqrt(e)
      local got = -math.log(1 / st[i][i] - 1) -- σ⁻¹(w) = s
      assert.truthy(math.abs(got - want) < 1e-3 * math.abs(want) + 1e-7, string.format('pair %d: %g vs %g', i, got, want))
    end
  end)

  it('a query row whose squared norm overflows, after the close pairs, does not hide them', function()
    -- the CPU kernel's test for cancelled pairs keeps a running maximum over a block of rows,
    -- and a row with ‖q‖² = inf makes its expansion NaN (inf − inf): the NaN must not replace
    -- the earlier rows' evidence (NaN-carrying inputs are set aside before the kernel; overflow
    -- is not)
    local q, k = close_pairs(CASES[1], 402)
    local qt, kt = q:totable(), k:totable()
    qt[4] = { 3e19, -3e19, 3e19, 3e19 }
    local s = pn.attention_weights(pn.tensor(qt, { dtype = 'f32' }), k, { score = 'laplacian', gamma = 1.0, normalize = 'sigmoid' })
    local st = s:totable()
    for i = 1, 3 do
      local e = 0
      for c = 1, D do e = e + (qt[i][c] - kt[i][c]) ^ 2 end
      local want = -math.sqrt(e)
      local got = -math.log(1 / st[i][i] - 1)
      assert.truthy(math.abs(got - want) < 1e-3 * math.abs(want) + 1e-7, string.format('row %d: %g vs %g', i, got, want))
    end
  end)
end)
