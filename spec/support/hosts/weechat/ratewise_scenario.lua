-- What spec/host_weechat_spec.lua has WeeChat load (/lua load): the
-- scenario (spec/support/hosts/scenario.lua) in a ratewise task, with no
-- adapter code: ratewise.hosts.weechat, found from the `weechat` global,
-- steps it from WeeChat's loop. A timer of the script's own, every 20 ms,
-- measures how late WeeChat's loop runs it meanwhile (the probe is test
-- instrumentation). At the end the script writes its worst lateness, and
-- how many hooks of its own WeeChat still has (the driver's, with no task
-- left: none), then quits WeeChat.
-- WeeChat's API, and the script's callbacks: WeeChat calls them by their global name
-- luacheck: globals weechat rw_scenario_probe rw_scenario_finish
weechat.register("ratewise_scenario", "ratewise", "1", "MIT", "ratewise's real-host scenario", "", "")

local rw = require "ratewise"
local scenario = require "scenario"

local results = os.getenv("RW_RESULTS")
local PROBE_MS = 20

local worst, last = 0, rw.now()
function rw_scenario_probe()
  local t = rw.now()
  local late = t - last - PROBE_MS / 1000
  if late > worst then worst = late end
  last = t
  return weechat.WEECHAT_RC_OK
end
local probe = weechat.hook_timer(PROBE_MS, 0, 0, "rw_scenario_probe", "")

local finish -- the timer that calls rw_scenario_finish

-- The hooks of this script WeeChat has of a type (its infolist of hooks),
-- but for the finishing timer, which is running.
local function hooks_of_script(kind)
  local n = 0
  local list = weechat.infolist_get("hook", "", kind)
  while weechat.infolist_next(list) == 1 do
    if weechat.infolist_string(list, "subplugin") == "ratewise_scenario"
        and weechat.infolist_pointer(list, "pointer") ~= finish then
      n = n + 1
    end
  end
  weechat.infolist_free(list)
  return n
end

-- After the task: outside it, from a timer of WeeChat's, once the driver
-- has seen it end.
function rw_scenario_finish()
  weechat.unhook(probe)
  scenario.record(results, ("late %.4f"):format(worst))
  scenario.record(results, ("hooks_when_idle %d %d"):format(hooks_of_script("fd"), hooks_of_script("timer")))
  weechat.command("", "/quit")
  return weechat.WEECHAT_RC_OK
end

rw.spawn(function()
  scenario.run { base = os.getenv("RW_BASE"), results = results }
  finish = weechat.hook_timer(50, 0, 1, "rw_scenario_finish", "")
end)
