-- spec/helpers/check.lua — the assertions the op specs share.
--   vals(t)                         all values of t, flattened row-major, as Lua numbers
--   flatten(nested)                 a nested Lua table, flattened
--   assert_close(got, ref, rtol, what)   |got − ref| <= rtol·(1 + |ref|) elementwise (flat lists
--                                   or tensors); NaN must meet NaN and ±inf must be equal
--   assert_finite(got, what)        no NaN or ±inf (a flat list or a tensor)
--   rng(seed)                       deterministic LCG: r:u() uniform in [0, 1), r:n() about
--                                   normal; the same numbers for f32 and f64 tensors
--   assert_error_matching(fn, ...)  fn raises, and its message contains every given string
--   distinct(n, lo, hi, seed)       n deterministic values in [lo, hi], no ties (a flat list)
--   nest(flat, shape)               a flat list as a nested table of the given shape
--   sh(cmd)                         run a shell command: its stdout+stderr and exit status
--   read_file(path)                 a file's bytes, or nil when it cannot be opened
local assert = require 'luassert' -- busted's assert lives in each spec file's environment

local M = {}

function M.sh(cmd)
  local p = io.popen('(' .. cmd .. ') 2>&1; echo "__status=$?"')
  local out = p:read('*a')
  p:close()
  local code = tonumber(out:match('__status=(%d+)%s*$'))
  return (out:gsub('__status=%d+%s*$', '')), code
end

function M.read_file(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('*a')
  f:close()
  return s
end
local inf = math.huge

function M.flatten(v, out)
  out = out or {}
  if type(v) == 'table' then
    for i = 1, #v do M.flatten(v[i], out) end
  else
    out[#out + 1] = v
  end
  return out
end

function M.vals(t) return M.flatten(t:totable()) end

local function is_tensor(x) return type(x) == 'cdata' and x.totable ~= nil end
local function list_of(x) return is_tensor(x) and M.vals(x) or x end

function M.assert_close(got, ref, rtol, what)
  got, ref = list_of(got), list_of(ref)
  assert.equal(#ref, #got, (what or '') .. ': element count')
  for i = 1, #ref do
    local g, r = got[i], ref[i]
    local ok
    if r ~= r then ok = g ~= g
    elseif r == inf or r == -inf then ok = g == r
    else ok = math.abs(g - r) <= rtol * (1 + math.abs(r)) end
    assert.is_true(ok, string.format('%s: element %d got %.17g, expected %.17g', what or '', i, g, r))
  end
end

function M.assert_finite(got, what)
  for i, x in ipairs(list_of(got)) do
    assert.is_true(x == x and x > -inf and x < inf, string.format('%s: element %d is %s', what or '', i, tostring(x)))
  end
end

local Rng = {}
Rng.__index = Rng
function M.rng(seed) return setmetatable({ s = seed * 7919 + 17 }, Rng) end
function Rng:u()
  self.s = (self.s * 1103515245 + 12345) % 2147483648
  return self.s / 2147483648
end
function Rng:n()
  local a = 0
  for _ = 1, 6 do a = a + self:u() end
  return (a - 3) * 1.4
end

function M.assert_error_matching(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok, 'expected an error')
  for _, pat in ipairs({ ... }) do
    assert.truthy(tostring(err):find(pat, 1, true), 'error "' .. tostring(err) .. '" does not name "' .. pat .. '"')
  end
end

function M.distinct(n, lo, hi, seed)
  local t = {}
  for k = 1, n do t[k] = lo + (hi - lo) * ((k * 0.6180339887498949 + (seed or 0) * 0.1234567) % 1) end
  return t
end

function M.nest(flat, shape)
  local pos = 0
  local function build(d)
    local r = {}
    for i = 1, shape[d] do
      if d == #shape then pos = pos + 1; r[i] = flat[pos] else r[i] = build(d + 1) end
    end
    return r
  end
  return build(1)
end

return M
