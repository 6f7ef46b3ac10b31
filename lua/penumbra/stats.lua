-- penumbra.stats — the small statistics the library and the benchmarks share, and the clock.
--
--   stats.mean_std(xs) -> mean, sample std (n−1; 0 for one value; NaN, NaN for none)
--   stats.median(xs)   -> the median (mean of the middle two for an even count; NaN for none);
--                         xs is not reordered
--   stats.now()        -> seconds, CLOCK_MONOTONIC (wall time that never jumps back)
local ffi = require 'ffi'

local M = {}

function M.mean_std(xs)
  local n = #xs
  if n == 0 then return 0 / 0, 0 / 0 end
  local s = 0
  for _, x in ipairs(xs) do s = s + x end
  local m = s / n
  local v = 0
  for _, x in ipairs(xs) do v = v + (x - m) ^ 2 end
  return m, n > 1 and math.sqrt(v / (n - 1)) or 0
end

function M.median(xs)
  local s = {}
  for i, v in ipairs(xs) do s[i] = v end
  table.sort(s)
  local n = #s
  if n == 0 then return 0 / 0 end
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end

-- the struct gets a penumbra-specific name: scripts may declare their own timespec
pcall(ffi.cdef, [[
  struct pn_stats_timespec { long tv_sec; long tv_nsec; };
  int clock_gettime(int clk, struct pn_stats_timespec *tp);
]])
local ts = ffi.new('struct pn_stats_timespec')
local CLOCK_MONOTONIC = 1
function M.now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

return M
