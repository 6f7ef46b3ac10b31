-- penumbra.ops.elementwise — unary maths, binary arithmetic (NumPy broadcasting; numbers
-- allowed on either side), comparisons, where, and the arithmetic operators.
--   t:exp()  pn.exp(t)  t:elu(alpha)  t:clamp(min, max)  t:pow(p)
--   t:add(o) pn.add(a, b)  a + b  2 - t  t / 3  -t  t ^ 2
--   t:lt(o) → u8   cond:where(a, b)  pn.where(cond, a, b)
return function(pn, M, B)
  local raise = B.raise -- error(msg, level), or the user's line where level lands inside penumbra
  local C, wrap = B.C, B.wrap
  local is_tensor, as_tensor = pn.is_tensor, pn._as_tensor
  local inf = math.huge

  -- ---- unary ----------------------------------------------------------------------------
  -- name -> {C op, default a, default b}
  local UNARY = {
    neg = { C.PN_NEG }, abs = { C.PN_ABS }, exp = { C.PN_EXP }, log = { C.PN_LOG },
    log1p = { C.PN_LOG1P }, sqrt = { C.PN_SQRT }, rsqrt = { C.PN_RSQRT }, sin = { C.PN_SIN },
    cos = { C.PN_COS }, tanh = { C.PN_TANH }, sigmoid = { C.PN_SIGMOID },
    logsigmoid = { C.PN_LOGSIGMOID }, relu = { C.PN_RELU }, elu = { C.PN_ELU, 1 },
    leaky_relu = { C.PN_LEAKY_RELU, 0.01 }, gelu = { C.PN_GELU }, softplus = { C.PN_SOFTPLUS },
    sinh = { C.PN_SINH }, cosh = { C.PN_COSH }, asinh = { C.PN_ASINH }, acosh = { C.PN_ACOSH },
    atanh = { C.PN_ATANH },
  }
  for name, spec in pairs(UNARY) do
    local op, default = spec[1], spec[2] or 0
    local function f(x, a)
      if not is_tensor(x) then raise(name .. ': expected a tensor, got ' .. type(x), 2) end
      if a == nil then a = default end
      return wrap(C.pn_unary(op, x, a, 0))
    end
    M[name] = f
    pn[name] = f
  end

  -- clamp(min, max): nil leaves that side unbounded
  function M.clamp(x, lo, hi)
    if not is_tensor(x) then raise('clamp: expected a tensor, got ' .. type(x), 2) end
    return wrap(C.pn_unary(C.PN_CLAMP, x, lo or -inf, hi or inf))
  end
  pn.clamp = M.clamp

  -- ---- binary ----------------------------------------------------------------------------
  -- An integer tensor meeting a fractional number (i64 * 0.5, i32:gt(0.5)) is promoted
  -- (to f32 for arithmetic, f64 for comparisons) rather than truncating the number.
  local function is_int(t) return t.dt ~= C.PN_F32 and t.dt ~= C.PN_F64 end
  local function promote(t, x, float_dt)
    if type(x) == 'number' and x % 1 ~= 0 and is_int(t) then return wrap(C.pn_to_dtype(t, float_dt)) end
    return t
  end

  -- a, b: tensors or numbers (a number takes the other side's dtype)
  local function operands(name, a, b, float_dt)
    local ta, tb = is_tensor(a), is_tensor(b)
    if not ta and not tb then
      if type(a) == 'number' and type(b) == 'number' then
        a = as_tensor(a)
        return a, as_tensor(b, a)
      end
      raise(name .. ': expected tensors or numbers, got ' .. type(a) .. ' and ' .. type(b), 3)
    end
    float_dt = float_dt or C.PN_F32
    if not ta then
      b = promote(b, a, float_dt)
      a = as_tensor(a, b)
    end
    if not tb then
      a = promote(a, b, float_dt)
      b = as_tensor(b, a)
    end
    return a, b
  end

  local BINARY = {
    add = C.PN_ADD, sub = C.PN_SUB, mul = C.PN_MUL, div = C.PN_DIV,
    maximum = C.PN_MAXIMUM, minimum = C.PN_MINIMUM,
  }
  for name, op in pairs(BINARY) do
    local function f(a, b)
      -- the common case first: two tensors, no conversion
      if is_tensor(a) and is_tensor(b) then return wrap(C.pn_binary(op, a, b)) end
      a, b = operands(name, a, b)
      return wrap(C.pn_binary(op, a, b))
    end
    M[name] = f
    pn[name] = f
  end

  -- pow: a number exponent is pow_scalar (x^2 is a multiply); a tensor is elementwise pow
  function M.pow(a, p)
    if is_tensor(a) and type(p) == 'number' then return wrap(C.pn_unary(C.PN_POW_SCALAR, a, p, 0)) end
    a, p = operands('pow', a, p)
    return wrap(C.pn_binary(C.PN_POW, a, p))
  end
  pn.pow = M.pow

  -- ---- comparisons (→ u8) -------------------------------------------------------------------
  local COMPARE = { eq = C.PN_EQ, ne = C.PN_NE, lt = C.PN_LT, le = C.PN_LE, gt = C.PN_GT, ge = C.PN_GE }
  for name, op in pairs(COMPARE) do
    local function f(a, b)
      a, b = operands(name, a, b, C.PN_F64)
      return wrap(C.pn_compare(op, a, b))
    end
    M[name] = f
    pn[name] = f
  end

  -- ---- where --------------------------------------------------------------------------------
  function pn.where(cond, a, b)
    if not is_tensor(cond) then raise('where: cond must be a u8 tensor, got ' .. type(cond), 2) end
    a, b = operands('where', a, b)
    return wrap(C.pn_where(cond, a, b))
  end
  M.where = pn.where   -- cond:where(a, b)

  -- ---- operators ------------------------------------------------------------------------------
  -- metamethods get the number first when it is on the left (2 - t)
  M.__add = M.add
  M.__sub = M.sub
  M.__mul = M.mul
  M.__div = M.div
  M.__unm = function(x) return wrap(C.pn_unary(C.PN_NEG, x, 0, 0)) end
  M.__pow = M.pow
end
