-- NumPy .npy files (core/io/npy.c, pn.io.load_npy / save_npy): every dtype numpy writes
-- that we take, in both byte orders, format versions 1–3, Fortran order, 0-dim and empty
-- arrays, against fixtures written by numpy itself (spec/fixtures/npy/make.py); our writer
-- byte for byte against numpy's file; and the bad files, each a named error.
local pn = require 'penumbra'
local assert_error_matching = require('spec.helpers.check').assert_error_matching

local dir = 'spec/fixtures/npy/'
local function slurp(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

local ARANGE = { { 0, 1, 2 }, { 3, 4, 5 } }

describe('load_npy', function()
  it('reads every numeric dtype in both byte orders into the documented dtype', function()
    local want = { f2 = 'f32', f4 = 'f32', f8 = 'f64', i1 = 'i32', i2 = 'i32', i4 = 'i32', i8 = 'i64', u1 = 'u8',
                   u2 = 'i32', u4 = 'i64', u8 = 'i64' }
    local n = 0
    for code, dt in pairs(want) do
      for _, order in ipairs({ 'le', 'be' }) do
        local path = dir .. code .. order .. '.npy'
        local f = io.open(path, 'rb')
        if f then
          f:close()
          local t = pn.io.load_npy(path)
          assert.equal(dt, t:dtype(), path)
          assert.same({ 2, 3 }, t:shape(), path)
          assert.same(ARANGE, t:totable(), path)
          n = n + 1
        end
      end
    end
    assert.equal(20, n) -- 11 little-endian, 9 big-endian (one-byte types have no order)
  end)

  it('reads bool as u8 0/1, format versions 2.0 and 3.0, a 0-dim and an empty array', function()
    local b = pn.io.load_npy(dir .. 'b1.npy')
    assert.equal('u8', b:dtype())
    assert.same({ { 0, 1, 0 }, { 1, 0, 1 } }, b:totable())
    for _, v in ipairs({ 'v2_f4', 'v3_f4' }) do assert.same(ARANGE, pn.io.load_npy(dir .. v .. '.npy'):totable()) end
    local s = pn.io.load_npy(dir .. 'scalar_i8.npy')
    assert.same({}, s:shape())
    assert.equal(7, s:item())
    local e = pn.io.load_npy(dir .. 'empty_f4.npy')
    assert.same({ 0, 3 }, e:shape())
  end)

  it('reorders a Fortran-order array into C order', function()
    local t = pn.io.load_npy(dir .. 'fortran_f8.npy')
    assert.same({ 2, 3, 4 }, t:shape())
    local v = 0
    for i = 1, 2 do
      for j = 1, 3 do
        for k = 1, 4 do
          assert.equal(v, t:get(i, j, k))
          v = v + 1
        end
      end
    end
  end)

  it('converts half floats exactly: subnormals, the largest half, ±inf and NaN', function()
    local t = pn.io.load_npy(dir .. 'half_special.npy'):totable()
    assert.equal(2 ^ -24, t[1]) -- 6e-8 rounds to the smallest subnormal
    assert.equal(-2 ^ -24, t[2])
    assert.equal(65504, t[3])
    assert.equal(math.huge, t[4])
    assert.equal(-math.huge, t[5])
    assert.is_true(t[6] ~= t[6])
  end)

  it('names the file and the problem for every bad file', function()
    local cases = {
      { 'u8_big', 'uint64 element 2 (C order, from 1) is above 2^63 - 1' },
      { 'complex', "dtype '<c8' is not supported" },
      { 'strings', "dtype '<U2' is not supported" },
      { 'record', 'structured' },
      { 'truncated_f4', "truncated: shape (2, 3) of '<f4' needs 24 data bytes, the file has 19" },
      { 'trailing_f4', '4 bytes after the 24 data bytes' },
      { 'header_cut', 'truncated inside its' },
      { 'not_npy', 'not a .npy file' },
    }
    for _, c in ipairs(cases) do
      local path = dir .. c[1] .. '.npy'
      assert_error_matching(function() pn.io.load_npy(path) end, 'load_npy', path, c[2])
    end
    assert_error_matching(function() pn.io.load_npy('/nonexistent/x.npy') end, 'load_npy', 'cannot open')
    assert_error_matching(function() pn.io.load_npy(3) end, 'load_npy', 'path must be a string')
    -- at the caller's line (load_npy tail-called a checker that counted a frame LuaJIT drops)
    local ok, e = pcall(function() local t = pn.io.load_npy(dir .. 'not_npy.npy') return t end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('^[^:]*npy_spec%.lua:%d+: load_npy: '), tostring(e))
    ok, e = pcall(function() local f = pn.io.open(dir .. 'not_npy.npy', 'r') return f end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('^[^:]*npy_spec%.lua:%d+: h5 open'), tostring(e))
  end)
end)

describe('save_npy', function()
  local tmp = os.tmpname() .. '.npy'
  after_each(function() os.remove(tmp) end)

  it('writes the same bytes as numpy.save for every dtype of ours', function()
    for code, dt in pairs({ f4le = 'f32', f8le = 'f64', i4le = 'i32', i8le = 'i64', u1le = 'u8' }) do
      pn.io.save_npy(tmp, pn.tensor(ARANGE, { dtype = dt }))
      assert.equal(slurp(dir .. code .. '.npy'), slurp(tmp), code)
    end
  end)

  it('round-trips strided, 0-dim and empty tensors', function()
    local x = pn.randn(4, 5, { dtype = 'f64' })
    pn.io.save_npy(tmp, x:t())
    assert.same(x:t():totable(), pn.io.load_npy(tmp):totable())
    pn.io.save_npy(tmp, pn.tensor(2.5))
    assert.equal(2.5, pn.io.load_npy(tmp):item())
    pn.io.save_npy(tmp, pn.zeros({ 0, 7 }, { dtype = 'i64' }))
    local e = pn.io.load_npy(tmp)
    assert.same({ 0, 7 }, e:shape())
    assert.equal('i64', e:dtype())
  end)

  it('names the file it cannot create', function()
    assert_error_matching(function() pn.io.save_npy('/nonexistent/dir/x.npy', pn.zeros(2)) end, 'save_npy',
      'cannot create /nonexistent/dir/x.npy')
  end)
end)
