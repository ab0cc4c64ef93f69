-- ratewise in a LÖVE game (11.x): what a game needs that a script does not.
--   The core: a C module inside a .love or a fused game cannot be loaded
--   from there (the OS loads libraries from files, not from a zip), so when
--   a plain require of ratewise.core fails, the copy the game ships is
--   written to the game's save directory and loaded from there.
--   The frame: every frame steps ratewise's tasks, with a budget, before
--   the game's own love.update; a wait outside a task (a bare rw.fetch)
--   would stop the frames for all its time, so it raises instead.
--   The lines: retries and warnings go to the game's log function (by
--   default the console, and the last lines kept for drawing), and the
--   error of a task nobody joined goes to the game's on_error (by default
--   raised from love.update, which LÖVE hands to love.errorhandler).
local compat = require "ratewise.compat"

local rawget, rawset, type, error, pcall, require, tostring, ipairs, format =
  rawget, rawset, type, error, pcall, require, tostring, ipairs, string.format
local getmetatable, setmetatable, remove = getmetatable, setmetatable, table.remove

local love_host = {}

local function love_api()
  local love = rawget(_G, "love")
  if type(love) ~= "table" or type(love.filesystem) ~= "table" then
    error("ratewise.hosts.love: not running in LÖVE (no love.filesystem)", 3)
  end
  return love
end

---------------------------------------------------------------------------
-- The core

