-- The Lua examples run as a reader would run them, and say what they should.
local subprocess = require "spec.support.subprocess"

local function run(example)
  local out, code = subprocess.shell(subprocess.env .. "timeout 60 " .. subprocess.lua .. " examples/" .. example)
  assert.equal(0, code, example .. " failed:\n" .. out)
  return out
end

describe("examples", function()
  it("fanout.lua keeps three APIs under their limits at once", function()
    local out = run("fanout.lua")
    assert.matches("search%s+12/12 succeeded", out)
    assert.matches("billing%s+6/6 succeeded", out)
    assert.matches("weather%s+20/20 succeeded", out)
    assert.matches("all 38 requests to 3 APIs took", out)
  end)

  it("luv_loop.lua drives ratewise from a libuv loop through the pollable", function()
    local out = run("luv_loop.lua")
    -- whichever of the three reaches the server first meets its 429
    local _, twice = out:gsub("request %d: 200 after 2 attempts", "")
    local _, once = out:gsub("request %d: 200 after 1 attempts", "")
    assert.equal(1, twice, out)
    assert.equal(2, once, out)
    local seconds, ticks = out:match("done in ([%d.]+) s; the luv timer ticked (%d+) times")
    assert.is_true(tonumber(seconds) >= 1 and tonumber(seconds) < 3, out)
    assert.is_true(tonumber(ticks) >= 8, out) -- the loop ran its own timer during the Retry-After
  end)

  it("game_loop.lua keeps its frame rate while requests wait", function()
    local out = run("game_loop.lua")
    for player = 1, 4 do assert.matches("player " .. player .. " got %[alice 120", out) end
    local fps = tonumber(out:match("%(([%d.]+) fps%)"))
    assert.is_true(fps > 50, out)
  end)

  it("openai_like.lua waits out retry-after-ms and stops on x-should-retry: false", function()
    local out = run("openai_like.lua")
    assert.matches("request 1: Hello!", out)
    assert.matches("waiting 1%.[234]%d s after 429 %(source: policy%)", out) -- 1.2 s, spread up to 20%
    assert.matches("request 2: Second answer %(2 attempts", out)
    assert.matches("request 3: terminal: invalid request shape", out)
    -- the tokens limit took the provider's estimate of each attempt (and refilled meanwhile)
    local left = tonumber(out:match("tokens per minute: (%d+) of 4000 left"))
    assert.is_true(left ~= nil and left < 4000, out)
    assert.is_nil(out:find("sk-demo-not-a-real-key", 1, true))
  end)

  it("github_like.lua waits for the quota's reset and paces the search route", function()
    local out = run("github_like.lua")
    assert.matches("403: waiting [%d.]+ s %(retry%-after%)", out)
    assert.matches("GET /repos/lua/lua %(quota%)%s+200 after 2 attempt", out)
    assert.matches("GET /repos/lua/luarocks%s+200 after 2 attempt", out)
    local t1 = tonumber(out:match("GET /search/code #1 .- at ([%d.]+) s"))
    local t3 = tonumber(out:match("GET /search/code #3 .- at ([%d.]+) s"))
    assert.is_true(t3 - t1 >= 0.99, out) -- two more tokens at 2 per second, at least
    assert.is_nil(out:find("ghp_demo_not_a_real_token", 1, true))
  end)

  it("paginate.lua follows the Link header through every page, waiting out the secondary limit", function()
    local out = run("paginate.lua")
    assert.matches("403: waiting [%d.]+ s %(retry%-after%)", out)
    assert.matches("page 2 issues, 1 attempt%(s%).-page 2 issues, 2 attempt%(s%).-page 1 issues, 1 attempt%(s%)", out)
    assert.matches("issues 1 2 3 4 5\n", out)
    assert.matches("requests 3, attempts 4, retries 1", out)
    assert.is_nil(out:find("ghp_demo_not_a_real_token", 1, true))
  end)
end)
