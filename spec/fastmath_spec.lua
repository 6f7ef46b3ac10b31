-- fastmath_spec.lua — the float maths the attention epilogues use on the CPU and in the CUDA
-- kernels (core/attention/fastmath.h: 1/√ and √ from a bit-trick seed and two fitted Newton
-- steps, log, acosh(1 + t)) against double libm over the normal floats, with the accuracy the
-- header states; and the softmax's exp for x <= 0 (ops/fast_math.h) against libm's exp and, bit
-- for bit, against pn_fast_expf over the floats in [-80, 0] (+0 below: no subnormal weights). The functions are static inline (no symbol
-- to reach through the FFI), so the spec builds spec/fixtures/fastmath_check.c with the system C
-- compiler (as CI has) and reads its report; every 61st bit pattern from 2^-126 to the largest
-- float (~3.5e7 values, about a second; the fixture's argument 1 makes it exhaustive).
local home = os.getenv('PENUMBRA_HOME') or '.'

describe('fastmath.h', function()
  local report, why
  setup(function()
    local exe = os.tmpname()
    local cmd = string.format('cc -O2 -std=gnu11 -I "%s/core" -o "%s" "%s/spec/fixtures/fastmath_check.c" -lm 2>&1',
                              home, exe, home)
    local p = io.popen(cmd)
    local out = p:read('*a')
    local ok = p:close()
    if ok ~= true and ok ~= 0 then
      why = 'could not build spec/fixtures/fastmath_check.c with cc: ' .. out
      os.remove(exe)
      return
    end
    p = io.popen('"' .. exe .. '" 61')
    report = {}
    for name, err, at in p:read('*a'):gmatch('(%S+) (%S+) (%S+)\n') do
      report[name] = { err = tonumber(err), at = tonumber(at) }
    end
    p:close()
    os.remove(exe)
  end)

  -- bound: the header's figure (error relative to max(|exact|, floor): see the fixture)
  for _, c in ipairs({ { 'rsqrt', 9e-7 }, { 'sqrt', 9e-7 }, { 'log', 2e-7 }, { 'acosh1p', 1.2e-6 },
                       { 'expf_nonpos', 2e-7 } }) do
    it(string.format('%s is within %.1e of double libm on every sampled normal float', c[1], c[2]), function()
      if why then pending(why); return end
      local r = report[c[1]]
      assert.is_not_nil(r, 'no line for ' .. c[1] .. ' in the fixture\'s report')
      assert(r.err <= c[2], string.format('%s: error %.3e at x = %.9g, bound %.1e', c[1], r.err, r.at, c[2]))
      assert(r.err > 0, c[1] .. ': error exactly 0 — the fixture compared the function with itself?')
    end)
  end

  it('the softmax exp (x <= 0) returns pn_fast_expf\'s bits on every sampled x >= -80, +0 below, NaN for NaN', function()
    if why then pending(why); return end
    local r = report.expf_nonpos_differs
    assert.is_not_nil(r, 'no expf_nonpos_differs line in the fixture\'s report')
    assert(r.err == 0, string.format('%d inputs differ, the first x = %.9g', r.err, r.at))
  end)
end)
