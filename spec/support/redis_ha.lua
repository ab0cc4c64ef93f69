-- Redis as it is run for availability, on loopback, for the specs: a
-- primary, a replica and three redis-sentinels (Debian's redis-sentinel)
-- tuned to fail over within seconds, or a Redis Cluster of three primaries.
--
--   local ha = require "spec.support.redis_ha"
--   local s = ha.sentinel()     -- s.primary, s.replica (spec.support.redis),
--                               -- s.sentinels ("127.0.0.1:port" each), s.master
--   s:master_port()             -- what the first sentinel names now
--   s:destroy()
--   local c = ha.cluster { replicas = 1 } -- c.nodes (spec.support.redis), c.node_id(node), c:owner(key)
--   c:destroy()
local socket = require "socket"
local redis = require "spec.support.redis"
local free_port = require("spec.support.server").free_port

local M = {}

M.MASTER = "mymaster"

local function have(binary)
  return os.execute("command -v " .. binary .. " >/dev/null 2>&1") == true
    or os.execute("command -v " .. binary .. " >/dev/null 2>&1") == 0
end

--- true | false, why: whether the servers can be started here.
function M.available()
  for _, binary in ipairs { "redis-server", "redis-sentinel", "redis-cli" } do
    if not have(binary) then return false, binary .. " is not installed" end
  end
  return true
end

--- it, true | a test that is pending with the reason, false: what a spec
-- of these servers runs its tests with, and whether they run (busted's it
-- and pending are the spec file's own).
function M.test(it, pending, has_redis)
  if not has_redis then
    return function(name) pending(name .. " [this build has no Redis support: REDIS=0]") end, false
  end
  local ok, why = M.available()
  if not ok then return function(name) pending(name .. " [" .. why .. "]") end, false end
  return it, true
end

local function cli(port, args)
  local p = assert(io.popen("redis-cli -p " .. port .. " " .. args .. " 2>&1"))
  local out = p:read("*a")
  p:close()
  return (out:gsub("%s+$", ""))
end

local function wait_until(what, seconds, fn)
  local deadline = socket.gettime() + seconds
  while socket.gettime() < deadline do
    if fn() then return end
    socket.sleep(0.05)
  end
  error("spec.support.redis_ha: " .. what .. " did not happen within " .. seconds .. " s")
end

local Sentinel = {}
Sentinel.__index = Sentinel

--- The port the first sentinel names for the master now.
function Sentinel:master_port()
  local port = self.sentinel_ports[1]
  return tonumber(cli(port, "SENTINEL get-master-addr-by-name " .. M.MASTER):match("\n(%d+)$"))
end

--- What a sentinel answers, as text.
function Sentinel:sentinel_cli(i, args)
  return cli(self.sentinel_ports[i], args)
end

function Sentinel:destroy()
  for _, port in ipairs(self.sentinel_ports) do cli(port, "SHUTDOWN NOSAVE") end
  os.execute("rm -rf '" .. self.dir .. "'")
  self.primary:destroy()
  self.replica:destroy()
end

--- A primary, its replica, and 3 sentinels with a quorum of 2 that see
-- each other and the replica, with the master down after down_after ms.
function M.sentinel(opts)
  opts = opts or {}
  -- A replica's first sync starts at once, not after the default 5 s of
  -- waiting for more replicas to share a diskless transfer.
  local primary = redis.start { "--repl-diskless-sync-delay", "0" }
  local replica = redis.start { "--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", tostring(primary.port) }
  local p = assert(io.popen("mktemp -d /tmp/ratewise-sentinel.XXXXXX"))
  local dir = p:read("*l")
  p:close()
  local self = setmetatable({ primary = primary, replica = replica, dir = dir, sentinel_ports = {},
    sentinels = {}, master = M.MASTER }, Sentinel)
  -- Each sentinel is told of the replica and of the other two (as a
  -- sentinel's own rewritten config keeps them), rather than finding them
  -- by INFO every 10 s and the master's hello channel every 2 s.
  for i = 1, 3 do self.sentinel_ports[i] = free_port() end
  wait_until("the replica's sync", 10, function()
    return replica:cli("INFO", "replication"):find("master_link_status:up", 1, true)
  end)
  for i = 1, 3 do
    local port = self.sentinel_ports[i]
    local known = {
      string.format("sentinel myid %s", string.rep(tostring(i), 40)),
      string.format("sentinel known-replica %s 127.0.0.1 %d", M.MASTER, replica.port),
    }
    for j = 1, 3 do
      if j ~= i then
        known[#known + 1] = string.format("sentinel known-sentinel %s 127.0.0.1 %d %s", M.MASTER,
          self.sentinel_ports[j], string.rep(tostring(j), 40))
      end
    end
    local conf = string.format("%s/sentinel%d.conf", dir, i)
    local f = assert(io.open(conf, "w"))
    f:write(table.concat({
      "port " .. port, "bind 127.0.0.1", "daemonize yes",
      string.format("pidfile %s/sentinel%d.pid", dir, i), string.format("logfile %s/sentinel%d.log", dir, i),
      "dir " .. dir,
      string.format("sentinel monitor %s 127.0.0.1 %d 2", M.MASTER, primary.port),
      string.format("sentinel down-after-milliseconds %s %d", M.MASTER, opts.down_after or 400),
      string.format("sentinel failover-timeout %s 2000", M.MASTER),
      table.concat(known, "\n"),
      "",
    }, "\n"))
    f:close()
    assert(os.execute("redis-sentinel " .. conf .. " >/dev/null 2>&1"))
    self.sentinels[i] = "127.0.0.1:" .. port
  end
  wait_until("the sentinels meeting", 15, function()
    for _, port in ipairs(self.sentinel_ports) do
      local info = cli(port, "SENTINEL MASTER " .. M.MASTER)
      if not info:find("num%-other%-sentinels\n2") or not info:find("num%-slaves\n1") then return false end
    end
    return true
  end)
  return self
end

local Cluster = {}
Cluster.__index = Cluster

--- The node's cluster id.
function Cluster.node_id(node)
  return node:cli("CLUSTER", "MYID")
end

--- The nodes that are primaries now.
function Cluster:primaries()
  local out = {}
  for _, node in ipairs(self.nodes) do
    if node:cli("ROLE"):match("^master") then out[#out + 1] = node end
  end
  return out
end

--- The node serving a key's slot (the others answer MOVED).
function Cluster:owner(key)
  for _, node in ipairs(self.nodes) do
    if node:cli("EXISTS", key):match("^%d+$") then return node end
  end
end

--- One command's count of calls and of rejected calls (MOVED, ASK) on a
-- node, from INFO commandstats.
function Cluster.calls(node, command)
  local stats = node:cli("INFO", "commandstats")
  local calls = stats:match("cmdstat_" .. command:gsub("|", "%%|") .. ":calls=(%d+)")
  local rejected = stats:match("cmdstat_" .. command:gsub("|", "%%|") .. ":[^\n]*rejected_calls=(%d+)")
  return tonumber(calls) or 0, tonumber(rejected) or 0
end

function Cluster:destroy()
  for _, node in ipairs(self.nodes) do node:destroy() end
end

--- Three primaries sharing the 16384 slots (and a replica each with
-- {replicas = 1}), the cluster state ok on each.
function M.cluster(opts)
  local replicas = opts and opts.replicas or 0
  local self = setmetatable({ nodes = {} }, Cluster)
  local addresses = {}
  for i = 1, 3 * (1 + replicas) do
    local node = redis.start { "--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
      "--cluster-port", tostring(free_port()), "--cluster-config-file", "nodes.conf",
      "--repl-diskless-sync-delay", "0" }
    self.nodes[i] = node
    addresses[i] = "127.0.0.1:" .. node.port
  end
  local out = cli(self.nodes[1].port, "--cluster create " .. table.concat(addresses, " ")
    .. " --cluster-replicas " .. replicas .. " --cluster-yes")
  assert(out:find("All 16384 slots covered", 1, true), out)
  wait_until("the cluster's state ok", 10, function()
    for _, node in ipairs(self.nodes) do
      if not node:cli("CLUSTER", "INFO"):find("cluster_state:ok", 1, true) then return false end
      local replication = node:cli("INFO", "replication")
      if replication:find("role:slave", 1, true) and not replication:find("master_link_status:up", 1, true) then
        return false
      end
    end
    return true
  end)
  return self
end

--- back, failures, slowest, kinds = M.until_admitted(bucket, since): takes
-- from bucket (in a task, every 0.02 s) until it admits or 15 s have passed
-- since `since` (rw.now()): how long after `since` it admitted (nil: never),
-- how many takes failed before, the slowest take, and the kinds of the
-- failures (a set).
function M.until_admitted(bucket, since)
  local rw = require "ratewise"
  local back, failures, slowest, kinds = nil, 0, 0, {}
  rw.run(function()
    while rw.now() - since < 15 do
      local t0 = rw.now()
      local ok, err = bucket:take()
      slowest = math.max(slowest, rw.now() - t0)
      if ok then
        back = rw.now() - since
        break
      end
      failures = failures + 1
      kinds[err.kind] = true
      rw.sleep(0.02)
    end
  end)
  return back, failures, slowest, kinds
end

return M
