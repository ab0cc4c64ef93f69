-- Several limiters acquired as one, for APIs that count more than one thing
-- at once (requests per minute and tokens per minute, say):
--
--   local both = limiters.new{rpm, cost = tpm}
--   both:acquire(n)   -- 1 token of rpm and n of tpm, together
--
-- Nothing is held while waiting. Taking rpm's token first and then waiting
-- for tpm would keep that token from everyone else for the whole wait (and
-- two such callers, each holding what the other needs, would starve each
-- other). Instead a caller asks every member how long until it could serve,
-- sleeps the longest of those, and takes from all of them only when all can
-- serve at once; with no yield in between, the takes cannot fail.
--
-- The price: waiters on a composite are not queued first come, first
-- served (a bucket's own acquire is). A caller asking for few tokens may get
-- in ahead of one asking for many.
local runtime = require "ratewise.runtime"
local errors = require "ratewise.errors"
local options = require "ratewise.options"
local bad_seconds = require("ratewise.scheduler").bad_seconds

local format = string.format
local huge = math.huge
local now = require("ratewise.core").now
local type, tostring, pairs, pcall, error, setmetatable, getmetatable = type, tostring, pairs, pcall, error,
  setmetatable, getmetatable

local limiters = {}

local Limiters = {}
Limiters.__index = Limiters
Limiters.__name = "ratewise.Limiters"

-- Waits shorter than this after a take that failed are rounded up, so that
-- a loop can never spin on a wait of zero.
local MIN_RETRY_WAIT = 1e-4

local function is_limiter(v)
  local t = type(v)
  if t ~= "table" and t ~= "userdata" then return false end
  local ok, yes = pcall(function()
    return type(v.wait_time) == "function" and type(v.take) == "function" and type(v.refund) == "function"
  end)
  return ok and yes
end

local function capacity_of(member)
  local ok, fn = pcall(function() return member.capacity end)
  if ok and type(fn) == "function" then return fn(member) end
  return huge
end

local function not_a_limiter(what, v, level)
  error(format("limiters: %s must be a limiter with wait_time, take and refund, such as rw.bucket "
    .. "(got %s)", what, type(v) == "table" and "a table without them"
      or type(v) == "string" and "a string" -- a Redis URL, say, with its password
      or errors.shown(v)), level)
end

-- The members of the `cost` option: one limiter or an array of them.
local function cost_members(cost)
  if is_limiter(cost) then return { cost } end
  if type(cost) ~= "table" or getmetatable(cost) ~= nil or #cost == 0 then
    not_a_limiter("option 'cost'", cost, 4)
  end
  local list = {}
  for k in pairs(cost) do
    if type(k) ~= "number" or k % 1 ~= 0 or k < 1 or k > #cost then
      error(format("limiters: option 'cost' must be a limiter or an array of limiters (found key %s)",
        tostring(k)), 3)
    end
  end
  for i = 1, #cost do
    if not is_limiter(cost[i]) then not_a_limiter("cost member #" .. i, cost[i], 4) end
    list[i] = cost[i]
  end
  return list
end

--- l = limiters.new{a, b, ..., cost = c | {c1, c2, ...}}
function limiters.new(spec)
  if type(spec) ~= "table" then
    error(format("limiters: expected a table of limiters (got %s)", type(spec)), 2)
  end
  local count = #spec
  for k in pairs(spec) do
    if k ~= "cost" and (type(k) ~= "number" or k % 1 ~= 0 or k < 1 or k > count) then
      if type(k) == "string" then options.unknown("limiters", k, { "cost" }, 2) end
      error(format("limiters: key %s is not part of the array of limiters (1 to %d)", tostring(k), count), 2)
    end
  end
  local each, by_cost, seen = {}, {}, {}
  for i = 1, count do
    local member = spec[i]
    if not is_limiter(member) then not_a_limiter("member #" .. i, member, 3) end
    if capacity_of(member) < 1 then
      error(format("limiters: member #%d holds fewer than the 1 token each acquire takes of it", i), 2)
    end
    seen[member] = "member #" .. i
    each[i] = member
  end
  if spec.cost ~= nil then by_cost = cost_members(spec.cost) end
  for i = 1, #by_cost do
    local member = by_cost[i]
    if seen[member] then
      error(format("limiters: the same limiter is given twice (%s and cost member #%d)", seen[member], i), 2)
    end
    seen[member] = "cost member #" .. i
  end
  if #each + #by_cost == 0 then
    error("limiters: expected at least one limiter", 2)
  end
  return setmetatable({ each = each, by_cost = by_cost }, Limiters)
end

local function check_count(self, method, n)
  if n == nil then return 1 end
  if type(n) ~= "number" or n ~= n or n <= 0 or n == huge then
    error(format("limiters: %s: token count must be a positive number (got %s)", method, errors.shown(n)), 3)
  end
  local by_cost = self.by_cost
  for i = 1, #by_cost do
    local capacity = capacity_of(by_cost[i])
    if n > capacity then
      error(format("limiters: %s: %g tokens asked of cost member #%d, whose capacity is %g: "
        .. "it could never be served", method, n, i, capacity), 3)
    end
  end
  return n
end

-- A member's wait must be a finite number: NaN compares false with
-- everything (acquire would retry at once, over and over), and an infinite
-- wait never ends. Either is a broken limiter, named in the error.
local function wait_error(w, which, i)
  return format("limiters: %s #%d answered a wait of %s: a limiter's wait must be a finite number of seconds",
    which, i, bad_seconds(w) or tostring(w))
end

-- A member that cannot answer (a shared bucket whose Redis is down)
-- answers nil and an error table; the composite answers the same.
local function unavailable(w, why)
  return w == nil and type(why) == "table"
end

local function wait_time(self, n)
  local wait = 0
  local each, by_cost = self.each, self.by_cost
  for i = 1, #each do
    local w, why = each[i]:wait_time(1)
    if unavailable(w, why) then return nil, why end
    if bad_seconds(w) then error(wait_error(w, "member", i), 0) end
    if w > wait then wait = w end
  end
  for i = 1, #by_cost do
    local w, why = by_cost[i]:wait_time(n)
    if unavailable(w, why) then return nil, why end
    if bad_seconds(w) then error(wait_error(w, "cost member", i), 0) end
    if w > wait then wait = w end
  end
  return wait
end

-- Gives back what a take that failed part-way had taken.
local function give_back(self, n, each_taken, cost_taken)
  for i = 1, each_taken do self.each[i]:refund(1) end
  for i = 1, cost_taken do self.by_cost[i]:refund(n) end
end

-- The member whose take failed says how long until it could serve, with
-- what was taken before it still held: a limiter that shows up twice
-- through nested composites is then waited for long enough.
-- Answers nil and the error when that wait is not a finite number.
local function failed_wait(member, k, seconds, which, i)
  if type(seconds) ~= "number" then seconds = member:wait_time(k) end
  if bad_seconds(seconds) then return nil, wait_error(seconds, which, i) end
  if seconds < MIN_RETRY_WAIT then seconds = MIN_RETRY_WAIT end
  return seconds
end

local function take(self, n)
  local wait, why = wait_time(self, n)
  if wait == nil then return nil, why end
  if wait > 0 then return false, wait end
  local each, by_cost = self.each, self.by_cost
  for i = 1, #each do
    local ok, seconds = each[i]:take(1)
    if unavailable(ok, seconds) then
      give_back(self, n, i - 1, 0)
      return nil, seconds
    end
    if not ok then
      local err
      seconds, err = failed_wait(each[i], 1, seconds, "member", i)
      give_back(self, n, i - 1, 0)
      if err then error(err, 0) end
      return false, seconds
    end
  end
  for i = 1, #by_cost do
    local ok, seconds = by_cost[i]:take(n)
    if unavailable(ok, seconds) then
      give_back(self, n, #each, i - 1)
      return nil, seconds
    end
    if not ok then
      local err
      seconds, err = failed_wait(by_cost[i], n, seconds, "cost member", i)
      give_back(self, n, #each, i - 1)
      if err then error(err, 0) end
      return false, seconds
    end
  end
  return true
end

--- seconds = l:wait_time([n]): until every member could serve (0: now),
-- taking nothing.
function Limiters:wait_time(n)
  return wait_time(self, check_count(self, "wait_time", n))
end

--- true | false, seconds = l:take([n]): takes from every member, or from
-- none of them.
function Limiters:take(n)
  return take(self, check_count(self, "take", n))
end

--- l:refund([n]): gives back what a take of n took.
function Limiters:refund(n)
  n = check_count(self, "refund", n)
  give_back(self, n, #self.each, #self.by_cost)
end

--- capacity = l:capacity(): the most tokens one acquire may ask for.
function Limiters:capacity()
  local capacity = huge
  local by_cost = self.by_cost
  for i = 1, #by_cost do
    local c = capacity_of(by_cost[i])
    if c < capacity then capacity = c end
  end
  return capacity
end

--- true | false, wait = l:acquire([n [, sleep [, max_wait]]]): waits until
-- every member can serve, holding nothing meanwhile, then takes from all of
-- them. With max_wait, answers false (taking nothing) as soon as it is clear
-- that the wait would run past max_wait seconds.
function Limiters:acquire(n, sleep, max_wait)
  n = check_count(self, "acquire", n)
  if sleep ~= nil and type(sleep) ~= "function" then
    error(format("limiters: acquire: sleep must be a function (got %s)", type(sleep)), 2)
  end
  if max_wait ~= nil and (type(max_wait) ~= "number" or max_wait ~= max_wait or max_wait < 0) then
    error(format("limiters: acquire: max_wait must be a non-negative number of seconds (got %s)",
      errors.shown(max_wait)), 2)
  end
  local give_up_at = max_wait and now() + max_wait
  while true do
    local ok, wait = take(self, n)
    if ok then return true end
    if ok == nil then return nil, wait end -- a member could not answer
    if give_up_at and now() + wait > give_up_at then return false, wait end
    runtime.sleep(wait, sleep)
  end
end

--- l:sync(remaining [, reset_in [, limit [, window]]]): what a server says
-- of its request quota (a provider's observe hook) goes to the members that
-- count requests, the ones taking 1 per acquire; a cost member meters
-- something else (tokens).
function Limiters:sync(remaining, reset_in, limit, window)
  local each = self.each
  for i = 1, #each do
    if type(each[i].sync) == "function" then each[i]:sync(remaining, reset_in, limit, window) end
  end
end

--- l:observe(res [, sent_at]): what fetch tells of each response goes to
-- every member that learns from it (a throttle may be any of the limits).
function Limiters:observe(res, sent_at)
  local each, by_cost = self.each, self.by_cost
  for i = 1, #each do
    if type(each[i].observe) == "function" then each[i]:observe(res, sent_at) end
  end
  for i = 1, #by_cost do
    if type(by_cost[i].observe) == "function" then by_cost[i]:observe(res, sent_at) end
  end
end

Limiters.__tostring = function(l)
  return format("ratewise.Limiters (%d taking 1, %d taking the cost)", #l.each, #l.by_cost)
end

return limiters
