-- penumbra.ops.matmul — matrix products (torch.matmul semantics, OpenBLAS GEMM in C).
--   a:matmul(b)  pn.matmul(a, b)   1-D·1-D dot, 2-D, 1-D promoted, N-D with batch broadcasting
--   a:mm(b)      2-D × 2-D only
--   pn.bmm(a, b) 3-D × 3-D only (B, M, K) @ (B, K, N)
-- Both operands must have the same float dtype (f32 or f64).
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap = B.C, B.wrap
  local is_tensor = pn.is_tensor

  local function tensors(op, a, b)
    if not is_tensor(a) or not is_tensor(b) then
      raise(op .. ': expected two tensors, got ' .. type(a) .. ' and ' .. type(b), 3)
    end
  end

  local function shape_str(t) return '[' .. table.concat(M.shape(t), ',') .. ']' end

  function M.matmul(a, b)
    tensors('matmul', a, b)
    return wrap(C.pn_matmul(a, b))
  end
  pn.matmul = M.matmul

  function M.mm(a, b)
    tensors('mm', a, b)
    if a.nd ~= 2 or b.nd ~= 2 then
      raise('mm: a ' .. shape_str(a) .. ' and b ' .. shape_str(b) .. ' must both be 2-D (use matmul otherwise)', 2)
    end
    return wrap(C.pn_matmul(a, b))
  end
  pn.mm = M.mm

  function pn.bmm(a, b)
    tensors('bmm', a, b)
    if a.nd ~= 3 or b.nd ~= 3 then
      raise('bmm: a ' .. shape_str(a) .. ' and b ' .. shape_str(b) .. ' must both be 3-D (B, M, K) and (B, K, N)', 2)
    end
    if a.sizes[0] ~= b.sizes[0] then
      raise('bmm: a ' .. shape_str(a) .. ' and b ' .. shape_str(b) .. ' have different batch sizes', 2)
    end
    return wrap(C.pn_matmul(a, b))
  end
  M.bmm = pn.bmm

  -- a · b for an `a` that is mostly zeros (bag-of-words features): work ∝ nonzeros of a.
  function pn.matmul_sparse_lhs(a, b)
    tensors('matmul_sparse_lhs', a, b)
    return wrap(C.pn_matmul_sparse_lhs(a, b))
  end
  M.matmul_sparse_lhs = pn.matmul_sparse_lhs
end
