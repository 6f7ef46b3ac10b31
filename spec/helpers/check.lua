-- spec/helpers/check.lua — the assertions the op specs share.
--   vals(t)                         all values of t, flattened row-major, as Lua numbers
--   flatten(nested)                 a nested Lua table, flattened
--   assert_close(got, ref, rtol, what)   |got − ref| <= rtol·(1 + |ref|) elementwise;
--                                   NaN must meet NaN and ±inf must be equal
--   assert_error_matching(fn, ...)  fn raises, and its message contains every given string
--   distinct(n, lo, hi, seed)       n deterministic values in [lo, hi], no ties (a flat list)
--   nest(flat, shape)               a flat list as a nested table of the given shape
local assert = require 'luassert' -- busted's assert lives in each spec file's environment

local M = {}
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

function M.assert_close(got, ref, rtol, what)
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
