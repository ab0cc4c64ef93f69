-- A frame loop that keeps its frame rate while requests wait out a
-- Retry-After: one rw.step(0) per frame, tasks spawned outside rw.run.
--
--   lua5.4 examples/game_loop.lua     (from the repo root, after `make`)
package.path = "./?.lua;" .. package.path
local rw = require "ratewise"
local server = require "spec.support.server"
local socket = require "socket" -- stands in for the engine's own frame pacing

local api = server.start()
-- The leaderboard API is busy: it asks for 1.5 s before it answers.
local busy = { status = 429, headers = { ["Retry-After"] = "1.5" } }
api:script("/leaderboard", { busy, busy, busy, busy, { status = 200, body = "[alice 120, bob 95]" } })

local answers = {}
for player = 1, 4 do
  rw.spawn(function()
    local res = rw.fetch(api:url("/leaderboard"), { on_retry = false })
    answers[#answers + 1] = string.format("player %d got %s after %d attempts", player,
      res and res.body or "nothing", res and res.attempts or 0)
  end)
end

local FRAME = 1 / 60
local frames, worst_step, started = 0, 0, rw.now()
local next_frame = started
while true do
  local t0 = rw.now()
  local live = rw.step(0) -- requests progress; never blocks
  worst_step = math.max(worst_step, rw.now() - t0)
  frames = frames + 1
  if live == 0 then break end
  next_frame = next_frame + FRAME
  local pause = next_frame - rw.now()
  if pause > 0 then socket.sleep(pause) end
end
local elapsed = rw.now() - started

for _, line in ipairs(answers) do print(line) end
print(string.format("%d frames in %.2f s (%.1f fps), slowest rw.step(0): %.2f ms",
  frames, elapsed, frames / elapsed, worst_step * 1000))
api:stop()
