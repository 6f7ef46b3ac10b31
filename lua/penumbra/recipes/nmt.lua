-- penumbra.recipes.nmt — the shared recipe of experiments/nmt_*.lua: an encoder–decoder
-- Transformer (pn.nn.Transformer) trained on parallel text (Multi30k de→en by default;
-- IWSLT'14 from fairseq's prepared folder with dataset=iwslt14) with a joint sentencepiece
-- BPE vocabulary, label-smoothed cross entropy, Adam (0.9, 0.98) with inverse-sqrt warm-up,
-- gradient clipping; validation BLEU each epoch (greedy by default, `val_beam`), test BLEU
-- with beam 5 at the end (sacreBLEU's corpus BLEU, cased, on the detokenised output against
-- the raw reference lines), and the same with the average of the last `average` epochs'
-- parameters (checkpoint averaging).
--
-- Logged in the run file: loss, tokens/s, val loss/BLEU per epoch; /text/val_samples (a few
-- validation translations, refreshed each epoch), /text/test_hyps (every test translation);
-- /attention/val<i>_enc (the last encoder layer's self-attention) and /attention/val<i>_cross
-- (the last decoder layer's cross-attention) of a few validation sentences, (H, Nq, Nk) with
-- their subword pieces as labels — `./bench plot heatmap run.h5 --tag val1_cross`.
--
--   return require('penumbra.recipes.nmt'){ score = 'umbral' }          -- experiments/nmt_multi30k_umbral.lua
--   ./bench experiments/nmt_multi30k_dot.lua preset=small              -- a quick look (minutes)
--
-- train_limit = N / eval_limit = N use only the first N training / validation and test pairs
-- (0: all): for specs and dry runs; the run says so, and its scores are not comparable.
--
-- Presets (preset=base | small) set the defaults of the model and schedule keys; any key given
-- on the command line wins. base: 3 + 3 layers, d = 256, 4 heads, FFN 1024, vocab 8000.
-- small: 2 + 2 layers, d = 128, 4 heads, FFN 256, vocab 4000, 2 epochs.
-- device=cuda precision=bf16 (or f16): the softmax attentions' products on tensor cores with
-- inputs rounded to bfloat16 / half (pn.attention's `precision`); everything else in f32.
local pn = require 'penumbra'
local ffi = require 'ffi'
local tr = require 'penumbra.data.translation'
local stats = require 'penumbra.stats'

local R = {}

R.PRESETS = {
  base = { d_model = 256, heads = 4, ff = 1024, enc_layers = 3, dec_layers = 3, vocab = 8000, epochs = 20,
           max_tokens = 4096, warmup = 500, lr = 0.001, dropout = 0.2 },
  small = { d_model = 128, heads = 4, ff = 256, enc_layers = 2, dec_layers = 2, vocab = 4000, epochs = 2,
            max_tokens = 4096, warmup = 200, lr = 0.002, dropout = 0.1 },
}

function R.model_opts(cfg, vocab)
  local o = { vocab = vocab, d_model = cfg.d_model, heads = cfg.heads, ff = cfg.ff, enc_layers = cfg.enc_layers,
              dec_layers = cfg.dec_layers, dropout = cfg.dropout, act_dropout = cfg.act_dropout,
              prenorm = cfg.prenorm, score = cfg.score, self_attn = cfg.self_attn,
              map = cfg.map ~= 'default' and cfg.map or nil, qk_dim = cfg.qk_dim > 0 and cfg.qk_dim or nil,
              model = cfg.hyper_model ~= 'default' and cfg.hyper_model or nil, pad = 0, bos = 2, eos = 3,
              max_positions = cfg.max_len + 2,
              precision = cfg.precision ~= 'native' and cfg.precision or nil }
  local desc = pn.attention_variant(cfg.score)
  if desc.params.r and cfg.r > 0 then o.r = cfg.r end
  return o
end

function R.model(cfg, dims) return pn.nn.Transformer(R.model_opts(cfg, dims.vocab)) end

function R.dims(run) return { vocab = run:read('params/embed/weight'):shape()[1] } end

function R.describe(cfg, dims)
  return string.format('Transformer(vocab %d, score=%s)', dims.vocab, tostring(cfg.score))
end

-- the tokenizer of a config: trained on the training split's two sides once, then cached
function R.tokenizer(cfg, d)
  return pn.text.bpe { train = { d.files.train.src, d.files.train.tgt }, vocab = cfg.vocab }
end

local function fmt_time(s)
  if s >= 3600 then return string.format('%dh%02dm', math.floor(s / 3600), math.floor(s % 3600 / 60)) end
  if s >= 60 then return string.format('%dm%02ds', math.floor(s / 60), math.floor(s % 60)) end
  return string.format('%.0fs', s)
end

local function say(cfg, fmt, ...)
  if not cfg.quiet then io.stderr:write(string.format(fmt, ...) .. '\n') end
end

-- a batch on the run's device (device=cuda: the model is there too)
local function on_device(b, cfg)
  if cfg.device == 'cpu' then return b end
  return pn.to_device(b, cfg.device)
end

-- hypotheses of every sentence of an encoded split (in split order), detokenised
local function translate_split(state, cfg, enc, beam)
  local model, tok = state.model, state.tok
  local hyps = {}
  local bs = tr.batches(enc, { max_tokens = cfg.eval_tokens, shuffle = false })
  for _, b in ipairs(bs) do
    b = on_device(b, cfg)
    local out
    if beam == 1 then out = model:greedy(b.src, { src_mask = b.src_mask })
    else out = model:translate(b.src, { beam = beam, lenpen = cfg.lenpen, src_mask = b.src_mask }) end
    for r, ids in ipairs(out) do hyps[b.index[r]] = tok:decode(ids) end
  end
  return hyps
end

-- refs: the raw reference lines of the split; hyps[i] for i in 1..n (an empty string where a
-- sentence had no translation, which cannot happen: every source line is kept in eval mode)
local function score(hyps, refs)
  local h = {}
  for i = 1, #refs do h[i] = hyps[i] or '' end
  local b = pn.text.bleu(h, refs)
  local c = pn.text.chrf(h, refs)
  return b, c.score
end

-- mean label-smoothed loss and NLL per target token with teacher forcing
local function eval_loss(state, cfg, enc)
  local model = state.model
  local sum, nll, n = 0, 0, 0
  pn.no_grad(function()
    for _, b in ipairs(tr.batches(enc, { max_tokens = cfg.eval_tokens, shuffle = false })) do
      b = on_device(b, cfg)
      local logits = model(b.src, b.tgt_in, b.src_mask)
      local V = logits:shape()[3]
      local flat, y = logits:view(-1, V), b.tgt_out:view(-1)
      sum = sum + pn.cross_entropy(flat, y, { label_smoothing = cfg.label_smoothing, ignore_index = 0,
                                              reduction = 'sum' }):item()
      nll = nll + pn.cross_entropy(flat, y, { ignore_index = 0, reduction = 'sum' }):item()
      n = n + b.ntokens
    end
  end)
  return sum / n, nll / n
end

-- parameters of the model as copies (for checkpoint averaging)
local function snapshot(model)
  local s = {}
  pn.no_grad(function()
    for _, np in ipairs(model:named_parameters()) do s[#s + 1] = np[2]:detach():clone() end
  end)
  return s
end

-- model parameters ← the mean of the snapshots (the last k epochs: checkpoint averaging)
function R.average_into(model, snaps)
  pn.no_grad(function()
    for i, np in ipairs(model:named_parameters()) do
      local acc = snaps[1][i]:to('f64')
      for j = 2, #snaps do acc = acc + snaps[j][i]:to('f64') end
      np[2]:copy_((acc / #snaps):to(np[2]:dtype()))
    end
  end)
end

-- attention maps of validation sentence i (1-based in the split): the last encoder layer's
-- self-attention over the source and the last decoder layer's cross-attention of the
-- reference target (teacher forcing), written with the pieces as labels
local function write_attention(state, cfg, run, i)
  local model, tok, enc = state.model, state.tok, state.val_enc
  local src_ids, tgt_ids = enc.src_ids[i], enc.tgt_ids[i]
  if not src_ids or #src_ids == 0 then return end
  local function labels(ids, first)
    local t = first and { first } or {}
    for _, id in ipairs(ids) do t[#t + 1] = tok:piece(id) end
    return table.concat(t, '\n')
  end
  local src = pn.tensor({ src_ids }, { dtype = 'i64' })
  local tin = { 2 }
  for _, id in ipairs(tgt_ids) do tin[#tin + 1] = id end
  local enc_w, cross_w = model:attention_maps(src, pn.tensor({ tin }, { dtype = 'i64' }))
  local function heads(w) local sh = w:shape() return w:view(sh[2], sh[3], sh[4]) end
  if enc_w then
    run:write('attention/val' .. i .. '_enc', heads(enc_w),
      { row_labels = labels(src_ids), col_labels = labels(src_ids), layer = #model.enc, sentence = enc.index[i] or i,
        kind = 'encoder self-attention (last layer)' })
  end
  run:write('attention/val' .. i .. '_cross', heads(cross_w),
    { row_labels = labels(tgt_ids, '<s>'), col_labels = labels(src_ids), layer = #model.dec,
      sentence = enc.index[i] or i, kind = 'decoder cross-attention (last layer), reference target' })
end

-- the first n pairs of an encoded split (n = 0: all of them); eval splits are in order
local function take(enc, n)
  if n == 0 or n >= enc.n then return enc end
  for _, k in ipairs({ 'src_ids', 'tgt_ids', 'index', 'line' }) do
    if enc[k] then for i = #enc[k], n + 1, -1 do enc[k][i] = nil end end
  end
  enc.n = n
  return enc
end

local function first(list, n)
  local t = {}
  for i = 1, n do t[i] = list[i] end
  return t
end

local function experiment(o)
  local args = rawget(_G, 'args') or {}
  local preset_name = args.preset or o.preset or 'base'
  local preset = R.PRESETS[preset_name]
  if not preset then error("nmt: unknown preset '" .. tostring(preset_name) .. "' (valid: base, small)", 0) end
  local config = {
    preset = o.preset or 'base', dataset = o.dataset or 'multi30k', score = o.score or 'dot',
    map = o.map or 'default', hyper_model = o.hyper_model or 'default', qk_dim = o.qk_dim or 0, r = 0,
    self_attn = o.self_attn or 'softmax', prenorm = false, act_dropout = 0, label_smoothing = 0.1,
    weight_decay = 0.0001, clip = 1.0, max_len = 256, eval_tokens = 6000, beam = 5, val_beam = 1, lenpen = 1.0,
    average = 5, samples = 5, attention_maps = 3, train_limit = 0, eval_limit = 0, seed = 0, threads = 0, quiet = false, patience = 100,
    device = 'cpu', precision = 'native', dtype = 'f32',
    -- subnormals flushed to zero on the CPU threads for the run (the runner's key; core/fpmode.c):
    -- the cones' ψ/ξ gradients are subnormal where a height is tiny, which slowed an umbral step
    -- by a quarter on an Intel Xeon
    flush_denormal = true,
  }
  for k, v in pairs(preset) do config[k] = v end
  local count = { 'integer', min = 1 }
  local def = {
    name = o.name or ('nmt_multi30k_' .. (o.score or 'dot')),
    recipe = 'penumbra.recipes.nmt',
    config = config,
    limits = { preset = { 'string', one_of = { 'base', 'small' } }, dataset = { 'string', one_of = { 'multi30k', 'iwslt14' } },
               score = { 'string', one_of = pn.attention_variants() },
               map = { 'string', one_of = { 'default', 'none', 'psi', 'xi', 'pseudopolar', 'exp0' } },
               hyper_model = { 'string', one_of = { 'default', 'hyperboloid', 'halfspace', 'poincare' } },
               qk_dim = { 'integer', min = 0 }, r = { 'number', min = 0 },
               precision = { 'string', one_of = { 'native', 'bf16', 'f16' } },
               dtype = { 'string', one_of = { 'f32', 'f64' } },
               self_attn = { 'string', one_of = { 'softmax', 'cosine', 'power' } },
               d_model = count, heads = count, ff = count, enc_layers = { 'integer', min = 0 }, dec_layers = count,
               vocab = { 'integer', min = 8 }, max_tokens = count, warmup = count, lr = { 'number', above = 0 },
               dropout = { 'number', min = 0, below = 1 }, act_dropout = { 'number', min = 0, below = 1 },
               label_smoothing = { 'number', min = 0, below = 1 }, weight_decay = { 'number', min = 0 },
               clip = { 'number', min = 0 }, max_len = count, eval_tokens = count, beam = count, val_beam = count,
               lenpen = 'number', average = count, samples = { 'integer', min = 0 },
               attention_maps = { 'integer', min = 0 }, train_limit = { 'integer', min = 0 },
               eval_limit = { 'integer', min = 0 } },
    monitor = 'val_bleu', mode = 'max', also = { val_loss = 'min' },
    -- ./bench -n N: each rank takes its share of every token batch's sentences (tr.batches)
    shard = 'sentences',
    model = function(state) return state.model end,
    -- resume=…: the optimiser, the update count (the learning rate's schedule) and the snapshots
    -- of the last epochs kept for checkpoint averaging
    optimizer = function(state) return state.opt end,
    save_state = function(state) return { updates = state.updates, snaps = state.snaps } end,
    load_state = function(state, t)
      state.updates, state.snaps = t.updates or 0, t.snaps or {}
      for _, snap in ipairs(state.snaps) do -- on the model's device, as snapshot() keeps them
        for i, np in ipairs(state.model:named_parameters()) do
          if snap[i]:device() ~= np[2]:device() then snap[i] = snap[i]:to(np[2]:device()) end
        end
      end
    end,
  }

  function def.setup(cfg, run)
    local d = pn.data.load(cfg.dataset)
    local tok = R.tokenizer(cfg, d)
    run:set('tokenizer', tok.path)
    run:set('dataset_path', d.path)
    for name, sum in pairs(d.sha256 or {}) do run:set('sha256_' .. name, sum) end
    tok:check_data(d.valid.src, 'valid.' .. d.src_lang)
    local state = { d = d, tok = tok }
    local function encode(split, mode)
      local e = tr.encode(split, tok, { max_len = cfg.max_len, mode = mode })
      local sk = e.skipped and e.skipped.too_long or 0
      if sk > 0 then say(cfg, 'nmt: %s: %d pairs longer than %d tokens skipped', split.name, sk, cfg.max_len) end
      if (e.truncated or 0) > 0 then
        say(cfg, 'nmt: %s: %d sources longer than %d tokens truncated (references kept whole)', split.name, e.truncated,
          cfg.max_len)
      end
      run:set('skipped_' .. split.name, sk + ((split.skipped or {}).empty or 0))
      run:set('truncated_' .. split.name, e.truncated or 0)
      return e
    end
    state.train_enc = take(encode(d.train, 'train'), cfg.train_limit)
    state.val_enc = take(encode(d.valid, 'eval'), cfg.eval_limit)
    state.test_enc = take(encode(d.test, 'eval'), cfg.eval_limit)
    -- the references scored: every line of the split (or the first eval_limit)
    state.refs = { val = first(d.valid.tgt_raw, state.val_enc.n), test = first(d.test.tgt_raw, state.test_enc.n) }
    if cfg.train_limit > 0 or cfg.eval_limit > 0 then
      say(cfg, 'nmt: a quick look on part of the data: train_limit=%d eval_limit=%d (scores are not comparable)',
        cfg.train_limit, cfg.eval_limit)
    end
    if (d.train.skipped or {}).empty and d.train.skipped.empty > 0 then
      say(cfg, 'nmt: train: %d pairs with an empty side skipped', d.train.skipped.empty)
    end
    if cfg.precision ~= 'native' and cfg.device ~= 'cuda' then
      error(string.format('nmt: precision=%s runs attention on CUDA tensor cores; it needs device=cuda (device=%s)',
        cfg.precision, cfg.device), 0)
    end
    local model = R.model(cfg, { vocab = tok.vocab_size })
    if cfg.dtype ~= 'f32' then model:to(cfg.dtype) end -- f64: for checks where f32 rounding drifts (ddp_spec)
    if cfg.device ~= 'cpu' then model:to(cfg.device) end -- before the optimiser takes its parameters
    state.model = model
    state.opt = pn.optim.Adam(model, { lr = cfg.lr, betas = { 0.9, 0.98 }, eps = 1e-8, weight_decay = cfg.weight_decay })
    state.lr_at = pn.optim.schedules.inverse_sqrt { warmup = cfg.warmup }
    state.updates = 0
    state.snaps = {}
    state.train_tokens = 0
    for _, ids in ipairs(state.train_enc.tgt_ids) do state.train_tokens = state.train_tokens + #ids + 1 end
    run:set('parameters', model:num_parameters())
    say(cfg, 'nmt: %s, %d parameters; %d / %d / %d pairs; vocabulary %d (%s)', d.name, model:num_parameters(),
      state.train_enc.n, state.val_enc.n, state.test_enc.n, tok.vocab_size, tok.path)
    return state
  end

  function def.train(state, cfg, epoch)
    local model, opt = state.model, state.opt
    model:train()
    local batches = tr.batches(state.train_enc, { max_tokens = cfg.max_tokens, seed = cfg.seed, epoch = epoch })
    local t0, last = stats.now(), stats.now()
    local sum, ntok, nsrc = 0, 0, 0
    for i, b in ipairs(batches) do
      b = on_device(b, cfg)
      -- the logits of the non-pad positions only (TF:loss)
      local loss = model:loss(b.src, b.tgt_in, b.tgt_out, b.src_mask,
        { label_smoothing = cfg.label_smoothing, reduction = 'sum' })
      local lv = loss:item()
      if lv ~= lv then error(string.format('loss became NaN in epoch %d, batch %d', epoch, i), 0) end
      ;(loss / b.ntokens):backward()
      if cfg.clip > 0 then pn.optim.clip_grad_norm(model, cfg.clip) end
      state.updates = state.updates + 1
      opt.lr = cfg.lr * state.lr_at(state.updates)
      opt:step()
      opt:zero_grad()
      sum, ntok, nsrc = sum + lv, ntok + b.ntokens, nsrc + b.nsrc
      local t = stats.now()
      if not cfg.quiet and (t - last >= 10 or i == #batches) then
        last = t
        local el = t - t0
        local rate = ntok / el
        -- what is left: this epoch's and the later epochs' batches at this rate, plus their
        -- validations at the last one's duration (none measured yet in epoch 1)
        local left = (state.train_tokens - ntok) / rate + (cfg.epochs - epoch) * state.train_tokens / rate
        local evals = (cfg.epochs - epoch + 1) * (state.eval_secs or 0)
        io.stderr:write(string.format('nmt epoch %d/%d batch %d/%d | loss %.3f | %.0f tgt tok/s (%.0f src+tgt) | lr %.2e | ETA %s%s\n',
          epoch, cfg.epochs, i, #batches, sum / ntok, rate, (ntok + nsrc) / el, opt.lr, fmt_time(left + evals),
          state.eval_secs and '' or ' (training; + validations)'))
      end
    end
    local el = stats.now() - t0
    -- checkpoint averaging keeps the last `average` epochs' parameters
    if cfg.average > 1 then
      table.insert(state.snaps, snapshot(model))
      if #state.snaps > cfg.average then table.remove(state.snaps, 1) end
    end
    return { loss = sum / ntok, tokens_per_s = ntok / el, src_tgt_tokens_per_s = (ntok + nsrc) / el,
             lr = opt.lr, updates = state.updates }
  end

  function def.evaluate(state, cfg, split, step)
    local enc = split == 'test' and state.test_enc or state.val_enc
    local refs = state.refs[split]
    local t_eval = stats.now()
    local loss, nll = eval_loss(state, cfg, enc)
    local beam = split == 'test' and cfg.beam or (step and cfg.val_beam or cfg.beam)
    local t0 = stats.now()
    local hyps = translate_split(state, cfg, enc, beam)
    local secs = stats.now() - t0
    if step then state.eval_secs = stats.now() - t_eval end
    local b, chrf = score(hyps, refs)
    state.last_hyps = state.last_hyps or {}
    state.last_hyps[split] = hyps
    state.last_bleu_line = state.last_bleu_line or {}
    state.last_bleu_line[split] = b.line
    return { loss = loss, nll = nll, ppl = math.exp(nll), bleu = b.score, chrf = chrf, bleu_bp = b.bp,
             sentences_per_s = #refs / secs, beam = beam }
  end

  function def.on_eval(state, cfg, run, step, m)
    local hyps = state.last_hyps and state.last_hyps.val
    if not hyps or cfg.samples == 0 then return end
    local lines = {}
    local d = state.d.valid
    for i = 1, math.min(cfg.samples, #d.src) do
      lines[#lines + 1] = 'SRC: ' .. d.src[i] .. '\nREF: ' .. d.tgt_raw[i] .. '\nHYP: ' .. (hyps[i] or '')
    end
    run:write_text('text/val_samples', table.concat(lines, '\n\n'), { epoch = step })
  end

  function def.finish(state, cfg, run)
    local out = {}
    local hyps = state.last_hyps and state.last_hyps.test
    if hyps then
      local refs = state.refs.test
      local t = {}
      for i = 1, #refs do t[i] = hyps[i] or '' end
      run:write_text('text/test_hyps', table.concat(t, '\n') .. '\n', { beam = cfg.beam })
      out.test_bleu_line = state.last_bleu_line.test
    end
    for i = 1, math.min(cfg.attention_maps, state.val_enc.n) do write_attention(state, cfg, run, i) end
    -- checkpoint averaging: the mean of the last `average` epochs' parameters
    if cfg.average > 1 and #state.snaps > 1 then
      R.average_into(state.model, state.snaps)
      local m = def.evaluate(state, cfg, 'test')
      out.test_bleu_avg, out.test_chrf_avg, out.averaged = m.bleu, m.chrf, #state.snaps
      local v = def.evaluate(state, cfg, 'val')
      out.val_bleu_avg = v.bleu
      -- the averaged parameters go to <run>.avg.ckpt, beside the best checkpoint <run>.ckpt
      local path = run.path:gsub('%.h5$', '') .. '.avg.ckpt'
      state.model:save(path, 'params')
      run:set('checkpoint_avg', (path:match('([^/]+)$')))
    end
    return out
  end

  return pn.experiment(def)
end

return setmetatable(R, { __call = function(_, o) return experiment(o) end })
