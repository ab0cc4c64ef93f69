-- The scheduler's tasks and its ready queue: a task is a coroutine, every
-- wait of a task is one yield (tasks.wait_here), and a task woken is put
-- on the ready queue, which tasks.run_ready works through.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local log = require "ratewise.log"
local state = require "ratewise.scheduler.state"
local timers = require "ratewise.scheduler.timers"

local S = state.record
local CANCELLED, moved = state.CANCELLED, state.moved
local push_timer, bad_seconds = timers.push, timers.bad_seconds
local now = core.now
local create, resume, yield, status = coroutine.create, coroutine.resume, coroutine.yield, coroutine.status
local running, unpack, pack = compat.coroutine_of_task, compat.unpack, compat.pack
local format, find = string.format, string.find
local type, tostring, setmetatable, select, error = type, tostring, setmetatable, select, error

local tasks = {}

local Task = {}
Task.__index = Task
tasks.Task = Task

--- tasks.make_ready(task [, value]): task goes on the ready queue, to be
-- resumed with value.
local function make_ready(task, value)
  task.state = "ready"
  local n = S.ready_n + 1
  S.ready_n = n
  S.ready[n] = task
  S.ready_value[n] = value
end
tasks.make_ready = make_ready

---------------------------------------------------------------------------
-- A task's wait

