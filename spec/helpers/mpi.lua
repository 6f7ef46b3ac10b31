-- spec/helpers/mpi.lua — what the specs that start ranks share: whether Open MPI is here and the
-- build links it, and `it_mpi`, which is `it` then and otherwise reports the test pending with
-- the apt-get line.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'

local M = {}
M.ROOT = os.getenv('PENUMBRA_HOME') or '.'
M.HAVE_MPIRUN = (check.sh('command -v mpirun')):match('%S') ~= nil
M.MPI = M.HAVE_MPIRUN and pn.dist.built()
-- busted's `it` and `pending` live in the spec file's environment, not in this module's
function M.it_mpi(name, fn)
  local env = getfenv(2)
  if M.MPI then return env.it(name, fn) end
  return env.pending(name .. ' — needs Open MPI (apt-get install -y openmpi-bin libopenmpi-dev) and a build linking it')
end
-- a Lua script with this text in a fresh temporary file (the ranks run it): its path
function M.write_script(text)
  local path = os.tmpname() .. '.lua'
  local f = assert(io.open(path, 'w'))
  f:write(text)
  f:close()
  return path
end

return M
