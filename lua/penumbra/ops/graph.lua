-- penumbra.ops.graph — scale-free graphs and graph algorithms (core/graph/, DESIGN §4).
-- pn.graph stays callable as before (pn.graph(edges, num_nodes, opts) → a CSR, ops/maps.lua)
-- and also holds:
--
--   pn.graph.hyperbolic{n=, degree=, exponent=3 | alpha=, T=0, R=nil, threshold=nil, seed=0,
--                       preset=nil}
--       a random hyperbolic graph (von Looz et al.; NetworKit's HyperbolicGenerator):
--       → {edges = (2E, 2) i64 (both directions, no self-loops, no duplicates), r = (n) f64,
--          phi = (n) f64, R = disk radius, threshold = edge distance, n = n, alpha = α}
--       exponent = 2α + 1 of the degree power law (> 2); T = 0 threshold model, 0 < T < 1
--       Fermi–Dirac (n <= 20000); R given, or solved so the expected average degree is `degree`;
--       threshold: the edge distance of the threshold model (default R).
--       preset = 'han': Hyperbolic Attention Networks App. A.2 — α = 0.95, R = acosh(n/2π + 1)
--       (the generator's disk for n points, stretch 1) and edges within 0.35·R (its
--       edge_radius_R_factor); degree is then not used.
--   pn.graph.expected_degree{n=, alpha=|exponent=, R=, threshold=nil, T=0}  the model's mean degree
--   pn.graph.bfs(g, sources, {max=nil})  hop distances (S, N) i32 from each source (a node id or
--       a list / i64 tensor of them, 0-based like edges); −1 unreachable or beyond max
--   pn.graph.distances(g, pairs, {max=nil})  (P) i32 distances of (P, 2) node pairs
--   pn.graph.components(g)  → {labels = (N) i64 (smallest node id of the component), count =}
--   pn.graph.slice(h, theta)  the subgraph of pn.graph.hyperbolic's h induced by the nodes with
--       angle in [0, theta], theta in (0, 2π] (HAN's curriculum): {edges, r, phi, ids (old ids), …}
--   pn.graph.degrees(edges, n)  (n) i64 out-degrees (rows (src, dst) counted at src)
--   pn.graph.canonical(edges, n)  the undirected graph of edges as (E', 2) i64: both directions,
--       no self-loops, no duplicates, sorted by (src, dst) — the dataset schema's edge list
-- g is a pn.graph(…) CSR table (self-loops do not change distances or components).
-- Graph algorithms are host algorithms: CPU tensors in and out.
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap, check, ffi = B.C, B.wrap, B.check, B.ffi
  local options = require 'penumbra.options'
  local is_tensor = pn.is_tensor
  local out_ptr = ffi.typeof('pn_tensor *[1]')
  local build_csr = pn.graph -- the CSR builder of ops/maps.lua
  local graph = setmetatable({}, { __call = function(_, ...) return build_csr(...) end })

  local function csr_of(op, g)
    if type(g) ~= 'table' or not is_tensor(g.offsets) or not is_tensor(g.src) then
      raise(op .. ': g must be a graph table {offsets=, src=, num_nodes=} from pn.graph(edges, n), got ' .. type(g))
    end
    return g.offsets, g.src
  end
  local function node_list(op, what, x)
    if type(x) == 'number' then x = { x } end
    if type(x) == 'table' and not is_tensor(x) then
      for i, v in ipairs(x) do
        if type(v) ~= 'number' or v % 1 ~= 0 then raise(op .. ': ' .. what .. ' ' .. i .. ' must be a whole node id, got ' .. tostring(v), 3) end
      end
      return #x > 0 and pn.tensor(x, { dtype = 'i64' }) or pn.zeros({ 0 }, { dtype = 'i64' })
    end
    if not is_tensor(x) then raise(op .. ': ' .. what .. ' must be node ids (a number, a list or an i64 tensor), got ' .. type(x), 3) end
    return x:to('i64'):contiguous()
  end
  local function max_of(op, o)
    o = options.check(op, o, { max = { 'integer', min = 0 } }, 3)
    return o.max or -1
  end

  local HYP = {
    n = { 'integer', min = 2 }, degree = { 'number', above = 0 }, exponent = { 'number', above = 2 },
    alpha = { 'number', above = 0.5 }, T = { 'number', min = 0, below = 1 }, R = { 'number', above = 0 },
    threshold = { 'number', min = 0 }, seed = { 'integer', min = 0, max = 2 ^ 53 },
    preset = { 'string', one_of = { 'han' } },
  }
  local function alpha_of(op, o)
    if o.exponent and o.alpha and math.abs(2 * o.alpha + 1 - o.exponent) > 1e-12 then
      raise(op .. ': exponent = ' .. o.exponent .. ' and alpha = ' .. o.alpha .. ' disagree (exponent = 2·alpha + 1); give one', 3)
    end
    return o.alpha or (o.exponent and (o.exponent - 1) / 2) or 1 -- exponent 3 by default
  end

  function graph.hyperbolic(o)
    local op = 'graph.hyperbolic'
    if type(o) ~= 'table' then raise(op .. ': give the options table {n=, degree=, …}', 2) end
    o = options.check(op, o, HYP, 2)
    if not o.n then raise(op .. ': n (the number of nodes, >= 2) is required', 2) end
    local alpha, R, thr = alpha_of(op, o), o.R, o.threshold
    if o.preset == 'han' then
      if o.alpha or o.exponent or o.R or o.threshold or o.degree then
        raise(op .. ": preset 'han' sets alpha, R and threshold itself; leave out alpha, exponent, R, threshold, degree", 2)
      end
      alpha = 0.95
      R = math.log(o.n / (2 * math.pi) + 1 + math.sqrt((o.n / (2 * math.pi) + 1) ^ 2 - 1)) -- acosh
      thr = 0.35 * R
    elseif not R and not o.degree then
      raise(op .. ': give degree (the target average degree) or R (the disk radius)', 2)
    end
    if o.degree and o.degree >= o.n - 1 then
      raise(op .. ': degree = ' .. o.degree .. ' must be < n - 1 = ' .. (o.n - 1), 2)
    end
    local opts = ffi.new('pn_hypgen_opts')
    opts.n, opts.degree, opts.alpha, opts.T = o.n, o.degree or 0, alpha, o.T or 0
    opts.R, opts.threshold, opts.seed = R or 0 / 0, thr or 0 / 0, o.seed or 0
    local e, r, phi, Rout = out_ptr(), out_ptr(), out_ptr(), ffi.new('double[1]')
    check(C.pn_graph_hyperbolic(opts, e, r, phi, Rout))
    local Rv = Rout[0]
    return { edges = wrap(e[0]), r = wrap(r[0]), phi = wrap(phi[0]), R = Rv, threshold = thr or Rv, n = o.n,
             alpha = alpha, T = o.T or 0 }
  end

  function graph.expected_degree(o)
    local op = 'graph.expected_degree'
    o = options.check(op, o, { n = HYP.n, alpha = HYP.alpha, exponent = HYP.exponent, R = HYP.R,
                                threshold = HYP.threshold, T = HYP.T }, 2)
    if not o.n or not o.R then raise(op .. ': n and R are required', 2) end
    return C.pn_graph_hyperbolic_degree(o.n, alpha_of(op, o), o.R, o.threshold or 0 / 0, o.T or 0)
  end

  function graph.bfs(g, sources, o)
    local op = 'graph.bfs'
    local off, src = csr_of(op, g)
    local max = max_of(op, o)
    local out = out_ptr()
    check(C.pn_graph_bfs(off, src, node_list(op, 'source', sources), max, out))
    return wrap(out[0])
  end

  function graph.distances(g, pairs, o)
    local op = 'graph.distances'
    local off, src = csr_of(op, g)
    local max = max_of(op, o)
    if type(pairs) == 'table' and not is_tensor(pairs) then
      pairs = #pairs > 0 and pn.tensor(pairs, { dtype = 'i64' }) or pn.zeros({ 0, 2 }, { dtype = 'i64' })
    end
    if not is_tensor(pairs) then raise(op .. ': pairs must be (P, 2) node ids, got ' .. type(pairs), 2) end
    local out = out_ptr()
    check(C.pn_graph_pair_dist(off, src, pairs:to('i64'):contiguous(), max, out))
    return wrap(out[0])
  end

  function graph.components(g)
    local op = 'graph.components'
    local off, src = csr_of(op, g)
    local out, count = out_ptr(), ffi.new('int64_t[1]')
    check(C.pn_graph_components(off, src, out, count))
    return { labels = wrap(out[0]), count = tonumber(count[0]) }
  end

  function graph.slice(h, theta)
    local op = 'graph.slice'
    if type(h) ~= 'table' or not is_tensor(h.edges) or not is_tensor(h.phi) then
      raise(op .. ': h must be a graph from pn.graph.hyperbolic (edges, r, phi), got ' .. type(h), 2)
    end
    if type(theta) ~= 'number' or not (theta > 0 and theta <= 2 * math.pi) then
      raise(op .. ': theta = ' .. tostring(theta) .. ' must be an angle in (0, 2π] (radians)', 2)
    end
    local keep = h.phi:le(theta):to('u8'):contiguous()
    local e, ids = out_ptr(), out_ptr()
    check(C.pn_graph_induced(h.edges:contiguous(), keep, e, ids))
    local idt = wrap(ids[0])
    local out = {}
    for k, v in pairs(h) do out[k] = v end
    out.edges, out.ids, out.n = wrap(e[0]), idt, idt:numel()
    out.r = idt:numel() > 0 and h.r:index_select(1, idt) or pn.zeros({ 0 }, { dtype = 'f64' })
    out.phi = idt:numel() > 0 and h.phi:index_select(1, idt) or pn.zeros({ 0 }, { dtype = 'f64' })
    out.theta = theta
    return out
  end

  function graph.canonical(edges, n)
    local op = 'graph.canonical'
    if not is_tensor(edges) or edges:dim() ~= 2 or edges:shape()[2] ~= 2 then
      raise(op .. ': edges must be an (E, 2) tensor of node ids', 2)
    end
    if type(n) ~= 'number' or n % 1 ~= 0 or n < 0 then raise(op .. ': n must be a whole number >= 0', 2) end
    local e = out_ptr()
    check(C.pn_graph_canonical(edges:to('i64'):contiguous(), n, e))
    return wrap(e[0])
  end

  function graph.degrees(edges, n)
    local op = 'graph.degrees'
    if not is_tensor(edges) then raise(op .. ': edges must be an (E, 2) tensor', 2) end
    if type(n) ~= 'number' or n % 1 ~= 0 or n < 0 then raise(op .. ': n must be a whole number >= 0', 2) end
    local d = pn.zeros({ n }, { dtype = 'i64' })
    if edges:shape()[1] == 0 then return d end
    return d:index_add(1, edges:select(2, 1):to('i64'):contiguous(), pn.ones({ edges:shape()[1] }, { dtype = 'i64' }))
  end

  pn.graph = graph
end
