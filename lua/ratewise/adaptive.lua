-- rw.adaptive{...}: a limiter that learns the server's rate from its
-- answers instead of being told it. A token bucket (bucket.lua) whose rate
-- a CUBIC controller (cubic.lua) moves: down after a throttle, up while
-- requests succeed. fetch tells it of every response through observe.
local bucket = require "ratewise.bucket"
local core = require "ratewise.core"
local cubic = require "ratewise.cubic"
local errors = require "ratewise.errors"
local options = require "ratewise.options"
local retry = require "ratewise.retry"

local now = core.now
local format, huge, floor, min = string.format, math.huge, math.floor, math.min
local MIN_ROUND_TRIP = cubic.MIN_ROUND_TRIP
local type, tostring, pairs, ipairs, error, setmetatable = type, tostring, pairs, ipairs, error, setmetatable

local adaptive = {}

-- The least rate it falls to (requests a second), unless min_rate says
-- otherwise: AWS's 0.5.
local MIN_RATE = 0.5
-- The drop for a throttle below the rate that drew the last one, unless
-- near says otherwise: the limit is known by then, and such a throttle is
-- jitter bringing two requests too close (cubic.lua). Against a server
-- bucket of one token it keeps more of the rate than taking the rate as the
-- new w_max or dropping every throttle to 0.7 (bench/HISTORY.md).
local NEAR = 0.95
-- The longest a dormant limiter, once woken, sends nothing for: it learns
-- a pace for every call of its client, and a longer wait is a quota's
-- reset (one path's, one tenant's), which each call that meets it
-- honours on its own.
local MAX_DORMANT_HOLD = 2
-- A stated limit above this is no limit a client could reach: a broken or
-- hostile header, left alone (a bucket refuses rates far above it).
local MAX_STATED_RATE = 1e9

local Adaptive = {}
Adaptive.__index = Adaptive
Adaptive.__name = "ratewise.Adaptive"

local known_options = { rate = true, max_rate = true, min_rate = true, burst = true, beta = true, near = true,
  dormant = true }

local function positive(opts, name)
  local v = opts[name]
  if v ~= nil and (type(v) ~= "number" or v ~= v or v <= 0 or v == huge) then
    errors.bad_option("adaptive", name, "a positive number", v, 3)
  end
  return v
end

-- The bucket follows the controller.
local function follow(self, t)
  local rate = self.controller:current(t, self.bucket:tokens() < 0)
  if rate ~= self.bucket:rate() then self.bucket:set_rate(rate) end
end

-- The pace of the bucket's queue (bucket.queue). In slow start the rate
-- doubles about every round trip, while a waiter's wait was reckoned at
-- the rate it found: sixteen waiters at 10 a second would sleep for 1.6 s
-- and send at 10 a second all that time. So in slow start a waiter looks
-- again after two tokens' time; afterwards the rate moves slowly and a
-- waiter sleeps its whole wait (a drop only makes its claim come early).
local Pace = {}
Pace.__index = Pace

function Pace:nap(wait)
  local controller = self.limiter.controller
  if not controller.slow then return wait end
  local nap = 2 / controller.rate
  return nap < wait and nap or wait
end

function Pace:follow()
  follow(self.limiter, now())
end

-- Its bucket and controller as they start: at the rate given, or in slow
-- start from cubic.START.
local function start_learning(self, sending_since)
  local s = self.settings
  self.bucket = bucket.new { capacity = s.burst, rate = s.start, slow_down = false }
  self.controller = cubic.new { rate = s.start, ceiling = s.max_rate, floor = s.min_rate, beta = s.beta,
    near = s.near or NEAR, slow_start = true, demand = true, relearn = true, sending_since = sending_since,
    max_hold = self.dormant_made and MAX_DORMANT_HOLD or nil }
end

