-- Indexing and graph ops (core/ops/index.c): embedding, index_select, gather,
-- scatter_add, index_add, segment_sum, segment_softmax. Values against naive plain-Lua
-- loops (indices are 0-based everywhere), f64 gradchecks, range and offset errors,
-- determinism across thread counts.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local flat = gradcheck.flat

local assert_error_matching = require('spec.helpers.check').assert_error_matching

local function assert_near_list(want, got, tol)
  tol = tol or 1e-5
  assert.equal(#want, #got)
  for i = 1, #want do
    assert.is_true(math.abs(want[i] - got[i]) <= tol * (1 + math.abs(want[i])),
      string.format('element %d: got %.9g, want %.9g', i, got[i], want[i]))
  end
end

local function f64(...) return pn.randn({ ... }, { dtype = 'f64' }) end
local function leaf(...) return pn.randn({ ... }, { dtype = 'f64' }):requires_grad_() end
local function i64(t) return pn.tensor(t, { dtype = 'i64' }) end
local function i32(t) return pn.tensor(t, { dtype = 'i32' }) end

describe('embedding', function()
  before_each(function() pn.manual_seed(3) end)

  it('looks up rows for i32 and i64 indices of any shape', function()
    local w = pn.randn(5, 3)
    local wt = w:totable()
    local idx = { { 0, 4, 2 }, { 4, 4, 1 } }
    for _, mk in ipairs({ i32, i64 }) do
      local e = pn.embedding(w, mk(idx))
      assert.same({ 2, 3, 3 }, e:shape())
      local et = e:totable()
      for i = 1, 2 do
        for j = 1, 3 do assert.same(wt[idx[i][j] + 1], et[i][j]) end
      end
    end
    assert.same({ 3 }, pn.embedding(w, i64(2)):shape())          -- 0-dim index → one row
    assert.same(wt[2], pn.embedding(w:t():contiguous():t(), { 1 }):totable()[1])  -- strided weight, Lua list
  end)

  it('gradchecks, with repeated indices accumulated into the same row', function()
    local idx = i64({ { 0, 2, 2 }, { 3, 0, 2 } })
    gradcheck(function(w) return pn.embedding(w, idx) end, { leaf(4, 3) })
    local w = pn.zeros(3, 2, { dtype = 'f64' }):requires_grad_()
    pn.embedding(w, i64({ 1, 1, 2, 1 })):backward(pn.ones(4, 2, { dtype = 'f64' }))
    assert.same({ { 0, 0 }, { 3, 3 }, { 1, 1 } }, w.grad:totable())
  end)

  it('rejects out-of-range and negative indices, float indices and non-2-D weights', function()
    local w = pn.zeros(5, 3)
    assert_error_matching(function() pn.embedding(w, i64({ { 0, 1 }, { 7, 2 } })) end,
      'embedding', 'value 7', 'position [2,1]', '[5,3]')
    assert_error_matching(function() pn.embedding(w, i32({ -1 })) end, 'embedding', 'value -1')
    assert_error_matching(function() pn.embedding(w, pn.tensor({ 0, 1 })) end, 'embedding', 'f32', 'i32 or i64')
    assert_error_matching(function() pn.embedding(pn.zeros(5), i64({ 0 })) end, 'embedding', '2-D')
  end)
end)

describe('index_select and index_add', function()
  before_each(function() pn.manual_seed(4) end)

  it('index_select picks entries along a dim, also for non-contiguous x', function()
    local x = f64(3, 4)
    local xt = x:totable()
    local idx = { 3, 0, 3 }
    local r1 = x:index_select(1, i64({ 2, 0 })):totable()
    assert.same({ xt[3], xt[1] }, r1)
    local r2 = x:index_select(-1, i32(idx)):totable()
    for i = 1, 3 do
      for j = 1, 3 do assert.equal(xt[i][idx[j] + 1], r2[i][j]) end
    end
    local r3 = x:t():index_select(2, i64({ 1, 1 })):totable()   -- xᵀ (4,3), columns 1,1
    for i = 1, 4 do assert.same({ xt[2][i], xt[2][i] }, r3[i]) end
    local ints = pn.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = 'i32' })
    assert.same({ { 3, 4 } }, ints:index_select(1, { 1 }):totable())
  end)

  it('index_add adds rows of src at idx (repeats accumulate), out-of-place', function()
    local x, src = f64(4, 2), f64(3, 2)
    local xt, st = x:totable(), src:totable()
    local idx = { 1, 3, 1 }
    local got = x:index_add(1, i64(idx), src):totable()
    local want = x:totable()
    for j = 1, 3 do
      for c = 1, 2 do want[idx[j] + 1][c] = want[idx[j] + 1][c] + st[j][c] end
    end
    for i = 1, 4 do assert_near_list(want[i], got[i], 1e-12) end
    assert.same(xt, x:totable())                                 -- x untouched
    local got2 = x:index_add(2, i64({ 1 }), pn.ones(4, 1, { dtype = 'f64' })):totable()
    for i = 1, 4 do assert.near(xt[i][2] + 1, got2[i][2], 1e-12) end
  end)

  it('gradchecks index_select and index_add', function()
    local idx = i64({ 2, 0, 2, 1 })
    gradcheck(function(x) return x:index_select(1, idx) end, { leaf(3, 2) })
    gradcheck(function(x) return x:index_select(2, idx) end, { leaf(2, 3, 2) })
    gradcheck(function(x, s) return x:index_add(2, idx, s) end, { leaf(2, 3), leaf(2, 4) })
  end)

  it('rejects out-of-range indices, 2-D idx and badly shaped src', function()
    local x = pn.zeros(3, 4)
    assert_error_matching(function() x:index_select(2, i64({ 0, 4 })) end,
      'index_select', 'value 4', 'position [2]', 'dim 2 of x [3,4]')
    assert_error_matching(function() x:index_select(1, i64({ { 0 } })) end, 'index_select', '1-D')
    assert_error_matching(function() x:index_select(3, i64({ 0 })) end, 'index_select', 'dim')
    assert_error_matching(function() x:index_add(1, i64({ 0, 1 }), pn.zeros(3, 4)) end, 'index_add', '[3,4]')
    -- a Lua list of indices: a fraction or a NaN is named by the op that was called
    assert_error_matching(function() x:index_select(1, { 0, 1.5 }) end, 'index_select: idx element 2 is 1.5')
    assert_error_matching(function() x:gather(1, { { 0 / 0 } }) end, 'gather: idx element', 'nan')
  end)
