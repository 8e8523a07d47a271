-- fixed_window.lua: at most `limit` units per window aligned to multiples of `window_us`, or per
-- calendar period whose boundaries the instance computed. Mirrors src/limiter/fixed_window.rs. One
-- limit's part of a decision script: see common.lua.
--
-- key          the limit's state key: a string packing (window, count, size) as doubles, size
--              being the size of the window the count was counted in; for a calendar period,
--              (end, count, 0): the period is known by its end
-- ARGV[a + 1]  limit
-- ARGV[a + 2]  window_us, or 0 for a calendar window
-- ARGV[a + 3]  a calendar window's boundaries around the instance's time (0 for an epoch window):
-- ARGV[a + 4]  the period that holds it, [start, end), and the end of the next period. A `now`
-- ARGV[a + 5]  before start counts in the period that ends at start; one from end in the next.
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
-- A change of parameters (limit, window, calendar): the count carries over while the window it
-- was counted in has not ended; every section goes on counting in it, of its own size, until its
-- end (the key's expiry), and the next window is the one the parameters decided give.
--
-- A window that has already ended (a store clock a whole period past the instance's) is written
-- with the shortest expiry, 1 ms, rather than refused.

local limit = tonumber(ARGV[a + 1])
local window_us = tonumber(ARGV[a + 2])

-- The stored window counts, of the size it was counted in (`size`), until it ends; then a fresh
-- one: floor(now / window_us), corrected where the division rounds up to the next integer (as for
-- the stored size), or the calendar period that holds now (known by its end, of size 0).
local size = window_us
local window, count = nil, 0
local raw = redis.call('GET', key)
if raw then
  local w, c, s = struct.unpack('<ddd', raw)
  if s == 0 then
    if now < w then
      window, count, size = w, c, s
    end
  elseif s >= 1 then
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
  if window_us == 0 then
    local start, finish = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
    if now < start then
      window = start
    elseif now < finish then
      window = finish
    else
      window = tonumber(ARGV[a + 5])
    end
  else
    window = math.floor(now / window_us)
    if window * window_us > now then
      window = window - 1
    end
  end
end

local ends = window
if size > 0 then
  ends = (window + 1) * size
end
local wait = math.max(ends - now, 0)
local ttl = math.max(math.ceil(wait / 1000), 1)
local admits = count + cost <= limit
--- take
count = count + cost
redis.call('PSETEX', key, take_delay_us > 0 and math.ceil((wait + take_delay_us) / 1000) or ttl, struct.pack('<ddd', window, count, size))
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
  redis.call('PSETEX', key, take_delay_us > 0 and math.ceil((wait + take_delay_us) / 1000) or ttl, struct.pack('<ddd', window, count, size))
end
-- A window that has already ended (wait 0: a store clock past the next period's end) counts
-- nothing from now on: the subject stands as with no state, as the Rust `report` answers.
if wait == 0 then
  count = 0
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
if not mark or mark == ends then
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
