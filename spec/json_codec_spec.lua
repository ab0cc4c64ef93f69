-- ratewise's JSON codec (ratewise/json.lua, ratewise/json/pure.lua) on its
-- own: one battery of texts and values run through each way ratewise can
-- read and write JSON: lua-cjson's decoder, a host's (Neovim's vim.json,
-- here stood in for by a decoder with a null of its own), and the pure-Lua
-- codec that reads where neither is there. Hostile texts among them: deep
-- nesting, broken escapes, bytes that are not UTF-8.
local rw = require "ratewise"
local pure = require "ratewise.json.pure"
local cjson = require "cjson"

local integers = math.type ~= nil -- Lua 5.3 and later

-- A fresh copy of ratewise.json whose require of lua-cjson fails, as on a
-- machine (or in a .love) without it; setup(fresh) may plug a host's codec
-- in. Everything is put back after check.
local function without_cjson(setup, check)
  local saved = { package.loaded["ratewise.json"], package.loaded.cjson, package.loaded["cjson.safe"],
    package.preload.cjson, package.preload["cjson.safe"] }
  package.loaded["ratewise.json"], package.loaded.cjson, package.loaded["cjson.safe"] = nil, nil, nil
  local hidden = function() error("module 'cjson' not found:\n\thidden by the spec", 0) end
  package.preload.cjson, package.preload["cjson.safe"] = hidden, hidden
  local ok, err = pcall(function()
    local fresh = require "ratewise.json"
    if setup then setup(fresh) end
    check(fresh)
  end)
  package.loaded["ratewise.json"], package.loaded.cjson, package.loaded["cjson.safe"], package.preload.cjson,
    package.preload["cjson.safe"] = saved[1], saved[2], saved[3], saved[4], saved[5]
  assert(ok, err)
end

-- A host's null: what vim.NIL is to vim.json.
local HOST_NULL = setmetatable({}, { __tostring = function() return "host null" end })

-- Each way of decoding, as run(check) calling check(json) with a module
-- that decodes that way (the encoder is the same in all).
local CODECS = {
  { name = "lua-cjson", strict = false, run = function(check) check(require "ratewise.json") end },
  { name = "the pure codec", strict = true, run = function(check) without_cjson(nil, check) end },
  { name = "a host's codec", strict = true, run = function(check)
    without_cjson(function(fresh)
      fresh.set_fallback { null = HOST_NULL, decode = function(text)
        local v, err = pure.decode(text, HOST_NULL)
        if v == nil then error(err, 0) end
        return v
      end }
    end, check)
  end },
}

-- Texts every codec reads, and what each must give (nil in a list: null).
local VALID = {
  { "0", 0 }, { "-0", 0 }, { "3", 3 }, { "-7", -7 }, { "0.5", 0.5 }, { "1e3", 1000 }, { "1E+2", 100 },
  { "2.5e-3", 0.0025 }, { "1e300", 1e300 }, { '"a"', "a" }, { '""', "" }, { "true", true }, { "false", false },
  { " \t\r\n[ 1 , 2 ] \n", { 1, 2 } }, { "[]", {} }, { "{}", {} },
  { '{"a":{"b":[true,false,"c"]}}', { a = { b = { true, false, "c" } } } },
  { '"\\" \\\\ \\/ \\b \\f \\n \\r \\t"', '" \\ / \b \f \n \r \t' },
  { '"\\u0041\\u00e9\\u20ac"', "Aé€" },
  { '"\\ud83d\\ude00"', "😀" }, -- a surrogate pair: one character
  { '"\\u0000"', "\0" },
  { '"héllo ✓ 😀"', "héllo ✓ 😀" },
  { '{"a":1,"a":2}', { a = 2 } }, -- the last of repeated names, as lua-cjson and Python keep
}

