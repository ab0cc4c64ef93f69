-- fetch.plan: what a call will do, worked out once before its first
-- attempt: its options checked, what is printed of its URL, the URL's
-- secrets and origin, its method, body and header lines, and what it asks
-- of the attempts (a limiter, a circuit, a stream...). What is kept from
-- one call for the next lives in fetch.cache.
local core = require "ratewise.core"
local headers = require "ratewise.headers"
local json = require "ratewise.json"
local log = require "ratewise.log"
local runtime = require "ratewise.runtime"
local cache = require "ratewise.fetch.cache"
local report = require "ratewise.fetch.report"
local options = require "ratewise.options"

local now = core.now
local format, lower, upper = string.format, string.lower, string.upper
local find, match, sub, byte = string.find, string.match, string.sub, string.byte
local type, tostring, pcall, pairs, ipairs, next, getmetatable, rawget, error =
  type, tostring, pcall, pairs, ipairs, next, getmetatable, rawget, error
local call_hook, fetch_error = report.call_hook, report.fetch_error

-- n, k1, v1, k2, v2, k3, v3 = few_fields(t): the fields of table t and how
-- many, when it has no metatable and three at most; else false; nil for a
-- value that is not a table. One call of C (core.few_fields) where type,
-- getmetatable and next made four or five; under LuaJIT, whose compiler
-- makes those few instructions of a trace and cannot follow a call of C,
-- the same answer from them.
local few_fields = core.few_fields
if rawget(_G, "jit") ~= nil then
  few_fields = function(t)
    if type(t) ~= "table" then return nil end
    if getmetatable(t) ~= nil then return false end
    local k1, v1 = next(t)
    if k1 == nil then return 0 end
    local k2, v2 = next(t, k1)
    if k2 == nil then return 1, k1, v1 end
    local k3, v3 = next(t, k2)
    if k3 == nil then return 2, k1, v1, k2, v2 end
    if next(t, k3) ~= nil then return false end
    return 3, k1, v1, k2, v2, k3, v3
  end
end

local plan = {}

