-- Where the command's results go: a file or standard output whose every
-- write is checked (a full disk or a closed pipe is an error, as it is to
-- curl), and batch's result lines, always valid UTF-8 JSON.
local headers = require "ratewise.headers"
local json = require "ratewise.json"
local text = require "ratewise.cli.text"

local format = string.format

local output = {}

-- The exit status of a write that failed (curl's CURLE_WRITE_ERROR).
output.WRITE_FAILED = 23

local Writer = {}
Writer.__index = Writer

--- writer | nil, why = output.open(path): path nil or "-" is standard output.
function output.open(path)
  if not path or path == "-" then return setmetatable({ file = io.stdout, name = "standard output" }, Writer) end
  local f, err = io.open(path, "wb")
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

--- line = output.result_line(item, req, res, err, no_body): the JSON line of
-- one result: the request's line number, id, method and URL (userinfo
-- redacted), then its response or error.
function output.result_line(item, req, res, err, no_body)
  local r = { line = item.n }
  if req then
    r.id = req.id
    r.url = text.printable(headers.redact_url(req.url))
    r.method = text.printable((req.method or ((req.body or req.json) and "POST" or "GET")):upper())
  end
  if res then
    r.ok, r.status, r.attempts, r.elapsed = true, res.status, res.attempts, res.elapsed
    if not no_body then put_body(r, res.body) end
  else
    r.ok = false
    r.error = { kind = err.kind or "input", message = text.printable(tostring(err.message or err)) }
    r.status, r.attempts, r.elapsed = err.status, err.attempts, err.elapsed
    if err.response and not no_body then put_body(r, err.response.body) end
  end
  return json.encode(r, "ratewise batch: a result")
end

return output
