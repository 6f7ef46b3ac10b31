-- The REPL (lua/penumbra/repl.lua): compiling and evaluating lines, a run file loaded as `run`
-- (config, metrics, attention, a GAT rebuilt from its checkpoint), the helpers, and the real
-- thing driven through a pseudo-terminal with tmux (Debian package tmux; skipped without it)
-- for each line editor that is available: plain io.read, readline through the FFI, rlwrap.
local pn = require 'penumbra'
local repl = require 'penumbra.repl'
local ffi = require 'ffi'

local ROOT = os.getenv('PENUMBRA_HOME') or '.'

local tmpdir
do
  local base = os.tmpname()
  os.remove(base)
  tmpdir = base .. '.replspec'
  os.execute("mkdir -p '" .. tmpdir .. "'")
end

local sh = require('spec.helpers.check').sh

local function have(cmd) return (sh('command -v ' .. cmd)):match('%S') ~= nil end

-- a small run file of a made-up experiment
local RUN = tmpdir .. '/toy-s3.h5'
do
  local f = pn.io.open(RUN, 'w')
  f:set_attr('/', 'experiment', 'toyexp')
  f:set_attr('/', 'config', '{"lr":0.5,"epochs":3,"name":"x"}')
  f:set_attr('/', 'seed', 3)
  f:set_attr('/', 'status', 'finished')
  f:write('metrics/loss', pn.tensor({ 3, 2, 1 }, { dtype = 'f64' }))
  f:write('metrics/loss_step', pn.tensor({ 1, 2, 3 }, { dtype = 'i64' }))
  f:write('attention/seq', pn.tensor({ { { 0.5, 0.5 }, { 0.9, 0.1 } } }))
  f:set_attr('attention/seq', 'labels', 'hello\nworld')
  f:write('radii/l1', pn.tensor({ 1, 2, 3, 4 }))
  f:write('params/weight', pn.ones({ 1, 3 }))
  f:close()
end

