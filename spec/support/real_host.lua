-- The spec side of the real-host specs (spec/host_*_spec.lua): each starts
-- an embedded-Lua host from Debian's packages headless, has it run
-- spec/support/hosts/scenario.lua with ratewise on the Lua the host links,
-- and holds what the host saw to the same bounds:
--   the 429 call (Retry-After: 2) returns 200 in under 4 s;
--   ten at once end in under 5 s (the ten 429 calls and the ten slow ones);
--   the host's CPU while ratewise waits is under 2% of a core;
--   another request, timer or fiber of the host is never more than 100 ms
--   late (measured by the host's script, or by real_host.ping from here).
--
--   local real_host = require "spec.support.real_host"
--   if not real_host.enabled() then pending(...) end
--   real_host.routes(s)                        -- the scenario's paths on the test server
--   local results = real_host.results(file, seconds)  -- waits for "done"
--   real_host.check(results)                   -- the bounds above
--
-- The specs run in `make test`'s default build (Lua 5.4, epoll, Redis),
-- which builds the core for every Lua a host links (make host-cores): the
-- other variants (make test LUA=..., POLLER=poll, REDIS=0) change nothing a
-- host loads, and would only lengthen CI.
local socket = require "socket"
local server = require "spec.support.server"

local M = {}

M.RETRY_AFTER = 2
M.SLOW = 1
M.BOUND = { one_429 = 4, one_slow = 4, ten_429 = 5, ten_slow = 5, late = 0.1, cpu = 0.02 }

local read_file = server.read_file

M.ROOT = assert(io.popen("pwd")):read("*l")

--- yes, why = real_host.enabled(): whether this run of the suite runs the
-- real hosts (make test sets RATEWISE_REAL_HOSTS=1 in its default build).
function M.enabled()
  if os.getenv("RATEWISE_REAL_HOSTS") == "1" then return true end
  return false, "the real-host specs run in `make test`'s default build (Lua 5.4, epoll, Redis) only"
end

--- cpath = real_host.cpath(lua): where the core built for that Lua is
-- ("lua5.3", "lua5.4", "lua5.2", "luajit"), as a package.cpath entry.
function M.cpath(lua)
  local dir = M.ROOT .. "/" .. (lua == "lua5.4" and "build" or ("build-" .. lua))
  assert(read_file(dir .. "/ratewise/core.so"), "no " .. dir .. "/ratewise/core.so: make host-cores builds it")
  return dir .. "/?.so"
end

--- path = real_host.lua_path(): ratewise's modules and the scenario's, as a
-- package.path.
function M.lua_path()
  return M.ROOT .. "/lua/?.lua;" .. M.ROOT .. "/lua/?/init.lua;" .. M.ROOT .. "/spec/support/hosts/?.lua"
end

--- real_host.routes(s): the scenario's paths on the test server s: each of
-- /rh/429/0 .. /rh/429/10 answers 429 with Retry-After once, then 200;
-- /rh/slow answers 200 after a second; /rh/ping at once.
function M.routes(s)
  for i = 0, 10 do
    s:script("/rh/429/" .. i, {
      { status = 429, headers = { ["Retry-After"] = tostring(M.RETRY_AFTER) }, body = "slow down" },
      { status = 200, body = "ok" },
    })
  end
  s:script("/rh/slow", { { status = 200, body = "slow", delay = M.SLOW } })
  s:script("/rh/ping", { { status = 200, body = "pong" } })
end

--- dir = real_host.temp_dir(): a new private directory.
function M.temp_dir()
  local p = assert(io.popen("mktemp -d"))
  local dir = p:read("*l")
  p:close()
  return dir
end

--- 'text' = real_host.shell_quote(text): one word of a shell command.
function M.shell_quote(text)
  return "'" .. tostring(text):gsub("'", "'\\''") .. "'"
end

--- lines = real_host.lines_of(results, key): the lines of the results
-- (real_host.results) whose first word is key, each as the text after it.
function M.lines_of(results, key)
  local found = {}
  for _, words in ipairs(results.lines) do
    if words[1] == key then found[#found + 1] = table.concat(words, " ", 2) end
  end
  return found
end

--- yes = real_host.listening(port [, seconds [, alive]]): waits until a
-- host accepts connections on the loopback port (at most seconds, 10 by
-- default; alive(), when given, says whether it still runs).
function M.listening(port, seconds, alive)
  local deadline = socket.gettime() + (seconds or 10)
  repeat
    local c = socket.connect("127.0.0.1", port)
    if c then
      c:close()
      return true
    end
    socket.sleep(0.05)
  until (alive and not alive()) or socket.gettime() > deadline
  return false
end

--- real_host.write_file(path, text)
function M.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

--- results = real_host.results(file, seconds [, alive]): waits until the
-- results file has its "done" line (at most the seconds; alive(), when
-- given, says whether the host still runs) and answers its phases: name ->
-- { ok =, seconds =, cpu = }, and the other lines: results.lines (the
-- words of each), results.error.
function M.results(file, seconds, alive)
  local deadline = socket.gettime() + seconds
  local text
  repeat
    text = read_file(file) or ""
    if text:find("\ndone\n", 1, true) or text:match("^done\n") then break end
    if alive and not alive() then break end
    socket.sleep(0.05)
  until socket.gettime() > deadline
  local results = { lines = {}, text = text }
  for line in text:gmatch("[^\n]+") do
    local name, ok, secs, cpu = line:match("^(%S+) (%d+) ([%d.]+) ([%d.]+)$")
    if name then
      results[name] = { ok = tonumber(ok), seconds = tonumber(secs), cpu = tonumber(cpu) }
    elseif line:match("^error ") then
      results.error = line:sub(7)
    elseif line == "done" then
      results.done = true
    else
      local words = {}
      for w in line:gmatch("%S+") do words[#words + 1] = w end
      results.lines[#results.lines + 1] = words
    end
  end
  return results
end

--- real_host.check(results [, what]): the scenario's bounds (what names the
-- host in the messages).
function M.check(results, what)
  what = what or "the host"
  assert(results.done, what .. " did not finish the scenario; it wrote:\n" .. results.text)
  assert(not results.error, what .. ": " .. tostring(results.error))
  for name, n in pairs({ one_429 = 1, one_slow = 1, ten_429 = 10, ten_slow = 10 }) do
    local phase = assert(results[name], what .. " wrote no " .. name .. ":\n" .. results.text)
    assert(phase.ok == n, ("%s, %s: %d of %d calls ended 200"):format(what, name, phase.ok, n))
    assert(phase.seconds < M.BOUND[name], ("%s, %s took %.2f s (bound %g s)"):format(what, name, phase.seconds,
      M.BOUND[name]))
  end
  -- the Retry-After wait is honoured, not skipped
  -- (from before the first request to after the last answer: at least
  -- the Retry-After, to the results' rounding)
  assert(results.one_429.seconds >= M.RETRY_AFTER - 0.001,
    ("%s: the 429 call returned after %.2f s, before its Retry-After"):format(what, results.one_429.seconds))
  local cpu = results.one_429.cpu / results.one_429.seconds
  assert(cpu < M.BOUND.cpu, ("%s used %.1f%% of a core while ratewise waited (bound %g%%)"):format(what, cpu * 100,
    M.BOUND.cpu * 100))
end

--- worst = real_host.ping(url, until_fn [, interval]): GETs url every
-- interval seconds (0.02) until until_fn() is true, and answers the longest
-- any answer took, in seconds (a host that hangs answers late, or not at
-- all within 10 s: 10).
-- luasocket's http writes the request line and the headers apart: without
-- TCP_NODELAY the headers wait for the server's ACK, which a server that
-- delays its ACKs (HAProxy's tcp-smart-accept) sends only some 40 ms later,
-- and every answer would look that late. (tcp4: a socket of socket.tcp()
-- is made at connect, too late to set the option on.)
local function nodelay_tcp()
  local c = assert(socket.tcp4())
  assert(c:setoption("tcp-nodelay", true))
  return c
end

function M.ping(url, until_fn, interval)
  local http = require "socket.http"
  local worst = 0
  http.TIMEOUT = 10
  repeat
    local started = socket.gettime()
    local _, code = http.request { url = url, create = nodelay_tcp }
    local took = socket.gettime() - started
    if code ~= 200 then took = math.max(took, 10) end
    if took > worst then worst = took end
    socket.sleep(interval or 0.02)
  until until_fn()
  return worst
end

--- seconds = real_host.cpu_seconds(pid): the CPU time a process has used
-- (user and system, every thread).
M.cpu_seconds = require("spec.support.hosts.scenario").cpu_seconds

return M
