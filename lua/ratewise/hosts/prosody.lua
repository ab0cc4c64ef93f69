-- The Prosody host: ratewise inside Prosody (0.12), found with no
-- configuration where the `prosody` global says the process is the server
-- and util.async, net.server and util.timer are loaded (they are before
-- any module loads). Registered with the seam (ratewise/runtime.lua) at rank 77.
--   Prosody runs a module's handlers (HTTP requests, stanzas, its startup)
--   inside util.async runners. A wait there blocks its own runner with
--   async.waiter(), as Prosody's own net.http callers do, and the rest of
--   Prosody goes on: a sleep is async.sleep; any other wait (a transfer, a
--   join, a group of tasks, a semaphore) is woken by the driver once what
--   it waits for came true.
--   One driver per Lua state runs ratewise's scheduler from Prosody's loop:
--   net.server.watchfd on the scheduler's descriptor and a util.timer task
--   for its next deadline, each calling a step on Prosody's main thread,
--   after which the waiters whose condition came true are resumed. A
--   driver of callbacks, as net.http's: hosts/driven.lua's driver blocks in
--   a thread of its own, which here would be one more runner, resumed from
--   such callbacks all the same, and waking the others only through them. Tasks spawned outside any task (rw.spawn
--   from a timer's callback) arm it (scheduler.add_spawn_watch).
--   Code outside any runner (a timer's callback, an event handler run on
--   the main loop, a coroutine of one's own) cannot wait without stopping
--   every connection of the server: a wait there raises, naming the fix.
--   ratewise's lines go to Prosody's log (util.logger, as "ratewise").
local log = require "ratewise.log"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"
local core = require "ratewise.core"

local rawget, type, tostring, error, next, pairs = rawget, type, tostring, error, next, pairs
local running, getinfo, getlocal = coroutine.running, debug.getinfo, debug.getlocal
local loaded = package.loaded
local now = core.now

local prosody_host = {}

-- Prosody's modules, where the code runs inside the server.
local function prosody_api()
  local prosody = rawget(_G, "prosody")
  local async, server, timer = loaded["util.async"], loaded["net.server"], loaded["util.timer"]
  if type(prosody) == "table" and prosody.process_type == "prosody"
      and type(async) == "table" and type(async.waiter) == "function" and type(async.sleep) == "function"
      and type(server) == "table" and type(server.watchfd) == "function"
      and type(timer) == "table" and type(timer.add_task) == "function" and type(timer.stop) == "function" then
    return async, server, timer
  end
  return nil
end

--- yes = prosody_host.active(): the code runs inside a Prosody server.
function prosody_host.active()
  return prosody_api() ~= nil
end

--- yes = prosody_host.in_runner([co]): coroutine co (by default the one
-- running now) is a util.async runner's, as util.async itself finds one
-- (its runner_from_thread): the function at the bottom of the runner's
-- stack has the runner for its first local, `self`, whose thread is co.
-- async.ready() alone says only that the code runs in some coroutine: a
-- coroutine of one's own inside a runner would take the runner's wait
-- for its own yield.
function prosody_host.in_runner(co)
  co = co or running()
  if co == nil then return false end
  local level = 0
  while getinfo(co, level, "") do level = level + 1 end
  if level == 0 then return false end
  local name, runner = getlocal(co, level - 1, 1)
  return name == "self" and type(runner) == "table" and runner.thread == co
end

local OUTSIDE_RUNNER = "ratewise: a wait outside a util.async runner (a timer's callback, an event handler "
  .. "run on Prosody's main loop, a coroutine of your own) would stop the whole server (every connection, "
  .. "every timer) until it ended: call ratewise from code that runs in a runner (HTTP and stanza handlers "
  .. "do; or util.async.runner(fn):run(arg)), or start the work as a task, rw.spawn(function() ... end), "
  .. "which ratewise runs from Prosody's loop (docs/hosts.md#prosody)"

-- The driver and the waits it serves: the host registered with the seam.
local function new_host(async, server, timer)
  -- waiter -> true: { done = fn, resume = fn } of host.await, asked after
  -- a step that moved anything
  local waiters = {}
  local watch, deadline_task, soon_task = nil, nil, nil
  local stepping, kicked, seen = false, false, nil
  local step

  local function resume(w)
    local go = w.resume
    if go then
      w.resume = nil
      go()
    end
  end

  -- The next wake of the loop's timer: the scheduler's deadline, where the
  -- descriptor is watched, or the pollable's (naps while anything is in
  -- flight) where the engine has none (a poll(2) build).
  local function arm()
    if deadline_task then
      timer.stop(deadline_task)
      deadline_task = nil
    end
    local t
    if watch then t = scheduler.timeout() else t = scheduler.pollable.timeout() end
    if t then deadline_task = timer.add_task(t, function() deadline_task = nil; step() end) end
  end

  -- A step on the next turn of the loop: asked by code that must not step
  -- now (a runner, a task, the scheduler's own kick inside a step).
  local function soon()
    if soon_task then return end
    soon_task = timer.add_task(0, function() soon_task = nil; step() end)
  end

  -- A descriptor Prosody's loop will not watch (a runtime failure, said
  -- once) leaves the driver on its timer alone, napping as a poll(2)
  -- build's does: raised from here, it would fail every step after it.
  local unwatched = false
  local function start_watch()
    if watch or unwatched then return end
    local fd = scheduler.pollable.pollfd()
    if not fd then return end
    local w, err = server.watchfd(fd, function() step() end)
    if not w then
      unwatched = true
      log.write("ratewise: cannot watch the scheduler's descriptor in Prosody's loop (" .. tostring(err)
        .. "): looking on a timer instead", "warn")
      return
    end
    watch = w
  end

  -- A step, on Prosody's main thread (a callback of its loop), then the
  -- waiters whose condition came true are resumed there, after the step:
  -- a runner resumed inside it could start a transfer in the middle of
  -- the engine's poll.
  function step()
    if stepping then return end
    start_watch()
    stepping = true
    scheduler.driver_step()
    stepping = false
    local progress = scheduler.progress()
    if (progress ~= seen or kicked) and next(waiters) ~= nil then
      seen, kicked = progress, false
      local woken, n = nil, 0
      for w in pairs(waiters) do
        if w.done() then
          woken = woken or {}
          n = n + 1
          woken[n] = w
        end
      end
      for i = 1, n do
        waiters[woken[i]] = nil
        resume(woken[i])
      end
    end
    arm()
  end

  local host = {}

  --- host.wake(): something happened that a waiter may wait for (a permit
  -- released, a task finished, a task spawned): the driver looks soon.
  function host.wake()
    kicked = true
    if not stepping then soon() end
  end

  -- (util.timer runs on the wall clock under some of Prosody's network
  -- backends: a clock set back would end the sleep early)
  host.sleep = runtime.full_sleep(async.sleep)

  --- done() came true = host.await(done, deadline): in a runner, which
  -- the driver resumes once done() is true, or a timer at the deadline.
  function host.await(done, deadline)
    if done() then return true end
    local w = { done = done }
    while true do
      local left = deadline and deadline - now()
      if left and left <= 0 then return false end
      local block, go = async.waiter()
      w.resume = go
      waiters[w] = true
      local at = left and timer.add_task(left, function() resume(w) end)
      -- what the caller waits for may need a step now (a transfer just
      -- started is sent by the next)
      host.wake()
      block()
      waiters[w], w.resume = nil, nil
      if at then timer.stop(at) end
      if done() then return true end
    end
  end

  return host
end

-- Registered where Prosody is there as this module loads: a module's code
-- runs after Prosody has loaded util.async, net.server and util.timer.
do
  local async, server, timer = prosody_api()
  if async then
    local host = new_host(async, server, timer)
    runtime.register_host {
      name = "prosody",
      rank = 77,
      claims = function()
        if prosody_host.in_runner() then return host end
        error(OUTSIDE_RUNNER, 0)
      end,
    }
    scheduler.add_kick(host.wake)
    scheduler.add_spawn_watch(host.wake)
    local logger = loaded["util.logger"]
    if type(logger) == "table" and type(logger.init) == "function" then
      local write = logger.init("ratewise")
      log.set_host(function(line, level) write(level, "%s", line) end)
    end
  end
end

return prosody_host
