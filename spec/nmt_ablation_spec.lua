-- experiments/nmt_ablation_dims.lua (Coneheads Fig. 4) at the tiniest size: two scores × two
-- q/k widths × one seed on 50 Multi30k pairs, one epoch. The table (Markdown + HDF5) must have
-- the rows asked for, with the numbers the run files hold; the figure must be a PNG, and
-- `./bench plot ablation` must draw the table; resume= keeps every finished run. Needs the
-- Multi30k files (../shared/datasets/multi30k_de_en) and gnuplot; pending without them.
local pn = require 'penumbra'

local ROOT = os.getenv('PENUMBRA_HOME') or '.'

local check = require 'spec.helpers.check'
local sh, read_file = check.sh, check.read_file

local HAVE_GNUPLOT = (sh('gnuplot -e "set terminal"')):find('Available terminal types') ~= nil
local HAVE_DATA = pcall(pn.data.load, 'multi30k')

local tmpdir
do
  local base = os.tmpname()
  os.remove(base)
  tmpdir = base .. '.ablation'
  os.execute("mkdir -p '" .. tmpdir .. "'")
end
teardown(function() os.execute("rm -rf '" .. tmpdir .. "'") end)

local ARGS = 'scores=dot,umbral dims=16,32 seeds=1 preset=small epochs=1 train_limit=50 eval_limit=5 threads=1'
local ROWS = { { 'dot', 16 }, { 'dot', 32 }, { 'umbral', 16 }, { 'umbral', 32 } }

local function driver(extra)
  return sh(string.format("cd '%s' && PENUMBRA_RUNS='%s' ./bench experiments/nmt_ablation_dims.lua %s %s", ROOT, tmpdir,
    ARGS, extra or ''))
end

local function lines_of(s)
  local t = {}
  for l in tostring(s):gmatch('[^\n]+') do t[#t + 1] = l end
  return t
end

describe('experiments/nmt_ablation_dims.lua', function()
  it('runs score × width, tabulates what the run files hold, draws the figure, and resumes', function()
    if not HAVE_DATA then pending('Multi30k is not on the dataset path (../shared/datasets/multi30k_de_en)'); return end
    if not HAVE_GNUPLOT then pending('gnuplot is not installed (Debian: gnuplot-nox)'); return end
    local out, code = driver()
    assert.equal(0, code, out)
    local md, h5 = out:match('saved (%S+%.md) and (%S+%.h5)')
    assert.truthy(md, out)
    assert.truthy(h5:find(tmpdir .. '/ablation/nmt_ablation_dims-', 1, true), h5)
    local png = out:match('wrote (%S+%.png)')
    assert.equal(h5:gsub('%.h5$', '.png'), png)
    assert.equal('\137PNG', read_file(png):sub(1, 4))
    -- progress: one line per run, counted
    for i = 1, 4 do assert.truthy(out:find('[' .. i .. '/4]', 1, true), out) end

    local root = pn.io.attrs(h5, '/')
    assert.equal('finished', root.status)
    assert.equal('bleu', root.metric)
    assert.equal('qk_dim', root.x)
    assert.equal('score', root.series)
    assert.equal(1, root.seeds)
    local names = {}
    for i, r in ipairs(ROWS) do names[i] = r[1] .. ' qk_dim=' .. r[2] end
    assert.same(names, lines_of(root.rows))
    assert.equal(read_file(md), root.table)

    local f = pn.io.open(h5, 'r')
    local params = {}
    for i, r in ipairs(ROWS) do
      local name = names[i]
      local ga = f:attrs(name)
      assert.equal(r[1], ga.score)
      assert.equal(r[2], ga.qk_dim)
      assert.equal(0, ga.failed)
      local paths = lines_of(ga.runs)
      assert.equal(1, #paths)
      -- the run file: the score and width asked for, finished, and the numbers in the table
      local run = pn.io.attrs(paths[1], '/')
      assert.equal('finished', run.status)
      local cfg = require('penumbra.json').decode(run.config)
      assert.equal(r[1], cfg.score)
      assert.equal(r[2], cfg.qk_dim)
      assert.equal(0, cfg.seed)
      local s = pn.io.attrs(paths[1], 'summary')
      assert.same({ s.test_bleu }, f:read(name .. '/test_bleu'):totable())
      assert.same({ s.val_bleu }, f:read(name .. '/val_bleu'):totable())
      assert.same({ s.seconds_per_epoch }, f:read(name .. '/seconds_per_epoch'):totable())
      assert.same({ 0 }, f:read(name .. '/seed'):totable())
      assert.same({ run.parameters }, f:read(name .. '/parameters'):totable())
      params[name] = run.parameters
      -- the Markdown row says the same
      local row = string.format('| %s | %d | %.2f (1 run) | %.2f | %d | %.2f | 1 | 0 |', r[1], r[2], s.test_bleu, s.val_bleu,
        run.parameters, s.seconds_per_epoch)
      assert.truthy(root.table:find(row, 1, true), row .. '\n' .. root.table)
    end
    f:close()
    -- the width really changed: wider q/k projections, more parameters
    assert.truthy(params['dot qk_dim=32'] > params['dot qk_dim=16'])
    assert.equal(params['dot qk_dim=16'], params['umbral qk_dim=16'])

    -- ./bench plot draws the table
    local fig = tmpdir .. '/fig.png'
    local text, rc = sh(string.format("cd '%s' && ./bench plot ablation '%s' --out '%s'", ROOT, h5, fig))
    assert.equal(0, rc, text)
    assert.equal('\137PNG', read_file(fig):sub(1, 4))

    -- resume: every run is kept, none runs again, the numbers are the same
    local out2, code2 = driver("plot=false resume='" .. h5 .. "'")
    assert.equal(0, code2, out2)
    local _, kept = out2:gsub(': kept test bleu ', '')
    assert.equal(4, kept, out2)
    assert.is_nil(out2:find(' … ', 1, true), out2)
    local h5b = out2:match('saved %S+%.md and (%S+%.h5)')
    assert.are_not.equal(h5, h5b)
    for _, name in ipairs(names) do
      assert.same(pn.io.load(h5, name .. '/test_bleu'):totable(), pn.io.load(h5b, name .. '/test_bleu'):totable())
    end
    -- resume with other keys for every run is refused
    local out3, code3 = driver("epochs=2 resume='" .. h5 .. "'")
    assert.equal(1, code3)
    assert.truthy(out3:find('pass the same keys or drop resume=', 1, true), out3)
  end)
end)
