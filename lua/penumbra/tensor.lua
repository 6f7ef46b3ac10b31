-- penumbra.tensor — the tensor type seen from Lua: creation, geometry, views, autograd
-- entry points, printing. Op groups live in penumbra/ops/*.lua; each is a function
-- (pn, M, B) that adds to the module table pn and the method table M. The metatype is
-- declared once, at the end, when M is complete.
local B = require 'penumbra_ffi'
local ffi, C = B.ffi, B.C
local wrap, check, dim = B.wrap, B.check, B.dim

local pn = {}
local M = {}   -- tensor methods

-- ---- helpers shared by the op modules ----------------------------------------------
local double_arr = ffi.typeof('double[?]')

local function is_tensor(x) return B.is_tensor(x) end
pn.is_tensor = is_tensor

-- shape from a table {2,3} or from numbers pn.zeros(2, 3, opts): returns shape table, rest
local function shape_args(...)
  local a = ...
  if type(a) == 'table' and not is_tensor(a) then return a, select(2, ...) end
  local shape, n = {}, select('#', ...)
  local i = 1
  while i <= n do
    local v = select(i, ...)
    if type(v) ~= 'number' then break end
    shape[#shape + 1] = v
    i = i + 1
  end
  return shape, select(i, ...)
end
pn._shape_args = shape_args

local function check_shape(op, shape)
  for i, s in ipairs(shape) do
    if type(s) ~= 'number' or s ~= math.floor(s) then
      error(op .. ': size ' .. tostring(s) .. ' at position ' .. i .. ' is not an integer', 3)
    end
    if s >= 2 ^ 63 then
      error(op .. ': size ' .. string.format('%.0f', s) .. ' at position ' .. i .. ' is too large', 3)
    end
    if s < 0 then -- here, not in C: randn's buffer would be named 'empty' there
      error(string.format('%s: negative size %.0f at dim %d in shape [%s]', op, s, i, table.concat(shape, ',')), 3)
    end
  end
end

-- number or tensor -> tensor (numbers take like's dtype and become 0-dim)
local function as_tensor(x, like)
  if is_tensor(x) then return x end
  if type(x) == 'number' then
    local dt = like and like.dt or C.PN_F32
    return wrap(C.pn_full(0, nil, x, dt, like and like.dev or 0))
  end
  if type(x) == 'boolean' then
    return wrap(C.pn_full(0, nil, x and 1 or 0, C.PN_U8, like and like.dev or 0))
  end
  if type(x) == 'table' then
    return pn.tensor(x, like and { dtype = B.dtype_names[like.dt], device = B.device_names[like.dev] } or nil)
  end
  error('expected a tensor or a number, got ' .. type(x), 3)
end
pn._as_tensor = as_tensor

-- list of tensors -> n, pn_tensor*[n]
local tensor_ptr_arr = ffi.typeof('pn_tensor *[?]')
function pn._tensor_array(list)
  local n = #list
  local a = tensor_ptr_arr(n > 0 and n or 1)
  for i = 1, n do
    if not is_tensor(list[i]) then error('expected a list of tensors; element ' .. i .. ' is ' .. type(list[i]), 3) end
    a[i - 1] = list[i]
  end
  return n, a
end

-- dims argument: nil (all), a number, or a list -> n, int64_t[n] of C dims
function pn._dims(d, op)
  if d == nil then return 0, nil end
  if type(d) == 'number' then d = { d } end
  local c = {}
  for i, v in ipairs(d) do c[i] = dim(v, op) end
  return B.int64s(c)
end

-- ---- creation ------------------------------------------------------------------------
-- Options tables go through the one checker (penumbra.options): a typo ({dtpye='f64'}) is an
-- error listing the valid keys instead of a silent f32 default, and values are type-checked.
local options = require 'penumbra.options'
local function check_opts(op, o, spec, level)
  local r = options.check(op, o, spec, (level or 1) + 1) -- not a tail call: the level counts this frame
  return r
end
pn._check_opts = check_opts

-- (dtype and device names are checked where they are looked up, with their own messages)
local CREATE_KEYS = { dtype = 'string', device = 'string', requires_grad = 'boolean' }
local LIKE_KEYS = options.with(CREATE_KEYS, { shape = 'table' })

local function finish(t, o)
  if o.requires_grad then check(C.pn_set_requires_grad(t, 1)) end
  return t
end

-- one body for every creator: kind is 'full' (value used) or a key of FILL
local FILL = { empty = C.pn_empty, zeros = C.pn_zeros, rand = C.pn_rand, randn = C.pn_randn }
local function make(op, kind, shape, value, o)
  check_shape(op, shape)
  local n, a = B.int64s(shape)
  local dt, dev = B.dtype(o.dtype), B.device(o.device)
  if kind == 'full' then return finish(wrap(C.pn_full(n, a, value, dt, dev)), o) end
  return finish(wrap(FILL[kind](n, a, dt, dev)), o)
end

-- pn.empty / zeros / rand / randn: (shape table or numbers [, opts]) → tensor
for kind in pairs(FILL) do
  pn[kind] = function(...)
    local shape, o = shape_args(...)
    return make(kind, kind, shape, nil, check_opts(kind, o, CREATE_KEYS, 2))
  end
end

local function full_value(op, value)
  if type(value) ~= 'number' then error(op .. ': value must be a number, got ' .. type(value), 3) end
  return value
end

function pn.full(shape, value, o)
  if type(shape) == 'number' then shape = { shape } end
  return make('full', 'full', shape, full_value('full', value), check_opts('full', o, CREATE_KEYS, 2))
end

function pn.ones(...)
  local shape, o = shape_args(...)
  return make('ones', 'full', shape, 1, check_opts('ones', o, CREATE_KEYS, 2))
end

-- pn.zeros_like(x [, opts]) … pn.full_like(x, value [, opts]): a new tensor with x's shape,
-- dtype AND device (a "like x" buffer on the GPU must stay there), not x's values, graph or
-- requires_grad; opts {dtype=, device=, shape=, requires_grad=} override.
local function like(op, kind, x, value, o)
  if not is_tensor(x) then error(op .. ': x must be a tensor, got ' .. type(x), 3) end
  o = check_opts(op, o, LIKE_KEYS, 3)
  local shape = o.shape
  if shape == nil then
    shape = {}
    for i = 0, x.nd - 1 do shape[i + 1] = tonumber(x.sizes[i]) end
  elseif type(shape) ~= 'table' then
    error(op .. ': shape must be a table of sizes, got ' .. type(shape), 3)
  end
  local co = { dtype = o.dtype or B.dtype_names[x.dt], device = o.device or B.device_names[x.dev],
               requires_grad = o.requires_grad }
  return make(op, kind, shape, value, co)
end
-- (not tail calls: like's error level counts the caller's frame, which a tail call drops)
for kind in pairs(FILL) do
  pn[kind .. '_like'] = function(x, o) local t = like(kind .. '_like', kind, x, nil, o) return t end
end
function pn.ones_like(x, o) local t = like('ones_like', 'full', x, 1, o) return t end
function pn.full_like(x, value, o) local t = like('full_like', 'full', x, full_value('full_like', value), o) return t end

-- pn.arange(n) | pn.arange(start, end [, step] [, opts])
function pn.arange(a, b, c, o)
  if type(b) == 'table' then o, b = b, nil end
  if type(c) == 'table' then o, c = c, nil end
  local start, stop, step = 0, a, 1
  if b ~= nil then start, stop, step = a, b, c or 1 end
  o = check_opts('arange', o, CREATE_KEYS, 2)
  local dt = o.dtype
  if dt == nil then
    local all_int = start % 1 == 0 and stop % 1 == 0 and step % 1 == 0
    dt = all_int and 'i64' or 'f32'
  end
  return finish(wrap(C.pn_arange(start, stop, step, B.dtype(dt), B.device(o.device))), o)
end

function pn.manual_seed(n)
  if type(n) ~= 'number' or n < 0 or n % 1 ~= 0 then error('manual_seed: expected a non-negative integer, got ' .. tostring(n), 2) end
  C.pn_manual_seed(n)
end

-- the tensor RNG's position as two decimal strings {seed, offset} (uint64: exact, unlike a
-- double past 2^53), and back: a run's resume state carries it (penumbra/experiment.lua)
function pn.rng_state()
  local s, o = ffi.new('uint64_t[1]'), ffi.new('uint64_t[1]')
  C.pn_rng_state(s, o)
  return { (tostring(s[0]):gsub('ULL$', '')), (tostring(o[0]):gsub('ULL$', '')) }
end
function pn.set_rng_state(st)
  if type(st) ~= 'table' then error('set_rng_state: expected {seed, offset} as from pn.rng_state(), got ' .. type(st), 2) end
  local v = {}
  for i, what in ipairs({ 'seed', 'offset' }) do
    local d = st[i]
    if type(d) ~= 'string' or not d:match('^%d+$') or #d > 20 then
      error(string.format('set_rng_state: %s (%d) must be a string of decimal digits, got %s', what, i, tostring(d)), 2)
    end
    local r = ffi.new('uint64_t', 0)
    for k = 1, #d do r = r * 10ULL + (d:byte(k) - 48) end
    if #d == 20 and d > '18446744073709551615' then error('set_rng_state: ' .. what .. ' is past 2^64: ' .. d, 2) end
    v[i] = r
  end
  C.pn_set_rng_state(v[1], v[2])
end



-- nested Lua table -> tensor. Shape from the nesting; ragged nesting is an error.
local function infer_nested(x, shape, depth)
  if type(x) == 'table' then
    local n = #x
    if shape[depth] == nil then shape[depth] = n
    elseif shape[depth] ~= n then
      error('tensor: ragged nested table (dim ' .. depth .. ' has lengths ' .. shape[depth] .. ' and ' .. n .. ')', 4)
    end
    for i = 1, n do infer_nested(x[i], shape, depth + 1) end
  elseif type(x) == 'number' or type(x) == 'boolean' then
    if shape[depth] ~= nil then error('tensor: ragged nested table (a number where a list was expected at dim ' .. depth .. ')', 4) end
  else
    error('tensor: unsupported element of type ' .. type(x), 4)
  end
end

local INT_RANGE = { [C.PN_I32] = { -2 ^ 31, 2 ^ 31 - 1 }, [C.PN_I64] = { -2 ^ 53, 2 ^ 53 }, [C.PN_U8] = { 0, 255 } }

function pn.tensor(x, o)
  o = check_opts('tensor', o, CREATE_KEYS, 2)
  if is_tensor(x) then
    local t = pn.from_tensor_copy(x, o)
    return finish(t, o)
  end
  local scalar = false
  if type(x) == 'number' or type(x) == 'boolean' then x = { x }; scalar = true end
  if type(x) ~= 'table' then error('tensor: expected a nested table of numbers, got ' .. type(x), 2) end
  local shape = {}
  infer_nested(x, shape, 1)
  local flat, k = {}, 0
  local function flatten(v)
    if type(v) == 'table' then
      for i = 1, #v do flatten(v[i]) end
    else
      k = k + 1
      flat[k] = (v == true and 1) or (v == false and 0) or v
    end
  end
  flatten(x)
  if scalar then shape = {} end
  local dt = B.dtype(o.dtype)
  -- an integer dtype holds whole numbers in its range: anything else would be truncated or
  -- wrapped silently (i64 beyond ±2^53: a Lua number no longer holds every integer exactly)
  local range = INT_RANGE[dt]
  local buf = double_arr(k > 0 and k or 1)
  for i = 1, k do
    local v = flat[i]
    if type(v) ~= 'number' then error('tensor: element ' .. i .. ' is a ' .. type(v) .. ', not a number', 2) end
    if range and (v ~= math.floor(v) or v < range[1] or v > range[2]) then
      error(string.format('tensor: element %d is %s, which %s cannot hold (whole numbers in [%.0f, %.0f])', i,
        tostring(v), B.dtype_names[dt], range[1], range[2]), 2)
    end
    buf[i - 1] = v
  end
  local n, a = B.int64s(shape)
  local t64 = wrap(C.pn_from_buffer(n, a, C.PN_F64, buf))
  local t = t64
  if dt ~= C.PN_F64 then t = wrap(C.pn_to_dtype(t64, dt)) end
  if o.device and o.device ~= 'cpu' then t = t:to(o.device) end
  return finish(t, o)
end

function pn.from_tensor_copy(x, o)
  local t = wrap(C.pn_clone(x))
  t = wrap(C.pn_detach(t))
  if o.dtype then t = wrap(C.pn_to_dtype(t, B.dtype(o.dtype))) end
  if o.device then t = t:to(o.device) end
  return t
end

-- raw buffers: pn.from_buffer(ptr, shape, dtype) copies; t:to_buffer(ptr, nbytes) copies out
function pn.from_buffer(ptr, shape, dtype)
  local n, a = B.int64s(shape)
  return wrap(C.pn_from_buffer(n, a, B.dtype(dtype), ptr))
end
function M.to_buffer(t, ptr, nbytes)
  return check(C.pn_to_buffer(t, ptr, nbytes or (tonumber(C.pn_numel(t)) * C.pn_dtype_size(t.dt))))
end
function M.data_ptr(t) return C.pn_data_ptr(t) end

-- ---- geometry ------------------------------------------------------------------------
function M.shape(t)
  local s = {}
  for i = 0, t.nd - 1 do s[i + 1] = tonumber(t.sizes[i]) end
  return s
end
function M.size(t, d)
  if d == nil then return M.shape(t) end
  local c = dim(d, 'size')
  if c < 0 then c = c + t.nd end
  if c < 0 or c >= t.nd then error('size: dim ' .. d .. ' out of range for a tensor with ' .. t.nd .. ' dims', 2) end
  return tonumber(t.sizes[c])
end
function M.stride(t)
  local s = {}
  for i = 0, t.nd - 1 do s[i + 1] = tonumber(t.strides[i]) end
  return s
end
function M.dim(t) return t.nd end
function M.numel(t) return tonumber(C.pn_numel(t)) end
function M.dtype(t) return B.dtype_names[t.dt] end
function M.device(t) return B.device_names[t.dev] end
function M.is_contiguous(t) return C.pn_is_contiguous(t) ~= 0 end
function M.is_floating_point(t) return t.dt == C.PN_F32 or t.dt == C.PN_F64 end

-- t:to('f64') / t:to('cuda') / t:to{dtype=..., device=...}
function M.to(t, what)
  if type(what) == 'table' then
    local r = t
    if what.dtype then r = M.to(r, what.dtype) end
    if what.device then r = M.to(r, what.device) end
    return r
  end
  if B.dtypes[what] then return wrap(C.pn_to_dtype(t, B.dtypes[what])) end
  if B.devices[what] then return wrap(C.pn_to_device(t, B.devices[what])) end
  B.raise("to: unknown dtype or device '" .. tostring(what) .. "' (f32, f64, i32, i64, u8; cpu, cuda)")
end
function M.float(t) return M.to(t, 'f32') end
function M.double(t) return M.to(t, 'f64') end
function M.long(t) return M.to(t, 'i64') end
function M.int(t) return M.to(t, 'i32') end
function M.byte(t) return M.to(t, 'u8') end

-- all elements as a flat Lua array of numbers (row-major)
local function flat_values(t)
  local n = tonumber(C.pn_numel(t))
  local t64 = t
  if t.dt ~= C.PN_F64 then t64 = wrap(C.pn_to_dtype(t, C.PN_F64)) end
  local buf = double_arr(n > 0 and n or 1)
  check(C.pn_to_buffer(t64, buf, n * 8))
  return buf, n
end
pn._flat_values = flat_values

function M.totable(t)
  local buf = flat_values(t)
  local shape = M.shape(t)
  if #shape == 0 then return buf[0] end
  local pos = 0
  local function build(d)
    local r = {}
    if d == #shape then
      for i = 1, shape[d] do r[i] = buf[pos]; pos = pos + 1 end
    else
      for i = 1, shape[d] do r[i] = build(d + 1) end
    end
    return r
  end
  return build(1)
end

function M.item(t)
  local v = double_arr(1)
  check(C.pn_item(t, v))
  return v[0]
end

-- element at a 1-based index: t:get(i, j, ...)
function M.get(t, ...)
  local idx = { ... }
  if #idx ~= t.nd then error('get: ' .. #idx .. ' indices for a tensor with ' .. t.nd .. ' dims', 2) end
  for i = 1, #idx do
    idx[i] = B.position('get', 'index ' .. i, idx[i])
    if idx[i] < 0 then idx[i] = idx[i] + tonumber(t.sizes[i - 1]) end
  end
  local _, a = B.int64s(idx)
  local v = double_arr(1)
  check(C.pn_get(t, a, v))
  return v[0]
end

-- ---- views ------------------------------------------------------------------------------
function M.view(t, ...)
  local shape = shape_args(...)
  local n, a = B.int64s(shape)
  return wrap(C.pn_view(t, n, a))
end
function M.reshape(t, ...)
  local shape = shape_args(...)
  local n, a = B.int64s(shape)
  return wrap(C.pn_reshape(t, n, a))
end
function M.permute(t, ...)
  local p = shape_args(...)
  local c = {}
  for i, d in ipairs(p) do c[i] = dim(d, 'permute') end
  local n, a = B.int64s(c)
  return wrap(C.pn_permute(t, n, a))
end
function M.transpose(t, a, b)
  return wrap(C.pn_transpose(t, dim(a or -2, 'transpose'), dim(b or -1, 'transpose')))
end
M.t = function(t) return M.transpose(t, 1, 2) end
-- narrow(dim, start, length): start is 1-based like every Lua index
function M.narrow(t, d, start, length)
  if type(length) ~= 'number' or length ~= math.floor(length) then
    error('narrow: length must be a whole number, got ' .. tostring(length), 2)
  end
  return wrap(C.pn_narrow(t, dim(d, 'narrow'), B.position('narrow', 'start', start), length))
end
-- slice(dim, first, last): inclusive 1-based range, negative counts from the end
function M.slice(t, d, first, last)
  local size = M.size(t, d)
  first = first or 1
  last = last or size
  first = B.position('slice', 'first', first) + (first < 0 and size or 0) + 1
  last = B.position('slice', 'last', last) + (last < 0 and size or 0) + 1
  return wrap(C.pn_narrow(t, dim(d, 'slice'), first - 1, math.max(0, last - first + 1)))
end
function M.select(t, d, index)
  return wrap(C.pn_select(t, dim(d, 'select'), B.position('select', 'index', index)))
end
function M.squeeze(t, d)
  return wrap(C.pn_squeeze(t, d == nil and C.PN_ALL_DIMS or dim(d, 'squeeze')))
end
function M.unsqueeze(t, d)
  -- unsqueeze(1) puts the new dim first; unsqueeze(-1) last (torch semantics shifted to 1-based)
  return wrap(C.pn_unsqueeze(t, dim(d, 'unsqueeze')))
end
function M.expand(t, ...)
  local shape = shape_args(...)
  local n, a = B.int64s(shape)
  return wrap(C.pn_expand(t, n, a))
end
function M.expand_as(t, o) return M.expand(t, M.shape(o)) end
function M.flatten(t) return M.reshape(t, { -1 }) end
function M.contiguous(t) return wrap(C.pn_contiguous(t)) end
function M.clone(t) return wrap(C.pn_clone(t)) end

-- ---- in place, never recorded (initialisers, optimisers) -------------------------------------
function M.copy_(t, src)
  check(C.pn_copy_(t, as_tensor(src, t)))
  return t
end
function M.fill_(t, v)
  check(C.pn_fill_(t, v))
  return t
end
function M.zero_(t) return M.fill_(t, 0) end

-- ---- autograd -------------------------------------------------------------------------------
function M.requires_grad_(t, flag)
  if flag == nil then flag = true end
  check(C.pn_set_requires_grad(t, flag and 1 or 0))
  return t
end
-- Data parallelism (penumbra/ddp.lua) sets pn.backward_hook while the runner trains across ranks:
-- hook(run) runs the backward (run()) between its reducer's arm and finish, so the gradients go
-- to the other ranks while the backward makes them. nil elsewhere.
pn.backward_hook = nil
function M.backward(t, g, opts)
  if type(g) == 'table' and not is_tensor(g) then opts, g = g, nil end
  opts = opts or {}
  local retain = opts.retain_graph and 1 or 0
  local hook = pn.backward_hook
  if hook then return hook(function() check(C.pn_backward(t, g, retain)) end) end
  check(C.pn_backward(t, g, retain))
end
function M.detach(t) return wrap(C.pn_detach(t)) end
function M.zero_grad(t) check(C.pn_set_grad(t, nil)) end
function M.set_grad(t, g) check(C.pn_set_grad(t, g)) end
function M.grad_fn(t) return ffi.string(C.pn_grad_fn_name(t)) end
function M.is_leaf(t) return t.fn == nil end

local function pack(...) return { n = select('#', ...), ... } end
function pn.no_grad(fn, ...)
  local prev = C.pn_set_grad_enabled(0)
  local res = pack(pcall(fn, ...))
  C.pn_set_grad_enabled(prev)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end
function pn.grad_enabled() return C.pn_grad_enabled() ~= 0 end

-- Grad mode belongs to the coroutine that set it: a coroutine that yields inside pn.no_grad
-- must not leave its resumer running without gradients. resume/wrap swap the mode in and out
-- (the C flag is one global; a coroutine starts with its resumer's mode).
do
  local modes = setmetatable({}, { __mode = 'k' }) -- suspended coroutine -> its grad mode
  local raw_resume, raw_create = coroutine.resume, coroutine.create
  function coroutine.resume(co, ...)
    local caller = C.pn_grad_enabled()
    local own = modes[co]
    if own ~= nil then C.pn_set_grad_enabled(own) end
    local r = pack(raw_resume(co, ...))
    modes[co] = C.pn_grad_enabled()
    C.pn_set_grad_enabled(caller)
    return unpack(r, 1, r.n)
  end
  function coroutine.wrap(f)
    local co = raw_create(f)
    return function(...)
      local r = pack(coroutine.resume(co, ...))
      if not r[1] then error(r[2], 0) end
      return unpack(r, 2, r.n)
    end
  end
end
function pn.set_grad_enabled(on) return C.pn_set_grad_enabled(on and 1 or 0) ~= 0 end

-- ---- printing --------------------------------------------------------------------------------
local function fmt_number(v, is_float, width_info)
  if not is_float then return string.format('%d', v) end
  if v ~= v then return 'nan' end
  if v == math.huge then return 'inf' end
  if v == -math.huge then return '-inf' end
  if width_info.sci then return string.format('%.4e', v) end
  return string.format('%.4f', v)
end

local SUMMARY_AT = 1000  -- elements; beyond this, print edges only (3 per dim)
local EDGE = 3

function M.__tostring(t)
  local shape = M.shape(t)
  local is_float = M.is_floating_point(t)
  local buf, n = flat_values(t)
  local info = { sci = false }
  if is_float then
    local maxabs, minabs = 0, math.huge
    for i = 0, n - 1 do
      local a = math.abs(buf[i])
      if a == a and a ~= math.huge then
        if a > maxabs then maxabs = a end
        if a > 0 and a < minabs then minabs = a end
      end
    end
    info.sci = maxabs >= 1e6 or (minabs < 1e-4 and maxabs > 0)
  end
  local strs, width = {}, 0
  for i = 0, n - 1 do
    local s = fmt_number(buf[i], is_float, info)
    strs[i] = s
    if #s > width then width = #s end
  end
  local summarize = n > SUMMARY_AT
  local strides = {}
  local acc = 1
  for d = #shape, 1, -1 do strides[d] = acc; acc = acc * shape[d] end
  local function rec(d, base, indent)
    if d > #shape then return string.rep(' ', width - #strs[base]) .. strs[base] end
    local parts = {}
    local size = shape[d]
    local function add(i) parts[#parts + 1] = rec(d + 1, base + (i - 1) * strides[d], indent .. ' ') end
    if summarize and size > 2 * EDGE then
      for i = 1, EDGE do add(i) end
      parts[#parts + 1] = '...'
      for i = size - EDGE + 1, size do add(i) end
    else
      for i = 1, size do add(i) end
    end
    local sep = d == #shape and ', ' or (',' .. string.rep('\n', #shape - d) .. indent .. ' ')
    return '[' .. table.concat(parts, sep) .. ']'
  end
  local body = #shape == 0 and strs[0] or rec(1, 0, '       ')
  local extra = { 'dtype=' .. M.dtype(t) }
  if #shape > 0 then extra[#extra + 1] = 'shape=[' .. table.concat(shape, ',') .. ']' end
  if t.dev ~= 0 then extra[#extra + 1] = 'device=' .. M.device(t) end
  if t.fn ~= nil then extra[#extra + 1] = 'grad_fn=' .. M.grad_fn(t)
  elseif t.req_grad ~= 0 then extra[#extra + 1] = 'requires_grad=true' end
  return 'tensor(' .. body .. ', ' .. table.concat(extra, ', ') .. ')'
end

-- ---- op groups -----------------------------------------------------------------------------------
-- Each file in lua/penumbra/ops/ adds its functions; listed here so load order is fixed.
local OP_MODULES = { 'elementwise', 'reduce', 'matmul', 'nn', 'index', 'shape', 'loss', 'linear', 'maps', 'graph', 'attention' }
for _, name in ipairs(OP_MODULES) do
  require('penumbra.ops.' .. name)(pn, M, B)
end

-- ---- the metatype (declared once, M complete) ---------------------------------------------------
local mt = {
  __tostring = M.__tostring,
  __len = function(t) return t.nd > 0 and tonumber(t.sizes[0]) or 0 end,
  __index = function(t, k)
    if k == 'grad' then return B.wrap_or_nil(C.pn_grad(t)) end
    if k == 'requires_grad' then return C.pn_requires_grad(t) ~= 0 end
    local m = M[k]
    if m == nil then error("tensor has no method or field '" .. tostring(k) .. "'", 2) end
    return m
  end,
  __newindex = function(t, k, v)
    if k == 'grad' then check(C.pn_set_grad(t, v)); return end
    error("cannot set field '" .. tostring(k) .. "' of a tensor", 2)
  end,
}
for _, op in ipairs({ '__add', '__sub', '__mul', '__div', '__unm', '__pow', '__concat' }) do
  if M[op] then mt[op] = M[op] end
end
B.metatype(mt)

pn._methods = M
return pn
