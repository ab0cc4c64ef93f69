-- An mpv script (run by spec/host_mpv_spec.lua): the scenario in a ratewise
-- task, with nothing but ratewise; mpv's own periodic timer, beside it,
-- measures how late the script's event loop runs it meanwhile.
local mp = require "mp"
local rw = require "ratewise"
local scenario = require "scenario"

local results = mp.get_opt("rw-results")
local PERIOD = 0.02

-- the lateness probe (instrumentation): the worst delay of a 20 ms timer
local worst, last = 0, mp.get_time()
local probe = mp.add_periodic_timer(PERIOD, function()
  local now = mp.get_time()
  if now - last - PERIOD > worst then worst = now - last - PERIOD end
  last = now
end)

rw.spawn(function()
  scenario.run { base = mp.get_opt("rw-base"), results = results }
  probe:kill()
  scenario.record(results, ("late %.4f"):format(worst))
  -- an idle player costs nothing: with no task left, no step is armed
  mp.add_timeout(0.2, function()
    scenario.record(results, "armed_when_idle " .. tostring(require("ratewise.hosts.mpv").driver.armed()))
    mp.command("quit")
  end)
end)
