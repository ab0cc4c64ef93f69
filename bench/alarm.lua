-- The alarm of `make bench-instructions`: each shape's ratio (plain
-- libcurl's instructions a request over ratewise's) as it read when issue
-- 38 retired the instruction targets (main 766142a, 2026-12-05, one run
-- each; bench/README.md "Current figures" and HISTORY.md). A shape rings
-- when ratewise costs more than ALLOWED above that, against the same
-- plain contender in the same mode: a ratio below baseline / ALLOWED.
-- The 0 ms counts move between runs where the 5 ms ones do not
-- (bench/README.md), so compare in the 5 ms mode (BENCH_INSTR_LATENCY_MS=5)
-- before believing an alarm.
-- This is an alarm, not a goal: a change that rings needs a reason in its
-- commit message, not a special path.
local alarm = {}

alarm.ALLOWED = 1.05
alarm.COMMIT = "766142a"

-- baseline[interpreter][latency ms][shape key] = ratio. "puc" is Lua 5.4's
-- run; the OpenResty rows are LuaJIT's in both, whichever Lua runs the script.
local OPENRESTY_0 = { openresty_sequential = 0.97, openresty_loop64 = 0.95, openresty_map_shared = 0.96,
  openresty_map_fresh = 0.90, openresty_body_64k = 1.29 }
local OPENRESTY_5 = { openresty_sequential = 0.82, openresty_loop64 = 0.88, openresty_map_shared = 0.92,
  openresty_map_fresh = 0.92, openresty_body_64k = 1.29 }

local function with(t, extra)
  for k, v in pairs(extra) do t[k] = v end
  return t
end

alarm.baseline = {
  puc = {
    [0] = with({ sequential = 0.86, loop64 = 0.84, map_shared = 0.92, map_fresh = 0.79, map_inherit = 0.77,
      headers = 0.82, client = 0.78, client_paths = 0.74, post_json = 0.76, body_64k = 0.89, body_1m = 0.95,
      floor = 0.97, floor_tasks = 0.99, floor_scheduler = 0.91 }, OPENRESTY_0),
    [5] = with({ sequential = 0.85, loop64 = 0.86, map_shared = 0.88, map_fresh = 0.82, map_inherit = 0.77,
      headers = 0.84, client = 0.79, client_paths = 0.75, post_json = 0.77, body_64k = 0.89, body_1m = 0.89,
      floor = 1.00, floor_tasks = 1.01, floor_scheduler = 0.93 }, OPENRESTY_5),
  },
  luajit = {
    [0] = with({ sequential = 0.99, loop64 = 0.98, map_shared = 1.08, map_fresh = 0.98, map_inherit = 1.05,
      headers = 1.02, client = 0.94, client_paths = 1.05, post_json = 0.90, body_64k = 1.35, body_1m = 1.69,
      floor = 0.97, floor_tasks = 1.06, floor_scheduler = 1.00 }, OPENRESTY_0),
    [5] = with({ sequential = 0.99, loop64 = 1.00, map_shared = 1.01, map_fresh = 1.00, map_inherit = 0.99,
      headers = 1.00, client = 0.99, client_paths = 0.98, post_json = 0.91, body_64k = 1.35, body_1m = 1.69,
      floor = 1.03, floor_tasks = 1.04, floor_scheduler = 1.02 }, OPENRESTY_5),
  },
}

--- words = alarm.verdict(key, ratio, luajit, latency_ms): "ok (baseline
-- 0.85)", "ALARM: ... below" when ratewise's share fell by more than
-- ALLOWED, or "no baseline" for a shape or mode it was not taken in.
function alarm.verdict(key, ratio, luajit, latency_ms)
  local by_mode = alarm.baseline[luajit and "luajit" or "puc"][latency_ms]
  local base = by_mode and by_mode[key]
  if not base then return "no baseline" end
  local change = (base / ratio - 1) * 100 -- ratewise's instructions against plain's, in per cent
  if ratio * alarm.ALLOWED < base then
    return string.format("ALARM: %+.1f %% against %s (%.2f)", change, alarm.COMMIT, base)
  end
  return string.format("ok: %+.1f %% against %s (%.2f)", change, alarm.COMMIT, base)
end

return alarm
