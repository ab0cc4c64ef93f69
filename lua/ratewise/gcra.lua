-- GCRA (the generic cell rate algorithm), the shared buckets' arithmetic:
-- one number per bucket, the time at which it would be full again (its
-- "theoretical arrival time", tat), as redis-cell and throttled keep it.
-- The same source runs in Redis (inside redis_bucket.lua's script, on
-- Redis's Lua 5.1) and in nginx workers (shared_bucket.lua), so it is kept
-- as text: one implementation for both.
local gcra = {}

-- step(op, bucket, n, arg, arg2) -> new_tat | nil, wait, granted (1 | 0),
-- tokens (in millionths). bucket: the record {tat, now, interval,
-- capacity} (tat: the stored one, or now for a key not stored; interval:
-- microseconds a token), read and never changed. Times in microseconds.
-- op "peek": the wait for n, taking nothing; "take": n now or nothing;
-- "reserve": n, with a wait of at most arg (-1: any), or nothing; "debit":
-- n at once, into debt, believed only until the bucket holds no token for
-- arg microseconds (its sync horizon) past a full bucket's time; "refund":
-- n back; "sync": at most arg millionths of a token left, and with less
-- than one, the next arg2 microseconds from now. new_tat nil: unchanged.
gcra.SOURCE = [[
local function gcra_step(op, bucket, n, arg, arg2)
  local tat, now, interval, capacity = bucket.tat, bucket.now, bucket.interval, bucket.capacity
  if tat < now then tat = now end
  local burst = capacity * interval
  local function tokens(v) return math.floor((burst - (v - now)) * 1000000 / interval) end
  if op == 'peek' then
    local wait = tat + n * interval - burst - now
    return nil, wait > 0 and math.ceil(wait) or 0, 0, tokens(tat)
  elseif op == 'take' or op == 'reserve' then
    local new = tat + n * interval
    local wait = new - burst - now
    if wait < 0 then wait = 0 end
    if (op == 'take' and wait > 0) or (op == 'reserve' and arg >= 0 and wait > arg) then
      return nil, math.ceil(wait), 0, tokens(tat)
    end
    return new, math.ceil(wait), 1, tokens(new)
  elseif op == 'debit' then
    local new = tat + n * interval
    local most = now + burst - interval + arg
    if new > most then new = most end
    if new <= tat then return nil, 0, 1, tokens(tat) end
    return new, 0, 1, tokens(new)
  elseif op == 'refund' then
    local new = tat - n * interval
    if new < now then new = now end
    return new, 0, 1, tokens(new)
  elseif op == 'sync' then
    local least
    if arg >= 1000000 then
      least = now + (capacity - arg / 1000000) * interval
    else
      least = now + (capacity - 1) * interval + arg2
    end
    if least > tat then return least, 0, 1, tokens(least) end
    return nil, 0, 1, tokens(tat)
  end
  return nil, nil, nil, nil
end
]]

-- loadstring: Lua 5.1's load takes no string
local load_chunk = rawget(_G, "loadstring") or load
gcra.step = assert(load_chunk(gcra.SOURCE .. "\nreturn gcra_step", "=gcra"))()

-- What the shared buckets (redis_bucket.lua, shared_bucket.lua) check
-- alike, in the caller's terms.
local errors = require "ratewise.errors"
local format, floor, huge = string.format, math.floor, math.huge
local type, tostring, error = type, tostring, error
local shown = errors.shown

-- A count that is not a positive number raises at the caller of the
-- bucket's method (level 4: past the function calling this one).
local function positive(n, method)
  if n == nil then return 1 end
  if type(n) ~= "number" or n ~= n or n <= 0 or n == huge then
    error(format("bad argument #1 to '%s' (token count must be a positive number, got %s)", method,
      shown(n)), 4)
  end
  return n
end

--- n = gcra.count(bucket, n, method): the token count of a call (1 when
-- nil); raises, at the method's caller, for one that is not a count or
-- that the bucket could never serve.
function gcra.count(bucket, n, method)
  n = positive(n, method)
  if n > bucket.capacity_n then
    error(format("bad argument #1 to '%s' (%s tokens asked of a bucket whose capacity is %s: "
      .. "it could never be served)", method, tostring(n), tostring(bucket.capacity_n)), 3)
  end
  return n
end

--- n = gcra.amount(bucket, n, method): the token count of a refund or a
-- debit (1 when nil), which may be more than the bucket holds: what a
-- limit asked for more than its capacity took (rw.limiters' named limits)
-- comes back, or goes into debt, whole.
function gcra.amount(_, n, method)
  n = positive(n, method) -- (not a tail call: the error's level counts this frame)
  return n
end

--- micros = gcra.max_wait(sleep, max_wait): acquire's other arguments
-- checked; max_wait in microseconds (-1: any wait).
function gcra.max_wait(sleep, max_wait)
  if sleep ~= nil and type(sleep) ~= "function" then
    error(format("bad argument #2 to 'acquire' (sleep must be a function, got %s)", type(sleep)), 3)
  end
  if max_wait ~= nil and (type(max_wait) ~= "number" or max_wait ~= max_wait or max_wait < 0) then
    error(format("bad argument #3 to 'acquire' (max_wait must be a non-negative number of seconds, got %s)",
      shown(max_wait)), 3)
  end
  return max_wait and max_wait < huge and floor(max_wait * 1e6) or -1
end

--- remaining, reset_in = gcra.sync_args(bucket, remaining, reset_in): what
-- a sync may apply, in millionths of a token and microseconds, as a local
-- bucket's sync would (never further off than its horizon); nil when
-- remaining is not a number.
function gcra.sync_args(bucket, remaining, reset_in)
  if type(remaining) ~= "number" or remaining ~= remaining then return nil end
  if remaining < 0 then remaining = 0 end
  if remaining > bucket.capacity_n then remaining = bucket.capacity_n end
  reset_in = type(reset_in) == "number" and reset_in == reset_in and reset_in or 0
  if reset_in < 0 then reset_in = 0 end
  if reset_in > bucket.horizon then reset_in = bucket.horizon end
  return floor(remaining * 1e6), floor(reset_in * 1e6)
end

--- v = gcra.positive(what, opts, name [, default [, level]]): a positive
-- number option (required without a default); an error is raised at
-- `level` (default 3: the caller of the constructor that asks).
function gcra.positive(what, opts, name, default, level)
  level = level or 3
  local v = opts[name]
  if v == nil then
    if default == nil then error(format("%s: option '%s' is required", what, name), level) end
    return default
  end
  if type(v) ~= "number" or v ~= v or v <= 0 or v == huge then
    errors.bad_option(what, name, "a positive number", v, level)
  end
  return v
end

--- capacity, rate = gcra.limits(what, opts): the bucket's two numbers,
-- checked to stay within what microsecond integers can count.
function gcra.limits(what, opts)
  local capacity, rate = gcra.positive(what, opts, "capacity", nil, 4), gcra.positive(what, opts, "rate", nil, 4)
  if capacity > 1e9 then error(what .. ": option 'capacity' is too large (at most 1e9)", 3) end
  if rate > 1e6 then error(what .. ": option 'rate' is too large (at most 1e6 a second)", 3) end
  if capacity * 1e6 / rate > 1e15 then error(what .. ": option 'rate' is too small for that capacity", 3) end
  return capacity, rate
end

return gcra
