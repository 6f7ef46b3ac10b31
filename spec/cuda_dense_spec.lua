-- cuda_dense_spec.lua — the CUDA twins of attention/dense.c (pn.attention, pn.attention_weights:
-- attention_dense_fwd, attention_dense_weights, attention_dense_bwd) against the CPU kernels:
-- every registry score that is not graph-only (hyperbolic with each of its three models) ×
-- normalize × causal × mask × bias × einstein, learnable per-head parameters, N = 1, primes,
-- Nq ≠ Nk (causal with both offsets), more query rows than a block has threads, D = 1, 3, 16, 64;
-- values and the gradients of q, k, v, the bias and the parameters. f32 within 1e-5 (relative,
-- plus as much absolute: check.assert_close), f64 within 1e-12 — though the device sums the online
-- softmax key by key and forms a distance score's ‖q − k‖² from the differences where the CPU
-- tiles and expands (the hyperboloid model gets points on the hyperboloid: off it, arcosh near 1
-- makes the f32 gradients of either device differ by more). In the interpreter build the cases run under three thread orders (fwd, rev,
-- rand:3); on a GPU once; pending in a build without CUDA.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local cu = require 'spec.helpers.cuda'

local cuda = pn.cuda.available()
local it_cuda = cuda and it or pending
local SCHEDULES = cu.SCHEDULES
local TOL = cu.TOL
local each, rnd, close = cu.each, cu.rnd, cu.close

local msg = cu.msg -- an error message without the Lua position that pcall adds

local VARIANTS = pn.attention_variants({ all = true })
local FORMS = cu.forms(VARIANTS, function(name) return not VARIANTS[name].graph_only end)

-- the parameters a form reads (as per-head tensors, cu.params_of), probed on pn.attention
local function params_of(name, model, D, aggregate)
  local probe = pn.full({ 1, 1, 2, D }, 0.2 / math.sqrt(D), { dtype = 'f64' })
  return cu.params_of(VARIANTS, name, model, D, function(o) return pcall(pn.attention, probe, probe, probe, o) end,
    aggregate)
end

-- a u8 mask of shape with about `keep` of the entries nonzero (edit: change the flat list)
local function mask_of(shape, keep, seed, edit)
  local r, v = check.rng(seed), {}
  for i = 1, cu.numel(shape) do v[i] = r:u() < keep and 1 or 0 end
  if edit then edit(v) end
  return pn.tensor(v, { dtype = 'u8' }):reshape(shape)
end

-- x rounded to `bits` significant bits, ties to even (bf16: 8, f16: 11; normal numbers)
local function round16(x, bits)
  if x == 0 or x ~= x or x == math.huge or x == -math.huge then return x end
  local m, e = math.frexp(x)
  local sc = m * 2 ^ bits
  local r = math.floor(sc + 0.5)
  if r - sc == 0.5 and r % 2 == 1 then r = r - 1 end
  return math.ldexp(r / 2 ^ bits, e)
end

