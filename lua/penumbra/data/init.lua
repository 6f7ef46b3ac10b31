-- penumbra.data — datasets. Files are looked up in $PENUMBRA_DATA, then <repo>/datasets,
-- then <repo>/../shared/datasets (DESIGN §5); a missing file is an error naming every path
-- tried and how to get the data.
local data = {}

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() return true end
  return false
end

function data.search_path()
  local home = os.getenv('PENUMBRA_HOME') or '.'
  local dirs = {}
  local env = os.getenv('PENUMBRA_DATA')
  if env and env ~= '' then dirs[#dirs + 1] = env end
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
    '\nSet PENUMBRA_DATA to the folder that holds it; datasets/README.md says where the data comes from ' ..
    'and how to convert it.', 2)
end

data.planetoid = require('penumbra.data.planetoid')(data)

return data
