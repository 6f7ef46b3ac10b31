-- penumbra.nn — modules. The base class is in nn/module.lua; layers here; attention
-- layers in nn/attention.lua and nn/gat.lua.
local pn = require 'penumbra.tensor'
local raise = require('penumbra_ffi').raise -- input errors at the user's line (nn modules nest)
local base = require 'penumbra.nn.module'

local nn = { Module = base.Module, class = base.class }
local class = base.class

-- ---- initialisers (in place, no autograd) ------------------------------------------------
nn.init = {}

local function fans(t)
  local s = t:shape()
  if #s < 2 then return s[1] or 1, s[1] or 1 end
  local receptive = 1
  for i = 3, #s do receptive = receptive * s[i] end
  -- weight (out, in, ...): fan_in = in·receptive, fan_out = out·receptive
  return s[2] * receptive, s[1] * receptive
end

function nn.init.uniform_(t, lo, hi)
  local r = pn.rand_like(t)
  pn.no_grad(function() t:copy_(r * (hi - lo) + lo) end)
  return t
end

function nn.init.normal_(t, mean, std)
  local r = pn.randn_like(t)
  pn.no_grad(function() t:copy_(r * (std or 1) + (mean or 0)) end)
  return t
end

-- Glorot & Bengio: U(−a, a), a = gain·√(6/(fan_in+fan_out))
function nn.init.xavier_uniform_(t, gain)
  local fi, fo = fans(t)
  local a = (gain or 1) * math.sqrt(6 / (fi + fo))
  return nn.init.uniform_(t, -a, a)
end
nn.init.glorot_uniform_ = nn.init.xavier_uniform_

-- He et al.: U(−b, b), b = gain·√(3/fan_in), gain √2 for ReLU (a = 0 leaky slope)
function nn.init.kaiming_uniform_(t, a)
  local fi = fans(t)
  local gain = math.sqrt(2 / (1 + (a or 0) ^ 2))
  local b = gain * math.sqrt(3 / fi)
  return nn.init.uniform_(t, -b, b)
end

function nn.init.zeros_(t) pn.no_grad(function() t:zero_() end) return t end
function nn.init.ones_(t) pn.no_grad(function() t:fill_(1) end) return t end

-- ---- layers ---------------------------------------------------------------------------------
-- Linear(in, out, {bias=true, dtype='f32', init='xavier'|'kaiming', sparse_input=false}):
-- y = x Wᵀ + b, W (out, in); sparse_input: x is mostly zeros (2-D), multiply by its nonzeros
local options = require 'penumbra.options'
-- a layer's size argument (positional, so options.check cannot see it); level 4 blames the
-- caller of Layer(...) when called from an init, one more per helper in between
local function size_arg(who, what, v, level)
  if type(v) ~= 'number' or v % 1 ~= 0 or v < 1 then
    local got = (type(v) == 'number' or type(v) == 'string') and (tostring(v) .. ' (a ' .. type(v) .. ')') or ('a ' .. type(v))
    error(who .. ': ' .. what .. ' must be a positive whole number, got ' .. got, level or 4)
  end
end
nn.size_arg = size_arg

nn.Linear = class('Linear')
function nn.Linear:init(i, o, opts)
  opts = options.check('Linear', opts, { bias = 'boolean', dtype = 'string', sparse_input = 'boolean',
                                         init = { 'string', one_of = { 'xavier', 'kaiming' } } }, 3)
  size_arg('Linear', 'in_features', i)
  size_arg('Linear', 'out_features', o)
  self.in_features, self.out_features = i, o
  self.sparse_input = opts.sparse_input or false
  local w = pn.empty({ o, i }, { dtype = opts.dtype })
  if opts.init == 'kaiming' then nn.init.kaiming_uniform_(w, math.sqrt(5)) else nn.init.xavier_uniform_(w) end
  self:param('weight', w)
  if opts.bias ~= false then self:param('bias', pn.zeros({ o }, { dtype = opts.dtype })) end
