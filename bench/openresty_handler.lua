-- bench/openresty_handler.lua: ratewise's side of `make bench-openresty`,
-- run by the OpenResty nginx that bench/openresty.lua starts
-- (content_by_lua_file): one request of that nginx runs one round of a shape
-- inside its worker, as user code in a handler would, and answers with its
-- figures. Query arguments:
--   shape   loop (`conc` light threads, ngx.thread.spawn, each looping
--           rw.fetch with one options table), map (rw.map over a list of
--           n URLs with one shared options table, concurrency `conc`),
--           map_fresh (the same with a fresh options table a call, which
--           carries the time left to a deadline), or sequential (rw.fetch
--           in a loop of the handler itself, one request at a time)
--   url     the target (a plain nginx, bench/nginx.sh)
--   n       requests in all; conc: light threads, or map's concurrency
--   size    when given, every body must be that many bytes (#res.body)
--   client  ratewise (rw.fetch, the default) or cosocket: a keep-alive
--           HTTP/1.1 client on ngx.socket.tcp, the way lua-resty-http
--           works (Content-Length bodies only, as the target sends), the
--           baseline the OpenResty host is measured beside (issue 40)
-- It answers "requests=N failed=F seconds=S rate=R cpu_us=C" (C: the
-- worker's CPU microseconds per request, user and system, every thread
-- of it; set-up and a full garbage
-- collection before the clock starts are left out).
-- luacheck: globals ngx
local rw = require "ratewise"

local format, floor = string.format, math.floor
local fetch, now = rw.fetch, rw.now

-- Seconds of CPU this process has used, every thread of it (the engine's
-- wake-up helper too): clock_gettime's CLOCK_PROCESS_CPUTIME_ID, through
-- LuaJIT's FFI (/proc/self/stat counts whole ticks of 10 ms, too coarse
-- for a round of slow answers).
local ffi = require "ffi"
pcall(ffi.cdef, [[
  struct ratewise_bench_timespec { long tv_sec; long tv_nsec; };
  int clock_gettime(int clock, struct ratewise_bench_timespec *ts);
]]) -- (this file runs at each request: declared by the first)
local CLOCK_PROCESS_CPUTIME_ID = 2 -- Linux's
local cpu_ts = ffi.new("struct ratewise_bench_timespec")
local function cpu_seconds()
  assert(ffi.C.clock_gettime(CLOCK_PROCESS_CPUTIME_ID, cpu_ts) == 0)
  return tonumber(cpu_ts.tv_sec) + tonumber(cpu_ts.tv_nsec) / 1e9
end

-- The cosocket client: res | nil, err for a GET of url (http://host:port/path).
local function cosocket_fetch(url)
  local host, port, path = url:match("^http://([^:/]+):(%d+)(/.*)$")
  if not host then return nil, "not an http://host:port/path URL: " .. url end
  local sock = ngx.socket.tcp()
  sock:settimeout(30000)
  local ok, err = sock:connect(host, tonumber(port))
  if not ok then return nil, err end
  ok, err = sock:send("GET " .. path .. " HTTP/1.1\r\nHost: " .. host .. ":" .. port .. "\r\nUser-Agent: "
    .. "ratewise-bench\r\nAccept: */*\r\n\r\n")
  if not ok then return nil, err end
  local line
  line, err = sock:receive("*l")
  if not line then return nil, err end
  local status = tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
  if not status then return nil, "not a status line: " .. line end
  local length, close = nil, false
  while true do
    line, err = sock:receive("*l")
    if not line then return nil, err end
    if line == "" then break end
    local name, value = line:match("^([^:]+):%s*(.-)%s*$")
    name = name and name:lower()
    if name == "content-length" then length = tonumber(value)
    elseif name == "connection" and value:lower() == "close" then close = true end
  end
  if not length then return nil, "no Content-Length" end
  local body = ""
  if length > 0 then
    body, err = sock:receive(length)
    if not body then return nil, err end
  end
  if close then sock:close() else sock:setkeepalive(60000, 256) end
  return { status = status, body = body }
end

local args = ngx.req.get_uri_args()
local shape, url = args.shape, args.url
local n, conc, size = tonumber(args.n), tonumber(args.conc), tonumber(args.size)
local shapes = { loop = true, map = true, map_fresh = true, sequential = true }
local clients = { ratewise = true, cosocket = true }
local client = args.client or "ratewise"
if not shapes[shape] or type(url) ~= "string" or not n or not conc or not clients[client]
    or (client == "cosocket" and shape ~= "loop" and shape ~= "sequential") then
  ngx.status = 400
  ngx.say("usage: ?shape=loop|map|map_fresh|sequential&url=URL&n=N&conc=C[&size=BYTES][&client=ratewise|cosocket]"
    .. " (cosocket: loop or sequential)")
  return
end

-- The options of every call: no on_retry hook (its default line goes to the
-- error log on a retry; the plain contender retries nothing).
local opts = { on_retry = false }
if client == "cosocket" then fetch = cosocket_fetch end
local failed, first_failure = 0, nil

local function good(res)
  return res ~= nil and res.status == 200 and (size == nil or #res.body == size)
end

local function note(res, err)
  failed = failed + 1
  if not first_failure then
    first_failure = not res and tostring(err) or res.status ~= 200 and ("status " .. tostring(res.status))
      or format("a body of %d bytes, not %d", #res.body, size)
  end
end

local work
if shape == "loop" then
  -- conc light threads of this request, each looping over its share.
  work = function()
    local threads = {}
    for t = 1, conc do
      local count = floor(n / conc) + (t <= n % conc and 1 or 0)
      if count > 0 then
        threads[#threads + 1] = ngx.thread.spawn(function()
          for _ = 1, count do
            local res, err = fetch(url, opts)
            if not good(res) then note(res, err) end
          end
        end)
      end
    end
    for t = 1, #threads do
      local ok, err = ngx.thread.wait(threads[t])
      if not ok then error(err, 0) end
    end
  end
elseif shape == "sequential" then
  work = function()
    for _ = 1, n do
      local res, err = fetch(url, opts)
      if not good(res) then note(res, err) end
    end
  end
else
  -- rw.map as it is written outside OpenResty; the list made before the
  -- clock starts, the results read after it stops.
  local list = {}
  for i = 1, n do list[i] = url end
  local call = function(u) return fetch(u, opts) end
  if shape == "map_fresh" then
    -- far enough off that no call runs out of it (as bench/shapes.lua's)
    local deadline = now() + 3600
    call = function(u) return fetch(u, { max_elapsed = deadline - now(), on_retry = false }) end
  end
  work = function()
    local results, errors = rw.map(list, call, { concurrency = conc })
    return function()
      for i = 1, n do
        if not good(results[i]) then note(results[i], errors[i]) end
      end
    end
  end
end

collectgarbage("collect")
collectgarbage("collect")
local c0, t0 = cpu_seconds(), now()
local after = work()
local secs, cpu = now() - t0, cpu_seconds() - c0
if after then after() end
ngx.say(format("requests=%d failed=%d seconds=%.6f rate=%.1f cpu_us=%.2f", n, failed, secs, n / secs,
  cpu * 1e6 / n))
if first_failure then ngx.say("first failure: ", first_failure) end
