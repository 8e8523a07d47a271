-- The classic sliding window log, as widely copied: the member is the timestamp itself, so
-- requests in the same microsecond collapse into one entry.
-- KEYS[1] log key; ARGV: limit, window_us, cost, now_us. Reply as ours.
local key = KEYS[1]
local limit, window, cost, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - window))
local count = redis.call('ZCARD', key)
if count + cost <= limit then
  for _ = 1, cost do
    redis.call('ZADD', key, string.format('%d', now), string.format('%d', now))
  end
  redis.call('PEXPIRE', key, math.ceil(window / 1000))
  return {1, limit - count - cost, window, 0}
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
return {0, limit - count, window, tonumber(oldest[2]) + window - now}
