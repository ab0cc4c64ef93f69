-- The installed `ratewise` command runs from any folder with nothing but
-- its install: no `luarocks path` eval'ed, no LUA_PATH or LUA_CPATH. Each
-- install goes into a temporary tree, made from a copy of this checkout
-- (luarocks leaves its objects in the folder it builds in).
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- The interpreter the suite runs under, as the Makefile's LUA names it.
local lua_name = (subprocess.lua:match("(%S+)%s*$") or "lua5.4"):match("[^/]*$")

-- What a user's shell has: none of the suite's search paths.
local CLEAN_ENV = "env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_1 -u LUA_CPATH_5_1 -u LUA_PATH_5_3 -u LUA_CPATH_5_3 "
  .. "-u LUA_PATH_5_4 -u LUA_CPATH_5_4 "

local function mktemp_dir()
  local out = assert(io.popen("mktemp -d")):read("*l")
  assert(out and out:find("^/"), "mktemp -d")
  return out
end

describe("the installed ratewise command", function()
  local s, tmp

  setup(function()
    s = server.start()
    tmp = mktemp_dir()
  end)
  teardown(function()
    s:stop()
    if tmp then os.execute("rm -rf " .. quote(tmp)) end
  end)

  -- `ratewise args` run from / by the command at bin
  local function run_from_root(bin, args)
    return subprocess.shell("cd / && " .. CLEAN_ENV .. "timeout 30 " .. quote(bin) .. " " .. args)
  end

  local function check_command(bin)
    local out, code = run_from_root(bin, "--version")
    assert.equal(0, code, out)
    assert.matches("^ratewise %d+%.%d+%.%d+\n$", out)
    s:reset()
    s:script("/installed", { { status = 429, headers = { ["Retry-After"] = "0" } }, { status = 200, body = "here" } })
    out, code = run_from_root(bin, "get -s " .. quote(s:url("/installed")))
    assert.equal(0, code, out)
    assert.equal("here", out)
    assert.equal(2, #s:log("/installed"))
  end

  it("runs after make install TREE=DIR (luarocks --tree), from another folder", function()
    local copy, tree = tmp .. "/src", tmp .. "/tree"
    local out, code = subprocess.shell("mkdir -p " .. quote(copy) .. " && tar cf - Makefile bin lua src rockspec docs "
      .. "types | (cd " .. quote(copy) .. " && tar xf -) && " .. CLEAN_ENV .. "make -s -C " .. quote(copy)
      .. " install LUA=" .. lua_name .. " TREE=" .. quote(tree))
    assert.equal(0, code, out)
    check_command(tree .. "/bin/ratewise")
  end)

  it("runs after make install PREFIX=DIR, from another folder", function()
    local prefix = tmp .. "/prefix"
    -- (the Makefile's own build for that Lua, not the suite's, which may be
    -- an ASan build that a plain interpreter cannot load)
    local out, code = subprocess.shell(CLEAN_ENV .. "make -s install LUA=" .. lua_name .. " PREFIX=" .. quote(prefix))
    assert.equal(0, code, out)
    check_command(prefix .. "/bin/ratewise")
  end)
end)
