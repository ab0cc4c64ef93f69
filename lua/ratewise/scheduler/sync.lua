-- What tasks (and code outside any task) wait for each other with: a
-- semaphore, and an event set once.
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local state = require "ratewise.scheduler.state"
local tasks = require "ratewise.scheduler.tasks"
local timers = require "ratewise.scheduler.timers"

local S = state.record
local moved = state.moved
local current, wait_here, make_ready, wake = tasks.current, tasks.wait_here, tasks.make_ready, tasks.wake
local ready_outside = tasks.ready_outside
local push_timer = timers.push
local now = core.now
local format, huge, min, max = string.format, math.huge, math.min, math.max
local type, error, setmetatable = type, error, setmetatable
local shown = errors.shown

local sync = {}

---------------------------------------------------------------------------
-- Semaphores: at most n holders at once, served first come, first served.

local Semaphore = {}
Semaphore.__index = Semaphore

--- sem = sync.semaphore(n)
function sync.semaphore(n)
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
  local me = current()
  if not me then
    local function free() return self.available > 0 and self.head > self.tail end
    if not S.outside_wait(free, deadline) then return false end
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
  push_timer(deadline, me, me.wait_id)
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
      return ready_outside()
    end
  end
  self.head, self.tail = 1, 0
  self.available = min(self.available + 1, self.size)
  moved()
end

function Semaphore:__tostring()
  return format("ratewise.Semaphore (%d of %d free)", self.available, self.size)
end

---------------------------------------------------------------------------
-- Events: one signal, set once, that any number of callers wait for (an
-- rw.client's identical requests waiting for the one in flight).

local Event = {}
Event.__index = Event

--- ev = sync.event(): not set yet.
function sync.event()
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
  local me = current()
  if not me then
    S.outside_wait(function() return self.is_set end, deadline)
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
  if deadline then push_timer(deadline, me, me.wait_id) end
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
    ready_outside()
  end
  moved()
end

function Event:__tostring()
  return "ratewise.Event (" .. (self.is_set and "set" or "not set") .. ")"
end

return sync
