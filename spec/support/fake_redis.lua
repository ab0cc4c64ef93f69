-- A fake Redis whose answers a spec scripts (spec/support/fake_redis.py),
-- for what a real redis-server never says: a broken or hostile reply.
--
--   local fake_redis = require "spec.support.fake_redis"
--   local f = fake_redis.start { EVALSHA = "*3\r\n:9223372036854775807\r\n:1\r\n:0\r\n" }
--   f.url          -- "redis://127.0.0.1:<port>"
--   f:commands()   -- what it was sent, one string a command ("AUTH hunter2")
--   f:stop()
local cjson = require("cjson").new()
local server = require "spec.support.server"

local M = {}
local Fake = {}
Fake.__index = Fake

local SCRIPT = server.SCRIPT:gsub("server%.py$", "fake_redis.py")

--- f = fake_redis.start(replies): command name -> raw RESP answer; any
-- other command gets +OK.
function M.start(replies)
  local log, script = os.tmpname(), os.tmpname()
  local f = assert(io.open(script, "wb"))
  f:write(cjson.encode(replies))
  f:close()
  local p = assert(io.popen("exec " .. server.PYTHON .. " " .. SCRIPT .. " " .. script .. " " .. log, "r"))
  local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
  os.remove(script)
  assert(port, "spec.support.fake_redis: the fake did not start")
  return setmetatable({ p = p, pid = pid, log = log, port = tonumber(port),
    url = "redis://127.0.0.1:" .. port }, Fake)
end

function Fake:commands()
  local lines = {}
  local f = io.open(self.log, "rb")
  if f then
    for line in f:lines() do lines[#lines + 1] = line end
    f:close()
  end
  return lines
end

function Fake:stop()
  os.execute("kill " .. self.pid .. " 2>/dev/null")
  self.p:close()
  os.remove(self.log)
end

return M
