-- token_bucket.lua: a bucket of `capacity` tokens, starting full, refilled continuously at
-- `refill_tokens` per `refill_period_us`. Mirrors src/limiter/token_bucket.rs, whose module doc
-- states the rules. One limit's part of a decision script: see common.lua.
--
-- key          the limit's state key: a string packing (tokens, fraction, updated_us,
--              refill_tokens, refill_period_us) as doubles; a missing key is a full bucket.
--              tokens is signed: below zero (down to -capacity) after a report put the subject
--              in debt; keys written before debt existed hold the same layout
-- ARGV[a + 1]  capacity
-- ARGV[a + 2]  refill_tokens    } the rate in lowest terms (divided by their greatest common
-- ARGV[a + 3]  refill_period_us } divisor), so that refill_tokens < 2^31 and products stay exact
--
-- The level is whole tokens plus fraction / refill_period_us of a token, all integers: refill
-- is elapsed * refill_tokens in those units, so nothing is lost to rounding however often the
-- bucket is read. A time before updated_us refills nothing and removes nothing. The key expires
-- when the bucket would be full again.
--
-- Debt: a report takes min(cost, capacity + tokens), so tokens never go below -capacity (usage
-- at most twice the capacity); time repays it at the refill rate, and nothing is available
-- (remaining 0) until tokens are back to 1. The tokens missing from full stay below
-- 2 * 10^9 < 2^31, which muldiv multiplies exactly.
-- Refund: gives back at most the whole tokens in use (capacity - tokens), and with a ticket's
-- mark (the time the bucket would be full after its take) at most the
-- ceil((mark - t) * rate / period) tokens of that take not yet refilled by t, mark - t capped
-- at MAX_WAIT_US. Back at capacity, the fraction is dropped (never above full). Written with
-- KEEPTTL: the bucket is only fuller, so the old expiry still comes after it is full.

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

-- A wait is the time until the level reaches `target` whole tokens, from the caller's now:
-- skew + ceil(((target - tokens) * period - fraction) / rate), capped at MAX_WAIT_US, which is
-- skew + q + 1 when r > fraction and skew + q - floor((fraction - r) / rate) otherwise, for
-- q, r = muldiv(period, target - tokens, rate); skew alone when the level is there already (it
-- counts even then, as in Rust: a refund can leave a full bucket updated after the caller's
-- now). Each section writes out the waits it needs rather than calling a function for them: a
-- function here would be a closure over eight of these locals, whose upvalues are made and
-- closed on every call of the script (about 0.3 us a call).
local admits = tokens >= cost
--- take
tokens = tokens - cost
local q, r = muldiv(period, capacity - tokens, rate)
out_reset = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, rate)), MAX_WAIT_US)
redis.call('PSETEX', key, math.ceil(out_reset / 1000), struct.pack('<ddddd', tokens, fraction, t, rate, period))
out_remaining = tokens
--- keep
out_remaining, out_reset = math.max(tokens, 0), math.min(skew, MAX_WAIT_US)
if tokens < capacity then
  local q, r = muldiv(period, capacity - tokens, rate)
  out_reset = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, rate)), MAX_WAIT_US)
end
if not admits then
  local q, r = muldiv(period, cost - tokens, rate)
  out_retry = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, rate)), MAX_WAIT_US)
end
--- report
-- Recorded: what fits before usage reaches twice the capacity (nothing when a lowered capacity
-- left a deeper debt). The bucket is below capacity after it, and below 1 token too when a
-- retry is due.
out_units = math.max(math.min(cost, capacity + tokens), 0)
tokens = tokens - out_units
local q, r = muldiv(period, capacity - tokens, rate)
out_reset = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, rate)), MAX_WAIT_US)
if out_units > 0 then
  redis.call('PSETEX', key, math.ceil(out_reset / 1000), struct.pack('<ddddd', tokens, fraction, t, rate, period))
end
out_remaining = math.max(tokens, 0)
if tokens < 1 then
  q, r = muldiv(period, 1 - tokens, rate)
  out_retry = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, rate)), MAX_WAIT_US)
end
--- refund
-- At most the whole tokens in use (none for a missing key: a full bucket), and with a mark only
-- those of its take that time has not refilled yet.
out_units = math.min(cost, capacity - tokens)
if mark then
  local unrefilled = 0
  if mark >= 4503599627370496 then
    -- A held mark, 2^52 + the take's time (src/limiter/mod.rs, undrained): the take's units
    -- count past MAX_WAIT_US. The larger of two lower bounds of what it holds: its own units
    -- that the time since it cannot have drained, and those before take + MAX_WAIT_US; nothing
    -- after that.
    local elapsed = math.max(t - (mark - 4503599627370496), 0)
    if elapsed < MAX_WAIT_US then
      local q, r = muldiv(MAX_WAIT_US - elapsed, rate, period)
      unrefilled = q
      if r > 0 then
        unrefilled = q + 1
      end
      unrefilled = math.max(unrefilled, cost - muldiv(elapsed, rate, period))
    end
  elseif mark > t then
    local q, r = muldiv(math.min(mark - t, MAX_WAIT_US), rate, period)
    -- Rounded up: a refund right after its take gives all of it back.
    unrefilled = q
    if r > 0 then
      unrefilled = q + 1
    end
  end
  out_units = math.min(out_units, unrefilled)
end
if out_units > 0 then
  tokens = tokens + out_units
  if tokens >= capacity then
    tokens, fraction = capacity, 0
  end
  redis.call('SET', key, struct.pack('<ddddd', tokens, fraction, t, rate, period), 'KEEPTTL')
end
out_remaining, out_reset = math.max(tokens, 0), math.min(skew, MAX_WAIT_US)
if tokens < capacity then
  local q, r = muldiv(period, capacity - tokens, rate)
  out_reset = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, rate)), MAX_WAIT_US)
end
if tokens < 1 then
  local q, r = muldiv(period, 1 - tokens, rate)
  out_retry = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, rate)), MAX_WAIT_US)
end
