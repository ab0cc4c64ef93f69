-- Where the shared buckets' Redis is: one server (a redis:// URL), a
-- master that Sentinels name (a redis+sentinel:// URL, or a table with
-- `sentinels` and `master`), or a Redis Cluster (a table with `cluster`).
-- Each gives a client with call(...), call_until(deadline, ...) and
-- close(), as redis.lua's: redis_bucket.lua does not know which it holds.
--
-- Sentinel follows the Sentinel client guidelines (and redis-py): every
-- connection asks the sentinels in turn for the master's address (the one
-- that answered is asked first next time), and the node must answer ROLE
-- with "master". A connection that fails, or a READONLY that drops it,
-- makes the next one ask again.
--
-- Cluster follows hiredis-cluster: the slot map comes from CLUSTER SLOTS,
-- a command goes to the node of its key's slot, MOVED updates that slot
-- and has the whole map read again before the next command, ASK sends
-- ASKING and the command to the node named, without changing the map.
local core = require "ratewise.core"
local redis = require "ratewise.redis"

local now = core.now
local format, type, tostring, tonumber, setmetatable, pairs, ipairs =
  string.format, type, tostring, tonumber, setmetatable, pairs, ipairs
local floor, concat, remove, insert = math.floor, table.concat, table.remove, table.insert
local byte = string.byte

local topology = {}

