-- The shape rules of the Lua layer, checked over lua/ratewise as text:
-- a function takes a record, not a long list of positional values (at most
-- 7 parameters), and a comment says why, never how many instructions or
-- microseconds (measurements live in commit messages and bench/HISTORY.md).
-- The C core's comments (src/) are held to the same.

local MAX_PARAMETERS = 7

local function lua_files()
  local files = {}
  local p = assert(io.popen("find lua/ratewise -name '*.lua' | sort"))
  for path in p:lines() do files[#files + 1] = path end
  p:close()
  return files
end

local read_file = require("spec.support.server").read_file

local function lines_of(path)
  local text = assert(read_file(path), path)
  local lines = {}
  for line in (text .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
  return lines
end

-- The functions of a line with more than MAX_PARAMETERS parameters, as
-- "path:line name(n)".
local function long_signatures(path, number, line)
  local found = {}
  local code = line:gsub("%-%-.*$", "")
  for name, params in code:gmatch("function%s*([%w_.:]*)%s*%(([^)]*)%)") do
    local n = 0
    for _ in params:gmatch("[^,%s][^,]*") do n = n + 1 end
    if n > MAX_PARAMETERS then
      found[#found + 1] = string.format("%s:%d %s(%d)", path, number, name ~= "" and name or "function", n)
    end
  end
  return found
end

-- A comment that carries a measurement: an instruction count or a time in
-- micro- or nanoseconds.
local MEASUREMENTS = { "%d[%d,.]*k? instructions", "%d[%d.]* ?us%f[%W]", "%d[%d.]* ?ns%f[%W]", "%d ?µs",
  "callgrind" }

local function carries_measurement(comment)
  for _, pattern in ipairs(MEASUREMENTS) do
    if comment:find(pattern) then return true end
  end
  return false
end

local function measured_comment(line)
  local comment = line:match("%-%-(.*)$")
  return comment ~= nil and carries_measurement(comment)
end

-- The comments of a C source, as {line, text}: each line of each /* */
-- comment, with what it quotes ("500us", a Go duration) left out.
local function c_comments(text)
  local found = {}
  for start, comment in text:gmatch("()/%*(.-)%*/") do
    local number = select(2, text:sub(1, start):gsub("\n", "")) + 1
    for line in (comment .. "\n"):gmatch("(.-)\n") do
      found[#found + 1] = { number, (line:gsub('"[^"]*"', '""')) }
      number = number + 1
    end
  end
  return found
end

describe("the Lua layer's shape", function()
  it("has no function of more than " .. MAX_PARAMETERS .. " parameters", function()
    local long = {}
    for _, path in ipairs(lua_files()) do
      for number, line in ipairs(lines_of(path)) do
        for _, found in ipairs(long_signatures(path, number, line)) do long[#long + 1] = found end
      end
    end
    assert.same({}, long)
  end)

  it("has no comment that carries a measurement", function()
    local measured = {}
    for _, path in ipairs(lua_files()) do
      for number, line in ipairs(lines_of(path)) do
        if measured_comment(line) then measured[#measured + 1] = path .. ":" .. number .. ": " .. line end
      end
    end
    assert.same({}, measured)
  end)

  it("has no comment in the C core that carries a measurement", function()
    local measured_lines = {}
    local p = assert(io.popen("ls src/*.c src/*.h"))
    for path in p:lines() do
      local f = assert(io.open(path, "rb"))
      for _, comment in ipairs(c_comments(f:read("*a"))) do
        if carries_measurement(comment[2]) then
          measured_lines[#measured_lines + 1] = path .. ":" .. comment[1] .. ": " .. comment[2]
        end
      end
      f:close()
    end
    p:close()
    assert.same({}, measured_lines)
  end)

  it("reads signatures and comments as they are written", function()
    assert.same({ "x.lua:1 f(8)" }, long_signatures("x.lua", 1, "local function f(a, b, c, d, e, f, g, h)"))
    assert.same({}, long_signatures("x.lua", 1, "function m.g(a, b, c, d, e, f, g) -- (a, b, c, d, e, f, g, h)"))
    assert.same({}, long_signatures("x.lua", 1, "local f = function(...) end"))
    assert.is_true(measured_comment("x = 1 -- saves 130 instructions a call"))
    assert.is_true(measured_comment("-- 88.6 us CPU a step"))
    assert.is_false(measured_comment("-- waits at most 5 seconds"))
    assert.is_false(measured_comment("x = 1"))
    local comments = c_comments("int x; /* a */\n/* b\n * 120 instructions, \"500us\" */")
    assert.same({ { 1, " a " }, { 2, " b" }, { 3, ' * 120 instructions, "" ' } }, comments)
    assert.is_true(carries_measurement(comments[3][2]))
    assert.is_false(carries_measurement(c_comments('/* a duration such as "500us" */')[1][2]))
  end)
end)
