-- Misuse from Lua: every public function and option given the wrong type,
-- a bucket used after close, and callbacks that raise, answer nonsense or
-- yield where they cannot. Misuse must raise an error that names what was
-- wrong; a failing callback must be named; and the library must be left in
-- a state where the same limiter, engine and scheduler go on working.
local rw = require "ratewise"
local scheduler = require "ratewise.scheduler"
local server = require "spec.support.server"

local THIS_FILE = "spec/promises/misuse_spec.lua"

-- The message of the error fn raises (fails the row when it raises none).
local function message_of(fn, label)
  local ok, err = pcall(fn)
  assert.is_false(ok, (label or "call") .. " raised no error")
  return tostring(err)
end

-- fn must raise, and every string of `names` must be in the message.
local function assert_names(fn, names, label)
  local msg = message_of(fn, label)
  for _, name in ipairs(names) do
    assert.is_truthy(msg:find(name, 1, true), string.format("%s: %q is not in the error: %s", label, name, msg))
  end
  return msg
end

-- Runs a table of rows { label, fn, {names...} }.
local function check_rows(rows)
  for _, row in ipairs(rows) do assert_names(row[2], row[3], row[1]) end
end

local function no_sleep() end
local URL = "http://127.0.0.1:1/never"

describe("misuse", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("rw.fetch", function()
    -- One value of a wrong type for every option.
    local wrong = {
      method = 5, headers = "x", body = 5, timeout = "5", max_retries = "3", max_elapsed = true,
      max_delay = "1", retry_non_idempotent = 1, idempotency_key = 5, limiter = 5, on_retry = 5, delay = 5,
      sleep = 5, follow_redirects = "yes", base = "1", jitter = 5, max_body = "1", verify_tls = "no",
      policy = {}, circuit = 5, budget = {}, cost = "1", on_event = 5,
    }

    it("refuses a wrong type for every option, naming it, and sends nothing", function()
      for name, value in pairs(wrong) do
        local msg = assert_names(function() rw.fetch(s:url("/x"), { [name] = value }) end, { "'" .. name .. "'" }, name)
        assert.is_nil(msg:find("unknown option", 1, true), name .. " is not an option of fetch: " .. msg)
        assert.matches("must be", msg, 1, true)
      end
      assert.equal(0, #s:log())
    end)

    it("refuses bad values, naming the option", function()
      check_rows {
        { "timeout 0", function() rw.fetch(URL, { timeout = 0 }) end, { "'timeout'" } },
        { "timeout inf", function() rw.fetch(URL, { timeout = math.huge }) end, { "'timeout'" } },
        { "max_retries -1", function() rw.fetch(URL, { max_retries = -1 }) end, { "'max_retries'" } },
        { "max_retries nan", function() rw.fetch(URL, { max_retries = 0 / 0 }) end, { "'max_retries'" } },
        { "max_retries inf", function() rw.fetch(URL, { max_retries = math.huge }) end, { "'max_retries'" } },
        { "max_elapsed -1", function() rw.fetch(URL, { max_elapsed = -1 }) end, { "'max_elapsed'" } },
        { "max_delay -1", function() rw.fetch(URL, { max_delay = -1 }) end, { "'max_delay'" } },
        { "base 0", function() rw.fetch(URL, { base = 0 }) end, { "'base'" } },
        { "max_body -1", function() rw.fetch(URL, { max_body = -1 }) end, { "'max_body'" } },
        { "cost 0", function() rw.fetch(URL, { cost = 0 }) end, { "'cost'" } },
        { "idempotency_key CRLF", function() rw.fetch(URL, { idempotency_key = "a\r\nb" }) end,
          { "'idempotency_key'" } },
        { "limiter without acquire", function() rw.fetch(URL, { limiter = { take = no_sleep } }) end,
          { "'limiter'", "acquire" } },
        { "circuit without record", function() rw.fetch(URL, { circuit = { allow = no_sleep } }) end,
          { "'circuit'", "record" } },
        { "budget without allow_retry", function() rw.fetch(URL, { budget = { request = no_sleep } }) end,
          { "'budget'", "allow_retry" } },
        { "method with a space", function() rw.fetch(URL, { method = "GE T" }) end, { "'method'" } },
        { "unknown option", function() rw.fetch(URL, { retries = 3 }) end, { "'retries'" } },
        { "url not a string", function() rw.fetch({}) end, { "url" } },
        { "url without http", function() rw.fetch("ftp://x/") end, { "url" } },
        { "options not a table", function() rw.fetch(URL, "GET") end, { "options" } },
        { "header value table", function() rw.fetch(URL, { headers = { ["X-A"] = {} } }) end, { "'X-A'" } },
        { "header name number", function() rw.fetch(URL, { headers = { [1] = "v" } }) end, { "header name" } },
      }
    end)

    it("refuses a jitter it does not know at the call, before sending anything", function()
      s:script("/j", { { status = 503 }, { status = 200 } })
      local ok, msg = pcall(rw.fetch, s:url("/j"), { jitter = "bogus", on_retry = false, sleep = no_sleep })
      assert.is_false(ok)
      assert.matches("'jitter'", msg)
    end)

    it("refuses an infinite max_delay at the call, or takes it as no cap", function()
      s:script("/d", { { status = 503 }, { status = 200 } })
      local ok, msg = pcall(rw.fetch, s:url("/d"), { max_delay = math.huge, on_retry = false, sleep = no_sleep,
        base = 0.01 })
      if not ok then
        assert.matches("'max_delay'", msg)
        assert.equal(0, #s:log("/d"))
      end
    end)

    it("names the option when cost can never be served by the limiter", function()
      local b = rw.bucket { capacity = 1, rate = 1 }
      local msg = message_of(function() rw.fetch(s:url("/c"), { limiter = b, cost = 5 }) end)
      assert.equal(0, #s:log("/c"))
      assert.matches("cost", msg)
    end)
  end)

  describe("rw.bucket", function()
    it("refuses bad options, naming them", function()
      check_rows {
        { "no table", function() rw.bucket() end, { "#1", "'bucket'" } },
        { "a string", function() rw.bucket("x") end, { "#1", "'bucket'" } },
        { "capacity", function() rw.bucket { capacity = "x", rate = 1 } end, { "'capacity'" } },
        { "rate", function() rw.bucket { capacity = 1, rate = {} } end, { "'rate'" } },
        { "rate 0", function() rw.bucket { capacity = 1, rate = 0 } end, { "'rate'" } },
        { "capacity missing", function() rw.bucket { rate = 1 } end, { "'capacity'" } },
        { "unknown", function() rw.bucket { capacity = 1, rate = 1, burst = 2 } end, { "'burst'" } },
      }
    end)

    it("refuses wrong arguments to its methods, naming the method and the argument", function()
      local b = rw.bucket { capacity = 2, rate = 1 }
      check_rows {
        { "take type", function() b:take("x") end, { "'take'", "#1" } },
        { "take 0", function() b:take(0) end, { "'take'", "token count" } },
        { "take over capacity", function() b:take(3) end, { "'take'", "capacity" } },
        { "reserve type", function() b:reserve({}) end, { "'reserve'", "#1" } },
        { "reserve nan", function() b:reserve(0 / 0) end, { "'reserve'", "token count" } },
        { "refund type", function() b:refund("x") end, { "'refund'", "#1" } },
        { "wait_time type", function() b:wait_time("x") end, { "'wait_time'", "#1" } },
        { "wait_time -1", function() b:wait_time(-1) end, { "'wait_time'", "token count" } },
        { "sync remaining", function() b:sync("x") end, { "'sync'", "#1" } },
        { "sync reset_in", function() b:sync(1, "x") end, { "'sync'", "#2" } },
        { "sync -1", function() b:sync(-1) end, { "'sync'", "remaining" } },
        { "sync reset_in -1", function() b:sync(0, -1) end, { "'sync'", "reset_in" } },
        { "acquire -1", function() b:acquire(-1) end, { "token count" } },
        { "acquire type", function() b:acquire("x") end, { "#1" } },
        { "method on a non-bucket", function() b.take(5) end, { "ratewise.Bucket expected" } },
      }
      assert.equal(2, b:tokens()) -- none of that took anything
    end)

    it("names 'acquire' and checks its sleep argument", function()
      local b = rw.bucket { capacity = 2, rate = 1 }
      local msg = message_of(function() b:acquire("x") end)
      local took_sleep = pcall(b.acquire, b, 1, 5)
      b:refund(1)
      assert.matches("acquire", msg)
      assert.is_false(took_sleep)
    end)
  end)

  describe("a bucket used after close", function()
    it("refuses every method, saying the bucket is closed; close and tostring still work", function()
      local b = rw.bucket { capacity = 2, rate = 1 }
      b:close()
      check_rows {
        { "take", function() b:take() end, { "bucket is closed" } },
        { "reserve", function() b:reserve() end, { "bucket is closed" } },
        { "refund", function() b:refund() end, { "bucket is closed" } },
        { "wait_time", function() b:wait_time() end, { "bucket is closed" } },
        { "sync", function() b:sync(1) end, { "bucket is closed" } },
        { "tokens", function() b:tokens() end, { "bucket is closed" } },
        { "capacity", function() b:capacity() end, { "bucket is closed" } },
        { "rate", function() b:rate() end, { "bucket is closed" } },
        { "acquire", function() b:acquire() end, { "bucket is closed" } },
        { "in a composite", function() rw.limiters { b } end, { "bucket is closed" } },
      }
      b:close() -- idempotent
      assert.equal("ratewise.Bucket (closed)", tostring(b))
    end)

    it("makes a fetch that uses it raise before anything is sent; the engine stays good", function()
      local b = rw.bucket { capacity = 2, rate = 1 }
      b:close()
      assert_names(function() rw.fetch(s:url("/x"), { limiter = b, on_retry = false }) end, { "bucket is closed" },
        "fetch")
      assert.equal(0, #s:log())
      assert.equal(200, assert(rw.fetch(s:url("/x"), { on_retry = false })).status)
      assert.equal(0, rw.step(0))
    end)
  end)

  describe("rw.backoff and rw.retry_delay", function()
    it("refuse wrong arguments and options, naming them", function()
      check_rows {
        { "backoff attempt", function() rw.backoff("x") end, { "attempt" } },
        { "backoff attempt 1.5", function() rw.backoff(1.5) end, { "attempt" } },
        { "backoff opts", function() rw.backoff(1, 5) end, { "options" } },
        { "backoff base", function() rw.backoff(1, { base = "x" }) end, { "'base'" } },
        { "backoff max_delay", function() rw.backoff(1, { max_delay = "x" }) end, { "'max_delay'" } },
        { "backoff jitter", function() rw.backoff(1, { jitter = 5 }) end, { "'jitter'" } },
        { "backoff random", function() rw.backoff(1, { random = 5 }) end, { "'random'" } },
        { "backoff random answer", function() rw.backoff(1, { random = function() return "x" end }) end,
          { "'random'" } },
        { "backoff previous", function() rw.backoff(1, { previous = "x" }) end, { "'previous'" } },
        { "backoff unknown", function() rw.backoff(1, { foo = 1 }) end, { "'foo'" } },
        { "backoff misspelt", function() rw.backoff(1, { max_dealy = 1 }) end,
          { "backoff: unknown option 'max_dealy' (did you mean 'max_delay'?)" } },
        { "retry_delay headers", function() rw.retry_delay("x", 1) end, { "headers" } },
        { "retry_delay attempt", function() rw.retry_delay({}, "x") end, { "attempt" } },
        { "retry_delay opts", function() rw.retry_delay({}, 1, 5) end, { "options" } },
        { "retry_delay now", function() rw.retry_delay({}, 1, { now = "x" }) end, { "'now'" } },
        { "retry_delay base", function() rw.retry_delay({}, 1, { base = -1 }) end, { "'base'" } },
        { "retry_delay unknown", function() rw.retry_delay({}, 1, { foo = 1 }) end, { "'foo'" } },
        { "retry_delay misspelt", function() rw.retry_delay({}, 1, { nwo = 1 }) end,
          { "unknown option 'nwo' (did you mean 'now'?)" } },
      }
    end)
  end)

  describe("the parsers and rw.classify", function()
    it("refuse wrong argument types, naming the function and the argument", function()
      check_rows {
        { "parse_http_date s", function() rw.parse_http_date({}) end, { "'parse_http_date'", "#1" } },
        { "parse_http_date now", function() rw.parse_http_date("x", "y") end, { "'parse_http_date'", "#2" } },
        { "parse_http_date now inf", function() rw.parse_http_date("x", math.huge) end, { "#2", "now" } },
        { "parse_retry_after value", function() rw.parse_retry_after({}) end, { "'parse_retry_after'", "#1" } },
        { "parse_retry_after now", function() rw.parse_retry_after("1", {}) end, { "'parse_retry_after'", "#2" } },
        { "parse_duration", function() rw.parse_duration({}) end, { "'parse_duration'", "#1" } },
        { "parse_rfc3339", function() rw.parse_rfc3339(nil) end, { "'parse_rfc3339'", "#1" } },
        { "classify string", function() rw.classify("x") end, { "'classify'", "status" } },
        { "classify 1.5", function() rw.classify(1.5) end, { "'classify'", "status" } },
        { "classify nil", function() rw.classify() end, { "'classify'", "status" } },
      }
    end)

    it("answer nil, not an error, for a string that does not parse", function()
      for _, fn in ipairs { rw.parse_http_date, rw.parse_retry_after, rw.parse_duration, rw.parse_rfc3339 } do
        assert.is_nil(fn("\0not a value\255"))
      end
    end)
  end)

  describe("the scheduler", function()
    it("refuses wrong arguments, naming them", function()
      check_rows {
        { "run", function() rw.run(5) end, { "run", "function" } },
        { "spawn", function() rw.spawn("x") end, { "spawn", "function" } },
        { "map list", function() rw.map(5, print) end, { "map", "list" } },
        { "map fn", function() rw.map({}, 5) end, { "map", "fn" } },
        { "map options", function() rw.map({ 1 }, print, 5) end, { "map", "options" } },
        { "map concurrency", function() rw.map({ 1 }, print, { concurrency = "x" }) end, { "'concurrency'" } },
        { "map concurrency 0", function() rw.map({ 1 }, print, { concurrency = 0 }) end, { "'concurrency'" } },
        { "map unknown", function() rw.map({ 1 }, print, { foo = 1 }) end, { "'foo'" } },
        { "map misspelt", function() rw.map({ 1 }, print, { concurency = 2 }) end,
          { "map: unknown option 'concurency' (did you mean 'concurrency'?)" } },
        { "step", function() rw.step("x") end, { "step", "timeout" } },
        { "step -1", function() rw.step(-1) end, { "step", "timeout" } },
        { "step nan", function() rw.step(0 / 0) end, { "step", "timeout" } },
        { "sleep", function() rw.sleep("x") end, { "sleep", "seconds" } },
        { "sleep -1", function() rw.sleep(-1) end, { "sleep", "seconds" } },
        { "configure", function() rw.configure(5) end, { "configure", "options" } },
        { "configure sleep", function() rw.configure { sleep = 5 } end, { "'sleep'" } },
        { "configure unknown", function() rw.configure { foo = 1 } end, { "'foo'" } },
        { "configure misspelt", function() rw.configure { max_connection = 1 } end,
          { "configure: unknown option 'max_connection' (did you mean 'max_connections'?)" } },
        { "semaphore", function() rw.semaphore("x") end, { "semaphore", "size" } },
        { "semaphore 0", function() rw.semaphore(0) end, { "semaphore", "size" } },
      }
      assert.equal(0, rw.step(0))
    end)

    it("refuses rw.step from inside a task, and the task's error names it", function()
      local ok, msg = pcall(rw.run, function() rw.step(0) end)
      assert.is_false(ok)
      assert.matches("step: called from inside a task", msg)
      assert.equal(0, rw.step(0))
    end)
  end)

  describe("rw.client", function()
    local base = "http://127.0.0.1:1"

    it("refuses its own options when wrong, naming them", function()
      check_rows {
        { "not a table", function() rw.client(5) end, { "client", "options" } },
        { "base_url type", function() rw.client { base_url = 5 } end, { "'base_url'" } },
        { "base_url scheme", function() rw.client { base_url = "ftp://x" } end, { "'base_url'" } },
        { "headers", function() rw.client { base_url = base, headers = 5 } end, { "'headers'" } },
        { "routes", function() rw.client { base_url = base, routes = 5 } end, { "'routes'" } },
        { "route limiter", function() rw.client { base_url = base, routes = { ["/a"] = 5 } } end, { "route" } },
        { "cache", function() rw.client { base_url = base, cache = 5 } end, { "'cache'" } },
        { "on_event", function() rw.client { base_url = base, on_event = 5 } end, { "'on_event'" } },
        { "unknown", function() rw.client { base_url = base, foo = 1 } end, { "'foo'" } },
        { "provider unknown", function() rw.client { base_url = base, provider = "nope" } end, { "'nope'" } },
      }
    end)

    it("names 'concurrency' and 'provider' when they are of the wrong type", function()
      local concurrency = message_of(function() rw.client { base_url = base, concurrency = "x" } end)
      local provider = message_of(function() rw.client { base_url = base, provider = 5 } end)
      assert.matches("concurrency", concurrency)
      assert.matches("provider", provider)
    end)

    it("refuses a fetch default or an object option of the wrong type when it is made", function()
      local wrong = {
        timeout = "x", max_retries = "x", max_elapsed = "x", max_delay = "x", base = "x", jitter = 5,
        retry_non_idempotent = 5, on_retry = 5, delay = 5, sleep = 5, follow_redirects = 5, max_body = "x",
        verify_tls = 5, limiter = 5, circuit = 5, budget = 5, dedupe = "x",
      }
      local silent = {}
      for name, value in pairs(wrong) do
        local ok, msg = pcall(rw.client, { base_url = base, [name] = value })
        if ok then
          silent[#silent + 1] = name
        else
          assert.is_truthy(tostring(msg):find("'" .. name .. "'", 1, true), name .. ": " .. tostring(msg))
        end
      end
      table.sort(silent)
    end)

    it("refuses wrong arguments to its methods, naming them, and sends nothing", function()
      local c = rw.client { base_url = s:url(""), on_retry = false }
      check_rows {
        { "request method", function() c:request(5, "/") end, { "method" } },
        { "request path", function() c:request("GET", 5) end, { "path" } },
        { "request path without /", function() c:request("GET", "x") end, { "path" } },
        { "request options", function() c:request("GET", "/", 5) end, { "options" } },
        { "get options", function() c:get("/", 5) end, { "options" } },
        { "post query", function() c:post("/", { query = 5 }) end, { "'query'" } },
        { "put json", function() c:put("/", { json = print }) end, { "'json'" } },
        { "get timeout", function() c:get("/", { timeout = "x" }) end, { "'timeout'" } },
        { "get cost", function() c:get("/", { cost = "x" }) end, { "'cost'" } },
        { "get unknown", function() c:get("/", { foo = 1 }) end, { "'foo'" } },
        { "delete headers", function() c:delete("/", { headers = { ["X-A"] = "a\nb" } }) end, { "'X-A'" } },
      }
      assert.equal(0, #s:log())
      assert.equal(200, assert(c:get("/fine")).status)
      assert.equal(0, c:stats().in_flight)
      assert.equal(0, rw.step(0))
    end)
  end)

  describe("rw.policy, rw.circuit, rw.retry_budget and rw.limiters", function()
    it("refuse wrong options and arguments, naming them", function()
      local breaker = rw.circuit {}
      local both = rw.limiters { rw.bucket { capacity = 2, rate = 1 } }
      check_rows {
        { "policy", function() rw.policy(5) end, { "policy", "table" } },
        { "policy hook", function() rw.policy { classify = 5 } end, { "'classify'" } },
        { "policy delay", function() rw.policy { delay = "x" } end, { "'delay'" } },
        { "policy observe", function() rw.policy { observe = {} } end, { "'observe'" } },
        { "policy prepare", function() rw.policy { prepare = true } end, { "'prepare'" } },
        { "policy replayable", function() rw.policy { replayable = 1 } end, { "'replayable'" } },
        { "policy name", function() rw.policy { name = 5 } end, { "'name'" } },
        { "policy unknown", function() rw.policy { foo = print } end, { "'foo'" } },
        { "policy.chain member", function() rw.policy.chain(5) end, { "policy" } },
        { "circuit", function() rw.circuit(5) end, { "circuit", "options" } },
        { "circuit failures", function() rw.circuit { failures = "x" } end, { "'failures'" } },
        { "circuit failures 0", function() rw.circuit { failures = 0 } end, { "'failures'" } },
        { "circuit cooldown", function() rw.circuit { cooldown = "x" } end, { "'cooldown'" } },
        { "circuit on_change", function() rw.circuit { on_change = 5 } end, { "'on_change'" } },
        { "circuit unknown", function() rw.circuit { foo = 1 } end, { "'foo'" } },
        { "circuit:allow", function() breaker:allow(5) end, { "allow", "origin" } },
        { "circuit:record origin", function() breaker:record(5, "success") end, { "record", "origin" } },
        { "circuit:record outcome", function() breaker:record("http://a:80", "meh") end, { "record", "outcome" } },
        { "circuit:state", function() breaker:state(5) end, { "state", "origin" } },
        { "retry_budget", function() rw.retry_budget(5) end, { "retry_budget", "options" } },
        { "retry_budget ratio", function() rw.retry_budget { ratio = "x" } end, { "'ratio'" } },
        { "retry_budget min_per_second", function() rw.retry_budget { min_per_second = "x" } end,
          { "'min_per_second'" } },
        { "retry_budget window", function() rw.retry_budget { window = "x" } end, { "'window'" } },
        { "retry_budget unknown", function() rw.retry_budget { foo = 1 } end, { "'foo'" } },
        { "limiters", function() rw.limiters(5) end, { "limiters" } },
        { "limiters member", function() rw.limiters { 5 } end, { "member #1" } },
        { "limiters cost", function() rw.limiters { cost = 5 } end, { "'cost'" } },
        { "limiters unknown", function() rw.limiters { foo = 1 } end, { "'foo'" } },
        { "limiters:acquire n", function() both:acquire("x") end, { "acquire", "token count" } },
        { "limiters:acquire sleep", function() both:acquire(1, 5) end, { "acquire", "sleep" } },
        { "limiters:take", function() both:take("x") end, { "take", "token count" } },
        { "limiters:wait_time", function() both:wait_time(-1) end, { "wait_time", "token count" } },
        { "limiters:refund", function() both:refund({}) end, { "refund", "token count" } },
        { "limiters:sync", function() both:sync("x") end, { "'sync'", "#1" } },
      }
      assert.equal("closed", breaker:state("http://a:80"))
      assert.equal(0, both:wait_time(1))
    end)
  end)

  -- A number given as a string is refused everywhere (Lua would turn "8"
  -- into 8 in arithmetic, but the options are checked, not coerced), and
  -- the error names its type: `got 8` reads as if 8 had been refused.
  describe("a number given as a string", function()
    it("is refused by every option and argument that takes a number, the error naming its type", function()
      local base = "http://127.0.0.1:1"
      local b = rw.bucket { capacity = 2, rate = 1 }
      local both = rw.limiters { rw.bucket { capacity = 2, rate = 1 } }
      local rows = {
        { "bucket capacity", function() rw.bucket { capacity = "1", rate = 1 } end, "'capacity'" },
        { "bucket rate", function() rw.bucket { capacity = 1, rate = "1" } end, "'rate'" },
        { "bucket sync_horizon", function() rw.bucket { capacity = 1, rate = 1, sync_horizon = "1" } end,
          "'sync_horizon'" },
        { "bucket:take", function() b:take("1") end, "'take'" },
        { "bucket:reserve", function() b:reserve("1") end, "'reserve'" },
        { "bucket:wait_time", function() b:wait_time("1") end, "'wait_time'" },
        { "bucket:refund", function() b:refund("1") end, "'refund'" },
        { "bucket:sync", function() b:sync("1") end, "'sync'" },
        { "bucket:sync reset_in", function() b:sync(1, "1") end, "'sync'" },
        { "bucket:set_rate", function() b:set_rate("1") end, "'set_rate'" },
        { "bucket:acquire", function() b:acquire("1") end, "'acquire'" },
        { "bucket:acquire max_wait", function() b:acquire(1, nil, "1") end, "max_wait" },
        { "client concurrency", function() rw.client { base_url = base, concurrency = "1" } end, "'concurrency'" },
        { "client timeout", function() rw.client { base_url = base, timeout = "1" } end, "'timeout'" },
        { "fetch timeout", function() rw.fetch(URL, { timeout = "1" }) end, "'timeout'" },
        { "map concurrency", function() rw.map({ 1 }, print, { concurrency = "1" }) end, "'concurrency'" },
        { "adaptive rate", function() rw.adaptive { rate = "1" } end, "'rate'" },
        { "adaptive beta", function() rw.adaptive { beta = "1" } end, "'beta'" },
        { "circuit failures", function() rw.circuit { failures = "1" } end, "'failures'" },
        { "circuit cooldown", function() rw.circuit { cooldown = "1" } end, "'cooldown'" },
        { "retry_budget ratio", function() rw.retry_budget { ratio = "1" } end, "'ratio'" },
        { "backoff base", function() rw.backoff(1, { base = "1" }) end, "'base'" },
        { "backoff attempt", function() rw.backoff("1") end, "attempt" },
        { "retry_delay now", function() rw.retry_delay({}, 1, { now = "1" }) end, "'now'" },
        { "configure", function() rw.configure { max_connections = "1" } end, "'max_connections'" },
        { "semaphore", function() rw.semaphore("1") end, "size" },
        { "semaphore:acquire", function() rw.semaphore(1):acquire("1") end, "timeout" },
        { "sleep", function() rw.sleep("1") end, "seconds" },
        { "step", function() rw.step("1") end, "timeout" },
        { "step budget", function() rw.step(0, "1") end, "budget" },
        { "limiters:acquire", function() both:acquire("1") end, "token count" },
        { "limiters:acquire max_wait", function() both:acquire(1, nil, "1") end, "max_wait" },
        { "limiters:take", function() both:take("1") end, "token count" },
        { "redis_bucket capacity", function()
          rw.redis_bucket { redis = "redis://127.0.0.1:1", key = "k", capacity = "1", rate = 1 }
        end, "'capacity'" },
      }
      for _, row in ipairs(rows) do
        assert_names(row[2], { row[3], 'string "1"' }, row[1])
      end
      assert.equal(2, b:tokens()) -- none of that took anything
    end)

    it("shows a long string cut short, and a table by its type only", function()
      local msg = message_of(function() rw.fetch(URL, { timeout = string.rep("9", 100) }) end)
      assert.matches('string "' .. string.rep("9", 40) .. '"... (100 bytes)', msg, 1, true)
      msg = message_of(function() rw.client { base_url = "http://127.0.0.1:1", concurrency = {} } end)
      assert.matches("(got table)", msg, 1, true)
    end)

    it("never shows a secret given in the wrong type", function()
      local msg = message_of(function() rw.fetch(URL, { client_key_password = 271828 }) end)
      assert.matches("'client_key_password'", msg, 1, true)
      assert.not_matches("271828", msg, 1, true)
      for _, call in ipairs {
        function() rw.fetch(URL, { headers = "Bearer sk-secret" }) end,
        function() rw.fetch(URL, { proxy = { "http://u:sk-secret@proxy:1" } }) end,
        function() rw.client { base_url = URL, headers = "Bearer sk-secret" } end,
        -- JSON already encoded, a query string, a header line: each may carry a key
        function() rw.fetch(URL, { json = '{"api_key": "sk-secret"}' }) end,
        function() rw.fetch(URL, { query = "api_key=sk-secret" }) end,
        function() rw.fetch(URL, { secret_headers = "Authorization: Bearer sk-secret" }) end,
        function() rw.fetch(URL, { method = "POST", body = { token = "sk-secret" } }) end,
      } do
        msg = message_of(call)
        assert.not_matches("sk-secret", msg, 1, true)
      end
    end)
  end)

  describe("errors are reported at the caller's line", function()
    it("points misuse at the line of the call, not inside ratewise", function()
      local calls = {
        { "fetch", function() rw.fetch(URL, { timeout = "x" }) end },
        { "backoff attempt", function() rw.backoff("x") end },
        { "backoff options", function() rw.backoff(1, 5) end },
        { "backoff base", function() rw.backoff(1, { base = "x" }) end },
        { "retry_delay options", function() rw.retry_delay({}, 1, 5) end },
        { "retry_delay unknown", function() rw.retry_delay({}, 1, { foo = 1 }) end },
        { "map", function() rw.map(5, print) end },
        { "policy.chain", function() rw.policy.chain(5) end },
        { "limiters member", function() rw.limiters { 5 } end },
        { "client concurrency", function() rw.client { base_url = URL, concurrency = "x" } end },
        { "client query", function() rw.client({ base_url = URL }):get("/", { query = 5 }) end },
        { "client timeout", function() rw.client({ base_url = URL }):get("/", { timeout = "x" }) end },
        { "bucket acquire", function() rw.bucket({ capacity = 1, rate = 1 }):acquire("x") end },
      }
      local elsewhere = {}
      for _, call in ipairs(calls) do
        local msg = message_of(call[2], call[1])
        if msg:sub(1, #THIS_FILE + 1) ~= THIS_FILE .. ":" then
          elsewhere[#elsewhere + 1] = call[1] .. " -> " .. (msg:match("^([^:]*:%d+):") or "no position")
        end
      end
    end)
  end)

  describe("callbacks that fail", function()
    -- The objects a failing fetch used, checked for sanity after each row.
    local bucket, breaker, budget

    before_each(function()
      bucket = rw.bucket { capacity = 1000, rate = 1000 }
      breaker = rw.circuit { failures = 3 }
      budget = rw.retry_budget {}
    end)

    local function fetch_options(extra)
      local o = { limiter = bucket, circuit = breaker, budget = budget, on_retry = false, sleep = no_sleep,
        max_elapsed = 5, timeout = 2 }
      for k, v in pairs(extra) do o[k] = v end
      return o
    end

    -- After a callback failed: nothing running, no stray task, and the same
    -- limiter, circuit, budget and engine serve a normal fetch.
    local function assert_consistent()
      assert.equal(0, scheduler.engine():running(), "a transfer was left running")
      assert.equal(0, rw.step(0), "tasks were left behind")
      assert.equal(0, bucket:wait_time(1))
      assert.is_true(breaker:allow("http://127.0.0.1:" .. s.port))
      local res = assert(rw.fetch(s:url("/after"), { limiter = bucket, circuit = breaker, budget = budget,
        on_retry = false, max_retries = 0 }))
      assert.equal(200, res.status)
      assert.equal("closed", breaker:state("http://127.0.0.1:" .. s.port))
    end

    local function raise() error("callback-boom") end
    local function yield() coroutine.yield("ratewise.sleep", 0) end
    -- The interpreter's own words for a yield from the main thread (5.4:
    -- "attempt to yield from outside a coroutine"; 5.1 and LuaJIT speak of
    -- a C-call boundary).
    local YIELD = select(2, pcall(coroutine.yield))

    -- { label, method, fetch options, names the error must carry }
    local rows = {
      { "on_retry raises", "GET", { on_retry = raise }, { "'on_retry'", "callback-boom" } },
      { "on_retry yields", "GET", { on_retry = yield }, { "'on_retry'", YIELD } },
      { "delay raises", "GET", { delay = raise }, { "'delay'", "callback-boom" } },
      { "delay answers a string", "GET", { delay = function() return "soon" end }, { "'delay'", "soon" } },
      { "delay answers a negative number", "GET", { delay = function() return -1 end }, { "'delay'" } },
      { "delay answers NaN", "GET", { delay = function() return 0 / 0 end }, { "'delay'" } },
      { "delay yields", "GET", { delay = yield }, { "'delay'", YIELD } },
      { "on_event raises", "GET", { on_event = raise }, { "'on_event'", "callback-boom" } },
      { "on_event yields", "GET", { on_event = yield }, { "'on_event'", YIELD } },
      { "policy classify raises", "GET", { policy = rw.policy { classify = raise } }, { "classify", "callback-boom" } },
      { "policy classify answers 42", "GET", { policy = rw.policy { classify = function() return 42 end } },
        { "classify", "42" } },
      { "policy classify yields", "GET", { policy = rw.policy { classify = yield } }, { "classify", YIELD } },
      { "policy delay raises", "GET", { policy = rw.policy { delay = raise } }, { "delay", "callback-boom" } },
      { "policy delay answers a string", "GET", { policy = rw.policy { delay = function() return "x" end } },
        { "delay", "must return" } },
      { "policy delay yields", "GET", { policy = rw.policy { delay = yield } }, { "delay", YIELD } },
      { "policy observe raises", "GET", { policy = rw.policy { observe = raise } }, { "observe", "callback-boom" } },
      { "policy observe yields", "GET", { policy = rw.policy { observe = yield } }, { "observe", YIELD } },
      { "policy prepare raises", "GET", { policy = rw.policy { prepare = raise } }, { "prepare", "callback-boom" } },
      { "policy prepare sets a bad key", "GET",
        { policy = rw.policy { prepare = function(r) r.idempotency_key = 5 end } }, { "prepare", "idempotency_key" } },
      { "policy prepare yields", "GET", { policy = rw.policy { prepare = yield } }, { "prepare", YIELD } },
      { "policy replayable raises", "POST", { policy = rw.policy { replayable = raise } },
        { "replayable", "callback-boom" } },
      { "policy replayable yields", "POST", { policy = rw.policy { replayable = yield } }, { "replayable", YIELD } },
    }

    for i, row in ipairs(rows) do
      local label, method, extra, names = row[1], row[2], row[3], row[4]
      local path = "/cb-" .. i -- a path per row, as below
      it("reports it clearly when " .. label .. ", and stays consistent", function()
        s:script(path, { { status = 503 }, { status = 200 } })
        local o = fetch_options(extra)
        o.method = method
        assert_names(function() rw.fetch(s:url(path), o) end, names, label)
        assert.is_true(#s:log(path) <= 1, "the call went on after its callback failed")
        assert_consistent()
      end)
    end

    it("ignores what on_retry, observe and prepare answer", function()
      s:script("/cb", { { status = 503 }, { status = 200 } })
      local weird = function() return {}, "x", 42 end
      local res = assert(rw.fetch(s:url("/cb"), fetch_options {
        on_retry = weird, policy = rw.policy { observe = weird, prepare = weird },
      }))
      assert.equal(200, res.status)
      assert_consistent()
    end)

    it("reports a prepare that leaves headers of the wrong type, naming prepare", function()
      s:script("/cb", { { status = 200 } })
      local msg = message_of(function()
        rw.fetch(s:url("/cb"), fetch_options { policy = rw.policy { prepare = function(r) r.headers = 5 end } })
      end)
      assert.equal(0, #s:log("/cb"))
      assert_consistent()
      assert.matches("prepare", msg)
    end)

    -- The per-call sleep and the objects fetch drives are callbacks too.
    local raw_rows = {
      { "sleep raises", { sleep = raise }, "'sleep'" },
      { "sleep yields", { sleep = yield }, "'sleep'" },
      { "a limiter's acquire raises", { limiter = { acquire = raise } }, "'limiter'" },
      { "a circuit's allow raises", { circuit = { allow = raise, record = no_sleep } }, "'circuit'" },
      { "a circuit's record raises", { circuit = { allow = function() return true end, record = raise } },
        "'circuit'" },
      { "a budget's allow_retry raises", { budget = { request = no_sleep, allow_retry = raise } }, "'budget'" },
    }
    for i, row in ipairs(raw_rows) do
      local label, extra, name = row[1], row[2], row[3]
      -- A path per row: an aborted request of the row before may still reach
      -- the server after the reset.
      local path = "/raw-cb-" .. i
      it("names the option when " .. label .. ", and stays consistent", function()
        s:script(path, { { status = 503 }, { status = 200 } })
        local msg = message_of(function() rw.fetch(s:url(path), fetch_options(extra)) end, label)
        assert.is_true(#s:log(path) <= 1, "the call went on after its callback failed")
        assert_consistent()
        assert.is_truthy(msg:find(name, 1, true), msg)
      end)
    end

    it("gives back a bucket's reservation when the sleep it waits through raises", function()
      local b = rw.bucket { capacity = 1, rate = 2 }
      assert.is_true(b:take())
      message_of(function()
        rw.fetch(s:url("/cb"), { limiter = b, sleep = raise, on_retry = false })
      end)
      assert.equal(0, #s:log("/cb"))
      -- The failed wait holds nothing: the balance is what refilling gives.
      assert.is_true(b:tokens() > -0.1, "the reservation was kept: " .. b:tokens())
      assert_consistent()
    end)

    it("lets a failing callback inside a task end rw.run, naming it, with no task left", function()
      s:script("/cb", { { status = 503 }, { status = 200 } })
      local ok, msg = pcall(rw.run, function()
        rw.spawn(function() rw.sleep(0.01) end)
        return rw.fetch(s:url("/cb"), fetch_options { on_retry = raise })
      end)
      assert.is_false(ok)
      assert.matches("'on_retry' callback raised an error: .*callback%-boom", msg)
      assert_consistent()
    end)

    it("lets on_retry yield inside a task, where waiting is allowed", function()
      s:script("/cb", { { status = 503 }, { status = 200 } })
      local res = rw.run(function()
        return rw.fetch(s:url("/cb"), fetch_options { on_retry = function() coroutine.yield() end })
      end)
      assert.equal(200, res.status)
      assert_consistent()
    end)
  end)
end)

-- A limiter of one's own that answers a wait that can never end (NaN, or
-- infinity) is named in an error instead of making acquire spin. Run in a
-- process of its own under `timeout`, so that a regression cannot hang the
-- suite.
describe("misuse: a limiter whose wait is NaN or infinite", function()
  local subprocess = require "spec.support.subprocess"

  local function outcome(setup_code)
    local out, code = subprocess.run_lua('local rw = require "ratewise"\n' .. setup_code .. [[

      local t0 = rw.now()
      local ok, err = pcall(function() return both:acquire() end)
      io.write(tostring(ok), " ", string.format("%.3f", rw.now() - t0), " ", tostring(err))
    ]])
    assert.are_not.equal(124, code, "still waiting after 5 s (spinning or hanging)")
    assert.equal(0, code, out)
    local ok, took, err = out:match("^(%a+) ([%d.]+) (.*)$")
    assert.equal("false", ok, out)
    assert.is_true(tonumber(took) < 1, out)
    return err
  end

  -- A member whose wait_time and take both say `wait`.
  local function broken(wait)
    return "local broken = { wait_time = function() return " .. wait .. " end,\n"
      .. "  take = function() return false, " .. wait .. " end, refund = function() end }\n"
  end

  it("names the member whose wait_time answered NaN", function()
    local err = outcome(broken("0/0") .. "both = rw.limiters { rw.bucket { capacity = 1, rate = 1 }, broken }")
    assert.matches("limiters: member #2 answered a wait of nan", err, 1, true)
    assert.matches("finite number of seconds", err, 1, true)
  end)

  it("names the cost member whose wait_time answered infinity", function()
    local err = outcome(broken("math.huge") .. "both = rw.limiters { cost = broken }")
    assert.matches("limiters: cost member #1 answered a wait of inf", err, 1, true)
  end)

  it("names a member whose take fails with a NaN wait after wait_time said 0, and gives back what was taken", function()
    local err = outcome([[
      local b = rw.bucket { capacity = 1, rate = 1 }
      local broken = { wait_time = function() return 0 end, take = function() return false, 0/0 end,
        refund = function() end }
      both = rw.limiters { b, broken }
      local acquire = both.acquire
      both.acquire = function(self) local ok, e = pcall(acquire, self); assert(b:tokens() > 0.99); error(e, 0) end
    ]])
    assert.matches("limiters: member #2 answered a wait of nan", err, 1, true)
  end)
end)
