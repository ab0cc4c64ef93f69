local rw = require "ratewise"

describe("rw.classify", function()
  it("calls 2xx a success", function()
    for _, s in ipairs { 200, 201, 204, 226, 299 } do
      assert.equal("success", rw.classify(s))
    end
  end)

  it("calls 408, 429, 500, 502, 503 and 504 retryable", function()
    for _, s in ipairs { 408, 429, 500, 502, 503, 504 } do
      assert.equal("retryable", rw.classify(s))
    end
  end)

  it("calls everything else terminal", function()
    for _, s in ipairs { 100, 199, 300, 304, 400, 401, 403, 404, 409, 422, 501, 505, 511, 0, 999 } do
      assert.equal("terminal", rw.classify(s))
    end
  end)

  it("rejects a status that is not an integer", function()
    assert.has_error(function() rw.classify("429") end)
    assert.has_error(function() rw.classify(429.5) end)
    assert.has_error(function() rw.classify(nil) end)
  end)
end)

describe("rw.parse_http_date", function()
  local sunday = 784111777 -- Sun, 06 Nov 1994 08:49:37 GMT

  it("reads IMF-fixdate", function()
    assert.equal(sunday, rw.parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"))
  end)

  it("reads RFC 850 dates with a two-digit year", function()
    assert.equal(sunday, rw.parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"))
  end)

  it("reads asctime dates", function()
    assert.equal(sunday, rw.parse_http_date("Sun Nov  6 08:49:37 1994"))
    assert.equal(sunday + 4 * 86400, rw.parse_http_date("Thu Nov 10 08:49:37 1994"))
  end)

  it("puts a two-digit year more than 50 years ahead in the past century", function()
    local now2026 = 1795000000 -- in 2026
    -- 76 would be 2076, exactly 50 years on: still ahead, so kept
    assert.equal(rw.parse_http_date("Sat, 01 Jan 2076 00:00:00 GMT"),
      rw.parse_http_date("Saturday, 01-Jan-76 00:00:00 GMT", now2026))
    -- 77 would be 2077, more than 50 years on: it is 1977
    assert.equal(rw.parse_http_date("Sat, 01 Jan 1977 00:00:00 GMT"),
      rw.parse_http_date("Saturday, 01-Jan-77 00:00:00 GMT", now2026))
    assert.equal(rw.parse_http_date("Mon, 01 Jan 2024 00:00:00 GMT"),
      rw.parse_http_date("Monday, 01-Jan-24 00:00:00 GMT", now2026))
  end)

  it("handles leap years and the end of months", function()
    assert.equal(951782400, rw.parse_http_date("Tue, 29 Feb 2000 00:00:00 GMT"))
    assert.is_nil(rw.parse_http_date("Wed, 29 Feb 2023 00:00:00 GMT"))
    assert.is_nil(rw.parse_http_date("Thu, 31 Apr 2025 00:00:00 GMT"))
    assert.equal(4102444799, rw.parse_http_date("Thu, 31 Dec 2099 23:59:59 GMT"))
  end)

  it("rejects garbage and near misses", function()
    for _, s in ipairs {
      "", "garbage", "Sun, 06 Nov 1994 08:49:37", "Sun, 06 Nov 1994 08:49:37 UTC",
      "Sun, 6 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 94 08:49:37 GMT", "Sun, 06 Foo 1994 08:49:37 GMT",
      "Sun, 06 Nov 1994 24:00:00 GMT", "Sun, 06 Nov 1994 08:60:00 GMT", "Sun, 00 Nov 1994 08:49:37 GMT",
      "Sun, 06 Nov 1994 08:49:37 GMTX", "Sunday, 06 Nov 1994 08:49:37 GMT", "1994-11-06T08:49:37Z",
      "Sun Nov 6 08:49:37 1994",
    } do
      assert.is_nil(rw.parse_http_date(s), s)
    end
  end)

  it("allows surrounding white space", function()
    assert.equal(sunday, rw.parse_http_date("  Sun, 06 Nov 1994 08:49:37 GMT\t"))
  end)
end)

describe("rw.parse_retry_after", function()
  it("reads delta-seconds", function()
    assert.equal(120, rw.parse_retry_after("120"))
    assert.equal(0, rw.parse_retry_after("0"))
    assert.equal(1.5, rw.parse_retry_after("1.5"))
    assert.equal(7, rw.parse_retry_after(" 7 "))
  end)

  it("reads an HTTP-date relative to now", function()
    local now = 784111777
    assert.equal(30, rw.parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now))
    assert.equal(30, rw.parse_retry_after("Sunday, 06-Nov-94 08:50:07 GMT", now))
    assert.equal(30, rw.parse_retry_after("Sun Nov  6 08:50:07 1994", now))
  end)

  it("gives 0 for a date in the past", function()
    assert.equal(0, rw.parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"))
  end)

  it("uses the wall clock when now is not given", function()
    local future = os.date("!%a, %d %b %Y %H:%M:%S GMT", os.time() + 100)
    local d = rw.parse_retry_after(future)
    assert.is_true(d > 97 and d <= 100, tostring(d))
  end)

  it("gives nil for empty, negative and garbage values", function()
    for _, s in ipairs { "", "  ", "-1", "-0", "+5", "1e3", "0x10", "abc", "12abc", "1 2", "1.", ".5", "inf", "nan" } do
      assert.is_nil(rw.parse_retry_after(s), s)
    end
  end)

  it("never overflows or wraps on a huge value", function()
    local d = rw.parse_retry_after(string.rep("9", 400))
    assert.is_true(d > 1e17 and d < math.huge)
    d = rw.parse_retry_after("100000000000000000000") -- 10^20
    assert.is_true(d >= 1e17 and d < math.huge)
    d = rw.parse_retry_after("18446744073709551617") -- 2^64 + 1
    assert.is_true(d > 1e17 and d < math.huge)
  end)
end)

describe("rw.backoff", function()
  local function fixed(u) return function() return u end end

  it("without jitter doubles from base and stops at max_delay", function()
    assert.equal(1, rw.backoff(0, { jitter = "none" }))
    assert.equal(2, rw.backoff(1, { jitter = "none" }))
    assert.equal(8, rw.backoff(3, { jitter = "none" }))
    assert.equal(60, rw.backoff(10, { jitter = "none" }))
    assert.equal(0.5, rw.backoff(2, { jitter = "none", base = 0.125 }))
    assert.equal(5, rw.backoff(4, { jitter = "none", max_delay = 5 }))
    assert.equal(60, rw.backoff(100000, { jitter = "none" }))
  end)

  it("with full jitter (the default) is uniform below the cap", function()
    assert.equal(0, rw.backoff(3, { random = fixed(0) }))
    assert.equal(4, rw.backoff(3, { random = fixed(0.5) }))
    for attempt = 0, 8 do
      local d = rw.backoff(attempt)
      assert.is_true(d >= 0 and d < math.min(2 ^ attempt, 60))
    end
  end)

  it("keeps the first fallback wait at most base", function()
    for _ = 1, 50 do assert.is_true(rw.backoff(0, { base = 0.3 }) < 0.3) end
  end)

  it("with equal jitter is in the upper half", function()
    assert.equal(4, rw.backoff(3, { jitter = "equal", random = fixed(0) }))
    assert.equal(6, rw.backoff(3, { jitter = "equal", random = fixed(0.5) }))
  end)

  it("with decorrelated jitter grows from the previous delay", function()
    assert.equal(1, rw.backoff(0, { jitter = "decorrelated", random = fixed(0) }))
    assert.equal(2, rw.backoff(0, { jitter = "decorrelated", random = fixed(0.5) }))
    assert.equal(1 + 0.5 * (30 - 1), rw.backoff(1, { jitter = "decorrelated", previous = 10, random = fixed(0.5) }))
    assert.equal(60, rw.backoff(5, { jitter = "decorrelated", previous = 50, random = fixed(0.9) }))
  end)

  it("rejects bad options with a message naming them", function()
    assert.has_error(function() rw.backoff(-1) end, nil)
    assert.error_matches(function() rw.backoff(1.5) end, "attempt")
    assert.error_matches(function() rw.backoff(1, { base = 0 }) end, "'base'")
    assert.error_matches(function() rw.backoff(1, { max_delay = -1 }) end, "'max_delay'")
    assert.error_matches(function() rw.backoff(1, { jitter = "lots" }) end, "'jitter'")
    assert.error_matches(function() rw.backoff(1, { random = fixed(1) }) end, "'random'")
    assert.error_matches(function() rw.backoff(1, { maxdelay = 3 }) end, "unknown option 'maxdelay'")
  end)
end)

describe("rw.retry_delay", function()
  local none = { jitter = "none" }

  it("prefers Retry-After, matched case-insensitively", function()
    for _, name in ipairs { "Retry-After", "retry-after", "RETRY-AFTER" } do
      local d, source = rw.retry_delay({ [name] = "7", ["x-ratelimit-reset"] = "1" }, 0, none)
      assert.equal(7, d)
      assert.equal("retry-after", source)
    end
  end)

  it("reads Retry-After as an HTTP-date", function()
    local d, source = rw.retry_delay({ ["Retry-After"] = "Sun, 06 Nov 1994 08:50:07 GMT" }, 0,
      { now = 784111777 })
    assert.equal(30, d)
    assert.equal("retry-after", source)
  end)

  it("reads a date against the response's Date header, the server's own clock", function()
    local d = rw.retry_delay({
      ["Retry-After"] = "Sun, 06 Nov 1994 08:50:07 GMT",
      Date = "Sun, 06 Nov 1994 08:49:57 GMT",
    }, 0)
    assert.equal(10, d)
  end)

  it("falls back to x-ratelimit-reset as epoch seconds", function()
    local d, source = rw.retry_delay({ ["X-RateLimit-Reset"] = "1000030" }, 0, { now = 1000000 })
    assert.equal(30, d)
    assert.equal("x-ratelimit-reset", source)
  end)

  it("gives 0 for a reset time in the past", function()
    local d, source = rw.retry_delay({ ["x-ratelimit-reset"] = "999990" }, 0, { now = 1000000 })
    assert.equal(0, d)
    assert.equal("x-ratelimit-reset", source)
  end)

  it("ignores a header that does not parse and tries the next source", function()
    local d, source = rw.retry_delay({ ["Retry-After"] = "soon", ["x-ratelimit-reset"] = "1000005" }, 0,
      { now = 1000000 })
    assert.equal(5, d)
    assert.equal("x-ratelimit-reset", source)
    d, source = rw.retry_delay({ ["Retry-After"] = "soon", ["x-ratelimit-reset"] = " " }, 2, none)
    assert.equal(4, d)
    assert.equal("backoff", source)
  end)

  it("falls back to backoff, counting attempts from 0", function()
    assert.equal(1, (rw.retry_delay({}, 0, none)))
    assert.equal(2, (rw.retry_delay({}, 1, none)))
    assert.equal(3, (rw.retry_delay({}, 5, { jitter = "none", max_delay = 3 })))
  end)

  it("takes the longest of repeated Retry-After values", function()
    assert.equal(10, (rw.retry_delay({ ["retry-after"] = "5, 10" }, 0)))
    assert.equal(90, (rw.retry_delay({
      ["retry-after"] = "Sun, 06 Nov 1994 08:51:07 GMT, 3, garbage",
    }, 0, { now = 784111777 })))
  end)

  it("never caps a server hint", function()
    assert.equal(3600, (rw.retry_delay({ ["Retry-After"] = "3600" }, 0, { max_delay = 1 })))
  end)

  it("rejects bad arguments", function()
    assert.error_matches(function() rw.retry_delay(nil, 0) end, "headers")
    assert.error_matches(function() rw.retry_delay({}, -1) end, "attempt")
    assert.error_matches(function() rw.retry_delay({}, 0, { now = "x" }) end, "'now'")
    assert.error_matches(function() rw.retry_delay({}, 0, { bogus = 1 }) end, "unknown option")
  end)
end)
