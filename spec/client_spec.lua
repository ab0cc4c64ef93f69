-- rw.client against the real loopback server.
local rw = require "ratewise"
local server = require "spec.support.server"

local max_active = server.max_active

describe("rw.client", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  local function new(extra)
    local o = { base_url = s.base .. "/", on_retry = false }
    for k, v in pairs(extra or {}) do o[k] = v end
    return rw.client(o)
  end

  describe("requests", function()
    -- (a GET's call table leaves the method to fetch's default: a method
    -- the options give must not come through in its place)
    it("sends the method it is called with, whatever the options say", function()
      local c = new()
      assert(c:get("/echo", { method = "DELETE" }))
      assert(c:request("OPTIONS", "/echo", { method = "GET" }))
      local methods = {}
      for i, r in ipairs(s:log("/echo")) do methods[i] = r.method end
      assert.same({ "GET", "OPTIONS" }, methods)
    end)

    it("joins base_url and path, adds the query, and merges headers", function()
      local c = new { headers = { Authorization = "Bearer client", ["X-Client"] = "1" } }
      local res = assert(c:get("/echo", { query = { q = "a b", page = 2, flag = true },
        headers = { authorization = "Bearer call" } }))
      assert.equal(200, res.status)
      local seen = s:log("/echo")[1]
      assert.equal("GET", seen.method)
      assert.equal("flag&page=2&q=a%20b", seen.query)
      assert.equal("Bearer call", seen.headers.authorization) -- the call's header wins, whatever its case
      assert.equal("1", seen.headers["x-client"])
    end)

    it("sends what its headers table holds at each call, the table changed between calls", function()
      local h = { Authorization = "Bearer one" }
      local c = new { headers = h, dedupe = false }
      for _ = 1, 3 do assert(c:get("/t")) end
      h.Authorization = "Bearer two" -- a token refreshed in place
      assert(c:get("/t"))
      assert(c:get("/t", { headers = { ["X-Call"] = "yes" } }))
      assert(c:get("/t"))
      local log = s:log("/t")
      assert.equal(6, #log)
      for i = 1, 3 do assert.equal("Bearer one", log[i].headers.authorization) end
      for i = 4, 6 do assert.equal("Bearer two", log[i].headers.authorization) end
      assert.equal("yes", log[5].headers["x-call"])
      assert.is_nil(log[6].headers["x-call"])
      assert.is_nil(h["X-Call"]) -- a call's headers never go into the client's table
    end)

    it("sends each path to its own URL, one path after another and back", function()
      local c = new { dedupe = false }
      for _, path in ipairs { "/p/a", "/p/a", "/p/b", "/p/a", "/p/b?x=1", "/p/b" } do
        assert.equal(200, assert(c:get(path)).status)
      end
      local seen = {}
      for _, r in ipairs(s:log()) do seen[#seen + 1] = r.path .. (r.query ~= "" and "?" .. r.query or "") end
      assert.same({ "/p/a", "/p/a", "/p/b", "/p/a", "/p/b?x=1", "/p/b" }, seen)
    end)

    it("sends json = table as JSON and decodes the response with res:json()", function()
      local c = new()
      local res = assert(c:post("/echo", { json = { name = "widget", tags = { "a", "b" } } }))
      local seen = s:log("/echo")[1]
      assert.equal("application/json", seen.headers["content-type"])
      assert.equal("application/json", seen.headers.accept)
      assert.same({ name = "widget", tags = { "a", "b" } }, require("cjson").decode(seen.body))
      assert.equal("POST", res:json().method)
      assert.equal(seen.body, res:json().body)
    end)

    it("keeps a body that is not JSON, and res:json() says so", function()
      s:script("/bad", { { status = 200, body = "{nope", headers = { ["Content-Type"] = "application/json" } } })
      local res = assert(new():get("/bad"))
      local value, err = res:json()
      assert.is_nil(value)
      assert.matches("response body is not valid JSON", err)
      assert.equal("{nope", res.body)
    end)

    it("decodes the JSON of a failed response with err.response:json()", function()
      s:script("/nf", { { status = 404, body = '{"error":"no such thing"}',
        headers = { ["Content-Type"] = "application/json" } } })
      local res, err = new():get("/nf")
      assert.is_nil(res)
      assert.equal("terminal", err.kind)
      assert.equal("no such thing", err.response:json().error)
    end)

    it("lets per-call options override the client's", function()
      s:script("/r", { { status = 503 } })
      local c = new { max_retries = 3, sleep = function() end }
      local _, err = c:get("/r", { max_retries = 1 })
      assert.equal(2, err.attempts)
      s:reset()
      s:script("/r", { { status = 503 } })
      _, err = c:get("/r")
      assert.equal(4, err.attempts)
    end)

    it("offers get, post, put, patch, delete and head", function()
      local c = new()
      for _, m in ipairs { "get", "post", "put", "patch", "delete", "head" } do
        assert.equal(200, assert(c[m](c, "/echo")).status)
      end
      local methods = {}
      for _, r in ipairs(s:log("/echo")) do methods[#methods + 1] = r.method end
      assert.same({ "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD" }, methods)
    end)

    it("rejects bad options, naming them", function()
      assert.error_matches(function() rw.client { base_url = "ftp://x" } end, "'base_url'")
      assert.error_matches(function() rw.client {} end, "'base_url'")
      assert.error_matches(function() rw.client { base_url = s.base, retries = 3 } end, "unknown option 'retries'")
      assert.error_matches(function() rw.client { base_url = s.base, provider = "nosuch" } end,
        "unknown provider 'nosuch'")
      assert.error_matches(function() rw.client { base_url = s.base, cache = { ttl = 0 } } end, "'cache.ttl'")
      local c = new()
      assert.error_matches(function() c:get("echo") end, "path must start with / or be an http:// or https:// URL")
      assert.error_matches(function() c:post("/echo", { json = { f = print } }) end, "'json' cannot be encoded")
      assert.error_matches(function() c:get("/echo", { timeout = -1 }) end, "'timeout'")
      assert.equal(0, #s:log("/echo"))
    end)

    -- issue 39, 7.2: the error quoted the path, and with it a key in any
    -- form the URL redaction does not know (after "&", in a userinfo
    -- without a scheme, as a path segment after a scheme typo)
    it("quotes no key from a path without its leading / or with a scheme typo", function()
      local c = new { headers = { Authorization = "Bearer t0ken-in-header" } }
      local host = s.base:gsub("^http://", "")
      local paths = {
        "echo?api_key=SECRET-1",
        "echo&api_key=SECRET-2",
        "api_key=SECRET-3/echo",
        "sk_live_SECRET-4:@" .. host .. "/echo",
        "user:SECRET-5@" .. host .. "/echo",
        "htps://" .. host .. "/bot123:SECRET-6/echo",
        "htps://user:SECRET-7@" .. host .. "/echo?key=SECRET-7",
        "bot123:SECRET-8/getMe",
      }
      for _, path in ipairs(paths) do
        local ok, err = pcall(c.get, c, path)
        assert.is_false(ok, path)
        assert.matches("path must start with / or be an http:// or https:// URL", err)
        assert.is_nil(err:find("SECRET", 1, true), err)
      end
      -- what a caller needs to find the call is still there
      assert.error_matches(function() c:get("echo?api_key=SECRET") end, 'got "echo...", a path without its leading /')
      assert.error_matches(function() c:get("echo") end, 'got "echo", a path without its leading /')
      assert.error_matches(function() c:get("htps://" .. host .. "/x") end, 'got a URL with scheme "htps"')
      assert.equal(0, #s:log())
    end)

    -- issue 39, 7.4: "/v1?key=K" .. "/items" sent the path inside the
    -- query, and "/v1#docs" .. "/items" sent "/v1"
    it("refuses a base_url with a query or a fragment, naming which, quoting neither", function()
      for base, what in pairs { [s.base .. "/v1?key=SECRET-Q"] = "query", [s.base .. "/v1#SECRET-F"] = "fragment",
        [s.base .. "/v1?"] = "query" } do
        local ok, err = pcall(rw.client, { base_url = base })
        assert.is_false(ok, base)
        assert.matches("option 'base_url' must not have a " .. what, err)
        assert.is_nil(err:find("SECRET", 1, true), err)
      end
      assert(new { base_url = s.base .. "/v1" }:get("/items"))
      assert.equal(1, #s:log())
      assert.equal("/v1/items", s:log()[1].path)
    end)
  end)

  describe("limits", function()
    it("uses the route's limiter as well as the client's", function()
      local search = rw.bucket { capacity = 1, rate = 5 }
      local all = rw.bucket { capacity = 100, rate = 0.01 }
      local c = new { limiter = all, routes = { ["/search/"] = search } }
      local t0 = rw.now()
      for _ = 1, 3 do assert(c:get("/search/code")) end
      assert.is_true(rw.now() - t0 >= 0.39, "route limiter did not pace")
      assert.is_true(all:tokens() < 98) -- the overall quota was charged as well
      assert.is_true(all:tokens() > 96) -- ...once per request
      t0 = rw.now()
      for _ = 1, 3 do assert(c:get("/other")) end
      assert.is_true(rw.now() - t0 < 0.2, "other routes are not paced by the search limiter")
    end)

    it("matches routes given as Lua patterns", function()
      local issues = rw.bucket { capacity = 1, rate = 5 }
      local c = new { routes = { { "^/repos/[^/]+/[^/]+/issues", issues } } }
      local t0 = rw.now()
      assert(c:get("/repos/a/b/issues"))
      assert(c:get("/repos/c/d/issues"))
      assert.is_true(rw.now() - t0 >= 0.19)
    end)

    it("keeps at most `concurrency` requests in flight", function()
      s:script("/slow", { { status = 200, delay = 0.05 } })
      local c = new { concurrency = 3 }
      rw.run(function()
        for i = 1, 12 do rw.spawn(function() assert(c:get("/slow", { query = { i = i } })) end) end
      end)
      local log = s:log("/slow")
      assert.equal(12, #log)
      assert.equal(3, max_active(log))
    end)

    describe("without a limiter of the caller's", function()
      -- 8 tasks calling path in a loop for 1.5 s through c: what the
      -- server's limit let through and refused
      local function hammer(c, path)
        local stop_at = rw.now() + 1.5
        rw.run(function()
          for _ = 1, 8 do
            rw.spawn(function()
              while rw.now() < stop_at do assert(c:get(path, { max_retries = 1000, max_elapsed = 10 })) end
            end)
          end
        end)
        return s:counted(path)
      end

      it("sends at once until the server first throttles, then learns its rate: few 429s, not a storm", function()
        s:limit("/api", { rate = 40, burst = 1 }) -- a bare 429: no Retry-After
        -- (calls that differ, as an API's do: identical ones in flight would share one request)
        local c = new { dedupe = false }
        local t0 = rw.now()
        for _ = 1, 20 do assert(c:get("/echo")) end
        assert.is_true(rw.now() - t0 < 0.5, "paced before any throttle")
        local ok, limited = hammer(c, "/api")
        s:reset()
        s:limit("/api", { rate = 40, burst = 1 })
        local ok_bare, limited_bare = hammer(new { limiter = false, dedupe = false }, "/api")
        -- retries alone, each on its own: most requests refused
        assert.is_true(limited_bare > ok_bare, ("limiter = false: %d ok, %d 429"):format(ok_bare, limited_bare))
        assert.is_true(ok >= 0.5 * 40 * 1.5 and limited < ok / 3,
          ("the client's own: %d ok, %d 429 (limiter = false: %d ok, %d 429)"):format(ok, limited, ok_bare,
            limited_bare))
      end)

      it("holds the client's other calls no longer than 2 s for one 429 that names a long wait", function()
        s:script("/quota", { { status = 429, headers = { ["Retry-After"] = "3600" } } })
        local c = new { dedupe = false }
        local res, err = c:get("/quota", { max_retries = 0 })
        assert.equal(429, res and res.status or err.status)
        local t0 = rw.now()
        assert(c:get("/echo")) -- another path: its own quota
        local waited = rw.now() - t0
        assert.is_true(waited > 1 and waited < 2.5, ("the next call waited %.2f s"):format(waited))
        -- a 503 that names a wait is a throttle too, but holds nothing
        local c2 = new { dedupe = false }
        s:script("/down", { { status = 503, headers = { ["Retry-After"] = "120" } } })
        local res2, err2 = c2:get("/down", { max_retries = 0 })
        assert.equal(503, res2 and res2.status or err2.status)
        t0 = rw.now()
        assert(c2:get("/echo"))
        assert.is_true(rw.now() - t0 < 0.5, ("after the 503 the next call waited %.2f s"):format(rw.now() - t0))
      end)

      it("learns from throttles alone: a provider's hourly quota does not set its pace", function()
        local quota = { ["x-ratelimit-limit"] = "5000", ["x-ratelimit-remaining"] = "4000",
          ["x-ratelimit-reset"] = tostring(os.time() + 3500), ["x-ratelimit-resource"] = "core" }
        s:script("/repos/a/b", { { status = 200, headers = quota } })
        s:script("/woke", { { status = 429, headers = { ["Retry-After"] = "1" } } })
        local c = new { provider = "github", dedupe = false }
        for _ = 1, 3 do assert(c:get("/repos/a/b")) end
        local res, err = c:get("/woke", { max_retries = 0 })
        assert.equal(429, res and res.status or err.status)
        local t0 = rw.now()
        for _ = 1, 20 do assert(c:get("/repos/a/b")) end
        -- (the hold of 1.2 s, then slow start from 10 a second; at the
        -- quota's 5000 an hour they would take far longer)
        assert.is_true(rw.now() - t0 < 4, ("20 calls took %.2f s"):format(rw.now() - t0))
      end)

      it("asks a call's cost of none, as a call without a limiter does, and still refuses a bad one", function()
        local c = new {}
        assert(c:get("/echo", { cost = 500 }))
        assert(c:get("/echo", { cost = { tokens = 500 } }))
        assert.equal(2, #s:log("/echo"))
        assert.has_error(function() c:get("/echo", { cost = -1 }) end,
          "client:request: option 'cost' must be a positive number, a table of costs by limit "
            .. "({ requests = 1, tokens = 900 }) or a function of the request giving either (got -1)")
      end)

      it("a route's limiter stands alone: the client's own, once woken, does not pace the route", function()
        s:script("/api", { { status = 429 }, { status = 429 }, { status = 200 } })
        local c = new { routes = { ["/search/"] = rw.bucket { capacity = 10, rate = 100 } } }
        assert(c:get("/api", { max_retries = 2, base = 0.001 })) -- wakes it: 10 a second from now
        local t0 = rw.now()
        for _ = 1, 10 do assert(c:get("/search/x")) end
        local route_took = rw.now() - t0
        t0 = rw.now()
        for _ = 1, 10 do assert(c:get("/echo")) end
        local own_took = rw.now() - t0
        -- (slow start from 10 a second: unpaced, ten calls take milliseconds)
        assert.is_true(own_took >= 0.25 and route_took < own_took / 2,
          ("ten calls took %.3f s on the route, %.3f s elsewhere"):format(route_took, own_took))
      end)
    end)

    it("takes `cost` tokens from the limiter", function()
      local tokens = rw.bucket { capacity = 1000, rate = 1 }
      local c = new { limiter = tokens }
      assert(c:post("/echo", { cost = 400 }))
      assert.is_true(tokens:tokens() < 601)
    end)
  end)

  describe("dedupe and cache", function()
    it("shares one transfer between identical requests in flight", function()
      s:script("/same", { { status = 200, body = "shared", delay = 0.1 } })
      local c = new()
      local bodies = {}
      rw.run(function()
        for i = 1, 10 do rw.spawn(function() bodies[i] = assert(c:get("/same")).body end) end
      end)
      assert.equal(1, #s:log("/same"))
      for i = 1, 10 do assert.equal("shared", bodies[i]) end
      assert.equal(9, c:stats().deduped)
    end)

    it("makes the shared request in the first caller's own task, and every caller ends", function()
      s:script("/same", { { status = 200, body = "shared", delay = 0.2 } })
      local scheduler = require "ratewise.scheduler"
      local c = new()
      local live_before, live_during
      local first, second, third
      rw.run(function()
        live_before = scheduler.live()
        first = rw.spawn(function() return c:get("/same") end)
        second = rw.spawn(function() return c:get("/same") end)
        third = rw.spawn(function() return c:get("/same") end)
        rw.sleep(0.05)
        live_during = scheduler.live()
        -- the caller that made the request goes: the others make it again
        first:cancel()
        local res = assert(second:join())
        assert.equal("shared", res.body)
        assert.equal("shared", assert(third:join()).body)
      end)
      assert.equal(live_before + 3, live_during) -- the three callers, and no task of the client's
      assert.equal("cancelled", select(2, first:join()))
      assert.equal(2, #s:log("/same"))
      assert.equal(1, c:stats().deduped) -- the third joined the second's
    end)

    it("leaves the shared request running when a caller that joined it is cancelled", function()
      s:script("/same", { { status = 200, body = "shared", delay = 0.15 } })
      local c = new()
      local first, second
      rw.run(function()
        first = rw.spawn(function() return c:get("/same") end)
        second = rw.spawn(function() return c:get("/same") end)
        rw.sleep(0.05)
        second:cancel()
      end)
      assert.equal("shared", assert(first:join()).body)
      assert.equal("cancelled", select(2, second:join()))
      assert.equal(1, #s:log("/same"))
    end)

    it("raises an error raised in the shared request in every caller that joined it", function()
      s:script("/same", { { status = 200, delay = 0.1 } })
      local c = new { on_event = function(event)
        if event.type == "response" then error("hook failed", 0) end
      end }
      local errors = {}
      rw.run(function()
        local tasks = {}
        for i = 1, 3 do tasks[i] = rw.spawn(function() return c:get("/same") end) end
        for i = 1, 3 do errors[i] = select(2, tasks[i]:join()) end
      end)
      for i = 1, 3 do assert.matches("hook failed", errors[i]) end
      assert.equal(1, #s:log("/same"))
    end)

    it("shares between a task and a caller outside any task", function()
      s:script("/same", { { status = 200, body = "shared", delay = 0.15 } })
      local c = new()
      local scheduler = require "ratewise.scheduler"
      local in_task = scheduler.spawn(function() return c:get("/same") end)
      scheduler.step(0) -- the task starts the request
      local res = assert(c:get("/same")) -- joins it, driving the scheduler meanwhile
      assert.equal("shared", res.body)
      assert.equal("shared", assert(in_task:join()).body)
      assert.equal(1, #s:log("/same"))
    end)

    it("makes the request itself when the call it joined never ends (its coroutine left suspended)", function()
      s:script("/same", { { status = 200, body = "first", delay = 0.2 }, { status = 200, body = "second" } })
      local c = new { max_elapsed = 0.5 }
      -- a coroutine (its runner speaks the yield protocol) that starts the
      -- request, waits, and is never resumed
      local abandoned = rw.speaks_protocol(coroutine.create(function() return c:get("/same") end))
      assert(coroutine.resume(abandoned))
      local t0 = rw.now()
      local res = assert(c:get("/same"))
      local waited = rw.now() - t0
      assert.equal("second", res.body)
      -- its budget (0.5 s from its start) and a second's grace, not for ever
      assert.is_true(waited > 1.2 and waited < 3, "waited " .. waited .. " s")
      assert.equal(2, #s:log("/same"))
      assert.equal(0, c:stats().deduped)
    end)

    it("does not share a request made before the client's credential changed with one made after", function()
      -- (what a path without options made, its key included, is kept: a
      -- token refreshed in place must make another key)
      s:script("/same", { { status = 200, body = "for a", delay = 0.15 }, { status = 200, body = "for b" } })
      local h = { Authorization = "Bearer a" }
      local c = new { headers = h }
      assert(c:get("/same", { query = { warm = 1 } })) -- not the plain path
      local bodies = {}
      rw.run(function()
        assert(c:get("/same"))
        s:reset()
        s:script("/same", { { status = 200, body = "for a", delay = 0.15 }, { status = 200, body = "for b" } })
        rw.spawn(function() bodies.a = assert(c:get("/same")).body end)
        rw.sleep(0.05)
        h.Authorization = "Bearer b"
        rw.spawn(function() bodies.b = assert(c:get("/same")).body end)
      end)
      assert.same({ a = "for a", b = "for b" }, bodies)
      local log = s:log("/same")
      assert.equal(2, #log)
      assert.equal("Bearer a", log[1].headers.authorization)
      assert.equal("Bearer b", log[2].headers.authorization)
      assert.equal(0, c:stats().deduped)
    end)

    it("does not share requests that differ in headers or method", function()
      s:script("/same", { { status = 200, delay = 0.05 } })
      local c = new()
      rw.run(function()
        rw.spawn(function() c:get("/same", { headers = { Authorization = "Bearer a" } }) end)
        rw.spawn(function() c:get("/same", { headers = { Authorization = "Bearer b" } }) end)
        rw.spawn(function() c:post("/same") end)
        rw.spawn(function() c:post("/same") end)
      end)
      assert.equal(4, #s:log("/same"))
    end)

    it("keeps successful responses for cache.ttl seconds when asked", function()
      local c = new { cache = { ttl = 0.3 } }
      assert(c:get("/cached"))
      assert(c:get("/cached"))
      assert.equal(1, #s:log("/cached"))
      rw.sleep(0.35)
      assert(c:get("/cached"))
      assert.equal(2, #s:log("/cached"))
      assert(c:post("/cached"))
      assert(c:post("/cached"))
      assert.equal(4, #s:log("/cached"))
      assert.equal(1, c:stats().cache_hits)
    end)

    it("never caches a failure or a no-store response", function()
      s:script("/nostore", { { status = 200, headers = { ["Cache-Control"] = "no-store" } } })
      s:script("/fail", { { status = 404 } })
      local c = new { cache = { ttl = 10 } }
      c:get("/nostore"); c:get("/nostore")
      c:get("/fail"); c:get("/fail")
      assert.equal(2, #s:log("/nostore"))
      assert.equal(2, #s:log("/fail"))
    end)

    -- The expired copy of /a used to stay in the cache's order list: storing
    -- /b then evicted that old copy, and with it the fresh /a.
    it("keeps an entry fetched again after it expired when a new one comes", function()
      local c = new { cache = { ttl = 0.2, max_entries = 2 } }
      assert(c:get("/a"))
      rw.sleep(0.25)
      assert(c:get("/a")) -- expired: fetched again
      assert(c:get("/b"))
      assert(c:get("/a")) -- the fresh copy
      assert.equal(2, #s:log("/a"))
      assert.equal(1, #s:log("/b"))
      assert(c:get("/c")) -- now /a is the oldest entry: it goes
      assert(c:get("/b"))
      assert(c:get("/a"))
      assert.equal(3, #s:log("/a"))
      assert.equal(1, #s:log("/b"))
      assert.equal(1, #s:log("/c"))
    end)

    it("holds max_entries entries, the oldest going first, however many come and go", function()
      local c = new { cache = { ttl = 10, max_entries = 3 } }
      for round = 1, 3 do
        for i = 1, 50 do assert(c:get("/k" .. i)) end
        for i = 48, 50 do assert(c:get("/k" .. i)) end -- the last three: cached
        for i = 1, 50 do assert.equal(round, #s:log("/k" .. i)) end
      end
      assert.equal(9, c:stats().cache_hits)
    end)
  end)

  describe("telemetry", function()
    it("counts requests, attempts, retries by status and source, waits and errors", function()
      s:script("/t", { { status = 429, headers = { ["Retry-After"] = "1" } }, { status = 503 }, { status = 200 } })
      s:script("/gone", { { status = 410 } })
      local events = {}
      local c = new { sleep = function() end, on_event = function(e) events[#events + 1] = e.type end }
      assert(c:get("/t"))
      c:get("/gone")
      local st = c:stats()
      assert.equal(2, st.requests)
      assert.equal(4, st.attempts)
      assert.equal(2, st.retries)
      assert.equal(1, st.retries_by_status["429"])
      assert.equal(1, st.retries_by_status["503"])
      assert.equal(1, st.retries_by_source["retry-after"])
      assert.equal(1, st.retries_by_source.backoff)
      assert.equal(2, st.waits)
      assert.equal(1, st.successes)
      assert.equal(1, st.failures)
      assert.equal(1, st.errors.terminal)
      assert.equal(1, st.statuses["410"])
      assert.equal(0, st.in_flight)
      assert.is_true(#events >= 7)
      assert.equal("request", events[1])
    end)

    it("calls a call's own on_event beside the client's, each with every event of that call", function()
      s:script("/ev", { { status = 503 }, { status = 200 } })
      local client_events, call_events, plain_events = {}, {}, {}
      local c = new { sleep = function() end, on_event = function(e) client_events[#client_events + 1] = e.type end }
      assert(c:get("/ev", { on_event = function(e) call_events[#call_events + 1] = e.type end }))
      assert.equal(2, #s:log("/ev"))
      assert.is_true(#call_events >= 4, table.concat(call_events, " "))
      assert.are.same(client_events, call_events)
      -- a client without a hook of its own calls the call's alone
      local plain = new { sleep = function() end }
      assert(plain:get("/ok", { on_event = function(e) plain_events[#plain_events + 1] = e.type end }))
      assert.equal("request", plain_events[1])
      assert.error_matches(function() c:get("/ok", { on_event = 1 }) end, "option 'on_event' must be a function")
    end)

    it("counts without an on_event hook, and names an attempt with no response 'network'", function()
      s:script("/t", { { status = 503 } })
      local c = new { sleep = function() end, max_retries = 1, concurrency = 2 }
      local _, err = c:get("/t")
      assert.equal("exhausted", err.kind)
      -- nobody listens on port 1 of loopback: the connection is refused
      local refused = rw.client { base_url = "http://127.0.0.1:1", on_retry = false, sleep = function() end,
        max_retries = 1 }
      _, err = refused:get("/x")
      assert.equal("exhausted", err.kind)
      local st, st2 = c:stats(), refused:stats()
      assert.same({ ["503"] = 2 }, st.statuses)
      assert.same({ ["503"] = 1 }, st.retries_by_status)
      assert.equal(2, st.attempts)
      assert.same({ network = 2 }, st2.statuses)
      assert.same({ network = 1 }, st2.retries_by_status)
      assert.same({ backoff = 1 }, st2.retries_by_source)
      assert.equal(1, st2.errors.exhausted)
    end)
  end)

  describe("calls without options", function()
    it("send nothing of another call's options, whatever came between them", function()
      local c = new { headers = { ["X-Client"] = "1" }, dedupe = false }
      assert(c:get("/t"))
      assert(c:get("/t", { headers = { ["X-Call"] = "yes" }, query = { a = 1 } }))
      assert(c:post("/t", { json = { n = 1 } }))
      assert(c:get("/t"))
      assert(c:post("/t"))
      local log = s:log("/t")
      assert.equal(5, #log)
      assert.equal("yes", log[2].headers["x-call"])
      assert.equal("a=1", log[2].query)
      for _, i in ipairs { 1, 4, 5 } do
        assert.is_nil(log[i].headers["x-call"])
        assert.equal("", log[i].query or "")
        assert.equal("1", log[i].headers["x-client"])
      end
      assert.equal("application/json", log[3].headers["content-type"])
      assert.equal("POST", log[5].method)
      assert.equal("0", log[5].headers["content-length"]) -- not the JSON body of the POST before
    end)

    it("each take the limiter of their route", function()
      local search = rw.bucket { capacity = 2, rate = 0.01 }
      local c = new { routes = { ["/search/"] = search }, dedupe = false }
      assert(c:get("/other"))
      assert(c:get("/search/a"))
      assert(c:get("/other"))
      assert.is_true(search:tokens() < 1.5 and search:tokens() > 0.5) -- one search call took one
    end)

    -- The client keeps what each path called without options made (its
    -- URL and call table), for up to 256 paths, then starts over.
    it("send each path to its own URL under its own route's limiter, however many paths come and go", function()
      local search = rw.bucket { capacity = 1000, rate = 0.01 }
      local c = new { routes = { ["/search/"] = search }, dedupe = false }
      for round = 1, 2 do
        for i = 1, 300 do
          assert(c:get("/p" .. i .. "?round=" .. round))
          if i % 100 == 0 then assert(c:get("/search/q" .. round)) end
        end
      end
      local log = s:log()
      assert.equal(606, #log)
      local k = 0
      for round = 1, 2 do
        for i = 1, 300 do
          k = k + 1
          assert.equal("/p" .. i, log[k].path)
          assert.equal("round=" .. round, log[k].query)
          if i % 100 == 0 then
            k = k + 1
            assert.equal("/search/q" .. round, log[k].path)
          end
        end
      end
      assert.near(994, search:tokens(), 0.5) -- the six search calls, and no other
    end)
  end)
end)

-- lua-cjson is needed by the JSON features only: without it, require
-- "ratewise", rw.fetch and the client work; the json option raises and a
-- JSON response's res:json() answers why, both naming the package to install.
describe("rw.client without lua-cjson", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  it("leaves require, fetch, the client and JSON working, with ratewise's own codec", function()
    s:script("/plain", { { status = 200, body = "ok" } })
    s:script("/json", { { status = 200, body = '{"a":1}', headers = { ["Content-Type"] = "application/json" } } })
    local out, code = require("spec.support.subprocess").run_lua(string.format("local base = %q\n", s.base) .. [[
      -- What a machine without lua-cjson sees: no system module directory
      -- (where Debian's cjson.so lives) is searched.
      local function local_only(path)
        local kept = {}
        for entry in path:gmatch("[^;]+") do
          if not entry:find("^/usr/") then kept[#kept + 1] = entry end
        end
        return table.concat(kept, ";")
      end
      package.cpath, package.path = local_only(package.cpath), local_only(package.path)
      assert(not pcall(require, "cjson"), "cjson can still be loaded")
      local rw = require "ratewise"
      local res = assert(rw.fetch(base .. "/plain", { on_retry = false }))
      print("fetch", res.status, res.body)
      local c = rw.client { base_url = base, on_retry = false }
      res = assert(c:get("/plain"))
      print("client", res.status, res.body)
      res = assert(c:get("/json"))
      print("json", res.status, res.body, res:json().a)
      local ok, err = pcall(c.post, c, "/plain", { json = { a = 1 } })
      print("encode", ok, err)
    ]])
    assert.equal(0, code, out)
    assert.matches("fetch\t200\tok\n", out, 1, true)
    assert.matches("client\t200\tok\n", out, 1, true)
    assert.matches("json\t200\t{\"a\":1}\t1\n", out, 1, true)
    assert.matches("encode\ttrue\t", out, 1, true)
    assert.equal('{"a":1}', s:log("/plain")[3].body)
  end)
end)
