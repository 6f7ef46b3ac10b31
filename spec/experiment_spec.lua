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
    assert.is_true(f:exists('params/weight'))
    local s = f:attrs('summary')
    assert.equal('finished', s.status)
    assert.truthy(s.test_acc > 0.8)
    f:close()
    -- h5dump reads it too
    local ok = os.execute('h5dump -H "' .. r.path .. '" >/dev/null 2>&1')
    assert.truthy(ok == 0 or ok == true)
  end)

  it('marks the run failed when setup raises, with the message stored', function()
    local ok, e = pcall(toy, { _quiet = true, fail_setup = 'true' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('setup failed on purpose'))
    -- newest toy run file
    local p = io.popen('ls -t "' .. runs .. '/toy"/*.h5 | head -1')
    local path = p:read('*l'); p:close()
    local a = attrs(path)
    assert.equal('failed', a.status)
    assert.truthy(a.error:find('setup failed on purpose'))
  end)

  it('stops on a NaN loss with status failed and keeps the last good checkpoint', function()
    local ok, e = pcall(toy, { _quiet = true, nan_at = '4' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('NaN at epoch 4'))
    local p = io.popen('ls -t "' .. runs .. '/toy"/*.h5 | head -1')
    local path = p:read('*l'); p:close()
    local a = attrs(path)
    assert.equal('failed', a.status)
    local f = pn.io.open(path, 'r')
    assert.equal(3, f:read('metrics/loss'):numel())
    assert.is_true(f:exists('params/weight'))
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

  it('leaves a readable file marked interrupted after SIGINT', function()
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local script = os.tmpname() .. '.lua'
    local f = io.open(script, 'w')
    f:write("local toy = dofile('" .. home .. "/spec/fixtures/toy_experiment.lua')\n",
            "toy({ epochs = '200', sleep = '0.05', _quiet = true })\n")
    f:close()
    local dir = runs .. '/sigint'
    -- one SIGINT, as Ctrl-C sends (timeout(1) would signal the child twice: pid and group,
    -- and a second Ctrl-C is meant to stop at once)
    local cmd = string.format('cd "%s" && (PENUMBRA_RUNS="%s" ./bench "%s" >/dev/null 2>&1 & pid=$!; sleep 3; ' ..
      'kill -INT $pid; wait $pid) >/dev/null 2>&1', home, dir, script)
    os.execute(cmd)
    os.remove(script)
    local p = io.popen('ls "' .. dir .. '/toy"/*.h5 2>/dev/null | head -1')
    local path = p:read('*l'); p:close()
    assert.truthy(path, 'no run file written')
    local a = attrs(path)
    assert.equal('interrupted', a.status)
    local n = pn.io.load(path, 'metrics/loss'):numel()
    assert.truthy(n >= 1 and n < 200)
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

describe('./bench compare', function()
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
    assert.truthy(text:find('| toy_script |', 1, true))
    -- a number the runs' finish returns joins the result; attn_entropy gets its column
    assert.same({ 0.25, 0.75 }, rows[1].ent)
    assert.truthy(text:find('| attn entropy |', 1, true))
    assert.truthy(text:find('| 0.500 | 0 |', 1, true))
  end)
end)
