-- The built-in providers known by name and by the host of their API: what
-- fetch, rw.client and the decision ask of them (a helper, not a
-- provider: rw.providers.known is nil).
local format, find = string.format, string.find
local type, pairs, ipairs, require, error = type, pairs, ipairs, require, error

local known = {}

-- The built-in providers (lua/ratewise/providers/NAME.lua), in the order
-- errors list them.
local NAMES = { "github", "openai", "anthropic", "stripe", "ietf" }
local built_in = {}
for _, name in ipairs(NAMES) do built_in[name] = true end
local BUILT_IN = table.concat(NAMES, ", ")
known.BUILT_IN = BUILT_IN

-- The APIs whose dialect a built-in provider speaks, by origin (as
-- headers.origin writes it: scheme, host, port). A call to one of them
-- gets its provider unless it names a policy of its own (or false).
local provider_of_origin = {}
for host, name in pairs { ["api.openai.com"] = "openai", ["api.anthropic.com"] = "anthropic",
  ["api.github.com"] = "github", ["api.stripe.com"] = "stripe" } do
  provider_of_origin["https://" .. host .. ":443"] = name
  provider_of_origin["http://" .. host .. ":80"] = name
end
-- Azure OpenAI: https://RESOURCE.openai.azure.com (an origin always ends
-- in its port, so ".openai.azure.com:" ends the host).
local AZURE_OPENAI = ".openai.azure.com:"

--- p = known.provider(name, who, level): the built-in provider of that
-- name; raises "who: unknown provider" naming the built-in ones, at
-- `level` seen from the caller.
local function provider(name, who, level)
  if not built_in[name] then
    local shown = #name <= 40 and not name:find("%c") and name or (name:sub(1, 40):gsub("%c", "?") .. "...")
    error(format("%s: unknown provider '%s' (built in: %s)", who, shown, BUILT_IN), level + 1)
  end
  return require("ratewise.providers." .. name)
end
known.provider = provider

--- name | nil = known.provider_for(origin): the built-in provider of the
-- API at that origin (headers.origin's form), if ratewise knows it.
local function provider_for(origin)
  local name = provider_of_origin[origin]
  if name then return name end
  if origin and find(origin, AZURE_OPENAI, 1, true) and find(origin, "^https://") then return "openai" end
  return nil
end
known.provider_for = provider_for

--- p | nil = known.resolve(given, origin, who, level): the policy of a
-- call: given (a policy, a built-in provider's name, or false for none),
-- else the provider of the API at origin, else nil. Raises for an unknown
-- name at `level` seen from the caller.
function known.resolve(given, origin, who, level)
  if given == nil then
    local name = origin and provider_for(origin)
    return name and require("ratewise.providers." .. name) or nil
  end
  if given == false then return nil end
  if type(given) == "string" then return provider(given, who, level + 1) end
  return given
end

--- names | nil = known.replaying_providers(res, method): the built-in
-- providers whose `replayable` says the server did not act on the attempt
-- that got res (their hooks read headers and nothing else), for an error
-- that names the fix; nil when none does.
function known.replaying_providers(res, method)
  local names
  for _, name in ipairs(NAMES) do
    local hook = require("ratewise.providers." .. name).replayable
    if hook and hook(res, method) then
      names = names or {}
      names[#names + 1] = name
    end
  end
  return names
end

return known
