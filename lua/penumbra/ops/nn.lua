-- penumbra.ops.nn — functional neural-net ops (the layers in penumbra.nn build on these).
--   t:softmax([dim=-1])  t:log_softmax([dim=-1])   pn.softmax(t, dim)  pn.log_softmax(t, dim)
--   pn.layer_norm(x, weight, bias, eps=1e-5)  t:layer_norm(weight, bias, eps)
--     normalises over the last dim; weight and bias are (D) tensors or nil.
--   pn.dropout(x, p=0.5, train=true)  t:dropout(p, train)
--     inverted dropout (kept elements scaled by 1/(1-p)) from the global RNG stream
--     (pn.manual_seed); p = 0 or train = false returns x itself.
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap, dim = B.C, B.wrap, B.dim
  local is_tensor = pn.is_tensor

  local function check_tensor(name, x, what)
    if not is_tensor(x) then raise(name .. ': ' .. (what or 'x') .. ' must be a tensor, got ' .. type(x), 3) end
  end

  function M.softmax(x, d)
    check_tensor('softmax', x)
    return wrap(C.pn_softmax(x, dim(d or -1, 'softmax')))
  end
  function M.log_softmax(x, d)
    check_tensor('log_softmax', x)
    return wrap(C.pn_log_softmax(x, dim(d or -1, 'log_softmax')))
  end
  pn.softmax, pn.log_softmax = M.softmax, M.log_softmax

  function M.layer_norm(x, weight, bias, eps)
    check_tensor('layer_norm', x)
    if weight ~= nil then check_tensor('layer_norm', weight, 'weight') end
    if bias ~= nil then check_tensor('layer_norm', bias, 'bias') end
    if eps ~= nil and type(eps) ~= 'number' then raise('layer_norm: eps must be a number, got ' .. type(eps), 2) end
    return wrap(C.pn_layer_norm(x, weight, bias, eps or 1e-5))
  end
  pn.layer_norm = M.layer_norm

  function M.dropout(x, p, train)
    check_tensor('dropout', x)
    if p == nil then p = 0.5 end
    if type(p) ~= 'number' then raise('dropout: p must be a number, got ' .. type(p), 2) end
    if train == nil then train = true end
    -- a boolean, as every flag of the API ('false' or 0 would be truthy: dropout at eval time)
    if type(train) ~= 'boolean' then raise('dropout: train must be true or false, got ' .. tostring(train), 2) end
    return wrap(C.pn_dropout(x, p, train and 1 or 0))
  end
  pn.dropout = M.dropout
end
