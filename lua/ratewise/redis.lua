-- A small Redis client for the shared buckets (redis_bucket.lua): one
-- connection of the C core (ratewise.Redis: hiredis formats and parses),
-- one command at a time, every wait for its socket a wait of the seam
-- (runtime.await_fd: the engine watches it), so that a task waiting on
-- Redis waits with the transfers and never blocks the others. Not a
-- general Redis client: it knows what the buckets need (AUTH, SELECT,
-- EVALSHA, SCRIPT LOAD).
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local headers = require "ratewise.headers"
local runtime = require "ratewise.runtime"

local now = core.now
local format, tonumber, type, tostring, setmetatable = string.format, tonumber, type, tostring, setmetatable
local sub = string.sub
local percent_decode = headers.percent_decode

local redis = {}

-- After a failed connection, a reply that did not come in time, or a node
-- that is no longer the primary, the next attempt waits this long: while
-- Redis is down or hung, callers learn it at once instead of each paying
-- a timeout and opening a connection.
local RECONNECT_AFTER = 0.5
redis.RECONNECT_AFTER = RECONNECT_AFTER

-- Whether the C core has its Redis connection (built without hiredis, `make
-- REDIS=0`, it has not), and what a caller who needs it is told.
redis.available = core.redis == true
redis.MISSING = "ratewise was built without Redis support (REDIS=0): rebuild with hiredis "
  .. "(Debian's libhiredis-dev), or pass a client object such as resty.redis"

-- What is kept of an error the server answers with: its words go into
-- error messages and log lines, and a broken server may send a megabyte.
local MAX_SERVER_WORDS = 200

--- host, port = redis.parse_address(text, default_port) | nil, err
-- host[:port], an IPv6 host in brackets ([::1]:6379).
function redis.parse_address(text, default_port)
  local host, port = text:match("^%[([^%]]+)%]:?(%d*)$")
  if not host then host, port = text:match("^([^:/,@%[%]]+):?(%d*)$") end
  if not host or host == "" then return nil, "an address needs a host (host[:port])" end
  port = port ~= "" and tonumber(port) or default_port
  if port < 1 or port > 65535 then return nil, "the port must be from 1 to 65535" end
  return host, port
end

-- username, password of a URL's userinfo ("user:password", ":password" or
-- "password"), %XX decoded.
local function parse_userinfo(userinfo)
  local username, password = userinfo:match("^([^:]*):(.*)$")
  if not username then password = userinfo end
  if username == "" then username = nil end
  return username and percent_decode(username), percent_decode(password)
end

