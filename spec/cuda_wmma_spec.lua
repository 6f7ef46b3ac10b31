-- cuda_wmma_spec.lua — the kernel interpreter's half/bfloat16 types and nvcuda::wmma (DESIGN §8,
-- core/cuda/emu/mma.h): conversions round to nearest even; a wmma GEMM through shared memory
-- equals the f64 product of its rounded inputs under every thread order and fragment map; code
-- that assumes a fragment map gets a wrong answer (or, where it wrote an element's copies
-- differently, an error); a lane that misses a wmma call, a partial warp, a misaligned tile, a
-- bad ldm and a tile past its allocation are reported, and so are ldmatrix's misaligned rows and
-- rows outside shared memory. The cases are planted in
-- core/cuda/emu/selftest_wmma.cu. Runs in the interpreter build; pending elsewhere.
local pn = require 'penumbra'
local cu = require 'spec.helpers.cuda'

local emu = pn.cuda.available() and pn.cuda.interpreted()
local it_emu = emu and it or pending

-- x rounded to nearest even in a binary format with p significand bits, smallest normal
-- exponent emin and largest finite value maxf (overflow → ±inf, NaN → NaN)
local function round_fmt(x, p, emin, maxf)
  if x ~= x or x == 0 or x == math.huge or x == -math.huge then return x end
  local a = math.abs(x)
  local _, e = math.frexp(a) -- a = m·2^e with m in [0.5, 1): its leading bit is 2^(e-1)
  local q = 2 ^ (math.max(e - 1, emin) - (p - 1)) -- the format's spacing at a
  local n = math.floor(a / q)
  local f = a / q - n
  if f > 0.5 or (f == 0.5 and n % 2 == 1) then n = n + 1 end
  local v = n * q
  if v > maxf then v = math.huge end
  return x < 0 and -v or v
end
local function to_half(x) return round_fmt(x, 11, -14, 65504) end
local function to_bf16(x) return round_fmt(x, 8, -126, (2 - 2 ^ -7) * 2 ^ 127) end

local function same_value(got, want)
  if want ~= want then return got ~= got end
  if want == 0 then return got == 0 and 1 / got == 1 / want end -- the sign of zero too
  return got == want
end

local function run(name, n)
  local ok, v = pn.cuda.selftest(name, n)
  assert.is_true(ok, name .. ': ' .. tostring(v))
  return v
end

-- the GEMM cases' layout: M, N, K, alpha, then A (M×K), B (K×N), C0 and D (M×N), row-major
local GEMM_SIZE = 4 + 64 * 48 * 2 + 64 * 64 * 2
local GEMMS = { wmma_gemm_bf16 = to_bf16, wmma_gemm_half = to_half, wmma_gemm_bf16_32x8 = to_bf16,
                wmma_gemm_half_8x32 = to_half }

-- For each element of D = alpha·(C0 + A·B): the f64 reference of the rounded inputs, and the
-- f32 bound (K + 2 roundings of at most 2^-24 of the sum of magnitudes).
local function reference(A, B, C0, M, N, K, alpha)
  local ref, bound = {}, {}
  for r = 0, M - 1 do
    for c = 0, N - 1 do
      local s, mag = C0 and C0[r * N + c + 1] or 0, C0 and math.abs(C0[r * N + c + 1]) or 0
      for k = 0, K - 1 do
        local p = A[r * K + k + 1] * B[k * N + c + 1]
        s, mag = s + p, mag + math.abs(p)
      end
      ref[r * N + c + 1], bound[r * N + c + 1] = alpha * s, alpha * mag * (K + 2) * 2 ^ -24
    end
  end
  return ref, bound
end

local function slice(v, from, n)
  local out = {}
  for i = 1, n do out[i] = v[from + i] end
  return out
end

-- the elements of D outside the f32 bound around the reference
local function wrong(D, ref, bound)
  local bad = 0
  for i = 1, #ref do
    if not (math.abs(D[i] - ref[i]) <= bound[i]) then bad = bad + 1 end
  end
  return bad
end

-- one 16×16×16 tile case: A, B, D (256 each) and how many elements of D are wrong
local function tile(name)
  local v = run(name, 768)
  local A, B, D = slice(v, 0, 256), slice(v, 256, 256), slice(v, 512, 256)
  local ref, bound = reference(A, B, nil, 16, 16, 16, 1)
  return D, wrong(D, ref, bound)
end