end
function nn.Linear:forward(x)
  if not pn.is_tensor(x) or x:dim() == 0 or x:size(-1) ~= self.in_features then
    raise(string.format('Linear(%d → %d): x %s must have %d features in its last dim', self.in_features,
      self.out_features, pn.is_tensor(x) and ('[' .. table.concat(x:shape(), ',') .. ']') or type(x), self.in_features))
  end
  if self.sparse_input and x:dim() == 2 then
    local y = pn.matmul_sparse_lhs(x, self.weight:transpose(1, 2))
    if self.bias then y = y + self.bias end
    return y
  end
  return pn.linear(x, self.weight, self.bias)
end
function nn.Linear:extra_repr() return self.in_features .. ' → ' .. self.out_features end

nn.Embedding = class('Embedding')
function nn.Embedding:init(n, d, opts)
  opts = options.check('Embedding', opts, { dtype = 'string', std = { 'number', above = 0 } }, 3)
  size_arg('Embedding', 'num_embeddings', n)
  size_arg('Embedding', 'dim', d)
  self.num, self.dim = n, d
  self:param('weight', nn.init.normal_(pn.empty({ n, d }, { dtype = opts.dtype }), 0, opts.std or 1))
end
function nn.Embedding:forward(idx) return pn.embedding(self.weight, idx) end
function nn.Embedding:extra_repr() return self.num .. ' × ' .. self.dim end

nn.LayerNorm = class('LayerNorm')
function nn.LayerNorm:init(d, opts)
  opts = options.check('LayerNorm', opts, { dtype = 'string', eps = { 'number', min = 0 } }, 3)
  size_arg('LayerNorm', 'dim', d)
  self.eps = opts.eps or 1e-5
  self.dim = d
  self:param('weight', pn.ones({ d }, { dtype = opts.dtype }))
  self:param('bias', pn.zeros({ d }, { dtype = opts.dtype }))
end
function nn.LayerNorm:forward(x) return pn.layer_norm(x, self.weight, self.bias, self.eps) end
function nn.LayerNorm:extra_repr() return tostring(self.dim) end

nn.Dropout = class('Dropout')
function nn.Dropout:init(p)
  if p ~= nil and (type(p) ~= 'number' or not (p >= 0 and p < 1)) then
    error('Dropout: p must be a number in [0, 1), got ' .. tostring(p), 3)
  end
  self.p = p or 0.5
end
function nn.Dropout:forward(x) return pn.dropout(x, self.p, self.training) end
function nn.Dropout:extra_repr() return 'p=' .. self.p end

nn.Sequential = class('Sequential')
function nn.Sequential:init(...)
  for i, m in ipairs({ ... }) do self:add(tostring(i), m) end
end
function nn.Sequential:forward(x, ...)
  for _, m in ipairs(self:children()) do x = m(x, ...) end
  return x
end

-- activations as modules
local function activation(name, fn)
  local cls = class(name)
  function cls:init(a) self.a = a end
  function cls:forward(x) return fn(x, self.a) end
  return cls
end
nn.ReLU = activation('ReLU', function(x) return x:relu() end)
nn.ELU = activation('ELU', function(x, a) return x:elu(a or 1) end)
nn.GELU = activation('GELU', function(x) return x:gelu() end)
nn.Tanh = activation('Tanh', function(x) return x:tanh() end)
nn.Sigmoid = activation('Sigmoid', function(x) return x:sigmoid() end)
nn.LeakyReLU = activation('LeakyReLU', function(x, a) return x:leaky_relu(a or 0.01) end)
nn.Identity = activation('Identity', function(x) return x end)

-- attention layers (need pn.attention / pn.graph_attention)
for _, name in ipairs({ 'attention', 'gat', 'linear_attention', 'recursive', 'transformer', 'translate' }) do
  require('penumbra.nn.' .. name)(nn, pn)
end

return nn
