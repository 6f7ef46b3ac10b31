-- cuda_cosine_chunk_spec.lua — the chunked CUDA kernels of cosine attention (core/cuda/attention/
-- cosine.cu: 64-row chunks, 64 × 64 tiles, the chunk states scanned in f64) against the CPU
-- (attention/cosine.c): the output and the gradients of q, k, v and the stabiliser m, f32 and f64,
-- causal and bidirectional, at sizes around the chunk and the tile (N = 1, 63, 64, 65, 200; D and
-- Dv 3, 17, 64 and past one tile), key masks (a fully masked batch row, a masked first key, masked
-- keys on a chunk boundary), only some gradients asked for, and NaN in q, k, v or the cotangent,
-- which must reach exactly the elements the CPU's (cosine_impl.h's exact path) does. f32 within
-- 1e-5 relative, f64 within 1e-12 (check.assert_close: |got − ref| ≤ tol·(1 + |ref|)). In the interpreter
-- build every case runs under the three thread orders (cu.SCHEDULES); on a GPU once; pending
-- without CUDA.
local pn = require 'penumbra'
local cu = require 'spec.helpers.cuda'

local it_cuda = pn.cuda.available() and it or pending
local TOL = { f32 = 1e-5, f64 = 1e-12 }
local each, rnd, compare = cu.each, cu.rnd, cu.compare

local function cosine(o)
  return function(dev, q, k, v, m)
    local mask = o.key_mask
    if mask and dev == 'cuda' then mask = mask:to('cuda') end
    return pn.cosine_attention(q, k, v, m, { causal = o.causal, key_mask = mask })
  end
end

-- the four inputs of a (B, H, N, D, Dv) case from seed
local function inputs(dt, B, H, N, D, Dv, seed, edit)
  edit = edit or {}
  return { rnd({ B, H, N, D }, dt, seed, -1, 1, edit.q), rnd({ B, H, N, D }, dt, seed + 1, -1, 1, edit.k),
           rnd({ B, H, N, Dv }, dt, seed + 2, -1, 1, edit.v), rnd({ H }, dt, seed + 3, -2, 2) }
end

local ALL = { true, true, true, true }

