-- nghttpd (nghttp2-server): an HTTP/2-only server over TLS, as its users
-- run it. It refuses a TLS connection that does not agree on h2 (ALPN):
-- a client that offers HTTP/1.1 alone gets its connection closed unread.
--   local nghttpd = require "spec.support.nghttpd"
--   local s = nghttpd.start { max_streams = 10 }   -- -m, its default 100
--   s:url("/x"), s.ca_file, s:seen(":path: /x"), s:handshakes(), s:stop()
-- The server logs every frame (-v): what it saw is read from that log.
local socket = require "socket"
local server = require "spec.support.server"

local M = {}
local Nghttpd = {}
Nghttpd.__index = Nghttpd

local function run(command)
  local ok, how, code = os.execute(command)
  if type(ok) == "number" then return ok == 0 end -- Lua 5.1 and LuaJIT
  return ok == true and how == "exit" and code == 0
end

--- A self-signed certificate for 127.0.0.1 in a new folder: dir, with
-- cert.pem and key.pem.
function M.certificate()
  local dir = os.tmpname()
  os.remove(dir)
  assert(run("mkdir -p " .. dir .. " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 "
    .. "-addext subjectAltName=IP:127.0.0.1 -keyout " .. dir .. "/key.pem -out " .. dir .. "/cert.pem 2>/dev/null"))
  return dir
end

--- Starts nghttpd on a free port of 127.0.0.1, serving a folder with one
-- file, /hello ("hello\n"), and echoing what is POSTed (--echo-upload).
-- opts.max_streams: its SETTINGS_MAX_CONCURRENT_STREAMS. Waits until it
-- accepts connections.
function M.start(opts)
  opts = opts or {}
  local dir = M.certificate()
  assert(run("mkdir -p " .. dir .. "/docs && printf 'hello\\n' > " .. dir .. "/docs/hello"))
  local port = server.free_port()
  local s = setmetatable({ dir = dir, port = port, ca_file = dir .. "/cert.pem", log = dir .. "/nghttpd.log",
    base = "https://127.0.0.1:" .. port }, Nghttpd)
  local p = assert(io.popen("nghttpd -v --echo-upload -a 127.0.0.1 -d " .. dir .. "/docs"
    .. (opts.max_streams and (" -m " .. opts.max_streams) or "") .. " " .. port .. " " .. dir .. "/key.pem "
    .. dir .. "/cert.pem >" .. s.log .. " 2>&1 & echo $!"))
  s.pid = tonumber(p:read("*l"))
  p:close()
  local deadline = socket.gettime() + 5
  while true do
    local c = socket.tcp()
    c:settimeout(0.2)
    local ok = c:connect("127.0.0.1", port)
    c:close()
    if ok then break end
    if socket.gettime() > deadline then
      s:stop()
      error("nghttpd did not start", 2)
    end
    socket.sleep(0.02)
  end
  return s
end

function Nghttpd:url(path)
  return self.base .. path
end

--- What the server logged so far.
function Nghttpd:text()
  return server.read_file(self.log) or ""
end

--- How many times the log has the plain text `line` (a header it received,
-- such as ":path: /x?n=1"), from byte `from` of the log on (1: all).
function Nghttpd:seen(line, from)
  local n, at = 0, from or 1
  local text = self:text()
  while true do
    local i, j = text:find(line, at, true)
    if not i then return n end
    -- whole values only: ":path: /x?n=1" is not ":path: /x?n=12"
    if text:sub(j + 1, j + 1) == "\n" then n = n + 1 end
    at = j + 1
  end
end

--- TLS connections the server completed, from byte `from` of the log on:
-- each is one handshake.
function Nghttpd:handshakes(from)
  local n = 0
  for _ in self:text():sub(from or 1):gmatch("SSL/TLS handshake completed") do n = n + 1 end
  return n
end

--- Where the log ends now (for seen and handshakes to count what comes after).
function Nghttpd:mark()
  return #self:text() + 1
end

function Nghttpd:stop()
  if self.pid then run("kill " .. self.pid .. " 2>/dev/null") end
  self.pid = nil
  run("rm -rf " .. self.dir)
end

return M
