-- rw.redis_bucket{...}: one limit shared by every process that names the
-- same key, kept in Redis. The state is GCRA's one number per key (the
-- "theoretical arrival time" of the next request, as redis-cell and
-- throttled keep it), read and written by one server-side Lua script, on
-- the Redis server's clock (TIME): clients with skewed clocks share one
-- rate. One round trip per acquire: the script reserves the tokens and
-- answers how long to wait, and the wait is done here, through the seam.
local bucket = require "ratewise.bucket"
local gcra = require "ratewise.gcra"
local errors = require "ratewise.errors"
local options = require "ratewise.options"
local redis = require "ratewise.redis"
local redis_topology = require "ratewise.redis_topology"
local runtime = require "ratewise.runtime"

local count = gcra.count
local format, floor = string.format, math.floor
local now = require("ratewise.core").now
local type, tostring, pairs, error, setmetatable = type, tostring, pairs, error, setmetatable
local unpack = require("ratewise.compat").unpack

local redis_bucket = {}

-- Seconds a call to Redis may take (connect included) before on_error
-- decides: long enough for a loaded Redis on a LAN, short next to the
-- requests it paces.
local DEFAULT_TIMEOUT = 0.25
redis_bucket.DEFAULT_TIMEOUT = DEFAULT_TIMEOUT

-- The longest wait the script may answer, beyond sync_horizon, in
-- microseconds: waiters queued on a bucket push its wait on without bound,
-- but not this far (the most gcra.limits lets one bucket's capacity span).
-- A longer one is a broken or hostile server's.
local MAX_QUEUE_MICROS = 1e15

-- The script: GCRA's step (gcra.lua) on the key, at the server's time, in
-- integer microseconds. ARGV: microseconds a token, capacity, n,
-- operation, its two arguments, the caller's deadline on the server's
-- clock (-1: none), and, back from the local bucket, the balance (in
-- millionths) the shared one is lowered to first ("": none).
-- Answers {wait, granted, tokens in millionths, the server's time}; past
-- the deadline it does nothing and answers granted = -1: the caller has
-- given up (a hung server that resumes runs every command it was sent),
-- and a reservation nobody waits for would keep the tokens from everyone.
-- A key whose bucket is full again is deleted (its expiry is when it
-- would be full): an idle bucket costs Redis nothing.
local SCRIPT = gcra.SOURCE .. [[
if redis.replicate_commands then redis.replicate_commands() end
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local deadline = tonumber(ARGV[7]) or -1
if deadline >= 0 and now > deadline then return { 0, -1, 0, now } end
local interval, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', key) or now) or now
local level, lowered = tonumber(ARGV[8]), nil
if level then
  local least = now + (capacity - level / 1000000) * interval
  if least > tat then tat, lowered = least, least end
end
local new, wait, granted, tokens = gcra_step(ARGV[4],
  { tat = tat, now = now, interval = interval, capacity = capacity },
  tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[6]))
if not wait then return redis.error_reply('ratewise: unknown operation ' .. tostring(ARGV[4])) end
new = new or lowered
if new then
  if new <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1000)
  end
end
return { wait, granted, tokens, now }
]]
redis_bucket.SCRIPT = SCRIPT

local RedisBucket = {}
RedisBucket.__index = RedisBucket
RedisBucket.__name = "ratewise.RedisBucket"
-- fetch passes the time its call has left to acquire (max_wait) and asks
-- nothing first: one round trip per attempt.
RedisBucket.honors_max_wait = true

-- The error an acquire ends with when Redis fails and on_error is "closed".
local function unavailable(self, err)
  return errors.new("limiter_unavailable", format("redis_bucket '%s': %s", self.name, tostring(err)))
end

-- How much later than the client's monotonic clock (now()) the server's
-- clock (TIME, in the script) may be, as far as the replies show, in
-- seconds. The caller's deadline is sent on the server's clock, never on
-- the client's: the hosts' wall clocks may disagree by any amount, while
-- the server's own TIME, read in a reply, is bound on both sides by the
-- client's monotonic clock when the command was sent and when the reply
-- came. Taking its time at the send gives the largest offset that reply
-- allows, so the deadline sent errs late (by at most a round trip: a late
-- script is then let through), never early (a script run in time is never
-- refused). The least offset seen stays the bound, widened by what the
-- two clocks may drift apart since (DRIFT, above what NTP slews a clock).
local DRIFT = 1e-3

