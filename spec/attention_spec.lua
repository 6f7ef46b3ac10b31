-- Fused distance-family attention (core/attention/, lua/penumbra/ops/attention.lua).
--
-- Values of every registered score × normalize × mask (none, causal, explicit mask, bias) ×
-- aggregate against a naive reference written here from the papers' formulas in plain Lua
-- loops (coordinates, never the GEMM expansion the kernel uses); f64 finite-difference
-- gradchecks of q, k, v, the bias and the learnable scalars; causal = explicit mask;
-- weights; the Einstein midpoint; the penumbral continuity at Eq. 33; the hard points; the
-- errors. The scores come from pn.attention_variants(): a new variant is value-checked
-- once it has an entry in REF below, and gradient/consistency-checked right away.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local check = require 'spec.helpers.check'
local flatten, vals = check.flatten, check.vals
local ffi = require 'ffi'

local inf = math.huge

-- ---- small helpers --------------------------------------------------------------------------

local assert_close, assert_finite, rng = check.assert_close, check.assert_finite, check.rng
local assert_error = check.assert_error_matching

-- nested table of `shape` filled by f(rng, index-path)
local function fill(shape, f, r)
  local function rec(d, path)
    local t = {}
    for i = 1, shape[d] do
      path[d] = i
      if d == #shape then t[i] = f(r, path) else t[i] = rec(d + 1, path) end
    end
    return t
  end
  return rec(1, {})
end

-- ---- inputs on each score's manifold ---------------------------------------------------------
-- point generators: (rng, D) -> Lua array of D coordinates
local GEN = {}
function GEN.free(r, D) local x = {} for c = 1, D do x[c] = r:n() * 0.7 end return x end
function GEN.height(r, D) -- half-space: last coordinate in (0.15, 1.6)
  local x = {}
  for c = 1, D - 1 do x[c] = r:n() * 0.6 end
  x[D] = 0.15 + 1.45 * r:u()
  return x
end
function GEN.hyperboloid(r, D) -- time-like coordinate last: x_d = √(1 + ‖x₋‖²)
  local x, n2 = {}, 0
  for c = 1, D - 1 do x[c] = r:n() * 0.6; n2 = n2 + x[c] ^ 2 end
  x[D] = math.sqrt(1 + n2)
  return x
end
function GEN.ball(r, D) -- inside the unit ball (κ = 1), norm < 0.85
  local x, n2 = {}, 0
  for c = 1, D do x[c] = r:n(); n2 = n2 + x[c] ^ 2 end
  local s = 0.85 * r:u() / math.sqrt(n2 + 1e-12)
  for c = 1, D do x[c] = x[c] * s end
  return x
end
function GEN.safe(r, D) -- valid for every score here: coordinates in (0.05, 0.45)
  local x = {}
  for c = 1, D do x[c] = 0.05 + 0.4 * r:u() / math.sqrt(D / 4) end
  return x
end

