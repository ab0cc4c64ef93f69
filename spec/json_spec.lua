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

    -- Runs check(json) on a fresh copy of ratewise.json that cannot load
    -- lua-cjson, as on a host without it (Neovim plugs in vim.json there).
    local function without_cjson(check)
      local saved = { package.loaded["ratewise.json"], package.loaded.cjson, package.loaded["cjson.safe"],
        package.preload.cjson }
      package.loaded["ratewise.json"], package.loaded.cjson, package.loaded["cjson.safe"] = nil, nil, nil
      package.preload.cjson = function() error("module 'cjson' not found:\n\thidden by the spec", 0) end
      local ok, err = pcall(function() check(require "ratewise.json") end)
      package.loaded["ratewise.json"], package.loaded.cjson, package.loaded["cjson.safe"], package.preload.cjson =
        saved[1], saved[2], saved[3], saved[4]
      assert(ok, err)
    end

    it("names who asked and what lua-cjson found wrong, and nothing else", function()
      local ok, err = pcall(json.encode, { f = print }, "fetch: option 'json'")
      assert.is_false(ok)
      assert.equal("fetch: option 'json' cannot be encoded as JSON: Cannot serialise function: type not supported",
        err:gsub("^.-:%d+: ", ""))
      ok, err = pcall(json.encode, { 0 / 0 }, "client:request: option 'json'")
      assert.is_false(ok)
      assert.equal("client:request: option 'json' cannot be encoded as JSON: Cannot serialise number: must not be "
        .. "NaN or Inf", err:gsub("^.-:%d+: ", ""))
      assert.equal('{"a":[1,2]}', json.encode({ a = { 1, 2 } }, "x"))
    end)

    it("encodes with a plugged-in codec, its errors told as lua-cjson's are", function()
      without_cjson(function(fresh)
        fresh.set_fallback {
          encode = function(v)
            if type(v.bad) == "function" then error("cannot encode a function", 1) end
            return "encoded"
          end,
          decode = function() return {} end,
        }
        assert.equal("encoded", fresh.encode({ a = 1 }, "x"))
        local ok, err = pcall(fresh.encode, { bad = print }, "fetch: option 'json'")
        assert.is_false(ok)
        assert.equal("fetch: option 'json' cannot be encoded as JSON: cannot encode a function",
          err:gsub("^.-:%d+: ", ""))
      end)
    end)

    it("finds lua-cjson installed after a call that could not (a later package.path)", function()
      without_cjson(function(fresh)
        assert.is_nil(fresh.load())
        assert.has_error(function() fresh.encode({ a = 1 }, "x") end)
        package.preload.cjson = nil -- now require finds the real one
        assert.is_true(fresh.load())
        assert.equal('{"a":1}', fresh.encode({ a = 1 }, "x"))
        assert.same({ a = 1 }, fresh.decode('{"a":1}'))
      end)
    end)

    it("says how to install lua-cjson when it is missing and no codec is plugged in", function()
      without_cjson(function(fresh)
        local ok, err = pcall(fresh.encode, {}, "fetch: option 'json'")
        assert.is_false(ok)
        assert.equal("fetch: option 'json' needs lua-cjson, which cannot be loaded (module 'cjson' not found): "
          .. "install the Debian package lua-cjson (apt-get install lua-cjson) or the rock lua-cjson "
          .. "(luarocks install lua-cjson)", err:gsub("^.-:%d+: ", ""))
      end)
    end)
  end)
end)
