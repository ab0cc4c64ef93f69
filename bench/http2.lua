-- bench/http2.lua: the 64-task loop over HTTPS, HTTP/2 and HTTP/1.1, on a
-- small answer and on a 64 KiB body, each against plain libcurl (issue 15:
-- "the same shapes ... with HTTP/2").
--
--   make bench-http2          (or: lua5.4 bench/http2.lua, from the root,
--                              after make and make -C bench)
--
-- Two private nginx servers with one self-signed certificate, one offering
-- HTTP/2 (`listen ... ssl http2`) and one HTTP/1.1 only, each answering
-- "$connection" (a few bytes: which connection served the request). For
-- each, two contenders in alternating rounds (bench/rounds.lua), the same
-- number of requests:
--   ratewise  64 tasks under rw.run, each looping rw.fetch(url, opts) with
--             one options table ({ ca_file = the certificate });
--   plain     bench/multi_curl64 --cainfo CERT [--pipewait] --warmup W:
--             one libcurl multi handle keeping 64 transfers in flight; over
--             HTTP/2 waiting for the first connection and multiplexing on it
--             (CURLOPT_PIPEWAIT), as ratewise's engine does; its warm-up
--             requests open the connections (and do the TLS handshakes)
--             before its clock starts, as ratewise's come from its rounds
--             before.
-- The same again on a 64 KiB body (h2_64k, h1_64k): each body's length
-- checked, as the plain contender counts the bytes it keeps.
-- Reported: each shape's ratio ratewise / plain (the median of the rounds'
-- ratios and their range), the CPU per request of each, the connections
-- each opened in a measured round (ratewise: the distinct $connection
-- values; plain: CURLINFO_NUM_CONNECTS) and in ratewise's first burst on a
-- fresh engine; then HTTP/2 against HTTP/1.1 for each contender.
--
-- First, the wire: one request of each contender to bench/capture_request.py
-- over TLS, as HTTP/1.1 (the head's text) and as HTTP/2 (the HEADERS frame
-- as the server decodes it; needs Debian's python3-h2, installed when
-- missing and root). They must be the same.
--
-- A benchmark, not a test: it fails only when a request fails, never on a
-- ratio. Knobs (environment):
--   BENCH_HTTP2_REQUESTS  requests per round and contender (default 20000)
--   BENCH_HTTP2_ROUNDS    rounds (default 5)
--   BENCH_HTTP2_WARMUP    warm-up requests per contender (default 2000)
--   BENCH_CONCURRENCY     tasks, and transfers in flight (default 64)
--   BENCH_HTTP2_64K_REQUESTS  h2_64k, h1_64k: requests per round and contender (default 5000)
--   BENCH_ONLY            among h2, h1, h2_64k, h1_64k (default: all)
local nginx = require "spec.support.nginx"
local rw = require "ratewise"
local common = require "bench.common"
local rounds = require "bench.rounds"

local format, floor = string.format, math.floor
local env_int, sh_quote, run_cmd = common.env_int, common.sh_quote, common.run_cmd

local N = env_int("BENCH_HTTP2_REQUESTS", 20000)
local N_64K = env_int("BENCH_HTTP2_64K_REQUESTS", 5000)
local ROUNDS = env_int("BENCH_HTTP2_ROUNDS", 5)
local WARMUP = env_int("BENCH_HTTP2_WARMUP", 2000)
local TASKS = env_int("BENCH_CONCURRENCY", 64)
local wanted = common.only()

local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. dir .. " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 "
  .. "-addext subjectAltName=IP:127.0.0.1 -keyout " .. dir .. "/key.pem -out " .. dir .. "/cert.pem 2>/dev/null"))
local CERT, KEY = dir .. "/cert.pem", dir .. "/key.pem"
local tls = { cert = CERT, key = KEY }
-- A body of 64 KiB, for the large-body shapes (h2_64k, h1_64k).
local BODY_64K = 65536
assert(os.execute("head -c " .. BODY_64K .. " /dev/zero | tr '\\0' x > " .. dir .. "/64k && chmod 644 " .. dir
  .. "/64k && chmod 755 " .. dir))
