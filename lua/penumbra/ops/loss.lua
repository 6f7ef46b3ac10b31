-- penumbra.ops.loss — loss functions (torch semantics).
--   pn.cross_entropy(logits, target, {label_smoothing=0, ignore_index=-100, reduction='mean'})
--   pn.nll_loss(logp, target, {ignore_index=-100, reduction='mean'})
--   pn.binary_cross_entropy_with_logits(x, y, {reduction='mean'})
--   pn.mse_loss(x, y, {reduction='mean'})
-- logits / logp: (N, C). target: (N) i32/i64 tensor (a Lua list is converted to i64) of
-- class ids AS STORED — 0-based, 0 .. C-1, the way the datasets store labels; they are NOT
-- shifted to 1-based like Lua dims and indices. Rows whose target equals ignore_index
-- count neither in the loss nor in the mean. reduction: 'none' (per-row / per-element
-- losses), 'mean' or 'sum' (0-dim results).
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap = B.C, B.wrap
  local is_tensor, check_opts = pn.is_tensor, pn._check_opts
  local REDUCTION_KEYS = { reduction = { 'string', one_of = { 'none', 'mean', 'sum' } } }
  local NLL_KEYS = { ignore_index = 'integer', reduction = REDUCTION_KEYS.reduction }
  local CE_KEYS = { label_smoothing = { 'number', min = 0, below = 1 }, ignore_index = 'integer',
                    reduction = REDUCTION_KEYS.reduction }

  local REDUCTION = { none = 0, mean = 1, sum = 2 }
  local function reduction_of(name, o)
    local r = o.reduction or 'mean'
    local code = REDUCTION[r]
    if not code then raise(name .. ": reduction must be 'none', 'mean' or 'sum', got " .. tostring(r), 3) end
    return code
  end
  local function check_tensor(name, x, what)
    if not is_tensor(x) then raise(name .. ': ' .. what .. ' must be a tensor, got ' .. type(x), 3) end
  end
  -- a Lua list of class ids becomes an i64 tensor on the logits' device
  local function target_of(name, t, logits)
    if type(t) == 'table' and not is_tensor(t) then return pn.tensor(t, { dtype = 'i64', device = logits:device() }) end
    check_tensor(name, t, 'target')
    return t
  end

  function pn.cross_entropy(logits, target, o)
    o = check_opts('cross_entropy', o, CE_KEYS, 2)
    check_tensor('cross_entropy', logits, 'logits')
    target = target_of('cross_entropy', target, logits)
    local ls = o.label_smoothing or 0
    local ign = o.ignore_index or -100
    return wrap(C.pn_cross_entropy(logits, target, ls, ign, reduction_of('cross_entropy', o)))
  end

  function pn.nll_loss(logp, target, o)
    o = check_opts('nll_loss', o, NLL_KEYS, 2)
    check_tensor('nll_loss', logp, 'logp')
    target = target_of('nll_loss', target, logp)
    return wrap(C.pn_nll_loss(logp, target, o.ignore_index or -100, reduction_of('nll_loss', o)))
  end

  function pn.binary_cross_entropy_with_logits(x, y, o)
    o = check_opts('bce_with_logits', o, REDUCTION_KEYS, 2)
    check_tensor('bce_with_logits', x, 'x')
    check_tensor('bce_with_logits', y, 'y')
    return wrap(C.pn_bce_with_logits(x, y, reduction_of('bce_with_logits', o)))
  end

  function pn.mse_loss(x, y, o)
    o = check_opts('mse_loss', o, REDUCTION_KEYS, 2)
    check_tensor('mse_loss', x, 'x')
    check_tensor('mse_loss', y, 'y')
    return wrap(C.pn_mse_loss(x, y, reduction_of('mse_loss', o)))
  end
end
