-- Joining and splitting (core/ops/shape.c, lua/penumbra/ops/shape.lua): cat, stack,
-- split, chunk. Values against naive plain-Lua loops, f64 gradchecks, errors.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'

local assert_error_matching = require('spec.helpers.check').assert_error_matching

local function f64(...) return pn.randn({ ... }, { dtype = 'f64' }) end
local function leaf(...) return pn.randn({ ... }, { dtype = 'f64' }):requires_grad_() end

-- naive cat of 2-D nested tables along dim 1 (rows) or 2 (columns)
local function ref_cat2(tables, d)
  local out = {}
  if d == 1 then
    for _, t in ipairs(tables) do
      for _, row in ipairs(t) do out[#out + 1] = row end
    end
  else
    for i = 1, #tables[1] do
      local row = {}
      for _, t in ipairs(tables) do
        for _, v in ipairs(t[i]) do row[#row + 1] = v end
      end
      out[i] = row
    end
  end
  return out
end

describe('cat', function()
  before_each(function() pn.manual_seed(2) end)

  it('joins along rows, columns and negative dims, also non-contiguous inputs', function()
    local a, b, c = f64(2, 3), f64(1, 3), f64(4, 3)
    assert.same(ref_cat2({ a:totable(), b:totable(), c:totable() }, 1), pn.cat({ a, b, c }):totable())
    local x, y = f64(2, 2), f64(3, 2):t()                            -- y (2,3) strided
    assert.same(ref_cat2({ x:totable(), y:totable() }, 2), pn.cat({ x, y }, 2):totable())
    assert.same(ref_cat2({ x:totable(), y:totable() }, 2), pn.cat({ x, y }, -1):totable())
    assert.same({ 2, 5, 4 }, pn.cat({ f64(2, 2, 4), f64(2, 3, 4) }, 2):shape())
    assert.same({ 1, 2, 3, 4 }, pn.cat({ pn.tensor({ 1, 2 }), pn.tensor({ 3 }), pn.tensor({ 4 }) }):totable())
    assert.same({ 3 }, pn.cat({ pn.tensor({ 5, 6, 7 }) }):shape())    -- a single tensor
  end)

  it('gradchecks, each input receiving its slice of the gradient', function()
    gradcheck(function(a, b, c) return pn.cat({ a, b, c }, 1) end, { leaf(2, 3), leaf(1, 3), leaf(2, 3) })
    gradcheck(function(a, b) return pn.cat({ a, b }, 2) end, { leaf(2, 1), leaf(2, 3) })
    local const = f64(2, 3)
    gradcheck(function(a) return pn.cat({ const, a }, -1) end, { leaf(2, 2) })
  end)

  it('names the offending tensor on mismatched shapes and dtypes', function()
    assert_error_matching(function() pn.cat({ pn.zeros(2, 3), pn.zeros(2, 3), pn.zeros(2, 4) }, 1) end,
      'cat', 'tensor 3', '[2,4]', '[2,3]')
    assert_error_matching(function() pn.cat({ pn.zeros(2, 3), pn.zeros(2, 3, { dtype = 'f64' }) }) end,
      'cat', 'tensor 1', 'f64')
    assert_error_matching(function() pn.cat({ pn.zeros(2, 3), pn.zeros(3) }) end, 'cat', 'tensor 1')
    assert_error_matching(function() pn.cat({}) end, 'cat', 'non-empty')
    assert_error_matching(function() pn.cat({ pn.zeros(2) }, 3) end, 'cat', 'dim')
    assert_error_matching(function() pn.cat({ pn.tensor(1), pn.tensor(2) }) end, 'cat', '0-dim')
  end)
end)

describe('stack', function()
  before_each(function() pn.manual_seed(3) end)

  it('joins along a new dim at the front, the middle and the end', function()
    local a, b = f64(2, 3), f64(2, 3)
    local at, bt = a:totable(), b:totable()
    assert.same({ at, bt }, pn.stack({ a, b }):totable())
    local mid = pn.stack({ a, b }, 2):totable()                      -- (2, 2, 3): mid[i] = {a[i], b[i]}
    for i = 1, 2 do assert.same({ at[i], bt[i] }, mid[i]) end
    local last = pn.stack({ a, b:t():contiguous():t() }, -1)         -- (2, 3, 2), second input strided
    assert.same({ 2, 3, 2 }, last:shape())
    local lt = last:totable()
    for i = 1, 2 do
      for j = 1, 3 do assert.same({ at[i][j], bt[i][j] }, lt[i][j]) end
    end
    assert.same({ 3, 2, 3 }, pn.stack({ a, b, a }, 1):shape())
    assert.same({ 1, 2 }, pn.stack({ pn.tensor(1), pn.tensor(2) }):totable())
  end)

  it('gradchecks', function()
    gradcheck(function(a, b) return pn.stack({ a, b }, 2) end, { leaf(2, 3), leaf(2, 3) })
    gradcheck(function(a, b) return pn.stack({ b, a, b }, -1) end, { leaf(3), leaf(3) })
  end)

  it('names the offending tensor on mismatched shapes', function()
    assert_error_matching(function() pn.stack({ pn.zeros(2, 3), pn.zeros(3, 2) }) end, 'stack', 'tensor 1', '[3,2]')
    assert_error_matching(function() pn.stack({ pn.zeros(2), pn.zeros(2, { dtype = 'i32' }) }) end, 'stack', 'i32')
    assert_error_matching(function() pn.stack({ pn.zeros(2) }, 4) end, 'stack', 'dim')
    assert_error_matching(function() pn.stack(pn.zeros(2)) end, 'stack', 'list')
  end)
end)

describe('split and chunk', function()
  it('split by a size returns narrow views, the last one smaller', function()
    local x = pn.arange(10, { dtype = 'f64' }):reshape(5, 2)
    local parts = x:split(2)
    assert.equal(3, #parts)
    assert.same({ { 0, 1 }, { 2, 3 } }, parts[1]:totable())
    assert.same({ { 8, 9 } }, parts[3]:totable())
    local cols = x:split(1, 2)
    assert.same({ 0, 2, 4, 6, 8 }, cols[1]:reshape(5):totable())
    local byl = x:split({ 1, 4 })
    assert.same({ 1, 2 }, byl[1]:shape())
    assert.same({ 4, 2 }, byl[2]:shape())
    assert.same({ { 2, 3 }, { 4, 5 }, { 6, 7 }, { 8, 9 } }, byl[2]:totable())
  end)

  it('chunk follows torch.chunk (ceil-sized pieces, possibly fewer than n)', function()
    local x = pn.arange(5, { dtype = 'f64' })
    local c = x:chunk(2)
    assert.equal(2, #c)
    assert.same({ 0, 1, 2 }, c[1]:totable())
    assert.same({ 3, 4 }, c[2]:totable())
    assert.equal(3, #pn.arange(6):chunk(4))                            -- sizes 2, 2, 2
  end)

  it('passes gradients back through the views', function()
    local x = leaf(4, 3)
    gradcheck(function(t) local p = t:split({ 1, 3 }); return p[2] end, { x })
    gradcheck(function(t) return t:chunk(3, 2)[3] end, { x })
  end)

  it('rejects sizes that do not add up', function()
    assert_error_matching(function() pn.zeros(5, 2):split({ 2, 2 }) end, 'split', 'sum to 4', '5')
    assert_error_matching(function() pn.zeros(5):split(0) end, 'split')
    assert_error_matching(function() pn.zeros(5):chunk(0) end, 'chunk')
  end)
end)
