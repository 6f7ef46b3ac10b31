-- HDF5 tensor I/O (core/io/h5.c, lua/penumbra/io.lua): round trips of every dtype
-- (bit-exact), strided/0-dim/empty tensors, nested names, gzip, attributes, files written
-- by plain libhdf5 with foreign types, the shared Cora/CiteSeer files, and error messages.
local pn = require 'penumbra'
local B = require 'penumbra_ffi'
local ffi = require 'ffi'

-- ---- helpers -------------------------------------------------------------------------
local temps = {}
local function tmp()
  local p = os.tmpname()
  temps[#temps + 1] = p
  return p
end
local function cleanup()
  for _, p in ipairs(temps) do os.remove(p) end
  temps = {}
end

-- raw bytes of a tensor's elements in row-major order (the bit-exact comparison)
local function bytes_of(t)
  local c = t:contiguous()
  return ffi.string(c:data_ptr(), c:numel() * B.C.pn_dtype_size(c.dt))
end

local function file_size(path)
  local f = assert(io.open(path, 'rb'))
  local n = f:seek('end')
  f:close()
  return n
end

-- pcall fn; assert it failed and that the message contains every plain string given
local function assert_error_with(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok, 'expected an error')
  err = tostring(err)
  for _, s in ipairs({ ... }) do
    assert.truthy(err:find(s, 1, true), 'error "' .. err .. '" does not mention "' .. s .. '"')
  end
  return err
end

local function sorted_keys(t)
  local k = {}
  for name in pairs(t) do k[#k + 1] = name end
  table.sort(k)
  return k
end

-- Dataset files: $PENUMBRA_DATA, then datasets/, then ../shared/datasets (repo-relative).
local function find_dataset(file)
  local root = os.getenv('PENUMBRA_HOME') or B.root or '.'
  local dirs = { os.getenv('PENUMBRA_DATA'), root .. '/datasets', root .. '/../shared/datasets' }
  local tried = {}
  for i = 1, 3 do
    if dirs[i] then
      local p = dirs[i] .. '/' .. file
      local f = io.open(p, 'rb')
      if f then f:close(); return p end
      tried[#tried + 1] = p
    end
  end
  error('dataset ' .. file .. ' not found; tried ' .. table.concat(tried, ', ')
    .. ' (see ../shared/datasets/README.md)')
end

-- Plain libhdf5 through the FFI: writes files with types our writer never produces, and
-- counts open HDF5 objects (leak check). libpenumbra links the same libhdf5, so the
-- process shares one library state.
local H5 = (function()
  local ok_lib, lib = pcall(ffi.load, 'hdf5_serial')
  if not ok_lib then ok_lib, lib = pcall(ffi.load, 'hdf5') end
  if not ok_lib then return nil end
  pcall(ffi.cdef, [[
    int H5open(void);
    int64_t H5Fcreate(const char *name, unsigned flags, int64_t fcpl, int64_t fapl);
    int H5Fclose(int64_t f);
    int64_t H5Fget_obj_count(int64_t file_id, unsigned types);
    int64_t H5Screate(int type);
    int64_t H5Pcreate(int64_t cls);
    int H5Pset_chunk(int64_t plist, int ndims, const uint64_t *dim);
    int H5Pclose(int64_t plist);
    extern int64_t H5P_CLS_DATASET_CREATE_ID_g;
    int64_t H5Screate_simple(int rank, const uint64_t *dims, const uint64_t *maxdims);
    int H5Sclose(int64_t s);
    int64_t H5Dcreate2(int64_t loc, const char *name, int64_t type, int64_t space, int64_t lcpl, int64_t dcpl, int64_t dapl);
    int H5Dwrite(int64_t ds, int64_t mtype, int64_t mspace, int64_t fspace, int64_t plist, const void *buf);
    int H5Dclose(int64_t ds);
    int64_t H5Acreate2(int64_t loc, const char *name, int64_t type, int64_t space, int64_t acpl, int64_t aapl);
    int H5Awrite(int64_t a, int64_t type, const void *buf);
    int H5Aclose(int64_t a);
    int64_t H5Tcopy(int64_t t);
    int H5Tset_size(int64_t t, size_t size);
    int H5Tset_strpad(int64_t t, int pad);
    int64_t H5Tenum_create(int64_t base);
    int H5Tenum_insert(int64_t t, const char *name, const void *value);
    int H5Tclose(int64_t t);
    extern int64_t H5T_STD_I8LE_g, H5T_STD_I16LE_g, H5T_STD_U16LE_g, H5T_STD_U32LE_g, H5T_STD_U64LE_g;
    extern int64_t H5T_IEEE_F32BE_g, H5T_STD_I64BE_g;
    extern int64_t H5T_NATIVE_INT8_g, H5T_NATIVE_INT16_g, H5T_NATIVE_UINT16_g, H5T_NATIVE_UINT32_g;
    extern int64_t H5T_NATIVE_UINT64_g, H5T_NATIVE_FLOAT_g, H5T_NATIVE_INT64_g, H5T_C_S1_g;
  ]])
  local ok = pcall(function() return lib.H5Fget_obj_count end)
  if not ok then return nil end
  lib.H5open()
  return lib
end)()

local H5F_ACC_TRUNC, H5S_SCALAR, H5F_OBJ_ALL = 2, 0, 0x1F
local NULLTERM, NULLPAD, SPACEPAD = 0, 1, 2
local H5T_VARIABLE = ffi.cast('size_t', -1LL)   -- (size_t)-1; a double -1 would not convert exactly

local function open_h5_objects()
  collectgarbage(); collectgarbage()
  return tonumber(H5.H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL))
end

-- ---- specs ---------------------------------------------------------------------------------
describe('pn.io round trips', function()
  after_each(cleanup)

  it('saves and loads all five dtypes bit-exactly, including extreme values', function()
    local p = tmp()
    local f32 = pn.tensor({ { 0 / 0, math.huge, -math.huge, -0.0 }, { 1e-45, 3.4028234663852886e38, -1.5, 1 / 3 } },
      { dtype = 'f32' })
    local f64 = pn.tensor({ 0 / 0, math.huge, -0.0, 4.9e-324, 1.7976931348623157e308, 1 / 3, -2.5 }, { dtype = 'f64' })
    local i32 = pn.tensor({ -2147483648, 2147483647, 0, -1, 7 }, { dtype = 'i32' })
    local i64 = pn.zeros({ 2, 2 }, { dtype = 'i64' })
    local q = ffi.cast('int64_t *', i64:data_ptr())
    q[0], q[1], q[2], q[3] = -9223372036854775807LL - 1, 9223372036854775807LL, -1LL, 1234567890123456789LL
    local u8 = pn.tensor({ { 0, 1, 127 }, { 128, 254, 255 } }, { dtype = 'u8' })
    local r32 = pn.randn({ 3, 4, 5 })
    local all = { f32 = f32, f64 = f64, i32 = i32, i64 = i64, u8 = u8, r32 = r32 }
    pn.io.save(p, all)
    local back = pn.io.load(p)
    assert.same(sorted_keys(all), sorted_keys(back))
    for name, t in pairs(all) do
      assert.equal(t:dtype(), back[name]:dtype(), name)
      assert.same(t:shape(), back[name]:shape(), name)
      assert.equal(bytes_of(t), bytes_of(back[name]), name .. ' differs bitwise')
    end
    -- one dataset by name
    local one = pn.io.load(p, 'i64')
    local r = ffi.cast('int64_t *', one:data_ptr())
    assert.is_true(r[0] == -9223372036854775807LL - 1 and r[1] == 9223372036854775807LL)
  end)

  it('writes non-contiguous views as their logical row-major contents', function()
    local p = tmp()
    local base = pn.arange(0, 24, 1, { dtype = 'f64' }):reshape(4, 6)
    local tr = base:transpose(1, 2)                    -- (6, 4), strides (1, 6)
    local nar = base:narrow(2, 2, 3)                   -- (4, 3), row stride 6
    local exp = pn.tensor({ 1, 2, 3 }, { dtype = 'i32' }):unsqueeze(1):expand(4, 3)   -- stride 0
    assert.is_false(tr:is_contiguous())
    assert.is_false(nar:is_contiguous())
    pn.io.save(p, { tr = tr, nar = nar, exp = exp })
    local back = pn.io.load(p)
    -- naive reference: element (i, j) of the view through get()
    for name, v in pairs({ tr = tr, nar = nar, exp = exp }) do
      local b = back[name]
      assert.same(v:shape(), b:shape(), name)
      assert.is_true(b:is_contiguous())
      local s = v:shape()
      for i = 1, s[1] do
        for j = 1, s[2] do assert.equal(v:get(i, j), b:get(i, j), name) end
      end
    end
    assert.equal(7, back.tr:get(2, 2))   -- base[2][2] = 1*6 + 1
  end)

  it('keeps 0-dim and empty tensors', function()
    local p = tmp()
    pn.io.save(p, {
      scalar = pn.tensor(3.25, { dtype = 'f64' }),
      iscalar = pn.full({}, -7, { dtype = 'i32' }),
      empty = pn.zeros({ 0, 3 }),
      empty3 = pn.zeros({ 2, 0, 4 }, { dtype = 'i64' }),
    }, { gzip = 6 })   -- gzip is skipped for these (no chunking possible), not an error
    local b = pn.io.load(p)
    assert.same({}, b.scalar:shape())
    assert.equal(3.25, b.scalar:item())
    assert.equal('f64', b.scalar:dtype())
    assert.same({}, b.iscalar:shape())
    assert.equal(-7, b.iscalar:item())
    assert.same({ 0, 3 }, b.empty:shape())
    assert.equal('f32', b.empty:dtype())
    assert.same({ 2, 0, 4 }, b.empty3:shape())
    assert.equal('i64', b.empty3:dtype())
    assert.equal(0, b.empty3:numel())
  end)

  it('creates nested groups from names with / and lists full paths', function()
    local p = tmp()
    pn.io.save(p, {
      ['params/layer1/w'] = pn.ones({ 2, 2 }),
      ['params/layer1/b'] = pn.zeros({ 2 }),
      ['params/out'] = pn.full({ 3 }, 2),
      top = pn.tensor({ 1, 2 }, { dtype = 'u8' }),
    })
    assert.same({ 'params/layer1/b', 'params/layer1/w', 'params/out', 'top' }, pn.io.list(p))
    assert.same({ 'params/layer1/b', 'params/layer1/w' }, pn.io.list(p, 'params/layer1'))
    assert.same({ 'params/layer1/b', 'params/layer1/w' }, pn.io.list(p, '/params/layer1/'))
    local all = pn.io.load(p)
    assert.same({ 'params/layer1/b', 'params/layer1/w', 'params/out', 'top' }, sorted_keys(all))
    assert.same({ 2, 2, 2 }, all['params/out']:totable())
    assert.same({ 1, 2 }, pn.io.load(p, '/top'):totable())   -- a leading '/' names the same dataset
    local f = pn.io.open(p, 'r')
    assert.is_true(f:exists('params'))
    assert.is_true(f:exists('params/layer1/w'))
    assert.is_true(f:exists('/'))
    assert.is_false(f:exists('params/nope'))
    assert.is_false(f:exists('nope/deeper/still'))
    assert.is_false(f:exists('top/below'))          -- below a dataset
    f:close()
  end)

  it('compresses with gzip and reads the data back unchanged', function()
    local p, q = tmp(), tmp()
    -- repetitive data compresses well; mixed with some noise to exercise the shuffle filter
    local t = pn.empty({ 200, 64 })
    local tp = ffi.cast('float *', t:data_ptr())
    for i = 0, 200 * 64 - 1 do tp[i] = (i % 17) / 4 end
    local noise = pn.randn({ 20, 30 }, { dtype = 'f64' })
    pn.io.save(p, { t = t, noise = noise }, { gzip = 9 })
    pn.io.save(q, { t = t, noise = noise })
    local back = pn.io.load(p)
    assert.equal(bytes_of(t), bytes_of(back.t))
    assert.equal(bytes_of(noise), bytes_of(back.noise))
    assert.is_true(file_size(p) < file_size(q) - 30000,
      'gzip file ' .. file_size(p) .. ' bytes vs plain ' .. file_size(q))
    -- the dataset really is deflate-compressed (h5dump reports the filter), when h5dump is installed
    local h = io.popen('h5dump -p -H -d /t ' .. p .. ' 2>/dev/null')
    local out = h:read('*a')
    h:close()
    if out ~= '' then assert.truthy(out:find('DEFLATE') and out:find('SHUFFLE'), out) end
  end)

  it('replaces an existing dataset (in place when the layout matches)', function()
    local p = tmp()
    local f = pn.io.open(p, 'w')
    f:write('x', pn.zeros({ 100, 100 }, { dtype = 'f64' }))
    f:flush()
    local size1 = file_size(p)
    for k = 1, 5 do f:write('x', pn.full({ 100, 100 }, k, { dtype = 'f64' })) end
    f:flush()
    assert.equal(size1, file_size(p))   -- rewrites did not grow the file
    assert.equal(5, f:read('x'):get(100, 100))
    f:write('x', pn.tensor({ 1, 2, 3 }, { dtype = 'i32' }))   -- other dtype and shape
    local x = f:read('x')
    assert.equal('i32', x:dtype())
    assert.same({ 1, 2, 3 }, x:totable())
    f:write('x', pn.tensor({ 4, 5, 6 }, { dtype = 'i32' }), { gzip = 3 })   -- now compressed
    assert.same({ 4, 5, 6 }, f:read('x'):totable())
    f:close()
  end)
end)

describe('pn.io attributes', function()
  after_each(cleanup)

  it('round-trips strings, numbers and tensors on the root, datasets and new groups', function()
    local p = tmp()
    local f = pn.io.open(p, 'w')
    f:write('w', pn.ones({ 2, 3 }))
    f:set_attr('/', 'name', 'cora-run')
    f:set_attr('/', 'empty', '')
    f:set_attr('/', 'unicode', 'Poincaré ½')
    f:set_attr('/', 'seed', 42)
    f:set_attr('/', 'lr', 0.005)
    f:set_attr('/', 'big', -9007199254740991)
    f:set_attr('/', 'flag', true)
    f:set_attr('w', 'radii', pn.tensor({ 0.5, 1.5, 2.5 }, { dtype = 'f64' }))
    f:set_attr('w', 'grid', pn.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = 'i32' }):transpose(1, 2))
    f:set_attr('summary', 'best_acc', 0.83)     -- /summary does not exist yet: created as a group
    f:set_attr('/', 'name', 'renamed')          -- replace, same kind
    f:set_attr('/', 'seed', 'forty-two')        -- replace, other kind
    f:close()

    local root = pn.io.attrs(p)
    assert.same({ 'big', 'empty', 'flag', 'lr', 'name', 'seed', 'unicode' }, sorted_keys(root))
    assert.equal('renamed', root.name)
    assert.equal('', root.empty)
    assert.equal('Poincaré ½', root.unicode)
    assert.equal('forty-two', root.seed)
    assert.equal(0.005, root.lr)
    assert.equal(-9007199254740991, root.big)
    assert.equal(1, root.flag)
    local w = pn.io.attrs(p, 'w')
    assert.equal('f64', w.radii:dtype())
    assert.same({ 0.5, 1.5, 2.5 }, w.radii:totable())
    assert.equal('i32', w.grid:dtype())
    assert.same({ { 1, 3 }, { 2, 4 } }, w.grid:totable())
    assert.same({ best_acc = 0.83 }, pn.io.attrs(p, '/summary'))
    assert.same({ 'w' }, pn.io.list(p))   -- the attribute group holds no dataset

    local g = pn.io.open(p, 'r')
    assert.equal('renamed', g:attr('/', 'name'))
    assert.is_nil(g:attr('/', 'missing'))
    g:close()
  end)

  it("opens with mode 'a': creates a missing file, keeps an existing one", function()
    local p = tmp()
    os.remove(p)
    local f = pn.io.open(p, 'a')
    f:write('x', pn.ones({ 2 }))
    f:set_attr('/', 'none', pn.zeros({ 0 }))   -- an empty array attribute
    f:close()
    local g = pn.io.open(p, 'a')
    g:write('y', pn.zeros({ 1 }, { dtype = 'u8' }))
    assert.same({ 'x', 'y' }, g:list())
    local none = g:attrs().none
    assert.same({ 0 }, none:shape())
    g:close()
  end)

  it('refuses values that are not strings, numbers or tensors', function()
    local p = tmp()
    local f = pn.io.open(p, 'w')
    assert_error_with(function() f:set_attr('/', 'bad', { 1, 2 }) end, 'set_attr', "'bad'", p)
    f:close()
  end)
end)

