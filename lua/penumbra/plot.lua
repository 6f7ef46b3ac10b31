-- penumbra.plot (pn.plot) — pictures of run files through gnuplot (plots/*.gp).
--
--   pn.plot.curves(files, {metric='loss' | 'loss,val_acc' | {…}, smooth=k, logy=, out=, size=})
--   pn.plot.radius(files, {tag=, bins=30, density=, logx=, out=})
--   pn.plot.heatmap(file, {tag=, head=1, out=})
--   pn.plot.compare(files, {metric=<the runs' test score>, ymin=0, out=})   -- runs/compare/<stamp>.h5 or run files
--   pn.plot.ablation(file, {metric='test_bleu', x='qk_dim', series='score', out=})  -- a sweep table
--                                                  -- (compare.sweep): metric vs x, a line per series
--   pn.plot(kind, files, opts)  -- the same, by name; returns the path written
--   ./bench plot <kind> <run files…> [--out file.png|.svg|.pdf] [--option value …]
--
-- Every kind goes in two steps, so specs can check the numbers gnuplot gets:
--   job = pn.plot.prepare(kind, files, opts)   -- reads the run files: data texts, variables
--   pn.plot.write_data(job, dir)               -- writes <dir>/<name>.dat, returns name → path
--   pn.plot.render(job, out, opts)             -- writes the vars file, runs gnuplot
-- The output terminal follows the extension: .png → pngcairo (png when gnuplot lacks cairo,
-- with a note on stderr), .svg → svg, .pdf → pdfcairo. gnuplot missing or failing is a Lua
-- error carrying its stderr; the output is written under a temporary name and renamed, so a
-- failure never leaves a blank picture behind. The default output sits next to the first
-- input: run.h5 → run.curves.png.
local runs = require 'penumbra.runs'

local P = {}

P.gnuplot = os.getenv('PN_GNUPLOT') or 'gnuplot'
-- where notes go (a terminal fallback); replaceable
function P.notify(msg) io.stderr:write(msg .. '\n') end

local function root_dir()
  local home = os.getenv('PENUMBRA_HOME')
  if home and home ~= '' then return home end
  local src = debug.getinfo(1, 'S').source:gsub('^@', '')
  local dir = src:match('^(.*)/lua/penumbra/[^/]+$')
  return dir or '.'
end
P.scripts_dir = root_dir() .. '/plots'

local DEFAULT_SIZE = { png = { 900, 560 }, svg = { 900, 560 }, pdf = { 900, 560 } }

-- ---- small helpers -----------------------------------------------------------------------------
local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
-- gnuplot single-quoted string: no escapes, '' is a quote
local function gp_string(s) return "'" .. tostring(s):gsub('[\r\n]+', ' '):gsub("'", "''") .. "'" end
-- a string inside a gnuplot data file: double-quoted, no way to escape a double quote
local function data_string(s) return '"' .. tostring(s):gsub('[\r\n]+', ' '):gsub('"', "''") .. '"' end
local function num(v)
  if v ~= v then return 'NaN' end
  if v == math.huge then return 'Inf' end
  if v == -math.huge then return '-Inf' end
  return string.format('%.10g', v)
end
P.num = num

local function list_of(x)
  if x == nil then return {} end
  if type(x) == 'string' then return { x } end
  return x
end

local function split_commas(s)
  if type(s) == 'table' then return s end
  return require('penumbra.compare').list(s)
end

local function plot_error(msg) error('plot: ' .. msg, 0) end

local function open_run(path)
  local ok, r = pcall(runs.open, path)
  if not ok then plot_error(tostring(r):gsub('^runs: ', '')) end
  return r
end

-- The kinds that draw several runs open them all first: a file that cannot be read (missing,
-- not HDF5, truncated) is skipped with a warning; only when none is left is it an error.
-- Returns the opened runs, their paths (in order) and the warnings.
local function open_runs(kind, files)
  local opened, paths, warnings = {}, {}, {}
  for _, f in ipairs(files) do
    local ok, r = pcall(runs.open, f)
    if ok then
      opened[#opened + 1], paths[#paths + 1] = r, f
    else
      warnings[#warnings + 1] = 'skipped ' .. tostring(r):gsub('^runs: ', '')
    end
  end
  if #opened == 0 then plot_error(kind .. ': no readable run file: ' .. table.concat(warnings, '; ')) end
  return opened, paths, warnings
end

local function default_out(path, suffix)
  local base = path:gsub('%.h5$', '')
  return base .. '.' .. suffix .. '.png'
end

local function unique_titles(titles, files)
  local count = {}
  for _, t in ipairs(titles) do count[t] = (count[t] or 0) + 1 end
  for i, t in ipairs(titles) do
    if count[t] > 1 then titles[i] = t .. ' (' .. runs.basename(files[i]):gsub('%.h5$', '') .. ')' end
  end
  return titles
end

local mean_std = require('penumbra.stats').mean_std
P.mean_std = mean_std

-- trailing moving average over k points (fewer at the start)
function P.moving_average(values, k)
  k = math.max(1, math.floor(k or 1))
  local out, sum = {}, 0
  for i, v in ipairs(values) do
    sum = sum + v
    if i > k then sum = sum - values[i - k] end
    out[i] = sum / math.min(i, k)
  end
  return out
end

-- ---- curves ---------------------------------------------------------------------------------
local prepare = {}

function prepare.curves(files, opts)
  local metrics = opts.metric and split_commas(opts.metric) or nil
  local smooth = tonumber(opts.smooth or 1)
  if not smooth or smooth < 1 or smooth % 1 ~= 0 then plot_error('curves: --smooth must be a positive integer, got ' .. tostring(opts.smooth)) end
  local opened, missing
  opened, files, missing = open_runs('curves', files)
  if not metrics then
    metrics = { 'loss' }
    local any_loss = false
    for _, r in ipairs(opened) do if r.f:exists('metrics/loss') then any_loss = true end end
    if not any_loss then
      local names = opened[1]:metric_names()
      if #names == 0 then plot_error('curves: ' .. files[1] .. ' has no metrics') end
      metrics = { names[1] }
    end
  end
  local blocks, titles, tfiles, run_of, metric_of = {}, {}, {}, {}, {}
  local all_epochs = true
  local max_points = 0
  for i, r in ipairs(opened) do
    if not r.experiment then all_epochs = false end
    for mi, m in ipairs(metrics) do
      if r.f:exists('metrics/' .. m) then
        run_of[#run_of + 1], metric_of[#metric_of + 1] = i, mi
        local values, steps = r:metric(m)
        local sm = P.moving_average(values, smooth)
        local lines = {}
        for k = 1, #values do lines[k] = num(steps[k]) .. ' ' .. num(values[k]) .. ' ' .. num(sm[k]) end
        if #lines == 0 then lines[1] = 'NaN NaN NaN' end
        blocks[#blocks + 1] = table.concat(lines, '\n')
        max_points = math.max(max_points, #values)
        titles[#titles + 1] = r:label() .. (#metrics > 1 and (' ' .. m) or '')
        tfiles[#tfiles + 1] = files[i]
      else
        missing[#missing + 1] = string.format('%s has no metric %s (it has: %s)', files[i], m,
          table.concat(r:metric_names(), ', '))
      end
    end
  end
  local experiments, first = {}, nil
  for _, r in ipairs(opened) do
    experiments[r.variant or '?'] = true
    first = first or r
  end
  for _, r in ipairs(opened) do r:close() end
  if #blocks == 0 then plot_error('curves: nothing to draw: ' .. table.concat(missing, '; ')) end
  titles = unique_titles(titles, tfiles)
  local nexp = 0
  for _ in pairs(experiments) do nexp = nexp + 1 end
  local what = table.concat(metrics, ', ')
  local title
  if #files == 1 then title = first:label() .. ': ' .. what
  elseif nexp == 1 then title = (first.variant or '?') .. ': ' .. what .. ' (' .. #files .. ' runs)'
  else title = what .. ' (' .. #files .. ' runs)' end
  if smooth > 1 then title = title .. ', moving average over ' .. smooth end
  -- the legend: below the axes for a few series; beside them (one column, small type, on a
  -- wider canvas) for many, so it never covers the curves; none past 40 (it would not fit)
  local key_mode, size = 1, nil
  if #blocks > 40 then
    key_mode = 0
    missing[#missing + 1] = string.format('%d series: too many for a legend, drawn without one (pass fewer files)', #blocks)
  elseif #blocks > 8 then
    key_mode, size = 2, { 1200, 640 }
  end
  return {
    kind = 'curves', script = 'curves.gp', warnings = missing, size = size,
    data = { datafile = table.concat(blocks, '\n\n\n') .. '\n' },
    vars = {
      { 'n', #blocks }, { 'titles', titles }, { 'smooth', smooth > 1 and 1 or 0 },
      { 'run_of', run_of }, { 'metric_of', metric_of },
      { 'points', max_points <= 30 and 1 or 0 },
      { 'plot_title', opts.title or title }, { 'xlab', all_epochs and 'epoch' or 'step' },
      { 'ylab', #metrics == 1 and metrics[1] or 'value' }, { 'logy', opts.logy and 1 or 0 },
      { 'key_mode', key_mode },
    },
    default_out = default_out(files[1], 'curves'),
  }
end

-- ---- radius -----------------------------------------------------------------------------------
function prepare.radius(files, opts)
  local series = {}
  local opened, paths, notes = open_runs('radius', files)
  for fi, r in ipairs(opened) do
    local f = paths[fi]
    local tags = opts.tag and { opts.tag } or r:tags('radii')
    if #tags == 0 then notes[#notes + 1] = f .. ' has no /radii' end
    for _, tag in ipairs(tags) do
      local key = 'radii/' .. tag
      if not r.f:exists(key) then
        local have = table.concat(r:tags('radii'), ', ')
        r:close()
        plot_error(string.format("radius: %s has no /%s (tags: %s)", f, key, have ~= '' and have or 'none'))
      end
      local values = {}
      for _, v in ipairs(runs.flat(r:read(key))) do if v == v then values[#values + 1] = v end end
      series[#series + 1] = { title = r:label() .. ' ' .. tag, values = values, attrs = r:attrs_of(key), tag = tag,
                              file = f, label = r:label() }
    end
    r:close()
  end
  if #series == 0 then plot_error('radius: nothing to draw: ' .. table.concat(notes, '; ')) end
  local logx = opts.logx and true or false
  local lo, hi, total = math.huge, -math.huge, 0
  for _, s in ipairs(series) do
    for _, v in ipairs(s.values) do
      if logx then
        if v <= 0 then plot_error('radius: --logx needs positive values; ' .. s.file .. ' /radii/' .. s.tag .. ' has ' .. num(v)) end
        v = math.log10(v)
      end
      lo, hi = math.min(lo, v), math.max(hi, v)
    end
    total = total + #s.values
  end
  if total == 0 then plot_error('radius: the radii datasets are empty') end
  if hi <= lo then lo, hi = lo - 0.5, hi + 0.5 end
  local bins = tonumber(opts.bins or 30)
  if not bins or bins < 1 or bins % 1 ~= 0 then plot_error('radius: --bins must be a positive integer, got ' .. tostring(opts.bins)) end
  local width = (hi - lo) / bins
  local blocks, titles, tfiles = {}, {}, {}
  for _, s in ipairs(series) do
    local counts = {}
    for b = 1, bins do counts[b] = 0 end
    for _, v in ipairs(s.values) do
      local x = logx and math.log10(v) or v
      local b = math.min(bins, math.floor((x - lo) / width) + 1)
      counts[b] = counts[b] + 1
    end
    local lines = {}
    for b = 1, bins do
      local a, z = lo + (b - 1) * width, lo + b * width
      local c = (a + z) / 2
      if logx then a, z, c = 10 ^ a, 10 ^ z, 10 ^ c end
      local y = counts[b]
      if opts.density then y = y / (#s.values * (logx and (math.log10(z) - math.log10(a)) or (z - a))) end
      lines[b] = num(c) .. ' ' .. num(y) .. ' ' .. num(a) .. ' ' .. num(z)
    end
    blocks[#blocks + 1] = table.concat(lines, '\n')
    titles[#titles + 1] = string.format('%s (n=%d)', s.title, #s.values)
    tfiles[#tfiles + 1] = s.file
  end
  titles = unique_titles(titles, tfiles)
  local a = series[1].attrs or {}
  local xlab = 'learned radius / height'
  if a.map == 'psi' or a.map == 'xi' or a.map == 'exp0' then xlab = 'learned height (last coordinate of the mapped keys)' end
  -- series of different kinds (a cone run's heights next to a dot run's key norms): say so
  -- instead of naming the first series' score on the shared axis
  local mixed = false
  for _, s in ipairs(series) do
    local b = s.attrs or {}
    if b.score ~= a.score or b.map ~= a.map or b.kind ~= a.kind then mixed = true end
  end
  if mixed then
    xlab = 'learned height (cone/hyperbolic maps) or key norm (no map); see the legend'
    for i, s in ipairs(series) do
      local b = s.attrs or {}
      if b.score then titles[i] = titles[i] .. ', ' .. tostring(b.score) .. (b.kind and (' ' .. tostring(b.kind)) or '') end
    end
  else
    local extra = {}
    if a.score then extra[#extra + 1] = 'score=' .. tostring(a.score) end
    if a.map then extra[#extra + 1] = 'map=' .. tostring(a.map) end
    if a.kind then extra[#extra + 1] = tostring(a.kind) end
    if #extra > 0 then xlab = xlab .. ', ' .. table.concat(extra, ', ') end
  end
  local title
  if #series == 1 then title = string.format('%s: /radii/%s, %d values', series[1].label, series[1].tag, #series[1].values)
  else
    local tags, exps = {}, {}
    for _, s in ipairs(series) do tags[s.tag] = true; exps[s.label:match('^(.-) s%-?%d+$') or s.label] = true end
    local function only(set) local k1 = next(set); return (k1 and next(set, k1) == nil) and k1 or nil end
    title = string.format('learned radii%s%s: %d series', only(exps) and (' of ' .. only(exps)) or '',
      only(tags) and (', /radii/' .. only(tags)) or '', #series)
  end
  return {
    kind = 'radius', script = 'radius.gp', warnings = notes,
    data = { datafile = table.concat(blocks, '\n\n\n') .. '\n' },
    vars = {
      { 'n', #blocks }, { 'titles', titles }, { 'plot_title', opts.title or title }, { 'xlab', xlab },
      { 'ylab', opts.density and 'density' or 'count' }, { 'logx', logx and 1 or 0 }, { 'binwidth', width },
    },
    default_out = default_out(files[1], 'radius'),
  }
end

-- ---- heatmap ----------------------------------------------------------------------------------
local function split_labels(s)
  if type(s) ~= 'string' then return nil end
  local out = {}
  for line in (s .. '\n'):gmatch('([^\n]*)\n') do out[#out + 1] = line end
  return out
end
P.split_labels = split_labels

-- the (Nq, Nk) matrix, labels and metadata of /attention/<tag>, head h (1-based)
function P.attention_map(path, opts)
  opts = opts or {}
  local r = open_run(path)
  local ok, res = pcall(function()
    local tags = r:tags('attention')
    local tag = opts.tag
    if not tag then
      -- the first tag that is a map (2-D or 3-D): /attention also holds per-head summaries
      -- such as entropy_layer1 (1-D)
      for _, t in ipairs(tags) do
        local nd = #r:read('attention/' .. t):shape()
        if nd == 2 or nd == 3 then tag = t; break end
      end
      if not tag then plot_error('heatmap: ' .. path .. ' has no /attention maps (2-D or 3-D); tags: ' ..
        (#tags > 0 and table.concat(tags, ', ') or 'none')) end
    end
    local key = 'attention/' .. tag
    if not r.f:exists(key) then
      plot_error(string.format('heatmap: %s has no /%s (tags: %s)', path, key, #tags > 0 and table.concat(tags, ', ') or 'none'))
    end
    local t = r:read(key)
    local shape = t:shape()
    if #shape == 2 then t = t:reshape({ 1, shape[1], shape[2] }); shape = t:shape() end
    if #shape ~= 3 then
      plot_error(string.format('heatmap: /%s in %s has shape [%s], expected (H, Nq, Nk)', key, path, table.concat(shape, ',')))
    end
    local H = shape[1]
    local head = tonumber(opts.head or 1)
    if not head or head % 1 ~= 0 or head < 1 or head > H then
      plot_error(string.format('heatmap: --head must be a whole number in 1..%d for /%s [%s], got %s', H, key,
        table.concat(shape, ','), tostring(opts.head)))
    end
    local m = t:select(1, head):contiguous():to('f64'):totable()
    local a = r:attrs_of(key)
    local rows = split_labels(a.row_labels or a.q_labels or a.labels)
    local cols = split_labels(a.col_labels or a.k_labels or a.labels)
    if rows and #rows ~= shape[2] then rows = nil end
    if cols and #cols ~= shape[3] then cols = nil end
    return { matrix = m, tag = tag, head = head, heads = H, nq = shape[2], nk = shape[3],
             row_labels = rows, col_labels = cols, label = r:label(), tags = tags, attrs = a }
  end)
  r:close()
  if not ok then error(res, 0) end
  return res
end

function prepare.heatmap(files, opts)
  if #files > 1 then plot_error('heatmap: one run file at a time (got ' .. #files .. ')') end
  local am = P.attention_map(files[1], opts)
  local warnings = {}
  if not opts.tag and #am.tags > 1 then
    local others = {}
    for _, t in ipairs(am.tags) do if t ~= am.tag then others[#others + 1] = t end end
    warnings[1] = string.format('drawing /attention/%s; the file also has %s (choose with --tag)', am.tag,
      table.concat(others, ', '))
  end
  local lines = {}
  local lo, hi = math.huge, -math.huge
  for i = 1, am.nq do
    for j = 1, am.nk do
      local v = am.matrix[i][j]
      if v == v then lo, hi = math.min(lo, v), math.max(hi, v) end
      lines[#lines + 1] = j .. ' ' .. i .. ' ' .. num(v)
    end
    lines[#lines + 1] = ''
  end
  local data = { datafile = table.concat(lines, '\n') .. '\n' }
  local has_labels = am.row_labels ~= nil or am.col_labels ~= nil
  if has_labels then
    -- at most ~60 labels per axis; numbers where a side has none
    local function block(labels, n)
      local step = math.max(1, math.ceil(n / 60))
      local out = {}
      for i = 1, n, step do out[#out + 1] = i .. ' ' .. data_string(labels and labels[i] or tostring(i)) end
      return table.concat(out, '\n')
    end
    data.labelfile = block(am.col_labels, am.nk) .. '\n\n\n' .. block(am.row_labels, am.nq) .. '\n'
  end
  local title = string.format('%s: /attention/%s, head %d of %d', am.label, am.tag, am.head, am.heads)
  if am.attrs.score then title = title .. ' (score=' .. tostring(am.attrs.score) .. ')' end
  local safe_tag = am.tag:gsub('[^%w_%-]', '_')
  return {
    kind = 'heatmap', script = 'heatmap.gp', warnings = warnings,
    data = data,
    vars = {
      { 'nq', am.nq }, { 'nk', am.nk }, { 'has_labels', has_labels and 1 or 0 },
      { 'show_values', am.nq * am.nk <= 144 and 1 or 0 }, { 'cbmid', lo == math.huge and 0.5 or (lo + hi) / 2 },
      { 'plot_title', opts.title or title }, { 'xlab', 'key' }, { 'ylab', 'query' }, { 'cblab', 'attention weight' },
    },
    size = { 760, 680 },
    default_out = files[1]:gsub('%.h5$', '') .. '.heatmap-' .. safe_tag .. '-h' .. am.head .. '.png',
  }
end

-- ---- compare ----------------------------------------------------------------------------------
-- Rows {name, values} from ./bench compare files (groups with <metric> arrays, ordered as in
-- their Markdown table, or as their root attribute rows lists them: sweep tables) and from run files, grouped by what they ran: the same experiment and
-- config apart from the seed (runs.config_key). A group is named by its run files' variant
-- ('cora_umbral epochs=20'); files from before that attribute get the experiment plus the
-- config values that tell its groups apart. Unreadable files and files without the metric
-- are skipped with a warning.
local function compare_rows(files, metric)
  local rows, by_name, seeds, warnings = {}, {}, nil, {}
  local function row(name)
    if not by_name[name] then
      by_name[name] = { name = name, values = {} }
      rows[#rows + 1] = by_name[name]
    end
    return by_name[name]
  end
  local opened, paths, skipped = open_runs('compare', files)
  for _, w in ipairs(skipped) do warnings[#warnings + 1] = w end
  local groups, by_key = {}, {} -- run-file groups, in the order first seen
  for i, r in ipairs(opened) do
    local f = paths[i]
    local ok, e = pcall(function()
      if r:is_run() then
        local v = r.summary[metric]
        if type(v) ~= 'number' then
          warnings[#warnings + 1] = string.format('skipped %s: no summary value %s (it has: %s)', f, metric,
            table.concat(runs.sorted_keys(r.summary), ', '))
          return
        end
        local key = r.experiment .. '\0' .. runs.config_key(r)
        local g = by_key[key]
        if not g then
          g = { experiment = r.experiment, variant = r.attrs.variant, config = r.config, values = {} }
          by_key[key] = g
          groups[#groups + 1] = g
          row(key) -- keeps the order of first appearance among all rows
        end
        g.values[#g.values + 1] = v
      else
        seeds = r.attrs.seeds or seeds
        local order = {}
        if type(r.attrs.rows) == 'string' then -- sweep tables (compare.sweep) name their rows in order
          for name in r.attrs.rows:gmatch('[^\n]+') do order[#order + 1] = name end
        elseif type(r.attrs.table) == 'string' then
          for name in r.attrs.table:gmatch('\n| ([^|\n]-) |') do
            if name ~= '---' and not name:match('^experiment') then order[#order + 1] = name end
          end
        end
        local present, names = {}, {}
        for _, n in ipairs(r.f:list('/')) do
          local g, m = n:match('^(.*)/([^/]+)$')
          if g and m == metric then present[g] = n end
        end
        for _, name in ipairs(order) do if present[name] then names[#names + 1] = name; present[name] = false end end
        local rest = {}
        for name, key in pairs(present) do if key then rest[#rest + 1] = name end end
        table.sort(rest)
        for _, name in ipairs(rest) do names[#names + 1] = name end
        if #names == 0 then
          warnings[#warnings + 1] = string.format('skipped %s: no <experiment>/%s arrays (datasets: %s)', f, metric,
            table.concat(r.f:list('/'), ', '))
          return
        end
        for _, name in ipairs(names) do
          local rr = row(name)
          for _, v in ipairs(runs.flat(r:read(name .. '/' .. metric))) do rr.values[#rr.values + 1] = v end
        end
      end
    end)
    r:close()
    if not ok then warnings[#warnings + 1] = 'skipped ' .. f .. ': ' .. tostring(e):gsub('^[^:]*:%d+: ', '') end
  end
  -- name the run-file groups: their variant, else the experiment plus the differing values
  local per_exp = {}
  for _, g in ipairs(groups) do
    per_exp[g.experiment] = per_exp[g.experiment] or {}
    table.insert(per_exp[g.experiment], g)
  end
  for key, g in pairs(by_key) do
    local name = g.variant
    if not name then
      local same = per_exp[g.experiment]
      local parts = {}
      if #same > 1 then
        for _, k in ipairs(runs.sorted_keys(g.config)) do
          local differs = false
          for _, o in ipairs(same) do if runs.canon(o.config[k]) ~= runs.canon(g.config[k]) then differs = true end end
          if differs and k ~= 'seed' then parts[#parts + 1] = k .. '=' .. runs.canon(g.config[k]) end
        end
      end
      name = g.experiment .. (#parts > 0 and (' ' .. table.concat(parts, ' ')) or '')
    end
    local rr = by_name[key]
    rr.values = g.values
    rr.name = name
  end
  -- drop the placeholders of compare-file rows that got no values
  local out = {}
  for _, rr in ipairs(rows) do if #rr.values > 0 then out[#out + 1] = rr end end
  if #out == 0 then plot_error('compare: nothing to draw: ' .. table.concat(warnings, '; ')) end
  -- two groups with one name (a variant named the same with another config): tell them apart
  local seen = {}
  for _, rr in ipairs(out) do seen[rr.name] = (seen[rr.name] or 0) + 1 end
  local k = {}
  for _, rr in ipairs(out) do
    if seen[rr.name] > 1 then
      k[rr.name] = (k[rr.name] or 0) + 1
      rr.name = rr.name .. ' #' .. k[rr.name]
    end
  end
  return out, seeds, warnings
end
P.compare_rows = compare_rows

-- compare's metric when --metric is not given: the first readable file's test score (a run's
-- monitored test_<m>, else test_acc; a compare table's first test_<m> arrays); test_acc if none
local function default_metric(files)
  for _, f in ipairs(files) do
    local ok, r = pcall(runs.open, f)
    if ok then
      local m
      pcall(function()
        if r:is_run() then m = runs.test_of(r.summary)
        else
          for _, n in ipairs(r.f:list('/')) do
            m = m or n:match('^.*/(test_[%w_]+)$')
          end
        end
      end)
      r:close()
      return m or 'test_acc'
    end
  end
  return 'test_acc'
