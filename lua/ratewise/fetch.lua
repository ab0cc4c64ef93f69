-- fetch: one HTTP request, retried the way the server asks.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local headers = require "ratewise.headers"
local json = require "ratewise.json"
local log = require "ratewise.log"
local response = require "ratewise.response"
local retry = require "ratewise.retry"
local runtime = require "ratewise.runtime"
local policy_module = require "ratewise.policy"
local CANCELLED = require("ratewise.scheduler").CANCELLED

local classify, now = core.classify, core.now
local format, lower, upper = string.format, string.lower, string.upper
local find, match, sub, byte = string.find, string.match, string.sub, string.byte
local min, huge = math.min, math.huge
local type, tostring, pcall, pairs, getmetatable, rawget = type, tostring, pcall, pairs, getmetatable, rawget

local fetch = {}

-- Methods that may be sent again without asking (RFC 9110 9.2.2 idempotent
-- methods, less TRACE, which has no business in an API client).
local replay_safe = { GET = true, HEAD = true, OPTIONS = true, PUT = true, DELETE = true }
-- Methods servers expect a Content-Length on even when the body is empty.
local has_body = { POST = true, PUT = true, PATCH = true }

---------------------------------------------------------------------------
-- Errors

local call_hook -- defined with the other callback helpers below

local error_mt = errors.mt
local response_mt = response.mt

local function fetch_error(kind, message, state, res, transport)
  local err = setmetatable({
    kind = kind,
    message = message,
    status = res and res.status or (transport and transport.status) or nil,
    response = res,
    attempts = state.attempts,
    elapsed = now() - state.started,
    transport = transport,
  }, error_mt)
  -- A call that ends on a response that asked for a wait tells the caller
  -- when to come back: retry_in seconds from now, at retry_at (epoch
  -- seconds), for callers that reschedule the work themselves.
  local hint = res and state.hint
  if hint then
    err.retry_in = hint
    err.retry_at = core.time() + hint
  end
  -- Every call that fails tells a listener how it ended (an open circuit
  -- already said so with its own event).
  if state.on_event and kind ~= "circuit_open" then
    call_hook("on_event", state.on_event, { type = "error", kind = kind, status = err.status,
      attempts = err.attempts })
  end
  return err
end

local function budget_error(state, why, res, transport)
  return nil, fetch_error("budget", format("%s: %s (max_elapsed %.2f s, %d attempt%s)",
    state.method .. " " .. state.shown_url, why, state.max_elapsed, state.attempts, state.attempts == 1 and "" or "s"),
    state, res, transport)
end

fetch.error_mt = error_mt

-- verify_tls = false is said once per process, on the operator's log
-- (rw.configure{tls_warning = false} silences it): a setting copied from a
-- test into production should not go unnoticed.
local warned_insecure = false
local function warn_insecure()
  if warned_insecure or not runtime.tls_warning() then return end
  warned_insecure = true
  log.write("ratewise: verify_tls = false: TLS certificates are not checked; an attacker on the path "
    .. "can read and change the traffic (said once; rw.configure{tls_warning = false} silences this)", "warn")
end

-- The time budget of a call that gives none.
local DEFAULT_MAX_ELAPSED = 120
-- How far a hinted wait is spread past the hint (spread_hint): a fifth,
-- so that callers who got one Retry-After come back over a fifth of it.
local HINT_JITTER = 0.2
fetch.DEFAULT_MAX_ELAPSED = DEFAULT_MAX_ELAPSED

---------------------------------------------------------------------------
-- Options

local option_checks = {
  method = "string", headers = "table", body = "string", timeout = "positive",
  max_retries = "count", max_elapsed = "positive", max_delay = "finite",
  retry_non_idempotent = "boolean", idempotency_key = "key", limiter = "limiter",
  on_retry = "callback_or_false", delay = "function", sleep = "function",
  follow_redirects = "boolean", base = "positive", jitter = "jitter",
  max_body = "nonnegative", verify_tls = "boolean", policy = "policy", circuit = "circuit",
  budget = "budget", cost = "positive", on_event = "function", secret_headers = "names",
  retry_after = "retry_after", retry_after_max = "positive", hint_jitter = "finite",
  ca_file = "string", ca_path = "string", client_cert = "string", client_key = "string",
  client_key_password = "string", pinned_public_key = "string", tls_min_version = "tls_version",
  proxy = "string", proxy_ca_file = "string", decompress = "boolean", json = "table", query = "table",
  stream = "boolean", connect_timeout = "positive", first_byte_timeout = "positive", idle_timeout = "positive",
}

-- The transport options that go to the engine as they are (src/request.c).
local transport_options = { "ca_file", "ca_path", "client_cert", "client_key", "client_key_password",
  "pinned_public_key", "tls_min_version", "proxy", "proxy_ca_file", "decompress", "connect_timeout",
  "first_byte_timeout", "idle_timeout", "stream" }
local is_transport_option = {}
for _, name in ipairs(transport_options) do is_transport_option[name] = true end

-- The options a call may have and still take fetch's common path: a GET
-- whose other options are read where they matter (the timeouts, the
-- headers), only at a retry, or by the engine alone (the transport options
-- that are not a stream's: a CA file, a client certificate, a proxy, which
-- set_transport hands on). A call with no others reads none of the two
-- dozen a request may have (a look-up each, most of them misses). An
-- option whose entry is a value rather than true is common with that value
-- only: `method = "GET"`, as an rw.client's calls name it.
local is_common_option = { method = "GET" }
for _, name in ipairs { "headers", "timeout", "max_elapsed", "max_retries", "on_retry", "delay", "base",
  "max_delay", "jitter", "hint_jitter", "ca_file", "ca_path", "client_cert", "client_key", "client_key_password",
  "pinned_public_key", "tls_min_version", "proxy", "proxy_ca_file", "decompress", "connect_timeout" } do
  is_common_option[name] = true
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

-- What a call does with a wait the server asked for (docs/limits.md).
local retry_after_modes = { honor = true, clamp = true, fail_fast = true, defer = true }

