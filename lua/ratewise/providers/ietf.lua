-- The IETF RateLimit header fields (draft-ietf-httpapi-ratelimit-headers),
-- in the three shapes servers send:
--   draft 08 and later   RateLimit: "default";r=0;t=7   (a Structured Field
--                        List, RFC 9651: r = remaining, t = seconds to reset)
--                        RateLimit-Policy: "default";q=100;w=60
--   draft 07             RateLimit: limit=100, remaining=0, reset=7   (a Dictionary)
--   drafts 00 to 06      RateLimit-Remaining: 0 and RateLimit-Reset: 7 (delta seconds)
-- Several quotas at once: the most restrictive wins (the fewest remaining;
-- among equals, the latest reset). An item without t takes the window w of
-- its policy in RateLimit-Policy (a quota refills within its window).
--   delay on 429 or 503 with nothing remaining: the reset
--   observe: limiter:sync(remaining, reset, limit, window), the limit and
--            window from the quota's policy (q and w), or draft 07's limit
--            and drafts 00 to 06's RateLimit-Limit with the w of the
--            RateLimit-Policy named by that number ("100;w=60")
-- A field that does not parse gives no value, never an error.
local policy = require "ratewise.policy"
local common = require "ratewise.providers.common"

local type, tonumber = type, tonumber
local byte, sub, match = string.byte, string.sub, string.match

---------------------------------------------------------------------------
-- A Structured Field parser (RFC 9651) reduced to what is needed here: it
-- reads every type of bare item so that a valid field parses, but keeps
-- only numbers, strings, tokens and booleans. Each reader takes the text
-- and a position and returns value, next position, or nil.
-- It is lenient on white space: OWS is allowed around ";", "=" and ",".

local SP, HTAB = 32, 9

local function skip_ows(s, pos)
  local b = byte(s, pos)
  while b == SP or b == HTAB do
    pos = pos + 1
    b = byte(s, pos)
  end
  return pos
end

local function parse_number(s, pos)
  local sign, int, dot, frac = match(s, "^(%-?)(%d+)(%.?)(%d*)", pos)
  if not int then return nil end
  local text = sign .. int .. dot .. frac
  if dot == "" then
    if #int > 15 then return nil end
  elseif #int > 12 or #frac < 1 or #frac > 3 then
    return nil
  end
  return tonumber(text), pos + #text
end

