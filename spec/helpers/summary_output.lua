-- busted output handler for ./bench test: one line per spec file as it finishes, the
-- details of every failure and error, and as the very last line
--   N passed, N failed, N skipped
-- which CI reads. Errors (a spec that raised outside an assertion, or a file that failed
-- to load) count as failed; pending specs count as skipped.
local pretty = require 'pl.pretty'

return function(options)
  local busted = require 'busted'
  local handler = require 'busted.outputHandlers.base'()
  local file_counts = {}
  local current_file
  local t0 = os.clock()

  local function message_of(f)
    local m = f.message
    if type(m) ~= 'string' then m = m == nil and 'nil error' or pretty.write(m) end
    return m
  end

  local function where(f)
    local tr = f.element and f.element.trace
    if tr and tr.short_src then return tr.short_src .. ':' .. tostring(tr.currentline) end
    return '?'
  end

  handler.fileStart = function(file)
    current_file = file.name
    file_counts[current_file] = { p = 0, f = 0, s = 0, t = os.clock() }
    return nil, true
  end

  handler.testEnd = function(element, parent, status)
    local c = file_counts[current_file]
    if c then
      if status == 'success' then c.p = c.p + 1
      elseif status == 'pending' then c.s = c.s + 1
      else c.f = c.f + 1 end
    end
    return nil, true
  end

  handler.fileEnd = function(file)
    local c = file_counts[file.name]
    if c then
      io.write(string.format('%-40s %4d passed %3d failed %3d skipped  %6.2fs\n', file.name, c.p, c.f, c.s,
        os.clock() - c.t))
      io.flush()
    end
    return nil, true
  end

  handler.suiteEnd = function()
    for _, f in ipairs(handler.failures) do
      io.write('\nFAILED ' .. f.name .. '  (' .. where(f) .. ')\n' .. message_of(f) .. '\n')
    end
    for _, f in ipairs(handler.errors) do
      io.write('\nERROR ' .. (f.name or '?') .. '  (' .. where(f) .. ')\n' .. message_of(f) .. '\n')
      if f.trace and f.trace.traceback and options.verbose then io.write(f.trace.traceback .. '\n') end
    end
    io.write(string.format('\n(%.1f s cpu)\n', os.clock() - t0))
    _G.PN_TEST_RESULT = { passed = handler.successesCount, failed = handler.failuresCount + handler.errorsCount,
                          skipped = handler.pendingsCount }
    io.write(string.format('%d passed, %d failed, %d skipped\n', handler.successesCount,
      handler.failuresCount + handler.errorsCount, handler.pendingsCount))
    io.flush()
    return nil, true
  end

  busted.subscribe({ 'file', 'start' }, handler.fileStart)
  busted.subscribe({ 'file', 'end' }, handler.fileEnd)
  busted.subscribe({ 'test', 'end' }, handler.testEnd, { predicate = handler.cancelOnPending })
  busted.subscribe({ 'suite', 'end' }, handler.suiteEnd)
  return handler
end
