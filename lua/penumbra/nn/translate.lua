-- penumbra.nn.translate — greedy and beam-search decoding for nn.Transformer, batched over
-- sentences, on the model's incremental decoding state (cached keys/values, recurrent states).
--
-- model:translate(src (B, S) i64, {beam=5, lenpen=1, max_len_a=1.5, max_len_b=10, src_mask=nil})
--   → { {ids…}, … } one list of target ids per sentence (no bos, no eos), and a parallel list
--   of scores (the sum of the chosen tokens' log-probabilities, including eos; beam search
--   ranks finished hypotheses by that sum divided by length^lenpen, the length counting eos).
--   src_mask defaults to src ~= pad. model:greedy(src, opts) takes the argmax at every step
--   (beam search with beam = 1 chooses the same tokens: a spec holds them equal).
--   A sentence stops at eos or after max_len_a·(its source length) + max_len_b tokens (capped
--   by max_positions − 1), where eos is forced, as fairseq does. pad and bos are never chosen.
-- Beam search follows fairseq's SequenceGenerator: each live hypothesis is extended by every
-- token, the best 2·beam candidates of a sentence are taken in order, an eos among the first
-- beam of them finishes a hypothesis, the others (up to beam) stay live; a sentence is done
-- when it has beam finished hypotheses. Finished sentences leave the batch (their rows are
-- dropped from the decoding state), so long sentences do not keep short ones computing.
-- A NaN log-probability (NaN weights or inputs) is an error naming the sentence and the step:
-- no search can rank NaN, and an empty or arbitrary translation would be scored as real.
return function(nn, pn)
  local ffi = require 'ffi'
  local options = require 'penumbra.options'
  local TF = nn.Transformer
  local OPTS = { beam = { 'integer', min = 1 }, lenpen = 'number', max_len_a = { 'number', min = 0 },
                 max_len_b = { 'integer', min = 0 }, src_mask = 'tensor' }

  local NEG = -math.huge

  local function nan_error(who, i, t)
    error(string.format('%s: the model gives NaN log-probabilities for sentence %d at target position %d (its weights '
      .. 'or inputs hold NaN); no translation is made', who, i, t), 0)
  end

  local function src_lengths(src, pad)
    local s = src:shape()
    local flat = src:to('i64'):to('cpu'):contiguous() -- read on the host
    local p = ffi.cast('int64_t *', flat:data_ptr())
    local lens = {}
    for b = 0, s[1] - 1 do
      local n = 0
      for j = 0, s[2] - 1 do if p[b * s[2] + j] ~= pad then n = n + 1 end end
      lens[b + 1] = n
    end
    return lens
  end

  -- token ids / row indices on the model's device (self.pe: the positions, on its device)
  local function ids_tensor(self, list) return pn.tensor(list, { dtype = 'i64', device = self.pe:device() }) end

  -- log-probabilities (rows, V) f32 on the host: a pointer valid while the tensor lives
  local function host_logprobs(logits)
    local lp = logits:log_softmax(-1):to('f32'):to('cpu'):contiguous()
    return lp, ffi.cast('float *', lp:data_ptr())
  end

  local function greedy(self, st, B, maxlen, _, _, who)
    local c = self.o
    local out, scores = {}, {}
    local rows = {}               -- row r → sentence
    local tokens = {}
    for i = 1, B do rows[i], out[i], scores[i], tokens[i] = i, {}, 0, c.bos end
    local V = c.vocab
    while #rows > 0 do
      local lp, p = host_logprobs(self:decode_step(st, ids_tensor(self, tokens)))
      local keep, next_rows, next_tokens = {}, {}, {}
      for r, i in ipairs(rows) do
        local base = (r - 1) * V
        local best, bw = NEG, c.eos
        local forced = #out[i] >= maxlen[i]
        if forced then best = p[base + c.eos] else
          for w = 0, V - 1 do
            if w ~= c.pad and w ~= c.bos then
              local v = p[base + w]
              if v > best then best, bw = v, w elseif v ~= v then nan_error(who, i, #out[i] + 1) end
            end
          end
        end
        if best ~= best then nan_error(who, i, #out[i] + 1) end
        scores[i] = scores[i] + best
        if bw == c.eos then
          -- finished
        else
          out[i][#out[i] + 1] = bw
          keep[#keep + 1] = r - 1
          next_rows[#next_rows + 1] = i
          next_tokens[#next_tokens + 1] = bw
        end
      end
      lp = nil
      if #keep == 0 then break end
      if #keep < #rows then self:reorder(st, ids_tensor(self, keep)) end
      rows, tokens = next_rows, next_tokens
    end
    return out, scores
  end

  -- Every unfinished sentence holds exactly K rows of the decoding state, in a run (begin_decode's
  -- group = K): the cross-attention then reads each sentence's memory once for its K beams, and
  -- the memory is only compacted when sentences finish. Rows without a hypothesis (all but the
  -- first at the start, fairseq's way; and a sentence left with fewer than K candidates) are
  -- fillers: never scanned, their state a copy of a live row's.
  local function beam_search(self, st, B, maxlen, K, lenpen, who)
    local c = self.o
    local V = c.vocab
    -- live rows, K per sentence: { sent, tokens, score } or a filler { sent, filler = true }
    local live = {}
    for i = 1, B do
      live[#live + 1] = { sent = i, tokens = {}, score = 0 }
      for _ = 2, K do live[#live + 1] = { sent = i, filler = true } end
    end
    local finished = {}
    for i = 1, B do finished[i] = {} end
    local cs, cr, cw = {}, {}, {} -- candidate buffer of one sentence, sorted by score (descending)
    local t = 0                   -- every hypothesis has t tokens
    while #live > 0 do
      local toks = {}
      for r, h in ipairs(live) do toks[r] = not h.filler and h.tokens[t] or c.bos end
      local lp, p = host_logprobs(self:decode_step(st, ids_tensor(self, toks)))
      local next_live, parents, sents = {}, {}, {}
      for r = 1, #live, K do
        local i = live[r].sent
        -- the best 2K (score, row, word) candidates of sentence i
        local n, cap = 0, 2 * K
        local forced = t >= maxlen[i]
        for rr = r, r + K - 1 do
          local h = live[rr]
          if not h.filler then
            local base, s0 = (rr - 1) * V, h.score
            local w0, w1 = 0, V - 1
            if forced then w0, w1 = c.eos, c.eos end
            for w = w0, w1 do
              if w ~= c.pad and w ~= c.bos then
                local v = s0 + p[base + w]
                if v ~= v then nan_error(who, i, t + 1) end
                if n < cap or v > cs[n] then
                  local j = n < cap and n + 1 or n
                  while j > 1 and cs[j - 1] < v do
                    cs[j], cr[j], cw[j] = cs[j - 1], cr[j - 1], cw[j - 1]
                    j = j - 1
                  end
                  cs[j], cr[j], cw[j] = v, rr, w
                  if n < cap then n = n + 1 end
                end
              end
            end
          end
        end
        local fin, kept, first = finished[i], 0, #next_live
        for j = 1, n do
          local h = live[cr[j]]
          if cw[j] == c.eos then
            if j <= K and #fin < K then
              fin[#fin + 1] = { tokens = h.tokens, score = cs[j], norm = cs[j] / ((t + 1) ^ lenpen) }
            end
          elseif kept < K and cs[j] > NEG then
            local tk = {}
            for q = 1, t do tk[q] = h.tokens[q] end
            tk[t + 1] = cw[j]
            next_live[#next_live + 1] = { sent = i, tokens = tk, score = cs[j] }
            parents[#parents + 1] = cr[j] - 1
            kept = kept + 1
          end
        end
        if #fin >= K or forced or kept == 0 then
          -- done: drop this sentence's new live hypotheses
          for q = #next_live, first + 1, -1 do
            next_live[q] = nil
            parents[q] = nil
          end
        else
          for _ = kept + 1, K do -- fillers: the state of the sentence's first kept row
            next_live[#next_live + 1] = { sent = i, filler = true }
            parents[#parents + 1] = parents[first + 1]
          end
          sents[#sents + 1] = (r - 1) / K -- the sentence's memory row now
        end
      end
      lp = nil
      t = t + 1
      local same = #next_live == #live -- the same sentences: the memory stays
      live = next_live
      if #live > 0 then self:reorder(st, ids_tensor(self, parents), not same and ids_tensor(self, sents) or false) end
    end
    local out, scores = {}, {}
    for i = 1, B do
      local best
      for _, h in ipairs(finished[i]) do
        if not best or h.norm > best.norm then best = h end
      end
      out[i], scores[i] = best and best.tokens or {}, best and best.score or NEG
    end
    return out, scores
  end

  local function run(self, who, src, o, search)
    -- run is tail-called by translate / greedy: level 2 is their caller
    o = options.check(who, o, OPTS, 2)
    self:check_tokens(who, 'src', src)
    local c = self.o
    local K, lenpen = o.beam or 5, o.lenpen or 1
    local a, b = o.max_len_a or 1.5, o.max_len_b or 10
    local B = src:shape()[1]
    self.check_mask(who, o.src_mask, B, src:shape()[2])
    src = src:to('i64')
    local mask = o.src_mask or src:ne(c.pad):to('u8'):view(B, 1, 1, src:shape()[2])
    local maxlen = {}
    for i, n in ipairs(src_lengths(src, c.pad)) do
      maxlen[i] = math.min(math.floor(a * n + b), c.max_positions - 1)
    end
    local was_training = self.training
    self:eval()
    local ok, out, scores = pcall(function()
      return pn.no_grad(function()
        local st = self:begin_decode(self:encode(src, mask), mask, search == beam_search and K or 1)
        return search(self, st, B, maxlen, K, lenpen, who)
      end)
    end)
    self:train(was_training)
    if not ok then error(out, 0) end
    return out, scores
  end

  function TF:translate(src, o) return run(self, 'translate', src, o, beam_search) end
  function TF:greedy(src, o) return run(self, 'greedy', src, o, greedy) end
end