local function points(shape, gen, seed)
  local r = rng(seed)
  local D = shape[#shape]
  local lead = {}
  for i = 1, #shape - 1 do lead[i] = shape[i] end
  return fill(lead, function(rr) return gen(rr, D) end, r)
end

-- ---- the naive reference (paper formulas, coordinates, f64) ------------------------------------
local function acosh(x) if x < 1 then x = 1 end return math.log(x + math.sqrt(x * x - 1)) end
local function sq(x) return x * x end

-- ‖a₋ − b₋‖ over the first D−1 coordinates, and over all
local function dist_head(a, b) local s = 0 for c = 1, #a - 1 do s = s + sq(a[c] - b[c]) end return math.sqrt(s) end
local function dist_all(a, b) local s = 0 for c = 1, #a do s = s + sq(a[c] - b[c]) end return math.sqrt(s) end
local function norm2(a) local s = 0 for c = 1, #a do s = s + a[c] ^ 2 end return s end

-- REF[name](p) -> function(q, k) → score; p holds the head's numbers (defaults applied)
local REF = {}
function REF.dot(p) return function(q, k) local s = 0 for c = 1, #q do s = s + q[c] * k[c] end return p.scale * s end end
function REF.laplacian(p) return function(q, k) return -p.gamma * dist_all(q, k) end end
function REF.umbral(p) -- Coneheads Def. 2, Eq. 8
  return function(q, k)
    local D = #q
    local z = dist_head(q, k) / (2 * math.sinh(p.r)) + (q[D] + k[D]) / 2
    return -p.gamma * math.max(q[D], k[D], z)
  end
end
function REF.penumbral(p) -- Coneheads Def. 1, Eq. 5 / Eq. 6, cone test Eq. 23
  return function(q, k)
    local D, r = #q, p.r
    local u, v = q[D], k[D]
    local x = dist_head(q, k)
    local A = math.sqrt(math.max(r * r - u * u, 0))
    local Bv = math.sqrt(math.max(r * r - v * v, 0))
    local h
    if (x - A) ^ 2 + v * v < r * r or x <= A then
      local m = (A + Bv - x) / 2
      h = math.max(u, v, math.sqrt(math.max(r * r - m * m, 0)))
    else
      h = math.sqrt(((x * x + u * u - v * v) / (2 * x)) ^ 2 + v * v)
    end
    if p.squared then return -p.gamma * h * h end
    return -p.gamma * h
  end
end
function REF.hyperbolic(p) -- Gulcehre Eq. 2 with the three distances
  return function(q, k)
    local D, d = #q, nil
    if p.model == 'hyperboloid' then
      local m = -q[D] * k[D]
      for c = 1, D - 1 do m = m + q[c] * k[c] end
      d = acosh(-m)
    elseif p.model == 'halfspace' then
      d = acosh(1 + dist_all(q, k) ^ 2 / (2 * q[D] * k[D]))
    else
      local kap = p.curvature
      d = acosh(1 + 2 * kap * dist_all(q, k) ^ 2 / ((1 - kap * norm2(q)) * (1 - kap * norm2(k)))) / math.sqrt(kap)
    end
    return -p.beta * d - p.c
  end
end

function REF.sqdist(p) return function(q, k) return -p.tau * dist_all(q, k) ^ 2 end end -- the spec-only variant

-- every score, the spec-only ones included, with its description (params, defaults) from the registry
local VARIANTS = pn.attention_variants({ all = true })

-- value of option `name` for head h (1-based): number, per-head tensor or default
local function param(o, name, h, default)
  local v = o[name]
  if v == nil then return default end
  if type(v) == 'number' then return v end
  local t = vals(v)
  return #t == 1 and t[1] or t[h]
end

-- broadcast accessor: element of nested table t (shape ts) at the user index idx
local function bget(t, ts, idx)
  local off = #idx - #ts
  local cur = t
  for d = 1, #ts do
    local i = ts[d] == 1 and 1 or idx[off + d]
    cur = cur[i]
  end
  return cur
end

-- Naive attention. q, k, v: user tensors (2-4 dims); o: the same options as pn.attention.
-- Returns the flat output (row-major, like vals()).
local function naive(q, k, v, o)
  o = o or {}
  local qs, ks, vs = q:shape(), k:shape(), v:shape()
  local nd = #qs
  local function canon(t, s) -- to 4-D nested tables
    local x = t:totable()
    if nd == 3 then
      local r = {}
      for b = 1, s[1] do r[b] = { x[b] } end
      return r
    elseif nd == 2 then
      return { { x } }
    end
    return x
  end
  local Q, K, V = canon(q, qs), canon(k, ks), canon(v, vs)
  local B, H = #Q, #Q[1]
  local Nq, Nk, D, Dv = qs[nd - 1], ks[nd - 1], qs[nd], vs[nd]
  local off = Nk - Nq
  local name = o.score or 'dot'
  local mask, maskS = o.mask and o.mask:totable(), o.mask and o.mask:shape()
  local bias, biasS = o.bias and o.bias:totable(), o.bias and o.bias:shape()
  local norm = o.normalize or 'softmax'
  local einstein = o.aggregate == 'einstein'
  local out = {}
  for b = 1, B do
    for h = 1, H do
      -- the head's numbers: each parameter of the score's description, given or its default
      local p = { model = o.model or 'hyperboloid', squared = o.squared }
      for _, pd in ipairs(VARIANTS[name].params) do
        p[pd.name] = param(o, pd.name, h, pd.default or 1 / math.sqrt(D)) -- default_rule: 1/√D
      end
      local f = REF[name](p)
      local kap = param(o, 'curvature', h, 1)
      for i = 1, Nq do
        local idx = nd == 4 and { b, h, i } or (nd == 3 and { b, i } or { i })
        local w, allowed = {}, {}
        for j = 1, Nk do
          idx[#idx + 1] = j
          local s = f(Q[b][h][i], K[b][h][j])
          if bias then s = s + bget(bias, biasS, idx) end
          if o.alibi then s = s - 2 ^ (-8 * h / H) * (i + off - j) end
          local ok = true
          if mask and bget(mask, maskS, idx) == 0 then ok = false end
          if o.causal and j > i + off then ok = false end
          idx[#idx] = nil
          w[j], allowed[j] = s, ok
        end
        -- weights
        if norm == 'softmax' then
          local m = -inf
          for j = 1, Nk do if allowed[j] and w[j] > m then m = w[j] end end
          local z = 0
          for j = 1, Nk do w[j] = allowed[j] and math.exp(w[j] - m) or 0; z = z + w[j] end
          if not einstein then for j = 1, Nk do w[j] = z > 0 and w[j] / z or 0 end end
        else
          local z = 0
          for j = 1, Nk do w[j] = allowed[j] and 1 / (1 + math.exp(-w[j])) or 0; z = z + w[j] end
          if norm == 'sigmoid_normalized' and not einstein then
            for j = 1, Nk do w[j] = z > 0 and w[j] / z or 0 end
          end
        end
        if einstein then -- Gulcehre Eq. 3: Σ α γ v / Σ α γ, γ = 1/√(1 − κ‖v‖²)
          local z = 0
          for j = 1, Nk do w[j] = w[j] / math.sqrt(1 - kap * norm2(V[b][h][j])); z = z + w[j] end
          for j = 1, Nk do w[j] = z > 0 and w[j] / z or 0 end
        end
        for c = 1, Dv do
          local acc = 0
          for j = 1, Nk do acc = acc + w[j] * V[b][h][j][c] end
          out[#out + 1] = acc
        end
      end
    end
  end
  return out
end

-- ---- the cases: every registered dense score, on its manifold ---------------------------------
-- cases(name) -> list of { label, gen, opts } (a variant without an entry runs on GEN.safe)
local CASES = {
  dot = { { 'dot', GEN.free, { scale = 0.7 } }, { 'dot default scale', GEN.free, {} } },
  laplacian = { { 'laplacian', GEN.free, { gamma = 0.8 } } },
  umbral = { { 'umbral', GEN.height, { gamma = 1.3, r = 0.4 } } },
  penumbral = { { 'penumbral', GEN.height, { gamma = 1.1, r = 1 } },
                { 'penumbral squared', GEN.height, { gamma = 0.9, r = 1.2, squared = true } } },
  hyperbolic = { { 'hyperboloid', GEN.hyperboloid, { model = 'hyperboloid', beta = 0.9, c = 0.2 } },
                 { 'halfspace', GEN.height, { model = 'halfspace', beta = 1.2, c = -0.1 } },
                 { 'poincare', GEN.ball, { model = 'poincare', beta = 0.8, c = 0.1, curvature = 1.3 } } },
}
-- a score without an entry runs on generic inputs with each parameter 1.1× its default (so a
-- value other than the default is exercised, and becomes learnable in the gradchecks)
local function cases_of(name)
  if CASES[name] then return CASES[name] end
  local opts = {}
  for _, pd in ipairs(VARIANTS[name].params) do if pd.default then opts[pd.name] = pd.default * 1.1 end end
  return { { name .. ' (generic inputs)', GEN.safe, opts } }
end
-- poincare with curvature 1.3: points must lie in the ball of radius 1/√1.3
local function gen_for(case)
  if case[3].model == 'poincare' then
    return function(r, D)
      local x = GEN.ball(r, D)
      for c = 1, D do x[c] = x[c] / math.sqrt(case[3].curvature) end
      return x
    end
  end
  return case[2]
end

local function merge(a, b)
  local r = {}
  for kk, vv in pairs(a) do r[kk] = vv end
  for kk, vv in pairs(b or {}) do r[kk] = vv end
  return r
end

local DENSE = {}
for _, name in ipairs(VARIANTS) do
  if not VARIANTS[name].graph_only then DENSE[#DENSE + 1] = name end
end

local NORMS = { 'softmax', 'sigmoid', 'sigmoid_normalized' }
local MASKS = { 'none', 'causal', 'mask', 'bias' }

-- q, k, v tensors of the given dtype for shapes (user dims)
local function make_qkv(case, qshape, kshape, vshape, dtype, seed)
  local g = gen_for(case)
  local q = pn.tensor(points(qshape, g, seed), { dtype = dtype })
  local k = pn.tensor(points(kshape, g, seed + 1), { dtype = dtype })
  local r = rng(seed + 2)
  local v = pn.tensor(fill(vshape, function(rr) return (rr:u() - 0.5) * 0.7 end, r), { dtype = dtype })
  return q, k, v
end

-- the mask / bias option for a mode, broadcast over the batch (user dims nd)
local function mask_opts(mode, nd, Nq, Nk, dtype, seed)
  local r = rng(seed)
  if mode == 'causal' then return { causal = true } end
  if mode == 'mask' then
    local shape = nd == 4 and { 1, 1, Nq, Nk } or { Nq, Nk }
    local m = fill(shape, function(rr, path)
      local j = path[#path]
      return (j == 1 or rr:u() > 0.35) and 1 or 0 -- key 1 always visible
    end, r)
    return { mask = pn.tensor(m, { dtype = 'u8' }) }
  end
  if mode == 'bias' then
    local shape = nd == 4 and { 2, 1, Nq, Nk } or { Nq, Nk }
    if nd == 3 then shape = { 1, Nq, Nk } end
    return { bias = pn.tensor(fill(shape, function(rr) return rr:n() * 0.5 end, r), { dtype = dtype }) }
  end
  return {}
end

-- ---- specs -----------------------------------------------------------------------------------------
describe('attention values against the naive reference', function()
  -- shapes cycle through 4-D, 3-D and 2-D inputs, Nq ≠ Nk and Dv ≠ D; in f32 the first takes the
  -- microkernel (Nq > 8), the others the forward for few query rows (dense_mk.h's PN_FEW_ROWS)
  local SHAPES = {
    { { 2, 2, 11, 4 }, { 2, 2, 13, 4 }, { 2, 2, 13, 3 } },
    { { 2, 6, 3 }, { 2, 4, 3 }, { 2, 4, 5 } },
    { { 6, 4 }, { 6, 4 }, { 6, 2 } },
  }
  for _, name in ipairs(DENSE) do
    for ci, case in ipairs(cases_of(name)) do
      for ni, norm in ipairs(NORMS) do
        it(case[1] .. ' / ' .. norm .. ': every mask mode and aggregate, f64 to 1e-10 and f32 to 1e-5', function()
          if not REF[name] then pending('no naive reference for ' .. name) return end
          local n = 0
          for mi, mode in ipairs(MASKS) do
            for _, agg in ipairs({ 'sum', 'einstein' }) do
              local sh = SHAPES[(mi + ni + ci) % #SHAPES + 1]
              local nd = #sh[1]
              for _, dtype in ipairs({ 'f64', 'f32' }) do
                local seed = mi * 100 + ni * 10 + ci
                local q, k, v = make_qkv(case, sh[1], sh[2], sh[3], dtype, seed)
                local opts = merge(case[3], mask_opts(mode, nd, sh[1][nd - 1], sh[2][nd - 1], dtype, seed))
                opts.score, opts.normalize = name, norm
                if agg == 'einstein' then opts.aggregate = 'einstein' end
                local got = vals(pn.attention(q, k, v, opts))
                local ref = naive(q, k, v, opts)
                assert_close(got, ref, dtype == 'f64' and 1e-10 or 1e-5,
                  string.format('%s %s %s %s %s', case[1], norm, mode, agg, dtype))
                n = n + 1
              end
            end
          end
          assert.equal(#MASKS * 2 * 2, n)
        end)
      end
    end
  end

  -- the kernel's tiles are 64 query rows × 256 keys (core/attention/attention.h): these sizes
  -- cross several of both, with partial tiles and causal diagonals that cut key tiles
  it('multi-tile sizes (several query and key tiles, causal diagonal tiles, Nq ≠ Nk) for every score', function()
    for _, name in ipairs(DENSE) do
      if REF[name] then
        local case = cases_of(name)[1]
        for _, causal in ipairs({ false, true }) do
          local q, k, v = make_qkv(case, { 1, 1, 140, 3 }, { 1, 1, 600, 3 }, { 1, 1, 600, 2 }, 'f64', 7)
          local opts = merge(case[3], { score = name, causal = causal })
          assert_close(vals(pn.attention(q, k, v, opts)), naive(q, k, v, opts), 1e-10, name .. ' multi-tile')
        end
      end
    end
  end)

  -- f32 calls with at most 8 query rows (PN_FEW_ROWS: a decoding step's one row per head) read
  -- K and V in place instead of packing them for the microkernel; the last rows of a causal
  -- call see the same keys, so they must come out the same from either path
  it('a call with few query rows (a decoding step) equals those rows of a larger call, f32', function()
    for _, name in ipairs(DENSE) do
      for _, case in ipairs(cases_of(name)) do
        for ni, norm in ipairs(NORMS) do
          local q, k, v = make_qkv(case, { 2, 3, 12, 5 }, { 2, 3, 20, 5 }, { 2, 3, 20, 4 }, 'f32', 60 + ni)
          local opts = merge(case[3], { score = name, normalize = norm, causal = true })
          if ni == 2 then opts.aggregate = 'einstein' end
          local full = pn.attention(q, k, v, opts)
          for _, n in ipairs({ 1, 2, 8 }) do
            local got = pn.attention(q:narrow(3, 12 - n + 1, n), k, v, opts)
            assert.same({ 2, 3, n, 4 }, got:shape())
            assert_close(vals(got), vals(full:narrow(3, 12 - n + 1, n)), 1e-5,
              string.format('%s %s %d rows', case[1], norm, n))
          end
        end
      end
    end
  end)

  it('non-contiguous inputs give the same result as contiguous ones', function()
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      local q, k, v = make_qkv(case, { 2, 3, 5, 4 }, { 2, 3, 6, 4 }, { 2, 3, 6, 3 }, 'f64', 3)
      -- the same values behind transposed views
      local qt = q:transpose(2, 3):contiguous():transpose(2, 3)
      local kt = k:transpose(1, 2):contiguous():transpose(1, 2)
      local vt = v:transpose(3, 4):contiguous():transpose(3, 4)
      assert.is_false(qt:is_contiguous())
      local opts = merge(case[3], { score = name })
      assert_close(vals(pn.attention(qt, kt, vt, opts)), vals(pn.attention(q, k, v, opts)), 1e-14, name)
    end
  end)

  -- the front end copies strided inputs once and the backward reads those copies: each
  -- gradient must still land on its own input, for the output and for the weights
  it('non-contiguous inputs get the same gradients as contiguous ones', function()
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      local opts = merge(case[3], { score = name })
      local function grads(strided, weights)
        local q, k, v = make_qkv(case, { 2, 3, 5, 4 }, { 2, 3, 6, 4 }, { 2, 3, 6, 4 }, 'f64', 3)
        -- leaves in a transposed layout, handed to attention as transposed (strided) views
        local ql, kl, vl = q, k, v
        if strided then
          ql, kl, vl = q:transpose(2, 3):contiguous(), k:transpose(1, 2):contiguous(), v:transpose(3, 4):contiguous()
        end
        ql:requires_grad_(); kl:requires_grad_(); vl:requires_grad_()
        local qa, ka, va = ql, kl, vl
        if strided then qa, ka, va = ql:transpose(2, 3), kl:transpose(1, 2), vl:transpose(3, 4) end
        local out = weights and pn.attention_weights(qa, ka, opts) or pn.attention(qa, ka, va, opts)
        -- a weighting that tells the rows and columns apart
        local w = pn.arange(out:numel(), { dtype = 'f64' }):view(out:shape()):sin();
        (out * w):sum():backward()
        local g = { ql.grad, kl.grad, not weights and vl.grad or nil }
        if strided then g = { g[1]:transpose(2, 3), g[2]:transpose(1, 2), g[3] and g[3]:transpose(3, 4) } end
        return g
      end
      for _, weights in ipairs({ false, true }) do
        local a, b = grads(true, weights), grads(false, weights)
        for i = 1, weights and 2 or 3 do
          assert_close(vals(a[i]), vals(b[i]), 1e-12, name .. (weights and ' weights' or '') .. ' input ' .. i)
        end
      end
    end
  end)

  -- heads split from a projection: q, k, v, the output and its gradient live in (B, N, H, X)
  -- buffers seen as (B, H, N, X). The CPU kernel reads and writes them through their strides
  -- (no copies in or out): the same numbers as from contiguous inputs, to the bit, on the
  -- microkernel (f32, many rows: tiles of queries and of 256 keys, 70 × 300 crosses both) and the
  -- few-rows path (3 rows), BLAS in f64, for every score, with the causal cut and a mask
  it('split heads ((B, N, H, X) in memory) are read and written in place, bit for bit', function()
    local function split(x) return x:transpose(2, 3):contiguous():transpose(2, 3) end
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      for _, dtype in ipairs({ 'f32', 'f64' }) do
        for _, nq in ipairs({ 70, 3 }) do
          local nk = nq == 3 and 9 or 300
          local q0, k0, v0 = make_qkv(case, { 2, 3, nq, 5 }, { 2, 3, nk, 5 }, { 2, 3, nk, 3 }, dtype, 17)
          local mask = pn.tensor(fill({ 2, 1, nq, nk }, function(rr) return rr:u() < 0.8 and 1 or 0 end, rng(5)),
            { dtype = 'u8' })
          for _, mopt in ipairs({ { causal = true }, { mask = mask } }) do
            local opts = merge(merge(case[3], { score = name }), mopt)
            local what = string.format('%s %s Nq=%d %s', name, dtype, nq, mopt.causal and 'causal' or 'mask')
            local function run(layout)
              local q, k, v = q0:clone(), k0:clone(), v0:clone()
              if layout then q, k, v = split(q), split(k), split(v) end
              q:requires_grad_(true); k:requires_grad_(true); v:requires_grad_(true)
              local out = pn.attention(q, k, v, opts)
              local w = pn.arange(out:numel(), { dtype = dtype }):view(out:shape()):sin()
              if layout then w = split(w) end -- the output gradient in the split layout too
              out:backward(w)
              return out, q.grad, k.grad, v.grad
            end
            local o1, dq1, dk1, dv1 = run(true)
            local o2, dq2, dk2, dv2 = run(false)
            -- the output lands in q's layout: merging the heads back is a view
            assert.is_true(o1:transpose(2, 3):is_contiguous(), what .. ': output in (B, N, H, Dv) order')
            assert_close(vals(o1), vals(o2), 0, what .. ' out')
            assert_close(vals(dq1), vals(dq2), 0, what .. ' dq')
            assert_close(vals(dk1), vals(dk2), 0, what .. ' dk')
            assert_close(vals(dv1), vals(dv2), 0, what .. ' dv')
          end
        end
      end
      -- the weights read the split q and k in place too
      local q0, k0 = make_qkv(case, { 2, 3, 70, 5 }, { 2, 3, 300, 5 }, { 2, 3, 300, 3 }, 'f32', 23)
      local opts = merge(case[3], { score = name })
      assert_close(vals(pn.attention_weights(split(q0), split(k0), opts)), vals(pn.attention_weights(q0, k0, opts)), 0,
        name .. ' weights')
    end
  end)

  it('ALiBi equals its bias −m_h·(i − j) with m_h = 2^(−8h/H)', function()
    local case = cases_of('dot')[1]
    for _, dtype in ipairs({ 'f64', 'f32' }) do
      local q, k, v = make_qkv(case, { 2, 4, 6, 4 }, { 2, 4, 8, 4 }, { 2, 4, 8, 3 }, dtype, 11)
      local opts = { score = 'dot', causal = true, alibi = true }
      assert_close(vals(pn.attention(q, k, v, opts)), naive(q, k, v, opts), dtype == 'f64' and 1e-10 or 1e-5, 'alibi')
    end
  end)

  it('learnable per-head scalars give the same values as numbers', function()
    local case = cases_of('umbral')[1]
    local q, k, v = make_qkv(case, { 1, 2, 4, 3 }, { 1, 2, 5, 3 }, { 1, 2, 5, 2 }, 'f64', 5)
    local opts = { score = 'umbral', gamma = pn.tensor({ 0.7, 1.4 }, { dtype = 'f64' }), r = pn.tensor(0.3, { dtype = 'f64' }) }
    assert_close(vals(pn.attention(q, k, v, opts)), naive(q, k, v, opts), 1e-10, 'per-head gamma')
  end)
end)

describe('attention gradients (f64 finite differences)', function()
  for _, name in ipairs(DENSE) do
    for ci, case in ipairs(cases_of(name)) do
      for ni, norm in ipairs(NORMS) do
        it(case[1] .. ' / ' .. norm .. ': q, k, v, bias and learnable scalars', function()
          local mode = MASKS[(ci + ni) % #MASKS + 1]
          local agg = (ci + ni) % 2 == 0 and 'einstein' or nil
          local q, k, v = make_qkv(case, { 2, 2, 3, 3 }, { 2, 2, 4, 3 }, { 2, 2, 4, 2 }, 'f64', ci * 10 + ni)
          q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
          local opts = merge(case[3], mask_opts(mode, 4, 3, 4, 'f64', ni))
          opts.score, opts.normalize, opts.aggregate = name, norm, agg
          local inputs = { q, k, v }
          if opts.bias then opts.bias:requires_grad_(); inputs[#inputs + 1] = opts.bias end
          -- the score's scalars as learnable tensors (one per head for the first)
          local first = true
          local pnames = {}
          for _, pd in ipairs(VARIANTS[name].params) do pnames[#pnames + 1] = pd.name end
          if agg == 'einstein' and not VARIANTS[name].params.curvature then pnames[#pnames + 1] = 'curvature' end
          for _, pname in ipairs(pnames) do
            local val = opts[pname]
            if type(val) == 'number' then
              local t = first and pn.tensor({ val, val * 1.1 }, { dtype = 'f64' }) or pn.tensor(val, { dtype = 'f64' })
              first = false
              opts[pname] = t:requires_grad_()
              inputs[#inputs + 1] = t
            end
          end
          gradcheck(function() return pn.attention(q, k, v, opts) end, inputs, { atol = 1e-6, rtol = 1e-5 })
        end)
      end
    end
  end

  it('the Einstein midpoint carries a gradient into a learnable curvature', function()
    local case = cases_of('dot')[1]
    local q, k, v = make_qkv(case, { 1, 2, 3, 3 }, { 1, 2, 4, 3 }, { 1, 2, 4, 2 }, 'f64', 9)
    local kap = pn.tensor({ 1.2, 0.8 }, { dtype = 'f64' }):requires_grad_()
    v:requires_grad_()
    gradcheck(function() return pn.attention(q, k, v, { aggregate = 'einstein', curvature = kap }) end, { v, kap })
  end)

  -- the weights themselves are differentiable (attention regularisers, heatmap analyses)
  for _, name in ipairs(DENSE) do
    local case = cases_of(name)[1]
    for ni, norm in ipairs(NORMS) do
      it('attention_weights ' .. case[1] .. ' / ' .. norm .. ': q, k, bias and learnable scalars', function()
        local mode = MASKS[ni % #MASKS + 1]
        local q, k = make_qkv(case, { 2, 2, 3, 3 }, { 2, 2, 4, 3 }, { 2, 2, 4, 2 }, 'f64', 70 + ni)
        q:requires_grad_(); k:requires_grad_()
        local opts = merge(case[3], mask_opts(mode, 4, 3, 4, 'f64', ni))
        opts.score, opts.normalize = name, norm
        local inputs = { q, k }
        if opts.bias then opts.bias:requires_grad_(); inputs[#inputs + 1] = opts.bias end
        for _, pd in ipairs(VARIANTS[name].params) do
          local val = opts[pd.name]
          if type(val) == 'number' then
            opts[pd.name] = pn.tensor({ val, val * 1.1 }, { dtype = 'f64' }):requires_grad_()
            inputs[#inputs + 1] = opts[pd.name]
          end
        end
        gradcheck(function() return pn.attention_weights(q, k, opts) end, inputs, { atol = 1e-6, rtol = 1e-5 })
      end)
    end
  end

  it('attention_weights: the gradient equals the one through attention with v = I, over many tiles', function()
    -- W = attention(q, k, I): two forms of the same function must give the same q, k gradients
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      for _, causal in ipairs({ false, true }) do
        local Nq, Nk = 70, 140
        local q, k = make_qkv(case, { 1, 2, Nq, 3 }, { 1, 2, Nk, 3 }, { 1, 2, Nk, 2 }, 'f64', 77)
        local opts = merge(case[3], { score = name, causal = causal })
        local rows = {}
        for j = 1, Nk do rows[j] = {} for c2 = 1, Nk do rows[j][c2] = j == c2 and 1 or 0 end end
        local eye = pn.tensor({ { rows, rows } }, { dtype = 'f64' })
        local c = pn.randn({ 1, 2, Nq, Nk }, { dtype = 'f64' })
        local grads = {}
        for form = 1, 2 do
          local qq, kk = q:clone():requires_grad_(), k:clone():requires_grad_()
          local w = form == 1 and pn.attention_weights(qq, kk, opts) or pn.attention(qq, kk, eye, opts)
          ;(w * c):sum():backward()
          grads[form] = { vals(qq.grad), vals(kk.grad) }
        end
        assert_close(grads[1][1], grads[2][1], 1e-10, name .. ' dq')
        assert_close(grads[1][2], grads[2][2], 1e-10, name .. ' dk')
      end
    end
  end)

  it('a broadcast bias gets its gradient summed to its own shape', function()
    local case = cases_of('laplacian')[1]
    local q, k, v = make_qkv(case, { 2, 2, 3, 3 }, { 2, 2, 4, 3 }, { 2, 2, 4, 2 }, 'f64', 21)
    for _, shape in ipairs({ { 2, 3, 4 }, { 4 }, { 2, 1, 1, 4 }, { 1, 1, 3, 1 } }) do
      local r = rng(#shape)
      local bias = pn.tensor(fill(shape, function(rr) return rr:n() end, r), { dtype = 'f64' }):requires_grad_()
      gradcheck(function() return pn.attention(q, k, v, { score = 'laplacian', bias = bias }) end, { bias })
      assert.same(shape, bias.grad:shape())
    end
  end)

  it('multi-tile backward matches directional finite differences', function()
    -- ⟨∇L, e⟩ against (L(x + εe) − L(x − εe)) / 2ε for a random direction e over q, k, v
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      for _, causal in ipairs({ false, true }) do
        local q, k, v = make_qkv(case, { 1, 1, 130, 3 }, { 1, 1, 540, 3 }, { 1, 1, 540, 2 }, 'f64', 31)
        local opts = merge(case[3], { score = name, causal = causal })
        local w = pn.randn({ 1, 1, 130, 2 }, { dtype = 'f64' })
        for _, x in ipairs({ q, k, v }) do x:requires_grad_() end
        local L = (pn.attention(q, k, v, opts) * w):sum()
        L:backward()
        local eps, ana = 1e-6, 0
        local dirs = {}
        for i, x in ipairs({ q, k, v }) do
          local e = pn.randn(x:shape(), { dtype = 'f64' }) * 0.1
          dirs[i] = e
          local gx, ex = vals(x.grad), vals(e)
          for j = 1, #gx do ana = ana + gx[j] * ex[j] end
        end
        local function at(sign)
          return pn.no_grad(function()
            local qq, kk, vv = q + dirs[1] * (sign * eps), k + dirs[2] * (sign * eps), v + dirs[3] * (sign * eps)
            return (pn.attention(qq, kk, vv, opts) * w):sum():item()
          end)
        end
        local num = (at(1) - at(-1)) / (2 * eps)
        assert.is_true(math.abs(num - ana) <= 1e-6 * (1 + math.abs(num)),
          string.format('%s causal=%s: analytic %.12g numeric %.12g', name, tostring(causal), ana, num))
      end
    end
  end)
end)

describe('attention consistency', function()
  it('causal equals the explicit lower-triangular mask (values and gradients, Nq ≠ Nk)', function()
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      local Nq, Nk = 4, 6
      local m = {}
      for i = 1, Nq do
        m[i] = {}
        for j = 1, Nk do m[i][j] = j <= i + (Nk - Nq) and 1 or 0 end
      end
      local mask = pn.tensor(m, { dtype = 'u8' })
      local q, k, v = make_qkv(case, { 1, 2, Nq, 3 }, { 1, 2, Nk, 3 }, { 1, 2, Nk, 2 }, 'f64', 41)
      local res = {}
      for mi, o in ipairs({ { causal = true }, { mask = mask } }) do
        local qq, kk, vv = q:detach():clone():requires_grad_(), k:detach():clone():requires_grad_(),
          v:detach():clone():requires_grad_()
        local out = pn.attention(qq, kk, vv, merge(case[3], merge(o, { score = name })))
        out:sum():backward()
        res[mi] = { vals(out), vals(qq.grad), vals(kk.grad), vals(vv.grad) }
      end
      for j = 1, 4 do assert_close(res[1][j], res[2][j], 1e-12, name .. ' causal vs mask ' .. j) end
    end
  end)

  it('attention_weights: softmax rows sum to one, weights match the naive ones and weights·v = attention', function()
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      local q, k, v = make_qkv(case, { 2, 2, 4, 3 }, { 2, 2, 5, 3 }, { 2, 2, 5, 2 }, 'f64', 51)
      for _, norm in ipairs(NORMS) do
        local opts = merge(case[3], { score = name, normalize = norm, causal = true })
        local w = pn.attention_weights(q, k, opts)
        assert.same({ 2, 2, 4, 5 }, w:shape())
        local wt = w:totable()
        if norm == 'softmax' then
          for b = 1, 2 do for h = 1, 2 do for i = 1, 4 do
            local s = 0
            for j = 1, 5 do s = s + wt[b][h][i][j] end
            assert.is_true(math.abs(s - 1) < 1e-12, name .. ' row sum ' .. s)
          end end end
        end
        assert_close(vals(w:matmul(v)), vals(pn.attention(q, k, v, opts)), 1e-12, name .. ' ' .. norm .. ' w·v')
        -- identity v: the naive output is the weights themselves
        local eye = {}
        for b = 1, 2 do eye[b] = {} for h = 1, 2 do eye[b][h] = {} for j = 1, 5 do
          eye[b][h][j] = {}
          for c = 1, 5 do eye[b][h][j][c] = j == c and 1 or 0 end
        end end end
        assert_close(vals(w), naive(q, k, pn.tensor(eye, { dtype = 'f64' }), opts), 1e-10, name .. ' weights')
      end
    end
  end)

  it('the Einstein midpoint of identical points is that point', function()
    local case = cases_of('dot')[1]
    local q, k = make_qkv(case, { 1, 2, 3, 4 }, { 1, 2, 5, 4 }, { 1, 2, 5, 3 }, 'f64', 61)
    local p = { 0.3, -0.2, 0.4 }
    local vv = {}
    for h = 1, 2 do vv[h] = {} for j = 1, 5 do vv[h][j] = { p[1], p[2], p[3] } end end
    local v = pn.tensor({ vv }, { dtype = 'f64' })
    for _, norm in ipairs(NORMS) do
      local out = vals(pn.attention(q, k, v, { aggregate = 'einstein', normalize = norm }))
      for i = 1, #out do assert.is_true(math.abs(out[i] - p[(i - 1) % 3 + 1]) < 1e-12, norm .. ' midpoint') end
    end
  end)

  it('a fully masked row gives output 0 and zero gradients', function()
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      for _, norm in ipairs(NORMS) do
        local q, k, v = make_qkv(case, { 3, 3 }, { 4, 3 }, { 4, 2 }, 'f64', 71)
        q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
        local mask = pn.tensor({ { 1, 1, 0, 1 }, { 0, 0, 0, 0 }, { 1, 0, 1, 1 } }, { dtype = 'u8' })
        local out = pn.attention(q, k, v, merge(case[3], { score = name, normalize = norm, mask = mask }))
        local o = out:totable()
        assert.same({ 0, 0 }, o[2])
        out:sum():backward()
        assert.same({ 0, 0, 0 }, q.grad:totable()[2])
        assert_finite(vals(k.grad), name .. ' k.grad')
      end
      -- causal with Nq > Nk: the first rows see no key
      local q, k, v = make_qkv(case, { 5, 3 }, { 3, 3 }, { 3, 2 }, 'f64', 72)
      local o = pn.attention(q, k, v, merge(case[3], { score = name, causal = true })):totable()
      assert.same({ 0, 0 }, o[1])
      assert.same({ 0, 0 }, o[2])
      assert.are_not.same({ 0, 0 }, o[3])
    end
  end)

  it('is deterministic: the same call twice gives bitwise equal values and gradients; 1 thread agrees', function()
    local case = cases_of('penumbral')[1]
    local function run()
      local q, k, v = make_qkv(case, { 1, 1, 200, 4 }, { 1, 1, 300, 4 }, { 1, 1, 300, 3 }, 'f32', 91)
      local bias = pn.tensor(fill({ 300 }, function(rr) return rr:n() end, rng(3)), { dtype = 'f32' })
      q:requires_grad_(); k:requires_grad_(); v:requires_grad_(); bias:requires_grad_()
      local out = pn.attention(q, k, v, { score = 'penumbral', bias = bias })
      out:backward(pn.ones(out:shape()))
      return { vals(out), vals(q.grad), vals(k.grad), vals(v.grad), vals(bias.grad) }
    end
    local a, b = run(), run()
    for i = 1, #a do assert.same(a[i], b[i]) end
    local nt = pn.num_threads()
    pn.set_num_threads(1)
    local ok, c = pcall(run)
    pn.set_num_threads(nt)
    assert.is_true(ok, tostring(c))
    for i = 1, #a do assert_close(c[i], a[i], 1e-4, 'one thread, part ' .. i) end
  end)

  it('frees everything it allocates (tensors, bytes, autograd nodes), error paths included', function()
    collectgarbage('collect'); collectgarbage('collect')
    local t0, b0, n0 = pn.live_tensors(), pn.live_bytes(), pn.live_nodes()
    do
      local case = cases_of('umbral')[1]
      local q, k, v = make_qkv(case, { 2, 2, 70, 3 }, { 2, 2, 300, 3 }, { 2, 2, 300, 2 }, 'f64', 95)
      q:requires_grad_(); v:requires_grad_()
      local gamma = pn.tensor({ 1, 2 }, { dtype = 'f64' }):requires_grad_()
      local bias = pn.randn({ 2, 1, 70, 300 }, { dtype = 'f64' }):requires_grad_()
      local opts = { score = 'umbral', gamma = gamma, bias = bias, causal = true, aggregate = 'einstein' }
      pn.attention(q, k, v, opts):sum():backward()
      local kept = pn.attention(q, k, v, opts) -- a graph dropped without backward
      pn.attention_weights(q, k, opts)
      pcall(pn.attention, q, k, v * 10, opts)
      pcall(pn.attention, q, -k, v, opts)
    end
    collectgarbage('collect'); collectgarbage('collect')
    assert.equal(t0, pn.live_tensors())
    assert.equal(b0, pn.live_bytes())
    assert.equal(n0, pn.live_nodes())
  end)

  it('f32 agrees with f64 on multi-tile sizes', function()
    for _, name in ipairs(DENSE) do
      local case = cases_of(name)[1]
      for _, norm in ipairs(NORMS) do
        local q, k, v = make_qkv(case, { 1, 2, 130, 6 }, { 1, 2, 300, 6 }, { 1, 2, 300, 5 }, 'f64', 81)
        local opts = merge(case[3], { score = name, normalize = norm })
        local r64 = vals(pn.attention(q, k, v, opts))
        local r32 = vals(pn.attention(q:to('f32'), k:to('f32'), v:to('f32'), opts))
        assert_close(r32, r64, 2e-5, name .. ' ' .. norm .. ' f32 vs f64')
      end
    end
  end)
end)

describe('attention numerics at the hard points', function()
  -- one query / key pair at a time through sigmoid weights: σ(s) recovers the score s
  local function score_of(q, k, opts)
    local dt = q:dtype()
    local o = merge(opts, { normalize = 'sigmoid' })
    local v = pn.ones({ 1, 1 }, { dtype = dt })
    local w = pn.attention(q, k, v, o):item()
    return math.log(w / (1 - w))
  end

  it('penumbral is continuous across the cone boundary (Eq. 33): both branches give −γ·r', function()
    local r, gamma = 1.0, 1.0
    for _, hv in ipairs({ { 0.3, 0.5 }, { 0.7, 0.2 }, { 0.5, 0.9 } }) do
      local u, w = hv[1], hv[2]
      local A, Bv = math.sqrt(r * r - u * u), math.sqrt(r * r - w * w)
      local x0 = A + Bv -- (x − A)² + w² = r² with x > A: the boundary
      local below, above
      for side, f in ipairs({ 1 - 1e-9, 1 + 1e-9 }) do
        local q = pn.tensor({ { 0, 0, u } }, { dtype = 'f64' })
        local k = pn.tensor({ { x0 * f, 0, w } }, { dtype = 'f64' })
        local s = score_of(q, k, { score = 'penumbral', r = r, gamma = gamma })
        if side == 1 then below = s else above = s end
        -- the reference picks the branch by Eq. 23: inside just below, outside just above
        local ref = REF.penumbral({ r = r, gamma = gamma })({ 0, 0, u }, { x0 * f, 0, w })
        assert.is_true(math.abs(s - ref) < 1e-7, 'branch value')
      end
      assert.is_true(math.abs(below - (-gamma * r)) < 1e-6, 'inside at the boundary: ' .. below)
      assert.is_true(math.abs(above - (-gamma * r)) < 1e-6, 'outside at the boundary: ' .. above)
    end
  end)

  it('values and gradients stay finite at q = k, on the horosphere, above it, at arcosh(1) and near the ball boundary', function()
    local function check(name, opts, qv, kv, dtype)
      local q = pn.tensor({ qv, kv }, { dtype = dtype }):requires_grad_()
      local k = pn.tensor({ kv, qv }, { dtype = dtype }):requires_grad_()
      local v = pn.tensor({ { 0.3, -0.1 }, { 0.2, 0.4 } }, { dtype = dtype }):requires_grad_()
      for _, norm in ipairs(NORMS) do
        local out = pn.attention(q, k, v, merge(opts, { score = name, normalize = norm }))
        assert_finite(vals(out), name .. ' value')
        out:sum():backward()
        assert_finite(vals(q.grad), name .. ' q.grad')
        assert_finite(vals(k.grad), name .. ' k.grad')
        assert_finite(vals(v.grad), name .. ' v.grad')
        q:zero_grad(); k:zero_grad(); v:zero_grad()
      end
    end
    for _, dtype in ipairs({ 'f64', 'f32' }) do
      check('laplacian', {}, { 0.3, 0.2, 0.5 }, { 0.3, 0.2, 0.5 }, dtype)          -- q = k
      check('umbral', {}, { 0.3, 0.2, 0.5 }, { 0.3, 0.2, 0.5 }, dtype)
      check('umbral', {}, { 0.3, 0.2, 0.5 }, { 0.3, 0.2, 0.9 }, dtype)             -- q₋ = k₋
      check('penumbral', {}, { 0.3, 0.2, 0.5 }, { 0.3, 0.2, 0.5 }, dtype)
      check('penumbral', {}, { 0.3, 0.2, 1.0 }, { 0.1, 0.2, 1.0 }, dtype)          -- on the horosphere r
      check('penumbral', {}, { 0.3, 0.2, 1.7 }, { 0.3, 0.2, 2.5 }, dtype)          -- above it, q₋ = k₋
      check('penumbral', { squared = true }, { 0.3, 0.2, 1.7 }, { -2.3, 0.2, 0.4 }, dtype)
      local hx = { 0.3, 0.4, math.sqrt(1 + 0.25) }
      check('hyperbolic', {}, hx, hx, dtype)                                       -- arcosh(1)
      check('hyperbolic', { model = 'halfspace' }, { 0.3, 0.2, 0.5 }, { 0.3, 0.2, 0.5 }, dtype)
      check('hyperbolic', { model = 'poincare' }, { 0.6, 0.0, 0.0 }, { 0.6, 0.0, 0.0 }, dtype)
      local edge = dtype == 'f64' and 1 - 1e-9 or 1 - 1e-4
      check('hyperbolic', { model = 'poincare' }, { edge, 0, 0 }, { 0, edge, 0 }, dtype) -- near the boundary
    end
  end)

  it('f32 softmax weights below e^-80 of the row\'s largest are zero, never subnormal; f64 keeps them', function()
    -- unit-scale inputs through ψ spread umbral's scores over hundreds of units: in f64 many
    -- weights fall below FLT_MIN, where f32 would hold subnormals (each multiply by one a
    -- microcode assist on x86: the call ran 4-5x slower). f32 gives exact zeros there.
    local FLT_MIN = 2 ^ -126
    pn.manual_seed(11)
    local x = pn.randn({ 1, 2, 300, 16 }, { dtype = 'f64' })
    local y = pn.randn({ 1, 2, 280, 16 }, { dtype = 'f64' })
    local q64, k64 = pn.maps.psi(x), pn.maps.psi(y)
    local w64 = vals(pn.attention_weights(q64, k64, { score = 'umbral' }))
    local w32 = vals(pn.attention_weights(q64:float(), k64:float(), { score = 'umbral' }))
    local tiny, sub32, flushed, bad = 0, 0, 0, nil
    for i = 1, #w64 do
      local a, b = w64[i], w32[i]
      if a > 0 and a < FLT_MIN then tiny = tiny + 1 end
      if b ~= 0 and math.abs(b) < FLT_MIN then sub32 = sub32 + 1 end
      if b == 0 and a > 0 then
        flushed = flushed + 1
        if a > 2e-35 then bad = bad or ('weight %d: f64 %g flushed to 0 in f32'):format(i, a) end
      elseif math.abs(a - b) > 1e-3 * a + 1e-7 then -- f32 scores of hundreds: ~1e-5 relative
        bad = bad or ('weight %d: f64 %g against f32 %g'):format(i, a, b)
      end
    end
    assert(tiny > 1000, 'the inputs should give many weights below FLT_MIN in f64; got ' .. tiny)
    assert.equal(0, sub32)
    assert(flushed >= tiny, ('%d weights flushed, %d below FLT_MIN in f64'):format(flushed, tiny))
    assert.is_nil(bad)
  end)

  it('huge and tiny heights in f32 (ψ of x_d = ±34) keep values and gradients finite', function()
    for _, name in ipairs({ 'umbral', 'penumbral' }) do
      for _, hs in ipairs({ { 1e15, 3e14 }, { 1e-15, 4e-15 }, { 1e15, 1e-15 } }) do
        local e1, e2 = hs[1], hs[2]
        local q = pn.tensor({ { 0.5 * e1, -0.2 * e1, e1 }, { 0.1 * e2, 0.3 * e2, e2 } }, { dtype = 'f32' }):requires_grad_()
        local k = pn.tensor({ { -0.4 * e2, 0.2 * e2, e2 }, { 0.3 * e1, 0.1 * e1, e1 } }, { dtype = 'f32' }):requires_grad_()
        local v = pn.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = 'f32' }):requires_grad_()
        for _, norm in ipairs(NORMS) do
          local out = pn.attention(q, k, v, { score = name, normalize = norm, gamma = 1e-14 })
          assert_finite(vals(out), name .. ' value')
          out:sum():backward()
          assert_finite(vals(q.grad), name .. ' q.grad')
          assert_finite(vals(k.grad), name .. ' k.grad')
          q:zero_grad(); k:zero_grad(); v:zero_grad()
        end
      end
    end
  end)
end)

describe('attention errors', function()
  local q = pn.randn({ 2, 3, 4 }, { dtype = 'f64' })
  local k = pn.randn({ 2, 5, 4 }, { dtype = 'f64' })
  local v = pn.randn({ 2, 5, 3 }, { dtype = 'f64' })
  local pos = function(t) return t:abs() + 0.1 end

  it('wrong shapes and dtypes name the op, the argument and the shapes', function()
    assert_error(function() pn.attention(q, pn.randn({ 2, 5, 3 }, { dtype = 'f64' }), v) end, 'attention', '[2,3,4]', '[2,5,3]', 'last dim')
    assert_error(function() pn.attention(q, k, pn.randn({ 2, 4, 3 }, { dtype = 'f64' })) end, 'attention', 'keys')
    assert_error(function() pn.attention(q, k:to('f32'), v) end, 'attention', 'dtype')
    assert_error(function() pn.attention(q, pn.randn({ 3, 5, 4 }, { dtype = 'f64' }), pn.randn({ 3, 5, 3 }, { dtype = 'f64' })) end, 'attention', 'batch')
    assert_error(function() pn.attention(pn.randn({ 4 }), pn.randn({ 4 }), pn.randn({ 4 })) end, 'attention', '(B, H, N, D)')
    assert_error(function() pn.attention(q:long(), k:long(), v:long()) end, 'attention', 'dtype')
    assert_error(function() pn.attention(q, k, v, { mask = pn.ones({ 3, 5 }) }) end, 'attention', 'mask', 'u8')
    assert_error(function() pn.attention(q, k, v, { mask = pn.ones({ 4, 5 }, { dtype = 'u8' }) }) end, 'attention', 'mask', '[4,5]', 'broadcast')
    assert_error(function() pn.attention(q, k, v, { bias = pn.ones({ 3, 5 }) }) end, 'attention', 'bias', 'f32')
    assert_error(function() pn.attention(q, k, v, { bias = pn.ones({ 3, 4 }, { dtype = 'f64' }) }) end, 'attention', 'bias', '[3,4]')
    assert_error(function() pn.attention(q, k, v, { score = 'laplacian', gamma = pn.ones({ 3 }, { dtype = 'f64' }) }) end, 'attention', 'gamma', '[3]')
    assert_error(function() pn.attention(q, k, v, { score = 'dot', gamma = pn.ones({}, { dtype = 'f64' }) }) end, 'attention', 'gamma', 'dot')
    assert_error(function() pn.attention(q, k) end, 'attention', 'v')
  end)

  it('inputs off the manifold are errors, never NaN', function()
    assert_error(function() pn.attention(q, pos(k), v, { score = 'umbral' }) end, 'attention', 'q', '[2,3,4]', 'last coordinate', 'umbral')
    assert_error(function() pn.attention(pos(q), k, v, { score = 'penumbral' }) end, 'attention', 'k', '[2,5,4]', 'penumbral')
    assert_error(function() pn.attention(q, pos(k), v, { score = 'hyperbolic', model = 'halfspace' }) end, 'attention', 'halfspace')
    assert_error(function() pn.attention(q, k, v, { score = 'hyperbolic', model = 'poincare' }) end, 'attention', 'Poincaré ball')
    assert_error(function() pn.attention(q * 0.01, k * 0.01, v, { score = 'hyperbolic', model = 'poincare', curvature = -1 }) end, 'attention', 'curvature', '> 0')
    assert_error(function() pn.attention(pos(q), pos(k), v, { score = 'umbral', r = 0 }) end, 'attention', 'r', '> 0')
    assert_error(function() pn.attention(q, k, v * 10, { aggregate = 'einstein' }) end, 'attention', 'v', 'Klein ball')
  end)

  it('unknown names and misplaced options are errors listing the valid ones', function()
    assert_error(function() pn.attention(q, k, v, { score = 'cosine' }) end, 'attention', "'cosine'", 'dot', 'penumbral', 'hyperbolic')
    assert_error(function() pn.attention(q, k, v, { normalize = 'sparsemax' }) end, 'attention', 'sparsemax', 'sigmoid_normalized')
    assert_error(function() pn.attention(q, k, v, { score = 'hyperbolic', model = 'klein' }) end, 'attention', 'klein', 'poincare')
    assert_error(function() pn.attention(q, k, v, { aggregate = 'mean' }) end, 'attention', 'mean', 'einstein')
    assert_error(function() pn.attention(q, k, v, { normalise = 'softmax' }) end, 'attention', 'normalise')
    assert_error(function() pn.attention(q, k, v, { score = 'gat' }) end, 'attention', 'gat', 'graph')
    assert_error(function() pn.attention(q, k, v, { alibi = true }) end, 'attention', 'alibi', 'causal')
    assert_error(function() pn.attention_weights(q, k, { score = 'nope' }) end, 'attention_weights', 'nope')
  end)
end)