-- Every wait of a task is one yield; the scheduler resumes it with nil, or
-- with CANCELLED when it has been cancelled meanwhile. on_cancel(a, b, c, d,
-- resumed), if given, undoes what the wait held before the cancellation goes
-- on (it sits on the waiting coroutine's stack, in place of a pcall frame);
-- resumed: the wait's resuming hook (scheduler.park) had let the task go,
-- and what it took is the task's to give back.
-- A task resumed with WAIT_FAILED raises task.wait_error: what the wait's
-- resuming hook raised.
local WAIT_FAILED = setmetatable({}, { __tostring = function() return "ratewise: wait failed" end })

-- A wait from a function Lua calls from C cannot yield. Lua 5.2 on and
-- LuaJIT say so beforehand (coroutine.isyieldable); on PUC Lua 5.1 the
-- yield itself fails, and the task is found dead while still "waiting"
-- (after_resume), its wait's on_cancel kept in task.undo to be called then.
local isyieldable = rawget(coroutine, "isyieldable")
local CANNOT_YIELD = "ratewise: a task cannot wait inside a function that Lua calls from C (a table.sort "
  .. "comparator, a string.gsub callback, a for loop's iterator on Lua 5.1): Lua cannot yield out of it "
  .. "(\"attempt to yield across a C-call boundary\"). Make the requests (or sleeps) outside it: fetch what "
  .. "it needs first, then sort or substitute with the results"

--- tasks.leave_park(task): a wait whose hook is set (scheduler.park) ends:
-- the hook and its arguments are let go.
local function leave_park(task)
  task.resuming, task.park_a, task.park_b, task.park_c, task.park_d = nil, nil, nil, nil, nil
end
tasks.leave_park = leave_park

--- true = tasks.wait_here(task [, on_cancel, a, b, c, d]): task (the one
-- running) yields until it is woken (true), or raises CANCELLED once
-- on_cancel(a, b, c, d, resumed) has run. The caller has moved the task to
-- a new wait (task.wait_id) already.
function tasks.wait_here(task, on_cancel, a, b, c, d)
  if not task.cancel_requested then
    if isyieldable and not isyieldable() then
      if task.resuming then leave_park(task) end
      if on_cancel then on_cancel(a, b, c, d) end
      error(CANNOT_YIELD, 0)
    end
    task.state = "waiting"
    if not isyieldable then task.undo, task.undo_a, task.undo_b, task.undo_c, task.undo_d = on_cancel, a, b, c, d end
    local value = yield(task)
    if value == WAIT_FAILED then
      local err = task.wait_error
      task.wait_error = nil
      error(err, 0)
    end
    -- (a parked wait's hook is let go by scheduler.park, its only setter)
    if value ~= CANCELLED and not task.cancel_requested then return true end
  end
  local resumed = task.resuming == false
  if task.resuming ~= nil then leave_park(task) end
  if on_cancel then on_cancel(a, b, c, d, resumed) end
  error(CANCELLED, 0)
end
local wait_here = tasks.wait_here

--- tasks.wake(task, id): wakes a task if it is still in the wait numbered
-- id (a task that was cancelled out of a wait has moved on, and must not
-- be woken for it).
function tasks.wake(task, id)
  if task.state ~= "waiting" or task.wait_id ~= id then return end
  local resuming = task.resuming
  if resuming then
    -- A parked wait's hook (scheduler.park), here rather than on the
    -- task's stack: the task waits on for what it answers, and is resumed
    -- only once it answers nothing.
    local ok, wait = pcall(resuming, task.park_a, task.park_b, task.park_c, task.park_d)
    if ok and wait then
      push_timer(now() + wait, task, id)
      return
    end
    if not ok then
      leave_park(task)
      task.wait_error = wait
      make_ready(task, WAIT_FAILED)
      return
    end
    -- resuming = false: a cancellation before the task runs tells its
    -- on_cancel that the hook let it go
    task.resuming, task.park_a, task.park_b, task.park_c, task.park_d = false, nil, nil, nil, nil
  end
  make_ready(task)
end
local wake = tasks.wake

---------------------------------------------------------------------------
-- A task's life

local function finish(task, ok, ...)
  S.live = S.live - 1
  local group = task.group
  if group then
    group.live = group.live - 1
    group.members[task] = nil
  end
  task.state = "done"
  moved()
  if ok then
    task.results = pack(...)
  else
    local failed = ...
    task.failed = failed
    if not task.joiners and not task.awaited and failed ~= CANCELLED then
      if group then
        group.unjoined[#group.unjoined + 1] = task
      else
        log.write("ratewise: a task failed and nobody joined it: " .. tostring(failed), "error")
      end
    end
  end
  local joiners = task.joiners
  if joiners then
    for i = 1, #joiners, 2 do wake(joiners[i], joiners[i + 1]) end
  end
  task.joiners = nil
  if group and group.live == 0 and group.waiter then
    wake(group.waiter, group.waiter_id)
  end
end

-- What a resume of a task's coroutine came back with. The task's function
-- is the coroutine's body itself, with no pcall frame around it, which keeps
-- a waiting task small; a dead coroutine keeps its stack, so the traceback
-- of an error is still there to read.
local function after_resume(task, resumed, ...)
  if resumed and task.state == "waiting" then
    -- waiting (wait_here yielded itself): alive, and nothing more to do
    if ... == task then return end
    task.state = "running" -- a wait whose yield failed on Lua 5.1, its error caught by the task
  end
  if status(task.co) == "dead" then
    if resumed then return finish(task, true, ...) end
    local err = ...
    if task.state == "waiting" then -- its wait's yield failed (Lua 5.1)
      if task.undo then task.undo(task.undo_a, task.undo_b, task.undo_c, task.undo_d) end
      if type(err) == "string" and find(err, "attempt to yield across", 1, true) then err = CANNOT_YIELD end
    end
    if err ~= CANCELLED then err = debug.traceback(task.co, tostring(err)) end
    return finish(task, false, err)
  end
  if task.state == "running" then
    -- The task's own code yielded past ratewise: the plain-coroutine
    -- protocol ("ratewise.sleep", seconds) is honoured, any other yield
    -- just lets the other tasks run.
    local what, seconds = ...
    if what == "ratewise.sleep" then
      local bad = bad_seconds(seconds)
      if bad then
        -- The yield cannot be made to raise, so the task ends here, with
        -- the stack of the yield in its error.
        local err = debug.traceback(task.co, format("ratewise.sleep: a task yielded (\"ratewise.sleep\", %s): "
          .. "the plain-coroutine protocol needs a finite number of seconds", bad))
        if compat.close_coroutine then compat.close_coroutine(task.co) end -- its to-be-closed variables (5.4)
        return finish(task, false, err)
      end
      task.wait_id = task.wait_id + 1
      push_timer(now() + seconds, task, task.wait_id)
      task.state = "waiting"
    else
      make_ready(task)
    end
  end
end

-- A task's first run (run_ready makes the others): its coroutine is made,
-- and gets the arguments.
local function first_step(task)
  local fn, args = task.fn, task.args
  task.fn, task.args = false, nil
  if task.cancel_requested then -- cancelled before it ever ran
    return finish(task, false, CANCELLED)
  end
  task.state = "running"
  local previous = S.current
  S.current = task
  -- Made where it first runs, not where it was spawned: in OpenResty a
  -- coroutine belongs to the request (or timer) that made it, and one
  -- resumed from another crashes the worker; there the driver's light
  -- thread runs every task (hosts/driven.lua), which then makes them all.
  task.co = create(fn)
  if args then
    after_resume(task, resume(task.co, unpack(args, 1, args.n)))
  else
    after_resume(task, resume(task.co))
  end
  S.current = previous
end

-- What caused a task spawned now, for its lines (a retry's): the host's
-- label of the code spawning it (S.origin_of_spawn, OpenResty's client
-- request), or else that of the task spawning it.
local function origin_here()
  local origin = S.origin_of_spawn
  if origin then origin = origin() end
  if origin == nil then
    local current = S.current
    if current then origin = current.origin end
  end
  return origin
end

-- Code outside any task made a task ready (spawned it, cancelled its wait,
-- released a permit or set an event it waits for): a host whose own loop
-- steps the tasks arms that loop (tasks.add_spawn_watch), where nothing of
-- ratewise's would run the task before the next wait.
local function ready_outside()
  if S.current then return end
  local watches = S.spawn_watches
  for i = 1, S.spawn_watches_n do watches[i]() end
end
tasks.ready_outside = ready_outside

--- task = tasks.spawn_in(group, origin, fn, ...): a task of group (or of
-- none), whose lines name origin (tasks.origin).
local function spawn_in(group, origin, fn, ...)
  -- (cancel_requested false, not absent: every wait reads it, and a field
  -- a task lacks is looked for in Task too; origin nil or not, a field the
  -- table is made with)
  local task = setmetatable({ co = false, fn = fn, state = "ready", wait_id = 0,
    group = group, cancel_requested = false, origin = origin }, Task)
  if select("#", ...) > 0 then task.args = pack(...) end
  if group then
    group.members[task] = true
    group.live = group.live + 1
  end
  S.live = S.live + 1
  make_ready(task)
  ready_outside()
  return task
end
tasks.spawn_in = spawn_in

--- tasks.add_spawn_watch(fn): fn() is called whenever code outside any
-- task spawns one, or makes one ready (cancels it, releases a permit or
-- sets an event it waits for): a host whose own loop steps the tasks
-- (WeeChat, mpv, Prosody, Tarantool) arms that loop then, where nothing of
-- ratewise's would run the task before the next wait.
function tasks.add_spawn_watch(fn)
  S.spawn_watches_n = S.spawn_watches_n + 1
  S.spawn_watches[S.spawn_watches_n] = fn
end

--- task = tasks.spawn(fn, ...): a task of the group of the task spawning it.
function tasks.spawn(fn, ...)
  if type(fn) ~= "function" then
    error(format("spawn: expected a function (got %s)", type(fn)), 2)
  end
  local current = S.current
  return spawn_in(current and current.group, origin_here(), fn, ...)
end

--- label = tasks.origin_here(): the origin a task spawned now gets.
tasks.origin_here = origin_here

--- The task whose coroutine is running now, or nil (main thread, or a plain
-- coroutine, even one started from inside a task).
function tasks.current()
  local task = S.current
  if task and task.co == running() then return task end
  return nil
end
local current = tasks.current

--- label = tasks.origin(): what caused the task being run now (the code
-- running now, or a plain coroutine it resumed), as its host labelled it at
-- spawn ("request <id>" in OpenResty), or nil.
function tasks.origin()
  local task = S.current
  return task and task.origin
end

--- tasks.set_origin_of_spawn(fn | nil): fn() labels what a task spawned
-- now comes from (nil: nothing to say, its parent's label is kept).
function tasks.set_origin_of_spawn(fn)
  S.origin_of_spawn = fn
end

--- Whether a task is being run, by the code running now or by a coroutine
-- that code resumed (a plain coroutine started from inside a task).
function tasks.in_task()
  return S.current ~= nil
end

---------------------------------------------------------------------------
-- The ready queue

--- tasks.run_ready(until_t): resumes the tasks that are ready now; tasks
-- made ready meanwhile wait for the next pass, so one busy task cannot
-- starve a poll. A step's budget spent, the pass stops: the tasks it did
-- not reach go first next time, before those made ready meanwhile.
-- until_t: the step's work_until, or nil.
function tasks.run_ready(until_t)
  local list, values, n, i = S.ready, S.ready_value, S.ready_n, S.ready_head
  -- Nothing to do; or a pass is under way (its spare is in use as `ready`).
  if n == 0 or list == S.spare then return end
  S.ready, S.ready_value, S.ready_n, S.ready_head = S.spare, S.spare_value, 0, 1
  while i <= n do
    local task, value = list[i], values[i]
    list[i], values[i] = nil, nil
    if task.state == "ready" then
      if task.fn then
        first_step(task)
      else
        -- every later run
        task.state = "running"
        local previous = S.current
        S.current = task
        after_resume(task, resume(task.co, value))
        S.current = previous
      end
    end
    i = i + 1
    if until_t and i <= n and now() >= until_t then break end
  end
  if i <= n then
    -- The budget is spent. The rest stay in place for the next pass, and
    -- those made ready meanwhile go after them: moving the rest to the
    -- front at every pass made each budgeted step cost in proportion to
    -- the tasks not yet run (a frame loop starting 1,000 tasks runs a few
    -- a step). They move only once more have run than are left, so that
    -- each task is moved about once.
    local head, k = i, n
    if i - 1 > n - i then
      k = 0
      for j = i, n do
        k = k + 1
        list[k], values[k], list[j], values[j] = list[j], values[j], nil, nil
      end
      head = 1
    end
    local made, made_values = S.ready, S.ready_value
    for j = 1, S.ready_n do
      k = k + 1
      list[k], values[k], made[j], made_values[j] = made[j], made_values[j], nil, nil
    end
    S.ready, S.ready_value, S.ready_n, S.ready_head = list, values, k, head
    S.spare, S.spare_value = made, made_values
    return
  end
  S.spare, S.spare_value = list, values
end

---------------------------------------------------------------------------
-- Task methods

local function task_outcome(task)
  task.joined = true
  if task.failed ~= nil then
    return nil, task.failed == CANCELLED and "cancelled" or task.failed
  end
  return unpack(task.results, 1, task.results.n)
end

-- A task that no longer waits to join `task` (its join timed out, or it
-- was cancelled) leaves its list of joiners: a failure nobody will see is
-- still told (finish).
local function leave_joiners(task, me)
  local joiners = task.joiners
  if not joiners then return end
  for i = #joiners - 1, 1, -2 do
    if joiners[i] == me then
      table.remove(joiners, i + 1)
      table.remove(joiners, i)
    end
  end
  if joiners[1] == nil then task.joiners = nil end
end

--- results... | nil, err = task:join([timeout]): the task's results once
-- it has finished; with timeout (seconds), nil, "timeout" when it has not
-- finished by then. A join that times out leaves the task running.
function Task:join(timeout)
  if timeout ~= nil then
    local bad = bad_seconds(timeout)
    if bad then error(format("join: timeout must be a finite number of seconds (got %s)", bad), 2) end
  end
  if self.state ~= "done" then
    local me = current()
    if me == self then error("join: a task cannot join itself", 2) end
    if me then
      local joiners = self.joiners or {}
      self.joiners = joiners
      local id = me.wait_id + 1
      me.wait_id = id
      joiners[#joiners + 1] = me
      joiners[#joiners + 1] = id
      if timeout then push_timer(now() + timeout, me, id) end
      wait_here(me, leave_joiners, self, me)
      -- (woken by its timer, not by the task's end)
      if self.state ~= "done" then
        leave_joiners(self, me)
        return nil, "timeout"
      end
    else
      -- joined from outside a task: its failure is not lost
      local awaited = self.awaited
      self.awaited = true
      S.outside_wait(function() return self.state == "done" end, timeout and now() + timeout)
      if self.state ~= "done" then
        self.awaited = awaited
        return nil, "timeout"
      end
    end
  end
  return task_outcome(self)
end

--- task:cancel(): ends a task that is waiting (a sleep, a bucket, a
-- transfer, a join). A task that has not started yet never runs; a running
-- task is cancelled at its next wait.
function Task:cancel()
  if self.state == "done" then return end
  self.cancel_requested = true
  if self.state == "waiting" then
    if self.transfer then self.transfer:cancel() end
    make_ready(self, CANCELLED)
    ready_outside()
  end
end

function Task:status()
  return self.state
end

Task.__tostring = function(task)
  return "ratewise.Task (" .. task.state .. ")"
end

return tasks
