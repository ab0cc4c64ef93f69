-- options: the one declaration of every option of rw.fetch, rw.client and
-- a client's calls, and what is made from it: the checks, a client's
-- defaults, the transport options handed to the engine, and which options
-- make a request what it is (its identity: rw.client's de-duplication and
-- cache key). spec/options_spec.lua holds src/transfer.h's REQUEST_FIELDS,
-- the types/ annotations and docs/reference.md's tables to this list.
--
-- Also the one wording of an unknown option, for every constructor that
-- takes a table of options (options.unknown).
local errors = require "ratewise.errors"
local headers = require "ratewise.headers"

local format, byte, sub, concat, sort = string.format, string.byte, string.sub, table.concat, table.sort
local huge = math.huge
local type, tostring, pairs, ipairs, pcall, error, min = type, tostring, pairs, ipairs, pcall, error, math.min
local max, floor = math.max, math.floor

local options = {}

---------------------------------------------------------------------------
-- The schema
--
-- Each entry:
--   name      the option's name
--   kind      what its value must be: a Lua type, or a checker below
--   default   its value when not given (nil: none; a string in words when
--             it is not one value)
--   layer     who reads it: "plan" (fetch.plan, before the first
--             attempt), "attempt" (fetch.attempt, each try), "decision"
--             (what follows an attempt), "loop" (fetch's loop, which
--             carries decisions out: waits and hooks), "engine" (the C
--             core, src/request.c) or "client" (rw.client itself)
--   field     the request table's field the engine reads it from
--             (src/transfer.h REQUEST_FIELDS), if any
--   transport true: handed to the engine as it is given, and listed in
--             request.transport (the engine looks for no other rare field)
--   identity  whether it changes what is sent or how the answer is read,
--             and so what a request is:
--               "request": taken in by what is sent (the method, URL, body
--                          and header lines fetch makes of it)
--               "value":   the value itself
--               "secret":  the value, compared but never kept: a digest
--               "fresh":   `true` makes a new value for each call (such a
--                          call is like no other); a string is a "value"
--               "object":  an object compared by reference: a call shares
--                          only when it has its client's own
--             false: it changes neither (a timeout, a hook, a limiter)
--   secret    true: an error shows its value by type only (a password, a
--             proxy URL with credentials, a header table, a body)
--   fetch     true: rw.fetch takes it (and so does a client's call)
--   client    "default": rw.client takes it as a default for every call;
--             "own": rw.client takes it with a meaning of its own
--   call      true: a client's call takes it though rw.fetch does not
--   not_client  why rw.client does not take it, though a call does: the
--             error that names it unknown says so
local schema = {
  -- what is sent
  { name = "method", kind = "string", default = "GET", layer = "plan", field = "method", identity = "request",
    fetch = true },
  { name = "headers", kind = "table", default = "{}", layer = "plan", field = "headers", identity = "request",
    secret = true, fetch = true, client = "own" },
  { name = "body", kind = "string", layer = "plan", field = "body", identity = "request", secret = true,
    fetch = true },
  { name = "json", kind = "table", layer = "plan", field = "body", identity = "request", secret = true,
    fetch = true },
  { name = "query", kind = "table", layer = "plan", identity = "request", secret = true, fetch = true },
  { name = "stream", kind = "boolean", default = false, layer = "attempt", field = "stream", transport = true,
    identity = "value", fetch = true },
  { name = "idempotency_key", kind = "key", layer = "plan", identity = "fresh", fetch = true },
  { name = "secret_headers", kind = "names", layer = "engine", field = "secret_headers", identity = "value",
    secret = true, fetch = true, client = "own" },
  -- retries and time
  { name = "timeout", kind = "positive", default = 30, layer = "attempt", field = "timeout", identity = false,
    fetch = true, client = "default" },
  { name = "connect_timeout", kind = "positive", layer = "engine", field = "connect_timeout", transport = true,
    identity = false, fetch = true, client = "default" },
  { name = "first_byte_timeout", kind = "positive", layer = "engine", field = "first_byte_timeout",
    transport = true, identity = false, fetch = true, client = "default" },
  { name = "idle_timeout", kind = "positive", layer = "engine", field = "idle_timeout", transport = true,
    identity = false, fetch = true, client = "default" },
  { name = "max_retries", kind = "count", default = 3, layer = "decision", identity = false, fetch = true,
    client = "default" },
  { name = "max_elapsed", kind = "positive", default = 120, layer = "decision", identity = false, fetch = true,
    client = "default" },
  { name = "deadline", kind = "time", layer = "plan", identity = false, fetch = true,
    not_client = "a deadline is when one piece of work must end, and a client outlives it: give it to each call "
      .. "(client:get(path, {deadline = d})), or max_elapsed here for a budget per call" },
  { name = "max_delay", kind = "finite", default = 60, layer = "decision", identity = false, fetch = true,
    client = "default" },
  { name = "base", kind = "positive", default = 1, layer = "decision", identity = false, fetch = true,
    client = "default" },
  { name = "jitter", kind = "jitter", default = "full", layer = "decision", identity = false, fetch = true,
    client = "default" },
  { name = "delay", kind = "function", layer = "decision", identity = false, fetch = true, client = "default" },
  { name = "retry_non_idempotent", kind = "boolean", default = false, layer = "plan", identity = false,
    fetch = true, client = "default" },
  { name = "retry_after", kind = "retry_after", default = "honor", layer = "decision", identity = false,
    fetch = true, client = "default" },
  { name = "retry_after_max", kind = "positive", layer = "decision", identity = false, fetch = true,
    client = "default" },
  { name = "hint_jitter", kind = "finite", default = 0.2, layer = "decision", identity = false, fetch = true,
    client = "default" },
  -- pacing and protection
  { name = "limiter", kind = "limiter", layer = "attempt", identity = false, fetch = true, client = "own" },
  { name = "cost", kind = "cost", default = 1, layer = "attempt", identity = false, fetch = true },
  { name = "policy", kind = "policy", layer = "decision", identity = "object", fetch = true },
  { name = "circuit", kind = "circuit", layer = "attempt", identity = false, fetch = true, client = "own" },
  { name = "budget", kind = "budget", layer = "decision", identity = false, fetch = true, client = "own" },
  -- transport
  { name = "follow_redirects", kind = "boolean", default = true, layer = "engine", field = "follow_redirects",
    identity = "value", fetch = true, client = "default" },
  { name = "max_body", kind = "nonnegative", default = 64 * 1024 * 1024, layer = "engine", field = "max_body",
    identity = "value", fetch = true, client = "default" },
  { name = "decompress", kind = "boolean", default = true, layer = "engine", field = "decompress",
    transport = true, identity = "value", fetch = true, client = "default" },
  { name = "verify_tls", kind = "boolean", default = true, layer = "engine", field = "verify_tls",
    identity = "value", fetch = true, client = "default" },
  { name = "ca_file", kind = "string", layer = "engine", field = "ca_file", transport = true, identity = "value",
    fetch = true, client = "default" },
  { name = "ca_path", kind = "string", layer = "engine", field = "ca_path", transport = true, identity = "value",
    fetch = true, client = "default" },
  { name = "client_cert", kind = "string", layer = "engine", field = "client_cert", transport = true,
    identity = "value", fetch = true, client = "default" },
  { name = "client_key", kind = "string", layer = "engine", field = "client_key", transport = true,
    identity = "value", fetch = true, client = "default" },
  { name = "client_key_password", kind = "string", layer = "engine", field = "client_key_password",
    transport = true, identity = "secret", secret = true, fetch = true, client = "default" },
  { name = "pinned_public_key", kind = "string", layer = "engine", field = "pinned_public_key", transport = true,
    identity = "value", fetch = true, client = "default" },
  { name = "tls_min_version", kind = "tls_version", layer = "engine", field = "tls_min_version",
    transport = true, identity = "value", fetch = true, client = "default" },
  { name = "proxy", kind = "string", layer = "engine", field = "proxy", transport = true, identity = "secret",
    secret = true, fetch = true, client = "default" },
  { name = "proxy_ca_file", kind = "string", layer = "engine", field = "proxy_ca_file", transport = true,
    identity = "value", fetch = true, client = "default" },
  -- callbacks and the host
  { name = "on_retry", kind = "callback_or_false", default = "a line on the log", layer = "loop",
    identity = false, fetch = true, client = "default" },
  { name = "on_event", kind = "function", layer = "loop", identity = false, fetch = true, client = "own" },
  { name = "sleep", kind = "function", layer = "loop", identity = false, fetch = true, client = "default" },
  -- the client's own
  { name = "base_url", kind = "url", layer = "client", identity = false, client = "own" },
  { name = "cross_origin", kind = "boolean", default = false, layer = "client", identity = false, client = "own",
    call = true },
  { name = "provider", kind = "provider", layer = "client", identity = false, client = "own" },
  { name = "routes", kind = "table", layer = "client", identity = false, client = "own" },
  { name = "concurrency", kind = "positive_integer", layer = "client", identity = false, client = "own" },
  { name = "dedupe", kind = "boolean", default = true, layer = "client", identity = false, client = "own" },
  { name = "cache", kind = "cache", layer = "client", identity = false, client = "own" },
}
options.schema = schema

-- The fields of the client's `cache` option.
options.cache_schema = {
  { name = "ttl", kind = "positive_or_forever", layer = "client" },
  { name = "max_entries", kind = "positive_integer", default = 1000, layer = "client" },
}

-- The request table's fields that are no option's: fetch works them out
-- (the URL with its query, whether a body is empty, the list of transport
-- options, whether the request may be sent again).
options.request_only_fields = { "url", "empty_body", "transport", "no_replay" }

local by_name = {}
for _, entry in ipairs(schema) do by_name[entry.name] = entry end
options.by_name = by_name

-- The names of one scope: fetch's, rw.client's, a client call's.
local fetch_names, client_names, call_names = {}, {}, {}
for _, entry in ipairs(schema) do
  if entry.fetch then fetch_names[entry.name], call_names[entry.name] = entry, entry end
  if entry.client then client_names[entry.name] = entry end
  if entry.call then call_names[entry.name] = entry end
end
options.fetch, options.client, options.call = fetch_names, client_names, call_names

-- The options a client takes as defaults for every call, in schema order.
local client_defaults = {}
for _, entry in ipairs(schema) do
  if entry.client == "default" then client_defaults[#client_defaults + 1] = entry.name end
end
options.client_defaults = client_defaults

-- The options handed to the engine as they are (src/request.c), in schema
-- order, and the set of them.
local transport, is_transport = {}, {}
for _, entry in ipairs(schema) do
  if entry.transport then
    transport[#transport + 1] = entry.name
    is_transport[entry.name] = true
  end
end
options.transport, options.is_transport = transport, is_transport

-- The options that make a request what it is beyond what is sent (the
-- method, URL, body and header lines), in schema order: { name, how }.
local identity = {}
for _, entry in ipairs(schema) do
  local how = entry.identity
  if how and how ~= "request" then identity[#identity + 1] = { name = entry.name, how = how } end
end
options.identity = identity

--- value = options.default(name): an option's default (nil: none).
function options.default(name)
  local entry = by_name[name]
  return entry and entry.default
end

---------------------------------------------------------------------------
-- Unknown options

-- The edit distance between a and b (insertions, deletions, substitutions).
local function distance(a, b)
  local previous, current = {}, {}
  for j = 0, #b do previous[j] = j end
  for i = 1, #a do
    current[0] = i
    local ca = byte(a, i)
    for j = 1, #b do
      local cost = ca == byte(b, j) and 0 or 1
      current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
    end
    previous, current = current, previous
  end
  return previous[#b]
end

--- name = options.nearest(name, known): the known name closest to name
-- (known: a set of names, or an array of them), or nil when none is near
-- enough to be what was meant. A known name that holds the one given
-- (`retries` in `max_retries`) is taken first, then the fewest edits (at
-- most max(2, half the known name's length)), then the first in sorted
-- order.
function options.nearest(name, known)
  local list = {}
  for k, v in pairs(known) do list[#list + 1] = type(k) == "string" and k or v end
  sort(list)
  local given = tostring(name)
  local best, best_score
  for _, candidate in ipairs(list) do
    local score = distance(given, candidate)
    if #given >= 3 and candidate:find(given, 1, true) then score = score - 100 end
    if best_score == nil or score < best_score then best, best_score = candidate, score end
  end
  if best and best_score > max(2, floor(#best / 2)) then return nil end
  return best
end

--- options.unknown(who, name, known, level [, noun]): raises
-- "who: unknown option 'name' (did you mean 'nearest'?)", the one wording
-- of every table of options; level as error's, seen from the caller.
-- noun: what the table's keys are called ("option" unless said).
function options.unknown(who, name, known, level, noun)
  local entry = known == client_names and type(name) == "string" and by_name[name]
  if entry and entry.not_client then
    error(format("%s: unknown option '%s' (a call's, not a client's: %s)", who, name, entry.not_client),
      level > 0 and level + 1 or 0)
  end
  local shown = type(name) == "string" and #name <= 40 and not name:find("%c") and name
    or type(name) == "string" and sub(name, 1, 40):gsub("%c", "?") .. "..."
    or tostring(name)
  local near = options.nearest(shown, known)
  error(format("%s: unknown %s '%s'%s", who, noun or "option", shown,
    near and format(" (did you mean '%s'?)", near) or ""), level > 0 and level + 1 or 0)
end

---------------------------------------------------------------------------
-- Checks

-- What a call does with a wait the server asked for (docs/limits.md).
local retry_after_modes = { honor = true, clamp = true, fail_fast = true, defer = true }
options.retry_after_modes = retry_after_modes

-- The methods an object option must have.
local required_methods = {
  limiter = { "acquire" }, circuit = { "allow", "record" }, budget = { "request", "allow_retry" },
}
options.required_methods = required_methods

--- options.clean_key(v): an idempotency key the server can tell apart
-- (blank or empty ones are not).
local function clean_key(v)
  return type(v) == "string" and v:find("%S") ~= nil and not v:find("%c")
end
options.clean_key = clean_key

-- policy.lua uses options.unknown: it is required when first needed.
local policy_module

-- What each kind of option must be: a check of value v (of type t), and
-- the words for what it must be. A kind without one here is a Lua type.
local checkers = {
  positive = function(v, t) return t == "number" and v == v and v > 0 and v ~= huge, "a positive number" end,
  -- (a table's amounts are the limiter's to check, by the names of its limits)
  cost = function(v, t)
    return t == "number" and v == v and v > 0 and v ~= huge or t == "table" or t == "function",
      "a positive number, a table of costs by limit ({ requests = 1, tokens = 900 }) or a function of the request "
        .. "giving either"
  end,
  nonnegative = function(v, t) return t == "number" and v == v and v >= 0, "a non-negative number" end,
  finite = function(v, t) return t == "number" and v == v and v >= 0 and v ~= huge, "a finite non-negative number" end,
  time = function(v, t)
    return t == "number" and v == v and v ~= huge and v ~= -huge, "a time on rw.now()'s clock, a finite number"
  end,
  positive_or_forever = function(v, t) return t == "number" and v == v and v > 0, "a positive number" end,
  positive_integer = function(v, t)
    return t == "number" and v == v and v >= 1 and v ~= huge and v % 1 == 0, "a positive integer"
  end,
  tls_version = function(v) return v == "1.2" or v == "1.3", '"1.2" or "1.3"' end,
  retry_after = function(v) return retry_after_modes[v] ~= nil, "one of honor, clamp, fail_fast, defer" end,
  jitter = function(v)
    return v == "none" or v == "full" or v == "equal" or v == "decorrelated", "one of none, full, equal, decorrelated"
  end,
  count = function(v, t) return t == "number" and v >= 0 and v % 1 == 0, "a non-negative integer" end,
  key = function(v) return v == true or clean_key(v), "true or a non-blank string without control characters" end,
  names = function(v, t)
    if t ~= "table" then return false, "an array of header names" end
    for k, field in pairs(v) do
      if type(k) ~= "number" or type(field) ~= "string" or not headers.is_token(field) then
        return false, "an array of header names"
      end
    end
    return true
  end,
  policy = function(v, t)
    policy_module = policy_module or require "ratewise.policy"
    -- (a name is looked up when the call is planned: an unknown one raises there, listing the built-in ones)
    return v == false or t == "string" or policy_module.is_policy(v),
      "a policy made by rw.policy, a built-in provider's name, or false for none"
  end,
  callback_or_false = function(v, t) return v == false or t == "function", "a function or false" end,
}
for kind, methods in pairs(required_methods) do
  local expected = "an object with the methods " .. concat(methods, ", ")
  checkers[kind] = function(v)
    for _, m in ipairs(methods) do
      local ok, fn = pcall(function() return v[m] end)
      if not ok or type(fn) ~= "function" then return false, expected end
    end
    return true
  end
end
options.checkers = checkers

--- ok, expected = options.valid(entry, v): whether v is what the entry's
-- kind takes, and the words for what it must be.
local function valid(entry, v)
  local kind, t = entry.kind, type(v)
  local checker = checkers[kind]
  if checker then return checker(v, t) end
  if t == kind then return true end
  return false, "a " .. kind
end
options.valid = valid

--- options.fits.fetch (and .client, .call): what each option of the
-- scope takes, by name, for a walk over a table of options to look up:
--   lua_type[name]  the Lua type its value must have, for a kind that is
--                   one (a value of that type fits)
--   checker[name]   for any other kind, its checker: checker(v, type(v))
--                   answers first whether v fits
-- A name in neither is not the scope's. What does not fit is left to
-- options.check, which raises naming the problem.
local fits = {}
for scope, known in pairs({ fetch = fetch_names, client = client_names, call = call_names }) do
  local lua_type, checker = {}, {}
  for name, entry in pairs(known) do
    local check = checkers[entry.kind]
    if check then checker[name] = check else lua_type[name] = entry.kind end
  end
  fits[scope] = { lua_type = lua_type, checker = checker }
end
options.fits = fits

--- options.check(who, known, name, v, level): raises, naming the option,
-- for a name not in known (a set: options.fetch, options.client...) or a
-- value its kind does not take; level as error's, seen from the caller.
function options.check(who, known, name, v, level)
  local entry = known[name]
  if not entry then options.unknown(who, name, known, level + 1) end
  local ok, expected = valid(entry, v)
  if not ok then errors.bad_option(who, name, expected, v, level + 1, entry.secret) end
end

return options
