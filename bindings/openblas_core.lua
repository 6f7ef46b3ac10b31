-- openblas_core — which of OpenBLAS's x86-64 kernel families this process asks for.
--
-- Why: Debian's OpenBLAS (0.3.21 in bookworm) is built for every x86-64 CPU and picks its
-- kernels at load time from the CPU's family and model. A model newer than the release is not in
-- its table and gets the SSE3 "Prescott" kernels, whatever the CPU can do: on an Intel Xeon of
-- model 207 (Emerald Rapids, AVX-512) every sgemm ran 4× slower, and an NMT training step took
-- 5.9 s against PyTorch's 1.6 s. OpenBLAS reads OPENBLAS_CORETYPE once, when it is loaded, so
-- the binding sets it (only when the user has not) from the CPU's own feature flags just before
-- it loads libpenumbra, and takes it away again afterwards so that child processes (a Python
-- peer with its own OpenBLAS) choose for themselves.
--
--   M.choose(flags)   the 'flags' line of /proc/cpuinfo (a string) → 'SkylakeX' (AVX-512 F, CD,
--                     BW, DQ, VL: the newest f32 kernels OpenBLAS has; Cooperlake and Sapphire
--                     Rapids reuse them for sgemm), 'Haswell' (AVX2 + FMA), or nil (leave it
--                     to OpenBLAS)
--   M.before_load()   sets OPENBLAS_CORETYPE when unset and a choice exists; returns the state
--   M.after_load(s)   unsets what before_load set; returns a record for B.openblas_core:
--                     { requested = name or nil, by = 'penumbra' | 'user' | nil }
local ffi = require 'ffi'

local M = {}

for _, decl in ipairs({ 'int setenv(const char *, const char *, int);', 'int unsetenv(const char *);' }) do
  pcall(ffi.cdef, decl) -- one at a time: one declared elsewhere fails alone
end

local function has_all(set, names)
  for _, n in ipairs(names) do
    if not set[n] then return false end
  end
  return true
end

function M.choose(flags)
  if type(flags) ~= 'string' then return nil end
  local set = {}
  for f in flags:gmatch('%S+') do set[f] = true end
  if has_all(set, { 'avx512f', 'avx512cd', 'avx512bw', 'avx512dq', 'avx512vl' }) then return 'SkylakeX' end
  if has_all(set, { 'avx2', 'fma' }) then return 'Haswell' end
  return nil
end

-- the first 'flags' line of /proc/cpuinfo (every core lists the same on the machines we know)
local function cpu_flags()
  local f = io.open('/proc/cpuinfo', 'r')
  if not f then return nil end
  for line in f:lines() do
    local v = line:match('^flags%s*:%s*(.*)$')
    if v then
      f:close()
      return v
    end
  end
  f:close()
  return nil
end

function M.before_load()
  local user = os.getenv('OPENBLAS_CORETYPE')
  if user then return { requested = user, by = 'user' } end
  if ffi.arch ~= 'x64' or ffi.os ~= 'Linux' then return {} end
  local name = M.choose(cpu_flags())
  if not name then return {} end
  if ffi.C.setenv('OPENBLAS_CORETYPE', name, 1) ~= 0 then return {} end
  return { requested = name, by = 'penumbra' }
end

function M.after_load(state)
  if state.by == 'penumbra' then ffi.C.unsetenv('OPENBLAS_CORETYPE') end
  return state
end

return M
