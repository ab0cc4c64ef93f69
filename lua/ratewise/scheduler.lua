-- ratewise's scheduler: tasks are coroutines, every wait is a yield, and the
-- thread only ever blocks in the engine's poll, which wakes for libcurl's
-- sockets or the next timer, whichever comes first.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local log = require "ratewise.log"
local misuse = require "ratewise.errors" -- (map has errors of its own)

local now = core.now
local engine_poll = core.engine_methods.poll
local transfer_done = core.transfer_methods.done
local create, resume, yield, status = coroutine.create, coroutine.resume, coroutine.yield, coroutine.status
local running, unpack, pack = compat.coroutine_of_task, compat.unpack, compat.pack
local format, find, huge, min, max = string.format, string.find, math.huge, math.min, math.max
local type, tostring, setmetatable = type, tostring, setmetatable
local shown, bad_option = misuse.shown, misuse.bad_option

local scheduler = {}

---------------------------------------------------------------------------
-- State of this Lua state's scheduler

local engine                                    -- the libcurl multi handle, made on first use
-- The tasks to resume, in order, and what to resume each with, from
-- ready_head on (a pass that ran out of budget leaves the rest where they
-- are). run_ready swaps in the spare pair and works through the old one, so
-- the arrays are reused and never grow past about two passes' worth (a
-- queue whose indices only ever went up would turn into a growing hash
-- under steady load).
local ready, ready_value, ready_n, ready_head = {}, {}, 0, 1
local spare, spare_value = {}, {}
local heap_at, heap_task, heap_id, heap_n = {}, {}, {}, 0  -- timers: a binary min-heap
-- Whom the poll wakes for what it reports. One owner per transfer: who
-- waits for a transfer (its end, or a stream's news) is the transfer's
-- owner, kept by the engine with it and named by the poll beside it; set
-- here only (run_transfer's engine:start, await_transfer and scheduler.own:
-- transfer:set_owner), and let go when the wait ends (the poll that
-- reports a stream's news forgets its owner, a finished transfer is
-- reported once, and a wait cut short closes its transfer), so that no
-- task is ever woken by a transfer it no longer waits for. A watched
-- descriptor, which has no owner, finds its task here; runtime and the
-- hosts ask the scheduler (scheduler.own, run_transfer, await_transfer,
-- await_fd) and keep no record of their own.
local fd_waiter = {}                            -- descriptor -> task (scheduler.await_fd)
local live = 0                                  -- tasks not finished
local kicks, kicks_n = {}, 0                    -- see scheduler.add_kick
local progress = 0                              -- see scheduler.progress
local current                                   -- the task running now, or nil

--- scheduler.engine([opts]): the engine, made on first use; opts (the
-- connection limits of core.engine) go to a new engine, or to engine:configure.
function scheduler.engine(opts)
  if not engine then
    engine = assert(core.engine(opts))
  elseif opts then
    engine:configure(opts)
  end
  return engine
end

-- The error a waiting task sees when it is cancelled. A table, so that it
-- can never be mistaken for an error the task's own code raised.
local CANCELLED = setmetatable({}, { __tostring = function() return "cancelled" end })
scheduler.CANCELLED = CANCELLED

---------------------------------------------------------------------------
-- Timers

-- A timer is stale once its task has left that wait (a semaphore's permit
-- came first, a cancellation): wake() ignores it. Stale timers are dropped
-- from the top as they surface and, all at once, whenever the heap has
-- doubled since it was last swept, so that waits that end early (a client's
-- queue with a timeout of minutes) cannot pile timers up.
local function stale(task, id)
  return task.state ~= "waiting" or task.wait_id ~= id
end
local sweep_at = 64

local heap_push

local function heap_sweep()
  local at, task, id, n = heap_at, heap_task, heap_id, heap_n
  heap_at, heap_task, heap_id, heap_n = {}, {}, {}, 0
  sweep_at = huge
  for i = 1, n do
    if not stale(task[i], id[i]) then heap_push(at[i], task[i], id[i]) end
  end
  sweep_at = max(64, 2 * heap_n)
end

-- The caller has moved its task to the wait numbered id already, and the
-- sweep (which runs first) drops only timers of waits that are over.
function heap_push(at, task, id)
  if heap_n + 1 >= sweep_at then heap_sweep() end
  heap_n = heap_n + 1
  local i = heap_n
  while i > 1 do
    local parent = math.floor(i / 2)
    if heap_at[parent] <= at then break end
    heap_at[i], heap_task[i], heap_id[i] = heap_at[parent], heap_task[parent], heap_id[parent]
    i = parent
  end
  heap_at[i], heap_task[i], heap_id[i] = at, task, id
end

local function heap_pop()
  local at, task, id = heap_at[1], heap_task[1], heap_id[1]
  local last_at, last_task, last_id = heap_at[heap_n], heap_task[heap_n], heap_id[heap_n]
  heap_at[heap_n], heap_task[heap_n], heap_id[heap_n] = nil, nil, nil
  heap_n = heap_n - 1
  if heap_n > 0 then
    local i = 1
    while true do
      local child = 2 * i
      if child > heap_n then break end
      if child < heap_n and heap_at[child + 1] < heap_at[child] then child = child + 1 end
      if heap_at[child] >= last_at then break end
      heap_at[i], heap_task[i], heap_id[i] = heap_at[child], heap_task[child], heap_id[child]
      i = child
    end
    heap_at[i], heap_task[i], heap_id[i] = last_at, last_task, last_id
  end
  return at, task, id
end

---------------------------------------------------------------------------
-- Tasks

local Task = {}
Task.__index = Task

---------------------------------------------------------------------------
-- Waits: a number of seconds that is NaN or infinite is misuse. Such a wait
-- can never end by the clock, and every loop that waits for a deadline
-- (the scheduler's turn, a host's frame loop) would spin on it at full CPU.

--- text | nil = scheduler.bad_seconds(seconds): nil when seconds is a
-- finite number (a negative one is no wait); else the value as an error
-- shows it (nan whatever its sign bit, inf, -inf, string "5", nil).
function scheduler.bad_seconds(seconds)
  local t = type(seconds)
  if t == "number" then
    if seconds ~= seconds then return "nan" end
    if seconds == huge or seconds == -huge then return tostring(seconds) end
    return nil
  end
  return shown(seconds)
end
local bad_seconds = scheduler.bad_seconds

local function make_ready(task, value)
  task.state = "ready"
  ready_n = ready_n + 1
  ready[ready_n] = task
  ready_value[ready_n] = value
end

-- Every wait of a task is one yield; the scheduler resumes it with nil, or
-- with CANCELLED when it has been cancelled meanwhile. on_cancel(a, b, c, d,
-- resumed), if given, undoes what the wait held before the cancellation goes
-- on (it sits on the waiting coroutine's stack, which costs less than a
-- pcall frame); resumed: the wait's resuming hook (scheduler.park) had let
-- the task go, and what it took is the task's to give back.
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

-- A wait whose hook is set (scheduler.park) ends: the hook and its
-- arguments are let go.
local function leave_park(task)
  task.resuming, task.park_a, task.park_b, task.park_c, task.park_d = nil, nil, nil, nil, nil
end

local function wait_here(task, on_cancel, a, b, c, d)
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

-- Wakes a task if it is still in the wait numbered id (a task that was
-- cancelled out of a wait has moved on, and must not be woken for it).
local function wake(task, id)
  if task.state ~= "waiting" or task.wait_id ~= id then return end
  local resuming = task.resuming
  if resuming then
    -- A parked wait's hook (scheduler.park), here rather than on the
    -- task's stack: the task waits on for what it answers, and is resumed
    -- only once it answers nothing.
    local ok, wait = pcall(resuming, task.park_a, task.park_b, task.park_c, task.park_d)
    if ok and wait then
      heap_push(now() + wait, task, id)
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

local function finish(task, ok, ...)
  live = live - 1
  local group = task.group
  if group then
    group.live = group.live - 1
    group.members[task] = nil
  end
  task.state = "done"
  progress = progress + 1
  for i = 1, kicks_n do kicks[i]() end
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
      heap_push(now() + seconds, task, task.wait_id)
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
  local previous = current
  current = task
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
  current = previous
end

--- task = scheduler.spawn(fn, ...)
function scheduler.spawn(fn, ...)
  if type(fn) ~= "function" then
    error(format("spawn: expected a function (got %s)", type(fn)), 2)
  end
  local group = current and current.group
  -- (cancel_requested false, not absent: every wait reads it, and a field
  -- a task lacks is looked for in Task too)
  local task = setmetatable({ co = false, fn = fn, state = "ready", wait_id = 0,
    group = group, cancel_requested = false }, Task)
  if select("#", ...) > 0 then task.args = pack(...) end
  if group then
    group.members[task] = true
    group.live = group.live + 1
  end
  live = live + 1
  make_ready(task)
  return task
end

--- The task whose coroutine is running now, or nil (main thread, or a plain
-- coroutine, even one started from inside a task).
function scheduler.current()
  local task = current
  if task and task.co == running() then return task end
  return nil
end

--- Whether a task is being run, by the code running now or by a coroutine
-- that code resumed (a plain coroutine started from inside a task).
function scheduler.in_task()
  return current ~= nil
end

---------------------------------------------------------------------------
-- Turning the wheel

local function fire_timers()
  if heap_n == 0 then return end -- most turns: no clock read
  local t = now()
  while heap_n > 0 and (heap_at[1] <= t or stale(heap_task[1], heap_id[1])) do
    local _, task, id = heap_pop()
    wake(task, id)
  end
end

-- The engine's poll fills these tables, so that a poll leaves no garbage:
-- the transfers that ended (or streamed news, or a descriptor ready), and
-- for each, its owner (engine:start's, or transfer:set_owner's), or false.
local finished, owners = {}, {}
-- The descriptors scheduler.await_fd waits for: false until the engine
-- finds one ready, true then. A descriptor the poll reports is one of them
-- (a transfer never is): telling the two apart needs no call of type().
local fd_ready = {}

-- A step with a budget (scheduler.step): the monotonic time its work is
-- to end by, from when the work began; nil otherwise.
local work_until

-- Resumes the tasks that are ready now; tasks made ready meanwhile wait for
-- the next pass, so one busy task cannot starve a poll. A step's budget
-- spent, the pass stops: the tasks it did not reach go first next time,
-- before those made ready meanwhile. until_t: the step's work_until, or nil.
local function run_ready(until_t)
  local tasks, values, n, i = ready, ready_value, ready_n, ready_head
  -- Nothing to do; or a pass is under way (its spare is in use as `ready`).
  if n == 0 or tasks == spare then return end
  ready, ready_value, ready_n, ready_head = spare, spare_value, 0, 1
  while i <= n do
    local task, value = tasks[i], values[i]
    tasks[i], values[i] = nil, nil
    if task.state == "ready" then
      if task.fn then
        first_step(task)
      else
        -- every later run
        task.state = "running"
        local previous = current
        current = task
        after_resume(task, resume(task.co, value))
        current = previous
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
        tasks[k], values[k], tasks[j], values[j] = tasks[j], values[j], nil, nil
      end
      head = 1
    end
    local made, made_values = ready, ready_value
    for j = 1, ready_n do
      k = k + 1
      tasks[k], values[k], made[j], made_values[j] = made[j], made_values[j], nil, nil
    end
    ready, ready_value, ready_n, ready_head = tasks, values, k, head
    spare, spare_value = made, made_values
    return
  end
  spare, spare_value = tasks, values
end

--- n = scheduler.live(): the tasks that have not finished.
function scheduler.live()
  return live
end

local function transfers_running()
  return engine ~= nil and engine:running() > 0
end
scheduler.transfers_running = transfers_running

-- Anything at all that could make progress: a ready task, a timer, or a
-- transfer in flight.
local function has_work()
  fire_timers() -- drops stale timers from the top: they are no work
  return ready_n > 0 or heap_n > 0 or transfers_running()
end

-- One turn of the wheel. With tasks ready, runs them and lets libcurl work
-- without waiting; otherwise blocks at most max_wait (less if a timer is
-- due sooner) until a socket is ready or the time is up. Running tasks and
-- blocking are never in the same turn, so that the caller can look at what
-- the tasks did before waiting again.
-- The poll: libcurl works, waiting at most max_wait seconds for a socket
-- or one of its timers, and the tasks whose transfers finished are woken.
-- With a step's budget, libcurl acts on sockets for no longer than what is
-- left of it (all of it, counted from the end of the wait, when the step's
-- work has not begun).
local function turn(max_wait, budget, in_flight)
  if heap_n > 0 then fire_timers() end
  if ready_n > 0 then
    if budget and not work_until then work_until = now() + budget end
    run_ready(budget and work_until)
    if not transfers_running() then
      if heap_n > 0 then fire_timers() end
      return
    end
    max_wait = 0
  else
    if heap_n > 0 then max_wait = min(max_wait, max(0, heap_at[1] - now())) end
    -- nothing could happen (in_flight: the caller knows a transfer is)
    if max_wait == huge and not in_flight and not transfers_running() then return end
  end
  local left = budget and (work_until and max(work_until - now(), 1e-6) or budget) or nil
  local _, n = engine_poll(engine or scheduler.engine(), max_wait, finished, left, owners)
  if budget and not work_until then work_until = now() + budget end
  if n > 0 then progress = progress + 1 end
  for i = 1, n do
    local transfer, owner = finished[i], owners[i]
    finished[i], owners[i] = nil, nil
    if owner then
      -- The task waiting for the transfer's end (runtime.transfer) or a
      -- stream's news (await_transfer), or a host's waiter with a wake
      -- function (hosts/driven.lua).
      if owner.state == "waiting" then
        make_ready(owner)
      else
        local wake_waiter = owner.wake
        if wake_waiter then wake_waiter(owner) end
      end
    elseif fd_ready[transfer] == false then
      -- a descriptor of engine:watch that scheduler.await_fd waits for; a
      -- transfer without an owner is one no task waits for
      fd_ready[transfer] = true
      local task = fd_waiter[transfer]
      if task then
        fd_waiter[transfer] = nil
        if task.state == "waiting" then make_ready(task) end
      end
    end
  end
  if heap_n > 0 then fire_timers() end
end

-- With no task left, nothing here needs a connection: the engine may close
-- those a burst of transfers left open (it keeps its idle few).
local function trim()
  if engine and live == 0 then engine:trim() end
end

-- The work rw.step(0) does at most, so that a frame loop's frame stays
-- short whatever moves at once (a burst of responses arriving together
-- takes several frames' worth of work to turn into results).
local STEP_BUDGET = 0.0005

--- live = scheduler.step([timeout [, budget]]): runs the tasks for at
-- most timeout seconds (0: what is ready now). math.huge runs them until
-- none is left, or until none could ever make progress (each waits for
-- another, or for the caller), when it returns at once instead of
-- spinning. With a budget (seconds; by default STEP_BUDGET for a timeout
-- of 0, none otherwise; false: none), the work of the call (resuming
-- tasks, letting libcurl act on sockets) stops once about that much time
-- is spent, waiting aside; what is left is done by the next call, and
-- scheduler.timeout() says 0 meanwhile.
function scheduler.step(timeout, budget)
  timeout = timeout or 0
  if type(timeout) ~= "number" or timeout ~= timeout or timeout < 0 then
    error(format("step: timeout must be a non-negative number of seconds (got %s)", shown(timeout)), 2)
  end
  if budget == nil then
    budget = timeout == 0 and STEP_BUDGET or nil
  elseif budget == false then
    budget = nil
  elseif type(budget) ~= "number" or budget ~= budget or budget <= 0 or budget == huge then
    error(format("step: budget must be a positive number of seconds or false (got %s)", shown(budget)), 2)
  end
  if scheduler.current() then error("step: called from inside a task; a task waits with rw.sleep instead", 2) end
  local deadline = now() + timeout
  work_until = nil
  repeat
    -- With a finite timeout, turn blocks in the poll; with none, a turn
    -- that has nothing to wait for would return at once, again and again.
    if deadline == huge and not has_work() then break end
    turn(max(0, deadline - now()), budget)
  until live == 0 or now() >= deadline or (work_until and now() >= work_until)
  -- What the last turn's I/O and timers made ready runs now, not a frame
  -- later, unless the budget is spent.
  if ready_n > 0 and not (work_until and now() >= work_until) then turn(0, budget) end
  work_until = nil
  trim()
  return live
end

scheduler.has_work = has_work

--- seconds | nil = scheduler.timeout(): how long the scheduler may be left
-- alone if the engine's descriptor stays quiet: 0 with a task ready, else
-- until its next timer or the engine's own deadline; nil when nothing at
-- all is due (only a socket, or another party, could change anything).
function scheduler.timeout()
  if ready_n > 0 then return 0 end
  fire_timers() -- due timers make tasks ready; stale ones go
  if ready_n > 0 then return 0 end
  local left = heap_n > 0 and max(0, heap_at[1] - now()) or nil
  local engine_left = engine and engine:timeout()
  if engine_left and (not left or engine_left < left) then left = engine_left end
  return left
end

---------------------------------------------------------------------------
-- Driving the engine from outside any task: one loop, one nap policy

-- A host that cannot see the engine's descriptor (a sleep, a frame, a
-- poll(2) build, whose engine has none) looks again after NAP_FIRST while
-- anything is in flight, and less often, doubling up to NAP_MAX, while
-- nothing moves: a server that takes seconds to answer costs next to no
-- CPU, one that answers at once is seen within a millisecond.
local NAP_FIRST, NAP_MAX = 0.001, 0.016
scheduler.NAP_FIRST, scheduler.NAP_MAX = NAP_FIRST, NAP_MAX

local function next_nap(nap, moved)
  if moved then return NAP_FIRST end
  nap = nap * 2
  if nap > NAP_MAX then return NAP_MAX end
  return nap
end

-- Whether the engine has a descriptor to wait on (an epoll build's).
local function engine_has_fd()
  return scheduler.engine():pollfd() ~= nil
end

-- seconds | nil: how long a host may leave the scheduler alone. Its
-- timeout (the next timer, libcurl's deadline), capped by the nap while
-- anything is in flight, unless the host wakes for the descriptor: libcurl's
-- deadline is when a transfer times out, not when its answer comes.
local function wait_for(nap, sees_fd)
  local t = scheduler.timeout()
  if (not sees_fd or not engine_has_fd()) and (not t or t > nap) and transfers_running() then t = nap end
  return t
end

local DEADLOCK = "ratewise: deadlock: the remaining tasks all wait for each other"

local function step_all()
  scheduler.step(0, false)
end

--- came = scheduler.drive(way, done, arg, deadline): drives the scheduler
-- from outside any task until done(arg) is true (true), or until the
-- deadline (monotonic seconds) passes (false). The one loop of every host
-- that waits outside a task; way says how the waiting code waits:
--   turns    block is a turn of the scheduler itself, blocking in the
--            engine's poll (the main thread): no step, no nap; with no
--            deadline, a wait that nothing could end raises (a deadlock)
--   busy     (with turns) the caller knows a transfer is in flight
--   block(seconds | nil, arg)  waits at most that long (nil: until the
--            descriptor is readable, or a kick)
--   sees_fd  block wakes when the engine's descriptor is readable
--   idle     seconds to wait when nothing is due (nil: block(nil))
--   step(arg)  (optional) one look, instead of scheduler.step(0, false);
--            true when something new may be due soon (a kick)
function scheduler.drive(way, done, arg, deadline)
  if way.turns then
    local busy = way.busy
    while not done(arg) do
      local left = deadline and deadline - now()
      if left then
        if left <= 0 then return false end
      elseif not busy and not has_work() then
        error(DEADLOCK, 0)
      end
      turn(left or huge, nil, busy)
    end
    return true
  end
  local step, block, sees_fd, idle = way.step or step_all, way.block, way.sees_fd, way.idle
  local nap, seen = NAP_FIRST, progress
  while true do
    local fresh = step(arg)
    if done(arg) then return true end
    local left = deadline and deadline - now()
    if left and left <= 0 then return false end
    nap = next_nap(nap, fresh or progress ~= seen)
    seen = progress
    local t = wait_for(nap, sees_fd)
    if not t then t = idle end
    if left and (not t or left < t) then t = left end
    block(t, arg)
  end
end

-- The main thread's way: it blocks in the engine's poll.
local MAIN = { turns = true }
local MAIN_BUSY = { turns = true, busy = true }
local function call(fn) return fn() end
local function never() return false end

local function drive_until(done, deadline)
  return scheduler.drive(MAIN, call, done, deadline)
end
scheduler.drive_until = drive_until

-- The pollable's own nap: how often a host that only counts time is told
-- to look while anything is in flight (see wait_for).
local pollable_nap, pollable_seen = NAP_FIRST, progress

--- The scheduler as a pollable (the shape cqueues.poll takes, and
-- luasocket's select): a host waits until its descriptor is readable or its
-- timeout passes, then calls rw.step(0). The timeout is what a host that
-- cannot see the descriptor needs: a nap while anything is in flight.
scheduler.pollable = {
  pollfd = function() return scheduler.engine():pollfd() end,
  getfd = function() return scheduler.engine():pollfd() end,
  dirty = function() return false end,
  events = function() return "r" end,
  timeout = function()
    pollable_nap = next_nap(pollable_nap, progress ~= pollable_seen)
    pollable_seen = progress
    return wait_for(pollable_nap, false)
  end,
}

--- The engine's descriptor alone, without a timeout, for a host's driver
-- that waits on it and gives its own seconds (cqueues.poll).
scheduler.descriptor = {
  pollfd = scheduler.pollable.pollfd,
  getfd = scheduler.pollable.getfd,
  dirty = scheduler.pollable.dirty,
  events = scheduler.pollable.events,
  timeout = function() return nil end,
}

-- How code outside any task waits for done() (a join, a semaphore, a
-- group): the waiting seam (runtime.lua) sets it for the host at hand;
-- until then, the main thread's way.
local outside_wait = drive_until

--- scheduler.set_outside_wait(fn): fn(done, deadline) -> done() came true.
function scheduler.set_outside_wait(fn)
  outside_wait = fn
end

--- n = scheduler.progress(): a count that changes whenever something
-- happens that code outside the tasks may be waiting for (a transfer
-- ended, a task finished, a permit was released): a driver that wakes many
-- waiters looks at their conditions only when it has changed.
function scheduler.progress()
  return progress
end

--- scheduler.add_kick(fn): fn() is called whenever something happens
-- that code outside the tasks may be waiting for (a permit released, a
-- task finished): a host whose waiters a driver of its own wakes
-- (hosts/driven.lua) registers its kick here.
function scheduler.add_kick(fn)
  kicks_n = kicks_n + 1
  kicks[kicks_n] = fn
end

--- Waits `seconds`: as a task, by yielding; elsewhere, by driving the
-- scheduler (the other tasks run meanwhile) and blocking in its poll. A task
-- that is cancelled meanwhile calls on_cancel(a, b) first.
function scheduler.sleep(seconds, on_cancel, a, b)
  local bad = bad_seconds(seconds)
  if bad then
    error(format("sleep: seconds must be a finite number (got %s)", bad), 2)
  end
  -- a tail call: one frame less on a waiting task
  if scheduler.current() then return scheduler.park(seconds, nil, on_cancel, a, b) end
  scheduler.drive(MAIN, never, nil, now() + seconds)
end

--- Waits for a transfer to finish, as scheduler.sleep does. A task that is
-- cancelled meanwhile aborts the transfer and frees its connection.
-- A task cancelled while its transfer runs: the transfer is aborted (its
-- connection closed) and released before the cancellation goes on; closed,
-- it is never reported again, so its owner can never be woken by it.
local function abort_transfer(transfer, task)
  task.transfer = nil
  transfer:close()
end

--- scheduler.await_started(transfer): outside any task, waits for a
-- transfer that is not done yet (one just started: engine:start), asking
-- it once a turn; the turns need not ask the engine whether anything runs
-- (it does). A sequential fetch's wait. (Asking the transfer, rather than
-- keeping which one is awaited for the poll to mark: the wait ends however
-- the transfer ends, a closed engine's abort included, and asking a
-- transfer closed meanwhile raises instead of waiting for a report that
-- never comes.)
function scheduler.await_started(transfer)
  scheduler.drive(MAIN_BUSY, transfer_done, transfer)
end

-- Task `task` waits until the poll reports `transfer`, whose owner it is;
-- a cancellation aborts the transfer. task.transfer is what Task:cancel
-- aborts at once (the wait's on_cancel, which closes it, runs only once
-- the task runs again). Returns the transfer.
local function await_in_task(task, transfer)
  task.wait_id = task.wait_id + 1
  task.transfer = transfer
  wait_here(task, abort_transfer, transfer, task)
  task.transfer = nil
  return transfer
end

--- scheduler.own(transfer, waiter): the poll that reports transfer ended
-- (or a stream's news) wakes waiter: a task waiting is made ready,
-- anything else has waiter:wake() called (a driven host's waiter:
-- hosts/driven.lua).
function scheduler.own(transfer, waiter)
  transfer:set_owner(waiter)
end

--- scheduler.await_transfer(transfer): waits for a transfer started
-- without an owner (a stream's, asking for news), inside a task or not. A
-- task is its owner for this wait only: the poll that reports the news
-- forgets it, and the stream's next reader (another task, or code outside
-- any task) is not taken for it.
function scheduler.await_transfer(transfer)
  local task = scheduler.current()
  if task then
    transfer:set_owner(task)
    await_in_task(task, transfer)
  elseif not transfer:done() then
    scheduler.await_started(transfer)
  end
end

--- transfer | nil, err | false, engine, in_task = scheduler.run_transfer(request):
-- inside a task, starts request on the engine with the task for its owner
-- and waits until it ends (as await_transfer does; a cancellation aborts
-- it); nil and the engine's word when it would not start. Outside any
-- task, false (nothing was started), the engine to start it on, and
-- whether a task is being run all the same (scheduler.in_task: by a
-- coroutine that task resumed).
function scheduler.run_transfer(request)
  local task = current
  if not task or task.co ~= running() then return false, engine or scheduler.engine(), task ~= nil end
  local transfer, err = (engine or scheduler.engine()):start(request, task)
  if not transfer then return nil, err end
  return await_in_task(task, transfer)
end

--- true = scheduler.park(seconds, resuming, on_cancel, a, b, c, d): inside
-- a task, waits seconds (nil: until something wakes it). When the wait
-- ends, and before the task runs, the scheduler calls resuming(a, b, c, d)
-- (if given): a number of seconds answered waits on that long, nothing
-- lets the task go on, and an error ends the wait with it, raised in the
-- task. A task cancelled meanwhile calls on_cancel(a, b, c, d, resumed),
-- resumed telling that resuming had let it go (what resuming took is then
-- to be given back). The hook runs outside the task's stack, so no frame
-- of its code stays on a waiting task.
function scheduler.park(seconds, resuming, on_cancel, a, b, c, d)
  local task = scheduler.current()
  task.wait_id = task.wait_id + 1
  if seconds then heap_push(now() + seconds, task, task.wait_id) end
  if not resuming then return wait_here(task, on_cancel, a, b, c, d) end
  task.resuming, task.park_a, task.park_b, task.park_c, task.park_d = resuming, a, b, c, d
  wait_here(task, on_cancel, a, b, c, d)
  leave_park(task) -- what its hook took is the task's own now
  return true
end

-- A wait on a descriptor ends: it is watched no more.
local function unwatch(fd, task)
  if task then fd_waiter[fd] = nil end
  fd_ready[fd] = nil
  if engine then engine:unwatch(fd) end
end

--- ready = scheduler.await_fd(fd, mode, deadline [, outside]): waits
-- until the descriptor fd is ready to read (mode "r") or write ("w"), or
-- until the deadline (monotonic seconds) passes; answers whether it became
-- ready. Outside a task outside(done, deadline) waits (runtime.await_fd
-- gives its host's). The engine watches it with the transfers' sockets, so
-- every host that waits on the engine wakes for it.
function scheduler.await_fd(fd, mode, deadline, outside)
  local ok, err = scheduler.engine():watch(fd, mode)
  if not ok then return nil, err end
  fd_ready[fd] = false
  local task = scheduler.current()
  if task then
    fd_waiter[fd] = task
    task.wait_id = task.wait_id + 1
    heap_push(deadline, task, task.wait_id)
    wait_here(task, unwatch, fd, task)
    fd_waiter[fd] = nil
  else
    -- A host that cannot wait here raises (a phase of nginx that cannot
    -- yield): the descriptor is watched no more.
    local waited, why = compat.pcall(outside or outside_wait, function() return fd_ready[fd] end, deadline)
    if not waited then
      unwatch(fd)
      error(why, 0)
    end
  end
  local became_ready = fd_ready[fd] == true
  if not became_ready then engine:unwatch(fd) end
  fd_ready[fd] = nil
  return became_ready
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

--- results... | nil, err = task:join()
function Task:join()
  if self.state ~= "done" then
    local me = scheduler.current()
    if me == self then error("join: a task cannot join itself", 2) end
    if me then
      local joiners = self.joiners or {}
      self.joiners = joiners
      me.wait_id = me.wait_id + 1
      joiners[#joiners + 1] = me
      joiners[#joiners + 1] = me.wait_id
      wait_here(me)
    else
      self.awaited = true -- joined from outside a task: its failure is not lost
      outside_wait(function() return self.state == "done" end)
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
  end
end

function Task:status()
  return self.state
end

Task.__tostring = function(task)
  return "ratewise.Task (" .. task.state .. ")"
end

---------------------------------------------------------------------------
-- Semaphores: at most n holders at once, served first come, first served.

local Semaphore = {}
Semaphore.__index = Semaphore

--- sem = scheduler.semaphore(n)
function scheduler.semaphore(n)
  if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
    error(format("semaphore: size must be a positive integer (got %s)", shown(n)), 2)
  end
  return setmetatable({ available = n, size = n, queue = {}, head = 1, tail = 0 }, Semaphore)
end

-- A queued task that is cancelled gives its place up; one that had already
-- been handed the permit passes it on.
local function leave_queue(sem, entry)
  entry.gone = true
  if entry.granted then sem:release() end
end

--- true | false = sem:acquire([timeout]): waits for a permit (as a task, by
-- yielding), at most timeout seconds when given.
-- With a timeout: false when no permit came in time, holding nothing.
function Semaphore:acquire(timeout)
  if timeout ~= nil and (type(timeout) ~= "number" or timeout ~= timeout or timeout < 0) then
    error(format("semaphore: acquire: timeout must be a non-negative number of seconds (got %s)",
      shown(timeout)), 2)
  end
  if self.available > 0 and self.head > self.tail then
    self.available = self.available - 1
    return true
  end
  if timeout == 0 then return false end
  local deadline = timeout and timeout < huge and now() + timeout or nil
  local me = scheduler.current()
  if not me then
    local function free() return self.available > 0 and self.head > self.tail end
    if not outside_wait(free, deadline) then return false end
    self.available = self.available - 1
    return true
  end
  me.wait_id = me.wait_id + 1
  local entry = { task = me, id = me.wait_id }
  self.tail = self.tail + 1
  self.queue[self.tail] = entry
  if not deadline then return wait_here(me, leave_queue, self, entry) end
  -- The timer and a release wake the same wait; release hands the permit
  -- only to a task still waiting, so whichever comes first decides.
  heap_push(deadline, me, me.wait_id)
  wait_here(me, leave_queue, self, entry)
  if entry.granted then return true end
  entry.gone = true
  return false
end

--- sem:release(): hands the permit to the first task still waiting, if any.
function Semaphore:release()
  local queue = self.queue
  while self.head <= self.tail do
    local entry = queue[self.head]
    queue[self.head] = nil
    self.head = self.head + 1
    local task = entry.task
    if not entry.gone and task.state == "waiting" and task.wait_id == entry.id then
      entry.granted = true
      make_ready(task)
      return
    end
  end
  self.head, self.tail = 1, 0
  self.available = math.min(self.available + 1, self.size)
  progress = progress + 1
  for i = 1, kicks_n do kicks[i]() end
end

function Semaphore:__tostring()
  return format("ratewise.Semaphore (%d of %d free)", self.available, self.size)
end

---------------------------------------------------------------------------
-- Events: one signal, set once, that any number of callers wait for (an
-- rw.client's identical requests waiting for the one in flight).

local Event = {}
Event.__index = Event

--- ev = scheduler.event(): not set yet.
function scheduler.event()
  return setmetatable({ is_set = false }, Event)
end

--- set = ev:wait([timeout]): waits until ev is set (true), or at most
-- timeout seconds (false). A task yields; a caller outside any task drives
-- the scheduler (or its host's wait) meanwhile. A task cancelled meanwhile
-- raises, as from any other wait; set() then passes it by (its wait number
-- is stale).
function Event:wait(timeout)
  if self.is_set then return true end
  local deadline = timeout and now() + max(timeout, 0)
  local me = scheduler.current()
  if not me then
    outside_wait(function() return self.is_set end, deadline)
    return self.is_set
  end
  local waiters = self.waiters
  if not waiters then
    waiters = {}
    self.waiters = waiters
  end
  me.wait_id = me.wait_id + 1
  waiters[#waiters + 1] = me
  waiters[#waiters + 1] = me.wait_id
  -- the timer and set() wake the same wait: whichever comes first
  if deadline then heap_push(deadline, me, me.wait_id) end
  wait_here(me)
  return self.is_set
end

--- ev:set(): wakes every waiter; later waits return at once.
function Event:set()
  if self.is_set then return end
  self.is_set = true
  local waiters = self.waiters
  self.waiters = nil
  if waiters then
    for i = 1, #waiters, 2 do wake(waiters[i], waiters[i + 1]) end
  end
  progress = progress + 1
  for i = 1, kicks_n do kicks[i]() end
end

function Event:__tostring()
  return "ratewise.Event (" .. (self.is_set and "set" or "not set") .. ")"
end

---------------------------------------------------------------------------
-- run and map

-- Waits until every task of a group has finished.
local function await_group(group)
  local me = scheduler.current()
  if me then
    while group.live > 0 do
      me.wait_id = me.wait_id + 1
      group.waiter, group.waiter_id = me, me.wait_id
      wait_here(me)
    end
    group.waiter = nil
  else
    outside_wait(function() return group.live == 0 end)
  end
end

--- results... = scheduler.run(fn, ...): runs fn as a task and returns once
-- it and every task spawned under it have finished; raises fn's error, or
-- the error of a task under it that failed and was never joined.
function scheduler.run(fn, ...)
  if type(fn) ~= "function" then
    error(format("run: expected a function (got %s)", type(fn)), 2)
  end
  -- members: the tasks of the group not yet finished (a set: a run that
  -- goes on for days spawning tasks must not keep every task it ever had).
  local group = { live = 0, unjoined = {}, members = {} }
  local outer = current
  current = nil -- spawn the root outside any group, then put it in ours
  local root = scheduler.spawn(fn, ...)
  current = outer
  root.group, group.live, group.members[root] = group, 1, true
  local ok, err = compat.pcall(await_group, group)
  trim()
  if not ok then
    -- Deadlocked (or this task was cancelled): end every task of the group,
    -- so that none is left waiting forever.
    for task in pairs(group.members) do task:cancel() end
    if not scheduler.current() then outside_wait(function() return group.live == 0 end) end
    error(err, 0)
  end
  if root.failed ~= nil then
    root.joined = true
    error(root.failed == CANCELLED and "cancelled" or root.failed, 0)
  end
  for i = 1, #group.unjoined do
    local task = group.unjoined[i]
    if not task.joined then
      error("a task spawned under rw.run failed and was never joined: " .. tostring(task.failed), 0)
    end
  end
  return unpack(root.results, 1, root.results.n)
end

--- results, errors = scheduler.map(list, fn [, {concurrency = n}])
function scheduler.map(list, fn, opts)
  if type(list) ~= "table" then error(format("map: list must be a table (got %s)", type(list)), 2) end
  if type(fn) ~= "function" then error(format("map: fn must be a function (got %s)", type(fn)), 2) end
  local n = #list
  local concurrency = n
  if opts ~= nil then
    if type(opts) ~= "table" then error(format("map: options must be a table (got %s)", type(opts)), 2) end
    for k in pairs(opts) do
      if k ~= "concurrency" then error(format("map: unknown option '%s'", tostring(k)), 2) end
    end
    local c = opts.concurrency
    if c ~= nil then
      if type(c) ~= "number" or c < 1 or c % 1 ~= 0 then
        bad_option("map", "concurrency", "a positive integer", c, 2)
      end
      concurrency = c
    end
  end
  local results, errors = { n = n }, {}
  if n == 0 then return results, errors end
  return scheduler.run(function()
    local next_index = 0
    local function worker()
      while next_index < n do
        next_index = next_index + 1
        local i = next_index
        results[i], errors[i] = fn(list[i], i)
      end
    end
    local workers = {}
    for w = 1, min(concurrency, n) do workers[w] = scheduler.spawn(worker) end
    for w = 1, #workers do
      workers[w]:join()
      if workers[w].failed ~= nil then
        for other = 1, #workers do workers[other]:cancel() end
        error(workers[w].failed, 0)
      end
    end
    return results, errors
  end)
end

return scheduler
