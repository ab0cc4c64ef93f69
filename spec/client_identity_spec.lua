-- rw.client's de-duplication and cache keyed by a request's identity (the
-- options that change what is sent or how the answer is read: the client
-- certificate, verify_tls, decompress...), each caller with its own copy,
-- and what RFC 9111 forbids a private cache to keep. Against real loopback
-- servers (HTTP, and HTTPS with a CA of its own), asserting what they saw.
-- Each defect found in review has a case here that failed before its fix.
local rw = require "ratewise"
local server = require "spec.support.server"

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- A second client certificate signed by the TLS server's CA (CN given).
local function another_client_cert(s, cn)
  local dir = s.ca_dir
  local run = "cd " .. shell_quote(dir) .. " && ( openssl req -newkey rsa:2048 -nodes -subj /CN=" .. cn
    .. " -keyout " .. cn .. ".key -out " .. cn .. ".csr && openssl x509 -req -in " .. cn .. ".csr -CA ca.pem"
    .. " -CAkey ca.key -CAcreateserial -days 2 -out " .. cn .. ".pem ) >/dev/null 2>&1"
  local ok = os.execute(run)
  assert(ok == true or ok == 0, "openssl failed")
  return dir .. "/" .. cn .. ".pem", dir .. "/" .. cn .. ".key"
end

