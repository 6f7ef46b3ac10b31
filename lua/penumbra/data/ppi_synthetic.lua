-- penumbra.data.ppi_synthetic — a generated stand-in for PPI with the real shapes, written in
-- the real files' layout (DGL or GraphSAGE) and read back through pn.data.ppi's loaders, so
-- the whole path from files to training is exercised without the real data.
--
--   local d = pn.data.ppi_synthetic{graphs = 24, nodes = 2400, degree = 14, features = 50,
--                                   labels = 121, community = 40, mix = 0.2, seed = 0,
--                                   layout = 'dgl' | 'graphsage', dir = nil, self_loops = true}
--   → the pn.data.ppi dataset (d.synthetic = true); dir: where the files go (default
--     $XDG_CACHE_HOME/penumbra/ppi_synthetic-<parameters>; reused when already there).
--
-- The model, fixed by the seed:
--  - graphs: the last two-twelfths are val and test (24 → 20 / 2 / 2); each has nodes·U(0.8,
--    1.2) nodes in communities of community·U(0.5, 1.5) nodes. Within a community every pair
--    is an edge with probability (1 − mix)·degree / (size − 1); mix·degree·n/2 further edges
--    join uniform random pairs across the graph — clustered (triangles in every community),
--    not tree-like, mean degree ≈ degree (PPI: 14.4).
--  - features: x_i = μ_{c(i)} + ε_i, μ_c ~ N(0, 0.5²·I) per community, ε ~ N(0, I) (F dims).
--  - labels: a fixed random rule over a node's own features and a content-selected mean of
--    its neighbours': m_i = Σ_j σ(3·u·x_j/√F)·x_j / Σ_j σ(3·u·x_j/√F) over i's neighbours,
--    z_il = (a_l·x_i + b_l·m_i)/√F, y_il = [z_il > t_l], with a_l, b_l, u ~ N(0, I) and t_l
--    the quantile that makes label l positive on a fraction p_l ~ U(0.1, 0.5) of all nodes.
--    The neighbours' part is weighted by their content, so attention that learns which
--    neighbours matter can beat a plain neighbourhood mean, and both beat a model that sees
--    only x_i.
return function(data, ppi)
  local pn = require 'penumbra.tensor'
  local pio = require 'penumbra.io'
  local options = require 'penumbra.options'
  local rng = require 'penumbra.rng'
  local cjson = require 'cjson'

  local OPTS = { graphs = { 'integer', min = 3 }, nodes = { 'integer', min = 10 }, degree = { 'number', above = 0 },
                 features = { 'integer', min = 1 }, labels = { 'integer', min = 1 }, community = { 'integer', min = 2 },
                 mix = { 'number', min = 0, max = 1 }, seed = { 'integer', min = 0, max = 2 ^ 53 },
                 layout = { 'string', one_of = { 'dgl', 'graphsage' } }, dir = 'string', self_loops = 'boolean' }

  local function write_json(path, v)
    local f = assert(io.open(path, 'wb'))
    f:write(cjson.encode(v))
    f:close()
  end

  -- every node's graph, community, split; the edges (flat, 0-based global ids, each once)
  local function structure(o, r)
    local G, nval = o.graphs, math.max(1, math.floor(o.graphs / 12 + 0.5))
    local ntrain = G - 2 * nval
    local graph, comm, split, flat = {}, {}, {}, {}
    local n, ncomm = 0, 0
    for g = 1, G do
      local size = math.max(2, math.floor(o.nodes * (0.8 + 0.4 * r.u()) + 0.5))
      local s = g <= ntrain and 'train' or (g <= ntrain + nval and 'val' or 'test')
      local base, left = n, size
      while left > 0 do
        local cs = math.min(left, math.max(2, math.floor(o.community * (0.5 + r.u()) + 0.5)))
        if left - cs < 2 then cs = left end
        local p_in = math.min(1, (1 - o.mix) * o.degree / math.max(1, cs - 1))
        for a = 0, cs - 1 do
          for b = a + 1, cs - 1 do
            if r.u() < p_in then
              flat[#flat + 1] = n + a
              flat[#flat + 1] = n + b
            end
          end
        end
        for a = 0, cs - 1 do
          graph[n + a + 1], comm[n + a + 1], split[n + a + 1] = g, ncomm, s
        end
        n, left, ncomm = n + cs, left - cs, ncomm + 1
      end
      for _ = 1, math.floor(o.mix * o.degree * size / 2 + 0.5) do
        local a, b = r.int(size), r.int(size)
        if a ~= b then
          flat[#flat + 1] = base + a
          flat[#flat + 1] = base + b
        end
      end
    end
    return { n = n, ncomm = ncomm, graph = graph, comm = comm, split = split, flat = flat }
  end

  local function gaussian(r, rows, cols, scale)
    local t = {}
    for i = 1, rows * cols do t[i] = r.normal() * (scale or 1) end
    return pn.tensor(t, { dtype = 'f64' }):reshape(rows, cols)
  end

  local function features_and_labels(o, r, st, edges)
    local F, C, n = o.features, o.labels, st.n
    local mu = gaussian(r, st.ncomm, F, 0.5)
    local cidx = {}
    for i = 1, n do cidx[i] = st.comm[i] end
    local x = mu:index_select(1, pn.tensor(cidx, { dtype = 'i64' })) + gaussian(r, n, F)
    local u, A, B = gaussian(r, F, 1), gaussian(r, F, C), gaussian(r, F, C)
    -- content-weighted neighbour mean over the (both-direction) edges: dst gathers src
    local src, dst = edges:select(2, 1):contiguous(), edges:select(2, 2):contiguous()
    local s = (x:matmul(u) * (3 / math.sqrt(F))):sigmoid() -- (n, 1)
    local ws = s:index_select(1, src)
    local num = pn.zeros({ n, F }, { dtype = 'f64' }):index_add(1, dst, x:index_select(1, src) * ws)
    local den = pn.zeros({ n, 1 }, { dtype = 'f64' }):index_add(1, dst, ws)
    local m = num / pn.where(den:eq(0), pn.ones({ n, 1 }, { dtype = 'f64' }), den)
    local z = (x:matmul(A) + m:matmul(B)) / math.sqrt(F)
    -- per-label thresholds at the quantile of a random positive rate
    local zt = z:t():contiguous():totable()
    local thr = {}
    for l = 1, C do
      local col = zt[l]
      table.sort(col)
      local p = 0.1 + 0.4 * r.u()
      thr[l] = col[math.max(1, math.min(n, math.floor((1 - p) * n + 0.5)))]
    end
    local y = z:gt(pn.tensor(thr, { dtype = 'f64' })):to('u8')
    return x:to('f32'), y
  end

  local function write_dgl(dir, st, x, y)
    for _, s in ipairs(ppi.SPLITS) do
      local ids, nodes, base = {}, {}, nil
      for i = 1, st.n do
        if st.split[i] == s then
          ids[#ids + 1] = i - 1
          base = base or i - 1
          nodes[#nodes + 1] = { id = i - 1 - base }
        end
      end
      local links = {}
      for k = 1, #st.flat, 2 do
        local a, b = st.flat[k], st.flat[k + 1]
        if st.split[a + 1] == s then links[#links + 1] = { source = a - base, target = b - base } end
      end
      local p = dir .. '/' .. ppi.DGL_SPLIT[s]
      write_json(p .. '_graph.json', { directed = false, multigraph = false, graph = {}, nodes = nodes, links = links })
      local idx = pn.tensor(ids, { dtype = 'i64' })
      pio.save_npy(p .. '_feats.npy', x:index_select(1, idx))
      pio.save_npy(p .. '_labels.npy', y:index_select(1, idx))
      local gid = {}
      for k, i in ipairs(ids) do gid[k] = st.graph[i + 1] end
      pio.save_npy(p .. '_graph_id.npy', pn.tensor(gid, { dtype = 'i64' }))
    end
  end

  local function write_graphsage(dir, st, x, y)
    local nodes, links, class_map, id_map = {}, {}, {}, {}
    local yt = y:totable()
    for i = 1, st.n do
      nodes[i] = { id = i - 1, val = st.split[i] == 'val', test = st.split[i] == 'test' }
      class_map[tostring(i - 1)] = yt[i]
      id_map[tostring(i - 1)] = i - 1
    end
    for k = 1, #st.flat, 2 do links[#links + 1] = { source = st.flat[k], target = st.flat[k + 1] } end
    write_json(dir .. '/ppi-G.json', { directed = false, multigraph = false, graph = {}, nodes = nodes, links = links })
    write_json(dir .. '/ppi-class_map.json', class_map)
    write_json(dir .. '/ppi-id_map.json', id_map)
    pio.save_npy(dir .. '/ppi-feats.npy', x:to('f64'))
  end

  local function edges_of(flat) -- (E, 2) i64 from a flat list
    if #flat == 0 then return pn.zeros({ 0, 2 }, { dtype = 'i64' }) end
    return pn.tensor(flat, { dtype = 'i64' }):reshape(#flat / 2, 2)
  end

  local function default_dir(o)
    local base = (os.getenv('XDG_CACHE_HOME') or ((os.getenv('HOME') or '/tmp') .. '/.cache')) .. '/penumbra'
    return string.format('%s/ppi_synthetic-%s-g%d-n%d-d%g-f%d-l%d-c%d-m%g-s%d', base, o.layout, o.graphs, o.nodes,
      o.degree, o.features, o.labels, o.community, o.mix, o.seed)
  end

  local function generate(o)
    o = options.check('data.ppi_synthetic', o, OPTS, 3)
    local p = { graphs = o.graphs or 24, nodes = o.nodes or 2400, degree = o.degree or 14, features = o.features or 50,
                labels = o.labels or 121, community = o.community or 40, mix = o.mix or 0.2, seed = o.seed or 0,
                layout = o.layout or 'dgl' }
    if p.degree >= p.nodes * 0.8 - 1 then
      error(string.format('data.ppi_synthetic: degree = %g must be below the smallest graph (0.8 · nodes = %g) − 1',
        p.degree, p.nodes * 0.8), 2)
    end
    local dir = o.dir or default_dir(p)
    local q = function(x) return "'" .. x:gsub("'", "'\\''") .. "'" end
    local marker = io.open(dir .. '/' .. ppi.SYNTHETIC_MARKER, 'rb')
    if marker then
      marker:close() -- generated before, completely (the marker is written last)
    else
      local ls = io.popen('ls -A ' .. q(dir) .. ' 2>/dev/null')
      local listing = ls:read('*a')
      ls:close()
      if listing ~= '' then
        error('data.ppi_synthetic: ' .. dir .. ' exists and is not a synthetic set (no ' .. ppi.SYNTHETIC_MARKER ..
          '); give an empty or new folder', 2)
      end
      -- written into a sibling folder and renamed: a crash leaves no half-written set behind
      local tmp = dir .. '.partial'
      os.execute('rm -rf ' .. q(tmp) .. ' && mkdir -p ' .. q(tmp))
      local r = rng(p.seed * 7919 + 17)
      local st = structure(p, r)
      local edges = pn.graph.canonical(edges_of(st.flat), st.n)
      local x, y = features_and_labels(p, r, st, edges)
      if p.layout == 'dgl' then write_dgl(tmp, st, x, y) else write_graphsage(tmp, st, x, y) end
      local m = assert(io.open(tmp .. '/' .. ppi.SYNTHETIC_MARKER, 'wb'))
      local keys = {}
      for k in pairs(p) do keys[#keys + 1] = k end
      table.sort(keys)
      m:write('Generated by pn.data.ppi_synthetic (lua/penumbra/data/ppi_synthetic.lua); not real PPI.\n')
      for _, k in ipairs(keys) do m:write(k, ' = ', tostring(p[k]), '\n') end
      m:close()
      os.execute('rmdir ' .. q(dir) .. ' 2>/dev/null')
      local ok, err = os.rename(tmp, dir)
      if not ok then error('data.ppi_synthetic: cannot move ' .. tmp .. ' to ' .. dir .. ': ' .. tostring(err), 2) end
    end
    return ppi.open(dir, { self_loops = o.self_loops })
  end

  data.register('ppi_synthetic', generate, { description = 'a generated PPI-shaped set in the real files\' layout',
                                             options = OPTS })
  return generate
end