local SERVER = [[
    location = /c { return 200 "$connection"; }
    location = /body/64k { alias ]] .. dir .. [[/64k; }
]]
local h2 = nginx.start { server = SERVER, tls = tls, http2 = true, http = "keepalive_requests 1000000;" }
local h1 = nginx.start { server = SERVER, tls = tls, http = "keepalive_requests 1000000;" }

local opts = { ca_file = CERT, on_retry = false }
-- The plain contender's options: the certificate, and CURLOPT_PIPEWAIT for
-- HTTP/2 only. Against an HTTP/1.1 server libcurl 7.88 lets the transfers
-- that wait go one at a time as transfers end (src/engine.c, the gate): its
-- warm-up would open a few connections and its measured part the rest, TLS
-- handshakes and all. Without it each transfer opens its own connection at
-- once, 64 as ratewise's gate has it, all before the clock starts.
local FLAGS = { h2 = "--cainfo " .. sh_quote(CERT) .. " --pipewait", h1 = "--cainfo " .. sh_quote(CERT) }
-- Each contender's shape leaves its connections idle between rounds: room
-- for both protocols' in the engine's cache, or the HTTP/1.1 shape's 64
-- would push the HTTP/2 connection out (the oldest idle goes first)
-- (docs/http.md#http2).
rw.configure { max_idle_connections = 2 * TASKS + 1 }

---------------------------------------------------------------------------
-- The wire

-- Debian's python3 (the one first on PATH may not see Debian's modules) with
-- python3-h2, installed when missing (as root). Returns the command, or nil
-- and why not.
local PYTHON = "/usr/bin/python3"
local function python_h2()
  local function has() return select(2, run_cmd(PYTHON .. " -c 'import h2' 2>/dev/null")) end
  if has() then return PYTHON end
  if common.capture("id -u") ~= "0" then return nil, "python3-h2 is not installed and installing it needs root" end
  io.write("installing python3-h2 (apt-get install -y python3-h2), for the HTTP/2 wire check\n")
  io.flush()
  os.execute("{ export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq python3-h2"
    .. " || { apt-get update -qq && apt-get install -y -qq python3-h2; }; } >/dev/null 2>&1")
  if has() then return PYTHON end
  return nil, "apt-get install python3-h2 failed"
end

local function check_wire()
  local agent = common.agent()
  local function contenders(key)
    return {
      { "multi_curl64", function(url)
        run_cmd(format("%s %s %s 1 1 %s", sh_quote(common.MULTI), FLAGS[key], sh_quote(url), sh_quote(agent)))
      end },
      { "rw.fetch", function(url) rw.fetch(url, opts) end },
    }
  end
  local tls_args = "--tls " .. sh_quote(CERT) .. " " .. sh_quote(KEY)
  if wanted("h1") then
    common.check_wire { label = "HTTP/1.1 over TLS", scheme = "https", python = PYTHON, args = tls_args,
      contenders = contenders("h1") }
  end
  if wanted("h2") then
    local python, why = python_h2()
    if python then
      common.check_wire { label = "HTTP/2", scheme = "https", python = python, args = tls_args .. " --h2",
        contenders = contenders("h2") }
    else
      io.write("HTTP/2: request heads not checked (", why, ")\n")
    end
  end
end

---------------------------------------------------------------------------
-- The contenders

