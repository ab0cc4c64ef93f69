-- The ratewise command: `ratewise get URL` prints a body as curl does,
-- and `ratewise batch FILE` runs one request per line, with ratewise's
-- retries, waits and limits, writing one JSON line per result and, on a
-- terminal, a progress bar. bin/ratewise calls cli.main(arg). This module
-- reads the command line and runs get; batch is lua/ratewise/cli/batch.lua.
local rw = require "ratewise"
local core = require "ratewise.core"
local compat = require "ratewise.compat"
local json = require "ratewise.json"
local scheduler = require "ratewise.scheduler"
local batch = require "ratewise.cli.batch"
local input = require "ratewise.cli.input"
local output = require "ratewise.cli.output"

local format = string.format

local cli = {}

local USAGE = [[
usage: ratewise get URL [options]      print the body of a GET (or -X, -d) to stdout
       ratewise batch FILE [options]   one request per line of FILE (- for stdin):
                                       a URL, or a JSON object {"url", "method",
                                       "headers", "body", "body_base64", "json",
                                       "id", "idempotency_key"}; one JSON line
                                       per result on stdout
       ratewise help | --version

options:
  -H, --header 'Name: value'  a request header (repeatable)
  -X, --method METHOD         the method (get: GET, or POST with -d/--json)
  -d, --data TEXT             a request body (get)
      --json TEXT             a JSON request body (get), sent as application/json
      --idempotency-key KEY   the Idempotency-Key of the request, which may then be
                              sent again (get; batch: the lines' "idempotency_key")
      --retry-unsafe          retry a POST or PATCH without an idempotency key too
  -i, --include               print the status line and headers before the body (get)
      --stream                print the body as it arrives (get)
      --paginate              print every page a Link: <...>; rel="next" names, one
                              body after another, each ending in a newline (get)
  -o, --output FILE           write to FILE instead of stdout
      --retries N             retries after the first attempt (default 3)
      --max-elapsed SECONDS   the time budget of each request, waits included (default 120)
      --timeout SECONDS       each attempt's timeout (default 30)
      --rate N[/UNIT]         at most N requests a second, or per UNIT: s, m, h or d,
                              with a count (10/5m) (a token bucket)
      --burst N               the bucket's capacity (default 1)
      --concurrency N         requests in flight at once (batch; default 4)
      --rpm N                 requests a minute, with --provider openai or anthropic (batch)
      --tpm N                 tokens a minute: OpenAI's limit (batch, --provider openai)
      --itpm N, --otpm N      input and output tokens a minute: Anthropic's limits, both
                              (batch, --provider anthropic); each request takes the
                              provider's estimate, corrected as the provider corrects it
      --provider NAME         github, openai, anthropic, stripe or ietf
      --no-body               leave the bodies out of batch's results
      --resume                skip the lines already answered in -o FILE, and add
                              the other results to it (batch)
      --timeline FILE.svg     draw the run in FILE.svg: requests and tokens a minute
                              against each limit, every 429 and every wait (batch)
      --progress, --no-progress   draw the progress bar, or not (default: on a terminal)
  -k, --insecure              do not verify TLS certificates
  -s, --silent                no retry lines on stderr
  -h, --help                  this text

exit status: 0 when every request succeeded, 1 when one failed, 2 for bad usage,
23 when the output could not be written or encoded as JSON, 128 + the signal's
number when stopped by one: 130 for Ctrl-C (SIGINT), 143 for SIGTERM, 129 for SIGHUP.
]]

-- Raised for a command that cannot run; main() prints its message, with a
-- pointer to the usage when it is the command line's fault (status 2).
local failure_mt = {}
local function fail(status, message, ...)
  error(setmetatable({ status = status, message = format(message, ...) }, failure_mt), 0)
end
local function usage_error(message, ...) fail(2, message, ...) end

local function number_arg(name, value, integer)
  local n = tonumber(value)
  if not n or n ~= n or n <= 0 or n == math.huge or (integer and n % 1 ~= 0) then
    usage_error("option %s needs a positive %s (got %s)", name, integer and "integer" or "number",
      value == nil and "nothing" or format("%q", value))
  end
  return n
end

local RATE_UNITS = { s = 1, m = 60, h = 3600, d = 86400 }

-- --rate N, N/s, N/m, N/h, N/d or N/kU (as curl's --rate, whose plain N is
-- per hour: here it is per second, as it always was): requests a second.
local function rate_arg(name, value)
  local count, every, unit = value:match("^([^/]+)/(%d*)([smhd])$")
  if not count then return number_arg(name, value) end
  local per = RATE_UNITS[unit] * (every == "" and 1 or tonumber(every))
  if per == 0 then usage_error("option %s needs a positive time unit (got %q)", name, value) end
  return number_arg(name, count) / per
end

-- name -> { field, kind }: kind is "flag", "string", "number", "integer",
-- "count", "rate" or "header"
local OPTIONS = {
  ["-H"] = { "headers", "header" }, ["--header"] = { "headers", "header" },
  ["-X"] = { "method", "string" }, ["--method"] = { "method", "string" },
  ["-d"] = { "data", "string" }, ["--data"] = { "data", "string" },
  ["--json"] = { "json", "string" },
  ["--idempotency-key"] = { "idempotency_key", "string" },
  ["--retry-unsafe"] = { "retry_unsafe", "flag" },
  ["-i"] = { "include", "flag" }, ["--include"] = { "include", "flag" },
  ["--stream"] = { "stream", "flag" },
  ["--paginate"] = { "paginate", "flag" },
  ["-o"] = { "output", "string" }, ["--output"] = { "output", "string" },
  ["--retries"] = { "retries", "count" },
  ["--max-elapsed"] = { "max_elapsed", "number" },
  ["--timeout"] = { "timeout", "number" },
  ["--rate"] = { "rate", "rate" },
  ["--burst"] = { "burst", "integer" },
  ["--rpm"] = { "rpm", "number" }, ["--tpm"] = { "tpm", "number" },
  ["--itpm"] = { "itpm", "number" }, ["--otpm"] = { "otpm", "number" },
  ["--concurrency"] = { "concurrency", "integer" },
  ["--provider"] = { "provider", "string" },
  ["--no-body"] = { "no_body", "flag" },
  ["--resume"] = { "resume", "flag" },
  ["--timeline"] = { "timeline", "string" },
  ["--progress"] = { "progress", "flag" }, ["--no-progress"] = { "no_progress", "flag" },
  ["-k"] = { "insecure", "flag" }, ["--insecure"] = { "insecure", "flag" },
  ["-s"] = { "silent", "flag" }, ["--silent"] = { "silent", "flag" },
  ["-h"] = { "help", "flag" }, ["--help"] = { "help", "flag" },
}

local LLM_LIMITS = batch.LLM_LIMITS

-- --rpm, --tpm, --itpm and --otpm go
-- with batch, a --provider whose limits they are, and no --rate.
local function check_llm_limits(command, o)
  local first
  for _, limit in ipairs(LLM_LIMITS) do
    if o[limit.field] then first = first or limit.flag end
  end
  if not first then return end
  if command ~= "batch" then usage_error("option %s is batch's", first) end
  if o.rate then usage_error("give --rate or option %s, not both (%s sets the batch's limits)", first, first) end
  if o.provider ~= "openai" and o.provider ~= "anthropic" then
    usage_error("option %s needs --provider openai or --provider anthropic, whose limits it sets%s", first,
      o.provider and format(" (got --provider %s)", o.provider) or "")
  end
  for _, limit in ipairs(LLM_LIMITS) do
    if o[limit.field] and limit.provider and limit.provider ~= o.provider then
      usage_error(o.provider == "anthropic"
        and "option %s is OpenAI's tokens a minute: Anthropic limits input and output tokens apart "
          .. "(--itpm and --otpm)"
        or "option %s is Anthropic's: OpenAI limits tokens a minute as one (--tpm)", limit.flag)
    end
  end
  if (o.itpm == nil) ~= (o.otpm == nil) then
    usage_error("option %s needs %s too: Anthropic limits input and output tokens apart",
      o.itpm and "--itpm" or "--otpm", o.itpm and "--otpm" or "--itpm")
  end
end

-- How many seconds of its per-minute limit each bucket of --rpm, --tpm,
-- --itpm and --otpm holds: both providers say a per-minute limit may be
-- enforced over shorter intervals, so a minute's worth taken at once (the
-- opening burst of a bucket that holds the whole minute) draws 429s, while
-- a few seconds still let the requests in flight go together. The token
-- sync from the answers' headers follows the server from the first one.
cli.LLM_HOLD = 3

