-- penumbra.ddp — the runner's data parallelism (issue 18): `./bench -n N experiment.lua` trains
-- ONE model on N ranks and gives the losses one process gives (to rounding). The runner
-- (penumbra/experiment.lua) calls this module only when pn.dist.size() > 1; in one process
-- nothing here runs and nothing changes.
--
-- What happens across ranks, in order:
--  1. Start: a recipe says it can be split with `shard = '<unit>'` in its definition (PPI:
--     'graphs', NMT: 'sentences'): its training step takes its batches from a shard-aware
--     iterator (pn.data.ppi's d:batches('train', …), penumbra.data.translation.batches on a
--     'train' encoding). Without it, -n > 1 is the error "recipe X cannot be split across ranks:
--     …" before anything runs (never a silent single-rank run). With cfg.device = 'cuda' the
--     parameters, gradients and buckets live on each rank's GPU (core/cuda/device.cu: the rank's
--     local index) and the buckets go through NCCL (core/dist/nccl.cu; in the interpreter build
--     its subset over MPI); a build without NCCL refuses by name. The hosts are gathered for
--     the run file.
--  2. Setup runs on rank 0 first, then on the others (so caches it fills — the BPE model, a
--     converted or generated dataset — are written once and read by the rest). Then every
--     parameter of def.model(state) is broadcast from rank 0 (through the gradients' buckets,
--     below), so ranks start identical whatever their RNG did. Ranks 1 … N−1 then reseed the
--     tensor RNG (seed + 7919·rank): dropout masks differ between ranks, as they differ between
--     the rows of one batch. The global batches must not depend on that RNG: PPI and NMT
--     shuffle with penumbra.rng from the config seed; a check at every step (below) catches
--     ranks that disagree on them.
--  3. Sharding: while def.batch/def.train run, a shard-aware iterator cuts every GLOBAL batch
--     it makes (the same on every rank) into the ranks' shares — rank r takes items r+1,
--     r+1+N, … (strided, so token batches sorted by length get even shares) — and notes the
--     share's weight w = (its count) / (the global batch's count), counted in the unit the
--     recipe's loss averages over (PPI: nodes, NMT: target tokens). A global batch with fewer
--     items than ranks is a named error (a rank would have nothing to run).
--  4. Gradients: a recipe's loss on its share is a mean over the share, and the single-process
--     loss is the mean over the global batch = Σ_r w_r · (rank r's mean). So every rank scales
--     its gradients by its w and they are SUMMED (all-reduce 'sum'): exactly the gradient of the
--     global mean, so clipping and Adam see what one process sees. They travel in
--     core/dist/reducer.c's buckets: flat buffers of one dtype and at most 25 MB each
--     (M.BUCKET_BYTES, DDP's default; the first at most 1 MB, M.FIRST_BUCKET_BYTES, as DDP's),
--     filled in reverse parameter order — a fixed order, so the result is deterministic for a
--     given N, and bucketing does not change it (each element is the same sum whatever bucket
--     it is in). Overlap, as DDP's: a backward during a training step (pn.backward_hook) first
--     exchanges a header (7.), then runs with the reducer armed — each bucket is copied and its
--     all-reduce started as soon as the backward has finished its parameters' gradients, while
--     the backward goes on — and ends with finish (what is left, the wait, the sums written back
--     into .grad). PENUMBRA_DDP_OVERLAP=0 (M.overlap = false) sends every bucket after the
--     backward instead, at the first read of the gradients (optim.clip_grad_norm or a step,
--     through optim.grad_hook), as does a backward the hook did not see; the sums are the same
--     bit for bit. The weights are used in the order the batches were made: one backward and
--     one optimiser step per batch, as PPI and NMT do (gradient accumulation over several
--     batches or backward passes before a step is a named error: not split correctly yet). A
--     parameter without a gradient on a rank counts as zeros; one without a gradient on every
--     rank stays without.
--  5. Metrics: each numeric metric of a training step is combined as Σ_r m_r·n_r / Σ_r n_r, n_r
--     = the rank's count over the step — exact for losses averaged over that unit (PPI loss,
--     NMT loss); a value every rank has alike (lr, updates) stays as it is; a `*_per_s` rate is
--     summed; any other (PPI's train_f1) is that weighted mean, which is near but not equal to
--     the single-process value. Evaluation, checkpoints, on_eval and finish run on rank 0 only
--     (the others wait in the next collective); rank 0's early-stopping decision reaches every
--     rank at the end of the step.
--  6. Files and output: rank 0 alone writes the run file (with attributes ranks = N, hosts =
--     each rank's host, comma-separated, and shard) and checkpoints; the other ranks get a run
--     object that writes nothing and print nothing (io.stdout, io.stderr and print are silenced
--     while the runner runs there); errors still reach the terminal (cli.lua's abort).
--  7. Failure: every collective this module makes starts with a small header all_reduce that
--     carries "a rank failed", "a rank was interrupted" and "rank 0 says stop" (the buckets of a
--     backward follow its header; a rank whose backward fails still sends them all — finish runs
--     regardless — so that every rank's next collective is a header again). A rank whose
--     runner catches an error joins the next header with its flag and sends its message; the
--     others raise "rank R of N failed: message" there; rank 0 writes status failed (or
--     interrupted) and the message and closes its run file, and only then (a barrier) do the ranks
--     go on to cli.lua's MPI_Abort. A rank that cannot raise — killed (SIGKILL, a crash in C) or
--     hung — is caught by the waits themselves (core/dist/mpi.c: every collective is non-blocking
--     underneath, polled): a wait gives up when a rank on this machine is gone (its pid vanished:
--     seen within 10 ms, before mpirun's SIGTERM, which comes 1 s after it saw the death), when a
--     stop signal arrived and the collective did not complete 0.25 s later, after the timeout
--     (pn.dist.timeout(): PENUMBRA_DIST_TIMEOUT, default 300 s; 0 = none), or on an MPI error. The
--     collective then raises here (c.broken: nothing more is exchanged), and rank 0 records:
--       - a rank found gone: status failed, "rank 0 of N: dist.<op>: rank R of N (pid P, on this
--         machine) is gone: …";
--       - the timeout or an MPI error: status failed, "rank 0 of N: dist.<op>: no reply from the
--         other ranks in S s …" (or MPI's message);
--       - a stop signal with no rank found gone: status interrupted, "interrupted (SIGTERM) while
--         rank 0 of N waited in dist.<op> for the other ranks — the job was stopped …". mpirun
--         sends the same SIGCONT, 1 s, SIGTERM, 1 s, SIGKILL to every rank on Ctrl-C, on its own
--         SIGTERM and when a rank dies, so the signal alone cannot tell them apart: a dead rank on
--         this machine is seen by its pid first (failed); one on another machine cannot be, and
--         its death reads as interrupted on rank 0 (mpirun's output names the dead rank).
--     Ranks other than 0 wait for rank 0's setup and its evaluations (the header after them) with
--     at least M.LEAD_TIMEOUT (an hour), since those can outlast the default timeout. Bounds: rank 0
--     must close its file before mpirun's SIGKILL, 1 s after its SIGTERM (2 s after mpirun saw a
--     rank die) — ample when it waits in a collective (measured: 2 ms from the gone rank seen to
--     the file closed), not when it is in the middle of a step or an evaluation longer than that
--     (OMPI_MCA_odls_base_sigkill_timeout=S in the environment of ./bench -n sets the delay; mpirun
--     reads it). A rank 0 killed outright is seen by rank 1 (its pid, when on the same machine),
--     which closes rank 0's run file for it: status failed, "rank 0 of N (pid P) ended without
--     closing its run file …" (M.close_for_lead); one on another machine, or one hung outside
--     the collectives, leaves its file 'running' (its pid attribute lets `./bench runs` see the
--     writer gone). A
--     checkpoint is written to a temporary file and renamed (experiment.lua), so a rank 0 killed
--     while writing one leaves the previous checkpoint whole. After the training loop nothing is
--     exchanged: only rank 0 works there (test evaluation, finish) and records its own failures.
--  8. Timing (for experiments/perf/dist.lua): M.timing counts, per process, the gradient
--     exchanges (syncs), the seconds they kept the step waiting (sync_s: the header, and after
--     the backward the buckets still to copy and send, the wait, the copies back — not the
--     backward itself), the seconds of that wait alone (all_reduce_s), the bytes all-reduced,
--     the buckets sent and how many of them started while a backward ran (early). Always on: a
--     few clock reads per exchange; a reader takes differences.
local pn = require 'penumbra.tensor'
local dist = require 'penumbra.dist'
local optim = require 'penumbra.optim'
local B = require 'penumbra_ffi'
local ffi = require 'ffi'
local now = require('penumbra.stats').now
local C = B.C
pcall(ffi.cdef, 'int getpid(void);')

local M = {}

M.MSG_BYTES = 2048   -- a failing rank's message, as sent to the others (longer ones are cut)
M.SEED_STRIDE = 7919 -- rank r > 0 reseeds the tensor RNG with seed + SEED_STRIDE · r after setup
M.BUCKET_BYTES = 25 * 2 ^ 20 -- the gradients go to all_reduce in buckets of at most this (DDP's 25 MB)
M.FIRST_BUCKET_BYTES = 2 ^ 20 -- … the first of at most this (DDP's 1 MB): it can start while the backward runs
M.PATH_BYTES = 4096 -- rank 0's pid and run file's path, as rank 1 gets them (a longer path: not closed by rank 1)
M.LEAD_TIMEOUT = 3600 -- s: ranks > 0 wait at least this for rank 0's setup and evaluations (see 7.)
M.timing = { syncs = 0, sync_s = 0, all_reduce_s = 0, bytes = 0, buckets = 0, early = 0 } -- see 8. (never reset here)
-- the buckets start while the backward runs (4.); PENUMBRA_DDP_OVERLAP=0: all after it
M.overlap = os.getenv('PENUMBRA_DDP_OVERLAP') ~= '0'

local ctx = nil -- the run being trained across ranks (one at a time), or nil

local function cannot_split(name, why)
  return string.format('recipe %s cannot be split across ranks: %s', name, why)
end

local function addr(t) return tonumber(ffi.cast('intptr_t', ffi.cast('void *', t))) end

-- ---- collectives that can give up ---------------------------------------------------------
-- the error of a collective that failed (e), as rank 0's run file records it (see 7.): after a
-- stop signal it starts "interrupted (SIG…)", so the runner records the status interrupted; any
-- other failure is prefixed with this rank. signal_name: number → 'SIGTERM' (the runner's)
local function describe(rank, size, e, signal_name)
  e = B.unplaced(e) -- an op's error carries the script's line: not for this message
  if dist.failure() == 'signal' then
    -- "dist.all_reduce (24 bytes): interrupted (SIGTERM) while waiting for the other ranks — why"
    local op, sig, why = e:match('^(.-): interrupted %((.-)%) while waiting for the other ranks(.*)$')
    if op then
      return string.format('interrupted (%s) while rank %d of %d waited in %s for the other ranks%s', sig, rank, size,
        op, why)
    end
    return string.format('interrupted (%s) — rank %d of %d: %s', signal_name(tonumber(C.pn_interrupted())), rank, size, e)
  end
  return string.format('rank %d of %d: %s', rank, size, e)
end

-- fn(…) (a pn.dist collective); if it fails, nothing more is exchanged in this run (c.broken)
local function coll(c, fn, ...)
  local ok, r = pcall(fn, ...)
  if not ok then
    c.broken = true
    error(describe(c.rank, c.size, r, c.signal_name), 0)
  end
  return r
end

-- fn() on a rank other than 0 that waits for rank 0's own work: the timeout at least M.LEAD_TIMEOUT
local function patient(c, fn)
  local t = dist.timeout()
  if c.rank == 0 or t == 0 or t >= M.LEAD_TIMEOUT then return fn() end
  dist.set_timeout(M.LEAD_TIMEOUT)
  local ok, r = pcall(fn)
  dist.set_timeout(t)
  if not ok then error(r, 0) end
  return r
end

-- ---- the header: every collective of this module starts with it ------------------------------
-- h = {failing rank key, interrupt signal, stop} reduced by max; a failing rank r sends
-- size − r, so the lowest failing rank wins and sends its message (a u8 broadcast).
local function header(c, stop)
  local h = pn.tensor({ c.failing and (c.size - c.rank) or 0, C.pn_interrupted(), stop and 1 or 0 }, { dtype = 'f64' })
  coll(c, dist.all_reduce, h, 'max')
  local v = h:totable()
  if v[1] > 0 then
    local from = c.size - v[1]
    local buf = pn.zeros({ M.MSG_BYTES }, { dtype = 'u8' })
    if c.rank == from then
      local msg = c.failing:sub(1, M.MSG_BYTES - 1)
      ffi.copy(buf:data_ptr(), msg, #msg)
    end
    coll(c, dist.broadcast, buf, from)
    c.agreed = true
    if c.failing then return false end -- a failing rank's own call: it raises its own error
    local text = ffi.string(buf:data_ptr())
    error(string.format('rank %d of %d failed: %s', from, c.size, text), 0)
  end
  if v[2] > 0 then
    c.agreed = true
    error('interrupted (' .. c.signal_name(v[2]) .. ' on a rank)', 0)
  end
  return v[3] > 0
end

-- ---- gradients ---------------------------------------------------------------------------
-- The buckets are core/dist/reducer.c's (penumbra.h "the gradients' buckets"): the layout, the
-- copies, the all-reduces and the writing back are there; here is when they run.

local function take_weight(c)
  local w = table.remove(c.weights, 1)
  if not w then
    error(cannot_split(c.name, 'its optimiser read gradients that no sharded batch produced (a training batch ' ..
      'must come from a shard-aware iterator: pn.data.ppi d:batches(\'train\', …) or translation.batches)'), 0)
  end
  return w
end

-- M.timing after one exchange of gradients that kept this rank `seconds` (see 8.)
local function timed(c, seconds, before)
  local T, after = M.timing, ffi.new('double[4]')
  C.pn_reducer_stats(c.reducer, after)
  T.syncs, T.sync_s = T.syncs + 1, T.sync_s + seconds
  T.all_reduce_s = T.all_reduce_s + (after[2] - before[2])
  T.bytes = T.bytes + (after[3] - before[3])
  T.early = T.early + (after[1] - before[1])
  T.buckets = T.buckets + (after[0] - before[0])
end

-- Σ_r w_r · grad_r into every rank's gradients after the backward, all buckets at once (the
-- optimiser read gradients the overlapped backward did not send)
local function sync_grads(c)
  local w = take_weight(c)
  local t0, before = now(), ffi.new('double[4]')
  C.pn_reducer_stats(c.reducer, before)
  header(c)
  coll(c, function() B.check(C.pn_reducer_sync(c.reducer, w)) end)
  timed(c, now() - t0, before)
end

-- pn.backward during a training step (tensor.lua's backward_hook): a header, then the backward
-- with the reducer armed (buckets start as they fill), then finish (the rest, the wait, the
-- sums written back). finish runs even when the backward failed, so that this rank enters the
-- same all-reduces as the others before it reports the failure at the next header (see 7.).
local function backward_hook(run)
  local c = ctx
  if not (c and c.training and M.overlap) then return run() end
  if c.reduced then
    error(cannot_split(c.name, 'its training step ran a second backward before the optimiser read the gradients ' ..
      'of the first (accumulating gradients over several backward passes is not split correctly yet)'), 0)
  end
  local w = take_weight(c)
  local t0, before = now(), ffi.new('double[4]')
  C.pn_reducer_stats(c.reducer, before)
  header(c)
  B.check(C.pn_reducer_arm(c.reducer, w))
  local t1 = now()
  local ok, e = pcall(run)
  local t2 = now()
  coll(c, function() B.check(C.pn_reducer_finish(c.reducer)) end)
  timed(c, (t1 - t0) + (now() - t2), before) -- the header and finish: the backward itself is compute
  c.reduced = true
  if not ok then error(e, 0) end
end

local function grad_hook(event, params)
  local c = ctx
  if not c then return end
  if event == 'stepped' then c.synced = false; return end
  for i, p in ipairs(params) do
    if not c.param_set[addr(p)] then
      error(cannot_split(c.name, 'its optimiser holds parameter ' .. i .. ' (' .. table.concat(p:shape(), 'x') ..
        '), which is not among def.model(state):parameters() — only those are kept alike across ranks'), 0)
    end
  end
  if not c.synced then
    if c.reduced then c.reduced = false else sync_grads(c) end
    c.synced = true
    c.syncs = c.syncs + 1
  end
end

-- ---- the data iterators' side ------------------------------------------------------------
-- For a shard-aware iterator: nil when batches are not split (one process, or outside a
-- training step); else share(items, count, what) → this rank's items of the global batch
-- `items` (strided), noting the share's weight; count(item) is its size in the loss's unit.
function M.sharer()
  local c = ctx
  if not c or not c.training then return nil end
  return function(items, count, what)
    local n = #items
    c.batches = c.batches + 1
    if n < c.size then
      error(cannot_split(c.name, string.format('a global batch of this step (batch %d) holds %d %s, fewer than the %d ' ..
        'ranks, so a rank would have nothing to run; make every batch hold at least %d %s (a larger batch, or a ' ..
        'training set whose last batch is not that small)', c.batches, n, what, c.size, c.size, what)), 0)
    end
    local mine, here, total = {}, 0, 0
    for i = 1, n do
      local k = count(items[i])
      total = total + k
      if (i - 1) % c.size == c.rank then
        mine[#mine + 1] = items[i]
        here = here + k
      end
    end
    c.weights[#c.weights + 1] = total > 0 and here / total or 0
    c.count = c.count + here
    -- what the global batches were (compared across ranks at the end of the step)
    c.signature = (c.signature * 31 + total * 7 + n) % 1000000007
    return mine
  end
end

-- ---- the runner's side -------------------------------------------------------------------
-- Starts a run across ranks, or returns nil in one process. Raises the named error when the
-- recipe cannot be split. o = {signal_name = fn}.
function M.start(def, cfg, o)
  if not dist.is_distributed() then return nil end
  if ctx then error('ddp: a run across ranks is already going on (one at a time)', 0) end
  local size, rank = dist.size(), dist.rank()
  if def.shard == nil then
    error(cannot_split(def.name, 'its definition has no shard = \'<unit>\' (its training step must take its batches ' ..
      'from a shard-aware iterator — pn.data.ppi d:batches(\'train\', …), translation.batches — and say so); run it ' ..
      'without -n, or with -n 1'), 0)
  end
  if type(def.shard) ~= 'string' then
    error("experiment '" .. def.name .. "': shard must be a string naming what a batch is split in ('graphs', " ..
      "'sentences'), got " .. type(def.shard), 0)
  end
  if cfg.device == 'cuda' and not dist.nccl_built() then
    error(cannot_split(def.name, 'device=cuda needs NCCL, and this libpenumbra was built without it (the CUDA ' ..
      'toolkit\'s libnccl); run on the CPU (device=cpu) or without -n'), 0)
  end
  -- every rank's host, in rank order
  local ph = io.popen('hostname 2>/dev/null')
  local host = ((ph and ph:read('*l')) or '?'):sub(1, 255)
  if ph then ph:close() end
  local hb = pn.zeros({ 256 }, { dtype = 'u8' })
  ffi.copy(hb:data_ptr(), host, #host)
  local okg, all = pcall(dist.all_gather, hb)
  if not okg then error(describe(rank, size, all, o and o.signal_name or tostring), 0) end
  local hosts = {}
  for r = 1, size do hosts[r] = ffi.string(all:select(1, r):contiguous():data_ptr()) end
  ctx = { rank = rank, size = size, name = def.name, shard = def.shard, hosts = table.concat(hosts, ','),
          signal_name = o and o.signal_name or tostring, weights = {}, count = 0, batches = 0, signature = 0,
          syncs = 0, synced = false, training = false, exchanging = true }
  return M
end

function M.context() return ctx end
-- each rank's tensor-RNG position {seed, offset} at the end of the last step, by rank + 1
function M.rng_states()
  local t = {}
  for r, v in ipairs(ctx and ctx.rng_states or {}) do t[r] = v end
  return t
end
-- how many buckets the gradients travel in (0 outside a run across ranks)
function M.buckets() return ctx and ctx.reducer and C.pn_reducer_buckets(ctx.reducer) or 0 end

-- setup on rank 0 first, then on the others; then the parameters from rank 0
function M.setup(def, cfg, run)
  local c = ctx
  -- rank 0's pid and run file, so that rank 1 can close that file if rank 0 dies outright (7.)
  header(c)
  local buf = pn.zeros({ M.PATH_BYTES }, { dtype = 'u8' })
  if c.rank == 0 then
    local text = tostring(ffi.C.getpid()) .. '\n' .. tostring(run.path)
    if #text < M.PATH_BYTES then ffi.copy(buf:data_ptr(), text, #text) end
  end
  coll(c, dist.broadcast, buf, 0)
  c.lead_pid, c.lead_path = ffi.string(buf:data_ptr()):match('^(%d+)\n(.+)$')
  local state
  if c.rank == 0 then state = def.setup(cfg, run) end
  patient(c, function() header(c) end)
  if c.rank ~= 0 then state = def.setup(cfg, run) end
  local model = def.model and def.model(state)
  if not model then
    error(cannot_split(c.name, 'it has no def.model(state), so there are no parameters to keep alike'), 0)
  end
  c.params = model:parameters()
  c.param_set = {}
  for i, p in ipairs(c.params) do
    if p:device() ~= c.params[1]:device() then
      error(cannot_split(c.name, string.format('its parameters are on several devices (parameter 1 on %s, parameter ' ..
        '%d on %s); the gradients go to the other ranks in buffers on one device', c.params[1]:device(), i,
        p:device())), 0)
    end
    c.param_set[addr(p)] = true
  end
  local arr = ffi.new('pn_tensor *[?]', #c.params)
  for i, p in ipairs(c.params) do arr[i - 1] = p end
  local r = C.pn_reducer_new(arr, #c.params, math.min(M.FIRST_BUCKET_BYTES, M.BUCKET_BYTES), M.BUCKET_BYTES)
  if r == nil then
    c.broken = true -- it agreed on the layout with the others: a failure there is every rank's
    error(describe(c.rank, c.size, ffi.string(C.pn_last_error()), c.signal_name), 0)
  end
  c.reducer = ffi.gc(r, C.pn_reducer_free)
  -- parameters from rank 0 to every rank, in place (through the buckets)
  header(c)
  coll(c, function() B.check(C.pn_reducer_broadcast(c.reducer, 0)) end)
  if c.rank > 0 then pn.manual_seed((cfg.seed or 0) + M.SEED_STRIDE * c.rank) end
  optim.grad_hook = grad_hook
  pn.backward_hook = backward_hook
  return state, model
end

-- around def.batch and def.train: shares are taken between begin_step and end_step
function M.begin_step()
  local c = ctx
  c.training, c.count, c.batches, c.signature, c.syncs = true, 0, 0, 0, 0
  c.weights = {}
  c.synced, c.reduced = false, false
end

-- after def.train: checks, then the step's metrics combined over the ranks (in place)
function M.end_step(m, step)
  local c = ctx
  c.training = false
  if #c.weights > 0 then
    error(cannot_split(c.name, string.format('its training step made %d sharded batches but stepped its optimiser %d ' ..
      'times (one step per batch is what is split correctly; accumulating gradients over batches is not yet)',
      c.batches, c.syncs)), 0)
  end
  if c.batches == 0 then
    error(cannot_split(c.name, 'its training step took no batch from a shard-aware iterator (pn.data.ppi ' ..
      'd:batches(\'train\', …), translation.batches on a train encoding), so every rank would train on everything'), 0)
  end
  header(c)
  local keys = {}
  for k, v in pairs(m) do if type(v) == 'number' then keys[#keys + 1] = k end end
  table.sort(keys)
  local K = #keys
  local s, x = {}, {}
  for i, k in ipairs(keys) do
    s[i] = m[k] * c.count
    s[K + i] = m[k]
    x[i], x[K + i] = m[k], -m[k]
  end
  s[2 * K + 1] = c.count
  x[2 * K + 1], x[2 * K + 2] = c.signature, -c.signature
  local st = coll(c, dist.all_reduce, pn.tensor(s, { dtype = 'f64' }), 'sum'):totable()
  local xt = coll(c, dist.all_reduce, pn.tensor(x, { dtype = 'f64' }), 'max'):totable()
  if xt[2 * K + 1] ~= -xt[2 * K + 2] then
    error(string.format('ranks disagree on the global batches of %s %d: their composition must not depend on the ' ..
      'rank (draw it from penumbra.rng with the config seed, not from the tensor RNG, which differs by rank)',
      'step', step), 0)
  end
  -- every rank's tensor-RNG position after its step, for rank 0's resume state (experiment.lua)
  local mine = table.concat(pn.rng_state(), ' ')
  local rb = pn.zeros({ 48 }, { dtype = 'u8' })
  ffi.copy(rb:data_ptr(), mine, #mine)
  local all = coll(c, dist.all_gather, rb)
  c.rng_states = {}
  for r = 1, c.size do
    local a, b = ffi.string(all:select(1, r):contiguous():data_ptr()):match('^(%d+) (%d+)')
    c.rng_states[r] = { a, b }
  end
  local n = st[2 * K + 1]
  for i, k in ipairs(keys) do
    local hi, lo = xt[i], -xt[K + i]
    if hi == lo then
      -- alike on every rank: kept as it is
    elseif k:match('_per_s$') then
      m[k] = st[K + i]
    elseif n > 0 then
      m[k] = st[i] / n
    else
      m[k] = st[K + i] / c.size
    end
  end
  return m
end

-- at the end of every step, after rank 0's evaluation: rank 0's stop decision to every rank
function M.agree_stop(stop)
  local c = ctx
  return patient(c, function() return header(c, stop) end)
end

-- after the training loop: no more collectives, so a failure is no longer exchanged
function M.finish_training()
  ctx.exchanging = false
end

-- a rank's runner caught msg: tell the others (at their next header) unless they told us
function M.fail(msg)
  local c = ctx
  if not c or c.broken or c.agreed or not c.exchanging then return end
  c.failing = tostring(msg)
  pcall(header, c)
end

-- Rank 0 gone outright (SIGKILL, a crash in C: found by its pid, so on this machine) leaves its
-- run file open, status running. Rank 1 closes it for it: status failed, the error naming rank
-- 0's end and what rank 1 saw (msg) — only if the file still says running and names rank 0's pid
-- (best effort: a file rank 0 left mid-write may not open; it then stays as at its last flush,
-- which `./bench runs` shows as dead).
function M.close_for_lead(msg)
  local c = ctx
  if not c or c.rank ~= 1 or not c.lead_path then return end
  local kind, lost = dist.failure()
  if kind ~= 'rank gone' or lost ~= 0 then return end
  pcall(function()
    local f = require('penumbra.io').open(c.lead_path, 'a')
    pcall(function()
      if f:attr('/', 'status') ~= 'running' or tonumber(f:attr('/', 'pid')) ~= tonumber(c.lead_pid) then return end
      f:set_attr('/', 'status', 'failed')
      f:set_attr('/', 'error', string.format('rank 0 of %d (pid %s) ended without closing its run file (killed ' ..
        'outright, or a crash in C); rank 1 closed it. Rank 1 saw: %s', c.size, c.lead_pid, tostring(msg)))
      f:set_attr('/', 'end_time', os.date('!%Y-%m-%dT%H:%M:%SZ'))
      f:flush()
    end)
    f:close()
  end)
end

-- after rank 0 closed its run file (the others at once): wait for each other, so that no
-- rank's abort ends rank 0 before its run file is closed
-- M.failed_together: they did (so cli.lua lets every rank print its message before any aborts)
function M.closed()
  local c = ctx
  if c and c.agreed and not c.broken then M.failed_together = pcall(dist.barrier) end
end

function M.stop()
  if optim.grad_hook == grad_hook then optim.grad_hook = nil end
  if pn.backward_hook == backward_hook then pn.backward_hook = nil end
  ctx = nil
end

-- the run object ranks other than 0 get: it takes every write and keeps nothing
local NullRun = {}
NullRun.__index = NullRun
for _, k in ipairs({ 'log', 'flush', 'checkpoint', 'set', 'summary', 'write', 'write_text' }) do
  NullRun[k] = function() end
end
function M.null_run(cfg, variant) return setmetatable({ metrics = {}, cfg = cfg, variant = variant, rank = ctx.rank }, NullRun) end

-- ranks other than 0 print nothing while the runner runs (errors still end the job loudly)
function M.silence()
  local saved = { stdout = io.stdout, stderr = io.stderr, print = _G.print }
  local null = io.open('/dev/null', 'w')
  if null then io.stdout, io.stderr = null, null end
  _G.print = function() end
  return function()
    io.stdout, io.stderr, _G.print = saved.stdout, saved.stderr, saved.print
    if null then null:close() end
  end
end

return M
