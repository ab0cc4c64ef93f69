-- The token bucket. Its arithmetic lives in the C core (ratewise.Bucket);
-- the methods that wait or learn are added here, so that the wait goes
-- through the runtime like every other wait.
local core = require "ratewise.core"
local cubic = require "ratewise.cubic"
local errors = require "ratewise.errors"
local retry = require "ratewise.retry"
local runtime = require "ratewise.runtime"

local methods = core.bucket_methods
local now = core.now
local type, setmetatable = type, setmetatable
local shown = errors.shown

-- After a throttle a bucket drops to SLOW_DOWN times its rate, and comes
-- back to it along CUBIC's curve (cubic.lua) in about 3 s; never below
-- FLOOR times its rate. A gentle drop: the rate is the caller's knowledge,
-- and a throttle at that rate is the network's jitter bringing two
-- requests closer than the server's bucket allows: against a server whose
-- bucket holds one token, the drop keeps most of its rate with far fewer
-- 429s than none (bench/HISTORY.md, docs/limits.md).
local SLOW_DOWN, FLOOR = 0.95, 0.5

-- bucket -> its controller, while it runs below its own rate.
local slowed = setmetatable({}, { __mode = "k" })

local set_rate = methods.set_rate

--- bucket:set_rate(rate): the rate from now on, and the one a slowed-down
-- bucket comes back to.
function methods:set_rate(rate)
  if type(rate) ~= "number" or rate ~= rate or rate <= 0 or rate == math.huge then
    error(string.format("bad argument #1 to 'set_rate' (rate must be a positive number, got %s)",
      shown(rate)), 2)
  end
  set_rate(self, rate)
  slowed[self] = nil
end

-- Checked in the caller's terms, so that an error names acquire and the
-- caller's line (level: the caller's frame).
local function check_acquire(self, n, host_sleep, max_wait, level)
  if n ~= nil and (type(n) ~= "number" or n ~= n or n <= 0 or n == math.huge) then
    error(string.format("bad argument #1 to 'acquire' (token count must be a positive number, got %s)",
      shown(n)), level)
  end
  if n ~= nil and n > self:capacity() then
    error(string.format("bad argument #1 to 'acquire' (%s tokens asked of a bucket whose capacity is %s: "
      .. "it could never be served)", tostring(n), tostring(self:capacity())), level)
  end
  if host_sleep ~= nil and type(host_sleep) ~= "function" then
    error(string.format("bad argument #2 to 'acquire' (sleep must be a function, got %s)", shown(host_sleep)),
      level)
  end
  if max_wait ~= nil and (type(max_wait) ~= "number" or max_wait ~= max_wait or max_wait < 0) then
    error(string.format("bad argument #3 to 'acquire' (max_wait must be a non-negative number of seconds, got %s)",
      shown(max_wait)), level)
  end
end

-- A waiter's pace (runtime.claim) when it may wait no longer than
-- max_wait: a sync while it waits (another caller's answer says the
-- server's quota is spent) may put its tokens past that, and it then
-- gives its place up instead of waiting out the server's reset past its
-- call's budget. It wraps the pace it was given, if any.
local Deadline = {}
Deadline.__index = Deadline

function Deadline:follow()
  self.armed = true -- (the first nap is the wait that queue found fits)
  local pace = self.pace
  if pace then pace:follow() end
end

function Deadline:nap(wait)
  if self.armed and now() + wait > self.give_up_at then
    self.gave_up = wait
    self.bucket:cancel(self.place)
    return false
  end
  local pace = self.pace
  if pace then return pace:nap(wait) end
  return wait
end

-- Waits in the bucket's queue for n tokens (see acquire). A pace, when
-- given, moves the bucket's rate while the waiter waits (runtime.claim).
local function queue(self, n, host_sleep, max_wait, pace)
  local give_up_at = max_wait and now() + max_wait
  local wait, place = self:reserve(n)
  if wait <= 0 then return true end
  if max_wait and wait > max_wait then
    self:cancel(place)
    return false, wait
  end
  if not max_wait then return runtime.claim(self, place, wait, host_sleep, n, pace) end
  local deadline = setmetatable({ pace = pace, bucket = self, place = place, give_up_at = give_up_at,
    armed = false, gave_up = false }, Deadline)
  runtime.claim(self, place, wait, host_sleep, n, deadline)
  if deadline.gave_up then return false, deadline.gave_up end
  return true
end

--- true | false, wait = bucket:acquire([n [, sleep [, max_wait]]])
-- Waits until n tokens are there, first come first served: a later caller
-- queues behind this one (see src/bucket.c). With max_wait, a wait longer
-- than that is not begun: it answers false and the seconds it would have
-- taken, holding nothing (fetch passes the time its call has left).
function methods:acquire(n, host_sleep, max_wait)
  check_acquire(self, n, host_sleep, max_wait, 3)
  return queue(self, n, host_sleep, max_wait)
end

-- What a throttle does to a bucket that follows controller (cubic.lua):
-- the controller's new rate, and when the server's door is shut (a
-- counting window), nothing sent until it drains: a sync of the bucket,
-- whose waiters wait it out.
local function throttle(self, controller, res, sent_at, t)
  local headers = type(res.headers) == "table" and res.headers or nil
  local hint = headers and retry.hint(headers)
  local _, hold = controller:throttled(t, type(sent_at) == "number" and sent_at or t, hint)
  set_rate(self, controller:current(t))
  if hold then self:sync(0, hold) end
end

--- bucket:observe(res [, sent_at]): what fetch tells the limiter of each
-- response. A throttle (res.throttled) of a request sent at sent_at slows
-- the bucket down, unless it was made with slow_down = false.
function methods:observe(res, sent_at)
  local controller = slowed[self]
  local throttled = type(res) == "table" and res.throttled == true
  if not controller and not throttled then return end
  local t = now()
  if not controller then
    if not self:slows_down() then return end
    local rate = self:rate()
    controller = cubic.new { rate = rate, ceiling = rate, floor = rate * FLOOR, beta = SLOW_DOWN }
    slowed[self] = controller
  end
  if throttled then
    throttle(self, controller, res, sent_at, t)
  else
    controller:succeeded(t, type(sent_at) == "number" and sent_at or t)
    set_rate(self, controller:current(t))
  end
  if controller:recovered() then slowed[self] = nil end
end

return {
  new = core.bucket,
  check_acquire = check_acquire,
  queue = queue,
  throttle = throttle,
}
