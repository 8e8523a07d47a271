-- gcra.lua: GCRA, sustained `rate` units per period and at most `burst` at once, decided on the
-- theoretical arrival time (TAT). Mirrors src/limiter/gcra.rs, whose module doc states the rules.
-- One limit's part of a decision script: see common.lua.
--
-- key          the limit's state key: a string packing (anchor_us, units, interval_num,
--              interval_den, since_us, refunded) as doubles, the TAT being anchor_us + units *
--              interval_num / interval_den µs, since_us and refunded its life
--              (src/limiter/mod.rs, Life); a missing key is a subject at rest. A key of the
--              layout before, 32 bytes without the life, is read as a life beginning now
-- ARGV[a + 1]  burst (the capacity)
-- ARGV[a + 2]  interval_num } the emission interval period_us / rate in lowest terms, in µs
-- ARGV[a + 3]  interval_den } (interval_den <= rate < 2^31, so products stay exact through muldiv)
--
-- The TAT is an anchor in whole µs plus a whole number of emission intervals, so it is exact
-- with no rounding. The anchor moves forward by whole multiples of interval_num µs only, stays
-- within one such span of the last decision, and keeps units below burst + interval_den: every
-- number stays below 2^53. A time before the anchor is treated as the anchor (never refunds).
-- The key expires when the TAT has passed.
--
-- Debt: a report takes min(cost, 2 * burst - busy), so the level never passes 2 * burst
-- intervals (usage at most twice the burst) and units stay below 2 * burst + interval_den;
-- levels up to 2 * 10^9 < 2^31 are multiplied exactly by muldiv. Time drains it like any
-- backlog; remaining is 0 until busy is below burst again.
-- Refund: gives back at most busy intervals (all of them put the TAT before t: at rest, never
-- above full), and with a ticket's mark (the TAT after its take) at most the
-- ceil((mark - t) * den / num) of that take not yet drained by t, mark - t capped at
-- MAX_WAIT_US, less the units refunds have given back since the take (each moves the takes
-- after it up), nothing for a take before the life began; a held mark (a take whose TAT was
-- past MAX_WAIT_US) as the refund section reads it. Written with KEEPTTL: the TAT only moves
-- earlier, before the old expiry. Its life begins whenever the subject is found at rest, and
-- again at a refund that would bring its count to 2^52.
--
-- A change of parameters (burst, rate or period): the units in use (busy) carry over. The TAT
-- drains at the interval stored with it until a take or a report rewrites it at the interval
-- decided (busy units anchored at t, the part of an interval drained so far dropped); keep and
-- refund leave it at its own, so the key expires at the TAT and a state past its expiry answers
-- as a missing key.

local burst = tonumber(ARGV[a + 1])
local num = tonumber(ARGV[a + 2])
local den = tonumber(ARGV[a + 3])

-- t = max(now, anchor): a time before the anchor is treated as the anchor; skew = t - now.
-- Intervals elapsed since the anchor: `elapsed` whole ones and part / num of the next. The
-- level still to drain is busy - part / num intervals; a TAT at or before t (or no state) is a
-- subject at rest, anchored at t. (A subject at rest, the common case on a busy key space,
-- needs no long division.)
-- The level drains at the interval the state was written with, snum / sden.
local t, skew = now, 0
local snum, sden = num, den
local anchor, units, busy, elapsed, part = now, 0, 0, 0, 0
local since, refunded
local raw = redis.call('GET', key)
if raw then
  local at, u, n, d, sn, rf
  if #raw == 48 then
    at, u, n, d, sn, rf = struct.unpack('<dddddd', raw)
  else
    at, u, n, d = struct.unpack('<dddd', raw)
  end
  if n >= 1 and d >= 1 then
    snum, sden = n, d
    since, refunded = sn, rf
    if at > now then
      t, skew, anchor = at, at - now, at
    end
    local e, p = muldiv(t - at, d, n)
    if e < u then
      anchor, units, busy, elapsed, part = at, u, u - e, e, p
    end
  end
end
if busy == 0 or not since then
  since, refunded = t, 0
end

-- A drain is the time for a level of `level - part / num` intervals to drain to zero, from the
-- caller's now: skew + ceil((level * num - part) / den), capped at MAX_WAIT_US, which is
-- skew + q + 1 when r > part and skew + q - floor((part - r) / den) otherwise, for
-- q, r = muldiv(num, level, den); skew alone for no level. Each section writes out the drains it
-- needs rather than calling a function for them: a function here would be a closure over seven
-- of these locals, whose upvalues are made and closed on every call of the script.
-- Take and report rewrite the level at the interval decided: its busy units, anchored at t
-- (the part of an interval drained so far dropped when the interval differs); keep and refund
-- leave it at its own.
local admits = busy + cost <= burst
--- take
if snum ~= num or sden ~= den then
  anchor, units, elapsed, part = t, busy, 0, 0
end
local after = busy + cost
local q, r = muldiv(num, after, den)
out_reset = math.min(skew + (r > part and q + 1 or q - muldiv(part - r, 1, den)), MAX_WAIT_US)
-- Whole spans of num µs (den intervals) move into the anchor, which stays exact.
local periods = 0
if elapsed >= den then
  periods = muldiv(elapsed, 1, den)
