-- The test module of spec/host_prosody_spec.lua, loaded by Prosody from
-- spec/support/hosts/prosody/ (plugin_paths). It finds ratewise and the
-- scenario on package.path (LUA_PATH) and ratewise's core on
-- package.cpath (LUA_CPATH), and serves, under /ratewise_test/:
--   GET /run      the scenario, inside this handler: Prosody runs HTTP
--                 handlers in util.async runners, and ratewise waits there
--                 with no code of the module's
--   GET /ping     at once: the spec times it while the scenario runs
--   GET /outside  a timer's callback (Prosody's main loop, no runner)
--                 calls rw.fetch; answers the error it raised
--   GET /nested   a coroutine of the handler's own (inside the runner)
--                 calls rw.fetch; answers the error it raised
--   GET /spawn    a timer's callback spawns a task that fetches ?path;
--                 answers at once, and the task runs on
-- With ratewise_test_at_load set, its load (Prosody's startup, in the
-- startup's runner) calls rw.fetch on that path first.
-- luacheck: globals module
local rw = require "ratewise"
local scenario = require "scenario"

local base = module:get_option_string("ratewise_test_base")
local results = module:get_option_string("ratewise_test_results")
local at_load = module:get_option_string("ratewise_test_at_load", "")

if at_load ~= "" then
  local res, err = rw.fetch(base .. at_load)
  module:log("info", "the call at load ended: %s", res and res.status or tostring(err))
end

local function run()
  scenario.run { base = base, results = results }
  return "ran"
end

local function outside(event)
  module:add_timer(0, function()
    local ok, err = pcall(rw.fetch, base .. "/rh/ping")
    event.response:send(ok and "no error" or tostring(err))
  end)
  return true -- answered by the timer's callback
end

local function nested()
  local ok, err = coroutine.wrap(function() return pcall(rw.fetch, base .. "/rh/ping") end)()
  return ok and "no error" or tostring(err)
end

local function spawn(event)
  local path = event.request.url.query
  module:add_timer(0, function()
    rw.spawn(function()
      local res, err = rw.fetch(base .. path)
      module:log("info", "the spawned task's call ended: %s", res and res.status or tostring(err))
    end)
  end)
  return "spawned"
end

module:provides("http", {
  route = {
    ["GET /run"] = run,
    ["GET /ping"] = function() return "pong" end,
    ["GET /outside"] = outside,
    ["GET /nested"] = nested,
    ["GET /spawn"] = spawn,
  },
})
