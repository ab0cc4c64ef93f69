-- ratewise as a Neovim plugin: a real `nvim --headless` (Debian's Neovim,
-- on luajit2's LuaJIT) with this checkout on its runtimepath, as a plugin
-- manager lays it out (`make nvim` puts the LuaJIT core at
-- lua/ratewise/core.so), running plugin code against the suite's test
-- server. Nothing of the suite's LUA_PATH or LUA_CPATH reaches Neovim: it
-- finds ratewise the way it finds any plugin.
local server = require "spec.support.server"
local cjson = require "cjson"

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function capture(command)
  local p = assert(io.popen(command))
  local out = p:read("*a")
  p:close()
  return out
end

local NVIM = capture("command -v nvim 2>/dev/null"):match("^%s*(.-)%s*$")
local ROOT = capture("pwd"):match("^%s*(.-)%s*$")

-- What every plugin script starts with: say() writes a line for the spec
-- on stdout; finish() quits; a watchdog quits with code 3 if the plugin
-- never finishes.
local PRELUDE = [[
local function say(...)
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
  io.stdout:write(table.concat(parts, " "), "\n")
  io.stdout:flush()
end
local function finish() vim.cmd("qa!") end
local notified = {}
vim.notify = function(msg, level) notified[#notified + 1] = { msg = msg, level = level } end
vim.defer_fn(function() say("TIMEOUT") vim.cmd("cquit 3") end, 20000)
]]

-- out, err, exit = run(script [, extra]): runs `script` (after PRELUDE) in a
-- headless Neovim whose working directory is a fresh folder, with this
-- checkout on its runtimepath; `extra` is Lua run before it, in a file of
-- its own (another plugin).
local function run(script, extra)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. shell_quote(dir)))
  local files = {}
  local function file(name, text)
    local path = dir .. "/" .. name
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
    files[#files + 1] = path
    return path
  end
  local commands = ""
  if extra then commands = commands .. " -c " .. shell_quote("luafile " .. file("first.lua", extra)) end
  commands = commands .. " -c " .. shell_quote("luafile " .. file("plugin.lua", PRELUDE .. script))
  local err_file = dir .. "/stderr"
  local out = capture("cd " .. shell_quote(dir) .. " && env -u LUA_PATH -u LUA_CPATH -u LUA_INIT timeout 30 "
    .. shell_quote(NVIM) .. " --headless -u NONE -i NONE -n --cmd " .. shell_quote("set rtp^=" .. ROOT)
    .. commands .. " 2>" .. shell_quote(err_file) .. " </dev/null; echo \"<exit $?>\"")
  local err = server.read_file(err_file) or ""
  os.execute("rm -rf " .. shell_quote(dir))
  local body, code = out:match("^(.*)<exit (%d+)>\n?$")
  return body, err, tonumber(code)
end

-- The lines of out that start with `key`, each split into its words after it.
local function said(out, key)
  local found = {}
  for line in out:gmatch("[^\n]+") do
    if line:sub(1, #key + 1) == key .. " " then
      local words = {}
      for w in line:sub(#key + 2):gmatch("%S+") do words[#words + 1] = w end
      found[#found + 1] = words
    end
  end
  return found
end

local function check_exit(out, err, code)
  assert(code == 0, ("nvim exited with %s\nstdout:\n%s\nstderr:\n%s"):format(tostring(code), out, err))
end

-- `make nvim` builds the core without hiredis unless asked: an editor's
-- machine seldom has its headers. Read from make's plan (-n), not built.
describe("make nvim", function()
  local function plan(args)
    return capture("make -n --no-print-directory nvim " .. args .. " 2>&1")
  end
  local function compiles(out)
    return out:match("\n([^\n]-%-shared %-o [^\n]*)") or out:match("^([^\n]-%-shared %-o [^\n]*)")
  end

  it("builds without hiredis unless asked, into a folder of its own", function()
    local out = plan("-B")
    local cc = assert(compiles(out), out)
    assert.matches("%-DRW_NO_REDIS", cc)
    assert.not_matches("%-lhiredis", cc)
    assert.matches("build%-luajit[%w-]*%-noredis/ratewise/core%.so", cc)
    assert.matches("lua/ratewise/core%.so", out)
  end)

  it("builds with hiredis when asked (REDIS=1)", function()
    local cc = assert(compiles(plan("-B REDIS=1")))
    assert.not_matches("%-DRW_NO_REDIS", cc)
    assert.matches("%-lhiredis", cc)
  end)
end)

if NVIM == "" then
  describe("ratewise in Neovim", function()
    pending("nvim is not installed: `make deps` installs Debian's neovim, which this spec runs")
  end)
  return
end

describe("ratewise in Neovim", function()
  local s

  setup(function()
    local f = io.open(ROOT .. "/lua/ratewise/core.so", "rb")
    assert(f, "lua/ratewise/core.so is missing: `make nvim` builds it (make test does)")
    f:close()
    s = server.start()
  end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("is found on the runtimepath, and its tasks complete their requests", function()
    for i = 1, 8 do s:script("/r" .. i, { { status = 200, body = "answer " .. i, delay = 0.05 * (i % 3) } }) end
    local out, err, code = run(([[
      say("cpath", tostring(os.getenv("LUA_CPATH")))
      say("core", vim.api.nvim_get_runtime_file("lua/ratewise/core.so", false)[1])
      local rw = require "ratewise"
      local left = 8
      for i = 1, 8 do
        rw.spawn(function()
          local res, ferr = rw.fetch("%s/r" .. i)
          say("got", i, res and res.status or tostring(ferr), res and res.body:gsub(" ", "_"))
          left = left - 1
          if left == 0 then finish() end
        end)
      end
    ]]):format(s.base))
    check_exit(out, err, code)
    assert.same({ { "nil" } }, said(out, "cpath"))
    assert.same({ { ROOT .. "/lua/ratewise/core.so" } }, said(out, "core"))
    local got = said(out, "got")
    assert.equal(8, #got)
    for _, words in ipairs(got) do
      assert.equal("200", words[2])
      assert.equal("answer_" .. words[1], words[3])
    end
    for i = 1, 8 do assert.equal(1, #s:log("/r" .. i)) end
  end)

  -- issue 38: a bare rw.fetch blocked the editor without a word.
  it("says once, through vim.notify, that a wait outside a task blocks the editor, and serves it", function()
    s:script("/bare", { { status = 200, body = "bare" } })
    local out, err, code = run(([[
      local rw = require "ratewise"
      for _ = 1, 2 do
        local res, ferr = rw.fetch("%s/bare", { on_retry = false })
        say("got", res and res.body or tostring(ferr))
      end
      for _, n in ipairs(notified) do
        say("notify", n.level, (n.msg:match("^[^\n]*"):gsub("%%s", "_")))
      end
      finish()
    ]]):format(s.base))
    check_exit(out, err, code)
    assert.same({ { "bare" }, { "bare" } }, said(out, "got"))
    local notes = said(out, "notify")
    assert.equal(1, #notes, out)
    assert.equal(tostring(3), notes[1][1]) -- vim.log.levels.WARN
    assert.matches("^ratewise:_a_wait_outside_a_task_blocks_Neovim.*rw%.spawn", notes[1][2])
  end)

  it("a task writes a buffer; its retry lines and errors go to vim.notify, none to stderr", function()
    s:script("/busy", { { status = 503, headers = { ["Retry-After"] = "0" } }, { status = 200, body = "fresh" } })
    local out, err, code = run(([[
      local rw = require "ratewise"
      local buf = vim.api.nvim_create_buf(false, true)
      rw.spawn(function()
        local res = assert(rw.fetch("%s/busy", { base = 0.01 }))
        vim.api.nvim_buf_set_lines(buf, 0, -1, false, { "status " .. res.status, res.body })
        say("buffer", (table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "|"):gsub(" ", "_")))
        rw.spawn(function() error("the plugin's bug") end)
        rw.sleep(0.05)
        for _, n in ipairs(notified) do
          say("notify", n.level, (n.msg:match("^[^\n]*"):gsub("%%s", "_")))
        end
        finish()
      end)
    ]]):format(s.base))
    check_exit(out, err, code)
    assert.same({ { "status_200|fresh" } }, said(out, "buffer"))
    local notes = said(out, "notify")
    assert.equal(2, #notes)
    assert.equal(tostring(2), notes[1][1]) -- vim.log.levels.INFO
    assert.matches("^retrying_GET_http://127%.0%.0%.1:%d+/busy_in_", notes[1][2])
    assert.equal(tostring(4), notes[2][1]) -- vim.log.levels.ERROR
    assert.matches("^ratewise:_a_task_failed_and_nobody_joined_it:_.*the_plugin's_bug$", notes[2][2])
    assert.equal("", err)
    assert.equal(2, #s:log("/busy"))
  end)

  it("keeps a 10 ms vim timer on time while requests are in flight", function()
    s:script("/slow", { { status = 200, body = "late", delay = 0.5 } })
    local out, err, code = run(([[
      local rw = require "ratewise"
      local uv = vim.loop
      local last, phase, late = nil, "idle", { idle = {}, busy = {} }
      local timer = vim.fn.timer_start(10, function()
        local t = uv.hrtime() / 1e6
        if last then table.insert(late[phase], t - last - 10) end
        last = t
      end, { ["repeat"] = -1 })
      local function worst(list)
        local m = 0
        for _, v in ipairs(list) do if v > m then m = v end end
        return m
      end
      vim.defer_fn(function()
        phase = "busy"
        local left = 32
        for _ = 1, 32 do
          rw.spawn(function()
            local res = rw.fetch("%s/slow")
            say("got", res and res.status)
            left = left - 1
            if left == 0 then
              vim.fn.timer_stop(timer)
              say("late", string.format("%%.1f %%.1f %%d", worst(late.idle), worst(late.busy), #late.busy))
              finish()
            end
          end)
        end
      end, 300)
    ]]):format(s.base))
    check_exit(out, err, code)
    assert.equal(32, #said(out, "got"))
    for _, words in ipairs(said(out, "got")) do assert.equal("200", words[1]) end
    local late = said(out, "late")[1]
    local idle, busy, ticks = tonumber(late[1]), tonumber(late[2]), tonumber(late[3])
    -- A wait that blocked the editor would make a tick at least the
    -- server's 0.5 s late; the bound leaves room for a loaded machine.
    assert.is_true(busy < 200, ("a tick came %.1f ms late while requests waited (idle: %.1f ms)"):format(busy, idle))
    assert.is_true(ticks >= 10, "the timer ticked " .. ticks .. " times in half a second")
    assert.equal(32, #s:log("/slow"))
  end)

  it("two plugins share one driver, even after one reloads the host module", function()
    s:script("/a", { { status = 200, body = "a" } })
    s:script("/b", { { status = 200, body = "b", delay = 0.05 } })
    local first = ([[
      local rw = require "ratewise"
      local host = require "ratewise.hosts.nvim"
      _G.driver_of_a = host.start()
      _G.done_a = 0
      for _ = 1, 4 do
        rw.spawn(function()
          local res = rw.fetch("%s/a")
          if res and res.status == 200 then _G.done_a = _G.done_a + 1 end
        end)
      end
    ]]):format(s.base)
    local out, err, code = run(([[
      -- a plugin reloader forgets the host module
      package.loaded["ratewise.hosts.nvim"] = nil
      local host = require "ratewise.hosts.nvim"
      local driver = host.start()
      say("same", tostring(driver == _G.driver_of_a), tostring(host.start() == driver))
      -- libuv allows one poll handle a descriptor: a second is refused (a
      -- poll(2) build has no descriptor, and the driver no poll handle)
      if driver.fd then
        local second, why = vim.loop.new_poll(driver.fd)
        say("second_poll", tostring(second), (tostring(why):match("^EEXIST")))
      else
        say("second_poll", "none")
      end
      local rw = require "ratewise"
      local done_b = 0
      for _ = 1, 4 do
        rw.spawn(function()
          local res = rw.fetch("%s/b")
          if res and res.status == 200 then done_b = done_b + 1 end
          if done_b == 4 then
            rw.sleep(0.05)
            say("done", _G.done_a, done_b)
            finish()
          end
        end)
      end
    ]]):format(s.base), first)
    check_exit(out, err, code)
    assert.same({ { "true", "true" } }, said(out, "same"))
    local has_fd = require("ratewise").features.pollfd
    assert.same({ has_fd and { "nil", "EEXIST" } or { "none" } }, said(out, "second_poll"))
    assert.same({ { "4", "4" } }, said(out, "done"))
    assert.equal(4, #s:log("/a"))
    assert.equal(4, #s:log("/b"))
  end)

  it("runs the plugin example of docs/hosts.md", function()
    local page = server.read_file(ROOT .. "/docs/hosts.md")
    local section = page:match("\n## Neovim\n(.-)\n## ")
    local example
    for code in section:gmatch("```lua\n(.-)```") do
      if code:find("rw.spawn", 1, true) then example = code end
    end
    assert(example, "docs/hosts.md's Neovim section has no example that spawns a task")
    s:script("/repos/lua/lua", { { status = 200, headers = { ["Content-Type"] = "application/json" },
      body = '{"full_name":"lua/lua","stargazers_count":9000}' } })
    example = example:gsub("https://api%.github%.com", s.base)
    local out, err, code = run(([[
      local stars = assert(loadstring(%q))()
      stars.show("lua/lua")
      local shown = vim.wait(10000, function() return vim.api.nvim_buf_get_lines(0, 0, 1, false)[1] == "lua/lua" end)
      say("shown", tostring(shown), (table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "|"):gsub(" ", "_")))
      finish()
    ]]):format(example))
    check_exit(out, err, code)
    assert.same({ { "true", "lua/lua|stars:_9000" } }, said(out, "shown"))
    assert.equal(1, #s:log("/repos/lua/lua"))
  end)

  it("encodes and decodes JSON with vim.json where lua-cjson cannot be loaded", function()
    s:script("/broken", { { status = 200, body = "{not json" } })
    local out, err, code = run(([[
      package.cpath = ""  -- where Debian's lua-cjson lives
      package.loaded.cjson, package.loaded["cjson.safe"] = nil, nil
      say("cjson", tostring((pcall(require, "cjson"))))
      local rw = require "ratewise"
      rw.spawn(function()
        local res = assert(rw.fetch("%s/echo", { json = { model = "m", n = 3, tags = { "a", "b" } } }))
        local echoed = assert(res:json())
        say("echo", echoed.method, echoed.headers["content-type"], echoed.body)
        local broken = assert(rw.fetch("%s/broken"))
        local value, why = broken:json()
        say("broken", tostring(value), (why:gsub("%%s", "_")))
        finish()
      end)
    ]]):format(s.base, s.base))
    check_exit(out, err, code)
    assert.same({ { "false" } }, said(out, "cjson"))
    local echo = said(out, "echo")[1]
    assert.equal("POST", echo[1])
    assert.equal("application/json", echo[2])
    assert.same({ model = "m", n = 3, tags = { "a", "b" } }, cjson.decode(echo[3]))
    assert.same({ model = "m", n = 3, tags = { "a", "b" } }, cjson.decode(s:log("/echo")[1].body))
    local broken = said(out, "broken")[1]
    assert.equal("nil", broken[1])
    assert.matches("^response_body_is_not_valid_JSON:_Expected_object_key_string", broken[2])
  end)

  it("answers a JSON null as rw.null whether lua-cjson or vim.json read it, and writes vim.NIL as null", function()
    local body = '{"a": null, "list": [null, 2]}'
    s:script("/nulls", { { status = 200, body = body }, { status = 200, body = body } })
    -- first with lua-cjson, then in a Neovim where it cannot be loaded
    for _, hide in ipairs { "", 'package.cpath = ""\n' } do
      local out, err, code = run(hide .. ([[
        local rw = require "ratewise"
        rw.spawn(function()
          local v = assert(assert(rw.fetch("%s/nulls")):json())
          say("read", tostring(package.loaded["cjson.safe"] ~= nil), tostring(v.a == rw.null),
            tostring(v.list[1] == rw.null), tostring(v.a == vim.NIL), #v.list)
          local res = assert(rw.fetch("%s/echo", { json = { vim.NIL, rw.null, 1234567890123456 } }))
          say("sent", assert(res:json()).body)
          finish()
        end)
      ]]):format(s.base, s.base))
      check_exit(out, err, code)
      assert.same({ { tostring(hide == ""), "true", "true", "false", "2" } }, said(out, "read"))
      assert.same({ { "[null,null,1234567890123456]" } }, said(out, "sent"))
    end
  end)
end)
