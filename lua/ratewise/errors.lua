-- The errors ratewise answers with (nil, err): tables with a kind and a
-- message (and what else the kind tells), printed as "ratewise: kind: message".
local errors = {}

local mt = {}
mt.__index = mt
mt.__tostring = function(e)
  return "ratewise: " .. e.kind .. ": " .. e.message
end
errors.mt = mt

--- err = errors.new(kind, message [, fields]): fields (a table) becomes the
-- error itself.
function errors.new(kind, message, fields)
  local e = fields or {}
  e.kind, e.message = kind, message
  return setmetatable(e, mt)
end

return errors
