-- Resuming a stopped run (lua/penumbra/resume.lua, the runner's resume=…): the pieces (the
-- tensor RNG's position, the optimisers' state), then whole runs stopped by a signal at a step's
-- end and by an error inside a step, resumed, against the same run uninterrupted — the same
-- metrics bit for bit, one row per step — and every refusal by name.
local pn = require 'penumbra'
local ffi = require 'ffi'
local toy = dofile((os.getenv('PENUMBRA_HOME') or '.') .. '/spec/fixtures/resume_toy.lua')

local runs = os.tmpname()
os.remove(runs)
pcall(ffi.cdef, 'int setenv(const char *, const char *, int);')
ffi.C.setenv('PENUMBRA_RUNS', runs, 1)

local function metric(path, name) return pn.io.load(path, 'metrics/' .. name):totable() end
local function exists(path)
  local f = io.open(path, 'r')
  if f then f:close() end
  return f ~= nil
end

-- runs the toy stopped as `stop` says; returns the run file its error names
local function stopped(stop, overrides)
  _G.RESUME_TOY_STOP = stop
  local o = { _quiet = true }
  for k, v in pairs(overrides or {}) do o[k] = v end
  local ok, e = pcall(toy, o)
  _G.RESUME_TOY_STOP = nil
  assert.is_false(ok, 'the toy run was meant to stop')
  local path = tostring(e):match('resume=(%S+)$')
  assert.truthy(path, 'the error names no resume=: ' .. tostring(e))
  return path, tostring(e)
end

