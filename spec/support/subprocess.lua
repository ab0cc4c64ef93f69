-- How specs start a Lua program or the C host as a separate process. Under
-- `make test-asan` the Makefile points these at the instrumented build.
local subprocess = {}

local cpath = os.getenv("RATEWISE_CPATH") or "./build/?.so"
subprocess.env = "LUA_PATH='./lua/?.lua;./lua/?/init.lua;./?.lua;;' LUA_CPATH='" .. cpath .. ";;' "
subprocess.lua = os.getenv("RATEWISE_LUA") or "lua5.4"
subprocess.host = os.getenv("RATEWISE_HOST") or "examples/host"
-- How to build C against the interpreter under test (the Makefile's make
-- test LUA=... sets them): compiler flags, and the library to link a host.
subprocess.lua_cflags = os.getenv("RATEWISE_LUA_CFLAGS") or "$(pkg-config --cflags lua5.4)"
subprocess.lua_libs = os.getenv("RATEWISE_LUA_LIBS") or "$(pkg-config --libs lua5.4)"
-- How the build under test was made (`make POLLER=poll`, `make REDIS=0`):
-- the C core's defines, and the libraries it links.
subprocess.core_cflags = os.getenv("RATEWISE_CORE_CFLAGS") or ""
subprocess.core_libs = os.getenv("RATEWISE_CORE_LIBS")
  or "$(pkg-config --libs libcurl) -lhiredis -lz -lbrotlidec -lzstd -lssl -lcrypto -pthread -lm"

--- The shell command that runs a Lua script with this tree's ratewise.
function subprocess.lua_command(script)
  return subprocess.env .. subprocess.lua .. " " .. script
end

--- output, exit_code = subprocess.shell(command): runs a shell command,
-- its stdout and stderr together. The exit status is the shell's own
-- report: a popen's close gives it only from Lua 5.2 on (in 5.1 and
-- LuaJIT it says true whatever the command did).
function subprocess.shell(command)
  local p = assert(io.popen("{ " .. command .. "\n} 2>&1; echo \"<exit $?>\""))
  local out = p:read("*a")
  p:close()
  local body, code = out:match("^(.*)<exit (%d+)>\n?$")
  return body or out, tonumber(code)
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
  local out, code_out = subprocess.shell((opts.shell or "") .. subprocess.env .. "timeout " .. (opts.seconds or 5)
    .. " " .. subprocess.lua .. " " .. file .. " " .. (opts.args or ""))
  os.remove(file)
  return out, code_out
end

--- outputs = subprocess.run_lua_processes{code =, count =, args = fn(i) [, seconds =] [, during = fn]}:
-- runs `count` copies of a Lua program at once, each in a process of its
-- own under `timeout` (seconds, default 30) with the shell words args(i),
-- calls during() (when given) while they run, and answers what each wrote
-- (stdout and stderr), once all have ended.
function subprocess.run_lua_processes(opts)
  local file = os.tmpname()
  local f = assert(io.open(file, "w"))
  f:write(opts.code)
  f:close()
  local outs, cmd = {}, {}
  for i = 1, opts.count do
    outs[i] = os.tmpname()
    cmd[#cmd + 1] = subprocess.env .. "timeout " .. (opts.seconds or 30) .. " " .. subprocess.lua .. " " .. file
      .. " " .. opts.args(i) .. " > " .. outs[i] .. " 2>&1 &"
  end
  local p = assert(io.popen("{ " .. table.concat(cmd, " ") .. " wait; } 2>&1"))
  if opts.during then opts.during() end
  p:read("*a")
  p:close()
  local results = {}
  for i = 1, opts.count do
    local o = assert(io.open(outs[i]))
    results[i] = o:read("*a")
    o:close()
    os.remove(outs[i])
  end
  os.remove(file)
  return results
end

return subprocess
