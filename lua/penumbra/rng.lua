-- penumbra.rng — a small deterministic random stream for host-side sampling (data generators,
-- samplers), independent of pn.manual_seed and of Lua's process-global math.random.
--
--   local r = require('penumbra.rng')(seed)
--   r.u()        uniform in [0, 1) (53 bits)
--   r.int(n)     0 … n − 1
--   r.normal()   standard normal (Box–Muller, one value per call)
-- A 64-bit LCG (Knuth's MMIX constants) on LuaJIT's uint64 cdata; the top 53 bits are used.
local ffi = require 'ffi'

return function(seed)
  local s = ffi.new('uint64_t', seed) * 6364136223846793005ULL + 1442695040888963407ULL
  local r = {}
  function r.u()
    s = s * 6364136223846793005ULL + 1442695040888963407ULL
    return tonumber(s / 2048ULL) * 2 ^ -53
  end
  function r.int(n) return math.floor(r.u() * n) end
  function r.normal()
    local u1 = 1 - r.u() -- (0, 1]
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * r.u())
  end
  return r
end