end)

describe('gather and scatter_add', function()
  before_each(function() pn.manual_seed(6) end)

  it('gather follows torch.gather along either dim, idx smaller than x', function()
    local x = f64(3, 4)
    local xt = x:totable()
    local idx2, idx1 = { { 3, 0 }, { 1, 1 } }, { { 2, 0 }, { 1, 2 } }  -- (2, 2)
    local g2 = x:gather(2, i64(idx2)):totable()
    local g1 = x:gather(1, i32(idx1)):totable()
    for i = 1, 2 do
      for j = 1, 2 do
        assert.equal(xt[i][idx2[i][j] + 1], g2[i][j])
        assert.equal(xt[idx1[i][j] + 1][j], g1[i][j])
      end
    end
    local gt = x:t():gather(1, i64({ { 2, 0, 1 } })):totable()       -- xᵀ (4,3), rows chosen per column
    assert.same({ { xt[1][3], xt[2][1], xt[3][2] } }, gt)
  end)

  it('scatter_add adds src at idx along dim (repeats accumulate; src may be larger than idx)', function()
    local x, src = f64(3, 4), f64(2, 5)
    local xt, st = x:totable(), src:totable()
    local idx = { { 0, 2, 0, 2 }, { 1, 1, 1, 0 } }                   -- (2,4) ≤ src (2,5)
    local got = x:scatter_add(1, i64(idx), src):totable()
    local want = x:totable()
    for i = 1, 2 do
      for j = 1, 4 do want[idx[i][j] + 1][j] = want[idx[i][j] + 1][j] + st[i][j] end
    end
    for i = 1, 3 do assert_near_list(want[i], got[i], 1e-12) end
    assert.same(xt, x:totable())
    local got2 = x:scatter_add(2, i64({ { 3, 3 } }), src):totable()  -- along columns
    assert.near(xt[1][4] + st[1][1] + st[1][2], got2[1][4], 1e-12)
    local counts = pn.zeros(3, { dtype = 'i64' }):scatter_add(1, i64({ 0, 2, 2, 2 }), pn.ones(4, { dtype = 'i64' }))
    assert.same({ 1, 0, 3 }, counts:totable())                        -- integer scatter (degree count)
  end)

  it('gradchecks gather and scatter_add (x and src)', function()
    local idx = i64({ { 0, 2, 0 }, { 1, 1, 2 } })
    gradcheck(function(x) return x:gather(1, idx) end, { leaf(3, 3) })
    gradcheck(function(x) return x:gather(2, idx) end, { leaf(2, 4) })
    gradcheck(function(x, s) return x:scatter_add(1, idx, s) end, { leaf(3, 3), leaf(2, 3) })
    gradcheck(function(x, s) return x:scatter_add(2, idx, s) end, { leaf(2, 3), leaf(3, 4) })  -- src larger than idx
  end)

  it('rejects out-of-range indices and shape mismatches', function()
    local x = pn.zeros(3, 4)
    assert_error_matching(function() x:gather(2, i64({ { 0, 1 }, { 2, 9 } })) end,
      'gather', 'value 9', 'position [2,2]', 'dim 2 of x [3,4]')
    assert_error_matching(function() x:gather(1, i64({ 0, 1 })) end, 'gather', 'same number of dims')
    assert_error_matching(function() x:gather(1, i64({ { 0, 0, 0, 0, 0 } })) end, 'gather', 'larger than x')
    assert_error_matching(function() x:scatter_add(1, i64({ { 0, 1 } }), pn.zeros(1, 1)) end, 'scatter_add', 'src')
    assert_error_matching(function() x:scatter_add(1, i64({ { -2 } }), pn.zeros(1, 1)) end, 'scatter_add', 'value -2')
    assert_error_matching(function() x:scatter_add(1, i64({ { 0 } }), pn.zeros(1, 1, { dtype = 'f64' })) end,
      'scatter_add', 'dtype')
  end)
end)

