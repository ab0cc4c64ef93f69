-- The ratewise command: `ratewise get URL` prints a body as curl does,
-- and `ratewise batch FILE` runs one request per line, with ratewise's
-- retries, waits and limits, writing one JSON line per result and, on a
-- terminal, a progress bar. bin/ratewise calls cli.main(arg).
local rw = require "ratewise"
local core = require "ratewise.core"
local compat = require "ratewise.compat"
local headers = require "ratewise.headers"
local json = require "ratewise.json"

local format, concat, rep = string.format, table.concat, string.rep
local floor, max, min = math.floor, math.max, math.min

local cli = {}

local USAGE = [[
usage: ratewise get URL [options]      print the body of a GET (or -X, -d) to stdout
       ratewise batch FILE [options]   one request per line of FILE (- for stdin):
                                       a URL, or a JSON object {"url", "method",
                                       "headers", "body", "json", "id"}; one JSON
                                       line per result on stdout
       ratewise help | --version

options:
  -H, --header 'Name: value'  a request header (repeatable)
  -X, --method METHOD         the method (get: GET, or POST with -d/--json)
  -d, --data TEXT             a request body (get)
      --json TEXT             a JSON request body (get), sent as application/json
  -i, --include               print the status line and headers before the body (get)
      --stream                print the body as it arrives (get)
  -o, --output FILE           write to FILE instead of stdout
      --retries N             retries after the first attempt (default 3)
      --max-elapsed SECONDS   the time budget of each request, waits included (default 120)
      --timeout SECONDS       each attempt's timeout (default 30)
      --rate N                at most N requests a second (a token bucket)
      --burst N               the bucket's capacity (default 1)
      --concurrency N         requests in flight at once (batch; default 4)
      --provider NAME         github, openai, anthropic, stripe or ietf
      --no-body               leave the bodies out of batch's results
      --progress, --no-progress   draw the progress bar, or not (default: on a terminal)
  -k, --insecure              do not verify TLS certificates
  -s, --silent                no retry lines on stderr

exit status: 0 when every request succeeded, 1 when one failed, 2 for bad usage.
]]

-- Raised for a bad command line; main() prints it with the usage.
local usage_mt = {}
local function usage_error(message, ...)
  error(setmetatable({ message = format(message, ...) }, usage_mt), 0)
end

local function number_arg(name, value, integer)
  local n = tonumber(value)
  if not n or n ~= n or n <= 0 or n == math.huge or (integer and n % 1 ~= 0) then
    usage_error("option %s needs a positive %s (got %s)", name, integer and "integer" or "number",
      value == nil and "nothing" or format("%q", value))
  end
  return n
end

-- name -> { field, kind }: kind is "flag", "string", "number", "integer" or "header"
local OPTIONS = {
  ["-H"] = { "headers", "header" }, ["--header"] = { "headers", "header" },
  ["-X"] = { "method", "string" }, ["--method"] = { "method", "string" },
  ["-d"] = { "data", "string" }, ["--data"] = { "data", "string" },
  ["--json"] = { "json", "string" },
  ["-i"] = { "include", "flag" }, ["--include"] = { "include", "flag" },
  ["--stream"] = { "stream", "flag" },
  ["-o"] = { "output", "string" }, ["--output"] = { "output", "string" },
  ["--retries"] = { "retries", "count" },
  ["--max-elapsed"] = { "max_elapsed", "number" },
  ["--timeout"] = { "timeout", "number" },
  ["--rate"] = { "rate", "number" },
  ["--burst"] = { "burst", "integer" },
  ["--concurrency"] = { "concurrency", "integer" },
  ["--provider"] = { "provider", "string" },
  ["--no-body"] = { "no_body", "flag" },
  ["--progress"] = { "progress", "flag" }, ["--no-progress"] = { "no_progress", "flag" },
  ["-k"] = { "insecure", "flag" }, ["--insecure"] = { "insecure", "flag" },
  ["-s"] = { "silent", "flag" }, ["--silent"] = { "silent", "flag" },
}

