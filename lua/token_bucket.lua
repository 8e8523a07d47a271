-- token_bucket.lua: a bucket of `capacity` tokens, starting full, refilled continuously at
-- `refill_tokens` per `refill_period_us`. Mirrors src/limiter/token_bucket.rs, whose module doc
-- states the rules. One limit's part of a decision script: see common.lua.
--
-- key          the limit's state key: a string packing (tokens, fraction, updated_us,
--              refill_tokens, refill_period_us, capacity, since_us, refunded) as doubles, the
--              rate and capacity being those the level was written under, since_us and refunded
--              its life (src/limiter/mod.rs, Life); a missing key is a full bucket. tokens is
--              signed: below zero (down to -capacity) after a report put the subject in debt.
--              Keys of the layouts before: 48 bytes without the life, read as a life beginning
--              now; 40 bytes without capacity either (keys written before debt existed hold it
--              too), read as written under the capacity decided
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
-- at MAX_WAIT_US, less the tokens refunds have given back since the take (each moves the
-- takes after it up: the life's refund count less the ticket's), and nothing for a take
-- before the life began. Back at capacity, the fraction is dropped (never above full). Written
-- with KEEPTTL: the bucket is only fuller, so the old expiry still comes after it is full.
-- Its life begins whenever the bucket is found full, and again at a refund that would bring
-- its count to 2^52.
--
-- A change of parameters (capacity or rate): the tokens missing from full carry over. The level
-- refills at the rate it was written with, up to the capacity it was written under, until a
-- take or a report rewrites it under the parameters decided (the same tokens missing; the
-- fraction dropped when the rate differs); keep and refund leave it in its own terms, so the key
-- expires exactly when it is full and a state past its expiry answers as a missing key.

local capacity = tonumber(ARGV[a + 1])
local rate = tonumber(ARGV[a + 2])
local period = tonumber(ARGV[a + 3])

-- The level in the terms of the state: a bucket of `full` tokens refilled at srate / speriod
-- (the parameters it was written under), `extra` more tokens under the ones decided.
local full, srate, speriod = capacity, rate, period
local tokens, fraction, updated = capacity, 0, now
local since, refunded
local raw = redis.call('GET', key)
if raw then
  local tk, f, u, r, p, c, sn, rf
  if #raw == 64 then
    tk, f, u, r, p, c, sn, rf = struct.unpack('<dddddddd', raw)
  elseif #raw == 48 then
    tk, f, u, r, p, c = struct.unpack('<dddddd', raw)
  else
    -- A key of five fields, written before the capacity was kept: read as written under the
    -- capacity decided.
    tk, f, u, r, p = struct.unpack('<ddddd', raw)
    c = capacity
  end
  if r >= 1 and p >= 1 then
    full, srate, speriod = c, r, p
    since, refunded = sn, rf
    if tk >= c then
      tokens, fraction, updated = c, 0, u
    else
      tokens, fraction, updated = tk, f, u
    end
  end
end

local t = math.max(now, updated)
if tokens < full then
  local q, r = muldiv(t - updated, srate, speriod)
  r = r + fraction
  if r >= speriod then
    q, r = q + 1, r - speriod
  end
  if q >= full - tokens then
    tokens, fraction = full, 0
  else
    tokens, fraction = tokens + q, r
  end
end
if tokens >= full or not since then
  since, refunded = t, 0
end
local extra = capacity - full
local skew = t - now

-- A wait is the time until the level reaches `target` whole tokens of its own, from the caller's
-- now: skew + ceil(((target - tokens) * speriod - fraction) / srate), capped at MAX_WAIT_US,
-- which is skew + q + 1 when r > fraction and skew + q - floor((fraction - r) / srate) otherwise,
-- for q, r = muldiv(speriod, target - tokens, srate); skew alone when the level is there already
-- (it counts even then, as in Rust: a refund can leave a full bucket updated after the caller's
-- now). `cost` available under the parameters decided is `cost - extra` of its own. Each section
-- writes out the waits it needs rather than calling a function for them: a function here would
-- be a closure over these locals, whose upvalues are made and closed on every call of the script
-- (about 0.3 us a call). Take and report rewrite the level under the parameters decided (the
-- same tokens missing from full; the fraction dropped when the rate differs); keep and refund
-- leave it in its own terms.
local admits = tokens + extra >= cost
--- take
if srate ~= rate or speriod ~= period then
  fraction = 0
