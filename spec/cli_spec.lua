-- The ratewise command (bin/ratewise, lua/ratewise/cli.lua), run as a
-- user runs it, against the loopback test server: with its output going to
-- files and pipes, and on a terminal (under script(1)).
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"
local cjson = require "cjson"

local cli = require "spec.support.cli"

local quote, slurp, command, ratewise = cli.quote, cli.slurp, cli.command, cli.ratewise
local write_file, json_lines = cli.write_file, cli.json_lines

-- Runs args in the background, sends sig once the server has seen a
-- request to path (and after pause seconds more), and waits: stdout,
-- stderr, exit status.
local function signalled(args, s, path, sig, pause)
  local out_file, err_file = os.tmpname(), os.tmpname()
  local _, code = subprocess.shell(command(args) .. " >" .. out_file .. " 2>" .. err_file .. " & pid=$!; "
    .. "for i in $(seq 200); do curl -s " .. quote(s:url("/_log?path=" .. path)) .. " | grep -q " .. quote(path)
    .. " && break; sleep 0.05; done; " .. (pause and ("sleep " .. pause .. "; ") or "")
    .. "kill -" .. sig .. " $pid; wait $pid")
  return slurp(out_file), slurp(err_file), code
end

describe("the ratewise command", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("get", function()
    it("prints the body, waiting out a 429 as the server asked", function()
      s:script("/busy", { { status = 429, headers = { ["Retry-After"] = "1" } }, { status = 200, body = "done\n" } })
      local out, err, code = ratewise("get " .. s:url("/busy"))
      assert.equal(0, code, err)
      assert.equal("done\n", out)
      assert.matches("retrying GET " .. s:url("/busy"):gsub("%p", "%%%0") .. " in 1%.", err)
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

    -- issue 39, 5: as `gh api --paginate`
    it("prints every page with --paginate, following Link rel=next, the URL's query on the first only", function()
      local items = s:url("/items")
      s:script("/items", {
        { status = 200, body = "[1,2]", headers = { Link = "<" .. items .. '?page=2&per_page=2>; rel="next"' } },
        { status = 429, headers = { ["Retry-After"] = "0" } },
        { status = 200, body = "[3,4]\n", headers = { Link = '</items?page=3&per_page=2>; rel="next", '
          .. '</items?page=1&per_page=2>; rel="first"' } },
        { status = 200, body = "[5]", headers = { Link = '</items?page=1&per_page=2>; rel="first"' } },
      })
      local out, err, code = ratewise("get -s --paginate -H 'Authorization: Bearer cli-token' '" .. items
        .. "?per_page=2'")
      assert.equal(0, code, err)
      assert.equal("[1,2]\n[3,4]\n[5]\n", out)
      local queries = {}
      for i, r in ipairs(s:log("/items")) do
        queries[i] = r.query
        assert.equal("Bearer cli-token", r.headers.authorization)
      end
      assert.same({ "per_page=2", "page=2&per_page=2", "page=2&per_page=2", "page=3&per_page=2" }, queries)
    end)

    it("with --paginate, prints the pages before a failed one and its body, and exits 1", function()
      s:script("/items", {
        { status = 200, body = "[1]", headers = { Link = '</items?page=2>; rel="next"' } },
        { status = 404, body = "gone" },
      })
      local out, err, code = ratewise("get -s --paginate " .. s:url("/items"))
      assert.equal(1, code)
      assert.equal("[1]\ngone\n", out)
      assert.matches("ratewise: terminal: GET .* 404 is a terminal status", err)
      s:reset()
      local elsewhere = s:url("/x"):gsub("127%.0%.0%.1", "localhost")
      s:script("/items", { { status = 200, body = "[1]", headers = { Link = "<" .. elsewhere .. '>; rel="next"' } } })
      out, err, code = ratewise("get -s --paginate " .. s:url("/items"))
      assert.equal(1, code)
      assert.equal("[1]\n", out)
      assert.matches("ratewise: pagination: .*another origin", err)
      assert.equal(0, #s:log("/x"))
      for _, args in ipairs { "--paginate --stream", "--paginate -d x", "--paginate -X POST", "--paginate --json 1" } do
        local _, usage_err, usage_code = ratewise("get " .. args .. " " .. s:url("/items"))
        assert.equal(2, usage_code, args .. ": " .. usage_err)
        assert.matches("paginate", usage_err)
      end
      local _, usage_err, usage_code = ratewise("batch --paginate -")
      assert.equal(2, usage_code, usage_err)
      assert.equal(1, #s:log("/items"))
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

    it("prints the usage for --help after a command", function()
      for _, args in ipairs { "get --help", "batch --help", "get -h " .. s:url("/x") } do
        local out, err, code = ratewise(args)
        assert.equal(0, code, args .. ": " .. err)
        assert.matches("^usage: ratewise get URL", out)
      end
      assert.equal(0, #s:log())
    end)

    it("never repeats a header's value in a usage error", function()
      for _, h in ipairs { "Authorization Bearer sk-SECRET123", "Authorization Bearer: sk-SECRET123",
        "Authorization=sk-SECRET123" } do
        local _, err, code = ratewise("get -H 'Accept: */*' -H " .. quote(h) .. " " .. s:url("/x"))
        assert.equal(2, code, err)
        assert.is_nil(err:find("SECRET", 1, true), err)
        assert.matches("the 2nd %-H", err)
      end
      assert.equal(0, #s:log())
    end)

    it("exits 23 when the body cannot be written (a full disk, a closed pipe)", function()
      s:script("/big", { { status = 200, body = string.rep("x", 1048576) } })
      for _, args in ipairs { "get -s " .. s:url("/big") .. " >/dev/full", "get -s --stream " .. s:url("/big")
        .. " >/dev/full", "get -s -o /dev/full " .. s:url("/big") } do
        local shown, code = subprocess.shell(command(args))
        assert.equal(23, code, args .. ": " .. shown)
        assert.matches("ratewise: cannot write to .*: No space left on device", shown)
      end
      local status, err = os.tmpname(), os.tmpname()
      subprocess.shell("{ " .. command("get -s " .. s:url("/big")) .. " 2>" .. err .. "; echo $? >" .. status
        .. "; } | head -c 1 >/dev/null")
      assert.equal("23", slurp(status):match("%d+"))
      assert.matches("^ratewise: cannot write to standard output: Broken pipe", slurp(err))
    end)

    -- (a 429 without Retry-After: one with it may be taken as "not processed")
    it("sends an idempotency key, or retries a POST without one with --retry-unsafe", function()
      s:script("/pay", { { status = 429 }, { status = 200, body = "paid" } })
      local _, err, code = ratewise("get -s -d x " .. s:url("/pay"))
      assert.equal(1, code, err)
      assert.equal(1, #s:log("/pay"))
      s:reset()
      s:script("/pay", { { status = 429 }, { status = 200, body = "paid" } })
      local out
      out, err, code = ratewise("get -s -d x --idempotency-key order-17 " .. s:url("/pay"))
      assert.equal(0, code, err)
      assert.equal("paid", out)
      local log = s:log("/pay")
      assert.equal(2, #log)
      assert.equal("order-17", log[1].headers["idempotency-key"])
      assert.equal("order-17", log[2].headers["idempotency-key"])
      s:reset()
      s:script("/pay", { { status = 429 }, { status = 200, body = "paid" } })
      out, err, code = ratewise("get -s -d x --retry-unsafe " .. s:url("/pay"))
      assert.equal("paid", out)
      assert.equal(0, code, err)
      assert.equal(2, #s:log("/pay"))
      assert.is_nil(s:log("/pay")[2].headers["idempotency-key"])
    end)

    it("on Ctrl-C, SIGTERM or SIGHUP stops the request, says so and exits 128 + the signal", function()
      for _, case in ipairs { { "INT", 130, "interrupted" }, { "TERM", 143, "stopped by SIGTERM" },
        { "HUP", 129, "stopped by SIGHUP" } } do
        s:reset()
        s:script("/stuck", { { status = 200, delay = 20 } })
        local t0 = require("ratewise").now()
        local _, err, code = signalled("get " .. s:url("/stuck"), s, "/stuck", case[1])
        assert.equal(case[2], code, err)
        assert.equal("ratewise: " .. case[3] .. "\n", err)
        assert.is_true(require("ratewise").now() - t0 < 5)
      end
    end)

    it("takes rates per second, minute, hour or day", function()
      local t0 = require("ratewise").now()
      local _, err, code = ratewise("batch --no-progress --rate 300/m --concurrency 4 -",
        { stdin = string.rep(s:url("/r") .. "\n", 4) })
      local took = require("ratewise").now() - t0
      assert.equal(0, code, err)
      -- 4 requests through a bucket of 1 at 5 a second: 0.6 s at least
      assert.is_true(took >= 0.55, ("took %.2f s"):format(took))
      for _, bad in ipairs { "5/x", "0/s", "5/0s", "/s", "5/" } do
        local _, why, status = ratewise("get --rate " .. bad .. " " .. s:url("/x"))
        assert.equal(2, status, bad .. ": " .. why)
        assert.matches("option %-%-rate", why)
      end
    end)
  end)

  describe("batch", function()
    -- a file of n requests each answered after 0.15 s
    local function slow_batch(n)
      s:script("/slow", { { status = 200, delay = 0.15 } })
      local urls = {}
      for i = 1, n do urls[i] = s:url("/slow") end
      return write_file(table.concat(urls, "\n"))
    end

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
      -- (a 503 with Retry-After refused for now: a throttle)
      assert.matches("5 requests in [%d.]+ s %([%d.]+/s%): 3 ok, 2 failed %(input 1, terminal 1%); 1 retry, "
        .. "1 throttled\n$", err)
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
      assert.matches("1 throttled\n$", err)
      -- 7 requests through a bucket of 1 at 10/s: 0.6 s at least
      assert.is_true(took >= 0.55, ("took %.2f s"):format(took))
    end)

    it("draws a progress bar on a terminal", function()
      local file = slow_batch(8)
      local result = os.tmpname()
      local line = "COLUMNS=80 " .. command("batch --concurrency 2 -o " .. result .. " " .. file)
      local shown, code = subprocess.shell("timeout 30 script -qec " .. quote(line) .. " /dev/null")
      os.remove(file)
      assert.equal(0, code, shown)
      assert.matches("\r%[[#.]+%] %d/8 +%d+%% [%d.]+/s ETA", shown)
      assert.matches("%[" .. string.rep("#", 19) .. "%] 8/8 100%% [%d.]+/s ETA %S+ retries 0 throttled 0", shown)
      assert.matches("8 requests in [%d.]+ s", shown)
      local f = assert(io.open(result))
      assert.equal(8, #json_lines(f:read("*a")))
      f:close()
      os.remove(result)
    end)

    it("gives a bad line its own result and runs the rest (an infinite id, with or without the bar)", function()
      for _, flag in ipairs { "--no-progress", "--progress" } do
        s:reset()
        local lines = {}
        for i = 1, 5 do lines[i] = s:url("/n" .. i) end
        lines[3] = '{"url": "' .. s:url("/n3") .. '", "id": 1e400}'
        local out, err, code = ratewise("batch --no-body " .. flag .. " -", { stdin = table.concat(lines, "\n") })
        assert.equal(1, code, err)
        local rows = json_lines(out)
        assert.equal(5, #rows, out)
        for i, row in ipairs(rows) do
          assert.equal(i, row.line)
          assert.equal(i ~= 3, row.ok)
        end
        assert.equal("input", rows[3].error.kind)
        assert.matches("line 3 has an \"id\" that is neither a string nor a finite number", rows[3].error.message)
        assert.matches("5 requests in [%d.]+ s %([%d.]+/s%): 4 ok, 1 failed %(input 1%)", err)
        assert.is_nil(err:find("traceback", 1, true))
        assert.equal(4, #s:log())
        assert.equal(0, #s:log("/n3"))
      end
    end)

    it("refuses a line with an unknown key, naming it, and sends nothing for it", function()
      local out, err, code = ratewise("batch --no-progress -", { stdin = cjson.encode { url = s:url("/echo"),
        methd = "POST", body = "x" } .. "\n" .. s:url("/ok") .. "\n" })
      assert.equal(1, code, err)
      local rows = json_lines(out)
      assert.equal("input", rows[1].error.kind)
      assert.matches('unknown key "methd"', rows[1].error.message)
      assert.is_true(rows[2].ok)
      assert.equal(0, #s:log("/echo"))
    end)

    it("never repeats a credential from a header name or value in a line's result", function()
      local input = table.concat({
        cjson.encode { url = s:url("/a"), headers = { ["Authorization Bearer sk-SECRET123"] = "x" } },
        cjson.encode { url = s:url("/a"), headers = { Authorization = "Bearer sk-SECRET123\r\nX-Evil: 1" } },
        cjson.encode { url = s:url("/a"), headers = { ["X-Note"] = { "sk-SECRET123" } } },
      }, "\n")
      local out, err, code = ratewise("batch --no-progress -", { stdin = input })
      assert.equal(1, code, err)
      assert.is_nil(out:find("SECRET", 1, true), out)
      assert.is_nil(err:find("SECRET", 1, true), err)
      local rows = json_lines(out)
      assert.matches("a header's name is not a valid HTTP field name", rows[1].error.message)
      assert.matches("a secret header's value holds a control character", rows[2].error.message)
      assert.matches("header X%-Note's value is not a string", rows[3].error.message)
      assert.equal(0, #s:log())
    end)

    it("answers a line past 8 MiB on standard input with its own error, read in time linear in its length", function()
      -- 20 MiB of one line (a binary file piped by mistake), then a request
      local started = os.time()
      local out, err, code = ratewise("batch --no-progress -", { shell = "{ head -c 20971520 /dev/zero | tr '\\0' x; "
        .. "printf '\\n%s\\n' " .. quote(s:url("/after")) .. "; } | " })
      assert.equal(1, code, err)
      local rows = json_lines(out)
      assert.equal(2, #rows, out:sub(1, 300))
      assert.equal("input", rows[1].error.kind)
      assert.matches("line 1 is longer than 8388608 bytes", rows[1].error.message, 1, true)
      assert.is_true(rows[2].ok, out:sub(1, 300))
      assert.equal(1, #s:log("/after"))
      -- the quadratic reader took minutes for this; bounded generously
      assert.is_true(os.time() - started < 20, "took " .. (os.time() - started) .. " s")
    end)

    it("writes bodies that are not UTF-8 as body_base64, and sends a line's body_base64", function()
      s:script("/bin", { { status = 200, body = "\255\254\0A" } })
      local out, err, code = ratewise("batch --no-progress -", { stdin = s:url("/bin") .. "\n"
        .. cjson.encode { url = s:url("/up"), method = "PUT", body_base64 = "AP/+" } .. "\n"
        .. cjson.encode { url = s:url("/up"), body_base64 = "not base64!" } })
      assert.equal(1, code, err)
      local rows = json_lines(out)
      assert.is_nil(rows[1].body)
      assert.equal("//4AQQ==", rows[1].body_base64)
      assert.is_true(rows[2].ok)
      assert.equal("\0\255\254", s:log("/up")[1].body)
      assert.matches('"body_base64" that is not base64', rows[3].error.message)
      for line in out:gmatch("[^\n]+") do
        assert.is_nil(line:find("[\128-\255]"), "a byte that is not ASCII in " .. line)
      end
    end)

    it("exits 23 when the results cannot be written, and says how many were not", function()
      local urls = {}
      for i = 1, 6 do urls[i] = s:url("/w" .. i) end
      local file = write_file(table.concat(urls, "\n"))
      for _, args in ipairs { "batch --no-progress -o /dev/full " .. file, "batch --no-progress " .. file
        .. " >/dev/full" } do
        local shown, code = subprocess.shell(command(args))
        assert.equal(23, code, args .. ": " .. shown)
        assert.matches("ratewise: cannot write to .*: No space left on device", shown)
        -- those sent before the write failed, and the others never sent
        local sent = shown:match("(%d+) requests? in [%d.]+ s ")
        local unsent = shown:match("; (%d+) not sent;") or 0
        assert.matches("; 6 results not written\n", shown)
        assert.equal(6, tonumber(sent) + tonumber(unsent), shown)
      end
      -- one result at a time, 0.15 s apart: head has gone by the second
      local slow = slow_batch(4)
      local status, err = os.tmpname(), os.tmpname()
      subprocess.shell("{ " .. command("batch --no-progress --concurrency 1 " .. slow) .. " 2>" .. err .. "; echo $? >"
        .. status .. "; } | head -c 1 >/dev/null")
      os.remove(slow)
      assert.equal("23", slurp(status):match("%d+"))
      assert.matches("^ratewise: cannot write to standard output: Broken pipe", slurp(err))
      local _, why, code = ratewise("batch -o /nonexistent/dir/out " .. file)
      assert.equal(23, code, why)
      os.remove(file)
    end)

    it("writes every result whole when descriptors run out, the JSON codec loaded before", function()
      -- More requests in flight than the process has descriptors: those
      -- without one fail at once, while the others hold every descriptor,
      -- so that nothing (lua-cjson's file neither) can be opened then.
      s:script("/hold", { { status = 200, delay = 1, body = "held" } })
      local urls = {}
      for i = 1, 40 do urls[i] = s:url("/hold") end
      local file = write_file(table.concat(urls, "\n"))
      local out, err, code = ratewise("batch --no-progress --retries 0 --concurrency 40 " .. file,
        { shell = "ulimit -n 24; " })
      os.remove(file)
      local rows = json_lines(out)
      assert.equal(40, #rows, err)
      local ok, starved = 0, 0
      for i, row in ipairs(rows) do
        assert.equal(i, row.line)
        assert.is_nil(out:find('"internal"'), out)
        if row.ok then
          ok = ok + 1
          assert.equal(200, row.status)
          assert.equal("held", row.body)
        else
          starved = starved + 1
          assert.equal("exhausted", row.error.kind)
        end
      end
      assert.is_true(ok > 0 and starved > 0, "some requests held the descriptors, the others had none: " .. err)
      assert.equal(1, code, err)
    end)

    it("runs without lua-cjson, with ratewise's own JSON codec, numeric ids kept exactly", function()
      local file = write_file(s:url("/a") .. "\n" .. '{"url": "' .. s:url("/echo") .. '", "id": 1234567890123456, '
        .. '"json": {"order_id": 1234567890123457, "none": null}}\n')
      -- the core found, lua-cjson not: no default search path
      local env = subprocess.env:gsub(";;'", "'")
      local out, code = subprocess.shell(env .. "timeout 30 " .. subprocess.lua
        .. " bin/ratewise batch --no-progress " .. file .. " 2>/dev/null")
      os.remove(file)
      assert.equal(0, code, out)
      local rows = json_lines(out)
      assert.equal(2, #rows, out)
      assert.is_true(rows[1].ok)
      assert.matches('"id":1234567890123456[,}]', out)
      assert.equal('{"none":null,"order_id":1234567890123457}',
        (s:log("/echo")[1].body:gsub('^{("order_id":%d+),("none":null)}$', "{%2,%1}")))
    end)

    it("exits 2 for an input that cannot be read, sending nothing", function()
      local _, err, code = ratewise("batch /nonexistent/jobs.txt")
      assert.equal(2, code, err)
      assert.matches("cannot read /nonexistent/jobs.txt", err)
      _, err, code = ratewise("batch /")
      assert.equal(2, code, err)
      _, err, code = ratewise("batch -", { shell = "exec 0<&-; " })
      assert.equal(2, code, err)
      assert.matches("ratewise: cannot read standard input", err)
      _, err, code = ratewise("batch --idempotency-key k -", { stdin = s:url("/x") })
      assert.equal(2, code, err)
      assert.equal(0, #s:log())
    end)

    it("sends each line of standard input as it arrives", function()
      local out, err, code = ratewise("batch --no-progress --no-body -",
        { shell = "{ echo " .. s:url("/first") .. "; sleep 1.5; echo " .. s:url("/second") .. "; } | " })
      assert.equal(0, code, err)
      assert.equal(2, #json_lines(out))
      local first, second = s:log("/first")[1], s:log("/second")[1]
      assert.is_true(second.t - first.t >= 1.2, ("sent %.2f s apart"):format(second.t - first.t))
    end)

    it("retries the lines that carry an idempotency key", function()
      s:script("/pay", { { status = 429 }, { status = 200 } })
      local out, err, code = ratewise("batch --no-progress --concurrency 1 -", { stdin =
        cjson.encode { url = s:url("/pay"), method = "POST", body = "a", idempotency_key = "k-1" } })
      assert.equal(0, code, err)
      assert.equal(2, json_lines(out)[1].attempts)
      assert.equal("k-1", s:log("/pay")[2].headers["idempotency-key"])
    end)

    it("on Ctrl-C stops starting requests, writes every result and the summary, and exits 130", function()
      s:script("/slow", { { status = 200, delay = 1, body = "done" } })
      s:script("/stuck", { { status = 200, delay = 20 } })
      local lines = { s:url("/slow"), s:url("/slow"), s:url("/slow"), s:url("/stuck") }
      for i = 5, 10 do lines[i] = s:url("/never") end
      local file = write_file(table.concat(lines, "\n"))
      for _, flag in ipairs { "--no-progress", "--progress" } do
        s:reset()
        s:script("/slow", { { status = 200, delay = 1, body = "done" } })
        s:script("/stuck", { { status = 200, delay = 20 } })
        local t0 = require("ratewise").now()
        -- Ctrl-C once the requests are in flight (not before the command has started)
        local out, err, code = signalled("batch --concurrency 4 " .. flag .. " " .. file, s, "/stuck", "INT", 0.2)
        local took = require("ratewise").now() - t0
        assert.equal(130, code, err)
        local rows = json_lines(out)
        assert.equal(10, #rows, out .. err)
        for i = 1, 3 do
          assert.is_true(rows[i].ok, out) -- answered within the grace
          assert.equal("done", rows[i].body)
        end
        assert.equal("cancelled", rows[4].error.kind)
        assert.matches("in flight: the server may have received it", rows[4].error.message)
        for i = 5, 10 do
          assert.equal("cancelled", rows[i].error.kind)
          assert.matches("not sent", rows[i].error.message)
        end
        -- the 4 sent (as many as the server saw), and the 6 never sent apart
        assert.matches("\n?4 requests in [%d.]+ s %([%d.]+/s%): 3 ok, 1 failed %(cancelled 1%); 0 retries, "
          .. "0 throttled; 6 not sent\n$", err)
        assert.equal(4, #s:log())
        if flag == "--progress" then
          -- the last bar: 4 of the 10 lines done, none of the 6 unsent counted
          local last = err:match("([^\r]*)\n[^\n]*\n$")
          assert.matches("%] 4/10  40%% ", last)
        end
        assert.is_nil(err:find("interrupted!", 1, true), err)
        assert.equal(0, #s:log("/never"))
        -- the grace, then the stuck one is cancelled
        assert.is_true(took < 5, ("took %.2f s"):format(took))
      end
      os.remove(file)
    end)

    it("on Ctrl-C sends none of the requests still queued for --rate's tokens", function()
      s:script("/slow", { { status = 200, delay = 1, body = "done" } })
      local urls = {}
      for i = 1, 6 do urls[i] = s:url("/slow") end
      local file = write_file(table.concat(urls, "\n"))
      local out_file, err_file = os.tmpname(), os.tmpname()
      local _, code = subprocess.shell(command("batch --no-progress --rate 2 --concurrency 4 " .. file)
        .. " >" .. out_file .. " 2>" .. err_file .. " & pid=$!; "
        .. "for i in $(seq 200); do curl -s " .. quote(s:url("/_log?path=/slow")) .. " | grep -q slow && break; "
        .. "sleep 0.05; done; kill -INT $pid; wait $pid")
      os.remove(file)
      local out, err = slurp(out_file), slurp(err_file)
      assert.equal(130, code, err)
      local rows = json_lines(out)
      assert.equal(6, #rows, out .. err)
      assert.is_true(rows[1].ok, out)
      for i = 2, 6 do
        assert.equal("cancelled", rows[i].error.kind)
        assert.matches("^not sent", rows[i].error.message)
      end
      assert.equal(1, #s:log("/slow"))
    end)

    it("on SIGTERM or SIGHUP stops as on Ctrl-C: every POST the server received has its result line", function()
      local lines = {}
      for i = 1, 6 do
        local path = i <= 2 and "/slow" or i == 3 and "/stuck" or "/never"
        lines[i] = cjson.encode { url = s:url(path), method = "POST", body = "p" .. i, id = "p" .. i }
      end
      local file = write_file(table.concat(lines, "\n"))
      for _, case in ipairs { { "TERM", 143, "stopped by SIGTERM" }, { "HUP", 129, "stopped by SIGHUP" } } do
        s:reset()
        s:script("/slow", { { status = 200, delay = 1, body = "done" } })
        s:script("/stuck", { { status = 200, delay = 20 } })
        local out, err, code = signalled("batch --no-progress --concurrency 3 " .. file, s, "/stuck", case[1], 0.2)
        assert.equal(case[2], code, err)
        local rows = json_lines(out)
        assert.equal(6, #rows, out .. err)
        local by_id = {}
        for _, row in ipairs(rows) do by_id[row.id] = row end
        -- each POST the server saw: its answer, or cancelled in flight
        local seen = s:log()
        assert.equal(3, #seen)
        for _, req in ipairs(seen) do
          local row = by_id[req.body]
          assert.is_truthy(row, req.body .. " has no result line: " .. out)
          if req.path == "/slow" then
            assert.is_true(row.ok, out)
          else
            assert.equal("cancelled", row.error.kind)
            assert.equal("the batch was " .. case[3] .. " while it was in flight: the server may have received it",
              row.error.message)
          end
        end
        for i = 4, 6 do assert.equal("not sent: the batch was " .. case[3], by_id["p" .. i].error.message) end
        assert.matches("^3 requests in [%d.]+ s %([%d.]+/s%): 2 ok, 1 failed %(cancelled 1%); 0 retries, 0 throttled; "
          .. "3 not sent\n$", err)
      end
      os.remove(file)
    end)

    it("counts the answers a provider reads as throttled (GitHub's 403s), not only 429s", function()
      s:script("/secondary", { { status = 403, headers = { ["Retry-After"] = "0.2" }, body = "slow down" },
        { status = 200 } })
      s:script("/primary", { { status = 403, headers = { ["X-RateLimit-Remaining"] = "0",
        ["X-RateLimit-Reset"] = "1" } }, { status = 200 } })
      s:script("/denied", { { status = 403, body = "no access" } })
      local out, err, code = ratewise("batch --no-progress --no-body --provider github -", { stdin =
        s:url("/secondary") .. "\n" .. s:url("/primary") .. "\n" .. s:url("/denied") .. "\n" })
      assert.equal(1, code, err)
      local rows = json_lines(out)
      assert.same({ true, true, false }, { rows[1].ok, rows[2].ok, rows[3].ok })
      assert.equal(2, #s:log("/secondary"))
      assert.equal(2, #s:log("/primary"))
      assert.equal(1, #s:log("/denied"))
      -- the permission error is no throttle
      assert.matches("3 requests in [%d.]+ s %([%d.]+/s%): 2 ok, 1 failed %(terminal 1%); 2 retries, 2 throttled\n$",
        err)
    end)

    it("skips a UTF-8 byte order mark at the start of the input", function()
      local bom = "\239\187\191"
      local file = write_file(bom .. s:url("/bom1") .. "\n" .. s:url("/bom2") .. "\n")
      local out, err, code = ratewise("batch --no-progress --no-body " .. file)
      os.remove(file)
      assert.equal(0, code, err)
      local rows = json_lines(out)
      assert.equal(2, #rows)
      assert.same({ 1, true }, { rows[1].line, rows[1].ok })
      assert.equal(1, #s:log("/bom1"))
      out, err, code = ratewise("batch --no-progress --no-body -", { stdin = bom .. cjson.encode { url = s:url("/bom3"),
        id = "first" } .. "\n" })
      assert.equal(0, code, err)
      assert.equal("first", json_lines(out)[1].id)
      assert.equal(1, #s:log("/bom3"))
    end)

    it("names --rate or --burst in their errors, with no place in ratewise's source", function()
      local file = write_file(s:url("/x") .. "\n")
      for args, option in pairs { ["get --rate 1e-300 " .. s:url("/x")] = "%-%-rate",
        ["get --rate 1e300 " .. s:url("/x")] = "%-%-rate",
        ["batch --rate 5 --burst 100000000000000000000 " .. file] = "%-%-rate .* %(with %-%-burst 1e%+20%)" } do
        local _, err, code = ratewise(args)
        assert.equal(2, code, args .. ": " .. err)
        assert.matches("^ratewise: option " .. option, err)
        assert.is_nil(err:find("%.lua:%d+:"), err)
      end
      os.remove(file)
      assert.equal(0, #s:log())
    end)

    it("writes URLs without \\/ escapes and elapsed times to the millisecond", function()
      s:script("/a/b", { { status = 200, delay = 0.05, body = "see https://example.com/x" } })
      local out, err, code = ratewise("batch --no-progress -", { stdin = s:url("/a/b") })
      assert.equal(0, code, err)
      assert.is_nil(out:find("\\/", 1, true), out)
      assert.is_truthy(out:find('"url":"' .. s:url("/a/b") .. '"', 1, true), out)
      local row = json_lines(out)[1]
      assert.equal("see https://example.com/x", row.body)
      local elapsed = out:match('"elapsed":([%d.e+-]+)')
      assert.matches("^%d+%.?%d?%d?%d?$", elapsed)
      assert.is_true(row.elapsed >= 0.05, elapsed)
    end)

    it("after an interrupt, --resume sends only the lines not answered, with their own line numbers", function()
      local lines = {
        cjson.encode { url = s:url("/fast"), id = "a" },
        s:url("/gone"),
        cjson.encode { url = s:url("/stuck"), method = "POST", body = "c", id = "c", idempotency_key = "c" },
        s:url("/later?n=4"), s:url("/later?n=5"), s:url("/later?n=6"),
      }
      local file = write_file(table.concat(lines, "\n") .. "\n")
      local results = os.tmpname()
      s:script("/gone", { { status = 404, body = "gone" } })
      s:script("/stuck", { { status = 200, delay = 20 } })
      local _, err, code = signalled("batch --no-progress --no-body --concurrency 1 -o " .. results .. " " .. file, s,
        "/stuck", "INT")
      assert.equal(130, code, err)
      assert.matches("^3 requests in [%d.]+ s %([%d.]+/s%): 1 ok, 2 failed %(cancelled 1, terminal 1%); "
        .. "0 retries, 0 throttled; 3 not sent\n$", err)
      -- a line cut short (a process killed as it wrote) is not run into
      local f = assert(io.open(results, "ab"))
      f:write('{"line":9,"ok":tr')
      f:close()
      s:reset()
      local out
      out, err, code = ratewise("batch --no-progress --no-body --concurrency 1 --resume -o " .. results .. " " .. file)
      assert.equal(0, code, err)
      assert.equal("", out)
      assert.matches("^4 requests in [%d.]+ s %([%d.]+/s%): 4 ok, 0 failed; 0 retries, 0 throttled; "
        .. "2 skipped %(answered before%)\n$", err)
      -- the server saw the unanswered ones only
      assert.equal(0, #s:log("/fast"))
      assert.equal(0, #s:log("/gone"))
      assert.equal(1, #s:log("/stuck"))
      assert.equal("c", s:log("/stuck")[1].headers["idempotency-key"])
      assert.equal(3, #s:log("/later"))
      f = assert(io.open(results, "rb"))
      local all = f:read("*a")
      f:close()
      local first, second = all:match('^(.-\n){"line":9,"ok":tr\n(.*)$')
      assert.is_truthy(first, all)
      assert.equal(6, #json_lines(first))
      local rows = json_lines(second)
      assert.same({ 3, 4, 5, 6 }, { rows[1].line, rows[2].line, rows[3].line, rows[4].line })
      for _, row in ipairs(rows) do assert.is_true(row.ok) end
      assert.equal("c", rows[1].id)
      -- a second resume finds every line answered
      s:reset()
      out, err, code = ratewise("batch --no-progress --resume -o " .. results .. " " .. file)
      os.remove(results)
      assert.equal("", out)
      assert.equal(0, code, err)
      assert.matches("^0 requests in .*; 6 skipped", err)
      assert.equal(0, #s:log())
      os.remove(file)
      _, err, code = ratewise("batch --resume " .. s:url("/x"))
      assert.equal(2, code, err)
      assert.matches("option %-%-resume needs %-o FILE", err)
    end)

    it("fits the bar to the terminal's width and clears it before a result line on the same terminal", function()
      local file = slow_batch(8)
      local line = "stty cols 50; env -u COLUMNS " .. command("batch --no-body --concurrency 2 " .. file)
      local shown, code = subprocess.shell("timeout 30 script -qec " .. quote(line) .. " /dev/null")
      os.remove(file)
      assert.equal(0, code, shown)
      local results, bars = 0, 0
      for piece in shown:gmatch("[^\r\n]+") do
        local visible = piece:gsub("\27%[K", "")
        if visible:find('^{"') then
          results = results + 1
          assert.matches("}$", visible) -- nothing glued to it
        elseif visible:find("/8 ") then
          bars = bars + 1
          assert.is_true(#visible <= 49, ("%d columns: %s"):format(#visible, visible))
        end
        assert.is_false(visible:find("/8 ", 1, true) ~= nil and visible:find('{"', 1, true) ~= nil, visible)
      end
      assert.equal(8, results, shown)
      assert.is_true(bars >= 2, shown)
    end)
  end)
end)

describe("the ratewise command's text helpers", function()
  local text = require "ratewise.cli.text"

  it("tells well-formed UTF-8 from the rest, as RFC 3629 does", function()
    for _, good in ipairs { "", "ascii", "é", "日本", "\240\159\152\128", "\244\143\191\191", "\237\159\191" } do
      assert.is_true(text.is_utf8(good), good)
    end
    -- overlong forms, surrogates, past U+10FFFF, cut short, a stray continuation
    for _, bad in ipairs { "\192\128", "\224\128\128", "\237\160\128", "\244\144\128\128", "\248\136\128\128\128",
      "\195", "a\226\130", "\128", "\255" } do
      assert.is_false(text.is_utf8(bad), (bad:gsub(".", function(c) return "\\" .. c:byte() end)))
    end
    assert.equal("a\239\191\189b\239\191\189é", text.printable("a\255b\195é"))
  end)

  it("writes and reads base64 (RFC 4648 test vectors)", function()
    for plain, encoded in pairs { [""] = "", f = "Zg==", fo = "Zm8=", foo = "Zm9v", foob = "Zm9vYg==",
      fooba = "Zm9vYmE=", foobar = "Zm9vYmFy", ["\0\255\254"] = "AP/+" } do
      assert.equal(encoded, text.base64(plain))
      assert.equal(plain, text.base64_decode(encoded))
    end
    for _, bad in ipairs { "Zg=", "Zg", "Z===", "Zg==Zg==", "Zm9v!", "=Zg=" } do
      assert.is_nil(text.base64_decode(bad), bad)
    end
  end)
end)
