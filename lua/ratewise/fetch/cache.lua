-- fetch.cache: every cache of fetch and rw.client, in one place, each with
-- one of two policies:
--
-- * keyed by a caller's table (an options table, a header table, a
--   limiter): weak keys (cache.weak), so that a table dropped by its owner
--   takes what was kept for it along, and nothing else ever evicts;
-- * keyed by a string (a URL, a path): bounded (cache.bounded), emptied
--   whole when it holds its limit, so that a program calling a new URL
--   each time (an id apiece) keeps at most that many and pays for one
--   emptying now and then rather than for an eviction order at every call.
--
-- No module keeps what the call before did: a cache is found by its key.
-- What each cache keeps: docs/internals.md, "The fast-path caches". A
-- value kept must be what the code would compute again from the key alone;
-- where it also depends on what a table holds (a header table's names and
-- values), the entry keeps those and is compared at every use.
local setmetatable, next = setmetatable, next

local cache = {}

local WEAK_KEYS = { __mode = "k" }

--- t = cache.weak(): a table whose keys (callers' tables) do not keep them alive.
function cache.weak()
  return setmetatable({}, WEAK_KEYS)
end

-- The number of entries and the limit of each bounded table (weak: a
-- bounded table made for an rw.client goes with the client).
local held, limit_of = cache.weak(), cache.weak()

--- t = cache.bounded(limit): a table read with t[key] and written with
-- cache.keep, emptied when it holds `limit` entries.
function cache.bounded(limit)
  local t = {}
  held[t], limit_of[t] = 0, limit
  return t
end

--- cache.keep(t, key, value): t[key] = value in a bounded table, emptied
-- first when it is full (in place: whoever holds t holds it still).
function cache.keep(t, key, value)
  local n = held[t]
  if n >= limit_of[t] then
    for k in next, t do t[k] = nil end
    n = 0
  end
  t[key] = value
  held[t] = n + 1
end

-- How many URLs are kept, and the longest URL kept (a query carrying a
-- payload is not worth keeping).
local URLS_KEPT = 256
cache.URL_KEPT_MAX = 512

-- What is printed of each URL without credentials and its origin, by URL
-- (plan.url_facts): { shown, origin } by URL.
cache.url_facts = cache.bounded(URLS_KEPT)

-- Options tables fetch.check has passed, by table: true, taken by the
-- fetch that follows, or "kept", for every fetch with a table its owner
-- never changes (plan.check).
cache.checked = cache.weak()

-- The header lines made from a caller's header table, by table (plan.lua:
-- made_lines, keep_lines), for calls without and with a JSON body.
cache.lines_made = cache.weak()
cache.lines_made_json = cache.weak()

-- A limiter's optional methods, looked up once (plan.limiter_methods).
cache.limiter_methods = cache.weak()

-- How many paths' calls an rw.client keeps for each method (client.lua,
-- Client:_keep_plain).
cache.PLAIN_PATHS_KEPT = 256

return cache
