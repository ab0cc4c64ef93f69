-- lua/ratewise/init.lua checks that the C core it loads is from the same
-- build as the Lua modules. A core of another version is simulated with
-- package.preload: the real core's functions under another version string
-- (the check reads the version, not the transport).
local real_core = require "ratewise.core"

-- Loads "ratewise" afresh with `core` as ratewise.core; answers pcall's
-- results, and puts every module back as it was.
local function load_with(core)
  local saved = {}
  for name, module in pairs(package.loaded) do
    if name == "ratewise" or name:find("^ratewise%.") then saved[name] = module end
  end
  for name in pairs(saved) do package.loaded[name] = nil end
  package.preload["ratewise.core"] = function() return core end
  local ok, result = pcall(require, "ratewise")
  package.preload["ratewise.core"] = nil
  for name in pairs(package.loaded) do
    if name == "ratewise" or name:find("^ratewise%.") then package.loaded[name] = nil end
  end
  for name, module in pairs(saved) do package.loaded[name] = module end
  return ok, result
end

local function core_of_version(version)
  local core = {}
  for k, v in pairs(real_core) do core[k] = v end
  core.version = version
  return core
end

describe("the C core's version", function()
  it("is the Lua modules' version, rw._VERSION", function()
    local ok, rw = load_with(real_core)
    assert.is_true(ok, tostring(rw))
    assert.equal(real_core.version, rw._VERSION)
  end)

  it("of another build is refused, naming both versions and what to rebuild", function()
    local ok, err = load_with(core_of_version("0.0.9"))
    assert.is_false(ok)
    assert.matches("the C core %(ratewise.core%) is version 0%.0%.9 but these Lua modules are "
      .. real_core.version:gsub("%p", "%%%0"), err)
    assert.matches("`make`", err, 1, true)
    assert.matches("luarocks make", err, 1, true)
  end)

  it("missing, as a core too old to state one, is named unknown", function()
    local ok, err = load_with(core_of_version(nil))
    assert.is_false(ok)
    assert.matches("is version unknown but", err, 1, true)
  end)
end)
