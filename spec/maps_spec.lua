-- Manifold maps (core/attention/maps.c) and the hyperbolic toolkit (core/attention/hyperbolic.c):
-- values against the papers' formulas written out in plain Lua (Coneheads Eq. 9–11 and
-- App. 7.1, Gulcehre §4.1 and Eq. 2–3, the Poincaré-ball note), f64 gradchecks, identities,
-- the hard points (x₋ = 0, the ball boundary, huge and tiny heights in f32) and the errors.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'

local sqrt, exp, log, abs = math.sqrt, math.exp, math.log, math.abs
local sinh, cosh, tanh = math.sinh, math.cosh, math.tanh
local function atanh(z) return 0.5 * log((1 + z) / (1 - z)) end

-- ---- helpers ----------------------------------------------------------------------------------
local assert_error_matching = require('spec.helpers.check').assert_error_matching

local function flatten(t, out)
  out = out or {}
  if type(t) == 'number' then out[#out + 1] = t; return out end
  for _, v in ipairs(t) do flatten(v, out) end
  return out
end

-- want: nested Lua table; got: tensor. |got − want| ≤ tol·max(1, |want|)
local function assert_close(want, got, tol)
  local w, g = flatten(want), flatten(got:totable())
  assert.equal(#w, #g, 'element count')
  for i = 1, #w do
    assert.is_true(abs(w[i] - g[i]) <= tol * math.max(1, abs(w[i])),
      string.format('element %d: got %.15g, want %.15g', i, g[i], w[i]))
  end
end

local function assert_finite(t, what)
  for i, v in ipairs(flatten(t:totable())) do
    assert.is_true(v == v and v > -math.huge and v < math.huge, (what or 'value') .. ' ' .. i .. ' is ' .. tostring(v))
  end
end

local function dot(a, b)
  local s = 0
  for i = 1, #a do s = s + a[i] * b[i] end
  return s
end
local function norm(a) return sqrt(dot(a, a)) end
local function scale(a, s)
  local r = {}
  for i = 1, #a do r[i] = a[i] * s end
  return r
end
local function head(x) -- x₋
  local r = {}
  for i = 1, #x - 1 do r[i] = x[i] end
  return r
end

-- rows: a list of Lua rows → f64/f32 tensor; rows_t: the same, non-contiguous (a transposed copy)
local function rows(list, dtype) return pn.tensor(list, { dtype = dtype or 'f64' }) end
local function rows_t(list, dtype)
  local tr = {}
  for j = 1, #list[1] do
    tr[j] = {}
    for i = 1, #list do tr[j][i] = list[i][j] end
  end
  local t = pn.tensor(tr, { dtype = dtype or 'f64' }):transpose(1, 2)
  assert.is_false(t:is_contiguous())
  return t
end
local function map_rows(list, f)
  local r = {}
  for i, x in ipairs(list) do r[i] = f(x) end
  return r
end

local rnd = math.random
local function gauss() return sqrt(-2 * log(rnd() + 1e-300)) * math.cos(2 * math.pi * rnd()) end
local function randrows(n, d, s)
  local r = {}
  for i = 1, n do
    r[i] = {}
    for j = 1, d do r[i][j] = (s or 1) * gauss() end
  end
  return r
end
-- points of the Poincaré ball of curvature −c, radius up to rmax·(1/√c)
local function ballrows(n, d, c, rmax)
  local r = {}
  for i = 1, n do
    local v = randrows(1, d)[1]
    r[i] = scale(v, (rmax or 0.9) * rnd() / (sqrt(c) * norm(v)))
  end
  return r
end
local function leaf(list) return rows(list):requires_grad_() end

-- ---- references from the papers ------------------------------------------------------------------
local function psi_ref(x)
  local e = exp(x[#x])
  local r = scale(head(x), e)
  r[#x] = e
  return r
end

local function xi_ref(h)
  return function(x)
    local s = h / (1 + exp(-x[#x]))
    local r = scale(head(x), s)
    r[#x] = s
    return r
  end
end

local function pseudopolar_ref(x)
  local u, rr = head(x), x[#x]
  local r = scale(u, sinh(rr) / norm(u))
  r[#x] = cosh(rr)
  return r
end

-- Coneheads Eq. 9 with x = O = (0,…,0,1)
local function exp0_ref(h, scale_last)
  return function(x)
    local v = scale(x, 1)
    local d = #v
    if scale_last then v[d] = v[d] / d end
    local n = norm(v)
    local r = scale(head(v), 1 / (n / tanh(n) - v[d]))
    r[d] = 1 / (cosh(n) - v[d] * sinh(n) / n)
    if h and r[d] > h then r[d] = h end
    return r
  end
end

-- eps: the documented cap of the result's radius at the project radius (1 − eps)/√c
local function expmap0_ref(c, eps)
  return function(v)
    local t = sqrt(c) * norm(v)
    return scale(v, math.min(tanh(t), 1 - (eps or 1e-5)) / t)
  end
end
local function logmap0_ref(c)
  return function(y)
    local z = sqrt(c) * norm(y)
    return scale(y, atanh(z) / z)
  end
end
local function mobius_ref(x, y, c)
  local xy, x2, y2 = dot(x, y), dot(x, x), dot(y, y)
  local den = 1 + 2 * c * xy + c * c * x2 * y2
  local r = {}
  for i = 1, #x do r[i] = ((1 + 2 * c * xy + c * y2) * x[i] + (1 - c * x2) * y[i]) / den end
  return r
end
local function dist_ref(x, y, c) -- (2/√c) artanh(√c ‖(−x) ⊕ y‖)
  return 2 / sqrt(c) * atanh(sqrt(c) * norm(mobius_ref(scale(x, -1), y, c)))
end
local function project_ref(c, eps)
  return function(x)
    local r, n = (1 - eps) / sqrt(c), norm(x)
    if n > r then return scale(x, r / n) end
    return scale(x, 1)
  end
end
local function p2k_ref(c) return function(p) return scale(p, 2 / (1 + c * dot(p, p))) end end
local function k2p_ref(c) return function(k) return scale(k, 1 / (1 + sqrt(1 - c * dot(k, k)))) end end
local function h2k_ref(c) return function(x) return scale(head(x), 1 / (sqrt(c) * x[#x])) end end
local function k2h_ref(c)
  return function(k)
    local s = sqrt(1 - c * dot(k, k))
    local r = scale(k, 1 / s)
    r[#k + 1] = 1 / (sqrt(c) * s)
    return r
  end
end

before_each(function()
  math.randomseed(7)
  pn.manual_seed(7)
end)

-- ---- the maps ------------------------------------------------------------------------------------------
describe('maps.psi / maps.xi', function()
  it('match Coneheads Eq. 10 and 11 (f64, f32, non-contiguous, leading dims)', function()
    local x = randrows(6, 4)
    assert_close(map_rows(x, psi_ref), pn.maps.psi(rows(x)), 1e-12)
    assert_close(map_rows(x, psi_ref), pn.maps.psi(rows_t(x)), 1e-12)
    assert_close(map_rows(x, psi_ref), pn.maps.psi(rows(x, 'f32')), 1e-5)
    assert_close(map_rows(x, xi_ref(1)), pn.maps.xi(rows(x)), 1e-12)
    assert_close(map_rows(x, xi_ref(2.5)), pn.maps.xi(rows_t(x), { h = 2.5 }), 1e-12)
    assert_close(map_rows(x, xi_ref(0.5)), pn.maps.xi(rows(x, 'f32'), { h = 0.5 }), 1e-5)
    local y = pn.maps.psi(rows(x):reshape(2, 3, 4))
    assert.same({ 2, 3, 4 }, y:shape())
    assert_close(map_rows(x, psi_ref), y, 1e-12)
    assert.equal('f32', pn.maps.xi(rows(x, 'f32')):dtype())
  end)

  it('xi stays below the light source h and is finite for extreme x_d', function()
    local y = pn.maps.xi(rows({ { 1, 800 }, { 1, -800 }, { 2, 0 } }, 'f32'), { h = 3 })
    assert_finite(y)
    local t = y:totable()
    assert.is_true(t[1][2] <= 3 and t[3][2] == 1.5)
  end)

  it('keep the height on the manifold for very negative x_d (floor: the dtype\'s smallest normal)', function()
    -- e^-120 and σ(-120) are 0 in f32: without the floor these points sit on the boundary and
    -- every cone score refuses them (a PPI run with umbral attention stopped that way)
    for _, dt in ipairs({ 'f32', 'f64' }) do
      local tiny = dt == 'f32' and 2 ^ -126 or 2 ^ -1022
      local xd = dt == 'f32' and -120 or -800
      for _, f in ipairs({ pn.maps.psi, function(t) return pn.maps.xi(t, { h = 2 }) end }) do
        local x = rows({ { 0.5, xd }, { 0.5, 0 } }, dt):requires_grad_()
        local y = f(x)
        local t = y:totable()
        assert.equal(tiny, t[1][2])
        assert.equal(0.5 * tiny, t[1][1])
        assert.is_true(t[2][2] > 0.5)
        y:sum():backward()
        local g = x.grad:totable()
        assert.equal(0, g[1][2])      -- the floored height is constant in x_d
        assert.equal(tiny, g[1][1])   -- ∂(x₋·height)/∂x₋ = height
        assert.is_true(g[2][2] > 0)
      end
      -- a cone score takes the floored points
      local q = pn.maps.psi(rows({ { 0.1, xd }, { 0.3, 1 } }, dt)):view(1, 1, 2, 2)
      local o = pn.attention(q, q, pn.ones({ 1, 1, 2, 3 }, { dtype = dt }), { score = 'umbral' })
      assert_finite(o)
    end
    local y = pn.maps.psi(rows({ { 1, 0 / 0 } }, 'f32')):totable()
    assert.is_true(y[1][2] ~= y[1][2]) -- NaN in, NaN out
  end)

  it('gradcheck in f64', function()
    gradcheck(function(x) return pn.maps.psi(x) end, { leaf(randrows(3, 4)) })
    gradcheck(function(x) return pn.maps.xi(x, { h = 1.7 }) end, { leaf(randrows(3, 4)) })
    gradcheck(function(x) return pn.maps.psi(x:transpose(1, 2)) end, { leaf(randrows(4, 3)) })
  end)
end)

describe('maps.pseudopolar', function()
  it('matches Gulcehre §4.1 and lands on the hyperboloid −x_d² + ‖x₋‖² = −1', function()
    local x = randrows(8, 5)
    assert_close(map_rows(x, pseudopolar_ref), pn.maps.pseudopolar(rows(x)), 1e-12)
    assert_close(map_rows(x, pseudopolar_ref), pn.maps.pseudopolar(rows_t(x)), 1e-12)
    assert_close(map_rows(x, pseudopolar_ref), pn.maps.pseudopolar(rows(x, 'f32')), 1e-5)
    for _, y in ipairs(pn.maps.pseudopolar(rows(x)):totable()) do
      local d = #y
      assert.near(-1, -y[d] * y[d] + dot(head(y), head(y)), 1e-10 * y[d] * y[d])
    end
  end)

  it('x₋ = 0 (the documented clamp) gives the origin of the hyperboloid, finite gradients', function()
    for _, dt in ipairs({ 'f64', 'f32' }) do
      local x = pn.tensor({ { 0, 0, 0.7 }, { 0, 0, -2 }, { 1e-20, 0, 1.5 } }, { dtype = dt }):requires_grad_()
      local y = pn.maps.pseudopolar(x)
      assert_finite(y)
      for _, r in ipairs(y:totable()) do
        assert.near(-1, -r[3] * r[3] + r[1] * r[1] + r[2] * r[2], 1e-6)
      end
      y:sum():backward()
      assert_finite(x.grad, 'gradient')
    end
  end)

  it('keeps sinh/cosh of the height to 1e-14 relative across its branches, overflow and NaN', function()
    -- one expm1 gives both (maps.c): small, negative, either side of |r| = 20 and of 709
    local hs = { -1e-9, 1e-300, -0.07, 0.5, -3, 8.7, 19.99, -20.01, 24.3, -300, 708.9, 709.1 }
    local xs = {}
    for i, h in ipairs(hs) do xs[i] = { 0.6, -0.8, h } end -- ‖x₋‖ = 1
    local y = pn.maps.pseudopolar(pn.tensor(xs, { dtype = 'f64' })):totable()
    for i, h in ipairs(hs) do
      local ws, wc = sinh(h), cosh(h)
      assert.is_true(abs(y[i][1] - 0.6 * ws) <= 1e-14 * abs(0.6 * ws), 'sinh at ' .. h .. ': ' .. y[i][1])
      assert.is_true(abs(y[i][3] - wc) <= 1e-14 * wc, 'cosh at ' .. h .. ': ' .. y[i][3])
    end
    local z = pn.maps.pseudopolar(pn.tensor({ { 1, 0, 711 }, { 1, 0, -711 }, { 1, 0, 0 / 0 } }, { dtype = 'f64' })):totable()
    assert.equal(math.huge, z[1][1]); assert.equal(math.huge, z[1][3])
    assert.equal(-math.huge, z[2][1]); assert.equal(math.huge, z[2][3])
    assert.is_true(z[3][1] ~= z[3][1] and z[3][3] ~= z[3][3], 'NaN height gives NaN')
  end)

  it('gradcheck in f64', function()
    gradcheck(function(x) return pn.maps.pseudopolar(x) end, { leaf(randrows(4, 4)) })
  end)
end)

describe('maps.exp0', function()
  it('matches Coneheads Eq. 9 at O, with the h clamp and the scale_last option', function()
    local x = randrows(8, 4, 0.8)
    assert_close(map_rows(x, exp0_ref()), pn.maps.exp0(rows(x)), 1e-12)
    assert_close(map_rows(x, exp0_ref()), pn.maps.exp0(rows_t(x)), 1e-12)
    assert_close(map_rows(x, exp0_ref()), pn.maps.exp0(rows(x, 'f32')), 1e-5)
    assert_close(map_rows(x, exp0_ref(0.9)), pn.maps.exp0(rows(x), { h = 0.9 }), 1e-12)
    assert_close(map_rows(x, exp0_ref(nil, true)), pn.maps.exp0(rows(x), { scale_last = true }), 1e-12)
    assert_close({ { 0, 0, 1 } }, pn.maps.exp0(rows({ { 0, 0, 0 } })), 0)   -- v = 0 maps to O
  end)

  it('lands on the geodesics through O: the vertical one is (0, e^{v_d})', function()
    assert_close({ { 0, exp(2) }, { 0, exp(-3) } }, pn.maps.exp0(rows({ { 0, 2 }, { 0, -3 } })), 1e-12)
  end)

  it('huge and tiny inputs stay finite in f32 (values and gradients)', function()
    local x = pn.tensor({ { 0.3, 200 }, { 0, 500 }, { 1e3, -1e3 }, { 0, -700 }, { 1e-30, 1e-30 }, { 0, 1e-38 },
                          { 1e-20, 60 } }, { dtype = 'f32' }):requires_grad_()
    local y = pn.maps.exp0(x)
    assert_finite(y)
    for _, r in ipairs(y:totable()) do assert.is_true(r[2] > 0, 'height ' .. r[2] .. ' must be > 0') end
    y:sum():backward()
    assert_finite(x.grad, 'gradient')
    local t = y:totable()
    assert.near(1, t[5][2], 1e-6)   -- tiny v: O
    local hz = pn.maps.exp0(pn.tensor({ { 0, 500 } }, { dtype = 'f32' }), { h = 4 }):totable()
    assert.equal(4, hz[1][2])
  end)

  it('gradcheck in f64 (plain, h clamp active, scale_last, tiny v)', function()
    gradcheck(function(x) return pn.maps.exp0(x) end, { leaf(randrows(4, 4, 0.7)) })
    gradcheck(function(x) return pn.maps.exp0(x, { h = 1.1 }) end, { leaf({ { 0.1, 0.2, 0.9 }, { 0.3, -0.2, 0.4 } }) })
    gradcheck(function(x) return pn.maps.exp0(x, { scale_last = true }) end, { leaf(randrows(3, 3)) })
    gradcheck(function(x) return pn.maps.exp0(x) end, { leaf({ { 1e-3, -2e-3, 1e-3 }, { 0, 0, 0 } }) })
    gradcheck(function(x) return pn.maps.exp0(x) end, { leaf({ { 0.5, 8 }, { 0.2, -6 } }) }, { rtol = 1e-4 })
  end)
end)

describe('maps errors', function()
  it('reject bad arguments with the op in the message', function()
    assert_error_matching(function() pn.maps.psi(pn.zeros(3, 1)) end, 'maps.psi', '[3,1]')
    assert_error_matching(function() pn.maps.pseudopolar(pn.zeros({ 2, 3 }, { dtype = 'i64' })) end, 'maps.pseudopolar', 'i64')
    assert_error_matching(function() pn.maps.xi(pn.zeros(2, 3), { h = 0 }) end, 'maps.xi', 'h = 0')
    assert_error_matching(function() pn.maps.xi(pn.zeros(2, 3), { h = -1 }) end, 'maps.xi', 'positive')
    assert_error_matching(function() pn.maps.exp0(pn.zeros(2, 3), { h = -2 }) end, 'maps.exp0', 'h = -2')
    assert_error_matching(function() pn.maps.exp0('x') end, 'maps.exp0', 'tensor')
    assert_error_matching(function() pn.maps.psi(pn.tensor(3)) end, 'maps.psi', '0-dim')
  end)
end)

-- ---- the Poincaré ball ----------------------------------------------------------------------------------
describe('hyper.expmap0 / logmap0', function()
  it('match the closed forms at the origin (several curvatures, f64, f32, non-contiguous)', function()
    local v = randrows(6, 4, 0.6)
    for _, c in ipairs({ 1, 0.3, 2.5 }) do
      assert_close(map_rows(v, expmap0_ref(c)), pn.hyper.expmap0(rows(v), c), 1e-12)
      assert_close(map_rows(v, expmap0_ref(c)), pn.hyper.expmap0(rows_t(v), c), 1e-12)
      assert_close(map_rows(v, expmap0_ref(c, 4e-3)), pn.hyper.expmap0(rows(v, 'f32'), c), 1e-5)
      local p = ballrows(6, 4, c)
      assert_close(map_rows(p, logmap0_ref(c)), pn.hyper.logmap0(rows(p), c), 1e-12)
      assert_close(map_rows(p, logmap0_ref(c)), pn.hyper.logmap0(rows_t(p), c), 1e-12)
      assert_close(map_rows(p, logmap0_ref(c)), pn.hyper.logmap0(rows(p, 'f32'), c), 1e-5)
    end
    assert_close(map_rows(v, expmap0_ref(1)), pn.hyper.expmap0(rows(v)), 1e-12)   -- c defaults to 1
  end)

  it('logmap0(expmap0(v)) = v and expmap0(logmap0(x)) = x', function()
    local v = randrows(5, 3, 0.8)
    for _, c in ipairs({ 1, 0.5 }) do
      assert_close(v, pn.hyper.logmap0(pn.hyper.expmap0(rows(v), c), c), 1e-12)
      local p = ballrows(5, 3, c)
      assert_close(p, pn.hyper.expmap0(pn.hyper.logmap0(rows(p), c), c), 1e-12)
    end
  end)

  it('are finite with an identity gradient at 0, and expmap0 stays inside the ball', function()
    for _, f in ipairs({ pn.hyper.expmap0, pn.hyper.logmap0 }) do
      local x = pn.zeros({ 2, 3 }, { dtype = 'f64' }):requires_grad_()
      local y = f(x, 1)
      assert_close({ { 0, 0, 0 }, { 0, 0, 0 } }, y, 0)
      y:backward(pn.ones({ 2, 3 }, { dtype = 'f64' }))
      assert_close({ { 1, 1, 1 }, { 1, 1, 1 } }, x.grad, 1e-15)
    end
    local far = pn.hyper.expmap0(pn.tensor({ { 30, 40 } }), 1):totable()[1]   -- f32: tanh(50) = 1
    assert.is_true(norm(far) < 1 and norm(far) >= 0.99)
    assert_finite(pn.hyper.logmap0(pn.hyper.expmap0(pn.tensor({ { 30, 40 } }), 1), 1))
  end)

  it('gradcheck in f64', function()
    gradcheck(function(v) return pn.hyper.expmap0(v, 0.7) end, { leaf(randrows(4, 3, 0.7)) })
    gradcheck(function(v) return pn.hyper.expmap0(v, 1) end, { leaf({ { 1e-4, 2e-4 }, { 3, 4 } }) })
    gradcheck(function(x) return pn.hyper.logmap0(x, 1.3) end, { leaf(ballrows(4, 3, 1.3)) })
    gradcheck(function(x) return pn.hyper.logmap0(x, 1) end, { leaf({ { 1e-4, -1e-4 }, { 0.6, 0.7 } }) })
  end)
end)

describe('hyper.mobius_add', function()
  it('matches the Möbius addition formula, with broadcasting of the leading dims', function()
    for _, c in ipairs({ 1, 0.4 }) do
      local x, y = ballrows(5, 3, c), ballrows(5, 3, c)
      local want = {}
      for i = 1, 5 do want[i] = mobius_ref(x[i], y[i], c) end
      assert_close(want, pn.hyper.mobius_add(rows(x), rows(y), c), 1e-12)
      assert_close(want, pn.hyper.mobius_add(rows_t(x), rows(y), c), 1e-12)
      assert_close(want, pn.hyper.mobius_add(rows(x, 'f32'), rows(y, 'f32'), c), 1e-5)
    end
    local x, y = ballrows(3, 2, 1), ballrows(4, 2, 1)
    local z = pn.hyper.mobius_add(rows(x):reshape(3, 1, 2), rows(y))
    assert.same({ 3, 4, 2 }, z:shape())
    local want = {}
    for i = 1, 3 do
      want[i] = {}
      for j = 1, 4 do want[i][j] = mobius_ref(x[i], y[j], 1) end
    end
    assert_close(want, z, 1e-12)
  end)

  it('has 0 as identity and (−x) ⊕ x = 0', function()
    local x = ballrows(4, 3, 1)
    assert_close(x, pn.hyper.mobius_add(rows(x), pn.zeros({ 4, 3 }, { dtype = 'f64' })), 1e-15)
    assert_close(x, pn.hyper.mobius_add(pn.zeros({ 3 }, { dtype = 'f64' }), rows(x)), 1e-15)
    assert_close(map_rows(x, function() return { 0, 0, 0 } end), pn.hyper.mobius_add(-rows(x), rows(x)), 1e-12)
  end)

  it('gradcheck in f64, broadcast inputs included', function()
    gradcheck(function(x, y) return pn.hyper.mobius_add(x, y, 0.8) end, { leaf(ballrows(3, 3, 0.8)), leaf(ballrows(3, 3, 0.8)) })
    gradcheck(function(x, y) return pn.hyper.mobius_add(x:reshape(2, 1, 3), y, 1) end,
      { leaf(ballrows(2, 3, 1)), leaf(ballrows(4, 3, 1)) })
  end)
end)

describe('hyper.dist', function()
  it('matches (2/√c) artanh(√c ‖(−x) ⊕ y‖), one number per pair, broadcasting', function()
    for _, c in ipairs({ 1, 2, 0.25 }) do
      local x, y = ballrows(6, 4, c), ballrows(6, 4, c)
      local want = {}
      for i = 1, 6 do want[i] = dist_ref(x[i], y[i], c) end
      local d = pn.hyper.dist(rows(x), rows(y), c)
      assert.same({ 6 }, d:shape())
      assert_close(want, d, 1e-12)
      assert_close(want, pn.hyper.dist(rows_t(x), rows_t(y), c), 1e-12)
      assert_close(want, pn.hyper.dist(rows(x, 'f32'), rows(y, 'f32'), c), 1e-5)
    end
    local x, y = ballrows(3, 2, 1), ballrows(5, 2, 1)
    local d = pn.hyper.dist(rows(x):reshape(3, 1, 2), rows(y))
    assert.same({ 3, 5 }, d:shape())
    local want = {}
    for i = 1, 3 do
      want[i] = {}
      for j = 1, 5 do want[i][j] = dist_ref(x[i], y[j], 1) end
    end
    assert_close(want, d, 1e-12)
    -- from the origin: 2 artanh ‖y‖
    assert_close({ 2 * atanh(0.5) }, pn.hyper.dist(pn.zeros({ 1, 2 }, { dtype = 'f64' }), rows({ { 0.3, 0.4 } })), 1e-12)
  end)

  it('dist(x, x) = 0 with a zero gradient there and finite gradients nearby', function()
    local x = ballrows(4, 3, 1)
    local a, b = leaf(x), leaf(x)
    local d = pn.hyper.dist(a, b)
    assert_close({ 0, 0, 0, 0 }, d, 0)
    d:sum():backward()
    assert_close(map_rows(x, function() return { 0, 0, 0 } end), a.grad, 0)
    local near = {}
    for i = 1, 4 do near[i] = { x[i][1] + 1e-9, x[i][2], x[i][3] - 1e-9 } end
    local a2, b2 = leaf(x), leaf(near)
    pn.hyper.dist(a2, b2):sum():backward()
    assert_finite(a2.grad, 'gradient')
    assert_finite(b2.grad, 'gradient')
  end)

  it('gradcheck in f64, broadcast inputs included', function()
    gradcheck(function(x, y) return pn.hyper.dist(x, y, 1.5) end, { leaf(ballrows(4, 3, 1.5)), leaf(ballrows(4, 3, 1.5)) })
    gradcheck(function(x, y) return pn.hyper.dist(x:reshape(2, 1, 2), y, 1) end,
      { leaf(ballrows(2, 2, 1)), leaf(ballrows(3, 2, 1)) })
  end)
end)

describe('hyper.project and the boundary', function()
  it('keeps ‖x‖ ≤ (1 − eps)/√c (eps 4e-3 in f32, 1e-5 in f64) and leaves inside points alone', function()
    local x = { { 3, 4 }, { 0.1, 0.2 }, { 0, 0 }, { -50, 1 } }
    for _, c in ipairs({ 1, 4 }) do
      assert_close(map_rows(x, project_ref(c, 1e-5)), pn.hyper.project(rows(x), c), 1e-12)
      assert_close(map_rows(x, project_ref(c, 4e-3)), pn.hyper.project(rows(x, 'f32'), c), 1e-6)
      assert_close(map_rows(x, project_ref(c, 1e-5)), pn.hyper.project(rows_t(x), c), 1e-12)
    end
  end)

  it('projected boundary points are accepted everywhere with finite values and gradients', function()
    for _, dt in ipairs({ 'f32', 'f64' }) do
      local raw = pn.tensor({ { 3, 4 }, { -8, 1 }, { 0, -2 } }, { dtype = dt }):requires_grad_()
      local p = pn.hyper.project(raw, 1)
      local outs = {
        pn.hyper.logmap0(p, 1), pn.hyper.dist(p, -p, 1), pn.hyper.mobius_add(p, p, 1),
        pn.hyper.to_klein(p), pn.hyper.from_klein(pn.hyper.to_klein(p)),
        pn.hyper.from_klein(pn.hyper.to_klein(p), { to = 'hyperboloid' }),
      }
      local total = 0
      for _, o in ipairs(outs) do
        assert_finite(o)
        total = total + o:sum()
      end
      total:backward()
      assert_finite(raw.grad, 'gradient')
    end
  end)

  it('points on the boundary up to rounding are accepted; logmap0 and dist saturate at the artanh clamp', function()
    -- f64: √c‖x‖ = 1 + 1e-13 (inside TOL = 1e-12); the clamp is 1 − 1e-15
    local on = leaf({ { 0.6 * (1 + 1e-13), 0.8 * (1 + 1e-13) } })
    local l = pn.hyper.logmap0(on, 1)
    assert.near(atanh(1 - 1e-15), norm(l:totable()[1]), 1e-6)
    local d = pn.hyper.dist(on, -on)
    assert.near(2 * atanh(1 - 1e-15), d:item(), 1e-6)
    local total = l:sum() + d:sum() + pn.hyper.mobius_add(on, on):sum() + pn.hyper.to_klein(on):sum()
    total:backward()
    assert_finite(on.grad, 'gradient')
    -- monotone: a point just inside gives at most the saturated value
    local just_in = pn.hyper.logmap0(rows({ { 0.6 * (1 - 1e-16), 0.8 * (1 - 1e-16) } }), 1)
    assert.is_true(norm(just_in:totable()[1]) <= atanh(1 - 1e-15) + 1e-9)
    -- f32: ‖x‖ = 1 exactly, clamp 1 − 1e-7
    local on32 = pn.tensor({ { 0.6, 0.8 } })
    assert.near(atanh(1 - 1e-7), norm(pn.hyper.logmap0(on32):totable()[1]), 1e-4)
    assert_finite(pn.hyper.dist(on32, -on32))
    assert_finite(pn.hyper.from_klein(pn.hyper.to_klein(on32)))
  end)

  it('gradcheck in f64 (both branches)', function()
    gradcheck(function(x) return pn.hyper.project(x, 1) end, { leaf({ { 3, 4, 1 }, { 0.1, 0.2, 0.3 } }) })
    gradcheck(function(x) return pn.hyper.project(x, 2) end, { leaf({ { -1, 0.5 }, { 0.2, 0.1 } }) })
  end)
end)

describe('Klein conversions', function()
  it('Poincaré ↔ Klein match k = 2p/(1 + c‖p‖²) and p = k/(1 + √(1 − c‖k‖²))', function()
    for _, c in ipairs({ 1, 0.5, 3 }) do
      local p = ballrows(6, 3, c, 0.95)
      assert_close(map_rows(p, p2k_ref(c)), pn.hyper.to_klein(rows(p), { c = c }), 1e-12)
      assert_close(map_rows(p, p2k_ref(c)), pn.hyper.to_klein(rows_t(p), { from = 'poincare', c = c }), 1e-12)
      assert_close(map_rows(p, p2k_ref(c)), pn.hyper.to_klein(rows(p, 'f32'), c), 1e-5)
      local k = map_rows(p, p2k_ref(c))
      assert_close(map_rows(k, k2p_ref(c)), pn.hyper.from_klein(rows(k), { c = c }), 1e-12)
      assert_close(map_rows(k, k2p_ref(c)), pn.hyper.from_klein(rows(k, 'f32'), { to = 'poincare', c = c }), 1e-5)
      assert_close(p, pn.hyper.from_klein(pn.hyper.to_klein(rows(p), { c = c }), { c = c }), 1e-12)
      assert_close(k, pn.hyper.to_klein(pn.hyper.from_klein(rows(k), { c = c }), { c = c }), 1e-12)
    end
  end)

  it('hyperboloid (time-like last) ↔ Klein match k = x₋/(√c x_d) and (k, 1/√c)/√(1 − c‖k‖²)', function()
    local x = pn.maps.pseudopolar(rows(randrows(5, 4, 0.7))):totable()   -- unit hyperboloid points
    assert_close(map_rows(x, h2k_ref(1)), pn.hyper.to_klein(rows(x), { from = 'hyperboloid' }), 1e-12)
    assert_close(map_rows(x, h2k_ref(1)), pn.hyper.to_klein(rows_t(x), { from = 'hyperboloid' }), 1e-12)
    assert_close(map_rows(x, h2k_ref(1)), pn.hyper.to_klein(rows(x, 'f32'), { from = 'hyperboloid' }), 1e-5)
    local k = map_rows(x, h2k_ref(1))
    assert.same({ 5, 4 }, pn.hyper.from_klein(rows(k), { to = 'hyperboloid' }):shape())
    assert_close(x, pn.hyper.from_klein(rows(k), { to = 'hyperboloid' }), 1e-12)
    assert_close(k, pn.hyper.to_klein(pn.hyper.from_klein(rows(k), { to = 'hyperboloid' }), { from = 'hyperboloid' }), 1e-12)
    for _, c in ipairs({ 0.5, 2 }) do
      local kc = ballrows(4, 3, c, 0.9)
      local h = pn.hyper.from_klein(rows(kc), { to = 'hyperboloid', c = c })
      assert_close(map_rows(kc, k2h_ref(c)), h, 1e-12)
      for _, r in ipairs(h:totable()) do assert.near(-1 / c, -r[4] * r[4] + dot(head(r), head(r)), 1e-10) end
      assert_close(kc, pn.hyper.to_klein(h, { from = 'hyperboloid', c = c }), 1e-12)
    end
  end)

  it('the models agree on distances (Klein through the hyperboloid = Poincaré dist)', function()
    local p, q = ballrows(4, 3, 1, 0.8), ballrows(4, 3, 1, 0.8)
    local hp = pn.hyper.from_klein(pn.hyper.to_klein(rows(p)), { to = 'hyperboloid' }):totable()
    local hq = pn.hyper.from_klein(pn.hyper.to_klein(rows(q)), { to = 'hyperboloid' }):totable()
    local want = {}
    for i = 1, 4 do
      local mink = dot(head(hp[i]), head(hq[i])) - hp[i][4] * hq[i][4]
      want[i] = log(-mink + sqrt(mink * mink - 1))      -- arcosh(−⟨p, q⟩_M)
    end
    assert_close(want, pn.hyper.dist(rows(p), rows(q)), 1e-10)
  end)

  it('gradcheck in f64 for all four conversions', function()
    gradcheck(function(p) return pn.hyper.to_klein(p, { c = 0.7 }) end, { leaf(ballrows(3, 3, 0.7)) })
    gradcheck(function(k) return pn.hyper.from_klein(k, { c = 0.7 }) end, { leaf(ballrows(3, 3, 0.7)) })
    gradcheck(function(k) return pn.hyper.from_klein(k, { to = 'hyperboloid', c = 2 }) end, { leaf(ballrows(3, 3, 2)) })
    local x = pn.maps.pseudopolar(rows(randrows(3, 4, 0.6))):totable()
    gradcheck(function(h) return pn.hyper.to_klein(h, { from = 'hyperboloid' }) end, { leaf(x) })
  end)
end)

describe('hyper errors', function()
  it('rejects points outside the ball, naming the op, the argument, the shape and the point', function()
    local out = rows({ { 0.1, 0.1 }, { 0.9, 0.9 } })   -- second row: ‖x‖ ≈ 1.27
    local ok = rows({ { 0.1, 0.2 }, { 0.3, 0.1 } })
    assert_error_matching(function() pn.hyper.logmap0(out) end, 'hyper.logmap0', 'x [2,2]', 'point 2', 'outside the Poincare ball')
    assert_error_matching(function() pn.hyper.dist(ok, out) end, 'hyper.dist', 'y [2,2]', 'point 2', 'outside')
    assert_error_matching(function() pn.hyper.dist(out, ok) end, 'hyper.dist', 'x [2,2]', 'outside')
    assert_error_matching(function() pn.hyper.mobius_add(out, ok) end, 'hyper.mobius_add', 'x [2,2]', 'outside')
    assert_error_matching(function() pn.hyper.to_klein(out) end, 'hyper.to_klein', 'outside')
    assert_error_matching(function() pn.hyper.logmap0(ok, 16) end, 'hyper.logmap0', 'c = 16', 'point 2', 'outside')  -- radius 1/4
    assert_error_matching(function() pn.hyper.from_klein(rows({ { 1.5, 0 } })) end, 'hyper.from_klein', 'Klein ball')
    assert_error_matching(function() pn.hyper.to_klein(rows({ { 0.5, -1 } }), { from = 'hyperboloid' }) end,
      'hyper.to_klein', 'upper sheet')
    assert_error_matching(function() pn.hyper.to_klein(rows({ { 3, 1 } }), { from = 'hyperboloid' }) end,
      'hyper.to_klein', 'upper sheet')
    assert_error_matching(function() pn.hyper.expmap0(rows({ { math.huge, 0 } })) end, 'hyper.expmap0', 'finite')
    assert_error_matching(function() pn.hyper.dist(rows({ { 0 / 0, 0 } }), ok) end, 'hyper.dist', 'outside')
  end)

  it('rejects c <= 0 in every function', function()
    local x = rows({ { 0.1, 0.2 } })
    for _, c in ipairs({ 0, -1 }) do
      assert_error_matching(function() pn.hyper.expmap0(x, c) end, 'hyper.expmap0', 'curvature', 'c = ' .. c)
      assert_error_matching(function() pn.hyper.logmap0(x, c) end, 'hyper.logmap0', 'curvature')
      assert_error_matching(function() pn.hyper.mobius_add(x, x, c) end, 'hyper.mobius_add', 'curvature')
      assert_error_matching(function() pn.hyper.dist(x, x, c) end, 'hyper.dist', 'curvature')
      assert_error_matching(function() pn.hyper.project(x, c) end, 'hyper.project', 'curvature')
      assert_error_matching(function() pn.hyper.to_klein(x, { c = c }) end, 'hyper.to_klein', 'curvature')
      assert_error_matching(function() pn.hyper.from_klein(x, { c = c }) end, 'hyper.from_klein', 'curvature')
    end
  end)

  it('rejects mismatched shapes and dtypes, unknown models', function()
    local x = rows({ { 0.1, 0.2 } })
    assert_error_matching(function() pn.hyper.dist(x, rows({ { 0.1, 0.2, 0.3 } })) end, 'hyper.dist', 'last dim')
    assert_error_matching(function() pn.hyper.dist(rows(ballrows(2, 2, 1)), rows(ballrows(3, 2, 1))) end, 'hyper.dist', 'broadcast')
    assert_error_matching(function() pn.hyper.mobius_add(x, rows({ { 0.1, 0.2 } }, 'f32')) end, 'hyper.mobius_add', 'f32')
    assert_error_matching(function() pn.hyper.project(pn.zeros({ 2, 2 }, { dtype = 'i32' })) end, 'hyper.project', 'i32')
    assert_error_matching(function() pn.hyper.to_klein(x, { from = 'halfspace' }) end, 'hyper.to_klein', 'halfspace')
    assert_error_matching(function() pn.hyper.from_klein(x, { to = 'sphere' }) end, 'hyper.from_klein', 'sphere')
    assert_error_matching(function() pn.hyper.to_klein(rows({ { 1 } }), { from = 'hyperboloid' }) end, 'hyper.to_klein', 'at least 2')
  end)
end)

describe('large inputs (the threaded row loop)', function()
  it('agree with the reference row by row, forward and backward', function()
    local n = 20000
    local x = pn.randn({ n, 3 }, { dtype = 'f64' }):mul(0.3)
    local y = pn.randn({ n, 3 }, { dtype = 'f64' }):mul(0.3)
    local px, py = pn.hyper.project(x), pn.hyper.project(y)
    local d = pn.hyper.dist(px, py):totable()
    local e = pn.maps.exp0(x):totable()
    local xt, yt = px:totable(), py:totable()
    local xr = x:totable()
    for _, i in ipairs({ 1, 2, 777, 12345, n }) do
      assert.is_true(abs(d[i] - dist_ref(xt[i], yt[i], 1)) < 1e-12)
      local want = exp0_ref()(xr[i])
      for j = 1, 3 do assert.is_true(abs(e[i][j] - want[j]) < 1e-12 * math.max(1, abs(want[j]))) end
    end
    local a = px:detach():requires_grad_()
    pn.hyper.dist(a, py):sum():backward()
    assert_finite(a.grad:narrow(1, 1, 100), 'gradient')
  end)

  it('give the same bits for 1 and 2 threads', function()
    local x = pn.randn({ 12000, 4 }, { dtype = 'f32' }):mul(0.2)
    local prev = pn.num_threads()
    local res = {}
    for k, nt in ipairs({ 1, 2 }) do
      pn.set_num_threads(nt)
      local a = x:detach():requires_grad_()
      local y = pn.maps.exp0(a)
      y:sum():backward()
      res[k] = { flatten(y:totable()), flatten(a.grad:totable()) }
    end
    pn.set_num_threads(prev)
    assert.same(res[1], res[2])
  end)
end)

describe('shapes', function()
  it('take a single point (1-D) and empty batches; dist of two points is 0-dim', function()
    local x, y = leaf({ 0.1, 0.2, 0.3 }), leaf({ -0.1, 0.4, 0 })
    local d = pn.hyper.dist(x, y)
    assert.same({}, d:shape())
    assert.near(dist_ref({ 0.1, 0.2, 0.3 }, { -0.1, 0.4, 0 }, 1), d:item(), 1e-12)
    gradcheck(function(a, b) return pn.hyper.dist(a, b) end, { x, y })
    gradcheck(function(a) return pn.maps.exp0(a) end, { x })
    assert.same({ 0 }, pn.hyper.dist(pn.zeros({ 0, 3 }, { dtype = 'f64' }), y):shape())
    assert.same({ 2, 0, 3 }, pn.maps.psi(pn.zeros({ 2, 0, 3 })):shape())
    assert.same({ 2, 4 }, pn.hyper.from_klein(pn.zeros({ 2, 3 }), { to = 'hyperboloid' }):shape())
  end)
end)
