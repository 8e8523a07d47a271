-- gcra.lua: GCRA, sustained `rate` units per period and at most `burst` at once, decided on the
-- theoretical arrival time (TAT). Mirrors src/limiter/gcra.rs, whose module doc states the rules.
--
-- KEYS[1]  the subject's state key: a string packing (anchor_us, units, interval_num,
--          interval_den) as doubles, the TAT being anchor_us + units * interval_num /
--          interval_den µs; a missing key is a subject at rest
-- ARGV[1]  burst (the capacity)
-- ARGV[2]  interval_num } the emission interval period_us / rate in lowest terms, in µs
-- ARGV[3]  interval_den } (interval_den <= rate < 2^31, so products stay exact through muldiv)
-- ARGV[4]  cost (1 <= cost <= burst)
-- ARGV[5]  the current time in µs, or empty for Redis TIME (explicit times are for tests);
--          read by common.lua into `now`
-- Reply    {allowed (0|1), remaining, reset_after_us, retry_after_us}
-- Flags    `#!lua` (see common.lua): refused whole, with OOM, while Redis is over maxmemory
--
-- The TAT is an anchor in whole µs plus a whole number of emission intervals, so it is exact
-- with no rounding. The anchor moves forward by whole multiples of interval_num µs only, stays
-- within one such span of the last decision, and keeps units below burst + interval_den: every
-- number stays below 2^53. A time before the anchor is treated as the anchor (never refunds). A
-- denial writes nothing. The key expires when the TAT has passed.

local MAX_WAIT_US = 1125899906842624 -- 2^50 µs; longer waits are reported as this

local key = KEYS[1]
local burst = tonumber(ARGV[1])
local num = tonumber(ARGV[2])
local den = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])

local anchor, units = now, 0
local raw = redis.call('GET', key)
if raw then
  local a, u, n, d = struct.unpack('<dddd', raw)
  if n == num and d == den then
    anchor, units = a, u
  end
end

local t = math.max(now, anchor)
local skew = t - now
-- Intervals elapsed since the anchor: `elapsed` whole ones and part / num of the next. The
-- level still to drain is busy - part / num intervals; a TAT at or before t is a subject at rest.
local elapsed, part = muldiv(t - anchor, den, num)
local busy
if elapsed >= units then
  anchor, units, busy, part, elapsed = t, 0, 0, 0, 0
else
  busy = units - elapsed
end

-- Time for a level of `level - part / num` intervals to drain to zero, from the caller's now:
-- skew + ceil((level * num - part) / den), capped at MAX_WAIT_US.
local function drain(level)
  local wait = 0
  if level > 0 then
    local q, r = muldiv(num, level, den)
    if r > part then
      wait = q + 1
    else
      wait = q - divmod(part - r, den)
    end
  end
  return math.min(skew + wait, MAX_WAIT_US)
end

if busy + cost <= burst then
  local after = busy + cost
  local reset = drain(after)
  -- Whole spans of num µs (den intervals) move into the anchor, which stays exact.
  local periods = divmod(elapsed, den)
  redis.call('PSETEX', key, math.ceil(reset / 1000),
    struct.pack('<dddd', anchor + periods * num, units - periods * den + cost, num, den))
  return {1, burst - after, reset, 0}
end
return {0, math.max(burst - busy, 0), drain(busy), drain(busy + cost - burst)}
