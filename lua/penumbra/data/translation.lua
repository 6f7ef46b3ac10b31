-- penumbra.data.translation — parallel text for NMT: reading and validating aligned files,
-- the Multi30k and IWSLT'14 de-en folders, encoding with a tokenizer and token-count batching.
-- Pure Lua over the tensor API.
--
--   local tr = require 'penumbra.data.translation'     -- also pn.data.translation
--
--   tr.read_parallel(src_path, tgt_path, {split=, empty='skip'|'error'|'keep', normalize=true})
--     -> { src = {lines}, tgt = {lines}, tgt_raw = {lines}, line = {1-based file line of each pair},
--          n = pairs kept, lines = lines in each file, empty = empty pairs seen,
--          skipped = {empty = n}, fixed = {crlf =, bom =, nbsp =, space =}, path = {src =, tgt =} }
--   tr.multi30k{path=nil, src='de', tgt='en', splits=nil, empty=nil, normalize=true, checksum=true}
--   tr.iwslt14{…the same options}               (registered as pn.data.load('multi30k' | 'iwslt14'))
--     -> d.train / d.valid / d.test   each {src=, tgt=, tgt_raw=, line=, name=, n=, fixed=, skipped=, path=}
--        d.splits (names loaded), d.missing (names absent), d.note, d.files.<split>.src/.tgt (paths, for
--        the tokenizer trainer: d.files.train.src, d.files.train.tgt), d.sha256['train.de'] = hex,
--        d.path (the folder), d.src_lang, d.tgt_lang, d.name, d:describe()
--   tr.encode(split, tok, {max_len=256, mode='train'|'eval'})
--     -> { src_ids = {{ids}}, tgt_ids = {{ids}}, index = {position in split.src/tgt/tgt_raw},
--          line = {file line}, skipped = {too_long = n}, truncated = n, truncated_tgt = n,
--          truncated_index = {positions}, n =, mode =, max_len =, name =, pad =, bos =, eos =, vocab_size = }
--   tr.batches(enc, {max_tokens=4096, max_sentences=nil, pad=, bos=, eos=, shuffle=, seed=0, epoch=1,
--                    bucket=1, sort_eval=true, src_eos=false})
--     -> array of batches, each
--        { src     = i64 (B, S)        source ids, right-padded with pad
--          tgt_in  = i64 (B, T)        bos + target, right-padded
--          tgt_out = i64 (B, T)        target + eos, right-padded (pad is the loss's ignore index)
--          src_mask = u8 (B, 1, 1, S)  1 for a real key, 0 for padding (broadcasts over heads, queries)
--          src_len = {…}               real entries of each src row
--          tgt_len = {…}               real entries of each tgt_in / tgt_out row (target tokens + 1)
--          index   = {…}               each row's position in the split (enc.index), so
--                                      hyps[index[b]] lines up with split.tgt_raw
--          ntokens = Σ tgt_len         non-pad entries of tgt_out (the loss normaliser)
--          nsrc    = Σ src_len         non-pad entries of src
--          size    = B }
--
-- A tokenizer is any object with tok:encode(line) -> {0-based ids, no bos/eos} (and optionally
-- tok:encode_lines(lines) -> {{ids}}), tok.pad, tok.unk, tok.bos, tok.eos, tok.vocab_size — the
-- interface of pn.text.bpe{…}.
--
-- Decisions:
--  - Bad input is a named error, or a counted fix, never a crash or a silently shorter corpus:
--    a missing/unreadable file (named); different line counts (both files and both counts);
--    invalid UTF-8 (file, 1-based line, byte column and why: stray continuation byte, truncated
--    sequence, overlong encoding, UTF-16 surrogate, above U+10FFFF, bytes F5–FF); a NUL byte (a
--    UTF-16 file?) and a carriage return inside a line (CR-only line endings?) are errors too.
--    CRLF endings: the CR is stripped and counted (fixed.crlf, lines). A UTF-8 byte-order mark
--    at the start of a file is stripped and counted (fixed.bom). A missing final newline is fine.
--  - Empty lines (empty or only whitespace, on either side): by default the pair is skipped in the
--    train split (skipped.empty counts them) and KEPT in every other split: an empty source in
--    valid/test still gets a translation and is scored against its reference, so the scores are
--    over the whole test set. empty='error' names the file(s) and line; empty='keep' / 'skip'
--    apply to any split. A kept empty source has no tokens: tr.batches gives it one eos as its
--    source, so no row of attention is fully masked.
--  - Normalisation (normalize=true, the default) of the text the model sees (src and tgt): U+00A0
--    (no-break space) and TAB, VT, FF become a space, runs of spaces become one, leading and
--    trailing spaces go (sentencepiece's default normalisation does the same, so this only makes
--    other tokenizers agree with it). Lines changed are counted in fixed.nbsp / fixed.space.
--    No other Unicode normalisation. tgt_raw holds each target line as it is in the file, less its
--    line ending (LF, CRLF) and a BOM: the references for BLEU. It is a separate table always.
--  - IWSLT'14 text is used as fairseq's prepare-iwslt14.sh leaves it (moses-tokenised, lowercased,
--    &apos; / &quot; escapes kept); BLEU against tgt_raw is then the usual tokenised BLEU.
--  - Splits: splits=nil loads every split whose two files exist; a split with one file of the two
--    is an error naming the missing one; a split with neither is listed in d.missing and reading
--    d.<split> or d.files.<split> is an error saying how to get it (the IWSLT'14 train set is not in
--    ../shared/datasets). splits={'train', …} asks for those: any missing one is an error at load.
--  - encode: lengths are counted without bos/eos. In 'train' mode (the default for the split named
--    train) a pair whose source or target has more than max_len tokens is dropped and counted
--    (skipped.too_long). In 'eval' mode (the default for the other splits) nothing is dropped: a
--    longer source is truncated to max_len and counted (truncated; the positions are in
--    truncated_index) for the caller to log; a longer target's ids are truncated too (for the
--    validation loss; counted in truncated_tgt), but the text references (tgt_raw) are never
--    truncated, so BLEU is always against the full reference. The model needs max_len + 1 positions
--    (+ 1 more with src_eos).
--  - batches: like fairseq, the pairs are sorted by (source length, target length) — lengths in
--    buckets of `bucket` tokens, ties broken at random by (seed, epoch) — then cut in order into
--    batches whose padded size max(S, T) · B stays ≤ max_tokens (T = target length + 1, the
--    length of tgt_in/tgt_out), and at most max_sentences rows; in train mode with shuffle (the
--    default) the order of the batches is shuffled by a generator seeded from (seed, epoch)
--    (penumbra.rng, never math.random). Every pair is in exactly one batch per call. A single pair
--    longer than max_tokens gets a batch of its own (it cannot be split; it exceeds max_tokens).
--    Eval mode: no randomness; sorted by length (ties by position) when sort_eval, else in order;
--    shuffle defaults to false. shuffle=false in train mode sorts with ties by position and keeps
--    the batches in length order.
--  - Across ranks (`./bench -n N`, penumbra/ddp.lua), the batches of a train encoding made during
--    the runner's training step are cut after the above (the same global batches on every rank):
--    each rank gets every N-th sentence of each batch (strided: even lengths) and the tensors of
--    its share; the share's weight is its fraction of the batch's target tokens.
--  - pad/bos/eos default to the tokenizer's (kept in enc), else 0/2/3. src_eos=true appends eos
--    to every source (fairseq's convention); the default adds none.
local ffi = require 'ffi'
local options = require 'penumbra.options'
local make_rng = require 'penumbra.rng'

local M = {}
local data_mod -- the pn.data registry (set by M.register, else required when first needed)
local function data()
  data_mod = data_mod or require 'penumbra.data'
  return data_mod
end

local function fail(msg) error('translation: ' .. msg, 0) end

-- ---- reading -------------------------------------------------------------------------------------
local function read_file(path) return require('penumbra.io').read_text(path, 'translation') end

local function line_col(s, pos) -- 1-based line and byte column of byte offset pos (0-based)
  local line, start = 1, 1
  while true do
    local nl = s:find('\n', start, true)
    if not nl or nl > pos then break end
    line, start = line + 1, nl + 1
  end
  return line, pos + 1 - (start - 1)
end

-- full UTF-8 validation (RFC 3629); errors name the file, line and byte column
local function validate_utf8(s, path)
  local n = #s
  local p = ffi.cast('const uint8_t *', s)
  local i = 0
  local why
  while i < n do
    local b = p[i]
    if b >= 0x80 or b == 0 then
      if b == 0 then why = 'a NUL byte (is it UTF-16?)' break end
      local need, lo, hi = 0, 0x80, 0xBF
      if b < 0xC2 then
        why = b < 0xC0 and string.format('unexpected continuation byte 0x%02X', b)
          or string.format('overlong encoding (lead byte 0x%02X)', b)
        break
      elseif b < 0xE0 then need = 1
      elseif b < 0xF0 then
        need = 2
        if b == 0xE0 then lo = 0xA0 elseif b == 0xED then hi = 0x9F end
      elseif b < 0xF5 then
        need = 3
        if b == 0xF0 then lo = 0x90 elseif b == 0xF4 then hi = 0x8F end
      else
        why = string.format('byte 0x%02X (never in UTF-8; a code point above U+10FFFF or not UTF-8 text)', b)
        break
      end
      for k = 1, need do
        if i + k >= n then why = 'truncated sequence at the end of the file' break end
        local c = p[i + k]
        local l, h = 0x80, 0xBF
        if k == 1 then l, h = lo, hi end
        if c < l or c > h then
          if c >= 0x80 and c <= 0xBF and k == 1 then
            if b == 0xE0 or b == 0xF0 then why = string.format('overlong encoding (0x%02X 0x%02X)', b, c)
            elseif b == 0xED then why = string.format('UTF-16 surrogate (0x%02X 0x%02X)', b, c)
            else why = string.format('code point above U+10FFFF (0x%02X 0x%02X)', b, c) end
          else
            why = string.format('truncated sequence (lead byte 0x%02X followed by 0x%02X)', b, c)
          end
          break
        end
      end
      if why then break end
      i = i + need + 1
    else
      i = i + 1
    end
  end
  if why then
    local line, col = line_col(s, i)
    fail(string.format('%s: line %d, byte %d: invalid UTF-8: %s', path, line, col, why))
  end
end

-- the lines of a file (LF or CRLF endings; a missing final newline is fine), as a list
local function split_lines(s, path, fixed)
  if s:sub(1, 3) == '\239\187\191' then s = s:sub(4); fixed.bom = fixed.bom + 1 end
  local lines, n, pos, len = {}, 0, 1, #s
  while pos <= len do
    local nl = s:find('\n', pos, true)
    local l = s:sub(pos, (nl or len + 1) - 1)
    n = n + 1
    if l:byte(-1) == 13 then l = l:sub(1, -2); fixed.crlf = fixed.crlf + 1 end
    local cr = l:find('\r', 1, true)
    if cr then
      fail(string.format('%s: line %d, byte %d: a carriage return inside the line (old Mac CR-only line endings?)',
        path, n, cr))
    end
    lines[n] = l
    if not nl then break end
    pos = nl + 1
  end
  return lines
end

-- the text the model sees: NBSP/TAB/VT/FF → space, runs collapsed, ends trimmed
local function normalize_line(l, fixed)
  local b1, bn = l:byte(1), l:byte(-1)
  if not (l:find('[\t\v\f\194]') or l:find('  ', 1, true) or b1 == 32 or bn == 32) then return l end
  local x, nb = l:gsub('\194\160', ' ')
  if nb > 0 then fixed.nbsp = fixed.nbsp + 1 end
  local y = x:gsub('[ \t\v\f]+', ' '):gsub('^ ', ''):gsub(' $', '')
  if y ~= x then fixed.space = fixed.space + 1 end
  return y
end

local READ_OPTS = { split = 'string', empty = { 'string', one_of = { 'skip', 'error', 'keep' } }, normalize = 'boolean' }

function M.read_parallel(src_path, tgt_path, o)
  o = options.check('translation.read_parallel', o, READ_OPTS, 2)
  local split = o.split
  local empty = o.empty or (split == 'train' and 'skip' or 'keep')
  local normalize = o.normalize ~= false
  local fs = { crlf = 0, bom = 0, nbsp = 0, space = 0 }
  local ft = { crlf = 0, bom = 0, nbsp = 0, space = 0 }
  local s_text, t_text = read_file(src_path), read_file(tgt_path)
  validate_utf8(s_text, src_path)
  validate_utf8(t_text, tgt_path)
  local S = split_lines(s_text, src_path, fs)
  local T = split_lines(t_text, tgt_path, ft)
  s_text, t_text = nil, nil
  if #S ~= #T then
    fail(string.format('line counts differ: %s has %d lines, %s has %d (parallel files must be aligned line by line)',
      src_path, #S, tgt_path, #T))
  end
  local src, tgt, raw, at = {}, {}, {}, {}
  local n, nempty, nskip = 0, 0, 0
  for i = 1, #S do
    local s, t, r = S[i], T[i], T[i]
    if normalize then s, t = normalize_line(s, fs), normalize_line(t, ft) end
    local es, et = not s:find('%S'), not t:find('%S')
    local keep = true
    if es or et then
      nempty = nempty + 1
      if empty == 'error' then
        local which = es and et and (src_path .. ' and ' .. tgt_path) or (es and src_path or tgt_path)
        fail(string.format('%s: line %d is empty (empty = \'error\'; use \'skip\' or \'keep\')', which, i))
      elseif empty == 'skip' then
        keep, nskip = false, nskip + 1
      end
    end
    if keep then
      n = n + 1
      src[n], tgt[n], raw[n], at[n] = s, t, r, i
    end
  end
  local fixed = {}
  for k in pairs(fs) do fixed[k] = fs[k] + ft[k] end
  fixed.src, fixed.tgt = fs, ft
  return { src = src, tgt = tgt, tgt_raw = raw, line = at, n = n, lines = #S, empty = nempty, name = split,
           skipped = { empty = nskip }, fixed = fixed, path = { src = src_path, tgt = tgt_path } }
end

-- ---- the datasets ------------------------------------------------------------------------------------
local SPLIT_NAMES = { 'train', 'valid', 'test' }
local LANGS = { 'de', 'en' }

local function file_exists(p)
  local f = io.open(p, 'rb')
  if not f then return false end
  f:close()
  return true
end

local DATASETS = {
  multi30k = {
    folder = 'multi30k_de_en',
    what = 'Multi30k task 1 (de-en, raw text): train 29000, valid 1014, test (test2016) 1000 pairs',
    how = 'Re-create it with ../shared/datasets/convert/make_multi30k.sh from github.com/multi30k/dataset ' ..
      '(data/task1/raw/{train,val,test_2016_flickr}.{de,en}.gz, gunzipped and renamed to {train,valid,test}.{de,en}).',
  },
  iwslt14 = {
    folder = 'iwslt14_de_en',
    what = "IWSLT'14 de-en as prepared by fairseq (moses-tokenised, lowercased, before BPE)",
    how = "It holds the output of fairseq's examples/translation/prepare-iwslt14.sh (its tmp/ folder, before BPE), " ..
      'renamed {train,valid,test}.{de,en}; ../shared/datasets/convert/make_iwslt14_partial.sh makes valid/test.',
  },
}

local function missing_split_msg(name, info, dir, split, lang_files)
  local msg = string.format('%s: the %s split is not available: %s', name, split, lang_files)
  if name == 'iwslt14' and split == 'train' then
    msg = msg .. " (../shared/datasets holds only IWSLT'14 valid and test; see NOTE.txt in " .. dir .. ')' ..
      ". Put fairseq's prepare-iwslt14.sh train.de / train.en (160239 pairs, the tmp/ folder before BPE) in " ..
      dir .. ', or load with splits = {\'valid\', \'test\'}.'
  else
    msg = msg .. '. ' .. info.how
  end
  return msg
end

local LOAD_OPTS = {
  path = 'string', src = { 'string', one_of = LANGS }, tgt = { 'string', one_of = LANGS }, splits = 'table',
  empty = { 'string', one_of = { 'skip', 'error', 'keep' } }, normalize = 'boolean', checksum = 'boolean',
}

local function describe(d)
  local parts = {}
  for _, s in ipairs(d.splits) do
    local sp = rawget(d, s)
    local extra = {}
    if sp.skipped.empty > 0 then extra[#extra + 1] = sp.skipped.empty .. ' empty skipped' end
    if sp.empty > 0 and sp.skipped.empty == 0 then extra[#extra + 1] = sp.empty .. ' empty kept' end
    parts[#parts + 1] = string.format('%s %d%s', s, sp.n, #extra > 0 and (' (' .. table.concat(extra, ', ') .. ')') or '')
  end
  for _, s in ipairs(d.missing) do parts[#parts + 1] = s .. ' missing' end
  return string.format('%s %s→%s: %s [%s]', d.name, d.src_lang, d.tgt_lang, table.concat(parts, ', '), d.path)
end

local function load_dataset(name, o, level)
  local function fail(msg) error('data.' .. msg, 0) end
  local info = DATASETS[name]
  o = options.check('data.' .. name, o, LOAD_OPTS, level + 1)
  local sl, tl = o.src or 'de', o.tgt or 'en'
  if sl == tl then fail(name .. ': src and tgt are both ' .. sl) end
  local asked
  if o.splits then
    asked = {}
    local seen = {}
    for i, s in ipairs(o.splits) do
      local ok = false
      for _, v in ipairs(SPLIT_NAMES) do ok = ok or v == s end
      if not ok then fail(string.format("%s: splits[%d] is '%s' (train, valid, test)", name, i, tostring(s))) end
      if not seen[s] then seen[s] = true; asked[#asked + 1] = s end
    end
    if #asked == 0 then fail(name .. ': splits is empty (train, valid, test)') end
  end
  -- the folder
  local dir
  local function has_any(d)
    for _, s in ipairs(SPLIT_NAMES) do
      for _, l in ipairs(LANGS) do if file_exists(d .. '/' .. s .. '.' .. l) then return true end end
    end
    return false
  end
  if o.path then
    dir = o.path:gsub('/+$', '')
    if dir == '' then dir = '/' end
    if not has_any(dir) then
      fail(string.format('%s: no {train,valid,test}.{de,en} files in %s (path =). %s', name, o.path, info.how))
    end
  else
    local tried = {}
    for _, base in ipairs(data().search_path()) do
      local d = base .. '/' .. info.folder
      if has_any(d) then dir = d break end
      tried[#tried + 1] = d
    end
    if not dir then
      fail(string.format('%s: dataset folder %s/ not found; tried:\n  %s\n%s expects {train,valid,test}.{de,en} ' ..
        '(one sentence per line, aligned) in it. Set PENUMBRA_DATA to the folder above %s/ or pass path = the folder. ' ..
        '%s ../shared/datasets/README.md says where the data comes from.', name, info.folder,
        table.concat(tried, '\n  '), name, info.folder, info.how))
    end
  end
  local d = { name = name, src_lang = sl, tgt_lang = tl, path = dir, splits = {}, missing = {}, files = {}, sha256 = {},
              description = info.what, describe = describe }
  local missing_msg = {}
  for _, s in ipairs(asked or SPLIT_NAMES) do
    local fsrc, ftgt = dir .. '/' .. s .. '.' .. sl, dir .. '/' .. s .. '.' .. tl
    local hs, ht = file_exists(fsrc), file_exists(ftgt)
    if hs and ht then
      local r = M.read_parallel(fsrc, ftgt, { split = s, empty = o.empty, normalize = o.normalize })
      r.name = s
      d[s] = r
      d.splits[#d.splits + 1] = s
      d.files[s] = { src = fsrc, tgt = ftgt }
      if o.checksum ~= false then
        for _, p in ipairs({ fsrc, ftgt }) do d.sha256[p:match('[^/]+$')] = data().checksum(p) end
      end
    else
      local what = (not hs and not ht) and (fsrc .. ' and ' .. ftgt .. ' are missing')
        or ((hs and ftgt or fsrc) .. ' is missing (' .. (hs and fsrc or ftgt) .. ' is there)')
      local msg = missing_split_msg(name, info, dir, s, what)
      if asked or hs or ht then fail(msg) end
      d.missing[#d.missing + 1] = s
      missing_msg[s] = msg
    end
  end
  if #d.splits == 0 then fail(name .. ': no split could be loaded from ' .. dir) end
  if #d.missing > 0 then
    d.note = missing_msg[d.missing[1]]
    for k = 2, #d.missing do d.note = d.note .. '\n' .. missing_msg[d.missing[k]] end
    local function guard(t)
      return setmetatable(t, { __index = function(_, k)
        if missing_msg[k] then error('data.' .. missing_msg[k], 2) end
      end })
    end
    guard(d)
    guard(d.files)
  end
  return d
end

function M.multi30k(o) return load_dataset('multi30k', o, 2) end
function M.iwslt14(o) return load_dataset('iwslt14', o, 2) end

-- ---- encoding ----------------------------------------------------------------------------------------
local ENC_OPTS = { max_len = { 'integer', min = 1 }, mode = { 'string', one_of = { 'train', 'eval' } } }

local function check_ids(ids, i, side, vocab)
  if type(ids) ~= 'table' then
    fail(string.format('encode: the tokenizer returned a %s for %s line %d, not a list of ids', type(ids), side, i))
  end
  for j = 1, #ids do
    local v = ids[j]
    if type(v) ~= 'number' or v % 1 ~= 0 or v < 0 or (vocab and v >= vocab) then
      fail(string.format('encode: the tokenizer gave id %s at %s line %d, token %d (ids are whole numbers in [0, %s))',
        tostring(v), side, i, j, vocab and tostring(vocab) or 'inf'))
    end
  end
end

function M.encode(split, tok, o)
  o = options.check('translation.encode', o, ENC_OPTS, 2)
  if type(split) ~= 'table' or type(split.src) ~= 'table' or type(split.tgt) ~= 'table' then
    error('translation.encode: split must be a table with src and tgt line lists', 2)
  end
  if #split.src ~= #split.tgt then
    error(string.format('translation.encode: split has %d sources and %d targets', #split.src, #split.tgt), 2)
  end
  if type(tok) ~= 'table' and type(tok) ~= 'userdata' or type(tok.encode) ~= 'function' then
    error('translation.encode: tok must be a tokenizer with tok:encode(line) (pn.text.bpe{…})', 2)
  end
  local max_len = o.max_len or 256
  local mode = o.mode or (split.name == 'train' and 'train' or 'eval')
  local vocab = tonumber(tok.vocab_size)
  local function enc_all(lines)
    if type(tok.encode_lines) == 'function' then
      local r = tok:encode_lines(lines)
      if type(r) ~= 'table' or #r ~= #lines then
        fail(string.format('encode: tok:encode_lines returned %s for %d lines', type(r) == 'table' and (#r .. ' lists') or type(r), #lines))
      end
      return r
    end
    local r = {}
    for i = 1, #lines do r[i] = tok:encode(lines[i]) end
    return r
  end
  local S, T = enc_all(split.src), enc_all(split.tgt)
  local src_ids, tgt_ids, index, line = {}, {}, {}, {}
  local too_long, ntrunc, ntrunc_t, trunc_index = 0, 0, 0, {}
  local n = 0
  for i = 1, #S do
    local s, t = S[i], T[i]
    check_ids(s, i, 'source', vocab)
    check_ids(t, i, 'target', vocab)
    if mode == 'train' then
      if #s > max_len or #t > max_len then
        too_long = too_long + 1
        s = nil
      end
    else
      if #s > max_len then
        local c = {}
        for j = 1, max_len do c[j] = s[j] end
        s, ntrunc = c, ntrunc + 1
        trunc_index[#trunc_index + 1] = i
      end
      if #t > max_len then
        local c = {}
        for j = 1, max_len do c[j] = t[j] end
        t, ntrunc_t = c, ntrunc_t + 1
      end
    end
    if s then
      n = n + 1
      src_ids[n], tgt_ids[n], index[n] = s, t, i
      line[n] = split.line and split.line[i] or i
    end
  end
  return { src_ids = src_ids, tgt_ids = tgt_ids, index = index, line = line, n = n, name = split.name, mode = mode,
           max_len = max_len, skipped = { too_long = too_long }, truncated = ntrunc, truncated_tgt = ntrunc_t,
           truncated_index = trunc_index, pad = tonumber(tok.pad), bos = tonumber(tok.bos), eos = tonumber(tok.eos),
           vocab_size = vocab }
end

-- ---- batching ------------------------------------------------------------------------------------------
local BATCH_OPTS = {
  max_tokens = { 'integer', min = 1 }, max_sentences = { 'integer', min = 1 }, pad = { 'integer', min = 0 },
  bos = { 'integer', min = 0 }, eos = { 'integer', min = 0 }, shuffle = 'boolean', seed = { 'integer', min = 0 },
  epoch = { 'integer', min = 0 }, bucket = { 'integer', min = 1 }, sort_eval = 'boolean', src_eos = 'boolean',
}

local i64_arr, u8_arr = ffi.typeof('int64_t[?]'), ffi.typeof('uint8_t[?]')

function M.batches(enc, o)
  o = options.check('translation.batches', o, BATCH_OPTS, 2)
  if type(enc) ~= 'table' or type(enc.src_ids) ~= 'table' or type(enc.tgt_ids) ~= 'table' then
    error('translation.batches: expected the table translation.encode returns', 2)
  end
  local pn = require 'penumbra.tensor'
  local N = #enc.src_ids
  if #enc.tgt_ids ~= N then error('translation.batches: enc has ' .. N .. ' sources and ' .. #enc.tgt_ids .. ' targets', 2) end
  local max_tokens = o.max_tokens or 4096
  local max_sent = o.max_sentences or math.huge
  local pad = o.pad or enc.pad or 0
  local bos = o.bos or enc.bos or 2
  local eos = o.eos or enc.eos or 3
  local train = (enc.mode or 'train') == 'train'
  local shuffle = o.shuffle
  if shuffle == nil then shuffle = train end
  local sort = train or o.sort_eval ~= false
  local bucket = o.bucket or 1
  local src_eos = o.src_eos == true
  local index = enc.index or {}

  -- the lengths each row will have
  local slen, tlen = {}, {}
  for i = 1, N do
    local s = #enc.src_ids[i] + (src_eos and 1 or 0)
    slen[i] = s > 0 and s or 1 -- an empty source gets one eos
    tlen[i] = #enc.tgt_ids[i] + 1
  end

  local rng
  if shuffle then
    local seed, epoch = o.seed or 0, o.epoch or 1
    rng = make_rng(ffi.new('uint64_t', seed) * 0x9E3779B97F4A7C15ULL + ffi.new('uint64_t', epoch) * 0xBF58476D1CE4E5B9ULL)
  end
  -- order: by (source bucket, target bucket, tie)
  local order = {}
  for i = 1, N do order[i] = i end
  if sort then
    local tie = {}
    if rng then
      local perm = {}
      for i = 1, N do perm[i] = i end
      for i = N, 2, -1 do
        local j = rng.int(i) + 1
        perm[i], perm[j] = perm[j], perm[i]
      end
      for r = 1, N do tie[perm[r]] = r end
    else
      tie = order
    end
    local ks, kt = {}, {}
    for i = 1, N do ks[i], kt[i] = math.ceil(slen[i] / bucket), math.ceil(tlen[i] / bucket) end
    local ord = {}
    for i = 1, N do ord[i] = i end
    table.sort(ord, function(a, b)
      if ks[a] ~= ks[b] then return ks[a] < ks[b] end
      if kt[a] ~= kt[b] then return kt[a] < kt[b] end
      return tie[a] < tie[b]
    end)
    order = ord
  end

  -- cut into batches
  local groups, cur, S, T = {}, {}, 0, 0
  for _, i in ipairs(order) do
    local s2, t2 = math.max(S, slen[i]), math.max(T, tlen[i])
    if #cur > 0 and (math.max(s2, t2) * (#cur + 1) > max_tokens or #cur + 1 > max_sent) then
      groups[#groups + 1] = cur
      cur, s2, t2 = {}, slen[i], tlen[i]
    end
    cur[#cur + 1] = i
    S, T = s2, t2
  end
  if #cur > 0 then groups[#groups + 1] = cur end
  if rng then
    for i = #groups, 2, -1 do
      local j = rng.int(i) + 1
      groups[i], groups[j] = groups[j], groups[i]
    end
  end

  -- tensors (one scratch buffer, grown when needed; pn.from_buffer copies)
  local cap, buf, mbuf = 0, nil, nil
  local out = {}
  -- across ranks (penumbra/ddp.lua), during a training step: this rank's sentences of each
  -- batch, weighed by their target tokens (the loss's normaliser, ntokens)
  local share = train and require('penumbra.ddp').sharer() or nil
  for g = 1, #groups do
    local rows = groups[g]
    if share then rows = share(rows, function(i) return tlen[i] end, 'sentences') end
    local B = #rows
    S, T = 0, 0
    for r = 1, B do
      S = math.max(S, slen[rows[r]])
      T = math.max(T, tlen[rows[r]])
    end
    local need = B * math.max(S, T)
    if need > cap then
      cap = math.max(need, 2 * cap, max_tokens)
      buf, mbuf = i64_arr(cap), u8_arr(cap)
    end
    local sl, tl, idx = {}, {}, {}
    local nsrc, ntok = 0, 0
    -- src and its mask
    for k = 0, B * S - 1 do buf[k] = pad; mbuf[k] = 0 end
    for r = 1, B do
      local i = rows[r]
      local ids, base = enc.src_ids[i], (r - 1) * S
      local m = #ids
      for j = 1, m do buf[base + j - 1] = ids[j] end
      if src_eos or m == 0 then buf[base + m] = eos end
      for j = 0, slen[i] - 1 do mbuf[base + j] = 1 end
      sl[r], tl[r], idx[r] = slen[i], tlen[i], index[i] or i
      nsrc, ntok = nsrc + slen[i], ntok + tlen[i]
    end
    local src = pn.from_buffer(buf, { B, S }, 'i64')
    local mask = pn.from_buffer(mbuf, { B, 1, 1, S }, 'u8')
    -- tgt_in = bos + target, tgt_out = target + eos
    for k = 0, B * T - 1 do buf[k] = pad end
    for r = 1, B do
      local ids, base = enc.tgt_ids[rows[r]], (r - 1) * T
      buf[base] = bos
      for j = 1, #ids do buf[base + j] = ids[j] end
    end
    local tgt_in = pn.from_buffer(buf, { B, T }, 'i64')
    for k = 0, B * T - 1 do buf[k] = pad end
    for r = 1, B do
      local ids, base = enc.tgt_ids[rows[r]], (r - 1) * T
      for j = 1, #ids do buf[base + j - 1] = ids[j] end
      buf[base + #ids] = eos
    end
    local tgt_out = pn.from_buffer(buf, { B, T }, 'i64')
    out[g] = { src = src, tgt_in = tgt_in, tgt_out = tgt_out, src_mask = mask, src_len = sl, tgt_len = tl, index = idx,
               ntokens = ntok, nsrc = nsrc, size = B }
  end
  return out
end

-- ---- the registry --------------------------------------------------------------------------------------
local REG_OPTIONS = {
  path = 'the folder holding {train,valid,test}.{de,en} (default: the dataset folder on the search path)',
  src = "source language, 'de' (default) or 'en'", tgt = "target language, 'en' (default) or 'de'",
  splits = "the splits to load, e.g. {'valid', 'test'}; a missing one is an error (default: those present)",
  empty = "empty lines: 'skip' | 'error' | 'keep' (default: skip in train, keep elsewhere)",
  normalize = 'normalise whitespace and U+00A0 in the model text (default true; tgt_raw stays raw)',
  checksum = 'record the sha256 of each file read in d.sha256 (default true)',
}

function M.register(reg)
  data_mod = reg
  reg.register('multi30k', M.multi30k, { description = DATASETS.multi30k.what, options = REG_OPTIONS })
  reg.register('iwslt14', M.iwslt14, { description = DATASETS.iwslt14.what .. '; here only valid and test',
                                       options = REG_OPTIONS })
  return M
end

return M
