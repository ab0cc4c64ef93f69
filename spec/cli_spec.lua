-- The ratewise command (bin/ratewise, lua/ratewise/cli.lua), run as a
-- user runs it, against the loopback test server: with its output going to
-- files and pipes, and on a terminal (under script(1)).
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"
local cjson = require "cjson"

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- out, err, code: stdout and stderr apart
local function ratewise(args, opts)
  opts = opts or {}
  local out_file, err_file = os.tmpname(), os.tmpname()
  local _, code = subprocess.shell((opts.stdin and ("printf %s " .. quote(opts.stdin) .. " | ") or "")
    .. subprocess.env .. "timeout 30 " .. subprocess.lua .. " bin/ratewise " .. args
    .. " >" .. out_file .. " 2>" .. err_file)
  local function slurp(path)
    local f = assert(io.open(path, "rb"))
    local text = f:read("*a")
    f:close()
    os.remove(path)
    return text
  end
  return slurp(out_file), slurp(err_file), code
end

local function write_file(text)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

local function json_lines(text)
  local rows = {}
  for line in text:gmatch("[^\n]+") do rows[#rows + 1] = cjson.decode(line) end
  table.sort(rows, function(a, b) return a.line < b.line end)
  return rows
end

describe("the ratewise command", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("get", function()
    it("prints the body, waiting out a 429 as the server asked", function()
      s:script("/busy", { { status = 429, headers = { ["Retry-After"] = "0.2" } }, { status = 200, body = "done\n" } })
      local out, err, code = ratewise("get " .. s:url("/busy"))
      assert.equal(0, code, err)
      assert.equal("done\n", out)
      assert.matches("retrying GET " .. s:url("/busy"):gsub("%p", "%%%0") .. " in 0%.2", err)
      assert.equal(2, #s:log("/busy"))
    end)

    it("says nothing of retries with -s", function()
      s:script("/busy", { { status = 503, headers = { ["Retry-After"] = "0" } }, { status = 200, body = "ok" } })
      local out, err, code = ratewise("get -s " .. s:url("/busy"))
      assert.equal(0, code, err)
      assert.equal("ok", out)
      assert.equal("", err)
    end)

    it("sends headers, a method and a body, and prints the head with -i", function()
      local out, err, code = ratewise("get -s -i -X PUT -H 'X-One: 1' --header='X-Two: two words' -d payload "
        .. s:url("/echo"))
      assert.equal(0, code, err)
      assert.matches("^HTTP/1%.1 200\r\n", out)
      assert.matches("content%-type: application/json\r\n", out)
      local seen = s:log("/echo")[1]
      assert.equal("PUT", seen.method)
      assert.equal("1", seen.headers["x-one"])
      assert.equal("two words", seen.headers["x-two"])
      assert.equal("payload", seen.body)
      out = ratewise("get -s --json '{\"a\":1}' " .. s:url("/echo"))
      assert.equal("application/json", cjson.decode(out).headers["content-type"])
      assert.equal("POST", cjson.decode(out).method)
    end)

    it("streams with --stream, and writes to a file with -o", function()
      s:script("/s", { { action = "stream", chunks = { { 0, "one\n" }, { 0.1, "two\n" } } } })
      local out, err, code = ratewise("get --stream " .. s:url("/s"))
      assert.equal(0, code, err)
      assert.equal("one\ntwo\n", out)
      local file = os.tmpname()
      out, err, code = ratewise("get -o " .. file .. " " .. s:url("/s"))
      assert.equal(0, code, err)
      assert.equal("", out)
      local f = assert(io.open(file))
      assert.equal("one\ntwo\n", f:read("*a"))
      f:close()
      os.remove(file)
    end)

    it("prints a failed response's body, says why on stderr and exits 1", function()
      s:script("/nf", { { status = 404, body = "no such thing" } })
      local out, err, code = ratewise("get " .. s:url("/nf"))
      assert.equal(1, code)
      assert.equal("no such thing", out)
      assert.matches("ratewise: terminal: GET .* 404 is a terminal status", err)
    end)

    it("refuses a bad command line with exit status 2, sending nothing", function()
      for _, args in ipairs { "", "frob", "get", "get a b", "get --retries x " .. s:url("/x"),
        "get --rate 0 " .. s:url("/x"), "get -H nocolon " .. s:url("/x"), "get --provider nosuch " .. s:url("/x"),
        "get --bogus " .. s:url("/x"), "batch", "get ftp://x/" } do
        local _, err, code = ratewise(args)
        assert.equal(2, code, args .. ": " .. err)
        assert.matches("^ratewise: ", err, nil, args)
      end
      assert.equal(0, #s:log())
      local out, _, code = ratewise("help")
      assert.equal(0, code)
      assert.matches("usage: ratewise get URL", out)
      out = ratewise("--version")
      assert.matches("^ratewise %d+%.%d+%.%d+\n$", out)
    end)
  end)

  describe("batch", function()
    it("runs one request per line (URLs and JSON objects), one JSON line per result", function()
      s:script("/flaky", { { status = 503, headers = { ["Retry-After"] = "0" } }, { status = 200, body = "ok" } })
      s:script("/gone", { { status = 404, body = "gone" } })
      local input = table.concat({
        "# a comment, then a blank line", "",
        s:url("/a"),
        cjson.encode { url = s:url("/echo"), method = "POST", json = { n = 1 }, id = "job-7",
          headers = { ["X-Job"] = "7" } },
        s:url("/flaky"),
        s:url("/gone"),
        "not a url at all",
      }, "\n") .. "\n"
      local file = write_file(input)
      local out, err, code = ratewise("batch --concurrency 2 --no-progress " .. file)
      os.remove(file)
      assert.equal(1, code, err) -- one failed
      local rows = json_lines(out)
      assert.equal(5, #rows)
      assert.same({ 3, 4, 5, 6, 7 }, { rows[1].line, rows[2].line, rows[3].line, rows[4].line, rows[5].line })
      assert.is_true(rows[1].ok)
      assert.equal(200, rows[1].status)
      assert.equal("ok", rows[1].body)
      assert.equal("job-7", rows[2].id)
      assert.equal("POST", rows[2].method)
      assert.same({ n = 1 }, cjson.decode(cjson.decode(rows[2].body).body))
      assert.equal("7", s:log("/echo")[1].headers["x-job"])
      assert.equal(2, rows[3].attempts)
      assert.is_false(rows[4].ok)
      assert.equal("terminal", rows[4].error.kind)
      assert.equal(404, rows[4].status)
      assert.equal("gone", rows[4].body)
      assert.equal("input", rows[5].error.kind)
      assert.matches("neither a URL nor a JSON object", rows[5].error.message)
      -- no terminal: no bar, a summary
      assert.is_nil(err:find("\r", 1, true))
      assert.matches("5 requests in [%d.]+ s %([%d.]+/s%): 3 ok, 2 failed %(input 1, terminal 1%); 1 retry, "
        .. "0 throttled %(429%)", err)
    end)

    it("keeps to --rate, counts 429s, and reads stdin", function()
      s:script("/r", { { status = 429, headers = { ["Retry-After"] = "0" } }, { status = 200 } })
      local urls = {}
      for i = 1, 6 do urls[i] = s:url("/r") end
      local t0 = require("ratewise").now()
      local out, err, code = ratewise("batch --rate 10 --concurrency 6 --no-body -",
        { stdin = table.concat(urls, "\n") })
      local took = require("ratewise").now() - t0
      assert.equal(0, code, err)
      assert.equal(6, #json_lines(out))
      assert.is_nil(json_lines(out)[1].body)
      assert.matches("1 throttled %(429%)", err)
      -- 7 requests through a bucket of 1 at 10/s: 0.6 s at least
      assert.is_true(took >= 0.55, ("took %.2f s"):format(took))
    end)

    it("draws a progress bar on a terminal", function()
      s:script("/slow", { { status = 200, delay = 0.15 } })
      local urls = {}
      for i = 1, 8 do urls[i] = s:url("/slow") end
      local file = write_file(table.concat(urls, "\n"))
      local result = os.tmpname()
      local command = "COLUMNS=80 " .. subprocess.env .. subprocess.lua .. " bin/ratewise batch --concurrency 2 -o "
        .. result .. " " .. file
      local shown, code = subprocess.shell("timeout 30 script -qec " .. quote(command) .. " /dev/null")
      os.remove(file)
      assert.equal(0, code, shown)
      assert.matches("\r%[[#.]+%] %d/8 +%d+%% [%d.]+/s ETA", shown)
      assert.matches("%[" .. string.rep("#", 24) .. "%] 8/8 100%%", shown)  -- 24 wide at 80 columns
      assert.matches("8 requests in [%d.]+ s", shown)
      local f = assert(io.open(result))
      assert.equal(8, #json_lines(f:read("*a")))
      f:close()
      os.remove(result)
    end)
  end)
end)
