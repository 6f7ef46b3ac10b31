-- penumbra.repl — `./bench repl [run.h5]`: LuaJIT with pn loaded, for looking at runs.
--
-- Line editing and history: rlwrap when it is installed (the REPL re-runs itself under it),
-- else GNU readline through the FFI, else plain io.read. $PN_REPL_EDITOR = rlwrap | readline |
-- plain forces one; history goes to $PN_REPL_HISTORY (default ~/.penumbra_history).
-- Input: a bare expression or `=expr` prints its values (tensors through __tostring); a
-- statement runs; an incomplete chunk (load() fails at '<eof>') continues on the next line
-- with the '>>' prompt; errors are shown and the REPL goes on; Ctrl-D (EOF) leaves; Ctrl-C
-- stops a long Lua loop. Globals persist between lines, `local`s do not (as in lua).
--
-- With a run file: `run` holds path, attrs, config (parsed JSON), summary, metrics and steps
-- (name → tensor), attention / radii (tag → tensor, read on first use), model (rebuilt from
-- /params by the recipe module the run file names, else nil and a note why), data (the
-- recipe's loader or the pn.data registry's config.dataset). Helpers: help(), heatmap(), hist(), spark(), plot(), attend(),
-- show(), runs(), exit().
local pn = require 'penumbra'
local runs = require 'penumbra.runs'
local termplot = require 'penumbra.termplot'
local options = require 'penumbra.options'
local ffi = require 'ffi'

local R = {}

pcall(ffi.cdef, [[
int isatty(int fd);
void free(void *);
]])

local function is_tensor(x) return pn.is_tensor and pn.is_tensor(x) or (type(x) == 'cdata' and x.totable ~= nil) end

-- ---- compiling and printing --------------------------------------------------------------------
-- fn on success; nil, 'incomplete' when more lines are needed; nil, message on a syntax error
function R.compile(src)
  local body = src:gsub('^%s*=', '', 1)
  local f = loadstring('return ' .. body, '=stdin')
  if f then return f end
  local g, err = loadstring(src, '=stdin')
  if g then return g end
  if tostring(err):match("<eof>['\"]?$") then return nil, 'incomplete' end
  return nil, err
end