describe('resume', function()
  local every
  setup(function() every = pn.experiment.RESUME_EVERY_S end)
  teardown(function() pn.experiment.RESUME_EVERY_S = every end)
  before_each(function() pn.experiment.RESUME_EVERY_S = 0 end)

  it('sets the tensor RNG back to where it was', function()
    pn.manual_seed(5)
    pn.rand({ 7 })
    local st = pn.rng_state()
    local a = pn.rand({ 9 }):totable()
    pn.randn({ 3 })
    pn.set_rng_state(st)
    assert.same(a, pn.rand({ 9 }):totable())
    assert.equal('5', st[1])
    local ok, e = pcall(pn.set_rng_state, { '5', '-1' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('offset %(2%) must be a string of decimal digits'))
    ok, e = pcall(pn.set_rng_state, { '99999999999999999999', '0' })
    assert.truthy(tostring(e):find('past 2^64', 1, true))
  end)

  for _, kind in ipairs({ 'SGD', 'Adam', 'AdamW' }) do
    it('gives ' .. kind .. ' its state back: the next steps equal the uninterrupted ones', function()
      local function make()
        pn.manual_seed(1)
        local m = pn.nn.Linear(4, 3)
        local o = kind == 'SGD' and { lr = 0.1, momentum = 0.9 } or { lr = 0.05 }
        return m, pn.optim[kind](m, o)
      end
      local function step(m, opt, i)
        opt:zero_grad()
        m(pn.full({ 2, 4 }, 0.1 * i)):pow(2):sum():backward()
        opt:step()
      end
      local m1, o1 = make()
      for i = 1, 3 do step(m1, o1, i) end
      local sd, params = o1:state_dict(), m1:state_dict()
      for i = 4, 6 do step(m1, o1, i) end
      local m2, o2 = make()
      m2:load_state_dict(params)
      o2:load_state_dict(sd)
      for i = 4, 6 do step(m2, o2, i) end
      assert.same(m1.weight:totable(), m2.weight:totable())
      assert.same(m1.bias:totable(), m2.bias:totable())
      assert.equal(6, o2.steps)
      -- a state of another kind, or of other parameters, is refused by name
      local other = kind == 'SGD' and pn.optim.Adam(pn.nn.Linear(4, 3), { lr = 1 }) or pn.optim.SGD(pn.nn.Linear(4, 3), { lr = 1 })
      local ok, e = pcall(other.load_state_dict, other, sd)
      assert.is_false(ok)
      assert.truthy(tostring(e):find('the state is of a ' .. kind .. ' optimiser'), e)
      local small = pn.optim[kind](pn.nn.Linear(4, 2), { lr = 1 })
      ok, e = pcall(small.load_state_dict, small, sd)
      assert.truthy(tostring(e):find('of parameter 1 has shape %[3x4%], the parameter %[2x4%]'), e)
    end)
  end

  it('goes on after a signal at the end of a step, as the run would have without it', function()
    local a = toy({ _quiet = true })
    assert.is_false(exists(a.path:gsub('%.h5$', '') .. '.resume')) -- removed when the run finished
    local path, e = stopped({ at = 5, how = 'signal' })
    assert.truthy(e:find('interrupted %(SIGTERM%) before epoch 6'), e)
    assert.truthy(e:find('to go on after epoch 5: resume=', 1, true), e)
    assert.equal('interrupted', pn.io.attrs(path, '/').status)
    local listed
    for _, row in ipairs(require('penumbra.runs').list(runs)) do if row.path == path then listed = row.status end end
    assert.equal('interrupted, resumable', listed) -- ./bench runs says so
    local b = toy({ _quiet = true, resume = path, threads = tostring(pn.num_threads()) })
    assert.equal('finished', b.status)
    assert.equal(path, b.path)
    assert.same(metric(a.path, 'loss'), metric(path, 'loss'))
    assert.same(metric(a.path, 'val_acc'), metric(path, 'val_acc'))
    assert.same(metric(a.path, 'seen'), metric(path, 'seen')) -- the recipe's own state came back
    assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 }, metric(path, 'loss_step'))
    assert.equal(a.test_acc, b.test_acc)
    assert.equal(a.best_epoch, b.best_epoch)
    local at = pn.io.attrs(path, '/')
    assert.equal('finished', at.status)
    assert.equal(1, at.resumed)
    assert.truthy(at.stopped_before:find('^interrupted; resumed after epoch 5: interrupted %(SIGTERM%)'), at.stopped_before)
    assert.is_false(exists(path:gsub('%.h5$', '') .. '.resume'))
  end)

  it('goes on from the last evaluation after an error inside a step, dropping the rows logged since', function()
    local a = toy({ _quiet = true, eval_every = '4' })
    -- evaluations at 4, 8, 12: the state of epoch 4; epochs 5, 6 are logged, 7 fails half-way
    local path, e = stopped({ at = 7, how = 'error' }, { eval_every = '4' })
    assert.truthy(e:find('failed in epoch 7 on purpose', 1, true), e)
    assert.truthy(e:find('to go on after epoch 4', 1, true), e)
    assert.same({ 1, 2, 3, 4, 5, 6 }, metric(path, 'loss_step'))
    toy({ _quiet = true, resume = path })
    assert.same(metric(a.path, 'loss'), metric(path, 'loss'))
    assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 }, metric(path, 'loss_step'))
    assert.same(metric(a.path, 'val_loss'), metric(path, 'val_loss'))
  end)

  it('goes on after the process was killed outright (SIGKILL) in the middle of a step', function()
    local a = toy({ _quiet = true })
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local script = os.tmpname() .. '.lua'
    local f = assert(io.open(script, 'w'))
    f:write(string.format([[
require('penumbra').experiment.RESUME_EVERY_S = 0
_G.RESUME_TOY_STOP = { at = 7, how = 'kill' }
dofile('%s/spec/fixtures/resume_toy.lua')({ _quiet = true })
]], home))
    f:close()
    os.execute(string.format("cd '%s' && PENUMBRA_RUNS='%s' ./bench '%s' >/dev/null 2>&1", home, runs, script))
    os.remove(script)
    local p = io.popen("ls -t '" .. runs .. "'/resume_toy/*.h5 | head -1")
    local path = p:read('*l')
    p:close()
    assert.equal('running', pn.io.attrs(path, '/').status) -- its writer died with it
    assert.same({ 1, 2, 3, 4, 5, 6 }, metric(path, 'loss_step'))
    local b = toy({ _quiet = true, resume = path })
    assert.equal('finished', b.status)
    assert.same(metric(a.path, 'loss'), metric(path, 'loss'))
    assert.same(metric(a.path, 'val_acc'), metric(path, 'val_acc'))
    assert.equal(a.test_acc, b.test_acc)
    assert.truthy(pn.io.attrs(path, '/').stopped_before:find('^killed %(its file still said running%); resumed after epoch 6'))
  end)

  it('saves the state when a signal stops a run between evaluations', function()
    local a = toy({ _quiet = true, eval_every = '4' })
    local path, e = stopped({ at = 6, how = 'signal' }, { eval_every = '4' })
    assert.truthy(e:find('to go on after epoch 6', 1, true), e)
    toy({ _quiet = true, resume = path })
    assert.same(metric(a.path, 'loss'), metric(path, 'loss'))
  end)

  it('refuses what it cannot resume, by name', function()
    local function refused(o, extra)
      local ok, e = pcall(toy, o, extra)
      assert.is_false(ok)
      return tostring(e)
    end
    local done = toy({ _quiet = true, epochs = '3' })
    assert.truthy(refused({ _quiet = true, resume = done.path }):find('that run finished; there is nothing to resume'))
    assert.truthy(refused({ _quiet = true, resume = runs .. '/nope.h5' }):find('no such run file'))
    local ckpt = require('penumbra.runs').checkpoint_path(done.path, pn.io.attrs(done.path, '/'))
    assert.truthy(refused({ _quiet = true, resume = ckpt }):find('not a run file'))
    local path = stopped({ at = 2, how = 'signal' })
    local e = refused({ _quiet = true, resume = path, lr = '0.5' })
    assert.truthy(e:find('a resumed run keeps its config; leave out lr=0.5 %(the run has 0.02%)'), e)
    e = refused({ _quiet = true, resume = path }, { name = 'other_toy' })
    assert.truthy(e:find("that run is of the experiment 'resume_toy'"), e)
    e = refused({ _quiet = true, resume = path }, { not_resumable = true })
    assert.truthy(e:find('cannot be resumed: its definition says nothing of its optimiser'), e)
    -- a state saved by 2 ranks
    local state = path:gsub('%.h5$', '') .. '.resume'
    local resume = require 'penumbra.resume'
    local p = resume.load(state)
    p.ranks = 2
    local model = pn.nn.Sequential(pn.nn.Linear(6, 16), pn.nn.Dropout(0.3), pn.nn.Linear(16, 2))
    model:load(state, 'params')
    resume.save(state, model, p)
    e = refused({ _quiet = true, resume = path })
    assert.truthy(e:find('trained on 2 ranks .* resume it with ./bench %-n 2, not one process'), e)
    -- a run still running (its writer alive on this machine)
    local sh = io.popen('echo $PPID') -- (before the file is opened: a child would inherit its lock)
    local pid = tonumber(sh:read('*l'))
    sh:close()
    local f = pn.io.open(path, 'a')
    f:set_attr('/', 'status', 'running')
    f:set_attr('/', 'pid', pid)
    f:close()
    e = refused({ _quiet = true, resume = path })
    assert.truthy(e:find('that run is still running %(pid %d+ on this machine%)'), e)
    -- a run stopped before its first saved state
    f = pn.io.open(path, 'a')
    f:set_attr('/', 'status', 'interrupted')
    f:close()
    os.remove(state)
    e = refused({ _quiet = true, resume = path })
    assert.truthy(e:find('its resume state .* is missing'), e)
  end)
