-- fixed_window.lua: at most `limit` units per window aligned to multiples of `window_us`.
-- Mirrors src/limiter/fixed_window.rs. One limit's part of a decision script: see common.lua.
--
-- key          the limit's state key: a string packing (window, count, window_us) as doubles
-- ARGV[a + 1]  limit
-- ARGV[a + 2]  window_us
--
-- A time in an earlier window than the stored one (the clock stepped back) keeps counting in the
-- stored window.

local limit = tonumber(ARGV[a + 1])
local window_us = tonumber(ARGV[a + 2])

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
local admits = count + cost <= limit
--- take
count = count + cost
redis.call('PSETEX', key, math.ceil(wait / 1000), struct.pack('<ddd', window, count, window_us))
out_remaining, out_reset = limit - count, wait
--- keep
out_remaining = math.max(limit - count, 0)
if count > 0 then
  out_reset = wait
end
if not admits then
  out_retry = wait
end