-- rw.limiters with a named limit for each of --rpm, --tpm, --itpm and
-- --otpm given, a bucket each refilled at N / 60 a second.
local function llm_limiter(o)
  local members = {}
  for _, limit in ipairs(LLM_LIMITS) do
    local per_minute = o[limit.field]
    if per_minute then
      members[limit.name] = rw.bucket { capacity = math.max(1, per_minute / 60 * cli.LLM_HOLD),
        rate = per_minute / 60 }
    end
  end
  return rw.limiters(members)
end

--- command, target, options = cli.parse(args)
function cli.parse(args)
  local o = { headers = {} }
  local positional = {}
  local i = 1
  local first = args[1]
  if first == "--version" or first == "help" then
    return first == "--version" and "--version" or "help", nil, o
  end
  local header_count = 0
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
          header_count = header_count + 1
          local hname, hvalue = input.header_option(value, header_count)
          if not hname then usage_error("%s", hvalue) end
          o.headers[hname] = hvalue
        elseif kind == "count" then
          local n = tonumber(value)
          if not n or n < 0 or n % 1 ~= 0 then usage_error("option %s needs a whole number (got %q)", name, value) end
          o[field] = n
        elseif kind == "number" or kind == "integer" then
          o[field] = number_arg(name, value, kind == "integer")
        elseif kind == "rate" then
          o[field] = rate_arg(name, value)
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
  if o.help then return "help", nil, o end
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
  check_llm_limits(command, o)
  if o.resume then
    if command ~= "batch" then usage_error("option --resume is batch's") end
    if not o.output or o.output == "-" then
      usage_error("option --resume needs -o FILE, the results file of the run it resumes")
    end
  end
  if o.timeline then
    if command ~= "batch" then usage_error("option --timeline is batch's") end
    if o.timeline == "" or o.timeline == "-" then
      usage_error("option --timeline needs a file to write the SVG to (got %q)", o.timeline)
    end
    if o.timeline == positional[2] then usage_error("option --timeline names the input file: give another") end
    if o.timeline == o.output then usage_error("option --timeline names the results file (-o): give another") end
  end
  if o.paginate then
    if command ~= "get" then usage_error("option --paginate is get's") end
    if o.stream then usage_error("give --paginate or --stream, not both") end
    if o.data or o.json or (o.method and o.method:upper() ~= "GET") then
      usage_error("option --paginate follows the pages of a GET: it takes no -X, -d or --json")
    end
  end
  if o.idempotency_key ~= nil then
    if command == "batch" then
      usage_error("option --idempotency-key is get's: give each line of a batch its own \"idempotency_key\"")
    end
    if not o.idempotency_key:find("%S") or o.idempotency_key:find("%c") then
      usage_error("option --idempotency-key needs a key that is not blank and has no control characters")
    end
  end
  return command, positional[2], o
