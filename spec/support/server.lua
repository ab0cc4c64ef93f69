--- Lua 5.4 driver for the scriptable test server (spec/support/server.py).
--
--   local server = require "spec.support.server"
--   local s = server.start{ args = {"--api-rate", "5"} }
--   s:script("/x", { {status = 429, headers = {["Retry-After"] = "1"}},
--                    {status = 200, body = "ok"} })
--   ... make requests to s:url("/x") ...
--   local log = s:log("/x")   -- array of request records
--   s:reset()
--   s:stop()
--
-- The require path works from the repo root (where busted runs) because
-- Lua 5.4's default package.path contains "./?.lua".
--
-- Control calls use luasocket + lua-cjson only, never the project's code, so
-- a bug in ratewise cannot hide behind a bug in its own test harness.

local socket = require "socket"
local http = require "socket.http"
local ltn12 = require "ltn12"
-- A private cjson instance: specs that change cjson settings don't affect us.
local cjson = require("cjson").new()

local M = {}

M.PYTHON = "/usr/bin/python3" -- not the pyenv python3 first on PATH
M.START_TIMEOUT = 5           -- seconds to wait for "listening <port> <pid>"
M.CONTROL_TIMEOUT = 10        -- seconds for one control call

-- server.py lives next to this file.
local function script_path()
  local src = debug.getinfo(1, "S").source
  local dir = src:sub(1, 1) == "@" and src:sub(2):match("^(.*)/[^/]*$") or nil
  return (dir or "spec/support") .. "/server.py"
end
M.SCRIPT = script_path()

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local data = f:read("*a")
  f:close()
  return data
end
M.read_file = read_file

--- A port of 127.0.0.1 free a moment ago (nothing listens on it now).
function M.free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

-- True while the process exists and is not a zombie (Linux /proc).
local function alive(pid)
  local stat = read_file("/proc/" .. pid .. "/stat")
  if not stat then return false end
  local state = stat:match(".*%) (%a)") -- after "(comm)", which may hold spaces
  return state ~= nil and state ~= "Z" and state ~= "X"
end

local function signal(pid, sig)
  os.execute("kill -" .. sig .. " " .. pid .. " 2>/dev/null")
end

-- The server logs text decoded as latin-1 (one char per byte); JSON carries
-- those chars as \u00XX, which cjson turns into UTF-8. Map them back so specs
-- see the exact bytes that went over the wire.
-- Only code points below 256 come back, so each is one byte or two
-- (110000xx 10xxxxxx); decoded by hand, for the Luas without utf8.
local function latin1_bytes(s)
  if type(s) ~= "string" or not s:find("[\128-\255]") then return s end
  return (s:gsub("([\194\195])([\128-\191])", function(lead, cont)
    return string.char((lead:byte() - 192) * 64 + (cont:byte() - 128))
  end))
end

local function url_encode(s)
  return (s:gsub("[^%w%-%._~/]", function(c)
    return string.format("%%%02X", c:byte())
  end))
end

local Server = {}
Server.__index = Server

--- The most requests of a log the server was handling at once: for each
-- record, those of the log that had arrived and not yet begun to send their
-- answer's last bytes (t_answer; none yet: still being handled). Not the
-- server's own count at arrival (record.active), which also counts other
-- specs' handlers still winding down, and a handler that has answered but
-- not yet been scheduled again on a loaded machine.
function M.max_active(log)
  local most = 0
  for _, r in ipairs(log) do
    local n = 0
    for _, q in ipairs(log) do
      if q.t <= r.t and (q.t_answer == nil or r.t < q.t_answer) then n = n + 1 end
    end
    if n > most then most = n end
  end
  return most
end

