---@meta ratewise.core

-- ratewise.core: the C core (src/*.c), as the Lua layer in lua/ratewise
-- uses it. Not a public API: `require "ratewise"` is. Misuse raises;
-- runtime failures answer nil, err.

---@class ratewise.core
---@field version string ratewise's version
---@field curl_version string libcurl's version string
---@field null lightuserdata the light userdata NULL: `rw.null`, JSON's null
---@field redis boolean whether the core has its Redis connection (false when built with `make REDIS=0`)
---@field poller "epoll"|"poll" the engine's OS wait, chosen at build time (`make POLLER=poll`)
---@field secret_header_names string[] the built-in secret request headers
---@field transport_header_names string[] the request headers libcurl owns (a caller's raise)
---@field max_request_header_bytes integer the most bytes of request headers in all
---@field bucket_methods table<string, function> the methods of every ratewise.Bucket (lua/ratewise/bucket.lua adds to them)
---@field engine_methods table<string, function> the methods of every ratewise.Engine (the Lua layer calls the hot ones as local functions)
---@field transfer_methods table<string, function> the methods of every ratewise.Transfer (as engine_methods)
local core = {}

---The monotonic clock, seconds.
---@return number
function core.now() end

---The wall clock, epoch seconds.
---@return number
function core.time() end

---Bytes the C heap has handed out and not had back (glibc), or nil elsewhere.
---@return integer|nil
function core.malloc_in_use() end

---`n` bytes from the kernel's cryptographic generator, or nil, err.
---@param n integer from 1 to 256
---@return string|nil bytes
---@return string? err
function core.random_bytes(n) end

---SipHash-2-4 (128-bit output) of `data` under `key` (16 raw bytes), or nil, err.
---@param key string 16 bytes
---@param data string
---@return string|nil digest
---@return string? err
function core.digest(key, data) end

---A digester under `key` (`ratewise.Digester`): the request keys of an `rw.client`, or nil, err.
---@param key string 16 bytes
---@return ratewise.Digester|nil digester
---@return string? err
function core.digester(key) end

---Whether lua-cjson writes `value` with the bytes ratewise's own JSON encoder writes (but for its `\/`): numbers exact in 14 digits, ASCII strings and keys, plain tables at most 16 deep, no null but rw.null (`host_null`, a host's, answers false).
---@param value any
---@param host_null any|nil
---@return boolean
function core.json_plain(value, host_null) end

---A number in [0, 1) from the kernel's generator, or nil, err.
---@return number|nil
---@return string? err
function core.random() end

---The fields of table `t` in the order `next` gives them, and how many: when it has no metatable and three fields at most; else false; nil when `t` is not a table (fetch's look at its options).
---@param t any
---@return integer|false|nil n
---@return any k1
---@return any v1
---@return any k2
---@return any v2
---@return any k3
---@return any v3
function core.few_fields(t) end

---`fn(...)`'s results, called where nothing can yield: a host that interrupts its coroutines where they may yield (HAProxy's forced yield) cannot stop it halfway (a scheduler step).
---@param fn function
---@param ... any
---@return any ...
function core.unyielding(fn, ...) end

---The actions for SIGINT, SIGTERM and SIGHUP that `core.trap_stop_signals` replaced (src/term.c).
---@class ratewise.term_saved_signals

---From now on SIGINT, SIGTERM and SIGHUP set the flag `core.interrupted` reads (the CLI's Ctrl-C, kill, a closed terminal); the actions they replaced, for `core.release_stop_signals`, or nil, err.
---@return ratewise.term_saved_signals|nil saved
---@return string? err
function core.trap_stop_signals() end

---SIGINT, SIGTERM and SIGHUP do again what they did before `core.trap_stop_signals`.
---@param saved ratewise.term_saved_signals
function core.release_stop_signals(saved) end

---false, or the number of the first stop signal (SIGINT, SIGTERM, SIGHUP) that came since `core.trap_stop_signals`.
---@return false|integer
function core.interrupted() end

---A write to a closed pipe fails with EPIPE instead of ending the process.
function core.ignore_sigpipe() end

---The columns of the terminal at `fd`, or nil when it is not one (or does not say).
---@param fd integer
---@return integer|nil
function core.terminal_width(fd) end

---One read(2) of at most `max` bytes from a descriptor poll found readable: the bytes ("" at the end), or nil, err.
---@param fd integer
---@param max integer
---@return string|nil bytes
---@return string? err
function core.read_fd(fd, max) end

---Whether the descriptor is a terminal.
---@param fd integer
---@return boolean
function core.isatty(fd) end

---@param status integer
---@return ratewise.Class
function core.classify(status) end

---@param s string
---@param now? number
---@return number|nil epoch
function core.parse_http_date(s, now) end

---@param value string
---@param now? number
---@return number|nil seconds
function core.parse_retry_after(value, now) end

---Non-negative decimal seconds, such as a rate header's.
---@param s string
---@return number|nil seconds
function core.parse_seconds(s) end

---@param s string
---@return number|nil seconds
function core.parse_duration(s) end

---@param s string
---@return number|nil epoch
function core.parse_rfc3339(s) end

---The backoff's arithmetic; lua/ratewise/retry.lua checks and names the options.
---@param attempt integer
---@param base number
---@param max_delay number
---@param jitter ratewise.Jitter
---@param u number a number in [0, 1)
---@param previous? number
---@return number seconds
function core.backoff(attempt, base, max_delay, jitter, u, previous) end

---The target of the first link of a Link field value (RFC 8288) whose `rel` names `rel`, resolved
---against `base` (RFC 3986) when given; nil when there is none; nil and why when its target does not
---resolve or holds a space or a control character.
---@param value string
---@param rel string
---@param base? string
---@return string|nil url
---@return string|nil why
function core.link(value, rel, base) end

---An event-stream parser: a line or an event's data may hold at most `max` bytes (default 1 MiB).
---@param max? integer
---@return ratewise.SSEParser
function core.sse_parser(max) end

---A token bucket (what `rw.bucket` is; without `slow_down` handled here).
---@param opts ratewise.BucketOptions
---@return ratewise.Bucket
function core.bucket(opts) end

---The transfer engine: a libcurl multi handle.
---@param opts? ratewise.core.EngineOptions
---@return ratewise.Engine|nil engine
---@return string? err
function core.engine(opts) end

---Makes a lazily built response's header tables from its raw header block.
---@param res ratewise.Response
function core.response_headers(res) end

---Starts a connection to Redis; it is under way when this returns.
---Absent from a core built without Redis.
---@param host string
---@param port integer
---@return ratewise.Redis|nil conn
---@return string? err
function core.redis_connect(host, port) end

---@class ratewise.core.EngineOptions
---@field max_connections? integer
---@field max_idle_connections? integer

---The request table `engine:start` takes (its fields: src/transfer.h, REQUEST_FIELDS).
---@class ratewise.core.Request
---@field url string
---@field method string
---@field body? string
---@field empty_body? boolean
---@field transport? string[]|false the names of the rarer fields the request sets (false: none)
---@field decompress? boolean
---@field secret_headers? string[]
---@field headers? table the request headers, as src/request.c reads them
---@field timeout? number
---@field connect_timeout? number
---@field first_byte_timeout? number
---@field idle_timeout? number
---@field stream? boolean
---@field follow_redirects? boolean
---@field max_body? number
---@field no_replay? boolean
---@field verify_tls? boolean
---@field ca_file? string
---@field ca_path? string
---@field client_cert? string
---@field client_key? string
---@field client_key_password? string
---@field pinned_public_key? string
---@field proxy? string
---@field proxy_ca_file? string
---@field tls_min_version? "1.2"|"1.3"

---@class ratewise.Engine
local Engine = {}

---Starts a transfer; `owner` is named with it when a poll reports it (finished, or a stream's news).
---@param request ratewise.core.Request
---@param owner? any
---@return ratewise.Transfer|nil transfer
---@return ratewise.TransportError|string|nil err
function Engine:start(request, owner) end

---Drives every running transfer; waits at most `timeout` seconds when none
---has finished. The finished ones are `out[1..n]`.
---@param timeout? number
---@param out? table
---@param budget? number
---@param owners? table
---@return table out
---@return integer n
function Engine:poll(timeout, out, budget, owners) end

---New connection limits for a running engine.
---@param opts ratewise.core.EngineOptions
function Engine:configure(opts) end

---Transfers in flight, finished ones not yet reported, and watched descriptors.
---@return integer
function Engine:running() end

---Once nothing runs, closes the connections kept from a burst and lets large buffers go.
function Engine:trim() end

---The descriptor that is readable when a transfer can move; nil with the
---poll(2) backend, which has none (`Engine:timeout()` then says when to look again).
---@return integer|nil fd
function Engine:pollfd() end

---The next poll that finds `fd` ready reports it, once, among the finished transfers.
---@param fd integer
---@param mode "r"|"w"
function Engine:watch(fd, mode) end

---@param fd integer
function Engine:unwatch(fd) end

---@return "r"
function Engine:events() end

---Where a host whose loop cannot wait on `pollfd()` (OpenResty's) connects
---a socket of its own: a unix socket the engine listens on (src/wake.c).
---nil, err with the poll(2) backend, or in a process forked after it was made.
---@return string|nil path
---@return string|nil err
function Engine:wake_path() end

---The newest connection to `wake_path()` becomes the line the engine writes on.
---@return true|nil ok
---@return string|nil err
function Engine:wake_accept() end

---One byte goes down the line once `pollfd()` is readable, or the seconds have passed.
---@param seconds? number
function Engine:wake_arm(seconds) end

---One byte down the line now.
function Engine:wake_kick() end

---Seconds until the engine must be polled (0: now), or nil when nothing is due.
---@return number|nil
function Engine:timeout() end

---Running transfers end as aborted.
function Engine:close() end

---@class ratewise.Transfer
local Transfer = {}

---@return boolean
function Transfer:done() end

---Whom the next polls name with this transfer: at its end, and at a stream's news, which then forgets it.
---@param owner any
function Transfer:set_owner(owner) end

---The response table, or nil and the transport error.
---@param lazy? boolean
---@param close? boolean
---@param recycle? boolean
---@param mt? table
---@param url? string the response's url when no redirect was followed
---@return ratewise.Response|nil res
---@return ratewise.TransportError|nil err
function Transfer:result(lazy, close, recycle, mt, url) end

---A streamed transfer's timeout (the request's) applies to its body too: for a reader that reads the whole body within a call's time.
function Transfer:bound() end

---The final response's status and headers once they are in, while the transfer runs.
---@return table|nil
function Transfer:head() end

---The body bytes since the last read; nil when none has come yet; false once all were read.
---@return string|false|nil
function Transfer:read() end

---Aborts a running transfer and closes its connection.
function Transfer:cancel() end

function Transfer:close() end

---An event-stream parser (`core.sse_parser`).
---@class ratewise.SSEParser
local SSEParser = {}

---The events the chunk completed, in order; nil, err when a line or an event is over max.
---@param chunk string
---@return ratewise.ServerEvent[]|nil events
---@return string? err
function SSEParser:feed(chunk) end

function SSEParser:close() end

---SipHash-2-4 (128-bit output) under a digester's key of a list of strings, each framed by its
---length (LEB128), as `core.digest` of those bytes; nil, err when libcrypto fails.
---@class ratewise.Digester
---@overload fun(parts: string[]): string|nil, string?

---A connection to Redis (`core.redis_connect`).
---@class ratewise.Redis
local Redis = {}

---@return integer fd
function Redis:fd() end

---`true` once connected, `false` while under way, nil and an error when it failed.
---@return boolean|nil
---@return string? err
function Redis:connected() end

---Queues one command; `flush` writes it.
---@param ... string|number
function Redis:send(...) end

---`true` when every queued command is written, `false` when the socket takes no more for now.
---@return boolean|nil
---@return string? err
function Redis:flush() end

---`true, value` when a reply is complete; `false` when more must arrive.
---@return boolean|nil
---@return any value_or_err
function Redis:read() end

function Redis:close() end

return core
