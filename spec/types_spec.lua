-- The editor types (types/library, LuaCATS annotations for the Lua Language
-- Server) against the library they describe. Neither Debian nor npm ships
-- lua-language-server, so this spec checks what its `--check` would rely
-- on: every file loads as Lua and defines nothing when run, every
-- annotation line is well-formed, every type named is defined, and the
-- annotations name exactly the functions, methods and options the real
-- objects have (found by iterating them and by probing each constructor
-- with every name it might take), so that the types cannot drift from the
-- code unnoticed.
local rw = require "ratewise"
local core = require "ratewise.core"
local server = require "spec.support.server"

local LIBRARY = "types/library"

local function read(path)
  return (assert(server.read_file(path), "cannot read " .. path))
end

-- The file at path as a function whose globals are env's.
local function load_in(path, env)
  local setfenv = rawget(_G, "setfenv") -- Lua 5.1 and LuaJIT
  if setfenv then
    local chunk = assert(rawget(_G, "loadstring")(read(path), "@" .. path))
    return setfenv(chunk, env)
  end
  return assert(load(read(path), "@" .. path, "t", env))
end

local function library_files()
  local list = {}
  local p = assert(io.popen("find " .. LIBRARY .. " -name '*.lua' | sort"))
  for line in p:lines() do list[#list + 1] = line end
  p:close()
  return list
end

local function sorted_keys(set)
  local list = {}
  for k in pairs(set) do list[#list + 1] = tostring(k) end
  table.sort(list)
  return list
end

-- The names in a that are not in b, sorted, for a readable failure.
local function missing(a, b)
  local list = {}
  for k in pairs(a) do if not b[k] then list[#list + 1] = tostring(k) end end
  table.sort(list)
  return list
end

---------------------------------------------------------------------------
-- A parser of LuaCATS type expressions: the subset the definitions use.
-- parse_type(s, i) -> the position after the type, and the names it uses;
-- raises with the position on anything else.

local BUILTIN = {
  ["nil"] = true, any = true, boolean = true, string = true, number = true, integer = true,
  ["function"] = true, table = true, thread = true, userdata = true, lightuserdata = true,
  unknown = true, ["true"] = true, ["false"] = true, self = true,
}

local parse_type

local function skip(s, i)
  return (s:find("[^ ]", i)) or #s + 1
end

local function fail(s, i, what)
  error(string.format("expected %s at column %d of %q", what, i, s), 0)
end

local function parse_name(s, i)
  local name = s:match("^[%a_][%w_%.]*", i)
  if not name then fail(s, i, "a name") end
  return i + #name, name
end

-- fun(a: T, b?: U, ...: V): R1, R2
local function parse_fun(s, i, names)
  i = i + 3
  if s:sub(i, i) ~= "(" then fail(s, i, "'(' after fun") end
  i = skip(s, i + 1)
  if s:sub(i, i) ~= ")" then
    repeat
      if s:sub(i, i + 2) == "..." then
        i = i + 3
      else
        i = parse_name(s, i)
        if s:sub(i, i) == "?" then i = i + 1 end
      end
      if s:sub(i, i) == ":" then i = parse_type(s, skip(s, i + 1), names) end
      i = skip(s, i)
      local c = s:sub(i, i)
      if c == "," then i = skip(s, i + 1) elseif c ~= ")" then fail(s, i, "',' or ')' in fun's parameters") end
    until c == ")"
  end
  i = i + 1
  local after = skip(s, i)
  if s:sub(after, after) == ":" then
    i = parse_type(s, skip(s, after + 1), names)
    while s:sub(i, i) == "," do i = parse_type(s, skip(s, i + 1), names) end
  end
  return i
end

-- { name: T, [K]: V, ... }
local function parse_table_literal(s, i, names)
  i = skip(s, i + 1)
  while s:sub(i, i) ~= "}" do
    if s:sub(i, i) == "[" then
      i = parse_type(s, skip(s, i + 1), names)
      if s:sub(i, i) ~= "]" then fail(s, i, "']'") end
      i = i + 1
    else
      i = parse_name(s, i)
    end
    if s:sub(i, i) == "?" then i = i + 1 end
    if s:sub(i, i) ~= ":" then fail(s, i, "':' in a table type") end
    i = skip(s, parse_type(s, skip(s, i + 1), names))
    if s:sub(i, i) == "," then i = skip(s, i + 1) elseif s:sub(i, i) ~= "}" then fail(s, i, "',' or '}'") end
  end
  return i + 1
end

local function parse_primary(s, i, names)
  local c = s:sub(i, i)
  if c == '"' or c == "'" then
    local close = s:find(c, i + 1, true)
    if not close then fail(s, i, "a closing quote") end
    return close + 1
  elseif c:match("%d") or (c == "-" and s:sub(i + 1, i + 1):match("%d")) then
    return (select(2, s:find("^%-?%d+", i))) + 1
  elseif c == "(" then
    i = parse_type(s, skip(s, i + 1), names)
    if s:sub(i, i) ~= ")" then fail(s, i, "')'") end
    return i + 1
  elseif c == "{" then
    return parse_table_literal(s, i, names)
  elseif s:find("^fun%(", i) then
    return parse_fun(s, i, names)
  end
  local name
  i, name = parse_name(s, i)
  names[#names + 1] = name
  if s:sub(i, i) == "<" then -- table<K, V>
    repeat
      i = parse_type(s, skip(s, i + 1), names)
      i = skip(s, i)
    until s:sub(i, i) ~= ","
    if s:sub(i, i) ~= ">" then fail(s, i, "'>'") end
    i = i + 1
  end
  return i
end

function parse_type(s, i, names)
  while true do
    i = parse_primary(s, i, names)
    while s:sub(i, i + 1) == "[]" or s:sub(i, i) == "?" do
      i = i + (s:sub(i, i) == "?" and 1 or 2)
    end
    if s:sub(i, i) ~= "|" then return i end
    i = i + 1
  end
end

-- The whole of s must be one type.
local function type_names(s)
  local names = {}
  local i = parse_type(s, 1, names)
  if i <= #s then fail(s, i, "the end of the type") end
  return names
end

-- A type, then (after a space) free text: answers the type's text and names.
local function leading_type(s)
  local names = {}
  local i = parse_type(s, 1, names)
  local rest = s:sub(i)
  if rest ~= "" and not rest:find("^ ") then fail(s, i, "a space or the end after the type") end
  return s:sub(1, i - 1), names
end

---------------------------------------------------------------------------
-- The model of the definitions: classes (fields and functions, parents) and
-- aliases, from every ---@ line of every file.

local function parse_library()
  local model = { classes = {}, aliases = {}, uses = {}, problems = {}, files = {} }
  local function problem(where, why) model.problems[#model.problems + 1] = where .. ": " .. why end
  local function use(where, names)
    for _, name in ipairs(names) do model.uses[#model.uses + 1] = { where = where, name = name } end
  end
  for _, path in ipairs(library_files()) do
    model.files[#model.files + 1] = path
    local locals = {}          -- local V = {} after a ---@class: V -> class
    local pending_class        -- the class the last ---@class line named, until code follows
    local params               -- the ---@param names before the next function
    local alias                -- the ---@alias whose ---| lines follow
    local n = 0
    for line in (read(path) .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      local where = path .. ":" .. n
      local ok, why = pcall(function()
        local tag, rest = line:match("^%-%-%-@(%a+)%s*(.-)%s*$")
        if line:find("^%-%-%-|") then
          if not alias then error("a ---| line outside an ---@alias", 0) end
          local value = line:match("^%-%-%-|%s*(.-)%s*$"):gsub("%s*#.*$", "")
          use(where, type_names(value))
          local literal = value:match('^"(.*)"$')
          if literal then model.aliases[alias].values[literal] = true end
          return
        end
        alias = nil
        if not tag then
          if line:find("^%-%-%-@") then error("an annotation without a tag name", 0) end
          local var = line:match("^local ([%a_][%w_]*) = {}$")
          if var and pending_class then locals[var] = pending_class end
          local owner, sep, fname, args = line:match("^function ([%a_][%w_]*)([.:])([%a_][%w_]*)%((.-)%) end$")
          if line:find("^function ") then
            if not owner then
              error("a definition must be `function V.name(...) end` or `function V:name(...) end`", 0)
            end
            local class = locals[owner]
            if not class then error("function on '" .. owner .. "', which is no ---@class's local", 0) end
            local c = model.classes[class]
            if c.members[fname] then error("'" .. fname .. "' is defined twice on " .. class, 0) end
            c.members[fname] = { kind = sep == ":" and "method" or "function", where = where }
            local declared = {}
            for arg in args:gmatch("[^,%s]+") do declared[arg] = true end
            for name in pairs(params or {}) do
              if not declared[name] then error("---@param " .. name .. " names no parameter of " .. fname, 0) end
            end
            for name in pairs(declared) do
              if not (params or {})[name] then
                error("parameter " .. name .. " of " .. fname .. " has no ---@param", 0)
              end
            end
          end
          if not line:find("^%-%-") then pending_class, params = nil, nil end
          return
        end
        if tag == "meta" then
          if n ~= 1 then error("---@meta must be the first line", 0) end
          if rest ~= "" and not rest:match("^[%a_][%w_%.]*$") then error("bad ---@meta name", 0) end
          model.files[path] = rest
        elseif tag == "class" then
          local name, parents = rest:match("^([%a_][%w_%.]*)%s*(.*)$")
          if not name then error("---@class needs a name", 0) end
          if model.classes[name] then error("class " .. name .. " is defined twice", 0) end
          local c = { name = name, parents = {}, members = {}, where = where }
          if parents ~= "" then
            local list = parents:match("^:%s*(.+)$")
            if not list then error("after the class name only ': Parent' may follow", 0) end
            for parent in list:gmatch("[^,%s]+") do
              c.parents[#c.parents + 1] = parent
              use(where, type_names(parent))
            end
          end
          model.classes[name] = c
          pending_class = name
        elseif tag == "field" then
          if not pending_class then error("---@field outside a ---@class", 0) end
          local name, optional, type_text = rest:match("^([%a_][%w_]*)(%??) (.+)$")
          if not name then
            local key
            key, type_text = rest:match("^(%[[%a_][%w_%.]*%]) (.+)$")
            if not key then error("---@field needs a name (or [key type]) and a type", 0) end
            use(where, type_names(key:sub(2, -2)))
            name = key
          end
          local t, names = leading_type(type_text)
          use(where, names)
          local c = model.classes[pending_class]
          if c.members[name] then error("field " .. name .. " is defined twice on " .. pending_class, 0) end
          c.members[name] = { kind = "field", optional = optional == "?", type = t, where = where }
        elseif tag == "param" then
          local name, type_text = rest:match("^([%a_][%w_]*%??) (.+)$")
          if not name then name, type_text = rest:match("^(%.%.%.) (.+)$") end
          if not name then error("---@param needs a name and a type", 0) end
          local _, names = leading_type(type_text)
          use(where, names)
          params = params or {}
          params[(name:gsub("%?$", ""))] = true
        elseif tag == "return" then
          local _, names = leading_type(rest)
          use(where, names)
        elseif tag == "alias" then
          local name, type_text = rest:match("^([%a_][%w_%.]*)%s*(.*)$")
          if not name then error("---@alias needs a name", 0) end
          if model.aliases[name] or model.classes[name] then error(name .. " is defined twice", 0) end
          model.aliases[name] = { values = {}, where = where }
          if type_text == "" then
            alias = name
          else
            use(where, type_names(type_text))
            for literal in type_text:gmatch('"([^"]*)"') do model.aliases[name].values[literal] = true end
          end
        elseif tag == "overload" then
          if not pending_class then error("---@overload here must follow a ---@class", 0) end
          use(where, type_names(rest))
          model.classes[pending_class].callable = true
        else
          error("---@" .. tag .. " is not a tag this spec checks: add its grammar here first", 0)
        end
      end)
      if not ok then problem(where, why) end
    end
  end
  return model
end

-- Every member of a class, its parents' included: name -> member.
local function members_of(model, name, into)
  into = into or {}
  local c = assert(model.classes[name], "no class " .. name)
  for _, parent in ipairs(c.parents) do members_of(model, parent, into) end
  for k, m in pairs(c.members) do into[k] = m end
  return into
end

---------------------------------------------------------------------------
-- What the real objects have.

-- The public names of an object and what they hold: its own keys and those
-- of its metatable's __index tables; for an __index function, the names in
-- the tables it keeps (its upvalues) that the object answers with a
-- function. Names starting with "_" and a lower-case letter are private.
local function real_members(obj, own_fields)
  local found = {}
  local function add(k, v)
    if type(k) == "string" and not k:find("^_[%l_]") then found[k] = type(v) end
  end
  if own_fields and type(obj) == "table" then
    for k, v in pairs(obj) do add(k, v) end
  end
  local seen = {}
  local mt = getmetatable(obj)
  while type(mt) == "table" and not seen[mt] do
    seen[mt] = true
    local index = rawget(mt, "__index")
    if type(index) == "table" then
      for k, v in pairs(index) do add(k, v) end
      mt = getmetatable(index)
    elseif type(index) == "function" then
      for i = 1, math.huge do
        local name, value = debug.getupvalue(index, i)
        if not name then break end
        if type(value) == "table" then
          for k in pairs(value) do
            if type(k) == "string" and type(obj[k]) == "function" then add(k, obj[k]) end
          end
        end
      end
      mt = nil
    else
      mt = nil
    end
  end
  return found
end

-- Compares an object's public names with a class's members: each name the
-- object has is annotated, and each annotated member that is not optional
-- is there (a function where the class says method or function).
local function same_api(obj, class, model, opts)
  opts = opts or {}
  local real = real_members(obj, opts.own_fields)
  for _, name in ipairs(opts.ignore or {}) do real[name] = nil end
  local annotated = members_of(model, class)
  local unannotated = missing(real, annotated)
  assert.are.same({}, unannotated, class .. ": not annotated")
  local absent = {}
  for name, m in pairs(annotated) do
    local has = real[name] or (opts.lazy and obj[name] ~= nil and type(obj[name]))
    if not has and not m.optional and not (opts.may_lack or {})[name] then absent[#absent + 1] = name end
    if has and m.kind ~= "field" and has ~= "function" then absent[#absent + 1] = name .. " (not a function)" end
  end
  table.sort(absent)
  assert.are.same({}, absent, class .. ": annotated but not there")
end

-- Every string key reachable from fn through upvalues and the tables they
-- hold, a few steps deep: the names a constructor's checks may know. The
-- globals (_ENV) are not the library's.
local function reachable_names(fn, depth)
  local names, seen = {}, { [_G] = true }
  local function visit(v, d)
    if d < 0 or seen[v] then return end
    seen[v] = true
    if type(v) == "function" then
      for i = 1, math.huge do
        local name, value = debug.getupvalue(v, i)
        if not name then break end
        if name ~= "_ENV" and (type(value) == "function" or type(value) == "table") then visit(value, d - 1) end
      end
    elseif type(v) == "table" then
      for k, value in pairs(v) do
        if type(k) == "string" and k:find("^[%a_][%w_]*$") and not k:find("^__") then names[k] = true end
        if type(value) == "function" or type(value) == "table" then visit(value, d - 1) end
      end
    end
  end
  visit(fn, depth or 6)
  return names
end

-- The option names that docs/reference.md's tables list in their first
-- column (`name` or `name(...)`), from the heading `from` to the heading `to`.
local function documented_options(from, to)
  local text = read("docs/reference.md")
  local start = assert(text:find("\n" .. from .. "\n", 1, true), "docs/reference.md has no " .. from)
  local stop = assert(text:find("\n" .. to .. "\n", start, true), "docs/reference.md has no " .. to)
  local names = {}
  for row in text:sub(start, stop):gmatch("\n| ([^|\n]+) |") do
    for name in row:gmatch("`([%a_][%w_]*)[`(]") do names[name] = true end
  end
  return names
end

-- A value no option of any kind accepts: not a string, number, boolean,
-- function or table, and with no methods.
local BAD = coroutine.create(function() end)

local function is_unknown(message)
  return tostring(message):find("unknown option", 1, true) or tostring(message):find("unknown field", 1, true)
end

-- The names among candidates that try(name) takes as options: each is
-- given BAD, which an option refuses by name and an unknown one as
-- unknown, before anything is done. Also answers the names taken whose
-- value was never looked at (the call went through).
local function accepted(candidates, try)
  local taken, unchecked = {}, {}
  for name in pairs(candidates) do
    local ok, err = pcall(try, name)
    if ok then unchecked[name] = true end
    if ok or not is_unknown(err) then taken[name] = true end
  end
  return taken, unchecked
end

-- The option fields of a class (its parents' included).
local function option_fields(model, class)
  local set = {}
  for name, m in pairs(members_of(model, class)) do
    if m.kind == "field" and not name:find("^%[") then set[name] = true end
  end
  return set
end

local function union(...)
  local set = {}
  for i = 1, select("#", ...) do for k in pairs(select(i, ...)) do set[k] = true end end
  return set
end

---------------------------------------------------------------------------

describe("the editor types", function()
  local model = parse_library()

  it("are LuaLS meta files that load as Lua and define nothing when run", function()
    assert.is_true(#model.files >= 7)
    for _, path in ipairs(model.files) do
      assert.is_not_nil(model.files[path], path .. " does not start with ---@meta")
      local set = {}
      local env = setmetatable({}, { __newindex = function(_, k) set[#set + 1] = k end })
      local ok, err = pcall(load_in(path, env))
      assert(ok, err)
      assert.are.same({}, set, path .. " sets globals")
    end
    assert.equal("ratewise", model.files[LIBRARY .. "/ratewise.lua"])
    assert.equal("ratewise.core", model.files[LIBRARY .. "/ratewise/core.lua"])
  end)

  it("are well-formed, and every type they name is defined", function()
    assert.are.same({}, model.problems)
    local undefined = {}
    for _, u in ipairs(model.uses) do
      if not BUILTIN[u.name] and not model.classes[u.name] and not model.aliases[u.name] then
        undefined[#undefined + 1] = u.where .. ": " .. u.name
      end
    end
    assert.are.same({}, undefined)
    -- and every type they define is named under ratewise
    for name in pairs(union(model.classes, model.aliases)) do
      assert.matches("^ratewise", name)
    end
  end)

  it("tell a wrong annotation by its line", function()
    -- the checks above are only worth something if they catch these
    for _, bad in ipairs { "fun(a: string", "string|", "table<string, number", "{ a: }", "ratewise.Response extra" } do
      assert.is_false(pcall(type_names, bad), bad)
    end
    assert.are.same({ "ratewise.Response", "nil" }, type_names("ratewise.Response|nil"))
    assert.are.same({ "ratewise.Response", "integer", "any", "number", "nil" },
      type_names("fun(res: ratewise.Response, attempt?: integer, ...: any): number|nil"))
  end)

  it("name every function of require 'ratewise', and nothing it lacks", function()
    same_api(rw, "ratewise", model, { own_fields = true, ignore = {} })
    assert.is_not_nil(rawget(rw, "_VERSION"))
    assert.is_not_nil(members_of(model, "ratewise")._VERSION)
  end)

  it("name every field of ratewise.core and every method of its types", function()
    -- Test builds add hooks for specs (RW_STACK_CHECK, RW_FAULTS); a core
    -- built without Redis has no Redis connection.
    local without_redis = core.redis_connect == nil
    same_api(core, "ratewise.core", model, { own_fields = true, ignore = { "stack_checked" },
      may_lack = { redis_connect = without_redis } })
    local types = {}
    for name, mt in pairs(debug.getregistry()) do
      if type(name) == "string" and name:find("^ratewise%.") and type(mt) == "table" then
        types[name] = true
        assert(model.classes[name], "ratewise.core registers " .. name .. ", which has no ---@class")
        local methods = {}
        if type(mt.__index) == "table" then
          for k, v in pairs(mt.__index) do
            if type(v) == "function" and k ~= "fail_next" and k ~= "all_drives" then methods[k] = true end
          end
        end
        local annotated = {}
        for k, m in pairs(members_of(model, name)) do
          if m.kind == "method" then annotated[k] = true end
        end
        assert.are.same({}, missing(methods, annotated), name .. ": methods not annotated")
        assert.are.same({}, missing(annotated, methods), name .. ": annotated methods it lacks")
      end
    end
    for _, name in ipairs { "ratewise.Bucket", "ratewise.BucketPlace", "ratewise.Engine", "ratewise.Transfer",
      "ratewise.SSEParser" } do
      assert(types[name], "ratewise.core no longer registers " .. name)
    end
    if not without_redis then assert(types["ratewise.Redis"]) end
  end)

  it("name the fields of the engine's request table as src/ lists them", function()
    local fields = {}
    local p = assert(io.popen("cat src/*.h src/*.c"))
    for name in p:read("*a"):gmatch('REQUEST_FIELD%(RF_[%w_]+,%s*"([%w_]+)"%)') do fields[name] = true end
    p:close()
    assert.is_not_nil(next(fields))
    assert.are.same(sorted_keys(fields), sorted_keys(option_fields(model, "ratewise.core.Request")))
  end)

  it("name every method of the objects the constructors make", function()
    local bucket = rw.bucket { capacity = 1, rate = 1 }
    same_api(bucket, "ratewise.Bucket", model)
    same_api(rw.adaptive {}, "ratewise.Adaptive", model)
    same_api(rw.limiters { bucket }, "ratewise.Limiters", model)
    same_api(rw.redis_bucket { redis = { evalsha = function() end, eval = function() end }, key = "types",
      capacity = 1, rate = 1 }, "ratewise.RedisBucket", model)
    -- rw.shared_bucket needs OpenResty's ngx.shared; a dict of the shape it reads stands in for it
    local ngx = rawget(_G, "ngx")
    rawset(_G, "ngx", { shared = { types = {} } })
    local ok, shared = pcall(rw.shared_bucket, { dict = "types", capacity = 1, rate = 1 })
    rawset(_G, "ngx", ngx)
    assert(ok, shared)
    same_api(shared, "ratewise.SharedBucket", model)
    same_api(rw.circuit {}, "ratewise.Circuit", model)
    same_api(rw.retry_budget {}, "ratewise.RetryBudget", model)
    same_api(rw.semaphore(1), "ratewise.Semaphore", model)
    same_api(rw.client { base_url = "http://127.0.0.1:9" }, "ratewise.Client", model)
    same_api(rw.pollable, "ratewise.Pollable", model, { own_fields = true })
    local task = rw.spawn(function() return 1 end)
    same_api(task, "ratewise.Task", model)
    assert.equal(1, task:join())
    same_api(rw.policy, "ratewise.PolicyModule", model, { own_fields = true })
    assert.is_function(getmetatable(rw.policy).__call)
    assert.is_true(model.classes["ratewise.PolicyModule"].callable)
  end)

  it("name every built-in provider, and the hooks each has", function()
    local files = {}
    local p = assert(io.popen("ls lua/ratewise/providers"))
    for line in p:lines() do
      local name = line:match("^([%w_]+)%.lua$")
      if name and rw.providers[name] then files[name] = true end
    end
    p:close()
    local annotated = {}
    for name in pairs(model.classes["ratewise.Providers"].members) do
      if not name:find("^%[") then annotated[name] = true end
    end
    assert.are.same(sorted_keys(files), sorted_keys(annotated))
    local hooks = option_fields(model, "ratewise.PolicySpec")
    for name in pairs(files) do
      for hook in pairs(rw.providers[name]) do assert(hooks[hook], name .. " has a hook " .. hook) end
    end
  end)

  describe("against a real server", function()
    local s
    setup(function() s = server.start() end)
    teardown(function() s:stop() end)

    it("name every field and method of a response and of an error", function()
      s:script("/types", { { status = 200, headers = { ["Content-Type"] = "application/json" }, body = '{"a":1}' } })
      local res = assert(rw.fetch(s:url("/types")))
      assert.equal(1, res:json().a)
      local _ = res.headers
      same_api(res, "ratewise.Response", model, { own_fields = true, lazy = true })

      s:script("/missing", { { status = 404, body = "no" } })
      local _, err = rw.fetch(s:url("/missing"))
      assert.equal("terminal", err.kind)
      same_api(err, "ratewise.Error", model, { own_fields = true, lazy = true })

      local _, refused = rw.fetch("http://127.0.0.1:" .. server.free_port() .. "/", { max_retries = 0 })
      assert.is_table(refused.transport)
      same_api(refused, "ratewise.Error", model, { own_fields = true, lazy = true })
      same_api(refused.transport, "ratewise.TransportError", model, { own_fields = true,
        may_lack = { multi = true } })
    end)
  end)

  it("are what this checkout's .luarc.json points LuaLS at, and what the rocks install", function()
    local luarc = require("cjson").decode(read(".luarc.json"))
    assert.are.same({ "types/library" }, luarc["workspace.library"])
    assert.is_true(luarc["runtime.pathStrict"]) -- require "ratewise" finds the types, not lua/ratewise
    -- the addon's words: what makes an editor offer it for a file
    local addon = require("cjson").decode(read("types/config.json"))
    for _, code in ipairs { 'local rw = require "ratewise"', "local rw = require('ratewise')" } do
      assert.is_truthy(code:find(addon.words[1]), code)
    end
    local p = assert(io.popen("ls rockspec/*.rockspec"))
    local rockspecs = 0
    for path in p:lines() do
      rockspecs = rockspecs + 1
      local spec = {}
      load_in(path, spec)()
      local copied = {}
      for _, dir in ipairs(spec.build.copy_directories or {}) do copied[dir] = true end
      assert(copied.types, path .. ": build.copy_directories must list \"types\" (the editor types)")
    end
    p:close()
    assert.is_true(rockspecs > 0)
  end)

  it("name the error kinds docs/reference.md lists", function()
    local text = read("docs/reference.md")
    local from = assert(text:find("| kind | when |", 1, true))
    local kinds = {}
    for kind in text:sub(from, text:find("\n\n", from, true)):gmatch("\n| `([%a_]+)` |") do kinds[kind] = true end
    assert.is_not_nil(next(kinds))
    assert.are.same(sorted_keys(kinds), sorted_keys(model.aliases["ratewise.ErrorKind"].values))
  end)

  -- Each constructor's options: the names in the annotations, in its docs
  -- tables and in the tables its code can reach are tried; those it takes
  -- must be exactly the annotated ones.
  -- docs_from and docs_to: the headings around the tables that document
  -- the options (each of them, unless docs_partial says the tables do not
  -- list every one).
  local function same_options(class, fn, try, docs_from, docs_to, unchecked_expected, docs_partial)
    local annotated = option_fields(model, class)
    local documented = docs_from and documented_options(docs_from, docs_to) or {}
    local taken, unchecked = accepted(union(annotated, documented, reachable_names(fn)), try)
    assert.are.same(unchecked_expected or {}, sorted_keys(unchecked), class .. ": options whose value is not checked")
    assert.are.same({}, missing(taken, annotated), class .. ": options taken but not annotated")
    assert.are.same({}, missing(annotated, taken), class .. ": annotated options not taken")
    assert.are.same({}, missing(documented, taken), class .. ": documented options not taken")
    if docs_from and not docs_partial then
      assert.are.same({}, missing(taken, documented), class .. ": options docs/reference.md does not list")
    end
  end

  it("name every option of rw.fetch and of a client's calls", function()
    same_options("ratewise.FetchOptions", rw.fetch, function(name)
      rw.fetch("http://127.0.0.1:9/", { [name] = BAD })
    end, "## Requests: `rw.fetch`", "#### The response")
    -- A call's method is the one client:request names.
    local c = rw.client { base_url = "http://127.0.0.1:9", max_retries = 0 }
    same_options("ratewise.RequestOptions", c.request, function(name)
      c:request("GET", "/", { [name] = BAD })
    end, nil, nil, { "method" })
  end)

  it("name every option of rw.client", function()
    same_options("ratewise.ClientOptions", rw.client, function(name)
      rw.client { base_url = "http://127.0.0.1:9", [name] = BAD }
    end, "### rw.client", "### client:request")
  end)

  it("name every option of the limiters' constructors", function()
    same_options("ratewise.BucketOptions", rw.bucket, function(name)
      rw.bucket { capacity = 1, rate = 1, [name] = BAD }
    end, "### rw.bucket", "### rw.adaptive")
    same_options("ratewise.AdaptiveOptions", rw.adaptive, function(name) rw.adaptive { [name] = BAD } end,
      "### rw.adaptive", "### rw.redis_bucket")
    same_options("ratewise.RedisBucketOptions", rw.redis_bucket, function(name)
      rw.redis_bucket { [name] = BAD }
    end, "### rw.redis_bucket", "### rw.shared_bucket")
    same_options("ratewise.SharedBucketOptions", rw.shared_bucket, function(name)
      rw.shared_bucket { [name] = BAD }
    end)
    local bucket = rw.bucket { capacity = 1, rate = 1 }
    same_options("ratewise.LimitersSpec", rw.limiters, function(name)
      rw.limiters { bucket, [name] = BAD }
    end)
    same_options("ratewise.CircuitOptions", rw.circuit, function(name) rw.circuit { [name] = BAD } end)
    same_options("ratewise.RetryBudgetOptions", rw.retry_budget, function(name)
      rw.retry_budget { [name] = BAD }
    end)
  end)

  it("name every option of rw.configure, rw.map, rw.policy, rw.backoff and rw.retry_delay", function()
    same_options("ratewise.ConfigureOptions", rw.configure, function(name) rw.configure { [name] = BAD } end,
      "### rw.configure", "### rw.pcall")
    same_options("ratewise.MapOptions", rw.map, function(name) rw.map({}, print, { [name] = BAD }) end)
    same_options("ratewise.PolicySpec", rw.policy.new, function(name) rw.policy { [name] = BAD } end,
      "### rw.policy", "### rw.policy.chain", nil, true) -- the table lists the hooks, not `name`
    same_options("ratewise.BackoffOptions", rw.backoff, function(name) rw.backoff(0, { [name] = BAD }) end)
    same_options("ratewise.RetryDelayOptions", rw.retry_delay, function(name)
      rw.retry_delay({}, 0, { [name] = BAD })
    end)
  end)
end)
