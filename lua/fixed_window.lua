-- fixed_window.lua: at most `limit` units per window aligned to multiples of `window_us`.
-- Mirrors src/limiter/fixed_window.rs. One limit's part of a decision script: see common.lua.
--
-- key          the limit's state key: a string packing (window, count, window_us) as doubles,
--              window_us being the size of the window the count was counted in
-- ARGV[a + 1]  limit
-- ARGV[a + 2]  window_us
--
-- A time in an earlier window than the stored one (the clock stepped back) keeps counting in the
-- stored window.
--
-- Debt (report): the units are added to the window's count whether they fit or not, up to a count
-- of 2 * limit; units beyond are not recorded. The debt ends with its window, when the count
-- starts again from zero, so acquires are denied exactly until then.
-- Refund: units come off the current window's count, never below zero; with a ticket's `mark`
-- (the end of the window its take counted in) only while that window is the current one. The
-- state is rewritten with KEEPTTL: the expiry stays the window's end.
--
-- A change of parameters (limit or window): the count carries over while the window it was
-- counted in has not ended; every section goes on counting in it, of its own size, until its
-- end (the key's expiry), and the next window is aligned to the window_us decided.

local limit = tonumber(ARGV[a + 1])
local window_us = tonumber(ARGV[a + 2])

-- The stored window counts, of the size it was counted in (`size`), until it ends; then a fresh
-- one of window_us: floor(now / window_us), corrected where the division rounds up to the next
-- integer (as for the stored size).
local size = window_us
local window, count = nil, 0
local raw = redis.call('GET', key)
if raw then
  local w, c, s = struct.unpack('<ddd', raw)
  if s >= 1 then
    local current = math.floor(now / s)
    if current * s > now then
      current = current - 1
    end
    if w >= current then
      window, count, size = w, c, s
    end
  end
end
if not window then
  window = math.floor(now / window_us)
  if window * window_us > now then
    window = window - 1
  end
end

local wait = (window + 1) * size - now
local admits = count + cost <= limit
--- take
count = count + cost
redis.call('PSETEX', key, math.ceil(wait / 1000), struct.pack('<ddd', window, count, size))
out_remaining, out_reset = limit - count, wait
--- keep
out_remaining = math.max(limit - count, 0)
if count > 0 then
  out_reset = wait
end
if not admits then
  out_retry = wait
end
--- report
-- Usage never passes twice the limit: what would go past it is not recorded.
out_units = math.min(cost, math.max(2 * limit - count, 0))
if out_units > 0 then
  count = count + out_units
  redis.call('PSETEX', key, math.ceil(wait / 1000), struct.pack('<ddd', window, count, size))
end
out_remaining = math.max(limit - count, 0)
if count > 0 then
  out_reset = wait
end
if out_remaining < 1 then
  out_retry = wait
end
--- refund
-- A marked refund gives back only within the window that ends at its mark.
if not mark or mark == (window + 1) * size then
  out_units = math.min(cost, count)
end
if out_units > 0 then
  count = count - out_units
  redis.call('SET', key, struct.pack('<ddd', window, count, size), 'KEEPTTL')
end
out_remaining = math.max(limit - count, 0)
if count > 0 then
  out_reset = wait
end
if out_remaining < 1 then
  out_retry = wait
end
