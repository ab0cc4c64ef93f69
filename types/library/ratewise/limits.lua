---@meta _

-- Buckets, limiters, the circuit breaker and the retry budget
-- (docs/reference.md, "Buckets and limiters", "Circuit breaker and retry budget").

---What fetch's `limiter` option takes: anything with `acquire`. fetch also
---uses `wait_time` and `observe` when a limiter has them.
---@class ratewise.Limiter
---@field honors_max_wait? boolean fetch passes the time its call has left as max_wait and asks nothing first
local Limiter = {}

---`true` once `n` tokens are taken; with `max_wait`, `false` and the wait
---when it would be longer (nothing taken); `nil, err` when it cannot answer.
---@param n? number tokens (default 1)
---@param sleep? fun(seconds: number) the sleep to use instead of the host's
---@param max_wait? number seconds
---@return boolean|nil ok
---@return number|ratewise.Error|nil seconds_or_err
function Limiter:acquire(n, sleep, max_wait) end

---@class ratewise.BucketOptions
---@field capacity number the burst: a positive number
---@field rate number tokens per second
---@field sync_horizon? number the furthest one `sync` may put the next token, seconds (default 86400)
---@field slow_down? boolean run at 0.95 of the rate for a while after a throttled response (default true)

---A token bucket (`rw.bucket{...}`).
---@class ratewise.Bucket: ratewise.Limiter
local Bucket = {}

---@param n? number
---@param sleep? fun(seconds: number)
---@param max_wait? number
---@return boolean ok
---@return number? seconds
function Bucket:acquire(n, sleep, max_wait) end

---`true`, or `false` and the seconds until `n` tokens would be there.
---@param n? number
---@return boolean ok
---@return number? seconds
function Bucket:take(n) end

---0 when the `n` tokens were taken at once; otherwise the seconds to wait and a place in the queue.
---@param n? number
---@return number seconds
---@return ratewise.BucketPlace? place
function Bucket:reserve(n) end

---Takes a reserved place's tokens (0), or says how much longer to wait.
---@param place ratewise.BucketPlace
---@return number seconds
function Bucket:claim(place) end

---Gives a reserved place up.
---@param place ratewise.BucketPlace
function Bucket:cancel(place) end

---Gives back tokens that were taken and not used.
---@param n? number
function Bucket:refund(n) end

---Takes `n` at once, into debt if need be (what the server already counted):
---the callers after it wait for it; never further off than `sync_horizon`.
---@param n number
function Bucket:debit(n) end

---Seconds until `n` tokens would be there for a caller behind the queue, taking nothing.
---@param n? number
---@return number seconds
function Bucket:wait_time(n) end

---What the server says of its quota: lowers the balance to `remaining`; with
---nothing remaining, no token until `reset_in` seconds from now.
---@param remaining number
---@param reset_in? number
function Bucket:sync(remaining, reset_in) end

---The tokens in the bucket less those its waiters wait for.
---@return number
function Bucket:tokens() end

---@return number
function Bucket:capacity() end

