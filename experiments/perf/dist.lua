-- experiments/perf/dist.lua — what data parallelism costs (issue 18): (a) the NMT Transformer's
-- training step on 1 rank × 1 thread against 2 ranks × 1 thread on the same global batches, and
-- the share of the step spent in the gradients' all-reduce; (b) all-reduce bandwidth over loopback,
-- pn.dist.all_reduce against an osu_allreduce-style loop in plain C (experiments/perf/
-- dist_allreduce.c, compiled here with mpicc into the build folder) in the same run.
--
--   ./bench experiments/perf/dist.lua [part=nmt,allreduce] [rounds=3] [ranks=2]
--        [preset=small] [steps=8] [warmup=3] [max_tokens=<preset's, 4096>] [dropout=<preset's>]
--        [lr=5e-4] [seed=0] [d_model= heads= ff= enc_layers= dec_layers= vocab=]  (the model)
--        [sizes=4K,16K,64K,256K,1M,4M,16M,64M] [iters=<auto>]
--
-- Started as ONE process: it starts its own jobs (`./bench -n R` for ours, `mpirun -np R` for the
-- C loop), one at a time, taking turns round by round, and prints medians over the rounds. Every
-- rank runs one thread: pn.set_num_threads(1) (OpenMP and OpenBLAS). Not OMP_NUM_THREADS=1 in the
-- jobs' environment: nproc counts it, and the launcher would then see one core for two ranks.
--
-- (a) NMT: the model of recipes/nmt.lua's preset (small: 2 + 2 layers, d = 128, FFN 256, vocabulary
-- 4000; base: 3 + 3, d = 256, FFN 1024, vocabulary 8000) on Multi30k's training batches (the
-- recipe's BPE, token batches of max_tokens in the recipe's shuffled order, seed 0, epoch 1). A
-- job — 1 rank (a plain process) or R ranks (penumbra/ddp.lua, exactly as the runner uses it:
-- parameters broadcast from rank 0, every global batch cut into strided shares weighed by target
-- tokens, gradients scaled and summed in ≤ 25 MB buckets when clip_grad_norm first reads them) —
-- runs 1 check step (dropout off: the losses of the two jobs must agree to 1e-5 relative, or the
-- run stops), `warmup` untimed steps, then `steps` timed steps, global batch k being batch k of the
-- epoch in every job. A step: forward, label-smoothed CE (0.1, sum / target tokens), backward,
-- clip 1.0, Adam (0.9, 0.98, wd 1e-4), zero_grad — what recipes/nmt.lua's def.train does per
-- batch. Each round runs three jobs: 1 rank; R ranks whose buckets are all sent after the backward
-- (PENUMBRA_DDP_OVERLAP=0); R ranks whose buckets start inside the backward as their gradients
-- become final (the default, DDP's overlap). The gradient exchange is timed inside ddp.lua
-- (ddp.timing, always on): the time it keeps the step waiting — the small header all-reduce
-- (where a rank waits for a slower one) and, after the backward, the buckets still to send and
-- the wait for them — so it is "time spent waiting in all-reduce"; and that last wait alone.
-- Reported: median ms per step, target tokens per second, speed-up over 1 rank, and per rank
-- the median sync ms, Σ sync / Σ step and the median wait.
--
-- (b) all-reduce: f32 sums of `sizes` bytes on R ranks, zeros (no denormals). Each size: iters/10
-- + 1 untimed calls, a barrier, `iters` timed calls (auto: 2²⁸ bytes' worth, 20 … 1000, as osu's
-- 1000 small / 100 large); the time per call is the slowest rank's. Ours: pn.dist.all_reduce (in
-- place; it agrees on shape, dtype and op first — a small all-gather per call, which the small
-- sizes show). C: MPI_Allreduce with two buffers (osu's way: the reference of the ratio) and in
-- place. Bus bandwidth (NCCL's convention) = 2(R−1)/R · bytes / time; ours/C ≥ 0.9 is the target.
local pn = require 'penumbra'
local bk = require 'penumbra.benchkit'

args = args or {}
local function num(k, d) return tonumber(args[k] or d) end
local HOME = os.getenv('PENUMBRA_HOME') or '.'
local SCRIPT = HOME .. '/experiments/perf/dist.lua'

-- '4K' → 4096, '1M' → 1048576, '512' → 512
local function bytes_of(s)
  local n, u = tostring(s):match('^(%d+)([KkMmGg]?)$')
  if not n then error("dist.lua: sizes must be byte counts like 4096, 64K or 16M, got '" .. tostring(s) .. "'", 0) end
  local mul = ({ [''] = 1, k = 2 ^ 10, m = 2 ^ 20, g = 2 ^ 30 })[u:lower()]
  return tonumber(n) * mul
end

local function fmt_bytes(b)
  if b >= 2 ^ 20 then return string.format('%g MB', b / 2 ^ 20) end
  if b >= 2 ^ 10 then return string.format('%g KB', b / 2 ^ 10) end
  return b .. ' B'
end

-- =============================================================================================
-- workers: started by the parent below as `./bench [-n R] experiments/perf/dist.lua worker=…`;
-- rank 0 prints one line `result key=v,v,… …` for the parent
-- =============================================================================================
local function emit(fields)
  local parts = { 'result' }
  for _, kv in ipairs(fields) do
    local v = kv[2]
    if type(v) == 'table' then
      local t = {}
      for i, x in ipairs(v) do t[i] = string.format('%.6g', x) end
      v = table.concat(t, ',')
    elseif type(v) == 'number' then
      v = string.format('%.10g', v)
    end
    parts[#parts + 1] = kv[1] .. '=' .. v
  end
  print(table.concat(parts, ' '))
  io.stdout:flush()
end

-- every rank's list xs (same length everywhere) → { rank 0's, rank 1's, … }
local function gather_lists(xs)
  local d = pn.dist
  if not d.is_distributed() then return { xs } end
  local all = d.all_gather(pn.tensor(#xs > 0 and xs or { 0 }, { dtype = 'f64' })):totable()
  if #xs == 0 then for r = 1, #all do all[r] = {} end end
  return all
end

local function nmt_worker()
  local dist, ddp = pn.dist, require 'penumbra.ddp'
  local tr = require 'penumbra.data.translation'
  local R = require 'penumbra.recipes.nmt'
  pn.set_num_threads(1)
  local preset = R.PRESETS[args.preset or 'small']
  if not preset then error("dist.lua: unknown preset '" .. tostring(args.preset) .. "' (base, small)", 0) end
  local cfg = { score = 'dot', map = 'default', hyper_model = 'default', qk_dim = 0, r = 0, self_attn = 'softmax',
                prenorm = false, act_dropout = 0, max_len = 256, device = 'cpu', seed = num('seed', 0) }
  for k, v in pairs(preset) do cfg[k] = v end
  for _, k in ipairs({ 'd_model', 'heads', 'ff', 'enc_layers', 'dec_layers', 'vocab', 'max_tokens', 'dropout' }) do
    if args[k] then cfg[k] = num(k) end
  end
  local steps, warmup, lr = num('steps', 8), num('warmup', 3), num('lr', 5e-4)

  local def = { name = 'perf_dist', shard = 'sentences', model = function(s) return s.model end }
  function def.setup()
    local d = pn.data.load('multi30k')
    local tok = R.tokenizer(cfg, d)
    local enc = tr.encode(d.train, tok, { max_len = cfg.max_len, mode = 'train' })
    pn.manual_seed(cfg.seed)
    local model = R.model(cfg, { vocab = tok.vocab_size })
    local opt = pn.optim.Adam(model, { lr = lr, betas = { 0.9, 0.98 }, eps = 1e-8, weight_decay = 1e-4 })
    return { enc = enc, model = model, opt = opt, vocab = tok.vocab_size }
  end
  local distributed = dist.is_distributed()
  local s
  if distributed then
    ddp.start(def, cfg, {})
    s = ddp.setup(def, cfg, nil)
  else
    s = def.setup()
  end
  local model, opt, enc = s.model, s.opt, s.enc

  -- the epoch's global batches (outside a training step: whole on every rank); positions, not
  -- line numbers, in b.index (no enc.index), so each batch's sentences make an encoding of their
  -- own, which tr.batches (max_tokens large enough for one batch) cuts into this rank's share
  local whole = { src_ids = enc.src_ids, tgt_ids = enc.tgt_ids, n = enc.n, mode = 'train', pad = enc.pad,
                  bos = enc.bos, eos = enc.eos }
  local glob = tr.batches(whole, { max_tokens = cfg.max_tokens, seed = cfg.seed, epoch = 1 })
  local total = 1 + warmup + steps
  local subs = {}
  for i = 1, total do
    local b = glob[(i - 1) % #glob + 1]
    local sub = { src_ids = {}, tgt_ids = {}, mode = 'train', pad = enc.pad, bos = enc.bos, eos = enc.eos }
    local long = 1
    for r, p in ipairs(b.index) do
      sub.src_ids[r], sub.tgt_ids[r] = enc.src_ids[p], enc.tgt_ids[p]
      long = math.max(long, #enc.src_ids[p] + 1, #enc.tgt_ids[p] + 1)
    end
    sub.n = #sub.src_ids
    -- max_tokens: room for every sentence in one batch (a bound on its padded size)
    subs[i] = { enc = sub, ntokens = b.ntokens, max_tokens = sub.n * long }
  end
  glob = nil

  local T = ddp.timing
  local function step(i)
    if distributed then ddp.begin_step() end
    local bs = tr.batches(subs[i].enc, { max_tokens = subs[i].max_tokens, shuffle = false })
    assert(#bs == 1, 'dist.lua: a global batch was cut in two')
    local b = bs[1]
    local s0, a0 = T.sync_s, T.all_reduce_s
    collectgarbage('collect')
    local t0 = bk.now()
    local logits = model(b.src, b.tgt_in, b.src_mask)
    local V = logits:shape()[3]
    local loss = pn.cross_entropy(logits:view(-1, V), b.tgt_out:view(-1),
      { label_smoothing = 0.1, ignore_index = 0, reduction = 'sum' }) / b.ntokens
    local lv = loss:item()
    loss:backward()
    pn.optim.clip_grad_norm(model, 1.0)
    opt:step()
    opt:zero_grad()
    local ms = (bk.now() - t0) * 1e3
    logits, loss = nil, nil
    local m = { loss = lv }
    if distributed then ddp.end_step(m, i) end
    return ms, (T.sync_s - s0) * 1e3, (T.all_reduce_s - a0) * 1e3, m.loss
  end

  model:eval() -- the check step: no dropout, so 1 rank and R ranks compute the same loss
  local _, _, _, check_loss = step(1)
  model:train()
  for i = 2, 1 + warmup do step(i) end
  local ms, sync, ar, tokens = {}, {}, {}, {}
  for i = 2 + warmup, total do
    local a, b, c = step(i)
    ms[#ms + 1], sync[#sync + 1], ar[#ar + 1], tokens[#tokens + 1] = a, b, c, subs[i].ntokens
  end
  local syncs, bytes = T.syncs, T.bytes
  local early, buckets = T.early, T.buckets
  local all_ms, all_sync, all_ar = gather_lists(ms), gather_lists(sync), gather_lists(ar)
  if distributed then
    ddp.finish_training()
    ddp.stop()
  end
  if dist.rank() == 0 then
    local fields = { { 'ranks', dist.size() }, { 'check_loss', check_loss }, { 'params', model:num_parameters() },
                     { 'vocab', s.vocab }, { 'bytes_per_sync', syncs > 0 and bytes / syncs or 0 }, { 'tokens', tokens },
                     { 'early', early }, { 'buckets', buckets } }
    for r = 1, #all_ms do
      fields[#fields + 1] = { 'ms' .. (r - 1), all_ms[r] }
      fields[#fields + 1] = { 'sync' .. (r - 1), all_sync[r] }
      fields[#fields + 1] = { 'ar' .. (r - 1), all_ar[r] }
    end
    emit(fields)
  end
end

local function allreduce_worker()
  local dist = pn.dist
  pn.set_num_threads(1)
  local us = {}
  for spec in tostring(args.plan):gmatch('[^,]+') do
    local bytes, iters = spec:match('^(%d+):(%d+)$')
    bytes, iters = tonumber(bytes), tonumber(iters)
    local t = pn.zeros({ bytes / 4 })
    for _ = 1, math.floor(iters / 10) + 1 do dist.all_reduce(t, 'sum') end
    dist.barrier()
    local t0 = bk.now()
    for _ = 1, iters do dist.all_reduce(t, 'sum') end
    local per = (bk.now() - t0) / iters
    us[#us + 1] = dist.all_reduce(pn.tensor({ per }, { dtype = 'f64' }), 'max'):item() * 1e6
  end
  if dist.rank() == 0 then emit({ { 'us', us } }) end
end

if args.worker == 'nmt' then return nmt_worker() end
if args.worker == 'allreduce' then return allreduce_worker() end
if args.worker then error("dist.lua: unknown worker '" .. tostring(args.worker) .. "' (nmt, allreduce)", 0) end

-- =============================================================================================
-- the parent: one process, starting the jobs in turn
-- =============================================================================================
local parts = {}
for _, p in ipairs(bk.list(args.part, 'nmt,allreduce')) do
  if p ~= 'nmt' and p ~= 'allreduce' then error("dist.lua: part must list nmt and/or allreduce, got '" .. p .. "'", 0) end
  parts[p] = true
end
local rounds, ranks = num('rounds', 3), num('ranks', 2)
if not (ranks and ranks >= 2 and ranks % 1 == 0) then error('dist.lua: ranks must be a whole number >= 2', 0) end

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function first_line(cmd)
  local p = io.popen(cmd)
  local l = p and p:read('*l')
  if p then p:close() end
  return l or '?'
end
local function which(name) local w = first_line('command -v ' .. name .. ' 2>/dev/null') return w ~= '?' and w or nil end
local mpirun, mpicc = which('mpirun'), which('mpicc')
if not mpirun then error('dist.lua: needs mpirun (Open MPI): apt-get install -y openmpi-bin libopenmpi-dev', 0) end
if not pn.dist.built() then error('dist.lua: this libpenumbra was built without MPI (README "Several processes (MPI)")', 0) end
local cores = tonumber(first_line('nproc')) or 1
local over = ranks > cores -- more ranks than cores: they share (and the figures say little)

local tmp = os.tmpname()
local function job(cmd, what)
  local p = io.popen(cmd .. ' 2>' .. sh_quote(tmp))
  local out = p:read('*a')
  local ok = p:close()
  local line = out:match('result [^\n]*')
  if not ok or not line then
    local f = io.open(tmp)
    local err = f and f:read('*a') or ''
    if f then f:close() end
    error('dist.lua: the ' .. what .. ' job failed: ' .. cmd .. '\n' .. out .. err, 0)
  end
  local r = {}
  for k, v in line:gmatch('(%S+)=(%S+)') do
    local list = {}
    for x in v:gmatch('[^,]+') do list[#list + 1] = tonumber(x) or x end
    r[k] = #list == 1 and not v:find(',') and list[1] or list
  end
  return r
end
local function as_list(v) return type(v) == 'table' and v or { v } end
local function ours_cmd(n, extra)
  local pass = {}
  for k, v in pairs(args) do
    if k ~= 'part' and k ~= 'rounds' and k ~= 'ranks' and k ~= 'sizes' and k ~= 'iters' then
      pass[#pass + 1] = k .. '=' .. sh_quote(v)
    end
  end
  table.sort(pass)
  local launch = n > 1 and ('-n ' .. n .. (over and ' --oversubscribe ' or ' ')) or ''
  return string.format('%s %s%s %s %s', sh_quote(HOME .. '/bench'), launch, sh_quote(SCRIPT), extra,
    table.concat(pass, ' '))
end

local function commit()
  return first_line('git -C ' .. sh_quote(HOME) .. ' describe --always --dirty 2>/dev/null')
end
bk.header('Data parallelism over MPI: 1 rank vs ' .. ranks .. ' ranks, all-reduce bandwidth', {
  string.format('ranks: 1 and %d, one thread each (pn.set_num_threads(1): OpenMP and OpenBLAS); %d cores%s', ranks,
    cores, over and ' — MORE RANKS THAN CORES (--oversubscribe): they share cores, the figures mean little' or ''),
  'MPI: ' .. first_line(sh_quote(mpirun) .. ' --version 2>&1') .. ' (' .. mpirun .. ')',
  string.format('ours: penumbra %s (commit %s), %s; %d rounds, the jobs taking turns', pn.version, commit(),
    jit and jit.version or _VERSION, rounds),
})

local ok, err = xpcall(function()
  -- ---- (a) the NMT training step ------------------------------------------------------------
  if parts.nmt then
    -- three jobs a round: 1 rank; R ranks with the buckets sent after the backward; R ranks overlapped
    local JOBS = {
      { name = '1 rank', n = 1, env = '' },
      { name = ranks .. ' ranks, after', n = ranks, env = 'PENUMBRA_DDP_OVERLAP=0 ' },
      { name = ranks .. ' ranks, overlap', n = ranks, env = 'PENUMBRA_DDP_OVERLAP=1 ' },
    }
    local res = {}
    for j = 1, #JOBS do res[j] = {} end
    for round = 1, rounds do
      for j, J in ipairs(JOBS) do
        res[j][round] = job(J.env .. ours_cmd(J.n, 'worker=nmt'), 'NMT (' .. J.name .. ')')
      end
    end
    local one, many = res[1][1], res[3][1]
    print(string.format('NMT (preset %s): %s parameters (f32), vocabulary %s; %s bytes all-reduced per step on %d ' ..
      'ranks (one sync per step; buckets of ≤ 25 MB, the first ≤ 1 MB)', args.preset or 'small', one.params, one.vocab,
      many.bytes_per_sync, ranks))
    local l1 = one.check_loss
    for j = 2, #JOBS do
      local ln = res[j][1].check_loss
      local rel = math.abs(l1 - ln) / math.abs(l1)
      print(string.format('check step (dropout off, global batch 1): loss 1 rank %.8g, %s %.8g (%.2g relative)', l1,
        JOBS[j].name, ln, rel))
      if not (rel <= 1e-5) then error('dist.lua: the losses of 1 rank and ' .. JOBS[j].name .. ' differ beyond 1e-5: ' ..
        'not timing different computations', 0) end
    end
    print(string.format('buckets started while the backward ran: %s of %s (after), %s of %s (overlap)',
      res[2][1].early, res[2][1].buckets, res[3][1].early, res[3][1].buckets))
    local tokens = as_list(one.tokens)
    local tok_sum = 0
    for _, t in ipairs(tokens) do tok_sum = tok_sum + t end
    print(string.format('%d rounds × %d timed steps (after %d untimed), %.0f target tokens per step on average',
      rounds, #tokens, num('warmup', 3), tok_sum / #tokens))
    print(string.format('\n%-17s %4s %10s %10s %9s %12s %12s %12s', 'job', 'rank', 'ms/step', 'tokens/s', 'speed-up',
      'sync ms', 'sync/step', 'wait ms'))
    local base_ms
    for j, J in ipairs(JOBS) do
      local n = J.n
      for r = 0, n - 1 do
        local ms, sync, ar, rates = {}, {}, {}, {}
        local sum_ms, sum_sync = 0, 0
        for round = 1, rounds do
          local x = res[j][round]
          local m, sy, a = as_list(x['ms' .. r]), as_list(x['sync' .. r]), as_list(x['ar' .. r])
          local tot = 0
          for i = 1, #m do
            ms[#ms + 1], sync[#sync + 1], ar[#ar + 1] = m[i], sy[i], a[i]
            sum_ms, sum_sync, tot = sum_ms + m[i], sum_sync + sy[i], tot + m[i]
          end
          rates[#rates + 1] = tok_sum / (tot / 1e3)
        end
        local med = bk.median(ms)
        if n == 1 then base_ms = med end
        print(string.format('%-17s %4d %10.1f %10.0f %9.2f %12.2f %11.1f%% %12.2f', J.name,
          r, med, bk.median(rates), base_ms / med, bk.median(sync), 100 * sum_sync / sum_ms, bk.median(ar)))
      end
    end
    print('(medians over every timed step of every round; tokens/s: the global batches\' target tokens per second, ' ..
      'median of rounds; speed-up: 1 rank\'s ms/step over this one\'s; sync/step: Σ sync / Σ step — the time the ' ..
      'exchange of gradients keeps the step waiting — the header all-reduce (where a rank waits for the ' ..
      'slower one) and, after the backward, the buckets still to send and the wait for them; wait ms: that last ' ..
      'wait alone. "after": every bucket is copied and sent after the backward; "overlap": each starts inside the ' ..
      'backward once its gradients are final, so only what is left after the backward counts)\n')
  end

  -- ---- (b) all-reduce bandwidth ---------------------------------------------------------------
  if parts.allreduce then
    if not mpicc then error('dist.lua: the C reference needs mpicc: apt-get install -y libopenmpi-dev', 0) end
    local build = os.getenv('PENUMBRA_BUILD') or (HOME .. '/build')
    local bin = build .. '/perf_dist_allreduce'
    local src = HOME .. '/experiments/perf/dist_allreduce.c'
    if not os.execute(string.format('%s -O2 -o %s %s 2>%s', sh_quote(mpicc), sh_quote(bin), sh_quote(src),
      sh_quote(tmp))) then
      local f = io.open(tmp)
      error('dist.lua: mpicc failed on ' .. src .. ':\n' .. (f and f:read('*a') or ''), 0)
    end
    local sizes = {}
    for _, s in ipairs(bk.list(args.sizes, '4K,16K,64K,256K,1M,4M,16M,64M')) do
      local b = bytes_of(s)
      if b % 4 ~= 0 or b < 4 then error('dist.lua: sizes must be whole f32 counts (multiples of 4 bytes), got ' .. s, 0) end
      sizes[#sizes + 1] = b
    end
    local plan = {}
    for i, b in ipairs(sizes) do
      local it = num('iters') or math.max(20, math.min(1000, math.floor(2 ^ 28 / b)))
      plan[i] = { bytes = b, iters = it }
      plan[i].spec = b .. ':' .. it
    end
    local spec = {}
    for i, p in ipairs(plan) do spec[i] = p.spec end
    spec = table.concat(spec, ',')
    local env = 'OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 '
    local c_cmd = string.format('%s%s -np %d %s%s %s', env, sh_quote(mpirun), ranks, over and '--oversubscribe ' or '',
      sh_quote(bin), spec)
    local ours, two, inplace = {}, {}, {}
    for i = 1, #plan do ours[i], two[i], inplace[i] = {}, {}, {} end
    for _ = 1, rounds do
      -- the C loop prints its own lines (not `result …`): read them here
      local p = io.popen(c_cmd .. ' 2>' .. sh_quote(tmp))
      local out = p:read('*a')
      local okc = p:close()
      local k = 0
      for b, it, u2, ui in out:gmatch('size (%d+) (%d+) (%S+) (%S+)') do
        k = k + 1
        two[k][#two[k] + 1], inplace[k][#inplace[k] + 1] = tonumber(u2), tonumber(ui)
      end
      if not okc or k ~= #plan then
        local f = io.open(tmp)
        error('dist.lua: the C all-reduce job failed: ' .. c_cmd .. '\n' .. out .. (f and f:read('*a') or ''), 0)
      end
      local r = job(ours_cmd(ranks, 'worker=allreduce plan=' .. spec), 'all-reduce')
      local us = as_list(r.us)
      for i = 1, #plan do ours[i][#ours[i] + 1] = us[i] end
    end
    local f = 2 * (ranks - 1) / ranks
    print(string.format('all-reduce, f32 sum, %d ranks over loopback (shared memory); time per call = the slowest ' ..
      'rank\'s, median of %d rounds; bus bandwidth = %g · bytes / time', ranks, rounds, f))
    print(string.format('%-8s %6s %11s %11s %11s %10s %10s %8s %12s', 'size', 'iters', 'ours µs', 'C µs', 'C inpl µs',
      'ours GB/s', 'C GB/s', 'ours/C', 'ours/C inpl'))
    local worst = math.huge
    for i, p in ipairs(plan) do
      local uo, u2, ui = bk.median(ours[i]), bk.median(two[i]), bk.median(inplace[i])
      local gb = function(u) return f * p.bytes / (u * 1e-6) / 1e9 end
      worst = math.min(worst, u2 / uo)
      print(string.format('%-8s %6d %11.1f %11.1f %11.1f %10.2f %10.2f %8.2f %12.2f  %s', fmt_bytes(p.bytes), p.iters, uo,
        u2, ui, gb(uo), gb(u2), u2 / uo, ui / uo, u2 / uo >= 0.9 and '' or '< 0.9'))
    end
    print(string.format('(ours/C: osu-style C time over ours, two buffers — above 1 ours is faster; target ≥ 0.9, ' ..
      'worst here %.2f. C inpl: MPI_IN_PLACE, as ours calls it. Ours adds an all-gather of a 12-integer signature ' ..
      'per call: the agreement on shape, dtype and op)', worst))
  end
end, debug.traceback)
os.remove(tmp)
if not ok then error(err, 0) end
