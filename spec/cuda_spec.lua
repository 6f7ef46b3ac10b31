-- cuda_spec.lua — the CUDA device itself (DESIGN §8): moving tensors, creation on the device,
-- the caching allocator, host reads, mixed-device errors, what the kernel table still lacks,
-- and the kernel interpreter's own checks (planted bugs it must catch). Runs where
-- pn.cuda.available(): in the interpreter build (CI) and on a GPU; pending elsewhere.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local backends = require 'spec.helpers.backends'
local cu = require 'spec.helpers.cuda'

local cuda = pn.cuda.available()
local it_cuda = cuda and it or pending
local it_emu = (cuda and pn.cuda.interpreted()) and it or pending
local SCHEDULES = cu.ORDERS -- the interpreter's thread orders

local function same(a, b, what)
  assert.same(check.vals(b), check.vals(a), what)
end

describe('cuda device', function()
  it('says what it is; a build without it refuses device=cuda by name', function()
    if not cuda then
      check.assert_error_matching(function() pn.zeros({ 2 }, { device = 'cuda' }) end, 'cuda')
      assert.equal('', pn.cuda.device_name())
      return
    end
    assert.is_true(#pn.cuda.device_name() > 0)
    assert.equal(pn.cuda.interpreted(), pn.cuda.device_name():find('interpreter', 1, true) ~= nil)
  end)

  it_cuda('moves every dtype both ways, bit for bit, from any view', function()
    for _, dt in ipairs({ 'f32', 'f64', 'i32', 'i64', 'u8' }) do
      local base = pn.arange(0, 60, 1, { dtype = dt }):reshape(3, 4, 5)
      for _, v in ipairs({ base, base:transpose(1, 3), base:narrow(2, 2, 2), pn.zeros({ 0, 3 }, { dtype = dt }) }) do
        local d = v:to('cuda')
        assert.equal('cuda', d:device())
        assert.equal(dt, d:dtype())
        local back = d:to('cpu')
        assert.equal('cpu', back:device())
        same(back, v, dt)
      end
    end
  end)

  it_cuda('creates on the device: zeros, full, arange, and rand/randn from the same Philox stream', function()
    same(pn.full({ 3, 7 }, 2.5, { device = 'cuda' }):to('cpu'), pn.full({ 3, 7 }, 2.5))
    same(pn.arange(1, 10, 2, { device = 'cuda', dtype = 'i64' }):to('cpu'), pn.arange(1, 10, 2, { dtype = 'i64' }))
    same(pn.zeros({ 4, 1 }, { device = 'cuda', dtype = 'f64' }):to('cpu'), pn.zeros({ 4, 1 }, { dtype = 'f64' }))
    for _, f in ipairs({ 'rand', 'randn' }) do
      for _, dt in ipairs({ 'f32', 'f64' }) do
        pn.manual_seed(11)
        local c = pn[f]({ 5, 77 }, { dtype = dt })
        pn.manual_seed(11)
        local g = pn[f]({ 5, 77 }, { device = 'cuda', dtype = dt }):to('cpu')
        check.assert_close(check.vals(g), check.vals(c), dt == 'f32' and 1e-7 or 1e-14, f .. ' ' .. dt)
      end
    end
    local t = pn.tensor({ { 1, 2 }, { 3, 4 } }, { device = 'cuda' })
    assert.equal('cuda', t:device())
    assert.same({ { 1, 2 }, { 3, 4 } }, t:totable())
    assert.equal(4, t:select(1, 2):select(1, 2):item())
  end)

  it_cuda('copies, fills and updates in place on strided device views, and copies across devices', function()
    local d = pn.zeros({ 4, 6 }, { device = 'cuda' })
    d:narrow(2, 2, 3):fill_(7)
    d:select(1, 4):copy_(pn.arange(0, 6, 1)) -- from the cpu, cast and all
    local ref = pn.zeros({ 4, 6 })
    ref:narrow(2, 2, 3):fill_(7)
    ref:select(1, 4):copy_(pn.arange(0, 6, 1))
    same(d:to('cpu'), ref)
    local y, x = pn.ones({ 3, 5 }, { device = 'cuda', dtype = 'f64' }), pn.full({ 3, 5 }, 2, { dtype = 'f64' })
    local C = require('penumbra_ffi').C -- the optimisers' in-place updates (no Lua method)
    assert.equal(0, C.pn_axpy_(y, 0.5, x:to('cuda')))
    assert.equal(0, C.pn_scale_(y, 3))
    same(y:to('cpu'), pn.full({ 3, 5 }, 6, { dtype = 'f64' }))
    local host = pn.zeros({ 2, 3 })
    host:copy_(pn.full({ 3 }, 4, { device = 'cuda' })) -- broadcast from the device
    same(host, pn.full({ 2, 3 }, 4))
  end)

  it_cuda('carries gradients across the move, back to the device the leaf is on', function()
    local x = pn.tensor({ 1, 2, 3 }, { dtype = 'f64', requires_grad = true })
    local y = (x:to('cuda') * x:to('cuda')):sum()
    assert.equal('cuda', y:device())
    y:backward()
    assert.equal('cpu', x.grad:device())
    assert.same({ 2, 4, 6 }, x.grad:totable())
    local w = pn.tensor({ 1, -1 }, { device = 'cuda', requires_grad = true })
    local l = (w:to('cpu') * 3):sum()
    l:backward()
    assert.equal('cuda', w.grad:device())
    assert.same({ 3, 3 }, w.grad:totable())
  end)

  it_cuda('refuses to mix devices in one op, naming both', function()
    local a, b = pn.ones({ 2, 3 }), pn.ones({ 2, 3 }, { device = 'cuda' })
    check.assert_error_matching(function() return a + b end, 'cpu', 'cuda', '[2,3]')
    check.assert_error_matching(function() return b:matmul(a:t()) end, 'cpu', 'cuda')
  end)

  it_cuda('casts a device tensor to an integer dtype as the CPU does: NaN or out of range is the same error', function()
    local x = pn.tensor({ { 1.7, -2.2 }, { 0 / 0, 3 } })
    check.assert_error_matching(function() return x:to('cuda'):to('i64') end,
      'to_dtype: x [2,2] f32 holds nan at [2,1], which i64 cannot hold')
    check.assert_error_matching(function() return (x:to('cuda') * 1e10):to('i32') end, 'at [1,1], which i32')
    local ok = pn.tensor({ { 1.7, -2.2 }, { 255.5, 3 } })
    assert.same(ok:to('i32'):totable(), ok:to('cuda'):to('i32'):to('cpu'):totable())
    assert.are.equal('cuda', ok:abs():to('cuda'):to('u8'):device()) -- u8 takes (-1, 256): -2.2 would be refused
  end)

  it_cuda('caches device memory: steady-state loops call cudaMalloc zero times; empty_cache returns it', function()
    collectgarbage('collect')
    local s0 = pn.cuda.memory_stats()
    local function step()
      local a = pn.rand({ 37, 129 }, { device = 'cuda' })
      local b = pn.ones({ 1000 }, { device = 'cuda', dtype = 'f64' })
      local c = (a * 2):sum()
      return c:item() + b:sum():item()
    end
    step()
    collectgarbage('collect')
    local warm = pn.cuda.memory_stats()
    assert.is_true(warm.reserved >= warm.allocated)
    for _ = 1, 20 do step(); collectgarbage('collect') end
    local after = pn.cuda.memory_stats()
    assert.equal(warm.malloc_calls, after.malloc_calls, 'cudaMalloc calls in the steady state')
    assert.equal(s0.allocated, after.allocated, 'bytes still allocated after the loop')
    local big = pn.zeros({ 3 * 2 ^ 20 }, { device = 'cuda' }) -- 12 MiB: a class of its own
    assert.is_true(pn.cuda.memory_stats().peak >= after.allocated + 12 * 2 ^ 20)
    big = nil -- luacheck: ignore
    pn.cuda.empty_cache()
    local e = pn.cuda.memory_stats()
    assert.is_true(e.reserved >= e.allocated)
    assert.is_true(e.reserved < after.reserved + 12 * 2 ^ 20, 'the cached 12 MiB block went back')
    assert.is_true(e.free_calls > after.free_calls)
  end)

  it_cuda('matmul is exact f32 unless TF32 is asked for', function()
    local e = 2 ^ -12 -- exact in f32, lost in TF32's 10-bit mantissa
    local a = pn.full({ 2, 3 }, 1 + e, { device = 'cuda' })
    local b = pn.ones({ 3, 2 }, { device = 'cuda' })
    assert.same({ 3 + 3 * e, 3 + 3 * e }, a:matmul(b):to('cpu'):select(1, 1):totable())
    local prev = pn.cuda.allow_tf32(true)
    local ok, r = pcall(function() return a:matmul(b):to('cpu'):select(1, 1):totable() end)
    pn.cuda.allow_tf32(prev)
    assert.is_true(ok, tostring(r))
    assert.same({ 3, 3 }, r)
  end)

  it_cuda('lacks only the kernels a later issue adds (and every one it lacks is listed)', function()
    local got = pn.kernels('cuda')
    local missing = {}
    for _, name in ipairs(got) do
      if not got[name] then missing[#missing + 1] = name end
    end
    local want = {}
    for name in pairs(backends.PENDING.cuda) do want[#want + 1] = name end
    table.sort(missing)
    table.sort(want)
    assert.same(want, missing)
  end)
end)

describe('cuda kernel interpreter', function()
  it_emu('schedules: fwd, rev, rand:SEED; anything else is an error naming them', function()
    local prev = pn.cuda.schedule()
    assert.equal('rev', pn.cuda.schedule('rev'))
    assert.equal('rand:9', pn.cuda.schedule('rand:9'))
    check.assert_error_matching(function() pn.cuda.schedule('backwards') end, 'fwd', 'rev', 'rand')
    pn.cuda.schedule(prev)
  end)

  it_emu('a shared-memory exchange without its barrier is caught; with it, every order agrees', function()
    local fixed, broken = {}, {}
    for _, s in ipairs(SCHEDULES) do
      pn.cuda.with_schedule(s, function()
        local ok, v = pn.cuda.selftest('missing_sync_fixed')
        assert.is_true(ok, tostring(v))
        fixed[s] = table.concat(v, ',', 1, 64)
        ok, v = pn.cuda.selftest('missing_sync')
        broken[s] = ok and table.concat(v, ',', 1, 64) or v
      end)
    end
    for _, s in ipairs(SCHEDULES) do assert.equal(fixed.fwd, fixed[s], s) end
    local differs = false
    for _, s in ipairs(SCHEDULES) do differs = differs or broken[s] ~= fixed[s] end
    assert.is_true(differs, 'the missing barrier went unnoticed under every schedule')
  end)

  it_emu('cp.async tiles: with the wait and barriers every order gives the sums; without either it is caught', function()
    -- 64 threads, 5 tiles of 256 floats (tile k, float e = 256k + e); thread t adds float
    -- 4(63 − t) + 1 of every tile, a word another thread copied
    local want = {}
    for t = 0, 63 do
      local s = 0
      for k = 0, 4 do s = s + 256 * k + 4 * (63 - t) + 1 end
      want[t + 1] = s
    end
    local broken = { cp_async_no_wait = false, cp_async_no_barrier = false }
    for _, s in ipairs(SCHEDULES) do
      pn.cuda.with_schedule(s, function()
        for _, good in ipairs({ 'cp_async', 'cp_async8', 'cp_async4' }) do
          local ok, v = pn.cuda.selftest(good)
          assert.is_true(ok, good .. ': ' .. tostring(v))
          assert.same(want, { unpack(v, 1, 64) }, good .. ' ' .. s)
        end
        local ok, v
        for name in pairs(broken) do
          ok, v = pn.cuda.selftest(name)
          assert.is_true(ok, name .. ': ' .. tostring(v))
          local got = { unpack(v, 1, 64) }
          for i = 1, 64 do broken[name] = broken[name] or got[i] ~= want[i] end
        end
      end)
    end
    for name, seen in pairs(broken) do assert.is_true(seen, name .. ' went unnoticed under every schedule') end
  end)

  it_emu('reports a misaligned cp.async (16, 8 or 4 bytes) and one whose destination is not shared memory', function()
    for name, pat in pairs({ cp_async_misaligned = 'misaligned', cp_async8_misaligned = 'cp.async of 8 bytes',
                             cp_async4_misaligned = 'cp.async of 4 bytes',
                             cp_async_to_global = 'writes outside every shared array' }) do
      local ok, v = pn.cuda.selftest(name)
      assert.is_false(ok, name .. ' was not caught')
      assert.is_truthy(tostring(v):find(pat, 1, true), name .. ': ' .. tostring(v))
    end
  end)

  it_emu('reports a shared-memory overflow, a divergent barrier, a host pointer and a missing lane', function()
    local ok, v = pn.cuda.selftest('shared_ok')
    assert.is_true(ok, tostring(v))
    for name, pat in pairs({ shared_overflow = 'past its end', divergent_barrier = 'divergent barrier',
                             host_pointer = 'not device memory', shuffle_missing_lane = 'lane' }) do
      ok, v = pn.cuda.selftest(name)
      assert.is_false(ok, name .. ' was not caught')
      assert.is_truthy(tostring(v):find(pat, 1, true), name .. ': ' .. tostring(v))
    end
  end)

  it_emu('a host read before the stream is synchronised sees stale memory; with the wait it does not', function()
    local ok, stale = pn.cuda.selftest('stale_read')
    assert.is_true(ok, tostring(stale))
    local ok2, good = pn.cuda.selftest('stale_read_fixed')
    assert.is_true(ok2, tostring(good))
    assert.is_true(stale[1] ~= stale[1], 'stale read returned ' .. tostring(stale[1]) .. ', not the NaN fill')
    assert.is_true(good[1] == good[1], 'the synchronised read is NaN')
  end)

  it_emu('warp shuffles and atomics give exact results under every schedule', function()
    for _, s in ipairs(SCHEDULES) do
      pn.cuda.with_schedule(s, function()
        local ok, v = pn.cuda.selftest('shuffle_reduce')
        assert.is_true(ok, tostring(v))
        assert.same({ 496, 1520 }, { v[1], v[2] })
        ok, v = pn.cuda.selftest('atomic_sum') -- 64 blocks × 256 threads: +1 (int, float), +i (u64)
        assert.is_true(ok, tostring(v))
        assert.same({ 16384, 16384, 16384 * 16383 / 2 }, { v[1], v[2], v[3] })
      end)
    end
  end)
end)