local function learn_clock(self, sent, server_micros)
  local offset = server_micros / 1e6 - sent
  local known = self.clock_offset
  if known then known = known + (sent - self.clock_at) * DRIFT end
  if not known or offset < known then known = offset end
  self.clock_offset, self.clock_at = known, sent
end

-- The caller's deadline in microseconds on the server's clock (-1: none
-- known yet). Only with our own client: a client object keeps its own
-- timeout, which is not known here.
local function deadline(self, sent)
  if not (self.client and self.clock_offset) then return -1 end
  return floor((sent + self.timeout + self.clock_offset) * 1e6)
end

-- Runs the script through a client of our own (a redis:// URL): reply |
-- nil, err, and the time the command that answered was sent. Whatever the
-- server answers, nothing here raises: run checks the reply's shape.
-- args: the script's ARGV but the deadline, set at each send.
local function run_own(self, args)
  local client = self.client
  if not self.sha then
    local sha, err = client:call("SCRIPT", "LOAD", SCRIPT)
    if err then return nil, err end
    if type(sha) ~= "string" or #sha ~= 40 or sha:find("%X") then
      return nil, format("SCRIPT LOAD: %s", type(sha) == "string" and "an answer that is not a SHA1 digest"
        or redis.described(sha))
    end
    self.sha = sha
  end
  local sent = now()
  args[7] = deadline(self, sent)
  local reply, err = client:call("EVALSHA", self.sha, 1, self.key, unpack(args, 1, 8))
  if type(reply) == "table" and type(reply.err) == "string" and reply.err:find("^NOSCRIPT") then
    -- Redis restarted, or its scripts were flushed: EVAL loads it again.
    sent = now()
    args[7] = deadline(self, sent)
    reply, err = client:call("EVAL", SCRIPT, 1, self.key, unpack(args, 1, 8))
  end
  if err then return nil, err end
  if type(reply) == "table" and type(reply.err) == "string" then return nil, "Redis answered: " .. reply.err end
  return reply, nil, sent
end

-- Runs the script through a caller's client object with evalsha and eval
-- (resty.redis in OpenResty, or one of the same shape): res | nil, err.
local function run_object(self, args)
  local object = self.object
  args[7] = -1
  if self.sha == nil then
    -- resty.redis has script("load", ...); a client without it runs EVAL
    local ok, sha = pcall(function() return object:script("load", SCRIPT) end)
    self.sha = ok and type(sha) == "string" and sha or false
  end
  local reply, err
  local sent = now()
  if self.sha then reply, err = object:evalsha(self.sha, 1, self.key, unpack(args, 1, 8)) end
  if not self.sha or (not reply and type(err) == "string" and err:find("NOSCRIPT", 1, true)) then
    sent = now()
    reply, err = object:eval(SCRIPT, 1, self.key, unpack(args, 1, 8))
  end
  if not reply then return nil, format("Redis: %s", tostring(err)) end
  return reply, nil, sent
end

local function is_integer(v, least, most)
  return type(v) == "number" and v % 1 == 0 and v >= least and v <= most
end

-- The script's reply, or nil and what is wrong with it: a broken or
-- hostile server's reply is never waited for.
local function checked(self, reply)
  if type(reply) ~= "table" or #reply ~= 4 or type(reply[1]) ~= "number" or type(reply[2]) ~= "number"
    or type(reply[3]) ~= "number" or type(reply[4]) ~= "number" then
    return nil, format("Redis answered the script with %s, not its four integers", redis.described(reply))
  end
  local most_micros = self.horizon * 1e6 + MAX_QUEUE_MICROS
  local full = self.capacity_n * 1e6
  if not (is_integer(reply[1], 0, most_micros) and (reply[2] == 0 or reply[2] == 1 or reply[2] == -1)
    and is_integer(reply[3], -full - most_micros / self.interval * 1e6, full + 1)
    and is_integer(reply[4], 0, 2 ^ 53)) then
    return nil, format("Redis answered the script with {%s, %s, %s, %s}: not a wait, a grant, a balance this "
      .. "bucket could have and a time", tostring(reply[1]), tostring(reply[2]), tostring(reply[3]),
      tostring(reply[4]))
  end
  return reply
end

-- The local bucket holds `tokens` from now on (below one: the next token
-- comes when it would at the local rate), or fewer if it holds fewer.
local function hand_over(self, tokens)
  local fallback = self.fallback
  if tokens >= 1 then
    fallback:sync(tokens)
  else
    fallback:sync(0, (1 - tokens) / fallback:rate())
  end
end

-- Each switch hands the state over, so that it adds no burst to what
-- the processes send together. Redis failed: from now on the local bucket
-- serves, holding its share of the balance the last reply showed (and of
-- what the rate has added since), not a full bucket.
local function to_local(self)
  self.on_local = true
  local balance = self.seen_tokens + (now() - self.seen_at) * self.rate_n
  if balance > self.capacity_n then balance = self.capacity_n end
  hand_over(self, balance * self.local_share)
end

-- Back on Redis: the shared balance is lowered to what the local bucket
-- holds, as if every process had spent alike (the local share scaled up
-- to the whole), and never raised. The shared bucket refilled meanwhile
-- as if nobody had spent, and the process back first would otherwise
-- find it full while the others still spend locally. In millionths.
local function from_local(self)
  local level = self.fallback:tokens() / self.local_share
  if level > self.capacity_n then level = self.capacity_n end
  return floor(level * 1e6)
end

-- The script's reply, {wait, granted, tokens, the server's time}, or nil
-- and why not. again: this is the one call made again after a refusal as
-- late.
local function run(self, op, n, arg, arg2, again)
  local level = self.on_local and from_local(self) or ""
  local reply, err, sent = self.run(self, { self.interval, self.capacity_n, n, op, arg or -1, arg2 or 0, -1, level })
  if not err then reply, err = checked(self, reply) end
  if err then
    if self.fallback and not self.on_local then to_local(self) end
    return nil, err
  end
  if reply[2] == -1 then
    -- Refused as late, yet answered within the timeout: the offset was
    -- wrong (the server's clock was set forward, or this is another server
    -- after a failover). Learnt anew from this reply's time, once.
    self.clock_offset = nil
    learn_clock(self, sent, reply[4])
    if again then return nil, "Redis answered the script as past its deadline twice" end
    return run(self, op, n, arg, arg2, true)
  end
  learn_clock(self, sent, reply[4])
  self.seen_tokens, self.seen_at = reply[3] / 1e6, now()
  self.on_local = false
  return reply
