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

describe("core.digester", function()
  -- Each part as its length (LEB128: 7 bits a byte, least significant
  -- first, the high bit set on all but the last), then its bytes.
  local function framed(parts)
    local out = {}
    for i, s in ipairs(parts) do
      local len, bytes = #s, {}
      while len >= 128 do
        bytes[#bytes + 1] = string.char(128 + len % 128)
        len = math.floor(len / 128)
      end
      bytes[#bytes + 1] = string.char(len)
      out[i] = table.concat(bytes) .. s
    end
    return table.concat(out)
  end

  it("is core.digest of its parts, each framed by its length, under its key", function()
    local key = string.rep("\11", 20)
    local d = assert(core.digester(key))
    for _, parts in ipairs {
      {},
      { "Hi There" },
      { "GET", "http://h/", "no body", "headers", "authorization", "Bearer x" },
      { "", "" },
      { string.rep("b", 127), string.rep("b", 128), string.rep("c", 16384) }, -- lengths of one, two, three bytes
      { string.rep("b", 1000), "c", string.rep("d", 5000) }, -- past the digester's buffer
    } do
      assert.equal(hex(core.digest(key, framed(parts))), hex(d(parts)))
    end
    -- used again, it starts over from its key
    assert.equal(d { "a", "b" }, d { "a", "b" })
    assert.are_not.equal(d { "ab" }, d { "a", "b" })
    assert.are_not.equal(d { "a" }, core.digester(string.rep("\12", 20)) { "a" })
  end)

  it("refuses a key too short to be secret, or a part that is not a string", function()
    assert.error_matches(function() core.digester("short") end, "must be 16 to 64 bytes")
    local d = core.digester(string.rep("k", 32))
    assert.error_matches(function() d { "a", 1 } end, "part 2 is not a string")
    assert.error_matches(function() d "a" end, "table expected")
  end)
end)
