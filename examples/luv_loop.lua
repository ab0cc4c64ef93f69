-- ratewise in a libuv event loop (luv): the loop watches the scheduler's
-- descriptor and its next deadline, and runs rw.step(0) when either comes;
-- nothing polls on a timer of its own. Three requests run as ratewise
-- tasks while a luv timer ticks on beside them.
--
--   lua5.4 examples/luv_loop.lua [BASE_URL]   (default: a local mock API)
local uv = require "luv"
local rw = require "ratewise"

-- The adapter: a dozen lines that any libuv program can copy. on_idle is
-- called once no ratewise task is left. A build with the poll(2) backend
-- has no descriptor (rw.features.pollfd): the timer alone drives it then,
-- rw.pollable:timeout() keeping it short while transfers are in flight.
local function drive_ratewise(on_idle)
  local fd, timer = rw.pollable:pollfd(), uv.new_timer()
  local poll = fd and uv.new_poll(fd)
  local function drive()
    local live = rw.step(0)
    timer:stop()
    if live == 0 then -- closed, not only stopped: the loop must not outlive the descriptor
      if poll then poll:close() end
      timer:close()
      return on_idle()
    end
    local wait = rw.pollable:timeout()
    if wait then timer:start(math.ceil(wait * 1000), 0, drive) end
  end
  if poll then poll:start("r", drive) end
  return drive
end

local base, mock = arg[1], nil
if not base then
  mock = require("spec.support.server").start()
  mock:script("/slow", { { status = 429, headers = { ["Retry-After"] = "1" } }, { status = 200, delay = 0.3 } })
  base = mock.base
end

local ticks = 0
local ticker = uv.new_timer()
ticker:start(100, 100, function() ticks = ticks + 1 end)
local drive = drive_ratewise(function() ticker:close() end) -- then nothing keeps uv.run going

local started = uv.hrtime()
for i = 1, 3 do
  rw.spawn(function()
    local res, err = rw.fetch(base .. "/slow", { on_retry = false })
    print(("request %d: %s"):format(i, res and (res.status .. " after " .. res.attempts .. " attempts")
      or tostring(err)))
  end)
end
drive() -- start the first transfers; from here on the loop calls drive

uv.run()
print(("done in %.1f s; the luv timer ticked %d times meanwhile"):format((uv.hrtime() - started) / 1e9, ticks))
if mock then mock:stop() end
