---@meta ratewise

-- require "ratewise": calls to rate-limited web APIs that wait the way the
-- server asks. Every name here is described in docs/reference.md.

---@class ratewise
---@field _VERSION string the version string
---@field pollable ratewise.Pollable the scheduler as a pollable: what an event loop waits on before `rw.step(0)`
---@field features ratewise.Features what this build has
---@field policy ratewise.PolicyModule `rw.policy{...}` makes a policy; `rw.policy.chain(a, b, ...)` joins several
---@field providers ratewise.Providers the built-in provider policies, loaded on first use
---@field null lightuserdata what a JSON `null` decodes to, and what the `json` option writes as `null`: the light userdata NULL, the same value as lua-cjson's `cjson.null` and OpenResty's `ngx.null` (docs/reference.md#json)
local ratewise = {}

---`rw.features`: what this build of ratewise has.
---@class ratewise.Features
---@field redis boolean `rw.redis_bucket` takes a `redis://` URL (false when built with `make REDIS=0`)
---@field poller "epoll"|"poll" the engine's OS wait
---@field pollfd boolean `rw.pollable:pollfd()` is a descriptor (false with the poll(2) backend)

---One HTTP request, retried the way the server asks. Misuse (a bad URL, an
---unknown or bad option) raises; whatever the network or the server causes
---comes back as `nil, err`.
---@param url string an `http://` or `https://` URL
---@param opts? ratewise.FetchOptions
---@return ratewise.Response|nil res
---@return ratewise.Error|nil err
function ratewise.fetch(url, opts) end

---One API's settings in one place: a base URL, headers, a provider, limiters
---per route, a cap on requests in flight, a circuit breaker, a retry budget.
---@param opts ratewise.ClientOptions
---@return ratewise.Client
function ratewise.client(opts) end

---A token bucket: burst `capacity`, refilled at `rate` tokens a second. It starts full.
---@param opts ratewise.BucketOptions
---@return ratewise.Bucket
function ratewise.bucket(opts) end

---A limiter that learns the server's rate from what fetch tells it of each response.
---@param opts? ratewise.AdaptiveOptions
---@return ratewise.Adaptive
function ratewise.adaptive(opts) end

---A bucket shared by every process that names the same `key`, kept in Redis.
---@param opts ratewise.RedisBucketOptions
---@return ratewise.RedisBucket
function ratewise.redis_bucket(opts) end

---Inside OpenResty: a bucket shared by the workers of one nginx, in a `lua_shared_dict`.
---@param opts ratewise.SharedBucketOptions
---@return ratewise.SharedBucket
function ratewise.shared_bucket(opts) end

---Several limiters taken as one: the array part is taken 1 token per acquire,
---the `cost` members `n` tokens; or named limits (`{requests = a, tokens = b}`),
---each taking its amount of a cost given per limit.
---@param spec ratewise.LimitersSpec
---@return ratewise.Limiters
function ratewise.limiters(spec) end

---The limits of several models (`{["gpt-4o"] = limiter, ..., default = limiter}`):
---fetch takes each request from those of the model its JSON body names.
---@param spec table<string, ratewise.Limiter>
---@return ratewise.ByModel
function ratewise.by_model(spec) end

---A circuit breaker per origin, for fetch's `circuit` option.
---@param opts? ratewise.CircuitOptions
---@return ratewise.Circuit
function ratewise.circuit(opts) end

---Caps retries at a share of the requests, for fetch's `budget` option.
---@param opts? ratewise.RetryBudgetOptions
---@return ratewise.RetryBudget
function ratewise.retry_budget(opts) end

---Runs `fn` as a task and returns its results once it and every task
---spawned under it have finished; raises its error, or that of a task under
---it that failed and was never joined.
---@param fn function
---@param ... any passed to `fn`
---@return any ...
function ratewise.run(fn, ...) end

---Starts `fn(...)` as a task at the scheduler's next turn.
---@param fn function
---@param ... any passed to `fn`
---@return ratewise.Task
function ratewise.spawn(fn, ...) end

---Drives the scheduler for at most `timeout` seconds (default 0) and returns
---the number of live tasks.
---@param timeout? number seconds; `math.huge` runs until no task is left
---@param budget? number|false seconds of work one call may do (0.5 ms for `rw.step(0)`); `false`: no bound
---@return integer live
function ratewise.step(timeout, budget) end

---Calls `fn(item, index)` for every item, at most `concurrency` at once, and
---returns the first and second values of each call in list order.
---@param list any[]
---@param fn fun(item: any, index: integer): any, any
---@param opts? ratewise.MapOptions
---@return table results `results.n` is `#list`
---@return table errors
function ratewise.map(list, fn, opts) end

---At most `n` holders at once, served first come, first served.
---@param n integer
---@return ratewise.Semaphore
function ratewise.semaphore(n) end

---Waits, the way the host at hand waits. `seconds` must be finite and non-negative.
---@param seconds number
function ratewise.sleep(seconds) end

---Marks a coroutine whose runner resumes its waits' yields (`"ratewise.sleep", seconds, rw.pollable`);
---`false` takes the mark back. Returns `co`.
---@param co thread
---@param yes? boolean
---@return thread co
function ratewise.speaks_protocol(co, yes) end

---`pcall` that a task may wait inside, on every Lua (PUC Lua 5.1's own cannot be yielded through).
---@param fn function
---@param ... any
---@return boolean ok
---@return any ...
function ratewise.pcall(fn, ...) end

---Settings for the whole Lua state. Unknown options raise.
---@param opts ratewise.ConfigureOptions
function ratewise.configure(opts) end

---The monotonic clock ratewise uses for deadlines, buckets and breakers.
---@return number seconds
function ratewise.now() end

---`"success"` for 200-299; `"retryable"` for 408, 429, 500, 502, 503, 504;
---`"terminal"` for everything else.
---@param status integer
---@return ratewise.Class
function ratewise.classify(status) end

---Every value of a response header field, one entry per field line, in order.
---@param res ratewise.Response
---@param name string case-insensitive
---@return string[] values
function ratewise.header_values(res, name) end

---The wait before retry number `attempt` (from 0), from a response's headers.
---@param headers table<string, string|string[]>
---@param attempt integer
---@param opts? ratewise.RetryDelayOptions
---@return number seconds
---@return ratewise.DelaySource source `"retry-after"`, `"x-ratelimit-reset"` or `"backoff"`
function ratewise.retry_delay(headers, attempt, opts) end

---The fallback backoff before retry number `attempt` (from 0).
---@param attempt integer
---@param opts? ratewise.BackoffOptions
---@return number seconds
function ratewise.backoff(attempt, opts) end

---`Retry-After`'s value: delta-seconds or an HTTP-date relative to `now`.
---@param value string
---@param now? number epoch seconds (default: the wall clock)
---@return number|nil seconds
function ratewise.parse_retry_after(value, now) end

---An HTTP-date in any of the three forms RFC 9110 accepts.
---@param s string
---@param now? number epoch seconds, for two-digit years (default: the wall clock)
---@return number|nil epoch
function ratewise.parse_http_date(s, now) end

---A Go duration such as `"6m0s"`.
---@param s string
---@return number|nil seconds
function ratewise.parse_duration(s) end

---An RFC 3339 date-time such as `"2025-01-01T12:00:30Z"`.
---@param s string
---@return number|nil epoch
function ratewise.parse_rfc3339(s) end

return ratewise
