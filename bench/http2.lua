-- bench/http2.lua: what HTTP/2 does for 64 concurrent tasks over HTTPS.
--
--   make bench-http2          (or: lua5.4 bench/http2.lua, from the root)
--
-- Two private nginx servers with one certificate, one offering HTTP/2
-- (`listen ... ssl http2`) and one HTTP/1.1 only, each answering
-- "$connection" in a few bytes. Two contenders in one run, in alternating
-- rounds: 64 tasks of rw.fetch under rw.run against each, the same number
-- of requests. Reported: requests per second, their ratio (HTTP/2 over
-- HTTP/1.1), and the connections each opened (the distinct $connection
-- values nginx reported), in the measured rounds and in the first burst.
local nginx = require "spec.support.nginx"
local rw = require "ratewise"

local N = tonumber(os.getenv("BENCH_HTTP2_REQUESTS") or "20000")
local ROUNDS = tonumber(os.getenv("BENCH_HTTP2_ROUNDS") or "3")
local TASKS = 64

local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. dir .. " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 "
  .. "-addext subjectAltName=IP:127.0.0.1 -keyout " .. dir .. "/key.pem -out " .. dir .. "/cert.pem 2>/dev/null"))
local tls = { cert = dir .. "/cert.pem", key = dir .. "/key.pem" }
local SERVER = [[
    location = /c { return 200 "$connection"; }
]]
local h2 = nginx.start { server = SERVER, tls = tls, http2 = true, http = "keepalive_requests 100000;" }
local h1 = nginx.start { server = SERVER, tls = tls, http = "keepalive_requests 100000;" }

local opts = { ca_file = dir .. "/cert.pem", on_retry = false }
-- Each contender leaves 64 connections idle between its rounds: room for
-- both in the engine's cache, or the HTTP/1.1 round's 64 would push the
-- HTTP/2 connection out (the oldest idle goes first), and the next HTTP/2
-- round would start from no connection at all (docs/http.md#http2).
rw.configure { max_idle_connections = 2 * TASKS + 1 }

-- requests per second, connections seen
local function round(url)
  local seen, failures = {}, 0
  local t0 = rw.now()
  rw.run(function()
    for _ = 1, TASKS do
      rw.spawn(function()
        for _ = 1, N / TASKS do
          local res = rw.fetch(url, opts)
          if res then seen[res.body] = true else failures = failures + 1 end
        end
      end)
    end
  end)
  local elapsed = rw.now() - t0
  local connections = 0
  for _ in pairs(seen) do connections = connections + 1 end
  if failures > 0 then error(failures .. " requests failed") end
  return N / elapsed, connections
end

local ok, err = pcall(function()
  -- warm-up (handshakes, caches); the first burst on a fresh engine
  local _, first_h2 = round(h2:url("/c"))
  local _, first_h1 = round(h1:url("/c"))
  local r2, r1, ratio, c2, c1 = {}, {}, {}, {}, {}
  for i = 1, ROUNDS do
    r2[i], c2[i] = round(h2:url("/c"))
    r1[i], c1[i] = round(h1:url("/c"))
    ratio[i] = r2[i] / r1[i]
  end
  local function span(list, fmt)
    table.sort(list)
    return string.format(fmt, list[1]) .. (#list > 1 and string.format(" - " .. fmt, list[#list]) or "")
  end
  print(string.format("%d requests a round, %d tasks, %d rounds, HTTPS on loopback", N, TASKS, ROUNDS))
  print()
  print("| contender | requests / s | connections opened a round |")
  print("|---|---|---|")
  print(string.format("| HTTP/2 (nginx `ssl http2`) | %s | %s |", span(r2, "%.0f"), span(c2, "%d")))
  print(string.format("| HTTP/1.1 (nginx `ssl`) | %s | %s |", span(r1, "%.0f"), span(c1, "%d")))
  print(string.format("| ratio HTTP/2 / HTTP/1.1 | %s | |", span(ratio, "%.2f")))
  print()
  print(string.format("The first burst of each, on a fresh engine: HTTP/2 %d connection(s), HTTP/1.1 %d.",
    first_h2, first_h1))
end)
h2:stop()
h1:stop()
os.execute("rm -rf " .. dir)
if not ok then
  io.stderr:write("bench: ", tostring(err), "\n")
  os.exit(1)
end
