-- require "ratewise" loads what every program needs (the core, the
-- scheduler and the seam, the hosts found without configuration); what
-- only some calls need (rw.client, rw.fetch, the limiters, the circuit,
-- Redis, the CLI) is loaded on its first use, the same
-- value from then on. A fresh interpreter, so nothing an earlier spec
-- loaded hides what require "ratewise" itself loads.
local subprocess = require "spec.support.subprocess"

local SCRIPT = [[
local rw = require "ratewise"
local loaded = {}
for name in pairs(package.loaded) do
  if name:match("^ratewise") then loaded[#loaded + 1] = name end
end
table.sort(loaded)
print("loaded " .. table.concat(loaded, " "))
local fetch = rw.fetch
print("same " .. tostring(fetch == require("ratewise.fetch").fetch and rw.fetch == fetch
  and rw.client == require("ratewise.client").new and rw.policy == require("ratewise.policy")
  and rw.providers.github == require("ratewise.providers.github")))
print("missing " .. tostring(rw.no_such_field))
]]

describe("require \"ratewise\"", function()
  local out

  setup(function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(SCRIPT)
    f:close()
    local code
    out, code = subprocess.shell(subprocess.lua_command(path))
    os.remove(path)
    assert.equal(0, code, out)
  end)

  it("loads no module a call may not need", function()
    local loaded = assert(out:match("loaded ([^\n]*)"), out)
    for _, name in ipairs { "ratewise.client", "ratewise.fetch", "ratewise.adaptive", "ratewise.redis",
        "ratewise.redis_bucket", "ratewise.shared_bucket", "ratewise.circuit", "ratewise.limiters",
        "ratewise.retry_budget", "ratewise.cli", "ratewise.response" } do
      assert.is_nil(loaded:find(name .. " ", 1, true) or loaded:match(name:gsub("%.", "%%.") .. "$"),
        name .. " was loaded: " .. loaded)
    end
  end)

  it("loads each on its first use, the same value from then on", function()
    assert.matches("same true", out)
    assert.matches("missing nil", out)
  end)
end)
