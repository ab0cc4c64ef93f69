-- The OpenResty host, registered with the seam (ratewise/runtime.lua) at
-- rank 10: it claims the code running now when the `ngx` API is there and
-- the phase lets code yield.
--   sleep: ngx.sleep, which lets the worker serve other requests meanwhile;
--   waiting for a transfer (or a join, a semaphore, a group of tasks): the
--   request waits on an ngx.semaphore of its own, posted by one driver per
--   worker, a light thread of ngx.timer.at (ratewise/hosts/driven.lua).
--   nginx's Lua cannot wait on the engine's descriptor, only on its own
--   cosockets: so the driver waits on a wake-up line, a cosocket
--   connected to a unix socket of the engine's, on which the engine
--   writes a byte once its descriptor is readable (src/wake.c: a helper
--   thread waits on the descriptor for nginx's loop), until the
--   scheduler's next timer, or a kick (a byte written down the line: a
--   request started waiting, and its transfer is sent at once); with
--   nothing pending, the driver stays a moment for the next wait, then
--   ends; a request whose transfer is alone in flight, with no driver and
--   no task, waits on the line and looks itself instead (one light
--   thread, no semaphore); the line goes back to nginx's connection pool
--   after, for the next such wait. Where the engine has no descriptor
--   (a poll(2) build), they nap instead: a millisecond while transfers
--   are in flight, longer while nothing moves;
--   ratewise's tasks (rw.run, rw.spawn, rw.map, a client's shared calls):
--   the driver runs them all, in its own light thread: a coroutine made in
--   one request (or timer) and resumed from another crashes the worker;
--   the phases that cannot yield (init, init_worker, set, header and body
--   filters, log, balancer) raise a clear error instead of blocking the
--   worker;
--   ratewise's lines go to nginx's error log (ratewise/log.lua); a task
--   keeps the $request_id of the request that spawned it (or its parent's
--   label), which its retry lines end with (openresty.origin).
local driven = require "ratewise.hosts.driven"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"

local format, rawget, tostring, type, error = string.format, rawget, tostring, type, error
local min = math.min
local running = coroutine.running
local loaded = package.loaded

local openresty = {}

-- How long the driver stays once nothing is pending: a handler that calls
-- rw.fetch in a loop starts its next wait at once, and a driver that
-- ended would cost it a new ngx.timer.at light thread (a fake request and
-- a coroutine) each time; a driver that stays costs one kick.
local LINGER = 0.05

-- The phases whose code may yield (ngx.sleep works there).
local yielding = { rewrite = true, server_rewrite = true, access = true, content = true, timer = true,
  ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true }

local function ngx_api()
  local ngx = rawget(_G, "ngx")
  if type(ngx) == "table" and type(ngx.get_phase) == "function" then return ngx end
  return nil
end

--- yes = openresty.active(): the code running now is OpenResty's and may
-- wait; raises in a phase where it may not.
function openresty.active()
  local ngx = ngx_api()
  if not ngx then return false end
  local phase = ngx.get_phase()
  if yielding[phase] then return true end
  error(format("ratewise: cannot wait in nginx's %s phase, where code cannot yield: call it from a "
    .. "rewrite, access or content handler, or from an ngx.timer.at callback", tostring(phase)), 0)
end

-- The phases that run for a client request, where ngx.var is there.
local in_request = { set = true, rewrite = true, server_rewrite = true, access = true, content = true,
  header_filter = true, body_filter = true, log = true, balancer = true }

--- label | nil = openresty.origin(): what a task spawned now comes from,
-- for its lines (scheduler.set_origin_of_spawn): "request <id>", nginx's
-- $request_id of the client request spawning it. A task runs in the
-- driver's timer, whose lines nginx writes naming no request; the id ties
-- them to the request's own lines and to an access log that logs
-- $request_id. The request line is not taken: its query may hold a key.
function openresty.origin()
  local ngx = ngx_api()
  if not ngx or not in_request[ngx.get_phase()] then return nil end
  local id = ngx.var.request_id -- (nil before nginx 1.11)
  return id and "request " .. id or nil
end

-- The line's own read timeout: the engine's timer (engine:wake_arm) ends
-- a wait, as nginx writes an error line for every cosocket read that
-- times out; this only bounds a wait that something went wrong with.
local LINE_TIMEOUT_MS = 86400 * 1000
-- A wait whose line cannot be had (connect failed) naps at most this long.
local NAP_MAX = scheduler.NAP_MAX

