-- rw.client: one API's base URL, headers, provider policy, limits and
-- resilience settings in one object, with JSON in and out.
local compat = require "ratewise.compat"
local fetch = require "ratewise.fetch"
local headers_mod = require "ratewise.headers"
local policy_mod = require "ratewise.policy"
local scheduler = require "ratewise.scheduler"
local core = require "ratewise.core"

local format, lower, upper, find, gsub = string.format, string.lower, string.upper, string.find, string.gsub
local concat, sort = table.concat, table.sort
local type, tostring, pairs, ipairs, setmetatable, pcall = type, tostring, pairs, ipairs, setmetatable, pcall
local now = core.now

local client = {}

-- lua-cjson is loaded on first use, by the JSON features only (the `json`
-- option, decoding a JSON response): require "ratewise" and everything else
-- work without it.
local cjson, cjson_safe, cjson_missing

--- cjson, cjson_safe | nil, nil, why: the modules, or why they cannot be
-- loaded and how to install them.
local function json_modules()
  if cjson then return cjson, cjson_safe end
  if not cjson_missing then
    local ok, m = pcall(require, "cjson")
    local ok_safe, m_safe = false, nil
    if ok then ok_safe, m_safe = pcall(require, "cjson.safe") end
    if ok and ok_safe then
      cjson, cjson_safe = m, m_safe
      return cjson, cjson_safe
    end
    -- The first line of require's message ("module 'cjson' not found:"),
    -- not the list of every path it tried.
    local why = tostring(ok and m_safe or m):match("^[^\n]*"):gsub(":$", "")
    cjson_missing = format("(%s): install the Debian package lua-cjson "
      .. "(apt-get install lua-cjson) or the rock lua-cjson (luarocks install lua-cjson)", why)
  end
  return nil, nil, cjson_missing
end

local Client = {}
Client.__index = Client

-- fetch options a client may set as defaults for every call.
local fetch_defaults = {
  timeout = true, max_retries = true, max_elapsed = true, max_delay = true, base = true, jitter = true,
  retry_non_idempotent = true, on_retry = true, delay = true, sleep = true, follow_redirects = true,
  max_body = true, verify_tls = true, retry_after = true, retry_after_max = true, hint_jitter = true,
  ca_file = true, ca_path = true, client_cert = true, client_key = true, client_key_password = true,
  pinned_public_key = true, tls_min_version = true, proxy = true, decompress = true,
}
local client_options = {
  base_url = true, headers = true, provider = true, limiter = true, concurrency = true, circuit = true,
  budget = true, routes = true, dedupe = true, cache = true, on_event = true, secret_headers = true,
}
for k in pairs(fetch_defaults) do client_options[k] = true end

-- Per-call options that are the client's own, not fetch's.
local call_only = { json = true, query = true, cost = true }

-- Only these are shared between identical requests in flight: replaying a
-- response to a POST would swallow a side effect.
local shareable = { GET = true, HEAD = true, OPTIONS = true }

-- Headers that do not change what the server answers, left out of the key
-- that tells identical requests apart.
local not_in_key = { ["user-agent"] = true, ["x-request-id"] = true, traceparent = true, tracestate = true }

---------------------------------------------------------------------------
-- Construction

local function known_providers()
  return "github, openai, anthropic, stripe, ietf"
end

local function resolve_provider(p)
  if p == nil then return nil end
  if type(p) ~= "string" and type(p) ~= "table" then
    error(format("client: option 'provider' must be a provider's name or a policy (got %s)", type(p)), 4)
  end
  if type(p) == "string" then
    local ok, found = pcall(require, "ratewise.providers." .. p)
    if not ok or not policy_mod.is_policy(found) then
      error(format("client: unknown provider '%s' (built in: %s)", p, known_providers()), 4)
    end
    return found
  end
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
    error(format("client: option 'routes' must be a table (got %s)", type(routes)), 3)
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

