-- Corpus BLEU and chrF (core/text/bleu.c, lua/penumbra/text/bleu.lua, `./bench bleu`): sacreBLEU
-- 2.x with its defaults. Every expected number below is worked out by hand in the comments (or
-- by the small independent Lua re-implementation at the top, on text where 13a tokenisation is
-- plain whitespace splitting); experiments/perf/bleu_conformance.lua compares with sacreBLEU
-- itself on real corpora.
local M = require 'penumbra.text.bleu'
local assert_error_matching = require('spec.helpers.check').assert_error_matching

local log, exp = math.log, math.exp

-- sacreBLEU's score from corpus statistics (BLEU.compute_bleu, smooth 'exp', order 4), written
-- from its description: early 0 when nothing matches; zero counts smoothed 100/(2^k·total);
-- a zero total stops (that log counts as −9999999999).
local function score_of(counts, totals, sys, ref)
  local bp = 1
  if sys < ref then bp = sys > 0 and exp(1 - ref / sys) or 0 end
  local p = { 0, 0, 0, 0 }
  local any = false
  for n = 1, 4 do any = any or counts[n] > 0 end
  if not any then return 0, p, bp end
  local k = 1
  for n = 1, 4 do
    if totals[n] == 0 then break end
    if counts[n] == 0 then
      k = k * 2
      p[n] = 100 / (k * totals[n])
    else
      p[n] = 100 * counts[n] / totals[n]
    end
  end
  local s = 0
  for n = 1, 4 do s = s + (p[n] > 0 and log(p[n]) or -9999999999) end
  return bp * exp(s / 4), p, bp
end