--- limiter = rw.adaptive{[rate = r] [, max_rate = m] [, min_rate = f] [, burst = b] [, beta = x] [, near = y]
--   [, dormant = true]}
-- dormant: let every request through until the server first throttles one,
-- and only then start learning (AWS's adaptive mode, whose limiter waits
-- for the first throttle): what a client with no limiter of its caller's
-- has, so that a server that never throttles it costs it no wait.
function adaptive.new(opts)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then
    error(format("adaptive: options must be a table (got %s)", type(opts)), 2)
  end
  for k in pairs(opts) do
    if not known_options[k] then
      options.unknown("adaptive", k, known_options, 2)
    end
  end
  local max_rate, min_rate = positive(opts, "max_rate"), positive(opts, "min_rate") or MIN_RATE
  local burst = positive(opts, "burst") or 1
  local start = positive(opts, "rate") or max_rate or cubic.START
  for _, name in ipairs { "beta", "near" } do
    local v = opts[name]
    if v ~= nil and (type(v) ~= "number" or not (v > 0 and v < 1)) then
      errors.bad_option("adaptive", name, "a number between 0 and 1", v, 2)
    end
  end
  if max_rate and start > max_rate then
    error(format("adaptive: option 'rate' (%s) is more than max_rate (%s)", tostring(start), tostring(max_rate)), 2)
  end
  if max_rate and min_rate > max_rate then
    error(format("adaptive: option 'min_rate' (%s) is more than max_rate (%s)", tostring(min_rate),
      tostring(max_rate)), 2)
  end
  if burst < 1 then
    error(format("adaptive: option 'burst' must be at least 1 (got %s)", tostring(burst)), 2)
  end
  if opts.dormant ~= nil and type(opts.dormant) ~= "boolean" then
    errors.bad_option("adaptive", "dormant", "a boolean", opts.dormant, 2)
  end
  if start < min_rate then start = min_rate end
  local limiter = setmetatable({
    settings = { burst = burst, start = start, max_rate = max_rate, min_rate = min_rate, beta = opts.beta,
      near = opts.near },
    dormant = opts.dormant == true,
    dormant_made = opts.dormant == true, -- (learns from throttles alone, and holds briefly)
    woken_until = -huge, -- the end of the episode that woke a dormant one
  }, Adaptive)
  start_learning(limiter)
  limiter.pace = setmetatable({ limiter = limiter }, Pace)
  return limiter
end

--- true | false, wait = l:acquire([n [, sleep [, max_wait]]]): as a
-- bucket's acquire, at the rate learned so far.
function Adaptive:acquire(n, sleep, max_wait)
  bucket.check_acquire(self.bucket, n, sleep, max_wait, 3)
  if self.dormant then return true end
  follow(self, now())
  local ok, wait = bucket.queue(self.bucket, n, sleep, max_wait, self.pace)
  if ok then self.controller:sent(now()) end
  return ok, wait
end

-- A dormant limiter's first throttle wakes it, into slow start: the rate
-- the requests went out at until then is no rate the server accepts, and
-- cutting from it would take an episode per cut. The server still counts
-- what was sent while it slept, so the throttles of requests sent before it
-- woke, or within a round trip of it, are of the episode that woke it. A
-- 429 that said when to come back gets nothing until then (held as a shut
-- door is: cubic.lua, and no longer than MAX_DORMANT_HOLD): slow start
-- into a window still shut would learn nothing but the refusals.
local function wake(self, res)
  local t = now()
  local hint = res.status == 429 and type(res.headers) == "table" and retry.hint(res.headers)
  local hold = type(hint) == "number" and hint > 0 and min(hint * cubic.HOLD, hint + 1, MAX_DORMANT_HOLD) or 0
  self.dormant, self.woken_until = false, t + (hold > MIN_ROUND_TRIP and hold or MIN_ROUND_TRIP)
  start_learning(self, t + hold)
  if hold > 0 then self.bucket:sync(0, hold) end
end