describe('cuda interpreter: half, bfloat16 and wmma', function()
  it_emu('converts float to __half and __nv_bfloat16 by round-to-nearest-even, NaN stays NaN, overflow is inf', function()
    local v = run('half_convert', 1024)
    local n = v[1]
    assert.is_true(n > 300 and 1 + 3 * n <= 1024, 'case size ' .. tostring(n))
    local seen = { tie = 0, sub = 0, inf = 0, nan = 0 }
    for i = 1, n do
      local x, h, b = v[1 + i], v[1 + n + i], v[1 + 2 * n + i]
      assert.is_true(same_value(h, to_half(x)), ('half(%.9g) = %.9g, want %.9g'):format(x, h, to_half(x)))
      assert.is_true(same_value(b, to_bf16(x)), ('bfloat16(%.9g) = %.9g, want %.9g'):format(x, b, to_bf16(x)))
      if x ~= x then seen.nan = seen.nan + 1 end
      if h == math.huge and x < math.huge then seen.inf = seen.inf + 1 end
      if h ~= 0 and math.abs(h) < 2 ^ -14 then seen.sub = seen.sub + 1 end
      local q = 2 ^ (select(2, math.frexp(math.abs(x))) - 11) -- x exactly halfway between two halves
      if x == x and x ~= 0 and math.abs(x) < 65504 and (math.abs(x) / q) % 1 == 0.5 then seen.tie = seen.tie + 1 end
    end
    -- the inputs reach what the rounding must get right
    assert.is_true(seen.nan >= 1 and seen.inf >= 2 and seen.sub >= 5 and seen.tie >= 2,
      ('nan %d, overflow %d, subnormal %d, ties %d'):format(seen.nan, seen.inf, seen.sub, seen.tie))
  end)

  it_emu('a wmma GEMM through shared memory equals the f64 product of the rounded inputs under every order and map', function()
    for _, s in ipairs({ 'fwd', 'rev', 'rand:3', 'rand:11' }) do
      pn.cuda.with_schedule(s, function()
        for name, round in pairs(GEMMS) do
          local v = run(name, GEMM_SIZE)
          local M, N, K, alpha = v[1], v[2], v[3], v[4]
          assert.same({ 64, 64, 48 }, { M, N, K })
          local A, B = slice(v, 4, M * K), slice(v, 4 + M * K, K * N)
          local C0, D = slice(v, 4 + M * K + K * N, M * N), slice(v, 4 + M * K + K * N + M * N, M * N)
          for _, x in ipairs(A) do assert.equal(round(x), x, name .. ': an input of A is not rounded') end
          for _, x in ipairs(B) do assert.equal(round(x), x, name .. ': an input of B is not rounded') end
          local ref, bound = reference(A, B, C0, M, N, K, alpha)
          assert.equal(0, wrong(D, ref, bound), name .. ' under ' .. s .. ': elements off the f32 bound')
        end
      end)
    end
  end)

  it_emu('code that assumes the hardware fragment map gets a wrong answer; the correct tile does not', function()
    local results = {}
    for _, s in ipairs({ 'fwd', 'rev', 'rand:1', 'rand:2' }) do
      pn.cuda.with_schedule(s, function()
        local _, bad = tile('wmma_tile')
        assert.equal(0, bad, 'the correct tile under ' .. s)
        for _, name in ipairs({ 'wmma_assume_acc_map', 'wmma_assume_a_map' }) do
          local D, bad_map = tile(name)
          assert.is_true(bad_map > 0, name .. ' gave the right answer under ' .. s)
          results[name .. s] = table.concat(D, ',')
        end
      end)
    end
    -- the random maps differ by seed
    for _, name in ipairs({ 'wmma_assume_acc_map', 'wmma_assume_a_map' }) do
      assert.are_not.equal(results[name .. 'rand:1'], results[name .. 'rand:2'], name)
    end
  end)

  it_emu('the random map changes from launch to launch and repeats when the schedule is set again', function()
    local first, second, again
    pn.cuda.with_schedule('rand:5', function()
      first = table.concat((tile('wmma_assume_acc_map')), ',')
      second = table.concat((tile('wmma_assume_acc_map')), ',')
    end)
    pn.cuda.with_schedule('rand:5', function() again = table.concat((tile('wmma_assume_acc_map')), ',') end)
    assert.are_not.equal(first, second)
    assert.equal(first, again)
    local f1, f2
    pn.cuda.with_schedule('fwd', function()
      f1 = table.concat((tile('wmma_assume_acc_map')), ',')
      f2 = table.concat((tile('wmma_assume_acc_map')), ',')
    end)
    assert.equal(f1, f2, 'fwd is one fixed map')
  end)

  it_emu('reports a lane that misses a wmma call, a partial warp, disagreeing copies, a bad tile; an unfilled accumulator is NaN', function()
    local want = {
      wmma_skip_mma = { 'different warp operations', 'wmma::mma_sync', 'wmma::store_matrix_sync' },
      wmma_missing_lane = { 'lane 31', 'exited before the wmma::load_matrix_sync' },
      wmma_partial_warp = { 'full warp', '16 lanes' },
      wmma_assume_a_map_half = { 'copies of element', 'matrix_a __half', 'unspecified' },
      wmma_misaligned = { '32-byte', 'matrix_a __half' },
      wmma_bad_ldm = { 'ldm 20', 'multiple of 8' },
      wmma_out_of_range = { 'not inside one device allocation', 'matrix_b __nv_bfloat16' },
      ldmatrix_misaligned = { 'ldmatrix', 'lane 0 (row 0 of matrix 0)', 'not 16-byte aligned' },
      ldmatrix_global = { 'ldmatrix', 'not inside one shared array' },
      dmma_divergent = { 'lane 16', 'exited before the mma.sync.m8n8k4.f64' },
    }
    for _, s in ipairs(cu.ORDERS) do
      pn.cuda.with_schedule(s, function()
        for name, pats in pairs(want) do
          local ok, msg = pn.cuda.selftest(name, 768)
          assert.is_false(ok, name .. ' was not caught under ' .. s)
          for _, p in ipairs(pats) do
            assert.is_truthy(tostring(msg):find(p, 1, true), name .. ' under ' .. s .. ': ' .. tostring(msg))
          end
          assert.is_truthy(tostring(msg):find('selftest_wmma.cu', 1, true), name .. ': names the call site')
        end
        local D = tile('wmma_uninit_acc')
        for i = 1, 256 do assert.is_true(D[i] ~= D[i], 'element ' .. i .. ' of an unfilled accumulator product') end
      end)
    end
  end)
end)
