-- What spec/host_weechat_spec.lua has WeeChat load to see a wait outside a
-- task refused: a command of the script's own, run by WeeChat as any
-- command is (its callback called from C, as plain code, not a task),
-- makes a bare rw.fetch, and writes the error it got to the results. A
-- second command spawns the same kind of call as a task, which WeeChat's
-- loop runs; before it, ratewise.hosts.weechat is loaded again (a script
-- reloading its modules), and the script counts its hooks once the task is
-- spawned: one driver's. Two more commands park two tasks (one sleeping
-- 20 s, one waiting for a permit the command holds), then cancel the one
-- and release the permit: each task goes on at once, not at its timer.
-- WeeChat's API, and the script's callbacks: WeeChat calls them by their global name
-- luacheck: globals weechat rw_misuse_marker rw_misuse_bare rw_misuse_spawned rw_misuse_park rw_misuse_unpark
weechat.register("ratewise_misuse", "ratewise", "1", "MIT", "ratewise's misuse in WeeChat", "", "")

local rw = require "ratewise"
local scenario = require "scenario"

local base, results = os.getenv("RW_BASE"), os.getenv("RW_RESULTS")

-- what other.lua, another script, looks for in its own globals
rw_misuse_marker = "set by ratewise_misuse"

local function one_line(text)
  return (tostring(text):gsub("\n", " "))
end

-- The hooks of this script WeeChat has of a type (its infolist of hooks).
local function hooks_of_script(kind)
  local n = 0
  local list = weechat.infolist_get("hook", "", kind)
  while weechat.infolist_next(list) == 1 do
    if weechat.infolist_string(list, "subplugin") == "ratewise_misuse" then n = n + 1 end
  end
  weechat.infolist_free(list)
  return n
end

function rw_misuse_bare(_, _, _)
  local ok, err = pcall(rw.fetch, base .. "/rh/ping")
  scenario.record(results, "refused " .. tostring(not ok) .. " " .. one_line(err))
  return weechat.WEECHAT_RC_OK
end

function rw_misuse_spawned(_, _, _)
  local first = require("ratewise.hosts.weechat").start()
  package.loaded["ratewise.hosts.weechat"] = nil
  local again = require("ratewise.hosts.weechat").start()
  scenario.record(results, "same_driver " .. tostring(first == again))
  local started = rw.now()
  rw.spawn(function()
    local res, err = rw.fetch(base .. "/rh/slow")
    scenario.record(results, ("spawned %s %.3f"):format(res and res.status or one_line(err), rw.now() - started))
  end)
  -- the driver of the task: hook_fd on the scheduler's descriptor, and a
  -- timer for the task, ready now
  scenario.record(results, ("hooks_when_spawned %d %d"):format(hooks_of_script("fd"), hooks_of_script("timer")))
  return weechat.WEECHAT_RC_OK
end

local gate = rw.semaphore(1)
local sleeper, unparked_at

function rw_misuse_park(_, _, _)
  assert(gate:acquire(0), "the permit is free")
  sleeper = rw.spawn(function() rw.sleep(20) end)
  rw.spawn(function()
    local ok, err = sleeper:join()
    scenario.record(results, ("cancel_seen %.3f %s %s"):format(rw.now() - unparked_at, tostring(ok), one_line(err)))
  end)
  rw.spawn(function()
    gate:acquire()
    scenario.record(results, ("release_seen %.3f"):format(rw.now() - unparked_at))
    gate:release()
  end)
  return weechat.WEECHAT_RC_OK
end

-- (run a little after rw_misuse_park, when both tasks wait)
function rw_misuse_unpark(_, _, _)
  unparked_at = rw.now()
  sleeper:cancel()
  gate:release()
  return weechat.WEECHAT_RC_OK
end

weechat.hook_command("rw_misuse_park", "park two tasks", "", "", "", "rw_misuse_park", "")
weechat.hook_command("rw_misuse_unpark", "cancel one, release the other's permit", "", "", "", "rw_misuse_unpark", "")
weechat.hook_command("rw_misuse_bare", "a bare rw.fetch", "", "", "", "rw_misuse_bare", "")
weechat.hook_command("rw_misuse_spawned", "rw.fetch in a task", "", "", "", "rw_misuse_spawned", "")
