-- penumbra.ops.attention — fused distance-family attention (core/attention/, DESIGN §3.1).
--
--   pn.attention(q, k, v, opts)          q, k (B,H,Nq|Nk,D) | (B,N,D) | (N,D); v (…, Nk, Dv) → (…, Nq, Dv)
--   pn.attention_weights(q, k, opts)     → (…, Nq, Nk) normalised weights (heatmaps, regularisers;
--                                        differentiable in q, k, bias and the score's parameters)
--   pn.graph_attention(q, k, v, g, opts) node-major q, k (N,H,D) | (N,D), v (N,H,Dv) | (N,Dv);
--                                        g = pn.graph(…) = {offsets=, src=, num_nodes=} (CSR by destination)
--   pn.graph_attention_weights(q, k, g, opts)   → (E, H) | (E): the weight of each edge of g (in
--                                        g.src order): the attention weights α (entropy, heatmaps;
--                                        no dropout, aggregate ignored; differentiable in q, k,
--                                        the score's parameters, a_l, a_r)
--   pn.attention_variants([{all=true}])  → {'dot', 'laplacian', …} from the registry (core/attention/variants.def),
--                                        list.<name> = its description (params with defaults, map, domain);
--                                        all=true adds the spec-only variants (sqdist)
--   pn.attention_variant(name)           → one description
--
-- opts (all optional):
--   score      = 'dot' | 'laplacian' | 'umbral' | 'penumbral' | 'hyperbolic' | 'gat' (graph only)
--   normalize  = 'softmax' (default) | 'sigmoid' (σ(s), not normalised) | 'sigmoid_normalized' (σ/Σσ)
--   causal     = false   query i attends keys j <= i + (Nk − Nq) (sequences aligned at their ends)
--   mask       = u8 tensor broadcastable to (…, Nq, Nk), nonzero = may attend
--   bias       = tensor broadcastable to (…, Nq, Nk), added to the scores (gets a gradient)
--   aggregate  = nil | 'sum' | 'einstein'   (Einstein midpoint of v in Klein coordinates)
--   the score's parameters (its description's params: scale (dot, 1/√D), gamma (1), r (umbral 0.1,
--   penumbral 1), beta (1), c (0), curvature (1; also einstein's), slope (gat, 0.2), …): a number,
--   or a tensor (0-dim or one value per head) which is then learnable and receives a gradient
--   model      = 'hyperboloid' (default) | 'halfspace' | 'poincare'   (score 'hyperbolic')
--   squared    = false   penumbral: −γ·height² (the authors' code)
--   alibi      = false   ALiBi slopes per head (needs causal)
--   precision  = 'native' (default: the tensors' dtype) | 'bf16' | 'f16'   dense attention of f32
--                tensors on CUDA: Q·Kᵀ and P·V on tensor cores with inputs rounded to bfloat16 /
--                half and f32 accumulation (forward and backward; attention_weights runs in
--                f32); an error on the CPU and for f64 tensors
--   graph only: a_l, a_r ((H, D) tensors for gat), dropout (on the weights), train
-- A fully masked row gives output 0 and zero gradients.
-- Layouts (CPU): q, k, v dense in any dim order with the last dim innermost — heads split from a
-- projection, x:view(B, N, H, D):transpose(2, 3), are — are read in place, not copied; the output
-- is laid out in q's order (for split heads (B, N, H, Dv) in memory, so out:transpose(2, 3) is
-- contiguous and merging the heads back is a view, as with PyTorch's SDPA) and each gradient in
-- its input's. Other strides (expanded, gaps, a transposed last dim) are copied first. On CUDA
-- the output is contiguous.
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap, ffi = B.C, B.wrap, B.ffi
  local bit = require 'bit'
  local is_tensor = pn.is_tensor

  -- the registry (core/attention/variants.def): parameter ids by name, variant descriptions
  local PARAM_ID = {}
  for id = 0, C.pn_attention_param_count() - 1 do PARAM_ID[ffi.string(C.pn_attention_param_name(id))] = id end

  -- a fresh description table of variant i (callers may keep or change it)
  local function describe(i)
    local flags = C.pn_attention_variant_flags(i)
    local d = { name = ffi.string(C.pn_attention_variant_name(i)),
                graph_only = bit.band(flags, C.PN_VF_GRAPH_ONLY) ~= 0, test = bit.band(flags, C.PN_VF_TEST) ~= 0,
                map = ffi.string(C.pn_attention_variant_map(i)), domain = ffi.string(C.pn_attention_variant_domain(i)),
                params = {} }
    local dflt, pos = ffi.new('double[1]'), ffi.new('int[1]')
    for j = 0, C.pn_attention_variant_nparams(i) - 1 do
      local id = C.pn_attention_variant_param(i, j, dflt, pos)
      local v = tonumber(dflt[0])
      local p = { name = ffi.string(C.pn_attention_param_name(id)), positive = pos[0] ~= 0,
                  about = ffi.string(C.pn_attention_param_about(id)) }
      if v ~= v then p.default_rule = '1/sqrt(D)' else p.default = v end -- NaN: 1/√D of the inputs
      d.params[#d.params + 1] = p
      d.params[p.name] = p
    end
    return d
  end

  local function variant_names(all)
    local l = {}
    for i = 0, C.pn_attention_variant_count() - 1 do
      if all or bit.band(C.pn_attention_variant_flags(i), C.PN_VF_TEST) == 0 then
        l[#l + 1] = ffi.string(C.pn_attention_variant_name(i))
      end
    end
    return l
  end

  -- pn.attention_variants([{all=false}]) → the score names in registry order (test-only variants
  -- with all=true), and list.<name> = its description: {name, graph_only, test, map, domain,
  -- params = {{name, default | default_rule, positive, about}, …; <name> = the same entry}}
  function pn.attention_variants(opts)
    opts = opts or {}
    if type(opts) ~= 'table' then raise('attention_variants: options must be a table, got ' .. type(opts), 2) end
    for k in pairs(opts) do
      if k ~= 'all' then raise("attention_variants: unknown option '" .. tostring(k) .. "' (valid: all)", 2) end
    end
    local list = {}
    for i = 0, C.pn_attention_variant_count() - 1 do
      local d = describe(i)
      if opts.all or not d.test then
        list[#list + 1] = d.name
        list[d.name] = d
      end
    end
    return list
  end

  -- pn.attention_variant(name) → the description of one score (test-only ones included)
  function pn.attention_variant(name)
    local i = C.pn_attention_variant_find(tostring(name))
    if i < 0 then
      raise("attention_variant: unknown score '" .. tostring(name) .. "' (valid: " ..
            table.concat(variant_names(true), ', ') .. ')', 2)
    end
    return describe(i)
  end

  -- true when the score needs a graph (gat)
  function pn.attention_variant_graph_only(name)
    local i = C.pn_attention_variant_find(name)
    if i < 0 then raise("attention_variant_graph_only: unknown score '" .. tostring(name) .. "'", 2) end
    return C.pn_attention_variant_graph_only(i) ~= 0
  end

  local NORMALIZE = { softmax = C.PN_NORM_SOFTMAX, sigmoid = C.PN_NORM_SIGMOID,
                      sigmoid_normalized = C.PN_NORM_SIGMOID_NORMALIZED }
  local MODELS = { hyperboloid = C.PN_MODEL_HYPERBOLOID, halfspace = C.PN_MODEL_HALFSPACE,
                   poincare = C.PN_MODEL_POINCARE }
  local AGGREGATE = { sum = C.PN_AGG_SUM, einstein = C.PN_AGG_EINSTEIN }
  local PRECISION = { native = C.PN_PREC_NATIVE, bf16 = C.PN_PREC_BF16, f16 = C.PN_PREC_F16 }
  local KNOWN = { score = 1, normalize = 1, causal = 1, mask = 1, bias = 1, aggregate = 1, model = 1, squared = 1,
                  alibi = 1, a_l = 1, a_r = 1, dropout = 1, train = 1, precision = 1 }
  for name in pairs(PARAM_ID) do KNOWN[name] = 1 end -- every score parameter of variants.def

  local function names(t)
    local l = {}
    for k in pairs(t) do l[#l + 1] = k end
    table.sort(l)
    return table.concat(l, ', ')
  end

  local function lookup(op, what, tbl, v, default)
    if v == nil then return default end
    local c = tbl[v]
    if c == nil then raise(op .. ": unknown " .. what .. " '" .. tostring(v) .. "' (valid: " .. names(tbl) .. ')', 4) end
    return c
  end

  local function opt_tensor(op, key, v)
    if v == nil then return nil end
    if not is_tensor(v) then raise(op .. ': ' .. key .. ' must be a tensor, got ' .. type(v), 4) end
    return v
  end

  -- Lua options -> pn_attn_opts (keeps the tensors it points to alive in `keep`)
  local function make_opts(op, opts, keep, graph)
    opts = opts or {}
    if type(opts) ~= 'table' then raise(op .. ': options must be a table, got ' .. type(opts), 3) end
    for k in pairs(opts) do
      if not KNOWN[k] then raise(op .. ": unknown option '" .. tostring(k) .. "' (valid: " .. names(KNOWN) .. ')', 3) end
    end
    local o = ffi.new('pn_attn_opts')
    C.pn_attn_opts_init(o)
    local score = opts.score or 'dot'
    local si = C.pn_attention_variant_find(tostring(score))
    if si < 0 then
      raise(op .. ": unknown score '" .. tostring(score) .. "' (valid: " .. table.concat(variant_names(false), ', ') .. ')', 3)
    end
    o.score = si
    o.normalize = lookup(op, 'normalize', NORMALIZE, opts.normalize, C.PN_NORM_SOFTMAX)
    o.model = lookup(op, 'model', MODELS, opts.model, C.PN_MODEL_HYPERBOLOID)
    o.aggregate = lookup(op, 'aggregate', AGGREGATE, opts.aggregate, C.PN_AGG_SUM)
    if graph and opts.precision ~= nil then
      raise(op .. ': precision applies to dense attention on CUDA only (graph attention computes in the tensors\' dtype)', 3)
    end
    o.precision = lookup(op, 'precision', PRECISION, opts.precision, C.PN_PREC_NATIVE)
    -- flags are booleans: {causal = 'false'} or {causal = 0} would otherwise switch masking on
    for _, key in ipairs({ 'causal', 'squared', 'alibi', 'train' }) do
      local v = opts[key]
      if v ~= nil and type(v) ~= 'boolean' then
        raise(string.format("%s: %s must be true or false, got %s (a %s)", op, key, tostring(v), type(v)), 3)
      end
    end
    if not graph and (opts.dropout ~= nil or opts.train ~= nil) then
      raise(op .. ': dropout and train apply to graph attention only (the dense forms have no attention dropout)', 3)
    end
    o.causal = opts.causal and 1 or 0
    o.squared = opts.squared and 1 or 0
    o.alibi = opts.alibi and 1 or 0
    for name, id in pairs(PARAM_ID) do
      local v = opts[name]
      if is_tensor(v) then
        o.param_t[id] = v
        keep[#keep + 1] = v
      elseif type(v) == 'number' then
        -- NaN is the C side's "not given": a NaN or infinite value must not fall back to the default
        if v ~= v or v == math.huge or v == -math.huge then
          raise(op .. ': ' .. name .. ' must be a finite number, got ' .. tostring(v), 3)
        end
        o.param[id] = v
      elseif v ~= nil then
        raise(op .. ': ' .. name .. ' must be a number or a tensor, got ' .. type(v), 3)
      end
    end
    o.mask = opt_tensor(op, 'mask', opts.mask)
    o.bias = opt_tensor(op, 'bias', opts.bias)
    o.a_l = opt_tensor(op, 'a_l', opts.a_l)
    o.a_r = opt_tensor(op, 'a_r', opts.a_r)
    keep[#keep + 1] = opts.mask
    keep[#keep + 1] = opts.bias
    if opts.dropout ~= nil then
      local p = opts.dropout
      if type(p) ~= 'number' or not (p >= 0 and p < 1) then
        raise(op .. ': dropout must be a number in [0, 1), got ' .. tostring(p), 3)
      end
      o.dropout = p
    end
    o.train = opts.train and 1 or 0
    return o
  end

  local function tensors(op, list)
    for _, p in ipairs(list) do
      if not is_tensor(p[2]) then raise(op .. ': ' .. p[1] .. ' must be a tensor, got ' .. type(p[2]), 3) end
    end
  end

  local function graph_table(op, g)
    if type(g) ~= 'table' or not is_tensor(g.offsets) or not is_tensor(g.src) then
      raise(op .. ': g must be a graph table {offsets=, src=, num_nodes=} (see pn.graph), got ' .. type(g))
    end
  end

  function pn.attention(q, k, v, opts)
    tensors('attention', { { 'q', q }, { 'k', k }, { 'v', v } })
    local keep = {}
    local o = make_opts('attention', opts, keep, false)
    return wrap(C.pn_attention(q, k, v, o))
  end

  function pn.attention_weights(q, k, opts)
    tensors('attention_weights', { { 'q', q }, { 'k', k } })
    local keep = {}
    local o = make_opts('attention_weights', opts, keep, false)
    return wrap(C.pn_attention_weights(q, k, o))
  end

  function pn.graph_attention(q, k, v, g, opts)
    tensors('graph_attention', { { 'q', q }, { 'k', k }, { 'v', v } })
    graph_table('graph_attention', g)
    local keep = {}
    local o = make_opts('graph_attention', opts, keep, true)
    return wrap(C.pn_graph_attention(q, k, v, g.offsets, g.src, o))
  end

  function pn.graph_attention_weights(q, k, g, opts)
    tensors('graph_attention_weights', { { 'q', q }, { 'k', k } })
    graph_table('graph_attention_weights', g)
    local keep = {}
    local o = make_opts('graph_attention_weights', opts, keep, true)
    return wrap(C.pn_graph_attention_weights(q, k, g.offsets, g.src, o))
  end
end
