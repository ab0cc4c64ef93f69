-- GCRA (the generic cell rate algorithm), the shared buckets' arithmetic:
-- one number per bucket, the time at which it would be full again (its
-- "theoretical arrival time", tat), as redis-cell and throttled keep it.
-- The same source runs in Redis (inside redis_bucket.lua's script, on
-- Redis's Lua 5.1) and in nginx workers (shared_bucket.lua), so it is kept
-- as text: one implementation for both.
local gcra = {}

-- step(op, tat, now, interval, capacity, n, arg, arg2) -> new_tat | nil,
-- wait, granted (1 | 0), tokens (in millionths). Times in microseconds.
-- op "peek": the wait for n, taking nothing; "take": n now or nothing;
-- "reserve": n, with a wait of at most arg (-1: any), or nothing; "refund":
-- n back; "sync": at most arg millionths of a token left, and with less
-- than one, the next arg2 microseconds from now. new_tat nil: unchanged.
gcra.SOURCE = [[
local function gcra_step(op, tat, now, interval, capacity, n, arg, arg2)
  if tat < now then tat = now end
  local burst = capacity * interval
  local function tokens(v) return math.floor((burst - (v - now)) * 1000000 / interval) end
  if op == 'peek' then
    local wait = tat + n * interval - burst - now
    return nil, wait > 0 and math.ceil(wait) or 0, 0, tokens(tat)
  elseif op == 'take' or op == 'reserve' then
    local new = tat + n * interval
    local wait = new - burst - now
    if wait < 0 then wait = 0 end
    if (op == 'take' and wait > 0) or (op == 'reserve' and arg >= 0 and wait > arg) then
      return nil, math.ceil(wait), 0, tokens(tat)
    end
    return new, math.ceil(wait), 1, tokens(new)
  elseif op == 'refund' then
    local new = tat - n * interval
    if new < now then new = now end
    return new, 0, 1, tokens(new)
  elseif op == 'sync' then
    local least
    if arg >= 1000000 then
      least = now + (capacity - arg / 1000000) * interval
    else
      least = now + (capacity - 1) * interval + arg2
    end
    if least > tat then return least, 0, 1, tokens(least) end
    return nil, 0, 1, tokens(tat)
  end
  return nil, nil, nil, nil
end
]]

-- loadstring: Lua 5.1's load takes no string
local load_chunk = rawget(_G, "loadstring") or load
gcra.step = assert(load_chunk(gcra.SOURCE .. "\nreturn gcra_step", "=gcra"))()

return gcra