describe('cuda cosine attention, chunked', function()
  -- name, B, H, N, D, Dv
  local SIZES = {
    { 'N = 1', 1, 1, 1, 3, 2 },
    { 'N = 63 (one partial chunk), D = 17', 1, 2, 63, 17, 3 },
    { 'N = 64 (one full chunk), Dv = 17', 2, 1, 64, 3, 17 },
    { 'N = 65 (a chunk and a row), D = Dv = 64', 1, 1, 65, 64, 64 },
    { 'N = 200 (four chunks), D = 17', 1, 2, 200, 17, 3 },
    { 'D and Dv past one 64-wide tile (70, 67)', 1, 1, 70, 70, 67 },
  }
  for i, c in ipairs(SIZES) do
    local name, B, H, N, D, Dv = unpack(c)
    for _, causal in ipairs({ true, false }) do
      it_cuda(name .. (causal and ', causal' or ', bidirectional') .. ': values and every gradient', function()
        each(function(dt)
          compare(name .. ' ' .. dt, TOL[dt], cosine { causal = causal }, inputs(dt, B, H, N, D, Dv, 10 * i), ALL)
        end)
      end)
    end
  end

  it_cuda('bitwise the same under every thread order and when run again (fixed sum orders, no atomics)', function()
    local check = require 'spec.helpers.check'
    local x = inputs('f32', 2, 2, 150, 17, 9, 60)
    local w = rnd({ 2, 2, 150, 9 }, 'f32', 61)
    local function run()
      local t = {}
      for i = 1, 4 do t[i] = x[i]:to('cuda'):requires_grad_() end
      local out = pn.cosine_attention(t[1], t[2], t[3], t[4])
      out:backward(w:to('cuda'))
      local r = { check.vals(out:to('cpu')) }
      for i = 1, 4 do r[#r + 1] = check.vals(t[i].grad:to('cpu')) end
      return r
    end
    local runs = {}
    cu.schedules(function() runs[#runs + 1] = run() end)
    cu.schedules(function() runs[#runs + 1] = run() end, { cu.SCHEDULES[1] })
    for i = 2, #runs do assert.are.same(runs[1], runs[i]) end
  end)

  it_cuda('key masks: a fully masked batch row, a masked first key, masked keys around a chunk boundary', function()
    local B, H, N, D, Dv = 3, 2, 130, 5, 4
    local rows = { {}, {}, {} }
    for t = 1, N do
      rows[1][t] = (t % 3 == 0 or (t >= 62 and t <= 67)) and 0 or 1
      rows[2][t] = 0
      rows[3][t] = t == 1 and 0 or 1
    end
    local mask = pn.tensor(rows, { dtype = 'u8' })
    each(function(dt)
      for _, causal in ipairs({ true, false }) do
        compare('masked ' .. dt, TOL[dt], cosine { causal = causal, key_mask = mask }, inputs(dt, B, H, N, D, Dv, 70), ALL)
      end
    end)
  end)

  it_cuda('only some gradients asked for (v and m: g m without g q; q alone; k alone)', function()
    each(function(dt)
      for i, grads in ipairs({ { [3] = true, [4] = true }, { [1] = true }, { [2] = true } }) do
        for _, causal in ipairs({ true, false }) do
          compare('partial #' .. i .. ' ' .. dt, TOL[dt], cosine { causal = causal }, inputs(dt, 1, 2, 70, 4, 3, 80),
            grads)
        end
      end
    end)
  end)

  it_cuda('NaN in q, k or v (a real key and a masked one): the CPU\'s NaNs and values, exactly', function()
    local B, H, N, D, Dv = 1, 2, 70, 3, 2
    local nan = function(i) return function(vals) vals[i] = 0 / 0 end end
    local mv = {}
    for t = 1, N do mv[t] = t == 30 and 0 or 1 end
    local mask = pn.tensor({ mv }, { dtype = 'u8' })
    each(function(dt)
      -- { input, flat index in head 1, also with row 30's key masked }: rows 30 (mid chunk) and 66
      for _, c in ipairs({ { 'v', 29 * Dv + 2, true }, { 'v', 65 * Dv + 1 }, { 'k', 29 * D + 1, true },
                           { 'q', 29 * D + 3 } }) do
        local x = inputs(dt, B, H, N, D, Dv, 90, { [c[1]] = nan(c[2]) })
        for _, causal in ipairs({ true, false }) do
          compare('NaN in ' .. c[1] .. ' #' .. c[2] .. ' ' .. dt, TOL[dt], cosine { causal = causal }, x, ALL)
          if c[3] then
            compare('masked NaN in ' .. c[1] .. ' ' .. dt, TOL[dt], cosine { causal = causal, key_mask = mask }, x, ALL)
          end
        end
      end
    end)
  end)

  it_cuda('a NaN in the cotangent: the gradients\' NaNs and values as on the CPU', function()
    local B, H, N, D, Dv = 1, 2, 70, 3, 2
    each(function(dt)
      local x = inputs(dt, B, H, N, D, Dv, 95)
      local w = rnd({ B, H, N, Dv }, dt, 99, -1, 1, function(vals) vals[29 * Dv + 1] = 0 / 0 end)
      for _, causal in ipairs({ true, false }) do
        local grads = {}
        for _, dev in ipairs({ 'cpu', 'cuda' }) do
          local t = {}
          for i = 1, 4 do t[i] = (dev == 'cuda' and x[i]:to('cuda') or x[i]:clone()):requires_grad_() end
          local out = pn.cosine_attention(t[1], t[2], t[3], t[4], { causal = causal })
          out:backward(dev == 'cuda' and w:to('cuda') or w)
          grads[dev] = t
        end
        for i = 1, 4 do
          cu.close(grads.cuda[i].grad, grads.cpu[i].grad, TOL[dt], 'NaN cotangent ' .. dt .. ' gradient ' .. i)
        end
      end
    end)
  end)
end)
