-- Multi30k de→en with a 3 + 3 layer Transformer: dot-product attention in the encoder and
-- the cross-attention, Cottention (cosine, linear, causal) in the decoder's self-attention
-- (recipes/nmt.lua: joint BPE, label smoothing, inverse-sqrt warm-up, beam 5 test BLEU).
--   ./bench experiments/nmt_multi30k_cosine.lua [preset=small] [epochs=N] [seed=S] …
return require('penumbra.recipes.nmt'){ score = 'dot', self_attn = 'cosine', name = 'nmt_multi30k_cosine' }
