-- The fast-path caches (lua/ratewise/fetch/cache.lua) are transparent: the
-- same fetch and rw.client calls (spec/support/fast_paths_battery.lua), run
-- once with them on and once with RATEWISE_FAST_PATHS=off, send the server
-- the same requests and give their callers the same answers.
--
-- What must differ between the runs is normalized, on both sides: a
-- generated Idempotency-Key (a version 4 UUID, wherever it appears: a
-- request header, an /echo body that repeats it) and the seconds an error
-- message gives. Nothing else is left out: every request's method, path,
-- query, header fields (by lower-case name) and body, and every call's
-- status, response headers, body, url, attempts and redirects, or its
-- error's kind, message, status and attempts, or what it raised.
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

local BATTERY = "spec/support/fast_paths_battery.lua"
local UUID = "%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89ab]%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x"

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- What the server saw of each request, in order, as one line apiece.
local function requests_seen(log)
  local out = {}
  for i, r in ipairs(log) do
    local names = {}
    for name in pairs(r.headers) do names[#names + 1] = name end
    table.sort(names)
    local fields = {}
    for j, name in ipairs(names) do
      fields[j] = name .. ": " .. r.headers[name]:gsub(UUID, "<uuid>")
    end
    out[i] = string.format("%s %s?%s | %s | %q", r.method, r.path, r.query, table.concat(fields, " | "),
      (r.body:gsub(UUID, "<uuid>")))
  end
  return out
end

describe("the fast-path caches", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  -- lines, probe, requests = run(switch): the battery's lines by call
  -- name (and their order), what its caches held at the end, and what
  -- the server saw, with RATEWISE_FAST_PATHS set to switch (nil: unset).
  local function run(switch)
    s:reset()
    s:script("/retry", { { status = 429, headers = { ["Retry-After"] = "0" } }, { status = 200, body = "done" } })
    s:script("/retry_post", { { status = 429, headers = { ["Retry-After"] = "0" } }, { status = 201, body = "made" } })
    s:script("/redirect", { { action = "redirect", location = "/echo" } })
    local out_file = os.tmpname()
    local env = switch and ("RATEWISE_FAST_PATHS=" .. switch .. " ") or ""
    local output, code = subprocess.shell(env .. subprocess.env .. "timeout 120 " .. subprocess.lua .. " "
      .. BATTERY .. " " .. shell_quote(s.base) .. " " .. shell_quote(out_file))
    local text = server.read_file(out_file) or ""
    os.remove(out_file)
    assert.equal(0, code, output)
    local calls, probe = {}, nil
    for line in text:gmatch("[^\n]+") do
      local name, value = line:match("^([^\t]*)\t(.*)$")
      if name == "probe" then
        probe = assert((rawget(_G, "loadstring") or load)("return " .. value))()
      else
        calls[#calls + 1] = { name = name, value = value }
      end
    end
    return calls, probe, requests_seen(s:log())
  end

  it("send the same requests and answer the same with RATEWISE_FAST_PATHS=off", function()
    local on_calls, on_probe, on_seen = run(nil)
    local off_calls, off_probe, off_seen = run("off")

    -- The battery ran whole both ways and filled the caches only when on.
    assert.is_true(#on_calls > 600)
    assert.same({ switch = true, url_facts = true, checked = true, lines_made = true, lines_made_json = true,
      plain_paths = true, plain_calls = true, last_path = true },
      { switch = on_probe.switch, url_facts = on_probe.url_facts > 0, checked = on_probe.checked > 0,
        lines_made = on_probe.lines_made > 0, lines_made_json = on_probe.lines_made_json > 0,
        plain_paths = on_probe.plain_paths > 0, plain_calls = on_probe.plain_calls > 0,
        last_path = on_probe.last_path })
    assert.same({ switch = false, url_facts = 0, checked = 0, lines_made = 0, lines_made_json = 0,
      plain_paths = 0, plain_calls = 0, last_path = false }, off_probe)

    -- call by call, every difference named
    assert.equal(#on_calls, #off_calls)
    local differences = {}
    for i, call in ipairs(on_calls) do
      assert.equal(call.name, off_calls[i].name)
      if call.value ~= off_calls[i].value then
        differences[#differences + 1] = string.format("call '%s'\n  on:  %s\n  off: %s", call.name, call.value,
          off_calls[i].value)
      end
    end
    -- (the first request that differs: those after it are out of step)
    for i = 1, math.max(#on_seen, #off_seen) do
      if on_seen[i] ~= off_seen[i] then
        differences[#differences + 1] = string.format("request %d (of %d and %d)\n  on:  %s\n  off: %s", i,
          #on_seen, #off_seen, tostring(on_seen[i]), tostring(off_seen[i]))
        break
      end
    end
    assert.same({}, differences)
  end)
end)
