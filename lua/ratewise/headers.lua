-- HTTP header tables: case-insensitive lookup, request header validation,
-- and keeping secrets out of anything that is printed.
local core = require "ratewise.core"
local json = require "ratewise.json"

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

-- RFC 9110 token characters: field names, methods.
local function is_token(s)
  return s ~= "" and not find(s, "[^%w!#$%%&'*+%-.^_`|~]")
end
headers.is_token = is_token

-- Headers whose values are credentials (Authorization, Cookie, x-api-key,
-- api-key, x-goog-api-key...: the C core's list, which also keeps them from
-- another origin after a redirect). They are never printed. Callers extend
-- the list per call and per client (the `secret_headers` option) for an
-- API's own names.
local secret_names = {}
for _, name in ipairs(core.secret_header_names) do secret_names[name] = true end
headers.secret_names = secret_names

function headers.is_secret(name, extra)
  local lname = lower(name)
  return secret_names[lname] == true or (extra ~= nil and extra[lname] == true)
end

--- set = headers.secret_set(list, what [, level]): a caller's
-- `secret_headers` option (an array of field names) as a set of lower-case
-- names. Raises naming `what` at `level` (default: the caller's caller).
function headers.secret_set(list, what, level)
  level = level or 3
  if type(list) ~= "table" then
    error(format("%s: option 'secret_headers' must be an array of header names (got %s)", what, type(list)), level)
  end
  local set = {}
  for k, name in pairs(list) do
    if type(k) ~= "number" or type(name) ~= "string" or not is_token(name) then
      error(format("%s: option 'secret_headers' must be an array of header names (found %s)", what,
        type(name) == "string" and format("%q", name) or tostring(name)), level)
    end
    set[lower(name)] = true
  end
  return set
end

-- The names given when no headers are: one read-only set for every call.
local no_names = setmetatable({}, { __newindex = function() error("read-only", 2) end })
headers.no_names = no_names

-- Fields the transport owns. A caller's Content-Length or Transfer-Encoding
-- would override the real framing: the body would be read as a second,
-- smuggled request, and every later answer on that pooled connection would
-- go to the wrong caller.
-- The names are the C core's (which refuses them too); the reasons are for
-- the caller.
local why_owned = {
  ["content-length"] = "libcurl sets it from the body",
  ["transfer-encoding"] = "libcurl frames the body itself",
  host = "it comes from the URL",
  expect = "libcurl decides whether to wait for 100 Continue",
}
local owned_by_transport = {}
for _, name in ipairs(core.transport_header_names) do
  owned_by_transport[name] = why_owned[name] or "libcurl manages the connection"
end

-- libcurl refuses a request whose line and headers exceed 1 MiB (and servers
-- answer 431 long before that): refused here, naming the request, at the
-- C core's cap.
local MAX_REQUEST_HEADER_BYTES = core.max_request_header_bytes

-- Turns the caller's header table into the lines libcurl sends. Raises a
-- clear error (that never repeats a value) for bad input. Returns the lines,
-- the values given by lower-case name, and the secret values seen (or nil).
-- extra_secrets: a set of more secret names (the `secret_headers` option);
-- level: error's, for the errors it raises (3: the caller of its caller).
function headers.request_lines(t, extra_secrets, level)
  level = level or 3
  local lines, seen, secrets = {}, {}, nil
  if t == nil then return lines, no_names end
  if type(t) ~= "table" then
    error(format("fetch: option 'headers' must be a table (got %s)", type(t)), level)
  end
  local bytes = 0
  for name, value in pairs(t) do
    if type(name) ~= "string" or not is_token(name) then
      -- not repeated: a pasted "Authorization Bearer ..." holds a credential
      error(type(name) == "string"
        and "fetch: a header name is not a valid HTTP field name (not shown: it may hold a credential)"
        or format("fetch: a header name is a %s, not a string", type(name)), level)
    end
    local tv = type(value)
    if tv == "number" then
      value = tostring(value)
    elseif tv ~= "string" then
      error(format("fetch: header '%s' must have a string value (got %s)", name, tv), level)
    end
    -- RFC 9110 5.5: no control characters but HTAB; CR and LF would end the
    -- field and start another.
    if find(value, "[%z\1-\8\10-\31\127]") then
      error(format("fetch: header '%s' has a value containing a control character (CR, LF, NUL or another)", name),
        level)
    end
    local lname = lower(name)
    if owned_by_transport[lname] then
      error(format("fetch: header '%s' cannot be set by the caller: %s", name, owned_by_transport[lname]), level)
    end
    if seen[lname] then
      error(format("fetch: header '%s' is given twice (names are case-insensitive)", name), level)
    end
    seen[lname] = value
    if secret_names[lname] or (extra_secrets and extra_secrets[lname]) then
      secrets = secrets or {}
      secrets[#secrets + 1] = value
    end
    -- libcurl sends "Name;" as a header with an empty value; "Name:" would
    -- remove the header instead.
    local line = value == "" and (name .. ";") or (name .. ": " .. value)
    bytes = bytes + #line + 2
    if bytes > MAX_REQUEST_HEADER_BYTES then
      error(format("fetch: the request headers are too large (over %d KiB; servers commonly refuse "
        .. "more than 8 to 16 KiB)", math.floor(MAX_REQUEST_HEADER_BYTES / 1024)), level)
    end
    lines[#lines + 1] = line
  end
  return lines, seen, secrets
end

-- Where the userinfo of a URL ends: the index in `rest` (what follows
-- "://") of the "@" ending it, or nil.
--
-- strict: as RFC 3986 and libcurl read it, the authority ending at the
-- first "/", "?" or "#". This is where a request goes, so it is what an
-- origin is made of: "https://evil.example:443/x@api.example.com/" goes to
-- evil.example, whatever follows.
--
-- Otherwise, for what is printed: a password may hold "/", "?" or "#"
-- (base64 tokens hold "/"), and "user:ab/cd@host" would then print its
-- password as a host, a port and a path. When the strict authority has a
-- ":" and an "@" comes later, the userinfo runs to the last "@" before the
-- "/", "?" or "#" that follows the first "@" -- unless that "@" starts a
-- path segment ("/@scope/pkg", "/users/@me"), which a password would not
-- end with. This hides more than it must in a URL with a port and an "@"
-- in its path or query ("http://h:8080/q?mail=a@b" prints as "http://b"):
-- a garbled line, never a printed password.
local function userinfo_end(rest, strict)
  local authority_end = find(rest, "[/?#]") or (#rest + 1)
  local authority = sub(rest, 1, authority_end - 1)
  local at = authority:match("^.*()@")
  if at or strict then return at end
  if authority_end > #rest or not find(authority, ":", 1, true) then return nil end
  local first_at = find(rest, "@", authority_end, true)
  if not first_at or sub(rest, first_at - 1, first_at - 1) == "/" then return nil end
  local stop = find(rest, "[/?#]", first_at) or (#rest + 1)
  return sub(rest, 1, stop - 1):match("^.*()@")
end

-- scheme://host[:port]/path of a URL: no userinfo, no query, no fragment,
-- so that a printed URL carries neither credentials nor API keys.
function headers.redact_url(url)
  if not (find(url, "@", 1, true) or find(url, "?", 1, true) or find(url, "#", 1, true)) then
    return url -- nothing to take out
  end
  local scheme, rest = string.match(url, "^(%a[%w+.-]*://)(.*)$")
  if not scheme then return "[url]" end
  local at = userinfo_end(rest)
  if at then rest = sub(rest, at + 1) end
  local authority_end = find(rest, "[/?#]") or (#rest + 1)
  local path = sub(rest, authority_end):gsub("[?#].*$", "")
  return scheme .. sub(rest, 1, authority_end - 1) .. path
end

-- scheme://host:port of a URL, lower-cased, with the default port filled in:
-- what a circuit breaker keys its state on.
function headers.origin(url)
  local scheme, rest = string.match(url, "^(%a[%w+.-]*)://(.*)$")
  if not scheme then return nil end
  local at = userinfo_end(rest, true)
  if at then rest = sub(rest, at + 1) end
  scheme = lower(scheme)
  local authority = lower(string.match(rest, "^[^/?#]*"))
  if not authority:find(":%d+$") and not authority:find("^%[.*%]:%d+$") then
    authority = authority .. (scheme == "https" and ":443" or ":80")
  end
  return scheme .. "://" .. authority
end

--- s = headers.percent_decode(s): %XX sequences as the bytes they stand for.
function headers.percent_decode(s)
  return (gsub(s, "%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- The user and password of a URL, for scrubbing from messages.
function headers.url_secrets(url, secrets)
  local rest = string.match(url, "^%a[%w+.-]*://(.*)$")
  local at = rest and userinfo_end(rest)
  if at then
    local userinfo = sub(rest, 1, at - 1)
    secrets[#secrets + 1] = userinfo
    for part in string.gmatch(userinfo, "[^:]+") do
      secrets[#secrets + 1] = part
      secrets[#secrets + 1] = headers.percent_decode(part)
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

-- The variables libcurl takes a proxy from, and HTTP_PROXY, which it
-- ignores but which may hold a password all the same.
local PROXY_VARIABLES = { "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY" }

-- The user, the password and both together of a userinfo, as written and
-- percent-decoded.
local function userinfo_secrets(userinfo)
  local secrets = { userinfo }
  local user, password = string.match(userinfo, "^([^:]*):(.*)$")
  for _, part in ipairs { user or userinfo, password } do
    secrets[#secrets + 1] = part
    secrets[#secrets + 1] = headers.percent_decode(part)
  end
  return secrets
end

-- libcurl quotes a proxy URL it cannot read as it was given ("Unsupported
-- proxy syntax in '...'"), a password holding "@", "#", "/" or a space
-- and all, cut at its error buffer's end when long (a cut past three
-- bytes of the userinfo is taken for one, as scrub takes no shorter
-- secret). The userinfo of a proxy runs to its last "@" (a proxy URL has
-- no path to hold one).
local function scrub_proxy(message, proxy)
  if type(proxy) ~= "string" then return message end
  local at = string.match(proxy, "^.*()@")
  if not at then return message end
  local _, scheme_end = find(proxy, "^%a[%w+.-]*://")
  scheme_end = scheme_end or 0
  local head, redacted = sub(proxy, 1, scheme_end + 1), sub(proxy, 1, scheme_end) .. "[redacted]"
  local from = 1
  while true do
    local i = find(message, head, from, true)
    if not i then break end
    local quoted = sub(message, i, i + #proxy - 1)
    from = i + 1
    if quoted == proxy then
      message = sub(message, 1, i - 1) .. redacted .. sub(proxy, at) .. sub(message, i + #proxy)
      from = i + #redacted
    elseif #quoted >= scheme_end + 3 and quoted == sub(proxy, 1, #quoted) then -- ends in it, cut short
      message = sub(message, 1, i - 1) .. redacted
    end
  end
  return headers.scrub(message, userinfo_secrets(sub(proxy, scheme_end + 1, at - 1)))
end

--- message = headers.scrub_proxies(message, proxy): a transport error's
-- message without the credentials of the proxy option (proxy, or nil) or
-- of a proxy variable.
function headers.scrub_proxies(message, proxy)
  message = scrub_proxy(message, proxy)
  for i = 1, #PROXY_VARIABLES do message = scrub_proxy(message, os.getenv(PROXY_VARIABLES[i])) end
  return message
end

-- Query parameters: unreserved bytes (RFC 3986 2.3) stay, the rest are
-- percent-encoded, spaces too (as %20, which every server reads).
local function url_encode(s)
  return (gsub(s, "[^%w%-%._~]", function(ch) return format("%%%02X", ch:byte()) end))
end

local function query_value(v, who, key, level)
  local t = type(v)
  if t == "string" then return v end
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      error(format("%s: query parameter '%s' is not a finite number (%s)", who, key, tostring(v)), level)
    end
    -- all its digits (tostring keeps 14 where numbers are doubles)
    return json.number_text(v)
  end
  error(format("%s: query parameter '%s' must be a string, a number, a boolean or an array of strings and "
    .. "numbers (got %s)", who, key, t), level)
end

--- url = headers.with_query(url, query, who [, level]): the URL with the
-- parameters of `query` appended (after its own, if it has any), names in
-- sorted order so that the same table always makes the same URL. A value
-- may be a string or a number, true (the name alone), false (left out) or
-- an array of strings and numbers (the name repeated for each). Raises,
-- naming `who`, for anything else.
function headers.with_query(url, query, who, level)
  level = (level or 1) + 1
  if type(query) ~= "table" then
    error(format("%s: option 'query' must be a table (got %s)", who, type(query)), level)
  end
  local names = {}
  for k in pairs(query) do
    if type(k) ~= "string" then
      error(format("%s: option 'query' has a key that is not a string (%s)", who, tostring(k)), level)
    end
    names[#names + 1] = k
  end
  table.sort(names)
  local parts = {}
  for _, k in ipairs(names) do
    local v, name = query[k], url_encode(k)
    if type(v) == "table" then
      local n = 0
      for _ in pairs(v) do n = n + 1 end
      if n ~= #v then
        error(format("%s: query parameter '%s' must be an array (its keys are not 1..n)", who, k), level)
      end
      for i = 1, n do parts[#parts + 1] = name .. "=" .. url_encode(query_value(v[i], who, k, level + 1)) end
    elseif v == true then
      parts[#parts + 1] = name
    elseif v ~= false then
      parts[#parts + 1] = name .. "=" .. url_encode(query_value(v, who, k, level + 1))
    end
  end
  if #parts == 0 then return url end
  local fragment = find(url, "#", 1, true)
  local base, tail = url, ""
  if fragment then base, tail = sub(url, 1, fragment - 1), sub(url, fragment) end
  local sep = find(base, "?", 1, true) and (find(base, "[?&]$") and "" or "&") or "?"
  return base .. sep .. table.concat(parts, "&") .. tail
end

return headers
