-- Loaded by HAProxy (lua-load) for spec/host_haproxy_spec.lua: it requires
-- ratewise and the scenario, with no code of its own between them and
-- HAProxy. The scenario runs in an HAProxy task; two services, a sample
-- fetch and a converter call ratewise as a script's own would.
-- luacheck: read globals core
local rw = require "ratewise"
local scenario = require "scenario"

local results, base = os.getenv("RW_RESULTS"), os.getenv("RW_BASE")

core.register_task(function()
  scenario.run { base = base, results = results }
end)

-- a task spawned in the body (in the master process, under -W): it runs
-- once HAProxy serves
rw.spawn(function() rw.fetch(base .. "/hx/from_body") end)

local function answer(applet, status, body)
  applet:set_status(status)
  applet:add_header("content-type", "text/plain")
  applet:add_header("content-length", tostring(#body))
  applet:start_response()
  applet:send(body)
end

-- another Lua context of HAProxy, answering at once while the scenario waits
core.register_service("lua_ping", "http", function(applet)
  answer(applet, 200, "pong")
end)

-- a service that waits: a bare rw.fetch of the path in the query
core.register_service("lua_fetch", "http", function(applet)
  local res, err = rw.fetch(base .. applet.qs)
  answer(applet, 200, res and tostring(res.status) or tostring(err))
end)

-- a service that spawns a task and returns: the task goes on without it
core.register_service("lua_spawn", "http", function(applet)
  local path = applet.qs
  rw.spawn(function() rw.fetch(base .. path) end)
  answer(applet, 200, "spawned")
end)

-- a service that leaves a task sleeping 5 s: the driver naps meanwhile
core.register_service("lua_sleeper", "http", function(applet)
  rw.spawn(function() rw.sleep(5) end)
  answer(applet, 200, "sleeping")
end)

-- a wait in a coroutine of the script's own, which HAProxy never resumes
core.register_service("lua_nested", "http", function(applet)
  local ok, err = coroutine.wrap(function() return pcall(rw.sleep, 0.5) end)()
  answer(applet, 200, ok and "slept" or tostring(err))
end)

-- a sample fetch and a converter, where HAProxy lets nothing wait
core.register_fetches("rw_fetch", function()
  local res = rw.fetch(base .. "/rh/ping")
  return res and tostring(res.status) or "none"
end)

core.register_converters("rw_convert", function(value)
  local res = rw.fetch(base .. "/rh/ping")
  return value .. (res and tostring(res.status) or "none")
end)
