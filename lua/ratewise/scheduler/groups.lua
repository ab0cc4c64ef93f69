-- Groups of tasks: rw.run (a task and every task spawned under it, waited
-- for together) and rw.map (a list worked through by a few tasks).
local compat = require "ratewise.compat"
local errors = require "ratewise.errors"
local options = require "ratewise.options"
local loop = require "ratewise.scheduler.loop"
local state = require "ratewise.scheduler.state"
local tasks = require "ratewise.scheduler.tasks"

local S = state.record
local CANCELLED = state.CANCELLED
local current, spawn, wait_here = tasks.current, tasks.spawn, tasks.wait_here
local spawn_in, origin_here = tasks.spawn_in, tasks.origin_here
local trim = loop.trim
local unpack = compat.unpack
local format, min = string.format, math.min
local type, tostring, pairs, error = type, tostring, pairs, error
local MAP_OPTIONS = { concurrency = true }
local bad_option = errors.bad_option

local groups = {}

-- Waits until every task of a group has finished.
local function await_group(group)
  local me = current()
  if me then
    while group.live > 0 do
      me.wait_id = me.wait_id + 1
      group.waiter, group.waiter_id = me, me.wait_id
      wait_here(me)
    end
    group.waiter = nil
  else
    S.outside_wait(function() return group.live == 0 end)
  end
end

--- results... = groups.run(fn, ...): runs fn as a task and returns once
-- it and every task spawned under it have finished; raises fn's error, or
-- the error of a task under it that failed and was never joined.
function groups.run(fn, ...)
  if type(fn) ~= "function" then
    error(format("run: expected a function (got %s)", type(fn)), 2)
  end
  -- members: the tasks of the group not yet finished (a set: a run that
  -- goes on for days spawning tasks must not keep every task it ever had).
  local group = { live = 0, unjoined = {}, members = {} }
  local root = spawn_in(group, origin_here(), fn, ...)
  local ok, err = compat.pcall(await_group, group)
  trim()
  if not ok then
    -- Deadlocked (or this task was cancelled): end every task of the group,
    -- so that none is left waiting forever.
    for task in pairs(group.members) do task:cancel() end
    if not current() then S.outside_wait(function() return group.live == 0 end) end
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
local run = groups.run

--- results, errors = groups.map(list, fn [, {concurrency = n}])
function groups.map(list, fn, opts)
  if type(list) ~= "table" then error(format("map: list must be a table (got %s)", type(list)), 2) end
  if type(fn) ~= "function" then error(format("map: fn must be a function (got %s)", type(fn)), 2) end
  local n = #list
  local concurrency = n
  if opts ~= nil then
    if type(opts) ~= "table" then error(format("map: options must be a table (got %s)", type(opts)), 2) end
    for k in pairs(opts) do
      if not MAP_OPTIONS[k] then options.unknown("map", k, MAP_OPTIONS, 2) end
    end
    local c = opts.concurrency
    if c ~= nil then
      if type(c) ~= "number" or c < 1 or c % 1 ~= 0 then
        bad_option("map", "concurrency", "a positive integer", c, 2)
      end
      concurrency = c
    end
  end
  local results, failures = { n = n }, {}
  if n == 0 then return results, failures end
  return run(function()
    local next_index = 0
    local function worker()
      while next_index < n do
        next_index = next_index + 1
        local i = next_index
        results[i], failures[i] = fn(list[i], i)
      end
    end
    local workers = {}
    for w = 1, min(concurrency, n) do workers[w] = spawn(worker) end
    for w = 1, #workers do
      workers[w]:join()
      if workers[w].failed ~= nil then
        for other = 1, #workers do workers[other]:cancel() end
        error(workers[w].failed, 0)
      end
    end
    return results, failures
  end)
end

return groups
