-- experiments/perf/gat_gpu.lua — penumbra's CUDA backend against PyTorch on the same GPU:
--   1. one Cora training epoch of the recipe's two-layer GAT (forward + backward + Adam +
--      zero_grad), per attention score, ours vs the scatter-based PyTorch GAT
--      (experiments/perf/gat_cpu_torch.py --device cuda; same data, same initial weights);
--   2. cudaMalloc calls per epoch in the steady state (the caching allocator: target 0);
--   3. matmul n × n × n f32, ours (cuBLAS) vs torch.matmul (matmul_gpu_torch.py), TF32 off.
-- Targets (issue 15): Cora epoch ≤ 8 ms and ≤ 1.0× PyTorch; matmul ≥ 0.9× torch.matmul at 4096³;
-- 0 cudaMalloc per epoch.
--
--   ./bench experiments/perf/gat_gpu.lua [reps=20] [warmup=5] [scores=gat,dot,…] [torch=1] [n=4096]
--
-- Every timed call ends with pn.cuda.synchronize() (and torch.cuda.synchronize() on the peer's
-- side), so a figure is the device's work, not the launch queue's. Under the kernel interpreter
-- (pn.cuda.interpreted()) the script is a dry run that proves it works end to end: a synthetic
-- 64-node graph instead of Cora, n = 32, 3 + 2 epochs, no peer, and its times mean nothing.
local pn = require 'penumbra'

args = args or {}
local bk = require 'penumbra.benchkit'
local now, median = bk.now, bk.median

if not pn.cuda.available() then
  error('gat_gpu: no CUDA device (pn.cuda.available() is false); on a machine without a GPU run the dry run in '
        .. 'the interpreter: PENUMBRA_BUILD=build-emu PENUMBRA_CMAKE_ARGS=-DPN_CUDA_EMU=ON ./bench '
        .. 'experiments/perf/gat_gpu.lua', 0)
end
local dry = pn.cuda.interpreted()
local here = (arg and arg[0] or 'experiments/perf/gat_gpu.lua'):match('^(.*)/[^/]*$') or '.'
local reps = tonumber(args.reps) or (dry and 2 or 20)
local warmup = tonumber(args.warmup) or (dry and 3 or 5) -- the allocator's pool fills in the first epochs
local n = tonumber(args.n) or (dry and 32 or 4096)
local scores = args.scores and bk.list(args.scores) or pn.attention_variants()
local py, pyinfo
if not dry and args.torch ~= '0' then py, pyinfo = bk.python('torch,h5py') end
if not dry and args.torch ~= '0' and not py then print('peer: ' .. pyinfo) end

bk.header('GAT on Cora and matmul on the GPU: penumbra (CUDA) vs PyTorch', {
  'device: ' .. pn.cuda.device_name() .. (dry and '   (the kernel interpreter: a dry run, NOT timings)' or '') })

local CFG = { hidden = 8, heads = 8, out_heads = 1, dropout = 0.6, attn_dropout = 0.6, proj_dropout = 0.6, gamma = 1,
              r = 0, qk_dim = 8, map = 'default', lr = 0.005, weight_decay = 5e-4 }
local recipe = require 'penumbra.recipes.gat_planetoid'

