-- lua/ratewise/response.lua on its own contract (the methods of every
-- response rw.fetch returns), against the loopback test server.
-- stream_spec.lua covers streaming end to end (chunks as they arrive,
-- events, a break, bounds, timeouts); json_spec.lua res:json() on whole
-- bodies. This covers what a reader relies on besides: a body read once, a
-- break that stays broken, the error chunks() raises being the error object,
-- res:json() on a stream that is not JSON, close() as the server sees it,
-- and the fields a response has without asking (headers_spec.lua covers
-- header_lists).
local rw = require "ratewise"
local server = require "spec.support.server"

local quiet = { on_retry = false }
local streamed = { on_retry = false, stream = true }

describe("a response's methods", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("reads a body not streamed once, whole; an empty one not at all", function()
    s:script("/whole", { { body = "all of it" } })
    local res = assert(rw.fetch(s:url("/whole"), quiet))
    local parts = {}
    for chunk in res:chunks() do parts[#parts + 1] = chunk end
    assert.same({ "all of it" }, parts)
    assert.is_nil(res:read())
    assert.equal("all of it", res.body) -- reading hands it over, and keeps it
    res:close() -- nothing to close: does nothing
    assert.equal("all of it", res.body)
    s:script("/none", { { status = 204 } })
    res = assert(rw.fetch(s:url("/none"), quiet))
    assert.is_nil(res:read())
    assert.is_nil(res:read())
  end)

  it("stays broken once a stream broke off: every later read says the same error", function()
    s:script("/cut", { { action = "stream", chunks = { { 0, "abc" }, { 0.05, "de" } }, ["end"] = "reset" } })
    local res = assert(rw.fetch(s:url("/cut"), streamed))
    local got, err = {}
    while true do
      local chunk, why = res:read()
      if not chunk then
        err = why
        break
      end
      got[#got + 1] = chunk
    end
    assert.equal("abcde", table.concat(got))
    assert.equal("stream", err.kind)
    assert.equal(5, err.delivered)
    assert.equal(200, err.status)
    assert.equal(res, err.response)
    assert.matches("GET " .. s:url("/cut"):gsub("%p", "%%%0") .. ": the stream broke off after 5 bytes", err.message)
    local again, err2 = res:read()
    assert.is_nil(again)
    assert.equal(err, err2)
    -- chunks() raises that very error object, not a string made of it
    local ok, raised = pcall(function() for _ in res:chunks() do end end)
    assert.is_false(ok)
    assert.equal(err, raised)
    assert.equal(1, #s:log("/cut")) -- nothing sent again
  end)

  it("raises the break from events() after the events that arrived whole", function()
    s:script("/ev", { { action = "stream", headers = { ["Content-Type"] = "text/event-stream" },
      chunks = { { 0, "data: one\n\ndata: tw" } }, ["end"] = "reset" } })
    local res = assert(rw.fetch(s:url("/ev"), streamed))
    local got = {}
    local ok, err = pcall(function() for ev in res:events() do got[#got + 1] = ev.data end end)
    assert.is_false(ok)
    assert.same({ "one" }, got) -- the half event is not handed over
    assert.equal("stream", err.kind)
    assert.equal(#"data: one\n\ndata: tw", err.delivered)
  end)

  it("decodes a streamed body with json() after reading it whole, and says why when it is not JSON", function()
    s:script("/notjson", { { action = "stream", chunks = { { 0, "<html>" }, { 0.05, "</html>" } } } })
    local res = assert(rw.fetch(s:url("/notjson"), streamed))
    local value, why = res:json()
    assert.is_nil(value)
    assert.matches("^response body is not valid JSON", why)
    assert.equal("<html></html>", res.body)
    s:script("/j", { { action = "stream", chunks = { { 0, '{"a":[1,' }, { 0.05, '2]}' } } } })
    assert.same({ a = { 1, 2 } }, assert(rw.fetch(s:url("/j"), streamed)):json())
  end)

  it("closes a stream for the server too: it sees the client go, long before it would have stopped", function()
    s:script("/endless", { { action = "endless", interval = 0.01, body = string.rep("x", 1024) } })
    local res = assert(rw.fetch(s:url("/endless"), streamed))
    assert.is_string(res:read())
    res:close()
    assert.is_nil(res:read())
    local record
    local give_up = rw.now() + 5
    repeat
      rw.sleep(0.05)
      record = s:log("/endless")[1]
    until (record and record.gone ~= nil) or rw.now() > give_up
    assert.is_true(record.gone, "the server saw the client disconnect")
    assert.is_true(record.sent < 1024 * 1024, "sent " .. tostring(record.sent))
  end)

  it("has redirects, http_version and case-insensitive headers without asking", function()
    s:script("/final", { { body = "here", headers = { ["X-Thing"] = "1" } } })
    local res = assert(rw.fetch(s:url("/final"), quiet))
    assert.equal(0, res.redirects)
    assert.equal("1.1", res.http_version)
    assert.equal("1", res.headers["x-thing"])
    assert.equal("1", res.headers["X-THING"])
    s:script("/hop", { { action = "redirect", location = s:url("/final") } })
    res = assert(rw.fetch(s:url("/hop"), quiet))
    assert.equal(1, res.redirects)
    assert.equal("here", res.body)
    assert.equal("1.1", res.http_version)
  end)
end)
