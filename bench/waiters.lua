-- waiters.lua [TASKS [SECONDS]]: what tasks cost while they wait on a bucket.
-- Run by bench/run.lua in a fresh process of its own interpreter (lua5.4 or
-- luajit), so that nothing else the benchmark allocated muddies the memory
-- figure. Run from the repository root with LUA_PATH/LUA_CPATH pointing at
-- ./lua and ./build (./build-luajit for luajit).
--
--   1. TASKS tasks (default 10000) each call b:acquire() on a bucket that
--      will not serve them for a long time (capacity 1, rate 0.001, its one
--      token taken first); rw.step(0) lets them all start waiting. The
--      resident set (VmRSS) before and after, both after two full garbage
--      collections, gives the memory a waiting task holds.
--   2. rw.step(SECONDS) (default 2) blocks with all of them waiting; the
--      process CPU time (os.clock) it used should be next to nothing.
--   3. Every task is cancelled and rw.step(0) must leave no live task.
--
-- Prints one line of key=value pairs for run.lua; exits 1 when a check fails.
local rw = require "ratewise"

local format = string.format
local N = math.floor(tonumber(arg[1] or "") or 10000)
local WAIT = tonumber(arg[2] or "") or 2

-- The resident set, in bytes.
local function rss()
  local f = assert(io.open("/proc/self/status", "r"))
  local status = f:read("*a")
  f:close()
  local kb = assert(tonumber(status:match("VmRSS:%s*(%d+)%s*kB")), "no VmRSS in /proc/self/status")
  return kb * 1024
end

local function full_gc()
  collectgarbage("collect")
  collectgarbage("collect")
end

local b = rw.bucket { capacity = 1, rate = 0.001 }
assert(b:acquire(), "the bucket's first token") -- from now on, waiter k waits k * 1000 s

local function waiter()
  b:acquire()
end

-- The list of tasks is the caller's, not the tasks' own cost: sized first.
local tasks = {}
for i = 1, N do tasks[i] = false end
-- One task through the whole cycle first, so that one-off allocations
-- (the scheduler's first tables, the bucket's methods) are not counted.
do
  local t = rw.spawn(waiter)
  rw.step(0)
  t:cancel()
  rw.step(0)
end

full_gc()
local rss0, heap0 = rss(), collectgarbage("count") * 1024
local t0 = rw.now()
for i = 1, N do tasks[i] = rw.spawn(waiter) end
local live = rw.step(0, false) -- all that is ready, however long it takes
local start_secs = rw.now() - t0
full_gc()
local rss1, heap1 = rss(), collectgarbage("count") * 1024

local waiting = 0
for i = 1, N do
  if tasks[i]:status() == "waiting" then waiting = waiting + 1 end
end

-- Blocking with every task waiting.
local c0, w0 = os.clock(), rw.now()
local live_after_wait = rw.step(WAIT)
local cpu, wall = os.clock() - c0, rw.now() - w0

-- Cancelling them all.
local t1 = rw.now()
for i = 1, N do tasks[i]:cancel() end
local live_after_cancel = rw.step(0, false)
local cancel_secs = rw.now() - t1
local done = 0
for i = 1, N do
  if tasks[i]:status() == "done" then done = done + 1 end
end

print(format("tasks=%d live=%d waiting=%d rss_per_task=%.0f heap_per_task=%.0f start_s=%.4f "
  .. "wait_s=%.3f wait_cpu_s=%.4f live_after_wait=%d cancel_s=%.4f live_after_cancel=%d done=%d",
  N, live, waiting, (rss1 - rss0) / N, (heap1 - heap0) / N, start_secs,
  wall, cpu, live_after_wait, cancel_secs, live_after_cancel, done))

if live ~= N or waiting ~= N or live_after_wait ~= N or live_after_cancel ~= 0 or done ~= N then
  io.stderr:write("waiters.lua: the tasks did not wait, or did not all end when cancelled\n")
  os.exit(1)
end
