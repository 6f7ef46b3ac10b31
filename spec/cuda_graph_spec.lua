-- cuda_graph_spec.lua — the CUDA twins of ops/matmul.c, ops/sparse_matmul.c, graph/csr.c,
-- attention/rowmap.c (every map of maps.c and hyperbolic.c) and attention/graph.c (graph
-- attention for every registry score × normalize × self loops × einstein, dropout, learnable
-- parameters, the per-edge weights) against the CPU kernels: awkward sizes (1, primes, more rows
-- or nodes than a block has threads), transposed / sliced / broadcast operands, a node with no
-- in-edges, values and gradients. f32 within 1e-5 relative (the attention within 2e-5: the
-- device's online softmax sums in another order), f64 within 1e-12 (1e-11 for the attention).
-- In the interpreter build the cases run under three thread orders (fwd, rev, rand:3); on a GPU
-- once; pending in a build without CUDA.
local pn = require 'penumbra'
local check = require 'spec.helpers.check'
local cu = require 'spec.helpers.cuda'

local cuda = pn.cuda.available()
local it_cuda = cuda and it or pending
local SCHEDULES, TOL = cu.SCHEDULES, cu.TOL
local ATOL = { f32 = 2e-5, f64 = 1e-11 }
local each, numel, rnd, close = cu.each, cu.numel, cu.rnd, cu.close

-- op(inputs…) on the CPU and on cuda from the same values (cu.compare; dt names the case)
local function compare(what, dt, tol, op, inputs, grads) return cu.compare(what, tol, op, inputs, grads) end
local msg = cu.msg

-- ---- matmul ----------------------------------------------------------------------------------------
describe('cuda matmul (cuBLAS)', function()
  local T = function(x) return x:transpose(-1, -2) end
  local CASES = {
    { '1x1 @ 1x1', { 1, 1 }, { 1, 1 } },
    { 'prime sizes', { 7, 13 }, { 13, 5 } },
    { 'vector @ matrix', { 13 }, { 13, 5 } },
    { 'matrix @ vector', { 7, 13 }, { 13 } },
    { 'dot product', { 11 }, { 11 } },
    { 'batched, uniform strides', { 6, 7, 5 }, { 6, 5, 3 } },
    { 'batch broadcast: shared b (one tall GEMM)', { 2, 3, 7, 5 }, { 5, 4 } },
    { 'batch broadcast both ways (per-batch loop)', { 3, 1, 7, 5 }, { 4, 5, 11 } },
    { 'batched vector', { 5 }, { 3, 5, 2 } },
    { 'empty inner dim', { 3, 0 }, { 0, 4 } },
    { 'transposed lhs', { 5, 7 }, { 5, 3 }, function(a, b) return T(a):matmul(b) end },
    { 'transposed rhs', { 7, 5 }, { 3, 5 }, function(a, b) return a:matmul(T(b)) end },
    { 'both transposed, batched', { 4, 5, 7 }, { 4, 3, 5 }, function(a, b) return T(a):matmul(T(b)) end },
    { 'sliced lhs (a row stride)', { 9, 6 }, { 4, 3 }, function(a, b) return a:narrow(2, 2, 4):matmul(b) end },
    { 'expanded rhs (stride 0, copied)', { 3, 4, 5 }, { 1, 5, 2 },
      function(a, b) return a:matmul(b:expand(3, 5, 2)) end },
  }
  it_cuda('matches the CPU at awkward sizes, broadcast batches and transposed operands, values and gradients', function()
    each(function(dt)
      for n, c in ipairs(CASES) do
        local f = c[4] or function(a, b) return a:matmul(b) end
        compare('matmul ' .. c[1] .. ' ' .. dt, dt, TOL[dt], function(_, a, b) return f(a, b) end,
          { rnd(c[2], dt, n), rnd(c[3], dt, 100 + n) }, { true, true })
      end
    end)
  end)
  it_cuda('multiplies past one block and keeps NaN', function()
    each(function(dt)
      compare('matmul 300x129 ' .. dt, dt, TOL[dt], function(_, a, b) return a:matmul(b) end,
        { rnd({ 300, 129 }, dt, 3), rnd({ 129, 17 }, dt, 4) })
      local a = rnd({ 3, 4 }, dt, 5)
      a = pn.where(pn.tensor({ { 0, 0, 0, 0 }, { 0, 1, 0, 0 }, { 0, 0, 0, 0 } }, { dtype = 'u8' }),
        pn.full({ 3, 4 }, 0 / 0, { dtype = dt }), a)
      compare('matmul NaN ' .. dt, dt, TOL[dt], function(_, x, y) return x:matmul(y) end, { a, rnd({ 4, 2 }, dt, 6) })
    end, { SCHEDULES[1] })
  end)
  -- pn.linear: the bias written into the output, cuBLAS adding onto it (beta = 1)
  it_cuda('linear adds the bias through the GEMM: values and gradients of x, w and b', function()
    each(function(dt)
      compare('linear batched ' .. dt, dt, TOL[dt], function(_, x, w, b) return pn.linear(x, w, b) end,
        { rnd({ 2, 7, 13 }, dt, 7), rnd({ 5, 13 }, dt, 8), rnd({ 5 }, dt, 9) + 40 }, { true, true, true })
      compare('linear 1-D x, no bias ' .. dt, dt, TOL[dt], function(_, x, w) return pn.linear(x, w) end,
        { rnd({ 13 }, dt, 10), rnd({ 5, 13 }, dt, 11) }, { true, true })
      compare('linear no inputs ' .. dt, dt, TOL[dt], function(_, x, w, b) return pn.linear(x, w, b) end,
        { rnd({ 3, 0 }, dt, 12), rnd({ 4, 0 }, dt, 13), rnd({ 4 }, dt, 14) })
    end)
  end)
end)

-- ---- matmul_sparse_lhs -----------------------------------------------------------------------------
describe('cuda matmul_sparse_lhs', function()
  -- a mostly-zero (M, K): about one entry in 7 nonzero, a row and a column of zeros
  local function sparse(M, K, dt, seed)
    local r, v = check.rng(seed), {}
    for i = 1, M * K do
      local row, col = math.floor((i - 1) / K), (i - 1) % K
      local x = r:u()
      v[i] = (x < 0.15 and row ~= 2 and col ~= 1) and (2 * r:u() - 1) or 0
    end
    return pn.tensor(v, { dtype = dt }):reshape({ M, K })
  end
  it_cuda('matches the CPU, values and gradients of both operands', function()
    each(function(dt)
      for n, s in ipairs({ { 1, 1, 1 }, { 5, 3, 2 }, { 37, 300, 5 }, { 131, 17, 3 } }) do
        compare(string.format('spmm %dx%dx%d %s', s[1], s[2], s[3], dt), dt, TOL[dt],
          function(_, a, b) return pn.matmul_sparse_lhs(a, b) end,
          { sparse(s[1], s[2], dt, n), rnd({ s[2], s[3] }, dt, 50 + n) }, { true, true })
      end
    end)
  end)
end)

-- ---- graph csr -------------------------------------------------------------------------------------
describe('cuda graph csr', function()
  local function same(edges, n, o, what)
    local ref = pn.graph(edges, n, o)
    local got = pn.graph(edges:to('cuda'), n, o)
    assert.equal('cuda', got.offsets:device(), what)
    assert.same(check.vals(ref.offsets), check.vals(got.offsets:to('cpu')), what .. ' offsets')
    assert.same(check.vals(ref.src), check.vals(got.src:to('cpu')), what .. ' src')
  end
  it_cuda('builds the same CSR (i32, i64, strided edges, self loops, empty graphs)', function()
    local r = check.rng(9)
    local e = {}
    for i = 1, 400 do e[i] = { math.floor(r:u() * 151), math.floor(r:u() * 151) } end
    for _, dt in ipairs({ 'i64', 'i32' }) do
      local E = pn.tensor(e, { dtype = dt })
      for _, loops in ipairs({ true, false }) do
        same(E, 151, { self_loops = loops }, dt .. ' loops ' .. tostring(loops))
        same(E:transpose(1, 2):contiguous():transpose(1, 2), 151, { self_loops = loops }, dt .. ' strided')
      end
      same(pn.zeros({ 0, 2 }, { dtype = dt }), 1, {}, 'N = 1, no edges')
      same(pn.zeros({ 0, 2 }, { dtype = dt }), 0, {}, 'N = 0')
      same(pn.tensor({ { 0, 0 }, { 0, 0 } }, { dtype = dt }), 1, {}, 'duplicate self loops')
    end
  end)
  it_cuda('rejects a node id out of range with the CPU message', function()
    local E = pn.tensor({ { 0, 1 }, { 1, 5 } }, { dtype = 'i64' })
    local ok1, e1 = pcall(pn.graph, E, 3)
    local ok2, e2 = pcall(pn.graph, E:to('cuda'), 3)
    assert.is_false(ok1)
    assert.is_false(ok2)
    assert.equal(msg(e1), msg(e2))
  end)
end)

-- ---- row maps --------------------------------------------------------------------------------------
describe('cuda row maps (maps.*, hyper.*)', function()
  local S = 0.6 -- points inside the unit ball: coordinates in (−S/2, S/2) for D = 4
  local ONE = {
    { 'psi', function(x) return pn.maps.psi(x) end },
    { 'xi', function(x) return pn.maps.xi(x, { h = 0.7 }) end },
    { 'pseudopolar', function(x) return pn.maps.pseudopolar(x) end },
    { 'exp0', function(x) return pn.maps.exp0(x) end },
    { 'exp0 h, scale_last', function(x) return pn.maps.exp0(x, { h = 1.1, scale_last = true }) end },
    { 'expmap0', function(x) return pn.hyper.expmap0(x, 0.8) end },
    { 'logmap0', function(x) return pn.hyper.logmap0(x * S, 1) end },
    { 'project', function(x) return pn.hyper.project(x * 2, 1.3) end },
    { 'to_klein poincare', function(x) return pn.hyper.to_klein(x * S, { from = 'poincare' }) end },
    { 'from_klein poincare', function(x) return pn.hyper.from_klein(x * S, { to = 'poincare' }) end },
    { 'from_klein hyperboloid', function(x) return pn.hyper.from_klein(x * S, { to = 'hyperboloid', c = 0.7 }) end },
    { 'to_klein hyperboloid', function(x)
      return pn.hyper.to_klein(pn.maps.pseudopolar(x), { from = 'hyperboloid' }) end },
  }
  local TWO = {
    { 'mobius_add', function(x, y) return pn.hyper.mobius_add(x * S, y * S, 1) end },
    { 'dist', function(x, y) return pn.hyper.dist(x * S, y * S, 0.9) end },
  }
  it_cuda('every one-point map: values and gradients over more rows than a block, strided', function()
    each(function(dt)
      for n, m in ipairs(ONE) do
        compare(m[1] .. ' ' .. dt, dt, TOL[dt], function(_, x) return m[2](x) end,
          { rnd({ 3, 97, 4 }, dt, n, -0.5, 0.5) }, { true })
        compare(m[1] .. ' transposed, D = 3 ' .. dt, dt, TOL[dt],
          function(_, x) return m[2](x:transpose(1, 2)) end, { rnd({ 3, 5 }, dt, 20 + n, -0.5, 0.5) }, { true })
        compare(m[1] .. ' one point ' .. dt, dt, TOL[dt], function(_, x) return m[2](x) end,
          { rnd({ 2 }, dt, 40 + n, -0.5, 0.5) }, { true })
      end
    end)
  end)
  it_cuda('the two-point ops broadcast their leading dims', function()
    each(function(dt)
      for n, m in ipairs(TWO) do
        compare(m[1] .. ' ' .. dt, dt, TOL[dt], function(_, x, y) return m[2](x, y) end,
          { rnd({ 2, 131, 4 }, dt, n, -0.5, 0.5), rnd({ 131, 4 }, dt, 10 + n, -0.5, 0.5) }, { true, true })
        compare(m[1] .. ' broadcast x ' .. dt, dt, TOL[dt], function(_, x, y) return m[2](x, y) end,
          { rnd({ 1, 4 }, dt, 30 + n, -0.5, 0.5), rnd({ 3, 7, 4 }, dt, 40 + n, -0.5, 0.5) }, { true, true })
      end
      -- the cone point x = y: distance 0, gradient 0 on both
      local x = rnd({ 5, 3 }, dt, 60, -0.3, 0.3)
      compare('dist x = x ' .. dt, dt, TOL[dt], function(_, a, b) return pn.hyper.dist(a, b, 1) end, { x, x:clone() },
        { true, true })
    end)
  end)
  it_cuda('NaN stays NaN, and a rejected point is reported as on the CPU (the first one)', function()
    each(function(dt)
      local v = rnd({ 200, 3 }, dt, 7, -0.5, 0.5)
      -- points 150 and 170 outside the ball (row-major from 1: the message names 151)
      local t = v:totable()
      t[151] = { 2, 0, 0 }
      t[171] = { 3, 0, 0 }
      local bad = pn.tensor(t, { dtype = dt })
      local ok1, e1 = pcall(pn.hyper.logmap0, bad, 1)
      local ok2, e2 = pcall(pn.hyper.logmap0, bad:to('cuda'), 1)
      assert.is_false(ok1)
      assert.is_false(ok2)
      assert.equal(msg(e1), msg(e2))
      assert.truthy(tostring(e2):find('point 151', 1, true), tostring(e2))
      t[151] = { 0 / 0, 0, 0 }
      t[171] = { 0.1, 0, 0 }
      local nanx = pn.tensor(t, { dtype = dt })
      compare('psi NaN ' .. dt, dt, TOL[dt], function(_, x) return pn.maps.psi(x) end, { nanx })
    end, { SCHEDULES[1] })
  end)
end)

-- ---- graph attention ---------------------------------------------------------------------------------
describe('cuda graph attention', function()
  local VARIANTS = pn.attention_variants({ all = true })
  local FORMS = cu.forms(VARIANTS)
  -- the parameters a form reads (as tensors per head, cu.params_of), probed on graph_attention
  local function params_of(name, model, D, aggregate)
    local probe = pn.full({ 3, 1, D }, 0.2, { dtype = 'f64' })
    local g = pn.graph({ { 0, 1 } }, 3)
    local gat = VARIANTS[name].domain:find('a_l, a_r', 1, true)
    return cu.params_of(VARIANTS, name, model, D, function(o)
      if gat then o.a_l, o.a_r = pn.zeros({ 1, D }, { dtype = 'f64' }), pn.zeros({ 1, D }, { dtype = 'f64' }) end
      return pcall(pn.graph_attention, probe, probe, probe, g, o)
    end, aggregate)
  end

  -- edges of a graph on N nodes: a ring, some chords, duplicates; node `lonely` gets no in-edge
  local function edges_of(N, lonely, seed)
    local r, e = check.rng(seed), {}
    for i = 0, N - 1 do
      local j = (i + 1) % N
      if j ~= lonely and N > 1 then e[#e + 1] = { i, j } end
    end
    for _ = 1, 2 * N do
      local a, b = math.floor(r:u() * N), math.floor(r:u() * N)
      if b ~= lonely then e[#e + 1] = { a, b } end
    end
    return e
  end

  -- one configuration on both devices: the output (or the weights) and every gradient
  local function run_case(what, dt, tol, cfg)
    local N, H, D, Dv = cfg.N, cfg.H, cfg.D, cfg.Dv
    local e = edges_of(N, cfg.lonely, cfg.seed)
    local gcpu = pn.graph(#e > 0 and pn.tensor(e, { dtype = 'i64' }) or pn.zeros({ 0, 2 }, { dtype = 'i64' }), N,
      { self_loops = cfg.loops })
    local inputs = { rnd({ N, H, D }, dt, cfg.seed + 1, 0.05, 0.45), rnd({ N, H, D }, dt, cfg.seed + 2, 0.05, 0.45),
                     rnd({ N, H, Dv }, dt, cfg.seed + 3, -0.3, 0.3) }
    local names = {}
    for i, p in ipairs(cfg.params) do
      inputs[#inputs + 1] = rnd({ H }, dt, cfg.seed + 10 + i, p.lo, p.hi)
      names[#names + 1] = p.name
    end
    if cfg.gat then
      inputs[#inputs + 1] = rnd({ H, D }, dt, cfg.seed + 20)
      inputs[#inputs + 1] = rnd({ H, D }, dt, cfg.seed + 21)
      names[#names + 1], names[#names + 2] = 'a_l', 'a_r'
    end
    local grads = {}
    for i = 1, #inputs do grads[i] = true end
    if cfg.weights then grads[3] = nil end -- the weights do not read v
    compare(what, dt, tol, function(dev, q, k, v, ...)
      local extra = { ... }
      local o = { score = cfg.score, model = cfg.model, normalize = cfg.normalize, aggregate = cfg.aggregate }
      for i, nm in ipairs(names) do o[nm] = extra[i] end
      local g = gcpu
      if dev == 'cuda' then g = { offsets = gcpu.offsets:to('cuda'), src = gcpu.src:to('cuda'), num_nodes = N,
                                  num_edges = gcpu.num_edges } end
      if cfg.dropout then
        o.dropout, o.train = cfg.dropout, true
        pn.manual_seed(cfg.seed) -- the same Philox draws on both devices
      end
      if cfg.weights then return pn.graph_attention_weights(q, k, g, o) end
      return pn.graph_attention(q, k, v, g, o)
    end, inputs, grads)
  end

  local function cfg_of(form, over)
    local name, model = form[1], form[2]
    local c = { score = name, model = model, N = 13, H = 2, D = 4, Dv = 3, loops = true, lonely = 5, seed = 11,
                gat = VARIANTS[name].domain:find('a_l, a_r', 1, true) ~= nil }
    for k, v in pairs(over or {}) do c[k] = v end
    c.params = params_of(name, model, c.D, c.aggregate)
    return c
  end

  local function label(c)
    return string.format('%s%s %s%s%s N=%d', c.score, c.model and ('/' .. c.model) or '', c.normalize or 'softmax',
      c.aggregate and (' ' .. c.aggregate) or '', c.loops and ' loops' or ' no-loops', c.N)
  end

  it_cuda('every score × normalize × self loops × einstein: values and gradients (q, k, v, parameters, a_l, a_r)', function()
    cu.each_form(FORMS, { 'softmax', 'sigmoid', 'sigmoid_normalized' }, function(dt, s, form, norm)
      for _, loops in ipairs({ true, false }) do
        for _, agg in ipairs({ false, 'einstein' }) do
          local c = cfg_of(form, { normalize = norm, loops = loops, aggregate = agg or nil })
          run_case(label(c) .. ' ' .. dt .. ' ' .. s, dt, ATOL[dt], c)
        end
      end
    end, { SCHEDULES[1] })
  end)

  it_cuda('N = 1, a prime N with a lonely node, more nodes than a block, (N, D) inputs, under every schedule', function()
    each(function(dt, s)
      for _, form in ipairs(FORMS) do
        for _, over in ipairs({ { N = 1, lonely = -1 }, { N = 1, lonely = 0, loops = false },
                                { N = 151, lonely = 7, loops = false }, { N = 17, H = 1 } }) do
          local c = cfg_of(form, over)
          run_case(label(c) .. ' H=' .. c.H .. ' ' .. dt .. ' ' .. s, dt, ATOL[dt], c)
        end
      end
    end)
  end)

  it_cuda('the per-edge weights and dropout (the same Philox mask on both devices)', function()
    cu.each_form(FORMS, { 'softmax', 'sigmoid_normalized' }, function(dt, s, form, norm)
      local c = cfg_of(form, { normalize = norm, weights = true })
      run_case('weights ' .. label(c) .. ' ' .. dt .. ' ' .. s, dt, ATOL[dt], c)
      c = cfg_of(form, { normalize = norm, dropout = 0.3 })
      run_case('dropout ' .. label(c) .. ' ' .. dt .. ' ' .. s, dt, ATOL[dt], c)
    end)
  end)

  it_cuda('NaN in q gives NaN rows as on the CPU; a point off the manifold is the CPU error', function()
    each(function(dt)
      local N, H, D = 6, 2, 4
      local g = pn.graph({ { 0, 1 }, { 1, 2 }, { 2, 3 }, { 3, 4 }, { 4, 5 } }, N)
      local gc = { offsets = g.offsets:to('cuda'), src = g.src:to('cuda'), num_nodes = N, num_edges = g.num_edges }
      local t = rnd({ N, H, D }, dt, 3, 0.05, 0.45):totable()
      t[3][1][2] = 0 / 0
      local q, k, v = pn.tensor(t, { dtype = dt }), rnd({ N, H, D }, dt, 4, 0.05, 0.45), rnd({ N, H, 3 }, dt, 5)
      local ref = pn.graph_attention(q, k, v, g, { score = 'dot' })
      local got = pn.graph_attention(q:to('cuda'), k:to('cuda'), v:to('cuda'), gc, { score = 'dot' })
      close(got, ref, ATOL[dt], 'dot with a NaN query')
      t[3][1][D] = -0.5
      t[3][1][2] = 0.2
      q = pn.tensor(t, { dtype = dt })
      local ok1, e1 = pcall(pn.graph_attention, q, k, v, g, { score = 'umbral' })
      local ok2, e2 = pcall(pn.graph_attention, q:to('cuda'), k:to('cuda'), v:to('cuda'), gc, { score = 'umbral' })
      assert.is_false(ok1)
      assert.is_false(ok2)
      assert.equal(msg(e1), msg(e2))
      local ok3, e3 = pcall(pn.graph_attention, k, k, v * 3, g, { score = 'dot', aggregate = 'einstein' })
      local ok4, e4 = pcall(pn.graph_attention, k:to('cuda'), k:to('cuda'), (v * 3):to('cuda'), gc,
        { score = 'dot', aggregate = 'einstein' })
      assert.is_false(ok3)
      assert.is_false(ok4)
      assert.equal(msg(e3), msg(e4))
    end, { SCHEDULES[1] })
  end)
end)
