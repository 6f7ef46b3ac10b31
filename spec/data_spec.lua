-- pn.data: datasets found by name (the registry recipes load through)
local pn = require 'penumbra'

describe('data registry', function()
  it('lists the registered datasets and loads one by name', function()
    local names = pn.data.list()
    assert.truthy(#names >= 2)
    local seen = {}
    for _, n in ipairs(names) do seen[n] = true end
    assert.is_true(seen.cora and seen.citeseer)
    local d = pn.data.load('cora')
    assert.equal(2708, d.num_nodes)
    assert.equal(7, d.num_classes)
    local info = pn.data.info('citeseer')
    assert.truthy(info.description:find('CiteSeer', 1, true))
    assert.truthy(info.options.self_loops)
  end)

  it('an unknown name is an error listing the registered ones', function()
    local ok, e = pcall(pn.data.load, 'ppi_typo')
    assert.is_false(ok)
    assert.truthy(tostring(e):find("unknown dataset 'ppi_typo'", 1, true))
    assert.truthy(tostring(e):find('cora', 1, true) and tostring(e):find('citeseer', 1, true))
  end)

  it('a loader rejects unknown options, naming the valid ones', function()
    local ok, e = pcall(pn.data.load, 'cora', { self_loop = false })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("unknown option 'self_loop'", 1, true))
    assert.truthy(tostring(e):find('self_loops', 1, true))
  end)

  it('registers a new dataset once; a second registration of the name is an error', function()
    local name = 'spec_toy_' .. tostring(os.time())
    pn.data.register(name, function(opts) return { n = opts.n or 3 } end, { description = 'a toy' })
    assert.equal(4, pn.data.load(name, { n = 4 }).n)
    local ok, e = pcall(pn.data.register, name, function() end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('already registered', 1, true))
    ok, e = pcall(pn.data.register, 'x', 42)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('loader must be a function', 1, true))
  end)

  it('a missing file names every path tried and where the data comes from', function()
    local ok, e = pcall(pn.data.find, 'no_such_dataset.h5')
    assert.is_false(ok)
    assert.truthy(tostring(e):find('no_such_dataset.h5', 1, true))
    assert.truthy(tostring(e):find('../shared/datasets/README.md', 1, true))
  end)
end)

describe('dataset validation', function()
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'int setenv(const char *, const char *, int); int unsetenv(const char *);')
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p '" .. dir .. "'")

  -- a small Planetoid-shaped file: 4 nodes, 2 features, labels as given
  local function write(labels, num_classes)
    local f = pn.io.open(dir .. '/cora.h5', 'w')
    f:write('features', pn.tensor({ { 1, 0 }, { 0, 1 }, { 1, 1 }, { 0, 0 } }))
    f:write('labels', pn.tensor(labels, { dtype = 'i32' }))
    f:write('edges', pn.tensor({ { 0, 1 }, { 1, 0 } }, { dtype = 'i32' }))
    for _, m in ipairs({ 'train_mask', 'val_mask', 'test_mask' }) do
      f:write(m, pn.tensor({ 1, 1, 0, 0 }, { dtype = 'u8' }))
    end
    if num_classes then f:set_attr('/', 'num_classes', num_classes) end
    f:close()
  end
  local function load() -- with PENUMBRA_DATA pointing at dir, then as it was
    local saved = os.getenv('PENUMBRA_DATA')
    ffi.C.setenv('PENUMBRA_DATA', dir, 1)
    local ok, r = pcall(pn.data.load, 'cora')
    if saved then ffi.C.setenv('PENUMBRA_DATA', saved, 1) else ffi.C.unsetenv('PENUMBRA_DATA') end
    return ok, r
  end

  it('checks labels against the num_classes attribute before sizing anything by them', function()
    write({ 0, 1, 1000000, 2 }, 7)
    local ok, e = load()
    assert.is_false(ok)
    assert.truthy(tostring(e):find('labels out of range', 1, true), tostring(e))
    assert.truthy(tostring(e):find('num_classes = 7', 1, true), tostring(e))
    write({ 0, 1, 2, 1 }, 7)
    local ok2, d = load()
    assert.is_true(ok2, tostring(d))
    assert.equal(7, d.num_classes)
  end)

  it('without the attribute, a label as large as the node count is refused', function()
    write({ 0, 1, 1000000, 2 })
    local ok, e = load()
    assert.is_false(ok)
    assert.truthy(tostring(e):find('no num_classes attribute', 1, true), tostring(e))
  end)
end)

describe('dataset provenance', function()
  it('a PENUMBRA_DATA that is not a directory is said, not silently skipped', function()
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local script = os.tmpname() .. '.lua'
    local f = io.open(script, 'w')
    f:write("local pn = require 'penumbra'; pn.data.find('cora.h5')\n")
    f:close()
    local p = io.popen(string.format("cd '%s' && PENUMBRA_DATA=/no/such/dir ./bench '%s' 2>&1", home, script))
    local out = p:read('*a')
    p:close()
    os.remove(script)
    assert.truthy(out:find('PENUMBRA_DATA=/no/such/dir is not a directory', 1, true), out)
  end)

  it('checksums a dataset file (sha256), as run files record it', function()
    local path = os.tmpname()
    local f = io.open(path, 'w')
    f:write('abc')
    f:close()
    assert.equal('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad', pn.data.checksum(path))
    os.remove(path)
    assert.is_nil(pn.data.checksum('/no/such/file'))
  end)
end)
