-- client:pages: RFC 8288 Link rel="next" pagination against the loopback
-- server, each page a call of the client's own (issue 39, 5).
local rw = require "ratewise"
local server = require "spec.support.server"

describe("core.link", function()
  local core = require "ratewise.core"

  it("finds the first link whose rel names the type, resolved against the base", function()
    local github = '<https://api.github.com/r/1/issues?page=2>; rel="next", '
      .. '<https://api.github.com/r/1/issues?page=5>; rel="last"'
    assert.equal("https://api.github.com/r/1/issues?page=2", core.link(github, "next"))
    assert.equal("https://api.github.com/r/1/issues?page=5", core.link(github, "last"))
    assert.is_nil(core.link(github, "prev"))
    assert.equal("http://h:8/items?page=3", core.link('</items?page=3>; rel="prev next"', "next", "http://h:8/v1/x"))
    assert.equal("http://h:8/v1/page3", core.link("<page3>; REL=NEXT", "next", "http://h:8/v1/x"))
    assert.equal("http://h:8/v1/x?page=4", core.link("<?page=4>; rel=next", "next", "http://h:8/v1/x"))
    assert.equal("http://other/x", core.link("<//other/x>; rel=next", "next", "http://h:8/v1/x"))
    -- a comma, a semicolon and "<" inside a quoted parameter
    assert.equal("http://h:8/y", core.link('<../x>; title="a, b; <c>"; rel=prev, </y>; rel=next', "next",
      "http://h:8/v1/x"))
    -- a link with an anchor is another resource's; the first rel counts
    assert.equal("b", core.link('<a>; anchor="#s"; rel=next, <b>; rel=next', "next"))
    assert.is_nil(core.link("<a>; rel=prev; rel=next", "next"))
    -- a link-value that does not parse is skipped to the next comma
    assert.equal("b", core.link('garbage; rel=next, <a> junk; rel=next, <b>; rel="next"', "next"))
    assert.is_nil(core.link('<a>; rel="next', "next"))
    local url, why = core.link("<a b>; rel=next", "next", "http://h/")
    assert.is_nil(url)
    assert.matches("space or a control character", why)
  end)
end)