-- one configuration on both devices: the output (or the weights) and every gradient under one
-- random cotangent. cfg: score, model, normalize, causal, aggregate, B, H, Nq, Nk, D, Dv, seed,
-- mask (a shape or false), bias (a shape or false), weights, params (from params_of), nd (4, 3, 2),
-- strided (q, k, v as non-contiguous views)
local function run_case(what, dt, cfg)
  local B, H, Nq, Nk, D, Dv = cfg.B, cfg.H, cfg.Nq, cfg.Nk, cfg.D, cfg.Dv
  local lead = cfg.nd == 2 and {} or cfg.nd == 3 and { B } or { B, H }
  local function shp(...)
    local s = {}
    for _, x in ipairs(lead) do s[#s + 1] = x end
    for _, x in ipairs({ ... }) do s[#s + 1] = x end
    return s
  end
  -- points valid for every domain: heights > 0, inside the unit ball (coordinates below 1/√D)
  local sc = math.min(1, 2 / math.sqrt(D))
  local inputs = { rnd(shp(Nq, D), dt, cfg.seed + 1, 0.05 * sc, 0.45 * sc),
                   rnd(shp(Nk, D), dt, cfg.seed + 2, 0.05 * sc, 0.45 * sc),
                   rnd(shp(Nk, Dv), dt, cfg.seed + 3, -0.3 / math.sqrt(Dv), 0.3 / math.sqrt(Dv)) }
  if cfg.model == 'hyperboloid' then -- points on the hyperboloid: arcosh(−⟨q,k⟩) stays conditioned
    inputs[1], inputs[2] = pn.maps.pseudopolar(inputs[1] * 3), pn.maps.pseudopolar(inputs[2] * 3)
  end
  local names, grads = {}, { true, true, not cfg.weights }
  if cfg.bias then
    inputs[#inputs + 1] = rnd(cfg.bias, dt, cfg.seed + 4, -0.5, 0.5)
    names[#names + 1], grads[#inputs] = 'bias', true
  end
  for _, p in ipairs(cfg.params) do
    inputs[#inputs + 1] = rnd(cfg.nd == 4 and { H } or { 1 }, dt, cfg.seed + 10 + #inputs, p.lo, p.hi)
    names[#names + 1], grads[#inputs] = p.name, true
  end
  local mask = cfg.mask and mask_of(cfg.mask, 0.75, cfg.seed + 5, cfg.mask_edit) or nil
  -- precision = 'bf16' / 'f16' (f32 inputs): the reference is the CPU in f64 on the same values
  local ref_dt = cfg.precision and 'f64' or dt
  local function run(dev)
    local args, leaves = {}, {}
    for i, x in ipairs(inputs) do
      local t = dev == 'cuda' and x:to('cuda') or ref_dt == dt and x:clone() or x:to(ref_dt):detach()
      if grads[i] then t:requires_grad_() end
      args[i], leaves[i] = t, t
    end
    local o = { score = cfg.score, model = cfg.model, normalize = cfg.normalize, causal = cfg.causal,
                aggregate = cfg.aggregate, alibi = cfg.alibi, squared = cfg.squared,
                precision = dev == 'cuda' and cfg.precision or nil }
    for i, nm in ipairs(names) do o[nm] = args[3 + i] end
    local q, k, v = args[1], args[2], args[3]
    if cfg.strided then -- the same values in another memory order: non-contiguous views
      local function view(x) return x:transpose(-1, -2):contiguous():transpose(-1, -2) end
      q, k, v = view(q), view(k), view(v)
    end
    if mask then o.mask = dev == 'cuda' and mask:to('cuda') or mask end
    local out
    if cfg.weights then out = pn.attention_weights(q, k, o)
    else out = pn.attention(q, k, v, o) end
    local w = rnd(out:shape(), dt, cfg.seed + 77)
    out:backward(dev == 'cuda' and w:to('cuda') or w:to(ref_dt))
    local g = {}
    for i in pairs(grads) do if grads[i] then g[i] = leaves[i].grad end end
    return out, g
  end
  local ref, rg = run('cpu')
  local got, gg = run('cuda')
  if cfg.precision and not cfg.weights then
    -- sharper: the f64 CPU on the rounded q, k, v differs only by P's rounding for P·V (and the
    -- f32 row terms): |Δ| <= 2^-(bits-1) · max|v| · Σ_j p_ij (bf16 8 significant bits, f16 11)
    local bits = cfg.precision == 'bf16' and 8 or 11
    local function rounded(x)
      local vals = check.vals(x)
      for i, a in ipairs(vals) do vals[i] = round16(a, bits) end
      return pn.tensor(vals, { dtype = 'f64' }):reshape(x:shape())
    end
    local saved = { inputs[1], inputs[2], inputs[3] }
    inputs[1], inputs[2], inputs[3] = rounded(saved[1]), rounded(saved[2]), rounded(saved[3])
    local sharp = run('cpu')
    -- a row's weights sum to 1 but under the plain sigmoid, where the bound scales by their sum
    local wsum = {}
    if cfg.normalize == 'sigmoid' then
      cfg.weights = true
      local W = check.vals(run('cpu'))
      cfg.weights = nil
      local nk = cfg.Nk
      for r = 1, #W / nk do
        local t = 0
        for j = 1, nk do t = t + math.abs(W[(r - 1) * nk + j]) end
        wsum[r] = t
      end
    end
    inputs[1], inputs[2], inputs[3] = saved[1], saved[2], saved[3]
    local vmax = 0
    for _, a in ipairs(check.vals(saved[3])) do vmax = math.max(vmax, math.abs(a)) end
    local a, b = check.vals(got:to('cpu')), check.vals(sharp)
    local dv = got:shape()[#got:shape()]
    for i = 1, #b do
      local bound = 2 ^ -(bits - 1) * vmax * math.max(1, wsum[math.floor((i - 1) / dv) + 1] or 1)
      local ok = b[i] ~= b[i] and a[i] ~= a[i] or math.abs(a[i] - b[i]) <= bound
      assert.is_true(ok, string.format('%s output against the rounded inputs: element %d got %.9g, expected %.9g (max|v| %g)',
        what, i, a[i], b[i], vmax))
    end
  end
  local tol = cfg.precision and TOL.bf16 or TOL[dt]
  if cfg.precision then ref = ref:to(dt) end
  close(got, ref, tol, what .. ' output')
  for i, want in pairs(grads) do
    if want then
      assert.is_true(rg[i] ~= nil and gg[i] ~= nil, what .. ': gradient of input ' .. i .. ' missing')
      close(gg[i], rg[i]:to(dt), tol, what .. ' gradient of input ' .. i .. ' (' .. (names[i - 3] or ({ 'q', 'k', 'v' })[i]) .. ')')
    end
  end
  return got
end

local function cfg_of(form, over)
  local c = { score = form[1], model = form[2], B = 2, H = 2, Nq = 5, Nk = 7, D = 4, Dv = 3, seed = 11, nd = 4 }
  for k, v in pairs(over or {}) do c[k] = v end
  c.params = params_of(c.score, c.model, c.D, c.aggregate)
  return c
end

local function label(c)
  return string.format('%s%s %s%s%s%s%s B=%d H=%d Nq=%d Nk=%d D=%d Dv=%d nd=%d', c.score,
    c.model and ('/' .. c.model) or '', c.normalize or 'softmax', c.causal and ' causal' or '',
    c.mask and ' mask' or '', c.bias and ' bias' or '', c.aggregate and (' ' .. c.aggregate) or '',
    c.B, c.H, c.Nq, c.Nk, c.D, c.Dv, c.nd)
end

describe('cuda dense attention', function()
  it_cuda('every score × normalize × causal × mask × bias × einstein: values and gradients (q, k, v, bias, parameters)', function()
    cu.each_form(FORMS, { 'softmax', 'sigmoid', 'sigmoid_normalized' }, function(dt, s, form, norm)
      for _, causal in ipairs({ false, true }) do
        for _, masked in ipairs({ false, true }) do
          for _, biased in ipairs({ false, true }) do
            for _, agg in ipairs({ false, 'einstein' }) do
              -- a key-padding mask (B, 1, 1, Nk) with one fully masked batch row; a bias
              -- shared over the batch (H, Nq, Nk): its gradient sums over b
              local c = cfg_of(form, { normalize = norm, causal = causal, aggregate = agg or nil,
                mask = masked and { 2, 1, 1, 7 } or false,
                mask_edit = function(v) for j = 1, 7 do v[j] = 0 end end,
                bias = biased and { 2, 5, 7 } or false })
              run_case(label(c) .. ' ' .. dt .. ' ' .. s, dt, c)
            end
          end
        end
      end
    end, { SCHEDULES[1] })
  end)

  it_cuda('N = 1, primes, Nq ≠ Nk both ways (causal), more rows than a block, partial tiles, D = 1, 3, 16, 33, 64, 128, 1500, under every schedule', function()
    local SIZES = {
      { B = 1, H = 1, Nq = 1, Nk = 1, D = 1, Dv = 1 },
      { B = 1, H = 3, Nq = 13, Nk = 5, D = 3, Dv = 2, causal = true },          -- Nq > Nk: early rows see nothing
      { B = 2, H = 1, Nq = 3, Nk = 11, D = 3, Dv = 3, causal = true },          -- Nq < Nk: offset 8
      { B = 1, H = 2, Nq = 131, Nk = 17, D = 16, Dv = 5, mask = { 1, 1, 131, 17 }, strided = true }, -- 262 rows
      { B = 1, H = 1, Nq = 7, Nk = 257, D = 64, Dv = 16, causal = true, bias = { 7, 257 } },
      { B = 3, H = 1, Nq = 2, Nk = 3, D = 1, Dv = 4, nd = 3, bias = { 3, 1, 3 } },
      { B = 1, H = 1, Nq = 6, Nk = 6, D = 3, Dv = 2, nd = 2, causal = true, mask = { 6, 6 } },
      -- the tiled kernels (32 rows × 32 keys): partial tiles on both sides, causal with a negative
      -- offset (whole query tiles see no key), D and Dv not multiples of anything
      { B = 1, H = 2, Nq = 70, Nk = 45, D = 33, Dv = 40, causal = true },
      -- D = Dv = 128: more than the default 48 KiB of shared memory (the kernels opt in)
      { B = 1, H = 1, Nq = 40, Nk = 66, D = 128, Dv = 128, causal = true, mask = { 1, 1, 40, 66 } },
      -- D = 1500: tiles that no device's shared memory holds, so the row kernels run
      { B = 1, H = 1, Nq = 3, Nk = 4, D = 1500, Dv = 2 },
    }
    each(function(dt, s)
      for _, form in ipairs(FORMS) do
        for n, over in ipairs(SIZES) do
          local o = { seed = 30 + n }
          for k, v in pairs(over) do o[k] = v end
          if form[2] == 'poincare' or form[1] == 'umbral' or form[1] == 'penumbral' or form[2] == 'halfspace'
            or form[2] == 'hyperboloid' then
            if o.D == 1 then o.D = 2 end -- a half-space point needs a height and one more coordinate
          end
          local c = cfg_of(form, o)
          run_case(label(c) .. ' ' .. dt .. ' ' .. s, dt, c)
        end
      end
    end)
  end)

  it_cuda('the weights (pn.attention_weights) and their backward, ALiBi, penumbral squared', function()
    each(function(dt, s)
      for _, form in ipairs(FORMS) do
        for _, norm in ipairs({ 'softmax', 'sigmoid', 'sigmoid_normalized' }) do
          for _, causal in ipairs({ false, true }) do
            local c = cfg_of(form, { normalize = norm, causal = causal, weights = true, Nq = 9, Nk = 6,
              mask = { 2, 1, 9, 6 }, bias = { 1, 2, 1, 6 } })
            run_case('weights ' .. label(c) .. ' ' .. dt .. ' ' .. s, dt, c)
          end
        end
      end
      local c = cfg_of({ 'dot' }, { causal = true, alibi = true, H = 3, Nq = 6, Nk = 8 })
      run_case('alibi ' .. label(c) .. ' ' .. dt .. ' ' .. s, dt, c)
      c = cfg_of({ 'penumbral' }, { squared = true, causal = true })
      run_case('squared ' .. label(c) .. ' ' .. dt .. ' ' .. s, dt, c)
    end)
  end)

  it_cuda('precision bf16 / f16 (tensor cores): every score within 2e-2 of the f64 CPU, rounded (not the f32 result), partial tiles, under every schedule', function()
    local SIZES = {
      { B = 1, H = 2, Nq = 5, Nk = 7, D = 4, Dv = 3 },
      { B = 1, H = 1, Nq = 70, Nk = 90, D = 40, Dv = 72, causal = true, mask = { 1, 1, 70, 90 } }, -- partial 64-tiles
      { B = 2, H = 1, Nq = 9, Nk = 3, D = 16, Dv = 16, causal = true, normalize = 'sigmoid_normalized' }, -- rows that see nothing
      -- softmax rows that see nothing (rows 1–70); rows 65–70 walk their block's one key tile, all masked for them
      { B = 1, H = 1, Nq = 80, Nk = 10, D = 16, Dv = 8, causal = true },
      -- rows whose first key tile is all masked and whose later ones are not (the running max stays
      -- −inf over a whole tile), and a row with every key masked
      { B = 1, H = 1, Nq = 24, Nk = 150, D = 16, Dv = 8, mask = { 1, 1, 24, 150 }, mask_edit = function(v)
        for i = 1, 12 do for j = 1, 70 do v[(i - 1) * 150 + j] = 0 end end
        for j = 1, 150 do v[12 * 150 + j] = 0 end
      end },
      { B = 1, H = 1, Nq = 20, Nk = 200, D = 16, Dv = 8 }, -- four key tiles: each double buffer refilled
      { B = 1, H = 2, Nq = 33, Nk = 70, D = 16, Dv = 8, aggregate = 'einstein' }, -- γ on whole and partial tiles
      -- the sigmoid on the SFU (pn_cu_sigm_sfu), plain and normalized with γ, on whole tiles
      { B = 1, H = 1, Nq = 66, Nk = 70, D = 16, Dv = 8, normalize = 'sigmoid' },
      { B = 1, H = 1, Nq = 66, Nk = 70, D = 16, Dv = 8, normalize = 'sigmoid_normalized', aggregate = 'einstein' },
      -- the key pass at width 128 (K and V read from shared memory a chunk at a time), a partial
      -- 16-wide chunk of V and a partial key block
      { B = 1, H = 1, Nq = 20, Nk = 70, D = 128, Dv = 100, causal = true },
      -- widths equal to the kernels' bound 64: the tile copies and products whose shape is known
      -- when compiling (copy_tile16_c, mma_abt_run / mma_pb_run without the per-chunk test)
      { B = 1, H = 1, Nq = 70, Nk = 130, D = 64, Dv = 64, causal = true },
    }
    cu.schedules(function(s)
      for _, prec in ipairs({ 'bf16', 'f16' }) do
        for _, form in ipairs(FORMS) do
          for n, over in ipairs(SIZES) do
            local o = { seed = 50 + n, precision = prec }
            for k, v in pairs(over) do o[k] = v end
            local c = cfg_of(form, o)
            local what = prec .. ' ' .. label(c) .. ' ' .. s
            local got = run_case(what, 'f32', c)
            if n == 2 and form[1] == 'dot' then -- the products really took rounded inputs
              c.precision = nil
              local f32 = run_case(what .. ' (f32)', 'f32', c)
              local a, b, diff = check.vals(got:to('cpu')), check.vals(f32:to('cpu')), 0
              for i = 1, #a do diff = math.max(diff, math.abs(a[i] - b[i])) end
              assert.is_true(diff > 1e-6, what .. ': the bf16 / f16 result equals the f32 one (' .. diff .. ')') -- f32 kernels agree to ~1e-8
            end
          end
        end
      end
    end)
  end)

  -- the forward and the backward on mma.sync (mfwd_kernel, mbwq_kernel and mbwk_kernel up to width
  -- 128: the defaults) against the wmma ones (PENUMBRA_CUDA_MMA=0): two kernels, one result up to the
  -- order of f32 sums; wider heads take the wmma kernels either way
  it_cuda('precision bf16: the mma.sync forward and backward equal the wmma ones for every score; widths over 128 take wmma', function()
    local ffi = require 'ffi'
    pcall(ffi.cdef, 'int setenv(const char *, const char *, int); int unsetenv(const char *);')
    local function fwd(mma, form, o)
      ffi.C.setenv('PENUMBRA_CUDA_MMA', mma, 1)
      local ok, r, grads = pcall(function()
        local q, k, v = o.q:clone():requires_grad_(), o.k:clone():requires_grad_(), o.v:clone():requires_grad_()
        local out = pn.attention(q, k, v, { score = form, precision = 'bf16', causal = o.causal })
        out:backward(o.g)
        return out:to('cpu'), { q.grad:to('cpu'), k.grad:to('cpu'), v.grad:to('cpu') }
      end)
      ffi.C.unsetenv('PENUMBRA_CUDA_MMA')
      assert(ok, r)
      return r, grads
    end
    local function maxdiff(a, b)
      local x, y, diff, big = check.vals(a), check.vals(b), 0, 0
      for i = 1, #x do diff, big = math.max(diff, math.abs(x[i] - y[i])), math.max(big, math.abs(y[i])) end
      return diff, big
    end
    for _, sz in ipairs({ { Nq = 70, Nk = 90, D = 40, Dv = 72, causal = true }, { Nq = 24, Nk = 70, D = 128, Dv = 128 },
                          -- at D = 64 laplacian's two kernels differ by 6.8e-5 (already before the
                          -- straight-line products: their f32 sums of −½‖q − k‖² differ); both are
                          -- within the bf16 contract against the f64 CPU (the spec above)
                          { Nq = 24, Nk = 70, D = 64, Dv = 64, tol = 1e-4 },
                          { Nq = 17, Nk = 33, D = 136, Dv = 8 } }) do
      for _, form in ipairs({ 'dot', 'laplacian', 'umbral', 'penumbral' }) do
        local q = rnd({ 1, 2, sz.Nq, sz.D }, 'f32', 7, 0.1, 0.4):to('cuda')
        local k = rnd({ 1, 2, sz.Nk, sz.D }, 'f32', 8, 0.1, 0.4):to('cuda')
        local v = rnd({ 1, 2, sz.Nk, sz.Dv }, 'f32', 9, -1, 1):to('cuda')
        local g = rnd({ 1, 2, sz.Nq, sz.Dv }, 'f32', 10, -1, 1):to('cuda')
        local o = { q = q, k = k, v = v, g = g, causal = sz.causal }
        local a, da = fwd('1', form, o)
        local b, db = fwd('0', form, o)
        local diff = maxdiff(a, b)
        local what = form .. ' D=' .. sz.D
        if sz.D > 128 then
          assert.equal(0, diff, what .. ': one kernel (wmma) both times')
        else
          assert.is_true(diff > 0 and diff <= (sz.tol or 1e-5), what .. ': mma vs wmma ' .. diff)
        end
        -- the gradients read the forward's statistic, which differs by the order of sums: 1e-3 of
        -- the largest (dK and dV may agree bit for bit: the key pass sums in the wmma pass's order)
        for gi, name in ipairs({ 'dq', 'dk', 'dv' }) do
          local ddiff, dbig = maxdiff(da[gi], db[gi])
          if sz.D > 128 then assert.equal(0, ddiff, what .. ': one ' .. name .. ' kernel (wmma) both times')
          else assert.is_true(ddiff <= 1e-3 * (1 + dbig), what .. ': ' .. name .. ' mma vs wmma ' .. ddiff) end
        end
      end
    end
  end)

  it_cuda('precision: the CPU, f64 tensors and unknown values are named errors', function()
    local q = rnd({ 1, 1, 3, 4 }, 'f32', 1, 0.1, 0.4)
    local ok, e = pcall(pn.attention, q, q, q, { precision = 'bf16' })
    assert.is_false(ok)
    assert.matches("attention: precision = 'bf16' runs on CUDA tensor cores; q [1,1,3,4] is on the CPU (leave precision out there)", msg(e), 1, true)
    local q64 = q:to('f64'):to('cuda')
    ok, e = pcall(pn.attention, q64, q64, q64, { precision = 'f16' })
    assert.is_false(ok)
    assert.matches("attention: precision = 'f16' rounds f32 inputs; q [1,1,3,4] is f64", msg(e), 1, true)
    ok, e = pcall(pn.attention, q:to('cuda'), q:to('cuda'), q:to('cuda'), { precision = 'tf32' })
    assert.is_false(ok)
    assert.matches("attention: unknown precision 'tf32' (valid: bf16, f16, native)", msg(e), 1, true)
  end)

  -- mfwd_kernel takes whole 64-key tiles without the row modifiers (kwhole, tbad): a NaN key or
  -- query row, a bias and ALiBi must still reach them, across tiles and at the causal edge
  it_cuda('precision bf16: NaN in q or k, a bias and ALiBi reach the tensor-core kernels as on the CPU (forward; backward without NaN)', function()
    local B, H, Nq, Nk, D, Dv = 1, 2, 70, 130, 16, 8
    local function nan_at(pos) return function(v) v[pos] = 0 / 0 end end
    cu.schedules(function(s)
      local cases = {
        { 'a NaN query row', nil, { score = 'dot' }, nan_at(5 * D + 3) },
        { 'a NaN key (every row sees it)', nan_at((Nk + 100) * D + 1), { score = 'dot' } },
        { 'a NaN key, causal (rows 41 … 70 see it)', nan_at(100 * D + 1), { score = 'laplacian', causal = true } },
        { 'a bias', nil, { score = 'dot', bias = rnd({ Nq, Nk }, 'f32', 9, -2, 2) } },
        { 'ALiBi', nil, { score = 'laplacian', causal = true, alibi = true } },
        { 'causal, whole tiles up to the diagonal', nil, { score = 'umbral', causal = true } },
      }
      for _, cs in ipairs(cases) do
        local what, kedit, o, qedit = cs[1] .. ' (' .. s .. ')', cs[2], cs[3], cs[4]
        local q = rnd({ B, H, Nq, D }, 'f32', 11, 0.05, 0.45, qedit)
        local k = rnd({ B, H, Nk, D }, 'f32', 12, 0.05, 0.45, kedit)
        local v = rnd({ B, H, Nk, Dv }, 'f32', 13, -0.5, 0.5)
        local ref = pn.attention(q, k, v, o)
        local oc = {}
        for key, val in pairs(o) do oc[key] = pn.is_tensor(val) and val:to('cuda') or val end
        oc.precision = 'bf16'
        local qc, kc, vc = q:to('cuda'):requires_grad_(), k:to('cuda'):requires_grad_(), v:to('cuda'):requires_grad_()
        local got = pn.attention(qc, kc, vc, oc)
        local r = check.vals(ref)
        local nans = 0
        for i = 1, #r do if r[i] ~= r[i] then nans = nans + 1 end end
        local finite = cs[2] == nil and cs[4] == nil
        assert.is_true(finite and nans == 0 or nans > 0, what .. ': the case has NaN rows')
        close(got, ref, TOL.bf16, 'bf16 ' .. what)
        if finite then -- the backward's whole tiles too (with NaN, a GEMM's 0·NaN spreads further than the CPU's)
          local w = rnd({ B, H, Nq, Dv }, 'f32', 14, -1, 1)
          q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
          ;(pn.attention(q, k, v, o) * w):sum():backward()
          ;(got * w:to('cuda')):sum():backward()
          local gr, gg = { q.grad, k.grad, v.grad }, { qc.grad, kc.grad, vc.grad }
          for n, name in ipairs({ 'q', 'k', 'v' }) do close(gg[n], gr[n], TOL.bf16, 'bf16 ' .. what .. ': d' .. name) end
        end
      end
    end)
  end)

  it_cuda('precision bf16: when the 16-bit copies of the operands do not fit in device memory, the wmma kernels run instead (forward; backward), with the CPU\'s answer', function()
    if not pn.cuda.interpreted() then pending('needs the interpreter\'s device-memory size (pn.cuda.emu_device_memory)'); return end
    -- one query block against many keys, then many queries against one key block: the copies
    -- (2048 rows of 16 bf16) are then the largest allocations of the forward and of the backward's
    -- query pass (K, V), or of the backward's key pass (Q, dO; that forward's largest is its
    -- output). The gradients are held against the same call with room (the mma kernels): summed over
    -- 2000 rows with cancellation, bf16 keeps dk and dv only to ~5 % of the CPU's on either kernel.
    for _, cs in ipairs({ { 3, 2000, { false, true }, 'umbral' }, { 2000, 3, { true }, 'dot' } }) do
      local B, H, Nq, Nk, D = 1, 1, cs[1], cs[2], 16
      local q = rnd({ B, H, Nq, D }, 'f32', 21, 0.05, 0.45)
      local k = rnd({ B, H, Nk, D }, 'f32', 22, 0.05, 0.45)
      local v = rnd({ B, H, Nk, D }, 'f32', 23, -0.5, 0.5)
      local w = rnd({ B, H, Nq, D }, 'f32', 24, -1, 1)
      q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
      local ref = pn.attention(q, k, v, { score = cs[4] })
      ;(ref * w):sum():backward()
      local function call(backward)
        local qc, kc, vc = q:detach():to('cuda'):requires_grad_(), k:detach():to('cuda'):requires_grad_(),
          v:detach():to('cuda'):requires_grad_()
        local got = pn.attention(qc, kc, vc, { score = cs[4], precision = 'bf16' })
        if backward then (got * w:to('cuda')):sum():backward() end
        pn.cuda.synchronize()
        return { got, qc.grad, kc.grad, vc.grad }
      end
      for _, backward in ipairs(cs[3]) do
        local what = string.format('%s, Nq = %d, Nk = %d, %s', cs[4], Nq, Nk, backward and 'forward and backward' or 'forward')
        -- what the call takes from cudaMalloc with room to spare (an empty cache first, so all of it is new) …
        pn.cuda.empty_cache()
        local _, used0 = pn.cuda.emu_device_memory()
        local roomy = call(backward)
        local _, used1 = pn.cuda.emu_device_memory()
        assert(used1 - used0 > 2 * 65536, what .. ': the call took less than the copies need')
        -- … and the same call with 48 KiB less than that: a 64 KiB copy no longer fits
        pn.cuda.empty_cache()
        local _, base = pn.cuda.emu_device_memory()
        local prev = pn.cuda.emu_device_memory(base + (used1 - used0) - 49152)
        local ok, res = pcall(call, backward)
        pn.cuda.emu_device_memory(prev)
        assert(ok, what .. ' with too little device memory for the copies: ' .. tostring(res))
        close(res[1], ref, TOL.bf16, 'bf16 ' .. what .. ' without room for the copies')
        if backward then
          for n, name in ipairs({ 'q', 'k', 'v' }) do
            close(res[n + 1], roomy[n + 1], TOL.bf16, 'bf16 ' .. what .. ': d' .. name .. ' against the call with room')
          end
        end
      end
    end
  end)

  it_cuda('no query rows or no keys: empty or zero outputs as on the CPU, f32 and bf16, with the backward', function()
    for _, prec in ipairs({ false, 'bf16' }) do
      for _, sz in ipairs({ { 0, 7 }, { 5, 0 } }) do
        local q, k, v = rnd({ 1, 2, sz[1], 16 }, 'f32', 1), rnd({ 1, 2, sz[2], 16 }, 'f32', 2), rnd({ 1, 2, sz[2], 8 }, 'f32', 3)
        local ref = pn.attention(q, k, v)
        local qc, kc, vc = q:to('cuda'):requires_grad_(), k:to('cuda'):requires_grad_(), v:to('cuda'):requires_grad_()
        local got = pn.attention(qc, kc, vc, { precision = prec or nil })
        close(got, ref, TOL.f32, string.format('Nq = %d, Nk = %d, %s', sz[1], sz[2], prec or 'f32'))
        got:sum():backward()
        assert.equal(sz[1] * 2 * 16, qc.grad:numel())
      end
    end
  end)

  -- dense.cu's mods, as the CPU's row_mods: masked is the mask, the causal cut or a −inf bias, not
  -- the score's value — a dot product is −inf where an infinite key coordinate meets a negative
  -- query one, and that row must be NaN (nan_spec holds the CPU to the same)
  it_cuda('a −inf dot product from an infinite key coordinate is NaN, not masked, as on the CPU', function()
    each(function(dt)
      local q = pn.tensor({ { 1, -1 }, { -1, 2 }, { 0.5, -0.5 } }, { dtype = dt })
      local k = pn.tensor({ { 1, 1 }, { 0.3, 0.2 }, { math.huge, 0.5 } }, { dtype = dt })
      local v = pn.tensor({ { 1 }, { 2 }, { 3 } }, { dtype = dt })
      local m = pn.tensor({ { 1, 1, 1 }, { 1, 1, 0 }, { 1, 1, 1 } }, { dtype = 'u8' })
      local bias = pn.tensor({ { 0, 0, 0 }, { 0, 0, -math.huge }, { 0, 0, 0 } }, { dtype = dt })
      for _, c in ipairs({ { {}, 'NNN' }, { { causal = true }, '..N' }, { { mask = m }, 'N.N' }, { { bias = bias }, 'N.N' } }) do
        local o = { score = 'dot' }
        for kk, vv in pairs(c[1]) do o[kk] = pn.is_tensor(vv) and vv:to('cuda') or vv end
        local out = pn.attention(q:to('cuda'), k:to('cuda'), v:to('cuda'), o):to('cpu'):totable()
        local rows = {}
        for i = 1, 3 do rows[i] = out[i][1] ~= out[i][1] and 'N' or '.' end
        assert.equal(c[2], table.concat(rows), dt .. ' ' .. c[2])
      end
    end)
  end)

  it_cuda('NaN in q gives NaN rows as on the CPU; the CPU errors (manifold, Klein ball) with its messages', function()
    each(function(dt)
      local q = rnd({ 1, 2, 6, 4 }, dt, 3, 0.05, 0.45, function(v) v[4 * 2 + 2] = 0 / 0 end)
      local k, v = rnd({ 1, 2, 7, 4 }, dt, 4, 0.05, 0.45), rnd({ 1, 2, 7, 3 }, dt, 5, -0.3, 0.3)
      for _, o in ipairs({ { score = 'dot' }, { score = 'laplacian', normalize = 'sigmoid' },
                            { score = 'dot', causal = true, normalize = 'sigmoid_normalized' } }) do
        local ref = pn.attention(q, k, v, o)
        local got = pn.attention(q:to('cuda'), k:to('cuda'), v:to('cuda'), o)
        close(got, ref, TOL[dt], o.score .. ' with a NaN query')
        close(pn.attention_weights(q:to('cuda'), k:to('cuda'), o), pn.attention_weights(q, k, o), TOL[dt],
          o.score .. ' weights with a NaN query')
      end
      local function same_error(f, ...)
        local args = { ... }
        local ok1, e1 = pcall(f, unpack(args))
        for i, a in ipairs(args) do if pn.is_tensor(a) then args[i] = a:to('cuda') end end
        local ok2, e2 = pcall(f, unpack(args))
        assert.is_false(ok1)
        assert.is_false(ok2)
        assert.equal(msg(e1), msg(e2))
      end
      local off = rnd({ 1, 2, 6, 4 }, dt, 6, 0.05, 0.45, function(x) x[4 * 9 + 4] = -0.5 end)
      same_error(function(a, b, c) return pn.attention(a, b, c, { score = 'umbral' }) end, off, k, v)
      same_error(function(a, b, c) return pn.attention(a, b, c, { score = 'hyperbolic', model = 'poincare' }) end,
        q * 0 + 0.6, k, v)
      same_error(function(a, b, c) return pn.attention(a, b, c, { score = 'umbral' }) end, q, k, v)
      same_error(function(a, b, c) return pn.attention(a, b, c, { score = 'dot', aggregate = 'einstein' }) end,
        k, k, v * 4)
    end, { SCHEDULES[1] })
  end)
end)
