-- How ratewise waits: the seam, which picks the host of the code running
-- now. Every wait of the library comes here: a sleep (backoff and hints), a
-- bucket's place (buckets and limiters: runtime.claim), a transfer in
-- flight and a stream's news (runtime.transfer, runtime.await_news), a
-- Redis reply (runtime.await_fd, on its connection's descriptor), and,
-- from outside a task, a join, a semaphore, a group of tasks (the
-- scheduler's outside wait, set below). Each is served by the first of
-- these that applies, one precedence for all (docs/hosts.md, "the seam"):
--   0. a per-call `sleep` option, for a wait that is time alone (a sleep,
--      a bucket's place): the caller said how to wait. Outside a task it
--      serves the call's transfers too, checked on between naps; a task
--      waits for its transfers and descriptors itself (rule 1), which a
--      sleep function cannot see;
--   1. a ratewise task: it parks in ratewise's scheduler (scheduler.park,
--      run_transfer, await_transfer, await_fd), with no frame of the wait's
--      code on its stack;
--   then the hosts registered with runtime.register_host, asked by rank
--   (each says whether the code running now is its own): the host modules
--   register themselves (hosts/openresty.lua 10, hosts/love.lua 30,
--   hosts/cqueues.lua 40, hosts/tarantool.lua 55, hosts/nvim.lua 70,
--   hosts/weechat.lua 74, hosts/haproxy.lua 75, hosts/prosody.lua 77,
--   hosts/mpv.lua 78), and this module registers
--   its own: a host given to rw.configure (20), a coroutine whose runner
--   speaks the yield protocol (50), a coroutine of the caller's inside a
--   task (60, raises), any other coroutine (80, blocks: said once) and the
--   main thread (100, blocks in the engine's poll).
-- Outside a task, whatever waits also runs the scheduler between its
-- waits, so that tasks and transfers of others go on meanwhile.
-- One owner per transfer: who waits for a transfer's end or a stream's
-- news is the transfer's owner, kept by the engine and named by its poll;
-- only the scheduler sets it (run_transfer, await_transfer, and
-- scheduler.own for a driven host's waiter). This module and the hosts
-- keep no record of their own of which transfer a waiter waits for.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local options = require "ratewise.options"
local scheduler = require "ratewise.scheduler"
local log = require "ratewise.log"

local now = core.now
local engine_start, transfer_result = core.engine_methods.start, core.transfer_methods.result
local bad_seconds = scheduler.bad_seconds
local run_transfer = scheduler.run_transfer
local isyieldable, pcall, running = compat.isyieldable, compat.pcall, compat.running
local yield, coroutine_running = coroutine.yield, coroutine.running
local format, sort, remove = string.format, table.sort, table.remove
local type, error, pairs, setmetatable = type, error, pairs, setmetatable

local runtime = {}

-- A host waiting for something another party of the host will do (a
-- semaphore another coroutine holds), with nothing due in ratewise and a
-- wait that cannot be kicked, looks again every IDLE_LOOK seconds.
local IDLE_LOOK = 0.05

---------------------------------------------------------------------------
-- The hosts: sleep(seconds), await(done, deadline) -> done() came true,
-- and optionally await_transfer(transfer)

local function call(fn) return fn() end

-- The main thread: it runs the scheduler, blocking in the engine's poll.
local main_host = {
  name = "main",
  rank = 100,
  claims = function() return true end,
  sleep = scheduler.sleep,
  await = scheduler.drive_until,
  -- a wait for the transfer runtime.transfer has just started, without a
  -- closure over it (a sequential fetch's)
  await_transfer = scheduler.await_started,
}

-- A coroutine whose runner speaks the yield protocol: a wait yields
-- ("ratewise.sleep", seconds, pollable), and the runner resumes it once the
-- seconds have passed or pollable:pollfd() is readable. The seconds are the
-- longest a runner without the descriptor may sleep: a nap while anything
-- is in flight, the deadline otherwise. Resumed early, a wait looks at what
-- it waits for and yields again with what is left.
--
-- A generic for calls its iterator with the last item it got: a wait
-- resumed with its own "ratewise.sleep" was taken for an item by a `for
-- ... in coroutine.wrap(fn)` loop, which resumes it at once, and would
-- have gone on handing the loop such items.
local TAKEN_FOR_ITEM = "ratewise: a wait's yield (\"ratewise.sleep\") was taken for an item: a coroutine "
  .. "that calls ratewise is the iterator of a for loop (for x in coroutine.wrap(fn)), which does not wait "
  .. "before resuming it. Call ratewise outside the iterator, or run the work as ratewise tasks (rw.run, "
  .. "rw.spawn, rw.map), whose waits need no resumer (docs/hosts.md)"
local function resumed(_, last_item)
  if last_item == "ratewise.sleep" then error(TAKEN_FOR_ITEM, 0) end
end

local function yield_for(seconds)
  resumed(yield("ratewise.sleep", seconds, scheduler.pollable))
end

local PROTOCOL_WAY = { block = yield_for, sees_fd = false, idle = IDLE_LOOK }

local protocol_host = {
  name = "protocol",
  rank = 50,
  -- the coroutines whose runner said it speaks the protocol (weak: a
  -- coroutine that is dropped goes)
  speakers = setmetatable({}, { __mode = "k" }),
  sleep = function(seconds)
    local deadline = now() + seconds
    repeat
      resumed(yield("ratewise.sleep", deadline - now(), scheduler.pollable))
    until now() >= deadline
  end,
  await = function(done, deadline) return scheduler.drive(PROTOCOL_WAY, call, done, deadline) end,
}
protocol_host.in_coroutine_only = true
function protocol_host.claims()
  local co = running()
  return co ~= nil and protocol_host.speakers[co] ~= nil
end

--- sleep = runtime.full_sleep(host_sleep): a host's own sleep made one that
-- never comes back before its seconds are up, sleeping again for what is
-- left: a host's sleep may end early (Tarantool's fiber.sleep when another
-- fiber wakes the sleeper, a timer of the host's loop on a clock of its
-- own), and a wait is never shorter than asked. For the host modules'
-- sleeps, not a caller's (a per-call or configured sleep is the caller's
-- word: one that does not sleep at all skips the waits, as tests want).
function runtime.full_sleep(host_sleep)
  return function(seconds)
    local deadline, left = now() + seconds, seconds
    while left > 0 do
      host_sleep(left)
      left = deadline - now()
    end
  end
end

-- A host made of a sleep function (and a wait(pollable, seconds), if it
-- can wait on a descriptor). The sleep is given the seconds alone: a
-- host's own sleep may refuse more (Tarantool's fiber.sleep raises).
local function host_of(sleep, wait)
  local way = {
    block = wait and function(t) wait(scheduler.pollable, t) end or function(t) sleep(t) end,
    sees_fd = wait ~= nil,
    idle = IDLE_LOOK,
  }
  return {
    sleep = sleep,
    await = function(done, deadline) return scheduler.drive(way, call, done, deadline) end,
  }
end

local configured -- rw.configure{sleep = fn [, wait = fn]}

-- (registered while rw.configure has set a host: configure)
local configured_host = {
  name = "configured",
  rank = 20,
  claims = function() return configured end,
}

-- A coroutine of the caller's own that a task resumes (its code, or one
-- that code resumed) cannot reach the scheduler: its yield goes to the
-- task's code (as items of a `for ... in coroutine.wrap(fn)` loop), and
-- the thread cannot block in the scheduler's poll while a task runs.
local nested_host = {
  name = "nested in a task",
  rank = 60,
  -- (a task is being run only while the thread is inside a coroutine)
  in_coroutine_only = true,
  claims = function(in_task) return in_task end,
  blocking = "raise",
  says = "ratewise: a coroutine of your own inside a task (coroutine.wrap, say) called ratewise, "
    .. "which would have to wait: its yield would go to the task's code, not to the scheduler. Call ratewise "
    .. "from the task itself, or make each item a task of its own (rw.spawn, rw.map) and collect the results",
}

-- Any other coroutine: its runner is not known to resume the protocol's
-- yields (a runner that resumes only its own would never resume the
-- wait), so the wait blocks the thread as the main thread's does, and
-- says so once.
local foreign_host = {
  name = "coroutine",
  rank = 80,
  in_coroutine_only = true,
  claims = function() return isyieldable() end,
  blocking = "warn",
  says = "ratewise: a wait in a coroutine that is not a ratewise task blocks the whole thread until it ends: "
    .. "its runner has not said that it resumes ratewise's yields. A runner that does marks the coroutine "
    .. "with rw.speaks_protocol(co); otherwise run the work as ratewise tasks (rw.spawn) and step them "
    .. "from the host's loop (docs/hosts.md)",
}

-- The registered hosts, by rank; and those asked for a wait: the ones
-- ranked before the main thread's host (asked_n of them), which claims
-- every wait that reaches it and so answers when none of them does; and
-- of those, the ones whose claim can be true on the main thread (what the
-- main thread asks).
local hosts, hosts_n = {}, 0
local asked_hosts, asked_n = {}, 0
local main_thread_hosts, main_thread_n = {}, 0

local function by_rank(a, b) return a.rank < b.rank end

-- (after each change of hosts)
local function list_asked_hosts()
  asked_n, main_thread_n = 0, 0
  for i = 1, hosts_n do
    local host = hosts[i]
    if host == main_host then break end
    asked_n = asked_n + 1
    asked_hosts[asked_n] = host
    if not host.in_coroutine_only then
      main_thread_n = main_thread_n + 1
      main_thread_hosts[main_thread_n] = host
    end
  end
  for i = asked_n + 1, #asked_hosts do asked_hosts[i] = nil end
  for i = main_thread_n + 1, #main_thread_hosts do main_thread_hosts[i] = nil end
end

--- runtime.register_host(host): host is
--   name, rank             what it is, and where it is asked (lower first)
--   claims(in_task)        whether the code running now is this host's:
--                          nil or false (not), true (host itself), or the
--                          host object to use (a host per controller,
--                          say); may raise where no wait is possible
--   sleep(seconds), await(done, deadline) [, await_transfer(transfer)]
--                          how it waits; or, for a host whose loop must not
--                          block, instead of those:
--   blocking, says         "raise": a wait there raises says; "warn":
--                          says is logged once, and the next host down the
--                          ranks serves the wait (the main thread's block)
--   in_coroutine_only      optional: true when claims can answer yes only
--                          inside a coroutine; code on the main thread
--                          then does not ask it
-- A host registered again (a module loaded anew) replaces the one of its name.
-- A host module registers its host only where it can be there (its API is
-- there as the module loads, or what makes it one has been said): a wait
-- asks every host registered.
function runtime.register_host(host)
  if type(host) ~= "table" or type(host.name) ~= "string" or type(host.rank) ~= "number"
      or type(host.claims) ~= "function" then
    error("register_host: expected a host {name = string, rank = number, claims = function, ...}", 2)
  end
  for i = 1, hosts_n do
    if hosts[i].name == host.name then
      hosts[i] = host
      sort(hosts, by_rank)
      list_asked_hosts()
      return
    end
  end
  hosts_n = hosts_n + 1
  hosts[hosts_n] = host
  sort(hosts, by_rank)
  list_asked_hosts()
end

-- The host of that name is asked no more (one that cannot be there now).
local function unregister_host(name)
  for i = 1, hosts_n do
    if hosts[i].name == name then
      remove(hosts, i)
      hosts_n = hosts_n - 1
      list_asked_hosts()
      return
    end
  end
end

local function registered(host)
  for i = 1, hosts_n do
    if hosts[i] == host then return true end
  end
  return false
end

-- (the protocol's host from the first coroutine said to speak it,
-- runtime.speaks_protocol; the configured one while there is one,
-- runtime.configure)
for _, host in pairs({ main_host, nested_host, foreign_host }) do
  runtime.register_host(host)
end

--- co = runtime.speaks_protocol(co [, yes]): the runner of coroutine co
-- says it resumes its waits' yields ("ratewise.sleep", seconds, pollable);
-- yes = false takes that back.
function runtime.speaks_protocol(co, yes)
  if type(co) ~= "thread" then
    error(format("speaks_protocol: expected a coroutine (got %s)", type(co)), 2)
  end
  protocol_host.speakers[co] = (yes ~= false) or nil
  if yes ~= false and not registered(protocol_host) then runtime.register_host(protocol_host) end
  return co
end

local per_call_hosts = setmetatable({}, { __mode = "k" })

local function per_call_host(sleep)
  local host = per_call_hosts[sleep]
  if not host then
    host = host_of(sleep)
    per_call_hosts[sleep] = host
  end
  return host
end

-- The host of the code running now, outside a task: the one place that
-- picks, asking the registered hosts by rank (on the main thread, those
-- whose claim can be true there). in_task: whether a task is being run
-- (scheduler.in_task), asked by the caller, which may know it already.
-- On the main thread: Lua 5.1's coroutine.running gives no second value,
-- and a coroutine there (one compat.pcall runs a function in, say) is
-- taken for a coroutine: every host is asked then, as in any coroutine.
local function host_outside_task(per_call, in_task)
  if per_call then return per_call_host(per_call) end
  local asked, n = asked_hosts, asked_n
  local co, main = coroutine_running()
  if co == nil or main == true then asked, n = main_thread_hosts, main_thread_n end
  for i = 1, n do
    local host = asked[i]
    local claimed = host.claims(in_task)
    if claimed then
      local blocking = host.blocking
      if not blocking then
        if claimed == true then return host end
        return claimed
      end
      if blocking == "raise" then error(host.says, 0) end
      if not host.warned then
        host.warned = true
        log.write(host.says, "warn")
      end
    end
  end
  return main_host
end

--- host = runtime.host([per_call_sleep]): the host of the code running
-- now, outside a task.
function runtime.host(per_call)
  return host_outside_task(per_call, scheduler.in_task())
end

scheduler.set_outside_wait(function(done, deadline)
  return runtime.host().await(done, deadline)
end)

---------------------------------------------------------------------------
-- rw.configure

-- The engine's options (ratewise.core's core.engine{...}).
local ENGINE_OPTIONS = { max_connections = true, max_idle_connections = true }
local MAX_LIMIT = 1000000
local HOST_OPTIONS = { sleep = true, wait = true }
local CONFIGURE_OPTIONS = { log = true, tls_warning = true }
for _, set in pairs({ ENGINE_OPTIONS, HOST_OPTIONS }) do
  for k in pairs(set) do CONFIGURE_OPTIONS[k] = true end
end
local tls_warning = true

--- runtime.configure{sleep = fn | false, wait = fn | false, log = fn | false | true,
--   max_connections = n, max_idle_connections = n, tls_warning = bool}
function runtime.configure(opts)
  if type(opts) ~= "table" then
    error(format("configure: expected a table of options (got %s)", type(opts)), 2)
  end
  local limits
  for k, v in pairs(opts) do
    if ENGINE_OPTIONS[k] then
      if type(v) ~= "number" or v % 1 ~= 0 or v < 1 or v > MAX_LIMIT then
        errors.bad_option("configure", k, format("an integer from 1 to %d", MAX_LIMIT), v, 2)
      end
      limits = limits or {}
      limits[k] = v
    elseif k == "tls_warning" then
      if type(v) ~= "boolean" then
        errors.bad_option("configure", "tls_warning", "a boolean", v, 2)
      end
      tls_warning = v
    elseif k == "log" then
      if type(v) ~= "function" and type(v) ~= "boolean" then
        error(format("configure: option 'log' must be a function, false (silence) or true (the default) (got %s)",
          type(v)), 2)
      end
    elseif not HOST_OPTIONS[k] then
      options.unknown("configure", k, CONFIGURE_OPTIONS, 2)
    elseif v ~= false and type(v) ~= "function" then
      errors.bad_option("configure", k, "a function or false", v, 2)
    end
  end
  if opts.wait and not (opts.sleep or (opts.sleep == nil and configured)) then
    error("configure: option 'wait' needs a 'sleep' too", 2)
  end
  if opts.sleep == false then
    configured = nil
  elseif opts.sleep then
    configured = host_of(opts.sleep, opts.wait or nil)
  elseif opts.wait ~= nil and configured then
    configured = host_of(configured.sleep, opts.wait or nil)
  end
  if configured then runtime.register_host(configured_host) else unregister_host("configured") end
  if limits then scheduler.engine(limits) end
  if opts.log ~= nil then log.configure(opts.log) end
end

--- Whether fetch says once that verify_tls = false checks no certificate.
function runtime.tls_warning()
  return tls_warning
end

---------------------------------------------------------------------------
-- Waiting

local function check_seconds(seconds)
  local bad = bad_seconds(seconds)
  if bad then
    error(format("sleep: seconds must be a finite number (got %s)", bad), 3)
  end
end

-- Rules 0 and 1, asked first by every wait: `not per_call and current()`
-- for a wait that is time alone (a sleep, a bucket's place), which a
-- per-call sleep takes from the task; current() alone for a transfer or a
-- descriptor, which a task waits for itself whatever sleep the call gave
-- (a sleep function cannot see a socket). A task parks in the scheduler;
-- anything else waits through runtime.host.
local current = scheduler.current
local park_in_task = scheduler.park

--- true = runtime.sleep(seconds [, per_call_sleep]): every sleep of the
-- library comes here, so this is where a wait that could never end is
-- refused: NaN or infinite seconds would make a waiting loop spin, here or
-- in a host's own sleep. A negative wait is no wait. Inside a task this is
-- a tail call to the scheduler: thousands of tasks may wait at once, and a
-- frame apiece would make each cost more.
function runtime.sleep(seconds, per_call)
  check_seconds(seconds)
  if not per_call and current() then return park_in_task(seconds) end
  runtime.host(per_call).sleep(seconds)
  return true
end

-- A bucket's place (bucket:reserve), when its time has come: its tokens
-- are claimed, or the seconds to wait on are answered (a claim comes early
-- when a waiter before it woke late). A pace, when given, moves the
-- bucket's rate while the waiter waits: pace:follow() sets it before each
-- claim, and pace:nap(wait) answers how long to wait before looking again,
-- or false when the waiter gave its place up (it will not wait that long).
-- The one claim of a bucket's waiter, wherever it waits.
local function claim(bucket, place, _, pace)
  if pace then pace:follow() end
  local wait = bucket:claim(place)
  if wait <= 0 then return nil end
  if pace then return pace:nap(wait) end
  return wait
end

-- A waiter that is gone gives its place up, or, when its tokens were
-- claimed for it before it ran (let_go: see scheduler.park), gives them back
-- (none were, when its pace gave the place up instead).
local function give_back(bucket, place, n, pace, let_go)
  if let_go and not (pace and pace.gave_up) then
    bucket:refund(n)
  else
    bucket:cancel(place)
  end
end

-- Outside a task: sleeps through the host, then claims, until the tokens
-- are claimed. A sleep that raised (a host's cancellation) gives the place
-- up before the error goes on.
local function claim_in_host(host, seconds, bucket, place, n, pace)
  local sleep = host.sleep
  repeat
    local ok, err = pcall(sleep, seconds)
    if not ok then
      give_back(bucket, place, n, pace)
      error(err, 0)
    end
    seconds = claim(bucket, place, n, pace)
  until not seconds
  return true
end

--- true = runtime.claim(bucket, place, wait, per_call_sleep [, n [, pace]]):
-- waits for a place in a bucket's queue (bucket:reserve of n tokens), due
-- in wait seconds, until its tokens are claimed. A wait that is
-- interrupted (a cancelled task, a host sleep that raised) gives the place
-- up (or the tokens back). Inside a task the scheduler does the claiming
-- (scheduler.park: claim is its resuming hook, give_back its on_cancel),
-- so no frame of the bucket's code stays on the waiting task's stack, and
-- this is a tail call to it.
function runtime.claim(bucket, place, wait, per_call, n, pace)
  if pace then wait = pace:nap(wait) end
  check_seconds(wait)
  n = n or 1
  if not per_call and current() then return park_in_task(wait, claim, give_back, bucket, place, n, pace) end
  return claim_in_host(runtime.host(per_call), wait, bucket, place, n, pace)
end

--- ready | nil, err = runtime.await_fd(fd, mode, deadline): waits until the
-- descriptor fd is ready to read (mode "r") or write ("w"), or until the
-- deadline (monotonic seconds) passes (a Redis connection: redis.lua). A
-- task parks in the scheduler; anywhere else the host at hand waits, the
-- engine watching fd beside the transfers' sockets.
function runtime.await_fd(fd, mode, deadline)
  if current() then return scheduler.await_fd(fd, mode, deadline) end
  -- the host first: where no wait is possible it raises before fd is watched
  return scheduler.await_fd(fd, mode, deadline, runtime.host().await)
end

--- runtime.unwatch_fd(fd): a descriptor that is closed is watched no more.
function runtime.unwatch_fd(fd)
  scheduler.engine():unwatch(fd)
end

--- sem = runtime.semaphore(n): see scheduler.semaphore; its waits are the
-- seam's too (a task parks, code outside any task waits through its host).
runtime.semaphore = scheduler.semaphore

--- done() came true = runtime.await(done [, deadline [, per_call_sleep]]):
-- waits outside any task until done() is true, or until the deadline (on
-- the monotonic clock) has passed.
function runtime.await(done, deadline, per_call)
  return runtime.host(per_call).await(done, deadline)
end

-- A host's wait for a transfer, apart from runtime.transfer, which makes
-- no closure itself.
local function await_done(host, transfer)
  return host.await(function() return transfer:done() end)
end

-- A host's wait for transfer that was interrupted (a cancellation, a host
-- sleep that raised, err) aborts the transfer before the error goes on.
local function interrupted(transfer, err)
  transfer:close()
  error(err, 0)
end

-- wait(a, b), a host's wait for transfer, protected as above.
local function host_wait(transfer, wait, a, b)
  local ok, err = pcall(wait, a, b)
  if not ok then interrupted(transfer, err) end
end

-- The transport error of a transfer the engine would not start.
local function not_started(err)
  return nil, { message = err, retryable = false, sent = false }
end

--- res | nil, transport_err = runtime.transfer(request [, per_call_sleep [, mt [, url]]])
-- Runs one request to completion. A wait that is interrupted (a cancelled
-- task, a host sleep that raised) aborts the transfer before the error goes on.
-- mt: the metatable the response gets (fetch's response.mt); url: its url
-- when no redirect was followed (fetch's, as it shows it).
function runtime.transfer(request, per_call, mt, url)
  -- In a task, rule 1 whatever sleep the call gave: the scheduler starts
  -- the transfer with the task for its owner (the poll that sees it end
  -- names it) and wakes the task then; a cancellation closes the transfer
  -- from inside the scheduler, with no pcall frame per request.
  local transfer, err, in_task = run_transfer(request)
  if transfer == nil then return not_started(err) end
  -- recycle: the transfer's object goes back to the engine for the next,
  -- where nothing else holds it once the wait is over (the scheduler and
  -- the hosts' await_transfer let go of it); a host of the caller's may
  -- keep await's closure over it
  local recycle = true
  if transfer == false then
    -- The host first: where no wait is possible (a phase of nginx that
    -- cannot yield) it raises, and nothing may have been started that the
    -- next turn of the engine would send.
    local host, engine = host_outside_task(per_call, in_task), err
    transfer, err = engine_start(engine, request)
    if not transfer then return not_started(err) end
    local wait, ok = host.await_transfer
    if wait then
      ok, err = pcall(wait, transfer)
    else
      recycle = false
      ok, err = pcall(await_done, host, transfer)
    end
    if not ok then interrupted(transfer, err) end
  end
  -- lazy: the header tables are made when first read (response.lua); the
  -- transfer is closed as the result is made
  return transfer_result(transfer, true, true, recycle, mt, url)
end

--- true = runtime.await_news(transfer, ready [, per_call_sleep]): waits
-- until ready() is true, ready being a look at a streamed transfer that
-- asks its engine for news when it finds none (transfer:head() or
-- transfer:read() answering nil), and that answers yes again when asked
-- again (a host may look twice): the engine's poll then reports the
-- transfer, naming the task waiting on it (its owner for that one wait:
-- scheduler.await_transfer). A wait that is interrupted (a cancelled task,
-- a host sleep that raised) aborts the transfer.
function runtime.await_news(transfer, ready, per_call)
  if scheduler.current() then
    while not ready() do scheduler.await_transfer(transfer) end
    return true
  end
  host_wait(transfer, runtime.host(per_call).await, ready)
  return true
end

--- res | nil, transport_err [, transfer] = runtime.open_stream(request [, per_call_sleep])
-- Runs a request made with stream = true until its final headers are in.
-- A 2xx answers them (status, headers; no body) and the transfer still
-- running, whose body the caller reads as it arrives. Anything else is
-- answered as runtime.transfer would, whole: a transfer that ended before
-- its headers came, and an answer that is not 2xx (which the engine reads
-- to its end under the request's timeout and max_body, so that retries
-- and errors see its body).
function runtime.open_stream(request, per_call)
  local in_task = scheduler.current() ~= nil
  if not in_task then runtime.host(per_call) end -- raises where no wait is possible, before anything starts
  local transfer, err = scheduler.engine():start(request)
  if not transfer then return not_started(err) end
  local head
  runtime.await_news(transfer, function()
    head = transfer:head()
    return head ~= nil or transfer:done()
  end, per_call)
  if head and head.status >= 200 and head.status < 300 then return head, nil, transfer end
  runtime.await_news(transfer, function() return transfer:done() end, per_call)
  local res, terr = transfer:result(true)
  transfer:close()
  return res, terr
end

return runtime
