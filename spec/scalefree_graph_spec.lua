-- Random hyperbolic graphs and graph algorithms (core/graph/hyperbolic.c, algo.c,
-- lua/penumbra/ops/graph.lua). The generator against an O(n²) brute force written here (same
-- coordinates, the hyperbolic law of cosines in plain Lua), its statistics (mean degree, the
-- power-law exponent by maximum likelihood over the tail), determinism across thread counts;
-- BFS against Floyd–Warshall, components against a plain union–find, slices, bad input.
local pn = require 'penumbra'

local function edge_set(h)
  local e = h.edges:totable()
  local set, n = {}, 0
  for _, row in ipairs(e) do
    local key = row[1] .. ':' .. row[2]
    assert.is_nil(set[key], 'duplicate edge ' .. key)
    assert.are_not.equal(row[1], row[2], 'self-loop at ' .. row[1])
    set[key] = true
    n = n + 1
  end
  return set, n
end

-- the threshold model by brute force from the generator's own coordinates
local function brute(h)
  local r, phi = h.r:totable(), h.phi:totable()
  local ct = math.cosh(h.threshold)
  local set, n = {}, 0
  for u = 1, h.n do
    for v = u + 1, h.n do
      local d = math.abs(phi[u] - phi[v])
      if d > math.pi then d = 2 * math.pi - d end
      local cd = math.cosh(r[u] - r[v]) + (1 - math.cos(d)) * math.sinh(r[u]) * math.sinh(r[v])
      if cd <= ct then
        set[(u - 1) .. ':' .. (v - 1)] = true
        set[(v - 1) .. ':' .. (u - 1)] = true
        n = n + 2
      end
    end
  end
  return set, n
end

local function mean_degree(h) return h.edges:shape()[1] / h.n end

-- the discrete power-law MLE (Clauset et al. 2009, Eq. 3.7) over degrees >= dmin
local function exponent_mle(deg, dmin)
  local s, m = 0, 0
  for _, d in ipairs(deg) do if d >= dmin then s = s + math.log(d / (dmin - 0.5)); m = m + 1 end end
  return 1 + m / s
end

