---@meta _

-- rw.client (docs/reference.md, "Clients: rw.client").

---The options of `rw.client`: its own, and defaults for every call's fetch
---options. An unknown option or provider name raises.
---@class ratewise.ClientOptions
---@field base_url string required; `http://` or `https://`; request paths are appended to it
---@field cross_origin? boolean let calls name absolute URLs on other origins
---@field headers? table<string, string|number> sent with every request, read at each request
---@field provider? ratewise.ProviderName|ratewise.Policy|ratewise.PolicySpec|false none: the provider of base_url's host; false: none at all
---@field limiter? ratewise.Limiter|false taken before every attempt of every request (none given: the client's own `rw.adaptive{dormant = true}`; false: none)
---@field routes? table<string, ratewise.Limiter>|{[1]: string, [2]: ratewise.Limiter}[] per-endpoint limiters, by path prefix or Lua pattern
---@field concurrency? integer the most requests of this client in flight at once
---@field circuit? true|ratewise.CircuitOptions|ratewise.Circuit
---@field budget? true|ratewise.RetryBudgetOptions|ratewise.RetryBudget
---@field dedupe? boolean identical GET, HEAD and OPTIONS requests in flight share one transfer (default true)
---@field cache? ratewise.CacheOptions keeps successful GET/HEAD/OPTIONS responses
---@field on_event? fun(event: ratewise.Event) every event of every request
---@field secret_headers? string[] more secret header names for every request
---@field timeout? number
---@field max_retries? integer
---@field max_elapsed? number
---@field max_delay? number
---@field base? number
---@field jitter? ratewise.Jitter
---@field retry_non_idempotent? boolean
---@field on_retry? fun(info: ratewise.RetryInfo)|false
---@field delay? fun(res: ratewise.Response|nil, attempt: integer, transport_err: ratewise.TransportError|nil): number|nil
---@field sleep? fun(seconds: number)
---@field follow_redirects? boolean
---@field max_body? number
---@field verify_tls? boolean
---@field retry_after? ratewise.RetryAfterMode
---@field retry_after_max? number
---@field hint_jitter? number
---@field ca_file? string
---@field ca_path? string
---@field client_cert? string
---@field client_key? string
---@field client_key_password? string
---@field pinned_public_key? string
---@field tls_min_version? "1.2"|"1.3"
---@field proxy? string
---@field proxy_ca_file? string
---@field decompress? boolean
---@field connect_timeout? number
---@field first_byte_timeout? number
---@field idle_timeout? number

---@class ratewise.CacheOptions
---@field ttl number seconds a response is kept
---@field max_entries? integer (default 1000)

---A call's options: every fetch option (overriding the client's), and `cross_origin`.
---@class ratewise.RequestOptions: ratewise.FetchOptions
---@field cross_origin? boolean allows an absolute URL on another origin

---One API's client (`rw.client{...}`).
---@class ratewise.Client
local Client = {}

---@param method string
---@param path string a path starting with `/`, or an absolute URL
---@param opts? ratewise.RequestOptions
---@return ratewise.Response|nil res
---@return ratewise.Error|nil err
function Client:request(method, path, opts) end

---@param path string
---@param opts? ratewise.RequestOptions
---@return ratewise.Response|nil res
---@return ratewise.Error|nil err
function Client:get(path, opts) end

---@param path string
---@param opts? ratewise.RequestOptions
---@return ratewise.Response|nil res
---@return ratewise.Error|nil err
function Client:post(path, opts) end

---@param path string
---@param opts? ratewise.RequestOptions
---@return ratewise.Response|nil res
---@return ratewise.Error|nil err
function Client:put(path, opts) end

---@param path string
---@param opts? ratewise.RequestOptions
---@return ratewise.Response|nil res
---@return ratewise.Error|nil err
function Client:patch(path, opts) end

---@param path string
---@param opts? ratewise.RequestOptions
---@return ratewise.Response|nil res
---@return ratewise.Error|nil err
function Client:delete(path, opts) end

---@param path string
---@param opts? ratewise.RequestOptions
---@return ratewise.Response|nil res
---@return ratewise.Error|nil err
function Client:head(path, opts) end

---The options of `client:pages`: a call's, and `max_pages`.
---@class ratewise.PagesOptions: ratewise.RequestOptions
---@field max_pages? integer the most pages fetched (default: every one)

---An iterator over the pages `Link: <...>; rel="next"` names, each a GET through the client; a failed
---page (or a link it cannot follow, kind `"pagination"`) comes once as `false, err`, then it ends.
---@param path string a path starting with `/`, or an absolute URL
---@param opts? ratewise.PagesOptions
---@return fun(): (ratewise.Response|false|nil), ratewise.Error|nil
function Client:pages(path, opts) end

---Counters since the client was made.
---@return ratewise.ClientStats
function Client:stats() end

---@class ratewise.ClientStats
---@field requests integer
---@field attempts integer
---@field successes integer
---@field failures integer
---@field errors table<string, integer> by kind
---@field statuses table<string, integer> attempts by status, or "network"
---@field retries integer
---@field retries_by_status table<string, integer>
---@field retries_by_source table<string, integer>
---@field waits integer
---@field waited number seconds
---@field waits_by_source table<string, number> seconds
---@field budget_refusals integer
---@field circuit_refusals integer
---@field deduped integer
---@field cache_hits integer
---@field in_flight integer
---@field circuit? table<string, ratewise.CircuitState> the state of each origin
---@field budget? ratewise.RetryBudgetStats
