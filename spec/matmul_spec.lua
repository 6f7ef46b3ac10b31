-- Matrix products (core/ops/matmul.c): torch.matmul semantics against a naive plain-Lua
-- reference, transposed / strided / expanded operands, batch broadcasting, f64 gradchecks
-- and error messages.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local flat = gradcheck.flat

local assert_error_matching = require('spec.helpers.check').assert_error_matching

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- Naive torch.matmul on flat row-major arrays: returns flat result and its shape.
local function ref_matmul(A, as, Bv, bs)
  local a1, b1 = #as == 1, #bs == 1
  local ash = a1 and { 1, as[1] } or as
  local bsh = b1 and { bs[1], 1 } or bs
  local M, K = ash[#ash - 1], ash[#ash]
  local N = bsh[#bsh]
  assert(K == bsh[#bsh - 1], 'reference: inner dims differ')
  local abat, bbat = {}, {}
  for i = 1, #ash - 2 do abat[i] = ash[i] end
  for i = 1, #bsh - 2 do bbat[i] = bsh[i] end
  local nd = math.max(#abat, #bbat)
  local bat = {}
  for i = 1, nd do
    local da = abat[#abat - nd + i] or 1
    local db = bbat[#bbat - nd + i] or 1
    assert(da == db or da == 1 or db == 1, 'reference: batch dims do not broadcast')
    bat[i] = da == 1 and db or da
  end
  -- linear index of a batch coordinate in a (right-aligned, broadcast) batch shape
  local function lin(batshape, coords)
    local idx, off = 0, nd - #batshape
    for d = 1, #batshape do
      local c = batshape[d] == 1 and 0 or coords[d + off]
      idx = idx * batshape[d] + c
    end
    return idx
  end
  local out = {}
  for bi = 0, numel(bat) - 1 do
    local coords, r = {}, bi
    for d = nd, 1, -1 do coords[d] = r % bat[d]; r = math.floor(r / bat[d]) end
    local ab, bb = lin(abat, coords), lin(bbat, coords)
    for i = 0, M - 1 do
      for j = 0, N - 1 do
        local s = 0
        for k = 0, K - 1 do s = s + A[ab * M * K + i * K + k + 1] * Bv[bb * K * N + k * N + j + 1] end
        out[#out + 1] = s
      end
    end
  end
  local os = {}
  for i = 1, nd do os[i] = bat[i] end
  if not a1 then os[#os + 1] = M end
  if not b1 then os[#os + 1] = N end
  return out, os
end

local function check_matmul(a, b, tol)
  tol = tol or (a:dtype() == 'f64' and 1e-12 or 1e-4)
  local c = a:matmul(b)
  local want, wshape = ref_matmul(flat(a), a:shape(), flat(b), b:shape())
  assert.same(wshape, c:shape())
  assert.equal(a:dtype(), c:dtype())
  local got = flat(c)
  assert.equal(#want, #got)
  for i = 1, #want do
    assert.is_true(math.abs(got[i] - want[i]) <= tol * (1 + math.abs(want[i])),
      string.format('element %d: got %.9g, want %.9g', i, got[i], want[i]))
  end
  return c
end

describe('matmul values', function()
  before_each(function() pn.manual_seed(11) end)

  it('multiplies 2-D matrices in f32 and f64', function()
    for _, dt in ipairs({ 'f32', 'f64' }) do
      check_matmul(pn.randn(3, 4, { dtype = dt }), pn.randn(4, 5, { dtype = dt }))
      check_matmul(pn.randn(1, 7, { dtype = dt }), pn.randn(7, 1, { dtype = dt }))
    end
    assert.same({ { 4, 5 }, { 10, 11 } },
      pn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }):matmul(pn.tensor({ { 1, 0 }, { 0, 1 }, { 1, 1 } })):totable())
  end)

  it('reads transposed operands without copying them first', function()
    local a, b = pn.randn(4, 3), pn.randn(5, 4)
    assert.is_false(a:t():is_contiguous())
    check_matmul(a:t(), pn.randn(4, 6))        -- aᵀ (3,4) @ (4,6)
    check_matmul(pn.randn(6, 4), b:t())        -- (6,4) @ bᵀ (4,5)
    check_matmul(a:t(), b:t():t():t())         -- both transposed: (3,4) @ (4,5)
    check_matmul(pn.randn(2, 4, 3):transpose(2, 3), pn.randn(2, 5, 4):transpose(2, 3))
  end)

  it('handles row-strided slices, expanded (stride 0) and doubly strided operands', function()
    local big = pn.randn(6, 8, { dtype = 'f64' })
    check_matmul(big:narrow(2, 2, 5), pn.randn(5, 3, { dtype = 'f64' }))           -- lda 8 > 5
    check_matmul(pn.randn(3, 6, { dtype = 'f64' }), big:narrow(2, 3, 4))
    check_matmul(pn.randn(1, 4, { dtype = 'f64' }):expand(3, 4), pn.randn(4, 2, { dtype = 'f64' }))
    local every_other = big:reshape(6, 4, 2):select(3, 1)                           -- strides (8, 2)
    check_matmul(every_other, pn.randn(4, 3, { dtype = 'f64' }))
    check_matmul(pn.randn(2, 6, { dtype = 'f64' }), every_other)
  end)

  it('follows torch.matmul for 1-D operands', function()
    local v = pn.randn(4, { dtype = 'f64' })
    local d = check_matmul(v, pn.randn(4, { dtype = 'f64' }))                      -- dot → scalar
    assert.same({}, d:shape())
    check_matmul(v, pn.randn(4, 3, { dtype = 'f64' }))                              -- (4) @ (4,3) → (3)
    check_matmul(pn.randn(3, 4, { dtype = 'f64' }), v)                              -- (3,4) @ (4) → (3)
    check_matmul(v, pn.randn(2, 4, 5, { dtype = 'f64' }))                           -- → (2,5)
    check_matmul(pn.randn(2, 3, 4, { dtype = 'f64' }), v)                           -- → (2,3)
    check_matmul(pn.randn(8, { dtype = 'f64' }):reshape(4, 2):select(2, 2), v)      -- strided vector
    assert.equal(32, pn.tensor({ 1, 2, 3 }):matmul(pn.tensor({ 4, 5, 6 })):item())
  end)

  it('broadcasts batch dims: (2,1,3,4) @ (5,4,2) → (2,5,3,2)', function()
    local c = check_matmul(pn.randn(2, 1, 3, 4), pn.randn(5, 4, 2))
    assert.same({ 2, 5, 3, 2 }, c:shape())
    check_matmul(pn.randn(3, 2, 4, { dtype = 'f64' }), pn.randn(4, 5, { dtype = 'f64' }))   -- shared b (one GEMM)
    check_matmul(pn.randn(2, 4, { dtype = 'f64' }), pn.randn(3, 4, 5, { dtype = 'f64' }))   -- shared a
    check_matmul(pn.randn(3, 2, 4, { dtype = 'f64' }):transpose(1, 2), pn.randn(4, 5, { dtype = 'f64' })) -- rows not mergeable
    check_matmul(pn.randn(4, 3, 2):permute(3, 2, 1), pn.randn(2, 4, 5))             -- every dim strided
  end)

  it('runs many small GEMMs in parallel with the same result as the reference', function()
    local a, b = pn.randn(128, 8, 8, { dtype = 'f64' }), pn.randn(128, 8, 8, { dtype = 'f64' })
    check_matmul(a, b)
    check_matmul(pn.randn(40, 16), pn.randn(16, 24))
  end)

  it('splits one big GEMM into row or column blocks across threads, any layout, any remainder', function()
    local prev = pn.num_threads()
    for _, nt in ipairs({ 2, 3 }) do
      pn.set_num_threads(nt)
      for _, dt in ipairs({ 'f32', 'f64' }) do
        local o = { dtype = dt }
        check_matmul(pn.randn(1000, 37, o), pn.randn(37, 19, o))            -- tall: row blocks, last one short
        check_matmul(pn.randn(37, 1000, o):t(), pn.randn(19, 37, o):t())    -- tall, both operands transposed
        check_matmul(pn.randn(20, 300, o), pn.randn(300, 997, o))           -- short and wide: column blocks
        check_matmul(pn.randn(20, 300, o), pn.randn(997, 300, o):t())       -- column blocks of a transposed b
        check_matmul(pn.randn(3, 70, 90, o), pn.randn(90, 80, o))           -- folded batch, one tall GEMM
        check_matmul(pn.randn(1, 70, 90, o), pn.randn(1, 90, 80, o))        -- a batch of one: split inside
      end
    end
    pn.set_num_threads(prev)
  end)

  it('gives zeros for an empty inner dim and empty results for empty outer dims', function()
    assert.same({ { 0, 0 }, { 0, 0 } }, pn.zeros(2, 0):matmul(pn.zeros(0, 2)):totable())
    assert.same({ 0, 3 }, pn.zeros(0, 4):matmul(pn.zeros(4, 3)):shape())
  end)

  it('offers mm and bmm with their dimension checks', function()
    check_matmul(pn.randn(2, 3), pn.randn(3, 2))
    local a, b = pn.randn(4, 2, 3), pn.randn(4, 3, 5)
    local want = flat(a:matmul(b))
    local got = flat(pn.bmm(a, b))
    assert.same(want, got)
    assert.same({ 2, 2 }, pn.randn(2, 3):mm(pn.randn(3, 2)):shape())
  end)
end)

describe('matmul gradients (f64 gradcheck)', function()
  local function leaf(...)
    return pn.randn({ ... }, { dtype = 'f64' }):requires_grad_()
  end
  before_each(function() pn.manual_seed(5) end)

  it('2-D and transposed operands', function()
    local a, b = leaf(3, 4), leaf(4, 2)
    gradcheck(function(x, y) return x:matmul(y) end, { a, b })
    local at, bt = leaf(4, 3), leaf(2, 4)
    gradcheck(function(x, y) return x:t():matmul(y:t()) end, { at, bt })
  end)

  it('1-D promotion cases', function()
    local v, w = leaf(4), leaf(4)
    gradcheck(function(x, y) return x:matmul(y) end, { v, w })
    gradcheck(function(x, y) return x:matmul(y) end, { v, leaf(4, 3) })
    gradcheck(function(x, y) return x:matmul(y) end, { leaf(3, 4), w })
    gradcheck(function(x, y) return x:matmul(y) end, { v, leaf(2, 4, 3) })
    gradcheck(function(x, y) return x:matmul(y) end, { leaf(2, 3, 4), w })
  end)

  it('batch broadcasting, shared weights and only one input requiring grad', function()
    gradcheck(function(x, y) return x:matmul(y) end, { leaf(2, 1, 3, 4), leaf(5, 4, 2) })
    gradcheck(function(x, y) return x:matmul(y) end, { leaf(2, 3, 4), leaf(4, 5) })     -- linear layer
    gradcheck(function(x, y) return x:matmul(y) end, { leaf(3, 4), leaf(2, 4, 5) })
    local const = pn.randn(4, 2, { dtype = 'f64' })
    gradcheck(function(x, y) return x:matmul(y) end, { leaf(3, 4), const })
    gradcheck(function(x, y) return y:matmul(x) end, { leaf(2, 3), const })
  end)

  it('accumulates into leaves and frees its graph', function()
    local a = pn.ones(2, 2, { dtype = 'f64' }):requires_grad_()
    local b = pn.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = 'f64' })
    a:matmul(b):backward(pn.ones(2, 2, { dtype = 'f64' }))
    assert.same({ { 3, 7 }, { 3, 7 } }, a.grad:totable())   -- g @ bᵀ
    assert.equal('matmul', a:matmul(b):grad_fn())
  end)
end)

describe('matmul errors', function()
  it('names matmul and both shapes when the inner dims differ', function()
    assert_error_matching(function() pn.zeros(2, 3):matmul(pn.zeros(4, 5)) end,
      'matmul', '[2,3]', '[4,5]', 'inner dims 3 and 4')
    assert_error_matching(function() pn.zeros(3):matmul(pn.zeros(4)) end, 'matmul', '[3]', '[4]')
  end)

  it('rejects batch dims that do not broadcast', function()
    assert_error_matching(function() pn.zeros(2, 3, 4):matmul(pn.zeros(3, 4, 5)) end,
      'matmul', '[2,3,4]', '[3,4,5]', 'batch dims')
  end)

  it('rejects int, mixed and 0-dim operands', function()
    assert_error_matching(function() pn.zeros(2, 2, { dtype = 'i32' }):matmul(pn.zeros(2, 2, { dtype = 'i32' })) end,
      'matmul', 'i32')
    assert_error_matching(function() pn.zeros(2, 2):matmul(pn.zeros(2, 2, { dtype = 'f64' })) end, 'matmul', 'f64')
    assert_error_matching(function() pn.tensor(2):matmul(pn.zeros(2)) end, 'matmul', 'at least 1 dim')
    assert_error_matching(function() pn.zeros(2, 2):matmul(3) end, 'matmul')
  end)

  it('checks the ranks for mm and bmm', function()
    assert_error_matching(function() pn.zeros(2, 2, 2):mm(pn.zeros(2, 2)) end, 'mm', '2-D')
    assert_error_matching(function() pn.bmm(pn.zeros(2, 2), pn.zeros(2, 2)) end, 'bmm', '3-D')
    assert_error_matching(function() pn.bmm(pn.zeros(2, 2, 3), pn.zeros(3, 3, 2)) end, 'bmm', 'batch')
  end)
end)

-- pn.linear (torch.nn.functional.linear): the bias is written into the output and the GEMM
-- adds onto it (BLAS beta = 1), so every split of the GEMM must add, never overwrite
describe('linear', function()
  before_each(function() pn.manual_seed(17) end)

  -- x (…, in) @ wᵀ + b by hand, from the naive matmul
  local function ref_linear(x, w, b)
    local want, wshape = ref_matmul(flat(x), x:shape(), flat(w:t():contiguous()), { w:size(2), w:size(1) })
    if b then
      local bv, out = flat(b), w:size(1)
      for i = 1, #want do want[i] = want[i] + bv[(i - 1) % out + 1] end
    end
    return want, wshape
  end
  local function check_linear(x, w, b)
    local y = pn.linear(x, w, b)
    local want, wshape = ref_linear(x, w, b)
    assert.same(wshape, y:shape())
    local got, tol = flat(y), x:dtype() == 'f64' and 1e-12 or 1e-4
    for i = 1, #want do
      assert.is_true(math.abs(got[i] - want[i]) <= tol * (1 + math.abs(want[i])),
        string.format('element %d: got %.9g, want %.9g', i, got[i], want[i]))
    end
  end

  it('equals x @ wᵀ + b for 1-D, 2-D and N-D x, with and without a bias, on 1–3 threads', function()
    local prev = pn.num_threads()
    for _, nt in ipairs({ 1, 2, 3 }) do
      pn.set_num_threads(nt)
      for _, dt in ipairs({ 'f32', 'f64' }) do
        local o = { dtype = dt }
        -- biases far from zero: an overwrite instead of an add shows at once
        check_linear(pn.randn(1000, 37, o), pn.randn(19, 37, o), pn.randn(19, o) + 50) -- tall: row blocks
        check_linear(pn.randn(20, 300, o), pn.randn(997, 300, o), pn.randn(997, o) - 50) -- short, wide: columns
        check_linear(pn.randn(3, 70, 90, o), pn.randn(80, 90, o), pn.randn(80, o) + 7)   -- folded batch
        check_linear(pn.randn(5, o), pn.randn(3, 5, o), pn.randn(3, o))                  -- 1-D x
        check_linear(pn.randn(4, 6, o), pn.randn(2, 6, o))                               -- no bias
        check_linear(pn.randn(3, 5, o):t(), pn.randn(4, 3, o), pn.randn(4, o))           -- transposed x
      end
    end
    pn.set_num_threads(prev)
    -- no inputs: the output is the bias alone
    assert.same({ { 1, 2 }, { 1, 2 } }, pn.linear(pn.zeros(2, 0), pn.zeros(2, 0), pn.tensor({ 1, 2 })):totable())
  end)

  it('passes an f64 gradcheck for x, w and b, and for any one of them', function()
    local function leaf(...) return pn.randn({ ... }, { dtype = 'f64' }):requires_grad_() end
    gradcheck(function(x, w, b) return pn.linear(x, w, b) end, { leaf(2, 3, 4), leaf(5, 4), leaf(5) })
    gradcheck(function(x, w) return pn.linear(x, w) end, { leaf(4), leaf(3, 4) })
    local x, w, b = pn.randn(3, 4, { dtype = 'f64' }), pn.randn(2, 4, { dtype = 'f64' }), pn.randn(2, { dtype = 'f64' })
    gradcheck(function(t) return pn.linear(t, w, b) end, { leaf(3, 4) })
    gradcheck(function(t) return pn.linear(x, t, b) end, { leaf(2, 4) })
    gradcheck(function(t) return pn.linear(x, w, t) end, { leaf(2) })
    assert.equal('linear', pn.linear(x, leaf(2, 4), b):grad_fn())
  end)

  it('names linear, the argument and the shapes on bad input', function()
    local x, w = pn.randn(2, 3, 4), pn.randn(5, 4)
    assert_error_matching(function() pn.linear(x, pn.randn(5, 3)) end, 'linear: x [2,3,4] and w [5,3]', 'w must be (out, in)')
    assert_error_matching(function() pn.linear(x, pn.randn(4)) end, 'linear: x [2,3,4] and w [4]')
    assert_error_matching(function() pn.linear(pn.tensor(3), pn.randn(1, 1)) end, 'linear: x [] must have at least 1 dim')
    assert_error_matching(function() pn.linear(x, w, pn.randn(4)) end, 'linear: b [4] must be (out) = (5) for w [5,4]')
    assert_error_matching(function() pn.linear(x, w, pn.randn(1, 5)) end, 'linear: b [1,5]')
    assert_error_matching(function() pn.linear(x, w, pn.randn(5, { dtype = 'f64' })) end, 'b f64 [5]',
      'need the same float dtype')
    assert_error_matching(function() pn.linear(pn.ones({ 2, 4 }, { dtype = 'i32' }), pn.ones({ 5, 4 }, { dtype = 'i32' })) end,
      'linear: x i32 [2,4]', 'need the same float dtype')
    assert_error_matching(function() pn.linear(x, w, 1) end, 'linear: expected tensors x, w and an optional tensor b')
  end)
end)

describe('matmul_sparse_lhs', function()
  local check = require 'spec.helpers.check'
  it('equals matmul on a mostly-zero lhs, values and gradients (f64)', function()
    pn.manual_seed(21)
    local a = pn.randn({ 7, 9 }, { dtype = 'f64' })
    a = a * a:gt(0.8):to('f64')                 -- ~20% nonzeros
    local b = pn.randn({ 9, 4 }, { dtype = 'f64' })
    check.assert_close(check.vals(pn.matmul_sparse_lhs(a, b)), check.vals(a:matmul(b)), 1e-12, 'values')
    check.assert_close(check.vals(pn.matmul_sparse_lhs(a, b:t():contiguous():t())), check.vals(a:matmul(b)), 1e-12,
      'transposed b')
    a:requires_grad_(); b:requires_grad_()
    gradcheck(function(x, y) return pn.matmul_sparse_lhs(x, y) end, { a, b })
    local a32 = pn.tensor({ { 0, 2, 0 }, { 0, 0, 0 }, { 1, 0, 3 } })
    local b32 = pn.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } })
    assert.same({ { 6, 8 }, { 0, 0 }, { 16, 20 } }, pn.matmul_sparse_lhs(a32, b32):totable())
    check.assert_error_matching(function() pn.matmul_sparse_lhs(a32, pn.ones(2, 2)) end, 'matmul_sparse_lhs', '[3,3]', '[2,2]')
  end)

  -- f32 rows are scanned 16 elements at a time: nonzeros first, last and alone in a run, in the
  -- tail past the last full run (K = 53), −0 (a zero), NaN (a nonzero) and an all-zero row
  it('finds every nonzero of long f32 rows, against a product summed by hand in f64', function()
    local M, K, N = 5, 53, 3
    local at = { { 1, 1, 1.5 }, { 1, 16, -2 }, { 1, 17, 3 }, { 1, 53, 0.25 }, { 2, 32, 4 }, { 2, 49, -1 },
                 { 2, 20, -0.0 }, { 4, 33, 2 }, { 4, 48, 5 }, { 5, 7, 0 / 0 } }
    local rows = {}
    for i = 1, M do
      rows[i] = {}
      for k = 1, K do rows[i][k] = 0 end
    end
    for _, e in ipairs(at) do rows[e[1]][e[2]] = e[3] end
    local a = pn.tensor(rows)
    pn.manual_seed(4)
    local b = pn.randn({ K, N })
    local got, bv = pn.matmul_sparse_lhs(a, b):totable(), b:totable()
    for i = 1, M do
      for j = 1, N do
        local want = 0
        for _, e in ipairs(at) do if e[1] == i and e[3] ~= 0 then want = want + e[3] * bv[e[2]][j] end end
        if want ~= want then
          assert.is_true(got[i][j] ~= got[i][j], 'row ' .. i .. ': NaN expected')
        else
          assert.is_true(math.abs(got[i][j] - want) <= 1e-5 * (1 + math.abs(want)),
            string.format('(%d, %d): %g, want %g', i, j, got[i][j], want))
        end
      end
    end
    assert.same({ 0, 0, 0 }, got[3])
  end)
end)
