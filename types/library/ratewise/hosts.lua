---@meta ratewise.hosts

-- The hosts a program installs or asks for by name (docs/hosts.md); the
-- others (OpenResty, cqueues, Tarantool, WeeChat) are found without one.

---@class ratewise.hosts.love.Options
---@field budget? number seconds of ratewise's work a frame at most (`rw.step`'s budget)
---@field log? fun(line: string, level: "info"|"warn"|"error") every line ratewise writes (default: the console, the last lines kept in `lines`)
---@field on_error? fun(line: string) the error of a task nobody joined (default: raised from `love.update`, which LÖVE hands to `love.errorhandler`)

---`require "ratewise.hosts.love"`: ratewise in a LÖVE game's frame loop.
---@class ratewise.hosts.love
---@field lines string[] the last lines ratewise wrote, for a game that draws them
local love_host = {}

---Steps ratewise before each `love.update`, makes a wait outside a task an
---error instead of a stalled frame, and sends the lines to `log`. Answers
---`require "ratewise"`.
---@param opts? ratewise.hosts.love.Options
---@return ratewise
function love_host.install(opts) end

---What the hook does before the game's `love.update`: one `rw.step(0, budget)`,
---then `on_error` for each task error it met. A game whose `love.run` never
---calls `love.update` calls this once a frame instead.
function love_host.update() end

---`love.update` is the game's own again, waits block again, and the lines go
---where they went before.
function love_host.uninstall() end

---`require "ratewise.hosts.nvim"`: the Neovim host, started by `require "ratewise"`
---inside Neovim.
---@class ratewise.hosts.nvim
local nvim = {}

---Whether the code runs inside Neovim.
---@return boolean
function nvim.active() end

---The driver of this Lua state (a poll handle, a timer and a prepare handle
---on `vim.loop`), started on the first call; every later call, from any
---plugin, answers the same.
---@return table
function nvim.start() end

---A line of ratewise's log, through `vim.notify` with the title `ratewise`.
---@param line string
---@param level "info"|"warn"|"error"
function nvim.notify(line, level) end
