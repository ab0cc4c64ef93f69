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

--- output, exit_code = subprocess.run_lua(code [, opts]): runs a Lua
-- program in a process of its own under `timeout`, so that a regression that
-- spins or hangs fails one spec instead of the whole suite. opts: the
-- seconds it may take (default 5), or a table of
--   seconds  as above
--   args     the program's arguments, as shell words
--   shell    what comes before the command ("ulimit -n 64; ", "printf x | ")
-- exit_code 124 means the time ran out; output is stdout and stderr.
function subprocess.run_lua(code, opts)
  if type(opts) ~= "table" then opts = { seconds = opts } end
  local file = os.tmpname()
  local f = assert(io.open(file, "w"))
  f:write(code)
  f:close()
  local p = assert(io.popen((opts.shell or "") .. subprocess.env .. "timeout " .. (opts.seconds or 5) .. " "
    .. subprocess.lua .. " " .. file .. " " .. (opts.args or "") .. " 2>&1"))
  local out = p:read("a")
  local _, _, code_out = p:close()
  os.remove(file)
  return out, code_out
end

return subprocess
