---@meta _

-- Tasks, waiting and the state-wide settings (docs/reference.md, "Tasks and
-- waiting"; docs/hosts.md).

---@alias ratewise.TaskStatus "ready"|"running"|"waiting"|"done"

---A task started by `rw.spawn`.
---@class ratewise.Task
local Task = {}

---The task's results, or `nil, err` (`"cancelled"` for a cancelled task;
---otherwise the error with its traceback). With `timeout` (seconds), `nil,
---"timeout"` when the task has not finished by then; it goes on running.
---@param timeout? number
---@return any ...
function Task:join(timeout) end

---Ends a task that is waiting; one that has not started never runs; a
---running one is cancelled at its next wait.
function Task:cancel() end

---@return ratewise.TaskStatus
function Task:status() end

---At most `n` holders at once (`rw.semaphore(n)`).
---@class ratewise.Semaphore
local Semaphore = {}

---Waits until a place is free and answers `true`; with `timeout` (seconds),
---`false` when none came in time.
---@param timeout? number
---@return boolean
function Semaphore:acquire(timeout) end

---Hands the place to the next waiter.
function Semaphore:release() end

---`rw.pollable`: the scheduler as a pollable, in the shape `cqueues.poll`
---takes (and luasocket's `select`, through `getfd`).
---@class ratewise.Pollable
local Pollable = {}

---The descriptor to wait on until it is readable; the same for the life of the Lua state.
---nil in a build with the poll(2) backend: wait for `timeout()` alone.
---@return integer|nil fd
function Pollable:pollfd() end

---The same descriptor, for luasocket's `select`.
---@return integer|nil fd
function Pollable:getfd() end

---What to wait for on the descriptor.
---@return "r"
function Pollable:events() end

---Seconds until `rw.step(0)` is due even if the descriptor stays quiet (0:
---now; nil: nothing is due until a socket moves).
---@return number|nil seconds
function Pollable:timeout() end

---cqueues asks it; the descriptor never needs polling again before its readiness.
---@return false
function Pollable:dirty() end

---@class ratewise.MapOptions
---@field concurrency? integer calls at once (default: every item)

---@alias ratewise.LogLevel "info"|"warn"|"error"

---The options of `rw.configure`. Unknown options raise.
---@class ratewise.ConfigureOptions
---@field sleep? fun(seconds: number)|false a host's sleep for every wait outside tasks; `false` removes it
---@field wait? fun(pollable: ratewise.Pollable, seconds: number)|false with `sleep`: returns once the pollable is readable or the seconds passed
---@field max_connections? integer connections open at once over every request (default 256)
---@field max_idle_connections? integer connections a quiet program keeps for reuse (default 64)
---@field tls_warning? boolean `false`: no log line when a call sets verify_tls = false
---@field log? fun(line: string, level: ratewise.LogLevel)|boolean receives every line ratewise writes; `false`: none; `true`: the host's default