end

--- true | false, wait | nil, err = b:acquire([n [, sleep [, max_wait]]])
-- As a bucket's acquire, against the shared limit. When Redis fails:
-- on_error "closed" answers nil and an error of kind "limiter_unavailable";
-- "local" serves from the local bucket until Redis answers again.
function RedisBucket:acquire(n, sleep, max_wait)
  n = count(self, n, "acquire")
  local budget = gcra.max_wait(sleep, max_wait)
  local reply, err = run(self, "reserve", n, budget)
  if not reply then
    if self.fallback then return self.fallback:acquire(n, sleep, max_wait) end
    return nil, unavailable(self, err)
  end
  local wait = reply[1] / 1e6
  -- The script grants no wait past the budget: a server that does is not
  -- running it, and the caller's budget is kept all the same.
  if reply[2] ~= 1 or (budget >= 0 and reply[1] > budget) then return false, wait end
  -- The tokens are reserved on the server; a waiter cancelled now has
  -- spent them (giving them back would be a call to Redis from a task
  -- that is being torn down).
  if wait > 0 then runtime.sleep(wait, sleep) end
  return true
end

--- true | false, wait | nil, err = b:take([n])
function RedisBucket:take(n)
  n = count(self, n, "take")
  local reply, err = run(self, "take", n)
  if not reply then
    if self.fallback then return self.fallback:take(n) end
    return nil, unavailable(self, err)
  end
  if reply[2] == 1 then return true end
  return false, reply[1] / 1e6
end

--- seconds | nil, err = b:wait_time([n])
function RedisBucket:wait_time(n)
  n = count(self, n, "wait_time")
  local reply, err = run(self, "peek", n)
  if not reply then
    if self.fallback then return self.fallback:wait_time(n) end
    return nil, unavailable(self, err)
  end
  return reply[1] / 1e6
end

--- tokens | nil, err = b:tokens(): the shared balance now.
function RedisBucket:tokens()
  local reply, err = run(self, "peek", 1)
  if not reply then
    if self.fallback then return self.fallback:tokens() end
    return nil, unavailable(self, err)
  end
  return reply[3] / 1e6
end

--- b:refund([n]): gives back tokens taken and not used.
function RedisBucket:refund(n)
  n = gcra.amount(self, n, "refund")
  local reply = run(self, "refund", n)
  if not reply and self.fallback then self.fallback:refund(n) end
end

