-- ratewise.core below rw.fetch: the engine's requests, its connection caps,
-- the module's entry points and what the shared object exports, checked
-- against a real server on loopback and in separate processes.
local core = require "ratewise.core"
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

-- Runs a Lua program in a process of its own (instrumented under make
-- test-asan), for at most `seconds` (default 60); shell, if given, comes
-- before it ("ulimit -n 64; ", a pipe). Returns its output and whether it
-- exited with 0.
local function run_lua(code, args, shell, seconds)
  local out, code_out = subprocess.run_lua(code, { args = args, shell = shell, seconds = seconds or 60 })
  return out, code_out == 0
end

-- A shell command's output, and whether it succeeded.
local function sh(cmd)
  local out, code = subprocess.shell(cmd)
  return out, code == 0
end

local function tmpdir()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  return dir
end

-- The C flags every build of the module needs (the Makefile adds warnings
-- and -fvisibility=hidden).
local CFLAGS = "-std=c99 -D_POSIX_C_SOURCE=200809L " .. subprocess.lua_cflags .. " $(pkg-config --cflags libcurl) "
  .. subprocess.core_cflags
local LIBS = subprocess.core_libs

-- For a subprocess: how many descriptors it has open now.
local FDS = [[
  local function fds()
    local f = assert(io.open("/proc/self/stat"))
    local pid = f:read("*a"):match("^%d+")
    f:close()
    local p = assert(io.popen("ls /proc/" .. pid .. "/fd"))
    local n = 0
    for _ in p:lines() do n = n + 1 end
    p:close()
    return n
  end
]]

