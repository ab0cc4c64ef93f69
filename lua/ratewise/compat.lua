-- What differs between the Luas ratewise runs on (5.1, LuaJIT 2.1, 5.3 and
-- 5.4), in one place; every other module is written once for all of them.
local create, resume, yield, status, running = coroutine.create, coroutine.resume, coroutine.yield,
  coroutine.status, coroutine.running
local pcall, select = pcall, select

local compat = {}

-- table.pack, coroutine.isyieldable and coroutine.close are looked for,
-- not assumed; unpack is Lua 5.1's global.
-- luacheck: push ignore 143
compat.unpack = table.unpack or unpack -- luacheck: ignore 113
compat.pack = table.pack or function(...) return { n = select("#", ...), ... } end
local isyieldable = coroutine.isyieldable

--- compat.close_coroutine(co) | nil: Lua 5.4's coroutine.close, which
-- closes a dead coroutine's to-be-closed variables.
compat.close_coroutine = coroutine.close
--- compat.math_type(x), compat.tointeger(x) | nil: Lua 5.3's integer
-- functions, nil where numbers are all floats (5.1, LuaJIT).
compat.math_type, compat.tointeger = math.type, math.tointeger

--- guard = compat.on_collect(fn): an object whose collection calls fn():
-- a table's __gc from Lua 5.2 on; on 5.1 and LuaJIT, where tables have
-- none, a userdata of newproxy.
local newproxy = rawget(_G, "newproxy")
function compat.on_collect(fn)
  if newproxy then
    local guard = newproxy(true)
    getmetatable(guard).__gc = function() fn() end
    return guard
  end
  return setmetatable({}, { __gc = function() fn() end })
end
-- luacheck: pop

-- Whether a coroutine may yield from inside pcall: Lua 5.2 and later, and
-- LuaJIT, yes; PUC Lua 5.1 raises "attempt to yield across
-- metamethod/C-call boundary". Told by the version, not by trying: inside
-- OpenResty, resuming a coroutine while require runs would itself yield
-- across require.
local yields_through_pcall = _VERSION ~= "Lua 5.1" or rawget(_G, "jit") ~= nil

-- helper coroutine -> the coroutine it runs a protected call for (5.1 only).
-- Weak both ways: 5.1 has no ephemerons, so a weak key whose value (the
-- coroutine, whose stack holds the helper) is strong would never go, and a
-- dropped coroutine waiting in a protected call would live for ever.
local runs_for = setmetatable({}, { __mode = "kv" })

--- co = compat.running(): the running coroutine, nil in the main thread
-- (whatever the Lua), seen through the coroutines that compat.pcall runs
-- functions in: the task's own coroutine, which the scheduler knows.
--- co = compat.coroutine_of_task(): for telling whether the code running
-- now is a given task's (co == task.co): coroutine.running itself where
-- compat.pcall is the built-in pcall (a comparison needs no nil for the
-- main thread), compat.running on Lua 5.1.
if yields_through_pcall then
  compat.coroutine_of_task = running
  function compat.running()
    local co, main = running()
    if main then return nil end
    return co
  end
else
  function compat.running()
    local co = running()
    while co and runs_for[co] do co = runs_for[co] end
    return co
  end
  compat.coroutine_of_task = compat.running
end

-- Passes the helper's yields on to the caller's coroutine, and what
-- resumes that back to the helper, until the helper returns or raises.
local function relay(helper, ok, ...)
  if not ok then return false, ... end
  if status(helper) == "dead" then return true, ... end
  return relay(helper, resume(helper, yield(...)))
end

--- ok, ... = compat.pcall(fn, ...): pcall that the running coroutine may
-- yield through, so that a wait inside a protected call (a limiter, a host
-- sleep, a callback) stays a wait of its task. On Lua 5.1 fn runs in a
-- coroutine of its own whose yields are relayed: written here rather than
-- taken from lua-coxpcall, which sets globals, because the scheduler must
-- see through those coroutines (compat.running).
if yields_through_pcall then
  compat.pcall = pcall
else
  function compat.pcall(fn, ...)
    local me = running()
    if not me then return pcall(fn, ...) end -- the main thread never yields
    local helper = create(function(...) return fn(...) end)
    runs_for[helper] = me
    return relay(helper, resume(helper, ...))
  end
end

--- yes = compat.isyieldable(): whether the running code may yield (Lua 5.1
-- has no coroutine.isyieldable: there any coroutine may).
compat.isyieldable = isyieldable or function()
  return compat.running() ~= nil
end

return compat
