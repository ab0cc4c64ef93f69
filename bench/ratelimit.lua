-- bench/ratelimit.lua: how much of a rate-limited server's rate ratewise
-- gets, and how many of its requests the server refuses.
--
--   make bench-rate           (or: lua5.4 bench/ratelimit.lua, from the
--                              root, after make, make LUA=luajit and
--                              npm ci in bench/fixed_window)
--
-- The servers, each at RATE requests a second:
--
--   token bucket     a private nginx with the Lua module whose location is
--                    a token bucket in a shared dict (a burst of 1 or 2
--                    tokens), answering 429 with Retry-After: 1 when it is
--                    empty, as a rate-limited API does;
--   limit_req        the same nginx's own limit_req (burst 0, burst 5
--                    nodelay, and burst 5, which delays what is within the
--                    burst): a 429 without any header;
--   HAProxy          Debian's haproxy 2.6 (spec/support/haproxy.lua): a
--                    stick table tracking http_req_rate(1s), 429 with
--                    Retry-After: 1 above RATE. It counts the requests it
--                    refuses, so a client that stays over the rate is shut
--                    out; a fresh one each run;
--   fixed windows    real third-party limiters with their memory stores,
--                    RATE requests a 1 s window (bench/fixed_window, node):
--                    express-rate-limit 7 with its legacy X-RateLimit-*
--                    headers (the reset in epoch seconds) or its draft-7
--                    RateLimit and RateLimit-Policy; @fastify/rate-limit 9
--                    (x-ratelimit-reset in seconds until the reset), also
--                    without Retry-After.
--
-- Against each, TASKS tasks call rw.fetch in a loop for SECONDS, through
-- each limiter in turn:
--
--   reactive             rw.fetch with no limiter: the server's hints only;
--   rw.client, no limiter given  a client of the server's origin, which
--                        makes its own limiter: rw.adaptive{dormant = true},
--                        asleep until the first 429;
--   bucket at the limit  rw.bucket{capacity = 1, rate = RATE};
--   bucket at 90%        rw.bucket{capacity = 1, rate = 0.9 * RATE};
--   adaptive             rw.adaptive{}, told no rate at all;
--   ... + provider       the same with a provider (github for X-RateLimit-*,
--                        ietf for RateLimit) reading the headers;
--   bucket, server's burst  rw.bucket{capacity = RATE, rate = RATE}: the
--                        advice "the server's rate and its burst" (HAProxy);
--   the peers            Node undici + p-retry and Python httpx + tenacity
--                        with no limiter (bench/peers/undici_rate.mjs,
--                        httpx_rate.py: the retries of make bench-peers),
--                        TASKS workers in their own process, counted by
--                        the server as ratewise is; and the same with the
--                        first step of ratewise's backoff after a bare 429
--                        (0.05 s), to compare at the same eagerness.
--
-- Each row is two contenders in one run, the server's rate and what
-- ratewise got of it: "share" is requests accepted / (RATE * SECONDS), and
-- "429s" the share of requests the server refused. A benchmark, not a
-- test: it fails only when a request fails outright.
local haproxy = require "spec.support.haproxy"
local nginx = require "spec.support.nginx"
local support = require "spec.support.server"
local socket = require "socket"
local rw = require "ratewise"

local RATE = tonumber(os.getenv("BENCH_RATE") or "200")
local SECONDS = tonumber(os.getenv("BENCH_RATE_SECONDS") or "5")
local TASKS = tonumber(os.getenv("BENCH_RATE_TASKS") or "16")
local ROUNDS = tonumber(os.getenv("BENCH_RATE_ROUNDS") or "1")
-- BENCH_RATE_ONLY=limit_req (a Lua pattern) runs only the servers it matches.
local ONLY = os.getenv("BENCH_RATE_ONLY")

-- Counts what /api (the token bucket) and /lr0, /lr5 (limit_req) answered
-- until /stop. The bucket's time from clock_gettime (ngx.now() is cached
-- per event-loop turn, in milliseconds: too coarse at 200 a second).
local count_status = [[log_by_lua_block {
      local d = ngx.shared.limiter
      if not d:get("stopped") then d:incr(ngx.status == 429 and "limited" or "ok", 1, 0) end }]]
