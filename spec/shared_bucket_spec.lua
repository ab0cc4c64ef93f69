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

  it("takes, counts tokens and refuses what it cannot serve, across requests", function()
    local res = assert(rw.fetch(n:url("/tokens"), { on_retry = false }))
    assert.equal("true false 1.00", res.body:match("^(.-)\n"))
  end)

  it("names a lua_shared_dict that is not declared, and how to declare it", function()
    local res = assert(rw.fetch(n:url("/misuse"), { on_retry = false }))
    assert.matches("no lua_shared_dict named 'nope' %(declare it in nginx.conf's http block: "
      .. "lua_shared_dict nope 1m;%)", res.body)
    assert.error_matches(function() rw.shared_bucket { dict = "limits", capacity = 1, rate = 1 } end,
      "no lua_shared_dict named 'limits'", 1, true)
    assert.error_matches(function() rw.shared_bucket { dict = "limits", capacity = 1, rate = 1, burst = 2 } end,
      "unknown option 'burst'", 1, true)
  end)
end)