-- ratewise: TASKS tasks under rw.run, each looping rw.fetch over its share
-- of the n requests. A measure for rounds.lua, with the connections seen.
local function ours(url, n, size)
  local seen, failed, first_failure = {}, 0, nil
  local fetch = rw.fetch
  local c0, t0 = os.clock(), rw.now()
  rw.run(function()
    for t = 1, TASKS do
      local count = floor(n / TASKS) + (t <= n % TASKS and 1 or 0)
      if count > 0 then
        rw.spawn(function()
          for _ = 1, count do
            local res, err = fetch(url, opts)
            if res and res.status == 200 and (size == nil or #res.body == size) then
              if size == nil then seen[res.body] = true end
            else
              failed = failed + 1
              first_failure = first_failure or (res and res.status ~= 200 and ("status " .. res.status))
                or (res and format("a body of %d bytes, not %d", #res.body, size)) or tostring(err)
            end
          end
        end)
      end
    end
  end)
  local secs, cpu = rw.now() - t0, os.clock() - c0
  if first_failure then io.stderr:write("rw.fetch failed: ", first_failure, "\n") end
  local connections = 0
  for _ in pairs(seen) do connections = connections + 1 end
  -- the body names the connection only on /c
  return { rate = n / secs, failed = failed, cpu_us = cpu * 1e6 / n, connections = size == nil and connections or nil }
end

local function plain(protocol, url, n, size)
  return common.run_multi(url, n, TASKS, { flags = FLAGS[protocol] .. " --warmup " .. WARMUP, size = size })
end

---------------------------------------------------------------------------

local rows, failed, notes = {}, 0, {}

-- A shape: key, its name, the server, its protocol ("h2" or "h1": the plain
-- contender's flags), and for the body shapes the size of each body.
local function shape(key, name, server, protocol, size)
  local url = server:url(size and "/body/64k" or "/c")
  local conns = { ours = {}, plain = {} }
  local function note(list, m)
    if m.connections then list[#list + 1] = m.connections end
    return m
  end
  local first
  local row = rounds.compare({ key = key, name = name, n = size and N_64K or N, rounds = ROUNDS, warmup = WARMUP,
    target = 0.90,
    plain = function(n) return note(conns.plain, plain(protocol, url, n, size)) end,
    ours = function(n)
      local m = ours(url, n, size)
      if not first then first = m.connections return m end -- the warm-up: the first burst
      return note(conns.ours, m)
    end }, function() collectgarbage("collect") collectgarbage("collect") end)
  rows[#rows + 1] = row
  failed = failed + row.plain_failed + row.our_failed
  local function span(list)
    table.sort(list)
    if #list == 0 then return "?" end
    return list[1] == list[#list] and tostring(list[1]) or (list[1] .. " - " .. list[#list])
  end
  if size then return row end -- a body does not name its connection
  notes[#notes + 1] = format("  %-48s ratewise %s (its first burst on a fresh engine: %s), plain %s", key
    .. ": connections opened a round", span(conns.ours), tostring(first), span(conns.plain))
  return row
end

local ok, err = pcall(function()
  local jit = rawget(_G, "jit")
  io.write(format("HTTPS on loopback; ratewise %s on %s; %s; %d in flight\n", rw._VERSION,
    jit and jit.version or _VERSION, require("ratewise.core").curl_version or "libcurl", TASKS))
  check_wire()
  local r2, r1
  if wanted("h2") then
    r2 = shape("h2", format("HTTP/2: %d tasks looping rw.fetch / multi", TASKS), h2, "h2")
  end
  if wanted("h1") then
    r1 = shape("h1", format("HTTP/1.1 over TLS: %d tasks / multi", TASKS), h1, "h1")
  end
  if wanted("h2_64k") then
    shape("h2_64k", format("HTTP/2: %d tasks, 64 KiB bodies / multi", TASKS), h2, "h2", BODY_64K)
  end
  if wanted("h1_64k") then
    shape("h1_64k", format("HTTP/1.1 over TLS: %d tasks, 64 KiB bodies / multi", TASKS), h1, "h1", BODY_64K)
  end
  io.write("\n")
  rounds.report(rows)
  for _, l in ipairs(notes) do io.write(l, "\n") end
  if r2 and r1 then
    io.write(format("  %-48s ratewise %.2f, plain %.2f (median rates)\n", "HTTP/2 / HTTP/1.1", r2.ours / r1.ours,
      r2.plain / r1.plain))
  end
  for _, row in ipairs(rows) do
    io.write(format("  %-48s rw.fetch %d of %d, plain %d of %d\n", "failures, " .. row.shape.key, row.our_failed,
      row.requests, row.plain_failed, row.requests))
  end
end)
h2:stop()
h1:stop()
os.execute("rm -rf " .. dir)
common.exit_on_failure(ok, err, failed)
