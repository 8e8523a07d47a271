-- The classic token bucket, as widely copied: float tokens stored with HSET (Lua prints 14
-- digits, so fractions are lost on every write), the caller's clock from ARGV, no guard for a
-- clock stepping back, a TTL of twice the fill time, fractional waits truncated in the reply.
-- KEYS[1] state key; ARGV: capacity, refill_tokens, refill_period_us, cost, now_us. Reply as ours.
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2]) / tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local now = tonumber(ARGV[5])
local fill_time = capacity / rate
local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + (now - ts) * rate)
local allowed = tokens >= cost
if allowed then
  tokens = tokens - cost
end
redis.call('HSET', key, 'tokens', tokens, 'ts', string.format('%d', now))
redis.call('PEXPIRE', key, math.ceil(fill_time * 2 / 1000))
local retry = 0
if not allowed then
  retry = (cost - tokens) / rate
end
return {allowed and 1 or 0, tokens, (capacity - tokens) / rate, retry}
