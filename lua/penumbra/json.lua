-- penumbra.json — JSON for run files (the config attribute, summaries), over lua-cjson
-- (Debian lua-cjson).
--
--   json.encode(v)  -> string   objects with their keys sorted (the same config gives the same
--                               bytes: run files diff and compare), integers as integers, other
--                               numbers with 17 significant digits (cjson 2.1 stops at 14, and a
--                               config must rebuild exactly the run it describes), NaN/±inf as
--                               null, a table with a positive length as an array
--   json.decode(s)  -> value    null → nil (an array keeps the later items' positions);
--                               also reads the \ddd escapes older run files carry (their encoder
--                               used string.format('%q'))
--
-- cjson does the parsing and the string escaping; only the number format and key order,
-- which it cannot be told, are done here.
local cjson = require 'cjson'

local M = {}

local function encode(v, out)
  local t = type(v)
  if t == 'string' then
    out[#out + 1] = cjson.encode(v)
  elseif t == 'number' then
    if v ~= v or v == math.huge or v == -math.huge then out[#out + 1] = 'null'
    elseif v % 1 == 0 and math.abs(v) < 2 ^ 53 then out[#out + 1] = string.format('%d', v)
    else out[#out + 1] = string.format('%.17g', v) end
  elseif t == 'boolean' then
    out[#out + 1] = tostring(v)
  elseif t == 'table' then
    if #v > 0 then
      out[#out + 1] = '['
      for i, x in ipairs(v) do
        if i > 1 then out[#out + 1] = ',' end
        encode(x, out)
      end
      out[#out + 1] = ']'
    else
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = tostring(k) end
      table.sort(keys)
      out[#out + 1] = '{'
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = ',' end
        out[#out + 1] = cjson.encode(k) .. ':'
        local x = v[k]
        if x == nil then x = v[tonumber(k)] end
        encode(x, out)
      end
      out[#out + 1] = '}'
    end
  else
    out[#out + 1] = 'null' -- functions, userdata: not data
  end
end

function M.encode(v)
  local out = {}
  encode(v, out)
  return table.concat(out)
end

local function strip_nulls(v)
  if type(v) ~= 'table' then return v end
  for k, x in pairs(v) do
    if x == cjson.null then v[k] = nil else strip_nulls(x) end
  end
  return v
end

-- '\ddd' (decimal, Lua's %q) → '\u00XX', outside of any other escape
local function lua_escapes(s)
  return (s:gsub('\\(.)(%d?%d?)', function(c, rest)
    if c:match('%d') then
      local code = tonumber(c .. rest) % 256
      return string.format('\\u%04x', code)
    end
    return '\\' .. c .. rest
  end))
end

function M.decode(s)
  if type(s) ~= 'string' then error('json: expected a string, got ' .. type(s), 2) end
  local ok, v = pcall(cjson.decode, s)
  if not ok and s:find('\\%d') then ok, v = pcall(cjson.decode, lua_escapes(s)) end
  if not ok then error(string.format('json: %s in %q', tostring(v):gsub('^.-: ', ''), s:sub(1, 80)), 2) end
  if v == cjson.null then return nil end
  return strip_nulls(v)
end

return M
