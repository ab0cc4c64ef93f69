-- What `ratewise batch --timeline FILE.svg` draws: over the run, the
-- requests and the tokens taken a minute against each limit given (--rpm,
-- --tpm, --itpm, --otpm, --rate), every 429 and every wait (a retry's, and
-- a request's wait for its limit), so that a user sees at a glance which
-- limit bound and when. Written here as plain SVG text: a chart of a few
-- lines and marks needs no plotting library, and the command must run
-- where none is installed.
local format, concat, sort, floor, max, min = string.format, table.concat, table.sort, math.floor, math.max, math.min
local setmetatable, ipairs, tostring, type = setmetatable, ipairs, tostring, type

local timeline = {}

-- A rate is what was taken over the last WINDOW seconds, times 60 / WINDOW:
-- a minute's limit read over a span short enough to show a burst, as the
-- providers themselves enforce a minute over shorter intervals.
timeline.WINDOW = 10

-- The picture's layout, in SVG units.
local WIDTH, LEFT, RIGHT, TOP = 960, 84, 24, 48
local PANEL, GAP, LANE, ROW, MAX_ROWS, MAX_BARS = 150, 44, 26, 5, 24, 2000
local PLOT = WIDTH - LEFT - RIGHT
local COLOURS = { rate = "#1f6fb5", limit = "#c0392b", throttle = "#d62728", retry = "#e08a1e",
  limit_wait = "#7f7f7f", grid = "#dddddd", text = "#222222" }

local Timeline = {}
Timeline.__index = Timeline

--- tl = timeline.new(limits, started): limits is the list of what to
-- draw, in order, each { name =, title =, per_minute = number | nil };
-- started is the run's start on the monotonic clock.
function timeline.new(limits, started)
  local taken = {}
  for _, limit in ipairs(limits) do taken[limit.name] = {} end
  return setmetatable({ limits = limits, started = started, taken = taken, throttles = {}, waits = {} }, Timeline)
end

--- tl:took(name, n, at): n of limit name taken at monotonic time at (a
-- negative n: given back by a correction). A name not drawn is ignored.
-- No count of tokens a request takes, nor a wait, comes near this: a larger
-- one (a careless max_tokens of 1e308, a hostile usage) is not drawn, which
-- would make every rate after it infinite.
local MOST = 1e15

local function drawable(n)
  return type(n) == "number" and n == n and n > -MOST and n < MOST
end

function Timeline:took(name, n, at)
  local list = self.taken[name]
  if list and drawable(n) then list[#list + 1] = { at - self.started, n } end
end

--- tl:throttled(at): an answer 429 (or read as a throttle) came at at.
function Timeline:throttled(at)
  self.throttles[#self.throttles + 1] = at - self.started
end

--- tl:waited(kind, from, seconds): a wait of seconds that began at from,
-- kind "retry" (before a retry) or "limit" (a request's wait for its limit).
function Timeline:waited(kind, from, seconds)
  if drawable(seconds) and seconds >= 0 then self.waits[#self.waits + 1] = { kind, from - self.started, seconds } end
end

-- Ticks for an axis from 0 to top: a step of 1, 2 or 5 times a power of
-- ten, about `count` of them.
local function nice_step(top, count)
  local raw = top / count
  local power = 10 ^ floor(math.log(raw) / math.log(10))
  for _, m in ipairs({ 1, 2, 5, 10 }) do
    if m * power >= raw then return m * power end
  end
  return 10 * power
end

local function number(n)
  if n >= 1e6 and n % 1e5 == 0 then return format("%gM", n / 1e6) end
  if n >= 1e4 and n % 100 == 0 then return format("%gk", n / 1e3) end
  return format("%.15g", floor(n * 100 + 0.5) / 100)
end

-- The rate of a limit, sampled every `step` seconds from 0 to duration.
local function rate_points(list, duration, step)
  local points, sum, first = {}, 0, 1
  local last = 0
  local t = 0
  while true do
    while last < #list and list[last + 1][1] <= t do
      last = last + 1
      sum = sum + list[last][2]
    end
    while first <= last and list[first][1] <= t - timeline.WINDOW do
      sum = sum - list[first][2]
      first = first + 1
    end
    points[#points + 1] = { t, max(0, sum) * 60 / timeline.WINDOW }
    if t >= duration then break end
    t = min(duration, t + step)
  end
  return points
end

--- text = tl:svg(ended): the picture of the run, which ended at ended
-- (monotonic).
function Timeline:svg(ended)
  local duration = max(ended - self.started, 1)
  local x_step = nice_step(duration, 10)
  local function x(t) return LEFT + PLOT * min(max(t, 0), duration) / duration end
  local out = {}
  local function add(...) out[#out + 1] = format(...) end

  -- The waits, each on the first row free at its start: the longest
  -- MAX_BARS of them, where there are more (the title says so).
  local waits = self.waits
  if #waits > MAX_BARS then
    waits = {}
    for i = 1, #self.waits do waits[i] = self.waits[i] end
    sort(waits, function(a, b) return a[3] > b[3] end)
    for i = MAX_BARS + 1, #waits do waits[i] = nil end
    sort(waits, function(a, b) return a[2] < b[2] end)
  end
  local rows, row_ends = {}, {}
  for i, wait in ipairs(waits) do
    local row = 1
    while row_ends[row] and row_ends[row] > wait[2] and row < MAX_ROWS do row = row + 1 end
    rows[i] = row
    row_ends[row] = max(row_ends[row] or 0, wait[2] + wait[3])
  end
  local wait_rows = max(#row_ends, 1)

  local panels = #self.limits
  local lanes_top = TOP + panels * (PANEL + GAP)
  local height = lanes_top + LANE + GAP + wait_rows * ROW + 56
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
    .. 'font-family="sans-serif" font-size="12">', WIDTH, height, WIDTH, height)
  add('<rect width="%d" height="%d" fill="white"/>', WIDTH, height)
  local limit_waits = 0
  for _, wait in ipairs(self.waits) do
    if wait[1] == "limit" then limit_waits = limit_waits + 1 end
  end
  add('<text x="%d" y="22" font-size="15" fill="%s">ratewise batch: %.1f s, %d throttled (429), %d retry waits, '
    .. '%d waits for a limit%s</text>', LEFT, COLOURS.text, ended - self.started, #self.throttles,
    #self.waits - limit_waits, limit_waits, #waits < #self.waits and format(" (the %d longest drawn)", #waits) or "")
  add('<text x="%d" y="38" fill="%s">each rate is what was taken over the last %d s, per minute</text>', LEFT,
    COLOURS.text, timeline.WINDOW)

  local function time_grid(top, bottom)
    local t = 0
    while t <= duration + 1e-9 do
      add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>', x(t), top, x(t), bottom, COLOURS.grid)
      t = t + x_step
    end
  end

  local step = duration / 400
  for i, limit in ipairs(self.limits) do
    local top = TOP + (i - 1) * (PANEL + GAP) + 16
    local bottom = top + PANEL
    local points = rate_points(self.taken[limit.name], duration, step)
    local highest = limit.per_minute or 0
    for _, p in ipairs(points) do highest = max(highest, p[2]) end
    local y_top = highest > 0 and highest * 1.15 or 1
    local function y(v) return bottom - PANEL * v / y_top end
    local taken = 0
    for _, event in ipairs(self.taken[limit.name]) do taken = taken + event[2] end
    add('<g class="panel" data-limit="%s" data-taken="%.15g">', limit.name, taken)
    add('<text x="%d" y="%d" font-weight="bold" fill="%s">%s a minute</text>', LEFT, top - 6, COLOURS.text,
      limit.title)
    time_grid(top, bottom)
    local y_step = nice_step(y_top, 4)
    for k = 0, min(floor(y_top / y_step), 10) do
      local v = k * y_step
      add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>', LEFT, y(v), LEFT + PLOT, y(v), COLOURS.grid)
      add('<text x="%d" y="%.1f" text-anchor="end" fill="%s">%s</text>', LEFT - 6, y(v) + 4, COLOURS.text, number(v))
    end
    add('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999999"/>', LEFT, top, PLOT, PANEL)
    if limit.per_minute then
      add('<line class="limit" data-per-minute="%.15g" x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" '
        .. 'stroke-dasharray="6 4" stroke-width="1.5"/>', limit.per_minute, LEFT, y(limit.per_minute),
        LEFT + PLOT, y(limit.per_minute), COLOURS.limit)
      add('<text x="%d" y="%.1f" text-anchor="end" fill="%s">limit %s</text>', LEFT + PLOT - 4,
        y(limit.per_minute) - 5, COLOURS.limit, number(limit.per_minute))
    end
    local coords = {}
    for j, p in ipairs(points) do coords[j] = format("%.1f,%.1f", x(p[1]), y(p[2])) end
    add('<polyline class="rate" fill="none" stroke="%s" stroke-width="1.5" points="%s"/>', COLOURS.rate,
      concat(coords, " "))
    add('</g>')
  end

  -- The 429s: a tick each.
  local lane = lanes_top
  add('<g class="throttles">')
  add('<text x="%d" y="%d" font-weight="bold" fill="%s">answers 429</text>', LEFT, lane - 6, COLOURS.text)
  add('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999999"/>', LEFT, lane, PLOT, LANE)
  -- (one tick a pixel: its data-count says how many 429s it stands for)
  local ticks, columns = {}, {}
  for _, at in ipairs(self.throttles) do
    local column = floor(x(at))
    if not ticks[column] then
      ticks[column] = 0
      columns[#columns + 1] = column
    end
    ticks[column] = ticks[column] + 1
  end
  for _, column in ipairs(columns) do
    add('<line class="throttle" data-count="%d" x1="%d.5" y1="%d" x2="%d.5" y2="%d" stroke="%s" stroke-width="1.5"/>',
      ticks[column], column, lane + 3, column, lane + LANE - 3, COLOURS.throttle)
  end
  add('</g>')

  -- The waits: a bar each, from its start for its length.
  local waits_top = lane + LANE + GAP
  add('<g class="waits">')
  add('<text x="%d" y="%d" font-weight="bold" fill="%s">waits: before a retry '
    .. '<tspan fill="%s">(orange)</tspan>, for a limit <tspan fill="%s">(grey)</tspan></text>', LEFT, waits_top - 6,
    COLOURS.text, COLOURS.retry, COLOURS.limit_wait)
  time_grid(waits_top, waits_top + wait_rows * ROW)
  for i, wait in ipairs(waits) do
    local from = x(wait[2])
    add('<rect class="wait %s" data-at="%.3f" data-seconds="%.3f" x="%.1f" y="%d" width="%.1f" height="%d" '
      .. 'fill="%s"/>', wait[1], wait[2], wait[3], from, waits_top + (rows[i] - 1) * ROW,
      max(x(wait[2] + wait[3]) - from, 1), ROW - 1, wait[1] == "retry" and COLOURS.retry or COLOURS.limit_wait)
  end
  add('</g>')

  -- The time axis.
  local axis = waits_top + wait_rows * ROW + 18
  local t = 0
  while t <= duration + 1e-9 do
    add('<text x="%.1f" y="%d" text-anchor="middle" fill="%s">%s s</text>', x(t), axis, COLOURS.text, number(t))
    t = t + x_step
  end
  add('</svg>')
  return concat(out, "\n") .. "\n"
end

--- true | nil, why = tl:write(path, ended)
function Timeline:write(path, ended)
  local f, err = io.open(path, "wb")
  if not f then return nil, "cannot write the timeline: " .. tostring(err) end
  local ok, werr = f:write(self:svg(ended))
  local closed, cerr = f:close()
  if not ok or not closed then return nil, "cannot write the timeline to " .. path .. ": " .. tostring(werr or cerr) end
  return true
end

return timeline
