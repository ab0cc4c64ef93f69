-- bench/hosts.lua: what waiting costs in each host of the waiting seam.
--
--   make bench-hosts          (or: lua5.4 bench/hosts.lua, from the root,
--                              after make and make LUA=luajit)
--
-- For each host, 1,000 requests wait on a slow server (a private nginx
-- whose answer takes 4 s) while the process's CPU time is measured over 2 s
-- of that wait; then the requests finish and are counted. Each host runs in
-- a process of its own. Then, in a frame loop, the time rw.step(0) takes
-- with 100 transfers in flight. A benchmark, not a test: it fails only when
-- a request fails.
local HOST_SCRIPT = [=[
local host, url, n = arg[1], arg[2], tonumber(arg[3])
local rw = require "ratewise"
rw.configure { max_connections = n }
local clock, now = os.clock, rw.now
local cpu, ok_count = nil, 0
local function fetch()
  local res = rw.fetch(url, { on_retry = false, timeout = 30, max_retries = 0 })
  if res and res.status == 200 then ok_count = ok_count + 1 end
end
-- CPU over [1 s, 3 s] of the wait, read by whichever code runs then
local started, c1 = now(), nil
local function sample()
  local t = now() - started
  if not c1 and t >= 1 then c1 = clock() end
  if c1 and not cpu and t >= 3 then cpu = clock() - c1 end
end

if host == "scheduler" then
  rw.run(function()
    for _ = 1, n do rw.spawn(fetch) end
    rw.sleep(1); sample(); rw.sleep(2); sample()
  end)
elseif host == "cqueues" then
  local cqueues = require "cqueues"
  local cq = cqueues.new()
  for _ = 1, n do cq:wrap(fetch) end
  cq:wrap(function() cqueues.sleep(1); sample(); cqueues.sleep(2); sample() end)
  assert(cq:loop())
elseif host == "coroutines" then
  -- coroutines marked as speaking the protocol, resumed by a loop that waits on the pollable they
  -- yield (luasocket's select)
  local socket = require "socket"
  local cos = {}
  for i = 1, n do cos[i] = rw.speaks_protocol(coroutine.create(fetch)) end
  local live = n
  while live > 0 do
    local pollable
    live = 0
    for i = 1, n do
      local co = cos[i]
      if coroutine.status(co) == "suspended" then
        local ok, what, _, p = coroutine.resume(co)
        assert(ok, what)
        if p then pollable = p end
      end
      if coroutine.status(co) ~= "dead" then live = live + 1 end
    end
    sample()
    if live > 0 and pollable then socket.select({ pollable }, nil, math.min(pollable:timeout() or 0.5, 0.5)) end
  end
elseif host == "luv" then
  local uv = require "luv"
  local poll, timer = uv.new_poll(rw.pollable:pollfd()), uv.new_timer()
  local sampler = uv.new_timer()
  sampler:start(100, 100, sample)
  local function drive()
    local live = rw.step(0)
    timer:stop()
    if live == 0 then poll:close(); timer:close(); sampler:close() return end
    local wait = rw.pollable:timeout()
    if wait then timer:start(math.ceil(wait * 1000), 0, drive) end
  end
  poll:start("r", drive)
  for _ = 1, n do rw.spawn(fetch) end
  drive()
  uv.run()
elseif host == "frame_loop" then
  local socket = require "socket"
  for _ = 1, n do rw.spawn(fetch) end
  repeat
    local live = rw.step(0)
    sample()
    socket.sleep(1 / 60)
  until live == 0
end
assert(cpu, "the wait ended before it was measured")
io.write(string.format("%.4f %d\n", cpu, ok_count))
]=]

local nginx = require "spec.support.nginx"
local subprocess = require "spec.support.subprocess"
local socket = require "socket"

local N = tonumber(os.getenv("BENCH_HOST_REQUESTS") or "") or 1000

local slow = nginx.start {
  http = "lua_shared_dict results 1m;",
  server = [[
    location = /slow { content_by_lua_block { ngx.sleep(4) ngx.say("ok") } }
    location = /openresty {
      content_by_lua_block {
        local rw = require "ratewise"
        rw.configure { max_connections = tonumber(ngx.var.arg_n) }
        local url, ok_count = ngx.unescape_uri(ngx.var.arg_url), 0
        local threads = {}
        for i = 1, tonumber(ngx.var.arg_n) do
          threads[i] = ngx.thread.spawn(function()
            local res = rw.fetch(url, { on_retry = false, timeout = 30, max_retries = 0 })
            if res and res.status == 200 then ok_count = ok_count + 1 end
          end)
        end
        for i = 1, #threads do ngx.thread.wait(threads[i]) end
        ngx.say(ok_count)
      }
    }
  ]],
}

local file = os.tmpname()
local f = assert(io.open(file, "w"))
f:write(HOST_SCRIPT)
f:close()

local function escape(s)
  return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

print(string.format("%d requests waiting on a server that answers after 4 s; CPU over 2 s of the wait", N))
local failed = false
for _, host in ipairs { "scheduler", "cqueues", "coroutines", "luv", "frame_loop" } do
  local out, code = subprocess.shell(subprocess.env .. "timeout 60 " .. subprocess.lua .. " " .. file .. " "
    .. host .. " " .. slow:url("/slow") .. " " .. N)
  local cpu, answered = out:match("^([%d.]+) (%d+)")
  if code ~= 0 or not cpu then
    print(string.format("  %-12s failed: %s", host, out))
    failed = true
  else
    print(string.format("  %-12s %6.1f ms of CPU (%4.1f %%), %s of %d answered", host, cpu * 1000,
      cpu / 2 * 100, answered, N))
    if tonumber(answered) ~= N then failed = true end
  end
end

-- OpenResty: the same wait, as light threads of one request in the
-- worker; the worker's CPU is read from /proc.
do
  local ratewise_nginx = slow -- one worker serves both the slow answers and the waiting requests
  local pid = ratewise_nginx:worker_pid()
  local rw = require "ratewise"
  local answer, cpu
  rw.run(function()
    local request = rw.spawn(function()
      local res = rw.fetch(ratewise_nginx:url("/openresty?n=" .. N .. "&url=" .. escape(slow:url("/slow"))),
        { on_retry = false, timeout = 60, max_retries = 0 })
      return res and res.body or "?"
    end)
    rw.sleep(1)
    local c1 = nginx.cpu_seconds(pid)
    rw.sleep(2)
    cpu = nginx.cpu_seconds(pid) - c1
    answer = request:join()
  end)
  -- the worker also served the 1,000 slow answers meanwhile (ngx.sleep in
  -- each), so this is an upper bound of ratewise's share
  print(string.format("  %-12s %6.1f ms of CPU (%4.1f %%), %s of %d answered (the worker, slow answers included)",
    "openresty", cpu * 1000, cpu / 2 * 100, (answer or "?"):gsub("%s+$", ""), N))
  if tonumber(answer) ~= N then failed = true end
end

-- rw.step(0) in a frame loop with 100 transfers in flight: the frames
-- while they wait, apart from the first (which starts them) and those in
-- which they end (which build 100 responses)
do
  local rw = require "ratewise"
  local waiting, others, first = {}, {}, nil
  for _ = 1, 100 do
    rw.spawn(function() rw.fetch(slow:url("/slow"), { on_retry = false, timeout = 30 }) end)
  end
  local live = 100
  repeat
    local started = rw.now()
    local after = rw.step(0)
    local took = rw.now() - started
    if not first then first = took
    elseif after == live and after == 100 then waiting[#waiting + 1] = took
    else others[#others + 1] = took end
    live = after
    socket.sleep(1 / 60)
  until live == 0
  table.sort(waiting)
  table.sort(others)
  print(string.format("frame loop, 100 transfers in flight: rw.step(0) median %.3f ms, slowest %.3f ms "
    .. "(%d frames); the frame that starts them %.3f ms, the slowest in which they end %.3f ms",
    waiting[math.ceil(#waiting / 2)] * 1000, waiting[#waiting] * 1000, #waiting, first * 1000,
    others[#others] * 1000))
end

os.remove(file)
slow:stop()
if failed then os.exit(1) end
