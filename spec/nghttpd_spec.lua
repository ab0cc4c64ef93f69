-- Against nghttpd (nghttp2-server), an HTTP/2-only server over TLS, as its
-- users run it: POSTs without an idempotency key (docs/http.md, "HTTP/2"),
-- and as few connections as its SETTINGS_MAX_CONCURRENT_STREAMS allows.
-- What the server saw is read from its log (spec/support/nghttpd.lua).
local rw = require "ratewise"
local nghttpd = require "spec.support.nghttpd"

-- n tasks, each one request of opts (its url from the task's number i):
-- the results, in order.
local function concurrent(n, url_of, opts)
  local out = {}
  rw.run(function()
    for i = 1, n do
      rw.spawn(function()
        local o = {}
        for k, v in pairs(opts) do o[k] = v end
        local res, err = rw.fetch(url_of(i), o)
        out[i] = { res = res, err = err }
      end)
    end
  end)
  return out
end

describe("an HTTP/2-only server (nghttpd)", function()
  local s

  setup(function() s = nghttpd.start() end)
  teardown(function() if s then s:stop() end end)

  it("answers 20 POSTs without an idempotency key, each seen once, over HTTP/2", function()
    local tag = tostring(os.time())
    local out = concurrent(20, function(i) return s:url("/post?t=" .. tag .. "&n=" .. i) end,
      { method = "POST", body = "body", ca_file = s.ca_file, max_retries = 0 })
    for i = 1, 20 do
      local r = out[i]
      assert.is_nil(r.err and r.err.message)
      assert.equal(200, r.res.status)
      assert.equal("body", r.res.body) -- --echo-upload: the body reached it
      assert.equal("2", r.res.http_version)
      assert.equal(1, s:seen(":path: /post?t=" .. tag .. "&n=" .. i))
    end
  end)

  it("answers POSTs after GETs to the same origin, each POST seen once", function()
    local tag = "after" .. os.time()
    -- the GETs go through the engine's gate and leave a connection known to multiplex
    local gets = concurrent(10, function(i) return s:url("/hello?n=" .. i) end, { ca_file = s.ca_file })
    local posts = concurrent(10, function(i) return s:url("/post?t=" .. tag .. "&n=" .. i) end,
      { method = "POST", body = "b", ca_file = s.ca_file, max_retries = 0 })
    for i = 1, 10 do
      assert.equal(200, gets[i].res.status)
      assert.is_nil(posts[i].err and posts[i].err.message)
      assert.equal(200, posts[i].res.status)
      assert.equal("2", posts[i].res.http_version)
      assert.equal(1, s:seen(":path: /post?t=" .. tag .. "&n=" .. i))
    end
  end)

  it("ends a POST that failed before a byte was written as a transport error, retried, not unsafe", function()
    -- the server takes the connection (the kernel's backlog) but never
    -- answers the TLS handshake: nothing of the request is written
    local stopped = nghttpd.start()
    os.execute("kill -STOP " .. stopped.pid)
    local retries = 0
    local res, err = rw.fetch(stopped:url("/post"), { method = "POST", body = "b", ca_file = stopped.ca_file,
      connect_timeout = 0.2, timeout = 2, max_retries = 1, base = 0.01,
      on_retry = function() retries = retries + 1 end })
    os.execute("kill -CONT " .. stopped.pid)
    stopped:stop()
    assert.is_nil(res)
    assert.are_not.equal("unsafe", err.kind)
    assert.equal(1, retries)
  end)
end)

describe("a server that takes 10 streams a connection (nghttpd -m 10)", function()
  local s

  setup(function() s = nghttpd.start { max_streams = 10 } end)
  teardown(function() if s then s:stop() end end)

  -- 64 tasks, `per` GETs each: those that answered 200, and the TLS
  -- connections the server saw opened meanwhile.
  local function burst(per)
    local from, ok = s:mark(), 0
    rw.run(function()
      for i = 1, 64 do
        rw.spawn(function()
          for j = 1, per do
            local res = rw.fetch(s:url("/hello?i=" .. i .. "&j=" .. j), { ca_file = s.ca_file })
            if res and res.status == 200 and res.http_version == "2" then ok = ok + 1 end
          end
        end)
      end
    end)
    return ok, s:handshakes(from)
  end

  it("opens about as many connections as 64 requests in flight need, ceil(64 / 10), not one a request", function()
    -- before: 46 to 55 connections for the first burst, and a later burst
    -- larger than the connections left open opened one for each request past them
    local limit = math.ceil(64 / 10) + 2
    local ok, opened = burst(1)
    assert.equal(64, ok)
    assert.is_true(opened <= limit, opened .. " connections for the first burst")
    ok, opened = burst(4)
    assert.equal(256, ok)
    assert.is_true(opened <= limit, opened .. " connections for the second burst")
  end)
end)

-- The engine's gate (src/gate.c) lets a burst to an origin that answered
-- over HTTP/2 go one transfer at a time: the first goes on, those started
-- before libcurl next runs are held until it has. A host waits on the
-- engine's descriptor at most engine:timeout() seconds before it polls:
-- when the one transfer in flight is cancelled or closed before that drive,
-- those held behind it go on at once, not at their hold's expiry (half
-- their timeout).
describe("a burst to an origin known to multiplex, its first transfer ended before libcurl runs", function()
  local core = require "ratewise.core"
  local socket = require "socket"
  -- What failed was the wait on the engine's descriptor for as long as
  -- engine:timeout() said; a poll(2) build has no descriptor to wait on.
  if not core.engine():pollfd() then
    pending("a poll(2) build has no descriptor for a host to wait on")
    return
  end
  local s

  setup(function() s = nghttpd.start() end)
  teardown(function() if s then s:stop() end end)

  -- Polls engine e the way a host does, waiting on its descriptor for what
  -- engine:timeout() says (luasocket's select takes any object with getfd),
  -- until every transfer of `transfers` is done or `seconds` have passed.
  -- Returns when each was seen done (socket.gettime(); nil: not done).
  local function host_wait(e, transfers, seconds)
    local waitable = { getfd = function() return e:pollfd() end, dirty = function() return false end }
    local t0, done, left = socket.gettime(), {}, #transfers
    while left > 0 and socket.gettime() - t0 < seconds do
      local wait = math.min(e:timeout() or seconds, seconds - (socket.gettime() - t0))
      if wait > 0 then socket.select({ waitable }, nil, wait) end
      e:poll(0)
      for i, t in ipairs(transfers) do
        if not done[i] and t:done() then
          done[i] = socket.gettime()
          left = left - 1
        end
      end
    end
    return done
  end

  -- A new engine that knows s's origin as multiplexing (one GET answered
  -- over HTTP/2), then a burst: a first GET that goes on and two held behind
  -- it (timeout 2 s: held at most 1 s). `ends` ends the first one before
  -- any poll. Asserts that the held ones were answered and seen by the
  -- server, and the first one not, and returns when each held one was done,
  -- in seconds after `ends`.
  local bursts = 0
  local function burst(ends)
    bursts = bursts + 1
    local e = core.engine()
    local function start(path)
      return assert(e:start { url = s:url(path), ca_file = s.ca_file, timeout = 2 })
    end
    local tag = "/hello?burst=" .. os.time() .. "-" .. bursts
    local known = start(tag .. "&n=known")
    host_wait(e, { known }, 5)
    local res, err = known:result()
    assert.is_nil(err and err.message)
    assert.equal("2", res.http_version)
    known:close()
    local first = start(tag .. "&n=first")
    local held = { start(tag .. "&n=1"), start(tag .. "&n=2") }
    local ended = socket.gettime()
    ends(first)
    local done = host_wait(e, held, 3)
    for i, t in ipairs(held) do
      assert(done[i], "held transfer " .. i .. " not done within 3 s")
      local r, why = t:result()
      assert.is_nil(why and why.message)
      assert.equal(200, r.status)
      assert.equal(1, s:seen(":path: " .. tag .. "&n=" .. i))
      done[i] = done[i] - ended
    end
    assert.equal(0, s:seen(":path: " .. tag .. "&n=first")) -- ended before libcurl ran: nothing sent
    e:close()
    return done
  end

  local function assert_prompt(done)
    for i = 1, 2 do
      -- not at the hold's expiry, half their timeout
      assert.is_true(done[i] < 0.4, ("held transfer %d done after %.3f s"):format(i, done[i] or -1))
    end
  end

  it("lets the held ones go at once when it is cancelled", function()
    assert_prompt(burst(function(first) first:cancel() end))
  end)

  it("lets the held ones go at once when it is closed", function()
    assert_prompt(burst(function(first) first:close() end))
  end)
end)
