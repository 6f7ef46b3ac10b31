-- PPI (lua/penumbra/data/ppi.lua, ppi_synthetic.lua, recipes/ppi.lua): both file layouts
-- read to the same HDF5 content, the cache, the bad files users will bring, micro-F1 against
-- a hand count, the generator's statistics, the inductive GAT, and a small inductive run
-- that learns on graphs it never saw.
local pn = require 'penumbra'
local cjson = require 'cjson'
local assert_error_matching = require('spec.helpers.check').assert_error_matching

local dirs = {}
local function tmpdir()
  local p = os.tmpname()
  os.remove(p)
  os.execute("mkdir -p '" .. p .. "'")
  dirs[#dirs + 1] = p
  return p
end
local function cleanup()
  for _, d in ipairs(dirs) do os.execute("rm -rf '" .. d .. "'") end
  dirs = {}
end
local function write(path, s)
  local f = assert(io.open(path, 'wb'))
  f:write(s)
  f:close()
end
local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

local SMALL = { graphs = 6, nodes = 60, degree = 6, features = 5, labels = 7, community = 12, seed = 3 }
local function small(dir, layout)
  local o = { dir = dir, layout = layout }
  for k, v in pairs(SMALL) do o[k] = v end
  return pn.data.ppi_synthetic(o)
end

describe('ppi loaders', function()
  after_each(cleanup)

  it('read the DGL and the GraphSAGE layout of the same data to the same HDF5 content', function()
    local a, b = tmpdir(), tmpdir()
    local da, db = small(a, 'dgl'), small(b, 'graphsage')
    assert.equal('dgl', da.layout)
    assert.equal('graphsage', db.layout)
    local ta, tb = pn.io.load(a .. '/penumbra-ppi.h5'), pn.io.load(b .. '/penumbra-ppi.h5')
    local n = 0
    for k, v in pairs(ta) do
      assert.same(v:shape(), tb[k]:shape(), k)
      assert.equal(v:dtype(), tb[k]:dtype(), k)
      assert.same(v:totable(), tb[k]:totable(), k)
      n = n + 1
    end
    assert.equal(7, n)
    local attrs = pn.io.attrs(a .. '/penumbra-ppi.h5')
    assert.equal(6, attrs.num_graphs)
    assert.equal(7, attrs.num_classes)
    assert.equal(1, attrs.synthetic)
    assert.equal(4, #da.graphs.train)
    assert.equal(1, #da.graphs.val)
    assert.equal(1, #da.graphs.test)
  end)

  it('stores the schema: canonical edges, u8 labels, graph ids in order, disjoint masks', function()
    local d = small(tmpdir(), 'dgl')
    local t = pn.io.load(d.path)
    local e = t.edges
    assert.same(pn.graph.canonical(e, t.features:shape()[1]):totable(), e:totable())
    assert.equal('u8', t.labels:dtype())
    local gid = t.graph_id:totable()
    for i = 2, #gid do assert.is_true(gid[i] >= gid[i - 1]) end
    local total = (t.train_mask:to('i32') + t.val_mask:to('i32') + t.test_mask:to('i32'))
    assert.equal(1, total:min():item())
    assert.equal(1, total:max():item())
    -- every graph's edges stay inside it
    for _, s in ipairs({ 'train', 'val', 'test' }) do
      for _, g in ipairs(d.graphs[s]) do
        if g.edges:numel() > 0 then
          assert.is_true(g.edges:min():item() >= 0 and g.edges:max():item() < g.num_nodes)
        end
      end
    end
  end)

  it('reuses the cache and converts again when a file changes', function()
    local dir = tmpdir()
    small(dir, 'dgl')
    local first = read(dir .. '/penumbra-ppi.h5')
    local before = pn.io.attrs(dir .. '/penumbra-ppi.h5').source_sizes
    local d = pn.data.ppi{ path = dir }
    assert.equal(first, read(dir .. '/penumbra-ppi.h5')) -- not converted again
    assert.is_true(d.synthetic)                           -- the attribute survives the cache
    -- the same ids in a narrower dtype: a different file size, so the cache is rebuilt
    local gid = pn.io.load_npy(dir .. '/test_graph_id.npy')
    pn.io.save_npy(dir .. '/test_graph_id.npy', gid:to('i32'))
    local d2 = pn.data.ppi{ path = dir }
    local after = pn.io.attrs(d2.path).source_sizes
    assert.are_not.equal(before, after)
    assert.truthy(after:find('test_graph_id.npy=' .. #read(dir .. '/test_graph_id.npy'), 1, true))
    assert.equal(d.num_graphs, d2.num_graphs)
  end)

  it('names the file and the problem for half-present layouts and bad files', function()
    local dir = tmpdir()
    small(dir, 'dgl')
    os.remove(dir .. '/penumbra-ppi.h5')
    os.rename(dir .. '/valid_labels.npy', dir .. '/valid_labels.bak')
    assert_error_matching(function() pn.data.ppi{ path = dir } end, 'DGL layout is half-present', 'missing valid_labels.npy')
    os.rename(dir .. '/valid_labels.bak', dir .. '/valid_labels.npy')

    -- label rows of the wrong width in one split
    local y = pn.io.load_npy(dir .. '/test_labels.npy')
    pn.io.save_npy(dir .. '/test_labels.npy', y:narrow(2, 1, 5):contiguous())
    assert_error_matching(function() pn.data.ppi{ path = dir } end, 'test_labels.npy', 'width 5', 'the other files 7')
    pn.io.save_npy(dir .. '/test_labels.npy', y)

    -- a truncated and an unsupported .npy
    local raw = read(dir .. '/valid_feats.npy')
    write(dir .. '/valid_feats.npy', raw:sub(1, #raw - 7))
    assert_error_matching(function() pn.data.ppi{ path = dir } end, 'valid_feats.npy', 'truncated')
    write(dir .. '/valid_feats.npy', read('spec/fixtures/npy/complex.npy'))
    assert_error_matching(function() pn.data.ppi{ path = dir } end, 'valid_feats.npy', "dtype '<c8' is not supported")
    write(dir .. '/valid_feats.npy', raw)

    -- a link to a node the graph does not have
    local G = cjson.decode(read(dir .. '/train_graph.json'))
    G.links[3].target = 99999
    write(dir .. '/train_graph.json', cjson.encode(G))
    assert_error_matching(function() pn.data.ppi{ path = dir } end, 'train_graph.json', 'link 3 names node 99999')
  end)

  it('GraphSAGE layout: ids missing from the id map or the class map, ragged label rows', function()
    local dir = tmpdir()
    small(dir, 'graphsage')
    os.remove(dir .. '/penumbra-ppi.h5')
    local id_map = read(dir .. '/ppi-id_map.json')
    local m = cjson.decode(id_map)
    m['5'] = nil
    write(dir .. '/ppi-id_map.json', cjson.encode(m))
    assert_error_matching(function() pn.data.ppi{ path = dir } end, 'node id 5 is missing from', 'ppi-id_map.json')
    write(dir .. '/ppi-id_map.json', id_map)
    local cm = cjson.decode(read(dir .. '/ppi-class_map.json'))
    table.remove(cm['9'])
    write(dir .. '/ppi-class_map.json', cjson.encode(cm))
    assert_error_matching(function() pn.data.ppi{ path = dir } end, 'ppi-class_map.json', 'node id 9', 'width 6',
      'the first node 7')
    os.remove(dir .. '/ppi-feats.npy')
    assert_error_matching(function() pn.data.ppi{ path = dir } end, 'GraphSAGE layout is half-present',
      'missing ppi-feats.npy')
  end)

  it('says where it looked when there are no files, and checks its options', function()
    local dir = tmpdir()
    assert_error_matching(function() pn.data.ppi{ path = dir } end, 'no PPI files found', dir, 'ppi_synthetic')
    assert_error_matching(function() pn.data.ppi{ pth = dir } end, 'pth')
  end)

  it('merges small GraphSAGE components into the graph before them', function()
    -- 3 graphs of a path each (ids 0-59, 60-119, 120-179) and an isolated node 59 inside graph 1
    local dir = tmpdir()
    local nodes, links, cm, im = {}, {}, {}, {}
    for i = 0, 179 do
      nodes[#nodes + 1] = { id = i, val = i >= 120 and i < 150, test = i >= 150 }
      cm[tostring(i)] = { i % 2, 1 }
      im[tostring(i)] = i
    end
    for i = 0, 178 do
      if i ~= 58 and i ~= 59 and i ~= 119 and i ~= 149 then links[#links + 1] = { source = i, target = i + 1 } end
    end
    write(dir .. '/ppi-G.json', cjson.encode({ nodes = nodes, links = links }))
    write(dir .. '/ppi-class_map.json', cjson.encode(cm))
    write(dir .. '/ppi-id_map.json', cjson.encode(im))
    pn.io.save_npy(dir .. '/ppi-feats.npy', pn.randn(180, 3, { dtype = 'f64' }))
    local d = pn.data.ppi{ path = dir }
    assert.equal(4, d.num_graphs) -- 0-59 (58-59 merged), 60-119, 120-149 val, 150-179 test
    assert.equal(60, d.graphs.train[1].num_nodes)
    assert.equal(60, d.graphs.train[2].num_nodes)
    assert.equal(30, d.graphs.val[1].num_nodes)
    assert.equal(30, d.graphs.test[1].num_nodes)
  end)
end)

describe('ppi_synthetic', function()
  after_each(cleanup)

  it('has the requested mean degree, balanced labels, clustering, and is deterministic', function()
    local d = pn.data.ppi_synthetic{ dir = tmpdir(), graphs = 4, nodes = 400, degree = 14, labels = 20, seed = 5 }
    local E, N, pos, tri_nodes = 0, 0, nil, 0
    for _, s in ipairs({ 'train', 'val', 'test' }) do
      for _, g in ipairs(d.graphs[s]) do
        E, N = E + g.edges:shape()[1], N + g.num_nodes
        local p = g.y:sum(1)
        pos = pos and pos + p or p
      end
    end
    assert.is_true(math.abs(E / N - 14) < 1.5, 'mean degree ' .. E / N)
    for _, r in ipairs((pos / N):totable()) do assert.is_true(r > 0.05 and r < 0.6, 'label rate ' .. r) end
    -- clustered: the local clustering coefficient of graph 1 is far above a random graph's (deg/n)
    local g = d.graphs.train[1]
    local adj = {}
    for _, e in ipairs(g.edges:totable()) do
      adj[e[1]] = adj[e[1]] or {}
      adj[e[1]][e[2]] = true
    end
    local cc, cnt = 0, 0
    for v, nb in pairs(adj) do
      local l = {}
      for u in pairs(nb) do l[#l + 1] = u end
      if #l >= 2 then
        local t = 0
        for i = 1, #l do for j = i + 1, #l do if adj[l[i]] and adj[l[i]][l[j]] then t = t + 1 end end end
        cc, cnt = cc + t / (#l * (#l - 1) / 2), cnt + 1
      end
      tri_nodes = tri_nodes + 1
    end
    assert.is_true(cc / cnt > 0.15, 'clustering ' .. cc / cnt)
    local d2 = pn.data.ppi_synthetic{ dir = tmpdir(), graphs = 4, nodes = 400, degree = 14, labels = 20, seed = 5 }
    assert.same(d.graphs.test[1].y:totable(), d2.graphs.test[1].y:totable())
    assert.same(d.graphs.train[2].edges:totable(), d2.graphs.train[2].edges:totable())
  end)

  it('refuses impossible parameters and a folder that holds other files, by name', function()
    assert_error_matching(function() pn.data.ppi_synthetic{ graphs = 2 } end, 'graphs')
    assert_error_matching(function() pn.data.ppi_synthetic{ nodes = 20, degree = 30 } end, 'degree = 30')
    assert_error_matching(function() pn.data.ppi_synthetic{ layout = 'pyg' } end, 'layout')
    local dir = tmpdir()
    write(dir .. '/mine.txt', 'a user file')
    assert_error_matching(function() pn.data.ppi_synthetic{ dir = dir, graphs = 3, nodes = 30, degree = 4 } end, dir,
      'is not a synthetic set')
  end)
end)

describe('graph.canonical', function()
  it('symmetrises, drops self-loops and duplicates, sorts; checks ids', function()
    local e = pn.tensor({ { 2, 0 }, { 0, 2 }, { 1, 1 }, { 3, 1 }, { 2, 0 } }, { dtype = 'i64' })
    assert.same({ { 0, 2 }, { 1, 3 }, { 2, 0 }, { 3, 1 } }, pn.graph.canonical(e, 4):totable())
    assert.same({ 0, 2 }, pn.graph.canonical(pn.zeros({ 0, 2 }, { dtype = 'i64' }), 3):shape())
    assert_error_matching(function() pn.graph.canonical(e, 3) end, 'edges row 4 is (3, 1)', '[0, 3)')
  end)
end)

describe('metrics.f1', function()
  it('counts micro-F1 and per-label F1 as by hand', function()
    -- predictions (logit > 0) vs truth, 3 nodes × 3 labels
    local logits = pn.tensor({ { 1, -1, 2 }, { 1, 1, -1 }, { -1, -1, -1 } })
    local y = pn.tensor({ { 1, 0, 0 }, { 1, 1, 1 }, { 0, 0, 0 } })
    local c = pn.metrics.f1_counts(logits, y)
    -- label 1: tp 2; label 2: tp 1; label 3: fp 1, fn 1 → Σtp 3, Σfp 1, Σfn 1
    local micro, per = pn.metrics.f1(c)
    assert.near(6 / 8, micro, 1e-12)
    assert.near(1, per[1], 1e-12)
    assert.near(1, per[2], 1e-12)
    assert.near(0, per[3], 1e-12)
    -- accumulation over batches equals one pass
    local c2 = pn.metrics.f1_counts(logits:narrow(1, 1, 2), y:narrow(1, 1, 2))
    c2 = pn.metrics.f1_counts(logits:narrow(1, 3, 1), y:narrow(1, 3, 1), c2)
    assert.near(micro, (pn.metrics.f1(c2)), 1e-12)
    -- nothing true, nothing predicted: NaN, not a number
    local none = pn.metrics.f1(pn.metrics.f1_counts(pn.full({ 2, 2 }, -1), pn.zeros({ 2, 2 })))
    assert.is_true(none ~= none)
    assert_error_matching(function() pn.metrics.f1_counts(pn.zeros({ 2, 3 }), pn.zeros({ 3, 2 })) end, '(2, 3)', '(3, 2)')
  end)

  it('NaN logits give NaN, never the score of a model that predicts nothing; y must be 0/1', function()
    local y = pn.tensor({ { 1, 1 }, { 1, 0 } })
    local c = pn.metrics.f1_counts(pn.tensor({ { 0 / 0, 1 }, { 1, 1 } }), y)
    local micro, per = pn.metrics.f1(c)
    assert.is_true(micro ~= micro)
    assert.is_true(per[1] ~= per[1])  -- the label with the NaN logit
    assert.near(2 / 3, per[2], 1e-12) -- the clean label keeps its score (tp 1, fp 1)
    -- a NaN batch poisons the accumulation
    local c2 = pn.metrics.f1_counts(pn.tensor({ { 1, 1 } }), pn.tensor({ { 1, 1 } }))
    c2 = pn.metrics.f1_counts(pn.tensor({ { 0 / 0, 0 / 0 } }), pn.tensor({ { 0, 0 } }), c2)
    assert.is_true((pn.metrics.f1(c2)) ~= (pn.metrics.f1(c2)))
    -- infinite logits are predictions, not NaN
    assert.near(1, (pn.metrics.f1(pn.metrics.f1_counts(pn.tensor({ { 1 / 0, -1 / 0 } }), pn.tensor({ { 1, 0 } })))), 0)
    assert_error_matching(function() pn.metrics.f1_counts(pn.ones({ 2, 2 }), pn.tensor({ { 1, 0 }, { 2, 1 } })) end,
      'y must hold 0/1 labels', 'got 2 at row 2, label 1')
    assert_error_matching(function() pn.metrics.f1_counts(pn.ones({ 1, 2 }), pn.tensor({ { 1, 0 / 0 } })) end,
      'got nan at row 1, label 2')
    assert_error_matching(function() pn.metrics.f1_counts({ 1 }, y) end, 'must be tensors', 'got table')
    assert_error_matching(function() pn.metrics.f1_counts(y, y, { tp = 1 }) end, 'earlier f1_counts')
    assert_error_matching(function() pn.metrics.f1({}) end, 'metrics.f1', 'tp, fp, fn')
  end)

  it('accuracy: argmax against class ids by hand; a NaN logit makes it NaN (argmax would pick it)', function()
    local logits = pn.tensor({ { 1, 3, 2 }, { 5, -1, 0 }, { 0, 0, 7 }, { 2, 1, 0 } })
    local y = pn.tensor({ 1, 0, 0, 1 }, { dtype = 'i64' })
    assert.are.equal(2, pn.metrics.correct(logits, y))
    assert.are.equal(0.5, pn.metrics.accuracy(logits, y))
    -- NaN in row 2, where argmax would pick column 1 and so match y
    local bad = pn.tensor({ { 1, 3, 2 }, { 0 / 0, -1, 0 }, { 0, 0, 7 }, { 2, 1, 0 } })
    assert.are.equal(1, pn.tensor({ { 0 / 0, -1, 0 } }):argmax(-1):item() + 1) -- the NaN's column
    local a = pn.metrics.accuracy(bad, y)
    assert.is_true(a ~= a)
    assert_error_matching(function() pn.metrics.accuracy(logits, pn.tensor({ 1, 0, 0, 1 })) end,
      'metrics.accuracy', 'class ids', 'f32')
    assert_error_matching(function() pn.metrics.correct(logits, pn.tensor({ 1, 0 }, { dtype = 'i64' })) end,
      '(4, 3)', '(2)')
  end)
end)

describe('InductiveGAT', function()
  after_each(cleanup)

  it('builds the paper model: heads 4-4-6, a skip across the middle layer, averaged output', function()
    local m = pn.nn.InductiveGAT(50, 121, { hidden = 256 })
    assert.is_nil(m.layer1.res)
    assert.truthy(m.layer2.res)
    assert.is_nil(m.layer3.res)
    assert.equal(6, m.layer3.heads)
    assert.is_false(m.layer3.concat)
    -- GAT paper: 50·1024 + 2·4·256 + 1024 (layer 1), 1024·1024 + 2·1024 + 1024 (layer 2),
    -- 1024·726 + 2·726 + 121 (layer 3)
    local want = (50 * 1024 + 2048 + 1024) + (1024 * 1024 + 2048 + 1024) + (1024 * 726 + 2 * 726 + 121)
    assert.equal(want, m:num_parameters())
    assert_error_matching(function() pn.nn.InductiveGAT(5, 3, { heads = { 4 } }) end, 'at least 2 layers')
    assert_error_matching(function() pn.nn.InductiveGAT(5, 3, { heads = { 4, 0 } }) end, 'heads[2] = 0')
  end)

  it('learns on training graphs and predicts labels of graphs it never saw', function()
    local d = pn.data.ppi_synthetic{ dir = tmpdir(), graphs = 12, nodes = 150, degree = 8, features = 12, labels = 8,
                                     community = 15, seed = 11 }
    pn.manual_seed(2)
    local m = pn.nn.InductiveGAT(12, 8, { hidden = 16, heads = { 2, 2, 2 }, score = 'dot' })
    local opt = pn.optim.Adam(m, { lr = 0.005 })
    local function test_f1()
      m:eval()
      local c
      pn.no_grad(function()
        for _, b in ipairs(d:batches('test', 2)) do c = pn.metrics.f1_counts(m(b.x, b.graph), b.y, c) end
      end)
      return (pn.metrics.f1(c))
    end
    for epoch = 1, 80 do
      m:train()
      for _, b in ipairs(d:batches('train', 2, epoch)) do
        opt:zero_grad()
        pn.binary_cross_entropy_with_logits(m(b.x, b.graph), b.y):backward()
        opt:step()
      end
    end
    -- the strongest constant predictor here is "all positive"
    local c
    for _, g in ipairs(d.graphs.test) do c = pn.metrics.f1_counts(pn.full(g.y:shape(), 1), g.y, c) end
    local all_pos = pn.metrics.f1(c)
    local f1 = test_f1()
    assert.is_true(f1 > all_pos + 0.15, string.format('test micro-F1 %.3f vs all-positive %.3f', f1, all_pos))
  end)
end)
