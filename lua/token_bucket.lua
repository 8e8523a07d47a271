-- token_bucket.lua: a bucket of `capacity` tokens, starting full, refilled continuously at
-- `refill_tokens` per `refill_period_us`. Mirrors src/limiter/token_bucket.rs.
--
-- KEYS[1]  the subject's state key: a string packing (tokens, fraction, updated_us,
--          refill_tokens, refill_period_us) as doubles; a missing key is a full bucket
-- ARGV[1]  capacity
-- ARGV[2]  refill_tokens    } the rate in lowest terms (divided by their greatest common
-- ARGV[3]  refill_period_us } divisor), so that refill_tokens < 2^31 and products stay exact
-- ARGV[4]  cost (1 <= cost <= capacity)
-- ARGV[5]  the current time in µs, or empty for Redis TIME (explicit times are for tests);
--          read by common.lua into `now`
-- Reply    {allowed (0|1), remaining, reset_after_us, retry_after_us}
-- Flags    `#!lua` (see common.lua): refused whole, with OOM, while Redis is over maxmemory
--
-- The level is whole tokens plus fraction / refill_period_us of a token, all integers: refill
-- is elapsed * refill_tokens in those units, so nothing is lost to rounding however often the
-- bucket is read. A time before updated_us refills nothing and removes nothing. A denial writes
-- nothing. The key expires when the bucket would be full again.

local MAX_WAIT_US = 1125899906842624 -- 2^50 µs; longer waits are reported as this

local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])

local tokens, fraction, updated = capacity, 0, now
local raw = redis.call('GET', key)
if raw then
  local tk, f, u, r, p = struct.unpack('<ddddd', raw)
  if r == rate and p == period then
    if tk >= capacity then
      tokens, fraction, updated = capacity, 0, u
    else
      tokens, fraction, updated = tk, f, u
    end
  end
end

local t = math.max(now, updated)
if tokens < capacity then
  local q, r = muldiv(t - updated, rate, period)
  r = r + fraction
  if r >= period then
    q, r = q + 1, r - period
  end
  if q >= capacity - tokens then
    tokens, fraction = capacity, 0
  else
    tokens, fraction = tokens + q, r
  end
end
local skew = t - now

-- Time until the level reaches `target` whole tokens:
-- ceil(((target - tokens) * period - fraction) / rate), capped at MAX_WAIT_US.
local function wait_for(target)
  if tokens >= target then
    return 0
  end
  local q, r = muldiv(period, target - tokens, rate)
  local wait
  if r > fraction then
    wait = q + 1
  else
    wait = q - divmod(fraction - r, rate)
  end
  return math.min(skew + wait, MAX_WAIT_US)
end

if tokens >= cost then
  tokens = tokens - cost
  local reset = wait_for(capacity)
  redis.call('PSETEX', key, math.ceil(reset / 1000), struct.pack('<ddddd', tokens, fraction, t, rate, period))
  return {1, tokens, reset, 0}
end
return {0, tokens, wait_for(capacity), wait_for(cost)}
