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
