-- penumbra.resume — a run's resume state: what a run that stopped (interrupted, failed, killed)
-- needs to go on exactly where it was, and the checks before it does
-- (`./bench experiments/x.lua resume=runs/x/<stamp>-s0.h5`; penumbra/experiment.lua drives it).
--
-- The state lives beside the run file in <run>.resume (HDF5, written whole or not at all through
-- pn.io.write_atomic): /params (the model as it is — not the best checkpoint — in the
-- checkpoint's layout) and /state: everything else as one JSON document (/state/json, its UTF-8
-- bytes) whose tensors are datasets /state/t1, /state/t2, … — the runner's position (step, the
-- early-stopping judge, seconds so far, ranks), each rank's tensor-RNG position, the optimiser's
-- state (def.optimizer(state):state_dict()) and the recipe's own (def.save_state(state)). The
-- batches themselves are not saved: every recipe draws them from (seed, step), so the resumed
-- steps get the batches the uninterrupted run would have got. The file is removed when the run
-- finishes.
local pn = require 'penumbra.tensor'
local pio = require 'penumbra.io'
local json = require 'penumbra.json'
local ffi = require 'ffi'

local M = {}

M.VERSION = 1

function M.path_of(run_path) return (run_path:gsub('%.h5$', '')) .. '.resume' end