local function parse_string(s, pos)
  -- pos is at the opening quote; escapes are \" and \\ only.
  local out, i = {}, pos + 1
  while true do
    local b = byte(s, i)
    if b == nil then return nil end -- unterminated
    if b == 34 then return table.concat(out), i + 1 end
    if b == 92 then
      local nb = byte(s, i + 1)
      if nb ~= 34 and nb ~= 92 then return nil end
      out[#out + 1] = sub(s, i + 1, i + 1)
      i = i + 2
    elseif b < 32 or b > 126 then
      return nil
    else
      out[#out + 1] = sub(s, i, i)
      i = i + 1
    end
  end
end

local function parse_bare_item(s, pos)
  local b = byte(s, pos)
  if b == nil then return nil end
  if b == 45 or (b >= 48 and b <= 57) then return parse_number(s, pos) end -- - 0-9
  if b == 34 then return parse_string(s, pos) end                          -- "
  if b == 37 then                                                         -- %"display string"
    if byte(s, pos + 1) ~= 34 then return nil end
    local value, next_pos = parse_string(s, pos + 1)
    return value, next_pos
  end
  local token = match(s, "^[%a*][%w:/!#$%%&'*+%-.^_`|~]*", pos)
  if token then return token, pos + #token end
  local bytes = match(s, "^:[%w+/=]*:", pos)                              -- :byte sequence:
  if bytes then return bytes, pos + #bytes end
  if b == 63 then                                                         -- ?0 ?1
    local flag = sub(s, pos + 1, pos + 1)
    if flag == "1" then return true, pos + 2 end
    if flag == "0" then return false, pos + 2 end
    return nil
  end
  if b == 64 then                                                         -- @date
    local value, next_pos = parse_number(s, pos + 1)
    if value and value % 1 == 0 then return value, next_pos end
  end
  return nil
end

local function parse_key(s, pos)
  local key = match(s, "^[%l*][%l%d_%-.*]*", pos)
  if not key then return nil end
  return key, pos + #key
end

-- *( ";" key [ "=" bare-item ] ): a table of key -> value (true when bare).
local function parse_parameters(s, pos)
  local params = {}
  while true do
    local after = skip_ows(s, pos)
    if byte(s, after) ~= 59 then return params, pos end -- ;
    local key, value
    key, pos = parse_key(s, skip_ows(s, after + 1))
    if not key then return nil end
    local eq = skip_ows(s, pos)
    if byte(s, eq) == 61 then -- =
      value, pos = parse_bare_item(s, skip_ows(s, eq + 1))
      if value == nil then return nil end
    else
      value = true
    end
    params[key] = value -- a repeated key: the last one counts
  end
end

-- An item, or an inner list "(a b);p" whose items are read and dropped.
local function parse_member(s, pos)
  local value
  if byte(s, pos) == 40 then -- (
    pos = pos + 1
    while true do
      pos = skip_ows(s, pos)
      local b = byte(s, pos)
      if b == 41 then pos = pos + 1; break end -- )
      if b == nil then return nil end
      local item
      item, pos = parse_bare_item(s, pos)
      if item == nil then return nil end
      local params
      params, pos = parse_parameters(s, pos)
      if not params then return nil end
      local nb = byte(s, pos)
      if nb ~= SP and nb ~= 41 then return nil end
    end
    value = false
  else
    value, pos = parse_bare_item(s, pos)
    if value == nil then return nil end
  end
  local params
  params, pos = parse_parameters(s, pos)
  if not params then return nil end
  return { value = value, params = params }, pos
end

-- Members separated by "," (OWS around); a trailing comma, an empty member
-- or anything left over makes the whole field invalid.
local function parse_members(s, read)
  local out = {}
  local pos = skip_ows(s, 1)
  if pos > #s then return out end
  while true do
    local member
    member, pos = read(s, pos)
    if not member then return nil end
    out[#out + 1] = member
    pos = skip_ows(s, pos)
    if pos > #s then return out end
    if byte(s, pos) ~= 44 then return nil end -- ,
    pos = skip_ows(s, pos + 1)
    if pos > #s then return nil end
  end
end

local function parse_list(s)
  return parse_members(s, parse_member)
end

-- Dictionary members: key [ "=" member ] (a bare key is true).
local function parse_dict_member(s, pos)
  local key
  key, pos = parse_key(s, pos)
  if not key then return nil end
  local eq = skip_ows(s, pos)
  local member
  if byte(s, eq) == 61 then
    member, pos = parse_member(s, skip_ows(s, eq + 1))
    if not member then return nil end
  else
    local params
    params, pos = parse_parameters(s, pos)
    if not params then return nil end
    member = { value = true, params = params }
  end
  member.key = key
  return member, pos
end

local function parse_dictionary(s)
  local members = parse_members(s, parse_dict_member)
  if not members then return nil end
  local dict = {}
  for i = 1, #members do dict[members[i].key] = members[i] end -- the last one counts
  return dict
end

---------------------------------------------------------------------------
-- The quota the fields describe

local function count(v)
  if type(v) == "number" and v >= 0 and v < math.huge then return v end
  return nil
end

-- The fewest remaining; among equals, the latest known reset.
local function more_restrictive(a, b)
  if a == nil then return true end
  if b.remaining ~= a.remaining then return b.remaining < a.remaining end
  return (b.reset or -1) > (a.reset or -1)
end

-- policy name -> { q = quota | nil, w = window }, from RateLimit-Policy.
-- Drafts 06 and 07 name a policy by its quota ("100;w=60"), so the name
-- is the quota then.
local function policies(res)
  local field = common.header(res, "ratelimit-policy")
  local list = field and parse_list(field)
  if not list then return nil end
  local out = {}
  for i = 1, #list do
    local name, params = list[i].value, list[i].params
    local w = count(params.w)
    if (type(name) == "string" or type(name) == "number") and w then
      out[name] = { q = count(params.q) or (type(name) == "number" and count(name)) or nil, w = w }
    end
  end
  return out
end

-- The quota left is the most restrictive one's; the limit stated is the
-- slowest of the quotas' policies (10 a second and 1000 an hour: the hour's).
local function from_list(res, list)
  local best, known, slowest
  for i = 1, #list do
    local params = list[i].params
    local remaining = count(params.r)
    if remaining then
      if known == nil then known = policies(res) or false end
      local stated = known and known[list[i].value] or nil
      local quota = { remaining = remaining, reset = count(params.t) or (stated and stated.w) }
      if more_restrictive(best, quota) then best = quota end
      if stated and stated.q and stated.w > 0 and (not slowest or stated.q / stated.w < slowest.q / slowest.w) then
        slowest = stated
      end
    end
  end
  if best and slowest then best.limit, best.window = slowest.q, slowest.w end
  return best
end

-- The window of the policy whose quota is `limit` (drafts 06 and 07).
local function window_of(res, limit)
  local known = limit and policies(res)
  local stated = known and known[limit]
  return stated and stated.w or nil
end

local function from_dictionary(res, dict)
  local remaining = dict.remaining and count(dict.remaining.value)
  if not remaining then return nil end
  local limit = dict.limit and count(dict.limit.value) or nil
  return { remaining = remaining, reset = dict.reset and count(dict.reset.value) or nil,
    limit = limit, window = window_of(res, limit) }
end

--- { remaining = n, reset = seconds | nil, limit = n | nil, window = seconds | nil } | nil
local function quota_of(res)
  local field = common.header(res, "ratelimit")
  if field then
    local list = parse_list(field)
    if list then
      local quota = from_list(res, list)
      if quota then return quota end
    else
      local dict = parse_dictionary(field)
      local quota = dict and from_dictionary(res, dict)
      if quota then return quota end
    end
  end
  local remaining = common.number(res, "ratelimit-remaining")
  if not remaining then return nil end
  local limit = common.number(res, "ratelimit-limit")
  return { remaining = remaining, reset = common.number(res, "ratelimit-reset"), limit = limit,
    window = window_of(res, limit) }
end

local function delay(res)
  local status = type(res) == "table" and res.status
  if status ~= 429 and status ~= 503 then return nil end
  local quota = quota_of(res)
  if quota and quota.remaining < 1 then return quota.reset end
  return nil
end

local function observe(res, limiter)
  local quota = quota_of(res)
  if quota then common.sync(limiter, quota.remaining, quota.reset, quota.limit, quota.window) end
end

return policy.new {
  name = "ietf",
  delay = delay,
  observe = observe,
}
