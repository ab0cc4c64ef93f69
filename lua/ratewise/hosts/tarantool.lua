-- The Tarantool host: ratewise in a Tarantool instance, found with no
-- configuration where Tarantool's built-in `fiber` module is loaded (it is
-- from the start) and its `box` global is there. Every fiber runs on one
-- event loop; a wait of any fiber's code (a bare rw.fetch, a sleep, a join)
-- waits that fiber alone, as Tarantool's own http.client does, and the
-- other fibers run meanwhile:
--   sleep: fiber.sleep;
--   a transfer, a descriptor, a join, a semaphore, a group of tasks: the
--   fiber waits on a fiber.cond of its own, signalled by one driver fiber
--   per Lua state ("ratewise driver"), which runs the scheduler and waits
--   on its descriptor with socket.iowait (ratewise/hosts/driven.lua): a
--   thousand waiting fibers make one iowait, not a thousand. A wait that
--   needs the driver at once (a transfer just started) wakes it from its
--   iowait with fiber:wakeup;
--   ratewise's tasks (rw.spawn from any fiber, rw.run, rw.map): the
--   driver runs them all, started as soon as a fiber spawns one, and stays
--   while any lives;
--   a wait inside a box transaction raises: the fiber's yield would abort
--   a memtx transaction, which then fails at commit;
--   ratewise's lines go to Tarantool's log (its `log` module).
-- Registered with the seam (ratewise/runtime.lua) at rank 55: before the
-- host of a coroutine nested in a task (60), since another fiber may call
-- ratewise while the driver is inside a task that waits for Tarantool
-- itself (a box write waits for the WAL): that call is no nested
-- coroutine's, and waits its own fiber.
local driven = require "ratewise.hosts.driven"
local log = require "ratewise.log"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"

local rawget, type, tostring, pcall, error = rawget, type, tostring, pcall, error
local loaded = package.loaded

local tarantool = {}

local function fiber_module()
  local fiber = loaded.fiber
  if type(fiber) == "table" and type(fiber.sleep) == "function" and type(fiber.cond) == "function"
      and type(fiber.new) == "function" and type(fiber.id) == "function" then
    return fiber
  end
  return nil
end

--- yes = tarantool.active(): the code runs inside Tarantool.
function tarantool.active()
  return fiber_module() ~= nil and type(rawget(_G, "box")) == "table"
end

local IN_TRANSACTION = "ratewise: cannot wait inside a box transaction (box.begin() ... box.commit()): the "
  .. "fiber's yield would abort a memtx transaction, which then fails at commit. Call ratewise before "
  .. "box.begin() or after box.commit() (docs/hosts.md#tarantool)"

-- Whether the fiber running now is inside a box transaction (box.is_in_txn
-- is there once box.cfg has run; before, no transaction can be).
local function in_transaction()
  local is_in_txn = rawget(rawget(_G, "box"), "is_in_txn")
  return is_in_txn ~= nil and is_in_txn() == true
end

local HOST_WAIT = "ratewise: a ratewise task waited for Tarantool itself (fiber.sleep, http.client, a box write, "
  .. "a socket): it holds the driver fiber that runs every task, so the tasks wait meanwhile. Do such work in a "
  .. "fiber of its own (fiber.create), calling rw.fetch there, or wait with rw.sleep inside tasks "
  .. "(docs/hosts.md#tarantool)"

local LEVELS = { info = "info", warn = "warn", error = "error" }

--- tarantool.log(line, level): a line of ratewise's (ratewise/log.lua) in
-- Tarantool's log, beside the instance's own lines (its file or standard
-- error, as box.cfg{log = ...} says).
function tarantool.log(line, level)
  local say = require("log")[LEVELS[level] or "info"]
  say("%s", line) -- a line is not a format: a % in a URL stays as it is
end

local host -- made at the first wait, or as a fiber first spawns a task

local function make_host(fiber)
  local socket = require "socket"
  local iowait, testcancel = socket.iowait, fiber.testcancel
  local fd = scheduler.engine():pollfd() -- (none in a poll(2) build: the driver naps)
  -- The driver's fiber; blocked while it waits in iowait (a wakeup then
  -- ends that wait, where elsewhere it would cut short a task's own
  -- fiber.sleep); kicked when a kick came while it was not blocked, so
  -- that its next wait does not sleep through it.
  local driver_fiber, driver_id, blocked, kicked = nil, nil, false, false

  local function spawn(fn)
    local f = fiber.new(function()
      driver_fiber, driver_id = fiber.self(), fiber.id()
      local ok, err = pcall(fn)
      driver_fiber, driver_id, blocked = nil, nil, false
      if not ok then
        -- (a driver whose fiber was killed, fiber.kill, is replaced by
        -- driven.lua's, while the waiting fibers and tasks still need one)
        if not pcall(testcancel) then
          log.write("ratewise: the driver fiber was cancelled (" .. tostring(err) .. "); a new one takes over",
            "warn")
        else
          log.write("ratewise: the driver fiber failed: " .. tostring(err), "error")
        end
      end
    end)
    f:name("ratewise driver")
    return true
  end

  local made = driven.new {
    spawn = spawn,
    signal = fiber.cond,
    wait = function(cond, seconds)
      cond:wait(seconds)
      -- a cancelled fiber's wait ends there (its wait returns at once from
      -- then on), as its fiber.sleep would: the transfer is aborted
      testcancel()
    end,
    post = function(cond) cond:signal() end,
    block = function(_, seconds)
      if kicked then
        kicked = false
        return
      end
      blocked = true
      if fd then iowait(fd, "R", seconds) else fiber.sleep(seconds) end
      blocked = false
      testcancel() -- a killed driver's iowait returns at once: it must not spin
    end,
    post_kick = function()
      if blocked then
        blocked = false
        driver_fiber:wakeup()
      else
        kicked = true
      end
    end,
    watches_fd = fd ~= nil,
    tasks_stay = true,
    loop_time = fiber.clock,
    host_wait_warning = HOST_WAIT,
  }
  -- A fiber.sleep ends early when another fiber wakes the sleeper
  -- (fiber:wakeup): a Retry-After would be cut short.
  made.sleep = runtime.full_sleep(function(seconds) fiber.sleep(seconds) end)

  -- The host of the fiber running now: none in the driver's own fiber
  -- inside a task (a coroutine of a task's, which the host of rank 60
  -- refuses), a refusal in a box transaction.
  function made.claims(in_task)
    if in_task and fiber.id() == driver_id then return nil end
    if in_transaction() then error(IN_TRANSACTION, 0) end
    return made
  end
  return made
end

--- host = tarantool.host(): the host of this Lua state.
function tarantool.host()
  if not host then host = make_host(fiber_module()) end
  return host
end

-- Registered where Tarantool is there as this module loads: its `fiber`
-- module and `box` are there from the start, before any Lua code of the
-- instance runs, and a wait elsewhere need not ask.
if tarantool.active() then
  log.set_host(tarantool.log)
  runtime.register_host {
    name = "tarantool",
    rank = 55,
    claims = function(in_task) return tarantool.host().claims(in_task) end,
  }
  -- a task spawned by a fiber's code runs from the driver, started now
  -- (a running driver may be parked in its iowait until its next timer:
  -- it is woken too, for a task made ready by a fiber's code)
  scheduler.add_spawn_watch(function()
    local made = tarantool.host()
    made.start()
    made.kick()
  end)
  scheduler.add_kick(function() if host then host.kick() end end)
end

return tarantool
