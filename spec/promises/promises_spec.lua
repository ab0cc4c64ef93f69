-- The README's promises against hostile servers and careless callers: no
-- unsafe replays, hints are minimum waits, a call never outlives
-- max_elapsed, the transport owns the request's framing, and no secret is
-- printed. Each row here was once broken (issue 9's review); every check
-- asserts what the test server saw.
local rw = require "ratewise"
local server = require "spec.support.server"

local function opts(extra)
  local o = { on_retry = false }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- Options that record each retry's delay and source and do not wait.
local function recording(extra)
  local seen = {}
  local o = opts(extra)
  o.sleep = function() end
  if o.hint_jitter == nil then o.hint_jitter = 0 end -- exact waits: which wait, not its spread
  o.on_retry = function(info) seen[#seen + 1] = { delay = info.delay, source = info.source } end
  return seen, o
end

local function raises(fn, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.matches(pattern, tostring(err))
  return tostring(err)
end

describe("ratewise's promises", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("replay safety is decided on the method sent", function()
    it("sends a body without a method as a POST, and never replays it", function()
      s:script("/b", { { status = 503 }, { status = 200 } })
      local events, retries = {}, 0
      local res, err = rw.fetch(s:url("/b"), opts {
        body = "charge=1", base = 0.01,
        on_event = function(e) events[#events + 1] = e end,
        on_retry = function() retries = retries + 1 end,
      })
      assert.is_nil(res)
      assert.equal("unsafe", err.kind)
      assert.matches("^POST ", err.message)
      assert.equal(0, retries)
      local log = s:log("/b")
      assert.equal(1, #log)
      assert.equal("POST", log[1].method)
      assert.equal("charge=1", log[1].body)
      assert.equal("POST", events[1].method)
    end)

    -- libcurl sends a request again, on its own, when the kept connection
    -- it went out on closes before any byte of answer (its "Connection
    -- died, retrying a fresh connect"), though the server may have acted on
    -- it. A POST keeps the connection, but libcurl cannot read its body twice.
    it("sends a POST on a kept connection, and never twice when that connection dies after it went out", function()
      assert(rw.fetch(s:url("/warm"), opts()))
      assert(rw.fetch(s:url("/b"), opts { body = "x" }))
      assert(rw.fetch(s:url("/b"), opts { method = "PATCH", body = "y" }))
      local warm, post, patch = s:log("/warm")[1], s:log("/b")[1], s:log("/b")[2]
      assert.equal(warm.conn, post.conn)
      assert.equal(warm.conn, patch.conn)
      assert.equal("x", post.body)
      assert.equal("y", patch.body)
      -- the server reads the POST whole on that kept connection, then closes it unanswered
      s:script("/charge", { { action = "drop" }, { status = 200 } })
      local res, err = rw.fetch(s:url("/charge"), opts { body = "amount=5", base = 0.01 })
      assert.is_nil(res)
      assert.equal("unsafe", err.kind)
      assert.is_true(err.transport.sent)
      local log = s:log("/charge")
      assert.equal(1, #log, "the POST was sent twice")
      assert.equal(warm.conn, log[1].conn) -- it went out on the kept connection
      assert.equal("amount=5", log[1].body)
      -- a replay-safe request on a dying kept connection may be sent again, by libcurl or by fetch
      assert(rw.fetch(s:url("/after"), opts { body = "z" }))
      assert.equal("z", s:log("/after")[1].body)
    end)

    it("keeps a POST without a body from being sent twice too", function()
      assert(rw.fetch(s:url("/warm"), opts()))
      s:script("/empty", { { action = "drop" }, { status = 200 } })
      local res, err = rw.fetch(s:url("/empty"), opts { method = "POST", base = 0.01 })
      assert.is_nil(res)
      assert.equal("unsafe", err.kind)
      local log = s:log("/empty")
      assert.equal(1, #log, "the POST was sent twice")
      assert.equal(s:log("/warm")[1].conn, log[1].conn)
      assert.equal("0", log[1].headers["content-length"])
      -- the connection it died on is gone; the next request opens another
      assert(rw.fetch(s:url("/empty"), opts { method = "POST" }))
      assert.equal(2, #s:log("/empty"))
    end)

    it("refuses a body on GET or HEAD, naming the method, and sends nothing", function()
      for _, method in ipairs { "GET", "get", "HEAD" } do
        raises(function() rw.fetch(s:url("/b"), opts { method = method, body = "x" }) end,
          "a " .. method:upper() .. " request cannot carry a body")
      end
      local c = rw.client { base_url = s.base, on_retry = false }
      raises(function() c:get("/b", { json = { a = 1 } }) end,
        "client:get: a GET request cannot carry a body %(option 'json'%)")
      raises(function() c:head("/b", { body = "x" }) end, "client:head: a HEAD request cannot carry a body")
      assert.equal(0, #s:log())
    end)

    it("does not let an empty or blank Idempotency-Key header make a POST replay-safe", function()
      s:script("/k", { { status = 503 }, { status = 200 } })
      for _, key in ipairs { "", "   ", "\t" } do
        raises(function()
          rw.fetch(s:url("/k"), opts { method = "POST", body = "x", headers = { ["Idempotency-Key"] = key } })
        end, "header 'Idempotency%-Key' is blank")
      end
      raises(function() rw.fetch(s:url("/k"), opts { method = "POST", idempotency_key = "  " }) end,
        "option 'idempotency_key' must be true or a non%-blank string")
      assert.equal(0, #s:log())
      -- a real key still makes it safe
      assert(rw.fetch(s:url("/k"), opts { method = "POST", body = "x", base = 0.01,
        headers = { ["Idempotency-Key"] = "k-1" } }))
      assert.equal(2, #s:log("/k"))
    end)

    it("raises when a policy's replayable hook answers anything but true, false or nil", function()
      for _, answer in ipairs { "no", 0, {} } do
        s:reset()
        s:script("/r", { { status = 429 }, { status = 200 } })
        local p = rw.policy { name = "sloppy", replayable = function() return answer end }
        raises(function() rw.fetch(s:url("/r"), opts { method = "POST", body = "x", policy = p, base = 0.01 }) end,
          "the policy's replayable must answer true, false or nil %(got " .. type(answer))
        assert.equal(1, #s:log("/r"), "the POST was replayed after replayable answered " .. tostring(answer))
      end
      -- false is a plain no
      s:reset()
      s:script("/r", { { status = 429 }, { status = 200 } })
      local p = rw.policy { replayable = function() return false end }
      local res, err = rw.fetch(s:url("/r"), opts { method = "POST", body = "x", policy = p, base = 0.01 })
      assert.is_nil(res)
      assert.equal("unsafe", err.kind)
      assert.equal(1, #s:log("/r"))
    end)

    it("raises when a circuit's allow or a budget's allow_retry answers anything but a boolean", function()
      local noop = function() end
      for _, answer in ipairs { "no", 0 } do
        s:script("/c", { { status = 503 }, { status = 200 } })
        raises(function()
          rw.fetch(s:url("/c"), opts { circuit = { allow = function() return answer end, record = noop } })
        end, "option 'circuit': allow must answer true or false")
        raises(function()
          rw.fetch(s:url("/c"), opts { base = 0.01,
            budget = { request = noop, allow_retry = function() return answer end } })
        end, "option 'budget': allow_retry must answer true or false")
      end
      -- the circuit raised before anything was sent; the budget after the 503
      assert.equal(2, #s:log("/c"))
    end)

    it("retries a 413 that carries Retry-After, and not one without", function()
      s:script("/big", { { status = 413, headers = { ["Retry-After"] = "1" } }, { status = 200 } })
      local res = assert(rw.fetch(s:url("/big"), opts { method = "PUT", body = "x" }))
      assert.equal(200, res.status)
      local log = s:log("/big")
      assert.equal(2, #log)
      assert.is_true(log[2].t - log[1].t >= 1.0, "retried after " .. (log[2].t - log[1].t) .. " s")
      s:script("/big2", { { status = 413 }, { status = 200 } })
      local _, err = rw.fetch(s:url("/big2"), opts { method = "PUT", body = "x", base = 0.01 })
      assert.equal("terminal", err.kind)
      assert.equal(1, #s:log("/big2"))
    end)
  end)

  describe("idempotency keys", function()
    -- A program whose descriptors are all in use (but for its pooled
    -- connection) POSTs with a generated key; math.random is seeded alike in
    -- every run, so a key drawn from it would repeat across processes.
    local program = [[
      local rw = require "ratewise"
      math.randomseed(1)
      assert(rw.fetch(arg[1] .. "/warm", { on_retry = false }))
      local files = {}
      while true do
        local f = io.open("/dev/null")
        if not f then break end
        files[#files + 1] = f
      end
      local res, err = rw.fetch(arg[1] .. "/key", { method = "POST", body = "x", idempotency_key = true,
        on_retry = false })
      print(res and res.status or tostring(err))
    ]]

    local function run_program()
      return (require("spec.support.subprocess").run_lua(program, { shell = "ulimit -n 32; ", args = s.base }))
    end

    it("come from the kernel even with every descriptor in use, and differ across processes", function()
      assert.equal("200\n", run_program())
      assert.equal("200\n", run_program())
      local log = s:log("/key")
      assert.equal(2, #log)
      local uuid = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89ab]%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"
      assert.matches(uuid, log[1].headers["idempotency-key"])
      assert.matches(uuid, log[2].headers["idempotency-key"])
      assert.are_not.equal(log[1].headers["idempotency-key"], log[2].headers["idempotency-key"])
    end)
  end)

  describe("hints are minimum waits", function()
    it("never lets a policy's delay undercut the response's Retry-After", function()
      s:script("/q", {
        { status = 429, headers = { ["Retry-After"] = "30", RateLimit = '"default";r=0;t=5' } },
        { status = 200 },
      })
      local seen, o = recording { policy = rw.providers.ietf }
      assert(rw.fetch(s:url("/q"), o))
      assert.same({ delay = 30, source = "retry-after" }, seen[1])
      -- a policy asking longer than Retry-After is still heard
      s:script("/q2", {
        { status = 429, headers = { ["Retry-After"] = "2", RateLimit = '"default";r=0;t=9' } },
        { status = 200 },
      })
      seen, o = recording { policy = rw.providers.ietf }
      assert(rw.fetch(s:url("/q2"), o))
      assert.same({ delay = 9, source = "policy" }, seen[1])
    end)
  end)

  describe("a call never outlives max_elapsed", function()
    it("ends at once, taking nothing, when the limiter's wait would not fit", function()
      local bucket = rw.bucket { capacity = 1, rate = 0.1 } -- a token every 10 s
      assert(bucket:take())
      local before = bucket:tokens()
      local started = rw.now()
      local res, err = rw.fetch(s:url("/l"), opts { limiter = bucket, max_elapsed = 1 })
      local took = rw.now() - started
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.matches("the limiter would wait", err.message)
      assert.is_true(took < 0.5, "returned after " .. took .. " s")
      assert.is_true(bucket:tokens() - before < 0.2, "a token was taken")
      assert.equal(0, #s:log("/l"))
    end)

    it("holds for a composite limiter too, and for a later attempt's wait", function()
      local rpm = rw.bucket { capacity = 2, rate = 0.1 }
      local both = rw.limiters { rpm }
      s:script("/l2", { { status = 503 }, { status = 200 } })
      -- the first attempt takes a token, the retry would need the second
      -- one too; max_elapsed leaves room for the retry but not for the
      -- limiter's wait once the bucket is drained
      assert(rpm:take())
      local started = rw.now()
      local _, err = rw.fetch(s:url("/l2"), opts { limiter = both, max_elapsed = 2, base = 0.01,
        max_delay = 0.01 })
      assert.equal("budget", err.kind)
      assert.is_true(rw.now() - started < 1, "returned after " .. (rw.now() - started) .. " s")
      assert.equal(1, #s:log("/l2"))
    end)

    it("lets acquire answer false, taking nothing, when told how long it may wait", function()
      local bucket = rw.bucket { capacity = 1, rate = 1 }
      assert(bucket:take())
      local before = bucket:tokens()
      local ok, wait = bucket:acquire(1, nil, 0.1)
      assert.is_false(ok)
      assert.is_true(wait > 0.5 and wait <= 1, "wait " .. tostring(wait))
      assert.is_true(bucket:tokens() - before < 0.2)
      local composite = rw.limiters { bucket }
      ok, wait = composite:acquire(1, nil, 0.1)
      assert.is_false(ok)
      assert.is_true(wait > 0.5, "wait " .. tostring(wait))
      raises(function() bucket:acquire(1, nil, 0 / 0) end, "max_wait must be a non%-negative number")
    end)
  end)

  describe("a client call never outlives max_elapsed", function()
    it("ends with kind budget when its turn under concurrency does not come in time", function()
      s:script("/slow", { { status = 200, delay = 1.5 } })
      local c = rw.client { base_url = s.base, concurrency = 1, on_retry = false }
      local first_res, second_res, second_err, second_took
      rw.run(function()
        local first = rw.spawn(function() return c:get("/slow") end)
        rw.spawn(function()
          rw.sleep(0.05) -- the first call holds the only turn
          local started = rw.now()
          second_res, second_err = c:get("/other", { max_elapsed = 0.5 })
          second_took = rw.now() - started
        end)
        first_res = first:join()
      end)
      assert.equal(200, first_res.status)
      assert.is_nil(second_res)
      assert.equal("budget", second_err.kind)
      assert.matches("concurrency limit", second_err.message)
      assert.is_true(second_took >= 0.45 and second_took < 1.2, "returned after " .. second_took .. " s")
      assert.equal(0, #s:log("/other"))
      assert.equal(1, c:stats().errors.budget)
    end)

    it("does not join an identical call in flight that would outlive it", function()
      s:script("/slow", { { status = 200, delay = 1.5, body = "late" } })
      local c = rw.client { base_url = s.base, on_retry = false }
      local second_err, second_took
      rw.run(function()
        local first = rw.spawn(function() return c:get("/slow") end)
        rw.spawn(function()
          rw.sleep(0.05)
          local started = rw.now()
          local _, err = c:get("/slow", { max_elapsed = 0.5 })
          second_err, second_took = err, rw.now() - started
        end)
        assert.equal("late", first:join().body)
      end)
      assert.equal("budget", second_err.kind)
      assert.is_true(second_took < 1.2, "returned after " .. second_took .. " s")
      assert.equal(2, #s:log("/slow"))
    end)

    it("lets a semaphore's acquire give up after a timeout, holding nothing", function()
      local sem = rw.semaphore(1)
      assert.is_true(sem:acquire())
      local started = rw.now()
      assert.is_false(sem:acquire(0.2)) -- main thread: nothing can release it, it waits out the timeout
      assert.is_true(rw.now() - started >= 0.15)
      local got
      rw.run(function()
        rw.spawn(function() got = sem:acquire(0.1) end)
        rw.sleep(0.3)
        sem:release()
      end)
      assert.is_false(got)
      assert.is_true(sem:acquire(0))
      sem:release()
      assert.has_error(function() sem:acquire(0 / 0) end)
    end)
  end)

  describe("the transport owns the request's framing", function()
    it("refuses the framing and connection headers, and control bytes in values, sending nothing", function()
      local owned = { "Content-Length", "transfer-encoding", "Host", "Connection", "Upgrade", "TE", "Expect" }
      for _, name in ipairs(owned) do
        raises(function() rw.fetch(s:url("/f"), opts { method = "POST", body = "x", headers = { [name] = "5" } }) end,
          "header '" .. name:gsub("%-", "%%-") .. "' cannot be set by the caller")
      end
      for _, value in ipairs { "a\1b", "a\127", "a\27[31m" } do
        raises(function() rw.fetch(s:url("/f"), opts { headers = { ["X-Thing"] = value } }) end,
          "header 'X%-Thing' has a value containing a control character")
      end
      for _, url in ipairs { s:url("/f\1"), s:url("/f\127"), s:url("/f\27[0m") } do
        raises(function() rw.fetch(url, opts()) end, "url contains a space or a control character")
      end
      assert.equal(0, #s:log())
      -- a tab is allowed
      assert(rw.fetch(s:url("/f"), opts { headers = { ["X-Thing"] = "a\tb" } }))
      assert.equal("a\tb", s:log("/f")[1].headers["x-thing"])
    end)

    it("never lets a body become a second request on a pooled connection", function()
      -- What the refused header would have smuggled: the server must see
      -- one request with the whole body, and nothing else.
      local smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
      raises(function()
        rw.fetch(s:url("/f"), opts { method = "POST", body = smuggled, headers = { ["Content-Length"] = "0" } })
      end, "cannot be set by the caller")
      assert(rw.fetch(s:url("/f"), opts { method = "POST", body = smuggled }))
      assert.equal(0, #s:log("/smuggled"))
      assert.equal(smuggled, s:log("/f")[1].body)
    end)

    it("refuses request headers too large to send, naming the request", function()
      raises(function() rw.fetch(s:url("/h"), opts { headers = { ["X-Big"] = string.rep("a", 1024 * 1024) } }) end,
        "the request headers are too large")
      -- a URL too long for libcurl is told as the request's fault, not a response's
      local res, err = rw.fetch(s:url("/h?q=" .. string.rep("a", 1100 * 1024)), opts { max_retries = 0 })
      assert.is_nil(res)
      assert.equal("network", err.kind)
      assert.matches("the request is too large to send", err.message)
      assert.is_nil(err.message:find("aaaa", 1, true), "the URL's query was printed")
      assert.equal(0, #s:log())
    end)
  end)

  describe("no secret reaches another origin", function()
    local secrets = {
      Authorization = "Bearer s-auth", ["x-api-key"] = "s-anthropic", ["api-key"] = "s-azure",
      ["x-goog-api-key"] = "s-google", Cookie = "sid=s-cookie", ["X-Tenant-Token"] = "s-tenant",
      ["X-Public"] = "kept",
    }
    local secret_names = { "authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie", "x-tenant-token" }

    local function assert_no_secrets(record, where)
      for _, name in ipairs(secret_names) do
        assert.is_nil(record.headers[name], name .. " reached " .. where)
      end
      assert.equal("kept", record.headers["x-public"], "the other headers go along")
    end

    it("drops every secret header, built in or named by the call, on a redirect to another host", function()
      -- localhost and 127.0.0.1 are two origins on the one test server
      s:script("/hop", { { action = "redirect", location = "http://localhost:" .. s.port .. "/landing" } })
      local res = assert(rw.fetch(s:url("/hop"), opts { headers = secrets, secret_headers = { "X-Tenant-Token" } }))
      assert.equal(200, res.status)
      assert.equal(1, res.redirects)
      local first = s:log("/hop")[1]
      for _, name in ipairs(secret_names) do assert.is_string(first.headers[name], name) end
      assert_no_secrets(s:log("/landing")[1], "another host")
    end)

    it("drops them on a redirect to another port or scheme of the same host", function()
      local other = server.start()
      local ok, err = pcall(function()
        s:script("/hop", { { action = "redirect", location = other:url("/landing") } })
        assert(rw.fetch(s:url("/hop"), opts { headers = secrets, secret_headers = { "x-tenant-token" } }))
        assert_no_secrets(other:log("/landing")[1], "another port")
      end)
      other:stop()
      assert(ok, err)
    end)

    it("keeps them on the same origin, and sends them again when a redirect comes back to it", function()
      s:script("/a", { { action = "redirect", location = "http://localhost:" .. s.port .. "/b" } })
      s:script("/b", { { action = "redirect", location = "http://127.0.0.1:" .. s.port .. "/c" } })
      assert(rw.fetch(s:url("/a"), opts { headers = secrets, secret_headers = { "X-Tenant-Token" } }))
      assert_no_secrets(s:log("/b")[1], "another host")
      local back = s:log("/c")[1]
      assert.equal("Bearer s-auth", back.headers.authorization)
      assert.equal("s-tenant", back.headers["x-tenant-token"])
    end)

    it("takes secret header names from the client and the call together", function()
      s:script("/hop", { { action = "redirect", location = "http://localhost:" .. s.port .. "/landing" } })
      local c = rw.client { base_url = s.base, on_retry = false, secret_headers = { "X-Tenant-Token" },
        headers = { ["X-Tenant-Token"] = "s-tenant", ["X-Org-Key"] = "s-org", ["X-Public"] = "kept" } }
      assert(c:get("/hop", { secret_headers = { "X-Org-Key" } }))
      local landing = s:log("/landing")[1]
      assert.is_nil(landing.headers["x-tenant-token"])
      assert.is_nil(landing.headers["x-org-key"])
      assert.equal("kept", landing.headers["x-public"])
    end)

    it("follows redirects as browsers and curl do: 303 and a POST's 301/302 become GET, 307/308 keep the body",
      function()
        for _, case in ipairs { { 303, "GET", "" }, { 301, "GET", "" }, { 302, "GET", "" }, { 307, "POST", "data" },
          { 308, "POST", "data" } } do
          s:reset()
          s:script("/hop", { { action = "redirect", status = case[1], location = "/landing" } })
          local res = assert(rw.fetch(s:url("/hop"), opts { method = "POST", body = "data" }))
          assert.equal(200, res.status)
          local landing = s:log("/landing")[1]
          assert.equal(case[2], landing.method, case[1])
          assert.equal(case[3], landing.body, case[1])
        end
        s:reset()
        s:script("/hop", { { action = "redirect", status = 303, location = "/landing" } })
        assert(rw.fetch(s:url("/hop"), opts { method = "HEAD" }))
        assert.equal("HEAD", s:log("/landing")[1].method)
      end)

    it("counts a POST a redirect took elsewhere as sent, and never replays it", function()
      -- the next hop cannot connect: the POST still reached the first server
      s:script("/hop", { { action = "redirect", status = 307, location = "http://127.0.0.1:1/gone" } })
      local res, err = rw.fetch(s:url("/hop"), opts { method = "POST", body = "charge", base = 0.01 })
      assert.is_nil(res)
      assert.equal("unsafe", err.kind)
      assert.is_true(err.transport.sent)
      assert.equal(1, #s:log("/hop"))
    end)

    it("holds the per-attempt timeout across every hop", function()
      s:script("/r1", { { action = "redirect", location = "/r2", delay = 0.4 } })
      s:script("/r2", { { action = "redirect", location = "/r3", delay = 0.4 } })
      s:script("/r3", { { status = 200, delay = 0.4 } })
      local started = rw.now()
      local res, err = rw.fetch(s:url("/r1"), opts { timeout = 1, max_retries = 0 })
      local took = rw.now() - started
      assert.is_nil(res)
      assert.is_true(err.transport.timeout)
      assert.is_true(took < 1.2, "took " .. took .. " s")
    end)

    it("keeps the engine's own users safe too: ratewise.core follows with the same rules", function()
      local core = require "ratewise.core"
      s:script("/hop", { { action = "redirect", location = "http://localhost:" .. s.port .. "/landing" } })
      local e = core.engine()
      local t = assert(e:start { url = s:url("/hop"), headers = { "Authorization: Bearer s-auth",
        "X-Tenant-Token: s-tenant", "X-Public: kept" }, secret_headers = { "x-tenant-token" } })
      while not t:done() do e:poll(0.5) end
      local res = assert(t:result())
      assert.equal(200, res.status)
      assert.equal("http://localhost:" .. s.port .. "/landing", res.url)
      local landing = s:log("/landing")[1]
      assert.is_nil(landing.headers.authorization)
      assert.is_nil(landing.headers["x-tenant-token"])
      assert.equal("kept", landing.headers["x-public"])
      t:close()
      for _, line in ipairs { "Content-Length: 5", "Host: evil", "Transfer-Encoding: chunked", "X-A: a\1b" } do
        assert.has_error(function() e:start { url = s:url("/x"), method = "POST", body = "x", headers = { line } } end)
      end
      assert.has_error(function() e:start { url = s:url("/x"), method = "GET", body = "x" } end)
      assert.has_error(function() e:start { url = s:url("/x"), headers = { "X-Big: " .. string.rep("a", 300000) } } end)
      e:close()
      assert.equal(0, #s:log("/x"))
    end)
  end)

  describe("no secret is printed", function()
    it("keeps a URL password holding /, ? or # out of errors, events and retry lines", function()
      -- "12/34-ss-word" and "/ss-word" begin like a port, "9?ss-word" too
      for _, password in ipairs { "pa/ss-word", "pa?ss-word", "pa#ss-word", "p@ss/wo?rd", "12/34-ss-word",
        "/ss-word", "9?ss-word", "1#ss-word" } do
        local url = "http://user:" .. password .. "@127.0.0.1:1/x?key=v"
        local printed = {}
        local res, err = rw.fetch(url, {
          max_retries = 1, base = 0.01,
          on_retry = function(info) printed[#printed + 1] = info.url .. " " .. tostring(info.error) end,
          on_event = function(e) printed[#printed + 1] = tostring(e.url) .. " " .. tostring(e.error) end,
        })
        assert.is_nil(res)
        printed[#printed + 1] = tostring(err)
        printed[#printed + 1] = err.transport and tostring(err.transport.message) or ""
        for _, line in ipairs(printed) do
          assert.is_nil(line:find("ss-word", 1, true), "password printed: " .. line)
          assert.is_nil(line:find("wo?rd", 1, true), "password printed: " .. line)
          assert.is_nil(line:find("key=v", 1, true), "query printed: " .. line)
        end
      end
    end)

    it("still prints a path or query that holds an @, and the host and port", function()
      local headers = require "ratewise.headers"
      assert.equal("https://api.example.com/users/@me", headers.redact_url("https://api.example.com/users/@me"))
      assert.equal("http://localhost:8080/@scope/pkg", headers.redact_url("http://localhost:8080/@scope/pkg"))
      assert.equal("https://h.example/search", headers.redact_url("https://h.example/search?email=a@b.c"))
      assert.equal("http://127.0.0.1:1/x", headers.redact_url("http://u:p@127.0.0.1:1/x"))
      assert.equal("http://[::1]:8080/@me", headers.redact_url("http://[::1]:8080/@me"))
      assert.equal("http://host.example/x", headers.redact_url("http://u:ab/cd@host.example/x"))
    end)

    it("makes an origin of where the request goes, as libcurl reads the URL", function()
      local headers = require "ratewise.headers"
      -- a pagination link from a hostile server cannot pass for the API's origin
      assert.equal("https://evil.example:443", headers.origin("https://evil.example:443/x@api.example.com/next"))
      assert.equal("https://evil.example:443", headers.origin("https://evil.example/x@api.example.com/next"))
      assert.equal("http://host.example:8080", headers.origin("http://u:p@host.example:8080/x"))
      -- and a client keeps its secrets from it
      local other = server.start()
      local ok, err = pcall(function()
        local c = rw.client { base_url = "http://127.0.0.1:1", on_retry = false,
          headers = { Authorization = "Bearer secret" } }
        assert.error_matches(function() c:get(other.base .. "/x@127.0.0.1:1/next") end, "another origin")
        assert.equal(0, #other:log())
      end)
      other:stop()
      assert(ok, err)
    end)
  end)
end)
