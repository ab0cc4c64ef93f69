-- rw.shared_bucket in a real nginx with several workers (Debian's, with
-- the Lua module on LuaJIT): one limit in a lua_shared_dict, whichever
-- worker a request lands on, as the test server sees it.
local rw = require "ratewise"
local server = require "spec.support.server"
local nginx = require "spec.support.nginx"

local escape = nginx.escape

local SERVER = [[
    location = /go {
      keepalive_timeout 0; # a connection a request: the kernel spreads them over the workers
      content_by_lua_block {
        local rw = require "ratewise"
        local limit = rw.shared_bucket { dict = "limits", key = "api", capacity = 1, rate = 50 }
        local res, err = rw.fetch(ngx.unescape_uri(ngx.var.arg_url), { limiter = limit, on_retry = false,
          max_retries = 0 })
        ngx.say(ngx.worker.id(), " ", res and res.status or err.kind)
      }
    }
    location = /tokens {
      content_by_lua_block {
        local rw = require "ratewise"
        local limit = rw.shared_bucket { dict = "limits", key = "t", capacity = 3, rate = 1 }
        local ok1, ok2 = limit:take(2), limit:take(2)
        ngx.say(tostring(ok1), " ", tostring(ok2), " ", string.format("%.2f", limit:tokens()))
      }
    }
    location = /hammer {
      keepalive_timeout 0;
      content_by_lua_block {
        local rw = require "ratewise"
        local core = require "ratewise.core"
        local limit = rw.shared_bucket { dict = "limits", key = "hammer", capacity = 1, rate = 200 }
        -- Lua that runs a while without yielding, as a handler may: the
        -- worker's cached clock (ngx.now) falls behind the others'.
        local started = core.now()
        while core.now() - started < 0.03 do end
        local granted = 0
        while core.now() - started < 0.3 do
          if limit:take() then granted = granted + 1 end
        end
        ngx.say(granted, " ", string.format("%.6f %.6f", started, core.now()))
      }
    }
    location = /debit {
      content_by_lua_block {
        local rw = require "ratewise"
        local limit = rw.shared_bucket { dict = "limits", key = "d", capacity = 10, rate = 10, sync_horizon = 2 }
        limit:debit(15) -- more than it holds, taken whole
        local after_debit = limit:tokens()
        limit:refund(15)
        local after_refund = limit:tokens()
        limit:debit(500) -- believed up to the horizon: no token for 2 s, as a local bucket's floor
        limit:debit(500) -- and debits do not stack past it
        ngx.say(string.format("%.1f %.1f %.1f", after_debit, after_refund, limit:tokens()))
      }
    }
    location = /misuse {
      content_by_lua_block {
        local rw = require "ratewise"
        local ok, err = pcall(rw.shared_bucket, { dict = "nope", capacity = 1, rate = 1 })
        ngx.say(err)
      }
    }
]]

describe("rw.shared_bucket", function()
  local s, n

  setup(function()
    s = server.start()
    n = nginx.start { http = "lua_shared_dict limits 1m;", server = SERVER, workers = 4 }
  end)
  teardown(function()
    if n then n:stop() end
    s:stop()
  end)
  before_each(function() s:reset() end)

  it("is one limit for every worker of an nginx: the server sees 50 a second", function()
    local url = n:url("/go?url=" .. escape(s:url("/sb")))
    local workers, answers = {}, {}
    local stop_at = rw.now() + 2
    rw.run(function()
      for _ = 1, 16 do
        rw.spawn(function()
          while rw.now() < stop_at do
            local res = assert(rw.fetch(url, { on_retry = false, max_retries = 0, timeout = 10 }))
            local worker, outcome = res.body:match("^(%d+) (%S+)")
            workers[worker] = true
            answers[outcome] = (answers[outcome] or 0) + 1
          end
        end)
      end
    end)
    local seen = 0
    for _ in pairs(workers) do seen = seen + 1 end
    assert.is_true(seen >= 2, "requests landed on " .. seen .. " worker(s)")
    assert.same({ "200" }, (function() local k = {} for a in pairs(answers) do k[#k + 1] = a end return k end)())
    local log = s:log("/sb")
    local rate = (#log - 1) / (log[#log].t - log[1].t)
    assert.is_true(math.abs(rate - 50) <= 2.5, string.format("%d requests, %.2f a second", #log, rate))
  end)

  it("grants no token twice when workers whose cached clocks differ take at once", function()
    -- Workers that each take as fast as they can for a while, started
    -- apart, so that their clocks are stale by different amounts. A lock
    -- that one of them set with its stale clock, and that another took as
    -- expired while it was held, let both grant the same token.
    for round = 1, 4 do
      local results = {}
      rw.run(function()
        for i = 1, 8 do
          rw.spawn(function()
            rw.sleep(i * 0.012)
            local res = assert(rw.fetch(n:url("/hammer"), { on_retry = false, timeout = 10 }))
            results[#results + 1] = res.body
          end)
        end
      end)
      local granted, first, last = 0, math.huge, 0
      for _, body in ipairs(results) do
        local count, from, to = body:match("^(%d+) (%S+) (%S+)")
        granted = granted + tonumber(count)
        first, last = math.min(first, tonumber(from)), math.max(last, tonumber(to))
      end
      -- a full bucket's one token, then 200 a second
      local most = 1 + math.floor(200 * (last - first))
      assert.is_true(granted <= most, string.format("round %d: %d tokens granted in %.3f s, at most %d",
        round, granted, last - first, most))
    end
  end)

  it("takes, counts tokens and refuses what it cannot serve, across requests", function()
    local res = assert(rw.fetch(n:url("/tokens"), { on_retry = false }))
    assert.equal("true false 1.00", res.body:match("^(.-)\n"))
  end)

  it("takes a debit into debt, up to its sync_horizon, and a refund larger than it holds", function()
    local res = assert(rw.fetch(n:url("/debit"), { on_retry = false }))
    local after_debit, after_refund, capped = res.body:match("^(%S+) (%S+) (%S+)\n")
    assert.near(-5, tonumber(after_debit), 0.2)
    assert.near(10, tonumber(after_refund), 0.2)
    assert.near(-19, tonumber(capped), 0.3)
  end)

  it("names a lua_shared_dict that is not declared, and how to declare it", function()
    local res = assert(rw.fetch(n:url("/misuse"), { on_retry = false }))
    assert.matches("no lua_shared_dict named 'nope' %(declare it in nginx.conf's http block: "
      .. "lua_shared_dict nope 1m;%)", res.body)
    -- outside OpenResty (this process): there is no dict to declare
    assert.error_matches(function() rw.shared_bucket { dict = "limits", capacity = 1, rate = 1 } end,
      "this is not OpenResty: to share a limit between processes or threads here, use rw.redis_bucket", 1, true)
    assert.error_matches(function() rw.shared_bucket { dict = "limits", capacity = 1, rate = 1, burst = 2 } end,
      "unknown option 'burst'", 1, true)
  end)
end)
