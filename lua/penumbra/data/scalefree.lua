-- penumbra.data.scalefree — the scale-free graph tasks of Hyperbolic Attention Networks §5.1
-- and App. A.2–A.3 with online data: every example is a freshly generated random hyperbolic
-- graph (pn.graph.hyperbolic) with one queried pair of nodes.
--
--   local d = pn.data.scalefree{task = 'lp' | 'splp', n = 1000, preset = 'han' | nil,
--                                degree = 10, exponent = 3, max_len = 25, lessons = 6,
--                                negatives = 'uniform' | 'near',
--                                curriculum = 0.5, steps = 1000, eval_size = 200, seed = 0}
--   d:batch(step, size)   a training batch: `size` examples, each its own graph (curriculum);
--                         example i of a step depends on (seed, step, i) only, so under
--                         `./bench -n N` each rank generates only its share (below);
--                         b.examples = {1, …} (the example numbers it holds), b.batch_size
--   d:examples(step, {i, …}) those examples of the step's batch alone (the same graphs and pairs)
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
--  - Training examples are independent streams: example i (1-based) of step s has its own
--    graph seeds and its own penumbra.rng stream (the layout at train_key below), so it is the
--    same whether drawn in a batch of 1 or of 16, and a rank of `./bench -n N` (penumbra/ddp.lua)
--    makes only its examples of the global batch (i = r+1, r+1+N, …), each weighing 1 — the loss
--    is a mean over the batch's pairs, one pair per graph. (Before this layout a batch was ONE
--    stream — graph i depended on every earlier graph of its batch — so runs now see other
--    training graphs than earlier runs did; they are still deterministic per seed. val and test
--    are unchanged.)
return function(data)
  local pn = require 'penumbra.tensor'
  local options = require 'penumbra.options'
  local ffi = require 'ffi'

  local F = 5
  local OPTS = {
    task = { 'string', one_of = { 'lp', 'splp' } }, n = { 'integer', min = 10 }, preset = { 'string', one_of = { 'han' } },
    degree = { 'number', above = 0 }, exponent = { 'number', above = 2 }, max_len = { 'integer', min = 2 },
    lessons = { 'integer', min = 1 }, curriculum = { 'number', min = 0, max = 1 }, steps = { 'integer', min = 1 },
    eval_size = { 'integer', min = 1, max = 25000 }, seed = { 'integer', min = 0, max = 2 ^ 53 }, -- <= MAX_SEED: load
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

  local TRIES = 50 -- graphs tried per example before it is an error

  local function hopeless(self, theta)
    error(string.format("data.scalefree: %d graphs in a row had no usable %s pair (n = %d%s, slice %.0f°); " ..
      'use a larger n or degree', TRIES, self.task, self.n, self.preset and ', preset ' .. self.preset or
      string.format(', degree %g', self.degree), (theta or 2 * math.pi) * 180 / math.pi), 0)
  end

  -- `count` examples from ONE graph stream starting at seed0 (graph i: seed0 + i) and one rng,
  -- slice theta: the fixed evaluation sets (sequential: each graph depends on the earlier ones)
  local function draw(self, seed0, count, theta, natural, r)
    local exs = {}
    local k = 0
    while #exs < count do
      local ex
      for _ = 1, TRIES do
        local h = graph_of(self, seed0 + k, theta)
        k = k + 1
        ex = h and example(self, h, r, natural)
        if ex then break end
      end
      if not ex then hopeless(self, theta) end
      exs[#exs + 1] = ex
    end
    return collate(exs)
  end

  -- ---- training streams: one per example ------------------------------------------------------
  -- Example i (1-based) of step s in a run with data seed S has the key
  --     key = 1e10 + S·1e12 + s·1e5 + (i − 1)·100
  -- Its graphs are graph seeds key + 0 … key + 49 (one per try); its sampling stream is
  -- penumbra.rng(mix64(key)). So the examples own disjoint seed ranges for S ≤ 9000 (checked in
  -- load), 0 ≤ s < 1e7 and i ≤ 1000 (d:batch, d:examples): blocks of 100 seeds per example,
  -- 1e5 per step, 1e12 per run seed; the largest key + 99 stays below 2^53 (9.007e15), so every
  -- seed is an exact double (pn.graph.hyperbolic takes seeds up to 2^53). The fixed evaluation
  -- streams (graph seeds 1e6 + …, 2e6 + …) stay below 1e10 for eval_size < 2.5e6. The key is
  -- hashed (splitmix64's finaliser, a bijection of uint64) before it seeds the LCG of
  -- penumbra.rng: LCG streams from seeds a constant apart are shifted copies of each other (the
  -- first uniforms of examples i, i+1, … would step by a constant — LP's positive/negative coin
  -- included), hashed keys start them at unrelated points of the cycle.
  local MAX_SEED, MAX_STEP, MAX_SIZE = 9000, 1e7 - 1, 1000
  local function train_key(self, step, i) return 1e10 + self.seed * 1e12 + step * 1e5 + (i - 1) * 100 end

  local bit = require 'bit' -- LuaJIT 2.1: bit.* on uint64 cdata stay 64-bit
  local function mix64(x)
    local z = ffi.new('uint64_t', x)
    z = bit.bxor(z, bit.rshift(z, 30)) * 0xbf58476d1ce4e5b9ULL
    z = bit.bxor(z, bit.rshift(z, 27)) * 0x94d049bb133111ebULL
    return bit.bxor(z, bit.rshift(z, 31))
  end

  -- training example i of a step (slice theta): a function of (seed, step, i) only
  local function train_example(self, step, i, theta)
    local key = train_key(self, step, i)
    local r = rng(mix64(key))
    for t = 0, TRIES - 1 do
      local h = graph_of(self, key + t, theta)
      local ex = h and example(self, h, r, false)
      if ex then return ex end
    end
    hopeless(self, theta)
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

  local function check_step(op, step)
    if type(step) ~= 'number' or step % 1 ~= 0 or step < 0 or step > MAX_STEP then
      error(string.format('data.scalefree: %s: step must be an integer in 0 … %d (each step owns a range of ' ..
        'graph seeds), got %s', op, MAX_STEP, tostring(step)), 3)
    end
  end

  -- Examples `list` ({i, …}, 1-based, any subset in any order) of a step's training batch, as one
  -- batch: what d:batch(step, size) holds at those places, whatever else is drawn.
  function Set:examples(step, list)
    check_step('examples', step)
    if type(list) ~= 'table' or #list == 0 then
      error('data.scalefree: examples: give a non-empty list of example numbers {i, …}, got ' .. type(list), 2)
    end
    for _, i in ipairs(list) do
      if type(i) ~= 'number' or i % 1 ~= 0 or i < 1 or i > MAX_SIZE then
        error(string.format('data.scalefree: examples: example numbers must be integers in 1 … %d (each owns a ' ..
          'range of graph seeds), got %s', MAX_SIZE, tostring(i)), 2)
      end
    end
    local theta = self:angle(step)
    local exs = {}
    for k, i in ipairs(list) do exs[k] = train_example(self, step, i, theta) end
    local b = collate(exs)
    b.examples = list
    return b
  end

  -- The training batch of a step: examples 1 … size, each its own graph (train_example). Under
  -- `./bench -n N`, inside a training step (penumbra/ddp.lua's sharer), this rank's examples of
  -- that global batch only (strided: r+1, r+1+N, …), each weighing 1 — every example is one
  -- queried pair and the loss is the mean over the pairs; the others' graphs are never made.
  -- Besides collate's fields: examples (the 1-based example numbers in this batch, in order) and
  -- batch_size (the global batch's graphs, = size).
  function Set:batch(step, size)
    size = size or 1
    check_step('batch', step)
    if type(size) ~= 'number' or size % 1 ~= 0 or size < 1 or size > MAX_SIZE then
      error(string.format('data.scalefree: batch: size must be an integer in 1 … %d (each example owns a range of ' ..
        'graph seeds), got %s', MAX_SIZE, tostring(size)), 2)
    end
    local idx = {}
    for i = 1, size do idx[i] = i end
    local share = require('penumbra.ddp').sharer()
    if share then idx = share(idx, function() return 1 end, 'graphs') end
    local b = self:examples(step, idx)
    b.batch_size = size
    return b
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
    if self.seed > MAX_SEED then
      error(string.format('data.scalefree: seed must be <= %d (the training graphs\' seeds are laid out by seed, step ' ..
        'and example below 2^53), got %d', MAX_SEED, self.seed), 2)
    end
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
    -- chunk k of 25 graphs starts at graph seed seed0 + k·1e5 (at most 50 · 25 seeds each);
    -- chunks 10 and later, which would reach the next set's seeds (val 1e6 + 1e6 = test 2e6),
    -- move to seed0·100 + k·1e5 (val 1e8 …, test 2e8 …: apart up to eval_size 25000 — OPTS)
    local function fixed(seed0, r)
      local out, left, k = {}, self.eval_size, 0
      while left > 0 do
        local c = math.min(25, left)
        out[#out + 1] = draw(self, (k < 10 and seed0 or seed0 * 100) + k * 100000, c, nil, true, r)
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