describe('pn.graph.hyperbolic', function()
  it('threshold model: exactly the pairs within the threshold (brute force, n <= 500)', function()
    for _, cfg in ipairs({ { n = 300, degree = 6, seed = 1 }, { n = 500, degree = 3, alpha = 0.7, seed = 2 },
                           { n = 400, preset = 'han', seed = 3 }, { n = 200, R = 4, seed = 4 },
                           { n = 350, degree = 20, exponent = 2.4, seed = 5 }, { n = 2, R = 1, seed = 6 } }) do
      local h = pn.graph.hyperbolic(cfg)
      local got, ng = edge_set(h)
      local want, nw = brute(h)
      assert.equal(nw, ng, 'edge count for seed ' .. cfg.seed)
      for k in pairs(want) do assert.is_true(got[k], 'missing edge ' .. k .. ' seed ' .. cfg.seed) end
    end
  end)

  it('edges come in both directions: the second half is the first reversed', function()
    local h = pn.graph.hyperbolic{ n = 1000, degree = 8, seed = 9 }
    local E = h.edges:shape()[1] / 2
    assert.equal(E * 2, h.edges:shape()[1])
    local a, b = h.edges:narrow(1, 1, E), h.edges:narrow(1, E + 1, E)
    assert.same(a:select(2, 1):totable(), b:select(2, 2):totable())
    assert.same(a:select(2, 2):totable(), b:select(2, 1):totable())
    assert.equal('i64', h.edges:dtype())
    assert.equal('f64', h.r:dtype())
    for _, x in ipairs(h.r:totable()) do assert.truthy(x >= 0 and x <= h.R) end
    for _, x in ipairs(h.phi:totable()) do assert.truthy(x >= 0 and x < 2 * math.pi) end
  end)

  it('is the same graph at any thread count, and another for another seed', function()
    local saved = pn.num_threads()
    local out = {}
    for i, t in ipairs({ 1, 2, 3 }) do
      pn.set_num_threads(t)
      out[i] = pn.graph.hyperbolic{ n = 5000, degree = 10, seed = 11 }
    end
    pn.set_num_threads(saved)
    for i = 2, 3 do
      assert.same(out[1].edges:totable(), out[i].edges:totable())
      assert.same(out[1].r:totable(), out[i].r:totable())
      assert.equal(out[1].R, out[i].R)
    end
    local other = pn.graph.hyperbolic{ n = 5000, degree = 10, seed = 12 }
    assert.are_not.same(out[1].r:totable(), other.r:totable())
  end)

  it('mean degree within 5 % of the target and the tail exponent within 0.2 of 2α + 1', function()
    for _, cfg in ipairs({ { exponent = 3, degree = 10 }, { exponent = 2.5, degree = 6 } }) do
      local sum = 0
      for seed = 1, 3 do
        local h = pn.graph.hyperbolic{ n = 20000, degree = cfg.degree, exponent = cfg.exponent, seed = seed }
        sum = sum + mean_degree(h)
      end
      local m = sum / 3
      assert.truthy(math.abs(m - cfg.degree) < 0.05 * cfg.degree, 'mean degree ' .. m)
      local h = pn.graph.hyperbolic{ n = 100000, degree = cfg.degree, exponent = cfg.exponent, seed = 1 }
      local g = exponent_mle(pn.graph.degrees(h.edges, h.n):totable(), 2 * cfg.degree)
      assert.truthy(math.abs(g - cfg.exponent) < 0.2, 'exponent ' .. g .. ' for ' .. cfg.exponent)
    end
  end)

  it('Fermi–Dirac model: edge frequency follows 1/(1 + e^((d − R)/2T)) and the mean degree the target', function()
    local T = 0.3
    local bins, hits = {}, {}
    local sum = 0
    for seed = 1, 4 do
      local h = pn.graph.hyperbolic{ n = 600, degree = 8, T = T, seed = seed }
      sum = sum + mean_degree(h)
      local set = edge_set(h)
      local r, phi = h.r:totable(), h.phi:totable()
      for u = 1, h.n do
        for v = u + 1, h.n do
          local d = math.abs(phi[u] - phi[v])
          if d > math.pi then d = 2 * math.pi - d end
          local x = math.cosh(r[u] - r[v]) + (1 - math.cos(d)) * math.sinh(r[u]) * math.sinh(r[v])
          local dist = math.log(x + math.sqrt(math.max(x * x - 1, 0)))
          local b = math.floor((dist - h.R) / 0.5) -- bins of width 0.5 around R
          if b >= -4 and b <= 3 then
            bins[b] = (bins[b] or 0) + 1
            hits[b] = (hits[b] or 0) + (set[(u - 1) .. ':' .. (v - 1)] and 1 or 0)
          end
        end
      end
    end
    assert.truthy(math.abs(sum / 4 - 8) < 0.08 * 8, 'mean degree ' .. sum / 4)
    for b = -4, 3 do
      local mid = (b + 0.5) * 0.5
      local p = 1 / (1 + math.exp(mid / (2 * T)))
      local f = hits[b] / bins[b]
      local se = math.sqrt(p * (1 - p) / bins[b])
      -- the bin's width moves p by up to ~0.2 around its middle value; plus 4 standard errors
      assert.truthy(math.abs(f - p) < 0.2 + 4 * se, string.format('bin %d: frequency %.3f vs %.3f', b, f, p))
    end
  end)

  it('the han preset: α = 0.95, R = acosh(n/2π + 1), edges within 0.35·R', function()
    local h = pn.graph.hyperbolic{ n = 1000, preset = 'han', seed = 1 }
    assert.truthy(math.abs(h.alpha - 0.95) < 1e-12)
    local x = 1000 / (2 * math.pi) + 1
    assert.truthy(math.abs(h.R - math.log(x + math.sqrt(x * x - 1))) < 1e-12)
    assert.truthy(math.abs(h.threshold - 0.35 * h.R) < 1e-12)
  end)

  it('names impossible parameters with their valid range', function()
    local cases = {
      { { n = 100, degree = 5, exponent = 2 }, 'exponent must be > 2' },
      { { n = 100, degree = 5, exponent = 1.5 }, 'exponent must be > 2' },
      { { n = 100, degree = 5, alpha = 0.5 }, 'alpha must be > 0.5' },
      { { n = 100, degree = 99 }, 'degree = 99 must be < n - 1' },
      { { n = 100, degree = 150 }, 'must be < n - 1' },
      { { n = 1, degree = 1 }, 'n must be >= 2' },
      { { n = 100, degree = 5, T = -0.1 }, 'T must be >= 0' },
      { { n = 100, degree = 5, T = 1 }, 'T must be < 1' },
      { { n = 100 }, 'give degree' },
      { { degree = 3 }, 'n (the number of nodes' },
      { { n = 100, degree = 5, exponant = 3 }, "unknown option 'exponant'" },
      { { n = 100, degree = 5, exponent = 3, alpha = 2 }, 'disagree' },
      { { n = 30000, degree = 5, T = 0.5 }, 'n <= 20000' },
      { { n = 100, preset = 'han', degree = 4 }, 'leave out' },
      { { n = 100, preset = 'nope' }, 'preset must be one of han' },
    }
    for _, c in ipairs(cases) do
      local ok, e = pcall(pn.graph.hyperbolic, c[1])
      assert.is_false(ok, c[2])
      assert.truthy(tostring(e):find('graph.hyperbolic', 1, true), tostring(e))
      assert.truthy(tostring(e):find(c[2], 1, true), tostring(e) .. ' (wanted: ' .. c[2] .. ')')
    end
  end)
end)

