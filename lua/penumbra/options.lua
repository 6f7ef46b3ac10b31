-- penumbra.options — the one options checker of the Lua API.
--
--   options.check(op, o, spec [, level]) -> o   ({} for nil)
--
-- spec maps each valid key to a rule: a type name ('number', 'integer', 'boolean', 'string',
-- 'tensor', 'table', 'function', 'any') or a table {type, min =, max =, above =, below =,
-- one_of = {…}, also = 'tensor' (a number or a tensor)}. An unknown key is an error that
-- lists the valid ones; a value of the wrong type, a NaN or infinite number, a fraction where
-- an integer is meant, or a value out of its range is an error naming op, the key and the
-- value. Booleans are booleans: {causal = 'false'} and {causal = 0} are errors, not true.
local M = {}
local HINT = {} -- spec[HINT]: a sentence added to the unknown-key error (e.g. which score is in use)
M.HINT = HINT

local is_tensor, raise = require('penumbra_ffi').is_tensor, require('penumbra_ffi').raise

local function keys_of(spec)
  local l = {}
  for k in pairs(spec) do if k ~= HINT then l[#l + 1] = k end end
  table.sort(l)
  return table.concat(l, ', ')
end

-- numbers as a reader writes them: whole ones without an exponent
local function num(v)
  if type(v) == 'number' and v % 1 == 0 and math.abs(v) < 1e21 then return string.format('%.0f', v) end
  return tostring(v)
end

-- level as error()'s from the function that called fail; a level that lands inside penumbra
-- (a layer passing the user's options on to an op, a helper that was tail-called) blames the
-- user's line instead (B.raise)
local function fail(op, level, fmt, ...)
  raise(op .. ': ' .. string.format(fmt, ...), level + 1)
end

local function check_value(op, key, v, rule, level)
  if type(rule) == 'string' then rule = { rule } end
  local t = rule[1]
  if t == 'any' then return end
  if rule.also == 'tensor' and is_tensor(v) then return end
  if t == 'tensor' then
    if not is_tensor(v) then fail(op, level, '%s must be a tensor, got %s', key, type(v)) end
    return
  end
  if t == 'number' or t == 'integer' then
    if type(v) ~= 'number' then
      fail(op, level, '%s must be a number%s, got %s (a %s)', key, rule.also and ' or a tensor' or '', tostring(v), type(v))
    end
    if v ~= v or v == math.huge or v == -math.huge then fail(op, level, '%s must be a finite number, got %s', key, tostring(v)) end
    if t == 'integer' and v % 1 ~= 0 then fail(op, level, '%s must be a whole number, got %s', key, tostring(v)) end
    if rule.min and v < rule.min then fail(op, level, '%s must be >= %s, got %s', key, num(rule.min), num(v)) end
    if rule.max and v > rule.max then fail(op, level, '%s must be <= %s, got %s', key, num(rule.max), num(v)) end
    if rule.above and not (v > rule.above) then fail(op, level, '%s must be > %s, got %s', key, num(rule.above), num(v)) end
    if rule.below and not (v < rule.below) then fail(op, level, '%s must be < %s, got %s', key, num(rule.below), num(v)) end
    return
  end
  if type(v) ~= t then fail(op, level, '%s must be a %s, got %s (a %s)', key, t, tostring(v), type(v)) end
  if rule.one_of then
    for _, x in ipairs(rule.one_of) do if x == v then return end end
    fail(op, level, "%s must be one of %s, got '%s'", key, table.concat(rule.one_of, ', '), tostring(v))
  end
end

-- one value against one rule (the same rules as check); errors name op and key. level as
-- check's (and error's): 2, the default, blames the caller of the function that asks
function M.check_value(op, key, v, rule, level)
  check_value(op, key, v, rule, (level or 2) + 2)
end

function M.check(op, o, spec, level)
  level = (level or 1) + 1
  if o == nil then return {} end
  if type(o) ~= 'table' or is_tensor(o) then fail(op, level, 'options must be a table, got %s', type(o)) end
  for k, v in pairs(o) do
    local rule = k ~= HINT and spec[k] or nil
    if rule == nil then
      fail(op, level, "unknown option '%s' (valid: %s)%s", tostring(k), keys_of(spec), spec[HINT] and ('; ' .. spec[HINT]) or '')
    end
    check_value(op, tostring(k), v, rule, level + 1)
  end
  return o
end

-- The keys of a score's parameters as options of a layer or op: <param> = a number or a tensor
-- (positive ones > 0), learn_<param> = a boolean (the description: pn.attention_variant).
function M.score_params(spec, desc)
  local names = {}
  for _, p in ipairs(desc.params) do
    spec[p.name] = { 'number', also = 'tensor', above = p.positive and 0 or nil }
    spec['learn_' .. p.name] = 'boolean'
    names[#names + 1] = p.name
  end
  spec[HINT] = string.format("score '%s' has the parameters %s", desc.name,
    #names > 0 and table.concat(names, ', ') or '(none)')
  return spec
end

-- a copy of spec with more keys
function M.with(spec, more)
  local r = {}
  for k, v in pairs(spec) do if k ~= HINT then r[k] = v end end
  for k, v in pairs(more or {}) do r[k] = v end
  return r
end

return M