--- c = rw.client{base_url = ..., ...}
function client.new(opts)
  if type(opts) ~= "table" then
    error(format("client: expected a table of options (got %s)", type(opts)), 2)
  end
  for k in pairs(opts) do
    if not client_options[k] then error(format("client: unknown option '%s'", tostring(k)), 2) end
  end
  local base = opts.base_url
  if type(base) ~= "string" or not base:lower():find("^https?://") then
    error(format("client: option 'base_url' must be an http:// or https:// URL (got %s)",
      type(base) == "string" and "a URL of another scheme" or type(base)), 2)
  end
  if opts.headers ~= nil and type(opts.headers) ~= "table" then
    error(format("client: option 'headers' must be a table (got %s)", type(opts.headers)), 2)
  end
  local conc = opts.concurrency
  if conc ~= nil and (type(conc) ~= "number" or conc < 1 or conc % 1 ~= 0) then
    error(format("client: option 'concurrency' must be a positive integer (got %s)", tostring(conc)), 2)
  end
  if opts.on_event ~= nil and type(opts.on_event) ~= "function" then
    error("client: option 'on_event' must be a function", 2)
  end
  local cache = opts.cache
  if cache ~= nil then
    if type(cache) ~= "table" or type(cache.ttl) ~= "number" or cache.ttl ~= cache.ttl or cache.ttl <= 0 then
      error("client: option 'cache' must be {ttl = seconds [, max_entries = n]}", 2)
    end
  end
  if opts.dedupe ~= nil and type(opts.dedupe) ~= "boolean" then
    error(format("client: option 'dedupe' must be a boolean (got %s)", type(opts.dedupe)), 2)
  end
  local rw = require "ratewise" -- the constructors of circuits and budgets
  local c = setmetatable({
    base_url = (base:gsub("/+$", "")),
    headers = opts.headers or {},
    policy = resolve_provider(opts.provider),
    limiter = opts.limiter,
    routes = compile_routes(opts.routes),
    semaphore = opts.concurrency and scheduler.semaphore(opts.concurrency) or nil,
    circuit = resolve_object(opts.circuit, rw.circuit),
    budget = resolve_object(opts.budget, rw.retry_budget),
    dedupe = opts.dedupe ~= false,
    secret_headers = opts.secret_headers ~= nil and secret_list(opts.secret_headers) or nil,
    cache_ttl = cache and cache.ttl, cache_max = cache and cache.max_entries or 1000,
    cached = {}, cache_order = {}, in_flight = {},
    user_on_event = opts.on_event,
    defaults = {},
    counters = {
      requests = 0, attempts = 0, successes = 0, failures = 0, retries = 0, waits = 0, waited = 0,
      budget_refusals = 0, circuit_refusals = 0, deduped = 0, cache_hits = 0, in_flight = 0,
      statuses = {}, retries_by_status = {}, retries_by_source = {}, waits_by_source = {}, errors = {},
    },
  }, Client)
  for k in pairs(fetch_defaults) do c.defaults[k] = opts[k] end
  -- The defaults and objects are checked now, where they were given, not at the first request.
  local checked = {}
  for k, v in pairs(c.defaults) do checked[k] = v end
  checked.limiter, checked.circuit, checked.budget = c.limiter, c.circuit, c.budget
  fetch.check(c.base_url, checked)
  c.on_event = function(event) c:_count(event) end
  return c
end

---------------------------------------------------------------------------
-- Telemetry

local function bump(t, k, by)
  t[k] = (t[k] or 0) + (by or 1)
end

function Client:_count(event)
  local n = self.counters
  local kind = event.type
  if kind == "response" then
    n.attempts = n.attempts + 1
    bump(n.statuses, event.status and tostring(event.status) or "network")
  elseif kind == "retry" then
    n.retries = n.retries + 1
    bump(n.retries_by_status, event.status and tostring(event.status) or "network")
    bump(n.retries_by_source, event.source)
    n.waits, n.waited = n.waits + 1, n.waited + event.delay
    bump(n.waits_by_source, event.source, event.delay)
  elseif kind == "budget_refused" then
    n.budget_refusals = n.budget_refusals + 1
  elseif kind == "circuit_open" then
    n.circuit_refusals = n.circuit_refusals + 1
  end
  if self.user_on_event then self.user_on_event(event) end
