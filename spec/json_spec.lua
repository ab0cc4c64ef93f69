-- JSON and query parameters on rw.fetch and the client, res:json(), and
-- the client's absolute URLs, against the loopback test server.
local rw = require "ratewise"
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"
local cjson = require "cjson"

local integers = math.type ~= nil -- Lua 5.3 and later

describe("json and query options", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("rw.fetch", function()
    it("sends json = table as a POST labelled JSON, asking for JSON", function()
      local res = assert(rw.fetch(s.base .. "/echo", { json = { model = "m", n = 3, tags = { "a", "b" } },
        on_retry = false }))
      local seen = s:log("/echo")[1]
      assert.equal("POST", seen.method)
      assert.equal("application/json", seen.headers["content-type"])
      assert.equal("application/json", seen.headers.accept)
      assert.same({ model = "m", n = 3, tags = { "a", "b" } }, cjson.decode(seen.body))
      assert.equal(200, res.status)
    end)

    it("keeps the caller's Content-Type and Accept, and the method it names", function()
      assert(rw.fetch(s.base .. "/echo", { method = "PATCH", json = { a = 1 }, on_retry = false,
        headers = { ["content-type"] = "application/merge-patch+json", Accept = "*/*" } }))
      local seen = s:log("/echo")[1]
      assert.equal("PATCH", seen.method)
      assert.equal("application/merge-patch+json", seen.headers["content-type"])
      assert.equal("*/*", seen.headers.accept)
    end)

    it("encodes query = table into the URL, after the URL's own parameters", function()
      assert(rw.fetch(s.base .. "/echo?fixed=1", { on_retry = false,
        query = { q = "a b&c=d", page = 2, flag = true, off = false, tag = { "x", "y/z" } } }))
      local seen = s:log("/echo")[1]
      assert.equal("fixed=1&flag&page=2&q=a%20b%26c%3Dd&tag=x&tag=y%2Fz", seen.query)
    end)

    it("refuses what cannot be sent, naming the option, before anything goes out", function()
      local url = s.base .. "/echo"
      assert.error_matches(function() rw.fetch(url, { json = { f = print } }) end,
        "fetch: option 'json' cannot be encoded as JSON")
      assert.error_matches(function() rw.fetch(url, { json = { 1, nil, nil, nil, nil, nil, nil, nil, nil, nil, 2 } })
      end, "option 'json' cannot be encoded as JSON")
      assert.error_matches(function() rw.fetch(url, { json = {}, body = "x" }) end,
        "options 'body' and 'json' are both given")
      assert.error_matches(function() rw.fetch(url, { json = {}, method = "GET" }) end,
        "a GET request cannot carry a body %(option 'json'%)")
      assert.error_matches(function() rw.fetch(url, { json = "text" }) end, "option 'json' must be a table")
      assert.error_matches(function() rw.fetch(url, { query = "a=1" }) end, "option 'query' must be a table")
      assert.error_matches(function() rw.fetch(url, { query = { a = { b = 1 } } }) end,
        "query parameter 'a' must be an array")
      assert.error_matches(function() rw.fetch(url, { query = { a = print } }) end,
        "query parameter 'a' must be a string, a number")
      assert.error_matches(function() rw.fetch(url, { query = { a = 0 / 0 } }) end,
        "query parameter 'a' is not a finite number")
      assert.error_matches(function() rw.fetch(url, { query = { [1] = "x" } }) end,
        "option 'query' has a key that is not a string")
      assert.equal(0, #s:log("/echo"))
    end)

    it("replays a JSON POST only when an idempotency key makes it safe", function()
      s:script("/pay", { { status = 503 }, { status = 200, body = "{}" } })
      local res, err = rw.fetch(s.base .. "/pay", { json = { amount = 1 }, on_retry = false, base = 0.01 })
      assert.is_nil(res)
      assert.equal("unsafe", err.kind)
      s:reset()
      s:script("/pay", { { status = 503 }, { status = 200, body = "{}" } })
      res = assert(rw.fetch(s.base .. "/pay", { json = { amount = 1 }, idempotency_key = true, on_retry = false,
        base = 0.01 }))
      assert.equal(2, res.attempts)
      local log = s:log("/pay")
      assert.equal(log[1].body, log[2].body)
      assert.equal(log[1].headers["idempotency-key"], log[2].headers["idempotency-key"])
    end)
  end)

  describe("res:json()", function()
    it("decodes the body, integers kept as integers", function()
      s:script("/j", { { status = 200, headers = { ["Content-Type"] = "application/json" },
        body = '{"id": 42, "big": 9007199254740992, "neg": -7, "ratio": 0.5, "huge": 1e300, '
          .. '"list": [1, 2.5, {"n": 10}], "ok": true, "none": null}' } })
      local v = assert(assert(rw.fetch(s.base .. "/j", { on_retry = false })):json())
      assert.equal(42, v.id)
      assert.equal(0.5, v.ratio)
      assert.equal(1e300, v.huge)
      assert.equal(true, v.ok)
      assert.equal(cjson.null, v.none)
      if integers then
        assert.equal("integer", math.type(v.id))
        assert.equal("integer", math.type(v.big))
        assert.equal("integer", math.type(v.neg))
        assert.equal("integer", math.type(v.list[1]))
        assert.equal("float", math.type(v.list[2]))
        assert.equal("integer", math.type(v.list[3].n))
        assert.equal("float", math.type(v.huge))
        assert.equal("42", tostring(v.id))
      end
    end)

    it("decodes a bare number, and whatever the Content-Type says", function()
      s:script("/n", { { status = 200, body = "17", headers = { ["Content-Type"] = "text/plain" } } })
      local v = assert(assert(rw.fetch(s.base .. "/n", { on_retry = false })):json())
      assert.equal(17, v)
      if integers then assert.equal("integer", math.type(v)) end
    end)

    it("answers nil and why for a body that is not JSON, and for an empty one", function()
      s:script("/bad", { { status = 200, body = "<html>" } })
      local res = assert(rw.fetch(s.base .. "/bad", { on_retry = false }))
      local v, err = res:json()
      assert.is_nil(v)
      assert.matches("^response body is not valid JSON", err)
      s:script("/empty", { { status = 204 } })
      v, err = assert(rw.fetch(s.base .. "/empty", { on_retry = false })):json()
      assert.is_nil(v)
      assert.matches("not valid JSON", err)
    end)

    it("works on the response of an error", function()
      s:script("/nf", { { status = 404, body = '{"error": {"code": 404}}' } })
      local _, err = rw.fetch(s.base .. "/nf", { on_retry = false })
      assert.equal("terminal", err.kind)
      local v = assert(err.response:json())
      assert.equal(404, v.error.code)
      if integers then assert.equal("integer", math.type(v.error.code)) end
    end)

    it("tries lua-cjson again after a first load failed for want of descriptors", function()
      -- A process of its own, whose descriptors it can use up: with none
      -- left, require cannot open cjson's file and says "not found".
      s:script("/j", { { status = 200, body = '{"n": 1}' } })
      local out, code = subprocess.run_lua([[
        local rw = require "ratewise"
        assert(not package.loaded.cjson, "lua-cjson was loaded before the spec could deny it descriptors")
        local res = assert(rw.fetch(]] .. string.format("%q", s.base .. "/j") .. [[, { on_retry = false }))
        local held = {}
        while true do
          local f = io.open("/dev/null", "rb")
          if not f then break end
          held[#held + 1] = f
        end
        local v, err = res:json()
        print("starved", tostring(v), err)
        for _, f in ipairs(held) do f:close() end
        v, err = res:json()
        print("freed", v and v.n, err)
      ]], { shell = "ulimit -n 64; " })
      assert.equal(0, code, out)
      assert.matches("starved\tnil\t[^\n]*Too many open files[^\n]*ulimit %-n", out)
      assert.not_matches("starved[^\n]*install", out)
      assert.matches("freed\t1\tnil", out)
    end)
  end)

  describe("the client's URLs", function()
    local function new(extra)
      local o = { base_url = s.base .. "/v1", on_retry = false, headers = { Authorization = "Bearer secret",
        ["X-Api-Key"] = "k-123", ["X-Trace"] = "t" } }
      for k, v in pairs(extra or {}) do o[k] = v end
      return rw.client(o)
    end

    it("follows an absolute URL on its own origin, as a pagination Link names it", function()
      local c = new()
      local res = assert(c:get(s.base .. "/v1/echo?page=2"))
      assert.equal(200, res.status)
      local seen = s:log("/v1/echo")[1]
      assert.equal("page=2", seen.query)
      assert.equal("Bearer secret", seen.headers.authorization)
      -- same origin, outside the base path: allowed, with the client's headers
      assert(c:get(s.base .. "/other"))
      assert.equal("Bearer secret", s:log("/other")[1].headers.authorization)
    end)

    it("matches routes on the path an absolute URL names under base_url", function()
      local route_bucket = rw.bucket { capacity = 1, rate = 0.001 }
      local c = new { routes = { ["/search"] = route_bucket } }
      assert(c:get(s.base .. "/v1/search?q=x"))
      assert.equal(0, math.floor(route_bucket:tokens()))
    end)

    it("refuses another origin unless asked, and then sends none of its secrets or limits", function()
      local other = server.start()
      local ok, err = pcall(function()
        local limiter = rw.bucket { capacity = 1, rate = 0.001 }
        local c = new { limiter = limiter }
        assert.error_matches(function() c:get(other.base .. "/echo") end,
          "is on another origin than the client's.*cross_origin = true")
        assert.equal(0, #other:log("/echo"))
        local res = assert(c:get(other.base .. "/echo", { cross_origin = true, headers = { ["X-Call"] = "c" } }))
        assert.equal(200, res.status)
        local seen = other:log("/echo")[1]
        assert.is_nil(seen.headers.authorization)
        assert.is_nil(seen.headers["x-api-key"])
        assert.equal("t", seen.headers["x-trace"])
        assert.equal("c", seen.headers["x-call"])
        assert.equal(1, math.floor(limiter:tokens())) -- the client's limiter stayed out of it
        -- a client made to allow it
        local open = new { cross_origin = true }
        assert(open:get(other.base .. "/echo"))
        assert.is_nil(other:log("/echo")[2].headers.authorization)
      end)
      other:stop()
      assert(ok, err)
    end)

    it("refuses a path that is neither /... nor an http(s) URL", function()
      local c = new()
      assert.error_matches(function() c:get("echo") end, "path must start with / or be an http:// or https:// URL")
      assert.error_matches(function() c:get("ftp://x/y") end, "path must start with /")
      assert.error_matches(function() c:get(42) end, "path must be a string")
      assert.error_matches(function() c:get("/echo", { cross_origin = "yes" }) end,
        "option 'cross_origin' must be a boolean")
    end)
  end)

  describe("json.encode", function()
    local json = require "ratewise.json"

    it("names who asked and what cannot be written, and nothing else", function()
      local ok, err = pcall(json.encode, { f = print }, "fetch: option 'json'")
      assert.is_false(ok)
      assert.equal("fetch: option 'json' cannot be encoded as JSON: a function, which JSON has no value for (at .f)",
        err:gsub("^.-:%d+: ", ""))
      ok, err = pcall(json.encode, { 0 / 0 }, "client:request: option 'json'")
      assert.is_false(ok)
      assert.equal("client:request: option 'json' cannot be encoded as JSON: NaN, which JSON has no number for "
        .. "(at [1])", err:gsub("^.-:%d+: ", ""))
      assert.equal('{"a":[1,2]}', json.encode({ a = { 1, 2 } }, "x"))
    end)
  end)

  describe("exact numbers, rw.null and no lua-cjson", function()
    it("sends whole numbers with all their digits, other numbers so that they read back the same", function()
      assert(rw.fetch(s.base .. "/echo", { json = { order_id = 1234567890123456 }, on_retry = false }))
      assert.equal('{"order_id":1234567890123456}', s:log("/echo")[1].body)
      assert(rw.fetch(s.base .. "/echo", { json = { 9007199254740992, 0.1, 1 / 3, 1e15, -2.5e-8 }, on_retry = false }))
      assert.equal("[9007199254740992,0.1,0.3333333333333333,1000000000000000,-2.5e-08]", s:log("/echo")[2].body)
      local c = rw.client { base_url = s.base, on_retry = false }
      assert(c:post("/echo", { json = { amount = 4.35, id = 1234567890123456 }, idempotency_key = "k" }))
      assert.same({ amount = 4.35, id = 1234567890123456 }, cjson.decode(s:log("/echo")[3].body))
      assert.matches('"id":1234567890123456[,}]', s:log("/echo")[3].body)
      assert.matches('"amount":4.35[,}]', s:log("/echo")[3].body)
      if integers then
        assert(rw.fetch(s.base .. "/echo", { json = { math.maxinteger, math.mininteger }, on_retry = false }))
        assert.equal("[9223372036854775807,-9223372036854775808]", s:log("/echo")[4].body)
      end
    end)

    it("puts numbers in the query with all their digits", function()
      assert(rw.fetch(s.base .. "/echo", { on_retry = false,
        query = { id = 1234567890123456, r = 1 / 3, big = 2 ^ 53, ids = { 1234567890123457, 0.1 } } }))
      assert.equal("big=9007199254740992&id=1234567890123456&ids=1234567890123457&ids=0.1&r=0.3333333333333333",
        s:log("/echo")[1].query)
    end)

    it("writes rw.null as null, and / as it is", function()
      assert(rw.fetch(s.base .. "/echo", { json = { { url = "https://x/y", none = rw.null } }, on_retry = false }))
      local body = s:log("/echo")[1].body
      assert.is_nil(body:find("\\/"), body)
      local sent = cjson.decode(body)
      assert.equal("https://x/y", sent[1].url)
      assert.equal(cjson.null, sent[1].none)
    end)

    it("answers a JSON null as rw.null, and integers past 2^53 exactly on Lua 5.3 and later", function()
      s:script("/j", { { status = 200, body = '{"none": null, "list": [null, 1], "id": 9007199254740993}' } })
      local v = assert(assert(rw.fetch(s.base .. "/j", { on_retry = false })):json())
      assert.equal(rw.null, v.none)
      assert.equal(rw.null, v.list[1])
      if integers then
        assert.equal("integer", math.type(v.id))
        assert.equal("9007199254740993", string.format("%d", v.id))
      end
    end)

    it("reads and writes JSON where lua-cjson cannot be loaded, with ratewise's own codec", function()
      s:script("/j", { { status = 200, body = '{"none": null, "id": 1234567890123456, "s": "\\u00e9/"}' } })
      s:script("/bad", { { status = 200, body = "<html>" } })
      local out, code = subprocess.run_lua([[
        package.preload.cjson = function() error("module 'cjson' not found: hidden by the spec", 0) end
        package.preload["cjson.safe"] = package.preload.cjson
        local rw = require "ratewise"
        local base = ]] .. string.format("%q", s.base) .. [[
        local v = assert(assert(rw.fetch(base .. "/j", { on_retry = false })):json())
        print("decoded", v.none == rw.null, string.format("%.0f", v.id), v.s)
        local bad, why = assert(rw.fetch(base .. "/bad", { on_retry = false })):json()
        print("refused", bad, why)
        assert(rw.fetch(base .. "/echo", { json = { id = 1234567890123456, none = rw.null }, on_retry = false }))
        print("cjson", package.loaded.cjson, package.loaded["cjson.safe"])
      ]])
      assert.equal(0, code, out)
      assert.matches("decoded\ttrue\t1234567890123456\té/\n", out)
      assert.matches("refused\tnil\tresponse body is not valid JSON: expected a JSON value but found '<' at line 1, "
        .. "column 1 (byte 1)", out, 1, true)
      assert.matches("cjson\tnil\tnil", out)
      assert.same({ id = 1234567890123456, none = cjson.null }, cjson.decode(s:log("/echo")[1].body))
      assert.matches('"id":1234567890123456', s:log("/echo")[1].body)
    end)
  end)
end)
