-- bench/openresty.lua: issue 15's shapes in the OpenResty host, each against
-- plain libcurl (`make bench-openresty`).
--
--   make bench-openresty      (or, from the root after make, make luajit-core
--                              and make -C bench: lua5.4 bench/openresty.lua)
--
-- Two private nginx servers on loopback: the target, a plain nginx
-- (bench/nginx.sh: `/` answers "ok", `/body/64k` and `/body/1m` are static
-- files of 65,536 and 1,048,576 bytes), and an OpenResty nginx (Debian's nginx with the Lua module, its
-- LuaJIT luajit2's, ratewise from this tree: lua/ and build-luajit/, as
-- spec/support/nginx.lua starts it) with one worker. One request to that
-- nginx runs one round of a shape inside its worker, in a content handler
-- (bench/openresty_handler.lua), as user code would, and answers with the
-- rate and the worker's CPU time per request (/proc/self/stat of the
-- worker). The plain contender is bench/multi_curl64 against the same
-- target: one libcurl multi handle, 64 transfers in flight, each body kept
-- (bench/plain_curl, one easy handle, for the sequential shape).
-- Alternating rounds (bench/rounds.lua), the ratio ratewise / plain (median
-- of the rounds' ratios, and their range). First, one request of each goes
-- to bench/capture_request.py: the request heads must be the same bytes.
--
-- Reported too: how much of each round the worker was on the CPU (its CPU
-- time over the round's wall time): what is left, it waited.
--
-- The worker's CPU is comparable with the plain contender's: the target is
-- a separate nginx, so the worker serves nothing but this benchmark's one
-- request at a time. On a 2-core machine the target has one core and the
-- contender the other; this script waits for the answer, idle.
--
-- Shapes (BENCH_ONLY picks, comma-separated):
--   loop64      64 light threads (ngx.thread.spawn) of the handler, each
--               looping rw.fetch(url, opts) with one options table
--   body_64k    the same on /body/64k, each body's length checked
--   map_shared  rw.map(urls, function(u) return rw.fetch(u, opts) end,
--               {concurrency = 64}), one shared opts: its tasks run in
--               ratewise's driver (docs/hosts.md#openresty); the multi
--               keeps every response, as rw.map returns every result
--   map_fresh   the same with a fresh options table a call (the time left
--               to a deadline in it)
--   body_1m     loop64's threads on /body/1m
--   sequential  rw.fetch in a loop of the handler, one request at a time,
--               against bench/plain_curl (one reused easy handle); target 0.95
--
-- Beside the cosocket client (issue 40): the same worker runs a 40-line
-- keep-alive HTTP/1.1 client on ngx.socket.tcp (the handler's client=cosocket,
-- the way lua-resty-http works) against rw.fetch, requests/s and the
-- worker's CPU a request, on the target and on a second one whose every
-- answer waits 50 ms (bench/nginx.sh, NGINX_LATENCY_MS=50):
--   cos_c1        one request at a time, small answers (target 0.80)
--   cos_c64       64 light threads, small answers
--   cos_64k       64 light threads, 64 KiB bodies
--   cos_c64_slow  64 light threads, answers after 50 ms
--   cos_c1_slow   one request at a time, answers after 50 ms (the call's
--                 milliseconds are reported: within 2 ms of the cosocket's)
-- Each row's CPU ratio is reported beside it (targets: at most 1.6, and 2
-- for cos_c1_slow).
--
-- A benchmark, not a test: it fails only when a request fails (a worker that
-- dies fails every request of its round), never on a ratio. Knobs:
--   BENCH_OPENRESTY_REQUESTS      loop64, map_shared: requests a round and contender (default 20000)
--   BENCH_OPENRESTY_64K_REQUESTS  body_64k: requests a round and contender (default 10000)
--   BENCH_OPENRESTY_1M_REQUESTS   body_1m: requests a round and contender (default 2000)
--   BENCH_OPENRESTY_SEQ_REQUESTS  sequential: requests a round and contender (default 10000)
--   BENCH_OPENRESTY_SLOW_REQUESTS cos_c64_slow: requests a round and contender (default 640);
--                                 cos_c1_slow takes a thirty-second of it
--   BENCH_OPENRESTY_ROUNDS        rounds (default 5)
--   BENCH_OPENRESTY_WARMUP        warm-up requests per contender (default: a tenth of a round)
--   BENCH_CONCURRENCY             light threads, map's concurrency, transfers in flight (default 64)
--   BENCH_ONLY                    the shapes to run (default: all)
local nginx = require "spec.support.nginx"
local rw = require "ratewise"
local common = require "bench.common"
local rounds = require "bench.rounds"

local format = string.format
local env_int, sh_quote, capture = common.env_int, common.sh_quote, common.capture

local N = env_int("BENCH_OPENRESTY_REQUESTS", 20000)
local N_64K = env_int("BENCH_OPENRESTY_64K_REQUESTS", 10000)
local N_1M = env_int("BENCH_OPENRESTY_1M_REQUESTS", 2000)
local N_SEQ = env_int("BENCH_OPENRESTY_SEQ_REQUESTS", 10000)
local N_SLOW = env_int("BENCH_OPENRESTY_SLOW_REQUESTS", 640)
local ROUNDS = env_int("BENCH_OPENRESTY_ROUNDS", 5)
local WARMUP = env_int("BENCH_OPENRESTY_WARMUP", nil)
local CONC = env_int("BENCH_CONCURRENCY", 64)
local wanted = common.only()

local NGINX_SH = common.here .. "/nginx.sh"
local BODY_64K, BODY_1M = 65536, 1048576


-- The OpenResty nginx: /bench runs a round (bench/openresty_handler.lua).
local host -- spec.support.nginx's handle
local alerts_shown = 0 -- the [alert] lines of its error log already shown (a worker that died)
local busy = {} -- the share of each of ratewise's rounds the worker was on the CPU (the current shape's)
local function ours(shape, url, n, size, client)
  local res, err = common.openresty_round(host, shape, url, n, CONC, size, client)
  local body = res and res.status == 200 and res.body or ""
  local rate = tonumber(body:match("rate=([%d.]+)"))
  if not rate then
    io.stderr:write("the OpenResty round failed: ", res and (res.status .. " " .. res.body) or tostring(err), "\n")
    local log, i = host:error_log() or "", 0
    for l in log:gmatch("[^\n]*%[alert%][^\n]*") do
      i = i + 1
      if i > alerts_shown then io.stderr:write("  nginx: ", l, "\n") end
    end
    alerts_shown = i
    return { rate = 0, failed = n }
  end
  local first = body:match("first failure: ([^\n]*)")
  if first then io.stderr:write("rw.fetch in OpenResty failed: ", first, "\n") end
  local m = { rate = rate, failed = tonumber(body:match("failed=(%d+)")),
    cpu_us = tonumber(body:match("cpu_us=([%d.]+)")) }
  if m.cpu_us and not client then
    busy[#busy + 1] = m.cpu_us * rate / 1e6
  end
  return m
end

local rows, failed = {}, 0

local function bench(base, slow_base)
  local root_url, url_64k, url_1m = base .. "/", base .. "/body/64k", base .. "/body/1m"
  local function shape(key, name, kind, url, n, size)
    -- rw.map hands back every result: the multi keeps every response too
    -- (--keep); a large body is handed over as a copy of its own (--copy)
    local flags = (kind == "map" or kind == "map_fresh") and "--keep" or size and "--copy" or nil
    local plain = function(k) return common.run_multi(url, k, CONC, { size = size, flags = flags }) end
    if kind == "sequential" then plain = function(k) return common.run_plain(url, k) end end
    return { key = key, name = name, n = n, rounds = ROUNDS, warmup = WARMUP or math.ceil(n / 10),
      target = kind == "sequential" and 0.95 or 0.90, plain = plain,
      ours = function(k) return ours(kind, url, k, size) end }
  end
  local shapes = {
    shape("sequential", "OpenResty, sequential rw.fetch / one easy handle", "sequential", root_url, N_SEQ),
    shape("loop64", format("OpenResty, %d threads looping rw.fetch / multi", CONC), "loop", root_url, N),
    shape("map_shared", "OpenResty, rw.map, shared opts / multi", "map", root_url, N),
    shape("map_fresh", "OpenResty, rw.map, fresh opts per call / multi", "map_fresh", root_url, N),
    shape("body_64k", format("OpenResty, %d threads, 64 KiB bodies / multi", CONC), "loop", url_64k, N_64K,
      BODY_64K),
    shape("body_1m", format("OpenResty, %d threads, 1 MiB bodies / multi", CONC), "loop", url_1m, N_1M,
      BODY_1M),
  }
  -- rw.fetch beside the cosocket client, in the same worker.
  local function beside(key, name, kind, url, n, size, target)
    return { key = key, name = name, n = n, rounds = ROUNDS, warmup = WARMUP or math.ceil(n / 10),
      target = target, names = { ours = "ratewise", plain = "cosocket" }, cosocket = true,
      kind_sequential = kind == "sequential",
      plain = function(k) return ours(kind, url, k, size, "cosocket") end,
      ours = function(k) return ours(kind, url, k, size) end }
  end
  local slow_url = slow_base .. "/"
  shapes[#shapes + 1] = beside("cos_c1", "OpenResty, C=1, small / cosocket", "sequential", root_url, N_SEQ, nil, 0.80)
  shapes[#shapes + 1] = beside("cos_c64", format("OpenResty, C=%d, small / cosocket", CONC), "loop", root_url, N)
  shapes[#shapes + 1] = beside("cos_64k", format("OpenResty, C=%d, 64 KiB / cosocket", CONC), "loop", url_64k,
    N_64K, BODY_64K)
  shapes[#shapes + 1] = beside("cos_c64_slow", format("OpenResty, C=%d, after 50 ms / cosocket", CONC), "loop",
    slow_url, N_SLOW)
  shapes[#shapes + 1] = beside("cos_c1_slow", "OpenResty, C=1, after 50 ms / cosocket", "sequential", slow_url,
    math.max(1, math.floor(N_SLOW / 32)))
  local jit = rawget(_G, "jit")
  io.write(format("target nginx on %s; OpenResty worker pid %d (nginx's Lua module, LuaJIT); ratewise %s; %s; "
    .. "%d in flight; this script on %s\n", base, host:worker_pid(), rw._VERSION,
    require("ratewise.core").curl_version or "libcurl", CONC, jit and jit.version or _VERSION))
  io.flush()
  -- The wire: rw.fetch in the worker and the plain contender send the same bytes.
  local agent = common.agent()
  common.check_wire { contenders = {
    { "multi_curl64", function(url)
      common.run_cmd(format("%s %s 1 1 %s", sh_quote(common.MULTI), sh_quote(url), sh_quote(agent)))
    end },
    { "rw.fetch in OpenResty", function(url) ours("loop", url, 1) end },
  } }
  for _, s in ipairs(shapes) do
    if wanted(s.key) then
      busy = {}
      local row = rounds.compare(s)
      row.busy = #busy > 0 and rounds.median(busy) or nil
      rows[#rows + 1] = row
      failed = failed + row.plain_failed + row.our_failed
    end
  end
  io.write("\n")
  rounds.report(rows)
  for _, row in ipairs(rows) do
    if row.shape.cosocket and row.our_cpu and row.plain_cpu then
      local limit = row.shape.key == "cos_c1_slow" and 2 or 1.6
      local cpu = row.our_cpu / row.plain_cpu
      io.write(format("  %-48s %.2f (target at most %.1f: %s)\n", "CPU ratewise / cosocket, " .. row.shape.key, cpu,
        limit, cpu <= limit and "met" or "NOT met"))
      if row.shape.kind_sequential then
        io.write(format("  %-48s ratewise %.2f ms, cosocket %.2f ms a call\n", "", 1000 / row.ours,
          1000 / row.plain))
      end
    end
  end
  for _, row in ipairs(rows) do
    if row.busy then
      io.write(format("  %-48s %.0f %% of a round (CPU time / wall time, median)\n",
        "worker on the CPU, " .. row.shape.key, 100 * row.busy))
    end
  end
  for _, row in ipairs(rows) do
    io.write(format("  %-48s rw.fetch %d of %d, plain %d of %d\n", "failures, " .. row.shape.key, row.our_failed,
      row.requests, row.plain_failed, row.requests))
  end
end

local dir = capture("mktemp -d -t ratewise-bench-openresty.XXXXXX")
local ok, err = xpcall(function()
  local port = tonumber(capture(format("bash %s start %s", sh_quote(NGINX_SH), sh_quote(dir))))
  if not port then error("nginx.sh start printed no port", 0) end
  local slow_port = tonumber(capture(format("NGINX_LATENCY_MS=50 bash %s start %s", sh_quote(NGINX_SH),
    sh_quote(dir .. "/slow"))))
  if not slow_port then error("nginx.sh start (NGINX_LATENCY_MS=50) printed no port", 0) end
  host = nginx.start { server = common.openresty_location() }
  bench(format("http://127.0.0.1:%d", port), format("http://127.0.0.1:%d", slow_port))
end, debug.traceback)
-- Stopped whatever happened above.
if host then host:stop() end
os.execute(format("bash %s stop %s", sh_quote(NGINX_SH), sh_quote(dir .. "/slow")))
os.execute(format("bash %s stop %s", sh_quote(NGINX_SH), sh_quote(dir)))
os.execute("rm -rf " .. sh_quote(dir))

common.exit_on_failure(ok, err, failed)
