---@meta _

-- Policies and the built-in providers (docs/reference.md, "Policies";
-- docs/providers.md).

---What `prepare` may edit before the first attempt.
---@class ratewise.PreparedRequest
---@field method string upper case
---@field url string
---@field body? string
---@field headers table<string, string|number> a copy of the caller's table
---@field idempotency_key? true|string

---The hooks of a policy; each is optional, and one that answers nil leaves
---the decision to the built-in behaviour. Unknown fields raise.
---@class ratewise.PolicySpec
---@field name? string
---@field classify? fun(res: ratewise.Response): ratewise.Class|nil
---@field delay? fun(res: ratewise.Response, attempt: integer): number|nil
---@field observe? fun(res: ratewise.Response, limiter: ratewise.Limiter|nil)
---@field prepare? fun(request: ratewise.PreparedRequest)
---@field replayable? fun(res: ratewise.Response|nil, method: string): boolean|nil
---@field cost? fun(request: ratewise.CostRequest): ratewise.LimitCost|nil what the API will count of the request, per limit
---@field settle? fun(res: ratewise.Response, taken: number|ratewise.LimitCost): ratewise.LimitCost|nil what it really cost, once the answer is whole
---@field stream_usage? fun(event: ratewise.ServerEvent, usage: table|nil, taken: ratewise.LimitCost): table|nil a stream's usage so far (fields named as limits), from each event read; settled to when the stream ends, breaks off or is closed

---What a `cost` hook (a policy's, or the `cost` option as a function) is asked.
---@class ratewise.CostRequest
---@field method string
---@field url string
---@field headers? table<string, string|number>
---@field body? string
---@field json? any the `json` option, else the body decoded when it is JSON

---A built-in provider's name, as the `policy` option and a client's `provider` take it.
---@alias ratewise.ProviderName "github"|"openai"|"anthropic"|"stripe"|"ietf"

---A policy made by `rw.policy{...}`, `rw.policy.chain(...)` or a provider.
---@class ratewise.Policy: ratewise.PolicySpec

---`rw.policy`: called with hooks it makes a policy.
---@class ratewise.PolicyModule
---@overload fun(spec: ratewise.PolicySpec): ratewise.Policy
local PolicyModule = {}

---@param spec ratewise.PolicySpec
---@return ratewise.Policy
function PolicyModule.new(spec) end

---One policy made of several (nil arguments are skipped): for classify and
---delay the first non-nil answer wins; observe and prepare run for each.
---@param ... ratewise.Policy|ratewise.PolicySpec|nil
---@return ratewise.Policy
function PolicyModule.chain(...) end

---Whether `v` is a policy.
---@param v any
---@return boolean
function PolicyModule.is_policy(v) end

---`rw.providers.NAME`: the built-in policies (docs/providers.md); an unknown name gives nil.
---@class ratewise.Providers
---@field github ratewise.Policy GitHub's REST API
---@field openai ratewise.Policy OpenAI's API
---@field anthropic ratewise.Policy Anthropic's API
---@field stripe ratewise.Policy Stripe's API
---@field ietf ratewise.Policy the IETF RateLimit header fields
---@field [string] ratewise.Policy|nil
