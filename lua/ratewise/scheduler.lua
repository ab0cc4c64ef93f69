-- ratewise's scheduler: tasks are coroutines, every wait is a yield, and the
-- thread only ever blocks in the engine's poll, which wakes for libcurl's
-- sockets or the next timer, whichever comes first.
--
-- This module is its public face; the work is done by its parts, one job
-- each, which share one record of state (scheduler.state()):
--   scheduler/state.lua     the record, the engine, CANCELLED
--   scheduler/timers.lua    the timers' heap; a wait's seconds checked
--   scheduler/tasks.lua     tasks, their waits' yield and wake, the ready queue
--   scheduler/waits.lua     park, sleep, descriptors, transfers (and their owner)
--   scheduler/sync.lua      semaphores and events
--   scheduler/loop.lua      a turn, step, timeout, and the one drive loop
--   scheduler/pollable.lua  the scheduler as a pollable, for a host's loop
--   scheduler/groups.lua    rw.run and rw.map
local groups = require "ratewise.scheduler.groups"
local loop = require "ratewise.scheduler.loop"
local pollable = require "ratewise.scheduler.pollable"
local state = require "ratewise.scheduler.state"
local sync = require "ratewise.scheduler.sync"
local tasks = require "ratewise.scheduler.tasks"
local timers = require "ratewise.scheduler.timers"
local waits = require "ratewise.scheduler.waits"

local scheduler = {
  --- the record of the scheduler's state, for a spec to look into
  state = function() return state.record end,
  engine = state.engine,
  CANCELLED = state.CANCELLED,
  bad_seconds = timers.bad_seconds,

  spawn = tasks.spawn,
  current = tasks.current,
  in_task = tasks.in_task,
  origin = tasks.origin,
  set_origin_of_spawn = tasks.set_origin_of_spawn,
  --- n = scheduler.live(): the tasks that have not finished
  live = function() return state.record.live end,

  park = waits.park,
  sleep = waits.sleep,
  await_fd = waits.await_fd,
  await_started = waits.await_started,
  await_transfer = waits.await_transfer,
  own = waits.own,
  run_transfer = waits.run_transfer,

  semaphore = sync.semaphore,
  event = sync.event,

  step = loop.step,
  driver_step = loop.driver_step,
  timeout = loop.timeout,
  has_work = loop.has_work,
  transfers_running = loop.transfers_running,
  drive = loop.drive,
  drive_until = loop.drive_until,
  NAP_FIRST = loop.NAP_FIRST,
  NAP_MAX = loop.NAP_MAX,
  set_outside_wait = loop.set_outside_wait,
  progress = loop.progress,
  add_kick = loop.add_kick,
  add_spawn_watch = tasks.add_spawn_watch,

  pollable = pollable.pollable,
  descriptor = pollable.descriptor,

  run = groups.run,
  map = groups.map,
}

return scheduler
