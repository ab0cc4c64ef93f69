-- How the C core is laid out (issue 38, section 5), read from its sources:
-- each function takes its name from the file that defines it, and
-- request.c sets libcurl's options only after the request table is read.
local function slurp(path)
  local f = assert(io.open(path, "rb"))
  return (f:read("*a")), f:close()
end

-- Comments and string literals blanked, every offset kept.
local function code_only(text)
  local function blank(c) return (c:gsub("[^\n]", " ")) end
  return (text:gsub("/%*.-%*/", blank):gsub('"[^"\n]*"', blank))
end

-- The plain C libraries (no Lua: the fuzz targets build them alone) have
-- prefixes of their own: rwp_ the parsers, rwd_ the decoders.
local LIBRARY_PREFIX = { parse = "rwp_", sse = "rwp_sse_", decode = "rwd_" }

local function sources()
  local p = assert(io.popen("ls src/*.c"))
  local files = {}
  for name in p:lines() do files[#files + 1] = name end
  p:close()
  return files
end

describe("the C core's layout", function()
  it("names each function after the file that defines it", function()
    local wrong = {}
    for _, path in ipairs(sources()) do
      local base = path:match("src/([%w_]+)%.c$")
      local code = code_only(slurp(path))
      -- a definition: at the start of a line, a type, the name, its
      -- parameters, and the body's brace (on that line or the next)
      for line, name in code:gmatch("\n(([%a_][^\n;=]-)%([^;{]-%)%s*{)") do
        local fn = name:match("([%a_][%w_]*)%s*$")
        local own = fn == "luaopen_ratewise_core" or fn:sub(1, #base + 1) == base .. "_"
          or fn:sub(1, #base + 4) == "rw_" .. base .. "_"
          or (LIBRARY_PREFIX[base] and fn:sub(1, #LIBRARY_PREFIX[base]) == LIBRARY_PREFIX[base])
        if not own then wrong[#wrong + 1] = path .. ": " .. fn .. " (" .. line:match("^[^(]*") .. ")" end
      end
    end
    assert.same({}, wrong)
  end)

  it("sets libcurl's options in request.c with no Lua call, after reading the request", function()
    local text = slurp("src/request.c")
    local code = code_only(text)
    local from = assert(text:find("---- Setting libcurl's options", 1, true), "the marker of the setting half")
    local to = assert(code:find("\nvoid rw_request_configure%("), "rw_request_configure")
    local setting = code:sub(from, to)
    assert.is_nil(setting:match("luaL?_[%w_]+%s*%("), "a Lua call where options are set")
    local reading = code:sub(1, from)
    assert.is_nil(reading:match("curl_easy_setopt"), "an option set while the request is read")
    assert.truthy(setting:find("curl_easy_setopt", 1, true))
  end)
end)
