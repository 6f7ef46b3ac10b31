-- penumbra.text.bleu — corpus BLEU and chrF (core/text/bleu.c), equal to sacreBLEU 2.x with its
-- defaults (`sacrebleu REF -i HYP`, BLEU().corpus_score(hyps, [refs]), CHRF().corpus_score).
--
--   bleu(hyp_lines, ref_lines [, opts]) -> {score=, precisions={p1..p4}, counts={…}, totals={…},
--                                           bp=, ratio=, sys_len=, ref_len=, line=}
--       tokenizer 13a, cased, n-grams 1..4, 'exp' smoothing, no effective order. score and the
--       precisions are percentages. `line` (also s:format() and tostring(s)) is sacreBLEU's text:
--       "BLEU = 35.12 67.1/43.0/30.2/21.5 (BP = 0.982 ratio = 0.982 hyp_len = 12345 ref_len = 12567)"
--   chrf(hyp_lines, ref_lines [, opts]) -> {score=, line='chrF2 = 52.34', char_order=6, word_order=0,
--                                           beta=2, hyp={…}, ref={…}, match={…}}   (statistics per order)
--   tokenize_13a(line) -> the 13a tokens joined by single spaces (what BLEU counts)
--   read_lines(path)   -> the lines of a file as sacreBLEU reads them (split on '\n' only; a last
--                         line without '\n' counts, a final '\n' adds no empty line)
--   main(args)         -> the CLI: ./bench bleu REF [REF2 …] HYP [--chrf]
--
-- ref_lines is a list of strings (one reference per segment) or a list of such lists (several
-- reference streams, each as long as hyp_lines). opts may only restate sacreBLEU's defaults
-- (e.g. {tokenize='13a'}); anything else is an error, as the other variants are not implemented.
-- Bad input is a Lua error with the C message: line counts that differ (both named), a line that
-- is not a string or holds a NUL byte, invalid UTF-8 (the line, from 1, and the byte).
local B = require 'penumbra_ffi'
local ffi, C = B.ffi, B.C

local M = {}

local str_arr = ffi.typeof('const char *[?]')
local stream_arr = ffi.typeof('const char *const *[?]')
local i64_arr = ffi.typeof('int64_t[?]')
local bleu_ct = ffi.typeof('pn_bleu_score')
local chrf_ct = ffi.typeof('pn_chrf_score')

