-- The option schema (lua/ratewise/options.lua) against everything else
-- that names the options: the engine's request fields (src/transfer.h
-- REQUEST_FIELDS), the editor types (types/library), the option tables of
-- docs/reference.md, fetch's own defaults, and the one wording of an
-- unknown option.
local rw = require "ratewise"
local options = require "ratewise.options"
local plan = require "ratewise.fetch.plan"
local server = require "spec.support.server"

local function read(path)
  return (assert(server.read_file(path), "cannot read " .. path))
end

local function sorted(set)
  local list = {}
  for k in pairs(set) do list[#list + 1] = k end
  table.sort(list)
  return list
end

-- The names of the set a that b lacks, sorted.
local function missing(a, b)
  local list = {}
  for k in pairs(a) do if not b[k] then list[#list + 1] = k end end
  table.sort(list)
  return list
end

local function names_of(scope)
  local set = {}
  for name in pairs(scope) do set[name] = true end
  return set
end

-- The fields of a LuaCATS class in types/library: name -> its type and
-- description, as written.
local function annotated(path, class)
  local text = read(path)
  local start = assert(text:find("---@class " .. class .. "[:\n ]"), path .. " has no class " .. class)
  local fields = {}
  local after = text:find("\n", start, true) + 1
  for line in text:sub(after):gmatch("([^\n]*)\n") do
    local name, rest = line:match("^%-%-%-@field ([%a_][%w_]*)%?? (.*)$")
    if not name then break end
    fields[name] = rest
  end
  return fields
end

-- The rows of docs/reference.md's tables from heading `from` to heading
-- `to`: { names = {...}, cells = {...} } for each row whose first cell
-- names options in backquotes.
local function documented(from, to)
  local text = read("docs/reference.md")
  local start = assert(text:find("\n" .. from .. "\n", 1, true), "docs/reference.md has no " .. from)
  local stop = assert(text:find("\n" .. to .. "\n", start, true), "docs/reference.md has no " .. to)
  local rows = {}
  for line in text:sub(start, stop):gmatch("\n(|[^\n]*)") do
    local cells = {}
    for cell in line:gmatch("|%s*([^|]-)%s*%f[|]") do cells[#cells + 1] = cell end
    local names = {}
    for name in (cells[1] or ""):gmatch("`([%a_][%w_]*)`") do names[#names + 1] = name end
    if #names > 0 then rows[#rows + 1] = { names = names, cells = cells } end
  end
  return rows
end

-- A default as docs/reference.md writes it.
local function shown_default(v)
  if type(v) == "string" then return '`"' .. v .. '"`' end
  if type(v) == "number" and v >= 1024 * 1024 and v % (1024 * 1024) == 0 then
    return string.format("%d MiB", v / (1024 * 1024))
  end
  return tostring(v)
end

-- What the types say of a fetch option of each kind: the start of its
-- annotated type.
local annotation_of_kind = {
  string = "string", table = "table", boolean = "boolean", positive = "number", nonnegative = "number",
  finite = "number", time = "number", count = "integer", ["function"] = "fun%(", callback_or_false = "fun%(.*%)|false",
  key = "true|string", names = "string%[%]", jitter = "ratewise%.Jitter", retry_after = "ratewise%.RetryAfterMode",
  tls_version = '"1%.2"|"1%.3"', limiter = "ratewise%.Limiter", policy = "ratewise%.Policy",
  circuit = "ratewise%.Circuit", budget = "ratewise%.RetryBudget", cost = "number|ratewise%.LimitCost|fun%(",
}

describe("the option schema", function()
  it("declares each option once, with a kind that has a check and a known layer", function()
    local seen, layers = {}, { plan = true, attempt = true, decision = true, loop = true, engine = true,
      client = true }
    for _, entry in ipairs(options.schema) do
      assert.is_nil(seen[entry.name], entry.name .. " is declared twice")
      seen[entry.name] = true
      assert.is_true(layers[entry.layer] ~= nil, entry.name .. ": layer " .. tostring(entry.layer))
      assert.is_true(options.checkers[entry.kind] ~= nil or annotation_of_kind[entry.kind] ~= nil
        or entry.client == "own", entry.name .. ": kind " .. tostring(entry.kind))
      assert.is_true(entry.identity ~= nil, entry.name .. " says nothing of its identity")
      assert.is_true(entry.fetch or entry.client ~= nil or entry.call, entry.name .. " is taken by nobody")
    end
  end)

  it("names exactly the engine's request fields (src/transfer.h REQUEST_FIELDS), and its transport ones", function()
    local header = read("src/transfer.h")
    local block = assert(header:match("#define REQUEST_FIELDS(.-)\nenum request_field"))
    local fields = {}
    for name in block:gmatch('REQUEST_FIELD%(RF_[%u_]+, "([%w_]+)"%)') do fields[name] = true end
    assert.is_not_nil(next(fields))
    local declared = {}
    for _, name in ipairs(options.request_only_fields) do declared[name] = true end
    for _, entry in ipairs(options.schema) do
      if entry.field then declared[entry.field] = true end
      if entry.transport then
        assert.equal(entry.name, entry.field, entry.name .. ": a transport option is its own request field")
      end
    end
    assert.same({}, missing(fields, declared), "request fields the schema does not declare")
    assert.same({}, missing(declared, fields), "fields the schema declares that the engine does not read")
    -- fetch hands the engine the schema's transport options
    assert.equal(options.transport, plan.transport_options)
  end)

  it("agrees with the editor types of rw.fetch, rw.client and a client's calls", function()
    local fetch_types = annotated("types/library/ratewise/fetch.lua", "ratewise.FetchOptions")
    local fetch_names = names_of(options.fetch)
    assert.same({}, missing(fetch_names, fetch_types), "fetch options without a type")
    assert.same({}, missing(fetch_types, fetch_names), "typed fetch options the schema lacks")
    for name, rest in pairs(fetch_types) do
      local kind = options.fetch[name].kind
      local want = assert(annotation_of_kind[kind], name .. ": kind " .. kind)
      assert.is_truthy(rest:find("^" .. want), name .. " (" .. kind .. ") is typed " .. rest)
    end
    local client_types = annotated("types/library/ratewise/client.lua", "ratewise.ClientOptions")
    local client_names = names_of(options.client)
    assert.same({}, missing(client_names, client_types), "client options without a type")
    assert.same({}, missing(client_types, client_names), "typed client options the schema lacks")
    for _, name in ipairs(options.client_defaults) do
      local kind = options.by_name[name].kind
      assert.is_truthy(client_types[name]:find("^" .. annotation_of_kind[kind]), name .. " is typed "
        .. client_types[name])
    end
    local call_types = annotated("types/library/ratewise/client.lua", "ratewise.RequestOptions")
    for name in pairs(call_types) do fetch_types[name] = true end
    assert.same(sorted(names_of(options.call)), sorted(fetch_types))
    local cache_types = annotated("types/library/ratewise/client.lua", "ratewise.CacheOptions")
    local cache_names = {}
    for _, entry in ipairs(options.cache_schema) do cache_names[entry.name] = true end
    assert.same(sorted(cache_names), sorted(cache_types))
  end)

  it("agrees with docs/reference.md's tables of options and their defaults", function()
    local rows = documented("## Requests: `rw.fetch`", "#### The response")
    local listed = {}
    for _, row in ipairs(rows) do
      local defaults = #row.names > 1 and #row.cells >= 3 and {} or { row.cells[2] }
      if #row.names > 1 then
        for part in (row.cells[2] .. ", "):gmatch("(.-), ") do defaults[#defaults + 1] = part end
      end
      for i, name in ipairs(row.names) do
        assert.is_nil(listed[name], name .. " is documented twice")
        listed[name] = true
        local entry = options.fetch[name]
        local default = entry and entry.default
        if default ~= nil and (#row.names == 1 or #defaults == #row.names) then
          local cell = defaults[i]
          local words = type(default) == "string" and (cell == default or cell == "`" .. default .. "`")
          assert.is_truthy(words or cell:sub(1, #shown_default(default)) == shown_default(default),
            name .. ": the schema's default is " .. tostring(default) .. ", the docs' " .. cell)
        end
      end
    end
    assert.same(sorted(names_of(options.fetch)), sorted(listed))
    local client_listed = {}
    for _, row in ipairs(documented("### rw.client", "### client:request")) do
      for _, name in ipairs(row.names) do client_listed[name] = true end
    end
    assert.same(sorted(names_of(options.client)), sorted(client_listed))
  end)

  it("gives fetch the defaults it uses", function()
    assert.equal(options.default("timeout"), plan.DEFAULT_TIMEOUT)
    assert.equal(options.default("max_elapsed"), plan.DEFAULT_MAX_ELAPSED)
  end)

  it("marks as identity every option the engine reads that changes what is sent or how it is read", function()
    for _, entry in ipairs(options.schema) do
      if entry.layer == "engine" and not entry.name:find("timeout$") then
        assert.is_truthy(entry.identity, entry.name .. " is read by the engine but is no part of the identity")
      end
      if entry.secret and entry.identity == "value" then
        -- a secret's value would be compared as it is: only a list of names may be
        assert.equal("names", entry.kind, entry.name)
      end
    end
    for _, name in ipairs { "client_cert", "client_key", "ca_file", "verify_tls", "pinned_public_key", "proxy",
      "decompress", "tls_min_version", "max_body", "follow_redirects" } do
      assert.is_truthy(options.by_name[name].identity, name)
    end
    assert.equal("secret", options.by_name.client_key_password.identity)
    assert.equal("secret", options.by_name.proxy.identity)
  end)
end)

describe("an unknown option", function()
  local URL = "http://127.0.0.1:1/never"

  it("is named, with the nearest known one, by every table of options", function()
    local cases = {
      { function() rw.fetch(URL, { conect_timeout = 1 }) end,
        "fetch: unknown option 'conect_timeout' (did you mean 'connect_timeout'?)" },
      { function() rw.fetch(URL, { retries = 3 }) end,
        "fetch: unknown option 'retries' (did you mean 'max_retries'?)" },
      { function() rw.client { base_url = URL, dedup = false } end,
        "client: unknown option 'dedup' (did you mean 'dedupe'?)" },
      { function() rw.circuit { failure = 3 } end, "circuit: unknown option 'failure' (did you mean 'failures'?)" },
      { function() rw.retry_budget { ration = 0.1 } end,
        "retry_budget: unknown option 'ration' (did you mean 'ratio'?)" },
      { function() rw.adaptive { max_rat = 5 } end, "adaptive: unknown option 'max_rat' (did you mean 'max_rate'?)" },
      { function() rw.limiters { rw.bucket { capacity = 1, rate = 1 }, costs = 1 } end,
        "limiters: unknown option 'costs' (did you mean 'cost'?)" },
      { function() rw.policy { clasify = print } end, "policy: unknown field 'clasify' (did you mean 'classify'?)" },
      { function() rw.shared_bucket { dict = "d", capacity = 1, rate = 1, burst = 2 } end,
        "shared_bucket: unknown option 'burst'" },
    }
    for _, case in ipairs(cases) do
      local ok, err = pcall(case[1])
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(case[2], 1, true), tostring(err))
    end
  end)

  it("names the caller's line", function()
    local ok, err = pcall(function() rw.fetch(URL, { conect_timeout = 1 }) end)
    assert.is_false(ok)
    assert.matches("options_spec.lua:%d+: fetch: unknown option", err)
  end)

  it("is shown cut short and without control characters", function()
    local ok, err = pcall(rw.fetch, URL, { [("x"):rep(100) .. "\n"] = 1 })
    assert.is_false(ok)
    assert.is_nil(err:find("\n", 1, true))
    assert.is_true(#err < 200)
  end)
end)
