-- A JSON codec in plain Lua, written for ratewise rather than taken from
-- elsewhere: a .love game or a plugin carries its Lua files with it, and no
-- Debian package of a pure-Lua JSON module is one a game ships (dkjson, the
-- one there is, is installed system-wide where a player's machine has
-- none). It is ratewise's one encoder on every host, for what lua-cjson
-- 2.1 cannot do: numbers written exactly (lua-cjson keeps 14 digits, so
-- 1234567890123456 went out as 1.2345678901235e+15), rw.null as null, and
-- "/" not escaped. It decodes where neither lua-cjson nor a host's codec is
-- there, and where lua-cjson would round an integer (json.lua decides).
--
-- Decoding is strict RFC 8259, as the bytes come from a server: UTF-8 only,
-- no comments, trailing commas, NaN, hex, leading zeros or lone
-- surrogates; nesting is capped so that hostile text cannot exhaust the
-- stack; an error names what was wrong and where (line, column, byte).
local compat = require "ratewise.compat"

local byte, char, find, format, sub, concat, gsub = string.byte, string.char, string.find, string.format,
  string.sub, table.concat, string.gsub
local type, pairs, tonumber, tostring, floor, huge = type, pairs, tonumber, tostring, math.floor, math.huge
local math_type, tointeger = compat.math_type, compat.tointeger -- nil before Lua 5.3

local pure = {}

-- lua-cjson's limit for both directions: deeper text is refused rather
-- than followed to the end of the stack.
pure.MAX_DEPTH = 1000

-- Whole numbers below this are exact in a double (2^53 itself may be
-- 2^53 + 1 rounded).
local EXACT = 2 ^ 53
-- Whole numbers below this are written with all their digits, as
-- JavaScript writes them: a server reading an id into an integer type (Go's
-- int64) refuses 1e+15 where it takes 1000000000000000.
local DIGITS_BELOW = 1e21

