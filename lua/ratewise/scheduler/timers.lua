-- The scheduler's timers: when each waiting task is to be woken, a binary
-- min-heap kept in the state's record (heap_at, heap_task, heap_id).
--
-- A timer is stale once its task has left that wait (a semaphore's permit
-- came first, a cancellation): the loop's wake ignores it. Stale timers are
-- dropped from the top as they surface and, all at once, whenever the heap
-- has doubled since it was last swept, so that waits that end early (a
-- client's queue with a timeout of minutes) cannot pile timers up.
local errors = require "ratewise.errors"
local state = require "ratewise.scheduler.state"

local S = state.record
local huge, max = math.huge, math.max
local type, tostring = type, tostring
local shown = errors.shown

local timers = {}

--- yes = timers.stale(task, id): the timer of wait id is one task has left.
local function stale(task, id)
  return task.state ~= "waiting" or task.wait_id ~= id
end
timers.stale = stale

local push

local function sweep()
  local at, task, id, n = S.heap_at, S.heap_task, S.heap_id, S.heap_n
  S.heap_at, S.heap_task, S.heap_id, S.heap_n = {}, {}, {}, 0
  S.sweep_at = huge
  for i = 1, n do
    if not stale(task[i], id[i]) then push(at[i], task[i], id[i]) end
  end
  S.sweep_at = max(64, 2 * S.heap_n)
end

--- timers.push(at, task, id): wake task's wait numbered id at `at`
-- (monotonic seconds). The caller has moved its task to that wait already,
-- and the sweep (which runs first) drops only timers of waits that are over.
-- It runs on the waiting task's stack, so it calls no C function (math.floor):
-- a C call asks for room on that stack, and a waiting task whose stack grew
-- keeps it grown for as long as it waits.
function push(at, task, id)
  if S.heap_n + 1 >= S.sweep_at then sweep() end
  local heap_at, heap_task, heap_id = S.heap_at, S.heap_task, S.heap_id
  local i = S.heap_n + 1
  S.heap_n = i
  while i > 1 do
    local parent = (i - i % 2) / 2 -- an integer-valued float from Lua 5.3 on: the same key
    if heap_at[parent] <= at then break end
    heap_at[i], heap_task[i], heap_id[i] = heap_at[parent], heap_task[parent], heap_id[parent]
    i = parent
  end
  heap_at[i], heap_task[i], heap_id[i] = at, task, id
end
timers.push = push

--- at, task, id = timers.pop(): the first timer, taken off the heap.
function timers.pop()
  local heap_at, heap_task, heap_id, n = S.heap_at, S.heap_task, S.heap_id, S.heap_n
  local at, task, id = heap_at[1], heap_task[1], heap_id[1]
  local last_at, last_task, last_id = heap_at[n], heap_task[n], heap_id[n]
  heap_at[n], heap_task[n], heap_id[n] = nil, nil, nil
  n = n - 1
  S.heap_n = n
  if n > 0 then
    local i = 1
    while true do
      local child = 2 * i
      if child > n then break end
      if child < n and heap_at[child + 1] < heap_at[child] then child = child + 1 end
      if heap_at[child] >= last_at then break end
      heap_at[i], heap_task[i], heap_id[i] = heap_at[child], heap_task[child], heap_id[child]
      i = child
    end
    heap_at[i], heap_task[i], heap_id[i] = last_at, last_task, last_id
  end
  return at, task, id
end

--- yes = timers.first_due(t): the first timer is due by t, or stale.
function timers.first_due(t)
  return S.heap_n > 0 and (S.heap_at[1] <= t or stale(S.heap_task[1], S.heap_id[1]))
end

---------------------------------------------------------------------------
-- A wait's seconds: a number of seconds that is NaN or infinite is misuse.
-- Such a wait can never end by the clock, and every loop that waits for a
-- deadline (the scheduler's turn, a host's frame loop) would spin on it at
-- full CPU.

--- text | nil = timers.bad_seconds(seconds): nil when seconds is a finite
-- number (a negative one is no wait); else the value as an error shows it
-- (nan whatever its sign bit, inf, -inf, string "5", nil).
function timers.bad_seconds(seconds)
  if type(seconds) == "number" then
    if seconds ~= seconds then return "nan" end
    if seconds == huge or seconds == -huge then return tostring(seconds) end
    return nil
  end
  return shown(seconds)
end

return timers
