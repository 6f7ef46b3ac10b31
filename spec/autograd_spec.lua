-- The autograd engine (core/autograd.c): accumulation, graph freeing, no_grad, detach,
-- shared subgraphs, long chains, and its errors.
local pn = require 'penumbra'

local function err_of(fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, 'expected an error')
  return tostring(e)
end

describe('autograd', function()
  it('accumulates leaf gradients across backward calls (+=)', function()
    local x = pn.tensor({ 1, 2, 3 }, { dtype = 'f64', requires_grad = true })
    ;(x * x):sum():backward()
    assert.same({ 2, 4, 6 }, x.grad:totable())
    ;(x * 3):sum():backward()
    assert.same({ 5, 7, 9 }, x.grad:totable())
    x:zero_grad()
    assert.is_nil(x.grad)
  end)

  it('sums gradients over every use of a tensor (diamond graph)', function()
    local x = pn.tensor({ 0.5, -1.5 }, { dtype = 'f64', requires_grad = true })
    local a = x * x          -- uses x twice
    local y = (a + x + a * x):sum()   -- d/dx = 2x + 1 + 3x^2
    y:backward()
    local g = x.grad:totable()
    assert.near(2 * 0.5 + 1 + 3 * 0.25, g[1], 1e-12)
    assert.near(2 * -1.5 + 1 + 3 * 2.25, g[2], 1e-12)
  end)

  it('adds a second gradient in place only into a buffer nobody else holds', function()
    -- add's backward hands one gradient tensor to both of its inputs, so u's and v's sums start
    -- out sharing it; u's second gradient must not be added into that shared buffer (v would
    -- see it too). Both orders of u's two gradients, and a fan-in of four held alone.
    local c = pn.tensor({ 0.5, -1, 2 }, { dtype = 'f64' })
    local w = pn.tensor({ 3, 0.25, -4 }, { dtype = 'f64' })
    for _, order in ipairs({ 'add first', 'mul first' }) do
      local x = pn.tensor({ 1, 2, 3 }, { dtype = 'f64', requires_grad = true })
      local u, v = x * 2, x * 3
      local l1, l2 = ((u + v) * c):sum(), (u * w):sum()
      local loss = order == 'add first' and l1 + l2 or l2 + l1
      loss:backward()
      local g, cc, ww = x.grad:totable(), c:totable(), w:totable()
      for i = 1, 3 do
        assert.near(2 * (cc[i] + ww[i]) + 3 * cc[i], g[i], 1e-12, order .. ' x.grad[' .. i .. ']')
      end
    end
    local x = pn.tensor({ 1, -2 }, { dtype = 'f64', requires_grad = true })
    local h = x * 1
    ;(h * 2 + h * 3 + h * 5 + h):sum():backward()
    assert.same({ 11, 11 }, x.grad:totable())
  end)

  it('frees the graph after backward unless retain_graph', function()
    local x = pn.tensor({ 1, 2 }, { dtype = 'f64', requires_grad = true })
    local y = (x * x):sum()
    y:backward({ retain_graph = true })
    y:backward()
    assert.same({ 4, 8 }, x.grad:totable())
    local e = err_of(function() y:backward() end)
    assert.truthy(e:find('backward: the graph of .* was freed'), e)
  end)

  it('records nothing under no_grad and stops at detach', function()
    local x = pn.tensor({ 1, 2 }, { requires_grad = true })
    local y = pn.no_grad(function() return x * 2 end)
    assert.is_false(y.requires_grad)
    assert.equal('', y:grad_fn())
    assert.is_true(pn.grad_enabled())
    local z = (x * 2):detach()
    assert.is_false(z.requires_grad)
    local w = (x:detach() * x):sum()
    w:backward()
    assert.same({ 1, 2 }, x.grad:totable()) -- only the non-detached factor carries gradient
  end)

  it('restores grad mode when the no_grad function raises', function()
    local ok = pcall(pn.no_grad, function() error('boom') end)
    assert.is_false(ok)
    assert.is_true(pn.grad_enabled())
  end)

  it('gives a custom seed gradient to non-scalar outputs', function()
    local x = pn.tensor({ 1, 2, 3 }, { dtype = 'f64', requires_grad = true })
    local y = x * x
    y:backward(pn.tensor({ 1, 0, 2 }, { dtype = 'f64' }))
    assert.same({ 2, 0, 12 }, x.grad:totable())
  end)

  it('reports misuse with clear errors', function()
    local x = pn.tensor({ 1, 2 }, { requires_grad = true })
    assert.truthy(err_of(function() (x * 2):backward() end):find('backward: tensor %[2%] has 2 elements'))
    assert.truthy(err_of(function() pn.tensor({ 1 }):backward() end):find('does not require grad'))
    assert.truthy(err_of(function() (x * 2):requires_grad_() end):find('not a leaf'))
    assert.truthy(err_of(function() pn.tensor({ 1 }, { dtype = 'i32' }):requires_grad_() end):find('only f32/f64'))
    assert.truthy(err_of(function() (x * 2):backward(pn.ones(3)) end):find('backward: grad'))
  end)

  it('handles long chains without recursion and frees every node', function()
    collectgarbage(); collectgarbage()
    local nodes0 = pn.live_nodes()
    local x = pn.tensor({ 1 }, { dtype = 'f64', requires_grad = true })
    local y = x
    for _ = 1, 20000 do y = y * 1.0001 end
    assert.truthy(pn.live_nodes() >= nodes0 + 20000)
    y:sum():backward()
    assert.near(1.0001 ^ 20000, x.grad:item(), 1e-6 * 1.0001 ^ 20000)
    y = nil
    collectgarbage(); collectgarbage()
    assert.equal(nodes0, pn.live_nodes())
  end)

  it('frees a dropped graph that never ran backward', function()
    collectgarbage(); collectgarbage()
    local nodes0, t0 = pn.live_nodes(), pn.live_tensors()
    do
      local x = pn.randn({ 4, 4 }, { requires_grad = true })
      local y = x
      for _ = 1, 50 do y = (y * 0.5 + x):tanh() end
    end
    collectgarbage(); collectgarbage()
    assert.equal(nodes0, pn.live_nodes())
    assert.equal(t0, pn.live_tensors())
  end)
  it('records every input of a node, however many (cat of 12, broadcasting after stack of 10)', function()
    local ts, w = {}, {}
    for i = 1, 12 do
      ts[i] = pn.randn({i, 3}, {dtype = 'f64', requires_grad = true})
      w[i] = pn.randn({i, 3}, {dtype = 'f64'})
    end
    ;(pn.cat(ts, 1) * pn.cat(w, 1)):sum():backward()
    for i = 1, 12 do
      assert.same({i, 3}, ts[i].grad:shape())
      local g, e = ts[i].grad:totable(), w[i]:totable()
      for r = 1, i do for c = 1, 3 do assert.equal(e[r][c], g[r][c]) end end
    end
    local ss = {}
    for i = 1, 10 do ss[i] = pn.randn({2, 1}, {dtype = 'f64', requires_grad = true}) end
    (pn.stack(ss, 1) * pn.full({10, 2, 4}, 1.5, {dtype = 'f64'})):sum():backward()
    for i = 1, 10 do assert.same({{6}, {6}}, ss[i].grad:totable()) end
  end)
