-- Response header blocks as the engine parses them (src/parse.c's
-- rwp_header_next, src/engine.c's tables): trailers kept apart, repeated
-- fields readable one by one, linear joining. Every response here is sent
-- byte for byte by the test server's `raw` action.
local rw = require "ratewise"
local server = require "spec.support.server"

local quiet = { on_retry = false }

-- A chunked response: headers (lines without CRLF), body, trailer lines.
local function chunked(status_line, header_lines, body, trailer_lines)
  return status_line .. "\r\nTransfer-Encoding: chunked\r\n" .. table.concat(header_lines, "\r\n")
    .. (#header_lines > 0 and "\r\n" or "") .. "\r\n"
    .. string.format("%x\r\n%s\r\n0\r\n", #body, body)
    .. table.concat(trailer_lines, "\r\n") .. (#trailer_lines > 0 and "\r\n" or "") .. "\r\n"
end

-- A response with a Content-Length body.
local function plain(status_line, header_lines, body)
  return status_line .. "\r\nContent-Length: " .. #body .. "\r\n" .. table.concat(header_lines, "\r\n")
    .. (#header_lines > 0 and "\r\n" or "") .. "\r\n" .. body
end

describe("response headers", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  local function raw(path, ...)
    local steps = {}
    for i, answer in ipairs { ... } do steps[i] = { action = "raw", body = answer } end
    s:script(path, steps)
  end

  describe("trailers", function()
    it("are res.trailers, never res.headers", function()
      raw("/t", chunked("HTTP/1.1 200 OK", { "Trailer: X-Checksum, Retry-After", "X-Head: h" }, "hello",
        { "X-Checksum: abc", "Retry-After: 30", "x-checksum:  def " }))
      local res = assert(rw.fetch(s:url("/t"), quiet))
      assert.equal(1, #s:log("/t"))
      assert.equal("hello", res.body)
      assert.equal("h", res.headers["x-head"])
      assert.equal("chunked", res.headers["transfer-encoding"])
      assert.is_nil(res.headers["x-checksum"])
      assert.is_nil(res.headers["retry-after"])
      assert.same({ ["x-checksum"] = "abc, def", ["retry-after"] = "30" }, res.trailers)
      -- looked up whatever the case, as res.headers are
      assert.equal("abc, def", res.trailers["X-Checksum"])
      assert.is_nil(res.header_lists)
    end)

    it("never steer a retry's wait: a trailer Retry-After is no hint", function()
      raw("/t503", chunked("HTTP/1.1 503 Service Unavailable", {}, "busy", { "Retry-After: 30" }),
        plain("HTTP/1.1 200 OK", {}, "ok"))
      local infos = {}
      local res = assert(rw.fetch(s:url("/t503"), {
        sleep = function() end, max_delay = 0.5,
        on_retry = function(info) infos[#infos + 1] = info end,
      }))
      assert.equal(200, res.status)
      assert.equal(2, #s:log("/t503"))
      assert.equal(1, #infos)
      assert.equal("backoff", infos[1].source)
      assert.is_true(infos[1].delay <= 0.5, "waited " .. infos[1].delay .. " s")
    end)

    it("are absent without trailer fields", function()
      raw("/none", chunked("HTTP/1.1 200 OK", { "X-A: 1" }, "body", {}),
        chunked("HTTP/1.1 200 OK", { "X-A: 1" }, "body", { "Bad Name: x", " folded" }),
        plain("HTTP/1.1 200 OK", { "X-A: 1" }, "body"))
      for _ = 1, 3 do
        local res = assert(rw.fetch(s:url("/none"), quiet))
        assert.equal("body", res.body)
        assert.equal("1", res.headers["x-a"])
        assert.is_nil(res.trailers)
      end
      assert.equal(3, #s:log("/none"))
    end)
  end)

  describe("repeated fields", function()
    it("are joined with \", \" and kept one by one in res.header_lists", function()
      raw("/cookies", plain("HTTP/1.1 200 OK", {
        "Set-Cookie: a=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT; Path=/",
        "Content-Type: text/plain",
        "set-cookie: b=2",
        "SET-COOKIE:c=3  ",
        "X-Twice: one",
        "X-Twice: two",
      }, "ok"))
      local res = assert(rw.fetch(s:url("/cookies"), quiet))
      local cookies = { "a=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT; Path=/", "b=2", "c=3" }
      assert.equal(table.concat(cookies, ", "), res.headers["set-cookie"])
      assert.same({ ["set-cookie"] = cookies, ["x-twice"] = { "one", "two" } }, res.header_lists)
      assert.same(cookies, rw.header_values(res, "Set-Cookie"))
      assert.same({ "text/plain" }, rw.header_values(res, "content-type"))
      assert.same({}, rw.header_values(res, "x-absent"))
    end)

    it("keep an obs-fold line with its own field line", function()
      raw("/fold", plain("HTTP/1.1 200 OK", { "X-Rep: a", "  b", "X-Single: s", "\tt", "X-Rep: c" }, "ok"))
      local res = assert(rw.fetch(s:url("/fold"), quiet))
      assert.same({ "a b", "c" }, res.header_lists["x-rep"])
      assert.equal("a b, c", res.headers["x-rep"])
      assert.equal("s t", res.headers["x-single"])
      assert.is_nil(res.header_lists["x-single"])
    end)

    it("count only in the final response, not in a 1xx or a redirect hop", function()
      raw("/hop", plain("HTTP/1.1 302 Found", { "Location: /final", "Set-Cookie: hop=1", "Set-Cookie: hop=2",
        "X-Once: hop" }, ""))
      raw("/final", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\nLink: </b>\r\nSet-Cookie: early\r\n\r\n"
        .. plain("HTTP/1.1 200 OK", { "Set-Cookie: final=1", "X-Once: 1", "Set-Cookie: final=2" }, "ok"))
      local res = assert(rw.fetch(s:url("/hop"), quiet))
      assert.equal(1, #s:log("/final"))
      assert.equal("ok", res.body)
      assert.equal(1, res.redirects)
      assert.equal("final=1, final=2", res.headers["set-cookie"])
      assert.equal("1", res.headers["x-once"])
      assert.is_nil(res.headers.link)
      assert.same({ ["set-cookie"] = { "final=1", "final=2" } }, res.header_lists)
      assert.same({ "final=1", "final=2" }, rw.header_values(res, "set-cookie"))
      assert.same({ "1" }, rw.header_values(res, "x-once"))
    end)

    it("are joined in linear work: a name repeated 8,000 times is not copied once per line", function()
      -- Lua memory allocated by a fetch, with the collector stopped so that
      -- nothing is given back: joining at each repeat copies the value so
      -- far every time (8,000 repeats: about 90 MiB), joining once at the
      -- end about as much as the value itself. Twice the lines must cost
      -- about twice, not four times, the memory.
      local function allocated(n)
        local lines = {}
        for i = 1, n do lines[i] = "X-Rep: v" end
        raw("/rep" .. n, plain("HTTP/1.1 200 OK", lines, "ok"))
        collectgarbage()
        collectgarbage("stop")
        local before = collectgarbage("count")
        local ok, res = pcall(rw.fetch, s:url("/rep" .. n), quiet)
        local kib = collectgarbage("count") - before
        collectgarbage("restart")
        assert(ok, res)
        assert(res, "no response")
        assert.equal(n * 3 - 2, #res.headers["x-rep"])
        return kib, res
      end
      allocated(100) -- the engine and its pools warmed up
      local small = allocated(4000)
      local big, res = allocated(8000)
      assert.is_true(big < 3 * small, string.format("4,000 lines: %.0f KiB, 8,000 lines: %.0f KiB", small, big))
      assert.is_true(big < 4096, string.format("8,000 lines allocated %.0f KiB", big))
      assert.equal(8000, #res.header_lists["x-rep"])
    end)

    it("of 60,000 lines are all kept", function()
      local lines = {}
      for i = 1, 60000 do lines[i] = "a:" end
      lines[#lines + 1] = "A: last"
      raw("/many", plain("HTTP/1.1 200 OK", lines, "ok"))
      local res = assert(rw.fetch(s:url("/many"), quiet))
      assert.equal(60001, #res.header_lists.a)
      assert.equal("", res.header_lists.a[1])
      assert.equal("last", res.header_lists.a[60001])
      assert.equal(string.rep(", ", 60000) .. "last", res.headers.a)
    end)
  end)

  describe("field lines", function()
    it("lower-case names, trimmed values; a line with a bad name or a bare CR is dropped with its folds", function()
      raw("/lines", plain("HTTP/1.1 200 OK", {
        "X-Trim: \t  padded \t ",
        "Bad Name: dropped",
        "  fold of a dropped line",
        ": no name",
        "X-CR: a\rb",
        "\tfold of a dropped line",
        "X-Empty:",
        "  ",
        "\tlater",
        "X-Last:v",
      }, "ok"))
      local res = assert(rw.fetch(s:url("/lines"), quiet))
      assert.same({ ["content-length"] = "2", ["x-trim"] = "padded", ["x-empty"] = "later", ["x-last"] = "v" },
        res.headers)
      assert.is_nil(res.header_lists)
    end)
  end)
end)
