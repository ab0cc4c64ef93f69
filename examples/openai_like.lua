-- An OpenAI-style API through rw.client with the "openai" provider, against
-- a local mock that speaks its dialect: retry-after-ms, x-ratelimit-*
-- headers in Go duration form, and x-should-retry.
--
--   lua5.4 examples/openai_like.lua     (from the repo root, after `make`)
package.path = "./?.lua;" .. package.path
local rw = require "ratewise"
local server = require "spec.support.server"

local api = server.start()
local completion = function(text)
  return { status = 200, body = string.format('{"choices":[{"message":{"content":"%s"}}]}', text),
    headers = { ["Content-Type"] = "application/json", ["x-ratelimit-remaining-requests"] = "59",
      ["x-ratelimit-reset-requests"] = "1s" } }
end
api:script("/v1/chat/completions", {
  completion("Hello!"),
  -- Rate limited: the precise wait is in retry-after-ms. (A Retry-After
  -- beside it would be the least ratewise waits, whatever the policy reads.)
  { status = 429, headers = { ["retry-after-ms"] = "1200",
    ["x-ratelimit-remaining-requests"] = "0", ["x-ratelimit-reset-requests"] = "1200ms" },
    body = '{"error":{"message":"Rate limit reached"}}' },
  completion("Second answer"),
  -- A 500 the server says is not worth retrying.
  { status = 500, headers = { ["x-should-retry"] = "false", ["Content-Type"] = "application/json" },
    body = '{"error":{"message":"invalid request shape"}}' },
})

-- Requests per minute and tokens per minute, as named limits taken together
-- for each request: the provider estimates the tokens of each (its prompt's
-- characters / 4, plus max_tokens), so no cost is written by hand.
local rpm = rw.bucket { capacity = 10, rate = 60 / 60 }
local tpm = rw.bucket { capacity = 4000, rate = 40000 / 60 }
local openai = rw.client {
  base_url = api.base .. "/v1",
  headers = { Authorization = "Bearer sk-demo-not-a-real-key" },
  provider = "openai",
  limiter = rw.limiters { requests = rpm, tokens = tpm },
  on_retry = function(info)
    print(string.format("  waiting %.2f s after %s (source: %s)", info.delay, info.status, info.source))
  end,
}

local started = rw.now()
for i, prompt in ipairs { "Say hello", "Say something else", "Break the API" } do
  local res, err = openai:post("/chat/completions", {
    json = { model = "gpt-demo", max_tokens = 100, messages = { { role = "user", content = prompt } } },
  })
  if res then
    local reply = res:json()
    local answer = reply and reply.choices[1].message.content or res.body
    print(string.format("request %d: %s (%d attempts, %.2f s)", i, answer,
      res.attempts, rw.now() - started))
  else
    print(string.format("request %d: %s: %s", i, err.kind, err.response and err.response:json().error.message))
  end
end
local st = openai:stats()
print(string.format("requests %d, attempts %d, retries %d (%s), waited %.2f s, failures %d",
  st.requests, st.attempts, st.retries, next(st.retries_by_source) or "-", st.waited, st.failures))
print(string.format("tokens per minute: %.0f of %d left", tpm:tokens(), tpm:capacity()))
api:stop()
