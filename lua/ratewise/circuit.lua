-- Circuit breakers, one per origin ("scheme://host:port"), in the shape
-- fetch's `circuit` option expects: allow(origin) before each attempt,
-- record(origin, outcome) after it.
--
--   closed    -- requests go through; `failures` failures in a row open it
--   open      -- nothing goes through for `cooldown` seconds
--   half_open -- one trial request goes through; its outcome closes the
--                circuit or opens it for another cooldown
--
-- Transitions out of "open" happen when they are first noticed (by allow,
-- state or states): no timer runs, so an idle breaker costs nothing.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local options = require "ratewise.options"

local now = core.now
local format = string.format
local huge = math.huge
local type, tostring, pairs, error, setmetatable = type, tostring, pairs, error, setmetatable

local circuit = {}

local Circuit = {}
Circuit.__index = Circuit
Circuit.__name = "ratewise.Circuit"

local outcomes = { success = true, failure = true, neutral = true }

local function check_options(opts)
  if type(opts) ~= "table" then
    error(format("circuit: expected a table of options (got %s)", type(opts)), 3)
  end
  for k, v in pairs(opts) do
    if k == "failures" then
      if type(v) ~= "number" or v < 1 or v % 1 ~= 0 or v == huge then
        errors.bad_option("circuit", "failures", "a positive integer", v, 3)
      end
    elseif k == "cooldown" then
      if type(v) ~= "number" or v ~= v or v <= 0 or v == huge then
        errors.bad_option("circuit", "cooldown", "a positive number of seconds", v, 3)
      end
    elseif k == "on_change" then
      if type(v) ~= "function" then
        errors.bad_option("circuit", "on_change", "a function", v, 3)
      end
    else
      options.unknown("circuit", k, { "failures", "cooldown", "on_change" }, 3)
    end
  end
end

--- c = circuit.new{failures = 5, cooldown = 30, on_change = fn}
function circuit.new(opts)
  check_options(opts)
  return setmetatable({
    failures = opts.failures or 5,
    cooldown = opts.cooldown or 30,
    on_change = opts.on_change,
    -- origin -> { state, count, until_t (open: end of cooldown; half_open:
    -- when a trial that never reported is given up), trial_out }
    origins = {},
  }, Circuit)
end

local function check_origin(method, origin)
  if type(origin) ~= "string" or origin == "" then
    error(format("circuit: %s: origin must be a non-empty string (got %s)", method, errors.shown(origin)), 3)
  end
end

-- Moves an origin to a new state and tells the hook. The state is changed
-- first, so that a hook that raises leaves the breaker consistent.
local function move(self, origin, entry, to)
  local from = entry.state
  entry.state = to
  if self.on_change then
    local ok, err = compat.pcall(self.on_change, origin, from, to)
    if not ok then
      error(format("circuit: the 'on_change' hook raised an error: %s", tostring(err)), 0)
    end
  end
end

-- The entry of an origin after the cooldown, if any, has been noticed.
-- Origins in good health (closed, nothing counted) have no entry at all,
-- which keeps a breaker that sees many hosts small.
local function current(self, origin)
  local entry = self.origins[origin]
  if entry and entry.state == "open" and now() >= entry.until_t then
    entry.trial_out = false
    move(self, origin, entry, "half_open")
  end
  return entry
end

local function open(self, origin, entry)
  entry.until_t = now() + self.cooldown
  entry.trial_out = false
  entry.count = 0
  move(self, origin, entry, "open")
end

--- true | false, seconds_until_trial = c:allow(origin)
function Circuit:allow(origin)
  check_origin("allow", origin)
  local entry = current(self, origin)
  if not entry or entry.state == "closed" then return true end
  local t = now()
  if entry.state == "open" then return false, entry.until_t - t end
  -- Half-open: one trial at a time. A trial whose caller never reported
  -- (it raised, or was cancelled) is given up after another cooldown, so
  -- that it cannot keep the circuit shut for good.
  if entry.trial_out and t < entry.until_t then return false, entry.until_t - t end
  entry.trial_out = true
  entry.until_t = t + self.cooldown
  return true
end

--- c:record(origin, outcome): outcome is "success", "failure" or "neutral"
-- (an answer that says nothing of the server's health, such as a 404).
function Circuit:record(origin, outcome)
  check_origin("record", origin)
  if not outcomes[outcome] then
    error(format("circuit: record: outcome must be \"success\", \"failure\" or \"neutral\" (got %s)",
      errors.shown(outcome)), 2)
  end
  if outcome == "neutral" then return end
  local entry = current(self, origin)
  if not entry then
    if outcome == "failure" then
      entry = { state = "closed", count = 0, until_t = 0, trial_out = false }
      self.origins[origin] = entry
    else
      return
    end
  end
  local state = entry.state
  if state == "closed" then
    if outcome == "success" then
      self.origins[origin] = nil
    else
      entry.count = entry.count + 1
      if entry.count >= self.failures then open(self, origin, entry) end
    end
  elseif state == "half_open" then
    -- Only a trial's outcome decides. A record with no trial out comes from
    -- a request let through before the circuit opened, and is stale.
    if not entry.trial_out then return end
    if outcome == "success" then
      self.origins[origin] = nil
      move(self, origin, entry, "closed")
    else
      open(self, origin, entry)
    end
  end
  -- Open: late outcomes of requests sent before it opened change nothing;
  -- the cooldown runs its course.
end

--- "closed" | "open" | "half_open" = c:state(origin)
function Circuit:state(origin)
  check_origin("state", origin)
  local entry = current(self, origin)
  return entry and entry.state or "closed"
end

--- {origin = state} = c:states(): the origins the breaker holds state for
-- (failures counted, open or half-open); an origin in good health is not
-- listed, and c:state says "closed" for it.
function Circuit:states()
  local out = {}
  for origin in pairs(self.origins) do
    local entry = current(self, origin)
    out[origin] = entry.state
  end
  return out
end

Circuit.__tostring = function(c)
  local open_count = 0
  for _, entry in pairs(c.origins) do
    if entry.state ~= "closed" then open_count = open_count + 1 end
  end
  return format("ratewise.Circuit (failures %d, cooldown %g s, %d origin%s not closed)", c.failures,
    c.cooldown, open_count, open_count == 1 and "" or "s")
end

return circuit
