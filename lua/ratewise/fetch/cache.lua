-- fetch.cache: every cache of fetch and rw.client, in one place, each with
-- one of two policies:
--
-- * keyed by a caller's table (an options table, a header table, a
--   limiter): weak keys (cache.weak), so that a table dropped by its owner
--   takes what was kept for it along, and nothing else ever evicts;
-- * keyed by a string (a URL, a path): bounded (cache.bounded), emptied
--   whole when it holds its limit, so that a program calling a new URL
--   each time (an id apiece) keeps at most that many and pays for one
--   emptying now and then rather than for an eviction order at every call.
--
-- Also (at the end) a client's responses and requests in flight, keyed by
-- a request's identity: not a fast path, but what `cache` and `dedupe` are.
--
-- No module keeps what the call before did: a cache is found by its key.
-- What each cache keeps: docs/internals.md, "The fast-path caches". A
-- value kept must be what the code would compute again from the key alone;
-- where it also depends on what a table holds (a header table's names and
-- values), the entry keeps those and is compared at every use.
local core = require "ratewise.core"
local options = require "ratewise.options"

local setmetatable, getmetatable, next, type, tostring, tonumber, ipairs = setmetatable, getmetatable, next,
  type, tostring, tonumber, ipairs
local format, lower, gmatch, match = string.format, string.lower, string.gmatch, string.match
local concat, sort = table.concat, table.sort
local random_bytes, new_digester = core.random_bytes, core.digester
local parse_http_date, wall_clock = core.parse_http_date, core.time
local identity = options.identity

local cache = {}

local WEAK_KEYS = { __mode = "k" }

-- The testing aid RATEWISE_FAST_PATHS=off (read once, as this module
-- loads): every fast-path cache keeps nothing, so that each lookup misses
-- and every call takes the general path. spec/fast_paths_spec.lua runs the
-- same calls both ways and compares what the server saw and what the
-- callers got. Not the client's `cache` and `dedupe`: those are features.
local getenv = os and os.getenv
cache.on = not (getenv and getenv("RATEWISE_FAST_PATHS") == "off")
local KEEPS_NOTHING = { __newindex = function() end }

--- t = cache.weak(): a table whose keys (callers' tables) do not keep them alive.
function cache.weak()
  return setmetatable({}, cache.on and WEAK_KEYS or KEEPS_NOTHING)
end

-- The number of entries and the limit of each bounded table (weak: a
-- bounded table made for an rw.client goes with the client). Bookkeeping,
-- not a cache: kept whatever the switch says.
local held, limit_of = setmetatable({}, WEAK_KEYS), setmetatable({}, WEAK_KEYS)

--- t = cache.bounded(limit): a table read with t[key] and written with
-- cache.keep, emptied when it holds `limit` entries.
function cache.bounded(limit)
  local t = cache.on and {} or setmetatable({}, KEEPS_NOTHING)
  held[t], limit_of[t] = 0, limit
  return t
end

--- cache.keep(t, key, value): t[key] = value in a bounded table, emptied
-- first when it is full (in place: whoever holds t holds it still).
function cache.keep(t, key, value)
  local n = held[t]
  if n >= limit_of[t] then
    for k in next, t do t[k] = nil end
    n = 0
  end
  t[key] = value
  held[t] = n + 1
end

-- How many URLs are kept, and the longest URL kept (a query carrying a
-- payload is not worth keeping).
cache.URLS_KEPT = 256
cache.URL_KEPT_MAX = 512

-- What is printed of each URL without credentials and its origin, by URL
-- (plan.url_facts): { shown, origin } by URL.
cache.url_facts = cache.bounded(cache.URLS_KEPT)

-- Options tables fetch.check has passed, by table: true, taken by the
-- fetch that follows, or "kept", for every fetch with a table its owner
-- never changes (plan.check).
cache.checked = cache.weak()

-- The header lines made from a caller's header table, by table (plan.lua:
-- made_lines, keep_lines), for calls without and with a JSON body.
cache.lines_made = cache.weak()
cache.lines_made_json = cache.weak()

