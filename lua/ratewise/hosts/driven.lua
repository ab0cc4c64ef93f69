-- A host whose waiting code blocks on a signal of its own, woken by one
-- driver: OpenResty (an ngx.semaphore per waiter, the driver a light
-- thread of ngx.timer.at) and cqueues (a condition per waiter, the driver a
-- coroutine of the controller). The driver runs the scheduler while
-- anything is pending, and signals each waiter whose condition came true.
-- Only it waits on the scheduler's descriptor: a thousand waiters would
-- otherwise all wake for every socket that becomes ready (and cqueues, for
-- one, does not wake two coroutines polling the same descriptor).
-- A host whose waiting code can wait as the driver does (nap), such as
-- OpenResty's, lets a waiter whose transfer is alone in flight, with no
-- driver and no task, take those waits and looks itself: a handler
-- fetching one URL after another then costs no driver, no semaphore and
-- no switch between light threads.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local scheduler = require "ratewise.scheduler"
local log = require "ratewise.log"

local now = core.now
local cpu_clock = os.clock
-- (compat's pcall: Lua 5.1's cannot be yielded across, and cqueues' waits yield)
local next, pairs, ipairs, pcall, tostring, error, setmetatable = next, pairs, ipairs, compat.pcall,
  tostring, error, setmetatable

local driven = {}

-- A driver with waiters for another party's doing, nothing due and no
-- descriptor to wake it looks every IDLE seconds, unless kicked first.
-- Its naps while transfers are in flight are the scheduler's
-- (scheduler.drive).
local IDLE = 0.05

-- A step that ran tasks and spent this much longer than its CPU time,
-- while the host's loop turned, waited for the host inside a task.
local HOST_WAIT = 0.005

--- host = driven.new(primitives): primitives are
--   spawn(fn) -> ok, err     runs fn(premature) apart from the caller
--   signal() -> s            a new signal
--   wait(s, seconds | nil)   blocks the caller until s is posted, or the seconds passed
--   post(s)                  wakes the one waiting on s
--   block(kick, seconds | nil) the driver's wait: until the kick signal is
--                            posted, the seconds passed, or (watches_fd)
--                            the scheduler's descriptor is readable
--   watches_fd               whether block sees the descriptor
--   linger                   seconds an idle driver stays before it ends
--                            (nil: it ends at once), where starting one
--                            costs more than waiting (OpenResty's timer)
--   post_kick(kick)          (optional) posts the driver's kick (default
--                            post): where block waits on something else
--   nap(seconds)             (optional) the waiting code's own sleep, for a
--                            waiter that drives its transfer alone (with
--                            watches_fd, it wakes too when the descriptor
--                            is readable)
--   nap_over()               (optional) after such a waiter's last nap
--   loop_time()              (optional) a clock that moves only when the
--                            host's own loop turns (nginx's cached time):
--                            one that moved during a step that ran tasks,
--                            while the driver's thread spent that time off
--                            the CPU, means a task waited for the host
--                            itself (ngx.sleep, a cosocket), holding the
--                            driver and every other task: host_wait_warning
--                            is written once
--   tasks_stay               the driver runs while a task has not finished,
--                            even one that waits for another party (a
--                            semaphore, a join): the tasks' coroutines
--                            belong to the driver (OpenResty's: they are
--                            made in its timer, and no other timer may
--                            resume them)
-- and host has await(done, deadline), await_transfer(transfer), start() and kick().
function driven.new(p)
  -- waiter -> true: { done = fn, signal = s } of host.await, asked by the
  -- driver whenever anything happened.
  local waiters = {}
  -- waiter -> true: { signal = s } of host.await_transfer, woken by the
  -- poll that reports its transfer (the waiter is the transfer's owner:
  -- the scheduler's turn), so that the driver need not ask them after every step.
  -- The waiters are reused, so their keys do not churn. Weak: a waiter
  -- whose light thread was killed goes with its transfer.
  local transfer_waiters = setmetatable({}, { __mode = "k" })
  -- The waiters of the waits that ended, for the next: an ngx.semaphore is
  -- a cdata with a finalizer, and one a request cost the worker.
  local spare, spare_n = {}, 0
  local driving = false
  local kicked = p.signal()
  local post_kick = p.post_kick or p.post
  local fresh = false -- kicked since the driver's last look: look again soon

  local function wake(w)
    transfer_waiters[w] = nil
    p.post(w.signal)
  end

  local function take_waiter()
    if spare_n == 0 then return { signal = p.signal(), wake = wake } end
    local w = spare[spare_n]
    spare[spare_n] = nil
    spare_n = spare_n - 1
    return w
  end

  local function give_back(w)
    waiters[w], transfer_waiters[w] = nil, nil
    w.done, w.abandoned = nil, nil
    spare_n = spare_n + 1
    spare[spare_n] = w
  end

  -- One look: a step that raises is logged, and the driving goes on.
  -- A task that waits for the host itself suspends the driver's thread
  -- inside the step, not through ratewise's yields, so the driver cannot
  -- see the yield: it sees the host's loop clock move (nothing in a step
  -- turns the loop otherwise) while its thread was off the CPU (which
  -- tells apart a task that only set the host's clock, as
  -- ngx.update_time does, while computing).
  local loop_time, told_host_wait = p.loop_time, false
  local function step()
    local turned, cpu, wall
    if loop_time and not told_host_wait and scheduler.live() > 0 then
      turned, cpu, wall = loop_time(), cpu_clock(), now()
    end
    scheduler.driver_step()
    if turned and loop_time() ~= turned and (now() - wall) - (cpu_clock() - cpu) > HOST_WAIT then
      told_host_wait = true
      log.write(p.host_wait_warning, "warn")
    end
  end

  -- The driver's look: a step, then the waiters whose condition came
  -- true are woken (only when the step changed anything: with a thousand
  -- waiters, most steps change nothing). True when kicked since the last
  -- look: something new (a transfer started) may answer at once.
  local seen, moved, idle_since, linger_left = nil, false, nil, nil
  local function look()
    step()
    local progress = scheduler.progress()
    moved = fresh or progress ~= seen
    if progress ~= seen then
      seen = progress
      for w in pairs(waiters) do
        if w.done() then
          waiters[w] = nil
          p.post(w.signal)
        end
      end
    end
    local kicked_since = fresh
    fresh = false
    return kicked_since
  end

  -- Whether the driver ends: nothing pending, in flight or due. A driver
  -- whose start costs a light thread of its own (linger) stays that long
  -- for the next wait, which a handler calling rw.fetch in a loop makes at
  -- once, and then ends.
  local function idle_over()
    linger_left = nil
    local pending = next(waiters) ~= nil or next(transfer_waiters) ~= nil
    if pending or scheduler.transfers_running() or scheduler.timeout()
        or (p.tasks_stay and scheduler.live() > 0) then
      idle_since = nil
      return false
    end
    if not p.linger then return true end
    local at = now()
    if moved or not idle_since then idle_since = at end
    linger_left = idle_since + p.linger - at
    return linger_left <= 0
  end

  local way = {
    step = look,
    sees_fd = p.watches_fd,
    idle = not p.watches_fd and IDLE or nil,
    block = function(t)
      if linger_left and (not t or t > linger_left) then t = linger_left end
      p.block(kicked, t)
    end,
  }

  -- premature: the host is going away (an nginx worker exiting): nothing
  -- will be driven, and the waiters are told so. A driver whose wait
  -- raised (its fiber killed by another's code) is replaced at once while
  -- anything needs one (a waiter, a task): they would wait for ever.
  local start
  local function driver(premature)
    local ok, err = true, nil
    if not premature then
      seen, idle_since = nil, nil
      ok, err = pcall(scheduler.drive, way, idle_over)
    end
    driving = false
    if premature then
      for _, set in ipairs({ waiters, transfer_waiters }) do
        for w in pairs(set) do
          w.abandoned = true
          p.post(w.signal)
        end
      end
    elseif not ok then
      if next(waiters) or next(transfer_waiters) or scheduler.live() > 0 then start() end
      error(err, 0)
    end
  end

  function start()
    if driving then return end
    local ok, err = p.spawn(driver)
    if not ok then error("ratewise: cannot start the host's driver: " .. tostring(err), 0) end
    driving = true
  end

  local host = {}

  --- host.start(): starts the driver if none runs (a task spawned outside
  -- any task, which only the driver would run).
  host.start = start

  --- host.kick(): something happened that a waiter may wait for.
  function host.kick()
    if driving then
      fresh = true
      post_kick(kicked)
    end
  end

  -- A wait that raises (a Tarantool fiber cancelled while it waits) gives
  -- its waiter back before the error goes on: left among the waiters, it
  -- would keep the driver running for a waiter that is gone.
  local function wait_on(w, seconds)
    local ok, err = pcall(p.wait, w.signal, seconds)
    if not ok then
      give_back(w)
      error(err, 0)
    end
  end

  local function check_abandoned(w)
    if w.abandoned then error("ratewise: the host is going away (an nginx worker exiting); the wait ended", 0) end
  end

  --- done() came true = host.await(done, deadline)
  function host.await(done, deadline)
    if done() then return true end
    local w = take_waiter()
    w.done = done
    waiters[w] = true
    start()
    -- What the caller waits for may need the driver now (a transfer just
    -- started is sent at its next step): a driver napping between looks
    -- (OpenResty's) steps at once instead of after its nap.
    host.kick()
    while true do
      local left = deadline and deadline - now()
      if left and left <= 0 then
        give_back(w)
        return false
      end
      wait_on(w, left) -- posted by the driver; a time-out just looks again
      if done() then
        give_back(w)
        return true
      end
      check_abandoned(w)
      waiters[w] = true
      start()
    end
  end

  -- Whether a waiter may drive its transfer alone: no driver runs, no
  -- task lives (their coroutines are the driver's to resume), and no other
  -- transfer is in flight (its waiter, if any, would need the driver).
  local function alone()
    return not driving and scheduler.live() == 0 and scheduler.engine():running() == 1
  end

  -- A waiter alone steps the scheduler and naps (p.nap), as the driver
  -- would, until its transfer is done or a driver or a task appears
  -- (another request's doing): then the driver takes over.
  local alone_way = { step = step, block = p.nap, sees_fd = p.watches_fd, idle = way.idle }
  local nap_over = p.nap_over or function() end
  local function alone_over(transfer)
    return transfer:done() or driving or scheduler.live() > 0
  end
  local function drive_alone(transfer)
    scheduler.drive(alone_way, alone_over, transfer)
    nap_over()
    return transfer:done()
  end

  --- host.await_transfer(transfer): waits until a transfer that has not
  -- been reported finished yet (one just started) is done; the poll that
  -- reports it wakes the waiter, its owner. Alone, the waiter drives it.
  function host.await_transfer(transfer)
    if p.nap and alone() and drive_alone(transfer) then return end
    local w = take_waiter()
    scheduler.own(transfer, w)
    transfer_waiters[w] = true -- the driver goes on while it waits, and tells it if the host goes away
    start()
    host.kick() -- the transfer is sent at the driver's next step: now, not after its nap
    while not transfer:done() do
      wait_on(w, nil) -- a time-out (OpenResty's waits have one) just looks again
      check_abandoned(w)
      start()
    end
    give_back(w)
  end

  return host
end

return driven
