-- JSON for requests and responses: lua-cjson, loaded on first use by the
-- features that need it (the `json` option, res:json()), so that
-- require "ratewise" and everything else work without it. Where lua-cjson
-- cannot be loaded, a codec a host plugs in (json.set_fallback: Neovim's
-- vim.json) does the work instead.
local compat = require "ratewise.compat"

local format, tostring, type, pairs, pcall = string.format, tostring, type, pairs, pcall
local math_type, tointeger = compat.math_type, compat.tointeger -- nil before Lua 5.3

local json = {}

-- The codec: what encodes and decodes, answering nil, err rather than
-- raising (lua-cjson's cjson.safe, or the stand-in of a plugged-in codec).
-- Only a codec that loaded is kept: a module once loaded stays loaded. A
-- failure is never remembered, not even "module 'cjson' not found": that is
-- also what require says when every descriptor is in use (it cannot open the
-- file it looks for), and a later package.path may find it. So each call
-- that finds no codec asks require again.
local codec
local fallback -- json.set_fallback

-- Why lua-cjson did not load: the first line of require's message
-- ("module 'cjson' not found:"), not the list of every path it tried, and
-- what to do about it.
local function why_not_loaded(err)
  local why = tostring(err):match("^[^\n]*"):gsub(":$", "")
  -- A file that cannot be opened for want of descriptors reads as a module
  -- that is not there: installing lua-cjson would not help.
  local probe, probe_err = io.open("/dev/null", "rb")
  if probe then
    probe:close()
  elseif tostring(probe_err):find("Too many open files", 1, true) then
    return format("(%s; %s): close some, or raise the limit (ulimit -n)", why, probe_err)
  end
  return format("(%s): install the Debian package lua-cjson (apt-get install lua-cjson) "
    .. "or the rock lua-cjson (luarocks install lua-cjson)", why)
end

--- codec | nil, why: the codec, or why lua-cjson cannot be loaded now and
-- what to do.
local function load_codec()
  if codec then return codec end
  local ok, m = pcall(require, "cjson")
  local ok_safe, m_safe = false, nil
  if ok then ok_safe, m_safe = pcall(require, "cjson.safe") end
  if ok and ok_safe then
    codec = m_safe
    return codec
  end
  -- Lua 5.1 and LuaJIT leave a marker in package.loaded for a module whose
  -- loader raised (a light userdata, which LuaJIT shows as a number), and
  -- their require then refuses it for good ("loop or previous error"): it
  -- goes, so that the next call tries again. lua-cjson is a table.
  local loaded = package.loaded
  if type(loaded.cjson) ~= "table" then loaded.cjson = nil end
  if type(loaded["cjson.safe"]) ~= "table" then loaded["cjson.safe"] = nil end
  if fallback then return fallback end
  return nil, why_not_loaded(ok and m_safe or m)
end

--- true | nil, why = json.load(): whether a codec can be had now; a
-- program that will need one later (`ratewise batch`, whose every result
-- is a JSON line) asks at its start, before its own work takes the
-- descriptors that loading lua-cjson needs.
function json.load()
  local loaded, why = load_codec()
  if not loaded then return nil, "lua-cjson cannot be loaded " .. why end
  return true
end

--- json.set_fallback{encode = fn, decode = fn}: the codec used where
-- lua-cjson cannot be loaded. encode(value) answers the text and raises on
-- what cannot be encoded; decode(text) answers the value and raises on what
-- is not JSON.
function json.set_fallback(given)
  local encode, decode = given.encode, given.decode
  fallback = {
    encode = function(value)
      local ok, text = pcall(encode, value)
      if ok then return text end
      return nil, text
    end,
    decode = function(text)
      local ok, value = pcall(decode, text)
      if ok then return value end
      return nil, (tostring(value):gsub("^.-:%d+: ", ""))
    end,
  }
end

--- text = json.encode(value, who [, level]): raises, naming `who` (for
-- example "fetch: option 'json'"), when lua-cjson is missing or the value
-- cannot be written as JSON (a function, a sparse array, a cycle).
function json.encode(value, who, level)
  local encoder = codec -- loaded: most calls ask no more
  if not encoder then
    local why
    encoder, why = load_codec()
    if not encoder then
      error(format("%s needs lua-cjson, which cannot be loaded %s", who, why), (level or 1) + 1)
    end
  end
  -- nil, err rather than a raise to catch: a pcall around lua-cjson's
  -- encode (a C function) ends LuaJIT's trace there, and the rest of
  -- the caller (fetch's whole plan of a call with a JSON body) then ran
  -- interpreted.
  local text, err = encoder.encode(value)
  if text == nil then
    error(format("%s cannot be encoded as JSON: %s", who, tostring(err):gsub("^.-:%d+: ", "")), (level or 1) + 1)
  end
  return text
end

-- Numbers no larger than this are exact in a double, so that a whole one
-- was an integer in the text (or written as 3.0, which JSON does not tell
-- apart from 3).
local EXACT = 2 ^ 53

-- lua-cjson 2.1 reads every number as a float: on Lua 5.3 and later the
-- whole ones within ±2^53 become integers again, so that an id or a count
-- prints as 3, not 3.0, and indexes a table as 3 does.
local function integers(value)
  for k, v in pairs(value) do
    local t = type(v)
    if t == "table" then
      integers(v)
    elseif t == "number" and math_type(v) == "float" and v % 1 == 0 and v >= -EXACT and v <= EXACT then
      value[k] = tointeger(v)
    end
  end
end

--- value | nil, err = json.decode(text): a body that is not JSON is a
-- runtime failure (the server's doing), answered, not raised.
function json.decode(text)
  local decoder, why = load_codec()
  if not decoder then return nil, "not decoded: lua-cjson cannot be loaded " .. why end
  local value, err = decoder.decode(text)
  if value == nil then return nil, "not valid JSON: " .. tostring(err) end
  if math_type then
    local t = type(value)
    if t == "table" then
      integers(value)
    elseif t == "number" and value % 1 == 0 and value >= -EXACT and value <= EXACT then
      value = tointeger(value)
    end
  end
  return value
end

return json
