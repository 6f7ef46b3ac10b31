-- penumbra.data — datasets, found by name. Files are looked up in $PENUMBRA_DATA, then
-- <repo>/datasets, then <repo>/../shared/datasets (DESIGN §5); a missing file is an error
-- naming every path tried and how to get the data.
--
--   pn.data.load(name [, opts])     the dataset registered as name (a table; its loader's opts)
--   pn.data.list()                  registered names, sorted
--   pn.data.info(name)              { name, description, loader opts } of one
--   pn.data.register(name, loader, {description=, options={…}})
--                                   loader(opts) -> dataset; a name is registered once
--   pn.data.planetoid(name, opts)   Cora / CiteSeer (registered as 'cora', 'citeseer')
--   pn.data.scalefree{task=, n=, …} online random hyperbolic graph tasks (registered as 'scalefree')
--   pn.data.ppi{path=}              PPI from the user's DGL or GraphSAGE files (registered as 'ppi')
--   pn.data.ppi_synthetic{…}        a generated PPI-shaped set in those layouts ('ppi_synthetic')
-- A recipe loads its data by name (cfg.dataset), so a new dataset is one register() call in
-- its loader's file plus one line below; an unknown name lists the registered ones.
local data = {}
local registry = {}

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() return true end
  return false
end

local warned = {}
function data.search_path()
  local home = os.getenv('PENUMBRA_HOME') or '.'
  local dirs = {}
  local env = os.getenv('PENUMBRA_DATA')
  if env and env ~= '' then
    -- a typo must not pass unnoticed: say that the search goes on elsewhere
    local ok = os.execute("test -d '" .. env:gsub("'", "'\\''") .. "'")
    if not (ok == 0 or ok == true) and not warned[env] then
      warned[env] = true
      io.stderr:write('penumbra: PENUMBRA_DATA=' .. env .. ' is not a directory; looking in ' .. home ..
        '/datasets and ' .. home .. '/../shared/datasets instead\n')
    end
    dirs[#dirs + 1] = env
  end
  dirs[#dirs + 1] = home .. '/datasets'
  dirs[#dirs + 1] = home .. '/../shared/datasets'
  return dirs
end

-- Full path of a dataset file, or an error listing the paths tried.
function data.find(file)
  local tried = {}
  for _, d in ipairs(data.search_path()) do
    local p = d .. '/' .. file
    if exists(p) then return p end
    tried[#tried + 1] = p
  end
  error('dataset file ' .. file .. ' not found; tried:\n  ' .. table.concat(tried, '\n  ') ..
    '\nSet PENUMBRA_DATA to the folder that holds it; ../shared/datasets/README.md says where the data ' ..
    'comes from and its schema.', 2)
end

function data.register(name, loader, info)
  if type(name) ~= 'string' or name == '' then error('data.register: name must be a non-empty string', 2) end
  if type(loader) ~= 'function' then error("data.register('" .. name .. "'): loader must be a function", 2) end
  if registry[name] then error("data.register: '" .. name .. "' is already registered", 2) end
  info = info or {}
  registry[name] = { name = name, loader = loader, description = info.description or '', options = info.options or {} }
end

function data.list()
  local names = {}
  for k in pairs(registry) do names[#names + 1] = k end
  table.sort(names)
  return names
end

local function entry(name, level)
  local e = registry[name]
  if not e then
    error(string.format("data: unknown dataset '%s' (registered: %s)", tostring(name), table.concat(data.list(), ', ')),
      level + 1)
  end
  return e
end

function data.info(name)
  local e = entry(name, 2)
  return { name = e.name, description = e.description, options = e.options }
end

function data.load(name, opts)
  return entry(name, 2).loader(opts or {})
end

-- SHA-256 of a dataset file (hex), for run files to record exactly which data they used
function data.checksum(path)
  local p = io.popen("sha256sum '" .. tostring(path):gsub("'", "'\\''") .. "' 2>/dev/null")
  local line = p and p:read('*l') or nil
  if p then p:close() end
  return line and line:match('^(%x+)') or nil
end

-- the loaders (each file registers its datasets)
data.planetoid = require('penumbra.data.planetoid')(data)
data.scalefree = require('penumbra.data.scalefree')(data)
local ppi = require('penumbra.data.ppi')(data)
data.ppi = ppi.load
data.ppi_synthetic = require('penumbra.data.ppi_synthetic')(data, ppi)
data.translation = require('penumbra.data.translation').register(data) -- 'multi30k', 'iwslt14'

return data
