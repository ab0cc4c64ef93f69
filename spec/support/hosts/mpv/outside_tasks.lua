-- An mpv script (run by spec/host_mpv_spec.lua) whose plain script code,
-- outside any task, uses ratewise while the player plays:
--   a bare rw.fetch from an event handler and from a key binding, where a
--   wait must not be (it would hold the script's event loop);
--   a permit released to a waiting task, and a sleeping task cancelled,
--   from timers: each task goes on at once;
--   meanwhile a task fetches a 429 path, and the script records how far
--   playback went.
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

-- how long after script code's act (a release, a cancel) the task went on
local function after(act, what)
  local acted_at
  mp.add_timeout(0.3, function()
    acted_at = mp.get_time()
    act()
  end)
  return function() record(("%s_after %.4f"):format(what, mp.get_time() - acted_at)) end
end

local function fetch_while_playing()
  local wall, played = mp.get_time(), mp.get_property_number("playback-time", 0)
  local res = rw.fetch(base .. "/rh/429/0")
  record(("playback status %s played %.3f in %.3f"):format(res and res.status or "none",
    mp.get_property_number("playback-time", 0) - played, mp.get_time() - wall))
end

mp.register_event("file-loaded", function()
  bare_fetch("event")
  mp.commandv("script-binding", mp.get_script_name() .. "/fetch-now")
  local sem = rw.semaphore(1)
  sem:acquire() -- free: no wait
  local permitted = after(function() sem:release() end, "permit")
  local sleeper = rw.spawn(function() rw.sleep(30) end)
  local cancelled = after(function() sleeper:cancel() end, "cancel")
  rw.spawn(function()
    local fetching = rw.spawn(fetch_while_playing)
    local waiting = rw.spawn(function()
      sem:acquire()
      permitted()
    end)
    pcall(sleeper.join, sleeper)
    cancelled()
    waiting:join()
    fetching:join()
    record(("late %.4f"):format(worst))
    mp.command("quit")
  end)
end)
