-- penumbra.compare — `./bench compare experiments/cora_*.lua seeds=10 [metric=acc] [key=value …]`:
-- runs every script over seeds 0..seeds-1 (other key=value pairs are passed to each run),
-- then prints a table — attention, test <metric> mean ± std, val <metric>, epochs (steps),
-- seconds per epoch, and the attention entropy when the runs report attn_entropy (1 = uniform
-- attention) — and saves it as Markdown and HDF5 under runs/compare/. The metric is what the
-- runs report as test_<metric> and val_<metric>: acc (the default) or, for the NMT runs, bleu
-- (`./bench compare experiments/nmt_multi30k_{dot,umbral}.lua metric=bleu`); without metric=, a
-- first run with no test_acc sets it to the metric that run monitors (bleu for NMT). reuse=true
-- takes a finished run with the same settings and seed from the runs folder instead of running
-- it (experiment.lua: every config key but threads and quiet must agree; the newest wins).
--
-- The pieces, also for drivers that run a grid of settings (experiments/nmt_ablation_*.lua):
--   compare.run_row(row, seeds, overrides, opts)  one script over seeds into row.test, row.val, …
--   compare.cell(xs, digits)                      'mean ± std' | 'value (1 run)' | '–' (none)
--   compare.save(md, rows, opts)                  the table's Markdown and HDF5 files
--   compare.sweep(def)                            rows of (script, overrides) over seeds: progress,
--                                                 the table rewritten after every run, resume=,
--                                                 a figure (see M.sweep)
local pn = require 'penumbra'

local M = {}

local mean_std = require('penumbra.stats').mean_std
M.mean_std = mean_std

-- decimals of a metric in tables and progress lines (BLEU and chrF are 0–100 scores)
M.DIGITS = { bleu = 2, chrf = 2 }
local function digits_of(metric) return M.DIGITS[metric] or 4 end
-- a metric's name in table headers
M.TITLES = { bleu = 'BLEU', chrf = 'chrF' }
local function title_of(metric) return M.TITLES[metric] or metric end

