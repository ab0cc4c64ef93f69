-- ratewise in a real LÖVE game (Debian's love 11.4, on the installed
-- LuaJIT) under Xvfb: spec/support/love_game/ spawns requests that wait out
-- a Retry-After while it keeps its frames, tries a bare rw.fetch from
-- love.update, and lets a task fail unjoined; its love.errorhandler writes
-- what the game saw and the game ends. Run from its folder (the core found
-- on the cpath), and zipped into a .love with the core inside, which LÖVE
-- cannot load from there: the host extracts it to the save directory.
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

local GAME = "spec/support/love_game/"
local LUAJIT_CORE = "build-luajit/ratewise/core.so" -- love runs LuaJIT (make luajit-core)
local REQUESTS = 8
local RETRY_AFTER = 1

local read_file = server.read_file

local function write_file(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

local function sh(command)
  local out, code = subprocess.shell(command)
  assert(code == 0, command .. " failed:\n" .. out)
  return out
end

local function q(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function temp_dir()
  return (sh("mktemp -d"):gsub("%s+$", ""))
end

-- The game's folder: the spec's game and a config.lua for this run.
local function game_dir(config)
  local dir = temp_dir()
  sh("cp " .. GAME .. "main.lua " .. GAME .. "conf.lua " .. q(dir))
  local lines = {}
  for k, v in pairs(config) do
    lines[#lines + 1] = string.format("  %s = %s,", k, type(v) == "string" and string.format("%q", v) or tostring(v))
  end
  write_file(dir .. "/config.lua", "return {\n" .. table.concat(lines, "\n") .. "\n}\n")
  return dir
end

-- Runs the game (a folder or a .love) with its save directory under
-- data_home; the output and what the game wrote to its results file.
-- fused: the game is love's executable with the .love after it, run as it is.
local function play(game, data_home, results_file, fused)
  -- love runs LuaJIT: the suite's LUA_PATH and LUA_CPATH name this Lua's build
  local out, code = subprocess.shell("cd /tmp && env -u LUA_PATH -u LUA_CPATH XDG_DATA_HOME=" .. q(data_home)
    .. " timeout 90 xvfb-run -a " .. (fused and "" or "love ") .. q(game))
  local text = read_file(results_file)
  assert(text and text ~= "", "the game wrote no results (exit " .. tostring(code) .. "):\n" .. out)
  local results = { logged = {} }
  for key, value in text:gmatch("(%S+) ([^\n]*)\n") do
    if key == "logged" then
      results.logged[#results.logged + 1] = value
    else
      results[key] = tonumber(value) or value
    end
  end
  return results, out
end

-- docs/hosts.md's LÖVE example: the ```lua block that begins "-- main.lua".
local function docs_example()
  local text = read_file("docs/hosts.md")
  local code = text:match("\n```lua\n(%-%- main%.lua\n.-)```\n")
  assert(code, "docs/hosts.md has no ```lua block that begins with -- main.lua")
  return code
end

describe("ratewise.hosts.love in a LÖVE game under Xvfb", function()
  local api, root

  setup(function()
    api = server.start()
    root = (sh("pwd"):gsub("%s+$", ""))
    assert(read_file(LUAJIT_CORE), "no " .. LUAJIT_CORE .. ": make luajit-core")
  end)
  teardown(function() api:stop() end)
  local function script_api()
    api:reset()
    local busy = { status = 429, headers = { ["Retry-After"] = tostring(RETRY_AFTER) } }
    local steps = {}
    for i = 1, REQUESTS do steps[i] = busy end
    steps[REQUESTS + 1] = { status = 200, body = "ok", delay = 0.2 }
    api:script("/api", steps)
  end
  before_each(script_api)

  -- The game zipped with ratewise and the core inside: the .love's path.
  local function love_file_of(results_file)
    local dir = game_dir { url = api:url(""), out = results_file, requests = REQUESTS }
    sh("mkdir -p " .. q(dir .. "/ratewise") .. " && cp -r lua/ratewise/. " .. q(dir .. "/ratewise/")
      .. " && cp " .. LUAJIT_CORE .. " " .. q(dir .. "/ratewise/core.so"))
    local love_file = dir .. ".love"
    sh("cd " .. q(dir) .. " && /usr/bin/python3 -m zipfile -c " .. q(love_file)
      .. " main.lua conf.lua config.lua ratewise && rm -rf " .. q(dir))
    return love_file
  end

  -- What every run of the game must show.
  local function check_game(results)
    -- every request answered after its Retry-After, and the server saw each attempt
    local statuses = {}
    for i = 1, REQUESTS do statuses[i] = "200" end
    assert.equal(table.concat(statuses, ","), results.statuses)
    assert.equal(2 * REQUESTS, #api:log("/api"))
    -- the bare fetch raised on the frame's thread, before anything was sent
    assert.truthy(tostring(results.bare):find("would freeze LÖVE's frame", 1, true), results.bare)
    assert.equal(0, #api:log("/bare"))
    -- frames went on while the requests waited: a frame that waited for a
    -- request would have lasted the Retry-After at least
    assert.is_true(results.frames >= 30, "frames: " .. tostring(results.frames))
    assert.is_true(results.max_frame < RETRY_AFTER * 0.75, "slowest frame: " .. tostring(results.max_frame))
    assert.is_true(results.max_frame_cpu < 0.2, "most CPU in a frame: " .. tostring(results.max_frame_cpu))
    -- ratewise's step in each frame: its budget of work, and libcurl's
    -- connecting the requests in the first
    assert.is_true(results.max_step_cpu < 0.05, "most CPU in a step: " .. tostring(results.max_step_cpu))
    -- the unjoined task's error reached the game's love.errorhandler
    assert.truthy(results.handled:find("a task failed and nobody joined it", 1, true), results.handled)
    assert.truthy(results.handled:find("the leaderboard task failed", 1, true), results.handled)
  end

  it("keeps its frames while requests wait, and hands lines and task errors to the game", function()
    local results_file = os.tmpname()
    local dir = game_dir {
      url = api:url(""), out = results_file, requests = REQUESTS, custom_log = true,
      lua_path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua", cpath = root .. "/build-luajit/?.so",
    }
    local data_home = temp_dir()
    local results = play(dir, data_home, results_file)
    check_game(results)
    -- the retry lines went to the game's log function, not to stderr
    local retries, error_lines = 0, 0
    for _, line in ipairs(results.logged) do
      if line:find("^info: retrying GET ") then retries = retries + 1 end
      if line:find("^error: ratewise: a task failed and nobody joined it") then error_lines = error_lines + 1 end
    end
    assert.equal(REQUESTS, retries)
    assert.equal(1, error_lines)
    -- the core came from the cpath: nothing was extracted
    assert.is_nil(read_file(data_home .. "/love/ratewise-spec/ratewise-core/core.so"))
    sh("rm -rf " .. q(dir) .. " " .. q(data_home))
    os.remove(results_file)
  end)

  it("runs docs/hosts.md's example: the answer and the retry line reach the screen", function()
    api:script("/leaderboard", { { status = 429, headers = { ["Retry-After"] = "1" } },
      { status = 200, body = "alice 120, bob 95" } })
    local results_file = os.tmpname()
    local dir = game_dir {
      out = results_file, lua_path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua",
      cpath = root .. "/build-luajit/?.so",
    }
    write_file(dir .. "/example.lua", (docs_example():gsub("https://api%.example%.com", api:url(""))))
    -- main.lua runs the example, and reads what it draws until the answer is there
    write_file(dir .. "/main.lua", [[
local cfg = require "config"
package.path = cfg.lua_path .. ";" .. package.path
package.cpath = cfg.cpath .. ";" .. package.cpath
local drawn, print_text = {}, love.graphics.print
love.graphics.print = function(text, ...)
  drawn[#drawn + 1] = tostring(text)
  return print_text(text, ...)
end
require "example"
local draw, started = love.draw, love.timer.getTime()
local function finish(what)
  local out = assert(io.open(cfg.out, "w"))
  out:write((what:gsub("\n", " | ")), "\n")
  out:close()
  love.event.quit(0)
end
function love.errorhandler(msg) finish("error " .. tostring(msg)) end
function love.draw()
  draw()
  local screen = table.concat(drawn, "\n")
  drawn = {}
  if screen:find("alice 120", 1, true) then return finish("shown " .. screen) end
  if love.timer.getTime() - started > 20 then finish("timeout " .. screen) end
end
]])
    local out = subprocess.shell("cd /tmp && env -u LUA_PATH -u LUA_CPATH XDG_DATA_HOME=" .. q(temp_dir())
      .. " timeout 30 xvfb-run -a love " .. q(dir))
    local shown = read_file(results_file)
    assert(shown and shown ~= "", "the example wrote nothing:\n" .. out)
    assert.truthy(shown:find("^shown alice 120, bob 95 | "), shown)
    assert.truthy(shown:find("retrying GET " .. api:url("/leaderboard"), 1, true), shown)
    assert.equal(2, #api:log("/leaderboard"))
    sh("rm -rf " .. q(dir))
    os.remove(results_file)
  end)

  it("runs as a .love with the core inside, extracting it to the save directory", function()
    local results_file = os.tmpname()
    local love_file = love_file_of(results_file)
    -- a stale copy from an earlier version of the game: replaced
    local data_home = temp_dir()
    local extracted = data_home .. "/love/ratewise-spec/ratewise-core/core.so"
    sh("mkdir -p " .. q(data_home .. "/love/ratewise-spec/ratewise-core"))
    write_file(extracted, "an older core")
    local results, out = play(love_file, data_home, results_file)
    check_game(results)
    assert.equal(read_file(LUAJIT_CORE), read_file(extracted))
    -- the default log: the console, and the last lines kept for the screen
    assert.truthy(out:find("retrying GET ", 1, true), out)
    assert.is_true(results.on_screen > 0)
    sh("rm -rf " .. q(love_file) .. " " .. q(data_home))
    os.remove(results_file)
  end)

  it("runs fused (love's executable and the .love in one file), and keeps a copy that is the same", function()
    local results_file = os.tmpname()
    local love_file = love_file_of(results_file)
    local game = love_file:gsub("%.love$", "")
    sh("cat \"$(command -v love)\" " .. q(love_file) .. " > " .. q(game) .. " && chmod +x " .. q(game))
    local data_home = temp_dir()
    local extracted = data_home .. "/ratewise-spec/ratewise-core/core.so" -- a fused game's own save directory
    check_game((play(game, data_home, results_file, true)))
    assert.equal(read_file(LUAJIT_CORE), read_file(extracted))
    -- the next start finds the same bytes there and leaves the file alone
    local function modified() return sh("stat -c %y " .. q(extracted)) end
    local first = modified()
    os.remove(results_file)
    script_api()
    check_game((play(game, data_home, results_file, true)))
    assert.equal(first, modified())
    sh("rm -rf " .. q(love_file) .. " " .. q(game) .. " " .. q(data_home))
    os.remove(results_file)
  end)
end)

-- The host's contract, in this process: `love` is a table of the spec's
-- (the core is on the cpath, so nothing of LÖVE's is used but the slots
-- install keeps), and the requests go to the test server.
-- luacheck: globals love
describe("ratewise.hosts.love's install", function()
  local rw = require "ratewise"
  local api, love_host

  setup(function()
    api = server.start()
    _G.love = { filesystem = {} }
    love_host = require "ratewise.hosts.love"
  end)
  teardown(function()
    love_host.uninstall()
    _G.love = nil
    api:stop()
  end)
  after_each(function() love_host.uninstall() end)

  it("refuses options it does not know, and bad ones, by name", function()
    assert.has_error(function() love_host.install { budgte = 0.001 } end,
      "ratewise.hosts.love.install: unknown option 'budgte' (did you mean 'budget'?)")
    assert.has_error(function() love_host.install { budget = 0 } end,
      "ratewise.hosts.love.install: budget must be a positive number of seconds (got 0)")
    assert.has_error(function() love_host.install { on_error = "print" } end,
      "ratewise.hosts.love.install: on_error must be a function (got string)")
    assert.has_error(function() love_host.install "quiet" end,
      "ratewise.hosts.love.install: expected a table of options (got string)")
  end)

  it("steps ratewise before the game's love.update, whenever the game sets it", function()
    local calls = {}
    function love.update(dt) calls[#calls + 1] = "before install " .. dt end
    assert.equal(rw, love_host.install())
    love.update(1)
    function love.update(dt) calls[#calls + 1] = "after install " .. dt end
    local done = false
    rw.spawn(function() done = true end)
    love.update(2)
    assert.is_true(done) -- the step ran the task, then the game's update ran
    assert.same({ "before install 1", "after install 2" }, calls)
    love_host.uninstall()
    love.update(3) -- the game's own again
    assert.equal(3, #calls)
    assert.is_nil(getmetatable(love))
  end)

  it("raises on a wait outside a task, before anything is sent; tasks and the per-call sleep wait", function()
    api:reset()
    love_host.install()
    local ok, err = pcall(rw.fetch, api:url("/bare"))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("would freeze LÖVE's frame", 1, true), err)
    assert.has_error(function() rw.sleep(0.01) end)
    assert.equal(0, #api:log("/bare"))
    local status
    rw.spawn(function() status = rw.fetch(api:url("/task"), { on_retry = false }).status end)
    local deadline = rw.now() + 5
    while status == nil and rw.now() < deadline do love.update(0) end
    assert.equal(200, status)
    assert.equal(200, rw.fetch(api:url("/blocking"), { sleep = require("socket").sleep }).status)
    love_host.uninstall()
    assert.equal(200, rw.fetch(api:url("/bare")).status) -- blocking again
  end)

  it("hands an unjoined task's error to on_error after the step, and lines to the log function", function()
    local lines, errors = {}, {}
    love_host.install {
      log = function(line, level) lines[#lines + 1] = level .. ": " .. line end,
      on_error = function(line) errors[#errors + 1] = line end,
    }
    rw.spawn(function() error("the save failed") end)
    love.update(0)
    assert.equal(1, #errors)
    assert.truthy(errors[1]:find("a task failed and nobody joined it: .*the save failed"), errors[1])
    assert.truthy(lines[1]:find("^error: ratewise: a task failed and nobody joined it"), lines[1])
  end)

  it("raises an unjoined task's error from love.update by default", function()
    love_host.install()
    rw.spawn(function() error("the save failed") end)
    local printed, real_print = {}, print
    _G.print = function(line) printed[#printed + 1] = line end -- the default log's console
    local ok, err = pcall(love.update, 0)
    _G.print = real_print
    assert.is_false(ok)
    assert.truthy(tostring(err):find("a task failed and nobody joined it: .*the save failed"), err)
    assert.truthy(printed[1]:find("the save failed", 1, true), printed[1])
    assert.equal(printed[1], love_host.lines[#love_host.lines])
  end)
end)