---The rate now (below the option's while it slows down).
---@return number
function Bucket:rate() end

---@param rate number tokens per second from now on
function Bucket:set_rate(rate) end

---@return number seconds
function Bucket:sync_horizon() end

---@return boolean
function Bucket:slows_down() end

---What fetch tells it of each response; a throttled one slows the bucket down.
---@param res ratewise.Response
---@param sent_at? number `rw.now()` when the attempt was let through
function Bucket:observe(res, sent_at) end

---A closed bucket refuses every method (also `<close>` and garbage collection).
function Bucket:close() end

---A waiter's place in a bucket's queue (`b:reserve`).
---@class ratewise.BucketPlace

---@class ratewise.AdaptiveOptions
---@field rate? number requests a second to start from (default max_rate, else 10)
---@field max_rate? number never faster than this
---@field min_rate? number never slower than this (default 0.5)
---@field burst? number the bucket's capacity (default 1)
---@field beta? number a throttle drops the rate to beta times what it was (default 0.7)
---@field near? number the drop for a throttle below the rate that drew the last one (default 0.95)
---@field dormant? boolean let every request through until the server first throttles one, then learn (default false)

---A limiter that learns the server's rate (`rw.adaptive{...}`).
---@class ratewise.Adaptive: ratewise.Limiter
local Adaptive = {}

---@param n? number
---@param sleep? fun(seconds: number)
---@param max_wait? number
---@return boolean ok
---@return number? seconds
function Adaptive:acquire(n, sleep, max_wait) end

---@param res ratewise.Response
---@param sent_at? number
function Adaptive:observe(res, sent_at) end

---The rate it lets requests through at now.
---@return number
function Adaptive:rate() end

---@param n? number
---@return number seconds
function Adaptive:wait_time(n) end

---@param n? number
---@return boolean ok
---@return number? seconds
function Adaptive:take(n) end

---@param n? number
function Adaptive:refund(n) end

---Takes `n` at once, into debt if need be, at the rate learned so far.
---@param n number
function Adaptive:debit(n) end

---@return number
function Adaptive:capacity() end

---@return number
function Adaptive:tokens() end

---@param remaining number
---@param reset_in? number
function Adaptive:sync(remaining, reset_in) end

---A connected Redis client of one's own, such as `resty.redis`.
---@class ratewise.RedisClient
---@field evalsha function
---@field eval function

---Where the bucket's Redis is, as a table: the master that Sentinels name,
---or a Redis Cluster (docs/sharing.md).
---@class ratewise.RedisTopology
---@field sentinels? string[] the sentinels, "host[:port]" (26379 by default)
---@field master? string the master's name the sentinels monitor
---@field cluster? string[] nodes of a Redis Cluster, "host[:port]"
---@field username? string
---@field password? string
---@field db? integer Sentinel only (a cluster has database 0 only)
---@field sentinel_username? string
---@field sentinel_password? string

---@class ratewise.RedisBucketOptions
---@field redis string|ratewise.RedisTopology|ratewise.RedisClient `redis://[[user]:password@]host[:port][/db]`, `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db]`, a table naming sentinels or a cluster, or a connected client
---@field key string the name of the limit
---@field capacity number at most 1e9
---@field rate number tokens per second, at most 1e6
---@field on_error? "closed"|"local" when Redis fails (default "closed")
---@field timeout? number seconds a call to Redis may take (default 0.25)
---@field local_share? number the local bucket's share of rate, with on_error = "local" (default 1)
---@field sync_horizon? number seconds (default 86400)

---A bucket kept in Redis (`rw.redis_bucket{...}`). When Redis fails and
---on_error is "closed", each method answers `nil, err` (kind "limiter_unavailable").
---@class ratewise.RedisBucket: ratewise.Limiter
local RedisBucket = {}

---@param n? number
---@param sleep? fun(seconds: number)
---@param max_wait? number
---@return boolean|nil ok
---@return number|ratewise.Error|nil seconds_or_err
function RedisBucket:acquire(n, sleep, max_wait) end

---@param n? number
---@return boolean|nil ok
---@return number|ratewise.Error|nil seconds_or_err
function RedisBucket:take(n) end

---@param n? number
---@return number|nil seconds
---@return ratewise.Error? err
function RedisBucket:wait_time(n) end

---@return number|nil tokens
---@return ratewise.Error? err
function RedisBucket:tokens() end

---@param n? number
function RedisBucket:refund(n) end

---Takes `n` at once, into debt if need be; never further off than `sync_horizon`.
---@param n number
function RedisBucket:debit(n) end

---@param remaining number
---@param reset_in? number
function RedisBucket:sync(remaining, reset_in) end

---@return number
function RedisBucket:capacity() end

---@return number
function RedisBucket:rate() end

---Drops the connection.
function RedisBucket:close() end

---@class ratewise.SharedBucketOptions
---@field dict string the name of a `lua_shared_dict`
---@field key? string tells several limits in one dict apart (default "bucket")
---@field capacity number
---@field rate number tokens per second
---@field sync_horizon? number seconds (default 86400)

---A bucket shared by the workers of one nginx (`rw.shared_bucket{...}`).
---@class ratewise.SharedBucket: ratewise.Limiter
local SharedBucket = {}

---@param n? number
---@param sleep? fun(seconds: number)
---@param max_wait? number
---@return boolean ok
---@return number? seconds
function SharedBucket:acquire(n, sleep, max_wait) end

---@param n? number
---@return boolean ok
---@return number? seconds
function SharedBucket:take(n) end

---@param n? number
---@return number seconds
function SharedBucket:wait_time(n) end

---@return number
function SharedBucket:tokens() end

---@param n? number
function SharedBucket:refund(n) end

---Takes `n` at once, into debt if need be; never further off than `sync_horizon`.
---@param n number
function SharedBucket:debit(n) end

---@param remaining number
---@param reset_in? number
function SharedBucket:sync(remaining, reset_in) end

---@return number
function SharedBucket:capacity() end

---@return number
function SharedBucket:rate() end

---`rw.limiters{a, b, ..., cost = c}`: limiters in the array part, taken 1
---token each; `cost` members take `n` tokens each. Or named limits
---(`rw.limiters{requests = a, tokens = b}`), each taking its own amount of a
---cost given as a table by name (`ratewise.LimitCost`).
---@class ratewise.LimitersSpec
---@field [integer] ratewise.Limiter
---@field [string] ratewise.Limiter
---@field cost? ratewise.Limiter|ratewise.Limiter[]

---A cost per named limit: `{requests = 1, input_tokens = 900, output_tokens = 1000}`
---(a limit not named takes 0).
---@alias ratewise.LimitCost table<string, number>

---Several limiters taken as one (`rw.limiters{...}`).
---@class ratewise.Limiters: ratewise.Limiter
local Limiters = {}

---@param cost? number|ratewise.LimitCost tokens, or a cost per limit (named limits)
---@param sleep? fun(seconds: number)
---@param max_wait? number
---@return boolean|nil ok
---@return number|ratewise.Error|nil seconds_or_err
function Limiters:acquire(cost, sleep, max_wait) end

---Seconds until every member could serve (0: now), taking nothing.
---@param cost? number|ratewise.LimitCost
---@return number|nil seconds
---@return ratewise.Error? err
function Limiters:wait_time(cost) end

---Takes from every member or from none of them.
---@param cost? number|ratewise.LimitCost
---@return boolean|nil ok
---@return number|ratewise.Error|nil seconds_or_err
function Limiters:take(cost) end

---@param cost? number|ratewise.LimitCost
function Limiters:refund(cost) end

---What an answer really cost, once it ended: less than `taken` gives the
---difference back, more takes the extra at once, into debt. A limit
---`actual` does not name stays as taken.
---@param taken number|ratewise.LimitCost
---@param actual? number|ratewise.LimitCost
function Limiters:settle(taken, actual) end

---The largest cost an acquire may ask for; named limits: each one's, by name.
---@return number|table<string, number>
function Limiters:capacity() end

---What the server says of its request quota: to the members counting requests.
---@param remaining number
---@param reset_in? number
---@param limit? number
---@param window? number
function Limiters:sync(remaining, reset_in, limit, window) end

---What the server says of one named limit; `false` when the composite has no such limit.
---@param name string
---@param remaining number
---@param reset_in? number
---@param limit? number
---@param window? number
---@return boolean synced
function Limiters:sync_limit(name, remaining, reset_in, limit, window) end

---@param res ratewise.Response
---@param sent_at? number
function Limiters:observe(res, sent_at) end

---Limits per model (`rw.by_model{...}`): fetch and a client ask
---`for_request` for the limiter of each request, which serves the whole call.
---@class ratewise.ByModel
local ByModel = {}

---The limiter of the model `request.json.model` names, else the default;
---raises for a model with neither. A request naming no model: the default, or nil.
---@param request ratewise.CostRequest
---@return ratewise.Limiter|nil
function ByModel:for_request(request) end

---The limiter of model `name`, else the default, else nil.
---@param name string
---@return ratewise.Limiter|nil
function ByModel:model(name) end

---Raises: which limits apply is a request's to say (use `l:model(name)`).
function ByModel:acquire() end

---The same choice by model, each model's limiter (and the default) taken
---together with `limiter`, which takes 1 per request; a request naming no
---model takes `limiter` alone. What a client makes for a route with a limiter.
---@param limiter ratewise.Limiter
---@return ratewise.ByModel
function ByModel:beneath(limiter) end

---@alias ratewise.CircuitState "closed"|"open"|"half_open"

---@class ratewise.CircuitOptions
---@field failures? integer failures in a row that open the circuit (default 5)
---@field cooldown? number seconds it stays open (default 30)
---@field on_change? fun(origin: string, from: ratewise.CircuitState, to: ratewise.CircuitState)

---A circuit breaker per origin (`rw.circuit{...}`).
---@class ratewise.Circuit
local Circuit = {}

---`true`, or `false` and the seconds until a trial request would be let through.
---@param origin string `"scheme://host:port"`
---@return boolean ok
---@return number? seconds
function Circuit:allow(origin) end

---@param origin string
---@param outcome "success"|"failure"|"neutral"
function Circuit:record(origin, outcome) end

---@param origin string
---@return ratewise.CircuitState
function Circuit:state(origin) end

---The origins the breaker holds state for.
---@return table<string, ratewise.CircuitState>
function Circuit:states() end

---@class ratewise.RetryBudgetOptions
---@field ratio? number retries allowed per request (default 0.1)
---@field min_per_second? number the floor for a quiet client (default 10)
---@field window? number seconds (default 10)

---@class ratewise.RetryBudgetStats
---@field requests integer
---@field retries integer
---@field refused integer
---@field available number retries the window allows right now

---Caps retries at a share of the requests (`rw.retry_budget{...}`).
---@class ratewise.RetryBudget
local RetryBudget = {}

---Counts a request (fetch calls it once per call).
function RetryBudget:request() end

---`true` (the retry is counted) or `false` (the refusal is counted).
---@return boolean
function RetryBudget:allow_retry() end

---@return ratewise.RetryBudgetStats
function RetryBudget:stats() end
