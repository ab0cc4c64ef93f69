-- A game for spec/love_spec.lua: no audio (the machines that run the suite
-- have no sound device), a small window, and frames paced by the game
-- itself (no vsync under Xvfb).
function love.conf(t)
  t.identity = "ratewise-spec"
  t.modules.audio = false
  t.modules.sound = false
  t.window.width, t.window.height = 160, 120
  t.window.vsync = 0
end
