-- penumbra.ops.reduce — reductions, arg-extremes and norms.
--   t:sum([dims [, keepdim]])  t:mean  t:max  t:min  t:logsumexp  t:prod   (also pn.sum(t, ...) …)
--     dims: nil (every dim), a number, or a list of dims; 1-based, negative counts from the end.
--     max/min return the values only (use argmax/argmin for positions).
--   t:argmax([dim [, keepdim]])  t:argmin  → i64 tensor of 0-based indices along dim, like
--     every index tensor (gather / index_select / cross_entropy targets take them directly;
--     README "Indices and positions"); with no dim, the 0-based position in the flattened
--     (row-major) tensor, as a 0-dim tensor. Ties: the first index; a NaN wins.
--   t:norm([p=2 [, dims [, keepdim]]])  p: a positive number or math.huge / 'inf'
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap, dim = B.C, B.wrap, B.dim
  local ffi = B.ffi
  local is_tensor = pn.is_tensor

  local function check_tensor(name, x)
    if not is_tensor(x) then raise(name .. ': expected a tensor, got ' .. type(x), 3) end
  end

  local REDUCE = {
    sum = C.PN_SUM, mean = C.PN_MEAN, max = C.PN_MAX, min = C.PN_MIN,
    logsumexp = C.PN_LOGSUMEXP, prod = C.PN_PROD,
  }
  for name, op in pairs(REDUCE) do
    local function f(x, dims, keepdim)
      check_tensor(name, x)
      local n, a = pn._dims(dims, name)
      return wrap(C.pn_reduce(op, x, n, a, keepdim and 1 or 0))
    end
    M[name] = f
    pn[name] = f
  end

  local function arg_extreme(name, cfn)
    return function(x, d, keepdim)
      check_tensor(name, x)
      local cd = d == nil and C.PN_ALL_DIMS or dim(d, name)
      return wrap(cfn(x, cd, keepdim and 1 or 0))
    end
  end
  M.argmax = arg_extreme('argmax', C.pn_argmax)
  M.argmin = arg_extreme('argmin', C.pn_argmin)
  pn.argmax, pn.argmin = M.argmax, M.argmin

  function M.norm(x, p, dims, keepdim)
    check_tensor('norm', x)
    if p == nil then p = 2 end
    if p == 'inf' then p = math.huge end
    if type(p) ~= 'number' then raise('norm: p must be a number or \'inf\', got ' .. tostring(p), 2) end
    local n, a = pn._dims(dims, 'norm')
    return wrap(C.pn_norm(x, p, n, a, keepdim and 1 or 0))
  end
  pn.norm = M.norm
end
