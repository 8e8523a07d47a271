-- fixed_window.lua: at most `limit` units per window aligned to multiples of `window_us`.
-- Mirrors src/limiter/fixed_window.rs.
--
-- KEYS[1]  the subject's state key: a string packing (window, count, window_us) as doubles
-- ARGV[1]  limit
-- ARGV[2]  window_us
-- ARGV[3]  cost (1 <= cost <= limit)
-- ARGV[4]  the current time in µs, or empty for Redis TIME (explicit times are for tests);
--          read by common.lua into `now`
-- Reply    {allowed (0|1), remaining, reset_after_us, retry_after_us}
-- Flags    `#!lua` (see common.lua): refused whole, with OOM, while Redis is over maxmemory
--
-- A denial writes nothing. A time in an earlier window than the stored one (the clock stepped
-- back) keeps counting in the stored window.

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window_us = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

-- floor(now / window_us), corrected where the division rounds up to the next integer.
local current = math.floor(now / window_us)
if current * window_us > now then
  current = current - 1
end
local window, count = current, 0
local raw = redis.call('GET', key)
if raw then
  local w, c, size = struct.unpack('<ddd', raw)
  if size == window_us and w >= current then
    window, count = w, c
  end
end

local wait = (window + 1) * window_us - now
if count + cost <= limit then
  count = count + cost
  redis.call('PSETEX', key, math.ceil(wait / 1000), struct.pack('<ddd', window, count, window_us))
  return {1, limit - count, wait, 0}
end
return {0, math.max(limit - count, 0), wait, wait}
