-- Another script, loaded beside misuse.lua (spec/host_weechat_spec.lua):
-- WeeChat gives each script a Lua state of its own, so this one sees none
-- of misuse.lua's globals, and has a ratewise of its own (its scheduler,
-- its engine, its driver, whose global callback has the same name in both
-- states), which fetches at the same time as misuse.lua's. It spawns a
-- task before calling weechat.register too, which WeeChat refuses to hook
-- for: the error says so.
-- WeeChat's API, and the script's callbacks: WeeChat calls them by their global name
-- luacheck: globals weechat rw_other_spawned
local rw = require "ratewise"
local scenario = require "scenario"

local base, results = os.getenv("RW_BASE"), os.getenv("RW_RESULTS")

local spawned, refused = pcall(rw.spawn, function() end)
scenario.record(results, "before_register " .. tostring(not spawned) .. " " .. tostring(refused))

weechat.register("ratewise_other", "ratewise", "1", "MIT", "another script with ratewise", "", "")

scenario.record(results, "other_sees_marker " .. tostring(rawget(_G, "rw_misuse_marker") ~= nil))

function rw_other_spawned(_, _, _)
  local started = rw.now()
  rw.spawn(function()
    local res, err = rw.fetch(base .. "/rh/slow")
    scenario.record(results, ("other %s %.3f"):format(res and res.status or tostring(err):gsub("\n", " "),
      rw.now() - started))
  end)
  return weechat.WEECHAT_RC_OK
end

weechat.hook_command("rw_other_spawned", "rw.fetch in a task of another script", "", "", "", "rw_other_spawned", "")
