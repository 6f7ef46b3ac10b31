-- penumbra.experiment — the runner every experiment script goes through.
--
--   return pn.experiment{
--     name = 'cora_umbral',
--     recipe = 'penumbra.recipes.gat_planetoid',          -- optional: the module that rebuilds the
--                                                          -- model (stored; the REPL loads it)
--     config = { epochs = 1000, patience = 100, lr = 0.005, seed = 0, ... },  -- defaults
--     limits = { lr = { 'number', above = 0 }, heads = { 'integer', min = 1 } },  -- optional: the
--                                                          -- type and range of keys (penumbra.options
--                                                          -- rules); epochs, steps, eval_every,
--                                                          -- patience, seed, threads, flush_denormal
--                                                          -- (true: subnormals flushed for the run,
--                                                          -- pn.set_flush_denormal) have the runner's
--                                                          -- (steps = N instead of epochs: step-
--                                                          -- based; eval_every = k; both optional)
--     setup = function(cfg, run) return state end,        -- build data, model, optimiser
--     batch = function(state, cfg, step) return b end,     -- optional: online data, a fresh batch
--                                                          -- or graph per step (train's 4th arg)
--     train = function(state, cfg, step, b) return { loss = …, train_acc = … } end,
--     evaluate = function(state, cfg, split, step) return { loss = …, acc = … } end,
--                                                          -- 'val' every eval_every steps and at
--                                                          -- the last; 'test' and 'val' at the end
--     model = function(state) return state.model end,     -- what gets checkpointed
--     monitor = 'val_acc', mode = 'max',                  -- checkpoint + early stopping metric
--     also = { val_loss = 'min' },                         -- optional: improving any of these
--                                                          -- also resets patience (GAT's rule);
--                                                          -- a tie on monitor with a better
--                                                          -- first `also` metric checkpoints
--     track = { val_bleu = 'max' },                        -- optional: their best (and its step)
--                                                          -- join the summary
--     on_eval = function(state, cfg, run, step, m) end,    -- optional: artefacts per evaluation
--                                                          -- (run:write, run:write_text)
--     finish = function(state, cfg, run) end,              -- optional: log radii, attention maps;
--                                                          -- a returned {name = number} joins the
--                                                          -- summary (and the returned result)
--     optimizer = function(state) return state.opt end,  -- optional: makes the run resumable
--     save_state = function(state, cfg) return t end,      -- optional: the recipe's own state a
--     load_state = function(state, t, cfg) end,            -- resumed run needs (numbers, strings,
--                                                          -- tensors, tables of them), and back
--     shard = 'graphs',                                    -- optional: the training batches come
--                                                          -- from shard-aware iterators, so
--                                                          -- `./bench -n N` can split them
--                                                          -- (penumbra/ddp.lua; without it -n > 1
--                                                          -- is an error)
--   }
--
-- Unknown definition keys are errors. Patience counts evaluations without progress. Overrides
-- come from the command line (`./bench script.lua lr=0.01 seed=3`) through the global table
-- `args`, are type-checked against the defaults, and an unknown key is an error listing the
-- valid ones. The run file (DESIGN §5) runs/<name>/<UTC stamp>-s<seed>.h5 gets the config
-- (JSON), recipe, unit (epoch | step), git commit, host, times and status (running → finished |
-- failed | interrupted), /metrics/<name> appended every step (and its evaluations) and
-- flushed, /params (the best checkpoint, written under a temporary name and then renamed),
-- /summary attributes.
--
-- Resume (penumbra/resume.lua): a definition with optimizer (and, when the recipe keeps more
-- than the model and the optimiser, save_state/load_state) saves a resume state <run>.resume at
-- every evaluation and when it stops at a step's end (interrupt, failure); `resume=<run file>`
-- on the command line goes on from there in the same run file, with the run's stored config, and
-- gives the metrics the uninterrupted run gives (batches come from (seed, step); the RNG, the
-- optimiser and the judge are restored). The state is removed when the run finishes.
local pn = require 'penumbra.tensor'
local pio = require 'penumbra.io'
local resume = require 'penumbra.resume'
local ffi = require 'ffi'

pcall(ffi.cdef, 'int isatty(int fd);')

local M = {}

-- ---- config ---------------------------------------------------------------------------------
local json = require 'penumbra.json'
M.json = json.encode -- kept: scripts and specs call pn.experiment.json

-- The runner's own keys, when a config has them: their type and range (a recipe declares its
-- other keys' in def.limits, in the same rule format as penumbra.options)
local options = require 'penumbra.options'
M.RUNNER_LIMITS = {
  epochs = { 'integer', min = 1 }, steps = { 'integer', min = 1 }, eval_every = { 'integer', min = 1 },
  patience = { 'integer', min = 1 }, seed = { 'integer', min = 0, max = 2 ^ 53 }, threads = { 'integer', min = 0 },
  device = { 'string', one_of = { 'cpu', 'cuda' } }, flush_denormal = 'boolean',
}

-- cfg = defaults overridden by overrides (strings from the command line or typed values); then
-- every key with a limit (the runner's, and limits = {key = rule}) is checked, defaults too
function M.config(defaults, overrides, limits)
  local cfg = {}
  for k, v in pairs(defaults) do cfg[k] = v end
  for k, v in pairs(overrides or {}) do
    local d = defaults[k]
    if d == nil then
      local keys = {}
      for kk in pairs(defaults) do keys[#keys + 1] = kk end
      table.sort(keys)
      error("experiment: unknown config key '" .. k .. "'; valid keys: " .. table.concat(keys, ', '), 0)
    end
    local tv = type(v)
    if type(d) == 'number' then
      local n = tonumber(v)
      if n == nil then error("experiment: " .. k .. " must be a number, got '" .. tostring(v) .. "'", 0) end
      -- tonumber takes 'nan' and 'inf': no config number means either (keys without a limit too)
      if n ~= n or n == math.huge or n == -math.huge then
        error("experiment: " .. k .. " must be a finite number, got '" .. tostring(v) .. "'", 0)
      end
      if d % 1 == 0 and n % 1 ~= 0 and k ~= 'lr' and tv == 'string' and not tostring(v):find('[%.eE]') then
        error("experiment: " .. k .. " must be an integer, got '" .. tostring(v) .. "'", 0)
      end
      cfg[k] = n
    elseif type(d) == 'boolean' then
      if v == true or v == 'true' or v == '1' then cfg[k] = true
      elseif v == false or v == 'false' or v == '0' then cfg[k] = false
      else error("experiment: " .. k .. " must be true or false, got '" .. tostring(v) .. "'", 0) end
    else
      if tv ~= 'string' then error("experiment: " .. k .. " must be a string, got " .. tv, 0) end
      cfg[k] = v
    end
  end
  for k, rule in pairs(limits or {}) do
    if defaults[k] == nil then error("experiment: limits name '" .. tostring(k) .. "', which is not a config key", 0) end
  end
  local keys = {}
  for k in pairs(cfg) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local rule = (limits or {})[k] or M.RUNNER_LIMITS[k]
    if rule then
      local ok, e = pcall(options.check_value, 'experiment', k, cfg[k], rule)
      if not ok then error((tostring(e):gsub('^[^:]*:%d+: ', '')), 0) end
    end
  end
  return cfg
end

-- M.on_open(path), when set (compare.sweep): called with the run file's path as soon as rank 0 has
-- opened it, so that a driver killed with its run can name that run (and resume it) later
M.on_open = nil

-- Config keys a resumed run may set anew (resume=…: the rest is the run's stored config)
M.RESUME_MAY_DIFFER = { threads = true, quiet = true }
-- The resume state is saved at an evaluation when this many seconds passed since it last was
-- (PENUMBRA_RESUME_EVERY; 0: at every evaluation), and always when a run stops at a step's end:
-- a crash loses at most this much work, and runs of many fast evaluations (GAT: one per epoch)
-- do not spend their time writing it.
M.RESUME_EVERY_S = tonumber(os.getenv('PENUMBRA_RESUME_EVERY') or '') or 60

-- Config keys that do not change what a run computes: a run's name leaves them out.
M.UNNAMED_KEYS = { seed = true, quiet = true, threads = true }

-- What a run ran, by name: the experiment, then every config value that differs from the
-- experiment's defaults ('cora_umbral' as written; 'cora_umbral epochs=20 score=gat' with
-- overrides). Runs of one variant differ only in the seed; compare and plot group by it.
function M.variant_name(name, defaults, cfg)
  local parts = {}
  local keys = {}
  for k in pairs(cfg) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = cfg[k]
    if not M.UNNAMED_KEYS[k] and v ~= (defaults or {})[k] then
      local text = tostring(v)
      if type(v) == 'number' then -- the shortest form that reads back as the same number
        text = string.format('%.15g', v)
        if tonumber(text) ~= v then text = string.format('%.17g', v) end
      end
      parts[#parts + 1] = k .. '=' .. text
    end
  end
  return #parts == 0 and name or (name .. ' ' .. table.concat(parts, ' '))
end

-- the folder of a variant's runs: runs/<name>, or runs/<name>+k=v+… (path-safe characters)
function M.variant_dir(variant)
  return (variant:gsub(' ', '+'):gsub('[^%w_%.%-+=,]', '_'))
end

-- ---- run metadata ---------------------------------------------------------------------------
local function shell(cmd)
  local p = io.popen(cmd .. ' 2>/dev/null')
  if not p then return '' end
  local s = p:read('*a') or ''
  p:close()
  return (s:gsub('%s+$', ''))
end

local function utc_stamp() return os.date('!%Y%m%dT%H%M%SZ') end
local function utc_iso() return os.date('!%Y-%m-%dT%H:%M:%SZ') end

local function mkdir_p(dir)
  local ok = os.execute('mkdir -p "' .. dir .. '" 2>/dev/null')
  return ok == 0 or ok == true
end

local function writable_dir(dir)
  if not mkdir_p(dir) then return false end
  local probe = dir .. '/.penumbra-write-test'
  local f = io.open(probe, 'w')
  if not f then return false end
  f:close()
  os.remove(probe)
  return true
end

-- ---- progress -------------------------------------------------------------------------------
local function is_tty() return ffi.C.isatty(2) == 1 end

local function fmt_time(s)
  if s < 60 then return string.format('%.1fs', s) end
  if s < 3600 then return string.format('%dm%02ds', math.floor(s / 60), math.floor(s % 60)) end
  return string.format('%dh%02dm', math.floor(s / 3600), math.floor((s % 3600) / 60))
end

local now = require('penumbra.stats').now
M.now = now

-- A write that failed: the message says which file and, when the disk is full, which disk.
local function write_failed(what, path, e)
  local msg = tostring(e):gsub('^[^:]*:%d+: ', '')
  if msg:find('No space left', 1, true) or msg:find('errno = 28', 1, true) then
    local dir = path:match('^(.*)/[^/]*$') or '.'
    local df = shell('df -P "' .. dir .. '" | tail -1')
    local mount = df:match('(%S+)$') or dir
    return string.format('the disk holding %s (%s) is full: cannot write the %s %s', dir, mount, what, path)
  end
  return 'cannot write the ' .. what .. ' ' .. path .. ': ' .. msg
end

-- ---- disk space ------------------------------------------------------------------------------
-- HDF5 cannot promise a readable file when a write fails half-way (its metadata is then partly
-- written), so a run never lets its run file reach a full disk: before each append it checks
-- that the disk keeps a reserve (2 × the run file, at least 256 KiB) for the final status and
-- summary, and before each checkpoint that the checkpoint fits as well. Checkpoints go to their
-- own file through a temporary name, so a failed one frees its space and changes nothing.
pcall(ffi.cdef, [[
  struct pn_statvfs { unsigned long f_bsize, f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_favail,
                      f_fsid, f_flag, f_namemax; int spare[6]; };
  int statvfs(const char *path, struct pn_statvfs *buf);
]])
local function disk_free(path)
  local st = ffi.new('struct pn_statvfs')
  if ffi.C.statvfs(path, st) ~= 0 then return math.huge end -- unknown: do not stop the run for it
  return tonumber(st.f_bavail) * tonumber(st.f_frsize)
end
local function file_size(path)
  local f = io.open(path, 'rb')
  if not f then return 0 end
  local n = f:seek('end')
  f:close()
  return n or 0
end
M.RESERVE_MIN = 256 * 1024

local function check_space(path, need, what)
  local dir = path:match('^(.*)/[^/]*$') or '.'
  local reserve = math.max(M.RESERVE_MIN, 2 * file_size(path))
  local free = disk_free(dir)
  if free < need + reserve then
    local df = shell('df -P "' .. dir .. '" | tail -1')
    error(string.format('the disk holding %s (%s) is full: %d KiB free, %s needs %d KiB plus a reserve of %d KiB ' ..
      'for the run file', dir, df:match('(%S+)$') or dir, math.floor(free / 1024), what, math.ceil(need / 1024),
      math.ceil(reserve / 1024)), 0)
  end
end

-- ---- the run file -----------------------------------------------------------------------------
local Run = {}
Run.__index = Run

function Run:log(metrics, step)
  check_space(self.path, 4096, 'the metrics of this step')
  for k, v in pairs(metrics) do
    if type(v) == 'number' then
      local ok, e = pcall(function()
        self.f:append('metrics/' .. k, pn.tensor({ v }, { dtype = 'f64' }))
        self.f:append('metrics/' .. k .. '_step', pn.tensor({ step }, { dtype = 'i64' }))
      end)
      if not ok then
        self.broken = true -- nothing more is written to the file: it stays as at its last flush
        error(write_failed('run file', self.path, e), 0)
      end
      local hist = self.metrics[k] or {}
      hist[#hist + 1] = v
      self.metrics[k] = hist
    end
  end
end

function Run:flush()
  local ok, e = pcall(self.f.flush, self.f)
  if not ok then
    self.broken = true
    error(write_failed('run file', self.path, e), 0)
  end
end

-- The checkpoint: /params of model in its own HDF5 file <run>.ckpt, written to a temporary file
-- and renamed over the previous one, so a crash or a full disk mid-write leaves the previous
-- checkpoint (and the run file, which only names it) intact.
function Run:checkpoint(model, attrs)
  local ckpt = self.path:gsub('%.h5$', '') .. '.ckpt'
  check_space(self.path, resume.bytes(model), 'the checkpoint')
  local ok, e = pcall(pio.write_atomic, ckpt, function(f)
    for name, t in pairs(model:state_dict()) do f:write('params/' .. name:gsub('%.', '/'), t) end
    for k, v in pairs(attrs or {}) do f:set_attr('params', k, v) end
  end)
  if not ok then error(write_failed('checkpoint', ckpt, e), 0) end
  if not self.ckpt_named then
    self:set('checkpoint', (ckpt:match('([^/]+)$')))
    self.ckpt_named = true
  end
  self.ckpt = ckpt
end

function Run:set(k, v) self.f:set_attr('/', k, v) end
function Run:summary(t)
  if not self.f:exists('summary') then self.f:write('summary/.keep', pn.zeros({ 0 })) end
  for k, v in pairs(t) do
    if type(v) == 'number' or type(v) == 'string' then self.f:set_attr('summary', k, v) end
  end
end

-- Write extra tensors (radii, attention maps) under a group; writing a name again replaces
-- it (an artefact refreshed at every evaluation).
function Run:write(name, t, attrs)
  if self.f:exists(name) then self.f:delete(name) end
  self.f:write(name, t)
  for k, v in pairs(attrs or {}) do self.f:set_attr(name, k, v) end
end

-- Write text (translations, samples) as a u8 dataset of its UTF-8 bytes, attr encoding=utf-8
-- (runs.lua reads it back as a string; `h5dump -A` shows the attrs).
function Run:write_text(name, text, attrs)
  if type(text) ~= 'string' then error('run:write_text: text must be a string, got ' .. type(text), 2) end
  local t = pn.empty({ #text }, { dtype = 'u8' })
  if #text > 0 then ffi.copy(t:data_ptr(), text, #text) end
  local a = { encoding = 'utf-8' }
  for k, v in pairs(attrs or {}) do a[k] = v end
  self:write(name, t, a)
end

-- ---- the runner ---------------------------------------------------------------------------------
-- eta = {lo, hi}: the time left if patience runs out now (no more progress) and if the run
-- goes to its last step; one figure when they agree
local function summarise_line(name, unit, step, m, best, elapsed, eta, monitor)
  local parts = { string.format('%s %s %d', name, unit, step) }
  if m.loss then parts[#parts + 1] = string.format('loss %.4f', m.loss) end
  if m[monitor] then parts[#parts + 1] = string.format('%s %.4f', monitor, m[monitor]) end
  if best == best and best ~= math.huge and best ~= -math.huge then parts[#parts + 1] = string.format('best %.4f', best) end
  parts[#parts + 1] = fmt_time(elapsed)
  if eta then
    if eta[2] - eta[1] < 1 then parts[#parts + 1] = 'ETA ' .. fmt_time(eta[2])
    else parts[#parts + 1] = 'ETA ' .. fmt_time(eta[1]) .. ' (no progress) to ' .. fmt_time(eta[2]) .. ' (all ' .. unit .. 's)' end
  end
  return table.concat(parts, ' | ')
end

local DEF_KEYS = { name = true, config = true, setup = true, train = true, evaluate = true, model = true,
                   monitor = true, mode = true, also = true, track = true, finish = true, batch = true,
                   on_eval = true, eval_every = true, unit = true, recipe = true, limits = true, shard = true,
                   optimizer = true, save_state = true, load_state = true }

local function check_def(def)
  if type(def) ~= 'table' then error('experiment: expected a definition table, got ' .. type(def), 0) end
  local bad = {}
  for k in pairs(def) do if not DEF_KEYS[k] then bad[#bad + 1] = tostring(k) end end
  if #bad > 0 then
    local valid = {}
    for k in pairs(DEF_KEYS) do valid[#valid + 1] = k end
    table.sort(bad); table.sort(valid)
    error('experiment: unknown definition key(s) ' .. table.concat(bad, ', ') .. '; valid keys: ' .. table.concat(valid, ', '), 0)
  end
  if type(def.name) ~= 'string' then error('experiment: name is required (a string)', 0) end
  if type(def.train) ~= 'function' then error("experiment '" .. def.name .. "': train is required (a function)", 0) end
  if type(def.setup) ~= 'function' then error("experiment '" .. def.name .. "': setup is required (a function)", 0) end
  for _, k in ipairs({ 'evaluate', 'model', 'finish', 'batch', 'on_eval', 'optimizer', 'save_state', 'load_state' }) do
    if def[k] ~= nil and type(def[k]) ~= 'function' then
      error("experiment '" .. def.name .. "': " .. k .. ' must be a function, got ' .. type(def[k]), 0)
    end
  end
  for _, k in ipairs({ 'mode' }) do
    if def[k] ~= nil and def[k] ~= 'max' and def[k] ~= 'min' then
      error("experiment '" .. def.name .. "': " .. k .. " must be 'max' or 'min', got " .. tostring(def[k]), 0)
    end
  end
end

local function positive_int(name, what, v)
  if type(v) ~= 'number' or v < 1 or v % 1 ~= 0 then
    error(string.format("experiment '%s': %s must be a positive integer, got %s", name, what, tostring(v)), 0)
  end
  return v
end

-- The metrics an evaluation is judged by: the monitor (checkpoint and early stopping), `also`
-- (progress on any of them resets patience; a tie on the monitor with a better first `also`
-- checkpoints — GAT's rule) and `track` (their best and when, for the summary).
local Judge = {}
Judge.__index = Judge

local function cmp(md) return md == 'max' and function(a, b) return a > b end or function(a, b) return a < b end end

local function judged(name, t, what)
  local out = {}
  for metric, md in pairs(t or {}) do
    if md ~= 'max' and md ~= 'min' then
      error(string.format("experiment '%s': %s.%s must be 'max' or 'min', got %s", name, what, metric, tostring(md)), 0)
    end
    out[#out + 1] = { name = metric, better = cmp(md), best = md == 'max' and -math.huge or math.huge }
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

local function new_judge(def, patience)
  local mode = def.mode or 'max'
  return setmetatable({ monitor = def.monitor or 'val_acc', better = cmp(mode), patience = patience,
    best = mode == 'max' and -math.huge or math.huge, best_step = 0, bad = 0,
    also = judged(def.name, def.also, 'also'), track = judged(def.name, def.track, 'track') }, Judge)
end

-- one evaluation's metrics m at step: returns whether it is the new best (checkpoint it)
function Judge:evaluate(m, step)
  local score = m[self.monitor]
  if score == nil then error("experiment: monitor '" .. self.monitor .. "' was not produced by train/evaluate", 0) end
  local progress, tie_better = false, false
  for i, a in ipairs(self.also) do
    local v = m[a.name]
    if v ~= nil and a.better(v, a.best) then
      a.best, progress = v, true
      if i == 1 then tie_better = true end
    end
  end
  for _, t in ipairs(self.track) do
    local v = m[t.name]
    if v ~= nil and t.better(v, t.best) then t.best, t.step = v, step end
  end
  local new_best = self.better(score, self.best) or (score == self.best and tie_better)
  if new_best then self.best, self.best_step, progress = score, step, true end
  self.bad = progress and 0 or self.bad + 1
  return new_best
end

function Judge:stop() return self.bad >= self.patience end

-- for a resume state: where the judge stands, and back
function Judge:state()
  local s = { best = self.best, best_step = self.best_step, bad = self.bad, also = {}, track = {} }
  for _, a in ipairs(self.also) do s.also[a.name] = a.best end
  for _, t in ipairs(self.track) do s.track[t.name] = { best = t.best, step = t.step } end
  return s
end
function Judge:restore(s)
  self.best, self.best_step, self.bad = s.best, s.best_step, s.bad
  for _, a in ipairs(self.also) do if s.also[a.name] ~= nil then a.best = s.also[a.name] end end
  for _, t in ipairs(self.track) do
    local v = s.track[t.name]
    if v then t.best, t.step = v.best, v.step end
  end
end

function Judge:summary(result, unit, steps_run)
  result['best_' .. unit] = self.best_step
  result[unit .. 's'] = steps_run
  result['best_' .. self.monitor] = self.best
  for _, t in ipairs(self.track) do
    if t.step then result['best_' .. t.name], result['best_' .. t.name .. '_' .. unit] = t.best, t.step end
  end
end

local SIGNALS = { [1] = 'SIGHUP', [2] = 'Ctrl-C', [15] = 'SIGTERM' }
local function signal_name(n) return SIGNALS[n] or ('signal ' .. tostring(n)) end

-- M.reuse (set by a sweep or ./bench compare given reuse=true): a finished run of this variant
-- with the same seed and the same settings — every config key but threads and quiet — is taken
-- as it is, its summary the result, instead of training again. So runs made one by one (split
-- over sessions, resumed by hand) count in the table that gathers them. The code that made the
-- run is not compared (its git_commit is in the file): reuse is the caller's statement that it
-- still stands. The newest match wins; a failed, interrupted or running run is never taken.
local function same_setting(a, b)
  if type(a) == 'table' and type(b) == 'table' then return json.encode(a) == json.encode(b) end
  return a == b
end

local function reusable_run(def, cfg, seed)
  local dir = (os.getenv('PENUMBRA_RUNS') or 'runs') .. '/' .. M.variant_dir(M.variant_name(def.name, def.config, cfg))
  local d = io.open(dir, 'r')
  if not d then return nil end
  d:close()
  local found
  for _, row in ipairs(require('penumbra.runs').list(dir)) do
    if row.kind == 'run' and row.status == 'finished' and row.seed == seed then
      local ok, attrs = pcall(pio.attrs, row.path, '/')
      local okj, stored = pcall(json.decode, ok and attrs.config or '')
      if ok and okj and type(stored) == 'table' and attrs.experiment == def.name then
        local same = true
        for _, t in ipairs({ cfg, stored }) do
          for k in pairs(t) do
            if not M.RESUME_MAY_DIFFER[k] and not same_setting(cfg[k], stored[k]) then same = false end
          end
        end
        if same then found = row.path end -- rows are sorted by start time: the newest last
      end
    end
  end
  if not found then return nil end
  local result = pio.attrs(found, 'summary')
  result.status, result.path, result.reused = 'finished', found, true
  result.variant = M.variant_name(def.name, def.config, cfg)
  return result
end

-- The run file runs/<variant>/<UTC stamp>-s<seed>.h5 (a new name if taken) with its metadata.
local function open_run(def, cfg, seed, unit)
  local variant = M.variant_name(def.name, def.config, cfg)
  local runs_dir = (os.getenv('PENUMBRA_RUNS') or 'runs') .. '/' .. M.variant_dir(variant)
  if not writable_dir(runs_dir) then
    error('experiment: cannot write run files to ' .. runs_dir .. ' (set PENUMBRA_RUNS to a writable folder)', 0)
  end
  local stamp = utc_stamp()
  local path = string.format('%s/%s-s%d.h5', runs_dir, stamp, seed)
  local k = 1
  while io.open(path, 'r') do
    k = k + 1
    path = string.format('%s/%s-s%d-%d.h5', runs_dir, stamp, seed, k)
  end
  local f = pio.open(path, 'w')
  local run = setmetatable({ f = f, path = path, metrics = {}, cfg = cfg, variant = variant }, Run)
  run:set('experiment', def.name)
  run:set('variant', variant)
  -- the module that can rebuild this run's model and data (the REPL loads it by name)
  if def.recipe then run:set('recipe', def.recipe) end
  run:set('config', json.encode(cfg))
  run:set('seed', seed)
  run:set('unit', unit)
  run:set('git_commit', shell('git -C "' .. (os.getenv('PENUMBRA_HOME') or '.') .. '" rev-parse HEAD'))
  run:set('host', shell('hostname'))
  -- who writes it: `./bench runs` tells a live run from one whose process died (SIGKILL, a crash)
  run:set('pid', tonumber(shell('echo $PPID')) or -1)
  run:set('start_time', utc_iso())
  run:set('status', 'running')
  run:set('threads', pn.num_threads and pn.num_threads() or 1)
  if cfg.device == 'cuda' then -- which device ran it: a GPU's name, or the kernel interpreter
    run:set('device', 'cuda')
    run:set('cuda_device', pn.cuda.device_name())
    run:set('cuda_interpreted', pn.cuda.interpreted() and 1 or 0)
  end
  f:flush()
  return run
end

-- A stopped run's file, opened again to go on from its resume state at `step` (resume=…): the
-- metrics logged after that step are dropped (the resumed steps log them again), and status,
-- pid, threads and the resume count are set.
local function reopen_run(def, cfg, path, attrs, step)
  local f = pio.open(path, 'a')
  local run = setmetatable({ f = f, path = path, metrics = {}, cfg = cfg, variant = attrs.variant or
    M.variant_name(def.name, def.config, cfg) }, Run)
  local ok, e = pcall(function()
    local names = f:exists('metrics') and f:list('metrics') or {}
    local have = {}
    for i, n in ipairs(names) do
      names[i] = n:match('([^/]+)$') -- list gives paths (metrics/loss)
      have[names[i]] = true
    end
    for _, n in ipairs(names) do
      if have[n .. '_step'] then
        local v, at = f:read('metrics/' .. n):totable(), f:read('metrics/' .. n .. '_step'):totable()
        local kv, ka = {}, {}
        for i = 1, math.min(#v, #at) do
          if at[i] <= step then kv[#kv + 1], ka[#ka + 1] = v[i], at[i] end
        end
        if #kv < #v or #ka < #at then
          f:delete('metrics/' .. n)
          f:delete('metrics/' .. n .. '_step')
          if #kv > 0 then
            f:append('metrics/' .. n, pn.tensor(kv, { dtype = 'f64' }))
            f:append('metrics/' .. n .. '_step', pn.tensor(ka, { dtype = 'i64' }))
          end
        end
        run.metrics[n] = kv
      end
    end
    run:set('resumed', (tonumber(attrs.resumed) or 0) + 1)
    run:set('resume_time', utc_iso())
    -- what stopped it, kept; the error and end of this attempt are written when it ends
    local was = attrs.status == 'running' and 'killed (its file still said running)' or tostring(attrs.status)
    run:set('stopped_before', string.format('%s; resumed after %s %d%s', was, attrs.unit or 'step', step,
      (attrs.error or '') ~= '' and (': ' .. attrs.error) or ''))
    run:set('error', '')
    run:set('end_time', '')
    run:set('pid', tonumber(shell('echo $PPID')) or -1)
    run:set('host', shell('hostname'))
    run:set('threads', pn.num_threads and pn.num_threads() or 1)
    run:set('status', 'running')
    f:flush()
  end)
  if not ok then
    f:close()
    error(write_failed('run file', path, e), 0)
  end
  if attrs.checkpoint then
    run.ckpt = (path:match('^(.*)/[^/]*$') or '.') .. '/' .. attrs.checkpoint
    run.ckpt_named = true
  end
  return run
end

-- The progress line: rewritten in place on a terminal, else one line every 10 s.
local function progress_printer(quiet)
  local tty = is_tty() and not quiet
  local last = 0
  return function(line, elapsed, first)
    if quiet then return end
    if tty then
      io.stderr:write('\r\27[K' .. line)
      io.stderr:flush()
    elseif elapsed - last >= 10 or first then
      io.stderr:write(line .. '\n')
      last = elapsed
    end
  end, tty
end

-- Words on ./bench's command line that are not key=value (set by cli.lua; nil elsewhere): an
-- experiment takes settings only, and `epochs` meant as `epochs=5` would otherwise be dropped
-- and the run started with the defaults
M.command_words = nil

function M.run(def, overrides)
  local w = M.command_words
  if w and #w > 0 then
    error(string.format("experiment %s: '%s' on the command line is not a setting; settings are key=value "
      .. "(e.g. %s=…), and an experiment takes no other arguments", tostring(type(def) == 'table' and def.name),
      w[1], w[1]:match('^[%a_][%w_]*$') or 'epochs'), 0)
  end
  check_def(def)
  -- keys starting with '_' steer the runner (e.g. _quiet from ./bench compare), not the config
  local user, internal = {}, {}
  for k, v in pairs(overrides or {}) do
    if type(k) == 'string' and k:sub(1, 1) == '_' then internal[k] = v else user[k] = v end
  end
  -- resume=<run file>: go on with a stopped run (its config, its file; penumbra/resume.lua)
  local resumed
  if user.resume ~= nil and (def.config or {}).resume == nil then
    local from = user.resume
    user.resume = nil
    if type(from) ~= 'string' or from == '' then error("experiment '" .. def.name .. "': resume must name a run file", 0) end
    if not (def.optimizer or def.save_state) then
      error("experiment '" .. def.name .. "' cannot be resumed: its definition says nothing of its optimiser " ..
        '(optimizer = function(state) … end) or its own state (save_state/load_state), so a resumed run could not ' ..
        'go on as the stopped one would have', 0)
    end
    local attrs, stored, state_path = resume.check_run(from, def)
    resumed = { path = from, attrs = attrs, state_path = state_path,
                overrides = resume.overrides(def, stored, user, M.RESUME_MAY_DIFFER, M.config) }
    local ok, p = pcall(resume.load, state_path)
    if not ok then error("experiment '" .. def.name .. "': resume=" .. from .. ': cannot read its resume state ' ..
      state_path .. ': ' .. tostring(p), 0) end
    resumed.payload = p
    user = resumed.overrides
  end
  local cfg = M.config(def.config or {}, user, def.limits)
  if cfg.device == 'cuda' and not pn.cuda.available() then
    error("experiment '" .. def.name .. "': device=cuda, but no CUDA device is available (no GPU, and this build is not "
          .. 'the kernel interpreter: PENUMBRA_BUILD=build-emu PENUMBRA_CMAKE_ARGS=-DPN_CUDA_EMU=ON ./bench …)', 0)
  end
  -- the length of training: cfg.steps (step-based: online batches, NMT, link prediction) or
  -- cfg.epochs (full-batch: one step is one epoch); evaluation every eval_every steps and at
  -- the last one; patience counts evaluations without progress
  local unit = def.unit or (cfg.steps ~= nil and 'step' or 'epoch')
  if unit ~= 'step' and unit ~= 'epoch' then error("experiment '" .. def.name .. "': unit must be 'step' or 'epoch'", 0) end
  local max_steps = positive_int(def.name, unit == 'step' and 'steps' or 'epochs',
    (unit == 'step' and cfg.steps or cfg.epochs) or 100)
  local eval_every = positive_int(def.name, 'eval_every', cfg.eval_every or def.eval_every or 1)
  local judge = new_judge(def, cfg.patience or math.huge)
  -- Ctrl-C from here on only sets a flag (polled between steps), so it cannot strike
  -- between creating the run file and the protected training loop
  local C = require('penumbra_ffi').C
  C.pn_interrupt_install()
  local seed = cfg.seed or 0
  if M.reuse and not resumed and not require('penumbra.dist').is_distributed() then
    local kept = reusable_run(def, cfg, seed)
    if kept then
      C.pn_interrupt_clear()
      return kept
    end
  end
  -- threads=N (0: the library's default) holds for this run only, and is set before the run file
  -- records the count (a recipe that set it in its setup left the file saying the default)
  local threads_before = pn.num_threads()
  if (cfg.threads or 0) > 0 then pn.set_num_threads(cfg.threads) end
  -- flush_denormal = true|false (a recipe that has the key): subnormals flushed on the CPU
  -- threads for this run only (core/fpmode.c)
  local flush_before = cfg.flush_denormal ~= nil and pn.flush_denormal()
  if cfg.flush_denormal ~= nil then pn.set_flush_denormal(cfg.flush_denormal) end
  pn.manual_seed(seed)
  math.randomseed(seed)
  local quiet = cfg.quiet or internal._quiet
  -- across ranks (`./bench -n N`): one model trained by all, rank 0 (the lead) alone writes the
  -- run file, evaluates and prints (penumbra/ddp.lua); in one process dd is nil and lead true
  local dd = require('penumbra.dist').is_distributed() and require('penumbra.ddp').start(def, cfg,
    { signal_name = signal_name }) or nil
  local lead = not dd or dd.context().rank == 0
  local rank, size = dd and dd.context().rank or 0, dd and dd.context().size or 1
  if resumed then
    local p = resumed.payload
    if p.unit ~= unit then
      error(string.format("experiment '%s': resume=%s: its resume state counts %ss, this run %ss", def.name,
        resumed.path, tostring(p.unit), unit), 0)
    end
    if p.ranks ~= size then -- each rank's random stream was saved: the same ranks must go on
      error(string.format("experiment '%s': resume=%s: the run was trained on %d rank%s and its resume state " ..
        'holds their random streams; resume it with %s, not %s', def.name, resumed.path, p.ranks,
        p.ranks == 1 and '' or 's', p.ranks > 1 and ('./bench -n ' .. p.ranks) or 'one process (no -n)',
        size > 1 and ('-n ' .. size) or 'one process'), 0)
    end
  end
  local run, unsilence
  if lead and resumed then
    run = reopen_run(def, cfg, resumed.path, resumed.attrs, resumed.payload.step)
  elseif lead then
    run = open_run(def, cfg, seed, unit)
    if dd then
      local c = dd.context()
      run:set('ranks', c.size)
      run:set('hosts', c.hosts)
      run:set('shard', c.shard)
      run.f:flush()
    end
  else
    run = dd.null_run(cfg, M.variant_name(def.name, def.config, cfg))
    unsilence = dd.silence()
  end
  local path = run.path
  if lead and M.on_open then pcall(M.on_open, path) end -- a sweep notes the file (a failure there must not stop the run)
  local print_progress, tty = progress_printer(quiet or not lead)
  local status, err_msg, steps_run = 'running', nil, 0
  local t0 = now()
  local result = {}

  -- the resume state: saved by rank 0 at every evaluation and, when the run stops at the end of a
  -- step (boundary: the last step whose work is all done, nil while one runs), at that step
  local state_path = path and resume.path_of(path)
  local resumable = (def.optimizer or def.save_state) and true or false
  local state, model, boundary, saved_step
  local last_save = now()
  local function save_resume(step, stop)
    local rng = dd and dd.rng_states() or {}
    rng[1] = pn.rng_state() -- rank 0's now (its evaluation may have drawn); the others' at the step's end
    local opt = def.optimizer and def.optimizer(state)
    local payload = { step = step, unit = unit, stop = stop and true or false, seconds = now() - t0, ranks = size,
                      judge = judge:state(), rng = rng, optimizer = opt and opt:state_dict() or nil,
                      recipe = def.save_state and def.save_state(state, cfg) or nil }
    check_space(path, resume.bytes(model, payload), 'the resume state')
    local ok, e = pcall(resume.save, state_path, model, payload)
    if not ok then error(write_failed('resume state', state_path, e), 0) end
    saved_step, last_save = step, now()
  end
  local first_step = 1

  local ok, err = xpcall(function()
    if dd then
      state, model = dd.setup(def, cfg, run) -- rank 0's first, then the others'; parameters from rank 0
    else
      state = def.setup(cfg, run)
      model = def.model and def.model(state)
    end
    if resumed then -- every rank reads the resume state itself (ranks on several machines share a file system)
      local p = resumed.payload
      if model then model:load(resumed.state_path, 'params') end
      if p.optimizer then
        local opt = def.optimizer and def.optimizer(state)
        if not opt then error("experiment '" .. def.name .. "': the resume state holds an optimiser, the run has none", 0) end
        opt:load_state_dict(p.optimizer)
      end
      if def.load_state then def.load_state(state, p.recipe or {}, cfg) end
      judge:restore(p.judge)
      pn.set_rng_state(p.rng[rank + 1])
      steps_run, boundary, saved_step = p.step, p.step, p.step
      first_step = p.stop and max_steps + 1 or p.step + 1
      t0 = now() - p.seconds
      -- the best checkpoint: the state is saved before it, so a stop between the two leaves the
      -- step's best only in the state — written again here
      if lead and model and judge.best_step == p.step and p.step > 0 then
        local okc, ca = pcall(pio.attrs, run.ckpt or '', 'params')
        if not (okc and ca.step == p.step) then
          run:checkpoint(model, { [unit] = p.step, step = p.step, [judge.monitor] = judge.best })
        end
      end
      if lead and not quiet then
        io.stderr:write(string.format('%s: resumed %s after %s %d of %d (%s)\n', def.name, path, unit, p.step,
          max_steps, state_path))
      end
    end
    for step = first_step, max_steps do
      -- (across ranks an interrupt is agreed at the end of each step: dd.agree_stop)
      if not dd and C.pn_interrupted() ~= 0 then error('interrupted (' .. signal_name(C.pn_interrupted()) .. ') before ' .. unit .. ' ' .. step, 0) end
      boundary = nil
      if dd then dd.begin_step() end
      -- online data: a fresh batch (or graph) per step
      local batch = def.batch and def.batch(state, cfg, step)
      local m = def.train(state, cfg, step, batch) or {}
      if dd then dd.end_step(m, step) end -- the metrics over every rank
      if m.loss and m.loss ~= m.loss then
        status = 'failed'
        err_msg = string.format('loss became NaN at %s %d; the last good checkpoint (%s %d) is kept', unit, step, unit,
          judge.best_step)
        error(err_msg, 0)
      end
      steps_run = step
      local evaluated = step % eval_every == 0 or step == max_steps
      if lead then
        if evaluated and def.evaluate then
          for kk, vv in pairs(def.evaluate(state, cfg, 'val', step) or {}) do m['val_' .. kk] = vv end
        end
        run:log(m, step)
        run:flush() -- the step is on disk before the checkpoint and the artefacts are written
        if evaluated then
          local best = judge:evaluate(m, step)
          -- artefacts of this evaluation (translations, attention maps, radii)
          if def.on_eval then def.on_eval(state, cfg, run, step, m) end
          -- the resume state before the checkpoint (see the resume branch above)
          if resumable and now() - last_save >= M.RESUME_EVERY_S then save_resume(step, judge:stop()) end
          if best and model then
            run:checkpoint(model, { [unit] = step, step = step, [judge.monitor] = m[judge.monitor] })
          end
          run:flush() -- what the evaluation added (the checkpoint's name, artefacts)
        end
        local elapsed = now() - t0
        local per = elapsed / step
        local eta = { per * math.min(max_steps - step, (judge.patience - judge.bad) * eval_every), per * (max_steps - step) }
        print_progress(summarise_line(def.name, unit, step, m, judge.best, elapsed, eta, judge.monitor), elapsed, step == 1)
      end
      local stop = lead and evaluated and judge:stop()
      boundary = step
      if dd then stop = dd.agree_stop(stop) end -- rank 0's decision (and any failure, interrupt) to all
      if stop then break end
    end
    if dd then dd.finish_training() end
    if not lead then status = 'finished'; return end -- the rest is rank 0's: test, finish, summary
    if C.pn_interrupted() ~= 0 then
      error('interrupted (' .. signal_name(C.pn_interrupted()) .. ') after ' .. unit .. ' ' .. steps_run, 0)
    end
    if tty then io.stderr:write('\n') end
    -- restore the best checkpoint before the test evaluation
    if model and judge.best_step > 0 then model:load(run.ckpt, 'params') end
    judge:summary(result, unit, steps_run)
    if def.evaluate then
      for kk, vv in pairs(def.evaluate(state, cfg, 'test') or {}) do result['test_' .. kk] = vv end
      for kk, vv in pairs(def.evaluate(state, cfg, 'val') or {}) do result['val_' .. kk] = vv end
    end
    if def.finish then
      for kk, vv in pairs(def.finish(state, cfg, run) or {}) do result[kk] = vv end
    end
    status = 'finished'
  end, function(e)
    local msg = tostring(e)
    if msg:find('interrupted') then status = 'interrupted' elseif status ~= 'failed' then status = 'failed' end
    -- the message without a "file.lua:123: " position (a user reads it; PN_TRACEBACK=1 shows where)
    err_msg = err_msg or require('penumbra_ffi').unplaced(msg)
    return debug.traceback(msg, 2)
  end)

  -- across ranks: a failure here tells the others (at their next collective), unless they told us
  if dd and not ok then dd.fail(err_msg) end
  if dd and not ok and not lead then dd.close_for_lead(err_msg) end -- rank 0 gone outright: rank 1 closes its file
  -- stopped at the end of a step whose state is not saved yet: saved now, so nothing is lost
  if not ok and lead and resumable and boundary and boundary > 0 and boundary ~= saved_step and not run.broken then
    local oks, es = pcall(save_resume, boundary, false)
    if not oks then err_msg = tostring(err_msg) .. '; the resume state could not be saved: ' .. tostring(es) end
  end
  if lead and status == 'finished' then os.remove(state_path) end
  C.pn_interrupt_clear()
  pn.set_num_threads(threads_before)
  if cfg.flush_denormal ~= nil then pn.set_flush_denormal(flush_before) end
  local elapsed = now() - t0
  result.seconds = elapsed
  result['seconds_per_' .. unit] = steps_run > 0 and elapsed / steps_run or 0
  result.status = status
  result.path = path
  result.variant = run.variant
  -- the end of the run file: status, summary, close — unless a write to it failed already
  -- (then it stays exactly as at its last flush, readable; `./bench runs` sees its writer gone)
  if lead and not run.broken then
    local okc, ec = pcall(function()
      run:summary(result)
      run:set('status', status)
      run:set('end_time', utc_iso())
      if err_msg then run:set('error', err_msg) end
      run.f:flush()
    end)
    if not okc then
      run.broken = true
      err_msg = err_msg or write_failed('run file', path, ec)
      status = 'failed'
      ok = false
    end
  end
  if lead and not run.broken then pcall(run.f.close, run.f) end
  if dd then
    dd.closed() -- after a failure: every rank waits until rank 0's run file is closed
    dd.stop()
  end
  if unsilence then unsilence() end
  if tty then io.stderr:write('\n') end
  if not quiet and lead then
    local keys = {}
    for kk in pairs(result) do keys[#keys + 1] = kk end
    table.sort(keys)
    io.stdout:write(string.format('== %s (seed %d): %s\n', def.name, seed, status))
    for _, kk in ipairs(keys) do
      local vv = result[kk]
      io.stdout:write(string.format('  %-22s %s\n', kk, type(vv) == 'number' and string.format('%.4f', vv) or tostring(vv)))
    end
  end
  if not ok then
    -- one message (the traceback of the failure only with PN_TRACEBACK=1); the run file keeps it
    local trace = os.getenv('PN_TRACEBACK') and ('\n' .. tostring(err)) or ''
    if lead and resumable and saved_step and pio.file_exists(state_path) then
      trace = string.format('; to go on after %s %d: resume=%s', unit, saved_step, path) .. trace
    end
    if status == 'interrupted' then
      error('experiment ' .. def.name .. ' ' .. tostring(err_msg) .. (path and ('; run file kept: ' .. path) or '') .. trace, 0)
    end
    if not path then error('experiment ' .. def.name .. ' failed: ' .. tostring(err_msg) .. trace, 0) end
    error('experiment ' .. def.name .. ' failed: ' .. tostring(err_msg) .. ' (run file: ' .. path .. ')' .. trace, 0)
  end
  return result, run
end

-- pn.experiment{…}: runs with the command line's overrides (global `args`).
setmetatable(M, { __call = function(_, def) return M.run(def, rawget(_G, 'args')) end })

return M
