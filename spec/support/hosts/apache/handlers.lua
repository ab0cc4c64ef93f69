-- mod_lua handlers (run by spec/host_apache_spec.lua): plain handler code,
-- with nothing but ratewise and the scenario; each waiting call holds its
-- worker thread, as any blocking call of a handler does.
-- luacheck: globals run ping fetch limited apache2
local scenario = require "scenario"

-- /run?base=URL&results=FILE: the scenario, in this request's worker thread
function run(r)
  local args = r:parseargs()
  scenario.run { base = args.base, results = args.results }
  r.content_type = "text/plain"
  r:puts("ran\n")
  return apache2.OK
end

-- /ping: another request of the same server, answered at once
function ping(r)
  r.content_type = "text/plain"
  r:puts("pong\n")
  return apache2.OK
end

-- /fetch?url=URL: one call, the status answered (what LuaScope costs)
function fetch(r)
  local rw = require "ratewise"
  local res, err = rw.fetch(r:parseargs().url)
  r.content_type = "text/plain"
  r:puts(res and tostring(res.status) or tostring(err and err.message), "\n")
  return apache2.OK
end

-- The limiters of this Lua state, made at its first /limited request and
-- kept, as an application keeps its limiters at the top of a module.
local limiters = {}

-- /limited?url=URL[&redis=URL&key=NAME]: one call under a limit of two a
-- second with no burst: this Lua state's own rw.bucket, or with redis an
-- rw.redis_bucket that every state naming the key shares
function limited(r)
  local rw = require "ratewise"
  local args = r:parseargs()
  local which = args.redis and ("redis " .. args.key) or "local"
  local limiter = limiters[which]
  if not limiter then
    limiter = args.redis and rw.redis_bucket { redis = args.redis, key = args.key, capacity = 1, rate = 2 }
      or rw.bucket { capacity = 1, rate = 2 }
    limiters[which] = limiter
  end
  local res, err = rw.fetch(args.url, { limiter = limiter })
  r.content_type = "text/plain"
  r:puts(res and tostring(res.status) or tostring(err and err.message), "\n")
  return apache2.OK
end
