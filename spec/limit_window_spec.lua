-- Limiters against the rate limits users run in front of their APIs
-- (issue 40, section 5), started on loopback by the suite:
--
--   * HAProxy 2.6, a stick table tracking http_req_rate(1s) and a 429 with
--     Retry-After: 1 above 200 a second (spec/support/haproxy.lua). It
--     counts the requests it refuses: a client that keeps sending while
--     refused keeps its own window full. rw.adaptive{} and rw.bucket at
--     the server's rate and burst must get most of the rate with few 429s.
--   * nginx's limit_req at 200 r/s, burst 0 and burst 5 nodelay: a bare
--     429, no Retry-After. With no limiter, the backoff alone must get a
--     good share without drawing a 429 storm.
--
-- 16 tasks call rw.fetch in a loop for a few seconds; the server counts
-- what it accepted and refused. The bounds leave room for a loaded
-- machine (the figures are in docs/limits.md and bench/README.md).
local rw = require "ratewise"
local haproxy = require "spec.support.haproxy"
local nginx = require "spec.support.nginx"

local RATE, TASKS = 200, 16

-- Runs TASKS tasks against url for seconds through limiter (nil: none),
-- or through a client of the URL's origin with no limiter of the caller's
-- (limiter "client"); count() answers what the server accepted and
-- refused so far. Answers the share of the rate accepted, the share of
-- requests refused, and the errors of the calls that failed.
local function load(url, seconds, limiter, count)
  local accepted0, refused0 = count()
  -- as a caller that keeps retrying does: a call ends only when it is
  -- answered (the tasks are cancelled once counted)
  local opts = { on_retry = false, max_retries = 1000, max_elapsed = 60 }
  local call
  if limiter == "client" then
    local origin, path = url:match("^(https?://[^/]+)(.*)$")
    -- (calls that differ, as an API's do: identical ones in flight would share one request)
    local client = rw.client { base_url = origin, dedupe = false }
    call = function() return client:get(path, opts) end
  else
    opts.limiter = limiter
    call = function() return rw.fetch(url, opts) end
  end
  local accepted, refused, failed = nil, nil, {}
  rw.run(function()
    local tasks = {}
    for i = 1, TASKS do
      tasks[i] = rw.spawn(function()
        while true do
          local res, err = call()
          if not res then failed[#failed + 1] = tostring(err) end
        end
      end)
    end
    rw.sleep(seconds)
    accepted, refused = count()
    for i = 1, TASKS do tasks[i]:cancel() end
  end)
  accepted, refused = accepted - accepted0, refused - refused0
  return accepted / (RATE * seconds), refused / math.max(1, accepted + refused), failed
end

local function shown(share, refused)
  return string.format("%.1f%% of the rate, %.1f%% answered 429", 100 * share, 100 * refused)
end

describe("limiters against HAProxy's http_req_rate(1s)", function()
  local SECONDS = 3
  local function against_haproxy(limiter)
    local h = haproxy.start { rate = RATE, window = "1s", retry_after = 1 }
    local ok, share, refused, failed = pcall(load, h:url("/api"), SECONDS, limiter, function() return h:counts() end)
    h:stop()
    assert(ok, share)
    assert.same({}, failed)
    return share, refused
  end

  it("rw.adaptive{} gets most of the rate: no slow-start overshoot left above it, few 429s", function()
    local share, refused = against_haproxy(rw.adaptive {})
    assert(share >= 0.8 and refused < 0.03, "adaptive: " .. shown(share, refused))
  end)

  it("a client with no limiter of its caller's keeps most of the rate with few 429s (its own wakes at the first)",
    function()
      local share, refused = against_haproxy("client")
      assert(share >= 0.45 and refused < 0.07, "client: " .. shown(share, refused))
    end)

  it("rw.bucket at the server's rate and burst waits for the window to drain instead of falling to its floor",
    function()
      local share, refused = against_haproxy(rw.bucket { capacity = RATE, rate = RATE })
      assert(share >= 0.8 and refused < 0.03, "bucket: " .. shown(share, refused))
    end)
end)

describe("no limiter against nginx's limit_req (a 429 with no Retry-After)", function()
  local SECONDS = 3
  local n
  setup(function()
    n = nginx.start {
      http = "lua_shared_dict counts 1m;\n  limit_req_zone $binary_remote_addr zone=lr:1m rate=" .. RATE .. "r/s;",
      server = [[
    limit_req_status 429;
    location = /counts { content_by_lua_block {
      local d = ngx.shared.counts
      ngx.print((d:get("ok") or 0) .. " " .. (d:get("limited") or 0)) } }
    location = /lr0 { limit_req zone=lr; content_by_lua_block { ngx.print("ok") }
      log_by_lua_block {
      ngx.shared.counts:incr(ngx.status == 429 and "limited" or "ok", 1, 0) } }
    location = /lr5 { limit_req zone=lr burst=5 nodelay; content_by_lua_block { ngx.print("ok") }
      log_by_lua_block {
      ngx.shared.counts:incr(ngx.status == 429 and "limited" or "ok", 1, 0) } }
]],
    }
  end)
  teardown(function() if n then n:stop() end end)

  local function count()
    local http = require "socket.http"
    local accepted, refused = assert(http.request(n:url("/counts"))):match("(%d+) (%d+)")
    return tonumber(accepted), tonumber(refused)
  end

  it("burst 0: a good share of the rate, not a 429 storm", function()
    local share, refused, failed = load(n:url("/lr0"), SECONDS, nil, count)
    assert.same({}, failed)
    assert(share >= 0.35 and refused <= 0.72, "limit_req burst 0: " .. shown(share, refused))
  end)

  it("burst 5 nodelay: nearly all of the rate", function()
    require("socket").sleep(0.1) -- the last test's state drains
    local share, refused, failed = load(n:url("/lr5"), SECONDS, nil, count)
    assert.same({}, failed)
    assert(share >= 0.85 and refused <= 0.65, "limit_req burst 5 nodelay: " .. shown(share, refused))
  end)

  -- Retries alone, each on its own, keep the server refusing: a client's
  -- calls share one limit, learned from the first 429 on (the peers' share
  -- and 429s are in docs/limits.md).
  for _, case in ipairs { { "/lr0", "burst 0" }, { "/lr5", "burst 5 nodelay" } } do
    local path, name = case[1], case[2]
    it("a client with no limiter of its caller's: most of the rate at " .. name .. " with few 429s", function()
      require("socket").sleep(0.1) -- the last test's state drains
      local share, refused, failed = load(n:url(path), SECONDS, "client", count)
      assert.same({}, failed)
      assert(share >= 0.6 and refused <= 0.1, "client, limit_req " .. name .. ": " .. shown(share, refused))
    end)
  end
end)