end

function prepare.compare(files, opts)
  local metric = opts.metric or default_metric(files)
  local rows, seeds, warnings = compare_rows(files, metric)
  local lines = {}
  local longest = 0
  for i, r in ipairs(rows) do
    local m, s = mean_std(r.values)
    r.mean, r.std = m, s
    lines[i] = string.format('%d %s %s %s %d', i, data_string(r.name), num(m), num(s), #r.values)
    longest = math.max(longest, #r.name)
  end
  local counts, nmax = {}, 0
  for _, r in ipairs(rows) do
    counts[#r.values] = true
    nmax = math.max(nmax, #r.values)
  end
  local nvals = 0
  for _ in pairs(counts) do nvals = nvals + 1 end
  -- one run has no spread: say "one run", not "± 0.0000 over 1 runs"
  local title
  if nmax == 1 then
    title = string.format('%s: one run each (no spread)', metric)
  else
    local over = seeds and (seeds .. ' seeds') or (nvals == 1 and (#rows[1].values .. ' runs each') or
      'runs (counts under the bars)')
    title = string.format('%s: mean ± std over %s', metric, over)
  end
  -- Accuracies of rival attentions differ in the third decimal: bars from 0 would hide that.
  -- Unless --ymin is given, start the axis below the lowest mean − 2·std by one such span.
  local ymin = tonumber(opts.ymin)
  if opts.ymin ~= nil and not (ymin and ymin == ymin) then
    plot_error('compare: --ymin must be a number, got ' .. tostring(opts.ymin))
  end
  if not ymin then
    local lo, hi = math.huge, -math.huge
    for _, r in ipairs(rows) do
      lo = math.min(lo, r.mean - 2 * r.std)
      hi = math.max(hi, r.mean + 2 * r.std)
    end
    local span = math.max(hi - lo, 1e-3)
    ymin = (lo > 0 and lo - span > 0 and lo > 0.5 * hi) and (lo - span) or 0
    if ymin > 0 then title = title .. string.format(' (axis from %.3g)', ymin) end
  end
  return {
    kind = 'compare', script = 'compare.gp', warnings = warnings, rows = rows,
    data = { datafile = table.concat(lines, '\n') .. '\n' },
    vars = {
      { 'n', #rows }, { 'plot_title', opts.title or title }, { 'ylab', metric },
      { 'ymin', ymin }, { 'rotate', (#rows * longest > 60) and 1 or 0 },
    },
    default_out = default_out(files[1], 'compare'),
  }
end

-- ---- ablation ---------------------------------------------------------------------------------
-- A sweep table (compare.sweep; experiments/nmt_ablation_dims.lua) as lines: the metric against a
-- swept setting, one line per series, error bars = std over seeds. The root attributes say which
-- row attribute is x (x = 'qk_dim') and which names the series (series = 'score'); --x and
-- --series choose others. Rows are read in the order of the root attribute rows; a row without
-- the metric (every run failed) is left out with a warning.
function prepare.ablation(files, opts)
  if #files > 1 then plot_error('ablation: one table at a time (got ' .. #files .. ')') end
  local path = files[1]
  local r = open_run(path)
  local ok, res = pcall(function()
    if r:is_run() then
      plot_error('ablation: ' .. path .. ' is a run file; this kind draws a sweep table (experiments/nmt_ablation_dims.lua)')
    end
    local a = r.attrs
    local xkey, skey = opts.x or a.x, opts.series or a.series
    if type(xkey) ~= 'string' then
      plot_error('ablation: ' .. path .. ' has no root attribute x (the swept setting); name one with --x')
    end
    local metric = opts.metric or ('test_' .. tostring(a.metric or 'acc'))
    local names = {}
    if type(a.rows) == 'string' then
      for name in a.rows:gmatch('[^\n]+') do names[#names + 1] = name end
    else
      local set = {}
      for _, n in ipairs(r.f:list('/')) do
        local g = n:match('^(.*)/[^/]+$')
        if g and not set[g] then set[g] = true; names[#names + 1] = g end
      end
      table.sort(names)
    end
    local series, by_name, warnings, xs_set, nmax = {}, {}, {}, {}, 0
    local counts = {}
    for _, name in ipairs(names) do
      local key = name .. '/' .. metric
      if not r.f:exists(key) then
        warnings[#warnings + 1] = string.format('%s: row %s has no %s (no finished run)', path, name, metric)
      else
        local ga = r:attrs_of(name)
        local x = tonumber(ga[xkey])
        if x == nil then plot_error(string.format("ablation: row %s of %s has no number attribute '%s'", name, path, xkey)) end
        local sname = skey and ga[skey] ~= nil and tostring(ga[skey]) or 'all'
        local s = by_name[sname]
        if not s then
          s = { title = sname, points = {} }
          by_name[sname] = s
          series[#series + 1] = s
        end
        local values = runs.flat(r:read(key))
        local m, sd = mean_std(values)
        s.points[#s.points + 1] = { x = x, mean = m, std = sd, n = #values }
        xs_set[x] = true
        counts[#values] = true
        nmax = math.max(nmax, #values)
      end
    end
    if #series == 0 then plot_error('ablation: nothing to draw in ' .. path .. ': ' .. table.concat(warnings, '; ')) end
    local blocks = {}
    for i, s in ipairs(series) do
      table.sort(s.points, function(p, q) return p.x < q.x end)
      local lines = {}
      for k, p in ipairs(s.points) do lines[k] = string.format('%s %s %s %d', num(p.x), num(p.mean), num(p.std), p.n) end
      blocks[i] = table.concat(lines, '\n')
    end
    local xs = {}
    for x in pairs(xs_set) do xs[#xs + 1] = x end
    table.sort(xs)
    local titles = {}
    for i, s in ipairs(series) do titles[i] = s.title end
    -- widths 16..128 read best on a log2 axis; a linear axis when x has zero, negatives or a small range
    local logx = xs[1] > 0 and xs[#xs] / xs[1] >= 4
    local xmin, xmax
    if logx then xmin, xmax = xs[1] / 1.25, xs[#xs] * 1.25
    else
      local pad = xs[#xs] > xs[1] and 0.06 * (xs[#xs] - xs[1]) or 0.5
      xmin, xmax = xs[1] - pad, xs[#xs] + pad
    end
    local nvals = 0
    for _ in pairs(counts) do nvals = nvals + 1 end
    local over
    if nmax == 1 then over = 'one run each (no spread)'
    elseif nvals == 1 then over = 'mean ± std over ' .. nmax .. ' seeds'
    else over = 'mean ± std over seeds (counts differ: some runs failed)' end
    local xlab = opts.x and xkey or (type(a.xlabel) == 'string' and a.xlabel or xkey)
    return {
      kind = 'ablation', script = 'ablation.gp', warnings = warnings, series = series,
      data = { datafile = table.concat(blocks, '\n\n\n') .. '\n' },
      vars = {
        { 'n', #series }, { 'titles', titles }, { 'xs', xs }, { 'logx', logx and 1 or 0 },
        { 'xmin', xmin }, { 'xmax', xmax }, { 'points', nmax },
        { 'plot_title', opts.title or string.format('%s vs %s: %s', metric, xlab, over) },
        { 'xlab', xlab }, { 'ylab', metric },
      },
      default_out = default_out(path, 'ablation'),
    }
  end)
  r:close()
  if not ok then error(res, 0) end
  return res
end

P.KINDS = { 'curves', 'radius', 'heatmap', 'compare', 'ablation' }

function P.prepare(kind, files, opts)
  opts = opts or {}
  local f = prepare[kind]
  if not f then plot_error("unknown kind '" .. tostring(kind) .. "' (" .. table.concat(P.KINDS, ', ') .. ')') end
  files = list_of(files)
  if #files == 0 then plot_error(kind .. ': no run files given') end
  for _, path in ipairs(files) do
    if type(path) ~= 'string' then plot_error(kind .. ': run files must be paths, got ' .. type(path)) end
  end
  return f(files, opts)
end

-- ---- files and gnuplot ------------------------------------------------------------------------
local function write_file(path, text)
  local f, err = io.open(path, 'wb')
  if not f then plot_error('cannot write ' .. path .. ': ' .. tostring(err)) end
  f:write(text)
  f:close()
end

local function read_file(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('*a')
  f:close()
  return s
end

-- writes every data text of job into dir as <name>.dat; returns name → path
function P.write_data(job, dir)
  local paths = {}
  local names = {}
  for name in pairs(job.data) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local p = dir .. '/' .. name .. '.dat'
    write_file(p, job.data[name])
    paths[name] = p
  end
  return paths
end

local function execute(cmd)
  local a, _, c = os.execute(cmd)
  if type(a) == 'number' then return a == 0, a >= 256 and math.floor(a / 256) or a end
  return a == true, c
end

local function make_tmpdir()
  local base = os.tmpname()
  local dir = base .. '.plot'
  if not execute('mkdir -p ' .. sh_quote(dir)) then plot_error('cannot create a temporary folder ' .. dir) end
  return dir, base
end

local function remove_tmpdir(dir, base)
  execute('rm -rf ' .. sh_quote(dir))
  os.remove(base)
end

-- the terminals this gnuplot offers (cached); errors when gnuplot cannot be run
local terminals_cache = {}
function P.terminals()
  local key = P.gnuplot
  if terminals_cache[key] then return terminals_cache[key] end
  local p = io.popen(P.gnuplot .. ' -e "set terminal" 2>&1')
  local text = p and p:read('*a') or ''
  if p then p:close() end
  if not text:find('Available terminal types') then
    plot_error("cannot run gnuplot ('" .. P.gnuplot .. "'): " .. (text:gsub('%s+$', '') ~= '' and text:gsub('%s+$', '') or 'no output')
      .. ' (install the Debian package gnuplot-nox, or set PN_GNUPLOT)')
  end
  local set = {}
  for name in text:gmatch('\n%s*([%w_]+)%s') do set[name] = true end
  terminals_cache[key] = set
  return set
end

-- 'set terminal …' for an output path, and a note when falling back
function P.terminal_for(out, size)
  local ext = (out:match('%.(%w+)$') or ''):lower()
  local terms = P.terminals()
  local w, h = size[1], size[2]
  if ext == 'png' then
    if terms.pngcairo then
      return string.format("set terminal pngcairo size %d,%d font 'sans,10' noenhanced", w, h), 'png'
    elseif terms.png then
      return string.format("set terminal png size %d,%d noenhanced", w, h), 'png',
        'plot: gnuplot has no pngcairo terminal; using png (libgd), which draws plainer text'
    end
    plot_error('gnuplot has neither the pngcairo nor the png terminal')
  elseif ext == 'svg' then
    if not terms.svg then plot_error('gnuplot has no svg terminal') end
    return string.format("set terminal svg size %d,%d font 'sans,11' noenhanced background rgb 'white'", w, h), 'svg'
  elseif ext == 'pdf' then
    if not terms.pdfcairo then plot_error('gnuplot has no pdfcairo terminal (install gnuplot-nox with cairo)') end
    return string.format("set terminal pdfcairo size %.2fin,%.2fin font 'sans,9' noenhanced", w / 100, h / 100), 'pdf'
  end
  plot_error("output '" .. out .. "': use a .png, .svg or .pdf file name")
end

local function parse_size(s)
  if type(s) == 'table' then return s end
  if s == nil then return nil end
  local w, h = tostring(s):match('^(%d+)[x,](%d+)$')
  if not w then plot_error("--size must look like 900x560, got '" .. tostring(s) .. "'") end
  return { tonumber(w), tonumber(h) }
end

local function gp_assign(name, v)
  if type(v) == 'table' then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = type(x) == 'number' and num(x) or gp_string(x) end
    return string.format('array %s[%d] = [%s]', name, math.max(1, #v), table.concat(parts, ', '))
  elseif type(v) == 'number' then
    return name .. ' = ' .. num(v)
  end
  return name .. ' = ' .. gp_string(v)
end

local MAGIC = { png = '^\137PNG', svg = '^%s*<[%?s]', pdf = '^%%PDF' }

function P.render(job, out, opts)
  opts = opts or {}
  out = out or job.default_out
  local size = parse_size(opts.size) or job.size
  local ext = (out:match('%.(%w+)$') or ''):lower()
  size = size or DEFAULT_SIZE[ext] or { 900, 560 }
  local term, kind, note = P.terminal_for(out, size)
  if note then P.notify(note) end
  local out_dir = out:match('^(.*)/[^/]*$')
  if out_dir and out_dir ~= '' then
    local okd = os.execute("test -d '" .. out_dir:gsub("'", "'\\''") .. "'")
    if not (okd == 0 or okd == true) then plot_error('the directory of --out ' .. out .. ' does not exist') end
  end
  local dir, base = make_tmpdir()
  local tmp_out = out:gsub('(%.%w+)$', '.tmp' .. tostring(os.time()) .. '%1')
  local ok, err = pcall(function()
    local paths = P.write_data(job, dir)
    local lines = { term, 'set output ' .. gp_string(tmp_out), 'dir = ' .. gp_string(P.scripts_dir .. '/') }
    for name, p in pairs(paths) do lines[#lines + 1] = gp_assign(name, p) end
    for _, kv in ipairs(job.vars) do lines[#lines + 1] = gp_assign(kv[1], kv[2]) end
    write_file(dir .. '/vars.gp', table.concat(lines, '\n') .. '\n')
    local script = P.scripts_dir .. '/' .. job.script
    if not read_file(script) then plot_error('missing gnuplot script ' .. script) end
    local cmd = string.format('%s %s %s > %s 2> %s', P.gnuplot, sh_quote(dir .. '/vars.gp'), sh_quote(script),
      sh_quote(dir .. '/stdout.txt'), sh_quote(dir .. '/stderr.txt'))
    local okx, code = execute(cmd)
    local stderr = (read_file(dir .. '/stderr.txt') or ''):gsub('%s+$', '')
    if not okx then
      plot_error(string.format('gnuplot failed (exit %s) on %s:\n%s', tostring(code), job.script,
        stderr ~= '' and stderr or '(no message)'))
    end
    local body = read_file(tmp_out)
    if not body or #body == 0 then
      plot_error('gnuplot wrote nothing to ' .. out .. (stderr ~= '' and (':\n' .. stderr) or ''))
    end
    if MAGIC[kind] and not body:find(MAGIC[kind]) then
      plot_error('gnuplot wrote something that is not a ' .. kind .. ' file to ' .. out)
    end
    local okr, rerr = os.rename(tmp_out, out)
    if not okr then plot_error('cannot move the picture to ' .. out .. ': ' .. tostring(rerr)) end
    job.gnuplot_stderr = stderr
  end)
  os.remove(tmp_out)
  if opts.keep then
    io.stderr:write('plot: kept the gnuplot inputs in ' .. dir .. ' (gnuplot vars.gp ' .. P.scripts_dir .. '/' .. job.script .. ')\n')
    os.remove(base)
  else
    remove_tmpdir(dir, base)
  end
  if not ok then error(err, 0) end
  return out, job.gnuplot_stderr
end

function P.plot(kind, files, opts)
  opts = opts or {}
  local job = P.prepare(kind, files, opts)
  return (P.render(job, opts.out, opts))
end

for _, kind in ipairs(P.KINDS) do
  P[kind] = function(files, opts) return P.plot(kind, files, opts) end
end

-- ---- ./bench plot ------------------------------------------------------------------------------
P.USAGE = [[
usage: ./bench plot <kind> <run files…> [--out file.png|.svg|.pdf] [options]

kinds:
  curves   logged metrics over epochs, one line per run and metric
           --metric loss[,val_acc,…] (default loss)  --smooth k (moving average)  --logy
  radius   histogram of learned radii/heights (/radii/<tag>), runs overlaid
           --tag name (default: every tag)  --bins 30  --density  --logx
  heatmap  one head of an attention map /attention/<tag> (H, Nq, Nk)
           --tag name (default: the first)  --head h (1-based, default 1)
  compare  bars with error bars (mean ± std) from runs/compare/<stamp>.h5 or from run files
           (also a sweep table, e.g. runs/ablation/nmt_ablation_maps-<stamp>.h5 --metric test_bleu)
           --metric test_acc (default: the runs' test score, e.g. test_bleu)  --ymin 0
  ablation a sweep table (runs/ablation/nmt_ablation_dims-<stamp>.h5) as lines: the metric
           against the swept setting, one line per series, error bars = std over seeds
           --metric (default test_<the table's metric>)  --x qk_dim  --series score

common:    --out path (default next to the first file: run.h5 → run.<kind>.png)
           --size 900x560  --title text  --keep (keep gnuplot's inputs, print where)
]]

local FLAGS = { density = true, logx = true, logy = true, keep = true }
local VALUED = { out = true, metric = true, smooth = true, tag = true, head = true, bins = true, size = true,
                 title = true, ymin = true, x = true, series = true }

function P.parse_args(argv)
  local kind = argv[1]
  local files, opts = {}, {}
  local i = 2
  while i <= #argv do
    local a = argv[i]
    local k, v = a:match('^%-%-([%w_]+)=(.*)$')
    if not k then k = a:match('^%-%-([%w_]+)$') end
    if k then
      if FLAGS[k] then
        opts[k] = true
      elseif VALUED[k] then
        if v == nil then
          i = i + 1
          v = argv[i]
          if v == nil then plot_error('--' .. k .. ' needs a value') end
        end
        opts[k] = v
      else
        plot_error("unknown option '--" .. k .. "'\n" .. P.USAGE)
      end
    else
      files[#files + 1] = a
    end
    i = i + 1
  end
  return kind, files, opts
end

function P.main(argv)
  runs.allow_reading_open_files()
  if #argv == 0 or argv[1] == '--help' or argv[1] == '-h' then
    io.write(P.USAGE)
    return
  end
  local kind, files, opts = P.parse_args(argv)
  local job = P.prepare(kind, files, opts)
  for _, w in ipairs(job.warnings or {}) do io.stderr:write('plot: ' .. w .. '\n') end
  local out, stderr = P.render(job, opts.out, opts)
  if stderr and stderr ~= '' then io.stderr:write('gnuplot: ' .. stderr .. '\n') end
  io.write('wrote ' .. out .. '\n')
  return out
end

setmetatable(P, { __call = function(_, kind, files, opts) return P.plot(kind, files, opts) end })

return P
