-- What caused a task (its origin), for its lines: the label its host gives
-- the code spawning it (scheduler.set_origin_of_spawn; OpenResty's is the
-- client request's $request_id, spec/openresty_request_id_spec.lua), else
-- its parent's; a retry line written in the task ends with it. Against the
-- loopback server, with a labeller of the spec's own.
local rw = require "ratewise"
local scheduler = require "ratewise.scheduler"
local server = require "spec.support.server"

describe("a task's origin", function()
  local s, lines
  setup(function() s = server.start() end)
  teardown(function()
    scheduler.set_origin_of_spawn(nil)
    rw.configure { log = true }
    s:stop()
  end)
  before_each(function()
    s:reset()
    lines = {}
    rw.configure { log = function(line) lines[#lines + 1] = line end }
  end)
  after_each(function() scheduler.set_origin_of_spawn(nil) end)

  it("is nil with no labeller, and a retry line says nothing more", function()
    s:script("/r", { { status = 429, headers = { ["Retry-After"] = "0" } }, { status = 200 } })
    local origin
    local res = rw.run(function()
      origin = scheduler.origin()
      return rw.fetch(s:url("/r"), { max_retries = 1 })
    end)
    assert.equal(200, res.status)
    assert.is_nil(origin)
    assert.equal(1, #lines)
    assert.matches("%(429, attempt 1/1, [%w-]+%)$", lines[1])
  end)

  it("is the labeller's at spawn, kept by the tasks it spawns and by a run inside it", function()
    local next_id = 0
    scheduler.set_origin_of_spawn(function()
      -- a label only outside any task, as OpenResty's is only in a request
      if scheduler.in_task() then return nil end
      next_id = next_id + 1
      return "request r" .. next_id
    end)
    local seen = {}
    rw.run(function()
      seen.root = scheduler.origin()
      rw.spawn(function() seen.child = scheduler.origin() end):join()
      rw.run(function() seen.nested = scheduler.origin() end)
    end)
    rw.run(function() seen.second = scheduler.origin() end)
    assert.same({ root = "request r1", child = "request r1", nested = "request r1", second = "request r2" }, seen)
    assert.is_nil(scheduler.origin())
  end)

  it("ends the retry line written in the task", function()
    scheduler.set_origin_of_spawn(function() return not scheduler.in_task() and "request abc123" or nil end)
    s:script("/r", { { status = 503 }, { status = 200 } })
    local res = rw.run(function()
      return rw.spawn(function() return rw.fetch(s:url("/r"), { max_retries = 1 }) end):join()
    end)
    assert.equal(200, res.status)
    assert.equal(2, #s:log("/r"))
    assert.equal(1, #lines)
    assert.matches("^retrying GET http://127%.0%.0%.1:%d+/r in [%d.]+ s %(503, attempt 1/1, [%w-]+%); request abc123$",
      lines[1])
  end)
end)
