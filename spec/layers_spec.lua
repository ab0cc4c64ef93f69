-- docs/internals.md's layers are the code's: every module of lua/ratewise
-- is named in exactly one layer of its "Layers" section, and no module
-- requires one of a higher layer. The layers are read from the page, so
-- the page and the code cannot drift apart.

local read_file = require("spec.support.server").read_file

local function read(path)
  return assert(read_file(path), path)
end

-- Every module under lua/ratewise, by name ("ratewise.fetch.plan") -> path.
local function modules()
  local found = {}
  local p = assert(io.popen("cd lua && find ratewise -name '*.lua' | sort"))
  for path in p:lines() do
    local name = path:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
    found[name] = "lua/" .. path
  end
  p:close()
  return found
end

-- The layers as docs/internals.md names them: a list of the patterns each
-- numbered item of "## Layers" gives in backticks: `headers` or
-- `scheduler.lua` (one module), `fetch/` or `hosts/` (every module under
-- it). Layer 1 is the C core.
local function documented_layers()
  local page = read("docs/internals.md")
  local section = assert(page:match("\n## Layers\n(.-)\n## "), "docs/internals.md has no Layers section")
  local items, current = {}, nil
  for line in (section .. "\n"):gmatch("(.-)\n") do
    local number, rest = line:match("^(%d)%. (.*)$")
    if number then
      current = { number = tonumber(number), text = rest }
      items[#items + 1] = current
    elseif current and line:match("^%s+%S") then
      current.text = current.text .. " " .. line
    else
      current = nil
    end
  end
  local layers = {}
  for _, entry in ipairs(items) do
    local number, item = entry.number, entry.text
    local names = {}
    for quoted in item:gmatch("`([^`]+)`") do
      local dir = quoted:match("^([%w_]+)/$")
      if dir then
        names[#names + 1] = { prefix = "ratewise." .. dir .. "." }
      elseif quoted:match("^[%w_]+%.lua$") or quoted:match("^[%w_]+$") then
        local name = quoted:gsub("%.lua$", "")
        names[#names + 1] = { module = name == "init" and "ratewise" or "ratewise." .. name }
      end
    end
    layers[number] = names
  end
  return layers
end

local function layer_of(layers, module)
  local found
  for number, names in pairs(layers) do
    for _, n in ipairs(names) do
      if n.module == module or n.prefix and module:sub(1, #n.prefix) == n.prefix then
        if found and found ~= number then
          error(module .. " is named in layers " .. found .. " and " .. number .. " of docs/internals.md")
        end
        found = number
      end
    end
  end
  return found
end

-- The ratewise modules a file requires: `require "ratewise.x"`,
-- `require("ratewise.x")`, and `pcall(require, "ratewise.dir." .. name)`
-- (any module under dir).
local function required(text)
  text = text:gsub("%-%-[^\n]*", "") -- comments name modules too
  local names = {}
  for name in text:gmatch("require%s*%(?%s*[\"'](ratewise[%w_.]*)[\"']") do names[#names + 1] = name end
  for prefix in text:gmatch("require%s*,%s*[\"'](ratewise%.[%w_.]*%.)[\"']%s*%.%.") do
    names[#names + 1] = prefix .. "*"
  end
  return names
end

describe("the layers of docs/internals.md", function()
  local layers = documented_layers()
  local all = modules()

  it("are four, read from the page", function()
    assert.equal(4, #layers)
    for i = 2, 4 do assert.is_true(#layers[i] > 0, "layer " .. i .. " names no module") end
  end)

  it("name every module in exactly one layer", function()
    local missing = {}
    for name in pairs(all) do
      if not layer_of(layers, name) then missing[#missing + 1] = name end
    end
    table.sort(missing)
    assert.same({}, missing, "modules docs/internals.md's Layers section does not name")
  end)

  it("hold: no module requires one of a higher layer", function()
    local wrong = {}
    for name, path in pairs(all) do
      local mine = layer_of(layers, name)
      for _, wanted in ipairs(required(read(path))) do
        local theirs
        if wanted == "ratewise.core" then
          theirs = 1
        elseif wanted:sub(-1) == "*" then
          theirs = layer_of(layers, wanted:sub(1, -2) .. "x")
        else
          theirs = layer_of(layers, wanted)
        end
        if mine and theirs and theirs > mine then
          wrong[#wrong + 1] = string.format("%s (layer %d) requires %s (layer %d)", name, mine, wanted, theirs)
        end
      end
    end
    table.sort(wrong)
    assert.same({}, wrong)
  end)

  it("read requires as the code writes them", function()
    assert.same({ "ratewise.core", "ratewise.fetch.plan", "ratewise.providers.*" },
      required('local core = require "ratewise.core"\nlocal p = require("ratewise.fetch.plan")\n'
        .. 'local ok, m = pcall(require, "ratewise.providers." .. name)'))
  end)
end)
