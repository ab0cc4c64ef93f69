--- A private nginx with the Lua module (OpenResty's stack from Debian:
-- nginx, libnginx-mod-http-lua, lua-resty-core, LuaJIT from luajit2), for
-- the OpenResty specs:
--
--   local nginx = require "spec.support.nginx"
--   local n = nginx.start { http = "...", server = "..." }  -- config snippets
--   n:url("/path"), n:error_log(), n:worker_pid(), n:stop()
--
-- ratewise comes from this tree: lua/ and the LuaJIT build of the core
-- (RATEWISE_LUAJIT_CPATH, default ./build-luajit/?.so).
local socket = require "socket"

local M = {}

M.MODULES = "/usr/lib/nginx/modules"

local server = require "spec.support.server"
local read_file, free_port = server.read_file, server.free_port

local function cwd()
  local p = assert(io.popen("pwd"))
  local dir = p:read("*l")
  p:close()
  return dir
end

-- os.execute's answer as a boolean: 5.1 and LuaJIT give the status (0 is
-- success, and every number is true), later Luas true or nil.
local function run(command)
  local ok = os.execute(command)
  return ok == true or ok == 0
end

local Nginx = {}
Nginx.__index = Nginx

--- n = nginx.start{http = snippet, server = snippet [, workers = n]
--   [, tls = {cert = PEM, key = PEM} [, http2 = true]] [, under = command]}:
-- starts nginx (one worker unless told) listening on a free port of
-- 127.0.0.1 (HTTPS with tls, and HTTP/2 too with http2), with the snippets
-- in its http and server blocks; waits until it answers. With under (a
-- command put before nginx's, such as valgrind's), nginx runs as one
-- process in the foreground (no master, the process serves), in the
-- background of the caller, and answers within 60 s.
function M.start(opts)
  local root = cwd()
  local cpath = os.getenv("RATEWISE_LUAJIT_CPATH") or "./build-luajit/?.so"
  if cpath:sub(1, 2) == "./" then cpath = root .. cpath:sub(2) end
  local dir = os.tmpname()
  os.remove(dir)
  assert(run("mkdir -p " .. dir .. "/conf " .. dir .. "/logs"))
  local port = free_port()
  local conf = table.concat({
    "load_module " .. M.MODULES .. "/ndk_http_module.so;",
    "load_module " .. M.MODULES .. "/ngx_http_lua_module.so;",
    "worker_processes " .. (opts.workers or 1) .. ";",
    opts.under and "master_process off; daemon off;" or "",
    "user root;",
    "pid " .. dir .. "/logs/nginx.pid;",
    "error_log " .. dir .. "/logs/error.log info;",
    "events { worker_connections 4096; }",
    "http {",
    "  access_log off;",
    "  client_body_temp_path " .. dir .. "/body;",
    "  proxy_temp_path " .. dir .. "/proxy;",
    "  fastcgi_temp_path " .. dir .. "/fastcgi;",
    "  uwsgi_temp_path " .. dir .. "/uwsgi;",
    "  scgi_temp_path " .. dir .. "/scgi;",
    '  lua_package_path "' .. root .. "/lua/?.lua;" .. root .. '/lua/?/init.lua;;";',
    '  lua_package_cpath "' .. cpath .. ';;";',
    opts.http or "",
    "  server {",
    -- reuseport: with several workers, the kernel spreads connections over them
    "    listen 127.0.0.1:" .. port .. (opts.tls and " ssl" or "") .. (opts.http2 and " http2" or "")
      .. ((opts.workers or 1) > 1 and " reuseport" or "") .. ";",
    opts.tls and ("    ssl_certificate " .. opts.tls.cert .. "; ssl_certificate_key " .. opts.tls.key .. ";") or "",
    '    location = /_ping { return 200 "pong"; }',
    "    location = /_pid { content_by_lua_block { ngx.print(ngx.worker.pid()) } }",
    opts.server or "",
    "  }",
    "}",
  }, "\n")
  local f = assert(io.open(dir .. "/conf/nginx.conf", "w"))
  f:write(conf)
  f:close()
  local n = setmetatable({ dir = dir, port = port, base = (opts.tls and "https" or "http") .. "://127.0.0.1:" .. port },
    Nginx)
  local command = "nginx -p " .. dir .. " -c conf/nginx.conf"
  if opts.under then
    n.stop_wait = 60 -- a process under valgrind writes what it counted as it exits
    assert(run(opts.under .. " " .. command .. " >" .. dir .. "/start.log 2>&1 &"))
  elseif not run(command .. " 2>" .. dir .. "/start.log") then
    error("nginx did not start:\n" .. (read_file(dir .. "/start.log") or "") .. (n:error_log() or ""), 2)
  end
  local http = require "socket.http"
  local deadline = socket.gettime() + (opts.under and 60 or 5)
  while true do
    local body = http.request(n.base .. "/_ping")
    if body == "pong" then break end
    if socket.gettime() > deadline then
      n:stop()
      error("nginx does not answer:\n" .. (n:error_log() or ""), 2)
    end
    socket.sleep(0.05)
  end
  return n
end

--- A string percent-encoded for a query parameter (a URL handed to a
-- location that fetches it).
function M.escape(s)
  return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

function Nginx:url(path)
  return self.base .. path
end

function Nginx:error_log()
  return read_file(self.dir .. "/logs/error.log")
end

--- The worker's pid (there is one).
function Nginx:worker_pid()
  local http = require "socket.http"
  return tonumber((http.request(self.base .. "/_pid")))
end

--- Seconds of CPU the process pid has used (user and system), from /proc.
function M.cpu_seconds(pid)
  local stat = read_file("/proc/" .. pid .. "/stat")
  local fields = {}
  for field in stat:match("%) (.*)$"):gmatch("%S+") do fields[#fields + 1] = field end
  -- after "(comm)": state is field 1, utime field 12, stime field 13 (in clock ticks)
  return (tonumber(fields[12]) + tonumber(fields[13])) / 100
end

--- Stops nginx (QUIT, then KILL after 3 s) and removes its folder; one
-- started under a command gets TERM (a graceful stop waits for whatever
-- its worker still runs) and 60 s to exit, and a connection now and then:
-- under valgrind, a process asleep in epoll_wait with no timer did not
-- see the signal until something woke it. Idempotent.
function Nginx:stop()
  if self.stopped then return end
  self.stopped = true
  local pid = tonumber(read_file(self.dir .. "/logs/nginx.pid") or "")
  if pid then
    os.execute("kill -" .. (self.stop_wait and "TERM " or "QUIT ") .. pid .. " 2>/dev/null")
    local deadline = socket.gettime() + (self.stop_wait or 3)
    local poke = self.stop_wait and socket.gettime() + 0.5
    while socket.gettime() < deadline and run("kill -0 " .. pid .. " 2>/dev/null") do
      if poke and socket.gettime() >= poke then
        local c = socket.tcp()
        c:settimeout(0.2)
        c:connect("127.0.0.1", self.port)
        c:close()
        poke = socket.gettime() + 0.5
      end
      socket.sleep(0.02)
    end
    os.execute("kill -KILL " .. pid .. " 2>/dev/null")
  end
  os.execute("rm -rf " .. self.dir)
end

return M
