-- pn.dist and `./bench -n N` (core/dist/, lua/penumbra/dist.lua, lua/penumbra/launch.lua).
-- The collectives run for real in 2 ranks (`./bench -n 2 --oversubscribe`, mpirun underneath)
-- on every dtype with values that differ by rank; each rank prints what it got and the spec
-- compares with the results worked out by hand below (a rank that printed nothing, or did not
-- print its end marker, fails). Also: the piecewise path (PENUMBRA_DIST_CHUNK small), errors that
-- every rank gives alike, a rank that raises ending both, a collective that gives up (a rank that
-- never joins: the timeout; a rank killed: seen gone) with a named error instead of hanging, the
-- launcher's bad input, and the single process (rank 0 of 1, no MPI; the timeout's setting). The
-- mpirun specs are pending where Open MPI is missing.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local sh = check.sh

local mpi = require 'spec.helpers.mpi'
local ROOT, MPI, it_mpi = mpi.ROOT, mpi.MPI, mpi.it_mpi

local write = mpi.write_script

-- `./bench <launch> script`, bounded by timeout 60: output and status (124: it hung)
local function bench(launch, script, env)
  return sh(string.format("cd '%s' && %s timeout 60 ./bench %s '%s'", ROOT, env or '', launch, script))
end

-- "R<rank> <case> <values or message>" lines → out[rank][case] = text
local function parse(out)
  local r = { [0] = {}, [1] = {} }
  for rank, case, rest in out:gmatch('R(%d) (%S+) ([^\n]*)') do r[tonumber(rank)][case] = rest end
  return r
end