local server = nginx.start {
  http = "lua_shared_dict limiter 1m;\n  limit_req_zone $binary_remote_addr zone=lr:1m rate=" .. RATE .. "r/s;",
  server = [[
    limit_req_status 429;
    location = /reset { content_by_lua_block {
      local d = ngx.shared.limiter
      d:flush_all()
      d:set("burst", tonumber(ngx.var.arg_burst)); d:set("rate", tonumber(ngx.var.arg_rate))
      d:set("ok", 0); d:set("limited", 0)
      ngx.say("ok") } }
    location = /stop { content_by_lua_block {
      local d = ngx.shared.limiter
      d:set("stopped", true)
      ngx.say(d:get("ok"), " ", d:get("limited")) } }
    location = /lr0 { limit_req zone=lr; content_by_lua_block { ngx.say("ok") } ]] .. count_status .. [[ }
    location = /lr5 { limit_req zone=lr burst=5 nodelay; content_by_lua_block { ngx.say("ok") } ]]
      .. count_status .. [[ }
    location = /lr5d { limit_req zone=lr burst=5; content_by_lua_block { ngx.say("ok") } ]]
      .. count_status .. [[ }
    location = /api { content_by_lua_block {
      local ffi = require "ffi"
      pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } rl_timespec;"
        .. " int clock_gettime(int, rl_timespec *);")
      local ts = ffi.new("rl_timespec")
      ffi.C.clock_gettime(1, ts)
      local now = tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
      local d = ngx.shared.limiter
      local burst, rate = d:get("burst"), d:get("rate")
      local tokens, at = d:get("tokens") or burst, d:get("at") or now
      tokens = math.min(burst, tokens + (now - at) * rate)
      if tokens >= 1 then
        d:set("tokens", tokens - 1); d:set("at", now)
        ngx.say("ok")
      else
        d:set("tokens", tokens); d:set("at", now)
        ngx.status = 429
        ngx.header["Retry-After"] = "1"
        ngx.say("slow down")
      end }
      ]] .. count_status .. [[ }
  ]],
}

local control = { on_retry = false, max_retries = 0, timeout = 5 }
local function call(url)
  local res, err = rw.fetch(url, control)
  if not res or res.status ~= 200 then error("bench: " .. url .. ": " .. tostring(err or res.status)) end
  return res.body
end

-- A fixed-window server of bench/fixed_window/server.js, started for each
-- run (so that every run starts with no window open); answers its base URL
-- and a function that stops it.
local function start_node(kind)
  local port = support.free_port()
  local out = os.tmpname()
  local proc = assert(io.popen("echo $$; cd bench/fixed_window && exec node server.js " .. port .. " " .. kind
    .. " " .. RATE .. " 1000 >" .. out .. " 2>&1", "r"))
  local pid = assert(tonumber(proc:read("*l")))
  local deadline = socket.gettime() + 10
  while not (support.read_file(out) or ""):find("listening", 1, true) do
    if socket.gettime() > deadline then
      error("bench: node server.js " .. kind .. " did not start: " .. (support.read_file(out) or ""))
    end
    socket.sleep(0.05)
  end
  return "http://127.0.0.1:" .. port, function()
    os.execute("kill " .. pid)
    proc:close()
    os.remove(out)
  end
end

local failures = 0

-- The share of the rate accepted and the share of requests refused, from
-- what `count` answers (accepted, refused) at the end of a run.
local function share_of(accepted, refused)
  return accepted / (RATE * SECONDS), refused / math.max(1, accepted + refused)
end