-- The methods an object option must have.
local required_methods = {
  limiter = { "acquire" }, circuit = { "allow", "record" }, budget = { "request", "allow_retry" },
}

-- An idempotency key the server can tell apart: blank or empty ones are not.
local function clean_key(v)
  return type(v) == "string" and v:find("%S") ~= nil and not v:find("%c")
end

-- `depth` counts the frames between fetch's caller and the function that
-- checks (0 for fetch itself), so that the error names the caller's line.
-- Shown by their type only: a string given for them may hold a credential
-- (a JSON document or query string already encoded, a header line).
local secret_options = { client_key_password = true, proxy = true, headers = true, json = true, query = true,
  secret_headers = true, body = true }
local function bad_option(name, expected, v, depth)
  errors.bad_option("fetch", name, expected, v, 4 + depth, secret_options[name])
end

-- What each kind of option must be: a check of value v (of type t), and
-- the words for what it must be. A kind without one here is a Lua type.
local checkers = {
  positive = function(v, t) return t == "number" and v == v and v > 0 and v ~= huge, "a positive number" end,
  nonnegative = function(v, t) return t == "number" and v == v and v >= 0, "a non-negative number" end,
  finite = function(v, t) return t == "number" and v == v and v >= 0 and v ~= huge, "a finite non-negative number" end,
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
  policy = function(v) return policy_module.is_policy(v), "a policy made by rw.policy" end,
  callback_or_false = function(v, t) return v == false or t == "function", "a function or false" end,
}
for kind, methods in pairs(required_methods) do
  local expected = "an object with the methods " .. table.concat(methods, ", ")
  checkers[kind] = function(v)
    for _, m in ipairs(methods) do
      local ok, fn = pcall(function() return v[m] end)
      if not ok or type(fn) ~= "function" then return false, expected end
    end
    return true
  end
end

local function check_option(name, v, depth)
  local check = option_checks[name]
  if not check then
    error(format("fetch: unknown option '%s'", tostring(name)), 3 + (depth or 0))
  end
  local t = type(v)
  local checker = checkers[check]
  if checker then
    local ok, expected = checker(v, t)
    if not ok then bad_option(name, expected, v, depth or 0) end
  elseif t ~= check then
    bad_option(name, "a " .. check, v, depth or 0)
  end
end

local function check_url(url)
  if type(url) ~= "string" then
    error(format("fetch: url must be a string (got %s)", type(url)), 5)
  end
  local scheme = url:match("^(%a[%w+.-]*)://")
  scheme = scheme and lower(scheme)
  if scheme ~= "http" and scheme ~= "https" then
    error(format("fetch: url must be http:// or https:// (got %s)",
      scheme and (scheme .. "://...") or "a string without a scheme"), 5)
  end
  if url:find("[%c ]") then
    error("fetch: url contains a space or a control character (CR, LF, NUL or another)", 5)
  end
end

-- What fetch derives from a URL (checked, printable form, credentials),
-- kept for the last URL seen: programs call one endpoint many times.
local last_url, last_shown, last_secrets, last_origin