end

--- t = client:stats(): counters since the client was made.
function Client:stats()
  local n = self.counters
  local function copy(t)
    local r = {}
    for k, v in pairs(t) do r[k] = v end
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

local function url_encode(s)
  return (gsub(tostring(s), "[^%w%-%._~]", function(ch) return format("%%%02X", ch:byte()) end))
end

local function query_string(q)
  if type(q) ~= "table" then
    error(format("client: option 'query' must be a table (got %s)", type(q)), 3)
  end
  local keys = {}
  for k in pairs(q) do keys[#keys + 1] = tostring(k) end
  sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = q[k]
    if v == nil then v = q[tonumber(k)] end
    if type(v) == "table" then
      for _, item in ipairs(v) do parts[#parts + 1] = url_encode(k) .. "=" .. url_encode(item) end
    elseif v ~= false then
      parts[#parts + 1] = url_encode(k) .. (v == true and "" or "=" .. url_encode(v))
    end
  end
  return concat(parts, "&")
end

-- The client's headers, then the call's, names compared case-insensitively.
local function merged_headers(base, extra)
  local out, names = {}, {}
  for k, v in pairs(base) do
    out[k] = v
    names[lower(k)] = k
  end
  for k, v in pairs(extra or {}) do
    local existing = names[lower(k)]
    if existing then out[existing] = nil end
    out[k] = v
    names[lower(k)] = k
  end
  return out
end

function Client:_limiter_for(path, explicit)
  if explicit ~= nil then return explicit end
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
  if not self.limiter then return route.limiter end
  -- Both the route's quota and the API's overall quota apply, taken at once.
  -- The route's counts requests (and hears what the server says of them);
  -- the client's takes the call's cost.
  if not route.both then
    local rw = require "ratewise"
    route.both = rw.limiters { route.limiter, cost = self.limiter }
  end
  return route.both
end

local function request_key(method, url, h, body)
  local names = {}
  for k in pairs(h) do
    if not not_in_key[lower(k)] then names[#names + 1] = k end
  end
  sort(names, function(a, b) return lower(a) < lower(b) end)
  local parts = { method, url, body or "" }
  for _, k in ipairs(names) do parts[#parts + 1] = lower(k) .. ":" .. tostring(h[k]) end
  return concat(parts, "\n")
end

-- The cache's entries in the order they were stored, oldest first:
-- self.cache_order is a queue of keys, order[head..tail], and each entry
-- knows its slot. An entry that expires, or is stored again, leaves its old
-- slot behind; eviction skips such a slot, so an expired copy can never take
-- a fresh entry with it, and nothing is shifted (a table.remove from the
-- front moved every key). `live` counts the entries; the queue is compacted
-- once stale slots, or the indices below head, outnumber them.
local function cache_queue(self)
  local order = self.cache_order
  if not order.head then order.head, order.tail, order.live = 1, 0, 0 end
  return order
end

local function cache_compact(order, cached)
  local keys, n = {}, 0
  for i = order.head, order.tail do
    local key = order[i]
    order[i] = nil
    local entry = cached[key]
    if entry and entry.slot == i then
      n = n + 1
      keys[n] = key
    end
  end
  for i = 1, n do
    order[i] = keys[i]
    cached[keys[i]].slot = i
  end
  order.head, order.tail = 1, n
end

function Client:_cache_get(key)
  local entry = self.cached[key]
  if entry and entry.expires > now() then return entry.res end
  if entry then
    self.cached[key] = nil
    local order = cache_queue(self)
    order.live = order.live - 1
  end
  return nil
end

function Client:_cache_put(key, res)
  local cc = res.headers["cache-control"]
  if cc and lower(cc):find("no%-store") then return end
  local order, cached = cache_queue(self), self.cached
  if not cached[key] then order.live = order.live + 1 end
  local slot = order.tail + 1
  order.tail = slot
  order[slot] = key
  cached[key] = { res = res, expires = now() + self.cache_ttl, slot = slot }
  while order.live > self.cache_max do
    local head = order.head
    local oldest = order[head]
    order[head] = nil
    order.head = head + 1
    local entry = cached[oldest]
    if entry and entry.slot == head then
      cached[oldest] = nil
      order.live = order.live - 1
    end
  end
  local margin = 2 * order.live + 32
  if order.tail - order.head >= margin or order.head > margin then cache_compact(order, cached) end
end

-- A copy for a second reader of a shared response, so that neither can
-- change what the other sees (the headers and json stay shared: read-only).
local function copy_response(res)
  local r = {}
  for k, v in pairs(res) do r[k] = v end
  return r
end

local function decode_json(res)
  local ct = res.headers and res.headers["content-type"]
  if ct and find(lower(ct), "json", 1, true) and res.body ~= "" then
    local _, decoder, missing = json_modules()
    if not decoder then
      res.json_error = "response body not decoded: lua-cjson cannot be loaded " .. missing
      return
    end
    local value, err = decoder.decode(res.body)
    if value == nil then res.json_error = "response body is not valid JSON: " .. tostring(err) end
    res.json = value
  end
end

--- res | nil, err = client:request(method, path [, opts])
function Client:request(method, path, opts)
  if type(method) ~= "string" then
    error(format("client:request: method must be a string (got %s)", type(method)), 2)
  end
  if type(path) ~= "string" or path:sub(1, 1) ~= "/" then
    error(format("client:request: path must be a string starting with / (got %s)",
      type(path) == "string" and format("%q", path) or type(path)), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error(format("client:request: options must be a table (got %s)", type(opts)), 2)
  end
  opts = opts or {}
  method = upper(method)
  if (opts.json ~= nil or opts.body ~= nil) and (method == "GET" or method == "HEAD") then
    error(format("client:%s: a %s request cannot carry a body (option '%s'); use client:post or the method "
      .. "the API expects", lower(method), method, opts.json ~= nil and "json" or "body"), 2)
  end

  local call = {}
  for k, v in pairs(self.defaults) do call[k] = v end
  for k, v in pairs(opts) do
    if not call_only[k] then call[k] = v end
  end
  call.method = method
  -- The client's secret header names and the call's, together.
  local secret_names = self.secret_headers
  if opts.secret_headers ~= nil and secret_names then
    headers_mod.secret_set(opts.secret_headers, "client:request", 3)
    local both = {}
    for i, name in ipairs(secret_names) do both[i] = name end
    for _, name in ipairs(opts.secret_headers) do both[#both + 1] = name end
    secret_names = both
  end
  call.secret_headers = secret_names or opts.secret_headers
  call.policy = opts.policy or self.policy
  call.circuit = opts.circuit or self.circuit
  call.budget = opts.budget or self.budget
  call.cost = opts.cost
  call.on_event = self.on_event
  call.limiter = self:_limiter_for(path, opts.limiter)
  local h = merged_headers(self.headers, opts.headers)
  if opts.json ~= nil then
    local encoder, _, missing = json_modules()
    if not encoder then
      error("client:request: option 'json' needs lua-cjson, which cannot be loaded " .. missing, 2)
    end
    local ok, body = pcall(encoder.encode, opts.json)
    if not ok then error("client:request: option 'json' cannot be encoded: " .. tostring(body), 2) end
    call.body = body
    local has_type = false
    for k in pairs(h) do if lower(k) == "content-type" then has_type = true end end
    if not has_type then h["Content-Type"] = "application/json" end
  end
  call.headers = h

  local url = self.base_url .. path
  if opts.query ~= nil then
    local q = query_string(opts.query)
    if q ~= "" then url = url .. (find(path, "?", 1, true) and "&" or "?") .. q end
  end

  fetch.check(url, call)
  local counters = self.counters
  counters.requests = counters.requests + 1
  local share = self.dedupe and shareable[method]
  local key = (share or self.cache_ttl) and request_key(method, url, h, call.body) or nil
  if self.cache_ttl and shareable[method] then
    local hit = self:_cache_get(key)
    if hit then
      counters.cache_hits = counters.cache_hits + 1
      return copy_response(hit)
    end
  end

  local res, err
  local deadline = now() + (call.max_elapsed or fetch.DEFAULT_MAX_ELAPSED)
  local shared = share and self.in_flight[key]
  -- A call joins an identical one in flight only if that one will end
  -- within this call's own time budget.
  if shared and shared.deadline <= deadline then
    counters.deduped = counters.deduped + 1
    res, err = shared.task:join()
    if res then res = copy_response(res) end
  elseif share and not shared then
    local entry = { deadline = deadline }
    entry.task = scheduler.spawn(function() return self:_send(url, call) end)
    self.in_flight[key] = entry
    res, err = entry.task:join()
    if self.in_flight[key] == entry then self.in_flight[key] = nil end
  else
    res, err = self:_send(url, call)
  end
  -- An error raised in the shared transfer (a bad option, a failing hook) is
  -- raised here too, as it would be without sharing.
  if res == nil and type(err) ~= "table" then error(err, 0) end
  if res and self.cache_ttl and shareable[method] and res.status >= 200 and res.status < 300 then
    self:_cache_put(key, res)
  end
  return res, err
end

-- One fetch, inside the client's concurrency limit.
-- A call that ends before fetch runs (its turn under `concurrency` did not
-- come within max_elapsed), told as fetch tells a spent budget.
function Client:_budget_error(url, call, waited)
  local counters = self.counters
  counters.failures = counters.failures + 1
  bump(counters.errors, "budget")
  self.on_event { type = "error", kind = "budget", attempts = 0 }
  return nil, setmetatable({
    kind = "budget", attempts = 0, elapsed = waited,
    message = format("%s %s: its turn under the client's concurrency limit did not come within the %.2f s "
      .. "of max_elapsed; nothing was sent", call.method, headers_mod.redact_url(url),
      call.max_elapsed or fetch.DEFAULT_MAX_ELAPSED),
  }, fetch.error_mt)
end

function Client:_send(url, call)
  local sem, counters = self.semaphore, self.counters
  if sem then
    -- The wait for a turn counts against the call's max_elapsed; fetch gets
    -- what is left.
    local max_elapsed = call.max_elapsed or fetch.DEFAULT_MAX_ELAPSED
    local started = now()
    if not sem:acquire(max_elapsed) then return self:_budget_error(url, call, now() - started) end
    local left = max_elapsed - (now() - started)
    if left <= 0 then
      sem:release()
      return self:_budget_error(url, call, now() - started)
    end
    call.max_elapsed = left
  end
  counters.in_flight = counters.in_flight + 1
  local ok, res, err = compat.pcall(fetch.fetch, url, call)
  counters.in_flight = counters.in_flight - 1
  if sem then sem:release() end
  if not ok then error(res, 0) end
  if res then
    counters.successes = counters.successes + 1
    decode_json(res)
  else
    counters.failures = counters.failures + 1
    bump(counters.errors, err.kind)
    if err.response then decode_json(err.response) end
  end
  return res, err
end

for _, m in ipairs { "get", "post", "put", "delete", "patch", "head" } do
  local method = upper(m)
  Client[m] = function(self, path, opts) return self:request(method, path, opts) end
end

function Client:__tostring()
  return "ratewise.Client (" .. headers_mod.redact_url(self.base_url) .. ")"
end

return client
