-- Specs for the test server (spec/support/server.py) and its Lua driver.
-- Run: lua5.4 /usr/bin/busted spec/server_spec.lua
--
-- Everything here talks to the server with plain luasocket (socket.http or
-- raw TCP), so these specs prove the harness independently of ratewise.

local socket = require "socket"
local http = require "socket.http"
local ltn12 = require "ltn12"
local server = require "spec.support.server"

-- GET/POST with socket.http; returns status, body, headers (lowercase names).
local function fetch(url, method, body, headers)
  local chunks = {}
  local h = headers or {}
  if body then h["content-length"] = tostring(#body) end
  local ok, code, resp_headers = http.request {
    url = url,
    method = method or "GET",
    headers = h,
    source = body and ltn12.source.string(body) or nil,
    sink = ltn12.sink.table(chunks),
  }
  assert(ok, code)
  return code, table.concat(chunks), resp_headers
end

-- Raw TCP helpers, for what socket.http hides (keep-alive, broken replies).
local function connect(port, timeout)
  local c = assert(socket.tcp())
  c:settimeout(timeout or 5)
  assert(c:connect("127.0.0.1", port))
  return c
end

local function send_request(c, method, path, headers, body)
  local lines = { ("%s %s HTTP/1.1"):format(method, path), "Host: 127.0.0.1" }
  for _, h in ipairs(headers or {}) do lines[#lines + 1] = h end
  if body then lines[#lines + 1] = "Content-Length: " .. #body end
  assert(c:send(table.concat(lines, "\r\n") .. "\r\n\r\n" .. (body or "")))
end

-- Wait until the server has answered or closed (FIN/RST arrived).
local function wait_readable(c)
  local ready = socket.select({ c }, nil, 5)
  assert(#ready == 1, "server did not answer or close within 5 s")
end

-- Read one response with a Content-Length body (none for HEAD).
local function read_response(c, no_body)
  local line, err = c:receive("*l")
  if not line then return nil, err end
  local status = tonumber(line:match("^HTTP/1%.1 (%d%d%d)"))
  local headers = {}
  while true do
    local h = assert(c:receive("*l"))
    if h == "" then break end
    local name, value = h:match("^([^:]+):%s*(.*)$")
    headers[name:lower()] = value
  end
  local len = tonumber(headers["content-length"] or 0)
  local body = ""
  if len > 0 and not no_body then body = assert(c:receive(len)) end
  return status, headers, body
end

-- True once a fresh request is the only one the server is handling, i.e.
-- requests whose clients went away are no longer counted as active.
local function eventually_idle(s)
  for _ = 1, 50 do
    fetch(s:url("/idle-probe"))
    local log = s:log("/idle-probe")
    if log[#log].active == 1 then return true end
    socket.sleep(0.05)
  end
  return false
end

describe("test server", function()
  local s

  setup(function()
    s = server.start()
  end)

  teardown(function()
    s:stop()
  end)

  before_each(function()
    s:reset()
  end)

  it("prints its port and builds URLs", function()
    assert.is_number(s.port)
    assert.is_true(s.port > 0)
    assert.equal("http://127.0.0.1:" .. s.port, s.base)
    assert.equal(s.base .. "/x", s:url("/x"))
  end)

  it("answers unscripted paths with 200 ok", function()
    local code, body, headers = fetch(s:url("/anything?q=1"))
    assert.equal(200, code)
    assert.equal("ok", body)
    assert.equal("2", headers["content-length"])
  end)

  it("serves a script in order and repeats the last step", function()
    s:script("/x", {
      { status = 429, headers = { ["Retry-After"] = "1" }, body = "slow down" },
      { status = 200, body = "fine" },
    })
    local code, body, headers = fetch(s:url("/x"))
    assert.equal(429, code)
    assert.equal("slow down", body)
    assert.equal("1", headers["retry-after"])
    for _ = 1, 3 do
      code, body = fetch(s:url("/x?ignored=query"))
      assert.equal(200, code)
      assert.equal("fine", body)
    end
    -- Other paths are not affected by the script.
    assert.equal("ok", select(2, fetch(s:url("/x/other"))))
  end)

  it("replaces an earlier script for the same path", function()
    s:script("/x", { { status = 500 } })
    assert.equal(500, (fetch(s:url("/x"))))
    s:script("/x", { { status = 204 } })
    assert.equal(204, (fetch(s:url("/x"))))
  end)

  it("refuses bad scripts with a clear error", function()
    assert.has_error(function() s:script("/x", {}) end)
    local ok, err = pcall(s.script, s, "/x", { { action = "explode" } })
    assert.is_false(ok)
    assert.matches("HTTP 400", err)
    assert.matches("unknown action", err)
  end)

  it("logs method, path, query, lowercase headers, body and times", function()
    local before = socket.gettime()
    fetch(s:url("/logged?a=1&b=2"), "POST", "hello body",
          { ["X-Custom-Thing"] = "Value", ["content-type"] = "text/plain" })
    fetch(s:url("/logged"))
    local after = socket.gettime()

    local log = s:log("/logged")
    assert.equal(2, #log)
    local r = log[1]
    assert.equal(1, r.seq)
    assert.equal("POST", r.method)
    assert.equal("/logged", r.path)
    assert.equal("a=1&b=2", r.query)
    assert.equal("Value", r.headers["x-custom-thing"])
    assert.equal("text/plain", r.headers["content-type"])
    assert.is_nil(r.headers["X-Custom-Thing"])
    assert.equal("hello body", r.body)
    assert.is_number(r.t)
    assert.is_true(r.wall >= before - 0.01 and r.wall <= after + 0.01)
    assert.equal(1, r.active)

    assert.equal(2, log[2].seq)
    assert.equal("GET", log[2].method)
    assert.equal("", log[2].query)
    assert.equal("", log[2].body)
    assert.is_true(log[2].t >= r.t)
    -- t (monotonic) and wall advance together.
    assert.is_true(math.abs((log[2].t - r.t) - (log[2].wall - r.wall)) < 0.05)
  end)

  it("filters the log by path and never logs control calls", function()
    fetch(s:url("/a"))
    fetch(s:url("/b"))
    fetch(s:url("/a"))
    assert.equal(3, #s:log())
    assert.equal(2, #s:log("/a"))
    assert.same({}, s:log("/nothing-here"))
  end)

  it("keeps exact bytes in bodies both ways", function()
    local raw = "\0\1binary\255\254\128"
    fetch(s:url("/bytes"), "POST", raw)
    assert.equal(raw, s:log("/bytes")[1].body)

    s:script("/bytes-out", { { body = raw } })
    local _, body = fetch(s:url("/bytes-out"))
    assert.equal(raw, body)
  end)

  it("reads chunked request bodies and joins repeated headers", function()
    local c = connect(s.port)
    send_request(c, "PUT", "/chunked", {
      "Transfer-Encoding: chunked", "X-Dup: one", "X-Dup: two",
    })
    assert(c:send("5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n"))
    assert.equal(200, (read_response(c)))
    c:close()
    local r = s:log("/chunked")[1]
    assert.equal("hello, world", r.body)
    assert.equal("one, two", r.headers["x-dup"])
  end)

  it("keeps connections alive and tells them apart", function()
    local c = connect(s.port)
    send_request(c, "GET", "/ka")
    assert.equal(200, (read_response(c)))
    send_request(c, "POST", "/ka", nil, "second")
    local status, _, body = read_response(c)
    assert.equal(200, status)
    assert.equal("ok", body)
    c:close()
    fetch(s:url("/ka")) -- a new connection

    local log = s:log("/ka")
    assert.equal(3, #log)
    assert.equal(log[1].conn, log[2].conn)
    assert.equal(1, log[1].conn_seq)
    assert.equal(2, log[2].conn_seq)
    assert.not_equal(log[1].conn, log[3].conn)
    assert.equal(1, log[3].conn_seq)
    assert.matches("^127%.0%.0%.1:%d+$", log[1].conn)
  end)

  it("closes the connection after a step with Connection: close", function()
    s:script("/bye", { { headers = { Connection = "close" }, body = "bye" } })
    local c = connect(s.port)
    send_request(c, "GET", "/bye")
    local status, headers, body = read_response(c)
    assert.equal(200, status)
    assert.equal("close", headers["connection"])
    assert.equal("bye", body)
    assert.same({ nil, "closed", "" }, { c:receive("*a") })
    c:close()
  end)

  it("sends a header several times when given an array", function()
    s:script("/cookies", { { headers = { ["Set-Cookie"] = { "a=1", "b=2" } } } })
    local c = connect(s.port)
    send_request(c, "GET", "/cookies")
    local raw = c:receive("*l")
    local cookies = {}
    while raw ~= "" do
      cookies[#cookies + 1] = raw:match("^Set%-Cookie: (.*)$")
      raw = c:receive("*l")
    end
    c:close()
    assert.same({ "a=1", "b=2" }, cookies)
  end)

  it("answers HEAD with Content-Length but no body", function()
    local c = connect(s.port)
    send_request(c, "HEAD", "/head")
    local status, headers = read_response(c, true)
    assert.equal(200, status)
    assert.equal("2", headers["content-length"])
    -- The next response on the connection must start right away.
    send_request(c, "GET", "/head")
    local status2, _, body = read_response(c)
    assert.equal(200, status2)
    assert.equal("ok", body)
    c:close()
  end)

  it("echoes the request on /echo", function()
    local cjson = require "cjson"
    local code, body = fetch(s:url("/echo?x=y"), "POST", "data", { ["X-A"] = "b" })
    assert.equal(200, code)
    local e = cjson.decode(body)
    assert.equal("POST", e.method)
    assert.equal("/echo", e.path)
    assert.equal("x=y", e.query)
    assert.equal("b", e.headers["x-a"])
    assert.equal("data", e.body)
  end)

  describe("failure actions", function()
    it("drop: closes without a byte", function()
      s:script("/drop", { { action = "drop" } })
      local c = connect(s.port)
      send_request(c, "GET", "/drop")
      wait_readable(c)
      assert.is_nil(c:getoption("error")) -- a clean FIN, no RST
      assert.same({ nil, "closed", "" }, { c:receive("*a") })
      c:close()
      assert.equal(1, #s:log("/drop"))
    end)

    it("reset: the client sees a TCP RST", function()
      s:script("/rst", { { action = "reset" } })
      local c = connect(s.port)
      send_request(c, "GET", "/rst")
      wait_readable(c)
      -- luasocket reports ECONNRESET as "closed" from receive(), so it cannot
      -- tell RST from FIN there. SO_ERROR can: it is pending only after a
      -- RST (and luasocket names ECONNRESET "closed" there too).
      assert.equal("closed", c:getoption("error"))
      local data, err, partial = c:receive("*a")
      c:close()
      assert.is_nil(data)
      assert.equal("closed", err)
      assert.equal("", partial)
    end)

    it("garbage: sends a non-HTTP line and closes", function()
      s:script("/junk", { { action = "garbage" } })
      local c = connect(s.port)
      send_request(c, "GET", "/junk")
      assert.equal("this is not http\r\n\r\n", c:receive("*a"))
      c:close()
    end)

    it("hang: sends nothing for `delay` seconds, then closes", function()
      s:script("/hang", { { action = "hang", delay = 0.2 } })
      local c = connect(s.port)
      local t0 = socket.gettime()
      send_request(c, "GET", "/hang")
      assert.same({ nil, "closed", "" }, { c:receive("*a") })
      local elapsed = socket.gettime() - t0
      c:close()
      assert.is_true(elapsed >= 0.19, "closed too early: " .. elapsed)
      assert.is_true(elapsed < 2, "closed too late: " .. elapsed)
    end)

    it("hang: a client timeout sees no data at all", function()
      s:script("/hang", { { action = "hang" } }) -- default: an hour
      local c = connect(s.port, 0.2)
      send_request(c, "GET", "/hang")
      local data, err, partial = c:receive("*a")
      c:close()
      assert.is_nil(data)
      assert.equal("timeout", err)
      assert.equal("", partial)
      -- The server notices the client left and stops counting the request.
      assert.is_true(eventually_idle(s))
    end)

    it("delay: waits before a normal response", function()
      s:script("/late", { { delay = 0.2, body = "late" } })
      local t0 = socket.gettime()
      local code, body = fetch(s:url("/late"))
      assert.is_true(socket.gettime() - t0 >= 0.19)
      assert.equal(200, code)
      assert.equal("late", body)
    end)

    it("slow: dribbles the body byte by byte", function()
      s:script("/slow", { { action = "slow", interval = 0.05, body = "abcd" } })
      local t0 = socket.gettime()
      local code, body = fetch(s:url("/slow"))
      assert.is_true(socket.gettime() - t0 >= 0.19)
      assert.equal(200, code)
      assert.equal("abcd", body)
    end)

    it("truncate: promises 1000 bytes more than it sends", function()
      s:script("/short", { { action = "truncate", body = "part" } })
      local c = connect(s.port)
      send_request(c, "GET", "/short")
      local all = c:receive("*a")
      c:close()
      assert.matches("^HTTP/1%.1 200", all)
      assert.matches("Content%-Length: 1004\r\n", all)
      assert.matches("\r\n\r\npart$", all)
    end)

    it("chunked_forever: streams chunks until the client leaves", function()
      s:script("/stream", { { action = "chunked_forever", interval = 0.02 } })
      local c = connect(s.port)
      send_request(c, "GET", "/stream")
      local status, headers = read_response(c, true)
      assert.equal(200, status)
      assert.equal("chunked", headers["transfer-encoding"])
      for _ = 1, 3 do
        assert.equal("6", c:receive("*l"))
        assert.equal("chunk", c:receive("*l"))
        assert.equal("", c:receive("*l"))
      end
      c:close()
      assert.is_true(eventually_idle(s))
    end)

    it("redirect: 302 with the step's Location", function()
      s:script("/old", { { action = "redirect", location = "/new" } })
      local c = connect(s.port)
      send_request(c, "GET", "/old")
      local status, headers = read_response(c)
      c:close()
      assert.equal(302, status)
      assert.equal("/new", headers["location"])
    end)
  end)

  it("handles 64 concurrent connections and counts active requests", function()
    s:script("/busy", { { delay = 1, body = "done" } })
    local conns = {}
    for i = 1, 64 do
      conns[i] = connect(s.port)
      send_request(conns[i], "GET", "/busy")
    end
    for i = 1, 64 do
      local status, _, body = read_response(conns[i])
      assert.equal(200, status)
      assert.equal("done", body)
      conns[i]:close()
    end
    local log = s:log("/busy")
    assert.equal(64, #log)
    local max = 0
    for _, r in ipairs(log) do max = math.max(max, r.active) end
    assert.equal(64, max)
  end)

  it("reset clears scripts and the log and restarts seq", function()
    s:script("/x", { { status = 500 } })
    fetch(s:url("/x"))
    assert.equal(1, #s:log())
    s:reset()
    local log = s:log()
    assert.same({}, log)
    assert.equal(0, #log)
    local code, body = fetch(s:url("/x"))
    assert.equal(200, code)
    assert.equal("ok", body)
    assert.equal(1, s:log()[1].seq)
  end)
end)

describe("demo rate-limited API", function()
  local s

  setup(function()
    -- A slow refill keeps the burst boundary exact however slow the machine;
    -- no random 503s so every allowed request is a 200.
    s = server.start { args = { "--api-rate", "0.5", "--api-fail", "0" } }
  end)

  teardown(function()
    s:stop()
  end)

  it("allows a burst of 5, then answers 429 with hints", function()
    for i = 1, 5 do
      local code, body, headers = fetch(s:url("/api/items"))
      assert.equal(200, code)
      assert.matches('"n": ' .. i .. "}", body)
      assert.equal(tostring(5 - i), headers["x-ratelimit-remaining"])
      assert.equal("5", headers["x-ratelimit-limit"])
    end
    local code, _, headers = fetch(s:url("/api/items"))
    local now = socket.gettime()
    assert.equal(429, code)
    -- One token needs 1 / 0.5 = 2 s.
    assert.equal("2", headers["retry-after"])
    assert.equal("0", headers["x-ratelimit-remaining"])
    assert.equal("5", headers["x-ratelimit-limit"])
    local reset = tonumber(headers["x-ratelimit-reset"])
    assert.is_true(reset >= now + 1 and reset <= now + 3, "reset " .. reset)
  end)

  it("refills after reset", function()
    s:reset()
    assert.equal(200, (fetch(s:url("/api/x"))))
  end)
end)

describe("demo API with random failures", function()
  it("is deterministic for a seed", function()
    local function run()
      local s = server.start { args = { "--api-rate", "1000", "--api-capacity", "1000",
                                        "--api-fail", "0.5", "--seed", "7" } }
      local codes = {}
      for i = 1, 20 do codes[i] = (fetch(s:url("/api/r"))) end
      s:stop()
      return codes
    end
    local a, b = run(), run()
    assert.same(a, b)
    local n503 = 0
    for _, c in ipairs(a) do if c == 503 then n503 = n503 + 1 end end
    assert.is_true(n503 > 0 and n503 < 20)
  end)
end)

describe("server driver", function()
  it("fails clearly when the server cannot start", function()
    local ok, err = pcall(server.start, { args = { "--no-such-option" } })
    assert.is_false(ok)
    assert.matches("exited before it was listening", err)
    assert.matches("unrecognized arguments", err)
  end)

  it("fails clearly when the port is taken", function()
    local s = server.start()
    local ok, err = pcall(server.start, { args = { "--port", tostring(s.port) } })
    s:stop()
    assert.is_false(ok)
    assert.matches("Address already in use", err)
  end)

  it("stops idempotently and leaves no process behind", function()
    local s = server.start()
    local pid = s.pid
    s:stop()
    s:stop()
    assert.is_nil(io.open("/proc/" .. pid .. "/stat"))
    assert.has_error(function() s:log() end)
  end)
end)
