-- rw.configure{log = ...}: the one place every line ratewise writes goes.
local rw = require "ratewise"
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

-- Runs a Lua program in a process of its own; answers what it wrote on
-- stdout and on stderr, apart.
local function run_apart(code)
  local err_file = os.tmpname()
  local out, exit = subprocess.run_lua(code, { seconds = 10, args = "2>" .. err_file })
  local err = server.read_file(err_file)
  os.remove(err_file)
  return out, err, exit
end

describe("the log sink", function()
  local s

  setup(function() s = server.start() end)
  teardown(function()
    s:stop()
    rw.configure { log = true }
  end)
  before_each(function() s:reset() end)
  after_each(function() rw.configure { log = true } end)

  local lines
  local function collect(line, level) lines[#lines + 1] = { line = line, level = level } end
  before_each(function() lines = {} end)

  it("receives the retry line of a real retry, at level info", function()
    s:script("/busy", { { status = 503 }, { status = 200, body = "ok" } })
    rw.configure { log = collect }
    local res = assert(rw.fetch(s:url("/busy"), { base = 0.01 }))
    assert.equal(200, res.status)
    assert.equal(2, #s:log("/busy"))
    assert.equal(1, #lines)
    assert.matches("^retrying GET http://127%.0%.0%.1:%d+/busy in %d%.%d%d s %(503, attempt 1/%d+, backoff%)$",
      lines[1].line)
    assert.equal("info", lines[1].level)
  end)

  it("receives the error of a task nobody joined, at level error", function()
    rw.configure { log = collect }
    rw.spawn(function()
      rw.sleep(0.01)
      error("lost in the woods")
    end)
    while rw.step(1) > 0 do end
    assert.equal(1, #lines)
    assert.matches("^ratewise: a task failed and nobody joined it: .*lost in the woods", lines[1].line)
    assert.equal("error", lines[1].level)
  end)

  it("is kept by a configure without the key, and by log = nil", function()
    rw.configure { log = collect }
    rw.configure { max_idle_connections = 64 }
    rw.configure { log = nil, tls_warning = true }
    rw.spawn(function() error("still here") end)
    while rw.step(1) > 0 do end
    assert.equal(1, #lines)
  end)

  it("goes to a host's own sink unless the caller gave one; log = true goes back to it", function()
    local log = require "ratewise.log"
    local hosted = {}
    log.set_host(function(line, level) hosted[#hosted + 1] = level .. " " .. line end)
    finally(function() log.set_host(nil) end)
    rw.spawn(function() error("first") end)
    while rw.step(1) > 0 do end
    rw.configure { log = collect }
    rw.spawn(function() error("second") end)
    while rw.step(1) > 0 do end
    rw.configure { log = true }
    rw.spawn(function() error("third") end)
    while rw.step(1) > 0 do end
    assert.equal(2, #hosted)
    assert.matches("^error ratewise: a task failed and nobody joined it: .*first", hosted[1])
    assert.matches("^error ratewise: a task failed and nobody joined it: .*third", hosted[2])
    assert.equal(1, #lines)
    assert.matches("second", lines[1].line)
  end)

  it("sends a line written while the log function runs to the default place, not into the function again", function()
    s:script("/busy", { { status = 503 }, { status = 200, body = "ok" } })
    s:script("/ship", { { status = 503, headers = { ["Retry-After"] = "0" } }, { status = 200, body = "ok" } })
    local out, err = run_apart(([[
      local rw = require "ratewise"
      local seen = 0
      rw.configure { log = function(line)
        seen = seen + 1
        io.stdout:write("sink ", line:match("^%%S+ %%S+ (%%S+)"), "\n")
        assert(rw.fetch("%s", { base = 0.01 }))  -- ships the line, and retries once itself
      end }
      assert(rw.fetch("%s", { base = 0.01 }))
      io.stdout:write("seen ", seen, "\n")
    ]]):format(s:url("/ship"), s:url("/busy")))
    assert.equal("sink " .. s:url("/busy") .. "\nseen 1\n", out)
    assert.matches("^retrying GET " .. s:url("/ship"):gsub("%p", "%%%0") .. " in ", err)
    assert.equal(2, #s:log("/ship"))
  end)

  it("refuses what is not a function or a boolean, naming the option", function()
    for _, bad in ipairs { 42, "stderr", {} } do
      local ok, err = pcall(rw.configure, { log = bad })
      assert.is_false(ok)
      assert.matches("configure: option 'log' must be a function, false %(silence%) or true %(the default%) %(got "
        .. type(bad) .. "%)", err)
    end
    local ok, err = pcall(rw.configure, { logger = print })
    assert.is_false(ok)
    assert.matches("configure: unknown option 'logger'", err)
  end)

  it("leaves nothing on stderr when it takes the lines; they are on stderr by default", function()
    s:script("/busy", { { status = 503 }, { status = 200, body = "ok" } })
    local program = ([[
      local rw = require "ratewise"
      local configure = ...
      if configure == "sink" then
        rw.configure { log = function(line, level) io.stdout:write(level, " ", line, "\n") end }
      elseif configure == "silent" then
        rw.configure { log = false }
      end
      local res = assert(rw.fetch("%s", { base = 0.01 }))
      io.stdout:write("status ", res.status, "\n")
      rw.spawn(function() error("nobody listens") end)
      while rw.step(1) > 0 do end
      io.stdout:write("end\n")
    ]]):format(s:url("/busy"))
    local with = program:gsub("local configure = %.%.%.", "local configure = 'sink'")
    local out, err = run_apart(with)
    assert.equal("", err)
    assert.matches("info retrying GET http://127%.0%.0%.1:%d+/busy in", out)
    assert.matches("error ratewise: a task failed and nobody joined it: .*nobody listens", out)
    assert.matches("status 200\n", out)

    s:reset()
    s:script("/busy", { { status = 503 }, { status = 200, body = "ok" } })
    local silent = program:gsub("local configure = %.%.%.", "local configure = 'silent'")
    out, err = run_apart(silent)
    assert.equal("", err)
    assert.equal("status 200\nend\n", out)

    s:reset()
    s:script("/busy", { { status = 503 }, { status = 200, body = "ok" } })
    out, err = run_apart(program)
    assert.matches("^retrying GET http://127%.0%.0%.1:%d+/busy in", err)
    assert.matches("\nratewise: a task failed and nobody joined it: .*nobody listens", err)
    assert.equal("status 200\nend\n", out)
  end)

  it("a log function that raises breaks no request: its lines go to stderr, the failure said once", function()
    s:script("/busy", {
      { status = 503, headers = { ["Retry-After"] = "0" } },
      { status = 503, headers = { ["Retry-After"] = "0" } },
      { status = 200, body = "ok" },
    })
    local out, err = run_apart(([[
      local rw = require "ratewise"
      rw.configure { log = function() error("the sink is broken") end }
      local res = assert(rw.fetch("%s", { base = 0.01 }))
      io.stdout:write("status ", res.status, "\n")
    ]]):format(s:url("/busy")))
    assert.equal("status 200\n", out)
    local _, retries = err:gsub("retrying GET", "")
    assert.equal(2, retries)
    local _, told = err:gsub("ratewise: the log function raised an error %(its lines go here instead%): "
      .. "[^\n]*the sink is broken", "")
    assert.equal(1, told)
    assert.equal(3, #s:log("/busy"))
  end)
end)
