-- penumbra.data.planetoid — Cora / CiteSeer (Planetoid public split) from the HDF5 files of
-- ../shared/datasets (schema in its README): /features f32 [N,F], /labels i32 [N],
-- /edges i32 [E,2] (src, dst; both directions), /{train,val,test}_mask u8 [N].
--
--   local d = pn.data.planetoid('cora', {normalize_features = true})
--   d.x (N,F) f32   d.y (N) i64 class ids (0-based)   d.edges (E,2) i64
--   d.graph (pn.graph with self loops)   d.train_idx / d.val_idx / d.test_idx (i64, 0-based)
--   d.num_nodes d.num_features d.num_classes d.name d.path
return function(data)
  local pn = require 'penumbra.tensor'
  local pio = require 'penumbra.io'

  local function bad(path, msg) error('planetoid: ' .. path .. ': ' .. msg, 3) end

  -- indices (0-based, i64) of the nonzero entries of a u8 mask
  local function mask_indices(mask)
    local vals = mask:totable()
    local idx = {}
    for i, v in ipairs(vals) do if v ~= 0 then idx[#idx + 1] = i - 1 end end
    return pn.tensor(idx, { dtype = 'i64' }), #idx
  end

  local OPTIONS = { normalize_features = 'row-normalise the features (default true)',
                    self_loops = 'add a self loop to every node of d.graph (default true)' }
  local function load(name, opts)
    opts = opts or {}
    if name ~= 'cora' and name ~= 'citeseer' then
      error("planetoid: unknown dataset '" .. tostring(name) .. "' (cora, citeseer)", 2)
    end
    for k in pairs(opts) do
      if not OPTIONS[k] then error("planetoid: unknown option '" .. tostring(k) .. "' (normalize_features, self_loops)", 2) end
    end
    local path = data.find(name .. '.h5')
    local f = pio.open(path, 'r')
    for _, key in ipairs({ 'features', 'labels', 'edges', 'train_mask', 'val_mask', 'test_mask' }) do
      if not f:exists(key) then bad(path, "missing dataset '/" .. key .. "'") end
    end
    local attrs = f:attrs('/')
    local x, y, e = f:read('features'), f:read('labels'), f:read('edges')
    local masks = { train = f:read('train_mask'), val = f:read('val_mask'), test = f:read('test_mask') }
    f:close()
    local xs = x:shape()
    if #xs ~= 2 or x:dtype() ~= 'f32' then bad(path, '/features must be f32 [N,F], got ' .. x:dtype() .. ' [' .. table.concat(xs, ',') .. ']') end
    local n = xs[1]
    if y:dtype() ~= 'i32' and y:dtype() ~= 'i64' then bad(path, '/labels must be i32, got ' .. y:dtype()) end
    if #y:shape() ~= 1 or y:shape()[1] ~= n then bad(path, '/labels must be [' .. n .. '], got [' .. table.concat(y:shape(), ',') .. ']') end
    local es = e:shape()
    if #es ~= 2 or es[2] ~= 2 or (e:dtype() ~= 'i32' and e:dtype() ~= 'i64') then
      bad(path, '/edges must be i32 [E,2], got ' .. e:dtype() .. ' [' .. table.concat(es, ',') .. ']')
    end
    -- the labels are checked against the file's num_classes before anything is sized by them
    -- (one corrupt label must not become a million-class output layer)
    local ymin, ymax = y:min():item(), y:max():item()
    local num_classes = attrs.num_classes
    if num_classes ~= nil then
      if type(num_classes) ~= 'number' or num_classes < 1 or num_classes % 1 ~= 0 then
        bad(path, 'root attribute num_classes must be a positive integer, got ' .. tostring(num_classes))
      end
      if ymin < 0 or ymax >= num_classes then
        bad(path, string.format('labels out of range: min %d, max %d for num_classes = %d (root attribute)', ymin,
          ymax, num_classes))
      end
    else
      if ymin < 0 then bad(path, 'labels out of range: minimum ' .. ymin) end
      if ymax >= n then
        bad(path, string.format('labels out of range: max %d with %d nodes and no num_classes attribute', ymax, n))
      end
      num_classes = ymax + 1
    end
    if e:numel() > 0 then
      local emin, emax = e:min():item(), e:max():item()
      if emin < 0 or emax >= n then
        bad(path, string.format('edges point outside the node set [0, %d): min %d, max %d', n, emin, emax))
      end
    end
    for split, m in pairs(masks) do
      if m:dtype() ~= 'u8' or #m:shape() ~= 1 or m:shape()[1] ~= n then
        bad(path, '/' .. split .. '_mask must be u8 [' .. n .. ']')
      end
    end
    if opts.normalize_features ~= false then
      -- row-normalise (GCN/GAT preprocessing); all-zero rows stay zero
      local s = x:sum(-1, true)
      s = pn.where(s:eq(0), pn.ones(s:shape()), s)
      x = x / s
    end
    local d = { name = name, path = path, x = x:contiguous(), y = y:to('i64'), edges = e:to('i64'),
                num_nodes = n, num_features = xs[2], num_classes = num_classes }
    d.train_idx = mask_indices(masks.train)
    d.val_idx = mask_indices(masks.val)
    d.test_idx = mask_indices(masks.test)
    d.graph = pn.graph(d.edges, n, { self_loops = opts.self_loops ~= false })
    return d
  end

  data.register('cora', function(opts) return load('cora', opts) end,
    { description = 'Cora citation graph, Planetoid public split (2708 nodes, 7 classes)', options = OPTIONS })
  data.register('citeseer', function(opts) return load('citeseer', opts) end,
    { description = 'CiteSeer citation graph, Planetoid public split (3327 nodes, 6 classes)', options = OPTIONS })
  return load
end