local function short_table(t, depth, seen)
  seen = seen or {}
  if seen[t] then return '<cycle>' end
  seen[t] = true
  local mt = getmetatable(t)
  if mt and mt.__tostring then return tostring(t) end
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == 'number' or ta == 'string' then return a < b end
    return tostring(a) < tostring(b)
  end)
  local parts = {}
  local n = #t
  for i, k in ipairs(keys) do
    if i > 24 then parts[#parts + 1] = '… (' .. #keys .. ' entries)'; break end
    local v = t[k]
    local vs
    if type(v) == 'table' then vs = depth > 1 and short_table(v, depth - 1, seen) or '{…}'
    elseif is_tensor(v) then vs = 'tensor ' .. v:dtype() .. ' [' .. table.concat(v:shape(), ',') .. ']'
    elseif type(v) == 'string' then vs = string.format('%q', #v > 60 and (v:sub(1, 57) .. '...') or v)
    else vs = tostring(v) end
    if type(k) == 'number' and k >= 1 and k <= n and k % 1 == 0 then parts[#parts + 1] = vs
    elseif type(k) == 'string' and k:match('^[%a_][%w_]*$') then parts[#parts + 1] = k .. ' = ' .. vs
    else parts[#parts + 1] = '[' .. tostring(k) .. '] = ' .. vs end
  end
  return '{ ' .. table.concat(parts, ', ') .. ' }'
end

function R.format(v)
  if type(v) == 'table' then return short_table(v, 2) end
  return tostring(v)
end

local function pack(...) return { n = select('#', ...), ... } end

-- the error message and the frames of the traceback that matter: penumbra code and the
-- user's lines, down to the entered chunk (not the REPL's own machinery)
function R.traceback(e)
  if type(e) ~= 'string' then return e end
  -- `return f(x)` is a tail call, so an error raised "at the caller" lands on this file
  e = e:gsub('^[^\n]-penumbra/repl%.lua:%d+: ', 'stdin: ')
  -- a deliberate message ("heatmap: unknown option …", "plot: …") says all there is: the frames
  -- of the checker that raised it are noise; a runtime error ("attempt to …") keeps them
  local body = e:gsub('^[^\n]-:%d+: ', '')
  if not body:find('attempt to', 1, true) and body:match('^[%a_][%w_%.%s]*: ') then return e end
  local tb = debug.traceback('', 2)
  local keep = {}
  for line in tb:gmatch('[^\n]+') do
    if line:match('penumbra/repl%.lua') or line:match('%[C%]: in function \'xpcall\'') then break end
    if line:match('^%s') and not line:match('%[builtin#') and not line:match('%[C%]: in function \'error\'')
      and not line:match('penumbra_ffi%.lua') then
      keep[#keep + 1] = line
    end
  end
  if #keep == 0 or (#keep == 1 and keep[1]:match('stdin:')) then return e end
  return e .. '\nstack traceback:\n' .. table.concat(keep, '\n')
end

-- Evaluates one complete chunk in env; returns 'ok', text to print | 'error', message.
function R.eval(src, env)
  local f, err = R.compile(src)
  if not f then return 'error', err end
  setfenv(f, env)
  -- the Ctrl-C hook below never fires inside compiled traces: interpret the user's chunk
  -- (and the functions it defines); library code stays compiled
  if jit then jit.off(f, true) end
  local C = R.C
  if C then
    debug.sethook(function()
      if C.pn_interrupted() ~= 0 then
        C.pn_interrupt_install()   -- clears the flag, keeps Ctrl-C polite for the next time
        error('interrupted (Ctrl-C)', 2)
      end
    end, '', 10000)
  end
  local res = pack(xpcall(f, R.traceback))
  if C then debug.sethook() end
  local n = res.n
  if not res[1] then return 'error', tostring(res[2]) end
  if n < 2 then return 'ok', nil end
  local parts = {}
  for i = 2, n do parts[#parts + 1] = R.format(res[i]) end
  return 'ok', table.concat(parts, '\t')
end

-- ---- the run ------------------------------------------------------------------------------------
-- The recipe that rebuilds a run's model: the module named by the run file's `recipe`
-- attribute (the runner stores def.recipe). A recipe module exposes
--   model(cfg, dims)   the model the config describes (dims: num_features, num_classes, …;
--                      a dataset table has them)
--   data(cfg)          optional: its data loader (default: pn.data.load(cfg.dataset))
--   dims(run)          optional: dims read from the checkpoint's shapes, so a model can be
--                      rebuilt without the dataset
--   describe(cfg, dims) optional: one line for the notes
-- Run files written before the attribute existed are all GAT on Planetoid; their configs are
-- recognised by their keys.
local LEGACY_RECIPE = 'penumbra.recipes.gat_planetoid'
function R.recipe_of(run)
  local name = run.attrs and run.attrs.recipe
  if type(name) ~= 'string' or name == '' then
    local c = run.config or {}
    if c.dataset ~= nil and c.score ~= nil and c.heads ~= nil and c.hidden ~= nil then name = LEGACY_RECIPE end
  end
  if not name then return nil, "experiment '" .. tostring(run.experiment) .. "' names no recipe the REPL could rebuild it with" end
  local ok, mod = pcall(require, name)
  if not ok then return nil, "recipe module '" .. name .. "' cannot be loaded: " .. tostring(mod):gsub('\n.*', '') end
  if type(mod) ~= 'table' or type(mod.model) ~= 'function' then
    return nil, "recipe module '" .. name .. "' exposes no model(cfg, dims)"
  end
  return mod, name
end

local function load_data(recipe, cfg)
  if recipe and recipe.data then return recipe.data(cfg) end
  if type(cfg.dataset) ~= 'string' then return nil, 'config.dataset is not set' end
  return pn.data.load(cfg.dataset)
end

local function rebuild(run, recipe, name)
  local c = run.config
  local dims = recipe.dims and recipe.dims(run) or run.data
  if not dims then error('the dataset is not loaded and the recipe cannot read dims from the checkpoint', 0) end
  local model = recipe.model(c, dims)
  model:load(run.ckpt, 'params')
  model:eval()
  local what = recipe.describe and recipe.describe(c, dims) or 'model'
  return model, string.format('%s from /params (recipe %s)', what, name)
end

local Run = {}
Run.__index = Run

-- a dataset of the run file; /params/… from the checkpoint file it names (runs.checkpoint_path)
function Run:read(name)
  if name:match('^/?params/') then return pn.io.load(self.ckpt, name) end
  return pn.io.load(self.path, name)
end
function Run:datasets() return pn.io.list(self.path) end

local function lazy_group(path, group, tags)
  local known = {}
  for _, t in ipairs(tags) do known[t] = true end
  return setmetatable({}, {
    __index = function(t, tag)
      if not known[tag] then return nil end
      local v = pn.io.load(path, group .. '/' .. tag)
      rawset(t, tag, v)
      return v
    end,
    __tostring = function() return '{' .. table.concat(tags, ', ') .. '} (read on first use)' end,
  })
end

-- Opens a run file for the REPL. Returns the run and lines describing it.
function R.load_run(path, opts)
  opts = opts or {}
  local r = runs.open(path)
  local run = setmetatable({ path = path, attrs = r.attrs, config = r.config, summary = r.summary,
    experiment = r.experiment, seed = r.seed, status = r.status, metrics = {}, steps = {} }, Run)
  local names = r:metric_names()
  for _, m in ipairs(names) do
    run.metrics[m] = r:read('metrics/' .. m)
    if r:has('metrics/' .. m .. '_step') then run.steps[m] = r:read('metrics/' .. m .. '_step') end
  end
  run.attention_tags, run.radii_tags = r:tags('attention'), r:tags('radii')
  run.ckpt = runs.checkpoint_path(path, r.attrs)
  local has_params = run.ckpt ~= path and io.open(run.ckpt, 'rb') ~= nil or r:has('params')
  r:close()
  run.attention = lazy_group(path, 'attention', run.attention_tags)
  run.radii = lazy_group(path, 'radii', run.radii_tags)
  local notes = {}
  notes[#notes + 1] = string.format('run: %s (%s, %s)', path, r:label(), tostring(run.status))
  notes[#notes + 1] = '  run.config, run.summary, run.metrics {' .. table.concat(names, ', ') .. '}'
  if #run.attention_tags > 0 then notes[#notes + 1] = '  run.attention {' .. table.concat(run.attention_tags, ', ') .. '}' end
  if #run.radii_tags > 0 then notes[#notes + 1] = '  run.radii {' .. table.concat(run.radii_tags, ', ') .. '}' end
  local recipe, rname = R.recipe_of(run)
  -- the data (first: a recipe may size its model from it)
  if opts.data ~= false and (recipe or type(run.config.dataset) == 'string') then
    local ok, d, why = pcall(load_data, recipe, run.config)
    if ok and d then
      run.data = d
      -- a dataset that describes itself (translation pairs, PPI, scale-free graphs) says it best
      local what = type(d.describe) == 'function' and d:describe() or
        string.format('%s (%s nodes, %s features, %s classes)', tostring(run.config.dataset or d.name), tostring(d.num_nodes or '?'),
          tostring(d.num_features or '?'), tostring(d.num_classes or '?'))
      notes[#notes + 1] = '  run.data: ' .. what
    else
      notes[#notes + 1] = '  run.data: nil (' .. tostring(ok and why or d):gsub('\n.*', '') .. ')'
    end
  end
  -- the model
  if opts.model ~= false then
    if not has_params then
      notes[#notes + 1] = '  run.model: nil (no /params checkpoint in the file)'
    elseif not recipe then
      notes[#notes + 1] = '  run.model: nil (' .. rname .. ')'
    else
      local ok, model, desc = pcall(rebuild, run, recipe, rname)
      if ok then
        run.model = model
        notes[#notes + 1] = '  run.model: ' .. desc
      else
        notes[#notes + 1] = '  run.model: nil (could not rebuild with recipe ' .. rname .. ': '
          .. tostring(model):gsub('\n.*', '') .. ')'
      end
    end
  end
  return run, notes
end

-- ---- helpers --------------------------------------------------------------------------------
local HELP = [[
penumbra REPL — LuaJIT with pn loaded. Expressions print their value (tensors in full);
`=expr` works too; globals persist between lines, locals do not. Ctrl-D leaves.

  run                      the run file given on the command line (nil without one):
    run.path run.attrs run.config run.summary
    run.metrics.loss       a tensor per logged metric (run.steps.<name>: its epochs)
    run.attention.<tag>    (H, Nq, Nk) maps   run.radii.<tag>  learned radii/heights
    run.model              rebuilt from /params by the run's recipe (attr `recipe`)
    run.data               the dataset (the recipe's loader, or pn.data.load(config.dataset))
    run:read(name)         any dataset in the file   run:datasets()  their names
  heatmap(t | tag, {head=1, labels=, row_labels=, col_labels=, color='256'|'truecolor'|'ascii'})
                           draw a matrix, one head of an (H, Nq, Nk) tensor or run.attention[tag]
  hist(values | tag, {bins=20})   histogram of a tensor/table or run.radii[tag]
  spark(values | metric)   one-line sparkline (a metric name reads run.metrics)
  plot(kind, [files], {…}) write a picture with gnuplot (curves, radius, heatmap, compare);
                           files default to the run; returns the path
  attend(q, k, opts)       pn.attention_weights(q, k, opts) (B,H,Nq,Nk) weights
  attend{node=i, layer=1, x=, graph=, max=16}
                           GAT runs: the loaded model's attention of node i (0-based) and its
                           neighbours, recomputed on run.data or new features x / graph;
                           returns (H, n, n) weights with node labels for heatmap()
  show()  runs([dir])      ./bench show for the run, ./bench runs
  help()  exit()
]]

function R.helpers(env, state)
  local out = state.write or function(s) io.write(s) end
  local labels_of = setmetatable({}, { __mode = 'k' })

  local function run_required(what)
    if not env.run then error(what .. ': no run file loaded (./bench repl run.h5)', 3) end
    return env.run
  end

  function env.help() out(HELP) end

  local HEATMAP_OPTS = { head = { 'integer', min = 1 }, batch = { 'integer', min = 1 }, labels = 'table',
                         row_labels = 'table', col_labels = 'table', title = 'string', color = 'string',
                         width = 'number', vmin = 'number', vmax = 'number', cell = 'any' }
  function env.heatmap(t, o)
    if type(o) == 'number' then o = { head = o } end -- heatmap('val1_enc', 2): head 2
    o = options.check('heatmap', o, HEATMAP_OPTS, 2)
    local labels = labels_of[t]
    local rows, cols = o.row_labels or o.labels, o.col_labels or o.labels
    local title = o.title
    local m
    if type(t) == 'string' then
      local run = run_required('heatmap')
      local am = pn.plot.attention_map(run.path, { tag = t, head = o.head })
      m, rows, cols = am.matrix, rows or am.row_labels, cols or am.col_labels
      title = title or string.format('/attention/%s head %d of %d', am.tag, am.head, am.heads)
    elseif is_tensor(t) then
      local shape = t:shape()
      local head = o.head or 1
      if #shape == 4 then t = t:select(1, o.batch or 1); shape = t:shape() end
      if #shape == 3 then
        if head < 1 or head > shape[1] then error(string.format('heatmap: head %d out of range 1..%d', head, shape[1]), 2) end
        title = title or string.format('head %d of %d', head, shape[1])
        t = t:select(1, head)
      elseif #shape ~= 2 and #shape ~= 1 then
        error('heatmap: expected a (Nq, Nk), (H, Nq, Nk) or (B, H, Nq, Nk) tensor, got [' .. table.concat(shape, ',') .. ']', 2)
      end
      m = t
      if labels then rows, cols = rows or labels, cols or labels end
    elseif type(t) == 'table' then
      m = t
    else
      error('heatmap: expected a tensor, a table or an attention tag, got ' .. type(t), 2)
    end
    out(termplot.heatmap(m, { row_labels = rows, col_labels = cols, title = title, color = o.color,
      width = o.width, vmin = o.vmin, vmax = o.vmax, cell = o.cell }))
  end

  function env.hist(v, o)
    o = o or {}
    if type(v) == 'string' then
      local run = run_required('hist')
      local t = run.radii[v]
      if not t then error("hist: the run has no /radii/" .. v .. ' (tags: ' .. table.concat(run.radii_tags, ', ') .. ')', 2) end
      o.title = o.title or ('/radii/' .. v)
      v = t
    end
    out(termplot.hist(v, o))
  end

  function env.spark(v, o)
    if type(v) == 'string' then
      local run = run_required('spark')
      local t = run.metrics[v]
      if not t then error("spark: the run has no metric '" .. v .. "'", 2) end
      out(v .. ' ' .. termplot.spark(t, o) .. '\n')
    else
      out(termplot.spark(v, o) .. '\n')
    end
  end

  function env.plot(kind, files, o)
    if type(files) == 'table' and o == nil and files[1] == nil then files, o = nil, files end
    if files == nil then files = { run_required('plot').path } end
    local path = pn.plot.plot(kind, files, o or {})
    out('wrote ' .. path .. '\n')
    return path
  end

  function env.show() out(runs.show(run_required('show').path)) end
  function env.runs(dir) out(runs.format_list(runs.list(dir), dir or 'runs')) end
  function env.exit(code) state.exit = code or 0; error(state.EXIT, 0) end

  function env.attend(a, b, c)
    if is_tensor(a) then return pn.attention_weights(a, b, c) end
    local o = a or {}
    local run = env.run
    local model = o.model or (run and run.model)
    if not model or not model.layer1 then
      error('attend: needs a GAT model (run.model) — or call attend(q, k, opts) with tensors', 2)
    end
    local data = run and run.data
    local x = o.x or (data and data.x)
    local g = o.graph or (data and data.graph)
    if not x or not g then error('attend: needs node features and a graph (run.data, or {x=, graph=})', 2) end
    local node = o.node or 0
    local w, ids = model:neighbourhood_attention(x, g, node, { layer = o.layer, max = o.max })
    return pn.no_grad(function()
      local idx = pn.tensor(ids, { dtype = 'i64' })
      local labels = {}
      local y = data and data.y and data.y:index_select(1, idx):totable()
      for i, id in ipairs(ids) do labels[i] = y and string.format('%d:c%d', id, y[i]) or tostring(id) end
      labels_of[w] = labels
      return w, labels
    end)
  end
end

-- ---- reading lines ------------------------------------------------------------------------------
local function history_path()
  local p = os.getenv('PN_REPL_HISTORY')
  if p and p ~= '' then return p end
  return (os.getenv('HOME') or '.') .. '/.penumbra_history'
end

local function have(cmd)
  local p = io.popen('command -v ' .. cmd .. ' 2>/dev/null')
  local s = p and p:read('*a') or ''
  if p then p:close() end
  return s:match('%S') ~= nil
end

local function plain_reader()
  return {
    name = 'plain',
    read = function(prompt)
      io.write(prompt)
      io.flush()
      return io.read('*l')
    end,
    close = function() end,
  }
end

local function readline_reader()
  local ok, lib = pcall(ffi.load, 'readline')
  if not ok then ok, lib = pcall(ffi.load, 'libreadline.so.8') end
  if not ok then return nil end
  local okc = pcall(ffi.cdef, [[
    char *readline(const char *prompt);
    void add_history(const char *line);
    int read_history(const char *file);
    int write_history(const char *file);
    int history_truncate_file(const char *file, int lines);
  ]])
  pcall(ffi.cdef, [[
    typedef void (*pn_sighandler_t)(int);
    pn_sighandler_t signal(int sig, pn_sighandler_t handler);
  ]])
  local SIGINT, SIG_IGN = 2, ffi.cast('pn_sighandler_t', 1)
  local hist = history_path()
  pcall(function() lib.read_history(hist) end)
  local last
  return {
    name = 'readline',
    read = function(prompt)
      -- readline re-raises a Ctrl-C to the application's handler and keeps reading; with
      -- SIGINT ignored at the prompt it neither kills the REPL nor leaves a stale flag
      ffi.C.signal(SIGINT, SIG_IGN)
      local p = lib.readline(prompt)
      if R.C then R.C.pn_interrupt_install() end
      if p == nil then return nil end
      local s = ffi.string(p)
      ffi.C.free(p)
      if s:match('%S') and s ~= last then lib.add_history(s); last = s end
      return s
    end,
    close = function()
      pcall(function()
        lib.write_history(hist)
        lib.history_truncate_file(hist, 2000)
      end)
    end,
  }, okc
end

-- rlwrap: replace this process by `rlwrap luajit cli.lua repl …` (execvp, so no shell or
-- parent process sits in between to catch Ctrl-C); returns only when that fails
local function exec_under_rlwrap(argv)
  pcall(ffi.cdef, [[
    int execvp(const char *file, char *const argv[]);
    int setenv(const char *, const char *, int);
  ]])
  local root = os.getenv('PENUMBRA_HOME') or '.'
  local exe = (arg and arg[-1]) or 'luajit'
  local args = { 'rlwrap', '-H', history_path(), '-s', '2000', '-C', 'penumbra', exe, root .. '/lua/penumbra/cli.lua', 'repl' }
  for _, a in ipairs(argv) do args[#args + 1] = a end
  local cargs = ffi.new('const char *[?]', #args + 1)
  for i, a in ipairs(args) do cargs[i - 1] = a end
  cargs[#args] = nil
  ffi.C.setenv('PN_REPL_UNDER_RLWRAP', '1', 1)
  io.stdout:flush()
  ffi.C.execvp('rlwrap', ffi.cast('char *const *', cargs))
  return false
end

-- ---- the loop --------------------------------------------------------------------------------------
function R.main(argv)
  argv = argv or {}
  local path
  for _, a in ipairs(argv) do
    if a == '--help' or a == '-h' then io.write('usage: ./bench repl [run.h5]\n' .. HELP); return end
    if path then error('repl: one run file at most (got ' .. path .. ' and ' .. a .. ')', 0) end
    path = a
  end
  runs.allow_reading_open_files()
  local tty = ffi.C.isatty(0) == 1 and ffi.C.isatty(1) == 1
  local editor = os.getenv('PN_REPL_EDITOR')
  if editor == nil or editor == '' then
    if os.getenv('PN_REPL_UNDER_RLWRAP') then editor = 'plain'
    elseif tty and have('rlwrap') then editor = 'rlwrap'
    elseif tty then editor = 'readline'
    else editor = 'plain' end
  end
  if editor == 'rlwrap' and not os.getenv('PN_REPL_UNDER_RLWRAP') then
    if have('rlwrap') then exec_under_rlwrap(argv) end
    editor = 'readline'
  end
  local reader
  if editor == 'readline' then reader = readline_reader() end
  reader = reader or plain_reader()

  local B = require 'penumbra_ffi'
  R.C = B.C
  pcall(function() R.C.pn_interrupt_install() end)

  local state = { EXIT = {} }
  local env = setmetatable({ pn = pn }, { __index = _G })
  R.helpers(env, state)
  io.write(string.format('penumbra %s REPL (LuaJIT, %s line editing). help() lists the helpers; Ctrl-D leaves.\n',
    tostring(pn.version), reader.name == 'plain' and (os.getenv('PN_REPL_UNDER_RLWRAP') and 'rlwrap' or 'no') or reader.name))
  if path then
    local ok, run, notes = pcall(R.load_run, path)
    if not ok then
      -- the message alone, as ./bench show prints it (the position would be inside this file)
      io.write('could not open the run: ' .. B.unplaced(run) .. '\n')
    else
      env.run = run
      io.write(table.concat(notes, '\n') .. '\n')
    end
  end

  local buffer = nil
  while true do
    local line = reader.read(buffer and '>> ' or 'pn> ')
    if line == nil then
      if R.C.pn_interrupted() ~= 0 then
        -- Ctrl-C at the prompt: drop the pending input, keep going
        R.C.pn_interrupt_install()
        io.write('^C\n')
        buffer = nil
      else
        if tty or reader.name ~= 'plain' then io.write('\n') end
        break
      end
    else
      if R.C.pn_interrupted() ~= 0 then R.C.pn_interrupt_install() end
      local src = buffer and (buffer .. '\n' .. line) or line
      if src:match('^%s*$') then
        buffer = nil
      else
        local f, err = R.compile(src)
        if not f and err == 'incomplete' then
          buffer = src
        else
          buffer = nil
          local status, text = R.eval(src, env)
          if status == 'error' and state.exit then break end
          if text then
            io.write(text, '\n')
          end
          io.flush()
        end
      end
    end
  end
  reader.close()
  io.flush()
  if state.exit and state.exit ~= 0 then os.exit(state.exit, true) end
end

-- Evaluate lines without a terminal (specs): returns the printed text.
function R.run_lines(lines, env)
  env = env or setmetatable({ pn = pn }, { __index = _G })
  local outbuf = {}
  local state = { EXIT = {}, write = function(s) outbuf[#outbuf + 1] = s end }
  R.helpers(env, state)
  local buffer
  for _, line in ipairs(lines) do
    local src = buffer and (buffer .. '\n' .. line) or line
    local f, err = R.compile(src)
    if not f and err == 'incomplete' then buffer = src
    else
      buffer = nil
      local status, text = R.eval(src, env)
      if text then outbuf[#outbuf + 1] = (status == 'error' and 'error: ' or '') .. text .. '\n' end
    end
  end
  return table.concat(outbuf), env
end

return R
