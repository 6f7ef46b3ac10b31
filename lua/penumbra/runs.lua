-- penumbra.runs — reading run files (DESIGN §5) for people: `./bench runs [dir]` lists them,
-- `./bench show run.h5` prints one; plot and repl read runs through M.open.
--
--   local r = runs.open('runs/cora_umbral/20240101T000000Z-s0.h5')
--   r.path r.attrs r.experiment r.seed r.status r.config (JSON parsed) r.summary
--   r:datasets()            -> sorted dataset names ('metrics/loss', 'params/layer1/…', …)
--   r:metric_names()        -> sorted names under /metrics (without the *_step companions)
--   r:metric(name)          -> values, steps (Lua arrays; steps 1..n when no *_step was logged)
--   r:tags(group)           -> sorted tags under /radii or /attention
--   r:read(name)            -> tensor     r:attrs_of(name) -> attributes of a dataset/group
--   r:label()               -> 'cora_umbral s0' (legend text)
--   runs.list(dir)          -> one row per run file under dir, oldest first
--   runs.show(path)         -> the text of `./bench show`
--   runs.json_decode(s)     -> Lua value (the config attribute)
local pio = require 'penumbra.io'
local ffi = require 'ffi'

local M = {}

-- The read-only commands (runs, show, plot, repl) look at run files that an experiment may
-- still have open for writing; HDF5's file locking refuses that ("cannot open … with mode
-- 'r'"). The writer flushes every epoch, so reading is safe: these commands call this first
-- (never the library itself, so an experiment's own writes keep their lock). An explicit
-- $HDF5_USE_FILE_LOCKING wins.
function M.allow_reading_open_files()
  pcall(ffi.cdef, 'int setenv(const char *, const char *, int);')
  pcall(function() ffi.C.setenv('HDF5_USE_FILE_LOCKING', 'FALSE', 0) end)
end

-- ---- JSON (the config attribute): lua-cjson through penumbra.json ---------------------------
M.json_decode = require('penumbra.json').decode

-- ---- one run file ----------------------------------------------------------------------------
local Run = {}
Run.__index = Run
M.Run = Run

local function basename(p) return (p:match('([^/]+)$') or p) end
M.basename = basename

-- The file that holds a run's /params: the checkpoint file the run file names (attr
-- checkpoint, next to it), or the run file itself (files from before checkpoints moved out).
function M.checkpoint_path(path, attrs)
  if attrs and type(attrs.checkpoint) == 'string' and attrs.checkpoint ~= '' then
    return (path:match('^(.*/)') or '') .. attrs.checkpoint
  end
  return path
end

function M.open(path)
  if type(path) ~= 'string' then error('runs: path must be a string, got ' .. type(path), 2) end
  local fh = io.open(path, 'rb')
  if not fh then error('runs: cannot open ' .. path .. ' (no such file)', 2) end
  fh:close()
  local ok, f = pcall(pio.open, path, 'r')
  if not ok then error('runs: ' .. path .. ' is not a readable HDF5 file: ' .. tostring(f), 2) end
  local r = setmetatable({ path = path, f = f }, Run)
  r.attrs = f:attrs('/')
  r.experiment = r.attrs.experiment
  r.seed = r.attrs.seed
  r.status = r.attrs.status
  r.config = {}
  if type(r.attrs.config) == 'string' then
    local okc, cfg = pcall(M.json_decode, r.attrs.config)
    if okc and type(cfg) == 'table' then r.config = cfg end
  end
  r.summary = f:exists('summary') and f:attrs('summary') or {}
  -- what it ran: 'cora_umbral epochs=20' (files from before the attribute: the experiment)
  r.variant = type(r.attrs.variant) == 'string' and r.attrs.variant or r.experiment
  return r
end

