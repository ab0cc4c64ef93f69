-- The ratewise command (bin/ratewise) run as a user runs it, for the
-- specs of the command: its output to files, read back.
local subprocess = require "spec.support.subprocess"
local cjson = require "cjson"

local cli = {}

function cli.quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function cli.slurp(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  os.remove(path)
  return text
end

-- The ratewise command line as a shell command (under timeout: a hang
-- fails one spec; timeout's SIGTERM is one the command handles, so a KILL
-- follows it).
function cli.command(args)
  return subprocess.env .. "timeout -k 10 30 " .. subprocess.lua .. " bin/ratewise " .. args
end

-- out, err, code: stdout and stderr apart
function cli.ratewise(args, opts)
  opts = opts or {}
  local out_file, err_file = os.tmpname(), os.tmpname()
  local _, code = subprocess.shell((opts.stdin and ("printf %s " .. cli.quote(opts.stdin) .. " | ") or opts.shell or "")
    .. cli.command(args) .. " >" .. out_file .. " 2>" .. err_file)
  return cli.slurp(out_file), cli.slurp(err_file), code
end

function cli.write_file(text)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

function cli.json_lines(text)
  local rows = {}
  for line in text:gmatch("[^\n]+") do rows[#rows + 1] = cjson.decode(line) end
  table.sort(rows, function(a, b) return a.line < b.line end)
  return rows
end

return cli