end
tokens = tokens + extra - cost
local q, r = muldiv(period, capacity - tokens, rate)
out_reset = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, rate)), MAX_WAIT_US)
redis.call('PSETEX', key, math.ceil((out_reset + take_delay_us) / 1000), struct.pack('<dddddddd', tokens, fraction, t, rate, period, capacity, since, refunded))
out_remaining, out_refunded = tokens, refunded
--- keep
out_remaining, out_reset = math.max(tokens + extra, 0), math.min(skew, MAX_WAIT_US)
if tokens < full then
  local q, r = muldiv(speriod, full - tokens, srate)
  out_reset = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, srate)), MAX_WAIT_US)
end
if not admits then
  local q, r = muldiv(speriod, cost - extra - tokens, srate)
  out_retry = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, srate)), MAX_WAIT_US)
end
--- report
-- Recorded: what fits before usage reaches twice the capacity (nothing when a lowered capacity
-- left a deeper debt). The bucket is below full after it, and below 1 token too when a retry is
-- due. Recording anything rewrites the level under the parameters decided.
out_units = math.max(math.min(cost, capacity + tokens + extra), 0)
if out_units > 0 then
  if srate ~= rate or speriod ~= period then
    fraction = 0
  end
  tokens = tokens + extra - out_units
  full, srate, speriod, extra = capacity, rate, period, 0
end
local q, r = muldiv(speriod, full - tokens, srate)
out_reset = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, srate)), MAX_WAIT_US)
if out_units > 0 then
  redis.call('PSETEX', key, math.ceil((out_reset + take_delay_us) / 1000), struct.pack('<dddddddd', tokens, fraction, t, rate, period, capacity, since, refunded))
end
out_remaining, out_refunded = math.max(tokens + extra, 0), refunded
if tokens + extra < 1 then
  q, r = muldiv(speriod, 1 - extra - tokens, srate)
  out_retry = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, srate)), MAX_WAIT_US)
end
--- refund
-- At most the whole tokens in use (none for a missing key: a full bucket), and with a mark only
-- those of its take that time has not refilled yet (at the level's own rate), less the refunds
-- since it (src/limiter/mod.rs, undrained). Written in the level's own terms, so that it is
-- full again no later than the expiry it keeps.
out_units = math.min(cost, full - tokens)
-- A count rounded up from part of a token (`partial`), given back whole, takes the part of the
-- next token refilled so far with it, so that it is not given twice.
local drop = false
if mark then
  local unrefilled, partial = 0, false
  local shift = refunded - mark_refunded
  if mark_taken < since or shift < 0 then
    -- Taken before this life began, or counted in another: it holds nothing.
    unrefilled = 0
  elseif mark >= 4503599627370496 then
    -- A held mark, 2^52 + the take's time (src/limiter/mod.rs, undrained): the take's units
    -- count past MAX_WAIT_US. The larger of two lower bounds of what it holds: its own units
    -- that the time since it cannot have drained, and those before take + MAX_WAIT_US (moved
    -- up by the refunds since); nothing after that.
    local elapsed = math.max(t - (mark - 4503599627370496), 0)
    if elapsed < MAX_WAIT_US then
      local q, r = muldiv(MAX_WAIT_US - elapsed, srate, speriod)
      if r > 0 then
        q = q + 1
      end
      local before, own = math.max(q - shift, 0), math.max(cost - muldiv(elapsed, srate, speriod), 0)
      if before >= own then
        unrefilled, partial = before, r > 0
      else
        unrefilled = own
      end
    end
  elseif mark - 1 > t then
    -- A mark is rounded up to a µs: the exact time is after mark - 1.
    local q, r = muldiv(math.min(mark - 1 - t, MAX_WAIT_US), srate, speriod)
    -- Rounded up: a refund right after its take gives all of it back.
    if r > 0 then
      q = q + 1
    end
    unrefilled, partial = math.max(q - shift, 0), r > 0
  end
  out_units = math.min(out_units, unrefilled)
  drop = partial and out_units == unrefilled
end
if out_units > 0 then
  tokens = tokens + out_units
  if tokens >= full or drop then
    fraction = 0
  end
  if tokens >= full then
    tokens = full
  end
  refunded = refunded + out_units
  if refunded >= 4503599627370496 then
    since, refunded = t, 0
  end
  redis.call('SET', key, struct.pack('<dddddddd', tokens, fraction, t, srate, speriod, full, since, refunded), 'KEEPTTL')
end
out_remaining, out_reset = math.max(tokens + extra, 0), math.min(skew, MAX_WAIT_US)
if tokens < full then
  local q, r = muldiv(speriod, full - tokens, srate)
  out_reset = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, srate)), MAX_WAIT_US)
end
if tokens + extra < 1 then
  local q, r = muldiv(speriod, 1 - extra - tokens, srate)
  out_retry = math.min(skew + (r > fraction and q + 1 or q - muldiv(fraction - r, 1, srate)), MAX_WAIT_US)
end
