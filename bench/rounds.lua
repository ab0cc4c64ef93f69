-- bench/rounds.lua: two contenders of one shape in alternating rounds, and
-- the table of every shape's ratio against its target. Used by run.lua.
--
-- A shape is a table:
--   name     what the row says (the workload on each side)
--   n        requests per round and contender; warmup: warm-up requests
--   rounds   how many rounds (the ratio is their median, so at least 5)
--   target   the ratio ratewise / plain the shape must reach (nil: none,
--            for a row that only measures, such as the engine's floor)
--   plain    function(n) -> measure of the plain C contender
--   ours     function(n) -> measure of ratewise
--   names    (optional) { ours = ..., plain = ... }: what the rounds call
--            the two contenders (default "ratewise" and "plain"), for a
--            pair that is not ratewise against plain libcurl
-- A measure is { rate = requests/s, failed = count, cpu_us = CPU per
-- request or nil, faults = minor page faults per request or nil }.
--
-- Within a round the two runs are back to back and which goes first
-- alternates, so the machine's drift hits both alike; the median of the
-- per-round ratios shrugs off a bad round better than the ratio of the
-- median rates. Beside it, the ratio of each contender's fastest round
-- ("best"): the machine's other tenants only ever slow a run down, so on a
-- busy host the best rounds are the nearest to what a quiet one measures
-- (timeit's reason for its minimum). The target is judged on the median.
-- Portable to Lua 5.1 and LuaJIT (`make bench LUA=luajit`).
local rounds = {}

local format = string.format

-- "target 0.90: NOT met" (short: "0.90 NOT met"), or that the row has none.
local function verdict(row, short)
  local target = row.shape.target
  if not target then return short and "none" or "no target" end
  return format(short and "%.2f %s" or "target %.2f: %s", target, row.met and "target met" or "NOT met")
end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n == 0 then return 0 / 0 end
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end
rounds.median = median

-- "12.3 us" or "-" when a contender did not measure it.
local function opt(v, fmt)
  if v == nil or v ~= v then return "-" end
  return format(fmt, v)
end

-- 10000 -> "10,000"
local function thousands(n)
  local s = format("%.0f", n)
  repeat
    local k
    s, k = s:gsub("^(%d+)(%d%d%d)", "%1,%2")
  until k == 0
  return s
end
rounds.thousands = thousands

-- Runs one shape, prints its rounds and its row; returns the row:
-- { shape, plain, ours (median rates), ratio (median of the rounds' ratios),
--   low, high (their range), best (best rate / best rate), met, plain_cpu,
--   our_cpu, our_faults (medians),
--   plain_failed, our_failed, requests (per contender, warm-up included) }.
-- `collect` (a function or nil) runs before each of ratewise's runs, outside
-- its time: a full collection, so that no round pays for the garbage of the
-- one before (the plain contender starts a fresh process each run).
function rounds.compare(shape, collect)
  io.write(format("%s: %d requests x %d rounds\n", shape.name, shape.n, shape.rounds))
  io.flush()
  local names = shape.names or {}
  local plain_name, our_name = names.plain or "plain", names.ours or "ratewise"
  local row = { shape = shape, plain_failed = 0, our_failed = 0,
    requests = shape.n * shape.rounds + shape.warmup }
  local function plain(n)
    local m = shape.plain(n)
    row.plain_failed = row.plain_failed + (m.failed or 0)
    return m
  end
  local function ours(n)
    if collect then collect() end
    local m = shape.ours(n)
    row.our_failed = row.our_failed + (m.failed or 0)
    return m
  end
  -- Warm-up: connections, caches, the CPU's frequency; the rates are not kept.
  if shape.warmup > 0 then
    plain(shape.warmup)
    ours(shape.warmup)
  end
  local p_rates, o_rates, ratios, p_cpus, o_cpus, o_faults = {}, {}, {}, {}, {}, {}
  for r = 1, shape.rounds do
    local p, o
    if r % 2 == 1 then
      p = plain(shape.n)
      o = ours(shape.n)
    else
      o = ours(shape.n)
      p = plain(shape.n)
    end
    p_rates[r], o_rates[r], ratios[r] = p.rate, o.rate, o.rate / p.rate
    p_cpus[#p_cpus + 1] = p.cpu_us
    o_cpus[#o_cpus + 1] = o.cpu_us
    o_faults[#o_faults + 1] = o.faults
    io.write(format("  round %d: %s %7.0f req/s, %s us CPU/req | %s %7.0f req/s, %s us CPU/req, "
      .. "%s page faults/req | ratio %.3f\n", r, plain_name, p.rate, opt(p.cpu_us, "%5.1f"), our_name, o.rate,
      opt(o.cpu_us, "%5.1f"), opt(o.faults, "%.2f"), ratios[r]))
    io.flush()
  end
  local low, high, p_best, o_best = math.huge, -math.huge, 0, 0
  for r, v in ipairs(ratios) do
    if v < low then low = v end
    if v > high then high = v end
    if p_rates[r] > p_best then p_best = p_rates[r] end
    if o_rates[r] > o_best then o_best = o_rates[r] end
  end
  row.best = o_best / p_best
  row.plain, row.ours, row.ratio, row.low, row.high = median(p_rates), median(o_rates), median(ratios), low, high
  row.plain_cpu = #p_cpus > 0 and median(p_cpus) or nil
  row.our_cpu = #o_cpus > 0 and median(o_cpus) or nil
  row.our_faults = #o_faults > 0 and median(o_faults) or nil
  row.met = shape.target and row.ratio >= shape.target
  io.write(format("  => ratio %.2f (rounds %.2f - %.2f), %s; best rounds %.0f / %.0f req/s, ratio %.2f\n",
    row.ratio, low, high, verdict(row), o_best, p_best, row.best))
  if row.plain_failed > 0 or row.our_failed > 0 then
    io.write(format("  => failures: %s %d, %s %d of %d each\n", plain_name, row.plain_failed, our_name,
      row.our_failed, row.requests))
  end
  io.flush()
  return row
end

-- The table of every row, one line each; names: the rows' shape.names.
function rounds.report(rows, names)
  names = names or {}
  io.write(format("  %-48s %8s %8s  %-18s  %-4s  %s\n", "shape (req/s, then CPU)", names.ours or "ratewise",
    names.plain or "plain", "ratio (rounds)", "best", "target"))
  for _, row in ipairs(rows) do
    io.write(format("  %-48s %8s %8s  %.2f (%.2f - %.2f)  %.2f  %s\n", row.shape.name, thousands(row.ours),
      thousands(row.plain), row.ratio, row.low, row.high, row.best, verdict(row, true)))
    io.write(format("  %-48s %8s %8s  us CPU/req%s\n", "", opt(row.our_cpu, "%.1f"), opt(row.plain_cpu, "%.1f"),
      row.our_faults and format("; ratewise %.2f page faults/req", row.our_faults) or ""))
  end
  io.flush()
end

return rounds
