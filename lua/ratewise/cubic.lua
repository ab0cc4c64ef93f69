-- How a limiter's rate follows what the server answers: CUBIC (RFC 9438),
-- as the AWS SDKs' adaptive retry mode applies it to request rates, with
-- four changes that measurements asked for (docs/limits.md#rwadaptive):
--
--   * after a throttle the rate drops to BETA times what it was, then
--     grows back along rate(t) = w_max * (1 + SCALE * (t - K)^3), where
--     w_max is the rate that drew the throttle and K = cbrt((1 - BETA) /
--     SCALE): slowly near w_max, faster away from it. SCALE is relative to
--     w_max, so that a cycle takes as long at 5 requests a second as at 500
--     (AWS's 0.4 is absolute: the same as 0.002 at 200 a second);
--   * one drop per throttling episode: a throttle of a request sent before
--     the last drop says nothing new (TCP's one cut per window). AWS drops
--     again for each, and 16 requests in flight took the rate to 0.7^16;
--   * a throttle below w_max (the rate that drew the last one) is the
--     network's jitter bringing two requests too close, or a limit that
--     moved down: the rate drops by `near` only, and w_max halfway to it.
--     Dropping by BETA and taking the rate as the new w_max each time
--     walked the rate down well below the limit and kept it there;
--   * with no rate to start from, the rate starts at START and doubles
--     about once per round trip while requests succeed (never faster than
--     once per MIN_ROUND_TRIP): TCP's slow start, where AWS starts
--     unlimited and, at the first throttle, near nothing.
--
-- While nobody waits for the limiter, the rate never grows past DEMAND
-- times the rate at which requests were actually sent (measured over
-- windows of MEASURE_WINDOW seconds, each weighing SMOOTHING, as AWS
-- does), except back up to w_max: a limiter left idle must not come back
-- with a rate no server has seen it use. With callers waiting, the demand
-- is plain, and the measure (which lags) is not asked.
local core = require "ratewise.core"

local now = core.now
local huge, max, min = math.huge, math.max, math.min
local setmetatable = setmetatable

local cubic = {}

local BETA = 0.7
local SCALE = 0.002
local START = 10
local MIN_ROUND_TRIP = 0.1
local DEMAND = 2
local MEASURE_WINDOW = 0.1
local SMOOTHING = 0.8
-- How much a round trip measured now weighs in the smoothed one (TCP's 1/8).
local RTT_GAIN = 0.125

cubic.BETA, cubic.SCALE, cubic.START, cubic.MIN_ROUND_TRIP = BETA, SCALE, START, MIN_ROUND_TRIP
cubic.DEMAND, cubic.MEASURE_WINDOW, cubic.SMOOTHING = DEMAND, MEASURE_WINDOW, SMOOTHING

local Controller = {}
Controller.__index = Controller

--- c = cubic.new{rate = r, ceiling = c, floor = f, beta = b, near = n, slow_start = bool, demand = bool}
-- rate: where it starts; ceiling, floor: the bounds it stays in; beta: the
-- drop; near: the drop for a throttle below w_max (default: beta);
-- slow_start: grow from rate on successes until the first throttle (else
-- stay at rate until one); demand: cap growth by the measured send
-- rate (a limiter that sees every send, see sent()).
function cubic.new(opts)
  local beta = opts.beta or BETA
  return setmetatable({
    rate = opts.rate,
    ceiling = opts.ceiling or huge,
    given_ceiling = opts.ceiling or huge,
    stated_rate = false, -- the rate the server says it allows (stated())
    floor = opts.floor or 0,
    beta = beta,
    near = opts.near or beta,
    k = 0, -- K of the last drop
    slow = opts.slow_start or false,
    demand = opts.demand or false,
    start = opts.rate,
    w_max = false,      -- the rate that drew the last throttle (false: none yet)
    dropped_at = -huge, -- when the rate last dropped
    srtt = false,       -- smoothed round trip of successful requests
    measured = 0,       -- smoothed send rate
    window_start = now(),
    window_sends = 0,
  }, Controller)
end

-- The most the rate may be now, by demand: DEMAND times the measured send
-- rate, and never less than where the controller started or w_max.
local function demand_cap(c)
  local cap = DEMAND * c.measured
  local known = c.w_max or c.start
  return cap > known and cap or known
end

local function bounded(c, rate)
  if rate > c.ceiling then rate = c.ceiling end
  if rate < c.floor then rate = c.floor end
  return rate
end

--- rate = c:current([t [, busy]]): the rate at time t (now by default);
-- busy: callers are waiting for the limiter.
function Controller:current(t, busy)
  if self.slow or not self.w_max then return self.rate end
  local x = (t or now()) - self.dropped_at - self.k
  local rate = self.w_max * (1 + SCALE * x * x * x)
  if self.demand and not busy and rate > self.w_max then rate = min(rate, demand_cap(self)) end
  rate = bounded(self, rate)
  self.rate = rate
  return rate
end

--- c:sent(t): a request was let through at t (for the measured send rate).
function Controller:sent(t)
  local elapsed = t - self.window_start
  if elapsed >= MEASURE_WINDOW then
    self.measured = SMOOTHING * (self.window_sends / elapsed) + (1 - SMOOTHING) * self.measured
    self.window_start, self.window_sends = t, 0
  end
  self.window_sends = self.window_sends + 1
end

--- c:succeeded(t, sent_at [, busy]): a request sent at sent_at succeeded
-- at t. In slow start the rate grows by 1 / round trip per success, which
-- doubles it about once a round trip.
function Controller:succeeded(t, sent_at, busy)
  local rtt = t - sent_at
  if rtt >= 0 then
    self.srtt = self.srtt and self.srtt + RTT_GAIN * (rtt - self.srtt) or rtt
  end
  if not self.slow then return end
  local rate = self.rate + 1 / max(self.srtt or MIN_ROUND_TRIP, MIN_ROUND_TRIP)
  if self.demand and not busy then rate = min(rate, demand_cap(self)) end
  self.rate = bounded(self, rate)
end

--- dropped = c:throttled(t, sent_at): the server throttled a request sent
-- at sent_at. Answers whether the rate dropped (false: that request left
-- before the last drop, which already answered it).
function Controller:throttled(t, sent_at)
  if sent_at < self.dropped_at then return false end
  local rate = self:current(t)
  local w_max = self.w_max
  local stated = self.stated_rate
  if w_max and (rate < w_max or (stated and rate <= stated)) then
    -- Below the rate that drew the last throttle: the network's jitter
    -- brought two requests too close, or the limit moved down. A small
    -- drop, and w_max only halfway down: jitter leaves the known limit
    -- nearly where it was, a limit that moved is found in a few episodes.
    -- At the rate the server states, a throttle is the same jitter.
    w_max = (w_max + rate) / 2
    rate = bounded(self, rate * self.near)
    self.k = ((1 - rate / w_max) / SCALE) ^ (1 / 3)
  else
    w_max = rate
    self.k = ((1 - self.beta) / SCALE) ^ (1 / 3)
    rate = bounded(self, rate * self.beta)
  end
  self.w_max, self.rate = w_max, rate
  self.dropped_at = t
  self.slow = false
  return true
end

--- c:stated(rate): the server states the rate it allows (its limit over
-- its window). It is the most the rate climbs to (under the ceiling the
-- controller was given), it is where the rate goes at once from slow
-- start, and a throttle at it is jitter (a drop by `near`). Learning it
-- from throttles costs a 429 at every probe above it.
function Controller:stated(rate)
  local ceiling = min(rate, self.given_ceiling)
  if ceiling < self.floor then ceiling = self.floor end
  if ceiling == self.stated_rate and not self.slow then return end
  self.ceiling, self.stated_rate = ceiling, ceiling
  self.slow = false
  self.w_max = ceiling
  if self.rate > ceiling or self.dropped_at == -huge then self.rate = ceiling end
end

--- The rate is back where it was before any throttle (a limiter may then
-- forget the controller).
function Controller:recovered()
  return not self.slow and self.rate >= self.ceiling
end

return cubic
