-- Test BLEU against the per-head q/k width (Coneheads Fig. 4): Multi30k de→en with the
-- Transformer of recipes/nmt.lua, for each score × q/k width × seed, then one table and one
-- figure (BLEU vs q/k width, one line per attention, error bars = std over seeds).
--
--   ./bench experiments/nmt_ablation_dims.lua                        3 scores × 4 widths × 3 seeds
--   ./bench experiments/nmt_ablation_dims.lua scores=dot,umbral dims=16,64 seeds=5 epochs=10
--   ./bench experiments/nmt_ablation_dims.lua preset=small epochs=1 train_limit=300 eval_limit=20   (a dry run, seconds)
--   ./bench experiments/nmt_ablation_dims.lua resume=runs/ablation/nmt_ablation_dims-<stamp>.h5
--
-- Keys: scores (dot,umbral,penumbral: experiments/nmt_multi30k_<score>.lua), dims (16,32,64,128:
-- qk_dim, the q/k width per head; the values keep their own width, 64 = d_model/heads for the
-- base preset), seeds (3: seeds 0..N-1), resume=<table.h5> (keep that table's finished runs, run
-- the rest: same keys required), reuse=true (take finished runs of the same settings and seed
-- from runs/, e.g. ones run one at a time, instead of running them), plot=false (no figure); any
-- other key=value goes to every run
-- (preset=small epochs=1 …; quiet=false shows each run's own progress).
--
-- Writes runs/ablation/nmt_ablation_dims-<UTC stamp>.md and .h5 (rows score × width: test BLEU
-- mean ± std, val BLEU, parameters, s/epoch, seeds, failed; rewritten after every run) and
-- …-<stamp>.png, drawn by `./bench plot ablation <table.h5> [--out fig.png]`. A failed run is
-- reported and counted; the sweep goes on and ends with an error naming the failures.
-- (lua/penumbra/compare.lua, M.sweep, does the running and the files.)
local compare = require 'penumbra.compare'
local home = os.getenv('PENUMBRA_HOME') or '.'

return compare.sweep {
  name = 'nmt_ablation_dims',
  args = rawget(_G, 'args'),
  keys = { scores = 'dot,umbral,penumbral', dims = '16,32,64,128' },
  pass = { quiet = 'true' },
  rows = function(k)
    local rows = {}
    local dims = {}
    for _, w in ipairs(compare.list(k.dims)) do
      local n = tonumber(w)
      if not n or n < 1 or n % 1 ~= 0 then
        error("nmt_ablation_dims: dims must be whole numbers >= 1 (e.g. dims=16,32), got '" .. w .. "'", 0)
      end
      dims[#dims + 1] = n
    end
    for _, score in ipairs(compare.list(k.scores)) do
      for _, w in ipairs(dims) do
        rows[#rows + 1] = { name = score .. ' qk_dim=' .. w, script = home .. '/experiments/nmt_multi30k_' .. score .. '.lua',
                            overrides = { qk_dim = w }, attrs = { score = score, qk_dim = w } }
      end
    end
    if #rows == 0 then error('nmt_ablation_dims: no rows (scores= and dims= must not be empty)', 0) end
    return rows
  end,
  metric = 'bleu',
  columns = { { 'score', 'score' }, { 'q/k width', 'qk_dim' } },
  attrs = { x = 'qk_dim', series = 'score', xlabel = 'q/k width per head' },
  figure = { kind = 'ablation' },
}
