-- Hyperbolic Attention Networks §5.1: shortest-path length prediction on random hyperbolic graphs with a Recursive
-- Transformer whose attention is dot (recipe: lua/penumbra/recipes/scalefree.lua).
--   ./bench experiments/scalefree_splp_dot.lua [n=1000] [steps=…] [seed=1] …
return require('penumbra.recipes.scalefree'){ task = 'splp', score = 'dot' }
