-- cuda_power_chunk_spec.lua — power attention's chunked form on CUDA (core/cuda/attention/power.cu,
-- "chunked form") against the CPU's chunked form (attention/power.c): the output and the gradients
-- of q, k, v and log_gate (the layer's learnable gate and rotary projections reach the op only
-- through these) under one random cotangent, f32 within 1e-5 and f64 within 1e-12 relative, p = 2
-- and p = 4 (p must be even), gated and ungated, at sizes awkward for the kernels' 16- and 32-wide
-- tiles of rows, keys and φ features (each size runs both: PENUMBRA_CUDA_POWER_TILE): N = 1, one
-- chunk of exactly one tile, chunks of 17, 20, 40 and 5 rows (partial tiles), several chunks, a
-- chunk per row, D = 3, 8, 16 and 32 (6 to 528 features), Dv = 1, 5, 20, 64 (tiles over 48 KiB of
-- shared memory) and 130 (products wider than the register tiles' 128 columns a pass). In the
-- interpreter build under three thread orders (cu.SCHEDULES), on a GPU once, pending without CUDA.
-- Also: D = 1500 (tiles too wide for shared memory) falls back to the quadratic kernels; N not a
-- multiple of the chunk is the CPU's named error on the device too (power.c checks it before any
-- kernel runs); where (scale·q·k)^p overflows, the device's chunked result is the CPU chunked one's
-- (non-finite, while the quadratic form stays finite: the chunked kernels did run); the chunked
-- call's peak device memory grows linearly in N.
local pn = require 'penumbra'
local cu = require 'spec.helpers.cuda'
local check = require 'spec.helpers.check'

local it_cuda = pn.cuda.available() and it or pending
local TOL = cu.TOL
local each, rnd, compare = cu.each, cu.rnd, cu.compare

-- name, B, H, N, D, Dv, p, chunk[, scale]
local CASES = {
  { 'N = 1, chunk 1', 1, 1, 1, 3, 5, 2, 1 },
  { 'one chunk of one tile (N = 16, chunk 16)', 1, 2, 16, 3, 5, 2, 16 },
  { 'one chunk of a tile and a row (N = 17, chunk 17), D = 8', 1, 1, 17, 8, 5, 2, 17 },
  { 'several chunks (N = 64, chunk 16), two batches', 2, 1, 64, 3, 5, 2, 16 },
  { 'partial tiles in every chunk (N = 100, chunk 20)', 1, 1, 100, 3, 5, 2, 20 },
  { 'D = 8: 36 features, partial feature tiles (N = 35, chunk 5)', 1, 2, 35, 8, 5, 2, 5, 0.5 },
  { 'a chunk per row (N = 12, chunk 1)', 1, 1, 12, 3, 5, 2, 1 },
  { 'p = 4 (15 features), N = 18, chunk 6, scaled', 1, 2, 18, 3, 5, 4, 6, 0.7 },
  { 'D = 16, Dv = 20 (136 features; rows wider than a tile), N = 40, chunk 10', 1, 1, 40, 16, 20, 2, 10, 0.25 },
  { 'Dv = 1, N = 48, chunk 24', 1, 1, 48, 3, 1, 2, 24 },
  { 'D = 32, Dv = 64 (over 48 KiB of shared memory per block), N = 32, chunk 16', 1, 1, 32, 32, 64, 2, 16, 0.2 },
  { 'N = 600, chunk 100: the gate scans take runs of 3 rows a thread, the last threads none', 1, 1, 600, 3, 2, 2, 100,
    0.5 },
  { 'chunks of 40 rows (a 32-wide tile and a partial one), D = 8 (36 features)', 1, 2, 80, 8, 5, 2, 40, 0.5 },
  { 'Dv = 130: products over 128 columns wide (two column passes of the register tiles)', 1, 1, 24, 3, 130, 2, 12 },
  { 'D = 40 (820 features): a lane owns two coordinates in the backward\'s p = 2 chain rule', 1, 1, 24, 40, 3, 2, 12,
    0.2 },
}

-- Each kernel takes 32-wide tiles where two blocks fit an SM's shared memory, else 16-wide
-- (power.cu, pwc_lay_pick); PENUMBRA_CUDA_POWER_TILE forces one, so both run at every size here.
local ffi = require 'ffi'
pcall(ffi.cdef, 'int setenv(const char *, const char *, int); int unsetenv(const char *);')
local function with_tile(w, fn)
  ffi.C.setenv('PENUMBRA_CUDA_POWER_TILE', w, 1)
  local ok, err = pcall(fn)
  ffi.C.unsetenv('PENUMBRA_CUDA_POWER_TILE')
  assert(ok, err)
end

local function power(o)
  return function(_, q, k, v, g)
    return pn.power_attention(q, k, v, { p = o.p, chunk = o.chunk, scale = o.scale, log_gate = g })
  end
end

