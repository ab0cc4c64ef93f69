-- Streamed responses (stream = true): the body read as it arrives, as
-- chunks or server-sent events, against the loopback test server's
-- chunked answers, in a task, in the main thread and in a plain coroutine.
local rw = require "ratewise"
local server = require "spec.support.server"

local quiet = { on_retry = false }
local function opts(extra)
  local o = { on_retry = false, stream = true }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local SSE = { ["Content-Type"] = "text/event-stream" }

-- PUC Lua 5.1 cannot yield from inside a for-in loop's iterator (5.2 and
-- LuaJIT can): where a wait yields (a task, a coroutine), 5.1 calls the
-- iterator itself. README "Every Lua".
local for_in_yields = _VERSION ~= "Lua 5.1" or rawget(_G, "jit") ~= nil

-- the events' data, read the way that works on every Lua
local function event_data(res)
  local next_event, got = res:events(), {}
  while true do
    local ev = next_event()
    if not ev then return got end
    got[#got + 1] = ev.data
  end
end

describe("streamed responses", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("returns as soon as the headers are in, then hands the body over as it arrives", function()
    s:script("/s", { { action = "stream", headers = SSE,
      chunks = { { 0, "one " }, { 0.3, "two " }, { 0.3, "three" } } } })
    local t0 = rw.now()
    local res = assert(rw.fetch(s:url("/s"), opts()))
    local opened = rw.now() - t0
    assert.equal(200, res.status)
    assert.equal("text/event-stream", res.headers["Content-Type"])
    assert.is_nil(res.body)
    assert.is_true(opened < 0.25, ("fetch returned after %.2f s"):format(opened))
    local parts, at = {}, {}
    for chunk in res:chunks() do
      parts[#parts + 1] = chunk
      at[#at + 1] = rw.now() - t0
    end
    assert.equal("one two three", table.concat(parts))
    assert.is_true(#parts >= 3, #parts .. " chunks")
    assert.is_true(at[1] < 0.25 and at[#at] > 0.5, ("first at %.2f s, last at %.2f s"):format(at[1], at[#at]))
    assert.is_nil(res:read()) -- the end, again
  end)

  it("parses server-sent events: names, multi-line data, ids, retry, comments and CRLF", function()
    local body = ": a comment\r\nevent: delta\r\ndata: {\"t\":\"he\"}\r\nid: 1\r\n\r\n"
      .. "data: line one\ndata: line two\n\n"
      .. "retry: 2500\nevent: done\ndata: [DONE]\n\n"
      .. "data: never dispatched"
    s:script("/sse", { { action = "stream", headers = SSE, chunks = {
      { 0, body:sub(1, 17) }, { 0.05, body:sub(18, 40) }, { 0.05, body:sub(41) } } } })
    local res = assert(rw.fetch(s:url("/sse"), opts()))
    local events = {}
    for ev in res:events() do events[#events + 1] = ev end
    assert.equal(3, #events)
    assert.same({ event = "delta", data = '{"t":"he"}', id = "1" }, events[1])
    assert.same({ event = "message", data = "line one\nline two", id = "1" }, events[2])
    assert.same({ event = "done", data = "[DONE]", id = "1", retry = 2500 }, events[3])
    if math.type then assert.equal("integer", math.type(events[3].retry)) end
  end)

  it("works the same in a task, with other tasks going on, and in a plain coroutine", function()
    s:script("/s", { { action = "stream", headers = SSE,
      chunks = { { 0.1, "data: a\n\n" }, { 0.2, "data: b\n\n" } } } })
    local seen, ticks = {}, 0
    rw.run(function()
      local ticker = rw.spawn(function()
        for _ = 1, 20 do
          rw.sleep(0.02)
          ticks = ticks + 1
        end
      end)
      local res = assert(rw.fetch(s:url("/s"), opts()))
      seen = event_data(res)
      if for_in_yields then
        local again = {}
        for ev in assert(rw.fetch(s:url("/s"), opts())):events() do again[#again + 1] = ev.data end
        assert.same(seen, again)
      end
      ticker:join()
    end)
    assert.same({ "a", "b" }, seen)
    assert.equal(20, ticks)

    local co = coroutine.create(function()
      local res = assert(rw.fetch(s:url("/s"), opts()))
      return table.concat(event_data(res), ",")
    end)
    local result
    while coroutine.status(co) ~= "dead" do
      local ok, what, seconds, pollable = coroutine.resume(co)
      assert(ok, what)
      if what == "ratewise.sleep" then
        require("socket").select({ pollable }, nil, seconds)
      else
        result = what
      end
    end
    assert.equal("a,b", result)
  end)

  it("retries before the first byte, and not after it: a break ends with what was delivered", function()
    s:script("/flaky", {
      { status = 503, headers = { ["Retry-After"] = "0" } },
      { action = "stream", headers = SSE, chunks = { { 0, "data: 1\n\n" }, { 0.1, "data: 2\n\n" } },
        ["end"] = "reset" },
    })
    local res = assert(rw.fetch(s:url("/flaky"), opts { hint_jitter = 0 }))
    assert.equal(2, res.attempts)
    local got = {}
    local ok, err = pcall(function()
      for ev in res:events() do got[#got + 1] = ev.data end
    end)
    assert.is_false(ok)
    assert.same({ "1", "2" }, got)
    assert.equal("stream", err.kind)
    assert.equal(#"data: 1\n\ndata: 2\n\n", err.delivered)
    assert.matches("broke off after 18 bytes of its body", tostring(err))
    assert.equal(2, #s:log("/flaky")) -- not sent again
    -- read() says the same without raising
    s:script("/cut", { { action = "stream", chunks = { { 0, "abc" } }, ["end"] = "reset" } })
    res = assert(rw.fetch(s:url("/cut"), opts()))
    assert.equal("abc", res:read())
    local chunk, rerr = res:read()
    assert.is_nil(chunk)
    assert.equal("stream", rerr.kind)
    assert.equal(3, rerr.delivered)
  end)

  -- docs/streaming.md: a POST is replayed after a 429 with Retry-After only
  -- when an idempotency key makes it safe; res.elapsed is the time to the
  -- headers.
  it("does not replay a streamed POST after a 429 without an idempotency key, and does with one", function()
    local steps = { { status = 429, headers = { ["Retry-After"] = "0" } },
      { action = "stream", headers = SSE, chunks = { { 0, "data: a\n\n" } } } }
    s:script("/chat", steps)
    local res, err = rw.fetch(s:url("/chat"), opts { json = { q = 1 } })
    assert.is_nil(res)
    assert.equal("unsafe", err.kind)
    assert.equal(1, #s:log("/chat"))
    s:reset()
    s:script("/chat", steps)
    res = assert(rw.fetch(s:url("/chat"), opts { json = { q = 1 }, idempotency_key = true }))
    assert.same({ "a" }, event_data(res))
    local log = s:log("/chat")
    assert.equal(2, #log)
    assert.equal(log[1].headers["idempotency-key"], log[2].headers["idempotency-key"])
  end)

  it("gives res.elapsed as the time to the headers, not to the end of the body", function()
    s:script("/late", { { action = "stream", headers = SSE, delay = 0.2,
      chunks = { { 0, "data: a\n\n" }, { 0.5, "data: b\n\n" } } } })
    local t0 = rw.now()
    local res = assert(rw.fetch(s:url("/late"), opts()))
    assert.same({ "a", "b" }, event_data(res))
    local whole = rw.now() - t0
    assert.is_true(res.elapsed >= 0.15 and res.elapsed < 0.45, "elapsed " .. res.elapsed)
    assert.is_true(whole >= 0.6, "read in " .. whole .. " s")
  end)

  it("ends a stream that falls silent for idle_timeout, and not one that keeps talking", function()
    s:script("/quiet", { { action = "stream", chunks = { { 0, "data: x\n\n" } }, ["end"] = "hang" } })
    local res = assert(rw.fetch(s:url("/quiet"), opts { idle_timeout = 0.3 }))
    local t0 = rw.now()
    assert.equal("data: x\n\n", res:read())
    local chunk, err = res:read()
    assert.is_nil(chunk)
    assert.equal("stream", err.kind)
    assert.matches("no body bytes for 300 milliseconds %(idle_timeout%)", err.message)
    local waited = rw.now() - t0
    assert.is_true(waited > 0.25 and waited < 1.5, ("ended after %.2f s"):format(waited))
    -- a stream longer than its timeout would allow a whole response, talking all along
    local chunks = {}
    for i = 1, 8 do chunks[i] = { 0.1, "tick\n" } end
    s:script("/long", { { action = "stream", chunks = chunks } })
    res = assert(rw.fetch(s:url("/long"), opts { timeout = 0.3, idle_timeout = 0.3 }))
    local parts = {}
    for c in res:chunks() do parts[#parts + 1] = c end
    assert.equal(string.rep("tick\n", 8), table.concat(parts))
  end)

  it("bounds the time to the headers with first_byte_timeout, then retries", function()
    s:script("/slow", { { status = 200, delay = 1 }, { action = "stream", chunks = { { 0, "ok" } } } })
    local t0 = rw.now()
    local res = assert(rw.fetch(s:url("/slow"), opts { first_byte_timeout = 0.2, base = 0.01 }))
    assert.equal(2, res.attempts)
    assert.is_true(rw.now() - t0 < 0.9)
    assert.equal("ok", res:read())
  end)

  it("pauses a stream whose reader falls behind instead of buffering without bound", function()
    local big = string.rep("0123456789abcdef", 256 * 1024) -- 4 MiB
    s:script("/big", { { action = "stream", chunks = { { 0, big } } } })
    local res = assert(rw.fetch(s:url("/big"), opts()))
    local t0 = rw.now()
    rw.run(function() rw.sleep(0.3) end) -- the engine runs, nobody reads
    assert.is_true(rw.now() - t0 >= 0.3)
    local first = res:read()
    assert.is_true(#first <= 256 * 1024 + 16 * 1024, #first .. " bytes were buffered while nobody read")
    local total = #first
    for c in res:chunks() do total = total + #c end
    assert.equal(#big, total)
  end)

  it("answers a non-2xx whole, as without stream, and decodes JSON with res:json()", function()
    s:script("/nf", { { status = 404, body = '{"error":"missing"}' } })
    local res, err = rw.fetch(s:url("/nf"), opts())
    assert.is_nil(res)
    assert.equal("terminal", err.kind)
    assert.equal('{"error":"missing"}', err.response.body)
    assert.equal("missing", err.response:json().error)
    s:script("/j", { { action = "stream", chunks = { { 0, '{"n":' }, { 0.05, "42}" } } } })
    res = assert(rw.fetch(s:url("/j"), opts()))
    assert.equal(42, res:json().n)
    assert.equal('{"n":42}', res.body)
  end)

  it("closes a stream the caller stops reading, and refuses bad options", function()
    s:script("/forever", { { action = "chunked_forever", interval = 0.05 } })
    local res = assert(rw.fetch(s:url("/forever"), opts()))
    assert.is_string(res:read())
    res:close()
    res:close()
    assert.is_nil(res:read())
    assert.error_matches(function() rw.fetch(s:url("/x"), opts { stream = "yes" }) end,
      "option 'stream' must be a boolean")
    assert.error_matches(function() rw.fetch(s:url("/x"), opts { idle_timeout = 0 }) end,
      "option 'idle_timeout' must be a positive number")
    assert.error_matches(function() rw.fetch(s:url("/x"), opts { first_byte_timeout = -1 }) end,
      "option 'first_byte_timeout'")
    assert.error_matches(function() rw.fetch(s:url("/x"), opts { connect_timeout = 0 / 0 }) end,
      "option 'connect_timeout'")
    -- a response not streamed reads as one chunk
    res = assert(rw.fetch(s:url("/plain"), quiet))
    assert.equal("ok", res:read())
    assert.is_nil(res:read())
  end)

  it("ends a stream past max_body, counting what was read too", function()
    s:script("/long", { { action = "stream",
      chunks = { { 0, string.rep("a", 600) }, { 0.05, string.rep("b", 600) } } } })
    local res = assert(rw.fetch(s:url("/long"), opts { max_body = 1000 }))
    local got, err = {}
    while true do
      local chunk, rerr = res:read()
      if not chunk then
        err = rerr
        break
      end
      got[#got + 1] = chunk
    end
    assert.equal(string.rep("a", 600), table.concat(got))
    assert.equal("stream", err.kind)
    assert.matches("response body too large %(limit 1000 bytes%)", err.message)
    assert.equal(600, err.delivered)
  end)

  it("refuses an event over the parser's bound, naming it", function()
    s:script("/huge", { { action = "stream", chunks = { { 0, "data: " .. string.rep("x", 1100 * 1024) .. "\n\n" } } } })
    local res = assert(rw.fetch(s:url("/huge"), opts()))
    local ok, err = pcall(function() for _ in res:events() do end end)
    assert.is_false(ok)
    assert.equal("stream", err.kind)
    assert.matches("an event%-stream line or event over 1048576 bytes", err.message)
  end)
end)

describe("streamed responses through a client", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  it("streams a POST's events, one reader each, never shared or cached", function()
    s:script("/v1/chat", { { action = "stream", headers = SSE,
      chunks = { { 0, "data: {\"delta\":\"Hel\"}\n\n" }, { 0.05, "data: {\"delta\":\"lo\"}\n\ndata: [DONE]\n\n" } } } })
    local c = rw.client { base_url = s.base .. "/v1", on_retry = false, idle_timeout = 5,
      cache = { ttl = 60 } }
    local function complete()
      local res = assert(c:post("/chat", { json = { stream = true }, stream = true }))
      local text = {}
      for ev in res:events() do
        if ev.data == "[DONE]" then break end
        text[#text + 1] = require("cjson").decode(ev.data).delta
      end
      res:close()
      return table.concat(text)
    end
    assert.equal("Hello", complete())
    assert.equal("Hello", complete())
    assert.equal(2, #s:log("/v1/chat"))
    s:script("/v1/get", { { action = "stream", chunks = { { 0.05, "x" } } } })
    local results = {}
    rw.run(function()
      rw.map({ 1, 2 }, function(i)
        local res = assert(c:get("/get", { stream = true }))
        results[i] = res:read()
      end)
    end)
    assert.same({ "x", "x" }, results)
    assert.equal(2, #s:log("/v1/get")) -- not deduplicated
  end)
end)

describe("a streamed response dropped unread", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  it("ends its transfer when it is collected", function()
    local scheduler = require "ratewise.scheduler"
    s:script("/endless", { { action = "chunked_forever", interval = 0.02 } })
    do
      local res = assert(rw.fetch(s:url("/endless"), opts()))
      assert.is_string(res:read())
    end
    for _ = 1, 3 do collectgarbage("collect") end
    rw.step(0.1, false)
    assert.equal(0, scheduler.engine():running())
  end)
end)

-- Whatever a server sends after the headers, a call ends: a body read whole
-- obeys max_body and the call's time, and a redirect's answer is never
-- taken for the final one (issue 29).
describe("a stream's bounds", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  -- the server's record of an endless answer, once it ended (the client
  -- went away, or the cap was reached)
  local function ended(path)
    local deadline = rw.now() + 5
    while true do
      local rec = s:log(path)[1]
      if rec and rec.gone ~= nil then return rec end
      assert(rw.now() < deadline, "the server is still sending " .. path)
      rw.run(function() rw.sleep(0.05) end)
    end
  end

  local function timed(f)
    local t0 = rw.now()
    local a, b = f()
    return a, b, rw.now() - t0
  end

  it("reads a non-2xx that never ends up to max_body, not without bound", function()
    s:script("/e503", { { action = "endless", status = 503, cap = 96 * 1024 * 1024 } })
    local res, err, took = timed(function()
      return rw.fetch(s:url("/e503"), opts { max_elapsed = 20, max_retries = 0 })
    end)
    assert.is_nil(res)
    assert.equal("network", err.kind)
    assert.matches("response body too large %(limit 67108864 bytes%)", tostring(err))
    assert.is_true(took < 10, ("ended after %.2f s"):format(took))
    local rec = ended("/e503")
    assert.is_true(rec.gone)
    assert.is_true(rec.sent < 80 * 1024 * 1024, rec.sent .. " bytes sent")
    -- a max_body of the call's own
    s:reset()
    s:script("/e503", { { action = "endless", status = 503, cap = 96 * 1024 * 1024 } })
    res, err = rw.fetch(s:url("/e503"), opts { max_body = 100000, max_retries = 0 })
    assert.is_nil(res)
    assert.matches("response body too large %(limit 100000 bytes%)", tostring(err))
    assert.is_true(ended("/e503").gone)
  end)

  it("reads a non-2xx that trickles on within the call's time", function()
    s:script("/t429", { { action = "endless", status = 429, body = "slow down\n", interval = 0.05 } })
    local res, err, took = timed(function()
      return rw.fetch(s:url("/t429"), opts { max_elapsed = 1, timeout = 0.6 })
    end)
    assert.is_nil(res)
    assert.equal("budget", err.kind)
    assert.is_true(took < 2.5, ("ended after %.2f s"):format(took))
    assert.is_true(ended("/t429").gone)
    -- a first_byte_timeout longer than timeout gives the answer that long
    s:reset()
    s:script("/t500", { { action = "endless", status = 500, body = "oops\n", interval = 0.05 } })
    res, err, took = timed(function()
      return rw.fetch(s:url("/t500"), opts { timeout = 0.2, first_byte_timeout = 0.6, max_retries = 0 })
    end)
    assert.is_nil(res)
    assert.equal("exhausted", err.kind)
    assert.matches("timed out", tostring(err))
    assert.is_true(took > 0.5 and took < 2.5, ("ended after %.2f s"):format(took))
  end)

  it("bounds res:json() and every whole read of an endless 2xx stream by max_body", function()
    s:script("/e200", { { action = "endless", cap = 96 * 1024 * 1024 } })
    local res = assert(rw.fetch(s:url("/e200"), opts()))
    local value, err, took = timed(function() return res:json() end)
    assert.is_nil(value)
    assert.equal("stream", err.kind)
    assert.matches("over max_body %(67108864 bytes%)", tostring(err))
    assert.is_true(took < 10, ("ended after %.2f s"):format(took))
    local rec = ended("/e200")
    assert.is_true(rec.gone)
    assert.is_true(rec.sent < 80 * 1024 * 1024, rec.sent .. " bytes sent")
    assert.is_nil(res:read()) -- the stream is closed
    -- a 2xx a policy does not take for an answer is read whole too
    s:reset()
    s:script("/e200", { { action = "endless", cap = 16 * 1024 * 1024 } })
    local seen
    res, err = rw.fetch(s:url("/e200"), opts { max_body = 1000000, max_retries = 0, policy = rw.policy {
      classify = function(r)
        seen = r
        return "terminal"
      end } })
    assert.is_nil(res)
    assert.equal("terminal", err.kind)
    assert.equal("", seen.body)
    assert.is_true(ended("/e200").gone)
  end)

  it("reads a 2xx a policy does not take for an answer within the call's time", function()
    s:script("/t200", { { action = "endless", body = "partial\n", interval = 0.05 } })
    local res, err, took = timed(function()
      return rw.fetch(s:url("/t200"), opts { max_elapsed = 1, timeout = 0.5, policy = rw.policy {
        classify = function() return "retryable" end } })
    end)
    assert.is_nil(res)
    assert.is_true(took < 2.5, ("ended after %.2f s"):format(took))
    assert.is_true(err.kind == "budget" or err.kind == "exhausted", err.kind)
    assert.is_true(ended("/t200").gone)
  end)

  it("follows a redirect to a stream without taking the redirect for the answer", function()
    s:script("/to-sse", { { action = "redirect", location = "/sse" } })
    s:script("/sse", { { action = "endless", headers = SSE, body = "data: x\n\n", interval = 0.02 } })
    local res, err, took = timed(function() return rw.fetch(s:url("/to-sse"), opts()) end)
    assert(res, err)
    assert.is_true(took < 1, ("returned after %.2f s"):format(took))
    assert.equal(200, res.status)
    assert.equal(1, res.redirects)
    assert.equal("text/event-stream", res.headers["Content-Type"])
    assert.equal("x", res:events()().data)
    res:close()
    assert.is_true(ended("/sse").gone)
    -- a stream that ends later: fetch returns at its headers
    s:script("/to-late", { { action = "redirect", location = "/late" } })
    s:script("/late", { { action = "stream", chunks = { { 0, "a" }, { 1.5, "b" } } } })
    res, err, took = timed(function() return rw.fetch(s:url("/to-late"), opts()) end)
    assert(res, err)
    assert.is_true(took < 1, ("returned after %.2f s"):format(took))
    assert.equal("a", res:read())
    res:close()
  end)

  it("bounds the time to the final headers after a redirect with first_byte_timeout", function()
    s:script("/to-slow", { { action = "redirect", location = "/slow" } })
    s:script("/slow", { { action = "stream", delay = 3, chunks = { { 0, "late" } } } })
    local res, err, took = timed(function()
      return rw.fetch(s:url("/to-slow"), opts { first_byte_timeout = 0.3, max_retries = 0 })
    end)
    assert.is_nil(res)
    assert.matches("first_byte_timeout", tostring(err))
    assert.is_true(took < 2.5, ("ended after %.2f s"):format(took))
  end)

  it("never hands a redirect's body over with the answer's", function()
    local page = string.rep("R", 300 * 1024)
    s:script("/moved", { { action = "redirect", location = "/final", body = page } })
    s:script("/final", { { action = "stream", chunks = { { 0, "real" } } } })
    local res = assert(rw.fetch(s:url("/moved"), opts()))
    assert.equal(200, res.status)
    assert.equal(1, res.redirects)
    local parts = {}
    for c in res:chunks() do parts[#parts + 1] = c end
    local got = table.concat(parts)
    assert.is_true(got == "real", ("%d bytes, starting %q"):format(#got, got:sub(1, 8)))
    res = assert(rw.fetch(s:url("/moved"), quiet))
    assert.is_true(res.body == "real", ("%d bytes"):format(#res.body))
    -- a redirect's body counts against max_body, and its time against first_byte_timeout
    s:script("/moved-forever", { { action = "endless", status = 302, headers = { Location = "/final" },
      cap = 16 * 1024 * 1024 } })
    local err
    res, err = rw.fetch(s:url("/moved-forever"), opts { max_body = 100000, max_retries = 0 })
    assert.is_nil(res)
    assert.matches("too large", tostring(err))
    assert.is_true(ended("/moved-forever").gone)
  end)

  it("ends an events loop whose stream the caller closed inside it, mid-chunk, without an error", function()
    s:script("/closed", { { body = string.rep("data: x\n\n", 40000), headers = SSE } })
    local res = assert(rw.fetch(s:url("/closed"), { stream = true, on_retry = false }))
    local next_event = res:events()
    assert.equal("x", next_event().data)
    res:close()
    local ok, ev = pcall(next_event)
    assert.is_true(ok, tostring(ev))
    assert.is_nil(ev)
  end)

  it("hands the events of a body read whole over as they are parsed", function()
    local body = string.rep("data: x\n\n", 466033)
    s:script("/many", { { body = body, headers = SSE } })
    local res = assert(rw.fetch(s:url("/many"), quiet))
    collectgarbage("collect")
    local before = collectgarbage("count")
    local next_event = res:events()
    assert.equal("x", next_event().data)
    local grew = collectgarbage("count") - before
    assert.is_true(grew < 8 * 1024, ("%.0f KiB for the first event"):format(grew))
    local n = 1
    while next_event() do n = n + 1 end
    assert.equal(#body / 9, n)
  end)
end)

-- Who waits for a stream's news is the transfer's owner in the engine, set
-- for each wait of a reader in a task and forgotten when its news comes:
-- a task whose wait has ended is never woken by the stream again
-- (docs/internals.md, Invariants: "one owner per transfer").
describe("a stream's readers", function()
  local scheduler = require "ratewise.scheduler"
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  -- reads res until it has `want` (nil: to its end); answers what it read
  local function read_until(res, want)
    local got = ""
    while got ~= want do
      local chunk, err = res:read()
      assert.is_nil(err)
      if not chunk then break end
      got = got .. chunk
    end
    return got
  end

  it("wakes each task that reads a stream, one after another, for its own reads", function()
    s:script("/s", { { action = "stream", chunks = { { 0.1, "a" }, { 0.2, "b" }, { 0.2, "c" }, { 0.2, "d" } } } })
    local first_got, second_got, slept
    rw.run(function()
      local res = assert(rw.fetch(s:url("/s"), opts()))
      local first = rw.spawn(function()
        first_got = read_until(res, "ab")
        local t0 = rw.now()
        rw.sleep(0.8) -- the stream goes on without it: not woken by its news or its end
        slept = rw.now() - t0
        return true
      end)
      local second = rw.spawn(function()
        while first_got == nil do rw.sleep(0.01) end
        second_got = read_until(res)
        return true
      end)
      assert(second:join())
      assert(first:join())
    end)
    assert.equal("ab", first_got)
    assert.equal("cd", second_got)
    assert.is_true(slept >= 0.8, ("the first reader's sleep ended after %.3f s"):format(slept))
  end)

  it("does not wake a task that read a stream when code outside any task reads on", function()
    s:script("/s", { { action = "stream", chunks = { { 0.1, "a" }, { 0.2, "b" }, { 0.2, "c" } } } })
    local res, slept
    local reader = rw.spawn(function()
      local mine = assert(rw.fetch(s:url("/s"), opts()))
      assert.equal("a", read_until(mine, "a"))
      res = mine
      local t0 = rw.now()
      rw.sleep(0.8)
      slept = rw.now() - t0
      return true
    end)
    while res == nil do rw.step(0.01) end
    assert.equal("bc", read_until(res))
    assert(reader:join())
    assert.is_true(slept >= 0.8, ("the task's sleep ended after %.3f s"):format(slept))
  end)

  it("leaves nothing to wake when a task waiting for a stream's news is cancelled", function()
    s:script("/s", { { action = "stream", chunks = { { 0.05, "a" }, { 0.3, "b" }, { 0.1, "c" } } } })
    local waiting, slept = false, nil
    local reader = rw.spawn(function()
      local res = assert(rw.fetch(s:url("/s"), opts()))
      assert.equal("a", read_until(res, "a"))
      waiting = true
      res:read() -- waits for "b": cancelled meanwhile
      error("not reached: the task was cancelled while it waited")
    end)
    local sleeper = rw.spawn(function()
      local t0 = rw.now()
      rw.sleep(0.7)
      slept = rw.now() - t0
      return true
    end)
    while not waiting do rw.step(0.01) end
    rw.step(0.05)
    assert.equal("waiting", reader:status())
    reader:cancel()
    rw.step(0.01)
    assert.equal("done", reader:status())
    assert.same({ nil, "cancelled" }, { reader:join() })
    assert.equal(0, scheduler.engine():running()) -- the stream was aborted with the wait
    rw.step(math.huge) -- past when "b" and "c" would have come
    assert(sleeper:join())
    assert.is_true(slept >= 0.7, ("the other task's sleep ended after %.3f s"):format(slept))
  end)
end)
