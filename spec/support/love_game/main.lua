-- A game for spec/love_spec.lua: config.lua (written by the spec) says
-- where the test server is and where the results go. The game spawns its
-- requests at load, keeps 60 frames a second while they wait out a
-- Retry-After, tries a bare rw.fetch from love.update, then lets a task
-- fail unjoined, whose error must reach love.errorhandler; the handler
-- writes the results and the game ends.
local cfg = require "config"
if cfg.lua_path then
  package.path = cfg.lua_path .. ";" .. package.path
  package.cpath = cfg.cpath .. ";" .. package.cpath
end

local love_host = require "ratewise.hosts.love"
local logged = {}
local rw = love_host.install(cfg.custom_log and {
  log = function(line, level) logged[#logged + 1] = level .. ": " .. line end,
} or nil)

local FRAME = 1 / 60
local results = { frames = 0, max_frame = 0, max_frame_cpu = 0, max_step = 0, max_step_cpu = 0, done = 0,
  statuses = {} }

-- ratewise's own part of each frame: the hook's step, timed
local step = love_host.update
love_host.update = function()
  local t, cpu = love.timer.getTime(), os.clock()
  step()
  results.max_step = math.max(results.max_step, love.timer.getTime() - t)
  results.max_step_cpu = math.max(results.max_step_cpu, os.clock() - cpu)
end

local function write_results(handled)
  local out = assert(io.open(cfg.out, "w"))
  out:write("frames ", results.frames, "\n")
  out:write("max_frame ", string.format("%.4f", results.max_frame), "\n")
  out:write("max_frame_cpu ", string.format("%.4f", results.max_frame_cpu), "\n")
  out:write("max_step ", string.format("%.4f", results.max_step), "\n")
  out:write("max_step_cpu ", string.format("%.4f", results.max_step_cpu), "\n")
  out:write("statuses ", table.concat(results.statuses, ","), "\n")
  out:write("bare ", tostring(results.bare), "\n")
  for _, line in ipairs(logged) do out:write("logged ", (line:gsub("\n", " ")), "\n") end
  out:write("on_screen ", #love_host.lines, "\n")
  out:write("handled ", (tostring(handled):gsub("\n", " ")), "\n")
  out:close()
end

for i = 1, cfg.requests do
  rw.spawn(function()
    local res, err = rw.fetch(cfg.url .. "/api?i=" .. i, { max_retries = 3 })
    results.statuses[i] = res and res.status or tostring(err)
    results.done = results.done + 1
  end)
end

local last, last_cpu, started, failing = nil, nil, love.timer.getTime(), false
function love.update()
  local t, cpu = love.timer.getTime(), os.clock()
  if last then
    results.frames = results.frames + 1
    results.max_frame = math.max(results.max_frame, t - last)
    results.max_frame_cpu = math.max(results.max_frame_cpu, cpu - last_cpu)
  else
    -- a bare fetch on the frame's thread: refused before anything is sent
    local ok, err = pcall(rw.fetch, cfg.url .. "/bare")
    results.bare = ok and "answered" or err
  end
  if results.done == cfg.requests and not failing then
    failing = true
    rw.spawn(function() error("the leaderboard task failed") end) -- nobody joins it
  end
  if t - started > 30 then
    write_results("timeout")
    love.event.quit(1)
  end
  last, last_cpu = t, cpu
  love.timer.sleep(math.max(0, FRAME - (love.timer.getTime() - t)))
end

function love.draw()
  love.graphics.print(table.concat(love_host.lines, "\n"), 4, 4)
end

function love.errorhandler(msg)
  write_results(msg)
  print("the game's error handler: " .. tostring(msg))
end
