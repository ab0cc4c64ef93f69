std = "lua54"
max_line_length = 120
-- The library runs on Lua 5.1, 5.3, 5.4 and LuaJIT: only what all of them
-- have (ratewise/compat.lua looks for the rest).
files["lua/"] = { std = "min" }
files["spec/"] = { std = "+busted" }
exclude_files = { "build/" }
-- The game spec/love_spec.lua runs in LÖVE, whose API is the `love` global.
files["spec/support/love_game/"] = { globals = { "love" } }
-- types/library holds LuaLS definitions: functions without bodies, on tables
-- that only describe a class. Their descriptions may run long.
files["types/"] = { std = "min", ignore = { "212", "241" }, max_line_length = false }
