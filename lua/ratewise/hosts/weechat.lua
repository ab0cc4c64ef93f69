-- The WeeChat host: ratewise inside a WeeChat script (its Lua plugin),
-- found with no configuration where the `weechat` global is WeeChat's API
-- (weechat.hook_fd and weechat.hook_timer). Every script runs from WeeChat's
-- one loop, which a wait outside a task (a bare rw.fetch) blocks: the
-- input, the screen and every other script stop until it ends. Registered
-- with the seam (ratewise/runtime.lua) at rank 74 as such a host: the wait
-- is said once in the log, then served by blocking, as the main thread's.
-- ratewise's lines go to WeeChat's core buffer (ratewise/log.lua): WeeChat
-- replaces standard error, and a write there does not reach the user.
local runtime = require "ratewise.runtime"

local rawget, type = rawget, type

local weechat = {}

--- yes = weechat.active(): the code runs inside WeeChat.
function weechat.active()
  local api = rawget(_G, "weechat")
  return type(api) == "table" and type(api.hook_fd) == "function" and type(api.hook_timer) == "function"
end

-- Registered where WeeChat's API is there as this module loads: WeeChat
-- sets the global up before a script runs, and a wait elsewhere need not
-- ask.
if weechat.active() then
  runtime.register_host {
    name = "weechat",
    rank = 74,
    claims = weechat.active,
    blocking = "warn",
    says = "ratewise: a wait outside a task blocks WeeChat (its input, its screen, every other script) until it "
      .. "ends: call ratewise from rw.spawn(function() ... end), and step the tasks from WeeChat's loop with "
      .. "weechat.hook_fd on rw.pollable:pollfd() and weechat.hook_timer, each calling rw.step(0) "
      .. "(docs/hosts.md#weechat)",
  }
end

return weechat
