-- LLM calls survive their first 429 (issue 39, part 1): docs/streaming.md's
-- examples against mocks faithful to OpenAI and Anthropic, the provider
-- chosen by the URL's host, the `unsafe` error naming the provider that
-- would have replayed the answer, a provider's name as `policy`, and
-- event:json().
--
-- The APIs' own hosts (api.openai.com, ...) reach the loopback test server
-- as their HTTP proxy: the URL keeps its host, so the provider is chosen by
-- it, and the server answers (and logs) the path as scripted.
local rw = require "ratewise"
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"
local known = require "ratewise.providers.known"

local SSE = { ["Content-Type"] = "text/event-stream" }
local JSON = { ["Content-Type"] = "application/json" }

-- OpenAI's 429: the wait in retry-after (and retry-after-ms), the quota
-- headers in Go durations, an error body.
local function openai_429(seconds)
  return { status = 429, headers = { ["Content-Type"] = "application/json", ["retry-after"] = tostring(seconds),
      ["retry-after-ms"] = tostring(seconds * 1000), ["x-ratelimit-limit-requests"] = "500",
      ["x-ratelimit-remaining-requests"] = "0", ["x-ratelimit-reset-requests"] = seconds .. "s" },
    body = '{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,'
      .. '"code":"rate_limit_exceeded"}}' }
end

