-- penumbra.compare — `./bench compare experiments/cora_*.lua seeds=10 [key=value …]`:
-- runs every script over seeds 0..seeds-1 (other key=value pairs are passed to each run),
-- then prints a table — attention, test accuracy mean ± std, val accuracy, epochs (steps),
-- seconds per epoch, and the attention entropy when the runs report attn_entropy (1 = uniform
-- attention) — and saves it as Markdown and HDF5 under runs/compare/.
local pn = require 'penumbra'

local M = {}

local mean_std = require('penumbra.stats').mean_std
M.mean_std = mean_std

local function run_one(script, overrides)
  local prev = rawget(_G, 'args')
  _G.args = overrides
  local ok, res = pcall(dofile, script)
  _G.args = prev
  if not ok then return nil, tostring(res) end
  return res
end

function M.main(argv)
  local scripts, kv = {}, {}
  for _, a in ipairs(argv) do
    local k, v = a:match('^([%w_%.]+)=(.*)$')
    if k then kv[k] = v else scripts[#scripts + 1] = a end
  end
  if #scripts == 0 then error('compare: no experiment scripts given (e.g. ./bench compare experiments/cora_*.lua seeds=10)', 0) end
  local seeds = tonumber(kv.seeds or 3)
  if not seeds or seeds < 1 or seeds % 1 ~= 0 then
    error("compare: seeds must be a whole number >= 1, got '" .. tostring(kv.seeds) .. "'", 0)
  end
  kv.seeds = nil
  local failures = {}
  local rows = {}
  local unit = 'epoch'
  for _, script in ipairs(scripts) do
    local name = script:match('([^/]+)%.lua$') or script
    local row = { name = name, test = {}, val = {}, epochs = {}, spe = {}, ent = {}, base = {}, failed = 0 }
    for seed = 0, seeds - 1 do
      local o = { seed = tostring(seed), _quiet = true }
      for k, v in pairs(kv) do o[k] = v end
      io.stderr:write(string.format('compare: %s seed %d/%d …', name, seed + 1, seeds))
      io.stderr:flush()
      local r, err = run_one(script, o)
      if r and r.status == 'finished' then
        row.name = r.variant or row.name -- what it ran: 'cora_umbral epochs=20'
        row.test[#row.test + 1] = r.test_acc
        row.val[#row.val + 1] = r.val_acc
        -- epoch-based runs report epochs, step-based ones (online data) steps
        unit = r.steps and 'step' or 'epoch'
        row.epochs[#row.epochs + 1] = r.epochs or r.steps
        row.spe[#row.spe + 1] = r.seconds_per_epoch or r.seconds_per_step
        if r.baseline then row.base[#row.base + 1] = r.baseline end
        if r.attn_entropy then row.ent[#row.ent + 1] = r.attn_entropy end
        io.stderr:write(string.format(' test %.4f (%d %ss, %.1fs)\n', r.test_acc or 0 / 0, r.epochs or r.steps, unit, r.seconds))
      else
        row.failed = row.failed + 1
        local why = tostring(err or (r and r.status)):gsub('\n.*', '')
        io.stderr:write(' FAILED: ' .. why .. '\n')
        failures[#failures + 1] = name .. ' seed ' .. seed .. ': ' .. why
        -- a config error (a bad key or value: the same for every seed) stops the compare at once
        if why:find('^experiment: ') then error('compare: ' .. failures[#failures], 0) end
      end
    end
    rows[#rows + 1] = row
  end
  -- the attention-entropy column (experiments whose finish reports attn_entropy) when any has it
  local with_ent, with_base = false, false
  for _, r in ipairs(rows) do
    if #r.ent > 0 then with_ent = true end
    if #r.base > 0 then with_base = true end
  end
  -- runs that report a baseline (SPLP: the optimal constant predictor) get its column
  local lines = {
    string.format('| experiment | test acc (mean ± std, %d seeds) | val acc | %ss | s/%s |%s%s failed |', seeds, unit, unit,
                  with_ent and ' attn entropy |' or '', with_base and ' baseline |' or ''),
    '|---|---|---|---|---|' .. (with_ent and '---|' or '') .. (with_base and '---|' or '') .. '---|' }
  for _, r in ipairs(rows) do
    local tm, ts = mean_std(r.test)
    local vm = mean_std(r.val)
    local em = mean_std(r.epochs)
    local sm = mean_std(r.spe)
    local ent = ''
    if with_ent then ent = #r.ent > 0 and string.format(' %.3f |', (mean_std(r.ent))) or ' – |' end
    if with_base then ent = ent .. (#r.base > 0 and string.format(' %.4f |', (mean_std(r.base))) or ' – |') end
    -- one finished seed has no spread: its value alone, not "± 0.0000"
    local acc = #r.test > 1 and string.format('%.4f ± %.4f', tm, ts) or string.format('%.4f (1 run)', tm)
    lines[#lines + 1] = string.format('| %s | %s | %.4f | %.0f | %.3f |%s %d |', r.name, acc, vm, em, sm, ent, r.failed)
  end
  local md = table.concat(lines, '\n') .. '\n'
  io.write(md)
  local dir = (os.getenv('PENUMBRA_RUNS') or 'runs') .. '/compare'
  os.execute('mkdir -p "' .. dir .. '"')
  local stamp = os.date('!%Y%m%dT%H%M%SZ')
  local mdpath, h5path = dir .. '/' .. stamp .. '.md', dir .. '/' .. stamp .. '.h5'
  local f = io.open(mdpath, 'w')
  if f then f:write(md); f:close() end
  local h = pn.io.open(h5path, 'w')
  for _, r in ipairs(rows) do
    if #r.test > 0 then
      h:write(r.name .. '/test_acc', pn.tensor(r.test, { dtype = 'f64' }))
      h:write(r.name .. '/val_acc', pn.tensor(r.val, { dtype = 'f64' }))
      h:write(r.name .. '/' .. unit .. 's', pn.tensor(r.epochs, { dtype = 'f64' }))
      h:write(r.name .. '/seconds_per_' .. unit, pn.tensor(r.spe, { dtype = 'f64' }))
      if #r.ent > 0 then h:write(r.name .. '/attn_entropy', pn.tensor(r.ent, { dtype = 'f64' })) end
    end
  end
  h:set_attr('/', 'seeds', seeds)
  h:set_attr('/', 'table', md)
  h:close()
  io.write('saved ' .. mdpath .. ' and ' .. h5path .. '\n')
  if #failures > 0 then -- the table is kept (it says how many failed), but the compare failed
    error(string.format('compare: %d run(s) failed; first: %s', #failures, failures[1]), 0)
  end
  return rows
end

return M
