-- penumbra.recipes.scalefree — the shared recipe of experiments/scalefree_{lp,splp}_*.lua:
-- Hyperbolic Attention Networks §5.1 — a Recursive Transformer (4 heads × 4 units, 3 tied
-- recursions, graph-neighbourhood attention) trained on online random hyperbolic graphs
-- (pn.data.scalefree: link prediction or shortest-path length), with the attention score
-- swapped. Each step draws `batch` fresh graphs (HAN's generator preset, the curriculum of
-- App. A.3 over the first half of the steps); validation and test are fixed sets of graphs.
-- Logged: loss and accuracy curves, the summary (test accuracy; for SPLP also the optimal
-- constant predictor's accuracy, `baseline`), /radii/keys (per node and head, of the last
-- recursion on the test graphs: the hyperbolic radius for pseudopolar, the height for the
-- cones, the key norm without a map) — `./bench plot radius` draws them.
-- `./bench -n N` (penumbra/ddp.lua): shard = 'graphs' — every rank makes only its examples of
-- each step's batch (pn.data.scalefree's d:batch: example i is a function of (seed, step, i)),
-- each weighing 1, since the loss and train_acc are means over the batch's pairs (one per
-- graph); batch must be >= N. The model has no dropout, so the losses are one process's to
-- rounding (dtype=f64: spec/ddp_spec.lua).
--
--   return require('penumbra.recipes.scalefree'){ task = 'lp', score = 'hyperbolic' }
local pn = require 'penumbra'

local R = {}

function R.model(cfg, dims)
  local o = { in_dim = dims.num_features, out_dim = dims.num_classes, d_model = cfg.d_model, heads = cfg.heads,
              head_dim = cfg.head_dim, ff = cfg.ff, depth = cfg.depth, score = cfg.score, dense = cfg.dense,
              normalize = cfg.normalize ~= 'default' and cfg.normalize or nil,
              aggregate = cfg.aggregate ~= 'sum' and cfg.aggregate or nil }
  local desc = pn.attention_variant(cfg.score)
  if desc.params.r and (cfg.r or 0) > 0 then o.r = cfg.r end
  return pn.nn.RecursiveTransformer(o)
end

function R.data(cfg)
  return pn.data.load('scalefree', {
    task = cfg.task, n = cfg.n, preset = cfg.preset ~= 'none' and cfg.preset or nil,
    degree = cfg.preset == 'none' and cfg.degree or nil, exponent = cfg.preset == 'none' and cfg.exponent or nil,
    max_len = cfg.max_len, lessons = cfg.lessons, curriculum = cfg.curriculum, steps = cfg.steps,
    eval_size = cfg.eval_size, negatives = cfg.task == 'lp' and cfg.negatives or nil,
    seed = cfg.seed }) -- the training graphs follow the run's seed (val and test do not)
end

function R.dims(run)
  return { num_features = run:read('params/encoder/weight'):shape()[2],
           num_classes = run:read('params/read2/weight'):shape()[1] }
end

function R.describe(cfg, dims)
  return string.format('RecursiveTransformer(%d features → %d classes, score=%s)', dims.num_features, dims.num_classes,
    tostring(cfg.score))
end

-- loss and accuracy of the model on a list of batches
local function evaluate_on(model, batches)
  local loss, correct, total = 0, 0, 0
  for _, b in ipairs(batches) do
    b.graph.sizes = b.sizes
    local logits = model(b.x, b.graph, b.pairs)
    local P = b.y:numel()
    loss = loss + pn.cross_entropy(logits, b.y):item() * P
    correct = correct + pn.metrics.correct(logits, b.y)
    total = total + P
  end
  return { loss = loss / total, acc = correct / total }
end