describe('segment ops (CSR)', function()
  before_each(function() pn.manual_seed(8) end)
  local offsets = { 0, 2, 2, 5, 6 }                                   -- segments of 2, 0, 3, 1 rows

  local function ref_segment_softmax(xt, off)
    local out = {}
    for s = 1, #off - 1 do
      local m = -math.huge
      for e = off[s] + 1, off[s + 1] do m = math.max(m, xt[e]) end
      local z = 0
      for e = off[s] + 1, off[s + 1] do z = z + math.exp(xt[e] - m) end
      for e = off[s] + 1, off[s + 1] do out[e] = math.exp(xt[e] - m) / z end
    end
    return out
  end

  it('segment_sum sums the rows of each segment (empty ones give zeros)', function()
    local x = f64(6, 3)
    local xt = x:totable()
    for _, mk in ipairs({ i32, i64 }) do
      local got = pn.segment_sum(x, mk(offsets)):totable()
      assert.equal(4, #got)
      for s = 1, 4 do
        local want = { 0, 0, 0 }
        for e = offsets[s] + 1, offsets[s + 1] do
          for c = 1, 3 do want[c] = want[c] + xt[e][c] end
        end
        assert_near_list(want, got[s], 1e-12)
      end
    end
    assert.same({ 3, 0, 12, 6 }, pn.segment_sum(pn.tensor({ 1, 2, 3, 4, 5, 6 }), offsets):totable())
  end)

  it('segment_softmax normalises each segment, per trailing element', function()
    local x = f64(6, 2)
    local xt = x:totable()
    local got = pn.segment_softmax(x, i64(offsets)):totable()
    for c = 1, 2 do
      local col = {}
      for e = 1, 6 do col[e] = xt[e][c] end
      local want = ref_segment_softmax(col, offsets)
      for e = 1, 6 do assert.near(want[e], got[e][c], 1e-12) end
    end
    local v = pn.tensor({ 1, 2, 3, 1000, 1000, -1 })                  -- large values stay finite (max shift)
    local want = ref_segment_softmax(v:totable(), offsets)
    assert_near_list(want, flat(pn.segment_softmax(v, offsets)), 1e-5)
    local ninf = pn.tensor({ -math.huge, -math.huge, 0 })             -- an all -inf segment → zeros
    assert.same({ 0, 0, 1 }, pn.segment_softmax(ninf, { 0, 2, 3 }):totable())
  end)

  it('gradchecks segment_sum and segment_softmax', function()
    local off = i64(offsets)
    gradcheck(function(x) return pn.segment_sum(x, off) end, { leaf(6, 2) })
    gradcheck(function(x) return pn.segment_softmax(x, off) end, { leaf(6, 2) })
    gradcheck(function(x) return pn.segment_softmax(x, off) end, { leaf(6) })
  end)

  it('rejects bad offsets with a message naming the problem', function()
    local x = pn.zeros(6, 2)
    assert_error_matching(function() pn.segment_sum(x, i64({ 1, 3, 6 })) end, 'segment_sum', 'start at 0')
    assert_error_matching(function() pn.segment_sum(x, i64({ 0, 4, 3, 6 })) end,
      'segment_sum', 'non-decreasing', 'offsets[3] = 3')
    assert_error_matching(function() pn.segment_softmax(x, i64({ 0, 3, 5 })) end,
      'segment_softmax', 'end at the 6 rows', '[6,2]')
    assert_error_matching(function() pn.segment_sum(x, pn.tensor({ 0, 6 })) end, 'segment_sum', 'i32 or i64')
    assert_error_matching(function() pn.segment_softmax(pn.zeros(2, { dtype = 'i32' }), { 0, 2 }) end,
      'segment_softmax', 'f32 or f64')
  end)
end)

describe('index ops are deterministic across thread counts', function()
  it('gives bit-identical accumulations with 1 and 2 threads', function()
    local saved = pn.num_threads()
    pn.manual_seed(9)
    local n, v, d = 40000, 50, 4
    local src = pn.randn(n, d)
    local idx = pn.rand(n):mul(v):to('i64')
    local ones_idx = idx:reshape(n, 1):expand(n, d):contiguous()
    local off = pn.tensor({ 0, 10000, 10000, 40000 }, { dtype = 'i64' })
    local function run()
      local w = pn.zeros(v, d):requires_grad_()
      pn.embedding(w, idx):backward(src)
      return {
        flat(pn.zeros(v, d):index_add(1, idx, src)),
        flat(pn.zeros(v, d):scatter_add(1, ones_idx, src)),
        flat(w.grad),
        flat(pn.segment_sum(src, off)),
      }
    end
    pn.set_num_threads(1)
    local one = run()
    pn.set_num_threads(2)
    local two = run()
    pn.set_num_threads(saved)
    for k = 1, #one do assert.same(one[k], two[k]) end
  end)
end)