end)

describe('gradient sums at threaded sizes', function()
  -- accumulate (a tensor used twice) and sum_to (a broadcast bias) split their work across
  -- threads past 32768 elements: by chunks of rows, and by spans of columns. Each element's
  -- additions keep one order, so one and two threads agree to the bit.
  it('accumulate and sum_to equal a naive sum and do not depend on the thread count', function()
    local R, C = 211, 300 -- 63300 elements; C not a multiple of 16
    pn.manual_seed(3)
    local a, b, g = pn.randn(R, C), pn.randn(R, C), pn.randn(R, C)
    local results = {}
    local threads = pn.num_threads()
    for _, nt in ipairs({ 1, 2 }) do
      pn.set_num_threads(nt)
      local x = pn.zeros({ R, C }, { requires_grad = true })
      local bias = pn.zeros({ C }, { requires_grad = true })
      local y = (x * a) + (x * b) + bias -- x's two uses accumulate; bias's gradient sums over rows
      y:backward(g)
      results[nt] = { x = x.grad:totable(), bias = bias.grad:totable() }
    end
    pn.set_num_threads(threads)
    local ga, gb, gg = (g * a):totable(), (g * b):totable(), g:totable()
    local xs, bs = results[1].x, results[1].bias
    for i = 1, R, 7 do
      for j = 1, C, 13 do
        local want = ga[i][j] + gb[i][j]
        assert.is_true(math.abs(xs[i][j] - want) <= 1e-6 * math.max(1, math.abs(want)), ('x.grad[%d][%d]'):format(i, j))
      end
    end
    for j = 1, C do
      local want = 0
      for i = 1, R do want = want + gg[i][j] end
      assert.is_true(math.abs(bs[j] - want) <= 1e-4, ('bias.grad[%d] %g against %g'):format(j, bs[j], want))
    end
    assert.same(results[1].x, results[2].x)
    assert.same(results[1].bias, results[2].bias)
  end)
end)

