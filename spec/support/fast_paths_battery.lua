-- The calls spec/fast_paths_spec.lua makes twice, with the fast-path
-- caches on and off (RATEWISE_FAST_PATHS=off): fetch and rw.client calls
-- that reuse, change and vary what the caches are keyed by (options
-- tables, header tables, URLs, paths, limiters). Run as
--   lua spec/support/fast_paths_battery.lua BASE_URL OUT_FILE
-- against spec/support/server.lua's server, scripted by the spec (/retry,
-- /retry_post, /redirect). Writes one line per call to OUT_FILE: its name,
-- a tab, and what it returned or raised, serialized the same way on every
-- run; then "probe" lines saying what the caches held at the end (not
-- compared: the spec checks that the calls did fill them, and that with
-- the switch off they stayed empty).
local base, out_path = arg[1], arg[2]
assert(base and out_path, "usage: fast_paths_battery.lua BASE_URL OUT_FILE")

local rw = require "ratewise"
local fetch = require "ratewise.fetch"
local cache = require "ratewise.fetch.cache"

local lines = {}
-- Tables the caches are keyed by, held to the end so that the probe finds
-- their entries (the caches' keys are weak).
local anchors = {}

-- Generated idempotency keys (version 4 UUIDs) differ from run to run, and
-- so do the times an error message gives (seconds left, waited).
local UUID = "%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89ab]%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x"
local function normalized(s)
  return (s:gsub(UUID, "<uuid>"):gsub("%d+%.%d+ s", "<seconds> s"))
end

-- A value written the same way whatever order pairs gives its keys in.
local function serialize(v)
  local t = type(v)
  if t == "string" then return string.format("%q", normalized(v)) end
  if t == "number" then
    if v % 1 == 0 and v > -2 ^ 53 and v < 2 ^ 53 then return string.format("%d", v) end
    return string.format("%.17g", v)
  end
  if t ~= "table" then return tostring(v) end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = "[" .. serialize(k) .. "]=" .. serialize(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- A body that is JSON (an /echo answer: the request as the server saw it)
-- is compared decoded: the order of its header fields is the order of a
-- Lua table's pairs, which differs from process to process.
local cjson = require("cjson").new()
local function response_fields(res)
  local h = {}
  for k, v in pairs(res.headers) do h[k] = v end
  local body = res.body
  local decoded_ok, decoded = pcall(cjson.decode, body)
  if decoded_ok and type(decoded) == "table" then body = { json = decoded } end
  return { status = res.status, headers = h, body = body, url = res.url, attempts = res.attempts,
    redirects = res.redirects }
end

-- What a call ended with: its response, its error (kind, message, status,
-- attempts, the response it carries) or what it raised.
local function outcome(ok, res, err)
  if not ok then return { raised = tostring(res) } end
  if res then return response_fields(res) end
  return { kind = err.kind, message = err.message, status = err.status, attempts = err.attempts,
    response = err.response and response_fields(err.response) }
end

local function record(name, value)
  lines[#lines + 1] = name .. "\t" .. serialize(value)
end

local function call(name, f, ...)
  record(name, outcome(pcall(f, ...)))
end

local function get(name, path, opts)
  call(name, rw.fetch, base .. path, opts)
end

-- An options table and a header table, reused, then changed in place.
do
  local h = { Authorization = "Bearer one", ["X-Trace"] = "a" }
  anchors[#anchors + 1] = h
  local opts = { headers = h, timeout = 5 }
  for i = 1, 4 do get("reused " .. i, "/echo", opts) end
  h["X-Added"] = "1"
  get("header added", "/echo", opts)
  get("header added again", "/echo", opts)
  h["X-Added"] = nil
  get("header removed", "/echo", opts)
  h.Authorization = "Bearer two"
  get("credential changed", "/echo", opts)
  get("credential changed again", "/echo", opts)
  h["X-Count"] = 1
  get("number value", "/echo", opts)
  get("number value again", "/echo", opts)
  h["X-Count"] = 1.5
  get("number value changed", "/echo", opts)
  h["X-Count"] = nil
  opts.timeout = 7
  get("timeout changed", "/echo", opts)
  opts.follow_redirects = false
  get("transport option added", "/redirect", opts)
  opts.follow_redirects = nil
  get("transport option removed", "/redirect", opts)
  opts.max_body = 4
  get("max_body added", "/echo", opts)
  opts.max_body = nil
  opts.headers = { Accept = "text/plain" }
  get("header table replaced", "/echo", opts)
  opts.headers = nil
  get("header table dropped", "/echo", opts)
  opts.method, opts.body = "POST", "payload"
  get("method and body added", "/echo", opts)
  opts.body = nil
  get("body removed", "/echo", opts)
  opts.method = nil
  opts.bogus = true
  get("unknown option added", "/echo", opts)
  opts.bogus = nil
  get("unknown option removed", "/echo", opts)
  h["Bad Name"] = "x"
  opts.headers = h
  get("bad header name", "/echo", opts)
  get("bad header name again", "/echo", opts)
  h["Bad Name"] = nil
  h["X-Split"] = "a\r\nInjected: yes"
  get("bad header value", "/echo", opts)
  h["X-Split"] = nil
  get("header table fixed", "/echo", opts)
end

-- A header table changed before every call (a request id put into it).
do
  local h = { Authorization = "Bearer one" }
  for i = 1, 6 do
    h["X-Request-Id"] = "id-" .. i
    get("changed each call " .. i, "/echo", { headers = h })
  end
end

-- JSON bodies: without headers, with a reused header table, with one
-- naming the content type; then the table changed.
do
  for i = 1, 3 do get("json " .. i, "/echo", { json = { n = i } }) end
  local h = { Authorization = "Bearer j" }
  anchors[#anchors + 1] = h
  for i = 1, 3 do get("json reused headers " .. i, "/echo", { json = { n = i }, headers = h }) end
  h["Content-Type"] = "application/vnd.api+json"
  get("json content type added", "/echo", { json = { n = 1 }, headers = h })
  get("json content type added again", "/echo", { json = { n = 1 }, headers = h })
  get("json headers without json", "/echo", { headers = h })
  get("json and body", "/echo", { json = { n = 1 }, body = "x" })
end

-- URLs: the same one again, with a query table (reused, then changed),
-- with userinfo, one too long to keep, and more distinct ones than are
-- kept, so that the bounded table is emptied.
do
  for i = 1, 3 do get("same url " .. i, "/same") end
  local q = { a = 1, b = "x y" }
  local opts = { query = q }
  get("query", "/echo", opts)
  get("query again", "/echo", opts)
  q.c = "3"
  get("query changed", "/echo", opts)
  q.a = nil
  get("query key removed", "/echo", opts)
  q.bad = {}
  get("query bad value", "/echo", opts)
  q.bad = nil
  local userinfo = base:gsub("^http://", "http://user:secret@")
  for i = 1, 2 do call("userinfo " .. i, rw.fetch, userinfo .. "/echo") end
  local long = "/long?" .. string.rep("x", cache.URL_KEPT_MAX)
  for i = 1, 2 do get("long url " .. i, long) end
  -- more than are kept: the bounded table is emptied on the way
  local distinct = cache.URLS_KEPT + 44
  for i = 1, distinct do get("distinct " .. i, "/distinct/" .. i) end
  get("distinct 1 again", "/distinct/1")
  get("distinct last again", "/distinct/" .. distinct)
  for i = 1, 2 do call("not http " .. i, rw.fetch, "ftp://127.0.0.1/x") end
  for i = 1, 2 do call("space in url " .. i, rw.fetch, base .. "/a b") end
  call("options not a table", rw.fetch, base .. "/echo", "fast")
end

-- fetch.check, then fetch with the table changed in between.
do
  local function checked_then(name, opts, change)
    local ok, err = pcall(fetch.check, base .. "/echo", opts)
    record(name .. ": check", { ok = ok, err = err and tostring(err) })
    change(opts)
    call(name, fetch.fetch, base .. "/echo", opts)
  end
  checked_then("checked, unchanged", { timeout = 5 }, function() end)
  checked_then("checked, header table added", { timeout = 5 }, function(o) o.headers = { ["X-Late"] = "1" } end)
  checked_then("checked, timeout changed", { timeout = 5 }, function(o) o.timeout = 9 end)
  checked_then("checked, bad timeout", { timeout = 5 }, function(o) o.timeout = "soon" end)
  checked_then("checked, unknown option", {}, function(o) o.timout = 5 end)
  checked_then("checked, transport option", {}, function(o) o.decompress = false end)
  checked_then("checked, bad transport option", {}, function(o) o.verify_tls = "no" end)
  checked_then("checked, secret names changed", { secret_headers = { "X-Key" } },
    function(o) o.secret_headers[2] = "not a token" end)
  checked_then("checked, limiter lost acquire", { limiter = { acquire = function() return true end } },
    function(o) o.limiter.acquire = nil end)
  local opts = { headers = { ["X-A"] = "1" } }
  fetch.check(base .. "/echo", opts)
  call("checked, fetched twice 1", fetch.fetch, base .. "/echo", opts)
  opts.max_retries = "many"
  call("checked, fetched twice 2", fetch.fetch, base .. "/echo", opts)
end

-- Options inherited through __index tables, the base changed in place.
do
  local base_opts = { headers = { Authorization = "Bearer base" }, timeout = 5 }
  local per_call = setmetatable({}, { __index = base_opts })
  get("inherited 1", "/echo", per_call)
  get("inherited 2", "/echo", per_call)
  base_opts.headers.Authorization = "Bearer base two"
  get("inherited header changed", "/echo", per_call)
  base_opts.max_retries = 0
  get("inherited option added", "/retry", per_call)
  base_opts.max_retries = nil
  per_call.headers = { Accept = "text/plain" }
  get("own option hides inherited", "/echo", per_call)
  base_opts.bogus = 1
  get("inherited unknown option", "/echo", per_call)
  base_opts.bogus = nil
  local by_function = setmetatable({}, { __index = function(_, k) return base_opts[k] end })
  get("inherited through a function", "/echo", by_function)
  get("inherited through a function again", "/echo", by_function)
end

-- Retries: 429 with Retry-After: 0, then 200; a POST with a generated
-- idempotency key; a POST without one (not replayed).
do
  get("retry", "/retry", { on_retry = false })
  get("retry post with key", "/retry_post", { method = "POST", body = "b", idempotency_key = true, on_retry = false })
  get("post without key", "/retry_post", { method = "POST", body = "b", on_retry = false })
end

-- A limiter whose optional methods come and go between calls.
do
  local seen = {}
  local limiter = { name = "L" }
  anchors[#anchors + 1] = limiter
  function limiter.acquire(self, cost)
    seen[#seen + 1] = "acquire " .. self.name .. " " .. tostring(cost)
    return true
  end
  local opts = { limiter = limiter }
  get("limiter 1", "/echo", opts)
  get("limiter 2", "/echo", opts)
  function limiter.observe(_, res) seen[#seen + 1] = "observe " .. res.status end
  get("limiter observe added", "/echo", opts)
  function limiter.wait_time() seen[#seen + 1] = "wait_time" return 0 end
  get("limiter wait_time added", "/echo", opts)
  limiter.observe = nil
  get("limiter observe removed", "/echo", opts)
  limiter.wait_time = function() return 100 end
  get("limiter wait_time changed", "/echo", { limiter = limiter, max_elapsed = 5 })
  limiter.wait_time = nil
  limiter.honors_max_wait = true
  get("limiter honors max_wait", "/echo", opts)
  record("limiter calls", seen)
end

-- rw.client: more paths than it keeps, paths again, its header table
-- changed in place, routes with limiters, options, errors; a client with
-- a response cache.
do
  local taken = {}
  local route_limiter = { acquire = function(_, cost) taken[#taken + 1] = cost return true end }
  local h = { Authorization = "Bearer c" }
  local c = rw.client { base_url = base, headers = h, routes = { ["/routed/"] = route_limiter } }
  local paths = cache.PLAIN_PATHS_KEPT + 44
  for i = 1, paths do call("client path " .. i, c.get, c, "/p/" .. i) end
  for _, i in ipairs { 1, 2, paths - 1, paths } do call("client path again " .. i, c.get, c, "/p/" .. i) end
  for i = 1, 3 do call("client echo " .. i, c.get, c, "/echo") end
  h["X-Client"] = "added"
  call("client header added", c.get, c, "/echo")
  h.Authorization = "Bearer c2"
  call("client credential changed", c.get, c, "/echo")
  for i = 1, 2 do call("client routed " .. i, c.get, c, "/routed/" .. i) end
  for i = 1, 2 do call("client post " .. i, c.post, c, "/echo") end
  call("client head", c.head, c, "/echo")
  call("client options", c.get, c, "/echo", { headers = { ["X-Own"] = "1" }, query = { q = 1 } })
  local call_opts = { headers = { ["X-Own"] = "1" } }
  call("client options reused 1", c.get, c, "/echo", call_opts)
  call_opts.headers["X-Own"] = "2"
  call("client options reused 2", c.get, c, "/echo", call_opts)
  call_opts.timeout = 3
  call("client options reused 3", c.get, c, "/echo", call_opts)
  call("client json", c.post, c, "/echo", { json = { a = 1 } })
  call("client unknown option", c.get, c, "/echo", { bogus = 1 })
  call("client bad header", c.get, c, "/echo", { headers = { ["Bad Name"] = "x" } })
  h["Bad Name"] = "x"
  call("client own bad header", c.get, c, "/echo")
  h["Bad Name"] = nil
  call("client own header fixed", c.get, c, "/echo")
  call("client retry", c.get, c, "/retry", { on_retry = false })
  call("client absolute url", c.get, c, base .. "/echo")
  call("client other origin", c.get, c, "http://127.0.0.2:1/x")
  record("client routed limiter", taken)

  local cached = rw.client { base_url = base, cache = { ttl = 60 }, headers = { Authorization = "Bearer k" } }
  for i = 1, 3 do call("cached client " .. i, cached.get, cached, "/echo") end
  for i = 1, 2 do call("cached client distinct " .. i, cached.get, cached, "/echo", { query = { i = i } }) end
  local stats = cached:stats()
  record("cached client stats", { requests = stats.requests, cache_hits = stats.cache_hits,
    attempts = stats.attempts })
  local limited = rw.client { base_url = base, concurrency = 2 }
  for i = 1, 2 do call("concurrency client " .. i, limited.get, limited, "/echo") end

  -- what the caches held at the end (the client's tables included), the
  -- tables they are keyed by still held
  assert(#anchors == 3)
  local function count(t)
    local n = 0
    for _ in pairs(t) do n = n + 1 end
    return n
  end
  local paths_kept = 0
  for _, known in pairs(c.plain_paths) do paths_kept = paths_kept + count(known) end
  local plain = 0
  for _, by_limiter in pairs(c.plain_calls) do plain = plain + count(by_limiter) end
  lines[#lines + 1] = "probe\t" .. serialize {
    switch = cache.on, url_facts = count(cache.url_facts), checked = count(cache.checked),
    lines_made = count(cache.lines_made), lines_made_json = count(cache.lines_made_json),
    plain_paths = paths_kept, plain_calls = plain,
    last_path = c.last_path ~= false,
  }
end

local f = assert(io.open(out_path, "w"))
f:write(table.concat(lines, "\n"), "\n")
f:close()
