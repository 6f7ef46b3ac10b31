-- CSR builder (core/graph/csr.c, pn.graph): against a naive plain-Lua build (sort the
-- (dst, src) pairs, count per destination), self loops, input forms, errors.
local pn = require 'penumbra'

local assert_error_matching = require('spec.helpers.check').assert_error_matching

-- naive CSR by destination: list of {src, dst}, 0-based ids
local function naive_csr(edges, n, self_loops)
  local pairs_, has_self = {}, {}
  for _, e in ipairs(edges) do
    pairs_[#pairs_ + 1] = { e[1], e[2] }
    if e[1] == e[2] then has_self[e[1]] = true end
  end
  if self_loops then
    for v = 0, n - 1 do
      if not has_self[v] then pairs_[#pairs_ + 1] = { v, v } end
    end
  end
  table.sort(pairs_, function(a, b)
    if a[2] ~= b[2] then return a[2] < b[2] end
    return a[1] < b[1]
  end)
  local offsets, src = {}, {}
  for v = 0, n do offsets[v + 1] = 0 end
  for i, p in ipairs(pairs_) do
    src[i] = p[1]
    offsets[p[2] + 2] = offsets[p[2] + 2] + 1
  end
  for v = 1, n do offsets[v + 1] = offsets[v + 1] + offsets[v] end
  return offsets, src
end

local function random_edges(n, e)
  local r = {}
  for i = 1, e do r[i] = { math.random(0, n - 1), math.random(0, n - 1) } end
  return r
end

local function check(g, edges, n, self_loops)
  local offsets, src = naive_csr(edges, n, self_loops)
  assert.same(offsets, g.offsets:totable())
  assert.same(src, #src > 0 and g.src:totable() or {})
  assert.equal('i64', g.offsets:dtype())
  assert.equal('i64', g.src:dtype())
  assert.equal(n, g.num_nodes)
  assert.equal(#src, g.num_edges)
end

describe('pn.graph', function()
  before_each(function() math.randomseed(11) end)

  it('builds the CSR by destination, sources sorted, duplicates kept (i32, i64, Lua lists)', function()
    for _, case in ipairs({ { 6, 15 }, { 30, 100 }, { 1, 3 } }) do
      local n, e = case[1], case[2]
      local edges = random_edges(n, e)
      edges[#edges + 1] = edges[1]   -- a duplicate
      for _, self_loops in ipairs({ true, false }) do
        check(pn.graph(pn.tensor(edges, { dtype = 'i64' }), n, { self_loops = self_loops }), edges, n, self_loops)
        check(pn.graph(pn.tensor(edges, { dtype = 'i32' }), n, { self_loops = self_loops }), edges, n, self_loops)
        check(pn.graph(edges, n, { self_loops = self_loops }), edges, n, self_loops)
      end
    end
  end)

  it('reads non-contiguous edge tensors', function()
    local edges = random_edges(8, 20)
    local cols = { {}, {} }
    for i, e in ipairs(edges) do cols[1][i], cols[2][i] = e[1], e[2] end
    local t = pn.tensor(cols, { dtype = 'i64' }):transpose(1, 2)   -- (E, 2) with strides (1, E)
    assert.is_false(t:is_contiguous())
    check(pn.graph(t, 8), edges, 8, true)
  end)

  it('adds a self loop only to nodes lacking one, in sorted position', function()
    local g = pn.graph({ { 0, 1 }, { 2, 1 }, { 1, 1 }, { 0, 2 } }, 4)
    assert.same({ 0, 1, 4, 6, 7 }, g.offsets:totable())
    assert.same({ 0, 0, 1, 2, 0, 2, 3 }, g.src:totable())
    local g2 = pn.graph({ { 0, 1 }, { 2, 1 }, { 1, 1 }, { 0, 2 } }, 4, { self_loops = false })
    assert.same({ 0, 0, 3, 4, 4 }, g2.offsets:totable())
    assert.same({ 0, 1, 2, 0 }, g2.src:totable())
  end)

  it('handles empty graphs and isolated nodes, and infers num_nodes when omitted', function()
    local g = pn.graph({}, 3)
    assert.same({ 0, 1, 2, 3 }, g.offsets:totable())
    assert.same({ 0, 1, 2 }, g.src:totable())
    local g0 = pn.graph(pn.zeros({ 0, 2 }, { dtype = 'i64' }), 0)
    assert.same({ 0 }, g0.offsets:totable())
    assert.equal(0, g0.num_edges)
    local gi = pn.graph({ { 4, 0 } }, nil, { self_loops = false })
    assert.equal(5, gi.num_nodes)
    assert.same({ 0, 1, 1, 1, 1, 1 }, gi.offsets:totable())
  end)

  it('feeds segment ops: offsets are valid CSR offsets', function()
    local edges = random_edges(10, 40)
    local g = pn.graph(edges, 10)
    local ones = pn.ones({ g.num_edges, 1 }, { dtype = 'f64' })
    local deg = pn.segment_sum(ones, g.offsets):totable()
    local off = g.offsets:totable()
    for v = 1, 10 do assert.equal(off[v + 1] - off[v], deg[v][1]) end
  end)

  it('rejects ids out of range, wrong shapes and dtypes, negative num_nodes', function()
    assert_error_matching(function() pn.graph({ { 0, 5 } }, 5) end, 'graph_csr', 'row 1', 'dst 5', '[0, 5)')
    assert_error_matching(function() pn.graph({ { 0, 1 }, { -1, 2 } }, 5) end, 'graph_csr', 'row 2', 'src -1')
    assert_error_matching(function() pn.graph(pn.zeros({ 3, 3 }, { dtype = 'i64' }), 5) end, 'graph_csr', '[3,3]', '(E, 2)')
    assert_error_matching(function() pn.graph(pn.zeros({ 4 }, { dtype = 'i64' }), 5) end, 'graph_csr', '[4]')
    assert_error_matching(function() pn.graph(pn.zeros({ 3, 2 }), 5) end, 'graph_csr', 'f32', 'i32 or i64')
    assert_error_matching(function() pn.graph({ { 0, 1 } }, -2) end, 'graph_csr', 'num_nodes = -2')
    assert_error_matching(function() pn.graph({ { 0, 1 }, { 2 } }, 3) end, 'graph', 'edge 2')
    assert_error_matching(function() pn.graph({ { 0, 1 } }, 2.5) end, 'graph', 'num_nodes')
  end)
end)
