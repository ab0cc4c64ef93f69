-- ratewise in a real Tarantool instance (Debian's tarantool, on its own
-- LuaJIT, loading build-luajit's core): a script (spec/support/hosts/
-- tarantool/script.lua) calls ratewise from fibers with no adapter code,
-- and the instance runs headless in a temp dir under `timeout`, against
-- the suite's test server. Issue 42's bounds (spec/support/real_host.lua),
-- and what the Tarantool host adds: every fiber's bare rw.fetch waits its
-- own fiber, so 20 calls in 20 fibers take about as long as one.
local real_host = require "spec.support.real_host"
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

local shell_quote = real_host.shell_quote

local TARANTOOL = subprocess.shell("command -v tarantool"):match("^%s*(/%S*)%s*$") or ""
local SCRIPT = real_host.ROOT .. "/spec/support/hosts/tarantool/script.lua"

describe("ratewise in Tarantool", function()
  local enabled, why = real_host.enabled()
  if not enabled then
    it("runs in the real-host build only", function() pending(why) end)
    return
  end

  local s, dirs

  setup(function()
    s = server.start()
    real_host.routes(s)
    dirs = {}
  end)

  teardown(function()
    if s then s:stop() end
    for _, dir in ipairs(dirs) do os.execute("rm -rf " .. shell_quote(dir)) end
  end)

  before_each(function()
    assert(TARANTOOL ~= "", "no tarantool on PATH: `make deps` installs it (the Makefile's DEB_REAL_HOSTS)")
    s:reset()
    real_host.routes(s)
  end)

  -- results, output: runs the script in `mode` in an instance of its own,
  -- in a fresh directory, killed after `seconds`; the results once it has
  -- exited.
  local function run(mode, seconds)
    local dir = real_host.temp_dir()
    dirs[#dirs + 1] = dir
    local results_file = dir .. "/results"
    local out = subprocess.shell("cd " .. shell_quote(dir) .. " && timeout " .. seconds .. " " .. TARANTOOL .. " "
      .. table.concat({ shell_quote(SCRIPT), mode, shell_quote(s.base), shell_quote(results_file),
        shell_quote(real_host.lua_path()), shell_quote(real_host.cpath("luajit")) }, " "))
    local results = real_host.results(results_file, 0)
    assert(results.done, "the instance did not finish (" .. mode .. "); it wrote:\n" .. results.text
      .. "\nand said:\n" .. out)
    assert(not results.error, "the instance (" .. mode .. "): " .. tostring(results.error) .. "\n" .. out)
    return results, out
  end

  local function line(results, name)
    for _, words in ipairs(results.lines) do
      if words[1] == name then return words end
    end
    return nil
  end

  it("meets issue 42's bounds, calls made from fibers, another fiber never 100 ms late", function()
    local results, out = run("scenario", 30)
    real_host.check(results, "Tarantool")
    local late = line(results, "late")
    assert(late, "the lateness probe wrote nothing:\n" .. results.text)
    local worst = tonumber(late[2])
    assert(worst <= real_host.BOUND.late, ("another fiber woke %.3f s late (bound %g s)"):format(worst,
      real_host.BOUND.late))
    -- the ten slow calls were ten requests, not one reused answer
    assert.equal(11, #s:log("/rh/slow"))
    -- nothing said: no fiber was blocked
    assert.not_matches("blocks", out)
  end)

  it("20 calls in 20 fibers to the 1 s route take about 1 s, not 20", function()
    local results = run("twenty", 20)
    local twenty = assert(results.twenty, results.text)
    assert.equal(20, twenty.ok)
    assert.is_true(twenty.seconds >= real_host.SLOW - 0.05, results.text)
    assert.is_true(twenty.seconds < 2 * real_host.SLOW, ("20 fibers took %.2f s"):format(twenty.seconds))
    assert.equal(20, #s:log("/rh/slow"))
  end)

  it("still waits through fiber.sleep where rw.configure{sleep = fiber.sleep} says so", function()
    local results, out = run("configured", 20)
    local configured = assert(results.configured, results.text)
    assert.equal(10, configured.ok)
    assert.is_true(configured.seconds < 2 * real_host.SLOW, ("10 fibers took %.2f s"):format(configured.seconds))
    assert.not_matches("blocks", out)
  end)

  it("runs a task spawned by a fiber's code, which does not wait for it itself", function()
    local results = run("spawned", 20)
    local spawned = assert(results.spawned, results.text)
    assert.equal(200, spawned.ok)
    assert.is_true(spawned.seconds < 2 * real_host.SLOW, results.text)
  end)

  it("runs at once a task a fiber's code spawns, hands a permit or cancels while the driver is parked", function()
    local results = run("parked", 20)
    local words = assert(line(results, "parked"), results.text)
    -- (a driver left parked would run them at its next timer: 5 s)
    assert.is_true(tonumber(words[2]) < 0.2, "spawned after " .. words[2] .. " s")
    assert.is_true(tonumber(words[3]) < 0.2, "released after " .. words[3] .. " s")
    assert.equal("done", words[4])
  end)

  it("serves a fiber's call while a task holds the driver, waiting for Tarantool itself, and says so once", function()
    local results, out = run("held", 20)
    local held = assert(results.held, results.text)
    assert.equal(200, held.ok)
    assert.is_true(held.seconds >= 0.45 and held.seconds < 1.5, results.text)
    local _, said = out:gsub("a ratewise task waited for Tarantool itself", "")
    assert.equal(1, said, out)
  end)

  it("ends a cancelled fiber's wait with Tarantool's error, leaving no driver, and replaces a killed driver", function()
    local results, out = run("cancelled", 20)
    assert.same({ "cancelled", "fiber", "is", "cancelled" }, line(results, "cancelled"))
    assert.same({ "drivers", "0" }, line(results, "drivers"))
    local killed = assert(results.killed_driver, results.text)
    assert.equal(200, killed.ok)
    assert.is_true(killed.seconds < 2 * real_host.SLOW, results.text)
    assert.matches("the driver fiber was cancelled", out, 1, true)
  end)

  it("waits as long as asked when another fiber's code wakes the waiting fiber", function()
    local results = run("woken", 20)
    local slept = assert(results.slept, results.text)
    assert.is_true(slept.seconds >= 0.5, results.text)
    local fetched = assert(results.fetched, results.text)
    assert.equal(200, fetched.ok)
    assert.is_true(fetched.seconds >= real_host.SLOW, results.text)
  end)

  it("refuses a wait inside a box transaction, naming the fix, and sends nothing", function()
    local results, out = run("transaction", 20)
    local refused = assert(line(results, "refused"), results.text)
    local message = table.concat(refused, " ", 2)
    assert.matches("inside a box transaction", message, 1, true)
    assert.matches("Call ratewise before box.begin() or after box.commit()", message, 1, true)
    assert.equal(0, #s:log("/rh/slow"))
    -- the transaction committed (the refusal did not abort it), the call
    -- after it was served, and its retry line is in Tarantool's log
    local after = assert(results.after, results.text)
    assert.equal(200, after.ok)
    assert.equal(2, after.seconds)
    assert.matches("I> retrying GET " .. s.base .. "/rh/429/0 in", out, 1, true)
  end)
end)
