-- rw.fetch against a real HTTP/1.1 server on loopback (spec/support/server.py),
-- asserting what that server saw.
local rw = require "ratewise"
local server = require "spec.support.server"

local quiet = { on_retry = false }

local function opts(extra)
  local o = { on_retry = false }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- Options that record each retry's delay and do not wait for it: for specs
-- about which delay was chosen, not about waiting.
local function recording(extra)
  local delays = {}
  local o = opts(extra)
  o.sleep = function() end
  if o.hint_jitter == nil then o.hint_jitter = 0 end -- exact waits: which wait, not its spread
  o.on_retry = function(info) delays[#delays + 1] = info.delay end
  return delays, o
end

local function lua_cmd(script_path)
  return require("spec.support.subprocess").lua_command(script_path) .. " 2>&1"
end

describe("rw.fetch", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("responses", function()
    it("returns status, headers, body, attempts and elapsed", function()
      s:script("/hello", { {
        status = 200, body = "hi there",
        headers = { ["X-Thing"] = "one", ["X-Multi"] = { "a", "b" }, ["Content-Type"] = "text/plain" },
      } })
      local res = assert(rw.fetch(s:url("/hello"), quiet))
      assert.equal(200, res.status)
      assert.equal("hi there", res.body)
      assert.equal(1, res.attempts)
      assert.is_true(res.elapsed >= 0 and res.elapsed < 1)
      assert.is_false(res.throttled)
      assert.equal(s:url("/hello"), res.url)
      assert.equal("one", res.headers["x-thing"])
      assert.equal("one", res.headers["X-Thing"])
      assert.equal("text/plain", res.headers["CONTENT-TYPE"])
      assert.equal("a, b", res.headers["x-multi"])
      assert.equal(0, res.redirects)
      assert.equal("1.1", res.http_version)
      assert.equal(s:url("/hello"), res.url)
      assert.is_true(res.time >= 0 and res.time < 1)
      -- and the same from a protocol other than HTTP/1.1, after a redirect
      s:script("/old", { { action = "raw", body = "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nold" } })
      s:script("/go", { { action = "redirect", location = "/old" } })
      res = assert(rw.fetch(s:url("/go"), quiet))
      assert.equal("old", res.body)
      assert.equal(1, res.redirects)
      assert.equal("1.0", res.http_version)
      assert.equal(s:url("/old"), res.url)
    end)

    it("sends the method, headers and body it is given", function()
      local res = assert(rw.fetch(s:url("/echo"), opts {
        method = "put", headers = { ["X-Api-Version"] = "7", Accept = "application/json" }, body = "payload",
      }))
      assert.equal(200, res.status)
      local seen = s:log("/echo")[1]
      assert.equal("PUT", seen.method)
      assert.equal("payload", seen.body)
      assert.equal("7", seen.headers["x-api-version"])
      assert.equal("application/json", seen.headers["accept"])
      assert.matches("^ratewise/", seen.headers["user-agent"])
    end)

    -- A function that fetches path with options o and answers the headers
    -- the server saw.
    local function sender(path, o)
      return function()
        assert(rw.fetch(s:url(path), o))
        local log = s:log(path)
        return log[#log].headers
      end
    end

    -- fetch keeps the lines it made from a header table while the table
    -- holds the same names and values (lua/ratewise/fetch/plan.lua, lines_made).
    it("sends what a header table holds at each call, the same table changed between calls", function()
      local h = { Authorization = "Bearer one", ["X-Trace"] = "a" }
      local o = opts { headers = h }
      local sent = sender("/h", o)
      for _ = 1, 3 do
        local seen = sent()
        assert.equal("Bearer one", seen.authorization)
        assert.equal("a", seen["x-trace"])
      end
      h.Authorization = "Bearer two" -- a token refreshed in place
      assert.equal("Bearer two", sent().authorization)
      h["X-Trace"] = nil
      h["X-Other"] = "b"
      local seen = sent()
      assert.is_nil(seen["x-trace"])
      assert.equal("b", seen["x-other"])
      assert.equal("Bearer two", seen.authorization)
      h["User-Agent"] = "mine/1"
      assert.equal("mine/1", sent()["user-agent"])
      h["User-Agent"] = nil
      assert.matches("^ratewise/", sent()["user-agent"])
      h["X-Count"] = 3 -- a number is sent as its text
      assert.equal("3", sent()["x-count"])
      h["X-Count"] = 3.5
      assert.equal("3.5", sent()["x-count"])
      -- what a changed table holds is checked again
      h["X-Evil"] = "a\r\nInjected: yes"
      assert.error_matches(function() rw.fetch(s:url("/h"), o) end,
        "header 'X%-Evil' has a value containing a control character")
      h["X-Evil"] = nil
      h["Idempotency-Key"] = " "
      assert.error_matches(function() rw.fetch(s:url("/h"), opts { headers = h, method = "POST" }) end,
        "header 'Idempotency%-Key' is blank")
      assert.equal(9, #s:log("/h"))
      -- one changed for each call (a request id put into it) is sent as it is each time
      h["Idempotency-Key"] = nil
      for i = 1, 6 do
        h["X-Request-Id"] = "r" .. i
        local got = sent()
        assert.equal("r" .. i, got["x-request-id"])
        assert.equal("Bearer two", got.authorization)
      end
    end)

    -- A table of one header is compared without a loop (fetch/plan.lua, same_headers).
    it("sends what a table of one header holds at each call, changed between calls", function()
      local h = { Authorization = "Bearer one" }
      local sent = sender("/h1", opts { headers = h })
      for _ = 1, 3 do assert.equal("Bearer one", sent().authorization) end
      h.Authorization = "Bearer two"
      assert.equal("Bearer two", sent().authorization)
      h.Authorization = nil
      h["X-Api-Key"] = "k1" -- another name, still one header
      local seen = sent()
      assert.is_nil(seen.authorization)
      assert.equal("k1", seen["x-api-key"])
      h.Authorization = "Bearer three" -- a second one
      seen = sent()
      assert.equal("k1", seen["x-api-key"])
      assert.equal("Bearer three", seen.authorization)
      h["X-Api-Key"], h.Authorization = nil, nil -- none
      seen = sent()
      assert.is_nil(seen["x-api-key"])
      assert.is_nil(seen.authorization)
      h.Authorization = "Bearer four"
      assert.equal("Bearer four", sent().authorization)
      -- one header seen through a metatable's __pairs is read as pairs gives it
      setmetatable(h, { __pairs = function() return next, { Authorization = "Bearer five" }, nil end })
      if _VERSION ~= "Lua 5.1" then -- 5.1 and LuaJIT have no __pairs
        assert.equal("Bearer five", sent().authorization)
      end
      assert.equal(8 + (_VERSION ~= "Lua 5.1" and 1 or 0), #s:log("/h1"))
    end)

    it("labels each JSON call's body as JSON, the same header table used with and without one", function()
      local h = { Authorization = "Bearer one" }
      local function call(o)
        o.headers, o.on_retry, o.max_retries = h, false, 0
        assert(rw.fetch(s:url("/j"), o))
        local log = s:log("/j")
        return log[#log]
      end
      for _ = 1, 3 do
        local seen = call { method = "POST", json = { n = 1 } }
        assert.equal("application/json", seen.headers["content-type"])
        assert.equal("application/json", seen.headers.accept)
        assert.equal('{"n":1}', seen.body)
        seen = call {}
        assert.is_nil(seen.headers["content-type"])
        assert.equal("*/*", seen.headers.accept)
        assert.equal("Bearer one", seen.headers.authorization)
      end
      h.Accept = "application/vnd.api+json" -- the caller's own, kept
      local seen = call { method = "POST", json = { n = 2 } }
      assert.equal("application/vnd.api+json", seen.headers.accept)
      assert.equal("application/json", seen.headers["content-type"])
    end)

    it("labels JSON calls without headers of their own, a key on the call that has one only", function()
      local function call(o)
        o.on_retry, o.max_retries = false, 0
        assert(rw.fetch(s:url("/jn"), o))
        local log = s:log("/jn")
        return log[#log].headers
      end
      for round = 1, 3 do
        for _, keyed in ipairs { false, true, false } do
          local seen = call { method = "POST", json = { round = round },
            idempotency_key = keyed and ("key-" .. round) or nil }
          assert.equal("application/json", seen["content-type"])
          assert.equal("application/json", seen.accept)
          assert.matches("^ratewise/", seen["user-agent"])
          assert.equal(keyed and ("key-" .. round) or nil, seen["idempotency-key"])
        end
      end
      assert.equal(9, #s:log("/jn"))
    end)

    it("sends Content-Length: 0 on a POST without a body", function()
      assert(rw.fetch(s:url("/echo"), opts { method = "POST" }))
      assert.equal("0", s:log("/echo")[1].headers["content-length"])
    end)

    it("labels a body as a form unless the headers name a Content-Type, as curl -d does (docs/reference.md)",
      function()
        assert(rw.fetch(s:url("/echo"), opts { method = "PUT", body = "a=1" }))
        assert(rw.fetch(s:url("/echo"), opts { method = "PUT", body = "{}",
          headers = { ["Content-Type"] = "application/json" } }))
        local log = s:log("/echo")
        assert.equal("application/x-www-form-urlencoded", log[1].headers["content-type"])
        assert.equal("application/json", log[2].headers["content-type"])
        assert.equal("{}", log[2].body)
      end)

    it("answers HEAD without a body", function()
      local res = assert(rw.fetch(s:url("/echo"), opts { method = "HEAD" }))
      assert.equal(200, res.status)
      assert.equal("", res.body)
      assert.equal("HEAD", s:log("/echo")[1].method)
    end)

    it("follows redirects by default, and returns a 3xx when told not to", function()
      s:script("/moved", { { action = "redirect", location = "/final" } })
      s:script("/final", { { status = 200, body = "here" } })
      local res = assert(rw.fetch(s:url("/moved"), quiet))
      assert.equal("here", res.body)
      res = assert(rw.fetch(s:url("/moved"), opts { follow_redirects = false }))
      assert.equal(302, res.status)
      assert.equal("/final", res.headers.location)
    end)
  end)

  describe("upstream hints are minimum waits", function()
    it("waits out Retry-After: 1 before the retry reaches the server", function()
      s:script("/ra", { { status = 429, headers = { ["Retry-After"] = "1" } }, { status = 200 } })
      local res = assert(rw.fetch(s:url("/ra"), quiet))
      assert.equal(2, res.attempts)
      local log = s:log("/ra")
      assert.equal(2, #log)
      local gap = log[2].t - log[1].t
      assert.is_true(gap >= 1.0, "retry came after " .. gap .. " s")
      assert.is_true(gap < 1.3, "retry came after " .. gap .. " s")
    end)

    it("waits until a Retry-After HTTP-date", function()
      local at = os.time() + 2
      s:script("/date", {
        { status = 503, headers = { ["Retry-After"] = os.date("!%a, %d %b %Y %H:%M:%S GMT", at) } },
        { status = 200 },
      })
      assert(rw.fetch(s:url("/date"), quiet))
      local log = s:log("/date")
      assert.is_true(log[2].wall >= at, string.format("retry at %.3f, asked for %d", log[2].wall, at))
    end)

    it("waits until x-ratelimit-reset (epoch seconds)", function()
      local at = os.time() + 2
      s:script("/reset", { { status = 429, headers = { ["X-RateLimit-Reset"] = tostring(at) } }, { status = 200 } })
      assert(rw.fetch(s:url("/reset"), quiet))
      local log = s:log("/reset")
      assert.is_true(log[2].wall >= at, string.format("retry at %.3f, asked for %d", log[2].wall, at))
    end)

    it("never caps a hint with max_delay, which caps only the fallback backoff", function()
      local asked, o = recording { max_delay = 0.5 }
      s:script("/big", { { status = 429, headers = { ["Retry-After"] = "30" } }, { status = 503 }, { status = 200 } })
      assert(rw.fetch(s:url("/big"), o))
      assert.equal(30, asked[1])
      assert.is_true(asked[2] < 0.5)
    end)

    it("lets a delay hook lengthen a wait or replace the backoff, never shorten a hint", function()
      local seen = {}
      s:script("/hook", {
        { status = 429, headers = { ["Retry-After"] = "5" } },
        { status = 503 },
        { status = 503 },
        { status = 200 },
      })
      local asked, o = recording {
        delay = function(res, attempt)
          seen[#seen + 1] = { status = res.status, attempt = attempt }
          if attempt == 2 then return nil end
          return 2
        end,
      }
      local res = assert(rw.fetch(s:url("/hook"), o))
      assert.equal(4, res.attempts)
      assert.same({ 5, 2 }, { asked[1], asked[2] })   -- 2 < the hint of 5; 2 replaces backoff
      assert.is_true(asked[3] < 4)                       -- nil: the built-in backoff
      assert.same({ status = 429, attempt = 0 }, seen[1])
      assert.same({ status = 503, attempt = 1 }, seen[2])
    end)
  end)

  describe("the time budget", function()
    it("stops at once when a hint will not fit in max_elapsed", function()
      s:script("/long", { { status = 429, headers = { ["Retry-After"] = "10" } }, { status = 200 } })
      local t0 = rw.now()
      local res, err = rw.fetch(s:url("/long"), opts { max_elapsed = 2 })
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.equal(429, err.status)
      assert.equal(429, err.response.status)
      assert.equal(1, err.attempts)
      assert.is_true(rw.now() - t0 < 0.5)
      assert.equal(1, #s:log("/long"))
      assert.matches("10.00 s", err.message)
    end)

    it("cuts an attempt's timeout to what is left of the budget", function()
      s:script("/hang", { { action = "hang", delay = 10 } })
      local t0 = rw.now()
      local res, err = rw.fetch(s:url("/hang"), opts { timeout = 30, max_elapsed = 0.6 })
      local took = rw.now() - t0
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.is_true(took >= 0.55 and took < 0.7, "took " .. took)
    end)

    it("counts the limiter's waits against the budget", function()
      local b = rw.bucket { capacity = 1, rate = 2 }
      b:acquire()
      local res, err = rw.fetch(s:url("/x"), opts { limiter = b, max_elapsed = 0.3 })
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.equal(0, #s:log("/x"))
    end)
  end)

  describe("replay safety", function()
    it("retries GET, HEAD, OPTIONS, PUT and DELETE", function()
      for _, method in ipairs { "GET", "HEAD", "OPTIONS", "PUT", "DELETE" } do
        s:reset()
        s:script("/m", { { status = 503 }, { status = 200 } })
        local res = assert(rw.fetch(s:url("/m"), opts { method = method, sleep = function() end }))
        assert.equal(2, res.attempts, method)
        assert.equal(2, #s:log("/m"), method)
      end
    end)

    it("does not replay a POST or PATCH: kind unsafe right after the first failure", function()
      for _, method in ipairs { "POST", "PATCH" } do
        s:reset()
        s:script("/p", { { status = 503 }, { status = 200 } })
        local res, err = rw.fetch(s:url("/p"), opts { method = method, body = "{}" })
        assert.is_nil(res)
        assert.equal("unsafe", err.kind)
        assert.equal(503, err.status)
        assert.equal(1, err.attempts)
        assert.equal(1, #s:log("/p"))
        assert.matches("idempotency_key", err.message)
      end
    end)

    it("does not replay a POST whose connection failed after it was sent", function()
      s:script("/p", { { action = "drop" }, { status = 200 } })
      local res, err = rw.fetch(s:url("/p"), opts { method = "POST", body = "x" })
      assert.is_nil(res)
      assert.equal("unsafe", err.kind)
      assert.is_nil(err.status)
      assert.equal(1, #s:log("/p"))
    end)

    it("retries a POST with retry_non_idempotent", function()
      s:script("/p", { { status = 502 }, { status = 201 } })
      local res = assert(rw.fetch(s:url("/p"), opts { method = "POST", retry_non_idempotent = true,
        sleep = function() end }))
      assert.equal(201, res.status)
      assert.equal(2, #s:log("/p"))
    end)

    it("retries a POST with an idempotency key, sending the same key every time", function()
      s:script("/p", { { status = 503 }, { status = 429 }, { status = 200 } })
      local res = assert(rw.fetch(s:url("/p"), opts { method = "POST", body = "charge",
        idempotency_key = "order-42", sleep = function() end }))
      assert.equal(3, res.attempts)
      for _, seen in ipairs(s:log("/p")) do
        assert.equal("order-42", seen.headers["idempotency-key"])
        assert.equal("charge", seen.body)
      end
    end)

    it("generates a UUIDv4 key for idempotency_key = true, the same on every attempt", function()
      s:script("/p", { { status = 503 }, { status = 200 } })
      assert(rw.fetch(s:url("/p"), opts { method = "POST", idempotency_key = true, sleep = function() end }))
      local log = s:log("/p")
      local key = log[1].headers["idempotency-key"]
      assert.matches("^%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89ab]%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$", key)
      assert.equal(key, log[2].headers["idempotency-key"])
      assert(rw.fetch(s:url("/p"), opts { method = "POST", idempotency_key = true }))
      assert.not_equal(key, s:log("/p")[3].headers["idempotency-key"])
    end)

    it("treats an Idempotency-Key header as making the request replay-safe", function()
      s:script("/p", { { status = 503 }, { status = 200 } })
      assert(rw.fetch(s:url("/p"), opts { method = "POST", headers = { ["Idempotency-Key"] = "k1" },
        sleep = function() end }))
      assert.equal(2, #s:log("/p"))
    end)
  end)

  describe("terminal statuses and max_retries", function()
    it("never retries a terminal status", function()
      for _, status in ipairs { 400, 401, 403, 404, 422, 501 } do
        s:reset()
        s:script("/t", { { status = status, body = "nope" } })
        local res, err = rw.fetch(s:url("/t"), quiet)
        assert.is_nil(res)
        assert.equal("terminal", err.kind)
        assert.equal(status, err.status)
        assert.equal("nope", err.response.body)
        assert.equal(1, err.attempts)
        assert.equal(1, #s:log("/t"))
        assert.matches("terminal", tostring(err))
      end
    end)

    it("bounds the retries with max_retries: kind exhausted", function()
      s:script("/e", { { status = 500 } })
      local res, err = rw.fetch(s:url("/e"), opts { max_retries = 2, sleep = function() end })
      assert.is_nil(res)
      assert.equal("exhausted", err.kind)
      assert.equal(500, err.status)
      assert.equal(3, err.attempts)
      assert.equal(3, #s:log("/e"))
      local _, err0 = rw.fetch(s:url("/e"), opts { max_retries = 0 })
      assert.equal("exhausted", err0.kind)
      assert.equal(1, err0.attempts)
    end)

    it("retries each retryable status", function()
      for _, status in ipairs { 408, 429, 500, 502, 503, 504 } do
        s:reset()
        s:script("/r", { { status = status }, { status = 200 } })
        local res = assert(rw.fetch(s:url("/r"), opts { sleep = function() end }))
        assert.equal(2, res.attempts, status)
      end
    end)
  end)

  describe("transport failures", function()
    -- libcurl itself re-sends a request once when a reused connection dies
    -- before any answer, so the attempts the caller sees may be one or two;
    -- the server's log tells what happened.
    for _, action in ipairs { "drop", "reset", "garbage", "truncate" } do
      it("retries after a connection that ends in a " .. action, function()
        s:script("/f", { { action = action, body = "partial" }, { status = 200, body = "fine" } })
        local infos = {}
        local res = assert(rw.fetch(s:url("/f"), {
          sleep = function() end, on_retry = function(info) infos[#infos + 1] = info end,
        }))
        assert.equal("fine", res.body)
        assert.equal(2, #s:log("/f"))
        assert.equal(#infos + 1, res.attempts)
        if infos[1] then
          assert.is_nil(infos[1].status)
          assert.is_string(infos[1].error)
          assert.equal("backoff", infos[1].source)
        end
      end)

      it("does not replay a POST after a connection that ends in a " .. action, function()
        assert(rw.fetch(s:url("/warm"), quiet)) -- leave an idle connection to reuse
        s:script("/f", { { action = action, body = "partial" }, { status = 200, body = "fine" } })
        local res, err = rw.fetch(s:url("/f"), opts { method = "POST", body = "once" })
        assert.is_nil(res)
        assert.equal("unsafe", err.kind)
        assert.equal(1, #s:log("/f"))
      end)
    end

    it("retries after an attempt timed out", function()
      s:script("/slow", { { action = "hang", delay = 5 }, { status = 200 } })
      local t0 = rw.now()
      local res = assert(rw.fetch(s:url("/slow"), opts { timeout = 0.3, sleep = function() end }))
      assert.equal(2, res.attempts)
      assert.is_true(rw.now() - t0 < 1)
    end)

    it("retries a refused connection, even for a POST, since nothing was sent", function()
      local res, err = rw.fetch("http://127.0.0.1:1/", opts { method = "POST", max_retries = 2,
        sleep = function() end })
      assert.is_nil(res)
      assert.equal("exhausted", err.kind)
      assert.equal(3, err.attempts)
      assert.is_nil(err.status)
      assert.is_nil(err.response)
    end)

    describe("over TLS", function()
      local tls
      setup(function() tls = server.start_tls() end)
      teardown(function() tls:stop() end)

      it("verifies certificates by default and does not retry a failure", function()
        local t0 = rw.now()
        local res, err = rw.fetch(tls:url("/x"), { on_retry = function() error("must not retry") end })
        assert.is_nil(res)
        assert.equal("network", err.kind)
        assert.equal(1, err.attempts)
        assert.matches("TLS", err.message)
        assert.is_true(rw.now() - t0 < 1)
      end)

      it("connects with verify_tls = false, for that call only", function()
        local res = assert(rw.fetch(tls:url("/x"), opts { verify_tls = false }))
        assert.equal(200, res.status)
        local _, err = rw.fetch(tls:url("/x"), quiet)
        assert.equal("network", err.kind)
      end)
    end)
  end)

  describe("connections", function()
    it("sends each request as asked, whatever the request before it on a recycled handle", function()
      local sequence = {
        { method = "HEAD" }, { method = "GET" },
        { method = "POST", body = "one" }, { method = "GET" },
        { method = "PUT", body = "two" }, { method = "DELETE" }, { method = "GET" },
        { method = "PATCH", body = "three", timeout = 5 }, { method = "OPTIONS" }, { method = "GET" },
      }
      for _, req in ipairs(sequence) do
        local res = assert(rw.fetch(s:url("/echo"), opts(req)))
        assert.equal(200, res.status)
        if req.method ~= "HEAD" then assert.matches('"method"', res.body) end
      end
      local log = s:log("/echo")
      assert.equal(#sequence, #log)
      for i, req in ipairs(sequence) do
        assert.equal(req.method, log[i].method)
        assert.equal(req.body or "", log[i].body)
        if req.method == "GET" or req.method == "DELETE" or req.method == "HEAD" then
          assert.is_nil(log[i].headers["content-length"], req.method)
        end
      end
    end)

    it("receives a big body whole after many small ones shrank the receive buffer", function()
      -- The engine sizes libcurl's receive buffer to the responses it sees:
      -- 1 KiB after these, so the big body arrives in hundreds of pieces.
      s:script("/small", { { status = 200, body = "ok" } })
      for _ = 1, 40 do assert(rw.fetch(s:url("/small"), quiet)) end
      local big = {}
      for i = 1, 30000 do big[i] = string.format("%09d\n", i) end
      big = table.concat(big)
      s:script("/big", { { status = 200, body = big } })
      local res = assert(rw.fetch(s:url("/big"), quiet))
      assert.equal(#big, #res.body)
      assert.is_true(res.body == big)
      -- and the buffer grows back: the next big ones are whole too
      for _ = 1, 10 do assert.is_true(assert(rw.fetch(s:url("/big"), quiet)).body == big) end
      assert.equal("ok", assert(rw.fetch(s:url("/small"), quiet)).body)
    end)

    it("parses folded, repeated and long-named response headers", function()
      local long = string.rep("x", 300)
      s:script("/hdr", { { action = "raw", body = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
        .. "X-Folded: first\r\n  second\r\n\tthird\r\nX-Rep: a\r\nX-REP: b\r\n"
        .. long .. "-Name: v\r\nBad Name: dropped\r\n\r\nok" } })
      local res = assert(rw.fetch(s:url("/hdr"), quiet))
      assert.equal("ok", res.body)
      assert.equal("first second third", res.headers["x-folded"])
      assert.equal("a, b", res.headers["x-rep"])
      assert.equal("v", res.headers[long .. "-name"])
      assert.is_nil(res.headers["bad name"])
    end)

    it("keeps one connection alive across attempts and calls", function()
      s:script("/k", { { status = 503, body = string.rep("e", 100000) }, { status = 200 } })
      assert(rw.fetch(s:url("/k"), opts { sleep = function() end }))
      assert(rw.fetch(s:url("/k"), quiet))
      assert(rw.fetch(s:url("/other"), quiet))
      local log = s:log()
      assert.equal(4, #log)
      for i = 2, 4 do
        assert.equal(log[1].conn, log[i].conn)
        assert.equal(log[i - 1].conn_seq + 1, log[i].conn_seq)
      end
    end)
  end)

  describe("many calls at once", function()
    it("sends each task's own method, headers and body", function()
      local calls = {}
      for i = 1, 40 do
        calls[i] = { method = (i % 3 == 0) and "PUT" or (i % 3 == 1) and "POST" or "GET",
          body = (i % 3 ~= 2) and ("body-" .. i) or nil, headers = { ["X-Call"] = tostring(i) } }
      end
      local results = rw.map(calls, function(call)
        return assert(rw.fetch(s:url("/echo"), opts(call))).status
      end, { concurrency = 8 })
      for i = 1, #calls do assert.equal(200, results[i]) end
      local log = s:log("/echo")
      assert.equal(#calls, #log)
      local seen = {}
      for _, entry in ipairs(log) do
        local i = tonumber(entry.headers["x-call"])
        assert.is_nil(seen[i])
        seen[i] = true
        assert.equal(calls[i].method, entry.method)
        assert.equal(calls[i].body or "", entry.body)
      end
    end)
  end)

  describe("the limiter and on_retry", function()
    it("calls limiter:acquire(1) before every attempt, retries included", function()
      local calls = {}
      local limiter = { acquire = function(_, n) calls[#calls + 1] = n end }
      s:script("/l", { { status = 503 }, { status = 503 }, { status = 200 } })
      assert(rw.fetch(s:url("/l"), opts { limiter = limiter, sleep = function() end }))
      assert.same({ 1, 1, 1 }, calls)
    end)

    it("paces requests through a bucket", function()
      local b = rw.bucket { capacity = 1, rate = 10 }
      for _ = 1, 4 do assert(rw.fetch(s:url("/paced"), opts { limiter = b })) end
      local log = s:log("/paced")
      assert.is_true(log[4].t - log[1].t >= 0.29, tostring(log[4].t - log[1].t))
    end)

    it("tells on_retry the status, delay, attempt, max_retries and source", function()
      s:script("/i", { { status = 429, headers = { ["Retry-After"] = "2" } }, { status = 503 }, { status = 200 } })
      local infos = {}
      assert(rw.fetch(s:url("/i"), {
        sleep = function() end, max_retries = 5,
        on_retry = function(info) infos[#infos + 1] = info end,
      }))
      assert.equal(2, #infos)
      assert.equal(429, infos[1].status)
      -- the hint, spread upwards by at most hint_jitter (0.2 by default)
      assert.is_true(infos[1].delay >= 2 and infos[1].delay <= 2.4, tostring(infos[1].delay))
      assert.equal(1, infos[1].attempt)
      assert.equal(5, infos[1].max_retries)
      assert.equal("retry-after", infos[1].source)
      assert.equal(503, infos[2].status)
      assert.equal(2, infos[2].attempt)
      assert.equal("backoff", infos[2].source)
      assert.is_nil(infos[1].error)
    end)

    it("reports a failing callback clearly", function()
      s:script("/cb", { { status = 503 }, { status = 200 } })
      local ok, msg = pcall(rw.fetch, s:url("/cb"), { sleep = function() end, on_retry = function() error("boom") end })
      assert.is_false(ok)
      assert.matches("'on_retry' callback raised an error: .*boom", msg)
      s:script("/cb", { { status = 503 }, { status = 200 } })
      ok, msg = pcall(rw.fetch, s:url("/cb"), opts { sleep = function() end, delay = function() return "soon" end })
      assert.is_false(ok)
      assert.matches("'delay' callback must return", msg)
    end)
  end)

  describe("secrets", function()
    it("never prints Authorization, Cookie or URL userinfo, in logs or errors", function()
      s:script("/s1", {
        { status = 503, body = "busy" },
        { action = "drop" },
        { action = "redirect", location = "/s2" },
      })
      s:script("/s2", { { status = 429, headers = { ["Retry-After"] = "0" } } })
      local script = os.tmpname()
      local f = assert(io.open(script, "w"))
      f:write(([[
        local rw = require "ratewise"
        local secret_url = "http://alice-user:pass-secret-789@127.0.0.1:%d/s1?api_key=key-secret-000"
        local headers = { Authorization = "Bearer sk-secret-token-123", Cookie = "session=cookie-secret-456",
          ["Proxy-Authorization"] = "Basic proxy-secret-321" }
        local res, err = rw.fetch(secret_url, { headers = headers, base = 0.01, max_retries = 4 })
        print(tostring(err)); print(err.message)
        local res2, err2 = rw.fetch("http://alice-user:pass-secret-789@127.0.0.1:1/x?api_key=key-secret-000",
          { headers = headers, base = 0.01, max_retries = 1, method = "POST", body = "x" })
        print(tostring(err2)); print(err2.message, err2.transport and err2.transport.message)
        rw.fetch(secret_url, { headers = headers, base = 0.01, max_retries = 1, on_retry = function(info)
          for k, v in pairs(info) do print("info", k, v) end
        end })
      ]]):format(s.port))
      f:close()
      local p = assert(io.popen(lua_cmd(script)))
      local out = p:read("*a")
      p:close()
      os.remove(script)
      assert.matches("retrying GET http://127.0.0.1:%d+/s1 in %d.%d%d s %(503, attempt 1/4, backoff%)", out)
      assert.matches("exhausted", out)
      assert.matches("info%s+url%s+http://127.0.0.1", out)
      for _, secret in ipairs { "sk-secret-token-123", "cookie-secret-456", "pass-secret-789", "alice-user",
        "proxy-secret-321", "key-secret-000" } do
        assert.is_nil(out:find(secret, 1, true), secret .. " leaked in:\n" .. out)
      end
      -- ...and the server did receive them: they were sent, just never printed.
      local seen = s:log("/s1")[1]
      assert.equal("Bearer sk-secret-token-123", seen.headers.authorization)
    end)
  end)

  describe("the URLs of an origin already seen", function()
    -- fetch learns an origin's scheme://host:port once and then prints each
    -- of its URLs with two finds; what it prints and the origin it keys a
    -- circuit on must be what the full parse (headers.lua) makes of the URL.
    it("are printed and keyed as the full parse would, and refused as it would", function()
      local headers = require "ratewise.headers"
      local origins = {}
      local circuit = {
        allow = function(_, origin) origins[#origins + 1] = origin return true end,
        record = function() end,
      }
      local authority = "127.0.0.1:" .. s.port
      local urls = {
        s:url("/first"), -- the origin is learned here
        s:url("/plain"),
        s:url("/q?api_key=key-secret-000&x=1"),
        s:url("/frag#part"),
        s:url("/users/@me?token=secret-at"),
        "http://alice:pass-secret@" .. authority .. "/userinfo?k=v",
        "HTTP://" .. authority .. "/upper?k=v",
        "HTTP://" .. authority .. "/upper-again", -- a head seen: its origin is still lower-case
        "http://" .. authority .. "?only-query",
        "http://" .. authority,
      }
      -- and again, in the other order: each URL then is one fetch has seen
      -- (what it found is kept by URL), never the URL of the call before
      local calls = {}
      for i = 1, #urls do calls[i] = urls[i] end
      for i = #urls, 1, -1 do calls[#calls + 1] = urls[i] end
      for _, url in ipairs(calls) do
        local res = assert(rw.fetch(url, { on_retry = false, circuit = circuit }))
        assert.equal(200, res.status)
        assert.equal(headers.redact_url(url), res.url, url)
        assert.equal(headers.origin(url), origins[#origins], url)
        assert.is_nil(res.url:find("secret", 1, true))
      end
      assert.equal(#calls, #origins)
      -- a 404's message names the URL the same way
      s:script("/gone", { { status = 404 } })
      local _, err = rw.fetch(s:url("/gone?api_key=key-secret-000"), quiet)
      assert.matches("GET http://127.0.0.1:%d+/gone: 404", err.message)
      assert.is_nil(err.message:find("secret", 1, true))
      -- what check_url refuses is refused on a known origin too
      assert.error_matches(function() rw.fetch(s:url("/a b")) end, "a space or a control character")
      assert.error_matches(function() rw.fetch(s:url("/a\r\nX: y")) end, "a space or a control character")
      assert.equal(0, #s:log("/a b"))
    end)
  end)

  describe("options a call inherits", function()
    -- setmetatable({ max_elapsed = left }, { __index = base }): how a
    -- per-call deadline or header is written over shared options.
    it("uses and checks the options of an __index table as the call's own", function()
      local base = { on_retry = false, headers = { ["X-From-Base"] = "yes" }, decompress = false }
      local res = assert(rw.fetch(s:url("/inherit"), setmetatable({ max_elapsed = 5 }, { __index = base })))
      assert.equal(200, res.status)
      local seen = s:log("/inherit")[1].headers
      assert.equal("yes", seen["x-from-base"])
      assert.is_nil(seen["accept-encoding"]) -- decompress = false, from the base
      -- a grandparent's too, and the call's own win
      local grand = setmetatable({ headers = { ["X-Level"] = "base" } },
        { __index = { timeout = 7, on_retry = false } })
      assert(rw.fetch(s:url("/grand"), setmetatable({ headers = { ["X-Level"] = "own" } }, { __index = grand })))
      assert.equal("own", s:log("/grand")[1].headers["x-level"])
      -- a bad inherited option is refused by name, before anything is sent
      assert.error_matches(function()
        rw.fetch(s:url("/bad"), setmetatable({}, { __index = { timeout = -1 } }))
      end, "option 'timeout' must be a positive number")
      assert.error_matches(function()
        rw.fetch(s:url("/bad"), setmetatable({}, { __index = { retries = 3 } }))
      end, "unknown option 'retries'")
      assert.equal(0, #s:log("/bad"))
      -- the caller's tables are left as they were
      assert.is_nil(rawget(base, "max_elapsed"))
    end)

    it("takes a call with common options only for a GET, and reads every option of the others", function()
      local function method_seen(path) return s:log(path)[1].method end
      -- common ones only: a GET, its headers and timeouts as given
      local common = { on_retry = false, timeout = 5, max_retries = 1, headers = { ["X-Common"] = "yes" } }
      assert.equal(200, assert(rw.fetch(s:url("/common"), common)).status)
      assert.equal("GET", method_seen("/common"))
      assert.equal("yes", s:log("/common")[1].headers["x-common"])
      -- the same table with one more option, a method: read at the next call
      common.method = "HEAD"
      assert(rw.fetch(s:url("/grown"), common))
      assert.equal("HEAD", method_seen("/grown"))
      common.method = nil
      -- method = "GET" is a common option (an rw.client's calls name it); any
      -- other method, or a GET with a body, is not
      for _, case in ipairs {
        { { method = "GET" }, "GET" }, { { method = "GET", on_retry = false }, "GET" },
        { { method = "GET", on_retry = false, timeout = 5 }, "GET" }, { { method = "get" }, "GET" },
        { { method = "PUT", on_retry = false }, "PUT" }, { { on_retry = false, method = "OPTIONS" }, "OPTIONS" },
      } do
        s:reset()
        assert(rw.fetch(s:url("/method"), case[1]))
        assert.equal(case[2], method_seen("/method"))
      end
      assert.error_matches(function() rw.fetch(s:url("/method"), { method = "GET", body = "x" }) end,
        "a GET request cannot carry a body")
      assert.error_matches(function() rw.fetch(s:url("/method"), { method = "GET", json = {} }) end,
        "a GET request cannot carry a body")
      -- an option behind an __index table, or an __index function
      assert(rw.fetch(s:url("/inherited"), setmetatable({ timeout = 5 }, { __index = { method = "HEAD" } })))
      assert.equal("HEAD", method_seen("/inherited"))
      local read_by_fn = setmetatable({ on_retry = false }, { __index = function(_, k)
        if k == "method" then return "DELETE" end
      end })
      assert(rw.fetch(s:url("/by_fn"), read_by_fn))
      assert.equal("DELETE", method_seen("/by_fn"))
      -- transport options beside common ones go to the engine, and only for their own call
      local plain_tls = { on_retry = false, decompress = false, connect_timeout = 2, headers = { ["X-T"] = "1" } }
      assert.equal(200, assert(rw.fetch(s:url("/transport"), plain_tls)).status)
      local seen = s:log("/transport")[1]
      assert.equal("GET", seen.method)
      assert.is_nil(seen.headers["accept-encoding"])
      assert.equal("1", seen.headers["x-t"])
      assert(rw.fetch(s:url("/after"), common))
      assert.is_string(s:log("/after")[1].headers["accept-encoding"])
      -- the same, checked first (a client checks where the call is made)
      local fetch_module = require "ratewise.fetch"
      local checked_first = { on_retry = false, decompress = false }
      fetch_module.check(s:url("/checked"), checked_first)
      assert(fetch_module.fetch(s:url("/checked"), checked_first))
      assert.is_nil(s:log("/checked")[1].headers["accept-encoding"])
      assert(rw.fetch(s:url("/after2"), common))
      assert.is_string(s:log("/after2")[1].headers["accept-encoding"])
      -- a bad transport option beside common ones is refused by name
      assert.error_matches(function() rw.fetch(s:url("/bad_ca"), { on_retry = false, ca_file = 42 }) end,
        "option 'ca_file'")
      assert.equal(0, #s:log("/bad_ca"))
      -- a limiter beside common options is asked
      local asked = 0
      local limiter = { acquire = function() asked = asked + 1 return true end }
      assert(rw.fetch(s:url("/limited"), { on_retry = false, timeout = 5, limiter = limiter }))
      assert.equal(1, asked)
    end)

    -- fetch keeps what its check of the last table found (one table passed
    -- to every call): a table changed since is checked again.
    it("checks a table passed again once anything in it changed, whatever changed", function()
      local passed = { on_retry = false, timeout = 5 }
      for _ = 1, 3 do assert(rw.fetch(s:url("/same"), passed)) end
      passed.timeout = -1
      assert.error_matches(function() rw.fetch(s:url("/same"), passed) end,
        "option 'timeout' must be a positive number")
      passed.timeout = 5
      assert(rw.fetch(s:url("/same"), passed))
      passed.timeout = nil
      passed.retries = 3
      assert.error_matches(function() rw.fetch(s:url("/same"), passed) end, "unknown option 'retries'")
      passed.retries = nil
      -- a method, then a body: the request they make, not the GET before
      assert(rw.fetch(s:url("/same"), passed))
      passed.method = "PUT"
      assert(rw.fetch(s:url("/same"), passed))
      passed.body = "b"
      assert(rw.fetch(s:url("/same"), passed))
      passed.method = "GET"
      assert.error_matches(function() rw.fetch(s:url("/same"), passed) end, "a GET request cannot carry a body")
      local log = s:log("/same")
      assert.equal("PUT", log[#log - 1].method)
      assert.equal("PUT", log[#log].method)
      assert.equal("b", log[#log].body)
      -- a table whose option is checked for its contents is checked at every call
      local named = { on_retry = false, secret_headers = { "X-Token" } }
      assert(rw.fetch(s:url("/named"), named))
      assert(rw.fetch(s:url("/named"), named))
      named.secret_headers[2] = 5
      assert.error_matches(function() rw.fetch(s:url("/named"), named) end,
        "^fetch: option 'secret_headers' must be an array of header names")
      assert.equal(2, #s:log("/named"))
    end)

    it("reads options through an __index function; a loop of __index tables raises", function()
      local base = { on_retry = false, decompress = false }
      local proxy = setmetatable({}, { __index = function(_, k) return base[k] end })
      assert(rw.fetch(s:url("/fn"), proxy))
      assert.is_nil(s:log("/fn")[1].headers["accept-encoding"])
      local a, b = { on_retry = false }, { timeout = 5 }
      setmetatable(a, { __index = b })
      setmetatable(b, { __index = a })
      -- Lua itself refuses to read a missing field through such a loop
      assert.error_matches(function() rw.fetch(s:url("/loop"), setmetatable({}, { __index = a })) end,
        "loop") -- "'__index' chain too long; possible loop", "loop in gettable" on 5.1
      assert.equal(0, #s:log("/loop"))
    end)
  end)

  describe("bad input", function()
    it("refuses a URL that is not http(s)", function()
      for _, url in ipairs { "file:///etc/passwd", "ftp://example.com/", "gopher://x", "example.com", "" } do
        assert.error_matches(function() rw.fetch(url) end, "url must be http")
      end
      assert.error_matches(function() rw.fetch(42) end, "url must be a string")
      assert.error_matches(function() rw.fetch("http://a b/") end, "a space or a control character")
    end)

    it("refuses a redirect to a scheme that is not http(s)", function()
      s:script("/r", { { action = "redirect", location = "file:///etc/passwd" } })
      local res, err = rw.fetch(s:url("/r"), quiet)
      assert.is_nil(res)
      assert.equal("network", err.kind)
      assert.equal(1, err.attempts)
    end)

    it("refuses header names and values with CR or LF, without echoing the value", function()
      assert.error_matches(function()
        rw.fetch(s:url("/x"), { headers = { ["X-Evil"] = "a\r\nInjected: yes" } })
      end, "header 'X%-Evil' has a value containing a control character")
      assert.error_matches(function()
        rw.fetch(s:url("/x"), { headers = { ["Bad\nName"] = "v" } })
      end, "not a valid HTTP field name")
      local ok, msg = pcall(rw.fetch, s:url("/x"), { headers = { Authorization = "secret\n" } })
      assert.is_false(ok)
      assert.is_nil(msg:find("secret", 1, true))
      -- a credential pasted into the name, colon forgotten
      ok, msg = pcall(rw.fetch, s:url("/x"), { headers = { ["Authorization Bearer sk-secret"] = "" } })
      assert.is_false(ok)
      assert.matches("a header name is not a valid HTTP field name", msg)
      assert.is_nil(msg:find("secret", 1, true))
      assert.equal(0, #s:log("/x"))
    end)

    it("refuses bad options, naming them", function()
      local cases = {
        { { timeout = -1 }, "'timeout' must be a positive number" },
        { { timeout = "5" }, "'timeout' must be a positive number" },
        { { timeout = 0 / 0 }, "'timeout'" },
        { { max_retries = 1.5 }, "'max_retries'" },
        { { max_elapsed = 0 }, "'max_elapsed'" },
        { { method = 5 }, "'method' must be a string" },
        { { method = "GE T" }, "not a valid HTTP method" },
        { { headers = "x" }, "'headers' must be a table" },
        { { limiter = {} }, "'limiter'" },
        { { on_retry = true }, "'on_retry'" },
        { { idempotency_key = "" }, "'idempotency_key'" },
        { { retries = 3 }, "unknown option 'retries'" },
      }
      for _, case in ipairs(cases) do
        assert.error_matches(function() rw.fetch(s:url("/x"), case[1]) end, case[2])
      end
      assert.error_matches(function() rw.fetch(s:url("/x"), "GET") end, "options must be a table")
      -- a third argument (rw.fetch takes two) is refused, not taken for something
      assert.error_matches(function() rw.fetch(s:url("/x"), {}, { attempts = 0 }) end,
        "expected %(url %[, opts%]%), got a third argument %(table%)")
      assert.error_matches(function() rw.fetch(s:url("/x"), nil, 3) end, "got a third argument %(number%)")
      assert.equal(0, #s:log("/x"))
    end)
  end)
end)