-- reuse=true|false on a compare or sweep command line (see run_row's opts.reuse)
local function reuse_of(who, v)
  if v == nil or v == 'false' or v == '0' then return false end
  if v == 'true' or v == '1' then return true end
  error(who .. ": reuse must be true or false, got '" .. tostring(v) .. "'", 0)
end

local function run_one(script, overrides)
  local prev = rawget(_G, 'args')
  _G.args = overrides
  local ok, res = pcall(dofile, script)
  _G.args = prev
  if not ok then return nil, tostring(res) end
  return res
end

-- mean ± std of xs with `digits` decimals; one value has no spread ('0.8300 (1 run)'), none is '–'
function M.cell(xs, digits)
  local d = digits or 4
  if #xs == 0 then return '–' end
  local m, s = mean_std(xs)
  if #xs == 1 then return string.format('%.' .. d .. 'f (1 run)', m) end
  return string.format('%.' .. d .. 'f ± %.' .. d .. 'f', m, s)
end

-- One script over seeds 0..seeds-1 with overrides (strings, as from the command line), gathered
-- into row (its name and script are given; the rest is filled in):
--   row.test, row.val     test_<metric> and val_<metric> of the finished runs
--   row.epochs, row.spe   their epochs (steps) and seconds per epoch (step); row.unit
--   row.ent, row.base     attn_entropy and baseline of the runs that report them
--   row.seeds, row.results, row.variant   the finished runs' seeds, result tables, variant
--   row.failed            how many failed
-- opts: metric ('acc'; with metric_auto, 'acc' until a run reports no test_acc: then the metric it
-- monitors, best_val_<m> with a test_<m>, and opts.metric is set to it); who ('compare': progress and errors start with it); counter ({k=, n=}:
-- '[k/n]' before each run); done ({[seed] = result}: results kept from an earlier table, not run
-- again); failures (a list that gets 'name seed s: why'); after(row) (called after each seed);
-- stop_on_interrupt (Ctrl-C ends the row with an error instead of going on to the next seed);
-- reuse (a finished run with the same settings and seed is taken instead of run: experiment.lua).
-- A config error (a bad key or value: the same for every seed) and a finished run without
-- test_<metric> end it at once with an error.
function M.run_row(row, seeds, overrides, opts)
  opts = opts or {}
  local metric, who = opts.metric or 'acc', opts.who or 'compare'
  local d = digits_of(metric)
  local failures = opts.failures or {}
  for _, k in ipairs({ 'test', 'val', 'epochs', 'spe', 'ent', 'base', 'seeds', 'results' }) do row[k] = row[k] or {} end
  row.failed = row.failed or 0
  local what = metric == 'acc' and 'test' or ('test ' .. metric)
  local function add(r, seed)
    local t = r['test_' .. metric]
    if type(t) ~= 'number' and opts.metric_auto and #row.test == 0 then
      -- no metric= given and the first result has no test_acc (NMT: BLEU): the test score of the
      -- metric it monitors, as ./bench runs shows it
      local key, v = require('penumbra.runs').test_of(r)
      if key then
        local m = key:gsub('^test_', '')
        metric, opts.metric = m, m
        d, what, t = digits_of(m), 'test ' .. m, v
      end
    end
    if type(t) ~= 'number' then
      local have = {}
      for k, v in pairs(r) do if type(v) == 'number' and k:match('^test_') then have[#have + 1] = k end end
      table.sort(have)
      io.stderr:write('\n')
      error(string.format("%s: %s reports no test_%s (it has: %s); choose one with metric=", who, row.name, metric,
        #have > 0 and table.concat(have, ', ') or 'none'), 0)
    end
    opts.metric_auto = false -- the table's metric is settled by its first result
    row.variant = r.variant or row.variant -- what it ran: 'cora_umbral epochs=20'
    row.test[#row.test + 1] = t
    row.val[#row.val + 1] = r['val_' .. metric] or 0 / 0
    -- epoch-based runs report epochs, step-based ones (online data) steps
    row.unit = r.steps and 'step' or 'epoch'
    row.epochs[#row.epochs + 1] = r.epochs or r.steps
    row.spe[#row.spe + 1] = r.seconds_per_epoch or r.seconds_per_step
    if r.baseline then row.base[#row.base + 1] = r.baseline end
    if r.attn_entropy then row.ent[#row.ent + 1] = r.attn_entropy end
    row.seeds[#row.seeds + 1] = seed
    row.results[#row.results + 1] = r
  end
  for seed = 0, seeds - 1 do
    local counter = ''
    if opts.counter then
      opts.counter.k = opts.counter.k + 1
      counter = string.format('[%d/%d] ', opts.counter.k, opts.counter.n)
    end
    local kept = opts.done and opts.done[seed]
    -- a run of an earlier table that stopped with a resume state: it goes on from there
    local go_on = not kept and opts.stopped and opts.stopped[seed]
    if kept then
      add(kept, seed)
      io.stderr:write(string.format('%s: %s%s seed %d/%d: kept %s %.' .. d .. 'f from %s\n', who, counter, row.name,
        seed + 1, seeds, what, row.test[#row.test], tostring(kept.path)))
    else
      local o = { seed = tostring(seed), _quiet = true }
      for k, v in pairs(overrides or {}) do o[k] = v end
      if go_on then o.resume = go_on end
      io.stderr:write(string.format('%s: %s%s seed %d/%d%s …', who, counter, row.name, seed + 1, seeds,
        go_on and (' (resumed: ' .. go_on .. ')') or ''))
      io.stderr:flush()
      -- the run's file goes into the table as soon as it exists: if the driver dies with the run (a
      -- session's end, SIGKILL), resume=<table> still finds it and goes on with it
      local exp = require 'penumbra.experiment'
      exp.on_open = function(path)
        row.stopped = row.stopped or {}
        row.stopped[seed] = path
        if opts.after then opts.after(row) end
      end
      exp.reuse = opts.reuse
      local r, err = run_one(row.script, o)
      exp.on_open, exp.reuse = nil, nil
      if row.stopped then row.stopped[seed] = nil end
      if r and r.status == 'finished' then
        add(r, seed)
        io.stderr:write(string.format(' %s %.' .. d .. 'f (%d %ss, %.1fs)%s\n', what, row.test[#row.test],
          r.epochs or r.steps, row.unit, r.seconds or 0 / 0, r.reused and (': reused ' .. r.path) or ''))
      else
        row.failed = row.failed + 1
        local why = tostring(err or (r and r.status)):gsub('\n.*', '')
        -- stopped with a resume state: a later resume= of the table goes on with it
        row.stopped = row.stopped or {}
        row.stopped[seed] = why:match('resume=(%S+)$')
        io.stderr:write(' FAILED: ' .. why .. '\n')
        failures[#failures + 1] = row.name .. ' seed ' .. seed .. ': ' .. why
        -- a config error (a bad key or value: the same for every seed) stops the compare at once
        if why:find('^experiment: ') then error(who .. ': ' .. failures[#failures], 0) end
        if opts.stop_on_interrupt and why:find('^experiment %S+ interrupted') then
          row.interrupted = true
          error(who .. ': ' .. failures[#failures], 0)
        end
      end
    end
    if opts.after then opts.after(row) end
  end
  return row
end

local function write_text(path, text)
  local f = io.open(path, 'w')
  if not f then return false end
  f:write(text)
  f:close()
  return true
end

local function f64(xs) return pn.tensor(xs, { dtype = 'f64' }) end

-- The table files <stem>.md (md) and <stem>.h5: for every row with finished runs the arrays
-- <name>/test_<metric>, <name>/val_<metric>, <name>/<unit>s, <name>/seconds_per_<unit> and
-- <name>/attn_entropy (when the runs report it), then row.arrays ({{name, values}, …}) and
-- row.attrs ({key = string | number}, attributes of the group <name>); the root attributes seeds,
-- table (md) and opts.attrs. Each file is written under a temporary name and renamed, so a table
-- rewritten after every run is never half there.
-- opts: stem (default <PENUMBRA_RUNS or runs>/compare/<UTC stamp>), metric ('acc'), unit (else
-- each row's), seeds, attrs. Returns the two paths.
function M.save(md, rows, opts)
  opts = opts or {}
  local metric = opts.metric or 'acc'
  local stem = opts.stem
  if not stem then
    local dir = (os.getenv('PENUMBRA_RUNS') or 'runs') .. '/compare'
    os.execute('mkdir -p "' .. dir .. '"')
    stem = dir .. '/' .. os.date('!%Y%m%dT%H%M%SZ')
  end
  local mdpath, h5path = stem .. '.md', stem .. '.h5'
  if write_text(mdpath .. '.tmp', md) then os.rename(mdpath .. '.tmp', mdpath) end
  local tmp = h5path .. '.tmp'
  local h = pn.io.open(tmp, 'w')
  local ok, e = pcall(function()
    for _, r in ipairs(rows) do
      if #r.test > 0 then
        local unit = opts.unit or r.unit or 'epoch'
        h:write(r.name .. '/test_' .. metric, f64(r.test))
        h:write(r.name .. '/val_' .. metric, f64(r.val))
        h:write(r.name .. '/' .. unit .. 's', f64(r.epochs))
        h:write(r.name .. '/seconds_per_' .. unit, f64(r.spe))
        if #r.ent > 0 then h:write(r.name .. '/attn_entropy', f64(r.ent)) end
        for _, a in ipairs(r.arrays or {}) do h:write(r.name .. '/' .. a[1], f64(a[2])) end
      elseif (r.attrs or {}).stopped and r.attrs.stopped ~= '' then
        h:write(r.name .. '/.keep', pn.zeros({ 0 })) -- no finished run yet; its stopped runs to resume
      end
      if h:exists(r.name) then
        local keys = {}
        for k in pairs(r.attrs or {}) do keys[#keys + 1] = k end
        table.sort(keys)
        for _, k in ipairs(keys) do h:set_attr(r.name, k, r.attrs[k]) end
      end
    end
    if opts.seeds then h:set_attr('/', 'seeds', opts.seeds) end
    h:set_attr('/', 'table', md)
    local keys = {}
    for k in pairs(opts.attrs or {}) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do h:set_attr('/', k, opts.attrs[k]) end
  end)
  h:close()
  if not ok then
    os.remove(tmp)
    error(e, 0)
  end
  local okr, er = os.rename(tmp, h5path)
  if not okr then error('compare: cannot write ' .. h5path .. ': ' .. tostring(er), 0) end
  return mdpath, h5path
end

function M.main(argv)
  local scripts, kv = {}, {}
  for _, a in ipairs(argv) do
    local k, v = a:match('^([%w_%.]+)=(.*)$')
    if k then kv[k] = v else scripts[#scripts + 1] = a end
  end
  if #scripts == 0 then error('compare: no experiment scripts given (e.g. ./bench compare experiments/cora_*.lua seeds=10)', 0) end
  -- every script readable before the first run: a typo in the last one should not wait for hours of runs
  for _, script in ipairs(scripts) do pn.io.read_text(script, 'compare') end
  local seeds = tonumber(kv.seeds or 3)
  if not seeds or seeds < 1 or seeds % 1 ~= 0 then
    error("compare: seeds must be a whole number >= 1, got '" .. tostring(kv.seeds) .. "'", 0)
  end
  kv.seeds = nil
  local metric = kv.metric or 'acc'
  if not metric:match('^[%w_]+$') then error("compare: metric must be a name such as acc or bleu, got '" .. metric .. "'", 0) end
  -- without metric=, acc unless the first run has none (then the metric it monitors, e.g. bleu)
  local ropts = { metric = metric, metric_auto = kv.metric == nil, failures = {}, reuse = reuse_of('compare', kv.reuse) }
  kv.metric, kv.reuse = nil, nil
  local failures = ropts.failures
  local rows = {}
  local unit = 'epoch'
  for _, script in ipairs(scripts) do
    local row = { name = script:match('([^/]+)%.lua$') or script, script = script }
    M.run_row(row, seeds, kv, ropts)
    row.name = row.variant or row.name
    unit = row.unit or unit
    rows[#rows + 1] = row
  end
  metric = ropts.metric
  local d = digits_of(metric)
  -- the attention-entropy column (experiments whose finish reports attn_entropy) when any has it
  local with_ent, with_base = false, false
  for _, r in ipairs(rows) do
    if #r.ent > 0 then with_ent = true end
    if #r.base > 0 then with_base = true end
  end
  -- runs that report a baseline (SPLP: the optimal constant predictor) get its column
  local m = title_of(metric)
  local lines = {
    string.format('| experiment | test %s (mean ± std, %d seeds) | val %s | %ss | s/%s |%s%s failed |', m, seeds, m, unit,
                  unit, with_ent and ' attn entropy |' or '', with_base and ' baseline |' or ''),
    '|---|---|---|---|---|' .. (with_ent and '---|' or '') .. (with_base and '---|' or '') .. '---|' }
  for _, r in ipairs(rows) do
    local vm = mean_std(r.val)
    local em = mean_std(r.epochs)
    local sm = mean_std(r.spe)
    local ent = ''
    if with_ent then ent = #r.ent > 0 and string.format(' %.3f |', (mean_std(r.ent))) or ' – |' end
    if with_base then ent = ent .. (#r.base > 0 and string.format(' %.4f |', (mean_std(r.base))) or ' – |') end
    lines[#lines + 1] = string.format('| %s | %s | %.' .. d .. 'f | %.0f | %.3f |%s %d |', r.name, M.cell(r.test, d), vm,
      em, sm, ent, r.failed)
  end
  local md = table.concat(lines, '\n') .. '\n'
  io.write(md)
  local mdpath, h5path = M.save(md, rows, { metric = metric, unit = unit, seeds = seeds })
  io.write('saved ' .. mdpath .. ' and ' .. h5path .. '\n')
  if #failures > 0 then -- the table is kept (it says how many failed), but the compare failed
    error(string.format('compare: %d run(s) failed; first: %s', #failures, failures[1]), 0)
  end
  return rows
end

-- ---- sweeps: a grid of settings over seeds, one table ------------------------------------------
-- split 'a,b, c' into {'a', 'b', 'c'}
function M.list(s)
  local out = {}
  for part in tostring(s):gmatch('[^,]+') do
    part = part:gsub('^%s+', ''):gsub('%s+$', '')
    if part ~= '' then out[#out + 1] = part end
  end
  return out
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- the pass-through overrides that change what the runs compute, as 'k=v …' (sorted)
local function args_text(pass)
  local unnamed = require('penumbra.experiment').UNNAMED_KEYS
  local parts = {}
  for _, k in ipairs(sorted_keys(pass)) do
    if not unnamed[k] and k:sub(1, 1) ~= '_' then parts[#parts + 1] = k .. '=' .. tostring(pass[k]) end
  end
  return table.concat(parts, ' ')
end

local function file_exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
end

-- The finished runs of an earlier sweep table, to be kept instead of run again:
-- {[row name] = {[seed] = result}}, each result the run file's summary (what the run returned)
-- and its root attribute parameters. The table must come from the same driver with the same
-- pass-through keys; a run file that is gone or did not finish is run again — unless it stopped
-- with a resume state (penumbra/resume.lua): the second result, {[row name] = {[seed] = run
-- file}}, names those, and the sweep resumes them instead.
function M.kept(path, name, text)
  local ok, a = pcall(pn.io.attrs, path, '/')
  if not ok then error(name .. ': resume: cannot read ' .. path .. ': ' .. tostring(a), 0) end
  if a.driver ~= name then
    error(string.format('%s: resume: %s is not a table of %s (it is %s)', name, path, name,
      a.driver and ('a table of ' .. tostring(a.driver)) or 'not a sweep table'), 0)
  end
  if (a.args or '') ~= text then
    error(string.format("%s: resume: %s was made with '%s', this run passes '%s'; pass the same keys or drop resume=",
      name, path, tostring(a.args), text), 0)
  end
  local done, stopped = {}, {}
  for row in tostring(a.rows or ''):gmatch('[^\n]+') do
    local ok2, ra = pcall(pn.io.attrs, path, row)
    for run in tostring(ok2 and ra.runs or ''):gmatch('[^\n]+') do
      local okr, root = pcall(pn.io.attrs, run, '/')
      if not okr then
        io.stderr:write(name .. ': resume: ' .. run .. ' cannot be read; that run goes again\n')
      elseif root.status == 'finished' then
        local s = pn.io.attrs(run, 'summary')
        s.parameters = s.parameters or root.parameters
        done[row] = done[row] or {}
        done[row][root.seed] = s
      end
    end
    for line in tostring(ok2 and ra.stopped or ''):gmatch('[^\n]+') do
      local seed, run = line:match('^(%d+)\t(.+)$')
      seed = tonumber(seed)
      local okr, root = pcall(pn.io.attrs, run or '', '/')
      if seed and okr and not (done[row] and done[row][seed]) then
        if root.status == 'finished' then -- resumed by hand to its end since: kept
          local s = pn.io.attrs(run, 'summary')
          s.parameters = s.parameters or root.parameters
          done[row] = done[row] or {}
          done[row][seed] = s
        elseif file_exists(require('penumbra.resume').path_of(run)) then
          stopped[row] = stopped[row] or {}
          stopped[row][seed] = run
        end
      end
    end
  end
  return done, stopped
end

-- M.sweep(def): runs rows of (script, overrides) over seeds and makes one table of them:
-- <PENUMBRA_RUNS or runs>/<def.dir or 'ablation'>/<name>-<UTC stamp>.md and .h5, rewritten after
-- every run (a sweep that dies leaves the table so far), and a figure <…>.png.
--   def.name     the table's name (and the progress lines')
--   def.args     the command line (the global `args`): seeds=N (def.seeds, 3), resume=<table.h5>
--                (keep that table's finished runs, run only the rest), reuse=true (take any
--                finished run with a row's settings and seed from its run folder, made by hand or
--                by another table, instead of running it), plot=false (no figure),
--                the driver's own keys (def.keys) and key=value pairs passed to every run
--   def.keys     the driver's own keys and their defaults ({scores = 'dot,umbral'})
--   def.pass     defaults passed to every run unless the command line sets them ({quiet='true'})
--   def.rows     function(keys) -> { {name=, script=, overrides={k=v}, attrs={k=v}}, … }: the rows;
--                attrs (the settings that tell rows apart) become the HDF5 group's attributes
--   def.metric   what the runs report as test_<metric>/val_<metric> ('acc')
--   def.columns  the leading Markdown columns: { {header, attr key}, … }
--   def.grid     optional, a second layout with rows × columns of the test metric:
--                {rows = attr, cols = attr, row_titles = {v = text}, col_titles = {v = text}, note = text}
--   def.attrs    extra root attributes of the HDF5 file (what its plot kind reads)
--   def.figure   optional {kind = 'ablation', opts = {…}}: drawn by pn.plot from the HDF5 table
-- The HDF5 table: per row the arrays of M.save plus seed and parameters, the group attributes
-- def.rows gave plus runs (the run files, one a line), variant and failed; root attributes seeds,
-- table (the Markdown), rows (the row names in order, one a line), metric, driver, args (the
-- pass-through keys), status (running | finished | stopped) and def.attrs. Failed runs are
-- reported and counted in the table; the sweep goes on, and ends with an error naming them.
-- Returns {rows=, md=, h5=, png=}.
function M.sweep(def)
  local name = def.name
  -- _quiet comes from ./bench compare (and the spec that runs every script), never from a
  -- command line: a sweep run as if it were one run would start its whole grid
  if (def.args or {})._quiet ~= nil then
    error(name .. ' is a sweep (many runs, one table), not a single run: run it as its own command, ' ..
      './bench experiments/' .. name .. '.lua', 0)
  end
  local args = {}
  for k, v in pairs(def.args or {}) do args[k] = v end
  local seeds = tonumber(args.seeds or def.seeds or 3)
  if not seeds or seeds < 1 or seeds % 1 ~= 0 then
    error(name .. ": seeds must be a whole number >= 1, got '" .. tostring(args.seeds) .. "'", 0)
  end
  local resume, draw = args.resume, args.plot ~= 'false' and args.plot ~= '0'
  local reuse = reuse_of(name, args.reuse)
  args.seeds, args.resume, args.plot, args.reuse = nil, nil, nil, nil
  local keys = {}
  for k, v in pairs(def.keys or {}) do
    keys[k] = args[k] or v
    args[k] = nil
  end
  local pass = {}
  for k, v in pairs(def.pass or {}) do pass[k] = v end
  for k, v in pairs(args) do pass[k] = tostring(v) end
  local rows = def.rows(keys)
  local seen = {}
  for _, r in ipairs(rows) do
    if seen[r.name] then error(name .. ': two rows are named ' .. r.name, 0) end
    seen[r.name] = true
    if not file_exists(r.script) then error(name .. ': ' .. r.name .. ': no script ' .. r.script, 0) end
    for k in pairs(r.overrides or {}) do
      if args[k] ~= nil then error(name .. ': ' .. k .. ' is set by each row; it cannot be passed to every run', 0) end
    end
  end
  local metric = def.metric or 'acc'
  local d = digits_of(metric)
  local text = args_text(pass)
  local done, stopped = {}, {}
  if resume then done, stopped = M.kept(resume, name, text) end
  local dir = (os.getenv('PENUMBRA_RUNS') or 'runs') .. '/' .. (def.dir or 'ablation')
  os.execute('mkdir -p "' .. dir .. '"')
  local stem = dir .. '/' .. name .. '-' .. os.date('!%Y%m%dT%H%M%SZ')
  local k = 1
  local base = stem
  while file_exists(stem .. '.h5') do k = k + 1; stem = base .. '-' .. k end

  local names = {}
  for i, r in ipairs(rows) do names[i] = r.name end
  local root = { metric = metric, driver = name, args = text, rows = table.concat(names, '\n') }
  for kk, v in pairs(def.attrs or {}) do root[kk] = v end
  local m = title_of(metric)
  local nseeds = seeds == 1 and '1 seed' or (seeds .. ' seeds')

  local function markdown()
    local out = {}
    if def.grid then
      local g = def.grid
      local rkeys, ckeys, cell, has_col = {}, {}, {}, {}
      for _, r in ipairs(rows) do
        local rv, cv = tostring(r.attrs[g.rows]), tostring(r.attrs[g.cols])
        if not cell[rv] then cell[rv] = {}; rkeys[#rkeys + 1] = rv end
        if not has_col[cv] then has_col[cv] = true; ckeys[#ckeys + 1] = cv end
        cell[rv][cv] = M.cell(r.test, d)
      end
      local head = { '| ' .. g.rows }
      for _, cv in ipairs(ckeys) do head[#head + 1] = (g.col_titles or {})[cv] or cv end
      out[#out + 1] = string.format('test %s, mean ± std over %s', m, nseeds) .. (g.note and ('; ' .. g.note) or '')
      out[#out + 1] = ''
      out[#out + 1] = table.concat(head, ' | ') .. ' |'
      out[#out + 1] = '|' .. string.rep('---|', #ckeys + 1)
      for _, rv in ipairs(rkeys) do
        local line = { '| ' .. ((g.row_titles or {})[rv] or rv) }
        for _, cv in ipairs(ckeys) do line[#line + 1] = cell[rv][cv] or '' end
        out[#out + 1] = table.concat(line, ' | ') .. ' |'
      end
      out[#out + 1] = ''
    end
    local head = {}
    for _, c in ipairs(def.columns or { { 'row', nil } }) do head[#head + 1] = c[1] end
    out[#out + 1] = '| ' .. table.concat(head, ' | ') ..
      string.format(' | test %s (mean ± std, %s) | val %s | parameters | s/epoch | seeds | failed |', m, nseeds, m)
    out[#out + 1] = '|' .. string.rep('---|', #head + 6)
    for _, r in ipairs(rows) do
      local line = {}
      for _, c in ipairs(def.columns or { { 'row', nil } }) do
        line[#line + 1] = c[2] and tostring(r.attrs[c[2]]) or r.name
      end
      local params = '–'
      if #r.params > 0 then
        local lo, hi = math.min(unpack(r.params)), math.max(unpack(r.params))
        params = lo == hi and string.format('%d', lo) or string.format('%d–%d', lo, hi)
      end
      local val = #r.val > 0 and string.format('%.' .. d .. 'f', (mean_std(r.val))) or '–'
      local spe = #r.spe > 0 and string.format('%.2f', (mean_std(r.spe))) or '–'
      out[#out + 1] = string.format('| %s | %s | %s | %s | %s | %d | %d |', table.concat(line, ' | '), M.cell(r.test, d),
        val, params, spe, #r.test, r.failed)
    end
    if text ~= '' then out[#out + 1] = '\nevery run: ' .. text end
    return table.concat(out, '\n') .. '\n'
  end

  local mdpath, h5path
  local function save(status)
    for _, r in ipairs(rows) do
      r.params = {}
      for _, res in ipairs(r.results) do
        local p = res.parameters
        if p == nil and res.path then
          local ok, a = pcall(pn.io.attrs, res.path, '/')
          p = ok and a.parameters or nil
          res.parameters = p
        end
        if type(p) == 'number' then r.params[#r.params + 1] = p end
      end
      r.arrays = { { 'seed', r.seeds } }
      if #r.params == #r.results then r.arrays[2] = { 'parameters', r.params } end
      local paths = {}
      for _, res in ipairs(r.results) do paths[#paths + 1] = tostring(res.path) end
      r.attrs.runs = table.concat(paths, '\n')
      local stopped = {}
      for seed, p in pairs(r.stopped or {}) do stopped[#stopped + 1] = seed .. '\t' .. p end
      table.sort(stopped)
      r.attrs.stopped = table.concat(stopped, '\n')
      r.attrs.failed = r.failed
      r.attrs.variant = r.variant
    end
    root.status = status
    mdpath, h5path = M.save(markdown(), rows, { stem = stem, metric = metric, seeds = seeds, attrs = root })
  end

  local failures = {}
  local counter = { k = 0, n = #rows * seeds }
  for _, r in ipairs(rows) do
    r.attrs = r.attrs or {}
    for _, kk in ipairs({ 'test', 'val', 'epochs', 'spe', 'ent', 'base', 'seeds', 'results', 'params' }) do r[kk] = {} end
    r.failed = 0
  end
  for _, r in ipairs(rows) do
    local o = {}
    for kk, v in pairs(pass) do o[kk] = v end
    for kk, v in pairs(r.overrides or {}) do o[kk] = tostring(v) end
    local ok, e = pcall(M.run_row, r, seeds, o, { metric = metric, who = name, counter = counter, done = done[r.name],
      stopped = stopped[r.name],
      failures = failures, stop_on_interrupt = true, reuse = reuse, after = function() save('running') end })
    if not ok then
      local any = false
      -- (a table is written when it holds something to keep: a finished run, or one to resume)
      for _, rr in ipairs(rows) do if #rr.results > 0 or next(rr.stopped or {}) then any = true end end
      if not any then error(e, 0) end
      save('stopped')
      error(tostring(e) .. '\n' .. name .. ': the table so far: ' .. h5path .. ' (go on with resume=' .. h5path .. ')', 0)
    end
  end
  save('finished')
  local md = markdown()
  io.write(md)
  io.write('saved ' .. mdpath .. ' and ' .. h5path .. '\n')
  local png
  local any = false
  for _, r in ipairs(rows) do if #r.test > 0 then any = true end end
  if def.figure and draw and any then
    local o = { out = stem .. '.png' }
    for kk, v in pairs(def.figure.opts or {}) do o[kk] = v end
    local ok, res = pcall(require('penumbra.plot').plot, def.figure.kind, { h5path }, o)
    if ok then
      png = res
      io.write('wrote ' .. png .. '\n')
    else
      io.stderr:write(name .. ': no figure: ' .. tostring(res) .. '\n')
    end
  end
  if #failures > 0 then
    error(string.format('%s: %d of %d run(s) failed (counted in the table); first: %s', name, #failures, counter.n,
      failures[1]), 0)
  end
  return { rows = rows, md = mdpath, h5 = h5path, png = png }
end

return M
