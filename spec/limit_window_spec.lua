-- Limiters against the rate limits users run in front of their APIs
-- (issue 40, section 5), started on loopback by the suite:
--
--   * HAProxy 2.6, a stick table tracking http_req_rate(1s) and a 429 with
--     Retry-After: 1 above 200 a second (spec/support/haproxy.lua). It
--     counts the requests it refuses: a client that keeps sending while
--     refused keeps its own window full. rw.adaptive{} and rw.bucket at
--     the server's rate and burst must get most of the rate with few 429s.
--
-- 16 tasks call rw.fetch in a loop for a few seconds; the server counts
-- what it accepted and refused. The bounds leave room for a loaded
-- machine (the figures are in docs/limits.md and bench/README.md).
local rw = require "ratewise"
local haproxy = require "spec.support.haproxy"

local RATE, TASKS = 200, 16

-- Runs TASKS tasks against url for seconds through limiter (nil: none);
-- count() answers what the server accepted and refused so far. Answers
-- the share of the rate accepted, the share of requests refused, and the
-- errors of the calls that failed.
local function load(url, seconds, limiter, count)
  local accepted0, refused0 = count()
  -- as a caller that keeps retrying does: a call ends only when it is
  -- answered (the tasks are cancelled once counted)
  local opts = { limiter = limiter, on_retry = false, max_retries = 1000, max_elapsed = 60 }
  local accepted, refused, failed = nil, nil, {}
  rw.run(function()
    local tasks = {}
    for i = 1, TASKS do
      tasks[i] = rw.spawn(function()
        while true do
          local res, err = rw.fetch(url, opts)
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

  it("rw.bucket at the server's rate and burst waits for the window to drain instead of falling to its floor",
    function()
      local share, refused = against_haproxy(rw.bucket { capacity = RATE, rate = RATE })
      assert(share >= 0.8 and refused < 0.03, "bucket: " .. shown(share, refused))
    end)
end)