--- l:observe(res [, sent_at]): what fetch tells it of each response to a
-- request let through at sent_at. A throttle (res.throttled) drops the
-- rate; any other answer counts as accepted.
function Adaptive:observe(res, sent_at)
  local throttled = type(res) == "table" and res.throttled == true
  if self.dormant then
    if throttled then wake(self, res) end
    return
  end
  local t = now()
  if type(sent_at) ~= "number" then sent_at = t end
  if throttled then
    if sent_at < self.woken_until then return end
    bucket.throttle(self.bucket, self.controller, res, sent_at, t)
  else
    self.controller:succeeded(t, sent_at, self.bucket:tokens() < 0)
  end
  follow(self, t)
end

--- rate = l:rate(): the rate it lets requests through at now (infinity
-- while dormant).
function Adaptive:rate()
  if self.dormant then return huge end
  return self.controller:current(now())
end

-- What a limiter offers besides (for rw.limiters and provider policies):
-- the bucket's, at the rate learned so far; while dormant, no wait.
function Adaptive:wait_time(n)
  if self.dormant then
    self.bucket:wait_time(n) -- (checks n)
    return 0
  end
  follow(self, now())
  return self.bucket:wait_time(n)
end

function Adaptive:take(n)
  if self.dormant then
    self.bucket:take(n) -- (checks n; the bucket is made afresh when it wakes)
    return true, 0
  end
  follow(self, now())
  local ok, wait = self.bucket:take(n)
  if ok then self.controller:sent(now()) end
  return ok, wait
end

function Adaptive:refund(n) return self.bucket:refund(n) end
-- (limiters' settle and oversized named costs: the debt is the bucket's,
-- at the rate learned so far)
function Adaptive:debit(n)
  follow(self, now())
  return self.bucket:debit(n)
end
function Adaptive:capacity() return self.bucket:capacity() end
function Adaptive:tokens() return self.bucket:tokens() end
--- l:sync(remaining [, reset_in [, limit [, window]]]): what a provider
-- reads of the server's quota. remaining and reset_in go to the bucket (as
-- rw.bucket's sync); a limit of `limit` requests per `window` seconds is
-- the rate the server states, which the controller takes at once and never
-- climbs above (cubic.lua, stated). Without a window, it is the longest
-- reset_in seen, in the whole seconds servers count resets in: a quota's
-- reset counts down from its window.
function Adaptive:sync(remaining, reset_in, limit, window)
  -- (one made dormant learns from throttles alone: a provider's quota, a
  -- window of an hour, would set the pace of every call of its client)
  if self.dormant_made then return end
  self.bucket:sync(remaining, reset_in)
  if limit == nil then return end
  if type(limit) ~= "number" or limit ~= limit or limit < 1 or limit == huge then
    error(format("adaptive: sync: limit must be a number of requests, at least 1 (got %s)", tostring(limit)), 2)
  end
  if window ~= nil and (type(window) ~= "number" or window ~= window or window <= 0 or window == huge) then
    error(format("adaptive: sync: window must be a positive number of seconds (got %s)", tostring(window)), 2)
  end
  if window == nil then
    -- A new limit is another quota (GitHub's search has a minute's, its
    -- core an hour's), and a reset further off than the bucket believes
    -- any (its sync_horizon) is not a window.
    if limit ~= self.window_of then self.window_of, self.longest_reset = limit, nil end
    if type(reset_in) == "number" and reset_in > (self.longest_reset or 0)
      and reset_in <= self.bucket:sync_horizon() then
      self.longest_reset = reset_in
    end
    local longest = self.longest_reset
    if not longest then return end
    window = longest >= 1 and floor(longest) or longest
  end
  local stated = limit / window
  if stated > MAX_STATED_RATE then return end
  self.controller:stated(stated)
  follow(self, now())
end

Adaptive.__tostring = function(l)
  if l.dormant then return format("ratewise.Adaptive (dormant until a throttle, burst %g)", l.bucket:capacity()) end
  return format("ratewise.Adaptive (%.3g/s now, burst %g)", l.controller:current(now()), l.bucket:capacity())
end

return adaptive
