-- The inductive GAT of Veličković et al. (PPI: 3 layers, heads 4-4-6 × 256, skip connection)
-- with dot attention; the real PPI files when pn.data.ppi finds them, else the synthetic set.
--   ./bench experiments/ppi_dot.lua [epochs=200] [dataset=real path=/data/ppi] [hidden=64] …
return require('penumbra.recipes.ppi'){ score = 'dot' }