--- target = redis.parse_url(url) | nil, err
-- redis://[[username]:password@]host[:port][/db], an IPv6 host in brackets:
--   {host = h, port = p, db = n, username = u, password = pw}
-- redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/master[/db]
-- (the sentinels, 26379 by default; the credentials are the master's):
--   {sentinels = {{host = h, port = p}, ...}, master = name, db = n, username = u, password = pw}
-- The userinfo runs to the last "@" (the path holds none), so that a
-- password holding "@" or "/" is neither cut nor taken for a host.
function redis.parse_url(url)
  if type(url) ~= "string" then return nil, "a redis:// URL must be a string" end
  local scheme, rest = url:match("^(redis%+?%a*)://(.*)$")
  if scheme ~= "redis" and scheme ~= "redis+sentinel" then
    return nil, "not a redis:// URL (nor redis+sentinel://)"
  end
  local target = { db = 0 }
  local userinfo, hostpart = rest:match("^(.*)@(.*)$")
  if userinfo then target.username, target.password = parse_userinfo(userinfo) else hostpart = rest end
  local authority, path = hostpart:match("^([^/]*)(.*)$")
  if scheme == "redis+sentinel" then
    local master, db = path:match("^/([^/]+)/?(%d*)$")
    if not master then
      return nil, "a redis+sentinel:// URL names the master after the sentinels (/mymaster[/db])"
    end
    target.master, target.db = percent_decode(master), tonumber(db) or 0
    target.sentinels = {}
    for address in (authority .. ","):gmatch("([^,]*),") do
      local host, port = redis.parse_address(address, 26379)
      if not host then return nil, "a sentinel's address: " .. port end
      target.sentinels[#target.sentinels + 1] = { host = host, port = port }
    end
    return target
  end
  local host, port = redis.parse_address(authority, 6379)
  if not host then return nil, "a redis:// URL needs a host" .. (authority ~= "" and ": " .. port or "") end
  target.host, target.port = host, port
  if path ~= "" and path ~= "/" then
    target.db = tonumber(path:match("^/(%d+)$"))
    if not target.db then return nil, "the path of a redis:// URL is a database number (/0)" end
  end
  return target
end

--- text = redis.described(reply): a reply that is not the one expected,
-- for an error message: the server's words for an error reply, its kind
-- for anything else (never its content).
function redis.described(reply)
  local t = type(reply)
  if t == "table" and type(reply.err) == "string" then return reply.err end
  if t == "table" then return format("an answer of %d elements", #reply) end
  if reply == nil then return "a nil answer" end
  return "an answer that is a " .. t
end

local Client = {}
Client.__index = Client

--- client = redis.new{host = h, port = p, db = n, username = u, password = pw, timeout = s
--   [, locate = fn, name = text]}
-- locate (redis_topology.lua's Sentinel): each connection first asks
-- locate(deadline) for host, port | nil, err, and the server it reaches
-- must say with ROLE that it is a master; name ("Redis master 'm'") then
-- names it in errors, with the address it was found at.
function redis.new(opts)
  if not redis.available then error(redis.MISSING, 2) end
  -- a server may echo them in its errors (a failed AUTH)
  local secrets = {}
  secrets[#secrets + 1] = opts.password
  secrets[#secrets + 1] = opts.username
  local name = opts.name or "Redis"
  return setmetatable({
    host = opts.host, port = opts.port, db = opts.db or 0,
    username = opts.username, password = opts.password,
    timeout = opts.timeout,
    locate = opts.locate, name = name,
    conn = false,
    -- down_reason: why the last attempt failed, until one succeeds;
    -- probing: a call is finding out whether Redis is back (one at a time:
    -- the others learn down_reason at once instead of queueing behind it)
    down_until = -math.huge, down_reason = nil, probing = false,
    -- one command at a time on the connection; later callers queue
    turn = runtime.semaphore(1),
    where = opts.host and format("%s at %s:%d", name, opts.host, opts.port) or name,
    secrets = secrets,
  }, Client)
end

-- An error the server answered with, fit to print: no password or user
-- name, and not too long.
local function server_words(self, text)
  text = headers.scrub(text, self.secrets)
  if #text > MAX_SERVER_WORDS then text = sub(text, 1, MAX_SERVER_WORDS) .. "..." end
  return text
end

-- The connection is dropped: after a timeout or an error its state is
-- unknown (a reply may still come), so it is never used again.
local function drop(self)
  local conn = self.conn
  if conn then
    runtime.unwatch_fd(conn:fd())
    conn:close()
    self.conn = false
  end
end

-- No new attempt before RECONNECT_AFTER from now; callers meanwhile get
-- the reason at once.
local function pause(self, reason)
  self.down_until, self.down_reason = now() + RECONNECT_AFTER, reason
end

-- timed_out: the server did not answer in time. A hung server (stopped,
-- swapping, a long script) accepts connections and leaves them unanswered,
-- so the pause applies as after a refused connection.
local function failed(self, what, err, timed_out)
  drop(self)
  local reason = format("%s: %s: %s", self.where, what, tostring(err))
  if timed_out then pause(self, reason) end
  return nil, reason
end

local function wait_for(self, mode, deadline)
  local ready, err = runtime.await_fd(self.conn:fd(), mode, deadline)
  if ready then return true end
  if err then return nil, err, false end
  return nil, format("no answer within %.3g s", self.timeout), true
end

local function exchange(self, deadline, ...)
  local conn = self.conn
  conn:send(...)
  while true do
    local ok, err = conn:flush()
    if ok then break end
    if ok == nil then return failed(self, "sending", err) end
    local ready, werr, timed_out = wait_for(self, "w", deadline)
    if not ready then return failed(self, "sending", werr, timed_out) end
  end
  while true do
    local ok, value = conn:read()
    if ok then
      if type(value) == "table" and type(value.err) == "string" then value.err = server_words(self, value.err) end
      return value, nil
    end
    if ok == nil then return failed(self, "reading", value) end
    local ready, werr, timed_out = wait_for(self, "r", deadline)
    if not ready then return failed(self, "waiting for a reply", werr, timed_out) end
  end
end

local function connect(self, deadline)
  if self.locate then
    local host, port = self.locate(deadline)
    if not host then return nil, format("%s: %s", self.name, port) end
    self.host, self.port, self.where = host, port, format("%s at %s:%d", self.name, host, port)
  end
  local conn, err = core.redis_connect(self.host, self.port)
  if not conn then return nil, format("%s: %s", self.where, err) end
  self.conn = conn
  while true do
    local ok, cerr = conn:connected()
    if ok then break end
    if ok == nil then return failed(self, "connecting", cerr) end
    local ready, werr = wait_for(self, "w", deadline)
    if not ready then return failed(self, "connecting", werr) end
  end
  if self.password then
    local reply, rerr
    if self.username then
      reply, rerr = exchange(self, deadline, "AUTH", self.username, self.password)
    else
      reply, rerr = exchange(self, deadline, "AUTH", self.password)
    end
    if rerr then return nil, rerr end
    if reply ~= "OK" then
      -- Only the error's code (WRONGPASS, NOAUTH, ERR): the rest of an
      -- AUTH error is the one text likely to echo the password, and it may
      -- echo it in a form no scrub recognises (cut short, upper-cased).
      local code = type(reply) == "table" and type(reply.err) == "string" and reply.err:match("^[%w_%-]+")
      return failed(self, "AUTH", code and code .. " (the server refused the credentials)" or redis.described(reply))
    end
  end
  if self.db ~= 0 then
    local reply, rerr = exchange(self, deadline, "SELECT", self.db)
    if rerr then return nil, rerr end
    if reply ~= "OK" then return failed(self, "SELECT " .. self.db, redis.described(reply)) end
  end
  if self.locate then
    -- A Sentinel's answer may be stale (a failover under way): the node
    -- itself says whether it is the master. A user that may not run ROLE
    -- (NOPERM) is taken at the Sentinel's word; READONLY tells later.
    local reply, rerr = exchange(self, deadline, "ROLE")
    if rerr then return nil, rerr end
    if type(reply) == "table" and reply[1] ~= "master" and not reply.err then
      return failed(self, "ROLE", format("it is a %s, not the master", tostring(reply[1])))
    end
  end
  return true
end

--- reply | nil, err = client:call(...): one command and its reply (an error
-- reply is {err = message}). err is a string naming Redis and what failed:
-- it could not be reached, did not answer within the timeout, or closed
-- the connection. The next call connects again.
local function call(self, deadline, ...)
  if not self.conn then
    if now() < self.down_until then return nil, self.down_reason end
    self.probing = self.down_reason ~= nil
    local ok, err = connect(self, deadline)
    if not ok then
      pause(self, err)
      return nil, err
    end
  end
  local reply, err = exchange(self, deadline, ...)
  if type(reply) == "table" and type(reply.err) == "string" and reply.err:find("^READONLY") then
    -- The node is a replica now (a failover demoted it): the connection
    -- is dropped and made again after the pause, to whatever answers at
    -- the address by then. The command did nothing (it could not write).
    drop(self)
    pause(self, format("%s: no longer the primary: %s", self.where, reply.err))
  elseif not err then
    self.down_reason = nil
  end
  return reply, err
end

--- reply | nil, err = client:call_until(deadline, ...): as call, ending by
-- deadline (of rw.now()) rather than after the client's timeout.
function Client:call_until(deadline, ...)
  -- While one call finds out whether a failed Redis is back, the others
  -- do not queue behind it (each would pay its timeout): they answer as
  -- the last failure did.
  if self.probing then return nil, self.down_reason end
  local left = deadline - now()
  if left < 0 or not self.turn:acquire(left) then
    return nil, format("%s: no answer within %.3g s (waiting for the connection)", self.where, math.max(left, 0))
  end
  -- A caller cancelled mid-command leaves the connection in an unknown
  -- state and the turn taken: both are put right before the error goes on.
  local ok, reply, err = compat.pcall(call, self, deadline, ...)
  self.probing = false
  if not ok then
    drop(self)
    self.turn:release()
    error(reply, 0)
  end
  self.turn:release()
  return reply, err
end

function Client:call(...)
  return self:call_until(now() + self.timeout, ...)
end

--- client:close(): drops the connection (a later call makes a new one).
function Client:close()
  drop(self)
end

return redis
