-- penumbra_ffi — the FFI layer. Loads libpenumbra, feeds it the preprocessed public
-- header (build/penumbra_ffi.h, made from core/penumbra.h by the build), and offers the
-- few helpers every Lua module uses to cross the boundary:
--   B.wrap(p)       owned pn_tensor* -> gc'd cdata, or a Lua error carrying pn_last_error()
--   B.check(status) PN_OK or a Lua error
--   B.dim(d, op)    Lua dim (1-based, negative from the end) -> C dim (0-based / negative)
--   B.int64s(tbl)   Lua list -> n, int64_t[n]
-- Nothing else in Lua calls ffi.gc on a tensor.
local ffi = require 'ffi'

local B = { ffi = ffi }

local function here()
  local src = debug.getinfo(1, 'S').source:sub(2)
  return src:match('^(.*)/[^/]*$') or '.'
end

local root = os.getenv('PENUMBRA_HOME') or (here() .. '/..')
local build = os.getenv('PENUMBRA_BUILD') or (root .. '/build')
B.root, B.build = root, build

local function read_file(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('*a')
  f:close()
  return s
end

local header = read_file(build .. '/penumbra_ffi.h')
if not header then
  error('penumbra: ' .. build .. '/penumbra_ffi.h not found; build first (./bench builds on demand)', 0)
end
ffi.cdef(header)
-- OpenBLAS (which libpenumbra links) picks its kernels as it loads: openblas_core says why we
-- may ask it for a kernel family first
local blas_core = require 'openblas_core'
local core_state = blas_core.before_load()
local ok, C = pcall(ffi.load, os.getenv('PENUMBRA_LIB') or (build .. '/libpenumbra.so'))
B.openblas_core = blas_core.after_load(core_state)
if not ok then error('penumbra: cannot load libpenumbra.so from ' .. build .. ': ' .. tostring(C), 0) end
B.C = C

local function last_error()
  return ffi.string(C.pn_last_error())
end
B.last_error = last_error

-- The GC does not see C memory: collect when live tensor bytes (host and device: the CUDA
-- allocator counts its blocks in pn_live_bytes too) have doubled since the last collection
-- (at least 256 MiB), so dropped tensors are freed in loops and their memory is reused while
-- still warm. A full collection walks every Lua object (a recipe holds its whole corpus as
-- tables), so the floor sets how often small models pay for one: at 64 MiB beam search over a
-- Multi30k batch collected at nearly every step, 13 % of its time (17.5 → 19.8 sentences/s at 256).
local GC_MIN = 256 * 2 ^ 20
local gc_threshold = GC_MIN
local function pressure()
  local live = tonumber(C.pn_live_bytes())
  if live > gc_threshold then
    collectgarbage('collect')
    live = tonumber(C.pn_live_bytes())
    gc_threshold = math.max(GC_MIN, 2 * live)
  end
end

-- The library's own source files, as LUA_PATH names them ('@<root>/bindings/…' and
-- '@<root>/lua/penumbra/…'): an error raised for the user's input names the first line outside
-- them (B.raise)
local LIB = {}
do
  local root = debug.getinfo(1, 'S').source:match('^@(.*)/bindings/[^/]*$')
  if root then LIB = { '@' .. root .. '/bindings/', '@' .. root .. '/lua/penumbra/' } end