-- ---- data: Cora, or a small random graph in the interpreter ---------------------------------------
local d
if dry then
  local N, F, C = 64, 24, 4
  pn.manual_seed(3)
  local x = (pn.rand({ N, F }) - 0.8):relu()                  -- mostly zero, like bag-of-words rows
  local e = {}
  for i = 0, N - 1 do for j = 1, 3 do e[#e + 1] = { (i * 7 + j * 13) % N, i } end end
  local y = {}
  for i = 1, N do y[i] = (i * 5) % C end
  d = { x = x, y = pn.tensor(y, { dtype = 'i64' }), train_idx = pn.arange(0, N, 2, { dtype = 'i64' }),
        graph = pn.graph(e, N), num_nodes = N, num_features = F, num_classes = C }
else
  d = pn.data.load('cora')
end
local dcpu = d
d = pn.to_device(d, 'cuda')
print(string.format('%s: N=%d F=%d C=%d, %d edges with self loops; %d warm-up + %d timed epochs per score',
  dry and 'synthetic' or 'cora', d.num_nodes, d.num_features, d.num_classes, d.graph.num_edges, warmup, reps))

local ytr = d.y:index_select(1, d.train_idx)
local tmp = os.tmpname()
os.remove(tmp)
local dump = tmp .. '_gat_gpu.h5'
local tensors = { x = dcpu.x, y = dcpu.y, train_idx = dcpu.train_idx, offsets = dcpu.graph.offsets,
                  src = dcpu.graph.src }

-- ---- ours ---------------------------------------------------------------------------------------------
local rows = {}
for _, score in ipairs(scores) do
  local cfg = {}
  for k, v in pairs(CFG) do cfg[k] = v end
  cfg.score = score
  pn.manual_seed(1)
  local model = recipe.model(cfg, { num_features = d.num_features, num_classes = d.num_classes })
  for _, np in ipairs(model:named_parameters()) do tensors[score .. '/param/' .. np[1]] = np[2]:detach():clone() end
  model:to('cuda')
  model:train()
  local opt = pn.optim.Adam(model, { lr = cfg.lr, weight_decay = cfg.weight_decay })
  local function epoch()
    local loss = pn.cross_entropy(model(d.x, d.graph):index_select(1, d.train_idx), ytr)
    loss:backward()
    opt:step()
    opt:zero_grad()
    loss = nil -- luacheck: ignore
    collectgarbage('collect')
    pn.cuda.synchronize()
  end
  for _ = 1, warmup do epoch() end
  local m0 = pn.cuda.memory_stats().malloc_calls
  local ts = {}
  for _ = 1, reps do
    local t0 = now()
    epoch()
    ts[#ts + 1] = now() - t0
  end
  rows[#rows + 1] = { score = score, ours = median(ts), mallocs = (pn.cuda.memory_stats().malloc_calls - m0) / reps }
end
if py then pn.io.save(dump, tensors) end
tensors = nil -- luacheck: ignore

-- ---- the peer -----------------------------------------------------------------------------------------
local theirs, torch_info = {}, nil
if py then
  local cmd = string.format('%s %s/gat_cpu_torch.py --device cuda --data %s --reps %d --warmup %d --scores %s '
    .. '--check 0 --hidden %d --heads %d --qk-dim %d --dropout %g --lr %g --weight-decay %g 2>&1', py, here, dump,
    reps, warmup, table.concat(scores, ','), CFG.hidden, CFG.heads, CFG.qk_dim, CFG.dropout, CFG.lr, CFG.weight_decay)
  local p = io.popen(cmd)
  for line in p:lines() do
    local sc, rest = line:match('^time (%S+) (.*)$')
    if sc then
      local v = {}
      for x in rest:gmatch('%S+') do v[#v + 1] = tonumber(x) / 1e3 end
      theirs[sc] = median(v)
    elseif line:match('^torch ') then torch_info = line
    elseif not line:match('^%s*$') then io.stderr:write('torch: ' .. line .. '\n') end
  end
  p:close()
  os.remove(dump)
end

if torch_info then print(torch_info) end
print(string.format('%-11s %10s %10s %9s %14s   %s', 'score', 'ours ms', 'torch ms', 'ours/pt', 'cudaMalloc/ep',
  'target: ≤ 8 ms, ≤ 1.0× torch, 0 cudaMalloc'))
for _, r in ipairs(rows) do
  local t = theirs[r.score]
  local verdict = dry and 'dry run' or
    ((r.ours * 1e3 <= 8 and (not t or r.ours <= t) and r.mallocs == 0) and 'ok' or 'miss')
  print(string.format('%-11s %10.3f %10s %9s %14.2f   %s', r.score, r.ours * 1e3, t and string.format('%.3f', t * 1e3) or '-',
    t and string.format('%.3f', r.ours / t) or '-', r.mallocs, verdict))
end

-- ---- matmul ------------------------------------------------------------------------------------------------
print()
local a, b = pn.rand({ n, n }, { device = 'cuda' }), pn.rand({ n, n }, { device = 'cuda' })
local ts = {}
for i = 1, warmup + reps do
  pn.cuda.synchronize()
  local t0 = now()
  local c = a:matmul(b)
  pn.cuda.synchronize()
  if i > warmup then ts[#ts + 1] = now() - t0 end
  c = nil -- luacheck: ignore
end
local ours = median(ts)
local peer
if py then
  local p = io.popen(string.format('%s %s/matmul_gpu_torch.py --n %d --reps %d --warmup %d 2>&1', py, here, n, reps,
    warmup))
  for line in p:lines() do
    local rest = line:match('^time (.*)$')
    if rest then
      local v = {}
      for x in rest:gmatch('%S+') do v[#v + 1] = tonumber(x) / 1e3 end
      peer = median(v)
    elseif not line:match('^torch ') then io.stderr:write('torch: ' .. line .. '\n') end
  end
  p:close()
end
local flop = 2 * n ^ 3
print(string.format('matmul %d³ f32: ours %.3f ms (%.1f TFLOP/s)%s', n, ours * 1e3, flop / ours / 1e12,
  peer and string.format(', torch.matmul %.3f ms (%.1f TFLOP/s): ours/torch throughput %.3f (target ≥ 0.9)%s', peer * 1e3,
    flop / peer / 1e12, peer / ours, peer / ours >= 0.9 and ' ok' or ' miss') or (dry and '   (dry run)' or '')))
