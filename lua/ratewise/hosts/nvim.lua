-- The Neovim host: ratewise inside Neovim's Lua (LuaJIT), one Lua state that
-- every plugin shares, found with no configuration: loaded (by
-- require "ratewise") where the `vim` global is Neovim's, it starts its
-- driver and registers with the seam (ratewise/runtime.lua, rank 70) as a
-- host whose loop a wait outside a task blocks: said once in the log.
--   One driver per Lua state runs the scheduler from vim.loop (libuv): a
--   poll handle on the scheduler's descriptor, a timer for its next
--   deadline, and a prepare handle, run before each wait of the loop, that
--   notices tasks spawned since the last step. A handle's callback is a
--   fast event, where Neovim refuses most of its API (E5560), so the
--   callbacks only ask for a step, and the step comes through vim.schedule:
--   every task is resumed there, and may write a buffer.
--   libuv refuses a second poll handle on one descriptor (EEXIST): the
--   driver is kept in the Lua registry, where every plugin finds it, and so
--   does a copy of this module loaded again (a plugin reloader).
--   ratewise's lines (retries, errors of tasks nobody joined) go to
--   vim.notify (the host's sink, ratewise/log.lua); JSON is read by vim.json where lua-cjson
--   cannot be loaded, its vim.NIL answered as rw.null (ratewise/json.lua).
local scheduler = require "ratewise.scheduler"
local json = require "ratewise.json"
local log = require "ratewise.log"
local runtime = require "ratewise.runtime"

local rawget, type, pcall, tostring, error, ceil = rawget, type, pcall, tostring, error, math.ceil

local nvim = {}

local REGISTRY_KEY = "ratewise.hosts.nvim"

local function vim_api()
  local vim = rawget(_G, "vim")
  if type(vim) == "table" and type(vim.loop) == "table" and type(vim.schedule) == "function"
      and type(vim.in_fast_event) == "function" then
    return vim
  end
  return nil
end

--- yes = nvim.active(): the code runs inside Neovim.
function nvim.active()
  return vim_api() ~= nil
end

local NOTIFY_LEVEL = { info = "INFO", warn = "WARN", error = "ERROR" }

local function notify_now(vim, line, level)
  local ok = pcall(vim.notify, line, vim.log.levels[NOTIFY_LEVEL[level]], { title = "ratewise" })
  -- a vim.notify of a plugin that raises: the line is not lost
  if not ok then io.stderr:write(line, "\n") end
end

--- nvim.notify(line, level): a line of ratewise's log (ratewise/log.lua)
-- through vim.notify, which a fast event may not call: from there, through
-- vim.schedule.
function nvim.notify(line, level)
  local vim = vim_api()
  if vim.in_fast_event() then
    vim.schedule(function() notify_now(vim, line, level) end)
  else
    notify_now(vim, line, level)
  end
end

-- The driver: what runs the scheduler, kept per scheduler (a ratewise
-- loaded again, with its package.loaded entries gone, is a scheduler of
-- its own, on a descriptor of its own).
local function new_driver(vim)
  local uv = vim.loop
  -- An engine without a descriptor to watch (a poll(2) build) says in its
  -- timeout when to look again: the timer alone drives it.
  local fd = scheduler.pollable.pollfd()
  local poll, why
  if fd then
    poll, why = uv.new_poll(fd)
    if not poll then
      error("ratewise: cannot watch the scheduler's descriptor in Neovim's loop (" .. tostring(why) .. "): another "
        .. "poll handle watches it already (the luv adapter of docs/hosts.md?); in Neovim ratewise drives itself", 0)
    end
  end
  local timer, prepare = uv.new_timer(), uv.new_prepare()
  local driver = { fd = fd }
  -- scheduled: a step is queued with vim.schedule; stepping: a step runs
  -- (a task inside it that lets Neovim handle events, vim.wait, may see
  -- the callbacks come again: the step on the stack arms the handles when
  -- it returns)
  local scheduled, stepping = false, false
  local step

  -- From a fast event: ask for a step, once, and leave the handles quiet
  -- until it has run (the descriptor stays readable until then).
  local function request()
    if scheduled then return end
    scheduled = true
    if poll then poll:stop() end
    timer:stop()
    vim.schedule(step)
  end

  local function arm()
    if scheduled then return end
    -- without a descriptor to watch, the pollable's timeout: naps while
    -- anything is in flight
    local t = poll and scheduler.timeout() or scheduler.pollable.timeout()
    timer:stop()
    -- 0 (ready tasks, or a step whose budget ran out) is the next turn of
    -- the loop, after it has read the keyboard: the editor stays responsive
    if t then timer:start(ceil(t * 1000), 0, request) end
    if poll then poll:start("r", request) end
  end

  function step()
    scheduled = false
    if stepping then return end
    stepping = true
    scheduler.driver_step()
    stepping = false
    arm()
  end

  prepare:start(function()
    if not scheduled and not stepping and scheduler.live() > 0 and scheduler.timeout() == 0 then request() end
  end)
  arm()
  return driver
end

--- driver = nvim.start(): the driver of this Lua state, started on the
-- first call; every later call, from any plugin, answers the same.
function nvim.start()
  local vim = vim_api()
  if not vim then error("ratewise.hosts.nvim: not running inside Neovim (no vim.loop)", 2) end
  local registry = debug.getregistry()
  local drivers = registry[REGISTRY_KEY]
  if not drivers then
    drivers = {}
    registry[REGISTRY_KEY] = drivers
  end
  local driver = drivers[scheduler.pollable]
  if not driver then
    driver = new_driver(vim)
    drivers[scheduler.pollable] = driver
  end
  return driver
end

-- vim.json (Neovim's own copy of lua-cjson) reads JSON where lua-cjson is
-- not installed; its null, vim.NIL, is answered as rw.null (the value a
-- plugin sees whichever decoder ran), and a vim.NIL in a `json` option is
-- written as null.
do
  local vim = vim_api()
  if vim and type(vim.json) == "table" then json.set_fallback { decode = vim.json.decode, null = vim.NIL } end
end

-- Registered where `vim` is there as this module loads: Neovim sets it up
-- before any plugin's Lua code runs, and a wait elsewhere need not ask.
if nvim.active() then
  runtime.register_host {
    name = "nvim",
    rank = 70,
    claims = nvim.active,
    blocking = "warn",
    says = "ratewise: a wait outside a task blocks Neovim (its keys, its screen) until it ends: call ratewise "
      .. "from rw.spawn(function() ... end), whose tasks the editor's loop runs (docs/hosts.md#neovim)",
  }
end

-- Inside Neovim the editor's loop runs ratewise's tasks: a task spawned by
-- any plugin runs with nothing more to set up.
if nvim.active() then
  log.set_host(nvim.notify)
  nvim.start()
end

return nvim
