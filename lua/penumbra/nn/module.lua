-- penumbra.nn.module — the Module base: parameters in registration order, children,
-- train/eval, zero_grad, state_dict to and from tables and HDF5.
--
--   local Linear = nn.class('Linear')
--   function Linear:init(i, o) self:param('weight', pn.randn(o, i)) end
--   function Linear:forward(x) return x:matmul(self.weight:t()) end
--   local m = Linear(3, 4); local y = m(x)
local pn = require 'penumbra.tensor'

local Module = {}
Module.__index = Module

-- A class: calling it constructs an instance and runs :init(...); instances are callable
-- (forward). Classes may derive: nn.class('GAT', Base).
local function class(name, base)
  base = base or Module
  local cls = {}
  cls.__index = cls
  cls.__name = name
  cls.__call = function(self, ...) return self:forward(...) end
  cls.__tostring = function(self) return self:describe() end
  setmetatable(cls, {
    __index = base,
    __call = function(c, ...)
      local self = setmetatable({ _params = {}, _param_order = {}, _children = {}, _child_order = {},
                                  training = true }, c)
      self:init(...)
      return self
    end,
  })
  return cls
end

function Module:init() end
function Module:forward() error(self.__name .. ': forward is not implemented', 2) end

-- Register a parameter (requires grad) under name; accessible as self[name].
function Module:param(name, t)
  if not pn.is_tensor(t) then error(self.__name .. ':param(' .. name .. '): expected a tensor', 2) end
  if not self._params[name] then self._param_order[#self._param_order + 1] = name end
  t = t:detach():requires_grad_()
  self._params[name] = t
  self[name] = t
  return t
end

function Module:add(name, m)
  if not self._children[name] then self._child_order[#self._child_order + 1] = name end
  self._children[name] = m
  self[name] = m
  return m
end

function Module:children()
  local r = {}
  for _, n in ipairs(self._child_order) do r[#r + 1] = self._children[n] end
  return r
end

-- list of { name, tensor } with dotted paths, depth-first in registration order
function Module:named_parameters(prefix, out)
  out = out or {}
  prefix = prefix or ''
  for _, n in ipairs(self._param_order) do out[#out + 1] = { prefix .. n, self._params[n] } end
  for _, c in ipairs(self._child_order) do self._children[c]:named_parameters(prefix .. c .. '.', out) end
  return out
end

function Module:parameters()
  local r = {}
  for i, np in ipairs(self:named_parameters()) do r[i] = np[2] end
  return r
end

function Module:num_parameters()
  local n = 0
  for _, p in ipairs(self:parameters()) do n = n + p:numel() end
  return n
end

-- Every parameter of the module and its children converted to a dtype ('f64' for gradchecks)
-- or moved to a device ('cuda', 'cpu'), in place of the old ones (gradients and optimiser state
-- are not carried over: move the model before making its optimiser). Returns self.
function Module:to(what)
  for _, n in ipairs(self._param_order) do
    local t = self._params[n]
    if t:dtype() ~= what and t:device() ~= what then self:param(n, t:detach():to(what)) end
  end
  for _, c in ipairs(self._child_order) do self._children[c]:to(what) end
  return self
end

function Module:train(mode)
  if mode == nil then mode = true end
  if type(mode) ~= 'boolean' then error('train: mode must be true or false, got ' .. tostring(mode), 2) end
  self.training = mode
  for _, c in ipairs(self:children()) do c:train(mode) end
  return self
end
function Module:eval() return self:train(false) end

function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p:zero_grad() end
end

function Module:state_dict()
  local sd = {}
  for _, np in ipairs(self:named_parameters()) do sd[np[1]] = np[2]:detach():clone() end
  return sd
end

-- Copies values in place (parameters keep their identity, so optimisers stay attached).
function Module:load_state_dict(sd, strict)
  if strict == nil then strict = true end
  local seen = {}
  for _, np in ipairs(self:named_parameters()) do
    local name, p = np[1], np[2]
    local v = sd[name]
    if v == nil then
      if strict then error('load_state_dict: missing parameter ' .. name, 2) end
    else
      local ps, vs = table.concat(p:shape(), ','), table.concat(v:shape(), ',')
      if ps ~= vs then error('load_state_dict: ' .. name .. ' has shape [' .. vs .. '], the module expects [' .. ps .. ']', 2) end
      pn.no_grad(function() p:copy_(v) end)
      seen[name] = true
    end
  end
  if strict then
    for k in pairs(sd) do
      if not seen[k] then error('load_state_dict: unexpected parameter ' .. k, 2) end
    end
  end
  return self
end

-- HDF5: parameters under group/<dotted name> (dots become '/')
function Module:save(path, group)
  group = group or 'params'
  local io_ = require 'penumbra.io'
  local t = {}
  for name, v in pairs(self:state_dict()) do t[group .. '/' .. name:gsub('%.', '/')] = v end
  io_.save(path, t)
end

function Module:load(path, group)
  group = group or 'params'
  local io_ = require 'penumbra.io'
  local sd = {}
  for _, np in ipairs(self:named_parameters()) do
    local key = group .. '/' .. np[1]:gsub('%.', '/')
    sd[np[1]] = io_.load(path, key)
  end
  return self:load_state_dict(sd)
end

function Module:describe(indent)
  indent = indent or ''
  local lines = { (self.__name or 'Module') .. (self.extra_repr and ('(' .. self:extra_repr() .. ')') or '') }
  for _, n in ipairs(self._child_order) do
    lines[#lines + 1] = indent .. '  (' .. n .. '): ' .. self._children[n]:describe(indent .. '  ')
  end
  return table.concat(lines, '\n')
end

return { Module = Module, class = class }
