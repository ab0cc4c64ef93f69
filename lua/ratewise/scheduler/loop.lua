-- Turning the scheduler's wheel: a turn runs the ready tasks or blocks in
-- the engine's poll, never both; scheduler.step is turns for a while;
-- scheduler.drive is the one loop of every wait outside a task, with one
-- nap policy.
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local state = require "ratewise.scheduler.state"
local tasks = require "ratewise.scheduler.tasks"
local timers = require "ratewise.scheduler.timers"
local log = require "ratewise.log"

local S = state.record
local engine = state.engine
local first_due, pop_timer = timers.first_due, timers.pop
local make_ready, wake, run_ready, current = tasks.make_ready, tasks.wake, tasks.run_ready, tasks.current
local now = core.now
local engine_poll = core.engine_methods.poll
local format, huge, min, max = string.format, math.huge, math.min, math.max
local type, error = type, error
local shown = errors.shown

local loop = {}

-- Due timers wake their tasks; stale ones go.
local function fire_timers()
  if S.heap_n == 0 then return end -- most turns: no clock read
  local t = now()
  while first_due(t) do
    local _, task, id = pop_timer()
    wake(task, id)
  end
end

local function transfers_running()
  local e = S.engine
  return e ~= nil and e:running() > 0
end
loop.transfers_running = transfers_running

--- yes = loop.has_work(): anything at all that could make progress: a
-- ready task, a timer, or a transfer in flight.
local function has_work()
  fire_timers() -- drops stale timers from the top: they are no work
  return S.ready_n > 0 or S.heap_n > 0 or transfers_running()
end
loop.has_work = has_work

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
  if S.heap_n > 0 then fire_timers() end
  if S.ready_n > 0 then
    if budget and not S.work_until then S.work_until = now() + budget end
    run_ready(budget and S.work_until)
    if not transfers_running() then
      if S.heap_n > 0 then fire_timers() end
      return
    end
    max_wait = 0
  else
    if S.heap_n > 0 then max_wait = min(max_wait, max(0, S.heap_at[1] - now())) end
    -- nothing could happen (in_flight: the caller knows a transfer is)
    if max_wait == huge and not in_flight and not transfers_running() then return end
  end
  local work_until = S.work_until
  local left = budget and (work_until and max(work_until - now(), 1e-6) or budget) or nil
  local finished, owners, fd_ready = S.finished, S.owners, S.fd_ready
  local _, n = engine_poll(S.engine or engine(), max_wait, finished, left, owners)
  if budget and not S.work_until then S.work_until = now() + budget end
  if n > 0 then S.progress = S.progress + 1 end
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
      local task = S.fd_waiter[transfer]
      if task then
        S.fd_waiter[transfer] = nil
        if task.state == "waiting" then make_ready(task) end
      end
    end
  end
  if S.heap_n > 0 then fire_timers() end
end

--- loop.trim(): with no task left, nothing here needs a connection: the
-- engine may close those a burst of transfers left open (it keeps its idle few).
function loop.trim()
  if S.engine and S.live == 0 then S.engine:trim() end
end
local trim = loop.trim

-- The work rw.step(0) does at most, so that a frame loop's frame stays
-- short whatever moves at once (a burst of responses arriving together
-- takes several frames' worth of work to turn into results).
local STEP_BUDGET = 0.0005

--- live = loop.step([timeout [, budget]]): runs the tasks for at
-- most timeout seconds (0: what is ready now). math.huge runs them until
-- none is left, or until none could ever make progress (each waits for
-- another, or for the caller), when it returns at once instead of
-- spinning. With a budget (seconds; by default STEP_BUDGET for a timeout
-- of 0, none otherwise; false: none), the work of the call (resuming
-- tasks, letting libcurl act on sockets) stops once about that much time
-- is spent, waiting aside; what is left is done by the next call, and
-- scheduler.timeout() says 0 meanwhile.
function loop.step(timeout, budget)
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
  if current() then error("step: called from inside a task; a task waits with rw.sleep instead", 2) end
  local deadline = now() + timeout
  S.work_until = nil
  repeat
    -- With a finite timeout, turn blocks in the poll; with none, a turn
    -- that has nothing to wait for would return at once, again and again.
    if deadline == huge and not has_work() then break end
    turn(max(0, deadline - now()), budget)
  until S.live == 0 or now() >= deadline or (S.work_until and now() >= S.work_until)
  -- What the last turn's I/O and timers made ready runs now, not a frame
  -- later, unless the budget is spent.
  if S.ready_n > 0 and not (S.work_until and now() >= S.work_until) then turn(0, budget) end
  S.work_until = nil
  trim()
  return S.live
end

--- seconds | nil = loop.timeout(): how long the scheduler may be left
-- alone if the engine's descriptor stays quiet: 0 with a task ready, else
-- until its next timer or the engine's own deadline; nil when nothing at
-- all is due (only a socket, or another party, could change anything).
function loop.timeout()
  if S.ready_n > 0 then return 0 end
  fire_timers() -- due timers make tasks ready; stale ones go
  if S.ready_n > 0 then return 0 end
  local left = S.heap_n > 0 and max(0, S.heap_at[1] - now()) or nil
  local engine_left = S.engine and S.engine:timeout()
  if engine_left and (not left or engine_left < left) then left = engine_left end
  return left
end
local scheduler_timeout = loop.timeout

---------------------------------------------------------------------------
-- Driving the engine from outside any task: one loop, one nap policy

-- A host that cannot see the engine's descriptor (a sleep, a frame, a
-- poll(2) build, whose engine has none) looks again after NAP_FIRST while
-- anything is in flight, and less often, doubling up to NAP_MAX, while
-- nothing moves: a server that takes seconds to answer costs next to no
-- CPU, one that answers at once is seen within a millisecond.
local NAP_FIRST, NAP_MAX = 0.001, 0.016
loop.NAP_FIRST, loop.NAP_MAX = NAP_FIRST, NAP_MAX

