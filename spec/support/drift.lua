-- Bounds for a value that moves with the clock (a bucket's tokens refill,
-- a wait shrinks) while a test reads it: a machine busy with other work
-- may deschedule the test for milliseconds between two calls, and an
-- exact `near` then fails for no fault of the code.
local rw = require "ratewise"

local drift = {}

--- drift.near(value, expected, per_second, since, what [, tolerance]):
-- asserts that value is `expected` as of `since` (rw.now()), give or take
-- tolerance (0.01), moved by at most per_second for each second since
-- (tokens refilling: the rate; a wait shrinking: -1).
function drift.near(value, expected, per_second, since, what, tolerance)
  tolerance = tolerance or 0.01
  local moved = per_second * (rw.now() - since)
  local low, high = expected + math.min(0, moved) - tolerance, expected + math.max(0, moved) + tolerance
  assert(value >= low and value <= high,
    string.format("%s: %.4f, expected %.4f - %.4f", what, value, low, high))
end

return drift
