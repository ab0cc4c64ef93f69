-- What the provider policies share: reading a response's headers without
-- trusting their shape, the server's clock, and feeding a limiter.
-- Every reader answers nil for a header that is absent or does not parse,
-- so that a hook built on them falls through to the built-in behaviour.
local core = require "ratewise.core"
local headers = require "ratewise.headers"
local retry = require "ratewise.retry"

local type, pcall, tostring = type, pcall, tostring
local lower, match, gsub = string.lower, string.match, string.gsub

local common = {}

--- value | nil = common.header(res, name): the header as a string, whatever
-- the case of its name; nil when absent or when res is not a response.
function common.header(res, name)
  local h = type(res) == "table" and res.headers
  if type(h) ~= "table" then return nil end
  local v = headers.get(h, name)
  if type(v) == "number" then return tostring(v) end -- a hand-made response
  if type(v) ~= "string" then return nil end
  return v
end

--- n | nil = common.number(res, name): a non-negative decimal ("0", "4999", "1.5").
function common.number(res, name)
  local v = common.header(res, name)
  return v and core.parse_seconds(v) or nil
end

--- true | false | nil = common.flag(res, name): "true" or "false", any case.
function common.flag(res, name)
  local v = common.header(res, name)
  if not v then return nil end
  v = lower(match(v, "^%s*(.-)%s*$"))
  if v == "true" then return true end
  if v == "false" then return false end
  return nil
end

--- epoch = common.server_now(res): the server's clock when the response has
-- a Date header (so a local clock that runs ahead cannot cut a wait short,
-- as in retry.lua), else the local wall clock.
function common.server_now(res)
  local h = type(res) == "table" and res.headers
  if type(h) ~= "table" then return core.time() end
  return retry.server_now(h)
end

--- seconds = common.until_epoch(res, epoch): from the server's now to epoch;
-- 0 for a time already past.
function common.until_epoch(res, epoch)
  local left = epoch - common.server_now(res)
  return left > 0 and left or 0
end

--- seconds | nil = common.retry_after(res): Retry-After as seconds or an
-- HTTP-date (against the server's clock); a repeated field gives its longest wait.
function common.retry_after(res)
  local v = common.header(res, "retry-after")
  if not v then return nil end
  return (retry.hint({ ["retry-after"] = v }, common.server_now(res)))
end

--- seconds | nil = common.reset_at(res, name): an epoch-seconds header
-- ("1735732830") as seconds from the server's now; a number below 1e9 (before
-- 2001: "10", as @fastify/rate-limit sends it) is seconds from now.
function common.reset_at(res, name)
  local value = common.number(res, name)
  return value and retry.reset_in(value, common.server_now(res)) or nil
end

--- seconds | nil = common.reset_rfc3339(res, name): an RFC 3339 header as
-- seconds from the server's now.
function common.reset_rfc3339(res, name)
  local v = common.header(res, name)
  local epoch = v and core.parse_rfc3339(v)
  return epoch and common.until_epoch(res, epoch) or nil
end

--- seconds | nil = common.duration(res, name): a Go duration header ("6m0s").
function common.duration(res, name)
  local v = common.header(res, name)
  return v and core.parse_duration(v) or nil
end

--- class | nil = common.override(res, name): a "should retry" header
-- (x-should-retry, Stripe-Should-Retry) decides for a response that is not
-- a 2xx: true -> "retryable", false -> "terminal".
function common.override(res, name)
  local status = type(res) == "table" and res.status
  if type(status) ~= "number" or (status >= 200 and status <= 299) then return nil end
  local flag = common.flag(res, name)
  if flag == nil then return nil end
  return flag and "retryable" or "terminal"
end

--- true | nil = common.not_acted_on(res, flag_header [, also]): the failed
-- attempt was refused before the server acted on it: a 429 (the request
-- was not processed), a 408 (the server gave up waiting for the request
-- before it had it whole: RFC 9110 15.5.9), a status of the set `also`, or
-- a "should retry: true" header (the server says a retry is safe). Then even
-- a POST may be sent again. A 5xx is not: the server may have run (and
-- billed) the request before it failed, unless it says should retry.
function common.not_acted_on(res, name, also)
  if type(res) ~= "table" then return nil end
  local flag = name and common.flag(res, name)
  if flag ~= nil then return flag or nil end -- the server's word decides
  local status = res.status
  if status == 429 or status == 408 or (also and also[status]) then return true end
  return nil
