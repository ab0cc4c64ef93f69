-- A private Apache 2.4 (Debian's apache2, its mod_lua on PUC Lua 5.3) for
-- spec/host_apache_spec.lua and spec/support/hosts/apache/scope_cost.lua:
-- a config of its own in a temp dir, listening on a free loopback port, the
-- event MPM in one child process, mod_lua with ratewise and the scenario on
-- its package paths, and the handlers of handlers.lua mapped to /run,
-- /ping and /fetch.
--
--   local httpd = require "spec.support.hosts.apache.httpd"
--   local h = httpd.start { dir = dir, scope = "thread" }
--   ... h.url .. "/ping" ...
--   h:stop()
local socket = require "socket"
local server = require "spec.support.server"
local real_host = require "spec.support.real_host"

local httpd = {}

httpd.MODULES = "/usr/lib/apache2/modules"
-- worker threads of the one child: /run holds one for all of its time
httpd.THREADS = 16

local shell_quote = real_host.shell_quote

local capture = require("spec.support.subprocess").shell

--- path | nil = httpd.binary(): Debian's apache2, when installed.
function httpd.binary()
  local path = capture("command -v apache2 2>/dev/null || ls /usr/sbin/apache2 2>/dev/null"):match("^%s*(.-)%s*$")
  if path == "" or not server.read_file(httpd.MODULES .. "/mod_lua.so") then return nil end
  return path
end

-- Apache refuses to serve as root: its children then run as www-data,
-- which must read the checkout and write the results (the temp dir is
-- made writable by all). Run as anyone else, User and Group are ignored.
local CONFIG = [[
ServerRoot "${dir}"
ServerName 127.0.0.1
PidFile "${dir}/httpd.pid"
DefaultRuntimeDir "${dir}"
Mutex file:${dir} default
Listen 127.0.0.1:${port}
User www-data
Group www-data
ErrorLog "${dir}/error.log"
LogLevel warn lua:info

LoadModule mpm_event_module ${modules}/mod_mpm_event.so
LoadModule authz_core_module ${modules}/mod_authz_core.so
LoadModule lua_module ${modules}/mod_lua.so

StartServers 1
ServerLimit 1
ThreadsPerChild ${threads}
ThreadLimit ${threads}
MaxRequestWorkers ${threads}
MinSpareThreads 1
MaxSpareThreads ${threads}

LuaScope ${scope}
LuaPackagePath "${root}/lua/?.lua"
LuaPackagePath "${root}/lua/?/init.lua"
LuaPackagePath "${root}/spec/support/hosts/?.lua"
LuaPackageCPath "${core_dir}/?.so"
LuaMapHandler ^/run$ "${handlers}" run
LuaMapHandler ^/ping$ "${handlers}" ping
LuaMapHandler ^/fetch$ "${handlers}" fetch
LuaMapHandler ^/limited$ "${handlers}" limited
]]

local Httpd = {}
Httpd.__index = Httpd

--- h = httpd.start{dir = temp_dir, scope = "thread" | "server" | "once" ...}:
-- Apache in the foreground (under `timeout`, so that nothing outlives a
-- run that never stops it), answering once it listens; h.url, h:stop(),
-- h:log() (its error log), h:child_pid().
function httpd.start(opts)
  local binary = assert(httpd.binary(), "apache2 or its mod_lua is not installed: `make deps` installs Debian's "
    .. "apache2 (the Makefile's DEB_REAL_HOSTS)")
  local dir, root = opts.dir, real_host.ROOT
  os.execute("chmod 0777 " .. shell_quote(dir))
  local port = server.free_port()
  local values = {
    dir = dir, port = port, modules = httpd.MODULES, threads = httpd.THREADS, scope = opts.scope or "thread",
    root = root, core_dir = real_host.cpath("lua5.3"):gsub("/%?%.so$", ""),
    handlers = root .. "/spec/support/hosts/apache/handlers.lua",
  }
  local conf = dir .. "/httpd.conf"
  real_host.write_file(conf, (CONFIG:gsub("%${([%w_]+)}", function(name) return tostring(values[name]) end)))
  local h = setmetatable({ dir = dir, url = "http://127.0.0.1:" .. port, conf = conf, binary = binary }, Httpd)
  h.timeout_pid = tonumber((capture("env -u LUA_PATH -u LUA_CPATH -u LUA_INIT timeout -s KILL "
    .. (opts.seconds or 60) .. " " .. shell_quote(binary) .. " -f " .. shell_quote(conf)
    .. " -D FOREGROUND </dev/null >" .. shell_quote(dir .. "/stdout") .. " 2>&1 & echo $!")))
  if real_host.listening(port) then return h end
  local log = h:log()
  h:stop()
  error("apache2 did not listen within 10 s:\n" .. log)
end

--- text = h:log(): its error log and what it wrote to stdout/stderr.
function Httpd:log()
  return (server.read_file(self.dir .. "/error.log") or "") .. (server.read_file(self.dir .. "/stdout") or "")
end

--- pid | nil = h:child_pid(): the one child process, which serves.
function Httpd:child_pid()
  local parent = (server.read_file(self.dir .. "/httpd.pid") or ""):match("%d+")
  if not parent then return nil end
  return tonumber(capture("pgrep -P " .. parent .. " 2>/dev/null"):match("%d+"))
end

--- h:stop(): ends the server (its parent ends the children), and the
-- `timeout` around it.
function Httpd:stop()
  local parent = (server.read_file(self.dir .. "/httpd.pid") or ""):match("%d+")
  if parent then
    os.execute("kill -TERM " .. parent .. " 2>/dev/null")
    local deadline = socket.gettime() + 5
    while socket.gettime() < deadline and os.execute("kill -0 " .. parent .. " 2>/dev/null") do socket.sleep(0.05) end
    local child = self:child_pid()
    if child then os.execute("kill -KILL " .. child .. " 2>/dev/null") end
    os.execute("kill -KILL " .. parent .. " 2>/dev/null")
  end
  if self.timeout_pid then os.execute("kill -KILL " .. self.timeout_pid .. " 2>/dev/null") end
end

return httpd
