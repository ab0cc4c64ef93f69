-- Retry budgets, as in Finagle, Envoy and gRPC's retry throttling: over a
-- sliding window, retries may not exceed a share of the requests, plus a
-- small floor so that a quiet client can still retry. When a server is
-- down, every request fails, and retries without a cap multiply the load
-- on it exactly when it can least take it; a budget caps that extra load.
--
-- A retry is allowed when, over the last `window` seconds,
--   retries + 1 <= ratio * requests + min_per_second * window
-- (Finagle's rule: each request deposits `ratio` of a retry, each retry
-- withdraws one, and the floor is a reserve that refills with time).
--
-- The window is a ring of time slots holding counts, with running sums:
-- each call costs O(1) (plus the slots that expired since the last call,
-- at most the ring's size), whatever the traffic.
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local options = require "ratewise.options"

local now = core.now
local format = string.format
local floor, ceil, max, min, huge = math.floor, math.ceil, math.max, math.min, math.huge
local type, pairs, error, setmetatable = type, pairs, error, setmetatable

local retry_budget = {}

local Budget = {}
Budget.__index = Budget
Budget.__name = "ratewise.RetryBudget"

-- Slots per window: 1 s slots for windows of 10 to 60 s, finer ones for a
-- shorter window, coarser ones beyond a minute (which keeps the ring small).
local MIN_SLOTS, MAX_SLOTS = 10, 60
-- Float sums such as 3 * 0.1 come out a hair off; a retry the arithmetic
-- allows exactly must not be refused for that.
local EPSILON = 1e-9

local function check_number(name, v, ok, expected)
  if type(v) ~= "number" or v ~= v or v == huge or not ok(v) then
    errors.bad_option("retry_budget", name, expected, v, 4)
  end
end

local function check_options(opts)
  if type(opts) ~= "table" then
    error(format("retry_budget: expected a table of options (got %s)", type(opts)), 3)
  end
  for k, v in pairs(opts) do
    if k == "ratio" then
      check_number(k, v, function(x) return x >= 0 end, "a non-negative number")
    elseif k == "min_per_second" then
      check_number(k, v, function(x) return x >= 0 end, "a non-negative number")
    elseif k == "window" then
      check_number(k, v, function(x) return x > 0 end, "a positive number of seconds")
    else
      options.unknown("retry_budget", k, { "ratio", "min_per_second", "window" }, 3)
    end
  end
  if opts.ratio == 0 and opts.min_per_second == 0 then
    error("retry_budget: options 'ratio' and 'min_per_second' are both 0, so no retry could ever be "
      .. "allowed (to turn retries off, give fetch max_retries = 0)", 3)
  end
end

--- b = retry_budget.new{ratio = 0.1, min_per_second = 10, window = 10}
function retry_budget.new(opts)
  check_options(opts)
  local window = opts.window or 10
  local slots = min(MAX_SLOTS, max(MIN_SLOTS, ceil(window)))
  local slot_width = window / slots
  local self = setmetatable({
    ratio = opts.ratio or 0.1,
    min_per_second = opts.min_per_second or 10,
    window = window,
    slots = slots,
    slot_width = slot_width,
    ring_requests = {}, ring_retries = {},
    window_requests = 0, window_retries = 0,
    slot = floor(now() / slot_width), -- the number of the slot being filled
    requests = 0, retries = 0, refused = 0, -- totals
  }, Budget)
  for i = 0, slots - 1 do
    self.ring_requests[i], self.ring_retries[i] = 0, 0
  end
  return self
end

-- Empties the slots that have slid out of the window since the last call.
local function advance(self)
  local slot = floor(now() / self.slot_width)
  local last = self.slot
  if slot <= last then return end
  local slots = self.slots
  local ring_requests, ring_retries = self.ring_requests, self.ring_retries
  if slot - last >= slots then
    for i = 0, slots - 1 do
      ring_requests[i], ring_retries[i] = 0, 0
    end
    self.window_requests, self.window_retries = 0, 0
  else
    for s = last + 1, slot do
      local i = s % slots
      self.window_requests = self.window_requests - ring_requests[i]
      self.window_retries = self.window_retries - ring_retries[i]
      ring_requests[i], ring_retries[i] = 0, 0
    end
  end
  self.slot = slot
end

-- Retries the window still allows, as a (fractional) number.
local function headroom(self)
  return self.ratio * self.window_requests + self.min_per_second * self.window - self.window_retries
end

--- b:request(): counts one request (fetch calls it once per call).
function Budget:request()
  advance(self)
  local i = self.slot % self.slots
  self.ring_requests[i] = self.ring_requests[i] + 1
  self.window_requests = self.window_requests + 1
  self.requests = self.requests + 1
end

--- ok = b:allow_retry(): true, and the retry is counted; or false, and the
-- refusal is counted.
function Budget:allow_retry()
  advance(self)
  if headroom(self) + EPSILON < 1 then
    self.refused = self.refused + 1
    return false
  end
  local i = self.slot % self.slots
  self.ring_retries[i] = self.ring_retries[i] + 1
  self.window_retries = self.window_retries + 1
  self.retries = self.retries + 1
  return true
end

--- {requests, retries, refused, available} = b:stats(): totals since the
-- budget was made, and the retries the window allows now.
function Budget:stats()
  advance(self)
  return {
    requests = self.requests, retries = self.retries, refused = self.refused,
    available = max(0, floor(headroom(self) + EPSILON)),
  }
end

Budget.__tostring = function(b)
  return format("ratewise.RetryBudget (ratio %g, min_per_second %g, window %g s)", b.ratio,
    b.min_per_second, b.window)
end

return retry_budget
