-- experiments/perf/graph_gen.lua — the random hyperbolic graph generator (core/graph/
-- hyperbolic.c) against NetworKit's HyperbolicGenerator, the generator a user would pick
-- (von Looz et al.; PyPI `networkit`, in a venv under build/ — never a project dependency).
--
--   ./bench experiments/perf/graph_gen.lua [n=1e4,1e5,1e6] [degree=10] [exponent=3] [rounds=3]
--                                          [threads=2] [peer=1] [stat_seeds=8]
--
-- Threshold model (T = 0). Each round: ours (in this process, the generation call only), then
-- NetworKit (a child process that times generate() only, after a warm-up) — taking turns
-- round by round; medians over the rounds. Also per n: the mean degree (target `degree`) and
-- the power-law exponent by maximum likelihood over degrees >= 2·degree (target `exponent`),
-- each as the mean ± std over `stat_seeds` graphs (seeds 1…; one graph's mean degree at
-- n = 10⁴ moves by ±5 % from seed to seed: the hubs of a power law with exponent 3), and
-- edges per second beside the published anchors. Targets: n = 10⁶ at degree 10 in <= 1 s
-- on 2 cores; faster than NetworKit at n = 10⁵ and 10⁶.
-- The peer: build/venv-peers/bin/python with networkit
--   python3 -m venv build/venv-peers && build/venv-peers/bin/pip install networkit
local pn = require 'penumbra'
local bk = require 'penumbra.benchkit'
local stats = require 'penumbra.stats'

args = args or {}
local Ns = bk.list(args.n, '1e4,1e5,1e6')
local degree = tonumber(args.degree or 10)
local exponent = tonumber(args.exponent or 3)
local rounds = tonumber(args.rounds or 3)
local threads = tonumber(args.threads or 2)
local stat_seeds = tonumber(args.stat_seeds or 8)
pn.set_num_threads(threads)
local here = (arg and arg[0] or 'experiments/perf/graph_gen.lua'):match('^(.*)/[^/]*$') or '.'
local py, pyinfo = bk.python('networkit')
local have_peer = args.peer ~= '0' and py ~= nil

bk.header('random hyperbolic graphs: penumbra vs NetworKit HyperbolicGenerator', {
  string.format('threshold model, degree %g, exponent %g, %d threads for both, median of %d rounds', degree, exponent,
    threads, rounds),
  have_peer and ('peer: ' .. pyinfo .. ' (' .. py .. ')') or ('peer: ' .. pyinfo),
})

local function mle(deg, dmin)
  local s, m = 0, 0
  for _, d in ipairs(deg) do if d >= dmin then s = s + math.log(d / (dmin - 0.5)); m = m + 1 end end
  return m > 0 and 1 + m / s or 0 / 0
end

local function peer(n)
  local cmd = string.format('%s %s/graph_gen_networkit.py --n %d --degree %g --exponent %g --threads %d 2>&1', py, here,
    n, degree, exponent, threads)
  local p = io.popen(cmd)
  local out = p:read('*a')
  p:close()
  local ms, e = out:match('time ([%d%.]+) edges (%d+)')
  if not ms then error('graph_gen: the NetworKit peer failed:\n' .. out, 0) end
  return tonumber(ms), tonumber(e)
end

print(string.format('\n%9s %10s %10s %9s %12s %12s %9s %16s %15s', 'n', 'ours ms', 'nk ms', 'ours/nk', 'ours edges/s',
  'nk edges/s', 'nk deg', 'mean deg (seeds)', 'exponent'))
local results = {}
for _, n in ipairs(Ns) do
  local ours, theirs = {}, {}
  local h, E, nkE
  for _ = 1, rounds do
    collectgarbage('collect')
    local t0 = bk.now()
    h = pn.graph.hyperbolic{ n = n, degree = degree, exponent = exponent, seed = 1 }
    ours[#ours + 1] = (bk.now() - t0) * 1e3
    E = h.edges:shape()[1] / 2
    if have_peer then
      local ms
      ms, nkE = peer(n)
      theirs[#theirs + 1] = ms
    end
  end
  local mo = bk.median(ours)
  local mt = have_peer and bk.median(theirs) or nil
  local degs, exps = {}, {}
  for seed = 1, stat_seeds do
    local hs = seed == 1 and h or pn.graph.hyperbolic{ n = n, degree = degree, exponent = exponent, seed = seed }
    degs[seed] = hs.edges:shape()[1] / n
    exps[seed] = mle(pn.graph.degrees(hs.edges, n):totable(), 2 * degree)
  end
  local dm, ds = stats.mean_std(degs)
  local em, es = stats.mean_std(exps)
  print(string.format('%9d %10.1f %10s %9s %12.3g %12s %9s %9.3f±%-6.3f %8.3f±%-6.3f', n, mo,
    mt and string.format('%.1f', mt) or '-', mt and string.format('%.2f', mo / mt) or '-', E / (mo / 1e3),
    mt and string.format('%.3g', nkE / (mt / 1e3)) or '-', nkE and string.format('%.3f', 2 * nkE / n) or '-', dm, ds,
    em, es))
  results[#results + 1] = { n = n, ours = mo, peer = mt, deg = dm, exponent = em }
end
print('\nanchors: von Looz et al. 2016 ~1e9 edges/minute on a workstation (1.7e7 edges/s);'
  .. ' Penschuck 2017 (NkGen) ~3.7e8 edges/s')
print(string.format('targets: n = 1e6 in <= 1000 ms (%s); faster than NetworKit at 1e5 and 1e6 (%s)',
  (function() for _, r in ipairs(results) do if r.n == 1e6 then return string.format('%.0f ms', r.ours) end end return 'not run' end)(),
  (function()
    if not have_peer then return 'no peer' end
    local s = {}
    for _, r in ipairs(results) do if r.n >= 1e5 then s[#s + 1] = string.format('%.2f× at %g', r.ours / r.peer, r.n) end end
    return table.concat(s, ', ')
  end)()))
do
  local s = {}
  for _, r in ipairs(results) do
    s[#s + 1] = string.format('n=%g: degree %+.1f %%, exponent %+.3f', r.n, 100 * (r.deg / degree - 1), r.exponent - exponent)
  end
  print(string.format('statistics (%d seeds each; targets: degree within 5 %%, exponent within ±0.2): %s', stat_seeds,
    table.concat(s, '; ')))
end
return results
