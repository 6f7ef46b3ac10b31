-- spec/transformer_spec.lua — pn.nn.Transformer and its decoding (nn/transformer.lua,
-- nn/translate.lua): incremental decoding equals the full forward for every score and for the
-- linear decoder self-attentions, beam 1 equals greedy, beam search with a beam wide enough
-- to hold every prefix equals exhaustive search, the label-smoothed loss against a hand
-- computation, an f64 gradcheck of every parameter at a tiny size, and tiny models that learn
-- to copy and to reverse sequences.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'

local PAD, UNK, BOS, EOS = 0, 1, 2, 3

local function tiny(o)
  local c = { vocab = 12, d_model = 16, heads = 2, ff = 32, enc_layers = 2, dec_layers = 2, dropout = 0 }
  for k, v in pairs(o or {}) do c[k] = v end
  return pn.nn.Transformer(c)
end

local function ids(t) return pn.tensor(t, { dtype = 'i64' }) end
local function mask_of(src) local s = src:shape() return src:ne(PAD):to('u8'):view(s[1], 1, 1, s[2]) end

local CONFIGS = {
  { score = 'dot' }, { score = 'laplacian' }, { score = 'umbral' }, { score = 'penumbral' },
  { score = 'hyperbolic' }, { score = 'hyperbolic', model = 'halfspace', map = 'psi' }, { score = 'umbral', map = 'exp0' },
  { score = 'dot', self_attn = 'cosine' }, { score = 'dot', self_attn = 'power' }, { score = 'umbral', prenorm = true, qk_dim = 6 },
}
local function name_of(c)
  local t = {}
  for k, v in pairs(c) do t[#t + 1] = k .. '=' .. tostring(v) end
  table.sort(t)
  return table.concat(t, ' ')
end

describe('nn.Transformer', function()
  it('decodes incrementally exactly as the full forward computes (every score, linear self-attention)', function()
    local src = ids({ { 5, 6, 7, 8, 9, 10 }, { 11, 4, 5, PAD, PAD, PAD } })
    local tgt = ids({ { BOS, 4, 5, 6, 7 }, { BOS, 8, 9, 10, 11 } })
    for _, c in ipairs(CONFIGS) do
      pn.manual_seed(7)
      local m = tiny(c)
      m:eval()
      local full = m(src, tgt, mask_of(src))                 -- (2, 5, V)
      local st = m:begin_decode(m:encode(src, mask_of(src)), mask_of(src))
      for t = 1, 5 do
        local step = m:decode_step(st, tgt:narrow(2, t, 1):contiguous():view(2))
        local d = (step - full:narrow(2, t, 1):view(2, 12)):abs():max():item()
        assert(d < 2e-5, name_of(c) .. ': position ' .. t .. ' differs by ' .. d)
      end
      -- reordering the state (beam search) is the same as decoding the reordered batch
      local st2 = m:begin_decode(m:encode(src, mask_of(src)), mask_of(src))
      m:decode_step(st2, ids({ BOS, BOS }))
      m:reorder(st2, ids({ 1, 1, 0 }))
      local r = m:decode_step(st2, ids({ 8, 8, 4 }))
      local ref = m(ids({ { 11, 4, 5, PAD, PAD, PAD } }), ids({ { BOS, 8 } }), mask_of(ids({ { 11, 4, 5, PAD, PAD, PAD } })))
      local d = (r:narrow(1, 1, 1) - ref:narrow(2, 2, 1):view(1, 12)):abs():max():item()
      assert(d < 2e-5, name_of(c) .. ': reordered state differs by ' .. d)
      assert.is_true((r:narrow(1, 1, 1) - r:narrow(1, 2, 1)):abs():max():item() == 0)
    end
  end)

  it('grouped decoding (g rows a memory row, as beam search runs) equals each row with its own copy of the memory',
    function()
    local src = ids({ { 5, 6, 7, 8, 9, 10 }, { 11, 4, 5, PAD, PAD, PAD } })
    local function diff(a, b) return (a - b):abs():max():item() end
    -- f64: the same arithmetic to rounding; f32: to the tolerance of the incremental-decoding
    -- check above (the grouped call multiplies the memory's 2 rows where the other multiplies
    -- 6 copies, and BLAS may block the two products differently: 2.2e-6 seen on a CI machine)
    for _, dt in ipairs({ { 'f64', 1e-12 }, { 'f32', 2e-5 } }) do for _, c in ipairs(CONFIGS) do
      local dtype, tol = dt[1], dt[2]
      pn.manual_seed(7)
      local m = tiny(c)
      m:to(dtype)
      m:eval()
      local mem, mask = m:encode(src, mask_of(src)), mask_of(src)
      local rep = ids({ 0, 0, 0, 1, 1, 1 })
      local steps = { { BOS, BOS, BOS, BOS, BOS, BOS }, { 4, 5, 6, 8, 9, 10 }, { 7, 7, 4, 11, 8, 8 }, { 4, 5, 6 } }
      -- one decoding at a time: the linear self-attentions keep their state in the module
      local function run(grouped)
        local st = grouped and m:begin_decode(mem, mask, 3) -- rows 0-2: sentence 0, rows 3-5: sentence 1
          or m:begin_decode(mem:index_select(1, rep), mask:index_select(1, rep))
        local out = {}
        for t, tk in ipairs(steps) do
          out[t] = m:decode_step(st, ids(tk))
          -- beams reshuffled within each sentence: the memory stays (false)
          if t == 2 then m:reorder(st, ids({ 2, 0, 0, 4, 3, 5 }), grouped and false or nil) end
          -- sentence 0 finishes: its rows and its memory row leave
          if t == 3 then m:reorder(st, ids({ 5, 3, 4 }), grouped and ids({ 1 }) or nil) end
        end
        return out, st
      end
      local a, st = run(true)
      local b = run(false)
      for t = 1, #steps do
        local d = diff(a[t], b[t])
        assert(d < tol, name_of(c) .. ' ' .. dtype .. ': step ' .. t .. ' differs by ' .. d)
      end
      assert.same({ 3, 12 }, a[4]:shape())
      local ok, err = pcall(m.decode_step, m, st, ids({ 4, 5 }))
      assert.is_false(ok)
      assert.matches('2 tokens for 1 memory rows of 3 decoding rows each', err, 1, true)
    end end
  end)

  it('beam search with beam 1 chooses what greedy decoding chooses', function()
    for _, c in ipairs({ CONFIGS[1], CONFIGS[3], CONFIGS[8], CONFIGS[9] }) do
      pn.manual_seed(3)
      local m = tiny(c)
      local src = ids({ { 5, 6, 7, 8 }, { 9, 10, PAD, PAD }, { 4, PAD, PAD, PAD } })
      local g, gs = m:greedy(src)
      local b, bs = m:translate(src, { beam = 1 })
      for i = 1, 3 do
        assert.are.same(g[i], b[i])
        assert.is_true(math.abs(gs[i] - bs[i]) < 1e-4)
      end
    end
  end)

  it('beam search wide enough for every prefix finds the exhaustive best (length penalty too)', function()
    -- vocabulary 6: pad 0, unk 1, bos 2, eos 3, words 4 and 5 → choosable 1, 4, 5 and eos;
    -- at most max_len_b = 3 tokens, then eos is forced: 1 + 3 + 9 + 27 hypotheses
    local V = 6
    pn.manual_seed(11)
    local m = tiny({ vocab = V, dec_layers = 1, enc_layers = 1 })
    m:eval()
    local src = ids({ { 4, 5, 4 } })
    local function logp_of(seq) -- the sum of log-probabilities of seq followed by eos
      local tin = { BOS }
      for _, w in ipairs(seq) do tin[#tin + 1] = w end
      local lp = m(src, ids({ tin }), mask_of(src)):log_softmax(-1)
      local s = 0
      local all = {}
      for _, w in ipairs(seq) do all[#all + 1] = w end
      all[#all + 1] = EOS
      for t, w in ipairs(all) do s = s + lp:get(1, t, w + 1) end
      return s
    end
    for _, lenpen in ipairs({ 1, 0.3, 2 }) do
      local best, best_seq = -math.huge, nil
      local function walk(seq)
        local s = logp_of(seq) / ((#seq + 1) ^ lenpen)
        if s > best then best, best_seq = s, { unpack(seq) } end
        if #seq < 3 then
          for _, w in ipairs({ 1, 4, 5 }) do
            seq[#seq + 1] = w
            walk(seq)
            seq[#seq] = nil
          end
        end
      end
      walk({})
      local out, sc = m:translate(src, { beam = 40, lenpen = lenpen, max_len_a = 0, max_len_b = 3 })
      assert.are.same(best_seq, out[1])
      assert.is_true(math.abs(sc[1] / ((#out[1] + 1) ^ lenpen) - best) < 1e-4)
    end
  end)

  it('computes the label-smoothed loss as a hand computation does (padding ignored)', function()
    pn.manual_seed(5)
    local logits = pn.randn({ 5, 7 }, { dtype = 'f64' })
    local target = ids({ 3, 0, 6, 1, 0 })
    local eps = 0.1
    local got = pn.cross_entropy(logits, target, { label_smoothing = eps, ignore_index = 0 }):item()
    local want, n = 0, 0
    for i = 1, 5 do
      local y = target:get(i)
      if y ~= 0 then
        local mx, z = -math.huge, 0
        for j = 1, 7 do mx = math.max(mx, logits:get(i, j)) end
        for j = 1, 7 do z = z + math.exp(logits:get(i, j) - mx) end
        local lse = mx + math.log(z)
        local smooth = 0
        for j = 1, 7 do smooth = smooth + (lse - logits:get(i, j)) end
        want = want + (1 - eps) * (lse - logits:get(i, y + 1)) + eps * smooth / 7
        n = n + 1
      end
    end
    assert.is_true(math.abs(got - want / n) < 1e-12, got .. ' vs ' .. want / n)
  end)

  it('loss() over the non-pad positions equals the cross entropy of the full logits (value and every gradient)', function()
    for _, c in ipairs({ { score = 'dot' }, { score = 'umbral', prenorm = true } }) do
      for _, red in ipairs({ 'sum', 'mean' }) do
        pn.manual_seed(3)
        local m = tiny({ score = c.score, prenorm = c.prenorm })
        m:to('f64')
        local src = ids({ { 4, 5, 6, 7 }, { 5, 4, PAD, PAD }, { 9, PAD, PAD, PAD } })
        local tin = ids({ { BOS, 4, 5, 8 }, { BOS, 6, PAD, PAD }, { BOS, PAD, PAD, PAD } })
        local tout = ids({ { 4, 5, 8, EOS }, { 6, EOS, PAD, PAD }, { EOS, PAD, PAD, PAD } })
        local mask = mask_of(src)
        local o = { label_smoothing = 0.1, reduction = red }
        local full = pn.cross_entropy(m(src, tin, mask):view(-1, 12), tout:view(-1),
          { label_smoothing = 0.1, ignore_index = PAD, reduction = red })
        full:backward()
        local want = {}
        for i, p in ipairs(m:parameters()) do want[i] = p.grad:clone() end
        m:zero_grad()
        local got = m:loss(src, tin, tout, mask, o)
        assert.is_true(math.abs(got:item() - full:item()) < 1e-12 * math.abs(full:item()), got:item() .. ' vs ' .. full:item())
        got:backward()
        for i, p in ipairs(m:parameters()) do
          local d = (p.grad - want[i]):abs():max():item()
          assert.is_true(d < 1e-12, name_of(c) .. ' ' .. red .. ': parameter ' .. i .. ' differs by ' .. d)
        end
        m:zero_grad()
      end
    end
    local m = tiny()
    local src, tin = ids({ { 4, 5 } }), ids({ { BOS, 4 } })
    -- nothing to predict: 0, and still a graph to call backward on
    local z = m:loss(src, tin, ids({ { PAD, PAD } }), nil)
    assert.equal(0, z:item())
    z:backward()
    assert.has_error(function() m:loss(src, tin, ids({ { 4, 5, EOS } }), nil) end,
      'Transformer:loss: tgt_out [1,3] must have the shape of tgt_in [1,2] (one target per input position)')
    assert.has_error(function() m:loss(src, tin, ids({ { 4, 99 } }), nil) end)
    assert.has_error(function() m:loss(src, tin, ids({ { 4, EOS } }), nil, { smoothing = 0.1 }) end)
    assert.has_error(function() m:loss(src, tin, ids({ { 4, EOS } }), nil, { reduction = 'none' }) end)
  end)

  it('gives each sentence of a padded batch what it gets alone (the FFN skips the padding; value and gradients)', function()
    local S = { { 4, 5, 6, 7, 8 }, { 5, 4 }, { 9, 10, 11 } }
    local T = { { 6, 7, 8 }, { 4, 5, 6, 7, 9 }, { 10 } }
    local function pad(rows, n, first, last)
      local out = {}
      for b, r in ipairs(rows) do
        local t = {}
        if first then t[1] = first end
        for _, v in ipairs(r) do t[#t + 1] = v end
        if last then t[#t + 1] = last end
        while #t < n do t[#t + 1] = PAD end
        out[b] = t
      end
      return ids(out)
    end
    for _, c in ipairs({ { score = 'dot' }, { score = 'umbral', prenorm = true }, { score = 'dot', self_attn = 'cosine' } }) do
      pn.manual_seed(6)
      local m = tiny(c)
      m:to('f64')
      local src, tin, tout = pad(S, 5), pad(T, 6, BOS), pad(T, 6, nil, EOS)
      local batch = m:loss(src, tin, tout, mask_of(src), { label_smoothing = 0.1 })
      batch:backward()
      local want = {}
      for i, p in ipairs(m:parameters()) do want[i] = p.grad:clone() end
      m:zero_grad()
      local alone = 0
      for b = 1, 3 do
        local l = m:loss(pad({ S[b] }, #S[b]), pad({ T[b] }, #T[b] + 1, BOS), pad({ T[b] }, #T[b] + 1, nil, EOS), nil,
          { label_smoothing = 0.1 })
        l:backward()
        alone = alone + l:item()
      end
      assert.is_true(math.abs(alone - batch:item()) < 1e-10 * math.abs(alone), name_of(c) .. ': ' .. batch:item() .. ' vs ' .. alone)
      for i, p in ipairs(m:parameters()) do
        local d = (p.grad - want[i]):abs():max():item() / math.max(1e-6, want[i]:abs():max():item())
        assert.is_true(d < 1e-9, name_of(c) .. ': parameter ' .. i .. ' differs by ' .. d .. ' relative')
      end
      m:zero_grad()
    end
  end)

  it('passes an f64 gradcheck of every parameter at a tiny size', function()
    for _, c in ipairs({ { score = 'dot' }, { score = 'umbral', prenorm = true }, { score = 'dot', self_attn = 'cosine' } }) do
      pn.manual_seed(2)
      local m = tiny({ vocab = 7, d_model = 4, heads = 2, ff = 6, enc_layers = 1, dec_layers = 1, score = c.score,
                       prenorm = c.prenorm, self_attn = c.self_attn })
      m:to('f64')
      local src = ids({ { 4, 5, 6 }, { 5, 4, PAD } })
      local tin = ids({ { BOS, 4, 5 }, { BOS, 6, 4 } })
      local tout = ids({ { 4, 5, EOS }, { 6, 4, EOS } })
      local mask = mask_of(src)
      gradcheck(function()
        local logits = m(src, tin, mask)
        return pn.cross_entropy(logits:view(-1, 7), tout:view(-1), { label_smoothing = 0.1, ignore_index = PAD })
      end, m:parameters(), { atol = 1e-5, rtol = 1e-4 })
    end
  end)

  it('gives the attention maps of the last encoder and decoder layers (heatmaps)', function()
    pn.manual_seed(4)
    local m = tiny({ score = 'penumbral', enc_layers = 1, dec_layers = 1 })
    local src, tgt = ids({ { 5, 6, 7, 8 } }), ids({ { BOS, 4, 9 } })
    local enc_w, cross_w = m:attention_maps(src, tgt)
    assert.is_true(m.training) -- restored
    m:eval()
    pn.no_grad(function()
      -- independent of the capture: the layers' inputs rebuilt by hand (post-norm)
      local x = m:embed_tokens(src, 0)
      local want_enc = m.enc1.self_attn:weights(x, x)
      local mem = m:encode(src)
      local y = m:embed_tokens(tgt, 0)
      local h = m.dec1.norm1(y + m.dec1.self_attn(y, y))
      local want_cross = m.dec1.cross_attn:weights(h, mem)
      assert.are.same({ 1, 2, 4, 4 }, enc_w:shape())
      assert.are.same({ 1, 2, 3, 4 }, cross_w:shape())
      assert.is_true((enc_w - want_enc):abs():max():item() < 1e-6)
      assert.is_true((cross_w - want_cross):abs():max():item() < 1e-6)
      assert.is_true((cross_w:sum(-1) - 1):abs():max():item() < 1e-5)
    end)
  end)

  it('refuses bad arguments with named errors', function()
    assert.has_error(function() pn.nn.Transformer({ d_model = 16 }) end,
      'Transformer: vocab (the shared vocabulary size) is required')
    assert.has_error(function() pn.nn.Transformer({ vocab = 10, d_model = 10, heads = 3 }) end,
      'Transformer: d_model 10 is not divisible by heads 3')
    assert.has_error(function() pn.nn.Transformer({ vocab = 10, d_model = 8, heads = 2, bos = 3, eos = 3 }) end,
      'Transformer: pad, bos and eos must be three different ids, got 0, 3, 3')
    local ok, e = pcall(pn.nn.Transformer, { vocab = 10, colour = 1 })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('colour'))
    local m = tiny()
    ok, e = pcall(function() return m:translate(ids({ { 4, 5 } }), { beam = 0 }) end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('beam'))
    -- float ids are refused, as embedding refuses them (6.5 used to become token 6)
    for _, search in ipairs({ 'translate', 'greedy' }) do
      ok, e = pcall(function() return m[search](m, pn.tensor({ { 4, 6.5 } })) end)
      assert.is_false(ok)
      assert.truthy(tostring(e):find(search .. ': src must be a (B, N) i32 or i64 tensor of token ids, got f32 [1,2]', 1,
        true), tostring(e))
    end
    assert.are.same(m:greedy(ids({ { 4, 5 } })), m:greedy(ids({ { 4, 5 } }):to('i32')))
    -- NaN weights: an error, not an empty (beam) or arbitrary (greedy) translation that BLEU would score
    local broken = tiny()
    for _, p in ipairs(broken:parameters()) do pn.no_grad(function() p:fill_(0 / 0) end) end
    for _, search in ipairs({ 'translate', 'greedy' }) do
      ok, e = pcall(function() return broken[search](broken, ids({ { 4, 5 }, { 6, 7 } })) end)
      assert.is_false(ok)
      assert.truthy(tostring(e):find(search .. ': the model gives NaN log-probabilities for sentence 1 at target ' ..
        'position 1', 1, true), tostring(e))
    end
    ok, e = pcall(function() return m(ids({ { 4, 5 } }), ids({ { BOS } }), pn.ones({ 1, 1, 1, 3 }, { dtype = 'u8' })) end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('src_mask'))
    -- every entry point checks its inputs and blames the caller's line, not one inside the model
    -- (the embedding's and the attention's own messages named lines of transformer.lua)
    local here = 'spec/transformer_spec.lua:%d+: '
    local bad = {
      { function() local r = m(ids({ { 4, 12 } }), ids({ { BOS } })) return r end,
        'Transformer: src [1,2] holds id 12 at [1,2], outside the vocabulary 0..11' },
      { function() local r = m(ids({ { 4, 5 } }), ids({ { BOS, -1 } })) return r end,
        'Transformer: tgt_in [1,2] holds id -1 at [1,2], outside the vocabulary 0..11' },
      { function() local r = m(ids({ { 4, 5 } }), ids({ { BOS }, { BOS } })) return r end,
        'Transformer: src [1,2] and tgt_in [2,1] hold different numbers of sentences' },
      { function() local r = m:translate(ids({ { 4, 13 } })) return r end,
        'translate: src [1,2] holds id 13 at [1,2], outside the vocabulary 0..11' },
      { function() local r = m:greedy(ids({ { 4, 5 } }), { src_mask = pn.ones({ 1, 1, 1, 3 }) }) return r end,
        'greedy: src_mask [1,1,1,3] must be (B, 1, 1, S) = (1, 1, 1, 2) for the source' },
      { function() local r = m:translate(ids({ { 4, 5 } }), { beam = 0 }) return r end,
        'translate: beam must be >= 1, got 0' },
      { function() local r = m:encode(ids({ { 4, 5 } }), pn.ones({ 2, 1, 1, 2 })) return r end,
        'Transformer:encode: src_mask [2,1,1,2] must be (B, 1, 1, S) = (1, 1, 1, 2) for the source' },
      { function() local r = m:decode(ids({ { BOS } }), pn.ones({ 1, 2, 7 })) return r end,
        'Transformer:decode: memory must be the encoder output (B, S, 16), got [1,2,7]' },
      { function() local r = m:attention_maps(ids({ { 4, 5 } }), ids({ { BOS }, { BOS } })) return r end,
        'Transformer:attention_maps: src [1,2] and tgt_in [2,1] hold different numbers of sentences' },
      { function() local r = pn.nn.Transformer({ vocab = 10, score = 'cone' }) return r end,
        "Transformer: unknown score 'cone' (valid: dot, laplacian, umbral, penumbral, hyperbolic, gat)" },
      { function() local r = pn.nn.MultiheadAttention(8, 2, { score = 'cone' }) return r end,
        "MultiheadAttention: unknown score 'cone' (valid: dot," },
      { function() local r = pn.nn.GATConv(4, 4, { score = 'cone' }) return r end,
        "GATConv: unknown score 'cone' (valid: dot," },
      { function() local r = pn.nn.RecursiveTransformer({ in_dim = 2, out_dim = 2, score = 'cone' }) return r end,
        "RecursiveTransformer: unknown score 'cone' (valid: dot," },
    }
    for i, case in ipairs(bad) do
      ok, e = pcall(case[1])
      assert.is_false(ok, i)
      e = tostring(e)
      assert.truthy(e:find(here .. case[2]:gsub('%p', '%%%0')), e)
    end
    -- precision: one of its values; tensor cores exist on CUDA only, so on the CPU the attention says so
    ok, e = pcall(pn.nn.Transformer, { vocab = 10, d_model = 8, heads = 2, precision = 'tf32' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("precision must be one of native, bf16, f16, got 'tf32'", 1, true), tostring(e))
    local b = pn.nn.Transformer({ vocab = 10, d_model = 8, heads = 2, ff = 8, enc_layers = 1, dec_layers = 1,
      precision = 'bf16' })
    ok, e = pcall(function() return b(ids({ { 4, 5 } }), ids({ { BOS } })) end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("precision = 'bf16' runs on CUDA tensor cores", 1, true), tostring(e))
  end)
end)

-- A tiny model trained on a synthetic task must solve it: copy or reverse sequences of 3–6
-- words from a vocabulary of 8 words, greedy decoding, every held-out sequence exactly right
-- within 1500 steps of 32 examples (checked every 100 steps; it stops when all are right).
local function learns(task, score)
  pn.manual_seed(1)
  local rng = require('penumbra.rng')(task == 'copy' and 1 or 2)
  local function example()
    local n = 3 + rng.int(4)
    local s = {}
    for i = 1, n do s[i] = 4 + rng.int(8) end
    local t = {}
    for i = 1, n do t[i] = task == 'copy' and s[i] or s[n + 1 - i] end
    return s, t
  end
  local function batch(k)
    local S, TI, TO = {}, {}, {}
    for b = 1, k do
      local s, t = example()
      local src, ti, to = {}, { BOS }, {}
      for i = 1, 6 do src[i] = s[i] or PAD end
      for i = 1, 6 do ti[i + 1] = t[i] or PAD end
      for i = 1, 7 do to[i] = t[i] or (i == #t + 1 and EOS or PAD) end
      S[b], TI[b], TO[b] = src, ti, to
    end
    return ids(S), ids(TI), ids(TO)
  end
  local m = pn.nn.Transformer { vocab = 12, d_model = 32, heads = 2, ff = 64, enc_layers = 1, dec_layers = 1,
                                dropout = 0, score = score }
  local opt = pn.optim.Adam(m, { lr = 0.004, betas = { 0.9, 0.98 } })
  local sched = pn.optim.schedules.inverse_sqrt { warmup = 100 }
  local hs, _, hto = batch(64) -- held out
  local function right()
    local out = m:greedy(hs)
    local n = 0
    for b = 1, 64 do
      local want = {}
      for i = 1, 7 do
        local w = hto:get(b, i)
        if w == EOS then break end
        want[#want + 1] = w
      end
      if table.concat(want, ' ') == table.concat(out[b], ' ') then n = n + 1 end
    end
    return n
  end
  local n = 0
  for step = 1, 1500 do
    local s, ti, to = batch(32)
    local loss = pn.cross_entropy(m(s, ti, mask_of(s)):view(-1, 12), to:view(-1), { ignore_index = PAD })
    loss:backward()
    pn.optim.clip_grad_norm(m, 1)
    opt.lr = 0.004 * sched(step)
    opt:step()
    opt:zero_grad()
    if step % 100 == 0 then
      n = right()
      if n == 64 then break end
    end
  end
  return n
end

describe('nn.Transformer training', function()
  it('learns to copy short sequences (64 of 64 held-out sequences exactly)', function()
    assert.are.equal(64, learns('copy', 'dot'))
  end)
  it('learns to reverse short sequences with umbral attention (64 of 64)', function()
    assert.are.equal(64, learns('reverse', 'umbral'))
  end)
end)