--- text | nil = pure.number_text(n): n as JSON (and a URL's query) writes
-- it: an integer with all its digits (64 bits on Lua 5.3 and later, whole
-- doubles below 1e21 elsewhere), any other finite number in the fewest
-- significant digits that read back as the same double; nil for NaN and
-- infinities, which JSON has no text for.
local function number_text(n)
  if math_type and math_type(n) == "integer" then return format("%d", n) end
  if n ~= n or n == huge or n == -huge then return nil end
  if n % 1 == 0 and n > -DIGITS_BELOW and n < DIGITS_BELOW then return format("%.0f", n) end
  for digits = 14, 16 do
    local text = format("%." .. digits .. "g", n)
    if tonumber(text) == n then return text end
  end
  return format("%.17g", n)
end
pure.number_text = number_text

---------------------------------------------------------------------------
-- UTF-8 (RFC 3629): what a JSON text and every string in it must be.

-- The byte position of the first sequence that is not UTF-8 (an overlong
-- form, a surrogate, past U+10FFFF, a stray or missing continuation), or nil.
local function invalid_utf8_at(s)
  local i = find(s, "[\128-\255]")
  while i do
    local c, c1 = byte(s, i, i + 1)
    local n, low, high
    low, high = 0x80, 0xBF
    if c >= 0xC2 and c <= 0xDF then
      n = 1
    elseif c >= 0xE0 and c <= 0xEF then
      n = 2
      if c == 0xE0 then low = 0xA0 elseif c == 0xED then high = 0x9F end
    elseif c >= 0xF0 and c <= 0xF4 then
      n = 3
      if c == 0xF0 then low = 0x90 elseif c == 0xF4 then high = 0x8F end
    else
      return i
    end
    if not c1 or c1 < low or c1 > high then return i end
    for k = i + 2, i + n do
      local ck = byte(s, k)
      if not ck or ck < 0x80 or ck > 0xBF then return i end
    end
    i = find(s, "[\128-\255]", i + n + 1)
  end
  return nil
end
pure.invalid_utf8_at = invalid_utf8_at

local function utf8_char(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + floor(cp / 0x40), 0x80 + cp % 0x40) end
  if cp < 0x10000 then
    return char(0xE0 + floor(cp / 0x1000), 0x80 + floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
  end
  return char(0xF0 + floor(cp / 0x40000), 0x80 + floor(cp / 0x1000) % 0x40, 0x80 + floor(cp / 0x40) % 0x40,
    0x80 + cp % 0x40)
end

---------------------------------------------------------------------------
-- Decoding. Each reader takes the text and a position and answers the
-- value and the position after it; a fault raises a table, {message},
-- which pure.decode turns into nil, message.

local Fault = {}

-- Where pos is, as a person finds it in an editor.
local function place(text, pos)
  local line, line_start = 1, 1
  for nl in string.gmatch(sub(text, 1, pos - 1), "()\n") do
    line, line_start = line + 1, nl + 1
  end
  return format("line %d, column %d (byte %d)", line, pos - line_start + 1, pos)
end

local function fail(text, pos, what)
  error(setmetatable({ message = what .. " at " .. place(text, pos) }, Fault), 0)
end

-- What is at pos, for an error message: the character when printable,
-- its code otherwise, or the end of the text.
local function shown(text, pos)
  local c = byte(text, pos)
  if not c then return "the end of the text" end
  if c >= 0x20 and c < 0x7F then return format("'%s'", char(c)) end
  return format("byte 0x%02X", c)
end

local function unexpected(text, pos, wanted)
  fail(text, pos, format("expected %s but found %s", wanted, shown(text, pos)))
end

local function skip_space(text, pos)
  local c = byte(text, pos)
  if c == 32 or c == 10 or c == 13 or c == 9 then
    local _, last = find(text, "^[ \t\r\n]*", pos)
    return last + 1
  end
  return pos
end

local read_value -- (text, pos, depth, null) -> value, next

-- A number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, nothing more.
local function read_number(text, pos)
  local _, last = find(text, "^%-?%d+", pos)
  if not last then unexpected(text, byte(text, pos) == 45 and pos + 1 or pos, "a digit") end
  local digits_at = byte(text, pos) == 45 and pos + 1 or pos
  if byte(text, digits_at) == 48 and last > digits_at then
    fail(text, digits_at, "a number with a leading zero")
  end
  local whole = true
  if byte(text, last + 1) == 46 then -- "."
    local _, frac = find(text, "^%d+", last + 2)
    if not frac then unexpected(text, last + 2, "a digit after the decimal point") end
    last, whole = frac, false
  end
  local e = byte(text, last + 1)
  if e == 101 or e == 69 then -- "e", "E"
    local _, exp = find(text, "^[+-]?%d+", last + 2)
    if not exp then
      local at = last + 2
      if find(text, "^[+-]", at) then at = at + 1 end
      unexpected(text, at, "a digit in the exponent")
    end
    last, whole = exp, false
  end
  local n = tonumber(sub(text, pos, last))
  -- On Lua 5.3 and later an integer literal that fits is an integer (which
  -- tonumber gives), and so is a whole number within ±2^53 written another
  -- way (3.0, 1e3): lua-cjson cannot tell them apart, and one codec must
  -- answer what the other does.
  if math_type and not whole and n % 1 == 0 and n > -EXACT and n < EXACT then n = tointeger(n) end
  return n, last + 1
end

local ESCAPED = { [34] = '"', [92] = "\\", [47] = "/", [98] = "\b", [102] = "\f", [110] = "\n", [114] = "\r",
  [116] = "\t" }

-- The code unit of the \uXXXX escape at pos (the backslash).
local function code_unit(text, pos)
  local hex = sub(text, pos + 2, pos + 5)
  if not find(hex, "^%x%x%x%x$") then fail(text, pos, "a \\u escape without four hexadecimal digits") end
  return tonumber(hex, 16)
end

-- A string, pos at its opening quote. Control characters must be escaped;
-- \u escapes of a surrogate pair become one character.
local function read_string(text, pos)
  local parts, n, from = nil, 0, pos + 1
  while true do
    local at = find(text, '[%z\1-\31"\\]', from)
    if not at then fail(text, pos, "a string with no closing quote") end
    local c = byte(text, at)
    if c == 34 then
      if not parts then return sub(text, from, at - 1), at + 1 end
      parts[n + 1] = sub(text, from, at - 1)
      return concat(parts), at + 1
    end
    if c ~= 92 then fail(text, at, format("a control character (0x%02X) inside a string, not escaped", c)) end
    parts = parts or {}
    n = n + 1
    parts[n] = sub(text, from, at - 1)
    local e = byte(text, at + 1)
    local simple = ESCAPED[e]
    if simple then
      n = n + 1
      parts[n] = simple
      from = at + 2
    elseif e == 117 then -- "u"
      local cp = code_unit(text, at)
      from = at + 6
      if cp >= 0xD800 and cp <= 0xDBFF then
        if sub(text, from, from + 1) ~= "\\u" then
          fail(text, at, "a \\u escape of a high surrogate not followed by a low one")
        end
        local low = code_unit(text, from)
        if low < 0xDC00 or low > 0xDFFF then
          fail(text, from, "a \\u escape of a high surrogate not followed by a low one")
        end
        cp = 0x10000 + (cp - 0xD800) * 0x400 + (low - 0xDC00)
        from = from + 6
      elseif cp >= 0xDC00 and cp <= 0xDFFF then
        fail(text, at, "a \\u escape of a low surrogate with no high one before it")
      end
      n = n + 1
      parts[n] = utf8_char(cp)
    else
      fail(text, at, format("an unknown escape \\%s", e and char(e) or ""))
    end
  end
end

local function read_literal(text, pos, word, value)
  if sub(text, pos, pos + #word - 1) ~= word then unexpected(text, pos, "a JSON value") end
  return value, pos + #word
end

local function read_array(text, pos, depth, null)
  if depth > pure.MAX_DEPTH then fail(text, pos, format("nesting deeper than %d levels", pure.MAX_DEPTH)) end
  local list, n = {}, 0
  pos = skip_space(text, pos + 1)
  if byte(text, pos) == 93 then return list, pos + 1 end
  while true do
    local value
    value, pos = read_value(text, pos, depth, null)
    n = n + 1
    list[n] = value
    pos = skip_space(text, pos)
    local c = byte(text, pos)
    if c == 93 then return list, pos + 1 end
    if c ~= 44 then unexpected(text, pos, "',' or ']' after an array element") end
    pos = pos + 1
  end
end

local function read_object(text, pos, depth, null)
  if depth > pure.MAX_DEPTH then fail(text, pos, format("nesting deeper than %d levels", pure.MAX_DEPTH)) end
  local object = {}
  pos = skip_space(text, pos + 1)
  if byte(text, pos) == 125 then return object, pos + 1 end
  while true do
    if byte(text, pos) ~= 34 then unexpected(text, pos, "a string (a member's name)") end
    local key, value
    key, pos = read_string(text, pos)
    pos = skip_space(text, pos)
    if byte(text, pos) ~= 58 then unexpected(text, pos, "':' after a member's name") end
    value, pos = read_value(text, pos + 1, depth, null)
    object[key] = value
    pos = skip_space(text, pos)
    local c = byte(text, pos)
    if c == 125 then return object, pos + 1 end
    if c ~= 44 then unexpected(text, pos, "',' or '}' after an object member") end
    pos = skip_space(text, pos + 1)
  end
end

function read_value(text, pos, depth, null)
  pos = skip_space(text, pos)
  local c = byte(text, pos)
  if c == 34 then return read_string(text, pos) end
  if c == 123 then return read_object(text, pos, depth + 1, null) end
  if c == 91 then return read_array(text, pos, depth + 1, null) end
  if c == 45 or (c and c >= 48 and c <= 57) then return read_number(text, pos) end
  if c == 116 then return read_literal(text, pos, "true", true) end
  if c == 102 then return read_literal(text, pos, "false", false) end
  if c == 110 then return read_literal(text, pos, "null", null) end
  unexpected(text, pos, "a JSON value")
end

--- value | nil, err = pure.decode(text, null): the value of a JSON text, a
-- JSON null as `null`; err says what is wrong and where.
function pure.decode(text, null)
  if type(text) ~= "string" then return nil, format("expected a string to decode, got %s", type(text)) end
  local bad = invalid_utf8_at(text)
  if bad then return nil, "a byte sequence that is not UTF-8 at " .. place(text, bad) end
  local ok, value, pos = pcall(read_value, text, 1, 0, null)
  if not ok then
    if getmetatable(value) == Fault then return nil, value.message end
    error(value, 0)
  end
  pos = skip_space(text, pos)
  if pos <= #text then
    return nil, format("more after the JSON value (%s) at %s", shown(text, pos), place(text, pos))
  end
  return value
end

---------------------------------------------------------------------------
-- Encoding. Each writer appends to buf after index n and answers the new n,
-- or nil once state.why says why the value cannot be written (the writers
-- return rather than raise, so that no pcall is needed around them).

local ESCAPES = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r",
  ["\t"] = "\\t" }
-- (DEL as lua-cjson writes it, so that both write the same bytes)
ESCAPES["\127"] = "\\u007f"
for code = 0, 31 do
  local c = char(code)
  ESCAPES[c] = ESCAPES[c] or format("\\u%04x", code)
end

-- Where the value being written is, as a path from the top (.name[2]),
-- for an error message.
local function where(state, depth)
  if depth == 0 then return "" end
  local path = {}
  for level = 1, depth do
    local key = state.keys[level]
    if type(key) == "string" and find(key, "^[%a_][%w_]*$") then
      path[level] = "." .. key
    elseif type(key) == "string" then
      path[level] = format("[%q]", key)
    else
      path[level] = "[" .. tostring(key) .. "]"
    end
  end
  return " (at " .. concat(path) .. ")"
end

local function refuse(state, depth, what)
  state.why = what .. where(state, depth)
  return nil
end

local function write_string(s, buf, n, depth, state)
  if find(s, "[\128-\255]") and invalid_utf8_at(s) then return refuse(state, depth, "a string that is not UTF-8") end
  if find(s, '[%z\1-\31"\\\127]') then s = gsub(s, '[%z\1-\31"\\\127]', ESCAPES) end
  buf[n + 1], buf[n + 2], buf[n + 3] = '"', s, '"'
  return n + 3
end

local write_value -- (v, buf, n, depth, state) -> n | nil

-- The array's length when t is one as lua-cjson decides (every key a whole
-- number from 1, holes no more than half of it beyond the first ten, which
-- become null), false when t is an object, or nil and why when t is an
-- array too sparse to write.
local function array_length(t)
  local max, count = 0, 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k % 1 ~= 0 then return false end
    if k > max then max = k end
    count = count + 1
  end
  if max > count * 2 and max > 10 then
    return nil, format("a sparse array (%d values up to index %s)", count, number_text(max))
  end
  return max
end

local function write_members(t, buf, n, depth, state)
  local keys, inner = state.keys, depth + 1
  local sep = "{"
  for k, v in pairs(t) do
    keys[inner] = k
    local tk = type(k)
    if tk == "string" then
      buf[n + 1] = sep
      n = write_string(k, buf, n + 1, inner, state)
      if not n then return nil end
    elseif tk == "number" then
      local text = number_text(k)
      if not text then
        return refuse(state, depth, format("a table key that is not a finite number (%s)", tostring(k)))
      end
      buf[n + 1], buf[n + 2] = sep, '"' .. text .. '"'
      n = n + 2
    else
      return refuse(state, depth, format("a table key that is a %s, not a string or a number", tk))
    end
    buf[n + 1] = ":"
    n = write_value(v, buf, n + 1, inner, state)
    if not n then return nil end
    sep = ","
  end
  -- An empty table is {} as lua-cjson writes it: Lua cannot tell an empty
  -- array from an empty object.
  if sep == "{" then
    buf[n + 1], buf[n + 2] = "{", "}"
    return n + 2
  end
  buf[n + 1] = "}"
  return n + 1
end

local function write_table(t, buf, n, depth, state)
  local open = state.open
  if open[t] then return refuse(state, depth, "a table that contains itself") end
  if depth >= pure.MAX_DEPTH then
    state.why = format("nesting deeper than %d levels", pure.MAX_DEPTH)
    return nil
  end
  local length, sparse = array_length(t)
  if length == nil then return refuse(state, depth, sparse) end
  open[t] = true
  if length and length > 0 then
    local keys, inner = state.keys, depth + 1
    local sep = "["
    for i = 1, length do
      buf[n + 1] = sep
      n = n + 1
      keys[inner] = i
      local v = t[i]
      if v == nil then
        n = n + 1
        buf[n] = "null"
      else
        n = write_value(v, buf, n, inner, state)
        if not n then return nil end
      end
      sep = ","
    end
    n = n + 1
    buf[n] = "]"
  else
    n = write_members(t, buf, n, depth, state)
    if not n then return nil end
  end
  open[t] = nil
  return n
end

function write_value(v, buf, n, depth, state)
  local t = type(v)
  if t == "string" then return write_string(v, buf, n, depth, state) end
  local text
  if t == "number" then
    text = number_text(v)
    if not text then
      return refuse(state, depth, (v ~= v and "NaN" or "an infinity") .. ", which JSON has no number for")
    end
  elseif v == state.also_null and v ~= nil then
    text = "null"
  elseif t == "table" then
    return write_table(v, buf, n, depth, state)
  elseif t == "boolean" then
    text = v and "true" or "false"
  elseif v == state.null then
    text = "null"
  else
    return refuse(state, depth, format("a %s, which JSON has no value for", t))
  end
  buf[n + 1] = text
  return n + 1
end

--- text | nil, why = pure.encode(value, null [, also_null]): value as JSON
-- text, `null` (and also_null, a host's own null such as vim.NIL) written
-- as null; why names what cannot be written (a function, NaN, a cycle, a
-- sparse array, a string that is not UTF-8) and where it is.
function pure.encode(value, null, also_null)
  local t = type(value)
  if t == "string" and not find(value, '[%z\1-\31"\\\127-\255]') then return '"' .. value .. '"' end
  local state = { open = {}, keys = {}, null = null, also_null = also_null }
  local buf = {}
  local n = write_value(value, buf, 0, 0, state)
  if not n then return nil, state.why end
  return concat(buf, "", 1, n)
end

return pure
