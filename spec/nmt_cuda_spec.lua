-- nmt_cuda_spec.lua — the NMT recipe with device=cuda (the kernel interpreter here, a GPU where
-- there is one): the Transformer, its batches and greedy decoding run on the device and give the
-- CPU run's losses (the same dropout masks: one Philox stream). A tiny run: 32 training pairs,
-- 4 evaluation pairs, one epoch, greedy test decoding; once more with precision=bf16.
local pn = require 'penumbra'
local cu = require 'spec.helpers.cuda'

local it_cuda = pn.cuda.available() and it or pending

local function run(device, precision)
  return cu.run_experiment('experiments/nmt_multi30k_umbral.lua', { epochs = '1', preset = 'small',
    train_limit = '32', eval_limit = '4', beam = '1', attention_maps = '0', threads = '1', device = device,
    precision = precision })
end

describe('NMT recipe on cuda', function()
  -- beam search on the device: its grouped decoding state (a run of `beam` rows per sentence, the
  -- cross-attention's queries of one memory row) and reorders, against the same model on the CPU
  it_cuda('beam search (beam 3) on the device chooses what it chooses on the CPU', function()
    for _, score in ipairs({ 'dot', 'umbral' }) do
      pn.manual_seed(5)
      local m = pn.nn.Transformer({ vocab = 12, d_model = 16, heads = 2, ff = 32, enc_layers = 1, dec_layers = 2,
        dropout = 0, score = score })
      local src = pn.tensor({ { 5, 6, 7, 8 }, { 9, 10, 0, 0 }, { 4, 0, 0, 0 } }, { dtype = 'i64' })
      local h, s = m:translate(src, { beam = 3 })
      m:to('cuda')
      local hg, sg = m:translate(src:to('cuda'), { beam = 3 })
      for i = 1, 3 do
        assert.same(h[i], hg[i])
        assert.is_true(math.abs(s[i] - sg[i]) <= 1e-4, string.format('%s sentence %d: cpu %.6f, cuda %.6f', score, i, s[i], sg[i]))
      end
    end
  end)

  it_cuda('nmt_multi30k_umbral device=cuda: the CPU run\'s validation and test losses', function()
    local c, g = run('cpu'), run('cuda')
    for _, key in ipairs({ 'val_loss', 'test_loss', 'val_nll' }) do
      assert.is_true(math.abs(c[key] - g[key]) <= 1e-4 * (1 + math.abs(c[key])),
        string.format('%s: cpu %.7f, cuda %.7f', key, c[key], g[key]))
    end
    assert.truthy(g.test_bleu >= 0 and g.test_bleu <= 100)
    -- precision=bf16: the attentions' products on tensor cores; near the f32 run, not equal to it
    local h = run('cuda', 'bf16')
    for _, key in ipairs({ 'val_loss', 'test_loss' }) do
      local rel = math.abs(c[key] - h[key]) / (1 + math.abs(c[key]))
      assert.is_true(rel <= 2e-2 and h[key] ~= g[key], string.format('%s: f32 %.7f, bf16 %.7f', key, g[key], h[key]))
    end
  end)
end)
