-- `ratewise batch` against an LLM API's limits (--provider openai or
-- anthropic with --rpm, --tpm, --itpm, --otpm), run as a user runs it,
-- against the test server's mock of both APIs' rate limits
-- (spec/support/llm_mock.py): what the server counted, and what each
-- result line says of its answer's usage.
local server = require "spec.support.server"
local cli = require "spec.support.cli"
local cjson = require "cjson"

local format = string.format
local OPENAI, ANTHROPIC = "/v1/chat/completions", "/v1/messages"

local ratewise, write_file, json_lines = cli.ratewise, cli.write_file, cli.json_lines

-- A JSONL of `count` chat requests to url, prompts of 400-2,300
-- characters and max_tokens 200-580, with a secret header each.
local function chat_lines(url, count, provider, fields)
  local lines = {}
  for i = 1, count do
    local body = { model = "m", max_tokens = 200 + (i * 37) % 400,
      messages = { { role = "user", content = string.rep(string.char(97 + i % 26), 400 + (i * 97) % 1900) } } }
    for k, v in pairs(fields or {}) do body[k] = v end
    local headers = provider == "openai" and { Authorization = "Bearer sk-secret-" .. i }
      or { ["x-api-key"] = "sk-ant-secret-" .. i, ["anthropic-version"] = "2023-06-01" }
    lines[i] = cjson.encode({ url = url, id = "chat-" .. i, json = body, headers = headers })
  end
  return table.concat(lines, "\n") .. "\n"
end

