-- bench/ratelimit.lua: how much of a rate-limited server's rate ratewise
-- gets, and how many of its requests the server refuses.
--
--   make bench-rate           (or: lua5.4 bench/ratelimit.lua, from the
--                              root, after make and make LUA=luajit)
--
-- The server is a private nginx with the Lua module whose one location is
-- a token bucket in a shared dict (RATE a second, a burst of 1 or 2 tokens),
-- answering 429 with Retry-After: 1 when it is empty, as a rate-limited API
-- does. Against it, TASKS tasks call rw.fetch in a loop for SECONDS, through
-- each limiter in turn:
--
--   reactive             no limiter: Retry-After only;
--   bucket at the limit  rw.bucket{capacity = 1, rate = RATE};
--   bucket at 90%        rw.bucket{capacity = 1, rate = 0.9 * RATE};
--   adaptive             rw.adaptive{}, told no rate at all.
--
-- Each row is two contenders in one run, the server's rate and what
-- ratewise got of it: "share" is requests accepted / (RATE * SECONDS), and
-- "429s" the share of requests the server refused. A benchmark, not a
-- test: it fails only when a request fails outright.
local nginx = require "spec.support.nginx"
local rw = require "ratewise"

local RATE = tonumber(os.getenv("BENCH_RATE") or "200")
local SECONDS = tonumber(os.getenv("BENCH_RATE_SECONDS") or "5")
local TASKS = tonumber(os.getenv("BENCH_RATE_TASKS") or "16")
local ROUNDS = tonumber(os.getenv("BENCH_RATE_ROUNDS") or "1")

-- The server's bucket: time from clock_gettime (ngx.now() is cached per
-- event-loop turn, in milliseconds: too coarse at 200 a second).
local server = nginx.start {
  http = "lua_shared_dict limiter 1m;",
  server = [[
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
    location = /api { content_by_lua_block {
      local ffi = require "ffi"
      pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } rl_timespec;"
        .. " int clock_gettime(int, rl_timespec *);")
      local ts = ffi.new("rl_timespec")
      ffi.C.clock_gettime(1, ts)
      local now = tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
      local d = ngx.shared.limiter
      local burst, rate, counted = d:get("burst"), d:get("rate"), not d:get("stopped")
      local tokens, at = d:get("tokens") or burst, d:get("at") or now
      tokens = math.min(burst, tokens + (now - at) * rate)
      if tokens >= 1 then
        d:set("tokens", tokens - 1); d:set("at", now)
        if counted then d:incr("ok", 1) end
        ngx.say("ok")
      else
        d:set("tokens", tokens); d:set("at", now)
        if counted then d:incr("limited", 1) end
        ngx.status = 429
        ngx.header["Retry-After"] = "1"
        ngx.say("slow down")
      end } }
  ]],
}

local control = { on_retry = false, max_retries = 0, timeout = 5 }
local function call(path)
  local res, err = rw.fetch(server:url(path), control)
  if not res or res.status ~= 200 then error("bench: " .. path .. ": " .. tostring(err or res.status)) end
  return res.body
end

local failures = 0

-- One run: the share of the rate accepted and the share of requests refused.
local function run(burst, make_limiter)
  call("/reset?burst=" .. burst .. "&rate=" .. RATE)
  local limiter = make_limiter and make_limiter()
  local url = server:url("/api")
  local opts = { limiter = limiter, on_retry = false, max_retries = 1000, max_elapsed = 60 }
  local stop_at = rw.now() + SECONDS
  local ok, limited
  rw.run(function()
    for _ = 1, TASKS do
      rw.spawn(function()
        while rw.now() < stop_at do
          local res, err = rw.fetch(url, opts)
          if not res and err.kind ~= "budget" then
            failures = failures + 1
            io.stderr:write("bench: ", tostring(err), "\n")
          end
        end
      end)
    end
    -- counted for SECONDS exactly; what is in flight then is not
    rw.sleep(SECONDS)
    ok, limited = call("/stop"):match("(%d+) (%d+)")
    ok, limited = tonumber(ok), tonumber(limited)
    stop_at = 0
  end)
  return ok / (RATE * SECONDS), limited / math.max(1, ok + limited)
end

local limiters = {
  { "reactive (Retry-After only)", nil },
  { "bucket at the limit", function() return rw.bucket { capacity = 1, rate = RATE } end },
  { "bucket at 90%", function() return rw.bucket { capacity = 1, rate = RATE * 0.9 } end },
  { "adaptive, no rate given", function() return rw.adaptive {} end },
}

print(string.format("server: %d requests/s, 429 with Retry-After: 1; %d tasks, %g s a run, %d round(s)",
  RATE, TASKS, SECONDS, ROUNDS))
print()
print("| limiter | server burst | share of the rate | answered 429 |")
print("|---|---|---|---|")
for _, burst in ipairs { 1, 2 } do
  for _, entry in ipairs(limiters) do
    local shares, refused = {}, {}
    for round = 1, ROUNDS do
      shares[round], refused[round] = run(burst, entry[2])
    end
    local function span(list)
      table.sort(list)
      if #list == 1 then return string.format("%.1f%%", 100 * list[1]) end
      return string.format("%.1f-%.1f%%", 100 * list[1], 100 * list[#list])
    end
    print(string.format("| %s | %d | %s | %s |", entry[1], burst, span(shares), span(refused)))
  end
end
server:stop()
if failures > 0 then
  io.stderr:write(string.format("bench: %d requests failed\n", failures))
  os.exit(1)
end
