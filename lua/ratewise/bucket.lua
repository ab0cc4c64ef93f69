-- The token bucket. Its arithmetic lives in the C core (ratewise.Bucket);
-- the method that waits is added here, so that the wait goes through the
-- runtime like every other wait.
local core = require "ratewise.core"
local runtime = require "ratewise.runtime"

local methods = core.bucket_methods

--- ok = bucket:acquire([n [, sleep]])
-- Waits until n tokens are there, first come first served: the tokens are
-- reserved at once, so a later caller queues behind this one.
function methods:acquire(n, host_sleep)
  local wait = self:reserve(n)
  if wait > 0 then
    local ok, err = pcall(runtime.sleep, wait, host_sleep)
    if not ok then
      -- The waiter is gone (an error, or a cancelled task): its place is given up.
      self:refund(n)
      error(err, 0)
    end
  end
  return true
end

return {
  new = core.bucket,
}
