-- The mpv host: ratewise inside an mpv script (mpv's Lua, PUC 5.2), found
-- with no configuration where mpv's `mp` module is there (the `mp` global,
-- or package.loaded.mp, with mp.add_timeout and mp.get_time). Each script
-- has a Lua state and a thread of its own, whose event loop runs the
-- script's key bindings, event handlers, property observers and timers one
-- after the other.
--   A script can only count time: mpv gives it no way to watch a
--   descriptor. So one driver per Lua state steps ratewise's scheduler from
--   a one-shot mp.add_timeout, due at the scheduler's next deadline, or
--   after its nap while transfers are in flight (the pollable's timeout,
--   which a host that cannot see the descriptor is told), and armed no
--   more when nothing is pending: an idle player costs nothing. A task that
--   script code spawns, cancels or hands a permit (scheduler.add_spawn_watch),
--   and anything else of the kind that code does (scheduler.add_kick: a
--   permit freed, an event set), arm it at once.
--   A wait outside a task (a bare rw.fetch from a key binding or an event
--   handler) would hold the script's event loop for all of its time, so it
--   raises with the fix instead, before anything is sent (mpv's own
--   mp.command_native_async runs a command without blocking likewise, and
--   calls back).
--   ratewise's lines (retries, warnings, errors of tasks nobody joined) go
--   to mpv's log through mp.msg, prefixed with the script's name as mpv
--   does: where --msg-level, --log-file and the terminal take them.
local scheduler = require "ratewise.scheduler"
local log = require "ratewise.log"
local runtime = require "ratewise.runtime"

local rawget, type = rawget, type

local mpv = {}

-- mpv's `mp`, where this is an mpv script: set up before the script's first
-- line runs, and there for as long as its Lua state.
local function find_mp()
  local mp = rawget(_G, "mp")
  if type(mp) ~= "table" then mp = package.loaded.mp end
  if type(mp) == "table" and type(mp.add_timeout) == "function" and type(mp.get_time) == "function"
      and type(mp.command_native_async) == "function" then
    return mp
  end
  return nil
end

-- The driver: what steps the scheduler from the script's event loop.
local function new_driver(mp)
  local timer, due = nil, nil -- the step armed, and when it is due on mp's clock
  local stepping = false
  local driver = {}
  local step

  -- The step due at most `seconds` from now: a step already due sooner
  -- stays.
  local function arm_in(seconds)
    local at = mp.get_time() + seconds
    if timer then
      if due <= at then return end
      timer:kill()
    end
    due = at
    timer = mp.add_timeout(seconds, step)
  end

  -- After a step: the next at the scheduler's next deadline (its nap while
  -- transfers are in flight), or none when nothing is pending.
  local function arm()
    local seconds = scheduler.pollable.timeout()
    if seconds then
      arm_in(seconds)
    elseif timer then
      timer:kill()
      timer = nil
    end
  end

  function step()
    timer = nil
    stepping = true
    scheduler.driver_step()
    stepping = false
    arm()
  end

  --- driver.soon(): a step on the next turn of the script's event loop (a
  -- task spawned, cancelled or handed a permit), unless a step runs now: it
  -- arms the next when it ends.
  function driver.soon()
    if not stepping then arm_in(0) end
  end

  --- yes = driver.armed(): whether a step is due (none when nothing is
  -- pending).
  function driver.armed()
    return timer ~= nil
  end

  return driver
end

-- Registered where mpv's `mp` is there as this module loads, and a wait
-- elsewhere need not ask. Every wait outside a task in a script is on its
-- event loop's thread (a coroutine of the script's own too: nothing else
-- would resume it).
local mp = find_mp()
if mp then
  mpv.driver = new_driver(mp)
  scheduler.add_spawn_watch(mpv.driver.soon)
  scheduler.add_kick(mpv.driver.soon)
  runtime.register_host {
    name = "mpv",
    rank = 78,
    claims = function() return true end,
    blocking = "raise",
    says = "ratewise: a wait outside a task (a bare rw.fetch, rw.sleep, rw.run, task:join()) would hold this mpv "
      .. "script's event loop (its key bindings, events, observers and timers) for all of its time: call "
      .. "rw.spawn(function() ... end) instead, whose tasks ratewise.hosts.mpv steps from mp.add_timeout, and "
      .. "act on the result inside the task, as mpv's own mp.command_native_async calls back (docs/hosts.md#mpv)",
  }
  -- mp.msg has a function for each of ratewise's levels (info, warn, error)
  log.set_host(function(line, level) mp.msg[level](line) end)
end

return mpv
