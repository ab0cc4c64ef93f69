-- Several limiters acquired as one, for APIs that count more than one thing
-- at once (requests per minute and tokens per minute, say):
--
--   local both = limiters.new{rpm, cost = tpm}
--   both:acquire(n)   -- 1 token of rpm and n of tpm, together
--
-- or, with a name for each limit, a cost for each (an LLM API's requests,
-- input and output tokens per minute):
--
--   local llm = limiters.new{requests = rpm, input_tokens = itpm, output_tokens = otpm}
--   llm:acquire{requests = 1, input_tokens = 900, output_tokens = 1000}
--   llm:settle(taken, {output_tokens = 230})  -- the answer used less
--
-- Nothing is held while waiting. Taking rpm's token first and then waiting
-- for tpm would keep that token from everyone else for the whole wait (and
-- two such callers, each holding what the other needs, would starve each
-- other). Instead a caller asks every member how long until it could serve,
-- sleeps the longest of those, and takes from all of them only when all can
-- serve at once; with no yield in between, the takes cannot fail.
--
-- The price: waiters on a composite are not queued first come, first
-- served (a bucket's own acquire is). A caller asking for few tokens may get
-- in ahead of one asking for many.
local runtime = require "ratewise.runtime"
local errors = require "ratewise.errors"
local options = require "ratewise.options"
local bad_seconds = require("ratewise.scheduler").bad_seconds

local format = string.format
local huge = math.huge
local now = require("ratewise.core").now
local type, tostring, pairs, next, pcall, error, setmetatable, getmetatable = type, tostring, pairs, next, pcall,
  error, setmetatable, getmetatable

local limiters = {}

local Limiters = {}
Limiters.__index = Limiters
Limiters.__name = "ratewise.Limiters"

-- Waits shorter than this after a take that failed are rounded up, so that
-- a loop can never spin on a wait of zero.
local MIN_RETRY_WAIT = 1e-4

local function is_limiter(v)
  local t = type(v)
  if t ~= "table" and t ~= "userdata" then return false end
  local ok, yes = pcall(function()
    return type(v.wait_time) == "function" and type(v.take) == "function" and type(v.refund) == "function"
  end)
  return ok and yes
end

-- (a field look-up, for pcall: a member's __index may raise)
local function field_of(object, name)
  return object[name]
end

local function capacity_of(member)
  local ok, fn = pcall(field_of, member, "capacity")
  if ok and type(fn) == "function" then return fn(member) end
  return huge
end

local function not_a_limiter(what, v, level)
  error(format("limiters: %s must be a limiter with wait_time, take and refund, such as rw.bucket "
    .. "(got %s)", what, type(v) == "table" and "a table without them"
      or type(v) == "string" and "a string" -- a Redis URL, say, with its password
      or errors.shown(v)), level)
end

-- The members of the `cost` option: one limiter or an array of them.
local function cost_members(cost)
  if is_limiter(cost) then return { cost } end
  if type(cost) ~= "table" or getmetatable(cost) ~= nil or #cost == 0 then
    not_a_limiter("option 'cost'", cost, 4)
  end
  local list = {}
  for k in pairs(cost) do
    if type(k) ~= "number" or k % 1 ~= 0 or k < 1 or k > #cost then
      error(format("limiters: option 'cost' must be a limiter or an array of limiters (found key %s)",
        tostring(k)), 3)
    end
  end
  for i = 1, #cost do
    if not is_limiter(cost[i]) then not_a_limiter("cost member #" .. i, cost[i], 4) end
    list[i] = cost[i]
  end
  return list
end

-- A composite's fields:
--   members  every limiter, in the order they are asked
--   names    false, or each member's name (the named form)
--   by_name  the named form's members by name
--   ones     the positional form: how many members (the first) take 1 per
--            acquire; the rest take the cost
--   per_limit  the positional form's one cost member when it has named
--            limits (a client's limiter under a route's): the cost is then
--            a table by name, which it takes whole; else false

-- Whether v is a composite with named limits.
local function has_names(v)
  return getmetatable(v) == Limiters and v.names and true or false
end

local function positional(spec, count)
  local members, seen = {}, {}
  for i = 1, count do
    local member = spec[i]
    if not is_limiter(member) then not_a_limiter("member #" .. i, member, 4) end
    if has_names(member) then
      error(format("limiters: member #%d has named limits (%s), which take a cost per limit, not the 1 a "
        .. "member here takes: give it as the cost member ({ a, cost = named })", i, tostring(member)), 3)
    end
    if capacity_of(member) < 1 then
      error(format("limiters: member #%d holds fewer than the 1 token each acquire takes of it", i), 3)
    end
    seen[member] = "member #" .. i
    members[i] = member
  end
  local by_cost = spec.cost ~= nil and cost_members(spec.cost) or {}
  for i = 1, #by_cost do
    local member = by_cost[i]
    if seen[member] then
      error(format("limiters: the same limiter is given twice (%s and cost member #%d)", seen[member], i), 3)
    end
    seen[member] = "cost member #" .. i
    members[count + i] = member
  end
  if #members == 0 then
    error("limiters: expected at least one limiter", 3)
  end
  local per_limit = false
  for i = 1, #by_cost do
    if has_names(by_cost[i]) then
      if #by_cost > 1 then
        error(format("limiters: cost member #%d has named limits: it must then be the only cost member (the "
          .. "cost is a table by its names)", i), 3)
      end
      per_limit = by_cost[i]
    end
  end
  return setmetatable({ members = members, names = false, by_name = false, ones = count,
    per_limit = per_limit }, Limiters)
end

local function named(spec)
  local names, seen = {}, {}
  for k in pairs(spec) do names[#names + 1] = k end
  table.sort(names) -- (a fixed order: the same for every process sharing the limits)
  local members, by_name = {}, {}
  for i = 1, #names do
    local name = names[i]
    local member = spec[name]
    if not name:match("^[%a_][%w_]*$") then
      error(format("limiters: a limit's name must be a word such as \"tokens\" (got %q)", name), 3)
    end
    if not is_limiter(member) then not_a_limiter("member '" .. name .. "'", member, 4) end
    if seen[member] then
      error(format("limiters: the same limiter is given twice ('%s' and '%s')", seen[member], name), 3)
    end
    seen[member] = name
    members[i], by_name[name] = member, member
  end
  return setmetatable({ members = members, names = names, by_name = by_name, ones = 0, per_limit = false },
    Limiters)
end

--- l = limiters.new{a, b, ..., cost = c | {c1, c2, ...}}
--- l = limiters.new{requests = a, tokens = b, ...}: a cost per limit (a table by name)
function limiters.new(spec)
  if type(spec) ~= "table" then
    error(format("limiters: expected a table of limiters (got %s)", type(spec)), 2)
  end
  local count = #spec
  local words, others = false, false
  for k in pairs(spec) do
    if type(k) == "string" and k ~= "cost" then
      words = k
    elseif k == "cost" or (type(k) == "number" and k % 1 == 0 and k >= 1 and k <= count) then
      others = k == "cost" and "cost" or "#" .. k
    else
      error(format("limiters: key %s is not part of the array of limiters (1 to %d)", tostring(k), count), 2)
    end
  end
  if words and others then
    -- (a word that holds no limiter is a misspelt option: "costs")
    if not is_limiter(spec[words]) then options.unknown("limiters", words, { "cost" }, 2) end
    error(format("limiters: unknown option '%s' beside %s: give either named limits ({ requests = a, "
      .. "tokens = b }, a cost per name) or an array of limiters with a cost member ({ a, cost = b }), not both",
      words, others == "cost" and "'cost'" or "member " .. others), 2)
  end
  if words then return named(spec) end
  return positional(spec, count)
end

local function member_label(self, i)
  local names = self.names
  if names then return format("member '%s'", names[i]) end
  if i <= self.ones then return format("member #%d", i) end
  return format("cost member #%d", i - self.ones)
end

-- What member i takes of a cost (checked: check_cost's).
local function amount(self, i, cost)
  local names = self.names
  if names then return cost[names[i]] or 0 end
  if i <= self.ones then return 1 end
  return cost
end

-- Whether an amount takes anything: a positive number, or a cost per
-- limit (per_limit's, which takes it whole).
local function takes(n)
  return type(n) == "table" or n > 0
end

local function names_list(self)
  return table.concat(self.names, ", ")
end

-- Why a named limit cannot be asked for n, more than its bucket holds
-- (held), or nil when it can: it must take the rest as debt (debit), and
-- no more than a minute of its rate: an API that limits it per minute
-- could never admit more in one request, and such a cost (a max_tokens of
-- a million) is a mistake to name, not days of debt to wait out.
local function oversized(member, n, capacity)
  local ok, debit_fn = pcall(field_of, member, "debit")
  if not (ok and type(debit_fn) == "function") then
    return format("whose capacity is %g and which cannot take the rest as debt (it has no debit): it could never "
      .. "be served", capacity)
  end
  local rate_ok, rate = pcall(function() return member:rate() end)
  if rate_ok and type(rate) == "number" and n > rate * 60 then
    return format("more than its bucket holds (%g) and than a minute of its rate (%g): an API that limits it per "
      .. "minute could never admit that much in one request", capacity, rate * 60)
  end
  return nil
end

-- A cost, checked in `method`'s terms: for the positional form a positive
-- number (1 when nil), for the named form a table of amounts by name (nil:
-- 1 of "requests", when there is such a member), and whether it asks a
-- limit for more than it holds (over: what only then is held back, held).
local function check_cost(self, method, cost)
  local names = self.names
  if self.per_limit then return check_cost(self.per_limit, method, cost) end
  if not names then
    if cost == nil then return 1 end
    if type(cost) ~= "number" or cost ~= cost or cost <= 0 or cost == huge then
      error(format("limiters: %s: token count must be a positive number (got %s)", method, errors.shown(cost)), 3)
    end
    local members = self.members
    for i = self.ones + 1, #members do
      local capacity = capacity_of(members[i])
      if cost > capacity then
        error(format("limiters: %s: %g tokens asked of %s, whose capacity is %g: it could never be served",
          method, cost, member_label(self, i), capacity), 3)
      end
    end
    return cost
  end
  if cost == nil then
    if self.by_name.requests then return { requests = 1 } end
    error(format("limiters: %s: give the cost per limit, a table by name (the limits are %s)", method,
      names_list(self)), 3)
  end
  if type(cost) ~= "table" then
    error(format("limiters: %s: give the cost per limit: { requests = 1, tokens = n } (the limits are %s; "
      .. "got %s)", method, names_list(self), errors.shown(cost)), 3)
  end
  local over -- a limit asked for more than it holds (held)
  for name, n in pairs(cost) do
    local member = self.by_name[name]
    if not member then
      error(format("limiters: %s: the cost names %s, which is not one of the limits (%s)", method,
        type(name) == "string" and format("'%s'", name) or errors.shown(name), names_list(self)), 3)
    end
    if type(n) ~= "number" or n ~= n or n < 0 or n == huge then
      error(format("limiters: %s: the cost of '%s' must be a non-negative number (got %s)", method, name,
        errors.shown(n)), 3)
    end
    local capacity = capacity_of(member)
    if n > capacity then
      local why = oversized(member, n, capacity)
      if why then error(format("limiters: %s: %g tokens asked of member '%s', %s", method, n, name, why), 3) end
      over = true
    end
  end
  return cost, over
end

-- A named limit asked for more than its bucket holds (an LLM request whose
-- max_tokens is more than the few seconds of a minute's limit its bucket
-- keeps) waits for a full bucket, takes it, and takes the rest at once as
-- debt, which the callers after it wait out: the limit holds over its
-- minute, whatever one request asks, where a request that could never be
-- served would have failed. held: the part member i waits for and takes;
-- the rest is debited once every member has served (take).
local function held(self, i, n)
  if not self.names or type(n) ~= "number" then return n end
  local capacity = capacity_of(self.members[i])
  if n > capacity then return capacity end
  return n
end

-- A member's wait must be a finite number: NaN compares false with
-- everything (acquire would retry at once, over and over), and an infinite
-- wait never ends. Either is a broken limiter, named in the error.
local function wait_error(self, w, i)
  return format("limiters: %s answered a wait of %s: a limiter's wait must be a finite number of seconds",
    member_label(self, i), bad_seconds(w) or tostring(w))
end

-- A member that cannot answer (a shared bucket whose Redis is down)
-- answers nil and an error table; the composite answers the same.
local function unavailable(w, why)
  return w == nil and type(why) == "table"
end

-- Takes n of member at once, into debt if need be: what the server has
-- already counted is not waited for, but the callers after it wait.
-- A member without debit takes what it can serve now.
local function debit(member, n)
  local ok, fn = pcall(field_of, member, "debit")
  if ok and type(fn) == "function" then return fn(member, n) end
  local capacity = capacity_of(member)
  if n > capacity then n = capacity end
  return member:take(n)
end

local function wait_time(self, cost, over)
  local wait = 0
  local members = self.members
  for i = 1, #members do
    local n = amount(self, i, cost)
    if over then n = held(self, i, n) end
    if takes(n) then
      local w, why = members[i]:wait_time(n)
      if unavailable(w, why) then return nil, why end
      if bad_seconds(w) then error(wait_error(self, w, i), 0) end
      if w > wait then wait = w end
    end
  end
  return wait
end

-- Gives back what the first `taken` members took of cost (part: only the
-- part each holds, before any debt was taken).
local function give_back(self, cost, taken, part)
  local members = self.members
  for i = 1, taken do
    local n = amount(self, i, cost)
    if part then n = held(self, i, n) end
    if takes(n) then members[i]:refund(n) end
  end
end

-- The member whose take failed says how long until it could serve, with
-- what was taken before it still held: a limiter that shows up twice
-- through nested composites is then waited for long enough.
-- Answers nil and the error when that wait is not a finite number.
local function failed_wait(self, i, n, seconds)
  if type(seconds) ~= "number" then seconds = self.members[i]:wait_time(n) end
  if bad_seconds(seconds) then return nil, wait_error(self, seconds, i) end
  if seconds < MIN_RETRY_WAIT then seconds = MIN_RETRY_WAIT end
  return seconds
end

local function take(self, cost, over)
  local wait, why = wait_time(self, cost, over)
  if wait == nil then return nil, why end
  if wait > 0 then return false, wait end
  local members = self.members
  for i = 1, #members do
    local n = amount(self, i, cost)
    if over then n = held(self, i, n) end
    if takes(n) then
      local ok, seconds = members[i]:take(n)
      if unavailable(ok, seconds) then
        give_back(self, cost, i - 1, over)
        return nil, seconds
      end
      if not ok then
        local err
        seconds, err = failed_wait(self, i, n, seconds)
        give_back(self, cost, i - 1, over)
        if err then error(err, 0) end
        return false, seconds
      end
    end
  end
  if over then
    for i = 1, #members do
      local asked = amount(self, i, cost)
      local n = held(self, i, asked)
      if asked > n then debit(members[i], asked - n) end
    end
  end
  return true
end

--- seconds = l:wait_time([cost]): until every member could serve (0: now),
-- taking nothing.
function Limiters:wait_time(cost)
  return wait_time(self, check_cost(self, "wait_time", cost))
end

--- true | false, seconds = l:take([cost]): takes from every member, or from
-- none of them.
function Limiters:take(cost)
  return take(self, check_cost(self, "take", cost))
end

--- l:refund([cost]): gives back what a take of cost took.
function Limiters:refund(cost)
  cost = check_cost(self, "refund", cost)
  give_back(self, cost, #self.members)
end

--- l:settle(taken, actual): what an answer says it really cost, once it
-- has ended. For each limit: less than taken gives the difference back;
-- more takes the extra at once, into debt (the server counted it already),
-- so that the callers after it wait for it. A limit actual does not name
-- (the named form), or an actual of nil, stays as taken; a name actual
-- gives that is not one of the limits is passed over (a provider tells of
-- every limit it counts).
function Limiters:settle(taken, actual)
  taken = check_cost(self, "settle", taken)
  if actual == nil then return end
  -- (the members taking 1 took what they take)
  if self.per_limit then return self.per_limit:settle(taken, actual) end
  if self.names then
    if type(actual) ~= "table" then
      error(format("limiters: settle: the actual cost must be a table by name, as the cost is (got %s)",
        errors.shown(actual)), 2)
    end
    for name, n in pairs(actual) do
      if self.by_name[name] and (type(n) ~= "number" or n ~= n or n < 0 or n == huge) then
        error(format("limiters: settle: the actual cost of '%s' must be a non-negative number (got %s)", name,
          errors.shown(n)), 2)
      end
    end
  elseif type(actual) ~= "number" or actual ~= actual or actual < 0 or actual == huge then
    error(format("limiters: settle: the actual cost must be a non-negative number (got %s)",
      errors.shown(actual)), 2)
  end
  local members, names = self.members, self.names
  for i = 1, #members do
    local was = amount(self, i, taken)
    local is = names and actual[names[i]] or not names and amount(self, i, actual)
    if is and is < was then
      members[i]:refund(was - is)
    elseif is and is > was then
      debit(members[i], is - was)
    end
  end
end

--- capacity = l:capacity(): the most tokens one acquire may ask for; for
-- the named form, a table of what each limit's bucket holds (a cost above
-- it takes a full bucket and the rest as debt: held).
function Limiters:capacity()
  local members = self.members
  if self.per_limit then return self.per_limit:capacity() end
  if self.names then
    local each = {}
    for i = 1, #members do each[self.names[i]] = capacity_of(members[i]) end
    return each
  end
  local capacity = huge
  for i = self.ones + 1, #members do
    local c = capacity_of(members[i])
    if c < capacity then capacity = c end
  end
  return capacity
end

--- true | false, wait = l:acquire([cost [, sleep [, max_wait]]]): waits
-- until every member can serve, holding nothing meanwhile, then takes from
-- all of them. With max_wait, answers false (taking nothing) as soon as it
-- is clear that the wait would run past max_wait seconds.
function Limiters:acquire(cost, sleep, max_wait)
  local over
  cost, over = check_cost(self, "acquire", cost)
  if sleep ~= nil and type(sleep) ~= "function" then
    error(format("limiters: acquire: sleep must be a function (got %s)", type(sleep)), 2)
  end
  if max_wait ~= nil and (type(max_wait) ~= "number" or max_wait ~= max_wait or max_wait < 0) then
    error(format("limiters: acquire: max_wait must be a non-negative number of seconds (got %s)",
      errors.shown(max_wait)), 2)
  end
  local give_up_at = max_wait and now() + max_wait
  while true do
    local ok, wait = take(self, cost, over)
    if ok then return true end
    if ok == nil then return nil, wait end -- a member could not answer
    if give_up_at and now() + wait > give_up_at then return false, wait end
    runtime.sleep(wait, sleep)
  end
end

local function sync_member(member, remaining, reset_in, limit, window)
  if type(member.sync) == "function" then member:sync(remaining, reset_in, limit, window) end
end

--- l:sync(remaining [, reset_in [, limit [, window]]]): what a server says
-- of its request quota (a provider's observe hook) goes to the members that
-- count requests: the ones taking 1 per acquire, or the one named
-- "requests"; a cost member meters something else (tokens).
function Limiters:sync(remaining, reset_in, limit, window)
  if self.names then
    local requests = self.by_name.requests
    if requests then sync_member(requests, remaining, reset_in, limit, window) end
    return
  end
  local members = self.members
  for i = 1, self.ones do sync_member(members[i], remaining, reset_in, limit, window) end
end

--- synced = l:sync_limit(name, remaining [, reset_in [, limit [, window]]]):
-- what a server says of one named limit ("tokens", "output_tokens") goes
-- to that member. A provider tells of every limit its headers name: one
-- the composite does not have is passed over (false).
function Limiters:sync_limit(name, remaining, reset_in, limit, window)
  if type(name) ~= "string" then
    error(format("limiters: sync_limit: the limit's name must be a string (got %s)", errors.shown(name)), 2)
  end
  if self.per_limit then return self.per_limit:sync_limit(name, remaining, reset_in, limit, window) end
  local member = self.by_name and self.by_name[name]
  if not member then return false end
  sync_member(member, remaining, reset_in, limit, window)
  return true
end

--- l:observe(res [, sent_at]): what fetch tells of each response goes to
-- every member that learns from it (a throttle may be any of the limits).
function Limiters:observe(res, sent_at)
  local members = self.members
  for i = 1, #members do
    if type(members[i].observe) == "function" then members[i]:observe(res, sent_at) end
  end
end

-- Limits per model: a limiter for each model an API counts apart
-- (OpenAI's and Anthropic's limits are each model's own), chosen by the
-- model a request names (its JSON body's "model"). fetch asks for_request
-- before it works out the cost, and the chosen limiter serves the whole
-- call: its acquire, settle, sync and observe.
local ByModel = {}
ByModel.__index = ByModel
ByModel.__name = "ratewise.ByModel"

local function model_names(self)
  local names = {}
  for name in pairs(self.models) do names[#names + 1] = format("%q", name) end
  table.sort(names)
  return table.concat(names, ", ")
end

--- l = limiters.by_model{["gpt-4o"] = limiter, ["gpt-4o-mini"] = limiter, ... [, default = limiter]}
function limiters.by_model(spec)
  if type(spec) ~= "table" or getmetatable(spec) ~= nil then
    error(format("limiters: by_model: expected a table of limiters by model name (got %s)",
      errors.shown(spec)), 2)
  end
  local models, default = {}, nil
  for name, member in pairs(spec) do
    if type(name) ~= "string" or name == "" then
      error(format("limiters: by_model: a model's name must be a non-empty string (got %s)",
        errors.shown(name)), 2)
    end
    if not is_limiter(member) then
      not_a_limiter(name == "default" and "by_model's default" or format("by_model's limiter of model %q", name),
        member, 3)
    end
    if name == "default" then default = member else models[name] = member end
  end
  if next(models) == nil and default == nil then
    error("limiters: by_model: expected the limiter of at least one model", 2)
  end
  -- (unnamed: the limiter of a request that names no model when there is
  -- no default; beneath's)
  return setmetatable({ models = models, default = default or false, unnamed = false }, ByModel)
end

--- limiter | nil = l:for_request(request): the limiter of the model the
-- request names (request.json.model, as fetch gives a cost hook the
-- request), else the default; raises for a model with neither, naming the
-- models it has. A request that names no model (a list of the models, say)
-- is not one model's to count: the default, or nil (no limit).
function ByModel:for_request(request)
  local body = type(request) == "table" and request.json
  local model = type(body) == "table" and body.model or nil
  if type(model) ~= "string" then return self.default or self.unnamed or nil end
  local chosen = self.models[model] or self.default
  if not chosen then
    error(format("limiters: by_model: no limits for model %q, and no default (the models with limits are %s): "
      .. "give its limits, or a default", model, model_names(self)), 0)
  end
  return chosen
end

--- l:model(name): the limiter of model `name` (or the default); nil
-- for neither.
function ByModel:model(name)
  return self.models[name] or self.default or nil
end

--- limiters.is_by_model(v): whether v is a choice by model (by_model's).
function limiters.is_by_model(v)
  return getmetatable(v) == ByModel
end

--- l2 = l:beneath(limiter): the same choice by model, each model's limiter
-- (and the default) taken together with `limiter`, which takes 1 per
-- request (rw.limiters{limiter, cost = chosen}): a client's route with a
-- limiter of its own. A request that names no model takes `limiter` alone
-- (and the default's, if any); a model with neither still raises.
function ByModel:beneath(limiter)
  local models = {}
  for name, chosen in pairs(self.models) do models[name] = limiters.new { limiter, cost = chosen } end
  return setmetatable({ models = models, default = self.default and limiters.new { limiter, cost = self.default },
    unnamed = limiter }, ByModel)
end

-- By itself it takes nothing: which limits apply is the request's to say.
function ByModel.acquire()
  error("limiters: by_model: acquire needs a request's model: give it as fetch's or a client's limiter (which "
    .. "asks for_request), or acquire from l:model(name)", 2)
end

ByModel.__tostring = function(l)
  return format("ratewise.ByModel (%s%s)", model_names(l), l.default and ", default" or "")
end

Limiters.__tostring = function(l)
  if l.names then return format("ratewise.Limiters (%s)", names_list(l)) end
  return format("ratewise.Limiters (%d taking 1, %d taking the cost)", l.ones, #l.members - l.ones)
end

return limiters
