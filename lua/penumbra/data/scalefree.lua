-- penumbra.data.scalefree — the scale-free graph tasks of Hyperbolic Attention Networks §5.1
-- and App. A.2–A.3 with online data: every example is a freshly generated random hyperbolic
-- graph (pn.graph.hyperbolic) with one queried pair of nodes.
--
--   local d = pn.data.scalefree{task = 'lp' | 'splp', n = 1000, preset = 'han' | nil,
--                                degree = 10, exponent = 3, max_len = 25, lessons = 6,
--                                negatives = 'uniform' | 'near',
--                                curriculum = 0.5, steps = 1000, eval_size = 200, seed = 0}
--   d:batch(step, size)   a training batch: `size` examples, each its own graph (curriculum)
--   d.val, d.test         fixed lists of batches (<= 25 graphs each; graphs from their own
--                         seeds, the full disk), the same for every run with the same
--                         n/preset/degree/exponent/task/eval_size
--   d.baseline            SPLP: the optimal constant predictor's accuracy on d.test (the most
--                         common length there); LP: 0.5
--   d.num_features, d.num_classes, d.describe()
-- A batch is the disjoint union of its graphs: x (N, F) f32 node inputs, graph (pn.graph CSR,
-- self-loops added), edges (E, 2) i64, pairs (B, 2) i64 (0-based node ids into the union),
-- y (B) i64 labels, sizes {n_1, …}, lengths (SPLP: the true lengths).
--
-- Decisions (README "Scale-free graphs"):
--  - Node inputs carry structure only, never coordinates: F = 5 features per node — 1, the
--    degree over the graph's mean degree, log(1 + degree), and two markers for the queried
--    nodes a and b. So one model serves every graph size.
--  - LP: half the examples are edges, half non-edges (negatives = 'uniform': uniform over the
--    node pairs that are not edges, HAN's task; 'near': pairs two hops apart, a harder task
--    where a common neighbour no longer gives the answer away); a queried edge is removed
--    from the input graph (both directions) first.
--  - SPLP: classes are the lengths 1 … max_len (class = length − 1). Pairs that are not
--    connected, or farther apart than max_len, are never queried (not a class of their own).
--    Training draws a length uniformly from 1 … max_len, then a source with a node at that
--    length (up to 20 sources) — a rejection sampler whose histogram is uniform over the
--    lengths the graphs have; evaluation draws node pairs uniformly (the natural distribution
--    of lengths among connected pairs).
--  - Curriculum (App. A.3): training graphs are the generated disk's slice [0, θ]; θ grows in
--    `lessons` even steps from 30° to 360° over the first `curriculum` fraction of `steps`,
--    then stays at 360°. Validation and test always use the whole disk.
--  - Every sampling loop is bounded: a graph without a usable pair (say a slice with no edge)
--    is replaced by the next graph of its stream, at most 50 times, then it is an error
--    naming the parameters.
return function(data)
  local pn = require 'penumbra.tensor'
  local options = require 'penumbra.options'
  local ffi = require 'ffi'

  local F = 5
  local OPTS = {
    task = { 'string', one_of = { 'lp', 'splp' } }, n = { 'integer', min = 10 }, preset = { 'string', one_of = { 'han' } },
    degree = { 'number', above = 0 }, exponent = { 'number', above = 2 }, max_len = { 'integer', min = 2 },
    lessons = { 'integer', min = 1 }, curriculum = { 'number', min = 0, max = 1 }, steps = { 'integer', min = 1 },
    eval_size = { 'integer', min = 1 }, seed = { 'integer', min = 0, max = 2 ^ 53 },
    negatives = { 'string', one_of = { 'uniform', 'near' } },
  }

  -- the sampling's own deterministic stream (Lua's math.random is process-global)
  local rng = require 'penumbra.rng'

  local Set = {}
  Set.__index = Set

  local function gen_opts(self, seed)
    if self.preset then return { n = self.n, preset = self.preset, seed = seed } end
    -- R solved once (the first graph), then given: every graph of the stream the same model
    return { n = self.n, R = self.R, seed = seed }
  end

  -- is (a, b) a row of the (R, 2) i64 edge tensor? (a scan over its memory: no Lua tables)
  local function has_edge(edges, a, b)
    local R = edges:shape()[1]
    if R == 0 then return false end
    local e = ffi.cast('const int64_t *', edges:contiguous():data_ptr())
    for i = 0, R - 1 do
      if e[2 * i] == a and e[2 * i + 1] == b then return true end
    end
    return false
  end

  -- One graph of the stream: the disk (or its slice [0, theta]); nil when it has no edge.
  local function graph_of(self, seed, theta)
    local h = pn.graph.hyperbolic(gen_opts(self, seed))
    if theta and theta < 2 * math.pi then h = pn.graph.slice(h, theta) end
    if h.n < 2 or h.edges:shape()[1] == 0 then return nil end
    return h
  end

  -- The example of graph h: {edges (input graph), m, a, b, y, len}; nil if none can be drawn.
  local function example(self, h, r, natural)
    local m = h.n
    if self.task == 'lp' then
      local E = h.edges:shape()[1] / 2 -- pairs (u, v), then the same reversed (pn.graph.hyperbolic)
      if r.u() < 0.5 then -- a positive: an edge, removed from the input (rows e and E + e)
        local e = r.int(E) -- 0-based pair index
        local row = h.edges:narrow(1, e + 1, 1):totable()[1]
        local a, b = row[1], row[2]
        local parts = {}
        local function keep(from, len) if len > 0 then parts[#parts + 1] = h.edges:narrow(1, from, len) end end
        keep(1, e)
        keep(e + 2, E - 1)
        keep(E + e + 2, E - e - 1)
        local edges = #parts > 0 and pn.cat(parts, 1):contiguous() or pn.zeros({ 0, 2 }, { dtype = 'i64' })
        if r.u() < 0.5 then a, b = b, a end
        return { edges = edges, m = m, a = a, b = b, y = 1 }
      end
      if self.negatives == 'near' then -- a hard negative: two hops apart (a common neighbour)
        local g = pn.graph(h.edges, m, { self_loops = false })
        for _ = 1, 50 do
          local a = r.int(m)
          local d = pn.graph.bfs(g, { a }, { max = 2 }):totable()[1]
          local cands = {}
          for v = 1, m do if d[v] == 2 then cands[#cands + 1] = v - 1 end end
          if #cands > 0 then return { edges = h.edges, m = m, a = a, b = cands[r.int(#cands) + 1], y = 0 } end
        end
        return nil
      end
      for _ = 1, 200 do -- a negative: a uniform non-edge pair (bounded)
        local a, b = r.int(m), r.int(m)
        if a ~= b and not has_edge(h.edges, a, b) then return { edges = h.edges, m = m, a = a, b = b, y = 0 } end
      end
      return nil
    end
    -- SPLP
    local g = pn.graph(h.edges, m, { self_loops = false })
    if natural then -- uniform node pairs among the connected ones within max_len
      for _ = 1, 50 do
        local a = r.int(m)
        local d = pn.graph.bfs(g, { a }, { max = self.max_len }):totable()[1]
        local cands = {}
        for v = 1, m do if d[v] > 0 then cands[#cands + 1] = v - 1 end end
        -- a's share of the connected pairs is proportional to #cands: accept with that weight
        if #cands > 0 and r.u() < #cands / (m - 1) then
          local b = cands[r.int(#cands) + 1]
          return { edges = h.edges, m = m, a = a, b = b, y = d[b + 1] - 1, len = d[b + 1] }
        end
      end
      return nil
    end
    for _ = 1, 50 do -- a length uniformly, then a source that has a node at that length
      local L = r.int(self.max_len) + 1
      for _ = 1, 20 do
        local a = r.int(m)
        local d = pn.graph.bfs(g, { a }, { max = L }):totable()[1]
        local cands = {}
        for v = 1, m do if d[v] == L then cands[#cands + 1] = v - 1 end end
        if #cands > 0 then
          local b = cands[r.int(#cands) + 1]
          return { edges = h.edges, m = m, a = a, b = b, y = L - 1, len = L }
        end
      end
    end
    return nil
  end

  -- examples → one batch (the disjoint union of their graphs)
  local function collate(exs)
    local x, edges, pairs, y, sizes, lens = {}, {}, {}, {}, {}, {}
    local base = 0
    for i, ex in ipairs(exs) do
      local m = ex.m
      local deg = pn.graph.degrees(ex.edges, m):totable()
      local sum = 0
      for _, v in ipairs(deg) do sum = sum + v end
      local mean = math.max(sum / m, 1e-9)
      for v = 0, m - 1 do
        local dv = deg[v + 1]
        x[#x + 1] = { 1, dv / mean, math.log(1 + dv), v == ex.a and 1 or 0, v == ex.b and 1 or 0 }
      end
      if ex.edges:shape()[1] > 0 then edges[#edges + 1] = ex.edges + base end
      pairs[i] = { base + ex.a, base + ex.b }
      y[i] = ex.y
      sizes[i] = m
      lens[i] = ex.len
      base = base + m
    end
    local E = #edges > 0 and pn.cat(edges, 1) or pn.zeros({ 0, 2 }, { dtype = 'i64' })
    return { x = pn.tensor(x, { dtype = 'f32' }), edges = E, graph = pn.graph(E, base, { self_loops = true }),
             pairs = pn.tensor(pairs, { dtype = 'i64' }), y = pn.tensor(y, { dtype = 'i64' }), sizes = sizes,
             lengths = lens, num_nodes = base }
  end

  -- `count` examples from the graph stream starting at seed0 (graph i: seed0 + i), slice theta
  local function draw(self, seed0, count, theta, natural, r)
    local exs = {}
    local k = 0
    while #exs < count do
      local ex
      for _ = 1, 50 do
        local h = graph_of(self, seed0 + k, theta)
        k = k + 1
        ex = h and example(self, h, r, natural)
        if ex then break end
      end
      if not ex then
        error(string.format("data.scalefree: 50 graphs in a row had no usable %s pair (n = %d%s, slice %.0f°); " ..
          'use a larger n or degree', self.task, self.n, self.preset and ', preset ' .. self.preset or
          string.format(', degree %g', self.degree), (theta or 2 * math.pi) * 180 / math.pi), 0)
      end
      exs[#exs + 1] = ex
    end
    return collate(exs)
  end

  -- one example of graph h (for the specs): the input graph's edges, m, a, b, y (and len)
  function Set:example(h, seed, natural) return example(self, h, rng(seed), natural) end

  -- the curriculum's slice angle at a training step
  function Set:angle(step)
    local full = 2 * math.pi
    local span = self.curriculum * self.steps
    if self.lessons <= 1 or span <= 0 or step > span then return full end
    local lesson = math.min(self.lessons, math.floor((step - 1) / span * self.lessons) + 1) -- 1 … lessons
    local start = math.pi / 6
    return start + (full - start) * (lesson - 1) / (self.lessons - 1)
  end

  function Set:batch(step, size)
    local r = rng(self.seed * 1000003 + step)
    -- training graphs: seeds from the run's seed, far from the fixed evaluation streams
    return draw(self, 1e9 + self.seed * 1e7 + step * 1000, size or 1, self:angle(step), false, r)
  end

  function Set:describe()
    return string.format('scalefree %s%s: n = %d (%s), %d features, %d classes, curriculum %d lessons over %.0f %% of %d steps',
      self.task, self.task == 'lp' and (' (' .. self.negatives .. ' negatives)') or '', self.n, self.preset and ('preset ' .. self.preset) or string.format('degree %g, exponent %g', self.degree,
        self.exponent), self.num_features, self.num_classes, self.lessons, 100 * self.curriculum, self.steps)
  end

  local function load(o)
    o = options.check('data.scalefree', o, OPTS, 3)
    local self = setmetatable({
      task = o.task or 'lp', n = o.n or 1000, preset = o.preset, degree = o.degree or 10, exponent = o.exponent or 3,
      max_len = o.max_len or 25, lessons = o.lessons or 6, curriculum = o.curriculum or 0.5, steps = o.steps or 1000,
      eval_size = o.eval_size or 200, seed = o.seed or 0, negatives = o.negatives or 'uniform',
    }, Set)
    if o.preset and (o.degree or o.exponent) then
      error("data.scalefree: preset 'han' sets the degree law itself; leave out degree and exponent", 2)
    end
    if not self.preset then
      local h = pn.graph.hyperbolic{ n = self.n, degree = self.degree, exponent = self.exponent, seed = 0 }
      self.R = h.R
      self.alpha = h.alpha
    end
    self.num_features = F
    self.num_classes = self.task == 'lp' and 2 or self.max_len
    -- fixed evaluation sets: their own seed streams, independent of the run's seed
    -- (in batches of at most 25 graphs, so a 1000-node evaluation stays small in memory)
    local function fixed(seed0, r)
      local out, left, k = {}, self.eval_size, 0
      while left > 0 do
        local c = math.min(25, left)
        out[#out + 1] = draw(self, seed0 + k * 100000, c, nil, true, r)
        left, k = left - c, k + 1
      end
      return out
    end
    self.val = fixed(1e6, rng(17))
    self.test = fixed(2e6, rng(29))
    if self.task == 'lp' then
      self.baseline = 0.5
    else
      local count, best = {}, 0
      for _, b in ipairs(self.test) do
        for _, y in ipairs(b.y:totable()) do count[y] = (count[y] or 0) + 1 end
      end
      for _, c in pairs(count) do best = math.max(best, c) end
      self.baseline = best / self.eval_size
    end
    return self
  end

  data.register('scalefree', load, {
    description = 'random hyperbolic graphs with a queried pair: link prediction (lp) or shortest-path length (splp)',
    options = OPTS,
  })
  return function(o) return load(o) end
end
