-- Which source file writes each field of struct transfer (src/transfer.h).
-- Every field has one writer, the file named by the comment that opens its
-- group in the struct ("/* response.c writes ..."); another file that
-- needs one changed calls a function of that file. `make lint` runs this:
--   lua spec/support/writers.lua [src] [--list]
-- It fails, naming file and line, when a field is written elsewhere than by
-- its group's file; --list prints the writers found for each field, and
-- the files that read each group.
--
-- A write, as this reads C: an assignment to a field (=, op=, ++, --), its
-- address taken (&t->body goes to a function that fills or frees it), an
-- array field handed to a function that fills it (snprintf(t->errbuf, ...))
-- or to libcurl as CURLOPT_ERRORBUFFER; through any pointer declared as a
-- transfer (t, next, g->held_tail ...). Not a write: what a pointer field
-- points to (the decoder's state, the easy handle's options).

local dir, list = "src", false
for _, a in ipairs(arg) do
  if a == "--list" then list = true else dir = a end
end

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Comments and literals blanked (newlines kept, so that lines still count).
local function code_only(s)
  s = s:gsub("/%*.-%*/", function(c) return (c:gsub("[^\n]", " ")) end)
  s = s:gsub("//[^\n]*", "")
  s = s:gsub('"[^"\n]*"', '""')
  s = s:gsub("'[^'\n]*'", "''")
  return s
end

-- The fields of struct transfer and the writer each group names.
local header = slurp(dir .. "/transfer.h")
local body = header:match("typedef struct transfer {(.-)\n} transfer;")
assert(body, "struct transfer not found in " .. dir .. "/transfer.h")
local owner_of, order = {}, {}
local group
local code_lines = {}
for line in (code_only(body) .. "\n"):gmatch("([^\n]*)\n") do code_lines[#code_lines + 1] = line end
local i = 0
for line in (body .. "\n"):gmatch("([^\n]*)\n") do
  i = i + 1
  local w = line:match("^%s*/%*%s*([%w_]+%.[ch]) writes")
  if w then group = w end
  local decl = code_lines[i]:gsub("%b[]", "")
  if decl:find(";") then
    for piece in decl:gsub(";.*", ""):gmatch("[^,]+") do
      local name = piece:match("([%a_][%w_]*)%s*$")
      if name then
        assert(group, "src/transfer.h: field " .. name .. " comes before any \"/* <file> writes\" group")
        owner_of[name] = group
        order[#order + 1] = name
      end
    end
  end
end

-- Every name a transfer pointer goes by (locals, parameters, fields of other
-- structs): "transfer *a, *b" and "struct transfer *c".
local files = {}
for name in io.popen('ls "' .. dir .. '"'):lines() do
  if name:match("%.[ch]$") then files[#files + 1] = name end
end
table.sort(files)
-- A file's own names, and those of the headers (fields of other structs).
local text, pointers, shared = {}, {}, {}
for _, name in ipairs(files) do
  text[name] = code_only(slurp(dir .. "/" .. name))
  -- a name the file declares as a pointer of another type is not one
  local other = {}
  for ty, p in text[name]:gmatch("([%a_][%w_]*)%s*%*+%s*([%a_][%w_]*)") do
    if ty ~= "transfer" then other[p] = true end
  end
  pointers[name] = setmetatable({}, { __index = function(_, p) return shared[p] and not other[p] end })
  local names = name:match("%.h$") and shared or pointers[name]
  for first, after in text[name]:gmatch("%f[%w_]transfer%s*%*+%s*([%a_][%w_]*)()") do
    names[first] = true
    local rest = text[name]:sub(after, after + 200)
    for p in rest:match("^[%s,%*%w_]*"):gmatch(",%s*%*+%s*([%a_][%w_]*)") do names[p] = true end
  end
end

local writers, readers, bad = {}, {}, {}
local function note(field, file, lineno, line)
  writers[field] = writers[field] or {}
  writers[field][file] = true
  if owner_of[field] ~= file then
    bad[#bad + 1] = string.format("%s/%s:%d: writes transfer field %s, which %s writes: %s", dir, file,
      lineno, field, owner_of[field], (line:gsub("^%s+", "")))
  end
end

-- Strips what comes before a field: the base expression's chain
-- (g->held_tail->, t->lines.), then tells what is left in front of it.
local function before_expr(s)
  repeat
    local n
    s, n = s:gsub("[%a_][%w_]*%s*%->%s*$", "")
    local m
    s, m = s:gsub("[%a_][%w_]*%s*%.%s*$", "")
  until n + m == 0
  return s
end

local ARRAY_FILLERS = { snprintf = true, memcpy = true, memset = true, memmove = true, strcpy = true,
  strncpy = true }

-- Whether a field with front before its expression and rest after it
-- (past any .member) is written there.
local function is_write(front, rest)
  if rest:match("^%s*=[^=]") or rest:match("^%s*[-+*/%%&|^]=") or rest:match("^%s*<<=")
    or rest:match("^%s*>>=") or rest:match("^%s*%+%+") or rest:match("^%s*%-%-")
    or front:match("%+%+%s*$") or front:match("%-%-%s*$")
    or front:match("CURLOPT_ERRORBUFFER%s*,%s*$") then
    return true
  end
  if front:match("&%s*$") and not front:match("&&%s*$") and not rest:match("^%s*%->") then return true end
  local fn = front:match("([%a_][%w_]*)%s*%(%s*$")
  return fn ~= nil and ARRAY_FILLERS[fn] == true
end

for _, file in ipairs(files) do
  local lineno = 0
  for line in (text[file] .. "\n"):gmatch("([^\n]*)\n") do
    lineno = lineno + 1
    -- subscripts out (t->errbuf[0] = ... writes errbuf), (*p)-> as p->
    local l = line
    repeat local n; l, n = l:gsub("%b[]", "") until n == 0
    l = l:gsub("%(%s*%*%s*([%a_][%w_]*)%s*%)", "%1")
    -- every "base->field", the base itself maybe after an arrow
    -- (g->held_tail->held_next): each identifier is tried as a base
    for pos, base in l:gmatch("()([%a_][%w_]*)") do
      local field, after = l:match("^%s*%->%s*([%a_][%w_]*)()", pos + #base)
      if field and pointers[file][base] and owner_of[field] then
        local rest, n = l:sub(after), 1
        while n > 0 do rest, n = rest:gsub("^%s*%.%s*[%a_][%w_]*", "") end
        if is_write(before_expr(l:sub(1, pos - 1)), rest) then
          note(field, file, lineno, line)
        else
          readers[owner_of[field]] = readers[owner_of[field]] or {}
          readers[owner_of[field]][file] = true
        end
      end
    end
  end
end

if list then
  for _, field in ipairs(order) do
    local ws = {}
    for w in pairs(writers[field] or {}) do ws[#ws + 1] = w end
    table.sort(ws)
    print(string.format("%-22s %-12s %s", field, owner_of[field], table.concat(ws, " ")))
  end
  for owner, files_reading in pairs(readers) do
    local rs = {}
    for r in pairs(files_reading) do rs[#rs + 1] = r end
    table.sort(rs)
    print(string.format("%s's fields are read by %s", owner, table.concat(rs, " ")))
  end
end
if #bad > 0 then
  io.stderr:write(table.concat(bad, "\n"), "\n")
  io.stderr:write(#bad, " write(s) of struct transfer fields outside their writer's file (src/transfer.h names it)\n")
  os.exit(1)
end