--- Start a server. opts (all optional):
--   args    = array of extra command-line arguments for server.py
--   timeout = seconds to wait for startup (default M.START_TIMEOUT)
--   stderr  = file to keep the server's stderr in (default: a temp file that
--             is deleted on stop)
function M.start(opts)
  opts = opts or {}
  local out = os.tmpname()
  local err = opts.stderr or os.tmpname()
  local argv = { M.PYTHON, M.SCRIPT, "--exit-with-parent" }
  for _, a in ipairs(opts.args or {}) do argv[#argv + 1] = a end
  if opts.tls then -- {cert = PEM file, key = PEM file [, client_ca = PEM file]}: serve HTTPS
    argv[#argv + 1] = "--tls-cert"; argv[#argv + 1] = opts.tls.cert
    argv[#argv + 1] = "--tls-key"; argv[#argv + 1] = opts.tls.key
    if opts.tls.client_ca then
      argv[#argv + 1] = "--tls-client-ca"; argv[#argv + 1] = opts.tls.client_ca
    end
  end
  for i, a in ipairs(argv) do argv[i] = shell_quote(a) end

  -- "echo $$" gives us the pid at once (exec keeps the shell's pid), so the
  -- startup deadline can be enforced: stdout goes to a file that we poll,
  -- instead of a blocking read on the pipe that could hang forever.
  -- The popen handle stays open; closing it reaps the process.
  local cmd = "echo $$; exec " .. table.concat(argv, " ")
    .. " <" .. "/dev/null >" .. shell_quote(out) .. " 2>" .. shell_quote(err)
  local proc = assert(io.popen(cmd, "r"))
  local pid = tonumber(proc:read("*l"))

  local function fail(why)
    if pid then signal(pid, "KILL") end
    proc:close()
    local stderr = read_file(err) or ""
    os.remove(out)
    if not opts.stderr then os.remove(err) end
    error(("spec.support.server: %s\n  command: %s\n  stderr: %s")
      :format(why, cmd, stderr ~= "" and stderr or "(empty)"), 0)
  end
  if not pid then fail("could not start the shell") end

  local deadline = socket.gettime() + (opts.timeout or M.START_TIMEOUT)
  local port
  while true do
    local line = read_file(out) or ""
    port = tonumber(line:match("^listening (%d+) %d+\n"))
    if port then break end
    if not alive(pid) then fail("server.py exited before it was listening") end
    if socket.gettime() > deadline then
      fail(("no 'listening' line within %g s"):format(opts.timeout or M.START_TIMEOUT))
    end
    socket.sleep(0.02)
  end

  return setmetatable({
    port = port,
    pid = pid,
    base = (opts.tls and "https" or "http") .. "://127.0.0.1:" .. port,
    _proc = proc,
    _out = out,
    _err = err,
    _own_err = not opts.stderr,
  }, Server)
end

local function openssl(dir, command)
  local ok = os.execute("cd " .. shell_quote(dir) .. " && ( " .. command .. " ) >/dev/null 2>&1")
  assert(ok == true or ok == 0, "openssl failed: " .. command)
end

--- An HTTPS server whose certificate (for 127.0.0.1 and localhost) a CA
-- of its own signed, made with openssl in a temporary folder that stop()
-- removes. The server has ca_file (the CA, for ca_file options),
-- client_cert and client_key (a client certificate of the same CA),
-- client_key_encrypted (the same key, with the password "hunter2") and
-- pin (the sha256// pin of its public key). With opts.client_cert_required
-- it asks every client for a certificate of that CA.
function M.start_tls_ca(opts)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. shell_quote(dir)))
  local req = "openssl req -newkey rsa:2048 -nodes -days 2 "
  openssl(dir, "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ratewise-test-ca -keyout ca.key "
    .. "-out ca.pem")
  openssl(dir, req .. "-subj /CN=127.0.0.1 -keyout key.pem -out server.csr")
  openssl(dir, "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext")
  openssl(dir, "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
    .. "-extfile san.ext -out cert.pem")
  openssl(dir, req .. "-subj /CN=ratewise-client -keyout client.key -out client.csr")
  openssl(dir, "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem")
  openssl(dir, "openssl pkey -in client.key -aes256 -passout pass:hunter2 -out client-encrypted.key")
  openssl(dir, "openssl x509 -in cert.pem -pubkey -noout | openssl pkey -pubin -outform der "
    .. "| openssl dgst -sha256 -binary | openssl enc -base64 > pin.txt")
  local f = assert(io.open(dir .. "/pin.txt"))
  local pin = "sha256//" .. f:read("*l")
  f:close()
  opts = opts or {}
  opts.tls = { cert = dir .. "/cert.pem", key = dir .. "/key.pem",
    client_ca = opts.client_cert_required and dir .. "/ca.pem" or nil }
  opts.client_cert_required = nil
  local s = M.start(opts)
  s._tls_dir = dir
  s.ca_file, s.ca_dir, s.pin = dir .. "/ca.pem", dir, pin
  s.client_cert, s.client_key = dir .. "/client.pem", dir .. "/client.key"
  s.client_key_encrypted = dir .. "/client-encrypted.key"
  return s
end

--- An HTTPS server with a fresh self-signed certificate (for 127.0.0.1),
-- made with openssl in a temporary folder that stop() removes.
function M.start_tls(opts)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. shell_quote(dir)))
  assert(os.execute("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 -keyout "
    .. shell_quote(dir .. "/key.pem") .. " -out " .. shell_quote(dir .. "/cert.pem") .. " 2>/dev/null"))
  opts = opts or {}
  opts.tls = { cert = dir .. "/cert.pem", key = dir .. "/key.pem" }
  local s = M.start(opts)
  s._tls_dir = dir
  return s
end

--- Stop the server (SIGTERM, then SIGKILL after 3 s). Idempotent.
function Server:stop()
  if self._stopped then return end
  self._stopped = true
  signal(self.pid, "TERM")
  local deadline = socket.gettime() + 3
  while alive(self.pid) and socket.gettime() < deadline do socket.sleep(0.01) end
  if alive(self.pid) then signal(self.pid, "KILL") end
  self._proc:close() -- waitpid: no zombie left behind
  os.remove(self._out)
  if self._tls_dir then os.execute("rm -rf " .. shell_quote(self._tls_dir)) end
  if self._own_err then os.remove(self._err) end
end

-- A forgotten stop() must not leave a server running. (server.py also exits
-- by itself when its parent dies, thanks to --exit-with-parent.)
Server.__gc = Server.stop

function Server:url(path)
  return self.base .. (path or "/")
end

-- One control call; returns the decoded JSON answer or raises a clear error.
function Server:_control(method, path, payload)
  assert(not self._stopped, "spec.support.server: server already stopped")
  local body = payload ~= nil and cjson.encode(payload) or nil
  local chunks = {}
  -- socket.http applies its module-wide TIMEOUT to every socket it creates;
  -- set ours just for this call.
  local saved = http.TIMEOUT
  http.TIMEOUT = M.CONTROL_TIMEOUT
  local ok, res, code = pcall(http.request, {
    url = self.base .. path,
    method = method,
    headers = body and {
      ["content-type"] = "application/json",
      ["content-length"] = tostring(#body),
    } or nil,
    source = body and ltn12.source.string(body) or nil,
    sink = ltn12.sink.table(chunks),
  })
  http.TIMEOUT = saved
  local where = ("spec.support.server: %s %s"):format(method, path)
  if not ok then error(where .. " failed: " .. tostring(res), 3) end
  if not res then error(where .. " failed: " .. tostring(code), 3) end
  local text = table.concat(chunks)
  if code ~= 200 then
    error(("%s: HTTP %s: %s"):format(where, tostring(code), text), 3)
  end
  local decoded_ok, value = pcall(cjson.decode, text)
  if not decoded_ok then
    error(("%s: bad JSON (%s): %s"):format(where, value, text), 3)
  end
  return value
end

--- Script the responses for one path (exact match, query ignored).
-- steps: non-empty array of step tables; the last one repeats forever.
-- Step fields and actions: see the docstring of server.py (among them
-- reset_body = headers, part of the body, then a TCP RST; raw = the body is
-- the whole answer, status line included).
-- An empty step {} means "200, empty body" (cjson encodes {} as an object,
-- which is what a step is).
function Server:script(path, steps)
  assert(type(path) == "string", "script: path must be a string")
  if type(steps) ~= "table" or #steps == 0 then
    -- cjson would encode an empty array as {} and the server would refuse it
    -- anyway; say so here, where the mistake is.
    error("spec.support.server: script(" .. path .. ") needs a non-empty array of steps", 2)
  end
  self:_control("POST", "/_script", { path = path, steps = steps })
end

--- Requests to path pass a token bucket of `burst` tokens refilled at
-- `rate` a second, as a rate-limited API does: 200, or 429 with
-- retry_after (a string) as its Retry-After. Each logged request says
-- whether it was limited. Scripts win over it; reset forgets it.
-- With window = W and limit = N instead: a fixed window of N requests per W
-- seconds answering with the headers of `as` (express, express-draft-6,
-- express-draft-7, fastify, flexible: see server.py); retry_after = false
-- leaves Retry-After out.
function Server:limit(path, opts)
  self:_control("POST", "/_limit", { path = path, rate = opts.rate, burst = opts.burst,
    retry_after = opts.retry_after, window = opts.window, limit = opts.limit, as = opts.as })
end

--- ok, limited = s:counted(path): how many requests the limit on path let
-- through and answered 429.
function Server:counted(path)
  local counts = self:_control("GET", "/_limit?path=" .. url_encode(path))
  return counts.ok, counts.limited
end

--- Requests to path meet an LLM API's rate limits (spec/support/llm_mock.py):
-- opts.provider ("openai" or "anthropic"), opts.models (model name ->
-- { rpm =, tpm = } or { rpm =, itpm =, otpm = }), and optionally hold (the
-- seconds of each per-minute limit a bucket holds), use_min and use_max
-- (the share of max_tokens an answer uses), speed (tokens a second),
-- chars_per_token and default_max_tokens. Scripts and /_limit win over it.
function Server:llm(path, opts)
  local payload = { path = path }
  for k, v in pairs(opts) do payload[k] = v end
  self:_control("POST", "/_llm", payload)
end

--- counts = s:llm_counts(path): by model, ok and limited (requests),
-- counted (tokens per limit, corrections included), used (input and output
-- tokens answered) and first/last (the server's clock at the first and last
-- admission).
function Server:llm_counts(path)
  return self:_control("GET", "/_llm?path=" .. url_encode(path))
end

--- Request records, oldest first; only those for `path` if given.
-- Always a plain Lua sequence (an empty log is {}). Fields: seq, path,
-- query, method, headers (lowercase names), body, t, wall, conn, conn_seq,
-- active, t_answer (when the handler began its last send; nil before);
-- an endless answer's sent and gone, once it ended (server.py).
-- Strings hold the exact request bytes.
function Server:log(path)
  local q = path and ("?path=" .. url_encode(path)) or ""
  local records = self:_control("GET", "/_log" .. q)
  local out = {}
  for i, r in ipairs(records) do
    -- cjson decodes every number as a float; counters read better as integers.
    for _, k in ipairs { "seq", "conn_seq", "active" } do
      r[k] = math.tointeger and math.tointeger(r[k]) or r[k]
    end
    r.body = latin1_bytes(r.body)
    r.path = latin1_bytes(r.path)
    r.query = latin1_bytes(r.query)
    for k, v in pairs(r.headers) do r.headers[k] = latin1_bytes(v) end
    out[i] = r
  end
  return out
end

--- Forget all scripts, the log (seq restarts at 1), the limits and the demo limiter.
function Server:reset()
  self:_control("POST", "/_reset")
end

return M
