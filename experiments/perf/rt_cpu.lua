-- experiments/perf/rt_cpu.lua — one training step of the Recursive Transformer (HAN App. A.5,
-- lua/penumbra/nn/recursive.lua) on 1000-node random hyperbolic graphs against the same model
-- written in PyTorch (experiments/perf/rt_cpu_torch.py: per-edge gathers, scatter softmax,
-- index_add aggregation — how a user writes graph attention in PyTorch without a library).
--
--   ./bench experiments/perf/rt_cpu.lua [n=1000] [batch=8] [reps=5] [rounds=3] [threads=2]
--                                       [scores=dot,hyperbolic] [check=1]
--
-- The batch: `batch` LP examples of pn.data.scalefree (HAN's generator preset, the whole disk),
-- their graphs as one disjoint union (n·batch nodes). Scores: dot (softmax) and hyperbolic
-- (pseudopolar map, sigmoid weights, Einstein midpoint), the paper's two. The same weights in
-- both (written to an HDF5 file PyTorch reads, python3-h5py); the first step's logits and
-- gradients are compared (check) before anything is timed. A step is forward, backward and
-- Adam's update; each figure is the median over `rounds` rounds of `reps` steps, ours and
-- PyTorch taking turns round by round with the same thread count. Target: ours <= 0.5×
-- PyTorch's time. PyTorch comes from the peer Python (benchkit's bk.python: build/venv-peers with PyPI's torch
-- and h5py, else Debian's python3-torch + python3-h5py), never a project dependency.
local pn = require 'penumbra'
local bk = require 'penumbra.benchkit'

args = args or {}
local n = tonumber(args.n or 1000)
local batch = tonumber(args.batch or 8)
local reps = tonumber(args.reps or 5)
local rounds = tonumber(args.rounds or 3)
local threads = tonumber(args.threads or 2)
local scores = bk.list(args.scores, 'dot,hyperbolic')
local do_check = args.check ~= '0'
pn.set_num_threads(threads)
local here = (arg and arg[0] or 'experiments/perf/rt_cpu.lua'):match('^(.*)/[^/]*$') or '.'
local py, tv = bk.python('torch,h5py')
local have_torch = py ~= nil

bk.header('Recursive Transformer training step: penumbra vs PyTorch', {
  string.format('LP batch of %d graphs × %d nodes (HAN preset), 4 heads × 4, depth 3 (tied), %d threads for both', batch,
    n, threads),
  have_torch and ('peer: ' .. tv .. ' (' .. py .. ')') or ('peer: ' .. tv),
})

local d = pn.data.scalefree{ task = 'lp', n = n, preset = 'han', eval_size = 1, steps = 1, curriculum = 0 }
local b = d:batch(1, batch)
b.graph.sizes = b.sizes
print(string.format('batch: %d nodes, %d edges (self-loops included)', b.num_nodes, b.graph.src:numel()))

local tmp = os.tmpname()
os.remove(tmp)
local dump = tmp .. '_rt_cpu.h5'
local tensors = { x = b.x, y = b.y, pairs = b.pairs, offsets = b.graph.offsets, src = b.graph.src }
local runs = {}
for _, score in ipairs(scores) do
  pn.manual_seed(1)
  local o = { in_dim = d.num_features, out_dim = d.num_classes, score = score }
  if score == 'hyperbolic' then o.normalize, o.aggregate = 'sigmoid', 'einstein' end
  local model = pn.nn.RecursiveTransformer(o)
  for _, np in ipairs(model:named_parameters()) do tensors[score .. '/param/' .. np[1]] = np[2]:detach():clone() end
  if do_check then
    local logits = model(b.x, b.graph, b.pairs)
    pn.cross_entropy(logits, b.y):backward()
    tensors[score .. '/logits'] = logits:detach():clone()
    for _, np in ipairs(model:named_parameters()) do tensors[score .. '/grad/' .. np[1]] = np[2].grad:clone() end
    model:zero_grad()
  end
  runs[score] = { model = model, opt = pn.optim.Adam(model, { lr = 0.003 }), ours = {}, torch = {} }
end
pn.io.save(dump, tensors)

local function step(r)
  local loss = pn.cross_entropy(r.model(b.x, b.graph, b.pairs), b.y)
  loss:backward()
  r.opt:step()
  r.opt:zero_grad()
end

local function torch_round(first)
  local cmd = string.format('%s %s/rt_cpu_torch.py --data %s --threads %d --reps %d --warmup 1 '
    .. '--scores %s --check %d 2>&1', py, here, dump, threads, reps, table.concat(scores, ','), (first and do_check) and 1 or 0)
  local pp = io.popen(cmd)
  local out = pp:read('*a')
  pp:close()
  for line in out:gmatch('[^\n]+') do
    local sc, rest = line:match('^time (%S+) (.*)$')
    if sc and runs[sc] then for t in rest:gmatch('%S+') do table.insert(runs[sc].torch, tonumber(t)) end end
    local cs, dl, ml, ge, gw = line:match('^check (%S+) (%S+) (%S+) (%S+) (%S*)')
    if cs then
      print(string.format('check %-11s max |Δ logits| %s of max |logits| %s; worst gradient rel. error %s (%s)', cs, dl, ml,
        ge, gw))
    end
  end
  if not out:find('time ') then error('rt_cpu: the PyTorch peer failed:\n' .. out, 0) end
end

for round = 1, rounds do
  for _, score in ipairs(scores) do
    local r = runs[score]
    step(r) -- warm-up
    bk.time_calls(function() step(r) end, reps, r.ours, 0)
  end
  if have_torch then torch_round(round == 1) end
end
os.remove(dump)

print(string.format('\n%-12s %10s %10s %9s  %s', 'score', 'ours ms', 'torch ms', 'ours/pt', 'target'))
for _, score in ipairs(scores) do
  local r = runs[score]
  local mo = bk.median(r.ours)
  local mt = have_torch and bk.median(r.torch) or nil
  print(string.format('%-12s %10.1f %10s %9s  %s', score, mo, mt and string.format('%.1f', mt) or '-',
    mt and string.format('%.2f', mo / mt) or '-', mt and (mo / mt <= 0.5 and '<= 0.5 ok' or '<= 0.5 MISSED') or ''))
end