local function numbers(text)
  local t = {}
  for w in (text or ''):gmatch('[^,]+') do
    t[#t + 1] = (w == 'nan' or w == '-nan') and 0 / 0 or tonumber(w)
  end
  return t
end

-- Each rank's (2, 3) input per dtype, and what the collectives must give — worked out by hand.
local IN = {
  f32 = { [0] = { 0.5, -1.25, 3, 1000, -2, 7 }, [1] = { 1.5, 2.75, -3, 1000, -8, 7 } },
  i32 = { [0] = { 3, -1, 4, -100000, 5, 9 }, [1] = { -2, 7, 1, 8, 2, -9 } },
  u8 = { [0] = { 3, 1, 4, 1, 255, 9 }, [1] = { 2, 7, 1, 8, 0, 8 } },
}
IN.f64 = IN.f32
IN.i64 = { [0] = { 3, -1, 4, 2 ^ 40, 5, 9 }, [1] = { -2, 7, 1, 8, 2, -9 } }
local WANT = {
  f32 = { sum = { 2, 1.5, 0, 2000, -10, 14 }, mean = { 1, 0.75, 0, 1000, -5, 7 },
          max = { 1.5, 2.75, 3, 1000, -2, 7 }, min = { 0.5, -1.25, -3, 1000, -8, 7 } },
  i32 = { sum = { 1, 6, 5, -99992, 7, 0 }, max = { 3, 7, 4, 8, 5, 9 }, min = { -2, -1, 1, -100000, 2, -9 } },
  i64 = { sum = { 1, 6, 5, 2 ^ 40 + 8, 7, 0 }, max = { 3, 7, 4, 2 ^ 40, 5, 9 }, min = { -2, -1, 1, 8, 2, -9 } },
  u8 = { sum = { 5, 8, 5, 9, 255, 17 }, max = { 3, 7, 4, 8, 255, 9 }, min = { 2, 1, 1, 1, 0, 8 } },
}
WANT.f64 = WANT.f32
local DTYPES = { 'f32', 'f64', 'i32', 'i64', 'u8' }

local function lua_list(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = string.format('%.17g', v) end
  return '{' .. table.concat(s, ',') .. '}'
end

-- the child: every collective on every dtype, results printed one line each; dev: the tensors'
-- device ('cuda': through NCCL — in the interpreter build its subset over MPI)
local function collectives_script(dev)
  local input = {}
  for _, dt in ipairs(DTYPES) do
    input[#input + 1] = string.format('%s = { [0] = %s, [1] = %s }', dt, lua_list(IN[dt][0]), lua_list(IN[dt][1]))
  end
  return "local DEV = '" .. dev .. "'\n" .. [[
local pn = require 'penumbra'
local d = pn.dist
local r = d.rank()
assert(d.size() == 2 and d.is_distributed(), 'expected 2 ranks')
local IN = { ]] .. table.concat(input, ', ') .. [[ }
local function show(case, t)
  local v = t:contiguous():view(-1):totable()
  for i = 1, #v do v[i] = string.format('%.17g', v[i]) end
  io.write('R', r, ' ', case, ' ', table.concat(v, ','), '\n')
end
local function shown_error(case, fn)
  local ok, e = pcall(fn)
  io.write('R', r, ' ', case, ' ', ok and 'NO ERROR' or tostring(e):gsub('\n', ' '), '\n')
end
local function input(dt) return pn.tensor(IN[dt][r], { dtype = dt }):view(2, 3):to(DEV) end
for _, dt in ipairs({ 'f32', 'f64', 'i32', 'i64', 'u8' }) do
  for _, op in ipairs({ 'sum', 'mean', 'max', 'min' }) do
    if op == 'mean' and (dt == 'i32' or dt == 'i64' or dt == 'u8') then
      shown_error('mean_' .. dt, function() d.all_reduce(input(dt), 'mean') end)
    else
      local t = input(dt)
      assert(d.all_reduce(t, op) == t)
      show(op .. '_' .. dt, t)
    end
  end
  -- a transposed (strided) view: reduced in place through its storage
  local base = pn.tensor(IN[dt][r], { dtype = dt }):view(2, 3):t():contiguous():to(DEV)
  d.all_reduce(base:t(), 'sum')
  show('strided_' .. dt, base:t())
  for root = 0, 1 do
    local t = input(dt)
    d.broadcast(t, root)
    show('bcast' .. root .. '_' .. dt, t)
  end
  local g = d.all_gather(input(dt))
  io.write('R', r, ' gshape_', dt, ' ', table.concat(g:shape(), 'x'), '\n')
  show('gather_' .. dt, g)
end
-- NaN on one rank wins max and min on every rank
for _, dt in ipairs({ 'f32', 'f64' }) do
  for _, op in ipairs({ 'max', 'min' }) do
    local t = pn.tensor(r == 1 and { 0 / 0, 1 } or { 5, 0 / 0 }, { dtype = dt }):to(DEV)
    show('nan' .. op .. '_' .. dt, d.all_reduce(t, op))
  end
end
-- a 0-dim tensor and a barrier
local s = pn.tensor(r + 1, { dtype = 'f64' }):to(DEV)
show('scalar', d.all_reduce(s, 'sum'))
d.barrier()
-- errors every rank gives alike (never a hang)
shown_error('mismatch', function() d.all_gather(pn.zeros(r == 1 and 3 or 2):to(DEV)) end)
shown_error('mismatch_dtype', function() d.all_reduce(pn.zeros(2, { dtype = r == 1 and 'f64' or 'f32' }):to(DEV)) end)
shown_error('root', function() d.broadcast(pn.zeros(2):to(DEV), 2) end)
shown_error('rootdiff', function() d.broadcast(pn.zeros(2):to(DEV), r) end)
shown_error('mismatch_device', function() d.all_reduce(r == 1 and pn.zeros(2) or pn.zeros(2):to(DEV)) end)
io.write('R', r, ' where ', d.all_gather(pn.zeros(1):to(DEV)):device(), '\n')
io.write('R', r, ' done ok\n')
]]
end

describe('pn.dist on 2 ranks (mpirun)', function()
  local function check_collectives(out, code, what, dev)
    dev = dev or 'cpu'
    assert.equal(0, code, what .. ': exit status\n' .. out)
    local got = parse(out)
    for r = 0, 1 do
      assert.equal('ok', got[r].done, what .. ': rank ' .. r .. ' did not finish\n' .. out)
      for _, dt in ipairs(DTYPES) do
        for op, want in pairs(WANT[dt]) do
          check.assert_close(numbers(got[r][op .. '_' .. dt]), want, 0, string.format('%s: rank %d %s %s', what, r, op, dt))
        end
        check.assert_close(numbers(got[r]['strided_' .. dt]), WANT[dt].sum, 0, what .. ': strided sum ' .. dt)
        if dt == 'i32' or dt == 'i64' or dt == 'u8' then
          assert.matches('mean needs f32 or f64', got[r]['mean_' .. dt] or '', 1, true)
        end
        check.assert_close(numbers(got[r]['bcast0_' .. dt]), IN[dt][0], 0, what .. ': broadcast from 0 ' .. dt)
        check.assert_close(numbers(got[r]['bcast1_' .. dt]), IN[dt][1], 0, what .. ': broadcast from 1 ' .. dt)
        assert.equal('2x2x3', got[r]['gshape_' .. dt])
        local both = {}
        for _, v in ipairs(IN[dt][0]) do both[#both + 1] = v end
        for _, v in ipairs(IN[dt][1]) do both[#both + 1] = v end
        check.assert_close(numbers(got[r]['gather_' .. dt]), both, 0, what .. ': all_gather ' .. dt)
      end
      for _, dt in ipairs({ 'f32', 'f64' }) do
        check.assert_close(numbers(got[r]['nanmax_' .. dt]), { 0 / 0, 0 / 0 }, 0, 'NaN max ' .. dt)
        check.assert_close(numbers(got[r]['nanmin_' .. dt]), { 0 / 0, 0 / 0 }, 0, 'NaN min ' .. dt)
      end
      check.assert_close(numbers(got[r].scalar), { 3 }, 0, 'scalar sum')
      assert.matches('rank 1 passed t [3] f32 but rank 0 passed [2] f32', got[r].mismatch or '', 1, true)
      assert.matches('rank 1 passed t [2] f64 but rank 0 passed [2] f32', got[r].mismatch_dtype or '', 1, true)
      assert.matches('root 2 is out of range for 2 ranks (ranks count from 0: 0 … 1)', got[r].root or '', 1, true)
      assert.matches('rank 1 passed root 1 but rank 0 passed 0', got[r].rootdiff or '', 1, true)
      assert.equal(dev, got[r].where, what .. ': all_gather keeps the device')
      if dev == 'cuda' then
        assert.matches('rank 1 passed a cpu tensor but rank 0 a cuda one', got[r].mismatch_device or '', 1, true)
      end
    end
  end

  local script, cuda_script
  setup(function()
    if MPI then
      script = write(collectives_script('cpu'))
      cuda_script = write(collectives_script('cuda'))
    end
  end)

  it_mpi('all_reduce (sum, mean, max, min), broadcast and all_gather give the hand-worked results on every dtype', function()
    local out, code = bench('-n 2 --oversubscribe', script)
    check_collectives(out, code, 'one call each')
  end)

  it_mpi('gives the same results when every buffer goes to MPI in pieces (PENUMBRA_DIST_CHUNK=4)', function()
    local out, code = bench('-n 2 --oversubscribe', script, 'PENUMBRA_DIST_CHUNK=4')
    check_collectives(out, code, 'in pieces')
  end)

  -- cuda tensors go through NCCL (core/dist/nccl.cu): on a GPU for real, in the interpreter
  -- build on its NCCL subset over MPI (emu/nccl.h), which CI runs
  local it_nccl = (MPI and pn.cuda.available() and pn.dist.nccl_built()) and it_mpi or function(name)
    pending(name .. ' — needs CUDA (a GPU or the interpreter build) and NCCL')
  end
  it_nccl('on cuda tensors (NCCL): the same hand-worked results on every dtype, NaN kept, a cpu/cuda mix named', function()
    local out, code = bench('-n 2 --oversubscribe', cuda_script)
    check_collectives(out, code, 'cuda tensors', 'cuda')
  end)

  it_mpi('a rank that raises ends every rank promptly, nonzero, with the message naming the rank', function()
    local s = write([[
local pn = require 'penumbra'
local d = pn.dist
if d.rank() == 1 then error('boom from rank one') end
d.all_reduce(pn.ones(4))   -- rank 0 waits here for a rank that never comes
print('R0 finished (should not happen)')
]])
    local t0 = os.time()
    local out, code = bench('-n 2 --oversubscribe', s)
    assert.are_not.equal(0, code, out)
    assert.are_not.equal(124, code, 'the ranks hung until timeout killed them\n' .. out)
    assert.truthy(os.time() - t0 < 50)
    assert.matches('rank 1 of 2: boom from rank one', out, 1, true)
    assert.is_nil(out:find('should not happen', 1, true), out)
  end)

  it_mpi('a rank that calls os.exit(3) ends every rank with status 3 (not a hang in MPI_Finalize)', function()
    local s = write([[
local pn = require 'penumbra'
if pn.dist.rank() == 1 then os.exit(3) end
pn.dist.all_reduce(pn.ones(4))
print('R0 finished (should not happen)')
]])
    local out, code = bench('-n 2 --oversubscribe', s)
    assert.equal(3, code, out)
    assert.matches('rank 1 of 2: the script called os.exit(3)', out, 1, true)
    assert.is_nil(out:find('should not happen', 1, true), out)
  end)

  it_mpi('a collective that a rank never joins gives up after the timeout with a named error, not a hang; ' ..
    'later collectives refuse at once', function()
    -- rank 1 sleeps instead of joining; rank 0 reports what it got and ends normally (mpirun then
    -- ends rank 1: a rank that gave up skips MPI_Finalize, which would wait for it)
    local s = write([[
local pn = require 'penumbra'
local ffi = require 'ffi'
pcall(ffi.cdef, 'unsigned int sleep(unsigned int seconds);')
local d = pn.dist
io.write('R', d.rank(), ' default ', d.timeout(), '\n')
if d.rank() == 1 then ffi.C.sleep(60) os.exit(0) end
io.write('R0 previous ', d.set_timeout(1.5), '\n')
local t0 = os.time()
local ok, e = pcall(d.all_reduce, pn.ones(2, 3), 'sum')
io.write('R0 first ', tostring(ok), ' ', tostring(e), '\n')
io.write('R0 failure ', tostring(d.failure()), '\n')
io.write('R0 waited ', os.time() - t0, '\n')
local ok2, e2 = pcall(d.barrier)
io.write('R0 second ', tostring(ok2), ' ', tostring(e2), '\n')
io.write('R0 done ok\n')
io.stdout:flush()
]])
    local t0 = os.time()
    local out, code = bench('-n 2 --oversubscribe', s, 'PENUMBRA_DIST_TIMEOUT=250')
    assert.are_not.equal(124, code, 'hung until timeout\n' .. out)
    assert.truthy(os.time() - t0 < 40, 'rank 1 (asleep for 60 s) was waited for\n' .. out)
    local got = parse(out)
    assert.equal('250', got[0].default, 'PENUMBRA_DIST_TIMEOUT reaches the ranks\n' .. out)
    assert.equal('250', got[0].previous, out)
    assert.matches('^false dist.all_reduce %(24 bytes%): no reply from the other ranks in 1.5 s', got[0].first or '', 1)
    assert.equal('timeout', got[0].failure)
    local waited = tonumber(got[0].waited)
    assert.truthy(waited >= 1 and waited <= 5, 'waited ' .. tostring(waited))
    assert.matches('false dist.barrier: the ranks can no longer exchange data in this process: an earlier collective ' ..
      'gave up (dist.all_reduce (24 bytes): no reply', got[0].second or '', 1, true)
    assert.equal('ok', got[0].done, out)
  end)

  it_mpi('a rank killed (SIGKILL) while the other waits in a collective: the wait ends at once, naming it', function()
    local s = write([[
local pn = require 'penumbra'
local d = pn.dist
local r = d.rank()
d.barrier()
if r == 1 then os.execute('kill -9 $PPID') end -- $PPID: this rank (the shell's parent)
local ok, e = pcall(d.broadcast, pn.zeros(5, { dtype = 'f64' }), 1)
local why, lost = d.failure()
io.write('R0 first ', tostring(ok), ' ', tostring(e), '\n')
io.write('R0 failure ', tostring(why), ' ', tostring(lost), '\n')
io.write('R0 done ok\n')
io.stdout:flush()
]])
    -- without a handler for SIGTERM, the survivor would die of mpirun's SIGTERM 1 s after the death;
    -- it reports long before that
    local t0 = os.time()
    local out, code = bench('-n 2 --oversubscribe', s)
    assert.are_not.equal(124, code, 'hung until timeout\n' .. out)
    assert.truthy(os.time() - t0 < 30, out)
    local got = parse(out)
    assert.matches('^false dist.broadcast %(40 bytes%): rank 1 of 2 %(pid %d+, on this machine%) is gone', got[0].first or '')
    assert.equal('rank gone 1', got[0].failure)
    assert.equal('ok', got[0].done, out)
  end)

  it_mpi('-n 1 runs the script in this process, rank 0 of 1, without mpirun', function()
    local s = write("local d = require('penumbra').dist\nprint('R0 ranks ' .. d.size() .. ' ' .. tostring(os.getenv('OMPI_COMM_WORLD_SIZE')))\n")
    local out, code = bench('-n 1', s)
    assert.equal(0, code, out)
    assert.matches('R0 ranks 1 nil', out, 1, true)
  end)

  it_mpi('refuses more ranks than cores without --oversubscribe, and says why', function()
    local cores = tonumber((sh('nproc')))
    local out, code = bench('-n ' .. (cores + 1), write('print(1)'))
    assert.equal(1, code, out)
    assert.matches('asks for more ranks than this machine has cores (' .. cores .. ':', out, 1, true)
    assert.matches('add --oversubscribe', out, 1, true)
  end)
end)

describe('./bench -n: bad input', function()
  it('-n 0, -n abc, -n without a script: a message with the usage', function()
    for _, launch in ipairs({ '-n 0', '-n abc', '-n -2', '-n 1.5' }) do
      local out, code = bench(launch, 'x.lua')
      assert.equal(1, code, out)
      assert.matches('the number of ranks must be a whole number >= 1', out, 1, true)
      assert.matches('./bench -n N', out, 1, true)
    end
    local out, code = sh(string.format("cd '%s' && ./bench -n 2 test", ROOT))
    assert.equal(1, code, out)
    assert.matches('start a script', out, 1, true)
  end)

  it('mpirun missing: the apt-get line to run', function()
    local luajit = (sh('command -v luajit')):match('%S+')
    -- cli.lua straight from luajit (./bench needs its tools on PATH), with a PATH lacking mpirun
    local out, code = sh(string.format("cd '%s' && PATH=/nonexistent '%s' lua/penumbra/cli.lua -n 2 x.lua", ROOT, luajit))
    assert.equal(1, code, out)
    assert.matches('mpirun (Open MPI), which is not installed', out, 1, true)
    assert.matches('apt-get install -y openmpi-bin libopenmpi-dev', out, 1, true)
  end)
end)

describe('pn.dist in a single process', function()
  local d = pn.dist
  it('is rank 0 of 1: all_reduce and broadcast leave t as it is, all_gather stacks the one t', function()
    assert.equal(0, d.rank())
    assert.equal(1, d.size())
    assert.is_false(d.is_distributed())
    for _, dt in ipairs(DTYPES) do
      for _, op in ipairs({ 'sum', 'max', 'min' }) do
        local t = pn.tensor(IN[dt][1], { dtype = dt })
        check.assert_close(d.all_reduce(t, op), IN[dt][1], 0, op .. ' ' .. dt)
      end
      local t = pn.tensor(IN[dt][0], { dtype = dt })
      check.assert_close(d.broadcast(t, 0), IN[dt][0], 0, 'broadcast ' .. dt)
      local g = d.all_gather(t:view(2, 3))
      assert.same({ 1, 2, 3 }, g:shape())
      check.assert_close(g, IN[dt][0], 0, 'all_gather ' .. dt)
    end
    check.assert_close(d.all_reduce(pn.tensor({ 1.5, -2 }), 'mean'), { 1.5, -2 }, 0, 'mean')
    d.barrier()
  end)

  it('waits in a collective at most timeout() seconds: 300 by default, PENUMBRA_DIST_TIMEOUT, set_timeout', function()
    if not os.getenv('PENUMBRA_DIST_TIMEOUT') then assert.equal(300, d.timeout()) end
    local before = d.timeout()
    assert.equal(before, d.set_timeout(12.5))
    assert.equal(12.5, d.timeout())
    assert.equal(12.5, d.set_timeout(0)) -- 0: forever
    assert.equal(0, d.timeout())
    d.set_timeout(before)
    assert.is_nil(d.failure())
    check.assert_error_matching(function() d.set_timeout(-1) end, 'dist.set_timeout: seconds must be a finite number >= 0')
    check.assert_error_matching(function() d.set_timeout(1 / 0) end, 'dist.set_timeout', 'finite')
    check.assert_error_matching(function() d.set_timeout('5') end, 'dist.set_timeout: seconds must be a number')
    assert.equal(before, d.timeout())
    -- the environment, read at the first call; a wrong value is an error naming the variable
    local s = write("local d = require('penumbra').dist\nprint('T ' .. d.timeout())\n")
    local out, code = bench('', s, 'PENUMBRA_DIST_TIMEOUT=7.5')
    assert.equal(0, code, out)
    assert.matches('T 7.5', out, 1, true)
    out, code = bench('', s, 'PENUMBRA_DIST_TIMEOUT=soon')
    assert.are_not.equal(0, code, out)
    assert.matches("PENUMBRA_DIST_TIMEOUT='soon' is not a number of seconds >= 0", out, 1, true)
  end)

  it('errors name the function and the argument', function()
    local t = pn.zeros(2)
    check.assert_error_matching(function() d.all_reduce(5) end, 'dist.all_reduce', 'argument t must be a tensor')
    check.assert_error_matching(function() d.all_reduce(t, 'avg') end, "unknown op 'avg'", 'sum, mean, max, min')
    check.assert_error_matching(function() d.all_reduce(pn.zeros(2, { dtype = 'i32' }), 'mean') end,
      'dist.all_reduce: mean of a i32 tensor', 'mean needs f32 or f64')
    check.assert_error_matching(function() d.broadcast(t, 1) end,
      'dist.broadcast: root 1 is out of range for 1 rank', 'count from 0')
    check.assert_error_matching(function() d.broadcast(t, -1) end, 'root -1 is out of range')
    check.assert_error_matching(function() d.broadcast(t, 0.5) end, 'dist.broadcast: root must be a whole number')
    check.assert_error_matching(function() d.all_gather('x') end, 'dist.all_gather: argument t must be a tensor')
    check.assert_error_matching(function() d.all_gather(pn.zeros({ 1, 1, 1, 1, 1, 1, 1, 1 })) end,
      'dist.all_gather', 'has 8 dims')
    check.assert_error_matching(function() d.abort('stop here') end, 'stop here')
    check.assert_error_matching(function() d.abort('x', 0) end, 'dist.abort: code must be a whole number in 1 … 255')
  end)

  local it_cuda = pn.cuda.available() and it or pending
  it_cuda('device tensors: left as they are (all_gather: (1, …) on the device) with NCCL, refused by name without', function()
    local t = pn.tensor({ 1, 2, 3 }):to('cuda')
    if d.nccl_built() then
      assert.same({ 1, 2, 3 }, d.all_reduce(t, 'mean'):totable())
      assert.same({ 1, 2, 3 }, d.broadcast(t, 0):totable())
      local g = d.all_gather(t)
      assert.equal('cuda', g:device())
      assert.same({ { 1, 2, 3 } }, g:totable())
    else
      check.assert_error_matching(function() d.all_reduce(t) end, 'dist.all_reduce', 'cuda tensor', 'NCCL')
      check.assert_error_matching(function() d.broadcast(t) end, 'dist.broadcast', 'NCCL')
      check.assert_error_matching(function() d.all_gather(t) end, 'dist.all_gather', 'NCCL')
    end
  end)
end)
