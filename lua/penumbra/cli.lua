-- penumbra.cli — what ./bench runs: `./bench script.lua [key=value ...]`, `./bench test`,
-- `./bench --help`, compare, plot, runs, show, repl, and `./bench -n N script.lua` (penumbra/launch.lua).
local HELP = [[
usage: ./bench <command | script.lua> [args]

  ./bench script.lua [key=value ...]   run a Lua script (experiments/*.lua); key=value
                                       pairs reach it as the global table `args`
  ./bench compare a.lua b.lua … seeds=N [metric=m] [reuse=true] [key=value …]
                                       run experiments over seeds, print and save a
                                       table (runs/compare/<stamp>.md and .h5) of test_m
                                       (default acc, or what the runs monitor: bleu);
                                       reuse=true takes finished runs with the same
                                       settings and seed instead of running them
  ./bench plot <kind> <run files…> [--out f.png|.svg|.pdf] [options]
                                       pictures through gnuplot: curves (metrics over
                                       epochs), radius (learned radii histogram), heatmap
                                       (an attention head), compare (bars, mean ± std);
                                       ./bench plot --help lists the options
  ./bench runs [dir]                   list the run files under dir (default runs/):
                                       experiment, seed, status, best and test score, date
  ./bench show run.h5 …                config, summary and the datasets a run file holds
  ./bench bleu REF [REF2 …] HYP [--chrf]
                                       corpus BLEU of HYP against REF as sacreBLEU prints it
                                       (defaults: 13a, cased); --chrf adds a "chrF2 = …" line
  ./bench repl [run.h5]                interactive LuaJIT with pn loaded (and the run:
                                       run.config, run.metrics, run.model, heatmap(), …)
  ./bench test [spec files or dirs]    run the busted specs (default: spec/); ends with
                                       "N passed, N failed, N skipped"
  ./bench -n N [--oversubscribe] [--host a,b | --hostfile F] script.lua [key=value ...]
                                       N ranks of the script through mpirun (Open MPI);
                                       each asks pn.dist.rank() which one it is
  ./bench --help                       this text

environment: PENUMBRA_DATA (dataset dir, searched first; then datasets/ and ../shared/datasets),
             PENUMBRA_RUNS (where run files go, default runs/), PENUMBRA_BUILD (build dir),
             PENUMBRA_CPU_KERNEL (auto, avx512, avx2, portable: the CPU attention GEMM),
             PN_TRACEBACK=1 (add the Lua traceback to error messages),
             OMP_NUM_THREADS / OPENBLAS_NUM_THREADS (threads)
]]

-- An error a user caused (a bad key, a missing file, a failed run) is printed once, as its
-- message; PN_TRACEBACK=1 adds the Lua traceback (for bugs in a script or in penumbra).
local function report(e)
  if os.getenv('PN_TRACEBACK') then return debug.traceback(tostring(e), 2) end
  -- the message alone: a "file.lua:123: " position says nothing to the user who typed the command
  return require('penumbra_ffi').unplaced(e)
end

local root = os.getenv('PENUMBRA_HOME') or '.'

-- Under `./bench test` every os.tmpname (of the spec process and of the ./bench processes the
-- specs start, which inherit PENUMBRA_TEST_TMP) lives in one private folder, removed when the
-- run ends: what the specs leave in /tmp goes with it, and two test runs at once (CI jobs, two
-- checkouts) never remove each other's files. The name is still made by mkstemp (unique), then
-- moved into the folder.
local function private_tmpnames(dir)
  local original = os.tmpname
  os.tmpname = function()
    local p = original()
    local q = dir .. '/' .. p:match('[^/]+$')
    if os.rename(p, q) then return q end
    return p
  end
end
if os.getenv('PENUMBRA_TEST_TMP') then private_tmpnames(os.getenv('PENUMBRA_TEST_TMP')) end

local function run_tests(paths)
  if #paths == 0 then paths = { root .. '/spec' } end
  local args = { '--output=' .. root .. '/spec/helpers/summary_output.lua', '--pattern=_spec' }
  for _, p in ipairs(paths) do args[#args + 1] = p end
  _G.arg = args
  arg[0] = 'busted'
  -- busted's runner raises a bare error() on failure when not standalone; run it
  -- protected and exit from here, closing the Lua state so finalizers free tensors.
  -- what the specs leave in /tmp (os.tmpname files and the run directories made from them) goes
  -- in this run's private folder (see private_tmpnames), removed afterwards
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'char *mkdtemp(char *template); int setenv(const char *, const char *, int);')
  local template = ffi.new('char[?]', 32, '/tmp/pn-test.XXXXXX')
  local dir = ffi.C.mkdtemp(template) ~= nil and ffi.string(template) or nil
  if dir then
    ffi.C.setenv('PENUMBRA_TEST_TMP', dir, 1)
    private_tmpnames(dir)
  end
  local ok, err = pcall(require 'busted.runner', { standalone = false })
  if dir and dir:match('^/tmp/pn%-test%.[%w]+$') then os.execute("rm -rf '" .. dir .. "'") end
  local r = _G.PN_TEST_RESULT
  if not r then
    io.stderr:write('bench test: the runner stopped before reporting: ' .. tostring(err) .. '\n')
    print('0 passed, 1 failed, 0 skipped')
    os.exit(1, true)
  end
  os.exit(r.failed > 0 and 1 or 0, true)
end

local function run_script(path, rest)
  local f, err = loadfile(path)
  if not f then
    io.stderr:write('bench: cannot load ' .. path .. ': ' .. tostring(err) .. '\n')
    os.exit(1)
  end
  local kv, positional = {}, {}
  for _, a in ipairs(rest) do
    local k, v = a:match('^([%w_%.]+)=(.*)$')
    if k then kv[k] = v else positional[#positional + 1] = a end
  end
  _G.args = kv
  _G.arg = positional
  arg[0] = path
  -- an experiment takes settings only (key=value); a bare word (`epochs` for `epochs=5`) would
  -- otherwise be dropped and the run started with the defaults: pn.experiment refuses it
  require('penumbra.experiment').command_words = positional
  -- a rank `./bench -n N` started joins MPI before the script, so that every rank can be ended
  -- from any one (below) whatever the script does; os.exit with a failure does so too (MPI_Finalize
  -- at exit would otherwise wait for ranks that wait for this one)
  if os.getenv('PENUMBRA_RANKS') then
    local dist = require 'penumbra.dist'
    dist.rank()
    local exit = os.exit
    os.exit = function(code, close)
      if code ~= nil and code ~= true and code ~= 0 and dist.active() then
        dist.abort('the script called os.exit(' .. tostring(code) .. ')', type(code) == 'number' and code or 1)
      end
      return exit(code, close)
    end
  end
  local ok, e = xpcall(f, report)
  if not ok then
    -- one rank failing while the others wait for it in a collective: end them all (the message
    -- goes out with this rank's number); a single process just exits
    local dist = package.loaded['penumbra.dist']
    local ddp = package.loaded['penumbra.ddp']
    if dist and dist.active() and ddp and ddp.failed_together then
      -- the ranks failed together (penumbra/ddp.lua): each says why, then they wait for one
      -- another, so that no rank's MPI_Abort cuts another's message short; '' prints nothing more
      io.stderr:write(string.format('penumbra: rank %d of %d: %s\n', dist.rank(), dist.size(), tostring(e)))
      io.stderr:flush()
      pcall(dist.barrier)
      dist.abort('')
    end
    if dist and dist.active() then dist.abort(tostring(e)) end
    io.stderr:write(tostring(e) .. '\n')
    os.exit(1)
  end
end

local cmd = arg[1]
local rest = {}
for i = 2, #arg do rest[#rest + 1] = arg[i] end

if cmd == nil or cmd == '--help' or cmd == '-h' or cmd == 'help' then
  io.write(HELP)
  os.exit(cmd == nil and 1 or 0)
elseif cmd == 'test' then
  run_tests(rest)
elseif cmd == 'compare' then
  local ok, err = xpcall(function() require('penumbra.compare').main(rest) end, report)
  if not ok then io.stderr:write(tostring(err) .. '\n'); os.exit(1) end
elseif cmd == 'plot' or cmd == 'runs' or cmd == 'show' or cmd == 'repl' then
  -- errors of these commands are the user's (a missing file, an unknown option): print the
  -- message alone; PN_TRACEBACK=1 adds the Lua traceback
  local ok, err = xpcall(function()
    if cmd == 'plot' then require('penumbra.plot').main(rest)
    elseif cmd == 'runs' then require('penumbra.runs').main_runs(rest)
    elseif cmd == 'show' then require('penumbra.runs').main_show(rest)
    else require('penumbra.repl').main(rest) end
  end, report)
  if not ok then io.stderr:write(tostring(err) .. '\n'); os.exit(1) end
elseif cmd == 'bleu' then
  local ok, err = xpcall(function() require('penumbra.text.bleu').main(rest) end, report)
  if not ok then io.stderr:write(tostring(err) .. '\n'); os.exit(1) end
elseif cmd:sub(1, 1) == '-' and require('penumbra.launch').is_launch(cmd) then
  -- ./bench -n N script.lua …: N ranks through mpirun (penumbra/launch.lua); -n 1 runs here
  local launch = require 'penumbra.launch'
  local ok, o, script = pcall(launch.parse, arg)
  if ok and o.n > 1 then ok, o = pcall(launch.exec, o, script) end -- returns only by raising
  if not ok then io.stderr:write(tostring(o) .. '\n'); os.exit(1) end
  run_script(script[1], { unpack(script, 2) })
elseif cmd:match('%.lua$') then
  run_script(cmd, rest)
else
  io.stderr:write("bench: unknown command '" .. cmd .. "'\n" .. HELP)
  os.exit(1)
end