end
local function in_library(src)
  for _, p in ipairs(LIB) do
    if src:sub(1, #p) == p then return true end
  end
  return false
end

-- error(msg) at the caller's line: the first frame outside the library, however many library
-- functions lie between (an op under a metamethod, a module's forward, a recipe) — a fixed
-- level cannot know, the more so as LuaJIT's tail calls leave no frame (`return wrap(C.op(…))`
-- put the error one level past the user's line). No position when every frame is the library's.
-- With `level` (as error()'s, counted from the function that calls raise), that frame is blamed
-- when it is a line outside the library, as a plain error(msg, level) would; a level that lands
-- inside the library or on no line falls back to the search (0: no position, as error's).
function B.raise(msg, level)
  if level == 0 then error(msg, 0) end
  if #LIB == 0 then error(msg, (level or 3) + 1) end -- loaded from elsewhere: the fixed level
  if level then
    local info = debug.getinfo(level + 1, 'S')
    if info and info.what ~= 'C' and not in_library(info.source) then error(msg, level + 1) end
  end
  local l = 2
  while true do
    local info = debug.getinfo(l, 'S')
    if not info then error(msg, 0) end
    if info.what ~= 'C' and not in_library(info.source) then error(msg, l) end
    l = l + 1
  end
end
local raise = B.raise

-- msg without a leading "file.lua:123: " position: a message printed or stored as the report
-- (./bench, a run file's error, a re-raised file error), where a line number says nothing
function B.unplaced(msg) return (tostring(msg):gsub('^[^%s:]+%.lua:%d+: ', '')) end

local release = C.pn_release
local NULL = nil
-- Tensors live in Lua as `pn_tensor &` (a reference), not `pn_tensor *`: LuaJIT applies
-- built-in pointer arithmetic to pointers before any metamethod (p + 2, p - q), while
-- arithmetic on references goes to the metatype's __add/__sub.
local tensor_ref = ffi.typeof('pn_tensor &')
function B.wrap(p)
  if p == NULL then raise(last_error()) end
  pressure()
  return ffi.gc(ffi.cast(tensor_ref, p), release)
end

-- For C calls that may legitimately return NULL without an error (pn_grad).
function B.wrap_or_nil(p)
  if p == NULL then return nil end
  return ffi.gc(ffi.cast(tensor_ref, p), release)
end

function B.check(status)
  if status ~= 0 then raise(last_error()) end
  return true
end

function B.dim(d, op)
  local who = op and (op .. ': ') or ''
  if type(d) ~= 'number' or d ~= math.floor(d) then
    raise(who .. 'expected an integer dim, got ' .. tostring(d))
  end
  if d > 0 then return d - 1 end
  if d < 0 then return d end
  raise(who .. 'dim 0 is invalid: dims are numbered from 1 (negative counts from the end)')
end

-- A 1-based position (narrow/select starts, get indices) → 0-based; negative counts from the
-- end and is passed on as it is; 0, fractions and non-numbers are errors naming op and what.
function B.position(op, what, v)
  if type(v) ~= 'number' or v ~= math.floor(v) or v ~= v then
    raise(op .. ': ' .. what .. ' must be a whole number, got ' .. tostring(v))
  end
  if v == 0 then
    raise(op .. ': ' .. what .. ' is 0: positions are numbered from 1 (negative counts from the end)')
  end
  return v > 0 and v - 1 or v
end

-- A Lua list of whole numbers → n, int64_t[n]. Fractions, NaN, non-numbers and values outside
-- the int64 range are errors (a silent truncation or wrap-around would be a wrong size or index).
local int64_arr = ffi.typeof('int64_t[?]')
function B.int64s(t, what)
  local n = #t
  local a = int64_arr(n > 0 and n or 1)
  for i = 1, n do
    local v = t[i]
    if type(v) ~= 'number' or v ~= math.floor(v) or v ~= v or v >= 2 ^ 63 or v < -2 ^ 63 then
      raise(string.format('expected whole numbers in %s; element %d is %s', what or 'the list', i, tostring(v)))
    end
    a[i - 1] = v
  end
  return n, a
end

B.dtypes = { f32 = C.PN_F32, f64 = C.PN_F64, i32 = C.PN_I32, i64 = C.PN_I64, u8 = C.PN_U8 }
B.dtype_names = { [0] = 'f32', 'f64', 'i32', 'i64', 'u8' }
B.devices = { cpu = C.PN_CPU, cuda = C.PN_CUDA }
B.device_names = { [0] = 'cpu', 'cuda' }

function B.dtype(name)
  if name == nil then return C.PN_F32 end
  local d = B.dtypes[name]
  if not d then raise("unknown dtype '" .. tostring(name) .. "' (f32, f64, i32, i64, u8)") end
  return d
end

function B.device(name)
  if name == nil then return C.PN_CPU end
  local d = B.devices[name]
  if not d then raise("unknown device '" .. tostring(name) .. "' (cpu, cuda)") end
  return d
end

B.tensor_ct = ffi.typeof('pn_tensor')
B.tensor_ptr_ct = ffi.typeof('pn_tensor *')

-- Declared once, by lua/penumbra/tensor.lua, after its method table is complete.
function B.metatype(mt)
  ffi.metatype(B.tensor_ct, mt)
end

function B.is_tensor(x)
  return type(x) == 'cdata' and (ffi.istype(B.tensor_ct, x) or ffi.istype(B.tensor_ptr_ct, x))
end

return B