-- ---- algorithms ---------------------------------------------------------------------------------
local function random_graph(n, m, seed)
  math.randomseed(seed)
  local edges = {}
  for _ = 1, m do
    local a, b = math.random(0, n - 1), math.random(0, n - 1)
    if a ~= b then edges[#edges + 1] = { a, b }; edges[#edges + 1] = { b, a } end
  end
  return edges
end

local function floyd(n, edges)
  local INF = math.huge
  local d = {}
  for i = 1, n do d[i] = {} for j = 1, n do d[i][j] = i == j and 0 or INF end end
  for _, e in ipairs(edges) do d[e[1] + 1][e[2] + 1] = 1 end
  for k = 1, n do for i = 1, n do for j = 1, n do
    if d[i][k] + d[k][j] < d[i][j] then d[i][j] = d[i][k] + d[k][j] end
  end end end
  return d
end

describe('graph algorithms', function()
  it('bfs equals Floyd–Warshall; max caps the distance; distances of pairs agree', function()
    for seed = 1, 4 do
      local n = 30
      local edges = random_graph(n, 30 + 5 * seed, seed)
      local g = pn.graph(#edges > 0 and pn.tensor(edges, { dtype = 'i64' }) or pn.zeros({ 0, 2 }, { dtype = 'i64' }), n)
      local fw = floyd(n, edges)
      local src = {}
      for i = 0, n - 1 do src[#src + 1] = i end
      local d = pn.graph.bfs(g, src):totable()
      local dc = pn.graph.bfs(g, src, { max = 2 }):totable()
      local pairs, want = {}, {}
      for i = 1, n do
        for j = 1, n do
          local w = fw[i][j] == math.huge and -1 or fw[i][j]
          assert.equal(w, d[i][j], string.format('seed %d: d(%d, %d)', seed, i - 1, j - 1))
          assert.equal((w >= 0 and w <= 2) and w or -1, dc[i][j])
          if (i + j) % 7 == 0 then pairs[#pairs + 1] = { i - 1, j - 1 }; want[#want + 1] = w end
        end
      end
      assert.same(want, pn.graph.distances(g, pairs):totable())
    end
  end)

  it('components: labels are the smallest node id of each component', function()
    for seed = 1, 4 do
      local n = 40
      local edges = random_graph(n, 18, seed + 10)
      local g = pn.graph(#edges > 0 and pn.tensor(edges, { dtype = 'i64' }) or pn.zeros({ 0, 2 }, { dtype = 'i64' }), n)
      local c = pn.graph.components(g)
      -- plain union-find
      local parent = {}
      for i = 0, n - 1 do parent[i] = i end
      local function find(x) while parent[x] ~= x do x = parent[x] end return x end
      for _, e in ipairs(edges) do
        local a, b = find(e[1]), find(e[2])
        if a ~= b then parent[math.max(a, b)] = math.min(a, b) end
      end
      local labels, count = c.labels:totable(), 0
      for i = 0, n - 1 do
        assert.equal(find(i), labels[i + 1])
        if find(i) == i then count = count + 1 end
      end
      assert.equal(count, c.count)
    end
  end)

  it('slice keeps the nodes with angle in [0, θ] and exactly the edges between them', function()
    local h = pn.graph.hyperbolic{ n = 600, degree = 8, seed = 21 }
    for _, theta in ipairs({ math.pi / 6, math.pi, 2 * math.pi }) do
      local s = pn.graph.slice(h, theta)
      local ids, phi = s.ids:totable(), h.phi:totable()
      local kept = {}
      for i, id in ipairs(ids) do
        assert.truthy(phi[id + 1] <= theta)
        assert.equal(phi[id + 1], s.phi:totable()[i])
        kept[id] = i - 1
      end
      local inside = 0
      for i, p in ipairs(phi) do if p <= theta then inside = inside + 1; assert.truthy(kept[i - 1]) end end
      assert.equal(inside, s.n)
      local want = 0
      for _, e in ipairs(h.edges:totable()) do if kept[e[1]] and kept[e[2]] then want = want + 1 end end
      assert.equal(want, s.edges:shape()[1])
      for _, e in ipairs(s.edges:totable()) do assert.truthy(e[1] < s.n and e[2] < s.n) end
    end
    for _, bad in ipairs({ 0, -1, 7, 0 / 0 }) do
      local ok, e = pcall(pn.graph.slice, h, bad)
      assert.is_false(ok)
      assert.truthy(tostring(e):find('must be an angle in (0, 2π]', 1, true), tostring(e))
    end
  end)

  it('degrees count rows at their source; bad graphs and ids are named errors', function()
    local d = pn.graph.degrees(pn.tensor({ { 0, 1 }, { 1, 0 }, { 0, 2 }, { 2, 0 } }, { dtype = 'i64' }), 4)
    assert.same({ 2, 1, 1, 0 }, d:totable())
    local g = pn.graph(pn.tensor({ { 0, 1 }, { 1, 0 } }, { dtype = 'i64' }), 3)
    local ok, e = pcall(pn.graph.bfs, g, { 5 })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('graph.bfs: source 1 is node 5, outside [0, 3)', 1, true), tostring(e))
    ok, e = pcall(pn.graph.bfs, {}, { 0 })
    assert.truthy(tostring(e):find('g must be a graph table', 1, true))
    ok, e = pcall(pn.graph.bfs, g, { 0 }, { max = -1 })
    assert.truthy(tostring(e):find('max must be >= 0', 1, true), tostring(e))
    -- pn.graph is still the CSR builder
    assert.equal(3, g.num_nodes)
  end)
end)
