-- Limits per model through fetch (issue 41 item 5): rw.by_model holds the
-- limits of several models, and each request takes from those of the
-- model its JSON body names, against the test server's mock of OpenAI's
-- rate limits (each model's own buckets there too). Each assertion is on
-- what the server counted.
local rw = require "ratewise"
local server = require "spec.support.server"

local PATH = "/v1/chat/completions"

local function chat(model, chars, max_tokens)
  return { model = model, max_tokens = max_tokens, messages = { { role = "user", content = ("a"):rep(chars) } } }
end

-- A bucket that refills so slowly that what it took can be read off it.
local function meter(capacity)
  return rw.bucket { capacity = capacity, rate = capacity / 36000, slow_down = false }
end

local function used(bucket)
  return bucket:capacity() - bucket:tokens()
end

-- A bucket of `hold` seconds of a per-minute limit, as the mock keeps it.
local function per_minute(limit, hold)
  return rw.bucket { capacity = limit / 60 * hold, rate = limit / 60, slow_down = false }
end

describe("rw.by_model", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("takes each request from the limits of the model it names", function()
    s:llm(PATH, { provider = "openai", models = { big = { rpm = 600, tpm = 600000 },
      small = { rpm = 600, tpm = 600000 } }, use_min = 0.5, use_max = 0.5 })
    local big, small = { requests = meter(600), tokens = meter(10000) },
      { requests = meter(600), tokens = meter(10000) }
    local limiter = rw.by_model { big = rw.limiters(big), small = rw.limiters(small) }
    local client = rw.client { base_url = s:url(""), provider = "openai", limiter = limiter, on_retry = false }
    assert.equal(200, assert(client:post(PATH, { json = chat("big", 400, 100) })).status)
    assert.equal(200, assert(client:post(PATH, { json = chat("small", 40, 50) })).status)
    assert.equal(200, assert(client:post(PATH, { json = chat("small", 80, 30) })).status)
    local counts = s:llm_counts(PATH)
    assert.same({ requests = 1, tokens = 200 }, counts.big.counted)
    assert.same({ requests = 2, tokens = 60 + 50 }, counts.small.counted)
    assert.near(200, used(big.tokens), 1)
    assert.near(1, used(big.requests), 0.01)
    assert.near(110, used(small.tokens), 1)
    assert.near(2, used(small.requests), 0.01)
  end)

  it("takes the model's limits together with a client route's own, and the route's alone for no model", function()
    s:llm(PATH, { provider = "openai", models = { big = { rpm = 600, tpm = 600000 } }, use_min = 0.5,
      use_max = 0.5 })
    local big = { requests = meter(600), tokens = meter(10000) }
    local route = meter(100)
    local client = rw.client { base_url = s:url(""), provider = "openai", on_retry = false,
      limiter = rw.by_model { big = rw.limiters(big) }, routes = { ["/v1/"] = route } }
    assert.equal(200, assert(client:post(PATH, { json = chat("big", 400, 100) })).status)
    assert.equal(200, assert(client:get("/v1/models")).status) -- no model: the route's alone
    assert.same({ requests = 1, tokens = 200 }, s:llm_counts(PATH).big.counted)
    assert.near(200, used(big.tokens), 1)
    assert.near(1, used(big.requests), 0.01)
    assert.near(2, used(route), 0.01)
    assert.error_matches(function() client:post(PATH, { json = chat("other", 4, 5) }) end,
      'no limits for model "other"', nil, true)
  end)

  it("raises for a model without limits and no default, naming it and the models it has; nothing is sent", function()
    s:llm(PATH, { provider = "openai", models = { big = { rpm = 600, tpm = 600000 },
      other = { rpm = 600, tpm = 600000 } } })
    local limiter = rw.by_model { big = rw.limiters { requests = meter(600), tokens = meter(10000) } }
    assert.error_matches(function()
      rw.fetch(s:url(PATH), { json = chat("other", 4, 5), limiter = limiter, policy = "openai" })
    end, 'no limits for model "other", and no default (the models with limits are "big")', nil, true)
    assert.equal(0, #s:log(PATH))
    -- a default takes the models not named; a request naming no model takes it too
    local default = { requests = meter(600), tokens = meter(10000) }
    limiter = rw.by_model { big = rw.limiters { requests = meter(600), tokens = meter(10000) },
      default = rw.limiters(default) }
    assert.equal(200, assert(rw.fetch(s:url(PATH), { json = chat("other", 40, 5), limiter = limiter,
      policy = "openai", on_retry = false })).status)
    assert.near(15, used(default.tokens), 1)
    assert.same({ requests = 1, tokens = 15 }, s:llm_counts(PATH).other.counted)
    -- without a default, a request naming no model is no model's to count
    limiter = rw.by_model { big = rw.limiters { requests = meter(600), tokens = meter(10000) } }
    local res = assert(rw.fetch(s:url("/plain"), { limiter = limiter, on_retry = false }))
    assert.equal(200, res.status)
    assert.error_matches(function() limiter:acquire(1) end, "acquire needs a request's model", nil, true)
    assert.error_matches(function() rw.by_model { big = "redis://secret@host" } end,
      "by_model's limiter of model \"big\" must be a limiter", nil, true)
    assert.error_matches(function() rw.by_model {} end, "at least one model", nil, true)
  end)

  it("keeps two models' limits apart under load: the server counted no 429", function()
    -- the small model's tokens bind, the big one's do not, at 6 at once
    s:llm(PATH, { provider = "openai", models = { big = { rpm = 6000, tpm = 600000 },
      small = { rpm = 6000, tpm = 120000 } }, hold = 1, use_min = 0.1, use_max = 1 })
    local function limits(tpm)
      return rw.limiters { requests = per_minute(6000, 1), tokens = per_minute(tpm, 1) }
    end
    local limiter = rw.by_model { big = limits(600000), small = limits(120000) }
    local items = {}
    for i = 1, 24 do items[i] = i end
    local results = rw.map(items, function(i)
      local req = chat(i % 2 == 0 and "big" or "small", 200 + (i * 91) % 400, 100 + (i * 37) % 100)
      local res, err = rw.fetch(s:url(PATH), { json = req, limiter = limiter, policy = "openai", on_retry = false })
      return res and res.status or err.kind
    end, { concurrency = 6 })
    for i = 1, results.n do assert.equal(200, results[i]) end
    local counts = s:llm_counts(PATH)
    assert.same({ 12, 0 }, { counts.big.ok, counts.big.limited })
    assert.same({ 12, 0 }, { counts.small.ok, counts.small.limited })
  end)
end)
