-- fetch.plan: what a call will do, worked out once before its first
-- attempt, as one record: its options checked, its URL (what is printed of
-- it, its secrets and origin), its method, body and header lines, the
-- request the engine reads, and what it asks of the attempts (a limiter, a
-- circuit, a stream...). The same record is the call's state, which its
-- attempts and the decision after each share. Caches: fetch.cache.
local core = require "ratewise.core"
local headers = require "ratewise.headers"
local json = require "ratewise.json"
local log = require "ratewise.log"
local runtime = require "ratewise.runtime"
local cache = require "ratewise.fetch.cache"
local report = require "ratewise.fetch.report"
local options = require "ratewise.options"
local providers = require "ratewise.providers.known"

local now = core.now
local format, lower, upper = string.format, string.lower, string.upper
local find = string.find
local type, tostring, pcall, pairs, ipairs, next, getmetatable, rawget, error =
  type, tostring, pcall, pairs, ipairs, next, getmetatable, rawget, error
local call_hook, fetch_error = report.call_hook, report.fetch_error

local plan = {}

-- Methods that may be sent again without asking (RFC 9110 9.2.2 idempotent
-- methods, less TRACE, which has no business in an API client).
local replay_safe = { GET = true, HEAD = true, OPTIONS = true, PUT = true, DELETE = true }
-- Methods servers expect a Content-Length on even when the body is empty:
-- a request of them without a body lists the engine's empty_body field.
local has_body = { POST = true, PUT = true, PATCH = true }

-- The time budget of a call that gives none, and its attempts' timeout.
local DEFAULT_MAX_ELAPSED, DEFAULT_TIMEOUT = 120, 30
plan.DEFAULT_MAX_ELAPSED, plan.DEFAULT_TIMEOUT = DEFAULT_MAX_ELAPSED, DEFAULT_TIMEOUT
-- How far ahead a deadline may lie (seconds, about 30 years): one further
-- is a time on the wall clock, given by mistake.
local OTHER_CLOCK = 1e9

-- Said once per process: a verify_tls = false carried from a test into
-- production should not go unnoticed.
local warned_insecure = false
local function warn_insecure()
  if warned_insecure or not runtime.tls_warning() then return end
  warned_insecure = true
  log.write("ratewise: verify_tls = false: TLS certificates are not checked; an attacker on the path "
    .. "can read and change the traffic (said once; rw.configure{tls_warning = false} silences this)", "warn")
end


---------------------------------------------------------------------------
-- Options

-- Every option's kind, default and reader: ratewise.options, the one
-- schema. `depth` counts the frames between fetch's caller and the
-- function that checks (0 for fetch itself), so that the error names the
-- caller's line.
local fetch_options = options.fetch
local lua_type_of, checker_of = options.fits.fetch.lua_type, options.fits.fetch.checker
local check_value = options.check
local function check_option(name, v, depth)
  check_value("fetch", fetch_options, name, v, 3 + (depth or 0))
end

-- The transport options that go to the engine as they are (src/request.c).
local transport_options, is_transport_option = options.transport, options.is_transport
plan.transport_options, plan.is_transport_option = transport_options, is_transport_option