describe('grad mode and coroutines', function()
  it('a coroutine that yields inside no_grad does not turn gradients off for its resumer', function()
    local co = coroutine.create(function()
      pn.no_grad(function()
        coroutine.yield(pn.grad_enabled())
        coroutine.yield(pn.grad_enabled())
      end)
      return pn.grad_enabled()
    end)
    local _, inside = coroutine.resume(co)
    assert.is_false(inside)
    assert.is_true(pn.grad_enabled()) -- back in the resumer
    local x = pn.tensor({ 1, 2 }, { dtype = 'f64', requires_grad = true })
    assert.truthy((x * 2).requires_grad)
    local _, inside2 = coroutine.resume(co)
    assert.is_false(inside2) -- still off inside, where no_grad is active
    local _, after = coroutine.resume(co)
    assert.is_true(after)
    local gen = coroutine.wrap(function() pn.no_grad(function() coroutine.yield(1) end) end)
    gen()
    assert.is_true(pn.grad_enabled())
  end)
end)

describe('in-place updates of saved tensors', function()
  it('are refused at backward instead of giving a wrong gradient', function()
    local x = pn.tensor({ 1, 2, 3 }, { dtype = 'f64', requires_grad = true })
    local w = pn.tensor({ 4, 5, 6 }, { dtype = 'f64' })
    local y = (x * w):sum()
    w:fill_(0) -- mul saved w: the gradient wrt x would silently be 0
    local ok, e = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('modified in place', 1, true), tostring(e))
    assert.truthy(tostring(e):find('mul', 1, true), tostring(e))
  end)

  it('an optimiser step between forward and backward is refused; the usual order works', function()
    local lin = pn.nn.Linear(3, 1, { dtype = 'f64' })
    local opt = pn.optim.SGD(lin, { lr = 0.1 })
    local x = pn.tensor({ { 1, 2, 3 } }, { dtype = 'f64', requires_grad = true })
    local loss = lin(x):sum()
    for _, p in ipairs(lin:parameters()) do p.grad = pn.ones_like(p) end
    opt:step() -- the weight matmul saved changes under it
    local ok, e = pcall(function() loss:backward() end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('modified in place', 1, true), tostring(e))
    opt:zero_grad()
    local loss2 = lin(x):sum()
    loss2:backward() -- forward, backward, then step: fine
    opt:step()
    assert.truthy(x.grad)
  end)

  it('views share the version: an update through a view is seen too', function()
    local x = pn.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = 'f64', requires_grad = true })
    local w = pn.tensor({ { 1, 1 }, { 1, 1 } }, { dtype = 'f64' })
    local y = (x * w):sum()
    w:narrow(1, 2, 1):fill_(7)
    assert.is_false(pcall(function() y:backward() end))
  end)
end)
