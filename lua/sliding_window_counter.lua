-- sliding_window_counter.lua: the previous window's count, weighted by the part of it still
-- inside the trailing window, plus the current window's count, may not exceed `limit`.
-- Mirrors src/limiter/sliding_window_counter.rs. One limit's part of a decision script: see
-- common.lua.
--
-- key          the limit's state key: a string packing (window, previous, current, window_us)
-- ARGV[a + 1]  limit
-- ARGV[a + 2]  window_us
--
-- Admits when current + cost + ceil(previous * (window_us - elapsed) / window_us) <= limit,
-- in exact integers. A time in a window earlier than the stored one (the clock stepped back)
-- counts as the start of the stored window.

local limit = tonumber(ARGV[a + 1])
local w = tonumber(ARGV[a + 2])

local now_window = divmod(now, w)
local window, previous, current = now_window, 0, 0
local raw = redis.call('GET', key)
if raw then
  local sw, p, c, size = struct.unpack('<dddd', raw)
  if size == w then
    if now_window <= sw then
      window, previous, current = sw, p, c
    elseif now_window == sw + 1 then
      previous = c
    end
  end
end

local start = window * w
local elapsed = math.max(now, start) - start
local q, r = muldiv(w - elapsed, previous, w)
local weighted = q
if r > 0 then
  weighted = q + 1
end

local end_of_next = start + 2 * w
local admits = current + cost + weighted <= limit
--- take
current = current + cost
out_reset = end_of_next - now
redis.call('PSETEX', key, math.ceil(out_reset / 1000), struct.pack('<dddd', window, previous, current, w))
out_remaining = limit - current - weighted
--- keep
out_remaining = math.max(limit - current - weighted, 0)
if current > 0 then
  out_reset = end_of_next - now
elseif previous > 0 then
  out_reset = math.max(start + w - now, 0)
end
if not admits then
  local allowed_at
  if current + cost <= limit then
    -- Later in this window, once the previous window's weight has shrunk enough.
    allowed_at = start + w - muldiv(w, limit - current - cost, previous)
  else
    -- In the next window, where this window's count becomes the weighted one.
    local shrink = muldiv(w, limit - cost, current)
    allowed_at = start + w + math.max(w - shrink, 0)
  end
  out_retry = math.max(allowed_at - now, 0)
end
