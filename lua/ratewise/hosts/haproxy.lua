-- The HAProxy host: ratewise inside HAProxy's Lua (lua-load), found with no
-- configuration where the `core` global is HAProxy's (core.msleep,
-- core.register_task). HAProxy runs each task (core.register_task),
-- service (core.register_service) and action (core.register_action) in a
-- coroutine of its own and resumes it only for its own yields, so a wait
-- there sleeps with core.msleep, the way HAProxy's own Lua waits: the
-- thread serves every other request meanwhile. HAProxy's Lua cannot watch
-- a descriptor of another's, so while transfers are in flight the wait
-- naps (the scheduler's drive: short naps while anything moves, longer
-- ones up to its cap while nothing does) and looks at them between naps.
-- Registered with the seam (ratewise/runtime.lua) at rank 75.
--   Where no wait is possible the wait raises an error that names the fix,
--   before anything is sent:
--   * the body of a lua-load file and an init function (core.register_init)
--     run on the Lua state's main thread, before HAProxy serves and, in
--     master-worker mode (-W, systemd's), in the master process, which
--     then forks the workers: core.msleep returns at once there, and a
--     wait that blocked would hold the start and leave the master's
--     transfers to the forked workers;
--   * a sample fetch (core.register_fetches) and a converter
--     (core.register_converters) run in a coroutine that is yieldable as
--     far as Lua can tell (coroutine.isyieldable() is true there): HAProxy
--     refuses the yield only once it reaches its own resume, and then
--     aborts the whole call with its "yield not allowed". It exposes
--     nothing a script could ask beforehand (and the fetches and the
--     converters of a request share one coroutine), so this module wraps
--     core.register_fetches and core.register_converters: the functions
--     registered after ratewise is loaded mark their coroutine while they
--     run. One registered before gets HAProxy's own error.
--   Tasks spawned from HAProxy's code (rw.spawn, outside any task) are run
--   by a driver, an HAProxy task (core.register_task) that drives the
--   scheduler while any task is live: a service or an action may spawn
--   work and return.
--   ratewise's lines (retries, warnings, the error of a task nobody joined)
--   go to HAProxy's log with core.log, as HAProxy's own Lua errors do (the
--   log servers of the configuration; standard error too, unless HAProxy
--   runs quiet).
local core = require "ratewise.core"
local log = require "ratewise.log"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"

-- (HAProxy links Lua 5.3 or 5.4, whose coroutine.running says whether the
-- thread is the main one)
local running = coroutine.running
local rawget, type, error, pcall, tostring, setmetatable, ceil, min = rawget, type, error, pcall, tostring,
  setmetatable, math.ceil, math.min

local haproxy = {}

local function core_api()
  local api = rawget(_G, "core")
  if type(api) == "table" and type(api.msleep) == "function" and type(api.register_task) == "function"
      and type(api.register_fetches) == "function" then
    return api
  end
  return nil
end

--- yes = haproxy.active(): the code runs inside HAProxy.
function haproxy.active()
  return core_api() ~= nil
end

---------------------------------------------------------------------------
-- Waiting

-- With nothing due in ratewise, a wait for another party's doing (a
-- semaphore another of HAProxy's coroutines holds) looks again this often.
local IDLE_LOOK = 0.05

local NOT_HAPROXYS = "ratewise: a wait in a coroutine of the script's own (coroutine.wrap, coroutine.create) "
  .. "inside HAProxy cannot be served: HAProxy resumes only the coroutines it runs itself, so core.msleep cannot "
  .. "yield there and comes back at once, and the wait would spin the thread. Call ratewise from the task, "
  .. "service or action itself, or make each piece of work a ratewise task (rw.spawn, rw.map) "
  .. "(docs/hosts.md#haproxy)"

-- The block of a wait: core.msleep takes whole milliseconds, and a nap
-- rounded down to 0 would hand the thread back only for HAProxy's next turn.
-- A core.msleep that comes back with HAProxy's loop clock unmoved did not
-- yield to HAProxy (a coroutine of the script's own): a wait there would
-- spin, so it raises instead.
local function msleep(seconds)
  local api = core_api()
  local before = api.now()
  api.msleep(ceil(seconds * 1000))
  local after = api.now()
  if after.sec == before.sec and after.usec == before.usec then error(NOT_HAPROXYS, 0) end
end

-- A step runs where nothing can yield: HAProxy interrupts its coroutines
-- every tune.lua.forced-yield instructions, and another coroutine stepping
-- the scheduler meanwhile would find a step half done (the transfers one
-- poll reported, not yet handed to their owners).
local run_unyielding, step = core.unyielding, scheduler.step
local function step_whole()
  run_unyielding(step, 0, false)
end

local WAY = { block = msleep, step = step_whole, sees_fd = false, idle = IDLE_LOOK }

local function call(fn) return fn() end

-- A wait drives the scheduler until done() is true or the deadline has
-- passed, looking at its transfers between naps.
local function await(done, deadline)
  return scheduler.drive(WAY, call, done, deadline)
end

-- A sleep is core.msleep, and never comes back before its end: HAProxy's
-- clock is the one of its loop's last turn, so a core.msleep may end a
-- little early, and the rest is slept then. It need not drive the
-- scheduler: the tasks have their driver (below), and a transfer outside
-- any task has its waiter.
local sleep = runtime.full_sleep(msleep)

-- The host also keeps, for this Lua state: unyielding, coroutine ->
-- "fetch" | "converter" while one of HAProxy's runs in it (weak: a
-- coroutine HAProxy drops goes); driving, whether the driver of spawned
-- tasks runs.
local host = { name = "haproxy", rank = 75, sleep = sleep, await = await,
  unyielding = setmetatable({}, { __mode = "k" }), driving = false }

---------------------------------------------------------------------------
-- Where no wait is possible

local AT_START = "ratewise: a wait in the body of a lua-load file or in an init function (core.register_init) "
  .. "cannot be served: HAProxy runs them before it serves (in master-worker mode, in the master process), "
  .. "where it cannot yield and core.msleep does not wait. Call ratewise from a task instead "
  .. "(core.register_task(fn) runs fn once HAProxy serves), or from a service or an action "
  .. "(docs/hosts.md#haproxy)"

local function in_fetch(what)
  return "ratewise: a wait in an HAProxy " .. what .. " cannot be served: HAProxy does not let a " .. what
    .. " yield (it would abort it with \"yield not allowed\"), and blocking would hold every request of the "
    .. "thread. Call ratewise from a task (core.register_task), a service (core.register_service) or an "
    .. "action (core.register_action), and hand its result on in a variable (txn:set_var) "
    .. "(docs/hosts.md#haproxy)"
end
local IN_FETCH = { fetch = in_fetch("sample fetch"), converter = in_fetch("converter") }

local function leave(co, outer, ok, ...)
  host.unyielding[co] = outer
  if not ok then error((...), 0) end
  return ...
end

-- fn, marked while it runs; an error it raises goes on to HAProxy as it was.
local function marked(fn, what)
  return function(...)
    local co, unyielding = running(), host.unyielding
    local outer = unyielding[co]
    unyielding[co] = what
    return leave(co, outer, pcall(fn, ...))
  end
end

local function wrap_registration(api, key, what)
  local register = api[key]
  api[key] = function(name, fn, ...)
    if type(fn) == "function" then fn = marked(fn, what) end
    return register(name, fn, ...)
  end
end

function host.claims()
  if not haproxy.active() then return nil end
  local co, main = running()
  if main then error(AT_START, 0) end
  local what = host.unyielding[co]
  if what then error(IN_FETCH[what], 0) end
  return true
end

---------------------------------------------------------------------------
-- The driver of spawned tasks

local function no_task_left()
  return scheduler.live() == 0
end

-- The driver naps IDLE_LOOK at most: a core.msleep cannot be cut short,
-- and a task that HAProxy's code spawns, cancels or hands a permit while
-- the driver naps is then run within that time, not at the driver's next
-- timer (a task's 60 s sleep, say).
local DRIVER_WAY = { block = function(seconds) msleep(min(seconds or IDLE_LOOK, IDLE_LOOK)) end, step = step_whole,
  sees_fd = false, idle = IDLE_LOOK }

local function drive_tasks()
  local ok, err = pcall(scheduler.drive, DRIVER_WAY, no_task_left)
  host.driving = false
  if not ok then log.write("ratewise: the driver's step failed: " .. tostring(err), "error") end
end

-- (a task spawned, or made ready, from outside any task:
-- scheduler.add_spawn_watch)
local function spawned()
  if host.driving then return end
  local api = core_api()
  if not api then return end
  host.driving = true
  api.register_task(drive_tasks)
end

---------------------------------------------------------------------------
-- The lines

local LOG_LEVEL = { info = "info", warn = "warning", error = "err" }

--- haproxy.log(line, level): a line of ratewise's log (ratewise/log.lua)
-- through core.log, at HAProxy's level of that name.
function haproxy.log(line, level)
  local api = core_api()
  api.log(api[LOG_LEVEL[level]], line)
end

-- Registered where HAProxy's `core` is there as this module loads: HAProxy
-- sets it up before any lua-load file runs, and a wait elsewhere need not
-- ask.
do
  local api = core_api()
  if api then
    wrap_registration(api, "register_fetches", "fetch")
    wrap_registration(api, "register_converters", "converter")
    runtime.register_host(host)
    scheduler.add_spawn_watch(spawned)
    log.set_host(haproxy.log)
  end
end

return haproxy
