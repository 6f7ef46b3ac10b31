-- penumbra.nn.score_params — how the attention layers (MultiheadAttention, GATConv) treat a
-- score's parameters, derived from its registry description (pn.attention_variant(score),
-- core/attention/variants.def) instead of a list of names: <param> = a number for any of
-- them, learn_<param> = true makes it a per-head parameter of the module.
local M = {}

-- The score a layer's options name (o.score, else `default`) and its registry description. A
-- value that is not a string, or a name the registry lacks, is an error of `who` listing the
-- scores; `level` is error()'s level as the calling site counts it.
function M.score(who, o, default, level, pn)
  local score = type(o) == 'table' and o.score or default
  if type(score) ~= 'string' then error(who .. ': score must be a string, got ' .. type(score), level + 1) end
  local ok, desc = pcall(pn.attention_variant, score)
  if not ok then
    error(string.format("%s: unknown score '%s' (valid: %s)", who, score, table.concat(pn.attention_variants(), ', ')),
      level + 1)
  end
  return score, desc
end

-- Registers a per-head parameter (heads) on module m for each learn_<param> = true in o, in the
-- description's order, initialised to o.<param> or the default (1/√D for a default_rule of
-- 1/sqrt(D), D the per-head query width). A learn_ key for a parameter the score does not
-- have is an error listing the valid ones. Returns the set of learned names.
function M.learnable(m, who, desc, o, heads, D, pn)
  local learned, valid = {}, {}
  for _, p in ipairs(desc.params) do
    valid[#valid + 1] = 'learn_' .. p.name
    if o['learn_' .. p.name] then
      local init = o[p.name] or p.default or 1 / math.sqrt(D)
      m:param(p.name, pn.full({ heads }, init))
      learned[p.name] = true
    end
  end
  for k, v in pairs(o) do
    local name = type(k) == 'string' and k:match('^learn_(.+)$')
    if name and v and not desc.params[name] then
      error(string.format("%s: %s: score '%s' has no parameter %s (valid: %s)", who, k, desc.name, name,
        #valid > 0 and table.concat(valid, ', ') or 'none'), 3)
    end
  end
  return learned
end

-- opts.<param> for each of the score's parameters: module m's learned tensor, else o.<param>
-- (nil: the score's default)
function M.fill(opts, desc, o, m, learned)
  for _, p in ipairs(desc.params) do
    if learned[p.name] then opts[p.name] = m[p.name] else opts[p.name] = o[p.name] end
  end
  return opts
end

return M
