-- The scale-free graph tasks (lua/penumbra/data/scalefree.lua), the Recursive Transformer
-- (lua/penumbra/nn/recursive.lua) and the recipe (lua/penumbra/recipes/scalefree.lua):
-- LP examples against the generator's own edges, SPLP labels against BFS, the rejection
-- sampler's histogram, the curriculum, bounded sampling on hopeless graphs, the tied weights'
-- summed gradient (f64 gradcheck and agreement with an unrolled copy), equal parameter counts,
-- and a tiny LP run that learns. Training examples are independent streams (example i of a step
-- is a function of (seed, step, i)), so a rank of `./bench -n N` makes only its share of a batch
-- (here with a stand-in sharer; the real 2-rank runs are in spec/ddp_spec.lua).
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'

local function has_row(edges, a, b)
  for _, e in ipairs(edges:totable()) do if e[1] == a and e[2] == b then return true end end
  return false
end

describe('pn.data.scalefree', function()
  it('LP: a positive is an edge of the graph, removed (both ways) from the input; a negative is a non-edge', function()
    local d = pn.data.scalefree{ task = 'lp', n = 150, preset = 'han', eval_size = 4 }
    local pos, neg = 0, 0
    for seed = 1, 40 do
      local h = pn.graph.hyperbolic{ n = 150, preset = 'han', seed = seed }
      local ex = d:example(h, seed)
      assert.truthy(ex.a ~= ex.b)
      if ex.y == 1 then
        pos = pos + 1
        assert.is_true(has_row(h.edges, ex.a, ex.b))
        assert.is_false(has_row(ex.edges, ex.a, ex.b))
        assert.is_false(has_row(ex.edges, ex.b, ex.a))
        assert.equal(h.edges:shape()[1] - 2, ex.edges:shape()[1])
      else
        neg = neg + 1
        assert.is_false(has_row(h.edges, ex.a, ex.b))
        assert.equal(h.edges:shape()[1], ex.edges:shape()[1])
      end
    end
    assert.truthy(pos >= 10 and neg >= 10, pos .. ' positives, ' .. neg .. ' negatives')
  end)

  it('SPLP: labels are the BFS length − 1 on the input graph, within 1 … max_len', function()
    local d = pn.data.scalefree{ task = 'splp', n = 300, preset = 'han', eval_size = 30 }
    for _, b in ipairs({ d:batch(500, 6), d.test[1] }) do
      local g = pn.graph(b.edges, b.num_nodes, { self_loops = false })
      local want = pn.graph.distances(g, b.pairs):totable()
      for i, y in ipairs(b.y:totable()) do
        assert.equal(want[i] - 1, y)
        assert.truthy(y >= 0 and y < 25)
        assert.equal(want[i], b.lengths[i])
      end
    end
  end)

  it('SPLP training lengths are near-uniform; the natural test distribution is not', function()
    local d = pn.data.scalefree{ task = 'splp', n = 400, preset = 'han', eval_size = 150, steps = 10, curriculum = 0 }
    local train, test = {}, {}
    for step = 1, 40 do
      for _, y in ipairs(d:batch(step, 15).y:totable()) do train[y + 1] = (train[y + 1] or 0) + 1 end
    end
    for _, b in ipairs(d.test) do for _, y in ipairs(b.y:totable()) do test[y + 1] = (test[y + 1] or 0) + 1 end end
    -- the lengths every 400-node graph has: 1 … 5 — equal shares within ±35 % in training
    local tot = 0
    for L = 1, 5 do tot = tot + (train[L] or 0) end
    for L = 1, 5 do
      local share = (train[L] or 0) / tot
      assert.truthy(math.abs(share - 0.2) < 0.35 * 0.2, string.format('length %d: %.3f of lengths 1-5', L, share))
    end
    -- natural: length 1 (an edge) is rare among random connected pairs, mid lengths common
    local most, least = 0, math.huge
    for L = 1, 5 do most = math.max(most, test[L] or 0); least = math.min(least, test[L] or 0) end
    assert.truthy(most >= 3 * math.max(least, 1), 'natural lengths ' .. most .. ' vs ' .. least)
    assert.truthy(d.baseline > 0 and d.baseline < 0.5)
  end)

  it('curriculum: slices from 30° up to the whole disk over the first part of training', function()
    local d = pn.data.scalefree{ task = 'lp', n = 300, preset = 'han', eval_size = 4, steps = 600, lessons = 6,
                                 curriculum = 0.5 }
    assert.truthy(math.abs(d:angle(1) - math.pi / 6) < 1e-12)
    local prev = 0
    for step = 1, 600, 25 do
      local a = d:angle(step)
      assert.truthy(a >= prev - 1e-12)
      prev = a
    end
    assert.equal(2 * math.pi, d:angle(301))
    assert.equal(2 * math.pi, d:angle(600))
    local early, late = d:batch(1, 8).num_nodes, d:batch(400, 8).num_nodes
    assert.truthy(early < late / 4, early .. ' nodes early vs ' .. late .. ' late')
  end)

  it('bad options are named; hopeless graphs are an error after a bounded number of tries', function()
    local ok, e = pcall(pn.data.scalefree, { task = 'nope' })
    assert.truthy(tostring(e):find('task must be one of lp, splp', 1, true), tostring(e))
    ok, e = pcall(pn.data.scalefree, { task = 'lp', n = 5 })
    assert.truthy(tostring(e):find('n must be >= 10', 1, true), tostring(e))
    ok, e = pcall(pn.data.scalefree, { task = 'lp', preset = 'han', degree = 3 })
    assert.truthy(tostring(e):find('leave out degree', 1, true), tostring(e))
    ok, e = pcall(pn.data.scalefree, { task = 'lp', nn = 5 })
    assert.truthy(tostring(e):find("unknown option 'nn'", 1, true), tostring(e))
    -- a disk so large that no two points are linked: every graph has no edge
    local t0 = os.clock()
    ok, e = pcall(pn.data.scalefree, { task = 'lp', n = 20, degree = 0.001, eval_size = 2 })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('50 graphs in a row had no usable lp pair', 1, true), tostring(e))
    assert.truthy(os.clock() - t0 < 30)
  end)
