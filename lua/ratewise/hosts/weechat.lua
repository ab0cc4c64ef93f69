-- The WeeChat host: ratewise inside a WeeChat script (its Lua plugin),
-- found with no configuration where the `weechat` global is WeeChat's API
-- (weechat.hook_fd and weechat.hook_timer). Every script runs from
-- WeeChat's one loop, and WeeChat calls a script's code (its load, its
-- commands, its hooks' callbacks) from C, where a Lua function cannot
-- yield: the only wait possible there would block the input, the screen
-- and every other script until it ended.
--   So ratewise's tasks run from WeeChat's loop: one driver per scheduler
--   steps them, through a hook_fd on the scheduler's descriptor (read) and
--   a one-shot hook_timer for its next deadline (where the engine has no
--   descriptor, a poll(2) build, the timer alone, napping while transfers
--   are in flight). Both call one global function, whose name is
--   CALLBACK: WeeChat names a script's callbacks by global function name.
--   A task spawned by the script's code (or made ready by it: cancelled,
--   given a permit) arms the driver at once (scheduler.add_spawn_watch),
--   and with nothing pending the driver unhooks both: an idle client pays
--   nothing.
--   A wait outside a task (a bare rw.fetch from a command) raises, naming
--   rw.spawn: registered with the seam (ratewise/runtime.lua) at rank 74.
--   WeeChat gives each script a Lua state of its own (luaL_newstate per
--   script): ratewise, its scheduler, its engine and its buckets are each
--   script's own. The drivers are kept in the Lua registry, where a copy of
--   this module loaded again (a reloaded ratewise.hosts.weechat) finds the
--   one its scheduler has, and the global function finds them all.
--   ratewise's lines go to WeeChat's core buffer (ratewise/log.lua):
--   WeeChat replaces standard error, and a write there crashed WeeChat 3.8.
local scheduler = require "ratewise.scheduler"
local core = require "ratewise.core"
local log = require "ratewise.log"
local runtime = require "ratewise.runtime"

local rawget, rawset, type, pcall, tostring, error = rawget, rawset, type, pcall, tostring, error
local ceil, max = math.ceil, math.max
local now = core.now

local weechat = {}

-- The global function every hook of the drivers calls (data: "<id>:fd" or
-- "<id>:timer"), and where the drivers are kept.
local CALLBACK = "ratewise_weechat_driver_callback"
local REGISTRY_KEY = "ratewise.hosts.weechat"

local function weechat_api()
  local api = rawget(_G, "weechat")
  if type(api) == "table" and type(api.hook_fd) == "function" and type(api.hook_timer) == "function" then
    return api
  end
  return nil
end

--- yes = weechat.active(): the code runs inside WeeChat.
function weechat.active()
  return weechat_api() ~= nil
end

