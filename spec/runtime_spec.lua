-- The waiting seam (lua/ratewise/runtime.lua): which host serves a wait
-- (docs/hosts.md, "The seam"), and what a bucket's waiter holds when its
-- wait is cut short, through the public API only.
local rw = require "ratewise"
local server = require "spec.support.server"
local socket = require "socket"

local function with_host(opts, fn)
  rw.configure(opts)
  local ok, err = pcall(fn)
  rw.configure { sleep = false }
  assert(ok, err)
end

describe("the seam's precedence", function()
  local s
  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("a per-call sleep serves a timed wait, in a task or not, before the task and the configured host", function()
    local configured, per_call = {}, {}
    with_host({ sleep = function(sec) configured[#configured + 1] = sec end }, function()
      local b = rw.bucket { capacity = 1, rate = 10 }
      assert(b:acquire())
      -- outside a task: the per-call sleep, not the configured host
      assert.is_true(b:acquire(1, function(sec) per_call[#per_call + 1] = sec; socket.sleep(sec) end))
      -- in a task: the per-call sleep still, not the task's yield
      rw.run(function()
        assert.is_true(b:acquire(1, function(sec) per_call[#per_call + 1] = sec; socket.sleep(sec) end))
      end)
    end)
    assert.equal(0, #configured)
    assert.is_true(#per_call >= 2)
    assert.near(0.1, per_call[1], 0.02)
  end)

  it("a task waits for its transfer itself, whatever sleep the call gave", function()
    s:script("/t", { { status = 200, body = "ok", delay = 0.1 } })
    local res
    rw.run(function()
      res = assert(rw.fetch(s:url("/t"), { sleep = function() error("the per-call sleep was asked") end }))
    end)
    assert.equal(200, res.status)
    assert.equal("ok", res.body)
  end)

  it("a task yields to the scheduler before the configured host is asked", function()
    local configured = {}
    local order = {}
    with_host({ sleep = function(sec) configured[#configured + 1] = sec end }, function()
      rw.spawn(function() rw.sleep(0.05); order[#order + 1] = "slow" end)
      rw.spawn(function() rw.sleep(0.01); order[#order + 1] = "fast" end)
      local deadline = rw.now() + 2
      while rw.step(0.1) > 0 and rw.now() < deadline do end
    end)
    assert.same({ "fast", "slow" }, order) -- both waited at once: neither blocked the thread
    assert.equal(0, #configured)
  end)

  it("outside any task, the configured host serves a sleep, a bucket and a transfer", function()
    s:script("/h", { { status = 200, body = "ok", delay = 0.05 } })
    local asked = {}
    with_host({ sleep = function(sec) asked[#asked + 1] = sec; socket.sleep(sec) end }, function()
      rw.sleep(0.02)
      assert.near(0.02, asked[1], 0.005)
      local b = rw.bucket { capacity = 1, rate = 20 }
      assert(b:acquire())
      local before = #asked
      assert.is_true(b:acquire())
      assert.is_true(#asked > before)
      before = #asked
      assert.equal("ok", assert(rw.fetch(s:url("/h"))).body)
      assert.is_true(#asked > before, "the transfer's wait went past the configured host")
    end)
  end)

  it("a speaking coroutine's sleep yields (\"ratewise.sleep\", seconds) to its resumer", function()
    local co = rw.speaks_protocol(coroutine.create(function() rw.sleep(0.03); return "slept" end))
    local _, what, seconds = coroutine.resume(co)
    assert.equal("ratewise.sleep", what)
    assert.near(0.03, seconds, 0.01)
    socket.sleep(seconds)
    local ok, result = coroutine.resume(co)
    assert.is_true(ok)
    assert.equal("slept", result)
  end)
end)

-- A limiter (capacity 1, 10 a second) whose token was just taken: a waiter
-- that held on to its place would make the next caller wait 0.2 s, not 0.1.
local function next_caller_served_in_turn(limiter)
  local ok, wait = limiter:acquire(1, nil, 0.15)
  assert.is_true(ok, tostring(wait))
end

describe("a bucket's waiter whose wait is cut short", function()
  for _, kind in ipairs { "bucket", "adaptive" } do
    it("gives its place up when its task is cancelled before its claim (" .. kind .. ")", function()
      local limiter = kind == "bucket" and rw.bucket { capacity = 1, rate = 10 } or rw.adaptive { rate = 10, burst = 1 }
      assert(limiter:acquire())
      local waiter = rw.spawn(function() return limiter:acquire() end)
      rw.step(0, false) -- it queues for the next token, 0.1 s away
      assert.equal("waiting", waiter:status())
      waiter:cancel()
      rw.step(0, false)
      assert.equal("done", waiter:status())
      next_caller_served_in_turn(limiter)
    end)
  end

  it("gives all its tokens back when its task is cancelled after its claim, before it ran", function()
    local b = rw.bucket { capacity = 2, rate = 40 }
    assert(b:acquire(2))
    local waiter = rw.spawn(function() return b:acquire(2) end)
    rw.step(0, false) -- it waits for the next two tokens, 0.05 s away
    socket.sleep(0.08)
    assert.equal(0, rw.pollable:timeout()) -- the due claim made the waiter ready, without running it
    assert.equal("ready", waiter:status())
    waiter:cancel()
    rw.step(0, false)
    assert.equal("done", waiter:status())
    assert.is_true(b:tokens() > 1.9, "the claimed tokens were not all given back: " .. b:tokens())
  end)

  it("gives its place up when the host's sleep raises outside a task", function()
    local b = rw.bucket { capacity = 1, rate = 10 }
    assert(b:acquire())
    assert.has_error(function() b:acquire(1, function() error("the host went away") end) end, "the host went away")
    next_caller_served_in_turn(b)
  end)

  it("ends with the bucket's error when the bucket is closed while it waits in a task", function()
    local b = rw.bucket { capacity = 1, rate = 5 }
    assert(b:acquire())
    local waiter = rw.spawn(function() return b:acquire() end)
    rw.step(0, false)
    b:close()
    local _, err = waiter:join()
    assert.matches("closed", tostring(err))
  end)
end)