local function experiment(o)
  local config = {
    task = o.task, score = o.score, n = o.n or 200, preset = o.preset or 'han', degree = 10, exponent = 3,
    steps = o.steps or 1500, eval_every = 150, batch = 16, lr = 0.003, weight_decay = 0,
    d_model = 16, heads = 4, head_dim = 4, ff = 64, depth = 3, dense = false,
    normalize = o.normalize or 'default', aggregate = o.aggregate or 'sum', r = o.r or 0,
    max_len = 25, lessons = 6, curriculum = 0.5, eval_size = 200, negatives = 'uniform', seed = 0, threads = 0,
    dtype = 'f32',
  }
  local unit = { 'number', min = 0, max = 1 }
  local count = { 'integer', min = 1 }
  return pn.experiment{
    name = o.name or ('scalefree_' .. o.task .. '_' .. o.score),
    recipe = 'penumbra.recipes.scalefree',
    config = config,
    limits = { task = { 'string', one_of = { 'lp', 'splp' } }, score = { 'string', one_of = pn.attention_variants() },
               n = { 'integer', min = 10 }, preset = { 'string', one_of = { 'han', 'none' } },
               degree = { 'number', above = 0 }, exponent = { 'number', above = 2 }, batch = count,
               lr = { 'number', above = 0 }, weight_decay = { 'number', min = 0 }, d_model = count, heads = count,
               head_dim = count, ff = count, depth = count,
               normalize = { 'string', one_of = { 'default', 'softmax', 'sigmoid', 'sigmoid_normalized' } },
               aggregate = { 'string', one_of = { 'sum', 'einstein' } }, r = { 'number', min = 0 },
               max_len = { 'integer', min = 2 }, lessons = count, curriculum = unit, eval_size = count,
               negatives = { 'string', one_of = { 'uniform', 'near' } }, dtype = { 'string', one_of = { 'f32', 'f64' } } },
    monitor = 'val_acc', mode = 'max', also = { val_loss = 'min' },
    -- ./bench -n N: each rank makes and trains on its share of every batch's graphs (d:batch)
    shard = 'graphs',
    setup = function(cfg, run)
      local d = R.data(cfg)
      local model = R.model(cfg, d)
      -- dtype=f64 (checks where f32 rounding drifts: ddp_spec): the model and the evaluation
      -- graphs' inputs converted once (training batches in def.batch), before the optimiser
      if cfg.dtype ~= 'f32' then
        model:to(cfg.dtype)
        for _, set in ipairs({ d.val, d.test }) do
          for _, b in ipairs(set) do b.x = b.x:to(cfg.dtype) end
        end
      end
      run:set('parameters', model:num_parameters())
      run:set('data', d:describe())
      run:set('model', tostring(model):match('^[^\n]*'))
      local opt = pn.optim.Adam(model, { lr = cfg.lr, weight_decay = cfg.weight_decay })
      return { d = d, model = model, opt = opt }
    end,
    model = function(s) return s.model end,
    optimizer = function(s) return s.opt end, -- resume=…: the rest comes from (seed, step)
    -- inside the runner's training step: under -n N, this rank's examples of the step's batch
    batch = function(s, cfg, step)
      local b = s.d:batch(step, cfg.batch)
      if cfg.dtype ~= 'f32' then b.x = b.x:to(cfg.dtype) end
      return b
    end,
    train = function(s, _, _, b)
      local model = s.model
      model:train()
      s.opt:zero_grad()
      b.graph.sizes = b.sizes
      local logits = model(b.x, b.graph, b.pairs)
      local loss = pn.cross_entropy(logits, b.y)
      loss:backward()
      s.opt:step()
      local acc = pn.no_grad(pn.metrics.accuracy, logits:detach(), b.y)
      -- nodes: the global batch's node total. Under -n N a rank holds #b.sizes of its b.batch_size
      -- graphs and reports its nodes per graph × b.batch_size; ddp's weighted mean over the
      -- ranks (weights = graphs) sums those back to exactly the total. In one process: b.num_nodes.
      -- loss and train_acc are means over this batch's pairs, which that weighted mean combines exactly.
      local nodes = b.num_nodes * (b.batch_size or #b.sizes) / #b.sizes
      return { loss = loss:item(), train_acc = acc, nodes = nodes }
    end,
    evaluate = function(s, _, split)
      s.model:eval()
      return pn.no_grad(evaluate_on, s.model, split == 'test' and s.d.test or s.d.val)
    end,
    finish = function(s, cfg, run)
      local model = s.model
      -- radii of the last recursion's keys on the first test batch's graphs
      pn.no_grad(function()
        local b = s.d.test[1]
        b.graph.sizes = b.sizes
        model:eval()
        model(b.x, b.graph, b.pairs)
        local r, kind = model:radii()
        run:write('radii/keys', r:to('f64'):contiguous(), { score = cfg.score, map = model.map or 'none', kind = kind,
          n = cfg.n, what = kind .. ' of the last recursion\'s keys, per node and head, on test graphs' })
      end)
      return { baseline = s.d.baseline, parameters = model:num_parameters() }
    end,
  }
end

return setmetatable(R, { __call = function(_, o) return experiment(o) end })
