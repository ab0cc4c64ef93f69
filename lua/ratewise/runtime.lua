-- How ratewise waits: the one module that knows which host it runs on.
-- Every wait of the library comes here: a sleep (backoff and hints), a
-- bucket's place (buckets and limiters: runtime.claim), a transfer in
-- flight and a stream's news (runtime.transfer, runtime.await_news), a
-- Redis reply (runtime.await_fd, on its connection's descriptor), and,
-- from outside a task, a join, a semaphore, a group of tasks (the
-- scheduler's outside wait, set below). Each is served by the first of
-- these that applies, one precedence for all:
--   0. a per-call `sleep` option, for a wait that is time alone (a sleep,
--      a bucket's place): the caller said how to wait. Outside a task it
--      serves the call's transfers too, checked on between naps; a task
--      waits for its transfers and descriptors itself (rule 1), which a
--      sleep function cannot see;
--   1. a ratewise task: it parks in ratewise's scheduler (scheduler.park,
--      run_transfer, await_transfer, await_fd), with no frame of the wait's
--      code on its stack;
--   2. OpenResty, in a phase that can yield: ngx.sleep, and one driver per
--      worker that runs the engine and wakes each waiting request through
--      an ngx.semaphore (hosts/openresty.lua); the phases that cannot
--      yield raise a clear error instead of blocking the worker;
--   3. a host given to rw.configure{sleep = fn [, wait = fn]};
--      past it, a host whose loop's thread must never wait (a LÖVE game's
--      frame, hosts/love.lua) raises there instead;
--   4. a coroutine of a cqueues controller: cqueues.sleep, and
--      cqueues.poll on the scheduler's descriptor (hosts/cqueues.lua);
--   5. any other coroutine: it yields ("ratewise.sleep", seconds, pollable),
--      and whoever resumes it does so once the seconds have passed or the
--      pollable's descriptor is readable (the one ratewise would wait on);
--      not one a task resumes, whose yield would go to the task's code;
--   6. the main thread: it runs the scheduler, blocking in the engine's
--      poll until a socket or a timer is due (in Neovim that holds up the
--      editor: its loop runs ratewise's tasks, hosts/nvim.lua, so a
--      plugin's waits belong in tasks).
-- Rules 0 and 1 are asked by each wait (per_call, scheduler.current());
-- rules 0 and 2 to 6 by runtime.host. Outside a task, whatever waits also
-- runs the scheduler between its waits, so that tasks and transfers of
-- others go on meanwhile.
-- One owner per transfer: who waits for a transfer's end or a stream's
-- news is the transfer's owner, kept by the engine and named by its poll;
-- only the scheduler sets it (run_transfer, await_transfer, and
-- scheduler.own for a driven host's waiter). This module and the hosts
-- keep no record of their own of which transfer a waiter waits for.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local scheduler = require "ratewise.scheduler"
local openresty = require "ratewise.hosts.openresty"
local cqueues = require "ratewise.hosts.cqueues"
local nvim = require "ratewise.hosts.nvim"
local log = require "ratewise.log"

local now = core.now
-- (as in scheduler.lua: called once a request, as local functions)
local engine_start, transfer_result = core.engine_methods.start, core.transfer_methods.result
local bad_seconds = scheduler.bad_seconds
local run_transfer = scheduler.run_transfer
local isyieldable, pcall = compat.isyieldable, compat.pcall
local yield = coroutine.yield
local format, min = string.format, math.min
local type, error, tostring, pairs = type, error, tostring, pairs
local loaded = package.loaded

local runtime = {}

-- A host that can only sleep cannot be woken by a socket: while transfers
-- are in flight it checks on them between naps growing from NAP_FIRST to
-- NAP_MAX. A host waiting for something another party of the host will do
-- (a semaphore another coroutine holds), with nothing due in ratewise,
-- looks again every EVENT_POLL seconds.
local NAP_FIRST, NAP_MAX, EVENT_POLL = 0.001, 0.01, 0.05

-- Waits for done() by running the scheduler between calls of block(t),
-- which waits at most t seconds, or until the scheduler's descriptor is
-- readable if it can. sleep_only: block cannot see the descriptor, so
-- transfers in flight are checked on between naps. Answers whether done()
-- came true before the deadline.
local function await_with(block, sleep_only, done, deadline)
  local nap = NAP_FIRST
  while true do
    scheduler.step(0, false) -- all that is ready: done() is looked at next
    if done() then return true end
    local left = deadline and deadline - now()
    if left and left <= 0 then return false end
    local t = scheduler.timeout()
    if sleep_only and scheduler.transfers_running() then
      if not t or t > nap then t = nap end
      nap = min(nap * 2, NAP_MAX)
    else
      nap = NAP_FIRST
    end
    if not t then t = EVENT_POLL end
    if left and left < t then t = left end
    block(t)
  end
end

---------------------------------------------------------------------------
-- The hosts: sleep(seconds), await(done, deadline) -> done() came true

local main_host = {
  sleep = function(seconds) scheduler.sleep(seconds) end,
  await = scheduler.drive_until,
  -- a wait for the transfer runtime.transfer has just started, without a
  -- closure over it (a sequential fetch's)
  await_transfer = scheduler.await_started,
}

-- Rule 5. The seconds are the scheduler's own next deadline (libcurl's
-- timer, a task's wake-up), not naps: the resumer waits until
-- pollable:pollfd() is readable or the seconds have passed. A resumer that
-- can only count time resumes the coroutine on each of its turns (a
-- frame): resumed early, a wait looks at what it waits for and yields
-- again with what is left.
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

-- A sleep resumed early asks again for what is left, so the wait is never
-- shorter than asked.
local coroutine_host = {
  sleep = function(seconds)
    local deadline = now() + seconds
    repeat
      resumed(yield("ratewise.sleep", deadline - now()))
    until now() >= deadline
  end,
  await = function(done, deadline) return await_with(yield_for, false, done, deadline) end,
}

-- A host made of a sleep function (and a wait(pollable, seconds), if it
-- can wait on a descriptor).
local function host_of(sleep, wait)
  local block = wait and function(t) wait(scheduler.pollable, t) end or sleep
  return {
    sleep = sleep,
    await = function(done, deadline) return await_with(block, not wait, done, deadline) end,
  }
end

-- A coroutine of the caller's own that a task resumes (its code, or one
-- that code resumed) cannot reach the scheduler: its yield goes to the
-- task's code (as items of a `for ... in coroutine.wrap(fn)` loop), and
-- the thread cannot block in the scheduler's poll while a task runs.
local NESTED_IN_TASK = "ratewise: a coroutine of your own inside a task (coroutine.wrap, say) called ratewise, "
  .. "which would have to wait: its yield would go to the task's code, not to the scheduler. Call ratewise "
  .. "from the task itself, or make each item a task of its own (rw.spawn, rw.map) and collect the results"
local task_resuming = scheduler.in_task

local configured -- rw.configure{sleep = fn [, wait = fn]}
-- A host whose loop runs on a thread that must never wait (a game's frame,
-- hosts/love.lua): it raises there, before anything is started.
local frame_guard = nil
local per_call_hosts = setmetatable({}, { __mode = "k" })

local function per_call_host(sleep)
  local host = per_call_hosts[sleep]
  if not host then
    host = host_of(sleep)
    per_call_hosts[sleep] = host
  end
  return host
end

-- The host of the code running now, outside a task (rules 0 and 2 to 6).
-- in_task: whether a task is being run (scheduler.in_task), asked by the
-- caller, which may know it already.
local function host_outside_task(per_call, in_task)
  if per_call then return per_call_host(per_call) end
  -- Each host is asked only where it can be (nginx's `ngx` module, which
  -- OpenResty puts in package.loaded beside its global as it starts;
  -- cqueues loaded): a sequential fetch in a plain script asks at every
  -- call, and asking both each time showed in its instructions
  -- (bench/HISTORY.md). Looked up in package.loaded, not with
  -- rawget(_G, "ngx"): a field, not a call.
  if loaded.ngx ~= nil and openresty.active() then
    return openresty.host() -- raises in a phase that cannot yield
  end
  if configured then return configured end
  if frame_guard then frame_guard() end
  if loaded.cqueues ~= nil and cqueues.active() then return cqueues.host() end
  if in_task then error(NESTED_IN_TASK, 0) end
  if isyieldable() then return coroutine_host end -- (never the main thread)
  return main_host
end

--- host = runtime.host([per_call_sleep]): the host of the code running
-- now, outside a task (rules 0 and 2 to 6).
function runtime.host(per_call)
  return host_outside_task(per_call, task_resuming())
end

--- runtime.set_frame_guard(fn | nil): fn() raises where a wait outside a
-- task would hold up the host's loop; asked before rules 4 to 6.
function runtime.set_frame_guard(fn)
  frame_guard = fn
end

scheduler.set_outside_wait(function(done, deadline)
  return runtime.host().await(done, deadline)
end)
scheduler.set_kick(function()
  openresty.kick()
  cqueues.kick()
end)

-- Inside Neovim the editor's loop runs ratewise's tasks (hosts/nvim.lua):
-- a task spawned by any plugin runs with nothing more to set up.
if nvim.active() then nvim.start() end

---------------------------------------------------------------------------
-- rw.configure

-- The engine's options (ratewise.core's core.engine{...}).
local ENGINE_OPTIONS = { max_connections = true, max_idle_connections = true }
local MAX_LIMIT = 1000000
local HOST_OPTIONS = { sleep = true, wait = true }
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
      error(format("configure: unknown option '%s'", tostring(k)), 2)
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

-- Outside a task: sleeps through the host, then asks resuming(a, b, c, d)
-- (see scheduler.park) until it answers nothing. A sleep that raised (a
-- host's cancellation) calls on_cancel(a, b, c, d) before the error goes on.
local function park_in_host(host, seconds, resuming, on_cancel, a, b, c, d)
  local sleep = host.sleep
  repeat
    if on_cancel then
      local ok, err = pcall(sleep, seconds)
      if not ok then
        on_cancel(a, b, c, d)
        error(err, 0)
      end
    else
      sleep(seconds)
    end
    seconds = resuming and resuming(a, b, c, d)
  until not seconds
  return true
end

--- true = runtime.park(seconds, per_call_sleep, resuming, on_cancel, a, b, c, d):
-- the wait of the seam that every timed wait is: waits seconds, then asks
-- resuming(a, b, c, d) (if given) whether to wait on (seconds) or go on
-- (nothing); an interrupted wait (a cancelled task, a host sleep that
-- raised) calls on_cancel(a, b, c, d, resumed) before the error goes on,
-- resumed telling, in a task, that resuming had let it go. Inside a task
-- this is a tail call to the scheduler: thousands of tasks may wait at
-- once, and a frame apiece would make each cost more.
function runtime.park(seconds, per_call, resuming, on_cancel, a, b, c, d)
  check_seconds(seconds)
  if not per_call and current() then return park_in_task(seconds, resuming, on_cancel, a, b, c, d) end
  return park_in_host(runtime.host(per_call), seconds, resuming, on_cancel, a, b, c, d)
end

--- true = runtime.sleep(seconds [, per_call_sleep [, on_cancel, a, b]]):
-- every sleep of the library comes here, so this is where a wait that
-- could never end is refused: NaN or infinite seconds would make a waiting
-- loop spin, here or in a host's own sleep. A negative wait is no wait.
-- A wait that is interrupted (a cancelled task, a host sleep that raised)
-- calls on_cancel(a, b) before the error goes on.
function runtime.sleep(seconds, per_call, on_cancel, a, b)
  check_seconds(seconds)
  if not per_call and current() then return park_in_task(seconds, nil, on_cancel, a, b) end
  return park_in_host(runtime.host(per_call), seconds, nil, on_cancel, a, b)
end

-- A bucket's place (bucket:reserve), when its time has come: its tokens
-- are claimed, or the seconds to wait on are answered (a claim comes early
-- when a waiter before it woke late). A pace, when given, moves the
-- bucket's rate while the waiter waits: pace:follow() sets it before each
-- claim, and pace:nap(wait) answers how long to wait before looking again.
-- The one claim of a bucket's waiter, wherever it waits.
local function claim(bucket, place, _, pace)
  if pace then pace:follow() end
  local wait = bucket:claim(place)
  if wait <= 0 then return nil end
  if pace then return pace:nap(wait) end
  return wait
end

-- A waiter that is gone gives its place up, or, when its tokens were
-- claimed for it before it ran (let_go: see scheduler.park), gives them back.
local function give_back(bucket, place, n, _, let_go)
  if let_go then
    bucket:refund(n)
  else
    bucket:cancel(place)
  end
end

--- true = runtime.claim(bucket, place, wait, per_call_sleep [, n [, pace]]):
-- waits for a place in a bucket's queue (bucket:reserve of n tokens), due
-- in wait seconds, until its tokens are claimed. A wait that is
-- interrupted gives the place up (or the tokens back). Inside a task the
-- scheduler does the claiming (scheduler.park), so no frame of the
-- bucket's code stays on the waiting task's stack.
function runtime.claim(bucket, place, wait, per_call, n, pace)
  if pace then wait = pace:nap(wait) end
  return runtime.park(wait, per_call, claim, give_back, bucket, place, n or 1, pace)
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

-- A host's wait for a transfer, apart from runtime.transfer: a closure
-- inside it would cost LuaJIT's compiler every return of it (closing
-- upvalues is not compiled).
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
    -- (run_transfer's false comes with the engine, and whether a task is being run)
    local host, engine = host_outside_task(per_call, in_task), err
    transfer, err = engine_start(engine, request)
    if not transfer then return not_started(err) end
    -- (host_wait's protected call, made here: a call less a request)
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
