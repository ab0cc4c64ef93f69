--- A private HAProxy (Debian's haproxy 2.6) on loopback, configured as its
-- users configure a rate limit: a stick table that tracks each client's
-- http_req_rate over a sliding window, and a 429 above the rate. HAProxy
-- counts every request it sees, the refused ones too, so a client that
-- keeps sending while refused keeps its own window full.
--
--   local haproxy = require "spec.support.haproxy"
--   local h = haproxy.start { rate = 200 [, window = "1s"] [, retry_after = 1] }
--   h:url("/api"), h:counts() --> accepted, refused (since start), h:stop()
--
--   local h = haproxy.run { dir = d, config = d .. "/haproxy.cfg" [, seconds = 60] }
--   h:alive(), h:output(), h:stop()    -- a configuration of the caller's, in the foreground
--
-- The limited frontend answers "ok" itself (http-request return): no
-- backend. A second frontend serves HAProxy's statistics as CSV, from
-- which counts() reads the limited frontend's 2xx and 4xx answers.
local socket = require "socket"
local server = require "spec.support.server"

local M = {}

M.BINARY = "/usr/sbin/haproxy"

local read_file, free_port = server.read_file, server.free_port

local function run(command)
  local ok = os.execute(command)
  return ok == true or ok == 0
end

local Haproxy = {}
Haproxy.__index = Haproxy

--- h = haproxy.start{rate = r [, window = "1s"] [, retry_after = seconds | false]}:
-- 429 (with Retry-After unless retry_after is false; 1 by default) once a
-- client's rate over the window is above r.
function M.start(opts)
  local rate = assert(tonumber(opts.rate), "haproxy.start: rate must be a number")
  local window = opts.window or "1s"
  local retry_after = opts.retry_after == nil and 1 or opts.retry_after
  local dir = os.tmpname()
  os.remove(dir)
  assert(run("mkdir -p " .. dir))
  local port, stats_port = free_port(), free_port()
  local refuse = "http-request return status 429 content-type text/plain string \"slow down\""
    .. (retry_after and (" hdr Retry-After " .. retry_after) or "") .. " if { sc_http_req_rate(0) gt " .. rate
    .. " }"
  local conf = table.concat({
    "global",
    "  pidfile " .. dir .. "/haproxy.pid",
    "  maxconn 4096",
    "defaults",
    "  mode http",
    "  timeout connect 5s",
    "  timeout client 30s",
    "  timeout server 30s",
    "  timeout http-keep-alive 30s",
    "frontend limited",
    "  bind 127.0.0.1:" .. port,
    "  stick-table type ip size 1k expire 30s store http_req_rate(" .. window .. ")",
    "  http-request track-sc0 src",
    "  " .. refuse,
    "  http-request return status 200 content-type text/plain string ok",
    "frontend stats",
    "  bind 127.0.0.1:" .. stats_port,
    "  stats enable",
    "  stats uri /stats",
    "",
  }, "\n")
  local f = assert(io.open(dir .. "/haproxy.cfg", "w"))
  f:write(conf)
  f:close()
  local h = setmetatable({ dir = dir, port = port, stats_port = stats_port,
    base = "http://127.0.0.1:" .. port }, Haproxy)
  if not run(M.BINARY .. " -D -f " .. dir .. "/haproxy.cfg >" .. dir .. "/start.log 2>&1") then
    local log = read_file(dir .. "/start.log") or ""
    os.execute("rm -rf " .. dir)
    error("haproxy did not start:\n" .. log, 2)
  end
  local deadline = socket.gettime() + 5
  while not h:counts() do
    if socket.gettime() > deadline then
      h:stop()
      error("haproxy does not answer", 2)
    end
    socket.sleep(0.05)
  end
  return h
end

function Haproxy:url(path)
  return self.base .. path
end

--- accepted, refused = h:counts(): the 2xx and the 4xx the limited
-- frontend has answered since it started (nil while it does not answer).
function Haproxy:counts()
  local http = require "socket.http"
  local body = http.request("http://127.0.0.1:" .. self.stats_port .. "/stats;csv")
  if not body then return nil end
  local header = body:match("^# ([^\n]*)")
  if not header then return nil end
  local columns = {}
  for name in (header .. ","):gmatch("([^,]*),") do columns[#columns + 1] = name end
  for line in body:gmatch("[^\n]+") do
    if line:sub(1, 17) == "limited,FRONTEND," then
      local row, i = {}, 0
      for value in (line .. ","):gmatch("([^,]*),") do
        i = i + 1
        row[columns[i]] = value
      end
      return tonumber(row.hrsp_2xx), tonumber(row.hrsp_4xx)
    end
  end
  return nil
end

-- Whether the process runs: a zombie (HAProxy daemonized, its parent gone,
-- waiting for init to reap it) does not.
local function running(pid)
  local stat = read_file("/proc/" .. pid .. "/stat")
  return stat ~= nil and stat:match("%) (%a)") ~= "Z"
end

--- h = haproxy.run{dir = d, config = path [, seconds = 60]}: HAProxy in the
-- foreground (-db) on a configuration of the caller's, under `timeout`
-- (ended after the seconds whatever happens), started from d, its output in
-- d/haproxy.log; h:stop() ends it and removes d. It is not waited for: the
-- caller knows what answers once it is up.
function M.run(opts)
  local dir = assert(opts.dir, "haproxy.run: dir is required")
  local seconds = opts.seconds or 60
  assert(run(("cd '%s' && (timeout %d %s -db -f '%s' </dev/null >haproxy.log 2>&1 & echo $! >haproxy.pid)"):format(
    dir, seconds, M.BINARY, assert(opts.config, "haproxy.run: config is required"))))
  return setmetatable({ dir = dir }, Haproxy)
end

--- yes = h:alive(): the process runs (h of haproxy.run).
function Haproxy:alive()
  local pid = tonumber(read_file(self.dir .. "/haproxy.pid") or "")
  return pid ~= nil and running(pid)
end

--- text = h:output(): what HAProxy wrote (h of haproxy.run).
function Haproxy:output()
  return read_file(self.dir .. "/haproxy.log") or ""
end

--- Stops HAProxy and removes its folder. Idempotent.
function Haproxy:stop()
  if self.stopped then return end
  self.stopped = true
  local pid = tonumber(read_file(self.dir .. "/haproxy.pid") or "")
  if pid then
    os.execute("kill -TERM " .. pid .. " 2>/dev/null")
    local deadline = socket.gettime() + 3
    while socket.gettime() < deadline and running(pid) do socket.sleep(0.02) end
    os.execute("kill -KILL " .. pid .. " 2>/dev/null")
  end
  os.execute("rm -rf " .. self.dir)
end

return M