-- Where the game ships the core: the module's own path, so that a game
-- run from its folder (where LÖVE's loader finds it) and the same game
-- zipped need the same tree. The suffixes are the ones LÖVE's own loader
-- of C modules tries on each system.
local CORE = "ratewise/core"
-- Where it goes in the save directory: a path of its own, since LÖVE
-- shows the save directory over the game's files, and a copy at the
-- game's path would hide the game's newer core from the next start.
local EXTRACTED_DIR = "ratewise-core"

local function suffixes()
  local jit = rawget(_G, "jit")
  local os_name = type(jit) == "table" and jit.os or nil
  if os_name == "Windows" or package.config:sub(1, 1) == "\\" then return { ".dll" } end
  if os_name == "OSX" or os_name == "iOS" then return { ".dylib", ".so" } end
  return { ".so" }
end

local function read_real(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local data = f:read("*a")
  f:close()
  return data
end

-- The core the game ships, written to the save directory unless the copy
-- there already has the same bytes, and loaded from there.
local function extract_core(love, not_found)
  local fs = love.filesystem
  for _, suffix in ipairs(suffixes()) do
    local shipped = CORE .. suffix
    local info = fs.getInfo(shipped)
    if info and info.type == "file" then
      local bytes, rerr = fs.read(shipped)
      if not bytes then error(format("ratewise: cannot read %s inside the game: %s", shipped, tostring(rerr)), 0) end
      local target = EXTRACTED_DIR .. "/core" .. suffix
      local path = fs.getSaveDirectory() .. "/" .. target
      if suffix == ".dll" then path = path:gsub("/", "\\") end
      if read_real(path) ~= bytes then
        fs.createDirectory(EXTRACTED_DIR)
        local ok, werr = fs.write(target, bytes)
        if not ok then
          error(format("ratewise: cannot write the core to the save directory (%s): %s", path, tostring(werr)), 0)
        end
      end
      local open, lerr = package.loadlib(path, "luaopen_ratewise_core")
      if not open then
        error(format("ratewise: cannot load the core extracted from the game to %s: %s", path, tostring(lerr)), 0)
      end
      local core = open("ratewise.core")
      package.loaded["ratewise.core"] = core
      return core
    end
  end
  error(format("%s\n\tno '%s%s' inside the game to extract either (ratewise.hosts.love)", not_found, CORE,
    suffixes()[1]), 0)
end

local function load_core()
  if package.loaded["ratewise.core"] then return end
  local ok, err = pcall(require, "ratewise.core")
  if ok then return end
  err = tostring(err)
  -- A core that was found and failed to load (a library it needs is
  -- missing) fails the same way from the save directory.
  if not err:find("module 'ratewise.core' not found", 1, true) then error(err, 0) end
  extract_core(love_api(), err)
end

load_core()

local rw = require "ratewise"
local log = require "ratewise.log"
local options = require "ratewise.options"
local runtime = require "ratewise.runtime"

---------------------------------------------------------------------------
-- The lines and the errors

-- The last lines, for a game that draws them: love_host.lines.
local KEEP_LINES = 20
love_host.lines = {}

local function keep(line)
  local lines = love_host.lines
  lines[#lines + 1] = line
  if #lines > KEEP_LINES then remove(lines, 1) end
end

-- print as it is when called: a game may have made it its own console's
local function console(line)
  print(line)
  keep(line)
end

local function raise(err)
  error(err, 0)
end

local game_log = console
local on_error = raise
-- The errors of tasks nobody joined, met while ratewise's step ran: they
-- reach on_error after the step, from love.update, and not from inside
-- the scheduler, which is in the middle of ending the task.
local failed, failed_n = {}, 0

local function sink(line, level)
  if level == "error" then
    failed_n = failed_n + 1
    failed[failed_n] = line
  end
  game_log(line, level)
end

---------------------------------------------------------------------------
-- The frame

local budget = nil -- rw.step's own
-- The thread that runs LÖVE's callbacks (the one that steps ratewise): a
-- wait there outside a task would hold every frame until it ended.
local frame_thread = nil
local guarding = false

--- love_host.update(): what the hook does before the game's love.update:
-- one rw.step(0, budget), then on_error for each task error it met. A game
-- whose love.run never calls love.update calls this once a frame instead.
function love_host.update()
  frame_thread = compat.running()
  rw.step(0, budget)
  while failed_n > 0 do
    local err = failed[1]
    remove(failed, 1)
    failed_n = failed_n - 1
    on_error(err)
  end
end

-- The game's love.update, whenever it was set: love.update reads as the
-- hook (the love table's metatable), which calls it.
local game_update = nil
local installed_on = nil -- the love table, while installed
local hook_mt = {
  __index = {
    update = function(dt)
      love_host.update()
      if game_update then return game_update(dt) end
    end,
  },
  __newindex = function(t, k, v)
    if k == "update" then
      game_update = v
    else
      rawset(t, k, v)
    end
  end,
}

-- Registered with the seam (ratewise/runtime.lua) at rank 30: a wait
-- outside a task on the thread of LÖVE's callbacks, while installed,
-- raises before anything is sent.
runtime.register_host {
  name = "love",
  rank = 30,
  claims = function() return guarding and compat.running() == frame_thread end,
  blocking = "raise",
  says = "ratewise: a wait outside a task (a bare rw.fetch, rw.sleep, rw.run, task:join()) would freeze LÖVE's "
    .. "frame for all of its time: call rw.spawn(function() ... end) from love.update instead "
    .. "(ratewise.hosts.love steps the tasks every frame)",
}

local OPTIONS = { budget = true, log = true, on_error = true }

--- rw = love_host.install([{budget = s, log = fn, on_error = fn}])
--   budget    seconds of ratewise's work a frame at most (rw.step's budget)
--   log       fn(line, level) for every line ratewise writes (default: the
--             console, the last lines kept in love_host.lines)
--   on_error  fn(line) for the error of a task nobody joined (default: raise
--             it from love.update, which LÖVE hands to love.errorhandler)
function love_host.install(opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error(format("ratewise.hosts.love.install: expected a table of options (got %s)", type(opts)), 2)
  end
  for k in pairs(opts) do
    if not OPTIONS[k] then options.unknown("ratewise.hosts.love.install", k, OPTIONS, 2) end
  end
  local b = opts.budget
  if b ~= nil and (type(b) ~= "number" or b ~= b or b <= 0 or b == math.huge) then
    error(format("ratewise.hosts.love.install: budget must be a positive number of seconds (got %s)", tostring(b)), 2)
  end
  for _, k in ipairs({ "log", "on_error" }) do
    if opts[k] ~= nil and type(opts[k]) ~= "function" then
      error(format("ratewise.hosts.love.install: %s must be a function (got %s)", k, type(opts[k])), 2)
    end
  end
  local love = love_api()
  local mt = getmetatable(love)
  if mt ~= nil and mt ~= hook_mt then
    error("ratewise.hosts.love.install: the love table has a metatable of another's; "
      .. "call love_host.update() from love.update instead", 2)
  end
  budget = b
  game_log = opts.log or console
  on_error = opts.on_error or raise
  if mt == nil then
    game_update = rawget(love, "update")
    rawset(love, "update", nil)
    setmetatable(love, hook_mt)
    installed_on = love
  end
  log.set_host(sink)
  frame_thread, guarding = compat.running(), true
  return rw
end

--- love_host.uninstall(): love.update is the game's own again, waits
-- block again, and the lines go where they went before.
function love_host.uninstall()
  if not guarding then return end
  if installed_on then
    setmetatable(installed_on, nil)
    rawset(installed_on, "update", game_update)
    installed_on, game_update = nil, nil
  end
  guarding = false
  log.set_host(nil)
end

return love_host