-- a Lua list of strings → const char *[n], n (the strings stay anchored by the caller's table)
local function c_lines(op, what, t)
  if type(t) ~= 'table' then
    error(string.format('%s: the %s lines must be a list of strings, got %s', op, what, type(t)), 4)
  end
  local n = #t
  local a = str_arr(n > 0 and n or 1)
  for i = 1, n do
    local s = t[i]
    if type(s) ~= 'string' then
      error(string.format('%s: %s line %d is a %s, not a string', op, what, i, type(s)), 4)
    end
    if s:find('\0', 1, true) then error(string.format('%s: %s line %d contains a NUL byte', op, what, i), 4) end
    a[i - 1] = s
  end
  return a, n
end

-- hyp, ref (list of strings or list of lists) → the C arguments; `keep` anchors the arrays
local function c_args(op, hyp, ref)
  local h, nh = c_lines(op, 'hypothesis', hyp)
  if type(ref) ~= 'table' then
    error(string.format('%s: the reference lines must be a list of strings (or a list of such lists), got %s', op,
      type(ref)), 3)
  end
  local streams = type(ref[1]) == 'table' and ref or { ref }
  local ns = #streams
  local sa, counts, keep = stream_arr(ns), i64_arr(ns), {}
  for r = 1, ns do
    local a, n = c_lines(op, ns == 1 and 'reference' or ('reference stream ' .. r), streams[r])
    keep[r], sa[r - 1], counts[r - 1] = a, a, n
  end
  return h, nh, sa, counts, ns, keep
end

local function check_opts(op, opts, defaults)
  if opts == nil then return end
  if type(opts) ~= 'table' then error(op .. ': opts must be a table, got ' .. type(opts), 3) end
  for k, v in pairs(opts) do
    if defaults[k] == nil then
      local names = {}
      for name in pairs(defaults) do names[#names + 1] = name end
      table.sort(names)
      error(string.format("%s: unknown option '%s' (known: %s)", op, tostring(k), table.concat(names, ', ')), 3)
    end
    if v ~= defaults[k] then
      error(string.format("%s: only sacreBLEU's default %s = %s is implemented, got %s", op, k, tostring(defaults[k]),
        tostring(v)), 3)
    end
  end
end

local Score = {}
Score.__index = Score
function Score:format() return self.line end
Score.__tostring = Score.format

local BLEU_DEFAULTS = { tokenize = '13a', lowercase = false, smooth_method = 'exp', max_ngram_order = 4,
                        effective_order = false }

function M.bleu(hyp_lines, ref_lines, opts)
  check_opts('bleu', opts, BLEU_DEFAULTS)
  local h, nh, sa, counts, ns, keep = c_args('bleu', hyp_lines, ref_lines)
  local out = bleu_ct()
  if C.pn_bleu(h, nh, sa, counts, ns, out) ~= 0 then error(B.last_error(), 2) end
  local _ = keep
  local r = { score = out.score, bp = out.bp, ratio = out.ratio, sys_len = tonumber(out.sys_len),
              ref_len = tonumber(out.ref_len), precisions = {}, counts = {}, totals = {}, line = ffi.string(out.line) }
  for n = 1, 4 do
    r.precisions[n] = out.precisions[n - 1]
    r.counts[n] = tonumber(out.counts[n - 1])
    r.totals[n] = tonumber(out.totals[n - 1])
  end
  return setmetatable(r, Score)
end

local CHRF_DEFAULTS = { char_order = 6, word_order = 0, beta = 2, lowercase = false, whitespace = false,
                        eps_smoothing = false }

function M.chrf(hyp_lines, ref_lines, opts)
  check_opts('chrf', opts, CHRF_DEFAULTS)
  local h, nh, sa, counts, ns, keep = c_args('chrf', hyp_lines, ref_lines)
  local out = chrf_ct()
  if C.pn_chrf(h, nh, sa, counts, ns, out) ~= 0 then error(B.last_error(), 2) end
  local _ = keep
  local r = { score = out.score, char_order = out.char_order, word_order = out.word_order, beta = out.beta,
              line = ffi.string(out.line), hyp = {}, ref = {}, match = {} }
  for n = 1, out.char_order do
    r.hyp[n], r.ref[n], r.match[n] = tonumber(out.hyp[n - 1]), tonumber(out.ref[n - 1]), tonumber(out.match[n - 1])
  end
  return setmetatable(r, Score)
end

local char_arr = ffi.typeof('char[?]')
function M.tokenize_13a(line)
  if type(line) ~= 'string' then error('bleu tokenize: the line must be a string, got ' .. type(line), 2) end
  if line:find('\0', 1, true) then error('bleu tokenize: the line contains a NUL byte', 2) end
  local size = #line * 3 + 16
  for _ = 1, 2 do
    local buf = char_arr(size)
    local n = tonumber(C.pn_bleu_tokenize_13a(line, buf, size))
    if n < 0 then error(B.last_error(), 2) end
    if n < size then return ffi.string(buf, n) end
    size = n + 1
  end
  error('bleu tokenize: the tokenised length changed between calls', 2)
end

function M.read_lines(path)
  local s = require('penumbra.io').read_text(path, 'bleu')
  local lines = {}
  for l in s:gmatch('([^\n]*)\n') do lines[#lines + 1] = l end
  local tail = s:match('([^\n]+)$')
  if tail then lines[#lines + 1] = tail end
  return lines
end

local USAGE = 'usage: ./bench bleu REF [REF2 …] HYP [--chrf]'

-- ./bench bleu REF [REF2 …] HYP [--chrf]: sacreBLEU's BLEU line; with --chrf a second line
-- "chrF2 = …". Several REF files are several reference streams. Errors are raised (the CLI
-- prints the message and exits 1).
function M.main(args)
  local files, chrf = {}, false
  for _, a in ipairs(args) do
    if a == '--chrf' then chrf = true
    elseif a == '--help' or a == '-h' then print(USAGE); return
    elseif a:sub(1, 1) == '-' and #a > 1 then -- sacreBLEU's -tok/-lc/… too: only its defaults are here
      error("bleu: unknown option '" .. a .. "' (this is sacreBLEU's default BLEU: 13a, cased; --chrf adds chrF2)\n"
        .. USAGE, 0)
    else files[#files + 1] = a end
  end
  if #files < 2 then error('bleu: need a reference file and a hypothesis file\n' .. USAGE, 0) end
  local hyp = M.read_lines(files[#files])
  local refs = {}
  for i = 1, #files - 1 do
    local r = M.read_lines(files[i])
    if #r ~= #hyp then
      error(string.format('bleu: %s has %d lines but %s has %d', files[#files], #hyp, files[i], #r), 0)
    end
    refs[i] = r
  end
  print(M.bleu(hyp, refs).line)
  if chrf then print(M.chrf(hyp, refs).line) end
end

return M
