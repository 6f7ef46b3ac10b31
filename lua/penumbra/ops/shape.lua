-- penumbra.ops.shape — joining and splitting along a dim (dims 1-based, negative from the end).
--   pn.cat({a, b, …}, dim=1)      join along an existing dim (copy; differentiable)
--   pn.stack({a, b, …}, dim=1)    join along a new dim inserted at dim (1..nd+1, -1 = last)
--   t:split(size | {sizes…}, dim=1) → list of narrow views (the last piece may be smaller)
--   t:chunk(n, dim=1)             → at most n narrow views of ceil(size/n) (torch.chunk)
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap, dim = B.C, B.wrap, B.dim
  local is_tensor = pn.is_tensor

  local function list_arg(op, list)
    if type(list) ~= 'table' or is_tensor(list) then
      raise(op .. ': expected a list of tensors, got ' .. type(list), 3)
    end
    if #list == 0 then raise(op .. ': expected a non-empty list of tensors', 3) end
  end

  function pn.cat(list, d)
    list_arg('cat', list)
    local n, arr = pn._tensor_array(list)
    return wrap(C.pn_cat(n, arr, dim(d or 1, 'cat')))
  end

  function pn.stack(list, d)
    list_arg('stack', list)
    local n, arr = pn._tensor_array(list)
    return wrap(C.pn_stack(n, arr, dim(d or 1, 'stack')))
  end

  function M.split(t, sizes, d)
    d = d or 1
    local total = M.size(t, d)
    local parts = {}
    if type(sizes) == 'number' then
      if sizes <= 0 or sizes % 1 ~= 0 then raise('split: size must be a positive integer, got ' .. sizes, 2) end
      local start = 1
      repeat
        local len = math.min(sizes, total - start + 1)
        parts[#parts + 1] = M.narrow(t, d, start, len)
        start = start + len
      until start > total
      return parts
    end
    if type(sizes) ~= 'table' then raise('split: expected a size or a list of sizes, got ' .. type(sizes), 2) end
    local sum = 0
    for i, s in ipairs(sizes) do
      if type(s) ~= 'number' or s < 0 or s % 1 ~= 0 then
        raise('split: size ' .. tostring(s) .. ' at position ' .. i .. ' is not a non-negative integer', 2)
      end
      sum = sum + s
    end
    if sum ~= total then
      raise('split: sizes {' .. table.concat(sizes, ',') .. '} sum to ' .. sum .. ' but dim ' .. d ..
            ' of [' .. table.concat(M.shape(t), ',') .. '] has ' .. total, 2)
    end
    local start = 1
    for i, s in ipairs(sizes) do
      parts[i] = M.narrow(t, d, start, s)
      start = start + s
    end
    return parts
  end

  function M.chunk(t, n, d)
    if type(n) ~= 'number' or n < 1 or n % 1 ~= 0 then
      raise('chunk: n must be a positive integer, got ' .. tostring(n), 2)
    end
    local total = M.size(t, d or 1)
    return M.split(t, math.max(1, math.ceil(total / n)), d)
  end
end