-- The config without the keys that do not change what a run computes (seed, quiet, threads),
-- as sorted 'k=v' text: runs with the same experiment and config_key differ only in the seed.
local UNNAMED = { seed = true, quiet = true, threads = true }
-- one text per value, tables with their keys sorted (so equal configs give equal text)
local function canon(v)
  if type(v) ~= 'table' then return type(v) == 'string' and string.format('%q', v) or tostring(v) end
  local parts = {}
  for _, k in ipairs(M.sorted_keys(v)) do parts[#parts + 1] = tostring(k) .. ':' .. canon(v[k]) end
  return '{' .. table.concat(parts, ',') .. '}'
end
M.canon = canon
function M.config_key(r)
  local parts = {}
  for _, k in ipairs(M.sorted_keys(r.config)) do
    if not UNNAMED[k] then parts[#parts + 1] = k .. '=' .. canon(r.config[k]) end
  end
  return table.concat(parts, ' ')
end

function Run:close() if self.f then self.f:close() end end
function Run:is_run() return self.experiment ~= nil end

function Run:datasets()
  if not self._datasets then self._datasets = self.f:list('/') end
  return self._datasets
end

function Run:has(name) return self.f:exists(name) end
function Run:read(name) return self.f:read(name) end
function Run:attrs_of(name) return self.f:attrs(name) end
-- text an experiment wrote with run:write_text (u8 bytes, attr encoding=utf-8)
function Run:read_text(name)
  local t = self.f:read(name)
  if t:dtype() ~= 'u8' then error('runs: ' .. name .. ' is ' .. t:dtype() .. ', not text (u8)', 2) end
  local n = t:numel()
  return n > 0 and ffi.string(t:contiguous():data_ptr(), n) or ''
end

function Run:label()
  local name = self.variant or basename(self.path):gsub('%.h5$', '')
  if self.seed ~= nil then name = name .. ' s' .. tostring(self.seed) end
  return name
end

local function flat(t)
  if t:numel() == 0 then return {} end
  local v = t:contiguous():reshape({ t:numel() }):totable()
  return v
end
M.flat = flat

-- names under group, relative to it (f:list gives full paths)
local function children(f, group)
  local out = {}
  if not f:exists(group) then return out end
  local prefix = group:gsub('^/', ''):gsub('/$', '') .. '/'
  for _, n in ipairs(f:list(group)) do
    n = n:gsub('^/', '')
    if n:sub(1, #prefix) == prefix then n = n:sub(#prefix + 1) end
    out[#out + 1] = n
  end
  table.sort(out)
  return out
end

function Run:metric_names()
  local out = {}
  local seen = {}
  for _, n in ipairs(children(self.f, 'metrics')) do seen[n] = true end
  for n in pairs(seen) do
    local base = n:match('^(.*)_step$')
    if not (base and seen[base]) then out[#out + 1] = n end
  end
  table.sort(out)
  return out
end

-- values and steps of /metrics/<name> as Lua arrays
function Run:metric(name)
  local key = 'metrics/' .. name
  if not self.f:exists(key) then
    error(string.format("runs: %s has no metric '%s' (it has: %s)", self.path, name,
      table.concat(self:metric_names(), ', ')), 2)
  end
  local values = flat(self.f:read(key))
  local steps
  if self.f:exists(key .. '_step') then steps = flat(self.f:read(key .. '_step')) end
  if not steps or #steps ~= #values then
    steps = {}
    for i = 1, #values do steps[i] = i end
  end
  return values, steps
end

function Run:tags(group) return children(self.f, group) end

-- ---- formatting helpers ----------------------------------------------------------------------
local function fmt_value(v)
  if type(v) == 'number' then
    if v % 1 == 0 and math.abs(v) < 1e15 then return string.format('%d', v) end
    return string.format('%.4g', v)
  end
  if type(v) == 'string' then return v end
  if type(v) == 'cdata' and v.shape then return '[' .. table.concat(v:shape(), ',') .. '] ' .. v:dtype() end
  return tostring(v)
end
M.fmt_value = fmt_value

local function date_of(iso)
  if type(iso) ~= 'string' then return '?' end
  local d, t = iso:match('^(%d%d%d%d%-%d%d%-%d%d)T(%d%d:%d%d)')
  return d and (d .. ' ' .. t) or iso
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end
M.sorted_keys = sorted_keys

-- the summary's "best" entry: best_<monitor> first, then test_acc
local function best_of(summary)
  for _, k in ipairs(sorted_keys(summary)) do
    if k:match('^best_') and not k:match('_epoch$') and not k:match('_step$') and type(summary[k]) == 'number' then return k, summary[k] end
  end
  return nil
end

-- the summary's test score: test_<m> of the monitored val_<m> (best_val_<m>), else test_acc
function M.test_of(summary)
  local bk = best_of(summary)
  local m = bk and bk:match('^best_val_(.+)$')
  if m and type(summary['test_' .. m]) == 'number' then return 'test_' .. m, summary['test_' .. m] end
  if type(summary.test_acc) == 'number' then return 'test_acc', summary.test_acc end
  return nil
end

-- ---- ./bench runs ---------------------------------------------------------------------------
local function find_h5(dir)
  local out = {}
  local p = io.popen("find '" .. dir:gsub("'", "'\\''") .. "' -name '*.h5' -type f 2>/dev/null")
  if p then
    for line in p:lines() do out[#out + 1] = line end
    p:close()
  end
  table.sort(out)
  return out
end

-- One row per run file: {path, experiment, seed, status, best_key, best, test_key, test, epochs, date,
-- error}; a run still marked running whose process is gone on this host shows as dead. Files that are not run files (./bench compare tables) get kind = 'compare'.
-- The process that writes a run file (attrs pid, host): 'alive', 'gone', or 'unknown' (another
-- host; no pid: files from before the attribute). writer_alive counts unknown as alive.
local this_host
function M.writer_state(attrs)
  local pid, host = tonumber(attrs.pid), attrs.host
  if not pid or pid <= 0 or not host then return 'unknown' end
  if not this_host then
    local p = io.popen('hostname 2>/dev/null')
    this_host = p and (p:read('*l') or '') or ''
    if p then p:close() end
  end
  if host ~= this_host then return 'unknown' end
  return pio.file_exists('/proc/' .. pid .. '/stat') and 'alive' or 'gone'
end
function M.writer_alive(attrs) return M.writer_state(attrs) ~= 'gone' end

function M.list(dir)
  dir = dir or os.getenv('PENUMBRA_RUNS') or 'runs'
  local rows = {}
  for _, path in ipairs(find_h5(dir)) do
    local row = { path = path }
    local ok, r = pcall(M.open, path)
    if not ok then
      row.error = tostring(r):gsub('^runs: ', '')
    else
      local okr, e = pcall(function()
        row.experiment, row.seed, row.status = r.variant, r.seed, r.status
        row.date = r.attrs.start_time
        if row.status == 'running' and not M.writer_alive(r.attrs) then row.status = 'dead (was running)' end
        -- a stopped run with a resume state: resume=<its file> goes on with it (penumbra/resume.lua)
        if row.status ~= 'finished' and row.status ~= 'running'
            and pio.file_exists(require('penumbra.resume').path_of(path)) then
          row.status = row.status .. ', resumable'
        end
        if not r:is_run() then
          row.kind = r.attrs.table and 'compare' or 'other'
        else
          row.kind = 'run'
          row.best_key, row.best = best_of(r.summary)
          row.test_key, row.test = M.test_of(r.summary)
          row.epochs = r.summary.epochs
        end
      end)
      if not okr then row.error = tostring(e) end
      r:close()
    end
    rows[#rows + 1] = row
  end
  table.sort(rows, function(a, b)
    local da, db = a.date or '', b.date or ''
    if da ~= db then return da < db end
    return a.path < b.path
  end)
  return rows
end

local function pad(s, n)
  s = tostring(s)
  local len = #s:gsub('[\128-\191]', '')
  if len >= n then return s end
  return s .. string.rep(' ', n - len)
end

function M.format_list(rows, dir)
  if #rows == 0 then return 'no run files under ' .. tostring(dir) .. '\n' end
  local header = { 'experiment', 'seed', 'status', 'best', 'test', 'epochs', 'started (UTC)', 'file' }
  local lines = {}
  local widths = {}
  local cells = {}
  for _, r in ipairs(rows) do
    local c
    if r.error then
      c = { '?', '', 'unreadable', '', '', '', '', r.path .. '  (' .. r.error:gsub('\n.*', '') .. ')' }
    elseif r.kind ~= 'run' then
      c = { r.kind == 'compare' and '(compare table)' or '(not a run file)', '', '', '', '', '', '', r.path }
    else
      c = { r.experiment or '?', r.seed ~= nil and fmt_value(r.seed) or '', r.status or '?',
            r.best_key and (r.best_key:gsub('^best_', '') .. ' ' .. string.format('%.4f', r.best)) or '',
            r.test_key and (r.test_key:gsub('^test_', '') .. ' ' .. string.format('%.4f', r.test)) or '', r.epochs and fmt_value(r.epochs) or '',
            date_of(r.date), r.path }
    end
    cells[#cells + 1] = c
  end
  for i, h in ipairs(header) do widths[i] = #h end
  for _, c in ipairs(cells) do
    for i = 1, #header - 1 do widths[i] = math.max(widths[i], #tostring(c[i]):gsub('[\128-\191]', '')) end
  end
  local function line(c)
    local parts = {}
    for i = 1, #header - 1 do parts[i] = pad(c[i], widths[i]) end
    parts[#header] = c[#header]
    return table.concat(parts, '  ')
  end
  lines[1] = line(header)
  for _, c in ipairs(cells) do lines[#lines + 1] = line(c) end
  return table.concat(lines, '\n') .. '\n'
end

-- ---- ./bench show ---------------------------------------------------------------------------
local ROOT_ORDER = { 'experiment', 'seed', 'status', 'start_time', 'end_time', 'git_commit', 'host', 'threads', 'error' }

function M.show(path)
  local r = M.open(path)
  local out = {}
  local function w(s) out[#out + 1] = s end
  local ok, e = pcall(function()
    w(path)
    local shown = { config = true }
    for _, k in ipairs(ROOT_ORDER) do
      if r.attrs[k] ~= nil then
        w(string.format('  %-12s %s', k, fmt_value(r.attrs[k])))
        shown[k] = true
      end
    end
    for _, k in ipairs(sorted_keys(r.attrs)) do
      if not shown[k] then
        local v = fmt_value(r.attrs[k])
        if #v > 200 or v:find('\n') then v = v:gsub('\n', '\n' .. string.rep(' ', 15)) end
        w(string.format('  %-12s %s', k, v))
      end
    end
    if next(r.config) then
      w('config')
      for _, k in ipairs(sorted_keys(r.config)) do
        local v = r.config[k]
        if type(v) == 'table' then v = require('penumbra.json').encode(v) end
        w(string.format('  %-16s %s', k, fmt_value(v)))
      end
    elseif type(r.attrs.config) == 'string' then
      w('config (unparsed): ' .. r.attrs.config)
    end
    if next(r.summary) then
      w('summary')
      for _, k in ipairs(sorted_keys(r.summary)) do w(string.format('  %-22s %s', k, fmt_value(r.summary[k]))) end
    end
    w('datasets')
    local names = r:datasets()
    local group_of = function(n) return n:match('^([^/]+)/') or '' end
    local nparams, params_count = 0, 0
    for _, n in ipairs(names) do
      if n ~= 'summary/.keep' then
        local t = r:read(n)
        local shape = '[' .. table.concat(t:shape(), ',') .. ']'
        local extra = ''
        if group_of(n) == 'params' then
          nparams, params_count = nparams + 1, params_count + t:numel()
        end
        if group_of(n) == 'metrics' and not n:match('_step$') and t:numel() > 0 then
          local v = flat(t)
          extra = string.format('  last %s', fmt_value(v[#v]))
        end
        local a = r.f:attrs(n)
        local akeys = sorted_keys(a)
        if #akeys > 0 then
          local parts = {}
          for _, k in ipairs(akeys) do
            local v = fmt_value(a[k])
            if k == 'labels' and type(a[k]) == 'string' then
              local count = select(2, a[k]:gsub('\n', '')) + 1
              v = count .. ' labels'
            end
            if #v > 40 then v = v:sub(1, 37) .. '...' end
            parts[#parts + 1] = k .. '=' .. v:gsub('\n', ' ')
          end
          extra = extra .. '  {' .. table.concat(parts, ', ') .. '}'
        end
        w(string.format('  /%-34s %-6s %s%s', n, t:dtype(), shape, extra))
      end
    end
    if nparams > 0 then
      local a = r.f:attrs('params')
      local parts = {}
      for _, k in ipairs(sorted_keys(a)) do parts[#parts + 1] = k .. ' ' .. fmt_value(a[k]) end
      w(string.format('  (%d parameter tensors, %d values under /params%s)', nparams, params_count,
        #parts > 0 and ('; checkpoint ' .. table.concat(parts, ', ')) or ''))
    end
    local ckpt = M.checkpoint_path(path, r.attrs)
    if ckpt ~= path then -- the checkpoint lives in its own file
      local okc, c = pcall(function()
        local a = pio.attrs(ckpt, 'params')
        local parts = {}
        for _, k in ipairs(sorted_keys(a)) do parts[#parts + 1] = k .. ' ' .. fmt_value(a[k]) end
        return string.format('%d tensors (%s)', #pio.list(ckpt, 'params'), table.concat(parts, ', '))
      end)
      w('checkpoint ' .. ckpt .. ': ' .. (okc and c or ('unreadable: ' .. tostring(c):gsub('\n.*', ''))))
    end
  end)
  r:close()
  if not ok then error(e, 0) end
  return table.concat(out, '\n') .. '\n'
end

-- ---- CLI entries ------------------------------------------------------------------------------
function M.main_runs(argv)
  M.allow_reading_open_files()
  if #argv > 1 then
    error("runs: one folder at a time, got " .. #argv .. " arguments ('" .. table.concat(argv, "' '") .. "')", 0)
  end
  local dir = argv[1] or os.getenv('PENUMBRA_RUNS') or 'runs'
  local d = io.open(dir, 'r')
  if not d then error("runs: no such folder '" .. dir .. "'", 0) end
  local _, rerr = d:read(1) -- a folder opens, and its read fails with EISDIR
  d:close()
  if not (rerr and rerr:find('directory', 1, true)) then
    error("runs: '" .. dir .. "' is a file, not a folder of runs" ..
      (dir:match('%.h5$') and ' (one run file: ./bench show ' .. dir .. ')' or ''), 0)
  end
  io.write(M.format_list(M.list(dir), dir))
end

function M.main_show(argv)
  M.allow_reading_open_files()
  if #argv == 0 then error('show: give a run file: ./bench show runs/<experiment>/<stamp>.h5', 0) end
  for i, path in ipairs(argv) do
    if i > 1 then io.write('\n') end
    io.write(M.show(path))
  end
end

return M
