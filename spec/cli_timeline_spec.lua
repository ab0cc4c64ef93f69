-- The picture `ratewise batch --timeline` draws (lua/ratewise/cli/timeline.lua),
-- fed what a careless input or a hostile server can make of a run: counts
-- no API could have, and more waits and 429s than the picture has pixels.
-- (spec/cli_llm_spec.lua checks it against a run it scripts.)
local timeline = require "ratewise.cli.timeline"

local function well_formed(svg)
  local opened = select(2, svg:gsub("<%a[^>]*[^/]>", ""))
  local closed = select(2, svg:gsub("</%a+>", ""))
  return opened == closed and svg:match("^<svg ") ~= nil and svg:match("</svg>\n$") ~= nil
end

describe("the --timeline picture", function()
  it("leaves out a count or a wait no run could have, instead of drawing infinite rates for ever", function()
    local tl = timeline.new({ { name = "requests", title = "requests", per_minute = 60 },
      { name = "tokens", title = "tokens", per_minute = 1000 } }, 0)
    tl:took("requests", 1, 1)
    tl:took("tokens", 1e308, 2) -- a max_tokens of 1e308
    tl:took("tokens", 0 / 0, 3)
    tl:took("tokens", 500, 4)
    tl:waited("retry", 5, math.huge)
    tl:waited("retry", 5, 1.5)
    local svg = tl:svg(10)
    assert.is_true(well_formed(svg))
    assert.matches('data%-limit="tokens" data%-taken="500"', svg)
    assert.is_nil(svg:find("inf", 1, true))
    assert.is_nil(svg:find("nan", 1, true))
    assert.equal(1, select(2, svg:gsub('class="wait retry"', "")))
  end)

  it("draws a million waits and 429s in a picture of bounded size, counting every 429", function()
    local tl = timeline.new({ { name = "requests", title = "requests" } }, 0)
    for i = 1, 1000000 do
      local at = i / 10000
      tl:took("requests", 1, at)
      tl:throttled(at)
      tl:waited(i % 2 == 0 and "retry" or "limit", at, (i % 97) / 10)
    end
    local svg = tl:svg(100)
    assert.is_true(well_formed(svg))
    assert.is_true(#svg < 2 * 1024 * 1024, #svg .. " bytes")
    local ticks = 0
    for n in svg:gmatch('class="throttle" data%-count="(%d+)"') do ticks = ticks + tonumber(n) end
    assert.equal(1000000, ticks)
    assert.equal(2000, select(2, svg:gsub('class="wait ', "")))
    assert.matches("(the 2000 longest drawn)", svg, 1, true)
  end)
end)
