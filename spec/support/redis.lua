-- A private redis-server for the specs (Debian's redis-server): no
-- persistence, a free port of 127.0.0.1, started and stopped by the suite.
--
--   local redis = require "spec.support.redis"
--   local r = redis.start()
--   local r = redis.start { "--replicaof", "127.0.0.1", 6379 } -- more arguments
--   r.url            -- "redis://127.0.0.1:<port>"
--   r:cli("KEYS", "*") -- redis-cli's answer, as text
--   r:stop()  r:restart()   -- the same port again
--   r:destroy()             -- stopped, its directory removed
local socket = require "socket"

local M = {}
local Redis = {}
Redis.__index = Redis

local free_port = require("spec.support.server").free_port

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function up(port)
  local c = socket.tcp()
  c:settimeout(0.2)
  local ok = c:connect("127.0.0.1", port)
  if not ok then c:close() return false end
  c:send("PING\r\n")
  local line = c:receive("*l")
  c:close()
  return line == "+PONG"
end

function Redis:start()
  local dir = self.dir
  local cmd = table.concat({
    "redis-server", "--port", self.port, "--bind", "127.0.0.1", "--save", "''", "--appendonly", "no",
    "--daemonize", "yes", "--dir", dir, "--pidfile", dir .. "/redis.pid", "--logfile", dir .. "/redis.log",
    table.concat(self.args, " "),
  }, " ")
  assert(os.execute(cmd .. " >/dev/null 2>&1"))
  for _ = 1, 100 do
    if up(self.port) then return self end
    socket.sleep(0.05)
  end
  error("spec.support.redis: redis-server did not start on port " .. self.port)
end

--- The answer of redis-cli to one command, as text.
function Redis:cli(...)
  local args = {}
  for i = 1, select("#", ...) do args[i] = shell_quote((select(i, ...))) end
  local p = assert(io.popen("redis-cli -p " .. self.port .. " " .. table.concat(args, " ") .. " 2>&1"))
  local out = p:read("*a")
  p:close()
  return (out:gsub("%s+$", ""))
end

function Redis:stop()
  os.execute("redis-cli -p " .. self.port .. " shutdown nosave >/dev/null 2>&1")
  for _ = 1, 100 do
    if not up(self.port) then return end
    socket.sleep(0.05)
  end
  error("spec.support.redis: redis-server did not stop")
end

function Redis:restart()
  return self:start()
end

--- Stops it (if it runs) and removes its directory.
function Redis:destroy()
  if up(self.port) then self:stop() end
  os.execute("rm -rf " .. shell_quote(self.dir))
end

function M.start(args)
  local p = assert(io.popen("mktemp -d /tmp/ratewise-redis.XXXXXX"))
  local dir = p:read("*l")
  p:close()
  local port = free_port()
  local quoted = {}
  for i, a in ipairs(args or {}) do quoted[i] = shell_quote(a) end
  local r = setmetatable({ dir = dir, port = port, url = "redis://127.0.0.1:" .. port, args = quoted }, Redis)
  return r:start()
end

return M
