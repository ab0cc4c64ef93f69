-- What a response can do besides carry its fields (status, headers, body):
-- the methods of every response fetch returns, res:json() and, for a
-- response read as it arrives (the stream option), res:read(),
-- res:chunks(), res:events() and res:close().
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local headers = require "ratewise.headers"
local json = require "ratewise.json"
local runtime = require "ratewise.runtime"

local format, concat, match, sub = string.format, table.concat, string.match, string.sub
local type, error, setmetatable, rawget = type, error, setmetatable, rawget
local response_headers = core.response_headers

local response = {}

local methods = {}

-- The fields made from the raw header block (res._head, kept by the
-- engine's transfer:result(true)) when one of them is first read: most
-- responses' headers are never looked at, and building their tables for
-- every response would be work for nothing (and for the collector).
local from_head = { headers = true, header_lists = true, trailers = true }

local function wrap_headers(res)
  local h, t = rawget(res, "headers"), rawget(res, "trailers")
  if h then res.headers = headers.wrap(h) end
  if t then res.trailers = headers.wrap(t) end
end

-- What transfer:result(true) leaves out when a response has it (no
-- redirect followed, HTTP/1.1): a smaller table for most responses.
local usual = { redirects = 0, http_version = "1.1" }

response.mt = {
  __index = function(res, key)
    if from_head[key] then
      if rawget(res, "_head") == nil then return nil end
      response_headers(res)
      wrap_headers(res)
      return rawget(res, key)
    end
    local method = methods[key]
    if method == nil then return usual[key] end
    return method
  end,
}

-- res -> what reading its stream needs: { transfer, per_call, what (the
-- "GET url" of messages), delivered (bytes handed over), ended, err,
-- guard }. Weak keys: a response dropped unread takes its stream with it;
-- the guard closes the transfer then (the engine holds every running
-- transfer, and a paused one would never end on its own).
local streams = setmetatable({}, { __mode = "k" })
-- Responses not streamed whose body res:read() has given.
local read_whole = setmetatable({}, { __mode = "k" })

-- Why file `path` cannot be read (nil: it can), and whether it is a folder.
local function unreadable(path)
  local f, err = io.open(path, "rb")
  if not f then return match(err, ": ([^:]*)$") or err, false end
  local _, read_err = f:read(1)
  f:close()
  if read_err then return read_err, match(read_err, "[Ii]s a directory") ~= nil end
  return nil, false
end

-- libcurl reports a pin file it cannot read as a pin mismatch, and a
-- ca_path folder that is not there as an unknown issuer: the error names
-- the file and says what is wrong with it. (CURLcode numbers never change.)
local CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_PINNEDPUBKEYNOTMATCH = 60, 90

--- why | nil = response.tls_file_problem(opts, code): for a transport
-- failure of CURLcode `code`, what is wrong with a file the request's
-- options name, when that is what failed.
function response.tls_file_problem(opts, code)
  local pin, folder = opts.pinned_public_key, opts.ca_path
  if code == CURLE_SSL_PINNEDPUBKEYNOTMATCH and type(pin) == "string" and sub(pin, 1, 8) ~= "sha256//" then
    local why = unreadable(pin)
    if why then return format("the pinned_public_key file %s cannot be read (%s)", pin, why) end
  elseif code == CURLE_PEER_FAILED_VERIFICATION and type(folder) == "string" then
    local why, is_folder = unreadable(folder)
    if why and not is_folder then return format("the ca_path folder %s cannot be read (%s)", folder, why) end
    if not why then return format("ca_path %s is a file, not a folder (ca_file takes a file)", folder) end
  end
  return nil
end

--- res = response.new(res): gives a response table its methods, and its
-- header tables their case-insensitive lookup (now, or when first read).
function response.new(res)
  if rawget(res, "headers") then wrap_headers(res) end
  return setmetatable(res, response.mt)
end

-- What a stream's body read whole may come to (res:json(), a response
-- drained) when the call names no max_body: the engine's own limit on a
-- body read whole.
local DEFAULT_MAX_BODY = 64 * 1024 * 1024

