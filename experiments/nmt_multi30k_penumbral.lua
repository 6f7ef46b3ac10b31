-- Multi30k de→en with a 3 + 3 layer Transformer whose attention is the penumbral score
-- (recipes/nmt.lua: joint BPE, label smoothing, inverse-sqrt warm-up, beam 5 test BLEU).
--   ./bench experiments/nmt_multi30k_penumbral.lua [preset=small] [epochs=N] [seed=S] …
return require('penumbra.recipes.nmt'){ score = 'penumbral' }
