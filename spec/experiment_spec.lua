-- The experiment runner (lua/penumbra/experiment.lua): config overrides, the run file after
-- a normal run, an error, a NaN loss and an interrupt, and reproducibility.
local pn = require 'penumbra'
local toy = require 'spec.fixtures.toy_experiment'

local runs = os.tmpname()
os.remove(runs)
local function setenv_runs()
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'int setenv(const char *, const char *, int);')
  ffi.C.setenv('PENUMBRA_RUNS', runs, 1)
end
setenv_runs()

local function attrs(path) return pn.io.attrs(path, '/') end
-- the checkpoint file a run file names
local function ckpt_of(path) return require('penumbra.runs').checkpoint_path(path, attrs(path)) end

describe('experiment runner', function()
  it('merges type-checked overrides and rejects unknown keys', function()
    local cfg = pn.experiment.config({ lr = 0.1, epochs = 10, name = 'a', flag = false },
      { lr = '0.5', epochs = '3', flag = 'true' })
    assert.same({ lr = 0.5, epochs = 3, name = 'a', flag = true }, cfg)
    local ok, e = pcall(pn.experiment.config, { lr = 0.1, epochs = 10 }, { lrr = '1' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("unknown config key 'lrr'; valid keys: epochs, lr"))
    ok, e = pcall(pn.experiment.config, { lr = 0.1 }, { lr = 'fast' })
    assert.truthy(tostring(e):find('lr must be a number'))
    ok, e = pcall(pn.experiment.config, { flag = true }, { flag = 'maybe' })
    assert.truthy(tostring(e):find('flag must be true or false'))
    -- tonumber reads 'nan' and 'inf' as numbers: a config number is finite, limit or not
    for _, bad in ipairs({ 'nan', 'inf', '-inf', '1e999' }) do
      for _, default in ipairs({ 0.1, 10 }) do
        ok, e = pcall(pn.experiment.config, { x = default }, { x = bad })
        assert.is_false(ok, bad)
        assert.truthy(tostring(e):find("experiment: x must be a finite number, got '" .. bad .. "'", 1, true), tostring(e))
      end
    end
  end)

  it('writes a complete, readable run file after a normal run', function()
    local r = toy({ _quiet = true, epochs = '8' })
    assert.equal('finished', r.status)
    local a = attrs(r.path)
    assert.equal('toy', a.experiment)
    assert.equal('finished', a.status)
    assert.truthy(a.config:find('"epochs":8'))
    assert.equal(0, a.seed)
    assert.truthy(a.start_time and a.end_time and a.git_commit ~= nil and a.host)
    local f = pn.io.open(r.path, 'r')
    assert.equal(8, f:read('metrics/loss'):numel())
    assert.same({ 1, 2, 3, 4, 5, 6, 7, 8 }, f:read('metrics/loss_step'):totable())
    assert.equal(8, f:read('metrics/val_acc'):numel())
    assert.is_false(f:exists('params')) -- the checkpoint has its own file
    assert.is_true(pn.io.open(ckpt_of(r.path), 'r'):exists('params/weight'))
    local s = f:attrs('summary')
    assert.equal('finished', s.status)
    assert.truthy(s.test_acc > 0.8)
    f:close()
    -- h5dump reads it too
    local ok = os.execute('h5dump -H "' .. r.path .. '" >/dev/null 2>&1')
    assert.truthy(ok == 0 or ok == true)
  end)

  it('threads= holds for the run, is what the run file records, and is restored after it', function()
    local before = pn.num_threads()
    local seen
    local def = {
      name = 'threads_toy', config = { epochs = 1, threads = 0 },
      setup = function() return {} end,
      train = function() seen = pn.num_threads() return { loss = 1 } end,
      evaluate = function() return { acc = 1 } end,
    }
    local want = before == 1 and 2 or 1 -- not the count it has
    local r = pn.experiment.run(def, { _quiet = true, threads = tostring(want) })
    assert.equal('finished', r.status)
    assert.equal(want, seen)
    assert.equal(want, attrs(r.path).threads) -- the recipes set it in setup, after the file said the default
    assert.equal(before, pn.num_threads())
    -- threads = 0: the library's default, untouched
    r = pn.experiment.run(def, { _quiet = true })
    assert.equal(before, seen)
    assert.equal(before, attrs(r.path).threads)
  end)

  it('marks the run failed when setup raises, with the message stored', function()
    local ok, e = pcall(toy, { _quiet = true, fail_setup = 'true' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('setup failed on purpose'))
    -- newest toy run file
    local p = io.popen('ls -t "' .. runs .. '"/toy*/*.h5 | head -1')
    local path = p:read('*l'); p:close()
    local a = attrs(path)
    assert.equal('failed', a.status)
    assert.truthy(a.error:find('setup failed on purpose'))
  end)

  it('stops on a NaN loss with status failed and keeps the last good checkpoint', function()
    local ok, e = pcall(toy, { _quiet = true, nan_at = '4' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('NaN at epoch 4'))
    local p = io.popen('ls -t "' .. runs .. '"/toy*/*.h5 | head -1')
    local path = p:read('*l'); p:close()
    local a = attrs(path)
    assert.equal('failed', a.status)
    local f = pn.io.open(path, 'r')
    assert.equal(3, f:read('metrics/loss'):numel())
    assert.is_true(pn.io.open(ckpt_of(path), 'r'):exists('params/weight'))
    for _, v in ipairs(f:read('metrics/loss'):totable()) do assert.truthy(v == v) end
    f:close()
  end)

  it('gives identical metrics for the same seed', function()
    local a = toy({ _quiet = true, epochs = '5', seed = '7' })
    local b = toy({ _quiet = true, epochs = '5', seed = '7' })
    local la = pn.io.load(a.path, 'metrics/loss'):totable()
    local lb = pn.io.load(b.path, 'metrics/loss'):totable()
    assert.same(la, lb)
  end)

  -- runs the slow toy experiment in a child ./bench with its runs under runs/<name>, sends
  -- `stop` (shell commands; $pid is the child) after 3 s, and returns the runs directory and
  -- the child's output (stdout and stderr)
  local function stopped_run(name, stop)
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local script = os.tmpname() .. '.lua'
    local f = io.open(script, 'w')
    f:write("local toy = dofile('" .. home .. "/spec/fixtures/toy_experiment.lua')\n",
            "toy({ epochs = '200', sleep = '0.05', _quiet = true })\n")
    f:close()
    local dir = runs .. '/' .. name
    local out = os.tmpname()
    os.execute(string.format('cd "%s" && (PENUMBRA_RUNS="%s" ./bench "%s" >"%s" 2>&1 & pid=$!; sleep 3; ' ..
      '%s; wait $pid) >/dev/null 2>&1', home, dir, script, out, stop))
    os.remove(script)
    local o = io.open(out, 'rb')
    local text = o and o:read('*a') or ''
    if o then o:close() end
    os.remove(out)
    return dir, text
  end
  local function run_file_of(dir)
    local p = io.popen('ls "' .. dir .. '"/toy*/*.h5 2>/dev/null | head -1')
    local path = p:read('*l'); p:close()
    assert.truthy(path, 'no run file written')
    return path
  end

  -- one signal, as Ctrl-C sends (timeout(1) would signal the child twice: pid and group, and a
  -- second one is meant to stop at once); SIGTERM (kill, a scheduler) and SIGHUP (a closed
  -- terminal) stop a run as Ctrl-C does
  for _, sig in ipairs({ { 'INT', 'Ctrl-C' }, { 'TERM', 'SIGTERM' }, { 'HUP', 'SIGHUP' } }) do
    it('leaves a readable file marked interrupted after SIG' .. sig[1] .. ', and says at once it heard it', function()
      local dir, out = stopped_run('sig' .. sig[1], 'kill -' .. sig[1] .. ' $pid')
      assert.truthy(out:find('penumbra: stop requested', 1, true), out)
      local path = run_file_of(dir)
      local a = attrs(path)
      assert.equal('interrupted', a.status)
      assert.truthy(a.error:find(sig[2], 1, true), a.error)
      local n = pn.io.load(path, 'metrics/loss'):numel()
      assert.truthy(n >= 1 and n < 200)
    end)
  end

  it('./bench runs shows a run whose process died as dead, not running', function()
    local dir = stopped_run('sigkill', 'pkill -KILL -P $pid; kill -KILL $pid')
    local rows = require('penumbra.runs').list(dir)
    assert.equal(1, #rows)
    assert.equal('dead (was running)', rows[1].status)
  end)

  it('a word on the command line that is not key=value stops the run before it starts', function()
    -- `./bench script.lua epochs` (for epochs=5) used to run with the defaults, the word dropped
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local dir, out = runs .. '/bare-word', os.tmpname()
    local status = os.execute(string.format('cd "%s" && PENUMBRA_RUNS="%s" ./bench spec/fixtures/toy_script.lua epochs=3 seeds >"%s" 2>&1',
      home, dir, out))
    local f = io.open(out, 'rb')
    local text = f:read('*a')
    f:close()
    os.remove(out)
    assert.are_not.equal(0, status)
    assert.truthy(text:find("'seeds' on the command line is not a setting; settings are key=value (e.g. seeds=…)", 1, true), text)
    assert.is_nil(io.open(dir .. '/toy', 'r'), 'no run folder may be made') -- nothing ran
  end)

  it('./bench runs names a missing folder, and a file given for a folder', function()
    local R = require('penumbra.runs')
    local ok, e = pcall(R.main_runs, { runs .. '/no-such' })
    assert.is_false(ok)
    assert.equal("runs: no such folder '" .. runs .. "/no-such'", e)
    local f = os.tmpname() .. '.h5'
    io.open(f, 'w'):close()
    ok, e = pcall(R.main_runs, { f })
    os.remove(f)
    assert.is_false(ok)
    assert.equal("runs: '" .. f .. "' is a file, not a folder of runs (one run file: ./bench show " .. f .. ')', e)
    ok, e = pcall(R.main_runs, { runs, '--sort' })
    assert.is_false(ok)
    assert.equal("runs: one folder at a time, got 2 arguments ('" .. runs .. "' '--sort')", e)
  end)

  it('refuses an unwritable runs directory before training', function()
    local ffi = require 'ffi'
    ffi.C.setenv('PENUMBRA_RUNS', '/proc/penumbra-cannot-write', 1)
    local ok, e = pcall(toy, { _quiet = true })
    setenv_runs()
    assert.is_false(ok)
    assert.truthy(tostring(e):find('cannot write run files'))
  end)
end)

describe('experiment config limits', function()
  it('checks every key with a limit before the run file exists, defaults too', function()
    local before = io.popen('ls "' .. runs .. '"/toy* 2>/dev/null | wc -l'):read('*n')
    for _, bad in ipairs({ { epochs = '-1' }, { epochs = '0' }, { epochs = '2.5' }, { seed = '1e20' },
                           { patience = '-5' }, { lr = 'fast' } }) do
      bad._quiet = true
      local ok, e = pcall(toy, bad)
      assert.is_false(ok)
      local k = next(bad) == '_quiet' and next(bad, '_quiet') or next(bad)
      assert.truthy(tostring(e):find('experiment: ' .. k, 1, true), tostring(e))
    end
    local after = io.popen('ls "' .. runs .. '"/toy* 2>/dev/null | wc -l'):read('*n')
    assert.equal(before, after) -- no run file for a rejected config
  end)

  it("a recipe's limits: lr > 0 and finite, dataset and score from the registries", function()
    local recipe = require 'penumbra.recipes.gat_planetoid'
    for _, bad in ipairs({ { lr = 'nan' }, { lr = '-1' }, { heads = '0' }, { dropout = '1' }, { score = 'umbrall' },
                           { dataset = 'coraa' } }) do
      local saved = rawget(_G, 'args')
      _G.args = bad
      bad._quiet = true
      local ok, e = pcall(recipe, { dataset = 'cora', score = 'umbral', r = 0.1 })
      _G.args = saved
      assert.is_false(ok)
      assert.truthy(tostring(e):find('experiment: ', 1, true), tostring(e))
    end
  end)

  it('a failed run raises one message naming the run file, no traceback', function()
    local ok, e = pcall(toy, { _quiet = true, fail_setup = 'true' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('failed: ', 1, true))
    assert.truthy(tostring(e):find('run file: ', 1, true))
    assert.is_nil(tostring(e):find('stack traceback', 1, true))
  end)
end)

describe('./bench compare', function()
  -- compare.main over args, the table's text kept out of the spec output
  local function compare_main(args)
    local out, tmp = io.output(), os.tmpname()
    io.output(tmp)
    local ok, rows = pcall(require('penumbra.compare').main, args)
    io.output():close()
    io.output(out)
    local f = io.open(tmp); local text = f:read('*a'); f:close(); os.remove(tmp)
    return ok, rows, text
  end

  it('without metric=, takes the metric the runs monitor when they report no test_acc', function()
    -- an NMT compare without metric=bleu used to end with an error after its first (hour-long) run
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local script = home .. '/spec/fixtures/toy_script.lua'
    local ok, rows, text = compare_main({ script, 'seeds=2', 'epochs=3', 'reports=score' })
    assert.is_true(ok, tostring(rows))
    assert.equal(2, #rows[1].test)
    assert.truthy(text:find('| experiment | test score (mean ± std, 2 seeds) | val score |', 1, true), text)
    -- metric= given is kept: a run without it is the error it was
    ok, rows = compare_main({ script, 'seeds=1', 'epochs=3', 'reports=score', 'metric=acc' })
    assert.is_false(ok)
    assert.truthy(tostring(rows):find('reports no test_acc (it has: test_score', 1, true), tostring(rows))
    -- and the default stays acc for runs that report it
    ok, rows, text = compare_main({ script, 'seeds=1', 'epochs=3' })
    assert.is_true(ok, tostring(rows))
    assert.truthy(text:find('| experiment | test acc (mean ± std, 1 seeds) |', 1, true), text)
  end)

  it('reuse=true takes finished runs with the same settings and seed instead of running them', function()
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local script = home .. '/spec/fixtures/toy_script.lua'
    local function count(dir)
      local p = io.popen('ls "' .. dir .. '"/*.h5 2>/dev/null | wc -l')
      local n = tonumber(p:read('*a'))
      p:close()
      return n
    end
    local dir = runs .. '/toy+epochs=3+lr=0.25'
    local ok, rows = compare_main({ script, 'seeds=2', 'epochs=3', 'lr=0.25' })
    assert.is_true(ok, tostring(rows))
    local first = rows[1].results
    assert.equal(2, count(dir))
    -- seeds 0 and 1 are taken, seed 2 runs
    local rows2
    ok, rows2 = compare_main({ script, 'seeds=3', 'epochs=3', 'lr=0.25', 'reuse=true' })
    assert.is_true(ok, tostring(rows2))
    local r = rows2[1].results
    assert.equal(first[1].path, r[1].path)
    assert.equal(first[2].path, r[2].path)
    assert.is_true(r[1].reused and r[2].reused)
    assert.is_nil(r[3].reused)
    assert.same({ rows[1].test[1], rows[1].test[2] }, { rows2[1].test[1], rows2[1].test[2] })
    assert.equal('toy epochs=3 lr=0.25', rows2[1].name)
    assert.equal(3, count(dir))
    -- without reuse= every seed runs again
    ok = compare_main({ script, 'seeds=1', 'epochs=3', 'lr=0.25' })
    assert.is_true(ok)
    assert.equal(4, count(dir))
    -- a run whose settings differ (here a default changed since: patience) is not taken
    local src = io.open(home .. '/spec/fixtures/toy_experiment.lua'):read('*a')
    local changed = os.tmpname() .. '.lua'
    local f = io.open(changed, 'w')
    f:write('return (function()\n', (src:gsub('patience = 100', 'patience = 99')), '\nend)()(rawget(_G, "args"))')
    f:close()
    ok, rows2 = compare_main({ changed, 'seeds=1', 'epochs=3', 'lr=0.25', 'reuse=true' })
    os.remove(changed)
    assert.is_true(ok, tostring(rows2))
    assert.is_nil(rows2[1].results[1].reused)
    assert.equal(5, count(dir))
    ok, rows2 = compare_main({ script, 'seeds=1', 'reuse=maybe' })
    assert.is_false(ok)
    assert.truthy(tostring(rows2):find("compare: reuse must be true or false, got 'maybe'", 1, true), tostring(rows2))
  end)

  it('refuses a missing or unreadable script before running any (no table saved)', function()
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local script = home .. '/spec/fixtures/toy_script.lua'
    local tmp_home = os.tmpname()
    os.remove(tmp_home)
    local ok, err = compare_main({ script, tmp_home .. '/nonexistent.lua', 'seeds=1', 'epochs=2' })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('compare: cannot open ' .. tmp_home .. '/nonexistent.lua', 1, true), tostring(err))
    ok, err = compare_main({ home .. '/spec', 'seeds=1' })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('compare: cannot read ' .. home .. '/spec', 1, true), tostring(err))
  end)

  it('runs scripts over seeds and tabulates mean ± std', function()
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local rows
    local out = io.output()
    local tmp = os.tmpname()
    io.output(tmp) -- keep the table out of the spec output
    local ok, e = pcall(function()
      rows = require('penumbra.compare').main({ home .. '/spec/fixtures/toy_script.lua', 'seeds=2', 'epochs=4' })
    end)
    io.output():close()
    io.output(out)
    local f = io.open(tmp); local text = f:read('*a'); f:close(); os.remove(tmp)
    assert.is_true(ok, tostring(e))
    assert.equal(1, #rows)
    assert.equal(2, #rows[1].test)
    assert.same({ 4, 4 }, rows[1].epochs)
    local m, s = require('penumbra.compare').mean_std({ 1, 2, 3 })
    assert.equal(2, m); assert.equal(1, s)
    -- the row says what ran: the experiment and the overrides that change its result
    assert.equal('toy epochs=4', rows[1].name)
    assert.truthy(text:find('| toy epochs=4 |', 1, true), text)
    -- a number the runs' finish returns joins the result; attn_entropy gets its column
    assert.same({ 0.25, 0.75 }, rows[1].ent)
    assert.truthy(text:find('| attn entropy |', 1, true))
    assert.truthy(text:find('| 0.500 | 0 |', 1, true))
  end)

  it('fails on a bad key, bad seeds, or a failed seed, instead of saving a table of NaN with rc 0', function()
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local compare = require('penumbra.compare')
    local script = home .. '/spec/fixtures/toy_script.lua'
    local out = io.output()
    io.output(os.tmpname())
    local ok1, e1 = pcall(compare.main, { script, 'seeds=2', 'epochs=4', 'bogus=1' })
    local ok2, e2 = pcall(compare.main, { script, 'seeds=0' })
    local ok3, e3 = pcall(compare.main, { script, 'seeds=abc' })
    local ok4, e4 = pcall(compare.main, { script, 'seeds=2', 'epochs=4', 'nan_at=3' }) -- every seed's loss turns NaN
    io.output():close()
    io.output(out)
    assert.is_false(ok1); assert.truthy(tostring(e1):find("unknown config key 'bogus'", 1, true), tostring(e1))
    assert.is_false(ok2); assert.truthy(tostring(e2):find('seeds must be a whole number >= 1', 1, true))
    assert.is_false(ok3); assert.truthy(tostring(e3):find("got 'abc'", 1, true))
    assert.is_false(ok4); assert.truthy(tostring(e4):find('2 run(s) failed', 1, true), tostring(e4))
  end)
end)

describe('experiment runner, step-based', function()
  -- online data: every step draws a fresh batch of a fixed linear problem; evaluation every
  -- `eval_every` steps and at the last one; two tracked metrics; an artefact per evaluation
  local function stepper(overrides, extra)
    local evals, batches = {}, {}
    local def = {
      name = 'toy_steps', recipe = 'spec.fixtures.toy_recipe',
      config = { steps = 23, eval_every = 5, patience = 100, lr = 0.5, seed = 0 },
      monitor = 'val_loss', mode = 'min', track = { val_acc = 'max', val_neg = 'min' },
      setup = function(cfg)
        local model = pn.nn.Linear(3, 1)
        return { model = model, opt = pn.optim.SGD(model, { lr = cfg.lr }), w = pn.tensor({ { 1.5 }, { -2 }, { 0.5 } }) }
      end,
      model = function(s) return s.model end,
      batch = function(s, _, step)
        local x = pn.randn({ 32, 3 })
        batches[#batches + 1] = step
        return { x = x, y = x:matmul(s.w):gt(0):to('f32') }
      end,
      train = function(s, _, _, b)
        s.opt:zero_grad()
        local loss = pn.binary_cross_entropy_with_logits(s.model(b.x), b.y)
        loss:backward()
        s.opt:step()
        return { loss = loss:item() }
      end,
      evaluate = function(s, _, split, step)
        if split == 'val' then evals[#evals + 1] = step end
        pn.manual_seed(99) -- the same held-out batch every time
        local x = pn.randn({ 256, 3 })
        local y = x:matmul(s.w):gt(0):to('f32')
        return pn.no_grad(function()
          local z = s.model(x)
          local acc = z:gt(0):to('f32'):eq(y):to('f64'):mean():item()
          return { loss = pn.binary_cross_entropy_with_logits(z, y):item(), acc = acc, neg = -acc }
        end)
      end,
      on_eval = function(_, _, run, step, m)
        run:write_text('samples/latest', string.format('step %d: acc %.3f\nnext line é', step, m.val_acc), { step = step })
      end,
    }
    for k, v in pairs(extra or {}) do def[k] = v end
    local r = pn.experiment.run(def, overrides)
    return r, evals, batches
  end

  it('draws a batch per step, evaluates every k steps and at the end, tracks several metrics', function()
    local r, evals, batches = stepper({ _quiet = true })
    assert.equal('finished', r.status)
    assert.equal(23, #batches)
    assert.same({ 5, 10, 15, 20, 23 }, evals)
    assert.equal(23, r.steps)
    assert.is_nil(r.epochs)
    assert.truthy(r.best_step == 5 or r.best_step == 10 or r.best_step == 15 or r.best_step == 20 or r.best_step == 23)
    assert.truthy(r.best_val_acc and r.best_val_acc > 0.5)
    assert.equal(-r.best_val_acc, r.best_val_neg) -- tracked independently, same optimum
    assert.truthy(r.seconds_per_step > 0)
    local f = pn.io.open(r.path, 'r')
    assert.same({ 5, 10, 15, 20, 23 }, f:read('metrics/val_loss_step'):totable())
    assert.equal(23, f:read('metrics/loss'):numel())
    local a = f:attrs('/')
    assert.equal('spec.fixtures.toy_recipe', a.recipe)
    assert.equal('step', a.unit)
    assert.equal(r.best_step, pn.io.attrs(ckpt_of(r.path), 'params').step)
    f:close()
    local run = require('penumbra.runs').open(r.path)
    assert.equal('step 23: acc ' .. string.format('%.3f', r.val_acc) .. '\nnext line é', run:read_text('samples/latest'))
    run:close()
  end)

  it('counts patience in evaluations', function()
    -- val_loss cannot improve with lr = 0 after the first evaluation
    local _, evals = stepper({ _quiet = true, lr = '0', patience = '2', steps = '100' })
    assert.same({ 5, 10, 15 }, evals)
  end)

  it('rejects unknown definition keys and bad eval_every, naming the valid ones', function()
    local ok, e = pcall(stepper, { _quiet = true }, { on_evaluate = function() end })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('unknown definition key(s) on_evaluate', 1, true), tostring(e))
    assert.truthy(tostring(e):find('on_eval', 1, true))
    ok, e = pcall(stepper, { _quiet = true, eval_every = '0' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('eval_every must be >= 1', 1, true), tostring(e))
  end)
end)
