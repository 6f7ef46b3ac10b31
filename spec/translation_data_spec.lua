-- penumbra.data.translation: parallel text reading and validation, Multi30k / IWSLT'14, encoding
-- with the length rule, token-count batching
local pn = require 'penumbra'
local tr = require 'penumbra.data.translation'
local ffi = require 'ffi'
pcall(ffi.cdef, 'int setenv(const char *, const char *, int); int unsetenv(const char *);')

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p '" .. d .. "'")
  return d
end
local function write(path, s)
  local f = assert(io.open(path, 'wb'))
  f:write(s)
  f:close()
  return path
end
local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert.is_false(ok, 'expected an error')
  return tostring(e)
end
local function has(s, sub) return s:find(sub, 1, true) ~= nil end

-- a whitespace tokenizer with the interface of pn.text.bpe (pad 0, unk 1, bos 2, eos 3)
local function word_tok(lines)
  local vocab, words = {}, {}
  local tok = { pad = 0, unk = 1, bos = 2, eos = 3 }
  local n = 4
  for _, l in ipairs(lines or {}) do
    for w in l:gmatch('%S+') do
      if not vocab[w] then vocab[w] = n; words[n] = w; n = n + 1 end
    end
  end
  tok.vocab_size = n
  function tok:encode(l)
    local r = {}
    for w in l:gmatch('%S+') do r[#r + 1] = vocab[w] or self.unk end
    return r
  end
  function tok:encode_lines(ls)
    local r = {}
    for i, l in ipairs(ls) do r[i] = self:encode(l) end
    return r
  end
  return tok
end
-- a tokenizer whose ids are given directly: "5 6 7" -> {5, 6, 7}
local num_tok = { pad = 0, unk = 1, bos = 2, eos = 3, vocab_size = 1000 }
function num_tok:encode(l)
  local r = {}
  for w in l:gmatch('%d+') do r[#r + 1] = tonumber(w) end
  return r
end

-- synthetic encoded data: n pairs with lengths from a fixed stream
local function synthetic(n, maxlen, mode)
  local r = require('penumbra.rng')(12345)
  local enc = { src_ids = {}, tgt_ids = {}, index = {}, mode = mode or 'train', pad = 0, bos = 2, eos = 3 }
  for i = 1, n do
    local s, t = {}, {}
    for j = 1, 1 + r.int(maxlen) do s[j] = 4 + r.int(50) end
    for j = 1, 1 + r.int(maxlen) do t[j] = 4 + r.int(50) end
    enc.src_ids[i], enc.tgt_ids[i], enc.index[i] = s, t, i
  end
  enc.n = n
  return enc
end

local function order_of(batches)
  local o = {}
  for _, b in ipairs(batches) do for _, i in ipairs(b.index) do o[#o + 1] = i end end
  return o
end

describe('translation.read_parallel', function()
  local dir = tmpdir()

  it('reads aligned lines; CRLF stripped and counted; a missing final newline is fine', function()
    local s = write(dir .. '/a.de', 'eins\r\nzwei\r\ndrei')
    local t = write(dir .. '/a.en', 'one\ntwo\r\nthree\n')
    local r = tr.read_parallel(s, t)
    assert.same({ 'eins', 'zwei', 'drei' }, r.src)
    assert.same({ 'one', 'two', 'three' }, r.tgt)
    assert.same({ 'one', 'two', 'three' }, r.tgt_raw)
    assert.equal(3, r.n)
    assert.equal(3, r.fixed.crlf)
    assert.equal(2, r.fixed.src.crlf)
    assert.same({ 1, 2, 3 }, r.line)
  end)

  it('normalises NBSP, tabs and extra spaces in the model text; tgt_raw stays raw; a BOM is stripped', function()
    local s = write(dir .. '/n.de', '\239\187\191ein\194\160Hund  \nzwei\tKatzen\n ok\n')
    local t = write(dir .. '/n.en', 'a\194\160dog \nsome  cats\nok\n')
    local r = tr.read_parallel(s, t)
    assert.same({ 'ein Hund', 'zwei Katzen', 'ok' }, r.src)
    assert.same({ 'a dog', 'some cats', 'ok' }, r.tgt)
    assert.same({ 'a\194\160dog ', 'some  cats', 'ok' }, r.tgt_raw)
    assert.equal(1, r.fixed.bom)
    assert.equal(2, r.fixed.nbsp)
    assert.equal(5, r.fixed.space) -- lines whose spaces changed: src 1, 2, 3 and tgt 1, 2
    local raw = tr.read_parallel(s, t, { normalize = false })
    assert.same({ 'ein\194\160Hund  ', 'zwei\tKatzen', ' ok' }, raw.src)
  end)

  it('a missing or unreadable file is an error naming it', function()
    local t = write(dir .. '/m.en', 'x\n')
    local e = err_of(tr.read_parallel, dir .. '/nope.de', t)
    assert.truthy(has(e, dir .. '/nope.de'))
    e = err_of(tr.read_parallel, dir, t) -- a directory
    assert.truthy(has(e, 'cannot read ' .. dir))
  end)

  it('different line counts name both files and both counts', function()
    local s = write(dir .. '/c.de', 'a\nb\nc\n')
    local t = write(dir .. '/c.en', 'a\nb\n')
    local e = err_of(tr.read_parallel, s, t)
    assert.truthy(has(e, s .. ' has 3 lines'), e)
    assert.truthy(has(e, t .. ' has 2'), e)
  end)

  it('invalid UTF-8 names the file, the line and the byte column', function()
    local t = write(dir .. '/u.en', 'a\nb\nc\n')
    local cases = {
      { '\192\175', 'overlong' },               -- C0 AF: overlong '/'
      { '\193\129', 'overlong' },
      { '\224\128\175', 'overlong' },           -- E0 80 AF
      { '\240\130\130\172', 'overlong' },       -- F0 82 82 AC (overlong €)
      { '\237\160\128', 'surrogate' },          -- ED A0 80 = U+D800
      { '\237\191\191', 'surrogate' },          -- U+DFFF
      { '\244\144\128\128', 'U+10FFFF' },       -- F4 90 80 80 = U+110000
      { '\245\128\128\128', 'U+10FFFF' },       -- F5
      { '\255', '0xFF' },
      { '\128', 'continuation' },
      { '\195A', 'truncated' },                 -- C3 followed by ASCII
      { '\226\130', 'truncated' },              -- E2 82 then newline
    }
    for _, c in ipairs(cases) do
      local s = write(dir .. '/u.de', 'ok\nab' .. c[1] .. 'x\nok\n')
      local e = err_of(tr.read_parallel, s, t)
      assert.truthy(has(e, s .. ': line 2, byte 3: invalid UTF-8'), e)
      assert.truthy(has(e, c[2]), c[2] .. ' in: ' .. e)
    end
    -- truncated at the very end of the file (no final newline)
    local s = write(dir .. '/u.de', 'ok\nok\nab\240\159\152')
    assert.truthy(has(err_of(tr.read_parallel, s, t), 'line 3, byte 3: invalid UTF-8: truncated'))
    -- a NUL byte (UTF-16 text) is an error too
    s = write(dir .. '/u.de', 'ok\no\0k\nok\n')
    assert.truthy(has(err_of(tr.read_parallel, s, t), 'line 2, byte 2'))
    -- the edges of the valid ranges pass
    s = write(dir .. '/u.de', '\194\128\223\191\224\160\128\n\237\159\191\238\128\128\239\191\191\n\240\144\128\128\244\143\191\191😀\n')
    local r = tr.read_parallel(s, t)
    assert.equal(3, r.n)
  end)

  it('a carriage return inside a line (CR-only endings) is an error', function()
    local s = write(dir .. '/r.de', 'a\rb\rc\n')
    local t = write(dir .. '/r.en', 'a\n')
    assert.truthy(has(err_of(tr.read_parallel, s, t), s .. ': line 1, byte 2: a carriage return'))
  end)

  it('empty lines: skipped and counted in train, kept elsewhere, an error when asked', function()
    local s = write(dir .. '/e.de', 'a\n\nc\n  \ne\nf\n')
    local t = write(dir .. '/e.en', 'A\nB\n\nD\n\194\160\nF\n')
    local r = tr.read_parallel(s, t, { split = 'train' })
    assert.same({ 'a', 'f' }, r.src)
    assert.same({ 'A', 'F' }, r.tgt)
    assert.same({ 1, 6 }, r.line)
    assert.equal(4, r.skipped.empty)
    assert.equal(4, r.empty)
    local v = tr.read_parallel(s, t, { split = 'test' })
    assert.equal(6, v.n)
    assert.equal(0, v.skipped.empty)
    assert.equal(4, v.empty)
    assert.same({ 'a', '', 'c', '', 'e', 'f' }, v.src)
    assert.same({ 'A', 'B', '', 'D', '\194\160', 'F' }, v.tgt_raw)
    local e = err_of(tr.read_parallel, s, t, { split = 'test', empty = 'error' })
    assert.truthy(has(e, s .. ': line 2 is empty'), e)
    e = err_of(tr.read_parallel, write(dir .. '/e2.de', 'a\nb\n'), write(dir .. '/e2.en', 'A\n\n'), { empty = 'error' })
    assert.truthy(has(e, dir .. '/e2.en: line 2 is empty'), e)
    assert.equal(6, tr.read_parallel(s, t, { split = 'train', empty = 'keep' }).n)
  end)

  it('rejects unknown options', function()
    assert.truthy(has(err_of(tr.read_parallel, 'a', 'b', { empy = 'skip' }), "unknown option 'empy'"))
  end)
end)

describe('translation datasets', function()
  local function with_env(vars, f)
    local old = {}
    for k, v in pairs(vars) do
      old[k] = os.getenv(k)
      ffi.C.setenv(k, v, 1)
    end
    local ok, e = pcall(f)
    for k in pairs(vars) do
      if old[k] then ffi.C.setenv(k, old[k], 1) else ffi.C.unsetenv(k) end
    end
    if not ok then error(e, 0) end
  end

  it('a missing folder lists every path tried and how to get the data', function()
    local home = tmpdir()
    with_env({ PENUMBRA_HOME = home, PENUMBRA_DATA = home .. '/data' }, function()
      os.execute("mkdir -p '" .. home .. "/data'")
      for _, name in ipairs({ 'multi30k', 'iwslt14' }) do
        local e = err_of(tr[name])
        local folder = name == 'multi30k' and 'multi30k_de_en' or 'iwslt14_de_en'
        assert.truthy(has(e, 'folder ' .. folder .. '/ not found'), e)
        assert.truthy(has(e, home .. '/data/' .. folder), e)
        assert.truthy(has(e, home .. '/datasets/' .. folder), e)
        assert.truthy(has(e, home .. '/../shared/datasets/' .. folder), e)
        assert.truthy(has(e, 'PENUMBRA_DATA') and has(e, 'README.md'), e)
      end
    end)
  end)

  it('loads Multi30k: 29000 / 1014 / 1000 pairs, files and checksums', function()
    local d = pn.data.load('multi30k')
    assert.equal(29000, d.train.n)
    assert.equal(1014, d.valid.n)
    assert.equal(1000, d.test.n)
    assert.same({ 'train', 'valid', 'test' }, d.splits)
    assert.equal(0, #d.missing)
    for _, s in ipairs(d.splits) do
      local sp = d[s]
      assert.equal(s, sp.name)
      assert.equal(sp.n, #sp.src)
      assert.equal(sp.n, #sp.tgt)
      assert.equal(sp.n, #sp.tgt_raw)
      assert.equal(0, sp.empty)
    end
    -- train.de has 44 NBSP (normalised); train.en has one double space (line 23648), kept in tgt_raw
    assert.equal(44, d.train.fixed.src.nbsp)
    assert.equal(0, d.train.fixed.tgt.nbsp)
    assert.equal(1, d.train.fixed.tgt.space)
    assert.equal('A man in a suit jacket with a free word sign.', d.train.tgt[23648])
    assert.equal('A man in a suit jacket with a  free word  sign.', d.train.tgt_raw[23648])
    assert.same(d.valid.tgt, d.valid.tgt_raw)
    assert.truthy(d.files.train.src:match('multi30k_de_en/train%.de$'))
    assert.truthy(d.files.train.tgt:match('multi30k_de_en/train%.en$'))
    assert.equal('2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72', d.sha256['train.de'])
    assert.equal('1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227', d.sha256['valid.en'])
    assert.truthy(d:describe():find('train 29000', 1, true))
    -- the reverse direction
    local r = tr.multi30k{ src = 'en', tgt = 'de', splits = { 'test' }, checksum = false }
    assert.equal(1000, r.test.n)
    assert.equal(d.test.tgt[1], r.test.src[1])
    assert.truthy(has(err_of(tr.multi30k, { src = 'fr' }), 'src must be one of de, en'))
    assert.truthy(has(err_of(tr.multi30k, { splits = { 'val' } }), "splits[1] is 'val'"))
  end)

  it('loads IWSLT\'14 valid / test (7283 / 6750); the missing train split is an error when asked for', function()
    local d = pn.data.load('iwslt14')
    assert.equal(7283, d.valid.n)
    assert.equal(6750, d.test.n)
    assert.same({ 'valid', 'test' }, d.splits)
    assert.same({ 'train' }, d.missing)
    assert.truthy(has(d.note, 'train split is not available'))
    assert.truthy(has(d.valid.tgt_raw[1], '&apos;'))  -- fairseq's escapes are kept
    local e = err_of(function() return d.train end)
    assert.truthy(has(e, 'iwslt14: the train split is not available'), e)
    assert.truthy(has(e, 'train.de and ') and has(e, 'prepare-iwslt14.sh'), e)
    e = err_of(function() return d.files.train end)
    assert.truthy(has(e, 'train split is not available'), e)
    e = err_of(pn.data.load, 'iwslt14', { splits = { 'train', 'valid', 'test' } })
    assert.truthy(has(e, 'data.iwslt14: the train split is not available'), e)
    local v = tr.iwslt14{ splits = { 'valid', 'test' } }
    assert.equal(7283, v.valid.n)
  end)

  it('path = a folder; a split with one of its two files is an error naming the missing one', function()
    local dir = tmpdir()
    write(dir .. '/valid.de', 'a b\nc\n')
    write(dir .. '/valid.en', 'A B\nC\n')
    write(dir .. '/test.de', 'x\n')
    local e = err_of(tr.multi30k, { path = dir })
    assert.truthy(has(e, dir .. '/test.en is missing'), e)
    write(dir .. '/test.en', 'X\n')
    local d = tr.multi30k{ path = dir }
    assert.same({ 'valid', 'test' }, d.splits)
    assert.equal(2, d.valid.n)
    assert.truthy(has(err_of(function() return d.train end), 'multi30k: the train split is not available'))
    assert.truthy(has(err_of(tr.multi30k, { path = dir .. '/none' }), 'no {train,valid,test}.{de,en} files in'))
    local names = {}
    for _, n in ipairs(pn.data.list()) do names[n] = true end
    assert.is_true(names.multi30k and names.iwslt14)
    assert.truthy(has(err_of(pn.data.load, 'multi30k', { paht = dir }), "unknown option 'paht'"))
  end)
end)

describe('translation.encode', function()
  local split = { name = 'train', src = { '5 6 7', '5 6 7 8 9', '5', '9 9 9 9' }, tgt = { '8', '8', '8 8 8 8 8', '7' } }

  it('train mode drops pairs longer than max_len on either side and counts them', function()
    local e = tr.encode(split, num_tok, { max_len = 4 })
    assert.equal('train', e.mode)
    assert.same({ 1, 4 }, e.index)
    assert.same({ { 5, 6, 7 }, { 9, 9, 9, 9 } }, e.src_ids)
    assert.same({ { 8 }, { 7 } }, e.tgt_ids)
    assert.equal(2, e.skipped.too_long)
    assert.equal(0, e.truncated)
    assert.equal(3, e.eos)
  end)

  it('eval mode keeps every pair: long sources truncated and counted, references untouched', function()
    local e = tr.encode(split, num_tok, { max_len = 4, mode = 'eval' })
    assert.same({ 1, 2, 3, 4 }, e.index)
    assert.same({ 5, 6, 7, 8 }, e.src_ids[2])
    assert.equal(1, e.truncated)
    assert.same({ 2 }, e.truncated_index)
    assert.equal(1, e.truncated_tgt)
    assert.same({ 8, 8, 8, 8 }, e.tgt_ids[3])
    assert.equal(0, e.skipped.too_long)
    -- the default mode follows the split's name
    assert.equal('eval', tr.encode({ name = 'test', src = split.src, tgt = split.tgt }, num_tok).mode)
  end)

  it('rejects ids out of the vocabulary and a non-tokenizer', function()
    local bad = { pad = 0, bos = 2, eos = 3, vocab_size = 6 }
    function bad:encode(l) return { 7 } end
    assert.truthy(has(err_of(tr.encode, split, bad), 'id 7 at source line 1'))
    assert.truthy(has(err_of(tr.encode, split, {}), 'tok must be a tokenizer'))
  end)
end)

describe('translation.batches', function()
  it('builds padded tensors, bos/eos and the mask on a hand example', function()
    local enc = { src_ids = { { 5, 6, 7 }, { 8 } }, tgt_ids = { { 9, 10 }, { 11, 12, 13 } }, index = { 1, 2 },
                  mode = 'eval' }
    local b = tr.batches(enc, { sort_eval = false })
    assert.equal(1, #b)
    b = b[1]
    assert.same({ { 5, 6, 7 }, { 8, 0, 0 } }, b.src:totable())
    assert.equal('i64', b.src:dtype())
    assert.same({ { 2, 9, 10, 0 }, { 2, 11, 12, 13 } }, b.tgt_in:totable())
    assert.same({ { 9, 10, 3, 0 }, { 11, 12, 13, 3 } }, b.tgt_out:totable())
    assert.equal('i64', b.tgt_out:dtype())
    assert.same({ 2, 1, 1, 3 }, b.src_mask:shape())
    assert.equal('u8', b.src_mask:dtype())
    assert.same({ { { { 1, 1, 1 } } }, { { { 1, 0, 0 } } } }, b.src_mask:totable())
    assert.same({ 3, 1 }, b.src_len)
    assert.same({ 3, 4 }, b.tgt_len)
    assert.same({ 1, 2 }, b.index)
    assert.equal(7, b.ntokens)
    assert.equal(4, b.nsrc)
    assert.equal(2, b.size)
    -- other specials, eos on the source, an empty source gets one eos
    enc.src_ids[2] = {}
    local c = tr.batches(enc, { sort_eval = false, pad = 1, bos = 4, eos = 0, src_eos = true })[1]
    assert.same({ { 5, 6, 7, 0 }, { 0, 1, 1, 1 } }, c.src:totable())
    assert.same({ { 4, 9, 10, 1 }, { 4, 11, 12, 13 } }, c.tgt_in:totable())
    assert.same({ { 9, 10, 0, 1 }, { 11, 12, 13, 0 } }, c.tgt_out:totable())
    local d = tr.batches(enc, { sort_eval = false })[1]
    assert.same({ { 5, 6, 7 }, { 3, 0, 0 } }, d.src:totable())
    assert.same({ { { { 1, 1, 1 } } }, { { { 1, 0, 0 } } } }, d.src_mask:totable())
  end)

  it('every sentence exactly once per epoch, batches within max_tokens', function()
    local enc = synthetic(600, 40)
    for _, mt in ipairs({ 41, 100, 512, 4096 }) do
      for seed = 0, 2 do
        for epoch = 1, 2 do
          local bs = tr.batches(enc, { max_tokens = mt, seed = seed, epoch = epoch })
          local seen, count = {}, 0
          for _, b in ipairs(bs) do
            local B, S = b.src:shape()[1], b.src:shape()[2]
            local T = b.tgt_in:shape()[2]
            assert.equal(B, #b.index)
            assert.truthy(math.max(S, T) * B <= mt, string.format('batch %dx%d/%d over %d', B, S, T, mt))
            local nt = 0
            for r, i in ipairs(b.index) do
              assert.is_nil(seen[i])
              seen[i], count = true, count + 1
              assert.equal(#enc.src_ids[i], b.src_len[r])
              assert.equal(#enc.tgt_ids[i] + 1, b.tgt_len[r])
              nt = nt + b.tgt_len[r]
            end
            assert.equal(nt, b.ntokens)
          end
          assert.equal(600, count)
        end
      end
    end
    -- the values of every row, for one configuration
    local bs = tr.batches(enc, { max_tokens = 300, seed = 5 })
    for _, b in ipairs(bs) do
      local src, ti, to, m = b.src:totable(), b.tgt_in:totable(), b.tgt_out:totable(), b.src_mask:totable()
      for r, i in ipairs(b.index) do
        local s, t = enc.src_ids[i], enc.tgt_ids[i]
        for j = 1, #src[r] do
          assert.equal(j <= #s and s[j] or 0, src[r][j])
          assert.equal(j <= #s and 1 or 0, m[r][1][1][j])
        end
        for j = 1, #ti[r] do
          assert.equal(j == 1 and 2 or (j <= #t + 1 and t[j - 1] or 0), ti[r][j])
          assert.equal(j <= #t and t[j] or (j == #t + 1 and 3 or 0), to[r][j])
        end
      end
    end
  end)

  it('a sentence longer than max_tokens gets a batch of its own', function()
    local enc = synthetic(50, 10)
    enc.src_ids[7] = {}
    for j = 1, 30 do enc.src_ids[7][j] = 5 end
    local bs = tr.batches(enc, { max_tokens = 20 })
    local n = 0
    for _, b in ipairs(bs) do
      n = n + b.size
      if b.index[1] == 7 then
        assert.equal(1, b.size)
        assert.same({ 1, 30 }, b.src:shape())
      else
        assert.truthy(math.max(b.src:shape()[2], b.tgt_in:shape()[2]) * b.size <= 20)
      end
    end
    assert.equal(50, n)
  end)

  it('shuffling is deterministic in (seed, epoch) and changes with either', function()
    local enc = synthetic(400, 20)
    local a = order_of(tr.batches(enc, { max_tokens = 200, seed = 3, epoch = 1 }))
    local a2 = order_of(tr.batches(enc, { max_tokens = 200, seed = 3, epoch = 1 }))
    local b = order_of(tr.batches(enc, { max_tokens = 200, seed = 3, epoch = 2 }))
    local c = order_of(tr.batches(enc, { max_tokens = 200, seed = 4, epoch = 1 }))
    assert.same(a, a2)
    assert.are_not.same(a, b)
    assert.are_not.same(a, c)
    -- math.random's global state is neither used nor disturbed
    math.randomseed(1)
    local r1 = math.random()
    math.randomseed(1)
    tr.batches(enc, { seed = 9 })
    assert.equal(r1, math.random())
    -- no shuffle: batches in length order, the same every epoch
    local s1 = tr.batches(enc, { max_tokens = 200, shuffle = false, epoch = 1 })
    local s2 = tr.batches(enc, { max_tokens = 200, shuffle = false, epoch = 7 })
    assert.same(order_of(s1), order_of(s2))
    for k = 2, #s1 do assert.truthy(s1[k].src:shape()[2] >= s1[k - 1].src:shape()[2]) end
    -- bucketing still covers every sentence once
    local bk = order_of(tr.batches(enc, { max_tokens = 200, bucket = 8, seed = 1 }))
    table.sort(bk)
    for i = 1, 400 do assert.equal(i, bk[i]) end
  end)

  it('eval batches: sorted by length without randomness, or in order; every sentence once', function()
    local enc = synthetic(300, 30, 'eval')
    local a = tr.batches(enc, { max_tokens = 256 })
    assert.same(order_of(a), order_of(tr.batches(enc, { max_tokens = 256, seed = 99, epoch = 3 })))
    local prev = 0
    for _, b in ipairs(a) do
      for _, l in ipairs(b.src_len) do assert.truthy(l >= prev); prev = l end
    end
    local o = order_of(tr.batches(enc, { max_tokens = 256, sort_eval = false }))
    for i = 1, 300 do assert.equal(i, o[i]) end
    assert.truthy(has(err_of(tr.batches, enc, { max_token = 1 }), "unknown option 'max_token'"))
  end)

  it('Multi30k end to end: encode, batch, every pair once', function()
    local d = tr.multi30k{ splits = { 'train', 'test' }, checksum = false }
    local all = {}
    for _, l in ipairs(d.train.src) do all[#all + 1] = l end
    for _, l in ipairs(d.train.tgt) do all[#all + 1] = l end
    local tok = word_tok(all) -- test words outside it become unk
    local e = tr.encode(d.train, tok, { max_len = 25 })
    assert.equal(29000, e.n + e.skipped.too_long)
    assert.truthy(e.skipped.too_long > 0)
    local bs = tr.batches(e, { max_tokens = 4096, seed = 1, epoch = 1 })
    local seen, n = {}, 0
    for _, b in ipairs(bs) do
      for _, i in ipairs(b.index) do assert.is_nil(seen[i]); seen[i] = true; n = n + 1 end
    end
    assert.equal(e.n, n)
    local t = tr.encode(d.test, tok, { max_len = 10 })
    assert.equal('eval', t.mode)
    assert.equal(1000, t.n)
    assert.truthy(t.truncated > 0)
    assert.equal(#t.truncated_index, t.truncated)
    local tb = tr.batches(t, { max_tokens = 1000 })
    local cnt = 0
    for _, b in ipairs(tb) do cnt = cnt + b.size end
    assert.equal(1000, cnt)
  end)
end)
