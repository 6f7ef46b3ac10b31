-- Plots of real recipe run files (experiments/cora_*.lua, a few epochs each), not synthetic
-- ones: runs are named and filed by what they ran (the variant), compare groups them by it,
-- a single run claims no spread, bad files are skipped, many curves keep the axes clear, and
-- heatmap / radius find their maps without flags. Pictures need gnuplot (else pending).
local pn = require 'penumbra'
local plot = require 'penumbra.plot'
local runs = require 'penumbra.runs'

local home = os.getenv('PENUMBRA_HOME') or '.'
local dir = os.tmpname()
os.remove(dir)
local ffi = require 'ffi'
pcall(ffi.cdef, 'int setenv(const char *, const char *, int);')

local function run(script, args)
  local prev_runs = os.getenv('PENUMBRA_RUNS')
  ffi.C.setenv('PENUMBRA_RUNS', dir, 1)
  local saved = rawget(_G, 'args')
  args._quiet = true
  _G.args = args
  local ok, r = pcall(dofile, home .. '/experiments/' .. script)
  _G.args = saved
  if prev_runs then ffi.C.setenv('PENUMBRA_RUNS', prev_runs, 1) end
  assert(ok, tostring(r))
  assert(r.status == 'finished', r.status)
  return r
end

local function vars_of(job)
  local v = {}
  for _, kv in ipairs(job.vars) do v[kv[1]] = kv[2] end
  return v
end

local HAVE_GNUPLOT = os.execute('command -v gnuplot >/dev/null 2>&1')
HAVE_GNUPLOT = HAVE_GNUPLOT == 0 or HAVE_GNUPLOT == true

local function png_size(path)
  local f = io.open(path, 'rb')
  local s = f and f:read('*a') or ''
  if f then f:close() end
  local function be32(i) local a, b, c, d = s:byte(i, i + 3) return ((a * 256 + b) * 256 + c) * 256 + d end
  if #s < 24 then return nil end
  return be32(17), be32(21)
end

describe('plots of recipe run files', function()
  local R = {}
  setup(function()
    R.a0 = run('cora_dot.lua', { epochs = '2', seed = '0' })
    R.a1 = run('cora_dot.lua', { epochs = '2', seed = '1' })
    R.b0 = run('cora_dot.lua', { epochs = '3', seed = '0' })
    R.g0 = run('cora_umbral.lua', { epochs = '2', score = 'gat', seed = '0' })
    R.u0 = run('cora_umbral.lua', { epochs = '2', seed = '0' })
  end)

  it('a run is named and filed by what it ran: the experiment and the values that differ from its defaults', function()
    assert.equal('cora_dot epochs=2', R.a0.variant)
    assert.equal('cora_dot epochs=3', R.b0.variant)
    assert.equal('cora_umbral epochs=2 score=gat', R.g0.variant)
    assert.truthy(R.a0.path:find('/cora_dot+epochs=2/', 1, true), R.a0.path)
    assert.truthy(R.g0.path:find('/cora_umbral+epochs=2+score=gat/', 1, true), R.g0.path)
    local r = runs.open(R.g0.path)
    assert.equal('cora_umbral', r.experiment)
    assert.equal('cora_umbral epochs=2 score=gat', r.variant)
    assert.equal('cora_umbral epochs=2 score=gat s0', r:label())
    r:close()
    -- the seed is not part of the name: both seeds share one folder
    assert.equal(R.a0.path:match('^(.*)/'), R.a1.path:match('^(.*)/'))
    -- ./bench runs shows the variant
    local listed = {}
    for _, row in ipairs(runs.list(dir)) do listed[row.path] = row.experiment end
    assert.equal('cora_dot epochs=3', listed[R.b0.path])
  end)

  it('compare groups runs by config: one bar per variant, seeds averaged, a single run without spread', function()
    local junk = dir .. '/junk.h5'
    local f = io.open(junk, 'w'); f:write('not a run'); f:close()
    local job = plot.prepare('compare', { R.a0.path, R.b0.path, junk, R.a1.path, R.g0.path }, {})
    local names, counts = {}, {}
    for i, row in ipairs(job.rows) do names[i], counts[i] = row.name, #row.values end
    assert.same({ 'cora_dot epochs=2', 'cora_dot epochs=3', 'cora_umbral epochs=2 score=gat' }, names)
    assert.same({ 2, 1, 1 }, counts)
    local m = (R.a0.test_acc + R.a1.test_acc) / 2
    assert.truthy(math.abs(job.rows[1].mean - m) < 1e-12)
    assert.truthy(math.abs(job.rows[2].mean - R.b0.test_acc) < 1e-12)
    assert.equal(1, #job.warnings)
    assert.truthy(job.warnings[1]:find('junk.h5', 1, true))
    local title = vars_of(job).plot_title
    assert.truthy(title:find('mean ± std over runs', 1, true), title)
    -- the data file carries the count: the gnuplot script drops the error bar for one run
    assert.truthy(job.data.datafile:find('"cora_dot epochs=3" [^\n]* 1\n'), job.data.datafile)
    job = plot.prepare('compare', { R.b0.path, R.g0.path }, {})
    title = vars_of(job).plot_title
    assert.truthy(title:find('one run each (no spread)', 1, true), title)
    if HAVE_GNUPLOT then
      local out = dir .. '/cmp.png'
      assert.equal(out, plot.plot('compare', { R.a0.path, R.a1.path, R.b0.path, R.g0.path }, { out = out }))
      assert.truthy(png_size(out))
    end
    os.remove(junk)
  end)

  it('curves: few series keep the legend below, many move it beside the axes, too many drop it', function()
    local files = { R.a0.path, R.a1.path, R.b0.path, R.g0.path }
    local job = plot.prepare('curves', files, { metric = 'loss' })
    assert.equal(1, vars_of(job).key_mode)
    job = plot.prepare('curves', files, { metric = 'loss,val_acc,val_loss' })
    assert.equal(12, vars_of(job).n)
    assert.equal(2, vars_of(job).key_mode)
    assert.same({ 1200, 640 }, job.size)
    if HAVE_GNUPLOT then
      local out = dir .. '/curves.png'
      plot.plot('curves', files, { metric = 'loss,val_acc,val_loss', out = out })
      local w, h = png_size(out)
      assert.equal(1200, w)
      assert.equal(640, h)
    end
    local many = {}
    for i = 1, 14 do many[i] = files[(i - 1) % 4 + 1] end
    job = plot.prepare('curves', many, { metric = 'loss,val_acc,val_loss' })
    assert.equal(0, vars_of(job).key_mode)
    assert.truthy(job.warnings[#job.warnings]:find('too many for a legend', 1, true))
  end)

  it('heatmap and radius need no flags on a GAT / cone run', function()
    local job = plot.prepare('heatmap', { R.g0.path }, {})
    assert.equal('heatmap', job.kind)
    assert.truthy(vars_of(job).nq > 1 and vars_of(job).nk > 1)
    job = plot.prepare('radius', { R.u0.path }, {})
    assert.equal('radius', job.kind)
  end)
end)
