-- penumbra — the Lua library. `local pn = require 'penumbra'`.
-- Tensors and ops come from penumbra.tensor; later layers (nn, optim, data, experiment,
-- plot) hang off the same table.
local B = require 'penumbra_ffi'
local pn = require 'penumbra.tensor'

pn.version = require('ffi').string(B.C.pn_version())

function pn.live_tensors() return tonumber(B.C.pn_live_tensors()) end
function pn.live_bytes() return tonumber(B.C.pn_live_bytes()) end
function pn.live_nodes() return tonumber(B.C.pn_live_nodes()) end
function pn.num_threads() return B.C.pn_num_threads() end
function pn.set_num_threads(n) B.C.pn_set_num_threads(n) end
function pn.cuda_available() return B.C.pn_cuda_available() ~= 0 end

-- the layers above the tensors (a missing or renamed one is an error, not a silent nil)
for _, name in ipairs({ 'io', 'nn', 'optim', 'data', 'experiment', 'plot' }) do
  pn[name] = require('penumbra.' .. name)
end

return pn
