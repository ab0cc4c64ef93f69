--- ratewise: calls to rate-limited web APIs that wait the way the server asks.
-- The C core (ratewise.core) parses, classifies, counts tokens and runs
-- transfers; the Lua modules here wire that into the public API.
-- The version of these Lua modules, which the C core they are written
-- against states too (src/ratewise.h). A core from another build (an older
-- core.so earlier on package.cpath, a luarocks tree beside a checkout)
-- would otherwise fail later with an error that names neither.
local VERSION = "0.1.0"
local core = require "ratewise.core"
if core.version ~= VERSION then
  error(string.format("ratewise: the C core (ratewise.core) is version %s but these Lua modules are %s: "
    .. "they come from different builds. Rebuild the core from the same source as the modules (`make`, "
    .. "or `luarocks make` in the source tree), or put the matching core.so first on package.cpath",
    type(core.version) == "string" and core.version or "unknown", VERSION), 2)
end
local compat = require "ratewise.compat"
local json = require "ratewise.json"
local policy = require "ratewise.policy"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"
-- The hosts found without configuration register themselves with the seam.
require "ratewise.hosts.openresty"
require "ratewise.hosts.cqueues"
require "ratewise.hosts.nvim"
require "ratewise.hosts.tarantool"
require "ratewise.hosts.weechat"
require "ratewise.hosts.haproxy"
require "ratewise.hosts.prosody"
require "ratewise.hosts.mpv"

local ratewise = {
  _VERSION = core.version,
  --- "success" | "retryable" | "terminal" = rw.classify(status)
  classify = core.classify,
  --- epoch_seconds | nil = rw.parse_http_date(s [, now])
  parse_http_date = core.parse_http_date,
  --- seconds | nil = rw.parse_retry_after(value [, now])
  parse_retry_after = core.parse_retry_after,
  --- seconds | nil = rw.parse_duration(s): Go durations such as "6m0s"
  parse_duration = core.parse_duration,
  --- epoch_seconds | nil = rw.parse_rfc3339(s)
  parse_rfc3339 = core.parse_rfc3339,
  --- seconds on the monotonic clock
  now = core.now,
  --- results... = rw.run(fn, ...)
  run = scheduler.run,
  --- task = rw.spawn(fn, ...)
  spawn = scheduler.spawn,
  --- live_tasks = rw.step([timeout [, budget]])
  step = scheduler.step,
  --- rw.pollable:pollfd(), :events(), :timeout(): what an event loop waits on before rw.step(0)
  pollable = scheduler.pollable,
  --- what this build has: redis (rw.redis_bucket takes a redis:// URL), poller ("epoll" | "poll"),
  --- pollfd (rw.pollable:pollfd() is a descriptor, not nil)
  features = { redis = core.redis == true, poller = core.poller, pollfd = core.poller ~= "poll" },
  --- results, errors = rw.map(list, fn [, {concurrency = n}])
  map = scheduler.map,
  --- co = rw.speaks_protocol(co [, false]): co's runner resumes its waits' yields ("ratewise.sleep", seconds,
  --- rw.pollable)
  speaks_protocol = runtime.speaks_protocol,
  --- ok, ... = rw.pcall(fn, ...): pcall that a task may wait inside, on every Lua (PUC Lua 5.1's own pcall
  --- cannot be yielded through)
  pcall = compat.pcall,
  --- rw.configure{sleep = fn | false, wait = fn | false, log = fn | false | true, max_connections = n, ...}
  configure = runtime.configure,
  --- sem = rw.semaphore(n): sem:acquire(), sem:release()
  semaphore = scheduler.semaphore,
  --- rw.null: a JSON null as res:json() gives it, and what the json option writes as null (the light
  --- userdata NULL: lua-cjson's cjson.null and OpenResty's ngx.null are the same value)
  null = json.null,
  --- p = rw.policy{classify = fn, delay = fn, observe = fn, prepare = fn}; rw.policy.chain(a, b, ...)
  policy = policy,
}

-- What the fields below name is loaded on its first use: a program (a
-- Neovim plugin, loaded as the editor starts) that never makes a client or
-- a shared limit does not pay for loading them. Each field is then kept in
-- the table, so the lookup happens once.
local lazy = {
  --- seconds = rw.backoff(attempt [, opts])
  backoff = { "ratewise.retry", "backoff" },
  --- seconds, source = rw.retry_delay(headers, attempt [, opts])
  retry_delay = { "ratewise.retry", "delay" },
  --- values = rw.header_values(res, name): each line of a repeated response header (Set-Cookie)
  header_values = { "ratewise.headers", "values" },
  --- bucket = rw.bucket{capacity = C, rate = R [, slow_down = false]}
  bucket = { "ratewise.bucket", "new" },
  --- limiter = rw.adaptive{[rate = r] [, max_rate = m] [, min_rate = f] [, burst = b] [, beta = x] [, near = y]}
  adaptive = { "ratewise.adaptive", "new" },
  --- limiter = rw.redis_bucket{redis = url | client, key = name, capacity = C, rate = R [, on_error = "local"]}
  redis_bucket = { "ratewise.redis_bucket", "new" },
  --- limiter = rw.shared_bucket{dict = name, [key = name,] capacity = C, rate = R}: nginx workers' shared limit
  shared_bucket = { "ratewise.shared_bucket", "new" },
  --- res | nil, err = rw.fetch(url [, opts])
  fetch = { "ratewise.fetch", "fetch" },
  --- c = rw.client{base_url = ..., ...}
  client = { "ratewise.client", "new" },
  --- breaker = rw.circuit{failures = 5, cooldown = 30}
  circuit = { "ratewise.circuit", "new" },
  --- budget = rw.retry_budget{ratio = 0.1, min_per_second = 10, window = 10}
  retry_budget = { "ratewise.retry_budget", "new" },
  --- limiter = rw.limiters{a, b, ..., cost = c}
  limiters = { "ratewise.limiters", "new" },
  --- limiter = rw.by_model{["model"] = limiter, ... [, default = limiter]}: each model's limits
  by_model = { "ratewise.limiters", "by_model" },
}

setmetatable(ratewise, {
  __index = function(t, name)
    local where = lazy[name]
    if not where then return nil end
    local module = require(where[1])
    local value = module[where[2]]
    rawset(t, name, value)
    return value
  end,
})

--- rw.providers.NAME: the built-in provider policies, loaded on first use.
ratewise.providers = setmetatable({}, {
  __index = function(t, name)
    if type(name) ~= "string" or not name:match("^[%w_]+$") then return nil end
    local ok, p = pcall(require, "ratewise.providers." .. name)
    if not ok then
      if tostring(p):find("module 'ratewise.providers." .. name .. "' not found", 1, true) then return nil end
      error(p, 2)
    end
    if not policy.is_policy(p) then return nil end -- a helper module, not a provider
    rawset(t, name, p)
    return p
  end,
})

--- rw.sleep(seconds): waits the way the host at hand waits (see runtime.lua).
-- NaN and infinity are refused: such a wait never ends by the clock.
function ratewise.sleep(seconds)
  if type(seconds) ~= "number" or seconds ~= seconds or seconds < 0 or seconds == math.huge then
    error(string.format("sleep: seconds must be a finite, non-negative number (got %s)",
      scheduler.bad_seconds(seconds) or tostring(seconds)), 2)
  end
  return runtime.sleep(seconds)
end

return ratewise
