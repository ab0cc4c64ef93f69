-- rw.client: one API's base URL, headers, provider policy, limits and
-- resilience settings in one object, with JSON in and out.
local adaptive = require "ratewise.adaptive"
local circuit_mod = require "ratewise.circuit"
local compat = require "ratewise.compat"
local fetch = require "ratewise.fetch"
local fast_paths = require "ratewise.fetch.cache"
local headers_mod = require "ratewise.headers"
local json = require "ratewise.json"
local limiters_mod = require "ratewise.limiters"
local policy_mod = require "ratewise.policy"
local providers = require "ratewise.providers.known"
local retry_budget_mod = require "ratewise.retry_budget"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local options = require "ratewise.options"

local format, lower, upper, find, byte = string.format, string.lower, string.upper, string.find, string.byte
local SLASH = byte("/")
local sort = table.sort
local type, tostring, pairs, ipairs, setmetatable, getmetatable, rawget =
  type, tostring, pairs, ipairs, setmetatable, getmetatable, rawget
local now = core.now

local client = {}

local Client = {}
Client.__index = Client

-- The options of rw.client (its own, and the fetch options it takes as
-- defaults for every call: options.client_defaults), from the schema.
local client_options, fetch_defaults = options.client, options.client_defaults

-- Per-call options that are the client's own, not fetch's.
local call_only = { json = true, query = true, cost = true, cross_origin = true }

-- Every option a call may give (options.call).
local call_options = options.call

-- Only these are shared between identical requests in flight: replaying a
-- response to a POST would swallow a side effect.
local shareable = { GET = true, HEAD = true, OPTIONS = true }


---------------------------------------------------------------------------
-- Construction

