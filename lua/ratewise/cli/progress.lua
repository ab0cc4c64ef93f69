-- batch's progress bar (on a terminal) and its summary line (always).
local rw = require "ratewise"
local core = require "ratewise.core"

local format, concat, rep, sub = string.format, table.concat, string.rep, string.sub
local floor, max, min = math.floor, math.max, math.min

local progress = {}

--- columns = progress.width(fd): the terminal's width now (it may have been
-- resized since the last draw), else $COLUMNS, else 80.
function progress.width(fd)
  local columns = core.terminal_width(fd)
  if columns then return columns end
  local env = tonumber(os.getenv("COLUMNS"))
  if env and env >= 1 and env % 1 == 0 then return env end
  return 80
end

local function duration(seconds)
  if seconds >= 3600 then return format("%dh%02dm", floor(seconds / 3600), floor(seconds % 3600 / 60)) end
  if seconds >= 60 then return format("%dm%02ds", floor(seconds / 60), floor(seconds % 60)) end
  return format("%.0fs", seconds)
end

-- A count in at most 6 columns: 812, 45.3k, 1.2M.
local function short_count(n)
  if n < 999.5 then return format("%d", floor(n + 0.5)) end
  if n < 999.5e3 then return format("%.1fk", n / 1e3) end
  return format("%.1fM", n / 1e6)
end

-- The limits' names in the bar and the summary, in their order.
local TOKEN_LIMITS = { { "tokens", "tokens" }, { "input_tokens", "in" }, { "output_tokens", "out" } }

--- " tokens 45.3k/min" (OpenAI), " in 45.3k/min out 8.1k/min"
-- (Anthropic): the tokens the limiter took a minute so far, net of the
-- provider's corrections (st.tokens, by limit; nil without named limits),
-- each figure padded to one width, so that the bar keeps its own.
function progress.tokens(st, per_minute)
  if not st.tokens then return "" end
  local parts = {}
  for _, limit in ipairs(TOKEN_LIMITS) do
    local taken = st.tokens[limit[1]]
    if taken then
      taken = max(taken, 0)
      parts[#parts + 1] = per_minute and format(" %s %6s/min", limit[2], short_count(taken * per_minute))
        or format(" %s %s", limit[2], short_count(taken))
    end
  end
  return concat(parts)
end

--- The progress bar's line, at most width - 1 columns (a line as wide as
-- the terminal wraps on some): done/total (total "?" until the input has
-- ended), rate, tokens a minute (with --tpm, --itpm and --otpm), ETA,
-- retries and throttled answers so far, and the longest wait under way.
-- st.total is nil while the input is still being read; done and total
-- count the requests sent or answered, not the lines a stop left unsent
-- nor those --resume skipped.
function progress.line(st, width)
  local elapsed = max(rw.now() - st.started, 1e-9)
  local rate = st.done / elapsed
  local total = st.total
  local eta = total and rate > 0 and (total - st.done) / rate or nil
  local tokens = progress.tokens(st, 60 / elapsed)
  local info = format(" %d/%s %s %.1f/s%s ETA %s retries %d throttled %d", st.done, total or "?",
    total and format("%3d%%", total > 0 and floor(st.done * 100 / total) or 100) or "  ?%", rate, tokens,
    eta and duration(eta) or "?", st.retries, st.throttled)
  local wait = 0
  local now = rw.now()
  for _, until_t in pairs(st.waits) do wait = max(wait, until_t - now) end
  if wait > 0 then info = info .. format(" waiting %.1fs", wait) end
  -- the bar keeps one width all run long, whatever the figures' lengths,
  -- and is left out on a terminal too narrow for it
  local bar = min(30, width - 61 - #tokens)
  if bar < 10 then return sub(info, 2, width - 1) end
  local filled = total and (total > 0 and floor(bar * st.done / total) or bar) or 0
  return sub("[" .. rep("#", filled) .. rep(".", bar - filled) .. "]" .. info, 1, width - 1)
end

--- The summary line: the requests sent or answered (a line that is not a
-- request among them, answered with its error), then the lines never sent
-- and those --resume skipped, when there are any. Throttled: the answers
-- that refused for rate (a 429, a 503 with Retry-After, a provider's
-- spent quota such as GitHub's 403).
function progress.summary(st)
  local elapsed = rw.now() - st.started
  local kinds = {}
  for kind, count in pairs(st.errors) do kinds[#kinds + 1] = format("%s %d", kind, count) end
  table.sort(kinds)
  local line = format("%d request%s in %.1f s (%.1f/s): %d ok, %d failed%s; %d retr%s, %d throttled",
    st.done, st.done == 1 and "" or "s", elapsed, st.done / max(elapsed, 1e-9), st.ok, st.failed,
    #kinds > 0 and " (" .. concat(kinds, ", ") .. ")" or "", st.retries, st.retries == 1 and "y" or "ies",
    st.throttled)
  if st.not_sent > 0 then line = line .. format("; %d not sent", st.not_sent) end
  if st.skipped > 0 then line = line .. format("; %d skipped (answered before)", st.skipped) end
  if st.tokens and next(st.tokens) then
    local per_minute = progress.tokens(st, 60 / max(elapsed, 1e-9)):gsub("/min", ""):gsub(" +", " ")
    line = line .. format(";%s tokens taken (%s a minute)", progress.tokens(st), per_minute:sub(2))
  end
  return line
end

return progress