--- b:sync(remaining [, reset_in]): what the server says of its quota,
-- applied to the shared bucket (never raised, and never further off than a
-- day, as a local bucket's sync).
function RedisBucket:sync(remaining, reset_in)
  local left, reset_micros = gcra.sync_args(self, remaining, reset_in)
  if not left then return end
  local reply = run(self, "sync", 1, left, reset_micros)
  if not reply and self.fallback then self.fallback:sync(remaining, reset_in) end
end

--- b:debit(n): takes n at once into debt (limiters' settle, and a named
-- limit asked for more than it holds): a reservation with no bound on its
-- wait, not waited for. The debt is believed only up to sync_horizon, as a
-- local bucket's is.
function RedisBucket:debit(n)
  n = gcra.amount(self, n, "debit")
  local reply = run(self, "debit", n, floor(self.horizon * 1e6))
  if not reply and self.fallback then self.fallback:debit(n) end
end

function RedisBucket:capacity() return self.capacity_n end
function RedisBucket:rate() return self.rate_n end

--- b:close(): drops its connection (a later call makes a new one).
function RedisBucket:close()
  if self.client then self.client:close() end
end

RedisBucket.__tostring = function(b)
  return format("ratewise.RedisBucket (%s, capacity %g, %g/s)", b.key, b.capacity_n, b.rate_n)
end

local known_options = {
  redis = true, key = true, capacity = true, rate = true, on_error = true, timeout = true,
  local_share = true, sync_horizon = true,
}

--- b = rw.redis_bucket{redis = url | client, key = name, capacity = C, rate = R
--   [, on_error = "closed" | "local"] [, timeout = s] [, local_share = f] [, sync_horizon = s]}
function redis_bucket.new(opts)
  if type(opts) ~= "table" then
    error(format("redis_bucket: options must be a table (got %s)", type(opts)), 2)
  end
  for k in pairs(opts) do
    if not known_options[k] then
      options.unknown("redis_bucket", k, known_options, 2)
    end
  end
  local key = opts.key
  if type(key) ~= "string" or key == "" then
    errors.bad_option("redis_bucket", "key", "a non-empty string", key, 2)
  end
  local capacity, rate = gcra.limits("redis_bucket", opts)
  local timeout = gcra.positive("redis_bucket", opts, "timeout", DEFAULT_TIMEOUT)
  local local_share = gcra.positive("redis_bucket", opts, "local_share", 1)
  if local_share > 1 then error("redis_bucket: option 'local_share' must be at most 1", 2) end
  local on_error = opts.on_error or "closed"
  if on_error ~= "closed" and on_error ~= "local" then
    errors.bad_option("redis_bucket", "on_error", '"closed" or "local"', on_error, 2)
  end
  local self = setmetatable({
    name = key,
    -- The hash tag keeps the bucket on one node of a Redis Cluster.
    key = "ratewise:{" .. key .. "}",
    capacity_n = capacity, rate_n = rate, interval = 1e6 / rate,
    horizon = gcra.positive("redis_bucket", opts, "sync_horizon", 86400),
    timeout = timeout, local_share = local_share,
    -- the shared balance the last reply showed, and when (a new key's: full)
    seen_tokens = capacity, seen_at = now(),
    -- serving from the local bucket (Redis failed)
    on_local = false,
    -- the server's clock, as the replies showed it (learn_clock)
    clock_offset = nil, clock_at = nil,
  }, RedisBucket)
  local target = opts.redis
  if type(target) == "string" or redis_topology.is_config(target) then
    if not redis.available then error("redis_bucket: " .. redis.MISSING, 2) end
    local client, err = redis_topology.client(target, timeout)
    if not client then
      -- the URL is not repeated: it may hold a password
      error(format("redis_bucket: option 'redis': %s", err), 2)
    end
    self.client = client
    self.run = run_own
  elseif (type(target) == "table" or type(target) == "userdata") then
    local ok, has = pcall(function() return type(target.evalsha) == "function" and type(target.eval) == "function" end)
    if not (ok and has) then
      error("redis_bucket: option 'redis' must be a redis:// URL or a client with evalsha and eval "
        .. "(or a table naming 'sentinels' or 'cluster')", 2)
    end
    self.object = target
    self.run = run_object
  else
    error(format("redis_bucket: option 'redis' must be a redis:// URL or a client with evalsha and eval "
      .. "(or a table naming 'sentinels' or 'cluster'; got %s)", type(target)), 2)
  end
  if on_error == "local" then
    self.fallback = bucket.new { capacity = capacity, rate = rate * local_share }
    hand_over(self, capacity * local_share)
  end
  return self
end

return redis_bucket