-- OpenAI's chat completion stream: deltas, then [DONE].
local function openai_stream(words)
  local chunks = { { 0, 'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    .. '{"role":"assistant","content":""},"finish_reason":null}]}\n\n' } }
  for _, w in ipairs(words) do
    chunks[#chunks + 1] = { 0.02, 'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
      .. '"delta":{"content":"' .. w .. '"},"finish_reason":null}]}\n\n' }
  end
  chunks[#chunks + 1] = { 0.02, 'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    .. '"delta":{},"finish_reason":"stop"}]}\n\n' }
  chunks[#chunks + 1] = { 0, "data: [DONE]\n\n" }
  return { action = "stream", headers = SSE, chunks = chunks }
end

-- Anthropic's 429 (retry-after, RFC 3339 resets) and its messages stream.
local function anthropic_429(seconds)
  return { status = 429, headers = { ["Content-Type"] = "application/json", ["retry-after"] = tostring(seconds),
      ["anthropic-ratelimit-requests-remaining"] = "0" },
    body = '{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded '
      .. 'your rate limit"}}' }
end

local function anthropic_stream(words)
  local function ev(name, data) return "event: " .. name .. "\ndata: " .. data .. "\n\n" end
  local chunks = {
    { 0, ev("message_start", '{"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[]}}') },
    { 0, ev("content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":"text",'
      .. '"text":""}}') },
    { 0, ev("ping", '{"type": "ping"}') },
  }
  for _, w in ipairs(words) do
    chunks[#chunks + 1] = { 0.02, ev("content_block_delta", '{"type":"content_block_delta","index":0,'
      .. '"delta":{"type":"text_delta","text":"' .. w .. '"}}') }
  end
  chunks[#chunks + 1] = { 0, ev("content_block_stop", '{"type":"content_block_stop","index":0}') }
  chunks[#chunks + 1] = { 0, ev("message_stop", '{"type":"message_stop"}') }
  return { action = "stream", headers = SSE, chunks = chunks }
end

-- The ```lua blocks of docs/streaming.md, in order.
local function streaming_examples()
  local f = assert(io.open("docs/streaming.md", "rb"))
  local page = f:read("*a")
  f:close()
  local blocks = {}
  for code in page:gmatch("\n```lua\n(.-)\n```\n") do blocks[#blocks + 1] = code .. "\n" end
  return blocks
end

-- Runs a block of the docs with the test server as the HTTP proxy of every
-- host (https:// made http://: the server speaks plain HTTP), no API keys set.
local function run_through(s, code)
  code = code:gsub("https://", "http://")
  local proxy = "http://127.0.0.1:" .. s.port
  return subprocess.run_lua(code, { seconds = 30, shell = "env -u OPENAI_API_KEY -u ANTHROPIC_API_KEY "
    .. "-u no_proxy -u NO_PROXY -u all_proxy -u ALL_PROXY http_proxy=" .. proxy .. " " })
end

describe("LLM calls", function()
  local s
  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("docs/streaming.md's examples", function()
    local blocks = streaming_examples()

    it("are an OpenAI delta stream and an Anthropic one", function()
      assert.is_true(#blocks >= 2, #blocks .. " blocks")
      assert.matches("api.openai.com/v1/chat/completions", blocks[1], 1, true)
      assert.matches("event:json()", blocks[1], 1, true)
      assert.matches("api.anthropic.com/v1/messages", blocks[2], 1, true)
      assert.matches("content_block_delta", blocks[2], 1, true)
    end)

    it("OpenAI's: waits out the first 429's retry-after, sends the POST again, prints the deltas", function()
      s:script("/v1/chat/completions", { openai_429(1), openai_stream { "Hel", "lo", " there" } })
      local out, code = run_through(s, blocks[1])
      assert.equal(0, code, out)
      assert.matches("^retrying POST http://api.openai.com/v1/chat/completions in [%d.]+ s %(429, attempt 1/3",
        out)
      assert.matches("\nHello there\n$", out)
      local seen = s:log("/v1/chat/completions")
      assert.equal(2, #seen)
      for _, r in ipairs(seen) do
        assert.is_true(r.proxied)
        assert.equal("POST", r.method)
        assert.equal("api.openai.com", r.headers.host)
        assert.matches('"stream":true', r.body, 1, true)
      end
      assert.equal(seen[1].body, seen[2].body)
      local waited = seen[2].t - seen[1].t
      assert.is_true(waited >= 0.95 and waited < 2.5, ("sent again after %.2f s"):format(waited))
    end)

    it("Anthropic's: waits out the first 429, sends the POST again, prints the text deltas", function()
      s:script("/v1/messages", { anthropic_429(1), anthropic_stream { "Bon", "jour" } })
      local out, code = run_through(s, blocks[2])
      assert.equal(0, code, out)
      assert.matches("^retrying POST http://api.anthropic.com/v1/messages in [%d.]+ s %(429, attempt 1/3", out)
      assert.matches("\nBonjour\n$", out)
      local seen = s:log("/v1/messages")
      assert.equal(2, #seen)
      assert.equal("api.anthropic.com", seen[2].headers.host)
      assert.equal("2023-06-01", seen[2].headers["anthropic-version"])
      assert.equal(seen[1].body, seen[2].body)
      assert.is_true(seen[2].t - seen[1].t >= 0.95)
    end)
  end)

  describe("the provider of the URL's host", function()
    local function via(extra)
      local o = { proxy = "http://127.0.0.1:" .. s.port, on_retry = false, base = 0.01 }
      for k, v in pairs(extra or {}) do o[k] = v end
      return o
    end

    it("is chosen for rw.fetch: a POST to OpenAI or Anthropic is sent again after a 429, not after a 500", function()
      for _, case in ipairs { { "http://api.openai.com/v1/embeddings", "/v1/embeddings" },
                               { "http://api.anthropic.com/v1/messages", "/v1/messages" } } do
        s:reset()
        s:script(case[2], { { status = 429, headers = { ["retry-after"] = "0.05" } }, { status = 200, body = "{}" } })
        local res = assert(rw.fetch(case[1], via { json = { input = "x" } }))
        assert.equal(200, res.status)
        assert.equal(2, #s:log(case[2]), case[1])
        -- a 500 may come after the model ran: not replayed
        s:reset()
        s:script(case[2], { { status = 500 }, { status = 200 } })
        local _, err = rw.fetch(case[1], via { json = { input = "x" } })
        assert.equal("unsafe", err.kind)
        assert.equal(1, #s:log(case[2]))
      end
    end)

    it("is chosen for rw.fetch's plain GET too (GitHub's spent quota is retried, not terminal)", function()
      s:script("/rate", { { status = 403, headers = { ["x-ratelimit-remaining"] = "0", ["retry-after"] = "0.05" } },
        { status = 200, body = "{}" } })
      local res = assert(rw.fetch("http://api.github.com/rate", { proxy = "http://127.0.0.1:" .. s.port,
        on_retry = false }))
      assert.equal(200, res.status)
      assert.equal(2, #s:log("/rate"))
    end)

    it("gives a POST to Stripe its Idempotency-Key", function()
      s:script("/v1/charges", { { status = 500 }, { status = 200 } })
      local res = assert(rw.fetch("http://api.stripe.com/v1/charges", via { body = "amount=1" }))
      assert.equal(200, res.status)
      local seen = s:log("/v1/charges")
      assert.equal(2, #seen)
      assert.is_string(seen[1].headers["idempotency-key"])
      assert.equal(seen[1].headers["idempotency-key"], seen[2].headers["idempotency-key"])
    end)

    it("is chosen for a client's calls, unless the client says provider = false", function()
      s:script("/v1/chat/completions", { openai_429(0.05), { status = 200, headers = JSON, body = "{}" } })
      local api = rw.client { base_url = "http://api.openai.com/v1", proxy = "http://127.0.0.1:" .. s.port,
        on_retry = false }
      assert.equal(200, assert(api:post("/chat/completions", { json = { q = 1 } })).status)
      assert.equal(2, #s:log("/v1/chat/completions"))
      s:reset()
      s:script("/v1/chat/completions", { openai_429(0.05), { status = 200 } })
      local none = rw.client { base_url = "http://api.openai.com/v1", proxy = "http://127.0.0.1:" .. s.port,
        on_retry = false, provider = false }
      local _, err = none:post("/chat/completions", { json = { q = 1 } })
      assert.equal("unsafe", err.kind)
      assert.equal(1, #s:log("/v1/chat/completions"))
    end)

    it("gives way to the call's own policy, and to policy = false", function()
      local steps = { openai_429(0.05), { status = 200 } }
      s:script("/v1/chat/completions", steps)
      local _, err = rw.fetch("http://api.openai.com/v1/chat/completions", via { json = { q = 1 }, policy = false })
      assert.equal("unsafe", err.kind)
      assert.equal(1, #s:log("/v1/chat/completions"))
      s:reset()
      s:script("/v1/chat/completions", steps)
      local mine = rw.policy { name = "mine", classify = function() return nil end }
      _, err = rw.fetch("http://api.openai.com/v1/chat/completions", via { json = { q = 1 }, policy = mine })
      assert.equal("unsafe", err.kind)
      assert.equal(1, #s:log("/v1/chat/completions"))
    end)

    it("knows the hosts of docs/providers.md, Azure OpenAI's under HTTPS", function()
      for origin, name in pairs {
        ["https://api.openai.com:443"] = "openai", ["https://my-res.openai.azure.com:443"] = "openai",
        ["https://api.anthropic.com:443"] = "anthropic", ["https://api.github.com:443"] = "github",
        ["https://api.stripe.com:443"] = "stripe", ["http://api.openai.com:80"] = "openai",
      } do
        assert.equal(name, known.provider_for(origin), origin)
      end
      for _, origin in ipairs { "https://api.openai.com.evil.test:443", "https://openai.azure.com:443",
                                "https://x.openai.azure.com.evil.test:443", "https://api.openai.com:8443",
                                "http://127.0.0.1:80", "https://example.com:443" } do
        assert.is_nil(known.provider_for(origin), origin)
      end
    end)
  end)

  describe("the unsafe error", function()
    it("names the provider that would have replayed the answer first, and no fix for a 500", function()
      s:script("/v1/chat/completions", { openai_429(0.05), { status = 200 } })
      local _, err = rw.fetch(s:url("/v1/chat/completions"), { json = { q = 1 }, on_retry = false })
      assert.equal("unsafe", err.kind)
      assert.equal(1, #s:log("/v1/chat/completions"))
      local msg = tostring(err)
      local named, key = msg:find('policy = "openai"', 1, true), msg:find("idempotency_key", 1, true)
      assert.is_truthy(named, msg)
      assert.is_true(named < key, msg)
      s:reset()
      s:script("/v1/chat/completions", { { status = 500 }, { status = 200 } })
      _, err = rw.fetch(s:url("/v1/chat/completions"), { json = { q = 1 }, on_retry = false })
      assert.equal("unsafe", err.kind)
      assert.is_nil(tostring(err):find("policy =", 1, true), tostring(err))
    end)
  end)

  describe("a provider's name as policy", function()
    it("is taken by rw.fetch and a client's call, and the call is sent again", function()
      s:script("/v1/chat/completions", { openai_429(0.05), { status = 200 } })
      assert.equal(200, assert(rw.fetch(s:url("/v1/chat/completions"),
        { json = { q = 1 }, policy = "openai", on_retry = false })).status)
      assert.equal(2, #s:log("/v1/chat/completions"))
      s:reset()
      s:script("/v1/messages", { { status = 529 }, { status = 200 } })
      local api = rw.client { base_url = s.base, on_retry = false, base = 0.01 }
      assert.equal(200, assert(api:post("/v1/messages", { json = { q = 1 }, policy = "anthropic" })).status)
      assert.equal(2, #s:log("/v1/messages"))
    end)

    it("raises for an unknown name, listing the built-in ones, before anything is sent", function()
      assert.error_matches(function() rw.fetch(s:url("/x"), { policy = "opnai" }) end,
        "fetch: unknown provider 'opnai' %(built in: github, openai, anthropic, stripe, ietf%)")
      local api = rw.client { base_url = s.base }
      assert.error_matches(function() api:get("/x", { policy = "opnai" }) end,
        "client:request: unknown provider 'opnai' %(built in: github, openai, anthropic, stripe, ietf%)")
      assert.error_matches(function() rw.client { base_url = s.base, provider = "opnai" } end,
        "client: unknown provider 'opnai' %(built in: github, openai, anthropic, stripe, ietf%)")
      assert.error_matches(function() rw.fetch(s:url("/x"), { policy = 42 }) end,
        "option 'policy' must be a policy made by rw.policy, a built%-in provider's name, or false")
      assert.equal(0, #s:log("/x"))
    end)
  end)

  describe("event:json()", function()
    it("decodes an event's data, answers nil for [DONE], and raises for data that is neither", function()
      s:script("/e", { { action = "stream", headers = SSE, chunks = { { 0, 'data: {"a":[1,2]}\n\n' },
        { 0, "event: oops\ndata: {not json\n\n" }, { 0, "data: [DONE]\n\n" } } } })
      local res = assert(rw.fetch(s:url("/e"), { stream = true, on_retry = false }))
      local next_event = res:events()
      assert.same({ a = { 1, 2 } }, next_event():json())
      local bad = next_event()
      assert.error_matches(function() bad:json() end, "event:json%(%): the data of event 'oops' is not JSON")
      assert.is_nil(next_event():json())
      assert.is_nil(next_event())
    end)
  end)
end)
