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
--
-- Debt (report): the units are added to `current` whether they fit or not, as long as usage
-- (current + the weighted previous count) stays at most 2 * limit; units beyond are not recorded.
-- The windows sliding on repay it within two windows, and keep's retry is exact for it as for any
-- full window.
-- Refund: units come off `current`, then `previous`, never below zero. A ticket's `mark` is the
-- end of the window after its take's: mark == start + 2 * w gives back from `current`, mark ==
-- start + w from `previous`, any other nothing. The state is rewritten with KEEPTTL.
--
-- A change of parameters (limit or window): the usage carries over. The stored windows go on
-- sliding at their own size (`w`, the stored window_us) while either counts; keep and refund
-- leave them so. The first take or report under another window_us writes the usage then
-- (current + the weighted previous) as the count of the window of the new size that holds now.
-- The key expires when the stored windows have slid out, and a state past its expiry answers as
-- a missing key.

local limit = tonumber(ARGV[a + 1])
local window_us = tonumber(ARGV[a + 2])

-- The stored windows count, of the size they were counted in (`w`), while either does; else a
-- fresh window of window_us. floor(now / size), corrected where the division rounds up to the
-- next integer.
local w, window, previous, current = window_us, nil, 0, 0
local raw = redis.call('GET', key)
if raw then
  local sw, p, c, size = struct.unpack('<dddd', raw)
  if size >= 1 then
    local now_window = math.floor(now / size)
    if now_window * size > now then
      now_window = now_window - 1
    end
    if now_window <= sw then
      w, window, previous, current = size, sw, p, c
    elseif now_window == sw + 1 then
      w, window, previous, current = size, now_window, c, 0
    end
  end
end
if not window then
  window = math.floor(now / window_us)
  if window * window_us > now then
    window = window - 1
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
if w ~= window_us then
  -- Written in windows of window_us: the usage now is the count of the one that holds now.
  window = math.floor(now / window_us)
  if window * window_us > now then
    window = window - 1
  end
  w, previous, current, weighted = window_us, 0, current + weighted, 0
  end_of_next = (window + 2) * window_us
end
current = current + cost
out_reset = end_of_next - now
redis.call('PSETEX', key, math.ceil((out_reset + take_delay_us) / 1000), struct.pack('<dddd', window, previous, current, w))
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
--- report
-- Usage never passes twice the limit: what would go past it is not recorded.
out_units = math.min(cost, math.max(2 * limit - current - weighted, 0))
if out_units > 0 and w ~= window_us then
  -- Written in windows of window_us, as take writes it.
  window = math.floor(now / window_us)
  if window * window_us > now then
    window = window - 1
  end
  w, previous, current, weighted = window_us, 0, current + weighted, 0
  start = window * window_us
  end_of_next = start + 2 * window_us
end
if out_units > 0 then
  current = current + out_units
  redis.call('PSETEX', key, math.ceil((end_of_next - now + take_delay_us) / 1000), struct.pack('<dddd', window, previous, current, w))
end
out_remaining = math.max(limit - current - weighted, 0)
if current > 0 then
  out_reset = end_of_next - now
elseif previous > 0 then
  out_reset = math.max(start + w - now, 0)
end
if out_remaining < 1 then
  -- When one unit fits again: keep's arithmetic for a cost of 1.
  local allowed_at
  if current + 1 <= limit then
    allowed_at = start + w - muldiv(w, limit - current - 1, previous)
  else
    allowed_at = start + w + math.max(w - muldiv(w, limit - 1, current), 0)
  end
  out_retry = math.max(allowed_at - now, 0)
end
--- refund
-- A marked refund gives back only from the count of its take's window.
local from_current, from_previous = 0, 0
if not mark then
  from_current = math.min(cost, current)
  from_previous = math.min(cost - from_current, previous)
elseif mark == end_of_next then
  from_current = math.min(cost, current)
elseif mark == start + w then
  from_previous = math.min(cost, previous)
end
out_units = from_current + from_previous
if out_units > 0 then
  current, previous = current - from_current, previous - from_previous
  redis.call('SET', key, struct.pack('<dddd', window, previous, current, w), 'KEEPTTL')
  q, r = muldiv(w - elapsed, previous, w)
  weighted = q
  if r > 0 then
    weighted = q + 1
  end
end
out_remaining = math.max(limit - current - weighted, 0)
if current > 0 then
  out_reset = end_of_next - now
elseif previous > 0 then
  out_reset = math.max(start + w - now, 0)
end
if out_remaining < 1 then
  -- When one unit fits again: keep's arithmetic for a cost of 1.
  local allowed_at
  if current + 1 <= limit then
    allowed_at = start + w - muldiv(w, limit - current - 1, previous)
  else
    allowed_at = start + w + math.max(w - muldiv(w, limit - 1, current), 0)
  end
  out_retry = math.max(allowed_at - now, 0)
end
