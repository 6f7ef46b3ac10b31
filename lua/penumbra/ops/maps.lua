-- penumbra.ops.maps — maps onto hyperbolic models, the Poincaré-ball toolkit and the CSR
-- graph builder (DESIGN §3.1, §4). Points are rows of the last dim; every map is
-- differentiable (f32/f64, any leading dims; the two-point ops broadcast them).
--
--   pn.maps.psi(x)                      Coneheads Eq. 10 (umbral):    (x₋·e^{x_d}, e^{x_d})
--   pn.maps.xi(x, {h=1})                Coneheads Eq. 11 (penumbral): (x₋·hσ(x_d), hσ(x_d))
--   pn.maps.pseudopolar(x)              Gulcehre §4.1: (sinh(x_d)·x₋/‖x₋‖, cosh(x_d)), unit
--                                       hyperboloid with the time-like coordinate LAST
--   pn.maps.exp0(x, {h=nil, scale_last=false})   Coneheads Eq. 9 at O = (0,…,0,1); h clamps the
--                                       height; scale_last divides x_d by D first (authors' code)
--   pn.hyper.expmap0(v, c)  logmap0(x, c)  mobius_add(x, y, c)  dist(x, y, c) (…,D)→(…)
--   pn.hyper.project(x, c)               Poincaré ball of curvature −c (c defaults to 1)
--   pn.hyper.to_klein(x, {from='poincare'|'hyperboloid', c=1})   hyperboloid (…,D+1) → (…,D)
--   pn.hyper.from_klein(x, {to='poincare'|'hyperboloid', c=1})   (…,D) → hyperboloid (…,D+1)
--   pn.graph(edges, num_nodes, {self_loops=true})
--       edges: (E, 2) i32/i64 tensor or a Lua list of {src, dst} pairs, 0-BASED node ids;
--       dst attends to src. num_nodes may be nil (then max id + 1). Returns
--       { offsets = (N+1) i64, src = (E') i64 sorted by (dst, src), num_nodes = N, num_edges = E' }.
-- Clamps and boundary rules (documented in core/attention/maps.c and hyperbolic.c):
--   pseudopolar: ‖x₋‖ is floored at 1e-6 (f32) / 1e-12 (f64); x₋ = 0 lands on (0,…,0,1).
--   exp0: ‖x‖ is capped at 30 (f32) / 300 (f64), i.e. at that distance from O along the
--         geodesic, so heights stay in [e^-30, e^30] in f32 and gradients stay finite.
--   ball: project keeps ‖x‖ ≤ (1 − eps)/√c, eps = 4e-3 (f32) / 1e-5 (f64); expmap0's result
--         is capped at the same radius; points with √c‖x‖ > 1 + 1e-5 (f32) / 1e-12 (f64) are
--         an error (op, argument, shape, point); artanh arguments are clamped at 1 − 1e-7
--         (f32) / 1 − 1e-15 (f64); Klein points are capped at the image of the project radius.
--   Errors name the point as its row-major index over the (broadcast) leading dims, from 0.
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap, check = B.C, B.wrap, B.check
  local ffi = B.ffi
  local is_tensor = pn.is_tensor

  local function tensor(op, x, what)
    if not is_tensor(x) then raise(op .. ': ' .. (what or 'x') .. ' must be a tensor, got ' .. type(x), 3) end
    return x
  end
  local options = require 'penumbra.options'
  -- the options of op against spec: an unknown key (a typo such as {self_loop=false}) is an
  -- error listing the valid ones, never silently the default; errors blame the caller of op
  local function opts_of(op, o, spec)
    local r = options.check(op, o, spec, 3) -- not a tail call: level 3 counts this frame
    return r
  end
  -- psi and pseudopolar have no options: a table passed to them is a mistake (xi's h?)
  local function no_opts(op, o)
    if o ~= nil then raise(op .. ': takes no options (' .. op .. '(x)), got a ' .. type(o), 3) end
  end
  local function curvature(op, c)
    if c == nil then return 1 end
    if type(c) ~= 'number' then raise(op .. ': curvature c must be a number, got ' .. type(c), 3) end
    return c
  end

  -- ---- maps ---------------------------------------------------------------------------------
  local maps = {}
  function maps.psi(x, o)
    no_opts('maps.psi', o)
    return wrap(C.pn_map_psi(tensor('maps.psi', x)))
  end
  function maps.xi(x, o)
    o = opts_of('maps.xi', o, { h = 'number' })
    local h = o.h == nil and 1 or o.h
    return wrap(C.pn_map_xi(tensor('maps.xi', x), h))
  end
  function maps.pseudopolar(x, o)
    no_opts('maps.pseudopolar', o)
    return wrap(C.pn_map_pseudopolar(tensor('maps.pseudopolar', x)))
  end
  function maps.exp0(x, o)
    o = opts_of('maps.exp0', o, { h = 'number', scale_last = 'boolean' })
    local h = o.h
    return wrap(C.pn_map_exp0(tensor('maps.exp0', x), h == nil and 0 / 0 or h, o.scale_last and 1 or 0))
  end
  pn.maps = maps

  -- ---- the Poincaré-ball toolkit --------------------------------------------------------------
  local hyper = {}
  function hyper.expmap0(x, c)
    return wrap(C.pn_hyp_expmap0(tensor('hyper.expmap0', x), curvature('hyper.expmap0', c)))
  end
  function hyper.logmap0(x, c)
    return wrap(C.pn_hyp_logmap0(tensor('hyper.logmap0', x), curvature('hyper.logmap0', c)))
  end
  function hyper.mobius_add(x, y, c)
    tensor('hyper.mobius_add', x)
    tensor('hyper.mobius_add', y, 'y')
    return wrap(C.pn_hyp_mobius_add(x, y, curvature('hyper.mobius_add', c)))
  end
  function hyper.dist(x, y, c)
    tensor('hyper.dist', x)
    tensor('hyper.dist', y, 'y')
    return wrap(C.pn_hyp_dist(x, y, curvature('hyper.dist', c)))
  end
  function hyper.project(x, c)
    return wrap(C.pn_hyp_project(tensor('hyper.project', x), curvature('hyper.project', c)))
  end

  local MODELS = { hyperboloid = C.PN_MODEL_HYPERBOLOID, poincare = C.PN_MODEL_POINCARE }
  local function model(op, key, name)
    local m = MODELS[name or 'poincare']
    if m == nil then
      raise(op .. ": " .. key .. "='" .. tostring(name) .. "' is not a model; use 'poincare' or 'hyperboloid'", 3)
    end
    return m
  end
  -- opts may also be a number: the curvature
  local function klein_opts(op, o, model_key)
    if type(o) == 'number' then return { c = o } end
    local r = options.check(op, o, { c = 'any', [model_key] = 'any' }, 3) -- values: curvature() and model()
    return r -- (not a tail call: level 3 counts this frame)
  end
  function hyper.to_klein(x, o)
    o = klein_opts('hyper.to_klein', o, 'from')
    return wrap(C.pn_hyp_to_klein(tensor('hyper.to_klein', x), model('hyper.to_klein', 'from', o.from),
      curvature('hyper.to_klein', o.c)))
  end
  function hyper.from_klein(x, o)
    o = klein_opts('hyper.from_klein', o, 'to')
    return wrap(C.pn_hyp_from_klein(tensor('hyper.from_klein', x), model('hyper.from_klein', 'to', o.to),
      curvature('hyper.from_klein', o.c)))
  end
  pn.hyper = hyper

  -- ---- graphs ---------------------------------------------------------------------------------
  local out_ptr = ffi.typeof('pn_tensor *[1]')
  function pn.graph(edges, num_nodes, o)
    if type(num_nodes) == 'table' and o == nil then num_nodes, o = nil, num_nodes end
    o = opts_of('graph', o, { self_loops = 'boolean' })
    if type(edges) == 'table' and not is_tensor(edges) then
      local flat = {}
      for i, e in ipairs(edges) do
        if type(e) ~= 'table' or type(e[1]) ~= 'number' or type(e[2]) ~= 'number' then
          raise('graph: edge ' .. i .. ' must be a pair {src, dst} of 0-based node ids', 2)
        end
        flat[i] = { e[1], e[2] }
      end
      edges = #flat > 0 and pn.tensor(flat, { dtype = 'i64' }) or pn.zeros({ 0, 2 }, { dtype = 'i64' })
    end
    tensor('graph', edges, 'edges')
    if num_nodes == nil then -- infer: one more than the largest id
      num_nodes = 0
      local buf, n = pn._flat_values(edges)
      for i = 0, n - 1 do if buf[i] + 1 > num_nodes then num_nodes = buf[i] + 1 end end
    end
    if type(num_nodes) ~= 'number' or num_nodes % 1 ~= 0 then
      raise('graph: num_nodes must be an integer, got ' .. tostring(num_nodes), 2)
    end
    local self_loops = o.self_loops == nil or o.self_loops
    local off, src = out_ptr(), out_ptr()
    check(C.pn_graph_csr(edges, num_nodes, self_loops and 1 or 0, off, src))
    local offsets, sources = wrap(off[0]), wrap(src[0])
    return { offsets = offsets, src = sources, num_nodes = num_nodes, num_edges = sources:numel() }
  end
end