local SENTINEL_PORT = 26379
local SLOTS = 16384
-- Redirections one command follows at most (hiredis-cluster's default).
local MAX_REDIRECTS = 5

local known_fields = {
  sentinels = true, master = true, cluster = true, db = true,
  username = true, password = true, sentinel_username = true, sentinel_password = true,
}

--- bool = topology.is_config(value): a table naming sentinels or a cluster
-- (not a client object, which has evalsha).
function topology.is_config(value)
  return type(value) == "table" and (rawget(value, "sentinels") ~= nil or rawget(value, "cluster") ~= nil)
end

-- A list of "host[:port]" as {{host = h, port = p}, ...} | nil, err.
local function addresses(list, field, default_port)
  if type(list) ~= "table" or #list == 0 then
    return nil, format("'%s' must be a list of \"host[:port]\" (got %s)", field, type(list))
  end
  local out = {}
  for i, text in ipairs(list) do
    if type(text) ~= "string" then
      return nil, format("'%s'[%d] must be a string \"host[:port]\" (got %s)", field, i, type(text))
    end
    local host, port = redis.parse_address(text, default_port)
    if not host then return nil, format("'%s'[%d]: %s", field, i, port) end
    out[i] = { host = host, port = port }
  end
  return out
end

-- The table form, checked, as parse_url's record | nil, err.
local function from_table(t)
  for k in pairs(t) do
    if not known_fields[k] then
      local names = {}
      for name in pairs(known_fields) do names[#names + 1] = name end
      table.sort(names)
      return nil, format("unknown field '%s' (known: %s)", tostring(k), concat(names, ", "))
    end
  end
  for _, k in ipairs { "username", "password", "sentinel_username", "sentinel_password" } do
    if t[k] ~= nil and type(t[k]) ~= "string" then return nil, format("'%s' must be a string", k) end
  end
  local db = t.db or 0
  if type(db) ~= "number" or db % 1 ~= 0 or db < 0 then
    return nil, "'db' must be a database number (0 or more)"
  end
  local config = { db = db, username = t.username, password = t.password,
    sentinel_username = t.sentinel_username, sentinel_password = t.sentinel_password }
  local err
  if t.sentinels ~= nil then
    if t.cluster ~= nil then return nil, "'sentinels' and 'cluster' are two topologies: name one" end
    if type(t.master) ~= "string" or t.master == "" then
      return nil, "'master' must name the master the sentinels monitor (a non-empty string)"
    end
    config.master = t.master
    config.sentinels, err = addresses(t.sentinels, "sentinels", SENTINEL_PORT)
  else
    if t.master ~= nil or t.sentinel_username ~= nil or t.sentinel_password ~= nil then
      return nil, "'master', 'sentinel_username' and 'sentinel_password' go with 'sentinels'"
    end
    if db ~= 0 then return nil, "a Redis Cluster has database 0 only" end
    config.cluster, err = addresses(t.cluster, "cluster", 6379)
  end
  if err then return nil, err end
  return config
end

-- Asks the servers of a list in turn until one answers (ask(item, deadline)
-- -> value | nil, reason), each with a share of the time left, so that a
-- hung one leaves time for the others and for what follows.
local function ask_in_turn(list, deadline, ask)
  local reasons = {}
  for i, item in ipairs(list) do
    local left = deadline - now()
    if left <= 0 then
      reasons[#reasons + 1] = "no time left"
      break
    end
    local value, reason = ask(item, now() + left / (#list - i + 2))
    if value then return value, i end
    reasons[#reasons + 1] = reason
  end
  return nil, concat(reasons, "; ")
end

-- Sentinel ------------------------------------------------------------------

local function sentinel_client(config, timeout)
  local sentinels, master = config.sentinels, config.master
  local function ask(sentinel, deadline)
    local asker = redis.new { host = sentinel.host, port = sentinel.port, timeout = timeout, name = "Sentinel",
      username = config.sentinel_username, password = config.sentinel_password }
    local reply, err = asker:call_until(deadline, "SENTINEL", "get-master-addr-by-name", master)
    asker:close()
    if err then return nil, err end
    local host, port = type(reply) == "table" and reply[1], type(reply) == "table" and tonumber(reply[2])
    if type(host) == "string" and host ~= "" and #host <= 255 and port and port % 1 == 0
      and port >= 1 and port <= 65535 then
      return { host = host, port = port }
    end
    return nil, format("%s: %s", asker.where, reply == nil and format("knows no master '%s'", master)
      or redis.described(reply))
  end
  local function locate(deadline)
    local found, which = ask_in_turn(sentinels, deadline, ask)
    if not found then return nil, "no Sentinel named its address: " .. which end
    -- the sentinel that answered is asked first next time
    insert(sentinels, 1, remove(sentinels, which))
    return found.host, found.port
  end
  return redis.new { locate = locate, name = format("Redis master '%s'", master), db = config.db,
    username = config.username, password = config.password, timeout = timeout }
end

-- Cluster -------------------------------------------------------------------

-- Bitwise exclusive or of two integers below 2^16, in arithmetic: Lua 5.1
-- has no bit operators, and LuaJIT's are not 5.3's.
local function xor16(a, b)
  local result, bit = 0, 1
  while a > 0 or b > 0 do
    local x, y = a % 2, b % 2
    if x ~= y then result = result + bit end
    a, b, bit = (a - x) / 2, (b - y) / 2, bit * 2
  end
  return result
end

-- CRC16-CCITT (XMODEM), the one Redis Cluster hashes keys with.
local CRC16 = {}
for i = 0, 255 do
  local crc = i * 256
  for _ = 1, 8 do
    crc = crc * 2
    if crc >= 65536 then crc = xor16(crc - 65536, 0x1021) end
  end
  CRC16[i] = crc
end

--- slot = topology.key_slot(key): the key's hash slot, of its hash tag (the
-- text between the first "{" and the next "}") when that is not empty.
function topology.key_slot(key)
  local open = key:find("{", 1, true)
  if open then
    local close = key:find("}", open + 1, true)
    if close and close > open + 1 then key = key:sub(open + 1, close - 1) end
  end
  local crc = 0
  for i = 1, #key do
    crc = xor16((crc * 256) % 65536, CRC16[xor16(floor(crc / 256), byte(key, i))])
  end
  return crc % SLOTS
end

local Cluster = {}
Cluster.__index = Cluster

local function cluster_client(config, timeout)
  return setmetatable({
    seeds = config.cluster, username = config.username, password = config.password, timeout = timeout,
    nodes = {},      -- "host:port" -> a redis.lua client of that node
    slots = false,   -- slot -> "host:port", once read
    stale = true,    -- the map is read again before the next command
  }, Cluster)
end

local function node(self, address)
  local client = self.nodes[address]
  if not client then
    local host, port = address:match("^%[?(.-)%]?:(%d+)$")
    client = redis.new { host = host, port = tonumber(port), timeout = self.timeout,
      username = self.username, password = self.password }
    self.nodes[address] = client
  end
  return client
end

local function valid_port(port)
  return type(port) == "number" and port % 1 == 0 and port >= 1 and port <= 65535
end

-- CLUSTER SLOTS' answer as slot -> "host:port" | nil, what is wrong. A
-- node whose address is "" is the one asked (its own view of itself).
local function slot_map(reply, asked)
  if type(reply) ~= "table" or reply.err or #reply == 0 then
    return nil, format("CLUSTER SLOTS: %s", redis.described(reply))
  end
  local slots = {}
  for _, range in ipairs(reply) do
    local first, last, master = range[1], range[2], range[3]
    if type(first) ~= "number" or type(last) ~= "number" or first < 0 or last >= SLOTS or first > last
      or type(master) ~= "table" or type(master[1]) ~= "string" or not valid_port(master[2]) then
      return nil, "CLUSTER SLOTS: an answer that is not a slot map"
    end
    local host = master[1] ~= "" and master[1] or asked.host
    local address = format(host:find(":", 1, true) and "[%s]:%d" or "%s:%d", host, master[2])
    for slot = first, last do slots[slot] = address end
  end
  return slots
end

-- Reads the slot map from the nodes known, then the configured ones.
local function refresh(self, deadline)
  local candidates, seen = {}, {}
  local function add(address)
    if not seen[address] then
      seen[address] = true
      candidates[#candidates + 1] = address
    end
  end
  if self.slots then
    for slot = 0, SLOTS - 1, 256 do
      if self.slots[slot] then add(self.slots[slot]) end
    end
  end
  for _, seed in ipairs(self.seeds) do
    add(format(seed.host:find(":", 1, true) and "[%s]:%d" or "%s:%d", seed.host, seed.port))
  end
  local slots, err = ask_in_turn(candidates, deadline, function(address, until_)
    local client = node(self, address)
    local reply, cerr = client:call_until(until_, "CLUSTER", "SLOTS")
    if cerr then return nil, cerr end
    local map, merr = slot_map(reply, client)
    if not map then return nil, format("%s: %s", client.where, merr) end
    return map
  end)
  if not slots then return nil, "Redis Cluster: no node answered with its slot map: " .. err end
  self.slots, self.stale = slots, false
  return true
end

-- The slot of the key of a command the buckets send (EVAL and EVALSHA with
-- keys); nil for one without a key (SCRIPT LOAD).
local function command_slot(name, _, numkeys, key)
  if (name == "EVALSHA" or name == "EVAL") and tonumber(numkeys) and tonumber(numkeys) >= 1
    and type(key) == "string" then
    return topology.key_slot(key)
  end
end

-- "MOVED"|"ASK", slot, "host:port" of a redirection; nil for any other reply.
local function redirection(reply)
  if type(reply) ~= "table" or type(reply.err) ~= "string" then return nil end
  local kind, slot, address = reply.err:match("^(%u+) (%d+) (%S+:%d+)$")
  slot = tonumber(slot)
  if (kind == "MOVED" or kind == "ASK") and slot and slot < SLOTS then return kind, slot, address end
end

function Cluster:call_until(deadline, ...)
  if self.stale then
    local ok, err = refresh(self, deadline)
    if not ok and not self.slots then return nil, err end
  end
  local slot = command_slot(...) or 0
  local address = self.slots[slot]
  if not address then
    self.stale = true
    return nil, format("Redis Cluster: no node serves slot %d", slot)
  end
  local asking = false
  for _ = 0, MAX_REDIRECTS do
    local client = node(self, address)
    local reply, err
    if asking then
      -- ASKING holds for the next command of the connection; should
      -- another task's slip in between, ours is redirected again.
      reply, err = client:call_until(deadline, "ASKING")
      if not err then reply, err = client:call_until(deadline, ...) end
    else
      reply, err = client:call_until(deadline, ...)
    end
    if err then
      -- the node may be gone (a failover): ask for the map next time
      self.stale = true
      return nil, err
    end
    local kind, to_slot, to = redirection(reply)
    if kind == "MOVED" then
      self.slots[to_slot], self.stale, address, asking = to, true, to, false
    elseif kind == "ASK" then
      address, asking = to, true
    else
      if type(reply) == "table" and type(reply.err) == "string" and reply.err:find("^CLUSTERDOWN") then
        self.stale = true
      end
      return reply
    end
  end
  return nil, format("Redis Cluster: slot %d was redirected more than %d times", slot, MAX_REDIRECTS)
end

function Cluster:call(...)
  return self:call_until(now() + self.timeout, ...)
end

function Cluster:close()
  for _, client in pairs(self.nodes) do client:close() end
end

-- ---------------------------------------------------------------------------

--- client = topology.client(target, timeout) | nil, err: a client for a
-- redis:// or redis+sentinel:// URL, or a table naming `sentinels` (and
-- `master`) or `cluster`. err never holds the password.
function topology.client(target, timeout)
  local config, err
  if type(target) == "string" then config, err = redis.parse_url(target) else config, err = from_table(target) end
  if not config then return nil, err end
  if config.sentinels then return sentinel_client(config, timeout) end
  if config.cluster then return cluster_client(config, timeout) end
  return redis.new { host = config.host, port = config.port, db = config.db, username = config.username,
    password = config.password, timeout = timeout }
end

return topology
