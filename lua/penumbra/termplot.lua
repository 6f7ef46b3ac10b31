-- penumbra.termplot — pictures in the terminal, as strings (the REPL prints them).
--
--   termplot.heatmap(m, {row_labels=, col_labels=, title=, color='truecolor'|'256'|'ascii',
--                        width=80, max_lines=40, cell=nil, vmin=, vmax=})
--     m: 2-D Lua array (rows of numbers) or a 2-D tensor. Drawn with Unicode upper half-blocks
--     '▀': the foreground colour paints the upper half of a character cell, the background
--     colour the lower half, so one text line holds two rows of pixels and a pixel is about
--     square. Small matrices are scaled up (each entry `cell` characters wide and `cell` half
--     lines high, cell even so every row starts on a line of its own and gets its label);
--     with cell = 1 each line holds two matrix rows: the label on the left names the upper
--     row, the one on the right the lower row. Matrices wider than the terminal are
--     block-averaged. A colour scale with its numbers ends the picture.
--     color: explicit, else $PN_COLOR, else 'ascii' when stdout is not a terminal (a pipe, a
--     file), else 'truecolor' when $COLORTERM says truecolor/24bit, else '256'.
--   termplot.hist(values, {bins=20, width=40, title=}) -> horizontal bars with counts
--   termplot.spark(values, {width=60}) -> one line of ▁▂▃▄▅▆▇█
local M = {}

