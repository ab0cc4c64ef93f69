-- core.digest: HMAC-SHA256 by libcrypto, rw.client's request keys.
local core = require "ratewise.core"

local function hex(s)
  return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

describe("core.digest", function()
  it("is HMAC-SHA256 (RFC 4231, test cases 1 and 3)", function()
    assert.equal("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
      hex(core.digest(string.rep("\11", 20), "Hi There")))
    assert.equal("773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
      hex(core.digest(string.rep("\170", 20), string.rep("\221", 50))))
  end)

  it("refuses a key too short to be secret, or what is not a string", function()
    assert.error_matches(function() core.digest("short", "x") end, "must be 16 to 64 bytes")
    assert.error_matches(function() core.digest(string.rep("k", 32), nil) end, "string expected")
  end)
end)
