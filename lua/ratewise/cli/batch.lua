-- `ratewise batch`: one request per line of the input, started as the lines
-- arrive, at most --concurrency at a time, one JSON line per result. Every
-- line read gets its result line, whatever happens to the others: a line
-- that is not a request gets its own error; a stop signal (Ctrl-C, SIGTERM,
-- SIGHUP) or a write that fails stops the starting of new ones, the
-- requests in flight get a short grace, and those still running after it
-- and those never started are written as cancelled. The bar and the
-- summary count what was sent or answered; the lines never sent are
-- counted apart. With --resume, the lines already answered in the output
-- file are skipped.
local rw = require "ratewise"
local core = require "ratewise.core"
local compat = require "ratewise.compat"
local scheduler = require "ratewise.scheduler"
local json = require "ratewise.json"
local input = require "ratewise.cli.input"
local output = require "ratewise.cli.output"
local progress = require "ratewise.cli.progress"
local timeline = require "ratewise.cli.timeline"

local format = string.format

local batch = {}

-- How long the requests in flight may go on after an interrupt or a failed
-- write before they are cancelled.
batch.GRACE = 2

-- The exit status after a stop signal: 128 + its number, as a shell reports
-- a command that signal ended (130 for Ctrl-C's SIGINT).
batch.SIGNAL_EXIT = 128

-- The LLM providers' per-minute limits (--rpm, --tpm, --itpm, --otpm): each
-- flag, the provider whose limit it is, the limit's name in rw.limiters,
-- and its title in a timeline.
batch.LLM_LIMITS = {
  { flag = "--rpm", field = "rpm", name = "requests", title = "requests" },
  { flag = "--tpm", field = "tpm", name = "tokens", title = "tokens", provider = "openai" },
  { flag = "--itpm", field = "itpm", name = "input_tokens", title = "input tokens", provider = "anthropic" },
  { flag = "--otpm", field = "otpm", name = "output_tokens", title = "output tokens", provider = "anthropic" },
}

-- The stop signals' numbers (the same on every POSIX system).
local SIGNAL_NAMES = { [1] = "SIGHUP", [2] = "SIGINT", [15] = "SIGTERM" }

--- What a stop signal did, said: "interrupted" for Ctrl-C's SIGINT.
function batch.stopped_by(signal)
  if signal == 2 then return "interrupted" end
  return "stopped by " .. (SIGNAL_NAMES[signal] or ("signal " .. tostring(signal)))
end

-- A result's key in the output file, the same when --resume reads it back:
-- the line's "id" when it has one, else its line number, method and URL as
-- the result shows them.
local function result_key(n, id, method, url)
  if id ~= nil then return type(id) .. " " .. tostring(id) end
  if url == nil then return nil end
  return format("line %d %s %s", n, method, url)
end

--- status = batch.run(path, o, err_out, base, fail): base: the fetch
-- options every request shares; fail(status, message) raises the command's
-- error (a missing input, an output that cannot be opened).
function batch.run(path, o, err_out, base, fail)
  -- Every result is a JSON line: the codec is loaded before any request
  -- holds a descriptor (under descriptor pressure require finds nothing),
  -- and without one nothing is sent.
  local has_codec, no_codec = json.load()
  if not has_codec then fail(output.WRITE_FAILED, "batch writes its results as JSON, and %s", no_codec) end
  local reader, why = input.open(path)
  if not reader then fail(2, why) end
  local answered, unfinished_line -- --resume: the keys answered before
  if o.resume then
    answered, unfinished_line = output.answered(o.output, result_key)
    if not answered then fail(2, unfinished_line) end
  end
  local out
  out, why = output.open(o.output, o.resume)
  if not out then fail(output.WRITE_FAILED, why) end
  -- (a line cut short by a process killed mid-write is not run into)
  if unfinished_line then out:write("\n") end

  -- done: results of requests sent or answered; not_sent: those of lines
  -- a stop left unsent, counted apart; skipped: lines --resume found answered
  local st = { done = 0, ok = 0, failed = 0, not_sent = 0, skipped = 0, retries = 0, throttled = 0, errors = {},
    waits = {}, started = rw.now(), unwritten = 0, unencoded = 0 }
  local stop_reason -- "signal" or "write" once the batch stops starting requests
  local signal -- the stop signal's number
  local function stopping() return stop_reason ~= nil end

  -- --timeline: what the run took of each limit, its 429s and its waits
  local drawing
  if o.timeline then
    local limits = { { name = "requests", title = "requests",
      per_minute = o.rpm or (o.rate and o.rate * 60) or nil } }
    for _, limit in ipairs(batch.LLM_LIMITS) do
      if limit.name ~= "requests" and o[limit.field] then
        limits[#limits + 1] = { name = limit.name, title = limit.title, per_minute = o[limit.field] }
      end
    end
    drawing = timeline.new(limits, st.started)
    -- (a file that cannot be written is said before anything is sent; it
    -- is written whole at the end)
    local f, ferr = io.open(o.timeline, "ab")
    if not f then fail(output.WRITE_FAILED, "cannot write the timeline: %s", tostring(ferr)) end
    f:close()
  end

  local show_progress = o.progress or (not o.no_progress and core.isatty(2))
  -- results on the terminal the bar is drawn on: the bar is cleared first
  local shares_terminal = show_progress and out.file == io.stdout and core.isatty(1)
  local drawn = false
  local function draw()
    local total = reader:total()
    st.total = total and total - st.skipped
    err_out:write("\r", progress.line(st, progress.width(2)), "\27[K")
    err_out:flush()
    drawn = true
  end

  local events = function(ev)
    if ev.type == "retry" then
      st.retries = st.retries + 1
      st.waits[compat.running() or "main"] = rw.now() + ev.delay
      if drawing then drawing:waited("retry", rw.now(), ev.delay) end
    elseif ev.type == "response" then
      st.waits[compat.running() or "main"] = nil
      -- (each attempt, drawn when its answer came)
      if drawing then drawing:took("requests", 1, rw.now()) end
      -- a 429, or an answer the policy read as a throttle (a 503 with
      -- Retry-After, GitHub's 403 with its quota spent)
      if ev.throttled or ev.status == 429 then
        st.throttled = st.throttled + 1
        if drawing then drawing:throttled(rw.now()) end
      end
    end
  end
  base.on_event, base.on_retry = events, false

  -- task coroutine -> true once a request of it may have reached the
  -- server; refused: those the limiter turned away after a stop
  local started, refused = {}, {}
  local limited = base.limiter ~= nil
  if limited then
    -- The limiter's tokens tell a request that goes out from one still
    -- queued (which a stop cancels at once: it was never sent); after a
    -- stop none is given, not even to a retry. Every other method (observe,
    -- a provider's sync) is the bucket's own.
    local bucket = base.limiter
    local capacity = type(bucket.capacity) == "function" and bucket:capacity()
    local named = type(capacity) == "table"
    -- The tokens taken, net of the providers' corrections, for the bar.
    local function count(cost, sign)
      if not named or type(cost) ~= "table" then return end
      for name, n in pairs(cost) do
        if name ~= "requests" and type(n) == "number" and capacity[name] then
          st.tokens[name] = (st.tokens[name] or 0) + sign * n
          if drawing then drawing:took(name, sign * n, rw.now()) end
        end
      end
    end
    st.tokens = named and {} or nil
    local own = {
      acquire = function(_, n, sleep, max_wait)
        local me = compat.running() or "main"
        local granted, wait = false, nil
        local asked = rw.now()
        if not stop_reason then granted, wait = bucket:acquire(n, sleep, max_wait) end
        -- (a wait shorter than a frame of the picture is not drawn)
        if granted and drawing and rw.now() - asked > 0.005 then
          drawing:waited("limit", asked, rw.now() - asked)
        end
        if granted and stop_reason then granted = false end
        if granted then
          started[me] = true
          count(n, 1)
        elseif stop_reason then
          refused[me] = true
        end
        return granted, wait
      end,
      settle = bucket.settle and function(_, taken, actual)
        bucket:settle(taken, actual)
        if type(actual) == "table" and type(taken) == "table" then
          local change = {}
          for name, n in pairs(actual) do
            if type(n) == "number" and type(taken[name]) == "number" then change[name] = n - taken[name] end
          end
          count(change, 1)
        end
      end or nil,
      refund = bucket.refund and function(_, n)
        bucket:refund(n)
        count(n, -1)
      end or nil,
    }
    base.limiter = setmetatable(own, { __index = function(_, name)
      local value = bucket[name]
      if type(value) ~= "function" then return value end
      return function(_, ...) return value(bucket, ...) end
    end })
  end

  -- The line's request (parsed once), or nil and why it is not one.
  local function request_of(item)
    if item.req == nil and item.why == nil then
      item.req, item.why = input.parse_line(item.text, item.n, item.too_long)
    end
    return item.req, item.why
  end

  -- One result: counted, then written (unless a write failed before).
  -- never_sent: a line a stop left unsent, counted apart.
  local function record(item, req, res, err, never_sent)
    st.waits[compat.running() or "main"] = nil
    if never_sent then
      st.not_sent = st.not_sent + 1
    else
      st.done = st.done + 1
      if res then
        st.ok = st.ok + 1
      else
        st.failed = st.failed + 1
        st.errors[err.kind or "input"] = (st.errors[err.kind or "input"] or 0) + 1
      end
    end
    local encoded, line = pcall(output.result_line, item, req, res, err, o.no_body)
    if not encoded then
      -- Still a line for it, with what can be written without the codec,
      -- and the batch ends in failure, saying why.
      st.unencoded = st.unencoded + 1
      st.unencoded_why = st.unencoded_why or tostring(line)
      local status = (res or err or {}).status
      local has_status = type(status) == "number" and status % 1 == 0
      line = format('{"line":%d,"ok":false,%s"error":{"kind":"internal","message":"the result could not be '
        .. 'written as JSON"}}', item.n, has_status and format('"status":%d,', status) or "")
    end
    if shares_terminal and drawn then err_out:write("\r\27[K") end
    if not out:write(line, "\n") then
      st.unwritten = st.unwritten + 1
      stop_reason = stop_reason or "write"
    end
    if shares_terminal and drawn then draw() end
  end

  local function cancelled(item, in_flight)
    local req = request_of(item)
    local reason = stop_reason == "write" and "the results could not be written"
      or "the batch was " .. batch.stopped_by(signal)
    record(item, req, nil, { kind = "cancelled", message = in_flight
      and format("%s while it was in flight: the server may have received it", reason)
      or format("not sent: %s", reason) }, not in_flight)
  end

  -- Whether --resume found the line answered before.
  local function answered_before(item)
    if not answered then return false end
    local req = request_of(item)
    local key = req and result_key(item.n, req.id, output.shown_method(req), output.shown_url(req))
    return key ~= nil and answered[key] == true
  end

  local function send(item)
    local req, line_why = request_of(item)
    if not req then return record(item, nil, nil, { kind = "input", message = line_why }) end
    local me = compat.running() or "main"
    if not limited then started[me] = true end
    local opts = setmetatable({}, { __index = base })
    local h = {}
    for k, v in pairs(base.headers) do h[k] = v end
    if req.headers then for k, v in pairs(req.headers) do h[k] = v end end
    opts.headers, opts.method, opts.body, opts.json = h, req.method, req.body, req.json
    if req.idempotency_key ~= nil then opts.idempotency_key = req.idempotency_key end
    local ok, res, err = compat.pcall(rw.fetch, req.url, opts)
    if ok and not (res == nil and refused[me]) then return record(item, req, res, err) end
    if ok or res == scheduler.CANCELLED then return cancelled(item, started[me]) end
    record(item, req, nil, { kind = "input", message = tostring(res) })
  end

  local trap = core.trap_stop_signals()
  local ok, err = compat.pcall(rw.run, function()
    local slots = rw.semaphore(o.concurrency or 4)
    local in_flight = {} -- task -> item
    local coroutine_of = {} -- task -> its coroutine (the key of started)
    local watcher = rw.spawn(function()
      while true do
        if not stop_reason then
          signal = core.interrupted() or nil
          if signal then stop_reason = "signal" end
        end
        if show_progress then draw() end
        rw.sleep(0.1)
      end
    end)
    local function free_slot()
      while not stop_reason do
        if slots:acquire(0.1) then
          -- (the result that freed it may have been the one whose write failed)
          if not stop_reason then return true end
          slots:release()
        end
      end
      return false
    end
    local unsent
    while not stop_reason do
      local item = reader:next(stopping)
      if not item then break end
      if answered_before(item) then
        st.skipped = st.skipped + 1
      elseif not free_slot() then
        unsent = item
        break
      else
        local task
        task = rw.spawn(function()
          local me = compat.running()
          coroutine_of[task] = me
          local sent, why_not = compat.pcall(send, item)
          in_flight[task], coroutine_of[task] = nil, nil
          slots:release()
          if why_not == scheduler.CANCELLED then
            cancelled(item, started[me])
          elseif not sent then
            record(item, nil, nil, { kind = "internal", message = tostring(why_not) })
          end
          started[me], refused[me] = nil, nil
        end)
        in_flight[task] = item
      end
    end
    -- The requests in flight end; after a stop, within the grace.
    local grace_ends
    while next(in_flight) do
      if stop_reason then
        grace_ends = grace_ends or rw.now() + batch.GRACE
        local graced = rw.now() >= grace_ends
        for task, item in pairs(in_flight) do
          if task:status() == "done" then -- cancelled before it ever ran
            in_flight[task] = nil
            cancelled(item, false)
          elseif graced or not started[coroutine_of[task]] then
            -- (one queued for a token has sent nothing: it goes at once)
            task:cancel()
          end
        end
      end
      rw.sleep(0.05)
    end
    if stop_reason then
      if unsent then cancelled(unsent, false) end
      -- what is left of a file (standard input is left unread: it may never end)
      if reader.lines then
        for item in function() return reader:next(function() return false end) end do
          if answered_before(item) then st.skipped = st.skipped + 1 else cancelled(item, false) end
        end
      end
    end
    watcher:cancel()
  end)
  -- (one that came as the last result was written still ends the command so)
  signal = signal or core.interrupted() or nil
  if trap then core.release_stop_signals(trap) end
  if not ok then error(err, 0) end
  if show_progress then
    draw()
    err_out:write("\n")
  end
  out:close()
  local undrawn
  if drawing then
    local drawn_ok, draw_err = drawing:write(o.timeline, rw.now())
    if not drawn_ok then
      undrawn = true
      err_out:write("ratewise: ", draw_err, "\n")
    end
  end
  if reader.failed then err_out:write("ratewise: ", reader.failed, "\n") end
  if out.failed then err_out:write("ratewise: ", out.failed, "\n") end
  if st.unencoded_why then
    err_out:write("ratewise: a result could not be written as JSON: ", st.unencoded_why, "\n")
  end
  local line = progress.summary(st)
  if st.unwritten > 0 then line = line .. format("; %d result%s not written", st.unwritten,
    st.unwritten == 1 and "" or "s") end
  if st.unencoded > 0 then line = line .. format("; %d result%s not written as JSON", st.unencoded,
    st.unencoded == 1 and "" or "s") end
  err_out:write(line, "\n")
  if signal then return batch.SIGNAL_EXIT + signal end
  if out.failed or st.unencoded > 0 or undrawn then return output.WRITE_FAILED end
  if reader.failed then return 2 end
  return st.failed == 0 and 0 or 1
end

return batch
