-- How specs start a Lua program or the C host as a separate process. Under
-- `make test-asan` the Makefile points these at the instrumented build.
local subprocess = {}

local cpath = os.getenv("RATEWISE_CPATH") or "./build/?.so"
subprocess.env = "LUA_PATH='./lua/?.lua;./lua/?/init.lua;./?.lua;;' LUA_CPATH='" .. cpath .. ";;' "
subprocess.lua = os.getenv("RATEWISE_LUA") or "lua5.4"
subprocess.host = os.getenv("RATEWISE_HOST") or "examples/host"

--- The shell command that runs a Lua script with this tree's ratewise.
function subprocess.lua_command(script)
  return subprocess.env .. subprocess.lua .. " " .. script
end

return subprocess
