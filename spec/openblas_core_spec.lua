-- OpenBLAS's kernel family (bindings/openblas_core.lua): the choice from the CPU's flags, the
-- user's OPENBLAS_CORETYPE left alone, and — on this machine — that the OpenBLAS in the process
-- really runs what the binding asked for (it reads the variable only as it loads).
require 'penumbra' -- loads libpenumbra, and with it OpenBLAS
local B = require 'penumbra_ffi'
local core = require 'openblas_core'
local ffi = require 'ffi'
pcall(ffi.cdef, 'char *openblas_get_corename(void);')
pcall(ffi.cdef, 'char *openblas_get_config(void);')

-- abridged 'flags' lines of /proc/cpuinfo
local EMERALD_RAPIDS = 'fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2 avx512f avx512dq ' ..
  'avx512ifma avx512cd avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vnni avx512_fp16 amx_tile'
local ZEN3 = 'fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2 sha_ni vaes vpclmulqdq'
-- Knights Landing: AVX-512 F and CD but not BW/DQ/VL, which OpenBLAS's SkylakeX kernels use
local KNIGHTS_LANDING = 'fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx avx2 avx512f avx512pf avx512er avx512cd'
local SANDY_BRIDGE = 'fpu sse sse2 ssse3 sse4_1 sse4_2 avx'

describe('openblas_core.choose', function()
  it('asks for the newest f32 kernels the flags allow', function()
    assert.equal('SkylakeX', core.choose(EMERALD_RAPIDS))
    assert.equal('Haswell', core.choose(ZEN3))
    assert.equal('Haswell', core.choose(KNIGHTS_LANDING))
  end)

  it('leaves older CPUs and unreadable flags to OpenBLAS', function()
    assert.is_nil(core.choose(SANDY_BRIDGE))
    assert.is_nil(core.choose('avx2 sse4_2')) -- AVX2 without FMA
    assert.is_nil(core.choose(''))
    assert.is_nil(core.choose(nil))
  end)

  it('matches whole flags, not prefixes', function()
    -- avx512fp16 / avx512_bf16 must not stand in for avx512f, nor fma4 for fma
    assert.is_nil(core.choose('avx512fp16 avx512cd avx512bw avx512dq avx512vl'))
    assert.is_nil(core.choose('avx2 fma4'))
  end)
end)

describe('openblas_core.before_load / after_load', function()
  local saved
  before_each(function() saved = os.getenv('OPENBLAS_CORETYPE') end)
  after_each(function()
    if saved then ffi.C.setenv('OPENBLAS_CORETYPE', saved, 1) else ffi.C.unsetenv('OPENBLAS_CORETYPE') end
  end)

  it("keeps the user's choice and does not unset it", function()
    ffi.C.setenv('OPENBLAS_CORETYPE', 'Prescott', 1)
    local s = core.after_load(core.before_load())
    assert.same({ requested = 'Prescott', by = 'user' }, s)
    assert.equal('Prescott', os.getenv('OPENBLAS_CORETYPE'))
  end)

  it('sets the variable for the load only, from this CPU', function()
    ffi.C.unsetenv('OPENBLAS_CORETYPE')
    local s = core.before_load()
    if s.by == nil then
      assert.is_nil(os.getenv('OPENBLAS_CORETYPE'))
      return -- no choice on this CPU: nothing set
    end
    assert.equal('penumbra', s.by)
    assert.equal(s.requested, os.getenv('OPENBLAS_CORETYPE'))
    core.after_load(s)
    assert.is_nil(os.getenv('OPENBLAS_CORETYPE'))
  end)
end)

describe('the OpenBLAS in this process', function()
  it('runs the kernel family the binding asked for', function()
    local asked = B.openblas_core
    assert.is_table(asked)
    if asked.by ~= 'penumbra' then
      pending('OPENBLAS_CORETYPE came from the environment or this CPU needs no choice')
      return
    end
    local blas = ffi.load('openblas')
    -- an OpenBLAS built for one target ignores the variable (Debian's picks at run time)
    if not ffi.string(blas.openblas_get_config()):find('DYNAMIC_ARCH', 1, true) then
      pending('this OpenBLAS is built for one target: ' .. ffi.string(blas.openblas_get_config()))
      return
    end
    local name = ffi.string(blas.openblas_get_corename())
    assert.equal(asked.requested:lower(), name:lower())
    assert.is_nil(os.getenv('OPENBLAS_CORETYPE')) -- a child process chooses for itself
  end)
end)
