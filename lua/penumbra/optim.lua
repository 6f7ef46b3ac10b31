-- penumbra.optim — SGD (momentum, nesterov), Adam, AdamW, gradient clipping by norm, and
-- learning-rate schedules. The updates are fused C loops (core/ops/optim.c).
local pn = require 'penumbra.tensor'
local B = require 'penumbra_ffi'
local C, check = B.C, B.check

local optim = {}
local options = require 'penumbra.options'
local SGD_OPTS = { lr = { 'number', min = 0 }, momentum = { 'number', min = 0 }, dampening = { 'number', min = 0, max = 1 },
                   weight_decay = { 'number', min = 0 }, nesterov = 'boolean' }
local ADAM_OPTS = { lr = { 'number', min = 0 }, betas = 'table', eps = { 'number', above = 0 },
                    weight_decay = { 'number', min = 0 } }

local function param_list(params)
  if type(params) ~= 'table' then
    error('optimiser: params must be a module or a list of tensors, got ' .. type(params), 3)
  end
  if params.parameters then params = params:parameters() end
  local r = {}
  for i, p in ipairs(params) do
    if not pn.is_tensor(p) then error('optimiser: parameter ' .. i .. ' is not a tensor', 3) end
    if not p:is_floating_point() then
      error(string.format('optimiser: parameter %d [%s] has dtype %s; only f32 and f64 tensors are trained', i,
        table.concat(p:shape(), ','), p:dtype()), 3)
    end
    r[i] = p
  end
  if #r == 0 then error('optimiser: empty parameter list', 3) end
  return r
end

-- Data parallelism (penumbra/ddp.lua) sets optim.grad_hook while the runner trains one model
-- across ranks: hook('read', params) before clip_grad_norm or a step reads the gradients (they
-- are combined over the ranks there, once per step) and hook('stepped', params) after a step.
-- nil in one process, where nothing calls it.
optim.grad_hook = nil

local Optimizer = {}
Optimizer.__index = Optimizer
function Optimizer:zero_grad()
  for _, p in ipairs(self.params) do p:zero_grad() end
end

-- The optimiser's state, for a run's resume state (penumbra/experiment.lua): its kind, step
-- count, learning rate and per-parameter slots (SGD: the momentum buffers; Adam: m, v and the
-- step count t), keyed by the parameter's position ('1', '2', …; a parameter that never had a
-- gradient has none). load_state_dict copies it back into an optimiser of the same kind over
-- parameters of the same shapes, in place, and names what does not match.
local SLOTS = { SGD = { 'bufs' }, Adam = { 'm', 'v', 't' }, AdamW = { 'm', 'v', 't' } }