-- One run of ratewise against url: TASKS tasks calling rw.fetch in a loop
-- through the limiter make_limiter makes (none: reactive) for SECONDS.
local function run(url, count, make_limiter, policy)
  local limiter = make_limiter and make_limiter()
  local opts = { policy = policy, on_retry = false, max_retries = 1000, max_elapsed = SECONDS + 1 }
  local fetch
  if limiter == "client" then
    local origin, path = url:match("^(https?://[^/]+)(.*)$")
    -- (calls that differ, as an API's do: identical ones in flight would share one request)
    local client = rw.client { base_url = origin, dedupe = false }
    fetch = function() return client:get(path, opts) end
  else
    opts.limiter = limiter
    fetch = function() return rw.fetch(url, opts) end
  end
  local stop_at = rw.now() + SECONDS
  local accepted, refused
  rw.run(function()
    for _ = 1, TASKS do
      rw.spawn(function()
        while rw.now() < stop_at do
          local res, err = fetch()
          if not res and err.kind ~= "budget" then
            failures = failures + 1
            io.stderr:write("bench: ", tostring(err), "\n")
          end
        end
      end)
    end
    -- counted for SECONDS exactly; what is in flight then is not
    rw.sleep(SECONDS)
    accepted, refused = count()
    stop_at = 0
  end)
  return share_of(accepted, refused)
end

-- The peers' programs (bench/peers), each given the URL and TASKS.
local PEERS = {
  undici = { "node", "bench/peers/undici_rate.mjs" },
  httpx = { "/usr/bin/python3", "bench/peers/httpx_rate.py" },
}

-- One run of a peer (contender.peer, with its backoff's first step
-- contender.first, 1 s by default): its process starts, says "ready", and loops until it
-- is killed; the server counts from when it is ready (start is called
-- then) for SECONDS.
local function run_peer(contender, start)
  local program = PEERS[contender.peer]
  local proc = assert(io.popen("echo $$; exec " .. program[1] .. " " .. program[2] .. " '" .. start.url
    .. "' " .. TASKS .. " " .. (contender.first or 1) .. " 2>/dev/null", "r"))
  local pid = assert(tonumber(proc:read("*l")))
  local ready = proc:read("*l")
  if ready ~= "ready" then
    -- reported as not run, never given a figure
    os.execute("kill " .. pid .. " 2>/dev/null")
    proc:close()
    return nil
  end
  start.begin()
  socket.sleep(SECONDS)
  local accepted, refused = start.count()
  os.execute("kill " .. pid .. " 2>/dev/null")
  proc:close()
  return share_of(accepted, refused)
end

local reactive = { "reactive (server's hints only)" }
local bucket = { "bucket at the limit", function() return rw.bucket { capacity = 1, rate = RATE } end }
local bucket90 = { "bucket at 90%", function() return rw.bucket { capacity = 1, rate = RATE * 0.9 } end }
local bucket_burst = { "bucket, server's rate and burst",
  function() return rw.bucket { capacity = RATE, rate = RATE } end }
local adaptive = { "adaptive, no rate given", function() return rw.adaptive {} end }
local client_default = { "rw.client, no limiter given (its own wakes at the first 429)",
  function() return "client" end }
local function with(provider, entry)
  return { (entry[1] or "no limiter") .. " + " .. provider .. " provider", entry[2], rw.providers[provider] }
end
local github_reactive = { "github provider, no limiter", nil, rw.providers.github }
local undici = { "peer: Node undici + p-retry, no limiter", peer = "undici" }
local httpx = { "peer: Python httpx + tenacity, no limiter", peer = "httpx" }
local first = require("ratewise.fetch.decision").THROTTLE_BASE
local undici_short = { string.format("peer: Node undici + p-retry, first step %g s", first), peer = "undici",
  first = first }
local httpx_short = { string.format("peer: Python httpx + tenacity, first step %g s", first), peer = "httpx",
  first = first }

-- Each server: its name, how a run starts, and its contenders. A start
-- answers { url = the URL to load, begin = a function called when the
-- count is to begin (the server is reset), count = a function answering
-- the requests accepted and refused since, and after = one to call at
-- the end, if any }.
local function count_nginx()
  local accepted, refused = call(server:url("/stop")):match("(%d+) (%d+)")
  return tonumber(accepted), tonumber(refused)
end
local function nginx_bucket(burst)
  return function()
    return { url = server:url("/api"), count = count_nginx,
      begin = function() call(server:url("/reset?burst=" .. burst .. "&rate=" .. RATE)) end }
  end
end
local function nginx_limit_req(path)
  return function()
    socket.sleep(0.1) -- limit_req's state from the last run drains
    return { url = server:url(path), count = count_nginx, begin = function() call(server:url("/reset")) end }
  end
end
local function node(kind)
  return function()
    local base, stop = start_node(kind)
    local count = function()
      local accepted, refused = call(base .. "/_stop"):match("(%d+) (%d+)")
      return tonumber(accepted), tonumber(refused)
    end
    return { url = base .. "/api", count = count, after = stop, begin = function() end }
  end
end
-- A fresh HAProxy for each run: its window starts empty.
local function haproxy_window()
  local h = haproxy.start { rate = RATE, window = "1s", retry_after = 1 }
  local accepted0, refused0 = 0, 0
  return { url = h:url("/api"), after = function() h:stop() end,
    begin = function() accepted0, refused0 = h:counts() end,
    count = function()
      local accepted, refused = h:counts()
      return accepted - accepted0, refused - refused0
    end }
end

-- One row: ratewise's run, or a peer's.
local function run_row(start, contender)
  if contender.peer then return run_peer(contender, start) end
  start.begin()
  return run(start.url, start.count, contender[2], contender[3])
end

local limit_req_contenders = { reactive, client_default, undici, httpx, undici_short, httpx_short, bucket, adaptive }
local servers = {
  { "token bucket, burst 1, Retry-After: 1", nginx_bucket(1),
    { reactive, client_default, bucket, bucket90, adaptive } },
  { "token bucket, burst 2, Retry-After: 1", nginx_bucket(2),
    { reactive, client_default, bucket, bucket90, adaptive } },
  { "nginx limit_req, burst 0", nginx_limit_req("/lr0"), limit_req_contenders },
  { "nginx limit_req, burst 5 nodelay", nginx_limit_req("/lr5"), limit_req_contenders },
  { "nginx limit_req, burst 5", nginx_limit_req("/lr5d"), limit_req_contenders },
  { "HAProxy http_req_rate(1s), Retry-After: 1", function() return haproxy_window() end,
    { reactive, client_default, undici, httpx, bucket, bucket_burst, adaptive } },
  { "express-rate-limit, legacy X-RateLimit-*", node("express-legacy"),
    { reactive, client_default, github_reactive, bucket, adaptive, with("github", adaptive) } },
  { "express-rate-limit, draft-7 RateLimit", node("express-draft-7"),
    { reactive, client_default, bucket, adaptive, with("ietf", adaptive) } },
  { "@fastify/rate-limit", node("fastify"),
    { reactive, client_default, github_reactive, bucket, adaptive, with("github", adaptive) } },
  { "@fastify/rate-limit, no Retry-After", node("fastify-no-retry"),
    { reactive, client_default, github_reactive, adaptive, with("github", adaptive) } },
}

print(string.format("%d requests/s (fixed windows: %d a 1 s window); %d tasks, %g s a run, %d round(s)",
  RATE, RATE, TASKS, SECONDS, ROUNDS))
print()
print("| server | limiter | share of the rate | answered 429 |")
print("|---|---|---|---|")
for _, entry in ipairs(servers) do
  if not ONLY or entry[1]:find(ONLY) then
    for _, limiter in ipairs(entry[3]) do
      local shares, refused = {}, {}
      for round = 1, ROUNDS do
        local start = entry[2]()
        shares[round], refused[round] = run_row(start, limiter)
        if start.after then start.after() end
      end
      local function span(list)
        if #list < ROUNDS then
          return "NOT RUN (npm ci in bench/peers; Debian's python3-httpx and python3-tenacity)"
        end
        table.sort(list)
        if #list == 1 then return string.format("%.1f%%", 100 * list[1]) end
        return string.format("%.1f-%.1f%%", 100 * list[1], 100 * list[#list])
      end
      print(string.format("| %s | %s | %s | %s |", entry[1], limiter[1], span(shares), span(refused)))
      io.stdout:flush()
    end
  end
end
server:stop()
if failures > 0 then
  io.stderr:write(string.format("bench: %d requests failed\n", failures))
  os.exit(1)
end
