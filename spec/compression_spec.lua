-- Compressed bodies (Content-Encoding), which the engine decodes itself
-- (src/decode.c): whole ones decode, ones cut short are errors, stacked
-- codings are undone in turn, codings not known are refused, a bomb ends at
-- max_body, and a stream's compressed chunks are handed over decoded as
-- they come. Against the test server, which compresses and cuts.
local rw = require "ratewise"
local server = require "spec.support.server"

local function opts(extra)
  local o = { on_retry = false, max_retries = 0 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- 12,000 bytes that compress to a few KiB, the same on every run.
local function text(n)
  local parts, x, len = {}, 12345, 0
  while len < n do
    x = (x * 1103515245 + 12345) % 2147483648
    local line = ("line %d %d\n"):format(#parts, x % 1000000)
    parts[#parts + 1] = line
    len = len + #line
  end
  return table.concat(parts):sub(1, n)
end

local BODY = text(12000)
local CODINGS = { "gzip", "deflate", "deflate-raw", "br", "zstd" }

describe("compressed bodies", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  for _, coding in ipairs(CODINGS) do
    it("decodes a whole " .. coding .. " body", function()
      s:script("/whole", { { encoding = coding, body = BODY } })
      local res = assert(rw.fetch(s:url("/whole"), opts()))
      assert.is_true(res.body == BODY, #res.body .. " bytes")
      assert.equal("deflate, gzip, br, zstd", s:log("/whole")[1].headers["accept-encoding"])
    end)

    -- libcurl 7.88 compared the Content-Length with the compressed bytes,
    -- which matched, and none of its decoders checked that the stream
    -- ended: these came back as successes with bytes missing.
    for _, cut in ipairs { 1, 30 } do
      it("retries a " .. coding .. " body cut " .. cut .. " bytes short, its Content-Length matching", function()
        s:script("/cut", { { encoding = coding, body = BODY, cut = cut } })
        local res, err = rw.fetch(s:url("/cut"), opts { max_retries = 1, base = 0.01 })
        assert.is_nil(res)
        assert.equal("exhausted", err.kind)
        assert.equal(2, err.attempts)
        assert.equal(2, #s:log("/cut")) -- retried: a GET is replay-safe
        assert.is_nil(err.response)
        local name = coding == "deflate-raw" and "deflate" or coding
        assert.matches("the " .. name .. " body ended before its end %(truncated%)", err.message)
        assert.is_true(err.transport.retryable)
        -- and a whole one after it is the answer
        s:script("/cut2", { { encoding = coding, body = BODY, cut = cut }, { encoding = coding, body = BODY } })
        res = assert(rw.fetch(s:url("/cut2"), opts { max_retries = 1, base = 0.01 }))
        assert.is_true(res.body == BODY)
        assert.equal(2, res.attempts)
      end)
    end
  end

  it("does not replay a POST whose compressed answer was cut short", function()
    s:script("/post", { { encoding = "gzip", body = BODY, cut = 30 } })
    local res, err = rw.fetch(s:url("/post"), opts { method = "POST", body = "x", max_retries = 2, base = 0.01 })
    assert.is_nil(res)
    assert.equal("unsafe", err.kind)
    assert.equal(1, #s:log("/post"))
    assert.matches("the gzip body ended before its end", err.message)
  end)

  it("undoes stacked codings in turn, and takes identity and case as libcurl did", function()
    s:script("/stack", { { encoding = { "gzip", "br" }, body = BODY } })
    local res = assert(rw.fetch(s:url("/stack"), opts()))
    assert.is_true(res.body == BODY)
    assert.equal("gzip, br", res.headers["content-encoding"])
    s:script("/stack3", { { encoding = { "deflate", "zstd", "gzip" }, body = BODY } })
    assert.is_true(assert(rw.fetch(s:url("/stack3"), opts())).body == BODY)
    s:script("/cut3", { { encoding = { "deflate", "zstd", "gzip" }, body = BODY, cut = 30 } })
    local nothing, err = rw.fetch(s:url("/cut3"), opts())
    assert.is_nil(nothing)
    assert.matches("ended before its end %(truncated%)", err.message)
    -- two Content-Encoding lines are one list; names in any case
    s:script("/lines", { { encoding = { "gzip", "gzip" }, body = BODY } })
    assert.is_true(assert(rw.fetch(s:url("/lines"), opts())).body == BODY)
    s:script("/identity", { { body = "plain", headers = { ["Content-Encoding"] = { "identity", "IDENTITY" } } } })
    assert.equal("plain", assert(rw.fetch(s:url("/identity"), opts())).body)
  end)

  it("refuses a coding it does not know, and more than five, without retrying", function()
    for _, value in ipairs { "compress", "gzip;q=1", "identity, identity, identity, identity, identity, identity" } do
      s:reset()
      s:script("/odd", { { body = "compressed?", headers = { ["Content-Encoding"] = value } } })
      local res, err = rw.fetch(s:url("/odd"), opts { max_retries = 2, base = 0.01 })
      assert.is_nil(res, value)
      assert.equal("network", err.kind)
      assert.equal(1, #s:log("/odd"), value)
      assert.is_false(err.transport.retryable)
      if value:find("identity") then
        assert.matches("more than 5 content codings", err.message)
      else
        local quoted = '"' .. value:gsub("%p", "%%%0") .. '"'
        assert.matches("Content%-Encoding " .. quoted .. " is not one ratewise decodes", err.message)
      end
    end
    -- an empty body has nothing to decode, as in libcurl
    s:script("/empty", { { body = "", headers = { ["Content-Encoding"] = "compress" } } })
    assert.equal("", assert(rw.fetch(s:url("/empty"), opts())).body)
  end)

  it("refuses a body that is not what its coding says, without retrying", function()
    s:script("/bad", { { body = "not gzip at all", headers = { ["Content-Encoding"] = "gzip" } } })
    local res, err = rw.fetch(s:url("/bad"), opts { max_retries = 2, base = 0.01 })
    assert.is_nil(res)
    assert.equal("network", err.kind)
    assert.equal(1, #s:log("/bad"))
    assert.matches("the gzip body is not valid gzip", err.message)
  end)

  it("stops a bomb at max_body: a few KiB that expand to 4 MiB", function()
    for _, coding in ipairs { "gzip", "deflate", "deflate-raw", "br", "zstd", { "gzip", "gzip" } } do
      s:script("/bomb", { { encoding = coding, zeros = 4 * 1024 * 1024 } })
      local res, err = rw.fetch(s:url("/bomb"), opts { max_body = 256 * 1024 })
      assert.is_nil(res)
      assert.equal("network", err.kind)
      assert.matches("body too large %(limit 262144 bytes%)", err.message)
      assert.is_false(err.transport.retryable)
    end
  end)

  -- The process's peak resident memory (Linux's VmHWM) grows by far less
  -- than the bomb would expand to: nothing past max_body is made.
  it("decodes no more of a bomb than max_body, streamed or not", function()
    local function peak_kib()
      local f = assert(io.open("/proc/self/status"))
      local kib = tonumber(f:read("*a"):match("VmHWM:%s*(%d+)"))
      f:close()
      return kib
    end
    s:script("/big", { { encoding = "zstd", zeros = 256 * 1024 * 1024 } })
    local before = peak_kib()
    local res, err = rw.fetch(s:url("/big"), opts { max_body = 1024 * 1024 })
    assert.is_nil(res)
    assert.matches("body too large", err.message)
    res = assert(rw.fetch(s:url("/big"), opts { stream = true, max_body = 1024 * 1024 }))
    local ok, serr = pcall(function() for _ in res:chunks() do end end)
    assert.is_false(ok)
    assert.equal("stream", serr.kind)
    local grew = peak_kib() - before
    assert.is_true(grew < 64 * 1024, ("the peak grew by %d KiB"):format(grew))
  end)

  it("hands a stream's gzip chunks over decoded as they come", function()
    for _, coding in ipairs { "gzip", "deflate", "deflate-raw" } do
      s:script("/s", { { action = "stream", encoding = coding,
        chunks = { { 0, "data: one\n\n" }, { 0.4, "data: two\n\n" }, { 0.1, "data: three\n\n" } } } })
      local t0 = rw.now()
      local res = assert(rw.fetch(s:url("/s"), opts { stream = true }))
      local first = res:read()
      local at = rw.now() - t0
      assert.equal("data: one\n\n", first)
      assert.is_true(at < 0.3, ("the first chunk came after %.2f s"):format(at))
      local rest = {}
      for chunk in res:chunks() do rest[#rest + 1] = chunk end
      assert.equal("data: two\n\ndata: three\n\n", table.concat(rest))
    end
  end)

  it("pauses a compressed stream whose reader falls behind, then goes on where it stopped", function()
    local big = text(1024 * 1024)
    for _, coding in ipairs { "gzip", "br", "zstd", { "deflate", "gzip" } } do
      s:script("/big", { { encoding = coding, body = big } })
      local res = assert(rw.fetch(s:url("/big"), opts { stream = true }))
      rw.run(function() rw.sleep(0.3) end) -- the engine runs, nobody reads
      local parts = { res:read() }
      assert.is_true(#parts[1] <= 256 * 1024 + 16 * 1024, #parts[1] .. " bytes were buffered while nobody read")
      for chunk in res:chunks() do parts[#parts + 1] = chunk end
      local got = table.concat(parts)
      assert.equal(#big, #got)
      assert.is_true(got == big)
    end
  end)

  it("breaks a stream off whose compressed body ends before its coding does", function()
    -- (the pause: the body does not end before fetch has the headers)
    s:script("/s", { { action = "stream", encoding = "gzip", ["end"] = "unfinished",
      chunks = { { 0, "data: one\n\n" }, { 0.3, "data: two\n\n" } } } })
    local res = assert(rw.fetch(s:url("/s"), opts { stream = true }))
    local got = {}
    local ok, err = pcall(function() for chunk in res:chunks() do got[#got + 1] = chunk end end)
    assert.is_false(ok)
    assert.equal("data: one\n\ndata: two\n\n", table.concat(got)) -- what came, decoded
    assert.equal("stream", err.kind)
    assert.matches("the gzip body ended before its end %(truncated%)", err.message)
  end)
end)
