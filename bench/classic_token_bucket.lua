-- The classic token bucket as widely copied (Redis TIME, HMGET, HSET, EXPIRE, float math),
-- measured beside ours for its cost inside Redis. Not used by the service.
-- KEYS[1] state key; ARGV: capacity, refill_tokens, refill_period_us, cost.
-- Reply: {allowed, tokens}
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2]) / tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + (now - ts) * rate)
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', key, 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', key, math.ceil(capacity / rate / 1000000) * 2)
return {allowed, math.floor(tokens)}
