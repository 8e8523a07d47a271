-- token_bucket.lua: a bucket of `capacity` tokens, starting full, refilled continuously at
-- `refill_tokens` per `refill_period_us`. Mirrors src/limiter/token_bucket.rs. One limit's part
-- of a decision script: see common.lua.
--
-- key          the limit's state key: a string packing (tokens, fraction, updated_us,
--              refill_tokens, refill_period_us) as doubles; a missing key is a full bucket
-- ARGV[a + 1]  capacity
-- ARGV[a + 2]  refill_tokens    } the rate in lowest terms (divided by their greatest common
-- ARGV[a + 3]  refill_period_us } divisor), so that refill_tokens < 2^31 and products stay exact
--
-- The level is whole tokens plus fraction / refill_period_us of a token, all integers: refill
-- is elapsed * refill_tokens in those units, so nothing is lost to rounding however often the
-- bucket is read. A time before updated_us refills nothing and removes nothing. The key expires
-- when the bucket would be full again.

local capacity = tonumber(ARGV[a + 1])
local rate = tonumber(ARGV[a + 2])
local period = tonumber(ARGV[a + 3])

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

local admits = tokens >= cost
--- take
tokens = tokens - cost
out_reset = wait_for(capacity)
redis.call('PSETEX', key, math.ceil(out_reset / 1000), struct.pack('<ddddd', tokens, fraction, t, rate, period))
out_remaining = tokens
--- keep
out_remaining, out_reset = tokens, wait_for(capacity)
if not admits then
  out_retry = wait_for(cost)
end
