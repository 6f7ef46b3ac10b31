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

  -- Blocks of 32 MiB and more are mapped by core/alloc.c and parked for reuse: a larger request
  -- grows a parked block (its pages moved to the head of a new mapping), a smaller one cuts the
  -- parked block's tail. Values must survive both, and no mapping may leak.
  it('reuses large blocks of varying size without mixing or leaking them', function()
    local function vmsize()
      local f = io.open('/proc/self/status')
      if not f then return nil end
      local kb = f:read('*a'):match('VmSize:%s*(%d+)')
      f:close()
      return tonumber(kb) * 1024
    end
    settle()
    local b0, v0 = pn.live_bytes(), vmsize()
    local MiB = 2 ^ 20 / 4 -- floats
    for i = 1, 60 do
      -- sizes from 34 to 90 MiB in a shuffled order, two alive at once
      local na = math.floor((34 + (i * 37) % 57) * MiB)
      local nb = math.floor((34 + (i * 23 + 11) % 57) * MiB) + 3
      local a = pn.full({ na }, i)
      local b = pn.full({ nb }, -i)
      assert.equal(i, a:max():item())
      assert.equal(i, a:min():item())
      assert.equal(-i, b:max():item())
      assert.equal(-i, b:min():item())
      a, b = nil, nil
      settle()
    end
    settle()
    assert.equal(b0, pn.live_bytes())
    -- at most the 1 GiB parking limit stays mapped; a lost tail a round would be gigabytes
    if v0 then assert.is_true(vmsize() - v0 < 1.25 * 2 ^ 30, 'address space grew by ' .. (vmsize() - v0)) end
  end)
end)
