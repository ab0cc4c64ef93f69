-- How ratewise waits. Every wait in the library (backoff, Retry-After, a
-- bucket, a transfer in flight) goes through this module, so that there is
-- one place that decides how to wait on the host at hand.
local core = require "ratewise.core"

local now = core.now

local runtime = {}

-- One engine (libcurl multi handle) per Lua state, created on first use; its
-- connection cache is what lets requests reuse connections.
local engine

function runtime.engine()
  if not engine then
    engine = assert(core.engine())
  end
  return engine
end

-- Waits at least `seconds`. A caller-supplied sleep (the host's own, such as
-- ngx.sleep) always wins; otherwise the thread blocks in the engine's poll,
-- which waits on libcurl's sockets and timers without spinning.
function runtime.sleep(seconds, host_sleep)
  if host_sleep then
    return host_sleep(seconds)
  end
  local e = runtime.engine()
  local deadline = now() + seconds
  while true do
    local left = deadline - now()
    if left <= 0 then return end
    e:poll(left)
  end
end

-- Runs one request to completion. Returns the response table, or nil and the
-- transport error table of the C core.
function runtime.transfer(request)
  local e = runtime.engine()
  local transfer, err = e:start(request)
  if not transfer then
    return nil, { message = err, retryable = false, sent = false }
  end
  -- Each transfer knows when it is done, so a transfer that finishes while
  -- another one is being waited for is never lost.
  local patience = (request.timeout or 3600) + 1
  while not transfer:done() do
    e:poll(patience)
  end
  local res, terr = transfer:result()
  transfer:close()
  return res, terr
end

return runtime
