-- penumbra.json: the JSON of run files (lua-cjson underneath, our number format and key order)
local json = require 'penumbra.json'

describe('json', function()
  it('encodes objects with sorted keys, so the same config gives the same bytes', function()
    local a = json.encode({ zeta = 1, alpha = 'x', mid = { b = 2, a = 1 } })
    assert.equal('{"alpha":"x","mid":{"a":1,"b":2},"zeta":1}', a)
    local t = {}
    for i = 20, 1, -1 do t['k' .. i] = i end
    assert.equal(json.encode(t), json.encode(t))
  end)

  it('round-trips numbers exactly (17 digits; cjson alone keeps 14)', function()
    for _, x in ipairs({ 0.1, 1 / 3, 2 ^ -30, 123456789.123456789, -2.5e-300, 1e22, 3 }) do
      assert.equal(x, json.decode(json.encode({ x = x })).x)
    end
    assert.equal('[1,-7,4503599627370496]', json.encode({ 1, -7, 2 ^ 52 }))
  end)

  it('writes NaN and infinities as null, read back as nil', function()
    assert.equal('[1,null,null,null]', json.encode({ 1, 0 / 0, math.huge, -math.huge }))
    local v = json.decode('{"a":null,"b":[1,null,3]}')
    assert.is_nil(v.a)
    assert.equal(1, v.b[1]); assert.is_nil(v.b[2]); assert.equal(3, v.b[3])
  end)

  it('escapes strings: quotes, newlines, control characters, UTF-8 kept', function()
    local s = 'a"b\\c\nd\te\1é'
    assert.equal(s, json.decode(json.encode({ s = s })).s)
    assert.is_nil(json.encode({ s = s }):find('\n', 1, true))
  end)

  it('reads the \\ddd escapes older run files carry (control characters, from %q)', function()
    assert.equal('a\1b', json.decode('{"s":"a\\1b"}').s)
    assert.equal('x\r\0y', json.decode('{"s":"x\\13\\0y"}').s)
  end)

  it('names the problem on bad input', function()
    local ok, err = pcall(json.decode, '{"a":')
    assert.is_false(ok)
    assert.truthy(tostring(err):find('json:', 1, true))
    ok, err = pcall(json.decode, 42)
    assert.is_false(ok)
    assert.truthy(tostring(err):find('expected a string', 1, true))
  end)
end)
