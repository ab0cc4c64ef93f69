-- What `make lint` runs under every Lua ratewise supports (5.1, 5.3, 5.4,
-- LuaJIT), each with its own build of the C core: the library loads and its
-- parts work together without a server. The whole suite under one of them
-- is `make test LUA=...`.
local rw = require "ratewise"

assert(rw.classify(429) == "retryable" and rw.classify(404) == "terminal")
assert(rw.parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT") == 784111777)
assert(rw.parse_retry_after("120") == 120)
assert(rw.retry_delay({ ["Retry-After"] = "3" }, 0) == 3)

local bucket = rw.bucket { capacity = 1, rate = 200 }
assert(bucket:take())
local order = {}
local results = rw.map({ "a", "b", "c" }, function(name)
  -- waits on the bucket, and inside a protected call (Lua 5.1 cannot yield
  -- through pcall: rw.pcall relays the yield there)
  assert(bucket:acquire())
  local ok, err = rw.pcall(rw.sleep, 0.001)
  assert(ok, err)
  order[#order + 1] = name
  return name:upper()
end, { concurrency = 2 })
assert(results[1] == "A" and results[2] == "B" and results[3] == "C", "rw.map lost its order")
assert(#order == 3)

-- A coroutine whose runner speaks the ("ratewise.sleep", seconds) protocol waits through it.
local co = rw.speaks_protocol(coroutine.create(function() rw.sleep(0.002) return "slept" end))
local _, what, seconds = coroutine.resume(co)
assert(what == "ratewise.sleep" and seconds > 0 and seconds <= 0.002)

local sem = rw.semaphore(1)
assert(sem:acquire() and not sem:acquire(0))
sem:release()

local luajit = rawget(_G, "jit")
io.write(_VERSION, luajit and (" (" .. luajit.version .. ")") or "", ": ratewise runs\n")
