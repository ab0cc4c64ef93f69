-- bench/common.lua: what the benchmarks that pit ratewise against the plain
-- C contender bench/multi_curl64 share (run.lua, openresty.lua, http2.lua):
-- knobs from the environment, running a command, the multi contender's run,
-- and the wire check (bench/capture_request.py). Portable to Lua 5.1 and
-- LuaJIT.
local common = {}

local format, floor = string.format, math.floor

-- The folder of the benchmark scripts (the running script's own).
common.here = (arg and arg[0] or "bench/run.lua"):match("^(.*)/[^/]*$") or "."

-- The interpreter running this script (the lowest index of arg), for the
-- fresh processes a benchmark starts.
common.lua = "lua5.4"
if arg then
  local i = -1
  while arg[i] do
    common.lua = arg[i]
    i = i - 1
  end
end

--- The OpenResty nginx's location that runs a round of a shape in its
-- worker (bench/openresty_handler.lua), for spec.support.nginx.start's
-- server block: nginx runs from a folder of its own, so the path is absolute.
function common.openresty_location()
  local here = common.here
  if here:sub(1, 1) ~= "/" then here = common.capture("pwd") .. "/" .. here:gsub("^%./", "") end
  return "    location = /bench { content_by_lua_file " .. here .. "/openresty_handler.lua; }"
end

--- res, err = common.openresty_round(host, kind, url, n, conc [, size [, client]]):
-- one round of the handler's kind ("loop" or "map") of n requests of url
-- in the worker of host (spec.support.nginx's handle, with that location),
-- by client (the handler's: ratewise, the default, or cosocket); res.body
-- is the handler's answer ("requests=N failed=F ... rate=R").
function common.openresty_round(host, kind, url, n, conc, size, client)
  local escape = require("spec.support.nginx").escape
  return require("ratewise").fetch(host:url(format("/bench?shape=%s&n=%d&conc=%d&url=%s%s%s", kind, n, conc,
    escape(url), size and ("&size=" .. size) or "", client and ("&client=" .. client) or "")),
    { timeout = 3600, max_retries = 0, on_retry = false })
end

--- n = common.env_int(name, default): a positive integer from the environment.
function common.env_int(name, default)
  local v = tonumber(os.getenv(name) or "")
  if v and v >= 1 and v % 1 == 0 then return floor(v) end
  return default
end

--- wanted = common.only(): wanted(name) says whether BENCH_ONLY (parts by
-- name, comma-separated; unset or empty: all) asks for that part.
-- default_off: names run only when BENCH_ONLY names them.
function common.only(default_off)
  local only
  if (os.getenv("BENCH_ONLY") or "") ~= "" then
    only = {}
    for name in os.getenv("BENCH_ONLY"):gmatch("[^,%s]+") do only[name] = true end
  end
  return function(name)
    if only == nil then return not (default_off and default_off[name]) end
    return only[name] == true
  end
end

--- common.exit_on_failure(ok, err, failed): the end of a benchmark's run:
-- exits 1 when its work raised (ok false, err the traceback) or when
-- requests failed (failed > 0); returns otherwise.
function common.exit_on_failure(ok, err, failed)
  if not ok then
    io.stderr:write("bench failed: ", tostring(err), "\n")
    os.exit(1)
  end
  if failed > 0 then
    io.stderr:write(string.format("bench: %d request(s) failed (status not 200, an error, or a short body)\n",
      failed))
    os.exit(1)
  end
end

function common.sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local sh_quote = common.sh_quote

--- out, ok = common.run_cmd(cmd): its standard output (trimmed) and whether
-- it exited with status 0. The status is read from a line the shell prints
-- after it: LuaJIT's (and Lua 5.1's) popen:close() does not report it.
function common.run_cmd(cmd)
  local p = assert(io.popen("{ " .. cmd .. "\n}; printf '\\n#exit=%d' $?", "r"))
  local out = p:read("*a")
  p:close()
  local status = tonumber(out:match("#exit=(%d+)$"))
  out = out:gsub("\n?#exit=%d+$", "")
  return (out:gsub("%s+$", "")), status == 0
end

--- out = common.capture(cmd): its standard output (trimmed), or raises.
function common.capture(cmd)
  local out, ok = common.run_cmd(cmd)
  if not ok then error(format("command failed: %s", cmd), 0) end
  return out
end

--- ok, why = common.ensure_command(command): the command on the PATH,
-- installed from Debian's package of the same name when missing (as root);
-- nil and why when it cannot be.
function common.ensure_command(command)
  local function have() local _, ok = common.run_cmd("command -v " .. command .. " >/dev/null 2>&1") return ok end
  if have() then return true end
  if common.capture("id -u") ~= "0" then return nil, command .. " is not installed and installing it needs root" end
  io.write(format("installing %s (apt-get install -y %s)\n", command, command))
  io.flush()
  common.run_cmd(format("{ export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq %s"
    .. " || { apt-get update -qq && apt-get install -y -qq %s; }; } >/dev/null 2>&1", command, command))
  if have() then return true end
  return nil, "apt-get install " .. command .. " failed"
end

-- What rw.fetch sends as User-Agent, and so the C contenders too.
function common.agent()
  return "ratewise/" .. require("ratewise")._VERSION
end

common.MULTI = common.here .. "/multi_curl64"
common.PLAIN = common.here .. "/plain_curl"

--- m = common.run_plain(url, n): n GETs of url one after the other on one
-- reused easy handle (bench/plain_curl), the sequential shape's contender.
-- A failure counts as a failed request (and fails the run); it is not
-- raised, so that the run goes on to report it.
function common.run_plain(url, n)
  local out, ok = common.run_cmd(format("%s %s %d %s", common.sh_quote(common.PLAIN), common.sh_quote(url), n,
    common.sh_quote(common.agent())))
  local rate = tonumber(out:match("rate=([%d.]+)"))
  if not ok or not rate then
    io.stderr:write("plain_curl failed: ", out, "\n")
    return { rate = 0, failed = 1 }
  end
  return { rate = rate, failed = 0, cpu_us = tonumber(out:match("cpu_us=([%d.]+)")) }
end

--- m = common.run_multi(url, n, conc [, {size = bytes, flags = "--cainfo ..."}]):
-- one libcurl multi handle, `conc` transfers in flight (bench/multi_curl64).
-- It counts the transfers that did not end in a 200, and sums the body
-- bytes it kept: with `size`, they must come to n bodies of that size.
-- A measure for rounds.lua: { rate, failed, cpu_us, connections, http_version }.
function common.run_multi(url, n, conc, o)
  o = o or {}
  local out = common.run_cmd(format("%s %s%s %d %d %s", sh_quote(common.MULTI),
    o.flags and (o.flags .. " ") or "", sh_quote(url), n, conc, sh_quote(common.agent())))
  local rate = tonumber(out:match("rate=([%d.]+)"))
  local failed = tonumber(out:match(" failures=(%d+)"))
  local bytes = tonumber(out:match("body_bytes=(%d+)"))
  if not rate or not failed then error("multi_curl64 printed no rate: " .. out, 0) end
  failed = failed + (tonumber(out:match("warmup_failed=(%d+)")) or 0)
  if o.size and bytes ~= n * o.size then
    io.stderr:write(format("multi_curl64: %s body bytes for %d bodies of %d\n", tostring(bytes), n, o.size))
    if failed == 0 then failed = 1 end
  end
  return { rate = rate, failed = failed, cpu_us = tonumber(out:match("cpu_us=([%d.]+)")),
    connections = tonumber(out:match("connections=(%d+)")), http_version = out:match("http_version=([%d.]+)") }
end

--- common.check_wire{python = cmd, args = "...", contenders = {{name, fn(url)}, ...}}:
-- one request of each contender to bench/capture_request.py (started with
-- `python`, default "python3", and `args` after the count), which answers
-- each and prints its request head. They must be the same bytes, or the
-- ratios compare unlike work. A difference is reported, loudly, but does
-- not fail the run (no request failed). `scheme` ("http" or "https") makes
-- the URL.
function common.check_wire(o)
  local contenders = o.contenders
  local p = io.popen(format("%s %s %d %s 2>&1", o.python or "python3",
    sh_quote(common.here .. "/capture_request.py"), #contenders, o.args or ""), "r")
  local port = p and tonumber(p:read("*l") or "")
  if not port then
    local why = p and p:read("*a") or ""
    if p then p:close() end
    io.write("request heads: not checked (bench/capture_request.py did not start: ", why, ")\n")
    return false
  end
  local url = format("%s://127.0.0.1:%d/", o.scheme or "http", port)
  -- In this order, one after the other: the server sees them so.
  for _, c in ipairs(contenders) do c[2](url) end
  local out = p:read("*a")
  p:close()
  local heads = {}
  for head in out:gmatch("(.-)\n%-%-%-%-\n") do heads[#heads + 1] = head end
  local label = o.label and (o.label .. ": ") or ""
  if #heads ~= #contenders then
    io.write(label, "request heads: not checked (the capture got ", #heads, " of ", #contenders, ")\n", out, "\n")
    return false
  end
  local same = true
  for i = 2, #heads do same = same and heads[i] == heads[1] end
  local names = {}
  for i, c in ipairs(contenders) do names[i] = c[1] end
  if same then
    io.write(format("%srequest heads: %s send the same %d bytes:\n", label, table.concat(names, ", "), #heads[1]))
    for l in heads[1]:gmatch("[^\n]+") do io.write("    ", l, "\n") end
  else
    io.write(label, "request heads DIFFER, the ratios below compare unlike requests:\n")
    for i, name in ipairs(names) do
      io.write("  ", name, ":\n")
      for l in heads[i]:gmatch("[^\n]+") do io.write("    ", l, "\n") end
    end
  end
  io.flush()
  return same
end

return common
