-- How ratewise waits. Every wait in the library (backoff, Retry-After, a
-- bucket, a transfer in flight) goes through this module, the one place
-- that decides how to wait on the host at hand:
--   0. a per-call `sleep` option always wins: the caller said how to wait;
--   1. inside a ratewise task, the task yields to the scheduler;
--   2. else, with a host sleep configured (rw.configure), that is called;
--   3. else, inside a plain coroutine, coroutine.yield("ratewise.sleep", s),
--      and whoever resumes it does so when the time is up;
--   4. else (main thread), the thread blocks in the engine's poll, running
--      the scheduler's tasks meanwhile, without spinning.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local scheduler = require "ratewise.scheduler"

local now = core.now
local bad_seconds = scheduler.bad_seconds
local running, isyieldable, pcall = compat.running, compat.isyieldable, compat.pcall
local yield = coroutine.yield
local format, min = string.format, math.min
local type, error = type, error

local runtime = {}

local host_sleep -- set by rw.configure{sleep = fn}

-- The engine's options (ratewise.core's core.engine{...}).
local ENGINE_OPTIONS = { max_connections = true, max_idle_connections = true }
local MAX_LIMIT = 1000000

--- runtime.configure{sleep = fn | false, max_connections = n, max_idle_connections = n}
function runtime.configure(opts)
  if type(opts) ~= "table" then
    error(format("configure: expected a table of options (got %s)", type(opts)), 2)
  end
  local limits
  for k, v in pairs(opts) do
    if ENGINE_OPTIONS[k] then
      if type(v) ~= "number" or v % 1 ~= 0 or v < 1 or v > MAX_LIMIT then
        error(format("configure: option '%s' must be an integer from 1 to %d (got %s)", k, MAX_LIMIT,
          type(v) == "number" and tostring(v) or type(v)), 2)
      end
      limits = limits or {}
      limits[k] = v
    elseif k ~= "sleep" then
      error(format("configure: unknown option '%s'", tostring(k)), 2)
    elseif v ~= false and type(v) ~= "function" then
      error(format("configure: option 'sleep' must be a function or false (got %s)", type(v)), 2)
    end
  end
  if opts.sleep ~= nil then host_sleep = opts.sleep or nil end
  if limits then scheduler.engine(limits) end
end

local function in_plain_coroutine()
  return running() ~= nil and isyieldable()
end

-- Rule 3: the plain-coroutine protocol. Resumed early, it asks again for
-- what is left, so the wait is never shorter than asked.
local function yield_sleep(seconds)
  local deadline = now() + seconds
  repeat
    yield("ratewise.sleep", deadline - now())
  until now() >= deadline
end

--- runtime.sleep(seconds [, per_call_sleep]): every wait of the library
-- comes here, so this is where a wait that could never end is refused: NaN
-- or infinite seconds would make a waiting loop spin, here or in a host's
-- own sleep. A negative wait is no wait.
function runtime.sleep(seconds, per_call)
  local bad = bad_seconds(seconds)
  if bad then
    error(format("sleep: seconds must be a finite number (got %s)", bad), 2)
  end
  if per_call then return per_call(seconds) end
  if scheduler.current() then return scheduler.sleep(seconds) end
  if host_sleep then return host_sleep(seconds) end
  if in_plain_coroutine() then return yield_sleep(seconds) end
  return scheduler.sleep(seconds)
end

-- A host sleep cannot be woken by a socket, so while a transfer runs under
-- one, libcurl is driven between short naps.
local NAP_FIRST, NAP_MAX = 0.001, 0.01

local function await(transfer, per_call)
  if scheduler.current() then return scheduler.await_transfer(transfer) end
  local nap = per_call or host_sleep
  if not nap and in_plain_coroutine() then nap = yield_sleep end
  if not nap then return scheduler.await_transfer(transfer) end
  local seconds = NAP_FIRST
  while true do
    scheduler.poll(0)
    if transfer:done() then return end
    nap(seconds)
    seconds = min(seconds * 2, NAP_MAX)
  end
end

--- res | nil, transport_err = runtime.transfer(request [, per_call_sleep])
-- Runs one request to completion. A wait that is interrupted (a cancelled
-- task, a host sleep that raised) aborts the transfer before the error goes on.
function runtime.transfer(request, per_call)
  local transfer, err = scheduler.engine():start(request)
  if not transfer then
    return nil, { message = err, retryable = false, sent = false }
  end
  if scheduler.current() or not (per_call or host_sleep or in_plain_coroutine()) then
    -- Rule 1, a task: a cancellation closes the transfer from inside the
    -- scheduler, with no pcall frame per request. Rule 4, the main thread:
    -- nothing can interrupt this wait.
    scheduler.await_transfer(transfer)
  else
    local ok, werr = pcall(await, transfer, per_call)
    if not ok then
      transfer:close()
      error(werr, 0)
    end
  end
  local res, terr = transfer:result()
  transfer:close()
  return res, terr
end

return runtime
