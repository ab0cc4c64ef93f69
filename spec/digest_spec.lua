-- core.digest: SipHash-2-4 (128-bit output) by libcrypto, rw.client's request keys.
local core = require "ratewise.core"

local function hex(s)
  return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- The bytes 0, 1, ..., n - 1.
local function counting(n)
  local bytes = {}
  for i = 1, n do bytes[i] = string.char(i - 1) end
  return table.concat(bytes)
end

describe("core.digest", function()
  it("is SipHash-2-4 with a 128-bit output (the SipHash paper's vectors)", function()
    -- key 00 01 .. 0f, messages 00 01 .. n-1 (vectors_sip128 of the
    -- reference implementation; `openssl mac -macopt size:16 SIPHASH`)
    local key = counting(16)
    for n, mac in pairs {
      [0] = "a3817f04ba25a8e66df67214c7550293",
      [1] = "da87c1d86b99af44347659119b22fc45",
      [2] = "8177228da4a45dc7fca38bdef60affe4",
      [3] = "9c70b60c5267a94e5f33b6b02985ed51",
      [7] = "a1f1ebbed8dbc153c0b84aa61ff08239",
      [8] = "3b62a9ba6258f5610f83e264f31497b4",
      [15] = "5493e99933b0a8117e08ec0f97cfc3d9",
      [16] = "6ee2a4ca67b054bbfd3315bf85230577",
      [63] = "5150d1772f50834a503e069a973fbd7c",
    } do
      assert.equal(mac, hex(core.digest(key, counting(n))), "message of " .. n .. " bytes")
    end
  end)

  it("refuses a key that is not SipHash's 16 bytes, or what is not a string", function()
    assert.error_matches(function() core.digest("short", "x") end, "must be 16 bytes")
    assert.error_matches(function() core.digest(string.rep("k", 32), "x") end, "must be 16 bytes")
    assert.error_matches(function() core.digest(string.rep("k", 16), nil) end, "string expected")
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
    local key = string.rep("\11", 16)
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
    assert.are_not.equal(d { "a" }, core.digester(string.rep("\12", 16)) { "a" })
  end)

  it("refuses a key that is not 16 bytes, or a part that is not a string", function()
    assert.error_matches(function() core.digester("short") end, "must be 16 bytes")
    assert.error_matches(function() core.digester(string.rep("k", 32)) end, "must be 16 bytes")
    local d = core.digester(string.rep("k", 16))
    assert.error_matches(function() d { "a", 1 } end, "part 2 is not a string")
    assert.error_matches(function() d "a" end, "table expected")
  end)
end)
