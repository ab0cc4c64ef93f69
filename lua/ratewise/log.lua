-- Where ratewise's lines go: every line the library writes for the operator
-- (a retry, a warning, the error of a task nobody joined) comes here, and
-- goes to the first of
--   1. the function given to rw.configure{log = fn} (false: nowhere);
--   2. the sink a host set (log.set_host: Neovim's vim.notify, a LÖVE
--      game's log);
--   3. nginx's error log inside OpenResty, WeeChat's core buffer inside
--      WeeChat (which replaces standard error: a line written there does
--      not reach the user);
--   4. standard error.
-- A line has one of three levels:
--   "info"   the library did its job and says so (a retry);
--   "warn"   a setting the operator should know about (TLS not verified);
--   "error"  a failure nobody else will see (a task's error nobody joined,
--            a host driver's failed step).
-- Neither the line nor the failure of a log function may break the call
-- that wrote it: a log function that raises has its line written to the
-- default place instead, and the failure said there once. Rules 1 and 2
-- must not wait (a line may come from the scheduler itself).
local rawget, type, tostring, pcall = rawget, type, tostring, pcall

local log = {}

local LEVELS = { info = "INFO", warn = "WARN", error = "ERR" }

local configured = nil -- rw.configure{log = fn | false}
local host_sink = nil  -- a host's own sink (log.set_host)
local told_failure = false
-- A line written while the log function runs (one that fetches, and whose
-- fetch retries) goes to the default place: handed to the log function
-- again, it could write lines without end.
local in_sink = false

local function ngx_api()
  local ngx = rawget(_G, "ngx")
  if type(ngx) == "table" and type(ngx.get_phase) == "function" and type(ngx.log) == "function" then return ngx end
  return nil
end

local function weechat_api()
  local weechat = rawget(_G, "weechat")
  if type(weechat) == "table" and type(weechat.print) == "function" and type(weechat.hook_fd) == "function" then
    return weechat
  end
  return nil
end

-- Rules 3 and 4.
local function fallback(line, level)
  local ngx = ngx_api()
  if ngx then return ngx.log(ngx[LEVELS[level]], line) end
  local weechat = weechat_api()
  if weechat then
    -- an error line gets WeeChat's error prefix, as its own errors do
    local prefix = level == "error" and type(weechat.prefix) == "function" and weechat.prefix("error") or ""
    return weechat.print("", prefix .. line)
  end
  io.stderr:write(line, "\n")
end

local function to(sink, line, level)
  if in_sink then return fallback(line, level) end
  in_sink = true
  local ok, err = pcall(sink, line, level)
  in_sink = false
  if ok then return end
  fallback(line, level)
  if not told_failure then
    told_failure = true
    -- tostring of an error object may itself raise (its __tostring)
    local shown_ok, shown = pcall(tostring, err)
    fallback("ratewise: the log function raised an error (its lines go here instead): "
      .. (shown_ok and shown or "(an error object that cannot be shown)"), "error")
  end
end

--- log.write(line, level): level is "info", "warn" or "error".
function log.write(line, level)
  local sink = configured
  if sink == false then return end
  if sink == nil then sink = host_sink end
  if sink == nil then return fallback(line, level) end
  to(sink, line, level)
end

--- log.configure(value): rw.configure's `log` option, checked by the
-- caller: a function, false (silence) or true (the default again).
function log.configure(value)
  if value == true then
    configured = nil
  else
    configured = value
  end
  told_failure = false
end

--- log.set_host(fn | nil): the sink of the host at hand, used while the
-- caller has configured none.
function log.set_host(fn)
  host_sink = fn
  told_failure = false
end

return log