end)

-- across ranks: `./bench -n 2` stopped by a signal on rank 0, resumed on 2 ranks — each rank's
-- dropout stream restored, so the losses equal the uninterrupted 2-rank run's bit for bit — and
-- refused in one process
describe('resume across ranks', function()
  local check = require 'spec.helpers.check'
  local mpi = require 'spec.helpers.mpi'
  local it_mpi = mpi.it_mpi

  it_mpi('goes on with every rank where it was, and refuses another number of ranks', function()
    local dir = os.tmpname()
    os.remove(dir)
    local script = mpi.write_script(string.format([[
local pn = require 'penumbra'
_G.RESUME_TOY_SHARDED = true
local stop = tonumber(os.getenv('RESUME_TOY_SIGNAL_AT') or '')
if stop and pn.dist.rank() == 0 then _G.RESUME_TOY_STOP = { at = stop, how = 'signal' } end
pn.experiment.RESUME_EVERY_S = 0
dofile('%s/spec/fixtures/resume_toy.lua')(args)
]], mpi.ROOT))
    local function bench(launch, args, env)
      return check.sh(string.format("cd '%s' && PENUMBRA_RUNS='%s' %s timeout 120 ./bench %s '%s' %s 2>&1",
        mpi.ROOT, dir, env or '', launch, script, args or ''))
    end
    local out = bench('-n 2 --oversubscribe', 'threads=1')
    local a = out:match('path%s+(%S+%.h5)')
    assert.truthy(a, out)
    out = bench('-n 2 --oversubscribe', 'threads=1', 'RESUME_TOY_SIGNAL_AT=5')
    local path = out:match('resume=(%S+%.h5)')
    assert.truthy(path, out)
    assert.truthy(out:find('interrupted', 1, true), out)
    out = bench('', 'resume=' .. path)
    assert.truthy(out:find('trained on 2 ranks .* resume it with ./bench %-n 2, not one process'), out)
    out = bench('-n 2 --oversubscribe', 'resume=' .. path)
    assert.truthy(out:find('finished', 1, true), out)
    assert.same(metric(a, 'loss'), metric(path, 'loss'))
    assert.same(metric(a, 'val_loss'), metric(path, 'val_loss'))
    assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 }, metric(path, 'loss_step'))
    assert.equal(2, pn.io.attrs(path, '/').ranks)
    os.remove(script)
  end)