-- The drivers of this Lua state: by the scheduler's pollable, and by id
-- (what a hook's data names).
local function drivers()
  local registry = debug.getregistry()
  local all = registry[REGISTRY_KEY]
  if not all then
    all = { by_pollable = {}, by_id = {}, n = 0 }
    registry[REGISTRY_KEY] = all
  end
  return all
end

local NOT_REGISTERED = "ratewise: WeeChat refused to hook the driver that runs ratewise's tasks (%s): "
  .. "call weechat.register(...) before the script's first rw.spawn"

-- A hook's pointer, or the error that names why there is none: WeeChat
-- answers nothing, or "", for a hook it did not make (a script that has
-- not called weechat.register yet).
local function hooked(hook, what)
  if type(hook) ~= "string" or hook == "" then error(NOT_REGISTERED:format(what), 0) end
  return hook
end

local function new_driver(api, id)
  -- An engine without a descriptor to watch (a poll(2) build) says in the
  -- pollable's timeout when to look again: the timer alone drives it.
  local fd = scheduler.pollable.pollfd()
  local fd_data, timer_data = id .. ":fd", id .. ":timer"
  -- fd_hook, timer_hook: WeeChat's pointers while hooked; timer_due: when
  -- the timer fires (monotonic seconds); stepping: a step runs (a task in
  -- it may make WeeChat run hooks: the step arms the driver when it ends)
  local driver = { id = id, fd = fd, fd_hook = nil, timer_hook = nil, timer_due = nil, stepping = false }

  local function unhook_timer()
    if driver.timer_hook then
      api.unhook(driver.timer_hook)
      driver.timer_hook, driver.timer_due = nil, nil
    end
  end

  --- driver.arm(): hooks what the scheduler needs now, or nothing when
  -- nothing is pending.
  function driver.arm()
    if driver.stepping then return end
    if scheduler.live() == 0 and not scheduler.has_work() then
      if driver.fd_hook then
        api.unhook(driver.fd_hook)
        driver.fd_hook = nil
      end
      return unhook_timer()
    end
    if fd and not driver.fd_hook then
      driver.fd_hook = hooked(api.hook_fd(fd, 1, 0, 0, CALLBACK, fd_data), "hook_fd")
    end
    -- with the descriptor hooked, the scheduler's own deadline; without
    -- one, the pollable's, which naps while transfers are in flight
    local t
    if fd then t = scheduler.timeout() else t = scheduler.pollable.timeout() end
    -- nil: only the descriptor, or another party, can change anything
    if t == nil then return end
    -- WeeChat's timers count whole milliseconds, at least one: 0 (tasks
    -- ready) is the next turn of WeeChat's loop, after its own input
    local ms = max(1, ceil(t * 1000))
    local due = now() + ms / 1000
    if driver.timer_hook then
      if driver.timer_due <= due then return end -- it fires sooner, and the step then arms again
      unhook_timer()
    end
    driver.timer_hook = hooked(api.hook_timer(ms, 0, 1, CALLBACK, timer_data), "hook_timer")
    driver.timer_due = due
  end

  --- driver.wake(kind): a hook fired ("fd" or "timer"): one step, then arm.
  function driver.wake(kind)
    -- a one-shot timer that fires is unhooked by WeeChat once its callback returns
    if kind == "timer" then driver.timer_hook, driver.timer_due = nil, nil end
    if driver.stepping then return end
    driver.stepping = true
    scheduler.driver_step()
    driver.stepping = false
    local armed, why = pcall(driver.arm)
    if not armed then log.write(tostring(why), "error") end
  end

  -- code outside any task spawned a task, or made one ready
  scheduler.add_spawn_watch(driver.arm)
  return driver
end

-- What every hook of the drivers calls: the driver its data names steps.
local function on_hook(data)
  local api = weechat_api()
  local all = debug.getregistry()[REGISTRY_KEY]
  local id, kind = tostring(data):match("^(%d+):(%a+)$")
  local driver = all and id and all.by_id[id]
  if driver then driver.wake(kind) end
  return api and api.WEECHAT_RC_OK or 0
end

--- driver = weechat.start(): the driver of this Lua state's scheduler,
-- made on the first call; every later call (a copy of this module loaded
-- again, say) answers the same. It hooks nothing until a task is spawned.
function weechat.start()
  local api = weechat_api()
  if not api then error("ratewise.hosts.weechat: not running inside WeeChat (no weechat.hook_fd)", 2) end
  local all = drivers()
  local driver = all.by_pollable[scheduler.pollable]
  if not driver then
    all.n = all.n + 1
    local id = tostring(all.n)
    driver = new_driver(api, id)
    all.by_pollable[scheduler.pollable], all.by_id[id] = driver, driver
  end
  rawset(_G, CALLBACK, on_hook)
  return driver
end

-- Registered where WeeChat's API is there as this module loads: WeeChat
-- sets the global up before a script runs, and a wait elsewhere need not
-- ask.
if weechat.active() then
  runtime.register_host {
    name = "weechat",
    rank = 74,
    claims = weechat.active,
    blocking = "raise",
    says = "ratewise: a wait outside a task (a bare rw.fetch, rw.sleep, rw.run or task:join() in a command, "
      .. "a hook's callback or the script's body) cannot wait in WeeChat: WeeChat calls that code from C, where "
      .. "a wait could only block the input, the screen and every other script until it ended. Call ratewise "
      .. "from rw.spawn(function() ... end): the task runs from WeeChat's loop at once, and prints or keeps its "
      .. "result itself, as a callback of WeeChat's own hook_process(\"url:...\") would (docs/hosts.md#weechat)",
  }
  weechat.start()
end

return weechat
