-- penumbra.benchkit — what every experiments/perf/ script shares: the clock, the median,
-- timed calls, and the printed header that says
-- what machine state the figures were taken in (DESIGN §7).
--
--   bk.now(), bk.median(xs)            (penumbra.stats)
--   bk.list(s, default)                'a,b,3' → { 'a', 'b', 3 } (numbers converted)
--   bk.rss(), bk.reset_peak()          /proc/self/status figures (VmRSS, VmHWM…) in bytes; restart VmHWM
--   bk.python(modules)                 the peers' interpreter: the first of $PENUMBRA_PEER_PYTHON,
--                                      build/venv-peers/bin/python, /usr/bin/python3 that imports
--                                      every module in `modules` ('torch,h5py') → path, what it
--                                      printed (module versions) — or nil, a line saying how to
--                                      install them
--   bk.peer(cmd, name)                a peer process kept for the whole run, driven over its stdin
--                                      with answers on a FIFO (see below) → p with p.hello,
--                                      p:ask(line), p:close()
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

-- /proc/self/status memory figures in bytes: VmRSS, VmHWM (the peak), …; reset_peak() starts
-- a new VmHWM from the current RSS (Linux clear_refs 5), so a phase's own peak can be read
function M.rss()
  local f = io.open('/proc/self/status')
  local r = {}
  for line in f:lines() do
    local name, kb = line:match('^(Vm%u%u%u?%a*):%s+(%d+)')
    if name then r[name] = tonumber(kb) * 1024 end
  end
  f:close()
  return r
end
function M.reset_peak()
  local f = io.open('/proc/self/clear_refs', 'w')
  if f then f:write('5'); f:close() end
end

-- Peers live outside the project: a venv under build/ (PyTorch 2 from PyPI, networkit) or
-- Debian's python3-* packages; the first interpreter that has every module wins, so a run
-- says which one it measured.
function M.python(modules)
  local mods = {}
  for m in tostring(modules):gmatch('[^,%s]+') do mods[#mods + 1] = m end
  local home = os.getenv('PENUMBRA_HOME') or '.'
  local tried = {}
  for _, py in ipairs({ os.getenv('PENUMBRA_PEER_PYTHON') or false, home .. '/build/venv-peers/bin/python',
                        '/usr/bin/python3' }) do
    if py and py ~= '' and io.open(py, 'r') then
      local probe = {}
      for _, m in ipairs(mods) do
        probe[#probe + 1] = string.format("import %s; print('%s', getattr(%s, '__version__', '?'))", m, m, m)
      end
      local p = io.popen(string.format('%s -c "%s" 2>/dev/null', py, table.concat(probe, '; ')))
      local out = p:read('*a'):gsub('%s+$', ''):gsub('\n', ', ')
      p:close()
      if select(2, out:gsub('[^,]+', '')) == #mods and out ~= '' then return py, out end
      tried[#tried + 1] = py
    end
  end
  return nil, string.format('no Python with %s (tried %s): python3 -m venv build/venv-peers && ' ..
    'build/venv-peers/bin/pip install %s', table.concat(mods, ', '), table.concat(tried, ', '),
    table.concat(mods, ' '))
end

-- A peer that must stay alive between rounds (its compiled graphs, its loaded model) reads one
-- command a line on stdin and answers one line a command on a FIFO: io.popen gives only one
-- direction. `cmd` is a shell command line whose '%s' (one) is replaced by the FIFO's quoted path;
-- the peer must open that path for writing first thing and write a first line (p.hello) when it
-- is ready. Its stdout and stderr go to a file beside the FIFO, shown when it fails (this
-- process's stdout stays the benchmark's). p:ask(line) → the reply line (an "error …" line
-- included: the caller decides); it raises, with that file's text, when the peer has died.
-- p:close() sends `quit` and removes the FIFO. `name` names the peer in error messages.
local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
function M.peer(cmd, name)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute('mkdir -p ' .. sh_quote(dir)))
  local fifo, errf = dir .. '/reply', dir .. '/peer.err'
  assert(os.execute('mkfifo ' .. sh_quote(fifo)))
  -- a write to a peer that died must fail (and be reported), not end this process by SIGPIPE
  pcall(ffi.cdef, 'typedef void (*pn_sighandler_t)(int); pn_sighandler_t signal(int, pn_sighandler_t);')
  ffi.C.signal(13, ffi.cast('pn_sighandler_t', 1)) -- SIGPIPE, SIG_IGN
  -- The shell holds a write end of its own from the start and, when the peer exits (for
  -- whatever reason, even before it opened the FIFO), writes a last line there and closes it:
  -- this side's reads never wait for a peer that is gone.
  local proc = io.popen(string.format('( exec 3>%s; %s >%s 2>&1 3>&-; echo "error peer-exited $?" >&3 )',
    sh_quote(fifo), cmd:gsub('%%s', function() return sh_quote(fifo) end, 1), sh_quote(errf)), 'w')
  local reply = assert(io.open(fifo, 'r')) -- returns once the peer (or the shell) has opened its end
  local p = { name = name or 'peer' }
  local function failed(what)
    local f = io.open(errf)
    local err = f and f:read('*a') or ''
    if f then f:close() end
    os.execute('rm -rf ' .. sh_quote(dir))
    error(p.name .. ' failed (' .. what .. ')' .. (err ~= '' and (':\n' .. err) or ''), 0)
  end
  function p.ask(_, line)
    if not (proc:write(line, '\n') and proc:flush()) then failed('its input closed before "' .. line .. '"') end
    local r = reply:read('*l')
    if not r or r:match('^error peer%-exited') then failed('no reply to "' .. line .. '"; ' .. (r or 'EOF')) end
    return r
  end
  function p.close()
    if not proc then return end
    pcall(function() proc:write('quit\n'); proc:flush() end)
    repeat until not reply:read('*l') -- 'bye', then the shell's last line, then EOF
    reply:close()
    proc:close()
    proc = nil
    os.execute('rm -rf ' .. sh_quote(dir))
  end
  p.hello = reply:read('*l')
  if not p.hello or p.hello:match('^error peer%-exited') then failed('it exited at start; ' .. (p.hello or 'EOF')) end
  return p
end

function M.header(title, extra)
  local blas = ffi.load('openblas') -- the library libpenumbra links (already in the process)
  print(string.format('%s   (%s, %s)', title, os.date('!%Y-%m-%d %H:%M UTC'), first_line('uname -n')))
  print(string.format('cpu:%s', first_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")))
  local core = require('penumbra_ffi').openblas_core
  local asked = core.by == 'penumbra' and (core.requested .. ' (set by penumbra from the CPU flags; unset in the environment)')
    or core.requested or '(unset)'
  print(string.format('OPENBLAS_CORETYPE=%s   OpenBLAS core: %s', asked, ffi.string(blas.openblas_get_corename())))
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
