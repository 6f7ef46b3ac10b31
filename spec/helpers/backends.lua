-- spec/helpers/backends.lua — the devices the backend-parametrised specs run on.
--   backends.list()    -> { {device='cpu', dtypes={'f32'}}, [{device='cuda', dtypes={'f32','f64'}}] }
--   backends.names()   -> {'cpu'[, 'cuda']}
--   backends.REFERENCE -> {device='cpu', dtype='f64'}: what every backend is compared against
-- 'cpu' always; 'cuda' when the build reports a usable device (pn.cuda_available()).
-- PENUMBRA_BACKENDS=cpu,cuda overrides the list; a name that is unknown or not available
-- in this build is an error, not a silent skip, so a CI job asking for cuda cannot pass
-- by testing nothing.
local pn = require 'penumbra'

local M = {}

M.REFERENCE = { device = 'cpu', dtype = 'f64' }

-- which dtypes each device is checked in: the CPU's f64 is the reference itself, so the
-- CPU backend is its f32 path; a GPU is checked in both float dtypes
local DTYPES = { cpu = { 'f32' }, cuda = { 'f32', 'f64' } }

local function available(name)
  if name == 'cpu' then return true end
  if name == 'cuda' then return pn.cuda_available() end
  return false
end

-- Kernels a device does not have yet, on purpose, and where they come from: an op case that
-- fails with "no <device> kernel '<name>' yet" for one of these is counted as pending, any
-- other missing kernel is a failure (and cuda_spec checks this list is exactly what is missing).
M.PENDING = {
  cuda = {},
}

-- the pending kernel an error message is about on device, or nil
function M.pending(device, message)
  local k = tostring(message):match("no " .. device .. " kernel '([%w_]+)' yet")
  if k and (M.PENDING[device] or {})[k] then return k end
  return nil
end

function M.names(env)
  env = env or os.getenv('PENUMBRA_BACKENDS')
  local names = {}
  if env and env ~= '' then
    for name in env:gmatch('[^,%s]+') do
      if not DTYPES[name] then
        error("PENUMBRA_BACKENDS: unknown backend '" .. name .. "' (valid: cpu, cuda)", 2)
      end
      if not available(name) then
        error("PENUMBRA_BACKENDS: backend '" .. name .. "' is not available in this build", 2)
      end
      names[#names + 1] = name
    end
    return names
  end
  for _, name in ipairs({ 'cpu', 'cuda' }) do
    if available(name) then names[#names + 1] = name end
  end
  return names
end

function M.list(env)
  local r = {}
  for _, name in ipairs(M.names(env)) do r[#r + 1] = { device = name, dtypes = DTYPES[name] } end
  return r
end

return M
