---@meta _

-- rw.fetch: its options, the response, errors and callbacks
-- (docs/reference.md, "Requests: rw.fetch").

---@alias ratewise.Class "success"|"retryable"|"terminal"

---What a call does with a wait the server asks for.
---@alias ratewise.RetryAfterMode
---| "honor"     # wait it out (kind "budget" when it will not fit)
---| "clamp"     # wait at most retry_after_max, then try again
---| "fail_fast" # end at once with kind "throttled" when the wait is over retry_after_max
---| "defer"     # end at once with kind "deferred" (err.retry_at says when)

---@alias ratewise.Jitter "full"|"equal"|"decorrelated"|"none"

---Where a retry's wait came from.
---@alias ratewise.DelaySource "retry-after"|"x-ratelimit-reset"|"backoff"|"policy"|"delay"

---@alias ratewise.ErrorKind
---| "terminal"            # a status that is never retried; the response is in err.response
---| "unsafe"              # a retryable failure of a request that is not replay-safe
---| "exhausted"           # max_retries retries were not enough
---| "deferred"            # retry_after = "defer" and the server asked for a wait
---| "throttled"           # retry_after = "fail_fast" and the wait was over retry_after_max
---| "budget"              # the next wait would not fit in max_elapsed, or the retry budget refused
---| "network"             # a transport failure a retry will not fix
---| "circuit_open"        # the circuit breaker is open for this origin: nothing was sent
---| "limiter_unavailable" # the limiter could not answer: nothing was sent
---| "stream"              # a streamed body broke off (from res:read())
---| "entropy"             # no randomness for idempotency_key = true: nothing was sent
---| "pagination"          # client:pages met a next link it does not follow: nothing more was sent

---The options of `rw.fetch` (an unknown or bad one raises, naming it).
---@class ratewise.FetchOptions
---@field method? string any token; upper-cased (default `"GET"`, or `"POST"` with a body)
---@field headers? table<string, string|number> request headers (name -> value)
---@field body? string sent as it is
---@field json? table encoded with lua-cjson as the body, with JSON Content-Type and Accept
---@field query? table<string, string|number|boolean|(string|number)[]> appended to the URL in sorted name order
---@field stream? boolean return once a 2xx's headers are in; read the body with res:read(), :chunks(), :events()
---@field idempotency_key? true|string sent as Idempotency-Key on every attempt; makes the request replay-safe
---@field secret_headers? string[] more header names whose values are credentials
---@field timeout? number seconds per attempt (default 30)
---@field connect_timeout? number seconds to connect (TCP and TLS)
---@field first_byte_timeout? number seconds from the start of an attempt to the final response's headers
---@field idle_timeout? number seconds the body may go without a byte
---@field max_retries? integer retries after the first attempt (default 3)
---@field max_elapsed? number seconds for the whole call, waits included (default 120)
---@field deadline? number a time on `rw.now()`'s clock the call ends by, waits included; the earlier of it and max_elapsed wins
---@field max_delay? number caps the fallback backoff only (default 60)
---@field base? number the fallback backoff's base, seconds (default 1)
---@field jitter? ratewise.Jitter the fallback backoff's jitter (default "full")
---@field delay? fun(res: ratewise.Response|nil, attempt: integer, transport_err: ratewise.TransportError|nil): number|nil replaces the backoff, or lengthens a server hint
---@field retry_non_idempotent? boolean allow retrying POST, PATCH and other unsafe methods
---@field retry_after? ratewise.RetryAfterMode what to do with a wait the server asks for (default "honor")
---@field retry_after_max? number seconds: required by "clamp" and "fail_fast"
---@field hint_jitter? number a waited-out hint is spread upwards by up to this share (default 0.2)
---@field limiter? ratewise.Limiter taken before every attempt, retries included
---@field cost? number|ratewise.LimitCost|fun(request: ratewise.CostRequest): number|ratewise.LimitCost tokens the limiter takes per attempt (default 1; a limiter with named limits: a cost per limit, by default the policy's estimate)
---@field policy? ratewise.Policy|ratewise.ProviderName|false the API's dialect (`rw.policy{...}`, `rw.providers.NAME` or a provider's name); none: the provider of the URL's host (docs/providers.md); false: none at all
---@field circuit? ratewise.Circuit an open circuit ends the call with kind "circuit_open"
---@field budget? ratewise.RetryBudget a refused retry ends the call with kind "budget"
---@field follow_redirects? boolean follow up to 10 redirects (default true)
---@field max_body? number bytes of decoded body at most (default 64 MiB)
---@field decompress? boolean offer and decode every encoding libcurl knows (default true)
---@field verify_tls? boolean `false` turns certificate verification off (default true)
---@field ca_file? string a PEM file of CAs
---@field ca_path? string a folder of CAs hashed by `openssl rehash`
---@field client_cert? string a client certificate (PEM)
---@field client_key? string the client certificate's key
---@field client_key_password? string the key's password
---@field pinned_public_key? string `sha256//<base64>` (several joined with `;`), or a PEM/DER file
---@field tls_min_version? "1.2"|"1.3"
---@field proxy? string `http://[user:password@]host:port` (or `https://`, `socks5h://`)
---@field proxy_ca_file? string the CAs to verify an `https://` proxy's own certificate against
---@field on_retry? fun(info: ratewise.RetryInfo)|false called before each retry's wait; `false`: silence
---@field on_event? fun(event: ratewise.Event) sees every step of a call
---@field sleep? fun(seconds: number) the host's own sleep

