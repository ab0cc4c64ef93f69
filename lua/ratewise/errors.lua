-- The errors ratewise answers with (nil, err): tables with a kind and a
-- message (and what else the kind tells), printed as "ratewise: kind: message";
-- and how an error for misuse shows the value it got (errors.shown).
local format, sub = string.format, string.sub
local type, tostring, error = type, tostring, error

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

-- The longest string an error shows whole.
local MAX_SHOWN = 40

--- text = errors.shown(v): what a misuse error says it got. A number as
-- itself; a string quoted and named, so that "8" is not read as the
-- number 8 (cut short past MAX_SHOWN bytes); true, false and nil as
-- themselves; anything else by its type alone (a table's address tells
-- nothing). One function, so that every checker says it the same way.
function errors.shown(v)
  local t = type(v)
  if t == "string" then
    if #v > MAX_SHOWN then return format("string %q... (%d bytes)", sub(v, 1, MAX_SHOWN), #v) end
    return format("string %q", v)
  end
  if t == "number" then return v ~= v and "nan" or tostring(v) end
  if t == "boolean" or t == "nil" then return tostring(v) end
  return t
end
local shown = errors.shown

--- errors.bad_option(who, name, expected, v, level [, secret]): raises
-- "who: option 'name' must be expected (got ...)"; level as error's, seen
-- from bad_option's caller. A secret option (a password, a proxy URL) is
-- shown by its type only, whatever it is.
function errors.bad_option(who, name, expected, v, level, secret)
  error(format("%s: option '%s' must be %s (got %s)", who, name, expected, secret and type(v) or shown(v)),
    level > 0 and level + 1 or 0)
end

return errors