describe('pn.io reads files written by plain libhdf5', function()
  after_each(cleanup)

  it('converts foreign integer/float types, enums and every string layout', function()
    if not H5 then pending('libhdf5 could not be loaded through the FFI'); return end
    local p = tmp()
    local file = H5.H5Fcreate(p, H5F_ACC_TRUNC, 0, 0)
    assert.is_true(file >= 0)
    local dims = ffi.new('uint64_t[1]', 4)
    local sp = H5.H5Screate_simple(1, dims, nil)
    local function dataset(name, ftype, mtype, ctype, values)
      local buf = ffi.new(ctype .. '[4]', values)
      local ds = H5.H5Dcreate2(file, name, ftype, sp, 0, 0, 0)
      assert.is_true(ds >= 0, name)
      assert.equal(0, H5.H5Dwrite(ds, mtype, 0, 0, 0, buf))
      H5.H5Dclose(ds)
    end
    dataset('i8', H5.H5T_STD_I8LE_g, H5.H5T_NATIVE_INT8_g, 'int8_t', { -128, -1, 0, 127 })
    dataset('i16', H5.H5T_STD_I16LE_g, H5.H5T_NATIVE_INT16_g, 'int16_t', { -32768, -2, 3, 32767 })
    dataset('u16', H5.H5T_STD_U16LE_g, H5.H5T_NATIVE_UINT16_g, 'uint16_t', { 0, 1, 40000, 65535 })
    dataset('u32', H5.H5T_STD_U32LE_g, H5.H5T_NATIVE_UINT32_g, 'uint32_t', { 0, 1, 3000000000, 4294967295 })
    dataset('u64', H5.H5T_STD_U64LE_g, H5.H5T_NATIVE_UINT64_g, 'uint64_t', { 0, 5, 2 ^ 40, 2 ^ 53 })
    dataset('f32be', H5.H5T_IEEE_F32BE_g, H5.H5T_NATIVE_FLOAT_g, 'float', { 1.5, -0.25, 1e30, 3 })
    dataset('i64be', H5.H5T_STD_I64BE_g, H5.H5T_NATIVE_INT64_g, 'int64_t', { -5, 6, 2 ^ 50, 0 })
    -- h5py's bool: an enum over int8 {FALSE = 0, TRUE = 1}
    local en = H5.H5Tenum_create(H5.H5T_NATIVE_INT8_g)
    H5.H5Tenum_insert(en, 'FALSE', ffi.new('int8_t[1]', 0))
    H5.H5Tenum_insert(en, 'TRUE', ffi.new('int8_t[1]', 1))
    dataset('bool', en, en, 'int8_t', { 1, 0, 0, 1 })
    H5.H5Tclose(en)

    local scalar = H5.H5Screate(H5S_SCALAR)
    local function str_attr(name, size, pad, bytes)
      local t = H5.H5Tcopy(H5.H5T_C_S1_g)
      H5.H5Tset_size(t, size)
      if pad then H5.H5Tset_strpad(t, pad) end
      local a = H5.H5Acreate2(file, name, t, scalar, 0, 0)
      assert.is_true(a >= 0, name)
      assert.equal(0, H5.H5Awrite(a, t, bytes))
      H5.H5Aclose(a)
      H5.H5Tclose(t)
    end
    str_attr('nullterm', 8, NULLTERM, ffi.new('char[8]', 'abc'))
    str_attr('nullpad', 4, NULLPAD, ffi.new('char[4]', 'cora'))
    str_attr('spacepad', 6, SPACEPAD, ffi.new('char[6]', 'ab    '))
    str_attr('vlen', H5T_VARIABLE, nil, ffi.new('const char *[1]', { 'variable length text' }))
    local ia = H5.H5Acreate2(file, 'i16attr', H5.H5T_STD_I16LE_g, scalar, 0, 0)
    H5.H5Awrite(ia, H5.H5T_NATIVE_INT16_g, ffi.new('int16_t[1]', -300))
    H5.H5Aclose(ia)
    -- a string dataset, which read() must refuse
    local st = H5.H5Tcopy(H5.H5T_C_S1_g)
    H5.H5Tset_size(st, 3)
    local sds = H5.H5Dcreate2(file, 'strings', st, scalar, 0, 0, 0)
    H5.H5Dwrite(sds, st, 0, 0, 0, ffi.new('char[3]', 'xyz'))
    H5.H5Dclose(sds)
    H5.H5Tclose(st)
    H5.H5Sclose(scalar)
    H5.H5Sclose(sp)
    H5.H5Fclose(file)

    local f = pn.io.open(p, 'r')
    local function check(name, dtype, values)
      local t = f:read(name)
      assert.equal(dtype, t:dtype(), name)
      assert.same(values, t:totable(), name)
    end
    check('i8', 'i32', { -128, -1, 0, 127 })
    check('i16', 'i32', { -32768, -2, 3, 32767 })
    check('u16', 'i32', { 0, 1, 40000, 65535 })
    check('u32', 'i64', { 0, 1, 3000000000, 4294967295 })
    check('u64', 'i64', { 0, 5, 2 ^ 40, 2 ^ 53 })
    check('f32be', 'f32', { 1.5, -0.25, tonumber(ffi.new('float', 1e30)), 3 })
    check('i64be', 'i64', { -5, 6, 2 ^ 50, 0 })
    check('bool', 'u8', { 1, 0, 0, 1 })    -- 1-byte enum without negative members → u8
    assert_error_with(function() f:read('strings') end, 'h5 read', "'strings'", 'string', p)
    local a = f:attrs('/')
    assert.equal('abc', a.nullterm)
    assert.equal('cora', a.nullpad)
    assert.equal('ab', a.spacepad)
    assert.equal('variable length text', a.vlen)
    assert.equal(-300, a.i16attr)
    f:close()
  end)

  it('a small file declaring a huge chunked dataset is refused by name, before any allocation', function()
    -- an 8 KB file can declare [2^40, 2^40] (chunks are only allocated when written): the
    -- loader must check the shape's size before it allocates or reads
    if not H5 then pending('libhdf5 could not be loaded through the FFI'); return end
    local p = tmp()
    local file = H5.H5Fcreate(p, H5F_ACC_TRUNC, 0, 0)
    local function huge(name, dims)
      local d = ffi.new('uint64_t[?]', #dims, dims)
      local one = ffi.new('uint64_t[?]', #dims)
      for i = 0, #dims - 1 do one[i] = 1 end
      local sp = H5.H5Screate_simple(#dims, d, nil)
      local dcpl = H5.H5Pcreate(H5.H5P_CLS_DATASET_CREATE_ID_g)
      assert.equal(0, H5.H5Pset_chunk(dcpl, #dims, one))
      local ds = H5.H5Dcreate2(file, name, H5.H5T_NATIVE_FLOAT_g, sp, 0, dcpl, 0)
      assert.is_true(ds >= 0, name)
      H5.H5Dclose(ds); H5.H5Pclose(dcpl); H5.H5Sclose(sp)
    end
    huge('square', { 2 ^ 40, 2 ^ 40 })
    huge('wide', { 2 ^ 32, 2 ^ 32, 2 })
    huge('long', { 2 ^ 62 })
    H5.H5Fclose(file)
    local fh = io.open(p, 'rb'); local size = fh:seek('end'); fh:close()
    assert.truthy(size < 64 * 1024, 'the crafted file is small: ' .. size)
    local f = pn.io.open(p, 'r')
    for name, shape in pairs({ square = '[1099511627776,1099511627776]', wide = '[4294967296,4294967296,2]',
                               long = '[4611686018427387904]' }) do
      local ok, e = pcall(f.read, f, name)
      assert.is_false(ok, name)
      assert.truthy(tostring(e):find('too large', 1, true), tostring(e))
      assert.truthy(tostring(e):find(shape, 1, true), tostring(e))
    end
    f:close()
    local ok, e = pcall(pn.io.load, p)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('too large', 1, true), tostring(e))
  end)

  it('leaks no HDF5 handles on success or error paths', function()
    if not H5 then pending('libhdf5 could not be loaded through the FFI'); return end
    local p = tmp()
    local before = open_h5_objects()
    local f = pn.io.open(p, 'w')
    assert.equal(before + 1, open_h5_objects())
    f:write('a/b', pn.ones({ 3 }), { gzip = 2 })
    f:write('a/b', pn.ones({ 4 }))
    f:write('s', pn.ones({ 2, 2 }):transpose(1, 2))
    f:set_attr('a', 'x', 'y')
    f:set_attr('a/b', 'v', pn.ones({ 2 }))
    f:read('a/b')
    f:attrs('a')
    f:list('/')
    pcall(f.read, f, 'nope')
    pcall(f.read, f, 'a')
    pcall(f.write, f, 'a/b/c', pn.ones({ 1 }))
    pcall(f.write, f, 'a', pn.ones({ 1 }))
    pcall(f.attrs, f, 'missing')
    pcall(f.attr, f, 'a', 'missing')
    pcall(f.list, f, 's')
    pcall(B.C.pn_h5_attr_tensor, f._p, 'a', 'x')
    assert.equal(before + 1, open_h5_objects())
    f:close()
    assert.equal(before, open_h5_objects())
    -- a handle dropped without close() is closed by the GC
    local g = pn.io.open(p, 'a')
    assert.equal(before + 1, open_h5_objects())
    g = nil
    assert.equal(before, open_h5_objects())
  end)
end)

describe('pn.io on the shared datasets', function()
  it('reads cora.h5', function()
    local path = find_dataset('cora.h5')
    assert.same({ 'edges', 'features', 'labels', 'test_mask', 'train_mask', 'val_mask' }, pn.io.list(path))
    local d = pn.io.load(path)
    assert.same({ 2708, 1433 }, d.features:shape())
    assert.equal('f32', d.features:dtype())
    assert.equal('i32', d.labels:dtype())
    assert.same({ 2708 }, d.labels:shape())
    assert.same({ 10556, 2 }, d.edges:shape())
    assert.equal('i32', d.edges:dtype())
    local lab = ffi.cast('int32_t *', d.labels:data_ptr())
    local lo, hi = math.huge, -math.huge
    for i = 0, 2707 do lo, hi = math.min(lo, lab[i]), math.max(hi, lab[i]) end
    assert.equal(0, lo)
    assert.equal(6, hi)
    for name, count in pairs({ train_mask = 140, val_mask = 500, test_mask = 1000 }) do
      local m = d[name]
      assert.equal('u8', m:dtype())
      local q = ffi.cast('uint8_t *', m:data_ptr())
      local s = 0
      for i = 0, 2707 do s = s + q[i] end
      assert.equal(count, s, name)
    end
    -- features are binary bag-of-words: 49216 nonzeros (README)
    local fp = ffi.cast('float *', d.features:data_ptr())
    local nnz = 0
    for i = 0, 2708 * 1433 - 1 do if fp[i] ~= 0 then nnz = nnz + 1 end end
    assert.equal(49216, nnz)
    local a = pn.io.attrs(path)
    assert.equal(2708, a.num_nodes)
    assert.equal(1433, a.num_features)
    assert.equal(7, a.num_classes)
    assert.equal('cora', a.name)
  end)

  it('reads citeseer.h5', function()
    local path = find_dataset('citeseer.h5')
    local f = pn.io.open(path, 'r')
    local x = f:read('features')
    assert.same({ 3327, 3703 }, x:shape())
    local m = f:read('train_mask')
    local q = ffi.cast('uint8_t *', m:data_ptr())
    local s = 0
    for i = 0, 3326 do s = s + q[i] end
    assert.equal(120, s)
    assert.equal(3327, f:attr('/', 'num_nodes'))
    assert.equal('citeseer', f:attr('/', 'name'))
    f:close()
  end)
end)

describe('pn.io errors', function()
  after_each(cleanup)

  it('names the path of a missing file', function()
    local p = tmp()
    os.remove(p)
    local err = assert_error_with(function() pn.io.load(p) end, 'h5 open', p, 'no such file')
    assert.falsy(err:find('penumbra/io.lua', 1, true))   -- points at the caller, not at io.lua
    assert_error_with(function() pn.io.open(p, 'r') end, 'h5 open', p)
    assert_error_with(function() pn.io.attrs(p) end, 'h5 open', p)
  end)

  it('names the dataset and the path when a dataset is missing', function()
    local p = tmp()
    pn.io.save(p, { a = pn.ones({ 2 }) })
    assert_error_with(function() pn.io.load(p, 'foo') end, 'h5 read', "dataset 'foo' not found", p)
    assert_error_with(function() pn.io.load(p, 'x/y/z') end, 'h5 read', "'x/y/z'", p)
    assert_error_with(function() pn.io.list(p, 'nogroup') end, 'h5 list', "'nogroup'", p)
    assert_error_with(function() pn.io.attrs(p, 'ghost') end, "'ghost'", 'not found', p)
  end)

  it('refuses a corrupt file', function()
    local p = tmp()
    local fh = assert(io.open(p, 'wb'))
    fh:write(string.rep('\137HDF junk bytes, not a superblock\n', 40))
    fh:close()
    assert_error_with(function() pn.io.load(p) end, 'h5 open', p, 'not an HDF5 file')
    assert_error_with(function() pn.io.open(p, 'a') end, 'h5 open', p, 'not an HDF5 file')
    local e = tmp()   -- os.tmpname leaves an empty file: also not HDF5
    assert_error_with(function() pn.io.open(e, 'r') end, 'h5 open', e, 'not an HDF5 file')
  end)

  it('names an unwritable path', function()
    local p = '/nonexistent-penumbra-dir/sub/out.h5'
    assert_error_with(function() pn.io.save(p, { a = pn.ones({ 1 }) }) end, 'h5 open', p)
    assert_error_with(function() pn.io.open(p, 'a') end, 'h5 open', p)
    local d = os.tmpname()
    os.remove(d)
    os.execute('mkdir -p ' .. d)
    assert_error_with(function() pn.io.open(d, 'w') end, 'h5 open', d, 'directory')
    os.execute('rmdir ' .. d)
  end)

  it('reports misuse: bad mode, read-only writes, gzip level, groups vs datasets, closed files', function()
    local p = tmp()
    assert_error_with(function() pn.io.open(p, 'x') end, 'h5 open', p, "mode 'x'")
    pn.io.save(p, { ['g/d'] = pn.ones({ 2 }) })
    local f = pn.io.open(p, 'r')
    assert_error_with(function() f:write('n', pn.ones({ 1 })) end, 'h5 write', p, 'read-only')
    assert_error_with(function() f:set_attr('/', 'k', 'v') end, 'h5 set_attr', p, 'read-only')
    assert_error_with(function() f:read('g') end, 'h5 read', "'g'", 'group', p)
    f:close()
    assert_error_with(function() f:read('g/d') end, 'closed', p)
    local w = pn.io.open(p, 'a')
    assert_error_with(function() w:write('q', pn.ones({ 4 }), { gzip = 12 }) end, 'h5 write', 'gzip level 12', p)
    assert_error_with(function() w:write('g', pn.ones({ 1 })) end, 'h5 write', "'g'", 'group', p)
    assert_error_with(function() w:write('g/d/e', pn.ones({ 1 })) end, 'h5 write', "'g/d'", 'not a group', p)
    assert_error_with(function() w:write('v', 5) end, 'h5 write', "'v'", 'not a tensor')
    assert_error_with(function() w:set_attr('g/d/e', 'k', 1) end, 'h5 set_attr', "'g/d'", p)
    assert_error_with(function() pn.io.save(p, { a = 'text' }) end, 'io.save', "'a'", 'not a tensor')
    -- a failed write leaves the file usable
    w:write('ok', pn.ones({ 2 }))
    assert.same({ 1, 1 }, w:read('ok'):totable())
    assert.same({ 'g/d', 'ok' }, w:list())
    w:close()
    w:close()   -- closing twice is harmless
  end)
end)

describe('io: extendable datasets, delete, move', function()
  local pn = require 'penumbra'
  it('appends rows, checks their shape and dtype, deletes and moves', function()
    local path = os.tmpname() .. '.h5'
    local f = pn.io.open(path, 'w')
    for i = 1, 5 do f:append('metrics/loss', pn.tensor({ i * 0.5 }, { dtype = 'f64' })) end
    f:append('m2', pn.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = 'i32' }))
    f:append('m2', pn.tensor({ { 5, 6 } }, { dtype = 'i32' }))
    assert.same({ 0.5, 1, 1.5, 2, 2.5 }, f:read('metrics/loss'):totable())
    assert.same({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, f:read('m2'):totable())
    local ok, e = pcall(function() f:append('m2', pn.tensor({ { 1, 2, 3 } }, { dtype = 'i32' })) end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("h5 append: 'm2'"))
    ok, e = pcall(function() f:append('m2', pn.tensor({ { 1, 2 } }, { dtype = 'f32' })) end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('holds i32'))
    f:write('tmp/a', pn.ones(3))
    f:move('tmp', 'final')
    assert.is_false(f:exists('tmp'))
    assert.same({ 1, 1, 1 }, f:read('final/a'):totable())
    f:delete('final')
    assert.is_false(f:exists('final'))
    ok, e = pcall(function() f:delete('nothing') end)
    assert.truthy(tostring(e):find("h5 delete: 'nothing' not found"))
    f:close()
    assert.same({ 0.5, 1, 1.5, 2, 2.5 }, pn.io.load(path, 'metrics/loss'):totable())
    os.remove(path)
  end)
end)

describe('HDF5 unsigned 64-bit data', function()
  it('loads what i64 holds and refuses what it does not (no silent clip or wrap)', function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p '" .. dir .. "'")
    local function u64_file(name, values)
      local bin = io.open(dir .. '/' .. name .. '.bin', 'wb')
      for _, v in ipairs(values) do -- little-endian u64, from a list of 8 bytes each
        bin:write(string.char(unpack(v)))
      end
      bin:close()
      local cfg = io.open(dir .. '/' .. name .. '.cfg', 'w')
      cfg:write('PATH u\nINPUT-CLASS UIN\nINPUT-SIZE 64\nINPUT-BYTE-ORDER LE\nRANK 1\nDIMENSION-SIZES ' .. #values ..
                '\nOUTPUT-CLASS UIN\nOUTPUT-SIZE 64\nOUTPUT-ARCHITECTURE NATIVE\n')
      cfg:close()
      local ok = os.execute(string.format("env -u LD_PRELOAD h5import '%s/%s.bin' -c '%s/%s.cfg' -o '%s/%s.h5' >/dev/null 2>&1",
        dir, name, dir, name, dir, name))
      assert.truthy(ok == 0 or ok == true, 'h5import failed')
      return dir .. '/' .. name .. '.h5'
    end
    local one = { 1, 0, 0, 0, 0, 0, 0, 0 }
    local max = { 255, 255, 255, 255, 255, 255, 255, 255 }
    local good = u64_file('good', { one, { 2, 0, 0, 0, 0, 0, 0, 0 } })
    assert.same({ 1, 2 }, pn.io.load(good, 'u'):totable())
    assert.equal('i64', pn.io.load(good, 'u'):dtype())
    local bad = u64_file('bad', { one, max })
    local ok, e = pcall(pn.io.load, bad, 'u')
    assert.is_false(ok)
    assert.truthy(tostring(e):find('element 2', 1, true), tostring(e))
    assert.truthy(tostring(e):find('18446744073709551615', 1, true), tostring(e))
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe('io.read_text', function()
  it('returns the bytes as stored and names the op and path when it cannot', function()
    local p = tmp()
    local f = assert(io.open(p, 'wb'))
    f:write('a\r\nb\0c\n\255')
    f:close()
    assert.equal('a\r\nb\0c\n\255', pn.io.read_text(p, 'x'))
    local ok, e = pcall(pn.io.read_text, p .. '.missing', 'myop')
    assert.is_false(ok)
    assert.equal('myop: cannot open ' .. p .. '.missing (No such file or directory)', e)
    -- io.open opens a directory and its read returns nil: an error, not an empty string
    ok, e = pcall(pn.io.read_text, '/tmp', 'myop')
    assert.is_false(ok)
    assert.equal('myop: cannot read /tmp (Is a directory)', e)
    ok, e = pcall(pn.io.read_text, '', 'myop')
    assert.is_false(ok)
    assert.truthy(e:find('myop: a file path must be a non-empty string', 1, true), e)
    cleanup()
  end)
end)