---A response: status, headers and body, and the methods to read it.
---@class ratewise.Response
---@field status integer the status code
---@field headers table<string, string> the final response's fields: lower-case names, case-insensitive lookup
---@field header_lists? table<string, string[]> each field that came more than once, one entry per line
---@field trailers? table<string, string> trailer fields after the body, when there were any
---@field body? string the body; nil for a streamed response until `res:json()` reads it whole
---@field attempts integer attempts made, the first included
---@field elapsed number seconds the whole call took, waits included
---@field url string the URL after redirects, without userinfo or query
---@field redirects integer redirects followed
---@field http_version "1.0"|"1.1"|"2"|"3"
---@field throttled boolean true when the server refused for rate
---@field time number seconds the last attempt's transfer took
local Response = {}

---The body bytes come since the last read, waiting for some; nil at the end,
---or nil and an error of kind "stream" when a stream broke off.
---@return string|nil chunk
---@return ratewise.Error|nil err
function Response:read() end

---An iterator over `res:read()`'s chunks; a stream that breaks off raises its error.
---@return fun(): string|nil
function Response:chunks() end

---An iterator over the body read as server-sent events.
---@return fun(): ratewise.ServerEvent|nil
function Response:events() end

---Stops reading a streamed response; its transfer ends and its connection closes.
function Response:close() end

---The body decoded as JSON, or nil and why for a body that is not JSON.
---@return any|nil value
---@return string|nil why
function Response:json() end

---One server-sent event.
---@class ratewise.ServerEvent
---@field event string the event's name ("message" unless the stream named one)
---@field data string the data lines joined with "\n"
---@field id? string the stream's last event id
---@field retry? integer milliseconds, when the event set it
local ServerEvent = {}

---The event's data decoded as JSON (`rw.null` for a JSON null); nil for `[DONE]`, the end of
---OpenAI-style streams. Raises for data that is neither, naming the event.
---@return any|nil value
function ServerEvent:json() end

---What `rw.fetch` answers instead of a response. `tostring(err)` gives
---`ratewise: <kind>: <message>`.
---@class ratewise.Error
---@field kind ratewise.ErrorKind|string
---@field message string
---@field status? integer the last response's status (nil after a transport failure)
---@field response? ratewise.Response the last response, when there was one
---@field attempts? integer
---@field elapsed? number seconds
---@field transport? ratewise.TransportError libcurl's word after a transport failure
---@field retry_in? number seconds from now the server said to come back
---@field retry_at? number epoch seconds the server said to come back
---@field delivered? integer (kind "stream") bytes handed over before the stream broke off

---A transport failure, as the engine reports it.
---@class ratewise.TransportError
---@field code integer libcurl's CURLcode
---@field curl string libcurl's name for the code
---@field message string
---@field retryable boolean
---@field sent boolean whether any of the request reached the server
---@field timeout boolean
---@field tls boolean a TLS verification failure
---@field too_large boolean the response's body or headers were over the limit
---@field cancelled boolean
---@field multi? string libcurl's multi handle failed, with this error
---@field status? integer the status, when one came before the failure

---What `on_retry` is told before each retry's wait.
---@class ratewise.RetryInfo
---@field method string
---@field url string without userinfo or query
---@field status? integer nil after a transport failure
---@field delay number seconds
---@field attempt integer the retry number, from 1
---@field max_retries integer
---@field source ratewise.DelaySource
---@field error? string the transport message

---What `on_event` sees: `type` says which step, and which other fields are set.
---@class ratewise.Event
---@field type "request"|"response"|"retry"|"circuit_open"|"budget_refused"|"error"
---@field method? string
---@field url? string
---@field status? integer
---@field error? string
---@field class? ratewise.Class
---@field attempt? integer
---@field attempts? integer
---@field throttled? boolean
---@field delay? number
---@field source? ratewise.DelaySource
---@field retry_in? number
---@field kind? ratewise.ErrorKind|string

---The options of `rw.backoff`.
---@class ratewise.BackoffOptions
---@field base? number seconds (default 1)
---@field max_delay? number seconds (default 60)
---@field jitter? ratewise.Jitter (default "full")
---@field random? fun(): number a number in [0, 1), for tests
---@field previous? number the last delay, for "decorrelated"

---The options of `rw.retry_delay`: `now` and the backoff's.
---@class ratewise.RetryDelayOptions: ratewise.BackoffOptions
---@field now? number epoch seconds to measure dates against when the response has no Date
