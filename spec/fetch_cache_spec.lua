-- The policies of fetch's fast-path caches (lua/ratewise/fetch/cache.lua),
-- and that what they keep follows what callers change, against a real
-- server: a URL's facts, a client's paths past the bound.
local rw = require "ratewise"
local cache = require "ratewise.fetch.cache"
local server = require "spec.support.server"

describe("fetch.cache", function()
  it("empties a bounded table whole, in place, when it holds its limit", function()
    local t = cache.bounded(3)
    cache.keep(t, "a", 1)
    cache.keep(t, "b", 2)
    cache.keep(t, "c", 3)
    assert.same({ a = 1, b = 2, c = 3 }, t)
    cache.keep(t, "d", 4)
    assert.same({ d = 4 }, t) -- the same table: whoever holds it sees the emptying
  end)

  it("keeps a bounded table's count apart from every other's", function()
    local one, two = cache.bounded(2), cache.bounded(2)
    cache.keep(one, "a", 1)
    cache.keep(two, "a", 1)
    cache.keep(two, "b", 2)
    cache.keep(one, "b", 2)
    assert.same({ a = 1, b = 2 }, one)
    assert.same({ a = 1, b = 2 }, two)
  end)

  it("lets a weak table's key go when its owner drops it", function()
    local t = cache.weak()
    t[{}] = true
    collectgarbage()
    collectgarbage()
    assert.is_nil(next(t))
  end)
end)

describe("fetch's fast paths", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("prints each of many URLs as its own, past the bound of the URLs kept", function()
    for i = 1, 300 do
      local res = assert(rw.fetch(s:url("/u" .. i .. "?token=t" .. i)))
      assert.equal(s:url("/u" .. i), res.url)
    end
    -- and one seen before the table was emptied is found anew
    local res = assert(rw.fetch(s:url("/u1?token=again")))
    assert.equal(s:url("/u1"), res.url)
  end)

  it("sends each of a client's paths to its own URL, past the bound of the paths kept", function()
    local client = rw.client { base_url = s:url("") }
    for i = 1, 300 do assert(client:get("/p" .. i)) end
    assert(client:get("/p1"))
    local log = s:log()
    assert.equal(301, #log)
    assert.equal("/p300", log[300].path)
    assert.equal("/p1", log[301].path)
  end)
end)
