-- Named limits shared by processes through Redis (issue 41, item 6): two
-- processes send Anthropic chats through one set of limits, each a
-- rw.redis_bucket on the suite's redis-server, against the test server's
-- mock of Anthropic's limits (spec/support/llm_mock.py). Each process's
-- corrections from usage (the output it did not use, given back) reach
-- the other through Redis. What the server counted says whether the two
-- together kept to the limits, and how much of the output limit they used.
local rw = require "ratewise"
local server = require "spec.support.server"
local redis = require "spec.support.redis"
local subprocess = require "spec.support.subprocess"

local PATH = "/v1/messages"
local LIMITS = { requests = 6000, input_tokens = 600000, output_tokens = 60000 }
local PER_PROCESS = 24

-- A process's half: 24 chats at 4 at a time, through named limits in
-- Redis (a bucket each of a second of the limit, as the server's), or in
-- the process alone (redis_url "none"); prints "ok N".
local WORKER = [[
local rw = require "ratewise"
local base, redis_url, id = arg[1], arg[2], tonumber(arg[3])
local limits = { requests = tonumber(arg[4]), input_tokens = tonumber(arg[5]), output_tokens = tonumber(arg[6]) }
local members = {}
for name, per_minute in pairs(limits) do
  local shape = { capacity = per_minute / 60, rate = per_minute / 60 }
  if redis_url ~= "none" then
    shape.redis, shape.key = redis_url, "llm:" .. name
    members[name] = rw.redis_bucket(shape)
  else
    members[name] = rw.bucket(shape)
  end
end
local limiter = rw.limiters(members)
local items = {}
for i = 1, tonumber(arg[7]) do items[i] = id * 1000 + i end
local results = rw.map(items, function(i)
  local req = { model = "m", max_tokens = 200 + (i * 37) % 300,
    messages = { { role = "user", content = ("a"):rep(200 + (i * 91) % 2000) } } }
  local res, err = rw.fetch(base .. "/v1/messages", { json = req, limiter = limiter, policy = "anthropic",
    on_retry = false })
  return res and res.status or err.kind
end, { concurrency = 4 })
local ok = 0
for i = 1, results.n do if results[i] == 200 then ok = ok + 1 end end
print("ok " .. ok)
]]

local needs_redis = rw.features.redis and it or function(name)
  pending(name .. " [this build has no Redis support: REDIS=0]")
end

describe("named limits shared through Redis by two processes", function()
  local s, r

  setup(function()
    s = server.start()
    r = redis.start()
  end)
  teardown(function()
    s:stop()
    r:destroy()
  end)

  -- Both processes at once, their limits in Redis (or not); what the
  -- server counted, and the share of its output limit they used.
  local function run(redis_url)
    s:reset()
    r:cli("FLUSHALL")
    s:llm(PATH, { provider = "anthropic", models = { m = { rpm = LIMITS.requests, itpm = LIMITS.input_tokens,
      otpm = LIMITS.output_tokens } }, hold = 1, use_min = 0.1, use_max = 1 })
    local outputs = subprocess.run_lua_processes { code = WORKER, count = 2, seconds = 60, args = function(i)
      return table.concat({ s:url(""), redis_url, i, LIMITS.requests, LIMITS.input_tokens, LIMITS.output_tokens,
        PER_PROCESS }, " ")
    end }
    local answered = 0
    for _, out in ipairs(outputs) do
      answered = answered + assert(tonumber(out:match("^ok (%d+)\n$")), "a worker wrote: " .. out)
    end
    local counts = s:llm_counts(PATH).m
    counts.answered = answered
    local allowed = LIMITS.output_tokens / 60 * (counts.last - counts.first + 1)
    return counts, counts.counted.output_tokens / allowed
  end

  needs_redis("keep to the limits together, each one's unused output given back to both", function()
    local counts, share = run(r.url)
    assert.equal(2 * PER_PROCESS, counts.answered)
    assert.equal(2 * PER_PROCESS, counts.ok)
    -- (without the give-back, max_tokens would be kept until each bucket
    -- refills: far less of the output limit)
    assert.is_true(counts.limited <= 2, counts.limited .. " answered 429")
    assert.is_true(share >= 0.8, "share of the output limit " .. share)
    -- the buckets were Redis's: their keys are there while they refill
    local keys = r:cli("KEYS", "*llm:*")
    assert.matches("llm:output_tokens", keys, 1, true)
  end)

  needs_redis("where each process keeps its own buckets, the two send twice the limit, and are answered 429", function()
    local counts = run("none")
    assert.is_true(counts.limited > 2, counts.limited .. " answered 429")
  end)
end)
