-- HTTP header tables: case-insensitive lookup, request header validation,
-- and keeping secrets out of anything that is printed.
local lower, find, gsub, sub = string.lower, string.find, string.gsub, string.sub
local format = string.format

local headers = {}

-- Response headers are stored under lower-case names by the C core; this
-- makes res.headers["Retry-After"] find them too.
local response_mt = {
  __index = function(t, name)
    if type(name) == "string" then
      return rawget(t, lower(name))
    end
  end,
}

function headers.wrap(t)
  return setmetatable(t, response_mt)
end

--- values = headers.values(res, name): every value of a response header
-- field, one entry per field line, in the order they came (Set-Cookie lines
-- cannot be told apart once joined with ", "). An empty array when absent.
-- The engine keeps res.header_lists[name] only for names that came more
-- than once; the others are res.headers[name] alone.
function headers.values(res, name)
  if type(res) ~= "table" or type(res.headers) ~= "table" then
    error(format("header_values: expected a response (got %s)", type(res)), 2)
  end
  if type(name) ~= "string" then
    error(format("header_values: name must be a string (got %s)", type(name)), 2)
  end
  local lname = lower(name)
  local lists = res.header_lists
  local list = type(lists) == "table" and lists[lname]
  local out = {}
  if list then
    for i = 1, #list do out[i] = list[i] end
  else
    out[1] = rawget(res.headers, lname)
  end
  return out
end

-- Looks a header up by name, whatever the case of the table's keys.
function headers.get(t, name)
  local v = t[name]
  if v ~= nil then return v end
  local lname = lower(name)
  v = t[lname]
  if v ~= nil then return v end
  for k, value in pairs(t) do
    if type(k) == "string" and lower(k) == lname then
      return value
    end
  end
  return nil
end

-- RFC 9110 token characters.
local function is_token(s)
  return s ~= "" and not find(s, "[^%w!#$%%&'*+%-.^_`|~]")
end

local secret_names = {
  authorization = true,
  ["proxy-authorization"] = true,
  cookie = true,
}

function headers.is_secret(name)
  return secret_names[lower(name)] == true
end

-- The names given when no headers are: one read-only set for every call.
local no_names = setmetatable({}, { __newindex = function() error("read-only", 2) end })
headers.no_names = no_names

-- Turns the caller's header table into the lines libcurl sends. Raises a
-- clear error (that never repeats a value) for bad input. Returns the lines,
-- a set of the lower-case names given, and the secret values seen (or nil).
function headers.request_lines(t)
  local lines, seen, secrets = {}, {}, nil
  if t == nil then return lines, no_names end
  if type(t) ~= "table" then
    error(format("fetch: option 'headers' must be a table (got %s)", type(t)), 3)
  end
  for name, value in pairs(t) do
    if type(name) ~= "string" or not is_token(name) then
      error(format("fetch: header name %q is not a valid HTTP field name", tostring(name)), 3)
    end
    local tv = type(value)
    if tv == "number" then
      value = tostring(value)
    elseif tv ~= "string" then
      error(format("fetch: header '%s' must have a string value (got %s)", name, tv), 3)
    end
    if find(value, "[\r\n%z]") then
      error(format("fetch: header '%s' has a value containing CR, LF or NUL", name), 3)
    end
    local lname = lower(name)
    if seen[lname] then
      error(format("fetch: header '%s' is given twice (names are case-insensitive)", name), 3)
    end
    seen[lname] = true
    if secret_names[lname] then
      secrets = secrets or {}
      secrets[#secrets + 1] = value
    end
    -- libcurl sends "Name;" as a header with an empty value; "Name:" would
    -- remove the header instead.
    lines[#lines + 1] = value == "" and (name .. ";") or (name .. ": " .. value)
  end
  return lines, seen, secrets
end

-- scheme://host[:port]/path of a URL: no userinfo, no query, no fragment,
-- so that a printed URL carries neither credentials nor API keys.
function headers.redact_url(url)
  if not (find(url, "@", 1, true) or find(url, "?", 1, true) or find(url, "#", 1, true)) then
    return url -- nothing to take out
  end
  local scheme, rest = string.match(url, "^(%a[%w+.-]*://)(.*)$")
  if not scheme then return "[url]" end
  local authority_end = find(rest, "[/?#]") or (#rest + 1)
  local authority = sub(rest, 1, authority_end - 1)
  local at = authority:match("^.*()@")
  if at then authority = sub(authority, at + 1) end
  local path = sub(rest, authority_end):gsub("[?#].*$", "")
  return scheme .. authority .. path
end

-- scheme://host:port of a URL, lower-cased, with the default port filled in:
-- what a circuit breaker keys its state on.
function headers.origin(url)
  local scheme, authority = string.match(url, "^(%a[%w+.-]*)://([^/?#]*)")
  if not scheme then return nil end
  scheme = lower(scheme)
  authority = lower(authority:gsub("^.*@", ""))
  if not authority:find(":%d+$") and not authority:find("^%[.*%]:%d+$") then
    authority = authority .. (scheme == "https" and ":443" or ":80")
  end
  return scheme .. "://" .. authority
end

-- The user and password of a URL, for scrubbing from messages.
function headers.url_secrets(url, secrets)
  local authority = string.match(url, "^%a[%w+.-]*://([^/?#]*)")
  local userinfo = authority and authority:match("^(.*)@")
  if userinfo then
    secrets[#secrets + 1] = userinfo
    for part in string.gmatch(userinfo, "[^:]+") do
      secrets[#secrets + 1] = part
      local decoded = gsub(part, "%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
      secrets[#secrets + 1] = decoded
    end
  end
  return secrets
end

-- Replaces every secret value in a message. Values shorter than three bytes
-- are left alone: scrubbing them would garble the text and hide nothing.
function headers.scrub(message, secrets)
  for _, secret in ipairs(secrets) do
    if #secret >= 3 then
      local from = 1
      while true do
        local i, j = find(message, secret, from, true)
        if not i then break end
        message = sub(message, 1, i - 1) .. "[redacted]" .. sub(message, j + 1)
        from = i + 10
      end
    end
  end
  return message
end

return headers
