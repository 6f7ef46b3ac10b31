-- spec/helpers/op_cases.lua — THE table of op cases the backend specs run (backend_ops_spec on every
-- backend; cuda_schedules_spec on cuda under the interpreter's other thread orders): broadcast,
-- transposed, sliced and expanded inputs; the attention scores come from the registry
-- (pn.attention_variants{all=true}), with their parameters as learnable per-head tensors.
-- Each case: {name, op, inputs[, tol, grad]} for spec/helpers/op_harness.lua's H.check.
local pn = require 'penumbra'
local H = require 'spec.helpers.op_harness'
local x, idx, mask = H.x, H.index, H.mask

local CASES = {}
local function case(name, op, inputs, extra)
  local c = { name = name, op = op, inputs = inputs }
  for k, v in pairs(extra or {}) do c[k] = v end
  CASES[#CASES + 1] = c
end

-- ---- elementwise --------------------------------------------------------------------------------
case('add broadcast', function(a, b) return a + b end, { x({ 2, 3, 4 }), x({ 3, 1 }) })
case('sub transposed', function(a, b) return a - b end, { x({ 3, 4 }, { view = 't' }), x({ 3, 4 }) })
case('mul expanded', function(a, b) return a * b end, { x({ 3, 4 }, { view = 'expand' }), x({ 4 }) })
case('div sliced', function(a, b) return a / b end, { x({ 3, 4 }, { view = 'slice' }), x({ 3, 4 }, { lo = 0.5, hi = 2 }) })
case('scalar ops', function(a) return (a * 2 - 1) / 3 + 0.5 end, { x({ 5 }) })
case('pow', function(a) return a:pow(3) end, { x({ 2, 3 }) })
case('pow tensor', function(a, b) return a:pow(b) end, { x({ 2, 3 }, { lo = 0.5, hi = 2 }), x({ 3 }) })
case('neg', function(a) return -a end, { x({ 4 }) })
case('where', function(m, a, b) return pn.where(m, a, b) end, { mask({ 3, 4 }), x({ 3, 4 }), x({ 4 }) })
case('clamp', function(a) return a:clamp(-0.5, 0.4) end, { x({ 3, 4 }) })
local UNARY = {
  exp = {}, log = { lo = 0.2, hi = 2 }, log1p = { lo = -0.5, hi = 2 }, sqrt = { lo = 0.2, hi = 2 },
  rsqrt = { lo = 0.2, hi = 2 }, sin = {}, cos = {}, tanh = {}, sigmoid = {}, logsigmoid = {}, relu = {},
  elu = {}, leaky_relu = {}, gelu = {}, softplus = {}, sinh = {}, cosh = {}, asinh = {},
  acosh = { lo = 1.2, hi = 3 }, atanh = { lo = -0.8, hi = 0.8 }, abs = {},
}
local names = {}
for name in pairs(UNARY) do names[#names + 1] = name end
table.sort(names)
for _, name in ipairs(names) do
  local r = UNARY[name]
  case(name .. ' (transposed)', function(a) return a[name](a) end, { x({ 3, 4 }, { lo = r.lo, hi = r.hi, view = 't' }) })
end

-- ---- reductions -------------------------------------------------------------------------------------
for _, name in ipairs({ 'sum', 'mean', 'max', 'min', 'logsumexp', 'prod' }) do
  case(name .. ' dim 2 keepdim', function(a) return a[name](a, 2, true) end, { x({ 3, 4, 2 }, { lo = 0.5, hi = 1.5 }) })
  case(name .. ' dim -1 (transposed)', function(a) return a[name](a, -1) end, { x({ 3, 4 }, { lo = 0.5, hi = 1.5, view = 't' }) })
end
case('sum all', function(a) return a:sum() end, { x({ 3, 4 }) })
case('norm', function(a) return a:norm(2, -1) end, { x({ 3, 4 }) })
case('argmax (values only)', function(a) return a:argmax(-1) end, { x({ 3, 5 }) }, { grad = false })

-- ---- matmul ---------------------------------------------------------------------------------------
case('matmul 2-D', function(a, b) return a:matmul(b) end, { x({ 3, 4 }), x({ 4, 5 }) })
case('matmul transposed lhs', function(a, b) return a:matmul(b) end, { x({ 3, 4 }, { view = 't' }), x({ 4, 2 }) })
case('matmul batched broadcast', function(a, b) return a:matmul(b) end, { x({ 2, 3, 4 }), x({ 4, 5 }) })
case('bmm', function(a, b) return pn.bmm(a, b) end, { x({ 2, 3, 4 }), x({ 2, 4, 2 }) })
case('matmul vector', function(a, b) return a:matmul(b) end, { x({ 3, 4 }), x({ 4 }) })
case('matmul_sparse_lhs', function(a, b) return pn.matmul_sparse_lhs(a, b) end,
  { x({ 4, 6 }, { grad = false }), x({ 6, 3 }) })

-- ---- nn ----------------------------------------------------------------------------------------------
case('softmax -1', function(a) return a:softmax(-1) end, { x({ 3, 5 }, { lo = -3, hi = 3 }) })
case('softmax dim 1 (transposed)', function(a) return a:softmax(1) end, { x({ 4, 3 }, { view = 't' }) })
case('log_softmax', function(a) return a:log_softmax(-1) end, { x({ 2, 3, 5 }, { lo = -3, hi = 3 }) })
case('layer_norm', function(a, w, b) return pn.layer_norm(a, w, b) end, { x({ 3, 6 }), x({ 6 }), x({ 6 }) })

-- ---- indexing ----------------------------------------------------------------------------------------
case('index_select', function(a, i) return a:index_select(1, i) end, { x({ 5, 3 }), idx({ 7 }, 5) })
case('gather', function(a, i) return a:gather(2, i) end, { x({ 3, 4 }), idx({ 3, 6 }, 4) })
case('scatter_add', function(a, i, s) return a:scatter_add(1, i, s) end, { x({ 4, 3 }), idx({ 5, 3 }, 4), x({ 5, 3 }) })
case('index_add', function(a, i, s) return a:index_add(1, i, s) end, { x({ 4, 3 }), idx({ 6 }, 4), x({ 6, 3 }) })
case('embedding', function(w, i) return pn.embedding(w, i) end, { x({ 6, 3 }), idx({ 2, 4 }, 6) })
case('segment_sum', function(a, o) return pn.segment_sum(a, o) end, { x({ 7, 2 }), H.offsets({ 2, 0, 4, 1 }) })
case('segment_softmax', function(a, o) return pn.segment_softmax(a, o) end, { x({ 7, 2 }), H.offsets({ 3, 1, 3 }) })

-- ---- shape -------------------------------------------------------------------------------------------
case('cat', function(a, b) return pn.cat({ a, b }, 2) end, { x({ 3, 2 }), x({ 3, 4 }, { view = 't' }) })
case('stack', function(a, b) return pn.stack({ a, b }, 1) end, { x({ 3, 2 }), x({ 3, 2 }, { view = 'slice' }) })
case('reshape + permute + contiguous', function(a) return a:reshape(2, 6):permute(2, 1):contiguous() end, { x({ 3, 4 }) })
case('narrow + select', function(a) return a:narrow(1, 2, 2):select(2, 3) end, { x({ 4, 5 }) })

-- ---- losses ------------------------------------------------------------------------------------------
case('cross_entropy', function(a, y) return pn.cross_entropy(a, y) end, { x({ 5, 4 }, { lo = -2, hi = 2 }), idx({ 5 }, 4) })
case('nll_loss', function(a, y) return pn.nll_loss(a:log_softmax(-1), y) end, { x({ 5, 4 }), idx({ 5 }, 4) })
case('binary_cross_entropy_with_logits', function(a, y) return pn.binary_cross_entropy_with_logits(a, y) end,
  { x({ 6 }, { lo = -3, hi = 3 }), x({ 6 }, { lo = 0, hi = 1, grad = false }) })
case('mse_loss', function(a, b) return pn.mse_loss(a, b) end, { x({ 2, 3 }), x({ 2, 3 }) })

-- ---- linear attention and maps --------------------------------------------------------------------
case('cosine_attention causal', function(q, k, v, m) return pn.cosine_attention(q, k, v, m, { causal = true }) end,
  { x({ 1, 2, 5, 3 }), x({ 1, 2, 5, 3 }), x({ 1, 2, 5, 2 }), x({ 2 }, { lo = -0.5, hi = 0.5 }) })
case('power_attention p=2', function(q, k, v) return pn.power_attention(q, k, v, { p = 2 }) end,
  { x({ 1, 2, 5, 3 }), x({ 1, 2, 5, 3 }), x({ 1, 2, 5, 2 }) }, { tol = 5e-4 })
case('power_attention gated, chunked', function(q, k, v, g) return pn.power_attention(q, k, v, { p = 2, log_gate = g, chunk = 2 }) end,
  { x({ 1, 2, 6, 3 }), x({ 1, 2, 6, 3 }), x({ 1, 2, 6, 2 }), x({ 1, 2, 6 }, { lo = -0.5, hi = -0.01 }) }, { tol = 5e-4 })
case('sympow_embed', function(a) return pn.sympow_embed(a, 2) end, { x({ 2, 3, 4 }) })
case('rope', function(a) return pn.rope(a) end, { x({ 1, 2, 5, 4 }) })
for _, m in ipairs({ 'psi', 'xi' }) do
  case('map ' .. m, function(a) return pn.maps[m](a) end, { x({ 3, 2, 4 }) })
end

-- ---- attention: every registered score, its parameters learnable per head -------------------------
local VARIANTS = pn.attention_variants({ all = true })
local Hh, N, D = 2, 5, 4
for _, name in ipairs(VARIANTS) do
  local d = VARIANTS[name]
  -- inputs valid for every score's domain: coordinates in (0.05, 0.45) (heights > 0, inside
  -- the unit ball); each parameter a per-head tensor near its default (positive ones stay > 0)
  -- (a parameter only another form of the score reads — the Poincaré curvature of
  -- hyperbolic — is one the op refuses by name for the default form: left out here)
  local pin = {}
  local probe = pn.full({ 1, 2, 2 }, 0.2, { dtype = 'f64' })
  for _, p in ipairs(d.params) do
    local v = p.default or 1 / math.sqrt(D)
    local ok, e = pcall(d.graph_only and function() error('graph-only') end or pn.attention, probe, probe, probe,
      { score = name, [p.name] = pn.tensor({ v }, { dtype = 'f64' }) })
    if ok or not tostring(e):find('has no parameter ' .. p.name, 1, true) then
      pin[#pin + 1] = { name = p.name, spec = x({ Hh }, { lo = v * 1.05 + 0.02, hi = v * 1.2 + 0.05 }) }
    end
  end
  local extra = {}
  if d.domain:find('a_l, a_r', 1, true) then -- scores with attention vectors (GAT's a_l, a_r: (H, D))
    extra = { { name = 'a_l', spec = x({ Hh, D }) }, { name = 'a_r', spec = x({ Hh, D }) } }
  end
  local function opts_of(args, first)
    local o = { score = name }
    local i = first
    for _, p in ipairs(pin) do o[p.name] = args[i]; i = i + 1 end
    for _, e in ipairs(extra) do o[e.name] = args[i]; i = i + 1 end
    return o
  end
  local function inputs_of(lead)
    local ins = lead
    for _, p in ipairs(pin) do ins[#ins + 1] = p.spec end
    for _, e in ipairs(extra) do ins[#ins + 1] = e.spec end
    return ins
  end
  local function point(shape) return x(shape, { lo = 0.05, hi = 0.45 }) end
  if not d.graph_only then
    case('attention ' .. name, function(...)
      local a = { ... }
      return pn.attention(a[1], a[2], a[3], opts_of(a, 4))
    end, inputs_of({ point({ 1, Hh, N, D }), point({ 1, Hh, N + 1, D }), x({ 1, Hh, N + 1, 3 }) }), { tol = 5e-4 })
    case('attention ' .. name .. ' causal, masked', function(...)
      local a = { ... }
      local o = opts_of(a, 5)
      o.causal, o.mask = true, a[4]
      return pn.attention(a[1], a[2], a[3], o)
    end, inputs_of({ point({ 1, Hh, N, D }), point({ 1, Hh, N, D }), x({ 1, Hh, N, 3 }), mask({ 1, 1, N, N }, 0.8) }),
      { tol = 5e-4 })
  end
  case('graph_attention ' .. name, function(...)
    local a = { ... }
    return pn.graph_attention(a[1], a[2], a[3], a[4], opts_of(a, 5))
  end, inputs_of({ point({ N, Hh, D }), point({ N, Hh, D }), x({ N, Hh, 3 }),
                    H.graph(N, { { 0, 1 }, { 1, 2 }, { 2, 0 }, { 3, 1 }, { 4, 3 }, { 0, 4 }, { 2, 4 } }) }), { tol = 5e-4 })
end

return CASES