describe('cuda power attention, chunked form', function()
  for _, c in ipairs(CASES) do
    local name, B, H, N, D, Dv, p, chunk, scale = unpack(c)
    for _, gated in ipairs({ true, false }) do
      it_cuda(name .. (gated and ', gated' or ', ungated') .. ': output and every gradient, 16- and 32-wide tiles',
        function()
          for _, tile in ipairs({ '16', '32' }) do
            with_tile(tile, function()
              each(function(dt)
                local inputs = { rnd({ B, H, N, D }, dt, 1), rnd({ B, H, N, D }, dt, 2), rnd({ B, H, N, Dv }, dt, 3) }
                if gated then inputs[4] = rnd({ B, H, N }, dt, 4, -0.5, 0) end
                local grads = { true, true, true, gated or nil }
                compare(string.format('power chunked %s p=%d chunk=%d tile=%s', dt, p, chunk, tile), TOL[dt],
                  power { p = p, chunk = chunk, scale = scale }, inputs, grads)
              end)
            end)
          end
        end)
    end
  end

  it_cuda('gradients of some inputs only (q alone, log_gate alone), a zero query row', function()
    each(function(dt)
      local q = rnd({ 1, 1, 24, 3 }, dt, 5, -1, 1, function(vals)
        for i = 31, 33 do vals[i] = 0 end -- row 11: no weights, output and gradient 0
      end)
      local inputs = { q, rnd({ 1, 1, 24, 3 }, dt, 6), rnd({ 1, 1, 24, 5 }, dt, 7), rnd({ 1, 1, 24 }, dt, 8, -0.5, 0) }
      for _, grads in ipairs({ { true }, { [4] = true }, { true, true, true, true } }) do
        compare('power chunked partial ' .. dt, TOL[dt], power { p = 2, chunk = 8 }, inputs, grads)
      end
    end)
  end)

  it_cuda('D = 1500 (tiles wider than shared memory): the quadratic kernels answer, same function', function()
    local ins = { rnd({ 1, 1, 4, 1500 }, 'f64', 20), rnd({ 1, 1, 4, 1500 }, 'f64', 21), rnd({ 1, 1, 4, 2 }, 'f64', 22),
                  rnd({ 1, 1, 4 }, 'f64', 23, -0.5, 0) }
    compare('power chunked, wide', TOL.f64, power { p = 2, chunk = 2, scale = 0.05 }, ins, { true, true, true, true })
  end)

  it_cuda('N not a multiple of the chunk: the CPU\'s error on the device too', function()
    for _, N in ipairs({ 15, 17 }) do
      local q, k, v = rnd({ 1, 1, N, 3 }, 'f32', 9), rnd({ 1, 1, N, 3 }, 'f32', 10), rnd({ 1, 1, N, 5 }, 'f32', 11)
      local ok_cpu, e_cpu = pcall(pn.power_attention, q, k, v, { chunk = 16 })
      local ok_gpu, e_gpu = pcall(pn.power_attention, q:to('cuda'), k:to('cuda'), v:to('cuda'), { chunk = 16 })
      assert.is_false(ok_cpu)
      assert.is_false(ok_gpu)
      assert.truthy(cu.msg(e_cpu):find('does not divide the sequence length N = ' .. N, 1, true), cu.msg(e_cpu))
      assert.equal(cu.msg(e_cpu), cu.msg(e_gpu))
    end
  end)

  it_cuda('(scale·q·k)^p overflowing: the CPU chunked form\'s non-finite rows, the quadratic form finite', function()
    each(function(dt)
      -- scale 1e200: s = scale·q·k is finite, s^2 is not (both devices compute in f64)
      local q, k, v = rnd({ 1, 1, 8, 2 }, 'f64', 12), rnd({ 1, 1, 8, 2 }, 'f64', 13), rnd({ 1, 1, 8, 3 }, 'f64', 14)
      q, k, v = q:to(dt), k:to(dt), v:to(dt)
      local o = { p = 2, chunk = 4, scale = 1e200 }
      local ref = pn.power_attention(q, k, v, o)
      local got = pn.power_attention(q:to('cuda'), k:to('cuda'), v:to('cuda'), o)
      local rv = check.vals(ref)
      local nonfinite = 0
      for _, x in ipairs(rv) do
        if x ~= x or x == math.huge or x == -math.huge then nonfinite = nonfinite + 1 end
      end
      assert.is_true(nonfinite > 0, 'the CPU chunked form overflows here')
      cu.close(got, ref, TOL[dt], 'overflowing chunked ' .. dt)
      o.chunk = 0
      check.assert_finite(check.vals(pn.power_attention(q:to('cuda'), k:to('cuda'), v:to('cuda'), o):to('cpu')),
        'quadratic form ' .. dt)
    end, { cu.SCHEDULES[1] })
  end)

  it_cuda('peak device memory of forward and backward grows linearly in N (no N² buffer)', function()
    local function peak(N)
      local q, k = rnd({ 1, 1, N, 2 }, 'f32', 15):to('cuda'), rnd({ 1, 1, N, 2 }, 'f32', 16):to('cuda')
      local v, g = rnd({ 1, 1, N, 2 }, 'f32', 17):to('cuda'), rnd({ 1, 1, N }, 'f32', 18, -0.5, 0):to('cuda')
      q:requires_grad_(); k:requires_grad_(); v:requires_grad_(); g:requires_grad_()
      collectgarbage('collect')
      local base = pn.cuda.memory_stats().allocated
      pn.cuda.reset_peak()
      pn.power_attention(q, k, v, { p = 2, chunk = 16, log_gate = g }):sum():backward()
      return pn.cuda.memory_stats().peak - base
    end
    cu.schedules(function()
      local small, large = peak(256), peak(1024)
      -- 4× the rows: about 4× the bytes (the allocator's 512-byte steps add a little); an N × N f32
      -- buffer alone would be 4 MiB at N = 1024, 16× its size at N = 256
      assert.is_true(small > 0 and large <= 6 * small,
        string.format('peak bytes %d at N = 256, %d at N = 1024', small, large))
      assert.is_true(large < 1024 * 1024 * 4, string.format('peak bytes %d at N = 1024', large))
    end, { cu.SCHEDULES[1] })
  end)
end)