--- command, target, options = cli.parse(args)
function cli.parse(args)
  local o = { headers = {} }
  local positional = {}
  local i = 1
  local first = args[1]
  if first == "--version" or first == "help" or first == "--help" or first == "-h" then
    return first == "--version" and "--version" or "help", nil, o
  end
  while i <= #args do
    local a = args[i]
    local name, inline = a:match("^(%-%-[%w-]+)=(.*)$")
    name = name or a
    local spec = OPTIONS[name]
    if spec then
      local field, kind = spec[1], spec[2]
      if kind == "flag" then
        if inline then usage_error("option %s takes no value", name) end
        o[field] = true
      else
        local value = inline
        if value == nil then
          i = i + 1
          value = args[i]
        end
        if value == nil then usage_error("option %s needs a value", name) end
        if kind == "header" then
          local hname, hvalue = value:match("^([^:%s]+):%s*(.-)%s*$")
          if not hname or not headers.is_token(hname) then
            usage_error("option %s takes 'Name: value' (got %q)", name, value)
          end
          o.headers[hname] = hvalue
        elseif kind == "count" then
          local n = tonumber(value)
          if not n or n < 0 or n % 1 ~= 0 then usage_error("option %s needs a whole number (got %q)", name, value) end
          o[field] = n
        elseif kind == "number" or kind == "integer" then
          o[field] = number_arg(name, value, kind == "integer")
        else
          o[field] = value
        end
      end
    elseif a:sub(1, 1) == "-" and a ~= "-" then
      usage_error("unknown option %s", a)
    else
      positional[#positional + 1] = a
    end
    i = i + 1
  end
  local command = positional[1]
  if command == nil then usage_error("no command") end
  if command ~= "get" and command ~= "batch" then usage_error("unknown command %q", command) end
  if #positional ~= 2 then
    usage_error("%s takes one %s", command, command == "get" and "URL" or "FILE")
  end
  if o.provider and not rw.providers[o.provider] then
    usage_error("unknown provider %q (github, openai, anthropic, stripe or ietf)", o.provider)
  end
  if o.burst and not o.rate then usage_error("option --burst needs --rate") end
  return command, positional[2], o
end

-- The fetch options every request of a command line shares.
local function fetch_options(o, events)
  local opts = {
    max_retries = o.retries, max_elapsed = o.max_elapsed, timeout = o.timeout,
    policy = o.provider and rw.providers[o.provider] or nil,
    on_event = events,
  }
  -- (not `x and false or nil`: that is always nil)
  if o.insecure then opts.verify_tls = false end
  if o.silent or events then opts.on_retry = false end
  if o.rate then opts.limiter = rw.bucket { capacity = o.burst or 1, rate = o.rate } end
  if o.insecure then rw.configure { tls_warning = false } end
  return opts
end

local function open_output(path)
  if not path or path == "-" then return io.stdout end
  local f, err = io.open(path, "wb")
  if not f then error({ message = "cannot write " .. tostring(err) }, 0) end
  return f
end

---------------------------------------------------------------------------
-- ratewise get

local function print_head(out, res)
  out:write(format("HTTP/%s %d\r\n", res.http_version or "1.1", res.status))
  local names = {}
  for name in pairs(res.headers) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    for _, value in ipairs(rw.header_values(res, name)) do out:write(name, ": ", value, "\r\n") end
  end
  out:write("\r\n")
end

local function run_get(url, o, err_out)
  local opts = fetch_options(o)
  local h = {}
  for k, v in pairs(o.headers) do h[k] = v end
  opts.headers = h
  opts.method = o.method and o.method:upper() or nil
  if o.data and o.json then usage_error("give -d or --json, not both") end
  if o.data then opts.body = o.data end
  if o.json then
    local value, why = json.decode(o.json)
    if value == nil then usage_error("--json is not JSON: %s", why) end
    opts.body = o.json
    local typed = false
    for name in pairs(h) do typed = typed or name:lower() == "content-type" end
    if not typed then h["Content-Type"] = "application/json" end
  end
  opts.stream = o.stream or nil
  local out = open_output(o.output)
  local res, err = rw.fetch(url, opts)
  local shown = res or (err and err.response)
  if shown then
    if o.include then print_head(out, shown) end
    if res and o.stream then
      for chunk, cerr in function() return res:read() end do
        if cerr then break end
        out:write(chunk)
        out:flush()
      end
      local _, cerr = res:read()
      if cerr then err = cerr end
    else
      out:write(shown.body or "")
    end
  end
  if out ~= io.stdout then out:close() else out:flush() end
  if err then
    err_out:write(tostring(err), "\n")
    return 1
  end
  return 0
end

---------------------------------------------------------------------------
-- ratewise batch

-- One line of the input: a request, or why it is not one.
local function parse_line(line, n)
  if line:sub(1, 1) == "{" then
    local t, why = json.decode(line)
    if type(t) ~= "table" then return nil, "line " .. n .. " is not a JSON object: " .. tostring(why) end
    if type(t.url) ~= "string" then return nil, "line " .. n .. " has no \"url\" string" end
    if t.method ~= nil and type(t.method) ~= "string" then
      return nil, "line " .. n .. " has a \"method\" that is not a string"
    end
    return t
  end
  if line:find("%s") then return nil, "line " .. n .. " is neither a URL nor a JSON object" end
  return { url = line }
end

local function read_lines(path)
  local f, err
  if path == "-" then f = io.stdin else f, err = io.open(path, "rb") end
  if not f then error({ message = "cannot read " .. tostring(err) }, 0) end
  local lines = {}
  local n = 0
  for line in f:lines() do
    n = n + 1
    line = line:gsub("^%s+", ""):gsub("%s+$", "")
    if line ~= "" and line:sub(1, 1) ~= "#" then lines[#lines + 1] = { n = n, text = line } end
  end
  if f ~= io.stdin then f:close() end
  return lines
end

local function duration(seconds)
  if seconds >= 3600 then return format("%dh%02dm", floor(seconds / 3600), floor(seconds % 3600 / 60)) end
  if seconds >= 60 then return format("%dm%02ds", floor(seconds / 60), floor(seconds % 60)) end
  return format("%.0fs", seconds)
end

--- The progress bar's line: done/total, rate, ETA, retries and 429s so
-- far, and the longest wait under way.
function cli.progress_line(st, width)
  local elapsed = max(rw.now() - st.started, 1e-9)
  local rate = st.done / elapsed
  local eta = rate > 0 and (st.total - st.done) / rate or nil
  local info = format(" %d/%d %3d%% %.1f/s ETA %s retries %d 429s %d", st.done, st.total,
    st.total > 0 and floor(st.done * 100 / st.total) or 100, rate, eta and duration(eta) or "?",
    st.retries, st.throttled)
  local wait = 0
  local now = rw.now()
  for _, until_t in pairs(st.waits) do wait = max(wait, until_t - now) end
  if wait > 0 then info = info .. format(" waiting %.1fs", wait) end
  -- the same width all run long, whatever the figures' lengths
  local bar = max(10, min(30, width - 56))
  local filled = st.total > 0 and floor(bar * st.done / st.total) or bar
  return "[" .. rep("#", filled) .. rep(".", bar - filled) .. "]" .. info
end

local function summary(st)
  local elapsed = rw.now() - st.started
  local kinds = {}
  for kind, count in pairs(st.errors) do kinds[#kinds + 1] = format("%s %d", kind, count) end
  table.sort(kinds)
  return format("%d request%s in %.1f s (%.1f/s): %d ok, %d failed%s; %d retr%s, %d throttled (429)",
    st.total, st.total == 1 and "" or "s", elapsed, st.done / max(elapsed, 1e-9), st.ok, st.failed,
    #kinds > 0 and " (" .. concat(kinds, ", ") .. ")" or "", st.retries, st.retries == 1 and "y" or "ies",
    st.throttled)
end

local function result_line(item, req, res, err, no_body)
  local r = { line = item.n, id = req and req.id, url = req and headers.redact_url(req.url),
    method = req and (req.method or ((req.body or req.json) and "POST" or "GET")):upper() }
  if res then
    r.ok, r.status, r.attempts, r.elapsed = true, res.status, res.attempts, res.elapsed
    if not no_body then r.body = res.body end
  else
    r.ok = false
    r.error = { kind = err.kind or "input", message = err.message or tostring(err) }
    r.status, r.attempts, r.elapsed = err.status, err.attempts, err.elapsed
    if err.response and not no_body then r.body = err.response.body end
  end
  return json.encode(r, "ratewise batch: a result")
end

local function run_batch(path, o, err_out, is_tty)
  local items = read_lines(path)
  local st = { total = #items, done = 0, ok = 0, failed = 0, retries = 0, throttled = 0, errors = {},
    waits = {}, started = rw.now() }
  local show_progress = o.progress or (not o.no_progress and is_tty)
  local events = function(ev)
    if ev.type == "retry" then
      st.retries = st.retries + 1
      st.waits[compat.running() or "main"] = rw.now() + ev.delay
    elseif ev.type == "response" then
      st.waits[compat.running() or "main"] = nil
      if ev.status == 429 then st.throttled = st.throttled + 1 end
    end
  end
  local base = fetch_options(o, events)
  local out = open_output(o.output)
  local width = tonumber(os.getenv("COLUMNS")) or 80
  local drawn = false
  local function draw()
    err_out:write("\r", cli.progress_line(st, width), "\27[K")
    err_out:flush()
    drawn = true
  end
  rw.run(function()
    local ticker = show_progress and rw.spawn(function()
      while true do
        draw()
        rw.sleep(0.1)
      end
    end)
    rw.map(items, function(item)
      local req, why = parse_line(item.text, item.n)
      local res, err
      if req then
        local opts = setmetatable({}, { __index = base })
        local h = {}
        for k, v in pairs(o.headers) do h[k] = v end
        if type(req.headers) == "table" then for k, v in pairs(req.headers) do h[k] = v end end
        opts.headers, opts.method, opts.body, opts.json = h, req.method, req.body, req.json
        local ok, a, b = compat.pcall(rw.fetch, req.url, opts)
        if ok then res, err = a, b else err = { kind = "input", message = tostring(a) } end
      else
        err = { kind = "input", message = why }
      end
      st.waits[compat.running() or "main"] = nil
      st.done = st.done + 1
      if res then
        st.ok = st.ok + 1
      else
        st.failed = st.failed + 1
        st.errors[err.kind or "input"] = (st.errors[err.kind or "input"] or 0) + 1
      end
      out:write(result_line(item, req, res, err, o.no_body), "\n")
      out:flush()
    end, { concurrency = o.concurrency or 4 })
    if ticker then ticker:cancel() end
  end)
  if drawn then
    draw()
    err_out:write("\n")
  end
  if out ~= io.stdout then out:close() end
  err_out:write(summary(st), "\n")
  return st.failed == 0 and 0 or 1
end

--- status = cli.main(args [, stderr]): runs a command line; the exit status.
function cli.main(args, err_out)
  err_out = err_out or io.stderr
  local ok, status = compat.pcall(function()
    local command, target, o = cli.parse(args or {})
    if command == "help" then
      io.stdout:write(USAGE)
      return 0
    elseif command == "--version" then
      io.stdout:write("ratewise ", core.version, "\n")
      return 0
    elseif command == "get" then
      return run_get(target, o, err_out)
    end
    return run_batch(target, o, err_out, core.isatty(2))
  end)
  if ok then return status end
  if getmetatable(status) == usage_mt then
    err_out:write("ratewise: ", status.message, "\n(ratewise help lists the commands and options)\n")
    return 2
  end
  err_out:write("ratewise: ", type(status) == "table" and tostring(status.message or status) or tostring(status),
    "\n")
  return type(status) == "table" and status.message and 1 or 2
end

return cli