--- nap = loop.next_nap(nap, moved): the nap after `nap`: the first again
-- when anything moved, else twice as long, up to NAP_MAX.
function loop.next_nap(nap, moved)
  if moved then return NAP_FIRST end
  nap = nap * 2
  if nap > NAP_MAX then return NAP_MAX end
  return nap
end
local next_nap = loop.next_nap

-- Whether the engine has a descriptor to wait on (an epoll build's).
local function engine_has_fd()
  return engine():pollfd() ~= nil
end

--- seconds | nil = loop.wait_for(nap, sees_fd): how long a host may leave
-- the scheduler alone. Its timeout (the next timer, libcurl's deadline),
-- capped by the nap while anything is in flight, unless the host wakes for
-- the descriptor: libcurl's deadline is when a transfer times out, not
-- when its answer comes.
function loop.wait_for(nap, sees_fd)
  local t = scheduler_timeout()
  if (not sees_fd or not engine_has_fd()) and (not t or t > nap) and transfers_running() then t = nap end
  return t
end
local wait_for = loop.wait_for

local DEADLOCK = "ratewise: deadlock: the remaining tasks all wait for each other"

local function step_all()
  loop.step(0, false)
end

--- loop.driver_step(): one step of a host's driver (loop.step(0)); one
-- that raises is logged, and the driving goes on: the driver serves every
-- other waiter and task.
function loop.driver_step()
  local ok, err = pcall(loop.step, 0)
  if not ok then log.write("ratewise: the driver's step failed: " .. tostring(err), "error") end
end

--- came = loop.drive(way, done, arg, deadline): drives the scheduler
-- from outside any task until done(arg) is true (true), or until the
-- deadline (monotonic seconds) passes (false). The one loop of every host
-- that waits outside a task; way says how the waiting code waits:
--   turns    block is a turn of the scheduler itself, blocking in the
--            engine's poll (the main thread): no step, no nap; with no
--            deadline, a wait that nothing could end raises (a deadlock)
--   busy     (with turns) the caller knows a transfer is in flight, not
--            done yet: done is first asked after a turn
--   block(seconds | nil, arg)  waits at most that long (nil: until the
--            descriptor is readable, or a kick)
--   sees_fd  block wakes when the engine's descriptor is readable
--   idle     seconds to wait when nothing is due (nil: block(nil))
--   step(arg)  (optional) one look, instead of scheduler.step(0, false);
--            true when something new may be due soon (a kick)
function loop.drive(way, done, arg, deadline)
  if way.turns then
    -- (what a busy wait waits for has just started: it is not done before a turn)
    local busy = way.busy
    if not busy and done(arg) then return true end
    repeat
      local left = deadline and deadline - now()
      if left then
        if left <= 0 then return false end
      elseif not busy and not has_work() then
        error(DEADLOCK, 0)
      end
      turn(left or huge, nil, busy)
    until done(arg)
    return true
  end
  local step, block, sees_fd, idle = way.step or step_all, way.block, way.sees_fd, way.idle
  local nap, seen = NAP_FIRST, S.progress
  while true do
    local fresh = step(arg)
    if done(arg) then return true end
    local left = deadline and deadline - now()
    if left and left <= 0 then return false end
    nap = next_nap(nap, fresh or S.progress ~= seen)
    seen = S.progress
    local t = wait_for(nap, sees_fd)
    if not t then t = idle end
    if left and (not t or left < t) then t = left end
    block(t, arg)
  end
end
local drive = loop.drive

-- The main thread's ways: it blocks in the engine's poll.
loop.MAIN = { turns = true }
loop.MAIN_BUSY = { turns = true, busy = true }
local MAIN = loop.MAIN
local function call(fn) return fn() end

--- came = loop.drive_until(done, deadline): the main thread's wait.
function loop.drive_until(done, deadline)
  return drive(MAIN, call, done, deadline)
end

-- How code outside any task waits for done() (a join, a semaphore, a
-- group): the waiting seam (runtime.lua) sets it for the host at hand;
-- until then, the main thread's way.
S.outside_wait = loop.drive_until

--- loop.set_outside_wait(fn): fn(done, deadline) -> done() came true.
function loop.set_outside_wait(fn)
  S.outside_wait = fn
end

--- n = loop.progress(): a count that changes whenever something
-- happens that code outside the tasks may be waiting for (a transfer
-- ended, a task finished, a permit was released): a driver that wakes many
-- waiters looks at their conditions only when it has changed.
function loop.progress()
  return S.progress
end

--- loop.add_kick(fn): fn() is called whenever something happens
-- that code outside the tasks may be waiting for (a permit released, a
-- task finished): a host whose waiters a driver of its own wakes
-- (hosts/driven.lua) registers its kick here.
function loop.add_kick(fn)
  S.kicks_n = S.kicks_n + 1
  S.kicks[S.kicks_n] = fn
end

return loop
