-- penumbra.text.bpe — sentencepiece BPE tokenizers (core/text/spm.cc), as pn.text.bpe.
--
--   local tok = bpe{ train = {'train.de', 'train.en'},  -- text files, one sentence per line
--                    vocab = 8000,                       -- the vocabulary size (default 8000)
--                    cache = dir,      -- default $PENUMBRA_CACHE/bpe, else <PENUMBRA_HOME>/runs/.cache/bpe
--                    character_coverage = 1.0,
--                    model = nil,      -- a path to an existing .model: load it instead of training
--                                      -- (train and cache are then not used)
--                    threads = nil }   -- training and encode_lines threads (default: pn's)
--   tok.vocab_size  tok.pad (0)  tok.unk (1)  tok.bos (2)  tok.eos (3)   -- as the model says
--   tok.path        the .model file        tok.key   the cache key (sha256; for model=, the file's)
--   tok.trained     true when this call trained the model, false when it came from the cache
--   tok.seconds     training time (wall seconds) when trained
--   tok:encode(line)          -> {ids}: 0-based ids, no bos/eos added
--   tok:encode_lines(lines)   -> {{ids}, …}: one C call for the batch (OpenMP over lines)
--   tok:decode(ids)           -> detokenised string (pad/bos/eos ids are skipped; ids: a list or a 1-D tensor)
--   tok:pieces(line)          -> {'▁Ein', 'e', …}: the subword pieces ('▁' starts a word; an unknown
--                                character keeps its own text) — heatmap labels
--   tok:piece(id) -> string   tok:id(piece) -> id (unk when not in the vocabulary)
--   tok:unk_rate(lines)       -> fraction of the ids of lines that are unk (0 for no ids)
--   tok:check_data(lines, what [, max_rate = 0.05]) -> the unk rate, or an error when it is above
--                                max_rate: the tokenizer model does not match the data
--   (unk_rate and check_data also take the path of a text file for lines)
--
-- Caching: a trained model is stored as <cache>/<key>.model, .vocab and .json (the settings
-- and each input file's path and sha256), key = sha256 of the files' contents (in order) and
-- every setting that changes the vocabulary (not the paths, not the thread count). A second
-- call with the same inputs loads it. Files are written under temporary names and renamed,
-- the .model last, so a crash leaves no half-written model under the final name.
--
-- Training input: sentencepiece's trainer gets every line of every file, in order
-- (core/text/spm.cc reads them; only the newline is removed). Its default normaliser,
-- nmt_nfkc, is what makes raw corpora safe to feed as they are: Multi30k's train.de has 44
-- U+00A0 (NBSP), one TAB and trailing spaces — NFKC maps NBSP to a space, TAB becomes a space,
-- and whitespace is trimmed and squeezed, so none of them becomes a piece of its own. The same
-- normalisation runs on encode, so decode(encode(s)) == s for already-normalised text
-- (single spaces, no leading/trailing space, NFKC forms).
local B = require 'penumbra_ffi'
local options = require 'penumbra.options'
local json = require 'penumbra.json'
local now = require('penumbra.stats').now
local ffi, C = B.ffi, B.C

local M = {}
-- what this process did: trainings run, models loaded from the cache or a model= file
M.stats = { trained = 0, loaded = 0 }

local OPTS = {
  train = 'any', -- a path or a list of paths (checked below)
  vocab = { 'integer', min = 5 },
  cache = 'string',
  character_coverage = { 'number', above = 0, max = 1 },
  model = 'string',
  threads = { 'integer', min = 1 },
}
local DEFAULT_VOCAB = 8000
-- bumped whenever the training settings in core/text/spm.cc change (invalidates the cache)
local FORMAT = 1

local hex_buf = ffi.typeof('char[65]')
local i64_1 = ffi.typeof('int64_t[1]')
local i32_arr = ffi.typeof('int32_t[?]')
local i64_arr = ffi.typeof('int64_t[?]')
local str_arr = ffi.typeof('const char *[?]')

local function sha256_file(path, level)
  local out = hex_buf()
  if C.pn_sha256_file(path, out) ~= 0 then error('bpe: ' .. B.last_error():gsub('^sha256: ', ''), level + 1) end
  return ffi.string(out, 64)
end

local function sha256_text(s)
  local out = hex_buf()
  B.check(C.pn_sha256_hex(s, #s, out))
  return ffi.string(out, 64)
end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
end

-- a unique suffix for temporary files (pid when the C library gives it, plus time and an address)
pcall(ffi.cdef, 'int getpid(void);')
local function unique()
  local ok, pid = pcall(function() return ffi.C.getpid() end)
  return string.format('%s-%d-%s', ok and tostring(pid) or '0', os.time(), tostring({}):match('0x(%x+)') or '0')
end

local function default_cache()
  local env = os.getenv('PENUMBRA_CACHE')
  if env and env ~= '' then return env .. '/bpe' end
  return (os.getenv('PENUMBRA_HOME') or B.root) .. '/runs/.cache/bpe'
end

local function ensure_dir(dir, level)
  os.execute('mkdir -p ' .. shell_quote(dir) .. ' 2>/dev/null')
  local probe = dir .. '/.write-probe-' .. unique()
  local f = io.open(probe, 'wb')
  if not f then
    error('bpe: cannot write to the cache directory ' .. dir .. ' (set cache= or $PENUMBRA_CACHE)', level + 1)
  end
  f:close()
  os.remove(probe)
end

-- errors without a position (the caller re-raises them at its own level)
local function write_file(path, text)
  local f, err = io.open(path, 'wb')
  if not f then error('bpe: cannot write ' .. path .. ': ' .. tostring(err), 0) end
  local ok, werr = f:write(text)
  local cok, cerr = f:close()
  if not ok or not cok then error('bpe: cannot write ' .. path .. ': ' .. tostring(werr or cerr), 0) end
end

-- ---- the tokenizer object ----------------------------------------------------------------
local Tok = {}
Tok.__index = Tok
Tok.__tostring = function(t)
  return string.format('bpe tokenizer (%d pieces, %s)', t.vocab_size, t.path)
end

local function handle(tok, level)
  if type(tok) ~= 'table' or tok._s == nil then
    error('bpe: call the tokenizer\'s methods with a colon (tok:encode(line)), got ' .. type(tok) .. ' as self',
      (level or 2) + 1)
  end
  return tok._s
end

local function check_line(op, line, what, level)
  if type(line) ~= 'string' then
    error(string.format('bpe %s: %s must be a string, got %s', op, what, type(line)), level + 1)
  end
end

local function check_lines(op, lines, level)
  if type(lines) ~= 'table' then
    error(string.format('bpe %s: lines must be a list of strings, got %s', op, type(lines)), level + 1)
  end
  for i = 1, #lines do
    if type(lines[i]) ~= 'string' then
      error(string.format('bpe %s: line %d must be a string, got %s', op, i, type(lines[i])), level + 1)
    end
  end
end

-- {{ids}, …} and the flat form (ids, offsets) for callers that build tensors
local function encode_batch(self, lines, level)
  local h = handle(self, level + 1)
  check_lines('encode_lines', lines, level + 1)
  local n = #lines
  local ptrs, lens = str_arr(math.max(n, 1)), i64_arr(math.max(n, 1))
  for i = 1, n do
    ptrs[i - 1] = lines[i] -- anchored by `lines` for the duration of the call
    lens[i - 1] = #lines[i]
  end
  local offsets = i64_arr(n + 1)
  local p = C.pn_spm_encode_batch(h, ptrs, lens, n, offsets, self.threads or 0)
  if p == nil then error(B.last_error(), level + 1) end
  return p, offsets, n
end

local function encode_lines(self, lines, level)
  local p, offsets, n = encode_batch(self, lines, level + 1)
  local out = {}
  for i = 0, n - 1 do
    local a, b = tonumber(offsets[i]), tonumber(offsets[i + 1])
    local t = {}
    for k = a, b - 1 do t[k - a + 1] = p[k] end
    out[i + 1] = t
  end
  C.pn_spm_buf_free(p)
  return out
end

function Tok:encode_lines(lines) return encode_lines(self, lines, 2) end

-- one line: a batch of one (the C side has one encoder)
function Tok:encode(line)
  check_line('encode', line, 'the line', 2)
  return encode_lines(self, { line }, 2)[1]
end

function Tok:decode(ids)
  local h = handle(self, 2)
  if B.is_tensor(ids) then
    if ids:dim() ~= 1 then
      error(string.format('bpe decode: ids must be a list or a 1-D tensor, got a tensor of shape [%s] (decode one row '
        .. 'at a time)', table.concat(ids:shape(), ',')), 2)
    end
    ids = ids:totable()
  end
  if type(ids) ~= 'table' then error('bpe decode: ids must be a list of ids or a 1-D tensor, got ' .. type(ids), 2) end
  local n = #ids
  local a = i32_arr(math.max(n, 1))
  for i = 1, n do
    local v = ids[i]
    if type(v) ~= 'number' or v % 1 ~= 0 or v ~= v then
      error(string.format('bpe decode: the id at position %d is %s, not a whole number', i, tostring(v)), 2)
    end
    if v < 0 or v >= self.vocab_size then
      error(string.format('bpe decode: id %d at position %d is out of range [0, %d) of %s', v, i, self.vocab_size,
        self.path), 2)
    end
    a[i - 1] = v
  end
  local len = i64_1()
  local p = C.pn_spm_decode(h, a, n, len)
  if p == nil then error(B.last_error(), 2) end
  local s = ffi.string(p, tonumber(len[0]))
  C.pn_spm_buf_free(p)
  return s
end

function Tok:pieces(line)
  local h = handle(self, 2)
  check_line('pieces', line, 'the line', 2)
  local len = i64_1()
  local p = C.pn_spm_encode_pieces(h, line, #line, len)
  if p == nil then error(B.last_error(), 2) end
  local s = ffi.string(p, tonumber(len[0]))
  C.pn_spm_buf_free(p)
  local out = {}
  if s == '' then return out end
  for piece in (s .. '\0'):gmatch('([^%z]*)%z') do out[#out + 1] = piece end
  return out
end

function Tok:piece(id)
  local h = handle(self, 2)
  if type(id) ~= 'number' or id % 1 ~= 0 then error('bpe piece: id must be a whole number, got ' .. tostring(id), 2) end
  local p = C.pn_spm_id_to_piece(h, id)
  if p == nil then error(B.last_error(), 2) end
  return ffi.string(p)
end

function Tok:id(piece)
  local h = handle(self, 2)
  check_line('id', piece, 'the piece', 2)
  return C.pn_spm_piece_to_id(h, piece)
end

-- lines: a list of strings, or the path of a text file (one line each)
local function lines_of(op, lines, level)
  if type(lines) ~= 'string' then return lines end
  local f, err = io.open(lines, 'rb')
  if not f then error(string.format('bpe %s: cannot read %s', op, tostring(err)), level + 1) end
  local out = {}
  for line in f:lines() do out[#out + 1] = line end
  f:close()
  return out
end

local function unk_count(self, lines, level)
  local p, offsets, n = encode_batch(self, lines, level + 1)
  local total, unk = tonumber(offsets[n]), 0
  local u = self.unk
  for k = 0, total - 1 do
    if p[k] == u then unk = unk + 1 end
  end
  C.pn_spm_buf_free(p)
  return unk, total
end

function Tok:unk_rate(lines)
  lines = lines_of('unk_rate', lines, 2)
  local unk, total = unk_count(self, lines, 2)
  return total > 0 and unk / total or 0
end

function Tok:check_data(lines, what, max_rate)
  what = what or (type(lines) == 'string' and lines) or 'the data'
  lines = lines_of('check_data', lines, 2)
  max_rate = max_rate or 0.05
  options.check_value('bpe check_data', 'max_rate', max_rate, { 'number', min = 0, max = 1 })
  local unk, total = unk_count(self, lines, 2)
  local rate = total > 0 and unk / total or 0
  if rate > max_rate then
    error(string.format('bpe: the tokenizer model %s does not match the data: %.1f %% of the ids in %s are unk ' ..
      '(%d of %d; at most %g %% allowed)', self.path, 100 * rate, tostring(what), unk, total, 100 * max_rate), 2)
  end
  return rate
end

-- ---- construction -------------------------------------------------------------------------
local function load(path, level)
  local s = C.pn_spm_load(path)
  if s == nil then error(B.last_error(), level + 1) end -- 'bpe_load: …'
  s = ffi.gc(s, C.pn_spm_free)
  M.stats.loaded = M.stats.loaded + 1
  return s
end

local function make(s, fields)
  local tok = setmetatable(fields, Tok)
  tok._s = s
  tok.vocab_size = C.pn_spm_piece_size(s)
  tok.pad, tok.unk = C.pn_spm_pad_id(s), C.pn_spm_unk_id(s)
  tok.bos, tok.eos = C.pn_spm_bos_id(s), C.pn_spm_eos_id(s)
  return tok
end

local function train_files(train, level)
  if type(train) == 'string' then train = { train } end
  if type(train) ~= 'table' or #train == 0 then
    error('bpe: train must be a path or a non-empty list of paths to text files, got ' ..
      (type(train) == 'table' and 'an empty list' or type(train)), level + 1)
  end
  local files = {}
  for i, path in ipairs(train) do
    if type(path) ~= 'string' then
      error(string.format('bpe: train[%d] must be a path (a string), got %s', i, type(path)), level + 1)
    end
    local f, err = io.open(path, 'rb')
    if not f then
      err = tostring(err)
      if err:sub(1, #path + 2) == path .. ': ' then err = err:sub(#path + 3) end
      error('bpe: cannot read training file ' .. path .. ': ' .. err, level + 1)
    end
    f:close()
    files[i] = path
  end
  return files
end

function M.bpe(opts)
  if opts == nil then error('bpe: options required: train = {files…} (and vocab =) or model = path', 2) end
  opts = options.check('bpe', opts, OPTS, 2)
  if opts.model then
    local s = load(opts.model, 2)
    local tok = make(s, { path = opts.model, key = sha256_file(opts.model, 2), trained = false,
                          threads = opts.threads })
    if opts.vocab and opts.vocab ~= tok.vocab_size then
      error(string.format('bpe: the model %s has %d pieces, not vocab = %d', opts.model, tok.vocab_size, opts.vocab), 2)
    end
    return tok
  end
  if opts.train == nil then
    error('bpe: give train = {text files…} to train a model, or model = path to load one', 2)
  end
  local files = train_files(opts.train, 2)
  local vocab = opts.vocab or DEFAULT_VOCAB
  local coverage = opts.character_coverage or 1.0
  local inputs, hashes = {}, {}
  for i, path in ipairs(files) do
    hashes[i] = sha256_file(path, 2)
    inputs[i] = { path = path, sha256 = hashes[i] }
  end
  -- every setting that changes the vocabulary (core/text/spm.cc fixes the rest)
  local settings = {
    format = FORMAT, model_type = 'bpe', vocab = vocab, character_coverage = coverage,
    pad = 0, unk = 1, bos = 2, eos = 3, normalization = 'nmt_nfkc', sentences = 'all, in file order',
  }
  local key = sha256_text(json.encode({ settings = settings, inputs = hashes }))
  local dir = opts.cache or default_cache()
  local final = dir .. '/' .. key
  if exists(final .. '.model') then
    local ok, s = pcall(load, final .. '.model', 1)
    if ok then
      return make(s, { path = final .. '.model', key = key, trained = false, threads = opts.threads })
    end
    os.remove(final .. '.model') -- a broken cache entry: train again
  end

  ensure_dir(dir, 2)
  local tmp = dir .. '/.' .. key .. '.tmp-' .. unique()
  local cfiles = str_arr(#files)
  for i, path in ipairs(files) do cfiles[i - 1] = path end
  local t0 = now()
  local st = C.pn_spm_train(cfiles, #files, tmp, vocab, coverage, opts.threads or 0)
  if st ~= 0 then
    local msg = B.last_error()
    os.remove(tmp .. '.model')
    os.remove(tmp .. '.vocab')
    error(msg, 2) -- 'bpe_train: …'
  end
  M.stats.trained = M.stats.trained + 1
  local seconds = now() - t0
  local sidecar = json.encode({
    key = key, settings = settings, inputs = inputs, threads = opts.threads or C.pn_num_threads(),
    sentencepiece = ffi.string(C.pn_spm_version()), created = os.date('!%Y-%m-%dT%H:%M:%SZ'), seconds = seconds,
    model = key .. '.model',
  })
  local ok, err = pcall(function()
    write_file(tmp .. '.json', sidecar .. '\n')
    -- the .model last: its presence under the final name means the entry is complete
    for _, ext in ipairs({ '.vocab', '.json', '.model' }) do
      local rok, rerr = os.rename(tmp .. ext, final .. ext)
      if not rok then
        error('bpe: cannot rename ' .. tmp .. ext .. ' to ' .. final .. ext .. ': ' .. tostring(rerr), 0)
      end
    end
  end)
  if not ok then
    for _, ext in ipairs({ '.vocab', '.json', '.model' }) do os.remove(tmp .. ext) end
    error(err, 2)
  end
  local s = load(final .. '.model', 2)
  return make(s, { path = final .. '.model', key = key, trained = true, seconds = seconds, threads = opts.threads })
end

setmetatable(M, { __call = function(_, opts) return M.bpe(opts) end })
return M
