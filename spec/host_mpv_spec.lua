-- ratewise in a real mpv (Debian's mpv 0.35, its scripts on PUC Lua 5.2),
-- headless: no video, no audio output, no terminal, no config. The scripts
-- (spec/support/hosts/mpv/) require ratewise and the scenario and nothing
-- else: ratewise.hosts.mpv is found from mpv's `mp` with no configuration.
-- mpv finds ratewise on LUA_PATH_5_2 / LUA_CPATH_5_2, as it would a rock
-- installed for Lua 5.2 on its default paths.
local real_host = require "spec.support.real_host"
local server = require "spec.support.server"

local shell_quote = real_host.shell_quote

local MPV = require("spec.support.subprocess").shell("command -v mpv"):match("^%s*(.-)%s*$")
local SCRIPTS = real_host.ROOT .. "/spec/support/hosts/mpv/"

local lines_of = real_host.lines_of

describe("ratewise in mpv (scripts, Lua 5.2)", function()
  local enabled, why = real_host.enabled()
  local s, dir

  before_each(function()
    if not enabled then return end
    assert(MPV ~= "", "mpv is not installed: `make deps` installs Debian's mpv (the Makefile's DEB_REAL_HOSTS)")
    s = server.start()
    real_host.routes(s)
    dir = real_host.temp_dir()
  end)

  after_each(function()
    if s then s:stop() end
    s = nil
    if dir then os.execute("rm -rf " .. shell_quote(dir)) end
    dir = nil
  end)

  -- results, log = run(script [, file]): runs mpv with the script until it
  -- quits (at most 25 s: `timeout` ends it, so nothing outlives the spec),
  -- playing file if given; the results the script wrote, and mpv's log.
  local function run(script, file)
    local results_file, log_file = dir .. "/results", dir .. "/mpv.log"
    local opts = ("rw-base=%s,rw-results=%s"):format(s:url(""):gsub("/$", ""), results_file)
    local command = "cd " .. shell_quote(dir) .. " && env -u LUA_PATH -u LUA_CPATH -u LUA_INIT"
      .. " LUA_PATH_5_2=" .. shell_quote(real_host.lua_path() .. ";;")
      .. " LUA_CPATH_5_2=" .. shell_quote(real_host.cpath("lua5.2") .. ";;")
      .. " timeout -s KILL 25 " .. shell_quote(MPV)
      .. " --no-config --idle=" .. (file and "yes" or "once") .. " --vo=null --ao=null --no-terminal"
      .. " --log-file=" .. shell_quote(log_file)
      .. " --script=" .. shell_quote(SCRIPTS .. script)
      .. " --script-opts=" .. shell_quote(opts)
      .. (file and (" " .. shell_quote(file)) or "")
      .. " </dev/null >/dev/null 2>&1"
    os.execute(command)
    return real_host.results(results_file, 0), server.read_file(log_file) or ""
  end

  it("runs the scenario in a task, stepped from mp.add_timeout, the script's timers on time", function()
    if not enabled then return pending(why) end
    local results, log = run("ratewise_scenario.lua")
    real_host.check(results, "mpv")
    local late = tonumber(lines_of(results, "late")[1])
    assert(late, "the script wrote no lateness:\n" .. results.text)
    assert(late <= real_host.BOUND.late,
      ("mpv's 20 ms timer ran %.1f ms late while ratewise waited (bound %g ms)"):format(late * 1000,
        real_host.BOUND.late * 1000))
    -- with no task left, the driver arms no step: an idle player costs nothing
    assert.same({ "false" }, lines_of(results, "armed_when_idle"))
    -- the server saw each 429 path twice (the 429, then the retry after it)
    for i = 0, 10 do assert.equal(2, #s:log("/rh/429/" .. i), "/rh/429/" .. i) end
    -- ratewise's retry lines went to mpv's log (mp.msg), under the script's name
    assert.truthy(log:find("[ratewise_scenario] retrying GET ", 1, true), "no retry line in mpv's log:\n" .. log)
  end)

  it("from script code outside a task: refuses a wait with the fix, before sending; a release or a cancel "
    .. "wakes its task at once; playback goes on", function()
    if not enabled then return pending(why) end
    local results = run("outside_tasks.lua", "av://lavfi:sine")
    assert(results.error == nil, tostring(results.error))
    for _, where in ipairs({ "event", "binding" }) do
      local said = lines_of(results, "refused_" .. where)[1]
      assert(said, "the script wrote no refused_" .. where .. ":\n" .. results.text)
      assert.equal("true", said:match("^(%S+)"), said)
      assert.truthy(said:find("rw.spawn(function() ... end)", 1, true), said)
      assert.truthy(said:find("mp.command_native_async", 1, true), said)
    end
    assert.equal(0, #s:log("/rh/ping"), "a refused wait sent its request")
    -- a task given a permit, or cancelled, by script code runs on the next
    -- turn of the script's event loop, not at its next deadline (none, or 30 s)
    for _, what in ipairs({ "permit", "cancel" }) do
      local seconds = tonumber(lines_of(results, what .. "_after")[1])
      assert(seconds, "the script wrote no " .. what .. "_after:\n" .. results.text)
      assert(seconds <= real_host.BOUND.late, ("the task went on %.1f ms after the %s"):format(seconds * 1000, what))
    end
    local playback = lines_of(results, "playback")[1]
    assert(playback, "the script wrote no playback line:\n" .. results.text)
    local status, played, wall = playback:match("^status (%S+) played (%S+) in (%S+)$")
    played, wall = tonumber(played), tonumber(wall)
    assert.equal("200", status)
    assert.is_true(wall >= real_host.RETRY_AFTER - 0.001, playback)
    -- the player played on, in real time, while the task waited
    assert(played >= wall - real_host.BOUND.late,
      ("mpv played %.2f s of audio in the %.2f s the task waited"):format(played, wall))
    local late = tonumber(lines_of(results, "late")[1])
    assert(late and late <= real_host.BOUND.late, "lateness while playing: " .. tostring(late))
  end)
end)
