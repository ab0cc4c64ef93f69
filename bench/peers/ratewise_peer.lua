-- bench/peers/ratewise_peer.lua: ratewise's side of `make bench-peers`
-- (bench/peers.lua), written as a user calls a rate-limited API with it:
-- rw.fetch(url) with its defaults (a 429, a 5xx or a transport error is
-- retried, a server's Retry-After honoured; 3 retries after the first
-- attempt, exponential backoff from 1 s capped at 60 s with full jitter).
--
--   lua ratewise_peer.lua URL N CONC WARMUP
--
-- Run by the Lua of the Makefile, with its LUA_PATH and LUA_CPATH. CONC = 1
-- is the sequential shape: a plain loop of rw.fetch, outside any task.
-- Otherwise CONC tasks under rw.run, each looping over its share of the N
-- calls. WARMUP calls go first, in the same process, off the clock. Prints
-- one line, as the other peers do:
--   rate=REQ_PER_S failed=F cpu_us=CPU_PER_REQ
-- A failed call (an error after the retries, a status other than 200, a
-- body other than "ok") is counted and the first of each kind goes to
-- stderr; the exit status is 1 when any failed.
local rw = require "ratewise"

local url, n, conc, warmup = arg[1], tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
if not (url and n and n >= 1 and conc and conc >= 1 and warmup and warmup >= 0) then
  io.stderr:write("usage: lua ratewise_peer.lua URL N CONC WARMUP\n")
  os.exit(2)
end

local failed, shown = 0, {}

local function call()
  local res, err = rw.fetch(url)
  local why
  if not res then
    why = tostring(err)
  elseif res.status ~= 200 then
    why = "status " .. res.status
  elseif res.body ~= "ok" then
    why = string.format('a body of %d bytes, not "ok"', #res.body)
  end
  if why then
    failed = failed + 1
    if not shown[why] then
      shown[why] = true
      io.stderr:write("ratewise failed: ", why, "\n")
    end
  end
end

local function loop(calls)
  for _ = 1, calls do call() end
end

local function run(count)
  if conc == 1 then return loop(count) end
  rw.run(function()
    for w = 1, conc do
      local calls = math.floor(count / conc) + (w <= count % conc and 1 or 0)
      if calls > 0 then rw.spawn(loop, calls) end
    end
  end)
end

run(warmup)
local t0, c0 = rw.now(), os.clock()
run(n)
local secs, cpu = rw.now() - t0, os.clock() - c0
io.write(string.format("rate=%.1f failed=%d cpu_us=%.2f\n", n / secs, failed, cpu * 1e6 / n))
os.exit(failed > 0 and 1 or 0)
