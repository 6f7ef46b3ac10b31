-- pn.nn modules and pn.optim: gradients against finite differences, optimisers against
-- hand-computed steps, state_dict round trips through HDF5.
local pn = require 'penumbra'
local gradcheck = require 'spec.helpers.gradcheck'
local nn, optim = pn.nn, pn.optim

local function f64_module(m)
  -- convert every parameter of m to f64 in place of the f32 ones (for gradchecks)
  for _, np in ipairs(m:named_parameters()) do
    local path, t = np[1], np[2]
    local owner, key = m, path
    for part in path:gmatch('([^%.]+)%.') do owner = owner[part] end
    key = path:match('([^%.]+)$')
    owner:param(key, t:to('f64'))
  end
  return m
end

describe('nn modules', function()
  it('Linear computes x Wᵀ + b and has the right parameter count', function()
    pn.manual_seed(1)
    local l = nn.Linear(3, 2)
    assert.equal(8, l:num_parameters())
    local x = pn.tensor({ { 1, 2, 3 } })
    local w, b = l.weight:totable(), l.bias:totable()
    local y = l(x):totable()
    for o = 1, 2 do
      local want = b[o]
      for i = 1, 3 do want = want + w[o][i] * i end
      assert.near(want, y[1][o], 1e-5)
    end
  end)

  it('Linear, LayerNorm, Embedding, Sequential gradients match finite differences', function()
    pn.manual_seed(2)
    local m = f64_module(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.LayerNorm(5), nn.Linear(5, 3)))
    local x = pn.randn({ 2, 4 }, { dtype = 'f64' })
    local params = m:parameters()
    local fn = function(...) return m(x) end
    gradcheck(fn, params)
    local e = f64_module(nn.Embedding(6, 3))
    local idx = pn.tensor({ 0, 5, 2, 5 }, { dtype = 'i64' })
    gradcheck(function() return e(idx) end, e:parameters())
  end)

  it('named_parameters follow registration order; train/eval propagate', function()
    local m = nn.Sequential(nn.Linear(2, 3), nn.Dropout(0.5), nn.Linear(3, 1))
    local names = {}
    for i, np in ipairs(m:named_parameters()) do names[i] = np[1] end
    assert.same({ '1.weight', '1.bias', '3.weight', '3.bias' }, names)
    m:eval()
    assert.is_false(m['2'].training)
    local x = pn.ones(4, 2)
    assert.same(m(x):totable(), m(x):totable()) -- dropout off in eval
  end)

  it('state_dict round-trips through HDF5 bit-exactly and load_state_dict checks shapes', function()
    pn.manual_seed(3)
    local a = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    local b = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    local path = os.tmpname() .. '.h5'
    a:save(path)
    b:load(path)
    for name, t in pairs(a:state_dict()) do
      local u = b:state_dict()[name]
      assert.same(t:totable(), u:totable()) -- f32 → Lua double is exact: equal means bit-equal
    end
    os.remove(path)
    local c = nn.Sequential(nn.Linear(3, 5))
    local ok, e = pcall(function() c:load_state_dict(a:state_dict()) end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('load_state_dict'))
  end)

  it('initialisers respect their bounds', function()
    pn.manual_seed(4)
    local w = nn.init.xavier_uniform_(pn.empty({ 50, 30 }))
    local a = math.sqrt(6 / 80)
    assert.truthy(w:max():item() <= a and w:min():item() >= -a)
    assert.truthy(w:max():item() > 0.8 * a)
    local k = nn.init.kaiming_uniform_(pn.empty({ 40, 20 }))
    local bnd = math.sqrt(2) * math.sqrt(3 / 20)
    assert.truthy(k:max():item() <= bnd and k:min():item() >= -bnd)
  end)
end)

