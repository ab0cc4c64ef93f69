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
-- A counting window (HAProxy's http_req_rate, a sliding log) counts the
-- requests it refuses: once over, it stays shut while the client keeps
-- sending, whatever the rate. So when SHUT_AFTER requests sent after the
-- drop are refused, none accepted between, while the server's hint from
-- the drop has not passed, the door is shut (a token bucket lets the next
-- request through: a 429 there is jitter). The controller then asks its
-- limiter to send nothing until the window has drained (the hint and a
-- fifth of it, as hinted retries spread theirs, at most a second more),
-- once per episode; and a limiter that learns its rate (relearn) takes
-- what the server accepted over the hint's span as the limit, which slow
-- start or a cut of beta from far above it would miss.
--
-- While nobody waits for the limiter, the rate never grows past DEMAND
-- times the rate at which requests were actually sent (measured over
-- windows of MEASURE_WINDOW seconds, each weighing SMOOTHING, as AWS
-- does), except back up to w_max: a limiter left idle must not come back
-- with a rate no server has seen it use. With callers waiting, the demand
-- is plain, and the measure (which lags) is not asked.
local core = require "ratewise.core"

local now = core.now
local floor, huge, max, min = math.floor, math.huge, math.max, math.min
local setmetatable, type = setmetatable, type

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
-- The hold after the door is shut, times the server's hint.
local HOLD = 1.2
-- Refusals of requests sent since the drop, none accepted between, that
-- say the door is shut.
local SHUT_AFTER = 3
-- Successes are counted in slots of SLOT seconds, SLOTS of them (the
-- longest span over which the accepted rate is read).
local SLOT, SLOTS = 0.1, 100

cubic.BETA, cubic.SCALE, cubic.START, cubic.MIN_ROUND_TRIP = BETA, SCALE, START, MIN_ROUND_TRIP
cubic.DEMAND, cubic.MEASURE_WINDOW, cubic.SMOOTHING = DEMAND, MEASURE_WINDOW, SMOOTHING
cubic.HOLD, cubic.SHUT_AFTER = HOLD, SHUT_AFTER

local Controller = {}
Controller.__index = Controller

--- c = cubic.new{rate = r, ceiling = c, floor = f, beta = b, near = n, slow_start = bool, demand = bool,
--   relearn = bool [, sending_since = t] [, max_hold = seconds]}
-- rate: where it starts; ceiling, floor: the bounds it stays in; beta: the
-- drop; near: the drop for a throttle below w_max (default: beta);
-- slow_start: grow from rate on successes until the first throttle (else
-- stay at rate until one); demand: cap growth by the measured send
-- rate (a limiter that sees every send, see sent()); relearn: when the
-- door is shut, take the rate the server accepted as the limit;
-- sending_since: when the first request could go (a limiter that wakes
-- holding: adaptive.lua); max_hold: the longest a shut door is held.
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
    relearn = opts.relearn or false,
    sending_since = opts.sending_since or -huge, -- when it could first send (a woken limiter's: adaptive.lua)
    max_hold = opts.max_hold or huge,
    episode_hint = false, -- the hint of the throttle that dropped the rate
    held_until = -huge,   -- the end of the hold of this episode (none yet)
    passed = false,       -- a request sent since the last drop succeeded
    refused = 0,          -- requests sent since the last drop refused (before one passed)
    slots = false,        -- successes per slot (relearn), by slot number mod SLOTS
    slot_at = false,      -- the slot number each entry of slots counts
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
  -- (a shut door's curve starts when its hold ends: until then, its start)
  local x = max((t or now()) - self.dropped_at, 0) - self.k
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
  if sent_at >= self.dropped_at then self.passed = true end
  if self.relearn then
    local slot = floor(t / SLOT)
    local slots, slot_at = self.slots, self.slot_at
    if not slots then slots, slot_at = {}, {}; self.slots, self.slot_at = slots, slot_at end
    local i = slot % SLOTS + 1
    if slot_at[i] ~= slot then slot_at[i], slots[i] = slot, 0 end
    slots[i] = slots[i] + 1
  end
  local rtt = t - sent_at
  if rtt >= 0 then
    self.srtt = self.srtt and self.srtt + RTT_GAIN * (rtt - self.srtt) or rtt
  end
  if not self.slow then return end
  local rate = self.rate + 1 / max(self.srtt or MIN_ROUND_TRIP, MIN_ROUND_TRIP)
  if self.demand and not busy then rate = min(rate, demand_cap(self)) end
  self.rate = bounded(self, rate)
end

-- What the server accepted over the last `span` seconds (at most the
-- slots' reach), from the successes counted: the rate (nil when none
-- were), and when the oldest of them was accepted.
local function accepted(c, t, span)
  local slots, slot_at = c.slots, c.slot_at
  if not slots then return nil end
  local n = min(SLOTS, max(1, floor(span / SLOT + 0.5)))
  local last = floor(t / SLOT)
  local count, oldest = 0, nil
  for slot = last - n + 1, last do
    local i = slot % SLOTS + 1
    if slot_at[i] == slot and slots[i] > 0 then
      count = count + slots[i]
      oldest = oldest or slot * SLOT
    end
  end
  if count == 0 then return nil end
  return count / (n * SLOT), oldest
end

-- The door is shut (see the top): hold, and with relearn take what the
-- server accepted over the hint's span as the limit, just below it. The
-- window has drained once what it accepted has left it: a hint (and a
-- fifth) after the oldest of those, which after slow start's climb is
-- well before a hint from now.
local function shut(c, t, hint)
  -- (a fifth more, but no more than a second: a long hint is a quota's
  -- reset, which the server keeps to the second)
  local drained = min(hint * HOLD, hint + 1, c.max_hold)
  local hold = drained
  if c.relearn then
    -- (over the span it has been sending for, if shorter: a limiter woken
    -- within the hint sent nothing before)
    local limit, oldest = accepted(c, t, min(hint, max(t - c.sending_since, SLOT)))
    if limit and limit < c:current(t) then
      hold = oldest + drained - t
      limit = bounded(c, limit)
      c.w_max, c.rate = limit, bounded(c, limit * c.near)
      c.k = ((1 - c.rate / limit) / SCALE) ^ (1 / 3)
      c.dropped_at = t + hold
    end
  end
  c.held_until = t + hold
  return false, hold
end

--- dropped, hold = c:throttled(t, sent_at [, hint]): the server throttled a
-- request sent at sent_at, and asked to come back in `hint` seconds (nil:
-- it did not say). Answers whether the rate dropped (false: that request
-- left before the last drop, which already answered it, or the door is
-- shut), and when the door is shut, the seconds to send nothing.
function Controller:throttled(t, sent_at, hint)
  if sent_at < self.dropped_at or t < self.held_until then return false end
  local episode_hint = self.episode_hint
  if episode_hint and not self.passed and self.held_until < self.dropped_at
    and t < self.dropped_at + episode_hint then
    self.refused = self.refused + 1
    if self.refused >= SHUT_AFTER then return shut(self, t, episode_hint) end
    return false
  end
  self.episode_hint = type(hint) == "number" and hint > 0 and hint or false
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
  self.passed, self.refused = false, 0
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
