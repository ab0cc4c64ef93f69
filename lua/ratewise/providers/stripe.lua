-- Stripe's API (docs.stripe.com, "Idempotent requests", "Error handling";
-- the official SDKs' retry rules).
--   Stripe-Should-Retry: true/false decides for any non-2xx status
--   409 is retryable: an idempotency key in use by a concurrent request, or
--   a lock timeout on the object
--   prepare: every POST gets a generated Idempotency-Key (the same on each
--   attempt) unless the caller gave one, as an option or as a header; this is
--   also what makes its retries safe
-- Waits are the built-in ones: Stripe sends no Retry-After to speak of.
local policy = require "ratewise.policy"
local common = require "ratewise.providers.common"

local type, pairs, lower, upper = type, pairs, string.lower, string.upper

local function classify(res)
  local class = common.override(res, "stripe-should-retry")
  if class then return class end
  if type(res) == "table" and res.status == 409 then return "retryable" end
  return nil
end

local function has_key_header(h)
  if type(h) ~= "table" then return false end
  for name in pairs(h) do
    if type(name) == "string" and lower(name) == "idempotency-key" then return true end
  end
  return false
end

local function prepare(request)
  if type(request) ~= "table" or type(request.method) ~= "string" then return end
  if upper(request.method) ~= "POST" or request.idempotency_key ~= nil then return end
  if has_key_header(request.headers) then return end
  request.idempotency_key = true
end

return policy.new {
  name = "stripe",
  classify = classify,
  prepare = prepare,
}
