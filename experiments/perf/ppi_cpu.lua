-- experiments/perf/ppi_cpu.lua — one PPI-sized training epoch of the inductive GAT
-- (lua/penumbra/recipes/ppi.lua: 3 layers, heads 4-4-6 × 256, a skip across the middle layer,
-- no dropout, Adam lr 0.005) against the same model written the scatter way in PyTorch
-- (experiments/perf/ppi_cpu_torch.py, its GATConv is gat_cpu_torch.py's), same weights.
--
--   ./bench experiments/perf/ppi_cpu.lua [scores=gat,dot] [reps=3] [warmup=1] [rounds=1]
--       [threads=2] [hidden=256] [check=1] [torch=1] [dataset=auto|synthetic]
--
-- The data: the recipe's (the real PPI files when pn.data.ppi finds them, else the synthetic
-- set at the real shapes: 20 training graphs, ~46k nodes, ~650k edges). One epoch = the 10
-- batches of 2 training graphs, each forward + binary cross-entropy + backward + Adam step
-- (ours also pays a full Lua GC per epoch, timed). The batches (features, labels, our CSR
-- with self loops) and each model's initial weights go to a temporary HDF5 file PyTorch
-- reads (python3-h5py). Check first, eval mode on the first batch: max |Δ logits| and the
-- worst relative gradient error. Peak memory: the growth of VmHWM over the timed epochs, in
-- each process (the data loaded before is not counted on either side).
-- Target: ours ≤ 0.5× PyTorch's epoch time.
local pn = require 'penumbra'
local bk = require 'penumbra.benchkit'

args = args or {}
local here = (arg and arg[0] or 'experiments/perf/ppi_cpu.lua'):match('^(.*)/[^/]*$') or '.'
local scores = bk.list(args.scores, 'gat,dot')
local reps, warmup, rounds = tonumber(args.reps or 3), tonumber(args.warmup or 1), tonumber(args.rounds or 1)
local threads = tonumber(args.threads or 2)
local hidden = tonumber(args.hidden or 256)
local do_check, use_torch = args.check ~= '0', args.torch ~= '0'
local py, pyinfo = bk.python('torch,h5py')
pn.set_num_threads(threads)

local recipe = require 'penumbra.recipes.ppi'
local cfg = { dataset = args.dataset or 'auto', path = args.path or '', synthetic_graphs = 24, synthetic_nodes = 2400,
              data_seed = 0, hidden = hidden, heads = '4,4,6', residual = true, qk_dim = 0, map = 'default', gamma = 1,
              r = 0 }

bk.header('PPI inductive GAT, one training epoch (10 × 2 graphs: fwd + BCE + bwd + Adam), penumbra vs PyTorch scatter', {
  string.format('torch.set_num_threads(%d)', threads) })
local d = recipe.data(cfg)
local batches = d:batches('train', 2)
local N, E = 0, 0
for _, b in ipairs(batches) do N, E = N + b.num_nodes, E + b.graph.src:numel() end
print(string.format('%s\nepoch: %d batches, %d nodes, %d edges with self loops; heads 4-4-6 × %d; %d warm-up + %d×%d timed',
  d:describe(), #batches, N, E, hidden, warmup, rounds, reps))

local tmp = os.tmpname()
os.remove(tmp)
local dump = tmp .. '_ppi_cpu.h5'
local T = {}
for i, b in ipairs(batches) do
  T['batch' .. i .. '/x'], T['batch' .. i .. '/y'] = b.x, b.y
  T['batch' .. i .. '/offsets'], T['batch' .. i .. '/src'] = b.graph.offsets, b.graph.src
end
local runs = {}
for _, score in ipairs(scores) do
  cfg.score = score
  pn.manual_seed(1)
  local model = recipe.model(cfg, d)
  for _, np in ipairs(model:named_parameters()) do T[score .. '/param/' .. np[1]] = np[2]:detach():clone() end
  if do_check then
    model:eval()
    local b = batches[1]
    local logits = model(b.x, b.graph)
    pn.binary_cross_entropy_with_logits(logits, b.y):backward()
    T[score .. '/logits'] = logits:detach():clone()
    for _, np in ipairs(model:named_parameters()) do T[score .. '/grad/' .. np[1]] = np[2].grad:clone() end
    model:zero_grad()
  end
  model:train()
  runs[score] = { model = model, opt = pn.optim.Adam(model, { lr = 0.005 }), ours = {}, torch = {}, peak = 0 }
end
pn.io.save(dump, T)
T = nil
collectgarbage('collect')

local function epoch(r)
  for _, b in ipairs(batches) do
    r.opt:zero_grad()
    pn.binary_cross_entropy_with_logits(r.model(b.x, b.graph), b.y):backward()
    r.opt:step()
  end
  collectgarbage('collect')
end

local torch_peak = {}
local function torch_round(first)
  local cmd = string.format('%s %s/ppi_cpu_torch.py --data %s --threads %d --reps %d --warmup %d ' ..
    '--scores %s --batches %d --check %d 2>&1', py, here, dump, threads, reps, warmup, table.concat(scores, ','), #batches,
    (first and do_check) and 1 or 0)
  local p = io.popen(cmd)
  local out = p:read('*a')
  p:close()
  for line in out:gmatch('[^\n]+') do
    local sc, rest = line:match('^time (%S+) (.*)$')
    if sc and runs[sc] then for t in rest:gmatch('%S+') do table.insert(runs[sc].torch, tonumber(t)) end end
    local ps, pb = line:match('^peak (%S+) (%d+)')
    if ps then torch_peak[ps] = math.max(torch_peak[ps] or 0, tonumber(pb)) end
    local cs, dl, ml, ge, gw = line:match('^check (%S+) (%S+) (%S+) (%S+) (%S*)')
    if cs then
      print(string.format('check %-6s max |Δ logits| %s of max |logits| %s; worst gradient rel. error %s (%s)', cs, dl,
        ml, ge, gw))
    end
    if line:match('^torch ') then print(line) end
  end
  if not out:find('time ') then error('ppi_cpu: the PyTorch peer failed:\n' .. out, 0) end
end

local have_torch = use_torch and py ~= nil
for round = 1, rounds do
  for _, score in ipairs(scores) do
    local r = runs[score]
    for _ = 1, warmup do epoch(r) end
    bk.reset_peak()
    local base = bk.rss().VmRSS
    for _ = 1, reps do
      local t0 = bk.now()
      epoch(r)
      r.ours[#r.ours + 1] = (bk.now() - t0) * 1e3
    end
    r.peak = math.max(r.peak, bk.rss().VmHWM - base)
  end
  if have_torch then torch_round(round == 1) end
end
os.remove(dump)

print(string.format('\n%-8s %10s %10s %8s %14s %14s  %s', 'score', 'ours s', 'torch s', 'ours/pt', 'ours peak MB',
  'torch peak MB', 'target'))
for _, score in ipairs(scores) do
  local r = runs[score]
  local mo, mt = bk.median(r.ours), have_torch and bk.median(r.torch) or nil
  print(string.format('%-8s %10.2f %10s %8s %14.0f %14s  %s', score, mo / 1e3, mt and string.format('%.2f', mt / 1e3) or '-',
    mt and string.format('%.2f', mo / mt) or '-', r.peak / 2 ^ 20,
    torch_peak[score] and string.format('%.0f', torch_peak[score] / 2 ^ 20) or '-',
    mt and (mo / mt <= 0.5 and '<= 0.5 ok' or '<= 0.5 MISSED') or ''))
end