--- response.stream(res, transfer, per_call_sleep, what [, max_body]):
-- makes res the reader of a streamed transfer whose headers are in.
-- max_body: the call's, which bounds a read of the whole body too.
function response.stream(res, transfer, per_call, what, max_body)
  streams[res] = { transfer = transfer, per_call = per_call, what = what, delivered = 0,
    max_body = max_body or DEFAULT_MAX_BODY, guard = compat.on_collect(function() transfer:close() end) }
end

-- What an event can do: event:json().
local event_methods = {}
local event_mt = { __index = event_methods }

-- The most bytes of a body parsed for events at once.
local EVENT_SLICE = 16 * 1024

-- Hands the events of `chunk` to fn, a slice at a time (as res:events()
-- parses); false when the chunk does not parse as an event stream.
local function feed_events(parser, chunk, fn)
  for at = 1, #chunk, EVENT_SLICE do
    local got = parser:feed(#chunk > EVENT_SLICE and chunk:sub(at, at + EVENT_SLICE - 1) or chunk)
    if not got then return false end
    for i = 1, #got do fn(setmetatable(got[i], event_mt)) end
  end
  return true
end

-- The events of a chunk handed over, to the watcher. A body that is not
-- an event stream stops the watching: its reader, not the watcher, has a
-- say on what it is.
local function watch_events(st, chunk)
  if not feed_events(st.watch_parser, chunk, st.watcher.event) then
    st.watch_parser:close()
    st.watch_parser = nil
  end
end

--- response.watch(res, watcher): tells watcher what a stream handed to
-- the caller says (a policy's stream_usage, the usage its events report):
-- watcher.event(event) for each server-sent event of its body as it is
-- read, whatever reads it (read, chunks, events, json), and watcher.ended(
-- err) once, when the stream ends, breaks off (err), or is closed. A
-- stream whose transfer ended before it was handed over has its body
-- whole: its events are told, and its end, at once. A stream dropped
-- unread is not told: the collector closes its transfer, and nothing may
-- wait there (a shared limiter's round trip). watcher must not hold res:
-- on Lua 5.1 a weak key its own value holds is never collected.
function response.watch(res, watcher)
  local st = streams[res]
  if st then
    if st.ended then return end
    st.watcher = watcher
    if watcher.event then st.watch_parser = core.sse_parser() end
    return
  end
  local body = rawget(res, "body")
  if watcher.event and type(body) == "string" then
    local parser = core.sse_parser()
    feed_events(parser, body, watcher.event)
    parser:close()
  end
  watcher.ended(nil)
end

local function finish(st, err)
  st.ended, st.err = true, err
  if st.transfer then
    st.transfer:close()
    st.transfer = nil
  end
  if st.parser then st.parser:close() end
  local watcher = st.watcher
  if watcher then
    -- (told once: a close after the end finds the stream ended)
    st.watcher = nil
    if st.watch_parser then st.watch_parser:close() end
    watcher.ended(err)
  end
  return nil, err
end

--- chunk | nil | nil, err = res:read(): the body bytes that arrived since
-- the last read (waiting for some, the way the host waits); nil at the
-- end; nil, err when the stream broke off (kind "stream", with
-- err.delivered bytes handed over before). A response that was not
-- streamed gives its whole body once.
function methods:read()
  local st = streams[self]
  if not st then
    if read_whole[self] then return nil end
    read_whole[self] = true
    return self.body ~= "" and self.body or nil
  end
  if st.ended then return nil, st.err end
  local transfer, chunk = st.transfer, nil
  -- A host may look again after the answer was yes: the chunk taken stays.
  runtime.await_news(transfer, function()
    if chunk == nil then chunk = transfer:read() end
    return chunk ~= nil
  end, st.per_call)
  if chunk then
    st.delivered = st.delivered + #chunk
    if st.watch_parser then watch_events(st, chunk) end
    return chunk
  end
  local res, terr = transfer:result()
  if res then return finish(st, nil) end
  return finish(st, errors.new("stream", format("%s: the stream broke off after %d bytes of its body: %s",
    st.what, st.delivered, tostring(terr.message)), { delivered = st.delivered, transport = terr,
    status = self.status, response = self }))
end

--- for chunk in res:chunks() do ... end: the body as it arrives. A
-- stream that breaks off raises its error (kind "stream"): the chunks
-- before it were the server's, the rest will not come.
function methods:chunks()
  return function()
    local chunk, err = self:read()
    if err then error(err, 2) end
    return chunk
  end
end

--- value | nil = event:json(): the event's data decoded as JSON; nil for
-- the data "[DONE]", with which OpenAI-style streams end. Raises for data
-- that is neither, naming the event: a loop that stops at nil never takes
-- a broken event for the end.
function event_methods:json()
  local data = self.data
  if data == "[DONE]" then return nil end
  local value, why = json.decode(data)
  if value == nil then
    error(format("event:json(): the data of event '%s' is not JSON: %s", self.event, why), 2)
  end
  return value
end

--- for event in res:events() do ... end: the body read as server-sent
-- events, each { event = name ("message" unless named), data = its data
-- lines joined with "\n", id = the stream's last event id (nil until one
-- came), retry = milliseconds, when the event said }, and event:json().
-- Raises as chunks()
-- does, and for an event-stream line or event over 1 MiB.
function methods:events()
  local st = streams[self]
  local parser = core.sse_parser()
  if st then st.parser = parser end
  local queue, head = {}, 1
  -- The chunk being parsed, a slice at a time: the events of one slice are
  -- handed over before the next is parsed, so that a large chunk (a body
  -- read whole) of small events is never made into tables all at once.
  local chunk, at = nil, 1
  return function()
    while true do
      -- (closed by the caller inside the loop: its parser with it)
      if st and st.ended and st.err == nil and chunk then return nil end
      local ev = queue[head]
      if ev then
        queue[head], head = nil, head + 1
        return setmetatable(ev, event_mt)
      end
      if not chunk or at > #chunk then
        local err
        chunk, err = self:read()
        at = 1
        if err then error(err, 2) end
        if not chunk then
          parser:close()
          return nil
        end
      end
      local slice = chunk
      if at > 1 or #chunk > EVENT_SLICE then slice = chunk:sub(at, at + EVENT_SLICE - 1) end
      at = at + EVENT_SLICE
      local got, perr = parser:feed(slice)
      if not got then
        local e = errors.new("stream", format("%s: %s", st and st.what or "the response", perr),
          { delivered = st and st.delivered, response = self })
        if st then finish(st, e) end
        error(e, 2)
      end
      queue, head = got, 1
    end
  end
end

--- res:close(): stops reading a streamed response; the transfer ends and
-- its connection closes (it cannot be reused mid-body). Idempotent.
function methods:close()
  local st = streams[self]
  if st and not st.ended then finish(st, nil) end
end

--- body | nil, err = response.drain(res [, timed]): the rest of a
-- streamed body, read whole into res.body; a body over the call's max_body
-- (64 MiB unless it names one), counting what was read before, ends the
-- stream with an error of kind "stream" instead. timed: the attempt's
-- timeout bounds the body too (a read within a call).
function response.drain(res, timed)
  local st = streams[res]
  if not st then return res.body end
  if timed and st.transfer then st.transfer:bound() end
  local parts = {}
  while true do
    local chunk, err = res:read()
    if err then return nil, err end
    if not chunk then break end
    if st.delivered > st.max_body then
      return finish(st, errors.new("stream", format("%s: the body is over max_body (%d bytes) for a read of "
        .. "the whole of it; the stream was closed (read it by chunks, or give a larger max_body)",
        st.what, st.max_body), { delivered = st.delivered, too_large = true, status = res.status,
        response = res }))
    end
    parts[#parts + 1] = chunk
  end
  res.body = concat(parts)
  streams[res] = nil
  return res.body
end

--- value | nil, err = res:json(): the body decoded as JSON, integers kept
-- as integers. A body that is not JSON answers nil and why. A streamed
-- response is read to its end first.
function methods:json()
  local body, err = self.body, nil
  if body == nil and streams[self] then body, err = response.drain(self) end
  if body == nil then return nil, err or "the response has no body to decode" end
  local value, why = json.decode(body)
  if value == nil then return nil, "response body is " .. why end
  return value
end

return response
