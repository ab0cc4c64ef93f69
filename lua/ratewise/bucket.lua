-- The token bucket. Its arithmetic lives in the C core (ratewise.Bucket);
-- the method that waits is added here, so that the wait goes through the
-- runtime like every other wait.
local core = require "ratewise.core"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"

local methods = core.bucket_methods

local function refund(bucket, n)
  bucket:refund(n)
end

--- ok = bucket:acquire([n [, sleep]])
-- Waits until n tokens are there, first come first served: the tokens are
-- reserved at once, so a later caller queues behind this one.
function methods:acquire(n, host_sleep)
  local wait = self:reserve(n)
  if wait <= 0 then return true end
  -- A waiter that is gone (a cancelled task, a host sleep that raised) gives
  -- its place up. Inside a task, the scheduler undoes the reservation itself:
  -- thousands of tasks may wait on one bucket, and a pcall frame apiece (or
  -- any frame: hence the tail call) would make each of them cost more.
  if not host_sleep and scheduler.current() then
    return scheduler.sleep(wait, refund, self, n) -- true
  end
  local ok, err = pcall(runtime.sleep, wait, host_sleep)
  if not ok then
    refund(self, n)
    error(err, 0)
  end
  return true
end

return {
  new = core.bucket,
}