-- Methods that may be sent again without asking (RFC 9110 9.2.2 idempotent
-- methods, less TRACE, which has no business in an API client).
local replay_safe = { GET = true, HEAD = true, OPTIONS = true, PUT = true, DELETE = true }
-- Methods servers expect a Content-Length on even when the body is empty:
-- a request of them without a body has a field the engine reads only when
-- listed (attempt.send's empty_body).
local has_body = { POST = true, PUT = true, PATCH = true }
plan.has_body = has_body

-- The time budget of a call that gives none, and its attempts' timeout.
local DEFAULT_MAX_ELAPSED, DEFAULT_TIMEOUT = 120, 30
plan.DEFAULT_MAX_ELAPSED, plan.DEFAULT_TIMEOUT = DEFAULT_MAX_ELAPSED, DEFAULT_TIMEOUT

-- test into production should not go unnoticed.
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
local check = options.check
local function check_option(name, v, depth)
  check("fetch", fetch_options, name, v, 3 + (depth or 0))
end

-- The transport options that go to the engine as they are (src/request.c).
local transport_options, is_transport_option = options.transport, options.is_transport
plan.transport_options, plan.is_transport_option = transport_options, is_transport_option

-- The options a call may have and still take fetch's common path: a GET
-- whose other options are read where they matter (the timeouts, the
-- headers), only at a retry, or by the engine alone (the transport options
-- that are not a stream's: a CA file, a client certificate, a proxy, which
-- set_transport hands on). An option whose entry is a value rather than
-- true is common with that value only: `method = "GET"`, as an
-- rw.client's calls name it.
local is_common_option = { method = "GET" }
for _, name in ipairs { "headers", "timeout", "max_elapsed", "max_retries", "on_retry", "delay", "base",
  "max_delay", "jitter", "hint_jitter" } do
  is_common_option[name] = true
end
for _, name in ipairs(transport_options) do
  if name ~= "stream" and name ~= "first_byte_timeout" and name ~= "idle_timeout" then
    is_common_option[name] = true
  end
end
-- The options a call with a body may add and still take a shorter path
-- (fetch.fetch's "body" class): a POST of JSON with headers and timeouts
-- reads the method, body and json, and none of the other options.
local is_body_option = { method = true, body = true, json = true }

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

-- The URL facts kept (fetch.cache): by URL, and the origins by
-- scheme://authority; and (listed there) the call before's.
local url_facts_of, origin_of = cache.url_facts, cache.origin_of
local last_url, last_shown, last_secrets, last_origin = false, false, false, false
local last_head, last_head_origin = false, false
local keep, URL_KEPT_MAX = cache.keep, cache.URL_KEPT_MAX
local SLASH, QUESTION, HASH = byte("/"), byte("?"), byte("#")

-- What is printed of a URL on a known origin (head: its scheme://authority
-- as written, n = #head) with no "@" (which redact_url reads closely), no
-- space and no control character (check_url's): the URL up to its query or
-- fragment. nil when it is not one (the full parse then decides).
local function shown_on(url, n)
  local c = byte(url, n + 1)
  if c ~= nil and c ~= SLASH and c ~= QUESTION and c ~= HASH then return nil end
  if find(url, "@", n + 1, true) or find(url, " ", 1, true) or find(url, "%c") then return nil end
  local query, fragment = find(url, "?", n + 1, true), find(url, "#", n + 1, true)
  local cut = query and fragment and (query < fragment and query or fragment) or query or fragment
  return cut and sub(url, 1, cut - 1) or url
end

-- What fetch derives from a URL it has not kept (url_facts): checked,
-- printed, its credentials and origin; the URL kept by URL when it carries
-- no credentials. On a known origin without "@", a few plain finds
-- instead of the dozen patterns of headers.redact_url and headers.origin
-- (the origin before is matched with no pattern at all: a Lua pattern's
-- character class costs tens of instructions a byte).
local function learn_url(url, level)
  local shown = last_head and type(url) == "string" and find(url, last_head, 1, true) == 1
    and shown_on(url, #last_head)
  local secrets, origin
  if shown then
    secrets, origin = false, last_head_origin
  else
    local head = type(url) == "string" and match(url, "^%a[%w+.-]*://[^/?#@]*")
    origin = head and origin_of[head]
    shown = origin and shown_on(url, #head)
    if shown then
      secrets = false
      last_head, last_head_origin = head, origin
    else
      check_url(url, level)
      shown = headers.redact_url(url)
      secrets = url:find("@", 1, true) and headers.url_secrets(url, {}) or false
      origin = headers.origin(url)
      if head and not find(url, "@", 1, true) then -- head is then the whole authority
        keep(origin_of, head, origin)
        last_head, last_head_origin = head, origin
      end
    end
  end
  if not secrets and #url <= URL_KEPT_MAX then keep(url_facts_of, url, { shown, origin }) end
  return shown, secrets, origin
end

--- shown, secrets, origin = plan.url_facts(url [, extra]): what is printed
-- of url (its query and credentials out), its credentials (false for
-- none: headers.url_secrets) and its origin; raises for a URL fetch does
-- not take, at the caller `extra` frames above url_facts' own.
local function url_facts(url, extra)
  if url ~= last_url then
    local facts = url_facts_of[url]
    if facts then
      last_shown, last_secrets, last_origin = facts[1], false, facts[2]
    else
      last_shown, last_secrets, last_origin = learn_url(url, 5 + (extra or 0))
    end
    last_url = url
  end
  return last_shown, last_secrets, last_origin
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
-- (an Authorization line) on every call, and checking each name and value
-- again cost more than the rest of the call. A table whose contents changed
-- since is checked and turned into lines anew. A table is kept from its
-- second call on (one made for each call costs a mark, not a copy), and no
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
  if made.n == 1 then
    -- The commonest table, one header (a credential), without a loop: a
    -- loop of one turn here kept LuaJIT from compiling the calls around it
    -- ("inner loop in root trace"), and a client's calls ran interpreted.
    local n, name, value = few_fields(t)
    if n then return n == 1 and name == names[1] and value == values[1] end
  end
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


-- The options table of the call before (listed in fetch.cache), its
-- names and values then (three at most), and what checking it answered;
-- kept from a table's second call in a row on (seen: the table of the call
-- before), so that a table made for each call costs a comparison, not a
-- copy. A table whose options hold objects checked for their contents
-- (contents_checked: an array of names, a limiter's methods) is checked
-- again at each call.
local last_opts, last_seen, last_k1, last_v1, last_k2, last_v2, last_k3, last_v3, last_transport, last_common =
  false, false
local contents_checked = { secret_headers = true, limiter = true, circuit = true, budget = true, policy = true }

-- Checks the options a call gives, its table's own and those it inherits
-- through __index tables (a per-call table over a base), and returns
-- whether any is a transport option, whether they could all be listed (an
-- __index that is a function cannot be, and the options behind it go
-- unchecked), and whether all are common ones (is_common_option: true),
-- or common ones and a method, body or json ("body"), or not (false).
-- `depth` is check_option's. n, k1, v1, k2, v2, k3, v3: few_fields(opts),
-- which the caller has asked (plan.make, which looks first for the table
-- of the call before). Raises for opts that is not a table
-- (after any error of url, fetch's order).
local function check_options(opts, depth, url, n, k1, v1, k2, v2, k3, v3)
  -- A table of one to three options (most calls' own), without a
  -- metatable, is checked without a loop: a loop of one turn keeps LuaJIT
  -- from compiling the calls around it ("inner loop in root trace"), and
  -- fetch ran interpreted.
  if n then
    if n == 0 then return false, true, true end
    check_option(k1, v1, depth)
    local common1 = is_common_option[k1]
    common1 = common1 == true or common1 == v1 or is_body_option[k1] and "body"
    if k2 == nil then
      local transport = is_transport_option[k1] == true
      common1 = common1 or false
      if opts ~= last_seen then
        last_seen = opts
      elseif not contents_checked[k1] then
        last_opts, last_k1, last_v1, last_k2, last_v2, last_k3, last_v3 = opts, k1, v1, nil, nil, nil, nil
        last_transport, last_common = transport, common1
      end
      return transport, true, common1
    end
    check_option(k2, v2, depth)
    local common2 = is_common_option[k2]
    common2 = common2 == true or common2 == v2 or is_body_option[k2] and "body"
    local transport = is_transport_option[k1] == true or is_transport_option[k2] == true
    local common = common1 == true and common2 or common1 and common2 and "body" or false
    if k3 ~= nil then -- three (a POST of JSON: its method, its json and a hook or a timeout)
      check_option(k3, v3, depth)
      local common3 = is_common_option[k3]
      common3 = common3 == true or common3 == v3 or is_body_option[k3] and "body"
      transport = transport or is_transport_option[k3] == true
      common = common == true and common3 or common and common3 and "body" or false
    end
    if opts ~= last_seen then
      last_seen = opts
    elseif not (contents_checked[k1] or contents_checked[k2] or contents_checked[k3]) then
      last_opts, last_k1, last_v1, last_k2, last_v2, last_k3, last_v3 = opts, k1, v1, k2, v2, k3, v3
      last_transport, last_common = transport, common
    end
    return transport, true, common
  end
  if n == nil then bad_options_type(url, opts, depth + 3) end
  local transport, common = false, true
  local t = opts
  for _ = 1, 16 do -- a loop of __index tables ends here too
    for k, v in pairs(t) do
      if t == opts or rawget(opts, k) == nil then -- an own option hides an inherited one
        check_option(k, v, depth)
        if is_transport_option[k] then transport = true end
        local common_as = is_common_option[k]
        if common_as ~= true and common_as ~= v then
          if not is_body_option[k] then common = false elseif common then common = "body" end
        end
      end
    end
    local mt = getmetatable(t)
    if mt == nil then return transport, true, common end
    local index = type(mt) == "table" and rawget(mt, "__index")
    if index == nil then return transport, true, common end
    if type(index) ~= "table" then return transport, false, false end
    t = index
  end
  return transport, false, false
end

-- What the caller's hooks may change before the first attempt: a policy's
-- prepare sees (and may add to) the headers and the idempotency key.
local function prepared(opts, method, url, body)
  local prepare = opts.policy and opts.policy.prepare
  if not prepare then return opts.headers, opts.idempotency_key end
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
-- honors_max_wait = boolean }. A limiter may be any object with acquire
-- (an __index that raises means "no such method"), so the lookups are
-- guarded, and made once per limiter (fetch.cache).
local limiter_methods_of = cache.limiter_methods
local function optional_method(object, name)
  local ok, found = pcall(function() return object[name] end)
  return ok and type(found) == "function" and found or false
end
local function limiter_methods(limiter)
  local m = limiter_methods_of[limiter]
  if not m then
    local ok, honors = pcall(function() return limiter.honors_max_wait == true end)
    m = { wait_time = optional_method(limiter, "wait_time"), observe = optional_method(limiter, "observe"),
      honors_max_wait = ok and honors }
    limiter_methods_of[limiter] = m
  end
  return m
end

-- Apart from fetch: a closure inside it would cost LuaJIT's compiler every
-- return of fetch (closing upvalues is not compiled).
local function limiter_capacity(limiter)
  return limiter:capacity()
end

-- Options tables fetch.check has passed (fetch.cache), with what
-- check_options found (OPTIONS_*), for the fetch that follows to take
-- instead of checking them again: a client checks each call's table where
-- it is made, then fetches with it. Taken once. A mark below zero is kept
-- for every fetch with the table: a client's own table for calls that add
-- no options, which nobody else holds and the client never changes.
local checked = cache.checked
-- no transport option; one at least; options behind an __index function;
-- common options only (is_common_option), without or with transport ones
local OPTIONS_PLAIN, OPTIONS_TRANSPORT, OPTIONS_UNLISTED, OPTIONS_COMMON, OPTIONS_COMMON_TRANSPORT = 1, 2, 3, 4, 5
local OPTIONS_BODY, OPTIONS_BODY_TRANSPORT = 6, 7

-- A mark's word on the table, as check_options says it: (transport,
-- listed, common).
local function marked(mark)
  return mark == OPTIONS_TRANSPORT or mark == OPTIONS_COMMON_TRANSPORT or mark == OPTIONS_BODY_TRANSPORT,
    mark ~= OPTIONS_UNLISTED, mark >= OPTIONS_BODY and "body" or mark >= OPTIONS_COMMON
end

--- fetch.check(url, opts [, depth [, kept]]): raises, as fetch would, for a
-- bad URL or option. For callers that run the fetch elsewhere (a shared
-- task) and want misuse reported at the call. The next fetch.fetch with
-- opts (a table its caller leaves as it was) does not check them again;
-- with kept, no fetch with it does (for a table its owner never changes).
function plan.check(url, opts, depth, kept)
  depth = depth or 0
  url_facts(url)
  if type(opts) ~= "table" then bad_options_type(url, opts, 4 + depth) end
  local transport, listed, common = check_options(opts, depth + 2, nil, few_fields(opts))
  request_method(opts, 4 + depth)
  if opts.query ~= nil then headers.with_query(url, opts.query, "fetch", 3 + depth) end
  local mark = common == true and (transport and OPTIONS_COMMON_TRANSPORT or OPTIONS_COMMON)
    or common == "body" and (transport and OPTIONS_BODY_TRANSPORT or OPTIONS_BODY)
    or not listed and OPTIONS_UNLISTED or transport and OPTIONS_TRANSPORT or OPTIONS_PLAIN
  checked[opts] = kept and -mark or mark
end



-- The state of a call, the table its attempts and decision share: made
-- with the plan for a call with options beyond the common ones, and for a
-- common call only at its first attempt that does not succeed (a call that
-- succeeds at once builds none).
local function new_state(started, method, shown_url, max_elapsed, on_event)
  return { attempts = 0, retries = 0, started = started, method = method, shown_url = shown_url,
    max_elapsed = max_elapsed, on_event = on_event }
end
plan.new_state = new_state

--- state = plan.state(opts, counters, method, shown_url, url_secrets, header_secrets, safe, started,
-- deadline): the state of a common call, made at its first attempt that
-- does not succeed.
function plan.state(opts, counters, method, shown_url, url_secrets, header_secrets, safe, started, deadline)
  local state = new_state(started, method, shown_url, opts.max_elapsed or DEFAULT_MAX_ELAPSED, nil)
  state.opts, state.counters, state.url_secrets, state.header_secrets = opts, counters, url_secrets, header_secrets
  state.safe, state.deadline = safe, deadline
  return state
end

--- url, method, body, lines, header_secrets, shown_url, url_secrets, transport, rare, safe, state =
-- plan.make(url, opts, counters): a call's plan, its
-- options (a table) checked; or nil, err for a call that cannot be made.
-- Raises for misuse at fetch.fetch's caller. transport: whether the call
-- names a transport option; rare: whether the request has fields the
-- engine reads only when listed; state: the call's state (new_state) for a
-- call with options beyond the common ones, else nil.
function plan.make(url, opts, counters)
  -- whether the call names a transport option: one pass over what it
  -- gives, instead of a look for each of them
  -- common: true for a GET whose options are all common ones
  -- (is_common_option), "body" for common ones and a method, body or json
  -- (is_body_option): neither need look for the others
  local transport, listed, common
  local found = checked[opts]
  if found then -- fetch.check's
    if found > 0 then checked[opts] = nil else found = -found end
    transport, listed, common = marked(found)
  else
    local n, k1, v1, k2, v2, k3, v3 = few_fields(opts)
    -- The table of the call before, with the same names and values (one
    -- options table made once and passed to every call): what its check
    -- found then. (Asked here, not in check_options: a call less.)
    if n and opts == last_opts and k1 == last_k1 and v1 == last_v1 and k2 == last_k2 and v2 == last_v2
      and k3 == last_k3 and v3 == last_v3 then
      transport, listed, common = last_transport, true, last_common
    else
      transport, listed, common = check_options(opts, 2, url, n, k1, v1, k2, v2, k3, v3)
    end
  end
  local query, json_value
  if common == "body" then
    json_value = opts.json
  elseif not common then
    query, json_value = opts.query, opts.json
    if query ~= nil then
      url_facts(url, 1)
      url = headers.with_query(url, query, "fetch", 3)
    end
  end
  local shown_url, url_secrets, origin
  if url == last_url then -- most calls: the URL of the call before
    shown_url, url_secrets, origin = last_shown, last_secrets, last_origin
  else
    shown_url, url_secrets, origin = url_facts(url, 1)
  end

  local method, body, policy, header_table, key, extra_secrets
  if common == true then
    method, header_table = "GET", opts.headers
  elseif common == "body" then
    method, body, header_table = request_method(opts, 4), opts.body, opts.headers
    if json_value ~= nil then body = json.encode(json_value, "fetch: option 'json'", 3) end
  else
    method, body = opts.method, opts.body
    if method == nil and body == nil and json_value == nil then
      method = "GET"
    else
      method = request_method(opts, 4)
    end
    if json_value ~= nil then
      body = json.encode(json_value, "fetch: option 'json'", 3)
    end
    policy = opts.policy
    if policy and policy.prepare then
      header_table, key = prepared(opts, method, url, body)
    else
      header_table, key = opts.headers, opts.idempotency_key
    end
    extra_secrets = opts.secret_headers and headers.secret_set(opts.secret_headers, "fetch")
  end
  local lines, given, header_secrets = default_lines, no_names, nil
  if header_table ~= nil or key ~= nil or json_value ~= nil then
    -- A table of headers (with no key or secret_headers of the call's own)
    -- makes the same lines as the last time it was seen, if it holds the
    -- same names and values.
    local keep_made = key == nil and extra_secrets == nil and type(header_table) == "table"
      and header_table == opts.headers -- the caller's own, not a policy's for this call
    local made_from = json_value ~= nil and lines_made_json or lines_made
    local made = keep_made and made_lines(made_from, header_table)
      or header_table == nil and key == nil and extra_secrets == nil and json_value ~= nil and json_default_made
    if made then
      lines, given, header_secrets = made.lines, made.given, made.secrets
    else
      lines, given, header_secrets = headers.request_lines(header_table, extra_secrets, 4)
    end
    if json_value ~= nil and not made then
      -- JSON goes out labelled as JSON, and asks for JSON back, unless the
      -- caller said otherwise (a vendor type such as application/vnd.api+json).
      if not given["content-type"] then lines[#lines + 1] = "Content-Type: application/json" end
      if not given.accept then lines[#lines + 1] = "Accept: application/json" end
    end
    local header_key = given["idempotency-key"]
    if header_key ~= nil then
      if key ~= nil then
        error("fetch: the idempotency key is given both as an option and as a header", 3)
      end
      if not clean_key(header_key) then
        error("fetch: header 'Idempotency-Key' is blank: a blank key cannot make a request replay-safe", 3)
      end
    end
    if key == true then
      local err
      key, err = uuid4()
      if not key then
        local state = new_state(now(), method, shown_url, opts.max_elapsed or DEFAULT_MAX_ELAPSED, opts.on_event)
        return nil, fetch_error("entropy", format("%s: no idempotency key could be made: %s",
          method .. " " .. shown_url, tostring(err)), state)
      end
    end
    if key then lines[#lines + 1] = "Idempotency-Key: " .. key end
    if not made then
      if not given["user-agent"] then lines[#lines + 1] = user_agent_line end
      if keep_made then keep_lines(made_from, header_table, lines, given, header_secrets) end
    end
  end

  if common == true then
    -- a replay-safe GET that follows redirects, with no hooks, limiter or
    -- stream, and no field the engine reads only when listed but its
    -- transport options
    return url, method, nil, lines, header_secrets, shown_url, url_secrets, transport, transport, true
  elseif common == "body" then
    -- a request with a body, and no key, hook, limiter or stream: its
    -- method or an Idempotency-Key header says whether it is replay-safe
    local safe = replay_safe[method] or given["idempotency-key"] ~= nil
    return url, method, body, lines, header_secrets, shown_url, url_secrets, transport,
      transport or body == nil and has_body[method] or not safe and "no_replay", safe
  end
  local safe = replay_safe[method] or opts.retry_non_idempotent or key ~= nil or given["idempotency-key"] ~= nil
  local max_elapsed = opts.max_elapsed or DEFAULT_MAX_ELAPSED
  local timeout = opts.timeout or DEFAULT_TIMEOUT
  local limiter, circuit, budget, on_event = opts.limiter, opts.circuit, opts.budget, opts.on_event
  local state = new_state(false, method, shown_url, max_elapsed, on_event)
  state.opts, state.counters, state.url_secrets, state.header_secrets, state.origin = opts, counters, url_secrets,
    header_secrets, origin
  state.policy, state.limiter, state.circuit, state.budget = policy, limiter, circuit, budget
  local cost = limiter and (opts.cost or 1)
  state.cost = cost
  local retry_after = opts.retry_after -- nil: honor
  if retry_after == "clamp" or retry_after == "fail_fast" then
    state.retry_after_max = opts.retry_after_max
    if not state.retry_after_max then
      error(format("fetch: option 'retry_after' = %q needs retry_after_max, the longest wait to accept",
        retry_after), 3)
    end
  end
  state.retry_after = retry_after
  local follow, max_body, verify_tls = opts.follow_redirects ~= false, opts.max_body, opts.verify_tls
  state.follow, state.max_body, state.verify_tls = follow, max_body, verify_tls
  if verify_tls == false then warn_insecure() end
  local stream = opts.stream == true
  state.stream = stream
  if not listed then -- options behind an __index function: looked for one by one
    for i = 1, #transport_options do
      if opts[transport_options[i]] ~= nil then transport = true end
    end
  end
  if stream then
    -- the bound on the time to its headers, and on a silence in its body
    state.first_byte = opts.first_byte_timeout or timeout
    state.idle = opts.idle_timeout or STREAM_IDLE_TIMEOUT
  end
  local no_replay = not safe or nil
  if opts.cost and limiter then
    -- A cost no limiter could ever serve would wait forever (or fail deep inside).
    local ok, capacity = pcall(limiter_capacity, limiter)
    if ok and type(capacity) == "number" and cost > capacity then
      error(format("fetch: option 'cost' (%s) is more than the limiter's capacity (%s): it could never be "
        .. "served", tostring(cost), tostring(capacity)), 3)
    end
  end
  if limiter then state.limiter_methods = limiter_methods(limiter) end
  local secret_headers = opts.secret_headers
  state.secret_headers, state.sleep, state.safe = secret_headers, opts.sleep, safe
  -- whether the request has fields the engine reads only when listed (a
  -- plain GET has none: the engine looks up six fields, not twelve)
  local rare = transport or body == nil and has_body[method] or not follow or max_body ~= nil or verify_tls ~= nil
    or no_replay or secret_headers ~= nil
  -- Whether the call has anything to tell of an attempt or to ask before
  -- one (a policy, limiter, circuit, budget, hook or stream): without, a
  -- 2xx is returned as soon as it is made a response.
  state.hooked = (policy or limiter or circuit or budget or on_event or stream) and true or false
  return url, method, body, lines, header_secrets, shown_url, url_secrets, transport, rare, safe, state
end

return plan
