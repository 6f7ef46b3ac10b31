-- cuda_linear_spec.lua — the CUDA twins of the linear-attention family against the CPU kernels:
-- attention/cosine.c (Cottention: causal and bidirectional, key masks, the learned m),
-- attention/rope.c (θ given or base^(−2i/D), the learned rate's running sum), attention/power.c
-- (φᵖ for p = 2 and 4; power attention quadratic, gated, bidirectional, p = 4; the chunked form
-- has its own spec, cuda_power_chunk_spec.lua) and attention/lin_state.c (the
-- recurrent cosine and power states stepped on the device, reordered between steps). Values and
-- the gradients of every input, awkward sizes (N = 1, primes, more work items than a block has
-- threads), a zero query row, a fully masked batch row. f32 within 1e-5 relative, f64 within
-- 1e-12 (cosine 1e-11: the CPU's chunk GEMMs sum in another order). In the interpreter build
-- the cases run under three thread orders (fwd, rev, rand:3); on a GPU once; pending in a build
-- without CUDA.
local pn = require 'penumbra'
local cu = require 'spec.helpers.cuda'

local cuda = pn.cuda.available()
local it_cuda = cuda and it or pending
local TOL = { f32 = 1e-5, f64 = 1e-12 }
local TOL_COS = { f32 = 1e-5, f64 = 1e-11 }
local each, rnd, close, compare = cu.each, cu.rnd, cu.close, cu.compare

-- a (B, N) u8 key mask from a list of rows
local function mask_of(rows)
  return pn.tensor(rows, { dtype = 'u8' })
end

describe('cuda cosine attention', function()
  -- B, H, N, D, Dv
  local SIZES = {
    { 'N = 1', { 1, 1, 1, 3, 2 } },
    { 'primes', { 2, 3, 7, 5, 3 } },
    { 'more columns than a block has threads', { 1, 2, 5, 3, 67 } },
  }
  for _, c in ipairs(SIZES) do
    local B, H, N, D, Dv = unpack(c[2])
    for _, causal in ipairs({ true, false }) do
      it_cuda(c[1] .. (causal and ', causal' or ', bidirectional') .. ': values and gradients', function()
        each(function(dt)
          local q, k, v = rnd({ B, H, N, D }, dt, 1), rnd({ B, H, N, D }, dt, 2), rnd({ B, H, N, Dv }, dt, 3)
          local m = rnd({ H }, dt, 4, -2, 2)
          compare('cosine ' .. dt, TOL_COS[dt], function(_, q_, k_, v_, m_)
            return pn.cosine_attention(q_, k_, v_, m_, { causal = causal })
          end, { q, k, v, m }, { true, true, true, true })
        end)
      end)
    end
  end

  it_cuda('key masks (a fully masked batch row, a masked first key), causal and bidirectional', function()
    each(function(dt)
      local B, H, N, D, Dv = 3, 2, 11, 4, 5
      local q, k, v = rnd({ B, H, N, D }, dt, 5), rnd({ B, H, N, D }, dt, 6), rnd({ B, H, N, Dv }, dt, 7)
      local m = rnd({ H }, dt, 8, -1, 1)
      local rows = { {}, {}, {} }
      for t = 1, N do
        rows[1][t] = (t % 3 == 0) and 0 or 1
        rows[2][t] = 0
        rows[3][t] = t == 1 and 0 or 1
      end
      local mask = mask_of(rows)
      for _, causal in ipairs({ true, false }) do
        compare('masked cosine ' .. dt, TOL_COS[dt], function(dev, q_, k_, v_, m_)
          return pn.cosine_attention(q_, k_, v_, m_,
            { causal = causal, key_mask = dev == 'cuda' and mask:to('cuda') or mask })
        end, { q, k, v, m }, { true, true, true, true })
      end
    end)
  end)

  it_cuda('a sequence longer than the CPU chunk (N = 70) and more rows than a block', function()
    each(function(dt)
      local q, k, v = rnd({ 1, 4, 70, 3 }, dt, 9), rnd({ 1, 4, 70, 3 }, dt, 10), rnd({ 1, 4, 70, 2 }, dt, 11)
      local m = rnd({ 4 }, dt, 12)
      compare('long cosine ' .. dt, TOL_COS[dt], function(_, q_, k_, v_, m_)
        return pn.cosine_attention(q_, k_, v_, m_, { causal = true })
      end, { q, k, v, m }, { true, true, true, true })
    end, { cu.SCHEDULES[1] })
  end)
end)

describe('cuda rope', function()
  it_cuda('base: values and the gradient of x (N = 1, primes, 2-D x)', function()
    each(function(dt)
      for i, shape in ipairs({ { 1, 1, 1, 2 }, { 2, 3, 7, 6 }, { 13, 4 } }) do
        compare('rope ' .. dt .. ' #' .. i, TOL[dt], function(_, x) return pn.rope(x, { base = 100 }) end,
          { rnd(shape, dt, 20 + i, -2, 2) }, { true })
      end
    end)
  end)

  it_cuda('theta given (a strided view) and a broadcast learned rate: every gradient', function()
    each(function(dt)
      local x = rnd({ 2, 3, 11, 6 }, dt, 30, -2, 2)
      local theta = rnd({ 3, 2 }, dt, 31, 0, 1):select(2, 1) -- stride 2
      for i, rshape in ipairs({ { 2, 1, 11 }, { 11 }, { 2, 3, 11 } }) do
        local rate = rnd(rshape, dt, 32 + i, 0.5, 1.5)
        compare('rope rate ' .. dt .. ' #' .. i, TOL[dt], function(_, x_, th_, r_)
          return pn.rope(x_, { theta = th_, rate = r_ })
        end, { x, theta, rate }, { true, true, true })
      end
      compare('rope rate, base ' .. dt, TOL[dt], function(_, x_, r_) return pn.rope(x_, { rate = r_ }) end,
        { x, rnd({ 11 }, dt, 40, 0.5, 1.5) }, { true, true })
    end)
  end)

  it_cuda('more rows than a block has threads', function()
    each(function(dt)
      compare('rope long ' .. dt, TOL[dt], function(_, x_, r_) return pn.rope(x_, { rate = r_ }) end,
        { rnd({ 3, 97, 4 }, dt, 41), rnd({ 3, 97 }, dt, 42, 0.5, 1.5) }, { true, true })
    end, { cu.SCHEDULES[1] })
  end)
end)

describe('cuda linear family: NaN in, NaN out where the CPU has it', function()
  it_cuda('cosine (a NaN value), rope (a NaN feature), power (a NaN key)', function()
    each(function(dt)
      local nan = function(i) return function(vals) vals[i] = 0 / 0 end end
      local q, k = rnd({ 1, 2, 5, 3 }, dt, 130), rnd({ 1, 2, 5, 3 }, dt, 131)
      -- bidirectional here (every row sees v_j); the causal NaN patterns, on both devices, are
      -- linear_attention_spec's and cuda_cosine_chunk_spec's
      compare('cosine NaN ' .. dt, TOL_COS[dt], function(_, q_, k_, v_)
        return pn.cosine_attention(q_, k_, v_, 0.3, { causal = false })
      end, { q, k, rnd({ 1, 2, 5, 2 }, dt, 132, -1, 1, nan(7)) })
      compare('rope NaN ' .. dt, TOL[dt], function(_, x) return pn.rope(x) end, { rnd({ 3, 4 }, dt, 133, -1, 1, nan(6)) })
      compare('power NaN ' .. dt, TOL[dt], function(_, q_, k_, v_) return pn.power_attention(q_, k_, v_, { p = 2 }) end,
        { q, rnd({ 1, 2, 5, 3 }, dt, 134, -1, 1, nan(5)), rnd({ 1, 2, 5, 2 }, dt, 135) })
    end)
  end)
end)

describe('cuda sympow_embed', function()
  it_cuda('p = 2 and p = 4: values and gradients', function()
    each(function(dt)
      for i, c in ipairs({ { { 5 }, 2 }, { { 7, 5 }, 2 }, { { 2, 3, 4 }, 4 }, { { 1, 1 }, 4 }, { { 300, 3 }, 2 } }) do
        compare('sympow ' .. dt .. ' #' .. i, TOL[dt], function(_, x) return pn.sympow_embed(x, c[2]) end,
          { rnd(c[1], dt, 50 + i) }, { true })
      end
    end)
  end)
end)

describe('cuda power attention', function()
  -- name, B, H, N, D, Dv, opts (log_gate = true: random gates)
  local CASES = {
    { 'p = 2, causal, N = 1', 1, 1, 1, 3, 2, { p = 2 } },
    { 'p = 2, causal, primes', 2, 3, 7, 5, 3, { p = 2 } },
    { 'p = 2, gated, causal', 2, 2, 9, 4, 3, { p = 2, log_gate = true } },
    { 'p = 2, gated, bidirectional', 2, 2, 9, 4, 3, { p = 2, log_gate = true, causal = false } },
    { 'p = 4, scaled, bidirectional', 1, 2, 6, 3, 2, { p = 4, causal = false, scale = 0.7 } },
    { 'more rows than a block has threads', 1, 1, 70, 2, 2, { p = 2, log_gate = true } },
    { 'N = 700: the gate scans take runs of 3 rows a thread, the last threads none', 1, 1, 700, 2, 2,
      { p = 2, log_gate = true } },
  }
  for _, c in ipairs(CASES) do
    local name, B, H, N, D, Dv, o = unpack(c)
    it_cuda(name .. ': values and gradients', function()
      each(function(dt)
        local q, k, v = rnd({ B, H, N, D }, dt, 60), rnd({ B, H, N, D }, dt, 61), rnd({ B, H, N, Dv }, dt, 62)
        local inputs, grads = { q, k, v }, { true, true, true }
        if o.log_gate then
          inputs[4], grads[4] = rnd({ B, H, N }, dt, 63, -0.5, 0), true
        end
        compare('power ' .. dt, TOL[dt], function(_, q_, k_, v_, g_)
          return pn.power_attention(q_, k_, v_,
            { p = o.p, causal = o.causal, chunk = o.chunk, scale = o.scale, log_gate = g_ })
        end, inputs, grads)
      end, N > 64 and { cu.SCHEDULES[1] } or nil)
    end)
  end

  it_cuda('a zero query row (no weights: output and gradient 0)', function()
    each(function(dt)
      local q = rnd({ 1, 1, 5, 3 }, dt, 70, -1, 1, function(vals)
        for i = 4, 6 do vals[i] = 0 end -- row 2
      end)
      for _, causal in ipairs({ true, false }) do
        compare('power zero row ' .. dt, TOL[dt], function(_, q_, k_, v_)
          return pn.power_attention(q_, k_, v_, { p = 2, causal = causal })
        end, { q, rnd({ 1, 1, 5, 3 }, dt, 71), rnd({ 1, 1, 5, 2 }, dt, 72) }, { true, true, true })
      end
    end)
  end)
end)

describe('cuda recurrent states', function()
  -- T steps of a state on each device from the same rows, a reorder after step 2
  local function steps(new, dt, B, H, D, Dv, gated)
    local T = 4
    local rows = {}
    for t = 1, T do
      rows[t] = { rnd({ B, H, D }, dt, 80 + t), rnd({ B, H, D }, dt, 90 + t), rnd({ B, H, Dv }, dt, 100 + t),
                  gated and rnd({ B, H }, dt, 110 + t, -0.5, 0) or nil }
    end
    local iv = {}
    for i = 1, B do iv[i] = B - i end -- the batch reversed
    local idx = pn.tensor(iv, { dtype = 'i64' })
    local states = { cpu = new('cpu'), cuda = new('cuda') }
    for t = 1, T do
      local outs = {}
      for dev, st in pairs(states) do
        local r = {}
        for i, x in pairs(rows[t]) do r[i] = dev == 'cuda' and x:to('cuda') or x end
        outs[dev] = st:step(r[1], r[2], r[3], r[4])
      end
      close(outs.cuda, outs.cpu, TOL[dt], 'step ' .. t)
      if t == 2 then
        states.cpu:reorder(idx)
        states.cuda:reorder(idx:to('cuda'))
      end
    end
  end

  it_cuda('cosine state: steps on the device match the CPU', function()
    each(function(dt)
      for _, sz in ipairs({ { 1, 1, 1, 1 }, { 2, 3, 5, 7 }, { 1, 2, 3, 70 } }) do
        local B, H, D, Dv = unpack(sz)
        local m = rnd({ H }, dt, 120)
        steps(function(dev)
          return pn.cosine_state { batch = B, heads = H, dim = D, dim_v = Dv, dtype = dt,
                                   m = dev == 'cuda' and m:to('cuda') or m }
        end, dt, B, H, D, Dv, false)
      end
    end)
  end)

  it_cuda('power state (p = 2 gated, p = 4): steps on the device match the CPU', function()
    each(function(dt)
      for _, c in ipairs({ { 2, { 2, 3, 4, 5 }, true }, { 4, { 1, 2, 3, 2 }, false }, { 2, { 1, 1, 2, 70 }, true } }) do
        local p, sz, gated = unpack(c)
        local B, H, D, Dv = unpack(sz)
        steps(function()
          return pn.power_state { batch = B, heads = H, dim = D, dim_v = Dv, p = p, scale = 0.8, dtype = dt }
        end, dt, B, H, D, Dv, gated)
      end
    end)
  end)
end)
