-- penumbra.recipes.ppi — the shared recipe of experiments/ppi_*.lua: the inductive GAT of
-- Veličković et al. §3.3 on PPI (3 layers, heads 4-4-6, 256 units per head, ELU, a skip
-- connection across the middle layer, no dropout, no weight decay, Adam lr 0.005, batches of
-- 2 whole graphs, patience 100 on validation micro-F1 or loss) with the attention score
-- swapped. Multi-label: binary cross-entropy with logits over the 121 labels, micro-F1.
-- Data: the real files when pn.data.ppi finds them (dataset='auto', the default, or 'real'),
-- otherwise the generated stand-in pn.data.ppi_synthetic (the same shapes and file layout);
-- the run file, the summary and the console say which (`data_source`).
--
--   return require('penumbra.recipes.ppi'){ score = 'umbral', r = 0.1 }
local pn = require 'penumbra'

local R = {}

local function heads_of(cfg)
  local h = {}
  for v in tostring(cfg.heads):gmatch('[^,%s]+') do
    local n = tonumber(v)
    if not n or n < 1 or n % 1 ~= 0 then error("ppi: heads must list positive integers like '4,4,6', got " .. cfg.heads, 0) end
    h[#h + 1] = n
  end
  if #h < 2 then error("ppi: heads must list at least two layers like '4,4,6', got " .. cfg.heads, 0) end
  return h
end

function R.model(cfg, dims)
  local o = { score = cfg.score, hidden = cfg.hidden, heads = heads_of(cfg), residual = cfg.residual,
              qk_dim = cfg.qk_dim > 0 and cfg.qk_dim or nil, map = cfg.map ~= 'default' and cfg.map or nil }
  local desc = pn.attention_variant(cfg.score)
  if desc.params.gamma then o.gamma = cfg.gamma end
  if desc.params.r and (cfg.r or 0) > 0 then o.r = cfg.r end
  return pn.nn.InductiveGAT(dims.num_features, dims.num_classes, o)
end

-- the real files if asked or found; the synthetic set otherwise
function R.data(cfg)
  if cfg.dataset ~= 'synthetic' then
    local ok, d = pcall(pn.data.ppi, { path = cfg.path ~= '' and cfg.path or nil })
    if ok then return d end
    if cfg.dataset == 'real' then error(d, 0) end
    if not tostring(d):find('no PPI files found', 1, true) then error(d, 0) end -- broken files are not skipped
  end
  return pn.data.ppi_synthetic{ graphs = cfg.synthetic_graphs, nodes = cfg.synthetic_nodes, seed = cfg.data_seed }
end

function R.dims(run)
  local L = #heads_of(run.config)
  return { num_features = run:read('params/layer1/proj/weight'):shape()[2],
           num_classes = run:read('params/layer' .. L .. '/bias'):shape()[1] }
end

function R.describe(cfg, dims)
  return string.format('InductiveGAT(%d → %d labels, heads %s × %d, score=%s)', dims.num_features, dims.num_classes,
    cfg.heads, cfg.hidden, tostring(cfg.score))
end

-- loss and F1 counts over a list of batches
local function run_batches(model, batches)
  local loss, nodes, counts = 0, 0, nil
  for _, b in ipairs(batches) do
    local logits = model(b.x, b.graph)
    loss = loss + pn.binary_cross_entropy_with_logits(logits, b.y):item() * b.num_nodes
    nodes = nodes + b.num_nodes
    counts = pn.metrics.f1_counts(logits, b.y, counts)
  end
  return loss / nodes, counts
end

-- the constant predictors: all negative, all positive, and each label's majority on train
local function baselines(d)
  local pos, n = nil, 0
  for _, g in ipairs(d.graphs.train) do -- on the host (the labels may live on the device)
    local s = g.y:to('cpu'):sum(1)
    pos = pos and pos + s or s
    n = n + g.num_nodes
  end
  local majority = pos:gt(n / 2):to('f32') * 2 - 1 -- a logit: + where most train nodes are positive
  local out = {}
  for name, logit in pairs({ all_negative = function(y) return pn.full(y:shape(), -1) end,
                             all_positive = function(y) return pn.full(y:shape(), 1) end,
                             label_majority = function(y) return majority:expand(y:shape()) end }) do
    local c
    for _, g in ipairs(d.graphs.test) do
      local y = g.y:to('cpu')
      c = pn.metrics.f1_counts(logit(y), y, c)
    end
    local micro = pn.metrics.f1(c)
    out['baseline_' .. name] = micro ~= micro and 0 or micro -- nothing predicted, nothing right: F1 0
  end
  return out
end

local function experiment(o)
  local config = {
    score = o.score, dataset = 'auto', path = '', synthetic_graphs = 24, synthetic_nodes = 2400, data_seed = 0,
    epochs = o.epochs or 10, patience = 100, eval_every = 1, batch = 2, lr = o.lr or 0.005, weight_decay = 0,
    hidden = 256, heads = '4,4,6', residual = true, qk_dim = 0, map = 'default', gamma = o.gamma or 1, r = o.r or 0,
    seed = 0, threads = 0, dtype = 'f32', device = 'cpu',
  }
  local count = { 'integer', min = 1 }
  return pn.experiment{
    name = o.name or ('ppi_' .. o.score),
    recipe = 'penumbra.recipes.ppi',
    config = config,
    limits = { score = { 'string', one_of = pn.attention_variants() },
               dataset = { 'string', one_of = { 'auto', 'real', 'synthetic' } }, synthetic_graphs = { 'integer', min = 3 },
               synthetic_nodes = { 'integer', min = 20 }, batch = count, lr = { 'number', above = 0 },
               weight_decay = { 'number', min = 0 }, hidden = count, qk_dim = { 'integer', min = 0 },
               gamma = { 'number', above = 0 }, r = { 'number', min = 0 },
               dtype = { 'string', one_of = { 'f32', 'f64' } }, device = { 'string', one_of = { 'cpu', 'cuda' } } },
    monitor = 'val_f1', mode = 'max', also = { val_loss = 'min' },
    -- ./bench -n N: each rank takes its share of every batch's graphs (d:batches('train', …))
    shard = 'graphs',
    setup = function(cfg, run)
      local d = R.data(cfg)
      local source = d.synthetic and 'synthetic' or 'real'
      io.stderr:write('ppi: training on the ' .. source:upper() .. ' set — ' .. d:describe() .. '\n')
      run:set('data_source', source)
      run:set('data', d:describe())
      run:set('dataset_file', d.path)
      local model = R.model(cfg, d)
      -- dtype=f64 (checks where f32 rounding drifts: ddp_spec) and device=cuda: the model and every
      -- graph's features and labels converted once, so the batches are made there (the edges stay
      -- on the host; the attention uploads the graph); before the optimiser takes the parameters
      if cfg.dtype ~= 'f32' or cfg.device ~= 'cpu' then
        model:to(cfg.dtype):to(cfg.device)
        for _, gs in pairs(d.graphs) do
          for _, g in ipairs(gs) do
            g.x, g.y = g.x:to(cfg.dtype):to(cfg.device), g.y:to(cfg.dtype):to(cfg.device)
          end
        end
      end
      run:set('parameters', model:num_parameters())
      local opt = pn.optim.Adam(model, { lr = cfg.lr, weight_decay = cfg.weight_decay })
      return { d = d, model = model, opt = opt, source = source, val = d:batches('val', cfg.batch),
               test = d:batches('test', cfg.batch) }
    end,
    model = function(s) return s.model end,
    optimizer = function(s) return s.opt end, -- resume=…: the rest comes from (seed, step)
    train = function(s, cfg, step)
      local model = s.model
      model:train()
      local loss, nodes, counts = 0, 0, nil
      for _, b in ipairs(s.d:batches('train', cfg.batch, cfg.seed * 100003 + step)) do
        s.opt:zero_grad()
        local logits = model(b.x, b.graph)
        local l = pn.binary_cross_entropy_with_logits(logits, b.y)
        l:backward()
        s.opt:step()
        loss = loss + l:item() * b.num_nodes
        nodes = nodes + b.num_nodes
        counts = pn.no_grad(pn.metrics.f1_counts, logits:detach(), b.y, counts)
      end
      return { loss = loss / nodes, train_f1 = (pn.metrics.f1(counts)) }
    end,
    evaluate = function(s, _, split)
      s.model:eval()
      return pn.no_grad(function()
        local loss, counts = run_batches(s.model, split == 'test' and s.test or s.val)
        return { loss = loss, f1 = (pn.metrics.f1(counts)) }
      end)
    end,
    finish = function(s, _, run)
      s.model:eval()
      local _, counts = pn.no_grad(run_batches, s.model, s.test)
      local micro, per = pn.metrics.f1(counts)
      run:write('metrics/test_f1_per_label', pn.tensor(per, { dtype = 'f64' }),
                { what = 'F1 of each label on the test graphs (NaN: no positives and no predictions)', micro = micro })
      local out = baselines(s.d)
      out.data_source = s.source
      out.parameters = s.model:num_parameters()
      local lo, hi = math.huge, -math.huge
      for _, v in ipairs(per) do if v == v then lo, hi = math.min(lo, v), math.max(hi, v) end end
      out.test_f1_label_min, out.test_f1_label_max = lo, hi
      return out
    end,
  }
end

return setmetatable(R, { __call = function(_, o) return experiment(o) end })
