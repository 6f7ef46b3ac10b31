-- experiments/perf/nmt_cpu.lua — training steps (and, with decode=true, beam-5 decoding) of the
-- NMT Transformer (lua/penumbra/nn/transformer.lua, the base preset of recipes/nmt.lua: 3 + 3
-- post-norm layers, d = 256, 4 heads, FFN 1024, tied embedding, vocabulary 8000) on real Multi30k
-- batches against the same model written in PyTorch 2 the way a researcher writes it
-- (experiments/perf/nmt_cpu_torch.py: nn.Linear, nn.LayerNorm, F.scaled_dot_product_attention
-- with a key-padding mask / is_causal, F.cross_entropy with label smoothing, clip_grad_norm_,
-- torch.optim.Adam; beam search with an incremental key/value cache).
--
--   ./bench experiments/perf/nmt_cpu.lua [score=dot] [scores=dot,umbral,penumbral] [rounds=5]
--        [steps=8] [warmup=<steps>] [threads=2] [dropout=0.2] [max_tokens=4096] [check=1]
--        [decode=false] [sentences=200] [beam=5] [decode_rounds=3] [decode_tokens=6000]
--        [ckpt=runs/nmt_multi30k_dot/….ckpt] [ckpt_<score>=…] [qk_dim=] [lr=5e-4] [seed=0]
--        [flush_denormal=true]  (subnormals flushed to zero on both sides, as the NMT recipe's
--                                default; false: IEEE subnormals, which cost the cones time on
--                                Intel CPUs — core/fpmode.c)
--        [d_model=256 heads=4 ff=1024 enc_layers=3 dec_layers=3 vocab=8000]  (the model; base preset)
--
-- A step is what recipes/nmt.lua's def.train does per batch: loss = model:loss(src, tgt_in, tgt_out,
-- src_mask, label_smoothing 0.1, sum) / ntokens — the cross entropy of the non-pad positions, whose
-- logits alone are computed (the peer, as a researcher writes it, computes every position's logits
-- and ignores the pads: F.cross_entropy(…, ignore_index=0); the same loss and gradients); backward; clip_grad_norm 1.0; Adam (0.9, 0.98), eps 1e-8, weight decay 1e-4 (coupled, as
-- torch.optim.Adam's); zero_grad. The batches: Multi30k's training split, the joint BPE of the
-- recipe, token-count batches (max_tokens) in the recipe's shuffled order (seed 0, epoch 1); the
-- first `steps` of them are the sequence every round runs, on both sides (token ids written to
-- .npy files the peer reads, with our initial weights).
--
-- Before timing (check=1): the dot model in eval mode (no dropout) on the first batch, ours and
-- PyTorch's loss, logits (max |Δ| / max |logits|) and the gradient of every parameter (max |Δ|
-- relative to that gradient's max |g|, floored at 1e-3 of the largest; the key projections' biases,
-- whose gradient is zero in exact arithmetic, must stay under 1e-3 of the largest) are compared;
-- over 1e-4 relative (logits, loss) or 1e-3 (gradients: f32 sums over ~3600 tokens) the run stops. Then `warmup` untimed steps on each side, then `rounds` rounds taking
-- turns — ours for each score in `scores`, then PyTorch — of `steps` timed steps each, with
-- dropout (the base preset's 0.2) on both sides. Reported: median ms/step, target tokens/s
-- (Σ ntokens / the round's time; median over rounds) and ours/PyTorch in tokens/s (> 1: ours is
-- faster). The peer is always SDPA dot product; with `score=umbral` (any score but dot) our dot is
-- timed too (scores=dot,umbral) so a cone score is shown against PyTorch's dot and against our
-- dot; `scores=` names the list outright.
--
-- decode=true: beam search (beam 5, length penalty 1, max length 1.5·source length + 10, fairseq's
-- rules) over the first `sentences` validation sentences in the recipe's eval batches
-- (decode_tokens per batch): ours model:translate, PyTorch's batched beam search with a key/value
-- cache; sentences/s, medians of `decode_rounds` alternating rounds. Our dot and the peer then
-- hold the same weights (those of `ckpt=` when given — a trained checkpoint makes hypotheses
-- realistic in length — else our dot model's after the timed steps), and the share of sentences
-- where the two produce the same hypothesis is printed (they differ only at near-ties).
--
-- PyTorch runs in the peer Python (bk.python: build/venv-peers with PyPI's torch and numpy), one
-- process kept for the whole run and driven over a pipe, so both sides warm up once.
local pn = require 'penumbra'
local bk = require 'penumbra.benchkit'
local tr = require 'penumbra.data.translation'

args = args or {}
local function num(k, d) return tonumber(args[k] or d) end
local rounds, steps = num('rounds', 5), num('steps', 8)
local warmup = num('warmup', steps)
local threads = num('threads', 2)
local dropout = num('dropout', 0.2)
local max_tokens = num('max_tokens', 4096)
local lr, seed = num('lr', 5e-4), num('seed', 0)
local do_check = args.check ~= '0'
local decode = args.decode == 'true' or args.decode == '1'
local sentences, beam = num('sentences', 200), num('beam', 5)
local decode_rounds, decode_tokens = num('decode_rounds', 3), num('decode_tokens', 6000)
local flush = args.flush_denormal ~= 'false' and args.flush_denormal ~= '0'
local M = { vocab = num('vocab', 8000), d_model = num('d_model', 256), heads = num('heads', 4), ff = num('ff', 1024),
            enc_layers = num('enc_layers', 3), dec_layers = num('dec_layers', 3), qk_dim = args.qk_dim and num('qk_dim') }
local max_len = 256 -- the recipe's: longer training pairs are dropped, longer eval sources truncated
local scores
if args.scores then scores = bk.list(args.scores)
else
  local s = args.score or 'dot'
  scores = s == 'dot' and { 'dot' } or { 'dot', s }
end
for _, s in ipairs(scores) do pn.attention_variant(s) end -- an unknown score is an error now
pn.set_num_threads(threads)
local flush_ok = pn.set_flush_denormal(flush)
local here = (arg and arg[0] or 'experiments/perf/nmt_cpu.lua'):match('^(.*)/[^/]*$') or '.'
local py, pyinfo = bk.python('torch,numpy')
if not py then error('nmt_cpu: ' .. pyinfo, 0) end

-- ---- data: the recipe's tokenizer and batches ---------------------------------------------------
local d = pn.data.load('multi30k')
local tok = pn.text.bpe { train = { d.files.train.src, d.files.train.tgt }, vocab = M.vocab }
M.vocab = tok.vocab_size
local train_enc = tr.encode(d.train, tok, { max_len = max_len, mode = 'train' })
local all = tr.batches(train_enc, { max_tokens = max_tokens, seed = 0, epoch = 1 })
local batches = {}
for i = 1, steps do batches[i] = all[(i - 1) % #all + 1] end
local sum_ntok, sum_rows, sum_src = 0, 0, 0
for _, b in ipairs(batches) do sum_ntok, sum_rows, sum_src = sum_ntok + b.ntokens, sum_rows + b.size, sum_src + b.nsrc end

local function model_opts(score, drop)
  return { vocab = M.vocab, d_model = M.d_model, heads = M.heads, ff = M.ff, enc_layers = M.enc_layers,
           dec_layers = M.dec_layers, dropout = drop, score = score, qk_dim = M.qk_dim, pad = 0, bos = 2, eos = 3,
           max_positions = max_len + 2 }
end

local function commit()
  local p = io.popen('git -C ' .. here .. ' describe --always --dirty 2>/dev/null')
  local c = p and p:read('*l')
  if p then p:close() end
  return c or '?'
end

bk.header('NMT Transformer training step: penumbra vs PyTorch', {
  string.format('model: %d + %d post-norm layers, d = %d, %d heads (q/k width %d), FFN %d, tied embedding, vocabulary %d',
    M.enc_layers, M.dec_layers, M.d_model, M.heads, M.qk_dim or M.d_model / M.heads, M.ff, M.vocab),
  string.format('batches: Multi30k train, %d of %d (max_tokens %d): %d sentences, %d source + %d target tokens ' ..
    '(%.0f target tokens per step)', steps, #all, max_tokens, sum_rows, sum_src, sum_ntok, sum_ntok / steps),
  string.format('step: forward, label-smoothed CE (0.1), backward, clip 1.0, Adam (0.9, 0.98, wd 1e-4, lr %g); ' ..
    'dropout %g; %d threads for both; subnormals %s on both', lr, dropout, threads,
    flush and (flush_ok and 'flushed to zero' or 'kept (this CPU has no flush mode)') or 'kept (IEEE)'),
  string.format('scores (ours): %s; peer: SDPA dot product', table.concat(scores, ', ')),
  string.format('ours: penumbra %s (commit %s), %s', pn.version, commit(), jit and jit.version or _VERSION),
  'peer: ' .. pyinfo .. ' (' .. py .. ')',
})

-- ---- the exchange folder --------------------------------------------------------------------------
local dir = os.tmpname()
os.remove(dir)
dir = dir .. '_nmt_cpu'
assert(os.execute('mkdir -p ' .. dir .. '/w ' .. dir .. '/g ' .. dir .. '/wd'))
local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function cleanup() os.execute('rm -rf ' .. sh_quote(dir)) end

local function save_params(model, sub)
  for _, np in ipairs(model:named_parameters()) do pn.io.save_npy(dir .. '/' .. sub .. '/' .. np[1] .. '.npy', np[2]:detach()) end
end

local function main()
  for i, b in ipairs(batches) do
    pn.io.save_npy(string.format('%s/b%d_src.npy', dir, i), b.src)
    pn.io.save_npy(string.format('%s/b%d_tgt_in.npy', dir, i), b.tgt_in)
    pn.io.save_npy(string.format('%s/b%d_tgt_out.npy', dir, i), b.tgt_out)
    pn.io.save_npy(string.format('%s/b%d_mask.npy', dir, i), b.src_mask)
  end

  -- our models: the same seed, so scores with the same parameters start from the same weights
  local runs = {}
  local function loss_of(model, b)
    local logits = model(b.src, b.tgt_in, b.src_mask)
    local V = logits:shape()[3]
    local loss = pn.cross_entropy(logits:view(-1, V), b.tgt_out:view(-1),
      { label_smoothing = 0.1, ignore_index = 0, reduction = 'sum' }) / b.ntokens
    return loss, logits
  end
  -- the timed step's loss, as recipes/nmt.lua trains: the logits of the non-pad positions only
  local function train_loss(model, b)
    return model:loss(b.src, b.tgt_in, b.tgt_out, b.src_mask, { label_smoothing = 0.1, reduction = 'sum' }) / b.ntokens
  end
  local need_dot = true
  for _, score in ipairs(scores) do
    pn.manual_seed(seed)
    local model = pn.nn.Transformer(model_opts(score, dropout))
    runs[score] = { model = model, ours = {}, rate = {} }
    if score == 'dot' then need_dot = false end
  end
  -- the dot model the peer copies (and the check runs on)
  local ref = runs.dot and runs.dot.model
  if need_dot then
    pn.manual_seed(seed)
    ref = pn.nn.Transformer(model_opts('dot', dropout))
  end
  save_params(ref, 'w')
  local nparams = ref:num_parameters()

  local ref_loss
  if do_check then
    ref:eval()
    local loss, logits = loss_of(ref, batches[1])
    loss:backward()
    ref_loss = loss:item()
    -- the timed steps' loss (non-pad rows only) is the same number
    local lp = pn.no_grad(function() return train_loss(ref, batches[1]):item() end)
    if math.abs(lp - ref_loss) > 1e-5 * math.abs(ref_loss) then
      error(string.format('nmt_cpu: model:loss gives %.9g, the full logits\' cross entropy %.9g', lp, ref_loss), 0)
    end
    pn.io.save_npy(dir .. '/ref_logits.npy', logits:detach())
    for _, np in ipairs(ref:named_parameters()) do pn.io.save_npy(dir .. '/g/' .. np[1] .. '.npy', np[2].grad) end
    ref:zero_grad()
    ref:train()
    logits, loss = nil, nil
    collectgarbage('collect')
  end
  for _, score in ipairs(scores) do
    runs[score].opt = pn.optim.Adam(runs[score].model,
      { lr = lr, betas = { 0.9, 0.98 }, eps = 1e-8, weight_decay = 1e-4 })
  end

  -- ---- the peer: one process for the run, commands on its stdin, replies on a FIFO ------------
  local fifo = dir .. '/reply'
  assert(os.execute('mkfifo ' .. sh_quote(fifo)))
  local cmd = string.format('%s %s --dir %s --reply %s --threads %d --batches %d --vocab %d --d-model %d --heads %d ' ..
    '--ff %d --enc-layers %d --dec-layers %d --qk-dim %d --dropout %.17g --lr %.17g --max-positions %d --beam %d ' ..
    '--flush-denormal %d 2>%s',
    sh_quote(py), sh_quote(here .. '/nmt_cpu_torch.py'), sh_quote(dir), sh_quote(fifo), threads, steps, M.vocab, M.d_model,
    M.heads, M.ff, M.enc_layers, M.dec_layers, M.qk_dim or 0, dropout, lr, max_len + 2, beam, flush and 1 or 0,
    sh_quote(dir .. '/peer.err'))
  -- a write to a peer that died must fail (and be reported), not end this process by SIGPIPE
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'typedef void (*pn_sighandler_t)(int); pn_sighandler_t signal(int, pn_sighandler_t);')
  ffi.C.signal(13, ffi.cast('pn_sighandler_t', 1)) -- SIGPIPE, SIG_IGN
  local peer = io.popen(cmd, 'w')
  local reply = assert(io.open(fifo, 'r'))
  local function peer_failed(what)
    local f = io.open(dir .. '/peer.err')
    local err = f and f:read('*a') or ''
    if f then f:close() end
    error('nmt_cpu: the PyTorch peer failed (' .. what .. '):\n' .. err, 0)
  end
  local function ask(line)
    if not (peer:write(line, '\n') and peer:flush()) then peer_failed('its input closed before "' .. line .. '"') end
    local r = reply:read('*l')
    if not r then peer_failed('no reply to "' .. line .. '"') end
    if r:match('^error') then peer_failed(r) end
    return r
  end
  local hello = reply:read('*l')
  if not hello or hello:match('^error') then peer_failed(hello or 'it exited at start') end
  print('peer: ' .. hello)

  if do_check then
    local r = ask(string.format('check %.17g', ref_loss))
    local tl, dl, ml, ge, gw, np_, kb = r:match('^check (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)')
    if not kb then peer_failed('bad check reply: ' .. r) end
    dl, ml, ge, kb = tonumber(dl), tonumber(ml), tonumber(ge), tonumber(kb)
    print(string.format('check (dot, dropout off, batch 1 of %d target tokens): loss ours %.7g PyTorch %s; max |Δ logits| %.3g ' ..
      'of max |logits| %.3g (%.2g relative); worst gradient rel. error %.3g (%s) over %s parameters; key-projection ' ..
      'biases (zero gradient in exact arithmetic) at most %.2g of the largest gradient', batches[1].ntokens, ref_loss, tl,
      dl, ml, dl / ml, ge, gw, np_, kb))
    -- gradients: 1e-3 of each parameter's largest entry. A bias gradient is an f32 sum over
    -- every token of the batch (3600 at max_tokens 4096) with cancellation, and the two sides
    -- sum in different orders: 2.4e-4 was seen at full size, 3e-6 at 1000 tokens
    if not (dl / ml <= 1e-4 and ge <= 1e-3 and kb <= 1e-3 and
            math.abs(tonumber(tl) - ref_loss) <= 1e-4 * math.abs(ref_loss)) then
      error('nmt_cpu: ours and PyTorch disagree (logits or loss beyond 1e-4, gradients beyond 1e-3 relative): ' ..
        'not timing different models', 0)
    end
  end

  -- ---- training steps -------------------------------------------------------------------------
  local function step_fn(r)
    local i = 0
    return function()
      i = i % steps + 1
      local loss = train_loss(r.model, batches[i])
      loss:backward()
      pn.optim.clip_grad_norm(r.model, 1.0)
      r.opt:step()
      r.opt:zero_grad()
    end
  end
  for _, score in ipairs(scores) do
    local r = runs[score]
    r.step = step_fn(r)
    bk.time_calls(r.step, 0, nil, warmup)
  end
  ask('warm ' .. warmup)
  local peer_ms, peer_rate = {}, {}
  for _ = 1, rounds do
    for _, score in ipairs(scores) do
      local r = runs[score]
      local t = bk.time_calls(r.step, steps, {}, 0)
      local tot = 0
      for j, ms in ipairs(t) do r.ours[#r.ours + 1] = ms; tot = tot + ms end
      r.rate[#r.rate + 1] = sum_ntok / (tot / 1e3)
    end
    local out = ask('train ' .. steps)
    local tot, n = 0, 0
    for ms in out:gsub('^time ', ''):gmatch('%S+') do
      peer_ms[#peer_ms + 1] = tonumber(ms); tot = tot + tonumber(ms); n = n + 1
    end
    if n ~= steps then peer_failed('expected ' .. steps .. ' times, got: ' .. out) end
    peer_rate[#peer_rate + 1] = sum_ntok / (tot / 1e3)
  end

  local mt, rt = bk.median(peer_ms), bk.median(peer_rate)
  local rd = runs.dot and bk.median(runs.dot.rate)
  print(string.format('\ntraining (%d rounds × %d steps, %s parameters; tokens/s = target tokens per second, median of rounds)',
    rounds, steps, nparams))
  print(string.format('%-15s %10s %12s %14s %14s', 'model', 'ms/step', 'tokens/s', 'ours/PyTorch', 'ours/our dot'))
  for _, score in ipairs(scores) do
    local r = runs[score]
    local ro = bk.median(r.rate)
    local vs_dot = (rd and score ~= 'dot') and ro / rd
    print(string.format('%-15s %10.1f %12.0f %14.2f %14s  %s', 'ours ' .. score, bk.median(r.ours), ro, ro / rt,
      vs_dot and string.format('%.2f', vs_dot) or '',
      vs_dot and (vs_dot >= 0.85 and 'within 15 % of our dot: ok' or 'within 15 % of our dot: MISSED') or ''))
  end
  print(string.format('%-15s %10.1f %12.0f', 'PyTorch dot', mt, rt))
  print('(ours/PyTorch and ours/our dot are ratios of tokens/s: above 1 is faster than the other)')
  -- each round's ours/PyTorch from the two sides' adjacent timings: a burst of load on this kind
  -- of machine moves both medians, and the paired ratios show how far the figure above can move
  for _, score in ipairs(scores) do
    local r, ratios, shown = runs[score], {}, {}
    for i = 1, rounds do
      ratios[i] = r.rate[i] / peer_rate[i]
      shown[i] = string.format('%.2f', ratios[i])
    end
    print(string.format('ours %s / PyTorch round by round: %s (median %.2f)', score, table.concat(shown, ' '),
      bk.median(ratios)))
  end

  -- ---- decoding ---------------------------------------------------------------------------------
  if decode then
    local val = tr.encode(d.valid, tok, { max_len = max_len, mode = 'eval' })
    local n = math.min(sentences, val.n)
    for _, k in ipairs({ 'src_ids', 'tgt_ids', 'index', 'line' }) do
      if val[k] then for i = #val[k], n + 1, -1 do val[k][i] = nil end end
    end
    val.n = n
    local dbs = tr.batches(val, { max_tokens = decode_tokens, shuffle = false })
    for i, b in ipairs(dbs) do
      pn.io.save_npy(string.format('%s/d%d_src.npy', dir, i), b.src)
      pn.io.save_npy(string.format('%s/d%d_mask.npy', dir, i), b.src_mask)
    end
    for _, score in ipairs(scores) do
      local path = args['ckpt_' .. score] or (score == 'dot' and args.ckpt) or nil
      if path then runs[score].model:load(path, 'params') end
      runs[score].ckpt = path
    end
    -- the peer decodes with our dot model's weights (the first score's when dot is not timed)
    local peer_src = runs.dot or runs[scores[1]]
    save_params(peer_src.model, 'wd')
    ask('load wd')
    local hyps = {}
    local function translate_all(r)
      local out = {}
      for _, b in ipairs(dbs) do
        local h, s = r.model:translate(b.src, { beam = beam, src_mask = b.src_mask })
        for j = 1, #h do out[#out + 1] = { ids = h[j], score = s[j] } end
      end
      return out
    end
    local dec = { ours = {}, peer = {} }
    for _, score in ipairs(scores) do dec.ours[score] = {} end
    for _ = 1, decode_rounds do
      for _, score in ipairs(scores) do
        local r = runs[score]
        collectgarbage('collect')
        local t0 = bk.now()
        hyps[score] = translate_all(r)
        table.insert(dec.ours[score], bk.now() - t0)
      end
      local out = ask('decode ' .. #dbs)
      table.insert(dec.peer, tonumber(out:match('^decode (%S+)')))
    end
    -- the peer's hypotheses: one line per sentence in batch order, "score<TAB>ids…"
    local peer_h = {}
    for line in io.lines(dir .. '/peer_hyps.txt') do
      local s, ids = line:match('^(%S+)\t?(.*)$')
      local t = {}
      for x in ids:gmatch('%S+') do t[#t + 1] = tonumber(x) end
      peer_h[#peer_h + 1] = { ids = t, score = tonumber(s) }
    end
    local function mean_len(h)
      local s = 0
      for _, x in ipairs(h) do s = s + #x.ids end
      return s / math.max(#h, 1)
    end
    print(string.format('\ndecoding: beam %d, length penalty 1, %d validation sentences in %d batches (decode_tokens %d), ' ..
      'median of %d rounds', beam, n, #dbs, decode_tokens, decode_rounds))
    local pt = bk.median(dec.peer)
    print(string.format('%-15s %10s %12s %14s %10s  %s', 'model', 's', 'sentences/s', 'ours/PyTorch', 'mean len', 'weights'))
    for _, score in ipairs(scores) do
      local t = bk.median(dec.ours[score])
      print(string.format('%-15s %10.2f %12.1f %14.2f %10.1f  %s', 'ours ' .. score, t, n / t, pt / t, mean_len(hyps[score]),
        runs[score].ckpt or ('after ' .. warmup + rounds * steps .. ' training steps')))
    end
    print(string.format('%-15s %10.2f %12.1f %14s %10.1f  %s', 'PyTorch dot', pt, n / pt, '', mean_len(peer_h),
      'those of ours ' .. (runs.dot and 'dot' or scores[1])))
    if runs.dot then
      local same, ties, shown = 0, 0, 0
      local h = hyps.dot
      if #peer_h ~= #h then error(string.format('nmt_cpu: %d hypotheses from the peer, %d from ours', #peer_h, #h), 0) end
      for i = 1, #h do
        local a, b = h[i], peer_h[i]
        local eq = #a.ids == #b.ids
        if eq then for j = 1, #a.ids do if a.ids[j] ~= b.ids[j] then eq = false; break end end end
        if eq then same = same + 1
        else
          local na, nb = a.score / (#a.ids + 1), b.score / (#b.ids + 1)
          if math.abs(na - nb) <= 1e-3 * math.max(1, math.abs(na)) then ties = ties + 1 end
          if shown < 3 then
            shown = shown + 1
            print(string.format('  differs: sentence %d: ours %d tokens, score/len %.6f; PyTorch %d tokens, score/len %.6f',
              i, #a.ids, na, #b.ids, nb))
          end
        end
      end
      print(string.format('agreement (ours dot vs PyTorch, same weights): %d / %d identical hypotheses (%.1f %%); ' ..
        'of the %d that differ, %d are near-ties (length-normalised scores within 1e-3)', same, #h, 100 * same / #h,
        #h - same, ties))
      if same < 0.9 * #h then
        print('WARNING: under 90 % identical: beyond near-ties the two beam searches (or models) differ')
      end
    end
  end
  ask('quit')
  reply:close()
  peer:close()
end

local ok, err = xpcall(main, debug.traceback)
cleanup()
if not ok then error(err, 0) end
