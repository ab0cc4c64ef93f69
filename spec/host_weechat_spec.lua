-- ratewise in a real WeeChat (Debian's weechat-headless 3.8 and its Lua
-- plugin, on PUC Lua 5.3), headless, with a home of its own in a temp
-- folder. The scripts (spec/support/hosts/weechat/) require ratewise and
-- the scenario and nothing else: ratewise.hosts.weechat is found from
-- WeeChat's `weechat` global with no configuration, and steps ratewise's
-- tasks from WeeChat's loop. WeeChat's Lua finds ratewise on LUA_PATH_5_3 /
-- LUA_CPATH_5_3, as it would a rock installed for Lua 5.3 on its default
-- paths.
local real_host = require "spec.support.real_host"
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

local shell_quote = real_host.shell_quote

local WEECHAT = subprocess.shell("command -v weechat-headless"):match("^%s*(.-)%s*$")
local SCRIPTS = real_host.ROOT .. "/spec/support/hosts/weechat/"

local lines_of = real_host.lines_of

describe("ratewise in WeeChat (weechat-headless 3.8, Lua 5.3)", function()
  local enabled, why = real_host.enabled()
  local s, dir

  before_each(function()
    if not enabled then return end
    assert(WEECHAT ~= "", "weechat-headless is not installed: `make deps` installs Debian's weechat-headless and "
      .. "weechat-lua (the Makefile's DEB_REAL_HOSTS)")
    assert(select(2, subprocess.shell("ls /usr/lib/*/weechat/plugins/lua.so")) == 0, "WeeChat's Lua plugin is not "
      .. "installed: `make deps` installs weechat-lua (the Makefile's DEB_REAL_HOSTS)")
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

  -- run{scripts, commands}: runs WeeChat, loading the scripts, then running
  -- the commands, until it quits (at most 25 s: `timeout` kills it, so
  -- nothing outlives the spec). Answers what the scripts wrote (results),
  -- and what WeeChat did: its exit code, its standard error, its core
  -- buffer (the logger's file, written as lines come), and whether it
  -- wrote a crash log.
  local function run(scripts, commands)
    local results_file, home = dir .. "/results", dir .. "/home"
    -- the logger writes each line of the core buffer as it comes
    local run_commands = { "/set logger.file.flush_delay 0" }
    for _, script in ipairs(scripts) do run_commands[#run_commands + 1] = "/lua load " .. SCRIPTS .. script end
    for _, command in ipairs(commands or {}) do run_commands[#run_commands + 1] = command end
    local command = "cd " .. shell_quote(dir) .. " && env -u LUA_PATH -u LUA_CPATH -u LUA_INIT"
      .. " -u LUA_PATH_5_3 -u LUA_CPATH_5_3 -u LUA_INIT_5_3"
      .. " LUA_PATH_5_3=" .. shell_quote(real_host.lua_path() .. ";;")
      .. " LUA_CPATH_5_3=" .. shell_quote(real_host.cpath("lua5.3") .. ";;")
      .. " RW_BASE=" .. shell_quote((s:url(""):gsub("/$", "")))
      .. " RW_RESULTS=" .. shell_quote(results_file)
      .. " timeout -s KILL 25 " .. shell_quote(WEECHAT)
      .. " --dir " .. shell_quote(home) .. " --no-connect"
      .. " -r " .. shell_quote(table.concat(run_commands, ";"))
      .. " </dev/null >/dev/null 2>" .. shell_quote(dir .. "/stderr")
    local _, code = subprocess.shell(command)
    local crash_logs = subprocess.shell("ls " .. shell_quote(home) .. " | grep -c '^weechat_crash'")
    return real_host.results(results_file, 0), {
      code = code,
      stderr = server.read_file(dir .. "/stderr") or "",
      core = server.read_file(home .. "/logs/core.weechat.weechatlog") or "",
      crashed = tonumber(crash_logs) ~= 0,
    }
  end

  -- the core buffer but for WeeChat's start (its key bindings)
  local function core_lines(weechat)
    return (weechat.core:gsub("[^\n]*New key binding[^\n]*\n", ""))
  end

  local function assert_not_crashed(weechat)
    assert(weechat.code == 0 and not weechat.crashed, ("WeeChat exited with %s%s; its core buffer:\n%s")
      :format(tostring(weechat.code), weechat.crashed and " and wrote a crash log" or "", core_lines(weechat)))
  end

  it("runs the scenario in a task, stepped from WeeChat's loop, the script's timer on time", function()
    if not enabled then return pending(why) end
    local results, weechat = run({ "ratewise_scenario.lua" })
    assert_not_crashed(weechat)
    real_host.check(results, "WeeChat")
    local late = tonumber(lines_of(results, "late")[1])
    assert(late, "the script wrote no lateness:\n" .. results.text)
    assert(late <= real_host.BOUND.late,
      ("WeeChat's 20 ms timer ran %.1f ms late while ratewise waited (bound %g ms)"):format(late * 1000,
        real_host.BOUND.late * 1000))
    -- with no task left, the driver has unhooked: an idle client costs nothing
    assert.same({ "0 0" }, lines_of(results, "hooks_when_idle"))
    -- the server saw each 429 path twice (the 429, then the retry after it)
    for i = 0, 10 do assert.equal(2, #s:log("/rh/429/" .. i), "/rh/429/" .. i) end
    -- ratewise's retry lines reached WeeChat's core buffer, and nothing of
    -- ratewise's went to standard error, which WeeChat replaces
    local url = s:url("/rh/429/0")
    assert.truthy(weechat.core:find("retrying GET " .. url .. " in ", 1, true),
      "no retry line in WeeChat's core buffer:\n" .. core_lines(weechat))
    assert.falsy(weechat.stderr:find("ratewise", 1, true), weechat.stderr)
  end)

  it("refuses a bare call in a command with the fix, before sending; a task spawned there runs at once", function()
    if not enabled then return pending(why) end
    local results, weechat = run({ "misuse.lua", "other.lua" },
      { "/rw_misuse_bare", "/rw_misuse_spawned", "/rw_other_spawned", "/rw_misuse_park",
        "/wait 300ms /rw_misuse_unpark", "/wait 3 /quit" })
    assert_not_crashed(weechat)
    assert(results.error == nil, tostring(results.error))
    local refused = lines_of(results, "refused")[1]
    assert(refused, "the script wrote no refused line:\n" .. results.text)
    assert.equal("true", refused:match("^(%S+)"), refused)
    assert.truthy(refused:find("ratewise: a wait outside a task", 1, true), refused)
    assert.truthy(refused:find("rw.spawn(function() ... end)", 1, true), refused)
    assert.equal(0, #s:log("/rh/ping"), "a refused wait sent its request")
    -- the task a command spawned ran from WeeChat's loop, its 1 s call
    -- taking its second, with one driver's hooks, though the host module
    -- was loaded again before
    assert.same({ "true" }, lines_of(results, "same_driver"))
    assert.same({ "1 1" }, lines_of(results, "hooks_when_spawned"))
    for _, key in ipairs({ "spawned", "other" }) do
      local line = lines_of(results, key)[1]
      assert(line, "the script wrote no " .. key .. " line:\n" .. results.text)
      local status, seconds = line:match("^(%S+) (%S+)$")
      assert.equal("200", status, line)
      assert.is_true(tonumber(seconds) < real_host.SLOW + 1, line)
    end
    assert.equal(2, #s:log("/rh/slow"))
    -- each script has a Lua state of its own: the other script sees none
    -- of this one's globals (and has its own ratewise, buckets and all)
    assert.same({ "false" }, lines_of(results, "other_sees_marker"))
    -- a command that cancels a task sleeping 20 s, and releases a permit
    -- another task waits for: each goes on at once, not at its timer
    local cancel_seen, release_seen = lines_of(results, "cancel_seen")[1], lines_of(results, "release_seen")[1]
    assert(cancel_seen and release_seen, "the script wrote no cancel_seen or release_seen line:\n" .. results.text)
    assert.matches("^[%d.]+ nil cancelled$", cancel_seen)
    for _, seen in ipairs({ cancel_seen, release_seen }) do
      local seconds = tonumber(seen:match("^(%S+)"))
      assert(seconds <= real_host.BOUND.late, "a task went on " .. seconds .. " s after the command")
    end
    -- a task spawned before weechat.register: WeeChat hooks nothing for a
    -- script it does not know yet, and the error says what to do
    local early = lines_of(results, "before_register")[1]
    assert(early, "the script wrote no before_register line:\n" .. results.text)
    assert.equal("true", early:match("^(%S+)"), early)
    assert.truthy(early:find("call weechat.register(...) before the script's first rw.spawn", 1, true), early)
  end)
end)
