-- The line a retry writes (fetch.report's default on_retry) names where its
-- wait came from: a policy whose wait is the answer's Retry-After (a
-- provider's, reading it as the server asked) is named `retry-after`, as a
-- call without a policy names it; `policy` is left for a wait only the
-- policy knew (a provider's own reset headers). Against the loopback server.
local rw = require "ratewise"
local server = require "spec.support.server"

describe("the retry line", function()
  local s, lines
  setup(function() s = server.start() end)
  teardown(function()
    rw.configure { log = true }
    s:stop()
  end)
  before_each(function()
    s:reset()
    lines = {}
    rw.configure { log = function(line) lines[#lines + 1] = line end }
  end)

  local function retried(policy, headers)
    s:script("/r", { { status = 429, headers = headers }, { status = 200, body = "ok" } })
    local res, err = rw.fetch(s:url("/r"), { policy = policy, max_elapsed = 10 })
    assert.is_not_nil(res, tostring(err))
    assert.equal(200, res.status)
    assert.equal(2, #s:log("/r"))
    assert.equal(1, #lines, table.concat(lines, "\n"))
    return lines[1]
  end

  it("names retry-after when the policy's wait is the answer's Retry-After", function()
    local line = retried(rw.providers.openai, { ["Retry-After"] = "1" })
    assert.matches("retrying GET http://127.0.0.1:%d+/r in 1%.%d%d s %(429, attempt 1/%d+, retry%-after%)", line)
  end)

  it("names retry-after without a policy too", function()
    local line = retried(nil, { ["Retry-After"] = "1" })
    assert.matches("%(429, attempt 1/%d+, retry%-after%)", line)
  end)

  it("names the policy for a wait only the policy read (OpenAI's reset headers)", function()
    local line = retried(rw.providers.openai, { ["x-ratelimit-reset-requests"] = "1s" })
    assert.matches("%(429, attempt 1/%d+, policy%)", line)
  end)
end)
