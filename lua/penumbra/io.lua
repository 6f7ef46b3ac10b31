-- penumbra.io — HDF5 files (core/io/h5.c), as pn.io.
--
--   pn.io.save(path, {name = tensor, ...} [, {gzip = 1..9}])  -- truncates path; names may contain '/'
--   pn.io.load(path)            -> {name = tensor, ...} of every dataset (names without leading '/')
--   pn.io.load(path, name)      -> that tensor
--   pn.io.attrs(path [, obj])   -> {attr = value}: strings as Lua strings, 0-dim numbers as Lua
--                                  numbers, arrays as tensors (obj defaults to the root '/')
--   pn.io.list(path [, group])  -> sorted list of dataset names under group (recursive)
--   f = pn.io.open(path, mode)  -- 'r' read-only, 'w' create/truncate, 'a' read-write (created if missing)
--     f:write(name, t [, {gzip=}])  f:read(name)  f:exists(name)  f:list([group])
--     f:attrs([obj])  f:attr(obj, name)  f:set_attr(obj, name, string|number|tensor)
--     f:flush()  f:close()        -- also closed by the GC
-- Numbers given to set_attr are stored as f64 scalars, or i64 when integral.
--   pn.io.load_npy(path)        -> tensor from a NumPy .npy file (core/io/npy.c: every numeric
--                                  dtype numpy writes but complex/f16, both byte orders, Fortran order)
--   pn.io.save_npy(path, t)     -- format 1.0, little-endian, C order
--   pn.io.read_text(path, op)   -> the whole file as a string (bytes as stored); errors start with
--                                  op: "op: cannot open PATH (No such file or directory)",
--                                  "op: cannot read PATH (Is a directory)"
-- Errors are Lua errors carrying the C message ("h5 read: dataset 'x' not found in /tmp/a.h5").
local B = require 'penumbra_ffi'
local pn = require 'penumbra.tensor'
local ffi, C = B.ffi, B.C
local check, wrap = B.check, B.wrap -- errors at the user's line (B.raise)

local M = {}

local char_arr = ffi.typeof('char[?]')

-- Calls fn(buf, size) under the C buffer protocol (returns the full length, -1 on error).
local function fetch_text(fn)
  local size = 4096
  for _ = 1, 2 do
    local buf = char_arr(size)
    local n = tonumber(fn(buf, size))
    if n < 0 then error(B.last_error(), 3) end
    if n < size then return ffi.string(buf, n) end
    size = n + 1
  end
  error('h5: listing changed size while it was read', 3)
end