-- The origins of the URLs seen, by their scheme://host[:port] as written:
-- a program calls many URLs (a path or a query apiece) on a few origins,
-- and a URL on one of them is checked and printed with a few plain finds,
-- not a dozen patterns. Emptied when it grows past ORIGINS_KEPT. last_head:
-- the origin of the URL before, found without a pattern at all (a Lua
-- pattern's character class costs tens of instructions a byte).
local origin_of, origins_kept = {}, 0
local ORIGINS_KEPT = 256
local last_head, last_head_origin = false, false

-- What is printed of each URL seen (with no credentials in it), and its
-- origin, by URL: a program's tasks call a few URLs each, interleaved, so
-- the URL of the call before is seldom the same, and a lookup costs less
-- than the finds of shown_on (a client calling a path per task spent a
-- tenth of its instructions there). Emptied when it grows past URLS_KEPT;
-- a URL longer than URL_KEPT_MAX (a query carrying a payload) is not kept.
local shown_of, origin_of_url, urls_kept = {}, {}, 0
local URLS_KEPT, URL_KEPT_MAX = 256, 512
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
-- printed, its credentials and origin, into last_shown, last_secrets and
-- last_origin; the URL kept by URL when it carries no credentials.
local function learn_url(url)
  local shown = last_head and type(url) == "string" and find(url, last_head, 1, true) == 1
    and shown_on(url, #last_head)
  if shown then
    last_shown, last_secrets, last_origin = shown, false, last_head_origin
  else
    local head = type(url) == "string" and match(url, "^%a[%w+.-]*://[^/?#@]*")
    local origin = head and origin_of[head]
    shown = origin and shown_on(url, #head)
    if shown then
      last_shown, last_secrets, last_origin = shown, false, origin
      last_head, last_head_origin = head, origin
    else
      check_url(url)
      last_shown = headers.redact_url(url)
      last_secrets = url:find("@", 1, true) and headers.url_secrets(url, {}) or false
      last_origin = headers.origin(url)
      if head and not find(url, "@", 1, true) then -- head is then the whole authority
        if origins_kept >= ORIGINS_KEPT then origin_of, origins_kept = {}, 0 end
        origin_of[head], origins_kept = last_origin, origins_kept + 1
        last_head, last_head_origin = head, last_origin
      end
    end
  end
  if not last_secrets and #url <= URL_KEPT_MAX then
    if urls_kept >= URLS_KEPT then shown_of, origin_of_url, urls_kept = {}, {}, 0 end
    shown_of[url], origin_of_url[url], urls_kept = last_shown, last_origin, urls_kept + 1
  end
end

local function url_facts(url)
  if url ~= last_url then
    local shown = shown_of[url]
    if shown then
      last_shown, last_secrets, last_origin = shown, false, origin_of_url[url]
    else
      learn_url(url)
    end
    last_url = url
  end
  return last_shown, last_secrets, last_origin
end

local no_names = headers.no_names
local user_agent_line = "User-Agent: ratewise/" .. core.version
-- The header lines of a call that gives no headers of its own: shared,
-- since the engine only reads them.
local default_lines = { user_agent_line }

-- What a call with a JSON body and no headers of its own sends: shared
-- as default_lines is (made_lines' shape).
local json_default_made = { lines = { "Content-Type: application/json", "Accept: application/json",
  user_agent_line }, given = no_names }

-- The options of a call that gives none: one table for all of them (fetch
-- only reads its options, and hands the table to no one).
local NO_OPTIONS = {}

-- The lines made from a caller's header table, kept while the table holds
-- the same names and values: most programs pass one table (an
-- Authorization line) on every call, and checking each name and value
-- again cost more than the rest of the call (46,000 instructions a request
-- for two headers under Lua 5.4). A table whose contents changed since is
-- checked and turned into lines anew. A table is kept from its second call
-- on (one made for each call costs a mark, not a copy), and no longer once
-- it has changed more often than it was found the same (one changed for
-- each call: an X-Request-Id put into it), nor when a value is a number (1
-- and 1.0 are equal, and are sent as "1" and "1.0"). Weak keys: a table
-- dropped takes its lines with it.
-- lines_made_json: the same for calls with a JSON body (the lines carry
-- Content-Type and Accept, unless the table names them).
local lines_made = setmetatable({}, { __mode = "k" })
local lines_made_json = setmetatable({}, { __mode = "k" })
local SEEN_ONCE, NEVER = {}, {}

-- Whether header table t has exactly the names and values of `made`, in
-- the order pairs gives them (the same for a table left as it was).
local function same_headers(t, made)
  local names, values, i = made.names, made.values, 0
  if made.n == 1 and getmetatable(t) == nil then
    -- The commonest table, one header (a credential), without a loop: a
    -- loop of one turn here kept LuaJIT from compiling the calls around it
    -- ("inner loop in root trace"), and a client's calls ran interpreted.
    local name, value = next(t)
    return name == names[1] and value == values[1] and next(t, name) == nil
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

---------------------------------------------------------------------------
-- Logging

local function default_on_retry(info)
  local why
  if info.status then
    why = tostring(info.status)
  else
    why = "network error: " .. (info.error or "unknown")
  end
  log.write(format("retrying %s %s in %.2f s (%s, attempt %d/%d, %s)",
    info.method, info.url, info.delay, why, info.attempt, info.max_retries, info.source), "info")
end

function call_hook(name, fn, ...)
  local ok, a, b = compat.pcall(fn, ...)
  if not ok then
    error(format("fetch: the '%s' callback raised an error: %s", name, tostring(a)), 0)
  end
  return a, b
end

-- The objects fetch drives (a limiter, a circuit, a budget, a sleep) are the
-- caller's code too: an error they raise is reported naming the option. A
-- cancellation passes through untouched: it is how a waiting task ends.
local function guarded(option, method, fn, ...)
  local ok, a, b = compat.pcall(fn, ...)
  if not ok then
    if a == CANCELLED then error(a, 0) end
    error(format("fetch: option '%s' raised an error in %s: %s", option, method, tostring(a)), 0)
  end
  return a, b
end

-- The objects' yes-or-no answers are booleans: "no" or 0 would read as yes.
local function not_boolean(option, method, answer)
  error(format("fetch: option '%s': %s must answer true or false (got %s %s)", option, method, type(answer),
    type(answer) == "string" and format("%q", answer) or tostring(answer)), 0)
end

---------------------------------------------------------------------------
-- The retry loop

-- The wait the server asked for before trying again (read by the policy,
-- or from the response's own headers), and where it came from; nil when it
-- named none. Whatever a policy reads (a quota's reset, say), the
-- response's own Retry-After is the least wait: every draft of the
-- RateLimit fields gives Retry-After precedence.
local function server_hint(policy, res, attempt)
  local hint, source
  local policy_delay = policy and policy.delay
  if policy_delay then
    hint = call_hook("delay", policy_delay, res, attempt)
    if hint ~= nil and (type(hint) ~= "number" or hint ~= hint or hint < 0) then
      error(format("fetch: the policy's delay must return a non-negative number or nil (got %s)",
        tostring(hint)), 0)
    end
    source = "policy"
  end
  if hint == nil then return retry.hint(res.headers) end
  local asked = retry.retry_after(res.headers)
  if asked and asked > hint then return asked, "retry-after" end
  return hint, source
end

-- The wait before the next attempt, and where it came from. The server's
-- hint is a floor: a delay hook may lengthen it or replace the backoff, but
-- never make it shorter.
local function next_delay(opts, state, res, attempt, hint, source)
  if opts.delay then
    local v = call_hook("delay", opts.delay, res, attempt, state.last_transport)
    if v ~= nil then
      if type(v) ~= "number" or v ~= v or v < 0 then
        error(format("fetch: the 'delay' callback must return a non-negative number or nil (got %s)",
          tostring(v)), 0)
      end
      if not hint or v >= hint then return v, "delay" end
      return hint, source
    end
  end
  if hint then return hint, source end
  local delay = retry.backoff(attempt, {
    base = opts.base, max_delay = opts.max_delay, jitter = opts.jitter,
    previous = state.previous_backoff,
  })
  state.previous_backoff = delay
  return delay, "backoff"
end

-- A hinted wait, spread so that the callers who got the same hint do not
-- all come back at the same instant: within [hint, hint * (1 + spread)],
-- never shorter than asked, and short of the `left` seconds of the budget
-- when the hint itself fits. With a cap (retry_after = "clamp"), never
-- over it: a wait clamped to the cap is spread below it.
local function spread_hint(delay, spread, left, cap)
  if spread <= 0 then
    if cap and delay > cap then return cap end
    return delay
  end
  local u = retry.random()
  if cap and delay >= cap then return cap * (1 - spread * u / (1 + spread)) end
  local wait = delay * (1 + spread * u)
  if cap and wait > cap then wait = cap end
  if wait >= left and delay < left then wait = delay + (left - delay) * u end
  return wait
end

-- The last options table check_options found good, its names and values
-- then (three at most), and what it answered; kept from a table's second
-- call in a row on (seen_before: the table of the call before), so that a
-- table made for each call costs a comparison, not a copy. A table whose
-- options hold objects checked for their contents (contents_checked: an
-- array of names, a limiter's methods) is checked again at each call.
local last_checked, last_k1, last_v1, last_k2, last_v2, last_k3, last_v3, last_transport, last_common
local seen_before
local contents_checked = { secret_headers = true, limiter = true, circuit = true, budget = true, policy = true }

-- Checks the options a call gives, its table's own and those it inherits
-- through __index tables (a per-call table over a base), and returns
-- whether any is a transport option, whether they could all be listed (an
-- __index that is a function cannot be, and the options behind it go
-- unchecked), and whether all are common ones (is_common_option: true),
-- or common ones and a method, body or json ("body"), or not (false).
-- `depth` is check_option's.
local function check_options(opts, depth)
  if getmetatable(opts) == nil then
    -- A table of one to three options (most calls' own) is checked without
    -- a loop: a loop of one turn keeps LuaJIT from compiling the calls
    -- around it ("inner loop in root trace"), and fetch ran interpreted.
    local k1, v1 = next(opts)
    if k1 == nil then return false, true, true end
    local k2, v2 = next(opts, k1)
    local k3, v3
    if k2 ~= nil then k3, v3 = next(opts, k2) end
    if k3 == nil or next(opts, k3) == nil then
      -- The table of the call before, with the same names and values (one
      -- options table made once and passed to every call): what its check
      -- found then.
      if opts == last_checked and k1 == last_k1 and v1 == last_v1 and k2 == last_k2 and v2 == last_v2
        and k3 == last_k3 and v3 == last_v3 then
        return last_transport, true, last_common
      end
      check_option(k1, v1, depth)
      local common1 = is_common_option[k1]
      common1 = common1 == true or common1 == v1 or is_body_option[k1] and "body"
      if k2 == nil then
        local transport = is_transport_option[k1] == true
        common1 = common1 or false
        if opts ~= seen_before then
          seen_before = opts
        elseif not contents_checked[k1] then
          last_checked, last_k1, last_v1, last_k2, last_v2, last_k3, last_v3 = opts, k1, v1, nil, nil, nil, nil
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
      if opts ~= seen_before then
        seen_before = opts
      elseif not (contents_checked[k1] or contents_checked[k2] or contents_checked[k3]) then
        last_checked, last_k1, last_v1, last_k2, last_v2, last_k3, last_v3 = opts, k1, v1, k2, v2, k3, v3
        last_transport, last_common = transport, common
      end
      return transport, true, common
    end
  end
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

-- The policy's verdict on a response, checked, or the built-in one. A 413
-- that says when to come back (RFC 9110 15.5.14: the condition is
-- temporary) is retryable, as in urllib3 and got.
local function verdict(policy, res)
  local hook = policy and policy.classify
  if hook then
    local class = call_hook("classify", hook, res)
    if class ~= nil then
      if class ~= "success" and class ~= "retryable" and class ~= "terminal" then
        error(format("fetch: the policy's classify must answer success, retryable, terminal or nil (got %s)",
          tostring(class)), 0)
      end
      return class
    end
  end
  local status = res.status
  if status == 413 and retry.retry_after(res.headers) then return "retryable" end
  return classify(status)
end

-- The policy's word that a refused attempt was not acted on. Hooks answer
-- booleans: "no" or 0 would read as yes, so anything else is misuse.
local function replay_allowed(policy, res, method)
  local hook = policy and policy.replayable
  if not hook then return false end
  local answer = call_hook("replayable", hook, res, method)
  if answer ~= nil and answer ~= true and answer ~= false then
    error(format("fetch: the policy's replayable must answer true, false or nil (got %s %s)", type(answer),
      type(answer) == "string" and format("%q", answer) or tostring(answer)), 0)
  end
  return answer == true
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

-- The limiter could not answer (a shared bucket whose Redis is down, with
-- on_error = "closed"): the call ends with its error, of its kind.
local function limiter_failed(state, what, why)
  local kind = type(why) == "table" and type(why.kind) == "string" and why.kind or "limiter_unavailable"
  local message = type(why) == "table" and why.message or why
  return nil, fetch_error(kind, format("%s: %s; nothing was sent", what, tostring(message)), state,
    state.last_response, state.last_transport)
end

-- limiter -> { wait_time = method or false, observe = method or false }.
-- A limiter may be any object with acquire (an __index that raises means
-- "no such method"), so the lookups are guarded, and made once per limiter.
local limiter_methods_of = setmetatable({}, { __mode = "k" })
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

local function new_state(started, method, shown_url, max_elapsed, on_event)
  return { attempts = 0, started = started, method = method, shown_url = shown_url,
    max_elapsed = max_elapsed, on_event = on_event }
end

-- The fields the engine reads of every request, so that assigning one
-- never grows the table; the rarer ones are there only while a call lists
-- them (set_transport, put_transport).
local scratch_request = { url = false, method = false, headers = false, timeout = false, body = false,
  transport = false }

-- The names of the transport options scratch_request holds: the engine
-- looks for those only (src/request.c), and the next call takes them away.
local scratch_transport_names, scratch_transport_n = {}, 0

-- Puts into the request the transport options a call names (transport:
-- whether it names any), in place of those of the call before. The engine
-- looks for the names listed (request.transport), or for none (false).
local function set_transport(request, opts, transport)
  local names, n = scratch_transport_names, scratch_transport_n
  for i = 1, n do
    request[names[i]] = nil
    names[i] = nil
  end
  n = 0
  if transport then
    if getmetatable(opts) == nil then -- its own keys are all it has
      for k, v in pairs(opts) do
        if is_transport_option[k] then
          request[k] = v
          n = n + 1
          names[n] = k
        end
      end
    else
      for i = 1, #transport_options do
        local name = transport_options[i]
        local v = opts[name]
        if v ~= nil then
          request[name] = v
          n = n + 1
          names[n] = name
        end
      end
    end
  end
  scratch_transport_n = n
  request.transport = transport and names -- false: the engine need not look for any
end

-- A rare request field that fetch works out itself (the stream's
-- timeouts, an empty body, a body limit...): listed for the engine to read.
local function put_transport(request, name, v)
  if request[name] == nil then
    scratch_transport_n = scratch_transport_n + 1
    scratch_transport_names[scratch_transport_n] = name
  end
  request[name] = v
  request.transport = scratch_transport_names
end

-- Options tables fetch.check has passed, with what check_options found
-- (OPTIONS_*), for the fetch that follows to take instead of checking them
-- again: a client checks each call's table where it is made, then fetches
-- with it (a third of a client call's Lua work was checking twice). Taken
-- once; weak keys.
-- A mark below zero is kept for every fetch with the table: a client's
-- own table for calls that add no options, which nobody else holds and the
-- client never changes.
local checked = setmetatable({}, { __mode = "k" })
-- no transport option; one at least; options behind an __index function;
-- common options only (is_common_option), without or with transport ones
local OPTIONS_PLAIN, OPTIONS_TRANSPORT, OPTIONS_UNLISTED, OPTIONS_COMMON, OPTIONS_COMMON_TRANSPORT = 1, 2, 3, 4, 5
local OPTIONS_BODY, OPTIONS_BODY_TRANSPORT = 6, 7

-- A mark's word on the table, as check_options says it: (transport,
-- listed, common). Apart from fetch.fetch, which has all the upvalues
-- Lua 5.1 allows a function but two.
local function marked(mark)
  return mark == OPTIONS_TRANSPORT or mark == OPTIONS_COMMON_TRANSPORT or mark == OPTIONS_BODY_TRANSPORT,
    mark ~= OPTIONS_UNLISTED, mark >= OPTIONS_BODY and "body" or mark >= OPTIONS_COMMON
end

--- fetch.check(url, opts [, depth [, kept]]): raises, as fetch would, for a
-- bad URL or option. For callers that run the fetch elsewhere (a shared
-- task) and want misuse reported at the call. The next fetch.fetch with
-- opts (a table its caller leaves as it was) does not check them again;
-- with kept, no fetch with it does (for a table its owner never changes).
function fetch.check(url, opts, depth, kept)
  depth = depth or 0
  url_facts(url)
  if type(opts) ~= "table" then
    error(format("fetch: options must be a table (got %s)", type(opts)), 3 + depth)
  end
  local transport, listed, common = check_options(opts, depth + 2)
  request_method(opts, 4 + depth)
  if opts.query ~= nil then headers.with_query(url, opts.query, "fetch", 3 + depth) end
  local mark = common == true and (transport and OPTIONS_COMMON_TRANSPORT or OPTIONS_COMMON)
    or common == "body" and (transport and OPTIONS_BODY_TRANSPORT or OPTIONS_BODY)
    or not listed and OPTIONS_UNLISTED or transport and OPTIONS_TRANSPORT or OPTIONS_PLAIN
  checked[opts] = kept and -mark or mark
end

-- The counters of an rw.client (client:stats()), which fetch keeps as the
-- call goes: an event table and a protected call for each attempt cost a
-- client that nobody listens to a tenth of its time. One table of
-- functions, for fetch.fetch (Lua 5.1 allows a function 60 upvalues).
local counters_mt = { __name = "ratewise.counters" }
local counting = {}

--- counters = fetch.counters(t): t (an rw.client's counters: attempts,
-- statuses, retries, ...), marked as counters fetch.fetch may keep.
function fetch.counters(t)
  return setmetatable(t, counters_mt)
end

local function bump(t, k, by)
  t[k] = (t[k] or 0) + (by or 1)
end

-- Raises unless counters are fetch.counters' (a third argument given to
-- rw.fetch by mistake is not taken for them).
function counting.check(counters)
  if getmetatable(counters) ~= counters_mt then
    error(format("fetch: expected (url [, opts]), got a third argument (%s)", type(counters)), 3)
  end
end

-- status: a number, or "network" for an attempt that got no response
-- (client:stats() turns the numbers into strings).
function counting.attempt(counters, status)
  counters.attempts = counters.attempts + 1
  bump(counters.statuses, status)
end

function counting.retry(counters, status, source, delay)
  counters.retries = counters.retries + 1
  bump(counters.retries_by_status, status)
  bump(counters.retries_by_source, source)
  counters.waits, counters.waited = counters.waits + 1, counters.waited + delay
  bump(counters.waits_by_source, source, delay)
end

--- res | nil, err = fetch.fetch(url [, opts [, counters]])
-- counters: fetch.counters' (rw.client's), or nil.
function fetch.fetch(url, opts, counters)
  if opts == nil then
    opts = NO_OPTIONS
  elseif type(opts) ~= "table" then
    url_facts(url)
    error(format("fetch: options must be a table (got %s)", type(opts)), 2)
  end
  if counters ~= nil then counting.check(counters) end
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
    transport, listed, common = check_options(opts, 1)
  end
  local query, json_value
  if common == "body" then
    json_value = opts.json
  elseif not common then
    query, json_value = opts.query, opts.json
    if query ~= nil then
      url_facts(url)
      url = headers.with_query(url, query, "fetch", 2)
    end
  end
  local shown_url, url_secrets, origin
  if url == last_url then -- most calls: the URL of the call before
    shown_url, url_secrets, origin = last_shown, last_secrets, last_origin
  else
    shown_url, url_secrets, origin = url_facts(url)
  end

  local method, body, policy, header_table, key, extra_secrets
  if common == true then
    method, header_table = "GET", opts.headers
  elseif common == "body" then
    method, body, header_table = request_method(opts, 3), opts.body, opts.headers
    if json_value ~= nil then body = json.encode(json_value, "fetch: option 'json'", 2) end
  else
    method, body = opts.method, opts.body
    if method == nil and body == nil and json_value == nil then
      method = "GET"
    else
      method = request_method(opts, 3)
    end
    if json_value ~= nil then
      body = json.encode(json_value, "fetch: option 'json'", 2)
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
    local keep = key == nil and extra_secrets == nil and type(header_table) == "table"
      and header_table == opts.headers -- the caller's own, not a policy's for this call
    local made_from = json_value ~= nil and lines_made_json or lines_made
    local made = keep and made_lines(made_from, header_table)
      or header_table == nil and key == nil and extra_secrets == nil and json_value ~= nil and json_default_made
    if made then
      lines, given, header_secrets = made.lines, made.given, made.secrets
    else
      lines, given, header_secrets = headers.request_lines(header_table, extra_secrets)
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
        error("fetch: the idempotency key is given both as an option and as a header", 2)
      end
      if not clean_key(header_key) then
        error("fetch: header 'Idempotency-Key' is blank: a blank key cannot make a request replay-safe", 2)
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
      if keep then keep_lines(made_from, header_table, lines, given, header_secrets) end
    end
  end

  local max_elapsed = opts.max_elapsed or DEFAULT_MAX_ELAPSED
  local timeout = opts.timeout or 30
  -- What only a retry needs, read at the first one (most calls have none).
  local max_retries, on_retry, retry_after_cap, hint_jitter
  -- What a common call has none of: it is a replay-safe GET that follows
  -- redirects, with no hooks, limiter or stream, and no field the engine
  -- reads only when listed (rare) but its transport options.
  local safe, follow, stream, rare = true, true, false, transport
  -- Whether the call has anything to tell of an attempt or to ask before
  -- one (a policy, limiter, circuit, budget, hook or stream): without, a
  -- 2xx is returned as soon as it is made a response.
  local hooked = false
  local limiter, circuit, budget, on_event, cost, retry_after, retry_after_max, max_body, verify_tls
  local first_byte, idle, no_replay, empty_body, secret_headers, sleep
  if common == "body" then
    -- a request with a body, and no key, hook, limiter or stream: its
    -- method or an Idempotency-Key header says whether it is replay-safe
    safe = replay_safe[method] or given["idempotency-key"] ~= nil
    no_replay = not safe or nil
    empty_body = body == nil and has_body[method] or nil
    rare = transport or empty_body or no_replay and "no_replay"
  elseif not common then
    safe = replay_safe[method] or opts.retry_non_idempotent or key ~= nil or given["idempotency-key"] ~= nil
    limiter, circuit, budget, on_event = opts.limiter, opts.circuit, opts.budget, opts.on_event
    cost = limiter and (opts.cost or 1)
    retry_after = opts.retry_after -- nil: honor
    if retry_after == "clamp" or retry_after == "fail_fast" then
      retry_after_max = opts.retry_after_max
      if not retry_after_max then
        error(format("fetch: option 'retry_after' = %q needs retry_after_max, the longest wait to accept",
          retry_after), 2)
      end
    end
    follow, max_body, verify_tls = opts.follow_redirects ~= false, opts.max_body, opts.verify_tls
    if verify_tls == false then warn_insecure() end
    stream = opts.stream == true
    if not listed then -- options behind an __index function: looked for one by one
      for i = 1, #transport_options do
        if opts[transport_options[i]] ~= nil then transport = true end
      end
    end
    -- a stream: the bound on the time to its headers, and on a silence in its body
    first_byte = stream and (opts.first_byte_timeout or timeout)
    idle = stream and (opts.idle_timeout or STREAM_IDLE_TIMEOUT)
    no_replay = not safe or nil
    if opts.cost and limiter then
      -- A cost no limiter could ever serve would wait forever (or fail deep inside).
      local ok, capacity = pcall(limiter_capacity, limiter)
      if ok and type(capacity) == "number" and cost > capacity then
        error(format("fetch: option 'cost' (%s) is more than the limiter's capacity (%s): it could never be "
          .. "served", tostring(cost), tostring(capacity)), 2)
      end
    end
    empty_body = body == nil and has_body[method] or nil
    secret_headers = opts.secret_headers
    sleep = opts.sleep
    -- whether the request has fields the engine reads only when listed (a
    -- plain GET has none: the engine looks up six fields, not twelve)
    rare = transport or empty_body or not follow or max_body ~= nil or verify_tls ~= nil or no_replay
      or secret_headers ~= nil
    hooked = policy or limiter or circuit or budget or on_event or stream
  end
  local started = now()
  local deadline = started + max_elapsed
  -- What the error messages and the backoff need, made at the first attempt
  -- that does not succeed: a call that succeeds at once builds no state.
  local state
  local attempts, retries = 0, 0
  if budget then guarded("budget", "request", budget.request, budget) end
  if on_event then call_hook("on_event", on_event, { type = "request", method = method, url = shown_url }) end

  while true do
    if circuit then
      local allowed, retry_in = guarded("circuit", "allow", circuit.allow, circuit, origin)
      if allowed ~= true and allowed ~= false then not_boolean("circuit", "allow", allowed) end
      if not allowed then
        state = state or new_state(started, method, shown_url, max_elapsed, on_event)
        if counters then counters.circuit_refusals = counters.circuit_refusals + 1 end
        if on_event then
          call_hook("on_event", on_event, { type = "circuit_open", url = shown_url, retry_in = retry_in })
        end
        return nil, fetch_error("circuit_open", format("%s: the circuit for %s is open after repeated "
          .. "failures; nothing was sent (a trial request goes through in %.2f s)",
          method .. " " .. shown_url, origin, retry_in or 0),
          state, state.last_response, state.last_transport)
      end
    end
    if limiter then
      -- A wait for the limiter counts against max_elapsed like any other:
      -- asked first, so that a wait that cannot fit ends the call at once
      -- with nothing taken (the token stays for a call that can use it).
      local left = deadline - now()
      local wait_time = limiter_methods(limiter).wait_time
      -- A limiter whose acquire says itself when it cannot serve within
      -- max_wait (a shared bucket, for which each question is a round trip
      -- to Redis) is not asked first.
      if wait_time and not limiter_methods(limiter).honors_max_wait then
        local wait, why = guarded("limiter", "wait_time", wait_time, limiter, cost)
        if wait == nil and type(why) == "table" then
          state = state or new_state(started, method, shown_url, max_elapsed, on_event)
          return limiter_failed(state, method .. " " .. shown_url, why)
        end
        if type(wait) ~= "number" or wait ~= wait then
          error(format("fetch: option 'limiter': wait_time must return a number of seconds (got %s)",
            tostring(wait)), 0)
        end
        if wait >= left then
          state = state or new_state(started, method, shown_url, max_elapsed, on_event)
          return budget_error(state, format("the limiter would wait %.2f s for %s token%s, more than the "
            .. "%.2f s left; nothing was taken", wait, tostring(cost), cost == 1 and "" or "s",
            left > 0 and left or 0), state.last_response, state.last_transport)
        end
      end
      -- The time left goes along: a limiter that knows it cannot serve in
      -- time answers false and takes nothing.
      local acquired, why = guarded("limiter", "acquire", limiter.acquire, limiter, cost, sleep, left)
      if acquired == false then
        state = state or new_state(started, method, shown_url, max_elapsed, on_event)
        return budget_error(state, format("the limiter could not serve %s token%s within the %.2f s left",
          tostring(cost), cost == 1 and "" or "s", left > 0 and left or 0), state.last_response,
          state.last_transport)
      elseif acquired == nil and why ~= nil then
        state = state or new_state(started, method, shown_url, max_elapsed, on_event)
        return limiter_failed(state, method .. " " .. shown_url, why)
      end
    end
    -- (the first attempt of a call with nothing to wait for goes out as it starts)
    local sent_at = attempts == 0 and not hooked and started or now()
    local left = deadline - sent_at
    if left <= 0 then
      state = state or new_state(started, method, shown_url, max_elapsed, on_event)
      return budget_error(state, "no time left for another attempt", state.last_response)
    end
    local attempt_timeout = timeout
    if left < timeout then attempt_timeout = left end -- min(), without a call
    -- what a time budget too short for the call's own timeouts cut
    local budget_cut = attempt_timeout < timeout
    -- The engine copies what it needs from the request as it starts the
    -- transfer, so one table serves every attempt of every call. Every
    -- field is assigned; those the call does not use are nil, and the
    -- engine leaves libcurl's defaults for them.
    local request = scratch_request
    request.url, request.method, request.headers = url, method, lines
    request.timeout, request.body = attempt_timeout, body
    -- The rare fields are copied (or cleared after a call that had them)
    -- only when there is something to copy or clear.
    if rare == "no_replay" and scratch_transport_n == 1 and request.no_replay then -- luacheck: ignore 542
      -- The call before listed no_replay alone (a POST without a key, as
      -- most are), and the request holds it still.
    elseif rare or scratch_transport_n > 0 then
      set_transport(request, opts, transport)
      if empty_body then put_transport(request, "empty_body", true) end
      if not follow then put_transport(request, "follow_redirects", false) end
      if max_body ~= nil then put_transport(request, "max_body", max_body) end
      if verify_tls ~= nil then put_transport(request, "verify_tls", verify_tls) end
      -- libcurl re-sends a request on its own when a reused connection
      -- turns out to be dead; only a replay-safe request may take that chance
      -- (the engine keeps any other from it: src/request.c, no_replay).
      if no_replay then put_transport(request, "no_replay", true) end
      -- More names whose lines the engine keeps from another origin.
      if secret_headers ~= nil then put_transport(request, "secret_headers", secret_headers) end
    else
      request.transport = false
    end
    local res, terr, streaming
    if stream then
      -- No total timeout for a 2xx: `timeout` bounds the time to the
      -- headers (unless first_byte_timeout does), which fits what is left
      -- of max_elapsed. An answer read whole (not a 2xx) is bounded as a
      -- call without stream is, given at least the time to its headers.
      local whole = first_byte > timeout and first_byte or timeout
      request.timeout = min(whole, left)
      put_transport(request, "first_byte_timeout", min(first_byte, left))
      put_transport(request, "idle_timeout", idle)
      budget_cut = left < first_byte or left < whole and "after_headers"
      if sleep then
        res, terr, streaming = guarded("sleep", "a wait for the transfer", runtime.open_stream, request, sleep)
      else
        res, terr, streaming = runtime.open_stream(request)
      end
      -- The response reads its body from here on (and a hook that raises
      -- below drops both, the transfer closing as it is collected).
      if res then response.new(res) end
      if streaming then response.stream(res, streaming, sleep, method .. " " .. shown_url, max_body) end
    elseif sleep then
      res, terr = guarded("sleep", "a wait for the transfer", runtime.transfer, request, sleep, response_mt)
    else
      res, terr = runtime.transfer(request, nil, response_mt)
    end
    attempts = attempts + 1
    if body ~= nil then request.body = nil end -- not kept alive by the next call's table

    local why, class, hint, hint_source
    if res then
      -- set when a redirect was followed (raw: the response's __index answers nil for it, at the cost of a call)
      local final_url = rawget(res, "url")
      if final_url == nil or final_url == url then res.url = shown_url else res.url = headers.redact_url(final_url) end
      res.attempts = attempts
      res.elapsed = now() - started
      local status = res.status
      if not hooked and status >= 200 and status < 300 then
        -- what the rest would conclude, with nothing to tell
        res.throttled = false
        if counters then counting.attempt(counters, status) end
        return res
      end
      if policy and policy.observe then
        call_hook("observe", policy.observe, res, limiter)
        status = res.status
      end
      if status >= 200 and status < 300 and not (policy and policy.classify) then
        class = "success"
      else
        class = verdict(policy, res)
      end
      -- A throttle: the server refused for rate (a 429), or refused for now
      -- and said when to come back (a 503 with Retry-After, a quota's reset
      -- read by a provider's policy).
      if class == "retryable" then hint, hint_source = server_hint(policy, res, retries) end
      res.throttled = status == 429 or hint ~= nil
      -- A zero hint (a reset already past, "Retry-After: 0") would send
      -- the retry at once, and the one after it: backoff instead.
      if hint == 0 then hint, hint_source = nil, nil end
      if limiter then
        local observe = limiter_methods(limiter).observe
        if observe then guarded("limiter", "observe", observe, limiter, res, sent_at) end
      end
      if counters then counting.attempt(counters, status) end
      if on_event then
        call_hook("on_event", on_event, { type = "response", status = res.status, class = class, attempt = attempts,
          throttled = res.throttled })
      end
      -- A redirect that was not followed, or a 304, is an answer, not a failure.
      if class ~= "retryable" and res.status >= 300 and res.status < 400 then class = "success" end
      if circuit then
        -- A terminal 4xx says nothing about the server's health.
        guarded("circuit", "record", circuit.record, circuit, origin, class == "success" and "success"
          or (class == "retryable" or res.status >= 500) and "failure" or "neutral")
      end
      if streaming and class ~= "success" then
        -- A policy that does not take this 2xx for an answer sees it whole.
        local _, derr = response.drain(res, true)
        if derr then res.body = "" end
      end
      if class == "success" then return res end
      state = state or new_state(started, method, shown_url, max_elapsed, on_event)
      state.attempts, state.last_response, state.last_transport, state.hint = attempts, res, nil, hint
      if class == "terminal" then
        return nil, fetch_error("terminal", format("%s: %d is a terminal status, not retried",
          method .. " " .. shown_url, res.status), state, res)
      end
      why = tostring(res.status)
    else
      state = state or new_state(started, method, shown_url, max_elapsed, on_event)
      state.attempts, state.last_transport, state.hint = attempts, terr, nil
      local message = terr.tls and response.tls_file_problem(opts, terr.code) or terr.message or "transport failure"
      if url_secrets then message = headers.scrub(message, url_secrets) end
      if header_secrets then message = headers.scrub(message, header_secrets) end
      message = headers.scrub_proxies(message, opts.proxy)
      terr.message = message
      if counters then counting.attempt(counters, "network") end
      if on_event then
        call_hook("on_event", on_event, { type = "response", error = message, class = "retryable", attempt = attempts })
      end
      if circuit and not terr.tls then guarded("circuit", "record", circuit.record, circuit, origin, "failure") end
      -- (a stream's own time to its headers was not cut when only its time read whole was)
      if terr.timeout and budget_cut and (budget_cut ~= "after_headers" or terr.status) then
        return budget_error(state, "the attempt was cut short by the time budget", nil, terr)
      end
      if not terr.retryable then
        return nil, fetch_error("network", format("%s: %s%s", method .. " " .. shown_url,
          terr.tls and "TLS verification failed: " or "", terr.message), state, nil, terr)
      end
      why = terr.message
    end

    -- A request that never reached the server is not a replay; nor is one
    -- the policy knows the server refused without acting on it.
    if not safe and (res or terr.sent) and not replay_allowed(policy, res, method) then
      return nil, fetch_error("unsafe", format(
        "%s was not retried after %s: %s is not replay-safe (give an idempotency_key, or set retry_non_idempotent)",
        method .. " " .. shown_url, why, method), state, res, terr)
    end
    if not max_retries then
      max_retries = opts.max_retries or 3
      on_retry = opts.on_retry
      if on_retry == nil then on_retry = default_on_retry end
      -- clamp: no hinted wait is longer than this
      retry_after_cap = retry_after == "clamp" and retry_after_max or nil
      hint_jitter = opts.hint_jitter or HINT_JITTER
    end
    if retries >= max_retries then
      return nil, fetch_error("exhausted", format("%s failed after %d attempt%s (max_retries %d), last: %s",
        method .. " " .. shown_url, state.attempts, state.attempts == 1 and "" or "s", max_retries, why),
        state, res, terr)
    end

    local delay, source = next_delay(opts, state, res, retries, hint, hint_source)
    local cap = hint and source ~= "delay" and retry_after_cap or nil
    if hint then
      if retry_after == "defer" then
        return nil, fetch_error("deferred", format("%s: the server asked to wait %.2f s (%s); deferred to "
          .. "the caller (retry_after = \"defer\")", method .. " " .. shown_url, hint, hint_source), state, res)
      elseif retry_after == "fail_fast" and hint > retry_after_max then
        return nil, fetch_error("throttled", format("%s: the server asked to wait %.2f s (%s), more than "
          .. "retry_after_max (%.2f s)", method .. " " .. shown_url, hint, hint_source, retry_after_max),
          state, res)
      end
      if cap and delay > cap then delay = cap end
    end
    left = deadline - now()
    if delay >= left then
      return budget_error(state, format("a retry in %.2f s (%s) would not fit the %.2f s left",
        delay, source, left > 0 and left or 0), res, terr)
    end
    -- Only the server's own wait is spread here: a backoff is jittered
    -- already, and a delay hook's answer is the caller's to make.
    if hint and source ~= "delay" then delay = spread_hint(delay, hint_jitter, left, cap) end
    local retry_allowed = budget and guarded("budget", "allow_retry", budget.allow_retry, budget)
    if budget and retry_allowed ~= true and retry_allowed ~= false then
      not_boolean("budget", "allow_retry", retry_allowed)
    end
    if budget and not retry_allowed then
      if counters then counters.budget_refusals = counters.budget_refusals + 1 end
      if on_event then
        call_hook("on_event", on_event, { type = "budget_refused", status = res and res.status or nil })
      end
      return budget_error(state, format(
        "the retry budget refused a retry after %s (retries are capped at a share of requests)", why), res, terr)
    end
    retries = retries + 1
    if counters then counting.retry(counters, res and res.status or "network", source, delay) end
    if on_event then
      call_hook("on_event", on_event, { type = "retry", status = res and res.status or nil, delay = delay,
        source = source, attempt = retries })
    end
    if on_retry then
      call_hook("on_retry", on_retry, {
        method = method, url = shown_url, status = res and res.status or nil,
        delay = delay, attempt = retries, max_retries = max_retries, source = source,
        error = terr and terr.message or nil,
      })
    end
    if sleep then
      guarded("sleep", "the wait before a retry", runtime.sleep, delay, sleep)
    else
      runtime.sleep(delay)
    end
    state.hint = nil -- waited out
  end
end

return fetch
