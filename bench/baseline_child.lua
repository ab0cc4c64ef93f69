-- bench/baseline_child.lua SHAPE URL N [CONC]: one run of a shape of
-- bench/shapes.lua with whichever ratewise LUA_PATH and LUA_CPATH find
-- first, for bench/baseline.lua (which runs this tree's and an earlier
-- revision's in turn). Prints "rate failed cpu_us".
local shapes = require "bench.shapes"

local shape, url, n, conc = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4] or "64")
assert(shapes[shape] and url and n, "usage: baseline_child.lua sequential|loop URL N [CONC]")
local m = shapes[shape](url, n, conc)
io.write(string.format("%.1f %d %.3f\n", m.rate, m.failed, m.cpu_us or 0 / 0))
