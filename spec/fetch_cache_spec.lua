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

  -- A response as fetch gives it: lower-case header names.
  local function answer(h) return { status = 200, headers = h } end

  it("keeps a response for the client's ttl, cut to its max-age or Expires, less its Age (RFC 9111 4.2)", function()
    assert.equal(10, cache.lifetime(answer {}, 10))
    assert.equal(3, cache.lifetime(answer { ["cache-control"] = "public, max-age=3" }, 10))
    assert.equal(10, cache.lifetime(answer { ["cache-control"] = "max-age=60" }, 10))
    assert.equal(2, cache.lifetime(answer { ["cache-control"] = 'max-age="2"' }, 10))
    -- several max-age: the smallest; s-maxage is a shared cache's
    assert.equal(1, cache.lifetime(answer { ["cache-control"] = "max-age=5, max-age=1" }, 10))
    assert.equal(10, cache.lifetime(answer { ["cache-control"] = "s-maxage=1" }, 10))
    -- stale on arrival: max-age=0 (must-revalidate or not), an Age past it,
    -- a max-age that is not a number
    assert.is_true(cache.lifetime(answer { ["cache-control"] = "private, max-age=0, must-revalidate" }, 10) <= 0)
    assert.is_true(cache.lifetime(answer { ["cache-control"] = "max-age=5", age = "5" }, 10) <= 0)
    assert.is_true(cache.lifetime(answer { ["cache-control"] = "max-age=soon" }, 10) <= 0)
    assert.equal(3, cache.lifetime(answer { ["cache-control"] = "max-age=5", age = "2, 4" }, 10))
    assert.equal(10, cache.lifetime(answer { age = "old" }, 10))
    -- Expires, less Date, without a max-age; "0" or a past date is stale
    local date = "Sun, 06 Nov 1994 08:49:37 GMT"
    assert.equal(4, cache.lifetime(answer { date = date, expires = "Sun, 06 Nov 1994 08:49:41 GMT" }, 10))
    assert.is_true(cache.lifetime(answer { expires = "0" }, 10) <= 0)
    assert.is_true(cache.lifetime(answer { expires = "Thu, 01 Jan 1970 00:00:00 GMT" }, 10) <= 0)
    assert.equal(7, cache.lifetime(answer { ["cache-control"] = "max-age=7", expires = "0" }, 10))
  end)

  it("hands a response on to identical requests unless it varies on a field their identity left out", function()
    assert.is_true(cache.fits(answer {}, { ["user-agent"] = "a" }, { ["user-agent"] = "b" }))
    assert.is_true(cache.fits(answer { vary = "Accept" }, { ["user-agent"] = "a" }, { ["user-agent"] = "b" }))
    assert.is_false(cache.fits(answer { vary = "Accept, User-Agent" }, { ["user-agent"] = "a" },
      { ["user-agent"] = "b" }))
    assert.is_false(cache.fits(answer { vary = "user-agent" }, { ["user-agent"] = "a" }, nil))
    assert.is_true(cache.fits(answer { vary = "User-Agent" }, { ["user-agent"] = "a" }, { ["user-agent"] = "a" }))
    assert.is_false(cache.fits(answer { vary = "*" }, nil, nil))
    assert.is_true(cache.fits(nil, nil, nil)) -- an error without a response
  end)

  it("reads each part of a request's identity in its own section", function()
    local digester = assert(cache.digester())
    local function key(body, h, call)
      return (cache.request_key(digester, "GET", "http://h/", body, h, call or {}, {}))
    end
    assert.are_not.equal(key(nil, {}), key("", {}))
    assert.are_not.equal(key(nil, { decompress = "false" }), key(nil, {}, { decompress = false }))
    assert.equal(key(nil, { Accept = "x" }), key(nil, { accept = "x" }))
    -- the fields left out of the key are told apart for a Vary
    local k1, unkeyed = cache.request_key(digester, "GET", "http://h/", nil, { ["User-Agent"] = "a" }, {}, {})
    assert.equal(key(nil, {}), k1)
    assert.same({ ["user-agent"] = "a" }, unkeyed)
    -- a header name fetch refuses makes no key (fetch then says why)
    assert.is_nil(key(nil, { [true] = "x" }))
    assert.is_nil(key(nil, { Accept = "x", accept = "y" })) -- fetch refuses a name given twice
    assert.is_nil(key(nil, { ["User-Agent"] = "x", ["user-agent"] = "y" }))
  end)

  it("reads a call's options alike whatever order its table holds them in", function()
    local digester = assert(cache.digester())
    local options = {
      { "verify_tls", false }, { "decompress", false }, { "max_body", 1024 }, { "proxy", "http://p:1" },
      { "ca_file", "/ca.pem" }, { "follow_redirects", false }, { "tls_min_version", "1.2" },
      { "secret_headers", { "X-Key" } }, { "timeout", 5 }, { "method", "GET" },
    }
    local function key(order)
      local call = {}
      for _, i in ipairs(order) do call[options[i][1]] = options[i][2] end
      return (cache.request_key(digester, "GET", "http://h/", nil, {}, call, {}))
    end
    local forward, backward, shuffled = {}, {}, { 3, 9, 1, 7, 5, 10, 2, 8, 4, 6 }
    for i = 1, #options do forward[i], backward[#options + 1 - i] = i, i end
    local k = key(forward)
    assert.equal(k, key(backward))
    assert.equal(k, key(shuffled))
    -- and each option takes part: one left out is another request
    for leave = 1, #options do
      local some = {}
      for i = 1, #options do if i ~= leave then some[#some + 1] = i end end
      local name = options[leave][1]
      if name == "timeout" or name == "method" then
        assert.equal(k, key(some), name .. " is no part of the identity")
      else
        assert.are_not.equal(k, key(some), name)
      end
    end
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
