-- Flushing subnormals (core/fpmode.c, pn.set_flush_denormal, the runner's flush_denormal key):
-- off by default; when on, subnormal results are zeros on every thread of the pool — in our own
-- loops and in the GEMMs OpenBLAS runs on those threads — and NaN/inf pass; off again, IEEE
-- subnormals come back; a run sets it for itself and restores it.
local pn = require 'penumbra'

local runs = os.tmpname()
os.remove(runs)
do
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'int setenv(const char *, const char *, int);')
  ffi.C.setenv('PENUMBRA_RUNS', runs, 1)
end

local SUB = 2 ^ -130 -- a subnormal f32 (the smallest normal is 2^-126)

-- The results are read back with IEEE arithmetic: reading a subnormal f32 into a Lua number
-- while DAZ is on would give 0 on this thread whatever the pool computed.
local function read(t)
  local was = pn.flush_denormal()
  pn.set_flush_denormal(false)
  local r = t:view(-1):totable()
  pn.set_flush_denormal(was)
  return r
end

-- n elements, each a product 2^-60 · 2^-70 = 2^-130: large enough that the elementwise loop
-- splits across the pool's threads
local function products(n)
  local a = pn.full({ n }, 2 ^ -60)
  local b = pn.full({ n }, 2 ^ -70)
  return read(a * b)
end

-- (m, 64) · (64, 64) with every product 2^-62 · 2^-74 and 64 of them summed: 2^-130 each
-- (a GEMM this size splits its rows across the threads: ops/matmul.c)
local function gemm(m)
  local a = pn.full({ m, 64 }, 2 ^ -62)
  local b = pn.full({ 64, 64 }, 2 ^ -74)
  return read(pn.matmul(a, b))
end

local function count(t, v)
  local c = 0
  for _, x in ipairs(t) do if x == v then c = c + 1 end end
  return c
end

describe('flush_denormal', function()
  local threads
  before_each(function() threads = pn.num_threads() end)
  after_each(function()
    pn.set_flush_denormal(false)
    pn.set_num_threads(threads)
  end)

  it('is off until asked for: IEEE subnormals', function()
    assert.is_false(pn.flush_denormal())
    local t = products(200000)
    assert.equal(200000, count(t, SUB))
  end)

  it('flushes on every thread, in our loops and in GEMMs, and restores IEEE when turned off', function()
    pn.set_num_threads(2)
    -- IEEE first: the pool's threads exist before the mode changes (threads started after it
    -- would inherit it and hide a pool left out)
    assert.equal(4096 * 64, count(gemm(4096), SUB))
    assert.equal(2000000, count(products(2000000), SUB))
    if not pn.set_flush_denormal(true) then
      pending('this CPU has no flush-to-zero mode')
      return
    end
    assert.is_true(pn.flush_denormal())
    local t = products(2000000)
    assert.equal(2000000, count(t, 0))
    local g = gemm(4096)
    assert.equal(#g, count(g, 0))
    -- threads the pool starts later inherit the mode
    pn.set_num_threads(4)
    t = products(400000)
    assert.equal(400000, count(t, 0))
    pn.set_num_threads(2)

    assert.is_true(pn.set_flush_denormal(false))
    assert.is_false(pn.flush_denormal())
    t = products(200000)
    assert.equal(200000, count(t, SUB))
    g = gemm(4096)
    assert.equal(#g, count(g, SUB))
  end)

  it('leaves NaN, inf and normal numbers alone', function()
    if not pn.set_flush_denormal(true) then
      pending('this CPU has no flush-to-zero mode')
      return
    end
    local x = pn.tensor({ 0 / 0, math.huge, -math.huge, 2 ^ -126, -1.5, 1e30 })
    local t = read(x * 1)
    assert.is_true(t[1] ~= t[1])
    assert.equal(math.huge, t[2])
    assert.equal(-math.huge, t[3])
    assert.equal(2 ^ -126, t[4])
    assert.equal(-1.5, t[5])
    assert.equal(pn.tensor({ 1e30 }):totable()[1], t[6])
  end)

  it('takes only true or false', function()
    local ok, e = pcall(pn.set_flush_denormal, 1)
    assert.is_false(ok)
    assert.matches('set_flush_denormal: on must be true or false, got number', tostring(e), 1, true)
  end)

  it('holds for a run that has the key, and is restored after it', function()
    local seen = {}
    local def = {
      name = 'flush_toy', config = { epochs = 1, flush_denormal = true },
      setup = function() return {} end,
      train = function() seen[#seen + 1] = pn.flush_denormal() return { loss = 1 } end,
      evaluate = function() return { acc = 1 } end,
    }
    local r = pn.experiment.run(def, { _quiet = true })
    assert.equal('finished', r.status)
    assert.is_true(seen[1])
    assert.is_false(pn.flush_denormal())
    r = pn.experiment.run(def, { _quiet = true, flush_denormal = 'false' })
    assert.is_false(seen[2])
    local ok, e = pcall(pn.experiment.run, def, { _quiet = true, flush_denormal = 'yes' })
    assert.is_false(ok)
    assert.matches('flush_denormal must be true or false', tostring(e), 1, true)
  end)
end)
