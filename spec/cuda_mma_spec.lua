-- PTX mma.sync m16n8k16 (core/cuda/mma_ptx.cuh): one warp packs A (16 × 16), B (16 × 8) and
-- C (16 × 8) into its registers by the layout PTX documents and the tensor cores return D =
-- A·B + C, compared here with the product on the CPU. Every element of A, B and C is a distinct
-- small value exact in bf16 and f16 (and every sum exact in f32), so a register, a half or a
-- row/column swapped in the layout changes D. In the interpreter build this checks the
-- interpreter's model and the packing code; on a GPU the same spec checks the layout against
-- the hardware. (Swapping two of A's registers in the packing code fails it: tried; so does
-- swapping ldmatrix's matrices 1 and 2 for A.) The registers are packed by the lanes, or loaded
-- by ldmatrix from shared memory, whose layout is checked the same way.
local pn = require 'penumbra'

local it_cuda = pn.cuda.available() and it or pending

local function mat(rows, cols, f)
  local m = {}
  for i = 1, rows do
    m[i] = {}
    for j = 1, cols do m[i][j] = f(i, j) end
  end
  return m
end

-- distinct values exact in bf16 (8 significant bits) and f16: multiples of 1/8 up to ±15.875
local A = mat(16, 16, function(i, j) return (((i * 17 + j * 5) % 127) - 63) / 8 end)
local B = mat(16, 8, function(i, j) return (((i * 11 + j * 13) % 61) - 30) / 4 end)
local Cm = mat(16, 8, function(i, j) return i * 100 + j end)

local function product(a, b, c)
  return mat(16, 8, function(i, j)
    local s = c[i][j]
    for k = 1, 16 do s = s + a[i][k] * b[k][j] end
    return s
  end)
end

describe('PTX mma.sync m16n8k16 (pn_mma_16816)', function()
  -- load: 'registers' (each lane packs its registers by the documented layout) or 'ldmatrix' (A by
  -- .x4 and B by .x2 from Bᵀ's rows in shared memory, as the attention kernels load them)
  local function same_d(prec, load)
    local want, got = product(A, B, Cm), pn.cuda.mma_check(A, B, Cm, prec, load)
    for i = 1, 16 do
      for j = 1, 8 do
        assert.equal(want[i][j], got[i][j], string.format('%s, %s: D[%d][%d]', prec, load, i, j))
      end
    end
  end
  for _, prec in ipairs({ 'bf16', 'f16' }) do
    it_cuda(prec .. ': D = A·B + C element for element, from registers in the documented layout', function()
      same_d(prec, 'registers')
    end)
    it_cuda(prec .. ': the same D from registers loaded by ldmatrix', function() same_d(prec, 'ldmatrix') end)
  end

  it_cuda('refuses bad arguments by name', function()
    assert.has_error(function() pn.cuda.mma_check(A, B, Cm, 'tf32') end,
      "cuda.mma_check: precision must be 'bf16' or 'f16', got 'tf32'")
    assert.has_error(function() pn.cuda.mma_check({}, B, Cm) end, 'cuda.mma_check: a must have 16 rows')
    assert.has_error(function() pn.cuda.mma_check(A, B, Cm, 'bf16', 'lds') end,
      "cuda.mma_check: load must be 'registers' or 'ldmatrix', got 'lds'")
  end)
end)

-- The f64 shape, mma.sync m8n8k4 (pn_dmma_884: power.cu's tile products), the same way: distinct
-- values whose products and sums are exact in f64, so only a wrong lane, register or k shows.
describe('PTX mma.sync m8n8k4 .f64 (pn_dmma_884)', function()
  local A8 = mat(8, 4, function(i, j) return (((i * 7 + j * 3) % 31) - 15) / 4 end)
  local B8 = mat(4, 8, function(i, j) return (((i * 5 + j * 11) % 29) - 14) / 8 end)
  local C8 = mat(8, 8, function(i, j) return i * 1000 + j end)

  it_cuda('D = A·B + C element for element, from registers in the documented layout', function()
    local got = pn.cuda.dmma_check(A8, B8, C8)
    for i = 1, 8 do
      for j = 1, 8 do
        local s = C8[i][j]
        for k = 1, 4 do s = s + A8[i][k] * B8[k][j] end
        assert.equal(s, got[i][j], string.format('D[%d][%d]', i, j))
      end
    end
  end)

  it_cuda('refuses bad arguments by name', function()
    assert.has_error(function() pn.cuda.dmma_check(A8, {}, C8) end, 'cuda.dmma_check: b must have 4 rows')
    assert.has_error(function() pn.cuda.dmma_check(A8, B8, mat(8, 7, function() return 0 end)) end,
      'cuda.dmma_check: row 1 of c must have 8 numbers')
  end)
end)
