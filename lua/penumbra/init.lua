-- penumbra — the Lua library. `local pn = require 'penumbra'`.
-- Tensors and ops come from penumbra.tensor; later layers (nn, optim, data, experiment,
-- plot) hang off the same table.
local B = require 'penumbra_ffi'
local ffi = require 'ffi'
local pn = require 'penumbra.tensor'

pn.version = ffi.string(B.C.pn_version())

function pn.live_tensors() return tonumber(B.C.pn_live_tensors()) end
function pn.live_bytes() return tonumber(B.C.pn_live_bytes()) end
function pn.live_nodes() return tonumber(B.C.pn_live_nodes()) end
function pn.num_threads() return B.C.pn_num_threads() end
function pn.set_num_threads(n) B.C.pn_set_num_threads(n) end
-- Subnormal floats flushed to zero on penumbra's CPU threads (core/fpmode.c: why, and what it
-- changes). pn.set_flush_denormal(true | false) → true, or false where the CPU has no such mode;
-- pn.flush_denormal() → whether this thread flushes. Recipes with a flush_denormal key set it
-- for their run (the NMT recipe's default is true).
function pn.set_flush_denormal(on)
  if type(on) ~= 'boolean' then error('set_flush_denormal: on must be true or false, got ' .. type(on), 2) end
  return B.C.pn_set_flush_denormal(on and 1 or 0) ~= 0
end
function pn.flush_denormal() return B.C.pn_flush_denormal() ~= 0 end
function pn.cuda_available() return B.C.pn_cuda_available() ~= 0 end -- = pn.cuda.available()

-- The CPU attention kernels' register-blocked GEMM (core/attention/microkernel.h): 'avx512',
-- 'avx2' or 'portable'. pn.cpu_kernel() says which runs (the widest this CPU has, unless
-- PENUMBRA_CPU_KERNEL or pn.set_cpu_kernel chose); pn.set_cpu_kernel(name) switches
-- ('auto' = the widest), an error for an unknown name or one this CPU cannot run.
function pn.cpu_kernel()
  local name = ffi.string(B.C.pn_cpu_kernel())
  if name == '' then error(ffi.string(B.C.pn_last_error()), 2) end
  return name
end
function pn.set_cpu_kernel(name)
  if type(name) ~= 'string' then
    error('set_cpu_kernel: name must be a string (auto, avx512, avx2, portable), got ' .. type(name), 2)
  end
  B.check(B.C.pn_set_cpu_kernel(name))
end

-- pn.kernels(device) -> list of kernel names (core/kernels.def order), and list[name] = true when
-- the device's backend has that kernel, false when it is missing; an error when the device is
-- unknown or not built in. What a backend still lacks: the names whose entry is false.
function pn.kernels(device)
  device = device or 'cpu'
  local dev = B.devices[device]
  if dev == nil then error("kernels: unknown device '" .. tostring(device) .. "' (cpu, cuda)", 2) end
  local list = {}
  for i = 0, B.C.pn_kernel_count() - 1 do
    local name = ffi.string(B.C.pn_kernel_name(i))
    local present = B.C.pn_kernel_present(dev, i)
    if present < 0 then error('kernels: device ' .. device .. ' is not available in this build', 2) end
    list[#list + 1] = name
    list[name] = present == 1
  end
  return list
end

-- value with every tensor in it moved to device ('cpu', 'cuda'): a tensor, or a table of them
-- (nested tables too; other fields kept) — a dataset or a batch. Tables are copied, not changed.
function pn.to_device(value, device)
  if pn.is_tensor(value) then return value:to(device) end
  if type(value) ~= 'table' or getmetatable(value) then return value end
  local r = {}
  for k, v in pairs(value) do r[k] = pn.to_device(v, device) end
  return r
end

-- the layers above the tensors (a missing or renamed one is an error, not a silent nil)
for _, name in ipairs({ 'cuda', 'dist', 'io', 'nn', 'optim', 'data', 'experiment', 'plot', 'metrics', 'text' }) do
  pn[name] = require('penumbra.' .. name)
end

return pn
