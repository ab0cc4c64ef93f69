-- The waits of the scheduler's tasks (and of code outside any task, which
-- drives the scheduler meanwhile): a timed wait with a hook (park), a
-- sleep, a descriptor, and a transfer.
--
-- One owner per transfer: who waits for a transfer (its end, or a stream's
-- news) is the transfer's owner, kept by the engine with it and named by
-- the poll beside it; set here only (run_transfer's engine:start,
-- await_transfer and own: transfer:set_owner), and let go when the wait
-- ends (the poll that reports a stream's news forgets its owner, a
-- finished transfer is reported once, and a wait cut short closes its
-- transfer), so that no task is ever woken by a transfer it no longer
-- waits for. runtime and the hosts ask the scheduler (own, run_transfer,
-- await_transfer, await_fd) and keep no record of their own.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local loop = require "ratewise.scheduler.loop"
local state = require "ratewise.scheduler.state"
local tasks = require "ratewise.scheduler.tasks"
local timers = require "ratewise.scheduler.timers"

local S = state.record
local engine = state.engine
local current, wait_here, leave_park = tasks.current, tasks.wait_here, tasks.leave_park
local push_timer, bad_seconds = timers.push, timers.bad_seconds
local drive, MAIN, MAIN_BUSY = loop.drive, loop.MAIN, loop.MAIN_BUSY
local now = core.now
local transfer_done = core.transfer_methods.done
local running = compat.coroutine_of_task
local format, error = string.format, error

local waits = {}

---------------------------------------------------------------------------
-- Timed waits

--- true = waits.park(seconds, resuming, on_cancel, a, b, c, d): inside
-- a task, waits seconds (nil: until something wakes it). When the wait
-- ends, and before the task runs, the scheduler calls resuming(a, b, c, d)
-- (if given): a number of seconds answered waits on that long, nothing
-- lets the task go on, and an error ends the wait with it, raised in the
-- task. A task cancelled meanwhile calls on_cancel(a, b, c, d, resumed),
-- resumed telling that resuming had let it go (what resuming took is then
-- to be given back). The hook runs outside the task's stack, so no frame
-- of its code stays on a waiting task.
function waits.park(seconds, resuming, on_cancel, a, b, c, d)
  local task = current()
  task.wait_id = task.wait_id + 1
  if seconds then push_timer(now() + seconds, task, task.wait_id) end
  if not resuming then return wait_here(task, on_cancel, a, b, c, d) end
  task.resuming, task.park_a, task.park_b, task.park_c, task.park_d = resuming, a, b, c, d
  wait_here(task, on_cancel, a, b, c, d)
  leave_park(task) -- what its hook took is the task's own now
  return true
end
local park = waits.park

local function never() return false end

--- Waits `seconds`: as a task, by yielding; elsewhere, by driving the
-- scheduler (the other tasks run meanwhile) and blocking in its poll.
function waits.sleep(seconds)
  local bad = bad_seconds(seconds)
  if bad then
    error(format("sleep: seconds must be a finite number (got %s)", bad), 2)
  end
  -- a tail call: one frame less on a waiting task
  if current() then return park(seconds) end
  drive(MAIN, never, nil, now() + seconds)
end

---------------------------------------------------------------------------
-- Descriptors

-- A wait on a descriptor ends: it is watched no more.
local function unwatch(fd, task)
  if task then S.fd_waiter[fd] = nil end
  S.fd_ready[fd] = nil
  if S.engine then S.engine:unwatch(fd) end
end

--- ready = waits.await_fd(fd, mode, deadline [, outside]): waits
-- until the descriptor fd is ready to read (mode "r") or write ("w"), or
-- until the deadline (monotonic seconds) passes; answers whether it became
-- ready. Outside a task outside(done, deadline) waits (runtime.await_fd
-- gives its host's). The engine watches it with the transfers' sockets, so
-- every host that waits on the engine wakes for it.
function waits.await_fd(fd, mode, deadline, outside)
  local ok, err = engine():watch(fd, mode)
  if not ok then return nil, err end
  local fd_ready = S.fd_ready
  fd_ready[fd] = false
  local task = current()
  if task then
    S.fd_waiter[fd] = task
    task.wait_id = task.wait_id + 1
    push_timer(deadline, task, task.wait_id)
    wait_here(task, unwatch, fd, task)
    S.fd_waiter[fd] = nil
  else
    -- A host that cannot wait here raises (a phase of nginx that cannot
    -- yield): the descriptor is watched no more.
    local waited, why = compat.pcall(outside or S.outside_wait, function() return fd_ready[fd] end, deadline)
    if not waited then
      unwatch(fd)
      error(why, 0)
    end
  end
  local became_ready = fd_ready[fd] == true
  if not became_ready then S.engine:unwatch(fd) end
  fd_ready[fd] = nil
  return became_ready
end

---------------------------------------------------------------------------
-- Transfers

-- A task cancelled while its transfer runs: the transfer is aborted (its
-- connection closed) and released before the cancellation goes on; closed,
-- it is never reported again, so its owner can never be woken by it.
local function abort_transfer(transfer, task)
  task.transfer = nil
  transfer:close()
end

--- waits.await_started(transfer): outside any task, waits for a
-- transfer that is not done yet (one just started: engine:start), asking
-- it once a turn; the turns need not ask the engine whether anything runs
-- (it does). A sequential fetch's wait. (Asking the transfer, rather than
-- keeping which one is awaited for the poll to mark: the wait ends however
-- the transfer ends, a closed engine's abort included, and asking a
-- transfer closed meanwhile raises instead of waiting for a report that
-- never comes.)
function waits.await_started(transfer)
  drive(MAIN_BUSY, transfer_done, transfer)
end
local await_started = waits.await_started

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

--- waits.own(transfer, waiter): the poll that reports transfer ended
-- (or a stream's news) wakes waiter: a task waiting is made ready,
-- anything else has waiter:wake() called (a driven host's waiter:
-- hosts/driven.lua).
function waits.own(transfer, waiter)
  transfer:set_owner(waiter)
end

--- waits.await_transfer(transfer): waits for a transfer started
-- without an owner (a stream's, asking for news), inside a task or not. A
-- task is its owner for this wait only: the poll that reports the news
-- forgets it, and the stream's next reader (another task, or code outside
-- any task) is not taken for it.
function waits.await_transfer(transfer)
  local task = current()
  if task then
    transfer:set_owner(task)
    await_in_task(task, transfer)
  elseif not transfer:done() then
    await_started(transfer)
  end
end

--- transfer | nil, err | false, engine, in_task = waits.run_transfer(request):
-- inside a task, starts request on the engine with the task for its owner
-- and waits until it ends (as await_transfer does; a cancellation aborts
-- it); nil and the engine's word when it would not start. Outside any
-- task, false (nothing was started), the engine to start it on, and
-- whether a task is being run all the same (scheduler.in_task: by a
-- coroutine that task resumed).
function waits.run_transfer(request)
  local task = S.current
  if not task or task.co ~= running() then return false, S.engine or engine(), task ~= nil end
  local transfer, err = (S.engine or engine()):start(request, task)
  if not transfer then return nil, err end
  return await_in_task(task, transfer)
end

return waits