end
redis.call('PSETEX', key, math.ceil((out_reset + take_delay_us) / 1000),
  struct.pack('<dddddd', anchor + periods * num, units - periods * den + cost, num, den, since, refunded))
out_remaining, out_refunded = burst - after, refunded
--- keep
out_remaining, out_reset = math.max(burst - busy, 0), math.min(skew, MAX_WAIT_US)
if busy > 0 then
  local q, r = muldiv(snum, busy, sden)
  out_reset = math.min(skew + (r > part and q + 1 or q - muldiv(part - r, 1, sden)), MAX_WAIT_US)
end
if not admits then
  local q, r = muldiv(snum, busy + cost - burst, sden)
  out_retry = math.min(skew + (r > part and q + 1 or q - muldiv(part - r, 1, sden)), MAX_WAIT_US)
end
--- report
-- Recorded: what fits before the level reaches twice the burst (nothing when a lowered burst
-- left a longer backlog). The level is above zero after it (an empty one records cost).
out_units = math.max(math.min(cost, 2 * burst - busy), 0)
if out_units > 0 and (snum ~= num or sden ~= den) then
  anchor, units, elapsed, part = t, busy, 0, 0
  snum, sden = num, den
end
busy = busy + out_units
local q, r = muldiv(snum, busy, sden)
out_reset = math.min(skew + (r > part and q + 1 or q - muldiv(part - r, 1, sden)), MAX_WAIT_US)
if out_units > 0 then
  local periods = 0
  if elapsed >= sden then
    periods = muldiv(elapsed, 1, sden)
  end
  redis.call('PSETEX', key, math.ceil((out_reset + take_delay_us) / 1000),
    struct.pack('<dddddd', anchor + periods * snum, units - periods * sden + out_units, snum, sden, since, refunded))
end
out_remaining, out_refunded = math.max(burst - busy, 0), refunded
if busy >= burst then
  q, r = muldiv(snum, busy + 1 - burst, sden)
  out_retry = math.min(skew + (r > part and q + 1 or q - muldiv(part - r, 1, sden)), MAX_WAIT_US)
end
--- refund
-- At most the level (none for a missing key: at rest), and with a mark only the units of its
-- take not drained yet, less the refunds since it (src/limiter/mod.rs, undrained).
out_units = math.min(cost, busy)
-- A count rounded up from part of an interval (`partial`), given back whole, takes the part of
-- the next interval drained so far with it (the level anchored at t), so that it is not given
-- twice.
if mark then
  local undrained, partial = 0, false
  local shift = refunded - mark_refunded
  if mark_taken < since or shift < 0 then
    -- Taken before this life began, or counted in another: it holds nothing.
    undrained = 0
  elseif mark >= 4503599627370496 then
    -- A held mark, 2^52 + the take's time (src/limiter/mod.rs, undrained): the take's units
    -- count past MAX_WAIT_US. The larger of two lower bounds of what it holds: its own units
    -- that the time since it cannot have drained, and those before take + MAX_WAIT_US (moved
    -- up by the refunds since); nothing after that.
    local elapsed = math.max(t - (mark - 4503599627370496), 0)
    if elapsed < MAX_WAIT_US then
      local q, r = muldiv(MAX_WAIT_US - elapsed, sden, snum)
      if r > 0 then
        q = q + 1
      end
      local before, own = math.max(q - shift, 0), math.max(cost - muldiv(elapsed, sden, snum), 0)
      if before >= own then
        undrained, partial = before, r > 0
      else
        undrained = own
      end
    end
  elseif mark - 1 > t then
    -- A mark is rounded up to a µs: the exact time is after mark - 1.
    local q, r = muldiv(math.min(mark - 1 - t, MAX_WAIT_US), sden, snum)
    -- Rounded up: a refund right after its take gives all of it back.
    if r > 0 then
      q = q + 1
    end
    undrained, partial = math.max(q - shift, 0), r > 0
  end
  out_units = math.min(out_units, undrained)
  if partial and out_units == undrained and out_units > 0 then
    anchor, units, elapsed, part = t, busy, 0, 0
  end
end
if out_units > 0 then
  busy = busy - out_units
  local periods = 0
  if elapsed >= sden then
    periods = muldiv(elapsed, 1, sden)
  end
  refunded = refunded + out_units
  if refunded >= 4503599627370496 then
    since, refunded = t, 0
  end
  redis.call('SET', key, struct.pack('<dddddd', anchor + periods * snum, units - periods * sden - out_units, snum, sden, since, refunded), 'KEEPTTL')
end
out_remaining, out_reset = math.max(burst - busy, 0), math.min(skew, MAX_WAIT_US)
if busy > 0 then
  local q, r = muldiv(snum, busy, sden)
  out_reset = math.min(skew + (r > part and q + 1 or q - muldiv(part - r, 1, sden)), MAX_WAIT_US)
end
if busy >= burst then
  local q, r = muldiv(snum, busy + 1 - burst, sden)
  out_retry = math.min(skew + (r > part and q + 1 or q - muldiv(part - r, 1, sden)), MAX_WAIT_US)
end
