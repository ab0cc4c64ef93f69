-- Bytes made fit for a JSON line: whether a string is UTF-8, a printable
-- stand-in when it is not, and base64 both ways for bodies that are not.
-- Written here because Lua 5.1 and LuaJIT have no utf8 library (and 5.3's
-- takes surrogates), and base64 would otherwise bring in a dependency
-- (luasocket's mime) for the command-line tool alone: libcurl keeps its own
-- private.
local byte, char, find, sub, concat = string.byte, string.char, string.find, string.sub, table.concat
local floor = math.floor

local text = {}

-- The length of the UTF-8 sequence (RFC 3629) that starts at i, or nil.
local function sequence_at(s, i)
  local c = byte(s, i)
  local n, low, high -- bytes, and the second byte's range
  if c >= 0xC2 and c <= 0xDF then
    n, low, high = 2, 0x80, 0xBF
  elseif c == 0xE0 then
    n, low, high = 3, 0xA0, 0xBF  -- no overlong forms
  elseif c == 0xED then
    n, low, high = 3, 0x80, 0x9F  -- no surrogates
  elseif c >= 0xE1 and c <= 0xEF then
    n, low, high = 3, 0x80, 0xBF
  elseif c == 0xF0 then
    n, low, high = 4, 0x90, 0xBF
  elseif c >= 0xF1 and c <= 0xF3 then
    n, low, high = 4, 0x80, 0xBF
  elseif c == 0xF4 then
    n, low, high = 4, 0x80, 0x8F  -- nothing past U+10FFFF
  else
    return nil
  end
  local second = byte(s, i + 1)
  if not second or second < low or second > high then return nil end
  for k = i + 2, i + n - 1 do
    local b = byte(s, k)
    if not b or b < 0x80 or b > 0xBF then return nil end
  end
  return n
end

-- Lua 5.4's utf8.len refuses what the check below refuses (overlong forms,
-- surrogates, past U+10FFFF), in C rather than byte by byte in Lua; 5.3's
-- takes surrogates, so there the check below does it.
local utf8_lib = rawget(_G, "utf8")
local utf8_len = _VERSION == "Lua 5.4" and utf8_lib and utf8_lib.len

--- text.is_utf8(s): whether s is well-formed UTF-8.
function text.is_utf8(s)
  if utf8_len then return utf8_len(s) ~= nil end
  local i = find(s, "[\128-\255]")
  while i do
    local n = sequence_at(s, i)
    if not n then return false end
    i = find(s, "[\128-\255]", i + n)
  end
  return true
end

--- text.printable(s): s as UTF-8, each byte that is not part of a
-- well-formed sequence replaced by U+FFFD.
function text.printable(s)
  if text.is_utf8(s) then return s end
  local out, from, i = {}, 1, find(s, "[\128-\255]")
  while i do
    local n = sequence_at(s, i)
    if n then
      i = find(s, "[\128-\255]", i + n)
    else
      out[#out + 1] = sub(s, from, i - 1)
      out[#out + 1] = "\239\191\189"
      from = i + 1
      i = find(s, "[\128-\255]", from)
    end
  end
  out[#out + 1] = sub(s, from)
  return concat(out)
end

local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local DIGIT, VALUE = {}, {}
for i = 1, 64 do
  DIGIT[i - 1] = sub(ALPHABET, i, i)
  VALUE[byte(ALPHABET, i)] = i - 1
end

--- text.base64(s): RFC 4648 base64, padded.
function text.base64(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = byte(s, i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    out[#out + 1] = DIGIT[floor(n / 262144)] .. DIGIT[floor(n / 4096) % 64]
      .. (b and DIGIT[floor(n / 64) % 64] or "=") .. (c and DIGIT[n % 64] or "=")
  end
  return concat(out)
end

--- bytes | nil = text.base64_decode(s): nil when s is not padded base64.
function text.base64_decode(s)
  if #s % 4 ~= 0 or find(s, "[^%w+/=]") or find(s, "=[^=]") or find(s, "===") then return nil end
  local out = {}
  for i = 1, #s, 4 do
    local a, b, c, d = byte(s, i, i + 3)
    local pad_c, pad_d = c == 61, d == 61
    if VALUE[a] == nil or VALUE[b] == nil or (pad_c and not pad_d) then return nil end
    local n = VALUE[a] * 262144 + VALUE[b] * 4096 + (pad_c and 0 or VALUE[c] * 64) + (pad_d and 0 or VALUE[d])
    local bytes = char(floor(n / 65536), floor(n / 256) % 256, n % 256)
    if pad_c then
      bytes = sub(bytes, 1, 1)
    elseif pad_d then
      bytes = sub(bytes, 1, 2)
    end
    out[#out + 1] = bytes
    if (pad_c or pad_d) and i + 4 <= #s then return nil end
  end
  return concat(out)
end

return text
