-- Creation, geometry, views, copies and printing of tensors (core/tensor.c, ops/views.c).
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local check = require 'spec.helpers.check'

local function flat(t) return gradcheck.flat(t) end

-- naive strided read: element at 1-based index list through the view's strides
local function naive_get(t, idx)
  return t:get(unpack(idx))
end

local function assert_error_matching(fn, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, 'expected an error matching ' .. pattern)
  assert.truthy(tostring(err):find(pattern), 'error "' .. tostring(err) .. '" does not match "' .. pattern .. '"')
end

describe('tensor creation', function()
  it('builds from nested tables with the right shape, dtype and values', function()
    local t = pn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.same({ 2, 3 }, t:shape())
    assert.equal('f32', t:dtype())
    assert.equal('cpu', t:device())
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:totable())
    for _, dt in ipairs({ 'f64', 'i32', 'i64', 'u8' }) do
      local u = pn.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = dt })
      assert.equal(dt, u:dtype())
      assert.same({ { 1, 2 }, { 3, 4 } }, u:totable())
    end
  end)

  it('makes scalars, zeros, ones, full, arange', function()
    local s = pn.tensor(3.5)
    assert.same({}, s:shape())
    assert.equal(3.5, s:item())
    assert.same({ 0, 0, 0, 0 }, flat(pn.zeros(2, 2)))
    assert.same({ 1, 1, 1 }, flat(pn.ones({ 3 })))
    assert.same({ 7, 7 }, flat(pn.full({ 2 }, 7, { dtype = 'i32' })))
    assert.same({ 0, 1, 2, 3 }, pn.arange(4):totable())
    assert.same({ 1, 1.5, 2, 2.5 }, pn.arange(1, 3, 0.5, { dtype = 'f64' }):totable())
    assert.same({ 5, 3, 1 }, pn.arange(5, 0, -2):totable())
    assert.equal('i64', pn.arange(3):dtype())
  end)

  it('draws reproducible random numbers with manual_seed', function()
    pn.manual_seed(42)
    local a = flat(pn.rand(100))
    local b = flat(pn.randn(50, { dtype = 'f64' }))
    pn.manual_seed(42)
    assert.same(a, flat(pn.rand(100)))
    assert.same(b, flat(pn.randn(50, { dtype = 'f64' })))
    for _, v in ipairs(a) do assert.truthy(v >= 0 and v < 1) end
  end)

  it('has sane random statistics', function()
    pn.manual_seed(7)
    local u = flat(pn.rand(20000, { dtype = 'f64' }))
    local n = flat(pn.randn(20000, { dtype = 'f64' }))
    local su, sn, sn2 = 0, 0, 0
    for i = 1, #u do su = su + u[i]; sn = sn + n[i]; sn2 = sn2 + n[i] * n[i] end
    assert.near(0.5, su / #u, 0.01)
    assert.near(0, sn / #n, 0.03)
    assert.near(1, sn2 / #n, 0.03)
  end)

  it('copies to and from raw buffers', function()
    local ffi = require 'ffi'
    local buf = ffi.new('float[6]', { 1, 2, 3, 4, 5, 6 })
    local t = pn.from_buffer(buf, { 2, 3 }, 'f32')
    buf[0] = 100 -- a copy, not a view
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:totable())
    local out = ffi.new('float[6]')
    t:transpose(1, 2):to_buffer(out, 24)
    assert.same({ 1, 4, 2, 5, 3, 6 }, { out[0], out[1], out[2], out[3], out[4], out[5] })
    assert_error_matching(function() t:to_buffer(out, 8) end, 'to_buffer')
  end)

  it('rejects bad arguments with messages naming the op', function()
    assert_error_matching(function() pn.zeros(-1, 2) end, 'zeros: negative size')
    -- each creation op by its own name (randn's buffer is made by empty in C)
    for _, op in ipairs({ 'ones', 'empty', 'randn', 'rand' }) do
      assert_error_matching(function() pn[op]({ 2, -3 }) end, op .. ': negative size %-3 at dim 2 in shape %[2,%-3%]')
    end
    assert_error_matching(function() pn.zeros({ 2 }, { dtype = 'f16' }) end, "unknown dtype 'f16'")
    assert_error_matching(function() pn.tensor({ { 1, 2 }, { 3 } }) end, 'ragged')
    assert_error_matching(function() pn.arange(0, 1, 0) end, 'arange')
    assert_error_matching(function() pn.tensor({ 1, 2 }):item() end, 'item: tensor %[2%] has 2 elements')
    assert_error_matching(function() pn.rand({ 2 }, { dtype = 'i32' }) end, 'rand: dtype i32')
    assert_error_matching(function() pn.zeros({ 2 }, { device = 'tpu' }) end, "unknown device")
  end)
end)

describe('creators like x', function()
  local backends = require 'spec.helpers.backends'
  local LIKE = { 'empty_like', 'zeros_like', 'ones_like', 'rand_like', 'randn_like', 'full_like' }
  local function call(name, x, o)
    if name == 'full_like' then return pn.full_like(x, 2.5, o) end
    return pn[name](x, o)
  end

  it("keep x's shape, dtype and device on every backend, and take overrides", function()
    for _, be in ipairs(backends.list()) do
      for _, dt in ipairs({ 'f32', 'f64' }) do
        local x = pn.ones({ 2, 3 }, { dtype = dt, device = be.device, requires_grad = true })
        for _, name in ipairs(LIKE) do
          local y = call(name, x)
          assert.same({ 2, 3 }, y:shape(), name)
          assert.equal(dt, y:dtype(), name)
          assert.equal(be.device, y:device(), name)
          assert.is_false(y.requires_grad, name .. ' must not inherit requires_grad')
          local z = call(name, x, { dtype = dt == 'f32' and 'f64' or 'f32', shape = { 4 }, requires_grad = true })
          assert.same({ 4 }, z:shape(), name)
          assert.equal(dt == 'f32' and 'f64' or 'f32', z:dtype(), name)
          assert.equal(be.device, z:device(), name)
          assert.is_true(z.requires_grad, name)
        end
      end
    end
  end)

  it('fill the values their plain creators fill', function()
    local x = pn.tensor({ { 9, 9 }, { 9, 9 } }, { dtype = 'f64' })
    assert.same({ 0, 0, 0, 0 }, flat(pn.zeros_like(x)))
    assert.same({ 1, 1, 1, 1 }, flat(pn.ones_like(x)))
    assert.same({ 2.5, 2.5, 2.5, 2.5 }, flat(pn.full_like(x, 2.5)))
    pn.manual_seed(5)
    local a = flat(pn.randn_like(x))
    pn.manual_seed(5)
    assert.same(flat(pn.randn({ 2, 2 }, { dtype = 'f64' })), a)
    pn.manual_seed(6)
    local u = flat(pn.rand_like(x))
    pn.manual_seed(6)
    assert.same(flat(pn.rand({ 2, 2 }, { dtype = 'f64' })), u)
  end)

  it('pass a requested device through (an unavailable one is an error naming it)', function()
    if pn.cuda_available() then
      assert.equal('cuda', pn.zeros_like(pn.zeros({ 2 }), { device = 'cuda' }):device())
    else
      assert.is_false(pcall(pn.zeros_like, pn.zeros({ 2 }), { device = 'cuda' }))
    end
    assert_error_matching(function() pn.zeros_like(pn.zeros({ 2 }), { device = 'tpu' }) end, "unknown device 'tpu'")
  end)

  it('reject a non-tensor x, a bad value and unknown option keys, listing the valid keys', function()
    assert_error_matching(function() pn.zeros_like({ 1, 2 }) end, 'zeros_like: x must be a tensor')
    assert_error_matching(function() pn.full_like(pn.zeros({ 2 }), 'a') end, 'full_like: value must be a number')
    assert_error_matching(function() pn.ones_like(pn.zeros({ 2 }), { dtpye = 'f64' }) end,
      "ones_like: unknown option 'dtpye' %(valid: device, dtype, requires_grad, shape%)")
  end)

  it('as every other creator does', function()
    local bad = { dtpye = 'f64' }
    local calls = {
      zeros = function() return pn.zeros({ 2 }, bad) end, ones = function() return pn.ones(2, bad) end,
      empty = function() return pn.empty({ 2 }, bad) end, rand = function() return pn.rand({ 2 }, bad) end,
      randn = function() return pn.randn({ 2 }, bad) end, full = function() return pn.full({ 2 }, 1, bad) end,
      arange = function() return pn.arange(3, bad) end, tensor = function() return pn.tensor({ 1 }, bad) end,
    }
    for name, fn in pairs(calls) do
      assert_error_matching(fn, name .. ": unknown option 'dtpye' %(valid: device, dtype, requires_grad%)")
    end
    -- the options table is only read: pn.tensor of a number must not write into it
    local o = { dtype = 'f64' }
    pn.tensor(3, o)
    assert.same({ dtype = 'f64' }, o)
  end)
end)

describe('views', function()
  local x
  before_each(function()
    x = pn.arange(24, { dtype = 'f64' }):reshape(2, 3, 4)
  end)

  it('share storage and read through strides', function()
    local tr = x:transpose(1, 3) -- (4,3,2)
    assert.same({ 4, 3, 2 }, tr:shape())
    assert.is_false(tr:is_contiguous())
    -- an empty tensor is contiguous whatever its strides (no element is out of place)
    assert.is_true(pn.zeros({ 2, 0, 3 }):is_contiguous())
    assert.is_true(pn.zeros({ 2, 0, 3 }):transpose(1, 3):is_contiguous())
    for i = 1, 4 do for j = 1, 3 do for k = 1, 2 do
      assert.equal((k - 1) * 12 + (j - 1) * 4 + (i - 1), naive_get(tr, { i, j, k }))
    end end end
    local p = x:permute(2, 3, 1) -- (3,4,2)
    assert.equal(x:get(2, 3, 4), p:get(3, 4, 2))
  end)

  it('narrow, slice, select', function()
    local n = x:narrow(3, 2, 2) -- (2,3,2) columns 2..3
    assert.same({ 2, 3, 2 }, n:shape())
    assert.equal(x:get(2, 3, 3), n:get(2, 3, 2))
    local s = x:slice(2, -2) -- last two rows
    assert.same({ 2, 2, 4 }, s:shape())
    assert.equal(x:get(1, 2, 1), s:get(1, 1, 1))
    local sel = x:select(1, -1) -- (3,4)
    assert.same({ 3, 4 }, sel:shape())
    assert.equal(x:get(2, 1, 4), sel:get(1, 4))
  end)

  it('squeeze, unsqueeze, expand, view, reshape, contiguous', function()
    local u = x:unsqueeze(1)
    assert.same({ 1, 2, 3, 4 }, u:shape())
    assert.same({ 2, 3, 4, 1 }, x:unsqueeze(-1):shape())
    assert.same({ 2, 3, 4 }, u:squeeze():shape())
    assert.same({ 2, 3, 4 }, u:squeeze(1):shape())
    local e = pn.tensor({ { 1 }, { 2 } }):expand(2, 3)
    assert.same({ { 1, 1, 1 }, { 2, 2, 2 } }, e:totable())
    assert.same({ 1, 0 }, e:stride())
    assert.same({ 6, 4 }, x:view(-1, 4):shape())
    local tr = x:transpose(1, 2)
    local ok = pcall(function() return tr:view(24) end)
    assert.is_false(ok) -- needs a copy
    local r = tr:reshape(24)
    local want = {}
    for j = 1, 3 do for i = 1, 2 do for k = 1, 4 do want[#want + 1] = (i - 1) * 12 + (j - 1) * 4 + (k - 1) end end end
    assert.same(want, flat(r))
    assert.is_true(tr:contiguous():is_contiguous())
    assert.same(want, flat(tr:contiguous()))
  end)

  it('contiguous copies of transposed views read every element, for runs of any length and dtype', function()
    -- (A, B, W) viewed (B, A, W): W elements a run. Runs of 1..70 bytes and past 2 KiB cross
    -- the copy's 64-byte moves, its 4-byte tail and its byte tail, and its memcpy for long runs.
    for _, dt in ipairs({ 'f32', 'f64', 'i32', 'u8' }) do
      for _, W in ipairs({ 1, 3, 15, 16, 17, 33, 70, 600 }) do
        local A, B = 3, 5
        local x = pn.arange(0, A * B * W, 1, { dtype = dt }):view(A, B, W)
        local c = x:transpose(1, 2):contiguous()
        assert.same({ B, A, W }, c:shape())
        local got, bad = flat(c), nil
        local n = 0
        for b = 0, B - 1 do
          for a = 0, A - 1 do
            for w = 0, W - 1 do
              n = n + 1
              local want = (a * B + b) * W + w
              if dt == 'u8' then want = want % 256 end
              if got[n] ~= want then bad = bad or ('%s W=%d element %d: %s against %s'):format(dt, W, n, tostring(got[n]), want) end
            end
          end
        end
        assert.is_nil(bad)
      end
    end
  end)

  it('casts between dtypes', function()
    local f = pn.tensor({ 1.7, -2.2, 3 })
    assert.same({ 1, -2, 3 }, f:to('i32'):totable())
    assert.equal('f64', f:to('f64'):dtype())
    assert.same({ 1, 3 }, pn.tensor({ 1.7, 3.2 }):to('u8'):totable())
    -- the ends of each range: a value whose truncation fits is cast
    local edges = pn.tensor({ 2 ^ 31 - 0.5, -2 ^ 31 - 0.5 }, { dtype = 'f64' })
    assert.same({ 2147483647, -2147483648 }, edges:to('i32'):totable())
    assert.same({ 0, 255 }, pn.tensor({ -0.9, 255.9 }):to('u8'):totable())
    assert.same({ -2 ^ 63, 2 ^ 62 }, pn.tensor({ -2 ^ 63, 2 ^ 62 }, { dtype = 'f64' }):to('i64'):totable())
  end)

  it('a NaN, an infinity or a value out of range is an error when cast to an integer dtype, not a number', function()
    -- NaN used to become INT64_MIN (C leaves the conversion undefined)
    local cases = {
      { pn.tensor({ 1, 0 / 0, 3 }), 'i64', 'holds nan at [2], which i64 cannot hold' },
      { pn.tensor({ { 1, 2 }, { math.huge, 3 } }), 'i32', 'x [2,2] f32 holds inf at [2,1], which i32' },
      { pn.tensor({ -math.huge }), 'u8', 'holds -inf at [1]' },
      { pn.tensor({ 2 ^ 31 }, { dtype = 'f64' }), 'i32', 'holds 2147483648 at [1], which i32 cannot hold' },
      { pn.tensor({ 2 ^ 63 }, { dtype = 'f64' }), 'i64', 'which i64 cannot hold' },
      { pn.tensor({ 0, 256 }), 'u8', 'holds 256 at [2], which u8' },
      { pn.tensor({ -1 }), 'u8', 'holds -1 at [1]' },
      -- a view: the position is the reader's, in the view's own shape
      { pn.tensor({ { 1, 0 / 0 }, { 2, 3 } }):transpose(1, 2), 'i64', 'x [2,2] f32 holds nan at [2,1]' },
    }
    for _, c in ipairs(cases) do
      check.assert_error_matching(function() c[1]:to(c[2]) end, 'to_dtype: ', c[3])
    end
  end)

  it('report errors that name the op and the shape', function()
    assert_error_matching(function() x:narrow(1, 2, 5) end, 'narrow: start 2, length 5 out of bounds for dim 1')
    assert_error_matching(function() x:select(2, 4) end, 'select: index')
    assert_error_matching(function() x:permute(1, 1, 2) end, 'permute')
    assert_error_matching(function() x:view(5, 5) end, 'view: cannot view %[2,3,4%]')
    assert_error_matching(function() x:expand(3, 3, 4) end, 'expand')
    assert_error_matching(function() x:transpose(1, 4) end, 'transpose: dim')
    assert_error_matching(function() x:size(0) end, 'dim 0 is invalid')
  end)

  it('gradients of views flow back to the base (f64 gradcheck)', function()
    pn.manual_seed(3)
    local a = pn.randn({ 2, 3, 4 }, { dtype = 'f64', requires_grad = true })
    gradcheck(function(t) return t:transpose(1, 3) end, { a })
    gradcheck(function(t) return t:permute(3, 1, 2):reshape(4, 6) end, { a })
    gradcheck(function(t) return t:narrow(2, 2, 2) end, { a })
    gradcheck(function(t) return t:select(3, 2) end, { a })
    gradcheck(function(t) return t:unsqueeze(2):squeeze(2) end, { a })
    gradcheck(function(t) return t:narrow(1, 1, 1):expand(5, 3, 4) end, { a })
    gradcheck(function(t) return t:transpose(1, 2):contiguous() end, { a })
    gradcheck(function(t) return t:clone():view(24) end, { a })
    local a32 = pn.randn({ 3 }, { requires_grad = true })
    local g = pn.ones({ 3 }, { dtype = 'f64' })
    a32:to('f64'):backward(g)
    assert.equal('f32', a32.grad:dtype())
    assert.same({ 1, 1, 1 }, a32.grad:totable())
  end)
end)

describe('printing', function()
  it('shows values, dtype and shape', function()
    local s = tostring(pn.tensor({ { 1, 2 }, { 3, 4 } }))
    assert.truthy(s:find('tensor%(%[%[1%.0000, 2%.0000%],'))
    assert.truthy(s:find('dtype=f32'))
    assert.truthy(s:find('shape=%[2,2%]'))
    assert.truthy(tostring(pn.tensor({ 1, 2 }, { dtype = 'i64' })):find('%[1, 2%], dtype=i64'))
    local big = tostring(pn.zeros(100, 100))
    assert.truthy(big:find('%.%.%.'))
    assert.truthy(#big < 2000)
    local r = tostring(pn.ones({ 2 }, { requires_grad = true }))
    assert.truthy(r:find('requires_grad=true'))
  end)
end)
