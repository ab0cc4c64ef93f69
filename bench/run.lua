-- `make bench`: sequential keep-alive GETs on loopback, ratewise's rw.fetch
-- against the same loop in plain C with libcurl (bench/plain_curl), both
-- against one private nginx, in alternating rounds. A benchmark, not a test:
-- it fails only when a request fails, not when the ratio misses its target.
--
-- Run from the repository root (the Makefile does), with LUA_PATH/LUA_CPATH
-- pointing at ./lua and ./build. Knobs (environment):
--   BENCH_REQUESTS  requests per round and contender (default 20000)
--   BENCH_ROUNDS    rounds (default 5)
--   BENCH_WARMUP    warm-up requests per contender (default 2000)
local rw = require "ratewise"

local TARGET = 0.90
local function env_int(name, default)
  local v = tonumber(os.getenv(name) or "")
  if v and v >= 1 and v % 1 == 0 then return math.tointeger(v) end
  return default
end
local N = env_int("BENCH_REQUESTS", 20000)
local ROUNDS = env_int("BENCH_ROUNDS", 5)
local WARMUP = env_int("BENCH_WARMUP", 2000)

local here = (arg and arg[0] or "bench/run.lua"):match("^(.*)/[^/]*$") or "."
local NGINX_SH = here .. "/nginx.sh"
local PLAIN = here .. "/plain_curl"

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Runs a command, returns its standard output (trimmed) or raises.
local function capture(cmd)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  local ok, how, code = p:close()
  if not ok then
    error(string.format("command failed (%s %s): %s", tostring(how), tostring(code), cmd), 0)
  end
  return (out:gsub("%s+$", ""))
end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n % 2 == 1 then return s[(n + 1) // 2] end
  return (s[n // 2] + s[n // 2 + 1]) / 2
end

---------------------------------------------------------------------------
-- The contenders

local agent = "ratewise/" .. rw._VERSION -- what rw.fetch sends as User-Agent

local function run_plain(url, n)
  local out = capture(string.format("%s %s %d %s", sh_quote(PLAIN), sh_quote(url), n, sh_quote(agent)))
  local rate = tonumber(out:match("rate=([%d.]+)"))
  if not rate then error("plain_curl printed no rate: " .. out, 0) end
  return rate
end

local failures, shown = 0, {}
local function run_ratewise(url, n)
  local fetch, now = rw.fetch, rw.now
  local opts = { on_retry = false }
  local failed = 0
  local t0 = now()
  for _ = 1, n do
    local res, err = fetch(url, opts)
    if not res or res.status ~= 200 then
      failed = failed + 1
      local why = res and ("status " .. tostring(res.status)) or tostring(err)
      if not shown[why] then
        shown[why] = true
        io.stderr:write("rw.fetch failed: ", why, "\n")
      end
    end
  end
  local secs = now() - t0
  failures = failures + failed
  return n / secs, failed
end

---------------------------------------------------------------------------
-- The run

local function bench(port)
  local url = string.format("http://127.0.0.1:%d/", port)
  io.write(string.format("nginx on 127.0.0.1:%d; ratewise %s; %s\n", port, rw._VERSION,
    require("ratewise.core").curl_version or "libcurl"))
  -- Warm-up: connection, caches, CPU frequency; results thrown away.
  run_plain(url, WARMUP)
  run_ratewise(url, WARMUP)

  local plain, ours = {}, {}
  for r = 1, ROUNDS do
    -- Alternate which contender goes first, so drift hits both alike.
    if r % 2 == 1 then
      plain[r] = run_plain(url, N)
      ours[r] = run_ratewise(url, N)
    else
      ours[r] = run_ratewise(url, N)
      plain[r] = run_plain(url, N)
    end
    io.write(string.format("  round %d: plain libcurl %8.0f req/s, ratewise %8.0f req/s, ratio %.3f\n",
      r, plain[r], ours[r], ours[r] / plain[r]))
    io.flush()
  end

  local mp, mo = median(plain), median(ours)
  local ratio = mo / mp
  io.write(string.format("sequential keep-alive GET, loopback nginx, %d requests x %d rounds\n", N, ROUNDS))
  io.write(string.format("  plain libcurl (easy handle reused)   %6.0f req/s\n", mp))
  io.write(string.format("  ratewise rw.fetch                    %6.0f req/s\n", mo))
  io.write(string.format("  ratio ratewise / libcurl             %.2f   (target >= %.2f%s)\n",
    ratio, TARGET, ratio >= TARGET and "" or ", NOT met"))
  local ratios = {}
  for r = 1, ROUNDS do ratios[r] = ours[r] / plain[r] end
  -- Each round's two runs are back to back, so this one shrugs off the
  -- machine's drift better than the ratio of the medians above.
  io.write(string.format("  ratio, median of the per-round ones  %.2f\n", median(ratios)))
  io.write(string.format("  rw.fetch failures                    %d of %d\n",
    failures, (ROUNDS * N) + WARMUP))
end

local dir = capture("mktemp -d -t ratewise-bench.XXXXXX")
local ok, err = xpcall(function()
  local port = tonumber(capture(string.format("bash %s start %s", sh_quote(NGINX_SH), sh_quote(dir))))
  if not port then error("nginx.sh start printed no port", 0) end
  bench(port)
end, debug.traceback)
-- Stopped whatever happened above (an error, a failed request, ^C).
os.execute(string.format("bash %s stop %s", sh_quote(NGINX_SH), sh_quote(dir)))
os.execute("rm -rf " .. sh_quote(dir))

if not ok then
  io.stderr:write("bench failed: ", tostring(err), "\n")
  os.exit(1)
end
if failures > 0 then
  io.stderr:write(string.format("bench: %d rw.fetch call(s) did not return status 200\n", failures))
  os.exit(1)
end
