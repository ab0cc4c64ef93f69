-- The fault matrix: rw.fetch against a real loopback server that misbehaves
-- in every way we could script. Each row checks the outcome (kind, status,
-- message), that the time budget held, and that the connection pool is
-- still good for a normal request right after.
local rw = require "ratewise"
local scheduler = require "ratewise.scheduler"
local server = require "spec.support.server"
local socket = require "socket"

-- How far past max_elapsed a call may end: the last attempt is torn down
-- and the scheduler gets a turn. Loopback, so this is generous.
local TOLERANCE = 0.3

local function no_sleep() end

-- Fetch options for a row: quiet, with small per-attempt and total budgets
-- unless the row says otherwise.
local function row_options(extra)
  local o = { on_retry = false, timeout = 2, max_elapsed = 5 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- Scripts `path` (when steps are given), fetches it and checks that the
-- call ended within its budget. Returns res, err, seconds taken.
local function run_row(s, path, steps, extra)
  if steps then s:script(path, steps) end
  local o = row_options(extra)
  local t0 = rw.now()
  local res, err = rw.fetch(s:url(path), o)
  local took = rw.now() - t0
  assert.is_true(took <= o.max_elapsed + TOLERANCE,
    string.format("took %.3f s with max_elapsed %.3f s", took, o.max_elapsed))
  return res, err, took
end

-- Options that record each retry (its delay and source) without waiting.
local function recording(extra)
  local seen = {}
  -- hint_jitter = 0: these specs check which wait was chosen, exactly.
  local o = { sleep = no_sleep, hint_jitter = 0, on_retry = function(info) seen[#seen + 1] = info end }
  for k, v in pairs(extra or {}) do o[k] = v end
  return seen, o
end

-- Nothing left running, no stray task, and a normal request to the same
-- server goes through.
local function assert_pool_usable(s)
  assert.equal(0, scheduler.engine():running(), "a transfer was left running")
  local res, err = rw.fetch(s:url("/after"), { on_retry = false, max_retries = 0, timeout = 2, max_elapsed = 2 })
  assert.is_table(res, err and tostring(err))
  assert.equal(200, res.status)
  assert.equal("ok", res.body)
  assert.equal(0, rw.step(0), "tasks were left behind")
end

-- No string anywhere in v (a table, its fields, one level of nesting
-- further) is as long as `limit` or contains `needle`.
local function assert_carries_nothing(v, limit, needle, seen)
  seen = seen or {}
  if type(v) == "string" then
    assert.is_true(#v < limit, "a string of " .. #v .. " bytes was kept")
    if needle then assert.is_nil(v:find(needle, 1, true), "found " .. needle) end
  elseif type(v) == "table" and not seen[v] then
    seen[v] = true
    for k, x in pairs(v) do
      assert_carries_nothing(k, limit, needle, seen)
      assert_carries_nothing(x, limit, needle, seen)
    end
  end
end

local closed_port = server.free_port -- nothing listens there

local function http_date(format, at)
  return os.date(format, at)
end

local IMF_FIXDATE = "!%a, %d %b %Y %H:%M:%S GMT"
local RFC850 = "!%A, %d-%b-%y %H:%M:%S GMT"
local ASCTIME = "!%a %b %e %H:%M:%S %Y"

describe("rw.fetch under faults", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("the fault harness", function()
    -- The rows below are only as good as the faults; these two are new.
    local function raw_exchange(path)
      local c = assert(socket.tcp())
      c:settimeout(5)
      assert(c:connect("127.0.0.1", s.port))
      assert(c:send("GET " .. path .. " HTTP/1.1\r\nHost: x\r\n\r\n"))
      local data, err, partial = c:receive("*a")
      c:close()
      return data or partial, err
    end

    it("reset_body: sends the headers and part of the body, then a TCP RST", function()
      s:script("/rb", { { action = "reset_body", body = string.rep("x", 4000), sent = 1500 } })
      local got = raw_exchange("/rb")
      assert.matches("^HTTP/1%.1 200", got)
      assert.matches("Content%-Length: 4000\r\n", got)
      local body = got:match("\r\n\r\n(.*)$")
      assert.equal(1500, #body)
    end)

    it("raw: sends its body as the whole answer, then closes", function()
      s:script("/raw", { { action = "raw", body = "ICY 200 OK\r\n\r\nhello" } })
      assert.equal("ICY 200 OK\r\n\r\nhello", raw_exchange("/raw"))
    end)
  end)

  describe("429 hints", function()
    -- Each form of hint, the wait it asks for, recorded instead of waited.
    local forms = {
      { "Retry-After in seconds", function() return { ["Retry-After"] = "2" } end, "retry-after", 2 },
      { "Retry-After as an IMF-fixdate", function(at) return { ["Retry-After"] = http_date(IMF_FIXDATE, at) } end,
        "retry-after" },
      { "Retry-After as an RFC 850 date", function(at) return { ["Retry-After"] = http_date(RFC850, at) } end,
        "retry-after" },
      { "Retry-After as an asctime date", function(at) return { ["Retry-After"] = http_date(ASCTIME, at) } end,
        "retry-after" },
      { "x-ratelimit-reset in epoch seconds", function(at)
          return { ["X-RateLimit-Reset"] = tostring(at), ["X-RateLimit-Remaining"] = "0" }
        end, "x-ratelimit-reset" },
    }
    for _, form in ipairs(forms) do
      local name, make_headers, source, exact = form[1], form[2], form[3], form[4]
      it("waits what " .. name .. " asks, then retries", function()
        local at = os.time() + 3
        local before = socket.gettime()
        local seen, o = recording { max_elapsed = 30 }
        local res = assert(run_row(s, "/hint", { { status = 429, headers = make_headers(at) }, { status = 200 } }, o))
        local after = socket.gettime()
        assert.equal(200, res.status)
        assert.equal(2, res.attempts)
        assert.equal(2, #s:log("/hint"))
        assert.equal(1, #seen)
        assert.equal(429, seen[1].status)
        assert.equal(source, seen[1].source)
        if exact then
          assert.equal(exact, seen[1].delay)
        else
          -- The date is whole seconds; the wait is what is left until it.
          assert.is_true(seen[1].delay <= at - before, "waits " .. seen[1].delay)
          assert.is_true(seen[1].delay >= at - after, "waits " .. seen[1].delay)
        end
        assert_pool_usable(s)
      end)
    end

    it("backs off when the hint is in the past, in every form: a zero hint never retries at once", function()
      local past = os.time() - 3600
      local hints = {
        { ["Retry-After"] = "0" },
        { ["Retry-After"] = http_date(IMF_FIXDATE, past) },
        { ["Retry-After"] = http_date(RFC850, past) },
        { ["Retry-After"] = http_date(ASCTIME, past) },
        { ["X-RateLimit-Reset"] = tostring(past), ["X-RateLimit-Remaining"] = "0" },
      }
      for i, h in ipairs(hints) do
        s:reset()
        local delays = {}
        local res = assert(run_row(s, "/past", { { status = 429, headers = h }, { status = 200 } }, {
          max_elapsed = 2, base = 0.1, jitter = "none",
          on_retry = function(info) delays[#delays + 1] = info.delay .. " " .. info.source end,
        }))
        assert.equal(2, res.attempts, "hint " .. i)
        assert.same({ "0.1 backoff" }, delays, "hint " .. i)
        local log = s:log("/past")
        assert.equal(2, #log)
        local gap = log[2].t - log[1].t
        assert.is_true(gap >= 0.08 and gap < 0.5, "hint " .. i .. ": retried after " .. gap .. " s")
      end
      assert_pool_usable(s)
    end)

    it("gives up at once on a hint of 10^20 seconds, sending nothing more", function()
      local huge = "100000000000000000000"
      local hints = {
        { ["Retry-After"] = huge },
        { ["X-RateLimit-Reset"] = huge, ["X-RateLimit-Remaining"] = "0" },
        { ["Retry-After"] = "Fri, 31 Dec 9999 23:59:59 GMT" },
      }
      for i, h in ipairs(hints) do
        s:reset()
        local res, err, took = run_row(s, "/huge", { { status = 429, headers = h }, { status = 200 } },
          { max_elapsed = 60, on_retry = function() error("must not retry") end })
        assert.is_nil(res)
        assert.equal("budget", err.kind, "hint " .. i)
        assert.equal(429, err.status)
        assert.equal(1, err.attempts)
        assert.matches("would not fit", err.message)
        assert.is_true(took < 0.3, "hint " .. i .. " took " .. took)
        assert.equal(1, #s:log("/huge"))
      end
      assert_pool_usable(s)
    end)

    it("falls back to backoff for a hint that does not parse", function()
      for _, garbage in ipairs { "soon", "-1", "12abc", "0x10", "1e3", "Mon, 32 Jan 2030 00:00:00 GMT", "" } do
        s:reset()
        local seen, o = recording { base = 0.05, jitter = "none", max_elapsed = 2 }
        local res = assert(run_row(s, "/junk", {
          { status = 429, headers = { ["Retry-After"] = garbage } }, { status = 200 },
        }, o))
        assert.equal(2, res.attempts, garbage)
        assert.equal("backoff", seen[1].source, garbage)
        assert.equal(rw.backoff(0, { base = 0.05, jitter = "none" }), seen[1].delay, garbage)
      end
      assert_pool_usable(s)
    end)

    it("takes the longer of two conflicting Retry-After headers", function()
      local later = os.time() + 5
      local cases = {
        { { "1", "3" }, 3 },
        { { "3", "1" }, 3 },
        { { "garbage", "2" }, 2 },
        { { "1", http_date(IMF_FIXDATE, later) }, nil },
      }
      for _, case in ipairs(cases) do
        s:reset()
        local seen, o = recording { max_elapsed = 30 }
        local res = assert(run_row(s, "/two", {
          { status = 429, headers = { ["Retry-After"] = case[1] } }, { status = 200 },
        }, o))
        assert.equal(2, res.attempts)
        assert.equal("retry-after", seen[1].source)
        if case[2] then
          assert.equal(case[2], seen[1].delay, table.concat(case[1], " + "))
        else
          assert.is_true(seen[1].delay > 3, "the date (4-5 s away) wins, not 1: " .. seen[1].delay)
        end
      end
      assert_pool_usable(s)
    end)
  end)

  describe("503 bursts", function()
    it("retries a burst of 503s with growing backoff, counting the attempts", function()
      local infos = {}
      local burst = { { status = 503 }, { status = 503 }, { status = 503 }, { status = 200 } }
      local res = assert(run_row(s, "/burst", burst,
        { base = 0.05, jitter = "none", max_retries = 5, max_elapsed = 3,
          on_retry = function(info) infos[#infos + 1] = info end }))
      assert.equal(200, res.status)
      assert.equal(4, res.attempts)
      local log = s:log("/burst")
      assert.equal(4, #log)
      assert.equal(3, #infos)
      for i, info in ipairs(infos) do
        assert.equal(503, info.status)
        assert.equal(i, info.attempt)
        assert.equal("backoff", info.source)
        assert.equal(rw.backoff(i - 1, { base = 0.05, jitter = "none" }), info.delay)
        local gap = log[i + 1].t - log[i].t
        assert.is_true(gap >= info.delay - 0.005, string.format("retry %d came after %.3f s", i, gap))
      end
      assert.is_true(infos[3].delay > infos[1].delay)
      assert_pool_usable(s)
    end)

    it("ends a burst longer than max_retries with kind exhausted", function()
      local res, err = run_row(s, "/burst", { { status = 503, body = "down" } },
        { base = 0.01, max_retries = 3, max_elapsed = 3 })
      assert.is_nil(res)
      assert.equal("exhausted", err.kind)
      assert.equal(503, err.status)
      assert.equal(4, err.attempts)
      assert.equal("down", err.response.body)
      assert.matches("after 4 attempts %(max_retries 3%), last: 503", err.message)
      assert.equal(4, #s:log("/burst"))
      assert_pool_usable(s)
    end)
  end)

  describe("malformed responses", function()
    local not_http = {
      { "a line that is not HTTP at all", { action = "garbage" } },
      { "an HTTP status line with a word for a code", { action = "raw", body = "HTTP/1.1 abc OK\r\n\r\n" } },
      { "an HTTP status line with a five-digit code", { action = "raw", body = "HTTP/1.1 20000 OK\r\n\r\n" } },
      { "another protocol's status line", { action = "raw", body = "ICY 200 OK\r\n\r\nhello" } },
    }
    for _, case in ipairs(not_http) do
      it("retries " .. case[1] .. " as a transport failure, then gives up: kind exhausted", function()
        local res, err = run_row(s, "/bad", { case[2] }, { base = 0.01, max_retries = 1, max_elapsed = 2 })
        assert.is_nil(res)
        assert.equal("exhausted", err.kind)
        assert.equal(2, err.attempts)
        assert.is_nil(err.response)
        assert.is_nil(err.status)
        assert.is_true(err.transport.retryable)
        assert.matches("failed after 2 attempts", err.message)
        assert.matches("last: %S", err.message) -- the transport's own words follow
        assert.equal(2, #s:log("/bad"))
        assert_pool_usable(s)
      end)
    end

    it("recovers when the server answers HTTP again", function()
      local res = assert(run_row(s, "/bad", { { action = "garbage" }, { status = 200, body = "sane" } },
        { base = 0.01 }))
      assert.equal("sane", res.body)
      assert.equal(2, res.attempts)
      assert_pool_usable(s)
    end)

    it("retries a truncated body (Content-Length larger than what came), never returning the part", function()
      local res, err = run_row(s, "/short", { { action = "truncate", body = "partial" } },
        { base = 0.01, max_retries = 1, max_elapsed = 2 })
      assert.is_nil(res)
      assert.equal("exhausted", err.kind)
      assert.equal(2, err.attempts)
      assert.is_nil(err.response)
      assert.matches("1000 bytes remaining", err.message)
      assert.equal(2, #s:log("/short"))
      res = assert(run_row(s, "/short2", { { action = "truncate", body = "partial" }, { body = "whole" } },
        { base = 0.01 }))
      assert.equal("whole", res.body)
      assert_pool_usable(s)
    end)

    it("accepts one header line of 64 KiB", function()
      local big = string.rep("v", 64 * 1024)
      local res = assert(run_row(s, "/bigline", { { headers = { ["X-Big"] = big }, body = "ok" } }))
      assert.equal(200, res.status)
      assert.equal(1, res.attempts)
      assert.equal(big, res.headers["x-big"])
      assert.equal("ok", res.body)
      assert_pool_usable(s)
    end)

    it("accepts a header block of 200 KiB, under every cap", function()
      local lines = {}
      for i = 1, 200 do lines[i] = string.rep("f", 1000) end
      local res = assert(run_row(s, "/block", { { headers = { ["X-Filler"] = lines }, body = "ok" } }))
      assert.equal(200, res.status)
      assert.equal(200 * 1000 + 199 * 2, #res.headers["x-filler"]) -- joined with ", "
      assert_pool_usable(s)
    end)

    it("refuses a 1 MiB header block at once: kind network, headers too large, not retried", function()
      local lines = {}
      for i = 1, 1100 do lines[i] = string.rep("f", 1000) end
      local res, err = run_row(s, "/block", { { headers = { ["X-Filler"] = lines }, body = "ok" } },
        { base = 0.01, max_retries = 2, max_elapsed = 5 })
      assert.is_nil(res)
      assert_pool_usable(s)
      assert.equal("network", err.kind)
      assert.equal(1, err.attempts)
      assert.equal(1, #s:log("/block"))
      assert.is_false(err.transport.retryable)
      assert.matches("headers too large", err.message:lower())
    end)

    it("refuses one header line over libcurl's 100 KiB line cap: kind network, saying so", function()
      local res, err = run_row(s, "/hugeline", { { headers = { ["X-Huge"] = string.rep("h", 120 * 1024) } } },
        { base = 0.01, max_retries = 2 })
      assert.is_nil(res)
      assert.equal("network", err.kind)
      assert.equal(1, err.attempts)
      assert.equal(1, #s:log("/hugeline"))
      assert_pool_usable(s)
      assert.matches("too large", err.message:lower())
    end)

    it("holds the per-attempt timeout and the budget against a chunked body that never ends", function()
      local infos = {}
      local res, err, took = run_row(s, "/forever", { { action = "chunked_forever", interval = 0.05 } },
        { timeout = 0.3, max_elapsed = 1, base = 0.01, max_retries = 10,
          on_retry = function(info) infos[#infos + 1] = info end })
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.is_true(took >= 0.95, "ended after " .. took .. " s, before the budget was spent")
      assert.is_true(err.attempts >= 3, "attempts: " .. err.attempts)
      assert.matches("cut short by the time budget", err.message)
      assert.is_nil(infos[1].status)
      assert.matches("timed out", infos[1].error)
      local log = s:log("/forever")
      local gap = log[2].t - log[1].t
      assert.is_true(gap >= 0.29 and gap < 0.5, "the first attempt lasted " .. gap .. " s, not the 0.3 s timeout")
      assert_pool_usable(s)
    end)

    it("refuses a body larger than max_body: kind network, nothing buffered past the limit", function()
      local body = string.rep("B", 5000)
      local res, err = run_row(s, "/fat", { { body = body } }, { max_body = 1000 })
      assert.is_nil(res)
      assert.equal("network", err.kind)
      assert.equal(1, err.attempts)
      assert.matches("response body too large %(limit 1000 bytes%)", err.message)
      assert.is_true(err.transport.too_large)
      assert.is_false(err.transport.retryable)
      assert.is_nil(err.response)
      assert_carries_nothing(err, 1000, string.rep("B", 1001))
      assert.equal(1, #s:log("/fat"))
      assert_pool_usable(s)
    end)

    it("lets a body of exactly max_body through, and refuses one byte more", function()
      s:script("/edge", { { body = string.rep("e", 5000) } })
      local res = assert(run_row(s, "/edge", nil, { max_body = 5000 }))
      assert.equal(5000, #res.body)
      local _, err = run_row(s, "/edge", nil, { max_body = 4999 })
      assert.equal("network", err.kind)
      assert.matches("limit 4999 bytes", err.message)
      assert_pool_usable(s)
    end)
  end)

  describe("connections", function()
    it("retries a refused connection, then gives up: kind exhausted", function()
      local port = closed_port()
      local t0 = rw.now()
      local infos = {}
      local res, err = rw.fetch("http://127.0.0.1:" .. port .. "/", row_options {
        max_retries = 2, base = 0.01, max_elapsed = 2, on_retry = function(info) infos[#infos + 1] = info end,
      })
      assert.is_true(rw.now() - t0 < 1)
      assert.is_nil(res)
      assert.equal("exhausted", err.kind)
      assert.equal(3, err.attempts)
      assert.is_nil(err.status)
      assert.is_false(err.transport.sent)
      assert.matches("[Cc]onnect", err.message)
      assert.equal(2, #infos)
      assert_pool_usable(s)
    end)

    -- libcurl re-sends a request by itself, once, when a reused connection
    -- dies before any byte of the answer: the server may see one more.
    it("retries a connection reset before the status line, then gives up", function()
      local res, err = run_row(s, "/rst", { { action = "reset" } }, { base = 0.01, max_retries = 1 })
      assert.is_nil(res)
      assert.equal("exhausted", err.kind)
      assert.equal(2, err.attempts)
      assert.is_nil(err.status)
      assert.matches("reset", err.message)
      local seen = #s:log("/rst")
      assert.is_true(seen >= 2 and seen <= 4, seen .. " requests")
      res = assert(run_row(s, "/rst2", { { action = "reset" }, { body = "back" } }, { base = 0.01 }))
      assert.equal("back", res.body)
      assert_pool_usable(s)
    end)

    it("retries a connection reset in the middle of the body, never returning the part", function()
      local body = string.rep("m", 5000)
      local res, err = run_row(s, "/mid", { { action = "reset_body", body = body, sent = 2500 } },
        { base = 0.01, max_retries = 1 })
      assert.is_nil(res)
      assert.equal("exhausted", err.kind)
      assert.equal(2, err.attempts)
      assert.is_nil(err.response)
      assert.matches("reset", err.message)
      assert.equal(2, #s:log("/mid"))
      assert_carries_nothing(err, 2500, string.rep("m", 2500))
      res = assert(run_row(s, "/mid2", { { action = "reset_body", body = body }, { body = body } }, { base = 0.01 }))
      assert.equal(body, res.body)
      assert.equal(2, res.attempts)
      assert_pool_usable(s)
    end)

    it("holds the per-attempt timeout and the budget against a server that never answers", function()
      local res, err, took = run_row(s, "/hang", { { action = "hang", delay = 30 } },
        { timeout = 0.3, max_elapsed = 0.8, base = 0.01, max_retries = 10 })
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.is_true(took >= 0.75, "ended after " .. took .. " s")
      assert.is_true(err.attempts >= 2)
      local log = s:log("/hang")
      assert.is_true(log[2].t - log[1].t < 0.5, "the first attempt outlived its 0.3 s timeout")
      assert_pool_usable(s)
    end)

    it("holds the per-attempt timeout and the budget against one byte a second", function()
      local res, err, took = run_row(s, "/slow", { { action = "slow", interval = 1, body = "0123456789" } },
        { timeout = 0.5, max_elapsed = 1.2, base = 0.05, max_retries = 10 })
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.is_true(took >= 1.15, "ended after " .. took .. " s")
      assert.is_true(err.attempts >= 2)
      assert.is_nil(err.response)
      local log = s:log("/slow")
      local gap = log[2].t - log[1].t
      assert.is_true(gap >= 0.49 and gap < 0.8, "the first attempt lasted " .. gap .. " s, not the 0.5 s timeout")
      assert_pool_usable(s)
    end)
  end)

  describe("redirects", function()
    it("refuses a redirect to file:// without reading the file", function()
      local path = os.tmpname()
      local f = assert(io.open(path, "w"))
      f:write("FILE-SECRET-CONTENT-4711")
      f:close()
      local res, err = run_row(s, "/to-file", { { action = "redirect", location = "file://" .. path } },
        { on_retry = function() error("must not retry") end })
      os.remove(path)
      assert.is_nil(res)
      assert.equal("network", err.kind)
      assert.equal(1, err.attempts)
      assert.is_false(err.transport.retryable)
      assert.matches('"file"', err.message)
      assert.is_nil(err.response)
      assert_carries_nothing(err, 1000, "FILE-SECRET")
      assert_pool_usable(s)
    end)

    it("refuses a redirect to every other scheme that is not http(s)", function()
      local port = s.port
      for _, location in ipairs { "ftp://127.0.0.1:" .. port .. "/", "dict://127.0.0.1:" .. port .. "/d",
        "gopher://127.0.0.1:" .. port .. "/", "scp://127.0.0.1:" .. port .. "/x", "ldap://127.0.0.1:" .. port } do
        s:reset()
        local res, err, took = run_row(s, "/away", { { action = "redirect", location = location } })
        assert.is_nil(res, location)
        assert.equal("network", err.kind, location)
        assert.equal(1, err.attempts, location)
        assert.is_true(took < 0.5, location .. " took " .. took)
        assert.equal(1, #s:log(), location .. ": something else reached the server")
      end
      assert_pool_usable(s)
    end)

    it("drops Authorization and Cookie on a redirect to another host", function()
      local other = "http://localhost:" .. s.port .. "/landing"
      local res = assert(run_row(s, "/hop", { { action = "redirect", location = other } }, {
        headers = { Authorization = "Bearer tok-secret-1", Cookie = "sid=cookie-secret-2", ["X-Plain"] = "kept" },
      }))
      assert.equal(200, res.status)
      assert.equal(other, res.url)
      local first, second = s:log("/hop")[1], s:log("/landing")[1]
      assert.equal("127.0.0.1:" .. s.port, first.headers.host)
      assert.equal("Bearer tok-secret-1", first.headers.authorization)
      assert.equal("sid=cookie-secret-2", first.headers.cookie)
      assert.equal("localhost:" .. s.port, second.headers.host)
      assert.is_nil(second.headers.authorization)
      assert.is_nil(second.headers.cookie)
      assert.equal("kept", second.headers["x-plain"]) -- the other headers did go along
      assert_pool_usable(s)
    end)

    it("drops URL credentials on a redirect to another host", function()
      s:script("/hop", { { action = "redirect", location = "http://localhost:" .. s.port .. "/landing" } })
      local res = assert(rw.fetch("http://user:pw-secret@127.0.0.1:" .. s.port .. "/hop", row_options()))
      assert.equal(200, res.status)
      assert.matches("^Basic ", s:log("/hop")[1].headers.authorization)
      assert.is_nil(s:log("/landing")[1].headers.authorization)
      assert_pool_usable(s)
    end)

    it("keeps Authorization and Cookie on a redirect to the same host", function()
      assert(run_row(s, "/hop", { { action = "redirect", location = "/landing" } }, {
        headers = { Authorization = "Bearer tok", Cookie = "sid=1" },
      }))
      local second = s:log("/landing")[1]
      assert.equal("Bearer tok", second.headers.authorization)
      assert.equal("sid=1", second.headers.cookie)
      assert_pool_usable(s)
    end)

    it("drops Proxy-Authorization on a redirect to another host", function()
      local res = assert(run_row(s, "/hop", {
        { action = "redirect", location = "http://localhost:" .. s.port .. "/landing" },
      }, { headers = { ["Proxy-Authorization"] = "Basic proxy-secret-3" } }))
      assert.equal(200, res.status)
      assert_pool_usable(s)
      local leaked = s:log("/landing")[1].headers["proxy-authorization"]
      assert.is_nil(leaked)
    end)

    it("ends a redirect loop with a clear error: kind network, naming the redirects", function()
      local res, err = run_row(s, "/loop", { { action = "redirect", location = "/loop" } },
        { on_retry = function() error("must not retry") end })
      assert.is_nil(res)
      assert.equal("network", err.kind)
      assert.equal(1, err.attempts)
      assert.matches("redirects", err.message)
      local most = tonumber(err.message:match("%((%d+)%) redirects"))
      assert.is_number(most)
      assert.equal(most + 1, #s:log("/loop")) -- the first request and each redirect followed
      assert_pool_usable(s)
    end)

    it("ends a loop between two paths the same way", function()
      s:script("/ping", { { action = "redirect", location = "/pong", status = 301 } })
      s:script("/pong", { { action = "redirect", location = "/ping", status = 307 } })
      local res, err = run_row(s, "/ping")
      assert.is_nil(res)
      assert.equal("network", err.kind)
      assert.matches("redirects", err.message)
      assert.is_true(#s:log("/ping") > 1 and #s:log("/pong") > 1)
      assert_pool_usable(s)
    end)
  end)

  describe("TLS", function()
    local tls
    setup(function() tls = server.start_tls() end)
    teardown(function() tls:stop() end)
    before_each(function() tls:reset() end)

    it("fails a self-signed certificate once, kind network, saying why; the pool stays good", function()
      local events = {}
      local t0 = rw.now()
      local res, err = rw.fetch(tls:url("/x"), row_options {
        on_retry = function() error("must not retry") end,
        on_event = function(e) events[#events + 1] = e end,
      })
      assert.is_true(rw.now() - t0 < 1)
      assert.is_nil(res)
      assert.equal("network", err.kind)
      assert.equal(1, err.attempts)
      assert.is_nil(err.status)
      assert.is_true(err.transport.tls)
      assert.is_false(err.transport.retryable)
      assert.matches("TLS verification failed: .*certificate", err.message)
      assert.equal(0, #tls:log(), "a request went over an unverified connection")
      assert_pool_usable(s)
      -- the TLS server itself is fine: an explicit opt-out reaches it
      assert.equal(200, assert(rw.fetch(tls:url("/x"), row_options { verify_tls = false })).status)
      assert.equal("request", events[1].type)
      assert.equal("response", events[2].type)
      assert.equal("retryable", events[2].class)
      assert.matches("certificate", events[2].error)
      for _, e in ipairs(events) do assert.not_equal("retry", e.type) end
    end)

    it("tells on_event how the call ended: an error event of kind network", function()
      local events = {}
      local _, err = rw.fetch(tls:url("/x"), row_options { on_event = function(e) events[#events + 1] = e end })
      assert.equal("network", err.kind)
      assert_pool_usable(s)
      local last = events[#events]
      assert.equal("error", last.type)
      assert.equal("network", last.kind)
    end)

    it("never lends a connection made with verify_tls = false to a call that verifies", function()
      for round = 1, 2 do
        local res = assert(rw.fetch(tls:url("/x"), row_options { verify_tls = false }))
        assert.equal(200, res.status, "round " .. round)
        local _, err = rw.fetch(tls:url("/x"), row_options())
        assert.equal("network", err.kind, "round " .. round)
        assert.is_true(err.transport.tls)
      end
      assert.equal(2, #tls:log("/x")) -- only the opted-out calls got through
      assert_pool_usable(s)
    end)
  end)
end)