--- wait, release, post_kick = line_waits(ngx, engine): the waits on the
-- engine's wake-up line (src/wake.c). A cosocket belongs to the request
-- (or timer) that connected it, so the line is the light thread's that
-- waits now: the driver's, or a lone waiter's, never both at once (a lone
-- waiter hands over to the driver as it starts, whose new connection
-- closes the lone waiter's). wait(seconds | nil) returns when the engine's
-- descriptor is readable, on a kick, or after the seconds; release() gives
-- a lone waiter's line back to nginx's pool; post_kick() wakes the wait.
local function line_waits(ngx, engine, path)
  local address = "unix:" .. path
  local line, line_thread = nil, nil
  local kick_sent = false -- a byte is on its way to the wait: no other needed

  local function take()
    local thread = running()
    if line and line_thread == thread then return line end
    line, line_thread = nil, thread -- another's: nginx closes it with its request
    -- (a phase without cosockets raises: its waits nap)
    local made, sock = pcall(ngx.socket.tcp)
    if not made then return nil end
    local ok = sock:connect(address)
    -- a connection from nginx's pool is the line already
    if ok and sock:getreusedtimes() == 0 then ok = engine:wake_accept() end
    if not ok then
      sock:close()
      return nil
    end
    line = sock
    return sock
  end

  local function wait(seconds)
    if seconds and seconds <= 0 then
      -- Due now (a step its budget cut short left sockets ready): nginx's
      -- loop turns once, running the light threads the step woke, and the
      -- caller looks again, where a wait on the line would come back at
      -- once through the engine's helper thread (two more threads woken).
      ngx.sleep(0)
      return
    end
    local sock = take()
    if not sock then
      ngx.sleep(min(seconds or NAP_MAX, NAP_MAX))
      return
    end
    if kick_sent then -- kicked while the line was being taken
      kick_sent = false
      return
    end
    engine:wake_arm(seconds)
    sock:settimeout(LINE_TIMEOUT_MS)
    local got, err = sock:receiveany(64)
    kick_sent = false
    if not got and err ~= "timeout" then -- closed: a newer connection is the line
      sock:close()
      line = nil
    end
  end

  local function release()
    if line and line_thread == running() then
      line:setkeepalive() -- (it closes the line when it cannot keep it)
      line, line_thread = nil, nil
    end
  end

  local function post_kick()
    if not kick_sent then
      kick_sent = true
      engine:wake_kick()
    end
  end
  return wait, release, post_kick
end

local host -- made at the first wait: ngx.semaphore is not there in every phase

local function make_host()
  local ngx = ngx_api()
  local semaphore = require "ngx.semaphore"
  local engine = scheduler.engine()
  local path = engine:wake_path()
  local function sleep(seconds) ngx.sleep(seconds) end
  local wait, release, post_kick
  if path then wait, release, post_kick = line_waits(ngx, engine, path) end
  local made = driven.new {
    spawn = function(fn) return ngx.timer.at(0, fn) end,
    signal = function() return semaphore.new(0) end,
    wait = function(s, seconds) s:wait(seconds or 60) end,
    post = function(s) if s:count() < 1 then s:post(1) end end,
    post_kick = post_kick,
    block = wait and function(_, seconds) wait(seconds) end or function(kick, seconds) kick:wait(seconds) end,
    watches_fd = wait ~= nil,
    tasks_stay = true,
    linger = LINGER,
    nap = wait or sleep,
    nap_over = release,
    loop_time = ngx.now,
    host_wait_warning = "ratewise: a ratewise task waited for nginx itself (ngx.sleep, a cosocket such as "
      .. "resty.http or resty.redis, ngx.location.capture): it holds the driver that runs every task, so the "
      .. "tasks run one after another. Run such code in light threads (ngx.thread.spawn), calling rw.fetch "
      .. "there, or wait with rw.sleep inside tasks (docs/hosts.md)",
  }
  made.sleep = sleep
  return made
end

--- host = openresty.host()
function openresty.host()
  if not host then host = make_host() end
  return host
end

--- openresty.kick(): wakes the driver (a permit released, a task ended).
function openresty.kick()
  if host then host.kick() end
end

-- Registered where `ngx` is in package.loaded as this module loads:
-- OpenResty puts it there as it starts, before any module of its Lua code
-- is loaded, and nothing else does. Asked first; the phase is asked at
-- each wait (and at each spawn, for the task's origin).
if loaded.ngx ~= nil then
  scheduler.set_origin_of_spawn(openresty.origin)
  runtime.register_host {
    name = "openresty",
    rank = 10,
    claims = function()
      if openresty.active() then return openresty.host() end
      return nil
    end,
  }
end
scheduler.add_kick(openresty.kick)

return openresty
