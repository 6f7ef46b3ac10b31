-- penumbra.experiment — the runner every experiment script goes through.
--
--   return pn.experiment{
--     name = 'cora_umbral',
--     config = { epochs = 1000, patience = 100, lr = 0.005, seed = 0, ... },  -- defaults
--     setup = function(cfg) return state end,             -- build data, model, optimiser
--     train = function(state, cfg, epoch) return { loss = …, train_acc = … } end,
--     evaluate = function(state, cfg, split) return { loss = …, acc = … } end, -- 'val' | 'test'
--     model = function(state) return state.model end,     -- what gets checkpointed
--     monitor = 'val_acc', mode = 'max',                  -- early stopping on this metric
--     also = { val_loss = 'min' },                         -- optional: improving any of these
--                                                          -- also resets patience (GAT's rule);
--                                                          -- a tie on monitor with a better
--                                                          -- first `also` metric checkpoints
--     finish = function(state, cfg, run) end,              -- optional: log radii, attention maps;
--                                                          -- a returned {name = number} joins the
--                                                          -- summary (and the returned result)
--   }
--
-- Overrides come from the command line (`./bench script.lua lr=0.01 seed=3`) through the
-- global table `args`, are type-checked against the defaults, and an unknown key is an error
-- listing the valid ones. The run file (DESIGN §5) runs/<name>/<UTC stamp>-s<seed>.h5 gets
-- the config (JSON), git commit, host, times and status (running → finished | failed |
-- interrupted), /metrics/<name> appended every epoch and flushed, /params (the best
-- checkpoint, written under a temporary name and then renamed), /summary attributes.
local pn = require 'penumbra.tensor'
local pio = require 'penumbra.io'
local ffi = require 'ffi'

pcall(ffi.cdef, 'int isatty(int fd);')

local M = {}

-- ---- config ---------------------------------------------------------------------------------
local json = require 'penumbra.json'
M.json = json.encode -- kept: scripts and specs call pn.experiment.json

-- cfg = defaults overridden by overrides (strings from the command line or typed values)
function M.config(defaults, overrides)
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
  return cfg
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

-- ---- the run file -----------------------------------------------------------------------------
local Run = {}
Run.__index = Run

function Run:log(metrics, step)
  for k, v in pairs(metrics) do
    if type(v) == 'number' then
      self.f:append('metrics/' .. k, pn.tensor({ v }, { dtype = 'f64' }))
      self.f:append('metrics/' .. k .. '_step', pn.tensor({ step }, { dtype = 'i64' }))
      local hist = self.metrics[k] or {}
      hist[#hist + 1] = v
      self.metrics[k] = hist
    end
  end
end

function Run:flush() self.f:flush() end

-- parameters of model under /params, via a temporary group renamed at the end, so a crash
-- mid-write leaves the previous checkpoint intact
function Run:checkpoint(model, attrs)
  local f = self.f
  if f:exists('params_tmp') then f:delete('params_tmp') end
  for name, t in pairs(model:state_dict()) do
    f:write('params_tmp/' .. name:gsub('%.', '/'), t)
  end
  if f:exists('params') then f:delete('params') end
  f:move('params_tmp', 'params')
  for k, v in pairs(attrs or {}) do f:set_attr('params', k, v) end
  f:flush()
end

function Run:set(k, v) self.f:set_attr('/', k, v) end
function Run:summary(t)
  if not self.f:exists('summary') then self.f:write('summary/.keep', pn.zeros({ 0 })) end
  for k, v in pairs(t) do
    if type(v) == 'number' or type(v) == 'string' then self.f:set_attr('summary', k, v) end
  end
end

-- Write extra tensors (radii, attention maps) under a group.
function Run:write(name, t, attrs)
  self.f:write(name, t)
  for k, v in pairs(attrs or {}) do self.f:set_attr(name, k, v) end
end

-- ---- the runner ---------------------------------------------------------------------------------
local function summarise_line(name, epoch, m, best, elapsed, eta, monitor)
  local parts = { string.format('%s epoch %d', name, epoch) }
  if m.loss then parts[#parts + 1] = string.format('loss %.4f', m.loss) end
  if m[monitor] then parts[#parts + 1] = string.format('%s %.4f', monitor, m[monitor]) end
  parts[#parts + 1] = string.format('best %.4f', best)
  parts[#parts + 1] = fmt_time(elapsed)
  if eta then parts[#parts + 1] = 'ETA ≤ ' .. fmt_time(eta) end
  return table.concat(parts, ' | ')
end

function M.run(def, overrides)
  assert(type(def.name) == 'string', 'experiment: name is required')
  -- keys starting with '_' steer the runner (e.g. _quiet from ./bench compare), not the config
  local user, internal = {}, {}
  for k, v in pairs(overrides or {}) do
    if type(k) == 'string' and k:sub(1, 1) == '_' then internal[k] = v else user[k] = v end
  end
  local cfg = M.config(def.config or {}, user)
  -- Ctrl-C from here on only sets a flag (polled between epochs), so it cannot strike
  -- between creating the run file and the protected training loop
  local C = require('penumbra_ffi').C
  C.pn_interrupt_install()
  local seed = cfg.seed or 0
  pn.manual_seed(seed)
  math.randomseed(seed)
  local quiet = cfg.quiet or internal._quiet
  local monitor, mode = def.monitor or 'val_acc', def.mode or 'max'
  local function cmp(md) return md == 'max' and function(a, b) return a > b end or function(a, b) return a < b end end
  local better = cmp(mode)
  -- secondary metrics (GAT: val_loss) that also count as progress for patience
  local also = {}
  for name, md in pairs(def.also or {}) do also[#also + 1] = { name = name, better = cmp(md),
    best = md == 'max' and -math.huge or math.huge } end
  table.sort(also, function(a, b) return a.name < b.name end)

  -- the run file, before any training
  local runs_dir = (os.getenv('PENUMBRA_RUNS') or 'runs') .. '/' .. def.name
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
  local run = setmetatable({ f = f, path = path, metrics = {}, cfg = cfg }, Run)
  run:set('experiment', def.name)
  run:set('config', json.encode(cfg))
  run:set('seed', seed)
  run:set('git_commit', shell('git -C "' .. (os.getenv('PENUMBRA_HOME') or '.') .. '" rev-parse HEAD'))
  run:set('host', shell('hostname'))
  run:set('start_time', utc_iso())
  run:set('status', 'running')
  run:set('threads', pn.num_threads and pn.num_threads() or 1)
  f:flush()

  local tty = is_tty() and not quiet
  local status, err_msg = 'running', nil
  local best, best_epoch, epochs_run = (mode == 'max') and -math.huge or math.huge, 0, 0
  local state
  local t0 = now()
  local result = {}

  local ok, err = xpcall(function()
    state = def.setup(cfg, run)
    local model = def.model and def.model(state)
    local max_epochs, patience = cfg.epochs or 100, cfg.patience or math.huge
    local bad_epochs = 0
    local last_print = 0
    for epoch = 1, max_epochs do
      if C.pn_interrupted() ~= 0 then error('interrupted (Ctrl-C) before epoch ' .. epoch, 0) end
      local m = def.train(state, cfg, epoch) or {}
      if m.loss and m.loss ~= m.loss then
        status = 'failed'
        err_msg = string.format('loss became NaN at epoch %d; the last good checkpoint (epoch %d) is kept', epoch, best_epoch)
        error(err_msg, 0)
      end
      local v = def.evaluate and def.evaluate(state, cfg, 'val') or {}
      for kk, vv in pairs(v) do m['val_' .. kk] = vv end
      m.epoch_time = nil
      epochs_run = epoch
      run:log(m, epoch)
      local score = m[monitor]
      if score == nil then error("experiment: monitor '" .. monitor .. "' was not produced by train/evaluate", 0) end
      local progress, tie_better = false, false
      for i, a in ipairs(also) do
        local v = m[a.name]
        if v ~= nil and a.better(v, a.best) then
          a.best = v
          progress = true
          if i == 1 then tie_better = true end
        end
      end
      if better(score, best) or (score == best and tie_better) then
        best, best_epoch = score, epoch
        progress = true
        if model then run:checkpoint(model, { epoch = epoch, [monitor] = score }) end
      end
      if progress then bad_epochs = 0 else bad_epochs = bad_epochs + 1 end
      run:flush()
      local elapsed = now() - t0
      if not quiet then
        local eta = elapsed / epoch * math.min(max_epochs - epoch, patience - bad_epochs)
        local line = summarise_line(def.name, epoch, m, best, elapsed, eta, monitor)
        if tty then
          io.stderr:write('\r\27[K' .. line)
          io.stderr:flush()
        elseif elapsed - last_print >= 10 or epoch == 1 then
          io.stderr:write(line .. '\n')
          last_print = elapsed
        end
      end
      if bad_epochs >= patience then break end
    end
    if C.pn_interrupted() ~= 0 then error('interrupted (Ctrl-C) after epoch ' .. epochs_run, 0) end
    if tty then io.stderr:write('\n') end
    -- restore the best checkpoint before the test evaluation
    if model and best_epoch > 0 then model:load(path, 'params') end
    result.best_epoch, result.epochs = best_epoch, epochs_run
    result['best_' .. monitor] = best
    if def.evaluate then
      local tm = def.evaluate(state, cfg, 'test') or {}
      for kk, vv in pairs(tm) do result['test_' .. kk] = vv end
      local vm = def.evaluate(state, cfg, 'val') or {}
      for kk, vv in pairs(vm) do result['val_' .. kk] = vv end
    end
    if def.finish then
      for kk, vv in pairs(def.finish(state, cfg, run) or {}) do result[kk] = vv end
    end
    status = 'finished'
  end, function(e)
    local msg = tostring(e)
    if msg:find('interrupted') then status = 'interrupted' elseif status ~= 'failed' then status = 'failed' end
    err_msg = err_msg or msg
    return debug.traceback(msg, 2)
  end)

  C.pn_interrupt_clear()
  local elapsed = now() - t0
  result.seconds = elapsed
  result.seconds_per_epoch = epochs_run > 0 and elapsed / epochs_run or 0
  result.status = status
  result.path = path
  pcall(function()
    run:summary(result)
    run:set('status', status)
    run:set('end_time', utc_iso())
    if err_msg then run:set('error', err_msg) end
    f:close()
  end)
  if tty then io.stderr:write('\n') end
  if not quiet then
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
    if status == 'interrupted' then
      io.stderr:write('experiment interrupted; run file kept: ' .. path .. '\n')
    end
    error((status == 'failed' and err_msg) and ('experiment ' .. def.name .. ' failed: ' .. err_msg .. '\n' .. tostring(err))
      or tostring(err), 0)
  end
  return result, run
end

-- pn.experiment{…}: runs with the command line's overrides (global `args`).
setmetatable(M, { __call = function(_, def) return M.run(def, rawget(_G, 'args')) end })

return M
