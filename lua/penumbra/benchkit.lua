-- penumbra.benchkit — what every experiments/perf/ script shares: the clock, the median,
-- timed calls, and the printed header that says
-- what machine state the figures were taken in (DESIGN §7).
--
--   bk.now(), bk.median(xs)            (penumbra.stats)
--   bk.list(s, default)                'a,b,3' → { 'a', 'b', 3 } (numbers converted)
--   bk.time_calls(fn, n, into, warm)   ms per call of fn: `warm` untimed calls, then n timed
--                                      ones (a full GC before each) appended to `into`
--   bk.header(title, extra)            prints title + UTC time + host, the CPU, OPENBLAS_CORETYPE
--                                      and the core OpenBLAS chose, the thread counts of both
--                                      pools and their environment, OMP_WAIT_POLICY and the
--                                      load average; `extra` lines follow
local ffi = require 'ffi'
local pn = require 'penumbra'
local stats = require 'penumbra.stats'

local M = { now = stats.now, median = stats.median }

pcall(ffi.cdef, [[
  int openblas_get_num_threads(void);
  char *openblas_get_corename(void);
]])

function M.list(s, default)
  local r = {}
  for x in tostring(s or default):gmatch('[^,]+') do r[#r + 1] = tonumber(x) or x end
  return r
end

function M.time_calls(fn, n, into, warm)
  into = into or {}
  for _ = 1, warm or 0 do fn() end
  for _ = 1, n do
    collectgarbage('collect')
    local t0 = stats.now()
    fn()
    into[#into + 1] = (stats.now() - t0) * 1e3
  end
  return into
end

local function first_line(cmd)
  local p = io.popen(cmd)
  if not p then return '?' end
  local l = p:read('*l')
  p:close()
  return l or '?'
end

function M.loadavg()
  local f = io.open('/proc/loadavg')
  local l = f and f:read('*l') or '?'
  if f then f:close() end
  return l
end

function M.header(title, extra)
  local blas = ffi.load('openblas') -- the library libpenumbra links (already in the process)
  print(string.format('%s   (%s, %s)', title, os.date('!%Y-%m-%d %H:%M UTC'), first_line('uname -n')))
  print(string.format('cpu:%s', first_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")))
  print(string.format('OPENBLAS_CORETYPE=%s   OpenBLAS core: %s', os.getenv('OPENBLAS_CORETYPE') or '(unset)',
    ffi.string(blas.openblas_get_corename())))
  print(string.format('threads: OpenMP (pn.num_threads) = %d, OpenBLAS = %d, OMP_NUM_THREADS=%s, OPENBLAS_NUM_THREADS=%s',
    pn.num_threads(), blas.openblas_get_num_threads(), os.getenv('OMP_NUM_THREADS') or '(unset)',
    os.getenv('OPENBLAS_NUM_THREADS') or '(unset)'))
  -- Two thread pools share the cores: OpenMP (our kernels) and OpenBLAS's pthreads; with the
  -- default wait policy idle OpenMP threads spin and starve OpenBLAS on a busy machine.
  print('OMP_WAIT_POLICY=' .. (os.getenv('OMP_WAIT_POLICY') or '(unset: spinning waits)') ..
    '   (passive helps mixed OpenMP/OpenBLAS work on a busy machine; it applies to both sides)')
  print('load average: ' .. M.loadavg() .. '   (other work on the machine skews every figure)')
  for _, l in ipairs(extra or {}) do print(l) end
  print()
end

return M