-- How many paths' calls an rw.client keeps for each method (client.lua,
-- Client:_keep_plain).
cache.PLAIN_PATHS_KEPT = 256

---------------------------------------------------------------------------
-- A client's responses and requests in flight (rw.client's `cache` and
-- `dedupe`), both keyed by a request's identity (cache.request_key).

--- v = cache.copy(v): a deep copy of a response or an error (their
-- metatables kept), so that no caller sees what another changes in its own.
local function copy(v, seen)
  if type(v) ~= "table" then return v end
  local done = seen[v]
  if done then return done end
  local c = {}
  seen[v] = c
  for k, x in next, v do c[k] = copy(x, seen) end
  return setmetatable(c, getmetatable(v))
end
function cache.copy(v)
  return copy(v, {})
end

-- The bytes of a client's digest key (SipHash's key).
local SALT_BYTES = 16

--- digester = cache.digester(): what makes a client's request keys
-- (core.digester, under a random key of the client's own), or false when
-- the kernel gives no randomness (its calls are then neither shared nor
-- cached: a key anyone could compute ahead could be made to collide).
function cache.digester()
  local key = random_bytes(SALT_BYTES)
  return key and new_digester(key) or false
end

-- The header fields that do not change what the server answers, left out
-- of a request's identity (a response whose Vary names one is not kept).
local not_in_key = { ["user-agent"] = true, ["x-request-id"] = true, traceparent = true, tracestate = true }
cache.not_in_key = not_in_key

-- The identity's options (options.identity) by how they take part: those
-- compared by value, each by its place in schema order (rank), those of
-- them whose `true` makes a call like no other, and the objects compared
-- by reference.
local rank, fresh_when_true, objects = {}, {}, {}
local HEADERS = "headers"
for i, option in ipairs(identity) do
  local name = option.name
  if option.how == "object" then
    objects[#objects + 1] = name
  else
    -- (request_key's sections are told apart by this name: see there)
    if name == HEADERS then error("fetch.cache: an identity option named '" .. HEADERS .. "'") end
    rank[name] = i
    if option.how == "fresh" then fresh_when_true[name] = true end
  end
end

-- An option's value as the key reads it.
local function canonical(v)
  local t = type(v)
  if t == "string" then return v end
  if t == "boolean" then return v and "true" or "false" end
  if t == "number" then return format("%.17g", v) end
  if t == "table" then -- secret_headers: an array of names
    local parts = {}
    for i = 1, #v do parts[i] = lower(tostring(v[i])) end
    return concat(parts, ",")
  end
  return tostring(v)
end

--- key, unkeyed | nil = cache.request_key(digester, method, url, body, h, call, own):
-- the identity of a request (options.identity): its method, URL, body and
-- header fields (h; names compared case-insensitively, not_in_key left
-- out) and each option that changes what is sent or how the answer is read
-- (call: the request's options). A SipHash-2-4 digest (128 bits) under the
-- client's random key (cache.digester): a keyed pseudorandom function made
-- for the keys of a table, so that a secret (a header's credential, a URL's
-- userinfo, a proxy's password) takes part in the comparison but is never
-- kept nor printed, and no one without the key can make two requests
-- collide.
-- unkeyed: the values of the fields left out, by lower-case name (nil when
-- there are none), which a response's Vary may name (cache.fits).
-- nil for a request that is like no other: a fresh idempotency key, an
-- object option (a policy) other than its client's own (own), no digester;
-- and for one fetch will refuse (a header name that is not a string, or
-- one given twice).
--
-- The digester takes each part with its length, so that no two lists of
-- parts read alike. The parts are: the method, the URL, a tag that says
-- whether there is a body (then the body: an empty body is not none), the
-- options as name and value, the tag "headers" (no option is named so,
-- and it stands where an option's name would), then the header fields as
-- lower-case name and value, sorted, to the end: a header named like an
-- option is not that option.
function cache.request_key(digester, method, url, body, h, call, own)
  if not digester then return nil end
  for i = 1, #objects do
    local name = objects[i]
    if call[name] ~= own[name] then return nil end
  end
  -- (made with room for the parts of a request with a few headers)
  local d, n = { method, url, nil, nil, nil, nil, nil, nil }, 3
  if body == nil then
    d[3] = "no body"
  else
    d[3], d[4], n = "body", body, 4
  end
  -- The options the call gives (a call holds few of the schema's), each
  -- put in its place by rank: whatever order `next` gives them in, the
  -- same options make the same parts.
  local first = n + 1
  for name, v in next, call do
    local r = rank[name]
    if r then
      if v == true and fresh_when_true[name] then return nil end
      local at = n + 1
      while at > first and rank[d[at - 2]] > r do
        d[at], d[at + 1] = d[at - 2], d[at - 1]
        at = at - 2
      end
      d[at], d[at + 1], n = name, canonical(v), n + 2
    end
  end
  n = n + 1
  d[n] = HEADERS
  local names, values, count, unkeyed = nil, nil, 0, nil
  for k, v in next, h do
    if type(k) ~= "string" then return nil end
    local name = lower(k)
    if type(v) ~= "string" then v = tostring(v) end
    if not_in_key[name] then
      unkeyed = unkeyed or {}
      if unkeyed[name] then return nil end
      unkeyed[name] = v
    elseif count == 0 then
      count, d[n + 1], d[n + 2] = 1, name, v
    else
      if count == 1 then names, values = { d[n + 1] }, { [d[n + 1]] = d[n + 2] } end
      if values[name] then return nil end
      count = count + 1
      names[count], values[name] = name, v
    end
  end
  if count > 1 then
    sort(names)
    for i = 1, count do
      local name = names[i]
      d[n + 1], d[n + 2], n = name, values[name], n + 2
    end
  end
  return digester(d), unkeyed
end

-- Whether a list of Cache-Control directives holds one of the names.
local function has_directive(value, names)
  if type(value) ~= "string" then return false end
  for directive in gmatch(lower(value), "[^,]+") do
    if names[match(directive, "^%s*([^=%s]+)")] then return true end
  end
  return false
end

-- What a private cache must not keep (RFC 9111 3, 5.2): a response or
-- request with no-store, one to be revalidated before each use (no-cache:
-- the cache cannot revalidate), and a response whose Vary names `*` or a
-- field left out of the request's identity.
local NOT_KEPT = { ["no-store"] = true, ["no-cache"] = true }
local function storable(res, request_headers)
  local h = res.headers
  if has_directive(h["cache-control"], NOT_KEPT) or has_directive(h.pragma, NOT_KEPT) then return false end
  for name, value in next, request_headers do
    if type(name) == "string" and lower(name) == "cache-control" and has_directive(value, NOT_KEPT) then
      return false
    end
  end
  local vary = h.vary
  if vary then
    for field in gmatch(lower(vary), "[^,%s]+") do
      if field == "*" or not_in_key[field] then return false end
    end
  end
  return true
end
cache.storable = storable

--- seconds = cache.lifetime(res, ttl): how long a response stays fresh in
-- a client's cache (RFC 9111 4.2): the client's ttl, cut to the response's
-- own max-age (the smallest, if it gives several; s-maxage is for shared
-- caches), or, without one, to its Expires less its Date; less the Age it
-- arrived with. 0 or less: stale on arrival (max-age=0, an Expires past or
-- not a date, a max-age that is not a number), and not kept: a private
-- cache may serve a stale response only where the request allows it
-- (4.2.4), never one marked must-revalidate (5.2.2.2), and this one cannot
-- revalidate. An entry is never served past its lifetime, so must-revalidate
-- asks nothing more of it.
function cache.lifetime(res, ttl)
  local h = res.headers
  local fresh, max_age = ttl, nil
  local directives = h["cache-control"]
  if type(directives) == "string" then
    for directive in gmatch(lower(directives), "[^,]+") do
      local name, value = match(directive, "^%s*([^=%s]+)%s*=?%s*(.-)%s*$")
      if name == "max-age" then
        local seconds = tonumber(match(value, '^"?(%d+)"?$'))
        if not seconds then return 0 end
        if not max_age or seconds < max_age then max_age = seconds end
      end
    end
  end
  if max_age then
    if max_age < fresh then fresh = max_age end
  elseif h.expires ~= nil then
    local expires = parse_http_date(h.expires)
    if not expires then return 0 end -- "0", "-1": already expired (RFC 9111 5.3)
    local date = h.date and parse_http_date(h.date) or wall_clock()
    if expires - date < fresh then fresh = expires - date end
  end
  -- (a list's first member, as 5.1 asks; an Age that is not a number is ignored)
  local age = type(h.age) == "string" and tonumber(match(match(h.age, "^%s*([^,]*)"), "^(%d+)%s*$"))
  if age then fresh = fresh - age end
  return fresh
end

--- yes = cache.fits(res, unkeyed, other): whether res, the answer to a
-- request whose header fields left out of its identity held `unkeyed`
-- (cache.request_key's; nil: none), answers an identical request whose
-- held `other` too: not when its Vary names `*`, nor one of those fields
-- with another value there (RFC 9111 4.1). For the callers that join a
-- request in flight (rw.client's dedupe).
function cache.fits(res, unkeyed, other)
  local vary = type(res) == "table" and res.headers and res.headers.vary
  if not vary then return true end
  for field in gmatch(lower(vary), "[^,%s]+") do
    if field == "*" then return false end
    if not_in_key[field] and (unkeyed and unkeyed[field]) ~= (other and other[field]) then return false end
  end
  return true
end

--- store = cache.responses(ttl, max_entries): a client's successful
-- responses, kept ttl seconds each, max_entries at most (the oldest stored
-- goes first). Each entry is a copy, and each hit is a copy of it.
function cache.responses(ttl, max_entries)
  -- order: a queue of keys, order[head..tail], oldest first; each entry
  -- knows its slot. An entry that expires, or is stored again, leaves its
  -- old slot behind; eviction skips such a slot, so that an expired copy
  -- never takes a fresh entry with it. live counts the entries.
  return { ttl = ttl, max = max_entries, entries = {}, order = {}, head = 1, tail = 0, live = 0 }
end

--- res | nil = cache.response_get(store, key, t): a copy of the response
-- kept for key and fresh at time t.
function cache.response_get(store, key, t)
  local entry = store.entries[key]
  if not entry then return nil end
  if entry.expires > t then return copy(entry.res, {}) end
  store.entries[key] = nil
  store.live = store.live - 1
  return nil
end

-- Moves the live slots of the queue to its front, once stale slots (or
-- the indices below head) outnumber the entries.
local function compact(store)
  local order, entries = store.order, store.entries
  local keys, n = {}, 0
  for i = store.head, store.tail do
    local key = order[i]
    order[i] = nil
    local entry = entries[key]
    if entry and entry.slot == i then
      n = n + 1
      keys[n] = key
    end
  end
  for i = 1, n do
    order[i] = keys[i]
    entries[keys[i]].slot = i
  end
  store.head, store.tail = 1, n
end

--- cache.response_put(store, key, res, request_headers, t): keeps a copy
-- of res (a 2xx) for key from time t, for its lifetime (cache.lifetime),
-- unless it is stale already or RFC 9111 forbids a private cache to keep it
-- (storable).
function cache.response_put(store, key, res, request_headers, t)
  local lifetime = cache.lifetime(res, store.ttl)
  if lifetime <= 0 or not storable(res, request_headers) then return end
  local order, entries = store.order, store.entries
  if not entries[key] then store.live = store.live + 1 end
  local slot = store.tail + 1
  store.tail = slot
  order[slot] = key
  entries[key] = { res = copy(res, {}), expires = t + lifetime, slot = slot }
  while store.live > store.max and store.head <= store.tail do
    local head = store.head
    local oldest = order[head]
    order[head] = nil
    store.head = head + 1
    local entry = entries[oldest]
    if entry and entry.slot == head then
      entries[oldest] = nil
      store.live = store.live - 1
    end
  end
  local margin = 2 * store.live + 32
  if store.tail - store.head >= margin or store.head > margin then compact(store) end
end

return cache
