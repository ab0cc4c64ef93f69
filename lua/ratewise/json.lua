-- JSON for requests and responses (the `json` option, res:json(), the
-- command's results). Text is written by ratewise's own encoder
-- (ratewise/json/pure.lua) on every host: numbers exact, rw.null as null.
-- Text is read by lua-cjson where it loads (C, fast), else by a codec the
-- host plugs in (json.set_fallback: Neovim's vim.json), else by the
-- pure-Lua decoder, so that a .love game or a machine without lua-cjson
-- reads JSON all the same. Whichever reads it, a JSON null is rw.null and
-- whole numbers are integers on Lua 5.3 and later.
local compat = require "ratewise.compat"
local core = require "ratewise.core"

local format, find, gsub, sub = string.format, string.find, string.gsub, string.sub
local tostring, type, pairs, pcall = tostring, type, pairs, pcall
local json_plain = core.json_plain
local math_type, tointeger = compat.math_type, compat.tointeger -- nil before Lua 5.3

local json = {}

--- rw.null: what a JSON null decodes to, and what encodes as null: the
-- light userdata NULL, which is lua-cjson's cjson.null and OpenResty's
-- ngx.null too.
json.null = core.null

-- The pure-Lua codec, loaded on first use (require "ratewise" need not
-- compile it).
local pure

-- lua-cjson (an instance of its own, so that a program's settings of the
-- shared cjson do not change what ratewise accepts or writes), false
-- once it could not be loaded: the pure decoder then reads everything, as
-- well, and a package search at every call would only slow it down.
local cjson_codec
local fallback -- json.set_fallback

-- Why no file can be opened when the process has no descriptor left (nil
-- when one can): require then says "module not found" for a module that
-- is there, as it cannot open its file.
local function out_of_descriptors()
  local probe, err = io.open("/dev/null", "rb")
  if probe then
    probe:close()
    return nil
  end
  if find(tostring(err), "Too many open files", 1, true) then return tostring(err) end
  return nil
end

--- codec | nil, why: the pure-Lua codec, or why it cannot be loaded now.
local function load_pure()
  if pure then return pure end
  local ok, m = pcall(require, "ratewise.json.pure")
  if ok then
    pure = m
    return pure
  end
  local why = tostring(m):match("^[^\n]*"):gsub(":$", "")
  local starved = out_of_descriptors()
  if starved then
    return nil, format("ratewise's JSON codec cannot be loaded (%s; %s): close some, or raise the limit "
      .. "(ulimit -n)", why, starved)
  end
  return nil, format("ratewise's JSON codec cannot be loaded (%s)", why)
end

local function load_cjson()
  local ok, m = pcall(require, "cjson.safe")
  if ok and type(m) == "table" and type(m.new) == "function" then
    local decoder = m.new()
    -- Strict as RFC 8259: no NaN, Infinity or hexadecimal numbers, which
    -- lua-cjson 2.1 accepts unless told.
    decoder.decode_invalid_numbers(false)
    cjson_codec = decoder
    return
  end
  -- Lua 5.1 and LuaJIT leave a marker in package.loaded for a module whose
  -- loader raised (a light userdata, which LuaJIT shows as a number), and
  -- their require then refuses it for good ("loop or previous error"): it
  -- goes, so that a later require of lua-cjson may still work.
  local loaded = package.loaded
  if type(loaded.cjson) ~= "table" then loaded.cjson = nil end
  if type(loaded["cjson.safe"]) ~= "table" then loaded["cjson.safe"] = nil end
  -- Not found for want of descriptors is asked again at the next call.
  if not out_of_descriptors() then cjson_codec = false end
end

--- true | nil, why = json.load(): loads what encoding and decoding use now;
-- a program that will need them later (`ratewise batch`, whose every result
-- is a JSON line) asks at its start, before its own work takes the
-- descriptors that loading a module needs.
function json.load()
  if cjson_codec == nil then load_cjson() end
  local loaded, why = load_pure()
  if not loaded then return nil, why end
  return true
end

--- json.set_fallback{decode = fn [, null = value]}: the decoder used where
-- lua-cjson cannot be loaded. decode(text) answers the value and raises on
-- what is not JSON; null is the value it gives for a JSON null (Neovim's
-- vim.NIL), which ratewise answers as rw.null, and writes as null.
function json.set_fallback(given)
  local decode = given.decode
  fallback = {
    null = given.null,
    decode = function(text)
      local ok, value = pcall(decode, text)
      if ok then return value end
      return nil, (tostring(value):gsub("^.-:%d+: ", ""))
    end,
  }
end

-- The testing aid RATEWISE_FAST_PATHS=off (fetch/cache.lua's) turns the
-- lua-cjson encoding below off too, so that every value goes through the
-- pure encoder (spec/json_codec_spec.lua, make bench-fast-paths).
local getenv = os.getenv
local cjson_encodes = not (getenv and getenv("RATEWISE_FAST_PATHS") == "off")

-- lua-cjson escapes "/" as "\/", which the pure encoder (and a reader of
-- the command's output, grepping for a URL) does not: a run of
-- backslashes before "/" that is odd ends in that escape.
local function unescape_slash(backslashes)
  if #backslashes % 2 == 1 then return sub(backslashes, 2) .. "/" end
  return nil
end

--- text = json.encode(value, who [, level]): raises, naming `who` (for
-- example "fetch: option 'json'"), when the value cannot be written as JSON
-- (a function, NaN, a sparse array, a cycle, a string that is not UTF-8).
-- lua-cjson writes it where it writes it as the pure encoder would (C: a
-- request's body is encoded at each call), the pure encoder otherwise.
function json.encode(value, who, level)
  if cjson_encodes then
    if cjson_codec == nil then load_cjson() end
    -- (core.json_plain: whether lua-cjson writes the pure encoder's bytes)
    if cjson_codec and json_plain(value, fallback and fallback.null) then
      local text = cjson_codec.encode(value)
      if text then
        if find(text, "\\/", 1, true) then text = gsub(text, "(\\+)/", unescape_slash) end
        return text
      end
      -- (a sparse array: the pure encoder names it)
    end
  end
  local codec, why_not = pure, nil
  if not codec then codec, why_not = load_pure() end
  if not codec then error(format("%s cannot be encoded as JSON: %s", who, why_not), (level or 1) + 1) end
  local text, why = codec.encode(value, json.null, fallback and fallback.null)
  if text == nil then error(format("%s cannot be encoded as JSON: %s", who, why), (level or 1) + 1) end
  return text
end

--- text | nil = json.number_text(n): n as JSON writes it (the query
-- option's numbers too): integers with all their digits, other numbers in
-- the fewest digits that read back the same; nil for NaN and infinities.
function json.number_text(n)
  local codec, why_not = pure, nil
  if not codec then codec, why_not = load_pure() end
  if not codec then error(why_not, 2) end
  return codec.number_text(n)
end

-- Whole numbers below this are exact in a double, so that a whole one was
-- that integer in the text (or written as 3.0, which JSON does not tell
-- apart from 3); 2^53 itself may be 2^53 + 1 rounded.
local EXACT = 2 ^ 53

-- Whole numbers from 2^53 and below 2^63: a Lua integer holds them
-- exactly where a double (lua-cjson reads doubles) may have rounded them.
local INT64 = 2 ^ 63

-- What lua-cjson or a host's codec decoded, made what the pure decoder
-- gives: on Lua 5.3 and later the whole numbers below ±2^53 become
-- integers again (lua-cjson 2.1 reads every number as a float), so that an
-- id prints as 3, not 3.0, and indexes a table as 3 does; a host's null
-- becomes rw.null. The second answer: a whole number from 2^53 that fits a
-- Lua integer was met, which the double may have rounded.
local function normalized(value, host_null)
  if value == host_null and host_null ~= nil then return json.null, false end
  local t = type(value)
  if t == "number" then
    if math_type and math_type(value) == "float" and value % 1 == 0 then
      if value > -EXACT and value < EXACT then return tointeger(value), false end
      return value, value > -INT64 and value < INT64
    end
  elseif t == "table" then
    local rounded = false
    for k, v in pairs(value) do
      local tv = type(v)
      if tv == "table" or (host_null ~= nil and v == host_null) then
        local normal, deep = normalized(v, host_null)
        value[k] = normal
        rounded = rounded or deep
      elseif tv == "number" and math_type and math_type(v) == "float" and v % 1 == 0 then
        if v > -EXACT and v < EXACT then
          value[k] = tointeger(v)
        elseif v > -INT64 and v < INT64 then
          rounded = true
        end
      end
    end
    return value, rounded
  end
  return value, false
end

--- value | nil, err = json.decode(text): a body that is not JSON is a
-- runtime failure (the server's doing), answered, not raised.
function json.decode(text)
  if cjson_codec == nil then load_cjson() end
  local value, err, host_null
  if cjson_codec then
    value, err = cjson_codec.decode(text)
  elseif fallback then
    value, err = fallback.decode(text)
    host_null = fallback.null
  end
  if value ~= nil then
    if not math_type and host_null == nil then return value end
    local rounded
    value, rounded = normalized(value, host_null)
    if not rounded then return value end
    -- (Lua 5.3 and later) an integer the double may have rounded: the
    -- pure decoder reads it exactly
  elseif err ~= nil then
    return nil, "not valid JSON: " .. tostring(err)
  end
  local codec, why_not = pure, nil
  if not codec then codec, why_not = load_pure() end
  if not codec then return nil, "not decoded: " .. why_not end
  value, err = codec.decode(text, json.null)
  if value == nil then return nil, "not valid JSON: " .. err end
  return value
end

return json
