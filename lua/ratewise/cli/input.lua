-- What `ratewise batch` reads: the lines of a file or of standard input,
-- handed on as they arrive, and each line checked into a request (or the
-- reason it is not one). Nothing here repeats a header's value, or a
-- header line that may hold one, in a message.
local core = require "ratewise.core"
local headers = require "ratewise.headers"
local json = require "ratewise.json"
local runtime = require "ratewise.runtime"
local text = require "ratewise.cli.text"

local format, find, sub, gsub = string.format, string.find, string.sub, string.gsub
local concat = table.concat
local huge = math.huge
local EBADF = 9 -- POSIX systems' number for a descriptor that is not open
-- The UTF-8 byte order mark some editors (Windows' Notepad, Excel's "CSV
-- UTF-8") put at the start of a file: not part of its first line.
local BOM = "\239\187\191"

local input = {}

-- The keys a JSON line may have, as fetch refuses an option it does not know:
-- a misspelt "methd" must not send a GET.
local LINE_KEYS = { url = true, method = true, headers = true, body = true, body_base64 = true, json = true,
  id = true, idempotency_key = true }
local LINE_KEY_LIST = "url, method, headers, body, body_base64, json, id, idempotency_key"

local ORDINAL = { "1st", "2nd", "3rd" }
local function ordinal(i) return ORDINAL[i] or (i .. "th") end

--- ok | nil, why = input.check_header(name, value): a header the way fetch
-- will take it. why names the header only when its name is a field name
-- that is not a secret's, and never repeats a value.
function input.check_header(name, value)
  if type(name) ~= "string" or not headers.is_token(name) then
    return nil, "a header's name is not a valid HTTP field name (not shown: it may hold a credential)"
  end
  local subject = headers.is_secret(name) and "a secret header's" or format("header %s's", name)
  if type(value) ~= "string" then return nil, subject .. " value is not a string" end
  if find(value, "[%z\1-\8\10-\31\127]") then
    return nil, subject .. " value holds a control character (CR, LF, NUL or another)"
  end
  return true
end

--- name, value | nil, why = input.header_option(text, index): the
-- command line's -H 'Name: value' (the index-th -H).
function input.header_option(arg, index)
  local where = format("the %s -H", ordinal(index))
  local name, value = arg:match("^([^:]*):[ \t]*(.-)[ \t]*$")
  if not name then return nil, where .. " has no ':' between a name and a value" end
  local ok, why = input.check_header(name, value)
  if not ok then return nil, where .. ": " .. why end
  return name, value
end

local function finite(n) return n == n and n ~= huge and n ~= -huge end

-- A JSON line's fields, checked: the request | nil, why.
local function check_object(t)
  local unknown = {}
  for k in pairs(t) do
    if not LINE_KEYS[k] then
      -- a key that may be a pasted header line is not repeated
      local plain = type(k) == "string" and #k <= 40 and not find(k, "[^%w_%-]")
      unknown[#unknown + 1] = plain and format("%q", k) or "(one not shown)"
    end
  end
  if #unknown > 0 then
    table.sort(unknown)
    return nil, format("has unknown key%s %s (known: %s)", #unknown > 1 and "s" or "", table.concat(unknown, ", "),
      LINE_KEY_LIST)
  end
  if type(t.url) ~= "string" then return nil, "has no \"url\" string" end
  if t.method ~= nil and (type(t.method) ~= "string" or not headers.is_token(t.method)) then
    return nil, "has a \"method\" that is not a method name"
  end
  if t.id ~= nil and type(t.id) ~= "string" and not (type(t.id) == "number" and finite(t.id)) then
    return nil, "has an \"id\" that is neither a string nor a finite number"
  end
  if t.headers ~= nil then
    if type(t.headers) ~= "table" then return nil, "has \"headers\" that are not an object" end
    for name, value in pairs(t.headers) do
      if type(value) == "number" and finite(value) then value = tostring(value) end
      local ok, why = input.check_header(name, value)
      if not ok then return nil, why end
      t.headers[name] = value
    end
  end
  local bodies = (t.body ~= nil and 1 or 0) + (t.body_base64 ~= nil and 1 or 0) + (t.json ~= nil and 1 or 0)
  if bodies > 1 then return nil, "gives more than one of \"body\", \"body_base64\" and \"json\"" end
  if t.body ~= nil and type(t.body) ~= "string" then return nil, "has a \"body\" that is not a string" end
  if t.body_base64 ~= nil then
    local bytes = type(t.body_base64) == "string" and text.base64_decode(t.body_base64)
    if not bytes then return nil, "has a \"body_base64\" that is not base64" end
    t.body, t.body_base64 = bytes, nil
  end
  local key = t.idempotency_key
  if key ~= nil and key ~= true and (type(key) ~= "string" or not find(key, "%S") or find(key, "%c")) then
    return nil, "has an \"idempotency_key\" that is neither true nor a non-blank string"
  end
  return t
end

--- request | nil, why = input.parse_line(line, n [, too_long]): one line of the input,
-- a URL or a JSON object.
function input.parse_line(line, n, too_long)
  if too_long then
    return nil, format("line %d is longer than %d bytes (%d MiB): not read, not sent", n, input.MAX_LINE,
      math.floor(input.MAX_LINE / 1048576))
  end
  if sub(line, 1, 1) == "{" then
    local t, why = json.decode(line)
    if type(t) ~= "table" then return nil, format("line %d is not a JSON object: %s", n, tostring(why)) end
    local req
    req, why = check_object(t)
    if not req then return nil, format("line %d%s %s", n, find(why, "^has") and "" or ":", why) end
    return req
  end
  if find(line, "%s") then return nil, format("line %d is neither a URL nor a JSON object", n) end
  return { url = line }
end

---------------------------------------------------------------------------
-- Reading the lines

local function trim(line) return (gsub(gsub(line, "^%s+", ""), "%s+$", "")) end

--- Whether a line of the input is a request: not blank, not a # comment.
function input.is_request_line(line)
  return find(line, "^%s*[^%s#]") ~= nil
end

local Reader = {}
Reader.__index = Reader

-- The most one read of standard input takes.
local READ_SIZE = 16384
-- The longest line taken: a longer one (a binary file given by mistake, a
-- producer that never ends its line) is skipped to its end, kept in
-- memory no further, and answered with an input error of its own.
input.MAX_LINE = 8 * 1048576

--- reader | nil, why = input.open(path): the lines of the file, read
-- at once (so that the total is known), or of standard input for "-", read
-- as they arrive.
function input.open(path)
  local reader = setmetatable({ buffer = "", at = 1, pieces = {}, pending_bytes = 0, line_number = 0, count = 0,
    ended = false }, Reader)
  if path == "-" then
    -- A closed standard input is said so now: descriptor 0 would otherwise
    -- go to whatever is opened next (the engine's, libcurl's), and reading
    -- that would wait for ever. Seeking a closed one fails with EBADF (a
    -- pipe's, with ESPIPE).
    local _, why, code = io.stdin:seek("cur")
    if code == EBADF then return nil, "cannot read standard input: " .. tostring(why) end
    reader.fd = 0
    return reader
  end
  local f, err = io.open(path, "rb")
  if not f then return nil, format("cannot read %s", tostring(err)) end
  local lines = {}
  -- io.open opens a folder too; reading it fails
  local all, read_err = f:read("*a")
  f:close()
  if not all then return nil, format("cannot read %s: %s", path, tostring(read_err)) end
  local from, total = sub(all, 1, 3) == BOM and 4 or 1, 0
  while from <= #all do
    local stop = find(all, "\n", from, true) or #all + 1
    local line = sub(all, from, stop - 1)
    lines[#lines + 1] = line
    if input.is_request_line(line) then total = total + 1 end
    from = stop + 1
  end
  reader.lines, reader.next_line, reader.known_total = lines, 1, total
  return reader
end

-- More bytes of standard input: waits through the seam (the requests in
-- flight go on meanwhile) until some come, the input ends or stop() says
-- to give up. A descriptor epoll cannot watch (a regular file, /dev/null)
-- never blocks a read. A read that fails ends the input (reader.failed
-- says why).
function Reader:fill(stop)
  while true do
    if stop() then return false end
    local ready, err = runtime.await_fd(self.fd, "r", core.now() + 0.1)
    if ready or err then
      local bytes, why = core.read_fd(self.fd, READ_SIZE)
      if bytes == "" then return false end
      if bytes then
        self.buffer, self.at = bytes, 1
        return true
      end
      if why ~= "interrupted" then
        self.failed = "cannot read standard input: " .. why -- the input ends there
        return false
      end
    end
  end
end

-- The line begun so far, its pieces kept apart (a piece per read, each
-- searched once, joined once); a line past MAX_LINE keeps none of them.
local function line_done(self, last)
  local pieces, too_long = self.pieces, self.pending_bytes + #last > input.MAX_LINE
  local line = too_long and "" or (#pieces == 0 and last or concat(pieces) .. last)
  self.pieces, self.pending_bytes = {}, 0
  return line, too_long
end

-- The next line of the input (without its end) and whether it was too
-- long to keep, or nil at its end.
function Reader:raw_line(stop)
  if self.lines then
    local line = self.lines[self.next_line]
    self.lines[self.next_line] = nil
    self.next_line = self.next_line + 1
    if line and #line > input.MAX_LINE then return "", true end
    return line, false
  end
  while true do
    local i = find(self.buffer, "\n", self.at, true)
    if i then
      local last = sub(self.buffer, self.at, i - 1)
      self.at = i + 1
      return line_done(self, last)
    end
    local rest = sub(self.buffer, self.at)
    self.buffer, self.at = "", 1
    self.pending_bytes = self.pending_bytes + #rest
    if self.pending_bytes <= input.MAX_LINE then self.pieces[#self.pieces + 1] = rest else self.pieces = {} end
    if not self:fill(stop) then
      if stop() then return nil end
      if self.pending_bytes == 0 then return nil end
      return line_done(self, "")
    end
  end
end

--- item | nil = reader:next(stop): the next request line, { n = its
-- line number, text = the line }, skipping blank lines and # comments; nil
-- at the end of the input, or when stop() answers true while it waits.
function Reader:next(stop)
  while not self.ended do
    local line, too_long = self:raw_line(stop)
    if line == nil then
      if not stop() then self.ended = true end
      return nil
    end
    self.line_number = self.line_number + 1
    if self.line_number == 1 and sub(line, 1, 3) == BOM then line = sub(line, 4) end
    if too_long then
      self.count = self.count + 1
      return { n = self.line_number, text = "", too_long = true }
    end
    if input.is_request_line(line) then
      self.count = self.count + 1
      return { n = self.line_number, text = trim(line) }
    end
  end
  return nil
end

--- The number of request lines of the whole input: nil while standard
-- input has not ended.
function Reader:total()
  return self.known_total or (self.ended and self.count or nil)
end

return input
