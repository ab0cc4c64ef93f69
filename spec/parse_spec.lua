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

  it("puts a two-digit year up to 50 years ahead in the next century when that is near", function()
    local now2080 = rw.parse_http_date("Sat, 01 Jun 2080 00:00:00 GMT")
    assert.equal(rw.parse_http_date("Tue, 06 Nov 2105 08:49:37 GMT"),
      rw.parse_http_date("Sunday, 06-Nov-05 08:49:37 GMT", now2080))
  end)

  it("gives nil for an RFC 850 date when now is out of the four-digit years", function()
    assert.is_nil(rw.parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT", 1e300))
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

  it("gives whole seconds as integers from every parser, fractions as floats", function()
    local whole = { rw.parse_retry_after("120"), rw.parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", 784111777),
      rw.parse_duration("1m30s"), rw.parse_rfc3339("2025-01-01T00:00:00Z"), rw.parse_retry_after("0") }
    assert.same({ 120, 10, 90, 1735689600, 0 }, whole)
    local fractions = { rw.parse_retry_after("1.5"), rw.parse_duration("1.5s"),
      rw.parse_rfc3339("2025-01-01T00:00:00.25Z") }
    assert.same({ 1.5, 1.5, 1735689600.25 }, fractions)
    if math.type then
      for _, v in ipairs(whole) do assert.equal("integer", math.type(v)) end
      for _, v in ipairs(fractions) do assert.equal("float", math.type(v)) end
    end
  end)

  it("gives whole epoch seconds as an integer, in every form and at the ends of the years", function()
    for _, s in ipairs {
      "Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
      "Thu, 01 Jan 1970 00:00:00 GMT", "Wed, 31 Dec 1969 23:59:59 GMT",
      "Sat, 01 Jan 0000 00:00:00 GMT", "Fri, 31 Dec 9999 23:59:59 GMT",
    } do
      local v = rw.parse_http_date(s, 1795000000.5) -- a "now" with a fraction changes nothing
      if math.type then -- Lua 5.3 and later have integers
        assert.equal("integer", math.type(v), s)
      else
        assert.equal(math.floor(v), v, s)
      end
    end
    assert.equal(-62167219200, rw.parse_http_date("Sat, 01 Jan 0000 00:00:00 GMT"))
    assert.equal(253402300799, rw.parse_http_date("Fri, 31 Dec 9999 23:59:59 GMT"))
    assert.equal("784111777", tostring(rw.parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT")))
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
    assert.equal(1e300, rw.backoff(3000, { jitter = "none", base = 2.3e-308, max_delay = 1e300 }))
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
    -- The server's clock is an hour behind ours (within the day a Date is
    -- trusted for): by our clock this Retry-After is long past.
    local server_now = os.time() - 3600
    local d = rw.retry_delay({
      ["Retry-After"] = os.date("!%a, %d %b %Y %H:%M:%S GMT", server_now + 10),
      Date = os.date("!%a, %d %b %Y %H:%M:%S GMT", server_now),
    }, 0)
    assert.equal(10, d)
  end)

  it("falls back to x-ratelimit-reset as epoch seconds", function()
    local d, source = rw.retry_delay({ ["X-RateLimit-Reset"] = "1700000030" }, 0, { now = 1700000000 })
    assert.equal(30, d)
    assert.equal("x-ratelimit-reset", source)
  end)

  it("skips x-ratelimit-reset while x-ratelimit-remaining says requests are left", function()
    local d, source = rw.retry_delay({ ["x-ratelimit-reset"] = "1700003000", ["x-ratelimit-remaining"] = "4999" }, 0,
      { now = 1700000000, jitter = "none" })
    assert.equal(1, d)
    assert.equal("backoff", source)
    d, source = rw.retry_delay({ ["x-ratelimit-reset"] = "1700000030", ["x-ratelimit-remaining"] = "0" }, 0,
      { now = 1700000000 })
    assert.equal(30, d)
    assert.equal("x-ratelimit-reset", source)
  end)

  it("backs off for a reset time in the past: a zero hint never sends the retry at once", function()
    local d, source = rw.retry_delay({ ["x-ratelimit-reset"] = "1699999990" }, 0,
      { now = 1700000000, jitter = "none", base = 0.5 })
    assert.equal(0.5, d)
    assert.equal("backoff", source)
    d, source = rw.retry_delay({ ["Retry-After"] = "0" }, 1, { jitter = "none", base = 0.5 })
    assert.same({ 1, "backoff" }, { d, source })
  end)

  it("ignores a header that does not parse and tries the next source", function()
    local d, source = rw.retry_delay({ ["Retry-After"] = "soon", ["x-ratelimit-reset"] = "1700000005" }, 0,
      { now = 1700000000 })
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

describe("rw.parse_duration", function()
  local parse_duration = rw.parse_duration

  it("reads Go durations as OpenAI sends them", function()
    local cases = {
      { "1s", 1 }, { "6m0s", 360 }, { "12ms", 0.012 }, { "1h2m3.5s", 3723.5 }, { "500us", 0.0005 },
      { "500\194\181s", 0.0005 }, -- U+00B5 MICRO SIGN, what Go writes
      { "500\206\188s", 0.0005 }, -- U+03BC GREEK SMALL LETTER MU
      { "20ns", 2e-8 }, { "0", 0 }, { "0s", 0 }, { "1.5h", 5400 }, { "1m30s", 90 }, { "2h45m", 9900 },
      { "1.1ms", 0.0011 }, { "59.999s", 59.999 }, { "1h0m0.001s", 3600.001 },
    }
    for _, case in ipairs(cases) do
      assert.equal(case[2], parse_duration(case[1]), case[1])
    end
  end)

  it("reads a fraction the way Go does, with digits on either side of the point", function()
    assert.equal(0.5, parse_duration(".5s"))
    assert.equal(1, parse_duration("1.s"))
    assert.equal(parse_duration("1s") + parse_duration("500ms"), parse_duration("1.5s"))
  end)

  it("allows surrounding white space", function()
    assert.equal(7, parse_duration(" 7s\t"))
    assert.equal(0, parse_duration("\t0 "))
  end)

  it("gives nil for signs, bare numbers, unknown units and garbage", function()
    for _, s in ipairs {
      "", "  ", "-1s", "+1s", "-0", "+0", "1", "00", "12", "0.0", "s", ".s", "1sm", "1 s", "1s 2m", "1S", "1H",
      "1e3s", "1d", "1s2", "1..5s", "0x10s", "inf", "nan", "1,5s", "\194\181s", "5\194\181", "5\194s",
      "1s\0", "1s\0garbage", "1h-2m", "garbage",
    } do
      assert.is_nil(parse_duration(s), s)
    end
  end)

  it("saturates a huge value at 1e18 seconds instead of overflowing", function()
    assert.equal(1e18, parse_duration(string.rep("9", 400) .. "h"))
    assert.equal(1e18, parse_duration(string.rep("9", 400) .. "ns"))
    assert.equal(1e18, parse_duration("300000000000000000000s"))
    assert.equal(1e18, parse_duration(string.rep("999999999999999h", 2000)))
    -- large but below the cap: read, not saturated
    local d = parse_duration("99999999999999999999999ns") -- 10^23 ns = 10^14 s
    assert.is_true(math.abs(d - 1e14) < 1, tostring(d))
  end)

  it("reads every digit of a long fraction without running past the string", function()
    local d = parse_duration("0." .. string.rep("0", 10000) .. "1s")
    assert.is_true(d >= 0 and d < 1e-9, tostring(d))
    d = parse_duration("1." .. string.rep("9", 10000) .. "s")
    assert.is_true(math.abs(d - 2) < 1e-9, tostring(d))
  end)

  it("raises for a value that is not a string", function()
    assert.error_matches(function() parse_duration(nil) end, "#1")
    assert.error_matches(function() parse_duration({}) end, "#1")
  end)
end)

describe("rw.parse_rfc3339", function()
  local parse_rfc3339 = rw.parse_rfc3339
  local sunday = 784111777 -- 1994-11-06T08:49:37Z, Sun, 06 Nov 1994 08:49:37 GMT

  it("reads a UTC date-time as epoch seconds", function()
    assert.equal(sunday, parse_rfc3339("1994-11-06T08:49:37Z"))
    assert.equal(rw.parse_http_date("Wed, 01 Jan 2025 12:00:30 GMT"), parse_rfc3339("2025-01-01T12:00:30Z"))
    assert.equal(0, parse_rfc3339("1970-01-01T00:00:00Z"))
  end)

  it("keeps fractional seconds", function()
    local whole = parse_rfc3339("2025-01-01T12:00:30Z")
    assert.is_true(math.abs(parse_rfc3339("2025-01-01T12:00:30.123Z") - (whole + 0.123)) < 1e-6)
    assert.is_true(math.abs(parse_rfc3339("2025-01-01T12:00:30.5Z") - (whole + 0.5)) < 1e-6)
    local long = parse_rfc3339("2025-01-01T12:00:30." .. string.rep("9", 1000) .. "Z")
    assert.is_true(math.abs(long - (whole + 1)) < 1e-6, tostring(long))
  end)

  it("applies a numeric offset", function()
    local utc = parse_rfc3339("2025-01-01T12:00:30Z")
    assert.equal(utc, parse_rfc3339("2025-01-01T14:00:30+02:00"))
    assert.equal(utc, parse_rfc3339("2025-01-01T06:30:30-05:30"))
    assert.equal(utc, parse_rfc3339("2025-01-01T12:00:30-00:00"))
    assert.equal(utc, parse_rfc3339("2025-01-02T11:59:30+23:59"))
  end)

  it("accepts 't' and 'z' in lower case, and surrounding white space", function()
    assert.equal(sunday, parse_rfc3339("1994-11-06t08:49:37z"))
    assert.equal(sunday, parse_rfc3339(" 1994-11-06T08:49:37Z\t"))
  end)

  it("handles leap years, month ends and a leap second", function()
    assert.equal(rw.parse_http_date("Thu, 29 Feb 2024 00:00:00 GMT"), parse_rfc3339("2024-02-29T00:00:00Z"))
    assert.equal(951782400, parse_rfc3339("2000-02-29T00:00:00Z"))
    assert.equal(parse_rfc3339("2025-01-01T00:00:00Z"), parse_rfc3339("2024-12-31T23:59:60Z"))
    for _, s in ipairs {
      "2023-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2025-04-31T00:00:00Z", "2025-06-31T00:00:00Z",
    } do
      assert.is_nil(parse_rfc3339(s), s)
    end
  end)

  it("rejects values out of range", function()
    for _, s in ipairs {
      "2025-00-01T00:00:00Z", "2025-13-01T00:00:00Z", "2025-01-00T00:00:00Z", "2025-01-32T00:00:00Z",
      "2025-01-01T24:00:00Z", "2025-01-01T23:60:00Z", "2025-01-01T23:59:61Z",
      "2025-01-01T00:00:00+24:00", "2025-01-01T00:00:00+02:60",
    } do
      assert.is_nil(parse_rfc3339(s), s)
    end
  end)

  it("rejects garbage and near misses", function()
    for _, s in ipairs {
      "", "garbage", "2025-01-01", "2025-01-01T12:00Z", "12:00:30Z", "2025-1-01T12:00:30Z", "25-01-01T12:00:30Z",
      "2025-01-01T12:00:30", "2025-01-01T12:00:30.Z", "2025-01-01 12:00:30Z", "2025-01-01T12:00:30Zx",
      "2025-01-01T12:00:30+0200", "2025-01-01T12:00:30+02", "2025-01-01T12:00:30 Z", "2025-01-01T12:00:30UTC",
      "+2025-01-01T12:00:30Z", "2025-01-01T12:00:30Z\0", "Wed, 01 Jan 2025 12:00:30 GMT", "1735732830",
    } do
      assert.is_nil(parse_rfc3339(s), s)
    end
  end)

  it("never reads past the end: every prefix of a valid value is rejected", function()
    for _, valid in ipairs { "2025-01-01T12:00:30.25+02:00", "2025-01-01T12:00:30Z" } do
      assert.is_number(parse_rfc3339(valid))
      for i = 0, #valid - 1 do
        assert.is_nil(parse_rfc3339(valid:sub(1, i)), valid:sub(1, i))
      end
    end
  end)

  it("raises for a value that is not a string", function()
    assert.error_matches(function() parse_rfc3339(nil) end, "#1")
    assert.error_matches(function() parse_rfc3339(true) end, "#1")
  end)
end)
