-- What a response's headers ask to wait (Retry-After, then x-ratelimit-reset
-- while the quota is spent), read against the server's clock; and
-- rw.backoff and rw.retry_delay, which check the caller's options. The
-- parsing and arithmetic are in the C core. What fetch does with a hint
-- (a policy's reading against Retry-After, a zero hint, the retry_after
-- modes, the budgets) is decided in fetch/decision.lua.
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local headers = require "ratewise.headers"
local options = require "ratewise.options"

local format, gmatch, match = string.format, string.gmatch, string.match
local huge, random, type = math.huge, math.random, type

local retry = {}

local jitters = { none = true, full = true, equal = true, decorrelated = true }

local function check_number(fn, name, v, min, allow_equal)
  if type(v) ~= "number" or v ~= v or v == huge or v < min or (v == min and not allow_equal) then
    errors.bad_option(fn, name, allow_equal and "a non-negative number" or "a positive number", v, 4)
  end
end

local function check_attempt(fn, attempt)
  if type(attempt) ~= "number" or attempt < 0 or attempt % 1 ~= 0 then
    error(format("%s: attempt must be a non-negative integer (got %s)", fn, errors.shown(attempt)), 3)
  end
end

-- Option names each function accepts; anything else is a typo and raises.
local backoff_options = { base = true, max_delay = true, jitter = true, random = true, previous = true }
local delay_options = { now = true }
for k in pairs(backoff_options) do delay_options[k] = true end

local function check_options(fn, opts, known)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(format("%s: options must be a table (got %s)", fn, type(opts)), 3)
  end
  for k in pairs(opts) do
    if not known[k] then options.unknown(fn, k, known, 3) end
  end
  return opts
end

--- u = retry.random(): a number in [0, 1) from the kernel's generator
-- (core.random): never math.random, which every process on Lua 5.1, 5.3
-- and LuaJIT starts from the same seed, so that processes that met the
-- same 429 would draw the same waits. math.random only if the kernel has
-- no randomness to give.
function retry.random()
  return core.random() or random()
end

local function draw(fn, rand)
  local u = rand()
  if type(u) ~= "number" or not (u >= 0 and u < 1) then
    error(format("%s: option 'random' must return a number in [0, 1) (got %s)", fn, errors.shown(u)), 4)
  end
  return u
end

local function backoff(fn, attempt, opts)
  local base, max_delay = opts.base or 1, opts.max_delay or 60
  local jitter = opts.jitter or "full"
  check_number(fn, "base", base, 0, false)
  check_number(fn, "max_delay", max_delay, 0, true)
  if not jitters[jitter] then
    errors.bad_option(fn, "jitter", "one of none, full, equal, decorrelated", jitter, 3)
  end
  local rand = opts.random or retry.random
  if type(rand) ~= "function" then
    error(format("%s: option 'random' must be a function (got %s)", fn, type(rand)), 3)
  end
  local previous = opts.previous
  if previous ~= nil then check_number(fn, "previous", previous, 0, true) end
  local u = jitter == "none" and 0 or draw(fn, rand)
  return core.backoff(attempt, base, max_delay, jitter, u, previous or base)
end

--- seconds = retry.backoff(attempt [, opts])
function retry.backoff(attempt, opts)
  check_attempt("backoff", attempt)
  local seconds = backoff("backoff", attempt, check_options("backoff", opts, backoff_options))
  return seconds -- not a tail call: the option errors name the caller's line
end

local day_names = { Mon = true, Tue = true, Wed = true, Thu = true, Fri = true, Sat = true, Sun = true,
  Monday = true, Tuesday = true, Wednesday = true, Thursday = true, Friday = true, Saturday = true,
  Sunday = true }

