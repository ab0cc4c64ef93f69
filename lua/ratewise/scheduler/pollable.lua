-- The scheduler as a pollable (the shape cqueues.poll takes, and
-- luasocket's select): a host waits until its descriptor is readable or its
-- timeout passes, then calls rw.step(0). The timeout is what a host that
-- cannot see the descriptor needs: a nap while anything is in flight, the
-- scheduler's own timeout otherwise, on every poller.
local loop = require "ratewise.scheduler.loop"
local state = require "ratewise.scheduler.state"

local S = state.record
local engine = state.engine
local next_nap, wait_for = loop.next_nap, loop.wait_for

local pollable = {}

-- The pollable's own nap: how often a host that only counts time is told
-- to look while anything is in flight (see loop.wait_for).
S.pollable_nap, S.pollable_seen = loop.NAP_FIRST, S.progress

local function pollfd() return engine():pollfd() end
local function dirty() return false end
local function events() return "r" end

pollable.pollable = {
  pollfd = pollfd,
  getfd = pollfd,
  dirty = dirty,
  events = events,
  timeout = function()
    S.pollable_nap = next_nap(S.pollable_nap, S.progress ~= S.pollable_seen)
    S.pollable_seen = S.progress
    return wait_for(S.pollable_nap, false)
  end,
}

--- The engine's descriptor alone, without a timeout, for a host's driver
-- that waits on it and gives its own seconds (cqueues.poll).
pollable.descriptor = {
  pollfd = pollfd,
  getfd = pollfd,
  dirty = dirty,
  events = events,
  timeout = function() return nil end,
}

return pollable