-- Texts every codec refuses.
local INVALID = {
  "", " ", "[", "]", "{", "[1,]", "[,1]", "[1 2]", '{"a":1,}', '{"a" 1}', '{a:1}', "{'a':1}", '{"a":}', "[1]]",
  "01", "-01", "-", ".5", "[1e]", "1e", "1e+", "+1", "0x10", "NaN", "Infinity", "-Infinity", "nul", "tru", "True",
  '"abc', '"\\x41"', '"\\u12"', '"\\u12G4"', '"\\ud800"', '"\\ud800\\u0041"', '"\\udc00"', "[1] [2]",
  "// c\n1", "/* c */ 1", "\239\187\191{}", -- a BOM
  string.rep("[", 1001) .. string.rep("]", 1001), -- nesting past the limit
  string.rep('{"a":', 1001) .. "1" .. string.rep("}", 1001),
  string.rep("[", 100000), -- a hostile depth: refused at the limit, not at the end of the stack
}

-- Refused by the strict decoders; lua-cjson 2.1 takes them (it reads the
-- bytes of a string as they are, and numbers as strtod does).
local INVALID_STRICT = {
  "1.", "1.e5", "-.5",
  '"a\1b"', '"a\nb"', '"tab\there"', -- control characters not escaped
  '"\255"', '"\192\175"', '"\237\160\128"', '"\244\144\128\128"', '"\226\130"', -- not UTF-8
}

