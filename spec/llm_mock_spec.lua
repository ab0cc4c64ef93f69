-- The test server's mock of OpenAI's and Anthropic's rate limits
-- (spec/support/llm_mock.py), which the LLM limit specs and `make
-- bench-llm` measure ratewise against: it must count as the providers'
-- rate-limit pages say they count, or those figures mean nothing. Asked
-- through rw.fetch, with no limiter and no provider policy in the way (the
-- server is reached by its loopback address, so no provider is chosen by host).
local rw = require "ratewise"
local server = require "spec.support.server"

local OPENAI, ANTHROPIC = "/v1/chat/completions", "/v1/messages"

-- a chat request of `chars` characters of prompt
local function chat(model, chars, fields)
  local req = { model = model, messages = { { role = "user", content = string.rep("a", chars) } } }
  for k, v in pairs(fields or {}) do req[k] = v end
  return req
end

-- The server's answer, whatever its status (a refusal is an error's response).
local function post(s, path, req, extra)
  local opts = { method = "POST", json = req, on_retry = false, max_retries = 0 }
  for k, v in pairs(extra or {}) do opts[k] = v end
  local res, err = rw.fetch(s:url(path), opts)
  return res or assert(err.response, tostring(err))
end

describe("the test server's LLM rate limits", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("as OpenAI counts", function()
    before_each(function()
      s:llm(OPENAI, { provider = "openai", models = { ["gpt-m"] = { rpm = 600, tpm = 60000 } }, hold = 1,
        use_min = 0.5, use_max = 0.5 })
    end)

    it("takes the prompt's characters / 4 plus max_tokens, times n, at admission, and never gives back", function()
      -- (a bucket of 1 s: 1,000 tokens, 10 requests)
      local res = post(s, OPENAI, chat("gpt-m", 400, { max_tokens = 100, n = 2 }))
      assert.equal(200, res.status)
      local body = res:json()
      assert.equal(100, body.usage.prompt_tokens)
      assert.equal(100, body.usage.completion_tokens) -- half of max_tokens, for each of 2
      assert.equal(2, #body.choices)
      -- (100 + 100) * 2 taken, the unused half never given back
      local remaining = tonumber(res.headers["x-ratelimit-remaining-tokens"])
      assert.is_true(remaining >= 600 and remaining <= 610, tostring(remaining))
      assert.equal("60000", res.headers["x-ratelimit-limit-tokens"])
      assert.matches("^%d+ms$", res.headers["x-ratelimit-reset-tokens"])
      assert.equal("9", res.headers["x-ratelimit-remaining-requests"])
      local counts = s:llm_counts(OPENAI)["gpt-m"]
      assert.equal(400, counts.counted.tokens)
      assert.equal(1, counts.ok)
      assert.equal(0, counts.limited)
    end)

    it("counts max_completion_tokens as max_tokens, and a model's default when neither is given", function()
      post(s, OPENAI, chat("gpt-m", 40, { max_completion_tokens = 50 }))
      assert.equal(60, s:llm_counts(OPENAI)["gpt-m"].counted.tokens)
      s:llm(OPENAI, { provider = "openai", models = { ["gpt-m"] = { rpm = 600, tpm = 600000 } }, hold = 1,
        default_max_tokens = 300 })
      post(s, OPENAI, chat("gpt-m", 40))
      assert.equal(310, s:llm_counts(OPENAI)["gpt-m"].counted.tokens)
    end)

    it("answers 429 with retry-after and OpenAI's error when a request does not fit, and takes nothing", function()
      -- (a bucket of a whole minute, refilled at 1,000 / 60 tokens a second)
      s:llm(OPENAI, { provider = "openai", models = { ["gpt-m"] = { rpm = 600, tpm = 1000 } } })
      assert.equal(200, post(s, OPENAI, chat("gpt-m", 400, { max_tokens = 700 })).status)
      local res = post(s, OPENAI, chat("gpt-m", 400, { max_tokens = 700 }))
      assert.equal(429, res.status)
      -- 600 tokens short: 36 s
      local retry_after = tonumber(res.headers["retry-after"])
      assert.is_true(retry_after >= 30 and retry_after <= 36, tostring(retry_after))
      local err = res:json().error
      assert.equal("rate_limit_exceeded", err.code)
      assert.equal("tokens", err.type)
      local counts = s:llm_counts(OPENAI)["gpt-m"]
      assert.equal(800, counts.counted.tokens)
      assert.same({ 1, 1 }, { counts.ok, counts.limited })
      assert.is_true(s:log(OPENAI)[2].limited)
    end)

    it("streams chunks, and the usage chunk when stream_options.include_usage asks", function()
      local res = post(s, OPENAI, chat("gpt-m", 80, { max_tokens = 40, stream = true,
        stream_options = { include_usage = true } }), { stream = true })
      assert.equal(200, res.status)
      local text, usage, done = {}, nil, false
      for event in res:events() do
        local chunk = event:json()
        if chunk == nil then
          done = true
        else
          if chunk.usage then usage = chunk.usage end
          local choice = chunk.choices[1]
          if choice and choice.delta.content then text[#text + 1] = choice.delta.content end
        end
      end
      res:close()
      assert.is_true(done)
      assert.equal(20, #table.concat(text))
      assert.same({ prompt_tokens = 20, completion_tokens = 20, total_tokens = 40 }, usage)
    end)
  end)

  describe("as Anthropic counts", function()
    before_each(function()
      s:llm(ANTHROPIC, { provider = "anthropic", models = { ["claude-m"] = { rpm = 600, itpm = 60000,
        otpm = 60000 } }, hold = 1, use_min = 0.25, use_max = 0.25, chars_per_token = 4 })
    end)

    it("takes max_tokens from OTPM at admission and gives back what the answer did not use", function()
      local res = post(s, ANTHROPIC, { model = "claude-m", max_tokens = 400, system = string.rep("s", 40),
        messages = { { role = "user", content = { { type = "text", text = string.rep("a", 360) } } } } })
      assert.equal(200, res.status)
      local usage = res:json().usage
      assert.same({ input_tokens = 100, output_tokens = 100 }, usage)
      -- the headers tell the state at admission: 400 output tokens taken
      local remaining = tonumber(res.headers["anthropic-ratelimit-output-tokens-remaining"])
      assert.is_true(remaining >= 600 and remaining <= 610, tostring(remaining))
      assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$", res.headers["anthropic-ratelimit-output-tokens-reset"])
      assert.truthy(res.headers["anthropic-ratelimit-input-tokens-remaining"])
      assert.truthy(res.headers["anthropic-ratelimit-tokens-remaining"])
      local counts = s:llm_counts(ANTHROPIC)["claude-m"]
      assert.same({ requests = 1, input_tokens = 100, output_tokens = 100 }, counts.counted)
      assert.same({ input = 100, output = 100 }, counts.used)
    end)

    it("answers 429 with retry-after and Anthropic's error when max_tokens does not fit OTPM", function()
      s:llm(ANTHROPIC, { provider = "anthropic", models = { ["claude-m"] = { rpm = 600, itpm = 60000,
        otpm = 1000 } }, use_min = 0.25, use_max = 0.25 })
      local res = post(s, ANTHROPIC, { model = "claude-m", max_tokens = 900, messages = { { role = "user",
        content = "hi" } } })
      assert.equal(200, res.status)
      -- 900 taken, 675 given back: 775 left, refilled at 1,000 / 60 a second
      res = post(s, ANTHROPIC, { model = "claude-m", max_tokens = 999, messages = { { role = "user",
        content = "hi" } } })
      assert.equal(429, res.status)
      local retry_after = tonumber(res.headers["retry-after"])
      assert.is_true(retry_after >= 10 and retry_after <= 14, tostring(retry_after))
      assert.equal("rate_limit_error", res:json().error.type)
      assert.same({ 1, 1 }, { s:llm_counts(ANTHROPIC)["claude-m"].ok, s:llm_counts(ANTHROPIC)["claude-m"].limited })
    end)

    it("streams message_start with the input's usage and message_delta with the output's", function()
      local res = post(s, ANTHROPIC, { model = "claude-m", max_tokens = 80, stream = true,
        messages = { { role = "user", content = string.rep("a", 200) } } }, { stream = true })
      local names, input, output = {}, nil, nil
      for event in res:events() do
        names[#names + 1] = event.event
        local data = event:json()
        if event.event == "message_start" then input = data.message.usage.input_tokens end
        if event.event == "message_delta" then output = data.usage.output_tokens end
      end
      res:close()
      assert.equal("message_start", names[1])
      assert.equal("message_stop", names[#names])
      assert.equal(50, input)
      assert.equal(20, output)
      assert.same({ requests = 1, input_tokens = 50, output_tokens = 20 },
        s:llm_counts(ANTHROPIC)["claude-m"].counted)
    end)

    it("settles a stream the client leaves: what it wrote is what it used", function()
      s:llm(ANTHROPIC, { provider = "anthropic", models = { ["claude-m"] = { rpm = 600, itpm = 60000,
        otpm = 60000 } }, hold = 1, use_min = 1, use_max = 1, speed = 200 })
      local res = post(s, ANTHROPIC, { model = "claude-m", max_tokens = 400, stream = true,
        messages = { { role = "user", content = "hi" } } }, { stream = true })
      local next_event = res:events()
      repeat local event = next_event() until event == nil or event.event == "content_block_delta"
      res:close() -- 50 of 400 tokens written, at 200 a second
      local counted
      local deadline = rw.now() + 3
      repeat
        counted = s:llm_counts(ANTHROPIC)["claude-m"].counted.output_tokens
        if counted < 400 then break end
        rw.sleep(0.05)
      until rw.now() > deadline
      assert.is_true(counted >= 50 and counted <= 100, tostring(counted))
    end)
  end)

  it("refuses a configuration that names no limit, and a request for an unknown model", function()
    assert.error_matches(function()
      s:llm(OPENAI, { provider = "openai", models = { m = { rpm = 10 } } })
    end, "model m needs a positive tpm")
    assert.error_matches(function() s:llm(OPENAI, { provider = "gemini", models = { m = {} } }) end,
      "provider must be one of anthropic, openai")
    s:llm(OPENAI, { provider = "openai", models = { m = { rpm = 10, tpm = 1000 } } })
    assert.equal(404, post(s, OPENAI, chat("other", 4)).status)
    assert.equal(400, post(s, OPENAI, { messages = {} }).status)
  end)
end)
