-- Where the command's results go: a file or standard output whose every
-- write is checked (a full disk or a closed pipe is an error, as it is to
-- curl), and batch's result lines, always valid UTF-8 JSON.
local headers = require "ratewise.headers"
local json = require "ratewise.json"
local text = require "ratewise.cli.text"

local format, find, sub = string.format, string.find, string.sub
local floor = math.floor
local ENOENT = 2 -- POSIX systems' number for a file that does not exist

local output = {}

-- The exit status of a write that failed (curl's CURLE_WRITE_ERROR).
output.WRITE_FAILED = 23

local Writer = {}
Writer.__index = Writer

--- writer | nil, why = output.open(path [, append]): path nil or "-" is
-- standard output; append adds to the end of a file rather than replace it.
function output.open(path, append)
  if not path or path == "-" then return setmetatable({ file = io.stdout, name = "standard output" }, Writer) end
  local f, err = io.open(path, append and "ab" or "wb")
  if not f then return nil, "cannot write " .. tostring(err) end
  return setmetatable({ file = f, name = path }, Writer)
end

--- true | nil, why = writer:write(...): writes and flushes. After a failure
-- nothing more is written, and writer.failed says why.
function Writer:write(...)
  if self.failed then return nil, self.failed end
  local ok, err = self.file:write(...)
  if ok then ok, err = self.file:flush() end
  if not ok then
    self.failed = format("cannot write to %s: %s", self.name, tostring(err))
    return nil, self.failed
  end
  return true
end

--- true | nil, why = writer:close(): closes a file (standard output is
-- flushed, and left open).
function Writer:close()
  local f = self.file
  if f == io.stdout then
    local ok, err = f:flush()
    if not ok and not self.failed then self.failed = format("cannot write to %s: %s", self.name, tostring(err)) end
  elseif io.type(f) == "file" then
    local ok, err = f:close()
    if not ok and not self.failed then self.failed = format("cannot write to %s: %s", self.name, tostring(err)) end
  end
  if self.failed then return nil, self.failed end
  return true
end

-- A body as a result's field: "body" when it is UTF-8, "body_base64" when
-- it is not (JSON cannot hold other bytes).
local function put_body(r, body)
  if body == nil then return end
  if text.is_utf8(body) then r.body = body else r.body_base64 = text.base64(body) end
end

-- Seconds to the millisecond: what a clock's difference holds past that
-- is noise (3.3471213610001).
local function milliseconds(seconds)
  if type(seconds) ~= "number" then return seconds end
  return floor(seconds * 1000 + 0.5) / 1000
end

--- The method of a request as its result shows it.
function output.shown_method(req)
  return text.printable((req.method or ((req.body or req.json) and "POST" or "GET")):upper())
end

--- The URL of a request as its result shows it (userinfo redacted).
function output.shown_url(req)
  return text.printable(headers.redact_url(req.url))
end

-- A usage object's counts only (numbers, and objects of them such as
-- OpenAI's prompt_tokens_details): nothing else of an answer is copied.
local function counts(t, depth)
  local kept, any = {}, false
  for k, v in pairs(t) do
    if type(k) == "string" then
      if type(v) == "number" and v == v and v > -math.huge and v < math.huge then
        kept[k], any = v, true
      elseif type(v) == "table" and depth < 3 then
        local inner = counts(v, depth + 1)
        if inner then kept[k], any = inner, true end
      end
    end
  end
  return any and kept or nil
end

-- Fields of b over those of a (a stream tells its usage in parts:
-- Anthropic's message_start, then message_delta's output).
local function merged(a, b)
  if not a then return b end
  for k, v in pairs(b) do a[k] = v end
  return a
end

--- usage | nil = output.usage(res): the usage an answer reports: its JSON
-- body's "usage", or a stream's (server-sent events read whole), from the
-- events that tell it: OpenAI's include_usage chunk, Anthropic's
-- message_start (message.usage) and message_delta (usage).
function output.usage(res)
  local body = res and res.body
  if type(body) ~= "string" then return nil end
  if find(body, "^%s*{") then
    local value = json.decode(body)
    return type(value) == "table" and type(value.usage) == "table" and counts(value.usage, 1) or nil
  end
  if not find(body, "data:", 1, true) then return nil end
  local found
  local ok = pcall(function()
    for event in res:events() do
      local data = event.data and find(event.data, "^%s*{") and json.decode(event.data)
      if type(data) == "table" then
        local told = type(data.usage) == "table" and data.usage
          or type(data.message) == "table" and type(data.message.usage) == "table" and data.message.usage
        if told then found = merged(found, counts(told, 1) or {}) end
      end
    end
  end)
  return ok and found and next(found) and found or nil
end

--- line = output.result_line(item, req, res, err, no_body): the JSON line of
-- one result: the request's line number, id, method and URL (userinfo
-- redacted), then its response (with the usage it reports) or error.
function output.result_line(item, req, res, err, no_body)
  local r = { line = item.n }
  if req then
    r.id = req.id
    r.url = output.shown_url(req)
    r.method = output.shown_method(req)
  end
  if res then
    r.ok, r.status, r.attempts, r.elapsed = true, res.status, res.attempts, milliseconds(res.elapsed)
    r.usage = output.usage(res)
    if not no_body then put_body(r, res.body) end
  else
    r.ok = false
    r.error = { kind = err.kind or "input", message = text.printable(tostring(err.message or err)) }
    r.status, r.attempts, r.elapsed = err.status, err.attempts, milliseconds(err.elapsed)
    if err.response and not no_body then put_body(r, err.response.body) end
  end
  -- (json.encode writes "/" as it is: a grep for a URL finds it)
  return json.encode(r, "ratewise batch: a result")
end

-- Whether a result holds an answer that --resume keeps: one that
-- succeeded, or a terminal one (a 404 stays a 404). A result that was
-- throttled, cut short, cancelled (even in flight, which the server may
-- have received) or never sent is sent again.
local function is_answer(r)
  return r.ok == true or (type(r.error) == "table" and r.error.kind == "terminal")
end

--- answered, unfinished | nil, why = output.answered(path, key): the set
-- of the keys, key(line, id, method, url), of the results in the file at
-- path that hold an answer (none when there is no file yet); unfinished
-- when its last line has no end (a process killed while it wrote), which
-- is not read.
function output.answered(path, key)
  local answered = {}
  local f, err, code = io.open(path, "rb")
  if not f then
    if code == ENOENT then return answered, false end
    return nil, format("--resume cannot read %s", tostring(err))
  end
  local all, read_err = f:read("*a")
  f:close()
  if not all then return nil, format("--resume cannot read %s: %s", path, tostring(read_err)) end
  for line in string.gmatch(all, "([^\n]*)\n") do
    local r = find(line, "^{") and json.decode(line)
    if type(r) == "table" and type(r.line) == "number" and is_answer(r) then
      local k = key(r.line, r.id, r.method, r.url)
      if k then answered[k] = true end
    end
  end
  return answered, #all > 0 and sub(all, -1) ~= "\n"
end

return output
