-- penumbra.ops.index — indexing and graph ops.
--
-- INDEX TENSORS HOLD 0-BASED INDICES (i32 or i64), as in the datasets and as the C core
-- expects: row 1 of a weight matrix is index 0. Only dims are 1-based (negative from the
-- end), as everywhere in Lua. A Lua table of indices is accepted too and becomes an i64
-- tensor (still 0-based values). Out-of-range indices raise an error naming the op, the
-- value, its (0-based) position and the shapes.
--
--   pn.embedding(weight (V, D), idx (…))          → (…, D)
--   t:index_select(dim, idx (n))                  → t with size n along dim
--   t:gather(dim, idx)                            torch.gather
--   t:scatter_add(dim, idx, src)                  t + src scattered along dim (out-of-place)
--   t:index_add(dim, idx (n), src)                t + src rows added at idx along dim (out-of-place)
--   pn.segment_sum(x (E, …), offsets (S+1))       → (S, …), CSR segments of rows
--   pn.segment_softmax(x (E, …), offsets (S+1))   → (E, …), softmax within each segment
-- CSR offsets: offsets[1] = 0, non-decreasing, offsets[S+1] = E (values are row numbers
-- counted from 0, like indices). Empty segments are allowed (segment_sum gives zeros); a
-- segment whose entries are all -inf gets softmax weights 0, not NaN.
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap, dim = B.C, B.wrap, B.dim
  local is_tensor = pn.is_tensor

  -- tensor or Lua list of 0-based indices -> index tensor (a list lands on x's device)
  local function index(op, idx, what, x)
    if is_tensor(idx) then return idx end
    if type(idx) == 'table' then
      local ok, t = pcall(pn.tensor, idx, { dtype = 'i64', device = x:device() })
      if not ok then -- "tensor: element 2 is 1.5, which i64 cannot hold …" names the op that was called
        raise(op .. ': ' .. what .. ' ' .. tostring(t):gsub('^.-tensor: ', '', 1), 3)
      end
      return t
    end
    raise(op .. ': ' .. what .. ' must be an index tensor (i32/i64) or a list of 0-based indices, got ' .. type(idx), 3)
  end

  local function tensor(op, x, what)
    if not is_tensor(x) then raise(op .. ': ' .. what .. ' must be a tensor, got ' .. type(x), 3) end
    return x
  end

  function pn.embedding(weight, idx)
    tensor('embedding', weight, 'weight')
    return wrap(C.pn_embedding(weight, index('embedding', idx, 'idx', weight)))
  end

  function M.index_select(x, d, idx)
    return wrap(C.pn_index_select(tensor('index_select', x, 'x'), dim(d, 'index_select'), index('index_select', idx, 'idx', x)))
  end
  pn.index_select = M.index_select

  function M.gather(x, d, idx)
    return wrap(C.pn_gather(tensor('gather', x, 'x'), dim(d, 'gather'), index('gather', idx, 'idx', x)))
  end
  pn.gather = M.gather

  function M.scatter_add(x, d, idx, src)
    tensor('scatter_add', x, 'x')
    tensor('scatter_add', src, 'src')
    return wrap(C.pn_scatter_add(x, dim(d, 'scatter_add'), index('scatter_add', idx, 'idx', x), src))
  end
  pn.scatter_add = M.scatter_add

  function M.index_add(x, d, idx, src)
    tensor('index_add', x, 'x')
    tensor('index_add', src, 'src')
    return wrap(C.pn_index_add(x, dim(d, 'index_add'), index('index_add', idx, 'idx', x), src))
  end
  pn.index_add = M.index_add

  function pn.segment_sum(x, offsets)
    tensor('segment_sum', x, 'x')
    return wrap(C.pn_segment_sum(x, index('segment_sum', offsets, 'offsets', x)))
  end
  M.segment_sum = pn.segment_sum

  function pn.segment_softmax(x, offsets)
    tensor('segment_softmax', x, 'x')
    return wrap(C.pn_segment_softmax(x, index('segment_softmax', offsets, 'offsets', x)))
  end
  M.segment_softmax = pn.segment_softmax
end