end)

-- a sweep (penumbra/compare.lua) whose run was stopped: resume=<table> goes on with that run
-- from its resume state, and the table ends as the uninterrupted sweep's
describe('resume in a sweep', function()
  it('goes on with the stopped run of a table instead of running it again', function()
    local compare = require 'penumbra.compare'
    pn.experiment.RESUME_EVERY_S = 0
    local script = os.tmpname() .. '.lua'
    local f = assert(io.open(script, 'w'))
    f:write(string.format("return dofile('%s/spec/fixtures/resume_toy.lua')(args)\n", os.getenv('PENUMBRA_HOME') or '.'))
    f:close()
    local function sweep(args)
      return compare.sweep { name = 'resume_sweep', args = args, keys = {},
        rows = function() return { { name = 'toy', script = script, overrides = {}, attrs = {} } } end,
        metric = 'acc', columns = {}, attrs = {} }
    end
    local whole = sweep({ seeds = '2', plot = 'false' })
    _G.RESUME_TOY_STOP = { at = 4, how = 'signal' }
    local ok, e = pcall(sweep, { seeds = '2', plot = 'false' })
    _G.RESUME_TOY_STOP = nil
    assert.is_false(ok)
    local table_path = tostring(e):match('go on with resume=(%S+)%)')
    assert.truthy(table_path, e)
    local stopped = pn.io.attrs(table_path, 'toy').stopped
    assert.truthy(stopped and stopped:match('^0\t'), 'the table names the stopped run: ' .. tostring(stopped))
    local run = stopped:match('^0\t(.+)$')
    local again = sweep({ seeds = '2', plot = 'false', resume = table_path })
    assert.equal(1, pn.io.attrs(run, '/').resumed) -- went on, not run again
    assert.same(metric(whole.rows[1].results[1].path, 'loss'), metric(run, 'loss'))
    assert.same(whole.rows[1].test, again.rows[1].test)

    -- the driver killed with its run (SIGKILL: nothing is caught): the table named the run as
    -- soon as its file existed, so resume=<table> goes on with it all the same
    local driver = os.tmpname() .. '.lua'
    f = assert(io.open(driver, 'w'))
    f:write(string.format([[
local pn = require 'penumbra'
pn.experiment.RESUME_EVERY_S = 0
_G.RESUME_TOY_STOP = { at = 4, how = 'kill' }
require('penumbra.compare').sweep { name = 'resume_sweep', args = { seeds = '2', plot = 'false' }, keys = {},
  rows = function() return { { name = 'toy', script = '%s', overrides = {}, attrs = {} } } end,
  metric = 'acc', columns = {}, attrs = {} }
]], script))
    f:close()
    local home = os.getenv('PENUMBRA_HOME') or '.'
    os.execute(string.format("cd '%s' && PENUMBRA_RUNS='%s' ./bench '%s' >/dev/null 2>&1", home, runs, driver))
    os.remove(driver)
    local p = io.popen("ls -t '" .. runs .. "'/ablation/resume_sweep-*.h5 | head -1")
    local killed_table = p:read('*l')
    p:close()
    local named = pn.io.attrs(killed_table, 'toy').stopped
    assert.truthy(named and named:match('^0\t'), 'the killed run is in the table: ' .. tostring(named))
    local killed_run = named:match('^0\t(.+)$')
    assert.equal('running', pn.io.attrs(killed_run, '/').status)
    local third = sweep({ seeds = '2', plot = 'false', resume = killed_table })
    assert.equal(1, pn.io.attrs(killed_run, '/').resumed)
    assert.same(whole.rows[1].test, third.rows[1].test)
    -- reuse=true: a new table of the finished runs above (the newest of each seed), nothing run
    local function run_files()
      local p2 = io.popen("find '" .. runs .. "' -name '*.h5' -not -path '*/ablation/*' | wc -l")
      local n = tonumber(p2:read('*a'))
      p2:close()
      return n
    end
    local before = run_files()
    local fourth = sweep({ seeds = '2', plot = 'false', reuse = 'true' })
    assert.equal(before, run_files())
    assert.is_true(fourth.rows[1].results[1].reused and fourth.rows[1].results[2].reused)
    for seed = 0, 1 do
      local a = pn.io.attrs(fourth.rows[1].results[seed + 1].path, '/')
      assert.same({ 'finished', seed }, { a.status, a.seed })
    end
    assert.same(whole.rows[1].test, fourth.rows[1].test)
    os.remove(script)
  end)
end)

