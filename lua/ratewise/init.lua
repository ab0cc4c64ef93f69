--- ratewise: calls to rate-limited web APIs that wait the way the server asks.
-- The C core (ratewise.core) parses, classifies, counts tokens and runs
-- transfers; the Lua modules here wire that into the public API.
local core = require "ratewise.core"
local bucket = require "ratewise.bucket"
local fetch = require "ratewise.fetch"
local retry = require "ratewise.retry"

local ratewise = {
  _VERSION = core.version,
  --- "success" | "retryable" | "terminal" = rw.classify(status)
  classify = core.classify,
  --- epoch_seconds | nil = rw.parse_http_date(s [, now])
  parse_http_date = core.parse_http_date,
  --- seconds | nil = rw.parse_retry_after(value [, now])
  parse_retry_after = core.parse_retry_after,
  --- seconds = rw.backoff(attempt [, opts])
  backoff = retry.backoff,
  --- seconds, source = rw.retry_delay(headers, attempt [, opts])
  retry_delay = retry.delay,
  --- bucket = rw.bucket{capacity = C, rate = R}
  bucket = bucket.new,
  --- res | nil, err = rw.fetch(url [, opts])
  fetch = fetch.fetch,
  --- seconds on the monotonic clock
  now = core.now,
}

return ratewise
