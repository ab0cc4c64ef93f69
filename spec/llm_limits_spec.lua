-- Limits per named limit through fetch (issue 41: requests, tokens, input
-- and output tokens per minute), against the test server's mock of
-- OpenAI's and Anthropic's rate limits (spec/support/llm_mock.py): a cost
-- per limit (the option, or the provider's estimate), corrected once the
-- answer is whole as each provider corrects, given back when the provider
-- did not count the attempt, and synced from the remaining-token headers.
-- Each assertion is on what the server counted.
local rw = require "ratewise"
local server = require "spec.support.server"

-- A chat request of `chars` characters of prompt: `fields` (a table of
-- the caller's, made for it) with the model and the message.
local function chat(model, chars, fields)
  local req = fields or {}
  req.model, req.messages = model, { { role = "user", content = ("a"):rep(chars) } }
  return req
end

local OPENAI, ANTHROPIC = "/v1/chat/completions", "/v1/messages"

-- A bucket of `hold` seconds of a per-minute limit, as the mock keeps it.
local function per_minute(limit, hold)
  return rw.bucket { capacity = limit / 60 * hold, rate = limit / 60, slow_down = false }
end

-- A bucket the size of the server's (`hold` seconds of a per-minute
-- limit) that refills so slowly that what it took can be read off it:
-- the server's, which refills faster, says no less is left.
local function meter(limit, hold)
  local capacity = limit / 60 * hold
  return rw.bucket { capacity = capacity, rate = capacity / 36000, slow_down = false }
end

-- What a limit's bucket has taken since it was full.
local function used(bucket)
  return bucket:capacity() - bucket:tokens()
end

local function post(s, path, req, extra)
  local opts = { method = "POST", json = req, on_retry = false, max_retries = 0 }
  for k, v in pairs(extra or {}) do opts[k] = v end
  local res, err = rw.fetch(s:url(path), opts)
  return res, err
end

describe("limits per named limit through fetch", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("with OpenAI's rules", function()
    before_each(function()
      s:llm(OPENAI, { provider = "openai", models = { m = { rpm = 600, tpm = 600000 } }, use_min = 0.5,
        use_max = 0.5 })
    end)

    it("takes the provider's estimate of each limit, as the server counts it, and never gives back", function()
      local requests, tokens = meter(600, 60), meter(600000, 60)
      local limiter = rw.limiters { requests = requests, tokens = tokens }
      local res = assert(post(s, OPENAI, chat("m", 402, { max_tokens = 100, n = 2 }),
        { limiter = limiter, policy = "openai" }))
      assert.equal(200, res.status)
      local counted = s:llm_counts(OPENAI).m.counted.tokens
      assert.equal((101 + 100) * 2, counted)
      assert.near(counted, used(tokens), 1) -- the unused half is not given back: OpenAI keeps it
      assert.near(1, used(requests), 0.01)
      -- max_completion_tokens, and a model's default when neither is given
      post(s, OPENAI, chat("m", 40, { max_completion_tokens = 50 }), { limiter = limiter, policy = "openai" })
      post(s, OPENAI, chat("m", 40), { limiter = limiter, policy = "openai" })
      counted = s:llm_counts(OPENAI).m.counted.tokens
      assert.equal(402 + 60 + 4106, counted)
      assert.near(counted, used(tokens), 1)
    end)

    it("takes the cost option as a table or a function of the request, over the provider's", function()
      -- (the server's limit is far above the client's, whose buckets its headers then leave as they are)
      s:llm(OPENAI, { provider = "openai", models = { m = { rpm = 60000, tpm = 60000000 } } })
      local requests, tokens = meter(600, 60), meter(600000, 60)
      local limiter = rw.limiters { requests = requests, tokens = tokens }
      post(s, OPENAI, chat("m", 40), { limiter = limiter, policy = "openai", cost = { requests = 1, tokens = 77 } })
      assert.near(77, used(tokens), 1)
      local seen
      post(s, OPENAI, chat("m", 40, { max_tokens = 10 }), { limiter = limiter, policy = "openai",
        cost = function(request)
          seen = request
          return { requests = 2, tokens = #request.json.messages[1].content }
        end })
      assert.near(117, used(tokens), 1)
      assert.near(3, used(requests), 0.01)
      assert.equal("POST", seen.method)
      assert.equal(s:url(OPENAI), seen.url)
      assert.equal(10, seen.json.max_tokens)
      -- a body given as JSON text is decoded for it
      post(s, OPENAI, nil, { limiter = limiter, body = '{"model": "m", "messages": [], "max_tokens": 5}',
        cost = function(request) return { tokens = request.json.max_tokens } end })
      assert.near(122, used(tokens), 1)
      -- a number for a limiter without named limits, as before
      local plain = meter(600000, 60)
      post(s, OPENAI, chat("m", 40), { limiter = plain, cost = function() return 33 end })
      assert.near(33, used(plain), 1)
    end)

    it("raises for a cost per limit given to a limiter without named limits, or a bad cost callback", function()
      local plain = per_minute(600, 60)
      assert.error_matches(function()
        rw.fetch(s:url(OPENAI), { json = chat("m", 4), limiter = plain, cost = { tokens = 5 } })
      end, "option 'cost' is a table (a cost per limit), which only a limiter with named limits takes", nil, true)
      local named = rw.limiters { requests = per_minute(600, 60), tokens = per_minute(6000, 1) }
      assert.error_matches(function()
        rw.fetch(s:url(OPENAI), { json = chat("m", 4), limiter = named, cost = function() return "many" end })
      end, "the 'cost' callback must answer a positive number or a table")
      assert.equal(0, #s:log(OPENAI))
    end)

    it("sends a request whose estimate is more than a limit's bucket holds, the rest taken as debt", function()
      -- (the bucket holds a second of 6,000 a minute: 100 tokens; max_tokens 500)
      local tokens = per_minute(6000, 1)
      local named = rw.limiters { requests = per_minute(600, 60), tokens = tokens }
      local res = assert(post(s, OPENAI, chat("m", 40, { max_tokens = 500 }), { limiter = named, policy = "openai" }))
      assert.equal(200, res.status)
      assert.near(-410, tokens:tokens(), 5) -- 510 taken of 100: OpenAI never gives back
      assert.equal(1, #s:log(OPENAI))
    end)

    it("lowers the tokens limit to what the server says is left", function()
      -- the server's bucket holds 1 s of its limit; the client's thinks a minute
      s:llm(OPENAI, { provider = "openai", models = { m = { rpm = 600, tpm = 60000 } }, hold = 1 })
      local tokens = per_minute(60000, 60)
      local limiter = rw.limiters { requests = per_minute(600, 60), tokens = tokens }
      local res = assert(post(s, OPENAI, chat("m", 400, { max_tokens = 700 }), { limiter = limiter,
        policy = "openai" }))
      local remaining = tonumber(res.headers["x-ratelimit-remaining-tokens"])
      assert.is_true(remaining <= 210, tostring(remaining))
      assert.is_true(tokens:tokens() <= remaining + 5, tostring(tokens:tokens()))
    end)
  end)

  describe("with Anthropic's rules", function()
    local LIMITS = { rpm = 600, itpm = 600000, otpm = 600000 }

    local function limits(hold)
      local b = { requests = meter(LIMITS.rpm, hold), input_tokens = meter(LIMITS.itpm, hold),
        output_tokens = meter(LIMITS.otpm, hold) }
      return rw.limiters(b), b
    end

    it("settles from the answer's usage: the unused output is given back, the input as the server counted", function()
      s:llm(ANTHROPIC, { provider = "anthropic", models = { m = LIMITS }, use_min = 0.25, use_max = 0.25,
        chars_per_token = 5 })
      local limiter, b = limits(60)
      local res = assert(post(s, ANTHROPIC, chat("m", 300, { max_tokens = 400 }), { limiter = limiter,
        policy = "anthropic" }))
      assert.equal(200, res.status)
      local counted = s:llm_counts(ANTHROPIC).m.counted
      assert.same({ requests = 1, input_tokens = 60, output_tokens = 100 }, counted)
      assert.near(100, used(b.output_tokens), 1) -- 400 taken, 300 given back
      assert.near(60, used(b.input_tokens), 1) -- 75 estimated (characters / 4), 60 counted
      assert.near(1, used(b.requests), 0.01)
      assert.same({ input_tokens = 60, output_tokens = 100 }, res:json().usage) -- the body is the caller's still
    end)

    it("works through a client with the provider, with no cost written by hand", function()
      s:llm(ANTHROPIC, { provider = "anthropic", models = { m = LIMITS }, use_min = 0.5, use_max = 0.5 })
      local limiter, b = limits(60)
      local client = rw.client { base_url = s:url(""), provider = "anthropic", limiter = limiter, on_retry = false }
      local res = assert(client:post(ANTHROPIC, { json = chat("m", 400, { max_tokens = 300 }) }))
      assert.equal(200, res.status)
      assert.same({ requests = 1, input_tokens = 100, output_tokens = 150 }, s:llm_counts(ANTHROPIC).m.counted)
      assert.near(150, used(b.output_tokens), 1)
      assert.near(100, used(b.input_tokens), 1)
    end)

    it("works through a client's route with a limiter of its own: the route's takes 1, the client's the cost",
      function()
      s:llm(ANTHROPIC, { provider = "anthropic", models = { m = LIMITS }, use_min = 0.5, use_max = 0.5 })
      local limiter, b = limits(60)
      local route = meter(600, 60)
      local client = rw.client { base_url = s:url(""), provider = "anthropic", limiter = limiter, on_retry = false,
        routes = { ["/v1/"] = route } }
      local res = assert(client:post(ANTHROPIC, { json = chat("m", 400, { max_tokens = 300 }) }))
      assert.equal(200, res.status)
      assert.same({ requests = 1, input_tokens = 100, output_tokens = 150 }, s:llm_counts(ANTHROPIC).m.counted)
      assert.near(1, used(route), 0.01)
      assert.near(1, used(b.requests), 0.01)
      assert.near(150, used(b.output_tokens), 1) -- 300 taken, 150 given back
      assert.near(100, used(b.input_tokens), 1)
    end)

    it("gives back what a refused attempt took, and what a request never sent took", function()
      -- the server refuses on output tokens, which the client's limiter does not meter
      s:llm(ANTHROPIC, { provider = "anthropic", models = { m = { rpm = 600, itpm = 600000, otpm = 1000 } },
        use_min = 1, use_max = 1 })
      local b = { requests = meter(600, 60), input_tokens = meter(600000, 60) }
      local limiter = rw.limiters(b)
      assert.equal(200, assert(post(s, ANTHROPIC, chat("m", 40, { max_tokens = 900 }), { limiter = limiter,
        policy = "anthropic" })).status)
      local _, err = post(s, ANTHROPIC, chat("m", 40, { max_tokens = 900 }), { limiter = limiter,
        policy = "anthropic" })
      assert.equal(429, err.response.status)
      local counts = s:llm_counts(ANTHROPIC).m
      assert.same({ 1, 1 }, { counts.ok, counts.limited })
      assert.same({ requests = 1, input_tokens = 10, output_tokens = 900 }, counts.counted)
      assert.near(10, used(b.input_tokens), 1)
      assert.near(1, used(b.requests), 0.01)
      -- nothing listens there: the request is never sent
      _, err = rw.fetch("http://127.0.0.1:1/v1/messages", { json = chat("m", 40, { max_tokens = 900 }),
        limiter = limiter, policy = "anthropic", on_retry = false, max_retries = 0 })
      assert.is_nil(err.response)
      assert.near(10, used(b.input_tokens), 1)
      assert.near(1, used(b.requests), 0.01)
    end)

    it("lowers the input and output token limits to what the server says is left", function()
      s:llm(ANTHROPIC, { provider = "anthropic", models = { m = { rpm = 600, itpm = 60000, otpm = 60000 } },
        hold = 1, use_min = 1, use_max = 1 })
      local limiter, b = limits(60)
      local res = assert(post(s, ANTHROPIC, chat("m", 2000, { max_tokens = 600 }), { limiter = limiter,
        policy = "anthropic" }))
      local input_left = tonumber(res.headers["anthropic-ratelimit-input-tokens-remaining"])
      local output_left = tonumber(res.headers["anthropic-ratelimit-output-tokens-remaining"])
      assert.is_true(input_left <= 510 and output_left <= 410, input_left .. " " .. output_left)
      assert.is_true(b.input_tokens:tokens() <= input_left + 5, tostring(b.input_tokens:tokens()))
      assert.is_true(b.output_tokens:tokens() <= output_left + 5, tostring(b.output_tokens:tokens()))
    end)
  end)

  describe("settles a stream handed to the caller", function()
    local LIMITS = { rpm = 600, itpm = 600000, otpm = 600000 }

    -- (buckets of 1,000 tokens, which refill a token in 36 s)
    local function limits()
      local b = { requests = meter(LIMITS.rpm, 60), input_tokens = meter(60000, 1),
        output_tokens = meter(60000, 1) }
      return rw.limiters(b), b
    end

    -- The server's counts of model m, once its count of output tokens is
    -- below `below` (a stream the client leaves is settled when the
    -- server sees it gone).
    local function counted_below(path, name, below)
      local deadline, counted = rw.now() + 3
      repeat
        counted = s:llm_counts(path).m.counted
        if counted[name] < below then break end
        rw.sleep(0.02)
      until rw.now() > deadline
      return counted
    end

    -- Reads events of res until `stop` says so (nil: to the end), the
    -- iterator called by hand (Lua 5.1); answers the events' names.
    local function read_events(res, stop)
      local next_event, names = res:events(), {}
      while true do
        local event = next_event()
        if not event then break end
        names[#names + 1] = event.event
        if stop and stop(event, names) then break end
      end
      return names
    end

    local function stream_post(path, req, limiter, provider, extra)
      req.stream = true
      local opts = { limiter = limiter, policy = provider, stream = true }
      for k, v in pairs(extra or {}) do opts[k] = v end
      local res = assert(post(s, path, req, opts))
      assert.equal(200, res.status)
      return res
    end

    it("when it ends, from Anthropic's message_start and message_delta, once", function()
      -- (written at 1,000 tokens a second: the answer is not whole when its
      -- headers are, which a short stream at once may be, settled as it comes)
      s:llm(ANTHROPIC, { provider = "anthropic", models = { m = LIMITS }, use_min = 0.3, use_max = 0.3,
        chars_per_token = 5, speed = 1000 })
      local limiter, b = limits()
      local res = stream_post(ANTHROPIC, chat("m", 300, { max_tokens = 400 }), limiter, "anthropic")
      -- nothing is given back before the answer says what it used
      assert.near(400, used(b.output_tokens), 1)
      local names = read_events(res)
      assert.equal("message_stop", names[#names])
      local counted = s:llm_counts(ANTHROPIC).m.counted
      assert.same({ requests = 1, input_tokens = 60, output_tokens = 120 }, counted)
      assert.near(120, used(b.output_tokens), 1) -- 400 taken, 280 given back
      assert.near(60, used(b.input_tokens), 1) -- 75 estimated, 60 counted
      assert.near(1, used(b.requests), 0.01)
      res:close() -- (settled once: a close after the end gives nothing back again)
      assert.near(120, used(b.output_tokens), 1)
      assert.near(60, used(b.input_tokens), 1)
    end)

    it("read by chunks or whole, as by events", function()
      s:llm(ANTHROPIC, { provider = "anthropic", models = { m = LIMITS }, use_min = 0.3, use_max = 0.3 })
      local limiter, b = limits()
      local res = stream_post(ANTHROPIC, chat("m", 400, { max_tokens = 200 }), limiter, "anthropic")
      repeat local chunk = res:read() until chunk == nil
      assert.near(60, used(b.output_tokens), 1)
      res = stream_post(ANTHROPIC, chat("m", 400, { max_tokens = 300 }), limiter, "anthropic")
      assert.truthy(res:json() == nil) -- (an event stream is no JSON document)
      local counted = s:llm_counts(ANTHROPIC).m.counted
      assert.same({ requests = 2, input_tokens = 200, output_tokens = 60 + 90 }, counted)
      assert.near(150, used(b.output_tokens), 1)
      assert.near(200, used(b.input_tokens), 1)
    end)

    it("closed early, from the text it received: the output the server counted", function()
      -- 400 tokens in 8 events of 50, 50 ms apart, each token 4 characters of text
      s:llm(ANTHROPIC, { provider = "anthropic", models = { m = LIMITS }, use_min = 1, use_max = 1,
        speed = 1000, output_chars = 4 })
      local limiter, b = limits()
      local res = stream_post(ANTHROPIC, chat("m", 40, { max_tokens = 400 }), limiter, "anthropic")
      local deltas = 0
      read_events(res, function(event)
        if event.event == "content_block_delta" then deltas = deltas + 1 end
        return deltas == 2
      end)
      res:close()
      local counted = counted_below(ANTHROPIC, "output_tokens", 400)
      assert.equal(100, counted.output_tokens)
      -- (message_start's one output token, and 400 characters at 4 a token)
      assert.near(counted.output_tokens, used(b.output_tokens), 2)
      assert.near(10, used(b.input_tokens), 1)
      res:close()
      assert.near(counted.output_tokens, used(b.output_tokens), 2)
    end)

    it("broken off, from the text it received", function()
      -- an event every 0.25 s, a silence of 0.1 s breaks the stream
      s:llm(ANTHROPIC, { provider = "anthropic", models = { m = LIMITS }, use_min = 1, use_max = 1,
        speed = 200, output_chars = 4 })
      local limiter, b = limits()
      local res = stream_post(ANTHROPIC, chat("m", 40, { max_tokens = 400 }), limiter, "anthropic",
        { idle_timeout = 0.1 })
      local ok, err = pcall(read_events, res)
      assert.is_false(ok)
      assert.equal("stream", err.kind)
      local counted = counted_below(ANTHROPIC, "output_tokens", 400)
      assert.is_true(counted.output_tokens < 400, tostring(counted.output_tokens))
      assert.near(counted.output_tokens, used(b.output_tokens), 2)
    end)

    it("never for OpenAI, which does not correct: the admission's count stays", function()
      s:llm(OPENAI, { provider = "openai", models = { m = { rpm = 600, tpm = 600000 } }, use_min = 0.25,
        use_max = 0.25 })
      local requests, tokens = meter(600, 60), meter(600000, 60)
      local limiter = rw.limiters { requests = requests, tokens = tokens }
      local res = stream_post(OPENAI, chat("m", 400, { max_tokens = 400, stream_options = { include_usage = true } }),
        limiter, "openai")
      local names = read_events(res)
      assert.equal(12, #names) -- (the role, 8 pieces, the stop, the usage and [DONE])
      local counted = s:llm_counts(OPENAI).m.counted
      assert.same({ requests = 1, tokens = 500 }, counted)
      assert.near(500, used(tokens), 1)
      assert.near(1, used(requests), 0.01)
    end)
  end)

  -- 48 chat requests of 200-2,200 characters and max_tokens 200-500, at
  -- most 8 at once, through limiters the size of the server's (buckets
  -- holding 1 s of each limit), the provider's estimate as the cost.
  -- share: what the server counted of the binding limit over what it
  -- allowed from the first admission to the last (a bucket's worth at the
  -- start, then its rate).
  local function batch(path, provider, limits, binding)
    local b = {}
    for name, per_minute_limit in pairs(limits) do b[name] = per_minute(per_minute_limit, 1) end
    local limiter = rw.limiters(b)
    local items = {}
    for i = 1, 48 do items[i] = i end
    local results = rw.map(items, function(i)
      local req = chat("m", 200 + (i * 91) % 2000, { max_tokens = 200 + (i * 37) % 300 })
      local res, err = rw.fetch(s:url(path), { json = req, limiter = limiter, policy = provider, on_retry = false })
      return res and res.status or err.kind
    end, { concurrency = 8 })
    for i = 1, results.n do assert.equal(200, results[i]) end
    local counts = s:llm_counts(path).m
    local allowed = limits[binding] / 60 * (counts.last - counts.first + 1)
    return counts.counted[binding] / allowed, counts.limited
  end

  it("keeps Anthropic's output tokens busy: the unused output given back, few 429s", function()
    local limits = { requests = 6000, input_tokens = 600000, output_tokens = 180000 }
    s:llm(ANTHROPIC, { provider = "anthropic", models = { m = { rpm = 6000, itpm = 600000, otpm = 180000 } },
      hold = 1, use_min = 0.1, use_max = 1 })
    -- (measured: 0.99 of OTPM and no 429; 0.58 without the settle, max_tokens never given back)
    local share, limited = batch(ANTHROPIC, "anthropic", limits, "output_tokens")
    assert.is_true(share >= 0.85, "share of OTPM " .. share)
    assert.is_true(limited <= 2, limited .. " answered 429")
  end)

  it("keeps OpenAI's tokens busy: the tokens limit synced from the headers, few 429s", function()
    local limits = { requests = 6000, tokens = 600000 }
    s:llm(OPENAI, { provider = "openai", models = { m = { rpm = 6000, tpm = 600000 } }, hold = 1,
      use_min = 0.1, use_max = 1 })
    -- (measured: 0.9997 of TPM and no 429; 0.97 and one 429 without the headers' sync)
    local share, limited = batch(OPENAI, "openai", limits, "tokens")
    assert.is_true(share >= 0.85, "share of TPM " .. share)
    assert.is_true(limited <= 2, limited .. " answered 429")
  end)
end)
