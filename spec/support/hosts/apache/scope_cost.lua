-- What mod_lua's LuaScope costs a handler that calls ratewise: for each
-- scope, a private Apache (httpd.lua) answers N sequential GET /fetch, each
-- one rw.fetch to the test server, and this prints the mean time a request
-- took and the server's CPU per request. A measurement to read, not a spec
-- (docs/hosts.md quotes it); from the checkout's root, after make host-cores:
--
--   LUA_PATH="./lua/?.lua;./lua/?/init.lua;./?.lua;;" LUA_CPATH="./build/?.so;;" \
--     lua5.4 spec/support/hosts/apache/scope_cost.lua [N]
local socket = require "socket"
local http = require "socket.http"
local server = require "spec.support.server"
local real_host = require "spec.support.real_host"
local httpd = require "spec.support.hosts.apache.httpd"

local N = tonumber(arg and arg[1]) or 200
-- the first requests of a thread load ratewise into its state: not counted
local WARM_UP = httpd.THREADS

local s = server.start()
real_host.routes(s)
local url = "/fetch?url=" .. s:url("/rh/ping")

print(("%-7s %10s %14s %10s"):format("scope", "requests", "ms a request", "CPU ms"))
for _, scope in ipairs({ "once", "thread", "server" }) do
  local dir = real_host.temp_dir()
  local h = httpd.start { dir = dir, scope = scope }
  local ok, err = pcall(function()
    local child = assert(h:child_pid(), "no child process")
    for _ = 1, WARM_UP do assert(http.request(h.url .. url)) end
    local cpu, started = real_host.cpu_seconds(child), socket.gettime()
    for _ = 1, N do
      local body = assert(http.request(h.url .. url))
      assert(body:match("^200"), body)
    end
    local wall, spent = socket.gettime() - started, real_host.cpu_seconds(child) - cpu
    print(("%-7s %10d %14.2f %10.2f"):format(scope, N, wall / N * 1000, spent / N * 1000))
  end)
  h:stop()
  os.execute("rm -rf '" .. dir .. "'")
  if not ok then
    s:stop()
    error(err, 0)
  end
end
s:stop()