end

-- The fetch options every request of a command line shares.
local function fetch_options(o)
  local opts = {
    max_retries = o.retries, max_elapsed = o.max_elapsed, timeout = o.timeout,
    policy = o.provider and rw.providers[o.provider] or nil,
    retry_non_idempotent = o.retry_unsafe or nil,
  }
  local h = {}
  for k, v in pairs(o.headers) do h[k] = v end
  opts.headers = h
  -- (not `x and false or nil`: that is always nil)
  if o.insecure then opts.verify_tls = false end
  if o.silent then opts.on_retry = false end
  if o.rate then
    local made, limiter = pcall(rw.bucket, { capacity = o.burst or 1, rate = o.rate })
    if not made then
      -- the bucket's words for it, with the options' names and without
      -- where in ratewise it was raised
      local why = tostring(limiter):gsub("^[^\n]-:%d+: ", ""):gsub("^bucket: ", "")
        :gsub("option 'rate'", "option --rate"):gsub("option 'capacity'", "option --burst")
      if o.burst and not why:find("--burst", 1, true) then why = why .. format(" (with --burst %.15g)", o.burst) end
      usage_error("%s", why)
    end
    opts.limiter = limiter
  end
  if o.rpm or o.tpm or o.itpm then opts.limiter = llm_limiter(o) end
  if o.insecure then rw.configure { tls_warning = false } end
  return opts
end

---------------------------------------------------------------------------
-- ratewise get

