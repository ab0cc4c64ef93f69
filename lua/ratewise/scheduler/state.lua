-- The scheduler's state: one record for this Lua state's scheduler, which
-- every part of it (lua/ratewise/scheduler/*.lua) reads and writes and a
-- spec can look into (scheduler.state()). The parts keep no state of
-- their own.
local core = require "ratewise.core"

local setmetatable = setmetatable

local state = {}

local record = {
  -- engine: the libcurl multi handle, made on first use (state.engine)
  -- current: the task running now, or nil
  -- origin_of_spawn: the host's labeller of a task's origin (tasks.spawn)
  live = 0, -- tasks not finished

  -- The ready queue: the tasks to resume, in order, and what to resume
  -- each with, from ready_head on (a pass that ran out of budget leaves
  -- the rest where they are). A pass (tasks.run_ready) swaps in the spare
  -- pair and works through the old one, so the arrays are reused and never
  -- grow past about two passes' worth (a queue whose indices only ever
  -- went up would turn into a growing hash under steady load).
  ready = {}, ready_value = {}, ready_n = 0, ready_head = 1,
  spare = {}, spare_value = {},

  -- The timers: a binary min-heap of (monotonic time, task, wait number)
  -- in three arrays, swept of stale timers once it reaches sweep_at
  -- (scheduler/timers.lua).
  heap_at = {}, heap_task = {}, heap_id = {}, heap_n = 0, sweep_at = 64,

  -- Whom the poll wakes for what it reports. One owner per transfer: who
  -- waits for a transfer (its end, or a stream's news) is the transfer's
  -- owner, kept by the engine with it and named by the poll beside it, and
  -- set by the scheduler's waits alone (scheduler/waits.lua). A watched
  -- descriptor, which has no owner, finds its task in fd_waiter.
  fd_waiter = {}, -- descriptor -> task (scheduler.await_fd)
  -- The descriptors scheduler.await_fd waits for: false until the engine
  -- finds one ready, true then. A descriptor the poll reports is one of
  -- them (a transfer never is): telling the two apart needs no type().
  fd_ready = {},
  -- What the engine's poll fills, so that a poll leaves no garbage: the
  -- transfers that ended (or streamed news, or a descriptor ready), and
  -- for each its owner, or false.
  finished = {}, owners = {},
  -- work_until: a step with a budget's monotonic time its work is to end
  -- by, from when the work began; nil otherwise.

  -- What code outside the tasks watches (scheduler.progress, add_kick).
  progress = 0,
  kicks = {}, kicks_n = 0,
  -- fn() of each host whose loop steps the tasks, called when code outside
  -- any task spawns one (tasks.add_spawn_watch).
  spawn_watches = {}, spawn_watches_n = 0,
  -- outside_wait(done, deadline): how code outside any task waits (a
  -- join, a semaphore, a group): the main thread's drive until the seam
  -- (runtime.lua) sets its own.
  -- pollable_nap, pollable_seen: the pollable's nap and the progress it
  -- last saw (scheduler/pollable.lua).
}
state.record = record

--- state.engine([opts]): the engine, made on first use; opts (the
-- connection limits of core.engine) go to a new engine, or to engine:configure.
function state.engine(opts)
  local engine = record.engine
  if not engine then
    engine = assert(core.engine(opts))
    record.engine = engine
  elseif opts then
    engine:configure(opts)
  end
  return engine
end

-- The error a waiting task sees when it is cancelled. A table, so that it
-- can never be mistaken for an error the task's own code raised.
state.CANCELLED = setmetatable({}, { __tostring = function() return "cancelled" end })

--- state.moved(): something happened that code outside the tasks may be
-- waiting for (a task finished, a permit released, an event set).
function state.moved()
  record.progress = record.progress + 1
  local kicks = record.kicks
  for i = 1, record.kicks_n do kicks[i]() end
end

return state