-- A streamed response may go on for as long as the server sends: it has
-- no total timeout. The time to its headers is bounded (first_byte_timeout,
-- by default the call's timeout) and so is a silence between its body
-- bytes (idle_timeout).
local STREAM_IDLE_TIMEOUT = 60

local clean_key = options.clean_key


-- `level` is error's for fetch's caller seen from check_url.
local function check_url(url, level)
  if type(url) ~= "string" then
    error(format("fetch: url must be a string (got %s)", type(url)), level)
  end
  local scheme = url:match("^(%a[%w+.-]*)://")
  scheme = scheme and lower(scheme)
  if scheme ~= "http" and scheme ~= "https" then
    error(format("fetch: url must be http:// or https:// (got %s)",
      scheme and (scheme .. "://...") or "a string without a scheme"), level)
  end
  if url:find("[%c ]") then
    error("fetch: url contains a space or a control character (CR, LF, NUL or another)", level)
  end
end

-- What is printed of each URL without credentials and its origin, by URL
-- (fetch.cache: bounded).
local url_facts_of, keep, URL_KEPT_MAX = cache.url_facts, cache.keep, cache.URL_KEPT_MAX

--- shown, secrets, origin = plan.url_facts(url [, extra]): what is printed
-- of url (its query and credentials out), its credentials (false for
-- none: headers.url_secrets) and its origin; raises for a URL fetch does
-- not take, at the caller `extra` frames above url_facts' own.
local function url_facts(url, extra)
  local facts = url_facts_of[url]
  if facts then return facts[1], false, facts[2] end
  check_url(url, 4 + (extra or 0))
  local shown = headers.redact_url(url)
  local secrets = find(url, "@", 1, true) and headers.url_secrets(url, {}) or false
  local origin = headers.origin(url)
  -- A URL with credentials is worked out at each call: they are not kept.
  if not secrets and #url <= URL_KEPT_MAX then keep(url_facts_of, url, { shown, origin }) end
  return shown, secrets, origin
end
plan.url_facts = url_facts

--- plan.bad_options_type(url, opts, level): raises fetch's error for
-- options that are not a table, after url's own if it has one; `level` is
-- error's, seen from here.
local function bad_options_type(url, opts, level)
  url_facts(url, level - 2)
  error(format("fetch: options must be a table (got %s)", type(opts)), level)
end
plan.bad_options_type = bad_options_type

local no_names = headers.no_names
local user_agent_line = "User-Agent: ratewise/" .. core.version
-- The header lines of a call that gives no headers of its own: shared,
-- since the engine only reads them.
local default_lines = { user_agent_line }

-- What a call with a JSON body and no headers of its own sends: shared
-- as default_lines is (made_lines' shape).
local json_default_made = { lines = { "Content-Type: application/json", "Accept: application/json",
  user_agent_line }, given = no_names }

-- The lines made from a caller's header table (fetch.cache), kept while
-- the table holds the same names and values: most programs pass one table
-- (an Authorization line) on every call, and its names and values need not
-- be checked and turned into lines again. A table whose contents changed
-- since is checked and turned into lines anew. A table is kept from its
-- second call on (one made for each call gets a mark, not a copy), and no
-- longer once it has changed more often than it was found the same (one
-- changed for each call: an X-Request-Id put into it), nor when a value is
-- a number (1 and 1.0 are equal, and are sent as "1" and "1.0").
-- lines_made_json: the same for calls with a JSON body (the lines carry
-- Content-Type and Accept, unless the table names them).
local lines_made, lines_made_json = cache.lines_made, cache.lines_made_json
local SEEN_ONCE, NEVER = {}, {}

-- Whether header table t has exactly the names and values of `made`, in
-- the order pairs gives them (the same for a table left as it was).
local function same_headers(t, made)
  local names, values, i = made.names, made.values, 0
  for name, value in pairs(t) do
    i = i + 1
    if names[i] ~= name or values[i] ~= value then return false end
  end
  return i == made.n
end

-- What was made from header table t (its lines with the User-Agent line
-- when t has none, its values by lower-case name, its secret values), if t
-- holds the same names and values still; else nil. made: lines_made or
-- lines_made_json.
local function made_lines(made_from, t)
  local made = made_from[t]
  if made == nil or made == SEEN_ONCE or made == NEVER then return nil end
  if same_headers(t, made) then
    made.hits = made.hits + 1
    return made
  end
  made.misses = made.misses + 1
  return nil
end

-- Keeps what was made from header table t, for made_lines.
local function keep_lines(made_from, t, lines, given, secrets)
  local before = made_from[t]
  if before == nil then
    made_from[t] = SEEN_ONCE
    return
  end
  if before == NEVER then return end
  local hits, misses = 0, 0
  if before ~= SEEN_ONCE then hits, misses = before.hits, before.misses end
  if misses > hits then
    made_from[t] = NEVER
    return
  end
  local names, values, n = {}, {}, 0
  for name, value in pairs(t) do
    if type(value) == "number" then
      made_from[t] = NEVER
      return
    end
    n = n + 1
    names[n], values[n] = name, value
  end
  made_from[t] = { n = n, names = names, values = values, lines = lines, given = given, secrets = secrets,
    hits = hits, misses = misses }
end

local common_methods = { GET = true, HEAD = true, POST = true, PUT = true, DELETE = true,
  PATCH = true, OPTIONS = true }

-- The method a call sends: the caller's, or POST for a body given without
-- one (as libcurl and `curl -d` do). Replay safety, logs and connection
-- reuse are all decided on this method. GET and HEAD carry no body: libcurl
-- would send such a request as a POST while everything else took it for a
-- GET. `level` is the caller's frame for errors.
local function request_method(opts, level)
  local method, body = opts.method, opts.body
  if opts.json ~= nil then
    if body ~= nil then error("fetch: options 'body' and 'json' are both given; give one", level) end
    body = opts.json
  end
  if method == nil then return body ~= nil and "POST" or "GET" end
  if not common_methods[method] then
    method = upper(method)
    if not headers.is_token(method) then
      error(format("fetch: option 'method' is not a valid HTTP method (got %q)", method), level)
    end
  end
  if body ~= nil and (method == "GET" or method == "HEAD") then
    error(format("fetch: a %s request cannot carry a body (option '%s'); give the method the API expects, "
      .. "such as method = \"POST\"", method, opts.body ~= nil and "body" or "json"), level)
  end
  return method
end

-- A version 4 UUID from the kernel's random source (getrandom(2), which
-- needs no descriptor). Never math.random: seeded alike, two processes
-- would send the same key and the server would take one request for the
-- other's replay. nil, err when the kernel gives no randomness.
local function uuid4()
  local bytes, err = core.random_bytes(16)
  if not bytes then return nil, err end
  local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, b16 = bytes:byte(1, 16)
  -- version 4 and the RFC 4122 variant, in arithmetic LuaJIT also reads
  b7 = b7 % 16 + 0x40
  b9 = b9 % 64 + 0x80
  return format("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
    b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, b16)
end

-- Lists request field `name` = v for the engine to read (names: the
-- request's list so far, or nil for none yet); returns the list.
local function list_field(request, names, name, v)
  if request[name] == nil then
    if names == nil then
      names = { name }
    else
      names[#names + 1] = name
    end
  end
  request[name] = v
  return names
end

-- The options plan.make need not look for itself: those every call reads,
-- those only the decision reads, at a retry (fetch/decision.lua), and the
-- transport options the engine alone reads (a stream is the attempts'
-- too). A call that gives none but these has nothing else for plan.make
-- to read: every other option it would look up is nil.
local not_planned = { headers = true, timeout = true, max_elapsed = true, max_retries = true, on_retry = true,
  delay = true, base = true, max_delay = true, jitter = true, hint_jitter = true }
for _, name in ipairs(transport_options) do
  if name ~= "stream" then not_planned[name] = true end
end
-- The options that make a request's method and body: a call that gives
-- these beside those above has nothing else for plan.make to read.
local makes_body = { method = true, body = true, json = true }

-- Each option's facts, by name, for read_options' walk: one lookup a
-- name. lua_type, checker: options.fits' (what its value may be);
-- transport: the engine reads it as it is; planned: plan.make looks for it
-- (not in not_planned: "body" for one of makes_body); reads_contents: its check reads what a table holds
-- (an array of names, an object's methods), not the value alone, so one
-- changed in place since fetch.check passed it is checked again.
local option_of = {}
for name, entry in pairs(fetch_options) do
  local kind = entry.kind
  option_of[name] = { lua_type = lua_type_of[name], checker = checker_of[name],
    false_fits = kind == "callback_or_false", -- (a function, or false for none)
    transport = is_transport_option[name] or false,
    planned = makes_body[name] and "body" or not not_planned[name],
    reads_contents = kind == "names" or kind == "policy" or options.required_methods[kind] ~= nil }
end

-- Reads the options a call gives, its table's own and those it inherits
-- through __index tables (a per-call table over a base): checks each,
-- but one that fetch.check passed with the same value (passed: its values
-- by name, or nil), and lists in `request` (when given) the transport
-- options among them, which the engine reads as they are; `seen` (when
-- given) gets each value checked, by name. Options behind an __index
-- function cannot be walked: they go unchecked, and the transport options
-- are looked up by name. Returns the request's list of names
-- (list_field's), and whether the call may give options beyond those read
-- by every call, at a retry or by the engine: false, "body" (only those
-- of makes_body) or true. `depth` is check_option's.
local function read_options(opts, passed, depth, request, seen)
  local names, others = nil, false
  local t, own = opts, true
  for _ = 1, 16 do -- a loop of __index tables ends here too
    for k, v in next, t do
      if own or rawget(opts, k) == nil then -- an own option hides an inherited one
        local option = option_of[k]
        -- (what does not fit, options.check raises for, naming the problem)
        if not option then check_option(k, v, depth) end
        if not passed or passed[k] ~= v or option.reads_contents then
          local kind = type(v)
          if kind ~= option.lua_type and not (v == false and option.false_fits) then
            local checker = option.checker
            if not (checker and checker(v, kind)) then check_option(k, v, depth) end
          end
        end
        if seen and seen[k] == nil then seen[k] = v end
        -- (the first seen of a name is the one opts[name] gives)
        if option.transport and request and request[k] == nil then names = list_field(request, names, k, v) end
        local planned = option.planned
        if planned and others ~= true then others = planned end
      end
    end
    local mt = getmetatable(t)
    if mt == nil then return names, others end
    local index = type(mt) == "table" and rawget(mt, "__index")
    if index == nil then return names, others end
    if type(index) ~= "table" then break end
    t, own = index, false
  end
  if request then
    for i = 1, #transport_options do
      local name = transport_options[i]
      if request[name] == nil then
        local v = opts[name]
        if v ~= nil then names = list_field(request, names, name, v) end
      end
    end
  end
  return names, true
end

-- What the caller's hooks may change before the first attempt: a policy's
-- prepare sees (and may add to) the headers and the idempotency key.
local function prepared(opts, policy, method, url, body)
  local prepare = policy.prepare
  local h = {}
  for k, v in pairs(opts.headers or {}) do h[k] = v end
  local request = { method = method, url = url, headers = h, idempotency_key = opts.idempotency_key,
    body = body }
  call_hook("prepare", prepare, request)
  if type(request.headers) ~= "table" then
    error(format("fetch: the policy's prepare left request.headers that is not a table (got %s)",
      type(request.headers)), 0)
  end
  local key = request.idempotency_key
  if key ~= nil and key ~= true and not clean_key(key) then
    error("fetch: the policy's prepare set an idempotency_key that is not true or a non-blank string "
      .. "without control characters", 0)
  end
  return request.headers, key
end

-- limiter -> { wait_time = method or false, observe = method or false,
-- settle = method or false, refund = method or false, honors_max_wait =
-- boolean }. A limiter may be any object with acquire (an __index that
-- raises means "no such method"), so the lookups are
-- guarded. Looked up at each call: a limiter may gain or lose a method
-- between calls.
local function field_of(object, name)
  return object[name]
end
local function optional_method(object, name)
  local ok, found = pcall(field_of, object, name)
  return ok and type(found) == "function" and found or false
end
local function limiter_methods(limiter)
  local ok, honors = pcall(field_of, limiter, "honors_max_wait")
  return { wait_time = optional_method(limiter, "wait_time"), observe = optional_method(limiter, "observe"),
    settle = optional_method(limiter, "settle"), refund = optional_method(limiter, "refund"),
    honors_max_wait = ok and honors == true }
end

-- The limiter a limiter with for_request chose for the request: one with
-- acquire, or nil for none (a request no limit counts).
local function chosen_limiter(limiter, for_request, request)
  local chosen = for_request(limiter, request)
  if chosen == nil or chosen == false then return nil end
  if not optional_method(chosen, "acquire") then
    error(format("fetch: option 'limiter': for_request must answer a limiter with acquire, or nil (got %s)",
      type(chosen)), 0)
  end
  return chosen
end

-- (a method call, for pcall)
local function limiter_capacity(limiter)
  return limiter:capacity()
end

-- What a call's cost hook is asked: the request as it will be sent, with
-- its JSON (the json option, else the body decoded when it is JSON).
local function with_json(request)
  if request.json == nil and type(request.body) == "string" and find(request.body, "^%s*[%[{]") then
    request.json = json.decode(request.body)
  end
  return request
end

-- The cost a call takes of its limiter at each attempt (plan.make's
-- p.cost), checked against what the limiter could ever serve: the `cost`
-- option (a number, a table by limit, or a function of the request giving
-- either), else, for a limiter with named limits (its capacity is a table
-- by name), the policy's estimate of the limits it has, else 1.
local function call_cost(opts, limiter, policy, request)
  local given = opts.cost
  local ok, capacity = pcall(limiter_capacity, limiter)
  if not ok then capacity = nil end
  local per_limit = type(capacity) == "table"
  local cost = given
  if type(given) == "function" then
    cost = call_hook("cost", given, with_json(request))
    local number = type(cost) == "number" and cost == cost and cost > 0 and cost < math.huge
    if not (number or type(cost) == "table") then
      error(format("fetch: the 'cost' callback must answer a positive number or a table of costs by limit "
        .. "(got %s)", type(cost) == "number" and tostring(cost) or type(cost)), 0)
    end
  elseif given == nil then
    if not (per_limit and policy and policy.cost) then return per_limit and { requests = 1 } or 1 end
    local estimate = call_hook("cost", policy.cost, with_json(request))
    if type(estimate) ~= "table" then return { requests = 1 } end
    cost = {}
    for name, n in pairs(estimate) do
      if capacity[name] then cost[name] = n end -- (the limits the caller's limiter has)
    end
    return cost
  end
  if type(cost) == "table" then
    -- (a limit asked for more than it holds takes a full bucket and debt:
    -- rw.limiters)
    if not per_limit then
      error("fetch: option 'cost' is a table (a cost per limit), which only a limiter with named limits "
        .. "takes (rw.limiters{requests = a, tokens = b}); give this limiter a number", 4)
    end
  elseif given ~= nil and type(capacity) == "number" and cost > capacity then
    -- A cost no limiter could ever serve would wait forever (or fail deep inside).
    error(format("fetch: option 'cost' (%s) is more than the limiter's capacity (%s): it could never be "
      .. "served", tostring(cost), tostring(capacity)), 4)
  end
  return cost
end

-- Options tables fetch.check has passed (fetch.cache), for the fetch that
-- follows to check only what changed since: a client checks each call's
-- table where it is made, then fetches with it. { values = the values it
-- checked, by name, kept = whether they serve every fetch with the table
-- (a client's own table for calls that add no options) or only the next }.
local checked = cache.checked

--- fetch.check(url, opts [, depth [, kept]]): raises, as fetch would, for a
-- bad URL or option. For callers that run the fetch elsewhere (a shared
-- task) and want misuse reported at the call. The next fetch.fetch with
-- opts checks only the options changed since (and those whose check reads
-- what a table holds); with kept, every fetch with it does.
function plan.check(url, opts, depth, kept)
  depth = depth or 0
  url_facts(url)
  if type(opts) ~= "table" then bad_options_type(url, opts, 4 + depth) end
  local values = {}
  read_options(opts, nil, depth + 2, nil, values)
  request_method(opts, 4 + depth)
  if opts.query ~= nil then headers.with_query(url, opts.query, "fetch", 3 + depth) end
  checked[opts] = { values = values, kept = kept and true or false }
end

-- Puts into plan p the header lines of a call (from its header table,
-- key, secret names and JSON body) and their secret values, and whether a
-- key makes it replay-safe; or nil, err when no idempotency key could be
-- made.
local function request_lines(p, header_table, key, extra_secrets, json_value)
  -- A table of headers (with no key or secret_headers of the call's own)
  -- makes the same lines as the last time it was seen, if it holds the
  -- same names and values.
  local keep_made = key == nil and extra_secrets == nil and type(header_table) == "table"
    and header_table == p.opts.headers -- the caller's own, not a policy's for this call
  local made_from = json_value ~= nil and lines_made_json or lines_made
  local made = keep_made and made_lines(made_from, header_table)
    or header_table == nil and key == nil and extra_secrets == nil and json_value ~= nil and json_default_made
  local lines, given, header_secrets
  if made then
    lines, given, header_secrets = made.lines, made.given, made.secrets
  else
    lines, given, header_secrets = headers.request_lines(header_table, extra_secrets, 5)
    if json_value ~= nil then
      -- JSON goes out labelled as JSON, and asks for JSON back, unless the
      -- caller said otherwise (a vendor type such as application/vnd.api+json).
      if not given["content-type"] then lines[#lines + 1] = "Content-Type: application/json" end
      if not given.accept then lines[#lines + 1] = "Accept: application/json" end
    end
  end
  local header_key = given["idempotency-key"]
  if header_key ~= nil then
    if key ~= nil then
      error("fetch: the idempotency key is given both as an option and as a header", 4)
    end
    if not clean_key(header_key) then
      error("fetch: header 'Idempotency-Key' is blank: a blank key cannot make a request replay-safe", 4)
    end
  end
  if key == true then
    local err
    key, err = uuid4()
    if not key then
      return nil, format("%s: no idempotency key could be made: %s", p.method .. " " .. p.shown_url, tostring(err))
    end
  end
  if key then lines[#lines + 1] = "Idempotency-Key: " .. key end
  if not made then
    if not given["user-agent"] then lines[#lines + 1] = user_agent_line end
    if keep_made then keep_lines(made_from, header_table, lines, given, header_secrets) end
  end
  p.headers = lines
  if header_secrets then p.header_secrets = header_secrets end
  if key ~= nil or header_key ~= nil then p.safe = true end
  return true
end

--- p | nil, err = plan.make(url, opts, counters): a call's plan, its
-- options (a table) checked; nil, err for a call that cannot be made (no
-- idempotency key could be made). Raises for misuse at fetch.fetch's
-- caller. The plan is one record:
--   url, method, headers (the header lines), body, timeout, transport: the
--     request the engine reads (runtime.transfer), with the rarer fields
--     listed in transport (false: none); timeout is set by each attempt
--   shown_url, url_secrets, origin: plan.url_facts' of url (origin: for
--     a call with a circuit or a limiter)
--   header_secrets: the secret values among the header lines, or nil
--   safe: whether the request may be sent again (replay-safe)
--   max_elapsed: the call's time budget
--   started: when the call began (rw.now())
--   deadline: when it must end: started + max_elapsed, or the `deadline`
--     option when that comes first (by_deadline: true then)
--   attempts: the attempts made so far (0)
--   opts, counters: the call's options and an rw.client's counters
--   policy, limiter, circuit, budget, on_event, sleep, cost, retry_after,
--     retry_after_max, max_body, stream: the options the attempts and the
--     decision act on; first_byte, idle: a stream's bounds;
--     limiter_methods: the limiter's optional methods
--   hooked: whether anything is to be told of an attempt or asked before
--     one (a policy, limiter, circuit, budget, hook or stream), or the
--     call waits through a sleep of its own: without, every field of the
--     list above from policy on is nil
--   retries: the retries made so far (0)
-- It is also the call's state: fetch.fetch counts its attempts, the
-- decision keeps what it needs between them.
function plan.make(url, opts, counters)
  if type(opts) ~= "table" then bad_options_type(url, opts, 4) end
  -- (every field a plain call sets is here, so that the table is made at
  -- its size)
  -- The call starts here: its time budget runs from now.
  local started = now()
  local p = { url = url, method = "GET", headers = default_lines, timeout = false, transport = false,
    shown_url = false, safe = true, hooked = false, retries = 0, opts = opts, attempts = 0,
    max_elapsed = opts.max_elapsed or DEFAULT_MAX_ELAPSED, started = started, deadline = false }
  local mark = checked[opts] -- fetch.check's
  if mark and not mark.kept then checked[opts] = nil end
  local names, others = read_options(opts, mark and mark.values, 2, p)
  p.deadline = started + p.max_elapsed -- (the options checked)
  local method, body, json_value, header_table, key, extra_secrets = "GET", nil, nil, opts.headers, nil, nil
  local policy, secret_headers, stream
  -- (others: else every option below is nil; "body": all but the method, body and json)
  local query = others == true and opts.query
  if query then
    url_facts(url, 1)
    url = headers.with_query(url, query, "fetch", 3)
  end
  local shown_url, url_secrets, origin = url_facts(url, 1)
  -- The call's policy (a provider's name, false for none), else the
  -- provider of the API at its host: a call to one takes the full path.
  if others == true then policy = opts.policy end
  policy = providers.resolve(policy, origin, "fetch", 3)
  if policy and others ~= true then others = true end
  if others then
    json_value, body = opts.json, opts.body
    if opts.method ~= nil or body ~= nil or json_value ~= nil then method = request_method(opts, 4) end
    if json_value ~= nil then body = json.encode(json_value, "fetch: option 'json'", 3) end
  end
  if others == true then
    if policy and policy.prepare then
      header_table, key = prepared(opts, policy, method, url, body)
    else
      key = opts.idempotency_key
    end
    secret_headers = opts.secret_headers
    extra_secrets = secret_headers and headers.secret_set(secret_headers, "fetch")
    stream = opts.stream == true
  end
  p.shown_url = shown_url
  if query then p.url = url end
  if url_secrets then p.url_secrets = url_secrets end
  if counters ~= nil then p.counters = counters end
  if others then
    if body ~= nil then p.body = body end
    p.method, p.safe = method, replay_safe[method] or others == true and opts.retry_non_idempotent or false
  end
  if header_table ~= nil or key ~= nil or json_value ~= nil then
    local made, err = request_lines(p, header_table, key, extra_secrets, json_value)
    if not made then return nil, fetch_error("entropy", err, p) end
  end

  -- The request's fields the engine reads only when listed.
  -- (servers expect a Content-Length on these even when the body is empty)
  if body == nil and has_body[method] then names = list_field(p, names, "empty_body", true) end
  -- libcurl re-sends a request on its own when a reused connection turns
  -- out to be dead; only a replay-safe request may take that chance (the
  -- engine keeps any other from it: src/request.c, no_replay).
  if not p.safe then names = list_field(p, names, "no_replay", true) end
  if others == true then
    local limiter, circuit, budget, on_event = opts.limiter, opts.circuit, opts.budget, opts.on_event
    local sleep, retry_after, retry_after_max = opts.sleep, opts.retry_after, opts.retry_after_max
    -- (each set only when given: a nil makes no field, but costs the look for one)
    if policy ~= nil then p.policy = policy end
    if limiter ~= nil then p.limiter = limiter end
    if circuit ~= nil then p.circuit = circuit end
    -- (what the circuit is asked and told of, and what a limiter's
    -- answers must come from: carry.lua)
    if circuit ~= nil or limiter ~= nil then p.origin = origin end
    if budget ~= nil then p.budget = budget end
    if on_event ~= nil then p.on_event = on_event end
    if sleep ~= nil then p.sleep = sleep end
    if retry_after ~= nil then p.retry_after = retry_after end -- nil: honor
    if retry_after_max ~= nil then p.retry_after_max = retry_after_max end
    p.hooked = (policy or limiter or circuit or budget or on_event or stream or sleep) and true or false
    if (retry_after == "clamp" or retry_after == "fail_fast") and not retry_after_max then
      error(format("fetch: option 'retry_after' = %q needs retry_after_max, the longest wait to accept",
        retry_after), 3)
    end
    local given = opts.deadline
    if given ~= nil then
      -- A time on another clock (os.time(), ngx.now(): seconds since 1970)
      -- lies decades past rw.now()'s, and would bound nothing.
      if given - started > OTHER_CLOCK then
        error(format("fetch: option 'deadline' is %.0f s away: it is a time on rw.now()'s clock (rw.now() + "
          .. "seconds), not on os.time()'s or ngx.now()'s", given - started), 3)
      end
      -- The earlier end wins: the deadline, or max_elapsed from the start.
      if given < p.deadline then p.deadline, p.by_deadline = given, true end
    end
    if limiter then
      local request = { method = method, url = url, headers = header_table, body = body, json = json_value }
      -- A limiter that holds the limits of several (rw.by_model) names the
      -- one of this request, which serves the whole call.
      local for_request = optional_method(limiter, "for_request")
      if for_request then limiter = chosen_limiter(limiter, for_request, with_json(request)) end
      p.limiter = limiter
      if limiter then
        p.cost = call_cost(opts, limiter, policy, request)
        p.limiter_methods = limiter_methods(limiter)
      end
    end
    if opts.follow_redirects == false then names = list_field(p, names, "follow_redirects", false) end
    local max_body = opts.max_body
    if max_body ~= nil then names = list_field(p, names, "max_body", max_body) end
    local verify_tls = opts.verify_tls
    if verify_tls ~= nil then
      names = list_field(p, names, "verify_tls", verify_tls)
      if verify_tls == false then warn_insecure() end
    end
    -- More names whose lines the engine keeps from another origin.
    if secret_headers ~= nil then names = list_field(p, names, "secret_headers", secret_headers) end
    if stream then
      -- the bound on the time to its headers (cut to the time left by each
      -- attempt), and on a silence in its body
      p.first_byte = opts.first_byte_timeout or opts.timeout or DEFAULT_TIMEOUT
      p.idle = opts.idle_timeout or STREAM_IDLE_TIMEOUT
      names = list_field(p, names, "first_byte_timeout", p.first_byte)
      names = list_field(p, names, "idle_timeout", p.idle)
    end
  end
  p.transport = names or false -- false: the engine need not look for any
  return p
end

return plan