describe('optimisers', function()
  local function param(v) return pn.tensor(v, { dtype = 'f64' }):requires_grad_() end
  local function set_grad(p, g) p.grad = pn.tensor(g, { dtype = 'f64' }) end

  it('SGD with momentum and nesterov matches hand-computed steps', function()
    local p = param({ 1.0, -2.0 })
    local opt = optim.SGD({ p }, { lr = 0.1, momentum = 0.9, weight_decay = 0.01 })
    set_grad(p, { 0.5, 1.0 }); opt:step()
    -- d = g + wd·p = (0.51, 0.98); buf = d; p -= lr·buf
    local v = p:totable()
    assert.near(1 - 0.051, v[1], 1e-12); assert.near(-2 - 0.098, v[2], 1e-12)
    set_grad(p, { 0.5, 1.0 }); opt:step()
    local d1 = 0.5 + 0.01 * (1 - 0.051)
    local b1 = 0.9 * 0.51 + d1
    assert.near(1 - 0.051 - 0.1 * b1, p:totable()[1], 1e-12)
    local q = param({ 1.0 })
    local nes = optim.SGD({ q }, { lr = 0.1, momentum = 0.5, nesterov = true })
    set_grad(q, { 2.0 }); nes:step()   -- buf = 2; d = 2 + 0.5·2 = 3
    assert.near(0.7, q:item(), 1e-12)
    -- nesterov without momentum would be plain SGD in disguise (PyTorch refuses it too); an
    -- integer tensor cannot be trained; a device or dtype that does not exist is named
    assert.has_error(function() optim.SGD({ q }, { lr = 0.1, nesterov = true }) end,
      'SGD: nesterov needs momentum > 0 and dampening 0, got momentum 0, dampening 0')
    assert.has_error(function() optim.SGD({ q }, { lr = 0.1, nesterov = true, momentum = 0.9, dampening = 0.1 }) end,
      'SGD: nesterov needs momentum > 0 and dampening 0, got momentum 0.9, dampening 0.1')
    assert.has_error(function() optim.Adam({ q, pn.ones({ 2 }, { dtype = 'i64' }) }) end,
      'optimiser: parameter 2 [2] has dtype i64; only f32 and f64 tensors are trained')
    -- flags are booleans: a truthy 0 or 'false' would keep dropout on at evaluation
    assert.has_error(function() pn.dropout(pn.ones({ 2 }), 0.5, 'no') end, 'dropout: train must be true or false, got no')
    assert.has_error(function() nn.Linear(2, 2):train(0) end, 'train: mode must be true or false, got 0')
    assert.has_error(function() nn.Linear(2, 2):to('gpu') end,
      "to: unknown dtype or device 'gpu' (f32, f64, i32, i64, u8; cpu, cuda)")
  end)

  it('Adam and AdamW match hand-computed steps', function()
    local p = param({ 1.0 })
    local opt = optim.Adam({ p }, { lr = 0.1, weight_decay = 0.1 })
    set_grad(p, { 0.5 }); opt:step()
    -- g = 0.5 + 0.1·1 = 0.6; m = 0.06, v = 0.00036; m̂ = 0.6, v̂ = 0.36; p -= 0.1·0.6/(0.6+1e-8)
    assert.near(1 - 0.1 * 0.6 / (0.6 + 1e-8), p:item(), 1e-12)
    local q = param({ 1.0 })
    local w = optim.AdamW({ q }, { lr = 0.1, weight_decay = 0.1 })
    set_grad(q, { 0.5 }); w:step()
    -- decoupled: p = 1 − 0.1·0.1·1 = 0.99, then − 0.1·0.5/(0.5+1e-8)
    assert.near(0.99 - 0.1 * 0.5 / (0.5 + 1e-8), q:item(), 1e-12)
    set_grad(q, { -0.2 }); w:step()
    local m = 0.9 * 0.05 + 0.1 * -0.2
    local v = 0.999 * 0.00025 + 0.001 * 0.04
    local mh, vh = m / (1 - 0.81), v / (1 - 0.999 ^ 2)
    local before = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8)
    assert.near(before * (1 - 0.01) - 0.1 * mh / (math.sqrt(vh) + 1e-8), q:item(), 1e-10)
  end)

  -- the f32 update runs vectorised in blocks of 8192 elements over the threads, in double,
  -- without FMA contraction: bit for bit the formula evaluated in double here, rounded to f32
  it('Adam and AdamW on f32 parameters equal the double formula rounded to f32, bit for bit', function()
    local ffi = require 'ffi'
    local function f32(x) return tonumber(ffi.new('float[1]', x)[0]) end
    local n, prev = 3 * 8192 + 7, pn.num_threads()
    pn.set_num_threads(2)
    for _, decoupled in ipairs({ false, true }) do
      local lr, b1, b2, eps, wd = 0.01, 0.9, 0.98, 1e-8, 0.1
      pn.manual_seed(decoupled and 2 or 1)
      local p = (pn.randn({ n }) * 3):requires_grad_()
      local ref, m, v = p:totable(), {}, {}
      for i = 1, n do m[i], v[i] = 0, 0 end
      local opt = (decoupled and optim.AdamW or optim.Adam)({ p }, { lr = lr, betas = { b1, b2 }, eps = eps, weight_decay = wd })
      for step = 1, 3 do
        local g = pn.randn({ n }) * (step == 2 and 1e-3 or 1)
        g = pn.where(g:abs():lt(0.05), pn.zeros({ n }), g) -- some exact zeros: v stays 0 there
        p.grad = g
        opt:step()
        local gt = g:totable()
        local step_size, bc2 = lr / (1 - b1 ^ step), math.sqrt(1 - b2 ^ step)
        for i = 1, n do
          local pi, gi = ref[i], gt[i]
          if decoupled then pi = pi - lr * wd * pi else gi = gi + wd * pi end
          local mi = b1 * m[i] + (1 - b1) * gi
          local vi = b2 * v[i] + (1 - b2) * gi * gi
          m[i], v[i] = f32(mi), f32(vi)
          ref[i] = f32(pi - step_size * mi / (math.sqrt(vi) / bc2 + eps))
        end
        local got = p:totable()
        for i = 1, n do
          if got[i] ~= ref[i] then
            pn.set_num_threads(prev)
            error(string.format('%s step %d element %d: %.9g, want %.9g', decoupled and 'AdamW' or 'Adam', step, i,
              got[i], ref[i]))
          end
        end
      end
    end
    pn.set_num_threads(prev)
  end)

  it('clips gradients by global norm', function()
    local a, b = param({ 3.0 }), param({ 4.0 })
    set_grad(a, { 3 }); set_grad(b, { 4 })
    local n = optim.clip_grad_norm({ a, b }, 1)
    assert.near(5, n, 1e-12)
    assert.near(0.6, a.grad:item(), 1e-5); assert.near(0.8, b.grad:item(), 1e-5)
  end)

  it('schedules shape the learning rate', function()
    local p = param({ 1.0 })
    local opt = optim.SGD({ p }, { lr = 1 })
    local s = optim.Scheduler(opt, 'linear_warmup', { warmup = 4 })
    assert.near(0.25, opt.lr, 1e-12)
    s:step(); s:step(); s:step(); s:step()
    assert.near(1, opt.lr, 1e-12)
    local f = optim.schedules.inverse_sqrt({ warmup = 4 })
    assert.near(0.5, f(2), 1e-12); assert.near(1, f(4), 1e-12); assert.near(0.5, f(16), 1e-12)
    local c = optim.schedules.cosine({ total = 10 })
    assert.near(1, c(0), 1e-12); assert.near(0.5, c(5), 1e-12); assert.near(0, c(10), 1e-12)
    local ok, e = pcall(optim.Scheduler, opt, 'nope')
    assert.truthy(tostring(e):find('unknown schedule'))
    -- a missing optimiser or a missing total is named, at the caller's line
    ok, e = pcall(function() local s = optim.Scheduler(nil, 'inverse_sqrt', { warmup = 10 }) return s end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('nn_spec%.lua:%d+: Scheduler: opt must be an optimiser'), tostring(e))
    ok, e = pcall(function() local s = optim.Scheduler(opt, 'cosine', { warmup = 10 }) return s end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('nn_spec%.lua:%d+: Scheduler cosine: total %(the number of steps%) is required'),
      tostring(e))
  end)

  -- A message names the line of the script that called into the library, however deep the
  -- failing check sits (an op under a module, a module inside a module, an op reached through a
  -- tail call, which leaves no frame): not a line of penumbra's own files, and not no line.
  it('errors name the caller\'s line, not one inside the library', function()
    local here = debug.getinfo(1, 'S').short_src:gsub('%p', '%%%0')
    local ln = nn.LayerNorm(4)
    local cases = {
      { function() local y = pn.ones({ 2, 5 }):matmul(pn.ones({ 4, 3 })) return y end, 'matmul: a %[2,5%] and b %[4,3%]' },
      { function() local y = pn.ones({ 2, 5 }) + pn.ones({ 4, 3 }) return y end, 'add: shapes %[2,5%] and %[4,3%]' },
      { function() local y = pn.layer_norm(pn.ones({ 2, 5 }), ln.weight, ln.bias) return y end, 'layer_norm: weight %[4%]' },
      { function() local y = ln(pn.ones({ 2, 5 })) return y end, 'layer_norm: weight %[4%]' },
      { function() local y = nn.Embedding(10, 4)(pn.tensor({ 1, 12 }, { dtype = 'i64' })) return y end,
        'embedding: idx value 12' },
      { function() local y = nn.Sequential(nn.Linear(4, 3), nn.Linear(4, 2))(pn.ones({ 1, 4 })) return y end,
        'Linear%(4 → 2%): x %[1,3%]' },
      { function() local y = nn.MultiheadAttention(8, 2)(pn.ones({ 1, 3, 7 })) return y end,
        'MultiheadAttention: x_q %[1,3,7%]' },
      { function() local y = nn.GATConv(4, 4, { heads = 2 })(pn.ones({ 3, 4 })) return y end,
        'GATConv: g must be a graph of the 3 nodes of x %(pn.graph%), got nil' },
      { function() local y = nn.GATConv(4, 4, { heads = 2 })(pn.ones({ 3, 5 }), pn.graph({ { 0, 1 } }, 3)) return y end,
        'GATConv%(4 → 2×4%): x must be %(N, 4%), got %[3,5%]' },
      { function() local y = nn.GATConv(4, 4, { heads = 2 })(pn.ones({ 3, 4 }), pn.graph({ { 0, 1 } }, 2)) return y end,
        'GATConv: g must be a graph of the 3 nodes of x %(pn.graph%), got 2 nodes' },
      { function() local y = pn.ones({ 2, 3 }):sum(0) return y end, 'sum: dim 0 is invalid' },
      -- options checks reached through a helper that tail-called options.check
      { function() local y = pn.ones({ 2 }, { dtyp = 'f64' }) return y end, "ones: unknown option 'dtyp'" },
      { function() local y = pn.zeros_like(nil) return y end, 'zeros_like: x must be a tensor, got nil' },
      { function() local y = pn.ones_like(pn.ones({ 2 }), { dtyp = 'f64' }) return y end, "ones_like: unknown option 'dtyp'" },
      { function() local y = pn.maps.xi(pn.ones({ 2, 3 }), { hh = 1 }) return y end, "maps.xi: unknown option 'hh'" },
      { function() local y = pn.graph({ { 0, 1 } }, 2, { self_loop = false }) return y end, "graph: unknown option 'self_loop'" },
      { function() local y = nn.GATConv(4, 4, { hedas = 2 }) return y end, "GATConv: unknown option 'hedas'" },
    }
    for i, c in ipairs(cases) do
      local ok, e = pcall(c[1])
      assert.is_false(ok, i)
      e = tostring(e)
      assert.truthy(e:find('^' .. here .. ':%d+: ' .. c[2]), e)
    end
  end)
end)
