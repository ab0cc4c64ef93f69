-- An mpv script (run by spec/host_mpv_spec.lua) that waits where an mpv
-- script must not: a bare rw.fetch from a key binding and from an event
-- handler, outside any task. Meanwhile a task fetches a 429 path while the
-- player plays, and the script records how far playback went.
local mp = require "mp"
local rw = require "ratewise"
local scenario = require "scenario"

local results, base = mp.get_opt("rw-results"), mp.get_opt("rw-base")
local function record(line) scenario.record(results, line) end

local function bare_fetch(where)
  local ok, err = pcall(rw.fetch, base .. "/rh/ping")
  record(("refused_%s %s %s"):format(where, tostring(not ok), tostring(err):gsub("%s+", " ")))
end

mp.add_key_binding(nil, "fetch-now", function() bare_fetch("binding") end)

local PERIOD = 0.02
local worst, last = 0, mp.get_time()
mp.add_periodic_timer(PERIOD, function()
  local now = mp.get_time()
  if now - last - PERIOD > worst then worst = now - last - PERIOD end
  last = now
end)

mp.register_event("file-loaded", function()
  bare_fetch("event")
  mp.commandv("script-binding", mp.get_script_name() .. "/fetch-now")
  rw.spawn(function()
    local wall, played = mp.get_time(), mp.get_property_number("playback-time", 0)
    local res = rw.fetch(base .. "/rh/429/0")
    record(("playback status %s played %.3f in %.3f"):format(res and res.status or "none",
      mp.get_property_number("playback-time", 0) - played, mp.get_time() - wall))
    record(("late %.4f"):format(worst))
    mp.command("quit")
  end)
end)
