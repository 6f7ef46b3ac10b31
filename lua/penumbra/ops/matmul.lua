-- penumbra.ops.matmul — matrix products (torch.matmul semantics, OpenBLAS GEMM in C).
--   a:matmul(b)  pn.matmul(a, b)   1-D·1-D dot, 2-D, 1-D promoted, N-D with batch broadcasting
--   a:mm(b)      2-D × 2-D only
--   pn.bmm(a, b) 3-D × 3-D only (B, M, K) @ (B, K, N)
--   pn.linear(x, w, b)  x @ wᵀ + b (torch.nn.functional.linear), the bias added by the GEMM
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

  -- torch.nn.functional.linear: x (…, in) @ wᵀ + b, w (out, in), b (out) or nil → (…, out).
  -- The bias goes into the output before the GEMM, which adds onto it (one pass fewer than
  -- x:matmul(w:t()) + b; same values up to the order of one f32 addition).
  function pn.linear(x, w, b)
    if not is_tensor(x) or not is_tensor(w) or (b ~= nil and not is_tensor(b)) then
      raise('linear: expected tensors x, w and an optional tensor b, got ' .. type(x) .. ', ' .. type(w) .. ' and ' ..
        type(b), 2)
    end
    return wrap(C.pn_linear(x, w, b))
  end
  M.linear = pn.linear

  -- a · b for an `a` that is mostly zeros (bag-of-words features): work ∝ nonzeros of a.
  function pn.matmul_sparse_lhs(a, b)
    tensors('matmul_sparse_lhs', a, b)
    return wrap(C.pn_matmul_sparse_lhs(a, b))
  end
  M.matmul_sparse_lhs = pn.matmul_sparse_lhs
end
