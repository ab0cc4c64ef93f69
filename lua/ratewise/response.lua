-- What a response can do besides carry its fields (status, headers, body):
-- the methods of every response fetch returns, res:json() and, for a
-- response read as it arrives (the stream option), res:chunks() and
-- res:events().
local json = require "ratewise.json"

local response = {}

local methods = {}
response.mt = { __index = methods }

--- value | nil, err = res:json(): the body decoded as JSON, integers kept
-- as integers. A body that is not JSON answers nil and why.
function methods:json()
  local body = self.body
  if type(body) ~= "string" then return nil, "the response has no body to decode" end
  local value, err = json.decode(body)
  if value == nil then return nil, "response body is " .. err end
  return value
end

--- res = response.new(res): gives a response table its methods.
function response.new(res)
  return setmetatable(res, response.mt)
end

return response
