-- The Tarantool host: ratewise in a Tarantool instance, found with no
-- configuration where Tarantool's built-in `fiber` module is loaded (it is
-- from the start) and its `box` global is there. Every fiber runs on one
-- event loop, which a wait outside a task blocks in the engine's poll: no
-- other fiber, and no request of the instance, runs until it ends (20
-- calls in 20 fibers take the sum of their times, not the longest).
-- Registered with the seam (ratewise/runtime.lua) at rank 72 as such a
-- host: the wait is said once in the log, then served by blocking, as the
-- main thread's. rw.configure{sleep = fiber.sleep} (rank 20, asked first)
-- makes each wait sleep its own fiber instead, looking at its transfers
-- between naps.
local runtime = require "ratewise.runtime"

local rawget, type = rawget, type
local loaded = package.loaded

local tarantool = {}

--- yes = tarantool.active(): the code runs inside Tarantool.
function tarantool.active()
  local fiber = loaded.fiber
  return type(fiber) == "table" and type(fiber.sleep) == "function" and type(fiber.self) == "function"
    and type(rawget(_G, "box")) == "table"
end

-- Registered where Tarantool is there as this module loads: its `fiber`
-- module and `box` are there from the start, before any Lua code of the
-- instance runs, and a wait elsewhere need not ask.
if tarantool.active() then
  runtime.register_host {
    name = "tarantool",
    rank = 72,
    claims = tarantool.active,
    blocking = "warn",
    says = "ratewise: a wait outside a task blocks Tarantool's event loop (every fiber, every request) until it "
      .. "ends: call rw.configure{sleep = require('fiber').sleep} once, so that a wait sleeps its own fiber and "
      .. "the others run meanwhile (docs/hosts.md#tarantool)",
  }
end

return tarantool