for _, codec in ipairs(CODECS) do
  describe("JSON decoded by " .. codec.name, function()
    it("reads every valid text as it is written", function()
      codec.run(function(json)
        for _, case in ipairs(VALID) do
          local v, err = json.decode(case[1])
          assert(err == nil, case[1] .. ": " .. tostring(err))
          assert.same(case[2], v, case[1])
        end
      end)
    end)

    it("answers a JSON null as rw.null, everywhere in the value", function()
      codec.run(function(json)
        assert.equal(rw.null, json.null)
        local v = assert(json.decode('{"a":null,"list":[1,null,3],"deep":{"x":[null]}}'))
        assert.equal(rw.null, v.a)
        assert.equal(rw.null, v.list[2])
        assert.equal(3, #v.list)
        assert.equal(rw.null, v.deep.x[1])
        assert.equal(rw.null, json.decode("null"))
        assert.equal(cjson.null, rw.null) -- lua-cjson's null is the same value
      end)
    end)

    it("refuses every text that is not JSON, answering nil and why", function()
      codec.run(function(json)
        local list = {}
        for _, text in ipairs(INVALID) do list[#list + 1] = text end
        if codec.strict then for _, text in ipairs(INVALID_STRICT) do list[#list + 1] = text end end
        for _, text in ipairs(list) do
          local v, err = json.decode(text)
          assert(v == nil, string.format("%q was read as %s", text:sub(1, 40), tostring(v)))
          assert.matches("^not valid JSON: .", err)
        end
      end)
    end)

    it("reads nesting up to the limit", function()
      codec.run(function(json)
        local v = assert(json.decode(string.rep("[", 1000) .. "7" .. string.rep("]", 1000)))
        for _ = 1, 999 do v = v[1] end
        assert.same({ 7 }, v)
      end)
    end)

    it("reads whole numbers exactly: integers on Lua 5.3 and later, up to 64 bits", function()
      codec.run(function(json)
        local v = assert(json.decode('[9007199254740992, -9007199254740992, 1234567890123456, 3.0, 0.1, 1e300]'))
        assert.equal(9007199254740992, v[1])
        assert.equal(-9007199254740992, v[2])
        assert.equal(1234567890123456, v[3])
        assert.equal(0.1, v[5])
        if integers then
          for i = 1, 4 do assert.equal("integer", math.type(v[i]), i) end
          assert.equal("float", math.type(v[5]))
          assert.equal("float", math.type(v[6]))
          -- past 2^53 a double cannot hold them; a Lua integer can
          local big = assert(json.decode('{"id": 9007199254740993, "max": 9223372036854775807, '
            .. '"min": -9223372036854775808, "past": 9223372036854775808}'))
          assert.equal("9007199254740993", string.format("%d", big.id))
          assert.equal(math.maxinteger, big.max)
          assert.equal(math.mininteger, big.min)
          assert.equal("float", math.type(big.past))
        end
      end)
    end)
  end)
end

describe("the pure codec's errors", function()
  it("name what is wrong and where: line, column and byte", function()
    local cases = {
      { '{"a": 1,\n "b" 2}', "expected ':' after a member's name but found '2' at line 2, column 6 (byte 15)" },
      { "[1,]", "expected a JSON value but found ']' at line 1, column 4 (byte 4)" },
      { "[01]", "a number with a leading zero at line 1, column 2 (byte 2)" },
      { '"abc', "a string with no closing quote at line 1, column 1 (byte 1)" },
      { '"\\ud800x"', "a \\u escape of a high surrogate not followed by a low one at line 1, column 2 (byte 2)" },
      { '"\\udc00"', "a \\u escape of a low surrogate with no high one before it at line 1, column 2 (byte 2)" },
      { '"a\1"', "a control character (0x01) inside a string, not escaped at line 1, column 3 (byte 3)" },
      { '["\255"]', "a byte sequence that is not UTF-8 at line 1, column 3 (byte 3)" },
      { "[1] x", "more after the JSON value ('x') at line 1, column 5 (byte 5)" },
      { "", "expected a JSON value but found the end of the text at line 1, column 1 (byte 1)" },
      { "\0", "expected a JSON value but found byte 0x00 at line 1, column 1 (byte 1)" },
      { string.rep("[", 1001), "nesting deeper than 1000 levels at line 1, column 1001 (byte 1001)" },
    }
    for _, case in ipairs(cases) do
      local v, err = pure.decode(case[1], rw.null)
      assert.is_nil(v)
      assert.equal(case[2], err)
    end
    assert.equal("expected a string to decode, got table", select(2, pure.decode({}, rw.null)))
  end)

  it("keeps every byte of random texts from raising anything but its own answer", function()
    -- Mutations of a valid text: each is read, or refused with a message;
    -- none raises.
    local seed = '{"a":[1,-2.5e3,"x\\u00e9\\ud83d\\ude00",true,null],"b":{"c":"d\\n"}}'
    math.randomseed(39)
    for _ = 1, 3000 do
      local bytes = { seed:byte(1, -1) }
      for _ = 1, math.random(1, 4) do
        local at = math.random(1, #bytes)
        local op = math.random(1, 3)
        if op == 1 then
          bytes[at] = math.random(0, 255)
        elseif op == 2 then
          table.remove(bytes, at)
        else
          table.insert(bytes, at, seed:byte(math.random(1, #seed)))
        end
      end
      local text = string.char(table.unpack and table.unpack(bytes) or unpack(bytes)) -- luacheck: ignore 113
      local ok, v, err = pcall(pure.decode, text, rw.null)
      assert(ok, v)
      assert(v ~= nil or type(err) == "string", text)
    end
  end)
end)

describe("JSON encoded by ratewise", function()
  local json = require "ratewise.json"
  local function encode(v) return json.encode(v, "spec") end

  it("writes whole numbers with all their digits and other numbers so that they read back the same", function()
    assert.equal('{"order_id":1234567890123456}', encode { order_id = 1234567890123456 })
    assert.equal("[9007199254740992,-9007199254740992,0,3,1000000000000000,100000000000000000000]",
      encode { 2 ^ 53, -2 ^ 53, 0, 3.0, 1e15, 1e20 })
    assert.equal("[0.1,0.3333333333333333,2.5e-08,1e+21,1e+300,-1.7976931348623157e+308,4.9406564584125e-324]",
      encode { 0.1, 1 / 3, 2.5e-8, 1e21, 1e300, -1.7976931348623157e308, 5e-324 })
    for _, n in ipairs { 0.1, 1 / 3, 2 / 3, math.pi, 1e-7, 123.456, 2 ^ -1074, 1.7976931348623157e308, 4.35, 0.3 } do
      assert.equal(n, tonumber(encode { n }:sub(2, -2)), n)
    end
    if integers then
      assert.equal("[9223372036854775807,-9223372036854775808,9007199254740993]",
        encode { math.maxinteger, math.mininteger, math.tointeger(2 ^ 53) + 1 })
    end
  end)

  it("refuses NaN and the infinities, naming where they are", function()
    assert.error_matches(function() encode { a = { 0 / 0 } } end,
      "spec cannot be encoded as JSON: NaN, which JSON has no number for %(at %.a%[1%]%)")
    assert.error_matches(function() encode { x = math.huge } end, "an infinity, which JSON has no number for")
    assert.error_matches(function() encode(-math.huge) end, "an infinity")
  end)

  it("writes rw.null (and a host's null) as null", function()
    assert.equal('{"a":null}', encode { a = rw.null })
    assert.equal("[1,null,3]", encode { 1, rw.null, 3 })
    assert.equal("null", encode(rw.null))
    without_cjson(function(fresh) fresh.set_fallback { null = HOST_NULL, decode = function() end } end, function(fresh)
      assert.equal("[null,null]", fresh.encode({ HOST_NULL, rw.null }, "spec"))
    end)
  end)

  it("writes tables as lua-cjson does: 1..n an array, holes as null, {} an object, others objects", function()
    assert.equal("[1,2,3]", encode { 1, 2, 3 })
    assert.equal("{}", encode {})
    assert.equal("[1,null,3]", encode { 1, nil, 3 })
    assert.equal('["a"]', encode { [1] = "a" })
    local mixed = json.decode(encode { "a", x = 1 })
    assert.same({ ["1"] = "a", x = 1 }, mixed)
    assert.same({ ["0"] = "z", ["1.5"] = "h" }, json.decode(encode { [0] = "z", [1.5] = "h" }))
    assert.error_matches(function() encode { 1, nil, nil, nil, nil, nil, nil, nil, nil, nil, 2 } end,
      "a sparse array %(2 values up to index 11%)")
    assert.error_matches(function() encode { [true] = 1 } end,
      "a table key that is a boolean, not a string or a number")
  end)

  it("escapes what JSON must (and DEL, as lua-cjson does), writes / and UTF-8 as they are", function()
    assert.equal('"a\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\\u007f/é😀"',
      encode 'a"b\\c\n\r\t\b\f\1\31\127/é😀')
    assert.equal('"\\u007f"', encode "\127")
    assert.equal('"\\u0000"', encode "\0")
    assert.error_matches(function() encode { name = "caf\233" } end,
      "a string that is not UTF%-8 %(at %.name%)")
    assert.error_matches(function() encode { ["\255"] = 1 } end, "a string that is not UTF%-8")
  end)

  it("refuses cycles and functions, naming where they are", function()
    local t = { list = {} }
    t.list[1] = t
    assert.error_matches(function() encode(t) end, "a table that contains itself %(at %.list%[1%]%)")
    assert.error_matches(function() encode { cb = print } end, "a function, which JSON has no value for %(at %.cb%)")
    assert.error_matches(function() encode { ["a b"] = { coroutine.create(function() end) } } end,
      'a thread, which JSON has no value for %(at %["a b"%]%[1%]%)')
    -- the same table twice is no cycle
    local shared = { 1 }
    assert.equal('[[1],[1]]', encode { shared, shared })
  end)

  it("writes nesting up to the limit, as deep as it reads, and refuses more", function()
    local deep = {}
    local at = deep
    for _ = 1, 999 do
      at[1] = {}
      at = at[1]
    end
    assert.equal(string.rep("[", 999) .. "{}" .. string.rep("]", 999), encode(deep))
    at[1] = {}
    assert.error_matches(function() encode(deep) end, "nesting deeper than 1000 levels")
  end)

  -- lua-cjson writes a value where it writes it as the pure encoder does
  -- (core.json_plain): the same bytes either way, and each
  -- value here goes the way it says. A fresh copy of ratewise.json over a
  -- lua-cjson whose encoder counts its calls.
  it("gives the pure encoder's bytes when lua-cjson writes a value, and lets lua-cjson write only those", function()
    local real = require "cjson.safe"
    local encoded = 0
    local counting = { new = function()
      local instance = real.new()
      return setmetatable({ encode = function(v)
        encoded = encoded + 1
        return instance.encode(v)
      end }, { __index = instance })
    end }
    local saved = { package.loaded["ratewise.json"], package.loaded["cjson.safe"] }
    package.loaded["ratewise.json"], package.loaded["cjson.safe"] = nil, counting
    local ok, err = pcall(function()
      local fresh = require "ratewise.json"
      local by_cjson = {
        { model = "m", max_tokens = 16, temperature = 0.7, messages = { { role = "user", content = "Say ok." } } },
        { url = "https://example.com/a/b", slashes = "\\/\\\\/", quote = 'say "hi"\n\t', ctl = "\1\31\127" },
        { 1, 2, 3, 99999999999999, -99999999999999, 0.5, -0.0, 1e-7, true, false, rw.null },
        { [0] = "z", [2.5] = "h", empty = {}, list = { 1, nil, 3 } },
        "a/b", 42, rw.null,
      }
      local by_pure = {
        { id = 1234567890123456 }, { ratio = 1 / 3 }, { 1e14 }, { 1e300 }, { sum = 0.1 + 0.2 },
        setmetatable({ a = 1 }, {}), { list = setmetatable({ 1, 2 }, { __index = {} }) },
      }
      for _, v in ipairs(by_cjson) do
        local before = encoded
        local text = fresh.encode(v, "spec")
        assert.equal(before + 1, encoded, text)
        assert.equal(pure.encode(v, rw.null), text)
      end
      for _, v in ipairs(by_pure) do
        local before = encoded
        local text = fresh.encode(v, "spec")
        assert.equal(before, encoded, text)
        assert.equal(pure.encode(v, rw.null), text)
      end
      -- beyond ASCII (lua-cjson's text is looked at for it), the pure
      -- encoder's text, which checks UTF-8
      for _, v in ipairs { { name = "ünï" }, { ["é"] = 1 }, "😀 / ok" } do
        assert.equal(pure.encode(v, rw.null), fresh.encode(v, "spec"))
      end
      assert.error_matches(function() fresh.encode({ name = "caf\233" }, "spec") end, "not UTF%-8 %(at %.name%)")
      -- a host's null is the pure encoder's to write
      fresh.set_fallback { null = HOST_NULL, decode = function() end }
      local before = encoded
      assert.equal('{"host":null}', fresh.encode({ host = HOST_NULL }, "spec"))
      assert.equal(before, encoded)
      -- what lua-cjson refuses, the pure encoder names
      assert.error_matches(function() fresh.encode({ 1, nil, nil, nil, nil, nil, nil, nil, nil, nil, 2 }, "spec") end,
        "a sparse array %(2 values up to index 11%)")
    end)
    package.loaded["ratewise.json"], package.loaded["cjson.safe"] = saved[1], saved[2]
    assert(ok, err)
  end)

  it("reads back what it wrote, whichever codec reads", function()
    local value = { id = 1234567890123456, ratio = 1 / 3, name = "ünï \"q\" \\ / \n", list = { 1, 2.5, rw.null, true },
      nested = { deeper = { empty = {} } } }
    for _, codec in ipairs(CODECS) do
      codec.run(function(fresh)
        local back = assert(fresh.decode(json.encode(value, "spec")))
        assert.same(value, back, codec.name)
        if integers then assert.equal("integer", math.type(back.id)) end
      end)
    end
  end)
end)