describe("ratewise batch with an LLM API's limits", function()
  local s

  -- The result lines of a batch of n that all succeeded, once the server
  -- has answered each of them, with at most one 429; and what it counted.
  local function all_answered(n, out, err, code, path)
    assert.equal(0, code, err)
    local rows = json_lines(out)
    assert.equal(n, #rows)
    local counts = s:llm_counts(path).m
    assert.equal(n, counts.ok)
    assert.is_true(counts.limited <= 1, "the server answered 429 " .. counts.limited .. " times")
    return rows, counts
  end

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  -- The mock's buckets hold 3 s of each limit, as ratewise's do: the
  -- limits bind over the run (the input tokens most), so a client that
  -- did not keep to them would be answered 429.
  local ANTHROPIC_LIMITS = { rpm = 600, itpm = 60000, otpm = 60000 }

  local function anthropic_run(fields)
    s:llm(ANTHROPIC, { provider = "anthropic", models = { m = ANTHROPIC_LIMITS }, hold = 3, use_min = 0.1,
      use_max = 1, chars_per_token = 4 })
    local file = write_file(chat_lines(s:url(ANTHROPIC), 20, "anthropic", fields))
    local out, err, code = ratewise(format("batch --provider anthropic --rpm %d --itpm %d --otpm %d --retries 5 "
      .. "--concurrency 6 --no-body --progress %s", ANTHROPIC_LIMITS.rpm, ANTHROPIC_LIMITS.itpm,
      ANTHROPIC_LIMITS.otpm, file))
    os.remove(file)
    return out, err, code
  end

  it("keeps 20 Anthropic chats within --rpm, --itpm and --otpm: all answered, each with its usage", function()
    local out, err, code = anthropic_run()
    local rows, counts = all_answered(20, out, err, code, ANTHROPIC)
    local input, output = 0, 0
    for i, row in ipairs(rows) do
      assert.is_true(row.ok, out)
      assert.equal("chat-" .. i, row.id)
      assert.is_number(row.usage.input_tokens)
      assert.is_number(row.usage.output_tokens)
      input, output = input + row.usage.input_tokens, output + row.usage.output_tokens
    end
    -- the usage written is what the server answered
    assert.same({ input = input, output = output }, counts.used)
    -- the limits bound: 20 requests' input tokens are more than the 3 s the
    -- buckets hold, and went no faster than --itpm
    assert.is_true(input > ANTHROPIC_LIMITS.itpm / 20, tostring(input))
    local seconds = counts.last - counts.first
    assert.is_true(seconds >= (input - ANTHROPIC_LIMITS.itpm / 20) / (ANTHROPIC_LIMITS.itpm / 60) * 0.9,
      format("%d input tokens in %.2f s", input, seconds))
    -- no secret reaches the results or stderr
    assert.is_nil(out:find("secret", 1, true))
    assert.is_nil(err:find("secret", 1, true))
    -- the bar and the summary say the tokens taken a minute
    assert.matches("in +[%d.]+k?/min out +[%d.]+k?/min", err)
    assert.matches("20 requests in .*; in [%d.]+k? out [%d.]+k? tokens taken", err)
  end)

  it("writes a streamed answer's usage from its events", function()
    local out, err, code = anthropic_run({ stream = true })
    local rows, counts = all_answered(20, out, err, code, ANTHROPIC)
    local input, output = 0, 0
    for _, row in ipairs(rows) do
      input, output = input + row.usage.input_tokens, output + row.usage.output_tokens
    end
    assert.same({ input = input, output = output }, counts.used)
  end)

  it("keeps OpenAI chats within --rpm and --tpm, with each answer's usage", function()
    local limits = { rpm = 600, tpm = 120000 }
    s:llm(OPENAI, { provider = "openai", models = { m = limits }, hold = 3, use_min = 0.1, use_max = 1 })
    local file = write_file(chat_lines(s:url(OPENAI), 12, "openai"))
    local out, err, code = ratewise(format("batch --provider openai --rpm %d --tpm %d --retries 5 --concurrency 6 "
      .. "--no-body %s", limits.rpm, limits.tpm, file))
    os.remove(file)
    local rows, counts = all_answered(12, out, err, code, OPENAI)
    local prompt = 0
    for _, row in ipairs(rows) do
      assert.is_number(row.usage.completion_tokens)
      prompt = prompt + row.usage.prompt_tokens
    end
    assert.equal(counts.used.input, prompt)
    assert.matches("tokens [%d.]+k? tokens taken", err)
  end)

  it("draws the run in --timeline FILE.svg: the rate of each limit, every 429 and every wait", function()
    -- --tpm says four times what the server allows: its 429s, and the
    -- retries' waits, are in the picture beside what was taken
    local server_limits, stated = { rpm = 600, tpm = 60000 }, { rpm = 600, tpm = 240000 }
    s:llm(OPENAI, { provider = "openai", models = { m = server_limits }, hold = 3, use_min = 0.1, use_max = 1 })
    local file = write_file(chat_lines(s:url(OPENAI), 12, "openai"))
    local svg_file = os.tmpname()
    local _, err, code = ratewise(format("batch --provider openai --rpm %d --tpm %d --retries 8 --concurrency 6 "
      .. "--no-body --timeline %s %s", stated.rpm, stated.tpm, svg_file, file))
    os.remove(file)
    assert.equal(0, code, err)
    local svg = cli.slurp(svg_file)
    local counts = s:llm_counts(OPENAI).m
    assert.equal(12, counts.ok)
    assert.is_true(counts.limited > 0, "the server answered no 429: nothing to draw")
    -- one well-formed document: every element opened is closed
    assert.matches("^<svg xmlns=\"http://www.w3.org/2000/svg\"", svg)
    assert.matches("</svg>\n$", svg)
    local opened = select(2, svg:gsub("<%a[^>]*[^/]>", ""))
    local closed = select(2, svg:gsub("</%a+>", ""))
    assert.equal(opened, closed)
    -- a panel for each limit, its line at the limit stated, and what was
    -- taken: each request sent (retries too), and OpenAI's estimates,
    -- which it never corrects
    local panels = {}
    for name, taken, body in svg:gmatch('<g class="panel" data%-limit="([%w_]+)" data%-taken="([%d.]+)">(.-)</g>') do
      panels[name] = { taken = tonumber(taken), limit = tonumber(body:match('class="limit" data%-per%-minute="(%d+)"')),
        points = select(2, body:gsub("%d,%d", "")) }
    end
    assert.same({ "requests", "tokens" }, (function()
      local names = {}
      for name in pairs(panels) do names[#names + 1] = name end
      table.sort(names)
      return names
    end)())
    assert.equal(stated.rpm, panels.requests.limit)
    assert.equal(stated.tpm, panels.tokens.limit)
    assert.equal(counts.ok + counts.limited, panels.requests.taken)
    assert.is_true(panels.tokens.points > 100, "the tokens' rate has " .. panels.tokens.points .. " points")
    -- a tick for each 429 the server answered, and a bar for each retry
    local ticks = 0
    for n in svg:gmatch('class="throttle" data%-count="(%d+)"') do ticks = ticks + tonumber(n) end
    assert.equal(counts.limited, ticks)
    local retry_waits = select(2, svg:gsub('class="wait retry"', ""))
    assert.equal(counts.limited, retry_waits)
    assert.matches(format("%d throttled %%(429%%), %d retry waits", counts.limited, counts.limited), svg)
    -- no secret reaches the picture
    assert.is_nil(svg:find("secret", 1, true))
  end)

  it("refuses a --timeline it cannot write before anything is sent, and --timeline outside batch", function()
    s:script("/t", { { status = 200 } })
    local file = write_file(s:url("/t") .. "\n")
    local _, err, code = ratewise("batch --rate 10 --timeline /nonexistent/dir/run.svg " .. file)
    os.remove(file)
    assert.equal(23, code, err)
    assert.matches("cannot write the timeline: /nonexistent/dir/run.svg", err, 1, true)
    assert.equal(0, #s:log("/t"))
    _, err, code = ratewise("get --timeline run.svg " .. s:url("/t"))
    assert.equal(2, code)
    assert.matches("option --timeline is batch's", err, 1, true)
    -- the input or the results file named as the timeline: refused before either is touched
    local input = write_file(s:url("/t") .. "\n")
    _, err, code = ratewise("batch --timeline " .. input .. " " .. input)
    assert.equal(2, code)
    assert.matches("option --timeline names the input file", err, 1, true)
    assert.equal(s:url("/t") .. "\n", cli.slurp(input))
    _, err, code = ratewise("batch -o same.jsonl --timeline same.jsonl " .. s:url("/t"))
    assert.equal(2, code)
    assert.matches("option --timeline names the results file (-o)", err, 1, true)
  end)

  it("takes a request larger than a bucket holds, waiting for it as a minute's limit allows", function()
    -- (--otpm 12000 holds 600 tokens: each max_tokens of 1,000 is more)
    s:llm(ANTHROPIC, { provider = "anthropic", models = { m = { rpm = 600, itpm = 600000, otpm = 60000 } },
      use_min = 0.5, use_max = 0.5 })
    local lines = {}
    for i = 1, 3 do
      lines[i] = cjson.encode({ url = s:url(ANTHROPIC), json = { model = "m", max_tokens = 1000,
        messages = { { role = "user", content = "hi " .. i } } } })
    end
    local file = write_file(table.concat(lines, "\n") .. "\n")
    local started = os.time()
    local out, err, code = ratewise("batch --provider anthropic --rpm 600 --itpm 600000 --otpm 12000 --concurrency 1 "
      .. "--no-body "
      .. file)
    os.remove(file)
    assert.equal(0, code, err)
    assert.equal(3, #json_lines(out))
    local counts = s:llm_counts(ANTHROPIC).m
    assert.equal(3, counts.ok)
    -- 600 tokens in the bucket, then 400 of debt, settled to the 500 used
    -- (100 left): the 2nd and the 3rd, one at a time, each wait 500 / 200
    -- tokens a second
    local seconds = counts.last - counts.first
    assert.is_true(seconds >= 4.5 and seconds <= 7.5, tostring(seconds))
    assert.is_true(os.time() - started <= 20)
  end)

  describe("says what is wrong with the limits' flags, naming the flag", function()
    local file
    setup(function() file = write_file('{"url": "http://127.0.0.1:9/"}\n') end)
    teardown(function() os.remove(file) end)

    local cases = {
      { "--provider anthropic --rpm 50 --tpm 1000", "option %-%-tpm is OpenAI's tokens a minute" },
      { "--provider openai --rpm 50 --itpm 1000 --otpm 100", "option %-%-itpm is Anthropic's" },
      { "--provider anthropic --itpm 1000", "option %-%-itpm needs %-%-otpm too" },
      { "--provider anthropic --otpm 1000", "option %-%-otpm needs %-%-itpm too" },
      { "--provider openai --rpm 50 --rate 2", "give %-%-rate or option %-%-rpm, not both" },
      { "--rpm 50", "option %-%-rpm needs %-%-provider openai or %-%-provider anthropic" },
      { "--provider github --tpm 50", "option %-%-tpm needs %-%-provider openai or %-%-provider anthropic, "
        .. "whose limits it sets %(got %-%-provider github%)" },
      { "--provider openai --tpm 0", "option %-%-tpm needs a positive number %(got \"0\"%)" },
      { "--provider openai --rpm -5", "option %-%-rpm needs a positive number" },
      { "--provider anthropic --itpm 100 --otpm x", "option %-%-otpm needs a positive number %(got \"x\"%)" },
    }
    for _, case in ipairs(cases) do
      it(case[1], function()
        local out, err, code = ratewise("batch " .. case[1] .. " " .. file)
        assert.equal(2, code, err)
        assert.equal("", out)
        assert.matches("ratewise: " .. case[2], err)
      end)
    end

    it("--rpm for get", function()
      local _, err, code = ratewise("get --provider openai --rpm 5 http://127.0.0.1:9/")
      assert.equal(2, code)
      assert.matches("option %-%-rpm is batch's", err)
    end)
  end)
end)
