-- penumbra.stats: the one mean_std / median / clock the library and the benchmarks share
local stats = require 'penumbra.stats'

describe('stats', function()
  it('mean and sample standard deviation (n − 1)', function()
    local m, s = stats.mean_std({ 2, 4, 4, 4, 5, 5, 7, 9 })
    assert.equal(5, m)
    assert.is_true(math.abs(s - math.sqrt(32 / 7)) < 1e-12)
    m, s = stats.mean_std({ 3 })
    assert.equal(3, m); assert.equal(0, s)
    m, s = stats.mean_std({})
    assert.is_true(m ~= m and s ~= s)
    m = stats.mean_std({ 1, 0 / 0 })
    assert.is_true(m ~= m) -- NaN in, NaN out
  end)

  it('median of odd and even counts, without reordering its input', function()
    local xs = { 5, 1, 3 }
    assert.equal(3, stats.median(xs))
    assert.same({ 5, 1, 3 }, xs)
    assert.equal(2.5, stats.median({ 4, 1, 2, 3 }))
    assert.is_true(stats.median({}) ~= stats.median({}))
  end)

  it('the clock is monotonic and in seconds', function()
    local t0 = stats.now()
    local t1 = stats.now()
    assert.is_true(t1 >= t0)
    os.execute('sleep 0.05')
    local dt = stats.now() - t1
    assert.is_true(dt > 0.04 and dt < 5, 'sleep 0.05 measured ' .. dt .. ' s')
  end)

  it('is the mean_std the library uses', function()
    assert.equal(stats.mean_std, require('penumbra.compare').mean_std)
    assert.equal(stats.mean_std, require('penumbra.plot').mean_std)
    assert.equal(stats.now, require('penumbra.experiment').now)
  end)
end)
