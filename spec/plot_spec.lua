-- Looking at results: run files read back (lua/penumbra/runs.lua), the gnuplot data files and
-- pictures of ./bench plot (lua/penumbra/plot.lua, plots/*.gp), the terminal pictures
-- (lua/penumbra/termplot.lua), and the `plot`, `runs`, `show` commands. Every run file here is
-- synthetic and written by the spec itself with pn.io. Pictures need gnuplot (Debian package
-- gnuplot-nox); without it those specs are skipped (pending).
local pn = require 'penumbra'
local runs = require 'penumbra.runs'
local plot = require 'penumbra.plot'
local termplot = require 'penumbra.termplot'

local ROOT = os.getenv('PENUMBRA_HOME') or '.'

-- ---- helpers ---------------------------------------------------------------------------------
local tmpdir
do
  local base = os.tmpname()
  os.remove(base)
  tmpdir = base .. '.plotspec'
  os.execute("mkdir -p '" .. tmpdir .. "'")
end

local read_file = require('spec.helpers.check').read_file

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
end

-- output (stdout and stderr) and exit status of a shell command
local sh = require('spec.helpers.check').sh

local HAVE_GNUPLOT = (sh('gnuplot -e "set terminal"')):find('Available terminal types') ~= nil

-- PNG width and height from the IHDR chunk (bytes 17..24, big-endian)
local function png_size(s)
  assert.equal('\137PNG\r\n\26\n', s:sub(1, 8))
  assert.equal('IHDR', s:sub(13, 16))
  local function u32(i)
    local a, b, c, d = s:byte(i, i + 3)
    return ((a * 256 + b) * 256 + c) * 256 + d
  end
  return u32(17), u32(21)
end

-- the numbers of a gnuplot data file: blocks (split at two blank lines) of rows of fields
local function parse_blocks(text)
  local blocks = {}
  for block in (text .. '\n\n\n'):gmatch('(.-)\n\n\n+') do
    if block:match('%S') then
      local rows = {}
      for line in block:gmatch('[^\n]+') do
        local row = {}
        for field in line:gmatch('"[^"]*"') do row[#row + 1] = field:sub(2, -2) end
        local numbers = line:gsub('"[^"]*"', '')
        local fields = {}
        for x in numbers:gmatch('%S+') do fields[#fields + 1] = tonumber(x) or x end
        rows[#rows + 1] = { strings = row, numbers = fields }
      end
      blocks[#blocks + 1] = rows
    end
  end
  return blocks
end

local function near(a, b, tol)
  tol = tol or 1e-6
  return math.abs(a - b) <= tol * math.max(1, math.abs(a), math.abs(b))
end

-- ---- the synthetic run files ----------------------------------------------------------------------
local LOSS = { 2.0, 1.5, 1.2, 1.1, 0.9, 0.95, 0.7, 0.6 }
local STEPS = { 1, 2, 3, 4, 5, 6, 7, 8 }
local VACC = { 0.2, 0.4, 0.5, 0.55, 0.6, 0.62, 0.66, 0.7 }
local RADII = { { 0.1, 0.5 }, { 0.9, 1.3 }, { 2.0, 0.4 }, { 0.45, 3.0 }, { 1.1, 1.2 } }   -- (5, 2)
local WORDS = { 'the', 'cat', 'sat', 'down' }
-- (H=2, Nq=3, Nk=4): rows sum to 1
local ATT = {
  { { 0.1, 0.2, 0.3, 0.4 }, { 0.25, 0.25, 0.25, 0.25 }, { 0.7, 0.1, 0.1, 0.1 } },
  { { 0.4, 0.3, 0.2, 0.1 }, { 0.05, 0.15, 0.3, 0.5 }, { 0.0, 1.0, 0.0, 0.0 } },
}

local function write_run(path, o)
  o = o or {}
  local f = pn.io.open(path, 'w')
  f:set_attr('/', 'experiment', o.experiment or 'synthetic')
  f:set_attr('/', 'config', '{"dataset":"none","lr":' .. (o.lr or 0.01) .. ',"seed":' .. (o.seed or 0) .. ',"tags":["a","b"],"nested":{"x":1.5e-3}}')
  f:set_attr('/', 'seed', o.seed or 0)
  f:set_attr('/', 'status', 'finished')
  f:set_attr('/', 'start_time', o.start or '2025-01-02T03:04:05Z')
  f:set_attr('/', 'end_time', '2025-01-02T03:09:05Z')
  f:set_attr('/', 'git_commit', 'deadbeef')
  f:set_attr('/', 'host', 'spec')
  local scale = o.scale or 1
  local loss = {}
  for i, v in ipairs(LOSS) do loss[i] = v * scale end
  f:write('metrics/loss', pn.tensor(loss, { dtype = 'f64' }))
  f:write('metrics/loss_step', pn.tensor(STEPS, { dtype = 'i64' }))
  f:write('metrics/val_acc', pn.tensor(VACC, { dtype = 'f64' }))
  f:write('metrics/val_acc_step', pn.tensor(STEPS, { dtype = 'i64' }))
  f:write('radii/layer1', pn.tensor(RADII))
  f:set_attr('radii/layer1', 'map', 'psi')
  f:set_attr('radii/layer1', 'score', 'umbral')
  f:write('attention/entropy_layer1', pn.tensor({ 0.9, 0.8 })) -- a 1-D summary, sorted first
  f:write('attention/words', pn.tensor(ATT))
  f:set_attr('attention/words', 'labels', table.concat({ 'the', 'cat', 'sat' }, '\n'))
  f:set_attr('attention/words', 'col_labels', table.concat(WORDS, '\n'))
  f:write('params/w', pn.ones({ 2, 3 }))
  f:write('summary/.keep', pn.zeros({ 0 }))
  local m = o.metric or 'acc' -- what the run monitors and reports (NMT: bleu)
  f:set_attr('summary', 'best_val_' .. m, 0.7 + 0.01 * (o.seed or 0))
  f:set_attr('summary', 'test_' .. m, o.test_acc or 0.65)
  f:set_attr('summary', 'epochs', 8)
  f:close()
end

local RUN1, RUN2 = tmpdir .. '/runs/synthetic/a-s0.h5', tmpdir .. '/runs/synthetic/b-s1.h5'
local CMP = tmpdir .. '/runs/compare/c.h5'
local CMP_ROWS = { { 'exp_b', { 0.8, 0.82, 0.78 } }, { 'exp_a', { 0.7, 0.74 } }, { 'exp_c', { 0.9 } } }
os.execute("mkdir -p '" .. tmpdir .. "/runs/synthetic' '" .. tmpdir .. "/runs/compare'")
write_run(RUN1, { seed = 0, test_acc = 0.65 })
write_run(RUN2, { seed = 1, scale = 2, test_acc = 0.69, start = '2025-01-03T00:00:00Z' })
do
  local h = pn.io.open(CMP, 'w')
  local md = { '| experiment | test acc | val acc | epochs | s/epoch | failed |', '|---|---|---|---|---|---|' }
  for _, r in ipairs(CMP_ROWS) do
    h:write(r[1] .. '/test_acc', pn.tensor(r[2], { dtype = 'f64' }))
    md[#md + 1] = '| ' .. r[1] .. ' | x | x | x | x | 0 |'
  end
  h:set_attr('/', 'seeds', 3)
  h:set_attr('/', 'table', table.concat(md, '\n') .. '\n')
  h:close()
end

-- a sweep table as experiments/nmt_ablation_dims.lua writes it (compare.sweep): per row the
-- seeds' test_bleu and the row's settings as attributes; root attributes x, series, rows
local ABL = tmpdir .. '/runs/ablation/dims.h5'
local ABL_ROWS = { -- name, score, qk_dim, test_bleu per seed (nil: every run failed, no arrays)
  { 'dot qk_dim=64', 'dot', 64, { 31.0, 31.4, 31.2 } }, { 'dot qk_dim=16', 'dot', 16, { 30.1, 30.5, 29.9 } },
  { 'umbral qk_dim=16', 'umbral', 16, { 31.5, 31.1 } }, { 'umbral qk_dim=32', 'umbral', 32, nil },
  { 'umbral qk_dim=64', 'umbral', 64, { 32.0, 32.2, 31.9 } },
}
os.execute("mkdir -p '" .. tmpdir .. "/runs/ablation'")
do
  local h = pn.io.open(ABL, 'w')
  local names = {}
  for _, r in ipairs(ABL_ROWS) do
    names[#names + 1] = r[1]
    if r[4] then
      h:write(r[1] .. '/test_bleu', pn.tensor(r[4], { dtype = 'f64' }))
      h:write(r[1] .. '/val_bleu', pn.tensor(r[4], { dtype = 'f64' }))
      h:set_attr(r[1], 'score', r[2])
      h:set_attr(r[1], 'qk_dim', r[3])
    end
  end
  h:set_attr('/', 'seeds', 3)
  h:set_attr('/', 'table', '| score | q/k width | test BLEU |\n|---|---|---|\n')
  h:set_attr('/', 'rows', table.concat(names, '\n'))
  h:set_attr('/', 'metric', 'bleu')
  h:set_attr('/', 'x', 'qk_dim')
  h:set_attr('/', 'series', 'score')
  h:set_attr('/', 'xlabel', 'q/k width per head')
  h:close()
end

local function data_of(kind, files, opts)
  local job = plot.prepare(kind, files, opts)
  local dir = tmpdir .. '/data-' .. kind
  os.execute("mkdir -p '" .. dir .. "'")
  local paths = plot.write_data(job, dir)
  return job, paths
end

-- ---- runs.lua --------------------------------------------------------------------------------
describe('run files', function()
  it('decodes the JSON config', function()
    local v = runs.json_decode('{"a":1,"b":[true,false,null,"x\\ny"],"c":{"d":-2.5e-3},"e":"q\\"\\u00e9"}')
    assert.equal(1, v.a)
    assert.same({ true, false }, { v.b[1], v.b[2] })
    assert.equal('x\ny', v.b[4])
    assert.equal(-2.5e-3, v.c.d)
    assert.equal('q"é', v.e)
    local ok, err = pcall(runs.json_decode, '{"a":}')
    assert.is_false(ok)
    assert.truthy(tostring(err):find('json:', 1, true))
  end)

  it('opens a run: metadata, config, summary, metrics with steps, tags', function()
    local r = runs.open(RUN2)
    assert.equal('synthetic', r.experiment)
    assert.equal(1, r.seed)
    assert.equal('finished', r.status)
    assert.equal(0.01, r.config.lr)
    assert.same({ 'a', 'b' }, r.config.tags)
    assert.equal(1.5e-3, r.config.nested.x)
    assert.equal(0.69, r.summary.test_acc)
    assert.same({ 'loss', 'val_acc' }, r:metric_names())
    local v, s = r:metric('loss')
    for i = 1, #LOSS do assert.truthy(near(2 * LOSS[i], v[i])) end
    assert.same(STEPS, s)
    assert.same({ 'layer1' }, r:tags('radii'))
    assert.same({ 'entropy_layer1', 'words' }, r:tags('attention'))
    assert.equal('synthetic s1', r:label())
    local ok, err = pcall(r.metric, r, 'nope')
    assert.is_false(ok)
    assert.truthy(tostring(err):find("no metric 'nope'", 1, true))
    assert.truthy(tostring(err):find('loss, val_acc', 1, true))
    r:close()
  end)

  it('lists runs with experiment, seed, status, best metric and date, oldest first', function()
    local rows = runs.list(tmpdir .. '/runs')
    local byp = {}
    for _, row in ipairs(rows) do byp[row.path] = row end
    assert.equal('compare', byp[CMP].kind)
    assert.equal('synthetic', byp[RUN1].experiment)
    assert.equal('best_val_acc', byp[RUN2].best_key)
    assert.truthy(near(0.71, byp[RUN2].best))
    local text = runs.format_list(rows, tmpdir .. '/runs')
    local l1 = text:find('synthetic%s+0%s+finished%s+val_acc 0%.7000%s+acc 0%.6500%s+8%s+2025%-01%-02 03:04')
    local l2 = text:find('synthetic%s+1%s+finished%s+val_acc 0%.7100%s+acc 0%.6900%s+8%s+2025%-01%-03 00:00')
    assert.truthy(l1, text)
    assert.truthy(l2, text)
    assert.truthy(l1 < l2)
    assert.truthy(text:find('(compare table)', 1, true))
  end)

  it('the test column and compare\'s default metric follow what a run monitors (NMT: BLEU)', function()
    local dir = tmpdir .. '/runs_bleu'
    os.execute("mkdir -p '" .. dir .. "'")
    local a, b = dir .. '/a-s0.h5', dir .. '/a-s1.h5'
    write_run(a, { seed = 0, metric = 'bleu', test_acc = 31.5 })
    write_run(b, { seed = 1, metric = 'bleu', test_acc = 32.5 })
    local rows = runs.list(dir)
    assert.equal('test_bleu', rows[1].test_key)
    assert.truthy(runs.format_list(rows, dir):find('val_bleu 0%.7000%s+bleu 31%.5000'))
    local job = plot.prepare('compare', { a, b }, {}) -- no --metric: test_bleu, not a missing test_acc
    assert.equal(1, #job.rows)
    assert.truthy(near(32, job.rows[1].mean))
    job = plot.prepare('compare', { ABL }, {}) -- a sweep table of BLEU rows
    assert.equal(4, #job.rows)
    assert.truthy(near(31.2, job.rows[1].mean))
    job = plot.prepare('compare', { RUN1, RUN2 }, {}) -- accuracy runs keep test_acc
    assert.truthy(near(0.67, job.rows[1].mean))
  end)

  it('shows config, summary and the datasets with their shapes', function()
    local text = runs.show(RUN1)
    assert.truthy(text:find('experiment%s+synthetic'))
    assert.truthy(text:find('config\n'))
    assert.truthy(text:find('lr%s+0%.01'))
    assert.truthy(text:find('summary\n'))
    assert.truthy(text:find('test_acc%s+0%.65'))
    assert.truthy(text:find('/attention/words%s+f32%s+%[2,3,4%]'))
    assert.truthy(text:find('/radii/layer1%s+f32%s+%[5,2%]'))
    assert.truthy(text:find('/metrics/loss%s+f64%s+%[8%]'))
    assert.truthy(text:find('labels=3 labels', 1, true))
    local ok, err = pcall(runs.show, tmpdir .. '/missing.h5')
    assert.is_false(ok)
    assert.truthy(tostring(err):find('no such file', 1, true))
  end)
end)

-- ---- the data gnuplot gets ----------------------------------------------------------------------
describe('plot data files', function()
  it('curves: steps, values and a trailing moving average per run and metric', function()
    local job, paths = data_of('curves', { RUN1, RUN2 }, { metric = 'loss,val_acc', smooth = 3 })
    local blocks = parse_blocks(read_file(paths.datafile))
    assert.equal(4, #blocks)   -- (run 1: loss, val_acc), (run 2: loss, val_acc)
    local expect = { { LOSS, 1 }, { VACC, 1 }, { LOSS, 2 }, { VACC, 1 } }
    for b, e in ipairs(expect) do
      local values, scale = e[1], e[2]
      assert.equal(#values, #blocks[b])
      for i, row in ipairs(blocks[b]) do
        local lo = math.max(1, i - 2)
        local s = 0
        for k = lo, i do s = s + values[k] * scale end
        assert.equal(STEPS[i], row.numbers[1])
        assert.truthy(near(values[i] * scale, row.numbers[2]))
        assert.truthy(near(s / (i - lo + 1), row.numbers[3]))
      end
    end
    local vars = {}
    for _, kv in ipairs(job.vars) do vars[kv[1]] = kv[2] end
    assert.same({ 'synthetic s0 loss', 'synthetic s0 val_acc', 'synthetic s1 loss', 'synthetic s1 val_acc' }, vars.titles)
    assert.equal('epoch', vars.xlab)
    assert.truthy(vars.plot_title:find('moving average over 3', 1, true))
    assert.equal(RUN1:gsub('%.h5$', '') .. '.curves.png', job.default_out)
  end)

  it('curves: a missing metric is an error naming the ones there are', function()
    local ok, err = pcall(plot.prepare, 'curves', { RUN1 }, { metric = 'bleu' })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('plot: curves', 1, true))
    assert.truthy(tostring(err):find('no metric bleu (it has: loss, val_acc)', 1, true))
  end)

  it('radius: one histogram per run over shared bins, counts add up to the values', function()
    local _, paths = data_of('radius', { RUN1, RUN2 }, { bins = 4 })
    local blocks = parse_blocks(read_file(paths.datafile))
    assert.equal(2, #blocks)
    local values = {}
    for _, row in ipairs(RADII) do for _, v in ipairs(row) do values[#values + 1] = v end end
    local lo, hi = 0.1, 3.0
    local counts = { 0, 0, 0, 0 }
    for _, v in ipairs(values) do
      local b = math.min(4, math.floor((v - lo) / ((hi - lo) / 4)) + 1)
      counts[b] = counts[b] + 1
    end
    for _, rows in ipairs(blocks) do
      assert.equal(4, #rows)
      for b, row in ipairs(rows) do
        local a, z = lo + (b - 1) * (hi - lo) / 4, lo + b * (hi - lo) / 4
        assert.truthy(near((a + z) / 2, row.numbers[1], 1e-5))
        assert.equal(counts[b], row.numbers[2])
        assert.truthy(near(a, row.numbers[3], 1e-5))
        assert.truthy(near(z, row.numbers[4], 1e-5))
      end
    end
  end)

  it('radius: --density integrates to one; --logx bins in log space', function()
    local _, paths = data_of('radius', { RUN1 }, { bins = 5, density = true })
    local rows = parse_blocks(read_file(paths.datafile))[1]
    local area = 0
    for _, row in ipairs(rows) do area = area + row.numbers[2] * (row.numbers[4] - row.numbers[3]) end
    assert.truthy(near(1, area, 1e-6))
    _, paths = data_of('radius', { RUN1 }, { bins = 2, logx = true })
    rows = parse_blocks(read_file(paths.datafile))[1]
    local mid = math.sqrt(0.1 * 3.0)   -- the log-space midpoint of [0.1, 3]
    assert.truthy(near(mid, rows[1].numbers[4], 1e-5))
    local n_low = 0
    for _, row in ipairs(RADII) do for _, v in ipairs(row) do if v < mid then n_low = n_low + 1 end end end
    assert.equal(n_low, rows[1].numbers[2])
  end)

  it('heatmap: the chosen head cell by cell, with the labels from the attributes', function()
    local job, paths = data_of('heatmap', { RUN1 }, { head = 2 })
    local rows = parse_blocks(read_file(paths.datafile))[1]
    assert.equal(12, #rows)
    for _, row in ipairs(rows) do
      local j, i, v = row.numbers[1], row.numbers[2], row.numbers[3]
      assert.truthy(near(ATT[2][i][j], v, 1e-6))
    end
    local labels = parse_blocks(read_file(paths.labelfile))
    assert.equal(2, #labels)
    for j, row in ipairs(labels[1]) do
      assert.equal(j, row.numbers[1])
      assert.equal(WORDS[j], row.strings[1])
    end
    assert.same({ 'the', 'cat', 'sat' }, { labels[2][1].strings[1], labels[2][2].strings[1], labels[2][3].strings[1] })
    local vars = {}
    for _, kv in ipairs(job.vars) do vars[kv[1]] = kv[2] end
    assert.equal(3, vars.nq)
    assert.equal(4, vars.nk)
    assert.truthy(vars.plot_title:find('head 2 of 2', 1, true))
    local ok, err = pcall(plot.prepare, 'heatmap', { RUN1 }, { head = 3 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('--head must be a whole number in 1..2 for /attention/words [2,3,4], got 3', 1, true),
      tostring(err))
    -- a value that is not a number is named, never read as the default (--smooth abc drew unsmoothed)
    for _, c in ipairs({ { 'heatmap', { head = 'abc' }, '--head must be a whole number' },
                         { 'curves', { smooth = 'abc' }, '--smooth must be a positive integer, got abc' },
                         { 'compare', { ymin = 'abc' }, '--ymin must be a number, got abc' },
                         { 'radius', { bins = 'x' }, '--bins must be a positive integer, got x' } }) do
      ok, err = pcall(plot.prepare, c[1], { RUN1 }, c[2])
      assert.is_false(ok, c[1])
      assert.truthy(tostring(err):find(c[3], 1, true), tostring(err))
    end
    ok, err = pcall(plot.prepare, 'heatmap', { RUN1 }, { tag = 'nope' })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('no /attention/nope (tags: entropy_layer1, words)', 1, true))
  end)

  it('compare: mean ± std per experiment in the table order, from a compare file or run files', function()
    local _, paths = data_of('compare', { CMP }, {})
    local rows = parse_blocks(read_file(paths.datafile))[1]
    assert.equal(#CMP_ROWS, #rows)
    for i, r in ipairs(CMP_ROWS) do
      local xs = r[2]
      local m = 0
      for _, x in ipairs(xs) do m = m + x end
      m = m / #xs
      local v = 0
      for _, x in ipairs(xs) do v = v + (x - m) ^ 2 end
      local s = #xs > 1 and math.sqrt(v / (#xs - 1)) or 0
      assert.equal(i, rows[i].numbers[1])
      assert.equal(r[1], rows[i].strings[1])
      assert.truthy(near(m, rows[i].numbers[2]))
      assert.truthy(near(s, rows[i].numbers[3]))
      assert.equal(#xs, rows[i].numbers[4])
    end
    _, paths = data_of('compare', { RUN1, RUN2 }, {})
    rows = parse_blocks(read_file(paths.datafile))[1]
    assert.equal(1, #rows)
    assert.equal('synthetic', rows[1].strings[1])
    assert.truthy(near(0.67, rows[1].numbers[2]))
    assert.truthy(near(math.sqrt(2 * 0.02 ^ 2), rows[1].numbers[3]))
    local ok, err = pcall(plot.prepare, 'compare', { RUN1 }, { metric = 'bleu' })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('no summary value bleu', 1, true))
  end)

  it('compare: run files of one experiment with different configs are separate bars, named by the difference', function()
    -- files from before the variant attribute: the config tells the groups apart
    local run3 = tmpdir .. '/runs/synthetic/c-s0.h5'
    write_run(run3, { seed = 0, lr = 0.02, test_acc = 0.9 })
    local job, paths = data_of('compare', { RUN1, run3, RUN2 }, {})
    local rows = parse_blocks(read_file(paths.datafile))[1]
    assert.equal(2, #rows)
    assert.equal('synthetic lr=0.01', rows[1].strings[1])
    assert.equal(2, rows[1].numbers[4])
    assert.equal('synthetic lr=0.02', rows[2].strings[1])
    assert.equal(1, rows[2].numbers[4])
    assert.truthy(near(0.9, rows[2].numbers[2]))
    local vars = {}
    for _, kv in ipairs(job.vars) do vars[kv[1]] = kv[2] end
    assert.truthy(vars.plot_title:find('counts under the bars', 1, true), vars.plot_title)
    -- a bad file among good ones is skipped with a warning (as curves does), not fatal
    local junk = tmpdir .. '/runs/synthetic/junk.h5'
    local f = io.open(junk, 'w'); f:write('not hdf5'); f:close()
    job = plot.prepare('compare', { junk, RUN1, tmpdir .. '/runs/none.h5' }, {})
    assert.equal(1, #job.rows)
    assert.equal(2, #job.warnings)
    assert.truthy(job.warnings[1]:find('junk.h5', 1, true))
    assert.truthy(job.warnings[2]:find('none.h5', 1, true))
    -- one run: no spread claimed
    for _, kv in ipairs(job.vars) do vars[kv[1]] = kv[2] end
    assert.truthy(vars.plot_title:find('one run each (no spread)', 1, true), vars.plot_title)
    assert.is_nil(vars.plot_title:find('± 0', 1, true))
    local ok, err = pcall(plot.prepare, 'compare', { junk }, {})
    assert.is_false(ok)
    assert.truthy(tostring(err):find('no readable run file', 1, true))
    os.remove(run3)
    os.remove(junk)
  end)

  it('ablation: one line per series, points in x order with mean ± std and count; failed rows left out', function()
    local job, paths = data_of('ablation', { ABL }, {})
    local blocks = parse_blocks(read_file(paths.datafile))
    assert.equal(2, #blocks)
    local function stats(xs)
      local m = 0
      for _, x in ipairs(xs) do m = m + x end
      m = m / #xs
      local v = 0
      for _, x in ipairs(xs) do v = v + (x - m) ^ 2 end
      return m, math.sqrt(v / (#xs - 1))
    end
    -- series in the order the rows name them first; within one, sorted by x
    local want = { { ABL_ROWS[2], ABL_ROWS[1] }, { ABL_ROWS[3], ABL_ROWS[5] } }
    for b, rows in ipairs(want) do
      assert.equal(#rows, #blocks[b])
      for i, r in ipairs(rows) do
        local m, sd = stats(r[4])
        local got = blocks[b][i].numbers
        assert.equal(r[3], got[1])
        assert.truthy(near(m, got[2]), tostring(got[2]))
        assert.truthy(near(sd, got[3]), tostring(got[3]))
        assert.equal(#r[4], got[4])
      end
    end
    local vars = {}
    for _, kv in ipairs(job.vars) do vars[kv[1]] = kv[2] end
    assert.same({ 'dot', 'umbral' }, vars.titles)
    assert.same({ 16, 64 }, vars.xs)
    assert.equal(1, vars.logx)      -- 16..64: a log2 axis
    assert.equal('test_bleu', vars.ylab)
    assert.equal('q/k width per head', vars.xlab)
    assert.truthy(vars.plot_title:find('counts differ', 1, true), vars.plot_title)
    assert.equal(1, #job.warnings)
    assert.truthy(job.warnings[1]:find('umbral qk_dim=32 has no test_bleu', 1, true), job.warnings[1])
    assert.equal(ABL:gsub('%.h5$', '') .. '.ablation.png', job.default_out)
    -- --series: another attribute names the lines (one line here: the rows' qk_dim as series)
    job = plot.prepare('ablation', { ABL }, { series = 'qk_dim' })
    assert.equal(2, #job.series)   -- 64, 16 (first seen), each over both scores
    -- the compare kind draws the same table as bars, in its rows order
    job = plot.prepare('compare', { ABL }, { metric = 'test_bleu' })
    local order = {}
    for i, r in ipairs(job.rows) do order[i] = r.name end
    assert.same({ 'dot qk_dim=64', 'dot qk_dim=16', 'umbral qk_dim=16', 'umbral qk_dim=64' }, order)
    -- a run file, two files, or an unknown x attribute are errors
    local ok, err = pcall(plot.prepare, 'ablation', { RUN1 }, {})
    assert.is_false(ok)
    assert.truthy(tostring(err):find('is a run file', 1, true), tostring(err))
    ok, err = pcall(plot.prepare, 'ablation', { ABL, ABL }, {})
    assert.is_false(ok)
    assert.truthy(tostring(err):find('one table at a time', 1, true), tostring(err))
    ok, err = pcall(plot.prepare, 'ablation', { ABL }, { x = 'width' })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("has no number attribute 'width'", 1, true), tostring(err))
  end)

  it('rejects unknown kinds, missing files and no files', function()
    local ok, err = pcall(plot.prepare, 'pie', { RUN1 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("unknown kind 'pie'", 1, true))
    ok, err = pcall(plot.prepare, 'curves', { tmpdir .. '/none.h5' })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('no such file', 1, true))
    ok, err = pcall(plot.prepare, 'curves', {})
    assert.is_false(ok)
    assert.truthy(tostring(err):find('no run files', 1, true))
  end)
end)

-- ---- pictures ---------------------------------------------------------------------------------
describe('plot pictures', function()
  local cases = {
    { 'curves', { RUN1, RUN2 }, { metric = 'loss,val_acc', smooth = 2 } },
    { 'radius', { RUN1, RUN2 }, {} },
    { 'heatmap', { RUN1 }, { head = 1 } },
    { 'compare', { CMP }, {} },
    { 'ablation', { ABL }, {} },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. ': a PNG of the requested size and an SVG', function()
      if not HAVE_GNUPLOT then pending('gnuplot is not installed (Debian: gnuplot-nox)'); return end
      local png = tmpdir .. '/pic-' .. c[1] .. '.png'
      local o = {}
      for k, v in pairs(c[3]) do o[k] = v end
      o.out, o.size = png, '640x480'
      assert.equal(png, plot.plot(c[1], c[2], o))
      local s = read_file(png)
      assert.truthy(s and #s > 1000)
      local w, h = png_size(s)
      assert.equal(640, w)
      assert.equal(480, h)
      local svg = tmpdir .. '/pic-' .. c[1] .. '.svg'
      o.out = svg
      plot.plot(c[1], c[2], o)
      local t = read_file(svg)
      assert.truthy(t and #t > 500)
      assert.truthy(t:find('^%s*<%?xml') or t:find('^%s*<svg'))
      assert.truthy(t:find('</svg>', 1, true))
    end)
  end

  it('writes next to the run file by default', function()
    if not HAVE_GNUPLOT then pending('gnuplot is not installed (Debian: gnuplot-nox)'); return end
    local out = plot.curves(RUN1)
    assert.equal(RUN1:gsub('%.h5$', '') .. '.curves.png', out)
    assert.truthy(exists(out))
    out = plot.heatmap(RUN1, { head = 2 })
    assert.equal(RUN1:gsub('%.h5$', '') .. '.heatmap-words-h2.png', out)
    assert.truthy(exists(out))
  end)

  it('a missing gnuplot is an error, and no picture is left', function()
    local saved = plot.gnuplot
    plot.gnuplot = tmpdir .. '/no-such-gnuplot'
    local out = tmpdir .. '/never.png'
    local ok, err = pcall(plot.plot, 'curves', { RUN1 }, { out = out })
    plot.gnuplot = saved
    assert.is_false(ok)
    assert.truthy(tostring(err):find('cannot run gnuplot', 1, true))
    assert.truthy(tostring(err):find('gnuplot-nox', 1, true))
    assert.is_false(exists(out))
  end)

  it('a failing gnuplot script is an error carrying its stderr, and no picture is left', function()
    if not HAVE_GNUPLOT then pending('gnuplot is not installed (Debian: gnuplot-nox)'); return end
    local dir = tmpdir .. '/broken-plots'
    os.execute("mkdir -p '" .. dir .. "'")
    local f = io.open(dir .. '/curves.gp', 'w')
    f:write("plot datafile using 1:2 with lines\nthis_is_not_a_command 42\n")
    f:close()
    local saved = plot.scripts_dir
    plot.scripts_dir = dir
    local out = tmpdir .. '/broken.png'
    local ok, err = pcall(plot.plot, 'curves', { RUN1 }, { out = out })
    plot.scripts_dir = saved
    assert.is_false(ok)
    assert.truthy(tostring(err):find('gnuplot failed', 1, true))
    assert.truthy(tostring(err):find('invalid command', 1, true), tostring(err))
    assert.is_false(exists(out))
    local leftovers = sh("ls '" .. tmpdir .. "' | grep -c 'broken.tmp' || true")
    assert.equal('0', leftovers:match('%d+'))
  end)

  it('falls back to the libgd png terminal when gnuplot has no pngcairo', function()
    if not HAVE_GNUPLOT then pending('gnuplot is not installed (Debian: gnuplot-nox)'); return end
    if not (sh('gnuplot -e "set terminal"')):find('\n%s*png%s') then pending('this gnuplot has no png terminal'); return end
    -- a gnuplot that hides pngcairo from its terminal list
    local fake = tmpdir .. '/fake-gnuplot.sh'
    local f = io.open(fake, 'w')
    f:write('if [ "$1" = "-e" ]; then gnuplot "$@" 2>&1 | grep -v pngcairo; else exec gnuplot "$@"; fi\n')
    f:close()
    local saved, saved_notify = plot.gnuplot, plot.notify
    local notes = {}
    plot.gnuplot = "sh '" .. fake .. "'"
    plot.notify = function(msg) notes[#notes + 1] = msg end
    local out = tmpdir .. '/libgd.png'
    local ok, err = pcall(plot.plot, 'compare', { CMP }, { out = out, size = '500x400' })
    plot.gnuplot, plot.notify = saved, saved_notify
    assert.is_true(ok, tostring(err))
    assert.equal(1, #notes)
    assert.truthy(notes[1]:find('no pngcairo terminal; using png', 1, true))
    local w, h = png_size(read_file(out))
    assert.same({ 500, 400 }, { w, h })
    local term = plot.terminal_for(out, { 500, 400 })
    assert.truthy(term:find('pngcairo', 1, true))   -- the real gnuplot has it
  end)

  it('rejects an output name it cannot draw', function()
    if not HAVE_GNUPLOT then pending('gnuplot is not installed (Debian: gnuplot-nox)'); return end
    local ok, err = pcall(plot.plot, 'curves', { RUN1 }, { out = tmpdir .. '/x.jpg' })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('use a .png, .svg or .pdf', 1, true))
  end)
end)

-- ---- terminal pictures ------------------------------------------------------------------------------
describe('terminal pictures', function()
  local M3 = { { 0, 0.5, 1 }, { 0.25, 0.75, 0.5 }, { 1, 0, 0.25 } }

  it('heatmap of a 3×3 matrix in 256 colours matches the stored picture', function()
    local got = termplot.heatmap(M3, { color = '256', width = 80, row_labels = { 'a', 'b', 'c' },
      col_labels = { 'x', 'y', 'z' }, title = '3x3' })
    local want = read_file(ROOT .. '/spec/fixtures/heatmap_3x3.txt')
    assert.truthy(want, 'spec/fixtures/heatmap_3x3.txt is missing')
    assert.equal(want, got)
  end)

  it('heatmap: half-blocks coloured per cell, labels on their rows, a scale with the range', function()
    local got = termplot.heatmap(M3, { color = '256', width = 80, cell = 2, row_labels = { 'a', 'b', 'c' } })
    local lines = {}
    for l in got:gmatch('[^\n]+') do lines[#lines + 1] = l end
    -- cell 2: one text line per row; each line: label, space, 3 cells × 2 half-blocks
    for r, lab in ipairs({ 'a', 'b', 'c' }) do
      local line = lines[1 + r]
      assert.equal(lab .. ' ', line:sub(1, 2))
      local _, blocks = line:gsub('▀', '')
      assert.equal(6, blocks)
      -- the same colour for the upper and lower half of every cell (one row per line)
      local codes = {}
      for fg, bg in line:gmatch('\27%[38;5;(%d+)m\27%[48;5;(%d+)m') do
        assert.equal(fg, bg)
        codes[#codes + 1] = tonumber(fg)
      end
      assert.truthy(#codes >= 2)
    end
    -- equal values share a colour, the extremes differ
    local function cell_code(r, c)
      local line = lines[1 + r]
      local k = 0
      for fg in line:gmatch('\27%[38;5;(%d+)m') do k = k + 1; if k == c then return fg end end
    end
    assert.equal(cell_code(1, 1), cell_code(3, 2))   -- both 0
    assert.equal(cell_code(1, 3), cell_code(3, 1))   -- both 1
    assert.are_not.equal(cell_code(1, 1), cell_code(1, 3))
    assert.truthy(got:find('\n  0%s+0%.5%s+1\n'))
  end)

  it('heatmap in 24-bit colour uses RGB sequences; two rows share a line when large', function()
    local got = termplot.heatmap(M3, { color = 'truecolor', width = 80 })
    assert.truthy(got:find('\27[38;2;68;1;84m', 1, true))     -- viridis at 0
    assert.truthy(got:find('\27[48;2;253;231;37m', 1, true))  -- viridis at 1 as a lower half
    local big = {}
    for i = 1, 50 do big[i] = {}; for j = 1, 70 do big[i][j] = i + j end end
    local text = termplot.heatmap(big, { color = '256', width = 80 })
    assert.truthy(text:find('left label = upper half', 1, true))
    -- 50 rows at two per line: 25 grid lines
    local grid = 0
    for l in text:gmatch('[^\n]+') do if l:find('▀') and l:match('^%s*%d+ ') then grid = grid + 1 end end
    assert.equal(25, grid)
  end)

  it('hist counts values into bins', function()
    local text = termplot.hist({ 1, 2, 2, 3, 3, 3, 4, 4, 4, 4 }, { bins = 4, width = 8 })
    assert.truthy(text:find('n=10', 1, true))
    local counts = {}
    for c in text:gmatch('[%]%)] [█▏▎▍▌▋▊▉ ]* (%d+)\n') do counts[#counts + 1] = tonumber(c) end
    assert.same({ 1, 2, 3, 4 }, counts)
    assert.truthy(text:find('████████ 4', 1, true))
  end)
end)

-- ---- the commands ---------------------------------------------------------------------------------
describe('./bench plot, runs, show', function()
  local bench = ROOT .. '/bench'

  it('plot writes a picture and says where; errors go to stderr with exit 1', function()
    if not HAVE_GNUPLOT then pending('gnuplot is not installed (Debian: gnuplot-nox)'); return end
    local out = tmpdir .. '/cli.png'
    local text, code = sh(string.format("'%s' plot radius '%s' '%s' --bins 8 --out '%s'", bench, RUN1, RUN2, out))
    assert.equal(0, code, text)
    assert.truthy(text:find('wrote ' .. out, 1, true))
    assert.truthy(exists(out))
    text, code = sh(string.format("'%s' plot curves '%s' --colour red", bench, RUN1))
    assert.equal(1, code)
    assert.truthy(text:find("unknown option '--colour'", 1, true))
  end)

  it('runs lists the folder and show prints a file', function()
    local text, code = sh(string.format("'%s' runs '%s'", bench, tmpdir .. '/runs'))
    assert.equal(0, code, text)
    assert.truthy(text:find('synthetic%s+1%s+finished'))
    text, code = sh(string.format("'%s' show '%s'", bench, RUN2))
    assert.equal(0, code, text)
    assert.truthy(text:find('/radii/layer1', 1, true))
    text, code = sh(string.format("'%s' show '%s'", bench, tmpdir .. '/nope.h5'))
    assert.equal(1, code)
    assert.truthy(text:find('no such file', 1, true))
  end)
end)

teardown(function() os.execute("rm -rf '" .. tmpdir .. "'") end)

describe('plot and show from the command line', function()
  local home = os.getenv('PENUMBRA_HOME') or '.'
  local function run(cmd)
    local p = io.popen("cd '" .. home .. "' && " .. cmd .. ' 2>&1; echo "rc=$?"')
    local out = p:read('*a')
    p:close()
    return out
  end
  it('--out into a missing directory is a plain error, not gnuplot\'s', function()
    local out = run("./bench plot curves '" .. RUN1 .. "' --out /no/such/dir/x.png")
    assert.truthy(out:find('plot: the directory of --out /no/such/dir/x.png does not exist', 1, true), out)
    assert.truthy(out:find('rc=1', 1, true))
    assert.is_nil(out:find('gnuplot', 1, true))
  end)
  it('show on a file that is not a run: one message, no Lua file position', function()
    local path = os.tmpname()
    local f = io.open(path, 'w')
    f:write('not hdf5')
    f:close()
    local out = run("./bench show '" .. path .. "'")
    os.remove(path)
    assert.truthy(out:find('is not a readable HDF5 file', 1, true), out)
    assert.is_nil(out:find('%.lua:%d+:'), out)
  end)
end)