-- The numbers of a BLEU line, each checked to be the value rounded to the printed places
-- (Python rounds exact ties to even, as C's printf does; LuaJIT's string.format rounds them up,
-- so the line cannot simply be rebuilt here — the exact tie rule has its own hand case below).
local function assert_line(line, score, p, bp, sys, ref)
  local pat = '^BLEU = (%d+%.%d%d) (%d+%.%d)/(%d+%.%d)/(%d+%.%d)/(%d+%.%d) %(BP = (%d%.%d%d%d) ' ..
              'ratio = (%d+%.%d%d%d) hyp_len = (%d+) ref_len = (%d+)%)$'
  local got = { line:match(pat) }
  assert.equal(9, #got, line)
  local want = { score, p[1], p[2], p[3], p[4], bp, ref > 0 and sys / ref or 0 }
  local places = { 2, 1, 1, 1, 1, 3, 3 }
  for i = 1, 7 do
    local half = 0.5 * 10 ^ -places[i]
    assert.is_true(math.abs(tonumber(got[i]) - want[i]) <= half + 1e-12, line .. ': field ' .. i)
  end
  assert.equal(sys, tonumber(got[8]))
  assert.equal(ref, tonumber(got[9]))
end

-- an independent BLEU over whitespace-separated words (no punctuation: 13a changes nothing)
local function words(s)
  local w = {}
  for x in s:gmatch('%S+') do w[#w + 1] = x end
  return w
end
local function ngram_counts(w, maxn)
  local c = {}
  for n = 1, maxn do
    for i = 1, #w - n + 1 do
      local k = n .. '\1' .. table.concat(w, '\1', i, i + n - 1)
      c[k] = (c[k] or 0) + 1
    end
  end
  return c
end
local function ref_bleu(hyps, streams)
  local counts, totals, sys, reflen = { 0, 0, 0, 0 }, { 0, 0, 0, 0 }, 0, 0
  for i = 1, #hyps do
    local h = words(hyps[i])
    local maxc, best, bestd = {}, nil, nil
    for _, st in ipairs(streams) do
      local r = words(st[i])
      for k, v in pairs(ngram_counts(r, 4)) do maxc[k] = math.max(maxc[k] or 0, v) end
      local d = math.abs(#h - #r)
      if not bestd or d < bestd or (d == bestd and #r < best) then best, bestd = #r, d end
    end
    for k, v in pairs(ngram_counts(h, 4)) do
      local n = tonumber(k:match('^(%d+)'))
      counts[n] = counts[n] + math.min(v, maxc[k] or 0)
    end
    for n = 1, 4 do totals[n] = totals[n] + math.max(0, #h - n + 1) end
    sys, reflen = sys + #h, reflen + best
  end
  return counts, totals, sys, reflen
end

-- an independent chrF2 over ASCII text (characters = bytes there)
local function chars_of(s) return (s:gsub('%s', '')) end
local function char_counts(s, n)
  local c = {}
  for i = 1, #s - n + 1 do
    local k = s:sub(i, i + n - 1)
    c[k] = (c[k] or 0) + 1
  end
  return c
end
local function chrf_f(st)
  local P, R, eff = 0, 0, 0
  for n = 1, 6 do
    local h, r, m = st[n][1], st[n][2], st[n][3]
    if h > 0 and r > 0 then P, R, eff = P + m / h, R + m / r, eff + 1 end
  end
  if eff == 0 then return 0 end
  P, R = P / eff, R / eff
  if P + R == 0 then return 0 end
  return 100 * (5 * P * R) / (4 * P + R)
end
local function ref_chrf(hyps, streams)
  local tot = {}
  for n = 1, 6 do tot[n] = { 0, 0, 0 } end
  for i = 1, #hyps do
    local h = chars_of(hyps[i])
    local best, best_st = -1, nil
    for _, s in ipairs(streams) do
      local r = chars_of(s[i])
      local st = {}
      for n = 1, 6 do
        local hc, rc = char_counts(h, n), char_counts(r, n)
        local nr = math.max(0, #r - n + 1)
        local m = 0
        for k, v in pairs(hc) do m = m + math.min(v, rc[k] or 0) end
        st[n] = { nr > 0 and math.max(0, #h - n + 1) or 0, nr, m }
      end
      local f = chrf_f(st)
      if f > best then best, best_st = f, st end
    end
    for n = 1, 6 do for k = 1, 3 do tot[n][k] = tot[n][k] + best_st[n][k] end end
  end
  return chrf_f(tot), tot
end

describe('bleu', function()
  it('is 100 for a perfect match', function()
    -- 6 tokens: counts = totals = {6, 5, 4, 3}, every precision 100, bp 1: exp(4·log 100 / 4) = 100
    local s = M.bleu({ 'the cat sat on the mat' }, { 'the cat sat on the mat' })
    assert.near(100, s.score, 1e-9)
    assert.same({ 6, 5, 4, 3 }, s.counts)
    assert.same({ 6, 5, 4, 3 }, s.totals)
    assert.equal(1, s.bp)
    assert.equal(1, s.ratio)
    assert.equal('BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000 ratio = 1.000 hyp_len = 6 ref_len = 6)', s.line)
    assert.equal(s.line, s:format())
    assert.equal(s.line, tostring(s))
  end)

  it('is 0 with all precisions 0 when no n-gram matches (no smoothing applies then)', function()
    -- 'a b c' vs 'd e f': counts {0,0,0,0}, totals {3,2,1,0}; sacreBLEU stops early: score 0, p = 0
    local s = M.bleu({ 'a b c' }, { 'd e f' })
    assert.equal(0, s.score)
    assert.same({ 0, 0, 0, 0 }, s.counts)
    assert.same({ 3, 2, 1, 0 }, s.totals)
    assert.same({ 0, 0, 0, 0 }, s.precisions)
    assert.equal('BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 1.000 ratio = 1.000 hyp_len = 3 ref_len = 3)', s.line)
  end)

  it("smooths zero counts with sacreBLEU's 'exp' method", function()
    -- hyp 'cat the mat on sat' (5), ref 'the cat sat on the mat' (6)
    --   1-grams cat the mat on sat: all in ref            5/5 → 100
    --   2-grams 'cat the' 'the mat' 'mat on' 'on sat': only 'the mat'   1/4 → 25
    --   3-grams: none of 3 match → 100/(2·3) = 16.667;  4-grams: none of 2 → 100/(4·2) = 12.5
    --   bp = exp(1 − 6/5) = 0.8187; score = bp·(100·25·16.667·12.5)^(1/4) = 0.8187·26.864 = 21.99
    local s = M.bleu({ 'cat the mat on sat' }, { 'the cat sat on the mat' })
    assert.same({ 5, 1, 0, 0 }, s.counts)
    assert.same({ 5, 4, 3, 2 }, s.totals)
    assert.near(100, s.precisions[1], 1e-12)
    assert.near(25, s.precisions[2], 1e-12)
    assert.near(100 / 6, s.precisions[3], 1e-12)
    assert.near(12.5, s.precisions[4], 1e-12)
    assert.near(exp(-0.2), s.bp, 1e-15)
    assert.near(exp(-0.2) * (100 * 25 * (100 / 6) * 12.5) ^ 0.25, s.score, 1e-9)
    assert.near(21.99, s.score, 0.005)
    assert.equal('BLEU = 21.99 100.0/25.0/16.7/12.5 (BP = 0.819 ratio = 0.833 hyp_len = 5 ref_len = 6)', s.line)

    -- 'the cat sat' vs 'the cat ran': p1 = 2/3, p2 = 1/2, 3-gram 0/1 → 100/(2·1) = 50, no 4-gram
    -- (total 0) stops the loop: p4 = 0 and log 0 → −9999999999, so the score is 0
    local z = M.bleu({ 'the cat sat' }, { 'the cat ran' })
    assert.equal(0, z.score)
    assert.equal('BLEU = 0.00 66.7/50.0/50.0/0.0 (BP = 1.000 ratio = 1.000 hyp_len = 3 ref_len = 3)', z.line)
  end)

  it('clips repeated n-grams by the reference count', function()
    -- 'the the the the' vs 'the cat': 'the' 4 times, clipped to 1 → 1/4 = 25; 2,3,4-grams 0/3, 0/2,
    -- 0/1 → 100/6, 100/8, 100/8; bp 1 (4 ≥ 2), ratio 2; score = (25·16.667·12.5·12.5)^(1/4) = 15.97
    local s = M.bleu({ 'the the the the' }, { 'the cat' })
    assert.same({ 1, 0, 0, 0 }, s.counts)
    assert.near((25 * (100 / 6) * 12.5 * 12.5) ^ 0.25, s.score, 1e-9)
    assert.equal('BLEU = 15.97 25.0/16.7/12.5/12.5 (BP = 1.000 ratio = 2.000 hyp_len = 4 ref_len = 2)', s.line)
  end)

  it("rounds the printed figures as Python does (exact ties to even)", function()
    -- 'a … m' (13 words) vs the same words reversed: 13/13 unigrams match, no bigram does, so
    -- p = 100, 100/(2·12) = 4.1667, 100/(4·11) = 2.2727, 100/(8·10) = 1.25 exactly;
    -- f"{1.25:.1f}" is '1.2' (a tie, to even); score (100·4.1667·2.2727·1.25)^(1/4) = 5.8656
    local s = M.bleu({ 'a b c d e f g h i j k l m' }, { 'm l k j i h g f e d c b a' })
    assert.equal(1.25, s.precisions[4])
    assert.near((100 * (100 / 24) * (100 / 44) * 1.25) ^ 0.25, s.score, 1e-9)
    assert.equal('BLEU = 5.87 100.0/4.2/2.3/1.2 (BP = 1.000 ratio = 1.000 hyp_len = 13 ref_len = 13)', s.line)
  end)

  it('applies the brevity penalty', function()
    -- 'the cat sat on' (4) is a prefix of the 6-token reference: all precisions 100,
    -- bp = exp(1 − 6/4) = exp(−0.5) = 0.60653, score 60.65
    local s = M.bleu({ 'the cat sat on' }, { 'the cat sat on the mat' })
    assert.near(exp(-0.5), s.bp, 1e-15)
    assert.near(100 * exp(-0.5), s.score, 1e-9)
    assert.near(4 / 6, s.ratio, 1e-15)
    assert.equal('BLEU = 60.65 100.0/100.0/100.0/100.0 (BP = 0.607 ratio = 0.667 hyp_len = 4 ref_len = 6)', s.line)
  end)

  it('scores an empty hypothesis 0 with bp 0', function()
    -- sys_len 0 < ref_len 2: bp = 0 (sacreBLEU's guard), ratio 0/2 = 0, nothing matches
    local s = M.bleu({ '' }, { 'the cat' })
    assert.equal(0, s.score)
    assert.equal(0, s.bp)
    assert.equal('BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.000 ratio = 0.000 hyp_len = 0 ref_len = 2)', s.line)
    -- and an empty corpus: everything 0, bp 1 (sys_len is not below ref_len)
    local e = M.bleu({}, {})
    assert.equal('BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 1.000 ratio = 0.000 hyp_len = 0 ref_len = 0)', e.line)
  end)

  it('sums statistics over the corpus before scoring', function()
    -- seg 1 as above: counts {5,1,0,0}, totals {5,4,3,2}, 5 vs 6 tokens
    -- seg 2 'hello world' = its reference: counts = totals = {2,1,0,0}
    -- corpus: counts {7,2,0,0}, totals {7,5,3,2}, sys 7, ref 8 → p = 100, 40, 100/6, 12.5
    local s = M.bleu({ 'cat the mat on sat', 'hello world' }, { 'the cat sat on the mat', 'hello world' })
    assert.same({ 7, 2, 0, 0 }, s.counts)
    assert.same({ 7, 5, 3, 2 }, s.totals)
    local want = exp(1 - 8 / 7) * (100 * 40 * (100 / 6) * 12.5) ^ 0.25
    assert.near(want, s.score, 1e-9)
    assert.equal(string.format('BLEU = %.2f 100.0/40.0/16.7/12.5 (BP = 0.867 ratio = 0.875 hyp_len = 7 ref_len = 8)',
      want), s.line)
  end)

  it('takes several reference streams: max counts and the closest length (ties: the shorter)', function()
    -- hyp 'a b c d e' (5) vs 'a b c d' (4) and 'a b c d e f' (6): every hyp n-gram occurs in one of
    -- them → all precisions 100; lengths 4 and 6 are both 1 away → 4 is taken: ratio 5/4
    local s = M.bleu({ 'a b c d e' }, { { 'a b c d' }, { 'a b c d e f' } })
    assert.same({ 5, 4, 3, 2 }, s.counts)
    assert.equal(4, s.ref_len)
    assert.equal('BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000 ratio = 1.250 hyp_len = 5 ref_len = 4)', s.line)
  end)

  it('agrees with an independent Lua BLEU on random corpora (1 and 2 reference streams)', function()
    local vocab = { 'the', 'cat', 'a', 'dog', 'sat', 'on', 'mat', 'ran', 'big' }
    local seed = 12345
    local function rnd(k) -- LCG
      seed = (seed * 1103515245 + 12345) % 2147483648
      return seed % k
    end
    local function sentence()
      local w = {}
      for i = 1, rnd(14) do w[i] = vocab[rnd(#vocab) + 1] end
      return table.concat(w, ' ')
    end
    for trial = 1, 20 do
      local n, ns = 1 + rnd(12), 1 + trial % 2
      local hyps, streams = {}, {}
      for r = 1, ns do streams[r] = {} end
      for i = 1, n do
        hyps[i] = sentence()
        for r = 1, ns do streams[r][i] = sentence() end
      end
      local counts, totals, sys, ref = ref_bleu(hyps, streams)
      local s = M.bleu(hyps, ns == 1 and streams[1] or streams)
      assert.same(counts, s.counts, 'trial ' .. trial)
      assert.same(totals, s.totals)
      assert.equal(sys, s.sys_len)
      assert.equal(ref, s.ref_len)
      local score, p, bp = score_of(counts, totals, sys, ref)
      assert.near(score, s.score, 1e-9)
      for k = 1, 4 do assert.near(p[k], s.precisions[k], 1e-9) end
      assert.near(bp, s.bp, 1e-15)
      assert_line(s.line, score, p, bp, sys, ref)
      local c = ref_chrf(hyps, streams)
      assert.near(c, M.chrf(hyps, ns == 1 and streams[1] or streams).score, 1e-9)
    end
  end)
end)

describe('bleu 13a tokenisation', function()
  local tok = M.tokenize_13a
  it('splits punctuation off words', function()
    -- ' Hello, world! ': R2 'o,' → 'o , '; R1 '!' → ' ! '
    assert.equal('Hello , world !', tok('Hello, world!'))
    assert.equal('( a / b )', tok('(a/b)'))            -- R1: ( / ) are in the class
    assert.equal("don't", tok("don't"))               -- the apostrophe is not
    assert.equal('U . S . A .', tok('U.S.A.'))         -- R2 on U. S. A.
  end)
  it('keeps periods and commas inside numbers', function()
    -- '$' (R1); '1,000.50' keeps , and . (digits on both sides); 'today.' → R2 'y.' → 'y . '
    assert.equal('It costs $ 1,000.50 today .', tok('It costs $1,000.50 today.'))
    -- '3.14,' : R2 needs a non-digit before ',' (it is '4'), R3 fires as ', ' has a non-digit after
    assert.equal('pi is 3.14 , right', tok('pi is 3.14, right'))
    -- 'v.2': R2 ('v.'); '2.x': R3 ('.x')
    assert.equal('v . 2 and 2 . x', tok('v.2 and 2.x'))
    -- 'x,y' R2; '1,a' R3; 'a,1' R2; ' .5' R2 (space before); '5. ' R3
    assert.equal('x , y 1 , a a , 1 . 5 5 .', tok('x,y 1,a a,1 .5 5.'))
  end)
  it('unescapes &quot; &amp; &lt; &gt; once, in that order', function()
    assert.equal('" Hi " & < b >', tok('&quot;Hi&quot; &amp; &lt;b&gt;'))
    -- '&amp;quot;': the &quot; pass finds nothing, the &amp; pass makes '&quot;', which stays; R1
    -- splits & and ;
    assert.equal('& quot ;', tok('&amp;quot;'))
    assert.equal('& apos ;', tok('&apos;'))           -- not one of the four
  end)
  it('splits a dash only after a digit', function()
    assert.equal('well-known 5 - 3 a-5 1990 - 2000 --', tok('well-known 5-3 a-5 1990-2000 --'))
  end)
  it('drops <skipped>, joins "-\\n" and right-strips first', function()
    assert.equal('ab', tok('a<skipped>b'))
    assert.equal('information next', tok('infor-\nmation\nnext'))
    assert.equal('end-', tok('end-\n')) -- the rstrip removes the newline before '-\n' is looked for
  end)
  it("splits on Python's Unicode whitespace, not on other characters", function()
    -- U+00A0 and U+2009 are whitespace for str.split(); U+200B (zero width space) is not
    assert.equal('a b a b a\226\128\139b', tok('a\194\160b a\226\128\137b a\226\128\139b'))
    assert.equal('a b', tok('  a\t\r\v\f\28b \227\128\128 '))
  end)
  it('counts what it tokenises: 13a changes the n-grams BLEU sees', function()
    -- 'Hello, world!' vs 'Hello , world !': identical after 13a → 100
    assert.near(100, M.bleu({ 'Hello, world!' }, { 'Hello , world !' }).score, 1e-9)
    -- '&quot;x&quot;' equals '"x"' after unescaping: 3 tokens each
    local s = M.bleu({ '&quot;x&quot;' }, { '"x"' })
    assert.equal(3, s.sys_len)
    assert.same({ 3, 2, 1, 0 }, s.counts)
  end)
end)

describe('chrf', function()
  it('matches a hand-computed chrF2', function()
    -- 'ab' vs 'abc': order 1 hyp {a,b} ref {a,b,c} match 2 → P 1, R 2/3; order 2 {ab} vs {ab,bc}
    -- → P 1, R 1/2; order 3: the hyp has none (ref has 'abc'): not averaged; 4..6: none.
    -- P = 1, R = (2/3 + 1/2)/2 = 7/12; chrF2 = 100·5·P·R/(4P + R) = 100·(35/12)/(55/12) = 63.64
    local c = M.chrf({ 'ab' }, { 'abc' })
    assert.near(100 * 35 / 55, c.score, 1e-9)
    assert.equal('chrF2 = 63.64', c.line)
    assert.same({ 2, 1, 0, 0, 0, 0 }, c.hyp)
    assert.same({ 3, 2, 1, 0, 0, 0 }, c.ref)
    assert.same({ 2, 1, 0, 0, 0, 0 }, c.match)
    -- whitespace is removed before counting: the same numbers
    assert.near(100 * 35 / 55, M.chrf({ 'a b' }, { 'ab c' }).score, 1e-9)
  end)
  it('counts characters, not bytes', function()
    -- 'éa' vs 'éb' (é is two bytes): order 1 match 1 of 2 (P = R = 1/2), order 2 'éa' vs 'éb' 0 of 1
    -- (P = R = 0); P = R = 1/4 → 100·5·(1/16)/(5/4) = 25
    assert.near(25, M.chrf({ '\195\169a' }, { '\195\169b' }).score, 1e-9)
  end)
  it('is 0 with nothing in common and 100 for a perfect match', function()
    assert.equal(0, M.chrf({ 'abc' }, { 'xyz' }).score)
    assert.near(100, M.chrf({ 'the cat sat' }, { 'the cat sat' }).score, 1e-9)
  end)
end)

describe('bleu and chrf errors', function()
  it('name both counts when the line counts differ', function()
    assert_error_matching(function() M.bleu({ 'a', 'b' }, { 'a' }) end, '2 hypothesis lines', '1 reference lines')
    assert_error_matching(function() M.chrf({ 'a' }, { 'a', 'b', 'c' }) end, 'chrf', '1 hypothesis lines', '3 reference')
    assert_error_matching(function() M.bleu({ 'a' }, { { 'a' }, { 'b', 'c' } }) end, 'reference stream 2 has 2 lines')
  end)
  it('name the line (from 1) that is not valid UTF-8', function()
    assert_error_matching(function() M.bleu({ 'ok', 'b\255' }, { 'a', 'b' }) end, 'hypothesis line 2',
      'not valid UTF-8', 'byte 2')
    assert_error_matching(function() M.bleu({ 'a', 'b', 'c' }, { 'a', 'b', 'x\192\175' }) end, 'reference line 3',
      'UTF-8') -- an overlong '/'
    assert_error_matching(function() M.chrf({ '\237\160\128' }, { 'a' }) end, 'hypothesis line 1', 'UTF-8') -- a surrogate
    assert_error_matching(function() M.bleu({ 'ab\226\130' }, { 'a' }) end, 'hypothesis line 1', 'UTF-8') -- truncated
    assert_error_matching(function() M.tokenize_13a('\244\144\128\128') end, 'UTF-8') -- above U+10FFFF
  end)
  it('refuse non-strings, NUL bytes and options other than the defaults', function()
    assert_error_matching(function() M.bleu({ 'a', 7 }, { 'a', 'b' }) end, 'hypothesis line 2', 'number')
    assert_error_matching(function() M.bleu({ 'a' }, { 'a\0b' }) end, 'reference line 1', 'NUL')
    assert_error_matching(function() M.bleu('a', { 'a' }) end, 'list of strings')
    assert_error_matching(function() M.bleu({ 'a' }, { 'a' }, { tokenize = 'intl' }) end, 'tokenize', '13a')
    assert_error_matching(function() M.bleu({ 'a' }, { 'a' }, { lowercase = true }) end, 'lowercase')
    assert_error_matching(function() M.chrf({ 'a' }, { 'a' }, { nope = 1 }) end, "unknown option 'nope'")
    assert.near(100, M.bleu({ 'a b c d' }, { 'a b c d' }, { tokenize = '13a', smooth_method = 'exp' }).score, 1e-9)
  end)
end)

describe('./bench bleu', function()
  local home = os.getenv('PENUMBRA_HOME') or '.'
  local function write(path, s)
    local f = assert(io.open(path, 'wb'))
    f:write(s)
    f:close()
  end
  local function bench(args)
    local p = io.popen(string.format('"%s/bench" bleu %s 2>&1; echo "rc=$?"', home, args))
    local out = p:read('*a')
    p:close()
    local rc = tonumber(out:match('rc=(%d+)%s*$'))
    return out:gsub('rc=%d+%s*$', ''), rc
  end
  local ref, hyp, short = os.tmpname(), os.tmpname(), os.tmpname()
  write(ref, 'the cat sat on the mat\nhello world\n')
  write(hyp, 'cat the mat on sat\nhello world') -- no final newline: still two lines
  write(short, 'hello world\n')

  it("prints sacreBLEU's line and, with --chrf, the chrF2 line", function()
    local out, rc = bench(string.format('"%s" "%s" --chrf', ref, hyp))
    assert.equal(0, rc, out)
    -- the two-segment corpus of 'sums statistics over the corpus' above
    local want = exp(1 - 8 / 7) * (100 * 40 * (100 / 6) * 12.5) ^ 0.25
    local c = ref_chrf({ 'cat the mat on sat', 'hello world' }, { { 'the cat sat on the mat', 'hello world' } })
    assert.equal(string.format('BLEU = %.2f 100.0/40.0/16.7/12.5 (BP = 0.867 ratio = 0.875 hyp_len = 7 ref_len = 8)\n' ..
      'chrF2 = %.2f\n', want, c), out)
  end)
  it('fails with a message when the line counts differ, a file is missing or is a directory', function()
    local out, rc = bench(string.format('"%s" "%s"', ref, short))
    assert.equal(1, rc)
    assert.truthy(out:find('has 1 lines', 1, true), out)
    assert.truthy(out:find('has 2', 1, true), out)
    out, rc = bench(string.format('"%s" /nonexistent/hyp.txt', ref))
    assert.equal(1, rc)
    assert.truthy(out:find('cannot open /nonexistent/hyp.txt', 1, true), out)
    out, rc = bench(string.format('/tmp "%s"', ref)) -- a directory where a file should be
    assert.equal(1, rc)
    assert.truthy(out:find('bleu: cannot read /tmp (Is a directory)', 1, true), out)
    out, rc = bench('"' .. ref .. '"')
    assert.equal(1, rc)
    assert.truthy(out:find('usage: ./bench bleu', 1, true), out)
    -- sacreBLEU's own flags are named, not opened as files ("cannot open intl")
    out, rc = bench(string.format('"%s" "%s" -tok intl', ref, ref))
    assert.equal(1, rc)
    assert.truthy(out:find("bleu: unknown option '-tok' (this is sacreBLEU's default BLEU: 13a, cased", 1, true), out)
  end)
  it('reads lines as sacreBLEU does: split on \\n only, no empty last line', function()
    local p = os.tmpname()
    write(p, 'a\r\nb\n\nc')
    assert.same({ 'a\r', 'b', '', 'c' }, M.read_lines(p))
    write(p, '')
    assert.same({}, M.read_lines(p))
    os.remove(p)
  end)
end)