local function split_lines(s)
  local out = {}
  if s == '' then return out end
  for line in (s .. '\n'):gmatch('([^\n]*)\n') do out[#out + 1] = line end
  return out
end

local function gzip_of(opts, where)
  local level = opts and opts.gzip or 0
  if level == true then level = 4 end
  if level == false then level = 0 end
  if type(level) ~= 'number' or level % 1 ~= 0 then
    error(where .. ': gzip must be an integer level 0..9, got ' .. tostring(level), 3)
  end
  return level
end

-- ---- the file handle ----------------------------------------------------------------
local File = {}
File.__index = File

local function ptr(f)
  if f._p == nil then error('h5: ' .. f.path .. ' is closed', 3) end
  return f._p
end

function M.open(path, mode)
  mode = mode or 'r'
  if type(path) ~= 'string' then error('h5 open: path must be a string, got ' .. type(path), 2) end
  local p = C.pn_h5_open(path, mode)
  if p == nil then error(B.last_error(), 2) end
  return setmetatable({ _p = ffi.gc(p, C.pn_h5_close), path = path, mode = mode }, File)
end

function File:close()
  if self._p ~= nil then
    local p = self._p
    self._p = nil
    ffi.gc(p, nil)
    C.pn_h5_close(p)
  end
end

function File:flush() check(C.pn_h5_flush(ptr(self))) end

function File:write(name, t, opts)
  if type(name) ~= 'string' then error('h5 write: dataset name must be a string, got ' .. type(name), 2) end
  if not B.is_tensor(t) then
    error("h5 write: value for '" .. name .. "' in " .. self.path .. ' is ' .. type(t) .. ', not a tensor', 2)
  end
  check(C.pn_h5_write(ptr(self), name, t, gzip_of(opts, 'h5 write')))
end

-- Append t along dim 1 of an extendable dataset (created on first use): run-file metrics.
function File:append(name, t)
  if not B.is_tensor(t) then
    error("h5 append: value for '" .. tostring(name) .. "' in " .. self.path .. ' is ' .. type(t) .. ', not a tensor', 2)
  end
  check(C.pn_h5_append(ptr(self), name, t))
end

function File:delete(name) check(C.pn_h5_delete(ptr(self), name)) end
function File:move(from, to) check(C.pn_h5_move(ptr(self), from, to)) end

function File:read(name)
  if type(name) ~= 'string' then error('h5 read: dataset name must be a string, got ' .. type(name), 2) end
  local t = wrap(C.pn_h5_read(ptr(self), name))   -- not a tail call: keeps the error level
  return t
end

function File:exists(name)
  local r = C.pn_h5_exists(ptr(self), name)
  if r < 0 then error(B.last_error(), 2) end
  return r ~= 0
end

function File:list(group)
  local p = ptr(self)
  return split_lines(fetch_text(function(buf, size) return C.pn_h5_list(p, group or '/', buf, size) end))
end

-- one attribute, converted as in attrs(); nil when missing
function File:attr(obj, name)
  local p = ptr(self)
  obj = obj or '/'
  local kind = C.pn_h5_attr_kind(p, obj, name)
  if kind < 0 then error(B.last_error(), 2) end
  if kind == 1 then
    local s = fetch_text(function(buf, size) return C.pn_h5_attr_string(p, obj, name, buf, size) end)
    return s
  elseif kind == 2 then
    local t = wrap(C.pn_h5_attr_tensor(p, obj, name))
    if t.nd == 0 then return t:item() end
    return t
  end
  return nil   -- missing, or a type we do not read (compound, …)
end

function File:attrs(obj)
  local p = ptr(self)
  obj = obj or '/'
  local names = split_lines(fetch_text(function(buf, size) return C.pn_h5_attr_names(p, obj, buf, size) end))
  local out = {}
  for _, name in ipairs(names) do out[name] = self:attr(obj, name) end
  return out
end

function File:set_attr(obj, name, value)
  local p = ptr(self)
  obj = obj or '/'
  if type(name) ~= 'string' then error('h5 set_attr: attribute name must be a string, got ' .. type(name), 2) end
  if type(value) == 'string' then
    check(C.pn_h5_set_attr_string(p, obj, name, value))
  elseif type(value) == 'number' or type(value) == 'boolean' then
    local dt = 'f64'
    if type(value) == 'boolean' then value, dt = value and 1 or 0, 'u8'
    elseif value % 1 == 0 and math.abs(value) < 2 ^ 53 then dt = 'i64' end
    check(C.pn_h5_set_attr_tensor(p, obj, name, pn.full({}, value, { dtype = dt })))
  elseif B.is_tensor(value) then
    check(C.pn_h5_set_attr_tensor(p, obj, name, value))
  else
    error("h5 set_attr: value for attribute '" .. name .. "' of '" .. obj .. "' in " .. self.path
      .. ' must be a string, number or tensor, got ' .. type(value), 2)
  end
end

-- ---- whole-file helpers ------------------------------------------------------------------
-- Runs fn(f) on an open file and closes it whatever happens. Errors are re-raised at the
-- caller of save/load/… (level 3), without this file's position.
local function with_file(path, mode, fn)
  local ok, f = pcall(M.open, path, mode)
  if not ok then error(B.unplaced(f), 3) end
  local a, b
  ok, a, b = pcall(fn, f)
  f:close()
  if not ok then error(B.unplaced(a), 3) end
  return a, b
end

function M.save(path, tensors, opts)
  if type(tensors) ~= 'table' then error('io.save: expected a table {name = tensor}, got ' .. type(tensors), 2) end
  local names = {}
  for name, t in pairs(tensors) do
    if type(name) ~= 'string' then error('io.save: dataset names must be strings, got ' .. type(name), 2) end
    if not B.is_tensor(t) then error("io.save: value for '" .. name .. "' is " .. type(t) .. ', not a tensor', 2) end
    names[#names + 1] = name
  end
  table.sort(names)   -- deterministic file layout
  local level = gzip_of(opts, 'io.save')
  with_file(path, 'w', function(f)
    for _, name in ipairs(names) do f:write(name, tensors[name], { gzip = level }) end
  end)
end

-- whether a plain file at path can be opened for reading
function M.file_exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
end

-- The one whole-file reader of the text inputs (BLEU files, parallel corpora, JSON). io.open
-- opens a directory without complaint and its read then returns nil: that is an error here, not
-- an empty file or a nil for the caller to index. Raised at level 0: the message is the report.
function M.read_text(path, op)
  op = op or 'read_text'
  if type(path) ~= 'string' or path == '' then
    error(op .. ': a file path must be a non-empty string, got ' .. tostring(path), 0)
  end
  local f, err = io.open(path, 'rb')
  if not f then
    -- io.open's message is "PATH: reason"; keep the reason
    error(op .. ': cannot open ' .. path .. ' (' .. tostring(err):gsub('^' .. path:gsub('%p', '%%%0') .. ': ', '') .. ')', 0)
  end
  local s, rerr = f:read('*a')
  f:close()
  if not s then error(op .. ': cannot read ' .. path .. ' (' .. tostring(rerr or 'a directory?') .. ')', 0) end
  return s
end

-- A file that is either whole or absent: fn(f) writes into <path>.tmp, which is then renamed
-- over path, so a crash or a full disk mid-write leaves the previous file (checkpoints, resume
-- states) intact; on failure the temporary file is removed (its space freed) and the error
-- raised.
function M.write_atomic(path, fn)
  local tmp = path .. '.tmp'
  local ok, e = pcall(function()
    local f = M.open(tmp, 'w')
    local okw, ew = pcall(fn, f)
    if okw then okw, ew = pcall(f.flush, f) end
    f:close()
    if not okw then error(ew, 0) end
  end)
  if ok then
    local okr, er = os.rename(tmp, path)
    if not okr then ok, e = false, er end
  end
  if not ok then
    os.remove(tmp)
    error(B.unplaced(e), 2)
  end
end

-- (no tail calls into with_file: its error level counts this frame)
function M.load(path, name)
  local r = with_file(path, 'r', function(f)
    if name ~= nil then return f:read(name) end
    local out = {}
    for _, n in ipairs(f:list('/')) do out[n] = f:read(n) end
    return out
  end)
  return r
end

function M.load_npy(path)
  if type(path) ~= 'string' then error('io.load_npy: path must be a string, got ' .. type(path), 2) end
  return wrap(C.pn_npy_load(path))
end

function M.save_npy(path, t)
  if type(path) ~= 'string' then error('io.save_npy: path must be a string, got ' .. type(path), 2) end
  if not B.is_tensor(t) then error('io.save_npy: expected a tensor, got ' .. type(t), 2) end
  check(C.pn_npy_save(path, t))
end

function M.attrs(path, obj)
  local r = with_file(path, 'r', function(f) return f:attrs(obj) end)
  return r
end

function M.list(path, group)
  local r = with_file(path, 'r', function(f) return f:list(group) end)
  return r
end

return M
