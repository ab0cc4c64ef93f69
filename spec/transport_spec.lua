-- TLS, proxies and decompression, against servers the suite starts: an
-- HTTPS test server with a CA of its own (and one that asks for client
-- certificates), the test server playing an HTTP proxy, and compressed
-- answers. What the servers saw is what is asserted.
local rw = require "ratewise"
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

local quiet = { on_retry = false, max_retries = 0 }

local function opts(extra)
  local o = { on_retry = false, max_retries = 0 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

describe("TLS", function()
  local s

  setup(function() s = server.start_tls_ca() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("verifies a server against the CA given in ca_file, and refuses it without", function()
    local res = assert(rw.fetch(s:url("/x"), opts { ca_file = s.ca_file }))
    assert.equal(200, res.status)
    local nothing, err = rw.fetch(s:url("/x"), quiet)
    assert.is_nil(nothing)
    assert.equal("network", err.kind)
    assert.equal(1, #s:log("/x")) -- the refused handshake sent no request
  end)

  it("takes the CA from ca_path, a folder hashed as OpenSSL reads it", function()
    assert(os.execute("cd " .. s.ca_dir .. " && mkdir -p hashed && cp ca.pem hashed/ && "
      .. "openssl rehash hashed >/dev/null 2>&1"))
    local res = assert(rw.fetch(s:url("/x"), opts { ca_path = s.ca_dir .. "/hashed" }))
    assert.equal(200, res.status)
  end)

  it("honours SSL_CERT_FILE, as OpenSSL's tools do", function()
    local out, code = subprocess.run_lua([[
      local rw = require "ratewise"
      local res, err = rw.fetch(arg[1], { on_retry = false, max_retries = 0 })
      print(res and res.status or tostring(err))
    ]], { args = s:url("/env"), shell = "SSL_CERT_FILE=" .. s.ca_file .. " ", seconds = 20 })
    assert.equal(0, code, out)
    assert.equal("200\n", out)
  end)

  it("checks a pinned public key: the right pin passes, a wrong one ends the call", function()
    assert(rw.fetch(s:url("/pin"), opts { ca_file = s.ca_file, pinned_public_key = s.pin }))
    local wrong = "sha256//" .. string.rep("A", 43) .. "="
    local res, err = rw.fetch(s:url("/pin"), opts { ca_file = s.ca_file, pinned_public_key = wrong })
    assert.is_nil(res)
    assert.equal("network", err.kind)
    assert.equal(1, #s:log("/pin"))
  end)

  -- libcurl reports a pin file it cannot read as a mismatch; the error names
  -- the file and why it cannot be read instead.
  it("names a pinned_public_key file that is missing or cannot be read, not a mismatch", function()
    for _, path in ipairs { s.ca_dir .. "/no-such-pin.pem", s.ca_dir } do -- missing; a folder
      local res, err = rw.fetch(s:url("/pin-file"), opts { ca_file = s.ca_file, pinned_public_key = path })
      assert.is_nil(res)
      assert.equal("network", err.kind)
      local text = tostring(err)
      assert.matches("pinned_public_key file " .. path .. " cannot be read", text, 1, true)
      assert.matches(path == s.ca_dir and "Is a directory" or "No such file or directory", text, 1, true)
      assert.not_matches("does not match", text, 1, true)
    end
    assert.equal(0, #s:log("/pin-file"))
  end)

  it("names a ca_path folder that does not exist", function()
    local path = s.ca_dir .. "/no-such-folder"
    local res, err = rw.fetch(s:url("/ca-path"), opts { ca_path = path })
    assert.is_nil(res)
    assert.equal("network", err.kind)
    assert.matches("ca_path folder " .. path .. " cannot be read", tostring(err), 1, true)
    assert.matches("No such file or directory", tostring(err), 1, true)
    assert.equal(0, #s:log("/ca-path"))
  end)

  it("keeps a handle's TLS options to its own request: the next one on it is back to the defaults", function()
    for _ = 1, 3 do
      assert(rw.fetch(s:url("/a"), opts { ca_file = s.ca_file }))
      local res, err = rw.fetch(s:url("/b"), quiet) -- no CA: refused again
      assert.is_nil(res)
      assert.equal("network", err.kind)
    end
    assert.equal(0, #s:log("/b"))
  end)

  -- A handle keeps options libcurl cannot put back one by one while the
  -- next request has the same ones (src/request.c, request_reset_sig).
  it("keeps a handle's CA file for a next request with the same one, and takes another in its place", function()
    local other = server.start_tls_ca() -- another CA, which did not sign s's certificate
    local ok, err = pcall(function()
      for _ = 1, 3 do
        assert(rw.fetch(s:url("/same"), opts { ca_file = s.ca_file }))
        assert(rw.fetch(s:url("/same"), opts { ca_file = s.ca_file }))
        local res, ferr = rw.fetch(s:url("/other"), opts { ca_file = other.ca_file })
        assert.is_nil(res)
        assert.equal("network", ferr.kind)
      end
    end)
    other:stop()
    assert(ok, err)
    assert.equal(6, #s:log("/same"))
    assert.equal(0, #s:log("/other"))
  end)

  it("serves request after request on a handle reset for TLS options, connections closing after each", function()
    -- Each answer closes its connection, so descriptors are reused at once,
    -- by handles set up anew (curl_easy_reset) every other request.
    s:script("/closing", { { status = 200, headers = { Connection = "close" } } })
    local t0 = rw.now()
    for i = 1, 12 do
      local o = opts { timeout = 3 }
      if i % 2 == 1 then o.ca_file = s.ca_file else o.verify_tls = false end
      assert(rw.fetch(s:url("/closing"), o))
    end
    assert.is_true(rw.now() - t0 < 3, "12 requests took " .. (rw.now() - t0) .. " s")
    assert.equal(12, #s:log("/closing"))
  end)

  it("asks for TLS 1.2 or 1.3 at least, and refuses another version", function()
    assert(rw.fetch(s:url("/v"), opts { ca_file = s.ca_file, tls_min_version = "1.3" }))
    assert.error_matches(function() rw.fetch(s:url("/v"), opts { tls_min_version = "1.0" }) end,
      "option 'tls_min_version' must be \"1.2\" or \"1.3\"", 1, true)
  end)

  it("says once per process that verify_tls = false checks nothing, unless silenced", function()
    local out = subprocess.run_lua([[
      local rw = require "ratewise"
      for _ = 1, 3 do assert(rw.fetch(arg[1], { on_retry = false, verify_tls = false })) end
      print("done")
    ]], { args = s:url("/insecure"), seconds = 20 })
    local _, warnings = out:gsub("verify_tls = false: TLS certificates are not checked", "")
    assert.equal(1, warnings, out)
    local quiet_out = subprocess.run_lua([[
      local rw = require "ratewise"
      rw.configure { tls_warning = false }
      assert(rw.fetch(arg[1], { on_retry = false, verify_tls = false }))
      print("done")
    ]], { args = s:url("/insecure"), seconds = 20 })
    assert.equal("done\n", quiet_out)
  end)
end)

describe("TLS with client certificates", function()
  local s

  -- (no reset or log here: the suite's control calls carry no certificate)
  setup(function() s = server.start_tls_ca { client_cert_required = true } end)
  teardown(function() s:stop() end)

  it("presents client_cert and client_key; without them the server refuses the handshake", function()
    local res = assert(rw.fetch(s:url("/me"), opts { ca_file = s.ca_file, client_cert = s.client_cert,
      client_key = s.client_key }))
    assert.equal(200, res.status)
    -- refused during the handshake, or (TLS 1.3) by an alert once it is over
    local nothing, err = rw.fetch(s:url("/me"), opts { ca_file = s.ca_file })
    assert.is_nil(nothing)
    assert.is_truthy(err.kind == "network" or err.kind == "exhausted", tostring(err))
  end)

  it("opens an encrypted key with client_key_password, and never shows the password", function()
    -- in a process of its own: libcurl would reuse a connection that this
    -- one opened with the same certificate
    local out = subprocess.run_lua([[
      local rw = require "ratewise"
      local res, err = rw.fetch(arg[1], { on_retry = false, max_retries = 0, ca_file = arg[2],
        client_cert = arg[3], client_key = arg[4], client_key_password = "wrong-hunter3" })
      print(res and res.status or tostring(err))
    ]], { args = table.concat({ s:url("/enc"), s.ca_file, s.client_cert, s.client_key_encrypted }, " "),
      seconds = 20 })
    assert.matches("^ratewise: network: ", out)
    assert.is_nil(out:find("hunter3", 1, true))
    local res = assert(rw.fetch(s:url("/enc"), opts { ca_file = s.ca_file, client_cert = s.client_cert,
      client_key = s.client_key_encrypted, client_key_password = "hunter2" }))
    assert.equal(200, res.status)
  end)

  it("carries the TLS options of a client to each of its requests", function()
    local api = rw.client { base_url = s.base, ca_file = s.ca_file, client_cert = s.client_cert,
      client_key = s.client_key, on_retry = false }
    local res = assert(api:get("/c"))
    assert.equal(200, res.status)
  end)
end)

describe("proxies", function()
  local origin, proxy

  setup(function()
    origin = server.start()
    proxy = server.start()
  end)
  teardown(function()
    origin:stop()
    proxy:stop()
  end)
  before_each(function()
    origin:reset()
    proxy:reset()
  end)

  it("sends a request through the proxy option, credentials in Proxy-Authorization, never in an error", function()
    local proxy_url = "http://user:s3cret@127.0.0.1:" .. proxy.port
    local res = assert(rw.fetch(origin:url("/via"), opts { proxy = proxy_url }))
    assert.equal(200, res.status)
    assert.equal(0, #origin:log("/via"))
    local seen = proxy:log("/via")
    assert.equal(1, #seen)
    assert.is_true(seen[1].proxied)
    assert.is_true(seen[1].proxy_auth)
    -- the next call without the option, on the same handle, goes straight
    -- to the origin
    assert.equal(200, assert(rw.fetch(origin:url("/after"), opts())).status)
    assert.equal(1, #origin:log("/after"))
    assert.equal(0, #proxy:log("/after"))
    -- a proxy that is not there: the error names no credentials
    local nothing, err = rw.fetch(origin:url("/via"), opts { proxy = "http://user:s3cret@127.0.0.1:1" })
    assert.is_nil(nothing)
    assert.is_nil(tostring(err):find("s3cret", 1, true))
  end)

  -- libcurl quotes a proxy URL it cannot read whole in its error
  -- ("Unsupported proxy syntax in '...'"), password and all.
  local REFUSED_PROXIES = {
    "http://user:p@ssSECRET@127.0.0.1:1", "http://user:pa#ssSECRET@127.0.0.1:1", "http://user:pa ssSECRET@127.0.0.1:1",
    "http://user:passSECRET@127.0.0.1:99999", "http://user:pa/ssSECRET@127.0.0.1:1", "user:p@ssSECRET@127.0.0.1:1",
    "http://user:x?ySECRET@127.0.0.1:1", "http://user:pa%zzSECRET@bad host:1", "http://:p@@SECRET@127.0.0.1:1",
    "http://user:" .. string.rep("SECRET", 60) .. "@@127.0.0.1:1", -- past libcurl's error buffer
  }

  it("names no part of a proxy's credentials in any error, event or retry when libcurl refuses its URL", function()
    for _, proxy_url in ipairs(REFUSED_PROXIES) do
      local seen = {}
      local function keep(t)
        for k, v in pairs(t) do seen[#seen + 1] = k .. "=" .. tostring(v) end
      end
      local res, err = rw.fetch(origin:url("/refused"), { proxy = proxy_url, max_retries = 1, base = 0.001,
        on_event = keep, on_retry = keep })
      assert.is_nil(res)
      local said = table.concat(seen, " ") .. " " .. tostring(err) .. " " .. tostring(err.transport.message)
      assert.is_nil(said:find("SECRET", 1, true), proxy_url .. " leaked: " .. said)
      assert.is_nil(said:find("user", 1, true), proxy_url .. " leaked: " .. said)
    end
    -- a client's proxy too
    local api = rw.client { base_url = origin.base, proxy = REFUSED_PROXIES[1], on_retry = false, max_retries = 0 }
    local _, err = api:get("/refused")
    assert.matches("Unsupported proxy syntax in 'http://[redacted]@127.0.0.1:1'", tostring(err), 1, true)
    assert.equal(0, #origin:log("/refused"))
  end)

  it("does not retry a proxy URL libcurl refuses (no retry mends it, as curl's --retry)", function()
    for _, proxy_url in ipairs { "http://127.0.0.1:99999", "http://user:pa ssSECRET@127.0.0.1:1",
                                 "http://user:pa#ssSECRET@127.0.0.1:1", "socks9://127.0.0.1:1" } do
      local retries = 0
      local res, err = rw.fetch(origin:url("/refused-once"), { proxy = proxy_url, max_retries = 3, base = 0.001,
        on_retry = function() retries = retries + 1 end })
      assert.is_nil(res)
      assert.equal("network", err.kind, proxy_url .. ": " .. tostring(err))
      assert.matches("Unsupported proxy", tostring(err), 1, true)
      assert.equal(0, retries, proxy_url)
      assert.equal(1, err.attempts, proxy_url)
    end
    assert.equal(0, #origin:log("/refused-once"))
  end)

  it("names no part of the credentials of http_proxy (the variable) in an error or the retry line", function()
    for _, proxy_url in ipairs { "http://user:p@ssSECRET@127.0.0.1:1", "user:pa ssSECRET@127.0.0.1:1" } do
      local out = subprocess.run_lua([[
        local rw = require "ratewise"
        local res, err = rw.fetch(arg[1], { max_retries = 1, base = 0.001 })
        print(res and res.status or tostring(err))
      ]], { args = origin:url("/env-refused"), seconds = 20,
        shell = "env -u https_proxy -u HTTPS_PROXY -u all_proxy -u ALL_PROXY -u no_proxy -u NO_PROXY "
          .. "http_proxy='" .. proxy_url .. "' " })
      assert.is_nil(out:find("retrying", 1, true), out) -- not retried: no retry mends the URL
      assert.matches("ratewise: network", out)
      assert.is_nil(out:find("SECRET", 1, true), out)
    end
  end)

  it("tunnels HTTPS through the proxy with CONNECT, the TLS checks end to end", function()
    local tls = server.start_tls_ca()
    local ok, err = pcall(function()
      local proxy_url = "http://user:s3cret@127.0.0.1:" .. proxy.port
      local res = assert(rw.fetch(tls:url("/secure"), opts { proxy = proxy_url, ca_file = tls.ca_file }))
      assert.equal(200, res.status)
      local tunnels = proxy:log("CONNECT")
      assert.equal(1, #tunnels)
      assert.equal("127.0.0.1:" .. tls.port, tunnels[1].query)
      assert.is_true(tunnels[1].proxy_auth)
      assert.equal(1, #tls:log("/secure")) -- the origin saw the request, through the tunnel
      assert.is_nil(tls:log("/secure")[1].headers["proxy-authorization"]) -- the proxy's credentials stay with it
      -- a POST goes through the tunnel too (libcurl counts the CONNECT as
      -- bytes sent: the guard against its own replay must not take it for
      -- the request: src/request.c, request_on_prereq), on the kept tunnel,
      -- and a POST the origin drops unanswered there is not sent again
      local posted = assert(rw.fetch(tls:url("/post"), opts { proxy = proxy_url, ca_file = tls.ca_file, body = "a=1" }))
      assert.equal(200, posted.status)
      assert.equal("a=1", tls:log("/post")[1].body)
      tls:script("/drop", { { action = "drop" }, { status = 200 } })
      local dropped, derr = rw.fetch(tls:url("/drop"), opts { proxy = proxy_url, ca_file = tls.ca_file, body = "b=2",
        base = 0.01 })
      assert.is_nil(dropped)
      assert.equal("unsafe", derr.kind)
      assert.equal(1, #tls:log("/drop"))
      assert.equal(tls:log("/post")[1].conn, tls:log("/drop")[1].conn)
      -- the certificate is still the origin's to prove: without its CA, no tunnel makes it trusted
      local res2, err2 = rw.fetch(tls:url("/secure"), opts { proxy = proxy_url, max_retries = 0 })
      assert.is_nil(res2)
      assert.equal("network", err2.kind)
      assert.matches("TLS verification failed", err2.message)
      assert.is_nil(tostring(err2):find("s3cret", 1, true))
    end)
    tls:stop()
    assert(ok, err)
  end)

  it("reaches an https:// proxy over TLS, trusting it by proxy_ca_file, and tunnels through it", function()
    local tls_proxy = server.start_tls_ca()
    local tls = server.start_tls_ca()
    local ok, err = pcall(function()
      local proxy_url = "https://user:s3cret@127.0.0.1:" .. tls_proxy.port
      local res = assert(rw.fetch(tls:url("/far"), opts { proxy = proxy_url, proxy_ca_file = tls_proxy.ca_file,
        ca_file = tls.ca_file }))
      assert.equal(200, res.status)
      assert.equal(1, #tls_proxy:log("CONNECT"))
      assert.is_true(tls_proxy:log("CONNECT")[1].proxy_auth)
      assert.equal(1, #tls:log("/far"))
      -- the proxy's certificate is checked too: without its CA, nothing goes through
      local res2, err2 = rw.fetch(tls:url("/far"), opts { proxy = proxy_url, ca_file = tls.ca_file })
      assert.is_nil(res2)
      assert.equal("network", err2.kind)
      assert.is_nil(tostring(err2):find("s3cret", 1, true))
      assert.equal(1, #tls_proxy:log("CONNECT"))
    end)
    tls_proxy:stop()
    tls:stop()
    assert(ok, err)
  end)

  -- The shell words that run a program with only the given proxy variables
  -- ("http_proxy=... "), whatever the machine's own environment holds.
  local function proxy_env(vars)
    return "env -u http_proxy -u https_proxy -u HTTPS_PROXY -u all_proxy -u ALL_PROXY -u no_proxy -u NO_PROXY "
      .. (vars or "")
  end

  it("honours http_proxy and no_proxy as libcurl reads them", function()
    local code = [[
      local rw = require "ratewise"
      local res, err = rw.fetch(arg[1], { on_retry = false, max_retries = 0 })
      print(res and res.status or tostring(err))
    ]]
    local out = subprocess.run_lua(code, { args = origin:url("/env"),
      shell = proxy_env("http_proxy=http://127.0.0.1:" .. proxy.port .. " "), seconds = 20 })
    assert.equal("200\n", out)
    assert.equal(1, #proxy:log("/env"))
    out = subprocess.run_lua(code, { args = origin:url("/env"),
      shell = proxy_env("http_proxy=http://127.0.0.1:" .. proxy.port .. " no_proxy=127.0.0.1 "), seconds = 20 })
    assert.equal("200\n", out)
    assert.equal(1, #origin:log("/env"))
  end)

  -- A handle made while no proxy variable is set skips libcurl's lookups
  -- (src/request.c); any one of them set leaves them all to libcurl.
  it("honours all_proxy, and no_proxy for a proxy given as an option", function()
    local code = [[
      local rw = require "ratewise"
      local res, err = rw.fetch(arg[1], { on_retry = false, max_retries = 0, proxy = arg[2] })
      print(res and res.status or tostring(err))
    ]]
    local out = subprocess.run_lua(code, { args = origin:url("/all"),
      shell = proxy_env("all_proxy=http://127.0.0.1:" .. proxy.port .. " "), seconds = 20 })
    assert.equal("200\n", out)
    assert.equal(1, #proxy:log("/all"))
    assert.equal(0, #origin:log("/all"))
    out = subprocess.run_lua(code, { args = origin:url("/direct") .. " http://127.0.0.1:" .. proxy.port,
      shell = proxy_env("no_proxy=127.0.0.1 "), seconds = 20 })
    assert.equal("200\n", out)
    assert.equal(0, #proxy:log("/direct"))
    assert.equal(1, #origin:log("/direct"))
    out = subprocess.run_lua(code, { args = origin:url("/option") .. " http://127.0.0.1:" .. proxy.port,
      shell = proxy_env(), seconds = 20 })
    assert.equal("200\n", out)
    assert.equal(1, #proxy:log("/option"))
  end)
end)

describe("decompression", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  for _, encoding in ipairs { "gzip", "deflate", "br", "zstd" } do
    it("decodes a " .. encoding .. " body, asked for or not", function()
      local body = string.rep("ratewise ", 1000)
      s:script("/z", { { encoding = encoding, body = body, headers = { ["Content-Type"] = "text/plain" } } })
      local res = assert(rw.fetch(s:url("/z"), quiet))
      assert.equal(body, res.body)
      assert.matches(encoding, s:log("/z")[1].headers["accept-encoding"])
      -- a caller that names its own Accept-Encoding still gets the body decoded
      res = assert(rw.fetch(s:url("/z"), opts { headers = { ["Accept-Encoding"] = encoding } }))
      assert.equal(body, res.body)
    end)
  end

  it("counts max_body on the decoded body: a compression bomb ends as too large", function()
    for _, encoding in ipairs { "gzip", "br", "zstd" } do
      s:script("/bomb", { { encoding = encoding, body = string.rep("\0", 8 * 1024 * 1024) } })
      local res, err = rw.fetch(s:url("/bomb"), opts { max_body = 1024 * 1024 })
      assert.is_nil(res, encoding)
      assert.equal("network", err.kind)
      assert.matches("body too large %(limit 1048576 bytes%)", err.message)
    end
  end)

  it("leaves the body as sent with decompress = false", function()
    s:script("/raw", { { encoding = "gzip", body = "hello" } })
    local res = assert(rw.fetch(s:url("/raw"), opts { decompress = false }))
    assert.equal("\31\139", res.body:sub(1, 2)) -- gzip's magic
    assert.is_nil(s:log("/raw")[1].headers["accept-encoding"])
    res = assert(rw.fetch(s:url("/raw"), quiet)) -- the next request on that handle decodes again
    assert.equal("hello", res.body)
  end)
end)

-- The engine's gate (src/engine.c): the first burst to an https origin
-- waits for one answer before the rest go. Each spec has an origin of its
-- own: once an origin has answered, the engine knows it, and holds nothing.
-- A new server is not enough (its port may be one an earlier spec's server
-- had, which the engine may still know: it forgets an origin once it finds
-- its connections closed): the gate's key is the URL's authority, userinfo
-- included, so url(path) names a user no other spec does.
describe("the first burst to an https origin", function()
  local origins = 0
  local function with_origin(fn)
    local s = server.start_tls_ca()
    origins = origins + 1
    local authority = ("https://burst%d@127.0.0.1:%s"):format(origins, s.base:match(":(%d+)$"))
    local ok, err = pcall(fn, s, function(path) return authority .. path end)
    s:stop()
    assert(ok, err)
  end

  -- Eight tasks fetch `url` (on server s) at once; the first to reach the
  -- server is answered after 0.3 s, the others after 0.1 s each: long
  -- enough that no connection comes free for another of them while new
  -- ones are set up (under ASan, answered at once, three connections served
  -- all eight), short enough that one after another would take 0.7 s.
  -- Returns when each ended, in seconds from the start, in order.
  local function burst(s, url)
    s:script("/first", { { status = 200, delay = 0.3, body = "first" }, { status = 200, delay = 0.1, body = "next" } })
    local ends = {}
    local t0 = rw.now()
    rw.run(function()
      for i = 1, 8 do
        rw.spawn(function()
          assert(rw.fetch(url, opts { ca_file = s.ca_file }))
          ends[i] = rw.now() - t0
        end)
      end
    end)
    table.sort(ends)
    return ends
  end

  it("holds the rest until the first answer, then lets them all go at once", function()
    with_origin(function(s, url)
      local ends = burst(s, url("/first"))
      local log = s:log("/first")
      assert.equal(8, #log)
      -- the other seven reached the server once the first was answered, and
      -- together on connections of their own, not one after another on one
      assert.is_true(ends[1] >= 0.29, ("first answer at %.2f s"):format(ends[1]))
      assert.is_true(ends[8] - ends[2] < 0.25, ("the rest took %.2f s"):format(ends[8] - ends[2]))
      local connections, n = {}, 0
      for _, rec in ipairs(log) do
        if not connections[rec.conn] then n = n + 1 end
        connections[rec.conn] = true
      end
      -- (each request's connection, its place on it and when it came, and
      -- when each call ended: what happened, should this fail)
      local seen = {}
      for i, rec in ipairs(log) do
        seen[i] = ("%s #%s at %.3f s"):format(tostring(rec.conn), tostring(rec.conn_seq), rec.t - log[1].t)
      end
      assert.is_true(n >= 4, ("%d connections for 8 requests: %s; the calls ended at %s s"):format(n,
        table.concat(seen, ", "), table.concat(ends, ", ")))
    end)
  end)

  -- The gate's key is the URL's authority, userinfo included: each user
  -- below is an origin of its own to the engine, on one server.
  it("holds a burst to a new origin after more than 64 others have become known", function()
    with_origin(function(s, url)
      local port = s.base:match(":(%d+)$")
      for i = 1, 70 do
        assert(rw.fetch(("https://u%d@127.0.0.1:%s/known"):format(i, port), opts { ca_file = s.ca_file }))
      end
      local ends = burst(s, url("/first"))
      assert.equal(8, #s:log("/first"))
      assert.is_true(ends[1] >= 0.29, ("first answer at %.2f s: the burst was not held"):format(ends[1]))
    end)
  end)

  it("ends every request of a burst whose origin cannot be reached, none left waiting", function()
    local results = {}
    local t0 = rw.now()
    rw.run(function()
      for i = 1, 6 do
        rw.spawn(function()
          local res, err = rw.fetch("https://127.0.0.1:1/x", opts { max_elapsed = 5 })
          results[i] = res and res.status or err.kind
        end)
      end
    end)
    assert.same({ "exhausted", "exhausted", "exhausted", "exhausted", "exhausted", "exhausted" }, results)
    assert.is_true(rw.now() - t0 < 3)
  end)

  -- A held request waits for the probe's answer at most half its own
  -- timeout, then goes on without it, on a connection of its own.
  it("lets held requests go on unheld when the first answer is slower than their timeout", function()
    with_origin(function(s, url)
      s:script("/late", { { status = 200, delay = 1.5, body = "first" }, { status = 200, body = "next" } })
      local results, ends = {}, {}
      local t0 = rw.now()
      rw.run(function()
        local first = rw.spawn(function() return rw.fetch(url("/late"), opts { ca_file = s.ca_file }) end)
        rw.sleep(0.05)
        local held = {}
        for i = 1, 3 do
          held[i] = rw.spawn(function()
            local res, err = rw.fetch(url("/late"), opts { ca_file = s.ca_file, timeout = 0.8 })
            ends[i] = rw.now() - t0
            results[i] = res and res.body or tostring(err)
          end)
        end
        for i = 1, 3 do held[i]:join() end
        assert.equal("first", assert(first:join()).body)
      end)
      assert.same({ "next", "next", "next" }, results)
      assert.equal(4, #s:log("/late"))
      for i = 1, 3 do
        assert.is_true(ends[i] < 1.2, ("held request %d ended at %.2f s, after the first answer"):format(i, ends[i]))
      end
    end)
  end)

  it("lets a held request that is cancelled leave the line, sending nothing", function()
    with_origin(function(s, url)
      s:script("/slow", { { status = 200, delay = 0.3 }, { status = 200 } })
      local kept
      rw.run(function()
        local first = rw.spawn(function() return rw.fetch(url("/slow"), opts { ca_file = s.ca_file }) end)
        rw.sleep(0.05)
        local held = rw.spawn(function() return rw.fetch(url("/slow"), opts { ca_file = s.ca_file }) end)
        local other = rw.spawn(function() return rw.fetch(url("/slow"), opts { ca_file = s.ca_file }) end)
        rw.sleep(0.05)
        held:cancel()
        assert(first:join())
        kept = assert(other:join())
      end)
      assert.equal(200, kept.status)
      assert.equal(2, #s:log("/slow"))
    end)
  end)
end)
