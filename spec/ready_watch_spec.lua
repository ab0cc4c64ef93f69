-- A host whose own loop steps ratewise's tasks (WeeChat, mpv, Prosody,
-- Tarantool) arms that loop from scheduler.add_spawn_watch. Code outside
-- any task (a command of the host's, say) makes a waiting task ready not
-- only by spawning one: by cancelling it, by releasing a permit it waits
-- for, by setting an event it waits on. Each tells the watches, or the
-- task would wait for its own timer (a cancelled 20 s sleep: 20 s), or for
-- ever; the same from inside a task does not (the loop already runs).
local rw = require "ratewise"
local scheduler = require "ratewise.scheduler"

describe("the spawn watches", function()
  local told, watching = 0, false
  setup(function()
    scheduler.add_spawn_watch(function() if watching then told = told + 1 end end)
  end)
  before_each(function()
    told, watching = 0, true
  end)
  after_each(function()
    watching = false
  end)

  -- steps until the task is waiting (its wait begun)
  local function until_waiting(task)
    local deadline = rw.now() + 2
    while task:status() ~= "waiting" and rw.now() < deadline do rw.step(0.01) end
    assert.equal("waiting", task:status())
  end

  it("are told when code outside any task spawns one, and not when a task does", function()
    local outer = rw.spawn(function()
      rw.spawn(function() end):join() -- from inside a task: the loop already runs it
    end)
    assert.equal(1, told)
    outer:join()
    assert.equal(1, told)
    rw.spawn(function() end):join()
    assert.equal(2, told)
  end)

  it("are told when code outside any task cancels a waiting task", function()
    local sleeper = rw.spawn(function() rw.sleep(20) end)
    until_waiting(sleeper)
    told = 0
    sleeper:cancel()
    assert.equal(1, told)
    assert.equal(0, rw.step(0.1))
    assert.equal("done", sleeper:status())
  end)

  it("are told when code outside any task releases a permit a task waits for", function()
    local gate = rw.semaphore(1)
    assert.is_true(gate:acquire(0))
    local waiter = rw.spawn(function() gate:acquire() gate:release() end)
    until_waiting(waiter)
    told = 0
    gate:release()
    assert.equal(1, told)
    assert.equal(0, rw.step(0.1))
  end)

  it("are told when code outside any task sets an event a task waits on", function()
    local ev = scheduler.event()
    local waiter = rw.spawn(function() ev:wait() end)
    until_waiting(waiter)
    told = 0
    ev:set()
    assert.equal(1, told)
    assert.equal(0, rw.step(0.1))
  end)

  it("are not told of the same from inside a task", function()
    local gate = rw.semaphore(1)
    local ev = scheduler.event()
    rw.run(function()
      assert.is_true(gate:acquire())
      local sleeper = rw.spawn(function() rw.sleep(20) end)
      local waiter = rw.spawn(function() gate:acquire() gate:release() ev:wait() end)
      rw.sleep(0.01)
      told = 0
      sleeper:cancel()
      gate:release()
      rw.sleep(0.01)
      ev:set()
      assert.equal(0, told)
      waiter:join()
    end)
  end)
end)