local function lines_of(s)
  local out = {}
  for l in s:gmatch('[^\n]+') do out[#out + 1] = l end
  return out
end

describe('repl: compiling and evaluating', function()
  it('compiles expressions, =expr, statements; tells incomplete chunks from errors', function()
    assert.is_function(repl.compile('1 + 1'))
    assert.is_function(repl.compile('=1 + 1'))
    assert.is_function(repl.compile('x = 1'))
    local f, why = repl.compile('for i = 1, 2 do')
    assert.is_nil(f)
    assert.equal('incomplete', why)
    f, why = repl.compile('f(1,')
    assert.equal('incomplete', why)
    f, why = repl.compile('x = = 1')
    assert.is_nil(f)
    assert.truthy(tostring(why):find('unexpected symbol', 1, true))
  end)

  it('prints values, survives errors, keeps globals, continues multi-line chunks', function()
    local out = repl.run_lines({
      '6 * 7', '=2 ^ 10', 'answer = 41', 'answer + 1', 'nil + 1', 'for i = 1, 3 do', '  answer = answer + i', 'end',
      'answer', 'local hidden = 5', 'hidden', 'pn.tensor({1, 2})', "{ a = 1, b = 'x' }", 'nil', 'error("boom")',
    })
    local l = lines_of(out)
    assert.equal('42', l[1])
    assert.equal('1024', l[2])
    assert.equal('42', l[3])
    assert.truthy(l[4]:find('^error: .*attempt to perform arithmetic'))
    assert.equal('47', l[5])
    assert.equal('nil', l[6])                                  -- locals do not persist
    assert.truthy(l[7]:find('tensor([1.0000, 2.0000]', 1, true))  -- __tostring
    assert.equal('{ a = 1, b = "x" }', l[8])
    assert.equal('nil', l[9])
    assert.truthy(l[10]:find('^error: .*boom'))
  end)
end)

describe('repl: a run file', function()
  it('loads config, metrics, attention and radii; says why there is no model', function()
    local run, notes = repl.load_run(RUN, { data = false })
    assert.equal(0.5, run.config.lr)
    assert.equal('x', run.config.name)
    assert.same({ 3, 2, 1 }, run.metrics.loss:totable())
    assert.same({ 1, 2, 3 }, run.steps.loss:totable())
    assert.same({ 2, 2 }, { run.attention.seq:shape()[2], run.attention.seq:shape()[3] })
    assert.is_nil(run.attention.other)
    assert.same({ 1, 2, 3, 4 }, run.radii.l1:totable())
    assert.is_nil(run.model)
    local text = table.concat(notes, '\n')
    assert.truthy(text:find("run.model: nil (experiment 'toyexp' names no recipe", 1, true), text)
    assert.truthy(text:find('run.attention {seq}', 1, true))
  end)

  it('rebuilds a GAT from the config and the checkpoint (recipe gat_planetoid)', function()
    local path = tmpdir .. '/gat-s0.h5'
    pn.manual_seed(1)
    local F, C = 12, 3
    local cfg = { dataset = 'cora', score = 'umbral', hidden = 4, heads = 2, out_heads = 1, dropout = 0.6,
                  attn_dropout = 0.6, gamma = 1, r = 0.1, qk_dim = 4, map = 'default' }
    local model = pn.nn.GAT(F, C, { score = 'umbral', hidden = 4, heads = 2, out_heads = 1, r = 0.1, qk_dim = 4 })
    local f = pn.io.open(path, 'w')
    f:set_attr('/', 'experiment', 'cora_umbral')
    f:set_attr('/', 'config', pn.experiment.json(cfg))
    f:set_attr('/', 'seed', 0)
    local sd = model:state_dict()
    for name, t in pairs(sd) do f:write('params/' .. name:gsub('%.', '/'), t) end
    f:close()
    local run, notes = repl.load_run(path, { data = false })
    assert.truthy(run.model, table.concat(notes, '\n'))
    assert.truthy(table.concat(notes, '\n'):find('GAT(12 → 3 classes, score=umbral)', 1, true))
    local sd2 = run.model:state_dict()
    local n = 0
    for name, t in pairs(sd) do
      n = n + 1
      assert.same(t:totable(), sd2[name]:totable())
    end
    assert.truthy(n >= 3)
    assert.is_false(run.model.training)
  end)

  it('rebuilds any recipe the run file names (attr recipe), with its own data loader', function()
    local path = tmpdir .. '/toyrecipe-s0.h5'
    pn.manual_seed(2)
    local model = pn.nn.Linear(5, 2)
    local f = pn.io.open(path, 'w')
    f:set_attr('/', 'experiment', 'anything')
    f:set_attr('/', 'recipe', 'spec.fixtures.toy_recipe')
    f:set_attr('/', 'config', pn.experiment.json({ features = 5, out = 2 }))
    for name, t in pairs(model:state_dict()) do f:write('params/' .. name:gsub('%.', '/'), t) end
    f:close()
    local run, notes = repl.load_run(path)
    local text = table.concat(notes, '\n')
    assert.truthy(run.model, text)
    assert.truthy(text:find('Linear(5 → 2) from /params (recipe spec.fixtures.toy_recipe)', 1, true), text)
    assert.equal(5, run.data.num_features)
    assert.truthy(text:find('run.data: toy (7 nodes, 5 features, 2 classes)', 1, true), text)
    assert.same(model.weight:totable(), run.model.weight:totable())
    -- data that describe themselves are described so (NMT data said "-1 nodes, -1 features")
    f = pn.io.open(path, 'a')
    f:set_attr('/', 'config', pn.experiment.json({ features = 5, out = 2, described = true }))
    f:close()
    run, notes = repl.load_run(path)
    text = table.concat(notes, '\n')
    assert.truthy(text:find('run.data: toy pairs: train 3, test 1 (toy)', 1, true), text)
    -- a recipe module that does not exist is named in the note, not a crash
    f = pn.io.open(path, 'a')
    f:set_attr('/', 'recipe', 'spec.fixtures.no_such_recipe')
    f:close()
    run, notes = repl.load_run(path)
    text = table.concat(notes, '\n')
    assert.is_nil(run.model)
    assert.truthy(text:find("recipe module 'spec.fixtures.no_such_recipe' cannot be loaded", 1, true), text)
  end)

  it('a file that is not a run: the reason, without a position inside repl.lua', function()
    local home = os.getenv('PENUMBRA_HOME') or '.'
    local p = io.popen(string.format("cd '%s' && ./bench repl README.md < /dev/null 2>&1", home))
    local out = p:read('*a')
    p:close()
    assert.truthy(out:find('could not open the run: runs: README.md is not a readable HDF5 file', 1, true), out)
    assert.falsy(out:find('.lua:', 1, true), out)
  end)

  it('writes no colour escape codes into a pipe unless asked for', function()
    local termplot = require 'penumbra.termplot'
    -- the specs' stdout is busted's pipe or file, not a terminal
    local ffi = require 'ffi'
    if ffi.C.isatty(1) == 1 then return pending('stdout is a terminal here') end
    local saved = os.getenv('PN_COLOR')
    assert.equal('ascii', saved == nil and termplot.color_mode() or 'ascii')
    local pic = termplot.heatmap({ { 1, 2 }, { 3, 4 } }, saved == nil and {} or { color = 'ascii' })
    assert.is_nil(pic:find('\27[', 1, true))
    assert.equal('256', termplot.color_mode('256')) -- an explicit choice still wins
  end)

  it('helpers: heatmap of a tag or tensor, hist, spark, plot, help', function()
    local run = repl.load_run(RUN, { data = false })
    local env = setmetatable({ pn = pn, run = run }, { __index = _G })
    local out = repl.run_lines({ "heatmap('seq', {color='256', width=60})" }, env)
    assert.truthy(out:find('/attention/seq head 1 of 1', 1, true))
    assert.truthy(out:find('hello', 1, true))
    assert.truthy(out:find('\27[38;5;', 1, true))
    out = repl.run_lines({ "heatmap(pn.tensor({{{1,2},{3,4}},{{5,6},{7,8}}}), {head=2, color='ascii', labels={'p','q'}})" }, env)
    assert.truthy(out:find('head 2 of 2', 1, true))
    assert.truthy(out:find('\n  5 +6\n') or out:find('5%s+6%.5%s+8'))
    out = repl.run_lines({ "heatmap(pn.ones({2,2,2}), {head=3})" }, env)
    assert.truthy(out:find('^error: .*head 3 out of range 1..2'))
    -- a number for the options is the head; a misspelt option is named, without a traceback
    out = repl.run_lines({ "heatmap(pn.tensor({{{1,2},{3,4}},{{5,6},{7,8}}}), 2)" }, env)
    assert.truthy(out:find('head 2 of 2', 1, true), out)
    out = repl.run_lines({ "heatmap('seq', {hed=1})" }, env)
    assert.truthy(out:find("heatmap: unknown option 'hed' (valid: batch", 1, true), out)
    assert.is_nil(out:find('traceback', 1, true), out)
    -- a runtime error keeps its line
    out = repl.run_lines({ 'local t; t.x = 1' }, env)
    assert.truthy(out:find("attempt to index local 't'", 1, true), out)
    out = repl.run_lines({ "hist('l1', {bins=2})" }, env)
    assert.truthy(out:find('n=4', 1, true))
    out = repl.run_lines({ "spark('loss')" }, env)
    assert.truthy(out:find('loss █', 1, true))
    out = repl.run_lines({ 'help()' }, env)
    for _, name in ipairs({ 'heatmap(', 'hist(', 'plot(', 'attend(', 'run.metrics', 'run.model' }) do
      assert.truthy(out:find(name, 1, true), name)
    end
    if have('gnuplot') then
      out = repl.run_lines({ "plot('curves', {out='" .. tmpdir .. "/r.png'})" }, env)
      assert.truthy(out:find('wrote ' .. tmpdir .. '/r.png', 1, true))
    end
    out = repl.run_lines({ 'attend{node=0}' }, env)
    assert.truthy(out:find('^error: .*attend: needs a GAT model'))
  end)

  it('attend: dense weights for tensors; a GAT node neighbourhood recomputed with the model', function()
    if not (pn.attention_weights and pn.graph_attention and pn.graph) then
      pending('fused attention (pn.attention_weights, pn.graph_attention) is not available'); return
    end
    local env = setmetatable({ pn = pn }, { __index = _G })
    repl.helpers(env, { EXIT = {}, write = function() end })
    pn.manual_seed(2)
    local w = env.attend(pn.randn({ 1, 2, 3, 4 }), pn.randn({ 1, 2, 5, 4 }))
    assert.same({ 1, 2, 3, 5 }, w:shape())
    for _, s in ipairs(w:sum(-1):reshape({ 6 }):totable()) do assert.truthy(math.abs(s - 1) < 1e-5) end
    -- node 0 with in-neighbours 1, 2, 3 (and a self loop); node 4 is elsewhere
    local N, F = 5, 6
    local g = pn.graph({ { 1, 0 }, { 2, 0 }, { 3, 0 }, { 0, 1 }, { 4, 3 } }, N)
    local x = pn.randn({ N, F })
    local model = pn.nn.GAT(F, 3, { score = 'gat', hidden = 4, heads = 2, out_heads = 1 })
    local att, labels = env.attend({ model = model, x = x, graph = g, node = 0 })
    assert.same({ 2, 4, 4 }, att:shape())
    assert.same({ '0', '1', '2', '3' }, labels)
    -- the node's own row covers its whole neighbourhood: it sums to one in every head
    for h = 1, 2 do
      local row = att:select(1, h):select(1, 1):totable()
      local s = 0
      for _, v in ipairs(row) do s = s + v end
      assert.truthy(math.abs(s - 1) < 1e-5)
    end
    -- node 2 has only its self loop among the shown nodes: weight 1 on itself
    assert.truthy(math.abs(att:select(1, 1):select(1, 3):totable()[3] - 1) < 1e-5)
    local ok, err = pcall(env.attend, { model = model, x = x, graph = g, node = 9 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('node 9 out of range 0..4', 1, true))
  end)
end)

-- ---- through a terminal ---------------------------------------------------------------------------
describe('repl in a terminal', function()
  local sock = 'pnspec-' .. tmpdir:match('[^/]+$'):gsub('%W', '')   -- unique per spec run
  local function tmux(args) return sh('TERM=xterm tmux -L ' .. sock .. ' ' .. args) end
  local function screen() return (tmux('capture-pane -p -J -S - -t s')) end
  local function sleep(s) os.execute('sleep ' .. s) end
  local function wait_for(fn, what)
    for _ = 1, 300 do
      local ok = fn()
      if ok then return ok end
      sleep(0.1)
    end
    error('timed out waiting for ' .. what .. '; screen:\n' .. screen())
  end
  local function count(hay, needle)
    local n, i = 0, 1
    while true do
      local j = hay:find(needle, i, true)
      if not j then return n end
      n, i = n + 1, j + #needle
    end
  end
  -- type a line and wait until the REPL prompts again ('pn> ' or, inside a chunk, '>> ')
  local function send(text)
    local before = screen()
    local prompts = count(before, 'pn> ') + count(before, '>> ')
    tmux("send-keys -t s -l '" .. text:gsub("'", "'\\''") .. "'")
    tmux('send-keys -t s Enter')
    wait_for(function()
      local now = screen()
      return count(now, 'pn> ') + count(now, '>> ') > prompts
    end, 'the prompt after ' .. text)
  end

  local editors = { 'plain', 'readline', 'rlwrap' }
  for _, editor in ipairs(editors) do
    it('evaluates, survives an error and exits cleanly on EOF (' .. editor .. ')', function()
      if not have('tmux') then pending('tmux is not installed (Debian: tmux)'); return end
      if editor == 'rlwrap' and not have('rlwrap') then pending('rlwrap is not installed (Debian: rlwrap)'); return end
      if editor == 'readline' and not (pcall(ffi.load, 'readline') or pcall(ffi.load, 'libreadline.so.8')) then
        pending('libreadline cannot be loaded'); return
      end
      tmux('kill-server')
      local _, code = tmux('new-session -d -s s -x 120 -y 40')
      assert.equal(0, code)
      tmux('set-option -t s remain-on-exit on')
      -- the shell reports the exit status on the screen (tmux itself sometimes reaps its
      -- pane's process late)
      local cmd = string.format("PN_REPL_EDITOR=%s PN_REPL_HISTORY='%s/history-%s' '%s/bench' repl '%s'; echo __exit=\\$?",
        editor, tmpdir, editor, ROOT, RUN)
      tmux("respawn-pane -k -t s \"" .. cmd .. "\"")
      local ok, err = pcall(function()
        wait_for(function() return screen():find('pn> ', 1, true) end, 'the prompt')
        assert.truthy(screen():find('run: ' .. RUN, 1, true))
        send('6 * 7')
        wait_for(function() return screen():find('\n42\n', 1, true) end, '42')
        send('nil + 1')
        wait_for(function() return screen():find('attempt to perform arithmetic', 1, true) end, 'the error')
        send('for i = 1, 2 do')
        send('print(run.config.lr * i * 100)')
        send('end')
        wait_for(function() return screen():find('\n50\n100\n', 1, true) end, 'the loop output')
        sleep(0.2)
        tmux('send-keys -t s C-d')
        local status = wait_for(function() return screen():match('__exit=(%d+)') end, 'the REPL to exit')
        assert.equal('0', status, screen())
      end)
      tmux('kill-server')
      if not ok then error(err, 0) end
    end)
  end
end)

teardown(function() os.execute("rm -rf '" .. tmpdir .. "'") end)
