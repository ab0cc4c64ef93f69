-- Defects found in review of issue 38's first wave (rw.client's identity,
-- cache and dedupe). Each `it` names one defect and fails until it is
-- fixed; each runs against the loopback test server and asserts what the
-- server saw or what the caller got.
local rw = require "ratewise"
local server = require "spec.support.server"

describe("review of issue 38: rw.client", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  local function new(extra)
    local o = { base_url = s.base, on_retry = false }
    for k, v in pairs(extra or {}) do o[k] = v end
    return rw.client(o)
  end

  -- RFC 9111 5.2.2.2 and 4.2.4: once stale (max-age=0: at once), a
  -- must-revalidate response is not reused without validation, which this
  -- cache cannot do. Rails and others send exactly this for dynamic pages.
  it("does not serve a response marked max-age=0, must-revalidate from its cache", function()
    local revalidate = { ["Cache-Control"] = "private, max-age=0, must-revalidate" }
    s:script("/dyn", { { status = 200, body = "one", headers = revalidate }, { status = 200, body = "two" } })
    local c = new { cache = { ttl = 10 } }
    assert.equal("one", assert(c:get("/dyn")).body)
    assert.equal("two", assert(c:get("/dyn")).body)
    assert.equal(2, #s:log("/dyn"))
  end)

  -- The key is made from the header table when the call starts; fetch reads
  -- the table when the call's turn comes under `concurrency`. A credential
  -- changed meanwhile is sent, and its answer is kept under the key of the
  -- credential before.
  it("does not keep the answer to one credential under the key of another (concurrency wait)", function()
    s:script("/slow", { { status = 200, body = "slow", delay = 0.2 } })
    local h = { Authorization = "Bearer tenant-a" }
    local c = new { cache = { ttl = 30 }, dedupe = false, concurrency = 1, headers = h }
    rw.run(function()
      rw.spawn(function() assert(c:get("/slow")) end)
      rw.spawn(function() assert(c:get("/echo")) end) -- waits for its turn
      rw.sleep(0.05)
      h.Authorization = "Bearer tenant-b"
    end)
    h.Authorization = "Bearer tenant-a"
    local res = assert(c:get("/echo"))
    assert.equal("Bearer tenant-a", assert(res:json()).headers.authorization)
  end)

  -- request_key absorbs the header fields, then the options, with nothing
  -- between them: a header named like an option, with the option's value
  -- as text, reads as that option.
  it("does not take a header named like an option for the option (decompress)", function()
    s:script("/gz", { { status = 200, body = "hello, decoded", encoding = "gzip" } })
    local c = new { cache = { ttl = 10 } }
    assert.equal("hello, decoded", assert(c:get("/gz", { headers = { decompress = "false" } })).body)
    local raw = assert(c:get("/gz", { decompress = false }))
    assert.are_not.equal("hello, decoded", raw.body)
    assert.equal(2, #s:log("/gz"))
  end)

  -- request_key reads a nil body as "": libcurl sends an empty body with
  -- Content-Length: 0 and a Content-Type, no body without them.
  it("does not serve an OPTIONS without a body to one with an empty body (the server sees them apart)", function()
    local c = new { cache = { ttl = 10 } }
    assert(c:request("OPTIONS", "/echo"))
    assert(c:request("OPTIONS", "/echo", { body = "" }))
    local log = s:log("/echo")
    assert.equal(2, #log)
    assert.is_nil(log[1].headers["content-length"])
    assert.equal("0", log[2].headers["content-length"])
  end)

  -- rw.fetch takes options inherited through an __index table (a per-call
  -- table over a base); the client's _call copies the call's own fields
  -- with pairs, and a POST goes out without its body and its key.
  it("sends the options a call inherits through __index, as rw.fetch does", function()
    local base = { body = "payload", idempotency_key = "key-123" }
    local c = new()
    assert(c:post("/echo", setmetatable({}, { __index = base })))
    assert(rw.fetch(s.base .. "/echo", setmetatable({ method = "POST", on_retry = false }, { __index = base })))
    local log = s:log("/echo")
    assert.equal(2, #log)
    assert.equal("payload", log[2].body) -- rw.fetch
    assert.equal("key-123", log[2].headers["idempotency-key"])
    assert.equal("payload", log[1].body) -- the client
    assert.equal("key-123", log[1].headers["idempotency-key"])
  end)

  -- A host's own runner of plain coroutines, whose code waits through the
  -- per-call `sleep` option (it yields to the runner). The client's own
  -- waits (joining an identical request in flight, a turn under
  -- `concurrency`) ignore that option: outside a task they block the thread
  -- in the engine's poll, so the runner never resumes the coroutine they
  -- wait for, and they wait out max_elapsed.
  local function run_in_host_runner(c, opts_for)
    local function host_sleep(seconds) coroutine.yield("nap", seconds) end
    local results, took, cos = {}, {}, {}
    for i = 1, 2 do
      cos[i] = coroutine.create(function()
        local t0 = rw.now()
        local res, err = c:get("/same", opts_for(host_sleep))
        took[i] = rw.now() - t0
        results[i] = res and res.body or err.message
      end)
    end
    local t0 = rw.now()
    while not (results[1] and results[2]) and rw.now() - t0 < 10 do
      for i = 1, 2 do
        if coroutine.status(cos[i]) == "suspended" then
          local ok, e = coroutine.resume(cos[i])
          if not ok then results[i] = "raised: " .. tostring(e) end
        end
      end
      require("socket").sleep(0.005)
    end
    return results, took
  end

  it("joins an identical request in flight without blocking a caller that waits through its sleep option", function()
    s:script("/same", { { status = 200, body = "shared", delay = 0.1 } })
    local c = new { max_elapsed = 2 }
    local results, took = run_in_host_runner(c, function(sleep) return { sleep = sleep } end)
    assert.same({ "shared", "shared" }, results)
    assert.is_true(took[1] < 1 and took[2] < 1, "took " .. tostring(took[1]) .. " and " .. tostring(took[2]) .. " s")
    assert.equal(1, #s:log("/same"))
  end)

  it("waits for a turn under concurrency through the call's sleep option, not by blocking the thread", function()
    s:script("/same", { { status = 200, body = "shared", delay = 0.1 } })
    local c = new { max_elapsed = 2, dedupe = false, concurrency = 1 }
    local results, took = run_in_host_runner(c, function(sleep) return { sleep = sleep } end)
    assert.same({ "shared", "shared" }, results)
    assert.is_true(took[1] < 1 and took[2] < 1, "took " .. tostring(took[1]) .. " and " .. tostring(took[2]) .. " s")
    assert.equal(2, #s:log("/same"))
  end)

  it("does not print a path's userinfo in the error for a path that is not / or http(s)", function()
    local c = new()
    local ok, err = pcall(c.get, c, "ftp://alice:s3cr3t-pw@example.com/x")
    assert.is_false(ok)
    assert.matches("path must start with /", err)
    assert.is_nil(err:find("s3cr3t", 1, true), err)
    ok, err = pcall(c.get, c, "alice:s3cr3t-pw@" .. s.base:gsub("^http://", "") .. "/x")
    assert.is_false(ok)
    assert.is_nil(err:find("s3cr3t", 1, true), err)
  end)

  it("names a header name that is not a string as fetch does, not with a Lua error of its own", function()
    local c = new()
    local ok, err = pcall(c.get, c, "/echo", { headers = { [true] = "x" } })
    assert.is_false(ok)
    assert.matches("header name", err)
    assert.equal(0, #s:log("/echo"))
  end)
end)