-- A provider's name, a policy (or a table of hooks), or false for none
-- (not even the provider of the API at base_url's host).
local function resolve_provider(p)
  if p == nil or p == false then return p end
  if type(p) ~= "string" and type(p) ~= "table" then
    errors.bad_option("client", "provider", "a provider's name, a policy or false", p, 4)
  end
  if type(p) == "string" then return providers.provider(p, "client", 4) end
  return policy_mod.new(p)
end

-- `true` or an options table builds one; an object is used as it is.
local function resolve_object(v, make)
  if v == nil or v == false then return nil end
  if v == true then return make({}) end
  if type(v) == "table" and getmetatable(v) == nil then return make(v) end
  return v
end

local function compile_routes(routes)
  if routes == nil then return nil end
  if type(routes) ~= "table" then
    errors.bad_option("client", "routes", "a table", routes, 3)
  end
  local list = {}
  -- { {"/search/", limiter}, ... } keeps the caller's order; a map is sorted
  -- so that longer (more specific) prefixes are tried first.
  for k, v in pairs(routes) do
    local route, limiter
    if type(k) == "number" then
      if type(v) ~= "table" or type(v[1]) ~= "string" or v[2] == nil then
        error("client: each routes entry must be {path prefix or pattern, limiter}", 3)
      end
      route, limiter = v[1], v[2]
    elseif type(k) == "string" then
      route, limiter = k, v
    else
      error("client: routes keys must be path prefixes or patterns", 3)
    end
    if type(limiter) ~= "table" and type(limiter) ~= "userdata" then
      error(format("client: the limiter of route '%s' must be an object with acquire", route), 3)
    end
    list[#list + 1] = { route = route, limiter = limiter, pattern = route:sub(1, 1) == "^",
      order = type(k) == "number" and k or nil }
  end
  sort(list, function(a, b)
    if a.order and b.order then return a.order < b.order end
    if a.order or b.order then return a.order ~= nil end
    if #a.route ~= #b.route then return #a.route > #b.route end
    return a.route < b.route
  end)
  return list
end

-- A copy of the `secret_headers` option, checked.
local function secret_list(names)
  headers_mod.secret_set(names, "client", 4)
  local list = {}
  for i, name in ipairs(names) do list[i] = name end
  return list
end

-- The `cache` option: {ttl = seconds [, max_entries = n]} (options.cache_schema).
local cache_fields = {}
for _, entry in ipairs(options.cache_schema) do cache_fields["cache." .. entry.name] = entry end
local function check_cache(cache)
  if type(cache) ~= "table" or cache.ttl == nil then
    error("client: option 'cache' must be {ttl = seconds [, max_entries = n]}", 3)
  end
  for k, v in pairs(cache) do
    options.check("client", cache_fields, "cache." .. tostring(k), v, 3)
  end
end

--- c = rw.client{base_url = ..., ...}
function client.new(opts)
  if type(opts) ~= "table" then
    error(format("client: expected a table of options (got %s)", type(opts)), 2)
  end
  for k in pairs(opts) do
    if not client_options[k] then options.unknown("client", k, client_options, 2) end
  end
  local base = opts.base_url
  if type(base) ~= "string" or not base:lower():find("^https?://") then
    error(format("client: option 'base_url' must be an http:// or https:// URL (got %s)",
      type(base) == "string" and "a URL of another scheme" or type(base)), 2)
  end
  -- Paths are appended to base_url: after a query they would land in it
  -- ("/v1?key=K/items"), and after a fragment they would never be sent.
  -- (The URL is not quoted: a query may hold a key.)
  local cut = find(base, "[?#]")
  if cut then
    error(format("client: option 'base_url' must not have a %s (paths are appended to it); give query "
      .. "parameters with each call's 'query' option", byte(base, cut) == byte("?") and "query" or "fragment"), 2)
  end
  if opts.headers ~= nil and type(opts.headers) ~= "table" then
    errors.bad_option("client", "headers", "a table", opts.headers, 2, true) -- a string may hold a token
  end
  local conc = opts.concurrency
  if conc ~= nil and (type(conc) ~= "number" or conc < 1 or conc % 1 ~= 0) then
    errors.bad_option("client", "concurrency", "a positive integer", conc, 2)
  end
  if opts.on_event ~= nil and type(opts.on_event) ~= "function" then
    error("client: option 'on_event' must be a function", 2)
  end
  local cache = opts.cache
  if cache ~= nil then check_cache(cache) end
  for _, name in ipairs { "dedupe", "cross_origin" } do
    if opts[name] ~= nil and type(opts[name]) ~= "boolean" then
      errors.bad_option("client", name, "a boolean", opts[name], 2)
    end
  end
  -- Without a limiter of the caller's, one that sleeps until the server
  -- first throttles a request, then learns its rate (adaptive.lua): a
  -- client's calls share one API's limits, and retries alone, each on its
  -- own, keep a throttling server refusing most of them. false: none.
  local limiter, default_limiter = opts.limiter, false
  if limiter == nil then
    limiter, default_limiter = adaptive.new { dormant = true }, true
  elseif limiter == false then
    limiter = nil
  end
  local c = setmetatable({
    base_url = (base:gsub("/+$", "")),
    origin = headers_mod.origin(base),
    cross_origin = opts.cross_origin == true,
    headers = opts.headers or {},
    policy = resolve_provider(opts.provider),
    limiter = limiter,
    default_limiter = default_limiter, -- (a route's limiter, when it has one, stands alone)
    routes = compile_routes(opts.routes),
    semaphore = opts.concurrency and scheduler.semaphore(opts.concurrency) or nil,
    circuit = resolve_object(opts.circuit, circuit_mod.new),
    budget = resolve_object(opts.budget, retry_budget_mod.new),
    dedupe = opts.dedupe == nil and options.default("dedupe") or opts.dedupe,
    secret_headers = opts.secret_headers ~= nil and secret_list(opts.secret_headers) or nil,
    -- the responses kept (fetch.cache.responses), the requests in flight
    -- that identical ones join, both by the request's identity
    -- (fetch.cache.request_key, by the client's digester: fetch.cache.digester)
    responses = cache
      and fast_paths.responses(cache.ttl, cache.max_entries or cache_fields["cache.max_entries"].default),
    in_flight = {}, digester = false,
    on_event = opts.on_event,
    defaults = {},
    -- fetch counts the attempts, retries and waits into them (fetch.counters)
    counters = fetch.counters {
      requests = 0, attempts = 0, successes = 0, failures = 0, retries = 0, waits = 0, waited = 0,
      budget_refusals = 0, circuit_refusals = 0, deduped = 0, cache_hits = 0, in_flight = 0,
      statuses = {}, retries_by_status = {}, retries_by_source = {}, waits_by_source = {}, errors = {},
    },
    -- The fast-path caches of the client's calls (fetch.cache's policies):
    -- the call tables of calls that add no options, by method and limiter
    -- (weak: by the caller's limiter)
    plain_calls = {},
    last_path = false, last_url = false, -- the last path joined to base_url, and the URL it made
    -- the calls that gave no options, by method and path: { URL, call table }
    -- (bounded: fetch.cache.PLAIN_PATHS_KEPT a method)
    plain_paths = {},
  }, Client)
  for _, k in ipairs(fetch_defaults) do c.defaults[k] = opts[k] end
  -- the object options a call must share with the client to be shared or
  -- cached (options.identity's "object": its policy)
  c.own = { policy = c.policy }
  if c.dedupe or c.responses then c.digester = fast_paths.digester() end
  -- The defaults and objects are checked now, where they were given, not at the first request.
  local checked = {}
  for k, v in pairs(c.defaults) do checked[k] = v end
  checked.limiter, checked.circuit, checked.budget = c.limiter, c.circuit, c.budget
  fetch.check(c.base_url, checked)
  return c
end

---------------------------------------------------------------------------
-- Telemetry

local function bump(t, k, by)
  t[k] = (t[k] or 0) + (by or 1)
end

--- t = client:stats(): counters since the client was made.
function Client:stats()
  local n = self.counters
  -- (fetch counts statuses by number: the copy names them as strings)
  local function copy(t)
    local r = {}
    for k, v in pairs(t) do r[type(k) == "number" and tostring(k) or k] = v end
    return r
  end
  local stats = copy(n)
  for _, k in ipairs { "statuses", "retries_by_status", "retries_by_source", "waits_by_source", "errors" } do
    stats[k] = copy(n[k])
  end
  if self.circuit and self.circuit.states then stats.circuit = self.circuit:states() end
  if self.budget and self.budget.stats then stats.budget = self.budget:stats() end
  return stats
end

---------------------------------------------------------------------------
-- Requests

-- A header name in lower case. A name that is not a string raises fetch's
-- own error (headers.request_lines) at `level` (error's, seen from the
-- caller of this).
local function lower_name(k, level)
  if type(k) ~= "string" then headers_mod.request_lines({ [k] = "" }, nil, level + 2) end
  return lower(k)
end

-- The client's headers, then the call's, names compared case-insensitively
-- (a copy of base alone, without extra). Errors are for the caller of
-- Client:request.
local function merged_headers(base, extra)
  local out, names = {}, {}
  for k, v in pairs(base) do
    out[k] = v
    names[lower_name(k, 4)] = k
  end
  for k, v in pairs(extra or {}) do
    local name = lower_name(k, 4)
    local existing = names[name]
    if existing then out[existing] = nil end
    out[k] = v
    names[name] = k
  end
  return out
end

function Client:_limiter_for(path, explicit)
  if explicit ~= nil then return explicit or nil end
  local route
  if self.routes then
    for _, r in ipairs(self.routes) do
      if (r.pattern and find(path, r.route)) or (not r.pattern and path:sub(1, #r.route) == r.route) then
        route = r
        break
      end
    end
  end
  if not route then return self.limiter end
  if not self.limiter or self.default_limiter then return route.limiter end
  -- Both the route's quota and the API's overall quota apply, taken at once.
  -- The route's counts requests (and hears what the server says of them);
  -- the client's takes the call's cost.
  if not route.both then
    -- (a choice by model stays one: each model's limits beneath the route's)
    if limiters_mod.is_by_model(self.limiter) then
      route.both = self.limiter:beneath(route.limiter)
    else
      route.both = limiters_mod.new { route.limiter, cost = self.limiter }
    end
  end
  return route.both
end

-- The most of a path's first word an error shows.
local SHOWN_WORD = 24

-- What an error shows of a path that neither starts with / nor is an
-- http(s) URL: a URL's scheme alone (as fetch shows one), or the first
-- word of a path without its "/", which is what the caller needs to find
-- the call. Never the rest, which may hold a key in any form (a query, a
-- userinfo, "&key=...", a token as a path segment).
local function shown_path(path)
  local scheme = path:match("^(%a[%w+.-]*)://")
  if scheme then return format("a URL with scheme %q", scheme:sub(1, SHOWN_WORD)) end
  -- a word that runs into anything but the end of a segment may be a
  -- user name, a key's name or a token ("sk_live_...:@host", "key=...")
  local word = path:match("^[%w_.~-]+") or ""
  local after = path:sub(#word + 1, #word + 1)
  if word == "" or not (after == "" or after == "/" or after == "?" or after == "#") then
    return "a string that is neither"
  end
  local whole = #word == #path and #word <= SHOWN_WORD
  return format("%q, a path without its leading /", whole and word or word:sub(1, SHOWN_WORD) .. "...")
end

--- res | nil, err = client:request(method, path [, opts])
-- The URL a call names, the path its route is matched on, and whether it
-- is on another origin than the client's. A path is joined to base_url;
-- an absolute URL on the client's own origin (a pagination Link, say) is
-- taken as it is; one on another origin only when the call or the client
-- says cross_origin = true.
function Client:_target(path, cross_origin)
  if type(path) ~= "string" then
    error(format("client:request: path must be a string (got %s)", type(path)), 3)
  end
  if byte(path, 1) == SLASH then
    -- most programs call a few paths again and again: the last one's URL
    -- is kept rather than joined again (a new string each time)
    if path == self.last_path then return self.last_url, path, false end
    local url = self.base_url .. path
    if fast_paths.on then self.last_path, self.last_url = path, url end
    return url, path, false
  end
  if not lower(path):find("^https?://") then
    error(format("client:request: path must start with / or be an http:// or https:// URL (got %s)",
      shown_path(path)), 3)
  end
  local origin = headers_mod.origin(path)
  if origin == self.origin then
    local base = self.base_url
    local rest = path:sub(#base + 1)
    if path:sub(1, #base) == base and (rest == "" or rest:find("^[/?#]")) then
      return path, rest:sub(1, 1) == "/" and rest or "/" .. rest, false
    end
    return path, path:match("^%a[%w+.-]*://[^/?#]*(/?[^?#]*)"), false
  end
  if cross_origin == nil then cross_origin = self.cross_origin end
  if not cross_origin then
    error(format("client:request: %s is on another origin than the client's (%s); pass cross_origin = true "
      .. "to send it (the client's secret headers and limiters stay behind)", headers_mod.redact_url(path),
      self.origin), 3)
  end
  return path, nil, true
end

-- The client's headers without its secret ones (Authorization, API keys,
-- cookies and its own secret_headers): what another origin may see.
local function public_headers(t, secret_names)
  local extra = secret_names and headers_mod.secret_set(secret_names, "client") or nil
  local out = {}
  for k, v in pairs(t) do
    if not headers_mod.is_secret(k, extra) then out[k] = v end
  end
  return out
end

-- Copies into call the options opts gives, as rw.fetch reads them: the
-- table's own and those it inherits through __index tables (a per-call
-- table over a base), an own option hiding an inherited one (each is read
-- through opts); behind an __index function, which cannot be listed, each
-- option a call may give, read through it. Those that are the client's own
-- (call_only) stay out. fetch.check then checks every one.
local function copy_options(call, opts)
  local t = opts
  for _ = 1, 16 do -- (a loop of __index tables ends here too, as fetch's check does)
    for k in pairs(t) do
      if not call_only[k] then call[k] = opts[k] end
    end
    local mt = getmetatable(t)
    local index = type(mt) == "table" and rawget(mt, "__index")
    if index == nil or index == false then return end
    if type(index) ~= "table" then
      for k in pairs(call_options) do
        if not call_only[k] then
          local v = opts[k]
          if v ~= nil then call[k] = v end
        end
      end
      return
    end
    t = index
  end
end

-- The table fetch gets for a call: the client's defaults and the call's
-- options, checked (for good, with kept: fetch.check). Returns it, its
-- header table and the URL with the call's query.
function Client:_call(method, opts, url, route_path, foreign, kept)
  if (opts.json ~= nil or opts.body ~= nil) and (method == "GET" or method == "HEAD") then
    error(format("client:%s: a %s request cannot carry a body (option '%s'); use client:post or the method "
      .. "the API expects", lower(method), method, opts.json ~= nil and "json" or "body"), 3)
  end
  local call = {}
  for k, v in pairs(self.defaults) do call[k] = v end
  copy_options(call, opts)
  -- GET is fetch's own default: a call table without it is read as a
  -- plain rw.fetch's is (fetch plans a call that gives only the options
  -- every call reads the short way)
  call.method = method ~= "GET" and method or nil
  -- The client's secret header names and the call's, together.
  local secret_names = self.secret_headers
  if opts.secret_headers ~= nil and secret_names then
    headers_mod.secret_set(opts.secret_headers, "client:request", 4)
    local both = {}
    for i, name in ipairs(secret_names) do both[i] = name end
    for _, name in ipairs(opts.secret_headers) do both[#both + 1] = name end
    secret_names = both
  end
  call.secret_headers = secret_names or opts.secret_headers
  -- (a call's own policy, a provider's name or false, before the client's)
  local own_policy = opts.policy
  if own_policy == nil then
    call.policy = self.policy
  elseif type(own_policy) == "string" then
    call.policy = providers.provider(own_policy, "client:request", 3)
  else
    call.policy = own_policy
  end
  call.circuit = opts.circuit or self.circuit
  call.budget = opts.budget or self.budget
  -- Both hear the call: the client's hook (its telemetry) and the call's own.
  local own_hook, client_hook = opts.on_event, self.on_event
  if own_hook == nil or own_hook == client_hook then
    call.on_event = client_hook
  elseif type(own_hook) ~= "function" then
    error("client:request: option 'on_event' must be a function", 3)
  elseif client_hook then
    call.on_event = function(event)
      client_hook(event)
      own_hook(event)
    end
  else
    call.on_event = own_hook
  end
  -- Another origin gets neither the client's secrets nor its limits, which
  -- are the client's API's.
  if foreign then
    call.limiter = opts.limiter or nil
  else
    call.limiter = self:_limiter_for(route_path, opts.limiter)
  end
  -- (the client's own limiter counts requests: a cost is for the caller's,
  -- and without one it is asked of none, as a call without a limiter's is)
  if not (self.default_limiter and call.limiter == self.limiter) then
    call.cost = opts.cost
  elseif opts.cost ~= nil then
    options.check("client:request", call_options, "cost", opts.cost, 3) -- (a bad one still raises)
  end
  -- The client's own table when the call adds nothing: fetch then reuses
  -- the lines it made from it (and reads what it holds at each call).
  local h
  if opts.headers == nil and opts.json == nil and not foreign then
    h = self.headers
  else
    h = merged_headers(foreign and public_headers(self.headers, self.secret_headers) or self.headers, opts.headers)
  end
  if opts.json ~= nil then
    if opts.body ~= nil then error("client:request: options 'body' and 'json' are both given; give one", 3) end
    call.body = json.encode(opts.json, "client:request: option 'json'", 3)
    -- As fetch does for its json option: labelled as JSON, asking for JSON.
    local given = {}
    for k in pairs(h) do given[lower_name(k, 3)] = true end
    if not given["content-type"] then h["Content-Type"] = "application/json" end
    if not given.accept then h.Accept = "application/json" end
  end
  call.headers = h
  if opts.query ~= nil then url = headers_mod.with_query(url, opts.query, "client:request", 3) end
  fetch.check(url, call, 1, kept)
  return call, h, url
end

local NO_OPTIONS, NO_LIMITER = {}, {}

-- How long past the end of its budget a call waits for the identical one
-- it joined before it makes the request itself (seconds).
local SHARED_GRACE = 1

-- The methods of client:get, :post, ... and OPTIONS, as they are sent.
local plain_methods = { GET = true, POST = true, PUT = true, DELETE = true, PATCH = true, HEAD = true,
  OPTIONS = true }

-- The table fetch gets for a call to the client's own origin that gives no
-- options: the same for every such call with that method and limiter, so it
-- is made and checked once, and kept (fetch reads it and changes nothing).
-- Not with `concurrency`, whose wait shortens a call's max_elapsed.
function Client:_plain_call(method, url, route_path)
  local limiter = self:_limiter_for(route_path, nil)
  local by_limiter = self.plain_calls[method]
  if not by_limiter then
    by_limiter = fast_paths.weak()
    self.plain_calls[method] = by_limiter
  end
  local call = by_limiter[limiter or NO_LIMITER]
  if not call then
    call = self:_call(method, NO_OPTIONS, url, route_path, false, true)
    by_limiter[limiter or NO_LIMITER] = call
  end
  return call
end

-- Keeps the URL and call table of a path called with no options: a
-- program that calls a new path each time (an id apiece) starts them over
-- (fetch.cache.bounded).
function Client:_keep_plain(method, path, url, call)
  local known = self.plain_paths[method]
  if not known then
    known = fast_paths.bounded(fast_paths.PLAIN_PATHS_KEPT)
    self.plain_paths[method] = known
  end
  fast_paths.keep(known, path, { url, call })
end

-- call, h = sealed(call, h, mine): the call with its header table (h) and
-- secret_headers list as they are now, copied: what it sends is then what
-- its key was made of, whatever the caller changes in its tables while the
-- call waits. mine: call is this call's own table (Client:_call's), set in
-- place; else (a plain call's, shared by every call like it) it is copied.
local function sealed(call, h, mine)
  local out = call
  if not mine then
    out = {}
    for k, v in pairs(call) do out[k] = v end
  end
  out.headers = merged_headers(h)
  local names = call.secret_headers
  if names then
    local list = {}
    for i, name in ipairs(names) do list[i] = name end
    out.secret_headers = list
  end
  return out, out.headers
end

-- The waits of the client's own (a turn under `concurrency`, an identical
-- request in flight) are for another call, as a transfer's is: a task
-- waits in the scheduler, which wakes it when the other call lets go; code
-- outside any task waits as the call's other waits there do, through the
-- call's `sleep` option, or else its host (runtime.await), looking again
-- at each turn.

-- set = await_shared(shared, seconds, per_call_sleep): waits at most
-- seconds for the request in flight that a call joined (Client:request's
-- entry in in_flight) to end.
local function await_shared(shared, seconds, per_call)
  local done = shared.done
  if not done then -- the first to join: most shared calls have none
    done = scheduler.event()
    shared.done = done
  end
  if scheduler.current() then return done:wait(seconds) end
  return runtime.await(function() return shared.ended end, now() + seconds, per_call) and true or false
end

-- got = take_turn(sem, seconds, per_call_sleep): waits at most seconds for
-- a turn under the client's `concurrency` (a permit of sem).
local function take_turn(sem, seconds, per_call)
  if scheduler.current() then return sem:acquire(seconds) end
  if sem:acquire(0) then return true end
  local got = false
  -- (asked again, it answers what it found: a host may look twice)
  runtime.await(function()
    if not got then got = sem:acquire(0) end
    return got
  end, now() + seconds, per_call)
  return got
end

function Client:request(method, path, opts)
  local url, call, h
  local known = opts == nil and self.plain_paths[method]
  local made = known and known[path]
  if made then
    -- A path called before with this method and no options (most programs
    -- call a few paths again and again): its URL and call table are what
    -- they made then.
    url, call, h = made[1], made[2], self.headers
  else
    if type(method) ~= "string" then
      error(format("client:request: method must be a string (got %s)", type(method)), 2)
    end
    if opts ~= nil and type(opts) ~= "table" then
      error(format("client:request: options must be a table (got %s)", type(opts)), 2)
    end
    local cross_origin = opts and opts.cross_origin
    if cross_origin ~= nil and type(cross_origin) ~= "boolean" then
      errors.bad_option("client:request", "cross_origin", "a boolean", cross_origin, 2)
    end
    local route_path, foreign
    url, route_path, foreign = self:_target(path, cross_origin)
    if not plain_methods[method] then method = upper(method) end
    if opts == nil and not foreign and not self.semaphore and plain_methods[method] then
      call, h = self:_plain_call(method, url, route_path), self.headers
      self:_keep_plain(method, path, url, call)
    else
      call, h, url = self:_call(method, opts or NO_OPTIONS, url, route_path, foreign)
    end
  end
  local counters = self.counters
  counters.requests = counters.requests + 1
  -- A stream has one reader: it is neither shared nor cached.
  local responses = self.responses
  local share = self.dedupe and shareable[method] and not call.stream
  local cacheable = responses and shareable[method] and not call.stream
  -- The request's identity: nil for one that is like no other. unkeyed:
  -- the header fields it leaves out, which a response's Vary may name.
  local key, unkeyed
  if share or cacheable then
    key, unkeyed = fast_paths.request_key(self.digester, method, url, call.body, h, call, self.own)
  end
  -- Neither shared nor cached: nothing is left to do here once fetch has
  -- answered (a tail call: the task waiting in it keeps no frame of this one).
  if not key then return self:_send(url, call) end
  if cacheable then
    local hit = fast_paths.response_get(responses, key, now())
    if hit then
      counters.cache_hits = counters.cache_hits + 1
      return hit
    end
  end
  -- What is sent is what the key was made of. A call that waits before it
  -- is sent (its turn under `concurrency`, an identical request it joins)
  -- sends its header table as it was when the key was made: the caller may
  -- change the table meanwhile (a token refreshed in place), and the
  -- answer to another credential would be kept under this key. A call
  -- under `concurrency` has a table of its own (Client:_call's).
  if self.semaphore then call, h = sealed(call, h, true) end

  local res, err
  local deadline = share and now() + (call.max_elapsed or fetch.DEFAULT_MAX_ELAPSED)
  -- (the call's own deadline, when it comes first, ends its budget)
  if deadline and call.deadline and call.deadline < deadline then deadline = call.deadline end
  local joined = false
  while true do
    local shared = share and self.in_flight[key]
    -- A call joins an identical one in flight only if that one will end
    -- within this call's own time budget.
    if shared and shared.deadline <= deadline then
      counters.deduped = counters.deduped + 1
      if not joined and not self.semaphore then
        joined = true
        call, h = sealed(call, h, false)
      end
      -- Its caller's coroutine may never run again (a host that drops a
      -- request's coroutine, a coroutine left suspended): no wait past the
      -- end of its budget, and a little more.
      local set = await_shared(shared, shared.deadline - now() + SHARED_GRACE, call.sleep)
      -- An error raised in the shared call (a bad option, a failing hook)
      -- is raised here too, as it would be without sharing.
      if shared.raised ~= nil then error(shared.raised, 0) end
      if set and not shared.cancelled then
        -- A response that varies on a header field the identity leaves out
        -- (User-Agent, say) answers only the calls that sent the same value.
        local answer = shared.res or type(shared.err) == "table" and shared.err.response
        if fast_paths.fits(answer, shared.unkeyed, unkeyed) then
          -- its own copy of what the call that made the request kept
          res, err = fast_paths.copy(shared.res), fast_paths.copy(shared.err)
          break
        end
        share = false
      end
      -- The caller that made the request was cancelled, and its transfer
      -- with it, or it never ended: this call makes it again (or joins
      -- whoever does first). Or its answer was not this call's: this call
      -- makes its own.
      if self.in_flight[key] == shared then self.in_flight[key] = nil end
      counters.deduped = counters.deduped - 1
    elseif share and not shared then
      -- The first of identical calls makes the request itself, in its own
      -- task: the client starts no task of its own that could outlive it.
      -- done: the event of the tasks that join it; ended: whether it has;
      -- unkeyed: what its request sent of the header fields its identity
      -- leaves out (ended is there from the start: the entry is not grown
      -- when it ends)
      local entry = { deadline = deadline, unkeyed = unkeyed, ended = false }
      self.in_flight[key] = entry
      res, err = self:_send(url, call, key, entry)
      break
    else
      res, err = self:_send(url, call)
      break
    end
  end
  if res and cacheable and res.status >= 200 and res.status < 300 then
    fast_paths.response_put(responses, key, res, h, now())
  end
  return res, err
end

-- A call that ends before fetch runs (its turn under `concurrency` did not
-- come within max_elapsed, or before its deadline: by_deadline), told as
-- fetch tells a spent budget.
function Client:_budget_error(url, call, waited, by_deadline)
  local counters = self.counters
  counters.failures = counters.failures + 1
  bump(counters.errors, "budget")
  if self.on_event then self.on_event { type = "error", kind = "budget", attempts = 0 } end
  local within = by_deadline and "before the call's deadline"
    or format("within the %.2f s of max_elapsed", call.max_elapsed or fetch.DEFAULT_MAX_ELAPSED)
  return nil, setmetatable({
    kind = "budget", attempts = 0, elapsed = waited,
    message = format("%s %s: its turn under the client's concurrency limit did not come %s; nothing was sent",
      call.method or "GET", headers_mod.redact_url(url), within),
  }, fetch.error_mt)
end

-- ended(in_flight, key, entry, ok, res, err): tells the calls that joined
-- the request in flight under key (entry: Client:request's) what it ended
-- with (ok false: what it raised), or, if it was cancelled, that they go on
-- by themselves.
local function ended(in_flight, key, entry, ok, res, err)
  if in_flight[key] == entry then in_flight[key] = nil end
  if ok then
    -- Those that joined copy what it ended with, as it was: its caller
    -- may change its own table before they run.
    if entry.done then entry.res, entry.err = fast_paths.copy(res), fast_paths.copy(err) end
  elseif res == scheduler.CANCELLED then
    entry.cancelled = true
  else
    entry.raised = res
  end
  entry.ended = true
  if entry.done then entry.done:set() end
end

-- res, err = Client:_send(url, call, key, entry): one fetch, inside the
-- client's concurrency limit. entry: the request in flight under key that
-- identical calls join (Client:request), told how it ended (ended) before
-- this returns or raises.
function Client:_send(url, call, key, entry)
  local sem, counters = self.semaphore, self.counters
  local ok, res, err = true, nil, nil
  local turn = not sem
  if sem then
    -- The wait for a turn counts against the call's max_elapsed; fetch gets
    -- what is left.
    local max_elapsed = call.max_elapsed or fetch.DEFAULT_MAX_ELAPSED
    local started = now()
    -- (no wait past the call's deadline either, when it comes first)
    local wait_limit, by_deadline = max_elapsed, false
    if call.deadline and call.deadline - started < max_elapsed then
      wait_limit, by_deadline = call.deadline - started, true
    end
    -- (the wait may raise, its task cancelled: caught, so that entry is told)
    ok, res = compat.pcall(take_turn, sem, wait_limit > 0 and wait_limit or 0, call.sleep)
    if ok and res then
      local waited = now() - started
      local left = max_elapsed - waited
      if left > 0 and waited < wait_limit then
        call.max_elapsed, turn = left, true
      else
        sem:release()
      end
    end
    if ok and not turn then res, err = self:_budget_error(url, call, now() - started, by_deadline) end
  end
  if turn then
    counters.in_flight = counters.in_flight + 1
    ok, res, err = compat.pcall(fetch.fetch, url, call, counters)
    counters.in_flight = counters.in_flight - 1
    if sem then sem:release() end
    if not ok then
      err = nil
    elseif res then
      counters.successes = counters.successes + 1
    else
      counters.failures = counters.failures + 1
      bump(counters.errors, err.kind)
    end
  end
  if entry then ended(self.in_flight, key, entry, ok, res, err) end
  if not ok then error(res, 0) end
  return res, err
end

---------------------------------------------------------------------------
-- Pagination

-- A pagination error: the page whose Link could not be followed is its
-- response; nothing more was sent.
local function pagination_error(res, message)
  return setmetatable({ kind = "pagination", status = res.status, response = res, attempts = 0, elapsed = 0,
    message = message }, fetch.error_mt)
end

-- opts without the options that are the iterator's own (max_pages), and
-- without `query` for the pages after the first, whose links carry it.
-- Inherited options stay inherited (the same metatable).
local function page_options(opts, first)
  if opts == nil then return nil end
  local out = {}
  for k, v in pairs(opts) do
    if k ~= "max_pages" and (first or k ~= "query") then out[k] = v end
  end
  return setmetatable(out, getmetatable(opts))
end

-- url | nil | false, err: the next page's URL that `last` (a page) names in
-- its Link header, checked; nil when it names none (the last page).
function Client:_next_page(last, seen, cross_origin)
  local link = last.headers and last.headers.link
  if type(link) ~= "string" or not last.url then return nil end
  local url, why = core.link(link, "next", last.url)
  if not url then
    if why == nil then return nil end
    return false, pagination_error(last, format("the next page's link in the answer to GET %s cannot be "
      .. "followed: %s; nothing more was sent", last.url, why))
  end
  if not lower(url):find("^https?://") then
    return false, pagination_error(last, format("the next page's link in the answer to GET %s is not an "
      .. "http:// or https:// URL; nothing more was sent", last.url))
  end
  local shown = headers_mod.redact_url(url)
  if headers_mod.origin(url) ~= self.origin and not cross_origin then
    return false, pagination_error(last, format("the next page's link (%s) is on another origin than the "
      .. "client's (%s); nothing was sent to it: pass cross_origin = true to follow it (the client's secret "
      .. "headers and limiters stay behind)", shown, self.origin))
  end
  if seen[url] then
    return false, pagination_error(last, format("the next page's link (%s) names a page already fetched: the "
      .. "pages loop; nothing more was sent", shown))
  end
  return url
end

--- for page, err in client:pages(path [, opts]) do ... end
-- Each page is a GET through client:request (its limiter, retries,
-- budget, ...), the next one named by the last one's Link rel="next".
-- An error is yielded once as false, err (so the loop's body sees it),
-- then the iteration ends.
function Client:pages(path, opts)
  if opts ~= nil and type(opts) ~= "table" then
    error(format("client:pages: options must be a table (got %s)", type(opts)), 2)
  end
  local max_pages = opts and opts.max_pages
  if max_pages ~= nil and (type(max_pages) ~= "number" or max_pages < 1 or max_pages % 1 ~= 0) then
    errors.bad_option("client:pages", "max_pages", "a positive integer", max_pages, 2)
  end
  local cross_origin = opts and opts.cross_origin
  if cross_origin ~= nil and type(cross_origin) ~= "boolean" then
    errors.bad_option("client:pages", "cross_origin", "a boolean", cross_origin, 2)
  end
  if cross_origin == nil then cross_origin = self.cross_origin end
  -- The first page's URL, as the loop guard compares the links with it
  -- (a bad path or query raises here, at the call).
  local first_url = self:_target(path, cross_origin)
  if opts and opts.query ~= nil then first_url = headers_mod.with_query(first_url, opts.query, "client:pages", 2) end
  local first, rest = page_options(opts, true), page_options(opts, false)
  if rest and cross_origin then rest.cross_origin = true end
  local seen, count, last, done = { [first_url] = true }, 0, nil, false
  return function()
    if done then return nil end
    local target, call = path, first
    if last then
      if max_pages and count >= max_pages then
        done = true
        return nil
      end
      local url, err = self:_next_page(last, seen, cross_origin)
      if not url then
        done = true
        return url, err
      end
      seen[url] = true
      target = url
      call = rest or (cross_origin and { cross_origin = true }) or nil
    end
    count = count + 1
    local res, err = self:request("GET", target, call)
    if not res then
      done = true
      return false, err
    end
    last = res
    return res
  end
end

for _, m in ipairs { "get", "post", "put", "delete", "patch", "head" } do
  local method = upper(m)
  Client[m] = function(self, path, opts) return self:request(method, path, opts) end
end

function Client:__tostring()
  return "ratewise.Client (" .. headers_mod.redact_url(self.base_url) .. ")"
end

return client