describe("client:pages", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  local function new(extra)
    local o = { base_url = s.base .. "/api", on_retry = false, max_elapsed = 5,
      headers = { Authorization = "Bearer pages-secret-token" } }
    for k, v in pairs(extra or {}) do o[k] = v end
    return rw.client(o)
  end

  local function page(body, link, extra)
    local step = { status = 200, body = body, headers = { ["Content-Type"] = "application/json", Link = link } }
    for k, v in pairs(extra or {}) do step[k] = v end
    return step
  end

  -- every page the loop hands over: their bodies, and the error, if any
  local function collect(iter)
    local bodies, errs = {}, {}
    for p, err in iter do
      if p then bodies[#bodies + 1] = p.body else errs[#errs + 1] = err end
    end
    return bodies, errs
  end

  local function queries(path)
    local out = {}
    for i, r in ipairs(s:log(path)) do out[i] = r.query end
    return out
  end

  it("follows rel=\"next\" as GitHub sends it, the call's query on the first page only", function()
    local api = s.base .. "/api/items"
    s:script("/api/items", {
      page('[1,2]', '<' .. api .. '?per_page=2&page=2>; rel="next", <' .. api .. '?per_page=2&page=3>; rel="last"'),
      page('[3,4]', '<' .. api .. '?per_page=2&page=1>; rel="prev", <' .. api .. '?per_page=2&page=3>; rel="next", <'
        .. api .. '?per_page=2&page=3>; rel="last", <' .. api .. '?per_page=2&page=1>; rel="first"'),
      page('[5]', '<' .. api .. '?per_page=2&page=2>; rel="prev", <' .. api .. '?per_page=2&page=1>; rel="first"'),
    })
    local c = new()
    local bodies, errs = collect(c:pages("/items", { query = { per_page = 2 } }))
    assert.same({ "[1,2]", "[3,4]", "[5]" }, bodies)
    assert.same({}, errs)
    assert.same({ "per_page=2", "per_page=2&page=2", "per_page=2&page=3" }, queries("/api/items"))
    for _, r in ipairs(s:log("/api/items")) do assert.equal("Bearer pages-secret-token", r.headers.authorization) end
    assert.equal(3, c:stats().requests)
  end)

  it("resolves relative links against the page's URL, in one Link field or several, rel with several types", function()
    s:script("/api/items", {
      page("one", { '</api/items?page=2>; rel="next"', '</api/items?page=9>; rel=last' }),
      page("two", '<items?page=3>; title="a, b; <c>"; REL="prev NEXT"'),
      page("three", '<?page=4>; rel=next'),
      page("four", '<https://example.invalid/x>; rel="last"'),
    })
    local bodies, errs = collect(new():pages("/items"))
    assert.same({ "one", "two", "three", "four" }, bodies)
    assert.same({}, errs)
    assert.same({ "", "page=2", "page=3", "page=4" }, queries("/api/items"))
  end)

  it("takes each page through the client's limiter and retries", function()
    s:script("/api/items", {
      page("one", '</api/items?page=2>; rel="next"'),
      { status = 429, headers = { ["Retry-After"] = "0" } },
      page("two", '</api/items?page=3>; rel="next"'),
      page("three"),
    })
    local c = new { limiter = rw.bucket { capacity = 1, rate = 10 }, base = 0.01 }
    local t0 = rw.now()
    local bodies, errs = collect(c:pages("/items"))
    local took = rw.now() - t0
    assert.same({ "one", "two", "three" }, bodies)
    assert.same({}, errs)
    assert.same({ "", "page=2", "page=2", "page=3" }, queries("/api/items"))
    assert.is_true(took >= 0.25, "took " .. took) -- 4 attempts through a bucket of 1 at 10/s
    assert.equal(1, c:stats().retries)
  end)

  it("refuses a next link on another origin, sending nothing there, unless cross_origin allows it", function()
    local other = s.base:gsub("127%.0%.0%.1", "localhost") -- the same server under another origin
    s:script("/api/items", { page("one", '<' .. other .. '/elsewhere?token=leak>; rel="next"') })
    s:script("/elsewhere", { page("foreign") })
    local bodies, errs = collect(new():pages("/items"))
    assert.same({ "one" }, bodies)
    assert.equal(1, #errs)
    assert.equal("pagination", errs[1].kind)
    assert.equal(200, errs[1].status)
    assert.equal("one", errs[1].response.body)
    assert.matches("another origin", tostring(errs[1]))
    assert.matches("cross_origin = true", tostring(errs[1]))
    assert.is_nil(tostring(errs[1]):find("token=leak", 1, true))
    assert.equal(0, #s:log("/elsewhere"))

    s:reset()
    s:script("/api/items", { page("one", '<' .. other .. '/elsewhere>; rel="next"') })
    s:script("/elsewhere", { page("foreign") })
    bodies, errs = collect(new():pages("/items", { cross_origin = true }))
    assert.same({ "one", "foreign" }, bodies)
    assert.same({}, errs)
    local seen = s:log("/elsewhere")
    assert.equal(1, #seen)
    assert.is_nil(seen[1].headers.authorization) -- the client's secrets stay behind
  end)

  it("ends with an error when a next link names a page already fetched", function()
    s:script("/api/items", {
      page("one", '</api/items?page=2>; rel="next"'),
      page("two", '</api/items>; rel="next"'),
    })
    local bodies, errs = collect(new():pages("/items"))
    assert.same({ "one", "two" }, bodies)
    assert.equal(1, #errs)
    assert.equal("pagination", errs[1].kind)
    assert.matches("already fetched", errs[1].message)
    assert.equal(2, #s:log("/api/items"))
  end)

  it("stops after max_pages pages", function()
    s:script("/api/items", {
      page("one", '</api/items?page=2>; rel="next"'),
      page("two", '</api/items?page=3>; rel="next"'),
      page("three", '</api/items?page=4>; rel="next"'),
    })
    local bodies, errs = collect(new():pages("/items", { max_pages = 2 }))
    assert.same({ "one", "two" }, bodies)
    assert.same({}, errs)
    assert.equal(2, #s:log("/api/items"))
  end)

  it("hands a failed page over as false, err once, then ends", function()
    s:script("/api/items", {
      page("one", '</api/items?page=2>; rel="next"'),
      { status = 404, body = "gone" },
    })
    local iter = new():pages("/items")
    local p1 = iter()
    assert.equal("one", p1.body)
    local p2, err = iter()
    assert.is_false(p2)
    assert.equal("terminal", err.kind)
    assert.equal(404, err.status)
    assert.is_nil(iter())
    assert.is_nil(iter())
    assert.equal(2, #s:log("/api/items"))
  end)

  it("ends at a link it cannot follow, quoting nothing of it", function()
    s:script("/api/items", { page("one", '<ftp://127.0.0.1/x?key=SECRET-L>; rel="next"') })
    local bodies, errs = collect(new():pages("/items"))
    assert.same({ "one" }, bodies)
    assert.equal("pagination", errs[1].kind)
    assert.is_nil(errs[1].message:find("SECRET", 1, true))
    s:reset()
    s:script("/api/items", { page("one", '</api/x y?key=SECRET-L>; rel="next"') })
    bodies, errs = collect(new():pages("/items"))
    assert.same({ "one" }, bodies)
    assert.equal("pagination", errs[1].kind)
    assert.is_nil(errs[1].message:find("SECRET", 1, true))
    assert.equal(1, #s:log("/api/items"))
  end)

  it("raises for bad arguments at the call, before anything is sent", function()
    local c = new()
    assert.error_matches(function() c:pages("/items", { max_pages = 0 }) end,
      "option 'max_pages' must be a positive integer")
    assert.error_matches(function() c:pages("/items", { max_pages = "2" }) end, "'max_pages'")
    assert.error_matches(function() c:pages("items?key=SECRET") end, "path must start with /")
    assert.error_matches(function() c:pages("/items", 5) end, "options must be a table")
    assert.error_matches(function() c:pages("/items", { query = { q = { a = 1 } } }) end,
      "query parameter .q. must be an array")
    assert.equal(0, #s:log())
  end)
end)