-- a real recipe: NMT (dropout on, Adam, the inverse-sqrt schedule's update count, the snapshots
-- kept for checkpoint averaging) stopped after epoch 2 of 4 and resumed
describe('resume of the NMT recipe', function()
  it('gives the uninterrupted run\'s losses, validation and averaged test', function()
    pcall(ffi.cdef, 'int raise(int sig);')
    local exp = require 'penumbra.experiment'
    exp.RESUME_EVERY_S = 0
    local run, stop = exp.run, nil
    exp.run = function(def, o) -- SIGTERM at the end of epoch `stop`'s training
      local tr = def.train
      def.train = function(s, c, step, b)
        local m = tr(s, c, step, b)
        if step == stop then ffi.C.raise(15) end
        return m
      end
      return run(def, o)
    end
    local function go(extra)
      local a = { preset = 'small', train_limit = '32', eval_limit = '2', epochs = '4', max_tokens = '256', beam = '1',
                  average = '4', attention_maps = '0', samples = '0', threads = '1', quiet = 'true' }
      for k, v in pairs(extra or {}) do a[k] = v end
      local prev = rawget(_G, 'args')
      _G.args = a
      local ok, r = pcall(dofile, (os.getenv('PENUMBRA_HOME') or '.') .. '/experiments/nmt_multi30k_dot.lua')
      _G.args = prev
      return ok, r
    end
    local ok, a = go()
    stop = 2
    local ok2, e = go()
    stop = nil
    local ok3, b = go({ resume = tostring(e):match('resume=(%S+)$') })
    exp.run = run
    assert.is_true(ok, a)
    assert.is_false(ok2)
    assert.is_true(ok3, b)
    assert.same(metric(a.path, 'loss'), metric(b.path, 'loss'))
    assert.same(metric(a.path, 'val_loss'), metric(b.path, 'val_loss'))
    assert.same(metric(a.path, 'updates'), metric(b.path, 'updates'))
    assert.equal(a.test_loss, b.test_loss)
    assert.equal(4, b.averaged) -- epochs 1 and 2 came back with the state
    assert.equal(a.averaged, b.averaged)
    assert.equal(a.test_bleu_avg, b.test_bleu_avg)
  end)
end)