-- viridis, 10 stops (matplotlib's colormap, sampled)
local VIRIDIS = {
  { 68, 1, 84 }, { 72, 40, 120 }, { 62, 73, 137 }, { 49, 104, 142 }, { 38, 130, 142 },
  { 31, 158, 137 }, { 53, 183, 121 }, { 109, 205, 89 }, { 180, 222, 44 }, { 253, 231, 37 },
}

-- t in [0, 1] → r, g, b (0..255)
function M.colour(t)
  if t ~= t then return nil end
  t = math.max(0, math.min(1, t))
  local x = t * (#VIRIDIS - 1)
  local i = math.min(math.floor(x), #VIRIDIS - 2)
  local f = x - i
  local a, b = VIRIDIS[i + 1], VIRIDIS[i + 2]
  local function mix(k) return math.floor(a[k] + (b[k] - a[k]) * f + 0.5) end
  return mix(1), mix(2), mix(3)
end

-- nearest xterm-256 colour: the 6×6×6 cube (16..231) or the grey ramp (232..255)
local LEVELS = { 0, 95, 135, 175, 215, 255 }
function M.rgb_to_256(r, g, b)
  local function nearest_level(c)
    local best, bi = math.huge, 1
    for i, l in ipairs(LEVELS) do
      local d = math.abs(c - l)
      if d < best then best, bi = d, i end
    end
    return bi - 1
  end
  local ri, gi, bi = nearest_level(r), nearest_level(g), nearest_level(b)
  local cr, cg, cb = LEVELS[ri + 1], LEVELS[gi + 1], LEVELS[bi + 1]
  local dc = (r - cr) ^ 2 + (g - cg) ^ 2 + (b - cb) ^ 2
  local grey = math.floor(((r + g + b) / 3 - 8) / 10 + 0.5)
  grey = math.max(0, math.min(23, grey))
  local gv = 8 + 10 * grey
  local dg = (r - gv) ^ 2 + (g - gv) ^ 2 + (b - gv) ^ 2
  if dg < dc then return 232 + grey end
  return 16 + 36 * ri + 6 * gi + bi
end

local ffi = require 'ffi'
pcall(ffi.cdef, 'int isatty(int fd);')

function M.color_mode(opt)
  local m = opt or os.getenv('PN_COLOR')
  if m == 'truecolor' or m == '24bit' then return 'truecolor' end
  if m == '256' then return '256' end
  if m == 'ascii' or m == 'none' then return 'ascii' end
  -- no escape codes into a pipe or a file unless asked for (color= or $PN_COLOR)
  if ffi.C.isatty(1) ~= 1 then return 'ascii' end
  local ct = os.getenv('COLORTERM') or ''
  if ct == 'truecolor' or ct == '24bit' then return 'truecolor' end
  return '256'
end

local function sgr(mode, layer, t) -- layer 38 (fg) or 48 (bg); t nil → default colour
  if t == nil or t ~= t then return '\27[' .. (layer + 1) .. 'm' end
  local r, g, b = M.colour(t)
  if mode == 'truecolor' then return string.format('\27[%d;2;%d;%d;%dm', layer, r, g, b) end
  return string.format('\27[%d;5;%dm', layer, M.rgb_to_256(r, g, b))
end

-- ---- text helpers ----------------------------------------------------------------------------
local UTF8_CHAR = '[%z\1-\127\194-\244][\128-\191]*'
local function chars(s)
  local out = {}
  for c in tostring(s):gmatch(UTF8_CHAR) do out[#out + 1] = c end
  return out
end
local function width(s) return #chars(s) end
local function truncate(s, n)
  local c = chars(s)
  if #c <= n then return tostring(s) end
  return table.concat(c, '', 1, n - 1) .. '…'
end
local function rpad(s, n) return s .. string.rep(' ', n - width(s)) end
local function lpad(s, n) return string.rep(' ', n - width(s)) .. s end
M.width = width

local function fmt(v)
  if v ~= v then return 'nan' end
  local s = string.format('%.3g', v)
  return s
end

local function to_matrix(m)
  if type(m) ~= 'table' then
    if m and m.totable then
      local shape = m:shape()
      if #shape == 1 then m = m:reshape({ 1, shape[1] }) end
      if #m:shape() ~= 2 then
        error('heatmap: expected a 2-D matrix, got shape [' .. table.concat(m:shape(), ',') .. ']', 3)
      end
      return m:contiguous():to('f64'):totable()
    end
    error('heatmap: expected a 2-D table or tensor, got ' .. type(m), 3)
  end
  if type(m[1]) == 'number' then return { m } end
  return m
end

local function values_of(v)
  if type(v) == 'table' then return v end
  if v and v.totable then
    if v:numel() == 0 then return {} end
    return v:contiguous():to('f64'):reshape({ v:numel() }):totable()
  end
  error('expected a table of numbers or a tensor, got ' .. type(v), 3)
end
M.values_of = values_of

-- block-average an R×K matrix by factor f (labels of the first row/column of each block)
local function downsample(m, f, rl, cl)
  local R, K = #m, #m[1]
  local out, nrl, ncl = {}, {}, {}
  for i0 = 1, R, f do
    local row = {}
    for j0 = 1, K, f do
      local s, n = 0, 0
      for i = i0, math.min(R, i0 + f - 1) do
        for j = j0, math.min(K, j0 + f - 1) do
          local v = m[i][j]
          if v == v then s, n = s + v, n + 1 end
        end
      end
      row[#row + 1] = n > 0 and s / n or 0 / 0
    end
    out[#out + 1] = row
    nrl[#nrl + 1] = rl[i0]
  end
  for j0 = 1, K, f do ncl[#ncl + 1] = cl[j0] end
  return out, nrl, ncl
end

-- ---- heatmap ---------------------------------------------------------------------------------
function M.heatmap(m, opts)
  opts = opts or {}
  m = to_matrix(m)
  local R = #m
  local K = R > 0 and #m[1] or 0
  if R == 0 or K == 0 then return '(empty matrix)\n' end
  local mode = M.color_mode(opts.color)
  local total_w = opts.width or tonumber(os.getenv('COLUMNS') or '') or 80
  local max_lines = opts.max_lines or 40

  local rl, cl = {}, {}
  for i = 1, R do rl[i] = opts.row_labels and opts.row_labels[i] ~= nil and tostring(opts.row_labels[i]) or tostring(i) end
  for j = 1, K do cl[j] = opts.col_labels and opts.col_labels[j] ~= nil and tostring(opts.col_labels[j]) or tostring(j) end
  for i = 1, R do rl[i] = truncate(rl[i]:gsub('%s+', ' '), 12) end
  for j = 1, K do cl[j] = truncate(cl[j]:gsub('%s+', ' '), 8) end

  local vmin, vmax = opts.vmin, opts.vmax
  if not vmin or not vmax then
    local lo, hi = math.huge, -math.huge
    for i = 1, R do for j = 1, K do
      local v = m[i][j]
      if v == v then lo, hi = math.min(lo, v), math.max(hi, v) end
    end end
    if lo == math.huge then lo, hi = 0, 1 end
    vmin, vmax = vmin or lo, vmax or hi
  end
  local span = vmax - vmin
  if span <= 0 then span = 1 end

  -- fit: downsample when even one character per column (or half-line per row) is too much
  local lw = 0
  for i = 1, R do lw = math.max(lw, width(rl[i])) end
  local note
  local avail = math.max(8, total_w - 2 * lw - 3)
  local f = math.max(math.ceil(K / avail), math.ceil(R / (2 * max_lines)))
  if f > 1 then
    note = string.format('(%d×%d block-averaged by %d to %d×%d)', R, K, f, math.ceil(R / f), math.ceil(K / f))
    m, rl, cl = downsample(m, f, rl, cl)
    R, K = #m, #m[1]
  end
  local s = opts.cell
  if s and s > 1 and s % 2 == 1 then s = s + 1 end  -- even, so every row starts a line
  if not s then
    s = 1
    for _, c in ipairs({ 6, 4, 2 }) do
      if K * c <= total_w - lw - 1 and R * c / 2 <= max_lines then s = c; break end
    end
  end
  local right = (s % 2 == 1)   -- two rows per line share it: the lower row's label goes right

  local out = {}
  local function w(line) out[#out + 1] = line end
  if opts.title then w(opts.title) end

  -- column labels: horizontal when each fits its cell, else vertical (bottom-aligned)
  local horizontal, numeric = true, true
  for j = 1, K do
    if width(cl[j]) > s - 1 then horizontal = false end
    if not cl[j]:match('^%d+$') then numeric = false end
  end
  local gutter = string.rep(' ', lw + 1)
  if numeric and not horizontal then
    -- indices: every few columns, left-aligned over their column, where there is room
    local line, pos = {}, 0
    for j = 1, K do
      local at = (j - 1) * s
      if at >= pos and (j == 1 or (j - 1) % 5 == 0 or s > 1) then
        line[#line + 1] = string.rep(' ', at - pos) .. cl[j]
        pos = at + #cl[j] + 1
        line[#line + 1] = ' '
      end
    end
    w((gutter .. table.concat(line)):gsub('%s+$', ''))
  elseif horizontal then
    local parts = {}
    for j = 1, K do
      local lab = cl[j]
      local before = math.floor((s - width(lab)) / 2)
      parts[j] = string.rep(' ', before) .. lab .. string.rep(' ', s - before - width(lab))
    end
    w((gutter .. table.concat(parts)):gsub('%s+$', ''))
  else
    local L = 0
    local cc = {}
    for j = 1, K do cc[j] = chars(cl[j]); L = math.max(L, #cc[j]) end
    local off = math.floor((s - 1) / 2)
    for li = 1, L do
      local parts = {}
      for j = 1, K do
        local c = cc[j][li - (L - #cc[j])] or ' '
        parts[j] = string.rep(' ', off) .. c .. string.rep(' ', s - off - 1)
      end
      w((gutter .. table.concat(parts)):gsub('%s+$', ''))
    end
  end

  -- the grid: half-line h (0-based) shows matrix row floor(h / s) + 1
  local H = R * s
  local lines = math.ceil(H / 2)
  local label_line = {}
  if not right then
    local per = s / 2
    for r = 1, R do label_line[(r - 1) * per + math.floor((per - 1) / 2)] = r end
  end
  local shades = ' .:-=+*#%@'
  for li = 0, lines - 1 do
    local up = math.floor(2 * li / s) + 1
    local lo = math.floor((2 * li + 1) / s) + 1
    if 2 * li + 1 >= H then lo = nil end
    local left, rtext = '', ''
    if right then
      left = rl[up]
      rtext = lo and (' ' .. rl[lo]) or ''
    elseif label_line[li] then
      left = rl[label_line[li]]
    end
    local parts = { lpad(left, lw), ' ' }
    local last_fg, last_bg
    for j = 1, K do
      local tu = (m[up][j] - vmin) / span
      local tl = lo and (m[lo][j] - vmin) / span or nil
      for _ = 1, s do
        if mode == 'ascii' then
          local t = tu
          if t ~= t then parts[#parts + 1] = ' '
          else
            local k = math.floor(math.max(0, math.min(1, t)) * (#shades - 1) + 0.5) + 1
            parts[#parts + 1] = shades:sub(k, k)
          end
        else
          local fg, bg = sgr(mode, 38, tu), sgr(mode, 48, tl)
          if fg ~= last_fg then parts[#parts + 1] = fg; last_fg = fg end
          if bg ~= last_bg then parts[#parts + 1] = bg; last_bg = bg end
          parts[#parts + 1] = (tu ~= tu) and ' ' or '▀'
        end
      end
    end
    if mode ~= 'ascii' then parts[#parts + 1] = '\27[0m' end
    parts[#parts + 1] = rtext
    w((table.concat(parts):gsub('%s+$', '')))
  end

  -- the scale: a gradient from vmin to vmax with the numbers under it
  local gw = math.max(12, math.min(32, K * s))
  local bar = { gutter }
  for x = 0, gw - 1 do
    local t = x / (gw - 1)
    if mode == 'ascii' then
      local k = math.floor(t * (#shades - 1) + 0.5) + 1
      bar[#bar + 1] = shades:sub(k, k)
    else
      bar[#bar + 1] = sgr(mode, 38, t) .. sgr(mode, 48, t) .. '▀'
    end
  end
  if mode ~= 'ascii' then bar[#bar + 1] = '\27[0m' end
  w(table.concat(bar))
  local midv = (vmin + vmax) / 2
  if math.abs(midv) < 1e-6 * span then midv = 0 end
  local a, mid, b = fmt(vmin), fmt(midv), fmt(vmax)
  local scale = rpad(a, math.floor(gw / 2) - math.floor(width(mid) / 2))
  scale = scale .. mid
  scale = rpad(scale, gw - width(b)) .. b
  w(gutter .. scale)
  if right and R > 1 then w(gutter .. '(two rows per line: left label = upper half, right label = lower half)') end
  if note then w(gutter .. note) end
  return table.concat(out, '\n') .. '\n'
end

-- ---- histogram --------------------------------------------------------------------------------
local EIGHTHS = { '', '▏', '▎', '▍', '▌', '▋', '▊', '▉' }

function M.hist(values, opts)
  opts = opts or {}
  local v = {}
  for _, x in ipairs(values_of(values)) do if x == x then v[#v + 1] = x end end
  local n = #v
  if n == 0 then return '(no values)\n' end
  local lo, hi, sum = math.huge, -math.huge, 0
  for _, x in ipairs(v) do lo, hi, sum = math.min(lo, x), math.max(hi, x), sum + x end
  local mean = sum / n
  local var = 0
  for _, x in ipairs(v) do var = var + (x - mean) ^ 2 end
  local std = n > 1 and math.sqrt(var / (n - 1)) or 0
  lo, hi = opts.lo or lo, opts.hi or hi
  local bins = opts.bins or math.min(20, math.max(1, math.ceil(math.sqrt(n))))
  if hi <= lo then hi = lo + 1 end
  local counts = {}
  for b = 1, bins do counts[b] = 0 end
  for _, x in ipairs(v) do
    local b = math.floor((x - lo) / (hi - lo) * bins) + 1
    if b == bins + 1 and x <= hi then b = bins end
    if b >= 1 and b <= bins then counts[b] = counts[b] + 1 end
  end
  local cmax = 0
  for b = 1, bins do cmax = math.max(cmax, counts[b]) end
  local bw = opts.width or 40
  local out = {}
  out[1] = string.format('%sn=%d  mean=%s  std=%s  min=%s  max=%s', opts.title and (opts.title .. '  ') or '',
    n, fmt(mean), fmt(std), fmt(lo), fmt(hi))
  local edges = {}
  for b = 0, bins do edges[b] = fmt(lo + (hi - lo) * b / bins) end
  local ew = 0
  for b = 0, bins do ew = math.max(ew, #edges[b]) end
  for b = 1, bins do
    local len = cmax > 0 and counts[b] / cmax * bw or 0
    local full = math.floor(len)
    local frac = math.floor((len - full) * 8)
    local bar = string.rep('█', full) .. EIGHTHS[frac + 1]
    local close = b == bins and ']' or ')'
    out[#out + 1] = string.format('[%s, %s%s %s %d', lpad(edges[b - 1], ew), lpad(edges[b], ew), close,
      rpad(bar, bw), counts[b])
  end
  return table.concat(out, '\n') .. '\n'
end

-- ---- sparkline -----------------------------------------------------------------------------------
local SPARK = { '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█' }
function M.spark(values, opts)
  opts = opts or {}
  local v = values_of(values)
  local n = #v
  if n == 0 then return '' end
  local wdt = math.min(n, opts.width or 60)
  local pts = {}
  for i = 1, wdt do
    local a = math.floor((i - 1) * n / wdt) + 1
    local b = math.max(a, math.floor(i * n / wdt))
    local s, c = 0, 0
    for k = a, b do if v[k] == v[k] then s, c = s + v[k], c + 1 end end
    pts[i] = c > 0 and s / c or 0 / 0
  end
  local lo, hi = math.huge, -math.huge
  for _, x in ipairs(pts) do if x == x then lo, hi = math.min(lo, x), math.max(hi, x) end end
  local out = {}
  for i, x in ipairs(pts) do
    if x ~= x then out[i] = ' '
    else
      local k = hi > lo and math.floor((x - lo) / (hi - lo) * 7 + 0.5) + 1 or 4
      out[i] = SPARK[k]
    end
  end
  return string.format('%s %s … %s', table.concat(out), fmt(v[1]), fmt(v[n]))
end

return M
