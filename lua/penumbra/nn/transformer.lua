-- penumbra.nn.transformer — the encoder–decoder Transformer for translation (Vaswani et al.;
-- fairseq's transformer_iwslt_de_en layout), with any registry score in its attention.
--
-- Transformer{vocab=, d_model=256, heads=4, ff=1024, enc_layers=3, dec_layers=3, dropout=0.1,
--   act_dropout=0, prenorm=false, score='dot', map=nil, qk_dim=nil, self_attn='softmax',
--   max_positions=1024, pad=0, bos=2, eos=3, <score param>=, learn_<param>=}
--   vocab        one vocabulary shared by source and target (a joint BPE model); the embedding
--                is tied: the same matrix embeds both sides and projects the decoder's output
--                to logits (x·Eᵀ)
--   prenorm      false: post-norm (LayerNorm after each residual add, fairseq's default);
--                true: pre-norm (LayerNorm before each sub-layer, one more at each stack's end)
--   score, map   the attention score of every attention (encoder self, decoder self, cross)
--                and the map applied to q and k (nil: the score's registry map — umbral ψ,
--                penumbral ξ, hyperbolic pseudo-polar; 'exp0', 'psi', 'xi', 'pseudopolar'
--                or 'none' to override: Coneheads Table 2)
--   qk_dim       the per-head width of q and k (default d_model/heads); values keep
--                d_model/heads. Coneheads Fig. 4 changes only this
--   self_attn    the decoder's self-attention: 'softmax' (the score above), 'cosine'
--                (Cottention) or 'power' (symmetric power attention, p = 2, gated, RoPE) —
--                the linear family, causal, generated through its recurrent state
-- Embeddings are scaled by √d_model and drawn from N(0, d_model^−1/2) (fairseq); positions are
-- sinusoidal (sin on even, cos on odd coordinates). Dropout (`dropout`) on the embeddings and
-- on every sub-layer's output before its residual add; `act_dropout` after the FFN's ReLU.
--
-- forward(src (B, S) i64, tgt_in (B, T) i64, src_mask (B, 1, 1, S) u8) → logits (B, T, vocab)
-- encode(src, src_mask) → memory (B, S, d);  decode(tgt_in, memory, src_mask) → logits
-- loss(src, tgt_in, tgt_out, src_mask [, {label_smoothing=, reduction='sum'|'mean'}]) → the
--   training loss over tgt_out's non-pad positions, their logits only (see TF:loss)
-- attention_maps(src, tgt_in [, src_mask]) → the last encoder layer's self-attention weights
--   (B, H, S, S) (nil without encoder layers) and the last decoder layer's cross-attention
--   weights (B, H, T, S)
-- Incremental decoding (nn/translate.lua drives it; no autograd):
--   st = model:begin_decode(memory, src_mask [, group])  -- cross-attention keys/values computed once
--   logits = model:decode_step(st, tokens (R) i64)  → (R, vocab), position st.t (from 0)
--   model:reorder(st, idx (R') i64 [, mem_idx])    -- keep / repeat rows (beams, finished sentences)
-- With group g (beam search: the beam), the decoding rows come in runs of g per memory row: row r
-- reads memory row ⌊r / g⌋, and the cross-attention takes a run's g rows as g queries against
-- its one memory row (the memory is neither copied per beam nor read once per beam). reorder's
-- idx keeps and repeats decoding rows (caches, recurrent states); mem_idx the memory rows (and
-- their mask) when the sentences change, false to keep the memory as it is; omitted: idx with
-- g = 1 (rows are memory rows), the memory as it is with g > 1.
-- softmax self-attention caches each layer's mapped keys and values; the linear family keeps
-- its recurrent state (pn.cosine_state / pn.power_state) and reorders it in place.
return function(nn, pn)
  local options = require 'penumbra.options'
  local score_params = require 'penumbra.nn.score_params'
  local raise = require('penumbra_ffi').raise
  local ffi = require 'ffi'
  local count = { 'integer', min = 1 }
  local rate = { 'number', min = 0, below = 1 }
  local TF_OPTS = { vocab = count, d_model = count, heads = count, ff = count, enc_layers = { 'integer', min = 0 },
                    dec_layers = count, dropout = rate, act_dropout = rate, prenorm = 'boolean', score = 'string',
                    map = { 'string', one_of = { 'none', 'psi', 'xi', 'pseudopolar', 'exp0' } }, qk_dim = count,
                    self_attn = { 'string', one_of = { 'softmax', 'cosine', 'power' } }, max_positions = count,
                    pad = { 'integer', min = 0 }, bos = { 'integer', min = 0 }, eos = { 'integer', min = 0 },
                    model = 'string', normalize = 'string', squared = 'boolean',
                    precision = { 'string', one_of = { 'native', 'bf16', 'f16' } } }

  -- (n, d) sinusoidal table: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(…)
  local function sinusoids(n, d)
    local buf = ffi.new('float[?]', n * d)
    for p = 0, n - 1 do
      for i = 0, d - 1 do
        local e = 2 * math.floor(i / 2) / d
        local a = p / 10000 ^ e
        buf[p * d + i] = (i % 2 == 0) and math.sin(a) or math.cos(a)
      end
    end
    return pn.from_buffer(buf, { n, d }, 'f32')
  end

  -- ---- one layer of each stack -------------------------------------------------------------
  local FFN = nn.class('FeedForward')
  function FFN:init(d, ff, act_dropout)
    self:add('fc1', nn.Linear(d, ff))
    self:add('fc2', nn.Linear(ff, d))
    self.act_dropout = act_dropout
  end
  function FFN:forward(x)
    local h = self.fc1(x):relu()
    if self.act_dropout > 0 then h = pn.dropout(h, self.act_dropout, self.training) end
    return self.fc2(h)
  end

  -- f over the positions `rows` (an i64 tensor of 0-based indices into h's B·N positions) only,
  -- zeros at the others; nil rows: f(h). The position-wise FFN skips the padding positions that
  -- nothing else reads (see read_rows): the same values and gradients at every other position.
  local function on_rows(f, h, rows)
    if not rows then return f(h) end
    local s = h:shape()
    local flat = h:reshape(-1, s[#s])
    local out = f(flat:index_select(1, rows))
    return pn.zeros({ flat:shape()[1], out:shape()[2] }, { dtype = out:dtype(), device = out:device() })
      :index_add(1, rows, out):view(s)
  end

  -- The positions of a (B, N) batch whose values another position can read, as an index tensor
  -- on `dev` (nil when that is all of them). Encoder: those the key-padding mask (B or 1, 1, 1, N)
  -- keeps — a masked position is a key to no one, so what it holds reaches only its own
  -- output, which no one reads either. Decoder (causal): each row's positions up to its last
  -- non-pad id — a later position is read by no earlier one. Padding is 10–15 % of a
  -- token-count batch's positions, and the FFN is about half of a step's GEMM work.
  -- the 0-based positions b·N + j of a (B, N) batch where keep(b, j), in order
  local function positions(B, N, keep)
    local rows = {}
    for b = 0, B - 1 do
      for j = 0, N - 1 do
        if keep(b, j) then rows[#rows + 1] = b * N + j end
      end
    end
    return rows
  end
  local function read_rows(B, N, keep, dev)
    local rows = positions(B, N, keep)
    if #rows == 0 or #rows == B * N then return nil end
    return pn.tensor(rows, { dtype = 'i64', device = dev })
  end
  local function mask_rows(mask, B, N, dev)
    if not mask then return nil end
    local m = mask:to('u8'):to('cpu'):contiguous()
    local p, per = ffi.cast('const uint8_t *', m:data_ptr()), m:shape()[1] == 1 and 0 or N
    return read_rows(B, N, function(b, j) return p[b * per + j] ~= 0 end, dev)
  end
  local function causal_rows(ids, pad, dev)
    local t = ids:to('i64'):to('cpu'):contiguous()
    local B, N = t:shape()[1], t:shape()[2]
    local p, last = ffi.cast('const int64_t *', t:data_ptr()), {}
    for b = 0, B - 1 do
      last[b] = -1
      for j = N - 1, 0, -1 do
        if p[b * N + j] ~= pad then last[b] = j break end
      end
    end
    return read_rows(B, N, function(b, j) return j <= last[b] end, dev)
  end

  -- residual sub-layer: post-norm LN(x + drop(f(x))), pre-norm x + drop(f(LN(x)))
  local function sublayer(self, x, norm, f)
    if self.prenorm then return x + pn.dropout(f(norm(x)), self.p, self.training) end
    return norm(x + pn.dropout(f(x), self.p, self.training))
  end

  local EncLayer = nn.class('EncoderLayer')
  function EncLayer:init(o, attn_opts)
    self.prenorm, self.p = o.prenorm, o.dropout
    self:add('self_attn', nn.MultiheadAttention(o.d_model, o.heads, attn_opts(false)))
    self:add('norm1', nn.LayerNorm(o.d_model))
    self:add('ffn', FFN(o.d_model, o.ff, o.act_dropout))
    self:add('norm2', nn.LayerNorm(o.d_model))
  end
  -- self.seen, when a table: the input of the attention is kept there (TF:attention_maps)
  -- rows: the positions others read (read_rows), or nil for all
  function EncLayer:forward(x, mask, rows)
    x = sublayer(self, x, self.norm1, function(h)
      if self.seen then self.seen.x = h end
      return self.self_attn(h, h, { mask = mask })
    end)
    return sublayer(self, x, self.norm2, function(h) return on_rows(self.ffn, h, rows) end)
  end

  local DecLayer = nn.class('DecoderLayer')
  function DecLayer:init(o, attn_opts)
    self.prenorm, self.p = o.prenorm, o.dropout
    self.linear = o.self_attn ~= 'softmax'
    if o.self_attn == 'cosine' then
      self:add('self_attn', nn.CosineAttention(o.d_model, o.heads, { causal = true }))
    elseif o.self_attn == 'power' then
      self:add('self_attn', nn.PowerAttention(o.d_model, o.heads, { causal = true }))
    else
      self:add('self_attn', nn.MultiheadAttention(o.d_model, o.heads, attn_opts(true)))
    end
    self:add('norm1', nn.LayerNorm(o.d_model))
    self:add('cross_attn', nn.MultiheadAttention(o.d_model, o.heads, attn_opts(false)))
    self:add('norm2', nn.LayerNorm(o.d_model))
    self:add('ffn', FFN(o.d_model, o.ff, o.act_dropout))
    self:add('norm3', nn.LayerNorm(o.d_model))
  end
  -- y (B, T, d); mem_kv = {k, v} of the memory for the cross attention
  function DecLayer:forward(y, mem_kv, mask, rows)
    y = sublayer(self, y, self.norm1, function(h) return self.self_attn(h, h) end)
    y = sublayer(self, y, self.norm2, function(h)
      if self.seen then self.seen.x = h end
      return self.cross_attn:attend(h, mem_kv[1], mem_kv[2], { mask = mask })
    end)
    return sublayer(self, y, self.norm3, function(h) return on_rows(self.ffn, h, rows) end)
  end
  -- one position: y (R, 1, d); cache = this layer's decoding state; g rows per memory row
  function DecLayer:step(y, cache, mask, g)
    y = sublayer(self, y, self.norm1, function(h)
      if self.linear then
        local s = h:shape()
        return self.self_attn:step(h:view(s[1], s[3])):view(s[1], 1, s[3])
      end
      local k, v = self.self_attn:keys_values(h)
      cache.k = cache.k and pn.cat({ cache.k, k }, 3) or k
      cache.v = cache.v and pn.cat({ cache.v, v }, 3) or v
      return self.self_attn:attend(h, cache.k, cache.v)
    end)
    y = sublayer(self, y, self.norm2, function(h)
      local s = h:shape() -- a run of g rows: g queries of one memory row (g = 1: h as it is)
      return self.cross_attn:attend(h:view(s[1] / g, g, s[3]), cache.mem_k, cache.mem_v, { mask = mask })
        :view(s[1], 1, s[3])
    end)
    return sublayer(self, y, self.norm3, function(h) return self.ffn(h) end)
  end

  -- ---- the model ------------------------------------------------------------------------------
  local TF = nn.class('Transformer')
  nn.Transformer = TF

  function TF:init(o)
    local score, desc = score_params.score('Transformer', o, 'dot', 3, pn)
    if desc.graph_only then error("Transformer: score '" .. score .. "' works on graphs only", 3) end
    o = options.check('Transformer', o, options.score_params(options.with(TF_OPTS), desc), 3)
    if not o.vocab then error('Transformer: vocab (the shared vocabulary size) is required', 3) end
    local c = {}
    for k, v in pairs(o) do c[k] = v end
    c.d_model, c.heads, c.ff = o.d_model or 256, o.heads or 4, o.ff or 1024
    c.enc_layers, c.dec_layers = o.enc_layers or 3, o.dec_layers or 3
    c.dropout, c.act_dropout = o.dropout or 0.1, o.act_dropout or 0
    c.prenorm, c.score, c.self_attn = o.prenorm == true, score, o.self_attn or 'softmax'
    c.max_positions = o.max_positions or 1024
    c.pad, c.bos, c.eos = o.pad or 0, o.bos or 2, o.eos or 3
    for _, k in ipairs({ 'pad', 'bos', 'eos' }) do
      if c[k] >= c.vocab then error(string.format('Transformer: %s id %d is outside the vocabulary of %d', k, c[k], c.vocab), 3) end
    end
    -- decoding starts at bos, stops at eos and never emits pad: one id for two of them breaks that
    if c.pad == c.bos or c.pad == c.eos or c.bos == c.eos then
      error(string.format('Transformer: pad, bos and eos must be three different ids, got %d, %d, %d', c.pad, c.bos, c.eos), 3)
    end
    if c.d_model % c.heads ~= 0 then
      error('Transformer: d_model ' .. c.d_model .. ' is not divisible by heads ' .. c.heads, 3)
    end
    self.o, self.d = c, c.d_model
    local function attn_opts(causal)
      local a = { score = score, map = o.map, qk_dim = o.qk_dim, causal = causal or nil, model = o.model,
                  normalize = o.normalize, squared = o.squared, precision = o.precision }
      for _, p in ipairs(desc.params) do
        a[p.name] = o[p.name]
        a['learn_' .. p.name] = o['learn_' .. p.name]
      end
      return a
    end
    self:add('embed', nn.Embedding(c.vocab, c.d_model, { std = c.d_model ^ -0.5 }))
    pn.no_grad(function() self.embed.weight:narrow(1, c.pad + 1, 1):zero_() end)
    self.pe = sinusoids(c.max_positions, c.d_model)
    self.enc, self.dec = {}, {}
    for i = 1, c.enc_layers do self.enc[i] = self:add('enc' .. i, EncLayer(c, attn_opts)) end
    for i = 1, c.dec_layers do self.dec[i] = self:add('dec' .. i, DecLayer(c, attn_opts)) end
    if c.prenorm then
      if c.enc_layers > 0 then self:add('enc_norm', nn.LayerNorm(c.d_model)) end
      self:add('dec_norm', nn.LayerNorm(c.d_model))
    end
  end

  local function shape_str(t) return '[' .. table.concat(t:shape(), ',') .. ']' end

  -- tokens (B, N) at positions first … first+N−1 → scaled embeddings + positions, dropped out
  function TF:embed_tokens(tokens, first)
    local n = tokens:shape()[2]
    if first + n > self.o.max_positions then -- the entry points check their inputs; here: decode_step
      error(string.format('Transformer: a sequence of %d positions is longer than max_positions %d', first + n,
        self.o.max_positions), 0)
    end
    local e = self.embed(tokens)
    -- the position table follows the embeddings after model:to('f64') or model:to('cuda')
    if self.pe:dtype() ~= e:dtype() then self.pe = self.pe:to(e:dtype()) end
    if self.pe:device() ~= e:device() then self.pe = self.pe:to(e:device()) end
    local x = e * math.sqrt(self.d) + self.pe:narrow(1, first + 1, n)
    return pn.dropout(x, self.o.dropout, self.training)
  end

  -- The inputs' checks, one per kind, for the public entry points (forward, encode, decode,
  -- attention_maps, translate): raise names the user's line, not one inside the model. Token
  -- ids are checked against the vocabulary here because the embedding's own message names
  -- neither the model nor the argument.
  function TF:check_tokens(who, what, t)
    if not pn.is_tensor(t) then raise(who .. ': ' .. what .. ' must be a tensor, got ' .. type(t)) end
    if t:dim() ~= 2 or (t:dtype() ~= 'i64' and t:dtype() ~= 'i32') then
      raise(string.format('%s: %s must be a (B, N) i32 or i64 tensor of token ids, got %s %s', who, what, t:dtype(),
        shape_str(t)))
    end
    if t:shape()[2] > self.o.max_positions then
      raise(string.format('%s: %s %s is longer than max_positions %d', who, what, shape_str(t), self.o.max_positions))
    end
    if t:numel() == 0 then return end
    local V = self.o.vocab
    local lo, hi = t:min():item(), t:max():item()
    if lo >= 0 and hi < V then return end
    local bad = lo < 0 and lo or hi
    local n = t:shape()[2]
    local flat = t:to('i64'):to('cpu'):contiguous():view(t:numel())
    local at = flat:eq(bad):to('u8'):argmax():item() -- 0-based, row-major
    raise(string.format('%s: %s %s holds id %d at [%d,%d], outside the vocabulary 0..%d', who, what, shape_str(t), bad,
      math.floor(at / n) + 1, at % n + 1, V - 1))
  end

  -- a key-padding mask over the source: (B or 1, 1, 1, S) for `batch` sentences of S positions
  function TF.check_mask(who, mask, batch, S)
    if mask == nil then return end
    if not pn.is_tensor(mask) then raise(who .. ': src_mask must be a tensor, got ' .. type(mask)) end
    local s = mask:shape()
    if #s ~= 4 or (s[1] ~= batch and s[1] ~= 1) or s[2] ~= 1 or s[3] ~= 1 or s[4] ~= S then
      raise(string.format('%s: src_mask %s must be (B, 1, 1, S) = (%d, 1, 1, %d) for the source', who, shape_str(mask),
        batch, S))
    end
  end
  local check_mask = TF.check_mask

  local function same_batch(who, an, a, bn, b)
    if a:shape()[1] ~= b:shape()[1] then
      raise(string.format('%s: %s %s and %s %s hold different numbers of sentences', who, an, shape_str(a), bn,
        shape_str(b)))
    end
  end

  local function encode(self, src, src_mask)
    local x = self:embed_tokens(src, 0)
    local rows = #self.enc > 0 and mask_rows(src_mask, src:shape()[1], src:shape()[2], x:device()) or nil
    for _, l in ipairs(self.enc) do x = l(x, src_mask, rows) end
    if self.enc_norm then x = self.enc_norm(x) end
    return x
  end

  -- decoder states (B, T, d) → logits (B, T, vocab) through the tied embedding
  function TF:logits(y)
    if self.dec_norm then y = self.dec_norm(y) end
    return y:matmul(self.embed.weight:transpose(1, 2))
  end

  -- the decoder's states (B, T, d), before the output norm and the logits
  local function decode_states(self, tgt_in, memory, src_mask)
    local y = self:embed_tokens(tgt_in, 0)
    local rows = causal_rows(tgt_in, self.o.pad, y:device())
    for _, l in ipairs(self.dec) do
      local k, v = l.cross_attn:keys_values(memory)
      y = l(y, { k, v }, src_mask, rows)
    end
    return y
  end

  local function decode(self, tgt_in, memory, src_mask)
    return self:logits(decode_states(self, tgt_in, memory, src_mask))
  end

  -- src (B, S) ids, src_mask (B, 1, 1, S) → the encoder's memory (B, S, d)
  function TF:encode(src, src_mask)
    self:check_tokens('Transformer:encode', 'src', src)
    check_mask('Transformer:encode', src_mask, src:shape()[1], src:shape()[2])
    return encode(self, src, src_mask)
  end

  -- tgt_in (B, T) ids, memory (B, S, d) from encode → logits (B, T, vocab)
  function TF:decode(tgt_in, memory, src_mask)
    local who = 'Transformer:decode'
    self:check_tokens(who, 'tgt_in', tgt_in)
    local ms = pn.is_tensor(memory) and memory:shape()
    if not ms or #ms ~= 3 or ms[3] ~= self.d then
      raise(string.format('%s: memory must be the encoder output (B, S, %d), got %s', who, self.d,
        ms and shape_str(memory) or type(memory)))
    end
    same_batch(who, 'tgt_in', tgt_in, 'memory', memory)
    check_mask(who, src_mask, ms[1], ms[2])
    return decode(self, tgt_in, memory, src_mask)
  end

  -- src (B, S), tgt_in (B, T) ids, src_mask (B, 1, 1, S) → logits (B, T, vocab) (teacher forcing)
  function TF:forward(src, tgt_in, src_mask)
    self:check_tokens('Transformer', 'src', src)
    self:check_tokens('Transformer', 'tgt_in', tgt_in)
    same_batch('Transformer', 'src', src, 'tgt_in', tgt_in)
    check_mask('Transformer', src_mask, src:shape()[1], src:shape()[2])
    return decode(self, tgt_in, encode(self, src, src_mask), src_mask)
  end

  -- The training loss of a batch: label-smoothed cross entropy over the positions of tgt_out
  -- that are not padding, with the logits computed for those positions only. It equals
  -- pn.cross_entropy(model(src, tgt_in, src_mask):view(-1, V), tgt_out:view(-1),
  -- {ignore_index = pad, …}) — an ignored row adds nothing to the loss or to any gradient —
  -- without the padding rows' share of the output projection, the softmax and their gradients
  -- (13.6 % of the rows of Multi30k's 4096-token batches; that block is a fifth of a step).
  -- o: label_smoothing (default 0), reduction 'sum' (default) or 'mean' (over the non-pad
  -- positions). A batch with no target position gives 0.
  local LOSS_OPTS = { label_smoothing = { 'number', min = 0, below = 1 },
                      reduction = { 'string', one_of = { 'sum', 'mean' } } }
  function TF:loss(src, tgt_in, tgt_out, src_mask, o)
    local who = 'Transformer:loss'
    o = options.check(who, o, LOSS_OPTS, 3)
    self:check_tokens(who, 'src', src)
    self:check_tokens(who, 'tgt_in', tgt_in)
    self:check_tokens(who, 'tgt_out', tgt_out)
    same_batch(who, 'src', src, 'tgt_in', tgt_in)
    local ti, to = tgt_in:shape(), tgt_out:shape()
    if ti[1] ~= to[1] or ti[2] ~= to[2] then
      raise(string.format('%s: tgt_out %s must have the shape of tgt_in %s (one target per input position)', who,
        shape_str(tgt_out), shape_str(tgt_in)))
    end
    check_mask(who, src_mask, src:shape()[1], src:shape()[2])
    -- the non-pad positions of tgt_out, row-major (0-based, as index tensors hold them)
    local t = tgt_out:to('i64'):to('cpu'):contiguous()
    local ids, pad = ffi.cast('const int64_t *', t:data_ptr()), self.o.pad
    local rows = positions(to[1], to[2], function(b, j) return ids[b * to[2] + j] ~= pad end)
    local y = decode_states(self, tgt_in, encode(self, src, src_mask), src_mask)
    if #rows == 0 then return (y:sum() * 0) end -- keeps the graph (and NaN) of the states
    local idx = pn.tensor(rows, { dtype = 'i64', device = y:device() })
    local logits = self:logits(y:reshape(-1, self.d):index_select(1, idx))
    local target = tgt_out:reshape(-1):index_select(1, idx)
    return pn.cross_entropy(logits, target, { label_smoothing = o.label_smoothing or 0,
                                              reduction = o.reduction or 'sum' })
  end

  -- The weights (B, H, ·, S) of the last encoder layer's self-attention and of the last decoder
  -- layer's cross-attention when the model reads src and tgt_in (teacher forcing), without
  -- dropout or autograd: the heatmaps of a run file
  function TF:attention_maps(src, tgt_in, src_mask)
    local who = 'Transformer:attention_maps'
    self:check_tokens(who, 'src', src)
    self:check_tokens(who, 'tgt_in', tgt_in)
    same_batch(who, 'src', src, 'tgt_in', tgt_in)
    check_mask(who, src_mask, src:shape()[1], src:shape()[2])
    return pn.no_grad(function()
      local was = self.training
      self:eval()
      local last_enc, last_dec = self.enc[#self.enc], self.dec[#self.dec]
      local se, sd = {}, {}
      if last_enc then last_enc.seen = se end
      last_dec.seen = sd
      local ok, mem = pcall(function()
        local m = encode(self, src, src_mask)
        decode(self, tgt_in, m, src_mask)
        return m
      end)
      if last_enc then last_enc.seen = nil end
      last_dec.seen = nil
      self:train(was)
      if not ok then error(mem, 0) end
      local enc_w = last_enc and last_enc.self_attn:weights(se.x, se.x, { mask = src_mask })
      return enc_w, last_dec.cross_attn:weights(sd.x, mem, { mask = src_mask })
    end)
  end

  -- ---- incremental decoding -------------------------------------------------------------------
  function TF:begin_decode(memory, src_mask, group)
    group = group or 1
    if type(group) ~= 'number' or group < 1 or group % 1 ~= 0 then
      error('begin_decode: group must be a whole number >= 1, got ' .. tostring(group), 2)
    end
    return pn.no_grad(function()
      local st = { t = 0, mask = src_mask, layers = {}, group = group }
      for i, l in ipairs(self.dec) do
        local k, v = l.cross_attn:keys_values(memory)
        st.layers[i] = { mem_k = k, mem_v = v }
        if l.linear then l.self_attn:reset_state() end
      end
      return st
    end)
  end

  function TF:decode_step(st, tokens)
    return pn.no_grad(function()
      local b = tokens:numel()
      local m = st.layers[1] and st.layers[1].mem_k
      if m and b ~= m:shape()[1] * st.group then
        error(string.format('decode_step: %d tokens for %d memory rows of %d decoding rows each', b, m:shape()[1],
          st.group), 3)
      end
      local y = self:embed_tokens(tokens:reshape(b, 1), st.t)
      for i, l in ipairs(self.dec) do y = l:step(y, st.layers[i], st.mask, st.group) end
      st.t = st.t + 1
      return self:logits(y):view(b, self.o.vocab)
    end)
  end

  -- keep rows idx (i64, 0-based, repeats allowed) of every cached tensor and recurrent state, and
  -- memory rows mem_idx of the memory's keys, values and mask (see begin_decode above)
  function TF:reorder(st, idx, mem_idx)
    if mem_idx == nil and st.group == 1 then mem_idx = idx end
    pn.no_grad(function()
      if st.mask and mem_idx then st.mask = st.mask:index_select(1, mem_idx) end
      for i, l in ipairs(self.dec) do
        local c = st.layers[i]
        for _, k in ipairs({ 'k', 'v' }) do
          if c[k] then c[k] = c[k]:index_select(1, idx) end
        end
        if mem_idx then
          for _, k in ipairs({ 'mem_k', 'mem_v' }) do
            if c[k] then c[k] = c[k]:index_select(1, mem_idx) end
          end
        end
        if l.linear then l.self_attn:reorder_state(idx) end
      end
    end)
  end

  function TF:extra_repr()
    local c = self.o
    return string.format('vocab=%d, d=%d, heads=%d, ff=%d, layers=%d+%d, score=%s%s, %s-norm', c.vocab, c.d_model,
      c.heads, c.ff, c.enc_layers, c.dec_layers, c.score, c.self_attn ~= 'softmax' and (', decoder self: ' .. c.self_attn) or '',
      c.prenorm and 'pre' or 'post')
  end
end
