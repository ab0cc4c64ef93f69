-- The cqueues host, registered with the seam (ratewise/runtime.lua) at
-- rank 40: code running under a
-- cqueues controller sleeps with cqueues.sleep, and waits for the rest on a
-- condition variable of its own, signalled by one driver coroutine per
-- controller that waits with cqueues.poll on the scheduler's descriptor
-- (ratewise/hosts/driven.lua). The controller's other coroutines go on
-- meanwhile.
local driven = require "ratewise.hosts.driven"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"

local package, type, setmetatable, pairs = package, type, setmetatable, pairs

local cqueues_host = {}

local function cqueues()
  local m = package.loaded.cqueues
  if type(m) == "table" and type(m.running) == "function" then return m end
  return nil
end

--- yes = cqueues_host.active(): the code running now is a cqueues
-- controller's (cqueues is loaded, and cqueues.running() names one).
function cqueues_host.active()
  local m = cqueues()
  return m ~= nil and m.running() ~= nil
end

local function sleep(seconds)
  cqueues().sleep(seconds)
end

local per_controller = setmetatable({}, { __mode = "k" })

--- host = cqueues_host.host(): the host of the controller running now.
function cqueues_host.host()
  local m = cqueues()
  local controller = m.running()
  local host = per_controller[controller]
  if host then return host end
  local condition = require "cqueues.condition"
  host = driven.new {
    spawn = function(fn) return controller:wrap(fn) end,
    signal = function() return condition.new() end,
    wait = function(s, seconds) s:wait(seconds) end,
    post = function(s) s:signal() end,
    block = function(kick, seconds)
      -- the descriptor alone: the seconds are the driver's own
      if seconds then m.poll(scheduler.descriptor, kick, seconds) else m.poll(scheduler.descriptor, kick) end
    end,
    watches_fd = true,
  }
  host.sleep = sleep
  per_controller[controller] = host
  return host
end

--- cqueues_host.kick(): wakes the drivers (a permit released, a task ended).
function cqueues_host.kick()
  for _, host in pairs(per_controller) do host.kick() end
end

runtime.register_host {
  name = "cqueues",
  rank = 40,
  -- a controller runs the code of its own in coroutines only
  in_coroutine_only = true,
  claims = function()
    if package.loaded.cqueues ~= nil and cqueues_host.active() then return cqueues_host.host() end
    return nil
  end,
}
scheduler.add_kick(cqueues_host.kick)

return cqueues_host
