-- ratewise.core below rw.fetch: the engine's requests, its connection caps,
-- the module's entry points and what the shared object exports, checked
-- against a real server on loopback and in separate processes.
local core = require "ratewise.core"
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

-- Runs a Lua program in a process of its own (instrumented under make
-- test-asan); shell, if given, comes before it ("ulimit -n 64; ", a pipe).
-- Returns its output and whether it exited with 0.
local function run_lua(code, args, shell)
  local file = os.tmpname()
  local f = assert(io.open(file, "w"))
  f:write(code)
  f:close()
  local p = assert(io.popen("sh -c '" .. (shell or "")
    .. subprocess.lua_command(file):gsub("'", "'\\''") .. " " .. (args or "") .. "' 2>&1"))
  local out = p:read("a")
  local ok = p:close()
  os.remove(file)
  return out, ok
end

-- Runs a transfer to its end on engine e.
local function finish(e, t)
  local deadline = core.now() + 10
  while not t:done() and core.now() < deadline do e:poll(0.5) end
  assert(t:done(), "the transfer did not finish within 10 s")
  return t:result()
end

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
    assert.is_nil(a:match("^" .. a:sub(1, 1):gsub("%W", "%%%0") .. "+$"))
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
    local build = "cc -O2 -fPIC -D_POSIX_C_SOURCE=200809L $(pkg-config --cflags lua5.4 libcurl) -shared -o "
      .. dir .. "/core.so src/*.c $(pkg-config --libs libcurl) -lm 2>&1"
    local p = assert(io.popen(build))
    local out = p:read("a")
    assert(p:close(), "the build failed: " .. out)
    p = assert(io.popen("nm -D --defined-only " .. dir .. "/core.so"))
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
end)
