-- A Tarantool instance's script (spec/host_tarantool_spec.lua runs it
-- headless: tarantool script.lua MODE BASE RESULTS LUA_PATH CPATH), written
-- as a user would: ratewise found on package.path/cpath, called from
-- fibers, with no adapter code. Modes:
--   scenario     the shared scenario (spec/support/hosts/scenario.lua), its
--                "at once" calls made from fibers of their own, while
--                another fiber ticks fiber.sleep(TICK) and records how late
--                it woke at worst ("late <seconds>")
--   twenty       20 fibers each fetch the 1 s route ("twenty ok seconds cpu")
--   configured   the same, after rw.configure{sleep = fiber.sleep}
--   spawned      a task spawned by a fiber's code (rw.spawn, no wait of its
--                own) fetches ("spawned status seconds 0")
--   held         a fiber fetches while a task holds the driver, waiting for
--                Tarantool itself ("held status seconds 0")
--   cancelled    a waiting fiber cancelled ("cancelled <its error>", then
--                "drivers <n>" left), and a fetch whose driver fiber is
--                killed ("killed_driver status seconds 0")
--   woken        fibers waiting in rw.sleep(0.5) and a fetch, woken by
--                fiber:wakeup after 0.1 s ("slept 1 seconds 0", "fetched
--                status seconds 0")
--   transaction  a fetch inside box.begin() ... box.commit() ("refused <error>"),
--                one after it, whose row is written ("after status rows 0")
-- Each ends with a "done" line, then the instance exits.
-- luacheck: read globals box
local mode, base, results, lua_path, cpath = arg[1], arg[2], arg[3], arg[4], arg[5]
package.path = lua_path .. ";" .. package.path
package.cpath = cpath .. ";" .. package.cpath

local fiber = require "fiber"
local clock = require "clock"
local scenario = require "scenario"
local rw = require "ratewise"

local TICK = 0.02

local function record(line) scenario.record(results, line) end

-- fn(i) for i = 1..n, each in a fiber of its own; returns when all have.
local function in_fibers(n, fn)
  local ended = fiber.channel(n)
  for i = 1, n do
    fiber.create(function()
      local ok, err = pcall(fn, i)
      ended:put(ok or tostring(err))
    end)
  end
  for _ = 1, n do
    local outcome = ended:get()
    if outcome ~= true then error(outcome, 0) end
  end
end

local function fetch_slow_in_fibers(name, n)
  local ok, started, cpu = 0, clock.monotonic(), scenario.cpu_seconds()
  in_fibers(n, function()
    local res = rw.fetch(base .. "/rh/slow")
    if res and res.status == 200 then ok = ok + 1 end
  end)
  record(("%s %d %.3f %.3f"):format(name, ok, clock.monotonic() - started, scenario.cpu_seconds() - cpu))
end

local function run()
  if mode == "scenario" then
    local running, worst = true, 0
    fiber.create(function()
      while running do
        local before = clock.monotonic()
        fiber.sleep(TICK)
        local late = clock.monotonic() - before - TICK
        if late > worst then worst = late end
      end
    end)
    scenario.run { base = base, results = results, together = in_fibers }
    running = false
    record(("late %.4f"):format(worst))
    return
  elseif mode == "twenty" then
    fetch_slow_in_fibers("twenty", 20)
  elseif mode == "configured" then
    rw.configure { sleep = fiber.sleep }
    fetch_slow_in_fibers("configured", 10)
  elseif mode == "spawned" then
    local ended, started = fiber.cond(), clock.monotonic()
    local status
    rw.spawn(function()
      local res = rw.fetch(base .. "/rh/slow")
      status = res and res.status or 0
      ended:signal()
    end)
    ended:wait(10)
    record(("spawned %d %.3f 0"):format(status or 0, clock.monotonic() - started))
  elseif mode == "parked" then
    -- a task sleeping 5 s parks the driver in its iowait; a fiber's code
    -- then spawns a task, releases a permit a task waits for and cancels a
    -- sleeping task: each goes on at once, not at the driver's next timer
    rw.spawn(function() rw.sleep(5) end)
    local gate = rw.semaphore(1)
    gate:acquire(0)
    local at = {}
    local waiter = rw.spawn(function() gate:acquire(); at.released = clock.monotonic() end)
    local sleeper = rw.spawn(function() rw.sleep(20) end)
    fiber.sleep(0.2)
    local started = clock.monotonic()
    rw.spawn(function() at.spawned = clock.monotonic() end)
    gate:release()
    sleeper:cancel()
    fiber.sleep(0.3)
    local function took(t) return t and t - started or 99 end
    record(("parked %.3f %.3f %s"):format(took(at.spawned), took(at.released), sleeper:status()))
    waiter:cancel()
  elseif mode == "held" then
    -- a task that waits for Tarantool itself holds the driver (here a
    -- fiber.sleep inside it); another fiber's fetch meanwhile waits its own
    -- fiber, and ends once the driver is free
    local started = clock.monotonic()
    rw.spawn(function() fiber.sleep(0.5) end)
    fiber.sleep(0.1)
    local status
    in_fibers(1, function() status = rw.fetch(base .. "/rh/ping").status end)
    record(("held %d %.3f 0"):format(status, clock.monotonic() - started))
  elseif mode == "cancelled" then
    local function drivers()
      local n = 0
      for _, f in pairs(fiber.info()) do
        if f.name == "ratewise driver" then n = n + 1 end
      end
      return n
    end
    -- a fiber cancelled while it waits
    local outcome
    local waiting = fiber.create(function()
      local ok, err = pcall(rw.fetch, base .. "/rh/slow")
      outcome = ok and "served" or tostring(err)
    end)
    fiber.sleep(0.2)
    waiting:cancel()
    fiber.sleep(0.1)
    record("cancelled " .. tostring(outcome))
    record("drivers " .. drivers())
    -- the driver's fiber killed while a fetch waits
    local started, ended = clock.monotonic(), fiber.channel(1)
    fiber.create(function() ended:put(rw.fetch(base .. "/rh/slow").status) end)
    fiber.sleep(0.2)
    for _, f in pairs(fiber.info()) do
      if f.name == "ratewise driver" then fiber.kill(f.fid) end
    end
    record(("killed_driver %d %.3f 0"):format(ended:get(5) or 0, clock.monotonic() - started))
  elseif mode == "woken" then
    -- a fiber in rw.sleep, and one waiting for a transfer, woken by another
    -- fiber's code (fiber:wakeup) long before their waits end
    local started, ended = clock.monotonic(), fiber.channel(2)
    local sleeper = fiber.create(function()
      rw.sleep(0.5)
      ended:put(("slept 1 %.3f 0"):format(clock.monotonic() - started))
    end)
    local fetcher = fiber.create(function()
      local res = rw.fetch(base .. "/rh/slow")
      ended:put(("fetched %d %.3f 0"):format(res.status, clock.monotonic() - started))
    end)
    fiber.sleep(0.1)
    sleeper:wakeup()
    fetcher:wakeup()
    record(ended:get(5))
    record(ended:get(5))
  elseif mode == "transaction" then
    box.cfg {} -- (its files in the directory the instance runs in; its log on standard error)
    local space = box.schema.space.create("calls")
    space:create_index("pk")
    box.begin()
    space:replace { 1 }
    local ok, err = pcall(rw.fetch, base .. "/rh/slow")
    box.commit()
    record("refused " .. (ok and "nothing" or tostring(err)))
    -- after the commit the call is made, its retry line in the instance's log
    local res = rw.fetch(base .. "/rh/429/0")
    space:replace { 2, res.status }
    record(("after %d %d 0"):format(res.status, space:get(1) and 2 or 1))
  end
  record("done")
end

local ok, err = pcall(run)
if not ok then record("error " .. tostring(err):gsub("\n", " ")) end
os.exit(0)