describe("ratewise.core engine", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("requests", function()
    it("sends an empty body for a POST without one, never the process's stdin", function()
      local out, ok = run_lua([[
        local core = require "ratewise.core"
        local e = core.engine()
        local t = assert(e:start { url = arg[1], method = "POST" })
        while not t:done() do e:poll(1) end
        local res, err = t:result()
        print(res and res.status or err.message)
      ]], s:url("/post"), "printf 'read-from-stdin' | ")
      assert.is_true(ok, out)
      assert.equal("200\n", out)
      local log = s:log("/post")
      assert.equal(1, #log)
      assert.equal("POST", log[1].method)
      assert.equal("", log[1].body)
      assert.equal("0", log[1].headers["content-length"])
      assert.is_nil(log[1].headers["transfer-encoding"])
    end)

    -- One record, reused: its header lists serve a request with the same
    -- lines again, and only such a request.
    local function run(e, request)
      local t = assert(e:start(request))
      while not t:done() do e:poll(1) end
      local res, err = t:result()
      t:close()
      assert.is_nil(err, err and err.message)
      return res
    end

    it("looks for the transport options a request lists in transport, and those only", function()
      local e = core.engine()
      -- a proxy that is not listed is not used: the request goes straight out
      local res = run(e, { url = s:url("/t"), transport = { "decompress" }, decompress = false,
        proxy = "http://127.0.0.1:9" })
      assert.equal(200, res.status)
      assert.is_nil(s:log("/t")[1].headers["accept-encoding"]) -- decompress = false, listed, was seen
      -- listed, it is: port 9 refuses the connection
      local t = assert(e:start { url = s:url("/t"), transport = { "proxy" }, proxy = "http://127.0.0.1:9" })
      while not t:done() do e:poll(1) end
      local nothing, err = t:result()
      t:close()
      assert.is_nil(nothing)
      assert.matches("connect", err.message:lower())
      assert.equal(1, #s:log("/t"))
      assert.error_matches(function() e:start { url = s:url("/t"), transport = { "url" } } end,
        "request: unknown transport option 'url'$")
      assert.error_matches(function() e:start { url = s:url("/t"), transport = { "proxy", "ca_fil" } } end,
        "request: unknown transport option 'ca_fil' (did you mean 'ca_file'?)", 1, true)
      for _, bad in ipairs { { "ca_file", 1 }, { "ca_file", "nope" }, { "proxy", true }, { "proxy", "1" } } do
        assert.error_matches(function() e:start { url = s:url("/t"), transport = bad } end,
          "request: unknown transport option '" .. tostring(bad[2]) .. "'", 1, true)
      end
      -- the engine takes in the list every option the schema hands it as it is
      for _, name in ipairs(require("ratewise.options").transport) do
        assert.error_matches(function() e:start { url = s:url("/t"), transport = { name, "nope" } } end,
          "request: unknown transport option 'nope'", 1, true)
      end
      assert.equal(1, #s:log("/t")) -- none of them was sent
      assert.error_matches(function() e:start { url = s:url("/t"), transport = "all" } end,
        "request option 'transport' must be a boolean or an array of names (got string)", 1, true)
      for _, version in ipairs { "1.2\0x", "1.3 ", "1" } do
        assert.error_matches(function()
          e:start { url = s:url("/t"), transport = { "tls_min_version" }, tls_min_version = version }
        end, "request option 'tls_min_version' must be \"1.2\" or \"1.3\"", 1, true)
      end
      e:close()
    end)

    it("reads the rarer fields (max_body...) when transport lists them or is absent, not when false", function()
      local e = core.engine()
      local function outcome(request)
        request.url, request.max_body = s:url("/echo"), 1
        local t = assert(e:start(request))
        while not t:done() do e:poll(1) end
        local res, err = t:result()
        t:close()
        return res and res.status or err.message
      end
      assert.matches("response body too large", outcome {})
      assert.matches("response body too large", outcome { transport = true })
      assert.matches("response body too large", outcome { transport = { "max_body" } })
      assert.equal(200, outcome { transport = false })
      assert.equal(200, outcome { transport = { "decompress" }, decompress = true })
      assert.equal(5, #s:log("/echo")) -- each was sent: the limit is on the answer
      e:close()
    end)

    it("closes a transfer as result(lazy, true) makes its result, and its record serves the next request", function()
      local e = core.engine()
      for i = 1, 3 do
        local t = assert(e:start { url = s:url("/echo"), headers = { "X-N: " .. i } })
        while not t:done() do e:poll(1) end
        local res = assert(t:result(true, true))
        assert.equal(200, res.status)
        assert.matches('"x%-n": "' .. i .. '"', res.body)
        assert.error_matches(function() t:done() end, "transfer is closed", 1, true)
        assert.error_matches(function() t:result() end, "transfer is closed", 1, true)
        t:close() -- idempotent
        assert.equal(0, e:running())
      end
      local failed = assert(e:start { url = "http://127.0.0.1:9/" }) -- refused
      while not failed:done() do e:poll(1) end
      local nothing, err = failed:result(true, true)
      assert.is_nil(nothing)
      assert.is_string(err.message)
      assert.error_matches(function() failed:done() end, "transfer is closed", 1, true)
      assert.equal(3, #s:log("/echo"))
      e:close()
    end)

    it("gives a response the metatable result(lazy, close, recycle, mt) names, and an error none", function()
      local e = core.engine()
      local mt = { __index = { kind = "response" } }
      local t = assert(e:start { url = s:url("/echo") })
      while not t:done() do e:poll(1) end
      assert.error_matches(function() t:result(true, false, false, "mt") end, "table expected", 1, true)
      local res = assert(t:result(true, true, false, mt))
      assert.equal(mt, getmetatable(res))
      assert.equal("response", res.kind)
      assert.equal(200, res.status)
      local failed = assert(e:start { url = "http://127.0.0.1:9/" }) -- refused
      while not failed:done() do e:poll(1) end
      local nothing, err = failed:result(true, true, false, mt)
      assert.is_nil(nothing)
      assert.is_nil(getmetatable(err))
      assert.is_string(err.message)
      e:close()
    end)

    it("gives a response the url result(lazy, close, recycle, mt, url) names, unless a redirect was followed",
      function()
      local e = core.engine()
      s:script("/hop", { { action = "redirect", location = "/landing" } })
      local function result(path, ...)
        local t = assert(e:start { url = s:url(path) })
        while not t:done() do e:poll(1) end
        return t:result(true, true, false, nil, ...)
      end
      assert.equal("as shown", assert(result("/echo", "as shown")).url)
      assert.equal(s:url("/landing"), assert(result("/hop", "as shown")).url)
      assert.is_nil(rawget(assert(result("/echo")), "url"))
      assert.error_matches(function() result("/echo", 1) end, "string expected", 1, true)
      local nothing, err = (function()
        local t = assert(e:start { url = "http://127.0.0.1:9/" }) -- refused
        while not t:done() do e:poll(1) end
        return t:result(true, true, false, nil, "as shown")
      end)()
      assert.is_nil(nothing)
      assert.is_nil(err.url)
      e:close()
    end)

    it("names each finished transfer's owner beside it in poll's owners, false where there is none", function()
      local e = core.engine()
      local a_owner, c_owner = { name = "a" }, { name = "c" }
      local a = assert(e:start({ url = s:url("/a") }, a_owner))
      local b = assert(e:start { url = s:url("/b") })
      local c = assert(e:start({ url = s:url("/c") }, { name = "replaced" }))
      c:set_owner(c_owner)
      local gone = assert(e:start({ url = s:url("/gone") }, "never named"))
      gone:set_owner(nil)
      local out, owners, seen = {}, {}, {}
      while #seen < 4 do
        local _, n = e:poll(1, out, 0, owners)
        for i = 1, n do seen[#seen + 1] = { out[i], owners[i] } end
      end
      local by = {}
      for _, pair in ipairs(seen) do by[pair[1]] = pair[2] end
      assert.equal(a_owner, by[a])
      assert.is_false(by[b])
      assert.equal(c_owner, by[c])
      assert.is_false(by[gone])
      for _, t in ipairs { a, b, c, gone } do assert.equal(200, assert(t:result(true, true)).status) end
      -- without an owners table, poll reports as it always has
      local d = assert(e:start({ url = s:url("/d") }, a_owner))
      local plain = {}
      while not d:done() do e:poll(1, plain) end
      assert.equal(d, plain[1])
      assert.error_matches(function() e:poll(0, {}, 0, "owners") end, "table expected", 1, true)
      d:close()
      e:close()
    end)

    it("names a stream's owner beside its news as beside its end, and forgets it once its news is reported",
      function()
      s:script("/news", { { action = "stream",
        chunks = { { 0, "one " }, { 0.3, "two " }, { 0.3, "three" } } } })
      local e = core.engine()
      local t = assert(e:start { url = s:url("/news"), stream = true })
      local reader = { name = "reader" }
      local out, owners = {}, {}
      -- the owner named beside the next report of t (its news, or its end)
      local function next_report()
        while true do
          local _, n = e:poll(1, out, 0, owners)
          local named
          for i = 1, n do
            if out[i] == t then named = owners[i] end
            out[i], owners[i] = nil, nil
          end
          if named ~= nil then return named end
        end
      end
      local body = {}
      -- reads what has come; nil once a read finds nothing new, false at the end
      local function read_all()
        while true do
          local chunk = t:read()
          if not chunk then return chunk end
          body[#body + 1] = chunk
        end
      end
      assert.is_nil(t:head()) -- asks for news of the headers
      t:set_owner(reader)
      assert.equal(reader, next_report())
      assert.equal(200, assert(t:head()).status)
      -- asked for again without an owner: the last news took its owner along
      assert.is_nil(read_all())
      assert.is_false(next_report())
      local last
      repeat
        last = read_all()
        if last == nil then
          t:set_owner(reader)
          assert.equal(reader, next_report())
        end
      until last == false
      assert.equal("one two three", table.concat(body))
      assert.equal(200, assert(t:result()).status)
      t:close()
      e:close()
    end)

    it("hands a transfer object its result recycled out again, holding nothing of its last request", function()
      local e = core.engine()
      local function finish(t)
        local out, owners = {}, {}
        local owner
        repeat
          local _, n = e:poll(1, out, 0, owners)
          for i = 1, n do
            if out[i] == t then owner = owners[i] end
            out[i], owners[i] = nil, nil
          end
        until t:done()
        return owner
      end
      local owner = setmetatable({}, { __mode = "k" })
      local held = { task = {} }
      owner[held.task] = true
      local first = assert(e:start({ url = s:url("/post"), method = "POST", body = "first body" }, held.task))
      assert.equal(held.task, finish(first))
      assert.equal(200, assert(first:result(true, true, true)).status)
      assert.error_matches(function() first:done() end, "transfer is closed", 1, true)
      -- the same object, for a request of its own: no owner, no body
      local second = assert(e:start { url = s:url("/get") })
      assert.is_true(rawequal(first, second))
      assert.matches("running", tostring(second))
      assert.is_false(finish(second))
      held.task = nil
      collectgarbage("collect")
      collectgarbage("collect")
      assert.is_nil(next(owner)) -- the box let go of its last owner
      local res = assert(second:result(true, true)) -- closed, not recycled
      assert.equal(200, res.status)
      local log = s:log("/post")
      assert.equal(1, #log)
      assert.equal("first body", log[1].body)
      assert.equal("GET", s:log("/get")[1].method)
      local third = assert(e:start { url = s:url("/get") })
      assert.is_false(rawequal(second, third))
      finish(third)
      third:result(true, true, true)
      local fourth = assert(e:start { url = s:url("/get") })
      assert.is_true(rawequal(third, fourth))
      finish(fourth)
      e:close()
      -- a closed engine keeps nothing for later
      assert.equal(200, assert(fourth:result(true, true, true)).status)
      assert.error_matches(function() fourth:done() end, "transfer is closed", 1, true)
      assert.error_matches(function() e:start { url = s:url("/get") } end, "closed", 1, true)
      assert.equal(3, #s:log("/get"))
    end)

    it("gives each request on a reused record its own timeout, or none", function()
      -- each script step answers one request: slow (0.5 s) three times
      s:script("/late", { { delay = 0.5, body = "a" }, { delay = 0.5, body = "b" }, { delay = 0.5, body = "c" },
        { delay = 0.5, body = "d" } })
      local e = core.engine()
      local function outcome(request)
        request.url = s:url("/late")
        local t = assert(e:start(request))
        while not t:done() do e:poll(1) end
        local res, err = t:result(true, true)
        return res and res.body or (err.timeout and "timeout" or err.message)
      end
      assert.equal("timeout", outcome { timeout = 0.2 })
      assert.equal("b", outcome {}) -- the 0.2 s limit is gone with its request
      assert.equal("timeout", outcome { timeout = 0.2, transport = false })
      assert.equal("d", outcome { timeout = 5, transport = false })
      e:close()
    end)

    it("reads a request table, and its header array, through their metatables", function()
      local e = core.engine()
      local headers = setmetatable({}, { __index = { "X-Through: index" }, __len = function() return 1 end })
      local request = setmetatable({}, { __index = { url = s:url("/echo"), headers = headers, transport = false } })
      local res = run(e, request)
      assert.equal(200, res.status)
      assert.equal("index", s:log("/echo")[1].headers["x-through"])
      e:close()
    end)

    it("sends each request's own header lines through a reused record", function()
      local e = core.engine()
      local url = s:url("/h")
      local shared = { "X-A: 1" }
      local sent = {
        { headers = shared }, { headers = shared }, { headers = { "X-A: 2" } }, { headers = { "X-A: 2" } },
        { headers = { "X-A: 2", "X-B: 3" } }, {}, { headers = { "X-A: 2" }, method = "POST", body = "b" },
        { headers = { "X-A: 2" } }, { headers = { "Accept-Encoding: identity" } },
        { headers = shared, decompress = false },
        { headers = shared },
      }
      for _, r in ipairs(sent) do
        r.url = url
        run(e, r)
      end
      local log = s:log("/h")
      assert.equal(#sent, #log)
      local function seen(i, name) return log[i].headers[name] end
      assert.same({ "1", "1", "2", "2", "2" },
        { seen(1, "x-a"), seen(2, "x-a"), seen(3, "x-a"), seen(4, "x-a"), seen(5, "x-a") })
      assert.equal("3", seen(5, "x-b"))
      assert.is_nil(seen(4, "x-b"))
      assert.is_nil(seen(6, "x-a"))
      assert.is_nil(seen(6, "x-b"))
      assert.equal("POST", log[7].method)
      assert.equal("b", log[7].body)
      assert.equal("GET", log[8].method)
      assert.is_nil(seen(8, "expect"))
      -- the engine offers every encoding libcurl decodes, unless the
      -- caller names its own or turns decompression off
      assert.truthy(seen(1, "accept-encoding"):find("gzip", 1, true))
      assert.equal("identity", seen(9, "accept-encoding"))
      assert.is_nil(seen(10, "accept-encoding"))
      assert.truthy(seen(11, "accept-encoding"):find("gzip", 1, true))
      e:close()
    end)

    it("sends each request to its own URL through a reused record, after a redirect too", function()
      local e = core.engine()
      s:script("/hop", { { action = "redirect", location = "/landing" } })
      for _, path in ipairs { "/a", "/a", "/b", "/hop", "/hop", "/a" } do run(e, { url = s:url(path) }) end
      assert.equal(3, #s:log("/a"))
      assert.equal(1, #s:log("/b"))
      assert.equal(2, #s:log("/hop"))
      assert.equal(2, #s:log("/landing"))
      e:close()
    end)

    -- The record keeps its handle's last URL, parsed: a request for another
    -- must leave nothing of it behind, neither in what is sent nor in what
    -- libcurl resolves a redirect against or takes for the first origin.
    it("takes each request's own URL as the base of a relative redirect and the origin of its secrets", function()
      local e = core.engine()
      local other = "http://localhost:" .. s.port
      s:script("/two/go", { { action = "redirect", location = "next" } })
      s:script("/three/go", { { action = "redirect", location = other .. "/landing" } })
      run(e, { url = other .. "/one/first" })
      local res = run(e, { url = s:url("/two/go") })
      assert.equal(s:url("/two/next"), res.url)
      assert.equal(1, #s:log("/two/next"))
      assert.equal(0, #s:log("/one/next"))
      run(e, { url = other .. "/one/first" })
      run(e, { url = s:url("/three/go"), headers = { "Authorization: Bearer sekret" } })
      assert.equal("Bearer sekret", s:log("/three/go")[1].headers.authorization)
      assert.is_nil(s:log("/landing")[1].headers.authorization)
      -- a URL libcurl cannot parse fails as it always did, and the record
      -- goes on to the next
      local t = assert(e:start { url = "http://[::1/x" })
      while not t:done() do e:poll(1) end
      local bad, err = t:result()
      t:close()
      assert.is_nil(bad)
      assert.matches("URL", err.message)
      assert.equal(200, run(e, { url = s:url("/one/first") }).status)
      assert.equal(3, #s:log("/one/first")) -- twice by the name localhost
      -- a URL that is not absolute means what it means alone (libcurl takes
      -- "host:port/path" for http), not a path relative to the last URL
      assert.equal(200, run(e, { url = "127.0.0.1:" .. s.port .. "/alone" }).status)
      assert.equal(1, #s:log("/alone"))
      e:close()
    end)

    it("sends a secret line again after a redirect to another origin left it out", function()
      local e = core.engine()
      local lines = { "Authorization: Bearer sekret", "X-A: 1" }
      s:script("/hop", { { action = "redirect", location = "http://localhost:" .. s.port .. "/landing" } })
      run(e, { url = s:url("/hop"), headers = lines })
      run(e, { url = s:url("/same"), headers = lines })
      local landing, same = s:log("/landing"), s:log("/same")
      assert.is_nil(landing[1].headers.authorization)
      assert.equal("1", landing[1].headers["x-a"])
      assert.equal("Bearer sekret", same[1].headers.authorization)
      e:close()
    end)
  end)

  describe("bodies", function()
    -- One record, reused: its body buffer is kept from one response to the
    -- next (and made at the announced size), and no byte of a longer body
    -- shows through a shorter one.
    local function fetch_one(e, url)
      local t = assert(e:start { url = url })
      while not t:done() do e:poll(1) end
      local res, err = t:result()
      t:close()
      return res, err
    end

    it("gives each response its own whole body through a reused buffer", function()
      local big = string.rep("0123456789abcdef", 65536) -- 1 MiB
      local gz = string.rep("compressible ", 20000)
      s:script("/body", {
        { body = big },
        { body = "short" },
        { body = big:sub(1, 65536) },
        { body = gz, encoding = "gzip" }, -- Content-Length is the compressed size
        { body = "" },
        { body = big .. "x" }, -- over the largest buffer a record keeps
        { body = "again" },
      })
      local e = core.engine()
      local want = { big, "short", big:sub(1, 65536), gz, "", big .. "x", "again" }
      for i, body in ipairs(want) do
        local res, err = fetch_one(e, s:url("/body"))
        assert.is_nil(err, err and err.message)
        assert.equal(200, res.status)
        assert.equal(#body, #res.body, "response " .. i)
        assert.is_true(res.body == body, "response " .. i)
      end
      e:trim() -- lets go of the large kept buffer; the engine goes on
      local res = fetch_one(e, s:url("/echo"))
      assert.equal(200, res.status)
      e:close()
    end)

    it("does not take a Content-Length past max_body for the size to buffer", function()
      s:script("/truncated", { { action = "truncate", body = "partial" } }) -- announces 1,007 bytes
      s:script("/huge", { { body = string.rep("z", 4096) } })
      local e = core.engine()
      local res, err = fetch_one(e, s:url("/truncated"))
      assert.is_nil(res)
      assert.is_truthy(err.message:find("transfer closed with 1000 bytes remaining", 1, true), err.message)
      local t = assert(e:start { url = s:url("/huge"), max_body = 100 })
      while not t:done() do e:poll(1) end
      res, err = t:result()
      t:close()
      assert.is_nil(res)
      assert.is_truthy(err.message:find("response body too large", 1, true), err.message)
      e:close()
    end)
  end)

  describe("connections", function()
    -- Each started transfer's outcome, once all have finished.
    local function run_all(e, transfers)
      local deadline = core.now() + 20
      local done = 0
      while done < #transfers and core.now() < deadline do
        local _, n = e:poll(1)
        done = done + n
      end
      local results = {}
      for i, t in ipairs(transfers) do
        assert(t:done(), "a transfer did not finish within 20 s")
        results[i] = t:result()
        t:close()
      end
      return results
    end

    it("opens at most max_connections at once, queueing the transfers beyond it", function()
      s:script("/slow", { { delay = 0.2, body = "late" } })
      local e = core.engine { max_connections = 2 }
      local transfers = {}
      for i = 1, 6 do transfers[i] = assert(e:start { url = s:url("/slow"), timeout = 10 }) end
      for _, res in ipairs(run_all(e, transfers)) do assert.equal(200, res.status) end
      local log = s:log("/slow")
      assert.equal(6, #log)
      assert.equal(2, server.max_active(log))
      e:close()
    end)

    it("keeps the connections of a wave that ended all at once for the next wave; trim closes them", function()
      -- Every transfer of the first wave ends before the caller starts the
      -- next: that moment is no end of the burst, only the caller knows.
      local e = core.engine { max_idle_connections = 1 }
      for wave = 1, 3 do
        local transfers = {}
        for i = 1, 4 do transfers[i] = assert(e:start { url = s:url("/wave") }) end
        for _, res in ipairs(run_all(e, transfers)) do assert.equal(200, res.status, "wave " .. wave) end
      end
      local conns = {}
      for _, record in ipairs(s:log("/wave")) do conns[record.conn] = true end
      local n = 0
      for _ in pairs(conns) do n = n + 1 end
      assert.equal(4, n, "connections opened for 3 waves of 4")
      -- the burst is over: trim closes what it left open; the next transfer connects anew
      e:trim()
      assert.equal(200, run_all(e, { assert(e:start { url = s:url("/after") }) })[1].status)
      assert.is_nil(conns[s:log("/after")[1].conn])
      e:close()
    end)

    it("takes new limits while it runs (engine:configure)", function()
      s:script("/slow", { { delay = 0.1 } })
      local e = core.engine()
      e:configure { max_connections = 1, max_idle_connections = 1 }
      local transfers = {}
      for i = 1, 3 do transfers[i] = assert(e:start { url = s:url("/slow"), timeout = 10 }) end
      for _, res in ipairs(run_all(e, transfers)) do assert.equal(200, res.status) end
      assert.equal(1, server.max_active(s:log("/slow")))
      e:close()
    end)

    -- libcurl has no timer for a transfer it keeps queued: without the
    -- engine's own, this one would wait for the busy connection, 2 s.
    it("ends a queued transfer at its timeout, as not sent and retryable", function()
      s:script("/busy", { { delay = 2 } })
      local e = core.engine { max_connections = 1 }
      local busy = assert(e:start { url = s:url("/busy"), timeout = 10 })
      local queued = assert(e:start { url = s:url("/queued"), timeout = 0.3 })
      local started = core.now()
      while not queued:done() and core.now() - started < 5 do e:poll(5) end
      local elapsed = core.now() - started
      assert.is_true(queued:done())
      assert.is_false(busy:done())
      local res, err = queued:result()
      assert.is_nil(res)
      assert.is_true(err.timeout)
      assert.is_false(err.sent)
      assert.is_true(err.retryable)
      assert.is_false(err.cancelled)
      assert.matches("waiting for a connection", err.message)
      assert.matches("max_connections", err.message)
      assert.is_true(elapsed >= 0.3 and elapsed < 1, "ended after " .. elapsed .. " s")
      assert.equal(0, #s:log("/queued"))
      busy:close()
      queued:close()
      e:close()
    end)

    it("refuses unknown options and bad limits, naming them", function()
      assert.error_matches(function() core.engine { max_conns = 4 } end,
        "engine: unknown option 'max_conns' (did you mean 'max_connections'?)", 1, true)
      assert.error_matches(function() core.engine { idle_connections = 4 } end,
        "engine: unknown option 'idle_connections' (did you mean 'max_idle_connections'?)", 1, true)
      assert.error_matches(function() core.engine { [1] = 4 } end,
        "engine: unknown option '1'$") -- nothing near enough to suggest
      local options = require "ratewise.options"
      local known = { "max_connections", "max_idle_connections" }
      for _, name in ipairs { "max", "connections", "idle", "max_conn", "x", "", 7, false, ("m"):rep(50),
        "max_connections\0x" } do
        local ok, err = pcall(core.engine, { [name] = 1 })
        assert.is_false(ok)
        local _, expected = pcall(options.unknown, "engine", name, known, 0)
        assert.equal(expected, err)
      end
      assert.error_matches(function() core.engine("many") end, "table expected")
      for _, v in ipairs { 0, -1, 1.5, 0 / 0, math.huge, 1e7, "8", true } do
        assert.error_matches(function() core.engine { max_connections = v } end,
          "option 'max_connections' must be an integer from 1 to 1000000")
        assert.error_matches(function() core.engine { max_idle_connections = v } end,
          "option 'max_idle_connections' must be an integer")
      end
      local e = core.engine()
      assert.error_matches(function() e:configure { max_connections = 0 } end, "'max_connections'")
      assert.error_matches(function() e:configure { idle = 1 } end, "unknown option 'idle'")
      assert.error_matches(function() e:configure() end, "table expected")
      e:close()
      local rw = require "ratewise"
      assert.error_matches(function() rw.configure { max_connections = 0 } end,
        "configure: option 'max_connections' must be an integer from 1 to 1000000 %(got 0%)")
      assert.error_matches(function() rw.configure { max_idle_connections = "2" } end,
        "option 'max_idle_connections' must be an integer from 1 to 1000000 %(got string \"2\"%)")
    end)

    -- Without a cap, at the usual limit of 1,024 descriptors about half of
    -- 2,000 concurrent fetches failed ("Failed to connect"), and every
    -- connection stayed open afterwards.
    it("keeps 2,000 concurrent fetches within 1,024 descriptors, and few open once done", function()
      local out, ok = run_lua(FDS .. [[
        local rw = require "ratewise"
        require("ratewise.scheduler").engine()
        local before = fds()
        local urls = {}
        for i = 1, 2000 do urls[i] = arg[1] .. "?i=" .. i end
        local results, errors = rw.map(urls, function(url)
          return rw.fetch(url, { on_retry = false, max_retries = 0, timeout = 60 })
        end)
        local good, failure = 0, ""
        for i = 1, #urls do
          if results[i] and results[i].status == 200 then good = good + 1
          else failure = errors[i] and errors[i].message or failure end
        end
        print(good, fds() - before, failure)
      ]], s:url("/many"), "ulimit -n 1024; ", 180)
      assert.is_true(ok, out)
      local good, extra = out:match("^(%d+)\t(%-?%d+)\t")
      assert.equal("2000", good, out)
      -- What stays open: the idle connections (default 64), no more.
      assert.is_true(tonumber(extra) <= 64, "descriptors left open: " .. extra)
      local log = s:log("/many")
      assert.equal(2000, #log)
      assert.is_true(server.max_active(log) <= 256, "requests at once: " .. server.max_active(log))
    end)

    -- libcurl closes an idle connection whenever a transfer ends with more
    -- than its cache size open: a cache of max_idle_connections alone made
    -- every request reconnect as soon as more ran at once.
    it("reuses its connections while more than max_idle_connections run at once", function()
      local out, ok = run_lua([[
        local rw = require "ratewise"
        rw.configure { max_idle_connections = 2 }
        local urls = {}
        for i = 1, 60 do urls[i] = arg[1] end
        local results = rw.map(urls, function(url) return rw.fetch(url, { on_retry = false }) end,
          { concurrency = 6 })
        local good = 0
        for i = 1, #urls do if results[i] and results[i].status == 200 then good = good + 1 end end
        print(good)
      ]], s:url("/steady"))
      assert.is_true(ok, out)
      assert.equal("60\n", out)
      local conns = {}
      for _, record in ipairs(s:log("/steady")) do conns[record.conn] = true end
      local n = 0
      for _ in pairs(conns) do n = n + 1 end
      assert.equal(6, n)
    end)

    it("keeps its connections from the programs the process starts", function()
      local out, ok = run_lua([[
        local rw = require "ratewise"
        require("ratewise.scheduler").engine()
        -- The sockets a child process (here ls) finds open.
        local function inherited()
          local p = assert(io.popen("ls -l /proc/self/fd/"))
          local n = 0
          for line in p:lines() do
            if line:find("socket:", 1, true) then n = n + 1 end
          end
          p:close()
          return n
        end
        local before = inherited()
        assert(rw.fetch(arg[1], { on_retry = false })) -- its connection stays open, idle
        print(before, inherited())
      ]], s:url("/inherit"))
      assert.is_true(ok, out)
      local before, after = out:match("^(%d+)\t(%d+)\n$")
      assert.equal(before, after, out)
    end)

    it("takes its limits from rw.configure", function()
      s:script("/slow", { { delay = 0.1 } })
      local out, ok = run_lua(FDS .. [[
        local rw = require "ratewise"
        rw.configure { max_connections = 3, max_idle_connections = 1 }
        local before = fds()
        local urls = {}
        for i = 1, 12 do urls[i] = arg[1] end
        local results = rw.map(urls, function(url) return rw.fetch(url, { on_retry = false }) end)
        local good = 0
        for i = 1, #urls do if results[i] and results[i].status == 200 then good = good + 1 end end
        print(good, fds() - before)
      ]], s:url("/slow"))
      assert.is_true(ok, out)
      local good, extra = out:match("^(%d+)\t(%-?%d+)\n$")
      assert.equal("12", good, out)
      assert.is_true(tonumber(extra) <= 1, "descriptors left open: " .. extra)
      assert.equal(3, server.max_active(s:log("/slow")))
    end)
  end)

  -- A build with -DRW_FAULTS, whose engine has the specs' hooks
  -- (engine:fail_next(), engine:all_drives()), in a directory of its own
  -- for package.cpath: built at the first spec that asks, removed at the end.
  local faults_dir
  local function faults_build()
    if faults_dir then return faults_dir end
    local dir = tmpdir()
    assert(os.execute("mkdir -p " .. dir .. "/ratewise"))
    local built_out, built = sh("cc " .. CFLAGS .. " -DRW_FAULTS -fPIC -shared -o " .. dir
      .. "/ratewise/core.so src/*.c " .. LIBS)
    if not built then os.execute("rm -rf " .. dir) end
    assert(built, "the build failed: " .. built_out)
    faults_dir = dir
    return dir
  end
  teardown(function()
    if faults_dir then os.execute("rm -rf " .. faults_dir) end
  end)

  describe("its drive", function()
    -- Giving libcurl every socket at once (curl_multi_socket_all) is for
    -- a few sockets that each carry several HTTP/2 streams. It counted
    -- every running transfer as one that shares a socket: when a wave of
    -- new HTTP/1.1 transfers (no socket yet) started while a few others
    -- waited on theirs, the next event made a pass over all of them,
    -- polling each socket in turn.
    it("hands libcurl HTTP/1.1 sockets one by one, even beside a wave of new transfers", function()
      s:script("/later", { { delay = 0.4, body = "later" } })
      local dir = faults_build()
      local out, ok = run_lua([[
        package.cpath = arg[3] .. "/?.so;" .. package.cpath -- the RW_FAULTS build
        local core = require "ratewise.core"
        local e = core.engine()
        local slow, fast = arg[1], arg[2]
        local started, finished, out = 0, 0, {}
        local function start(url, n)
          for _ = 1, n do
            assert(e:start { url = url, timeout = 10 })
            started = started + 1
          end
        end
        local function poll(timeout)
          local _, n = e:poll(timeout, out)
          for i = 1, n do
            assert(out[i]:result().status == 200)
            out[i]:close()
            out[i] = nil
          end
          finished = finished + n
        end
        start(slow, 8)
        start(fast, 40)
        local deadline = core.now() + 5
        while finished < 40 and core.now() < deadline do poll(0.05) end
        assert(finished == 40, "the first wave did not finish")
        start(fast, 40)
        -- the slow answers come in before the engine is polled again: its
        -- next drive sees their 8 sockets ready, beside 40 transfers that
        -- have none yet
        os.execute("sleep 0.5")
        deadline = core.now() + 10
        while finished < started and core.now() < deadline do poll(0.5) end
        print(finished, started, e:all_drives())
      ]], s:url("/later") .. " " .. s:url("/now") .. " " .. dir, "ASAN_OPTIONS=detect_leaks=0 ", 30)
      assert.is_true(ok, out)
      assert.equal("88\t88\t0\n", out)
    end)
  end)

  describe("when things fail inside it", function()
    -- A multi handle that fails (out of memory, an epoll that breaks) is
    -- rare and cannot be caused from outside: a build with -DRW_FAULTS has
    -- engine:fail_next(), which makes the next drive fail as libcurl's
    -- would. Such an error used to be ignored: the transfers never ended,
    -- and whoever waited for them waited forever.
    it("ends every running transfer with libcurl's multi error, reports each, and works on", function()
      s:script("/hang", { { action = "hang", delay = 5 } })
      local dir = faults_build()
      local out, ok = run_lua([[
        package.cpath = arg[3] .. "/?.so;" .. package.cpath -- the RW_FAULTS build
        local core = require "ratewise.core"
        local e = core.engine()
        local transfers = {}
        for i = 1, 9 do transfers[i] = assert(e:start { url = arg[1], timeout = 30 }) end
        for _ = 1, 10 do e:poll(0.02) end -- connected, requests sent
        e:fail_next()
        local reported, out, first = 0, {}, nil
        local deadline = core.now() + 3
        while reported < 9 and core.now() < deadline do
          local _, n = e:poll(0.5, out)
          for i = 1, n do
            local res, err = out[i]:result()
            assert(res == nil, "a hanging request got an answer")
            first = first or err
            reported = reported + 1
          end
        end
        local after = assert(e:start { url = arg[2], timeout = 5 })
        while not after:done() do e:poll(0.5) end
        print(reported, e:running(), first and first.multi, first and first.message, first and first.retryable,
          first and first.cancelled, after:result().status)
      ]], s:url("/hang") .. " " .. s:url("/after") .. " " .. dir, "ASAN_OPTIONS=detect_leaks=0 ", 30)
      assert.is_true(ok, out)
      local reported, running, multi, message, retryable, cancelled, status =
        out:match("^(%d+)\t(%d+)\t([^\t]+)\t([^\t]+)\t(%a+)\t(%a+)\t(%d+)\n$")
      assert.equal("9", reported, out)
      assert.equal("0", running)
      assert.matches("multi handle failed %(" .. multi:gsub("%p", "%%%0") .. "%)", message)
      assert.equal("false", retryable)
      assert.equal("false", cancelled)
      assert.equal("200", status)
    end)

    -- A directory holding spec/support/oom_host built against this Lua.
    local function build_oom_host()
      local dir = tmpdir()
      local out, built = sh("cc " .. CFLAGS .. " -o " .. dir .. "/oom_host spec/support/oom_host.c src/*.c "
        .. subprocess.lua_libs .. " " .. LIBS)
      assert(built, "the build failed: " .. out)
      return dir
    end

    -- oom_host fails Lua's allocations on demand: the first entry of an
    -- empty out table cannot be allocated, so poll raises after libcurl
    -- has handed the finished transfer over. It used to be lost then:
    -- never reported, its task waiting forever.
    it("reports a finished transfer at the next poll after an out-of-memory error", function()
      local dir = build_oom_host()
      local script = dir .. "/poll.lua"
      local f = assert(io.open(script, "w"))
      f:write([[
        local core = require "ratewise.core"
        local e = core.engine()
        local t = assert(e:start { url = arg[1], timeout = 10 })
        local scratch, out = {}, {}
        pcall(e.poll, e, 0, scratch) -- the call path warmed up: no allocation left in it but out's
        fail_allocations(true)
        local ok, err, n
        local deadline = core.now() + 5
        repeat
          ok, err, n = pcall(e.poll, e, 0.2, out)
        until not ok or n > 0 or core.now() > deadline
        fail_allocations(false)
        print("first poll", ok, ok and n or err, t:done())
        local _, n2 = e:poll(0, out)
        local res = out[1] == t and t:result()
        print("next poll", n2, out[1] == t, res and res.status, e:running())
      ]])
      f:close()
      local out = sh(dir .. "/oom_host " .. script .. " " .. s:url("/oom"))
      os.execute("rm -rf " .. dir)
      -- The transfer had finished when the allocation failed.
      assert.matches("first poll\tfalse\tnot enough memory\ttrue\n", out, 1, true)
      assert.matches("next poll\t1\ttrue\t200\t0\n", out, 1, true)
    end)

    -- core.link resolves a relative link with libcurl's URL parser, whose
    -- result is libcurl's memory until it is copied into a Lua string. When
    -- that copy raises, the URL used to stay allocated for good.
    it("core.link leaves none of libcurl's memory behind when Lua's allocation fails", function()
      local dir = build_oom_host()
      local script = dir .. "/link.lua"
      local f = assert(io.open(script, "w"))
      f:write([[
        local core = require "ratewise.core"
        -- (a new page each time: a string Lua has already interned needs no allocation)
        local function link(page) return '<' .. string.rep("p", 300) .. '?page=' .. page .. '>; rel="next"' end
        local base = "https://api.example/items?page=1"
        assert(core.link(link(2), "next", base)) -- the call path warmed up
        local before = curl_blocks()
        local raised, passed = 0, 0
        -- each of the call's Lua allocations made to fail in turn, the
        -- last one (the result's string) too
        for allowed = 0, 16 do
          local value = link(100 + allowed)
          fail_allocations(allowed)
          local ok = pcall(core.link, value, "next", base)
          fail_allocations(false)
          if ok then passed = passed + 1 else raised = raised + 1 end
        end
        print("raised", raised > 1, "passed", passed > 0,
          "curl blocks left", string.format("%d", curl_blocks() - before))
        print("after", core.link(link(2), "next", base))
      ]])
      f:close()
      local out = sh(dir .. "/oom_host " .. script)
      os.execute("rm -rf " .. dir)
      assert.matches("raised\ttrue\tpassed\ttrue\tcurl blocks left\t0\n", out, 1, true)
      assert.matches("after\thttps://api.example/" .. string.rep("p", 300) .. "?page=2\n", out, 1, true)
    end)
  end)
end)

describe("ratewise.core engine:watch", function()
  local socket = require "socket"

  -- A connected pair of loopback sockets.
  local function pair()
    local listener = assert(socket.bind("127.0.0.1", 0))
    local _, port = listener:getsockname()
    local a = assert(socket.connect("127.0.0.1", port))
    local b = assert(listener:accept())
    listener:close()
    return a, b
  end

  it("reports a watched descriptor once when it is ready, among the finished transfers", function()
    local e = assert(core.engine())
    local a, b = pair()
    local fd = b:getfd()
    assert.is_true(e:watch(fd, "r"))
    assert.equal(1, e:running()) -- something to poll for: no deadlock while it waits
    local _, n = e:poll(0.05)
    assert.equal(0, n)
    a:send("x")
    local out
    out, n = e:poll(1)
    assert.equal(1, n)
    assert.equal(fd, out[1])
    assert.equal(0, e:running())
    a:send("y")
    _, n = e:poll(0.05) -- once: it is armed again by the next watch
    assert.equal(0, n)
    assert.is_true(e:watch(fd, "w"))
    out, n = e:poll(1)
    assert.same({ 1, fd }, { n, out[1] })
    assert.is_true(e:watch(fd, "r"))
    e:unwatch(fd)
    assert.equal(0, e:running())
    _, n = e:poll(0.05)
    assert.equal(0, n)
    e:unwatch(fd) -- twice does nothing
    a:close()
    b:close()
    e:close()
  end)

  it("refuses a mode or a descriptor that is not one", function()
    local e = assert(core.engine())
    assert.error_matches(function() e:watch(0, "x") end, "mode must be \"r\" or \"w\"", 1, true)
    assert.error_matches(function() e:watch(-1, "r") end, "not a descriptor", 1, true)
    local ok, err = e:watch(987654, "r")
    assert.is_nil(ok)
    assert.matches("cannot watch descriptor 987654", err)
    e:close()
  end)
end)

describe("core.random_bytes", function()
  it("returns n bytes from the kernel, different on each call", function()
    for _, n in ipairs { 1, 16, 256 } do
      assert.equal(n, #assert(core.random_bytes(n)))
    end
    local a, b = core.random_bytes(32), core.random_bytes(32)
    assert.not_equal(a, b)
    -- 32 random bytes are not all one value (1 chance in 2^248 of a false alarm).
    -- (Compared, not matched: a NUL first byte made a malformed pattern on
    -- Lua 5.1 and LuaJIT, one run in 256.)
    assert.not_equal(string.rep(a:sub(1, 1), #a), a)
  end)

  it("refuses a count that is not an integer from 1 to 256", function()
    for _, n in ipairs { 0, -1, 257, 1.5, 0 / 0 } do
      assert.error_matches(function() core.random_bytes(n) end, "random_bytes")
    end
    assert.error_matches(function() core.random_bytes(0) end, "from 1 to 256")
    assert.error_matches(function() core.random_bytes("16") end, "random_bytes")
    assert.error_matches(function() core.random_bytes() end, "number expected")
  end)

  -- /dev/urandom needs a descriptor; with all of them in use, a fallback
  -- to math.random used to be the only way out.
  it("still has bytes when the process has no descriptor left", function()
    local out, ok = run_lua([[
      local core = require "ratewise.core"
      local held = {}
      while true do
        local f = io.open("/dev/null")
        if not f then break end
        held[#held + 1] = f
      end
      assert(io.open("/dev/urandom") == nil, "a descriptor was still free")
      local a, err = core.random_bytes(16)
      local b = core.random_bytes(16)
      print(#held, a and #a or err, a ~= b)
    ]], "", "ulimit -n 64; ")
    assert.is_true(ok, out)
    local held, n, differ = out:match("^(%d+)\t(%S+)\t(%a+)\n$")
    assert.is_true(tonumber(held) > 40, out)
    assert.equal("16", n, out)
    assert.equal("true", differ)
  end)
end)

describe("ratewise.core as a shared object", function()
  -- luarocks compiles each source with its own CFLAGS (-O2 -fPIC) and links
  -- with -shared: no -fvisibility=hidden, so only the header can hide the
  -- internal functions.
  it("exports luaopen_ratewise_core alone, built the way luarocks builds it", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    local build = "cc -O2 -fPIC -D_POSIX_C_SOURCE=200809L " .. subprocess.lua_cflags .. " " .. subprocess.core_cflags
      .. " $(pkg-config --cflags libcurl) -shared -o " .. dir .. "/core.so src/*.c " .. LIBS .. " 2>&1"
    local out, built = sh(build)
    assert(built, "the build failed: " .. out)
    local p = assert(io.popen("nm -D --defined-only " .. dir .. "/core.so"))
    local exported = {}
    for line in p:lines() do
      local kind, name = line:match("^%x*%s+(%a)%s+(%S+)$")
      -- Text and data symbols; the version nodes and section markers of
      -- some toolchains are kind A.
      if kind and kind ~= "A" then exported[#exported + 1] = name end
    end
    p:close()
    os.execute("rm -rf " .. dir)
    assert.same({ "luaopen_ratewise_core" }, exported)
  end)

  it("is built by the rockspec from every source of src/", function()
    local f = assert(io.open("rockspec/ratewise-scm-1.rockspec"))
    local rockspec = f:read("*a")
    f:close()
    local listed = {}
    for name in rockspec:match("sources = (%b{})"):gmatch('"(src/[^"]+%.c)"') do listed[#listed + 1] = name end
    local p = assert(io.popen("ls src/*.c"))
    local present = {}
    for line in p:lines() do present[#present + 1] = line end
    p:close()
    table.sort(listed)
    assert.same(present, listed)
  end)
end)

-- make test-asan builds the module with -DRW_STACK_CHECK and runs the whole
-- suite on it; this builds one the same way so that make test checks too.
describe("ratewise.core built with -DRW_STACK_CHECK", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  it("wraps every C function, and each keeps the stack as it promises", function()
    local dir = tmpdir()
    assert(os.execute("mkdir -p " .. dir .. "/ratewise"))
    local out, built = sh("cc " .. CFLAGS .. " -DRW_STACK_CHECK -fPIC -shared -o " .. dir
      .. "/ratewise/core.so src/*.c " .. LIBS)
    assert(built, "the build failed: " .. out)
    local script = dir .. "/calls.lua"
    local f = assert(io.open(script, "w"))
    f:write([[
      local core = require "ratewise.core"
      local url = arg[1]
      -- The build lists its checked wrappers in core.stack_checked.
      local unwrapped, seen = {}, {}
      local function check(where, t)
        for k, v in pairs(t) do
          if type(v) == "function" and debug.getinfo(v, "S").what == "C" and not seen[v] then
            seen[v] = true
            if not core.stack_checked[v] then unwrapped[#unwrapped + 1] = where .. k end
          end
        end
      end
      check("core.", core)
      local e = core.engine { max_connections = 4 }
      local b = core.bucket { capacity = 2, rate = 1 }
      for name, obj in pairs { Engine = e, Bucket = b } do
        local mt = getmetatable(obj)
        check(name .. ":", mt)
        if type(mt.__index) == "table" then check(name .. ":", mt.__index) end
      end
      local t = assert(e:start { url = url, timeout = 10 })
      check("Transfer:", getmetatable(t))
      check("Transfer:", getmetatable(t).__index)

      -- Every entry point, each path that returns (raising ends no check).
      core.now(); core.time(); core.malloc_in_use(); core.random_bytes(8)
      core.classify(200); core.classify(429.0)
      core.parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"); core.parse_http_date("x", 0)
      core.parse_retry_after("5"); core.parse_retry_after("x")
      core.parse_seconds("1.5"); core.parse_duration("6m0s"); core.parse_rfc3339("2025-01-01T00:00:00Z")
      core.backoff(1, 0.1, 1, "full", 0.5); core.backoff(2, 0.1, 1, "decorrelated", 0.5, 0.2)
      for _, method in ipairs { "take", "reserve", "refund", "wait_time", "tokens", "capacity", "rate",
                                 "sync_horizon" } do
        if b[method] then b[method](b) end
      end
      if b.sync then b:sync(1); b:sync(0, 2) end
      tostring(b); b:close(); b:close()

      e:configure { max_idle_connections = 2 }
      e:poll(); e:poll(0)
      local out = {}
      while not t:done() do e:poll(1, out) end
      e:poll(0, out, 0.001); e:poll(0, out, 0, {}, "extra")
      local owned = assert(e:start({ url = url }, "owner"))
      owned:set_owner(nil); owned:set_owner(true)
      while not owned:done() do e:poll(1, out, 0, {}) end
      assert(owned:result(true, true, true)).status = nil -- recycled: the next start takes it
      local again = assert(e:start({ url = url }, "owner")) -- a recycled object
      while not again:done() do e:poll(1, out, 0, {}) end
      again:close()
      e:running(); t:done(); tostring(t)
      assert(t:result()).status = nil
      t:close(); t:close() -- after poll reported it: holds no reference
      local cancelled = assert(e:start { url = url, method = "POST", body = "x" })
      cancelled:cancel(); cancelled:result(); cancelled:close()
      local refused = assert(e:start { url = "http://127.0.0.1:1/", timeout = 5 })
      while not refused:done() do e:poll(1) end
      refused:result(); refused:close()
      assert(e:start { url = url }):close() -- closed while running
      do local closing = assert(e:start { url = url }); getmetatable(closing).__close(closing) end
      local finished = assert(e:start { url = url })
      while not finished:done() do e:poll(1, {}) end -- reported, never closed: __gc
      local left = assert(e:start { url = url }) -- still running when the engine closes
      e:close(); e:close()
      left:result(); left:close()
      do local closing = core.engine(); getmetatable(closing).__close(closing) end
      collectgarbage(); collectgarbage()
      print("unwrapped: " .. table.concat(unwrapped, " "))
      print("done")
    ]])
    f:close()
    -- Under make test-asan the interpreter carries the ASan runtime, but this
    -- build is not instrumented and is unloaded at exit, so its leaks (and
    -- libcurl's) could not be named: not LeakSanitizer's business here.
    out = sh("ASAN_OPTIONS=detect_leaks=0 LUA_CPATH='" .. dir .. "/?.so' timeout 60 " .. subprocess.lua .. " "
      .. script .. " " .. s:url("/stack"))
    os.execute("rm -rf " .. dir)
    assert.equal("unwrapped: \ndone\n", out)
  end)
end)
