-- Test BLEU of each map onto the manifold (Coneheads Table 2): Multi30k de→en with the
-- Transformer of recipes/nmt.lua, rows × seeds:
--   penumbral            exp0, ξ (xi)
--   umbral               exp0, ψ (psi)
--   hyperbolic distance  exp0 and ψ on the half-space model (hyper_model=halfspace),
--                        pseudo-polar on the hyperboloid (hyper_model=hyperboloid)
--
--   ./bench experiments/nmt_ablation_maps.lua                     7 rows × 3 seeds
--   ./bench experiments/nmt_ablation_maps.lua seeds=5 epochs=10 scores=umbral,hyperbolic
--   ./bench experiments/nmt_ablation_maps.lua preset=small epochs=1 train_limit=300 eval_limit=20   (a dry run)
--   ./bench experiments/nmt_ablation_maps.lua resume=runs/ablation/nmt_ablation_maps-<stamp>.h5
--
-- Keys: scores (penumbral,umbral,hyperbolic: which rows), maps (exp0,xi,psi,pseudopolar: which
-- columns; e.g. maps=exp0 when the ξ/ψ runs exist already), seeds (3), resume=<table.h5>,
-- reuse=true (finished runs of the same settings and seed are taken, not run again), plot=false; any other key=value goes to every run (preset=small epochs=1 …).
--
-- Writes runs/ablation/nmt_ablation_maps-<UTC stamp>.md and .h5: the Table 2 layout (rows =
-- score, columns = map, cells test BLEU mean ± std) followed by one line per row (test BLEU,
-- val BLEU, parameters, s/epoch, seeds, failed), and …-<stamp>.png, the rows as bars with
-- error bars: `./bench plot compare <table.h5> --metric test_bleu`.
-- (lua/penumbra/compare.lua, M.sweep, does the running and the files.)
local compare = require 'penumbra.compare'
local home = os.getenv('PENUMBRA_HOME') or '.'

-- score, map, hyper_model (nil: the score's own default)
local ROWS = {
  { 'penumbral', 'exp0' }, { 'penumbral', 'xi' },
  { 'umbral', 'exp0' }, { 'umbral', 'psi' },
  { 'hyperbolic', 'exp0', 'halfspace' }, { 'hyperbolic', 'psi', 'halfspace' }, { 'hyperbolic', 'pseudopolar', 'hyperboloid' },
}

return compare.sweep {
  name = 'nmt_ablation_maps',
  args = rawget(_G, 'args'),
  keys = { scores = 'penumbral,umbral,hyperbolic', maps = 'exp0,xi,psi,pseudopolar' },
  pass = { quiet = 'true' },
  rows = function(k)
    -- the rows' scores (column 1) and maps (column 2) that the comma list asks for, each known
    local function pick(list, col, key, names)
      local known, want = {}, {}
      for _, r in ipairs(ROWS) do known[r[col]] = true end
      for _, v in ipairs(compare.list(list)) do
        if not known[v] then error("nmt_ablation_maps: " .. key .. ": no rows for '" .. v .. "' (" .. names .. ")", 0) end
        want[v] = true
      end
      return want
    end
    local want = pick(k.scores, 1, 'scores', 'penumbral, umbral, hyperbolic')
    local want_map = pick(k.maps, 2, 'maps', 'exp0, xi, psi, pseudopolar')
    local rows = {}
    for _, r in ipairs(ROWS) do
      local score, map, model = r[1], r[2], r[3]
      if want[score] and want_map[map] then
        rows[#rows + 1] = {
          name = score .. ' ' .. map .. (model and (' (' .. model .. ')') or ''),
          script = home .. '/experiments/nmt_multi30k_' .. score .. '.lua',
          overrides = { map = map, hyper_model = model },
          attrs = { score = score, map = map, hyper_model = model or 'default' },
        }
      end
    end
    if #rows == 0 then error('nmt_ablation_maps: no rows (scores= ' .. k.scores .. ' and maps= ' .. k.maps .. ' select none)', 0) end
    return rows
  end,
  metric = 'bleu',
  columns = { { 'score', 'score' }, { 'map', 'map' }, { 'model', 'hyper_model' } },
  grid = { rows = 'score', cols = 'map', row_titles = { hyperbolic = 'hyperbolic distance' },
           col_titles = { exp0 = 'exp0', xi = 'ξ (xi)', psi = 'ψ (psi)', pseudopolar = 'pseudo-polar' },
           note = 'hyperbolic: exp0 and ψ on the half-space model, pseudo-polar on the hyperboloid' },
  figure = { kind = 'compare', opts = { metric = 'test_bleu' } },
}
