-- The token bucket. Its arithmetic lives in the C core (ratewise.Bucket);
-- the method that waits is added here, so that the wait goes through the
-- runtime like every other wait.
local core = require "ratewise.core"
local runtime = require "ratewise.runtime"

local methods = core.bucket_methods

local function refund(bucket, n)
  bucket:refund(n)
end

--- true | false, wait = bucket:acquire([n [, sleep [, max_wait]]])
-- Waits until n tokens are there, first come first served: the tokens are
-- reserved at once, so a later caller queues behind this one. With max_wait,
-- a wait longer than that is not begun: it answers false and the seconds it
-- would have taken, holding nothing (fetch passes the time its call has left).
function methods:acquire(n, host_sleep, max_wait)
  -- Checked here, so that an error names acquire and the caller's line.
  if n ~= nil and (type(n) ~= "number" or n ~= n or n <= 0 or n == math.huge) then
    error(string.format("bad argument #1 to 'acquire' (token count must be a positive number, got %s)",
      tostring(n)), 2)
  end
  if n ~= nil and n > self:capacity() then
    error(string.format("bad argument #1 to 'acquire' (%s tokens asked of a bucket whose capacity is %s: "
      .. "it could never be served)", tostring(n), tostring(self:capacity())), 2)
  end
  if host_sleep ~= nil and type(host_sleep) ~= "function" then
    error(string.format("bad argument #2 to 'acquire' (sleep must be a function, got %s)", type(host_sleep)), 2)
  end
  if max_wait ~= nil and (type(max_wait) ~= "number" or max_wait ~= max_wait or max_wait < 0) then
    error(string.format("bad argument #3 to 'acquire' (max_wait must be a non-negative number of seconds, got %s)",
      tostring(max_wait)), 2)
  end
  local wait = self:reserve(n)
  if wait <= 0 then return true end
  if max_wait and wait > max_wait then
    refund(self, n)
    return false, wait
  end
  -- A waiter that is gone (a cancelled task, a host sleep that raised)
  -- gives its place up. A tail call: thousands of tasks may wait on one
  -- bucket, and a frame apiece would make each of them cost more.
  return runtime.sleep(wait, host_sleep, refund, self, n) -- true
end

return {
  new = core.bucket,
}
