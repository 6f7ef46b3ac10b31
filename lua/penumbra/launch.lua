-- penumbra.launch — `./bench -n N [--oversubscribe] [--host a,b | --hostfile F] script.lua
-- [key=value …]`: N ranks running the same script, started through Open MPI's mpirun (which
-- this process becomes: its exit status is the job's). `-n 1` and no -n run the script here, as
-- always. Each rank is `luajit lua/penumbra/cli.lua script.lua …` with penumbra's environment
-- (-x), so it joins MPI before the script starts (PENUMBRA_RANKS says it was launched so) and a
-- rank that raises ends every rank (cli.lua: pn.dist.abort).
local M = {}

local APT = 'apt-get update && apt-get install -y openmpi-bin libopenmpi-dev'
local USAGE = './bench -n N [--oversubscribe] [--host a,b | --hostfile F] script.lua [key=value …]'

-- the environment every rank needs; the second list only when set
local ENV = { 'LUA_PATH', 'PENUMBRA_HOME', 'PENUMBRA_BUILD', 'PENUMBRA_RANKS', 'OMP_WAIT_POLICY' }
local ENV_IF_SET = { 'LUA_CPATH', 'PENUMBRA_DATA', 'PENUMBRA_RUNS', 'PENUMBRA_LIB', 'PENUMBRA_TEST_TMP',
  'PENUMBRA_DIST_CHUNK', 'PENUMBRA_DIST_TIMEOUT', 'PN_TRACEBACK', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS',
  'OPENBLAS_CORETYPE' }

local ffi = require 'ffi'
-- one at a time, so that one declared differently elsewhere fails alone
for _, decl in ipairs({ 'int setenv(const char *, const char *, int);', 'unsigned getuid(void);',
  'int access(const char *, int);', 'int execv(const char *, char *const argv[]);', 'char *strerror(int);' }) do
  pcall(ffi.cdef, decl)
end

local OPTIONS = { ['-n'] = true, ['--host'] = true, ['--hostfile'] = true, ['--oversubscribe'] = true }

-- true when argv starts with a launch option (cli.lua hands such a command line over here)
function M.is_launch(a) return OPTIONS[a] == true end

-- argv: the command line after ./bench. Returns {n, host, hostfile, oversubscribe} and the rest
-- (script.lua and its arguments); raises a message for the user on bad input.
function M.parse(argv)
  local o, i = { n = 1 }, 1
  local function value(flag)
    local v = argv[i + 1]
    if v == nil or v:match('^%-') or v:match('%.lua$') then
      error('bench: ' .. flag .. ' needs a value: ' .. USAGE, 0)
    end
    i = i + 2
    return v
  end
  while OPTIONS[argv[i]] do
    local a = argv[i]
    if a == '-n' then
      local v = argv[i + 1]
      local n = tonumber(v)
      if v == nil then error('bench: -n needs the number of ranks: ' .. USAGE, 0) end
      if not n or n ~= math.floor(n) or n < 1 or n >= 2 ^ 31 then
        error('bench: -n ' .. tostring(v or '') .. ': the number of ranks must be a whole number >= 1: ' .. USAGE, 0)
      end
      o.n, i = n, i + 2
    elseif a == '--oversubscribe' then
      o.oversubscribe, i = true, i + 1
    elseif a == '--host' then
      o.host = value(a)
    else
      o.hostfile = value(a)
    end
  end
  local rest = {}
  for j = i, #argv do rest[#rest + 1] = argv[j] end
  if not (rest[1] and rest[1]:match('%.lua$')) then
    error('bench: -n, --host and --hostfile start a script: ' .. USAGE, 0)
  end
  if o.host and o.hostfile then error('bench: give --host or --hostfile, not both', 0) end
  return o, rest
end

-- the first executable called name on PATH (absolute), or nil
local function which(name)
  if name:find('/') then return name end
  for dir in (os.getenv('PATH') or ''):gmatch('[^:]+') do
    local p = dir .. '/' .. name
    if ffi.C.access(p, 1) == 0 then return p end -- X_OK
  end
  return nil
end

-- the cores this process may run on (nproc without the OpenMP variables, which it would honour:
-- OMP_NUM_THREADS=1 ./bench -n 2 … is one thread per rank, not one core)
local function cores()
  local p = io.popen('env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null')
  local n = p and tonumber(p:read('*a'))
  if p then p:close() end
  return n or 1
end

-- Checks what can be checked here, then replaces this process with mpirun (does not return on
-- success; raises a message for the user otherwise).
function M.exec(o, rest)
  local root = os.getenv('PENUMBRA_HOME') or '.'
  local is_root = ffi.C.getuid() == 0
  local mpirun = which('mpirun')
  if not mpirun then
    error('bench: -n ' .. o.n .. ' starts ranks with mpirun (Open MPI), which is not installed; run: ' ..
      (is_root and APT or APT:gsub('apt%-get', 'sudo apt-get')), 0)
  end
  local B = require 'penumbra_ffi'
  if B.C.pn_dist_built() == 0 then
    error('bench: libpenumbra in ' .. B.build .. ' was built without MPI; run: ' .. APT ..
      ', then remove ' .. B.build .. ' so that ./bench builds it again', 0)
  end
  if not (o.host or o.hostfile or o.oversubscribe) then
    local n = cores()
    if o.n > n then
      error(string.format('bench: -n %d asks for more ranks than this machine has cores (%d: the slots mpirun ' ..
        'gives by default); add --oversubscribe to run them anyway (they share the cores, each slower), or ' ..
        'spread them over machines with --host a,b or --hostfile F', o.n, n), 0)
    end
  end
  if is_root then -- mpirun refuses root unless told (CI runs as root)
    ffi.C.setenv('OMPI_ALLOW_RUN_AS_ROOT', '1', 1)
    ffi.C.setenv('OMPI_ALLOW_RUN_AS_ROOT_CONFIRM', '1', 1)
  end
  ffi.C.setenv('PENUMBRA_RANKS', tostring(o.n), 1)

  local cmd = { mpirun, '-np', tostring(o.n) }
  if o.oversubscribe then cmd[#cmd + 1] = '--oversubscribe' end
  if o.host then cmd[#cmd + 1] = '--host'; cmd[#cmd + 1] = o.host end
  if o.hostfile then cmd[#cmd + 1] = '--hostfile'; cmd[#cmd + 1] = o.hostfile end
  for _, k in ipairs(ENV) do cmd[#cmd + 1] = '-x'; cmd[#cmd + 1] = k end
  for _, k in ipairs(ENV_IF_SET) do
    if os.getenv(k) then cmd[#cmd + 1] = '-x'; cmd[#cmd + 1] = k end
  end
  cmd[#cmd + 1] = which(arg and arg[-1] or 'luajit') or 'luajit'
  cmd[#cmd + 1] = root .. '/lua/penumbra/cli.lua'
  for _, a in ipairs(rest) do cmd[#cmd + 1] = a end

  local argv = ffi.new('char *[?]', #cmd + 1)
  local keep = {}
  for i, a in ipairs(cmd) do
    keep[i] = ffi.new('char[?]', #a + 1, a)
    argv[i - 1] = keep[i]
  end
  argv[#cmd] = nil
  io.stdout:flush()
  io.stderr:flush()
  ffi.C.execv(mpirun, argv)
  error('bench: cannot start ' .. mpirun .. ': ' .. ffi.string(ffi.C.strerror(ffi.errno())), 0)
end

M.usage = USAGE
return M
