-- Ownership: every tensor, storage byte and autograd node created from Lua is released
-- once Lua drops it (DESIGN §2: ffi.gc on every owned pointer). The live counters come
-- from core/alloc.c.
local pn = require 'penumbra'

local function settle()
  for _ = 1, 3 do collectgarbage('collect') end
end

describe('ownership', function()
  it('returns the live tensor, byte and node counters to their start', function()
    settle()
    local t0, b0, n0 = pn.live_tensors(), pn.live_bytes(), pn.live_nodes()
    for i = 1, 200 do
      local a = pn.randn({ 8, 16 }, { requires_grad = (i % 2 == 0) })
      local b = pn.ones(16, 4)
      local v = a:transpose(1, 2):contiguous():view(-1):narrow(1, 1, 10):unsqueeze(1):expand(3, 10)
      local c = (a * 2 + 1):exp():sum()
      if a.requires_grad then c:backward() end
      local views = { a:select(1, 1), a:permute(2, 1), v:clone(), a:to('f64'), b:slice(1, 2, 3) }
      assert.equal(5, #views)
    end
    settle()
    assert.equal(t0, pn.live_tensors())
    assert.equal(b0, pn.live_bytes())
    assert.equal(n0, pn.live_nodes())
  end)

  it('keeps storage alive while a view of it lives', function()
    settle()
    local b0 = pn.live_bytes()
    local view
    do
      local base = pn.zeros(1000) -- 4000 bytes
      view = base:narrow(1, 11, 5)
    end
    settle()
    assert.equal(b0 + 4000, pn.live_bytes()) -- the view holds the whole storage
    assert.same({ 0, 0, 0, 0, 0 }, view:totable())
    view = nil
    settle()
    assert.equal(b0, pn.live_bytes())
  end)

  it('releases tensors whose op failed half-way', function()
    settle()
    local t0, b0 = pn.live_tensors(), pn.live_bytes()
    for _ = 1, 50 do
      pcall(function() return pn.ones(2, 3) + pn.ones(4, 5) end)
      pcall(function() return pn.ones(2, 3):view(7) end)
      pcall(function() return pn.zeros(-1) end)
    end
    settle()
    assert.equal(t0, pn.live_tensors())
    assert.equal(b0, pn.live_bytes())
  end)

  -- core/alloc.c parks freed blocks of 1 MiB and more for the next tensor that fits, up to the
  -- larger of 1 GiB and the peak of live bytes. A fixed 1 GiB refused a block past it: an NMT
  -- step's logits then went back to the kernel and came back as fresh pages every few steps.
  it('parks a freed block larger than 1 GiB and hands it to the next tensor that fits', function()
    if pn.host_cached_bytes() < 0 then pending('no host block cache in this build (ASan)') return end
    local ffi = require 'ffi'
    pcall(ffi.cdef, 'struct pn_spec_rusage { long t[4]; long maxrss, ixrss, idrss, isrss, minflt, majflt, rest[8]; };' ..
      'int getrusage(int who, struct pn_spec_rusage *usage);')
    local ru = ffi.new('struct pn_spec_rusage')
    local function faults() ffi.C.getrusage(0, ru) return tonumber(ru.minflt) end
    settle()
    pn.host_empty_cache()
    assert.equal(0, pn.host_cached_bytes())
    local n = 300 * 1024 * 1024 -- f32: 1.17 GiB
    local a = pn.zeros(n)
    a = nil
    settle()
    assert.is_true(pn.host_cached_bytes() >= 4 * n, 'parked ' .. pn.host_cached_bytes())
    local f0 = faults()
    local b = pn.zeros(n) -- the parked block, pages already in place
    local f1 = faults()
    assert.is_true(pn.host_cached_bytes() < 4 * n, 'still parked ' .. pn.host_cached_bytes())
    assert.is_true(f1 - f0 < 64, (f1 - f0) .. ' page faults filling a reused block')
    assert.equal(0, b:narrow(1, n - 9, 10):sum():item())
    -- a block that does not fit beside the parked ones sends the longest-parked away first
    b = nil
    settle()
    local c = pn.empty(n / 2)
    c = nil
    settle()
    local parked = pn.host_cached_bytes()
    assert.is_true(parked >= 2 * n and parked < 4 * n, 'parked ' .. parked)
    pn.host_empty_cache()
    assert.equal(0, pn.host_cached_bytes())
  end)
end)
