-- penumbra.data.ppi — the protein–protein interaction graphs of GraphSAGE / GAT (24 graphs,
-- 56,944 nodes, 50 features, 121 binary labels; inductive: 20 train, 2 val, 2 test graphs).
-- The files cannot be fetched onto our machines, so users bring them in either layout in use:
--
--   DGL        {train,valid,test}_graph.json  (networkx node-link JSON of the split's nodes)
--              {train,valid,test}_feats.npy   (n, 50)   {…}_labels.npy (n, 121)
--              {train,valid,test}_graph_id.npy (n)      which graph each node belongs to
--   GraphSAGE  ppi-G.json (node-link JSON of all nodes, each with "val"/"test" flags),
--              ppi-feats.npy (N, 50), ppi-class_map.json {"id": [121 labels]},
--              ppi-id_map.json {"id": row of ppi-feats.npy}
--
--   local d = pn.data.ppi{path = nil, self_loops = true}
--     path: a folder in one of the layouts; default `ppi/` on the dataset search path
--     ($PENUMBRA_DATA, datasets/, ../shared/datasets — DESIGN §5).
--   d.graphs.train / .val / .test   lists of graphs {x (n, F) f32, y (n, C) f32 0/1,
--                                   edges (E, 2) i64 local ids, num_nodes, id (0-based graph id)}
--   d:union(list)                   one batch of whole graphs: x, y, graph (pn.graph CSR with
--                                   self-loops unless self_loops = false), edges, num_nodes, sizes
--   d:batches(split, size [, seed]) the split's graphs in batches of `size` (shuffled by seed
--                                   when given — a new order per epoch, GAT's 2 graphs per batch);
--                                   across ranks, in a training step, each rank gets its share of
--                                   every batch's graphs (penumbra/ddp.lua)
--   d.num_features, d.num_classes, d.num_graphs, d.layout ('dgl' | 'graphsage'), d.synthetic,
--   d.path (the HDF5 cache), d.source (the folder), d:describe()
--
-- Conversion: the first load converts the folder once to the HDF5 layout of
-- ../shared/datasets/README.md — /features f32 [N, F], /labels u8 [N, C], /edges i64 [E, 2]
-- (both directions, no self-loops, no duplicates, sorted), /graph_id i32 [N] (0-based, train
-- graphs first, then val, then test), /{train,val,test}_mask u8 [N], root attributes name,
-- layout, num_nodes, num_features, num_classes, num_edges, num_graphs, synthetic, source,
-- source_sizes — written next to the files as penumbra-ppi.h5 (or, when that folder is
-- read-only, under $XDG_CACHE_HOME/penumbra), through a temporary name and a rename. A cache
-- whose recorded file sizes no longer match the folder is rebuilt.
--
-- Decisions:
--  - JSON is read by lua-cjson. Links name nodes by their "id" (networkx 2 and later; in the
--    PPI files ids equal positions, so networkx 1's position-based links read the same).
--  - Labels: any nonzero value is 1. Every row must have the same width (121 for PPI).
--  - GraphSAGE's files carry no graph ids: a graph is a connected component, and a component
--    of fewer than 50 nodes joins the graph that holds the node id just before it when both
--    have the same split (the PPI graphs are numbered consecutively), so stray small
--    components do not become graphs of their own.
--  - DGL's split files "valid" are the split `val`.
--  - A folder holding penumbra-synthetic.txt was written by pn.data.ppi_synthetic: d.synthetic
--    is true (and the cache's `synthetic` attribute 1), so a generated set is never reported
--    as real PPI.
return function(data)
  local pn = require 'penumbra.tensor'
  local pio = require 'penumbra.io'
  local options = require 'penumbra.options'
  local cjson = require 'cjson'

  local SPLITS = { 'train', 'val', 'test' }
  local DGL_SPLIT = { train = 'train', val = 'valid', test = 'test' }
  local function dgl_files()
    local f = {}
    for _, s in ipairs(SPLITS) do
      for _, part in ipairs({ '_graph.json', '_feats.npy', '_labels.npy', '_graph_id.npy' }) do
        f[#f + 1] = DGL_SPLIT[s] .. part
      end
    end
    return f
  end
  local SAGE_FILES = { 'ppi-G.json', 'ppi-feats.npy', 'ppi-class_map.json', 'ppi-id_map.json' }
  local CACHE = 'penumbra-ppi.h5'
  local SYNTHETIC_MARKER = 'penumbra-synthetic.txt' -- written by ppi_synthetic next to its files
  local MIN_GRAPH = 50

  local function fail(msg) error('ppi: ' .. msg, 0) end

  local function size_of(path)
    local f = io.open(path, 'rb')
    if not f then return nil end
    local n = f:seek('end')
    f:close()
    return n
  end

  local function read_json(path)
    local ok, v = pcall(cjson.decode, pio.read_text(path, 'ppi'))
    if not ok then fail(path .. ': not valid JSON (' .. tostring(v):gsub('^.-: ', '') .. ')') end
    return v
  end

  local function read_npy(path)
    local ok, t = pcall(pio.load_npy, path)
    if not ok then fail(tostring(t):gsub('^[^\n]-:%d+: ', '')) end
    return t
  end

  local function shape_str(t) return '(' .. table.concat(t:shape(), ', ') .. ')' end

  -- a node-link graph: positions of its node ids, and its links as a flat {a1, b1, a2, b2, …}
  -- of positions (0-based) offset by `base`
  local function node_link(path, base)
    local G = read_json(path)
    if type(G) ~= 'table' or type(G.nodes) ~= 'table' or type(G.links) ~= 'table' then
      fail(path .. ': expected a networkx node-link graph (an object with "nodes" and "links" lists)')
    end
    local pos = {}
    for i, nd in ipairs(G.nodes) do
      if type(nd) ~= 'table' or nd.id == nil then fail(path .. ': node ' .. i .. ' has no "id"') end
      pos[nd.id] = i - 1
    end
    local flat = {}
    for i, l in ipairs(G.links) do
      local a, b = type(l) == 'table' and pos[l.source], type(l) == 'table' and pos[l.target]
      if not a or not b then
        fail(string.format('%s: link %d names node %s, which is not among its %d nodes', path, i,
          tostring(type(l) == 'table' and (a and l.target or l.source) or l), #G.nodes))
      end
      flat[#flat + 1] = a + base
      flat[#flat + 1] = b + base
    end
    return G, flat
  end

  local function edges_tensor(flat)
    if #flat == 0 then return pn.zeros({ 0, 2 }, { dtype = 'i64' }) end
    return pn.tensor(flat, { dtype = 'i64' }):reshape(#flat / 2, 2)
  end

  local function binary_labels(t, path, C)
    local s = t:shape()
    if #s ~= 2 then fail(path .. ': labels must be (nodes, classes), got ' .. shape_str(t)) end
    if C and s[2] ~= C then
      fail(string.format('%s: label rows have width %d, the other files %d', path, s[2], C))
    end
    return t:ne(0):to('u8')
  end

  -- ---- the two layouts → one table of tensors --------------------------------------------
  local function convert_dgl(dir)
    local xs, ys, gids, masks, flat = {}, {}, {}, {}, {}
    local base, C, F = 0, nil, nil
    local gid_map, ngraph = {}, 0
    for _, split in ipairs(SPLITS) do
      local p = dir .. '/' .. DGL_SPLIT[split]
      local G, f = node_link(p .. '_graph.json', base)
      local n = #G.nodes
      local x = read_npy(p .. '_feats.npy')
      local y = read_npy(p .. '_labels.npy')
      local g = read_npy(p .. '_graph_id.npy')
      if #x:shape() ~= 2 or x:shape()[1] ~= n then
        fail(string.format('%s_feats.npy: shape %s, expected (%d, features) for the %d nodes of %s_graph.json', p,
          shape_str(x), n, n, p))
      end
      if F and x:shape()[2] ~= F then fail(string.format('%s_feats.npy: %d features, the train split has %d', p, x:shape()[2], F)) end
      F = x:shape()[2]
      if y:shape()[1] ~= n then
        fail(string.format('%s_labels.npy: %s rows, expected %d (the nodes of %s_graph.json)', p, tostring(y:shape()[1]),
          n, p))
      end
      y = binary_labels(y, p .. '_labels.npy', C)
      C = y:shape()[2]
      if #g:shape() ~= 1 or g:shape()[1] ~= n then
        fail(string.format('%s_graph_id.npy: shape %s, expected (%d)', p, shape_str(g), n))
      end
      -- graph ids renumbered 0, 1, … in the order train, val, test and by value within a split
      local vals, seen = {}, {}
      for _, v in ipairs(g:totable()) do
        if not seen[v] then seen[v] = true; vals[#vals + 1] = v end
      end
      table.sort(vals)
      for _, v in ipairs(vals) do
        if gid_map[v] then fail(p .. '_graph_id.npy: graph ' .. v .. ' also appears in another split') end
        gid_map[v] = ngraph
        ngraph = ngraph + 1
      end
      local gl = {}
      for i, v in ipairs(g:totable()) do gl[i] = gid_map[v] end
      xs[#xs + 1], ys[#ys + 1], gids[#gids + 1] = x:to('f32'), y, pn.tensor(gl, { dtype = 'i32' })
      for _, s2 in ipairs(SPLITS) do
        masks[s2] = masks[s2] or {}
        table.insert(masks[s2], (s2 == split and pn.ones({ n }, { dtype = 'u8' }) or pn.zeros({ n }, { dtype = 'u8' })))
      end
      for _, v in ipairs(f) do flat[#flat + 1] = v end
      base = base + n
    end
    local out = { features = pn.cat(xs, 1), labels = pn.cat(ys, 1), graph_id = pn.cat(gids, 1), edges = edges_tensor(flat),
                  num_graphs = ngraph }
    for _, s in ipairs(SPLITS) do out[s .. '_mask'] = pn.cat(masks[s], 1) end
    -- graphs must be contiguous runs of nodes (the batching relies on it)
    local prev, done = -1, {}
    for _, v in ipairs(out.graph_id:totable()) do
      if v ~= prev then
        if done[v] then fail(dir .. ': the nodes of graph ' .. v .. ' are not consecutive in the split files') end
        done[v], prev = true, v
      end
    end
    return out
  end

  local function convert_sage(dir)
    local p = dir .. '/ppi-'
    local G, flat = node_link(p .. 'G.json', 0)
    local n = #G.nodes
    local id_map = read_json(p .. 'id_map.json')
    local class_map = read_json(p .. 'class_map.json')
    local feats = read_npy(p .. 'feats.npy')
    if #feats:shape() ~= 2 then fail(p .. 'feats.npy: expected (nodes, features), got ' .. shape_str(feats)) end
    local rows, labels, C = {}, {}, nil
    local split = {}
    for i, nd in ipairs(G.nodes) do
      local key = tostring(nd.id)
      local r = id_map[key]
      if r == nil then fail(string.format('%sG.json: node id %s is missing from %sid_map.json', p, key, p)) end
      if type(r) ~= 'number' or r < 0 or r >= feats:shape()[1] or r % 1 ~= 0 then
        fail(string.format('%sid_map.json: node id %s maps to row %s, outside the %d rows of %sfeats.npy', p, key,
          tostring(r), feats:shape()[1], p))
      end
      rows[i] = r
      local l = class_map[key]
      if l == nil then fail(string.format('%sG.json: node id %s is missing from %sclass_map.json', p, key, p)) end
      if type(l) ~= 'table' then
        fail(string.format('%sclass_map.json: node id %s has label %s; PPI is multi-label: each entry is a list', p, key,
          tostring(l)))
      end
      C = C or #l
      if #l ~= C then
        fail(string.format('%sclass_map.json: node id %s has a label row of width %d, the first node %d', p, key, #l, C))
      end
      for k = 1, C do labels[#labels + 1] = l[k] ~= 0 and 1 or 0 end
      split[i] = nd.test and 'test' or (nd.val and 'val' or 'train')
    end
    local out = { features = feats:index_select(1, pn.tensor(rows, { dtype = 'i64' })):to('f32'):contiguous(),
                  labels = pn.tensor(labels, { dtype = 'u8' }):reshape(n, C), edges = edges_tensor(flat) }
    for _, s in ipairs(SPLITS) do
      local m = {}
      for i = 1, n do m[i] = split[i] == s and 1 or 0 end
      out[s .. '_mask'] = pn.tensor(m, { dtype = 'u8' })
    end
    -- graphs: connected components, small ones merged into the graph just before them
    local canon = pn.graph.canonical(out.edges, n)
    local comp = pn.graph.components(pn.graph(canon, n, { self_loops = false })).labels:totable()
    local size = {}
    for _, c in ipairs(comp) do size[c] = (size[c] or 0) + 1 end
    local gof, graph_of_node, ngraph = {}, {}, 0
    for i = 1, n do
      local c = comp[i]
      if gof[c] == nil then
        local prev = graph_of_node[i - 1]
        if size[c] < MIN_GRAPH and prev and split[i - 1] == split[i] then
          gof[c] = prev
        else
          gof[c] = ngraph
          ngraph = ngraph + 1
        end
      end
      graph_of_node[i] = gof[c]
    end
    -- renumber: train graphs first, then val, then test, each by first appearance; and
    -- reorder the nodes so every graph is one consecutive run
    local first_split, order_key = {}, {}
    for i = 1, n do first_split[graph_of_node[i]] = first_split[graph_of_node[i]] or split[i] end
    local rank = { train = 0, val = 1, test = 2 }
    local gl = {}
    for g = 0, ngraph - 1 do gl[#gl + 1] = g end
    table.sort(gl, function(a, b)
      local ra, rb = rank[first_split[a]], rank[first_split[b]]
      if ra ~= rb then return ra < rb end
      return a < b
    end)
    local newg = {}
    for k, g in ipairs(gl) do newg[g] = k - 1 end
    local perm = {}
    for i = 1, n do perm[i] = i end
    table.sort(perm, function(a, b)
      local ga, gb = newg[graph_of_node[a]], newg[graph_of_node[b]]
      if ga ~= gb then return ga < gb end
      return a < b
    end)
    local inv, gid = {}, {}
    for k, i in ipairs(perm) do inv[i - 1] = k - 1; gid[k] = newg[graph_of_node[i]] end
    local pidx = pn.tensor(perm, { dtype = 'i64' }) - 1
    out.features = out.features:index_select(1, pidx):contiguous()
    out.labels = out.labels:index_select(1, pidx):contiguous()
    for _, s in ipairs(SPLITS) do out[s .. '_mask'] = out[s .. '_mask']:index_select(1, pidx):contiguous() end
    local invt = {}
    for i = 0, n - 1 do invt[i + 1] = inv[i] end
    out.edges = pn.tensor(invt, { dtype = 'i64' }):index_select(1, out.edges:reshape(-1)):reshape(-1, 2)
    out.graph_id = pn.tensor(gid, { dtype = 'i32' })
    out.num_graphs = ngraph
    return out
  end

  -- ---- finding the folder, the layout and the cache --------------------------------------
  local function present(dir, files)
    local have, miss = {}, {}
    for _, f in ipairs(files) do
      if size_of(dir .. '/' .. f) then have[#have + 1] = f else miss[#miss + 1] = f end
    end
    return have, miss
  end

  local function layout_of(dir)
    local dh, dm = present(dir, dgl_files())
    local sh, sm = present(dir, SAGE_FILES)
    if #dm == 0 then return 'dgl', dgl_files() end
    if #sm == 0 then return 'graphsage', SAGE_FILES end
    if #dh > 0 then
      fail(dir .. ': the DGL layout is half-present: has ' .. table.concat(dh, ', ') .. '; missing ' .. table.concat(dm, ', '))
    end
    if #sh > 0 then
      fail(dir .. ': the GraphSAGE layout is half-present: has ' .. table.concat(sh, ', ') .. '; missing ' ..
        table.concat(sm, ', '))
    end
    return nil
  end

  local function sizes_text(dir, files)
    local t = {}
    for _, f in ipairs(files) do t[#t + 1] = f .. '=' .. tostring(size_of(dir .. '/' .. f)) end
    return table.concat(t, ';')
  end

  local function writable(dir)
    local probe = dir .. '/.penumbra-write-probe'
    local f = io.open(probe, 'wb')
    if not f then return false end
    f:close()
    os.remove(probe)
    return true
  end

  local function cache_path(dir)
    if writable(dir) then return dir .. '/' .. CACHE end
    local base = (os.getenv('XDG_CACHE_HOME') or ((os.getenv('HOME') or '/tmp') .. '/.cache')) .. '/penumbra'
    os.execute("mkdir -p '" .. base:gsub("'", "'\\''") .. "'")
    return base .. '/ppi-' .. dir:gsub('[^%w]', '_') .. '.h5'
  end

  local function write_cache(path, t, attrs)
    local tmp = path .. '.tmp'
    local f = pio.open(tmp, 'w')
    for _, k in ipairs({ 'features', 'labels', 'edges', 'graph_id', 'train_mask', 'val_mask', 'test_mask' }) do
      f:write(k, t[k], { gzip = 4 })
    end
    for k, v in pairs(attrs) do f:set_attr('/', k, v) end
    f:close()
    local ok, err = os.rename(tmp, path)
    if not ok then fail('cannot rename ' .. tmp .. ' to ' .. path .. ': ' .. tostring(err)) end
  end

  -- the folder → its HDF5 cache (converted when missing or stale)
  local function ensure_cache(dir)
    local layout, files = layout_of(dir)
    if not layout then return nil end
    local synthetic = size_of(dir .. '/' .. SYNTHETIC_MARKER) ~= nil
    local path = cache_path(dir)
    local sizes = sizes_text(dir, files)
    if size_of(path) then
      local ok, a = pcall(pio.attrs, path)
      if ok and a.source_sizes == sizes then return path, layout end
      io.stderr:write('ppi: ' .. path .. ' is stale or unreadable; converting ' .. dir .. ' again\n')
    end
    io.stderr:write('ppi: converting ' .. dir .. ' (' .. layout .. ' layout) to ' .. path .. ' …\n')
    local t = layout == 'dgl' and convert_dgl(dir) or convert_sage(dir)
    local n = t.features:shape()[1]
    t.edges = pn.graph.canonical(t.edges, n)
    write_cache(path, t, { name = 'ppi', layout = layout, num_nodes = n, num_features = t.features:shape()[2],
                           num_classes = t.labels:shape()[2], num_edges = t.edges:shape()[1],
                           num_graphs = t.num_graphs, synthetic = synthetic and 1 or 0, source = dir,
                           source_sizes = sizes })
    return path, layout
  end

  -- ---- the dataset -------------------------------------------------------------------------
  local Set = {}
  Set.__index = Set

  function Set:describe()
    local c = {}
    for _, s in ipairs(SPLITS) do
      local nodes = 0
      for _, g in ipairs(self.graphs[s]) do nodes = nodes + g.num_nodes end
      c[#c + 1] = string.format('%s %d graphs / %d nodes', s, #self.graphs[s], nodes)
    end
    return string.format('PPI%s (%s layout, %s): %d features, %d labels; %s', self.synthetic and ' — SYNTHETIC' or '',
      self.layout, self.source, self.num_features, self.num_classes, table.concat(c, ', '))
  end

  function Set:union(list)
    if #list == 0 then error('ppi: union of no graphs', 2) end
    local xs, ys, es, sizes, base = {}, {}, {}, {}, 0
    for i, g in ipairs(list) do
      xs[i], ys[i] = g.x, g.y
      es[i] = g.edges + base
      sizes[i] = g.num_nodes
      base = base + g.num_nodes
    end
    local b = { x = #xs == 1 and xs[1] or pn.cat(xs, 1), y = #ys == 1 and ys[1] or pn.cat(ys, 1),
                edges = #es == 1 and es[1] or pn.cat(es, 1), num_nodes = base, sizes = sizes }
    b.graph = pn.graph(b.edges, base, { self_loops = self.self_loops })
    -- graphs whose features were moved to a device (the recipe's device=cuda): the batch's graph too
    if b.x:device() ~= 'cpu' then b.graph = pn.to_device(b.graph, b.x:device()) end
    return b
  end

  function Set:batches(split, size, seed)
    local gs = self.graphs[split]
    if not gs then error("ppi: split must be 'train', 'val' or 'test', got " .. tostring(split), 2) end
    if type(size) ~= 'number' or size < 1 or size % 1 ~= 0 then error('ppi: batch size must be a positive integer', 2) end
    local order = {}
    for i = 1, #gs do order[i] = i end
    if seed then
      local r = require('penumbra.rng')(seed)
      for i = #order, 2, -1 do
        local j = r.int(i) + 1
        order[i], order[j] = order[j], order[i]
      end
    end
    -- across ranks (penumbra/ddp.lua), during a training step: this rank's graphs of each batch
    local share = split == 'train' and require('penumbra.ddp').sharer() or nil
    local out = {}
    for i = 1, #order, size do
      local l = {}
      for k = i, math.min(i + size - 1, #order) do l[#l + 1] = gs[order[k]] end
      if share then l = share(l, function(g) return g.num_nodes end, 'graphs') end
      out[#out + 1] = self:union(l)
    end
    return out
  end

  local function open_set(path, layout, dir, opts)
    local f = pio.open(path, 'r')
    local a = f:attrs('/')
    local t = {}
    for _, k in ipairs({ 'features', 'labels', 'edges', 'graph_id', 'train_mask', 'val_mask', 'test_mask' }) do
      if not f:exists(k) then
        f:close()
        fail(path .. ": missing dataset '/" .. k .. "' (delete the file to convert again)")
      end
      t[k] = f:read(k)
    end
    f:close()
    local n, C = t.features:shape()[1], t.labels:shape()[2]
    local d = setmetatable({ name = 'ppi', path = path, layout = layout or a.layout, source = dir or a.source,
                             synthetic = a.synthetic == 1, num_features = t.features:shape()[2], num_classes = C,
                             num_graphs = a.num_graphs, self_loops = opts.self_loops ~= false,
                             graphs = { train = {}, val = {}, test = {} } }, Set)
    -- cut the node range of every graph and its edges (the edge list is sorted by source)
    local gid = t.graph_id:totable()
    local e = t.edges
    local esrc = e:select(2, 1):totable()
    local masks = {}
    for _, s in ipairs(SPLITS) do masks[s] = t[s .. '_mask']:totable() end
    local i, ei = 1, 1
    local x, y = t.features, t.labels:to('f32')
    while i <= n do
      local g, j = gid[i], i
      while j < n and gid[j + 1] == g do j = j + 1 end
      local ej = ei
      while ej <= #esrc and esrc[ej] <= j - 1 do ej = ej + 1 end
      local split = masks.train[i] == 1 and 'train' or (masks.val[i] == 1 and 'val' or 'test')
      local ge = ej > ei and (e:narrow(1, ei, ej - ei) - (i - 1)) or pn.zeros({ 0, 2 }, { dtype = 'i64' })
      if ge:numel() > 0 and (ge:min():item() < 0 or ge:max():item() > j - i) then
        fail(path .. ': graph ' .. g .. ' has edges to nodes outside it')
      end
      table.insert(d.graphs[split], { x = x:narrow(1, i, j - i + 1):contiguous(), y = y:narrow(1, i, j - i + 1):contiguous(),
                                      edges = ge:contiguous(), num_nodes = j - i + 1, id = g })
      i, ei = j + 1, ej
    end
    return d
  end

  local OPTS = { path = 'string', self_loops = 'boolean' }

  local function load(o)
    o = options.check('data.ppi', o, OPTS, 3)
    local dirs = {}
    if o.path then dirs[1] = o.path else for _, s in ipairs(data.search_path()) do dirs[#dirs + 1] = s .. '/ppi' end end
    for _, dir in ipairs(dirs) do
      local path, layout = ensure_cache(dir)
      if path then return open_set(path, layout, dir, o) end
    end
    error('data.ppi: no PPI files found; tried:\n  ' .. table.concat(dirs, '\n  ') ..
      '\nPut the DGL files ({train,valid,test}_{graph.json,feats.npy,labels.npy,graph_id.npy}) or GraphSAGE\'s ' ..
      '(ppi-G.json, ppi-feats.npy, ppi-class_map.json, ppi-id_map.json) in one of them, set PENUMBRA_DATA, or use ' ..
      'pn.data.ppi_synthetic{} for a generated set of the same shape.', 2)
  end

  local M = { load = load, open = function(dir, opts)
    local path, layout = ensure_cache(dir)
    if not path then fail(dir .. ': neither the DGL nor the GraphSAGE files are there') end
    return open_set(path, layout, dir, opts or {})
  end, SPLITS = SPLITS, DGL_SPLIT = DGL_SPLIT, SYNTHETIC_MARKER = SYNTHETIC_MARKER }

  data.register('ppi', load, { description = 'PPI: 24 protein–protein interaction graphs, 121 labels (user files)',
                               options = { path = 'the folder with the DGL or GraphSAGE files',
                                           self_loops = 'self loops in each batch graph (default true)' } })
  return M
end
