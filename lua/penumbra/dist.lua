-- penumbra.dist — several processes (ranks) on one job over MPI (core/dist/; README "Several
-- processes (MPI)"). `./bench -n N script.lua` starts N ranks running the same script; each asks
-- pn.dist.rank() which one it is (0 … size()−1: ranks count from 0, as everywhere in MPI) and,
-- usually, only rank 0 prints. A script started any other way is rank 0 of 1: the collectives
-- leave tensors as they are and MPI is never touched.
--
-- Collectives are called by every rank, in the same order, with tensors of the same shape and
-- dtype (and the same op or root): a mismatch is an error on every rank naming the rank at
-- fault. CPU tensors go through MPI, cuda tensors through NCCL (in the interpreter build: its
-- NCCL subset over MPI), every rank passing the same kind; all_reduce works in
-- place, so one flat tensor holding many parameters goes in one call. No wait is endless: a
-- collective raises a named error when a rank on this machine is gone, after a stop signal, after
-- timeout() seconds or on an MPI error (core/dist/mpi.c), and the ranks cannot exchange after that.
local B = require 'penumbra_ffi'
local C = B.C

local M = {}

local OPS = { sum = C.PN_SUM, mean = C.PN_MEAN, max = C.PN_MAX, min = C.PN_MIN }

-- A collective's failure (a rank gone, a timeout, a stop signal, ranks that disagree) is the
-- job's, not the calling line's: its message goes without a position (ddp.lua reads it as is)
local function collective(status)
  if status ~= 0 then error(B.last_error(), 0) end
end

local function init()
  collective(C.pn_dist_init())
end

local function tensor_arg(fn, t)
  if not B.is_tensor(t) then error('dist.' .. fn .. ': argument t must be a tensor, got ' .. type(t), 3) end
end

function M.rank()
  init()
  return C.pn_dist_rank()
end

function M.size()
  init()
  return C.pn_dist_size()
end

-- true when this process runs with other ranks (size() > 1)
function M.is_distributed()
  init()
  return C.pn_dist_size() > 1
end

-- true when this libpenumbra was built with MPI
function M.built() return C.pn_dist_built() ~= 0 end
-- true when it also has the NCCL engine (cuda tensors in the collectives)
function M.nccl_built() return C.pn_dist_nccl_built() ~= 0 end

function M.barrier()
  collective(C.pn_dist_barrier())
end

-- t (in place) becomes the elementwise op over every rank's t: 'sum' (default), 'mean' (f32/f64),
-- 'max', 'min' (NaN wins); returns t
function M.all_reduce(t, op)
  tensor_arg('all_reduce', t)
  op = op == nil and 'sum' or op
  local code = OPS[op]
  if code == nil then
    error("dist.all_reduce: unknown op '" .. tostring(op) .. "' (sum, mean, max, min)", 2)
  end
  collective(C.pn_dist_all_reduce(t, code))
  return t
end

-- t (in place) becomes rank root's t on every rank (root 0 by default); returns t
function M.broadcast(t, root)
  tensor_arg('broadcast', t)
  root = root == nil and 0 or root
  if type(root) ~= 'number' or root ~= math.floor(root) or root < -2 ^ 31 or root >= 2 ^ 31 then
    error('dist.broadcast: root must be a whole number (a rank, counted from 0), got ' .. tostring(root), 2)
  end
  collective(C.pn_dist_broadcast(t, root))
  return t
end

-- a new tensor (size(), …t's shape): row r holds rank r's t (row r + 1 in Lua's count)
function M.all_gather(t)
  tensor_arg('all_gather', t)
  return B.wrap(C.pn_dist_all_gather(t))
end

-- Ends every rank now with msg (printed with this rank's number; '' prints nothing: the caller
-- said why) and exit status code (1 by default): what a rank does when it cannot go on while the
-- others wait for it. In a single process it raises msg.
function M.abort(msg, code)
  msg = msg == nil and 'aborted' or tostring(msg)
  if code ~= nil and (type(code) ~= 'number' or code ~= math.floor(code) or code < 1 or code > 255) then
    error('dist.abort: code must be a whole number in 1 … 255, got ' .. tostring(code), 2)
  end
  if C.pn_dist_active() ~= 0 then C.pn_dist_abort(msg, code or 1) end
  error(msg, 2)
end

-- (for the launcher) true when this process joined MPI with other ranks; never starts MPI
function M.active() return C.pn_dist_active() ~= 0 end

-- How long a rank waits in a collective for the others before it raises "dist.<op>: no reply from
-- the other ranks in S s …": seconds (0 = forever; default 300, or PENUMBRA_DIST_TIMEOUT).
-- set_timeout returns the previous value. A wait also ends with an error when a rank on this
-- machine is gone, when a stop signal (SIGINT/SIGTERM/SIGHUP, under the runner) arrived and the
-- collective has not completed 0.25 s later, or when MPI fails; after that the ranks cannot
-- exchange any more (every later collective raises at once) and failure() says why.
function M.timeout()
  init()
  return C.pn_dist_timeout()
end

function M.set_timeout(seconds)
  if type(seconds) ~= 'number' then
    error('dist.set_timeout: seconds must be a number (0: wait forever), got ' .. type(seconds), 2)
  end
  init()
  local old = C.pn_dist_timeout()
  B.check(C.pn_dist_set_timeout(seconds))
  return old
end

local FAILURES = { [C.PN_DIST_SIGNAL] = 'signal', [C.PN_DIST_TIMEOUT] = 'timeout',
  [C.PN_DIST_PEER_GONE] = 'rank gone', [C.PN_DIST_MPI_ERROR] = 'mpi error' }

-- nil while the ranks can exchange; after a collective gave up: 'signal', 'timeout', 'rank gone'
-- (and the rank found gone, counted from 0) or 'mpi error'
function M.failure()
  local f = FAILURES[tonumber(C.pn_dist_failure())]
  if f == 'rank gone' then return f, tonumber(C.pn_dist_lost_rank()) end
  return f
end

return M
