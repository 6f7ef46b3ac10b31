-- A full disk stops a run cleanly: status failed, a message naming the disk, and a run file
-- that h5dump and ./bench show still read (experiment.lua: the run file keeps a reserve, the
-- checkpoint goes to its own file through a temporary name). Tested on a real small tmpfs,
-- which needs root (CI runs as root); elsewhere the spec is skipped, saying so.
local pn = require 'penumbra'

local home = os.getenv('PENUMBRA_HOME') or '.'
local function sh(cmd)
  local ok = os.execute(cmd)
  return ok == 0 or ok == true
end
local is_root = io.popen('id -u'):read('*l') == '0'

describe('a full disk', function()
  local mnt
  local function mount(kib)
    mnt = os.tmpname()
    os.remove(mnt)
    assert.is_true(sh("mkdir -p '" .. mnt .. "'"))
    return sh(string.format("mount -t tmpfs -o size=%dk tmpfs '%s' 2>/dev/null", kib, mnt))
  end
  after_each(function()
    if mnt then sh("umount '" .. mnt .. "' 2>/dev/null; rmdir '" .. mnt .. "' 2>/dev/null") end
    mnt = nil
  end)

  -- runs script with the runs directory on the tmpfs; returns rc, output, the run file
  local function run(script, lua)
    local f = io.open(script, 'w')
    f:write(lua)
    f:close()
    local out = os.tmpname()
    local ok = sh(string.format("cd '%s' && PENUMBRA_RUNS='%s' ./bench '%s' >'%s' 2>&1", home, mnt, script, out))
    local text = io.open(out):read('*a')
    os.remove(out)
    os.remove(script)
    local p = io.popen("ls '" .. mnt .. "'/*/*.h5 2>/dev/null | head -1")
    local path = p:read('*l')
    p:close()
    return ok, text, path
  end

  local function readable(path)
    assert.truthy(path, 'no run file')
    assert.is_true(sh("h5dump -H '" .. path .. "' >/dev/null 2>&1"), 'h5dump cannot read ' .. path)
    assert.is_true(sh("cd '" .. home .. "' && ./bench show '" .. path .. "' >/dev/null 2>&1"), './bench show fails')
    return pn.io.attrs(path, '/')
  end

  it('while the run file grows: it stops before the disk is full, status failed', function()
    if not is_root or not mount(600) then return pending('needs root to mount a small tmpfs') end
    assert.is_true(sh("head -c 250000 /dev/zero > '" .. mnt .. "/filler'"))
    local ok, text, path = run(os.tmpname() .. '.lua', string.format(
      "dofile('%s/spec/fixtures/toy_experiment.lua')({ epochs = '100000', patience = '100000', _quiet = true })\n", home))
    assert.is_false(ok)
    assert.truthy(text:find('is full', 1, true), text)
    local a = readable(path)
    assert.equal('failed', a.status)
    assert.truthy(a.error:find('is full', 1, true))
    assert.truthy(pn.io.load(path, 'metrics/loss'):numel() >= 1)
  end)

  it('when the checkpoint does not fit: the run file is untouched by it and says why', function()
    if not is_root or not mount(700) then return pending('needs root to mount a small tmpfs') end
    local ok, text, path = run(os.tmpname() .. '.lua', string.format(
      "args = { epochs = '20' }\ndofile('%s/experiments/cora_umbral.lua')\n", home))
    assert.is_false(ok)
    assert.truthy(text:find('is full', 1, true), text)
    local a = readable(path)
    assert.equal('failed', a.status)
    assert.truthy(a.error:find('checkpoint', 1, true), a.error)
    assert.is_nil(io.open(path:gsub('%.h5$', '.ckpt.tmp'), 'rb')) -- the failed checkpoint left nothing
  end)
end)
