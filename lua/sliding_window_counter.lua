-- sliding_window_counter.lua: the previous window's count, weighted by the part of it still
-- inside the trailing window, plus the current window's count, may not exceed `limit`.
-- Mirrors src/limiter/sliding_window_counter.rs.
--
-- KEYS[1]  the subject's state key: a string packing (window, previous, current, window_us)
-- ARGV[1]  limit
-- ARGV[2]  window_us
-- ARGV[3]  cost (1 <= cost <= limit)
-- ARGV[4]  the current time in µs, or empty for Redis TIME (explicit times are for tests);
--          read by common.lua into `now`
-- Reply    {allowed (0|1), remaining, reset_after_us, retry_after_us}
-- Flags    `#!lua` (see common.lua): refused whole, with OOM, while Redis is over maxmemory
--
-- Allowed when current + cost + ceil(previous * (window_us - elapsed) / window_us) <= limit,
-- in exact integers. A denial writes nothing. A time in a window earlier than the stored one
-- (the clock stepped back) counts as the start of the stored window.

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

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
if current + cost + weighted <= limit then
  current = current + cost
  local reset = end_of_next - now
  redis.call('PSETEX', key, math.ceil(reset / 1000), struct.pack('<dddd', window, previous, current, w))
  return {1, limit - current - weighted, reset, 0}
end

local reset_at = start + w
if current > 0 then
  reset_at = end_of_next
end
local allowed_at
if current + cost <= limit then
  -- Later in this window, once the previous window's weight has shrunk enough.
  allowed_at = start + w - muldiv(w, limit - current - cost, previous)
else
  -- In the next window, where this window's count becomes the weighted one.
  local shrink = muldiv(w, limit - cost, current)
  allowed_at = start + w + math.max(w - shrink, 0)
end
return {0, math.max(limit - current - weighted, 0), math.max(reset_at - now, 0), math.max(allowed_at - now, 0)}