end

local function sync_method(limiter)
  local t = type(limiter)
  if t ~= "table" and t ~= "userdata" then return nil end
  -- A limiter may be any object; an __index that raises means "no sync".
  local ok, fn = pcall(function() return limiter.sync end)
  if ok and type(fn) == "function" then return fn end
  return nil
end

--- common.sync(limiter, remaining, reset_in [, limit [, window]]): tells a
-- limiter that has a sync method what the server says is left, and the
-- limit it states (limit requests per window seconds, when it says); anything
-- else is left alone. reset_in and window may be nil (unknown): a limiter
-- may then reckon the window from the resets it sees (rw.adaptive). An
-- error raised by sync itself is the limiter's and is not hidden.
function common.sync(limiter, remaining, reset_in, limit, window)
  if remaining == nil then return end
  local sync = sync_method(limiter)
  if not sync then return end
  if limit ~= nil and limit < 1 then limit, window = nil, nil end
  if window ~= nil and window <= 0 then window = nil end
  if limit ~= nil then
    sync(limiter, remaining, reset_in, limit, window)
  elseif reset_in == nil then
    sync(limiter, remaining)
  else
    sync(limiter, remaining, reset_in)
  end
end

--- synced = common.sync_limit(limiter, name, remaining, reset_in [, limit]):
-- tells a limiter with named limits (rw.limiters) what the server says is
-- left of one of them ("tokens", "output_tokens"); any other limiter, or a
-- composite without that limit, is left alone.
function common.sync_limit(limiter, name, remaining, reset_in, limit)
  if remaining == nil then return false end
  local t = type(limiter)
  if t ~= "table" and t ~= "userdata" then return false end
  local ok, fn = pcall(function() return limiter.sync_limit end)
  if not (ok and type(fn) == "function") then return false end
  if limit ~= nil and limit < 1 then limit = nil end
  return fn(limiter, name, remaining, reset_in, limit)
end

--- chars = common.utf8_chars(s): the characters of UTF-8 text (its bytes
-- but continuation bytes), as the providers' rule of thumb of 4 characters
-- a token counts them.
local function utf8_chars(s)
  local _, chars = gsub(s, "[^\128-\191]", "")
  return chars
end
common.utf8_chars = utf8_chars

-- The characters of a message's content: a string, or an array of parts
-- whose text counts (images and tool calls are not estimated).
local function content_chars(content)
  if type(content) == "string" then return utf8_chars(content) end
  local chars = 0
  if type(content) == "table" then
    for i = 1, #content do
      local part = content[i]
      if type(part) == "table" and type(part.text) == "string" then chars = chars + content_chars(part.text) end
    end
  end
  return chars
end

--- chars = common.prompt_chars(json): the characters of a chat request's
-- prompt (its system and its messages' content), in UTF-8 characters, as
-- the providers' rule of thumb of 4 characters a token counts them.
function common.prompt_chars(body)
  if type(body) ~= "table" then return 0 end
  local chars = content_chars(body.system)
  local messages = body.messages
  if type(messages) == "table" then
    for i = 1, #messages do
      local message = messages[i]
      if type(message) == "table" then chars = chars + content_chars(message.content) end
    end
  end
  return chars
end

--- n | nil = common.positive_integer(v): v when it is a whole number > 0.
function common.positive_integer(v)
  if type(v) == "number" and v >= 1 and v % 1 == 0 and v < math.huge then return v end
  return nil
end

--- usage | nil = common.usage(res): the `usage` object of a whole JSON
-- answer (a 2xx), or nil.
function common.usage(res)
  if type(res) ~= "table" or type(res.status) ~= "number" or res.status < 200 or res.status > 299 then
    return nil
  end
  local ok, body = pcall(function() return res:json() end)
  if not ok or type(body) ~= "table" or type(body.usage) ~= "table" then return nil end
  return body.usage
end

return common
