-- attention_microkernel_spec.lua — the f32 CPU attention on its register-blocked GEMM
-- (core/attention/microkernel.h): every kernel this CPU runs (avx512: 6 × 64 blocks over two
-- panels of 32, 6 × 32 for an odd count's last panel; avx2: 6 × 16) against the portable one
-- (4 × 8), and the portable one against the f64 path (BLAS),
-- at sizes that hit every edge of the blocks and tiles — N = 1, Nq and Nk not multiples of any
-- register block or of the forward's 48-row / 256-key tiles and the backward's 64 × 256, D and
-- Dv not multiples of 8 or 32, Nq ≠ Nk with causal offsets both ways, masks, bias, sigmoid —
-- for every registry score that is not graph-only (hyperbolic in its three models): the output
-- and the gradients of q, k, v, the bias and the learnable parameters. Kernel against kernel
-- within 1e-5 (relative plus as much absolute, check.assert_close) — or twice f32's own error
-- against f64 where the score is worse conditioned than that; f32 against f64 within 1e-4.
-- Also: pn.cpu_kernel / pn.set_cpu_kernel and PENUMBRA_CPU_KERNEL's errors.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local cu = require 'spec.helpers.cuda'

local VARIANTS = pn.attention_variants({ all = true })
local FORMS = cu.forms(VARIANTS, function(name) return not VARIANTS[name].graph_only end)
local KERNELS = { 'avx512', 'avx2', 'portable' }
local INITIAL = pn.cpu_kernel() -- PENUMBRA_CPU_KERNEL's choice, restored after every test

-- the kernels this CPU runs, besides portable
local function fast_kernels()
  local list = {}
  for _, k in ipairs(KERNELS) do
    if k ~= 'portable' and pcall(pn.set_cpu_kernel, k) then list[#list + 1] = k end
  end
  pn.set_cpu_kernel(INITIAL)
  return list
end

local function params_of(name, model, D)
  local probe = pn.full({ 1, 1, 2, D }, 0.2 / math.sqrt(D), { dtype = 'f64' })
  return cu.params_of(VARIANTS, name, model, D, function(o) return pcall(pn.attention, probe, probe, probe, o) end)
end

-- inputs (f64) for one configuration: q, k, v (+ bias, parameters), valid for every domain
local function inputs_of(c)
  local sc = math.min(1, 2 / math.sqrt(c.D))
  local x = { cu.rnd({ c.B, c.H, c.Nq, c.D }, 'f64', c.seed + 1, 0.05 * sc, 0.45 * sc),
              cu.rnd({ c.B, c.H, c.Nk, c.D }, 'f64', c.seed + 2, 0.05 * sc, 0.45 * sc),
              cu.rnd({ c.B, c.H, c.Nk, c.Dv }, 'f64', c.seed + 3, -1, 1) }
  if c.near then -- every key 1e-4 from its query: the distance scores' expansion cancels (diff_fix)
    x[2] = x[1] + cu.rnd({ c.B, c.H, c.Nk, c.D }, 'f64', c.seed + 6, -1e-4, 1e-4)
  end
  if c.model == 'hyperboloid' then x[1], x[2] = pn.maps.pseudopolar(x[1] * 3), pn.maps.pseudopolar(x[2] * 3) end
  local names = {}
  if c.bias then
    x[#x + 1] = cu.rnd({ c.H, c.Nq, c.Nk }, 'f64', c.seed + 4, -0.5, 0.5)
    names[#names + 1] = 'bias'
  end
  for _, p in ipairs(params_of(c.score, c.model, c.D)) do
    x[#x + 1] = cu.rnd({ c.H }, 'f64', c.seed + 10 + #x, p.lo, p.hi)
    names[#names + 1] = p.name
  end
  local mask
  if c.mask then
    local r, m = check.rng(c.seed + 5), {}
    for i = 1, c.B * c.Nk do m[i] = r:u() < 0.75 and 1 or 0 end
    mask = pn.tensor(m, { dtype = 'u8' }):reshape({ c.B, 1, 1, c.Nk })
  end
  return x, names, mask
end

-- the output (or the weights) and every gradient under one cotangent, in dtype dt
local function run(c, dt, x, names, mask)
  local args = {}
  for i, t in ipairs(x) do args[i] = t:to(dt):detach():requires_grad_() end
  local o = { score = c.score, model = c.model, normalize = c.normalize, causal = c.causal, mask = mask }
  for i, nm in ipairs(names) do o[nm] = args[3 + i] end
  local out = c.weights and pn.attention_weights(args[1], args[2], o) or pn.attention(args[1], args[2], args[3], o)
  out:backward(cu.rnd(out:shape(), dt, c.seed + 77))
  local res = { out = out }
  for i, t in ipairs(args) do
    if not (c.weights and i == 3) then res[i <= 3 and ({ 'q', 'k', 'v' })[i] or names[i - 3]] = t.grad end
  end
  return res
end

local function same(got, ref, tol, what)
  for name, r in pairs(ref) do
    assert.is_true(got[name] ~= nil, what .. ': ' .. name .. ' missing')
    check.assert_close(check.vals(got[name]:to('f64')), check.vals(r:to('f64')), tol, what .. ' ' .. name)
  end
end

-- the largest error of got against ref in check.assert_close's measure, |g − r| / (1 + |r|)
local function worst(got, ref)
  local e = 0
  for name, r in pairs(ref) do
    local gv, rv = check.vals(got[name]:to('f64')), check.vals(r:to('f64'))
    for i = 1, #rv do
      if rv[i] == rv[i] and math.abs(rv[i]) < math.huge then e = math.max(e, math.abs(gv[i] - rv[i]) / (1 + math.abs(rv[i]))) end
    end
  end
  return e
end

local SIZES = {
  { B = 1, H = 1, Nq = 1, Nk = 1, D = 2, Dv = 1 },
  { B = 2, H = 1, Nq = 5, Nk = 7, D = 5, Dv = 3 },
  { B = 1, H = 2, Nq = 49, Nk = 37, D = 9, Dv = 17, causal = true },            -- Nq > Nk: offset −12
  { B = 1, H = 1, Nq = 97, Nk = 300, D = 33, Dv = 40, causal = true },          -- offset 203, two key tiles
  { B = 1, H = 1, Nq = 130, Nk = 257, D = 64, Dv = 64, mask = true, bias = true },
  { B = 1, H = 1, Nq = 11, Nk = 70, D = 128, Dv = 33, normalize = 'sigmoid_normalized' },
  { B = 1, H = 1, Nq = 66, Nk = 19, D = 17, Dv = 8, normalize = 'sigmoid', causal = true },
  { B = 1, H = 1, Nq = 50, Nk = 260, D = 7, weights = true, causal = true },
  { B = 1, H = 1, Nq = 70, Nk = 70, D = 16, Dv = 8, near = true },
}

local function label(c)
  return string.format('%s%s %s%s%s%s%s%s Nq=%d Nk=%d D=%d Dv=%d', c.score, c.model and ('/' .. c.model) or '',
    c.normalize or 'softmax', c.causal and ' causal' or '', c.mask and ' mask' or '', c.bias and ' bias' or '',
    c.weights and ' weights' or '', c.near and ' near' or '', c.Nq, c.Nk, c.D, c.Dv or 0)
end

describe('CPU attention microkernel', function()
  after_each(function() pn.set_cpu_kernel(INITIAL) end)

  it('says which kernel runs and switches between them', function()
    local k = pn.cpu_kernel()
    assert.is_true(k == 'avx512' or k == 'avx2' or k == 'portable', k)
    pn.set_cpu_kernel('portable')
    assert.equal('portable', pn.cpu_kernel())
    local widest = fast_kernels()[1] or 'portable'
    pn.set_cpu_kernel('auto')
    assert.equal(widest, pn.cpu_kernel())
    check.assert_error_matching(function() pn.set_cpu_kernel('sse9') end,
      "unknown CPU kernel 'sse9'; valid: auto, avx512, avx2, portable")
    check.assert_error_matching(function() pn.set_cpu_kernel(3) end, 'set_cpu_kernel: name must be a string')
    for _, name in ipairs(fast_kernels()) do
      pn.set_cpu_kernel(name)
      assert.equal(name, pn.cpu_kernel())
    end
  end)

  it('PENUMBRA_CPU_KERNEL chooses the kernel; an unknown one is an error naming the variable', function()
    local script = os.tmpname() .. '.lua'
    local f = assert(io.open(script, 'w'))
    f:write([[
local pn = require 'penumbra'
print('kernel ' .. pn.cpu_kernel())
local q = pn.randn({ 1, 1, 3, 4 })
print(pcall(pn.attention, q, q, q, { score = 'dot' }))
]])
    f:close()
    local bench = (os.getenv('PENUMBRA_HOME') or '.') .. '/bench'
    local out = check.sh('PENUMBRA_CPU_KERNEL=portable ' .. bench .. ' ' .. script .. ' 2>&1')
    assert.truthy(out:find('kernel portable', 1, true), out)
    out = check.sh('PENUMBRA_CPU_KERNEL=avx3 ' .. bench .. ' ' .. script .. ' 2>&1')
    assert.truthy(out:find("PENUMBRA_CPU_KERNEL: unknown CPU kernel 'avx3'; valid: auto, avx512, avx2, portable", 1, true), out)
    os.remove(script)
    os.remove((script:gsub('%.lua$', '')))
  end)

  it('every kernel equals portable, and portable equals f64, for every score at every edge of the blocks', function()
    local fast = fast_kernels()
    local cases = 0
    for _, form in ipairs(FORMS) do
      for n, size in ipairs(SIZES) do
        -- (the hyperbolic distance at coincident points, arcosh near 1, has no f32 digits to compare)
        if size.near and form[1] == 'hyperbolic' then goto next end
        local c = { score = form[1], model = form[2], seed = 40 + n }
        for key, v in pairs(size) do c[key] = v end
        local x, names, mask = inputs_of(c)
        local what = label(c)
        pn.set_cpu_kernel('portable')
        local ref, exact = run(c, 'f32', x, names, mask), run(c, 'f64', x, names, mask)
        same(ref, exact, 1e-4, what .. ' portable vs f64')
        -- 1e-5, or twice f32's own error where the score's f32 conditioning is worse than that
        -- (hyperbolic/halfspace near the boundary: 1/(q_d·k_d)); a wrong product is off by O(1)
        local tol = math.max(1e-5, 2 * worst(ref, exact))
        for _, k in ipairs(fast) do
          pn.set_cpu_kernel(k)
          same(run(c, 'f32', x, names, mask), ref, tol, what .. ' ' .. k .. ' vs portable')
        end
        cases = cases + 1
        ::next::
      end
    end
    assert.is_true(cases >= 9 * 7 - 3, 'cases run: ' .. cases)
  end)

  -- the backward's query tiles are 64 or 128 rows (pn_attn_bwd_tq: 128 for long sequences on a
  -- core with a large L2); PENUMBRA_ATTN_BWD_TQ forces one, so both run on any machine
  it('the backward gives the same gradients with 64- and 128-row query tiles; a bad tile height is an error', function()
    local ffi = require 'ffi'
    pcall(ffi.cdef, 'int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);')
    local prev, threads = os.getenv('PENUMBRA_ATTN_BWD_TQ'), pn.num_threads()
    local function restore()
      if prev then ffi.C.setenv('PENUMBRA_ATTN_BWD_TQ', prev, 1) else ffi.C.unsetenv('PENUMBRA_ATTN_BWD_TQ') end
      pn.set_num_threads(threads)
    end
    local ok, err = pcall(function()
      pn.set_num_threads(2) -- one head over 2 threads: its query tiles split, dK / dV summed over the splits
      local TILES = {
        { B = 1, H = 1, Nq = 300, Nk = 290, D = 64, Dv = 40, causal = true },   -- 3 tiles of 128 (the last 44), 5 of 64
        { B = 2, H = 1, Nq = 129, Nk = 257, D = 33, Dv = 64, mask = true, bias = true },
        { B = 1, H = 1, Nq = 200, Nk = 70, D = 16, weights = true },
      }
      for _, score in ipairs({ 'dot', 'umbral', 'penumbral', 'hyperbolic' }) do
        for n, size in ipairs(TILES) do
          local c = { score = score, seed = 90 + n }
          for key, v in pairs(size) do c[key] = v end
          local x, names, mask = inputs_of(c)
          ffi.C.setenv('PENUMBRA_ATTN_BWD_TQ', '64', 1)
          local ref = run(c, 'f32', x, names, mask)
          ffi.C.setenv('PENUMBRA_ATTN_BWD_TQ', '128', 1)
          same(run(c, 'f32', x, names, mask), ref, 1e-5, label(c) .. ' 128-row vs 64-row tiles')
        end
      end
      ffi.C.setenv('PENUMBRA_ATTN_BWD_TQ', '96', 1)
      local q = pn.randn({ 1, 1, 3, 4 }):requires_grad_()
      check.assert_error_matching(function() pn.attention(q, q, q, {}):sum():backward() end,
        "attention: PENUMBRA_ATTN_BWD_TQ must be 64 or 128 (query rows per backward tile), got '96'")
    end)
    restore()
    assert(ok, err)
  end)
end)
