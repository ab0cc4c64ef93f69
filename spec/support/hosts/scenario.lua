-- What every real-host spec (spec/host_*_spec.lua) has the host run, the
-- same in each host: loaded inside the host itself (HAProxy, Prosody,
-- WeeChat, Tarantool, mpv, Apache), it uses nothing but ratewise and io, so
-- that what it measures is ratewise waiting the host's way, with no adapter
-- code. spec/support/real_host.lua reads what it writes.
--
--   local scenario = require "scenario"
--   scenario.run { base = "http://127.0.0.1:PORT", results = "/tmp/x/results",
--                  together = function(n, fn) ... end }   -- optional
--
-- Phases, each one line of the results file, "name ok seconds cpu":
--   one_429   one call to a path that answers 429 + Retry-After: 2, then 200
--   one_slow  one call to a path that answers after 1 s
--   ten_429   ten such calls at once (each on a path of its own)
--   ten_slow  ten slow calls at once
-- ok is how many of the phase's calls ended 200; cpu the process's CPU
-- seconds (every thread's: /proc/self/stat) spent in the phase. A last line
-- "done" says the scenario ended; an error is written as "error <text>".
-- together(n, fn) runs fn(i) for i = 1..n at once, the host's own way, and
-- returns when all have returned; by default rw.map runs them as ratewise
-- tasks.
local scenario = {}

local CLOCK_TICKS = 100 -- USER_HZ, what /proc reports CPU times in on Linux

--- seconds = scenario.cpu_seconds([pid]): the CPU time a process (by
-- default this one) has used, user and system, every thread.
function scenario.cpu_seconds(pid)
  local f = io.open("/proc/" .. (pid or "self") .. "/stat", "r")
  if not f then return 0 end
  local stat = f:read("*l")
  f:close()
  -- the command name may hold spaces: the fields after it are counted from
  -- its closing parenthesis (utime and stime are fields 14 and 15)
  local after = stat:match("%) (.*)$")
  local fields = {}
  for field in after:gmatch("%S+") do fields[#fields + 1] = field end
  return (tonumber(fields[12]) + tonumber(fields[13])) / CLOCK_TICKS
end

local function writer(path)
  return function(line)
    local f = assert(io.open(path, "a"))
    f:write(line, "\n")
    f:close()
  end
end

--- scenario.record(results, line): a line of the host script's own (a
-- lateness it measured, say) in the results file.
function scenario.record(results, line)
  writer(results)(line)
end

local function default_together(rw)
  return function(n, fn)
    local list = {}
    for i = 1, n do list[i] = i end
    rw.map(list, fn)
  end
end

function scenario.run(opts)
  local rw = require "ratewise"
  local write = writer(opts.results)
  local together = opts.together or default_together(rw)
  local base = opts.base
  local function phase(name, n, path_of)
    local ok = 0
    local function call(i)
      local res = rw.fetch(base .. path_of(i))
      if res and res.status == 200 then ok = ok + 1 end
    end
    local started, cpu = rw.now(), scenario.cpu_seconds()
    if n == 1 then call(0) else together(n, call) end
    write(("%s %d %.3f %.3f"):format(name, ok, rw.now() - started, scenario.cpu_seconds() - cpu))
  end
  local ran, err = pcall(function()
    phase("one_429", 1, function(i) return "/rh/429/" .. i end)
    phase("one_slow", 1, function() return "/rh/slow" end)
    phase("ten_429", 10, function(i) return "/rh/429/" .. i end)
    phase("ten_slow", 10, function() return "/rh/slow" end)
  end)
  if not ran then write("error " .. tostring(err):gsub("\n", " ")) end
  write("done")
end

return scenario
