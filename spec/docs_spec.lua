-- Every Lua example in the docs runs, and the README is a map of docs/.
--
-- The pages: README.md, docs/*.md and bench/README.md. Conventions for
-- whoever writes an example there:
--   * A ```lua block is a program of its own: it runs in a separate lua5.4
--     process with this tree's ratewise and must exit with status 0.
--   * Its URLs may name the real APIs (https://api.github.com/...): before
--     it runs, every http:// or https:// origin in it is replaced with the
--     suite's loopback test server, which answers the paths in `fixtures`
--     below as those APIs would (and "200 ok" elsewhere). A block that names
--     a URL must make the server see at least one request.
--   * It runs with GITHUB_TOKEN, OPENAI_API_KEY and ANTHROPIC_API_KEY unset,
--     the way a newcomer first runs it.
--   * A block that cannot run alone (it uses names defined elsewhere, or a
--     host such as OpenResty) has `<!-- fragment -->` on the line right
--     before its fence: it is compiled, not run.
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

local FRAGMENT = "<!-- fragment -->"
-- A build without Redis support (`make test REDIS=0`) cannot run a block
-- that connects to Redis itself (a redis:// URL): those are pending there.
local has_redis = require("ratewise").features.redis

local function read(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function docs_pages()
  local pages = {}
  local p = assert(io.popen("ls docs/*.md 2>/dev/null"))
  for line in p:lines() do pages[#pages + 1] = line end
  p:close()
  return pages
end

local pages = { "README.md", "bench/README.md" }
for _, page in ipairs(docs_pages()) do pages[#pages + 1] = page end

-- The ```lua blocks of a page: {page, line, code, fragment}. A fence may be
-- indented (inside a list item); that indent is taken off every line.
local function blocks_of(page)
  local found, lines = {}, {}
  for line in (read(page) .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  local i = 1
  while i <= #lines do
    local indent = lines[i]:match("^(%s*)```lua%s*$")
    if indent then
      local first, code = i, {}
      i = i + 1
      while i <= #lines and not lines[i]:match("^%s*```%s*$") do
        code[#code + 1] = lines[i]:sub(1, #indent) == indent and lines[i]:sub(#indent + 1) or lines[i]
        i = i + 1
      end
      assert(i <= #lines, page .. ":" .. first .. ": a ```lua block is never closed")
      found[#found + 1] = {
        page = page, line = first, code = table.concat(code, "\n") .. "\n",
        fragment = first > 1 and lines[first - 1]:match("^%s*(.-)%s*$") == FRAGMENT,
      }
    end
    i = i + 1
  end
  return found
end

-- What the test server answers, playing the APIs the examples name.
local function fixtures(s)
  local reset = tostring(os.time() + 3600)
  s:script("/repos/lua/lua", { {
    status = 200,
    headers = { ["Content-Type"] = "application/json; charset=utf-8", ["x-ratelimit-limit"] = "5000",
      ["x-ratelimit-remaining"] = "4999", ["x-ratelimit-reset"] = reset, ["x-ratelimit-resource"] = "core" },
    body = '{"full_name":"lua/lua","stargazers_count":9000}',
  } })
  s:script("/v1/models", { {
    status = 200, headers = { ["Content-Type"] = "application/json" },
    body = '{"object":"list","data":[{"id":"gpt-4o-mini","object":"model"}]}',
  } })
  -- Two cookies whose values hold commas, as Set-Cookie's dates do.
  s:script("/login", { {
    status = 200,
    headers = { ["Set-Cookie"] = { "session=abc; Expires=Wed, 09 Jun 2027 10:18:14 GMT", "theme=dark" } },
  } })
  -- A chat completion streamed as server-sent events, as OpenAI's is.
  s:script("/v1/chat/completions", { {
    action = "stream", headers = { ["Content-Type"] = "text/event-stream" },
    chunks = { { 0, 'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n' },
      { 0.05, 'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n' }, { 0.05, "data: [DONE]\n\n" } },
  } })
  -- A busy endpoint: one 429 with a short Retry-After, then the answer.
  s:script("/busy", { { status = 429, headers = { ["Retry-After"] = "0.2" } }, { status = 200, body = "done" } })
end

local function shell_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- A block reads no global it did not set (the Tasks example once passed
-- `auth1`, which nothing defined, and ran as if it had no headers): read
-- from the block's own chunk, an undefined global raises.
local STRICT = [[setmetatable(_G, {__index = function(_, name)
  local where = debug.getinfo(2, "S")
  if where and where.source == "@" .. arg[0] then error("undefined global '" .. tostring(name) .. "'", 2) end
end})]]

-- Runs one block against the server; returns ok, output (stdout and stderr).
local function run_block(block, base)
  local code = block.code:gsub("https?://[%w%.%-]+:?%d*", function(origin)
    if origin:match("^https?://127%.0%.0%.1") then return nil end
    return base
  end)
  local file = os.tmpname()
  local f = assert(io.open(file, "wb"))
  f:write(code)
  f:close()
  local out, exit_code = subprocess.shell("env -u GITHUB_TOKEN -u OPENAI_API_KEY -u ANTHROPIC_API_KEY "
    .. subprocess.env .. "timeout 60 " .. subprocess.lua .. " -e " .. shell_quote(STRICT) .. " "
    .. shell_quote(file))
  os.remove(file)
  return exit_code == 0, out, code
end

describe("docs", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() if s then s:stop() end end)
  before_each(function()
    s:reset()
    fixtures(s)
  end)

  it("the README has at most 300 lines", function()
    local n = select(2, read("README.md"):gsub("\n", "\n"))
    assert.is_true(n <= 300, "README.md has " .. n .. " lines")
  end)

  it("the README links every page of docs/", function()
    local readme = read("README.md")
    local listed = docs_pages()
    assert.is_true(#listed > 0, "docs/ has no page")
    for _, page in ipairs(listed) do
      assert.is_truthy(readme:find("](" .. page .. ")", 1, true)
        or readme:find("](" .. page .. "#", 1, true), "README.md does not link " .. page)
    end
  end)

  it("the README's examples run, not only compile", function()
    local runnable = 0
    for _, block in ipairs(blocks_of("README.md")) do
      if not block.fragment then runnable = runnable + 1 end
    end
    assert.is_true(runnable > 0, "README.md has no runnable ```lua block")
  end)

  it("every relative link of a page points at a file that exists", function()
    for _, page in ipairs(pages) do
      local dir = page:match("^(.*)/[^/]*$")
      for target in read(page):gmatch("%]%(([^)%s]+)%)") do
        if not target:match("^%a[%w+.-]*:") and not target:match("^#") then
          local path = target:gsub("#.*$", "")
          local full = dir and (dir .. "/" .. path) or path
          assert.is_true(exists(full), page .. " links " .. target .. ", which does not exist")
        end
      end
    end
  end)

  for _, page in ipairs(pages) do
    for _, block in ipairs(blocks_of(page)) do
      local where = block.page .. ":" .. block.line
      if block.fragment then
        it(where .. " (a fragment) compiles", function()
          local fn, err = (loadstring or load)(block.code, "=" .. where) -- luacheck: ignore (5.1)
          assert.is_truthy(fn, err)
        end)
      elseif not has_redis and block.code:find("redis://", 1, true) then
        pending(where .. " runs [needs Redis support: this build is REDIS=0]")
      else
        it(where .. " runs", function()
          local ok, out, code = run_block(block, s.base)
          assert.is_true(ok, where .. " failed:\n" .. out .. "\n--- the block as run:\n" .. code)
          if code:find("://", 1, true) then
            assert.is_true(#s:log() > 0, where .. " names a URL but sent no request:\n" .. out)
          end
        end)
      end
    end
  end
end)