end)

-- ---- training streams ------------------------------------------------------------------------------
-- a batch cut back into its examples: per graph, a string of its size, queried pair, label, edges and
-- degree feature (node ids relative to the graph), so examples compare across batches
local function split_examples(b)
  local edges, pairs, y, x = b.edges:totable(), b.pairs:totable(), b.y:totable(), b.x:totable()
  local out, base, e = {}, 0, 1
  for i, m in ipairs(b.sizes) do
    local t = { m, pairs[i][1] - base, pairs[i][2] - base, y[i] }
    -- collate concatenates the graphs' edge lists in order: this graph's rows come next
    while e <= #edges and edges[e][1] < base + m do
      t[#t + 1] = (edges[e][1] - base) .. '-' .. (edges[e][2] - base)
      e = e + 1
    end
    for v = base + 1, base + m do t[#t + 1] = string.format('%.6g', x[v][2]) end
    out[i] = table.concat(t, ' ')
    base = base + m
  end
  assert.equal(#edges + 1, e, 'every edge belongs to a graph')
  return out
end

describe('pn.data.scalefree training streams', function()
  for _, task in ipairs({ 'lp', 'splp' }) do
    it(task .. ': example i of a step is the same in a batch of 8, alone, and in other compositions', function()
      local d = pn.data.scalefree{ task = task, n = 60, preset = 'han', eval_size = 2, curriculum = 0 }
      local all = split_examples(d:batch(9, 8))
      assert.equal(8, #all)
      local distinct = {}
      for i = 1, 8 do
        distinct[all[i]] = true
        assert.same({ all[i] }, split_examples(d:examples(9, { i })), 'example ' .. i .. ' alone')
      end
      local n = 0
      for _ in pairs(distinct) do n = n + 1 end
      assert.equal(8, n, 'eight different graphs')
      assert.same({ all[1], all[2], all[3] }, split_examples(d:batch(9, 3)))
      assert.same({ all[6], all[2] }, split_examples(d:examples(9, { 6, 2 })))
      -- the curriculum's slice is per step, the same for every example of it
      local c = pn.data.scalefree{ task = task, n = 60, preset = 'han', eval_size = 2, steps = 100 }
      local early = split_examples(c:batch(2, 5))
      assert.same({ early[4] }, split_examples(c:examples(2, { 4 })))
    end)
  end

  it('deterministic per (seed, step); other steps and other seeds draw other graphs', function()
    local function make(seed) return pn.data.scalefree{ task = 'splp', n = 60, preset = 'han', eval_size = 2,
                                                          curriculum = 0, seed = seed } end
    local a, again, other = make(0), make(0), make(1)
    local b = split_examples(a:batch(5, 4))
    assert.same(b, split_examples(again:batch(5, 4)))
    assert.same(b, split_examples(a:batch(5, 4)))
    local seen = {}
    for _, t in ipairs(b) do seen[t] = true end
    for _, t in ipairs(split_examples(a:batch(6, 4))) do assert.is_nil(seen[t], 'step 6 repeats a graph of step 5') end
    for _, t in ipairs(split_examples(other:batch(5, 4))) do assert.is_nil(seen[t], 'seed 1 repeats a graph of seed 0') end
    -- the evaluation sets do not depend on the run's seed
    assert.same(split_examples(a.test[1]), split_examples(other.test[1]))
  end)

  it('validation and test graphs never share a graph seed, however large eval_size', function()
    local real_gen = pn.graph.hyperbolic
    local seeds = {}
    local ok, e = pcall(function()
      pn.graph.hyperbolic = function(o)
        seeds[#seeds + 1] = o.seed
        return real_gen(o)
      end
      local d = pn.data.scalefree{ task = 'lp', n = 20, degree = 6, eval_size = 300 }
      assert.equal(12, #d.val)
    end)
    pn.graph.hyperbolic = real_gen
    assert.is_true(ok, e)
    -- every graph of val and test drawn from its own seed: none drawn twice (before, val's
    -- chunks from the 11th on reached test's seeds at 2e6)
    local count = {}
    for _, sd in ipairs(seeds) do
      assert.is_nil(count[sd], 'graph seed ' .. sd .. ' drawn twice')
      count[sd] = true
    end
    assert.truthy(#seeds >= 600, #seeds .. ' graphs')
    local ok2, e2 = pcall(pn.data.scalefree, { task = 'lp', n = 20, eval_size = 25001 })
    assert.is_false(ok2)
    assert.truthy(tostring(e2):find('eval_size'), e2)
  end)

  it('the recipe\'s seed reaches the training graphs', function()
    local R = require 'penumbra.recipes.scalefree'
    local cfg = { task = 'lp', n = 60, preset = 'han', steps = 10, lessons = 1, curriculum = 0, eval_size = 2,
                  max_len = 25, negatives = 'uniform', seed = 3 }
    local d3 = R.data(cfg)
    cfg.seed = 4
    local d4 = R.data(cfg)
    assert.equal(3, d3.seed)
    assert.are_not.same(d3:batch(1, 2).edges:totable(), d4:batch(1, 2).edges:totable())
  end)

  it('under ./bench -n 2 (a stand-in sharer): a rank generates only its examples\' graphs, and the shares ' ..
    'make the batch', function()
    local ddp = require 'penumbra.ddp'
    local d = pn.data.scalefree{ task = 'lp', n = 60, preset = 'han', eval_size = 2, curriculum = 0 }
    local real_sharer, real_gen = ddp.sharer, pn.graph.hyperbolic
    -- the example a graph seed belongs to (seed 0, step 4: the layout at train_key)
    local made = {}
    local function examples_made()
      local t, list = {}, {}
      for _, s in ipairs(made) do t[math.floor((s - 1e10 - 4 * 1e5) / 100) + 1] = true end
      for i in pairs(t) do list[#list + 1] = i end
      table.sort(list)
      made = {}
      return list
    end
    local ok, e = pcall(function()
      pn.graph.hyperbolic = function(o)
        made[#made + 1] = o.seed
        return real_gen(o)
      end
      local whole = d:batch(4, 6)
      assert.same({ 1, 2, 3, 4, 5, 6 }, examples_made())
      local all = split_examples(whole)
      for rank = 0, 1 do
        local weights = {}
        -- ddp's sharer: strided items, weights in the count's unit
        ddp.sharer = function()
          return function(items, count, what)
            assert.equal('graphs', what)
            local mine, here, total = {}, 0, 0
            for i, it in ipairs(items) do
              total = total + count(it)
              if (i - 1) % 2 == rank then mine[#mine + 1], here = it, here + count(it) end
            end
            weights[#weights + 1] = here / total
            return mine
          end
        end
        local b = d:batch(4, 6)
        local mine = rank == 0 and { 1, 3, 5 } or { 2, 4, 6 }
        assert.same(mine, examples_made(), 'rank ' .. rank .. ' made the graphs of these examples only')
        assert.same(mine, b.examples)
        assert.equal(6, b.batch_size)
        assert.same({ all[mine[1]], all[mine[2]], all[mine[3]] }, split_examples(b))
        assert.same({ 0.5 }, weights, 'one share a batch, each example weighing 1')
      end
    end)
    ddp.sharer, pn.graph.hyperbolic = real_sharer, real_gen
    assert.is_true(ok, tostring(e))
  end)

  it('the seed layout\'s ranges are named errors: step, batch size, example numbers, seed', function()
    local d = pn.data.scalefree{ task = 'lp', n = 60, preset = 'han', eval_size = 2 }
    local ok, e = pcall(d.batch, d, 1e7, 4)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('batch: step must be an integer in 0 … 9999999', 1, true), tostring(e))
    ok, e = pcall(d.batch, d, 1, 1001)
    assert.truthy(tostring(e):find('batch: size must be an integer in 1 … 1000', 1, true), tostring(e))
    ok, e = pcall(d.examples, d, 1, { 0 })
    assert.truthy(tostring(e):find('examples: example numbers must be integers in 1 … 1000', 1, true), tostring(e))
    ok, e = pcall(pn.data.scalefree, { task = 'lp', n = 60, preset = 'han', eval_size = 2, seed = 9001 })
    assert.truthy(tostring(e):find('seed must be <= 9000', 1, true), tostring(e))
  end)
end)

-- ---- the model ------------------------------------------------------------------------------------
local function to_f64(m)
  for _, name in ipairs(m._param_order) do m:param(name, m._params[name]:to('f64')) end
  for _, c in ipairs(m:children()) do to_f64(c) end
  return m
end

-- a small batch: two graphs of 5 and 4 nodes
local function tiny_batch(dtype)
  local edges = { { 0, 1 }, { 1, 0 }, { 1, 2 }, { 2, 1 }, { 2, 3 }, { 3, 2 }, { 3, 4 }, { 4, 3 }, { 0, 2 }, { 2, 0 },
                  { 5, 6 }, { 6, 5 }, { 6, 7 }, { 7, 6 }, { 7, 8 }, { 8, 7 } }
  local g = pn.graph(pn.tensor(edges, { dtype = 'i64' }), 9)
  g.sizes = { 5, 4 }
  pn.manual_seed(3)
  local x = pn.randn({ 9, 5 }, { dtype = dtype })
  local pairs = pn.tensor({ { 0, 4 }, { 5, 8 }, { 1, 3 } }, { dtype = 'i64' })
  return x, g, pairs
end

describe('pn.nn.RecursiveTransformer', function()
  local CONFIGS = {
    { score = 'dot' }, { score = 'laplacian' }, { score = 'umbral' }, { score = 'penumbral' },
    { score = 'hyperbolic', normalize = 'sigmoid', aggregate = 'einstein' }, { score = 'hyperbolic', dense = true },
    { score = 'dot', dense = true },
  }

  it('the same parameter count for every score at the same width', function()
    local n
    for _, c in ipairs(CONFIGS) do
      c.in_dim, c.out_dim = 5, 2
      local m = pn.nn.RecursiveTransformer(c)
      n = n or m:num_parameters()
      assert.equal(n, m:num_parameters(), c.score)
    end
  end)

  for _, c in ipairs(CONFIGS) do
    it((c.dense and 'dense ' or 'graph ') .. c.score .. (c.aggregate and ' einstein' or '') ..
       ': f64 gradcheck of the tied block weights (summed over the recursions)', function()
      pn.manual_seed(7)
      local o = {}
      for k, v in pairs(c) do o[k] = v end
      o.in_dim, o.out_dim, o.d_model, o.heads, o.head_dim, o.ff = 5, 3, 8, 2, 4, 8
      local m = to_f64(pn.nn.RecursiveTransformer(o))
      local x, g, pairs = tiny_batch('f64')
      gradcheck(function() return m(x, g, pairs) end, { m.q_proj.weight, m.k_proj.bias, m.v_proj.weight, m.ff1.weight },
        { atol = 1e-5, rtol = 1e-4 })
    end)
  end

  it('names its own inputs when they are wrong (not the layer or the index op inside)', function()
    local m = pn.nn.RecursiveTransformer{ in_dim = 5, out_dim = 2 }
    local md = pn.nn.RecursiveTransformer{ in_dim = 5, out_dim = 2, dense = true }
    local x, g, pq = tiny_batch('f32')
    local cases = {
      { function() return m(pn.ones({ 9, 4 }), g, pq) end, 'RecursiveTransformer: x must be (N, in_dim = 5), got [9,4]' },
      { function() return m(x, nil, pq) end, 'RecursiveTransformer: g must be a graph of the N nodes (pn.graph), got nil' },
      { function() return m(x:narrow(1, 1, 8), g, pq) end, 'RecursiveTransformer: g has 9 nodes, x has 8 rows' },
      { function() return md(x, { sizes = { 5, 3 } }, pq) end, 'RecursiveTransformer: g.sizes add up to 8 nodes, x has 9 rows' },
      { function() return m(x, g, pn.ones({ 3, 2 })) end,
        'RecursiveTransformer: pairs must be a (P, 2) i64 tensor of 0-based node ids, got f32 [3,2]' },
      { function() return m(x, g, pn.tensor({ { 0, 9 } }, { dtype = 'i64' })) end,
        'RecursiveTransformer: pairs holds node id 9, outside 0..8 (x has 9 rows)' },
    }
    for i, c in ipairs(cases) do
      local ok, e = pcall(c[1])
      assert.is_false(ok, i)
      assert.truthy(tostring(e):find(c[2], 1, true), tostring(e))
    end
    assert.are.same({ 3, 2 }, m(x, g, pq):shape())
    assert.are.same({ 3, 2 }, md(x, g, pq):shape())
  end)

  it('the tied gradient is the sum of the gradients of three untied copies', function()
    pn.manual_seed(5)
    local m = pn.nn.RecursiveTransformer{ in_dim = 5, out_dim = 2, score = 'umbral' }
    local x, g, pq = tiny_batch('f32')
    local y = pn.tensor({ 1, 0, 1 }, { dtype = 'i64' })
    pn.cross_entropy(m(x, g, pq), y):backward()
    local tied = m.k_proj.weight.grad:totable()
    -- unrolled: recursion i uses its own leaf copy of every block weight
    local names = { 'q_proj', 'k_proj', 'v_proj', 'out_proj', 'norm1', 'ff1', 'ff2', 'norm2' }
    local copies = {}
    local h = m.encoder(x):relu()
    for i = 1, 3 do
      copies[i] = {}
      local saved = {}
      for _, nm in ipairs(names) do
        local sub = m[nm]
        saved[nm] = {}
        for _, pname in ipairs(sub._param_order) do
          saved[nm][pname] = sub[pname]
          sub[pname] = sub[pname]:detach():clone():requires_grad_()
          copies[i][nm .. '.' .. pname] = sub[pname]
        end
      end
      h = m:block(h, g)
      for _, nm in ipairs(names) do for pname, t in pairs(saved[nm]) do m[nm][pname] = t end end
    end
    local ha, hb = h:index_select(1, pq:select(2, 1):contiguous()), h:index_select(1, pq:select(2, 2):contiguous())
    local logits = m.read2(m.read1(pn.cat({ ha, hb, ha * hb, (ha - hb):abs() }, 2)):relu())
    pn.cross_entropy(logits, y):backward()
    local sum = copies[1]['k_proj.weight'].grad + copies[2]['k_proj.weight'].grad + copies[3]['k_proj.weight'].grad
    local s = sum:totable()
    local worst, scale = 0, 0
    for i = 1, #s do for j = 1, #s[i] do
      worst = math.max(worst, math.abs(s[i][j] - tied[i][j]))
      scale = math.max(scale, math.abs(s[i][j]))
    end end
    assert.truthy(scale > 0)
    assert.truthy(worst <= 1e-5 * scale + 1e-7, 'tied vs summed: ' .. worst)
  end)
end)

describe('scale-free LP recipe', function()
  it('a tiny LP run learns: accuracy well above 0.5 within a few hundred steps on 50-node graphs', function()
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local dir = os.tmpname()
    os.remove(dir)
    local ffi = require 'ffi'
    pcall(ffi.cdef, 'int setenv(const char *, const char *, int);')
    local prev = os.getenv('PENUMBRA_RUNS')
    ffi.C.setenv('PENUMBRA_RUNS', dir, 1)
    local saved = rawget(_G, 'args')
    _G.args = { n = '50', steps = '250', eval_every = '125', eval_size = '100', batch = '16', _quiet = true }
    local ok, r = pcall(dofile, home .. '/experiments/scalefree_lp_dot.lua')
    _G.args = saved
    if prev then ffi.C.setenv('PENUMBRA_RUNS', prev, 1) end
    assert.is_true(ok, tostring(r))
    assert.equal('finished', r.status)
    assert.truthy(r.test_acc > 0.7, 'test accuracy ' .. tostring(r.test_acc))
    local f = pn.io.open(r.path, 'r')
    assert.truthy(f:read('radii/keys'):numel() > 0)
    assert.equal(250, f:read('metrics/loss'):numel())
    f:close()
  end)
end)

describe('LP near negatives', function()
  it('are non-edges two hops apart in the input graph', function()
    local d = pn.data.scalefree{ task = 'lp', n = 200, preset = 'han', eval_size = 4, negatives = 'near' }
    local seen = 0
    for seed = 1, 30 do
      local h = pn.graph.hyperbolic{ n = 200, preset = 'han', seed = seed }
      local ex = d:example(h, seed)
      if ex.y == 0 then
        seen = seen + 1
        local g = pn.graph(ex.edges, 200, { self_loops = false })
        assert.same({ 2 }, pn.graph.distances(g, { { ex.a, ex.b } }):totable())
      end
    end
    assert.truthy(seen >= 5)
  end)
end)
