-- rw.shared_bucket{dict = name, ...}: one limit for the workers of one
-- nginx, kept in a lua_shared_dict, without Redis. GCRA's one number per
-- key (gcra.lua, the arithmetic redis_bucket.lua runs in Redis), on the
-- machine's monotonic clock, which every worker reads alike.
local core = require "ratewise.core"
local gcra = require "ratewise.gcra"
local runtime = require "ratewise.runtime"
local options = require "ratewise.options"

local step, count = gcra.step, gcra.count
local now = core.now
local format, floor = string.format, math.floor
local type, tostring, pairs, error, setmetatable, pcall = type, tostring, pairs, error, setmetatable, pcall

local shared_bucket = {}

-- A shared dict has no compare-and-set, so one step is made under a lock:
-- a key added with dict:add (atomic: one worker wins), deleted after. The
-- step does not yield and is short (no I/O); the lock's expiry frees it
-- should a worker die holding it. A worker that finds it taken tries
-- again at once LOCK_SPINS times, then naps LOCK_NAP (lua-resty-lock does
-- this too, but Debian does not package it).
-- A dict's expiry is counted on the worker's cached clock, which nginx
-- moves once per turn of its event loop: a worker that has run Lua for a
-- while in one turn (loading modules, a long handler) would set a lock
-- that has expired already for a worker whose clock is fresher, and both
-- would step at once, granting one token twice. So the clock is brought
-- up to date (ngx.update_time) before each attempt, and the expiry leaves
-- room for a holder the system pauses (another process on its core).
local LOCK_EXPIRY, LOCK_SPINS, LOCK_NAP = 0.1, 100, 0.0005

local SharedBucket = {}
SharedBucket.__index = SharedBucket
SharedBucket.__name = "ratewise.SharedBucket"
SharedBucket.honors_max_wait = true

-- One GCRA step on the dict, under the lock: wait, granted, tokens (in
-- millionths), all in microseconds.
local function run(self, op, n, arg, arg2)
  local dict, lock, update_time = self.dict, self.lock, self.update_time
  local spins = 0
  update_time()
  while not dict:add(lock, true, LOCK_EXPIRY) do
    spins = spins + 1
    if spins >= LOCK_SPINS then
      runtime.sleep(LOCK_NAP)
      spins = 0
    end
    update_time()
  end
  local t = floor(now() * 1e6)
  local state = { tat = dict:get(self.key) or t, now = t, interval = self.interval, capacity = self.capacity_n }
  local ok, new, wait, granted, tokens = pcall(step, op, state, n, arg or -1, arg2 or 0)
  if ok and new then
    if new <= t then
      dict:delete(self.key)
    else
      -- expires when the bucket would be full again, like a Redis key
      local stored, err = dict:set(self.key, new, (new - t) / 1e6 + 1)
      if not stored then ok, new = false, "lua_shared_dict '" .. self.dict_name .. "': " .. tostring(err) end
    end
  end
  dict:delete(lock)
  if not ok then error(new, 0) end
  return wait, granted, tokens
end

--- true | false, wait = b:acquire([n [, sleep [, max_wait]]]): the tokens
-- are reserved at once in the dict, and waited for here.
function SharedBucket:acquire(n, sleep, max_wait)
  n = count(self, n, "acquire")
  local wait, granted = run(self, "reserve", n, gcra.max_wait(sleep, max_wait))
  wait = wait / 1e6
  if granted ~= 1 then return false, wait end
  if wait > 0 then runtime.sleep(wait, sleep) end
  return true
end

function SharedBucket:take(n)
  local wait, granted = run(self, "take", count(self, n, "take"))
  if granted == 1 then return true end
  return false, wait / 1e6
end

function SharedBucket:wait_time(n)
  return (run(self, "peek", count(self, n, "wait_time"))) / 1e6
end

function SharedBucket:tokens()
  local _, _, tokens = run(self, "peek", 1)
  return tokens / 1e6
end

function SharedBucket:refund(n)
  run(self, "refund", gcra.amount(self, n, "refund"))
end

--- b:debit(n): takes n at once into debt (limiters' settle, and a named
-- limit asked for more than it holds), not waited for; the debt believed
-- only up to sync_horizon, as a local bucket's is.
function SharedBucket:debit(n)
  run(self, "debit", gcra.amount(self, n, "debit"), floor(self.horizon * 1e6))
end

function SharedBucket:sync(remaining, reset_in)
  local left, reset_micros = gcra.sync_args(self, remaining, reset_in)
  if left then run(self, "sync", 1, left, reset_micros) end
end

function SharedBucket:capacity() return self.capacity_n end
function SharedBucket:rate() return self.rate_n end

SharedBucket.__tostring = function(b)
  return format("ratewise.SharedBucket (%s in lua_shared_dict %s, capacity %g, %g/s)", b.name, b.dict_name,
    b.capacity_n, b.rate_n)
end

local known_options = { dict = true, key = true, capacity = true, rate = true, sync_horizon = true }

--- b = rw.shared_bucket{dict = name, [key = name,] capacity = C, rate = R [, sync_horizon = s]}
function shared_bucket.new(opts)
  if type(opts) ~= "table" then
    error(format("shared_bucket: options must be a table (got %s)", type(opts)), 2)
  end
  for k in pairs(opts) do
    if not known_options[k] then
      options.unknown("shared_bucket", k, known_options, 2)
    end
  end
  local ngx = rawget(_G, "ngx")
  local name = opts.dict
  if type(name) ~= "string" then
    error(format("shared_bucket: option 'dict' must be the name of a lua_shared_dict (got %s)", type(name)), 2)
  end
  if not (ngx and ngx.shared) then
    -- (Apache's mod_lua, HAProxy, a script: a dict of nginx's is not there
    -- to declare)
    error("shared_bucket: a lua_shared_dict is OpenResty's, and this is not OpenResty: to share a limit between "
      .. "processes or threads here, use rw.redis_bucket", 2)
  end
  local dict = ngx.shared[name]
  if not dict then
    error(format("shared_bucket: no lua_shared_dict named '%s' (declare it in nginx.conf's http block: "
      .. "lua_shared_dict %s 1m;)", name, name), 2)
  end
  local key = opts.key or "bucket"
  if type(key) ~= "string" or key == "" then
    error(format("shared_bucket: option 'key' must be a non-empty string (got %s)", tostring(key)), 2)
  end
  local capacity, rate = gcra.limits("shared_bucket", opts)
  return setmetatable({
    dict = dict, dict_name = name, name = key, update_time = ngx.update_time,
    key = "ratewise:" .. key, lock = "ratewise:" .. key .. ":lock",
    capacity_n = capacity, rate_n = rate, interval = 1e6 / rate,
    horizon = gcra.positive("shared_bucket", opts, "sync_horizon", 86400),
  }, SharedBucket)
end

return shared_bucket
