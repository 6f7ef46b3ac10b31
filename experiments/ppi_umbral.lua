-- The inductive GAT of Veličković et al. (PPI: 3 layers, heads 4-4-6 × 256, skip connection)
-- with umbral attention; the real PPI files when pn.data.ppi finds them, else the synthetic set.
--   ./bench experiments/ppi_umbral.lua [epochs=200] [dataset=real path=/data/ppi] [hidden=64] …
-- lr 0.001, not the GAT paper's 0.005: at 0.005 a head's last coordinate grew until ψ's e^{x_d}
-- overflowed f32 (epoch 9, seed 0: the run stopped with 'k … is not on the manifold'); at 0.001
-- it trains (README, Results: PPI). ppi_dot/gat/penumbral keep 0.005.
return require('penumbra.recipes.ppi'){ score = 'umbral', r = 0.1, lr = 0.001 }
