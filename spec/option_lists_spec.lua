-- Lists of option names written out beside lua/ratewise/options.lua's
-- schema, held to it (spec/options_spec.lua holds the option tables of
-- docs/reference.md, types/ and src/transfer.h's REQUEST_FIELDS).
local options = require "ratewise.options"
local read = require("spec.support.server").read_file

describe("docs/reference.md's account of a request's identity", function()
  local text = read("docs/reference.md")
  local section = assert(text:match("\n#### A request's identity\n(.-)\n#"), "no section on a request's identity")
  local flat = section:gsub("%s+", " ")

  it("names exactly the options the schema makes part of it, and the policy apart", function()
    local listed = assert(flat:match("every option that changes what is sent or how the answer is read: (.-)%. A call"),
      "no list of the options that make a request what it is")
    local documented = {}
    -- a remark in parentheses names values, not options
    for name in listed:gsub("%b()", ""):gmatch("`([%w_]+)`") do documented[#documented + 1] = name end
    local schema = {}
    for _, part in ipairs(options.identity) do
      if part.how ~= "object" then schema[#schema + 1] = part.name end
    end
    table.sort(schema)
    table.sort(documented)
    assert.same(schema, documented)
    for _, part in ipairs(options.identity) do
      if part.how == "object" then assert.is_truthy(flat:find("`" .. part.name .. "`", 1, true), part.name) end
    end
  end)
end)