-- ---- a Lua value with tensors ⇄ JSON + datasets ----------------------------------------------
-- Tables become objects whose integer keys are written '#1', '#2', … (JSON object keys are
-- strings); a tensor becomes {"$t": "t<n>"}; a number JSON cannot hold (NaN, ±inf: the judge's
-- starting best) becomes {"$n": "inf"}.
local function flatten(v, tensors, where)
  local t = type(v)
  if pn.is_tensor(v) then
    tensors[#tensors + 1] = v
    return { ['$t'] = 't' .. #tensors }
  elseif t == 'number' then
    if v ~= v then return { ['$n'] = 'nan' } end
    if v == math.huge or v == -math.huge then return { ['$n'] = v > 0 and 'inf' or '-inf' } end
    return v
  elseif t == 'string' or t == 'boolean' then
    return v
  elseif t == 'table' then
    local out = {}
    for k, x in pairs(v) do
      local key
      if type(k) == 'number' and k % 1 == 0 then key = '#' .. k
      elseif type(k) == 'string' and not k:match('^[#$]') then key = k
      else error(string.format('resume: cannot save the key %s of %s (keys are strings or integers; a string key ' ..
        'may not start with # or $)', tostring(k), where), 0) end
      out[key] = flatten(x, tensors, where .. '.' .. tostring(k))
    end
    return out
  end
  error(string.format('resume: cannot save %s, a %s (a resume state holds numbers, strings, booleans, tensors and ' ..
    'tables of them)', where, t), 0)
end

local NUMS = { nan = 0 / 0, inf = math.huge, ['-inf'] = -math.huge }
local function unflatten(v, f)
  if type(v) ~= 'table' then return v end
  if v['$t'] then return f:read('state/' .. v['$t']) end
  if v['$n'] then return NUMS[v['$n']] end
  local out = {}
  for k, x in pairs(v) do
    local key = k:match('^#(%-?%d+)$')
    out[key and tonumber(key) or k] = unflatten(x, f)
  end
  return out
end

-- bytes a file of model's parameters and payload will take (the disk check before a resume state
-- or a checkpoint is written)
function M.bytes(model, payload)
  local n = 65536
  local function add(t) n = n + t:numel() * (t:dtype() == 'f64' and 8 or 4) end
  local function walk(v)
    if pn.is_tensor(v) then add(v) elseif type(v) == 'table' then for _, x in pairs(v) do walk(x) end end
  end
  if model then for _, t in pairs(model:state_dict()) do add(t) end end
  walk(payload)
  return n
end

-- writes model's parameters and payload to path (whole or not at all)
function M.save(path, model, payload)
  local tensors = {}
  local doc = json.encode(flatten(payload, tensors, 'the state'))
  pio.write_atomic(path, function(f)
    if model then
      for name, t in pairs(model:state_dict()) do f:write('params/' .. name:gsub('%.', '/'), t) end
    end
    for i, t in ipairs(tensors) do f:write('state/t' .. i, t) end
    local bytes = pn.empty({ #doc }, { dtype = 'u8' })
    ffi.copy(bytes:data_ptr(), doc, #doc)
    f:write('state/json', bytes)
    f:set_attr('/', 'version', M.VERSION)
  end)
end

-- the payload saved at path (its tensors on the CPU); the parameters stay in the file
-- (model:load(path, 'params') reads them)
function M.load(path)
  local f = pio.open(path, 'r')
  local ok, r = pcall(function()
    local v = f:attr('/', 'version')
    if v ~= M.VERSION then
      error(string.format('resume: %s is a resume state of version %s; this penumbra reads version %d', path,
        tostring(v), M.VERSION), 0)
    end
    local b = f:read('state/json')
    return unflatten(json.decode(ffi.string(b:data_ptr(), b:numel())), f)
  end)
  f:close()
  if not ok then error(r, 0) end
  return r
end

-- ---- the checks before a run is resumed ---------------------------------------------------------

-- What resume=PATH names, checked against the experiment def about to run it: returns the run
-- file's attributes, its config (decoded) and the resume state's path. Every refusal says why and
-- what to do instead.
function M.check_run(path, def)
  local who = "experiment '" .. def.name .. "': resume=" .. path
  if not pio.file_exists(path) then error(who .. ': no such run file', 0) end
  local ok, a = pcall(pio.attrs, path, '/')
  if not ok then error(who .. ': cannot read the run file: ' .. tostring(a), 0) end
  if a.experiment == nil or a.status == nil or a.config == nil then
    error(who .. ': not a run file (it has no experiment, status or config attribute; give the .h5 a run wrote, ' ..
      'not its .ckpt, .resume or a compare table)', 0)
  end
  if a.experiment ~= def.name then
    error(string.format("%s: that run is of the experiment '%s'; resume it with its own script", who,
      tostring(a.experiment)), 0)
  end
  if a.status == 'finished' then error(who .. ': that run finished; there is nothing to resume (start a new run)', 0) end
  if a.status == 'running' and require('penumbra.runs').writer_state(a) == 'alive' then
    error(string.format('%s: that run is still running (pid %d on this machine); stop it first', who, a.pid), 0)
  end
  local state = M.path_of(path)
  if not pio.file_exists(state) then
    error(string.format('%s: its resume state %s is missing (a run saves it at its first evaluation; this one ' ..
      'stopped before, or it finished); start a new run', who, state), 0)
  end
  local cfg = json.decode(a.config or '{}')
  return a, cfg, state
end

-- the config a resumed run runs with: the stored one; of the command line's keys only those that
-- do not change what is computed (threads, quiet) may differ. Returns the overrides for
-- experiment.config.
function M.overrides(def, stored, user, may_differ, config_fn)
  local who = "experiment '" .. def.name .. "': resume"
  local o = {}
  for k, v in pairs(stored) do
    if (def.config or {})[k] == nil then
      error(string.format("%s: the run's config has the key '%s', which this experiment no longer has (the code " ..
        'changed since; resume with the commit that made the run)', who, k), 0)
    end
    o[k] = v
  end
  local given = config_fn(def.config or {}, user, def.limits) -- typed and checked like any run's
  local bad = {}
  for k in pairs(user) do
    if may_differ[k] then
      o[k] = given[k]
    elseif given[k] ~= stored[k] then
      bad[#bad + 1] = string.format('%s=%s (the run has %s)', k, tostring(user[k]), tostring(stored[k]))
    end
  end
  if #bad > 0 then
    local free = {}
    for k in pairs(may_differ) do free[#free + 1] = k end
    table.sort(bad)
    table.sort(free)
    error(string.format('%s: a resumed run keeps its config; leave out %s (only %s may change), or start a new run',
      who, table.concat(bad, ', '), table.concat(free, ', ')), 0)
  end
  return o
end

return M