function Optimizer:state_dict()
  local sd = { kind = self.name, steps = self.steps, lr = self.lr, params = #self.params }
  for _, slot in ipairs(SLOTS[self.name]) do
    sd[slot] = {}
    for i, v in pairs(self[slot]) do sd[slot][tostring(i)] = pn.is_tensor(v) and v:clone() or v end
  end
  return sd
end

function Optimizer:load_state_dict(sd)
  local who = 'load_state_dict (' .. self.name .. ')'
  if type(sd) ~= 'table' then error(who .. ': expected a table from state_dict(), got ' .. type(sd), 2) end
  if sd.kind ~= self.name then
    error(string.format('%s: the state is of a %s optimiser, this one is %s', who, tostring(sd.kind), self.name), 2)
  end
  if sd.params ~= #self.params then
    error(string.format('%s: the state holds %s parameters, this optimiser has %d', who, tostring(sd.params),
      #self.params), 2)
  end
  local new = {}
  for _, slot in ipairs(SLOTS[self.name]) do
    new[slot] = {}
    local keys = {}
    for key in pairs(sd[slot] or {}) do keys[#keys + 1] = key end
    table.sort(keys, function(a, b) return (tonumber(a) or math.huge) < (tonumber(b) or math.huge) end)
    for _, key in ipairs(keys) do
      local v, i = sd[slot][key], tonumber(key)
      local p = i and self.params[i]
      if not p then error(string.format("%s: slot %s names parameter '%s', which this optimiser does not have", who, slot, tostring(key)), 2) end
      if pn.is_tensor(v) then
        local ps, vs = table.concat(p:shape(), 'x'), table.concat(v:shape(), 'x')
        if ps ~= vs then
          error(string.format('%s: %s of parameter %d has shape [%s], the parameter [%s]', who, slot, i, vs, ps), 2)
        end
        local t = pn.zeros_like(p)
        pn.no_grad(function() t:copy_(v) end)
        v = t
      elseif type(v) ~= 'number' then
        error(string.format('%s: %s of parameter %d is a %s', who, slot, i, type(v)), 2)
      end
      new[slot][i] = v
    end
  end
  for slot, t in pairs(new) do self[slot] = t end
  self.steps, self.lr = sd.steps or 0, sd.lr or self.lr
  return self
end

-- SGD(params, {lr, momentum=0, dampening=0, weight_decay=0, nesterov=false})
function optim.SGD(params, o)
  o = options.check('SGD', o, SGD_OPTS, 2)
  if not o.lr then error('SGD: lr is required', 2) end
  if o.nesterov and not ((o.momentum or 0) > 0 and (o.dampening or 0) == 0) then
    error(string.format('SGD: nesterov needs momentum > 0 and dampening 0, got momentum %s, dampening %s',
      tostring(o.momentum or 0), tostring(o.dampening or 0)), 2)
  end
  local self = setmetatable({ params = param_list(params), lr = o.lr, momentum = o.momentum or 0,
    dampening = o.dampening or 0, weight_decay = o.weight_decay or 0, nesterov = o.nesterov or false,
    bufs = {}, steps = 0, name = 'SGD' }, Optimizer)
  self.step = function(s)
    local hook = optim.grad_hook
    if hook then hook('read', s.params) end
    s.steps = s.steps + 1
    for i, p in ipairs(s.params) do
      local g = p.grad
      if g then
        local buf = s.bufs[i]
        local first = false
        if s.momentum ~= 0 and not buf then
          buf = pn.zeros_like(p); s.bufs[i] = buf; first = true
        end
        check(C.pn_sgd_step_(p, g, buf, s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov and 1 or 0,
          first and 1 or 0))
      end
    end
    if hook then hook('stepped', s.params) end
  end
  return self
end

local function adam(name, decoupled, default_wd)
  return function(params, o)
    o = options.check(name, o, ADAM_OPTS, 2)
    local betas = o.betas or { 0.9, 0.999 }
    for i = 1, 2 do
      local b = betas[i]
      if #betas ~= 2 or type(b) ~= 'number' or not (b >= 0 and b < 1) then
        error(name .. ': betas must be two numbers in [0, 1), got ' .. tostring(b) .. ' at ' .. i, 2)
      end
    end
    local self = setmetatable({ params = param_list(params), lr = o.lr or 1e-3, beta1 = betas[1], beta2 = betas[2],
      eps = o.eps or 1e-8, weight_decay = o.weight_decay or default_wd, m = {}, v = {}, t = {}, steps = 0,
      name = name }, Optimizer)
    self.step = function(s)
      local hook = optim.grad_hook
      if hook then hook('read', s.params) end
      s.steps = s.steps + 1
      for i, p in ipairs(s.params) do
        local g = p.grad
        if g then
          if not s.m[i] then
            s.m[i] = pn.zeros_like(p)
            s.v[i] = pn.zeros_like(p)
            s.t[i] = 0
          end
          s.t[i] = s.t[i] + 1
          check(C.pn_adam_step_(p, g, s.m[i], s.v[i], s.lr, s.beta1, s.beta2, s.eps, s.weight_decay,
            decoupled and 1 or 0, s.t[i]))
        end
      end
      if hook then hook('stepped', s.params) end
    end
    return self
  end
end
optim.Adam = adam('Adam', false, 0)
optim.AdamW = adam('AdamW', true, 1e-2)

-- Scales gradients in place so their global L2 norm is at most max_norm; returns the norm
-- before clipping.
function optim.clip_grad_norm(params, max_norm)
  params = param_list(params)
  -- a negative bound would flip every gradient's sign, a NaN one would never clip
  options.check_value('clip_grad_norm', 'max_norm', max_norm, { 'number', above = 0 }, 2)
  if optim.grad_hook then optim.grad_hook('read', params) end
  local total = 0
  local grads = {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g then
      grads[#grads + 1] = g
      local n = g:norm():item()
      total = total + n * n
    end
  end
  total = math.sqrt(total)
  if total > max_norm and total > 0 then
    local s = max_norm / (total + 1e-6)
    for _, g in ipairs(grads) do check(C.pn_scale_(g, s)) end
  end
  return total
end

-- Schedules: functions of the step (counting from 1) returning a multiplier of the base lr.
optim.schedules = {
  constant = function() return function() return 1 end end,
  linear_warmup = function(o)
    local w = o.warmup or 1
    return function(t) return math.min(1, t / w) end
  end,
  inverse_sqrt = function(o)
    local w = o.warmup or 1
    return function(t) return math.min(t / w, math.sqrt(w / t)) end
  end,
  cosine = function(o)
    local w, total, floor = o.warmup or 0, o.total, o.min or 0
    if not total then error('Scheduler cosine: total (the number of steps) is required', 0) end
    return function(t)
      if t <= w then return w > 0 and t / w or 1 end
      local prog = math.min(1, (t - w) / math.max(1, total - w))
      return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * prog))
    end
  end,
}

-- each schedule's options (warmup = 0 would divide by zero: lr 0 for ever under inverse_sqrt)
local SCHEDULE_OPTS = {
  constant = {}, linear_warmup = { warmup = { 'integer', min = 1 } }, inverse_sqrt = { warmup = { 'integer', min = 1 } },
  cosine = { warmup = { 'integer', min = 0 }, total = { 'integer', min = 1 }, min = { 'number', min = 0, max = 1 } },
}

-- Scheduler(opt, 'cosine', {total=…}): sch:step() sets opt.lr = base·f(t)
function optim.Scheduler(opt, kind, o)
  local f = optim.schedules[kind]
  if not f then
    local names = {}
    for k in pairs(optim.schedules) do names[#names + 1] = k end
    table.sort(names)
    error("Scheduler: unknown schedule '" .. tostring(kind) .. "' (" .. table.concat(names, ', ') .. ')', 2)
  end
  if type(opt) ~= 'table' or type(opt.lr) ~= 'number' then
    error('Scheduler: opt must be an optimiser (SGD, Adam, AdamW: a table with a number lr), got ' .. type(opt), 2)
  end
  if SCHEDULE_OPTS[kind] then options.check('Scheduler ' .. kind, o, SCHEDULE_OPTS[kind], 2) end
  local ok, fn = pcall(f, o or {})
  if not ok then error(fn, 2) end
  local s = { opt = opt, base = opt.lr, t = 0, fn = fn }
  function s.step(self_)
    self_.t = self_.t + 1
    self_.opt.lr = self_.base * self_.fn(self_.t)
    return self_.opt.lr
  end
  s:step()
  return s
end

return optim
