-- bench/llm.lua: how much of an LLM API's token limit ratewise gets, and
-- how many of its requests the API refuses (issue 41).
--
--   make bench-llm        (or: lua5.4 bench/llm.lua, from the root, after make)
--
-- The server is the test server's mock of OpenAI's and Anthropic's rate
-- limits (spec/support/llm_mock.py): continuously refilled buckets holding
-- HOLD seconds of each per-minute limit, OpenAI counting the prompt's
-- characters / 4 + max_tokens at admission and never correcting, Anthropic
-- counting the input at admission and max_tokens against output tokens,
-- giving back what the answer did not use; 429 with retry-after.
--
-- The workload: REQUESTS chat requests (seeded random) with prompts of
-- 200-6,000 characters and max_tokens 50-1,000, whose answers use 10-100%
-- of max_tokens, written at SPEED tokens a second; not streamed, and
-- streamed (OpenAI's include_usage chunk, Anthropic's events), read to the
-- end. The limits make the token limit bind (OpenAI: tokens; Anthropic:
-- output tokens), the requests and input limits well above their share.
--
-- The contenders, two in one run:
--
--   ratewise   rw.client with the provider (given: the mock is on loopback,
--              where no provider is chosen by host), rw.limiters with named
--              limits sized at the mock's (buckets of HOLD seconds of each
--              per-minute limit), no cost written by hand (the provider's
--              estimate, settle and sync), rw.map at CONCURRENCY;
--   cookbook   the algorithm of the OpenAI cookbook's
--              api_request_parallel_processor.py, reimplemented here on
--              ratewise's scheduler with rw.fetch (max_retries 0, no
--              limiter, no provider, so that only the algorithm paces it):
--              a capacity per limit, a whole minute of it at the start,
--              refilled at limit / 60 a second; a request goes when the
--              requests capacity holds 1 and each token capacity its
--              estimate (the prompt's characters / 4 + max_tokens x n;
--              Anthropic: the input's estimate from input tokens and
--              max_tokens from output tokens); a 429 stops new requests
--              until 15 s after the last one; an error retries up to 5
--              attempts; no cap on requests in flight; a loop of 1 ms.
--   ratewise, 2 processes sharing through Redis   the ratewise contender
--              in two processes of half the workload each, at CONCURRENCY
--              / 2, every named limit an rw.redis_bucket on a private
--              redis-server (spec/support/redis.lua); not run when
--              redis-server or Redis support is missing.
--
-- share: what the server counted of the binding limit over what it allowed
-- between its first and last admission (a bucket's worth at the start, then
-- the limit's rate), as spec/llm_limits_spec.lua computes it. 429s: the
-- requests the server refused, and their share of REQUESTS. Knobs:
-- BENCH_LLM_REQUESTS (600), BENCH_LLM_COOKBOOK (plain). A benchmark,
-- not a test: it fails only when a request fails outright.
local rw = require "ratewise"
local support = require "spec.support.server"

local REQUESTS = tonumber(os.getenv("BENCH_LLM_REQUESTS") or "600")
local CONCURRENCY = 16
local HOLD = 3
local SPEED = 2000
local SEED = 41
-- The cookbook's runs last five times ratewise's (a 15 s pause after each
-- 429); its pacing is the same streamed or not, so by default it runs the
-- workload not streamed only: "both", "plain" or "none".
local COOKBOOK = os.getenv("BENCH_LLM_COOKBOOK") or "plain"

local PROVIDERS = {
  openai = { path = "/v1/chat/completions", binding = "tokens",
    limits = { rpm = 3000, tpm = 1500000 },
    named = { requests = "rpm", tokens = "tpm" } },
  anthropic = { path = "/v1/messages", binding = "output_tokens",
    limits = { rpm = 3000, itpm = 2400000, otpm = 360000 },
    named = { requests = "rpm", input_tokens = "itpm", output_tokens = "otpm" } },
}

-- The workload, the same for every contender: a prompt's length and its
-- max_tokens per request, from a seeded generator of its own (Lua's
-- math.random differs between versions).
local function workload(n)
  local state = SEED
  local function uniform(lo, hi)
    state = (state * 1103515245 + 12345) % 2147483648
    return lo + math.floor(state / 2147483648 * (hi - lo + 1))
  end
  local items = {}
  for i = 1, n do
    items[i] = { id = i, chars = uniform(200, 6000), max_tokens = uniform(50, 1000) }
  end
  return items
end

-- A request's JSON body; the id keeps each prompt apart, so that the
-- mock's share of max_tokens (a hash of the body) differs between them.
local function body(item, stream)
  local prefix = "request " .. item.id .. ": "
  local req = { model = "m", max_tokens = item.max_tokens,
    messages = { { role = "user", content = prefix .. ("a"):rep(item.chars - #prefix) } } }
  if stream then
    req.stream = true
    req.stream_options = { include_usage = true }
  end
  return req
end

-- Reads a response whole: a stream's events to the end.
local function drain(res, stream)
  if stream then
    for _ in res:events() do end -- luacheck: ignore 512
  end
  res:close()
end

local function mock_options(name)
  local p = PROVIDERS[name]
  return { provider = name, models = { m = p.limits }, hold = HOLD, use_min = 0.1, use_max = 1, speed = SPEED }
end

-- The server's figures for a run of `seconds`.
local function measure(s, name, seconds, failed)
  local p = PROVIDERS[name]
  local counts = s:llm_counts(p.path).m
  local per_minute = p.limits[p.named[p.binding]]
  local allowed = per_minute / 60 * (counts.last - counts.first + HOLD)
  return { share = counts.counted[p.binding] / allowed, limited = counts.limited, ok = counts.ok,
    seconds = seconds, failed = failed }
end

local function per_minute_bucket(limit)
  return rw.bucket { capacity = limit / 60 * HOLD, rate = limit / 60 }
end

-- The named limits, local buckets or (redis_url) buckets in Redis.
local function named_limits(name, redis_url, stream)
  local p, members = PROVIDERS[name], {}
  for limit, option in pairs(p.named) do
    local per_minute = p.limits[option]
    if redis_url then
      members[limit] = rw.redis_bucket { redis = redis_url,
        key = table.concat({ "bench-llm", name, limit, stream and "stream" or "plain" }, "-"),
        capacity = per_minute / 60 * HOLD, rate = per_minute / 60 }
    else
      members[limit] = per_minute_bucket(per_minute)
    end
  end
  return rw.limiters(members)
end

-- The ratewise contender over `items`; answers the requests that failed.
local function run_ratewise(opts)
  local client = rw.client { base_url = opts.base_url, provider = opts.provider, on_retry = false,
    limiter = named_limits(opts.provider, opts.redis_url, opts.stream) }
  local path = PROVIDERS[opts.provider].path
  local results = rw.map(opts.items, function(item)
    local res, err = client:post(path, { json = body(item, opts.stream), stream = opts.stream })
    if not res then return false, err end
    drain(res, opts.stream)
    return true
  end, { concurrency = opts.concurrency })
  local failed = 0
  for i = 1, results.n do
    if not results[i] then failed = failed + 1 end
  end
  return failed
end

-- The cookbook's algorithm over `items`; answers the requests that failed
-- all their attempts.
local function run_cookbook(s, name, items, stream)
  local p = PROVIDERS[name]
  local url = s:url(p.path)
  local capacity, limit_of = {}, {}
  for limit, option in pairs(p.named) do
    limit_of[limit] = p.limits[option]
    capacity[limit] = p.limits[option]
  end
  local function estimate(item)
    local prompt = math.ceil(item.chars / 4)
    if name == "openai" then return { requests = 1, tokens = prompt + item.max_tokens } end
    return { requests = 1, input_tokens = prompt, output_tokens = item.max_tokens }
  end
  local retry_queue, next_index, next_request = {}, 1, nil
  local in_progress, failed, last_rate_limit_error = 0, 0, -math.huge
  local last_update = rw.now()

  local function call(request)
    local res, err = rw.fetch(url, { method = "POST", json = body(request.item, stream), stream = stream,
      max_retries = 0, on_retry = false })
    if res then
      drain(res, stream)
      in_progress = in_progress - 1
      return
    end
    if err.response and err.response.status == 429 then last_rate_limit_error = rw.now() end
    if request.attempts_left > 0 then
      retry_queue[#retry_queue + 1] = request
    else
      failed = failed + 1
      in_progress = in_progress - 1
    end
  end

  rw.run(function()
    while true do
      if not next_request then
        if #retry_queue > 0 then
          next_request = table.remove(retry_queue, 1)
        elseif next_index <= #items then
          local item = items[next_index]
          next_index = next_index + 1
          next_request = { item = item, cost = estimate(item), attempts_left = 5 }
          in_progress = in_progress + 1
        end
      end
      local now = rw.now()
      for limit, per_minute in pairs(limit_of) do
        capacity[limit] = math.min(capacity[limit] + per_minute * (now - last_update) / 60, per_minute)
      end
      last_update = now
      if next_request then
        local fits = true
        for limit, amount in pairs(next_request.cost) do
          if capacity[limit] < amount then fits = false end
        end
        if fits then
          for limit, amount in pairs(next_request.cost) do capacity[limit] = capacity[limit] - amount end
          next_request.attempts_left = next_request.attempts_left - 1
          rw.spawn(call, next_request)
          next_request = nil
        end
      end
      if in_progress == 0 then break end
      rw.sleep(0.001)
      local since = rw.now() - last_rate_limit_error
      if since < 15 then rw.sleep(15 - since) end
    end
  end)
  return failed
end

local function shell_quote(v)
  return "'" .. tostring(v):gsub("'", "'\\''") .. "'"
end

-- A child process of the Redis row: its half of the workload.
if os.getenv("BENCH_LLM_CHILD") then
  local name, stream, part = os.getenv("BENCH_LLM_CHILD"):match("^(%w+):(%w+):(%d)$")
  local items = {}
  for i, item in ipairs(workload(REQUESTS)) do
    if i % 2 == tonumber(part) then items[#items + 1] = item end
  end
  local failed = run_ratewise { base_url = os.getenv("BENCH_LLM_BASE"), provider = name,
    redis_url = os.getenv("BENCH_LLM_REDIS"), items = items, stream = stream == "stream",
    concurrency = math.floor(CONCURRENCY / 2) }
  print("failed " .. failed)
  os.exit(0)
end

-- The Redis row: two processes at once; nil and why when it cannot run.
local function run_shared(s, redis_url, name, stream)
  local interpreter = arg[-1] or "lua5.4"
  local procs = {}
  for part = 0, 1 do
    procs[#procs + 1] = assert(io.popen(table.concat({
      "BENCH_LLM_CHILD=" .. shell_quote(name .. ":" .. (stream and "stream" or "plain") .. ":" .. part),
      "BENCH_LLM_BASE=" .. shell_quote(s:url("")), "BENCH_LLM_REDIS=" .. shell_quote(redis_url),
      "BENCH_LLM_REQUESTS=" .. REQUESTS, shell_quote(interpreter), "bench/llm.lua", "2>&1" }, " ")))
  end
  local failed = 0
  for _, proc in ipairs(procs) do
    local out = proc:read("*a")
    proc:close()
    local n = tonumber(out:match("failed (%d+)"))
    if not n then error("bench/llm.lua child: " .. out) end
    failed = failed + n
  end
  return failed
end

local function redis_available()
  if not rw.features.redis then return nil, "ratewise built without Redis support" end
  if not os.execute("command -v redis-server >/dev/null 2>&1") then return nil, "no redis-server" end
  local redis = require "spec.support.redis"
  return redis.start()
end

local function row(label, r)
  return string.format("  %-44s %6.1f%%  %4d (%4.1f%%)  %6.1f s%s", label, 100 * r.share, r.limited,
    100 * r.limited / REQUESTS, r.seconds, r.failed > 0 and ("  " .. r.failed .. " failed") or "")
end

local items = workload(REQUESTS)
local s = support.start()
local redis, why_not_redis = redis_available()
local ok, err = pcall(function()
  print(string.format("bench-llm: %d chat requests, prompts of 200-6,000 characters, max_tokens 50-1,000, "
    .. "answers 10-100%% of it at %d tokens/s; the mock's buckets hold %d s of each limit", REQUESTS, SPEED, HOLD))
  for _, name in ipairs { "openai", "anthropic" } do
    local p = PROVIDERS[name]
    local limits = {}
    for limit, option in pairs(p.named) do limits[#limits + 1] = limit .. " " .. p.limits[option] .. "/min" end
    table.sort(limits)
    print(string.format("\n%s (%s; binding: %s)", name, table.concat(limits, ", "), p.binding))
    print(string.format("  %-44s %7s  %11s  %8s", "", "share", "429s", "time"))
    for _, stream in ipairs { false, true } do
      local kind = stream and "streamed" or "not streamed"
      local function contender(fn)
        s:reset()
        s:llm(p.path, mock_options(name))
        local t0 = rw.now()
        local failed = fn()
        return measure(s, name, rw.now() - t0, failed)
      end
      local ours = contender(function()
        return run_ratewise { base_url = s:url(""), provider = name, items = items, stream = stream,
          concurrency = CONCURRENCY }
      end)
      print(row("ratewise, " .. kind, ours))
      if COOKBOOK == "both" or (COOKBOOK == "plain" and not stream) then
        local theirs = contender(function() return run_cookbook(s, name, items, stream) end)
        print(row("cookbook algorithm, " .. kind, theirs))
        print(string.format("  %-44s %6.2fx  %4s         %6.2fx", "ratewise / cookbook", ours.share / theirs.share,
          "", ours.seconds / theirs.seconds))
      else
        print("  cookbook algorithm, " .. kind .. ": not run (BENCH_LLM_COOKBOOK=both runs it)")
      end
      if redis then
        print(row("ratewise, 2 processes via Redis, " .. (stream and "str." or "not str."),
          contender(function() return run_shared(s, redis.url, name, stream) end)))
      else
        print("  ratewise, 2 processes via Redis: not run (" .. tostring(why_not_redis) .. ")")
      end
    end
  end
end)
if redis then redis:destroy() end
s:stop()
if not ok then error(err, 0) end