-- fn's result, run as a task that a stop signal (Ctrl-C, SIGTERM, SIGHUP)
-- cancels (nil and the signal's number then); fn's error is raised. The
-- interpreter's own handler would raise "interrupted!" from whatever Lua
-- code runs next, inside the scheduler or a transfer's wait.
local function until_interrupted(fn)
  local trap = core.trap_stop_signals()
  local ok, ran, result = compat.pcall(rw.run, function()
    local worker = rw.spawn(function() return compat.pcall(fn) end)
    local watcher = rw.spawn(function()
      while not core.interrupted() do rw.sleep(0.1) end
      worker:cancel()
    end)
    local fn_ok, value = worker:join()
    watcher:cancel()
    return fn_ok, value
  end)
  local signal = core.interrupted() or nil
  if trap then core.release_stop_signals(trap) end
  if not ok then error(ran, 0) end
  if ran == nil or result == scheduler.CANCELLED then return nil, signal end
  if ran == false then error(result, 0) end
  return result
end

local function print_head(out, res)
  local lines = { format("HTTP/%s %d\r\n", res.http_version or "1.1", res.status) }
  local names = {}
  for name in pairs(res.headers) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    for _, value in ipairs(rw.header_values(res, name)) do lines[#lines + 1] = name .. ": " .. value .. "\r\n" end
  end
  lines[#lines + 1] = "\r\n"
  return out:write(table.concat(lines))
end

-- The exit status of get, once until_interrupted has answered (err: the
-- call's error, false for none, nil when a signal stopped it), said on
-- err_out.
local function finish(out, err, signal, err_out)
  out:close()
  if err == nil then
    err_out:write("ratewise: ", batch.stopped_by(signal), "\n")
    return batch.SIGNAL_EXIT + (signal or 2)
  end
  if out.failed then
    err_out:write("ratewise: ", out.failed, "\n")
    return output.WRITE_FAILED
  end
  if err then
    err_out:write(tostring(err), "\n")
    return 1
  end
  return 0
end

local function run_get(url, o, err_out)
  local opts = fetch_options(o)
  local h = opts.headers
  opts.method = o.method and o.method:upper() or nil
  opts.idempotency_key = o.idempotency_key
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
  local out, why = output.open(o.output)
  if not out then fail(output.WRITE_FAILED, "%s", why) end
  local err, signal = until_interrupted(function()
    local res, fetch_err = rw.fetch(url, opts)
    local shown = res or (fetch_err and fetch_err.response)
    if shown then
      local written = not o.include or print_head(out, shown)
      if res and o.stream then
        while written do
          local chunk, cerr = res:read()
          if cerr then fetch_err = cerr end
          if not chunk then break end
          written = out:write(chunk)
        end
        if not written then res:close() end
      elseif written then
        out:write(shown.body or "")
      end
    end
    return fetch_err or false
  end)
  return finish(out, err, signal, err_out)
end

-- ratewise get --paginate: a client on the URL's origin (its userinfo
-- too) walks the pages (client:pages), each a GET with the command line's
-- options. Bodies are printed as they came, one after another, each ending
-- in a newline (added when it has none), so that JSON pages read as a
-- stream of JSON texts (`jq -s add` joins arrays).
local function run_paginate(url, o, err_out)
  local base, path = url:match("^(%a[%w+.-]*://[^/?#]*)(.*)$")
  if not base or not base:lower():find("^https?://") then
    usage_error("option --paginate needs an http:// or https:// URL")
  end
  path = path:gsub("#.*$", "")
  if path:sub(1, 1) ~= "/" then path = "/" .. path end
  local opts = fetch_options(o)
  local c = rw.client { base_url = base }
  local out, why = output.open(o.output)
  if not out then fail(output.WRITE_FAILED, "%s", why) end
  local err, signal = until_interrupted(function()
    -- (the iterator called in a loop of its own, not by a generic for: Lua
    -- 5.1 cannot yield across a for's call of its iterator, and each page
    -- waits)
    local next_page = c:pages(path, opts)
    while true do
      local page, page_err = next_page()
      if page == nil then break end
      local shown = page or page_err.response
      -- a failed page's own body is printed, as get prints one; a link
      -- that cannot be followed ends after the page that named it, printed
      if shown and (page or page_err.kind ~= "pagination") then
        local written = not o.include or print_head(out, shown)
        local body = shown.body or ""
        if written and body ~= "" then
          written = out:write(body) and (body:sub(-1) == "\n" or out:write("\n"))
        end
        if not written then return false end
      end
      if not page then return page_err end
    end
    return false
  end)
  return finish(out, err, signal, err_out)
end

--- status = cli.main(args [, stderr]): runs a command line; the exit status.
function cli.main(args, err_out)
  err_out = err_out or io.stderr
  -- a closed pipe is then a write that fails (EPIPE), which is reported
  core.ignore_sigpipe()
  local ok, status = compat.pcall(function()
    local command, target, o = cli.parse(args or {})
    if command == "help" or command == "--version" then
      local out = output.open()
      out:write(command == "help" and USAGE or "ratewise " .. core.version .. "\n")
      if out:close() then return 0 end
      err_out:write("ratewise: ", out.failed, "\n")
      return output.WRITE_FAILED
    elseif command == "get" then
      if o.paginate then return run_paginate(target, o, err_out) end
      return run_get(target, o, err_out)
    end
    return batch.run(target, o, err_out, fetch_options(o), fail)
  end)
  if ok then return status end
  if getmetatable(status) == failure_mt then
    err_out:write("ratewise: ", status.message, "\n")
    if status.status == 2 then err_out:write("(ratewise help lists the commands and options)\n") end
    return status.status
  end
  err_out:write("ratewise: ", type(status) == "table" and tostring(status.message or status) or tostring(status),
    "\n")
  return type(status) == "table" and status.message and 1 or 2
end

return cli