-- A Retry-After field that arrived several times is joined with ", ". Hints
-- are minimum waits, so the longest of the parts that parse wins. An
-- HTTP-date has a comma of its own after the day name, so a day name and the
-- part after it are read together.
local function parse_retry_after_list(value, now)
  local whole = core.parse_retry_after(value, now)
  if whole or not value:find(",", 1, true) then return whole end
  local parts = {}
  for part in gmatch(value, "[^,]+") do parts[#parts + 1] = match(part, "^%s*(.-)%s*$") end
  local best, i = nil, 1
  while i <= #parts do
    local seconds
    if day_names[parts[i]] and parts[i + 1] then
      seconds = core.parse_retry_after(parts[i] .. ", " .. parts[i + 1], now)
      i = i + 2
    else
      seconds = core.parse_retry_after(parts[i], now)
      i = i + 1
    end
    if seconds and (not best or seconds > best) then best = seconds end
  end
  return best
end

--- epoch = retry.server_now(headers [, now]): the response's Date when it
-- has one (the server's clock), else the local clock: now, or the wall
-- clock. A Date more than a day
-- away from the local clock is not a server's clock but a broken or hostile
-- one (a "Date: 1970" would turn a reset a few seconds ahead into a wait of
-- 56 years), so the local clock is used then.
local DATE_TRUST = 86400

function retry.server_now(h, now)
  local local_now = now or core.time()
  local date = headers.get(h, "date")
  local server = date and core.parse_http_date(date)
  if server and server - local_now <= DATE_TRUST and local_now - server <= DATE_TRUST then
    -- A Date is the server's clock cut to the whole second: the server's
    -- now is somewhere in [Date, Date + 1). A local clock within that
    -- second agrees with it, to a finer grain: taken as it is, a reset
    -- rounded up to the second is not waited for a second more than asked.
    if local_now >= server and local_now < server + 1 then return local_now end
    return server
  end
  return local_now
end

-- A reset below this is not a time (before September 2001, when epoch
-- seconds reached ten digits) but a count of seconds from now, as
-- @fastify/rate-limit and many gateways send x-ratelimit-reset. Anything
-- above is an epoch, however far past: a server whose clock is off or a
-- cached reset must read as a time gone, not as decades to wait.
local DELTA_BELOW = 1e9

--- seconds = retry.reset_in(value, now): a reset header's number (epoch
-- seconds, or seconds from now when below 1e9) as seconds from now; 0 for
-- a time already past.
function retry.reset_in(value, now)
  if value < DELTA_BELOW then return value end
  return value > now and value - now or 0
end

--- seconds | nil = retry.retry_after(headers [, now]): the response's own
-- Retry-After alone (the longest of a repeated field), or nil.
function retry.retry_after(h, now)
  local ra = headers.get(h, "retry-after")
  if not ra then return nil end
  return parse_retry_after_list(ra, now or retry.server_now(h))
end

--- seconds, source = retry.hint(headers [, now])
-- The wait the server asked for, or nil. Dates are read against the
-- response's own Date header when there is one: that is the server's clock,
-- so a local clock that runs ahead cannot cut the wait short.
function retry.hint(h, now)
  now = retry.server_now(h, now)
  local seconds = retry.retry_after(h, now)
  if seconds then return seconds, "retry-after" end
  local reset = headers.get(h, "x-ratelimit-reset")
  -- APIs send the reset time on every response; it is a wait only when the
  -- quota is spent (or its state unknown), not before a retry of a 502 with
  -- thousands of requests left.
  local remaining = reset and headers.get(h, "x-ratelimit-remaining")
  remaining = remaining and core.parse_seconds(remaining)
  if reset and not (remaining and remaining >= 1) then
    local value = core.parse_seconds(reset)
    if value then return retry.reset_in(value, now), "x-ratelimit-reset" end
  end
  return nil
end

--- seconds, source = retry.delay(headers, attempt [, opts])
function retry.delay(h, attempt, opts)
  if type(h) ~= "table" then
    error(format("retry_delay: headers must be a table (got %s)", type(h)), 2)
  end
  check_attempt("retry_delay", attempt)
  opts = check_options("retry_delay", opts, delay_options)
  if opts.now ~= nil and (type(opts.now) ~= "number" or opts.now ~= opts.now) then
    errors.bad_option("retry_delay", "now", "a number of epoch seconds", opts.now, 2)
  end
  local seconds, source = retry.hint(h, opts.now)
  -- A zero hint (a reset already past, "Retry-After: 0") would send the
  -- retry at once, and the one after it: backoff instead, as urllib3 does;
  -- so would one below the backoff's first step ("Retry-After: 0.000001"),
  -- which is the backoff's floor.
  if seconds and seconds >= (opts.base or 1) then return seconds, source end
  local wait = backoff("retry_delay", attempt, opts)
  if seconds and wait < seconds then wait = seconds end
  return wait, "backoff"
end

return retry