describe("rw.client's identity of a request", function()
  describe("over TLS", function()
    local tls

    setup(function() tls = server.start_tls_ca() end)
    teardown(function() tls:stop() end)
    before_each(function() tls:reset() end)

    -- (The server's control requests carry no certificate: this one does
    -- not ask for any, and sees the two requests apart only by their count.)
    it("does not share one transfer between GETs made with different client certificates", function()
      local other_cert, other_key = another_client_cert(tls, "other-account")
      tls:script("/me", { { status = 200, body = "first", delay = 0.2 }, { status = 200, body = "second" } })
      local c = rw.client { base_url = tls.base, ca_file = tls.ca_file, on_retry = false }
      local bodies = {}
      rw.run(function()
        rw.spawn(function()
          bodies.one = assert(c:get("/me", { client_cert = tls.client_cert, client_key = tls.client_key })).body
        end)
        rw.spawn(function()
          bodies.other = assert(c:get("/me", { client_cert = other_cert, client_key = other_key })).body
        end)
      end)
      assert.equal(2, #tls:log("/me"))
      assert.are_not.equal(bodies.one, bodies.other)
      assert.equal(0, c:stats().deduped)
    end)

    it("does not serve an answer fetched without verifying TLS to a call that verifies", function()
      local c = rw.client { base_url = tls.base, cache = { ttl = 10 }, on_retry = false, max_retries = 0 }
      assert(c:get("/page", { verify_tls = false }))
      assert(c:get("/page", { verify_tls = false })) -- the same request: cached
      assert.equal(1, #tls:log("/page"))
      -- verifying, without the server's CA: the certificate is refused
      local res, err = c:get("/page")
      assert.is_nil(res)
      assert.is_not_nil(err)
      -- verifying against its CA: a request of its own
      assert(c:get("/page", { ca_file = tls.ca_file }))
      assert.equal(2, #tls:log("/page"))
      assert.equal(1, c:stats().cache_hits)
    end)
  end)

  describe("over HTTP", function()
    local s

    setup(function() s = server.start() end)
    teardown(function() s:stop() end)
    before_each(function() s:reset() end)

    local function new(extra)
      local o = { base_url = s.base, on_retry = false }
      for k, v in pairs(extra or {}) do o[k] = v end
      return rw.client(o)
    end

    it("does not serve a body left compressed (decompress = false) to a call that decodes", function()
      s:script("/gz", { { status = 200, body = "hello, decoded", encoding = "gzip" } })
      local c = new { cache = { ttl = 10 } }
      local raw = assert(c:get("/gz", { decompress = false }))
      assert.are_not.equal("hello, decoded", raw.body)
      assert.equal("gzip", raw.headers["content-encoding"])
      local decoded = assert(c:get("/gz"))
      assert.equal("hello, decoded", decoded.body)
      assert.equal(2, #s:log("/gz"))
      -- and each is kept under its own identity
      assert.equal(raw.body, assert(c:get("/gz", { decompress = false })).body)
      assert.equal("hello, decoded", assert(c:get("/gz")).body)
      assert.equal(2, #s:log("/gz"))
    end)

    it("gives each cache hit its own copy: a caller's edits are not served to the next", function()
      s:script("/doc", { { status = 200, body = "original", headers = { ["X-Version"] = "1" } } })
      local c = new { cache = { ttl = 10 } }
      local first = assert(c:get("/doc"))
      first.body = "edited"
      first.headers["x-version"] = "2"
      first.extra = true
      local second = assert(c:get("/doc"))
      assert.equal("original", second.body)
      assert.equal("1", second.headers["x-version"])
      assert.is_nil(rawget(second, "extra"))
      second.body = "edited again"
      second.headers["x-version"] = "3"
      local third = assert(c:get("/doc"))
      assert.equal("original", third.body)
      assert.equal("1", third.headers["x-version"])
      assert.equal(1, #s:log("/doc"))
    end)

    it("gives each caller that joined a request its own copy, whatever the first caller changes", function()
      s:script("/doc", { { status = 200, body = "original", delay = 0.15, headers = { ["X-Version"] = "1" } } })
      local c = new()
      local seen = {}
      rw.run(function()
        rw.spawn(function()
          local res = assert(c:get("/doc"))
          res.body = "edited"
          res.headers["x-version"] = "2"
        end)
        for i = 1, 2 do
          rw.spawn(function()
            local res = assert(c:get("/doc"))
            seen[i] = { res.body, res.headers["x-version"] }
            res.body = "edited by " .. i
          end)
        end
      end)
      assert.equal(1, #s:log("/doc"))
      assert.equal(2, c:stats().deduped)
      assert.same({ "original", "1" }, seen[1])
      assert.same({ "original", "1" }, seen[2])
    end)

    it("refuses a cache bound that is not a positive integer, naming it", function()
      for _, bad in ipairs { -1, 0, 1.5, 0 / 0, math.huge, "10", true } do
        local ok, err = pcall(rw.client, { base_url = s.base, cache = { ttl = 10, max_entries = bad } })
        assert.is_false(ok, tostring(bad) .. " was taken")
        assert.matches("option 'cache.max_entries' must be a positive integer", err, 1, true)
      end
      assert.error_matches(function() rw.client { base_url = s.base, cache = { ttl = 10, max_entry = 5 } } end,
        "client: unknown option 'cache.max_entry' (did you mean 'cache.max_entries'?)", 1, true)
      assert.error_matches(function() rw.client { base_url = s.base, cache = { max_entries = 5 } } end,
        "option 'cache'", 1, true)
    end)

    it("keeps at most max_entries = 1 entry, and goes on answering", function()
      local c = new { cache = { ttl = 10, max_entries = 1 } }
      assert(c:get("/a"))
      assert(c:get("/b"))
      assert(c:get("/b"))
      assert(c:get("/a"))
      assert.equal(2, #s:log("/a"))
      assert.equal(1, #s:log("/b"))
    end)

    it("keeps nothing RFC 9111 forbids a private cache: no-store, no-cache, Vary: * or on a field left out", function()
      s:script("/nostore", { { status = 200, headers = { ["Cache-Control"] = "private, no-store" } } })
      s:script("/nocache", { { status = 200, headers = { ["Cache-Control"] = "no-cache" } } })
      s:script("/star", { { status = 200, headers = { Vary = "*" } } })
      s:script("/ua", { { status = 200, headers = { Vary = "Accept, User-Agent" } } })
      s:script("/accept", { { status = 200, headers = { Vary = "Accept" } } })
      local c = new { cache = { ttl = 10 } }
      for _, path in ipairs { "/nostore", "/nocache", "/star", "/ua" } do
        assert(c:get(path))
        assert(c:get(path))
        assert.equal(2, #s:log(path), path)
      end
      -- a request that says no-store is not kept either
      assert(c:get("/plain", { headers = { ["Cache-Control"] = "no-store" } }))
      assert(c:get("/plain", { headers = { ["Cache-Control"] = "no-store" } }))
      assert.equal(2, #s:log("/plain"))
      -- Vary on a field the key holds: kept, one entry per value of it
      assert(c:get("/accept", { headers = { Accept = "text/plain" } }))
      assert(c:get("/accept", { headers = { Accept = "application/json" } }))
      assert(c:get("/accept", { headers = { accept = "text/plain" } }))
      assert.equal(2, #s:log("/accept"))
    end)

    it("keeps a response no longer than its max-age when that is shorter than the ttl", function()
      s:script("/short", { { status = 200, body = "one", headers = { ["Cache-Control"] = "max-age=1" } },
        { status = 200, body = "two" } })
      local c = new { cache = { ttl = 30 } }
      assert.equal("one", assert(c:get("/short")).body)
      assert.equal("one", assert(c:get("/short")).body)
      assert.equal(1, #s:log("/short"))
      rw.sleep(1.1)
      assert.equal("two", assert(c:get("/short")).body)
      assert.equal(2, #s:log("/short"))
    end)

    it("keeps nothing that is stale on arrival: max-age used up by its Age, an Expires past", function()
      s:script("/aged", { { status = 200, headers = { ["Cache-Control"] = "max-age=5", Age = "5" } } })
      s:script("/expired", { { status = 200, headers = { Expires = "0" } } })
      local c = new { cache = { ttl = 10 } }
      for _, path in ipairs { "/aged", "/expired" } do
        assert(c:get(path))
        assert(c:get(path))
        assert.equal(2, #s:log(path), path)
      end
    end)

    -- De-duplication hands one answer to identical requests in flight at
    -- once; a request's identity leaves User-Agent out, so a response that
    -- varies on it answers only the callers that sent the same one.
    it("does not hand an answer that varies on User-Agent to a caller that joined with another", function()
      local vary = { Vary = "User-Agent" }
      s:script("/v", { { status = 200, body = "first", delay = 0.15, headers = vary },
        { status = 200, body = "second", headers = vary } })
      local c = new()
      local got = {}
      rw.run(function()
        for i, agent in ipairs { "agent-a", "agent-b", "agent-a" } do
          rw.spawn(function()
            got[i] = assert(c:get("/v", { headers = { ["User-Agent"] = agent } })).body
          end)
        end
      end)
      assert.same({ "first", "second", "first" }, got)
      local log = s:log("/v")
      assert.equal(2, #log)
      assert.equal("agent-a", log[1].headers["user-agent"])
      assert.equal("agent-b", log[2].headers["user-agent"])
      assert.equal(1, c:stats().deduped)
    end)

    -- no-store forbids keeping, not sharing: the callers that joined sent
    -- the same request at the same time, and nothing outlives the call.
    it("hands an answer marked no-store to the identical requests in flight, and keeps it for none after", function()
      s:script("/private", { { status = 200, body = "mine", delay = 0.15,
        headers = { ["Cache-Control"] = "no-store" } } })
      local c = new { cache = { ttl = 10 } }
      local got = {}
      rw.run(function()
        for i = 1, 2 do rw.spawn(function() got[i] = assert(c:get("/private")).body end) end
      end)
      assert.same({ "mine", "mine" }, got)
      assert.equal(1, #s:log("/private"))
      assert(c:get("/private"))
      assert.equal(2, #s:log("/private"))
    end)

    -- A caller that joined an identical request, whose first caller is
    -- then cancelled, makes the request itself: with the credential its
    -- key was made of, not one put into the client's table meanwhile.
    it("sends what a joined request's key was made of when it has to make the request itself", function()
      s:script("/slow", { { status = 200, body = "slow", delay = 0.2 } })
      local h = { Authorization = "Bearer tenant-a" }
      local c = new { cache = { ttl = 30 }, headers = h }
      rw.run(function()
        local first = rw.spawn(function() return c:get("/slow") end)
        local second = rw.spawn(function() return c:get("/slow") end)
        rw.sleep(0.05)
        h.Authorization = "Bearer tenant-b"
        first:cancel()
        assert(second:join())
      end)
      local log = s:log("/slow")
      assert.equal(2, #log)
      assert.equal("Bearer tenant-a", log[1].headers.authorization)
      assert.equal("Bearer tenant-a", log[2].headers.authorization)
      -- and tenant-b's calls get tenant-b's own answer
      assert(c:get("/slow"))
      assert.equal(3, #s:log("/slow"))
      assert.equal("Bearer tenant-b", s:log("/slow")[3].headers.authorization)
    end)

    it("never caches an error", function()
      s:script("/flaky", { { status = 503 }, { status = 200, body = "fine" } })
      local c = new { cache = { ttl = 10 }, max_retries = 0 }
      local res, err = c:get("/flaky")
      assert.is_nil(res)
      assert.equal(503, err.status)
      assert.equal("fine", assert(c:get("/flaky")).body)
      assert.equal(2, #s:log("/flaky"))
    end)

    it("keeps no secret in the keys of its cache or of the requests in flight", function()
      s:script("/slow", { { status = 200, delay = 0.1 } })
      local token = "Bearer sk-very-secret-token"
      local c = new { headers = { Authorization = token }, cache = { ttl = 10 },
        proxy = "http://user:hunter2@127.0.0.1:" .. s.port }
      local keys = {}
      rw.run(function()
        rw.spawn(function() assert(c:get("/slow")) end)
        rw.spawn(function()
          for k in pairs(c.in_flight) do keys[#keys + 1] = k end
        end)
      end)
      for k in pairs(c.responses.entries) do keys[#keys + 1] = k end
      assert.equal(2, #keys)
      for _, k in ipairs(keys) do
        assert.is_nil(k:find("secret", 1, true))
        assert.is_nil(k:find("hunter2", 1, true))
        assert.is_nil(k:find("/slow", 1, true))
      end
      assert.equal(token, s:log("/slow")[1].headers.authorization)
    end)

    -- RFC 9111 5.2.2.2 and 4.2.4: once stale (max-age=0: at once), a
    -- must-revalidate response is not reused without validation, which this
    -- cache cannot do. Rails and others send exactly this for dynamic pages.
    it("does not serve a response marked max-age=0, must-revalidate from its cache", function()
      local revalidate = { ["Cache-Control"] = "private, max-age=0, must-revalidate" }
      s:script("/dyn", { { status = 200, body = "one", headers = revalidate }, { status = 200, body = "two" } })
      local c = new { cache = { ttl = 10 } }
      assert.equal("one", assert(c:get("/dyn")).body)
      assert.equal("two", assert(c:get("/dyn")).body)
      assert.equal(2, #s:log("/dyn"))
    end)

    -- The key is made from the header table when the call starts; fetch reads
    -- the table when the call's turn comes under `concurrency`. A credential
    -- changed meanwhile is sent, and its answer is kept under the key of the
    -- credential before.
    it("does not keep the answer to one credential under the key of another (concurrency wait)", function()
      s:script("/slow", { { status = 200, body = "slow", delay = 0.2 } })
      local h = { Authorization = "Bearer tenant-a" }
      local c = new { cache = { ttl = 30 }, dedupe = false, concurrency = 1, headers = h }
      rw.run(function()
        rw.spawn(function() assert(c:get("/slow")) end)
        rw.spawn(function() assert(c:get("/echo")) end) -- waits for its turn
        rw.sleep(0.05)
        h.Authorization = "Bearer tenant-b"
      end)
      h.Authorization = "Bearer tenant-a"
      local res = assert(c:get("/echo"))
      assert.equal("Bearer tenant-a", assert(res:json()).headers.authorization)
    end)

    -- request_key absorbs the header fields, then the options, with nothing
    -- between them: a header named like an option, with the option's value
    -- as text, reads as that option.
    it("does not take a header named like an option for the option (decompress)", function()
      s:script("/gz", { { status = 200, body = "hello, decoded", encoding = "gzip" } })
      local c = new { cache = { ttl = 10 } }
      assert.equal("hello, decoded", assert(c:get("/gz", { headers = { decompress = "false" } })).body)
      local raw = assert(c:get("/gz", { decompress = false }))
      assert.are_not.equal("hello, decoded", raw.body)
      assert.equal(2, #s:log("/gz"))
    end)

    -- request_key reads a nil body as "": libcurl sends an empty body with
    -- Content-Length: 0 and a Content-Type, no body without them.
    it("does not serve an OPTIONS without a body to one with an empty body (the server sees them apart)", function()
      local c = new { cache = { ttl = 10 } }
      assert(c:request("OPTIONS", "/echo"))
      assert(c:request("OPTIONS", "/echo", { body = "" }))
      local log = s:log("/echo")
      assert.equal(2, #log)
      assert.is_nil(log[1].headers["content-length"])
      assert.equal("0", log[2].headers["content-length"])
    end)

    -- rw.fetch takes options inherited through an __index table (a per-call
    -- table over a base); the client's _call copies the call's own fields
    -- with pairs, and a POST goes out without its body and its key.
    it("sends the options a call inherits through __index, as rw.fetch does", function()
      local base = { body = "payload", idempotency_key = "key-123" }
      local c = new()
      assert(c:post("/echo", setmetatable({}, { __index = base })))
      assert(rw.fetch(s.base .. "/echo", setmetatable({ method = "POST", on_retry = false }, { __index = base })))
      local log = s:log("/echo")
      assert.equal(2, #log)
      assert.equal("payload", log[2].body) -- rw.fetch
      assert.equal("key-123", log[2].headers["idempotency-key"])
      assert.equal("payload", log[1].body) -- the client
      assert.equal("key-123", log[1].headers["idempotency-key"])
    end)

    -- A host's own runner of plain coroutines, whose code waits through the
    -- per-call `sleep` option (it yields to the runner). The client's own
    -- waits (joining an identical request in flight, a turn under
    -- `concurrency`) ignore that option: outside a task they block the thread
    -- in the engine's poll, so the runner never resumes the coroutine they
    -- wait for, and they wait out max_elapsed.
    local function run_in_host_runner(c, opts_for)
      local function host_sleep(seconds) coroutine.yield("nap", seconds) end
      local results, took, cos = {}, {}, {}
      for i = 1, 2 do
        cos[i] = coroutine.create(function()
          local t0 = rw.now()
          local res, err = c:get("/same", opts_for(host_sleep))
          took[i] = rw.now() - t0
          results[i] = res and res.body or err.message
        end)
      end
      local t0 = rw.now()
      while not (results[1] and results[2]) and rw.now() - t0 < 10 do
        for i = 1, 2 do
          if coroutine.status(cos[i]) == "suspended" then
            local ok, e = coroutine.resume(cos[i])
            if not ok then results[i] = "raised: " .. tostring(e) end
          end
        end
        require("socket").sleep(0.005)
      end
      return results, took
    end

    it("joins an identical request in flight without blocking a caller that waits through its sleep option", function()
      s:script("/same", { { status = 200, body = "shared", delay = 0.1 } })
      local c = new { max_elapsed = 2 }
      local results, took = run_in_host_runner(c, function(sleep) return { sleep = sleep } end)
      assert.same({ "shared", "shared" }, results)
      assert.is_true(took[1] < 1 and took[2] < 1, "took " .. tostring(took[1]) .. " and " .. tostring(took[2]) .. " s")
      assert.equal(1, #s:log("/same"))
    end)

    it("waits for a turn under concurrency through the call's sleep option, not by blocking the thread", function()
      s:script("/same", { { status = 200, body = "shared", delay = 0.1 } })
      local c = new { max_elapsed = 2, dedupe = false, concurrency = 1 }
      local results, took = run_in_host_runner(c, function(sleep) return { sleep = sleep } end)
      assert.same({ "shared", "shared" }, results)
      assert.is_true(took[1] < 1 and took[2] < 1, "took " .. tostring(took[1]) .. " and " .. tostring(took[2]) .. " s")
      assert.equal(2, #s:log("/same"))
    end)

    it("does not print a path's userinfo in the error for a path that is not / or http(s)", function()
      local c = new()
      local ok, err = pcall(c.get, c, "ftp://alice:s3cr3t-pw@example.com/x")
      assert.is_false(ok)
      assert.matches("path must start with /", err)
      assert.is_nil(err:find("s3cr3t", 1, true), err)
      ok, err = pcall(c.get, c, "alice:s3cr3t-pw@" .. s.base:gsub("^http://", "") .. "/x")
      assert.is_false(ok)
      assert.is_nil(err:find("s3cr3t", 1, true), err)
    end)

    it("names a header name that is not a string as fetch does, not with a Lua error of its own", function()
      local c = new()
      local ok, err = pcall(c.get, c, "/echo", { headers = { [true] = "x" } })
      assert.is_false(ok)
      assert.matches("header name", err)
      assert.equal(0, #s:log("/echo"))
    end)
  end)
end)
